/* storetest.c: the fixtures and helpers of the store/ unit tests (see
 * storetest.h). */
#include <errno.h>
#include <fnmatch.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storetest.h"

char errbuf[KC_ERRBUF_SIZE];

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

void check_err_at(kc_err got, kc_err want, const char *what, const char *file,
                  int line) {
  if (got == want)
    return;
  print_error("%s:%d: %s\n    got %s (%s), want %s\n", file, line, what,
              kc_err_name(got), errbuf, kc_err_name(want));
  _fail(file, line);
}

/* Fails unless got is one of the listed codes (ambiguous spec corners). */
void check_err_in_at(kc_err got, const kc_err *want, size_t n, const char *what,
                     const char *file, int line) {
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

/* ---- fixture: a temporary directory ---- */

static int rm_entry(const char *p, const struct stat *st, int flag,
                    struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(p);
}

char *path_join(const char *a, const char *b) {
  size_t n = strlen(a) + strlen(b) + 2;
  char *p = malloc(n);
  assert_non_null(p);
  snprintf(p, n, "%s/%s", a, b);
  return p;
}

int fx_setup(void **state) {
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

int fx_teardown(void **state) {
  fx *f = *state;
  int rc = nftw(f->tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  free(f->dir);
  free(f->tmp);
  free(f);
  return rc;
}

/* ---- helpers ---- */

kc_store *open_with(const kc_store_opts *o) {
  kc_store *s = NULL;
  OK(kc_store_open(o, &s, errbuf));
  assert_non_null(s);
  return s;
}

kc_store *open_store(const char *dir, uint64_t max_bytes, uint64_t map_size,
                     uint64_t grace_s) {
  kc_store_opts o = {.dir = dir,
                     .max_bytes = max_bytes,
                     .map_size = map_size,
                     .grace_s = grace_s};
  return open_with(&o);
}

/* Deterministic bytes from a seed (xorshift64). */
void fill(uint8_t *p, size_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 0x1234567ULL;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = (uint8_t)(x >> 24);
  }
}

uint8_t *make_bytes(size_t n, uint64_t seed, char hex[KC_HEX_LEN + 1]) {
  uint8_t *p = malloc(n ? n : 1);
  assert_non_null(p);
  fill(p, n, seed);
  assert_int_equal(kc_sha256_hex(p, n, hex), KC_OK);
  return p;
}

/* Stores n bytes made from seed; writes their digest. */
void put_seed(kc_store *s, size_t n, uint64_t seed, char hex[KC_HEX_LEN + 1]) {
  uint8_t *p = make_bytes(n, seed, hex);
  int created = -1;
  OK(kc_store_blob_put(s, hex, p, n, &created, errbuf));
  assert_int_equal(created, 1);
  free(p);
}

int blob_present(kc_store *s, const char *hex) {
  kc_err e = kc_store_blob_has(s, hex, NULL);
  assert_true(e == KC_OK || e == KC_NOT_FOUND);
  return e == KC_OK;
}

int bundle_present(kc_store *s, const char *key) {
  kc_err e = kc_store_bundle_has(s, key);
  assert_true(e == KC_OK || e == KC_NOT_FOUND);
  return e == KC_OK;
}

kc_manifest *manifest_base(const char *model, uint64_t bucket) {
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
  return m;
}

/* A sealed manifest of model, bucket {"batch": bucket}, with one file per
 * digest (path f<i>.cubin). */
kc_manifest *make_manifest(const char *model, uint64_t bucket, size_t n,
                           char digests[][KC_HEX_LEN + 1],
                           const uint64_t *sizes) {
  kc_manifest *m = manifest_base(model, bucket);
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

char *manifest_json(const kc_manifest *m) {
  char *j = NULL;
  OK(kc_manifest_to_json(m, &j, errbuf));
  assert_non_null(j);
  return j;
}

void put_bundle(kc_store *s, const kc_manifest *m, int want_created) {
  int created = -1;
  OK(kc_store_bundle_put(s, m, &created, NULL, NULL, errbuf));
  assert_int_equal(created, want_created);
}

/* Stores a bundle of one unique blob (size bytes, seed) plus the extra
 * digests given; writes its key and the unique blob's digest. */
kc_manifest *bundle_with_blob(kc_store *s, const char *model, uint64_t bucket,
                              size_t size, uint64_t seed, const char *extra,
                              uint64_t extra_size, char blob[KC_HEX_LEN + 1]) {
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
void expect_bundle_json(kc_store *s, const char *key, const char *want) {
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
int bundle_blobs_ok(kc_store_read *r, const char *json, size_t len, char *why,
                    size_t whylen) {
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

int list_cb(const kc_store_bundle_info *info, void *ud) {
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

void listing_free(listing *l) {
  for (size_t i = 0; i < l->n; i++)
    free(l->manifest[i]);
  free(l);
}

listing *list_model(kc_store *s, const char *model) {
  listing *l = calloc(1, sizeof *l);
  assert_non_null(l);
  OK(kc_store_model_list(s, model, list_cb, l));
  return l;
}

ssize_t listing_find(const listing *l, const char *key) {
  for (size_t i = 0; i < l->n; i++)
    if (strcmp(l->keys[i], key) == 0)
      return (ssize_t)i;
  return -1;
}

/* Writes all n bytes to fd (retrying short writes). */
void write_all(int fd, const void *p, size_t n) {
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
size_t count_files(const char *dir) {
  g_file_count = 0;
  assert_int_equal(nftw(dir, count_files_cb, 16, FTW_PHYS), 0);
  return g_file_count;
}

kc_store_stats get_stats(kc_store *s) {
  kc_store_stats st;
  memset(&st, 0xab, sizeof st);
  OK(kc_store_stats_get(s, &st));
  return st;
}

uint64_t queue_depth(kc_store *s) {
  kc_store_tier_stats t;
  OK(kc_store_tier_stats_get(s, &t));
  assert_int_equal(t.enabled, 1);
  return t.queue_depth;
}

static int manifest_len_cb(const kc_store_bundle_info *info, void *ud) {
  *(uint64_t *)ud += info->manifest_len;
  return 0;
}

/* Bytes used less the manifests (bytes used counts both): the blobs' bytes.
 * Every test stores its bundles under these models. */
uint64_t blob_bytes(kc_store *s) {
  kc_store_stats st;
  OK(kc_store_stats_get(s, &st));
  uint64_t manifests = 0;
  const char *models[] = {M1, M2, MA0, MA1};
  for (size_t i = 0; i < 4; i++)
    OK(kc_store_model_list(s, models[i], manifest_len_cb, &manifests));
  return st.bytes_used - manifests;
}

static int name_matches(const char *list, const char *name) {
  char *copy = strdup(list), *save = NULL;
  int hit = 0;
  for (char *g = strtok_r(copy, ",", &save); g && !hit;
       g = strtok_r(NULL, ",", &save))
    hit = fnmatch(g, name, 0) == 0;
  free(copy);
  return hit;
}

/* Ignores SIGPIPE, calls kc_store_global_init, runs the tests that
 * KC_TEST_FILTER and KC_TEST_SKIP leave. */
int storetest_run(const char *group, const struct CMUnitTest *tests, size_t n) {
  signal(SIGPIPE, SIG_IGN);
  kc_store_global_init();
  const char *only = getenv("KC_TEST_FILTER"), *skip = getenv("KC_TEST_SKIP");
  struct CMUnitTest *chosen = calloc(n ? n : 1, sizeof *chosen);
  assert_non_null(chosen);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if ((!only || name_matches(only, tests[i].name)) &&
        !(skip && name_matches(skip, tests[i].name)))
      chosen[k++] = tests[i];
  int rc = _cmocka_run_group_tests(group, chosen, k, NULL, NULL);
  free(chosen);
  return rc;
}
