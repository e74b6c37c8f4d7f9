/* test_server_lease.c: kcached integration tests (the real binary on a free
 * loopback port, spoken to with libcurl) of leases: take, refuse with
 * Retry-After, release, defaults, expiry, bad input. Helpers and the shared
 * open server: servertest.h. */
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include "servertest.h"

static resp lease_post(CURL *c, const char *key, const char *body) {
  char path[128];
  snprintf(path, sizeof path, "/v1/leases/%s", key);
  return http_on(c, S.url, path,
                 (req){.method = "POST",
                       .body = body,
                       .len = body ? strlen(body) : 0,
                       .has_body = 1,
                       .header = "Content-Type: application/json"});
}

static resp lease_delete(CURL *c, const char *key, const char *token) {
  char path[256];
  snprintf(path, sizeof path, "/v1/leases/%s?lease=%s", key, token);
  return http_on(c, S.url, path, (req){.method = "DELETE"});
}

static void t_leases(void **state) {
  (void)state;
  CURL *a = curl_easy_init(), *b = curl_easy_init();
  char key[65], token[128], v[64];
  char *json = store_bundle(&S, NULL, MODEL_A, 40, 41, key);
  char path[128];
  snprintf(path, sizeof path, "/v1/bundles/%s", key);
  resp r = http(&S, path, (req){.method = "DELETE"}); /* absent again */
  resp_free(&r);
  r = lease_post(a, key, "{\"holder\":\"replica-a\",\"ttl_s\":60}");
  assert_int_equal(r.status, 201);
  json_t *j = body_json(&r);
  snprintf(token, sizeof token, "%s",
           json_string_value(json_object_get(j, "lease")));
  assert_true(strlen(token) >= 16);
  assert_int_equal(json_integer_value(json_object_get(j, "expires_s")), 60);
  json_decref(j);
  resp_free(&r);
  r = lease_post(b, key, "{\"holder\":\"replica-b\",\"ttl_s\":60}");
  assert_error(&r, 409, "leased");
  j = body_json(&r);
  assert_string_equal(json_string_value(json_object_get(j, "holder")),
                      "replica-a");
  json_decref(j);
  assert_true(header(&r, "Retry-After", v, sizeof v));
  assert_true(atoi(v) >= 1 && atoi(v) <= 60);
  resp_free(&r);
  r = lease_delete(b, key, "0123456789abcdef0123456789abcdef");
  assert_error(&r, 403, "forbidden");
  resp_free(&r);
  r = lease_delete(a, key, token);
  assert_int_equal(r.status, 204);
  resp_free(&r);
  r = lease_delete(a, key, token);
  assert_error(&r, 404, "not_found");
  resp_free(&r);
  r = lease_post(b, key, NULL); /* defaults: holder, 300 s */
  assert_int_equal(r.status, 201);
  resp_free(&r);
  r = http(&S, path, (req){.method = "PUT", .body = json, .len = strlen(json)});
  assert_int_equal(r.status, 201);
  resp_free(&r);
  r = lease_post(a, key, "{\"holder\":\"replica-a\"}");
  assert_int_equal(r.status, 200);
  j = body_json(&r);
  assert_string_equal(json_string_value(json_object_get(j, "status")),
                      "present");
  json_decref(j);
  resp_free(&r);
  free(json);
  curl_easy_cleanup(a);
  curl_easy_cleanup(b);
}

static void t_lease_ttl(void **state) {
  (void)state;
  char key[65];
  sha_hex("short lease", 11, key);
  resp r = lease_post(NULL, key, "{\"holder\":\"a\",\"ttl_s\":1}");
  assert_int_equal(r.status, 201);
  resp_free(&r);
  r = lease_post(NULL, key, "{\"holder\":\"b\",\"ttl_s\":1}");
  assert_int_equal(r.status, 409);
  resp_free(&r);
  kc_testsrv_sleep_ms(1300);
  r = lease_post(NULL, key, "{\"holder\":\"b\",\"ttl_s\":1}");
  assert_int_equal(r.status, 201);
  resp_free(&r);
}

static void t_lease_bad(void **state) {
  (void)state;
  char key[65];
  sha_hex("bad lease", 9, key);
  const char *bodies[] = {"{\"holder\":\"a\",\"x\":1}",
                          "{\"ttl_s\":\"x\"}",
                          "{\"ttl_s\":0}",
                          "{\"ttl_s\":99999999}",
                          "{\"holder\":5}",
                          "{\"holder\":\"\"}",
                          "{\"holder\":",
                          "[]"};
  for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) {
    resp r = lease_post(NULL, key, bodies[i]);
    assert_int_equal(r.status, 400);
    resp_free(&r);
  }
  resp r = lease_post(NULL, "ABC", "{}");
  assert_error(&r, 400, "bad_key");
  resp_free(&r);
  char path[128];
  snprintf(path, sizeof path, "/v1/leases/%s", key);
  r = http(&S, path, (req){.method = "DELETE"});
  assert_error(&r, 400, "bad_request");
  resp_free(&r);
}

int main(void) {
  const struct CMUnitTest api[] = {
      cmocka_unit_test(t_leases),
      cmocka_unit_test(t_lease_ttl),
      cmocka_unit_test(t_lease_bad),
  };
  servertest_init();
  int fails = 0;
  fails += cmocka_run_group_tests_name("api", api, open_setup, open_teardown);
  curl_global_cleanup();
  return fails ? 1 : 0;
}
