/* test_server_slowclient.c: clients at the pace of real networks against
 * the real kcached and the real store, on every GET path: small blobs
 * (copied), large ones (lent or in pieces), held compressed (the frame, or
 * decoded), the batched fetch, and the Redis protocol's GET.
 *
 * A client here reads at 1, 15 or 40 MB/s, or stalls mid-body and
 * resumes; some set TCP_MAXSEG 1400 and a small receive buffer before they
 * connect (the segments of a 1500-byte MTU, which loopback's 64 KiB MTU
 * hides). What every test checks of every answer: a 200 carries the whole
 * body, byte for byte, or the request was refused before its first byte
 * (a status other than 200); never a body cut short.
 *
 * - Paced readers of large blobs under a small --max-answer-memory: all
 *   whole, no loan cut. Before, a loan held past 500 ms whose copy the
 *   budget refused was cut mid-body.
 * - Stalled readers with --max-answer-memory 0 ("no cap"): what detaching
 *   their loans takes is bounded (the server's anonymous memory). Before,
 *   each stalled loan became a private copy of its blob.
 * - Unread GETs of small blobs (raw, and a zstd frame) and of a manifest
 *   at a 1500-byte MTU hold no read: none open a second later, and a store
 * churned through its --max-bytes refuses no write. Before, the read stayed
 * open until the client read.
 * - All of it at once, while a writer churns a small store: every body
 *   whole or refused up front, no write refused while the counted bytes
 *   are under the limit, the server's memory bounded. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "servertest.h"

#define MiB (1024u * 1024u)
#define KiB 1024u

/* ---- a client at a set pace, on a raw socket ---- */

typedef struct pace {
  double mbs;      /* MB/s it reads at; 0: as fast as it can */
  size_t stall_at; /* body bytes read before it stalls (0: never) */
  long stall_ms;   /* then it reads nothing for this long */
  int mtu1500;     /* TCP_MAXSEG 1400 and a small receive buffer */
} pace;

typedef struct client {
  /* asked */
  int port, resp; /* resp: a Redis protocol GET, else HTTP */
  char *req;      /* the request's bytes (malloc'd) */
  size_t req_len;
  const char *want; /* the body expected */
  size_t want_len;
  const char *alt; /* or this one, when the answer has its length (a fetch */
  size_t alt_len;  /* answer that found a blob missing: whole, not cut) */
  const char *cur; /* the one the last request's length picked */
  pace p;
  long start_ms; /* it starts this long after the others' start */
  const char *what;
  /* got, for the last request */
  long status; /* HTTP status; RESP: 200 for a bulk string, 500 an error */
  uint64_t clen;
  size_t got;
  int wrong; /* bytes other than want's */
  /* over every request it made */
  int whole, refused, cut;
} client;

static long now_ms(void) { return kc_testsrv_now_ms(); }

static int pace_connect(const client *c) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  if (c->p.mtu1500) { /* before connect: the SYN carries them */
    int mss = 1400, rcv = 4096;
    setsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &mss, sizeof mss);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv);
  }
  struct timeval tv = {20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_port = htons((uint16_t)c->port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) ||
      send(fd, c->req, c->req_len, MSG_NOSIGNAL) != (ssize_t)c->req_len) {
    close(fd);
    return -1;
  }
  return fd;
}

/* The answer's head: the HTTP status line and headers, or a RESP bulk
 * string's "$<n>" line. Body bytes read past it go to the body. */
static int read_head(client *c, int fd, char *body_out, size_t *n_body) {
  char h[8192];
  size_t n = 0;
  const char *sep = c->resp ? "\r\n" : "\r\n\r\n";
  char *end = NULL;
  while (!end && n < sizeof h - 1) {
    ssize_t k = recv(fd, h + n, sizeof h - 1 - n, 0);
    if (k <= 0)
      return -1;
    n += (size_t)k;
    h[n] = '\0';
    end = strstr(h, sep);
  }
  if (!end)
    return -1;
  if (c->resp) {
    c->status = h[0] == '$' && h[1] != '-' ? 200 : 500;
    c->clen = c->status == 200 ? strtoull(h + 1, NULL, 10) : 0;
  } else {
    c->status = strtol(h + 9, NULL, 10);
    for (char *p = h; p < end; p = strstr(p, "\r\n") + 2)
      if (strncasecmp(p, "Content-Length:", 15) == 0)
        c->clen = strtoull(p + 15, NULL, 10);
  }
  size_t off = (size_t)(end + strlen(sep) - h);
  *n_body = n - off;
  memcpy(body_out, h + off, *n_body);
  return 0;
}

/* Takes k body bytes: compared with what is wanted where they land. */
static void take(client *c, const char *p, size_t k) {
  if (k > c->clen - c->got)
    k = (size_t)(c->clen - c->got); /* RESP's closing CRLF */
  size_t wl = c->cur == c->alt ? c->alt_len : c->want_len;
  if (c->got + k > wl || memcmp(p, c->cur + c->got, k) != 0)
    c->wrong = 1;
  c->got += k;
}

/* Sleeps until the bytes read since (t0, base) are due at the pace. */
static void keep_pace(const client *c, long t0, size_t base) {
  if (c->p.mbs <= 0)
    return;
  long due = t0 + (long)((double)(c->got - base) / (c->p.mbs * 1e3));
  long wait = due - now_ms();
  if (wait > 0)
    kc_testsrv_sleep_ms(wait);
}

/* One request, read at the client's pace to the end of its body. */
static void request_once(client *c) {
  static _Thread_local char buf[16 * KiB];
  c->status = 0;
  c->clen = 0;
  c->got = 0;
  c->wrong = 0;
  int fd = pace_connect(c);
  size_t n = 0;
  if (fd < 0 || read_head(c, fd, buf, &n)) {
    if (fd >= 0)
      close(fd);
    c->status = 0;
    return;
  }
  c->cur = c->alt && c->clen == c->alt_len ? c->alt : c->want;
  if (c->status == 200)
    take(c, buf, n);
  long t0 = now_ms();
  size_t base = c->got;
  int stalled = 0;
  while (c->status == 200 && c->got < c->clen) {
    if (c->p.stall_at && !stalled && c->got >= c->p.stall_at) {
      kc_testsrv_sleep_ms(c->p.stall_ms);
      stalled = 1;
      t0 = now_ms();
      base = c->got;
    }
    ssize_t k = recv(fd, buf, sizeof buf, 0);
    if (k <= 0)
      break;
    take(c, buf, (size_t)k);
    keep_pace(c, t0, base);
  }
  close(fd);
}

/* Counts the last request: whole, refused before its body, or cut. */
static void count(client *c) {
  size_t wl = c->cur == c->alt ? c->alt_len : c->want_len;
  if (c->status == 200 && c->clen == wl && c->got == wl && !c->wrong)
    c->whole++;
  else if (c->status != 200 && c->status != 0)
    c->refused++;
  else {
    c->cut++;
    fprintf(stderr,
            "%s (%.0f MB/s, stall %ld ms, mtu1500 %d): status %ld, %zu of "
            "%llu bytes (want %zu)%s\n",
            c->what, c->p.mbs, c->p.stall_ms, c->p.mtu1500, c->status, c->got,
            (unsigned long long)c->clen, c->want_len,
            c->wrong ? ", wrong bytes" : "");
  }
}

/* ---- many clients at once ---- */

typedef struct crowd {
  client *c;
  size_t n;
  long t0, until;   /* each repeats its request until then (once at least) */
  int rounds;       /* and at most this many times */
  _Atomic int done; /* members finished */
} crowd;

typedef struct member {
  crowd *g;
  client *c;
} member;

static void *member_main(void *arg) {
  member *m = arg;
  client *c = m->c;
  long start = m->g->t0 + c->start_ms - now_ms();
  if (start > 0)
    kc_testsrv_sleep_ms(start);
  for (int i = 0; i < m->g->rounds; i++) {
    request_once(c);
    count(c);
    if (now_ms() >= m->g->until)
      break;
  }
  atomic_fetch_add(&m->g->done, 1);
  return NULL;
}

/* The server's anonymous memory (RssAnon) in bytes; 0 when unknown. */
static uint64_t rss_anon(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  uint64_t kb = 0;
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "RssAnon:", 8) == 0)
      kb = strtoull(line + 8, NULL, 10);
  if (f)
    fclose(f);
  return kb * 1024;
}

/* Runs the crowd; the server's peak anonymous memory meanwhile, sampled
 * every 50 ms. */
static uint64_t crowd_run(crowd *g, pid_t pid, long run_ms) {
  pthread_t *th = calloc(g->n, sizeof *th);
  member *m = calloc(g->n, sizeof *m);
  assert_true(th && m);
  g->t0 = now_ms();
  g->until = g->t0 + run_ms;
  for (size_t i = 0; i < g->n; i++) {
    m[i] = (member){g, &g->c[i]};
    assert_int_equal(pthread_create(&th[i], NULL, member_main, &m[i]), 0);
  }
  uint64_t peak = 0;
  while (atomic_load(&g->done) < (int)g->n) {
    uint64_t a = rss_anon(pid);
    peak = a > peak ? a : peak;
    kc_testsrv_sleep_ms(50);
  }
  for (size_t i = 0; i < g->n; i++)
    pthread_join(th[i], NULL);
  free(th);
  free(m);
  return peak;
}

/* Sums of the crowd; prints a line per client kind. */
static void crowd_sum(const crowd *g, int *whole, int *refused, int *cut) {
  *whole = *refused = *cut = 0;
  for (size_t i = 0; i < g->n; i++) {
    const client *c = &g->c[i];
    *whole += c->whole;
    *refused += c->refused;
    *cut += c->cut;
    printf("  %-22s %5.0f MB/s stall %4ld ms mtu1500 %d: %d whole, %d "
           "refused, %d cut\n",
           c->what, c->p.mbs, c->p.stall_ms, c->p.mtu1500, c->whole, c->refused,
           c->cut);
  }
}

static void crowd_free(crowd *g) {
  for (size_t i = 0; i < g->n; i++)
    free(g->c[i].req);
  free(g->c);
}

/* ---- requests ---- */

__attribute__((format(printf, 2, 3))) static char *
fmt_alloc(size_t *len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *s = malloc((size_t)n + 1);
  assert_non_null(s);
  va_start(ap, fmt);
  vsnprintf(s, (size_t)n + 1, fmt, ap);
  va_end(ap);
  *len = (size_t)n;
  return s;
}

static void get_blob(client *c, const char *digest, int zstd) {
  c->req = fmt_alloc(&c->req_len,
                     "GET /v1/blobs/%s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     "Connection: close\r\n%s\r\n",
                     digest, zstd ? "Accept-Encoding: zstd\r\n" : "");
}

static void get_fetch(client *c, const char *json) {
  c->req = fmt_alloc(&c->req_len,
                     "POST /v1/blobs/fetch HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     "Connection: close\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n%s",
                     strlen(json), json);
}

static void get_resp(client *c, const char *key) {
  c->resp = 1;
  c->req = fmt_alloc(&c->req_len, "*2\r\n$3\r\nGET\r\n$%zu\r\n%s\r\n",
                     strlen(key), key);
}

/* The bytes of a fetch answer of these blobs, as held raw (decoded). */
static char *fetch_body(char (*d)[65], const char *const *bytes,
                        const size_t *len, size_t n, size_t *out_len) {
  size_t total = 0;
  for (size_t i = 0; i < n; i++)
    total += 96 + len[i];
  char *b = malloc(total), *p = b;
  assert_non_null(b);
  for (size_t i = 0; i < n; i++) {
    p += sprintf(p, "%s %zu raw\n", d[i], len[i]);
    memcpy(p, bytes[i], len[i]);
    p += len[i];
  }
  *out_len = (size_t)(p - b);
  return b;
}

/* Bytes of 8 letters: the store keeps them compressed (to about 40%). */
static char *letters(size_t n, unsigned seed) {
  char *p = malloc(n);
  assert_non_null(p);
  fill_random(p, n, seed);
  for (size_t i = 0; i < n; i++)
    p[i] = (char)('a' + ((unsigned char)p[i] % 8));
  return p;
}

static int resp_port_of(const kc_testsrv *t) {
  static const char at_s[] = "RESP (Redis protocol) on 127.0.0.1:";
  char *log = kc_testsrv_slurp(t->log);
  const char *at = log ? strstr(log, at_s) : NULL;
  int port = at ? atoi(at + strlen(at_s)) : 0;
  free(log);
  return port;
}

/* SET key v over RESP; 0 when answered +OK. No asserts: the churner's
 * thread calls it. */
static int resp_set(int port, const char *key, const char *v, size_t n) {
  int fd = kc_testsrv_connect(port);
  char head[128], line[64] = "";
  int hl =
      snprintf(head, sizeof head, "*3\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%zu\r\n",
               strlen(key), key, n);
  int ok = fd >= 0 && send(fd, head, (size_t)hl, MSG_NOSIGNAL) == hl &&
           send(fd, v, n, MSG_NOSIGNAL) == (ssize_t)n &&
           send(fd, "\r\n", 2, MSG_NOSIGNAL) == 2 &&
           recv(fd, line, sizeof line - 1, 0) > 0 &&
           strcmp(line, "+OK\r\n") == 0;
  if (fd >= 0)
    close(fd);
  return ok ? 0 : -1;
}

/* ---- a writer that churns the store ---- */

typedef struct churner {
  const kc_testsrv *t;
  size_t blob;
  unsigned seed;
  int resp_port; /* and, every 8 writes, SETs this RESP key again (LRU */
  const char *key, *val; /* would evict it: its readers want it held) */
  size_t val_len;
  volatile int stop;
  int writes, full; /* 507 answers */
  int full_under;   /* of them, with the counted bytes under the limit */
  pthread_t th;
} churner;

/* One PUT on c; its status (0: no answer). */
static long churn_put(CURL *c, const churner *w, const char *path,
                      const void *p, size_t n) {
  resp r = kc_testsrv_http(c, w->t->url, path,
                           (req){.method = "PUT", .body = p, .len = n});
  long st = r.rc == CURLE_OK ? r.status : 0;
  kc_testsrv_resp_free(&r);
  return st;
}

/* A 507: were the counted bytes, with this write's, under the limit? */
static void churn_full(churner *w) {
  double used = kc_testsrv_metric(w->t, "kcached_store_bytes");
  double lim = kc_testsrv_metric(w->t, "kcached_store_limit_bytes");
  w->full++;
  if (used >= 0 && lim > 0 && used + (double)w->blob < lim) {
    w->full_under++;
    fprintf(stderr, "507 with %.0f of %.0f bytes counted\n", used, lim);
  }
}

/* Blobs of w->blob bytes, each named by a bundle of its own, until stop. */
static void *churn_main(void *arg) {
  churner *w = arg;
  CURL *c = curl_easy_init();
  char model[65], d[65], key[65], path[128];
  sha_hex("slow clients", 12, model);
  while (!w->stop && c) {
    unsigned char *b = kc_testsrv_bytes(w->seed++, w->blob);
    sha_hex(b, w->blob, d);
    snprintf(path, sizeof path, "/v1/blobs/%s", d);
    long st = churn_put(c, w, path, b, w->blob);
    free(b);
    uint64_t size = w->blob;
    char *json =
        st == 201 || st == 200
            ? kc_testsrv_manifest(model, w->seed, "sm_90a", &d, &size, 1, key)
            : NULL;
    if (json) {
      snprintf(path, sizeof path, "/v1/bundles/%s", key);
      st = churn_put(c, w, path, json, strlen(json));
      free(json);
    }
    w->writes++;
    if (st == 507)
      churn_full(w);
    if (w->resp_port && w->writes % 8 == 0)
      resp_set(w->resp_port, w->key, w->val, w->val_len);
    kc_testsrv_sleep_ms(10); /* churn, not a flood: about 50 writes/s */
  }
  curl_easy_cleanup(c);
  return NULL;
}

/* w->resp_port, key, val and val_len: set before, or zero. */
static void churn_start(churner *w, const kc_testsrv *t, size_t blob) {
  w->t = t;
  w->blob = blob;
  w->seed = 5000;
  assert_int_equal(pthread_create(&w->th, NULL, churn_main, w), 0);
}

static void churn_stop(churner *w) {
  w->stop = 1;
  pthread_join(w->th, NULL);
}

/* ---- large blobs read at a pace, a small answer budget ---- */

static client paced(const char *want, size_t n, const char *digest,
                    const char *what, pace p, long start_ms, int port) {
  client c = {.port = port,
              .want = want,
              .want_len = n,
              .p = p,
              .start_ms = start_ms,
              .what = what};
  get_blob(&c, digest, 0);
  return c;
}

static void t_large_paced_whole(void **state) {
  (void)state;
  kc_testsrv t = {0};
  const char *const args[] = {"--max-answer-memory", "16M", "--timeout", "60",
                              NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  size_t nl = 8 * MiB, nm = 2 * MiB;
  char *l = malloc(nl), *m = malloc(nm), dl[65], dm[65];
  fill_random(l, nl, 21);
  fill_random(m, nm, 22);
  assert_int_equal(put_blob(&t, NULL, l, nl, dl), 201);
  assert_int_equal(put_blob(&t, NULL, m, nm, dm), 201);
  enum { N = 20 };
  crowd g = {.c = calloc(N, sizeof(client)), .n = N, .rounds = 1};
  assert_non_null(g.c);
  for (int i = 0; i < N; i++) {
    pace p = {15, 0, 0, i % 2};
    const char *what = "8 MiB at 15 MB/s";
    if (i >= 10 && i < 14)
      p = (pace){40, 0, 0, i % 2}, what = "8 MiB at 40 MB/s";
    else if (i >= 14 && i < 18)
      p = (pace){40, 64 * KiB, 1500, i % 2}, what = "8 MiB, stalls 1.5 s";
    g.c[i] = i >= 18 ? paced(m, nm, dm, "2 MiB at 1 MB/s", (pace){1, 0, 0, 1},
                             50L * i, t.port)
                     : paced(l, nl, dl, what, p, 50L * i, t.port);
  }
  crowd_run(&g, t.pid, 0);
  int whole, refused, cut;
  printf("%d paced GETs of large blobs, --max-answer-memory 16M:\n", N);
  crowd_sum(&g, &whole, &refused, &cut);
  double cuts =
      kc_testsrv_metric(&t, "kcached_http_blob_loans_total{result=\"cut\"}");
  double det = kc_testsrv_metric(
      &t, "kcached_http_blob_loans_total{result=\"detached\"}");
  printf("  loans detached %.0f, cut %.0f\n", det, cuts);
  assert_int_equal(cut, 0);
  assert_int_equal(whole, N); /* a blob GET is never refused for memory */
  assert_true(cuts == 0);
  crowd_free(&g);
  free(l);
  free(m);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

/* ---- stalled readers, "no cap": detaching is bounded ---- */

static void t_detach_bounded(void **state) {
  (void)state;
  kc_testsrv t = {0};
  const char *const args[] = {
      "--max-answer-memory",      "0", "--timeout", "60",
      "--max-connections-per-ip", "0", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  size_t n = 24 * MiB;
  char *b = malloc(n), d[65];
  fill_random(b, n, 31);
  assert_int_equal(put_blob(&t, NULL, b, n, d), 201);
  uint64_t before = rss_anon(t.pid);
  if (!before) {
    free(b);
    kc_testsrv_stop(&t);
    kc_testsrv_cleanup(&t);
    skip(); /* no /proc to read the server's memory from */
  }
  enum { N = 24 };
  crowd g = {.c = calloc(N, sizeof(client)), .n = N, .rounds = 1};
  assert_non_null(g.c);
  /* 100 ms apart: loans taken back meanwhile make room for new ones */
  for (int i = 0; i < N; i++)
    g.c[i] = paced(b, n, d, "24 MiB, stalls 3 s", (pace){0, 32 * KiB, 3000, 0},
                   100L * i, t.port);
  uint64_t peak = crowd_run(&g, t.pid, 0);
  int whole, refused, cut;
  printf("%d stalled GETs of a 24 MiB blob, --max-answer-memory 0:\n", N);
  crowd_sum(&g, &whole, &refused, &cut);
  double det = kc_testsrv_metric(
      &t, "kcached_http_blob_loans_total{result=\"detached\"}");
  printf("  server anonymous memory %.0f MiB before, %.0f MiB at the peak; "
         "loans detached %.0f\n",
         (double)before / MiB, (double)peak / MiB, det);
  assert_int_equal(whole, N);
  /* 256 MiB of loans at most, and some slack; unbounded: 24 x 24 MiB */
  assert_true(peak < before + 320ull * MiB);
  crowd_free(&g);
  free(b);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

/* ---- unread small GETs at a 1500-byte MTU hold no read ---- */

static void t_small_mtu1500_no_pin(void **state) {
  (void)state;
  kc_testsrv t = {0};
  const char *const args[] = {"--max-bytes", "16M", "--timeout", "60", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  size_t n = 60 * KiB, nt = 140 * KiB; /* nt: its frame near 60 KiB */
  char *raw = malloc(n), *txt = letters(nt, 41), dr[65], dz[65];
  fill_random(raw, n, 40);
  assert_int_equal(put_blob(&t, NULL, raw, n, dr), 201);
  assert_int_equal(put_blob(&t, NULL, txt, nt, dz), 201);
  /* the compressed one's frame, as held (its length: what to expect) */
  char path[128], enc[32];
  snprintf(path, sizeof path, "/v1/blobs/%s", dz);
  resp fr = http(&t, path, (req){.header = "Accept-Encoding: zstd"});
  assert_int_equal(fr.status, 200);
  assert_true(header(&fr, "Content-Encoding", enc, sizeof enc));
  printf("a 140 KiB blob of letters, held compressed: a %zu-byte frame\n",
         fr.len);
  assert_true(fr.len <= 64 * KiB); /* sent whole from one read */
  /* and a manifest of about 63 KB: 435 files of the raw blob */
  enum { NF = 435 };
  char(*ds)[65] = calloc(NF, 65), key[65];
  uint64_t *sz = calloc(NF, sizeof *sz);
  assert_true(ds && sz);
  for (int i = 0; i < NF; i++)
    memcpy(ds[i], dr, 65), sz[i] = n;
  char *mj = make_manifest(MODEL_A, 7, "sm_90a", ds, sz, NF, key);
  snprintf(path, sizeof path, "/v1/bundles/%s", key);
  resp pr =
      http(&t, path, (req){.method = "PUT", .body = mj, .len = strlen(mj)});
  assert_int_equal(pr.status, 201);
  resp_free(&pr);
  printf("a manifest of %zu bytes\n", strlen(mj));
  assert_true(strlen(mj) <= 64 * KiB); /* sent whole from one read */
  enum { N = 4 };
  client c[N] = {
      {.port = t.port, .want = raw, .want_len = n, .what = "60 KiB raw"},
      {.port = t.port, .want = raw, .want_len = n, .what = "60 KiB raw"},
      {.port = t.port,
       .want = fr.body,
       .want_len = fr.len,
       .what = "a frame of about 60 KiB"},
      {.port = t.port,
       .want = mj,
       .want_len = strlen(mj),
       .what = "a manifest"}};
  int fd[N];
  for (int i = N - 1; i >= 0; i--) { /* the manifest first */
    c[i].p = (pace){0, 0, 0, 1};
    if (i == 3)
      c[i].req = fmt_alloc(&c[i].req_len,
                           "GET /v1/bundles/%s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           "Connection: close\r\n\r\n",
                           key);
    else
      get_blob(&c[i], i < 2 ? dr : dz, i == 2);
    fd[i] = pace_connect(&c[i]); /* sent, not read */
    assert_true(fd[i] >= 0);
  }
  kc_testsrv_sleep_ms(1200);
  double open = kc_testsrv_metric(&t, "kcached_store_reads_open");
  double oldest = kc_testsrv_metric(&t, "kcached_store_oldest_read_seconds");
  printf(
      "%d unread GETs of about 60 KiB at a 1500-byte MTU, 1.2 s on: reads open "
      "%.0f, the oldest %.3f s\n",
      N, open, oldest);
  assert_true(open == 0 && oldest >= 0 && oldest < 1.0);
  churner w = {0};
  churn_start(&w, &t, 1 * MiB);
  while (w.writes < 60)
    kc_testsrv_sleep_ms(50);
  churn_stop(&w);
  printf("then %d writes of 1 MiB through --max-bytes 16M: %d answered 507\n",
         w.writes, w.full);
  assert_int_equal(w.full, 0);
  for (int i = 0; i < N; i++) { /* now read: whole */
    char buf[16 * KiB];
    size_t k = 0;
    assert_int_equal(read_head(&c[i], fd[i], buf, &k), 0);
    c[i].got = 0;
    c[i].cur = c[i].want;
    take(&c[i], buf, k);
    ssize_t r;
    while (c[i].got < c[i].clen && (r = recv(fd[i], buf, sizeof buf, 0)) > 0)
      take(&c[i], buf, (size_t)r);
    close(fd[i]);
    count(&c[i]);
    assert_int_equal(c[i].whole, 1);
    free(c[i].req);
  }
  kc_testsrv_resp_free(&fr);
  free(mj);
  free(ds);
  free(sz);
  free(raw);
  free(txt);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

/* ---- every path at once, a writer churning a small store ---- */

typedef struct target {
  const char *what;
  const char *want;
  size_t len;
  const char *digest; /* HTTP GET; else */
  const char *fetch;  /* a fetch body; else a RESP key */
  int zstd;
  const char *alt; /* another whole answer */
  size_t alt_len;
} target;

static client of_target(const target *x, pace p, long start_ms, int port,
                        int resp_port) {
  client c = {.port = port,
              .want = x->want,
              .want_len = x->len,
              .p = p,
              .start_ms = start_ms,
              .what = x->what,
              .alt = x->alt,
              .alt_len = x->alt_len};
  if (x->digest)
    get_blob(&c, x->digest, x->zstd);
  else if (x->fetch)
    get_fetch(&c, x->fetch);
  else {
    c.port = resp_port;
    get_resp(&c, "slow:big");
  }
  return c;
}

static void t_every_path_churned(void **state) {
  (void)state;
  kc_testsrv t = {0};
  const char *const args[] = {
      "--max-bytes", "32M",           "--max-answer-memory", "8M", "--timeout",
      "60",          "--resp-listen", "127.0.0.1:0",         NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  int rport = resp_port_of(&t);
  assert_true(rport > 0);
  size_t ns = 60 * KiB, nl = 6 * MiB, nz = 3 * MiB, nv = 2 * MiB;
  char *s = malloc(ns), *l = malloc(nl), *z = letters(nz, 52), *v = malloc(nv);
  char d[3][65], key[65];
  fill_random(s, ns, 50);
  fill_random(l, nl, 51);
  fill_random(v, nv, 53);
  assert_int_equal(put_blob(&t, NULL, s, ns, d[0]), 201);
  assert_int_equal(put_blob(&t, NULL, l, nl, d[1]), 201);
  assert_int_equal(put_blob(&t, NULL, z, nz, d[2]), 201);
  /* the large one named by the oldest bundle: the churn evicts it */
  uint64_t size = nl;
  char *json = make_manifest(MODEL_A, 1, "sm_90a", &d[1], &size, 1, key);
  char path[128];
  snprintf(path, sizeof path, "/v1/bundles/%s", key);
  resp r =
      http(&t, path, (req){.method = "PUT", .body = json, .len = strlen(json)});
  assert_int_equal(r.status, 201);
  resp_free(&r);
  free(json);
  assert_int_equal(resp_set(rport, "slow:big", v, nv), 0);
  char fj[256];
  snprintf(fj, sizeof fj, "{\"digests\":[\"%s\",\"%s\",\"%s\"]}", d[0], d[2],
           d[1]);
  char fd3[3][65];
  memcpy(fd3[0], d[0], 65);
  memcpy(fd3[1], d[2], 65);
  memcpy(fd3[2], d[1], 65);
  const char *fb[3] = {s, z, l};
  size_t fl[3] = {ns, nz, nl}, nf;
  char *fbody = fetch_body(fd3, fb, fl, 3, &nf);
  /* the large one evicted before the fetch looked: marked missing */
  size_t na;
  char *a2 = fetch_body(fd3, fb, fl, 2, &na), *falt = malloc(na + 96);
  assert_non_null(falt);
  memcpy(falt, a2, na);
  na += (size_t)sprintf(falt + na, "%s 0 missing\n", d[1]);
  free(a2);
  snprintf(path, sizeof path, "/v1/blobs/%s", d[2]);
  resp fr = http(&t, path, (req){.header = "Accept-Encoding: zstd"});
  assert_int_equal(fr.status, 200);
  assert_true(fr.len < nz / 2); /* held compressed: the frame */
  const target x[] = {
      {"small 60 KiB", s, ns, d[0], NULL, 0, NULL, 0},
      {"large 6 MiB", l, nl, d[1], NULL, 0, NULL, 0},
      {"compressed, decoded", z, nz, d[2], NULL, 0, NULL, 0},
      {"compressed, its frame", fr.body, fr.len, d[2], NULL, 1, NULL, 0},
      {"fetch of 3 blobs", fbody, nf, NULL, fj, 0, falt, na},
      {"RESP GET 2 MiB", v, nv, NULL, NULL, 0, NULL, 0}};
  const pace ps[] = {{1, 0, 0, 1},
                     {15, 0, 0, 1},
                     {40, 0, 0, 0},
                     {15, 0, 0, 0},
                     {40, 64 * KiB, 1500, 1}};
  enum { NX = sizeof x / sizeof *x, NP = sizeof ps / sizeof *ps };
  crowd g = {.c = calloc(NX * NP, sizeof(client)), .n = NX * NP, .rounds = 4};
  assert_non_null(g.c);
  for (size_t i = 0; i < NX; i++)
    for (size_t j = 0; j < NP; j++) {
      pace p = ps[j];
      if (p.mbs == 1 && x[i].len > 2 * MiB)
        p.mbs = 4; /* 1 MB/s: small answers only, to keep the run short */
      g.c[i * NP + j] =
          of_target(&x[i], p, (long)(i * NP + j) * 40, t.port, rport);
    }
  churner w = {.resp_port = rport, .key = "slow:big", .val = v, .val_len = nv};
  churn_start(&w, &t, 1 * MiB);
  uint64_t before = rss_anon(t.pid);
  uint64_t peak = crowd_run(&g, t.pid, 6000);
  churn_stop(&w);
  int whole, refused, cut;
  printf("%zu clients, every GET path, while %d writes of 1 MiB churned "
         "--max-bytes 32M:\n",
         g.n, w.writes);
  crowd_sum(&g, &whole, &refused, &cut);
  printf("  %d whole, %d refused up front, %d cut; writes answered 507: %d "
         "(%d under the limit); server anonymous memory %.0f -> %.0f MiB\n",
         whole, refused, cut, w.full, w.full_under, (double)before / MiB,
         (double)peak / MiB);
  assert_int_equal(cut, 0);
  for (size_t i = 0; i < g.n; i++)
    assert_true(g.c[i].whole > 0); /* every kind answered, not only refused */
  assert_int_equal(w.full_under, 0);
  assert_true(w.writes > 20);
  if (before)
    assert_true(peak < before + 256ull * MiB);
  crowd_free(&g);
  kc_testsrv_resp_free(&fr);
  free(falt);
  free(fbody);
  free(s);
  free(l);
  free(z);
  free(v);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

int main(void) {
  /* An ASan kcached keeps freed memory in its quarantine (256 MiB by
   * default), which the memory bounds below would read as held answers:
   * capped for the servers this test starts, as the soak does. */
  const char *asan = getenv("ASAN_OPTIONS");
  char opts[1024];
  snprintf(opts, sizeof opts, "%s%squarantine_size_mb=32", asan ? asan : "",
           asan && *asan ? ":" : "");
  setenv("ASAN_OPTIONS", opts, 1);
  servertest_init();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_small_mtu1500_no_pin),
      cmocka_unit_test(t_large_paced_whole),
      cmocka_unit_test(t_detach_bounded),
      cmocka_unit_test(t_every_path_churned),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
