/* test_client.c: libkcache and the kcache CLI. Unit tests (keys, the local
 * cache, materialize and path safety, CLI usage errors) and end-to-end tests
 * against the real kcached (tests/testsrv.h): cold warm, warm from the
 * server, server down, corrupt blobs (local, and served by a fake server),
 * concurrent warmers and leases, the deadline, path traversal in a served
 * manifest, and a fake server that stalls, resets connections or answers
 * garbage (the deadline holds, the report says what failed). NVRTC really
 * compiles (tests/kernels); without it those tests skip, unless CI=true,
 * where they fail. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <zstd.h>

#include "kc_gpu.h"
#include "kcache.h"
#include "testsrv.h"

#ifndef KC_TEST_KERNELS
#define KC_TEST_KERNELS "tests/kernels"
#endif
#ifndef KCACHE_BIN
#define KCACHE_BIN "kcache"
#endif

#define MODEL "287e43e0540bf56af64cfcac0c9a5ab81409756e1cb5e27fab7e5d82d2f8cb5c"

/* ---- fixtures and helpers ---- */

typedef struct fx {
  char dir[256];   /* temporary root */
  char cache[300]; /* dir/cache */
  char out[300];   /* dir/out */
  kc_testsrv srv;
  int have_srv;
} fx;

static int fx_setup(void **state) {
  fx *f = calloc(1, sizeof *f);
  const char *tmp = getenv("TMPDIR");
  snprintf(f->dir, sizeof f->dir, "%s/kcache-client-XXXXXX",
           tmp && *tmp ? tmp : "/tmp");
  assert_non_null(mkdtemp(f->dir));
  snprintf(f->cache, sizeof f->cache, "%s/cache", f->dir);
  snprintf(f->out, sizeof f->out, "%s/out", f->dir);
  *state = f;
  return 0;
}

static void rmtree(const char *p) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
  if (system(cmd) != 0)
    fprintf(stderr, "cannot remove %s\n", p);
}

static int fx_teardown(void **state) {
  fx *f = *state;
  if (f->have_srv)
    kc_testsrv_cleanup(&f->srv);
  rmtree(f->dir);
  free(f);
  return 0;
}

static void start_server(fx *f) {
  assert_int_equal(kc_testsrv_start(&f->srv, NULL), 0);
  f->have_srv = 1;
}

static void need_nvrtc(void) {
  char v[16], err[KC_ERRBUF_SIZE] = "";
  if (kc_gpu_nvrtc_version(v, err) == KC_OK)
    return;
  const char *ci = getenv("CI");
  if (ci && strcmp(ci, "true") == 0)
    fail_msg("CI=true and NVRTC is missing: %s", err);
  print_message("skipped: %s\n", err);
  skip();
}

static void write_text(const char *path, const char *fmt, ...) {
  FILE *fp = fopen(path, "w");
  assert_non_null(fp);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(fp, fmt, ap);
  va_end(ap);
  fclose(fp);
}

/* A small warmup: `kernel` (tests/kernels/<kernel>.cu, entry `entry`) for
 * batch 1 and 4 on sm_80. Written to dir/<name>.json. toolchain_extra is
 * spliced into the toolchain object (may be ""). */
static kc_warmup *warmup_for(fx *f, const char *name, const char *kernel,
                             const char *entry, const char *toolchain_extra) {
  char path[400], err[KC_ERRBUF_SIZE];
  snprintf(path, sizeof path, "%s/%s.json", f->dir, name);
  write_text(path,
             "{\"schema\":\"kcache.warmup/v1\",\"model\":{\"name\":\"t\","
             "\"hash\":\"%s\"},\"archs\":[\"sm_80\"],\"toolchain\":{\"app\":"
             "\"test\"%s},\"kernels\":[{\"name\":\"%s\",\"source\":"
             "\"%s/%s.cu\",\"entries\":[\"%s\"]}],\"buckets\":[{\"batch\":1},"
             "{\"batch\":4}]}",
             MODEL, toolchain_extra, kernel, KC_TEST_KERNELS, kernel, entry);
  kc_warmup *w = NULL;
  kc_err e = kc_warmup_load(path, &w, err);
  if (e)
    fail_msg("warmup: %s", err);
  return w;
}

static kc_client *client_for(const char *cache, const char *url) {
  char err[KC_ERRBUF_SIZE];
  kc_client *c = NULL;
  kc_client_opts o = {.url = url, .cache_dir = cache, .timeout_ms = 20000,
                      .connect_timeout_ms = 1000};
  kc_err e = kc_client_new(&o, &c, err);
  if (e)
    fail_msg("kc_client_new: %s", err);
  return c;
}

static size_t count(const kc_warm_report *r, kc_warm_status s) {
  return r->counts[s];
}

/* Runs the kcache CLI with env ("VAR=value ..." or "") before it; returns
 * its exit status, stdout+stderr in out. */
static int run_cliv(char *out, size_t out_size, const char *env,
                    const char *fmt, va_list ap) {
  char args[2048], cmd[2600];
  vsnprintf(args, sizeof args, fmt, ap);
  /* The caller's server settings must not leak into the tests. */
  snprintf(cmd, sizeof cmd,
           "env -u KCACHE_URL -u KCACHE_TOKEN -u KCACHE_CACERT %s %s %s 2>&1",
           env, KCACHE_BIN, args);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t n = out ? fread(out, 1, out_size - 1, p) : 0;
  if (out)
    out[n] = '\0';
  else {
    char sink[4096];
    while (fread(sink, 1, sizeof sink, p) > 0) {
    }
  }
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static int run_cli(char *out, size_t out_size, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = run_cliv(out, out_size, "", fmt, ap);
  va_end(ap);
  return rc;
}

static int run_cli_env(char *out, size_t out_size, const char *env,
                       const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = run_cliv(out, out_size, env, fmt, ap);
  va_end(ap);
  return rc;
}

/* How many times needle occurs in s. */
static int occurrences(const char *s, const char *needle) {
  int n = 0;
  for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle))
    n++;
  return n;
}

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

static kc_manifest *manifest_of(kc_client *c, const char *const *paths,
                                const char *const *texts, size_t n) {
  char err[KC_ERRBUF_SIZE], d[65];
  kc_manifest *m = kc_manifest_new();
  strcpy(m->fields.model, MODEL);
  memset(m->fields.build, 'b', 64);
  strcpy(m->fields.arch, "sm_80");
  m->fields.bucket.n = 1;
  strcpy(m->fields.bucket.dims[0].name, "batch");
  m->fields.bucket.dims[0].value = 2;
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(
        kc_cache_blob_put(c, texts[i], strlen(texts[i]), d, err), KC_OK);
    assert_int_equal(kc_manifest_add_file(m, paths[i], d, strlen(texts[i]),
                                          KC_KIND_FILE, NULL, 0, err),
                     KC_OK);
  }
  if (kc_manifest_seal(m, err))
    fail_msg("seal: %s", err);
  return m;
}

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

/* ---- unit: CLI ---- */

static void test_cli_usage(void **state) {
  (void)state;
  char out[8192];
  assert_int_equal(run_cli(out, sizeof out, ""), 2);
  assert_int_equal(run_cli(out, sizeof out, "--help"), 0);
  assert_non_null(strstr(out, "exit status"));
  assert_int_equal(run_cli(out, sizeof out, "nosuchcommand"), 2);
  assert_int_equal(run_cli(out, sizeof out, "warm"), 2);
  assert_int_equal(run_cli(out, sizeof out, "warm --help"), 0);
  assert_non_null(strstr(out, "--deadline"));
  assert_int_equal(run_cli(out, sizeof out, "warm x.json --deadline abc"), 2);
  assert_int_equal(run_cli(out, sizeof out, "warm x.json --arch sm_8"), 2);
  assert_int_equal(run_cli(out, sizeof out, "warm a.json b.json"), 2);
  assert_int_equal(run_cli(out, sizeof out, "pull onlykey"), 2);
  assert_int_equal(run_cli(out, sizeof out, "pull notakey dir"), 2);
  assert_int_equal(run_cli(out, sizeof out, "hash"), 2);
  assert_int_equal(run_cli(out, sizeof out, "stat --bogus"), 2);
  assert_int_equal(run_cli(out, sizeof out, "stat"), 2);
  assert_non_null(strstr(out, "KCACHE_URL"));
  for (const char *const *cmd = (const char *const[]){
           "push", "pull", "get", "put", "key", "ls", "stat", "hash",
           "verify", NULL};
       *cmd; cmd++)
    assert_int_equal(run_cli(out, sizeof out, "%s --help", *cmd), 0);
}

static void test_cli_key_hash(void **state) {
  fx *f = *state;
  char out[8192], p[400];
  snprintf(p, sizeof p, "%s/fields.json", f->dir);
  write_text(p,
             "{\"model\":\"%s\",\"bucket\":{\"batch\":8,\"seq\":1024},"
             "\"arch\":\"sm_90a\",\"toolchain\":{\"cuda\":\"13.0\","
             "\"nvrtc\":\"13.0\"},\"build\":\"%s\"}",
             MODEL, MODEL);
  assert_int_equal(run_cli(out, sizeof out, "key %s", p), 0);
  out[64] = '\0';
  assert_true(kc_is_hex64(out));
  write_text(p, "{\"model\":\"%s\",\"arch\":\"sm_9\"}", MODEL);
  assert_int_equal(run_cli(out, sizeof out, "key %s", p), 1);
  assert_int_equal(run_cli(out, sizeof out, "hash %s", p), 0);
}

/* Manifest errors name their field, in the library and in the CLI. */
static void test_manifest_errors(void **state) {
  fx *f = *state;
  char out[8192], p[400];
  snprintf(p, sizeof p, "%s/bad.json", f->dir);
  write_text(p,
             "{\"schema\":\"kcache.warmup/v1\",\"model\":{\"name\":\"t\","
             "\"hash\":\"%s\"},\"archs\":[\"sm_8x\"],\"kernels\":[{\"name\":"
             "\"a\",\"source\":\"a.cu\",\"entries\":[\"a\"]}],\"buckets\":"
             "[{\"batch\":1}]}",
             MODEL);
  assert_int_equal(run_cli(out, sizeof out, "warm %s --cache-dir %s", p,
                           f->cache),
                   1);
  assert_non_null(strstr(out, "archs[0]"));
  write_text(p,
             "{\"schema\":\"kcache.warmup/v1\",\"model\":{\"name\":\"t\","
             "\"hash\":\"nothex\"},\"kernels\":[],\"buckets\":[]}");
  assert_int_equal(run_cli(out, sizeof out, "warm %s --cache-dir %s", p,
                           f->cache),
                   1);
  assert_non_null(strstr(out, "model.hash"));
}


/* A failing command names its file once, not "f: f: No such file". */
static void test_cli_names_file_once(void **state) {
  fx *f = *state;
  char out[8192], missing[400], bad[400], dir[400], bundle[450];
  snprintf(missing, sizeof missing, "%s/missing.json", f->dir);
  snprintf(bad, sizeof bad, "%s/bad.json", f->dir);
  snprintf(dir, sizeof dir, "%s/pushdir", f->dir);
  snprintf(bundle, sizeof bundle, "%s/kcache-bundle.json", dir);
  write_text(bad, "{");
  assert_int_equal(mkdir(dir, 0755), 0);
  write_text(bundle, "{");
  const char *url = "--url http://127.0.0.1:1"; /* never reached */
  struct {
    char args[1400];
    const char *file, *says;
  } c[9];
  size_t n = 0;
#define CASE(file_, says_, ...)                                                \
  (snprintf(c[n].args, sizeof c[n].args, __VA_ARGS__), c[n].file = file_,      \
   c[n++].says = says_)
  CASE(missing, "No such file", "warm %s", missing);
  CASE(bad, "line 1", "warm %s", bad);
  CASE(missing, "No such file", "key %s", missing);
  CASE(bad, "line 1", "key %s", bad);
  CASE(missing, "No such file", "hash %s", missing);
  CASE(missing, "No such file", "put %s %s", missing, url);
  CASE(missing, "No such file", "push %s --fields %s %s", dir, missing, url);
  CASE(bad, "line 1", "push %s --fields %s %s", dir, bad, url);
  CASE(bundle, "line 1", "push %s %s", dir, url);
#undef CASE
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(run_cli(out, sizeof out, "%s", c[i].args), 1);
    if (occurrences(out, c[i].file) != 1 || !strstr(out, c[i].says))
      fail_msg("kcache %s: %s", c[i].args, out);
  }
}

/* The common options come from one table: each flag and its variable reach
 * the client, the flag wins, and --help lists both. */
static void test_cli_env_and_flags(void **state) {
  fx *f = *state;
  char out[8192], env[700], from_env[400], from_flag[400], p[450];
  snprintf(from_env, sizeof from_env, "%s/env-cache", f->dir);
  snprintf(from_flag, sizeof from_flag, "%s/flag-cache", f->dir);
  snprintf(env, sizeof env, "KCACHE_DIR=%s", from_env);
  /* pull needs no server; the client makes its cache before it fails */
  assert_int_equal(run_cli_env(out, sizeof out, env, "pull %s %s", MODEL,
                               f->out),
                   1);
  snprintf(p, sizeof p, "%s/blobs", from_env);
  assert_int_equal(access(p, F_OK), 0);
  rmtree(from_env);
  assert_int_equal(run_cli_env(out, sizeof out, env, "pull %s %s --cache-dir %s",
                               MODEL, f->out, from_flag),
                   1);
  snprintf(p, sizeof p, "%s/blobs", from_flag);
  assert_int_equal(access(p, F_OK), 0);
  assert_int_not_equal(access(from_env, F_OK), 0);
  /* a token in clear off loopback: refused unless the variable says 1 */
  const char *tok = "KCACHE_URL=http://0.0.0.0:1 KCACHE_TOKEN=t";
  assert_int_equal(run_cli_env(out, sizeof out, tok, "stat"), 1);
  assert_non_null(strstr(out, "in clear"));
  snprintf(env, sizeof env, "%s KCACHE_ALLOW_PLAINTEXT=1", tok);
  assert_int_equal(run_cli_env(out, sizeof out, env, "stat"), 1);
  assert_null(strstr(out, "in clear"));
  assert_int_equal(run_cli_env(out, sizeof out, tok, "stat --allow-plaintext"),
                   1);
  assert_null(strstr(out, "in clear"));
  assert_int_equal(run_cli(out, sizeof out, "stat --parallel 0"), 2);
  assert_int_equal(run_cli(out, sizeof out, "--help"), 0);
  for (const char *const *v = (const char *const[]){
           "--url", "KCACHE_URL", "KCACHE_TOKEN", "KCACHE_CACERT",
           "--cache-dir", "KCACHE_DIR", "--parallel", "KCACHE_ALLOW_PLAINTEXT",
           NULL};
       *v; v++)
    assert_non_null(strstr(out, *v));
}

/* Tokens do not cross a network in clear by accident. */
static void test_plaintext_token(void **state) {
  fx *f = *state;
  char err[KC_ERRBUF_SIZE];
  kc_client *c = NULL;
  kc_client_opts o = {.url = "http://kcache.example:8080", .token = "t",
                      .cache_dir = f->cache};
  assert_int_equal(kc_client_new(&o, &c, err), KC_EINVAL);
  assert_non_null(strstr(err, "in clear"));
  o.allow_plaintext = 1;
  assert_int_equal(kc_client_new(&o, &c, err), KC_OK);
  kc_client_free(c);
  o.allow_plaintext = 0;
  o.url = "http://127.0.0.1:8080";
  assert_int_equal(kc_client_new(&o, &c, err), KC_OK);
  kc_client_free(c);
  o.url = "https://kcache.example";
  assert_int_equal(kc_client_new(&o, &c, err), KC_OK);
  kc_client_free(c);
}

/* verify without a GPU: a clean error, exit 1; with one, it loads. */
static void test_cli_verify(void **state) {
  fx *f = *state;
  char out[8192], p[400], err[KC_ERRBUF_SIZE];
  kc_gpu_info gi;
  kc_warmup_free(warmup_for(f, "w", "saxpy", "saxpy", ""));
  snprintf(p, sizeof p, "%s/w.json", f->dir);
  int rc = run_cli(out, sizeof out, "verify %s --cache-dir %s", p, f->cache);
  if (kc_gpu_detect(&gi, err) != KC_OK) {
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "kcache verify: "));
    return;
  }
  need_nvrtc();
  assert_int_equal(run_cli(out, sizeof out, "warm %s --cache-dir %s --arch %s"
                           " --quiet", p, f->cache, gi.devices[0].arch), 0);
  rc = run_cli(out, sizeof out, "verify %s --cache-dir %s --arch %s", p,
               f->cache, gi.devices[0].arch);
  print_message("%s", out);
  assert_int_equal(rc, 0);
}

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
  assert_int_equal(run_cli(out, sizeof out, "warm %s --cache-dir %s --quiet",
                           p, f->cache),
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

static void blobs_equal(const char *cache_a, const char *cache_b) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "diff -r '%s/blobs' '%s/blobs' >/dev/null",
           cache_a, cache_b);
  assert_int_equal(system(cmd), 0);
}

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
                           "warm %s --url %s --cache-dir %s --json --quiet",
                           p, f->srv.url, f->cache),
                   0);
  assert_non_null(strstr(out, "\"built\": 2"));
  char *k = strstr(out, "\"key\": \"");
  assert_non_null(k);
  memcpy(key, k + 8, 64);
  key[64] = '\0';
  snprintf(dir, sizeof dir, "%s/pulled", f->dir);
  assert_int_equal(run_cli(out, sizeof out, "pull %s %s --url %s "
                           "--cache-dir %s/c2", key, dir, f->srv.url, f->dir),
                   0);
  snprintf(p, sizeof p, "%s/saxpy.cubin", dir);
  assert_int_equal(access(p, F_OK), 0);
  /* push of the pulled directory: identical bundle, accepted. */
  assert_int_equal(run_cli(out, sizeof out, "push %s --url %s --cache-dir "
                           "%s/c3", dir, f->srv.url, f->dir),
                   0);
  assert_memory_equal(out, key, 64);
  assert_int_equal(run_cli(out, sizeof out, "put %s --url %s", p, f->srv.url),
                   0);
  char digest[65];
  memcpy(digest, out, 64);
  digest[64] = '\0';
  assert_int_equal(run_cli(NULL, 0, "get %s -o %s/got --url %s", digest,
                           f->dir, f->srv.url),
                   0);
  assert_int_equal(run_cli(out, sizeof out, "ls %s --url %s", MODEL,
                           f->srv.url),
                   0);
  assert_non_null(strstr(out, key));
  assert_int_equal(run_cli(out, sizeof out, "stat --url %s", f->srv.url), 0);
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
static size_t json_count(const char *json, const char *name) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\": ", name);
  const char *at = strstr(json, pat);
  assert_non_null(at);
  return (size_t)atoi(at + strlen(pat));
}

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
  double secs = (double)(t1.tv_sec - t0.tv_sec) +
                (t1.tv_nsec - t0.tv_nsec) / 1e9;
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
  assert_int_equal(kc_testsrv_start(&f->srv, args), 0);
  f->have_srv = 1;
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

/* Makes a token with `kcached token ROLE NAME`; appends its line to file. */
static void make_token(const char *role, const char *name, const char *file,
                       char *token, size_t size) {
  char cmd[600], line[512];
  snprintf(cmd, sizeof cmd, "%s token %s %s 2>/dev/null", kc_testsrv_bin(),
           role, name);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  FILE *out = fopen(file, "a");
  assert_non_null(out);
  while (fgets(line, sizeof line, p)) {
    line[strcspn(line, "\n")] = '\0';
    if (line[0] == '#' || !line[0])
      continue;
    if (!strchr(line, ' '))
      snprintf(token, size, "%.200s", line);
    else
      fprintf(out, "%s\n", line);
  }
  fclose(out);
  assert_int_equal(pclose(p), 0);
  assert_true(token[0] != '\0');
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
  assert_int_equal(kc_testsrv_init(&f->srv), 0);
  const char *args[] = {"--tokens", tokens, NULL};
  assert_int_equal(kc_testsrv_start(&f->srv, args), 0);
  f->have_srv = 1;
  kc_warmup *w = warmup_for(f, "w", "saxpy", "saxpy", "");
  kc_warmup *w2 = warmup_for(f, "w2", "batch8", "fill8", "");
  struct { const char *tok, *cache; } who[] = {
      {NULL, "none"}, {rtok, "read"}, {wtok, "write"}};
  kc_warm_report r;
  for (int k = 0; k < 3; k++) {
    char cache[400];
    kc_client *c = NULL;
    snprintf(cache, sizeof cache, "%s/%s", f->dir, who[k].cache);
    kc_client_opts o = {.url = f->srv.url, .token = who[k].tok,
                        .cache_dir = cache};
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
  const char *args[] = {"--tls-cert", cert, "--tls-key", key, NULL};
  assert_int_equal(kc_testsrv_init(&f->srv), 0);
  assert_int_equal(kc_testsrv_start(&f->srv, args), 0);
  f->have_srv = 1;
  assert_memory_equal(f->srv.url, "https://", 8);
  kc_client *c = NULL;
  char *json = NULL;
  kc_client_opts o = {.url = f->srv.url, .cacert = cert,
                      .cache_dir = f->cache};
  assert_int_equal(kc_client_new(&o, &c, err), KC_OK);
  assert_int_equal(kc_client_stats(c, &json, err), KC_OK);
  free(json);
  kc_client_free(c);
  o.cacert = NULL; /* the system's CAs do not know this certificate */
  assert_int_equal(kc_client_new(&o, &c, err), KC_OK);
  assert_int_not_equal(kc_client_stats(c, &json, err), KC_OK);
  kc_client_free(c);
}

/* ---- a fake kcached that lies: wrong blob bytes, unsafe manifests, and
 * faults: stalls, resets, garbage ---- */

/* How the fake misbehaves on a route instead of answering. */
typedef enum fault {
  FAULT_NONE,    /* answers (the route's body, or a 500) */
  FAULT_STALL,   /* reads the request, then never answers */
  FAULT_RESET,   /* reads the request, then closes with RST (SO_LINGER 0) */
  FAULT_GARBAGE, /* answers bytes that are not HTTP */
  FAULT_SHORT,   /* 200 with a Content-Length above the bytes sent, close */
  FAULT_HTML     /* 500 with an HTML body (a proxy's error page) */
} fault;

typedef struct fake {
  int fd;
  int port;
  char url[64];
  pthread_t thread;
  const char *lookup_body; /* answer to POST /v1/lookup */
  const char *bundle_body; /* answer to GET /v1/bundles/... */
  const char *blob_body;   /* answer to GET /v1/blobs/... */
  const char *fetch_body;  /* answer to POST /v1/blobs/fetch (else 500) */
  size_t fetch_len;        /* ... its length (0: strlen) */
  int fetch_status;        /* ... with this status (0: 200) */
  int fetches;             /* POST /v1/blobs/fetch requests seen (atomic) */
  int gets;                /* GET /v1/blobs/... requests seen (atomic) */
  fault lookup_fault;      /* instead of answering POST /v1/lookup */
  fault blob_fault;        /* instead of answering GET /v1/blobs/... */
  size_t blob_flood;       /* > 0: GET /v1/blobs/ answers this many bytes */
  const char *flood_route; /* ... or this route instead ("GET /v1/...") */
  int flood_length;        /* ... with a Content-Length (else without) */
  int drip;                /* every answer: one body byte every 0.5 s */
  size_t sent;             /* flood: bytes the client took (atomic) */
  int stop;
} fake;

static void fake_reply_n(int c, int status, const char *body, size_t len) {
  char head[256];
  int n = snprintf(head, sizeof head,
                   "HTTP/1.1 %d X\r\nContent-Length: %zu\r\nContent-Type: "
                   "application/json\r\nConnection: close\r\n\r\n",
                   status, len);
  if (write(c, head, (size_t)n) < 0 || write(c, body, len) < 0)
    return;
}

static void fake_reply(int c, int status, const char *body) {
  fake_reply_n(c, status, body, strlen(body));
}

/* Misbehaves on connection c, whose request head has been read. */
static void fake_fault(int c, fault f) {
  static const char garbage[] = "\x16\x03\x01\xff\xfeSSH-2.0 not http\r\n\r\n";
  static const char short_head[] =
      "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\nConnection: close\r\n"
      "\r\nthe first few bytes";
  static const char html[] =
      "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/html\r\n"
      "Content-Length: 46\r\nConnection: close\r\n\r\n"
      "<html><body>502 Bad Gateway</body></html>\n\n\n\n\n";
  const char *out = f == FAULT_GARBAGE ? garbage
                    : f == FAULT_SHORT ? short_head
                    : f == FAULT_HTML  ? html
                                       : NULL;
  if (f == FAULT_STALL) { /* until the client gives up (or 10 s) */
    char sink[4096];
    struct timeval tv = {10, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    while (read(c, sink, sizeof sink) > 0) {
    }
  } else if (f == FAULT_RESET) {
    struct linger l = {.l_onoff = 1, .l_linger = 0};
    setsockopt(c, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  } else if (out && write(c, out, strlen(out)) < 0) {
    return;
  }
}

/* A 200 whose body is far larger than any manifest declares: sent until
 * the client stops reading (the bytes it took are counted in s->sent). */
static void fake_flood(fake *s, int c) {
  static char chunk[1 << 20];
  char head[256];
  int n = s->flood_length
              ? snprintf(head, sizeof head,
                         "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n"
                         "Connection: close\r\n\r\n", s->blob_flood)
              : snprintf(head, sizeof head,
                         "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");
  memset(chunk, 'x', sizeof chunk);
  if (send(c, head, (size_t)n, MSG_NOSIGNAL) != n)
    return;
  for (size_t done = 0; done < s->blob_flood;) {
    size_t want = s->blob_flood - done < sizeof chunk ? s->blob_flood - done
                                                      : sizeof chunk;
    ssize_t w = send(c, chunk, want, MSG_NOSIGNAL);
    if (w <= 0)
      break;
    done += (size_t)w;
    __atomic_store_n(&s->sent, done, __ATOMIC_SEQ_CST);
  }
}

/* An answer that promises 1000 bytes and sends one every 0.5 s, until the
 * client hangs up (or 30 s, or the fake stops). */
static void fake_drip(fake *s, int c) {
  static const char head[] =
      "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n";
  if (send(c, head, strlen(head), MSG_NOSIGNAL) < 0)
    return;
  for (int i = 0; i < 60 && !__atomic_load_n(&s->stop, __ATOMIC_SEQ_CST);
       i++) {
    struct timespec ts = {0, 500 * 1000000L};
    nanosleep(&ts, NULL);
    if (send(c, "{", 1, MSG_NOSIGNAL) != 1)
      break;
  }
}

/* Reads the request head (and ignores any body: we close afterwards). */
static void fake_serve(fake *s, int c) {
  char req[8192] = "";
  size_t n = 0;
  while (n < sizeof req - 1 && !strstr(req, "\r\n\r\n")) {
    ssize_t r = read(c, req + n, sizeof req - 1 - n);
    if (r <= 0)
      break;
    n += (size_t)r;
    req[n] = '\0';
  }
  req[n] = '\0';
  if (!strncmp(req, "POST /v1/blobs/fetch ", 21))
    __atomic_add_fetch(&s->fetches, 1, __ATOMIC_SEQ_CST);
  if (!strncmp(req, "GET /v1/blobs/", 14))
    __atomic_add_fetch(&s->gets, 1, __ATOMIC_SEQ_CST);
  fault f = !strncmp(req, "POST /v1/lookup", 15) ? s->lookup_fault
            : !strncmp(req, "GET /v1/blobs/", 14) ? s->blob_fault
                                                   : FAULT_NONE;
  if (f == FAULT_STALL || f == FAULT_RESET) {
    fake_fault(c, f);
    return; /* no orderly close: the caller's close() is the reset */
  }
  if (s->drip) {
    fake_drip(s, c);
    return;
  }
  const char *route = s->flood_route ? s->flood_route : "GET /v1/blobs/";
  if (s->blob_flood && !strncmp(req, route, strlen(route))) {
    fake_flood(s, c);
    return;
  }
  if (f != FAULT_NONE)
    fake_fault(c, f);
  else if (!strncmp(req, "POST /v1/lookup", 15) && s->lookup_body)
    fake_reply(c, 200, s->lookup_body);
  else if (!strncmp(req, "GET /v1/bundles/", 16) && s->bundle_body)
    fake_reply(c, 200, s->bundle_body);
  else if (!strncmp(req, "GET /v1/blobs/", 14) && s->blob_body)
    fake_reply(c, 200, s->blob_body);
  else if (!strncmp(req, "POST /v1/blobs/fetch ", 21) && s->fetch_body)
    fake_reply_n(c, s->fetch_status ? s->fetch_status : 200, s->fetch_body,
                 s->fetch_len ? s->fetch_len : strlen(s->fetch_body));
  else
    fake_reply(c, 500, "{\"error\":\"internal\",\"message\":\"fake\"}");
  shutdown(c, SHUT_WR);
  while (read(c, req, sizeof req) > 0) {
  }
}

static void *fake_main(void *arg) {
  fake *s = arg;
  for (;;) {
    int c = accept(s->fd, NULL, NULL);
    if (c < 0 || __atomic_load_n(&s->stop, __ATOMIC_SEQ_CST)) {
      if (c >= 0)
        close(c);
      return NULL;
    }
    fake_serve(s, c);
    close(c);
  }
}

static void fake_start(fake *s) {
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  s->fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(s->fd >= 0);
  assert_int_equal(bind(s->fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(s->fd, 16), 0);
  getsockname(s->fd, (struct sockaddr *)&a, &len);
  s->port = ntohs(a.sin_port);
  snprintf(s->url, sizeof s->url, "http://127.0.0.1:%d", s->port);
  assert_int_equal(pthread_create(&s->thread, NULL, fake_main, s), 0);
}

static void fake_stop(fake *s) {
  __atomic_store_n(&s->stop, 1, __ATOMIC_SEQ_CST);
  /* Wake accept() with a connection of our own. */
  int c = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)s->port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (connect(c, (struct sockaddr *)&a, sizeof a) != 0)
    fprintf(stderr, "fake_stop: connect: %s\n", strerror(errno));
  close(c);
  pthread_join(s->thread, NULL);
  close(s->fd);
}

/* The manifest JSON for key fields k[0] with one file. */
static char *fake_manifest(const kc_key_fields *k, const char *path,
                           const char *content, char *key_out) {
  char err[KC_ERRBUF_SIZE], d[65], *json = NULL;
  kc_manifest *m = kc_manifest_new();
  m->fields = *k;
  kc_sha256_hex(content, strlen(content), d);
  assert_int_equal(kc_manifest_add_file(m, "placeholder.cubin", d,
                                        strlen(content), KC_KIND_CUBIN, NULL,
                                        0, err),
                   KC_OK);
  assert_int_equal(kc_manifest_seal(m, err), KC_OK);
  assert_int_equal(kc_manifest_to_json(m, &json, err), KC_OK);
  strcpy(key_out, m->key);
  kc_manifest_free(m);
  /* Swap the path in the text: the fake may serve what we may not build. */
  char *at = strstr(json, "placeholder.cubin");
  size_t need = strlen(json) + strlen(path) + 1;
  char *out = malloc(need);
  snprintf(out, need, "%.*s%s%s", (int)(at - json), json, path,
           at + strlen("placeholder.cubin"));
  free(json);
  return out;
}

static char *lookup_of(const char *key, const char *manifest) {
  size_t need = strlen(manifest) + 200;
  char *s = malloc(need);
  snprintf(s, need, "{\"found\":{\"%s\":%s},\"missing\":[]}", key, manifest);
  return s;
}

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
  fake s = {.lookup_body = look, .bundle_body = man,
            .blob_body = "the wrong bytes"};
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

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec / 1e9;
}

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
  kc_client_opts co = {.url = s->url, .cache_dir = cache,
                       .timeout_ms = 20000, .connect_timeout_ms = 1000,
                       .parallel = parallel};
  assert_int_equal(kc_client_new(&co, &c, err), KC_OK);
  kc_warm_opts o = {.no_build = 1, .deadline_s = FAULT_DEADLINE_S,
                    .out_dir = out};
  double t0 = now_s();
  kc_err e = kc_warm(c, w, &o, r, err);
  *secs = now_s() - t0;
  print_message("%-14s %.2f s  %s: %s\n", tag, *secs, kc_err_name(e), err);
  for (size_t i = 0; i < r->n_items; i++)
    print_message("  %.12s %s: %s\n", r->items[i].key,
                  kc_warm_status_name(r->items[i].status),
                  r->items[i].message);
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

/* Keys computable without a toolkit (pinned NVRTC), and their key strings. */
static kc_warmup *fault_warmup(fx *f, kc_key_fields **k, char keys[2][65]) {
  char err[KC_ERRBUF_SIZE];
  size_t n = 0;
  kc_warmup *w = warmup_for(f, "w", "saxpy", "saxpy",
                            ",\"nvrtc\":\"13.0\",\"cuda\":\"13.0\"");
  assert_int_equal(kc_warm_keys(w, NULL, 0, k, &n, err), KC_OK);
  assert_int_equal(n, 2);
  for (size_t i = 0; i < 2; i++)
    assert_int_equal(kc_key_compute(&(*k)[i], keys[i], err), KC_OK);
  return w;
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
    fake s = {.lookup_body = look, .bundle_body = man,
              .blob_fault = cases[t].fault};
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
  fake s = {.lookup_body = look, .bundle_body = man,
            .blob_fault = FAULT_RESET};
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

/* ---- an adversarial pass over the client ---- */

/* A command-builder warmup (no toolkit needed): `sh -c script` for batch 1
 * on sm_90a, written to dir/<name>.json (path out). script: no quotes. */
static void cmd_warmup(fx *f, const char *name, const char *script,
                       char *path, size_t size) {
  snprintf(path, size, "%s/%s.json", f->dir, name);
  write_text(path,
             "{\"schema\":\"kcache.warmup/v1\",\"model\":{\"name\":\"t\","
             "\"hash\":\"%s\"},\"archs\":[\"sm_90a\"],\"builder\":{"
             "\"command\":[\"sh\",\"-c\",\"%s\"],\"timeout_s\":30},"
             "\"buckets\":[{\"batch\":1}]}",
             MODEL, script);
}

/* The one key of a cmd_warmup. */
static void cmd_key(const char *path, char key[65]) {
  char err[KC_ERRBUF_SIZE];
  kc_warmup *w = NULL;
  kc_key_fields *k = NULL;
  size_t n = 0;
  assert_int_equal(kc_warmup_load(path, &w, err), KC_OK);
  assert_int_equal(kc_warm_keys(w, NULL, 0, &k, &n, err), KC_OK);
  assert_int_equal(n, 1);
  assert_int_equal(kc_key_compute(&k[0], key, err), KC_OK);
  free(k);
  kc_warmup_free(w);
}

/* A file's text (up to 255 bytes), "" when it cannot be read. */
static const char *text_of(const char *path) {
  static char buf[256];
  char *data = NULL;
  size_t len = 0;
  buf[0] = '\0';
  if (kc_read_file(path, &data, &len, NULL) == KC_OK)
    snprintf(buf, sizeof buf, "%s", data);
  free(data);
  return buf;
}

/* 9. A cached blob replaced by a 1 TiB sparse file, then by a symlink to
 * /dev/zero: the local check refuses it by type and size before hashing,
 * and the warm refetches it well within its deadline (`timeout 20` only
 * keeps a regression from hanging the suite). */
static void test_local_blob_not_a_blob(void **state) {
  fx *f = *state;
  char w[400], out[16384], key[65], blob[PATH_MAX], cmd[PATH_MAX + 64];
  char err[KC_ERRBUF_SIZE];
  start_server(f);
  cmd_warmup(f, "w9", "printf cached-bytes > {out}/k.bin", w, sizeof w);
  assert_int_equal(run_cli(out, sizeof out, "warm %s --url %s --cache-dir %s"
                           " --quiet --strict", w, f->srv.url, f->cache),
                   0);
  cmd_key(w, key);
  kc_client *c = client_for(f->cache, NULL);
  kc_manifest *m = NULL;
  assert_int_equal(kc_cache_bundle_get(c, key, &m, err), KC_OK);
  kc_cache_blob_path(c, m->files[0].sha256, blob, sizeof blob);
  kc_manifest_free(m);
  kc_client_free(c);
  for (int t = 0; t < 2; t++) {
    struct stat st;
    assert_int_equal(unlink(blob), 0);
    if (t == 0) {
      snprintf(cmd, sizeof cmd, "truncate -s 1T '%s'", blob);
      assert_int_equal(system(cmd), 0);
    } else {
      assert_int_equal(symlink("/dev/zero", blob), 0);
    }
    double t0 = now_s();
    int rc = run_cli_env(out, sizeof out, "timeout 20",
                         "warm %s --url %s --cache-dir %s --deadline 3 "
                         "--json --quiet", w, f->srv.url, f->cache);
    double secs = now_s() - t0;
    print_message("%s in the cache: %.2f s, exit %d\n",
                  t ? "symlink to /dev/zero" : "1 TiB sparse file", secs, rc);
    assert_int_equal(rc, 0);
    assert_true(secs < 3.0);
    assert_int_equal(json_count(out, "hit-remote"), 1); /* refetched */
    assert_non_null(strstr(out, t ? "is a symlink" : "not the size"));
    assert_int_equal(lstat(blob, &st), 0);
    assert_true(S_ISREG(st.st_mode) && st.st_size == 12);
  }
}

/* 9. The deadline stops the local check, not the writing out of what is
 * ready: one key squatted past the deadline, the other built and
 * materialized all the same. */
static void test_deadline_still_materializes(void **state) {
  fx *f = *state;
  char w[400], err[KC_ERRBUF_SIZE], tok[KC_LEASE_TOKEN_MAX], p[600];
  kc_lease_state st;
  kc_key_fields *k = NULL;
  size_t n = 0;
  char key[65];
  start_server(f);
  snprintf(w, sizeof w, "%s/w9b.json", f->dir);
  write_text(w,
             "{\"schema\":\"kcache.warmup/v1\",\"model\":{\"name\":\"t\","
             "\"hash\":\"%s\"},\"archs\":[\"sm_90a\"],\"builder\":{"
             "\"command\":[\"sh\",\"-c\",\"printf {batch} > {out}/k.bin\"]},"
             "\"buckets\":[{\"batch\":1},{\"batch\":2}]}",
             MODEL);
  kc_warmup *wu = NULL;
  assert_int_equal(kc_warmup_load(w, &wu, err), KC_OK);
  assert_int_equal(kc_warm_keys(wu, NULL, 0, &k, &n, err), KC_OK);
  assert_int_equal(kc_key_compute(&k[1], key, err), KC_OK);
  free(k);
  kc_client *c = client_for(f->cache, f->srv.url);
  assert_int_equal(kc_client_lease_take(c, key, 600, &st, tok, NULL, err),
                   KC_OK);
  kc_warm_report r;
  kc_warm_opts o = {.deadline_s = 1, .lease_wait_s = -1, .out_dir = f->out};
  assert_int_equal(kc_warm(c, wu, &o, &r, err), KC_DEADLINE);
  print_message("%s: %s\n", kc_warm_status_name(r.items[0].status),
                r.items[0].message);
  assert_int_equal(r.items[0].status, KC_WARM_BUILT);
  assert_int_equal(r.items[1].status, KC_WARM_FAILED);
  snprintf(p, sizeof p, "%s/sm_90a/batch=1/k.bin", f->out);
  assert_string_equal(text_of(p), "1");
  kc_warm_report_free(&r);
  kc_client_free(c);
  kc_warmup_free(wu);
}

/* 10. A server that sends far more bytes than the manifest declares (with
 * a Content-Length, and without one): the pull stops at once, says why,
 * and has not read it all. */
static void test_blob_flood(void **state) {
  fx *f = *state;
  char keys[2][65], key[65], out[8192];
  kc_key_fields *k = NULL;
  kc_warmup *w = fault_warmup(f, &k, keys);
  char *man = fake_manifest(&k[0], "saxpy.cubin", "the real bytes", key);
  for (int t = 0; t < 2; t++) {
    fake s = {.bundle_body = man, .blob_flood = (size_t)1 << 30,
              .flood_length = t};
    fake_start(&s);
    double t0 = now_s();
    int rc = run_cli_env(out, sizeof out, "timeout 60",
                         "pull %s %s/pulled%d --url %s --cache-dir %s/c%d",
                         key, f->dir, t, s.url, f->dir, t);
    double secs = now_s() - t0;
    fake_stop(&s);
    size_t sent = __atomic_load_n(&s.sent, __ATOMIC_SEQ_CST);
    print_message("1 GiB for a 14-byte blob (%s): %.2f s, %zu bytes "
                  "taken: %s", t ? "Content-Length" : "no length", secs,
                  sent, out);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "more than the 14 bytes"));
    assert_true(sent < ((size_t)64 << 20));
    assert_true(secs < 5.0);
  }
  /* A manifest answer of 1 GiB: cut off at 256 MiB, not held whole. */
  fake s = {.flood_route = "GET /v1/bundles/", .blob_flood = (size_t)1 << 30};
  fake_start(&s);
  double t0 = now_s();
  int rc = run_cli_env(out, sizeof out, "timeout 60",
                       "pull %s %s/pulled --url %s --cache-dir %s/c", key,
                       f->dir, s.url, f->dir);
  double secs = now_s() - t0;
  fake_stop(&s);
  size_t sent = __atomic_load_n(&s.sent, __ATOMIC_SEQ_CST);
  print_message("1 GiB for a manifest: %.2f s, %zu bytes taken: %s", secs,
                sent, out);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(out, "larger than 268435456 bytes"));
  assert_true(sent < ((size_t)320 << 20));
  free(man);
  free(k);
  kc_warmup_free(w);
}

/* 10. A server that drip-feeds a byte every 0.5 s: `stat` and `pull` give
 * up at --timeout; the library's low-speed limit gives up before its
 * whole-request limit. */
static void test_drip_feed(void **state) {
  fx *f = *state;
  char out[8192], err[KC_ERRBUF_SIZE] = "", *json = NULL;
  fake s = {.drip = 1};
  fake_start(&s);
  double t0 = now_s();
  int rc = run_cli(out, sizeof out, "stat --url %s --timeout 2 --cache-dir %s",
                   s.url, f->cache);
  double secs = now_s() - t0;
  print_message("drip, stat --timeout 2: %.2f s: %s", secs, out);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(out, "timed out"));
  assert_true(secs < 4.5);
  t0 = now_s();
  rc = run_cli_env(out, sizeof out, "KCACHE_TIMEOUT=2",
                   "pull %s %s/p --url %s --cache-dir %s", MODEL, f->dir,
                   s.url, f->cache);
  secs = now_s() - t0;
  print_message("drip, pull KCACHE_TIMEOUT=2: %.2f s: %s", secs, out);
  assert_int_equal(rc, 1);
  assert_true(secs < 4.5);
  /* 1 s under 1 KiB/s (the default is 30 s) ends it; the 20 s limit not */
  kc_client *c = NULL;
  kc_client_opts o = {.url = s.url, .cache_dir = f->cache,
                      .timeout_ms = 20000, .low_speed_s = 1};
  assert_int_equal(kc_client_new(&o, &c, err), KC_OK);
  t0 = now_s();
  kc_err e = kc_client_stats(c, &json, err);
  secs = now_s() - t0;
  print_message("drip, library, low speed 1 s: %.2f s: %s\n", secs, err);
  assert_int_equal(e, KC_TIMEOUT);
  assert_true(secs < 4.5);
  kc_client_free(c);
  fake_stop(&s);
}

/* 11. The cache directory is private: made 0700; one others (or the group)
 * can write is refused unless trusted; an empty one of ours is tightened. */
static void test_cache_dir_private(void **state) {
  fx *f = *state;
  char d[400], p[500], out[8192], err[KC_ERRBUF_SIZE];
  struct stat st;
  snprintf(d, sizeof d, "%s/new/cache", f->dir);
  kc_client_free(client_for(d, NULL));
  assert_int_equal(stat(d, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0700);
  snprintf(d, sizeof d, "%s/shared", f->dir);
  assert_int_equal(mkdir(d, 0777), 0);
  assert_int_equal(chmod(d, 0777), 0);
  snprintf(p, sizeof p, "%s/bundles", d); /* not empty: someone was here */
  assert_int_equal(mkdir(p, 0777), 0);
  assert_int_equal(run_cli(out, sizeof out, "stat --url http://127.0.0.1:1 "
                           "--cache-dir %s", d), 1);
  print_message("%s", out);
  assert_non_null(strstr(out, "writable by others (mode 777)"));
  assert_non_null(strstr(out, "--trust-cache-dir"));
  kc_client *c = NULL;
  kc_client_opts o = {.cache_dir = d};
  assert_int_equal(kc_client_new(&o, &c, err), KC_FORBIDDEN);
  assert_null(c);
  assert_int_equal(chmod(d, 0770), 0);
  assert_int_equal(run_cli(out, sizeof out, "stat --url http://127.0.0.1:1 "
                           "--cache-dir %s", d), 1);
  assert_non_null(strstr(out, "writable by its group"));
  /* trusted on purpose: no refusal (stat then fails to connect) */
  assert_int_equal(run_cli(out, sizeof out, "stat --url http://127.0.0.1:1 "
                           "--cache-dir %s --trust-cache-dir", d), 1);
  assert_null(strstr(out, "writable"));
  assert_int_equal(run_cli_env(out, sizeof out, "KCACHE_TRUST_DIR=1",
                               "stat --url http://127.0.0.1:1 --cache-dir %s",
                               d), 1);
  assert_null(strstr(out, "writable"));
  o.trust_cache_dir = 1;
  assert_int_equal(kc_client_new(&o, &c, err), KC_OK);
  kc_client_free(c);
  /* a fresh shared volume (empty, ours): made private and used */
  snprintf(d, sizeof d, "%s/fresh", f->dir);
  assert_int_equal(mkdir(d, 0777), 0);
  assert_int_equal(chmod(d, 0777), 0);
  kc_client_free(client_for(d, NULL));
  assert_int_equal(stat(d, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0700);
}

/* 11. A cached manifest whose file list was swapped (key and fields kept,
 * so it still hashes to its key): `kcache pull` with the server up sees it
 * differ from the server's, says so, and serves the server's files. */
static void test_cache_manifest_swapped(void **state) {
  fx *f = *state;
  char w[400], out[8192], key[65], evil[65], p[PATH_MAX], err[KC_ERRBUF_SIZE];
  char *json = NULL;
  start_server(f);
  cmd_warmup(f, "w11", "printf good-kernel > {out}/k.bin", w, sizeof w);
  assert_int_equal(run_cli(out, sizeof out, "warm %s --url %s --cache-dir %s"
                           " --quiet --strict", w, f->srv.url, f->cache),
                   0);
  cmd_key(w, key);
  kc_client *c = client_for(f->cache, NULL);
  kc_manifest *m = NULL;
  assert_int_equal(kc_cache_bundle_get(c, key, &m, err), KC_OK);
  assert_int_equal(kc_cache_blob_put(c, "evil-kernel", 11, evil, err), KC_OK);
  memcpy(m->files[0].sha256, evil, sizeof evil);
  m->files[0].size = 11;
  assert_int_equal(kc_manifest_to_json(m, &json, err), KC_OK);
  snprintf(p, sizeof p, "%s/bundles/%s.json", f->cache, key);
  assert_int_equal(kc_write_file_atomic(p, json, strlen(json), err), KC_OK);
  free(json);
  kc_manifest_free(m);
  /* the key binds the fields, not the files: locally it looks fine */
  assert_int_equal(kc_cache_bundle_get(c, key, &m, err), KC_OK);
  kc_manifest_free(m);
  assert_int_equal(run_cli(out, sizeof out, "pull %s %s/pulled --url %s "
                           "--cache-dir %s", key, f->dir, f->srv.url,
                           f->cache),
                   0);
  print_message("%s", out);
  assert_non_null(strstr(out, "other files than the server's"));
  snprintf(p, sizeof p, "%s/pulled/k.bin", f->dir);
  assert_string_equal(text_of(p), "good-kernel");
  assert_int_equal(kc_cache_bundle_get(c, key, &m, err), KC_OK);
  assert_string_not_equal(m->files[0].sha256, evil); /* the server's now */
  kc_manifest_free(m);
  kc_client_free(c);
}

/* 12. A lease squatted by a holder that never delivers: waiting on it, the
 * report names the holder and when its lease ends; with a builder, the key
 * is built here once the holder has had half the deadline, and uploaded. */
static void test_lease_squatter(void **state) {
  fx *f = *state;
  char w[400], out[16384], key[65], err[KC_ERRBUF_SIZE];
  char tok[KC_LEASE_TOKEN_MAX], sq[400], *buf = NULL, *json = NULL;
  size_t blen = 0;
  kc_lease_state st;
  start_server(f);
  cmd_warmup(f, "w12", "printf built-here > {out}/k.bin", w, sizeof w);
  cmd_key(w, key);
  snprintf(sq, sizeof sq, "%s/squatter", f->dir);
  kc_client_opts so = {.url = f->srv.url, .cache_dir = sq,
                       .holder = "squatter-7"};
  kc_client *squat = NULL;
  assert_int_equal(kc_client_new(&so, &squat, err), KC_OK);
  assert_int_equal(kc_client_lease_take(squat, key, 600, &st, tok, NULL, err),
                   KC_OK);
  assert_int_equal(st, KC_LEASE_GRANTED);
  kc_warmup *wu = NULL;
  assert_int_equal(kc_warmup_load(w, &wu, err), KC_OK);
  kc_client *c = client_for(f->cache, f->srv.url);
  kc_warm_report r;
  kc_warm_opts o = {.deadline_s = 1.5, .lease_wait_s = -1};
  assert_int_equal(kc_warm(c, wu, &o, &r, err), KC_DEADLINE);
  print_message("waiting: %s\n", r.items[0].message);
  assert_int_equal(r.items[0].status, KC_WARM_FAILED);
  assert_non_null(strstr(r.items[0].message, "'squatter-7'"));
  assert_non_null(strstr(r.items[0].message, "ends at 20"));
  assert_string_equal(r.items[0].lease_holder, "squatter-7");
  assert_true(r.items[0].lease_expires_s > 590 &&
              r.items[0].lease_expires_s < 601);
  FILE *mf = open_memstream(&buf, &blen);
  kc_warm_report_print(&r, mf);
  fclose(mf);
  assert_non_null(strstr(buf, "squatter-7"));
  free(buf);
  assert_int_equal(kc_warm_report_json(&r, &json, err), KC_OK);
  assert_non_null(strstr(json, "\"holder\": \"squatter-7\""));
  assert_non_null(strstr(json, "\"expires_at\": \"20"));
  free(json);
  kc_warm_report_free(&r);
  /* the CLI told never to build over the lease: human and JSON name it */
  assert_int_equal(run_cli(out, sizeof out, "warm %s --url %s --cache-dir "
                           "%s/c3 --deadline 1 --lease-wait never --json",
                           w, f->srv.url, f->dir),
                   0);
  assert_int_equal(json_count(out, "failed"), 1);
  assert_int_equal(occurrences(out, "waiting on 'squatter-7', whose lease on "
                                    "it ends at 20"),
                   2); /* the JSON message, and the human line */
  assert_non_null(strstr(out, "\"holder\": \"squatter-7\""));
  /* the CLI, with a builder: built here at half the deadline, uploaded */
  double t0 = now_s();
  int rc = run_cli(out, sizeof out, "warm %s --url %s --cache-dir %s/c2 "
                   "--deadline 3 --json", w, f->srv.url, f->dir);
  double secs = now_s() - t0;
  print_message("squatted, --deadline 3: %.2f s\n%s", secs, out);
  assert_int_equal(rc, 0);
  assert_true(secs > 1.2 && secs < 3.0);
  assert_int_equal(json_count(out, "built"), 1);
  assert_non_null(strstr(out, "\"uploaded\": true"));
  assert_non_null(strstr(out, "built here: 'squatter-7' holds the lease"));
  kc_manifest *m = NULL;
  assert_int_equal(kc_client_bundle_get(c, key, &m, err), KC_OK);
  kc_manifest_free(m);
  kc_client_free(c);
  kc_client_free(squat);
  kc_warmup_free(wu);
}

/* 13. push: a symlink inside the directory is followed (the bundle has
 * the file under both names), one out of it or dangling is refused and
 * named. */
static void test_push_symlinks(void **state) {
  fx *f = *state;
  char d[400], p[600], fields[400], out[8192], key[65], got[400];
  start_server(f);
  snprintf(d, sizeof d, "%s/bundle", f->dir);
  assert_int_equal(mkdir(d, 0755), 0);
  snprintf(p, sizeof p, "%s/a.txt", d);
  write_text(p, "alpha");
  snprintf(p, sizeof p, "%s/sub", d);
  assert_int_equal(mkdir(p, 0755), 0);
  snprintf(p, sizeof p, "%s/sub/c.txt", d);
  write_text(p, "gamma");
  snprintf(p, sizeof p, "%s/b.txt", d);
  assert_int_equal(symlink("a.txt", p), 0);
  snprintf(p, sizeof p, "%s/linked", d);
  assert_int_equal(symlink("sub", p), 0);
  snprintf(fields, sizeof fields, "%s/fields.json", f->dir);
  write_text(fields,
             "{\"model\":\"%s\",\"bucket\":{\"batch\":2},\"arch\":\"sm_90a\","
             "\"toolchain\":{\"app\":\"t\"},\"build\":\"%s\"}",
             MODEL, MODEL);
  assert_int_equal(run_cli(out, sizeof out, "push %s --fields %s --url %s "
                           "--cache-dir %s", d, fields, f->srv.url, f->cache),
                   0);
  memcpy(key, out, 64);
  key[64] = '\0';
  assert_true(kc_is_hex64(key));
  assert_int_equal(run_cli(out, sizeof out, "pull %s %s/pulled --url %s "
                           "--cache-dir %s/c2", key, f->dir, f->srv.url,
                           f->dir),
                   0);
  snprintf(got, sizeof got, "%s/pulled/b.txt", f->dir);
  assert_string_equal(text_of(got), "alpha");
  snprintf(got, sizeof got, "%s/pulled/linked/c.txt", f->dir);
  assert_string_equal(text_of(got), "gamma");
  /* out of the directory, and nowhere */
  snprintf(got, sizeof got, "%s/outside.txt", f->dir);
  write_text(got, "secret");
  snprintf(p, sizeof p, "%s/evil", d);
  assert_int_equal(symlink(got, p), 0);
  snprintf(p, sizeof p, "%s/dangling", d);
  assert_int_equal(symlink("nowhere", p), 0);
  assert_int_equal(run_cli(out, sizeof out, "push %s --fields %s --url %s "
                           "--cache-dir %s", d, fields, f->srv.url, f->cache),
                   1);
  print_message("%s", out);
  assert_non_null(strstr(out, "evil -> "));
  assert_non_null(strstr(out, "outside.txt"));
  assert_non_null(strstr(out, "dangling (dangling)"));
}

/* 13. The command builder's {out}: links inside are kept, a link out of it
 * fails the key, naming the link. */
static void test_command_builder_symlinks(void **state) {
  fx *f = *state;
  char w[400], p[600], script[800], err[KC_ERRBUF_SIZE];
  kc_warm_report r;
  kc_warmup *wu = NULL;
  kc_client *c = client_for(f->cache, NULL);
  kc_warm_opts o = {.out_dir = f->out};
  cmd_warmup(f, "w13", "printf hi > {out}/real.txt && ln -s real.txt "
             "{out}/alias.txt && mkdir {out}/d && ln -s ../real.txt "
             "{out}/d/up.txt", w, sizeof w);
  assert_int_equal(kc_warmup_load(w, &wu, err), KC_OK);
  assert_int_equal(kc_warm(c, wu, &o, &r, err), KC_OK);
  assert_int_equal(count(&r, KC_WARM_BUILT), 1);
  assert_int_equal(r.items[0].n_files, 3);
  kc_warm_report_free(&r);
  kc_warmup_free(wu);
  snprintf(p, sizeof p, "%s/sm_90a/batch=1/alias.txt", f->out);
  assert_string_equal(text_of(p), "hi");
  snprintf(p, sizeof p, "%s/sm_90a/batch=1/d/up.txt", f->out);
  assert_string_equal(text_of(p), "hi");
  snprintf(p, sizeof p, "%s/outside.txt", f->dir);
  write_text(p, "secret");
  snprintf(script, sizeof script,
           "printf hi > {out}/real.txt && ln -s %s {out}/leak", p);
  cmd_warmup(f, "w13b", script, w, sizeof w);
  assert_int_equal(kc_warmup_load(w, &wu, err), KC_OK);
  assert_int_equal(kc_warm(c, wu, &o, &r, err), KC_UNSAFE_PATH);
  print_message("%s\n", r.items[0].message);
  assert_int_equal(r.items[0].status, KC_WARM_FAILED);
  assert_non_null(strstr(r.items[0].message, "leak -> "));
  kc_warm_report_free(&r);
  kc_warmup_free(wu);
  kc_client_free(c);
}

/* ---- demand feedback (kc_demand_note against a real kcached) ---- */

/* GET /v1/models/MODEL/demand's body (malloc'd) once its total reaches want,
 * or after 8 s. */
static char *demand_body(fx *f, uint64_t want) {
  long end = kc_testsrv_now_ms() + 8000;
  for (;;) {
    kc_testsrv_resp r = kc_testsrv_http(
        NULL, f->srv.url, "/v1/models/" MODEL "/demand", (kc_testsrv_req){0});
    assert_int_equal(r.status, 200);
    const char *t = strstr(r.body, "\"total\":");
    assert_non_null(t);
    if (strtoull(t + 8, NULL, 10) >= want || kc_testsrv_now_ms() > end) {
      char *b = strdup(r.body);
      kc_testsrv_resp_free(&r);
      return b;
    }
    kc_testsrv_resp_free(&r);
    kc_testsrv_sleep_ms(100);
  }
}

static uint64_t demand_total(const char *body) {
  return strtoull(strstr(body, "\"total\":") + 8, NULL, 10);
}

typedef struct noter {
  kc_client *c;
  int n;
} noter;

static void *note_many(void *arg) {
  noter *t = arg;
  kc_bucket b = {.n = 1, .dims = {{"batch", 1}}};
  for (int i = 0; i < t->n; i++)
    if (kc_demand_note(t->c, MODEL, &b) != KC_OK)
      return (void *)1;
  return NULL;
}

/* Notes from several threads, a warm's missed key and the buckets it
 * learnt (a shape beyond them is a miss), an explicit flush, the background
 * thread's own send, the send at kc_client_free, and bad input. */
static void test_demand_note(void **state) {
  fx *f = *state;
  char w[400], key[65], err[KC_ERRBUF_SIZE];
  start_server(f);
  kc_client *c = client_for(f->cache, f->srv.url);
  cmd_warmup(f, "w17", "printf x > {out}/k.bin", w, sizeof w);
  cmd_key(w, key);
  kc_warmup *wu = NULL;
  kc_warm_report r;
  assert_int_equal(kc_warmup_load(w, &wu, err), KC_OK);
  assert_int_equal(kc_warm(c, wu, NULL, &r, err), KC_OK);
  assert_int_equal(count(&r, KC_WARM_BUILT), 1); /* asked for, not there */
  kc_warm_report_free(&r);
  kc_warmup_free(wu);
  kc_bucket five = {.n = 1, .dims = {{"batch", 5}}};
  assert_int_equal(kc_demand_note(c, MODEL, &five), KC_OK);
  assert_int_equal(kc_demand_note(c, MODEL, &five), KC_OK);
  pthread_t th[4];
  noter nt = {c, 500};
  for (int i = 0; i < 4; i++)
    assert_int_equal(pthread_create(&th[i], NULL, note_many, &nt), 0);
  for (int i = 0; i < 4; i++) {
    void *rv;
    pthread_join(th[i], &rv);
    assert_null(rv);
  }
  assert_int_equal(kc_demand_flush(c, 5000, err), KC_OK);
  kc_demand_stats st;
  kc_demand_get_stats(c, &st);
  /* 2000 + 2 shapes, 2 shape misses, 1 key miss. */
  assert_int_equal(st.noted, 2005);
  assert_int_equal(st.sent, 2005);
  assert_int_equal(st.dropped + st.failed, 0);
  char *b = demand_body(f, 2005);
  assert_int_equal(demand_total(b), 2005);
  const char *misses = strstr(b, "\"misses\":");
  assert_non_null(misses);
  assert_non_null(strstr(misses, key));
  assert_non_null(strstr(misses, "\"batch\":5"));
  assert_null(strstr(misses, "\"batch\":1}")); /* held by the bucket */
  assert_non_null(strstr(b, "{\"batch\":1},\"count\":2000}"));
  free(b);
  /* The thread sends without a flush. */
  kc_bucket seven = {.n = 2, .dims = {{"seq", 7}, {"batch", 1}}};
  assert_int_equal(kc_demand_note(c, MODEL, &seven), KC_OK);
  b = demand_body(f, 2007);
  assert_int_equal(demand_total(b), 2007);
  free(b);
  /* And kc_client_free sends what is left. */
  assert_int_equal(kc_demand_note(c, MODEL, &seven), KC_OK);
  kc_client_free(c);
  b = demand_body(f, 2009);
  assert_int_equal(demand_total(b), 2009);
  free(b);
  /* Bad input counts nothing; no server: nothing kept, no wait. */
  c = client_for(f->cache, f->srv.url);
  kc_bucket bad = {.n = 1, .dims = {{"Batch", 1}}};
  assert_int_equal(kc_demand_note(c, MODEL, &bad), KC_EINVAL);
  assert_int_equal(kc_demand_note(c, "xyz", &five), KC_EINVAL);
  assert_int_equal(kc_demand_note(c, MODEL, NULL), KC_EINVAL);
  kc_demand_get_stats(c, &st);
  assert_int_equal(st.noted, 0);
  kc_client_free(c);
}

/* A server that is down costs a note nothing, and kc_client_free at most
 * its short timeout; the counts are reported as failed. */
static void test_demand_server_down(void **state) {
  fx *f = *state;
  start_server(f);
  char url[64];
  snprintf(url, sizeof url, "%s", f->srv.url);
  kc_testsrv_stop(&f->srv);
  kc_client *c = client_for(f->cache, url);
  kc_bucket b = {.n = 1, .dims = {{"batch", 3}}};
  long t0 = kc_testsrv_now_ms();
  for (int i = 0; i < 10000; i++)
    assert_int_equal(kc_demand_note(c, MODEL, &b), KC_OK);
  assert_true(kc_testsrv_now_ms() - t0 < 1000);
  char err[KC_ERRBUF_SIZE] = "";
  kc_demand_flush(c, 500, err); /* fails, unless the thread sent it all */
  kc_demand_stats st;
  kc_demand_get_stats(c, &st);
  assert_int_equal(st.failed, 10000);
  for (int i = 0; i < 10; i++)
    kc_demand_note(c, MODEL, &b);
  t0 = kc_testsrv_now_ms();
  kc_client_free(c);
  assert_true(kc_testsrv_now_ms() - t0 < 3000);
}

/* kcache suggest end to end: shapes noted through libkcache, the CLI reads
 * them back from kcached, prints padding before and after, writes a valid
 * manifest with the suggested buckets, and warm takes it. */
static void test_suggest_cli(void **state) {
  fx *f = *state;
  char w[400], w2[400], out[8192], err[KC_ERRBUF_SIZE];
  start_server(f);
  kc_client *c = client_for(f->cache, f->srv.url);
  static const struct { uint64_t batch, seq; int n; } seen[] = {
      {1, 100, 50}, {2, 120, 30}, {3, 900, 20}, {8, 1000, 5}};
  for (size_t i = 0; i < 4; i++) {
    kc_bucket b = {.n = 2, .dims = {{"batch", seen[i].batch},
                                    {"seq", seen[i].seq}}};
    for (int j = 0; j < seen[i].n; j++)
      assert_int_equal(kc_demand_note(c, MODEL, &b), KC_OK);
  }
  kc_bucket other = {.n = 1, .dims = {{"tokens", 5}}};
  assert_int_equal(kc_demand_note(c, MODEL, &other), KC_OK);
  assert_int_equal(kc_demand_flush(c, 5000, err), KC_OK);
  kc_client_free(c);
  free(demand_body(f, 106));
  snprintf(w, sizeof w, "%s/w.json", f->dir);
  snprintf(w2, sizeof w2, "%s/w2.json", f->dir);
  write_text(w,
             "{\"schema\":\"kcache.warmup/v1\",\"model\":{\"name\":\"t\","
             "\"hash\":\"%s\"},\"archs\":[\"sm_90a\"],\"builder\":{"
             "\"command\":[\"sh\",\"-c\",\"printf x > {out}/k.bin\"]},"
             "\"buckets\":[{\"batch\":1,\"seq\":128},{\"batch\":8,"
             "\"seq\":512}]}",
             MODEL);
  int rc = run_cli(out, sizeof out,
                   "suggest --url %s --manifest %s --buckets 2 --out %s",
                   f->srv.url, w, w2);
  print_message("%s", out);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "105 runs of 4 distinct shapes (batch,seq); "
                              "1 runs of other dimensions ignored"));
  assert_non_null(strstr(out, "before: 2 buckets, padding 13340 (166.75 per "
                              "run), 25 runs beyond every bucket"));
  assert_non_null(strstr(out, "after:  3 buckets, padding 3130"));
  kc_warmup *wu = NULL;
  assert_int_equal(kc_warmup_load(w2, &wu, err), KC_OK);
  assert_int_equal(wu->n_buckets, 3);
  char label[256];
  kc_bucket_label(&wu->buckets[0], label, sizeof label);
  assert_string_equal(label, "batch=3,seq=120");
  kc_bucket_label(&wu->buckets[2], label, sizeof label);
  assert_string_equal(label, "batch=8,seq=1000");
  assert_int_equal(wu->n_command, 3); /* the rest is kept */
  kc_warmup_free(wu);
  /* Enough buckets: no padding. */
  rc = run_cli(out, sizeof out, "suggest --url %s %s", f->srv.url, MODEL);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "after:  4 buckets, padding 0 "));
  /* Then warm takes the suggested manifest. */
  rc = run_cli(out, sizeof out, "warm --url %s --cache-dir %s %s --quiet",
               f->srv.url, f->cache, w2);
  assert_int_equal(rc, 0);
  rc = run_cli(out, sizeof out, "ls --url %s %s", f->srv.url, MODEL);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "\"seq\":120"));
  /* The warm stored w2 (named "t"): suggest takes the name, as ls and purge
   * do, and without --manifest its 'before' is the manifest kcached holds
   * (w2's three buckets: the padding suggested above). */
  rc = run_cli(out, sizeof out, "suggest --url %s t --buckets 2", f->srv.url);
  print_message("%s", out);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "before: 3 buckets, padding 3130"));
  assert_non_null(strstr(out, "warmup manifest kcached holds"));
  /* Usage errors. */
  assert_int_equal(run_cli(out, sizeof out, "suggest --url %s --out %s %s",
                           f->srv.url, w2, MODEL), 2);
  assert_int_equal(run_cli(out, sizeof out, "suggest --url %s abc",
                           f->srv.url), 1);
  assert_non_null(strstr(out, "no model named 'abc'"));
  assert_int_equal(run_cli(out, sizeof out, "suggest --url %s --buckets 0 %s",
                           f->srv.url, MODEL), 2);
  assert_int_equal(run_cli(out, sizeof out,
                           "suggest --url %s --manifest %s "
                           "11111111111111111111111111111111"
                           "11111111111111111111111111111111",
                           f->srv.url, w), 2);
  assert_non_null(strstr(out, "not the manifest's model.hash"));
}

/* ---- models by name, coverage, purge ---- */

/* A command-builder warmup named "refill-model": batch 1 and 2 on sm_80 and
 * sm_90a (no toolkit needed). */
static void refill_warmup(fx *f, char *path, size_t size) {
  snprintf(path, size, "%s/refill.json", f->dir);
  write_text(path,
             "{\"schema\":\"kcache.warmup/v1\",\"model\":{\"name\":"
             "\"refill-model\",\"hash\":\"%s\"},\"archs\":[\"sm_80\","
             "\"sm_90a\"],\"builder\":{\"command\":[\"sh\",\"-c\","
             "\"printf x{arch}{batch} > {out}/k.cubin\"],\"timeout_s\":30},"
             "\"buckets\":[{\"batch\":1},{\"batch\":2}]}",
             MODEL);
}

/* `kcache warm` stores its warmup manifest, so `kcache ls` names the model
 * and its coverage; `kcache purge NAME` drops every bundle; a warm from
 * another (empty) cache then fills the model again, 4/4. A read token's
 * warm skips the manifest upload without a word. */
static void test_warm_purge_refill(void **state) {
  fx *f = *state;
  char w[400], out[8192];
  start_server(f);
  refill_warmup(f, w, sizeof w);
  assert_int_equal(run_cli(out, sizeof out, "warm %s --url %s --cache-dir "
                           "%s/c1", w, f->srv.url, f->dir), 0);
  assert_non_null(strstr(out, "4 built"));
  assert_null(strstr(out, "warmup manifest was not stored"));
  assert_int_equal(run_cli(out, sizeof out, "ls --url %s", f->srv.url), 0);
  assert_non_null(strstr(out, "refill-model"));
  assert_non_null(strstr(out, "4/4"));
  assert_int_equal(run_cli(out, sizeof out, "ls refill-model --matrix --url "
                           "%s", f->srv.url), 0);
  assert_non_null(strstr(out, "4/4 present"));
  assert_non_null(strstr(out, "batch=2"));
  assert_int_equal(run_cli(out, sizeof out, "ls refill-model --url %s",
                           f->srv.url), 0);
  assert_int_equal(occurrences(out, " hits"), 4);
  /* a name is confirmed with its hash: without --confirm, nothing goes */
  assert_int_equal(run_cli(out, sizeof out, "purge refill-model --url %s",
                           f->srv.url), 1);
  assert_non_null(strstr(out, MODEL));
  assert_non_null(strstr(out, "nothing deleted"));
  assert_int_equal(run_cli(out, sizeof out, "purge refill-model --url %s "
                           "--confirm %.12s", f->srv.url, MODEL), 0);
  assert_non_null(strstr(out, "purged 4 bundles"));
  /* the name went with the manifest; the hash still answers, empty */
  assert_int_equal(run_cli(out, sizeof out, "ls refill-model --url %s",
                           f->srv.url), 1);
  assert_non_null(strstr(out, "no model named 'refill-model'"));
  assert_int_equal(run_cli(out, sizeof out, "ls %s --url %s", MODEL,
                           f->srv.url), 0);
  assert_int_equal(occurrences(out, " hits"), 0);
  /* another replica's empty cache: nothing on the server, so it builds
   * and uploads, and the model is whole again */
  assert_int_equal(run_cli(out, sizeof out, "warm %s --url %s --cache-dir "
                           "%s/c2", w, f->srv.url, f->dir), 0);
  assert_non_null(strstr(out, "4 built"));
  assert_int_equal(run_cli(out, sizeof out, "ls refill-model --matrix --url "
                           "%s", f->srv.url), 0);
  assert_non_null(strstr(out, "4/4 present"));
  assert_int_equal(run_cli(out, sizeof out, "purge nobody --url %s",
                           f->srv.url), 1);
  assert_int_equal(run_cli(out, sizeof out, "purge --url %s", f->srv.url), 2);
}

/* The coverage matrix's columns are the archs the warms ran for: the
 * manifest lists sm_80 and sm_90a; a warm with --arch sm_86 shows its two
 * bundles present under sm_86 (not 0/4 with two "no longer expected"),
 * and a second warm with the README's CI line adds its three archs. */
static void test_matrix_warm_archs(void **state) {
  fx *f = *state;
  char w[400], out[8192];
  start_server(f);
  refill_warmup(f, w, sizeof w);
  assert_int_equal(run_cli(out, sizeof out, "warm %s --arch sm_86 --url %s "
                           "--cache-dir %s/c1", w, f->srv.url, f->dir), 0);
  assert_non_null(strstr(out, "2 built"));
  assert_int_equal(run_cli(out, sizeof out, "ls refill-model --matrix --url "
                           "%s", f->srv.url), 0);
  print_message("%s", out);
  assert_non_null(strstr(out, "2/2 present"));
  assert_non_null(strstr(out, "archs: those its warms ran for (the manifest "
                              "lists sm_80 sm_90a)"));
  assert_non_null(strstr(out, " sm_86"));
  assert_null(strstr(out, "no longer expected"));
  assert_int_equal(run_cli(out, sizeof out, "warm %s --arch sm_80,sm_90a,"
                           "sm_100f --url %s --cache-dir %s/c1", w,
                           f->srv.url, f->dir), 0);
  assert_int_equal(run_cli(out, sizeof out, "ls refill-model --matrix --url "
                           "%s", f->srv.url), 0);
  print_message("%s", out);
  assert_non_null(strstr(out, "8/8 present"));
  assert_non_null(strstr(out, " sm_100f"));
}

#define VICTIM "9f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"

/* A command-builder warmup of one bucket on sm_80, named name, for hash. */
static void named_warmup(fx *f, const char *file, const char *name,
                         const char *hash, char *path, size_t size) {
  snprintf(path, size, "%s/%s", f->dir, file);
  write_text(path,
             "{\"schema\":\"kcache.warmup/v1\",\"model\":{\"name\":"
             "\"%s\",\"hash\":\"%s\"},\"archs\":[\"sm_80\"],\"builder\":"
             "{\"command\":[\"sh\",\"-c\",\"printf x{batch} > "
             "{out}/k.cubin\"],\"timeout_s\":30},\"buckets\":[{\"batch\":1},"
             "{\"batch\":2}]}",
             name, hash);
}

/* The purge of the wrong model: a write token re-points the name an admin
 * purges (names the victim demo-mlp and renames demo-mlp away). The server
 * keeps a name with its first model (the forged manifests are refused and
 * the warm says so), and a purge by name deletes only after the hash is
 * confirmed: the victim keeps its bundles. */
static void test_purge_by_forged_name(void **state) {
  fx *f = *state;
  char w[400], out[8192], tokens[400], wtok[256] = "", atok[256] = "";
  snprintf(tokens, sizeof tokens, "%s/tokens", f->dir);
  make_token("write", "ci", tokens, wtok, sizeof wtok);
  make_token("admin", "ops", tokens, atok, sizeof atok);
  assert_int_equal(kc_testsrv_init(&f->srv), 0);
  const char *args[] = {"--tokens", tokens, NULL};
  assert_int_equal(kc_testsrv_start(&f->srv, args), 0);
  f->have_srv = 1;
  named_warmup(f, "demo.json", "demo-mlp", MODEL, w, sizeof w);
  assert_int_equal(run_cli(out, sizeof out, "warm %s --url %s --token %s "
                           "--cache-dir %s/c1", w, f->srv.url, wtok, f->dir),
                   0);
  named_warmup(f, "llm.json", "big-llm", VICTIM, w, sizeof w);
  assert_int_equal(run_cli(out, sizeof out, "warm %s --url %s --token %s "
                           "--cache-dir %s/c1", w, f->srv.url, wtok, f->dir),
                   0);
  /* the attack: the victim named demo-mlp, demo-mlp renamed away */
  named_warmup(f, "forged.json", "demo-mlp", VICTIM, w, sizeof w);
  assert_int_equal(run_cli(out, sizeof out, "warm %s --url %s --token %s "
                           "--cache-dir %s/c1", w, f->srv.url, wtok, f->dir),
                   0);
  assert_non_null(strstr(out, "warmup manifest was not stored"));
  assert_non_null(strstr(out, "belongs to model " MODEL));
  named_warmup(f, "away.json", "renamed", MODEL, w, sizeof w);
  assert_int_equal(run_cli(out, sizeof out, "warm %s --url %s --token %s "
                           "--cache-dir %s/c1", w, f->srv.url, wtok, f->dir),
                   0);
  assert_non_null(strstr(out, "renaming it needs an admin token"));
  /* the admin's purge by name: the hash is shown, nothing deleted */
  assert_int_equal(run_cli(out, sizeof out, "purge demo-mlp --url %s "
                           "--token %s", f->srv.url, atok), 1);
  assert_non_null(strstr(out, "is model " MODEL " (2 bundles)"));
  assert_int_equal(run_cli(out, sizeof out, "purge demo-mlp --url %s "
                           "--token %s --confirm %.12s", f->srv.url, atok,
                           VICTIM), 1);
  assert_non_null(strstr(out, "is not its hash"));
  assert_int_equal(run_cli(out, sizeof out, "purge demo-mlp --url %s "
                           "--token %s --confirm %.11s", f->srv.url, atok,
                           MODEL), 1); /* too short to confirm */
  assert_int_equal(run_cli(out, sizeof out, "ls big-llm --url %s --token %s",
                           f->srv.url, atok), 0);
  assert_int_equal(occurrences(out, " hits"), 2);
  assert_int_equal(run_cli(out, sizeof out, "purge demo-mlp --url %s "
                           "--token %s --confirm %.12s", f->srv.url, atok,
                           MODEL), 0);
  assert_non_null(strstr(out, "purged 2 bundles of " MODEL));
  assert_int_equal(run_cli(out, sizeof out, "ls big-llm --url %s --token %s",
                           f->srv.url, atok), 0);
  assert_int_equal(occurrences(out, " hits"), 2); /* the victim's are kept */
}

/* With tokens: a read token's warm says nothing of the manifest (403 is
 * expected), a write token's stores it; purge needs admin. */
static void test_warm_manifest_roles(void **state) {
  fx *f = *state;
  char w[400], out[8192], tokens[400], rtok[256] = "", wtok[256] = "";
  snprintf(tokens, sizeof tokens, "%s/tokens", f->dir);
  make_token("read", "svc", tokens, rtok, sizeof rtok);
  make_token("write", "ci", tokens, wtok, sizeof wtok);
  assert_int_equal(kc_testsrv_init(&f->srv), 0);
  const char *args[] = {"--tokens", tokens, NULL};
  assert_int_equal(kc_testsrv_start(&f->srv, args), 0);
  f->have_srv = 1;
  refill_warmup(f, w, sizeof w);
  assert_int_equal(run_cli(out, sizeof out, "warm %s --url %s --token %s "
                           "--cache-dir %s/r", w, f->srv.url, rtok, f->dir),
                   0);
  assert_null(strstr(out, "warmup manifest"));
  assert_int_equal(run_cli(out, sizeof out, "ls --url %s --token %s",
                           f->srv.url, rtok), 0);
  assert_null(strstr(out, "refill-model"));
  assert_int_equal(run_cli(out, sizeof out, "warm %s --url %s --token %s "
                           "--cache-dir %s/w", w, f->srv.url, wtok, f->dir),
                   0);
  assert_int_equal(run_cli(out, sizeof out, "ls --url %s --token %s",
                           f->srv.url, rtok), 0);
  assert_non_null(strstr(out, "refill-model"));
  assert_int_equal(run_cli(out, sizeof out, "purge refill-model --url %s "
                           "--token %s --confirm %.12s", f->srv.url, wtok,
                           MODEL), 1);
  assert_non_null(strstr(out, "403"));
}

/* ---- file-system cost of a fetch ---- */

/* Entries of a directory other than . and .. */
static int entries_in(const char *dir) {
  char cmd[600], out[64] = "";
  snprintf(cmd, sizeof cmd, "ls -A '%s' | wc -l", dir);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  assert_non_null(fgets(out, sizeof out, p));
  pclose(p);
  return atoi(out);
}

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
    snprintf(p, sizeof p, "rm -rf '%s'/blobs/* '%s'/bundles/*", cache2,
             cache2);
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
    fake t = {.bundle_body = man, .fetch_body = body,
              .fetch_len = (size_t)hl + zl};
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
    fake t = {.bundle_body = man, .fetch_body = bodies[i],
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
  kc_client_opts o = {.url = s.url, .cache_dir = cache, .timeout_ms = 20000,
                      .connect_timeout_ms = 1000, .parallel = 1};
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
    fake s = {.bundle_body = man, .blob_body = "the real bytes",
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
  fake s = {.bundle_body = man, .blob_body = "the real bytes",
            .fetch_body = missing};
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

/* ---- compatible-arch fallback ---- */

/* A command-builder warmup for `archs` (a JSON list body: "\"sm_86\"") whose
 * build writes the arch it was built for to arch.txt; KC_FAIL=1 in the
 * environment makes it fail, KC_SLEEP=S makes it slow (neither is part of
 * the key, so every variant has the same keys). toolchain: "" or a JSON
 * object body. */
static void compat_warmup(fx *f, const char *name, const char *archs,
                          const char *toolchain, char *path, size_t size) {
  const char *n = getenv("KC_TEST_BUCKETS"); /* test_compat_many */
  int nb = n ? atoi(n) : 1;
  char buckets[8192] = "";
  for (int b = 1; b <= nb && strlen(buckets) < sizeof buckets - 32; b++)
    snprintf(buckets + strlen(buckets), sizeof buckets - strlen(buckets),
             "%s{\"batch\":%d}", b > 1 ? "," : "", b);
  snprintf(path, size, "%s/%s.json", f->dir, name);
  write_text(path,
             "{\"schema\":\"kcache.warmup/v1\",\"model\":{\"name\":\"t\","
             "\"hash\":\"%s\"},\"archs\":[%s],\"toolchain\":{%s},"
             "\"builder\":{\"command\":[\"sh\",\"-c\",\"[ -z $KC_SLEEP ] || "
             "sleep $KC_SLEEP; [ -z $KC_FAIL ] && printf {arch} > "
             "{out}/arch.txt\"],\"timeout_s\":60},\"buckets\":[%s]}",
             MODEL, archs, toolchain, buckets);
}

/* Puts the bundles of `archs` on the server (built and uploaded from a
 * cache of their own, no fallback). */
static void compat_seed(fx *f, const char *archs, const char *toolchain) {
  char w[400], out[8192];
  compat_warmup(f, "seed", archs, toolchain, w, sizeof w);
  int rc = run_cli(out, sizeof out,
                   "warm %s --url %s --cache-dir %s/seed --no-compat "
                   "--strict --quiet --jobs 8",
                   w, f->srv.url, f->dir);
  if (rc != 0)
    fail_msg("seeding %s: exit %d: %s", archs, rc, out);
}

/* `kcache warm` of a compat_warmup for `archs` from an empty cache dir
 * (named tag) with extra flags; its exit status, the JSON report in out. */
static int compat_warm(fx *f, const char *tag, const char *archs,
                       const char *toolchain, const char *env,
                       const char *flags, char *out, size_t size) {
  char w[400];
  compat_warmup(f, tag, archs, toolchain, w, sizeof w);
  int rc = run_cli_env(out, size, env,
                       "warm %s --url %s --cache-dir %s/%s --out %s/%s "
                       "--json %s",
                       w, f->srv.url, f->dir, tag, f->out, tag, flags);
  print_message("%s: exit %d\n%.1500s\n", tag, rc, out);
  return rc;
}

/* out/<tag>/<arch>/batch=1/arch.txt: which arch's build was materialized. */
static const char *built_for(fx *f, const char *tag, const char *arch) {
  char p[700];
  snprintf(p, sizeof p, "%s/%s/%s/batch=1/arch.txt", f->out, tag, arch);
  return text_of(p);
}

/* An L40S (8.9) replica whose CI built only sm_86: hit-compat sm_86 in
 * one lookup, no build; the report says which arch served, and --out
 * holds sm_86's build under the arch asked for. The same through
 * KCACHE_DEVICE_ARCH. */
static void test_compat_hit(void **state) {
  fx *f = *state;
  char out[16384];
  start_server(f);
  compat_seed(f, "\"sm_86\"", "");
  assert_int_equal(compat_warm(f, "c1", "\"sm_89\"", "", "",
                               "--device-arch sm_89 --no-build --strict", out,
                               sizeof out),
                   0);
  assert_non_null(strstr(out, "\"status\": \"hit-compat\""));
  assert_non_null(strstr(out, "\"arch\": \"sm_86\""));
  assert_non_null(strstr(out, "\"hit-compat\": 1"));
  assert_non_null(strstr(out, "hit-compat sm_89"));    /* the human line */
  assert_non_null(strstr(out, "(used sm_86)"));
  assert_string_equal(built_for(f, "c1", "sm_89"), "sm_86");
  assert_int_equal(compat_warm(f, "c2", "\"sm_89\"", "",
                               "KCACHE_DEVICE_ARCH=8.9", "--no-build --strict",
                               out, sizeof out),
                   0);
  assert_non_null(strstr(out, "\"hit-compat\": 1"));
  /* a device sm_86 does not run on: no fallback */
  assert_int_equal(compat_warm(f, "c3", "\"sm_89\"", "", "",
                               "--device-arch 9.0 --no-build --strict", out,
                               sizeof out),
                   1);
  assert_non_null(strstr(out, "\"failed\": 1"));
  assert_non_null(strstr(out, "\"hit-compat\": 0"));
  /* a bad device arch is a usage error */
  assert_int_equal(compat_warm(f, "c4", "\"sm_89\"", "", "",
                               "--device-arch gfx90a", out, sizeof out),
                   2);
  assert_int_equal(compat_warm(f, "c5", "\"sm_89\"", "",
                               "KCACHE_DEVICE_ARCH=sm_8", "", out,
                               sizeof out),
                   2);
}

/* Never a wrong match: an sm_90a cubin does not serve 10.0 (nor 9.0's
 * sm_90 asked on a 10.0 device), while it does serve sm_90 on 9.0. */
static void test_compat_never_wrong(void **state) {
  fx *f = *state;
  char out[16384];
  start_server(f);
  compat_seed(f, "\"sm_90a\"", "");
  assert_int_equal(compat_warm(f, "n1", "\"sm_100\"", "", "",
                               "--device-arch sm_100 --no-build --strict", out,
                               sizeof out),
                   1);
  assert_non_null(strstr(out, "\"failed\": 1"));
  assert_non_null(strstr(out, "\"hit-compat\": 0"));
  assert_int_equal(compat_warm(f, "n2", "\"sm_90\"", "", "",
                               "--device-arch sm_100 --no-build --strict", out,
                               sizeof out),
                   1);
  assert_non_null(strstr(out, "\"hit-compat\": 0"));
  assert_int_equal(compat_warm(f, "n3", "\"sm_90\"", "", "",
                               "--device-arch sm_90 --no-build --strict", out,
                               sizeof out),
                   0);
  assert_non_null(strstr(out, "\"hit-compat\": 1"));
  assert_string_equal(built_for(f, "n3", "sm_90"), "sm_90a");
}

/* PTX: compute_80 serves 8.9 when the driver reads its ISA (nvrtc 12.8
 * writes PTX ISA 8.7; a 12.8 driver reads it), never when it is older
 * (12.6 reads 8.5). The manifest pins the driver, which the keys hold. */
static void test_compat_ptx(void **state) {
  fx *f = *state;
  char out[16384];
  const char *tc = "\"nvrtc\":\"12.8\",\"cuda\":\"12.8\",\"driver\":\"12.8\"";
  const char *old = "\"nvrtc\":\"12.8\",\"cuda\":\"12.8\",\"driver\":\"12.6\"";
  start_server(f);
  compat_seed(f, "\"compute_80\"", tc);
  compat_seed(f, "\"compute_80\"", old);
  assert_int_equal(compat_warm(f, "p1", "\"sm_89\"", tc, "",
                               "--device-arch 8.9 --no-build --strict", out,
                               sizeof out),
                   0);
  assert_non_null(strstr(out, "\"arch\": \"compute_80\""));
  assert_string_equal(built_for(f, "p1", "sm_89"), "compute_80");
  assert_int_equal(compat_warm(f, "p2", "\"sm_89\"", old, "",
                               "--device-arch 8.9 --no-build --strict", out,
                               sizeof out),
                   1);
  assert_non_null(strstr(out, "\"hit-compat\": 0"));
}

/* --no-compat: the missing key is built (or fails with --no-build);
 * --prefer-build: built here when the builder works, the stand-in only
 * when the build fails or does not finish before the deadline. */
static void test_compat_flags(void **state) {
  fx *f = *state;
  char out[16384];
  start_server(f);
  compat_seed(f, "\"sm_86\"", "");
  assert_int_equal(compat_warm(f, "f1", "\"sm_89\"", "", "",
                               "--device-arch sm_89 --no-compat --no-build "
                               "--strict",
                               out, sizeof out),
                   1);
  assert_non_null(strstr(out, "\"hit-compat\": 0"));
  assert_int_equal(compat_warm(f, "f2", "\"sm_89\"", "", "",
                               "--device-arch sm_89 --no-compat --no-upload "
                               "--strict",
                               out, sizeof out),
                   0);
  assert_non_null(strstr(out, "\"built\": 1"));
  assert_string_equal(built_for(f, "f2", "sm_89"), "sm_89");
  /* prefer-build, the build works: built, not hit-compat */
  assert_int_equal(compat_warm(f, "f3", "\"sm_89\"", "", "",
                               "--device-arch sm_89 --prefer-build --no-upload "
                               "--strict",
                               out, sizeof out),
                   0);
  assert_non_null(strstr(out, "\"built\": 1"));
  assert_non_null(strstr(out, "\"hit-compat\": 0"));
  assert_string_equal(built_for(f, "f3", "sm_89"), "sm_89");
  /* prefer-build, the build fails: the stand-in after all */
  assert_int_equal(compat_warm(f, "f4", "\"sm_89\"", "", "KC_FAIL=1",
                               "--device-arch sm_89 --prefer-build --no-upload "
                               "--strict",
                               out, sizeof out),
                   0);
  assert_non_null(strstr(out, "\"hit-compat\": 1"));
  assert_non_null(strstr(out, "build was not ready"));
  assert_string_equal(built_for(f, "f4", "sm_89"), "sm_86");
  /* prefer-build, the build outlives the deadline: the stand-in at it */
  double t0 = now_s();
  assert_int_equal(compat_warm(f, "f5", "\"sm_89\"", "", "KC_SLEEP=30",
                               "--device-arch sm_89 --prefer-build --no-upload "
                               "--deadline 2 --strict",
                               out, sizeof out),
                   0);
  assert_true(now_s() - t0 < 15);
  assert_non_null(strstr(out, "\"hit-compat\": 1"));
  assert_string_equal(built_for(f, "f5", "sm_89"), "sm_86");
}

/* More pending keys than go with their stand-ins in one lookup
 * (KCC_COMPAT_INLINE, 256): the keys first, then the stand-ins of the
 * missing ones; 300 hit-compat, and the one key the server has is a plain
 * hit-remote. */
static void test_compat_many(void **state) {
  fx *f = *state;
  static char out[1 << 20]; /* 300 items of JSON */
  start_server(f);
  setenv("KC_TEST_BUCKETS", "300", 1);
  compat_seed(f, "\"sm_86\"", "");
  assert_int_equal(compat_warm(f, "m1", "\"sm_89\",\"sm_86\"", "", "",
                               "--device-arch sm_89 --no-build --strict "
                               "--quiet",
                               out, sizeof out),
                   0);
  assert_non_null(strstr(out, "\"hit-compat\": 300"));
  assert_non_null(strstr(out, "\"hit-remote\": 300"));
  /* again into the same cache: its bundles are found there (a warm of a
   * fresh cache skips looking for each key; this one must not) */
  assert_int_equal(compat_warm(f, "m1", "\"sm_89\",\"sm_86\"", "", "",
                               "--device-arch sm_89 --no-build --strict "
                               "--quiet",
                               out, sizeof out),
                   0);
  unsetenv("KC_TEST_BUCKETS");
  assert_non_null(strstr(out, "\"hit-local\": 300"));
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

int main(void) {
  /* Commands run without --cache-dir must not touch ~/.cache. */
  char home_cache[256];
  const char *tmp = getenv("TMPDIR");
  snprintf(home_cache, sizeof home_cache, "%s/kcache-default-XXXXXX",
           tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(home_cache))
    return 1;
  setenv("KCACHE_DIR", home_cache, 1);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  /* KC_TEST_FILTER=test_x*: run only the matching tests */
  if (getenv("KC_TEST_FILTER"))
    cmocka_set_test_filter(getenv("KC_TEST_FILTER"));
#define T(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)
  const struct CMUnitTest tests[] = {
      T(test_keys_pinned),
      T(test_keys_nvrtc_version),
      T(test_bucket_label_and_hash),
      T(test_local_cache),
      T(test_lookup_split),
      T(test_materialize),
      T(test_materialize_never_escapes),
      T(test_cli_usage),
      T(test_cli_key_hash),
      T(test_manifest_errors),
      T(test_cli_names_file_once),
      T(test_cli_env_and_flags),
      T(test_plaintext_token),
      T(test_cli_verify),
      T(test_warm_offline),
      T(test_warm_build_failure),
      T(test_warm_stale_metadata),
      T(test_warm_command_builder),
      T(test_cold_then_remote),
      T(test_cli_roundtrip),
      T(test_server_down),
      T(test_two_warmers),
      T(test_deadline),
      T(test_server_blob_flipped),
      T(test_tokens),
      T(test_https),
      T(test_served_blob_corrupt),
      T(test_fetch_batch_verified),
      T(test_fetch_batch_fallback),
      T(test_fetch_batch_writer),
      T(test_served_path_traversal),
      T(test_fault_lookup),
      T(test_fault_blob),
      T(test_fault_blob_stall_serial),
      T(test_fault_stall_builds),
      T(test_fault_fallback_build),
      T(test_local_blob_not_a_blob),
      T(test_deadline_still_materializes),
      T(test_blob_flood),
      T(test_drip_feed),
      T(test_cache_dir_private),
      T(test_cache_manifest_swapped),
      T(test_lease_squatter),
      T(test_push_symlinks),
      T(test_command_builder_symlinks),
      T(test_demand_note),
      T(test_demand_server_down),
      T(test_suggest_cli),
      T(test_warm_purge_refill),
      T(test_purge_by_forged_name),
      T(test_matrix_warm_archs),
      T(test_warm_manifest_roles),
      T(test_compat_hit),
      T(test_compat_never_wrong),
      T(test_compat_ptx),
      T(test_compat_flags),
      T(test_fetch_small_and_large),
      T(test_compat_many),
      T(test_warm_zstd),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  curl_global_cleanup();
  rmtree(home_cache);
  return rc;
}
