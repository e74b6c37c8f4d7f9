/* test_client_models.c: demand feedback (kc_demand_note against a real
 * kcached, and a server that is down), `kcache suggest`, and models by
 * name: purge and refill, the coverage matrix's archs, a purge by a forged
 * name, the warmup manifest's roles. Fixture and helpers: clienttest.h. */
#include "clienttest.h"

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
  static const struct {
    uint64_t batch, seq;
    int n;
  } seen[] = {{1, 100, 50}, {2, 120, 30}, {3, 900, 20}, {8, 1000, 5}};
  for (size_t i = 0; i < 4; i++) {
    kc_bucket b = {.n = 2,
                   .dims = {{"batch", seen[i].batch}, {"seq", seen[i].seq}}};
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
                           f->srv.url, w2, MODEL),
                   2);
  assert_int_equal(run_cli(out, sizeof out, "suggest --url %s abc", f->srv.url),
                   1);
  assert_non_null(strstr(out, "no model named 'abc'"));
  assert_int_equal(run_cli(out, sizeof out, "suggest --url %s --buckets 0 %s",
                           f->srv.url, MODEL),
                   2);
  assert_int_equal(run_cli(out, sizeof out,
                           "suggest --url %s --manifest %s "
                           "11111111111111111111111111111111"
                           "11111111111111111111111111111111",
                           f->srv.url, w),
                   2);
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
  assert_int_equal(run_cli(out, sizeof out,
                           "warm %s --url %s --cache-dir "
                           "%s/c1",
                           w, f->srv.url, f->dir),
                   0);
  assert_non_null(strstr(out, "4 built"));
  assert_null(strstr(out, "warmup manifest was not stored"));
  assert_int_equal(run_cli(out, sizeof out, "ls --url %s", f->srv.url), 0);
  assert_non_null(strstr(out, "refill-model"));
  assert_non_null(strstr(out, "4/4"));
  assert_int_equal(run_cli(out, sizeof out,
                           "ls refill-model --matrix --url "
                           "%s",
                           f->srv.url),
                   0);
  assert_non_null(strstr(out, "4/4 present"));
  assert_non_null(strstr(out, "batch=2"));
  assert_int_equal(
      run_cli(out, sizeof out, "ls refill-model --url %s", f->srv.url), 0);
  assert_int_equal(occurrences(out, " hits"), 4);
  /* a name is confirmed with its hash: without --confirm, nothing goes */
  assert_int_equal(
      run_cli(out, sizeof out, "purge refill-model --url %s", f->srv.url), 1);
  assert_non_null(strstr(out, MODEL));
  assert_non_null(strstr(out, "nothing deleted"));
  assert_int_equal(run_cli(out, sizeof out,
                           "purge refill-model --url %s "
                           "--confirm %.12s",
                           f->srv.url, MODEL),
                   0);
  assert_non_null(strstr(out, "purged 4 bundles"));
  /* the name went with the manifest; the hash still answers, empty */
  assert_int_equal(
      run_cli(out, sizeof out, "ls refill-model --url %s", f->srv.url), 1);
  assert_non_null(strstr(out, "no model named 'refill-model'"));
  assert_int_equal(
      run_cli(out, sizeof out, "ls %s --url %s", MODEL, f->srv.url), 0);
  assert_int_equal(occurrences(out, " hits"), 0);
  /* another replica's empty cache: nothing on the server, so it builds
   * and uploads, and the model is whole again */
  assert_int_equal(run_cli(out, sizeof out,
                           "warm %s --url %s --cache-dir "
                           "%s/c2",
                           w, f->srv.url, f->dir),
                   0);
  assert_non_null(strstr(out, "4 built"));
  assert_int_equal(run_cli(out, sizeof out,
                           "ls refill-model --matrix --url "
                           "%s",
                           f->srv.url),
                   0);
  assert_non_null(strstr(out, "4/4 present"));
  assert_int_equal(
      run_cli(out, sizeof out, "purge nobody --url %s", f->srv.url), 1);
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
  assert_int_equal(run_cli(out, sizeof out,
                           "warm %s --arch sm_86 --url %s "
                           "--cache-dir %s/c1",
                           w, f->srv.url, f->dir),
                   0);
  assert_non_null(strstr(out, "2 built"));
  assert_int_equal(run_cli(out, sizeof out,
                           "ls refill-model --matrix --url "
                           "%s",
                           f->srv.url),
                   0);
  print_message("%s", out);
  assert_non_null(strstr(out, "2/2 present"));
  assert_non_null(strstr(out, "archs: those its warms ran for (the manifest "
                              "lists sm_80 sm_90a)"));
  assert_non_null(strstr(out, " sm_86"));
  assert_null(strstr(out, "no longer expected"));
  assert_int_equal(run_cli(out, sizeof out,
                           "warm %s --arch sm_80,sm_90a,"
                           "sm_100f --url %s --cache-dir %s/c1",
                           w, f->srv.url, f->dir),
                   0);
  assert_int_equal(run_cli(out, sizeof out,
                           "ls refill-model --matrix --url "
                           "%s",
                           f->srv.url),
                   0);
  print_message("%s", out);
  assert_non_null(strstr(out, "8/8 present"));
  assert_non_null(strstr(out, " sm_100f"));
}

#define VICTIM                                                                 \
  "9f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"

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
  const char *const args[] = {"--tokens", tokens, NULL};
  start_server_with(f, args);
  named_warmup(f, "demo.json", "demo-mlp", MODEL, w, sizeof w);
  assert_int_equal(run_cli(out, sizeof out,
                           "warm %s --url %s --token %s "
                           "--cache-dir %s/c1",
                           w, f->srv.url, wtok, f->dir),
                   0);
  named_warmup(f, "llm.json", "big-llm", VICTIM, w, sizeof w);
  assert_int_equal(run_cli(out, sizeof out,
                           "warm %s --url %s --token %s "
                           "--cache-dir %s/c1",
                           w, f->srv.url, wtok, f->dir),
                   0);
  /* the attack: the victim named demo-mlp, demo-mlp renamed away */
  named_warmup(f, "forged.json", "demo-mlp", VICTIM, w, sizeof w);
  assert_int_equal(run_cli(out, sizeof out,
                           "warm %s --url %s --token %s "
                           "--cache-dir %s/c1",
                           w, f->srv.url, wtok, f->dir),
                   0);
  assert_non_null(strstr(out, "warmup manifest was not stored"));
  assert_non_null(strstr(out, "belongs to model " MODEL));
  named_warmup(f, "away.json", "renamed", MODEL, w, sizeof w);
  assert_int_equal(run_cli(out, sizeof out,
                           "warm %s --url %s --token %s "
                           "--cache-dir %s/c1",
                           w, f->srv.url, wtok, f->dir),
                   0);
  assert_non_null(strstr(out, "renaming it needs an admin token"));
  /* the admin's purge by name: the hash is shown, nothing deleted */
  assert_int_equal(run_cli(out, sizeof out,
                           "purge demo-mlp --url %s "
                           "--token %s",
                           f->srv.url, atok),
                   1);
  assert_non_null(strstr(out, "is model " MODEL " (2 bundles)"));
  assert_int_equal(run_cli(out, sizeof out,
                           "purge demo-mlp --url %s "
                           "--token %s --confirm %.12s",
                           f->srv.url, atok, VICTIM),
                   1);
  assert_non_null(strstr(out, "is not its hash"));
  assert_int_equal(run_cli(out, sizeof out,
                           "purge demo-mlp --url %s "
                           "--token %s --confirm %.11s",
                           f->srv.url, atok, MODEL),
                   1); /* too short to confirm */
  assert_int_equal(run_cli(out, sizeof out, "ls big-llm --url %s --token %s",
                           f->srv.url, atok),
                   0);
  assert_int_equal(occurrences(out, " hits"), 2);
  assert_int_equal(run_cli(out, sizeof out,
                           "purge demo-mlp --url %s "
                           "--token %s --confirm %.12s",
                           f->srv.url, atok, MODEL),
                   0);
  assert_non_null(strstr(out, "purged 2 bundles of " MODEL));
  assert_int_equal(run_cli(out, sizeof out, "ls big-llm --url %s --token %s",
                           f->srv.url, atok),
                   0);
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
  const char *const args[] = {"--tokens", tokens, NULL};
  start_server_with(f, args);
  refill_warmup(f, w, sizeof w);
  assert_int_equal(run_cli(out, sizeof out,
                           "warm %s --url %s --token %s "
                           "--cache-dir %s/r",
                           w, f->srv.url, rtok, f->dir),
                   0);
  assert_null(strstr(out, "warmup manifest"));
  assert_int_equal(
      run_cli(out, sizeof out, "ls --url %s --token %s", f->srv.url, rtok), 0);
  assert_null(strstr(out, "refill-model"));
  assert_int_equal(run_cli(out, sizeof out,
                           "warm %s --url %s --token %s "
                           "--cache-dir %s/w",
                           w, f->srv.url, wtok, f->dir),
                   0);
  assert_int_equal(
      run_cli(out, sizeof out, "ls --url %s --token %s", f->srv.url, rtok), 0);
  assert_non_null(strstr(out, "refill-model"));
  assert_int_equal(run_cli(out, sizeof out,
                           "purge refill-model --url %s "
                           "--token %s --confirm %.12s",
                           f->srv.url, wtok, MODEL),
                   1);
  assert_non_null(strstr(out, "403"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      CT(test_demand_note),          CT(test_demand_server_down),
      CT(test_suggest_cli),          CT(test_warm_purge_refill),
      CT(test_purge_by_forged_name), CT(test_matrix_warm_archs),
      CT(test_warm_manifest_roles),
  };
  return clienttest_run("client_models", tests, sizeof tests / sizeof tests[0]);
}
