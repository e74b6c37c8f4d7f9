/* models.c: the client side of the routes by model: the list of every model
 * (GET /v1/models, paged), a model's coverage, its warmup manifest (PUT
 * with the archs a warm runs for, GET),
 * purge (DELETE /v1/models/{model}), and a model named by name or hash. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "client_internal.h"

/* One request whose 2xx answer's body is returned (malloc'd). */
static kc_err call_json(kc_client *c, const char *method, const char *path,
                        const void *body, size_t len, char **json, char *err) {
  kcc_http_resp r;
  *json = NULL;
  kc_err e = kcc_http_do(c, method, path, body, len, &r, err);
  if (e)
    return e;
  if (r.status < 200 || r.status > 299) {
    e = kcc_http_error(&r, path, err);
    kcc_http_resp_free(&r);
    return e;
  }
  *json = r.body ? r.body : strdup("");
  return *json ? KC_OK : kc_errf(err, KC_NOMEM, "out of memory");
}

static kc_err model_path(char *path, size_t cap, const char *model,
                         const char *tail, char *err) {
  if (!kc_is_hex64(model))
    return kc_errf(err, KC_EINVAL, "model: must be 64 lowercase hex digits");
  snprintf(path, cap, "/v1/models/%s%s", model, tail);
  return KC_OK;
}

kc_err kc_client_models(kc_client *c, const char *cursor, char **json,
                        char *err) {
  char path[160];
  *json = NULL;
  if (cursor && *cursor && !kc_is_hex64(cursor))
    return kc_errf(err, KC_EINVAL, "cursor: must be 64 lowercase hex digits");
  snprintf(path, sizeof path, "/v1/models?limit=1000%s%s",
           cursor && *cursor ? "&cursor=" : "", cursor ? cursor : "");
  return call_json(c, "GET", path, NULL, 0, json, err);
}

kc_err kc_client_coverage(kc_client *c, const char *model, char **json,
                          char *err) {
  char path[128];
  *json = NULL;
  kc_err e = model_path(path, sizeof path, model, "/coverage", err);
  return e ? e : call_json(c, "GET", path, NULL, 0, json, err);
}

kc_err kc_client_model_purge(kc_client *c, const char *model, char **json,
                             char *err) {
  char path[128];
  *json = NULL;
  kc_err e = model_path(path, sizeof path, model, "", err);
  return e ? e : call_json(c, "DELETE", path, NULL, 0, json, err);
}

kc_err kc_client_warmup_put(kc_client *c, const char *model, const char *json,
                            size_t len, char *err) {
  return kc_client_warmup_put_archs(c, model, json, len, NULL, 0, err);
}

/* "?archs=a,b" of the archs (each [a-z0-9_], as arch names are), "" for
 * none. */
static kc_err archs_query(const char *const *archs, size_t n, char *out,
                          size_t cap, char *err) {
  size_t used = 0;
  out[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    const char *a = archs[i];
    if (!*a || strspn(a, "abcdefghijklmnopqrstuvwxyz0123456789_") != strlen(a))
      return kc_errf(err, KC_EINVAL, "arch '%.40s': not an arch name", a);
    int w = snprintf(out + used, cap - used, "%s%s", i ? "," : "?archs=", a);
    if (w < 0 || (size_t)w >= cap - used)
      return kc_errf(err, KC_EINVAL, "too many archs");
    used += (size_t)w;
  }
  return KC_OK;
}

kc_err kc_client_warmup_put_archs(kc_client *c, const char *model,
                                  const char *json, size_t len,
                                  const char *const *archs, size_t n_archs,
                                  char *err) {
  char path[128], query[1024], full[1200], *body = NULL;
  kc_err e = model_path(path, sizeof path, model, "/warmup", err);
  if (!e)
    e = archs_query(archs, n_archs, query, sizeof query, err);
  if (!e) {
    snprintf(full, sizeof full, "%s%s", path, query);
    e = call_json(c, "PUT", full, json, len, &body, err);
  }
  free(body);
  return e;
}

kc_err kc_client_warmup_get(kc_client *c, const char *model, char **json,
                            char *err) {
  char path[128];
  *json = NULL;
  kc_err e = model_path(path, sizeof path, model, "/warmup", err);
  return e ? e : call_json(c, "GET", path, NULL, 0, json, err);
}

/* Looks for name in one page of the listing: 1 found (out set), 2 found a
 * second model of that name, 0 not here. */
static int find_name(json_t *models, const char *name, char *out) {
  size_t i;
  json_t *m;
  int found = 0;
  json_array_foreach(models, i, m) {
    const char *n = json_string_value(json_object_get(m, "name"));
    const char *h = json_string_value(json_object_get(m, "model"));
    if (!n || !h || strcmp(n, name) != 0 || !kc_is_hex64(h))
      continue;
    if (found && strcmp(out, h) != 0)
      return 2;
    snprintf(out, KC_HEX_LEN + 1, "%s", h);
    found = 1;
  }
  return found;
}

kc_err kc_client_model_resolve(kc_client *c, const char *name_or_hash,
                               char out[KC_HEX_LEN + 1], char *err) {
  if (kc_is_hex64(name_or_hash)) {
    snprintf(out, KC_HEX_LEN + 1, "%s", name_or_hash);
    return KC_OK;
  }
  char cursor[KC_HEX_LEN + 1] = "", other[KC_HEX_LEN + 1], *body = NULL;
  int found = 0;
  do {
    kc_err e = kc_client_models(c, cursor, &body, err);
    if (e)
      return e;
    json_t *root = json_loads(body, 0, NULL);
    free(body);
    int f = find_name(json_object_get(root, "models"), name_or_hash,
                      found ? other : out);
    if (f == 2 || (f == 1 && found)) { /* names are not unique */
      json_decref(root);
      return kc_errf(err, KC_EINVAL,
                     "two models are named '%.100s': give "
                     "the hash",
                     name_or_hash);
    }
    found |= f;
    const char *next = json_string_value(json_object_get(root, "next"));
    snprintf(cursor, sizeof cursor, "%s",
             next && kc_is_hex64(next) ? next : "");
    json_decref(root);
  } while (*cursor);
  if (!found)
    return kc_errf(err, KC_NOT_FOUND,
                   "no model named '%.100s' (a name comes "
                   "from its warmup manifest)",
                   name_or_hash);
  return KC_OK;
}
