/* test_client_keys.c: libkcache without a server: keys (pinned values, the
 * NVRTC version in the key, bucket labels), the local cache, the lookup
 * split, materialize and its path safety. NVRTC really compiles where a
 * test needs it (tests/kernels); without it those tests skip, unless
 * CI=true, where they fail. Fixture and helpers: clienttest.h. */
#include "clienttest.h"

#include "kc_gpu.h"

/* ---- unit: keys ---- */

static void test_keys_pinned(void **state) {
  fx *f = *state;
  /* A pinned NVRTC version: keys are computable without a toolkit. */
  kc_warmup *w = warmup_for(f, "k", "saxpy", "saxpy",
                            ",\"nvrtc\":\"13.0\",\"cuda\":\"13.0\"");
  kc_key_fields *k = NULL;
  size_t n = 0;
  char err[KC_ERRBUF_SIZE], k0[65], k1[65];
  assert_int_equal(kc_warm_keys(w, NULL, 0, &k, &n, err), KC_OK);
  assert_int_equal(n, 2);
  assert_string_equal(k[0].arch, "sm_80");
  assert_int_equal(k[1].bucket.dims[0].value, 4);
  assert_int_equal(kc_key_compute(&k[0], k0, err), KC_OK);
  assert_int_equal(kc_key_compute(&k[1], k1, err), KC_OK);
  assert_string_not_equal(k0, k1);
  char b0[65];
  memcpy(b0, k[0].build, sizeof b0);
  free(k);
  /* --arch overrides; two archs per bucket, bucket-major. */
  const char *archs[] = {"sm_90a", "sm_86"};
  assert_int_equal(kc_warm_keys(w, archs, 2, &k, &n, err), KC_OK);
  assert_int_equal(n, 4);
  assert_string_equal(k[0].arch, "sm_90a");
  assert_string_equal(k[1].arch, "sm_86");
  assert_string_equal(k[0].build, b0); /* same builder inputs */
  free(k);
  kc_warmup_free(w);
  /* Other options: another build hash. */
  kc_warmup *w2 = warmup_for(f, "k2", "saxpy", "scale",
                             ",\"nvrtc\":\"13.0\",\"cuda\":\"13.0\"");
  assert_int_equal(kc_warm_keys(w2, NULL, 0, &k, &n, err), KC_OK);
  assert_string_not_equal(k[0].build, b0);
  free(k);
  kc_warmup_free(w2);
}

static void test_keys_nvrtc_version(void **state) {
  fx *f = *state;
  need_nvrtc();
  char v[16], err[KC_ERRBUF_SIZE];
  kc_key_fields *k = NULL;
  size_t n = 0;
  assert_int_equal(kc_gpu_nvrtc_version(v, err), KC_OK);
  kc_warmup *w = warmup_for(f, "k", "saxpy", "saxpy", "");
  assert_int_equal(kc_warm_keys(w, NULL, 0, &k, &n, err), KC_OK);
  int seen = 0;
  for (size_t i = 0; i < k[0].n_tools; i++)
    if (!strcmp(k[0].tools[i].name, "nvrtc") ||
        !strcmp(k[0].tools[i].name, "cuda"))
      seen += !strcmp(k[0].tools[i].value, v);
  assert_int_equal(seen, 2);
  free(k);
  kc_warmup_free(w);
}

static void test_bucket_label_and_hash(void **state) {
  fx *f = *state;
  kc_bucket b = {.n = 2};
  strcpy(b.dims[0].name, "seq");
  b.dims[0].value = 1024;
  strcpy(b.dims[1].name, "batch");
  b.dims[1].value = 8;
  char label[64], p1[400], p2[400], h1[65], h2[65], err[KC_ERRBUF_SIZE];
  kc_bucket_label(&b, label, sizeof label);
  assert_string_equal(label, "batch=8,seq=1024");
  snprintf(p1, sizeof p1, "%s/a.bin", f->dir);
  snprintf(p2, sizeof p2, "%s/b.bin", f->dir);
  write_text(p1, "weights");
  write_text(p2, "config");
  const char *ab[] = {p1, p2}, *ba[] = {p2, p1};
  assert_int_equal(kc_model_hash(ab, 2, h1, err), KC_OK);
  assert_int_equal(kc_model_hash(ba, 2, h2, err), KC_OK);
  assert_true(kc_is_hex64(h1));
  assert_string_not_equal(h1, h2);
}

/* ---- unit: local cache, materialize, path safety ---- */

static void test_local_cache(void **state) {
  fx *f = *state;
  char err[KC_ERRBUF_SIZE], p[PATH_MAX];
  kc_client *c = client_for(f->cache, NULL);
  const char *paths[] = {"a.txt", "sub/b.txt"}, *texts[] = {"alpha", "beta"};
  kc_manifest *m = manifest_of(c, paths, texts, 2), *got = NULL;
  assert_int_equal(kc_cache_bundle_get(c, m->key, &got, err), KC_NOT_FOUND);
  assert_int_equal(kc_cache_bundle_put(c, m, err), KC_OK);
  assert_int_equal(kc_cache_bundle_get(c, m->key, &got, err), KC_OK);
  assert_true(kc_manifest_equal(m, got));
  kc_manifest_free(got);
  /* A blob damaged on disk: detected, removed, never served. */
  kc_cache_blob_path(c, m->files[0].sha256, p, sizeof p);
  write_text(p, "alphX");
  assert_int_equal(kc_cache_bundle_get(c, m->key, &got, err), KC_CORRUPT);
  assert_null(got);
  assert_int_not_equal(access(p, F_OK), 0);
  void *data = NULL;
  size_t len = 0;
  assert_int_equal(kc_bundle_file_bytes(c, m, "a.txt", &data, &len, err),
                   KC_NOT_FOUND);
  assert_int_equal(kc_bundle_file_bytes(c, m, "sub/b.txt", &data, &len, err),
                   KC_OK);
  assert_int_equal(len, 4);
  assert_memory_equal(data, "beta", 4);
  free(data);
  kc_manifest_free(m);
  kc_client_free(c);
}

/* A lookup of 256 keys or more goes as two requests on two connections,
 * parsed on two threads (client.c, lookup_split): of 520 keys, every third
 * is on the server, in both halves; each manifest lands at its own index
 * and the others stay NULL. With the server gone, both halves fail and the
 * lookup says so, with nothing found. */
static void test_lookup_split(void **state) {
  fx *f = *state;
  enum { N = 520 };
  static char keys[N][65];
  const char *ks[N], *paths[] = {"a.txt"}, *texts[] = {"split"};
  kc_manifest *got[N];
  char err[KC_ERRBUF_SIZE] = "";
  start_server(f);
  kc_client *c = client_for(f->cache, f->srv.url);
  kc_manifest *m = manifest_of(c, paths, texts, 1);
  for (size_t i = 0; i < N; i++) {
    m->fields.bucket.dims[0].value = 100 + i;
    assert_int_equal(kc_manifest_seal(m, err), KC_OK);
    memcpy(keys[i], m->key, sizeof keys[i]);
    ks[i] = keys[i];
    if (i % 3 == 0 && kc_client_push(c, m, err) != KC_OK)
      fail_msg("push %zu: %s", i, err);
  }
  kc_manifest_free(m);
  const char *posts = "kcached_requests_total{route=\"lookup\","
                      "method=\"POST\",status=\"200\"}";
  double before = kc_testsrv_metric(&f->srv, posts);
  assert_int_equal(kc_client_lookup(c, ks, N, got, err), KC_OK);
  /* two requests, one per half (none before: -1) */
  before = before < 0 ? 0 : before;
  assert_true(kc_testsrv_metric_settle(&f->srv, posts, before + 2, 2000) ==
              before + 2);
  for (size_t i = 0; i < N; i++) {
    if (i % 3) {
      assert_null(got[i]);
      continue;
    }
    assert_non_null(got[i]);
    assert_string_equal(got[i]->key, ks[i]);
    assert_int_equal(got[i]->fields.bucket.dims[0].value, 100 + i);
    kc_manifest_free(got[i]);
  }
  assert_int_equal(kc_testsrv_stop(&f->srv), 0);
  assert_int_equal(kc_client_lookup(c, ks, N, got, err), KC_UNAVAILABLE);
  assert_non_null(strstr(err, "/v1/lookup"));
  for (size_t i = 0; i < N; i++)
    assert_null(got[i]);
  kc_client_free(c);
}

static void test_materialize(void **state) {
  fx *f = *state;
  char err[KC_ERRBUF_SIZE], p[PATH_MAX], *text = NULL;
  kc_client *c = client_for(f->cache, NULL);
  const char *paths[] = {"x/y/z.cubin", "top.ptx"}, *texts[] = {"zz", "tt"};
  kc_manifest *m = manifest_of(c, paths, texts, 2);
  assert_int_equal(kc_materialize(c, m, f->out, err), KC_OK);
  snprintf(p, sizeof p, "%s/x/y/z.cubin", f->out);
  assert_int_equal(kc_read_file(p, &text, NULL, err), KC_OK);
  assert_string_equal(text, "zz");
  free(text);
  /* Again over existing files: replaced, not an error. */
  assert_int_equal(kc_materialize(c, m, f->out, err), KC_OK);
  kc_manifest_free(m);
  kc_client_free(c);
}

static void test_materialize_never_escapes(void **state) {
  fx *f = *state;
  char err[KC_ERRBUF_SIZE], outside[400], link[400], p[PATH_MAX];
  kc_client *c = client_for(f->cache, NULL);
  snprintf(outside, sizeof outside, "%s/outside", f->dir);
  assert_int_equal(mkdir(outside, 0755), 0);
  assert_int_equal(mkdir(f->out, 0755), 0);
  /* A symlink planted in the target directory must not be followed. */
  snprintf(link, sizeof link, "%s/sub", f->out);
  assert_int_equal(symlink(outside, link), 0);
  const char *paths[] = {"sub/evil.txt"}, *texts[] = {"pwned"};
  kc_manifest *m = manifest_of(c, paths, texts, 1);
  assert_int_equal(kc_materialize(c, m, f->out, err), KC_UNSAFE_PATH);
  snprintf(p, sizeof p, "%s/evil.txt", outside);
  assert_int_not_equal(access(p, F_OK), 0);
  /* A path that escaped validation (set after sealing) is still refused. */
  free(m->files[0].path);
  m->files[0].path = strdup("../escape.txt");
  assert_int_not_equal(kc_materialize(c, m, f->out, err), KC_OK);
  snprintf(p, sizeof p, "%s/escape.txt", f->dir);
  assert_int_not_equal(access(p, F_OK), 0);
  kc_manifest_free(m);
  kc_client_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      CT(test_keys_pinned),
      CT(test_keys_nvrtc_version),
      CT(test_bucket_label_and_hash),
      CT(test_local_cache),
      CT(test_lookup_split),
      CT(test_materialize),
      CT(test_materialize_never_escapes),
  };
  return clienttest_run("client_keys", tests, sizeof tests / sizeof tests[0]);
}
