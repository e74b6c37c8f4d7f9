/* test_resp_proto.c: the RESP2 parser and reply writers (server/
 * resp_proto.c, RESP3's too), and the key family table (resp_family.c). Every
 * input is parsed whole, then fed one byte at a time into a buffer that is
 * compacted between reads as the listener does: both must give the same
 * commands and errors. */
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
  EXPECT("*1\r\n$999999999999999\r\n",
         "ERR:Protocol error: invalid bulk length");
  EXPECT("*99999999999\r\n", "ERR:Protocol error: invalid multibulk length");
  EXPECT("*1001\r\n", "ERR:Protocol error: invalid multibulk length");
  EXPECT("*x\r\n", "ERR:Protocol error: invalid multibulk length");
  EXPECT("*01\r\n", "ERR:Protocol error: invalid multibulk length");
  EXPECT("*+1\r\n", "ERR:Protocol error: invalid multibulk length");
  EXPECT("*1\r\n+abc\r\n", "ERR:Protocol error: expected '$', got '+'");
  EXPECT("PING\r\n*1\r\n$x\r\n",
         "PING\nERR:Protocol error: invalid bulk length");
  /* the limits hold whatever the client declares */
  char *got = run("*1\r\n$1025\r\n", 11, 0, 1024, 0);
  assert_string_equal(got, "ERR:Protocol error: invalid bulk length");
  free(got);
  got = run("*11\r\n", 5, 0, 1024, 1);
  assert_string_equal(got,
                      "ERR:Protocol error: unauthenticated multibulk length");
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
  static const char want[] =
      "+OK\r\n-ERR a  b\r\n:-2\r\n$3\r\na\0b\r\n$-1\r\n*0\r\n";
  assert_int_equal(b.len, sizeof want - 1);
  assert_memory_equal(b.p, want, sizeof want - 1);
  kcd_resp_buf_free(&b);
}

static void test_replies_resp3(void **state) {
  (void)state;
  kcd_resp_buf b = {0};
  kcd_resp_nil(&b, 0);
  kcd_resp_nil(&b, 1);
  kcd_resp_map(&b, 2, 0);
  kcd_resp_map(&b, 2, 1);
  kcd_resp_map(&b, 0, 1);
  kcd_resp_verbatim(&b, "a\r\nb", 4, 0);
  kcd_resp_verbatim(&b, "a\r\nb", 4, 1);
  kcd_resp_verbatim(&b, "", 0, 1);
  static const char want[] = "$-1\r\n_\r\n*4\r\n%2\r\n%0\r\n$4\r\na\r\nb\r\n"
                             "=8\r\ntxt:a\r\nb\r\n=4\r\ntxt:\r\n";
  assert_int_equal(b.len, sizeof want - 1);
  assert_memory_equal(b.p, want, sizeof want - 1);
  kcd_resp_buf_free(&b);
}

/* ---- key families (resp_family.c) ---- */

typedef struct fam_row {
  char name[64];
  uint64_t hits, misses;
} fam_row;

typedef struct fam_list {
  fam_row rows[KCD_RESP_FAMILIES + 1];
  int n;
} fam_list;

static void fam_cb(const char *name, size_t len, uint64_t hits, uint64_t misses,
                   void *ud) {
  fam_list *l = ud;
  fam_row *r = &l->rows[l->n++];
  snprintf(r->name, sizeof r->name, "%.*s", name ? (int)len : 5,
           name ? name : "other");
  r->hits = hits;
  r->misses = misses;
}

static fam_row *fam_find(fam_list *l, const char *name) {
  for (int i = 0; i < l->n; i++)
    if (strcmp(l->rows[i].name, name) == 0)
      return &l->rows[i];
  return NULL;
}

static void count(kcd_resp_families *t, const char *key, int hit) {
  kcd_resp_family_count(t, key, strlen(key), hit);
}

static void test_families(void **state) {
  (void)state;
  static kcd_resp_families t; /* zeroed: every slot free */
  count(&t, "pt2:fx:abc", 1);
  count(&t, "pt2:x", 0);
  count(&t, "pt2", 0);       /* no ':': other */
  count(&t, ":x", 0);        /* empty prefix: other */
  count(&t, "a b:x", 1);     /* a space: other */
  count(&t, "q\"uote:x", 1); /* a label's quote: other */
  count(&t, "other:x", 0);   /* the name of the rest: other */
  char longk[KCD_RESP_FAMILY_MAX + 8];
  memset(longk, 'l', sizeof longk);
  longk[sizeof longk - 2] = ':';
  longk[sizeof longk - 1] = '\0';
  count(&t, longk, 0); /* a prefix too long: other */
  count(&t, "triton:k", 1);
  for (int i = 0; i < 40; i++) { /* 30 more fit, 10 do not */
    char k[32];
    snprintf(k, sizeof k, "f%02d:key", i);
    count(&t, k, i % 2);
  }
  fam_list l = {0};
  kcd_resp_family_each(&t, fam_cb, &l);
  assert_int_equal(l.n, KCD_RESP_FAMILIES + 1);
  fam_row *r = fam_find(&l, "pt2");
  assert_non_null(r);
  assert_int_equal(r->hits, 1);
  assert_int_equal(r->misses, 1);
  assert_non_null(fam_find(&l, "triton"));
  assert_non_null(fam_find(&l, "f29"));
  assert_null(fam_find(&l, "f30"));
  r = fam_find(&l, "other");
  assert_ptr_equal(r, &l.rows[l.n - 1]); /* listed last */
  /* pt2, :x, other:x, long, f30..f39 (5 even: misses) / a b, q"uote,
   * f31..f39 odd (5: hits) */
  assert_int_equal(r->misses, 4 + 5);
  assert_int_equal(r->hits, 2 + 5);
}

/* The first bytes of a connection (resp_admit.c, kcd_resp_sniff). */
static void test_sniff(void **state) {
  (void)state;
  struct {
    const char *in;
    kcd_resp_sniff_res want;
  } cases[] = {
      {"", KCD_SNIFF_MORE},
      {"\r\n\r\n", KCD_SNIFF_MORE},
      {"*", KCD_SNIFF_OK},
      {"\r\n *3\r\n", KCD_SNIFF_OK},
      {"PING\r\n", KCD_SNIFF_OK},
      {"PIN", KCD_SNIFF_MORE},
      {"ping\n", KCD_SNIFF_OK},
      {"SET a \"b c\"\r\n", KCD_SNIFF_OK},
      {"GET / HTTP/1.1\r\n", KCD_SNIFF_OK}, /* letters: the guard's part */
      {"\x16\x03\x01", KCD_SNIFF_BAD},
      {"{\"a\":1}", KCD_SNIFF_BAD},
      {"<html>", KCD_SNIFF_BAD},
      {"\"abc\"\r\n", KCD_SNIFF_BAD},
      {"SET x \x01", KCD_SNIFF_BAD},
      {"SET\rx\r\n", KCD_SNIFF_BAD},
      {"SET x \xc3\xa9\r\n", KCD_SNIFF_BAD},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    if (kcd_resp_sniff(cases[i].in, strlen(cases[i].in)) != cases[i].want)
      fail_msg("sniff case %zu: %s", i, cases[i].in);
  assert_int_equal(kcd_resp_sniff("\0PING\r\n", 7), KCD_SNIFF_BAD);
  /* an inline line too long for the parser is left to it */
  size_t n = KCD_RESP_INLINE_MAX + 10;
  char *big = malloc(n);
  memset(big, 'A', n);
  assert_int_equal(kcd_resp_sniff(big, n), KCD_SNIFF_OK);
  assert_int_equal(kcd_resp_sniff(big, 100), KCD_SNIFF_MORE);
  free(big);
}

static int http(int inl, size_t argc, ...) {
  const char *v[8];
  size_t l[8];
  va_list ap;
  va_start(ap, argc);
  for (size_t i = 0; i < argc; i++) {
    v[i] = va_arg(ap, const char *);
    l[i] = strlen(v[i]);
  }
  va_end(ap);
  return kcd_resp_is_http(v, l, argc, inl);
}

static void test_is_http(void **state) {
  (void)state;
  assert_true(http(0, 1, "POST"));
  assert_true(http(1, 3, "post", "/", "HTTP/1.1"));
  assert_true(http(0, 2, "Host:", "x"));
  assert_true(http(1, 2, "HOST:", "x"));
  assert_true(http(1, 3, "GET", "/", "HTTP/1.1"));
  assert_true(http(1, 3, "PRI", "*", "HTTP/2.0"));
  assert_false(http(0, 3, "SET", "/", "HTTP/1.1")); /* RESP framed: data */
  assert_false(http(1, 1, "HTTP/1.1"));
  assert_false(http(1, 2, "GET", "http/1.1"));
  assert_false(http(1, 2, "POSTS", "x"));
  assert_false(http(0, 0));
}

/* A buffer's limit and shared budget (kcd_resp_buf_reserve). */
static void test_buf_limits(void **state) {
  (void)state;
  kcd_resp_buf b = {.limit = 100};
  kcd_resp_buf_add(&b, "0123456789", 10);
  assert_int_equal(b.len, 10);
  assert_true(b.cap <= 100);
  char big[200] = {0};
  kcd_resp_buf_add(&b, big, 91);
  assert_int_equal(b.over, 1);
  assert_int_equal(b.len, 10);
  kcd_resp_buf_add(&b, "x", 1); /* dropped while over */
  assert_int_equal(b.len, 10);
  b.over = 0;
  kcd_resp_buf_add(&b, big, 90);
  assert_int_equal(b.len, 100);
  kcd_resp_buf_free(&b);
  assert_int_equal(b.limit, 100); /* kept */
  /* a budget of 64K shared by two buffers; 16K of each free */
  kcd_resp_budget g = {.limit = 64 * 1024};
  kcd_resp_buf x = {.bud = &g}, y = {.bud = &g};
  char *v = calloc(1, 80 * 1024);
  kcd_resp_buf_add(&x, v, 60 * 1024); /* counts 44K */
  assert_false(x.over);
  assert_int_equal(g.used, 44 * 1024);
  kcd_resp_buf_add(&y, v, 40 * 1024); /* 24K more: no room */
  assert_true(y.over);
  assert_int_equal(y.len, 0);
  y.over = 0;
  kcd_resp_buf_add(&y, "+OK\r\n", 5); /* small replies go on */
  assert_false(y.over);
  kcd_resp_buf_free(&x);
  assert_int_equal(g.used, 0);
  kcd_resp_buf_add(&y, v, 40 * 1024);
  assert_false(y.over);
  kcd_resp_buf_free(&y);
  assert_int_equal(g.used, 0);
  free(v);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sniff),      cmocka_unit_test(test_is_http),
      cmocka_unit_test(test_buf_limits), cmocka_unit_test(test_multibulk),
      cmocka_unit_test(test_binary),     cmocka_unit_test(test_inline),
      cmocka_unit_test(test_errors),     cmocka_unit_test(test_too_big_lines),
      cmocka_unit_test(test_want),       cmocka_unit_test(test_ll),
      cmocka_unit_test(test_replies),    cmocka_unit_test(test_replies_resp3),
      cmocka_unit_test(test_families),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
