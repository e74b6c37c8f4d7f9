/* test_client_materialize.c: what libkcache leaves on disk around --out,
 * and what a warm asks of kcached after it: the umask is read, never set
 * (it is process-wide: another thread's file would get the wrong mode);
 * a warm removes only the --out directories it made (and those, when
 * their bundle did not come); a client whose token
 * was refused a write does not ask kcached which hit-local bundles it
 * lacks (it could not upload them). The real kcached (tests/testsrv.h). */
#include "clienttest.h"

/* libkcache's calls to umask(2) come here (-Wl,--wrap=umask): counted, so
 * a test can say the library never set it. The tests call __real_umask. */
mode_t __real_umask(mode_t mask);
static int umask_calls;
mode_t __wrap_umask(mode_t mask) {
  __atomic_add_fetch(&umask_calls, 1, __ATOMIC_SEQ_CST);
  return __real_umask(mask);
}

/* clienttest's client_for, with a token. */
static kc_client *client_tok(const char *cache, const char *url,
                             const char *token) {
  char err[KC_ERRBUF_SIZE];
  kc_client *c = NULL;
  kc_client_opts o = {.url = url,
                      .cache_dir = cache,
                      .token = token,
                      .timeout_ms = 20000,
                      .connect_timeout_ms = 1000};
  if (kc_client_new(&o, &c, err) != KC_OK)
    fail_msg("kc_client_new: %s", err);
  return c;
}

/* A command-builder warmup (no toolkit needed) of MODEL: 2 buckets, sm_80,
 * each bundle one file k.cubin; loaded into *w. */
static void mat_warmup(fx *f, kc_warmup **w) {
  char path[400], err[KC_ERRBUF_SIZE];
  snprintf(path, sizeof path, "%s/warmup.json", f->dir);
  write_text(path,
             "{\"schema\":\"kcache.warmup/v1\",\"model\":{\"name\":\"mat\","
             "\"hash\":\"%s\"},\"archs\":[\"sm_80\"],\"builder\":{\"command\":"
             "[\"sh\",\"-c\",\"printf x{arch}{batch} > {out}/k.cubin\"],"
             "\"timeout_s\":30},\"buckets\":[{\"batch\":1},{\"batch\":2}]}",
             MODEL);
  assert_int_equal(kc_warmup_load(path, w, err), KC_OK);
}

/* ---- the umask ---- */

/* kc_client_new reads the umask without setting it, and cached blobs and
 * the files --out links to them have 0444 less it (0440 under 027). */
static void test_umask_read_not_set(void **state) {
  fx *f = *state;
  char cache[400], out[400], p[700], err[KC_ERRBUF_SIZE], d[2][65], key[65];
  mode_t old = __real_umask(027);
  snprintf(cache, sizeof cache, "%s/cache", f->dir);
  snprintf(out, sizeof out, "%s/out", f->dir);
  int before = __atomic_load_n(&umask_calls, __ATOMIC_SEQ_CST);
  kc_client *c = client_tok(cache, NULL, NULL);
  int calls = __atomic_load_n(&umask_calls, __ATOMIC_SEQ_CST) - before;
  uint64_t sizes[2] = {3000, 5000};
  for (int i = 0; i < 2; i++) {
    unsigned char *b = kc_testsrv_bytes(40 + (uint64_t)i, sizes[i]);
    assert_int_equal(kc_cache_blob_put(c, b, sizes[i], d[i], err), KC_OK);
    free(b);
  }
  char *json = kc_testsrv_manifest(MODEL, 1, "sm_80", d, sizes, 2, key);
  assert_non_null(json);
  kc_manifest *m = NULL;
  assert_int_equal(kc_manifest_parse(json, strlen(json), &m, err), KC_OK);
  free(json);
  assert_int_equal(kc_materialize(c, m, out, err), KC_OK);
  calls = __atomic_load_n(&umask_calls, __ATOMIC_SEQ_CST) - before;
  for (size_t i = 0; i < m->n_files; i++) {
    struct stat bs, os;
    snprintf(p, sizeof p, "%s/blobs/%.2s/%s", cache, d[i], d[i]);
    assert_int_equal(lstat(p, &bs), 0);
    snprintf(p, sizeof p, "%s/%s", out, m->files[i].path);
    assert_int_equal(lstat(p, &os), 0);
    print_message("%s: blob mode %o, --out mode %o\n", m->files[i].path,
                  (unsigned)(bs.st_mode & 07777),
                  (unsigned)(os.st_mode & 07777));
    assert_int_equal(bs.st_mode & 07777, 0440);
    assert_int_equal(os.st_mode & 07777, 0440);
  }
  kc_manifest_free(m);
  kc_client_free(c);
  __real_umask(old);
  print_message("umask(2) calls by libkcache: %d\n", calls);
  assert_int_equal(calls, 0);
}

/* ---- --out directories ---- */

/* A warm whose bundles are not ready leaves the directories it did not
 * make as they were: an empty DIR/<arch>/<bucket>/ of the operator's (or
 * of an earlier warm) is not removed. */
static void test_out_keeps_foreign_dirs(void **state) {
  fx *f = *state;
  char cache[400], out[400], p[700], err[KC_ERRBUF_SIZE];
  kc_warmup *w = NULL;
  mat_warmup(f, &w);
  snprintf(cache, sizeof cache, "%s/cache", f->dir);
  snprintf(out, sizeof out, "%s/out", f->dir);
  for (int b = 1; b <= 2; b++) {
    snprintf(p, sizeof p, "%s/sm_80/batch=%d", out, b);
    char cmd[800];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", p);
    assert_int_equal(system(cmd), 0);
  }
  kc_client *c = client_tok(cache, NULL, NULL);
  kc_warm_opts o = {.no_build = 1, .out_dir = out, .no_compat = 1};
  kc_warm_report r;
  kc_err e = kc_warm(c, w, &o, &r, err);
  assert_int_not_equal(e, KC_OK); /* nothing to fetch, no build */
  assert_int_equal(r.counts[KC_WARM_FAILED], 2);
  kc_warm_report_free(&r);
  kc_client_free(c);
  kc_warmup_free(w);
  for (int b = 1; b <= 2; b++) {
    struct stat st;
    snprintf(p, sizeof p, "%s/sm_80/batch=%d", out, b);
    assert_int_equal(lstat(p, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
  }
}

/* ---- a fetch that does not bring every bundle ---- */

/* A command-builder warmup of n buckets, sm_80, each bundle one file of
 * 4 KiB of random bytes (stored as they are: rot can find them). */
static void random_warmup(fx *f, int n, kc_warmup **w) {
  char path[400], err[KC_ERRBUF_SIZE];
  snprintf(path, sizeof path, "%s/random.json", f->dir);
  FILE *fp = fopen(path, "w");
  assert_non_null(fp);
  fprintf(fp,
          "{\"schema\":\"kcache.warmup/v1\",\"model\":{\"name\":\"rnd\","
          "\"hash\":\"%s\"},\"archs\":[\"sm_80\"],\"builder\":{\"command\":"
          "[\"sh\",\"-c\",\"head -c 4096 /dev/urandom > {out}/k.cubin\"],"
          "\"timeout_s\":30},\"buckets\":[",
          MODEL);
  for (int b = 1; b <= n; b++)
    fprintf(fp, "%s{\"batch\":%d}", b > 1 ? "," : "", b);
  fprintf(fp, "]}");
  fclose(fp);
  assert_int_equal(kc_warmup_load(path, w, err), KC_OK);
}

static int bundle_cached(const char *cache, const char *key) {
  char p[600];
  struct stat st;
  snprintf(p, sizeof p, "%s/bundles/%s.json", cache, key);
  return lstat(p, &st) == 0;
}

/* A fetch of 32 bundles or more makes their --out directories while
 * their blobs come; a bundle whose blob came corrupt (rotted on kcached's
 * disk) fails (no build) and leaves no manifest in the local cache and no
 * directory under --out (this warm made it, and removes it); the others
 * have both. */
static void test_out_dir_of_failed_removed(void **state) {
  fx *f = *state;
  enum { N = 40, BAD = 7 };
  char seed[400], cache[400], out[400], p[700], err[KC_ERRBUF_SIZE];
  kc_warmup *w = NULL;
  assert_int_equal(kc_testsrv_start(&f->srv, NULL), 0);
  f->have_srv = 1;
  random_warmup(f, N, &w);
  snprintf(seed, sizeof seed, "%s/seed", f->dir);
  snprintf(cache, sizeof cache, "%s/cache", f->dir);
  snprintf(out, sizeof out, "%s/out", f->dir);
  kc_client *c = client_tok(seed, f->srv.url, NULL);
  kc_warm_opts o = {.no_compat = 1};
  kc_warm_report r;
  if (kc_warm(c, w, &o, &r, err) != KC_OK)
    fail_msg("seeding warm: %s", err);
  assert_int_equal(r.counts[KC_WARM_BUILT], N);
  char bad_key[65];
  memcpy(bad_key, r.items[BAD].key, sizeof bad_key);
  kc_warm_report_free(&r);
  kc_manifest *m = NULL;
  assert_int_equal(kc_cache_bundle_get(c, bad_key, &m, err), KC_OK);
  snprintf(p, sizeof p, "%s/blobs/%.2s/%s", seed, m->files[0].sha256,
           m->files[0].sha256);
  kc_manifest_free(m);
  kc_client_free(c);
  unsigned char needle[256];
  FILE *fp = fopen(p, "rb");
  assert_non_null(fp);
  assert_int_equal(fread(needle, 1, sizeof needle, fp), sizeof needle);
  fclose(fp);
  kc_testsrv_stop(&f->srv);
  assert_true(kc_testsrv_rot(&f->srv, needle, sizeof needle) >= 1);
  assert_int_equal(kc_testsrv_restart(&f->srv), 0);
  c = client_tok(cache, f->srv.url, NULL);
  kc_warm_opts o2 = {.no_compat = 1, .no_build = 1, .out_dir = out};
  assert_int_not_equal(kc_warm(c, w, &o2, &r, err), KC_OK);
  print_message("corrupt blob: %zu hit-remote, %zu failed (%s)\n",
                r.counts[KC_WARM_HIT_REMOTE], r.counts[KC_WARM_FAILED],
                r.items[BAD].message);
  assert_int_equal(r.counts[KC_WARM_HIT_REMOTE], N - 1);
  assert_int_equal(r.items[BAD].status, KC_WARM_FAILED);
  for (size_t i = 0; i < r.n_items; i++) {
    struct stat st;
    snprintf(p, sizeof p, "%s/sm_80/batch=%zu", out, i + 1);
    assert_int_equal(bundle_cached(cache, r.items[i].key), i != BAD);
    assert_int_equal(lstat(p, &st) == 0, i != BAD);
  }
  kc_warm_report_free(&r);
  kc_client_free(c);
  kc_warmup_free(w);
}

/* ---- the offer of hit-local bundles back to kcached ---- */

#define MODELS_GETS                                                            \
  "kcached_requests_total{route=\"models\",method=\"GET\",status=\"200\"}"

static double models_gets(const fx *f) {
  double v = kc_testsrv_metric(&f->srv, MODELS_GETS);
  return v < 0 ? 0 : v;
}

static void warm_with(kc_client *c, const kc_warmup *w, size_t n_local,
                      size_t n_built) {
  char err[KC_ERRBUF_SIZE];
  kc_warm_opts o = {.no_compat = 1};
  kc_warm_report r;
  kc_err e = kc_warm(c, w, &o, &r, err);
  if (e)
    fail_msg("warm: %s", err);
  assert_int_equal(r.counts[KC_WARM_HIT_LOCAL], n_local);
  assert_int_equal(r.counts[KC_WARM_BUILT], n_built);
  for (size_t i = 0; i < r.n_items; i++)
    assert_false(r.items[i].uploaded);
  kc_warm_report_free(&r);
}

/* A read token's client learns its role from its first refused write (the
 * lease): its next warm, all hit-local, does not GET /v1/models/{model}
 * (up to 2 s against a stalled kcached) for bundles it could not upload.
 * A client that does not know its role yet still asks. */
static void test_read_token_no_offer(void **state) {
  fx *f = *state;
  char tokens[400], rtok[256] = "", cache[400];
  kc_warmup *w = NULL;
  snprintf(tokens, sizeof tokens, "%s/tokens", f->dir);
  make_token("read", "svc", tokens, rtok, sizeof rtok);
  assert_int_equal(kc_testsrv_init(&f->srv), 0);
  const char *args[] = {"--tokens", tokens, NULL};
  assert_int_equal(kc_testsrv_start(&f->srv, args), 0);
  f->have_srv = 1;
  mat_warmup(f, &w);
  snprintf(cache, sizeof cache, "%s/cache", f->dir);
  kc_client *c = client_tok(cache, f->srv.url, rtok);
  warm_with(c, w, 0, 2); /* built here: the lease is refused (403) */
  double g0 = models_gets(f);
  warm_with(c, w, 2, 0); /* the same client: its role is known */
  double g1 = kc_testsrv_metric_settle(&f->srv, MODELS_GETS, g0, 500);
  kc_client_free(c);
  print_message("GET /v1/models/{m} by the client that knows: %.0f\n",
                (g1 < 0 ? 0 : g1) - g0);
  assert_true((g1 < 0 ? 0 : g1) == g0);
  /* a new client of the same token does not know yet: it asks once */
  c = client_tok(cache, f->srv.url, rtok);
  warm_with(c, w, 2, 0);
  double g2 = kc_testsrv_metric_settle(&f->srv, MODELS_GETS, g0 + 1, 2000);
  kc_client_free(c);
  kc_warmup_free(w);
  assert_true(g2 == g0 + 1);
}

/* ---- kc_client_blob_get_fd ---- */

/* A descriptor below 0 is a bad argument (KC_EINVAL), said before any
 * request: the sink would read it as "into a buffer" that this call has
 * not. Asked of a blob kcached holds, so that its bytes would come. */
static void test_blob_get_fd_negative(void **state) {
  fx *f = *state;
  char cache[400], err[KC_ERRBUF_SIZE];
  kc_warmup *w = NULL;
  assert_int_equal(kc_testsrv_start(&f->srv, NULL), 0);
  f->have_srv = 1;
  mat_warmup(f, &w);
  snprintf(cache, sizeof cache, "%s/cache", f->dir);
  kc_client *c = client_tok(cache, f->srv.url, NULL);
  kc_warm_opts o = {.no_compat = 1};
  kc_warm_report r;
  if (kc_warm(c, w, &o, &r, err) != KC_OK)
    fail_msg("warm: %s", err);
  assert_true(r.items[0].uploaded);
  kc_manifest *m = NULL;
  assert_int_equal(kc_cache_bundle_get(c, r.items[0].key, &m, err), KC_OK);
  kc_warm_report_free(&r);
  uint64_t len = 7;
  err[0] = '\0';
  assert_int_equal(
      kc_client_blob_get_fd(c, m->files[0].sha256, -1, 0, &len, err),
      KC_EINVAL);
  assert_int_equal(len, 0);
  assert_non_null(strstr(err, "descriptor"));
  kc_manifest_free(m);
  kc_client_free(c);
  kc_warmup_free(w);
}

/* ---- the directory a materialize made ---- */

/* client/client_internal.h's (not an installed header) */
kc_err kcc_materialize(kc_client *c, const kc_manifest *m, const char *dir,
                       int verified, int *made, char *err);

/* A directory whose parents were missing is made with them, and *made
 * says so: a warm whose bundle then fails removes what it made. The
 * bundle fails here for its blob missing from the client's cache. */
static void test_made_with_parents(void **state) {
  fx *f = *state;
  char seed[400], cache[400], dir[400], err[KC_ERRBUF_SIZE];
  snprintf(seed, sizeof seed, "%s/seed", f->dir);
  snprintf(cache, sizeof cache, "%s/cache", f->dir);
  snprintf(dir, sizeof dir, "%s/out/sm_80/batch=1", f->dir);
  kc_client *c = client_for(seed, NULL);
  const char *paths[] = {"k.cubin"}, *texts[] = {"only in seed"};
  kc_manifest *m = manifest_of(c, paths, texts, 1);
  kc_client_free(c);
  c = client_for(cache, NULL);
  int made = 0;
  assert_int_not_equal(kcc_materialize(c, m, dir, 1, &made, err), KC_OK);
  struct stat st;
  assert_int_equal(stat(dir, &st), 0);
  assert_int_equal(made, 1);
  kc_manifest_free(m);
  kc_client_free(c);
}

/* A 401 (a token the server does not know yet: a token file being
 * reloaded) stops writes for that warm only: after the reload the same
 * client's next warm, all hit-local, offers its bundles back (one GET
 * /v1/models/{model}). A 403 is remembered (test_read_token_no_offer). */
static void test_unauthorized_not_remembered(void **state) {
  fx *f = *state;
  char tokens[400], later[400], rtok[256] = "", wtok[256] = "", cache[400];
  char err[KC_ERRBUF_SIZE];
  kc_warmup *w = NULL;
  snprintf(tokens, sizeof tokens, "%s/tokens", f->dir);
  snprintf(later, sizeof later, "%s/tokens.later", f->dir);
  make_token("read", "svc", tokens, rtok, sizeof rtok);
  make_token("write", "ci", later, wtok, sizeof wtok);
  assert_int_equal(kc_testsrv_init(&f->srv), 0);
  const char *args[] = {"--tokens", tokens, NULL};
  assert_int_equal(kc_testsrv_start(&f->srv, args), 0);
  f->have_srv = 1;
  mat_warmup(f, &w);
  snprintf(cache, sizeof cache, "%s/cache", f->dir);
  kc_client *c = client_tok(cache, f->srv.url, wtok);
  kc_warm_opts o = {.no_compat = 1};
  kc_warm_report r;
  kc_err e = kc_warm(c, w, &o, &r, err); /* wtok unknown: 401s */
  print_message("warm with an unknown token: %s, %zu built\n", kc_err_name(e),
                r.counts[KC_WARM_BUILT]);
  assert_int_equal(r.counts[KC_WARM_BUILT], 2);
  kc_warm_report_free(&r);
  /* the token file gets the write token; SIGHUP reloads it */
  char *add = read_all(later, NULL);
  assert_non_null(add);
  FILE *fp = fopen(tokens, "a");
  assert_non_null(fp);
  fputs(add, fp);
  fclose(fp);
  free(add);
  assert_int_equal(kill(f->srv.pid, SIGHUP), 0);
  kc_client *probe = client_tok(NULL, f->srv.url, wtok);
  kc_lease_state st;
  char lt[KC_LEASE_TOKEN_MAX];
  const char *k =
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
  double t0 = now_s();
  while ((e = kc_client_lease_take(probe, k, 30, &st, lt, NULL, err)) ==
             KC_UNAUTHORIZED &&
         now_s() - t0 < 10)
    usleep(20000);
  assert_int_equal(e, KC_OK);
  if (st == KC_LEASE_GRANTED)
    kc_client_lease_release(probe, k, lt, err);
  kc_client_free(probe);
  double g0 = models_gets(f);
  e = kc_warm(c, w, &o, &r, err);
  if (e)
    fail_msg("warm after the reload: %s", err);
  assert_int_equal(r.counts[KC_WARM_HIT_LOCAL], 2);
  kc_warm_report_free(&r);
  double g1 = kc_testsrv_metric_settle(&f->srv, MODELS_GETS, g0 + 1, 2000);
  print_message("GET /v1/models/{m} after the reload: %.0f\n",
                (g1 < 0 ? 0 : g1) - g0);
  assert_true(g1 == g0 + 1);
  kc_client_free(c);
  kc_warmup_free(w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      CT(test_umask_read_not_set),          CT(test_out_keeps_foreign_dirs),
      CT(test_out_dir_of_failed_removed),   CT(test_read_token_no_offer),
      CT(test_blob_get_fd_negative),        CT(test_made_with_parents),
      CT(test_unauthorized_not_remembered),
  };
  return clienttest_run("client_materialize", tests,
                        sizeof tests / sizeof tests[0]);
}
