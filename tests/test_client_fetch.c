/* test_client_fetch.c: how the client fetches: the file-system cost of a
 * fetch (small and large blobs), many blobs per request (POST
 * /v1/blobs/fetch: verified, written, the fallback to single GETs), and
 * zstd on the wire. Fixture, the fake server and helpers: clienttest.h. */
#include "clienttest.h"

#include <zstd.h>

/* ---- file-system cost of a fetch ---- */

/* A pull into an empty cache: small blobs (verified in memory, written
 * once), a 3 MiB one (streamed to its temporary file), one blob under two
 * paths (fetched once); every byte verified, nothing left in tmp/. Then the
 * blob directories vanish under the same client handle (another process
 * cleaned the cache): the next pull makes them again. */
static void test_fetch_small_and_large(void **state) {
  fx *f = *state;
  char err[KC_ERRBUF_SIZE], seed[400], cache2[400], p[1200];
  start_server(f);
  snprintf(seed, sizeof seed, "%s/seed", f->dir);
  kc_client *c = client_for(seed, f->srv.url);
  size_t big = 3u << 20;
  char *blob = malloc(big + 1);
  for (size_t i = 0; i < big; i++)
    blob[i] = (char)('a' + (i * 7919 + i / 4096) % 26);
  blob[big] = '\0';
  const char *paths[] = {"a.txt", "sub/b.txt", "big.bin", "copy.txt"};
  const char *texts[] = {"alpha", "beta", blob, "alpha"};
  kc_manifest *m = manifest_of(c, paths, texts, 4), *got = NULL;
  assert_int_equal(kc_client_push(c, m, err), KC_OK);
  kc_client_free(c);
  snprintf(cache2, sizeof cache2, "%s/c2", f->dir);
  c = client_for(cache2, f->srv.url);
  for (int round = 0; round < 2; round++) {
    assert_int_equal(kc_client_pull(c, m->key, &got, err), KC_OK);
    assert_true(kc_manifest_equal(m, got));
    kc_manifest_free(got);
    void *data = NULL;
    size_t len = 0;
    assert_int_equal(kc_bundle_file_bytes(c, m, "big.bin", &data, &len, err),
                     KC_OK);
    assert_int_equal(len, big);
    assert_memory_equal(data, blob, big);
    free(data);
    snprintf(p, sizeof p, "%s/tmp", cache2);
    assert_int_equal(entries_in(p), 0);
    snprintf(p, sizeof p, "%s/blobs", cache2);
    assert_int_equal(entries_in(p), 3); /* "alpha" once */
    /* the two small blobs in one POST /v1/blobs/fetch, the large one (over
     * what is held in memory) with a GET */
    const char *posts = "kcached_requests_total{route=\"blobs_fetch\","
                        "method=\"POST\",status=\"200\"}";
    const char *gets = "kcached_requests_total{route=\"blobs\","
                       "method=\"GET\",status=\"200\"}";
    assert_true(kc_testsrv_metric_settle(&f->srv, posts, round + 1, 2000) ==
                round + 1);
    assert_true(kc_testsrv_metric_settle(&f->srv, gets, round + 1, 2000) ==
                round + 1);
    /* another process empties the cache under this handle */
    snprintf(p, sizeof p, "rm -rf '%s'/blobs/* '%s'/bundles/*", cache2, cache2);
    assert_int_equal(system(p), 0);
  }
  kc_client_free(c);
  kc_manifest_free(m);
  free(blob);
}

/* ---- many blobs per request (POST /v1/blobs/fetch) ---- */

/* A fake's bundle of one file "the real bytes", pulled into a fresh cache
 * (tag): kc_client_pull's code; *landed: whether the blob is cached. */
static kc_err pull_from(fx *f, fake *s, const char *key, const char *tag,
                        int *landed, char *err) {
  char cache[400], p[PATH_MAX], d[65];
  snprintf(cache, sizeof cache, "%s/%s", f->dir, tag);
  kc_client *c = client_for(cache, s->url);
  kc_manifest *got = NULL;
  kc_err e = kc_client_pull(c, key, &got, err);
  print_message("%s: %s: %s\n", tag, kc_err_name(e), e ? err : "");
  kc_sha256_hex("the real bytes", 14, d);
  kc_cache_blob_path(c, d, p, sizeof p);
  *landed = access(p, F_OK) == 0;
  snprintf(p, sizeof p, "%s/tmp", cache);
  assert_int_equal(entries_in(p), 0); /* no temporary file left */
  kc_manifest_free(got);
  kc_client_free(c);
  return e;
}

/* A batch answer is verified as a GET's: bytes that do not hash to their
 * name, a frame of another size, are refused and never land; an answer
 * that is not for the blob asked (or cut short) leaves it to a GET. */
static void test_fetch_batch_verified(void **state) {
  fx *f = *state;
  char err[KC_ERRBUF_SIZE], key[65], d[65], lie[200], other[200];
  kc_key_fields *k = NULL;
  char keys[2][65];
  kc_warmup *w = fault_warmup(f, &k, keys);
  char *man = fake_manifest(&k[0], "a.cubin", "the real bytes", key);
  kc_sha256_hex("the real bytes", 14, d);
  snprintf(lie, sizeof lie, "%s 14 raw\nthe fake bytes", d);
  fake s = {.bundle_body = man, .fetch_body = lie};
  fake_start(&s);
  int landed = 1;
  assert_int_equal(pull_from(f, &s, key, "lie", &landed, err),
                   KC_DIGEST_MISMATCH);
  assert_non_null(strstr(err, "hashes to"));
  assert_false(landed);
  assert_int_equal(__atomic_load_n(&s.gets, __ATOMIC_SEQ_CST), 0);
  fake_stop(&s); /* its thread may still read lie: a new fake for the next */
  snprintf(lie, sizeof lie, "%s 15 raw\nthe wrong bytes", d);
  fake sz = {.bundle_body = man, .fetch_body = lie};
  fake_start(&sz);
  assert_int_equal(pull_from(f, &sz, key, "size", &landed, err),
                   KC_DIGEST_MISMATCH);
  assert_false(landed);
  fake_stop(&sz);
  /* zstd items: a frame of other bytes, one that decodes to more than the
   * manifest's 14 (a bomb is cut at the 15th byte), one cut short */
  const char *contents[] = {"the fake bytes", "the real bytes and then more",
                            "the real bytes"};
  for (size_t i = 0; i < 3; i++) {
    char z[256], body[512];
    size_t zl = ZSTD_compress(z, sizeof z, contents[i], strlen(contents[i]), 1);
    assert_false(ZSTD_isError(zl));
    if (i == 2)
      zl -= 3;
    int hl = snprintf(body, sizeof body, "%s %zu zstd\n", d, zl);
    memcpy(body + hl, z, zl);
    fake t = {
        .bundle_body = man, .fetch_body = body, .fetch_len = (size_t)hl + zl};
    fake_start(&t);
    char tag[16];
    snprintf(tag, sizeof tag, "zstd%zu", i);
    assert_int_equal(pull_from(f, &t, key, tag, &landed, err),
                     KC_DIGEST_MISMATCH);
    assert_false(landed);
    assert_non_null(strstr(err, i == 0   ? "hashes to"
                                : i == 1 ? "decodes to more"
                                         : "cut short"));
    assert_int_equal(__atomic_load_n(&t.gets, __ATOMIC_SEQ_CST), 0);
    fake_stop(&t);
  }
  /* another blob's line, a cut answer: the GET brings the real bytes */
  const char *bodies[] = {other, "", "no line at all"};
  snprintf(other, sizeof other, "%064d 14 raw\nthe real bytes", 0);
  for (size_t i = 0; i < 3; i++) {
    fake t = {.bundle_body = man,
              .fetch_body = bodies[i],
              .blob_body = "the real bytes"};
    fake_start(&t);
    char tag[16];
    snprintf(tag, sizeof tag, "get%zu", i);
    assert_int_equal(pull_from(f, &t, key, tag, &landed, err), KC_OK);
    assert_true(landed);
    assert_int_equal(__atomic_load_n(&t.gets, __ATOMIC_SEQ_CST), 1);
    fake_stop(&t);
  }
  free(man);
  free(k);
  kc_warmup_free(w);
}

/* Enough small blobs in one batch that the writer thread verifies and
 * writes them (fetch_batch.c): one of 40 that hashes to another digest is
 * refused, from that thread, and never lands; the other 39 land, and no
 * temporary file is left. */
static void test_fetch_batch_writer(void **state) {
  fx *f = *state;
  enum { NF = 40, BAD = 23 };
  char err[KC_ERRBUF_SIZE], path[32], content[32], d[NF][65], *json = NULL;
  char cache[400], p[PATH_MAX];
  kc_key_fields *k = NULL;
  char keys[2][65];
  kc_warmup *w = fault_warmup(f, &k, keys);
  kc_manifest *m = kc_manifest_new();
  m->fields = k[0];
  for (int i = 0; i < NF; i++) {
    snprintf(path, sizeof path, "f%02d.bin", i);
    snprintf(content, sizeof content, "blob number %02d", i);
    kc_sha256_hex(content, strlen(content), d[i]);
    assert_int_equal(kc_manifest_add_file(m, path, d[i], strlen(content),
                                          KC_KIND_FILE, NULL, 0, err),
                     KC_OK);
  }
  assert_int_equal(kc_manifest_seal(m, err), KC_OK);
  assert_int_equal(kc_manifest_to_json(m, &json, err), KC_OK);
  /* the items in the manifest's order (the order they are asked for) */
  char *body = malloc(NF * 100), *at = body;
  for (size_t j = 0; j < m->n_files; j++) {
    int i = atoi(m->files[j].path + 1);
    at += sprintf(at, "%s 14 raw\nblob %s %02d", m->files[j].sha256,
                  i == BAD ? "NUMBER" : "number", i);
  }
  fake s = {.bundle_body = json, .fetch_body = body};
  fake_start(&s);
  snprintf(cache, sizeof cache, "%s/writer", f->dir);
  kc_client_opts o = {.url = s.url,
                      .cache_dir = cache,
                      .timeout_ms = 20000,
                      .connect_timeout_ms = 1000,
                      .parallel = 1};
  kc_client *c = NULL;
  assert_int_equal(kc_client_new(&o, &c, err), KC_OK);
  kc_manifest *got = NULL;
  assert_int_equal(kc_client_pull(c, m->key, &got, err), KC_DIGEST_MISMATCH);
  assert_non_null(strstr(err, "hashes to"));
  assert_null(got);
  assert_int_equal(__atomic_load_n(&s.fetches, __ATOMIC_SEQ_CST), 1);
  for (int i = 0; i < NF; i++) {
    kc_cache_blob_path(c, d[i], p, sizeof p);
    if ((access(p, F_OK) == 0) != (i != BAD))
      fail_msg("blob %d: %s", i, i == BAD ? "landed" : "missing");
  }
  snprintf(p, sizeof p, "%s/tmp", cache);
  assert_int_equal(entries_in(p), 0);
  kc_client_free(c);
  fake_stop(&s);
  free(body);
  free(json);
  kc_manifest_free(m);
  free(k);
  kc_warmup_free(w);
}

/* A server without the route (404 or 405): the blobs come with GETs, and
 * the client does not ask again. A missing item also goes to a GET. */
static void test_fetch_batch_fallback(void **state) {
  fx *f = *state;
  char err[KC_ERRBUF_SIZE], key[65], d[65], missing[200], cache[400];
  kc_key_fields *k = NULL;
  char keys[2][65];
  kc_warmup *w = fault_warmup(f, &k, keys);
  char *man = fake_manifest(&k[0], "a.cubin", "the real bytes", key);
  const int statuses[] = {404, 405};
  for (int i = 0; i < 2; i++) {
    fake s = {.bundle_body = man,
              .blob_body = "the real bytes",
              .fetch_status = statuses[i],
              .fetch_body = "{\"error\":\"not_found\",\"message\":\"x\"}"};
    fake_start(&s);
    snprintf(cache, sizeof cache, "%s/old%d", f->dir, i);
    kc_client *c = client_for(cache, s.url);
    for (int round = 0; round < 2; round++) {
      kc_manifest *got = NULL;
      assert_int_equal(kc_client_pull(c, key, &got, err), KC_OK);
      kc_manifest_free(got);
      char cmd[1000];
      snprintf(cmd, sizeof cmd, "rm -rf '%s'/blobs/* '%s'/bundles/*", cache,
               cache);
      assert_int_equal(system(cmd), 0);
    }
    assert_int_equal(__atomic_load_n(&s.fetches, __ATOMIC_SEQ_CST), 1);
    assert_int_equal(__atomic_load_n(&s.gets, __ATOMIC_SEQ_CST), 2);
    kc_client_free(c);
    fake_stop(&s);
  }
  kc_sha256_hex("the real bytes", 14, d);
  snprintf(missing, sizeof missing, "%s 0 missing\n", d);
  fake s = {
      .bundle_body = man, .blob_body = "the real bytes", .fetch_body = missing};
  fake_start(&s);
  int landed = 0;
  assert_int_equal(pull_from(f, &s, key, "missing", &landed, err), KC_OK);
  assert_true(landed);
  assert_int_equal(__atomic_load_n(&s.fetches, __ATOMIC_SEQ_CST), 1);
  assert_int_equal(__atomic_load_n(&s.gets, __ATOMIC_SEQ_CST), 1);
  fake_stop(&s);
  free(man);
  free(k);
  kc_warmup_free(w);
}

/* ---- zstd on the wire ---- */

/* Real cubins go up compressed (the client compresses what saves an
 * eighth), come down as the held frames (Accept-Encoding: zstd), decoded
 * while they stream, verified, and kept uncompressed in the cache. */
static void test_warm_zstd(void **state) {
  fx *f = *state;
  need_nvrtc();
  start_server(f);
  char err[KC_ERRBUF_SIZE], cache2[400];
  kc_client *c = client_for(f->cache, f->srv.url);
  kc_warmup *w = warmup_for(f, "w", "saxpy", "saxpy", "");
  kc_warm_report r;
  assert_int_equal(kc_warm(c, w, NULL, &r, err), KC_OK);
  assert_int_equal(count(&r, KC_WARM_BUILT), 2);
  kc_warm_report_free(&r);
  kc_client_free(c);
  assert_true(kc_testsrv_metric(&f->srv, "kcached_zstd_puts_total") >= 1);
  double sent = kc_testsrv_metric(&f->srv, "kcached_zstd_frames_sent_total");
  snprintf(cache2, sizeof cache2, "%s/cache2", f->dir);
  c = client_for(cache2, f->srv.url);
  assert_int_equal(kc_warm(c, w, NULL, &r, err), KC_OK);
  assert_int_equal(count(&r, KC_WARM_HIT_REMOTE), 2);
  kc_warm_report_free(&r);
  assert_true(kc_testsrv_metric(&f->srv, "kcached_zstd_frames_sent_total") >
              sent);
  blobs_equal(f->cache, cache2); /* the cache holds the content */
  kc_warmup_free(w);
  kc_client_free(c);
}

/* kc_client_pull_many: the bundles kcached holds come in one lookup and one
 * blob batch, verified, into the local cache; a key it lacks is NULL; no
 * server is KC_UNAVAILABLE with nothing pulled. */
static void test_pull_many(void **state) {
  fx *f = *state;
  start_server(f);
  char err[KC_ERRBUF_SIZE], cache2[400], keys[3][65];
  kc_client *c = client_for(f->cache, f->srv.url);
  const char *paths[] = {"a.bin", "sub/b.bin"};
  const char *texts[2][2] = {{"first a", "first b, longer"},
                             {"second a", "second b"}};
  for (int k = 0; k < 2; k++) {
    kc_manifest *m = manifest_of(c, paths, texts[k], 2);
    m->fields.bucket.dims[0].value = 10 + (uint64_t)k;
    assert_int_equal(kc_manifest_seal(m, err), KC_OK);
    assert_int_equal(kc_client_push(c, m, err), KC_OK);
    memcpy(keys[k], m->key, 65);
    kc_manifest_free(m);
  }
  memset(keys[2], 'e', 64);
  keys[2][64] = '\0';
  kc_client_free(c);
  snprintf(cache2, sizeof cache2, "%s/pm", f->dir);
  c = client_for(cache2, f->srv.url);
  const char *ks[] = {keys[0], keys[1], keys[2]};
  kc_manifest *out[3];
  assert_int_equal(kc_client_pull_many(c, ks, 3, out, err), KC_OK);
  for (int k = 0; k < 2; k++) {
    kc_manifest *cached = NULL;
    assert_non_null(out[k]);
    assert_string_equal(out[k]->key, keys[k]);
    assert_int_equal(kc_cache_bundle_get(c, keys[k], &cached, err), KC_OK);
    kc_manifest_free(cached);
    kc_manifest_free(out[k]);
  }
  assert_null(out[2]);
  kc_client_free(c);
  c = client_for(cache2, "http://127.0.0.1:1");
  out[0] = out[1] = out[2] = (kc_manifest *)1;
  assert_int_equal(kc_client_pull_many(c, ks, 3, out, err), KC_UNAVAILABLE);
  assert_null(out[0]);
  assert_null(out[1]);
  assert_null(out[2]);
  kc_client_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      CT(test_fetch_batch_verified),
      CT(test_fetch_batch_fallback),
      CT(test_fetch_batch_writer),
      CT(test_fetch_small_and_large),
      CT(test_warm_zstd),
      CT(test_pull_many),
  };
  return clienttest_run("client_fetch", tests, sizeof tests / sizeof tests[0]);
}
