/* test_store.c: unit tests of store/ (kc_store.h), written from the header and
 * issue 2 independently of the implementation: blob and bundle round trips,
 * streaming and fd uploads, write-once, missing blobs, refcounts after delete,
 * GC grace, model listing, stats, LRU eviction order, a full map and recovery,
 * reopen, a writer killed with SIGKILL, concurrent readers, a 256 MiB blob,
 * corruption found by verify, and bad input.
 *
 * Every test gets a fresh temporary directory (removed afterwards); the store
 * lives in <tmp>/store. Run some tests only: KC_TEST_FILTER=<glob>; leave
 * some out: KC_TEST_SKIP=<glob>; the crash test's random seed: KC_TEST_SEED. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <ftw.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kc_schema.h"
#include "kc_store.h"

#define M1 "5a7cc462c675f9d5693bae11d480f09c3c01ae53617500e6475623784622159c"
#define M2 "03cf86902340794268a9b9f40b667111cd3927e11061e8d6cde46aa2a4e6fad0"
/* Two models that differ in their last digit only: an index keyed by a
 * prefix of model+key must not mix them up. */
#define MA0 "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa0"
#define MA1 "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa1"
#define B1 "e844adc60c72d254b27e713b88e72a8338fbb13944b1499c212495e376cd3d11"
#define Z64 "0000000000000000000000000000000000000000000000000000000000000000"
#define SHA_EMPTY                                                              \
  "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

static char errbuf[KC_ERRBUF_SIZE];

#if defined(__SANITIZE_ADDRESS__)
/* LMDB 0.9.24 (Debian 12) leaks the spilled-page list (1 MiB, from
 * mdb_midl_alloc) of every top-level write transaction that spills, i.e. one
 * that dirties more than 2^16 pages: each put of a blob of about 256 MiB or
 * more (test_large_blob_256mib). Later LMDB frees it in mdb_txn_end. Not the
 * store's leak; anything else leaking still fails the sanitizer build. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) {
  return "leak:mdb_midl_alloc\n";
}
#endif

/* ---- assertion helpers ---- */

static void check_err_at(kc_err got, kc_err want, const char *what,
                         const char *file, int line) {
  if (got == want)
    return;
  print_error("%s:%d: %s\n    got %s (%s), want %s\n", file, line, what,
              kc_err_name(got), errbuf, kc_err_name(want));
  _fail(file, line);
}
/* Runs call with a cleared errbuf; fails unless it returns want. */
#define EXPECT(call, want)                                                     \
  do {                                                                         \
    errbuf[0] = '\0';                                                          \
    check_err_at((call), (want), #call, __FILE__, __LINE__);                   \
  } while (0)
#define OK(call) EXPECT(call, KC_OK)

/* Fails unless got is one of the listed codes (ambiguous spec corners). */
static void check_err_in_at(kc_err got, const kc_err *want, size_t n,
                            const char *what, const char *file, int line) {
  for (size_t i = 0; i < n; i++)
    if (got == want[i])
      return;
  print_error("%s:%d: %s\n    got %s (%s), want one of:", file, line, what,
              kc_err_name(got), errbuf);
  for (size_t i = 0; i < n; i++)
    print_error(" %s", kc_err_name(want[i]));
  print_error("\n");
  _fail(file, line);
}
#define EXPECT_IN(call, ...)                                                   \
  do {                                                                         \
    const kc_err want_[] = {__VA_ARGS__};                                      \
    errbuf[0] = '\0';                                                          \
    check_err_in_at((call), want_, sizeof want_ / sizeof want_[0], #call,      \
                    __FILE__, __LINE__);                                       \
  } while (0)

/* ---- fixture: a temporary directory ---- */

typedef struct fx {
  char *tmp;   /* mkdtemp'd, removed after the test */
  char *dir;   /* tmp/store, created */
} fx;

static int rm_entry(const char *p, const struct stat *st, int flag,
                    struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(p);
}

static char *path_join(const char *a, const char *b) {
  size_t n = strlen(a) + strlen(b) + 2;
  char *p = malloc(n);
  assert_non_null(p);
  snprintf(p, n, "%s/%s", a, b);
  return p;
}

static int fx_setup(void **state) {
  fx *f = calloc(1, sizeof *f);
  if (!f)
    return -1;
  const char *base = getenv("TMPDIR");
  char tmpl[4096];
  snprintf(tmpl, sizeof tmpl, "%s/kc_store_test.XXXXXX",
           base && *base ? base : "/tmp");
  if (!mkdtemp(tmpl)) {
    free(f);
    return -1;
  }
  f->tmp = strdup(tmpl);
  f->dir = path_join(f->tmp, "store");
  if (mkdir(f->dir, 0700) != 0)
    return -1;
  *state = f;
  return 0;
}

static int fx_teardown(void **state) {
  fx *f = *state;
  int rc = nftw(f->tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  free(f->dir);
  free(f->tmp);
  free(f);
  return rc;
}

/* ---- helpers ---- */

static kc_store *open_store(const char *dir, uint64_t max_bytes,
                            uint64_t map_size, uint64_t grace_s) {
  kc_store_opts o;
  memset(&o, 0, sizeof o);
  o.dir = dir;
  o.max_bytes = max_bytes;
  o.map_size = map_size;
  o.grace_s = grace_s;
  kc_store *s = NULL;
  OK(kc_store_open(&o, &s, errbuf));
  assert_non_null(s);
  return s;
}

/* Deterministic bytes from a seed (xorshift64). */
static void fill(uint8_t *p, size_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 0x1234567ULL;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = (uint8_t)(x >> 24);
  }
}

static uint8_t *make_bytes(size_t n, uint64_t seed, char hex[KC_HEX_LEN + 1]) {
  uint8_t *p = malloc(n ? n : 1);
  assert_non_null(p);
  fill(p, n, seed);
  assert_int_equal(kc_sha256_hex(p, n, hex), KC_OK);
  return p;
}

/* Stores n bytes made from seed; writes their digest. */
static void put_seed(kc_store *s, size_t n, uint64_t seed,
                     char hex[KC_HEX_LEN + 1]) {
  uint8_t *p = make_bytes(n, seed, hex);
  int created = -1;
  OK(kc_store_blob_put(s, hex, p, n, &created, errbuf));
  assert_int_equal(created, 1);
  free(p);
}

static int blob_present(kc_store *s, const char *hex) {
  kc_err e = kc_store_blob_has(s, hex, NULL);
  assert_true(e == KC_OK || e == KC_NOT_FOUND);
  return e == KC_OK;
}

static int bundle_present(kc_store *s, const char *key) {
  kc_err e = kc_store_bundle_has(s, key);
  assert_true(e == KC_OK || e == KC_NOT_FOUND);
  return e == KC_OK;
}

/* A sealed manifest of model, bucket {"batch": bucket}, with one file per
 * digest (path f<i>.cubin). */
static kc_manifest *make_manifest(const char *model, uint64_t bucket, size_t n,
                                  char digests[][KC_HEX_LEN + 1],
                                  const uint64_t *sizes) {
  kc_manifest *m = kc_manifest_new();
  assert_non_null(m);
  kc_key_fields *f = &m->fields;
  memset(f, 0, sizeof *f);
  strcpy(f->model, model);
  strcpy(f->build, B1);
  strcpy(f->arch, "sm_90a");
  f->bucket.n = 1;
  strcpy(f->bucket.dims[0].name, "batch");
  f->bucket.dims[0].value = bucket;
  f->n_tools = 1;
  strcpy(f->tools[0].name, "cuda");
  strcpy(f->tools[0].value, "13.0");
  for (size_t i = 0; i < n; i++) {
    char path[32];
    const char *entries[] = {"k"};
    snprintf(path, sizeof path, "f%zu.cubin", i);
    OK(kc_manifest_add_file(m, path, digests[i], sizes[i], KC_KIND_CUBIN,
                            entries, 1, errbuf));
  }
  OK(kc_manifest_seal(m, errbuf));
  return m;
}

static char *manifest_json(const kc_manifest *m) {
  char *j = NULL;
  OK(kc_manifest_to_json(m, &j, errbuf));
  assert_non_null(j);
  return j;
}

static void put_bundle(kc_store *s, const kc_manifest *m, int want_created) {
  int created = -1;
  OK(kc_store_bundle_put(s, m, &created, NULL, NULL, errbuf));
  assert_int_equal(created, want_created);
}

/* Stores a bundle of one unique blob (size bytes, seed) plus the extra
 * digests given; writes its key and the unique blob's digest. */
static kc_manifest *bundle_with_blob(kc_store *s, const char *model,
                                     uint64_t bucket, size_t size,
                                     uint64_t seed, const char *extra,
                                     uint64_t extra_size,
                                     char blob[KC_HEX_LEN + 1]) {
  char d[2][KC_HEX_LEN + 1];
  uint64_t sz[2] = {size, extra_size};
  put_seed(s, size, seed, d[0]);
  if (blob)
    strcpy(blob, d[0]);
  if (extra)
    strcpy(d[1], extra);
  kc_manifest *m = make_manifest(model, bucket, extra ? 2 : 1, d, sz);
  put_bundle(s, m, 1);
  return m;
}

/* Compares the JSON a read returns for key with want. */
static void expect_bundle_json(kc_store *s, const char *key, const char *want) {
  kc_store_read *r = NULL;
  const char *json = NULL;
  size_t len = 0;
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_bundle_get(r, key, &json, &len));
  assert_non_null(json);
  if (len != strlen(want) || memcmp(json, want, len) != 0) {
    print_error("bundle %s:\n got  %.*s\n want %s\n", key, (int)len, json,
                want);
    kc_store_read_end(r);
    fail();
  }
  kc_store_read_end(r);
}

/* Checks that every file of the manifest in json is held with its bytes. */
static int bundle_blobs_ok(kc_store_read *r, const char *json, size_t len,
                           char *why, size_t whylen) {
  kc_manifest *m = NULL;
  char e[KC_ERRBUF_SIZE];
  if (kc_manifest_parse(json, len, &m, e) != KC_OK) {
    snprintf(why, whylen, "manifest does not parse: %.400s", e);
    return 0;
  }
  for (size_t i = 0; i < m->n_files; i++) {
    const void *data = NULL;
    size_t n = 0;
    char hex[KC_HEX_LEN + 1];
    kc_err rc = kc_store_blob_get(r, m->files[i].sha256, &data, &n);
    if (rc != KC_OK) {
      snprintf(why, whylen, "bundle %s: blob %s: %s", m->key,
               m->files[i].sha256, kc_err_name(rc));
      kc_manifest_free(m);
      return 0;
    }
    kc_sha256_hex(data, n, hex);
    if (n != m->files[i].size || strcmp(hex, m->files[i].sha256) != 0) {
      snprintf(why, whylen, "bundle %s: blob %s: %zu bytes hashing to %s",
               m->key, m->files[i].sha256, n, hex);
      kc_manifest_free(m);
      return 0;
    }
  }
  kc_manifest_free(m);
  return 1;
}

/* ---- model listings ---- */

#define LIST_MAX 256
typedef struct listing {
  size_t n;
  size_t stop_after; /* 0: never stop */
  char keys[LIST_MAX][KC_HEX_LEN + 1];
  uint64_t bytes[LIST_MAX], hits[LIST_MAX];
  int64_t created[LIST_MAX], last_used[LIST_MAX];
  char *manifest[LIST_MAX];
} listing;

static int list_cb(const kc_store_bundle_info *info, void *ud) {
  listing *l = ud;
  if (l->n >= LIST_MAX)
    return 1;
  strcpy(l->keys[l->n], info->key);
  l->bytes[l->n] = info->bytes;
  l->hits[l->n] = info->hits;
  l->created[l->n] = info->created;
  l->last_used[l->n] = info->last_used;
  l->manifest[l->n] =
      info->manifest ? strndup(info->manifest, info->manifest_len) : NULL;
  l->n++;
  return l->stop_after && l->n >= l->stop_after;
}

static void listing_free(listing *l) {
  for (size_t i = 0; i < l->n; i++)
    free(l->manifest[i]);
  free(l);
}

static listing *list_model(kc_store *s, const char *model) {
  listing *l = calloc(1, sizeof *l);
  assert_non_null(l);
  OK(kc_store_model_list(s, model, list_cb, l));
  return l;
}

static ssize_t listing_find(const listing *l, const char *key) {
  for (size_t i = 0; i < l->n; i++)
    if (strcmp(l->keys[i], key) == 0)
      return (ssize_t)i;
  return -1;
}

/* Regular files under dir, recursively (temporary upload files show up). */
static int count_files_cb(const char *p, const struct stat *st, int flag,
                          struct FTW *ftw);
static size_t g_file_count;
static int count_files_cb(const char *p, const struct stat *st, int flag,
                          struct FTW *ftw) {
  (void)p, (void)st, (void)ftw;
  if (flag == FTW_F)
    g_file_count++;
  return 0;
}
static size_t count_files(const char *dir) {
  g_file_count = 0;
  assert_int_equal(nftw(dir, count_files_cb, 16, FTW_PHYS), 0);
  return g_file_count;
}

static int manifest_len_cb(const kc_store_bundle_info *info, void *ud) {
  *(uint64_t *)ud += info->manifest_len;
  return 0;
}

/* Bytes used less the manifests (bytes used counts both): the blobs' bytes.
 * Every test stores its bundles under these models. */
static uint64_t blob_bytes(kc_store *s) {
  kc_store_stats st;
  OK(kc_store_stats_get(s, &st));
  uint64_t manifests = 0;
  const char *models[] = {M1, M2, MA0, MA1};
  for (size_t i = 0; i < 4; i++)
    OK(kc_store_model_list(s, models[i], manifest_len_cb, &manifests));
  return st.bytes_used - manifests;
}

static kc_store_stats get_stats(kc_store *s) {
  kc_store_stats st;
  memset(&st, 0xab, sizeof st);
  OK(kc_store_stats_get(s, &st));
  return st;
}

/* ======================================================================= */
/* open                                                                     */

static void test_open_creates_dir_and_empty_stats(void **state) {
  fx *f = *state;
  char *sub = path_join(f->tmp, "fresh");
  kc_store *s = open_store(sub, 1 << 20, 0, 0);
  struct stat st;
  assert_int_equal(stat(sub, &st), 0);
  assert_true(S_ISDIR(st.st_mode));
  kc_store_stats ss = get_stats(s);
  assert_int_equal(ss.bytes_used, 0);
  assert_int_equal(ss.max_bytes, 1 << 20);
  assert_int_equal(ss.blobs, 0);
  assert_int_equal(ss.bundles, 0);
  assert_int_equal(ss.hits, 0);
  assert_int_equal(ss.misses, 0);
  assert_int_equal(ss.evicted_bundles, 0);
  assert_int_equal(ss.evicted_blobs, 0);
  assert_int_equal(ss.gc_blobs, 0);
  assert_true(ss.map_size > 0);
  assert_true(ss.map_used <= ss.map_size);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
  kc_store_close(NULL); /* NULL: nothing */
  free(sub);
}

static void test_open_bad(void **state) {
  fx *f = *state;
  kc_store *s = NULL;
  kc_store_opts o;
  memset(&o, 0, sizeof o);
  /* A regular file where the directory should be. */
  char *file = path_join(f->tmp, "plainfile");
  FILE *fp = fopen(file, "w");
  assert_non_null(fp);
  fputs("x", fp);
  fclose(fp);
  o.dir = file;
  errbuf[0] = '\0';
  kc_err e = kc_store_open(&o, &s, errbuf);
  assert_int_not_equal(e, KC_OK);
  assert_null(s);
  assert_true(errbuf[0] != '\0');
  /* Empty path. */
  o.dir = "";
  s = NULL;
  e = kc_store_open(&o, &s, errbuf);
  assert_int_not_equal(e, KC_OK);
  assert_null(s);
  free(file);
}

/* ======================================================================= */
/* blobs                                                                    */

static void test_blob_roundtrip(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  char hex[KC_HEX_LEN + 1], other[KC_HEX_LEN + 1];
  uint8_t *p = make_bytes(10000, 1, hex);
  uint8_t *q = make_bytes(10, 2, other);
  int created = -1;
  uint64_t size = 0;

  EXPECT(kc_store_blob_has(s, hex, &size), KC_NOT_FOUND);
  OK(kc_store_blob_put(s, hex, p, 10000, &created, errbuf));
  assert_int_equal(created, 1);
  OK(kc_store_blob_put(s, hex, p, 10000, &created, errbuf));
  assert_int_equal(created, 0);
  OK(kc_store_blob_has(s, hex, &size));
  assert_int_equal(size, 10000);
  OK(kc_store_blob_has(s, hex, NULL));
  EXPECT(kc_store_blob_has(s, other, &size), KC_NOT_FOUND);

  kc_store_read *r = NULL;
  const void *data = NULL, *data2 = NULL;
  size_t len = 0, len2 = 0;
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_blob_get(r, hex, &data, &len));
  assert_int_equal(len, 10000);
  assert_non_null(data);
  assert_ptr_not_equal(data, p);
  assert_memory_equal(data, p, 10000);
  /* Zero-copy: the same bytes of the map both times. */
  OK(kc_store_blob_get(r, hex, &data2, &len2));
  assert_ptr_equal(data, data2);
  assert_int_equal(len2, 10000);
  EXPECT(kc_store_blob_get(r, other, &data, &len), KC_NOT_FOUND);
  kc_store_read_end(r);
  kc_store_read_end(NULL);

  kc_store_stats st = get_stats(s);
  assert_int_equal(st.blobs, 1);
  assert_int_equal(st.bytes_used, 10000);
  kc_store_close(s);
  free(p);
  free(q);
}

/* The empty file is a legitimate file of a bundle. */
static void test_blob_empty(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  int created = -1;
  uint64_t size = 99;
  OK(kc_store_blob_put(s, SHA_EMPTY, "", 0, &created, errbuf));
  assert_int_equal(created, 1);
  OK(kc_store_blob_has(s, SHA_EMPTY, &size));
  assert_int_equal(size, 0);
  kc_store_read *r = NULL;
  const void *data = NULL;
  size_t len = 99;
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_blob_get(r, SHA_EMPTY, &data, &len));
  assert_int_equal(len, 0);
  kc_store_read_end(r);
  /* And a bundle can reference it. */
  char d[1][KC_HEX_LEN + 1] = {SHA_EMPTY};
  uint64_t sz[1] = {0};
  kc_manifest *m = make_manifest(M1, 1, 1, d, sz);
  put_bundle(s, m, 1);
  OK(kc_store_verify(s, errbuf));
  kc_manifest_free(m);
  kc_store_close(s);
}

static void test_blob_digest_mismatch(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  char hex[KC_HEX_LEN + 1], wrong[KC_HEX_LEN + 1];
  uint8_t *p = make_bytes(5000, 3, hex);
  uint8_t *q = make_bytes(5000, 4, wrong);
  int created = -1;
  EXPECT(kc_store_blob_put(s, wrong, p, 5000, &created, errbuf),
         KC_DIGEST_MISMATCH);
  assert_true(errbuf[0] != '\0');
  EXPECT(kc_store_blob_has(s, wrong, NULL), KC_NOT_FOUND);
  EXPECT(kc_store_blob_has(s, hex, NULL), KC_NOT_FOUND);
  /* One byte off. */
  p[4999] ^= 1;
  EXPECT(kc_store_blob_put(s, hex, p, 5000, &created, errbuf),
         KC_DIGEST_MISMATCH);
  /* Right bytes, wrong length. */
  p[4999] ^= 1;
  EXPECT(kc_store_blob_put(s, hex, p, 4999, &created, errbuf),
         KC_DIGEST_MISMATCH);
  EXPECT(kc_store_blob_has(s, hex, NULL), KC_NOT_FOUND);
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.blobs, 0);
  assert_int_equal(st.bytes_used, 0);
  /* A mismatch against a digest already held changes nothing either. */
  OK(kc_store_blob_put(s, hex, p, 5000, &created, errbuf));
  EXPECT(kc_store_blob_put(s, hex, q, 5000, &created, errbuf),
         KC_DIGEST_MISMATCH);
  kc_store_read *r = NULL;
  const void *data;
  size_t len;
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_blob_get(r, hex, &data, &len));
  assert_int_equal(len, 5000);
  assert_memory_equal(data, p, 5000);
  kc_store_read_end(r);
  kc_store_close(s);
  free(p);
  free(q);
}

static void expect_blob_bytes(kc_store *s, const char *hex, const void *want,
                              size_t n) {
  kc_store_read *r = NULL;
  const void *data = NULL;
  size_t len = 0;
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_blob_get(r, hex, &data, &len));
  assert_int_equal(len, n);
  assert_memory_equal(data, want, n);
  kc_store_read_end(r);
}

static void write_all(int fd, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n) {
    ssize_t w = write(fd, b, n);
    if (w < 0 && errno == EINTR)
      continue;
    assert_true(w > 0);
    b += w;
    n -= (size_t)w;
  }
}

static void test_blob_put_fd_file(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  const size_t n = 3 * 1024 * 1024 + 17;
  char hex[KC_HEX_LEN + 1], head[KC_HEX_LEN + 1];
  uint8_t *p = make_bytes(n, 5, hex);
  char *path = path_join(f->tmp, "blob.bin");
  int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0600);
  assert_true(fd >= 0);
  write_all(fd, p, n);
  int created = -1;

  /* Wrong digest: nothing stored. */
  assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
  EXPECT(kc_store_blob_put_fd(s, Z64, fd, n, &created, errbuf),
         KC_DIGEST_MISMATCH);
  EXPECT(kc_store_blob_has(s, Z64, NULL), KC_NOT_FOUND);
  EXPECT(kc_store_blob_has(s, hex, NULL), KC_NOT_FOUND);

  assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
  OK(kc_store_blob_put_fd(s, hex, fd, n, &created, errbuf));
  assert_int_equal(created, 1);
  expect_blob_bytes(s, hex, p, n);

  /* len shorter than the file: exactly len bytes are read and stored. */
  assert_int_equal(kc_sha256_hex(p, 1000, head), KC_OK);
  assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
  OK(kc_store_blob_put_fd(s, head, fd, 1000, &created, errbuf));
  assert_int_equal(created, 1);
  expect_blob_bytes(s, head, p, 1000);

  /* The file ends before len: an error, not a hang, nothing stored. */
  char big[KC_HEX_LEN + 1];
  uint8_t *p2 = make_bytes(n + 100, 5, big);
  assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
  errbuf[0] = '\0';
  kc_err e = kc_store_blob_put_fd(s, big, fd, n + 100, &created, errbuf);
  assert_int_not_equal(e, KC_OK);
  EXPECT(kc_store_blob_has(s, big, NULL), KC_NOT_FOUND);

  /* A bad fd. */
  e = kc_store_blob_put_fd(s, big, -1, 10, &created, errbuf);
  assert_int_not_equal(e, KC_OK);

  /* Read from the file's current offset: bytes [777, 777 + 5000). */
  char mid[KC_HEX_LEN + 1];
  assert_int_equal(kc_sha256_hex(p + 777, 5000, mid), KC_OK);
  assert_int_equal(lseek(fd, 777, SEEK_SET), 777);
  OK(kc_store_blob_put_fd(s, mid, fd, 5000, &created, errbuf));
  assert_int_equal(created, 1);
  expect_blob_bytes(s, mid, p + 777, 5000);

  kc_store_stats st = get_stats(s);
  assert_int_equal(st.blobs, 3);
  assert_int_equal(st.bytes_used, n + 1000 + 5000);
  close(fd);
  kc_store_close(s);
  free(p);
  free(p2);
  free(path);
}

typedef struct pipe_writer {
  int fd;
  const uint8_t *p;
  size_t n;
} pipe_writer;

static void *pipe_writer_main(void *arg) {
  pipe_writer *w = arg;
  size_t off = 0;
  while (off < w->n) {
    size_t chunk = w->n - off < 7000 ? w->n - off : 7000; /* odd pieces */
    ssize_t k = write(w->fd, w->p + off, chunk);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      break;
    off += (size_t)k;
  }
  close(w->fd);
  return NULL;
}

static kc_err put_from_pipe(kc_store *s, const char *hex, const uint8_t *p,
                            size_t send, uint64_t len, int *created) {
  int pfd[2];
  assert_int_equal(pipe(pfd), 0);
  pipe_writer w = {pfd[1], p, send};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, pipe_writer_main, &w), 0);
  errbuf[0] = '\0';
  kc_err e = kc_store_blob_put_fd(s, hex, pfd[0], len, created, errbuf);
  close(pfd[0]); /* unblocks the writer if the store stopped reading */
  pthread_join(t, NULL);
  return e;
}

static void test_blob_put_fd_pipe(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  signal(SIGPIPE, SIG_IGN);
  /* Much larger than a pipe buffer: the store must read while we write. */
  const size_t n = 2 * 1024 * 1024 + 3;
  char hex[KC_HEX_LEN + 1];
  uint8_t *p = make_bytes(n, 6, hex);
  int created = -1;
  EXPECT(put_from_pipe(s, hex, p, n, n, &created), KC_OK);
  assert_int_equal(created, 1);
  expect_blob_bytes(s, hex, p, n);

  /* Again: already present. */
  EXPECT(put_from_pipe(s, hex, p, n, n, &created), KC_OK);
  assert_int_equal(created, 0);
  /* Already present: the header says fd is not read at all. An empty,
   * non-blocking pipe whose writer stays open shows it (a read would give
   * EAGAIN, not hang). */
  int q2[2];
  assert_int_equal(pipe(q2), 0);
  assert_int_equal(fcntl(q2[0], F_SETFL, O_NONBLOCK), 0);
  created = -1;
  OK(kc_store_blob_put_fd(s, hex, q2[0], n, &created, errbuf));
  assert_int_equal(created, 0);
  close(q2[0]);
  close(q2[1]);

  /* Wrong digest through a pipe. */
  char wrong[KC_HEX_LEN + 1];
  uint8_t *q = make_bytes(4096, 7, wrong);
  EXPECT(put_from_pipe(s, wrong, p, 4096, 4096, &created),
         KC_DIGEST_MISMATCH);
  EXPECT(kc_store_blob_has(s, wrong, NULL), KC_NOT_FOUND);

  /* The writer goes away early (EOF before len): an error, nothing stored. */
  kc_err e = put_from_pipe(s, wrong, q, 1000, 4096, &created);
  assert_int_not_equal(e, KC_OK);
  EXPECT(kc_store_blob_has(s, wrong, NULL), KC_NOT_FOUND);

  kc_store_stats st = get_stats(s);
  assert_int_equal(st.blobs, 1);
  kc_store_close(s);
  free(p);
  free(q);
}

static void test_upload_stream(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  const size_t n = 5 * 1024 * 1024 + 11;
  char hex[KC_HEX_LEN + 1];
  uint8_t *p = make_bytes(n, 8, hex);
  size_t files0 = count_files(f->dir);
  int created = -1;

  /* Commit in odd-sized pieces. */
  kc_store_upload *u = NULL;
  OK(kc_store_upload_begin(s, &u, errbuf));
  assert_non_null(u);
  assert_int_equal(kc_store_upload_size(u), 0);
  size_t off = 0, step = 1;
  while (off < n) {
    size_t k = n - off < step ? n - off : step;
    OK(kc_store_upload_write(u, p + off, k, errbuf));
    off += k;
    step = step * 3 + 1;
    if (step > 1000000)
      step = 12345;
  }
  OK(kc_store_upload_write(u, p, 0, errbuf)); /* empty write: nothing */
  assert_int_equal(kc_store_upload_size(u), n);
  OK(kc_store_upload_commit(u, hex, &created, errbuf));
  assert_int_equal(created, 1);
  expect_blob_bytes(s, hex, p, n);
  assert_int_equal(count_files(f->dir), files0);

  /* The same bytes again: already present. */
  OK(kc_store_upload_begin(s, &u, errbuf));
  OK(kc_store_upload_write(u, p, n, errbuf));
  OK(kc_store_upload_commit(u, hex, &created, errbuf));
  assert_int_equal(created, 0);

  /* Abort: nothing stored, no file left behind. */
  char hex2[KC_HEX_LEN + 1];
  uint8_t *q = make_bytes(200000, 9, hex2);
  OK(kc_store_upload_begin(s, &u, errbuf));
  OK(kc_store_upload_write(u, q, 200000, errbuf));
  assert_int_equal(kc_store_upload_size(u), 200000);
  kc_store_upload_abort(u);
  kc_store_upload_abort(NULL);
  EXPECT(kc_store_blob_has(s, hex2, NULL), KC_NOT_FOUND);
  assert_int_equal(count_files(f->dir), files0);

  /* Digest mismatch: nothing stored, no file left, u freed (ASan). */
  OK(kc_store_upload_begin(s, &u, errbuf));
  OK(kc_store_upload_write(u, q, 199999, errbuf));
  EXPECT(kc_store_upload_commit(u, hex2, &created, errbuf),
         KC_DIGEST_MISMATCH);
  EXPECT(kc_store_blob_has(s, hex2, NULL), KC_NOT_FOUND);
  assert_int_equal(count_files(f->dir), files0);

  /* A bad digest string at commit: an error, u freed. */
  OK(kc_store_upload_begin(s, &u, errbuf));
  OK(kc_store_upload_write(u, q, 10, errbuf));
  EXPECT_IN(kc_store_upload_commit(u, "NOTHEX", &created, errbuf),
            KC_BAD_DIGEST, KC_EINVAL);

  /* An empty upload, its one write empty before any buffer exists (UBSan
   * caught a memcpy to NULL there). */
  OK(kc_store_upload_begin(s, &u, errbuf));
  OK(kc_store_upload_write(u, p, 0, errbuf));
  OK(kc_store_upload_commit(u, SHA_EMPTY, &created, errbuf));
  assert_int_equal(created, 1);
  OK(kc_store_blob_has(s, SHA_EMPTY, NULL));

  /* Two uploads at once, committed in the other order. */
  kc_store_upload *u1 = NULL, *u2 = NULL;
  OK(kc_store_upload_begin(s, &u1, errbuf));
  OK(kc_store_upload_begin(s, &u2, errbuf));
  OK(kc_store_upload_write(u1, p, 1000, errbuf));
  OK(kc_store_upload_write(u2, q, 200000, errbuf));
  OK(kc_store_upload_write(u1, p + 1000, 1000, errbuf));
  char hex1k[KC_HEX_LEN + 1];
  assert_int_equal(kc_sha256_hex(p, 2000, hex1k), KC_OK);
  OK(kc_store_upload_commit(u2, hex2, &created, errbuf));
  assert_int_equal(created, 1);
  OK(kc_store_upload_commit(u1, hex1k, &created, errbuf));
  assert_int_equal(created, 1);
  expect_blob_bytes(s, hex2, q, 200000);
  expect_blob_bytes(s, hex1k, p, 2000);
  assert_int_equal(count_files(f->dir), files0);

  kc_store_stats st = get_stats(s);
  assert_int_equal(st.blobs, 4);
  assert_int_equal(st.bytes_used, n + 200000 + 2000);
  kc_store_close(s);
  free(p);
  free(q);
}

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
    ma[i] = bundle_with_blob(s, MA0, (uint64_t)i + 1, sizes[i], 81 + i,
                             shared, 500, NULL);
  for (int i = 0; i < 2; i++)
    mb[i] = bundle_with_blob(s, MA1, (uint64_t)i + 1, 100, 90 + i, NULL, 0,
                             NULL);
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
      if ((ev->mask & IN_MODIFY) &&
          !(ev->len && strstr(ev->name, "lock")))
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
  char (*dg)[KC_HEX_LEN + 1] = calloc(MAXB, KC_HEX_LEN + 1);
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
  char (*dg)[KC_HEX_LEN + 1] = calloc(MAXB, KC_HEX_LEN + 1);
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

/* ======================================================================= */
/* reopen                                                                   */

static void test_close_reopen(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 50 * 1024 * 1024, 0, 100);
  char x[KC_HEX_LEN + 1], y[KC_HEX_LEN + 1], z[KC_HEX_LEN + 1],
      u[KC_HEX_LEN + 1];
  put_seed(s, 3000, 130, x); /* shared */
  kc_manifest *a = bundle_with_blob(s, M1, 1, 4000, 131, x, 3000, y);
  kc_manifest *b = bundle_with_blob(s, M1, 2, 5000, 132, x, 3000, z);
  put_seed(s, 6000, 133, u); /* unreferenced */
  char *aj = manifest_json(a), *bj = manifest_json(b);
  kc_store_read *r = NULL;
  const char *json;
  size_t len;
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_bundle_get(r, a->key, &json, &len));
  OK(kc_store_bundle_get(r, a->key, &json, &len));
  kc_store_read_end(r);
  OK(kc_store_flush(s));
  listing *l0 = list_model(s, M1);
  kc_store_stats st0 = get_stats(s);
  kc_store_close(s);

  s = open_store(f->dir, 50 * 1024 * 1024, 0, 100);
  kc_store_stats st1 = get_stats(s);
  assert_int_equal(st1.blobs, st0.blobs);
  assert_int_equal(st1.bundles, st0.bundles);
  assert_int_equal(st1.bytes_used, st0.bytes_used);
  assert_int_equal(blob_bytes(s), 3000 + 4000 + 5000 + 6000);
  assert_true(blob_present(s, x) && blob_present(s, y) &&
              blob_present(s, z) && blob_present(s, u));
  expect_bundle_json(s, a->key, aj);
  expect_bundle_json(s, b->key, bj);
  listing *l1 = list_model(s, M1);
  assert_int_equal(l1->n, 2);
  for (size_t i = 0; i < l0->n; i++) {
    ssize_t k = listing_find(l1, l0->keys[i]);
    assert_true(k >= 0);
    assert_int_equal(l1->hits[k], l0->hits[i]);
    assert_int_equal(l1->last_used[k], l0->last_used[i]);
    assert_int_equal(l1->created[k], l0->created[i]);
    assert_int_equal(l1->bytes[k], l0->bytes[i]);
  }
  ssize_t ka = listing_find(l1, a->key);
  assert_true(ka >= 0);
  assert_int_equal(l1->hits[ka], 2);
  listing_free(l0);
  listing_free(l1);
  OK(kc_store_verify(s, errbuf));

  /* Hits recorded without an explicit flush survive close (close flushes).
   * expect_bundle_json above got a and b once each in this session. */
  kc_store_close(s);
  s = open_store(f->dir, 50 * 1024 * 1024, 0, 100);
  l1 = list_model(s, M1);
  ssize_t kb = listing_find(l1, b->key);
  ka = listing_find(l1, a->key);
  assert_true(ka >= 0 && kb >= 0);
  assert_int_equal(l1->hits[ka], 3);
  assert_int_equal(l1->hits[kb], 1);
  listing_free(l1);

  /* Refcounts survived: deleting a releases y only; x is b's too. */
  OK(kc_store_bundle_delete(s, a->key, errbuf));
  OK(kc_store_gc(s, (int64_t)time(NULL) + 1000, errbuf));
  assert_false(blob_present(s, y));
  assert_false(blob_present(s, u));
  assert_true(blob_present(s, x));
  assert_true(blob_present(s, z));
  kc_store_close(s);

  /* And the deletion and gc persisted. */
  s = open_store(f->dir, 50 * 1024 * 1024, 0, 100);
  kc_store_stats st2 = get_stats(s);
  assert_int_equal(st2.blobs, 2);
  assert_int_equal(st2.bundles, 1);
  assert_int_equal(blob_bytes(s), 3000 + 5000);
  assert_int_equal(st2.hits, 0); /* since open */
  EXPECT(kc_store_bundle_has(s, a->key), KC_NOT_FOUND);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
  kc_manifest_free(a);
  kc_manifest_free(b);
  free(aj);
  free(bj);
}

/* Reopening with a map_size smaller than what the store holds still opens
 * it, with everything readable (LMDB never maps less than the data). */
static void test_reopen_smaller_map(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 64 * 1024 * 1024, 0);
  char d[24][KC_HEX_LEN + 1];
  for (int i = 0; i < 24; i++)
    put_seed(s, 128 * 1024, 180 + (uint64_t)i, d[i]);
  kc_store_close(s);
  s = open_store(f->dir, 0, 1024 * 1024, 0);
  for (int i = 0; i < 24; i++)
    assert_true(blob_present(s, d[i]));
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.blobs, 24);
  assert_true(st.map_size >= st.map_used);
  assert_true(st.map_used >= 24 * 128 * 1024);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
}

/* ======================================================================= */
/* crash safety                                                             */

#define CRASH_MODEL M2

/* The child: a stream of uploads, blob puts, bundle puts and deletes until
 * killed. Never returns. Signals the parent once the store is open, then
 * journals on the same pipe: "P<key>\n" after a bundle put returned,
 * "d<key>\n" before a delete and "D<key>\n" after it returned. */
static void journal(int fd, char tag, const char *key) {
  char line[KC_HEX_LEN + 2];
  line[0] = tag;
  memcpy(line + 1, key, KC_HEX_LEN);
  line[KC_HEX_LEN + 1] = '\n';
  if (write(fd, line, sizeof line) != (ssize_t)sizeof line)
    _exit(30);
}

static void crash_child(const char *dir, int round, int ready_fd) {
  kc_store_opts o;
  memset(&o, 0, sizeof o);
  o.dir = dir;
  o.grace_s = 1;
  kc_store *s = NULL;
  if (kc_store_open(&o, &s, NULL) != KC_OK)
    _exit(10);
  if (write(ready_fd, "r", 1) != 1)
    _exit(11);
  uint8_t *buf = malloc(300 * 1024);
  if (!buf)
    _exit(12);
  char keys[64][KC_HEX_LEN + 1];
  size_t n_keys = 0;
  for (uint64_t j = 0; j < 1000000; j++) {
    uint64_t id = (uint64_t)round * 1000000 + j;
    size_t nf = 1 + j % 3;
    char d[3][KC_HEX_LEN + 1];
    uint64_t sz[3];
    for (size_t i = 0; i < nf; i++) {
      sz[i] = 1 + (id * 7919 + i * 104729) % (256 * 1024);
      fill(buf, sz[i], id * 4 + i);
      kc_sha256_hex(buf, sz[i], d[i]);
      int created;
      kc_err e;
      if ((j + i) % 2) {
        e = kc_store_blob_put(s, d[i], buf, sz[i], &created, NULL);
      } else {
        kc_store_upload *u = NULL;
        e = kc_store_upload_begin(s, &u, NULL);
        if (e == KC_OK)
          e = kc_store_upload_write(u, buf, sz[i] / 2, NULL);
        if (e == KC_OK)
          e = kc_store_upload_write(u, buf + sz[i] / 2, sz[i] - sz[i] / 2,
                                    NULL);
        if (e == KC_OK)
          e = kc_store_upload_commit(u, d[i], &created, NULL);
        else
          kc_store_upload_abort(u);
      }
      if (e != KC_OK)
        _exit(20);
    }
    kc_manifest *m = kc_manifest_new();
    if (!m)
      _exit(21);
    strcpy(m->fields.model, CRASH_MODEL);
    strcpy(m->fields.build, B1);
    strcpy(m->fields.arch, "sm_80");
    m->fields.bucket.n = 1;
    strcpy(m->fields.bucket.dims[0].name, "seq");
    m->fields.bucket.dims[0].value = id;
    for (size_t i = 0; i < nf; i++) {
      char path[32];
      snprintf(path, sizeof path, "k%zu.ptx", i);
      if (kc_manifest_add_file(m, path, d[i], sz[i], KC_KIND_PTX, NULL, 0,
                               NULL) != KC_OK)
        _exit(22);
    }
    if (kc_manifest_seal(m, NULL) != KC_OK)
      _exit(23);
    int created;
    if (kc_store_bundle_put(s, m, &created, NULL, NULL, NULL) != KC_OK)
      _exit(24);
    journal(ready_fd, 'P', m->key);
    if (n_keys < 64)
      strcpy(keys[n_keys++], m->key);
    kc_manifest_free(m);
    /* Now and then: a delete, a gc, a flush (read first so there is
     * something to flush). */
    if (j % 5 == 4 && n_keys > 1) {
      n_keys--;
      journal(ready_fd, 'd', keys[n_keys]);
      if (kc_store_bundle_delete(s, keys[n_keys], NULL) != KC_OK)
        _exit(25);
      journal(ready_fd, 'D', keys[n_keys]);
    }
    if (j % 7 == 6 && kc_store_gc(s, (int64_t)time(NULL) + 10, NULL) != KC_OK)
      _exit(26);
    if (j % 3 == 2) {
      kc_store_read *r = NULL;
      const char *json;
      size_t len;
      if (kc_store_read_begin(s, &r) != KC_OK)
        _exit(27);
      kc_store_bundle_get(r, keys[0], &json, &len);
      kc_store_read_end(r);
      if (kc_store_flush(s) != KC_OK)
        _exit(28);
    }
  }
  _exit(0);
}

typedef struct verify_ctx {
  kc_store_read *r;
  size_t n, bad;
  char why[512];
} verify_ctx;

static int verify_cb(const kc_store_bundle_info *info, void *ud) {
  verify_ctx *v = ud;
  char why[512];
  v->n++;
  if (!info->manifest) {
    v->bad++;
    snprintf(v->why, sizeof v->why, "bundle %s: no manifest in listing",
             info->key);
    return 0;
  }
  if (!bundle_blobs_ok(v->r, info->manifest, info->manifest_len, why,
                       sizeof why)) {
    v->bad++;
    memcpy(v->why, why, sizeof why);
  }
  return 0;
}

static size_t check_crashed_store(const char *dir) {
  kc_store *s = open_store(dir, 0, 0, 1);
  OK(kc_store_verify(s, errbuf));
  verify_ctx v;
  memset(&v, 0, sizeof v);
  OK(kc_store_read_begin(s, &v.r));
  OK(kc_store_model_list(s, CRASH_MODEL, verify_cb, &v));
  kc_store_read_end(v.r);
  if (v.bad)
    fail_msg("%zu of %zu bundles incomplete after SIGKILL; first: %s", v.bad,
             v.n, v.why);
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.bundles, v.n);
  kc_store_close(s);
  return v.n;
}

/* What the children said they committed: every bundle whose put returned
 * is there after the kill unless a delete of it began; every bundle whose
 * delete returned is gone. */
#define JR_MAX 20000
typedef struct crash_journal {
  size_t n;
  char keys[JR_MAX][KC_HEX_LEN + 1];
  char state[JR_MAX]; /* 'P' put, 'd' delete begun, 'D' deleted */
} crash_journal;

static void read_journal(int fd, crash_journal *jr) {
  char line[KC_HEX_LEN + 2];
  size_t have = 0;
  for (;;) {
    ssize_t k = read(fd, line + have, sizeof line - have);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      break; /* a torn last line is dropped */
    have += (size_t)k;
    if (have < sizeof line)
      continue;
    have = 0;
    char tag = line[0];
    line[KC_HEX_LEN + 1] = '\0';
    const char *key = line + 1;
    size_t i;
    for (i = 0; i < jr->n; i++)
      if (memcmp(jr->keys[i], key, KC_HEX_LEN) == 0)
        break;
    if (i == jr->n) {
      if (jr->n == JR_MAX)
        continue;
      memcpy(jr->keys[i], key, KC_HEX_LEN);
      jr->keys[i][KC_HEX_LEN] = '\0';
      jr->n++;
    }
    jr->state[i] = tag;
  }
}

static void check_journal(const char *dir, const crash_journal *jr) {
  kc_store *s = open_store(dir, 0, 0, 1);
  for (size_t i = 0; i < jr->n; i++) {
    kc_err e = kc_store_bundle_has(s, jr->keys[i]);
    if (jr->state[i] == 'P' && e != KC_OK)
      fail_msg("bundle %s: put returned KC_OK before the kill, gone after "
               "(%s)", jr->keys[i], kc_err_name(e));
    if (jr->state[i] == 'D' && e != KC_NOT_FOUND)
      fail_msg("bundle %s: delete returned KC_OK before the kill, present "
               "after (%s)", jr->keys[i], kc_err_name(e));
  }
  kc_store_close(s);
}

static void test_crash_sigkill(void **state) {
  fx *f = *state;
  unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
  const char *env = getenv("KC_TEST_SEED");
  if (env)
    seed = (unsigned)strtoul(env, NULL, 10);
  print_message("crash test seed %u (KC_TEST_SEED)\n", seed);
  srand(seed);
  size_t last = 0;
  crash_journal *jr = calloc(1, sizeof *jr);
  assert_non_null(jr);
  for (int round = 0; round < 5; round++) {
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      close(pfd[0]);
      crash_child(f->dir, round, pfd[1]);
    }
    close(pfd[1]);
    char c;
    ssize_t k = read(pfd[0], &c, 1);
    if (k != 1) {
      close(pfd[0]);
      int st;
      waitpid(pid, &st, 0);
      fail_msg("child could not open the store (exit %d)",
               WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
    useconds_t delay = 50000 + (useconds_t)(rand() % 250000);
    usleep(delay);
    kill(pid, SIGKILL);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL))
      fail_msg("child ended by itself before the kill (status %d, exit %d)",
               st, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    read_journal(pfd[0], jr);
    close(pfd[0]);
    last = check_crashed_store(f->dir);
    check_journal(f->dir, jr);
  }
  print_message("crash test: %zu bundles journaled as committed\n", jr->n);
  free(jr);
  print_message("crash test: %zu bundles after 5 kills\n", last);
  assert_true(last > 0);

  /* Accounting did not drift: delete everything, gc, and nothing is left. */
  kc_store *s = open_store(f->dir, 0, 0, 1);
  listing *l = list_model(s, CRASH_MODEL);
  while (l->n > 0) {
    for (size_t i = 0; i < l->n; i++)
      OK(kc_store_bundle_delete(s, l->keys[i], errbuf));
    listing_free(l);
    l = list_model(s, CRASH_MODEL);
  }
  listing_free(l);
  OK(kc_store_gc(s, (int64_t)time(NULL) + 100, errbuf));
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.bundles, 0);
  assert_int_equal(st.blobs, 0);
  assert_int_equal(st.bytes_used, 0);
  kc_store_close(s);
}

/* ======================================================================= */
/* concurrent readers                                                       */

#define CC_PRE 32
#define CC_WRITES 150
#define CC_READERS 3

typedef struct cc_ctx {
  kc_store *s;
  char shared[KC_HEX_LEN + 1];
  char keys[CC_PRE + CC_WRITES][KC_HEX_LEN + 1];
  atomic_size_t published; /* keys[0..published) were committed */
  atomic_int done;
  atomic_size_t reads, found, errors;
  char why[512];
  pthread_mutex_t mu;
} cc_ctx;

static void cc_note(cc_ctx *c, const char *why) {
  pthread_mutex_lock(&c->mu);
  if (atomic_fetch_add(&c->errors, 1) == 0)
    snprintf(c->why, sizeof c->why, "%s", why);
  pthread_mutex_unlock(&c->mu);
}

/* Bundle i: a unique blob (seed 1000+i) plus the shared one. Deletable
 * (odd i < CC_PRE) bundles may vanish; others must stay once published. */
static int cc_put(cc_ctx *c, size_t i) {
  char d[2][KC_HEX_LEN + 1];
  uint64_t sz[2];
  sz[0] = 512 + (i % 13) * 300;
  sz[1] = 2048;
  uint8_t *p = malloc(sz[0]);
  if (!p)
    return -1;
  fill(p, sz[0], 1000 + i);
  kc_sha256_hex(p, sz[0], d[0]);
  strcpy(d[1], c->shared);
  int created;
  kc_err e = kc_store_blob_put(c->s, d[0], p, sz[0], &created, NULL);
  free(p);
  if (e != KC_OK)
    return -1;
  kc_manifest *m = kc_manifest_new();
  strcpy(m->fields.model, M1);
  strcpy(m->fields.build, B1);
  strcpy(m->fields.arch, "sm_90");
  m->fields.bucket.n = 1;
  strcpy(m->fields.bucket.dims[0].name, "seq");
  m->fields.bucket.dims[0].value = i;
  for (size_t k = 0; k < 2; k++) {
    char path[16];
    snprintf(path, sizeof path, "f%zu", k);
    if (kc_manifest_add_file(m, path, d[k], sz[k], KC_KIND_FILE, NULL, 0,
                             NULL) != KC_OK)
      return -1;
  }
  if (kc_manifest_seal(m, NULL) != KC_OK)
    return -1;
  e = kc_store_bundle_put(c->s, m, &created, NULL, NULL, NULL);
  strcpy(c->keys[i], m->key);
  kc_manifest_free(m);
  return e == KC_OK ? 0 : -1;
}

static void *cc_reader(void *arg) {
  cc_ctx *c = arg;
  unsigned rs = (unsigned)(uintptr_t)pthread_self();
  char why[512];
  while (!atomic_load(&c->done)) {
    size_t pub = atomic_load(&c->published);
    kc_store_read *r = NULL;
    if (kc_store_read_begin(c->s, &r) != KC_OK) {
      cc_note(c, "read_begin failed");
      break;
    }
    for (int q = 0; q < 8; q++) {
      size_t i = (size_t)rand_r(&rs) % pub;
      const char *json;
      size_t len;
      kc_err e = kc_store_bundle_get(r, c->keys[i], &json, &len);
      atomic_fetch_add(&c->reads, 1);
      int deletable = i < CC_PRE && (i % 2);
      if (e == KC_NOT_FOUND && deletable)
        continue;
      if (e != KC_OK) {
        snprintf(why, sizeof why, "bundle %zu (published) get: %s", i,
                 kc_err_name(e));
        cc_note(c, why);
        continue;
      }
      atomic_fetch_add(&c->found, 1);
      if (!bundle_blobs_ok(r, json, len, why, sizeof why))
        cc_note(c, why);
    }
    kc_store_read_end(r);
  }
  return NULL;
}

static void test_concurrent_readers(void **state) {
  fx *f = *state;
  cc_ctx *c = calloc(1, sizeof *c);
  assert_non_null(c);
  pthread_mutex_init(&c->mu, NULL);
  c->s = open_store(f->dir, 0, 0, 1);
  put_seed(c->s, 2048, 999, c->shared);
  for (size_t i = 0; i < CC_PRE; i++)
    assert_int_equal(cc_put(c, i), 0);
  atomic_store(&c->published, CC_PRE);
  pthread_t th[CC_READERS];
  for (int t = 0; t < CC_READERS; t++)
    assert_int_equal(pthread_create(&th[t], NULL, cc_reader, c), 0);
  /* The writer: new bundles, deletes of odd pre-made ones with gc (their
   * blobs really go), flushes of the readers' hits. */
  int wfail = 0;
  for (size_t i = CC_PRE; i < CC_PRE + CC_WRITES && !wfail; i++) {
    if (cc_put(c, i) != 0)
      wfail = 1;
    atomic_store(&c->published, i + 1);
    size_t del = (i - CC_PRE) * 2 + 1;
    if (del < CC_PRE) {
      if (kc_store_bundle_delete(c->s, c->keys[del], NULL) != KC_OK)
        wfail = 2;
      if (kc_store_gc(c->s, (int64_t)time(NULL) + 100, NULL) != KC_OK)
        wfail = 3;
    }
    if (i % 10 == 0 && kc_store_flush(c->s) != KC_OK)
      wfail = 4;
  }
  usleep(100000);
  atomic_store(&c->done, 1);
  for (int t = 0; t < CC_READERS; t++)
    pthread_join(th[t], NULL);
  print_message("concurrent: %zu reads, %zu found, %zu errors\n",
                atomic_load(&c->reads), atomic_load(&c->found),
                atomic_load(&c->errors));
  if (wfail)
    fail_msg("writer failed at step %d", wfail);
  if (atomic_load(&c->errors))
    fail_msg("%zu inconsistent reads; first: %s", atomic_load(&c->errors),
             c->why);
  assert_true(atomic_load(&c->found) > 100);
  kc_store_stats st = get_stats(c->s);
  assert_int_equal(st.bundles, CC_PRE + CC_WRITES - CC_PRE / 2);
  assert_int_equal(st.hits, atomic_load(&c->found));
  OK(kc_store_verify(c->s, errbuf));
  kc_store_close(c->s);
  pthread_mutex_destroy(&c->mu);
  free(c);
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

/* Writers on several threads: puts, uploads and deletes serialize; the
 * counts and bytes agree at the end. */
#define CW_THREADS 3
#define CW_EACH 40

typedef struct cw_arg {
  kc_store *s;
  int t;
  int fail;
  char why[KC_ERRBUF_SIZE + 64];
} cw_arg;

static void *cw_main(void *p) {
  cw_arg *a = p;
  char e[KC_ERRBUF_SIZE];
  uint8_t *buf = malloc(8192);
  for (int i = 0; i < CW_EACH && !a->fail && buf; i++) {
    size_t n = 1000 + (size_t)(a->t * 37 + i * 101) % 7000;
    char hex[KC_HEX_LEN + 1];
    fill(buf, n, (uint64_t)(a->t * 1000 + i) + 300000);
    kc_sha256_hex(buf, n, hex);
    int created;
    kc_err rc;
    if (i % 2) {
      rc = kc_store_blob_put(a->s, hex, buf, n, &created, e);
    } else {
      kc_store_upload *u = NULL;
      rc = kc_store_upload_begin(a->s, &u, e);
      if (!rc)
        rc = kc_store_upload_write(u, buf, n, e);
      if (!rc)
        rc = kc_store_upload_commit(u, hex, &created, e);
      else
        kc_store_upload_abort(u);
    }
    if (!rc) {
      kc_manifest *m = kc_manifest_new();
      strcpy(m->fields.model, M2);
      strcpy(m->fields.build, B1);
      strcpy(m->fields.arch, "sm_100a");
      m->fields.bucket.n = 1;
      strcpy(m->fields.bucket.dims[0].name, "t");
      m->fields.bucket.dims[0].value = (uint64_t)(a->t * 1000 + i);
      rc = kc_manifest_add_file(m, "x.cubin", hex, n, KC_KIND_CUBIN, NULL, 0,
                                e);
      if (!rc)
        rc = kc_manifest_seal(m, e);
      if (!rc)
        rc = kc_store_bundle_put(a->s, m, &created, NULL, NULL, e);
      /* Every fourth one is deleted again. */
      if (!rc && i % 4 == 3)
        rc = kc_store_bundle_delete(a->s, m->key, e);
      kc_manifest_free(m);
    }
    if (rc) {
      a->fail = 1;
      snprintf(a->why, sizeof a->why, "thread %d step %d: %s (%s)", a->t, i,
               kc_err_name(rc), e);
    }
  }
  free(buf);
  return NULL;
}

static void test_concurrent_writers(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 3600);
  pthread_t th[CW_THREADS];
  cw_arg args[CW_THREADS];
  memset(args, 0, sizeof args);
  for (int t = 0; t < CW_THREADS; t++) {
    args[t].s = s;
    args[t].t = t;
    assert_int_equal(pthread_create(&th[t], NULL, cw_main, &args[t]), 0);
  }
  for (int t = 0; t < CW_THREADS; t++)
    pthread_join(th[t], NULL);
  for (int t = 0; t < CW_THREADS; t++)
    if (args[t].fail)
      fail_msg("%s", args[t].why);
  uint64_t bytes = 0;
  for (int t = 0; t < CW_THREADS; t++)
    for (int i = 0; i < CW_EACH; i++)
      bytes += 1000 + (uint64_t)(t * 37 + i * 101) % 7000;
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.bundles, CW_THREADS * CW_EACH * 3 / 4);
  assert_int_equal(st.blobs, CW_THREADS * CW_EACH);
  assert_int_equal(blob_bytes(s), bytes);
  listing *l = list_model(s, M2);
  assert_int_equal(l->n, CW_THREADS * CW_EACH * 3 / 4);
  listing_free(l);
  OK(kc_store_verify(s, errbuf));
  /* The deleted bundles' blobs are orphans: gc takes exactly those. */
  OK(kc_store_gc(s, (int64_t)time(NULL) + 3601, errbuf));
  st = get_stats(s);
  assert_int_equal(st.gc_blobs, CW_THREADS * CW_EACH / 4);
  assert_int_equal(st.blobs, CW_THREADS * CW_EACH * 3 / 4);
  kc_store_close(s);
}

/* A read handle begun on one thread and used on another (MDB_NOTLS). */
typedef struct handoff {
  kc_store_read *r;
  const char *key;
  kc_err e;
  size_t len;
} handoff;

static void *handoff_main(void *arg) {
  handoff *h = arg;
  const char *json;
  h->e = kc_store_bundle_get(h->r, h->key, &json, &h->len);
  return NULL;
}

static void test_read_handle_moves_threads(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  kc_manifest *m = bundle_with_blob(s, M1, 1, 100, 140, NULL, 0, NULL);
  char *want = manifest_json(m);
  handoff h = {NULL, m->key, KC_INTERNAL, 0};
  OK(kc_store_read_begin(s, &h.r));
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, handoff_main, &h), 0);
  pthread_join(t, NULL);
  assert_int_equal(h.e, KC_OK);
  assert_int_equal(h.len, strlen(want));
  /* Meanwhile a write commits; the open read still works. */
  kc_manifest *m2 = bundle_with_blob(s, M1, 2, 100, 141, NULL, 0, NULL);
  const char *json;
  size_t len;
  OK(kc_store_bundle_get(h.r, m->key, &json, &len));
  /* Snapshot: a bundle committed after the read began is not visible. */
  EXPECT(kc_store_bundle_get(h.r, m2->key, &json, &len), KC_NOT_FOUND);
  kc_store_read_end(h.r);
  expect_bundle_json(s, m->key, want);
  free(want);
  kc_manifest_free(m);
  kc_manifest_free(m2);
  kc_store_close(s);
}

/* ======================================================================= */
/* large blobs                                                              */

/* 256 MiB and a bit, from a sparse file through kc_store_blob_put_fd, read
 * back zero-copy and re-hashed; then 48 MiB of non-zero bytes through a
 * streaming upload. Slow-ish (hashes ~700 MiB): a few seconds, ~3x under
 * ASan. Memory: the blob is never in heap (the map and page cache hold it). */
static void test_large_blob_256mib(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  const uint64_t n = (256ull << 20) + 7;
  char *path = path_join(f->tmp, "big.bin");
  int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0600);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, (off_t)n), 0);
  /* A few non-zero bytes so that the content is not trivially zeros. */
  assert_int_equal(pwrite(fd, "head", 4, 0), 4);
  assert_int_equal(pwrite(fd, "mid", 3, (off_t)(n / 2)), 3);
  assert_int_equal(pwrite(fd, "tail", 4, (off_t)(n - 4)), 4);
  char hex[KC_HEX_LEN + 1];
  uint64_t fsize = 0;
  OK(kc_sha256_file(path, hex, &fsize, errbuf));
  assert_int_equal(fsize, n);
  int created = -1;
  assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
  OK(kc_store_blob_put_fd(s, hex, fd, n, &created, errbuf));
  assert_int_equal(created, 1);
  close(fd);
  unlink(path);
  uint64_t size = 0;
  OK(kc_store_blob_has(s, hex, &size));
  assert_int_equal(size, n);
  kc_store_read *r = NULL;
  const void *data = NULL;
  size_t len = 0;
  char back[KC_HEX_LEN + 1];
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_blob_get(r, hex, &data, &len));
  assert_int_equal(len, n);
  assert_memory_equal((const char *)data + n - 4, "tail", 4);
  assert_int_equal(kc_sha256_hex(data, len, back), KC_OK);
  assert_string_equal(back, hex);
  kc_store_read_end(r);
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.bytes_used, n);

  /* 48 MiB through the streaming upload in 1 MiB pieces. */
  const size_t chunk = 1 << 20, pieces = 48;
  uint8_t *p = malloc(chunk);
  assert_non_null(p);
  kc_sha256 *h = kc_sha256_new();
  assert_non_null(h);
  kc_store_upload *u = NULL;
  OK(kc_store_upload_begin(s, &u, errbuf));
  for (size_t i = 0; i < pieces; i++) {
    fill(p, chunk, 2000 + i);
    assert_int_equal(kc_sha256_update(h, p, chunk), KC_OK);
    OK(kc_store_upload_write(u, p, chunk, errbuf));
  }
  char uhex[KC_HEX_LEN + 1];
  assert_int_equal(kc_sha256_final(h, uhex), KC_OK);
  kc_sha256_free(h);
  assert_int_equal(kc_store_upload_size(u), chunk * pieces);
  OK(kc_store_upload_commit(u, uhex, &created, errbuf));
  assert_int_equal(created, 1);
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_blob_get(r, uhex, &data, &len));
  assert_int_equal(len, chunk * pieces);
  fill(p, chunk, 2000 + 17);
  assert_memory_equal((const uint8_t *)data + 17 * chunk, p, chunk);
  kc_store_read_end(r);

  /* A bundle over both, and verify re-hashes them. */
  char d[2][KC_HEX_LEN + 1];
  strcpy(d[0], hex);
  strcpy(d[1], uhex);
  uint64_t sz[2] = {n, chunk * pieces};
  kc_manifest *m = make_manifest(M1, 1, 2, d, sz);
  put_bundle(s, m, 1);
  listing *l = list_model(s, M1);
  assert_int_equal(l->n, 1);
  assert_int_equal(l->bytes[0], n + chunk * pieces);
  listing_free(l);
  OK(kc_store_verify(s, errbuf));
  kc_manifest_free(m);
  free(p);
  free(path);
  kc_store_close(s);
}

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
 * a rotted blob with exactly the bundles naming it; the store verifies after. */
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
  assert_true(flip_pattern_in_dir(f->dir, (const uint8_t *)json,
                                  strlen(json)) >= 1);
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

/* ======================================================================= */
/* bad input                                                                */

static void test_bad_digests(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  char good[KC_HEX_LEN + 1];
  uint8_t *p = make_bytes(100, 160, good);
  char upper[KC_HEX_LEN + 1];
  strcpy(upper, good);
  for (char *c = upper; *c; c++)
    if (*c >= 'a' && *c <= 'f')
      *c = (char)(*c - 'a' + 'A');
  char longer[KC_HEX_LEN + 2];
  snprintf(longer, sizeof longer, "%s0", good);
  char shorter[KC_HEX_LEN];
  memcpy(shorter, good, KC_HEX_LEN - 1);
  shorter[KC_HEX_LEN - 1] = '\0';
  char nonhex[KC_HEX_LEN + 1];
  strcpy(nonhex, good);
  nonhex[10] = 'g';
  char traversal[KC_HEX_LEN + 1];
  memset(traversal, 'a', KC_HEX_LEN);
  memcpy(traversal, "../../../../etc/passwd", 22);
  traversal[KC_HEX_LEN] = '\0';
  const char *bad[] = {upper, longer, shorter, nonhex, traversal, "", "0"};
  int created = -1;
  uint64_t size;
  kc_store_read *r = NULL;
  const void *data;
  const char *json;
  size_t len;
  int pfd[2];
  assert_int_equal(pipe(pfd), 0);
  write_all(pfd[1], p, 100);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *b = bad[i];
    EXPECT_IN(kc_store_blob_put(s, b, p, 100, &created, errbuf),
              KC_BAD_DIGEST, KC_EINVAL);
    EXPECT_IN(kc_store_blob_put_fd(s, b, pfd[0], 0, &created, errbuf),
              KC_BAD_DIGEST, KC_EINVAL);
    EXPECT_IN(kc_store_blob_has(s, b, &size), KC_BAD_DIGEST, KC_EINVAL);
    EXPECT_IN(kc_store_bundle_has(s, b), KC_BAD_DIGEST, KC_EINVAL,
              KC_BAD_KEY);
    EXPECT_IN(kc_store_bundle_delete(s, b, errbuf), KC_BAD_DIGEST, KC_EINVAL,
              KC_BAD_KEY);
    OK(kc_store_read_begin(s, &r));
    EXPECT_IN(kc_store_blob_get(r, b, &data, &len), KC_BAD_DIGEST,
              KC_EINVAL);
    EXPECT_IN(kc_store_bundle_get(r, b, &json, &len), KC_BAD_DIGEST,
              KC_EINVAL, KC_BAD_KEY);
    kc_store_read_end(r);
    kc_store_upload *u = NULL;
    OK(kc_store_upload_begin(s, &u, errbuf));
    OK(kc_store_upload_write(u, p, 100, errbuf));
    EXPECT_IN(kc_store_upload_commit(u, b, &created, errbuf), KC_BAD_DIGEST,
              KC_EINVAL);
  }
  close(pfd[0]);
  close(pfd[1]);
  /* Bad-digest lookups are not misses of a bundle either way; nothing was
   * stored. */
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.blobs, 0);
  assert_int_equal(st.hits, 0);
  /* The good one still works. */
  OK(kc_store_blob_put(s, good, p, 100, &created, errbuf));
  OK(kc_store_blob_has(s, good, &size));
  assert_int_equal(size, 100);
  free(p);
  kc_store_close(s);
}

/* 1 if name matches one of the comma-separated globs in list. */
static int name_matches(const char *list, const char *name) {
  char *copy = strdup(list), *save = NULL;
  int hit = 0;
  for (char *g = strtok_r(copy, ",", &save); g && !hit;
       g = strtok_r(NULL, ",", &save))
    hit = fnmatch(g, name, 0) == 0;
  free(copy);
  return hit;
}

/* ---- the durable tier with S3 unreachable (the Ceph-backed cases are in
 * test_scaleout) ---- */

static kc_store *open_unreachable_tier(const char *dir, uint64_t max_bytes) {
  kc_store_s3 s3 = {.endpoint = "http://127.0.0.1:1", .bucket = "kcache-test",
                    .path_style = 1, .access_key = "AK", .secret_key = "SK"};
  kc_store_opts o = {.dir = dir, .max_bytes = max_bytes, .s3 = &s3};
  kc_store *s = NULL;
  OK(kc_store_open(&o, &s, errbuf)); /* S3 is not contacted to open */
  return s;
}

static uint64_t queue_depth(kc_store *s) {
  kc_store_tier_stats t;
  OK(kc_store_tier_stats_get(s, &t));
  assert_int_equal(t.enabled, 1);
  return t.queue_depth;
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
  signal(SIGPIPE, SIG_IGN);
  kc_store_global_init();
#define T(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)
  const struct CMUnitTest tests[] = {
      T(test_open_creates_dir_and_empty_stats),
      T(test_open_bad),
      T(test_blob_roundtrip),
      T(test_blob_empty),
      T(test_blob_digest_mismatch),
      T(test_blob_put_fd_file),
      T(test_blob_put_fd_pipe),
      T(test_upload_stream),
      T(test_bundle_roundtrip),
      T(test_bundle_write_once),
      T(test_bundle_missing_blobs),
      T(test_bundle_invalid),
      T(test_delete_refcount_gc),
      T(test_refcount_same_blob_twice),
      T(test_gc_unreferenced_upload),
      T(test_model_list),
      T(test_stats_hits_misses),
      T(test_reads_do_not_write),
      T(test_eviction_lru_order),
      T(test_eviction_unreferenced_blobs),
      T(test_eviction_sees_unflushed_reads),
      T(test_blob_larger_than_limit),
      T(test_map_full_and_recovery),
      T(test_map_full_answer_consistent),
      T(test_close_reopen),
      T(test_reopen_smaller_map),
      T(test_crash_sigkill),
      T(test_concurrent_readers),
      T(test_concurrent_writers),
      T(test_read_handle_moves_threads),
      T(test_bundle_size_mismatch),
      T(test_large_blob_256mib),
      T(test_verify_detects_corruption),
      T(test_scrub_removes_rotted),
      T(test_delete_damaged_manifest),
      T(test_eviction_spares_offered_blob),
      T(test_bad_digests),
      T(test_tier_queue_when_s3_down),
  };
#undef T
  /* KC_TEST_FILTER / KC_TEST_SKIP: comma-separated globs of test names. */
  const char *only = getenv("KC_TEST_FILTER"), *skip = getenv("KC_TEST_SKIP");
  struct CMUnitTest chosen[sizeof tests / sizeof tests[0]];
  size_t n = 0;
  for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
    if ((!only || name_matches(only, tests[i].name)) &&
        !(skip && name_matches(skip, tests[i].name)))
      chosen[n++] = tests[i];
  return _cmocka_run_group_tests("store", chosen, n, NULL, NULL);
}
