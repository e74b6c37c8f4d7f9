/* test_store_bundle.c: store/ unit tests (kc_store.h) of
 * bundles: round trips, write-once, missing blobs, invalid manifests,
 * a size mismatch, delete with refcounts and GC grace, model listing, stats
 * and hits, reads that do not write.
 * Fixtures and helpers: storetest.h. */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <time.h>
#include <unistd.h>

#include "storetest.h"

/* ======================================================================= */
/* bundles                                                                  */

static void test_bundle_roundtrip(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  char d[2][KC_HEX_LEN + 1];
  uint64_t sz[2] = {5632, 100};
  put_seed(s, 5632, 10, d[0]);
  put_seed(s, 100, 11, d[1]);
  kc_manifest *m = make_manifest(M1, 8, 2, d, sz);
  char *want = manifest_json(m);

  EXPECT(kc_store_bundle_has(s, m->key), KC_NOT_FOUND);
  put_bundle(s, m, 1);
  OK(kc_store_bundle_has(s, m->key));
  expect_bundle_json(s, m->key, want);

  /* The returned JSON parses back to the same manifest, with its key. */
  kc_store_read *r = NULL;
  const char *json = NULL;
  size_t len = 0;
  kc_manifest *back = NULL;
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_bundle_get(r, m->key, &json, &len));
  OK(kc_manifest_parse(json, len, &back, errbuf));
  assert_true(kc_manifest_equal(m, back));
  assert_string_equal(back->key, m->key);
  /* Two gets in one read: both pointers stay valid until read_end. */
  const char *json2 = NULL;
  size_t len2 = 0;
  OK(kc_store_bundle_get(r, m->key, &json2, &len2));
  assert_int_equal(len2, len);
  assert_memory_equal(json, json2, len);
  EXPECT(kc_store_bundle_get(r, Z64, &json2, &len2), KC_NOT_FOUND);
  kc_store_read_end(r);

  kc_store_stats st = get_stats(s);
  assert_int_equal(st.bundles, 1);
  assert_int_equal(st.blobs, 2);
  assert_int_equal(blob_bytes(s), 5632 + 100);
  OK(kc_store_verify(s, errbuf));
  kc_manifest_free(back);
  kc_manifest_free(m);
  free(want);
  kc_store_close(s);
}

static void test_bundle_write_once(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 60);
  char d[2][KC_HEX_LEN + 1];
  uint64_t sz[2] = {300, 400};
  put_seed(s, 300, 20, d[0]);
  put_seed(s, 400, 21, d[1]);
  kc_manifest *m = make_manifest(M1, 4, 1, d, sz);
  char *want = manifest_json(m);
  put_bundle(s, m, 1);

  /* An identical manifest (a separate object): created 0. */
  kc_manifest *same = make_manifest(M1, 4, 1, d, sz);
  put_bundle(s, same, 0);
  put_bundle(s, m, 0);

  /* Same key fields, different files: a conflict, the first one stays. */
  kc_manifest *other = make_manifest(M1, 4, 1, d + 1, sz + 1);
  assert_string_equal(other->key, m->key);
  int created = -1;
  EXPECT(kc_store_bundle_put(s, other, &created, NULL, NULL, errbuf),
         KC_CONFLICT);
  expect_bundle_json(s, m->key, want);
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.bundles, 1);

  /* Refcounts: the identical puts and the conflict must not have counted.
   * After one delete, d[0] is unreferenced and collected; so is d[1]. */
  OK(kc_store_bundle_delete(s, m->key, errbuf));
  OK(kc_store_gc(s, (int64_t)time(NULL) + 60 + 1, errbuf));
  if (blob_present(s, d[0]))
    fail_msg("blob of a bundle put 3 times and deleted once survived gc: "
             "refcount counted identical puts");
  assert_false(blob_present(s, d[1]));

  /* After a delete the key is free again: a different bundle may take it. */
  put_seed(s, 400, 21, d[1]);
  put_bundle(s, other, 1);
  char *want2 = manifest_json(other);
  expect_bundle_json(s, other->key, want2);
  kc_manifest_free(m);
  kc_manifest_free(same);
  kc_manifest_free(other);
  free(want);
  free(want2);
  kc_store_close(s);
}

static int strv_has(char **v, size_t n, const char *s) {
  for (size_t i = 0; i < n; i++)
    if (v[i] && strcmp(v[i], s) == 0)
      return 1;
  return 0;
}

static void test_bundle_missing_blobs(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 60);
  char d[4][KC_HEX_LEN + 1];
  uint64_t sz[4] = {111, 222, 333, 444};
  put_seed(s, 111, 30, d[0]);
  put_seed(s, 333, 32, d[2]);
  uint8_t *tmp = make_bytes(222, 31, d[1]);
  free(tmp);
  tmp = make_bytes(444, 33, d[3]);
  free(tmp);
  kc_manifest *m = make_manifest(M1, 2, 4, d, sz);

  char **missing = NULL;
  size_t n_missing = 0;
  int created = -1;
  EXPECT(kc_store_bundle_put(s, m, &created, &missing, &n_missing, errbuf),
         KC_MISSING_BLOBS);
  assert_int_equal(n_missing, 2);
  assert_non_null(missing);
  assert_true(strv_has(missing, n_missing, d[1]));
  assert_true(strv_has(missing, n_missing, d[3]));
  kc_store_strv_free(missing, n_missing);
  kc_store_strv_free(NULL, 0);
  EXPECT(kc_store_bundle_has(s, m->key), KC_NOT_FOUND);

  /* Without an out list: still refused, nothing leaks. */
  EXPECT(kc_store_bundle_put(s, m, &created, NULL, NULL, errbuf),
         KC_MISSING_BLOBS);
  EXPECT(kc_store_bundle_has(s, m->key), KC_NOT_FOUND);
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.bundles, 0);

  /* One file's blob twice, both missing: listed, nothing else. */
  char dd[2][KC_HEX_LEN + 1];
  uint64_t dsz[2] = {444, 444};
  strcpy(dd[0], d[3]);
  strcpy(dd[1], d[3]);
  kc_manifest *dup = make_manifest(M1, 3, 2, dd, dsz);
  missing = NULL;
  n_missing = 0;
  EXPECT(kc_store_bundle_put(s, dup, &created, &missing, &n_missing, errbuf),
         KC_MISSING_BLOBS);
  assert_true(n_missing >= 1);
  for (size_t i = 0; i < n_missing; i++)
    assert_string_equal(missing[i], d[3]);
  kc_store_strv_free(missing, n_missing);

  /* The refused puts did not take references: d[0] and d[2] are collected. */
  OK(kc_store_gc(s, (int64_t)time(NULL) + 61, errbuf));
  assert_false(blob_present(s, d[0]));
  assert_false(blob_present(s, d[2]));

  /* Upload everything: now it goes in, with an empty missing list. */
  put_seed(s, 111, 30, d[0]);
  put_seed(s, 222, 31, d[1]);
  put_seed(s, 333, 32, d[2]);
  put_seed(s, 444, 33, d[3]);
  missing = NULL;
  n_missing = 77;
  OK(kc_store_bundle_put(s, m, &created, &missing, &n_missing, errbuf));
  assert_int_equal(created, 1);
  assert_int_equal(n_missing, 0);
  kc_store_strv_free(missing, n_missing);
  OK(kc_store_bundle_has(s, m->key));
  kc_manifest_free(m);
  kc_manifest_free(dup);
  kc_store_close(s);
}

static void test_bundle_invalid(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  char d[1][KC_HEX_LEN + 1];
  uint64_t sz[1] = {50};
  put_seed(s, 50, 40, d[0]);
  kc_manifest *m = make_manifest(M1, 2, 1, d, sz);
  int created = -1;
  /* The key no longer matches the fields. */
  char saved[KC_HEX_LEN + 1];
  strcpy(saved, m->key);
  strcpy(m->fields.arch, "sm_80");
  EXPECT_IN(kc_store_bundle_put(s, m, &created, NULL, NULL, errbuf),
            KC_KEY_MISMATCH, KC_BAD_MANIFEST);
  EXPECT(kc_store_bundle_has(s, saved), KC_NOT_FOUND);
  /* Invalid fields (arch). */
  strcpy(m->fields.arch, "gfx90a");
  assert_int_not_equal(kc_manifest_validate(m, NULL), KC_OK);
  EXPECT_IN(kc_store_bundle_put(s, m, &created, NULL, NULL, errbuf),
            KC_BAD_MANIFEST, KC_BAD_KEY, KC_KEY_MISMATCH);
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.bundles, 0);
  kc_manifest_free(m);
  kc_store_close(s);
}

/* A manifest whose file size disagrees with the blob it names describes a
 * file that does not exist: refused (a client would fetch bytes that fail
 * its size check, and the model listing's bytes would be wrong). */
static void test_bundle_size_mismatch(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  char d[1][KC_HEX_LEN + 1];
  put_seed(s, 1000, 119, d[0]);
  kc_manifest *m = make_manifest(M1, 1, 1, d, (uint64_t[]){999});
  int created = -1;
  errbuf[0] = '\0';
  kc_err e = kc_store_bundle_put(s, m, &created, NULL, NULL, errbuf);
  if (e == KC_OK)
    fail_msg("a manifest giving 999 bytes for a blob of 1000 was stored");
  EXPECT(kc_store_bundle_has(s, m->key), KC_NOT_FOUND);
  kc_manifest_free(m);
  kc_store_close(s);
}

/* ======================================================================= */
/* delete, refcounts, gc                                                    */

static void test_delete_refcount_gc(void **state) {
  fx *f = *state;
  const uint64_t grace = 100;
  kc_store *s = open_store(f->dir, 0, 0, grace);
  char x[KC_HEX_LEN + 1], y[KC_HEX_LEN + 1], z[KC_HEX_LEN + 1];
  put_seed(s, 1000, 50, x); /* shared by A and B */
  kc_manifest *a = bundle_with_blob(s, M1, 1, 2000, 51, x, 1000, y);
  kc_manifest *b = bundle_with_blob(s, M1, 2, 3000, 52, x, 1000, z);

  OK(kc_store_bundle_delete(s, a->key, errbuf));
  EXPECT(kc_store_bundle_delete(s, a->key, errbuf), KC_NOT_FOUND);
  EXPECT(kc_store_bundle_has(s, a->key), KC_NOT_FOUND);
  kc_store_read *r = NULL;
  const char *json;
  size_t len;
  OK(kc_store_read_begin(s, &r));
  EXPECT(kc_store_bundle_get(r, a->key, &json, &len), KC_NOT_FOUND);
  kc_store_read_end(r);
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.bundles, 1);

  /* The deleted bundle's blobs stay until gc after the grace period. */
  assert_true(blob_present(s, y));
  assert_true(blob_present(s, x));
  int64_t now = (int64_t)time(NULL);
  OK(kc_store_gc(s, now, errbuf));
  assert_true(blob_present(s, y));
  OK(kc_store_gc(s, now + (int64_t)grace / 2, errbuf));
  assert_true(blob_present(s, y));
  OK(kc_store_gc(s, now + (int64_t)grace + 2, errbuf));
  assert_false(blob_present(s, y));
  /* x is still referenced by B, z by B: they survive any clock. */
  OK(kc_store_gc(s, now + 100 * (int64_t)grace, errbuf));
  assert_true(blob_present(s, x));
  assert_true(blob_present(s, z));
  st = get_stats(s);
  assert_int_equal(st.blobs, 2);
  assert_int_equal(blob_bytes(s), 1000 + 3000);
  assert_int_equal(st.gc_blobs, 1);
  OK(kc_store_verify(s, errbuf));
  char *bj = manifest_json(b);
  expect_bundle_json(s, b->key, bj);
  free(bj);

  /* A deleted bundle's blob taken up by a new bundle before gc survives. */
  OK(kc_store_bundle_delete(s, b->key, errbuf));
  kc_manifest *c = make_manifest(M1, 3, 1, &z, (uint64_t[]){3000});
  put_bundle(s, c, 1);
  OK(kc_store_gc(s, now + 100 * (int64_t)grace, errbuf));
  assert_false(blob_present(s, x));
  assert_true(blob_present(s, z));

  /* Delete the last: everything goes. */
  OK(kc_store_bundle_delete(s, c->key, errbuf));
  OK(kc_store_gc(s, now + 100 * (int64_t)grace, errbuf));
  assert_false(blob_present(s, z));
  st = get_stats(s);
  assert_int_equal(st.blobs, 0);
  assert_int_equal(st.bundles, 0);
  assert_int_equal(st.bytes_used, 0);
  assert_int_equal(st.gc_blobs, 3);

  /* Bad key and unknown key. */
  EXPECT(kc_store_bundle_delete(s, Z64, errbuf), KC_NOT_FOUND);
  kc_manifest_free(a);
  kc_manifest_free(b);
  kc_manifest_free(c);
  kc_store_close(s);
}

/* A bundle listing the same blob in two files: one delete releases it. */
static void test_refcount_same_blob_twice(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 10);
  char d[2][KC_HEX_LEN + 1];
  uint64_t sz[2] = {700, 700};
  put_seed(s, 700, 60, d[0]);
  strcpy(d[1], d[0]);
  kc_manifest *m = make_manifest(M1, 1, 2, d, sz);
  kc_manifest *m2 = make_manifest(M1, 2, 1, d, sz);
  put_bundle(s, m, 1);
  put_bundle(s, m2, 1);
  OK(kc_store_bundle_delete(s, m->key, errbuf));
  OK(kc_store_gc(s, (int64_t)time(NULL) + 1000, errbuf));
  assert_true(blob_present(s, d[0])); /* m2 still holds it */
  OK(kc_store_bundle_delete(s, m2->key, errbuf));
  OK(kc_store_gc(s, (int64_t)time(NULL) + 1000, errbuf));
  assert_false(blob_present(s, d[0]));
  kc_manifest_free(m);
  kc_manifest_free(m2);
  kc_store_close(s);
}

static void test_gc_unreferenced_upload(void **state) {
  fx *f = *state;
  const uint64_t grace = 300;
  kc_store *s = open_store(f->dir, 0, 0, grace);
  char u[KC_HEX_LEN + 1], rb[KC_HEX_LEN + 1];
  put_seed(s, 4096, 70, u); /* never referenced */
  kc_manifest *m = bundle_with_blob(s, M1, 1, 4096, 71, NULL, 0, rb);
  int64_t now = (int64_t)time(NULL);
  OK(kc_store_gc(s, now, errbuf));
  OK(kc_store_gc(s, now + (int64_t)grace - 5, errbuf));
  assert_true(blob_present(s, u));
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.gc_blobs, 0);
  OK(kc_store_gc(s, now + (int64_t)grace + 2, errbuf));
  assert_false(blob_present(s, u));
  assert_true(blob_present(s, rb));
  OK(kc_store_gc(s, now + 1000 * (int64_t)grace, errbuf));
  assert_true(blob_present(s, rb));
  st = get_stats(s);
  assert_int_equal(st.gc_blobs, 1);
  assert_int_equal(st.blobs, 1);
  assert_int_equal(blob_bytes(s), 4096);
  /* A collected blob can be uploaded again. */
  put_seed(s, 4096, 70, u);
  assert_true(blob_present(s, u));
  kc_manifest_free(m);
  kc_store_close(s);
}

/* An orphan a slow client is reading in pieces (spared after it became an
 * orphan) outlives its grace: GC moves its orphan time on instead of
 * dropping it mid-body; one not spared goes. */
static void test_gc_spares_a_blob_being_read(void **state) {
  fx *f = *state;
  const uint64_t grace = 300;
  kc_store *s = open_store(f->dir, 0, 0, grace);
  char read[KC_HEX_LEN + 1], idle[KC_HEX_LEN + 1];
  put_seed(s, 4096, 80, read);
  put_seed(s, 4096, 81, idle);
  kc_store_blob_spare(s, read);
  int64_t now = (int64_t)time(NULL);
  OK(kc_store_gc(s, now + (int64_t)grace + 2, errbuf));
  assert_true(blob_present(s, read));
  assert_false(blob_present(s, idle));
  kc_store_close(s);
}

/* ======================================================================= */
/* model listing, stats, hits                                               */

static void test_model_list(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  int64_t t0 = (int64_t)time(NULL);
  kc_manifest *ma[3], *mb[2], *mm;
  uint64_t sizes[3] = {1000, 2000, 3000};
  char shared[KC_HEX_LEN + 1];
  put_seed(s, 500, 80, shared);
  for (int i = 0; i < 3; i++)
    ma[i] = bundle_with_blob(s, MA0, (uint64_t)i + 1, sizes[i], 81 + i, shared,
                             500, NULL);
  for (int i = 0; i < 2; i++)
    mb[i] =
        bundle_with_blob(s, MA1, (uint64_t)i + 1, 100, 90 + i, NULL, 0, NULL);
  mm = bundle_with_blob(s, M2, 1, 100, 95, NULL, 0, NULL);
  /* Read ma[0] twice and mb[1] once, then flush. */
  kc_store_read *r = NULL;
  const char *json;
  size_t len;
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_bundle_get(r, ma[0]->key, &json, &len));
  OK(kc_store_bundle_get(r, ma[0]->key, &json, &len));
  OK(kc_store_bundle_get(r, mb[1]->key, &json, &len));
  kc_store_read_end(r);
  OK(kc_store_flush(s));
  int64_t t1 = (int64_t)time(NULL);

  listing *l = list_model(s, MA0);
  assert_int_equal(l->n, 3);
  /* In key order (the header says so). */
  for (size_t i = 1; i < l->n; i++)
    assert_true(strcmp(l->keys[i - 1], l->keys[i]) < 0);
  for (int i = 0; i < 3; i++) {
    ssize_t k = listing_find(l, ma[i]->key);
    if (k < 0)
      fail_msg("bundle %d of model MA0 not listed", i);
    assert_int_equal(l->bytes[k], sizes[i] + 500);
    assert_int_equal(l->hits[k], i == 0 ? 2 : 0);
    assert_true(l->created[k] >= t0 - 1 && l->created[k] <= t1 + 1);
    if (i == 0)
      assert_true(l->last_used[k] >= l->created[k]);
    else /* never read: its creation, or 0 for "never" */
      assert_true(l->last_used[k] == 0 || l->last_used[k] >= l->created[k]);
    assert_true(l->last_used[k] <= t1 + 1);
    char *want = manifest_json(ma[i]);
    assert_non_null(l->manifest[k]);
    assert_string_equal(l->manifest[k], want);
    free(want);
  }
  listing_free(l);

  l = list_model(s, MA1);
  assert_int_equal(l->n, 2);
  for (int i = 0; i < 2; i++) {
    ssize_t k = listing_find(l, mb[i]->key);
    assert_true(k >= 0);
    assert_int_equal(l->bytes[k], 100);
    assert_int_equal(l->hits[k], i == 1 ? 1 : 0);
  }
  listing_free(l);

  l = list_model(s, M2);
  assert_int_equal(l->n, 1);
  assert_string_equal(l->keys[0], mm->key);
  listing_free(l);

  /* A model with nothing: no call. */
  l = calloc(1, sizeof *l);
  assert_non_null(l);
  OK(kc_store_model_list(s, M1, list_cb, l));
  assert_int_equal(l->n, 0);
  listing_free(l);

  /* cb returning non-zero stops the walk. */
  l = calloc(1, sizeof *l);
  assert_non_null(l);
  l->stop_after = 1;
  OK(kc_store_model_list(s, MA0, list_cb, l));
  assert_int_equal(l->n, 1);
  listing_free(l);

  /* Deleting a bundle takes it out of its model's list. */
  OK(kc_store_bundle_delete(s, ma[1]->key, errbuf));
  l = list_model(s, MA0);
  assert_int_equal(l->n, 2);
  assert_true(listing_find(l, ma[1]->key) < 0);
  listing_free(l);

  /* A bad model string. */
  l = calloc(1, sizeof *l);
  assert_non_null(l);
  EXPECT_IN(kc_store_model_list(s, "AAAA", list_cb, l), KC_BAD_DIGEST,
            KC_EINVAL, KC_BAD_KEY);
  EXPECT_IN(kc_store_model_list(s, "aaaaaaaa", list_cb, l), KC_BAD_DIGEST,
            KC_EINVAL, KC_BAD_KEY);
  assert_int_equal(l->n, 0);
  listing_free(l);

  for (int i = 0; i < 3; i++)
    kc_manifest_free(ma[i]);
  for (int i = 0; i < 2; i++)
    kc_manifest_free(mb[i]);
  kc_manifest_free(mm);
  kc_store_close(s);
}

static void test_stats_hits_misses(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 10 * 1024 * 1024, 0, 0);
  char shared[KC_HEX_LEN + 1];
  put_seed(s, 1234, 100, shared);
  kc_manifest *m1 = bundle_with_blob(s, M1, 1, 1000, 101, shared, 1234, NULL);
  kc_manifest *m2 = bundle_with_blob(s, M1, 2, 2000, 102, shared, 1234, NULL);
  char lone[KC_HEX_LEN + 1];
  put_seed(s, 777, 103, lone);

  kc_store_stats st = get_stats(s);
  assert_int_equal(st.blobs, 4);
  assert_int_equal(st.bundles, 2);
  /* A shared blob is counted once. */
  assert_int_equal(blob_bytes(s), 1234 + 1000 + 2000 + 777);
  assert_int_equal(st.max_bytes, 10 * 1024 * 1024);
  assert_true(st.map_size >= 10 * 1024 * 1024);
  assert_true(st.map_used > 0 && st.map_used <= st.map_size);
  assert_int_equal(st.hits, 0);
  assert_int_equal(st.misses, 0);

  /* has() counts nothing; gets count hits and misses. */
  OK(kc_store_bundle_has(s, m1->key));
  EXPECT(kc_store_bundle_has(s, Z64), KC_NOT_FOUND);
  kc_store_read *r = NULL;
  const char *json;
  size_t len;
  const void *data;
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_bundle_get(r, m1->key, &json, &len));
  OK(kc_store_bundle_get(r, m2->key, &json, &len));
  OK(kc_store_bundle_get(r, m1->key, &json, &len));
  EXPECT(kc_store_bundle_get(r, Z64, &json, &len), KC_NOT_FOUND);
  /* Blob gets are not bundle hits. */
  OK(kc_store_blob_get(r, shared, &data, &len));
  kc_store_read_end(r);
  st = get_stats(s);
  assert_int_equal(st.hits, 3);
  assert_int_equal(st.misses, 1);
  OK(kc_store_flush(s));
  OK(kc_store_flush(s)); /* nothing pending: fine */
  st = get_stats(s);
  assert_int_equal(st.hits, 3);
  assert_int_equal(st.misses, 1);
  kc_manifest_free(m1);
  kc_manifest_free(m2);
  kc_store_close(s);
}

/* Recording last use must not be a write transaction per read: count the
 * data-file writes (inotify IN_MODIFY) during 300 bundle gets, each in its
 * own read, against those of one put. */
static size_t count_modify_events(int ifd) {
  size_t n = 0;
  char buf[8192] __attribute__((aligned(__alignof__(struct inotify_event))));
  for (;;) {
    ssize_t k = read(ifd, buf, sizeof buf);
    if (k <= 0)
      return n;
    for (char *p = buf; p < buf + k;) {
      struct inotify_event *ev = (struct inotify_event *)p;
      if ((ev->mask & IN_MODIFY) && !(ev->len && strstr(ev->name, "lock")))
        n++;
      p += sizeof *ev + ev->len;
    }
  }
}

static void test_reads_do_not_write(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  kc_manifest *m = bundle_with_blob(s, M1, 1, 1000, 170, NULL, 0, NULL);
  OK(kc_store_flush(s));
  int ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  assert_true(ifd >= 0);
  assert_true(inotify_add_watch(ifd, f->dir, IN_MODIFY) >= 0);
  /* Control: one put writes the data file. */
  char hex[KC_HEX_LEN + 1];
  put_seed(s, 1000, 171, hex);
  size_t put_events = count_modify_events(ifd);
  assert_true(put_events > 0);
  for (int i = 0; i < 300; i++) {
    kc_store_read *r = NULL;
    const char *json;
    size_t len;
    OK(kc_store_read_begin(s, &r));
    OK(kc_store_bundle_get(r, m->key, &json, &len));
    kc_store_read_end(r);
  }
  size_t read_events = count_modify_events(ifd);
  if (read_events >= 30 * put_events)
    fail_msg("300 bundle gets wrote the data file %zu times (one put: %zu): "
             "last use recorded by a write per read?",
             read_events, put_events);
  /* The uses were recorded all the same. */
  OK(kc_store_flush(s));
  listing *l = list_model(s, M1);
  assert_int_equal(l->n, 1);
  assert_int_equal(l->hits[0], 300);
  listing_free(l);
  close(ifd);
  kc_manifest_free(m);
  kc_store_close(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      ST(test_bundle_roundtrip),
      ST(test_bundle_write_once),
      ST(test_bundle_missing_blobs),
      ST(test_bundle_invalid),
      ST(test_delete_refcount_gc),
      ST(test_refcount_same_blob_twice),
      ST(test_gc_unreferenced_upload),
      ST(test_gc_spares_a_blob_being_read),
      ST(test_model_list),
      ST(test_stats_hits_misses),
      ST(test_reads_do_not_write),
      ST(test_bundle_size_mismatch),
  };
  return storetest_run("store_bundle", tests, sizeof tests / sizeof tests[0]);
}
