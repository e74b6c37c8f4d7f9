/* test_store_evict.c: store/ unit tests (kc_store.h) of
 * eviction and a full map: LRU order, unreferenced blobs, unflushed
 * reads, a blob larger than the limit, an offered blob spared, a full map and
 * recovery, and a durable tier whose S3 is down (nothing only local evicted).
 * Fixtures and helpers: storetest.h. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "storetest.h"

/* ======================================================================= */
/* eviction                                                                 */

#define EV_BLOB (100 * 1024)

static void test_eviction_lru_order(void **state) {
  fx *f = *state;
  /* Limit: 4 blobs of 100 KiB; high water 95% (380 KiB), low 85%. */
  kc_store *s = open_store(f->dir, 4 * EV_BLOB, 0, 3600);
  char sh[KC_HEX_LEN + 1], ba[KC_HEX_LEN + 1], bb[KC_HEX_LEN + 1],
      bc[KC_HEX_LEN + 1], bd[KC_HEX_LEN + 1];
  put_seed(s, 1024, 110, sh); /* shared by A and B */
  /* Last-use times are unix seconds in the API: space the events a second
   * apart so that any clock resolution gives one order: B < C < A < D. */
  kc_manifest *a = bundle_with_blob(s, M1, 1, EV_BLOB, 111, sh, 1024, ba);
  kc_manifest *b = bundle_with_blob(s, M1, 2, EV_BLOB, 112, sh, 1024, bb);
  sleep(1);
  usleep(100000);
  kc_manifest *c = bundle_with_blob(s, M1, 3, EV_BLOB, 113, NULL, 0, bc);
  sleep(1);
  usleep(100000);
  kc_store_read *r = NULL;
  const char *json;
  size_t len;
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_bundle_get(r, a->key, &json, &len));
  kc_store_read_end(r);
  OK(kc_store_flush(s));
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.evicted_bundles, 0);
  assert_int_equal(blob_bytes(s), 3 * EV_BLOB + 1024);
  sleep(1);
  usleep(100000);

  /* D takes the store above the high-water mark: B goes (LRU), A stays. */
  kc_manifest *d = bundle_with_blob(s, M1, 4, EV_BLOB, 114, NULL, 0, bd);
  st = get_stats(s);
  if (bundle_present(s, a->key) == 0 || bundle_present(s, b->key) == 1)
    fail_msg("after put D: A %s, B %s (want A kept, B evicted: B is least "
             "recently used, A was read)",
             bundle_present(s, a->key) ? "present" : "evicted",
             bundle_present(s, b->key) ? "present" : "evicted");
  assert_true(bundle_present(s, c->key));
  assert_true(bundle_present(s, d->key));
  assert_int_equal(st.evicted_bundles, 1);
  assert_false(blob_present(s, bb)); /* its own blob went with it */
  assert_true(blob_present(s, sh));  /* the shared one stays for A */
  assert_true(st.bytes_used <= 4 * EV_BLOB * 85 / 100);
  assert_int_equal(blob_bytes(s), 3 * EV_BLOB + 1024);
  assert_true(st.evicted_blobs >= 1);
  OK(kc_store_verify(s, errbuf));

  /* An explicit eviction to 250 KiB: C (older than A and D) goes next. */
  OK(kc_store_evict(s, 250 * 1024, errbuf));
  st = get_stats(s);
  assert_false(bundle_present(s, c->key));
  assert_false(blob_present(s, bc));
  assert_true(bundle_present(s, a->key));
  assert_true(bundle_present(s, d->key));
  assert_true(blob_present(s, ba));
  assert_true(blob_present(s, bd));
  assert_int_equal(st.evicted_bundles, 2);
  assert_int_equal(st.bundles, 2);
  assert_true(st.bytes_used <= 250 * 1024);
  /* Already under the target: nothing happens. */
  OK(kc_store_evict(s, 250 * 1024, errbuf));
  assert_int_equal(get_stats(s).evicted_bundles, 2);
  /* Listings agree. */
  listing *l = list_model(s, M1);
  assert_int_equal(l->n, 2);
  listing_free(l);
  /* Evict everything. */
  OK(kc_store_evict(s, 0, errbuf));
  st = get_stats(s);
  assert_int_equal(st.bundles, 0);
  assert_int_equal(st.bytes_used, 0);
  assert_int_equal(st.blobs, 0);
  kc_manifest_free(a);
  kc_manifest_free(b);
  kc_manifest_free(c);
  kc_manifest_free(d);
  kc_store_close(s);
}

/* Reads not yet flushed count: eviction must not pick a bundle that was just
 * read because its use is still in memory. */
static void test_eviction_sees_unflushed_reads(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 3600);
  kc_manifest *a = bundle_with_blob(s, M1, 1, EV_BLOB, 115, NULL, 0, NULL);
  kc_manifest *b = bundle_with_blob(s, M1, 2, EV_BLOB, 116, NULL, 0, NULL);
  sleep(1);
  usleep(100000);
  kc_store_read *r = NULL;
  const char *json;
  size_t len;
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_bundle_get(r, a->key, &json, &len));
  kc_store_read_end(r);
  /* No flush. */
  OK(kc_store_evict(s, EV_BLOB + 4096, errbuf)); /* a blob and a manifest */
  if (!bundle_present(s, a->key) || bundle_present(s, b->key))
    fail_msg("evicting one of two bundles: A (read, not flushed) %s, B %s; "
             "want A kept, B evicted",
             bundle_present(s, a->key) ? "kept" : "evicted",
             bundle_present(s, b->key) ? "kept" : "evicted");
  kc_manifest_free(a);
  kc_manifest_free(b);
  kc_store_close(s);
}

/* A blob larger than the whole limit can never fit: refused, and refused
 * before anything is evicted for it. */
static void test_blob_larger_than_limit(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 200 * 1024, 0, 3600);
  kc_manifest *a = bundle_with_blob(s, M1, 1, 50 * 1024, 117, NULL, 0, NULL);
  char hex[KC_HEX_LEN + 1];
  uint8_t *p = make_bytes(300 * 1024, 118, hex);
  int created = -1;
  EXPECT_IN(kc_store_blob_put(s, hex, p, 300 * 1024, &created, errbuf),
            KC_TOO_LARGE, KC_STORE_FULL);
  kc_store_upload *u = NULL;
  OK(kc_store_upload_begin(s, &u, errbuf));
  EXPECT_IN(kc_store_upload_write(u, p, 300 * 1024, errbuf), KC_OK,
            KC_TOO_LARGE, KC_STORE_FULL);
  EXPECT_IN(kc_store_upload_commit(u, hex, &created, errbuf), KC_TOO_LARGE,
            KC_STORE_FULL);
  EXPECT(kc_store_blob_has(s, hex, NULL), KC_NOT_FOUND);
  assert_true(bundle_present(s, a->key));
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.evicted_bundles, 0);
  assert_int_equal(blob_bytes(s), 50 * 1024);
  free(p);
  kc_manifest_free(a);
  kc_store_close(s);
}

/* A client uploads blobs first (a shared one answered "already present"),
 * then the manifest: eviction in between must not take the shared blob,
 * even when the bundle that held it is evicted. */
static void test_eviction_spares_offered_blob(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 4 * EV_BLOB, 0, 3600);
  char sh[KC_HEX_LEN + 1], b0[KC_HEX_LEN + 1], nb[KC_HEX_LEN + 1];
  put_seed(s, 4096, 170, sh);
  kc_manifest *a = bundle_with_blob(s, M1, 1, EV_BLOB, 171, sh, 4096, b0);
  /* The client offers the shared blob again: already present. */
  uint8_t *p = make_bytes(4096, 170, sh);
  int created = -1;
  OK(kc_store_blob_put(s, sh, p, 4096, &created, errbuf));
  assert_int_equal(created, 0);
  /* Everything is evicted before its manifest arrives. */
  OK(kc_store_evict(s, 0, errbuf));
  assert_false(bundle_present(s, a->key));
  assert_false(blob_present(s, b0));
  assert_true(blob_present(s, sh));
  put_seed(s, EV_BLOB, 172, nb);
  char d[2][KC_HEX_LEN + 1];
  strcpy(d[0], sh);
  strcpy(d[1], nb);
  kc_manifest *m = make_manifest(M1, 2, 2, d, (uint64_t[]){4096, EV_BLOB});
  put_bundle(s, m, 1);
  OK(kc_store_verify(s, errbuf));
  free(p);
  kc_manifest_free(m);
  kc_manifest_free(a);
  kc_store_close(s);
}

/* Unreferenced blobs go after the LRU bundles only, and a blob that became
 * unreferenced minutes ago (an upload whose manifest is on its way) is
 * spared by eviction; gc collects it after the grace period. */
static void test_eviction_unreferenced_blobs(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 3600);
  char u[KC_HEX_LEN + 1];
  kc_manifest *a = bundle_with_blob(s, M1, 1, EV_BLOB, 120, NULL, 0, NULL);
  put_seed(s, EV_BLOB, 121, u); /* unreferenced, within the upload window */
  OK(kc_store_evict(s, 0, errbuf));
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.bytes_used, EV_BLOB);
  assert_int_equal(st.blobs, 1);
  assert_true(blob_present(s, u));
  assert_false(bundle_present(s, a->key));
  OK(kc_store_gc(s, (int64_t)time(NULL) + 3600 + 1, errbuf));
  st = get_stats(s);
  assert_int_equal(st.bytes_used, 0);
  assert_int_equal(st.blobs, 0);
  assert_false(blob_present(s, u));
  kc_manifest_free(a);
  kc_store_close(s);
}

/* ======================================================================= */
/* full map                                                                 */

/* Puts 64 KiB blobs until KC_STORE_FULL (*full = 1) or until the store
 * evicts by itself to make room (*full = 0: a cache may answer a full map by
 * evicting); returns how many went in. */
static size_t fill_until_full(kc_store *s, uint64_t seed0,
                              char (*digests)[KC_HEX_LEN + 1], size_t max,
                              int *full) {
  size_t n = 0;
  kc_store_stats st0 = get_stats(s);
  for (;;) {
    char hex[KC_HEX_LEN + 1];
    uint8_t *p = make_bytes(64 * 1024, seed0 + n, hex);
    int created = -1;
    errbuf[0] = '\0';
    kc_err e = kc_store_blob_put(s, hex, p, 64 * 1024, &created, errbuf);
    free(p);
    if (e == KC_STORE_FULL) {
      assert_true(errbuf[0] != '\0');
      EXPECT(kc_store_blob_has(s, hex, NULL), KC_NOT_FOUND);
      *full = 1;
      return n;
    }
    if (e != KC_OK)
      fail_msg("blob %zu: %s (%s); want KC_OK or KC_STORE_FULL", n,
               kc_err_name(e), errbuf);
    assert_int_equal(created, 1);
    if (n >= max)
      fail_msg("%zu blobs of 64 KiB fit in a map of 2 MiB: map_size ignored?",
               n);
    strcpy(digests[n], hex);
    n++;
    kc_store_stats st = get_stats(s);
    if (st.evicted_blobs + st.evicted_bundles >
        st0.evicted_blobs + st0.evicted_bundles) {
      *full = 0;
      return n;
    }
  }
}

/* Every bundle of model is whole and verify passes. */
static void expect_consistent(kc_store *s, const char *model) {
  OK(kc_store_verify(s, errbuf));
  listing *l = list_model(s, model);
  kc_store_read *r = NULL;
  OK(kc_store_read_begin(s, &r));
  for (size_t i = 0; i < l->n; i++) {
    char why[512];
    assert_non_null(l->manifest[i]);
    if (!bundle_blobs_ok(r, l->manifest[i], strlen(l->manifest[i]), why,
                         sizeof why))
      fail_msg("%s", why);
  }
  kc_store_read_end(r);
  listing_free(l);
}

static void test_map_full_and_recovery(void **state) {
  fx *f = *state;
  enum { MAXB = 400 };
  char(*dg)[KC_HEX_LEN + 1] = calloc(MAXB, KC_HEX_LEN + 1);
  assert_non_null(dg);
  kc_store *s = open_store(f->dir, 0, 2 * 1024 * 1024, 60);
  /* A bundle over two blobs first. */
  char kd[2][KC_HEX_LEN + 1];
  uint64_t ksz[2] = {64 * 1024, 64 * 1024};
  put_seed(s, 64 * 1024, 5000, kd[0]);
  put_seed(s, 64 * 1024, 5001, kd[1]);
  kc_manifest *k = make_manifest(M1, 1, 2, kd, ksz);
  put_bundle(s, k, 1);
  char hex[KC_HEX_LEN + 1];
  uint8_t *p = make_bytes(64 * 1024, 9999, hex);
  char *path = path_join(f->tmp, "full.bin");
  int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0600);
  assert_true(fd >= 0);
  write_all(fd, p, 64 * 1024);
  int created = -1, full = 0;
  kc_store_upload *u = NULL;

  /* Round 1: full (or self-evicting); the store stays consistent; an
   * explicit eviction to half the bytes makes room. */
  size_t n = fill_until_full(s, 6000, dg, MAXB, &full);
  assert_true(n >= 3);
  print_message("map full after %zu blobs (%s)\n", n,
                full ? "KC_STORE_FULL" : "the store evicted by itself");
  kc_store_stats st = get_stats(s);
  assert_true(st.map_used <= st.map_size);
  expect_consistent(s, M1);
  assert_true(bundle_present(s, k->key) || st.evicted_bundles >= 1);
  OK(kc_store_evict(s, st.bytes_used / 2, errbuf));
  st = get_stats(s);
  assert_true(st.evicted_bundles + st.evicted_blobs > 0);
  OK(kc_store_blob_put(s, hex, p, 64 * 1024, &created, errbuf));
  assert_int_equal(created, 1);

  /* Round 2: full again; gc of unreferenced blobs after grace makes room
   * (nothing references the filler blobs). */
  fill_until_full(s, 7000, dg, MAXB, &full);
  OK(kc_store_gc(s, (int64_t)time(NULL) + 61, errbuf));
  st = get_stats(s);
  assert_true(st.gc_blobs > 0);
  assert_int_equal(st.blobs, st.bundles ? 2 : 0);
  assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
  OK(kc_store_blob_put_fd(s, hex, fd, 64 * 1024, &created, errbuf));
  assert_int_equal(created, 1);

  /* Round 3: the bundle back, full again; delete it, gc, and a streaming
   * upload goes in. */
  if (!bundle_present(s, k->key)) {
    put_seed(s, 64 * 1024, 5000, kd[0]);
    put_seed(s, 64 * 1024, 5001, kd[1]);
    put_bundle(s, k, 1);
  }
  fill_until_full(s, 8000, dg, MAXB, &full);
  expect_consistent(s, M1);
  EXPECT_IN(kc_store_bundle_delete(s, k->key, errbuf), KC_OK, KC_NOT_FOUND);
  OK(kc_store_gc(s, (int64_t)time(NULL) + 61, errbuf));
  OK(kc_store_upload_begin(s, &u, errbuf));
  OK(kc_store_upload_write(u, p, 64 * 1024, errbuf));
  OK(kc_store_upload_commit(u, hex, &created, errbuf));
  assert_int_equal(created, 1);
  OK(kc_store_verify(s, errbuf));
  close(fd);
  free(path);
  free(p);
  free(dg);
  kc_manifest_free(k);
  kc_store_close(s);
}

/* When the store answers KC_STORE_FULL, the answer holds: the same put again,
 * with nothing changed in between, is KC_STORE_FULL again (through each put
 * path), and nothing was stored. A store that evicts by itself on a full map
 * must not say "full" when its eviction made room. */
static void test_map_full_answer_consistent(void **state) {
  fx *f = *state;
  enum { MAXB = 400 };
  char(*dg)[KC_HEX_LEN + 1] = calloc(MAXB, KC_HEX_LEN + 1);
  assert_non_null(dg);
  kc_store *s = open_store(f->dir, 0, 2 * 1024 * 1024, 60);
  int full = 0, created = -1;
  size_t n = fill_until_full(s, 6000, dg, MAXB, &full);
  /* Fresh uploads are never evicted (kc_store.h), so a map filled with them
   * alone must end in KC_STORE_FULL, not in eviction. */
  if (!full)
    fail_msg("a map full of fresh uploads evicted some of them");
  kc_store_stats st0 = get_stats(s);
  /* The put that failed last: blob n of the fill. */
  char hex[KC_HEX_LEN + 1];
  uint8_t *p = make_bytes(64 * 1024, 6000 + n, hex);
  errbuf[0] = '\0';
  kc_err e = kc_store_blob_put(s, hex, p, 64 * 1024, &created, errbuf);
  kc_store_stats st1 = get_stats(s);
  if (e != KC_STORE_FULL)
    fail_msg("after KC_STORE_FULL, the same blob put with nothing changed in "
             "between gave %s (blobs %llu -> %llu, evicted bundles %llu, "
             "evicted blobs %llu): the first answer was wrong",
             kc_err_name(e), (unsigned long long)st0.blobs,
             (unsigned long long)st1.blobs,
             (unsigned long long)st1.evicted_bundles,
             (unsigned long long)st1.evicted_blobs);
  kc_store_upload *u = NULL;
  OK(kc_store_upload_begin(s, &u, errbuf));
  OK(kc_store_upload_write(u, p, 64 * 1024, errbuf));
  EXPECT(kc_store_upload_commit(u, hex, &created, errbuf), KC_STORE_FULL);
  char *path = path_join(f->tmp, "full.bin");
  int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0600);
  assert_true(fd >= 0);
  write_all(fd, p, 64 * 1024);
  assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
  EXPECT(kc_store_blob_put_fd(s, hex, fd, 64 * 1024, &created, errbuf),
         KC_STORE_FULL);
  EXPECT(kc_store_blob_has(s, hex, NULL), KC_NOT_FOUND);
  close(fd);
  free(path);
  free(p);
  free(dg);
  kc_store_close(s);
}

/* ---- the durable tier with S3 unreachable (the Ceph-backed cases are in
 * test_scaleout) ---- */

static kc_store *open_unreachable_tier(const char *dir, uint64_t max_bytes) {
  kc_store_s3 s3 = {.endpoint = "http://127.0.0.1:1",
                    .bucket = "kcache-test",
                    .path_style = 1,
                    .access_key = "AK",
                    .secret_key = "SK"};
  kc_store_opts o = {.dir = dir, .max_bytes = max_bytes, .s3 = &s3};
  kc_store *s = NULL;
  OK(kc_store_open(&o, &s, errbuf)); /* S3 is not contacted to open */
  return s;
}

/* Writes are acknowledged and queued while S3 is down; the queue survives a
 * restart; eviction never drops a bundle whose only copy is local; reads of
 * what is absent answer at once; leases fall back to this replica alone. */
static void test_tier_queue_when_s3_down(void **state) {
  fx *f = *state;
  kc_store *s = open_unreachable_tier(f->dir, 3 * EV_BLOB);
  kc_manifest *m[4];
  for (int i = 0; i < 4; i++)
    m[i] = bundle_with_blob(s, M1, (uint64_t)i + 1, EV_BLOB, 300 + (uint64_t)i,
                            NULL, 0, NULL);
  assert_int_equal(queue_depth(s), 8); /* 4 blobs, 4 manifests */
  OK(kc_store_evict(s, 0, errbuf));
  for (int i = 0; i < 4; i++)
    assert_true(bundle_present(s, m[i]->key));
  assert_int_equal(get_stats(s).evicted_bundles, 0);
  /* a delete is queued too (for the bucket's copy) */
  OK(kc_store_bundle_delete(s, m[3]->key, errbuf));
  assert_int_equal(queue_depth(s), 9);
  /* a held blob offered again is queued again (the bucket may lack it),
   * once per upload window, not once per offer */
  kc_store_blob_touch(s, m[0]->files[0].sha256);
  assert_int_equal(queue_depth(s), 10);
  kc_store_blob_touch(s, m[0]->files[0].sha256);
  assert_int_equal(queue_depth(s), 10);
  char held[KC_STORE_HOLDER_MAX + 1] = "";
  uint64_t left = 0;
  OK(kc_store_lease_acquire(s, m[0]->key, "me", "tok", 60000, held, &left,
                            errbuf));
  kc_err e = kc_store_fetch_blob(s, Z64, errbuf);
  assert_true(e == KC_UNAVAILABLE || e == KC_TIMEOUT);
  kc_store_close(s);

  s = open_unreachable_tier(f->dir, 3 * EV_BLOB);
  assert_int_equal(queue_depth(s), 10);
  for (int i = 0; i < 3; i++)
    assert_true(bundle_present(s, m[i]->key));
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
  for (int i = 0; i < 4; i++)
    kc_manifest_free(m[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      ST(test_eviction_lru_order),
      ST(test_eviction_unreferenced_blobs),
      ST(test_eviction_sees_unflushed_reads),
      ST(test_blob_larger_than_limit),
      ST(test_map_full_and_recovery),
      ST(test_map_full_answer_consistent),
      ST(test_eviction_spares_offered_blob),
      ST(test_tier_queue_when_s3_down),
  };
  return storetest_run("store_evict", tests, sizeof tests / sizeof tests[0]);
}
