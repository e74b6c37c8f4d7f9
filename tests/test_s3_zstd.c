/* test_s3_zstd.c: the durable tier with blobs held zstd-compressed (issue
 * 18), on the test RGW (testrgw.h): a store that compresses uploads its
 * compressed blobs as their frames, marked x-amz-meta-kcache-encoding:
 * zstd, and raw blobs as they are; a second store reading them through keeps
 * them compressed (the frame as it came), one that does not compress stores
 * the content; fetch_blob_copy serves the content; verify passes on both.
 * Compressible, incompressible, empty and large blobs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <zstd.h>

#include "kc_store.h"
#include "kcs3.h"
#include "testrgw.h"

static kc_testrgw g_rgw;
static char g_bucket[64], g_tmp[256];

#define N_BLOBS 4
static const size_t sizes[N_BLOBS] = {12280, 20000, 0, 3u << 20};
static unsigned char *g_data[N_BLOBS];
static char g_hex[N_BLOBS][KC_HEX_LEN + 1];

static kcs3 *open_rgw(void) {
  kcs3_opts o = {.endpoint = g_rgw.endpoint,
                 .bucket = g_bucket,
                 .region = g_rgw.region,
                 .path_style = 1,
                 .access_key = g_rgw.access,
                 .secret_key = g_rgw.secret};
  kcs3 *c = NULL;
  char err[KC_ERRBUF_SIZE] = "";
  if (kcs3_open(&o, &c, err) != KC_OK)
    fail_msg("kcs3_open: %s", err);
  return c;
}

static kc_store *open_store(const char *name, int level) {
  char dir[400], err[KC_ERRBUF_SIZE] = "";
  snprintf(dir, sizeof dir, "%s/%s", g_tmp, name);
  kc_store_s3 s3 = {.endpoint = g_rgw.endpoint,
                    .bucket = g_bucket,
                    .region = g_rgw.region,
                    .prefix = "zt",
                    .path_style = 1,
                    .access_key = g_rgw.access,
                    .secret_key = g_rgw.secret};
  kc_store_opts o = {
      .dir = dir, .map_size = 256u << 20, .s3 = &s3, .compress_level = level};
  kc_store *s = NULL;
  if (kc_store_open(&o, &s, err) != KC_OK)
    fail_msg("kc_store_open: %s", err);
  return s;
}

/* Blob 0 a cubin-like text, 1 random, 2 empty, 3 large text. */
static void make_blobs(void) {
  for (size_t i = 0; i < N_BLOBS; i++) {
    g_data[i] = malloc(sizes[i] + 1);
    uint64_t x = 88172645463325252ull + i;
    for (size_t j = 0; j < sizes[i]; j++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      g_data[i][j] =
          i == 1 ? (unsigned char)x
                 : (unsigned char)"ld.global.f32 %r1, [%rd2];\n"[(j + j / 97) %
                                                                 27];
    }
    kc_sha256_hex(g_data[i], sizes[i], g_hex[i]);
  }
}

static kc_store_enc enc_of(kc_store *s, size_t i, size_t *stored) {
  kc_store_read *r;
  assert_int_equal(kc_store_read_begin(s, &r), KC_OK);
  const void *d;
  size_t len;
  kc_store_enc enc;
  assert_int_equal(kc_store_blob_get_stored(r, g_hex[i], &d, &len, &enc, NULL),
                   KC_OK);
  kc_store_read_end(r);
  *stored = len;
  return enc;
}

static void expect_content(kc_store *s, size_t i) {
  kc_store_blob_stream *b;
  uint64_t len;
  assert_int_equal(
      kc_store_blob_stream_open(s, g_hex[i], 1, &b, &len, NULL, NULL), KC_OK);
  assert_int_equal(len, sizes[i]);
  char *got = malloc(sizes[i] + 65536);
  size_t at = 0;
  long n;
  while ((n = kc_store_blob_stream_read(b, got + at, 65536)) > 0)
    at += (size_t)n;
  assert_int_equal(n, 0);
  assert_int_equal(at, sizes[i]);
  assert_memory_equal(got, g_data[i], sizes[i]);
  free(got);
  kc_store_blob_stream_free(b);
}

static void wait_uploaded(kc_store *s) {
  for (int i = 0; i < 300; i++) {
    kc_store_tier_stats ts;
    assert_int_equal(kc_store_tier_stats_get(s, &ts), KC_OK);
    if (ts.queue_depth == 0)
      return;
    usleep(100 * 1000);
  }
  fail_msg("the tier's queue did not drain");
}

static void test_upload_compressed_objects(void **state) {
  (void)state;
  char err[KC_ERRBUF_SIZE] = "";
  kc_store *a = open_store("a", 3);
  for (size_t i = 0; i < N_BLOBS; i++)
    assert_int_equal(
        kc_store_blob_put(a, g_hex[i], g_data[i], sizes[i], NULL, err), KC_OK);
  wait_uploaded(a);
  kcs3 *c = open_rgw();
  for (size_t i = 0; i < N_BLOBS; i++) {
    char obj[400], v[32] = "";
    snprintf(obj, sizeof obj, "zt/blobs/%s", g_hex[i]);
    void *d = NULL;
    size_t len = 0, stored = 0;
    assert_int_equal(kcs3_get(c, obj, 64u << 20, &d, &len, NULL, err), KC_OK);
    int marked =
        kcs3_answer_header(c, "x-amz-meta-kcache-encoding", v, sizeof v);
    kc_store_enc enc = enc_of(a, i, &stored);
    assert_int_equal(len, stored); /* the object is the blob as held */
    if (i == 0 || i == 3) {
      assert_int_equal(enc, KC_STORE_ZSTD);
      assert_true(marked);
      assert_string_equal(v, "zstd");
      assert_true(len < sizes[i]);
      char *out = malloc(sizes[i] + 1);
      assert_int_equal(ZSTD_decompress(out, sizes[i] + 1, d, len), sizes[i]);
      assert_memory_equal(out, g_data[i], sizes[i]);
      free(out);
    } else {
      assert_int_equal(enc, KC_STORE_RAW);
      assert_false(marked);
      assert_memory_equal(d, g_data[i], sizes[i]);
    }
    free(d);
  }
  kcs3_close(c);
  assert_int_equal(kc_store_verify(a, err), KC_OK);
  kc_store_close(a);
}

/* Read through by a store that compresses: kept as the frame came. */
static void test_read_through_keeps_frames(void **state) {
  (void)state;
  char err[KC_ERRBUF_SIZE] = "";
  kc_store *b = open_store("b", 3);
  for (size_t i = 0; i < N_BLOBS; i++) {
    assert_int_equal(kc_store_fetch_blob(b, g_hex[i], err), KC_OK);
    size_t stored = 0;
    kc_store_enc enc = enc_of(b, i, &stored);
    assert_int_equal(enc, i == 0 || i == 3 ? KC_STORE_ZSTD : KC_STORE_RAW);
    expect_content(b, i);
  }
  assert_int_equal(kc_store_verify(b, err), KC_OK);
  kc_store_stats st;
  assert_int_equal(kc_store_stats_get(b, &st), KC_OK);
  assert_true(st.bytes_used < st.bytes_raw);
  kc_store_close(b);
  /* the copy served before the commit is the content */
  kc_store *b2 = open_store("b2", 3);
  void *d = NULL;
  size_t len = 0;
  assert_int_equal(kc_store_fetch_blob_copy(b2, g_hex[0], &d, &len, err),
                   KC_OK);
  assert_non_null(d);
  assert_int_equal(len, sizes[0]);
  assert_memory_equal(d, g_data[0], sizes[0]);
  free(d);
  kc_store_close(b2); /* the fill thread commits before it closes */
  b2 = open_store("b2", 3);
  size_t stored;
  assert_int_equal(enc_of(b2, 0, &stored), KC_STORE_ZSTD);
  expect_content(b2, 0);
  kc_store_close(b2);
}

/* Read through by a store that does not compress: the content, raw. */
static void test_read_through_raw_store(void **state) {
  (void)state;
  char err[KC_ERRBUF_SIZE] = "";
  kc_store *c = open_store("c", 0);
  for (size_t i = 0; i < N_BLOBS; i++) {
    assert_int_equal(kc_store_fetch_blob(c, g_hex[i], err), KC_OK);
    size_t stored = 0;
    assert_int_equal(enc_of(c, i, &stored), KC_STORE_RAW);
    assert_int_equal(stored, sizes[i]);
    expect_content(c, i);
  }
  assert_int_equal(kc_store_verify(c, err), KC_OK);
  kc_store_close(c);
}

static int setup(void **state) {
  (void)state;
  char err[KC_ERRBUF_SIZE] = "";
  snprintf(g_bucket, sizeof g_bucket, "kcache-zstd-%ld", (long)getpid());
  kcs3 *c = open_rgw();
  kc_err e = kcs3_bucket_create(c, err);
  kcs3_close(c);
  if (e != KC_OK)
    fprintf(stderr, "bucket create: %s: %s\n", kc_err_name(e), err);
  return e == KC_OK ? 0 : -1;
}

int main(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  kc_store_global_init();
  const char *tmp = getenv("TMPDIR");
  snprintf(g_tmp, sizeof g_tmp, "%s/kcache-s3zstd-XXXXXX",
           tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(g_tmp))
    return 1;
  make_blobs();
  const struct CMUnitTest rgw[] = {
      cmocka_unit_test(test_upload_compressed_objects),
      cmocka_unit_test(test_read_through_keeps_frames),
      cmocka_unit_test(test_read_through_raw_store),
  };
  int fails = 0;
  int up = kc_testrgw_up(&g_rgw, "test_s3_zstd");
  if (up == 0)
    fails += cmocka_run_group_tests_name("s3_zstd", rgw, setup, NULL);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", g_tmp);
  for (size_t i = 0; i < N_BLOBS; i++)
    free(g_data[i]);
  curl_global_cleanup();
  return kc_testrgw_finish(&g_rgw, up, fails);
}
