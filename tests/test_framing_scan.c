/* test_framing_scan.c: unit test of kcd_framing_scan
 * (server/http/framing.c), the scanner kcached's recv() feeds each plain-HTTP
 * header block to, so that a malformed Content-Length is answered by kcached
 * instead of by libmicrohttpd 0.9.75 (twice). Every block is fed whole, split
 * in two at every byte, and byte by byte: the verdict must not depend on how
 * the bytes arrive. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "http.h"

/* Feeds p in pieces of `step` bytes after a first piece of `first`; the
 * verdict, and the scanner's state after it (KCD_SCAN_OFF, _HEADERS,
 * _BODY). */
static int feed(const char *p, size_t n, size_t first, size_t step,
                int *stopped) {
  kcd_scan s = {.on = 1};
  int v = KCD_SCAN_OK;
  size_t off = 0, k = first ? first : step;
  while (off < n && !v) {
    size_t m = n - off < k ? n - off : k;
    v = kcd_framing_scan(&s, p + off, m);
    off += m;
    k = step;
  }
  *stopped = s.on;
  return v;
}

static void expect(const char *block, int want) {
  size_t n = strlen(block);
  int stopped;
  if (feed(block, n, 0, n, &stopped) != want)
    print_message("block:\n%s\n", block);
  assert_int_equal(feed(block, n, 0, n, &stopped), want);
  for (size_t cut = 1; cut < n; cut++)
    assert_int_equal(feed(block, n, cut, n, &stopped), want);
  assert_int_equal(feed(block, n, 0, 1, &stopped), want);
}

static void t_verdicts(void **state) {
  (void)state;
  const int OK = KCD_SCAN_OK, BAD = KCD_SCAN_BAD_LENGTH,
            BIG = KCD_SCAN_BIG_LENGTH;
  expect("GET / HTTP/1.1\r\nHost: a\r\n\r\n", OK);
  expect("POST / HTTP/1.1\r\nContent-Length: 11\r\n\r\n", OK);
  expect("POST / HTTP/1.1\r\nContent-Length: \t 11\r\n\r\n", OK);
  expect("POST / HTTP/1.1\r\ncontent-length: 0\r\n\r\n", OK);
  expect("POST / HTTP/1.1\nContent-Length: 2\n\n", OK);
  expect("\r\n\r\nPOST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n", OK);
  expect("POST / HTTP/1.1\r\nContent-Length: 2x\r\n\r\n", BAD);
  expect("POST / HTTP/1.1\r\nContent-Length:\r\n\r\n", BAD);
  expect("POST / HTTP/1.1\r\nContent-Length: 2 \r\n\r\n", BAD);
  expect("POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", BAD);
  expect("POST / HTTP/1.1\r\nContent-Length: 1,1\r\n\r\n", BAD);
  expect("POST / HTTP/1.1\r\nContent-Length: 1\rx\r\n\r\n", BAD);
  expect("POST / HTTP/1.1\nCONTENT-LENGTH: x\n\n", BAD);
  expect("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
         BIG);
  /* only the first Content-Length counts, and none beside
   * Transfer-Encoding (MHD ignores it then; framing.c refuses both) */
  expect("POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: x\r\n\r\n",
         OK);
  expect("POST / HTTP/1.1\r\nContent-Length: x\r\nTransfer-Encoding: "
         "chunked\r\n\r\n",
         OK);
  expect("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
         "Content-Length: x\r\n\r\n",
         OK);
  /* other names that only contain or start like it */
  expect("POST / HTTP/1.1\r\nX-Content-Length: x\r\n\r\n", OK);
  expect("POST / HTTP/1.1\r\nContent-Lengthy: x\r\n\r\n", OK);
  expect("POST / HTTP/1.1\r\nContent-Length : x\r\n\r\n", OK);
  /* the request line is not a header line */
  expect("Content-Length: x\r\nHost: a\r\n\r\n", OK);
}

/* The scanner follows the connection: a body (its Content-Length's bytes)
 * is skipped, however much it looks like headers, and the block after it
 * is scanned; a chunked body is followed chunk by chunk, and the scan stops
 * where its framing cannot be followed. */
static void t_follows_bodies(void **state) {
  (void)state;
  static const char req[] = "PUT / HTTP/1.1\r\nContent-Length: 25\r\n\r\n"
                            "x\r\nContent-Length: 2x\r\n\r\n"
                            "GET / HTTP/1.1\r\n\r\n";
  static const char bad[] = "POST / HTTP/1.1\r\nContent-Length: 2x\r\n\r\n";
  static const char chunked[] = "PUT / HTTP/1.1\r\nTransfer-Encoding: "
                                "chunked\r\n\r\n";
  char two[256];
  int on = 0;
  size_t n = sizeof req - 1;
  for (size_t step = 1; step <= n; step++) {
    assert_int_equal(feed(req, n, 0, step, &on), KCD_SCAN_OK);
    assert_int_equal(on, KCD_SCAN_HEADERS);
  }
  /* cut inside the body: its bytes still to skip */
  assert_int_equal(feed(req, 45, 0, 45, &on), KCD_SCAN_OK);
  assert_int_equal(on, KCD_SCAN_BODY);
  snprintf(two, sizeof two, "%s%s", req, bad);
  for (size_t step = 1; step <= strlen(two); step += 7)
    assert_int_equal(feed(two, strlen(two), 0, step, &on), KCD_SCAN_BAD_LENGTH);
  static const char *const chunks[] = {
      "0\r\n\r\n", "3\r\nabc\r\n10;x=\"y\"\r\n0123456789abcdef\r\n0\r\n\r\n",
      "A\nContent-L\n\n0\nT: 1\r\nU: 2\n\r\n"};
  for (size_t c = 0; c < sizeof chunks / sizeof *chunks; c++) {
    snprintf(two, sizeof two, "%s%s%s", chunked, chunks[c], bad);
    for (size_t step = 1; step <= strlen(two); step++)
      assert_int_equal(feed(two, strlen(two), 0, step, &on),
                       KCD_SCAN_BAD_LENGTH);
  }
  /* no chunk-size, a bare CR, data longer than its size, an overflow */
  static const char *const broken[] = {"\r\n", "x\r\n", "3\rabc",
                                       "2\r\nabc\r\n", "10000000000000000\r\n"};
  for (size_t c = 0; c < sizeof broken / sizeof *broken; c++) {
    snprintf(two, sizeof two, "%s%s%s", chunked, broken[c], bad);
    assert_int_equal(feed(two, strlen(two), 0, 1, &on), KCD_SCAN_OK);
    assert_int_equal(on, KCD_SCAN_OFF);
  }
  /* 2^64-1: MHD's "no length" marker, too large */
  expect("POST / HTTP/1.1\r\nContent-Length: 18446744073709551615\r\n\r\n",
         KCD_SCAN_BIG_LENGTH);
  size_t len;
  const char *a = kcd_framing_scan_answer(KCD_SCAN_BAD_LENGTH, &len);
  assert_int_equal(strlen(a), len);
  const char *body = strstr(a, "\r\n\r\n") + 4;
  assert_non_null(strstr(a, "Content-Length: 98\r\n"));
  assert_int_equal(strlen(body), 98);
  a = kcd_framing_scan_answer(KCD_SCAN_BIG_LENGTH, &len);
  body = strstr(a, "\r\n\r\n") + 4;
  assert_non_null(strstr(a, "Content-Length: 70\r\n"));
  assert_int_equal(strlen(body), 70);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_verdicts),
      cmocka_unit_test(t_follows_bodies),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
