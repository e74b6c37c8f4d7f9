/* test_s3.c: the S3 client (store/tier/kcs3.h) against a real Ceph RADOS
 * Gateway that this program starts with scripts/ceph-rgw.sh (installing the
 * packages when missing), plus offline cases against a fake HTTP server in a
 * thread.
 *
 * Exit 77 (ctest: skipped) when the Ceph packages cannot be installed, unless
 * CI=true: then a missing RGW fails. KC_TEST_S3_ENV=FILE uses an RGW that is
 * already running (FILE: the env file ceph-rgw.sh wrote) instead.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "kcs3.h"
#include "testrgw.h"

/* ---- the RGW (tests/testrgw.h) ---- */

static kc_testrgw g_rgw;
static char g_bucket[64];

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ---- helpers ---- */

static kcs3 *open_with(const char *bucket, const char *secret,
                       unsigned max_keys) {
  kcs3_opts o = {.endpoint = g_rgw.endpoint,
                 .bucket = bucket,
                 .region = g_rgw.region,
                 .path_style = 1,
                 .access_key = g_rgw.access,
                 .secret_key = secret,
                 .list_max_keys = max_keys};
  kcs3 *c = NULL;
  char err[KC_ERRBUF_SIZE] = "";
  kc_err e = kcs3_open(&o, &c, err);
  if (e != KC_OK)
    fail_msg("kcs3_open: %s", err);
  return c;
}

static kcs3 *open_rgw(void) { return open_with(g_bucket, g_rgw.secret, 0); }

static void put_ok(kcs3 *c, const char *key, const char *text, char *etag) {
  char err[KC_ERRBUF_SIZE] = "";
  kc_err e = kcs3_put(c, key, text, strlen(text), NULL, etag, err);
  if (e != KC_OK)
    fail_msg("put %s: %s: %s", key, kc_err_name(e), err);
}

static void expect_text(kcs3 *c, const char *key, const char *text) {
  void *data = NULL;
  size_t len = 0;
  char err[KC_ERRBUF_SIZE] = "";
  kc_err e = kcs3_get(c, key, 1 << 20, &data, &len, NULL, err);
  if (e != KC_OK)
    fail_msg("get %s: %s", key, err);
  assert_int_equal(len, strlen(text));
  assert_memory_equal(data, text, len);
  free(data);
}

/* ---- tests against the RGW ---- */

static int rgw_setup(void **state) {
  (void)state;
  char err[KC_ERRBUF_SIZE] = "";
  snprintf(g_bucket, sizeof g_bucket, "kcache-test-%ld", (long)getpid());
  kcs3 *c = open_rgw();
  kc_err e = kcs3_bucket_create(c, err);
  if (e == KC_OK)
    e = kcs3_bucket_create(c, err); /* an owned bucket: still OK */
  kcs3_close(c);
  if (e != KC_OK)
    fprintf(stderr, "bucket create: %s: %s\n", kc_err_name(e), err);
  return e == KC_OK ? 0 : -1;
}

static void test_roundtrip(void **state) {
  (void)state;
  kcs3 *c = open_rgw();
  size_t n = 100 * 1024 + 7;
  unsigned char *bytes = malloc(n);
  assert_non_null(bytes);
  for (size_t i = 0; i < n; i++)
    bytes[i] = (unsigned char)(i * 2654435761u >> 13);
  char etag[KCS3_ETAG_MAX] = "", etag2[KCS3_ETAG_MAX] = "";
  char err[KC_ERRBUF_SIZE] = "";
  /* a key that needs URL encoding, signed the same way curl sends it */
  const char *key = "rt/dir/a b+c%d=e&f~.bin";
  assert_int_equal(kcs3_put(c, key, bytes, n, NULL, etag, err), KC_OK);
  assert_true(strlen(etag) > 2);
  void *got = NULL;
  size_t len = 0;
  assert_int_equal(kcs3_get(c, key, n, &got, &len, etag2, err), KC_OK);
  assert_int_equal(len, n);
  assert_memory_equal(got, bytes, n);
  assert_string_equal(etag, etag2);
  free(got);
  /* the same connection again: reuse, and a zero-byte object */
  assert_int_equal(kcs3_put(c, "rt/empty", "", 0, NULL, NULL, err), KC_OK);
  assert_int_equal(kcs3_get(c, "rt/empty", 10, &got, &len, NULL, err), KC_OK);
  assert_int_equal(len, 0);
  free(got);
  /* over the caller's cap: refused, nothing returned */
  assert_int_equal(kcs3_get(c, key, 1000, &got, &len, NULL, err), KC_TOO_LARGE);
  assert_null(got);
  free(bytes);
  kcs3_close(c);
}

typedef struct sink_state {
  unsigned char *buf;
  size_t len, cap;
  size_t refuse_after; /* 0: never */
} sink_state;

static kc_err collect(const void *data, size_t len, void *ud) {
  sink_state *s = ud;
  if (s->refuse_after && s->len + len > s->refuse_after)
    return KC_CORRUPT; /* what a hashing consumer says on a bad digest */
  if (s->len + len > s->cap)
    return KC_NOMEM;
  memcpy(s->buf + s->len, data, len);
  s->len += len;
  return KC_OK;
}

static void test_get_stream(void **state) {
  (void)state;
  kcs3 *c = open_rgw();
  size_t n = 3 * 1024 * 1024 + 11; /* several write callbacks */
  unsigned char *bytes = malloc(n);
  assert_non_null(bytes);
  for (size_t i = 0; i < n; i++)
    bytes[i] = (unsigned char)(i * 31 + (i >> 9));
  char err[KC_ERRBUF_SIZE] = "", etag[KCS3_ETAG_MAX], etag2[KCS3_ETAG_MAX];
  kcs3_put_opts big = {.unsigned_payload = 1};
  assert_int_equal(kcs3_put(c, "st/big", bytes, n, &big, etag, err), KC_OK);
  sink_state s = {.buf = malloc(n), .cap = n};
  uint64_t size = 0;
  assert_int_equal(
      kcs3_get_stream(c, "st/big", n, collect, &s, &size, etag2, err), KC_OK);
  assert_int_equal(size, n);
  assert_int_equal(s.len, n);
  assert_memory_equal(s.buf, bytes, n);
  assert_string_equal(etag, etag2);
  /* the consumer's refusal stops the transfer and is what comes back */
  sink_state r = {.buf = s.buf, .cap = n, .refuse_after = 100000};
  assert_int_equal(
      kcs3_get_stream(c, "st/big", n, collect, &r, NULL, NULL, err),
      KC_CORRUPT);
  assert_non_null(strstr(err, "KC_CORRUPT"));
  /* over the cap: refused before any byte (Content-Length) */
  sink_state t = {.buf = s.buf, .cap = n};
  assert_int_equal(
      kcs3_get_stream(c, "st/big", n - 1, collect, &t, NULL, NULL, err),
      KC_TOO_LARGE);
  assert_int_equal(t.len, 0);
  /* an error answer is parsed, not streamed */
  sink_state u = {.buf = s.buf, .cap = n};
  assert_int_equal(
      kcs3_get_stream(c, "st/missing", n, collect, &u, NULL, NULL, err),
      KC_NOT_FOUND);
  assert_int_equal(u.len, 0);
  assert_non_null(strstr(err, "NoSuchKey"));
  /* and the connection still works afterwards */
  put_ok(c, "st/after", "ok", NULL);
  free(s.buf);
  free(bytes);
  kcs3_close(c);
}

static void test_head(void **state) {
  (void)state;
  kcs3 *c = open_rgw();
  char etag[KCS3_ETAG_MAX], etag2[KCS3_ETAG_MAX], err[KC_ERRBUF_SIZE] = "";
  uint64_t size = 0;
  put_ok(c, "head/x", "hello world", etag);
  assert_int_equal(kcs3_head(c, "head/x", &size, etag2, err), KC_OK);
  assert_int_equal(size, 11);
  assert_string_equal(etag, etag2);
  assert_int_equal(kcs3_head(c, "head/missing", &size, NULL, err),
                   KC_NOT_FOUND);
  kcs3_close(c);
}

static void test_not_found(void **state) {
  (void)state;
  kcs3 *c = open_rgw();
  char err[KC_ERRBUF_SIZE] = "";
  void *data = NULL;
  size_t len = 0;
  assert_int_equal(kcs3_get(c, "nf/missing", 100, &data, &len, NULL, err),
                   KC_NOT_FOUND);
  assert_non_null(strstr(err, "NoSuchKey"));
  assert_null(data);
  /* deleting what is not there is not an error (S3's 204) */
  assert_int_equal(kcs3_delete(c, "nf/missing", err), KC_OK);
  kcs3_close(c);
  /* a bucket that does not exist says so */
  c = open_with("kcache-no-such-bucket", g_rgw.secret, 0);
  assert_int_equal(kcs3_get(c, "x", 100, &data, &len, NULL, err), KC_NOT_FOUND);
  assert_non_null(strstr(err, "NoSuchBucket"));
  kcs3_close(c);
}

static void test_if_none_match(void **state) {
  (void)state;
  kcs3 *a = open_rgw(), *b = open_rgw(); /* two writers, two connections */
  kcs3_put_opts once = {.if_none_match = 1};
  char err[KC_ERRBUF_SIZE] = "";
  assert_int_equal(kcs3_put(a, "inm/k", "first", 5, &once, NULL, err), KC_OK);
  assert_int_equal(kcs3_put(b, "inm/k", "second", 6, &once, NULL, err),
                   KC_CONFLICT);
  assert_non_null(strstr(err, "412"));
  assert_non_null(strstr(err, "PreconditionFailed"));
  expect_text(a, "inm/k", "first");
  kcs3_close(a);
  kcs3_close(b);
}

static void test_if_match(void **state) {
  (void)state;
  kcs3 *c = open_rgw();
  char e1[KCS3_ETAG_MAX], e2[KCS3_ETAG_MAX], err[KC_ERRBUF_SIZE] = "";
  put_ok(c, "im/lease", "holder-a", e1);
  kcs3_put_opts take = {.if_match = e1};
  assert_int_equal(kcs3_put(c, "im/lease", "holder-b", 8, &take, e2, err),
                   KC_OK);
  assert_string_not_equal(e1, e2);
  /* a third writer still holding the first ETag loses */
  assert_int_equal(kcs3_put(c, "im/lease", "holder-c", 8, &take, NULL, err),
                   KC_CONFLICT);
  expect_text(c, "im/lease", "holder-b");
  kcs3_close(c);
}

typedef struct seen {
  int n, stop_after;
  char keys[16][64];
  uint64_t sizes[16];
} seen;

static int on_entry(const kcs3_entry *e, void *ud) {
  seen *s = ud;
  if (s->n < 16) {
    snprintf(s->keys[s->n], sizeof s->keys[0], "%s", e->key);
    s->sizes[s->n] = e->size;
  }
  s->n++;
  return s->stop_after && s->n >= s->stop_after;
}

static void test_list_pages(void **state) {
  (void)state;
  kcs3 *c = open_with(g_bucket, g_rgw.secret, 2); /* 2 keys a page */
  char err[KC_ERRBUF_SIZE] = "";
  const char *keys[] = {"ls/a", "ls/b", "ls/c/d", "ls/e", "ls/f"};
  for (size_t i = 0; i < 5; i++)
    put_ok(c, keys[i], keys[i], NULL);
  put_ok(c, "lt/outside", "x", NULL);
  seen s = {0};
  assert_int_equal(kcs3_list(c, "ls/", on_entry, &s, err), KC_OK);
  assert_int_equal(s.n, 5);
  for (int i = 0; i < 5; i++) {
    assert_string_equal(s.keys[i], keys[i]);
    assert_int_equal(s.sizes[i], strlen(keys[i]));
  }
  seen stop = {.stop_after = 3};
  assert_int_equal(kcs3_list(c, "ls/", on_entry, &stop, err), KC_OK);
  assert_int_equal(stop.n, 3);
  seen none = {0};
  assert_int_equal(kcs3_list(c, "nothing-here/", on_entry, &none, err), KC_OK);
  assert_int_equal(none.n, 0);
  kcs3_close(c);
}

static void test_delete(void **state) {
  (void)state;
  kcs3 *c = open_rgw();
  char err[KC_ERRBUF_SIZE] = "";
  put_ok(c, "del/x", "bye", NULL);
  assert_int_equal(kcs3_delete(c, "del/x", err), KC_OK);
  assert_int_equal(kcs3_head(c, "del/x", NULL, NULL, err), KC_NOT_FOUND);
  kcs3_close(c);
}

static void test_payload_sha(void **state) {
  (void)state;
  kcs3 *c = open_rgw();
  char err[KC_ERRBUF_SIZE] = "";
  /* the caller's digest is sent as the payload hash, and RGW checks it */
  kcs3_put_opts right = {
      .sha256_hex =
          "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9"};
  assert_int_equal(kcs3_put(c, "sha/ok", "hello world", 11, &right, NULL, err),
                   KC_OK);
  kcs3_put_opts wrong = {
      .sha256_hex =
          "0000000000000000000000000000000000000000000000000000000000000000"};
  kc_err e = kcs3_put(c, "sha/bad", "hello world", 11, &wrong, NULL, err);
  assert_int_equal(e, KC_PROTOCOL);
  assert_false(kcs3_retryable(e));
  assert_int_equal(kcs3_head(c, "sha/bad", NULL, NULL, err), KC_NOT_FOUND);
  kcs3_close(c);
}

/* Virtual-host URLs against the real RGW (its rgw_dns_name is localhost). */
static void test_virtual_host(void **state) {
  (void)state;
  char ep[160], err[KC_ERRBUF_SIZE] = "";
  const char *port = strrchr(g_rgw.endpoint, ':');
  assert_non_null(port);
  snprintf(ep, sizeof ep, "http://localhost%s", port);
  kcs3_opts o = {.endpoint = ep,
                 .bucket = g_bucket,
                 .region = g_rgw.region,
                 .path_style = 0,
                 .access_key = g_rgw.access,
                 .secret_key = g_rgw.secret};
  kcs3 *c = NULL;
  assert_int_equal(kcs3_open(&o, &c, err), KC_OK);
  put_ok(c, "vh/x", "virtual", NULL);
  expect_text(c, "vh/x", "virtual");
  kcs3_close(c);
  /* and the path-style handle sees the same object */
  c = open_rgw();
  expect_text(c, "vh/x", "virtual");
  kcs3_close(c);
}

static void test_wrong_secret(void **state) {
  (void)state;
  const char *bad = "not-the-secret-0123456789abcdef";
  kcs3 *c = open_with(g_bucket, bad, 0);
  char err[KC_ERRBUF_SIZE] = "";
  kc_err e = kcs3_put(c, "auth/x", "x", 1, NULL, NULL, err);
  assert_int_equal(e, KC_PROTOCOL);
  assert_non_null(strstr(err, "SignatureDoesNotMatch"));
  assert_non_null(strstr(err, "403"));
  assert_null(strstr(err, bad));
  assert_null(strstr(err, g_rgw.secret));
  kcs3_close(c);
}

/* ---- offline: a fake HTTP server in a thread ---- */

typedef struct fake {
  int fd, port;
  const char *answer; /* the whole response; NULL: read and never answer */
  volatile int stop;
  pthread_t th;
  char req[8192]; /* the last request as received (head and a bit) */
  int accepts, requests;
} fake;

/* Reads one request's head, and a small body that came with it. */
static void read_head(int fd, char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = '\0';
  while (n < cap - 1) {
    ssize_t r = recv(fd, buf + n, cap - 1 - n, 0);
    if (r <= 0)
      return;
    n += (size_t)r;
    buf[n] = '\0';
    if (strstr(buf, "\r\n\r\n"))
      return;
  }
}

static void *fake_main(void *ud) {
  fake *f = ud;
  while (!f->stop) {
    struct pollfd p = {f->fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0)
      continue;
    int cfd = accept(f->fd, NULL, NULL);
    if (cfd < 0)
      continue;
    f->accepts++;
    read_head(cfd, f->req, sizeof f->req);
    /* keep-alive answers: serve further requests on the same connection */
    while (f->answer && f->req[0] && !f->stop) {
      f->requests++;
      if (send(cfd, f->answer, strlen(f->answer), MSG_NOSIGNAL) < 0 ||
          strstr(f->answer, "Connection: close"))
        break;
      read_head(cfd, f->req, sizeof f->req);
    }
    if (!f->answer) {
      while (!f->stop)
        usleep(20 * 1000); /* hang: the client's timeout must fire */
    }
    close(cfd);
  }
  return NULL;
}

static int listen_any(int *port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  socklen_t len = sizeof a;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
      listen(fd, 16) != 0 || getsockname(fd, (struct sockaddr *)&a, &len) != 0)
    fail_msg("cannot listen on loopback");
  *port = ntohs(a.sin_port);
  return fd;
}

static void fake_start(fake *f, const char *answer) {
  memset(f, 0, sizeof *f);
  f->answer = answer;
  f->fd = listen_any(&f->port);
  assert_int_equal(pthread_create(&f->th, NULL, fake_main, f), 0);
}

static void fake_stop(fake *f) {
  f->stop = 1;
  pthread_join(f->th, NULL);
  close(f->fd);
}

static kcs3 *open_port(int port, long timeout_ms) {
  char ep[64];
  snprintf(ep, sizeof ep, "http://127.0.0.1:%d", port);
  kcs3_opts o = {.endpoint = ep,
                 .bucket = "fake-bucket",
                 .path_style = 1,
                 .access_key = "AKIDEXAMPLE",
                 .secret_key = "secret-example",
                 .connect_timeout_ms = 1000,
                 .timeout_ms = timeout_ms};
  kcs3 *c = NULL;
  assert_int_equal(kcs3_open(&o, &c, NULL), KC_OK);
  return c;
}

static void test_unreachable(void **state) {
  (void)state;
  int port;
  close(listen_any(&port)); /* a loopback port nobody listens on now */
  kcs3 *c = open_port(port, 5000);
  char err[KC_ERRBUF_SIZE] = "";
  double t0 = now_s();
  kc_err e = kcs3_head(c, "k", NULL, NULL, err);
  assert_int_equal(e, KC_UNAVAILABLE);
  assert_true(now_s() - t0 < 1.0);
  assert_true(kcs3_retryable(e));
  assert_non_null(strstr(err, "fake-bucket/k"));
  kcs3_close(c);
}

static void test_timeout(void **state) {
  (void)state;
  fake f;
  fake_start(&f, NULL);
  kcs3 *c = open_port(f.port, 300);
  char err[KC_ERRBUF_SIZE] = "";
  double t0 = now_s();
  assert_int_equal(kcs3_head(c, "k", NULL, NULL, err), KC_TIMEOUT);
  assert_true(now_s() - t0 < 3.0);
  kcs3_close(c);
  fake_stop(&f);
}

/* Lists against a fake answer; returns what kcs3_list said. */
static kc_err list_fake(const char *body, int *entries, char *err) {
  static char answer[4096];
  snprintf(answer, sizeof answer,
           "HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\n"
           "Connection: close\r\nContent-Length: %zu\r\n\r\n%s",
           strlen(body), body);
  fake f;
  fake_start(&f, answer);
  kcs3 *c = open_port(f.port, 2000);
  seen s = {0};
  kc_err e = kcs3_list(c, "p/", on_entry, &s, err);
  kcs3_close(c);
  fake_stop(&f);
  *entries = s.n;
  return e;
}

static void test_bad_xml(void **state) {
  (void)state;
  char err[KC_ERRBUF_SIZE] = "";
  int n = 0;
  /* a well-formed page parses */
  assert_int_equal(
      list_fake(
          "<?xml version=\"1.0\"?><ListBucketResult xmlns=\"http://s3."
          "amazonaws.com/doc/2006-03-01/\"><IsTruncated>false</IsTruncated>"
          "<Contents><Key>p/a&amp;b</Key><Size>3</Size><ETag>&quot;x&quot;"
          "</ETag></Contents></ListBucketResult>",
          &n, err),
      KC_OK);
  assert_int_equal(n, 1);
  const char *bad[] = {
      "<ListBucketResult><Contents><Key>p/a</Key>", /* cut short */
      "not xml at all",
      "<Other><Contents><Key>p/a</Key><Size>1</Size></Contents></Other>",
      ("<ListBucketResult><Contents><Key>p/a</Key><Size>-1</Size></Contents>"
       "</ListBucketResult>"),
      "<!DOCTYPE x [<!ENTITY a \"aaaa\">]><ListBucketResult/>",
      /* truncated, but no token to go on with: no endless loop */
      "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err[0] = '\0';
    assert_int_equal(list_fake(bad[i], &n, err), KC_PROTOCOL);
    assert_true(strlen(err) > 0);
  }
}

static void test_error_body(void **state) {
  (void)state;
  const char *body =
      "<?xml version=\"1.0\"?><Error><Code>SlowDown</Code><Message>Please "
      "reduce\nyour rate</Message><RequestId>r-1</RequestId></Error>";
  char answer[1024], err[KC_ERRBUF_SIZE] = "";
  snprintf(answer, sizeof answer,
           "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
           "Connection: close\r\nContent-Length: %zu\r\n\r\n%s",
           strlen(body), body);
  fake f;
  fake_start(&f, answer);
  kcs3 *c = open_port(f.port, 2000);
  kc_err e = kcs3_put(c, "k", "v", 1, NULL, NULL, err);
  assert_int_equal(e, KC_IO);
  assert_true(kcs3_retryable(e));
  assert_non_null(strstr(err, "503 SlowDown: Please reduce?your rate"));
  assert_non_null(strstr(err, "r-1"));
  kcs3_close(c);
  fake_stop(&f);
}

/* What goes on the wire: virtual-host URL, encoded key, signed payload hash,
 * Content-Length, the condition; the secret never. */
static void test_request_shape(void **state) {
  (void)state;
  const char *answer = "HTTP/1.1 200 OK\r\nETag: \"abc123\"\r\n"
                       "Content-Length: 0\r\nConnection: close\r\n\r\n";
  fake f;
  fake_start(&f, answer);
  char ep[64], etag[KCS3_ETAG_MAX] = "", err[KC_ERRBUF_SIZE] = "";
  /* curl resolves *.localhost to loopback itself: no DNS needed */
  snprintf(ep, sizeof ep, "http://localhost:%d", f.port);
  kcs3_opts o = {.endpoint = ep,
                 .bucket = "fake-bucket",
                 .region = "kc-1",
                 .access_key = "AKIDEXAMPLE",
                 .secret_key = "secret-example"};
  kcs3 *c = NULL;
  assert_int_equal(kcs3_open(&o, &c, err), KC_OK);
  kcs3_put_opts once = {.if_none_match = 1};
  kc_err e = kcs3_put(c, "dir/a b", "hello", 5, &once, etag, err);
  if (e != KC_OK)
    fail_msg("put: %s", err);
  assert_string_equal(etag, "abc123"); /* unquoted */
  char host[96];
  snprintf(host, sizeof host, "Host: fake-bucket.localhost:%d\r\n", f.port);
  const char *want[] = {
      "PUT /dir/a%20b HTTP/1.1\r\n",
      host,
      "If-None-Match: *\r\n",
      "Content-Length: 5\r\n",
      "x-amz-content-sha256: "
      "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824\r\n",
      "Credential=AKIDEXAMPLE/",
      "/kc-1/s3/aws4_request",
      "SignedHeaders=content-type;host;if-none-match;x-amz-content-sha256;"
      "x-amz-date"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    if (!strstr(f.req, want[i]))
      fail_msg("request lacks '%s':\n%s", want[i], f.req);
  assert_null(strstr(f.req, "secret-example"));
  kcs3_close(c);
  fake_stop(&f);
}

/* One handle, one connection: three requests, one accept. */
static void test_connection_reuse(void **state) {
  (void)state;
  const char *answer = "HTTP/1.1 200 OK\r\nETag: \"e\"\r\n"
                       "Content-Length: 3\r\n\r\n";
  fake f;
  fake_start(&f, answer);
  kcs3 *c = open_port(f.port, 2000);
  uint64_t size = 0;
  for (int i = 0; i < 3; i++)
    assert_int_equal(kcs3_head(c, "k", &size, NULL, NULL), KC_OK);
  assert_int_equal(size, 3);
  kcs3_close(c); /* closes the connection: the fake's read ends */
  fake_stop(&f);
  assert_int_equal(f.requests, 3);
  assert_int_equal(f.accepts, 1);
}

static void test_bad_options(void **state) {
  (void)state;
  kcs3 *c = NULL;
  kcs3_opts o = {.endpoint = "http://127.0.0.1:1",
                 .bucket = "ab",
                 .access_key = "a",
                 .secret_key = "s",
                 .path_style = 1};
  assert_int_equal(kcs3_open(&o, &c, NULL), KC_EINVAL); /* bucket < 3 */
  o.bucket = "kc-ok";
  o.endpoint = "ftp://x";
  assert_int_equal(kcs3_open(&o, &c, NULL), KC_EINVAL);
  o.endpoint = "http://h/sub";
  o.path_style = 0;
  assert_int_equal(kcs3_open(&o, &c, NULL), KC_EINVAL);
  o.path_style = 1;
  o.secret_key = "";
  assert_int_equal(kcs3_open(&o, &c, NULL), KC_EINVAL);
  o.secret_key = "s";
  assert_int_equal(kcs3_open(&o, &c, NULL), KC_OK);
  char err[KC_ERRBUF_SIZE];
  kcs3_put_opts inj = {.if_match = "\"x\"\r\nX-Evil: 1"};
  assert_int_equal(kcs3_put(c, "k", "v", 1, &inj, NULL, err), KC_EINVAL);
  assert_int_equal(kcs3_put(c, "", "v", 1, NULL, NULL, err), KC_EINVAL);
  kcs3_close(c);
  kcs3_close(NULL);
}

int main(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const struct CMUnitTest offline[] = {
      cmocka_unit_test(test_bad_options),
      cmocka_unit_test(test_unreachable),
      cmocka_unit_test(test_timeout),
      cmocka_unit_test(test_bad_xml),
      cmocka_unit_test(test_error_body),
      cmocka_unit_test(test_request_shape),
      cmocka_unit_test(test_connection_reuse),
  };
  const struct CMUnitTest rgw[] = {
      cmocka_unit_test(test_roundtrip),     cmocka_unit_test(test_get_stream),
      cmocka_unit_test(test_head),          cmocka_unit_test(test_not_found),
      cmocka_unit_test(test_if_none_match), cmocka_unit_test(test_if_match),
      cmocka_unit_test(test_list_pages),    cmocka_unit_test(test_delete),
      cmocka_unit_test(test_payload_sha),   cmocka_unit_test(test_virtual_host),
      cmocka_unit_test(test_wrong_secret),
  };
  int fails = cmocka_run_group_tests_name("s3_offline", offline, NULL, NULL);
  int up = kc_testrgw_up(&g_rgw, "test_s3");
  if (up == 0)
    fails += cmocka_run_group_tests_name("s3_rgw", rgw, rgw_setup, NULL);
  curl_global_cleanup();
  return kc_testrgw_finish(&g_rgw, up, fails);
}
