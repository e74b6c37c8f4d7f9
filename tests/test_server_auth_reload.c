/* test_server_auth_reload.c: token files kcached must not swap in: an empty
 * file on SIGHUP (a non-atomic rewrite caught half-way) keeps the tokens
 * loaded; a token hash on two lines is refused, at start and on SIGHUP,
 * naming both lines. Starting with an empty file is allowed, with a
 * warning. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kc_schema.h"
#include "rawhttp.h"
#include "testsrv.h"

#define TOK_A "kc_test_token_a"
#define TOK_B "kc_test_token_b"

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* "role name sha256(token)\n" */
static void token_line(char *out, size_t cap, const char *role,
                       const char *name, const char *token) {
  char hex[KC_HEX_LEN + 1];
  assert_int_equal(kc_sha256_hex(token, strlen(token), hex), KC_OK);
  snprintf(out, cap, "%s %s %s\n", role, name, hex);
}

static int stats_status(const kc_testsrv *t, const char *token) {
  char req[256], buf[8192];
  snprintf(req, sizeof req,
           "GET /v1/stats HTTP/1.1\r\nHost: localhost\r\n"
           "Authorization: Bearer %s\r\nConnection: close\r\n\r\n",
           token);
  raw_exchange(t->port, req, buf, sizeof buf, 3000);
  return raw_status(buf);
}

static void start_with(kc_testsrv *t, const char *content, char *file,
                       size_t cap) {
  assert_int_equal(kc_testsrv_init(t), 0);
  snprintf(file, cap, "%s/tokens", t->dir);
  write_file(file, content);
}

/* The file emptied on reload: the tokens there were stay (they got 401
 * until the next reload, before). */
static void t_reload_empty_file(void **state) {
  (void)state;
  kc_testsrv t;
  char file[512], line[200];
  token_line(line, sizeof line, "read", "a", TOK_A);
  start_with(&t, line, file, sizeof file);
  const char *const args[] = {"--tokens", file, NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  assert_int_equal(stats_status(&t, TOK_A), 200);
  write_file(file, "# being rewritten\n");
  kill(t.pid, SIGHUP);
  assert_true(kc_testsrv_wait_log(&t, "no token in the file", 1, 5000));
  assert_true(kc_testsrv_wait_log(&t, "keeping the old tokens", 1, 5000));
  assert_int_equal(stats_status(&t, TOK_A), 200);
  /* a later good file is loaded */
  token_line(line, sizeof line, "read", "b", TOK_B);
  write_file(file, line);
  kill(t.pid, SIGHUP);
  assert_true(kc_testsrv_wait_log(&t, "reloaded 1 tokens", 1, 5000));
  assert_int_equal(stats_status(&t, TOK_B), 200);
  assert_int_equal(stats_status(&t, TOK_A), 401);
  kc_testsrv_cleanup(&t);
}

/* Starting on an empty file: allowed, warned about; every token 401. */
static void t_start_empty_file(void **state) {
  (void)state;
  kc_testsrv t;
  char file[512];
  start_with(&t, "", file, sizeof file);
  const char *const args[] = {"--tokens", file, NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  assert_true(kc_testsrv_wait_log(&t, "warn no token in", 1, 5000));
  assert_int_equal(stats_status(&t, TOK_A), 401);
  kc_testsrv_cleanup(&t);
}

/* One token on lines 2 and 4 with different roles: the first line won in
 * silence. Refused at start (exit 2) and on SIGHUP, naming both lines. */
static void t_duplicate_hash(void **state) {
  (void)state;
  kc_testsrv t;
  char file[512], ra[200], wa[200], text[1024];
  token_line(ra, sizeof ra, "read", "a", TOK_A);
  token_line(wa, sizeof wa, "admin", "a-admin", TOK_A);
  snprintf(text, sizeof text, "# tokens\n%s\n%s", ra, wa);
  start_with(&t, text, file, sizeof file);
  const char *const args[] = {"--tokens", file, NULL};
  assert_int_equal(kc_testsrv_start(&t, args), -1);
  char *log = kc_testsrv_slurp(t.log);
  assert_non_null(strstr(log, "tokens:4: the same token hash as line 2"));
  free(log);
  /* on reload: the loaded table stays */
  write_file(file, ra);
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  write_file(file, text);
  kill(t.pid, SIGHUP);
  assert_true(kc_testsrv_wait_log(&t,
                                  "line 2 (read a); each token may appear "
                                  "once; keeping the old tokens",
                                  1, 5000));
  assert_int_equal(stats_status(&t, TOK_A), 200);
  kc_testsrv_cleanup(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_reload_empty_file),
      cmocka_unit_test(t_start_empty_file),
      cmocka_unit_test(t_duplicate_hash),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
