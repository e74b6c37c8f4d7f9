/* test_server_http.c: kcached against requests whose framing RFC 9112 says
 * to refuse (a request-smuggling surface behind a proxy): each is answered
 * 400 (501 for an unknown transfer coding) with the JSON error body and
 * Connection: close, the connection is closed after it, and bytes smuggled
 * behind it are never answered. Raw sockets: libcurl would not send these. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "rawhttp.h"
#include "testsrv.h"

static kc_testsrv S;

static int setup(void **state) {
  (void)state;
  /* --timeout 30: a request MHD cannot frame would hang that long */
  const char *const args[] = {"--timeout", "30", "--threads", "2", NULL};
  return kc_testsrv_start(&S, args);
}

static int teardown(void **state) {
  (void)state;
  kc_testsrv_cleanup(&S);
  return 0;
}

/* Counts "HTTP/1." status lines: one answer, not one per smuggled request. */
static int n_responses(const char *r) {
  int n = 0;
  for (const char *p = r; (p = strstr(p, "HTTP/1.")); p++)
    n++;
  return n;
}

/* Sends req, expects status and code as the JSON error, Connection: close,
 * and the connection closed, all within 3 s. */
static void refused(const char *req, int status, const char *code) {
  char buf[16384], want[128];
  long t0 = kc_testsrv_now_ms();
  int rc = raw_exchange(S.port, req, buf, sizeof buf, 3000);
  if (raw_status(buf) != status || rc != 1)
    print_message("request:\n%s\nanswer (rc %d):\n%s\n", req, rc, buf);
  assert_int_equal(raw_status(buf), status);
  assert_int_equal(rc, 1); /* closed by the server, not timed out */
  assert_true(kc_testsrv_now_ms() - t0 < 3000);
  snprintf(want, sizeof want, "{\"error\":\"%s\",\"message\":", code);
  assert_non_null(strstr(buf, want));
  assert_non_null(strcasestr(buf, "\r\nConnection: close\r\n"));
  assert_int_equal(n_responses(buf), 1);
}

#define DIGEST "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

/* Both: MHD let chunked win and kept the connection. */
static void t_cl_and_te(void **state) {
  (void)state;
  refused("PUT /v1/blobs/" DIGEST " HTTP/1.1\r\nHost: x\r\n"
          "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
          "5\r\nhello\r\n0\r\n\r\n",
          400, "bad_request");
  refused("POST /v1/lookup HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
          "chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n",
          400, "bad_request");
}

/* Two lengths: MHD used the first, so the rest of the body was read as a
 * second request (here a GET /healthz that was answered). */
static void t_two_content_lengths(void **state) {
  (void)state;
  refused("POST /v1/lookup HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
          "Content-Length: 36\r\n\r\n{}GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
          400, "bad_request");
  /* the same value twice is one length (RFC 9112 6.3): served */
  char buf[8192];
  raw_exchange(S.port, "POST /v1/lookup HTTP/1.1\r\nHost: x\r\n"
               "Content-Length: 11\r\nContent-Length: 11\r\n"
               "Connection: close\r\n\r\n{\"keys\":[]}",
               buf, sizeof buf, 3000);
  assert_int_equal(raw_status(buf), 200);
}

/* "Transfer-Encoding : chunked" was a header named "Transfer-Encoding "
 * that nobody read: the chunked body became the next request. */
static void t_space_before_colon(void **state) {
  (void)state;
  refused("POST /v1/lookup HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : "
          "chunked\r\n\r\nb\r\n{\"keys\":[]}\r\n0\r\n\r\n",
          400, "bad_request");
  refused("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Bad\tName: 1\r\n\r\n", 400,
          "bad_request");
}

/* An unknown coding hung until the idle timeout (30 s here). */
static void t_unknown_coding(void **state) {
  (void)state;
  refused("POST /v1/lookup HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip"
          "\r\n\r\n{}",
          501, "not_implemented");
  refused("POST /v1/lookup HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, "
          "chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
          501, "not_implemented");
  refused("POST /v1/lookup HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked"
          "\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
          501, "not_implemented");
}

/* %00 cut the decoded path: "/healthz%00junk" was served as /healthz. */
static void t_nul_in_target(void **state) {
  (void)state;
  refused("GET /healthz%00junk HTTP/1.1\r\nHost: x\r\n\r\n", 400,
          "bad_request");
  refused("GET /v1/blobs/" DIGEST "%00 HTTP/1.1\r\nHost: x\r\n\r\n", 400,
          "bad_request");
}

/* MHD 0.9.75 answers a malformed Content-Length itself, before kcached sees
 * the request (README, Reliability): not our JSON, but a 400 and a closed
 * connection, so nothing behind it is read as a request. */
static void t_bad_content_length(void **state) {
  (void)state;
  char buf[16384];
  int rc = raw_exchange(S.port, "POST /v1/lookup HTTP/1.1\r\nHost: x\r\n"
                        "Content-Length: 2x\r\n\r\n{}GET /healthz HTTP/1.1"
                        "\r\nHost: x\r\n\r\n",
                        buf, sizeof buf, 3000);
  assert_int_equal(raw_status(buf), 400);
  assert_int_equal(rc, 1);
  assert_null(strstr(buf, "200 OK"));
}

/* Well-framed requests keep working, on one kept-alive connection: a
 * chunked lookup, then a GET. */
static void t_good_framing_kept_alive(void **state) {
  (void)state;
  int fd = kc_testsrv_connect(S.port);
  assert_true(fd >= 0);
  assert_int_equal(raw_send(fd, "POST /v1/lookup HTTP/1.1\r\nHost: x\r\n"
                                "Transfer-Encoding: chunked\r\n\r\n"
                                "b\r\n{\"keys\":[]}\r\n0\r\n\r\n"),
                   0);
  char buf[8192];
  assert_int_equal(raw_read(fd, buf, sizeof buf, 500), 0); /* still open */
  assert_int_equal(raw_status(buf), 200);
  assert_int_equal(raw_send(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\n"
                                "Connection: close\r\n\r\n"),
                   0);
  assert_int_equal(raw_read(fd, buf, sizeof buf, 3000), 1);
  assert_int_equal(raw_status(buf), 200);
  close(fd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_cl_and_te),
      cmocka_unit_test(t_two_content_lengths),
      cmocka_unit_test(t_space_before_colon),
      cmocka_unit_test(t_unknown_coding),
      cmocka_unit_test(t_nul_in_target),
      cmocka_unit_test(t_bad_content_length),
      cmocka_unit_test(t_good_framing_kept_alive),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
