/* test_client_hostile.c: an adversarial pass over the client: a cached
 * blob that is not a blob, the deadline and materialize, a flood and a
 * drip-fed answer from a fake server, the cache directory's modes, a
 * swapped cached manifest, a lease squatter, symlinks pushed and built.
 * Fixture, the fake server and helpers: clienttest.h. */
#include "clienttest.h"

/* ---- an adversarial pass over the client ---- */

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
  assert_int_equal(run_cli(out, sizeof out,
                           "warm %s --url %s --cache-dir %s"
                           " --quiet --strict",
                           w, f->srv.url, f->cache),
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
                         "--json --quiet",
                         w, f->srv.url, f->cache);
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
    fake s = {
        .bundle_body = man, .blob_flood = (size_t)1 << 30, .flood_length = t};
    fake_start(&s);
    double t0 = now_s();
    int rc = run_cli_env(out, sizeof out, "timeout 60",
                         "pull %s %s/pulled%d --url %s --cache-dir %s/c%d", key,
                         f->dir, t, s.url, f->dir, t);
    double secs = now_s() - t0;
    fake_stop(&s);
    size_t sent = __atomic_load_n(&s.sent, __ATOMIC_SEQ_CST);
    print_message("1 GiB for a 14-byte blob (%s): %.2f s, %zu bytes "
                  "taken: %s",
                  t ? "Content-Length" : "no length", secs, sent, out);
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
  print_message("1 GiB for a manifest: %.2f s, %zu bytes taken: %s", secs, sent,
                out);
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
                   "pull %s %s/p --url %s --cache-dir %s", MODEL, f->dir, s.url,
                   f->cache);
  secs = now_s() - t0;
  print_message("drip, pull KCACHE_TIMEOUT=2: %.2f s: %s", secs, out);
  assert_int_equal(rc, 1);
  assert_true(secs < 4.5);
  /* 1 s under 1 KiB/s (the default is 30 s) ends it; the 20 s limit not */
  kc_client *c = NULL;
  kc_client_opts o = {.url = s.url,
                      .cache_dir = f->cache,
                      .timeout_ms = 20000,
                      .low_speed_s = 1};
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
  assert_int_equal(run_cli(out, sizeof out,
                           "stat --url http://127.0.0.1:1 "
                           "--cache-dir %s",
                           d),
                   1);
  print_message("%s", out);
  assert_non_null(strstr(out, "writable by others (mode 777)"));
  assert_non_null(strstr(out, "--trust-cache-dir"));
  kc_client *c = NULL;
  kc_client_opts o = {.cache_dir = d};
  assert_int_equal(kc_client_new(&o, &c, err), KC_FORBIDDEN);
  assert_null(c);
  assert_int_equal(chmod(d, 0770), 0);
  assert_int_equal(run_cli(out, sizeof out,
                           "stat --url http://127.0.0.1:1 "
                           "--cache-dir %s",
                           d),
                   1);
  assert_non_null(strstr(out, "writable by its group"));
  /* trusted on purpose: no refusal (stat then fails to connect) */
  assert_int_equal(run_cli(out, sizeof out,
                           "stat --url http://127.0.0.1:1 "
                           "--cache-dir %s --trust-cache-dir",
                           d),
                   1);
  assert_null(strstr(out, "writable"));
  assert_int_equal(run_cli_env(out, sizeof out, "KCACHE_TRUST_DIR=1",
                               "stat --url http://127.0.0.1:1 --cache-dir %s",
                               d),
                   1);
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
  assert_int_equal(run_cli(out, sizeof out,
                           "warm %s --url %s --cache-dir %s"
                           " --quiet --strict",
                           w, f->srv.url, f->cache),
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
  assert_int_equal(run_cli(out, sizeof out,
                           "pull %s %s/pulled --url %s "
                           "--cache-dir %s",
                           key, f->dir, f->srv.url, f->cache),
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
  kc_client_opts so = {
      .url = f->srv.url, .cache_dir = sq, .holder = "squatter-7"};
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
  assert_int_equal(run_cli(out, sizeof out,
                           "warm %s --url %s --cache-dir "
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
  int rc = run_cli(out, sizeof out,
                   "warm %s --url %s --cache-dir %s/c2 "
                   "--deadline 3 --json",
                   w, f->srv.url, f->dir);
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
  assert_int_equal(run_cli(out, sizeof out,
                           "push %s --fields %s --url %s "
                           "--cache-dir %s",
                           d, fields, f->srv.url, f->cache),
                   0);
  memcpy(key, out, 64);
  key[64] = '\0';
  assert_true(kc_is_hex64(key));
  assert_int_equal(run_cli(out, sizeof out,
                           "pull %s %s/pulled --url %s "
                           "--cache-dir %s/c2",
                           key, f->dir, f->srv.url, f->dir),
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
  assert_int_equal(run_cli(out, sizeof out,
                           "push %s --fields %s --url %s "
                           "--cache-dir %s",
                           d, fields, f->srv.url, f->cache),
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
  cmd_warmup(f, "w13",
             "printf hi > {out}/real.txt && ln -s real.txt "
             "{out}/alias.txt && mkdir {out}/d && ln -s ../real.txt "
             "{out}/d/up.txt",
             w, sizeof w);
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

int main(void) {
  const struct CMUnitTest tests[] = {
      CT(test_local_blob_not_a_blob),
      CT(test_deadline_still_materializes),
      CT(test_blob_flood),
      CT(test_drip_feed),
      CT(test_cache_dir_private),
      CT(test_cache_manifest_swapped),
      CT(test_lease_squatter),
      CT(test_push_symlinks),
      CT(test_command_builder_symlinks),
  };
  return clienttest_run("client_hostile", tests,
                        sizeof tests / sizeof tests[0]);
}
