/* test_store_kv.c: unit tests of the store's RESP keys (kc_store.h, "RESP
 * keys"; store/kv*.c): round trips of binary, empty and large values, dedup
 * and refcounts shared with bundles, SET's NX/XX/GET/KEEPTTL, EXPIRE and
 * PERSIST, expiry on read and its reclaim, reopen, SCAN over 1000 keys,
 * Redis's glob match, FLUSH, eviction under max_bytes and kv_max_bytes,
 * a batch with failing ops, a SIGKILLed writer, and the scrub of a rotted
 * value; with the durable tier: writes queued while S3 is down (a queued key
 * is not evicted), and, against a real RGW (`test_store_kv s3`, ctest
 * store_kv_s3), write-through and read-through between two stores.
 *
 * Every test gets a fresh temporary directory; KC_TEST_FILTER=<glob> runs
 * some tests only, KC_TEST_SKIP=<glob> leaves some out. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <ftw.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <lmdb.h>

#include "kc_schema.h"
#include "kc_store.h"
#include "kcs3.h"
#include "storetest.h"
#include "testrgw.h"

#define KiB 1024u
#define MiB (1024u * 1024u)

/* ---- helpers ---- */

static kc_store *open_kv(const char *dir, uint64_t max_bytes,
                         uint64_t kv_max_bytes, uint64_t map_size) {
  kc_store_opts o = {.dir = dir,
                     .max_bytes = max_bytes,
                     .kv_max_bytes = kv_max_bytes,
                     .map_size = map_size};
  return open_with(&o);
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint8_t *bytes(size_t n, uint64_t seed) {
  uint8_t *p = malloc(n ? n : 1);
  assert_non_null(p);
  fill(p, n, seed);
  return p;
}

/* One op in its own batch; returns the op (results). */
static kc_store_kv_op apply1(kc_store *s, kc_store_kv_opcode code,
                             const char *key, const void *val, size_t vlen,
                             int flags, int64_t exp, int64_t now) {
  kc_store_kv_op op = {.op = code,
                       .key = key,
                       .klen = key ? strlen(key) : 0,
                       .val = val,
                       .vlen = vlen,
                       .flags = flags,
                       .expire_ms = exp};
  OK(kc_store_kv_apply(s, &op, 1, now, errbuf));
  return op;
}

static uint64_t set(kc_store *s, const char *key, const void *val, size_t vlen,
                    int flags, int64_t exp, int64_t now) {
  kc_store_kv_op op = apply1(s, KC_KV_SET, key, val, vlen, flags, exp, now);
  assert_int_equal(op.err, KC_OK);
  free(op.old);
  return op.done;
}

static uint64_t del(kc_store *s, const char *key) {
  kc_store_kv_op op = apply1(s, KC_KV_DEL, key, NULL, 0, 0, 0, now_ms());
  assert_int_equal(op.err, KC_OK);
  return op.done;
}

/* Fails unless key reads as val at now. */
static void expect_val(kc_store *s, const void *key, size_t klen,
                       const void *val, size_t vlen, int64_t now) {
  kc_store_read *r;
  kc_store_kv_val v;
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_kv_get(r, key, klen, now, &v));
  assert_int_equal(v.size, vlen);
  if (v.enc == KC_STORE_ZSTD) { /* held compressed */
    uint8_t *raw = malloc(vlen ? vlen : 1);
    assert_non_null(raw);
    OK(kc_store_zstd_decode(v.data, v.len, raw, vlen, errbuf));
    assert_memory_equal(raw, val, vlen);
    free(raw);
  } else {
    assert_int_equal(v.len, vlen);
    if (vlen)
      assert_memory_equal(v.data, val, vlen);
  }
  kc_store_read_end(r);
}

static void expect_str(kc_store *s, const char *key, const char *val) {
  expect_val(s, key, strlen(key), val, strlen(val), now_ms());
}

static int present_at(kc_store *s, const char *key, int64_t now) {
  kc_store_read *r;
  kc_store_kv_val v;
  OK(kc_store_read_begin(s, &r));
  kc_err e = kc_store_kv_get(r, key, strlen(key), now, &v);
  kc_store_read_end(r);
  assert_true(e == KC_OK || e == KC_NOT_FOUND);
  return e == KC_OK;
}

static int present(kc_store *s, const char *key) {
  return present_at(s, key, now_ms());
}

static int64_t expiry_of(kc_store *s, const char *key, int64_t now) {
  kc_store_read *r;
  uint64_t size;
  int64_t exp = -1;
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_kv_meta(r, key, strlen(key), now, &size, &exp));
  kc_store_read_end(r);
  return exp;
}

static uint64_t count(kc_store *s) {
  uint64_t n = 0;
  OK(kc_store_kv_count(s, &n));
  return n;
}

/* ---- round trips ---- */

/* A key and a value with every byte value (NUL included) come back whole;
 * the empty value is a value; stats count keys, bytes, hits and misses. */
static void test_roundtrip_binary(void **state) {
  fx *f = *state;
  kc_store *s = open_kv(f->dir, 0, 0, 0);
  uint8_t key[256], val[1024];
  for (int i = 0; i < 256; i++)
    key[i] = (uint8_t)(255 - i);
  for (int i = 0; i < 1024; i++)
    val[i] = (uint8_t)i;
  int64_t now = now_ms();
  kc_store_kv_op ops[2] = {
      {.op = KC_KV_SET,
       .key = key,
       .klen = sizeof key,
       .val = val,
       .vlen = sizeof val},
      {.op = KC_KV_SET, .key = "empty", .klen = 5, .val = NULL, .vlen = 0}};
  OK(kc_store_kv_apply(s, ops, 2, now, errbuf));
  assert_int_equal(ops[0].err, KC_OK);
  assert_int_equal(ops[0].done, 1);
  assert_int_equal(ops[1].done, 1);
  expect_val(s, key, sizeof key, val, sizeof val, now);
  expect_val(s, "empty", 5, "", 0, now);
  /* a key differing in its last byte is another key */
  key[255] ^= 1;
  kc_store_read *r;
  kc_store_kv_val v;
  uint64_t size = 9;
  int64_t exp = 9;
  OK(kc_store_read_begin(s, &r));
  EXPECT(kc_store_kv_get(r, key, sizeof key, now, &v), KC_NOT_FOUND);
  EXPECT(kc_store_kv_get(r, "", 0, now, &v), KC_BAD_KEY);
  OK(kc_store_kv_meta(r, "empty", 5, now, &size, &exp));
  kc_store_read_end(r);
  assert_int_equal(size, 0);
  assert_int_equal(exp, 0);
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.kv_keys, 2);
  assert_int_equal(st.kv_bytes, sizeof val);
  assert_int_equal(st.kv_hits, 2);
  assert_int_equal(st.kv_misses, 1); /* the bad key is no miss */
  assert_int_equal(st.blobs, 2);
  /* the values and the two keys' own bytes */
  assert_int_equal(st.bytes_used, sizeof val + KC_KV_KEY_BYTES(sizeof key) +
                                      KC_KV_KEY_BYTES(5));
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
}

/* 8 MiB comes back whole, from the map. */
static void test_large_value(void **state) {
  fx *f = *state;
  kc_store *s = open_kv(f->dir, 0, 0, 0);
  size_t n = 8 * MiB;
  uint8_t *p = bytes(n, 7);
  assert_int_equal(set(s, "big", p, n, 0, 0, now_ms()), 1);
  kc_store_read *r;
  kc_store_kv_val v;
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_kv_get(r, "big", 3, now_ms(), &v));
  assert_int_equal(v.len, n);
  assert_memory_equal(v.data, p, n);
  /* the same bytes as the blob API's zero-copy read: no copy of ours */
  char hex[KC_HEX_LEN + 1];
  const void *data;
  size_t len;
  assert_int_equal(kc_sha256_hex(p, n, hex), KC_OK);
  OK(kc_store_blob_get(r, hex, &data, &len));
  assert_ptr_equal(data, v.data);
  kc_store_read_end(r);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
  free(p);
}

/* ---- dedup and refcounts ---- */

static kc_manifest *one_file_manifest(const char *hex, uint64_t size) {
  kc_manifest *m = manifest_base(M1, 1);
  m->fields.n_tools = 0; /* no toolchain */
  const char *entries[] = {"k"};
  OK(kc_manifest_add_file(m, "f.cubin", hex, size, KC_KIND_CUBIN, entries, 1,
                          errbuf));
  OK(kc_manifest_seal(m, errbuf));
  return m;
}

/* Stores a bundle, bucket {"batch": bucket}, of one new blob of n bytes
 * from seed; returns its manifest. */
static kc_manifest *bundle_of_new_blob(kc_store *s, size_t n, uint64_t seed,
                                       uint64_t bucket) {
  char hex[KC_HEX_LEN + 1];
  uint8_t *p = bytes(n, seed);
  assert_int_equal(kc_sha256_hex(p, n, hex), KC_OK);
  int created;
  OK(kc_store_blob_put(s, hex, p, n, &created, errbuf));
  kc_manifest *m = one_file_manifest(hex, n);
  m->fields.bucket.dims[0].value = bucket;
  OK(kc_manifest_seal(m, errbuf));
  OK(kc_store_bundle_put(s, m, &created, NULL, NULL, errbuf));
  free(p);
  return m;
}

static void test_dedup_and_refcounts(void **state) {
  fx *f = *state;
  kc_store *s = open_kv(f->dir, 0, 0, 0);
  size_t n = 100 * KiB;
  uint8_t *p = bytes(n, 11);
  int64_t now = now_ms();
  set(s, "a", p, n, 0, 0, now);
  set(s, "b", p, n, 0, 0, now);
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.blobs, 1); /* stored once */
  assert_int_equal(st.bytes_used, n + 2 * KC_KV_KEY_BYTES(1));
  assert_int_equal(st.kv_bytes, 2 * n);
  /* a blob only RESP keys reference is no orphan: gc keeps it */
  OK(kc_store_gc(s, time(NULL) + 100000, errbuf));
  assert_int_equal(get_stats(s).gc_blobs, 0);
  assert_int_equal(del(s, "a"), 1);
  assert_int_equal(del(s, "a"), 0);
  expect_val(s, "b", 1, p, n, now);
  assert_int_equal(get_stats(s).blobs, 1);
  /* the last reference frees the value at once */
  assert_int_equal(del(s, "b"), 1);
  st = get_stats(s);
  assert_int_equal(st.blobs, 0);
  assert_int_equal(st.bytes_used, 0);
  assert_int_equal(st.kv_bytes, 0);
  kc_store_close(s);
  free(p);
}

/* A value that is also a bundle's file survives deleting either. */
static void test_shared_with_bundle(void **state) {
  fx *f = *state;
  kc_store *s = open_kv(f->dir, 0, 0, 0);
  size_t n = 100 * KiB;
  uint8_t *p = bytes(n, 11);
  int64_t now = now_ms();
  char hex[KC_HEX_LEN + 1];
  assert_int_equal(kc_sha256_hex(p, n, hex), KC_OK);
  int created;
  OK(kc_store_blob_put(s, hex, p, n, &created, errbuf));
  kc_manifest *m = one_file_manifest(hex, n);
  OK(kc_store_bundle_put(s, m, &created, NULL, NULL, errbuf));
  set(s, "c", p, n, 0, 0, now);
  OK(kc_store_bundle_delete(s, m->key, errbuf));
  OK(kc_store_gc(s, time(NULL) + 100000, errbuf));
  expect_val(s, "c", 1, p, n, now);
  OK(kc_store_verify(s, errbuf));
  OK(kc_store_bundle_put(s, m, &created, NULL, NULL, errbuf));
  assert_int_equal(del(s, "c"), 1);
  OK(kc_store_gc(s, time(NULL) + 100000, errbuf));
  assert_int_equal(kc_store_bundle_has(s, m->key), KC_OK);
  assert_int_equal(kc_store_blob_has(s, hex, NULL), KC_OK);
  OK(kc_store_verify(s, errbuf));
  /* overwriting a key with its own value keeps the value */
  set(s, "d", "x", 1, 0, 0, now);
  set(s, "d", "x", 1, 0, 0, now);
  expect_str(s, "d", "x");
  set(s, "d", "y", 1, 0, 0, now);
  expect_str(s, "d", "y");
  assert_int_equal(get_stats(s).blobs, 2); /* the bundle's and "y" */
  OK(kc_store_verify(s, errbuf));
  kc_manifest_free(m);
  kc_store_close(s);
  free(p);
}

/* ---- SET flags, EXPIRE, PERSIST ---- */

static void test_set_flags(void **state) {
  fx *f = *state;
  kc_store *s = open_kv(f->dir, 0, 0, 0);
  int64_t now = now_ms();
  assert_int_equal(set(s, "k", "1", 1, KC_KV_XX, 0, now), 0);
  assert_false(present(s, "k"));
  assert_int_equal(set(s, "k", "1", 1, KC_KV_NX, 0, now), 1);
  assert_int_equal(set(s, "k", "2", 1, KC_KV_NX, 0, now), 0);
  expect_str(s, "k", "1");
  assert_int_equal(set(s, "k", "3", 1, KC_KV_XX, 0, now), 1);
  expect_str(s, "k", "3");
  /* GET: the old value, also when NX refuses (Redis 7) */
  kc_store_kv_op op = apply1(s, KC_KV_SET, "k", "4", 1, KC_KV_GET, 0, now);
  assert_int_equal(op.done, 1);
  assert_int_equal(op.had_old, 1);
  assert_int_equal(op.old_len, 1);
  assert_memory_equal(op.old, "3", 1);
  free(op.old);
  op = apply1(s, KC_KV_SET, "k", "5", 1, KC_KV_GET | KC_KV_NX, 0, now);
  assert_int_equal(op.done, 0);
  assert_int_equal(op.had_old, 1);
  assert_memory_equal(op.old, "4", 1);
  free(op.old);
  op = apply1(s, KC_KV_SET, "new", "v", 1, KC_KV_GET, 0, now);
  assert_int_equal(op.had_old, 0);
  assert_null(op.old);
  /* KEEPTTL keeps the expiry; a plain SET drops it */
  int64_t t = now + 100000;
  set(s, "k", "6", 1, 0, t, now);
  assert_int_equal(expiry_of(s, "k", now), t);
  set(s, "k", "7", 1, KC_KV_KEEPTTL, 0, now);
  assert_int_equal(expiry_of(s, "k", now), t);
  expect_str(s, "k", "7");
  set(s, "k", "8", 1, 0, 0, now);
  assert_int_equal(expiry_of(s, "k", now), 0);
  /* an expiry already past: written and gone at once (the old value too) */
  assert_int_equal(set(s, "k", "9", 1, 0, now - 1, now), 1);
  assert_false(present_at(s, "k", now));
  assert_int_equal(count(s), 1); /* "new" */
  /* an expired key is absent to NX, XX and GET */
  set(s, "e", "old", 3, 0, now + 10, now);
  op = apply1(s, KC_KV_SET, "e", "x", 1, KC_KV_XX | KC_KV_GET, 0, now + 10);
  assert_int_equal(op.done, 0);
  assert_int_equal(op.had_old, 0);
  assert_int_equal(set(s, "e", "n", 1, KC_KV_NX, 0, now + 10), 1);
  expect_str(s, "e", "n");
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
}

static uint64_t expire(kc_store *s, const char *key, int flags, int64_t t,
                       int64_t now) {
  kc_store_kv_op op = apply1(s, KC_KV_EXPIRE, key, NULL, 0, flags, t, now);
  assert_int_equal(op.err, KC_OK);
  return op.done;
}

static void test_expire_persist(void **state) {
  fx *f = *state;
  kc_store *s = open_kv(f->dir, 0, 0, 0);
  int64_t now = now_ms(), t1 = now + 10000, t2 = now + 20000;
  assert_int_equal(expire(s, "k", 0, t1, now), 0); /* no such key */
  set(s, "k", "v", 1, 0, 0, now);
  assert_int_equal(expire(s, "k", KC_KV_XX, t1, now), 0); /* none yet */
  assert_int_equal(expire(s, "k", KC_KV_GT, t1, now), 0); /* inf > t1 */
  assert_int_equal(expiry_of(s, "k", now), 0);
  assert_int_equal(expire(s, "k", KC_KV_LT, t2, now), 1); /* t2 < inf */
  assert_int_equal(expiry_of(s, "k", now), t2);
  assert_int_equal(expire(s, "k", KC_KV_NX, t1, now), 0); /* has one */
  assert_int_equal(expire(s, "k", KC_KV_GT, t1, now), 0);
  assert_int_equal(expire(s, "k", KC_KV_LT, t1, now), 1);
  assert_int_equal(expiry_of(s, "k", now), t1);
  assert_int_equal(expire(s, "k", KC_KV_XX | KC_KV_GT, t2, now), 1);
  assert_int_equal(expiry_of(s, "k", now), t2);
  expect_str(s, "k", "v");
  kc_store_kv_op op = apply1(s, KC_KV_PERSIST, "k", NULL, 0, 0, 0, now);
  assert_int_equal(op.done, 1);
  assert_int_equal(expiry_of(s, "k", now), 0);
  op = apply1(s, KC_KV_PERSIST, "k", NULL, 0, 0, 0, now);
  assert_int_equal(op.done, 0);
  /* the old expiry's index entry went: reclaim leaves the key alone */
  size_t removed = 9;
  OK(kc_store_kv_expire_step(s, t2 + 1, 100, &removed, errbuf));
  assert_int_equal(removed, 0);
  expect_str(s, "k", "v");
  /* an expiry in the past deletes */
  assert_int_equal(expire(s, "k", 0, now - 5, now), 1);
  assert_int_equal(count(s), 0);
  assert_int_equal(get_stats(s).blobs, 0);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
}

/* ---- expiry: on read, reclaimed, across a restart ---- */

static void test_expiry_read_reclaim_reopen(void **state) {
  fx *f = *state;
  kc_store *s = open_kv(f->dir, 0, 0, 0);
  int64_t now = now_ms(), soon = now + 1000, later = now + 3600 * 1000;
  set(s, "soon", "a", 1, 0, soon, now);
  set(s, "later", "b", 1, 0, later, now);
  set(s, "never", "c", 1, 0, 0, now);
  assert_true(present_at(s, "soon", soon - 1));
  assert_false(present_at(s, "soon", soon));
  assert_int_equal(count(s), 3); /* expired, not yet reclaimed */
  kc_store_close(s);

  /* absolute times survive a restart */
  s = open_kv(f->dir, 0, 0, 0);
  assert_int_equal(expiry_of(s, "later", now), later);
  assert_false(present_at(s, "soon", soon));
  assert_true(present_at(s, "soon", soon - 1));
  size_t removed = 9;
  OK(kc_store_kv_expire_step(s, soon - 1, 100, &removed, errbuf));
  assert_int_equal(removed, 0);
  OK(kc_store_kv_expire_step(s, later, 1, &removed, errbuf));
  assert_int_equal(removed, 1); /* at most max */
  OK(kc_store_kv_expire_step(s, later, 100, &removed, errbuf));
  assert_int_equal(removed, 1);
  assert_int_equal(count(s), 1);
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.blobs, 1);
  assert_int_equal(st.kv_bytes, 1);
  assert_true(present_at(s, "never", later * 2));
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
}

/* ---- SCAN and glob ---- */

typedef struct seen {
  unsigned char hits[1100];
  size_t calls, bad;
} seen;

static int scan_cb(const void *key, size_t klen, void *ud) {
  seen *z = ud;
  char buf[64];
  int i;
  z->calls++;
  if (klen >= sizeof buf)
    return z->bad++, 0;
  memcpy(buf, key, klen);
  buf[klen] = '\0';
  if (sscanf(buf, "key:%d", &i) == 1 && i >= 0 && i < 1000)
    z->hits[i]++;
  else if (sscanf(buf, "other:%d", &i) == 1 && i >= 0 && i < 100)
    z->hits[1000 + i]++;
  else
    z->bad++;
  return 0;
}

/* The walk: every call within its bound, the cursor ends at 0. */
static void scan_all(kc_store *s, const char *pat, size_t cnt, seen *z) {
  uint64_t cur = 0;
  int calls = 0;
  memset(z, 0, sizeof *z);
  do {
    size_t before = z->calls;
    OK(kc_store_kv_scan(s, cur, pat, pat ? strlen(pat) : 0, cnt, now_ms(),
                        scan_cb, z, &cur));
    assert_true(z->calls - before <= cnt);
    assert_true(++calls < 100000);
  } while (cur != 0);
}

static void test_scan(void **state) {
  fx *f = *state;
  kc_store *s = open_kv(f->dir, 0, 0, 0);
  kc_store_kv_op *ops = calloc(1100, sizeof *ops);
  char(*keys)[32] = calloc(1100, 32);
  assert_true(ops && keys);
  for (int i = 0; i < 1100; i++) {
    if (i < 1000)
      snprintf(keys[i], 32, "key:%d", i);
    else
      snprintf(keys[i], 32, "other:%d", i - 1000);
    ops[i] = (kc_store_kv_op){.op = KC_KV_SET,
                              .key = keys[i],
                              .klen = strlen(keys[i]),
                              .val = keys[i],
                              .vlen = strlen(keys[i])};
  }
  int64_t now = now_ms();
  OK(kc_store_kv_apply(s, ops, 1100, now, errbuf)); /* one transaction */
  for (int i = 0; i < 1100; i++)
    assert_int_equal(ops[i].done, 1);
  assert_int_equal(count(s), 1100);
  seen z;
  scan_all(s, "key:*", 10, &z);
  for (int i = 0; i < 1000; i++)
    assert_true(z.hits[i] >= 1);
  for (int i = 1000; i < 1100; i++)
    assert_int_equal(z.hits[i], 0);
  assert_int_equal(z.bad, 0);
  scan_all(s, NULL, 7, &z);
  for (int i = 0; i < 1100; i++)
    assert_true(z.hits[i] >= 1);
  scan_all(s, "other:[1-3]?", 1000, &z);
  for (int i = 0; i < 100; i++)
    assert_int_equal(z.hits[1000 + i], i >= 10 && i < 40);
  /* a pattern matching nothing: bounded work per call, still ends */
  scan_all(s, "nothing*", 5, &z);
  assert_int_equal(z.calls, 0);
  /* an expired key is not returned */
  set(s, "key:5", "x", 1, 0, now + 1, now);
  uint64_t cur = 0;
  memset(&z, 0, sizeof z);
  do
    OK(kc_store_kv_scan(s, cur, "key:5", 5, 1000, now + 2, scan_cb, &z, &cur));
  while (cur);
  assert_int_equal(z.hits[5], 0);
  free(ops);
  free(keys);
  kc_store_close(s);
}

static void test_glob(void **state) {
  (void)state;
  static const struct {
    const char *pat, *str;
    int want;
  } t[] = {
      {"*", "", 1},
      {"*", "abc", 1},
      {"", "", 1},
      {"", "a", 0},
      {"a", "", 0},
      {"abc", "abc", 1},
      {"abc", "abd", 0},
      {"a*", "a", 1},
      {"a*c", "abbbc", 1},
      {"a*c", "abbbd", 0},
      {"*c", "abc", 1},
      {"a**b", "axxb", 1},
      {"h?llo", "hello", 1},
      {"h?llo", "hllo", 0},
      {"h[ae]llo", "hallo", 1},
      {"h[ae]llo", "hillo", 0},
      {"h[^e]llo", "hallo", 1},
      {"h[^e]llo", "hello", 0},
      {"h[a-b]llo", "hbllo", 1},
      {"h[a-b]llo", "hcllo", 0},
      {"h[b-a]llo", "hallo", 1}, /* reversed */
      {"\\*", "*", 1},
      {"\\*", "a", 0},
      {"a\\?", "a?", 1},
      {"a\\?", "ab", 0},
      {"[\\]]", "]", 1},
      {"[\\-]", "-", 1},
      /* as Redis: "a-]" is the range a..] (the class left unclosed) */
      {"[a-]", "-", 0},
      {"[a-]", "_", 1},
      {"[]", "a", 0},
      {"[abc", "c", 1},
      {"[abc", "d", 0},
      {"ab\\", "ab\\", 1},
      {"x[", "x", 0},
      {"*.py", "cache/x.py", 1},
      {"*.py", "x.pyc", 0},
      {"a*b*c*d", "aXbYcZd", 1},
      {"a*b*c*d", "aXbYcZe", 0},
      {"[^a-c]x", "dx", 1},
      {"[^a-c]x", "bx", 0},
      {"a[\\^]", "a^", 1},
      {"[[]", "[", 1},
      {"?", "", 0},
      {"??", "ab", 1},
  };
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    int got = kc_store_kv_match(t[i].pat, strlen(t[i].pat), t[i].str,
                                strlen(t[i].str));
    if (got != t[i].want)
      fail_msg("match(\"%s\", \"%s\") = %d, want %d", t[i].pat, t[i].str, got,
               t[i].want);
  }
  /* binary: a NUL inside the pattern and the string */
  assert_int_equal(kc_store_kv_match("a\0*", 3, "a\0bc", 4), 1);
  assert_int_equal(kc_store_kv_match("a\0*", 3, "a\1bc", 4), 0);
  /* many stars against a long string: fast (no exponential backtracking) */
  char pat[200], str[20000];
  for (size_t i = 0; i < sizeof pat - 1; i++)
    pat[i] = i % 2 ? '*' : 'a';
  memset(str, 'a', sizeof str);
  str[sizeof str - 1] = 'b';
  pat[sizeof pat - 2] = 'b'; /* a*a*...a*b */
  assert_int_equal(kc_store_kv_match(pat, sizeof pat - 1, str, sizeof str), 1);
  pat[sizeof pat - 2] = 'c';
  assert_int_equal(kc_store_kv_match(pat, sizeof pat - 1, str, sizeof str), 0);
}

/* ---- FLUSH ---- */

static void test_flush(void **state) {
  fx *f = *state;
  kc_store *s = open_kv(f->dir, 0, 0, 0);
  int64_t now = now_ms();
  char hex[KC_HEX_LEN + 1];
  uint8_t *p = bytes(5000, 3);
  assert_int_equal(kc_sha256_hex(p, 5000, hex), KC_OK);
  int created;
  OK(kc_store_blob_put(s, hex, p, 5000, &created, errbuf));
  kc_manifest *m = one_file_manifest(hex, 5000);
  OK(kc_store_bundle_put(s, m, &created, NULL, NULL, errbuf));
  for (int i = 0; i < 50; i++) {
    char k[16];
    snprintf(k, sizeof k, "k%d", i);
    set(s, k, k, strlen(k), 0, i % 2 ? now + 100000 : 0, now);
  }
  set(s, "shared", p, 5000, 0, 0, now);
  kc_store_kv_op op = apply1(s, KC_KV_FLUSH, NULL, NULL, 0, 0, 0, now);
  assert_int_equal(op.err, KC_OK);
  assert_int_equal(op.done, 51);
  assert_int_equal(count(s), 0);
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.kv_bytes, 0);
  assert_int_equal(st.blobs, 1); /* the bundle's */
  assert_int_equal(kc_store_bundle_has(s, m->key), KC_OK);
  size_t removed;
  OK(kc_store_kv_expire_step(s, now + 200000, 100, &removed, errbuf));
  assert_int_equal(removed, 0);
  OK(kc_store_verify(s, errbuf));
  kc_manifest_free(m);
  kc_store_close(s);
  free(p);
}

/* ---- eviction ---- */

static void set_seed(kc_store *s, const char *key, size_t n, uint64_t seed) {
  uint8_t *p = bytes(n, seed);
  assert_int_equal(set(s, key, p, n, 0, 0, now_ms()), 1);
  free(p);
}

static kc_store *open_kv_grain(const char *dir, uint64_t max_bytes,
                               int64_t grain_ms) {
  kc_store_opts o = {
      .dir = dir, .max_bytes = max_bytes, .kv_use_grain_ms = grain_ms};
  return open_with(&o);
}

/* Under max_bytes: the least recently used keys go, a key read lately
 * stays (its use batched in memory, seen by eviction). Every GET counts
 * here (grain < 0): the default grain is tested below. */
static void test_evict_max_bytes(void **state) {
  fx *f = *state;
  kc_store *s = open_kv_grain(f->dir, 1 * MiB, -1);
  char k[32];
  for (int i = 0; i < 8; i++) {
    snprintf(k, sizeof k, "k%d", i);
    set_seed(s, k, 64 * KiB, (uint64_t)i);
    usleep(2000);
  }
  assert_true(present(s, "k0")); /* a read: now the most recent */
  usleep(2000);
  for (int i = 8; i < 40; i++) {
    snprintf(k, sizeof k, "k%d", i);
    set_seed(s, k, 64 * KiB, (uint64_t)i);
    usleep(2000);
    if (i % 4 == 0)
      assert_true(present(s, "k0"));
  }
  kc_store_stats st = get_stats(s);
  assert_true(st.bytes_used <= 1 * MiB);
  assert_true(st.evicted_kv > 0);
  assert_true(present(s, "k0"));
  assert_false(present(s, "k1"));
  assert_true(present(s, "k39"));
  assert_int_equal(st.kv_keys * 64 * KiB, st.kv_bytes);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
}

/* Sets a, then b and 20 more, reads a five times, then fills a 4 MiB store
 * until its first eviction (about 6 of 64 keys): whether a survived it. */
static int read_key_survives(const char *dir, int64_t grain_ms) {
  kc_store *s = open_kv_grain(dir, 4 * MiB, grain_ms);
  char k[32];
  set_seed(s, "a", 64 * KiB, 1);
  for (int i = 0; i < 21; i++) {
    usleep(1000);
    snprintf(k, sizeof k, "%c%d", i ? 'x' : 'b', i);
    set_seed(s, i ? k : "b", 64 * KiB, 2 + (uint64_t)i);
  }
  usleep(1000);
  for (int i = 0; i < 5; i++)
    assert_true(present(s, "a"));
  for (int i = 0; i < 128 && get_stats(s).evicted_kv == 0; i++) {
    usleep(1000);
    snprintf(k, sizeof k, "k%d", i);
    set_seed(s, k, 64 * KiB, 100 + (uint64_t)i);
  }
  assert_true(get_stats(s).evicted_kv > 0);
  assert_false(present(s, "b")); /* the oldest, unread: gone either way */
  int kept = present(s, "a");
  kc_store_close(s);
  return kept;
}

/* The default grain: a GET of a key set or used less than 10 s ago records
 * no use (a hot key costs the table and the flush once per grain, not once
 * per GET), so such a read does not save it from eviction; with every GET
 * counted (grain < 0) it does. */
static void test_evict_use_grain(void **state) {
  fx *f = *state;
  char exact[512];
  snprintf(exact, sizeof exact, "%s/exact", f->dir);
  assert_int_equal(mkdir(exact, 0700), 0);
  assert_true(read_key_survives(exact, -1));
  assert_false(read_key_survives(f->dir, 0));
}

/* kv_max_bytes: a flood of RESP keys cannot evict the bundles; the RESP
 * side stays within its cap. */
static void test_evict_kv_cap_spares_bundles(void **state) {
  fx *f = *state;
  kc_store *s = open_kv(f->dir, 4 * MiB, 1 * MiB, 0);
  kc_manifest *m[4];
  for (int i = 0; i < 4; i++)
    m[i] = bundle_of_new_blob(s, 512 * KiB, 100 + (uint64_t)i, (uint64_t)i);
  sleep(1); /* the bundles are older than every RESP key */
  char k[32];
  for (int i = 0; i < 100; i++) {
    snprintf(k, sizeof k, "torch:%d", i);
    set_seed(s, k, 64 * KiB, 1000 + (uint64_t)i);
  }
  kc_store_stats st = get_stats(s);
  assert_true(st.kv_bytes <= 1 * MiB);
  assert_true(st.bytes_used <= 4 * MiB);
  assert_true(st.evicted_kv > 0);
  assert_int_equal(st.evicted_bundles, 0);
  for (int i = 0; i < 4; i++)
    assert_int_equal(kc_store_bundle_has(s, m[i]->key), KC_OK);
  assert_true(present(s, "torch:99"));
  assert_false(present(s, "torch:0"));
  /* a value over the cap is refused alone */
  uint8_t *big = bytes(2 * MiB, 5);
  kc_store_kv_op op = {
      .op = KC_KV_SET, .key = "big", .klen = 3, .val = big, .vlen = 2 * MiB};
  OK(kc_store_kv_apply(s, &op, 1, now_ms(), errbuf));
  assert_int_equal(op.err, KC_TOO_LARGE);
  free(big);
  OK(kc_store_verify(s, errbuf));
  for (int i = 0; i < 4; i++)
    kc_manifest_free(m[i]);
  kc_store_close(s);
}

/* With a RESP cap: while the bundles hold more than the rest of max_bytes,
 * they go first, though the RESP keys are older. */
static void test_evict_bundles_over_share(void **state) {
  fx *f = *state;
  kc_store *s = open_kv(f->dir, 4 * MiB, 2 * MiB, 0);
  set_seed(s, "old1", 256 * KiB, 1);
  set_seed(s, "old2", 256 * KiB, 2);
  sleep(1);
  kc_manifest *m[6];
  for (int i = 0; i < 6; i++)
    m[i] = bundle_of_new_blob(s, 512 * KiB, 200 + (uint64_t)i, (uint64_t)i);
  assert_int_equal(get_stats(s).evicted_bundles, 0);
  set_seed(s, "new", 512 * KiB, 3);
  kc_store_stats st = get_stats(s);
  assert_true(st.evicted_bundles >= 1);
  assert_int_equal(st.evicted_kv, 0);
  assert_true(present(s, "old1"));
  assert_true(present(s, "old2"));
  assert_true(present(s, "new"));
  assert_true(st.bytes_used <= 4 * MiB / 100 * 95);
  OK(kc_store_verify(s, errbuf));
  for (int i = 0; i < 6; i++)
    kc_manifest_free(m[i]);
  kc_store_close(s);
}

/* Without a RESP cap, eviction takes the oldest of either side. */
static void test_evict_oldest_across_sides(void **state) {
  fx *f = *state;
  kc_store *s = open_kv(f->dir, 2 * MiB, 0, 0);
  set_seed(s, "old", 512 * KiB, 1);
  sleep(1);
  kc_manifest *m = bundle_of_new_blob(s, 512 * KiB, 2, 1);
  sleep(1);
  set_seed(s, "new1", 512 * KiB, 3);
  set_seed(s, "new2", 512 * KiB, 4); /* over 95%: evicts the oldest */
  assert_false(present(s, "old"));
  assert_int_equal(kc_store_bundle_has(s, m->key), KC_OK);
  assert_true(present(s, "new1"));
  assert_true(present(s, "new2"));
  OK(kc_store_verify(s, errbuf));
  kc_manifest_free(m);
  kc_store_close(s);
}

/* ---- a batch ---- */

/* Ops run in order in one transaction, each with its own result: a bad key,
 * a value over the limit and one the full map cannot hold fail alone. */
static void test_batch_one_failing(void **state) {
  fx *f = *state;
  kc_store *s = open_kv(f->dir, 0, 0, 4 * MiB); /* a small map, no limit */
  uint8_t *huge = bytes(6 * MiB, 9);
  int64_t now = now_ms();
  kc_store_kv_op ops[] = {
      {.op = KC_KV_SET, .key = "a", .klen = 1, .val = "1", .vlen = 1},
      {.op = KC_KV_SET, .key = "", .klen = 0, .val = "x", .vlen = 1},
      {.op = KC_KV_SET, .key = "huge", .klen = 4, .val = huge, .vlen = 6 * MiB},
      {.op = KC_KV_SET,
       .key = "a",
       .klen = 1,
       .val = "2",
       .vlen = 1,
       .flags = KC_KV_GET},
      {.op = KC_KV_DEL, .key = "nope", .klen = 4},
      {.op = KC_KV_SET, .key = "b", .klen = 1, .val = "3", .vlen = 1},
  };
  size_t n = sizeof ops / sizeof ops[0];
  OK(kc_store_kv_apply(s, ops, n, now, errbuf));
  assert_int_equal(ops[0].err, KC_OK);
  assert_int_equal(ops[0].done, 1);
  assert_int_equal(ops[1].err, KC_BAD_KEY);
  assert_int_equal(ops[2].err, KC_STORE_FULL);
  assert_int_equal(ops[2].done, 0);
  assert_int_equal(ops[3].err, KC_OK);
  assert_int_equal(ops[3].had_old, 1); /* sees op 0 of the same batch */
  assert_memory_equal(ops[3].old, "1", 1);
  assert_int_equal(ops[4].done, 0);
  assert_int_equal(ops[5].done, 1);
  free(ops[3].old);
  expect_str(s, "a", "2");
  expect_str(s, "b", "3");
  assert_false(present(s, "huge"));
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
  /* with a limit: over it, KC_TOO_LARGE before any write */
  s = open_kv(f->dir, 1 * MiB, 0, 4 * MiB);
  kc_store_kv_op op = {
      .op = KC_KV_SET, .key = "huge", .klen = 4, .val = huge, .vlen = 2 * MiB};
  OK(kc_store_kv_apply(s, &op, 1, now, errbuf));
  assert_int_equal(op.err, KC_TOO_LARGE);
  kc_store_close(s);
  free(huge);
}

/* Concurrent batches from several threads all land. */
typedef struct writer {
  kc_store *s;
  int id;
  kc_err e;
} writer;

static void *writer_main(void *ud) {
  writer *w = ud;
  char keys[8][32], vals[8][32];
  for (int round = 0; round < 50 && !w->e; round++) {
    kc_store_kv_op ops[8];
    for (int i = 0; i < 8; i++) {
      snprintf(keys[i], 32, "w%d:%d", w->id, round * 8 + i);
      snprintf(vals[i], 32, "v%d", round * 8 + i);
      ops[i] = (kc_store_kv_op){.op = KC_KV_SET,
                                .key = keys[i],
                                .klen = strlen(keys[i]),
                                .val = vals[i],
                                .vlen = strlen(vals[i])};
    }
    w->e = kc_store_kv_apply(w->s, ops, 8, now_ms(), NULL);
    for (int i = 0; i < 8 && !w->e; i++)
      if (ops[i].err || ops[i].done != 1)
        w->e = KC_INTERNAL;
  }
  return NULL;
}

static void test_concurrent_writers(void **state) {
  fx *f = *state;
  kc_store *s = open_kv(f->dir, 0, 0, 0);
  pthread_t th[4];
  writer w[4];
  for (int i = 0; i < 4; i++) {
    w[i] = (writer){s, i, KC_OK};
    assert_int_equal(pthread_create(&th[i], NULL, writer_main, &w[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(w[i].e, KC_OK);
  }
  assert_int_equal(count(s), 4 * 400);
  expect_str(s, "w3:399", "v399");
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
}

/* ---- crash safety ---- */

/* The child sets keys in batches of 1..4 and, after each apply returned,
 * writes the last index of the batch to the pipe. Never returns. */
static void crash_child(const char *dir, int round, int fd) {
  kc_store_opts o;
  memset(&o, 0, sizeof o);
  o.dir = dir;
  kc_store *s = NULL;
  if (kc_store_open(&o, &s, NULL) != KC_OK)
    _exit(10);
  if (write(fd, "r", 1) != 1)
    _exit(11);
  uint8_t *buf = malloc(4 * 64 * KiB);
  char keys[4][32];
  if (!buf)
    _exit(12);
  for (uint32_t j = 0; j < 1000000; j += 4) {
    kc_store_kv_op ops[4];
    size_t n = 1 + j / 4 % 4;
    for (size_t i = 0; i < n; i++) {
      uint32_t id = (uint32_t)round * 1000000 + j + (uint32_t)i;
      size_t len = 1 + id * 7919u % (64 * KiB);
      fill(buf + i * 64 * KiB, len, id);
      snprintf(keys[i], 32, "c:%u", id);
      ops[i] = (kc_store_kv_op){.op = KC_KV_SET,
                                .key = keys[i],
                                .klen = strlen(keys[i]),
                                .val = buf + i * 64 * KiB,
                                .vlen = len};
    }
    if (kc_store_kv_apply(s, ops, n, now_ms(), NULL) != KC_OK)
      _exit(20);
    uint32_t last = (uint32_t)round * 1000000 + j + (uint32_t)n - 1;
    if (write(fd, &last, sizeof last) != sizeof last)
      _exit(21);
  }
  _exit(0);
}

static void check_acked(kc_store *s, uint32_t round, uint32_t upto) {
  uint8_t *buf = malloc(64 * KiB);
  assert_non_null(buf);
  for (uint32_t j = 0; j <= upto % 1000000; j += 4) {
    size_t n = 1 + j / 4 % 4;
    for (size_t i = 0; i < n; i++) {
      uint32_t id = round * 1000000 + j + (uint32_t)i;
      if (id > upto)
        break;
      size_t len = 1 + id * 7919u % (64 * KiB);
      char key[32];
      fill(buf, len, id);
      snprintf(key, sizeof key, "c:%u", id);
      expect_val(s, key, strlen(key), buf, len, now_ms());
    }
  }
  free(buf);
}

static void test_crash_sigkill(void **state) {
  fx *f = *state;
  srand((unsigned)time(NULL) ^ (unsigned)getpid());
  size_t acked_total = 0;
  for (uint32_t round = 0; round < 4; round++) {
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      close(pfd[0]);
      crash_child(f->dir, (int)round, pfd[1]);
    }
    close(pfd[1]);
    char c;
    assert_int_equal(read(pfd[0], &c, 1), 1);
    usleep(100000 + (useconds_t)(rand() % 300000));
    kill(pid, SIGKILL);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    uint32_t last = 0, v;
    int any = 0;
    while (read(pfd[0], &v, sizeof v) == (ssize_t)sizeof v) {
      last = v;
      any = 1;
    }
    close(pfd[0]);
    kc_store *s = open_kv(f->dir, 0, 0, 0);
    OK(kc_store_verify(s, errbuf));
    if (any) {
      check_acked(s, round, last);
      acked_total += last % 1000000 + 1;
    }
    kc_store_close(s);
  }
  print_message("crash test: %zu acknowledged keys all read back\n",
                acked_total);
  assert_true(acked_total > 0);
}

/* ---- scrub ---- */

/* LMDB keeps no checksums: flip a byte of a value inside the data file. */
static int flip_in_dir(const char *dir, const uint8_t *pat, size_t plen) {
  DIR *dp = opendir(dir);
  assert_non_null(dp);
  struct dirent *de;
  int flipped = 0;
  while ((de = readdir(dp)) != NULL) {
    char p[4096];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
    if (stat(p, &st) || !S_ISREG(st.st_mode) || st.st_size == 0)
      continue;
    int fd = open(p, O_RDWR);
    assert_true(fd >= 0);
    uint8_t *buf = malloc((size_t)st.st_size);
    assert_non_null(buf);
    assert_int_equal(pread(fd, buf, (size_t)st.st_size, 0), st.st_size);
    uint8_t *hit = memmem(buf, (size_t)st.st_size, pat, plen);
    if (hit) {
      uint8_t b = hit[plen / 2] ^ 0x5a;
      assert_int_equal(pwrite(fd, &b, 1, (hit - buf) + (off_t)plen / 2), 1);
      flipped++;
    }
    free(buf);
    close(fd);
  }
  closedir(dp);
  return flipped;
}

static void test_scrub_rotted_value(void **state) {
  fx *f = *state;
  kc_store *s = open_kv(f->dir, 0, 0, 16 * MiB);
  uint8_t *bad = bytes(6000, 21), *good = bytes(7000, 22);
  int64_t now = now_ms();
  set(s, "r1", bad, 6000, 0, 0, now);
  set(s, "r2", bad, 6000, 0, now + 100000, now);
  set(s, "ok", good, 7000, 0, 0, now);
  kc_store_close(s);
  assert_true(flip_in_dir(f->dir, bad, 6000) >= 1);
  s = open_kv(f->dir, 0, 0, 16 * MiB);
  EXPECT(kc_store_verify(s, errbuf), KC_CORRUPT);
  kc_store_scrub sc = {0};
  for (int i = 0; i < 4 && !sc.removed; i++)
    OK(kc_store_scrub_step(s, &sc, UINT64_MAX, errbuf));
  assert_int_equal(sc.removed, 1);
  assert_int_equal(sc.kv_keys, 2);
  assert_int_equal(sc.bundles, 0);
  assert_false(present(s, "r1"));
  assert_false(present(s, "r2"));
  expect_val(s, "ok", 2, good, 7000, now);
  assert_int_equal(count(s), 1);
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.kv_bytes, 7000);
  assert_int_equal(st.blobs, 1);
  OK(kc_store_verify(s, errbuf));
  size_t removed;
  OK(kc_store_kv_expire_step(s, now + 200000, 100, &removed, errbuf));
  assert_int_equal(removed, 0);
  /* the next SET of the value stores it anew */
  set(s, "r1", bad, 6000, 0, 0, now);
  expect_val(s, "r1", 2, bad, 6000, now);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
  free(bad);
  free(good);
}

/* ---- the durable tier ---- */

static kc_store *open_tier(const char *dir, uint64_t max_bytes,
                           const kc_store_s3 *s3) {
  kc_store_opts o = {.dir = dir, .max_bytes = max_bytes, .s3 = s3};
  return open_with(&o); /* S3 is not contacted to open */
}

/* S3 down: writes are acknowledged and queued (the value's blob, then the
 * record; a DEL and a FLUSH their removals); a key waiting in the queue is
 * not evicted; read-through answers at once. */
static void test_tier_queue_when_s3_down(void **state) {
  fx *f = *state;
  kc_store_s3 s3 = {.endpoint = "http://127.0.0.1:1",
                    .bucket = "kcache-test",
                    .path_style = 1,
                    .access_key = "AK",
                    .secret_key = "SK"};
  kc_store *s = open_tier(f->dir, 1 * MiB, &s3);
  int64_t now = now_ms();
  set_seed(s, "a", 300 * KiB, 1);
  assert_int_equal(queue_depth(s), 2);
  set_seed(s, "b", 300 * KiB, 1); /* the same value: the record alone */
  assert_int_equal(queue_depth(s), 3);
  assert_int_equal(expire(s, "b", 0, now + 100000, now), 1);
  assert_int_equal(queue_depth(s), 4);
  assert_int_equal(del(s, "nope"), 0); /* the bucket may hold it */
  assert_int_equal(queue_depth(s), 5);
  set_seed(s, "c", 300 * KiB, 2);
  set_seed(s, "d", 300 * KiB, 3);
  OK(kc_store_evict(s, 0, errbuf));
  assert_true(present(s, "a"));
  assert_true(present(s, "d"));
  assert_int_equal(get_stats(s).evicted_kv, 0);
  kc_store_kv_op op = apply1(s, KC_KV_FLUSH, NULL, NULL, 0, 0, 0, now);
  assert_int_equal(op.done, 4);
  assert_int_equal(queue_depth(s), 13);
  errbuf[0] = '\0';
  kc_err e = kc_store_kv_fetch(s, "a", 1, now, errbuf);
  assert_true(e == KC_UNAVAILABLE || e == KC_TIMEOUT || e == KC_IO);
  assert_int_equal(kc_store_kv_fetch(s, "a", 1, now, errbuf), KC_UNAVAILABLE);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
  /* without a tier: a miss */
  s = open_kv(f->dir, 0, 0, 0);
  EXPECT(kc_store_kv_fetch(s, "a", 1, now, errbuf), KC_NOT_FOUND);
  kc_store_close(s);
}

static kc_testrgw g_rgw;
static char g_bucket[64];

static kc_store_s3 rgw_s3(void) {
  kc_store_s3 s3 = {.endpoint = g_rgw.endpoint,
                    .bucket = g_bucket,
                    .region = g_rgw.region,
                    .path_style = 1,
                    .access_key = g_rgw.access,
                    .secret_key = g_rgw.secret};
  return s3;
}

static int rgw_setup(void **state) {
  (void)state;
  return kc_testrgw_bucket(&g_rgw, "kcache-kv", g_bucket, sizeof g_bucket,
                           NULL);
}

static void drain(kc_store *s) {
  for (int i = 0; i < 300 && queue_depth(s) > 0; i++)
    usleep(50000);
  assert_int_equal(queue_depth(s), 0);
}

static void expect_fetch(kc_store *s, const char *key, kc_err want) {
  EXPECT(kc_store_kv_fetch(s, key, strlen(key), now_ms(), errbuf), want);
}

/* One store writes through; another, with an empty LMDB, reads through:
 * values, expiries and deletes as the first left them. */
static void test_tier_write_read_through(void **state) {
  fx *f = *state;
  kc_store_s3 s3 = rgw_s3();
  char dir_b[4096];
  snprintf(dir_b, sizeof dir_b, "%s/b", f->tmp);
  kc_store *a = open_tier(f->dir, 0, &s3);
  int64_t now = now_ms();
  uint8_t *big = bytes(3 * MiB, 77);
  assert_int_equal(set(a, "torch:big", big, 3 * MiB, 0, 0, now), 1);
  set(a, "ttl", "t", 1, 0, now + 3600 * 1000, now);
  set(a, "short", "s", 1, 0, now + 1500, now);
  set(a, "gone", "g", 1, 0, 0, now);
  set(a, "changed", "v1", 2, 0, 0, now);
  set(a, "changed", "v2", 2, 0, 0, now);
  assert_int_equal(del(a, "gone"), 1);
  drain(a);

  kc_store *b = open_tier(dir_b, 0, &s3);
  assert_false(present(b, "torch:big"));
  expect_fetch(b, "torch:big", KC_OK);
  expect_val(b, "torch:big", 9, big, 3 * MiB, now_ms());
  expect_fetch(b, "ttl", KC_OK);
  assert_int_equal(expiry_of(b, "ttl", now), now + 3600 * 1000);
  expect_fetch(b, "changed", KC_OK);
  expect_str(b, "changed", "v2");
  expect_fetch(b, "gone", KC_NOT_FOUND);
  expect_fetch(b, "never-set", KC_NOT_FOUND);
  usleep(1600 * 1000);
  expect_fetch(b, "short", KC_NOT_FOUND); /* expired in the bucket too */
  /* a key written here since is kept */
  set(b, "mine", "local", 5, 0, 0, now);
  set(a, "mine", "remote", 6, 0, 0, now);
  drain(a);
  expect_fetch(b, "mine", KC_OK);
  expect_str(b, "mine", "local");
  /* a FLUSH reaches the bucket */
  kc_store_kv_op op = apply1(a, KC_KV_FLUSH, NULL, NULL, 0, 0, 0, now_ms());
  assert_true(op.done >= 4);
  drain(a);
  kc_store_close(b);
  char dir_c[4096];
  snprintf(dir_c, sizeof dir_c, "%s/c", f->tmp);
  kc_store *c = open_tier(dir_c, 0, &s3);
  expect_fetch(c, "torch:big", KC_NOT_FOUND);
  expect_fetch(c, "ttl", KC_NOT_FOUND);
  OK(kc_store_verify(a, errbuf));
  kc_store_close(a);
  kc_store_close(c);
  free(big);
}

/* ---- main ---- */

static int run_rgw(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_tier_write_read_through, fx_setup,
                                      fx_teardown),
  };
  int up = kc_testrgw_up(&g_rgw, "test_store_kv");
  int fails = up == 0 ? _cmocka_run_group_tests("store_kv_s3", tests, 1,
                                                rgw_setup, NULL)
                      : 0;
  return kc_testrgw_finish(&g_rgw, up, fails);
}

/* ---- SETs that change little (appended) ---- */

/* Bytes this process passed to write(2)/pwrite(2) so far. */
static uint64_t wchar_now(void) {
  FILE *fp = fopen("/proc/self/io", "r");
  char line[128];
  uint64_t v = 0;
  while (fp && fgets(line, sizeof line, fp))
    if (sscanf(line, "wchar: %" SCNu64, &v) == 1)
      break;
  if (fp)
    fclose(fp);
  return v;
}

/* A SET of the value and expiry the key holds writes nothing (no commit
 * pages); one that changes the value or the expiry keeps the refcounts,
 * kv_bytes and the expiry index right, in one batch or many. */
static void test_set_same_and_replace(void **state) {
  fx *f = *state;
  kc_store *s = open_kv(f->dir, 0, 0, 0);
  size_t n = 100 * KiB, m = 50 * KiB;
  uint8_t *p = bytes(n, 21), *q = bytes(m, 22);
  int64_t now = now_ms(), exp = now + 100000;
  assert_int_equal(set(s, "k", p, n, 0, 0, now), 1);
  uint64_t w0 = wchar_now();
  for (int i = 0; i < 10; i++)
    assert_int_equal(set(s, "k", p, n, 0, 0, now), 1);
  if (w0) /* /proc/self/io readable */
    assert_true(wchar_now() - w0 < 4096);
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.blobs, 1);
  assert_int_equal(st.kv_keys, 1);
  assert_int_equal(st.kv_bytes, n);
  expect_val(s, "k", 1, p, n, now);
  /* the same value with an expiry, again, then none */
  assert_int_equal(set(s, "k", p, n, 0, exp, now), 1);
  assert_int_equal(set(s, "k", p, n, 0, exp, now), 1);
  assert_int_equal(get_stats(s).kv_expires, 1);
  assert_int_equal(expiry_of(s, "k", now), exp);
  assert_int_equal(set(s, "k", p, n, KC_KV_KEEPTTL, 0, now), 1);
  assert_int_equal(expiry_of(s, "k", now), exp);
  assert_int_equal(set(s, "k", p, n, 0, 0, now), 1);
  assert_int_equal(get_stats(s).kv_expires, 0);
  /* another value: the old one is freed, the bytes follow */
  assert_int_equal(set(s, "k", q, m, 0, exp, now), 1);
  st = get_stats(s);
  assert_int_equal(st.blobs, 1);
  assert_int_equal(st.kv_bytes, m);
  assert_int_equal(st.kv_expires, 1);
  expect_val(s, "k", 1, q, m, now);
  /* one batch: a=p, b=p, k=p (same expiry), a=q, b deleted */
  kc_store_kv_op ops[5] = {
      {.op = KC_KV_SET, .key = "a", .klen = 1, .val = p, .vlen = n},
      {.op = KC_KV_SET, .key = "b", .klen = 1, .val = p, .vlen = n},
      {.op = KC_KV_SET,
       .key = "k",
       .klen = 1,
       .val = p,
       .vlen = n,
       .expire_ms = exp},
      {.op = KC_KV_SET, .key = "a", .klen = 1, .val = q, .vlen = m},
      {.op = KC_KV_DEL, .key = "b", .klen = 1}};
  OK(kc_store_kv_apply(s, ops, 5, now, errbuf));
  for (int i = 0; i < 5; i++) {
    assert_int_equal(ops[i].err, KC_OK);
    assert_int_equal(ops[i].done, 1);
  }
  st = get_stats(s);
  assert_int_equal(st.kv_keys, 2);
  assert_int_equal(st.kv_bytes, n + m);
  assert_int_equal(st.blobs, 2);
  assert_int_equal(st.kv_expires, 1);
  expect_val(s, "a", 1, q, m, now);
  expect_val(s, "k", 1, p, n, now);
  /* every reference counted once: deleting both frees both values */
  assert_int_equal(del(s, "a"), 1);
  assert_int_equal(del(s, "k"), 1);
  st = get_stats(s);
  assert_int_equal(st.blobs, 0);
  assert_int_equal(st.kv_bytes, 0);
  assert_int_equal(st.kv_expires, 0);
  kc_store_close(s);
  free(p);
  free(q);
}

/* kc_store_kv_set_settled on its own read. */
static int settled(kc_store *s, kc_store_kv_op *op, int64_t now) {
  kc_store_read *r;
  OK(kc_store_read_begin(s, &r));
  int v = kc_store_kv_set_settled(r, op, now);
  kc_store_read_end(r);
  return v;
}

static kc_store_kv_op set_op(const char *key, const void *val, size_t vlen,
                             int flags, int64_t exp) {
  kc_store_kv_op op = {.op = KC_KV_SET,
                       .key = key,
                       .klen = strlen(key),
                       .val = val,
                       .vlen = vlen,
                       .flags = flags,
                       .expire_ms = exp};
  return op;
}

/* One op through the commit: the op as it is (hashes and all). */
static void apply_op(kc_store *s, kc_store_kv_op *op, int64_t now) {
  OK(kc_store_kv_apply(s, op, 1, now, errbuf));
  assert_int_equal(op->err, KC_OK);
  free(op->old);
  op->old = NULL;
}

/* A SET the committed state settles needs no commit: the value and expiry
 * the key holds already (a raw blob compared, a compressed one by digest;
 * KEEPTTL), and NX/XX refusals. Anything that changes what is stored goes
 * to the commit, hashed once: a new key, another value of the same size
 * after an identical SET, an expiry added or cleared (SET without EX
 * clears a TTL, as in Redis), a key expired, and SET ... GET. */
static void settled_cases(kc_store *s, const uint8_t *p, const uint8_t *q,
                          size_t n) {
  int64_t now = now_ms(), exp = now + 100000;
  kc_store_kv_op op = set_op("k", p, n, 0, 0);
  assert_int_equal(settled(s, &op, now), 0); /* a new key */
  char hex[KC_HEX_LEN + 1];
  assert_int_equal(op.hashed, 1);
  OK(kc_sha256_hex(p, n, hex));
  assert_string_equal(op.val_hex, hex);
  OK(kc_sha256_hex("k", 1, hex));
  assert_string_equal(op.key_hex, hex);
  apply_op(s, &op, now);
  assert_int_equal(op.done, 1);
  expect_val(s, "k", 1, p, n, now);
  kc_store_stats st0 = get_stats(s);
  /* the same value again: settled, nothing written */
  for (int i = 0; i < 3; i++) {
    op = set_op("k", p, n, 0, 0);
    op.done = 7;
    assert_int_equal(settled(s, &op, now), 1);
    assert_int_equal(op.done, 1);
  }
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.kv_keys, st0.kv_keys);
  assert_int_equal(st.bytes_used, st0.bytes_used);
  /* NX on a live key, XX on a missing one: refused without a write; NX
   * on a missing key and GET are the commit's */
  op = set_op("k", q, n, KC_KV_NX, 0);
  assert_int_equal(settled(s, &op, now), 1);
  assert_int_equal(op.done, 0);
  op = set_op("none", q, n, KC_KV_XX, 0);
  assert_int_equal(settled(s, &op, now), 1);
  assert_int_equal(op.done, 0);
  assert_false(present(s, "none"));
  op = set_op("none", q, n, KC_KV_NX, 0);
  assert_int_equal(settled(s, &op, now), 0);
  op = set_op("k", p, n, KC_KV_GET, 0);
  assert_int_equal(settled(s, &op, now), 0);
  /* another value of the same size after the identical one */
  op = set_op("k", q, n, 0, 0);
  assert_int_equal(settled(s, &op, now), 0);
  apply_op(s, &op, now);
  expect_val(s, "k", 1, q, n, now);
  op = set_op("k", q, n, 0, 0);
  assert_int_equal(settled(s, &op, now), 1);
  /* an expiry added: the commit's; then the same expiry, and KEEPTTL */
  op = set_op("k", q, n, 0, exp);
  assert_int_equal(settled(s, &op, now), 0);
  apply_op(s, &op, now);
  assert_int_equal(expiry_of(s, "k", now), exp);
  op = set_op("k", q, n, 0, exp);
  assert_int_equal(settled(s, &op, now), 1);
  op = set_op("k", q, n, KC_KV_KEEPTTL, 0);
  assert_int_equal(settled(s, &op, now), 1);
  assert_int_equal(expiry_of(s, "k", now), exp);
  /* the same value without EX clears the TTL: not settled */
  op = set_op("k", q, n, 0, 0);
  assert_int_equal(settled(s, &op, now), 0);
  apply_op(s, &op, now);
  assert_int_equal(expiry_of(s, "k", now), 0);
  /* expired by then: the key is gone, the SET is a write */
  op = set_op("k", q, n, 0, exp);
  apply_op(s, &op, now);
  op = set_op("k", q, n, 0, exp);
  assert_int_equal(settled(s, &op, exp + 1), 0);
  op = set_op("k", q, n, KC_KV_NX, 0);
  assert_int_equal(settled(s, &op, exp + 1), 0);
  OK(kc_store_verify(s, errbuf));
}

static void test_set_settled(void **state) {
  fx *f = *state;
  size_t n = 8 * KiB;
  uint8_t *p = bytes(n, 31), *q = bytes(n, 32);
  kc_store *s = open_kv(f->dir, 0, 0, 0);
  settled_cases(s, p, q, n); /* raw blobs: compared */
  kc_store_close(s);
  free(p);
  free(q);
}

/* The same with compressed blobs (compared by digest), and a value whose
 * blob is held already is not compressed again but shares it. */
static void test_set_settled_compressed(void **state) {
  fx *f = *state;
  size_t n = 8 * KiB;
  uint8_t *p = malloc(n), *q = malloc(n);
  assert_non_null(p);
  assert_non_null(q);
  for (size_t i = 0; i < n; i++) {
    p[i] = (uint8_t)("compressible "[i % 13]);
    q[i] = (uint8_t)("other text "[i % 11]);
  }
  kc_store_opts o = {.dir = f->dir, .compress_level = 3};
  kc_store *s = open_with(&o);
  settled_cases(s, p, q, n);
  kc_store_stats st = get_stats(s);
  assert_true(st.bytes_used < n); /* q held compressed */
  int64_t now = now_ms();
  assert_int_equal(set(s, "k2", q, n, 0, 0, now), 1);
  assert_int_equal(get_stats(s).blobs, st.blobs);
  assert_int_equal(del(s, "k"), 1);
  expect_val(s, "k2", 2, q, n, now);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
  free(p);
  free(q);
}

/* RESP keys' own bytes count toward max_bytes: long keys
 * with 1-byte values cannot fill the disk past the limit. 10,000 keys of
 * 2 KiB, batched as a pipelining client would, in a 4 MiB store. */
static void test_key_bytes_counted(void **state) {
  fx *f = *state;
  uint64_t max = 4 * MiB;
  kc_store *s = open_kv(f->dir, max, 0, 0);
  enum { N = 10000, KLEN = 2 * KiB, BATCH = 100 };
  char *keys = malloc((size_t)BATCH * KLEN);
  assert_non_null(keys);
  kc_store_kv_op ops[BATCH];
  uint64_t peak = 0;
  for (int b = 0; b < N / BATCH; b++) {
    for (int i = 0; i < BATCH; i++) {
      char *k = keys + (size_t)i * KLEN;
      memset(k, 'k', KLEN);
      snprintf(k, 16, "%08d", b * BATCH + i);
      ops[i] = (kc_store_kv_op){
          .op = KC_KV_SET, .key = k, .klen = KLEN, .val = "v", .vlen = 1};
    }
    OK(kc_store_kv_apply(s, ops, BATCH, now_ms(), errbuf));
    for (int i = 0; i < BATCH; i++)
      assert_int_equal(ops[i].err, KC_OK);
    kc_store_stats st = get_stats(s);
    if (b == 0) /* grows by at least the key bytes */
      assert_true(st.bytes_used >= 1 + (uint64_t)BATCH * KLEN);
    assert_true(st.bytes_used <= max);
    peak = st.bytes_used > peak ? st.bytes_used : peak;
  }
  kc_store_stats st = get_stats(s);
  assert_true(st.evicted_kv > 0);
  assert_true(st.kv_keys < N);
  assert_true(st.kv_keys * KLEN <= st.bytes_used);
  assert_int_equal(st.bytes_used, 1 + st.kv_keys * KC_KV_KEY_BYTES(KLEN));
  assert_true(peak > max / 2);
  OK(kc_store_verify(s, errbuf));
  /* removing every key gives all of it back */
  kc_store_kv_op fl = {.op = KC_KV_FLUSH};
  OK(kc_store_kv_apply(s, &fl, 1, now_ms(), errbuf));
  st = get_stats(s);
  assert_int_equal(st.bytes_used, 0);
  assert_int_equal(st.kv_keys, 0);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
  free(keys);
}

/* A store written before RESP keys' bytes counted: bytes_used without them
 * and no "kv_keys_counted" flag in meta. */
static void make_uncounted(const char *dir, uint64_t keys_bytes) {
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi meta;
  assert_int_equal(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, 32);
  assert_int_equal(mdb_env_open(env, dir, 0, 0640), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
  assert_int_equal(mdb_dbi_open(txn, "meta", 0, &meta), 0);
  MDB_val flag = {15, "kv_keys_counted"}, used = {10, "bytes_used"}, v;
  assert_int_equal(mdb_del(txn, meta, &flag, NULL), 0);
  assert_int_equal(mdb_get(txn, meta, &used, &v), 0);
  uint64_t n;
  memcpy(&n, v.mv_data, sizeof n);
  n -= keys_bytes;
  v = (MDB_val){sizeof n, &n};
  assert_int_equal(mdb_put(txn, meta, &used, &v, 0), 0);
  assert_int_equal(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
}

static void test_key_bytes_recounted_at_open(void **state) {
  fx *f = *state;
  kc_store *s = open_kv(f->dir, 0, 0, 0);
  int64_t now = now_ms();
  set(s, "alpha", "1", 1, 0, 0, now);
  set(s, "beta", "22", 2, 0, 0, now);
  uint64_t want = 3 + KC_KV_KEY_BYTES(5) + KC_KV_KEY_BYTES(4);
  assert_int_equal(get_stats(s).bytes_used, want);
  kc_store_close(s);
  make_uncounted(f->dir, KC_KV_KEY_BYTES(5) + KC_KV_KEY_BYTES(4));
  s = open_kv(f->dir, 0, 0, 0);
  assert_int_equal(get_stats(s).bytes_used, want);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
  s = open_kv(f->dir, 0, 0, 0); /* once: not counted again */
  assert_int_equal(get_stats(s).bytes_used, want);
  kc_store_close(s);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "s3") == 0) {
    signal(SIGPIPE, SIG_IGN);
    kc_store_global_init();
    return run_rgw();
  }
  const struct CMUnitTest tests[] = {
      ST(test_roundtrip_binary),
      ST(test_large_value),
      ST(test_dedup_and_refcounts),
      ST(test_shared_with_bundle),
      ST(test_set_flags),
      ST(test_expire_persist),
      ST(test_expiry_read_reclaim_reopen),
      ST(test_scan),
      ST(test_glob),
      ST(test_flush),
      ST(test_evict_max_bytes),
      ST(test_evict_use_grain),
      ST(test_evict_kv_cap_spares_bundles),
      ST(test_evict_bundles_over_share),
      ST(test_evict_oldest_across_sides),
      ST(test_batch_one_failing),
      ST(test_concurrent_writers),
      ST(test_crash_sigkill),
      ST(test_scrub_rotted_value),
      ST(test_tier_queue_when_s3_down),
      ST(test_set_same_and_replace),
      ST(test_set_settled),
      ST(test_set_settled_compressed),
      ST(test_key_bytes_counted),
      ST(test_key_bytes_recounted_at_open),
  };
  return storetest_run("store_kv", tests, sizeof tests / sizeof tests[0]);
}
