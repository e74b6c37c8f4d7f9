/* test_scaleout.c: two kcached replicas over one S3 bucket (docs/DESIGN.md,
 * Scale-out), against a real single-node Ceph RGW (tests/testrgw.h).
 *
 * Replicas A and B run with separate data directories on one bucket; each
 * case has its own --s3-prefix. Cases:
 *   through:  write-through (blobs, manifest, model marker in the bucket)
 *             and read-through on B: GET bundle and blob, POST /v1/lookup,
 *             GET /v1/models/{model} for a model B never saw
 *   leases:   a lease held through A is refused through B (409 naming the
 *             holder) until A releases it; an expired one is taken over
 *   kill:     radosgw stopped, bundles put through A (acknowledged, queued),
 *             A SIGKILLed, restarted (the queue is still there), radosgw
 *             back: the queue drains and nothing acknowledged is missing
 *             from the bucket; then uploads from 4 threads and a SIGKILL
 *             at once, with the same check
 *   s3_down:  radosgw stopped: both replicas serve what they hold, writes
 *             queue, misses answer 404 within 5 s, /readyz stays 200, the
 *             metrics say S3 is down; radosgw back: the queue drains and B
 *             serves what was written meanwhile
 *   corrupt:  a blob and a manifest changed in the bucket are detected by B,
 *             never served, counted, and deleted from the bucket
 *   creds:    credentials from --s3-credentials (an AWS shared-credentials
 *             file) instead of the environment
 *   gone:     the bucket deleted under A: writes queue, past the 8 refusals
 *             that set one entry aside none is, and the queue drains into
 *             the bucket made again, without a restart
 *   parked:   a queued blob rotted in LMDB: S3 refuses it; after 8 refusals
 *             it is set aside and counted, the blob after it goes up, and
 *             the next start queues it again
 *   bad config (no RGW needed): --s3-bucket without --s3-endpoint and the
 *             reverse, no credentials, an unreadable credentials file: exit
 *             2 with a message. No kcached log ever holds the secret.
 *
 * Exit 77 (ctest: skipped) where the Ceph packages cannot be installed,
 * unless CI=true; KC_TEST_S3_ENV=FILE uses a running RGW (testrgw.h).
 * KC_SCALEOUT_ONLY=PATTERN runs the matching cases alone (t_kill, t_*s3*).
 * Timing: RGW start ~7 s; the cases ~60 s, most of it waiting out the
 * write-through queue's backoff (radosgw back, the bucket back, 8 refusals).
 */
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
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
#define PROMPT_MS 5000 /* a miss while S3 is down */

static kc_testrgw_pair P; /* the RGW, the bucket, the replicas A and B */

#define REQUIRE(cond, ...) KC_TESTRGW_REQUIRE(&P, cond, __VA_ARGS__)

/* ---- HTTP (kc_testsrv_http) ---- */

typedef kc_testsrv_resp reply;

/* One request; h NULL: a fresh handle. Safe in any thread (no asserts).
 * status is 0 unless the transfer completed. */
static reply call(CURL *h, const char *base, const char *method,
                  const char *path, const void *body, size_t len) {
  reply r = kc_testsrv_http(
      h, base, path,
      (kc_testsrv_req){.method = method,
                       .body = body,
                       .len = len,
                       .header =
                           body ? "Content-Type: application/json" : NULL});
  if (r.rc != CURLE_OK)
    r.status = 0;
  return r;
}

/* The Retry-After header's seconds, -1 when there is none. */
static long retry_after(const reply *r) {
  char v[32];
  return kc_testsrv_header(r, "Retry-After", v, sizeof v) ? atol(v) : -1;
}

/* The JSON error code of a reply ("" when it has none). */
static const char *error_code(const reply *r, char out[64]) {
  json_t *j = r->body ? json_loadb(r->body, r->len, 0, NULL) : NULL;
  snprintf(out, 64, "%s",
           json_string_value(json_object_get(j, "error"))
               ? json_string_value(json_object_get(j, "error"))
               : "");
  json_decref(j);
  return out;
}

/* A sample from /metrics (kc_testsrv_metric). */
static double metric(const kc_testsrv *t, const char *series) {
  return kc_testsrv_metric(t, series);
}

/* Waits until the replica's write-through queue is empty; the ms it took. */
static long drain(const kc_testsrv *t, const char *name) {
  double depth = -1;
  long ms = kc_testsrv_drain(t, DRAIN_MS, &depth);
  REQUIRE(ms >= 0, "replica %s: kcached_s3_queue_depth still %g after %d ms",
          name, depth, DRAIN_MS);
  return ms;
}

/* ---- the replicas ---- */

/* Starts A and B under prefix, with extra arguments (may be NULL). */
static void start_pair(const char *prefix, const char *const *extra) {
  REQUIRE(kc_testrgw_pair_start(&P, prefix, extra) == 0,
          "the replicas did not start");
}

/* After each case: both replicas stop cleanly, no secret in their logs;
 * radosgw up again (kc_testrgw_pair_stop). */
static int case_teardown(void **state) {
  (void)state;
  return kc_testrgw_pair_stop(&P);
}

/* ---- bundles ---- */

#define MAX_FILES 3

typedef struct bundle {
  char model[65];
  char key[65];
  char *json; /* canonical manifest */
  size_t n;
  char digest[MAX_FILES][65];
  size_t size[MAX_FILES];
  uint64_t seed[MAX_FILES]; /* the bytes: kc_testsrv_bytes(seed, size) */
} bundle;

static void model_of(const char *name, char out[65]) {
  kc_sha256_hex(name, strlen(name), out);
}

/* Describes a bundle of model (a name, hashed) with n files of the given
 * sizes; contents from seed. 0 ok (no asserts: threads call it). */
static int bundle_make(bundle *b, const char *model_name, uint64_t seed,
                       size_t n, const size_t *sizes) {
  memset(b, 0, sizeof *b);
  model_of(model_name, b->model);
  b->n = n;
  kc_manifest *m = kc_manifest_new();
  char err[KC_ERRBUF_SIZE] = "";
  int rc = -1;
  if (!m)
    return -1;
  kc_key_fields *f = &m->fields;
  memcpy(f->model, b->model, 65);
  kc_sha256_hex("scaleout build", 14, f->build);
  snprintf(f->arch, sizeof f->arch, "sm_80");
  f->bucket.n = 2;
  snprintf(f->bucket.dims[0].name, sizeof f->bucket.dims[0].name, "seq");
  f->bucket.dims[0].value = seed;
  snprintf(f->bucket.dims[1].name, sizeof f->bucket.dims[1].name, "batch");
  f->bucket.dims[1].value = 8;
  if (kc_key_set_tool(f, "nvrtc", "13.0", err) != KC_OK)
    goto out;
  for (size_t i = 0; i < n; i++) {
    b->size[i] = sizes[i];
    b->seed[i] = seed * 16 + i;
    unsigned char *bytes = kc_testsrv_bytes(b->seed[i], sizes[i]);
    kc_sha256_hex(bytes, sizes[i], b->digest[i]);
    free(bytes);
    char path[40];
    snprintf(path, sizeof path, "lib/part%zu.cubin", i);
    const char *entry = "kern";
    if (kc_manifest_add_file(m, path, b->digest[i], sizes[i], KC_KIND_CUBIN,
                             &entry, 1, err) != KC_OK)
      goto out;
  }
  if (kc_manifest_seal(m, err) != KC_OK ||
      kc_manifest_to_json(m, &b->json, err) != KC_OK)
    goto out;
  memcpy(b->key, m->key, 65);
  rc = 0;
out:
  if (rc)
    fprintf(stderr, "bundle_make: %s\n", err);
  kc_manifest_free(m);
  return rc;
}

static void bundle_free(bundle *b) {
  free(b->json);
  b->json = NULL;
}

/* PUTs the blobs then the manifest on h. The manifest's status, or 0 when a
 * transfer failed or a blob was refused; *blobs_acked counts blob 200/201s.
 * No asserts (threads call it). */
static long bundle_put(CURL *h, const char *base, const bundle *b,
                       size_t *blobs_acked) {
  char path[128];
  for (size_t i = 0; i < b->n; i++) {
    unsigned char *bytes = kc_testsrv_bytes(b->seed[i], b->size[i]);
    snprintf(path, sizeof path, "/v1/blobs/%s", b->digest[i]);
    reply r = call(h, base, "PUT", path, bytes, b->size[i]);
    free(bytes);
    long code = r.rc == CURLE_OK ? r.status : 0;
    kc_testsrv_resp_free(&r);
    if (code != 200 && code != 201)
      return 0;
    if (blobs_acked)
      ++*blobs_acked;
  }
  snprintf(path, sizeof path, "/v1/bundles/%s", b->key);
  reply r = call(h, base, "PUT", path, b->json, strlen(b->json));
  long code = r.rc == CURLE_OK ? r.status : 0;
  kc_testsrv_resp_free(&r);
  return code;
}

/* Makes and PUTs a bundle through t: it must be acknowledged with 201. */
static void bundle_new(bundle *b, const kc_testsrv *t, const char *model_name,
                       uint64_t seed, size_t n, const size_t *sizes) {
  assert_int_equal(bundle_make(b, model_name, seed, n, sizes), 0);
  long code = bundle_put(NULL, t->url, b, NULL);
  REQUIRE(code == 201, "PUT bundle %s: %ld (want 201)", b->key, code);
}

/* 0 when t serves the bundle exactly (manifest bytes and every blob), else
 * the first status that was not 200 (or -1: wrong bytes): kc_testsrv_serves. */
static long serves(const kc_testsrv *t, const bundle *b) {
  return kc_testsrv_serves(t, b->key, b->json, b->digest, b->size, b->seed,
                           b->n);
}

/* ---- the bucket ---- */

/* The object key of a kind ("blobs", "bundles", "leases", "models/<m>"). */
static void obj_key(char out[KCS3_KEY_MAX + 1], const char *kind,
                    const char *hex) {
  snprintf(out, KCS3_KEY_MAX + 1, "%s/%s/%s", P.prefix, kind, hex);
}

static kc_err obj_head(const char *kind, const char *hex) {
  char k[KCS3_KEY_MAX + 1], err[KC_ERRBUF_SIZE] = "";
  obj_key(k, kind, hex);
  kc_err e = kcs3_head(P.s3, k, NULL, NULL, err);
  if (e != KC_OK && e != KC_NOT_FOUND)
    fprintf(stderr, "HEAD %s: %s\n", k, err);
  return e;
}

/* Every object a bundle leaves in the bucket: its blobs, the manifest (the
 * canonical bytes), the model's marker. 0, or -1 with a message. */
static int in_bucket(const bundle *b) {
  char k[KCS3_KEY_MAX + 1], err[KC_ERRBUF_SIZE] = "", models[100];
  for (size_t i = 0; i < b->n; i++)
    if (obj_head("blobs", b->digest[i]) != KC_OK) {
      fprintf(stderr, "bucket lacks blob %s of %s\n", b->digest[i], b->key);
      return -1;
    }
  obj_key(k, "bundles", b->key);
  void *data = NULL;
  size_t len = 0;
  kc_err e = kcs3_get(P.s3, k, 1 << 20, &data, &len, NULL, err);
  int same =
      e == KC_OK && len == strlen(b->json) && memcmp(data, b->json, len) == 0;
  free(data);
  if (!same) {
    fprintf(stderr, "bucket: %s: %s\n", k,
            e == KC_OK ? "not the canonical manifest" : err);
    return -1;
  }
  snprintf(models, sizeof models, "models/%s", b->model);
  if (obj_head(models, b->key) != KC_OK) {
    fprintf(stderr, "bucket lacks %s/%s/%s\n", P.prefix, models, b->key);
    return -1;
  }
  return 0;
}

/* ---- 1. write-through, read-through ---- */

static void t_through(void **state) {
  (void)state;
  start_pair("through", NULL);
  bundle k1, k2, k3;
  const size_t two[] = {4096, 100 * 1024 + 3}, one[] = {777};
  bundle_new(&k1, &P.a, "through-m1", 1, 2, two);
  bundle_new(&k2, &P.a, "through-m1", 2, 1, one);
  bundle_new(&k3, &P.a, "through-m2", 3, 1, one);
  long ms = drain(&P.a, "A");
  printf("through: A's queue drained %ld ms after the last PUT\n", ms);
  assert_int_equal(in_bucket(&k1), 0);
  assert_int_equal(in_bucket(&k2), 0);
  assert_int_equal(in_bucket(&k3), 0);
  assert_true(metric(&P.a, "kcached_s3_uploaded_total") >= 3 + 4);

  /* A model B never saw: listed from the bucket. */
  reply r = kc_testsrv_get(&P.b, "/v1/models/%s", k3.model);
  REQUIRE(r.status == 200, "B: GET /v1/models (never seen): %ld %s", r.status,
          r.body);
  json_t *j = json_loadb(r.body, r.len, 0, NULL);
  json_t *list = json_object_get(j, "bundles");
  REQUIRE(json_array_size(list) == 1, "B lists: %s", r.body);
  assert_string_equal(
      json_string_value(json_object_get(json_array_get(list, 0), "key")),
      k3.key);
  json_decref(j);
  kc_testsrv_resp_free(&r);

  /* A lookup on B reads through: k2 found, an unknown key missing. */
  char unknown[65], body[300];
  kc_sha256_hex("nobody built this", 17, unknown);
  snprintf(body, sizeof body, "{\"keys\":[\"%s\",\"%s\"]}", k2.key, unknown);
  r = call(NULL, P.b.url, "POST", "/v1/lookup", body, strlen(body));
  REQUIRE(r.status == 200, "B: lookup: %ld %s", r.status, r.body);
  j = json_loadb(r.body, r.len, 0, NULL);
  json_t *want = json_loads(k2.json, 0, NULL);
  REQUIRE(
      json_equal(json_object_get(json_object_get(j, "found"), k2.key), want),
      "B: lookup does not find k2 as uploaded: %s", r.body);
  json_t *missing = json_object_get(j, "missing");
  REQUIRE(json_array_size(missing) == 1 &&
              strcmp(json_string_value(json_array_get(missing, 0)), unknown) ==
                  0,
          "B: lookup's missing: %s", r.body);
  json_decref(want);
  json_decref(j);
  kc_testsrv_resp_free(&r);

  /* GET bundle and blobs on B: the same bytes. */
  long s1 = serves(&P.b, &k1), s2 = serves(&P.b, &k2);
  REQUIRE(s1 == 0 && s2 == 0, "B does not serve k1 (%ld) or k2 (%ld)", s1, s2);
  /* The model's listing on B: both bundles of m1. */
  r = kc_testsrv_get(&P.b, "/v1/models/%s", k1.model);
  j = json_loadb(r.body, r.len, 0, NULL);
  REQUIRE(json_array_size(json_object_get(j, "bundles")) == 2, "B lists m1: %s",
          r.body);
  json_decref(j);
  kc_testsrv_resp_free(&r);
  printf("through: read-through on B: hits %g, misses %g\n",
         metric(&P.b, "kcached_s3_read_through_total{result=\"hit\"}"),
         metric(&P.b, "kcached_s3_read_through_total{result=\"miss\"}"));
  assert_true(metric(&P.b, "kcached_s3_read_through_total{result=\"hit\"}") >=
              1);
  assert_int_equal(metric(&P.a, "kcached_s3_up"), 1);
  assert_int_equal(metric(&P.a, "kcached_s3_conditional_writes"), 1);
  assert_true(metric(&P.a, "kcached_s3_requests_total") > 0);
  assert_true(metric(&P.a, "kcached_s3_request_duration_seconds_count") > 0);
  bundle_free(&k1);
  bundle_free(&k2);
  bundle_free(&k3);
}

/* A store that held data before the tier was configured: a new bundle
 * naming a blob that was never queued still reaches the bucket whole (the
 * queue checks a manifest's blobs before uploading it). */
static void t_tier_added(void **state) {
  (void)state;
  snprintf(P.prefix, sizeof P.prefix, "added");
  REQUIRE(kc_testsrv_start(&P.a, NULL) == 0, "A without S3 did not start");
  bundle x, y;
  const size_t sizes[] = {4096};
  bundle_new(&x, &P.a, "added-old", 7, 1, sizes);
  assert_int_equal(kc_testsrv_stop(&P.a), 0);
  start_pair("added", NULL);
  /* the same blob (same seed) under another model: only the manifest is
   * sent, the blob is already held and was never queued */
  assert_int_equal(bundle_make(&y, "added-new", 7, 1, sizes), 0);
  assert_string_equal(x.digest[0], y.digest[0]);
  char path[100];
  snprintf(path, sizeof path, "/v1/bundles/%s", y.key);
  reply r = call(NULL, P.a.url, "PUT", path, y.json, strlen(y.json));
  REQUIRE(r.status == 201, "PUT manifest only: %ld %s", r.status, r.body);
  kc_testsrv_resp_free(&r);
  drain(&P.a, "A");
  assert_int_equal(in_bucket(&y), 0);
  REQUIRE(serves(&P.b, &y) == 0, "B does not serve the new bundle");
  bundle_free(&x);
  bundle_free(&y);
}

static void rgw_stop(void) {
  REQUIRE(kc_testrgw_gateway_stop(&P.rgw) == 0, "rgw-stop failed");
}

static void rgw_start(void) {
  REQUIRE(kc_testrgw_gateway_start(&P.rgw) == 0, "rgw-start failed");
}

/* ---- the bucket deleted under a running replica ---- */

static kcs3 *g_main_s3; /* P.s3 while t_bucket_gone points it elsewhere */

static int on_key(const kcs3_entry *e, void *ud) {
  char err[KC_ERRBUF_SIZE] = "";
  if (kcs3_delete(ud, e->key, err) != KC_OK)
    fprintf(stderr, "DELETE %s: %s\n", e->key, err);
  return 0;
}

static void empty_and_delete(kcs3 *c) {
  char err[KC_ERRBUF_SIZE] = "";
  REQUIRE(kcs3_list(c, NULL, on_key, c, err) == KC_OK, "LIST: %s", err);
  REQUIRE(kcs3_bucket_delete(c, err) == KC_OK, "DELETE bucket: %s", err);
}

/* S3 refusing the whole bucket (here: it was deleted; equally a revoked key
 * or a policy) is not a reason to set queue entries aside: they wait past
 * the 8 refusals that would park one entry, and reach the bucket once it
 * is back, without a restart. */
static void t_bucket_gone(void **state) {
  (void)state;
  char bucket[80], err[KC_ERRBUF_SIZE] = "";
  snprintf(bucket, sizeof bucket, "%s-gone", P.bucket);
  kcs3_opts o = {.endpoint = P.rgw.endpoint,
                 .bucket = bucket,
                 .region = P.rgw.region,
                 .path_style = 1,
                 .access_key = P.rgw.access,
                 .secret_key = P.rgw.secret};
  kcs3 *gone = NULL;
  REQUIRE(kcs3_open(&o, &gone, err) == KC_OK, "%s", err);
  g_main_s3 = P.s3; /* in_bucket() looks at P.s3; the teardown puts it back */
  P.s3 = gone;
  REQUIRE(kcs3_bucket_create(gone, err) == KC_OK, "%s", err);
  snprintf(P.prefix, sizeof P.prefix, "gone");
  const char *args[KC_TESTSRV_MAX_ARGS];
  assert_int_equal(kc_testrgw_replica_args(&P.rgw, bucket, P.prefix, NULL, args,
                                           KC_TESTSRV_MAX_ARGS),
                   0);
  REQUIRE(kc_testsrv_start(&P.a, args) == 0, "replica A did not start");
  bundle x, y;
  bundle_new(&x, &P.a, "gone-1", 21, 1, (const size_t[]){3000});
  drain(&P.a, "A");
  empty_and_delete(gone);
  int failed0 = kc_testsrv_log_count(&P.a, "S3 write-through: ", 0);
  bundle_new(&y, &P.a, "gone-2", 22, 2, (const size_t[]){5000, 6000});
  long t0 = kc_testsrv_now_ms();
  while (kc_testsrv_log_count(&P.a, "S3 write-through: ", 0) < failed0 + 9 &&
         kc_testsrv_now_ms() - t0 < DRAIN_MS)
    usleep(200000);
  REQUIRE(kc_testsrv_log_count(&P.a, "S3 write-through: ", 0) >= failed0 + 9,
          "A did not retry 9 times in %d ms", DRAIN_MS);
  assert_true(metric(&P.a, "kcached_s3_parked_total") == 0);
  assert_true(metric(&P.a, "kcached_s3_queue_depth") >= 3); /* y: 2 blobs + 1 */
  assert_int_equal(kc_testsrv_log_count(&P.a, "set aside", 0), 0);
  REQUIRE(kcs3_bucket_create(gone, err) == KC_OK, "%s", err);
  drain(&P.a, "A");
  assert_int_equal(in_bucket(&y), 0);
  bundle_free(&x);
  bundle_free(&y);
  empty_and_delete(gone);
}

static int gone_teardown(void **state) {
  if (g_main_s3) {
    kcs3_close(P.s3);
    P.s3 = g_main_s3;
    g_main_s3 = NULL;
  }
  return case_teardown(state);
}

/* ---- an entry S3 refuses for good ---- */

/* A blob whose bytes rotted in LMDB while queued: S3 refuses the upload
 * (its x-amz-content-sha256 is the digest) 8 times; the entry is set aside
 * and counted, the blob queued after it still goes up; the next start
 * queues it again. */
static void t_parked(void **state) {
  (void)state;
  snprintf(P.prefix, sizeof P.prefix, "parked");
  /* the scrub off: it would remove the rotted blob before S3 refused it */
  const char *const scrub_off[] = {"--scrub-rate", "0", NULL};
  const char *args[KC_TESTSRV_MAX_ARGS];
  assert_int_equal(kc_testrgw_replica_args(&P.rgw, P.bucket, P.prefix,
                                           scrub_off, args,
                                           KC_TESTSRV_MAX_ARGS),
                   0);
  rgw_stop(); /* so both blobs wait in the queue */
  REQUIRE(kc_testsrv_start(&P.a, args) == 0, "replica A did not start");
  bundle x;
  assert_int_equal(
      bundle_make(&x, "parked", 41, 2, (const size_t[]){4096, 4096}), 0);
  for (size_t i = 0; i < 2; i++) {
    char path[128];
    unsigned char *bytes = kc_testsrv_bytes(x.seed[i], x.size[i]);
    snprintf(path, sizeof path, "/v1/blobs/%s", x.digest[i]);
    reply r = call(NULL, P.a.url, "PUT", path, bytes, x.size[i]);
    REQUIRE(r.status == 201, "PUT blob %zu: %ld", i, r.status);
    kc_testsrv_resp_free(&r);
    free(bytes);
  }
  assert_int_equal(kc_testsrv_stop(&P.a), 0);
  unsigned char *bytes = kc_testsrv_bytes(x.seed[0], x.size[0]);
  REQUIRE(kc_testsrv_rot(&P.a, bytes, x.size[0]) >= 1, "blob 0 not found");
  free(bytes);
  rgw_start();
  REQUIRE(kc_testsrv_start(&P.a, args) == 0, "replica A did not restart");
  long t0 = kc_testsrv_now_ms();
  while (metric(&P.a, "kcached_s3_parked_total") < 1 &&
         kc_testsrv_now_ms() - t0 < DRAIN_MS)
    usleep(50000);
  /* the next entry goes at once, not after the parked one's backoff */
  t0 = kc_testsrv_now_ms();
  drain(&P.a, "A");
  long up = kc_testsrv_now_ms() - t0;
  REQUIRE(up < 3000, "blob 1 went up %ld ms after the park", up);
  assert_true(metric(&P.a, "kcached_s3_parked_total") == 1);
  assert_int_equal(kc_testsrv_log_count(&P.a, "set aside", 0), 1);
  assert_int_equal(obj_head("blobs", x.digest[0]), KC_NOT_FOUND);
  assert_int_equal(obj_head("blobs", x.digest[1]), KC_OK);
  assert_int_equal(kc_testsrv_stop(&P.a), 0);
  REQUIRE(kc_testsrv_start(&P.a, args) == 0, "replica A did not restart");
  assert_true(metric(&P.a, "kcached_s3_queue_depth") == 1);
  bundle_free(&x);
}

/* A blob that rots in a replica's LMDB after it reached the bucket: the
 * scrub removes the local copy and its bundle (not the bucket's), and the
 * next GET reads both through from S3, verified: served right again. */
static void t_scrub_heals(void **state) {
  (void)state;
  start_pair("scrubheal", NULL);
  bundle b;
  bundle_new(&b, &P.a, "scrub-m", 3, 1, (const size_t[]){4096});
  drain(&P.a, "A");
  assert_int_equal(kc_testsrv_stop(&P.a), 0);
  unsigned char *bytes = kc_testsrv_bytes(b.seed[0], b.size[0]);
  REQUIRE(kc_testsrv_rot(&P.a, bytes, b.size[0]) >= 1, "blob not found");
  free(bytes);
  REQUIRE(kc_testsrv_restart(&P.a) == 0, "replica A did not restart");
  long t0 = kc_testsrv_now_ms();
  while (metric(&P.a, "kcached_scrub_corrupt_total") < 1 &&
         kc_testsrv_now_ms() - t0 < 10000)
    usleep(50000);
  assert_true(metric(&P.a, "kcached_scrub_corrupt_total") == 1);
  assert_true(metric(&P.a, "kcached_store_bundles") == 0);
  assert_int_equal(obj_head("blobs", b.digest[0]), KC_OK);
  assert_int_equal(obj_head("bundles", b.key), KC_OK);
  REQUIRE(serves(&P.a, &b) == 0, "A does not serve the bundle back from S3");
  assert_true(metric(&P.a, "kcached_store_bundles") == 1);
  assert_true(metric(&P.a, "kcached_s3_read_through_total{result=\"hit\"}") >=
              2);
  bundle_free(&b);
}

/* ---- 2. leases across replicas ---- */

static reply lease(const kc_testsrv *t, const char *key, const char *holder,
                   int ttl_s) {
  char path[128], body[128];
  snprintf(path, sizeof path, "/v1/leases/%s", key);
  snprintf(body, sizeof body, "{\"holder\":\"%s\",\"ttl_s\":%d}", holder,
           ttl_s);
  return call(NULL, t->url, "POST", path, body, strlen(body));
}

/* The lease must be granted (201); its token into tok. */
static void take(const kc_testsrv *t, const char *key, const char *holder,
                 int ttl_s, char tok[128]) {
  reply r = lease(t, key, holder, ttl_s);
  REQUIRE(r.status == 201, "lease for %s: %ld %s (want 201)", holder, r.status,
          r.body);
  json_t *j = json_loadb(r.body, r.len, 0, NULL);
  const char *v = json_string_value(json_object_get(j, "lease"));
  snprintf(tok, 128, "%s", v ? v : "");
  json_decref(j);
  kc_testsrv_resp_free(&r);
  REQUIRE(strlen(tok) >= 16, "lease token '%s'", tok);
}

/* The lease must be refused: 409 leased naming holder, with Retry-After. */
static void refused(const kc_testsrv *t, const char *key, const char *holder) {
  char code[64];
  reply r = lease(t, key, "someone-else", 60);
  REQUIRE(r.status == 409 && strcmp(error_code(&r, code), "leased") == 0,
          "want 409 leased, got %ld %s", r.status, r.body);
  json_t *j = json_loadb(r.body, r.len, 0, NULL);
  const char *h = json_string_value(json_object_get(j, "holder"));
  REQUIRE(h && strcmp(h, holder) == 0, "409 names holder %s, want %s",
          h ? h : "(none)", holder);
  json_decref(j);
  long ra = retry_after(&r);
  REQUIRE(ra >= 1 && ra <= 60, "409 Retry-After %ld", ra);
  kc_testsrv_resp_free(&r);
}

static void release(const kc_testsrv *t, const char *key, const char *tok) {
  char path[256];
  snprintf(path, sizeof path, "/v1/leases/%s?lease=%s", key, tok);
  reply r = call(NULL, t->url, "DELETE", path, NULL, 0);
  REQUIRE(r.status == 204, "release: %ld %s (want 204)", r.status, r.body);
  kc_testsrv_resp_free(&r);
}

static void t_leases(void **state) {
  (void)state;
  start_pair("leases", NULL);
  char key[65], tok[128], k[KCS3_KEY_MAX + 1];
  kc_sha256_hex("lease across replicas", 21, key);
  take(&P.a, key, "a", 60, tok);
  obj_key(k, "leases", key);
  assert_int_equal(kcs3_head(P.s3, k, NULL, NULL, NULL), KC_OK);
  refused(&P.b, key, "a");
  release(&P.a, key, tok);
  take(&P.b, key, "b", 60, tok);
  refused(&P.a, key, "b");
  /* Released through the replica that did not grant it (a load balancer
   * need not send it back): the bucket's lease ends all the same, replaced
   * by an expired one on its ETag, and A takes it at once. */
  release(&P.a, key, tok);
  assert_int_equal(kcs3_head(P.s3, k, NULL, NULL, NULL), KC_OK);
  take(&P.a, key, "a2", 60, tok);
  /* and the other way round: B granted nothing, A's record goes when the
   * bucket says its lease ended */
  release(&P.b, key, tok);
  take(&P.a, key, "a3", 60, tok);
  release(&P.a, key, tok);

  /* An expired lease is taken over through the other replica. */
  kc_sha256_hex("lease that expires", 18, key);
  take(&P.a, key, "a", 1, tok);
  refused(&P.b, key, "a");
  usleep(2500 * 1000);
  take(&P.b, key, "b", 60, tok);
  refused(&P.a, key, "b");
}

/* ---- 3. SIGKILL with a queue ---- */

/* Every bundle in the bucket whole, and served by B. */
static void check_all(bundle *v, size_t n, const char *what) {
  for (size_t i = 0; i < n; i++) {
    REQUIRE(in_bucket(&v[i]) == 0,
            "%s: acknowledged bundle %zu (%s) is not "
            "whole in the bucket",
            what, i, v[i].key);
    long s = serves(&P.b, &v[i]);
    REQUIRE(s == 0, "%s: B does not serve acknowledged bundle %s: %ld", what,
            v[i].key, s);
  }
}

typedef struct uploader {
  pthread_mutex_t mu;
  atomic_int stop;
  const char *url;
  bundle acked[4096];
  size_t n_acked;
  char blobs[8192][65]; /* acknowledged blobs, bundle or not */
  size_t n_blobs;
} uploader;

typedef struct worker {
  uploader *u;
  int id;
} worker;

static void *upload_main(void *arg) {
  worker *w = arg;
  uploader *u = w->u;
  CURL *h = curl_easy_init();
  for (uint64_t i = 0; h && !atomic_load(&u->stop) && i < 1000; i++) {
    bundle b;
    const size_t sizes[] = {512 + (size_t)(i % 7) * 300, 4096};
    if (bundle_make(&b, "kill-concurrent", (uint64_t)w->id * 100000 + i, 2,
                    sizes))
      break;
    size_t blobs = 0;
    long code = bundle_put(h, u->url, &b, &blobs);
    pthread_mutex_lock(&u->mu);
    for (size_t k = 0; k < blobs && u->n_blobs < 8192; k++)
      memcpy(u->blobs[u->n_blobs++], b.digest[k], 65);
    if ((code == 201 || code == 200) && u->n_acked < 4096)
      u->acked[u->n_acked++] = b;
    else
      bundle_free(&b);
    pthread_mutex_unlock(&u->mu);
  }
  curl_easy_cleanup(h);
  return NULL;
}

static size_t acked_now(uploader *u) {
  pthread_mutex_lock(&u->mu);
  size_t n = u->n_acked;
  pthread_mutex_unlock(&u->mu);
  return n;
}

static void t_kill(void **state) {
  (void)state;
  start_pair("kill", NULL);
  enum { N = 20 };
  bundle v[N];
  const size_t sizes[] = {300, 2048};

  /* Round 1: S3 down, N bundles acknowledged, SIGKILL, restart. */
  rgw_stop();
  for (int i = 0; i < N; i++)
    bundle_new(&v[i], &P.a, "kill-queued", (uint64_t)i + 1, 2, sizes);
  reply r = kc_testsrv_get(&P.a, "/readyz");
  REQUIRE(r.status == 200, "A: /readyz with S3 down: %ld", r.status);
  kc_testsrv_resp_free(&r);
  double depth = metric(&P.a, "kcached_s3_queue_depth");
  REQUIRE(depth >= N, "A: queue depth %g after %d bundles with S3 down", depth,
          N);
  kc_testsrv_kill(&P.a);
  REQUIRE(kc_testsrv_restart(&P.a) == 0, "A did not restart (S3 down)");
  double after = metric(&P.a, "kcached_s3_queue_depth");
  REQUIRE(after == depth, "A: queue depth %g before SIGKILL, %g after restart",
          depth, after);
  rgw_start();
  long ms = drain(&P.a, "A");
  printf("kill: %d bundles queued with S3 down (depth %g), SIGKILL, restart "
         "(depth %g), radosgw back: drained in %ld ms\n",
         N, depth, after, ms);
  check_all(v, N, "kill, S3 down");
  for (int i = 0; i < N; i++)
    bundle_free(&v[i]);

  /* Round 2: S3 up, 4 uploaders, SIGKILL soon after the first ack. */
  uploader *u = calloc(1, sizeof *u);
  assert_non_null(u);
  pthread_mutex_init(&u->mu, NULL);
  u->url = P.a.url;
  pthread_t th[4];
  worker w[4];
  for (int i = 0; i < 4; i++) {
    w[i] = (worker){u, i};
    assert_int_equal(pthread_create(&th[i], NULL, upload_main, &w[i]), 0);
  }
  for (long t0 = kc_testsrv_now_ms();
       acked_now(u) == 0 && kc_testsrv_now_ms() - t0 < 30000;)
    usleep(5000);
  usleep(150000);
  double depth2 = metric(&P.a, "kcached_s3_queue_depth");
  kc_testsrv_kill(&P.a);
  atomic_store(&u->stop, 1);
  for (int i = 0; i < 4; i++)
    pthread_join(th[i], NULL);
  REQUIRE(u->n_acked > 0, "no bundle acknowledged before the kill");
  REQUIRE(kc_testsrv_restart(&P.a) == 0, "A did not restart");
  ms = drain(&P.a, "A");
  for (size_t i = 0; i < u->n_blobs; i++)
    REQUIRE(obj_head("blobs", u->blobs[i]) == KC_OK,
            "acknowledged blob %s is not in the bucket", u->blobs[i]);
  check_all(u->acked, u->n_acked, "kill, concurrent");
  printf("kill: 4 uploaders, SIGKILL with queue depth %g: %zu bundles and %zu "
         "blobs acknowledged, all in the bucket after a %ld ms drain\n",
         depth2, u->n_acked, u->n_blobs, ms);
  for (size_t i = 0; i < u->n_acked; i++)
    bundle_free(&u->acked[i]);
  pthread_mutex_destroy(&u->mu);
  free(u);
}

/* ---- 4. S3 down ---- */

/* GET of something the replica lacks while S3 is down: 404, promptly. */
static void expect_prompt_404(const kc_testsrv *t, const char *name,
                              const char *path) {
  reply r = call(NULL, t->url, "GET", path, NULL, 0);
  REQUIRE(r.status == 404 && r.ms < PROMPT_MS,
          "%s: GET %s with S3 down: %ld after %ld ms (want 404 in < %d ms): %s",
          name, path, r.status, r.ms, PROMPT_MS, r.body);
  kc_testsrv_resp_free(&r);
}

static void t_s3_down(void **state) {
  (void)state;
  start_pair("down", NULL);
  bundle x1, x2, x3;
  const size_t sizes[] = {4096, 1000};
  bundle_new(&x1, &P.a, "down-m", 1, 2, sizes);
  bundle_new(&x2, &P.a, "down-m", 2, 2, sizes);
  drain(&P.a, "A");
  REQUIRE(serves(&P.b, &x1) == 0, "B does not read x1 through");
  /* A blob alone read through: served from memory before B's commit; it
   * must be in B's store all the same once S3 is gone. */
  char bpath[120];
  snprintf(bpath, sizeof bpath, "/v1/blobs/%s", x2.digest[0]);
  unsigned char *want = kc_testsrv_bytes(x2.seed[0], x2.size[0]);
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1)
      rgw_stop();
    reply br = kc_testsrv_get(&P.b, "%s", bpath);
    REQUIRE(br.status == 200 && br.len == x2.size[0] &&
                memcmp(br.body, want, br.len) == 0,
            "B: blob of x2 %s S3: %ld, %zu bytes", pass ? "without" : "from",
            br.status, br.len);
    kc_testsrv_resp_free(&br);
  }
  free(want);

  /* What each holds, each serves. */
  REQUIRE(serves(&P.a, &x1) == 0 && serves(&P.a, &x2) == 0,
          "A with S3 down does not serve what it holds");
  REQUIRE(serves(&P.b, &x1) == 0, "B with S3 down does not serve x1");
  /* Writes queue. */
  bundle_new(&x3, &P.a, "down-m", 3, 2, sizes);
  REQUIRE(serves(&P.a, &x3) == 0, "A does not serve x3");
  double depth = metric(&P.a, "kcached_s3_queue_depth");
  REQUIRE(depth > 0, "A: queue depth %g after a write with S3 down", depth);
  /* Misses answer 404 at once, on both. */
  char path[200], unknown[65];
  kc_sha256_hex("down: nobody has this", 21, unknown);
  for (int i = 0; i < 3; i++) {
    const kc_testsrv *t = i == 1 ? &P.a : &P.b;
    const char *name = i == 1 ? "A" : "B";
    snprintf(path, sizeof path, "/v1/bundles/%s", unknown);
    expect_prompt_404(t, name, path);
    snprintf(path, sizeof path, "/v1/blobs/%s", unknown);
    expect_prompt_404(t, name, path);
  }
  snprintf(path, sizeof path, "/v1/bundles/%s", x3.key); /* only A has it */
  expect_prompt_404(&P.b, "B", path);
  snprintf(path, sizeof path, "/v1/blobs/%s", x3.digest[0]);
  expect_prompt_404(&P.b, "B", path);
  char body[300];
  snprintf(body, sizeof body, "{\"keys\":[\"%s\",\"%s\"]}", x1.key, x2.key);
  reply r = call(NULL, P.b.url, "POST", "/v1/lookup", body, strlen(body));
  REQUIRE(r.status == 200 && r.ms < PROMPT_MS,
          "B: lookup with S3 down: %ld after %ld ms", r.status, r.ms);
  json_t *j = json_loadb(r.body, r.len, 0, NULL);
  REQUIRE(json_object_get(json_object_get(j, "found"), x1.key) &&
              json_array_size(json_object_get(j, "missing")) == 1,
          "B: lookup with S3 down: %s", r.body);
  json_decref(j);
  kc_testsrv_resp_free(&r);
  /* Ready, and the metrics say what is going on. */
  for (int i = 0; i < 2; i++) {
    r = kc_testsrv_get(i ? &P.b : &P.a, "/readyz");
    REQUIRE(r.status == 200, "%s: /readyz with S3 down: %ld", i ? "B" : "A",
            r.status);
    kc_testsrv_resp_free(&r);
  }
  double errors = metric(&P.a, "kcached_s3_errors_total");
  REQUIRE(errors > 0, "A: kcached_s3_errors_total %g with S3 down", errors);
  REQUIRE(metric(&P.a, "kcached_s3_up") == 0,
          "A: kcached_s3_up %g with S3 down", metric(&P.a, "kcached_s3_up"));
  printf("s3 down: A queue depth %g, errors %g; B errors %g, read-through "
         "errors %g\n",
         depth, errors, metric(&P.b, "kcached_s3_errors_total"),
         metric(&P.b, "kcached_s3_read_through_total{result=\"error\"}"));

  rgw_start();
  long ms = drain(&P.a, "A");
  assert_int_equal(in_bucket(&x3), 0);
  /* B may still fail fast for a moment after its last failure. */
  long t0 = kc_testsrv_now_ms(), s;
  while ((s = serves(&P.b, &x3)) != 0 && kc_testsrv_now_ms() - t0 < 5000)
    usleep(200000);
  REQUIRE(s == 0, "B does not serve x3 after S3 came back: %ld", s);
  printf("s3 down: radosgw back: A drained in %ld ms; B served x3 after %ld "
         "ms more\n",
         ms, kc_testsrv_now_ms() - t0);
  assert_int_equal(metric(&P.a, "kcached_s3_up"), 1);
  bundle_free(&x1);
  bundle_free(&x2);
  bundle_free(&x3);
}

/* ---- 5. corrupt objects ---- */

static void t_corrupt(void **state) {
  (void)state;
  start_pair("corrupt", NULL);
  bundle b, c;
  const size_t sizes[] = {4096};
  bundle_new(&b, &P.a, "corrupt-m", 1, 1, sizes);
  bundle_new(&c, &P.a, "corrupt-m", 2, 1, (const size_t[]){5000});
  drain(&P.a, "A");

  /* The blob: same length, one byte flipped. */
  char k[KCS3_KEY_MAX + 1], err[KC_ERRBUF_SIZE] = "", code[64];
  unsigned char *bad = kc_testsrv_bytes(b.seed[0], 4096);
  bad[1234] ^= 0x20;
  obj_key(k, "blobs", b.digest[0]);
  assert_int_equal(kcs3_put(P.s3, k, bad, 4096, NULL, NULL, err), KC_OK);
  reply r = kc_testsrv_get(&P.b, "/v1/blobs/%s", b.digest[0]);
  REQUIRE(r.status == 500 && strcmp(error_code(&r, code), "corrupt") == 0,
          "B: GET of a corrupt blob: %ld %.200s (want 500 corrupt)", r.status,
          r.status == 200 ? "(the bytes)" : r.body);
  assert_null(memmem(r.body, r.len, bad + 1024, 512));
  printf("corrupt blob: B answered %ld %s\n", r.status, r.body);
  kc_testsrv_resp_free(&r);
  assert_int_equal(metric(&P.b, "kcached_s3_corrupt_total"), 1);
  assert_int_equal(
      metric(&P.b, "kcached_s3_read_through_total{result=\"corrupt\"}"), 1);
  assert_int_equal(obj_head("blobs", b.digest[0]), KC_NOT_FOUND);
  r = kc_testsrv_get(&P.b, "/v1/blobs/%s", b.digest[0]);
  REQUIRE(r.status == 404, "B: GET of the deleted corrupt blob: %ld", r.status);
  kc_testsrv_resp_free(&r);
  /* The bundle that names it is not served whole either. */
  r = kc_testsrv_get(&P.b, "/v1/bundles/%s", b.key);
  REQUIRE(r.status != 200, "B serves bundle %s without its blob", b.key);
  kc_testsrv_resp_free(&r);
  /* A still has the good bytes. */
  assert_int_equal(serves(&P.a, &b), 0);
  free(bad);

  /* A manifest replaced by another valid one that does not match its key. */
  obj_key(k, "bundles", c.key);
  assert_int_equal(kcs3_put(P.s3, k, b.json, strlen(b.json), NULL, NULL, err),
                   KC_OK);
  r = kc_testsrv_get(&P.b, "/v1/bundles/%s", c.key);
  REQUIRE(r.status == 500 && strcmp(error_code(&r, code), "corrupt") == 0,
          "B: GET of a manifest under the wrong key: %ld %s (want 500 corrupt)",
          r.status, r.body);
  printf("corrupt manifest: B answered %ld %s\n", r.status, r.body);
  assert_null(strstr(r.body, "\"files\"")); /* an error, not a manifest */
  kc_testsrv_resp_free(&r);
  assert_int_equal(metric(&P.b, "kcached_s3_corrupt_total"), 2);
  assert_int_equal(obj_head("bundles", c.key), KC_NOT_FOUND);
  bundle_free(&b);
  bundle_free(&c);
}

/* ---- 6. credentials from a file ---- */

static void t_credentials_file(void **state) {
  (void)state;
  char creds[512];
  assert_int_equal(kc_testsrv_init(&P.a), 0);
  snprintf(creds, sizeof creds, "%s/credentials", P.a.dir);
  FILE *f = fopen(creds, "w");
  assert_non_null(f);
  fprintf(f,
          "# kcache test\n[other]\naws_access_key_id = WRONG\n"
          "aws_secret_access_key = wrong\n\n[default]\n"
          "aws_access_key_id = %s\naws_secret_access_key=%s\n",
          P.rgw.access, P.rgw.secret);
  fclose(f);
  unsetenv("AWS_ACCESS_KEY_ID");
  unsetenv("AWS_SECRET_ACCESS_KEY");
  const char *extra[] = {"--s3-credentials", creds, NULL};
  start_pair("creds", extra); /* case_teardown sets them again */
  bundle b;
  bundle_new(&b, &P.a, "creds-m", 1, 1, (const size_t[]){100});
  drain(&P.a, "A");
  assert_int_equal(in_bucket(&b), 0);
  assert_int_equal(serves(&P.b, &b), 0);
  bundle_free(&b);
}

/* ---- bad configuration (no RGW) ---- */

/* Runs kcached with args and env (NULL-terminated); its exit status (-2:
 * still running after 15 s: killed) and its output in *out. */
static int run_kcached(const char *const *args, char *const *env, char **out) {
  char dir[] = "/tmp/kcache-badcfg-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char log[64], data[64];
  snprintf(log, sizeof log, "%s/log", dir);
  snprintf(data, sizeof data, "%s/data", dir);
  const char *argv[40] = {kc_testsrv_bin(), "--listen", "127.0.0.1:0",
                          "--data-dir", data};
  size_t n = 5;
  for (size_t i = 0; args[i] && n < 39; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid;
  assert_int_equal(
      posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, env), 0);
  posix_spawn_file_actions_destroy(&fa);
  int st = 0, rc = -2;
  for (long t0 = kc_testsrv_now_ms(); kc_testsrv_now_ms() - t0 < 15000;
       usleep(20 * 1000))
    if (waitpid(pid, &st, WNOHANG) == pid) {
      rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
  if (rc == -2) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
  }
  FILE *f = fopen(log, "r");
  size_t len = 0;
  *out = NULL;
  if (!f || getdelim(out, &len, '\0', f) < 0) {
    free(*out);
    *out = strdup("");
  }
  if (f)
    fclose(f);
  char cmd[80];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", dir);
  return rc;
}

static void expect_exit2(const char *const *args, char *const *env,
                         const char *names, const char *secret) {
  char *out;
  int rc = run_kcached(args, env, &out);
  printf("bad config (%s): exit %d: %.*s\n", names, rc, (int)strcspn(out, "\n"),
         out);
  if (rc != 2 || !strstr(out, names) || (secret && strstr(out, secret)))
    fail_msg("want exit 2 naming %s (and no secret); got %d: %s", names, rc,
             out);
  free(out);
}

static void t_bad_config(void **state) {
  (void)state;
  const char *secret = "kcache-test-secret-never-logged-0123";
  char ak[80], sk[80], path[4096];
  snprintf(ak, sizeof ak, "AWS_ACCESS_KEY_ID=AKIATESTKEY");
  snprintf(sk, sizeof sk, "AWS_SECRET_ACCESS_KEY=%s", secret);
  /* PATH only: a valgrind wrapper (scripts/valgrind.sh) finds valgrind */
  snprintf(path, sizeof path, "PATH=%s",
           getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
  char *with[] = {path, ak, sk, NULL}, *without[] = {path, NULL};
  const char *no_endpoint[] = {"--s3-bucket", "kc-bucket", NULL};
  expect_exit2(no_endpoint, with, "--s3-endpoint", secret);
  const char *no_bucket[] = {"--s3-endpoint", "http://127.0.0.1:1", NULL};
  expect_exit2(no_bucket, with, "--s3-bucket", secret);
  const char *both[] = {"--s3-endpoint", "http://127.0.0.1:1", "--s3-bucket",
                        "kc-bucket",     "--s3-path-style",    NULL};
  expect_exit2(both, without, "AWS_ACCESS_KEY_ID", NULL);
  const char *no_file[] = {"--s3-endpoint",
                           "http://127.0.0.1:1",
                           "--s3-bucket",
                           "kc-bucket",
                           "--s3-credentials",
                           "/nonexistent/kcache-credentials",
                           NULL};
  expect_exit2(no_file, without, "/nonexistent/kcache-credentials", NULL);
}

/* ---- main ---- */

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  curl_global_init(CURL_GLOBAL_ALL);
  unsetenv("AWS_ACCESS_KEY_ID");
  unsetenv("AWS_SECRET_ACCESS_KEY");
  const char *only = getenv("KC_SCALEOUT_ONLY"); /* e.g. t_corrupt, or t_* */
  if (only && *only)
    cmocka_set_test_filter(only);
  const struct CMUnitTest offline[] = {cmocka_unit_test(t_bad_config)};
#define CASE(f) cmocka_unit_test_teardown(f, case_teardown)
  const struct CMUnitTest rgw[] = {
      CASE(t_through),
      CASE(t_leases),
      CASE(t_corrupt),
      CASE(t_credentials_file),
      CASE(t_s3_down),
      CASE(t_kill),
      CASE(t_tier_added),
      cmocka_unit_test_teardown(t_bucket_gone, gone_teardown),
      CASE(t_parked),
      CASE(t_scrub_heals),
  };
  int fails =
      cmocka_run_group_tests_name("scaleout_config", offline, NULL, NULL);
  int rc = kc_testrgw_pair_run(&P, "test_scaleout", "kcache-scaleout",
                               "scaleout_rgw", rgw, sizeof rgw / sizeof rgw[0],
                               fails);
  curl_global_cleanup();
  return rc;
}
