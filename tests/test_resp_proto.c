/* test_resp_proto.c: the RESP2 parser and reply writers (server/
 * resp_proto.c). Every input is parsed whole, then fed one byte at a time
 * into a buffer that is compacted between reads as the listener does: both
 * must give the same commands and errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "resp.h"

/* Parses `in` fed in pieces of `step` bytes (0: whole); returns the
 * commands as "arg|arg\n" lines, "ERR:<text>" on a protocol error, and
 * "MORE" when input ends inside a command. */
static char *run(const char *in, size_t n, size_t step, uint64_t max_bulk,
                 int unauth) {
  kcd_resp_parser p;
  kcd_resp_parser_init(&p, max_bulk, 1000);
  p.unauth = unauth;
  kcd_resp_buf buf = {0}, out = {0};
  size_t fed = 0;
  int more = 0;
  while (fed < n || !more) {
    size_t k = step && n - fed > step ? step : n - fed;
    kcd_resp_buf_add(&buf, in + fed, k);
    fed += k;
    kcd_resp_res r;
    while ((r = kcd_resp_parse(&p, buf.p, buf.len)) == KCD_RESP_CMD) {
      for (size_t i = 0; i < p.argc; i++) {
        if (i)
          kcd_resp_buf_add(&out, "|", 1);
        kcd_resp_buf_add(&out, buf.p + p.argv[i].off, p.argv[i].len);
      }
      kcd_resp_buf_add(&out, "\n", 1);
    }
    if (r == KCD_RESP_ERR) {
      kcd_resp_buf_add(&out, "ERR:", 4);
      kcd_resp_buf_add(&out, p.error, strlen(p.error));
      break;
    }
    assert_int_equal(r, KCD_RESP_MORE);
    size_t done = kcd_resp_parser_done(&p); /* compact as resp.c does */
    memmove(buf.p, buf.p + done, buf.len - done);
    buf.len -= done;
    kcd_resp_parser_shift(&p, done);
    if (fed == n) {
      if (buf.len)
        kcd_resp_buf_add(&out, "MORE", 4);
      more = 1;
    }
  }
  kcd_resp_buf_add(&out, "", 1);
  kcd_resp_buf_free(&buf);
  kcd_resp_parser_free(&p);
  return out.p;
}

/* Whole, byte by byte and in 3-byte pieces: all give `want`. */
static void expect(const char *in, size_t n, const char *want) {
  for (size_t step = 0; step <= 3; step += step ? 2 : 1) {
    char *got = run(in, n, step, 512u << 20, 0);
    if (strcmp(got, want) != 0)
      fail_msg("input %.40s (step %zu): got '%s', want '%s'", in, step, got,
               want);
    free(got);
  }
}
#define EXPECT(lit, want) expect(lit, sizeof lit - 1, want)

static void test_multibulk(void **state) {
  (void)state;
  EXPECT("*1\r\n$4\r\nPING\r\n", "PING\n");
  EXPECT("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n", "SET|k|\n");
  EXPECT("*2\r\n$4\r\nECHO\r\n$4\r\na\r\nb\r\n*1\r\n$4\r\nPING\r\n",
         "ECHO|a\r\nb\nPING\n");
  EXPECT("*-1\r\n*0\r\n*1\r\n$4\r\nPING\r\n", "PING\n"); /* empty: skipped */
  /* Redis does not check the CRLF after a bulk: neither do we */
  EXPECT("*2\r\n$4\r\nECHO\r\n$3\r\nabcXY*1\r\n$4\r\nPING\r\n",
         "ECHO|abc\nPING\n");
  EXPECT("*2\r\n$3\r\nGET\r\n$5\r\nab", "MORE");
}

static void test_binary(void **state) {
  (void)state;
  char in[600];
  int n = snprintf(in, sizeof in, "*2\r\n$4\r\nECHO\r\n$256\r\n");
  for (int i = 0; i < 256; i++)
    in[n + i] = (char)i;
  memcpy(in + n + 256, "\r\n", 2);
  for (size_t step = 0; step <= 1; step++) {
    char *got = run(in, (size_t)n + 258, step, 1024, 0);
    assert_memory_equal(got, "ECHO|", 5);
    for (int i = 0; i < 256; i++)
      assert_int_equal((unsigned char)got[5 + i], i);
    free(got);
  }
}

static void test_inline(void **state) {
  (void)state;
  EXPECT("PING\r\n", "PING\n");
  EXPECT("PING\n", "PING\n");
  EXPECT("  SET  a   b \r\n\r\n\n", "SET|a|b\n");
  EXPECT("ECHO \"a\\x41\\n\\\"b\"\r\n", "ECHO|aA\n\"b\n");
  EXPECT("ECHO 'b\\'c' \"\"\r\n", "ECHO|b'c|\n");
  EXPECT("ECHO a\"b c\"\r\n", "ECHO|ab c\n");
  EXPECT("ECHO \"abc\r\n", "ERR:Protocol error: unbalanced quotes in request");
  EXPECT("ECHO \"a\"b\r\n", "ERR:Protocol error: unbalanced quotes in request");
  EXPECT("ECHO 'a\r\n", "ERR:Protocol error: unbalanced quotes in request");
  EXPECT("ECHO a\0b c\r\nPING\r\n", "ECHO|a\nPING\n"); /* a NUL ends it */
  EXPECT("PIN", "MORE");
}

static void test_errors(void **state) {
  (void)state;
  EXPECT("*1\r\n$-5\r\n", "ERR:Protocol error: invalid bulk length");
  EXPECT("*1\r\n$abc\r\n", "ERR:Protocol error: invalid bulk length");
  EXPECT("*1\r\n$999999999999999\r\n", "ERR:Protocol error: invalid bulk length");
  EXPECT("*99999999999\r\n", "ERR:Protocol error: invalid multibulk length");
  EXPECT("*1001\r\n", "ERR:Protocol error: invalid multibulk length");
  EXPECT("*x\r\n", "ERR:Protocol error: invalid multibulk length");
  EXPECT("*01\r\n", "ERR:Protocol error: invalid multibulk length");
  EXPECT("*+1\r\n", "ERR:Protocol error: invalid multibulk length");
  EXPECT("*1\r\n+abc\r\n", "ERR:Protocol error: expected '$', got '+'");
  EXPECT("PING\r\n*1\r\n$x\r\n", "PING\nERR:Protocol error: invalid bulk length");
  /* the limits hold whatever the client declares */
  char *got = run("*1\r\n$1025\r\n", 11, 0, 1024, 0);
  assert_string_equal(got, "ERR:Protocol error: invalid bulk length");
  free(got);
  got = run("*11\r\n", 5, 0, 1024, 1);
  assert_string_equal(got, "ERR:Protocol error: unauthenticated multibulk length");
  free(got);
  got = run("*1\r\n$16385\r\n", 12, 0, 1 << 20, 1);
  assert_string_equal(got, "ERR:Protocol error: unauthenticated bulk length");
  free(got);
}

static void test_too_big_lines(void **state) {
  (void)state;
  size_t n = KCD_RESP_INLINE_MAX + 10;
  char *in = malloc(n);
  memset(in, 'A', n);
  char *got = run(in, n, 0, 1024, 0);
  assert_string_equal(got, "ERR:Protocol error: too big inline request");
  free(got);
  in[0] = '*';
  got = run(in, n, 0, 1024, 0);
  assert_string_equal(got, "ERR:Protocol error: too big mbulk count string");
  free(got);
  free(in);
}

/* A declared length is not allocated before its bytes come. */
static void test_want(void **state) {
  (void)state;
  kcd_resp_parser p;
  kcd_resp_parser_init(&p, 1ull << 30, 10);
  char in[] = "*1\r\n$1000000\r\nab";
  assert_int_equal(kcd_resp_parse(&p, in, sizeof in - 1), KCD_RESP_MORE);
  assert_int_equal(kcd_resp_parser_want(&p, sizeof in - 1), 1000000 - 2 + 2);
  assert_true(p.argcap <= 16);
  kcd_resp_parser_free(&p);
}

static void test_ll(void **state) {
  (void)state;
  long long v;
  assert_int_equal(kcd_resp_ll("0", 1, &v), 0);
  assert_int_equal(v, 0);
  assert_int_equal(kcd_resp_ll("-12", 3, &v), 0);
  assert_int_equal(v, -12);
  assert_int_equal(kcd_resp_ll("9223372036854775807", 19, &v), 0);
  assert_int_equal(kcd_resp_ll("-9223372036854775808", 20, &v), 0);
  assert_true(v < 0);
  assert_int_equal(kcd_resp_ll("9223372036854775808", 19, &v), -1);
  assert_int_equal(kcd_resp_ll("-0", 2, &v), -1);
  assert_int_equal(kcd_resp_ll("01", 2, &v), -1);
  assert_int_equal(kcd_resp_ll(" 1", 2, &v), -1);
  assert_int_equal(kcd_resp_ll("", 0, &v), -1);
}

static void test_replies(void **state) {
  (void)state;
  kcd_resp_buf b = {0};
  kcd_resp_simple(&b, "OK");
  kcd_resp_error(&b, "ERR a\r\nb");
  kcd_resp_int(&b, -2);
  kcd_resp_bulk(&b, "a\0b", 3);
  kcd_resp_null(&b);
  kcd_resp_array(&b, 0);
  static const char want[] = "+OK\r\n-ERR a  b\r\n:-2\r\n$3\r\na\0b\r\n$-1\r\n*0\r\n";
  assert_int_equal(b.len, sizeof want - 1);
  assert_memory_equal(b.p, want, sizeof want - 1);
  kcd_resp_buf_free(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_multibulk), cmocka_unit_test(test_binary),
      cmocka_unit_test(test_inline),    cmocka_unit_test(test_errors),
      cmocka_unit_test(test_too_big_lines), cmocka_unit_test(test_want),
      cmocka_unit_test(test_ll),        cmocka_unit_test(test_replies),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
