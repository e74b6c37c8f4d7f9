/* routes_bundle.c: bundle manifests: GET (copied before the read ends), PUT
 * (validated, write-once), DELETE and POST /v1/lookup (many keys, one read
 * transaction). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"

int kcd_bundle_get(kcd_req *r) {
  const char *json = NULL;
  size_t len = 0;
  char err[KC_ERRBUF_SIZE] = "";
  kc_err e = kcd_svc_bundle_read(r->st, KCD_FE_HTTP, r->param, &r->read, &json,
                                 &len, err);
  if (e)
    return kcd_reply_error_json(r, e, err, NULL, NULL);
  /* Copied, so the read ends now: one held until a slow client took the
   * bytes (a 1500-byte MTU, a small window) pinned the store (http.h). */
  int ret =
      kcd_reply(r, 200, "application/json", json, len, KCD_MEM_COPY, NULL);
  kc_store_read_end(r->read);
  r->read = NULL;
  return ret;
}

/* Every manifest problem is a bad manifest, except the ones with their own
 * status (key mismatch, malformed JSON, no memory). */
static kc_err manifest_error(kc_err e) {
  if (e == KC_KEY_MISMATCH || e == KC_BAD_JSON || e == KC_NOMEM)
    return e;
  return KC_BAD_MANIFEST;
}

static int reply_missing(kcd_req *r, const char *err, char **missing,
                         size_t n) {
  json_t *arr = json_array();
  for (size_t i = 0; arr && i < n; i++)
    json_array_append_new(arr, json_string(missing[i]));
  kc_store_strv_free(missing, n);
  json_t *extra = json_pack("{so}", "missing", arr ? arr : json_array());
  return kcd_reply_error_json(r, KC_MISSING_BLOBS, err, extra, NULL);
}

int kcd_bundle_put(kcd_req *r) {
  char err[KC_ERRBUF_SIZE] = "";
  kc_manifest *m = NULL;
  kc_err e = kc_manifest_parse(r->body ? r->body : "", r->body_len, &m, err);
  if (e)
    return kcd_reply_error_json(r, manifest_error(e), err, NULL, NULL);
  if (strcmp(m->key, r->param) != 0) {
    kc_manifest_free(m);
    return kcd_reply_error(r, KC_KEY_MISMATCH,
                           "key: the manifest's key is not the URL's %s",
                           r->param);
  }
  int created = 0;
  char **missing = NULL;
  size_t n_missing = 0;
  e = kcd_svc_bundle_put(r->st, KCD_FE_HTTP, m, &created, &missing, &n_missing,
                         err);
  kc_manifest_free(m);
  if (e == KC_MISSING_BLOBS)
    return reply_missing(r, err, missing, n_missing);
  kc_store_strv_free(missing, n_missing);
  if (e)
    return kcd_reply_error_json(r, e, err, NULL, NULL);
  return kcd_reply_json(
      r, created ? 201 : 200,
      json_pack("{ss sb}", "key", r->param, "created", created), NULL);
}

int kcd_bundle_delete(kcd_req *r) {
  char err[KC_ERRBUF_SIZE] = "";
  kc_err e = kc_store_bundle_delete(kcd_store(r->st), r->param, err);
  if (e == KC_NOT_FOUND)
    return kcd_reply_error(r, e, "no bundle %s", r->param);
  if (e)
    return kcd_reply_error_json(r, e, err, NULL, NULL);
  return kcd_reply(r, 204, NULL, "", 0, KCD_MEM_PERSISTENT, NULL);
}

/* ---- POST /v1/lookup ---- */

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The keys of the body, checked, sorted and without repeats. */
static kc_err lookup_keys(json_t *root, const char ***out, size_t *n,
                          char *err) {
  json_t *keys = json_object_get(root, "keys");
  if (!json_is_array(keys))
    return kc_errf(err, KC_EINVAL, "keys: %s",
                   keys ? "must be an array" : "missing");
  size_t len = json_array_size(keys);
  if (len > KC_LOOKUP_MAX)
    return kc_errf(err, KC_EINVAL, "keys: %zu keys, at most %d in one lookup",
                   len, KC_LOOKUP_MAX);
  const char **v = calloc(len ? len : 1, sizeof *v);
  if (!v)
    return kc_errf(err, KC_NOMEM, "out of memory");
  for (size_t i = 0; i < len; i++) {
    v[i] = json_string_value(json_array_get(keys, i));
    if (!v[i] || !kc_is_hex64(v[i])) {
      free(v);
      return kc_errf(err, KC_BAD_KEY,
                     "keys[%zu]: must be 64 lowercase hex digits", i);
    }
  }
  qsort(v, len, sizeof *v, cmp_str);
  size_t m = 0;
  for (size_t i = 0; i < len; i++)
    if (m == 0 || strcmp(v[m - 1], v[i]) != 0)
      v[m++] = v[i];
  *out = v;
  *n = m;
  return KC_OK;
}

/* An answer holds at most this many bytes of manifests: 128 keys whose
 * manifests were 3.7 MB each made a 461 MB answer. Twice the
 * largest manifest a PUT may send, and at least 8 MiB (manifests read
 * through from S3 are at most 4 MiB), so any one manifest fits. */
#define LOOKUP_MIN_CAP (8ull << 20)

static uint64_t lookup_cap(const kcd_config *c) {
  uint64_t two = c->max_json_bytes * 2;
  return two > LOOKUP_MIN_CAP ? two : LOOKUP_MIN_CAP;
}

enum { L_FOUND, L_MISSING, L_TRUNCATED };

/* "name":["key",...] of the keys in state `which`. */
static void lookup_list(FILE *f, const char *name, const char **keys,
                        const char *state, size_t n, char which) {
  int first = 1;
  fprintf(f, ",\"%s\":[", name);
  for (size_t i = 0; i < n; i++) {
    if (state[i] == which) {
      fprintf(f, "%s\"%s\"", first ? "" : ",", keys[i]);
      first = 0;
    }
  }
  fputc(']', f);
}

/* A lookup's answer as it is written: the keys, each one's state, the
 * manifest bytes spliced in so far and their cap. */
typedef struct lookup_out {
  const char **keys;
  char *state;
  uint64_t cap, total;
  int first;
  FILE *f;
} lookup_out;

/* One key of the answer (kcd_svc_lookup's callback), splicing the stored
 * canonical manifest in as it is: no parse, no re-serialization. A manifest
 * that would take the answer over `cap` bytes is left out and listed in
 * "truncated" (the client asks for it again); the first one found always
 * goes in. An unreadable one counts as missing: the client rebuilds. */
static kc_err lookup_one(void *arg, kc_store_read *rd, size_t i) {
  lookup_out *o = arg;
  const char *json;
  size_t len;
  if (kc_store_bundle_get(rd, o->keys[i], &json, &len)) {
    o->state[i] = L_MISSING;
    return KC_NOT_FOUND;
  }
  if (!o->first && o->total + len > o->cap) {
    o->state[i] = L_TRUNCATED;
    return KC_OK;
  }
  fprintf(o->f, "%s\"%s\":", o->first ? "" : ",", o->keys[i]);
  fwrite(json, 1, len, o->f);
  o->total += len;
  o->first = 0;
  return KC_OK;
}

/* Writes {"found":{key:manifest,...},"missing":[...],"truncated":[...]}. */
static int lookup_reply(kcd_req *r, const char **keys, size_t n) {
  char err[KC_ERRBUF_SIZE] = "";
  char *buf = NULL;
  size_t len = 0;
  lookup_out o = {keys, calloc(n ? n : 1, 1), lookup_cap(&r->st->cfg), 0, 1,
                  NULL};
  if (!o.state || !(o.f = open_memstream(&buf, &len))) {
    free(o.state);
    return kcd_reply_error(r, KC_NOMEM, "out of memory");
  }
  fputs("{\"found\":{", o.f);
  kc_err e = kcd_svc_lookup(r->st, KCD_FE_HTTP, keys, n, lookup_one, &o, err);
  if (!e) {
    fputc('}', o.f);
    lookup_list(o.f, "missing", keys, o.state, n, L_MISSING);
    lookup_list(o.f, "truncated", keys, o.state, n, L_TRUNCATED);
    fputc('}', o.f);
  }
  free(o.state);
  if (fclose(o.f) != 0 || e) {
    free(buf);
    return e ? kcd_reply_error(r, e, "%s", err) /* the read did not begin */
             : kcd_reply_error(r, KC_NOMEM, "out of memory");
  }
  return kcd_reply(r, 200, "application/json", buf, len, KCD_MEM_FREE, NULL);
}

int kcd_lookup(kcd_req *r) {
  static const char *const allowed[] = {"keys", NULL};
  char err[KC_ERRBUF_SIZE] = "";
  json_t *root = NULL;
  const char **keys = NULL;
  size_t n = 0;
  kc_err e = kcd_json_object(r, allowed, &root, err);
  if (!e)
    e = lookup_keys(root, &keys, &n, err);
  int ret = e ? kcd_reply_error_json(r, e, err, NULL, NULL)
              : lookup_reply(r, keys, n);
  free(keys);
  json_decref(root);
  return ret;
}
