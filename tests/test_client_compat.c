/* test_client_compat.c: the compatible-arch fallback (hit-compat): an
 * exact bundle always wins, PTX, flags, many buckets; never a wrong
 * arch. Fixture and the CLI runner: clienttest.h. */
#include "clienttest.h"

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
  assert_non_null(strstr(out, "hit-compat sm_89")); /* the human line */
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
                               "KCACHE_DEVICE_ARCH=sm_8", "", out, sizeof out),
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

int main(void) {
  const struct CMUnitTest tests[] = {
      CT(test_compat_hit),   CT(test_compat_never_wrong), CT(test_compat_ptx),
      CT(test_compat_flags), CT(test_compat_many),
  };
  return clienttest_run("client_compat", tests, sizeof tests / sizeof tests[0]);
}
