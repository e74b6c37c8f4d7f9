/* test_server_models.c: kcached integration tests (the real binary on a free
 * loopback port) of the routes by model and the page: GET /v1/models (names,
 * figures, pages), the warmup manifest (PUT, GET), coverage (present,
 * missing, building, extra), DELETE /v1/models/{model} (purge, in batches,
 * under concurrent reads), GET /v1/stats/history, GET / and its assets (CSP),
 * and every route's roles with a token file; and store/models.c directly
 * (a purge's blobs collected by gc). Helpers: servertest.h. */
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kc_store.h"
#include "servertest.h"

#define M1 "d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1"
#define M2 "e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2"
#define M3 "f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3"

static kc_testsrv M; /* this file's open server */

static int m_setup(void **state) {
  (void)state;
  return kc_testsrv_start(&M, NULL);
}

static int m_teardown(void **state) {
  (void)state;
  int rc = kc_testsrv_stop(&M);
  if (rc)
    kc_testsrv_show_log(&M, "kcached");
  kc_testsrv_cleanup(&M);
  return rc == 0 ? 0 : -1;
}

/* A warmup manifest of model: buckets batch=1,2 and archs sm_80, sm_90a. */
static char *warmup_json(const char *model, const char *name) {
  json_t *j = json_pack("{ss s{ss ss} s[ss] s{s[ss]} s[{si}{si}]}", "schema",
                        "kcache.warmup/v1", "model", "name", name, "hash",
                        model, "archs", "sm_80", "sm_90a", "builder", "command",
                        "true", "x", "buckets", "batch", 1, "batch", 2);
  char *s = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  assert_non_null(s);
  return s;
}

static long put_warmup(const kc_testsrv *t, const char *token,
                       const char *model, const char *json) {
  char path[160];
  snprintf(path, sizeof path, "/v1/models/%s/warmup", model);
  resp r = http(
      t, path,
      (req){
          .method = "PUT", .token = token, .body = json, .len = strlen(json)});
  long st = r.status;
  resp_free(&r);
  return st;
}

/* A bundle of model for (batch, arch) over the one blob d (n bytes). */
static void put_bundle(const kc_testsrv *t, const char *token,
                       const char *model, uint64_t batch, const char *arch,
                       char d[65], uint64_t n, char key[65]) {
  char ds[1][65], path[128];
  memcpy(ds[0], d, 65);
  char *json = make_manifest(model, batch, arch, ds, &n, 1, key);
  snprintf(path, sizeof path, "/v1/bundles/%s", key);
  resp r = http(
      t, path,
      (req){
          .method = "PUT", .token = token, .body = json, .len = strlen(json)});
  assert_true(r.status == 201 || r.status == 200);
  resp_free(&r);
  free(json);
}

/* GET path as JSON, asserting the status. */
static json_t *get_json(const kc_testsrv *t, const char *token,
                        const char *path, long status) {
  resp r = http(t, path, (req){.token = token});
  if (r.status != status)
    fprintf(stderr, "GET %s: %ld %s\n", path, r.status, r.body);
  assert_int_equal(r.status, status);
  json_t *j = body_json(&r);
  assert_non_null(j);
  resp_free(&r);
  return j;
}

static json_t *find_model(json_t *models, const char *model) {
  size_t i;
  json_t *m;
  json_array_foreach(
      models, i, m) if (!strcmp(json_string_value(json_object_get(m, "model")),
                                model)) return m;
  return NULL;
}

#define JI(o, k) json_integer_value(json_object_get((o), (k)))

/* Names from warmup manifests, the hash's null name otherwise, figures that
 * add up the bundles, hits after a flush; statuses of the listing. */
static void t_models_list(void **state) {
  (void)state;
  char d[65], k[3][65];
  assert_int_equal(put_blob(&M, NULL, "list-blob", 9, d), 201);
  put_bundle(&M, NULL, M1, 1, "sm_80", d, 9, k[0]);
  put_bundle(&M, NULL, M1, 2, "sm_80", d, 9, k[1]);
  put_bundle(&M, NULL, M2, 1, "sm_80", d, 9, k[2]);
  char *w = warmup_json(M1, "first-model");
  assert_int_equal(put_warmup(&M, NULL, M1, w), 201);
  free(w);
  char path[128];
  for (int i = 0; i < 3; i++) { /* three hits on k[0] */
    snprintf(path, sizeof path, "/v1/bundles/%s", k[0]);
    resp r = http(&M, path, (req){0});
    assert_int_equal(r.status, 200);
    resp_free(&r);
  }
  kc_testsrv_sleep_ms(1500); /* the once-a-second flush of last uses */
  json_t *j = get_json(&M, NULL, "/v1/models", 200);
  json_t *m1 = find_model(json_object_get(j, "models"), M1);
  json_t *m2 = find_model(json_object_get(j, "models"), M2);
  assert_non_null(m1);
  assert_non_null(m2);
  assert_string_equal(json_string_value(json_object_get(m1, "name")),
                      "first-model");
  assert_true(json_is_null(json_object_get(m2, "name")));
  assert_int_equal(JI(m1, "bundles"), 2);
  assert_int_equal(JI(m1, "bytes"), 18);
  assert_int_equal(JI(m1, "hits"), 3);
  assert_true(JI(m1, "last_used") > 0);
  assert_int_equal(JI(m2, "bundles"), 1);
  json_t *cov = json_object_get(m1, "coverage");
  assert_int_equal(JI(cov, "present"), 2);
  assert_int_equal(JI(cov, "expected"), 4);
  assert_string_equal(json_string_value(json_object_get(j, "role")), "admin");
  assert_true(json_is_null(json_object_get(j, "next")));
  json_decref(j);
  resp r = http(&M, "/v1/models", (req){.method = "HEAD"});
  assert_int_equal(r.status, 200);
  resp_free(&r);
  r = http(&M, "/v1/models", (req){.method = "POST", .has_body = 1});
  assert_error(&r, 405, "method_not_allowed");
  resp_free(&r);
  const char *bad[] = {"/v1/models?limit=0", "/v1/models?limit=1001",
                       "/v1/models?limit=x", "/v1/models?cursor=zz"};
  for (size_t i = 0; i < 4; i++) {
    r = http(&M, bad[i], (req){0});
    assert_error(&r, 400, "bad_request");
    resp_free(&r);
  }
}

/* limit=1 pages through the same models, in hex order, each once; a model
 * with only a warmup manifest is listed too. */
static void t_models_pages(void **state) {
  (void)state;
  char *w = warmup_json(M3, "only-a-manifest");
  assert_int_equal(put_warmup(&M, NULL, M3, w), 201);
  free(w);
  json_t *all = get_json(&M, NULL, "/v1/models", 200);
  json_t *models = json_object_get(all, "models");
  assert_true(json_array_size(models) >= 3);
  json_t *m3 = find_model(models, M3);
  assert_non_null(m3);
  assert_int_equal(JI(m3, "bundles"), 0);
  assert_int_equal(JI(json_object_get(m3, "coverage"), "present"), 0);
  char cursor[65] = "", path[160];
  size_t n = 0;
  do {
    snprintf(path, sizeof path, "/v1/models?limit=1%s%s",
             *cursor ? "&cursor=" : "", cursor);
    json_t *p = get_json(&M, NULL, path, 200);
    json_t *list = json_object_get(p, "models");
    assert_true(json_array_size(list) <= 1);
    if (json_array_size(list)) {
      assert_string_equal(
          json_string_value(json_object_get(json_array_get(list, 0), "model")),
          json_string_value(
              json_object_get(json_array_get(models, n), "model")));
      n++;
    }
    const char *next = json_string_value(json_object_get(p, "next"));
    snprintf(cursor, sizeof cursor, "%s", next ? next : "");
    json_decref(p);
  } while (*cursor);
  assert_int_equal(n, json_array_size(models));
  json_decref(all);
}

/* PUT stores the manifest as sent (201, then 200), GET returns it; a bad
 * manifest, another model's, a bad hash and an unknown model are refused. */
static void t_warmup(void **state) {
  (void)state;
  char path[160];
  char *w = warmup_json(M2, "second");
  snprintf(path, sizeof path, "/v1/models/%s/warmup", M2);
  assert_int_equal(put_warmup(&M, NULL, M2, w), 201);
  assert_int_equal(put_warmup(&M, NULL, M2, w), 200);
  resp r = http(&M, path, (req){0});
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, strlen(w));
  assert_memory_equal(r.body, w, r.len);
  resp_free(&r);
  r = http(&M, path, (req){.method = "HEAD"});
  assert_int_equal(r.status, 200);
  resp_free(&r);
  assert_int_equal(put_warmup(&M, NULL, M1, w), 422); /* M2's, under M1 */
  free(w);
  const char *bad[] = {"{", "[]", "{\"schema\":\"kcache.warmup/v1\"}"};
  for (size_t i = 0; i < 3; i++) {
    r = http(&M, path,
             (req){.method = "PUT", .body = bad[i], .len = strlen(bad[i])});
    assert_error(&r, 400, "bad_warmup");
    resp_free(&r);
  }
  r = http(&M, "/v1/models/" MODEL_B "/warmup", (req){0});
  assert_error(&r, 404, "not_found");
  resp_free(&r);
  r = http(&M, "/v1/models/ABC/warmup", (req){0});
  assert_error(&r, 400, "bad_key");
  resp_free(&r);
  r = http(&M, path, (req){.method = "DELETE"});
  assert_error(&r, 405, "method_not_allowed");
  resp_free(&r);
  r = http(&M, "/v1/models/" MODEL_B "/nothing", (req){0});
  assert_error(&r, 400, "bad_key"); /* the plain route: not 64 hex */
  resp_free(&r);
}

static json_t *cell(json_t *cov, size_t bucket, size_t arch) {
  return json_array_get(json_array_get(json_object_get(cov, "cells"), bucket),
                        arch);
}

static const char *state_of(json_t *cov, size_t bucket, size_t arch) {
  return json_string_value(json_object_get(cell(cov, bucket, arch), "state"));
}

/* The key a bundle of make_manifest's fields would have. */
static void key_of(const char *model, uint64_t batch, const char *arch,
                   char key[65]) {
  kc_key_fields f = {0};
  snprintf(f.model, sizeof f.model, "%s", model);
  memset(f.build, 'b', KC_HEX_LEN);
  snprintf(f.arch, sizeof f.arch, "%s", arch);
  f.bucket.n = 1;
  snprintf(f.bucket.dims[0].name, sizeof f.bucket.dims[0].name, "batch");
  f.bucket.dims[0].value = batch;
  f.n_tools = 1;
  snprintf(f.tools[0].name, sizeof f.tools[0].name, "cuda");
  snprintf(f.tools[0].value, sizeof f.tools[0].value, "13.0");
  assert_int_equal(kc_key_compute(&f, key, NULL), KC_OK);
}

#define MC "c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0"

/* Expected cells from the manifest: present (with bytes), missing, building
 * while a lease on the cell's key is held, and a bundle no longer expected
 * listed apart. Without a manifest: the cells the bundles have. */
static void t_coverage(void **state) {
  (void)state;
  char d[65], k[3][65], path[160];
  assert_int_equal(put_blob(&M, NULL, "coverage-blob", 13, d), 201);
  char *w = warmup_json(MC, "cov");
  assert_int_equal(put_warmup(&M, NULL, MC, w), 201);
  free(w);
  put_bundle(&M, NULL, MC, 1, "sm_80", d, 13, k[0]);
  put_bundle(&M, NULL, MC, 2, "sm_90a", d, 13, k[1]);
  put_bundle(&M, NULL, MC, 4, "sm_80", d, 13, k[2]); /* not expected */
  char lk[65];
  key_of(MC, 1, "sm_90a", lk);
  snprintf(path, sizeof path, "/v1/leases/%s", lk);
  const char *lb = "{\"holder\":\"builder-9\"}";
  resp r = http(&M, path,
                (req){.method = "POST",
                      .body = lb,
                      .len = strlen(lb),
                      .header = "Content-Type: application/json"});
  assert_int_equal(r.status, 201);
  resp_free(&r);
  snprintf(path, sizeof path, "/v1/models/%s/coverage", MC);
  json_t *c = get_json(&M, NULL, path, 200);
  assert_string_equal(json_string_value(json_object_get(c, "name")), "cov");
  assert_true(json_is_true(json_object_get(c, "warmup")));
  assert_int_equal(JI(c, "present"), 2);
  assert_int_equal(JI(c, "expected"), 4);
  assert_string_equal(state_of(c, 0, 0), "present");
  assert_string_equal(state_of(c, 0, 1), "building");
  assert_string_equal(
      json_string_value(json_object_get(cell(c, 0, 1), "holder")), "builder-9");
  assert_string_equal(state_of(c, 1, 0), "missing");
  assert_string_equal(state_of(c, 1, 1), "present");
  assert_int_equal(JI(cell(c, 1, 1), "bytes"), 13);
  json_t *extra = json_object_get(c, "extra");
  assert_int_equal(json_array_size(extra), 1);
  assert_string_equal(
      json_string_value(json_object_get(json_array_get(extra, 0), "key")),
      k[2]);
  json_decref(c);
  r = http(&M, path, (req){.method = "HEAD"});
  assert_int_equal(r.status, 200);
  resp_free(&r);
  /* no manifest: the buckets and archs its bundles have (M1 has two
   * bundles, batch 1 and 2 on sm_80; its manifest came in t_models_list, so
   * take a model of none: MODEL_B, two bundles on two archs) */
  char kb[2][65];
  put_bundle(&M, NULL, MODEL_B, 8, "sm_80", d, 13, kb[0]);
  put_bundle(&M, NULL, MODEL_B, 8, "sm_86", d, 13, kb[1]);
  c = get_json(&M, NULL, "/v1/models/" MODEL_B "/coverage", 200);
  assert_true(json_is_false(json_object_get(c, "warmup")));
  assert_true(json_is_null(json_object_get(c, "name")));
  assert_int_equal(JI(c, "expected"), 2);
  assert_int_equal(JI(c, "present"), 2);
  assert_int_equal(json_array_size(json_object_get(c, "extra")), 0);
  json_decref(c);
  c = get_json(&M, NULL, "/v1/models/" MODEL_A "/coverage", 200); /* none */
  assert_int_equal(JI(c, "expected"), 0);
  json_decref(c);
  r = http(&M, "/v1/models/xyz/coverage", (req){0});
  assert_error(&r, 400, "bad_key");
  resp_free(&r);
  r = http(&M, path, (req){.method = "PUT", .has_body = 1});
  assert_error(&r, 405, "method_not_allowed");
  resp_free(&r);
}

/* ---- purge under concurrent reads ---- */

#define MA "a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7"

/* The archs (JSON array of strings) of a coverage answer, "a,b". */
static void archs_text(json_t *c, const char *field, char *out, size_t cap) {
  size_t i, n = 0;
  json_t *a;
  out[0] = '\0';
  json_array_foreach(json_object_get(c, field), i, a) n += (size_t)snprintf(
      out + n, cap - n, "%s%s", i ? "," : "", json_string_value(a));
}

/* The coverage's columns are the archs the warms ran for: a warm with
 * --arch sm_86 of a manifest listing sm_80 and sm_90a shows its bundles
 * present under sm_86, not as "no longer expected"; warms of the same
 * manifest add their archs; a changed manifest starts over; a bad list is
 * 400. */
static void t_warm_archs(void **state) {
  (void)state;
  char d[65], k[65], path[160], got[200];
  assert_int_equal(put_blob(&M, NULL, "warm-archs-blob", 15, d), 201);
  put_bundle(&M, NULL, MA, 1, "sm_86", d, 15, k);
  put_bundle(&M, NULL, MA, 2, "sm_86", d, 15, k);
  char *w = warmup_json(MA, "warm-archs");
  snprintf(path, sizeof path, "/v1/models/%s/warmup?archs=sm_86", MA);
  resp r = http(&M, path, (req){.method = "PUT", .body = w, .len = strlen(w)});
  assert_int_equal(r.status, 201);
  resp_free(&r);
  snprintf(path, sizeof path, "/v1/models/%s/coverage", MA);
  json_t *c = get_json(&M, NULL, path, 200);
  archs_text(c, "archs", got, sizeof got);
  assert_string_equal(got, "sm_86");
  archs_text(c, "manifest_archs", got, sizeof got);
  assert_string_equal(got, "sm_80,sm_90a");
  assert_string_equal(json_string_value(json_object_get(c, "archs_from")),
                      "warm");
  assert_int_equal(JI(c, "present"), 2);
  assert_int_equal(JI(c, "expected"), 2);
  assert_int_equal(json_array_size(json_object_get(c, "extra")), 0);
  json_decref(c);
  /* another runner's warm of the same manifest, for sm_80 */
  snprintf(path, sizeof path, "/v1/models/%s/warmup?archs=sm_80", MA);
  r = http(&M, path, (req){.method = "PUT", .body = w, .len = strlen(w)});
  assert_int_equal(r.status, 200);
  resp_free(&r);
  snprintf(path, sizeof path, "/v1/models/%s/coverage", MA);
  c = get_json(&M, NULL, path, 200);
  archs_text(c, "archs", got, sizeof got);
  assert_string_equal(got, "sm_86,sm_80");
  assert_int_equal(JI(c, "present"), 2);
  assert_int_equal(JI(c, "expected"), 4);
  json_decref(c);
  /* the listing counts the same cells */
  json_t *j = get_json(&M, NULL, "/v1/models", 200);
  json_t *m = find_model(json_object_get(j, "models"), MA);
  assert_int_equal(JI(json_object_get(m, "coverage"), "expected"), 4);
  json_decref(j);
  /* a changed manifest (a warm without --arch): its own archs */
  free(w);
  w = warmup_json(MA, "warm-archs");
  char *w2 = malloc(strlen(w) + 8);
  assert_non_null(w2);
  sprintf(w2, "%s", w);
  *strstr(w2, "\"batch\":2") = '\0';
  strcat(w2, "\"batch\":3}]}");
  snprintf(path, sizeof path, "/v1/models/%s/warmup", MA);
  assert_int_equal(put_warmup(&M, NULL, MA, w2), 200);
  snprintf(path, sizeof path, "/v1/models/%s/coverage", MA);
  c = get_json(&M, NULL, path, 200);
  archs_text(c, "archs", got, sizeof got);
  assert_string_equal(got, "sm_80,sm_90a");
  assert_string_equal(json_string_value(json_object_get(c, "archs_from")),
                      "manifest");
  json_decref(c);
  const char *bad[] = {"sm_86,", "nonsense", ",sm_80", "sm_80,,sm_86"};
  for (size_t i = 0; i < 4; i++) {
    snprintf(path, sizeof path, "/v1/models/%s/warmup?archs=%s", MA, bad[i]);
    r = http(&M, path, (req){.method = "PUT", .body = w2, .len = strlen(w2)});
    assert_error(&r, 400, "bad_request");
    resp_free(&r);
  }
  free(w);
  free(w2);
}

#define MP "abababababababababababababababababababababababababababababababab"
#define N_PURGE 300 /* more than one batch (KC_STORE_PURGE_BATCH 256) */
#define N_READERS 4

typedef struct reader {
  pthread_t th;
  _Atomic int *stop;
  char (*keys)[65];
  char **jsons;
  int bad; /* answers other than 200/404, or a torn manifest */
  long reads;
} reader;

/* Reads the model's bundles, its listing and coverage while the purge
 * runs: every answer is 200 or 404, and a bundle is whole or absent. */
static void *read_loop(void *arg) {
  reader *rd = arg;
  CURL *c = curl_easy_init();
  char path[160];
  for (unsigned i = 0; !atomic_load(rd->stop); i++, rd->reads++) {
    unsigned k = (i * 7919u) % N_PURGE;
    if (i % 3 == 0)
      snprintf(path, sizeof path, "/v1/bundles/%.64s", rd->keys[k]);
    else if (i % 3 == 1)
      snprintf(path, sizeof path, "/v1/models/%s", MP);
    else
      snprintf(path, sizeof path, "/v1/models/%s/coverage", MP);
    kc_testsrv_resp r = kc_testsrv_http(c, M.url, path, (req){0});
    if (r.status != 200 && !(i % 3 == 0 && r.status == 404))
      rd->bad++;
    if (i % 3 == 0 && r.status == 200 && strcmp(r.body, rd->jsons[k]) != 0)
      rd->bad++;
    kc_testsrv_resp_free(&r);
  }
  curl_easy_cleanup(c);
  return NULL;
}

static void t_purge_concurrent(void **state) {
  (void)state;
  char d[65], path[160];
  static char keys[N_PURGE][65];
  char *jsons[N_PURGE];
  assert_int_equal(put_blob(&M, NULL, "purge-blob", 10, d), 201);
  char ds[1][65];
  memcpy(ds[0], d, 65);
  uint64_t n = 10;
  for (int i = 0; i < N_PURGE; i++) {
    jsons[i] = make_manifest(MP, (uint64_t)i + 1, "sm_90a", ds, &n, 1, keys[i]);
    snprintf(path, sizeof path, "/v1/bundles/%.64s", keys[i]);
    resp r =
        http(&M, path,
             (req){.method = "PUT", .body = jsons[i], .len = strlen(jsons[i])});
    assert_int_equal(r.status, 201);
    resp_free(&r);
  }
  char *w = warmup_json(MP, "to-purge");
  assert_int_equal(put_warmup(&M, NULL, MP, w), 201);
  free(w);
  json_t *st = get_json(&M, NULL, "/v1/stats", 200);
  long bundles_before = JI(st, "bundles");
  json_decref(st);
  _Atomic int stop = 0;
  reader rd[N_READERS];
  for (int i = 0; i < N_READERS; i++) {
    rd[i] = (reader){.stop = &stop, .keys = keys, .jsons = jsons};
    assert_int_equal(pthread_create(&rd[i].th, NULL, read_loop, &rd[i]), 0);
  }
  kc_testsrv_sleep_ms(200);
  snprintf(path, sizeof path, "/v1/models/%s", MP);
  resp r = http(&M, path, (req){.method = "DELETE"});
  assert_int_equal(r.status, 200);
  json_t *j = body_json(&r);
  assert_int_equal(JI(j, "removed"), N_PURGE);
  json_decref(j);
  resp_free(&r);
  kc_testsrv_sleep_ms(200);
  atomic_store(&stop, 1);
  for (int i = 0; i < N_READERS; i++) {
    pthread_join(rd[i].th, NULL);
    assert_int_equal(rd[i].bad, 0);
    assert_true(rd[i].reads > 0);
  }
  for (int i = 0; i < N_PURGE; i++)
    free(jsons[i]);
  j = get_json(&M, NULL, path, 200);
  assert_int_equal(json_array_size(json_object_get(j, "bundles")), 0);
  json_decref(j);
  j = get_json(&M, NULL, "/v1/models", 200);
  assert_null(find_model(json_object_get(j, "models"), MP));
  json_decref(j);
  st = get_json(&M, NULL, "/v1/stats", 200);
  assert_int_equal(JI(st, "bundles"), bundles_before - N_PURGE);
  json_decref(st);
  snprintf(path, sizeof path, "/v1/blobs/%s", d); /* an orphan now, for gc */
  r = http(&M, path, (req){.method = "HEAD"});
  assert_int_equal(r.status, 200);
  resp_free(&r);
  snprintf(path, sizeof path, "/v1/models/%s", MP);
  r = http(&M, path, (req){.method = "DELETE"}); /* nothing left: 0 */
  assert_int_equal(r.status, 200);
  j = body_json(&r);
  assert_int_equal(JI(j, "removed"), 0);
  json_decref(j);
  resp_free(&r);
  r = http(&M, "/v1/models/XYZ", (req){.method = "DELETE"});
  assert_error(&r, 400, "bad_key");
  resp_free(&r);
}

/* ---- history ---- */

/* Complete 10-second slots of the counters; none after a restart. */
static void t_history(void **state) {
  (void)state;
  kc_testsrv h = {0};
  assert_int_equal(kc_testsrv_start(&h, NULL), 0);
  char d[65];
  assert_int_equal(put_blob(&h, NULL, "history-blob", 12, d), 201);
  json_t *j = NULL, *pts = NULL;
  long requests = 0, t0 = kc_testsrv_now_ms();
  /* a slot is listed once it is over: within 10 to 20 s */
  while (kc_testsrv_now_ms() - t0 < 25000) {
    resp r = http(&h, "/healthz", (req){0});
    resp_free(&r);
    json_decref(j);
    j = get_json(&h, NULL, "/v1/stats/history", 200);
    pts = json_object_get(j, "points");
    requests = 0;
    size_t i;
    json_t *p;
    json_array_foreach(pts, i, p) requests += JI(p, "requests");
    if (requests > 0)
      break;
    kc_testsrv_sleep_ms(500);
  }
  assert_true(requests > 0);
  assert_int_equal(JI(j, "step_s"), 10);
  json_t *p0 = json_array_get(pts, 0);
  assert_int_equal(JI(p0, "t") % 10, 0);
  const char *names[] = {"requests",  "hits",      "misses",
                         "bytes_out", "evictions", "resp_commands"};
  for (size_t i = 0; i < 6; i++)
    assert_true(json_is_integer(json_object_get(p0, names[i])));
  assert_true(requests <= metric(&h, "kcached_requests_total") ||
              metric(&h, "kcached_requests_total") < 0);
  json_t *g = json_object_get(j, "gauges");
  assert_true(json_is_true(json_object_get(g, "store_up")));
  assert_true(json_is_false(json_object_get(g, "resp")));
  json_decref(j);
  assert_int_equal(kc_testsrv_restart(&h), 0);
  j = get_json(&h, NULL, "/v1/stats/history", 200);
  assert_int_equal(json_array_size(json_object_get(j, "points")), 0);
  json_decref(j);
  resp r =
      http(&h, "/v1/stats/history", (req){.method = "POST", .has_body = 1});
  assert_error(&r, 405, "method_not_allowed");
  resp_free(&r);
  assert_int_equal(kc_testsrv_stop(&h), 0);
  kc_testsrv_cleanup(&h);
}

/* ---- the page ---- */

static void t_page(void **state) {
  (void)state;
  const char *paths[] = {"/", "/app.js", "/style.css"};
  const char *types[] = {"text/html", "text/javascript", "text/css"};
  const char *marks[] = {"<script src=\"/app.js\"", "textContent", "body"};
  for (size_t i = 0; i < 3; i++) {
    resp r = http(&M, paths[i], (req){0});
    assert_int_equal(r.status, 200);
    char v[512];
    assert_true(header(&r, "Content-Type", v, sizeof v));
    assert_non_null(strstr(v, types[i]));
    assert_true(header(&r, "Content-Security-Policy", v, sizeof v));
    const char *csp[] = {
        "default-src 'self'",   "script-src 'self'",  "style-src 'self'",
        "img-src 'self' data:", "connect-src 'self'", "frame-ancestors 'none'"};
    for (size_t c = 0; c < 6; c++)
      assert_non_null(strstr(v, csp[c]));
    assert_non_null(strstr(r.body, marks[i]));
    resp_free(&r);
  }
  resp r = http(&M, "/", (req){0});
  /* no other host: no absolute URL and no inline script in the page */
  assert_null(strstr(r.body, "http://"));
  assert_null(strstr(r.body, "https://"));
  assert_null(strstr(r.body, "<script>"));
  assert_null(strstr(r.body, "<style"));
  resp_free(&r);
  r = http(&M, "/app.js", (req){0});
  assert_null(strstr(r.body, "innerHTML")); /* data goes in as text */
  assert_null(strstr(r.body, "eval("));
  resp_free(&r);
  r = http(&M, "/", (req){.method = "HEAD"});
  assert_int_equal(r.status, 200);
  resp_free(&r);
  r = http(&M, "/", (req){.method = "PUT", .has_body = 1});
  assert_error(&r, 405, "method_not_allowed");
  resp_free(&r);
  r = http(&M, "/index.html", (req){0});
  assert_error(&r, 404, "not_found");
  resp_free(&r);
}

/* ---- roles ---- */

typedef struct toks {
  char read[128], write[128], admin[128];
} toks;

static void expect(const kc_testsrv *t, const char *method, const char *path,
                   const char *body, const char *token, long status) {
  resp r = http(t, path,
                (req){.method = method,
                      .token = token,
                      .body = body,
                      .len = body ? strlen(body) : 0,
                      .has_body = body != NULL});
  if (r.status != status)
    fprintf(stderr, "%s %s: %ld, not %ld: %s\n", method, path, r.status, status,
            r.body);
  assert_int_equal(r.status, status);
  resp_free(&r);
}

/* Each route with no token, and each role: the page needs none, the data
 * routes keep theirs; the listing says which role asked. */
static void t_roles(void **state) {
  (void)state;
  kc_testsrv a;
  toks T;
  char file[400], path[160];
  assert_int_equal(kc_testsrv_init(&a), 0);
  snprintf(file, sizeof file, "%s/tokens", a.dir);
  new_token("read", "reader", file, T.read, sizeof T.read);
  new_token("write", "ci", file, T.write, sizeof T.write);
  new_token("admin", "ops", file, T.admin, sizeof T.admin);
  const char *const args[] = {"--tokens", file, NULL};
  assert_int_equal(kc_testsrv_start(&a, args), 0);
  char *w = warmup_json(M1, "roles");
  snprintf(path, sizeof path, "/v1/models/%s/warmup", M1);
  expect(&a, "PUT", path, w, NULL, 401);
  expect(&a, "PUT", path, w, T.read, 403);
  expect(&a, "PUT", path, w, T.write, 201);
  expect(&a, "PUT", path, w, T.admin, 200);
  free(w);
  expect(&a, "GET", path, NULL, NULL, 401);
  expect(&a, "GET", path, NULL, T.read, 200);
  const char *reads[] = {"/v1/models", "/v1/stats/history",
                         "/v1/models/" M1 "/coverage"};
  for (size_t i = 0; i < 3; i++) {
    expect(&a, "GET", reads[i], NULL, NULL, 401);
    expect(&a, "GET", reads[i], NULL, T.read, 200);
  }
  const char *page[] = {"/", "/app.js", "/style.css"};
  for (size_t i = 0; i < 3; i++)
    expect(&a, "GET", page[i], NULL, NULL, 200);
  json_t *j = get_json(&a, T.read, "/v1/models", 200);
  assert_string_equal(json_string_value(json_object_get(j, "role")), "read");
  assert_string_equal(json_string_value(json_object_get(j, "token")), "reader");
  assert_true(json_is_true(json_object_get(j, "auth")));
  json_decref(j);
  snprintf(path, sizeof path, "/v1/models/%s", M1);
  expect(&a, "DELETE", path, NULL, NULL, 401);
  expect(&a, "DELETE", path, NULL, T.read, 403);
  expect(&a, "DELETE", path, NULL, T.write, 403);
  expect(&a, "DELETE", path, NULL, T.admin, 200);
  assert_int_equal(kc_testsrv_stop(&a), 0);
  kc_testsrv_cleanup(&a);
}

/* The attack a name invites: a write token re-points the name an admin's
 * purge resolves (renames the named model away, names another model so).
 * A name belongs to the first manifest that gave it: a write token may
 * replace a manifest under its name, not rename it nor take another
 * model's name (409); an admin may do both. */
static void t_warmup_names(void **state) {
  (void)state;
  kc_testsrv a;
  toks T;
  char file[400], path[160];
  assert_int_equal(kc_testsrv_init(&a), 0);
  snprintf(file, sizeof file, "%s/tokens", a.dir);
  new_token("write", "ci", file, T.write, sizeof T.write);
  new_token("admin", "ops", file, T.admin, sizeof T.admin);
  const char *const args[] = {"--tokens", file, NULL};
  assert_int_equal(kc_testsrv_start(&a, args), 0);
  char *demo = warmup_json(M1, "demo-mlp"), *victim = warmup_json(M2, "llm");
  assert_int_equal(put_warmup(&a, T.write, M1, demo), 201);
  assert_int_equal(put_warmup(&a, T.write, M2, victim), 201);
  assert_int_equal(put_warmup(&a, T.write, M1, demo), 200); /* CI re-warm */
  char *forged = warmup_json(M2, "demo-mlp"), *away = warmup_json(M1, "x");
  snprintf(path, sizeof path, "/v1/models/%s/warmup", M2);
  resp r = http(&a, path,
                (req){.method = "PUT",
                      .token = T.write,
                      .body = forged,
                      .len = strlen(forged)});
  assert_error(&r, 409, "conflict");
  assert_non_null(strstr(r.body, M1)); /* names the holder */
  resp_free(&r);
  assert_int_equal(put_warmup(&a, T.write, M1, away), 409);
  /* a model with no manifest yet cannot take a held name either */
  char *third = warmup_json(M3, "demo-mlp");
  assert_int_equal(put_warmup(&a, T.write, M3, third), 409);
  json_t *j = get_json(&a, T.write, "/v1/models", 200);
  json_t *m1 = find_model(json_object_get(j, "models"), M1);
  json_t *m2 = find_model(json_object_get(j, "models"), M2);
  assert_string_equal(json_string_value(json_object_get(m1, "name")),
                      "demo-mlp");
  assert_string_equal(json_string_value(json_object_get(m2, "name")), "llm");
  assert_null(find_model(json_object_get(j, "models"), M3));
  json_decref(j);
  /* an admin may rename */
  assert_int_equal(put_warmup(&a, T.admin, M1, away), 200);
  assert_int_equal(put_warmup(&a, T.write, M3, third), 201);
  free(demo);
  free(victim);
  free(forged);
  free(away);
  free(third);
  assert_int_equal(kc_testsrv_stop(&a), 0);
  kc_testsrv_cleanup(&a);
}

/* ---- the store's side (store/models.c), directly ---- */

static int count_model(const kc_store_model_info *m, void *ud) {
  (void)m;
  (*(int *)ud)++;
  return 0;
}

static void store_put(kc_store *s, const char *model, uint64_t batch,
                      char (*d)[65], uint64_t *sizes, size_t n) {
  char key[65], err[KC_ERRBUF_SIZE];
  char *json = kc_testsrv_manifest(model, batch, "sm_80", d, sizes, n, key);
  kc_manifest *m = NULL;
  assert_int_equal(kc_manifest_parse(json, strlen(json), &m, err), KC_OK);
  int created = 0;
  assert_int_equal(kc_store_bundle_put(s, m, &created, NULL, NULL, err), KC_OK);
  kc_manifest_free(m);
  free(json);
}

/* A purge leaves the blobs only its bundles used unreferenced: gc collects
 * them after the grace period, and keeps one another model still uses; the
 * warmup manifest goes with the purge, the store verifies. */
static void t_store_purge_gc(void **state) {
  (void)state;
  char dir[] = "/tmp/kcache-models-XXXXXX", err[KC_ERRBUF_SIZE] = "";
  assert_non_null(mkdtemp(dir));
  kc_store *s = NULL;
  kc_store_opts o = {.dir = dir};
  assert_int_equal(kc_store_open(&o, &s, err), KC_OK);
  char d[2][65];
  uint64_t sizes[2] = {6, 7};
  int created;
  sha_hex("shared", 6, d[0]);
  sha_hex("only-mp", 7, d[1]);
  assert_int_equal(kc_store_blob_put(s, d[0], "shared", 6, &created, err), 0);
  assert_int_equal(kc_store_blob_put(s, d[1], "only-mp", 7, &created, err), 0);
  for (uint64_t b = 1; b <= 3; b++)
    store_put(s, MP, b, d, sizes, 2);
  store_put(s, M1, 1, d, sizes, 1); /* M1 uses the shared blob only */
  char *w = warmup_json(MP, "store-purge");
  assert_int_equal(
      kc_store_warmup_put(s, MP, "store-purge", w, strlen(w), 0, "sm_80", err),
      KC_OK);
  free(w);
  int n = 0;
  char next[65];
  assert_int_equal(
      kc_store_models_list(s, NULL, 10, count_model, &n, next, err), KC_OK);
  assert_int_equal(n, 2);
  assert_string_equal(next, "");
  n = 0; /* a page of one: next names it */
  assert_int_equal(kc_store_models_list(s, NULL, 1, count_model, &n, next, err),
                   KC_OK);
  assert_int_equal(n, 1);
  assert_true(kc_is_hex64(next));
  size_t removed = 0;
  assert_int_equal(kc_store_model_purge(s, MP, &removed, err), KC_OK);
  assert_int_equal(removed, 3);
  char *got = NULL;
  size_t len = 0;
  assert_int_equal(kc_store_warmup_get(s, MP, &got, &len, NULL), KC_NOT_FOUND);
  assert_int_equal(kc_store_gc(s, (int64_t)time(NULL) + 7200, err), KC_OK);
  assert_int_equal(kc_store_blob_has(s, d[1], NULL), KC_NOT_FOUND);
  assert_int_equal(kc_store_blob_has(s, d[0], NULL), KC_OK);
  assert_int_equal(kc_store_verify(s, err), KC_OK);
  kc_store_close(s);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

/* Warmup manifests under --max-bytes: any write token could PUT 4 MB of
 * them per model for any number of models, uncounted, until the map was
 * full and every write got 507. Now they count in bytes_used and take at
 * most 1/8 of the limit together: a flood of them keeps to that share, and
 * other writes keep working. */
static void t_warmup_flood(void **state) {
  (void)state;
  kc_testsrv t = {0};
  const char *const args[] = {"--max-bytes", "8M", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  size_t pad = 150 * 1024;
  char *arg = malloc(pad + 1);
  assert_non_null(arg);
  memset(arg, 'a', pad);
  arg[pad] = '\0';
  for (unsigned i = 0; i < 80; i++) { /* 12 MB of manifests */
    char model[65], name[32];
    snprintf(model, sizeof model, "%064x", 0xf100 + i);
    snprintf(name, sizeof name, "flood-%u", i);
    json_t *j = json_pack("{ss s{ss ss} s[ss] s{s[ss]} s[{si}]}", "schema",
                          "kcache.warmup/v1", "model", "name", name, "hash",
                          model, "archs", "sm_80", "sm_90a", "builder",
                          "command", "true", arg, "buckets", "batch", 1);
    char *w = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    assert_int_equal(put_warmup(&t, NULL, model, w), 201);
    free(w);
  }
  free(arg);
  json_t *st = get_json(&t, NULL, "/v1/stats", 200);
  json_int_t used = json_integer_value(json_object_get(st, "bytes_used"));
  print_message("80 manifests of 150 KB under --max-bytes 8M: %lld bytes "
                "used\n",
                (long long)used);
  assert_true(used > 512 * 1024 && used <= 1024 * 1024);
  json_decref(st);
  size_t n = 1 << 20; /* a blob write still works */
  unsigned char *b = kc_testsrv_bytes(7, n);
  char d[65], path[128];
  kc_sha256_hex(b, n, d);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(&t, path, (req){.method = "PUT", .body = (char *)b, .len = n});
  assert_int_equal(r.status, 201);
  resp_free(&r);
  free(b);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

int main(void) {
  const struct CMUnitTest api[] = {
      cmocka_unit_test(t_models_list), cmocka_unit_test(t_models_pages),
      cmocka_unit_test(t_warmup),      cmocka_unit_test(t_coverage),
      cmocka_unit_test(t_warm_archs),  cmocka_unit_test(t_purge_concurrent),
      cmocka_unit_test(t_page),
  };
  const struct CMUnitTest own[] = {
      cmocka_unit_test(t_history),      cmocka_unit_test(t_roles),
      cmocka_unit_test(t_warmup_names), cmocka_unit_test(t_store_purge_gc),
      cmocka_unit_test(t_warmup_flood),
  };
  servertest_init();
  int fails = 0;
  fails += cmocka_run_group_tests_name("models", api, m_setup, m_teardown);
  fails += cmocka_run_group_tests_name("own_server", own, NULL, NULL);
  curl_global_cleanup();
  return fails ? 1 : 0;
}
