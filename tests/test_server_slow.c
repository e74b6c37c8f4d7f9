/* test_server_slow.c: kcached against clients that hold connections: headers
 * sent one line at a time (each line restarts MHD's idle timer, so only
 * --header-timeout ends them), a body dripped the same way
 * (--min-body-rate), the per-address cap, and /healthz on --health-listen
 * while the main pool is used up. */
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "kc_schema.h"
#include "rawhttp.h"
#include "testsrv.h"

#define POOL 40
#define HEADER_TIMEOUT_S 2

static int get_status(int port, const char *path, int ms) {
  char req[256], buf[8192];
  snprintf(req, sizeof req,
           "GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
           path);
  raw_exchange(port, req, buf, sizeof buf, ms);
  return raw_status(buf);
}

/* Whether the server closed fd (EOF or reset), without waiting. */
static int is_closed(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  if (poll(&p, 1, 0) <= 0)
    return 0;
  char b[512];
  ssize_t r = recv(fd, b, sizeof b, MSG_DONTWAIT);
  return r <= 0;
}

/* 40 connections fill --max-connections 40, each sending a header line
 * every 400 ms. Without a header deadline they hold the pool until the
 * client stops (--timeout 30 never fires); with --header-timeout 2 each is
 * closed 2-3 s after it opened, and a normal request is served again. */
static void t_slow_headers(void **state) {
  (void)state;
  kc_testsrv t = {0};
  int hport = raw_free_port();
  char hl[64];
  snprintf(hl, sizeof hl, "127.0.0.1:%d", hport);
  /* per-ip 0: one address may fill the pool (no share of free slots) */
  const char *const args[] = {"--max-connections",
                              "40",
                              "--header-timeout",
                              "2",
                              "--timeout",
                              "30",
                              "--health-listen",
                              hl,
                              "--threads",
                              "2",
                              "--max-connections-per-ip",
                              "0",
                              NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  int fd[POOL];
  long opened[POOL], closed_at[POOL];
  for (int i = 0; i < POOL; i++) {
    fd[i] = kc_testsrv_connect(t.port);
    assert_true(fd[i] >= 0);
    opened[i] = kc_testsrv_now_ms();
    closed_at[i] = 0;
    raw_send(fd[i], "GET /healthz HTTP/1.1\r\n");
  }
  long t0 = kc_testsrv_now_ms();
  int probed = 0, left = POOL;
  while (left > 0 && kc_testsrv_now_ms() - t0 < 8000) {
    usleep(400 * 1000);
    for (int i = 0; i < POOL; i++) {
      if (closed_at[i])
        continue;
      if (is_closed(fd[i]) || raw_send(fd[i], "X-Slow: 1\r\n") != 0) {
        closed_at[i] = kc_testsrv_now_ms();
        left--;
      }
    }
    if (!probed && kc_testsrv_now_ms() - t0 > 800 && left == POOL) {
      /* the pool is full: the main port does not answer, the probe
       * listener does */
      probed = 1;
      assert_int_equal(get_status(t.port, "/healthz", 300), 0);
      long p0 = kc_testsrv_now_ms();
      assert_int_equal(get_status(hport, "/healthz", 1000), 200);
      assert_int_equal(get_status(hport, "/readyz", 1000), 200);
      print_message("pool full: /healthz on --health-listen in %ld ms\n",
                    kc_testsrv_now_ms() - p0);
    }
  }
  assert_true(probed);
  assert_int_equal(left, 0);
  long worst = 0;
  for (int i = 0; i < POOL; i++) {
    long held = closed_at[i] - opened[i];
    worst = held > worst ? held : worst;
    assert_true(held >= HEADER_TIMEOUT_S * 1000 - 100);
    assert_true(held <= HEADER_TIMEOUT_S * 1000 + 2000);
    close(fd[i]);
  }
  print_message("%d slow-header connections closed after at most %ld ms\n",
                POOL, worst);
  assert_int_equal(get_status(t.port, "/healthz", 2000), 200);
  char buf[65536];
  raw_exchange(hport,
               "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: "
               "close\r\n\r\n",
               buf, sizeof buf, 2000);
  assert_non_null(strstr(buf, "kcached_connections_cut_total"
                              "{reason=\"header_timeout\"} 40\n"));
  kc_testsrv_cleanup(&t);
}

/* Sends body in pieces of `piece` bytes every `every_ms` on fd (a blob PUT
 * whose headers are sent) for 8 s at most; returns ms until the server
 * closed fd, -1 if the whole body went out, -2 if neither in 8 s. */
static long drip_body(int fd, const char *body, size_t len, size_t piece,
                      int every_ms) {
  long t0 = kc_testsrv_now_ms();
  for (size_t off = 0; off < len; off += piece) {
    if (kc_testsrv_now_ms() - t0 > 8000)
      return -2;
    char buf[8192];
    size_t k = len - off < piece ? len - off : piece;
    memcpy(buf, body + off, k);
    buf[k] = '\0';
    if (is_closed(fd) || raw_send(fd, buf) != 0)
      return kc_testsrv_now_ms() - t0;
    usleep((useconds_t)every_ms * 1000);
  }
  return -1;
}

static int put_blob_head(int port, const char *digest, size_t len) {
  char head[512];
  int fd = kc_testsrv_connect(port);
  snprintf(head, sizeof head,
           "PUT /v1/blobs/%s HTTP/1.1\r\nHost: localhost\r\n"
           "Content-Length: %zu\r\n\r\n",
           digest, len);
  raw_send(fd, head);
  return fd;
}

/* --timeout 2 --min-body-rate 1K: a body of 25 bytes/s (a piece every
 * 400 ms: the idle timer never fires) is cut after a 2 s window; one of
 * 10 KiB/s goes through whole. */
static void t_slow_body(void **state) {
  (void)state;
  kc_testsrv t = {0};
  const char *const args[] = {"--timeout", "2", "--min-body-rate", "1K", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  static char body[40960];
  for (size_t i = 0; i < sizeof body; i++)
    body[i] = (char)('a' + i % 26);
  char digest[KC_HEX_LEN + 1];
  kc_sha256_hex(body, sizeof body, digest);
  int fd = put_blob_head(t.port, digest, sizeof body);
  long cut = drip_body(fd, body, sizeof body, 10, 400);
  close(fd);
  print_message("a 25 B/s body was cut after %ld ms\n", cut);
  assert_true(cut >= 1500 && cut <= 5000);
  fd = put_blob_head(t.port, digest, sizeof body);
  assert_int_equal(drip_body(fd, body, sizeof body, 4096, 400), -1);
  char buf[8192];
  raw_read(fd, buf, sizeof buf, 2000);
  assert_int_equal(raw_status(buf), 201);
  close(fd);
  kc_testsrv_cleanup(&t);
}

/* A request whose headers came in time is not cut by the deadline, nor is
 * a kept-alive connection that sends its next request in time. */
static void t_prompt_clients_unaffected(void **state) {
  (void)state;
  kc_testsrv t = {0};
  const char *const args[] = {"--header-timeout", "2", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  int fd = kc_testsrv_connect(t.port);
  char buf[8192];
  for (int i = 0; i < 3; i++) {
    usleep(1000 * 1000); /* 3 requests 1 s apart: 3 s on one connection */
    assert_int_equal(
        raw_send(fd, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"), 0);
    assert_int_equal(raw_read(fd, buf, sizeof buf, 300), 0);
    assert_int_equal(raw_status(buf), 200);
  }
  close(fd);
  kc_testsrv_cleanup(&t);
}

/* --max-connections-per-ip 5: the sixth connection from 127.0.0.1 is
 * closed unanswered, the five keep being served. */
static void t_per_ip_cap(void **state) {
  (void)state;
  kc_testsrv t = {0};
  const char *const args[] = {"--max-connections-per-ip", "5", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  usleep(200 * 1000); /* the readiness probe's connection is gone */
  int fd[5];
  for (int i = 0; i < 5; i++)
    assert_true((fd[i] = kc_testsrv_connect(t.port)) >= 0);
  usleep(200 * 1000);
  /* the kernel accepts; kcached closes */
  int extra = kc_testsrv_connect(t.port);
  assert_true(extra >= 0);
  raw_send(extra, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n");
  char buf[8192];
  int rc = raw_read(extra, buf, sizeof buf, 2000);
  assert_int_not_equal(rc, 0); /* closed or reset */
  assert_int_equal(raw_status(buf), 0);
  close(extra);
  for (int i = 0; i < 5; i++) {
    assert_int_equal(
        raw_send(fd[i], "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"), 0);
    raw_read(fd[i], buf, sizeof buf, 300);
    assert_int_equal(raw_status(buf), 200);
    close(fd[i]);
  }
  kc_testsrv_cleanup(&t);
}

/* --health-listen serves the probes and /metrics, nothing else. */
static void t_health_listener_routes(void **state) {
  (void)state;
  kc_testsrv t = {0};
  int hport = raw_free_port();
  char hl[64];
  snprintf(hl, sizeof hl, "127.0.0.1:%d", hport);
  const char *const args[] = {"--health-listen", hl, NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  assert_int_equal(get_status(hport, "/healthz", 2000), 200);
  assert_int_equal(get_status(hport, "/readyz", 2000), 200);
  assert_int_equal(get_status(hport, "/metrics", 2000), 200);
  assert_int_equal(get_status(hport, "/v1/stats", 2000), 404);
  assert_int_equal(get_status(t.port, "/v1/stats", 2000), 200);
  assert_int_equal(kc_testsrv_stop(&t), 0); /* both daemons stop cleanly */
  kc_testsrv_cleanup(&t);
}

/* Opens n connections from src to port, each sending the start of a
 * request and no more; returns how many the server kept open (fd[] holds
 * them all; the caller closes them). */
static int hold_from(int port, const char *src, int *fd, int n) {
  for (int i = 0; i < n; i++) {
    fd[i] = raw_connect_from(port, src);
    assert_true(fd[i] >= 0);
    raw_send(fd[i], "GET /healthz HTTP/1.1\r\n");
  }
  usleep(400 * 1000);
  int kept = 0;
  for (int i = 0; i < n; i++)
    kept += !raw_is_closed(fd[i]);
  return kept;
}

static void close_all(int *fd, int n) {
  for (int i = 0; i < n; i++)
    close(fd[i]);
}

/* --health-listen: 40 connections from one address held all 32 slots and
 * every probe failed; kept-alive probes held theirs. Now one address holds
 * at most 4, a probe from another is answered, and a probe's connection is
 * closed after its answer. */
static void t_health_port_share(void **state) {
  (void)state;
  kc_testsrv t = {0};
  int hport = raw_free_port();
  char hl[64];
  snprintf(hl, sizeof hl, "127.0.0.1:%d", hport);
  const char *const args[] = {"--health-listen", hl, "--header-timeout", "30",
                              NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  int fd[40];
  int kept = hold_from(hport, "127.0.0.2", fd, 40);
  print_message("one address kept %d of 40 probe-port connections\n", kept);
  assert_true(kept <= 4);
  int p = raw_connect_from(hport, "127.0.0.3");
  assert_true(p >= 0);
  raw_send(p, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n");
  char buf[8192];
  long t0 = kc_testsrv_now_ms();
  /* kept-alive by HTTP/1.1, yet closed after the answer */
  assert_int_equal(raw_read(p, buf, sizeof buf, 3000), 1);
  assert_true(kc_testsrv_now_ms() - t0 < 2000);
  assert_int_equal(raw_status(buf), 200);
  assert_non_null(strcasestr(buf, "\r\nConnection: close\r\n"));
  close(p);
  close_all(fd, 40);
  kc_testsrv_cleanup(&t);
}

/* The main port with --max-connections 40 and a per-address cap of 30:
 * two addresses that hold connections (and would reconnect as fast as the
 * header deadline cuts them) took all 40 slots, so a third address found
 * none. An address now gets less than half of the slots still free, and
 * the third is served. */
static void t_main_port_share(void **state) {
  (void)state;
  kc_testsrv t = {0};
  const char *const args[] = {"--max-connections",
                              "40",
                              "--max-connections-per-ip",
                              "30",
                              "--header-timeout",
                              "30",
                              NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  usleep(200 * 1000); /* the readiness probe's connection is gone */
  int a[30], b[30];
  int ka = hold_from(t.port, "127.0.0.2", a, 30);
  int kb = hold_from(t.port, "127.0.0.3", b, 30);
  print_message("kept: %d from the first address, %d from the second\n", ka,
                kb);
  assert_true(ka < 20 && kb < 20);
  assert_true(ka + kb < 40);
  int c = raw_connect_from(t.port, "127.0.0.4");
  assert_true(c >= 0);
  raw_send(c, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n"
              "Connection: close\r\n\r\n");
  char buf[8192];
  raw_read(c, buf, sizeof buf, 3000);
  assert_int_equal(raw_status(buf), 200);
  close(c);
  close_all(a, 30);
  close_all(b, 30);
  kc_testsrv_cleanup(&t);
}

#define MODEL "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"

/* Stores n bundles of 4096 files (all one 16-byte blob): manifests of about
 * 600 KB, whose keys go to keys[]. */
static void big_bundles(const kc_testsrv *t, int n, char (*keys)[65]) {
  static char digests[KC_MANIFEST_MAX_FILES][65];
  static uint64_t sizes[KC_MANIFEST_MAX_FILES];
  unsigned char *blob = kc_testsrv_bytes(7, 16);
  char path[128];
  kc_sha256_hex(blob, 16, digests[0]);
  snprintf(path, sizeof path, "/v1/blobs/%s", digests[0]);
  kc_testsrv_resp r = kc_testsrv_http(
      NULL, t->url, path,
      (kc_testsrv_req){.method = "PUT", .body = blob, .len = 16});
  assert_int_equal(r.status, 201);
  kc_testsrv_resp_free(&r);
  free(blob);
  for (int i = 0; i < KC_MANIFEST_MAX_FILES; i++) {
    memcpy(digests[i], digests[0], 65);
    sizes[i] = 16;
  }
  for (int b = 0; b < n; b++) {
    char *json = kc_testsrv_manifest(MODEL, (uint64_t)b + 1, "sm_90", digests,
                                     sizes, KC_MANIFEST_MAX_FILES, keys[b]);
    assert_non_null(json);
    snprintf(path, sizeof path, "/v1/bundles/%.64s", keys[b]);
    r = kc_testsrv_http(
        NULL, t->url, path,
        (kc_testsrv_req){.method = "PUT", .body = json, .len = strlen(json)});
    assert_int_equal(r.status, 201);
    kc_testsrv_resp_free(&r);
    free(json);
  }
}

static long rss_kb(pid_t pid) {
  char path[64], *s;
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  s = kc_testsrv_slurp(path);
  const char *v = s ? strstr(s, "VmRSS:") : NULL;
  long kb = v ? strtol(v + 6, NULL, 10) : -1;
  free(s);
  return kb;
}

#define READERS 24
#define BUNDLES 8

/* Readers that ask for a lookup and never read it: each answer (8 manifests
 * of 600 KB, 4.8 MB) stayed in memory until the client read or went away,
 * so many of them took gigabytes. With --max-answer-memory 16M the answers
 * held stop near 16 MB: later lookups get 503 busy with Retry-After, and
 * are served again once the readers are gone. */
static void t_unread_answers(void **state) {
  (void)state;
  kc_testsrv t = {0};
  const char *const args[] = {"--max-answer-memory", "16M", "--timeout", "60",
                              "--max-json-bytes",    "1M",  NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  static char keys[BUNDLES][65];
  big_bundles(&t, BUNDLES, keys);
  char body[BUNDLES * 70 + 32], req[sizeof body + 256];
  size_t off = (size_t)snprintf(body, sizeof body, "{\"keys\":[");
  for (int b = 0; b < BUNDLES; b++)
    off += (size_t)snprintf(body + off, sizeof body - off, "%s\"%s\"",
                            b ? "," : "", keys[b]);
  snprintf(body + off, sizeof body - off, "]}");
  snprintf(req, sizeof req,
           "POST /v1/lookup HTTP/1.1\r\nHost: localhost\r\n"
           "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
           strlen(body), body);
  long rss0 = rss_kb(t.pid);
  int fd[READERS];
  for (int i = 0; i < READERS; i++) {
    fd[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int small = 4096;
    setsockopt(fd[i], SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in to = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)t.port)};
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd[i], (struct sockaddr *)&to, sizeof to), 0);
    assert_int_equal(raw_send(fd[i], req), 0);
  }
  usleep(1000 * 1000);
  long rss1 = rss_kb(t.pid);
  print_message("%d unread 4.8 MB lookups: RSS %ld -> %ld KB\n", READERS, rss0,
                rss1);
  kc_testsrv_resp r = kc_testsrv_http(
      NULL, t.url, "/v1/lookup",
      (kc_testsrv_req){.method = "POST", .body = body, .len = strlen(body)});
  assert_int_equal(r.status, 503);
  assert_non_null(strstr(r.body, "\"busy\""));
  char ra[16];
  assert_true(kc_testsrv_header(&r, "Retry-After", ra, sizeof ra));
  kc_testsrv_resp_free(&r);
#if !defined(__SANITIZE_ADDRESS__)
  /* Not under ASan: its quarantine keeps freed memory resident (the 503
   * above shows the budget there). */
  assert_true(rss1 - rss0 < 64 * 1024); /* 24 x 4.8 MB would be 115 MB */
#endif
  close_all(fd, READERS);
  long t0 = kc_testsrv_now_ms();
  long status = 0;
  while (status != 200 && kc_testsrv_now_ms() - t0 < 5000) {
    r = kc_testsrv_http(
        NULL, t.url, "/v1/lookup",
        (kc_testsrv_req){.method = "POST", .body = body, .len = strlen(body)});
    status = r.status;
    kc_testsrv_resp_free(&r);
    if (status != 200)
      usleep(100 * 1000);
  }
  assert_int_equal(status, 200);
  kc_testsrv_cleanup(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_slow_headers),
      cmocka_unit_test(t_prompt_clients_unaffected),
      cmocka_unit_test(t_slow_body),
      cmocka_unit_test(t_per_ip_cap),
      cmocka_unit_test(t_health_port_share),
      cmocka_unit_test(t_main_port_share),
      cmocka_unit_test(t_unread_answers),
      cmocka_unit_test(t_health_listener_routes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
