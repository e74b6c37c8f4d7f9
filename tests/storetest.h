/* storetest.h: what the store/ unit tests (test_store_*.c) share: a fresh
 * temporary directory per test (the fixture), kc_err assertions, bytes from a
 * seed, manifests, bundles, model listings, and the runner that honours
 * KC_TEST_FILTER / KC_TEST_SKIP (comma-separated globs of test names).
 *
 * Written from kc_store.h, independently of the implementation.
 * Every helper fails the current cmocka test on an unexpected error; what a
 * helper returns (a store, a manifest, a JSON string, a listing) belongs to
 * the caller. Tests run one at a time (the globals below are not locked). */
#ifndef KC_STORETEST_H
#define KC_STORETEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

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

/* The error text of the last call made through EXPECT / OK (and of the
 * helpers below). */
extern char errbuf[KC_ERRBUF_SIZE];

/* ---- assertions ---- */

void check_err_at(kc_err got, kc_err want, const char *what, const char *file,
                  int line);
/* Runs call with a cleared errbuf; fails unless it returns want. */
#define EXPECT(call, want)                                                     \
  do {                                                                         \
    errbuf[0] = '\0';                                                          \
    check_err_at((call), (want), #call, __FILE__, __LINE__);                   \
  } while (0)
#define OK(call) EXPECT(call, KC_OK)

/* Fails unless got is one of the listed codes (ambiguous spec corners). */
void check_err_in_at(kc_err got, const kc_err *want, size_t n, const char *what,
                     const char *file, int line);
#define EXPECT_IN(call, ...)                                                   \
  do {                                                                         \
    const kc_err want_[] = {__VA_ARGS__};                                      \
    errbuf[0] = '\0';                                                          \
    check_err_in_at((call), want_, sizeof want_ / sizeof want_[0], #call,      \
                    __FILE__, __LINE__);                                       \
  } while (0)

/* ---- fixture: a temporary directory ---- */

typedef struct fx {
  char *tmp; /* mkdtemp'd, removed after the test */
  char *dir; /* tmp/store, created */
} fx;

int fx_setup(void **state);
int fx_teardown(void **state);
/* A test with the fixture, for the tests[] array handed to storetest_run. */
#define ST(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)
/* Ignores SIGPIPE, calls kc_store_global_init, runs the tests that
 * KC_TEST_FILTER and KC_TEST_SKIP leave. main's return value. */
int storetest_run(const char *group, const struct CMUnitTest *tests, size_t n);

/* ---- helpers ---- */

/* "a/b", malloc'd. */
char *path_join(const char *a, const char *b);
/* Opens (creating) the store o describes. */
kc_store *open_with(const kc_store_opts *o);
/* Opens (creating) the store in dir; 0 for a limit means the default. */
kc_store *open_store(const char *dir, uint64_t max_bytes, uint64_t map_size,
                     uint64_t grace_s);
/* Deterministic bytes from a seed (xorshift64). */
void fill(uint8_t *p, size_t n, uint64_t seed);
/* n such bytes, malloc'd; writes their digest. */
uint8_t *make_bytes(size_t n, uint64_t seed, char hex[KC_HEX_LEN + 1]);
/* Stores n bytes made from seed (must be new); writes their digest. */
void put_seed(kc_store *s, size_t n, uint64_t seed, char hex[KC_HEX_LEN + 1]);
int blob_present(kc_store *s, const char *hex);
int bundle_present(kc_store *s, const char *key);
/* A manifest of model, build B1, arch sm_90a, bucket {"batch": bucket} and
 * tool cuda 13.0, without files, not sealed. */
kc_manifest *manifest_base(const char *model, uint64_t bucket);
/* A sealed manifest of model, bucket {"batch": bucket}, with one file per
 * digest (path f<i>.cubin). */
kc_manifest *make_manifest(const char *model, uint64_t bucket, size_t n,
                           char digests[][KC_HEX_LEN + 1],
                           const uint64_t *sizes);
char *manifest_json(const kc_manifest *m);
void put_bundle(kc_store *s, const kc_manifest *m, int want_created);
/* Stores a bundle of one unique blob (size bytes, seed) plus the extra
 * digest given (may be NULL); writes its key and the unique blob's digest
 * (blob may be NULL). */
kc_manifest *bundle_with_blob(kc_store *s, const char *model, uint64_t bucket,
                              size_t size, uint64_t seed, const char *extra,
                              uint64_t extra_size, char blob[KC_HEX_LEN + 1]);
/* Compares the JSON a read returns for key with want. */
void expect_bundle_json(kc_store *s, const char *key, const char *want);
/* 1 when every file of the manifest in json is held with its bytes, else 0
 * with why written. */
int bundle_blobs_ok(kc_store_read *r, const char *json, size_t len, char *why,
                    size_t whylen);
/* Writes all n bytes to fd, retrying short writes and EINTR. */
void write_all(int fd, const void *p, size_t n);
/* Regular files under dir, recursively (temporary upload files show up). */
size_t count_files(const char *dir);
kc_store_stats get_stats(kc_store *s);
/* The durable tier's queue depth (the tier must be enabled). */
uint64_t queue_depth(kc_store *s);
/* bytes_used less the manifests of the test models: the blobs' bytes. */
uint64_t blob_bytes(kc_store *s);

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

/* A kc_store_model_list callback that fills a listing. */
int list_cb(const kc_store_bundle_info *info, void *ud);
void listing_free(listing *l);
listing *list_model(kc_store *s, const char *model);
/* The index of key in l, -1 when absent. */
ssize_t listing_find(const listing *l, const char *key);

#endif
