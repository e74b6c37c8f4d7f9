/* test_server_auth.c: kcached integration tests (the real binary on a free
 * loopback port, spoken to with libcurl) of auth and TLS: the route x role
 * matrix, tokens never logged, the metrics role, a SIGHUP token reload, TLS
 * with a client CA, plaintext refused with tokens on a public address,
 * `kcached token`. Helpers and the shared open server: servertest.h. */
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "servertest.h"

typedef struct toks {
  char read[80], write[80], admin[80];
} toks;

static kc_testsrv A;
static toks T;
static char token_file[512];

static int auth_setup(void **state) {
  (void)state;
  if (kc_testsrv_init(&A))
    return -1;
  snprintf(token_file, sizeof token_file, "%s/tokens", A.dir);
  FILE *f = fopen(token_file, "w");
  fputs("# kcache tokens\n\n", f);
  fclose(f);
  new_token("read", "reader", token_file, T.read, sizeof T.read);
  new_token("write", "ci-writer", token_file, T.write, sizeof T.write);
  new_token("admin", "ops", token_file, T.admin, sizeof T.admin);
  const char *const args[] = {"--tokens", token_file, NULL};
  return kc_testsrv_start(&A, args);
}

static int auth_teardown(void **state) {
  (void)state;
  int rc = kc_testsrv_stop(&A);
  kc_testsrv_cleanup(&A);
  return rc == 0 ? 0 : -1;
}

typedef struct route_case {
  const char *method;
  char path[160];
  const char *body;
  int need; /* 0 none, 1 read, 2 write, 3 admin */
} route_case;

static size_t route_cases(route_case *c, const char *d, const char *key) {
  size_t n = 0;
  c[n++] = (route_case){"GET", "/healthz", NULL, 0};
  c[n++] = (route_case){"GET", "/readyz", NULL, 0};
  c[n++] = (route_case){"GET", "/metrics", NULL, 0};
  c[n++] = (route_case){"GET", "/v1/stats", NULL, 1};
  c[n] = (route_case){"GET", "", NULL, 1};
  snprintf(c[n++].path, sizeof c->path, "/v1/blobs/%s", d);
  c[n] = (route_case){"HEAD", "", NULL, 1};
  snprintf(c[n++].path, sizeof c->path, "/v1/blobs/%s", d);
  c[n] = (route_case){"PUT", "", "x", 2};
  snprintf(c[n++].path, sizeof c->path, "/v1/blobs/%s", d);
  c[n] = (route_case){"GET", "", NULL, 1};
  snprintf(c[n++].path, sizeof c->path, "/v1/bundles/%s", key);
  c[n] = (route_case){"PUT", "", "{}", 2};
  snprintf(c[n++].path, sizeof c->path, "/v1/bundles/%s", key);
  c[n] = (route_case){"DELETE", "", NULL, 3};
  snprintf(c[n++].path, sizeof c->path, "/v1/bundles/%s", key);
  c[n++] = (route_case){"POST", "/v1/lookup", "{\"keys\":[]}", 1};
  c[n] = (route_case){"GET", "", NULL, 1};
  snprintf(c[n++].path, sizeof c->path, "/v1/models/%s", MODEL_A);
  c[n] = (route_case){"POST", "", "{\"holder\":\"x\",\"ttl_s\":1}", 2};
  snprintf(c[n++].path, sizeof c->path, "/v1/leases/%s", key);
  /* another key: no lease there, so a permitted DELETE answers 404 */
  c[n] = (route_case){"DELETE", "", NULL, 2};
  snprintf(c[n++].path, sizeof c->path,
           "/v1/leases/%s?lease=00000000000000000000000000000000", d);
  return n;
}

static void t_auth_matrix(void **state) {
  (void)state;
  char d[65], key[65];
  sha_hex("x", 1, d);
  sha_hex("some key", 8, key);
  route_case cases[32];
  size_t n = route_cases(cases, d, key);
  const char *tokens[4] = {NULL, T.read, T.write, T.admin};
  for (size_t i = 0; i < n; i++) {
    for (int role = 0; role < 4; role++) {
      route_case *c = &cases[i];
      resp r = http(&A, c->path,
                    (req){.method = c->method,
                          .token = tokens[role],
                          .body = c->body,
                          .len = c->body ? strlen(c->body) : 0});
      long want = c->need == 0 || role >= c->need ? 0 : role == 0 ? 401 : 403;
      if ((want && r.status != want) ||
          (!want && (r.status == 401 || r.status == 403)))
        fprintf(stderr, "%s %s as role %d: got %ld\n", c->method, c->path, role,
                r.status);
      if (want)
        assert_int_equal(r.status, want);
      else
        assert_true(r.status != 401 && r.status != 403);
      if (r.status == 401) {
        char v[128];
        assert_true(header(&r, "WWW-Authenticate", v, sizeof v));
      }
      if (want && strcmp(c->method, "HEAD") != 0)
        assert_error(&r, want, want == 401 ? "unauthorized" : "forbidden");
      resp_free(&r);
    }
    /* a token nobody issued, and a header that is not Bearer */
    if (cases[i].need) {
      resp r = http(&A, cases[i].path,
                    (req){.method = cases[i].method, .token = "kc_forged"});
      assert_int_equal(r.status, 401);
      resp_free(&r);
      r = http(&A, cases[i].path,
               (req){.method = cases[i].method, .auth = "Basic dXNlcjpwYXNz"});
      assert_int_equal(r.status, 401);
      resp_free(&r);
    }
  }
}

static void t_auth_tokens_not_logged(void **state) {
  (void)state;
  char d[65];
  assert_int_equal(put_blob(&A, T.write, "logged?", 7, d), 201);
  /* Access lines reach the log within a second (buffered). */
  char *log = kc_testsrv_slurp(A.log);
  for (int i = 0; i < 40 && !strstr(log, d); i++) {
    free(log);
    kc_testsrv_sleep_ms(100);
    log = kc_testsrv_slurp(A.log);
  }
  assert_non_null(strstr(log, d));
  assert_null(strstr(log, T.read));
  assert_null(strstr(log, T.write));
  assert_null(strstr(log, T.admin));
  assert_non_null(strstr(log, "token=ci-writer"));
  free(log);
}

/* ---- servers of their own ---- */

static void t_metrics_role(void **state) {
  (void)state;
  kc_testsrv t;
  assert_int_equal(kc_testsrv_init(&t), 0);
  char file[512], tok[80];
  snprintf(file, sizeof file, "%s/tokens", t.dir);
  new_token("read", "prom", file, tok, sizeof tok);
  const char *const args[] = {"--tokens", file, "--metrics-role", "read", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  resp r = http(&t, "/metrics", (req){0});
  assert_int_equal(r.status, 401);
  resp_free(&r);
  r = http(&t, "/metrics", (req){.token = tok});
  assert_int_equal(r.status, 200);
  resp_free(&r);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

static long status_with(const kc_testsrv *t, const char *token) {
  resp r = http(t, "/v1/stats", (req){.token = token});
  resp_free(&r);
  return r.status;
}

static long wait_status(const kc_testsrv *t, const char *token, long want) {
  long st = 0;
  for (int i = 0; i < 250 && st != want; i++) {
    st = status_with(t, token);
    if (st != want)
      kc_testsrv_sleep_ms(20);
  }
  return st;
}

static void t_sighup_reload(void **state) {
  (void)state;
  kc_testsrv t;
  assert_int_equal(kc_testsrv_init(&t), 0);
  char file[512], first[80], second[80], side[512];
  snprintf(file, sizeof file, "%s/tokens", t.dir);
  snprintf(side, sizeof side, "%s/side", t.dir);
  new_token("read", "first", file, first, sizeof first);
  new_token("read", "second", side, second, sizeof second);
  const char *const args[] = {"--tokens", file, NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  assert_int_equal(status_with(&t, first), 200);
  assert_int_equal(status_with(&t, second), 401);
  /* add the second token */
  char *line = kc_testsrv_slurp(side);
  FILE *f = fopen(file, "a");
  fputs(line, f);
  fclose(f);
  kill(t.pid, SIGHUP);
  assert_int_equal(wait_status(&t, second, 200), 200);
  /* drop the first */
  f = fopen(file, "w");
  fputs(line, f);
  fclose(f);
  free(line);
  kill(t.pid, SIGHUP);
  assert_int_equal(wait_status(&t, first, 401), 401);
  assert_int_equal(status_with(&t, second), 200);
  /* a broken file keeps the tokens there were */
  f = fopen(file, "w");
  fputs("this is not a token line\n", f);
  fclose(f);
  kill(t.pid, SIGHUP);
  kc_testsrv_sleep_ms(300);
  assert_int_equal(status_with(&t, second), 200);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  char *log = kc_testsrv_slurp(t.log);
  assert_non_null(strstr(log, "keeping the old tokens"));
  free(log);
  kc_testsrv_cleanup(&t);
}

static int make_certs(const char *dir) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "cd '%s' && ( "
           "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "
           "'/CN=kcache test CA' -keyout ca.key -out ca.crt && "
           "openssl req -newkey rsa:2048 -nodes -subj '/CN=127.0.0.1' "
           "-keyout srv.key -out srv.csr && "
           "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > ext.cnf && "
           "openssl x509 -req -in srv.csr -CA ca.crt -CAkey ca.key "
           "-CAcreateserial -days 2 -extfile ext.cnf -out srv.crt ) 2>&1",
           dir);
  return run_sh(cmd, NULL, 0);
}

static void t_tls(void **state) {
  (void)state;
  kc_testsrv t;
  assert_int_equal(kc_testsrv_init(&t), 0);
  assert_int_equal(make_certs(t.dir), 0);
  char cert[512], key[512], ca[512], file[512], tok[80];
  snprintf(cert, sizeof cert, "%s/srv.crt", t.dir);
  snprintf(key, sizeof key, "%s/srv.key", t.dir);
  snprintf(ca, sizeof ca, "%s/ca.crt", t.dir);
  snprintf(file, sizeof file, "%s/tokens", t.dir);
  new_token("write", "tls-client", file, tok, sizeof tok);
  const char *const args[] = {"--tls-cert", cert, "--tls-key", key,
                              "--tokens",   file, NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  assert_int_equal(strncmp(t.url, "https://", 8), 0);
  resp r = http(&t, "/healthz", (req){.cainfo = ca});
  assert_int_equal(r.rc, CURLE_OK);
  assert_int_equal(r.status, 200);
  resp_free(&r);
  char blob[3000], d[65], path[128];
  fill_random(blob, sizeof blob, 70);
  sha_hex(blob, sizeof blob, d);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  r = http(&t, path,
           (req){.method = "PUT",
                 .token = tok,
                 .body = blob,
                 .len = sizeof blob,
                 .cainfo = ca});
  assert_int_equal(r.status, 201);
  resp_free(&r);
  r = http(&t, path, (req){.token = tok, .cainfo = ca});
  assert_int_equal(r.status, 200);
  assert_memory_equal(r.body, blob, sizeof blob);
  resp_free(&r);
  /* without the CA the certificate does not verify */
  r = http(&t, "/healthz", (req){.cainfo = "/nonexistent-ca.crt"});
  assert_int_not_equal(r.rc, CURLE_OK);
  resp_free(&r);
  /* plain HTTP to the TLS port gets no answer */
  char plain[96];
  snprintf(plain, sizeof plain, "http://127.0.0.1:%d", t.port);
  r = http_on(NULL, plain, "/healthz", (req){0});
  assert_true(r.rc != CURLE_OK || r.status != 200);
  resp_free(&r);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

static void t_refuse_plaintext(void **state) {
  (void)state;
  char dir[] = "/tmp/kcache-flags-XXXXXX", file[128], tok[80], args[512];
  static char out[4096];
  assert_non_null(mkdtemp(dir));
  snprintf(file, sizeof file, "%s/tokens", dir);
  new_token("read", "x", file, tok, sizeof tok);
  snprintf(args, sizeof args, "--listen 0.0.0.0:0 --tokens %s", file);
  assert_int_equal(run_kcached(args, out, sizeof out), 2);
  assert_non_null(strstr(out, "--allow-plaintext"));
  snprintf(args, sizeof args, "--listen [::]:0 --tokens %s", file);
  assert_int_equal(run_kcached(args, out, sizeof out), 2);
  snprintf(args, sizeof args, "--listen 127.0.0.1:0 --tls-cert %s", file);
  assert_int_equal(run_kcached(args, out, sizeof out), 2);
  unlink(file);
  rmdir(dir);
}

static void t_token_command(void **state) {
  (void)state;
  char cmd[1024], out[1024];
  snprintf(cmd, sizeof cmd, "%s token write ci-7 2>/dev/null",
           kc_testsrv_bin());
  assert_int_equal(run_sh(cmd, out, sizeof out), 0);
  char token[128], role[16], name[64], hex[80];
  assert_int_equal(sscanf(out, "%127s %15s %63s %79s", token, role, name, hex),
                   4);
  assert_string_equal(role, "write");
  assert_string_equal(name, "ci-7");
  char want[65];
  sha_hex(token, strlen(token), want);
  assert_string_equal(hex, want);
  char again[1024];
  assert_int_equal(run_sh(cmd, again, sizeof again), 0);
  assert_string_not_equal(out, again); /* random */
  snprintf(cmd, sizeof cmd, "%s token root x 2>&1", kc_testsrv_bin());
  assert_int_equal(run_sh(cmd, out, sizeof out), 2);
  snprintf(cmd, sizeof cmd, "%s token read 'bad name' 2>&1", kc_testsrv_bin());
  assert_int_equal(run_sh(cmd, out, sizeof out), 2);
}

int main(void) {
  const struct CMUnitTest auth[] = {
      cmocka_unit_test(t_auth_matrix),
      cmocka_unit_test(t_auth_tokens_not_logged),
  };
  const struct CMUnitTest own[] = {
      cmocka_unit_test(t_metrics_role),  cmocka_unit_test(t_sighup_reload),
      cmocka_unit_test(t_tls),           cmocka_unit_test(t_refuse_plaintext),
      cmocka_unit_test(t_token_command),
  };
  servertest_init();
  int fails = 0;
  fails += cmocka_run_group_tests_name("auth", auth, auth_setup, auth_teardown);
  fails += cmocka_run_group_tests_name("own servers", own, NULL, NULL);
  curl_global_cleanup();
  return fails ? 1 : 0;
}
