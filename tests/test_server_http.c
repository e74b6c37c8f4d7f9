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
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "kc_schema.h"
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

/* Sends req on the open connection fd, expects status and code as the
 * JSON error (one answer), Connection: close, and the connection closed,
 * all within 3 s. */
static void refused_on(int fd, const char *req, int status, const char *code) {
  char buf[16384], want[128];
  long t0 = kc_testsrv_now_ms();
  int rc = raw_send(fd, req) == 0 ? raw_read(fd, buf, sizeof buf, 3000) : -1;
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

/* The same on a new connection. */
static void refused(const char *req, int status, const char *code) {
  int fd = kc_testsrv_connect(S.port);
  assert_true(fd >= 0);
  refused_on(fd, req, status, code);
  close(fd);
}

#define DIGEST                                                                 \
  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

/* Both: MHD let chunked win and kept the connection. */
static void t_cl_and_te(void **state) {
  (void)state;
  refused("PUT /v1/blobs/" DIGEST " HTTP/1.1\r\nHost: localhost\r\n"
          "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
          "5\r\nhello\r\n0\r\n\r\n",
          400, "bad_request");
  refused("POST /v1/lookup HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: "
          "chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n",
          400, "bad_request");
}

/* Two lengths: MHD used the first, so the rest of the body was read as a
 * second request (here a GET /healthz that was answered). */
static void t_two_content_lengths(void **state) {
  (void)state;
  refused("POST /v1/lookup HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n"
          "Content-Length: 36\r\n\r\n{}GET /healthz HTTP/1.1\r\nHost: "
          "localhost\r\n\r\n",
          400, "bad_request");
  /* the same value twice is one length (RFC 9112 6.3): served */
  char buf[8192];
  raw_exchange(S.port,
               "POST /v1/lookup HTTP/1.1\r\nHost: localhost\r\n"
               "Content-Length: 11\r\nContent-Length: 11\r\n"
               "Connection: close\r\n\r\n{\"keys\":[]}",
               buf, sizeof buf, 3000);
  assert_int_equal(raw_status(buf), 200);
}

/* "Transfer-Encoding : chunked" was a header named "Transfer-Encoding "
 * that nobody read: the chunked body became the next request. */
static void t_space_before_colon(void **state) {
  (void)state;
  refused("POST /v1/lookup HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding : "
          "chunked\r\n\r\nb\r\n{\"keys\":[]}\r\n0\r\n\r\n",
          400, "bad_request");
  refused("GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Bad\tName: 1\r\n\r\n",
          400, "bad_request");
}

/* An unknown coding hung until the idle timeout (30 s here). */
static void t_unknown_coding(void **state) {
  (void)state;
  refused(
      "POST /v1/lookup HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: gzip"
      "\r\n\r\n{}",
      501, "not_implemented");
  refused(
      "POST /v1/lookup HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: gzip, "
      "chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
      501, "not_implemented");
  refused("POST /v1/lookup HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: "
          "chunked"
          "\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
          501, "not_implemented");
}

/* %00 cut the decoded path: "/healthz%00junk" was served as /healthz. */
static void t_nul_in_target(void **state) {
  (void)state;
  refused("GET /healthz%00junk HTTP/1.1\r\nHost: localhost\r\n\r\n", 400,
          "bad_request");
  refused("GET /v1/blobs/" DIGEST "%00 HTTP/1.1\r\nHost: localhost\r\n\r\n",
          400, "bad_request");
}

/* MHD 0.9.75 answers a malformed Content-Length itself while parsing the
 * headers, before the access handler runs, and wrote its answer's status
 * line and headers twice. kcached now answers it from the received bytes
 * (framing.c's scanner): one answer, kcached's JSON, then the connection
 * closes, so nothing behind it is read as a request; on a kept-alive
 * connection too. */
static void t_bad_content_length(void **state) {
  (void)state;
  refused("POST /v1/lookup HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2x"
          "\r\n\r\n{}GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n",
          400, "bad_request");
  refused("POST /v1/lookup HTTP/1.1\r\nHost: localhost\r\nContent-Length:"
          "\r\n\r\n{}",
          400, "bad_request");
  refused("POST /v1/lookup HTTP/1.1\nHost: localhost\ncontent-LENGTH: -1\n\n",
          400, "bad_request");
  refused("PUT /v1/blobs/" DIGEST " HTTP/1.1\r\nHost: localhost\r\n"
          "Content-Length: 99999999999999999999999\r\n\r\n",
          413, "too_large");
  /* 2^64-1 is libmicrohttpd's "no length": it waited for the connection's
   * end (--timeout) instead of answering */
  refused("PUT /v1/blobs/" DIGEST " HTTP/1.1\r\nHost: localhost\r\n"
          "Content-Length: 18446744073709551615\r\n\r\n",
          413, "too_large");
  int fd = kc_testsrv_connect(S.port);
  assert_true(fd >= 0);
  char buf[8192];
  assert_int_equal(raw_send(fd, "GET /healthz HTTP/1.1\r\nHost: localhost"
                                "\r\n\r\n"),
                   0);
  assert_int_equal(raw_read(fd, buf, sizeof buf, 500), 0);
  assert_int_equal(raw_status(buf), 200);
  refused_on(fd,
             "POST /v1/lookup HTTP/1.1\r\nHost: localhost"
             "\r\nContent-Length: 1,1\r\n\r\n{}",
             400, "bad_request");
  close(fd);
  /* said in the log by the next tick, as connections cut are */
  assert_true(kc_testsrv_wait_log(&S,
                                  "with a malformed or too large "
                                  "Content-Length",
                                  1, 3000));
  /* a body that looks like a header block is a body: stored */
  static const char blob[] = "x\r\nContent-Length: 2x\r\n\r\n";
  char d[65], req[512];
  kc_sha256_hex(blob, sizeof blob - 1, d);
  snprintf(req, sizeof req,
           "PUT /v1/blobs/%s HTTP/1.1\r\nHost: localhost\r\n"
           "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
           d, sizeof blob - 1, blob);
  raw_exchange(S.port, req, buf, sizeof buf, 3000);
  assert_int_equal(raw_status(buf), 201);
}

/* Answered with status, on a connection left open (not refused). */
static void served(const char *req, int status) {
  char buf[16384];
  raw_exchange(S.port, req, buf, sizeof buf, 1000);
  if (raw_status(buf) != status)
    print_message("request:\n%s\nanswer:\n%s\n", req, buf);
  assert_int_equal(raw_status(buf), status);
}

/* obs-fold: MHD appended the continuation to the header's name, so
 * "Content-Length:\r\n 36" was a header "Content-Length36" and the body a
 * second request (served: a 200 behind the 400), and "X-A: a\r\n
 * Transfer-Encoding: chunked" one header named "X-ATransfer-Encoding:
 * chunked". Every fold is refused, an empty or a tab one too. */
static void t_obs_fold(void **state) {
  (void)state;
  refused("POST /v1/lookup HTTP/1.1\r\nHost: localhost\r\nContent-Length:"
          "\r\n 36\r\n\r\nGET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n",
          400, "bad_request");
  refused("POST /v1/lookup HTTP/1.1\r\nHost: localhost\r\nX-A: a\r\n "
          "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
          400, "bad_request");
  refused("GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-A: a\r\n\tb\r\n"
          "\r\n",
          400, "bad_request");
  refused("GET /healthz HTTP/1.1\r\nX-A: a\r\n \r\nHost: localhost\r\n\r\n",
          400, "bad_request");
  refused("GET /healthz HTTP/1.1\nHost: localhost\nX-A: a\n b\n\n", 400,
          "bad_request");
}

/* Host: required once on HTTP/1.1 (RFC 9112 3.2); HTTP/1.0 may omit it. */
static void t_host_count(void **state) {
  (void)state;
  refused("GET /healthz HTTP/1.1\r\n\r\n", 400, "bad_request");
  refused("GET /healthz HTTP/1.1\r\nHost: localhost\r\nHost: evil\r\n\r\n", 400,
          "bad_request");
  refused("GET /healthz HTTP/1.1\r\nHost: localhost\r\nhost: localhost\r\n"
          "\r\n",
          400, "bad_request");
  served("GET /healthz HTTP/1.0\r\n\r\n", 200);
}

/* Header values: a bare CR (which hid a second header line), other
 * controls, and a NUL byte (MHD kept the value up to it and dropped the
 * rest) were all accepted. */
static void t_header_bytes(void **state) {
  (void)state;
  refused("GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-A: a\r"
          "Transfer-Encoding: chunked\r\n\r\n",
          400, "bad_request");
  refused("GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-A: a\x01b\r\n\r\n",
          400, "bad_request");
  refused("GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-A: a\x7f\r\n\r\n", 400,
          "bad_request");
  /* raw_exchange sends C strings: the NUL goes by raw bytes */
  static const char nul_req[] = "GET /healthz HTTP/1.1\r\nX-A: a\0Host: "
                                "evil\r\nHost: localhost\r\n\r\n";
  static const char nul_last[] = "GET /healthz HTTP/1.1\r\nHost: "
                                 "localhost\0x\r\n\r\n";
  const char *reqs[] = {nul_req, nul_last};
  size_t lens[] = {sizeof nul_req - 1, sizeof nul_last - 1};
  for (int i = 0; i < 2; i++) {
    int fd = kc_testsrv_connect(S.port);
    assert_true(fd >= 0);
    assert_int_equal(send(fd, reqs[i], lens[i], MSG_NOSIGNAL),
                     (ssize_t)lens[i]);
    char buf[8192];
    assert_int_equal(raw_read(fd, buf, sizeof buf, 3000), 1);
    assert_int_equal(raw_status(buf), 400);
    assert_non_null(strstr(buf, "NUL"));
    close(fd);
  }
  /* blanks, tabs, empty values, LF-only lines and obs-text are fine */
  served("GET /healthz HTTP/1.1\r\nHost:\tlocalhost \r\nX-A:\r\nX-B: \t a\tb"
         " \r\nX-C: caf\xc3\xa9\r\n\r\n",
         200);
  served("GET /healthz HTTP/1.1\nHost: localhost\nX-A: b\n\n", 200);
}

/* The request target: a space (MHD took "/health z" as the path), a tab,
 * and a raw NUL byte (the path was cut at it: /healthz was served). */
static void t_target_bytes(void **state) {
  (void)state;
  refused("GET /health z HTTP/1.1\r\nHost: localhost\r\n\r\n", 400,
          "bad_request");
  refused("GET /healthz\t HTTP/1.1\r\nHost: localhost\r\n\r\n", 400,
          "bad_request");
  static const char req[] = "GET /healthz\0junk HTTP/1.1\r\nHost: "
                            "localhost\r\n\r\n";
  int fd = kc_testsrv_connect(S.port);
  assert_true(fd >= 0);
  assert_int_equal(send(fd, req, sizeof req - 1, MSG_NOSIGNAL),
                   (ssize_t)(sizeof req - 1));
  char buf[8192];
  assert_int_equal(raw_read(fd, buf, sizeof buf, 3000), 1);
  assert_int_equal(raw_status(buf), 400);
  assert_non_null(strstr(buf, "NUL byte"));
  close(fd);
  served("GET /he%61lthz?a=%20b HTTP/1.1\r\nHost: localhost\r\n\r\n", 200);
}

/* Without tokens only this server's names are answered: a page whose name
 * resolves to 127.0.0.1 (DNS rebinding) gets 403. libcurl's own Host
 * (127.0.0.1:PORT) passes: every other test depends on it. */
static void t_dns_rebinding(void **state) {
  (void)state;
  refused("GET /v1/stats HTTP/1.1\r\nHost: evil.example:8080\r\n\r\n", 403,
          "forbidden");
  refused("POST /v1/leases/" DIGEST " HTTP/1.1\r\nHost: attacker.test\r\n"
          "Content-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}",
          403, "forbidden");
  served("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 200);
  served("GET /healthz HTTP/1.1\r\nHost: LOCALHOST:1\r\n\r\n", 200);
  served("GET /healthz HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n", 200);
  served("GET /healthz HTTP/1.1\r\nHost: dev.localhost\r\n\r\n", 200);
  kc_testsrv_resp r = kc_testsrv_get(&S, "/v1/stats");
  assert_int_equal(r.status, 200);
  kc_testsrv_resp_free(&r);
  /* --allow-host adds names */
  kc_testsrv t2 = {0};
  const char *const args[] = {"--allow-host", "cache.example,other.test", NULL};
  assert_int_equal(kc_testsrv_start(&t2, args), 0);
  char buf[8192];
  raw_exchange(t2.port,
               "GET /healthz HTTP/1.1\r\nHost: cache.example:80"
               "\r\n\r\n",
               buf, sizeof buf, 1000);
  assert_int_equal(raw_status(buf), 200);
  raw_exchange(t2.port,
               "GET /healthz HTTP/1.1\r\nHost: evil.example\r\n"
               "\r\n",
               buf, sizeof buf, 1000);
  assert_int_equal(raw_status(buf), 403);
  kc_testsrv_cleanup(&t2);
}

/* A lease POST a web page can send across origins without CORS (a form's
 * content types, or none) squatted the lease on a kcached without tokens:
 * 415 now; JSON takes it. */
static void t_lease_needs_json(void **state) {
  (void)state;
  static const char *const types[] = {
      "Content-Type: text/plain\r\n",
      "Content-Type: application/x-www-form-urlencoded\r\n",
      "Content-Type: multipart/form-data; boundary=x\r\n",
      "Content-Type: application/jsonp\r\n", ""};
  char req[512], buf[8192];
  for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
    snprintf(req, sizeof req,
             "POST /v1/leases/%s HTTP/1.1\r\nHost: "
             "127.0.0.1\r\n%sContent-Length: 2\r\nConnection: close\r\n"
             "\r\n{}",
             DIGEST, types[i]);
    raw_exchange(S.port, req, buf, sizeof buf, 3000);
    assert_int_equal(raw_status(buf), 415);
    assert_non_null(strstr(buf, "\"unsupported_media_type\""));
  }
  snprintf(req, sizeof req,
           "POST /v1/leases/%s HTTP/1.1\r\nHost: 127.0.0.1"
           "\r\nContent-Type: Application/JSON; charset=utf-8\r\n"
           "Content-Length: 2\r\nConnection: close\r\n\r\n{}",
           DIGEST);
  raw_exchange(S.port, req, buf, sizeof buf, 3000);
  assert_int_equal(raw_status(buf), 201);
}

/* Content-Encoding: gzip on a PUT was stored as raw bytes (the digest
 * check then failed, or passed on the gzip bytes). Only identity, and zstd
 * on a blob PUT, are taken. */
static void t_content_coding(void **state) {
  (void)state;
  char req[512], buf[8192];
  static const char *const codings[] = {"gzip", "br", "zstd, gzip", "x"};
  for (size_t i = 0; i < sizeof codings / sizeof *codings; i++) {
    snprintf(req, sizeof req,
             "PUT /v1/blobs/%s HTTP/1.1\r\nHost: localhost"
             "\r\nContent-Encoding: %s\r\nContent-Length: 5\r\n"
             "Connection: close\r\n\r\nhello",
             DIGEST, codings[i]);
    raw_exchange(S.port, req, buf, sizeof buf, 3000);
    assert_int_equal(raw_status(buf), 415);
    assert_non_null(strstr(buf, "\"unsupported_media_type\""));
  }
  /* zstd is for blobs only: a manifest or lookup is JSON as it comes */
  raw_exchange(S.port,
               "POST /v1/lookup HTTP/1.1\r\nHost: localhost\r\n"
               "Content-Encoding: zstd\r\nContent-Length: 11\r\nConnection:"
               " close\r\n\r\n{\"keys\":[]}",
               buf, sizeof buf, 3000);
  assert_int_equal(raw_status(buf), 415);
  raw_exchange(S.port,
               "POST /v1/lookup HTTP/1.1\r\nHost: localhost\r\n"
               "Content-Encoding: identity \r\nContent-Length: 11\r\n"
               "Connection: close\r\n\r\n{\"keys\":[]}",
               buf, sizeof buf, 3000);
  assert_int_equal(raw_status(buf), 200);
  /* "hello" itself, declared identity: stored */
  snprintf(req, sizeof req,
           "PUT /v1/blobs/%s HTTP/1.1\r\nHost: localhost\r\n"
           "Content-Encoding: identity\r\nContent-Length: 5\r\n"
           "Connection: close\r\n\r\nhello",
           "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824");
  raw_exchange(S.port, req, buf, sizeof buf, 3000);
  assert_int_equal(raw_status(buf), 201);
}

/* Accept-Encoding: zstd;q=nan counted as accepting zstd (strtod's NaN is
 * not <= 0); only a valid qvalue above 0 does. */
static void t_zstd_qvalue(void **state) {
  (void)state;
  char body[65536], d[65], path[128];
  memset(body, 'z', sizeof body); /* compressible: held as a frame */
  kc_sha256_hex(body, sizeof body, d);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  kc_testsrv_resp r = kc_testsrv_http(
      NULL, S.url, path,
      (kc_testsrv_req){.method = "PUT", .body = body, .len = sizeof body});
  assert_true(r.status == 201 || r.status == 200);
  kc_testsrv_resp_free(&r);
  static const struct {
    const char *ae;
    int zstd;
  } cases[] = {{"zstd;q=nan", 0},   {"zstd;q=-1", 0},  {"zstd;q=0", 0},
               {"zstd;q=0.000", 0}, {"zstd;q=2", 0},   {"zstd;q=inf", 0},
               {"zstd", 1},         {"zstd;q=0.5", 1}, {"gzip, zstd;q=1.0", 1},
               {"zstd;q=0.001", 1}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char req[512], buf[8192];
    snprintf(req, sizeof req,
             "GET %s HTTP/1.1\r\nHost: localhost\r\n"
             "Accept-Encoding: %s\r\nConnection: close\r\n\r\n",
             path, cases[i].ae);
    raw_exchange(S.port, req, buf, sizeof buf, 3000);
    assert_int_equal(raw_status(buf), 200);
    int framed = strcasestr(buf, "\r\nContent-Encoding: zstd") != NULL;
    if (framed != cases[i].zstd)
      print_message("Accept-Encoding: %s\n%s\n", cases[i].ae, buf);
    assert_int_equal(framed, cases[i].zstd);
  }
}

/* Well-framed requests keep working, on one kept-alive connection: a
 * chunked lookup, then a GET. */
static void t_good_framing_kept_alive(void **state) {
  (void)state;
  int fd = kc_testsrv_connect(S.port);
  assert_true(fd >= 0);
  assert_int_equal(raw_send(fd,
                            "POST /v1/lookup HTTP/1.1\r\nHost: localhost\r\n"
                            "Transfer-Encoding: chunked\r\n\r\n"
                            "b\r\n{\"keys\":[]}\r\n0\r\n\r\n"),
                   0);
  char buf[8192];
  assert_int_equal(raw_read(fd, buf, sizeof buf, 500), 0); /* still open */
  assert_int_equal(raw_status(buf), 200);
  assert_int_equal(raw_send(fd, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n"
                                "Connection: close\r\n\r\n"),
                   0);
  assert_int_equal(raw_read(fd, buf, sizeof buf, 3000), 1);
  assert_int_equal(raw_status(buf), 200);
  close(fd);
}

/* A body whose bytes look like a header block, arriving after the request
 * before it on the same connection was answered: the scanner must follow
 * the request it belongs to (it follows bodies by their Content-Length),
 * not take it for the next header block. Before, it re-armed when the GET
 * completed, while libmicrohttpd already held the PUT's header lines but
 * for the block's last CRLF: it took that CRLF for an empty line before a
 * request and the PUT's body for headers, a false 400 and a closed
 * connection. */
static void t_pipelined_body_like_headers(void **state) {
  (void)state;
  static const char blob[] = "y\r\nContent-Length: 2x\r\n\r\n";
  char d[65], req[512], buf[8192];
  kc_sha256_hex(blob, sizeof blob - 1, d);
  int fd = kc_testsrv_connect(S.port);
  assert_true(fd >= 0);
  snprintf(req, sizeof req,
           "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
           "PUT /v1/blobs/%s HTTP/1.1\r\nHost: localhost\r\n"
           "Content-Length: %zu\r\n",
           d, sizeof blob - 1);
  assert_int_equal(raw_send(fd, req), 0);
  assert_int_equal(raw_read(fd, buf, sizeof buf, 500), 0); /* still open */
  assert_int_equal(raw_status(buf), 200);
  snprintf(req, sizeof req, "\r\n%s", blob); /* the block's end, the body */
  assert_int_equal(raw_send(fd, req), 0);
  assert_int_equal(raw_read(fd, buf, sizeof buf, 500), 0);
  if (raw_status(buf) != 201)
    print_message("answer:\n%s\n", buf);
  assert_int_equal(raw_status(buf), 201);
  /* and the header block after it is still scanned */
  refused_on(fd,
             "POST /v1/lookup HTTP/1.1\r\nHost: localhost"
             "\r\nContent-Length: 2x\r\n\r\n",
             400, "bad_request");
  close(fd);
}

/* After a chunked request the scanner follows the chunks, so a malformed
 * Content-Length on the same connection still gets one answer: it used to
 * stop scanning after a chunked body, and libmicrohttpd's doubled status
 * line came back (201, 400, 400). Chunk extensions, a trailer and chunks
 * split across sends are followed too. */
static void t_bad_length_after_chunked(void **state) {
  (void)state;
  static const char *const bodies[] = {
      "b\r\n{\"keys\":[]}\r\n0\r\n\r\n",
      "5;ext=1\r\n{\"key\r\n6\r\ns\":[]}\r\n0\r\nX-Trailer: 1\r\n\r\n",
      "B\n{\"keys\":[]}\n0\n\n",
  };
  for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) {
    int fd = kc_testsrv_connect(S.port);
    assert_true(fd >= 0);
    char buf[8192];
    const char *b = bodies[i];
    size_t half = strlen(b) / 2;
    assert_int_equal(raw_send(fd, "POST /v1/lookup HTTP/1.1\r\nHost: "
                                  "localhost\r\nTransfer-Encoding: "
                                  "chunked\r\n\r\n"),
                     0);
    assert_int_equal(send(fd, b, half, MSG_NOSIGNAL), (ssize_t)half);
    usleep(20000); /* the rest in a later recv */
    assert_int_equal(raw_send(fd, b + half), 0);
    assert_int_equal(raw_read(fd, buf, sizeof buf, 500), 0); /* still open */
    if (raw_status(buf) != 200)
      print_message("body %zu answered:\n%s\n", i, buf);
    assert_int_equal(raw_status(buf), 200);
    refused_on(fd,
               "POST /v1/lookup HTTP/1.1\r\nHost: localhost"
               "\r\nContent-Length: 1,1\r\n\r\n{}",
               400, "bad_request");
    close(fd);
  }
}

/* A --listen or --health-listen address another socket holds: the error
 * names it and why ("127.0.0.1:P: address already in use"), where
 * libmicrohttpd's line said "Failed to bind to port 0". */
static void t_listen_taken(void **state) {
  (void)state;
  char addr[64], want[128];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", S.port); /* S holds it */
  static const char *const flags[] = {"--listen", "--health-listen"};
  for (size_t i = 0; i < 2; i++) {
    kc_testsrv t = {0};
    const char *const args[] = {flags[i], addr, NULL};
    assert_int_not_equal(kc_testsrv_start(&t, args), 0);
    snprintf(want, sizeof want, "%s: address already in use (%s)", addr,
             flags[i]);
    if (kc_testsrv_log_count(&t, want, 0) != 1)
      kc_testsrv_show_log(&t, flags[i]);
    assert_int_equal(kc_testsrv_log_count(&t, want, 0), 1);
    assert_int_equal(kc_testsrv_log_count(&t, "port 0", 0), 0);
    kc_testsrv_cleanup(&t);
  }
}

/* The probe port's slots (32, 4 an address) against half-open requests
 * from 10 addresses, 5 sockets each, reconnected as soon as they are cut:
 * they held every slot, and 1 probe in 10 was answered. A probe from a new
 * address is answered each time now. */
#define FLOOD_ADDRS 10
#define FLOOD_EACH 5

static void flood_refill(int port, int *fds) {
  static const char half[] = "GET /healthz HTTP/1.1\r\n";
  for (int i = 0; i < FLOOD_ADDRS * FLOOD_EACH; i++) {
    if (fds[i] >= 0 && !raw_is_closed(fds[i]))
      continue;
    if (fds[i] >= 0)
      close(fds[i]);
    char src[32];
    snprintf(src, sizeof src, "127.0.0.%d", 2 + i / FLOOD_EACH);
    fds[i] = raw_connect_from(port, src);
    if (fds[i] >= 0)
      (void)!send(fds[i], half, sizeof half - 1, MSG_NOSIGNAL);
  }
}

static void t_probe_port_half_open(void **state) {
  (void)state;
  int hport = raw_free_port();
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", hport);
  kc_testsrv t = {0};
  const char *const args[] = {"--health-listen", addr, NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  int fds[FLOOD_ADDRS * FLOOD_EACH];
  for (int i = 0; i < FLOOD_ADDRS * FLOOD_EACH; i++)
    fds[i] = -1;
  int answered = 0;
  for (int probe = 0; probe < 10; probe++) {
    for (int round = 0; round < 3; round++) {
      flood_refill(hport, fds);
      kc_testsrv_sleep_ms(20);
    }
    char buf[4096] = "";
    int fd = raw_connect_from(hport, "127.0.0.12");
    if (fd >= 0 && raw_send(fd, "GET /healthz HTTP/1.1\r\nHost: "
                                "localhost\r\n\r\n") == 0)
      raw_read(fd, buf, sizeof buf, 2000);
    answered += raw_status(buf) == 200;
    if (fd >= 0)
      close(fd);
  }
  for (int i = 0; i < FLOOD_ADDRS * FLOOD_EACH; i++)
    if (fds[i] >= 0)
      close(fds[i]);
  print_message("probes from a new address answered: %d of 10\n", answered);
  if (answered != 10)
    kc_testsrv_show_log(&t, "probe port");
  assert_int_equal(answered, 10);
  assert_true(
      kc_testsrv_wait_log(&t, "probe-port connections waiting", 1, 3000));
  kc_testsrv_cleanup(&t);
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
      cmocka_unit_test(t_pipelined_body_like_headers),
      cmocka_unit_test(t_bad_length_after_chunked),
      cmocka_unit_test(t_listen_taken),
      cmocka_unit_test(t_probe_port_half_open),
      cmocka_unit_test(t_obs_fold),
      cmocka_unit_test(t_host_count),
      cmocka_unit_test(t_header_bytes),
      cmocka_unit_test(t_target_bytes),
      cmocka_unit_test(t_dns_rebinding),
      cmocka_unit_test(t_lease_needs_json),
      cmocka_unit_test(t_content_coding),
      cmocka_unit_test(t_zstd_qvalue),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
