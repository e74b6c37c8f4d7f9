/* test_server_bundle.c: kcached integration tests (the real binary on a free
 * loopback port, spoken to with libcurl) of bundles: round trips, write-once
 * conflicts, missing blobs, a key that does not match, bad manifests and keys,
 * JSON too large, lookup and its limits, model listings. Helpers and the
 * shared open server: servertest.h. */
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include "servertest.h"

static void t_bundle_roundtrip(void **state) {
  (void)state;
  char key[65], path[128];
  const char *present = "kcached_ops_total{op=\"set\",frontend=\"http\","
                        "result=\"present\"}";
  const char *created = "kcached_ops_total{op=\"set\",frontend=\"http\","
                        "result=\"new\"}";
  double p0 = kc_testsrv_metric(&S, present),
         n0 = kc_testsrv_metric(&S, created);
  char *json = store_bundle(&S, NULL, MODEL_A, 1, 11, key);
  snprintf(path, sizeof path, "/v1/bundles/%s", key);
  resp r =
      http(&S, path, (req){.method = "PUT", .body = json, .len = strlen(json)});
  assert_int_equal(r.status, 200); /* identical, already there */
  resp_free(&r);
  /* the shared op label: one bundle written, then offered again */
  assert_true(kc_testsrv_metric(&S, created) == n0 + 1);
  assert_true(kc_testsrv_metric(&S, present) == p0 + 1);
  r = http(&S, path, (req){0});
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, strlen(json));
  assert_memory_equal(r.body, json, r.len);
  resp_free(&r);
  r = http(&S, path, (req){.method = "HEAD"});
  assert_int_equal(r.status, 200);
  resp_free(&r);
  r = http(&S, path, (req){.method = "DELETE"});
  assert_int_equal(r.status, 204);
  assert_int_equal(r.len, 0);
  resp_free(&r);
  r = http(&S, path, (req){0});
  assert_error(&r, 404, "not_found");
  resp_free(&r);
  r = http(&S, path, (req){.method = "DELETE"});
  assert_error(&r, 404, "not_found");
  resp_free(&r);
  free(json);
}

static void t_bundle_conflict(void **state) {
  (void)state;
  char key[65], key2[65], path[128], d[1][65];
  char *json = store_bundle(&S, NULL, MODEL_A, 2, 12, key);
  uint64_t size = 7;
  assert_int_equal(put_blob(&S, NULL, "other!!", 7, d[0]), 201);
  char *other = make_manifest(MODEL_A, 2, "sm_90a", d, &size, 1, key2);
  assert_string_equal(key, key2); /* same fields, different files */
  snprintf(path, sizeof path, "/v1/bundles/%s", key);
  resp r = http(&S, path,
                (req){.method = "PUT", .body = other, .len = strlen(other)});
  assert_error(&r, 409, "conflict");
  resp_free(&r);
  free(json);
  free(other);
}

static void t_bundle_missing_blobs(void **state) {
  (void)state;
  char d[2][65], key[65], path[128];
  uint64_t sizes[2] = {10, 20};
  sha_hex("absent one", 10, d[0]);
  sha_hex("absent two", 10, d[1]);
  char *json = make_manifest(MODEL_A, 3, "sm_80", d, sizes, 2, key);
  snprintf(path, sizeof path, "/v1/bundles/%s", key);
  resp r =
      http(&S, path, (req){.method = "PUT", .body = json, .len = strlen(json)});
  assert_error(&r, 409, "missing_blobs");
  json_t *j = body_json(&r);
  json_t *missing = json_object_get(j, "missing");
  assert_true(json_is_array(missing));
  assert_int_equal(json_array_size(missing), 2);
  for (int i = 0; i < 2; i++) {
    int seen = 0;
    for (size_t k = 0; k < 2; k++)
      seen |= strcmp(json_string_value(json_array_get(missing, k)), d[i]) == 0;
    assert_true(seen);
  }
  json_decref(j);
  resp_free(&r);
  r = http(&S, path, (req){0});
  assert_int_equal(r.status, 404);
  resp_free(&r);
  free(json);
}

static void t_bundle_key_mismatch(void **state) {
  (void)state;
  char d[1][65], key[65], path[128];
  uint64_t size = 3;
  assert_true(put_blob(&S, NULL, "abc", 3, d[0]) / 100 == 2);
  char *json = make_manifest(MODEL_A, 4, "sm_90a", d, &size, 1, key);
  /* a valid manifest under another key's URL */
  char other[65];
  sha_hex("another key", 11, other);
  snprintf(path, sizeof path, "/v1/bundles/%s", other);
  resp r =
      http(&S, path, (req){.method = "PUT", .body = json, .len = strlen(json)});
  assert_error(&r, 422, "key_mismatch");
  resp_free(&r);
  /* a manifest whose key is not the hash of its fields */
  json_t *j = json_loads(json, 0, NULL);
  json_object_set_new(j, "key", json_string(other));
  char *forged = json_dumps(j, JSON_COMPACT);
  r = http(&S, path,
           (req){.method = "PUT", .body = forged, .len = strlen(forged)});
  assert_error(&r, 422, "key_mismatch");
  resp_free(&r);
  free(forged);
  json_decref(j);
  free(json);
}

/* PUTs json with one change made by edit(); asserts 400 and the code. */
static void put_edited(const char *json, const char *key,
                       void (*edit)(json_t *), const char *code,
                       const char *mention) {
  json_t *j = json_loads(json, 0, NULL);
  edit(j);
  char *text = json_dumps(j, JSON_COMPACT);
  char path[128];
  snprintf(path, sizeof path, "/v1/bundles/%s", key);
  resp r =
      http(&S, path, (req){.method = "PUT", .body = text, .len = strlen(text)});
  assert_error(&r, 400, code);
  if (mention)
    assert_true(error_mentions(&r, mention));
  resp_free(&r);
  free(text);
  json_decref(j);
}

static void edit_arch_type(json_t *j) {
  json_object_set_new(j, "arch", json_integer(5));
}
static void edit_files_type(json_t *j) {
  json_object_set_new(j, "files", json_string("x"));
}
static void edit_size_type(json_t *j) {
  json_object_set_new(json_array_get(json_object_get(j, "files"), 0), "size",
                      json_string("12"));
}
static void edit_unknown(json_t *j) {
  json_object_set_new(j, "surprise", json_true());
}
static void set_path(json_t *j, const char *p) {
  json_object_set_new(json_array_get(json_object_get(j, "files"), 0), "path",
                      json_string(p));
}
static void edit_dotdot(json_t *j) { set_path(j, "../evil.cubin"); }
static void edit_abs(json_t *j) { set_path(j, "/etc/passwd"); }
static void edit_deep(json_t *j) { set_path(j, "a/../../b.cubin"); }
static void edit_backslash(json_t *j) { set_path(j, "a\\..\\b"); }
static void edit_bad_sha(json_t *j) {
  json_object_set_new(json_array_get(json_object_get(j, "files"), 0), "sha256",
                      json_string("ABC"));
}

static void t_bundle_bad_manifests(void **state) {
  (void)state;
  char d[1][65], key[65], path[128];
  uint64_t size = 3;
  assert_true(put_blob(&S, NULL, "def", 3, d[0]) / 100 == 2);
  char *json = make_manifest(MODEL_A, 5, "sm_90a", d, &size, 1, key);
  put_edited(json, key, edit_arch_type, "bad_manifest", "arch");
  put_edited(json, key, edit_files_type, "bad_manifest", "files");
  put_edited(json, key, edit_size_type, "bad_manifest", "size");
  put_edited(json, key, edit_unknown, "bad_manifest", "surprise");
  put_edited(json, key, edit_dotdot, "bad_manifest", "files[0].path");
  put_edited(json, key, edit_abs, "bad_manifest", "files[0].path");
  put_edited(json, key, edit_deep, "bad_manifest", "files[0].path");
  put_edited(json, key, edit_backslash, "bad_manifest", "files[0].path");
  put_edited(json, key, edit_bad_sha, "bad_manifest", "sha256");
  snprintf(path, sizeof path, "/v1/bundles/%s", key);
  const char *malformed[] = {"{not json", "[]", "", "{\"key\":", "null"};
  for (size_t i = 0; i < sizeof malformed / sizeof *malformed; i++) {
    resp r = http(&S, path,
                  (req){.method = "PUT",
                        .body = malformed[i],
                        .len = strlen(malformed[i]),
                        .has_body = 1});
    assert_int_equal(r.status, 400);
    json_t *e = body_json(&r);
    const char *code = json_string_value(json_object_get(e, "error"));
    assert_true(strcmp(code, "bad_json") == 0 ||
                strcmp(code, "bad_manifest") == 0);
    json_decref(e);
    resp_free(&r);
  }
  resp r = http(&S, path, (req){0});
  assert_int_equal(r.status, 404); /* none of that was stored */
  resp_free(&r);
  free(json);
}

static void t_bundle_bad_key(void **state) {
  (void)state;
  for (size_t i = 0; i < N_BAD_HEX; i++) {
    char path[256];
    snprintf(path, sizeof path, "/v1/bundles/%s", bad_hex[i]);
    resp r = http(&S, path, (req){0});
    assert_error(&r, 400, "bad_key");
    resp_free(&r);
    r = http(&S, path, (req){.method = "PUT", .body = "{}", .len = 2});
    assert_error(&r, 400, "bad_key");
    resp_free(&r);
    r = http(&S, path, (req){.method = "DELETE"});
    assert_error(&r, 400, "bad_key");
    resp_free(&r);
  }
}

static void t_json_too_large(void **state) {
  (void)state;
  size_t n = 2u << 20;
  char *big = malloc(n), key[65], path[128];
  memset(big, ' ', n);
  big[0] = '{';
  big[n - 1] = '}';
  sha_hex("k", 1, key);
  snprintf(path, sizeof path, "/v1/bundles/%s", key);
  resp r = http(&S, path, (req){.method = "PUT", .body = big, .len = n});
  assert_error(&r, 413, "too_large");
  resp_free(&r);
  r = http(&S, "/v1/lookup",
           (req){.method = "POST", .body = big, .len = n, .chunked = 1});
  assert_error(&r, 413, "too_large");
  resp_free(&r);
  free(big);
}

static void t_lookup(void **state) {
  (void)state;
  char k1[65], k2[65], absent[65];
  char *j1 = store_bundle(&S, NULL, MODEL_A, 6, 21, k1);
  char *j2 = store_bundle(&S, NULL, MODEL_A, 7, 22, k2);
  sha_hex("absent key", 10, absent);
  const char *hit = "kcached_ops_total{op=\"lookup\",frontend=\"http\","
                    "result=\"hit\"}";
  const char *miss = "kcached_ops_total{op=\"lookup\",frontend=\"http\","
                     "result=\"miss\"}";
  double h0 = kc_testsrv_metric(&S, hit), m0 = kc_testsrv_metric(&S, miss);
  char body[512];
  snprintf(body, sizeof body, "{\"keys\":[\"%s\",\"%s\",\"%s\",\"%s\"]}", k1,
           absent, k2, k1);
  resp r = http(&S, "/v1/lookup",
                (req){.method = "POST", .body = body, .len = strlen(body)});
  assert_int_equal(r.status, 200);
  /* each distinct key counted once: two found, one missing */
  assert_true(kc_testsrv_metric(&S, hit) == h0 + 2);
  assert_true(kc_testsrv_metric(&S, miss) == m0 + 1);
  json_t *j = body_json(&r);
  json_t *found = json_object_get(j, "found");
  assert_int_equal(json_object_size(found), 2);
  assert_string_equal(
      json_string_value(json_object_get(json_object_get(found, k1), "key")),
      k1);
  assert_non_null(json_object_get(found, k2));
  json_t *missing = json_object_get(j, "missing");
  assert_int_equal(json_array_size(missing), 1);
  assert_string_equal(json_string_value(json_array_get(missing, 0)), absent);
  json_decref(j);
  resp_free(&r);
  r = http(&S, "/v1/lookup",
           (req){.method = "POST", .body = "{\"keys\":[]}", .len = 11});
  assert_int_equal(r.status, 200);
  resp_free(&r);
  free(j1);
  free(j2);
}

static char *many_keys(size_t n) {
  size_t cap = 16 + n * 68;
  char *b = malloc(cap);
  size_t pos = (size_t)snprintf(b, cap, "{\"keys\":[");
  for (size_t i = 0; i < n; i++) {
    char k[65], seed[32];
    int len = snprintf(seed, sizeof seed, "%zu", i);
    sha_hex(seed, (size_t)len, k);
    pos += (size_t)snprintf(b + pos, cap - pos, "%s\"%s\"", i ? "," : "", k);
  }
  snprintf(b + pos, cap - pos, "]}");
  return b;
}

static void lookup_expect(const char *body, long status, const char *code,
                          const char *mention) {
  resp r = http(
      &S, "/v1/lookup",
      (req){
          .method = "POST", .body = body, .len = strlen(body), .has_body = 1});
  if (code)
    assert_error(&r, status, code);
  else
    assert_int_equal(r.status, status);
  if (mention)
    assert_true(error_mentions(&r, mention));
  resp_free(&r);
}

static void t_lookup_limits(void **state) {
  (void)state;
  char *ok = many_keys(KC_LOOKUP_MAX);
  lookup_expect(ok, 200, NULL, NULL);
  free(ok);
  char *over = many_keys(KC_LOOKUP_MAX + 1);
  lookup_expect(over, 400, "bad_request", "4096");
  free(over);
  lookup_expect("{\"keys\":\"abc\"}", 400, "bad_request", "keys");
  lookup_expect("{\"keys\":[1]}", 400, "bad_key", "keys[0]");
  lookup_expect("{\"keys\":[\"ABC\"]}", 400, "bad_key", "keys[0]");
  lookup_expect("{\"keys\":[],\"extra\":1}", 400, "bad_request", "extra");
  lookup_expect("{\"keys\":[", 400, "bad_json", NULL);
  lookup_expect("", 400, "bad_json", NULL);
  lookup_expect("[1,2]", 400, "bad_request", NULL);
  lookup_expect("{}", 400, "bad_request", "keys");
}

static void t_models(void **state) {
  (void)state;
  char k1[65], k2[65], k3[65], path[128];
  free(store_bundle(&S, NULL, MODEL_B, 8, 31, k1));
  free(store_bundle(&S, NULL, MODEL_B, 16, 32, k2));
  free(store_bundle(&S, NULL, MODEL_A, 8, 33, k3));
  snprintf(path, sizeof path, "/v1/models/%s", MODEL_B);
  resp r = http(&S, path, (req){0});
  assert_int_equal(r.status, 200);
  json_t *j = body_json(&r);
  json_t *list = json_object_get(j, "bundles");
  assert_int_equal(json_array_size(list), 2);
  size_t i;
  json_t *e;
  json_array_foreach(list, i, e) {
    const char *k = json_string_value(json_object_get(e, "key"));
    assert_true(strcmp(k, k1) == 0 || strcmp(k, k2) == 0);
    assert_true(json_is_object(json_object_get(e, "bucket")));
    assert_string_equal(json_string_value(json_object_get(e, "arch")),
                        "sm_90a");
    assert_true(json_is_object(json_object_get(e, "toolchain")));
    assert_true(json_integer_value(json_object_get(e, "bytes")) > 3000);
    assert_true(json_is_integer(json_object_get(e, "created")));
    assert_true(json_is_integer(json_object_get(e, "hits")));
  }
  json_decref(j);
  resp_free(&r);
  snprintf(path, sizeof path, "/v1/models/%s", "dddd");
  r = http(&S, path, (req){0});
  assert_error(&r, 400, "bad_key");
  resp_free(&r);
}

int main(void) {
  const struct CMUnitTest api[] = {
      cmocka_unit_test(t_bundle_roundtrip),
      cmocka_unit_test(t_bundle_conflict),
      cmocka_unit_test(t_bundle_missing_blobs),
      cmocka_unit_test(t_bundle_key_mismatch),
      cmocka_unit_test(t_bundle_bad_manifests),
      cmocka_unit_test(t_bundle_bad_key),
      cmocka_unit_test(t_json_too_large),
      cmocka_unit_test(t_lookup),
      cmocka_unit_test(t_lookup_limits),
      cmocka_unit_test(t_models),
  };
  servertest_init();
  int fails = 0;
  fails += cmocka_run_group_tests_name("api", api, open_setup, open_teardown);
  curl_global_cleanup();
  return fails ? 1 : 0;
}
