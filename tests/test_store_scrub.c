/* test_store_scrub.c: store/ unit tests (kc_store.h) of
 * verify and scrub: corruption found by verify, a rotted blob removed by
 * the scrub with the bundles naming it, a damaged manifest deleted.
 * Fixtures and helpers: storetest.h. */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storetest.h"

/* ======================================================================= */
/* verify finds corruption                                                  */

/* LMDB keeps no checksums: flip a byte of a blob inside the data file (found
 * by its unique content) and kc_store_verify must say KC_CORRUPT. */
static int flip_pattern_in_dir(const char *dir, const uint8_t *pat,
                               size_t plen) {
  DIR *dp = opendir(dir);
  assert_non_null(dp);
  struct dirent *de;
  int flipped = 0;
  while ((de = readdir(dp)) != NULL) {
    char *p = path_join(dir, de->d_name);
    struct stat st;
    if (stat(p, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
      int fd = open(p, O_RDWR);
      assert_true(fd >= 0);
      uint8_t *buf = malloc((size_t)st.st_size);
      assert_non_null(buf);
      assert_int_equal(pread(fd, buf, (size_t)st.st_size, 0), st.st_size);
      uint8_t *at = buf;
      size_t left = (size_t)st.st_size;
      uint8_t *hit;
      while ((hit = memmem(at, left, pat, plen)) != NULL) {
        off_t off = (off_t)(hit - buf) + (off_t)plen / 2;
        uint8_t b = hit[plen / 2] ^ 0x5a;
        assert_int_equal(pwrite(fd, &b, 1, off), 1);
        flipped++;
        left -= (size_t)(hit + plen - at);
        at = hit + plen;
      }
      free(buf);
      close(fd);
    }
    free(p);
  }
  closedir(dp);
  return flipped;
}

static void test_verify_detects_corruption(void **state) {
  fx *f = *state;
  /* A small map: the data file stays small even with MDB_WRITEMAP. */
  kc_store *s = open_store(f->dir, 0, 16 * 1024 * 1024, 0);
  char hex[KC_HEX_LEN + 1];
  const size_t n = 6000;
  uint8_t *p = make_bytes(n, 150, hex);
  int created;
  OK(kc_store_blob_put(s, hex, p, n, &created, errbuf));
  kc_manifest *m = make_manifest(M1, 1, 1, &hex, (uint64_t[]){n});
  put_bundle(s, m, 1);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
  int flipped = flip_pattern_in_dir(f->dir, p, n);
  assert_true(flipped >= 1);
  s = open_store(f->dir, 0, 16 * 1024 * 1024, 0);
  errbuf[0] = '\0';
  EXPECT(kc_store_verify(s, errbuf), KC_CORRUPT);
  assert_true(errbuf[0] != '\0');
  kc_store_close(s);
  kc_manifest_free(m);
  free(p);
}

/* The scrub walks every blob once per pass, a budget at a time, and removes
 * a rotted blob with exactly the bundles naming it; the store verifies after.
 */
static void test_scrub_removes_rotted(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 16 * 1024 * 1024, 0);
  char hex[3][KC_HEX_LEN + 1];
  uint64_t sz[3] = {6000, 7000, 9000};
  uint8_t *p[3];
  int created;
  for (int i = 0; i < 3; i++) {
    p[i] = make_bytes(sz[i], 160 + (uint64_t)i, hex[i]);
    OK(kc_store_blob_put(s, hex[i], p[i], sz[i], &created, errbuf));
  }
  /* b1 names blobs 0 and 1, b2 blob 1, b3 blob 2 */
  kc_manifest *b1 = make_manifest(M1, 1, 2, hex, sz);
  kc_manifest *b2 = make_manifest(M1, 2, 1, &hex[1], &sz[1]);
  kc_manifest *b3 = make_manifest(M2, 1, 1, &hex[2], &sz[2]);
  put_bundle(s, b1, 1);
  put_bundle(s, b2, 1);
  put_bundle(s, b3, 1);

  /* A budget of 1 byte hashes one blob a step: three steps are one pass. */
  kc_store_scrub sc = {0};
  uint64_t spent = 0;
  char pos1[KC_HEX_LEN + 1] = ""; /* where the first step left off (saved) */
  for (int i = 0; i < 3; i++) {
    assert_int_equal(get_stats(s).scrub_passes, 0);
    OK(kc_store_scrub_step(s, &sc, 1, errbuf));
    if (i == 0)
      strcpy(pos1, sc.next);
    assert_string_equal(sc.bad, "");
    assert_true(sc.cost == sz[0] || sc.cost == sz[1] || sc.cost == sz[2]);
    spent += sc.cost;
  }
  assert_int_equal(spent, sz[0] + sz[1] + sz[2]);
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.scrub_passes, 1);
  assert_int_equal(st.scrub_bytes, sz[0] + sz[1] + sz[2]);
  assert_string_equal(sc.next, "");
  kc_store_close(s);

  assert_true(flip_pattern_in_dir(f->dir, p[1], sz[1]) >= 1);
  s = open_store(f->dir, 0, 16 * 1024 * 1024, 0);
  EXPECT(kc_store_verify(s, errbuf), KC_CORRUPT);
  /* A new scrub (a restart) goes on at the saved position. */
  int at = -1;
  for (int i = 0; i < 3; i++)
    at = strcmp(hex[i], pos1) == 0 ? i : at;
  assert_true(at >= 0);
  memset(&sc, 0, sizeof sc);
  OK(kc_store_scrub_step(s, &sc, 1, errbuf));
  assert_int_equal(sc.cost, sz[at]);
  assert_string_equal(sc.bad, at == 1 ? hex[1] : "");
  for (int i = 0; i < 4 && !sc.removed; i++)
    OK(kc_store_scrub_step(s, &sc, UINT64_MAX, errbuf));
  assert_string_equal(sc.bad, hex[1]);
  assert_int_equal(sc.removed, 1);
  assert_int_equal(sc.bundles, 2);
  assert_false(bundle_present(s, b1->key));
  assert_false(bundle_present(s, b2->key));
  assert_true(bundle_present(s, b3->key));
  assert_false(blob_present(s, hex[1]));
  assert_true(blob_present(s, hex[0])); /* an orphan now: gc's to collect */
  assert_true(blob_present(s, hex[2]));
  OK(kc_store_verify(s, errbuf));
  assert_int_equal(get_stats(s).scrub_corrupt, 1);
  /* The pass goes on after the removed blob and finds nothing more. */
  while (sc.next[0]) {
    OK(kc_store_scrub_step(s, &sc, UINT64_MAX, errbuf));
    assert_string_equal(sc.bad, "");
  }
  assert_int_equal(get_stats(s).scrub_corrupt, 1);

  /* The client's next upload of the blob is a new one, and stays. */
  OK(kc_store_blob_put(s, hex[1], p[1], sz[1], &created, errbuf));
  assert_int_equal(created, 1);
  put_bundle(s, b2, 1);
  memset(&sc, 0, sizeof sc);
  OK(kc_store_scrub_step(s, &sc, UINT64_MAX, errbuf));
  assert_string_equal(sc.bad, "");
  assert_true(bundle_present(s, b2->key));
  kc_store_close(s);
  for (int i = 0; i < 3; i++)
    free(p[i]);
  kc_manifest_free(b1);
  kc_manifest_free(b2);
  kc_manifest_free(b3);
}

/* A stored manifest damaged on disk must not wedge the store: deleting it

 * (and so evicting it) still removes its records. */
static void test_delete_damaged_manifest(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 16 * 1024 * 1024, 0);
  char hex[KC_HEX_LEN + 1];
  const size_t n = 5000;
  uint8_t *p = make_bytes(n, 151, hex);
  int created;
  OK(kc_store_blob_put(s, hex, p, n, &created, errbuf));
  kc_manifest *m = make_manifest(M1, 1, 1, &hex, (uint64_t[]){n});
  put_bundle(s, m, 1);
  char *json = manifest_json(m);
  kc_store_close(s);
  assert_true(
      flip_pattern_in_dir(f->dir, (const uint8_t *)json, strlen(json)) >= 1);
  s = open_store(f->dir, 0, 16 * 1024 * 1024, 0);
  EXPECT(kc_store_verify(s, errbuf), KC_CORRUPT);
  OK(kc_store_bundle_delete(s, m->key, errbuf));
  assert_false(bundle_present(s, m->key));
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.bundles, 0);
  kc_store_close(s);
  free(json);
  kc_manifest_free(m);
  free(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      ST(test_verify_detects_corruption),
      ST(test_scrub_removes_rotted),
      ST(test_delete_damaged_manifest),
  };
  return storetest_run("store_scrub", tests, sizeof tests / sizeof tests[0]);
}
