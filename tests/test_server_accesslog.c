/* test_server_accesslog.c: kcached's access log: on by default
 * with the other log lines, in the format operators parse; --access-log off
 * drops it; --access-log FILE (or KCACHED_ACCESS_LOG) appends it to FILE and
 * leaves the message lines on stderr; an unopenable FILE stops the start.
 * Client-supplied bytes are escaped by the printf-free formatter. The real
 * kcached on a free loopback port. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "testsrv.h"

static long get(const kc_testsrv *t, const char *path) {
  kc_testsrv_resp r = kc_testsrv_http(NULL, t->url, path, (kc_testsrv_req){0});
  long s = r.status;
  kc_testsrv_resp_free(&r);
  return s;
}

/* The number of lines of text holding needle. */
static int lines_with(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = text; p && (p = strstr(p, needle)); p++)
    n++;
  return n;
}

/* "2026-11-22T08:00:00.123Z access " at the start of line. */
static int looks_like_access(const char *line) {
  static const char shape[] = "dddd-dd-ddTdd:dd:dd.dddZ access ";
  for (size_t i = 0; i < sizeof shape - 1; i++) {
    char c = line[i];
    if (shape[i] == 'd' ? (c < '0' || c > '9') : c != shape[i])
      return 0;
  }
  return 1;
}

/* Default: access lines on stderr, with the message lines, well formed and
 * escaped (a decoded newline and space in the path must not split the line
 * or its fields). */
static void t_default_on(void **state) {
  (void)state;
  kc_testsrv t = {0};
  assert_int_equal(kc_testsrv_start(&t, NULL), 0);
  assert_int_equal(get(&t, "/healthz"), 200);
  assert_int_equal(get(&t, "/no%0Ape%20x"), 404);
  assert_int_equal(kc_testsrv_stop(&t), 0); /* flushes the buffer */
  char *log = kc_testsrv_slurp(t.log);
  assert_non_null(log);
  const char *h = strstr(log, " access 127.0.0.1 GET /healthz 200 in=0 out=");
  assert_non_null(h);
  const char *bol = h;
  while (bol > log && bol[-1] != '\n')
    bol--;
  assert_true(looks_like_access(bol));
  assert_non_null(strstr(h, " us="));
  assert_non_null(strstr(h, " token=-\n"));
  assert_non_null(strstr(log, " GET /no%0ape%20x 404 in=0 out="));
  assert_true(lines_with(log, " info ") >= 1);
  free(log);
  kc_testsrv_cleanup(&t);
}

static void t_off(void **state) {
  (void)state;
  kc_testsrv t = {0};
  const char *const args[] = {"--access-log", "off", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  for (int i = 0; i < 20; i++)
    assert_int_equal(get(&t, "/healthz"), 200);
  assert_int_equal(get(&t, "/nope"), 404);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  char *log = kc_testsrv_slurp(t.log);
  assert_non_null(log);
  assert_int_equal(lines_with(log, " access "), 0);
  assert_true(lines_with(log, " info ") >= 1); /* messages still logged */
  free(log);
  kc_testsrv_cleanup(&t);
}

/* FILE: access lines there (appended: a second run adds to the first's),
 * none on stderr; JSON lines in JSON mode. */
static void t_file(void **state) {
  (void)state;
  kc_testsrv t = {0};
  assert_int_equal(kc_testsrv_init(&t), 0);
  char file[512];
  snprintf(file, sizeof file, "%s/access.log", t.dir);
  const char *const args[] = {"--access-log", file, "--log-format", "json",
                              NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  assert_int_equal(get(&t, "/healthz"), 200);
  assert_int_equal(get(&t, "/v1/stats"), 200);
  assert_int_equal(kc_testsrv_restart(&t), 0);
  assert_int_equal(get(&t, "/readyz"), 200);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  char *acc = kc_testsrv_slurp(file), *log = kc_testsrv_slurp(t.log);
  assert_non_null(acc);
  assert_non_null(log);
  assert_int_equal(lines_with(log, "\"access\""), 0);
  assert_true(lines_with(log, "\"info\"") >= 1);
  /* (the harness polls /healthz at each start) */
  assert_true(lines_with(acc, "\"level\":\"access\"") >= 3);
  assert_true(lines_with(acc, "\"path\":\"/healthz\"") >= 1);
  assert_int_equal(lines_with(acc, "\"path\":\"/v1/stats\""), 1);
  assert_int_equal(lines_with(acc, "\"path\":\"/readyz\""), 1);
  char *save = NULL;
  for (char *line = strtok_r(acc, "\n", &save); line;
       line = strtok_r(NULL, "\n", &save)) {
    assert_int_equal(line[0], '{');
    assert_non_null(strstr(line, "\"status\":200,\"bytes_in\":0,"));
    assert_non_null(strstr(line, "\"token\":\"-\"}"));
  }
  free(acc);
  free(log);
  kc_testsrv_cleanup(&t);
}

/* The environment variable, and a FILE that cannot be opened. */
static void t_env_and_bad_file(void **state) {
  (void)state;
  kc_testsrv t = {0};
  setenv("KCACHED_ACCESS_LOG", "off", 1);
  int rc = kc_testsrv_start(&t, NULL);
  unsetenv("KCACHED_ACCESS_LOG");
  assert_int_equal(rc, 0);
  assert_int_equal(get(&t, "/healthz"), 200);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  char *log = kc_testsrv_slurp(t.log);
  assert_int_equal(lines_with(log, " access "), 0);
  free(log);
  kc_testsrv_cleanup(&t);

  kc_testsrv u = {0};
  const char *const args[] = {"--access-log", "/nonexistent-kcache-dir/a.log",
                              NULL};
  assert_int_equal(kc_testsrv_start(&u, args), -1);
  log = kc_testsrv_slurp(u.log);
  assert_non_null(strstr(log, "--access-log /nonexistent-kcache-dir/a.log"));
  free(log);
  kc_testsrv_cleanup(&u);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_default_on),
      cmocka_unit_test(t_off),
      cmocka_unit_test(t_file),
      cmocka_unit_test(t_env_and_bad_file),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
