/* routes.c: the route table of DESIGN.md's HTTP API (path, methods, role,
 * body kind, handler), path matching, strict JSON bodies, and the small
 * routes: /healthz, /readyz, /metrics, /v1/stats. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kcd.h"

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
/* /metrics: the role comes from --metrics-role (http.c). */
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
static const kcd_op bundle_ops[] = {
    {KCD_M_GET, R, 1, KCD_BODY_NONE, NULL, NULL, kcd_bundle_get},
    {KCD_M_HEAD, R, 1, KCD_BODY_NONE, NULL, NULL, kcd_bundle_get},
    {KCD_M_PUT, W, 1, KCD_BODY_JSON, NULL, NULL, kcd_bundle_put},
    {KCD_M_DELETE, A, 1, KCD_BODY_NONE, NULL, NULL, kcd_bundle_delete}};
static const kcd_op lookup_ops[] = {
    {KCD_M_POST, R, 1, KCD_BODY_JSON, NULL, NULL, kcd_lookup}};
static const kcd_op models_ops[] = {
    {KCD_M_GET, R, 1, KCD_BODY_NONE, NULL, NULL, kcd_models_get},
    {KCD_M_HEAD, R, 1, KCD_BODY_NONE, NULL, NULL, kcd_models_get}};
static const kcd_op lease_ops[] = {
    {KCD_M_POST, W, 1, KCD_BODY_JSON, NULL, NULL, kcd_lease_post},
    {KCD_M_DELETE, W, 0, KCD_BODY_NONE, NULL, NULL, kcd_lease_delete}};

#define OPS(a) a, sizeof a / sizeof a[0]

/* Order matters only for prefixes; none is a prefix of another. */
static const kcd_route routes[] = {
    {KCD_R_HEALTHZ, "/healthz", KCD_P_NONE, "GET, HEAD", OPS(healthz_ops)},
    {KCD_R_READYZ, "/readyz", KCD_P_NONE, "GET, HEAD", OPS(readyz_ops)},
    {KCD_R_METRICS, "/metrics", KCD_P_NONE, "GET, HEAD", OPS(metrics_ops)},
    {KCD_R_STATS, "/v1/stats", KCD_P_NONE, "GET, HEAD", OPS(stats_ops)},
    {KCD_R_LOOKUP, "/v1/lookup", KCD_P_NONE, "POST", OPS(lookup_ops)},
    {KCD_R_BLOBS, "/v1/blobs/", KCD_P_DIGEST, "GET, HEAD, PUT", OPS(blob_ops)},
    {KCD_R_BUNDLES, "/v1/bundles/", KCD_P_KEY, "GET, HEAD, PUT, DELETE",
     OPS(bundle_ops)},
    {KCD_R_MODELS, "/v1/models/", KCD_P_MODEL, "GET, HEAD", OPS(models_ops)},
    {KCD_R_LEASES, "/v1/leases/", KCD_P_KEY, "POST, DELETE", OPS(lease_ops)},
};
#define N_ROUTES (sizeof routes / sizeof routes[0])

const kcd_route *kcd_route_find(const char *url, char *param, size_t cap) {
  param[0] = '\0';
  for (size_t i = 0; i < N_ROUTES; i++) {
    const kcd_route *rt = &routes[i];
    size_t n = strlen(rt->path);
    if (rt->param == KCD_P_NONE) {
      if (strcmp(url, rt->path) == 0)
        return rt;
    } else if (strncmp(url, rt->path, n) == 0) {
      snprintf(param, cap, "%s", url + n);
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

const char *kcd_route_allow(kcd_route_id id) {
  for (size_t i = 0; i < N_ROUTES; i++)
    if (routes[i].id == id)
      return routes[i].allow;
  return "";
}

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

/* ---- small routes ---- */

static int reply_status(kcd_req *r, int code, const char *status) {
  return kcd_reply_json(r, code, json_pack("{ss}", "status", status), NULL);
}

int kcd_healthz(kcd_req *r) { return reply_status(r, 200, "ok"); }

/* Not ready also while writes fail for lack of disk: a balancer then sends
 * uploads elsewhere (reads still work here; /healthz stays 200). */
int kcd_readyz(kcd_req *r) {
  kc_store *s = atomic_load(&r->st->store);
  if (!s)
    return kcd_reply_error_json(r, KC_NOT_READY, NULL, NULL, NULL);
  int64_t since = kc_store_disk_full_since(s);
  if (since)
    return kcd_reply_json(
        r, 503, json_pack("{ss ss sI}", "error", kc_err_code(KC_DISK_FULL),
                          "message", "the disk holding the store is full: "
                          "writes fail, reads work", "since",
                          (json_int_t)since), NULL);
  return reply_status(r, 200, "ready");
}

int kcd_metrics_get(kcd_req *r) {
  size_t len = 0;
  char *text = kcd_metrics_render(r->st, &len);
  if (!text)
    return kcd_reply_error(r, KC_NOMEM, "out of memory");
  return kcd_reply(r, 200, "text/plain; version=0.0.4; charset=utf-8", text,
                   len, KCD_MEM_FREE, NULL);
}

int kcd_stats_get(kcd_req *r) {
  kc_store_stats s;
  kc_err e = kc_store_stats_get(atomic_load(&r->st->store), &s);
  if (e)
    return kcd_reply_error(r, e, "cannot read the store's figures");
  json_t *o = json_pack(
      "{sI sI sI sI sI sI sI sI sI sI sI sI sI}", "bytes_used",
      (json_int_t)s.bytes_used, "max_bytes", (json_int_t)s.max_bytes,
      "map_size", (json_int_t)s.map_size, "map_used", (json_int_t)s.map_used,
      "blobs", (json_int_t)s.blobs, "bundles", (json_int_t)s.bundles, "hits",
      (json_int_t)s.hits, "misses", (json_int_t)s.misses, "evicted_bundles",
      (json_int_t)s.evicted_bundles, "evicted_blobs",
      (json_int_t)s.evicted_blobs, "gc_blobs", (json_int_t)s.gc_blobs,
      "leases", (json_int_t)kcd_lease_count(r->st->leases), "uptime_s",
      (json_int_t)(kcd_unix_now() - r->st->started));
  return kcd_reply_json(r, 200, o, NULL);
}
