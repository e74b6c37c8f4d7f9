/* test_server_zstd.c: kcached with blobs held zstd-compressed:
 * GET with and without Accept-Encoding: zstd (small zero-copy and large
 * piece by piece), HEAD, ETag and If-None-Match, Vary, what each way counts
 * (no read left open); PUT raw and with Content-Encoding: zstd (plain and
 * chunked); corrupt and truncated frames and a decompression bomb answered
 * 4xx with nothing stored; stats and
 * /metrics raw and stored bytes; a store written with --compress-level 0
 * served by a server that compresses; the decoded cache (a second plain
 * GET from memory, its budget, concurrent GETs, a blob deleted by RESP DEL
 * is 404, a rotted frame never cached). The real kcached on loopback. */
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zstd.h>

#include "servertest.h"
#include "zstdframe.h"

static char *text_bytes(size_t n, unsigned seed) {
  char *p = malloc(n ? n : 1);
  assert_non_null(p);
  for (size_t i = 0; i < n;) {
    char w[64];
    int k = snprintf(w, sizeof w, "mov.u32 %%r%u, %%tid.x; // %zu\n", seed,
                     (i / 41) % 113);
    for (int j = 0; j < k && i < n; j++)
      p[i++] = w[j];
  }
  return p;
}

static void *frame_of(const void *p, size_t n, size_t *zlen) {
  size_t cap = ZSTD_compressBound(n);
  void *z = malloc(cap);
  *zlen = ZSTD_compress(z, cap, p, n, 3);
  assert_false(ZSTD_isError(*zlen));
  return z;
}

static resp get(const char *digest, int zstd, const char *method) {
  char path[128];
  snprintf(path, sizeof path, "/v1/blobs/%s", digest);
  return http(&S, path,
              (req){.method = method,
                    .header = zstd ? "Accept-Encoding: gzip, zstd" : NULL});
}

/* GET both ways and HEAD: the content comes back whichever way it is sent. */
static void expect_both_ways(const char *digest, const char *p, size_t n,
                             int held_compressed) {
  char v[128], etag[80];
  snprintf(etag, sizeof etag, "\"%s\"", digest);
  resp r = get(digest, 0, NULL);
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, n);
  assert_memory_equal(r.body, p, n);
  assert_false(header(&r, "Content-Encoding", v, sizeof v));
  assert_true(header(&r, "ETag", v, sizeof v));
  assert_string_equal(v, etag);
  resp_free(&r);
  r = get(digest, 1, NULL);
  assert_int_equal(r.status, 200);
  assert_true(header(&r, "ETag", v, sizeof v));
  assert_string_equal(v, etag);
  if (held_compressed) {
    assert_true(header(&r, "Content-Encoding", v, sizeof v));
    assert_string_equal(v, "zstd");
    assert_true(header(&r, "Vary", v, sizeof v));
    assert_string_equal(v, "Accept-Encoding");
    assert_true(r.len < n);
    char *out = malloc(n + 1);
    size_t got = ZSTD_decompress(out, n + 1, r.body, r.len);
    assert_false(ZSTD_isError(got));
    assert_int_equal(got, n);
    assert_memory_equal(out, p, n);
    free(out);
  } else {
    assert_false(header(&r, "Content-Encoding", v, sizeof v));
    assert_int_equal(r.len, n);
    assert_memory_equal(r.body, p, n);
  }
  resp_free(&r);
  r = get(digest, 1, "HEAD"); /* the content's length */
  assert_int_equal(r.status, 200);
  assert_true(header(&r, "Content-Length", v, sizeof v));
  assert_int_equal(strtoull(v, NULL, 10), n);
  assert_false(header(&r, "Content-Encoding", v, sizeof v));
  resp_free(&r);
}

static void t_compressible_roundtrip(void **state) {
  (void)state;
  size_t sizes[] = {12280, 70000, 3u << 20}; /* zero-copy, pieces, large */
  for (size_t i = 0; i < 3; i++) {
    char *p = text_bytes(sizes[i], (unsigned)i), d[65];
    assert_int_equal(put_blob(&S, NULL, p, sizes[i], d), 201);
    expect_both_ways(d, p, sizes[i], 1);
    free(p);
  }
  json_t *st = NULL;
  resp r = http(&S, "/v1/stats", (req){0});
  assert_int_equal(r.status, 200);
  st = body_json(&r);
  json_int_t used = json_integer_value(json_object_get(st, "bytes_used"));
  json_int_t raw = json_integer_value(json_object_get(st, "bytes_raw"));
  assert_true(raw >= (json_int_t)(12280 + 70000 + (3u << 20)));
  assert_true(used * 2 < raw);
  json_decref(st);
  resp_free(&r);
  assert_true(metric(&S, "kcached_store_raw_bytes") == (long)raw);
  assert_true(metric(&S, "kcached_zstd_frames_sent_total") >= 3);
}

/* What each way of a compressed blob's GET counts, all from the GET's one
 * read: a get hit (ops_total), a zstd GET, a frame sent when the frame
 * goes; a 304 only the hit. No read is left open once the answer is in. */
static void t_counts_per_way(void **state) {
  (void)state;
  const char *hit =
      "kcached_ops_total{op=\"get\",frontend=\"http\",result=\"hit\"}";
  size_t sizes[] = {12280, 3u << 20}; /* copied whole, larger than that */
  for (size_t i = 0; i < 2; i++) {
    char *p = text_bytes(sizes[i], 60 + (unsigned)i), d[65], inm[128],
         path[128];
    assert_int_equal(put_blob(&S, NULL, p, sizes[i], d), 201);
    snprintf(inm, sizeof inm, "If-None-Match: \"%s\"", d);
    snprintf(path, sizeof path, "/v1/blobs/%s", d);
    struct {
      const char *method, *header;
      int status;
      long gets, frames;
      size_t len;
    } ways[] = {
        {NULL, "Accept-Encoding: zstd", 200, 1, 1, 0},
        {NULL, NULL, 200, 1, 0, sizes[i]}, /* fills the decoded cache */
        {NULL, NULL, 200, 1, 0, sizes[i]}, /* from it */
        {"HEAD", "Accept-Encoding: zstd", 200, 1, 0, 0},
        {NULL, inm, 304, 0, 0, 0},
    };
    for (size_t w = 0; w < sizeof ways / sizeof *ways; w++) {
      long h0 = metric(&S, hit), g0 = metric(&S, "kcached_zstd_gets_total"),
           f0 = metric(&S, "kcached_zstd_frames_sent_total");
      resp r = http(&S, path,
                    (req){.method = ways[w].method, .header = ways[w].header});
      assert_int_equal(r.status, ways[w].status);
      if (ways[w].len)
        assert_memory_equal(r.body, p, ways[w].len);
      resp_free(&r);
      assert_int_equal(metric(&S, hit), h0 + 1);
      assert_int_equal(metric(&S, "kcached_zstd_gets_total"),
                       g0 + ways[w].gets);
      assert_int_equal(metric(&S, "kcached_zstd_frames_sent_total"),
                       f0 + ways[w].frames);
      assert_int_equal(
          kc_testsrv_metric_settle(&S, "kcached_store_reads_open", 0, 5000), 0);
    }
    free(p);
  }
}

static void t_not_modified(void **state) {
  (void)state;
  char *p = text_bytes(5000, 9), d[65], inm[128], path[128];
  assert_int_equal(put_blob(&S, NULL, p, 5000, d), 201);
  snprintf(inm, sizeof inm, "If-None-Match: \"%s\"", d);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(&S, path, (req){.header = inm});
  assert_int_equal(r.status, 304);
  resp_free(&r);
  free(p);
}

static void t_incompressible_and_empty(void **state) {
  (void)state;
  char *p = malloc(100000), d[65];
  fill_random(p, 100000, 77);
  assert_int_equal(put_blob(&S, NULL, p, 100000, d), 201);
  expect_both_ways(d, p, 100000, 0);
  assert_int_equal(put_blob(&S, NULL, "", 0, d), 201);
  expect_both_ways(d, "", 0, 0);
  free(p);
}

static long put_frame(const char *digest, const void *z, size_t zlen,
                      int chunked, resp *out) {
  char path[128];
  snprintf(path, sizeof path, "/v1/blobs/%s", digest);
  resp r = http(&S, path,
                (req){.method = "PUT",
                      .body = z,
                      .len = zlen,
                      .has_body = 1,
                      .chunked = chunked,
                      .header = "Content-Encoding: zstd"});
  long st = r.status;
  if (out)
    *out = r;
  else
    resp_free(&r);
  return st;
}

static void t_put_zstd(void **state) {
  (void)state;
  for (int chunked = 0; chunked < 2; chunked++) {
    size_t n = 200000, zlen;
    char *p = text_bytes(n, 20 + (unsigned)chunked), d[65];
    sha_hex(p, n, d);
    void *z = frame_of(p, n, &zlen);
    resp r;
    assert_int_equal(put_frame(d, z, zlen, chunked, &r), 201);
    json_t *o = body_json(&r);
    assert_int_equal(json_integer_value(json_object_get(o, "size")), n);
    json_decref(o);
    resp_free(&r);
    expect_both_ways(d, p, n, 1);
    r = get(d, 1, NULL); /* kept as it came */
    assert_int_equal(r.len, zlen);
    assert_memory_equal(r.body, z, zlen);
    resp_free(&r);
    assert_int_equal(put_frame(d, z, zlen, chunked, NULL), 200); /* held */
    free(p);
    free(z);
  }
  /* incompressible content sent as a frame: stored raw, served raw */
  size_t n = 60000, zlen;
  char *p = malloc(n), d[65];
  fill_random(p, n, 5);
  sha_hex(p, n, d);
  void *z = frame_of(p, n, &zlen);
  assert_int_equal(put_frame(d, z, zlen, 0, NULL), 201);
  expect_both_ways(d, p, n, 0);
  assert_true(metric(&S, "kcached_zstd_puts_total") >= 3);
  free(p);
  free(z);
}

static void expect_absent(const char *d) {
  resp r = get(d, 0, NULL);
  assert_int_equal(r.status, 404);
  resp_free(&r);
}

static void t_put_bad_frames(void **state) {
  (void)state;
  size_t n = 100000, zlen;
  char *p = text_bytes(n, 30), d[65];
  sha_hex(p, n, d);
  unsigned char *z = frame_of(p, n, &zlen);
  resp r;
  assert_int_equal(put_frame(d, z, zlen / 2, 0, &r), 400); /* truncated */
  assert_true(error_mentions(&r, "truncated"));
  resp_free(&r);
  expect_absent(d);
  assert_int_equal(put_frame(d, p, n, 0, &r), 400); /* not a frame */
  assert_true(error_mentions(&r, "zstd"));
  resp_free(&r);
  expect_absent(d);
  memset(z + 6, 0xff, 8); /* a frame whose first block is garbage */
  long st = put_frame(d, z, zlen, 1, NULL);
  assert_true(st == 400 || st == 422);
  expect_absent(d);
  /* 64 MiB of zeros in a few KiB: stopped at --max-blob-bytes (4M) */
  size_t bn = 64u << 20, blen;
  char *zeros = calloc(1, bn), bd[65];
  sha_hex(zeros, bn, bd);
  void *bomb = frame_of(zeros, bn, &blen);
  assert_int_equal(put_frame(bd, bomb, blen, 0, &r), 413);
  resp_free(&r);
  expect_absent(bd);
  /* 3 MiB of zeros streamed with a 2^27 window (no content size): a
   * reader of it would need 128 MiB; refused, with the reason */
  size_t wn = 3u << 20, wlen;
  char wd[65];
  sha_hex(zeros, wn, wd);
  void *wide = kc_test_wide_frame(zeros, wn, 27, &wlen);
  assert_int_equal(put_frame(wd, wide, wlen, 0, &r), 400);
  assert_true(error_mentions(&r, "window"));
  resp_free(&r);
  expect_absent(wd);
  free(wide);
  /* a good frame under another name */
  char other[65];
  sha_hex("x", 1, other);
  void *good = frame_of(p, n, &zlen);
  assert_int_equal(put_frame(other, good, zlen, 0, NULL), 422);
  expect_absent(other);
  free(p);
  free(z);
  free(zeros);
  free(bomb);
  free(good);
}

/* Written by a server that does not compress, served by one that does. */
static void t_old_store(void **state) {
  (void)state;
  kc_testsrv t = {0};
  static const char *const args[] = {"--compress-level", "0", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  size_t n = 40000;
  char *p = text_bytes(n, 40), *q = text_bytes(n, 41), d[65], e[65];
  assert_int_equal(put_blob(&t, NULL, p, n, d), 201);
  resp r = http(&t, "/v1/stats", (req){0});
  json_t *o = body_json(&r);
  assert_int_equal(json_integer_value(json_object_get(o, "bytes_used")),
                   json_integer_value(json_object_get(o, "bytes_raw")));
  json_decref(o);
  resp_free(&r);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  free(t.args[1]);
  t.args[1] = strdup("3");
  assert_int_equal(kc_testsrv_start(&t, NULL), 0);
  char path[128], v[64];
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  r = http(&t, path, (req){.header = "Accept-Encoding: zstd"});
  assert_int_equal(r.status, 200);
  assert_false(header(&r, "Content-Encoding", v, sizeof v)); /* held raw */
  assert_memory_equal(r.body, p, n);
  resp_free(&r);
  assert_int_equal(put_blob(&t, NULL, q, n, e), 201);
  snprintf(path, sizeof path, "/v1/blobs/%s", e);
  r = http(&t, path, (req){.header = "Accept-Encoding: zstd"});
  assert_true(header(&r, "Content-Encoding", v, sizeof v));
  resp_free(&r);
  r = http(&t, path, (req){0});
  assert_int_equal(r.len, n);
  assert_memory_equal(r.body, q, n);
  resp_free(&r);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
  free(p);
  free(q);
}

/* ---- the decoded cache ---- */

static void expect_plain(const kc_testsrv *t, const char *d, const char *p,
                         size_t n) {
  char path[128];
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(t, path, (req){0});
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, n);
  assert_memory_equal(r.body, p, n);
  resp_free(&r);
}

/* A plain GET decodes once; the second comes from memory (a hit). */
static void t_dcache_hit(void **state) {
  (void)state;
  size_t sizes[] = {20000, 3u << 20}; /* decoded whole, and streamed before */
  for (size_t i = 0; i < 2; i++) {
    char *p = text_bytes(sizes[i], 50 + (unsigned)i), d[65];
    assert_int_equal(put_blob(&S, NULL, p, sizes[i], d), 201);
    long h0 = metric(&S, "kcached_decoded_cache_hits_total");
    long m0 = metric(&S, "kcached_decoded_cache_misses_total");
    assert_true(h0 >= 0 && m0 >= 0);
    expect_plain(&S, d, p, sizes[i]);
    assert_int_equal(metric(&S, "kcached_decoded_cache_misses_total"), m0 + 1);
    assert_int_equal(metric(&S, "kcached_decoded_cache_hits_total"), h0);
    expect_plain(&S, d, p, sizes[i]);
    assert_int_equal(metric(&S, "kcached_decoded_cache_hits_total"), h0 + 1);
    assert_int_equal(metric(&S, "kcached_decoded_cache_misses_total"), m0 + 1);
    free(p);
  }
  assert_true(metric(&S, "kcached_decoded_cache_bytes") >= (long)(3u << 20));
}

/* 24 blobs of 200 KB through a 1 MiB cache: each served right, the memory
 * held within the budget, the least recently used dropped. */
static void t_dcache_budget(void **state) {
  (void)state;
  kc_testsrv t = {0};
  static const char *const args[] = {"--decoded-cache", "1M", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  enum { N = 24, SZ = 200000 };
  char d[N][65], *p[N];
  for (int round = 0; round < 2; round++)
    for (int i = 0; i < N; i++) {
      if (!round) {
        p[i] = text_bytes(SZ, 100 + (unsigned)i);
        assert_int_equal(put_blob(&t, NULL, p[i], SZ, d[i]), 201);
      }
      expect_plain(&t, d[i], p[i], SZ);
      long held = metric(&t, "kcached_decoded_cache_bytes");
      assert_true(held > 0 && held <= (1 << 20));
    }
  assert_true(metric(&t, "kcached_decoded_cache_evictions_total") > 0);
  assert_true(metric(&t, "kcached_decoded_cache_entries") <= 5);
  /* the last one stayed: a hit */
  long h0 = metric(&t, "kcached_decoded_cache_hits_total");
  expect_plain(&t, d[N - 1], p[N - 1], SZ);
  assert_int_equal(metric(&t, "kcached_decoded_cache_hits_total"), h0 + 1);
  for (int i = 0; i < N; i++)
    free(p[i]);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

typedef struct getter {
  const char *url, *path, *p;
  size_t n;
  int bad;
} getter;

static void *get_many(void *arg) {
  getter *g = arg;
  CURL *c = curl_easy_init();
  for (int i = 0; i < 25 && c; i++) {
    resp r = kc_testsrv_http(c, g->url, g->path, (req){0});
    if (r.status != 200 || r.len != g->n || memcmp(r.body, g->p, g->n))
      g->bad++;
    kc_testsrv_resp_free(&r);
  }
  if (c)
    curl_easy_cleanup(c);
  else
    g->bad++;
  return NULL;
}

/* Eight clients GET one blob at once, cold then warm: all get its bytes. */
static void t_dcache_concurrent(void **state) {
  (void)state;
  size_t n = 1u << 20;
  char *p = text_bytes(n, 70), d[65], path[128];
  assert_int_equal(put_blob(&S, NULL, p, n, d), 201);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  long h0 = metric(&S, "kcached_decoded_cache_hits_total");
  getter g[8];
  pthread_t th[8];
  for (int i = 0; i < 8; i++) {
    g[i] = (getter){S.url, path, p, n, 0};
    assert_int_equal(pthread_create(&th[i], NULL, get_many, &g[i]), 0);
  }
  for (int i = 0; i < 8; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(g[i].bad, 0);
  }
  assert_true(metric(&S, "kcached_decoded_cache_hits_total") - h0 >= 150);
  free(p);
}

/* An entry dropped while a slow client is still sent it lives until that
 * answer ends, counted in the budget all along; the client gets it whole. */
static void t_dcache_evicted_while_sent(void **state) {
  (void)state;
  kc_testsrv t = {0};
  static const char *const args[] = {"--decoded-cache", "8M", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  enum { N = 7, SZ = 1500000 };
  char d[N][65], *p[N];
  for (int i = 0; i < N; i++) {
    p[i] = text_bytes(SZ, 200 + (unsigned)i);
    assert_int_equal(put_blob(&t, NULL, p[i], SZ, d[i]), 201);
  }
  expect_plain(&t, d[0], p[0], SZ); /* cached */
  int fd = raw_connect(t.port);
  char rq[256];
  int k = snprintf(rq, sizeof rq,
                   "GET /v1/blobs/%s HTTP/1.1\r\nHost: "
                   "127.0.0.1\r\nConnection: close\r\n\r\n",
                   d[0]);
  raw_send(fd, rq, (size_t)k);
  kc_testsrv_sleep_ms(200);     /* answered from the entry, not read yet */
  for (int i = 1; i < N; i++) { /* push it out */
    expect_plain(&t, d[i], p[i], SZ);
    assert_true(metric(&t, "kcached_decoded_cache_bytes") <= (8 << 20));
  }
  assert_true(metric(&t, "kcached_decoded_cache_evictions_total") >= 1);
  size_t cap = SZ + 4096;
  char *buf = malloc(cap);
  size_t got = raw_recv_all(fd, buf, cap);
  close(fd);
  char *body = strstr(buf, "\r\n\r\n");
  assert_non_null(body);
  body += 4;
  assert_int_equal(got - (size_t)(body - buf), SZ);
  assert_memory_equal(body, p[0], SZ);
  free(buf);
  long h0 = metric(&t, "kcached_decoded_cache_hits_total");
  expect_plain(&t, d[0], p[0], SZ); /* gone from the cache: a miss */
  assert_int_equal(metric(&t, "kcached_decoded_cache_hits_total"), h0);
  for (int i = 0; i < N; i++)
    free(p[i]);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

/* RESP: one command on a fresh connection; the reply's first line. */
static void resp_cmd(int port, const char *cmd, size_t len, char *out,
                     size_t cap) {
  int fd = raw_connect(port);
  raw_send(fd, cmd, len);
  size_t got = 0;
  while (got + 1 < cap) {
    ssize_t k = recv(fd, out + got, cap - 1 - got, 0);
    if (k <= 0)
      break;
    got += (size_t)k;
    if (memchr(out, '\n', got))
      break;
  }
  out[got] = '\0';
  close(fd);
}

static int resp_port_of(const kc_testsrv *t) {
  char *log = kc_testsrv_slurp(t->log);
  const char *at =
      log ? strstr(log, "RESP (Redis protocol) on 127.0.0.1:") : NULL;
  int port = at ? atoi(at + strlen("RESP (Redis protocol) on 127.0.0.1:")) : 0;
  free(log);
  return port;
}

/* A value only a RESP key references is freed by DEL at once: its blob,
 * cached decoded before, is 404 after. */
static void t_dcache_deleted(void **state) {
  (void)state;
  kc_testsrv t = {0};
  static const char *const args[] = {"--resp-listen", "127.0.0.1:0", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  int port = resp_port_of(&t);
  assert_true(port > 0);
  size_t n = 8000;
  char *v = text_bytes(n, 80), d[65], line[256];
  sha_hex(v, n, d);
  char *cmd = malloc(n + 64);
  int hl = sprintf(cmd, "*3\r\n$3\r\nSET\r\n$2\r\nkz\r\n$%zu\r\n", n);
  memcpy(cmd + hl, v, n);
  memcpy(cmd + hl + n, "\r\n", 2);
  resp_cmd(port, cmd, (size_t)hl + n + 2, line, sizeof line);
  assert_string_equal(line, "+OK\r\n");
  char path[128], enc[32];
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(&t, path, (req){.header = "Accept-Encoding: zstd"});
  assert_int_equal(r.status, 200);
  assert_true(header(&r, "Content-Encoding", enc, sizeof enc)); /* a frame */
  resp_free(&r);
  expect_plain(&t, d, v, n);
  expect_plain(&t, d, v, n);
  assert_int_equal(metric(&t, "kcached_decoded_cache_hits_total"), 1);
  static const char del[] = "*2\r\n$3\r\nDEL\r\n$2\r\nkz\r\n";
  resp_cmd(port, del, sizeof del - 1, line, sizeof line);
  assert_string_equal(line, ":1\r\n");
  r = http(&t, path, (req){0});
  assert_int_equal(r.status, 404);
  resp_free(&r);
  free(cmd);
  free(v);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

/* A frame whose literals rotted still decodes (no checksum), to other
 * bytes: the cache hashes what it keeps, so the GET is 500 corrupt, and
 * never a cached wrong answer. */
static void t_dcache_rot(void **state) {
  (void)state;
  kc_testsrv t = {0};
  assert_int_equal(kc_testsrv_start(&t, NULL), 0);
  size_t n = 16384; /* four copies of 4 KiB of random letters */
  char *p = malloc(n), d[65], path[128];
  fill_random(p, 4096, 90);
  for (size_t i = 0; i < 4096; i++)
    p[i] = (char)('a' + ((unsigned char)p[i] % 26));
  for (size_t i = 1; i < 4; i++)
    memcpy(p + i * 4096, p, 4096);
  assert_int_equal(put_blob(&t, NULL, p, n, d), 201);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(&t, path, (req){.header = "Accept-Encoding: zstd"});
  assert_int_equal(r.status, 200);
  assert_true(r.len > 1000 && r.len < n / 2);
  char needle[16];
  memcpy(needle, r.body + r.len / 2, sizeof needle);
  resp_free(&r);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  assert_true(kc_testsrv_rot(&t, needle, sizeof needle) >= 1);
  assert_int_equal(kc_testsrv_start(&t, NULL), 0);
  for (int i = 0; i < 2; i++) {
    r = http(&t, path, (req){0});
    assert_int_equal(r.status, 500);
    resp_free(&r);
  }
  assert_int_equal(metric(&t, "kcached_decoded_cache_entries"), 0);
  free(p);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

static int zsetup(void **state) {
  (void)state;
  static const char *const args[] = {"--max-blob-bytes", "4M", NULL};
  return kc_testsrv_start(&S, args);
}

int main(void) {
  const struct CMUnitTest api[] = {
      cmocka_unit_test(t_compressible_roundtrip),
      cmocka_unit_test(t_not_modified),
      cmocka_unit_test(t_counts_per_way),
      cmocka_unit_test(t_incompressible_and_empty),
      cmocka_unit_test(t_put_zstd),
      cmocka_unit_test(t_put_bad_frames),
      cmocka_unit_test(t_dcache_hit),
      cmocka_unit_test(t_dcache_concurrent),
  };
  const struct CMUnitTest own[] = {
      cmocka_unit_test(t_old_store),
      cmocka_unit_test(t_dcache_budget),
      cmocka_unit_test(t_dcache_evicted_while_sent),
      cmocka_unit_test(t_dcache_deleted),
      cmocka_unit_test(t_dcache_rot),
  };
  servertest_init();
  int fails = 0;
  fails += cmocka_run_group_tests_name("api", api, zsetup, open_teardown);
  fails += cmocka_run_group_tests_name("own servers", own, NULL, NULL);
  curl_global_cleanup();
  return fails ? 1 : 0;
}
