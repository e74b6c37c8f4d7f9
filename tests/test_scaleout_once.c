/* test_scaleout_once.c: write-once across replicas (docs/DESIGN.md, Scale-out):
 * two kcached replicas over one bucket of a real
 * single-node Ceph RGW (tests/testrgw.h). One key names one manifest for
 * the whole fleet, and the bucket decides which.
 *
 * Cases (each with its own --s3-prefix):
 *   refused: A stores bundles K and K2 and drains into the bucket. B,
 *            which never saw K, is offered a different manifest for it:
 *            409 conflict, and B serves A's manifest and blobs at once;
 *            the bucket keeps A's. B offered A's very manifest of K2: 200,
 *            "created": false, as on A
 *   race:    A stores K and drains; radosgw stopped; B (cut off from the
 *            bucket) accepts a different manifest for K with 201 and serves
 *            it; radosgw back: B's queue meets A's copy (412), and within a
 *            few seconds of its drain B serves A's manifest and blobs,
 *            counts the replacement and logs it; the bucket keeps A's
 * Old code (before this): B answered 201 in both and went on serving its
 * own manifest.
 *
 * Exit 77 (ctest: skipped) where the Ceph packages cannot be installed,
 * unless CI=true; KC_TEST_S3_ENV=FILE uses a running RGW (testrgw.h).
 * Timing: RGW start ~7 s; the cases ~20 s (the race waits for B's queue
 * backoff after radosgw comes back).
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <jansson.h>

#include "kc_schema.h"
#include "kcs3.h"
#include "testrgw.h"
#include "testsrv.h"

#define DRAIN_MS 60000 /* the queue's backoff tops out at 30 s */
#define SETTLE_MS 5000 /* after B's queue drained: B serves the bucket's */

static kc_testrgw_pair P; /* the RGW, the bucket, the replicas A and B */

#define REQUIRE(cond, ...) KC_TESTRGW_REQUIRE(&P, cond, __VA_ARGS__)

/* ---- HTTP (kc_testsrv_http) ---- */

typedef kc_testsrv_resp reply;

/* One request on a fresh handle; status is 0 unless the transfer completed. */
static reply call(const char *base, const char *method, const char *path,
                  const void *body, size_t len) {
  reply r = kc_testsrv_http(
      NULL, base, path,
      (kc_testsrv_req){.method = method, .body = body, .len = len});
  if (r.rc != CURLE_OK)
    r.status = 0;
  return r;
}

/* A member of a JSON reply's top-level object, as text ("" when absent; a
 * boolean as "true"/"false"). */
static const char *member(const reply *r, const char *name, char out[64]) {
  json_t *j = r->body ? json_loadb(r->body, r->len, 0, NULL) : NULL;
  json_t *v = json_object_get(j, name);
  snprintf(out, 64, "%s",
           json_is_string(v)  ? json_string_value(v)
           : json_is_true(v)  ? "true"
           : json_is_false(v) ? "false"
                              : "");
  json_decref(j);
  return out;
}

#define REFUSED "kcached_s3_write_once_conflicts_total{outcome=\"refused\"}"
#define REPLACED "kcached_s3_write_once_conflicts_total{outcome=\"replaced\"}"

/* Waits until the replica's write-through queue is empty. */
static void drain(const kc_testsrv *t, const char *name) {
  double depth = -1;
  REQUIRE(kc_testsrv_drain(t, DRAIN_MS, &depth) >= 0,
          "replica %s: kcached_s3_queue_depth still %g after %d ms", name,
          depth, DRAIN_MS);
}

/* ---- bundles ---- */

#define NFILES 2

typedef struct bundle {
  char key[65];
  char *json; /* canonical manifest */
  char digest[NFILES][65];
  size_t size[NFILES];
  uint64_t seed[NFILES]; /* the bytes: kc_testsrv_bytes(seed, size) */
} bundle;

/* A bundle whose key depends on `seq` alone and whose kernels (two files)
 * on `variant` too: two variants of one seq are two different manifests
 * for one key, as two builders with different compilers would make. */
static void bundle_make(bundle *b, unsigned seq, unsigned variant) {
  memset(b, 0, sizeof *b);
  kc_manifest *m = kc_manifest_new();
  char err[KC_ERRBUF_SIZE] = "";
  assert_non_null(m);
  kc_key_fields *f = &m->fields;
  kc_sha256_hex("once-model", 10, f->model);
  kc_sha256_hex("once build", 10, f->build);
  snprintf(f->arch, sizeof f->arch, "sm_90");
  f->bucket.n = 1;
  snprintf(f->bucket.dims[0].name, sizeof f->bucket.dims[0].name, "seq");
  f->bucket.dims[0].value = seq;
  assert_int_equal(kc_key_set_tool(f, "nvrtc", "13.0", err), KC_OK);
  for (size_t i = 0; i < NFILES; i++) {
    b->size[i] = 3000 + 1000 * i + variant;
    b->seed[i] = (uint64_t)seq * 1000 + variant * 10 + i;
    unsigned char *bytes = kc_testsrv_bytes(b->seed[i], b->size[i]);
    kc_sha256_hex(bytes, b->size[i], b->digest[i]);
    free(bytes);
    char path[40];
    snprintf(path, sizeof path, "lib/part%zu.cubin", i);
    const char *entry = "kern";
    assert_int_equal(kc_manifest_add_file(m, path, b->digest[i], b->size[i],
                                          KC_KIND_CUBIN, &entry, 1, err),
                     KC_OK);
  }
  assert_int_equal(kc_manifest_seal(m, err), KC_OK);
  assert_int_equal(kc_manifest_to_json(m, &b->json, err), KC_OK);
  memcpy(b->key, m->key, 65);
  kc_manifest_free(m);
}

/* PUTs the blobs (each must be taken), then the manifest: its reply. */
static reply bundle_put(const kc_testsrv *t, const bundle *b) {
  char path[128];
  for (size_t i = 0; i < NFILES; i++) {
    unsigned char *bytes = kc_testsrv_bytes(b->seed[i], b->size[i]);
    snprintf(path, sizeof path, "/v1/blobs/%s", b->digest[i]);
    reply r = call(t->url, "PUT", path, bytes, b->size[i]);
    free(bytes);
    REQUIRE(r.status == 200 || r.status == 201, "PUT blob %s: %ld %s",
            b->digest[i], r.status, r.body);
    kc_testsrv_resp_free(&r);
  }
  snprintf(path, sizeof path, "/v1/bundles/%s", b->key);
  return call(t->url, "PUT", path, b->json, strlen(b->json));
}

/* 0 when t serves the bundle exactly (manifest bytes and every blob), else
 * the first status that was not 200 (or -1: other bytes): kc_testsrv_serves. */
static long serves(const kc_testsrv *t, const bundle *b) {
  return kc_testsrv_serves(t, b->key, b->json, b->digest, b->size, b->seed,
                           NFILES);
}

/* The bucket holds b's manifest, byte for byte. */
static int bucket_holds(const bundle *b) {
  char k[KCS3_KEY_MAX + 1], err[KC_ERRBUF_SIZE] = "";
  snprintf(k, sizeof k, "%s/bundles/%s", P.prefix, b->key);
  void *data = NULL;
  size_t len = 0;
  kc_err e = kcs3_get(P.s3, k, 1 << 20, &data, &len, NULL, err);
  int same =
      e == KC_OK && len == strlen(b->json) && memcmp(data, b->json, len) == 0;
  if (e)
    fprintf(stderr, "GET %s: %s\n", k, err);
  free(data);
  return same;
}

/* ---- the replicas ---- */

/* After each case: both replicas stop cleanly, no secret in their logs;
 * radosgw up again (kc_testrgw_pair_stop). */
static int case_teardown(void **state) {
  (void)state;
  return kc_testrgw_pair_stop(&P);
}

/* ---- 1. B is offered a key the bucket already holds ---- */

static void t_refused(void **state) {
  (void)state;
  REQUIRE(kc_testrgw_pair_start(&P, "once-refused", NULL) == 0,
          "the replicas did not start");
  bundle same, k_a, k_b;
  bundle_make(&same, 1, 0);
  bundle_make(&k_a, 2, 0);
  bundle_make(&k_b, 2, 1);
  assert_string_equal(k_a.key, k_b.key);
  assert_string_not_equal(k_a.json, k_b.json);
  char v[64];
  for (int i = 0; i < 2; i++) {
    reply r = bundle_put(&P.a, i ? &k_a : &same);
    REQUIRE(r.status == 201, "A: PUT bundle: %ld %s", r.status, r.body);
    kc_testsrv_resp_free(&r);
  }
  drain(&P.a, "A");
  REQUIRE(bucket_holds(&same) && bucket_holds(&k_a), "A's bundles not in S3");

  /* Another manifest for A's key: refused, and A's is what B serves. */
  reply r = bundle_put(&P.b, &k_b);
  REQUIRE(r.status == 409 && strcmp(member(&r, "error", v), "conflict") == 0,
          "B: PUT of a different manifest for a key in the bucket: %ld %s "
          "(want 409 conflict)",
          r.status, r.body);
  printf("refused: B answered %ld %s\n", r.status, r.body);
  kc_testsrv_resp_free(&r);
  long s = serves(&P.b, &k_a);
  REQUIRE(s == 0, "B does not serve A's manifest after the 409: %ld", s);
  REQUIRE(kc_testsrv_metric(&P.b, REFUSED) == 1, "B: %s %g (want 1)", REFUSED,
          kc_testsrv_metric(&P.b, REFUSED));
  drain(&P.b, "B"); /* B's blobs of k_b go up; its manifest never does */
  REQUIRE(bucket_holds(&k_a), "the bucket lost A's manifest");
  REQUIRE(serves(&P.b, &k_a) == 0 && serves(&P.a, &k_a) == 0,
          "the replicas do not both serve A's manifest");
  assert_true(kc_testsrv_metric(&P.b, REPLACED) == 0);
  /* The same manifest: already present, as on A. */
  r = bundle_put(&P.b, &same);
  REQUIRE(r.status == 200 && strcmp(member(&r, "created", v), "false") == 0,
          "B: PUT of the bucket's own manifest: %ld %s (want 200, created "
          "false)",
          r.status, r.body);
  kc_testsrv_resp_free(&r);
  REQUIRE(serves(&P.b, &same) == 0, "B does not serve the bucket's manifest");
  free(same.json);
  free(k_a.json);
  free(k_b.json);
}

/* ---- 2. B, cut off from the bucket, loses the race afterwards ---- */

static void t_race(void **state) {
  (void)state;
  REQUIRE(kc_testrgw_pair_start(&P, "once-race", NULL) == 0,
          "the replicas did not start");
  bundle k_a, k_b;
  bundle_make(&k_a, 3, 0);
  bundle_make(&k_b, 3, 1);
  reply r = bundle_put(&P.a, &k_a);
  REQUIRE(r.status == 201, "A: PUT bundle: %ld %s", r.status, r.body);
  kc_testsrv_resp_free(&r);
  drain(&P.a, "A");
  REQUIRE(kc_testrgw_gateway_stop(&P.rgw) == 0, "rgw-stop failed");
  /* The bucket cannot be asked: B decides alone (and serves its own). */
  r = bundle_put(&P.b, &k_b);
  REQUIRE(r.status == 201, "B with S3 down: PUT bundle: %ld %s (want 201)",
          r.status, r.body);
  kc_testsrv_resp_free(&r);
  long s = serves(&P.b, &k_b);
  REQUIRE(s == 0, "B with S3 down does not serve what it accepted: %ld", s);
  REQUIRE(kc_testrgw_gateway_start(&P.rgw) == 0, "rgw-start failed");
  long t0 = kc_testsrv_now_ms();
  drain(&P.b, "B");
  long drained = kc_testsrv_now_ms() - t0, t1 = kc_testsrv_now_ms();
  while ((s = serves(&P.b, &k_a)) != 0 && kc_testsrv_now_ms() - t1 < SETTLE_MS)
    usleep(100000);
  REQUIRE(s == 0,
          "B still does not serve A's manifest %d ms after its queue "
          "drained (%ld): two replicas answer one key differently",
          SETTLE_MS, s);
  printf("race: radosgw back; B's queue drained in %ld ms, B served A's "
         "manifest %ld ms later\n",
         drained, kc_testsrv_now_ms() - t1);
  REQUIRE(bucket_holds(&k_a), "the bucket lost A's manifest");
  REQUIRE(serves(&P.a, &k_a) == 0, "A does not serve its manifest");
  REQUIRE(kc_testsrv_metric(&P.b, REPLACED) == 1, "B: %s %g (want 1)", REPLACED,
          kc_testsrv_metric(&P.b, REPLACED));
  REQUIRE(kc_testsrv_log_count(&P.b, "was replaced by it", 0) == 1,
          "B's log does not say its bundle was replaced");
  /* and it stays so: a restart of B serves A's manifest from its store */
  REQUIRE(kc_testsrv_stop(&P.b) == 0, "B did not stop");
  REQUIRE(kc_testrgw_gateway_stop(&P.rgw) == 0, "rgw-stop failed");
  REQUIRE(kc_testsrv_restart(&P.b) == 0, "B did not restart");
  REQUIRE(serves(&P.b, &k_a) == 0, "B after a restart, S3 down, does not "
                                   "serve A's manifest");
  free(k_a.json);
  free(k_b.json);
}

/* ---- main ---- */

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  curl_global_init(CURL_GLOBAL_ALL);
  const struct CMUnitTest rgw[] = {
      cmocka_unit_test_teardown(t_refused, case_teardown),
      cmocka_unit_test_teardown(t_race, case_teardown),
  };
  int rc =
      kc_testrgw_pair_run(&P, "test_scaleout_once", "kcache-once",
                          "scaleout_once", rgw, sizeof rgw / sizeof rgw[0], 0);
  curl_global_cleanup();
  return rc;
}
