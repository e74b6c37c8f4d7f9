/* test_client_faults.c: libkcache against a fake kcached (clienttest.h)
 * that lies (a served blob whose bytes do not hash to its name, a manifest
 * with path traversal) or misbehaves (stalls, resets, garbage, short or
 * HTML answers): the deadline holds, nothing lands, the report says what
 * failed. */
#include "clienttest.h"

/* ---- a server that lies: wrong blob bytes, unsafe manifests ---- */

/* A served blob whose bytes do not hash to its name is never used: the key
 * is rebuilt locally (and the lying server gets no manifest). */
static void test_served_blob_corrupt(void **state) {
  fx *f = *state;
  need_nvrtc();
  char err[KC_ERRBUF_SIZE], key[65];
  kc_warmup *w = warmup_for(f, "w", "saxpy", "saxpy", "");
  kc_key_fields *k = NULL;
  size_t n = 0;
  assert_int_equal(kc_warm_keys(w, NULL, 0, &k, &n, err), KC_OK);
  char *man = fake_manifest(&k[0], "saxpy.cubin", "the real bytes", key);
  char *look = lookup_of(key, man);
  fake s = {
      .lookup_body = look, .bundle_body = man, .blob_body = "the wrong bytes"};
  fake_start(&s);
  kc_client *c = client_for(f->cache, s.url);
  char d[65];
  kc_sha256_hex("the real bytes", 14, d);
  void *data = NULL;
  size_t len = 0;
  assert_int_equal(kc_client_blob_get(c, d, &data, &len, err),
                   KC_DIGEST_MISMATCH);
  kc_warm_report r;
  assert_int_equal(kc_warm(c, w, NULL, &r, err), KC_OK);
  assert_string_equal(r.items[0].key, key);
  assert_int_equal(r.items[0].status, KC_WARM_BUILT);
  assert_int_equal(r.items[0].uploaded, 0);
  char bp[PATH_MAX];
  kc_cache_blob_path(c, d, bp, sizeof bp);
  assert_int_not_equal(access(bp, F_OK), 0); /* the lie never landed */
  kc_warm_report_free(&r);
  kc_client_free(c);
  fake_stop(&s);
  free(look);
  free(man);
  free(k);
  kc_warmup_free(w);
}

/* A served manifest with a path-traversal file path is refused. */
static void test_served_path_traversal(void **state) {
  fx *f = *state;
  char err[KC_ERRBUF_SIZE], key[65], outside[400];
  kc_warmup *w = warmup_for(f, "w", "saxpy", "saxpy",
                            ",\"nvrtc\":\"13.0\",\"cuda\":\"13.0\"");
  kc_key_fields *k = NULL;
  size_t n = 0;
  assert_int_equal(kc_warm_keys(w, NULL, 0, &k, &n, err), KC_OK);
  char *man = fake_manifest(&k[0], "../../evil.cubin", "payload", key);
  char *look = lookup_of(key, man);
  fake s = {.lookup_body = look, .bundle_body = man, .blob_body = "payload"};
  fake_start(&s);
  kc_client *c = client_for(f->cache, s.url);
  kc_manifest *m = NULL;
  kc_err ge = kc_client_bundle_get(c, key, &m, err);
  if (ge != KC_BAD_MANIFEST)
    fail_msg("bundle_get: %s (%s)", kc_err_name(ge), err);
  assert_non_null(strstr(err, "files[0].path"));
  assert_null(m);
  kc_warm_report r;
  kc_warm_opts o = {.no_build = 1, .out_dir = f->out};
  assert_int_not_equal(kc_warm(c, w, &o, &r, err), KC_OK);
  assert_int_equal(r.items[0].status, KC_WARM_FAILED);
  snprintf(outside, sizeof outside, "%s/evil.cubin", f->dir);
  assert_int_not_equal(access(outside, F_OK), 0);
  kc_warm_report_free(&r);
  kc_client_free(c);
  fake_stop(&s);
  free(look);
  free(man);
  free(k);
  kc_warmup_free(w);
}

/* ---- faults: a server that stalls, resets, or answers garbage ---- */

#define FAULT_DEADLINE_S 2.0

/* Nothing a misbehaving server sent reached the disk: no blob, no bundle, no
 * temporary file left behind, nothing materialized. */
static void assert_nothing_landed(const char *cache, const char *out) {
  char cmd[2400];
  snprintf(cmd, sizeof cmd,
           "test -z \"$(find '%s/blobs' '%s/bundles' '%s/tmp' '%s' -type f "
           "2>/dev/null)\"",
           cache, cache, cache, out);
  if (system(cmd) != 0) {
    snprintf(cmd, sizeof cmd, "find '%s' '%s' -type f >&2", cache, out);
    if (system(cmd) != 0)
      fprintf(stderr, "find failed\n");
    fail_msg("files landed from a misbehaving server");
  }
}

/* One fetch-only warm of w against the fake s into a fresh cache and out
 * directory (named by tag), timed: it must end within the deadline (plus
 * slack) and report every key. Returns kc_warm's code. */
static kc_err warm_faulty(fx *f, fake *s, const kc_warmup *w, const char *tag,
                          int parallel, kc_warm_report *r, double *secs) {
  char err[KC_ERRBUF_SIZE] = "", cache[400], out[400];
  snprintf(cache, sizeof cache, "%s/cache-%s", f->dir, tag);
  snprintf(out, sizeof out, "%s/out-%s", f->dir, tag);
  kc_client *c = NULL;
  kc_client_opts co = {.url = s->url,
                       .cache_dir = cache,
                       .timeout_ms = 20000,
                       .connect_timeout_ms = 1000,
                       .parallel = parallel};
  assert_int_equal(kc_client_new(&co, &c, err), KC_OK);
  kc_warm_opts o = {
      .no_build = 1, .deadline_s = FAULT_DEADLINE_S, .out_dir = out};
  double t0 = now_s();
  kc_err e = kc_warm(c, w, &o, r, err);
  *secs = now_s() - t0;
  print_message("%-14s %.2f s  %s: %s\n", tag, *secs, kc_err_name(e), err);
  for (size_t i = 0; i < r->n_items; i++)
    print_message("  %.12s %s: %s\n", r->items[i].key,
                  kc_warm_status_name(r->items[i].status), r->items[i].message);
  assert_true(*secs < FAULT_DEADLINE_S + 2.0);
  assert_int_equal(r->n_items, 2);
  kc_client_free(c);
  assert_nothing_landed(cache, out);
  return e;
}

/* Every key failed, each with a message saying why. */
static void assert_all_failed(const kc_warm_report *r) {
  assert_int_equal(count(r, KC_WARM_FAILED), r->n_items);
  for (size_t i = 0; i < r->n_items; i++) {
    assert_int_not_equal(r->items[i].err, KC_OK);
    assert_true(r->items[i].message[0] != '\0');
  }
}

/* The lookup stalls, resets, or answers garbage: the warm reports every key
 * failed within the deadline. */
static void test_fault_lookup(void **state) {
  fx *f = *state;
  char keys[2][65], wrong[1024];
  kc_key_fields *k = NULL;
  kc_warmup *w = fault_warmup(f, &k, keys);
  /* Valid JSON, wrong types: a manifest that is not one, a number. */
  snprintf(wrong, sizeof wrong,
           "{\"found\":{\"%s\":{\"schema\":7,\"key\":[],\"files\":\"x\"},"
           "\"%s\":42},\"missing\":\"none\"}",
           keys[0], keys[1]);
  struct {
    const char *tag;
    fault fault;
    const char *body;
  } cases[] = {
      {"lookup-stall", FAULT_STALL, NULL},
      {"lookup-reset", FAULT_RESET, NULL},
      {"lookup-garbage", FAULT_GARBAGE, NULL},
      {"lookup-html500", FAULT_HTML, NULL},
      {"lookup-badjson", FAULT_NONE, "{\"found\": {\"a\": [1, 2,"},
      {"lookup-types", FAULT_NONE, wrong},
      {"lookup-array", FAULT_NONE, "{\"found\":[1,2],\"missing\":{}}"},
  };
  for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
    fake s = {.lookup_fault = cases[t].fault, .lookup_body = cases[t].body};
    kc_warm_report r;
    double secs;
    fake_start(&s);
    kc_err e = warm_faulty(f, &s, w, cases[t].tag, 0, &r, &secs);
    fake_stop(&s);
    assert_int_not_equal(e, KC_OK);
    assert_all_failed(&r);
    for (size_t i = 0; i < r.n_items; i++) /* a failure, not a miss */
      assert_null(strstr(r.items[i].message, "not cached"));
    if (cases[t].fault == FAULT_STALL) { /* given up at half the deadline */
      assert_true(secs > FAULT_DEADLINE_S / 2 - 0.3);
      assert_true(secs < FAULT_DEADLINE_S - 0.3);
    } else { /* a broken answer is known at once, not by the deadline */
      assert_true(secs < FAULT_DEADLINE_S - 0.5);
    }
    kc_warm_report_free(&r);
  }
  free(k);
  kc_warmup_free(w);
}

/* A good lookup answer, then the blob GET stalls, resets, answers garbage,
 * is cut short, or is an HTML 500: the key fails, its bytes never land. */
static void test_fault_blob(void **state) {
  fx *f = *state;
  char keys[2][65], key[65];
  kc_key_fields *k = NULL;
  kc_warmup *w = fault_warmup(f, &k, keys);
  char *man = fake_manifest(&k[0], "saxpy.cubin", "the real bytes", key);
  char *look = lookup_of(key, man);
  assert_string_equal(key, keys[0]);
  struct {
    const char *tag;
    fault fault;
  } cases[] = {
      {"blob-stall", FAULT_STALL},     {"blob-reset", FAULT_RESET},
      {"blob-garbage", FAULT_GARBAGE}, {"blob-short", FAULT_SHORT},
      {"blob-html500", FAULT_HTML},
  };
  for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
    fake s = {
        .lookup_body = look, .bundle_body = man, .blob_fault = cases[t].fault};
    kc_warm_report r;
    double secs;
    fake_start(&s);
    kc_err e = warm_faulty(f, &s, w, cases[t].tag, 0, &r, &secs);
    fake_stop(&s);
    assert_int_not_equal(e, KC_OK);
    assert_all_failed(&r);
    if (cases[t].fault == FAULT_STALL)
      assert_true(secs > FAULT_DEADLINE_S - 0.5);
    else
      assert_true(secs < FAULT_DEADLINE_S - 0.5);
    /* The found key says what went wrong with its blob. */
    assert_null(strstr(r.items[0].message, "not cached"));
    kc_warm_report_free(&r);
  }
  free(look);
  free(man);
  free(k);
  kc_warmup_free(w);
}

/* Blobs fetched one at a time from a server that stalls: the transfer that
 * would start after the deadline must not start without a time limit. */
static void test_fault_blob_stall_serial(void **state) {
  fx *f = *state;
  char keys[2][65], key0[65], key1[65], look[16384];
  kc_key_fields *k = NULL;
  kc_warmup *w = fault_warmup(f, &k, keys);
  char *m0 = fake_manifest(&k[0], "saxpy.cubin", "bytes zero", key0);
  char *m1 = fake_manifest(&k[1], "saxpy.cubin", "bytes one", key1);
  snprintf(look, sizeof look,
           "{\"found\":{\"%s\":%s,\"%s\":%s},\"missing\":[]}", key0, m0, key1,
           m1);
  fake s = {.lookup_body = look, .blob_fault = FAULT_STALL};
  kc_warm_report r;
  double secs;
  fake_start(&s);
  kc_err e = warm_faulty(f, &s, w, "blob-serial", 1, &r, &secs);
  fake_stop(&s);
  assert_int_equal(e, KC_DEADLINE);
  assert_all_failed(&r);
  kc_warm_report_free(&r);
  free(m0);
  free(m1);
  free(k);
  kc_warmup_free(w);
}

/* Building allowed: a server whose blob GETs reset is no reason to stay
 * cold. Every key is built here, nothing is uploaded, the report warns. */
static void test_fault_fallback_build(void **state) {
  fx *f = *state;
  need_nvrtc();
  char err[KC_ERRBUF_SIZE], key[65], d[65], p[PATH_MAX];
  size_t n = 0;
  kc_key_fields *k = NULL;
  kc_warmup *w = warmup_for(f, "w", "saxpy", "saxpy", "");
  assert_int_equal(kc_warm_keys(w, NULL, 0, &k, &n, err), KC_OK);
  char *man = fake_manifest(&k[0], "saxpy.cubin", "the real bytes", key);
  char *look = lookup_of(key, man);
  fake s = {.lookup_body = look, .bundle_body = man, .blob_fault = FAULT_RESET};
  fake_start(&s);
  kc_client *c = client_for(f->cache, s.url);
  kc_warm_report r;
  kc_warm_opts o = {.deadline_s = 60, .out_dir = f->out};
  double t0 = now_s();
  assert_int_equal(kc_warm(c, w, &o, &r, err), KC_OK);
  print_message("fallback-build %.2f s  warning: %s\n", now_s() - t0,
                r.warning);
  assert_int_equal(count(&r, KC_WARM_BUILT), 2);
  assert_int_equal(r.items[0].uploaded + r.items[1].uploaded, 0);
  assert_true(r.warning[0] != '\0');
  snprintf(p, sizeof p, "%s/sm_80/batch=1/saxpy.cubin", f->out);
  char *img = NULL;
  size_t len = 0;
  assert_int_equal(kc_read_file(p, &img, &len, err), KC_OK);
  assert_true(len > 4 && !memcmp(img, "\177ELF", 4)); /* ours, not served */
  free(img);
  kc_sha256_hex("the real bytes", 14, d);
  kc_cache_blob_path(c, d, p, sizeof p);
  assert_int_not_equal(access(p, F_OK), 0);
  kc_warm_report_free(&r);
  kc_client_free(c);
  fake_stop(&s);
  free(look);
  free(man);
  free(k);
  kc_warmup_free(w);
}

/* The lookup stalls and builds are allowed: the warm gives kcached half the
 * deadline, then builds every key here within the other half. */
static void test_fault_stall_builds(void **state) {
  fx *f = *state;
  need_nvrtc();
  char err[KC_ERRBUF_SIZE];
  kc_warmup *w = warmup_for(f, "w", "saxpy", "saxpy", "");
  fake s = {.lookup_fault = FAULT_STALL};
  fake_start(&s);
  kc_client *c = client_for(f->cache, s.url);
  kc_warm_report r;
  kc_warm_opts o = {.deadline_s = 8, .out_dir = f->out};
  double t0 = now_s();
  assert_int_equal(kc_warm(c, w, &o, &r, err), KC_OK);
  double secs = now_s() - t0;
  print_message("stall-builds %.2f s  warning: %s\n", secs, r.warning);
  assert_int_equal(count(&r, KC_WARM_BUILT), r.n_items);
  assert_true(secs > 3.5 && secs < 8.0);
  assert_true(r.warning[0] != '\0');
  kc_warm_report_free(&r);
  kc_client_free(c);
  fake_stop(&s);
  kc_warmup_free(w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      CT(test_served_blob_corrupt),
      CT(test_served_path_traversal),
      CT(test_fault_lookup),
      CT(test_fault_blob),
      CT(test_fault_blob_stall_serial),
      CT(test_fault_stall_builds),
      CT(test_fault_fallback_build),
  };
  return clienttest_run("client_faults", tests, sizeof tests / sizeof tests[0]);
}
