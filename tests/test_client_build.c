/* test_client_build.c: kc_warm and `kcache warm` building: without a server
 * (offline, a failing build, stale metadata, the command builder), and end
 * to end against the real kcached (tests/testsrv.h): cold then remote, the
 * CLI round trip, server down, concurrent warmers and leases, the deadline,
 * a flipped blob on the server, tokens, HTTPS. NVRTC really compiles
 * (tests/kernels); without it those tests skip, unless CI=true, where they
 * fail. Fixture and helpers: clienttest.h. */
#include "clienttest.h"

/* ---- warmup without a server ---- */

static void test_warm_offline(void **state) {
  fx *f = *state;
  need_nvrtc();
  char err[KC_ERRBUF_SIZE], p[PATH_MAX];
  kc_client *c = client_for(f->cache, NULL);
  kc_warmup *w = warmup_for(f, "w", "saxpy", "saxpy", "");
  kc_warm_report r;
  kc_warm_opts o = {.out_dir = f->out};
  assert_int_equal(kc_warm(c, w, &o, &r, err), KC_OK);
  assert_int_equal(count(&r, KC_WARM_BUILT), 2);
  assert_int_equal(r.items[0].uploaded, 0);
  snprintf(p, sizeof p, "%s/sm_80/batch=4/saxpy.cubin", f->out);
  assert_int_equal(access(p, F_OK), 0);
  kc_warm_report_free(&r);
  /* What a service does at run time: bucket -> bundle -> cubin bytes. */
  kc_manifest *m = NULL;
  void *img = NULL;
  size_t len = 0;
  assert_int_equal(kc_warm_bundle(c, w, &w->buckets[1], "sm_80", &m, err),
                   KC_OK);
  assert_int_equal(kc_bundle_file_bytes(c, m, "saxpy.cubin", &img, &len, err),
                   KC_OK);
  assert_true(len > 4 && !memcmp(img, "\177ELF", 4));
  free(img);
  kc_manifest_free(m);
  assert_int_equal(kc_warm_bundle(c, w, &w->buckets[1], "sm_86", &m, err),
                   KC_NOT_FOUND);
  /* Second run: the local cache. */
  assert_int_equal(kc_warm(c, w, &o, &r, err), KC_OK);
  assert_int_equal(count(&r, KC_WARM_HIT_LOCAL), 2);
  char *json = NULL;
  assert_int_equal(kc_warm_report_json(&r, &json, err), KC_OK);
  assert_non_null(strstr(json, "\"hit-local\": 2"));
  free(json);
  kc_warm_report_free(&r);
  kc_warmup_free(w);
  kc_client_free(c);
}

static void test_warm_build_failure(void **state) {
  fx *f = *state;
  need_nvrtc();
  char err[KC_ERRBUF_SIZE], out[8192], p[400];
  kc_client *c = client_for(f->cache, NULL);
  kc_warmup *w = warmup_for(f, "broken", "broken", "broken", "");
  kc_warm_report r;
  assert_int_equal(kc_warm(c, w, NULL, &r, err), KC_BUILD_FAILED);
  assert_int_equal(count(&r, KC_WARM_FAILED), 2);
  assert_non_null(strstr(r.items[0].message, "undeclared_thing"));
  kc_warm_report_free(&r);
  kc_warmup_free(w);
  kc_client_free(c);
  /* Exit status by policy: the service starts anyway unless --strict. */
  snprintf(p, sizeof p, "%s/broken.json", f->dir);
  assert_int_equal(
      run_cli(out, sizeof out, "warm %s --cache-dir %s --quiet", p, f->cache),
      0);
  assert_int_equal(run_cli(out, sizeof out,
                           "warm %s --cache-dir %s --quiet --strict", p,
                           f->cache),
                   1);
}

/* Keys may take NVRTC's version from install metadata without loading the
 * library (kc_gpu_nvrtc_version_cached); a build asks the NVRTC it loads.
 * When they disagree (a library replaced by hand under an old version.json)
 * the build refuses: its output would be stored under a key naming another
 * NVRTC. The library is a copy of the gpu tests' fake NVRTC (99.9). */
static void test_warm_stale_metadata(void **state) {
  fx *f = *state;
  char err[KC_ERRBUF_SIZE], lib[400], *data = NULL;
  size_t len = 0;
  const char *old = getenv("KCACHE_NVRTC");
  char *saved = old ? strdup(old) : NULL;
  snprintf(lib, sizeof lib, "%s/tk", f->dir);
  assert_int_equal(mkdir(lib, 0755), 0);
  snprintf(lib, sizeof lib, "%s/tk/version.json", f->dir);
  write_text(lib, "{\"cuda_nvrtc\": {\"version\": \"13.7.0\"}}");
  snprintf(lib, sizeof lib, "%s/tk/lib64", f->dir);
  assert_int_equal(mkdir(lib, 0755), 0);
  snprintf(lib, sizeof lib, "%s/tk/lib64/libnvrtc.so.13", f->dir);
  assert_int_equal(kc_read_file(KC_FAKE_NVRTC, &data, &len, NULL), KC_OK);
  assert_int_equal(kc_write_file_atomic(lib, data, len, NULL), KC_OK);
  free(data);
  setenv("KCACHE_NVRTC", lib, 1);
  kc_client *c = client_for(f->cache, NULL);
  kc_warmup *w = warmup_for(f, "stale", "saxpy", "saxpy", "");
  kc_key_fields *k = NULL;
  size_t n = 0;
  assert_int_equal(kc_warm_keys(w, NULL, 0, &k, &n, err), KC_OK);
  int named = 0;
  for (size_t i = 0; i < k[0].n_tools; i++)
    named += !strcmp(k[0].tools[i].name, "nvrtc") &&
             !strcmp(k[0].tools[i].value, "13.7");
  assert_int_equal(named, 1); /* from version.json, nothing loaded */
  free(k);
  kc_warm_report r;
  assert_int_equal(kc_warm(c, w, NULL, &r, err), KC_BUILD_FAILED);
  assert_int_equal(count(&r, KC_WARM_FAILED), 2);
  assert_non_null(strstr(r.items[0].message, "another NVRTC than the 99.9"));
  kc_warm_report_free(&r);
  kc_warmup_free(w);
  kc_client_free(c);
  if (saved)
    setenv("KCACHE_NVRTC", saved, 1);
  else
    unsetenv("KCACHE_NVRTC");
  free(saved);
}

static void test_warm_command_builder(void **state) {
  fx *f = *state;
  char err[KC_ERRBUF_SIZE], p[400], *text = NULL;
  snprintf(p, sizeof p, "%s/cmd.json", f->dir);
  write_text(p,
             "{\"schema\":\"kcache.warmup/v1\",\"model\":{\"name\":\"t\","
             "\"hash\":\"%s\"},\"archs\":[\"sm_90a\"],\"builder\":{"
             "\"command\":[\"sh\",\"-c\",\"mkdir -p {out}/d && echo "
             "{batch},{arch} > {out}/d/info.txt\"],\"timeout_s\":30},"
             "\"buckets\":[{\"batch\":3}]}",
             MODEL);
  kc_warmup *w = NULL;
  assert_int_equal(kc_warmup_load(p, &w, err), KC_OK);
  kc_client *c = client_for(f->cache, NULL);
  kc_warm_report r;
  kc_warm_opts o = {.out_dir = f->out};
  assert_int_equal(kc_warm(c, w, &o, &r, err), KC_OK);
  assert_int_equal(count(&r, KC_WARM_BUILT), 1);
  snprintf(p, sizeof p, "%s/sm_90a/batch=3/d/info.txt", f->out);
  assert_int_equal(kc_read_file(p, &text, NULL, err), KC_OK);
  assert_string_equal(text, "3,sm_90a\n");
  free(text);
  kc_warm_report_free(&r);
  kc_warmup_free(w);
  kc_client_free(c);
}

/* ---- end to end against kcached ---- */

static void test_cold_then_remote(void **state) {
  fx *f = *state;
  need_nvrtc();
  start_server(f);
  char err[KC_ERRBUF_SIZE], cache2[400];
  kc_client *c = client_for(f->cache, f->srv.url);
  kc_warmup *w = warmup_for(f, "w", "saxpy", "saxpy", "");
  kc_warm_report r;
  assert_int_equal(kc_warm(c, w, NULL, &r, err), KC_OK);
  assert_int_equal(count(&r, KC_WARM_BUILT), 2);
  assert_true(r.items[0].uploaded && r.items[1].uploaded);
  assert_int_equal(r.server_down, 0);
  kc_warm_report_free(&r);
  kc_client_free(c);
  /* An empty local cache: everything from the server, nothing built. */
  snprintf(cache2, sizeof cache2, "%s/cache2", f->dir);
  c = client_for(cache2, f->srv.url);
  assert_int_equal(kc_warm(c, w, NULL, &r, err), KC_OK);
  assert_int_equal(count(&r, KC_WARM_HIT_REMOTE), 2);
  assert_int_equal(count(&r, KC_WARM_BUILT), 0);
  assert_true(r.bytes_fetched > 0);
  kc_warm_report_free(&r);
  blobs_equal(f->cache, cache2);
  /* A blob damaged in the local cache is noticed and fetched again. */
  kc_key_fields *k = NULL;
  size_t n = 0;
  char key[65], p[PATH_MAX];
  kc_manifest *m = NULL;
  assert_int_equal(kc_warm_keys(w, NULL, 0, &k, &n, err), KC_OK);
  kc_key_compute(&k[0], key, err);
  free(k);
  assert_int_equal(kc_cache_bundle_get(c, key, &m, err), KC_OK);
  kc_cache_blob_path(c, m->files[0].sha256, p, sizeof p);
  FILE *fp = fopen(p, "r+b");
  assert_non_null(fp);
  fputc(0xff, fp);
  fclose(fp);
  kc_manifest_free(m);
  assert_int_equal(kc_warm(c, w, NULL, &r, err), KC_OK);
  assert_int_equal(count(&r, KC_WARM_HIT_REMOTE), 1);
  assert_int_equal(count(&r, KC_WARM_HIT_LOCAL), 1);
  kc_warm_report_free(&r);
  blobs_equal(f->cache, cache2);
  kc_warmup_free(w);
  kc_client_free(c);
}

static void test_cli_roundtrip(void **state) {
  fx *f = *state;
  need_nvrtc();
  start_server(f);
  char out[16384], p[700], key[65], dir[300];
  snprintf(p, sizeof p, "%s/w.json", f->dir);
  kc_warmup_free(warmup_for(f, "w", "saxpy", "saxpy", ""));
  assert_int_equal(run_cli(out, sizeof out,
                           "warm %s --url %s --cache-dir %s --json --quiet", p,
                           f->srv.url, f->cache),
                   0);
  assert_non_null(strstr(out, "\"built\": 2"));
  char *k = strstr(out, "\"key\": \"");
  assert_non_null(k);
  memcpy(key, k + 8, 64);
  key[64] = '\0';
  snprintf(dir, sizeof dir, "%s/pulled", f->dir);
  assert_int_equal(run_cli(out, sizeof out,
                           "pull %s %s --url %s "
                           "--cache-dir %s/c2",
                           key, dir, f->srv.url, f->dir),
                   0);
  snprintf(p, sizeof p, "%s/saxpy.cubin", dir);
  assert_int_equal(access(p, F_OK), 0);
  /* push of the pulled directory: identical bundle, accepted. */
  assert_int_equal(run_cli(out, sizeof out,
                           "push %s --url %s --cache-dir "
                           "%s/c3",
                           dir, f->srv.url, f->dir),
                   0);
  assert_memory_equal(out, key, 64);
  assert_int_equal(run_cli(out, sizeof out, "put %s --url %s", p, f->srv.url),
                   0);
  char digest[65];
  memcpy(digest, out, 64);
  digest[64] = '\0';
  assert_int_equal(
      run_cli(NULL, 0, "get %s -o %s/got --url %s", digest, f->dir, f->srv.url),
      0);
  assert_int_equal(
      run_cli(out, sizeof out, "ls %s --url %s", MODEL, f->srv.url), 0);
  assert_non_null(strstr(out, key));
  /* stat: a human form (the bundles just pushed, no --max-bytes said
   * plainly), and the server's JSON with --json */
  assert_int_equal(run_cli(out, sizeof out, "stat --url %s", f->srv.url), 0);
  assert_non_null(strstr(out, "no --max-bytes limit"));
  assert_non_null(strstr(out, "bundles   2 in")); /* the warm built 2 */
  assert_int_equal(run_cli(out, sizeof out, "stat --json --url %s", f->srv.url),
                   0);
  assert_non_null(strstr(out, "\"max_bytes\":0"));
}

static void test_server_down(void **state) {
  fx *f = *state;
  need_nvrtc();
  char err[KC_ERRBUF_SIZE], out[8192], p[400];
  /* Port 1 on loopback: nothing listens; connect fails at once. */
  kc_client *c = client_for(f->cache, "http://127.0.0.1:1");
  kc_warmup *w = warmup_for(f, "w", "saxpy", "saxpy", "");
  kc_warm_report r;
  assert_int_equal(kc_warm(c, w, NULL, &r, err), KC_OK);
  assert_int_equal(count(&r, KC_WARM_BUILT), 2);
  assert_int_equal(r.server_down, 1);
  assert_non_null(strstr(r.warning, "unreachable"));
  kc_warm_report_free(&r);
  kc_warmup_free(w);
  kc_client_free(c);
  /* CLI: all ready, so exit 0 even with --strict; the warning is shown. */
  snprintf(p, sizeof p, "%s/w.json", f->dir);
  assert_int_equal(run_cli(out, sizeof out,
                           "warm %s --url http://127.0.0.1:1 --cache-dir "
                           "%s/c2 --strict --quiet",
                           p, f->dir),
                   0);
  assert_non_null(strstr(out, "warning"));
  /* --no-build with the server down: nothing ready; --strict fails. */
  assert_int_equal(run_cli(out, sizeof out,
                           "warm %s --url http://127.0.0.1:1 --cache-dir "
                           "%s/c3 --strict --no-build --quiet",
                           p, f->dir),
                   1);
}

/* Two warmers at once on an empty cache (two processes, as two replicas
 * would be): each key is built once. */
static void test_two_warmers(void **state) {
  fx *f = *state;
  need_nvrtc();
  start_server(f);
  char cmd[2][1200], out[2][16384], p[400];
  FILE *pp[2];
  kc_warmup_free(warmup_for(f, "w", "saxpy", "saxpy", ""));
  snprintf(p, sizeof p, "%s/w.json", f->dir);
  for (int i = 0; i < 2; i++) {
    snprintf(cmd[i], sizeof cmd[i],
             "%s warm %s --url %s --cache-dir %s/c%d --json --quiet "
             "--deadline 60 2>/dev/null",
             KCACHE_BIN, p, f->srv.url, f->dir, i);
    pp[i] = popen(cmd[i], "r");
    assert_non_null(pp[i]);
  }
  size_t built = 0;
  for (int i = 0; i < 2; i++) {
    size_t n = fread(out[i], 1, sizeof out[i] - 1, pp[i]);
    out[i][n] = '\0';
    assert_int_equal(pclose(pp[i]), 0);
    assert_int_equal(json_count(out[i], "failed"), 0);
    built += json_count(out[i], "built");
  }
  assert_int_equal(built, 2); /* 2 keys, each built once fleet-wide */
  char c0[400], c1[400];
  snprintf(c0, sizeof c0, "%s/c0", f->dir);
  snprintf(c1, sizeof c1, "%s/c1", f->dir);
  blobs_equal(c0, c1);
}

/* The deadline bounds a hung build and a lease nobody finishes. */
static void test_deadline(void **state) {
  fx *f = *state;
  need_nvrtc();
  start_server(f);
  char err[KC_ERRBUF_SIZE], token[KC_LEASE_TOKEN_MAX];
  kc_client *c = client_for(f->cache, f->srv.url);
  kc_warmup *w = warmup_for(f, "slow", "slow", "slow", "");
  kc_warm_report r;
  kc_warm_opts o = {.deadline_s = 1.5};
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  kc_err e = kc_warm(c, w, &o, &r, err);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs =
      (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
  assert_true(e == KC_DEADLINE || e == KC_TIMEOUT);
  assert_int_equal(count(&r, KC_WARM_FAILED), 2);
  assert_true(secs < 4.0);
  kc_warm_report_free(&r);
  kc_warmup_free(w);
  /* Someone else holds the lease of every key and never finishes. */
  w = warmup_for(f, "w", "saxpy", "saxpy", "");
  kc_key_fields *k = NULL;
  size_t n = 0;
  assert_int_equal(kc_warm_keys(w, NULL, 0, &k, &n, err), KC_OK);
  kc_client *other = client_for(f->cache, f->srv.url);
  for (size_t i = 0; i < n; i++) {
    char key[65];
    kc_lease_state st;
    kc_key_compute(&k[i], key, err);
    assert_int_equal(
        kc_client_lease_take(other, key, 60, &st, token, NULL, err), KC_OK);
    assert_int_equal(st, KC_LEASE_GRANTED);
  }
  free(k);
  o.deadline_s = 1.0;
  o.lease_wait_s = -1; /* wait on the holder (no build here): the deadline */
  clock_gettime(CLOCK_MONOTONIC, &t0);
  e = kc_warm(c, w, &o, &r, err);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  secs = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
  assert_int_equal(e, KC_DEADLINE);
  assert_int_equal(count(&r, KC_WARM_FAILED), 2);
  assert_int_equal(count(&r, KC_WARM_BUILT), 0);
  assert_true(secs < 3.0);
  kc_warm_report_free(&r);
  kc_client_free(other);
  kc_warmup_free(w);
  kc_client_free(c);
}

/* A blob whose stored bytes were flipped inside kcached's LMDB file: the
 * server serves them, the client detects it, never uses them, rebuilds, and
 * offers the rebuilt blobs back, which repairs the server's copy: the next
 * warm from an empty cache uses the server's bundle again. */
static void test_server_blob_flipped(void **state) {
  fx *f = *state;
  need_nvrtc();
  /* the scrub off: here the client is the one to find the rot; blobs
   * held raw, so the content's bytes are there to flip */
  const char *const args[] = {"--scrub-rate", "0", "--compress-level", "0",
                              NULL};
  start_server_with(f, args);
  char err[KC_ERRBUF_SIZE], key[65], p[PATH_MAX], cache2[400], d[65];
  kc_client *c = client_for(f->cache, f->srv.url);
  kc_warmup *w = warmup_for(f, "w", "saxpy", "saxpy", "");
  kc_warm_report r;
  assert_int_equal(kc_warm(c, w, NULL, &r, err), KC_OK);
  memcpy(key, r.items[0].key, sizeof key);
  kc_warm_report_free(&r);
  kc_manifest *m = NULL;
  assert_int_equal(kc_cache_bundle_get(c, key, &m, err), KC_OK);
  size_t blen = 0;
  kc_cache_blob_path(c, m->files[0].sha256, p, sizeof p);
  memcpy(d, m->files[0].sha256, sizeof d);
  char *blob = NULL;
  assert_int_equal(kc_read_file(p, &blob, &blen, err), KC_OK);
  kc_manifest_free(m);
  kc_client_free(c);
  /* Stop the server, flip a byte of the stored value, start again. */
  assert_int_equal(kc_testsrv_stop(&f->srv), 0);
  assert_true(kc_testsrv_rot(&f->srv, blob, blen) >= 1);
  free(blob);
  assert_int_equal(kc_testsrv_restart(&f->srv), 0);
  snprintf(cache2, sizeof cache2, "%s/cache2", f->dir);
  c = client_for(cache2, f->srv.url);
  assert_int_equal(kc_warm(c, w, NULL, &r, err), KC_OK);
  for (size_t i = 0; i < r.n_items; i++) {
    if (strcmp(r.items[i].key, key) != 0)
      continue;
    assert_int_equal(r.items[i].status, KC_WARM_BUILT);
    assert_int_equal(r.items[i].uploaded, 0);
    assert_non_null(strstr(r.items[i].message, "hash"));
  }
  assert_int_equal(count(&r, KC_WARM_HIT_REMOTE), 1);
  kc_warm_report_free(&r);
  /* What the local cache holds hashes right. */
  assert_int_equal(kc_cache_bundle_get(c, key, &m, err), KC_OK);
  kc_manifest_free(m);
  /* The server's copy was repaired by the blobs offered back. */
  void *data = NULL;
  size_t len = 0;
  assert_int_equal(kc_client_blob_get(c, d, &data, &len, err), KC_OK);
  free(data);
  kc_client_free(c);
  snprintf(cache2, sizeof cache2, "%s/cache3", f->dir);
  c = client_for(cache2, f->srv.url);
  assert_int_equal(kc_warm(c, w, NULL, &r, err), KC_OK);
  assert_int_equal(count(&r, KC_WARM_HIT_REMOTE), r.n_items);
  kc_warm_report_free(&r);
  kc_client_free(c);
  kc_warmup_free(w);
}

/* Tokens: write uploads; read fetches but builds for itself; none is 401
 * and still builds locally, with a warning. */
static void test_tokens(void **state) {
  fx *f = *state;
  need_nvrtc();
  char err[KC_ERRBUF_SIZE], tokens[400], wtok[256] = "", rtok[256] = "";
  snprintf(tokens, sizeof tokens, "%s/tokens", f->dir);
  make_token("write", "ci", tokens, wtok, sizeof wtok);
  make_token("read", "svc", tokens, rtok, sizeof rtok);
  const char *const args[] = {"--tokens", tokens, NULL};
  start_server_with(f, args);
  kc_warmup *w = warmup_for(f, "w", "saxpy", "saxpy", "");
  kc_warmup *w2 = warmup_for(f, "w2", "batch8", "fill8", "");
  struct {
    const char *tok, *cache;
  } who[] = {{NULL, "none"}, {rtok, "read"}, {wtok, "write"}};
  kc_warm_report r;
  for (int k = 0; k < 3; k++) {
    char cache[400];
    kc_client *c = NULL;
    snprintf(cache, sizeof cache, "%s/%s", f->dir, who[k].cache);
    kc_client_opts o = {
        .url = f->srv.url, .token = who[k].tok, .cache_dir = cache};
    assert_int_equal(kc_client_new(&o, &c, err), KC_OK);
    assert_int_equal(kc_warm(c, w, NULL, &r, err), KC_OK);
    assert_int_equal(count(&r, KC_WARM_BUILT), 2);
    assert_int_equal(r.items[0].uploaded, k == 2);
    if (k < 2)
      assert_non_null(strstr(r.warning, "refused"));
    kc_warm_report_free(&r);
    kc_client_free(c);
  }
  /* The read token now fetches what the write token stored. */
  char cache[400];
  kc_client *c = NULL;
  snprintf(cache, sizeof cache, "%s/read2", f->dir);
  kc_client_opts o = {.url = f->srv.url, .token = rtok, .cache_dir = cache};
  assert_int_equal(kc_client_new(&o, &c, err), KC_OK);
  assert_int_equal(kc_warm(c, w, NULL, &r, err), KC_OK);
  assert_int_equal(count(&r, KC_WARM_HIT_REMOTE), 2);
  kc_warm_report_free(&r);
  /* batch8.cu compiles only for batch=8: bucket 1 fails, reported. */
  assert_int_equal(kc_warm(c, w2, NULL, &r, err), KC_BUILD_FAILED);
  assert_int_equal(count(&r, KC_WARM_FAILED), 2);
  kc_warm_report_free(&r);
  kc_client_free(c);
  kc_warmup_free(w);
  kc_warmup_free(w2);
}

/* HTTPS: the server's certificate is checked against --cacert. */
static void test_https(void **state) {
  fx *f = *state;
  char cmd[1200], cert[400], key[400], err[KC_ERRBUF_SIZE];
  snprintf(cert, sizeof cert, "%s/cert.pem", f->dir);
  snprintf(key, sizeof key, "%s/key.pem", f->dir);
  snprintf(cmd, sizeof cmd,
           "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "
           "/CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 -keyout %s "
           "-out %s >/dev/null 2>&1",
           key, cert);
  if (system(cmd) != 0) {
    print_message("skipped: openssl cannot make a certificate\n");
    skip();
  }
  const char *const args[] = {"--tls-cert", cert, "--tls-key", key, NULL};
  start_server_with(f, args);
  assert_memory_equal(f->srv.url, "https://", 8);
  kc_client *c = NULL;
  char *json = NULL;
  kc_client_opts o = {.url = f->srv.url, .cacert = cert, .cache_dir = f->cache};
  assert_int_equal(kc_client_new(&o, &c, err), KC_OK);
  assert_int_equal(kc_client_stats(c, &json, err), KC_OK);
  free(json);
  kc_client_free(c);
  o.cacert = NULL; /* the system's CAs do not know this certificate */
  assert_int_equal(kc_client_new(&o, &c, err), KC_OK);
  assert_int_not_equal(kc_client_stats(c, &json, err), KC_OK);
  kc_client_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      CT(test_warm_offline),
      CT(test_warm_build_failure),
      CT(test_warm_stale_metadata),
      CT(test_warm_command_builder),
      CT(test_cold_then_remote),
      CT(test_cli_roundtrip),
      CT(test_server_down),
      CT(test_two_warmers),
      CT(test_deadline),
      CT(test_server_blob_flipped),
      CT(test_tokens),
      CT(test_https),
  };
  return clienttest_run("client_build", tests, sizeof tests / sizeof tests[0]);
}
