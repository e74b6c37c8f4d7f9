/* test_server_slowread.c: slow readers and oversized answers
 * against the real kcached and the real store.
 *
 * - A client that opens a GET of a large blob (or a large manifest) and
 *   stalls holds no LMDB read: writes that replace and evict data
 *   meanwhile succeed (no 507), the oldest read in /metrics stays young,
 *   and the client, when it resumes, gets the whole body or (a manifest
 *   evicted) one cut short, never other bytes. Before the fix the stalled
 *   response pinned every page freed after it began, and the writes failed
 *   with 507. A large blob is lent from the store's pages (loans.c): a
 *   stalled loan is detached (copied, its read ended) and counted, and the
 *   evicted blob's reader still gets it whole, though the churn rewrote its
 *   pages: a detach that ended the read without the copy fails here. A
 *   GET whose copy the answer budget could not hold is not lent but served
 *   in pieces: whole, never cut, no read held.
 * - 600 stalled GETs of a large blob (more than LMDB's old 512 reader
 *   slots) leave reads working: before, every read got 503 busy.
 * - The store's own view: reads open, the oldest one's age, refusals of a
 *   full reader table, kc_store_blob_copy.
 * - Another process holding every reader slot: kcached answers 503 busy,
 *   counts it and logs it once when the table fills and once when no read
 *   was refused for 10 s (before: 503s, /readyz 200, and nothing logged).
 * - A lookup answer holds at most max(8 MiB, 2 x --max-json-bytes) of
 *   manifests; the keys left out are listed in "truncated" and the client
 *   library asks for them again. Before, 128 keys of 3.7 MB manifests made a
 *   461 MB answer.
 * - A manifest with more than KC_MANIFEST_MAX_FILES files: 400 bad_manifest
 *   naming the limit (server), KC_BAD_MANIFEST (schema). */
#include <arpa/inet.h>
#include <netinet/in.h>
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
#include <curl/curl.h>
#include <jansson.h>
#include <lmdb.h>

#include "kc_schema.h"
#include "kc_store.h"
#include "kcache.h"
#include "servertest.h"

#define MiB (1024u * 1024u)

/* ---- HTTP (servertest.h) ---- */

/* PUT of a blob on c (NULL: a fresh handle); a failed transfer fails the
 * test with the log. */
static long put_blob_on(CURL *c, const kc_testsrv *t, const void *p, size_t n,
                        char digest[65]) {
  char path[128];
  sha_hex(p, n, digest);
  snprintf(path, sizeof path, "/v1/blobs/%s", digest);
  resp r =
      http_on(c, t->url, path, (req){.method = "PUT", .body = p, .len = n});
  if (r.rc != CURLE_OK) {
    kc_testsrv_show_log(t, NULL);
    fail_msg("PUT blob: curl error %d (server died?)", r.rc);
  }
  resp_free(&r);
  return r.status;
}

static long put_bundle(CURL *c, const kc_testsrv *t, const char *key,
                       const char *json, resp *out) {
  char path[128];
  snprintf(path, sizeof path, "/v1/bundles/%s", key);
  resp r = http_on(c, t->url, path,
                   (req){.method = "PUT", .body = json, .len = strlen(json)});
  if (r.rc != CURLE_OK) {
    kc_testsrv_show_log(t, NULL);
    fail_msg("PUT bundle: curl error %d (server died?)", r.rc);
  }
  if (out)
    *out = r;
  else
    resp_free(&r);
  return r.status;
}

/* ---- manifests ---- */

static kc_manifest *manifest_new(const char *model, uint64_t batch) {
  kc_manifest *m = kc_testsrv_manifest_base(model, batch, "sm_90a");
  assert_non_null(m);
  return m;
}

/* Adds n files named after i, all the same blob; long paths make a large
 * manifest from few files. */
static void add_files(kc_manifest *m, size_t n, const char *digest,
                      uint64_t size, int long_paths) {
  char err[KC_ERRBUF_SIZE] = "", path[256];
  for (size_t i = 0; i < n; i++) {
    int len = snprintf(path, sizeof path, "k%05zu_", i);
    if (long_paths) {
      memset(path + len, 'a', 230);
      len += 230;
    }
    snprintf(path + len, sizeof path - (size_t)len, ".cubin");
    kc_err e = kc_manifest_add_file(m, path, digest, size, KC_KIND_CUBIN, NULL,
                                    0, err);
    if (e)
      fail_msg("add_file %zu: %s", i, err);
  }
}

/* Canonical JSON (malloc'd) and key of a manifest; frees m. */
static char *manifest_seal(kc_manifest *m, char key[65]) {
  char err[KC_ERRBUF_SIZE] = "", *json = NULL;
  if (kc_manifest_seal(m, err) || kc_manifest_to_json(m, &json, err))
    fail_msg("manifest: %s", err);
  memcpy(key, m->key, 65);
  kc_manifest_free(m);
  return json;
}

/* ---- a slow client on a raw socket ---- */

typedef struct slow {
  int fd;
  long status;
  uint64_t clen;
  char *body;
  size_t got;
  int eof;
} slow;

/* GET path with a small receive buffer, headers read, then some body. */
static void slow_open(slow *s, int port, const char *path, size_t first) {
  memset(s, 0, sizeof *s);
  s->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(s->fd >= 0);
  int rcv = 4096; /* before connect: the window stays small */
  setsockopt(s->fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv);
  struct timeval tv = {20, 0};
  setsockopt(s->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(s->fd, (struct sockaddr *)&sa, sizeof sa), 0);
  char req[256];
  int n = snprintf(req, sizeof req,
                   "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   "Connection: close\r\n\r\n",
                   path);
  assert_int_equal(send(s->fd, req, (size_t)n, MSG_NOSIGNAL), n);
  if (first == 0)
    return;
  char hdr[8192];
  size_t h = 0;
  char *end = NULL;
  while (!end && h < sizeof hdr - 1) {
    ssize_t r = recv(s->fd, hdr + h, sizeof hdr - 1 - h, 0);
    assert_true(r > 0);
    h += (size_t)r;
    hdr[h] = '\0';
    end = strstr(hdr, "\r\n\r\n");
  }
  assert_non_null(end);
  s->status = strtol(hdr + 9, NULL, 10);
  for (char *p = hdr; p < end; p = strstr(p, "\r\n") + 2)
    if (strncasecmp(p, "Content-Length:", 15) == 0)
      s->clen = strtoull(p + 15, NULL, 10);
  s->body = malloc(s->clen + 1);
  assert_non_null(s->body);
  s->got = h - (size_t)(end + 4 - hdr);
  memcpy(s->body, end + 4, s->got);
}

/* Reads until `upto` body bytes are in, or the server closes. */
static void slow_read(slow *s, size_t upto) {
  while (!s->eof && s->got < upto && s->got < s->clen) {
    ssize_t r = recv(s->fd, s->body + s->got, s->clen - s->got, 0);
    if (r <= 0)
      s->eof = 1;
    else
      s->got += (size_t)r;
  }
}

/* A GET of /v1/<what>/<key> that reads 32 KiB of the body, then stalls. */
static void slow_stall(slow *s, int port, const char *what, const char *key) {
  char path[128];
  snprintf(path, sizeof path, "/v1/%s/%s", what, key);
  slow_open(s, port, path, 1);
  slow_read(s, 32 * 1024);
}

static void slow_close(slow *s) {
  if (s->fd >= 0)
    close(s->fd);
  free(s->body);
  s->fd = -1;
  s->body = NULL;
}

/* ---- a stalled reader does not pin the store ---- */

#define BIG (6u * MiB)
#define CHURN_BLOB (2u * MiB)
#define CHURN_N 170 /* 340 MiB through a map of 16M * 1.5 + 256 MiB */

/* Replaces the store's contents many times over: every write must succeed
 * (a full store evicts); returns how many 507 answers came (0 wanted). */
static int churn(const kc_testsrv *t, const char *model) {
  CURL *c = curl_easy_init();
  char *buf = malloc(CHURN_BLOB);
  assert_non_null(buf);
  int full = 0;
  for (int i = 0; i < CHURN_N; i++) {
    char d[65], key[65];
    fill_random(buf, CHURN_BLOB, 1000 + (unsigned)i);
    long st = put_blob_on(c, t, buf, CHURN_BLOB, d);
    if (st == 507) {
      full++;
      continue;
    }
    assert_int_equal(st, 201);
    kc_manifest *m = manifest_new(model, 100 + (uint64_t)i);
    add_files(m, 1, d, CHURN_BLOB, 0);
    char *json = manifest_seal(m, key);
    st = put_bundle(c, t, key, json, NULL);
    free(json);
    if (st == 507)
      full++;
    else
      assert_int_equal(st, 201);
  }
  free(buf);
  curl_easy_cleanup(c);
  return full;
}

/* The bytes a resumed client got: the blob whole, or (when its blob was
 * evicted while it stalled) a prefix of it cut short; never other bytes. */
static void check_body(const slow *s, const char *want, size_t n,
                       int must_be_whole, const char *what) {
  assert_int_equal(s->status, 200);
  assert_int_equal(s->clen, n);
  assert_true(s->got <= n);
  assert_memory_equal(s->body, want, s->got);
  if (must_be_whole)
    assert_int_equal(s->got, n);
  printf("slow reader of %s: %zu of %zu bytes, %s\n", what, s->got, n,
         s->got == n ? "whole" : "cut short");
}

static void t_slow_reader_no_pin(void **state) {
  (void)state;
  kc_testsrv t = {0};
  const char *const args[] = {"--max-bytes", "16M", "--timeout", "300", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  char model[65], kept[65], gone[65], key[65];
  sha_hex("slow reader", 11, model);
  char *a = malloc(BIG), *b = malloc(BIG);
  fill_random(a, BIG, 1);
  fill_random(b, BIG, 2);
  /* `gone`: in the least recently used bundle, evicted by the churn;
   * `kept`: an upload no bundle names yet, spared for its upload window. */
  assert_int_equal(put_blob_on(NULL, &t, a, BIG, gone), 201);
  kc_manifest *m = manifest_new(model, 1);
  add_files(m, 1, gone, BIG, 0);
  char *json = manifest_seal(m, key);
  assert_int_equal(put_bundle(NULL, &t, key, json, NULL), 201);
  free(json);
  assert_int_equal(put_blob_on(NULL, &t, b, BIG, kept), 201);
  /* and a manifest of about 1 MB (3,000 files of one small blob) */
  char small[65], mkey[65];
  assert_int_equal(put_blob_on(NULL, &t, a, 4096, small), 201);
  m = manifest_new(model, 2);
  add_files(m, 3000, small, 4096, 1);
  char *mjson = manifest_seal(m, mkey);
  assert_int_equal(put_bundle(NULL, &t, mkey, mjson, NULL), 201);
  slow s1, s2, s3;
  slow_stall(&s1, t.port, "blobs", gone);
  slow_stall(&s2, t.port, "blobs", kept);
  slow_stall(&s3, t.port, "bundles", mkey);
  /* All three stall here, mid-body, while the store is rewritten 20 times. */
  int full = churn(&t, model);
  double oldest = kc_testsrv_metric(&t, "kcached_store_oldest_read_seconds");
  printf("churn of %d x %u MiB with three stalled readers: %d answers 507; "
         "oldest read %.3f s\n",
         CHURN_N, CHURN_BLOB / MiB, full, oldest);
  if (full)
    kc_testsrv_show_log(&t, NULL);
  assert_int_equal(full, 0);
  assert_true(oldest >= 0 && oldest < 2.0);
  double detached = kc_testsrv_metric(
      &t, "kcached_http_blob_loans_total{result=\"detached\"}");
  printf("stalled loans detached: %.0f\n", detached);
  assert_true(detached >= 2);
  slow_read(&s1, BIG);
  slow_read(&s2, BIG);
  slow_read(&s3, strlen(mjson));
  check_body(&s1, a, BIG, 1, "an evicted blob (lent, detached)");
  check_body(&s2, b, BIG, 1, "a kept blob");
  check_body(&s3, mjson, strlen(mjson), 1, "a 1 MB manifest (copied out)");
  slow_close(&s1);
  slow_close(&s2);
  slow_close(&s3);
  free(mjson);
  free(a);
  free(b);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

/* Two stalled GETs of large blobs and an answer budget of 1 MiB: the first
 * is lent (an answer always may, when none is held) and its copy set aside,
 * the second is refused a loan and served in pieces from the start. Both
 * clients get their blobs whole, nothing is cut, and no read stays open.
 * Before, the second was lent too, its copy refused when it stalled, and
 * its connection cut mid-body. */
static void t_loan_over_budget_whole(void **state) {
  (void)state;
  kc_testsrv t = {0};
  const char *const args[] = {"--max-answer-memory", "1M", "--timeout", "300",
                              NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  char *a = malloc(BIG), *b = malloc(BIG);
  char da[65], db[65];
  fill_random(a, BIG, 11);
  fill_random(b, BIG, 12);
  assert_int_equal(put_blob_on(NULL, &t, a, BIG, da), 201);
  assert_int_equal(put_blob_on(NULL, &t, b, BIG, db), 201);
  slow s1, s2;
  slow_stall(&s1, t.port, "blobs", da);
  slow_stall(&s2, t.port, "blobs", db);
  double detached = kc_testsrv_metric_settle(
      &t, "kcached_http_blob_loans_total{result=\"detached\"}", 1, 10000);
  kc_testsrv_sleep_ms(300); /* a cut would come at the reaper's next tick */
  double cut =
      kc_testsrv_metric(&t, "kcached_http_blob_loans_total{result=\"cut\"}");
  double lent =
      kc_testsrv_metric(&t, "kcached_http_blob_loans_total{result=\"sent\"}");
  double oldest = kc_testsrv_metric(&t, "kcached_store_oldest_read_seconds");
  printf("stalled GETs over the budget: %.0f lent, %.0f detached, %.0f cut; "
         "oldest read %.3f s\n",
         lent, detached, cut, oldest);
  assert_true(lent == 1 && detached == 1 && cut == 0);
  assert_true(oldest >= 0 && oldest < 1.0);
  slow_read(&s1, BIG);
  slow_read(&s2, BIG);
  check_body(&s1, a, BIG, 1, "a stalled GET (lent, detached)");
  check_body(&s2, b, BIG, 1, "a stalled GET (in pieces)");
  slow_close(&s1);
  slow_close(&s2);
  free(a);
  free(b);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

/* More stalled downloads than LMDB's old 512 reader slots: reads still
 * work, and none was refused for a full reader table. */
static void t_many_slow_readers(void **state) {
  (void)state;
  enum { N = 600 };
  kc_testsrv t = {0};
  const char *const args[] = {"--timeout", "300", "--max-connections-per-ip",
                              "0", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  char *a = malloc(BIG), big[65], small[65], path[128];
  fill_random(a, BIG, 3);
  assert_int_equal(put_blob_on(NULL, &t, a, BIG, big), 201);
  assert_int_equal(put_blob_on(NULL, &t, a, 4096, small), 201);
  static slow s[N];
  snprintf(path, sizeof path, "/v1/blobs/%s", big);
  for (int i = 0; i < N; i++)
    slow_open(&s[i], t.port, path, 0); /* sent, never read */
  kc_testsrv_sleep_ms(1000);
  snprintf(path, sizeof path, "/v1/blobs/%s", small);
  int ok = 0;
  for (int i = 0; i < 20; i++) {
    resp r = http_on(NULL, t.url, path, (req){0});
    ok += r.status == 200 && r.len == 4096 && memcmp(r.body, a, 4096) == 0;
    resp_free(&r);
  }
  double refused = kc_testsrv_metric(&t, "kcached_store_readers_full_total");
  double open = kc_testsrv_metric(&t, "kcached_store_reads_open");
  printf("%d stalled GETs of a %u MiB blob: %d of 20 small GETs 200; reads "
         "open %.0f, refused for a full reader table %.0f\n",
         N, BIG / MiB, ok, open, refused);
  assert_int_equal(ok, 20);
  assert_true(refused == 0);
  assert_true(open >= 0 && open < 16);
  for (int i = 0; i < N; i++)
    slow_close(&s[i]);
  free(a);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

/* ---- a full reader table is logged ---- */

static long get_status(const kc_testsrv *t, const char *path) {
  resp r = http_on(NULL, t->url, path, (req){0});
  resp_free(&r);
  return r.status;
}

/* Another process (here: this test, through liblmdb) holds every slot of
 * the store's reader table while kcached runs. */
static void t_readers_full_logged(void **state) {
  (void)state;
  kc_testsrv t = {0};
  assert_int_equal(kc_testsrv_start(&t, NULL), 0);
  char blob[4096], d[65], path[128];
  fill_random(blob, sizeof blob, 7);
  assert_int_equal(put_blob_on(NULL, &t, blob, sizeof blob, d), 201);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  /* Opened alone, this process sizes the table (a few dozen slots, LMDB
   * rounds up to a page); kcached, opening it second, keeps that size. */
  MDB_env *env = NULL;
  assert_int_equal(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, 16);
  mdb_env_set_maxreaders(env, 8);
  assert_int_equal(mdb_env_open(env, t.data, MDB_NOTLS | MDB_RDONLY, 0640), 0);
  assert_int_equal(kc_testsrv_restart(&t), 0);
  enum { MAX = 10000 };
  static MDB_txn *txn[MAX];
  size_t held = 0;
  int rc = 0;
  while (held < MAX &&
         (rc = mdb_txn_begin(env, NULL, MDB_RDONLY, &txn[held])) == 0)
    held++;
  assert_int_equal(rc, MDB_READERS_FULL);
  /* Several seconds of refused reads: one line, not one per tick. */
  int busy = 0;
  for (int i = 0; i < 6; i++) {
    busy += get_status(&t, path) == 503;
    kc_testsrv_sleep_ms(500);
  }
  kc_testsrv_sleep_ms(1500);
  double refused = kc_testsrv_metric(&t, "kcached_store_readers_full_total");
  int full_lines = kc_testsrv_log_count(&t, "reader table is full", 1);
  for (size_t i = 0; i < held; i++)
    mdb_txn_abort(txn[i]);
  long after = get_status(&t, path);
  kc_testsrv_sleep_ms(12500); /* said after 10 s without a refusal */
  int room_lines = kc_testsrv_log_count(&t, "no read refused for 10 s", 1);
  printf("%zu slots held by another process: %d of 6 GETs 503, %.0f reads "
         "refused, logged full %d time(s); after release GET %ld, logged "
         "room %d time(s)\n",
         held, busy, refused, full_lines, after, room_lines);
  assert_int_equal(busy, 6);
  assert_true(refused >= 6);
  assert_int_equal(full_lines, 1);
  assert_int_equal(after, 200);
  assert_int_equal(room_lines, 1);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  mdb_env_close(env);
  kc_testsrv_cleanup(&t);
}

/* ---- the store's view of its reads ---- */

static void t_store_reads(void **state) {
  (void)state;
  char dir[] = "/tmp/kc-slowread-XXXXXX", err[KC_ERRBUF_SIZE] = "";
  assert_non_null(mkdtemp(dir));
  kc_store_opts o = {.dir = dir, .max_readers = 8};
  kc_store *s = NULL;
  assert_int_equal(kc_store_open(&o, &s, err), KC_OK);
  char data[300000], d[65], piece[100000];
  fill_random(data, sizeof data, 4);
  sha_hex(data, sizeof data, d);
  int created = 0;
  assert_int_equal(kc_store_blob_put(s, d, data, sizeof data, &created, err),
                   KC_OK);
  /* kc_store_blob_copy: pieces at any offset, in reads that end. */
  size_t n = 0;
  uint64_t size = 0;
  for (uint64_t off = 0; off < sizeof data; off += n) {
    assert_int_equal(
        kc_store_blob_copy(s, d, off, piece, sizeof piece, &n, &size), KC_OK);
    assert_int_equal(size, sizeof data);
    assert_true(n > 0);
    assert_memory_equal(piece, data + off, n);
  }
  kc_store_read_stats rs;
  kc_store_read_stats_get(s, &rs);
  assert_int_equal(rs.open, 0);
  assert_int_equal(rs.oldest_age_ms, 0);
  char absent[65];
  sha_hex("absent", 6, absent);
  assert_int_equal(kc_store_blob_copy(s, absent, 0, piece, 10, &n, NULL),
                   KC_NOT_FOUND);
  /* Reads held open: counted, the oldest's age grows; past the table's
   * size (LMDB rounds it up to a page) a read is refused and counted. */
  enum { MAX = 4096 };
  static kc_store_read *r[MAX];
  size_t held = 0;
  kc_err e = KC_OK;
  while (held < MAX && (e = kc_store_read_begin(s, &r[held])) == KC_OK) {
    held++;
    if (held == 1)
      kc_testsrv_sleep_ms(300);
  }
  assert_int_equal(e, KC_BUSY);
  kc_store_read_stats_get(s, &rs);
  printf("store: %zu reads open, the oldest %llu ms old; %u slots; refused "
         "%llu\n",
         held, (unsigned long long)rs.oldest_age_ms, rs.max_readers,
         (unsigned long long)rs.readers_full);
  assert_int_equal(rs.open, held);
  assert_true(rs.oldest_age_ms >= 250);
  assert_int_equal(rs.readers_full, 1);
  assert_true(rs.max_readers >= 8 && held <= rs.max_readers);
  for (size_t i = 0; i < held; i++)
    kc_store_read_end(r[held - 1 - i]);
  kc_store_read_stats_get(s, &rs);
  assert_int_equal(rs.open, 0);
  assert_int_equal(rs.oldest_age_ms, 0);
  kc_store_close(s);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

/* ---- bounded lookup answers ---- */

#define LOOKUP_N 12 /* manifests of about 1.1 MB: 13 MB in all */
#define LOOKUP_FILES 3000
#define LOOKUP_CAP (8u * MiB) /* max(8 MiB, 2 x the default 4 MiB) */

static void t_lookup_bounded(void **state) {
  (void)state;
  kc_testsrv t = {0};
  assert_int_equal(kc_testsrv_start(&t, NULL), 0);
  char blob[4096], d[65], model[65], keys[LOOKUP_N][65], absent[65];
  fill_random(blob, sizeof blob, 5);
  assert_int_equal(put_blob_on(NULL, &t, blob, sizeof blob, d), 201);
  sha_hex("lookup model", 12, model);
  sha_hex("absent key", 10, absent);
  size_t each = 0;
  for (int i = 0; i < LOOKUP_N; i++) {
    kc_manifest *m = manifest_new(model, (uint64_t)i + 1);
    add_files(m, LOOKUP_FILES, d, sizeof blob, 1);
    char *json = manifest_seal(m, keys[i]);
    each = strlen(json);
    assert_int_equal(put_bundle(NULL, &t, keys[i], json, NULL), 201);
    free(json);
  }
  /* One lookup of all of them and an absent key. */
  size_t cap = 64 + (LOOKUP_N + 1) * 68;
  char *body = malloc(cap);
  size_t pos = (size_t)snprintf(body, cap, "{\"keys\":[\"%s\"", absent);
  for (int i = 0; i < LOOKUP_N; i++)
    pos += (size_t)snprintf(body + pos, cap - pos, ",\"%s\"", keys[i]);
  snprintf(body + pos, cap - pos, "]}");
  resp r = http_on(NULL, t.url, "/v1/lookup",
                   (req){.method = "POST", .body = body, .len = strlen(body)});
  assert_int_equal(r.status, 200);
  json_t *j = json_loadb(r.body, r.len, 0, NULL);
  assert_non_null(j);
  json_t *found = json_object_get(j, "found");
  json_t *trunc = json_object_get(j, "truncated");
  json_t *missing = json_object_get(j, "missing");
  size_t nf = json_object_size(found), nt = json_array_size(trunc);
  printf("lookup of %d manifests of %zu bytes: answer %zu bytes, %zu found, "
         "%zu truncated, %zu missing\n",
         LOOKUP_N, each, r.len, nf, nt, json_array_size(missing));
  assert_true(r.len <= LOOKUP_CAP + 64 * 1024);
  assert_true(nt >= 1 && nf >= 1);
  assert_int_equal(nf + nt, LOOKUP_N);
  assert_int_equal(json_array_size(missing), 1);
  assert_string_equal(json_string_value(json_array_get(missing, 0)), absent);
  /* Every key left out is one of ours and not also found; ask again. */
  pos = (size_t)snprintf(body, cap, "{\"keys\":[");
  for (size_t i = 0; i < nt; i++) {
    const char *k = json_string_value(json_array_get(trunc, i));
    assert_non_null(k);
    assert_null(json_object_get(found, k));
    int ours = 0;
    for (int q = 0; q < LOOKUP_N; q++)
      ours |= strcmp(k, keys[q]) == 0;
    assert_true(ours);
    pos += (size_t)snprintf(body + pos, cap - pos, "%s\"%s\"", i ? "," : "", k);
  }
  snprintf(body + pos, cap - pos, "]}");
  json_decref(j);
  resp_free(&r);
  r = http_on(NULL, t.url, "/v1/lookup",
              (req){.method = "POST", .body = body, .len = strlen(body)});
  assert_int_equal(r.status, 200);
  j = json_loadb(r.body, r.len, 0, NULL);
  assert_int_equal(json_object_size(json_object_get(j, "found")), nt);
  assert_int_equal(json_array_size(json_object_get(j, "truncated")), 0);
  json_decref(j);
  resp_free(&r);
  free(body);
  /* The client library follows "truncated" up: every manifest comes back. */
  char cache[300], err[KC_ERRBUF_SIZE] = "";
  snprintf(cache, sizeof cache, "%s/cache", t.dir);
  kc_client_opts co = {.url = t.url, .cache_dir = cache};
  kc_client *c = NULL;
  assert_int_equal(kc_client_new(&co, &c, err), KC_OK);
  const char *ks[LOOKUP_N + 1];
  kc_manifest *got[LOOKUP_N + 1];
  ks[0] = absent;
  for (int i = 0; i < LOOKUP_N; i++)
    ks[i + 1] = keys[i];
  assert_int_equal(kc_client_lookup(c, ks, LOOKUP_N + 1, got, err), KC_OK);
  assert_null(got[0]);
  for (int i = 1; i <= LOOKUP_N; i++) {
    assert_non_null(got[i]);
    assert_string_equal(got[i]->key, ks[i]);
    assert_int_equal(got[i]->n_files, LOOKUP_FILES);
    kc_manifest_free(got[i]);
  }
  kc_client_free(c);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

/* ---- at most KC_MANIFEST_MAX_FILES files ---- */

/* A manifest's JSON with n files (written by hand: the schema refuses to
 * build one over the limit). key: its key (files are not part of it). */
static char *json_with_files(size_t n, const char *digest, char key[65]) {
  char model[65];
  sha_hex("many files", 10, model);
  kc_manifest *m = manifest_new(model, 7);
  add_files(m, 1, digest, 4096, 0);
  char *one = manifest_seal(m, key);
  json_t *root = json_loads(one, 0, NULL);
  free(one);
  json_t *files = json_object_get(root, "files");
  json_t *first = json_copy(json_array_get(files, 0));
  json_array_clear(files);
  for (size_t i = 0; i < n; i++) {
    char path[32];
    snprintf(path, sizeof path, "f%zu.cubin", i);
    json_t *f = json_copy(first);
    json_object_set_new(f, "path", json_string(path));
    json_array_append_new(files, f);
  }
  json_decref(first);
  char *s = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  return s;
}

static void t_schema_max_files(void **state) {
  (void)state;
  char d[65], key[65], err[KC_ERRBUF_SIZE] = "";
  sha_hex("x", 1, d);
  kc_manifest *m = NULL;
  char *json = json_with_files(KC_MANIFEST_MAX_FILES, d, key);
  assert_int_equal(kc_manifest_parse(json, strlen(json), &m, err), KC_OK);
  assert_int_equal(m->n_files, KC_MANIFEST_MAX_FILES);
  /* One more through the builder: refused, the manifest unchanged. */
  assert_int_equal(kc_manifest_add_file(m, "one-more.cubin", d, 4096,
                                        KC_KIND_CUBIN, NULL, 0, err),
                   KC_BAD_MANIFEST);
  assert_non_null(strstr(err, "4096"));
  assert_int_equal(m->n_files, KC_MANIFEST_MAX_FILES);
  assert_int_equal(kc_manifest_validate(m, err), KC_OK);
  kc_manifest_free(m);
  free(json);
  json = json_with_files(KC_MANIFEST_MAX_FILES + 1, d, key);
  m = NULL;
  assert_int_equal(kc_manifest_parse(json, strlen(json), &m, err),
                   KC_BAD_MANIFEST);
  assert_null(m);
  assert_non_null(strstr(err, "4097 files"));
  assert_non_null(strstr(err, "4096"));
  free(json);
}

static void t_server_max_files(void **state) {
  (void)state;
  kc_testsrv t = {0};
  assert_int_equal(kc_testsrv_start(&t, NULL), 0);
  char blob[4096], d[65], key[65];
  fill_random(blob, sizeof blob, 6);
  assert_int_equal(put_blob_on(NULL, &t, blob, sizeof blob, d), 201);
  char *json = json_with_files(KC_MANIFEST_MAX_FILES + 1, d, key);
  resp r;
  assert_int_equal(put_bundle(NULL, &t, key, json, &r), 400);
  json_t *j = json_loadb(r.body, r.len, 0, NULL);
  const char *code = json_string_value(json_object_get(j, "error"));
  const char *msg = json_string_value(json_object_get(j, "message"));
  printf("PUT of a manifest of %d files: %ld %s: %s\n",
         KC_MANIFEST_MAX_FILES + 1, r.status, code, msg);
  assert_string_equal(code, "bad_manifest");
  assert_non_null(strstr(msg, "4096"));
  json_decref(j);
  resp_free(&r);
  free(json);
  json = json_with_files(KC_MANIFEST_MAX_FILES, d, key);
  assert_int_equal(put_bundle(NULL, &t, key, json, NULL), 201);
  free(json);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

int main(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_store_reads),
      cmocka_unit_test(t_schema_max_files),
      cmocka_unit_test(t_server_max_files),
      cmocka_unit_test(t_lookup_bounded),
      cmocka_unit_test(t_many_slow_readers),
      cmocka_unit_test(t_readers_full_logged),
      cmocka_unit_test(t_slow_reader_no_pin),
      cmocka_unit_test(t_loan_over_budget_whole),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  curl_global_cleanup();
  return rc;
}
