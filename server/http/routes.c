/* routes.c: the route table of docs/DESIGN.md's HTTP API: for each route its
 * id, name (metrics and messages), path, Allow list, and per method the role,
 * body kind and handler. Path matching, the role a request needs, route and
 * method names, and the strict JSON bodies the handlers parse. The table is the
 * one list of routes: http.c dispatches through it, reply.c takes a 405's Allow
 * from it and metrics.c its route names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"

#define R KCD_ROLE_READ
#define W KCD_ROLE_WRITE
#define A KCD_ROLE_ADMIN
#define N KCD_ROLE_NONE

static const kcd_op healthz_ops[] = {
    {KCD_M_GET, N, 0, KCD_BODY_NONE, NULL, NULL, kcd_healthz},
    {KCD_M_HEAD, N, 0, KCD_BODY_NONE, NULL, NULL, kcd_healthz}};
static const kcd_op readyz_ops[] = {
    {KCD_M_GET, N, 0, KCD_BODY_NONE, NULL, NULL, kcd_readyz},
    {KCD_M_HEAD, N, 0, KCD_BODY_NONE, NULL, NULL, kcd_readyz}};
/* /metrics: the role comes from --metrics-role (kcd_route_role). */
static const kcd_op metrics_ops[] = {
    {KCD_M_GET, N, 0, KCD_BODY_NONE, NULL, NULL, kcd_metrics_get},
    {KCD_M_HEAD, N, 0, KCD_BODY_NONE, NULL, NULL, kcd_metrics_get}};
static const kcd_op stats_ops[] = {
    {KCD_M_GET, R, 1, KCD_BODY_NONE, NULL, NULL, kcd_stats_get},
    {KCD_M_HEAD, R, 1, KCD_BODY_NONE, NULL, NULL, kcd_stats_get}};
static const kcd_op blob_ops[] = {
    {KCD_M_GET, R, 1, KCD_BODY_NONE, NULL, NULL, kcd_blob_get},
    {KCD_M_HEAD, R, 1, KCD_BODY_NONE, NULL, NULL, kcd_blob_get},
    {KCD_M_PUT, W, 1, KCD_BODY_STREAM, kcd_blob_put_begin, kcd_blob_put_data,
     kcd_blob_put}};
/* Many blobs in one answer: a read, as each blob's GET is. */
static const kcd_op blobs_fetch_ops[] = {
    {KCD_M_POST, R, 1, KCD_BODY_JSON, NULL, NULL, kcd_blobs_fetch}};
static const kcd_op bundle_ops[] = {
    {KCD_M_GET, R, 1, KCD_BODY_NONE, NULL, NULL, kcd_bundle_get},
    {KCD_M_HEAD, R, 1, KCD_BODY_NONE, NULL, NULL, kcd_bundle_get},
    {KCD_M_PUT, W, 1, KCD_BODY_JSON, NULL, NULL, kcd_bundle_put},
    {KCD_M_DELETE, A, 1, KCD_BODY_NONE, NULL, NULL, kcd_bundle_delete}};
static const kcd_op lookup_ops[] = {
    {KCD_M_POST, R, 1, KCD_BODY_JSON, NULL, NULL, kcd_lookup}};
static const kcd_op models_ops[] = {
    {KCD_M_GET, R, 1, KCD_BODY_NONE, NULL, NULL, kcd_models_get},
    {KCD_M_HEAD, R, 1, KCD_BODY_NONE, NULL, NULL, kcd_models_get},
    {KCD_M_DELETE, A, 1, KCD_BODY_NONE, NULL, NULL, kcd_model_purge}};
static const kcd_op lease_ops[] = {
    {KCD_M_POST, W, 1, KCD_BODY_JSON, NULL, NULL, kcd_lease_post},
    {KCD_M_DELETE, W, 0, KCD_BODY_NONE, NULL, NULL, kcd_lease_delete}};
/* Demand steers `kcache suggest`: POST needs --demand-role (default write;
 * kcd_route_role), the store bounds what it keeps. */
static const kcd_op demand_ops[] = {
    {KCD_M_POST, R, 1, KCD_BODY_JSON, NULL, NULL, kcd_demand_post}};
static const kcd_op model_demand_ops[] = {
    {KCD_M_GET, R, 1, KCD_BODY_NONE, NULL, NULL, kcd_demand_get},
    {KCD_M_HEAD, R, 1, KCD_BODY_NONE, NULL, NULL, kcd_demand_get}};
static const kcd_op model_index_ops[] = {
    {KCD_M_GET, R, 1, KCD_BODY_NONE, NULL, NULL, kcd_models_index},
    {KCD_M_HEAD, R, 1, KCD_BODY_NONE, NULL, NULL, kcd_models_index}};
static const kcd_op warmup_ops[] = {
    {KCD_M_GET, R, 1, KCD_BODY_NONE, NULL, NULL, kcd_warmup_get},
    {KCD_M_HEAD, R, 1, KCD_BODY_NONE, NULL, NULL, kcd_warmup_get},
    {KCD_M_PUT, W, 1, KCD_BODY_JSON, NULL, NULL, kcd_warmup_put}};
static const kcd_op coverage_ops[] = {
    {KCD_M_GET, R, 1, KCD_BODY_NONE, NULL, NULL, kcd_coverage_get},
    {KCD_M_HEAD, R, 1, KCD_BODY_NONE, NULL, NULL, kcd_coverage_get}};
static const kcd_op history_ops[] = {
    {KCD_M_GET, R, 0, KCD_BODY_NONE, NULL, NULL, kcd_history_get},
    {KCD_M_HEAD, R, 0, KCD_BODY_NONE, NULL, NULL, kcd_history_get}};
/* The page is static (its data comes from the routes above, with their
 * roles), so it needs none. */
static const kcd_op page_ops[] = {
    {KCD_M_GET, N, 0, KCD_BODY_NONE, NULL, NULL, kcd_page_get},
    {KCD_M_HEAD, N, 0, KCD_BODY_NONE, NULL, NULL, kcd_page_get}};

#define OPS(a) a, sizeof a / sizeof a[0]
/* Entries sit at their id, so that an id finds its route (and name) at once;
 * the slot of KCD_R_OTHER stays empty (path NULL). */
#define ROUTE(id, ...) [id] = {id, __VA_ARGS__, NULL}
/* A route with a suffix after its param (/v1/models/{model}/warmup). */
#define ROUTE_SUFFIX(id, suffix, ...) [id] = {id, __VA_ARGS__, suffix}

/* docs/DESIGN.md's HTTP API. No path is a prefix of another, except that routes
 * with a suffix (/v1/models/{model}/warmup) share their prefix with the
 * plain param route, and /v1/blobs/fetch begins as a blob's path does;
 * kcd_route_find tries those with a suffix first, then exact paths, then
 * the param routes. */
static const kcd_route routes[KCD_N_ROUTES] = {
    ROUTE(KCD_R_HEALTHZ, "healthz", "/healthz", KCD_P_NONE, "GET, HEAD",
          OPS(healthz_ops)),
    ROUTE(KCD_R_READYZ, "readyz", "/readyz", KCD_P_NONE, "GET, HEAD",
          OPS(readyz_ops)),
    ROUTE(KCD_R_METRICS, "metrics", "/metrics", KCD_P_NONE, "GET, HEAD",
          OPS(metrics_ops)),
    ROUTE(KCD_R_STATS, "stats", "/v1/stats", KCD_P_NONE, "GET, HEAD",
          OPS(stats_ops)),
    ROUTE(KCD_R_BLOBS, "blobs", "/v1/blobs/", KCD_P_DIGEST, "GET, HEAD, PUT",
          OPS(blob_ops)),
    ROUTE(KCD_R_BUNDLES, "bundles", "/v1/bundles/", KCD_P_KEY,
          "GET, HEAD, PUT, DELETE", OPS(bundle_ops)),
    ROUTE(KCD_R_LOOKUP, "lookup", "/v1/lookup", KCD_P_NONE, "POST",
          OPS(lookup_ops)),
    ROUTE(KCD_R_MODELS, "models", "/v1/models/", KCD_P_MODEL,
          "GET, HEAD, DELETE", OPS(models_ops)),
    ROUTE(KCD_R_LEASES, "leases", "/v1/leases/", KCD_P_KEY, "POST, DELETE",
          OPS(lease_ops)),
    ROUTE(KCD_R_DEMAND, "demand", "/v1/demand", KCD_P_NONE, "POST",
          OPS(demand_ops)),
    ROUTE_SUFFIX(KCD_R_MODEL_DEMAND, "/demand", "model_demand", "/v1/models/",
                 KCD_P_MODEL, "GET, HEAD", OPS(model_demand_ops)),
    ROUTE(KCD_R_MODEL_INDEX, "model_index", "/v1/models", KCD_P_NONE,
          "GET, HEAD", OPS(model_index_ops)),
    ROUTE_SUFFIX(KCD_R_WARMUP, "/warmup", "warmup", "/v1/models/", KCD_P_MODEL,
                 "GET, HEAD, PUT", OPS(warmup_ops)),
    ROUTE_SUFFIX(KCD_R_COVERAGE, "/coverage", "coverage", "/v1/models/",
                 KCD_P_MODEL, "GET, HEAD", OPS(coverage_ops)),
    ROUTE(KCD_R_HISTORY, "history", "/v1/stats/history", KCD_P_NONE,
          "GET, HEAD", OPS(history_ops)),
    ROUTE(KCD_R_PAGE, "page", "/", KCD_P_NONE, "GET, HEAD", OPS(page_ops)),
    ROUTE(KCD_R_PAGE_JS, "page_js", "/app.js", KCD_P_NONE, "GET, HEAD",
          OPS(page_ops)),
    ROUTE(KCD_R_PAGE_CSS, "page_css", "/style.css", KCD_P_NONE, "GET, HEAD",
          OPS(page_ops)),
    ROUTE(KCD_R_BLOBS_FETCH, "blobs_fetch", "/v1/blobs/fetch", KCD_P_NONE,
          "POST", OPS(blobs_fetch_ops)),
};

/* Copies s[0..n) into param[cap], cut to fit (no printf: every request
 * comes here). */
static void set_param(char *param, size_t cap, const char *s, size_t n) {
  if (n >= cap)
    n = cap - 1;
  memcpy(param, s, n);
  param[n] = '\0';
}

/* A route with a suffix: url (u bytes) is path + param + suffix, the param
 * without '/'. */
static int suffix_match(const kcd_route *rt, const char *url, size_t u,
                        char *param, size_t cap) {
  size_t n = strlen(rt->path), sl = strlen(rt->suffix);
  if (u < n + sl || strncmp(url, rt->path, n) != 0 ||
      strcmp(url + u - sl, rt->suffix) != 0)
    return 0;
  size_t pl = u - n - sl;
  if (memchr(url + n, '/', pl))
    return 0;
  set_param(param, cap, url + n, pl);
  return 1;
}

const kcd_route *kcd_route_find(const char *url, char *param, size_t cap) {
  /* The hot route first: no suffix route shares its prefix, and the one
   * exact path under it (/v1/blobs/fetch) is left to the table. */
  static const char blobs[] = "/v1/blobs/";
  if (strncmp(url, blobs, sizeof blobs - 1) == 0 &&
      strcmp(url, routes[KCD_R_BLOBS_FETCH].path) != 0) {
    const char *p = url + sizeof blobs - 1;
    set_param(param, cap, p, strlen(p));
    return &routes[KCD_R_BLOBS];
  }
  size_t u = strlen(url);
  param[0] = '\0';
  for (size_t i = 0; i < KCD_N_ROUTES; i++)
    if (routes[i].path && routes[i].suffix &&
        suffix_match(&routes[i], url, u, param, cap))
      return &routes[i];
  for (size_t i = 0; i < KCD_N_ROUTES; i++)
    if (routes[i].path && routes[i].param == KCD_P_NONE &&
        strcmp(url, routes[i].path) == 0)
      return &routes[i];
  for (size_t i = 0; i < KCD_N_ROUTES; i++) {
    const kcd_route *rt = &routes[i];
    if (!rt->path || rt->suffix || rt->param == KCD_P_NONE)
      continue;
    size_t n = strlen(rt->path);
    if (strncmp(url, rt->path, n) == 0) {
      set_param(param, cap, url + n, u - n);
      return rt;
    }
  }
  return NULL;
}

const kcd_op *kcd_route_op(const kcd_route *rt, kcd_method m) {
  for (size_t i = 0; i < rt->n_ops; i++)
    if (rt->ops[i].method == m)
      return &rt->ops[i];
  return NULL;
}

kcd_role kcd_route_role(const kcd_route *rt, const kcd_op *op,
                        const kcd_state *st) {
  /* Who may scrape /metrics, and who may report demand (which steers
   * `kcache suggest`), are the operator's choice. */
  if (rt->id == KCD_R_DEMAND && op->method == KCD_M_POST)
    return st->cfg.demand_role;
  return rt->id == KCD_R_METRICS ? st->cfg.metrics_role : op->role;
}

const char *kcd_route_name(kcd_route_id id) {
  if ((unsigned)id < KCD_N_ROUTES && routes[id].name)
    return routes[id].name;
  return "other";
}

static const char *const method_names[KCD_N_METHODS] = {
    [KCD_M_GET] = "GET",   [KCD_M_HEAD] = "HEAD",     [KCD_M_PUT] = "PUT",
    [KCD_M_POST] = "POST", [KCD_M_DELETE] = "DELETE", [KCD_M_OTHER] = "OTHER"};

const char *kcd_method_name(kcd_method m) {
  return (unsigned)m < KCD_N_METHODS ? method_names[m] : "OTHER";
}

kcd_method kcd_method_of(const char *m) {
  for (int i = 0; i < KCD_M_OTHER; i++)
    if (strcmp(m, method_names[i]) == 0)
      return (kcd_method)i;
  return KCD_M_OTHER;
}

/* ---- JSON bodies ---- */

kc_err kcd_json_object(const kcd_req *r, const char *const *allowed,
                       json_t **out, char *err) {
  json_error_t je;
  *out = NULL;
  /* Duplicate keys would let two readers of one body disagree on it. */
  json_t *j = json_loadb(r->body ? r->body : "", r->body_len,
                         JSON_REJECT_DUPLICATES, &je);
  if (!j)
    return kc_errf(err, KC_BAD_JSON, "malformed JSON at line %d, column %d: %s",
                   je.line, je.column, je.text);
  if (!json_is_object(j)) {
    json_decref(j);
    return kc_errf(err, KC_EINVAL, "the body must be a JSON object");
  }
  const char *k;
  json_t *v;
  json_object_foreach(j, k, v) {
    size_t i = 0;
    while (allowed[i] && strcmp(allowed[i], k) != 0)
      i++;
    if (!allowed[i]) {
      kc_errf(err, KC_EINVAL, "unknown field '%.64s'", k);
      json_decref(j);
      return KC_EINVAL;
    }
  }
  *out = j;
  return KC_OK;
}
