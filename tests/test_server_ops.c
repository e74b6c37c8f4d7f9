/* test_server_ops.c: kcached integration tests (the real binary on a free
 * loopback port, spoken to with libcurl) of operations: health, unknown routes
 * and wrong methods, stats, metrics, keep-alive, the access log, restart and
 * crash keep data, /readyz before the store opens, an unopenable store, flags,
 * the JSON log, graceful stop, idle timeouts, environment variables. Helpers
 * and the shared open server: servertest.h. */
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "servertest.h"

static void t_health(void **state) {
  (void)state;
  resp r = http(&S, "/healthz", (req){0});
  assert_int_equal(r.status, 200);
  json_t *j = body_json(&r);
  assert_string_equal(json_string_value(json_object_get(j, "status")), "ok");
  json_decref(j);
  resp_free(&r);
  r = http(&S, "/readyz", (req){0});
  assert_int_equal(r.status, 200);
  resp_free(&r);
  r = http(&S, "/healthz", (req){.method = "HEAD"});
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, 0);
  resp_free(&r);
}

static void t_unknown_routes(void **state) {
  (void)state;
  /* "/" is the page (test_server_models.c) */
  const char *paths[] = {"/index.html", "/nope",     "/v1",
                         "/v1/blob/x",  "/healthz/", "/v2/blobs/x",
                         "/v1/stats/x", "/V1/lookup"};
  for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
    resp r = http(&S, paths[i], (req){0});
    assert_error(&r, 404, "not_found");
    resp_free(&r);
  }
}

static void t_wrong_methods(void **state) {
  (void)state;
  char d[65];
  sha_hex("x", 1, d);
  char blob[128], bundle[128], model[128], lease[128];
  snprintf(blob, sizeof blob, "/v1/blobs/%s", d);
  snprintf(bundle, sizeof bundle, "/v1/bundles/%s", d);
  snprintf(model, sizeof model, "/v1/models/%s", d);
  snprintf(lease, sizeof lease, "/v1/leases/%s", d);
  struct {
    const char *method, *path, *allow;
  } cases[] = {
      {"DELETE", "/healthz", "GET, HEAD"},
      {"POST", "/readyz", "GET, HEAD"},
      {"PUT", "/metrics", "GET, HEAD"},
      {"DELETE", "/v1/stats", "GET, HEAD"},
      {"POST", blob, "GET, HEAD, PUT"},
      {"DELETE", blob, "GET, HEAD, PUT"},
      {"POST", bundle, "GET, HEAD, PUT, DELETE"},
      {"GET", "/v1/lookup", "POST"},
      {"PUT", "/v1/lookup", "POST"},
      {"PUT", model, "GET, HEAD, DELETE"},
      {"GET", lease, "POST, DELETE"},
      {"PATCH", lease, "POST, DELETE"},
      {"OPTIONS", "/healthz", "GET, HEAD"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    resp r = http(&S, cases[i].path, (req){.method = cases[i].method});
    assert_error(&r, 405, "method_not_allowed");
    char allow[128] = "";
    assert_true(header(&r, "Allow", allow, sizeof allow));
    assert_string_equal(allow, cases[i].allow);
    resp_free(&r);
  }
}

static void t_stats(void **state) {
  (void)state;
  char key[65];
  free(store_bundle(&S, NULL, MODEL_A, 50, 51, key)); /* blobs > 0 below */
  resp r = http(&S, "/v1/stats", (req){0});
  assert_int_equal(r.status, 200);
  json_t *j = body_json(&r);
  const char *fields[] = {"bytes_used",      "max_bytes",    "blobs",
                          "bundles",         "hits",         "misses",
                          "evicted_bundles", "evicted_blobs"};
  for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
    assert_true(json_is_integer(json_object_get(j, fields[i])));
  assert_true(json_integer_value(json_object_get(j, "blobs")) > 0);
  /* the RESP reads per key family: only with --resp-listen */
  assert_null(json_object_get(j, "resp_families"));
  json_decref(j);
  resp_free(&r);
}

static void t_metrics(void **state) {
  (void)state;
  resp r = http(&S, "/metrics", (req){0});
  assert_int_equal(r.status, 200);
  char ct[128];
  assert_true(header(&r, "Content-Type", ct, sizeof ct));
  assert_non_null(strstr(ct, "text/plain"));
  const char *want[] = {
      "kcached_requests_total{route=\"blobs\",method=\"GET\",status=\"200\"}",
      "kcached_requests_total{route=\"other\",method=\"GET\",status=\"404\"}",
      "kcached_request_duration_seconds_bucket{le=\"+Inf\"}",
      "kcached_request_duration_seconds_count",
      "kcached_received_bytes_total",
      "kcached_sent_bytes_total",
      "kcached_hits_total",
      "kcached_misses_total",
      "kcached_store_bytes",
      "kcached_store_limit_bytes",
      "kcached_evicted_bundles_total",
      "kcached_leases_granted_total",
      "kcached_leases_refused_total",
      "# TYPE kcached_request_duration_seconds histogram"};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    if (!strstr(r.body, want[i]))
      fprintf(stderr, "missing metric %s\n", want[i]);
    assert_non_null(strstr(r.body, want[i]));
  }
  resp_free(&r);
}

static void t_keepalive(void **state) {
  (void)state;
  CURL *c = curl_easy_init();
  char data[4096], d[65], path[128], fresh[65];
  fill_random(data, sizeof data, 50);
  assert_true(put_blob(&S, NULL, data, sizeof data, d) / 100 == 2);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  for (int i = 0; i < 60; i++) {
    resp r;
    long want = 200;
    switch (i % 6) {
    case 0:
      r = http_on(c, S.url, path, (req){0});
      break;
    case 1:
      r = http_on(c, S.url, path, (req){.method = "HEAD"});
      break;
    case 2:
      r = http_on(c, S.url, "/healthz", (req){0});
      break;
    case 3:
      r = http_on(c, S.url, "/nope", (req){0});
      want = 404;
      break;
    case 4:
      r = http_on(c, S.url, "/healthz", (req){.method = "DELETE"});
      want = 405;
      break;
    default: {
      char blob[64], p2[128];
      snprintf(blob, sizeof blob, "keepalive blob %d", i);
      sha_hex(blob, strlen(blob), fresh);
      snprintf(p2, sizeof p2, "/v1/blobs/%s", fresh);
      r = http_on(c, S.url, p2,
                  (req){.method = "PUT", .body = blob, .len = strlen(blob)});
      want = 201;
    }
    }
    assert_int_equal(r.rc, CURLE_OK);
    assert_int_equal(r.status, want);
    if (i > 0) {
      if (r.connects != 0)
        fprintf(stderr, "request %d opened a new connection\n", i);
      assert_int_equal(r.connects, 0);
    }
    resp_free(&r);
  }
  curl_easy_cleanup(c);
}

/* Access lines are buffered up to a second (server/log.c): waits for them. */
static void t_access_log(void **state) {
  (void)state;
  char *log = kc_testsrv_slurp(S.log);
  for (int i = 0; i < 50 && !strstr(log, " GET /healthz 200 "); i++) {
    free(log);
    kc_testsrv_sleep_ms(100);
    log = kc_testsrv_slurp(S.log);
  }
  assert_non_null(strstr(log, " GET /healthz 200 "));
  assert_non_null(strstr(log, "us="));
  assert_non_null(strstr(log, "no token file"));
  free(log);
}

static void t_restart_keeps_data(void **state) {
  (void)state;
  kc_testsrv t = {0};
  assert_int_equal(kc_testsrv_start(&t, NULL), 0);
  char blob[10000], d[65], key[65];
  fill_random(blob, sizeof blob, 60);
  assert_int_equal(put_blob(&t, NULL, blob, sizeof blob, d), 201);
  char *json = store_bundle(&t, NULL, MODEL_A, 60, 61, key);
  assert_int_equal(kc_testsrv_stop(&t), 0); /* graceful: exit 0 */
  assert_int_equal(kc_testsrv_restart(&t), 0);
  check_kept(&t, d, blob, sizeof blob, key, json);
  kc_testsrv_kill(&t); /* a crash loses nothing committed either */
  assert_int_equal(kc_testsrv_restart(&t), 0);
  check_kept(&t, d, blob, sizeof blob, key, json);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
  free(json);
}

static void t_readyz_not_open(void **state) {
  (void)state;
  kc_testsrv t;
  assert_int_equal(kc_testsrv_init(&t), 0);
  char file[512];
  snprintf(file, sizeof file, "%s/not-a-dir", t.dir);
  FILE *f = fopen(file, "w");
  fputs("x", f);
  fclose(f);
  const char *const args[] = {"--data-dir", file, "--store-wait", "60", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  resp r = http(&t, "/healthz", (req){0});
  assert_int_equal(r.status, 200);
  resp_free(&r);
  r = http(&t, "/readyz", (req){0});
  assert_error(&r, 503, "not_ready");
  resp_free(&r);
  char d[65], path[128];
  sha_hex("x", 1, d);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  r = http(&t, path, (req){0});
  assert_error(&r, 503, "not_ready");
  resp_free(&r);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

/* Without --store-wait, a data directory that cannot hold a store stops
 * kcached at once: exit 3 and a message naming the path. */
static void t_store_unopenable_exits(void **state) {
  (void)state;
  static char out[4096];
  char dir[] = "/tmp/kcd-unopenable-XXXXXX", args[512];
  assert_non_null(mkdtemp(dir));
  char file[300];
  snprintf(file, sizeof file, "%s/not-a-dir", dir);
  FILE *f = fopen(file, "w");
  assert_non_null(f);
  fclose(f);
  snprintf(args, sizeof args, "--listen 127.0.0.1:0 --data-dir %s", file);
  assert_int_equal(run_kcached(args, out, sizeof out), 3);
  assert_non_null(strstr(out, file));
  unlink(file);
  rmdir(dir);
}

static void t_flags(void **state) {
  (void)state;
  static char out[16384];
  assert_int_equal(run_kcached("--help", out, sizeof out), 0);
  const char *flags[] = {
      "--listen",         "--port-file",       "--data-dir",
      "--max-bytes",      "--max-blob-bytes",  "--tokens",
      "--threads",        "--log-format",      "--tls-cert",
      "--tls-key",        "--allow-plaintext", "KCACHED_LISTEN",
      "KCACHED_DATA_DIR", "KCACHED_THREADS",   "token ROLE",
      "--scrub-rate",     "KCACHED_SCRUB_RATE"};
  for (size_t i = 0; i < sizeof flags / sizeof *flags; i++)
    assert_non_null(strstr(out, flags[i]));
  const char *bad[] = {"--bogus",
                       "--threads 0",
                       "--threads x",
                       "--log-format xml",
                       "--listen nocolon",
                       "--max-bytes 12Q",
                       "--listen 127.0.0.1:99999",
                       "--scrub-rate 2T",
                       "--scrub-rate -1",
                       "stray-argument",
                       "--tokens /nonexistent/tokens "
                       "--listen 127.0.0.1:0"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    int rc = run_kcached(bad[i], out, sizeof out);
    if (rc != 2)
      fprintf(stderr, "kcached %s: exit %d\n", bad[i], rc);
    assert_int_equal(rc, 2);
    assert_true(strlen(out) > 0);
  }
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "KCACHED_LOG_FORMAT=yaml %s --help 2>&1",
           kc_testsrv_bin());
  assert_int_equal(run_sh(cmd, out, sizeof out), 2);
  assert_non_null(strstr(out, "KCACHED_LOG_FORMAT"));
  /* refusals */
  assert_int_equal(run_kcached("--listen 0.0.0.0:0", out, sizeof out), 2);
  assert_non_null(strstr(out, "refusing"));
}

static void t_json_log(void **state) {
  (void)state;
  kc_testsrv t = {0};
  const char *const args[] = {"--log-format", "json", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  resp r = http(&t, "/nope%0A%22injected", (req){0});
  resp_free(&r);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  char *log = kc_testsrv_slurp(t.log), *save = NULL;
  int access = 0;
  for (char *line = strtok_r(log, "\n", &save); line;
       line = strtok_r(NULL, "\n", &save)) {
    if (strncmp(line, "==", 2) == 0)
      continue; /* a sanitizer's own report is not ours */
    json_t *j = json_loads(line, 0, NULL);
    if (!j)
      fprintf(stderr, "not JSON: %s\n", line);
    assert_non_null(j);
    assert_non_null(json_object_get(j, "ts"));
    if (strcmp(json_string_value(json_object_get(j, "level")), "access") == 0) {
      access++;
      assert_true(json_is_integer(json_object_get(j, "status")));
      assert_true(json_is_integer(json_object_get(j, "us")));
      assert_non_null(json_object_get(j, "token"));
      assert_non_null(json_object_get(j, "method"));
    }
    json_decref(j);
  }
  assert_true(access >= 2);
  free(log);
  kc_testsrv_cleanup(&t);
}

/* SIGTERM while an upload is half sent: it still completes. */
static void t_graceful_stop(void **state) {
  (void)state;
  kc_testsrv t = {0};
  assert_int_equal(kc_testsrv_start(&t, NULL), 0);
  size_t n = 200000;
  char *blob = malloc(n), d[65], head[512], reply[4096];
  fill_random(blob, n, 80);
  sha_hex(blob, n, d);
  int fd = raw_connect(t.port);
  int h = snprintf(head, sizeof head,
                   "PUT /v1/blobs/%s HTTP/1.1\r\nHost: localhost\r\n"
                   "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                   d, n);
  raw_send(fd, head, (size_t)h);
  raw_send(fd, blob, n / 2);
  kc_testsrv_sleep_ms(200);
  kill(t.pid, SIGTERM);
  kc_testsrv_sleep_ms(300);
  raw_send(fd, blob + n / 2, n - n / 2);
  raw_recv_all(fd, reply, sizeof reply);
  close(fd);
  assert_non_null(strstr(reply, "HTTP/1.1 201"));
  int waited = 0, rc = -1, st;
  while (waited < 30000 && waitpid(t.pid, &st, WNOHANG) == 0) {
    kc_testsrv_sleep_ms(20);
    waited += 20;
  }
  rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  t.pid = 0;
  assert_int_equal(rc, 0);
  /* new connections are refused once it stops listening */
  assert_int_equal(kc_testsrv_restart(&t), 0);
  char path[128];
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(&t, path, (req){0});
  assert_int_equal(r.status, 200);
  resp_free(&r);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
  free(blob);
}

/* A client that sends half a request and stalls is cut off. */
static void t_idle_timeout(void **state) {
  (void)state;
  kc_testsrv t = {0};
  const char *const args[] = {"--timeout", "1", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  int fd = raw_connect(t.port);
  raw_send(fd, "GET /healthz HTTP/1.1\r\nHo", 26);
  char buf[256];
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  ssize_t n = recv(fd, buf, sizeof buf, 0); /* blocks until closed */
  clock_gettime(CLOCK_MONOTONIC, &b);
  close(fd);
  assert_true(n <= 0);
  double waited = (double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
  assert_true(waited >= 0.5 && waited < 10);
  resp r = http(&t, "/healthz", (req){0}); /* others are still served */
  assert_int_equal(r.status, 200);
  resp_free(&r);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

/* Every flag has a KCACHED_* variable; flags win over them. */
static void t_env_vars(void **state) {
  (void)state;
  kc_testsrv t = {0};
  setenv("KCACHED_MAX_BLOB_BYTES", "2K", 1);
  setenv("KCACHED_LOG_FORMAT", "json", 1);
  const char *const args[] = {"--log-format", "text", NULL};
  int rc = kc_testsrv_start(&t, args);
  unsetenv("KCACHED_MAX_BLOB_BYTES");
  unsetenv("KCACHED_LOG_FORMAT");
  assert_int_equal(rc, 0);
  char blob[3000], d[65];
  fill_random(blob, sizeof blob, 90);
  assert_int_equal(put_blob(&t, NULL, blob, sizeof blob, d), 413);
  assert_int_equal(put_blob(&t, NULL, blob, 2000, d), 201);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  char *log = kc_testsrv_slurp(t.log);
  assert_non_null(strstr(log, " info listening on ")); /* text, not JSON */
  free(log);
  kc_testsrv_cleanup(&t);
}

int main(void) {
  const struct CMUnitTest api[] = {
      cmocka_unit_test(t_health),        cmocka_unit_test(t_unknown_routes),
      cmocka_unit_test(t_wrong_methods), cmocka_unit_test(t_stats),
      cmocka_unit_test(t_keepalive),     cmocka_unit_test(t_metrics),
      cmocka_unit_test(t_access_log),
  };
  const struct CMUnitTest own[] = {
      cmocka_unit_test(t_restart_keeps_data),
      cmocka_unit_test(t_readyz_not_open),
      cmocka_unit_test(t_store_unopenable_exits),
      cmocka_unit_test(t_flags),
      cmocka_unit_test(t_json_log),
      cmocka_unit_test(t_graceful_stop),
      cmocka_unit_test(t_idle_timeout),
      cmocka_unit_test(t_env_vars),
  };
  servertest_init();
  int fails = 0;
  fails += cmocka_run_group_tests_name("api", api, open_setup, open_teardown);
  fails += cmocka_run_group_tests_name("own servers", own, NULL, NULL);
  curl_global_cleanup();
  return fails ? 1 : 0;
}
