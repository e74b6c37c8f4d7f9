/* test_gpu.c: the gpu module: arch compatibility rules, real NVRTC builds of
 * tests/kernels/ (cubin and PTX, bucket defines, compile errors, a build that
 * times out, a crashing NVRTC), the NVRTC search, device detection and the
 * load check. Without NVRTC the NVRTC tests skip, unless CI=true; without a
 * driver the device tests check the "no driver" answers and skip the rest.
 * `test_gpu --stub-driver` (run with the toolkit's stub libcuda first on the
 * loader path) checks the driver binding against a real libcuda;
 * `test_gpu --fake-driver` (KCACHE_LIBCUDA naming tests/gpu_fake_cuda.c's
 * library) runs detection and the load check past cuInit. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpu_internal.h"

#define assert_contains(hay, needle)                                           \
  do {                                                                         \
    const char *h_ = (hay), *n_ = (needle);                                    \
    if (!h_ || !strstr(h_, n_))                                                \
      fail_msg("expected \"%s\" in \"%s\"", n_, h_ ? h_ : "(null)");           \
  } while (0)

/* ---- Helpers ---- */

/* The build-tree paths compiled in, or the environment's: a test binary
 * carried to another machine (scripts/gpu-check.sh) sets KC_TEST_<NAME>. */
static const char *test_path(const char *env, const char *built) {
  const char *v = getenv(env);
  return v && *v ? v : built;
}
#define KERNELS_DIR test_path("KC_TEST_GPU_KERNELS", KC_GPU_KERNELS)
#define FAKE_NVRTC test_path("KC_TEST_FAKE_NVRTC", KC_FAKE_NVRTC)
#define OLD_NVRTC test_path("KC_TEST_OLD_NVRTC", KC_OLD_NVRTC)
#define FAKE_CUDA_HOME test_path("KC_TEST_FAKE_CUDA_HOME", KC_FAKE_CUDA_HOME)
#define WHEEL_NVRTC test_path("KC_TEST_WHEEL_NVRTC", KC_WHEEL_NVRTC)

static char *kernel_source(const char *file) {
  char path[512], err[KC_ERRBUF_SIZE] = "", *src = NULL;
  size_t len = 0;
  snprintf(path, sizeof path, "%s/%s", KERNELS_DIR, file);
  if (kc_read_file(path, &src, &len, err) != KC_OK)
    fail_msg("%s", err);
  return src;
}

static kc_bucket bucket1(const char *name, uint64_t value) {
  kc_bucket b = {.n = 1};
  snprintf(b.dims[0].name, sizeof b.dims[0].name, "%s", name);
  b.dims[0].value = value;
  return b;
}

/* NVRTC tests need the toolkit: skip without it, except in CI, where a
 * missing NVRTC means the runner lost its toolkit and must not pass. */
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

/* Environment changes that the next test must not inherit. */
typedef struct env_save {
  char *nvrtc, *cuda_home, *venv, *conda;
} env_save;

static char *dup_env(const char *name) {
  const char *v = getenv(name);
  return v ? strdup(v) : NULL;
}

static void put_env(const char *name, const char *value) {
  if (value)
    setenv(name, value, 1);
  else
    unsetenv(name);
}

static int env_setup(void **state) {
  env_save *s = calloc(1, sizeof *s);
  s->nvrtc = dup_env("KCACHE_NVRTC");
  s->cuda_home = dup_env("CUDA_HOME");
  s->venv = dup_env("VIRTUAL_ENV");
  s->conda = dup_env("CONDA_PREFIX");
  *state = s;
  return 0;
}

static int env_teardown(void **state) {
  env_save *s = *state;
  put_env("KCACHE_NVRTC", s->nvrtc);
  put_env("CUDA_HOME", s->cuda_home);
  put_env("VIRTUAL_ENV", s->venv);
  put_env("CONDA_PREFIX", s->conda);
  free(s->nvrtc);
  free(s->cuda_home);
  free(s->venv);
  free(s->conda);
  free(s);
  return 0;
}

/* Builds tests/kernels/<file>; the caller frees out. */
static kc_err build(const char *file, const char *arch, const kc_bucket *b,
                    const char *const *entries, size_t n_entries,
                    kc_gpu_build_out *out, char *err) {
  char *src = kernel_source(file);
  kc_gpu_build_req req = {.name = file,
                          .source = src,
                          .arch = arch,
                          .bucket = b,
                          .entries = entries,
                          .n_entries = n_entries};
  err[0] = '\0';
  kc_err rc = kc_gpu_build(&req, out, err);
  free(src);
  print_message("  %s for %s: %s in %.3f s (%zu bytes)\n", file, arch,
                kc_err_name(rc), out->seconds, out->code_len);
  return rc;
}

static void assert_cubin(const kc_gpu_build_out *out) {
  const unsigned char *c = out->code;
  assert_int_equal(out->kind, KC_KIND_CUBIN);
  assert_true(out->code_len > 64);
  assert_memory_equal(c,
                      "\x7f"
                      "ELF",
                      4);
  assert_int_equal(c[4], 2);                 /* ELFCLASS64 */
  assert_int_equal(c[18] | c[19] << 8, 190); /* e_machine: EM_CUDA */
}

/* ---- Arch rules ---- */

typedef struct runs_case {
  const char *arch;
  int major, minor, runs;
} runs_case;

static const runs_case runs_cases[] = {
    {"sm_86", 8, 6, 1},         {"sm_86", 8, 9, 1},
    {"sm_86", 8, 0, 0},         {"sm_86", 9, 0, 0},
    {"sm_80", 8, 0, 1},         {"sm_80", 8, 6, 1},
    {"sm_80", 8, 9, 1},         {"sm_80", 9, 0, 0},
    {"sm_80", 7, 5, 0},         {"sm_90a", 9, 0, 1},
    {"sm_90a", 10, 0, 0},       {"sm_90a", 8, 9, 0},
    {"sm_90", 9, 0, 1},         {"sm_90", 10, 0, 0},
    {"sm_90", 8, 9, 0},         {"sm_100f", 10, 0, 1},
    {"sm_100f", 10, 3, 1},      {"sm_100f", 12, 0, 0},
    {"sm_100f", 9, 0, 0},       {"sm_103f", 10, 0, 0},
    {"sm_100a", 10, 0, 1},      {"sm_100a", 10, 3, 0},
    {"sm_120", 12, 1, 1},       {"sm_120a", 12, 1, 0},
    {"compute_80", 8, 0, 1},    {"compute_80", 8, 6, 1},
    {"compute_80", 9, 0, 1},    {"compute_80", 10, 0, 1},
    {"compute_80", 12, 0, 1},   {"compute_80", 7, 5, 0},
    {"compute_90a", 9, 0, 1},   {"compute_90a", 10, 0, 0},
    {"compute_90a", 12, 0, 0},  {"compute_100f", 10, 3, 1},
    {"compute_100f", 12, 0, 0}, {"compute_75", 7, 5, 1},
};

static void test_arch_runs_on(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof runs_cases / sizeof *runs_cases; i++) {
    const runs_case *c = &runs_cases[i];
    int got = kc_gpu_arch_runs_on(c->arch, c->major, c->minor);
    if (got != c->runs)
      fail_msg("%s on %d.%d: got %d, want %d", c->arch, c->major, c->minor, got,
               c->runs);
  }
}

static void test_arch_invalid(void **state) {
  (void)state;
  static const char *const bad[] = {
      NULL,      "",       "sm_8",   "sm_1000",    "sm_80x",
      "sm_80af", "SM_80",  "sm80",   "compute_",   "sm_05",
      "sm_-80",  "sm_80 ", " sm_80", "compute_8a", "gfx90a"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    for (int major = 7; major <= 12; major++)
      if (kc_gpu_arch_runs_on(bad[i], major, 0))
        fail_msg("'%s' runs on %d.0", bad[i] ? bad[i] : "(null)", major);
  assert_int_equal(kc_gpu_arch_runs_on("sm_80", 8, -1), 0);
  assert_int_equal(kc_gpu_arch_runs_on("sm_80", 8, 10), 0);
  assert_int_equal(kc_gpu_arch_runs_on("compute_80", 0, 0), 0);
}

static void test_native_arch(void **state) {
  (void)state;
  static const struct {
    int major, minor;
    const char *arch;
  } cases[] = {{7, 5, "sm_75"},    {8, 0, "sm_80"},    {8, 6, "sm_86"},
               {8, 9, "sm_89"},    {9, 0, "sm_90a"},   {10, 0, "sm_100a"},
               {10, 3, "sm_103a"}, {12, 0, "sm_120a"}, {12, 1, "sm_121a"}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char arch[KC_ARCH_MAX + 1];
    assert_int_equal(kcg_native_arch(cases[i].major, cases[i].minor, arch), 0);
    assert_string_equal(arch, cases[i].arch);
    assert_true(kc_arch_valid(arch));
    assert_true(kc_gpu_arch_runs_on(arch, cases[i].major, cases[i].minor));
  }
  char arch[KC_ARCH_MAX + 1];
  assert_int_equal(kcg_native_arch(0, 0, arch), -1);
  assert_int_equal(kcg_native_arch(8, 10, arch), -1);
  assert_int_equal(kcg_native_arch(100, 0, arch), -1);
}

/* ---- Entry lookup in code ---- */

static void test_ptx_entries(void **state) {
  (void)state;
  const char ptx[] = ".version 9.0\n.target sm_80\n"
                     ".visible .entry saxpy(\n.param .f32 a)\n{ ret; }\n"
                     ".visible .entry  scale2 (\n)\n{ ret; }\n"
                     ".func helper()\n{ ret; }\n";
  size_t n = sizeof ptx - 1;
  assert_true(kcg_code_has_entry(KC_KIND_PTX, ptx, n, "saxpy"));
  assert_true(kcg_code_has_entry(KC_KIND_PTX, ptx, n, "scale2"));
  assert_false(kcg_code_has_entry(KC_KIND_PTX, ptx, n, "sax"));
  assert_false(kcg_code_has_entry(KC_KIND_PTX, ptx, n, "scale"));
  assert_false(kcg_code_has_entry(KC_KIND_PTX, ptx, n, "helper"));
  assert_false(kcg_code_has_entry(KC_KIND_PTX, ptx, n, ""));
  assert_false(kcg_code_has_entry(KC_KIND_PTX, ".entry", 6, "saxpy"));
  assert_false(kcg_code_has_entry(KC_KIND_CUBIN, ptx, n, "saxpy"));
  assert_false(kcg_code_has_entry(KC_KIND_CUBIN,
                                  "\x7f"
                                  "ELF",
                                  4, "saxpy"));
}

/* Every truncation and a corrupted byte at every offset of a real cubin:
 * no read out of bounds (ASan watches), and the intact one has its entries. */
static void test_cubin_entries_robust(void **state) {
  (void)state;
  need_nvrtc();
  kc_bucket b = bucket1("batch", 4);
  kc_gpu_build_out out;
  char err[KC_ERRBUF_SIZE];
  assert_int_equal(build("saxpy.cu", "sm_80", &b, NULL, 0, &out, err), KC_OK);
  const size_t len = out.code_len;
  assert_true(kcg_code_has_entry(KC_KIND_CUBIN, out.code, len, "saxpy"));
  assert_true(kcg_code_has_entry(KC_KIND_CUBIN, out.code, len, "scale"));
  assert_false(kcg_code_has_entry(KC_KIND_CUBIN, out.code, len, "scal"));
  unsigned char *copy = malloc(len);
  for (size_t cut = 0; cut < len; cut++) { /* exact-size heap copies */
    unsigned char *p = malloc(cut ? cut : 1);
    memcpy(p, out.code, cut);
    (void)kcg_code_has_entry(KC_KIND_CUBIN, p, cut, "saxpy");
    free(p);
  }
  for (size_t i = 0; i < len; i++) {
    memcpy(copy, out.code, len);
    copy[i] ^= 0xff;
    (void)kcg_code_has_entry(KC_KIND_CUBIN, copy, len, "saxpy");
  }
  free(copy);
  kc_gpu_build_out_free(&out);
}

/* ---- NVRTC builds ---- */

static void test_nvrtc_version(void **state) {
  (void)state;
  need_nvrtc();
  char v[16], err[KC_ERRBUF_SIZE] = "";
  int major = 0, minor = 0, end = 0;
  assert_int_equal(kc_gpu_nvrtc_version(v, err), KC_OK);
  assert_int_equal(sscanf(v, "%d.%d%n", &major, &minor, &end), 2);
  assert_int_equal(v[end], '\0');
  assert_true(major >= 11);
  print_message("  NVRTC %s\n", v);
}

static void test_build_cubin_sm80(void **state) {
  (void)state;
  need_nvrtc();
  kc_bucket b = bucket1("batch", 4);
  const char *const entries[] = {"saxpy", "scale"};
  kc_gpu_build_out out;
  char err[KC_ERRBUF_SIZE];
  assert_int_equal(build("saxpy.cu", "sm_80", &b, entries, 2, &out, err),
                   KC_OK);
  assert_cubin(&out);
  assert_non_null(out.log);
  assert_true(out.seconds > 0);
  kc_gpu_build_out_free(&out);
  assert_null(out.code);
  kc_gpu_build_out_free(&out); /* twice, and NULL: nothing happens */
  kc_gpu_build_out_free(NULL);
}

static void test_build_cubin_sm90a(void **state) {
  (void)state;
  need_nvrtc();
  kc_bucket b = bucket1("batch", 4);
  const char *const entries[] = {"saxpy"};
  kc_gpu_build_out a, c;
  char err[KC_ERRBUF_SIZE];
  assert_int_equal(build("saxpy.cu", "sm_90a", &b, entries, 1, &a, err), KC_OK);
  assert_cubin(&a);
  assert_int_equal(build("saxpy.cu", "sm_80", &b, entries, 1, &c, err), KC_OK);
  assert_false(a.code_len == c.code_len &&
               memcmp(a.code, c.code, a.code_len) == 0);
  kc_gpu_build_out_free(&a);
  kc_gpu_build_out_free(&c);
}

static void test_build_ptx(void **state) {
  (void)state;
  need_nvrtc();
  kc_bucket b = bucket1("batch", 2);
  const char *const entries[] = {"saxpy", "scale"};
  kc_gpu_build_out out;
  char err[KC_ERRBUF_SIZE];
  assert_int_equal(build("saxpy.cu", "compute_80", &b, entries, 2, &out, err),
                   KC_OK);
  assert_int_equal(out.kind, KC_KIND_PTX);
  const char *ptx = out.code;
  assert_int_equal(ptx[out.code_len], '\0'); /* NUL kept, not counted */
  assert_int_equal(strlen(ptx), out.code_len);
  assert_contains(ptx, ".entry saxpy");
  assert_contains(ptx, ".entry scale");
  assert_contains(ptx, ".target sm_80");
  kc_gpu_build_out_free(&out);
  assert_int_equal(build("saxpy.cu", "compute_90a", &b, entries, 1, &out, err),
                   KC_OK);
  assert_contains(out.code, ".target sm_90a");
  kc_gpu_build_out_free(&out);
}

/* batch8.cu has `#if BATCH != 8 #error`: it builds only with the define. */
static void test_bucket_define(void **state) {
  (void)state;
  need_nvrtc();
  kc_bucket eight = bucket1("batch", 8), four = bucket1("batch", 4);
  const char *const entries[] = {"fill8"};
  kc_gpu_build_out out;
  char err[KC_ERRBUF_SIZE];
  assert_int_equal(build("batch8.cu", "sm_80", &eight, entries, 1, &out, err),
                   KC_OK);
  kc_gpu_build_out_free(&out);
  assert_int_equal(build("batch8.cu", "sm_80", &four, entries, 1, &out, err),
                   KC_BUILD_FAILED);
  assert_contains(out.log, "BATCH must be 8");
  assert_contains(err, "BATCH must be 8");
  assert_null(out.code);
  kc_gpu_build_out_free(&out);
  assert_int_equal(build("saxpy.cu", "sm_80", NULL, NULL, 0, &out, err),
                   KC_BUILD_FAILED); /* no bucket: saxpy.cu #errors */
  assert_contains(out.log, "BATCH is not defined");
  kc_gpu_build_out_free(&out);
}

static void test_multi_dim_bucket(void **state) {
  (void)state;
  need_nvrtc();
  const char *src = "#if BATCH != 2 || SEQ_LEN != 1024 || HEADS != 0\n"
                    "#error \"defines wrong\"\n#endif\n"
                    "extern \"C\" __global__ void k(float *y) { y[0] = 1; }\n";
  kc_bucket b = {.n = 3};
  snprintf(b.dims[0].name, sizeof b.dims[0].name, "batch");
  b.dims[0].value = 2;
  snprintf(b.dims[1].name, sizeof b.dims[1].name, "seq_len");
  b.dims[1].value = 1024;
  snprintf(b.dims[2].name, sizeof b.dims[2].name, "heads");
  b.dims[2].value = 0;
  const char *const entries[] = {"k"};
  kc_gpu_build_req req = {.name = "multi.cu",
                          .source = src,
                          .arch = "sm_80",
                          .bucket = &b,
                          .entries = entries,
                          .n_entries = 1};
  kc_gpu_build_out out;
  char err[KC_ERRBUF_SIZE] = "";
  kc_err rc = kc_gpu_build(&req, &out, err);
  if (rc != KC_OK)
    fail_msg("%s: %s", kc_err_name(rc), err);
  kc_gpu_build_out_free(&out);
}

static void test_compile_error(void **state) {
  (void)state;
  need_nvrtc();
  kc_gpu_build_out out;
  char err[KC_ERRBUF_SIZE];
  assert_int_equal(build("broken.cu", "sm_80", NULL, NULL, 0, &out, err),
                   KC_BUILD_FAILED);
  assert_contains(out.log, "undeclared_thing");
  assert_contains(out.log, "error");
  assert_contains(err, "broken.cu(4): error");
  assert_contains(err, "undeclared_thing");
  assert_null(strchr(err, '\n')); /* one line */
  assert_null(out.code);
  assert_int_equal(out.code_len, 0);
  kc_gpu_build_out_free(&out);
}

static void test_missing_entry(void **state) {
  (void)state;
  need_nvrtc();
  kc_bucket b = bucket1("batch", 1);
  const char *const entries[] = {"saxpy", "saxpy_typo"};
  kc_gpu_build_out out;
  char err[KC_ERRBUF_SIZE];
  assert_int_equal(build("saxpy.cu", "sm_80", &b, entries, 2, &out, err),
                   KC_BUILD_FAILED);
  assert_contains(err, "'saxpy_typo'");
  assert_null(out.code);
  kc_gpu_build_out_free(&out);
  assert_int_equal(build("saxpy.cu", "compute_80", &b, entries, 2, &out, err),
                   KC_BUILD_FAILED);
  assert_contains(err, "'saxpy_typo' is not in the ptx");
  kc_gpu_build_out_free(&out);
}

static void test_user_options(void **state) {
  (void)state;
  need_nvrtc();
  char *src = kernel_source("saxpy.cu");
  const char *const good[] = {"-DBATCH=2", "--use_fast_math"};
  const char *const bad[] = {"--no-such-nvrtc-option"};
  kc_gpu_build_req req = {.name = "saxpy.cu",
                          .source = src,
                          .arch = "sm_80",
                          .options = good,
                          .n_options = 2};
  kc_gpu_build_out out;
  char err[KC_ERRBUF_SIZE] = "";
  kc_err rc = kc_gpu_build(&req, &out, err);
  if (rc != KC_OK)
    fail_msg("%s: %s", kc_err_name(rc), err);
  kc_gpu_build_out_free(&out);
  req.options = bad;
  req.n_options = 1;
  assert_int_equal(kc_gpu_build(&req, &out, err), KC_BUILD_FAILED);
  assert_contains(err, "nvrtcCompileProgram");
  assert_contains(err, "NVRTC_ERROR_INVALID_OPTION");
  kc_gpu_build_out_free(&out);
  free(src);
}

static void test_bad_requests(void **state) {
  (void)state;
  kc_bucket upper = bucket1("Batch", 1), dash = bucket1("seq-len", 1);
  const char *const empty[] = {""};
  const kc_gpu_build_req cases[] = {
      {.source = NULL, .arch = "sm_80"},
      {.source = "x", .arch = NULL},
      {.source = "x", .arch = "sm_8"},
      {.source = "x", .arch = "gfx90a"},
      {.source = "x", .arch = "sm_80", .bucket = &upper},
      {.source = "x", .arch = "sm_80", .bucket = &dash},
      {.source = "x", .arch = "sm_80", .timeout_s = -1},
      {.source = "x", .arch = "sm_80", .options = NULL, .n_options = 1},
      {.source = "x", .arch = "sm_80", .entries = empty, .n_entries = 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    kc_gpu_build_out out;
    char err[KC_ERRBUF_SIZE] = "";
    kc_err rc = kc_gpu_build(&cases[i], &out, err);
    if (rc != KC_EINVAL)
      fail_msg("case %zu: %s (%s)", i, kc_err_name(rc), err);
    assert_true(err[0] != '\0');
    assert_non_null(out.log);
    assert_string_equal(out.log, "");
    assert_null(out.code);
    kc_gpu_build_out_free(&out);
  }
  kc_gpu_build_out out;
  assert_int_equal(kc_gpu_build(NULL, &out, NULL), KC_EINVAL);
  kc_gpu_build_out_free(&out);
  assert_int_equal(kc_gpu_build(&cases[0], NULL, NULL), KC_EINVAL);
}

/* slow.cu keeps NVRTC's preprocessor busy for hours: a real hang. */
static void test_timeout(void **state) {
  (void)state;
  need_nvrtc();
  char *src = kernel_source("slow.cu");
  kc_gpu_build_req req = {
      .name = "slow.cu", .source = src, .arch = "sm_80", .timeout_s = 1};
  kc_gpu_build_out out;
  char err[KC_ERRBUF_SIZE] = "";
  assert_int_equal(kc_gpu_build(&req, &out, err), KC_TIMEOUT);
  print_message("  slow.cu: %s after %.3f s\n", err, out.seconds);
  assert_contains(err, "timed out after 1 s");
  assert_true(out.seconds >= 0.9 && out.seconds < 10);
  assert_null(out.code);
  errno = 0; /* the child was reaped: no zombie, no other child */
  assert_int_equal(waitpid(-1, NULL, WNOHANG), -1);
  assert_int_equal(errno, ECHILD);
  kc_gpu_build_out_free(&out);
  free(src);
}

typedef struct par_job {
  uint64_t batch;
  kc_err rc;
  char err[KC_ERRBUF_SIZE];
} par_job;

static void *par_build(void *arg) {
  par_job *j = arg;
  char *src = kernel_source("saxpy.cu");
  kc_bucket b = bucket1("batch", j->batch);
  const char *const entries[] = {"saxpy"};
  kc_gpu_build_req req = {.name = "saxpy.cu",
                          .source = src,
                          .arch = "sm_80",
                          .bucket = &b,
                          .entries = entries,
                          .n_entries = 1};
  kc_gpu_build_out out;
  j->rc = kc_gpu_build(&req, &out, j->err);
  kc_gpu_build_out_free(&out);
  free(src);
  return NULL;
}

/* Builds from several threads at once, as a warmup does. */
static void test_parallel_builds(void **state) {
  (void)state;
  need_nvrtc();
#if defined(__SANITIZE_ADDRESS__)
  /* GCC 12's ASan allocator has no fork handlers: a child forked while
   * another thread is inside malloc waits for its lock forever (glibc's
   * malloc, in the normal build, resets its locks in the child). */
  print_message("skipped under ASan: its allocator is not fork-safe with "
                "threads\n");
  skip();
#endif
  enum { N = 4 };
  pthread_t t[N];
  par_job jobs[N];
  for (int i = 0; i < N; i++) {
    jobs[i] = (par_job){.batch = (uint64_t)1 << i};
    assert_int_equal(pthread_create(&t[i], NULL, par_build, &jobs[i]), 0);
  }
  for (int i = 0; i < N; i++) {
    pthread_join(t[i], NULL);
    if (jobs[i].rc != KC_OK)
      fail_msg("thread %d: %s: %s", i, kc_err_name(jobs[i].rc), jobs[i].err);
  }
}

/* ---- NVRTC search ---- */

static void test_nvrtc_forced_missing(void **state) {
  (void)state;
  const char *path = "/nonexistent/kcache-test/libnvrtc.so.13";
  setenv("KCACHE_NVRTC", path, 1);
  char v[16], err[KC_ERRBUF_SIZE] = "";
  assert_int_equal(kc_gpu_nvrtc_version(v, err), KC_NO_NVRTC);
  assert_contains(err, "NVRTC not found");
  assert_contains(err, path);
  /* and no fallback to the toolkit for a build either */
  kc_gpu_build_req req = {.source = "x", .arch = "sm_80"};
  kc_gpu_build_out out;
  err[0] = '\0';
  assert_int_equal(kc_gpu_build(&req, &out, err), KC_NO_NVRTC);
  assert_contains(err, path);
  kc_gpu_build_out_free(&out);
}

static void test_nvrtc_crash(void **state) {
  (void)state;
  setenv("KCACHE_NVRTC", FAKE_NVRTC, 1);
  char v[16], err[KC_ERRBUF_SIZE] = "";
  assert_int_equal(kc_gpu_nvrtc_version(v, err), KC_OK);
  assert_string_equal(v, "99.9"); /* the fake, not the toolkit's */
  kc_gpu_build_req req = {.name = "x.cu", .source = "x", .arch = "sm_80"};
  kc_gpu_build_out out;
  assert_int_equal(kc_gpu_build(&req, &out, err), KC_BUILD_FAILED);
  assert_contains(err, "NVRTC child died with signal 6");
  assert_null(out.code);
  kc_gpu_build_out_free(&out);
}

static void copy_file(const char *from, const char *to) {
  char *data = NULL;
  size_t len = 0;
  assert_int_equal(kc_read_file(from, &data, &len, NULL), KC_OK);
  FILE *f = fopen(to, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, len, f), len);
  fclose(f);
  free(data);
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* The remembered version is used while the library file stays the same and
 * asked again once it changes. A copy of the fake NVRTC (99.9) stands in for
 * the toolkit, so that the test can change it. */
static void test_nvrtc_version_cached(void **state) {
  (void)state;
  char dir[] = "/tmp/kc-gpu-cache-XXXXXX", lib[64], cache[64], v[16];
  char *text = NULL, err[KC_ERRBUF_SIZE] = "";
  assert_non_null(mkdtemp(dir));
  snprintf(lib, sizeof lib, "%s/libnvrtc.so", dir);
  snprintf(cache, sizeof cache, "%s/nvrtc-version", dir);
  copy_file(FAKE_NVRTC, lib);
  setenv("KCACHE_NVRTC", lib, 1);
  assert_int_equal(kc_gpu_nvrtc_version_cached(cache, v, err), KC_OK);
  assert_string_equal(v, "99.9");
  assert_int_equal(kc_read_file(cache, &text, NULL, NULL), KC_OK);
  assert_contains(text, "\t99.9\n");
  /* Remembered: a forged entry for the same file is believed. */
  char *tab = strchr(text, '\t');
  memcpy(tab + 1, "77.7", 4);
  write_text(cache, text);
  assert_int_equal(kc_gpu_nvrtc_version_cached(cache, v, err), KC_OK);
  assert_string_equal(v, "77.7");
  /* Another file (a new mtime): NVRTC is asked again. */
  struct timespec t[2] = {{0, UTIME_OMIT}, {1000000000, 0}};
  assert_int_equal(utimensat(AT_FDCWD, lib, t, 0), 0);
  assert_int_equal(kc_gpu_nvrtc_version_cached(cache, v, err), KC_OK);
  assert_string_equal(v, "99.9");
  assert_int_equal(kc_gpu_nvrtc_version_cached(NULL, v, err), KC_OK);
  assert_string_equal(v, "99.9");
  free(text);
  unlink(cache);
  unlink(lib);
  rmdir(dir);
}

/* NVIDIA's file name says the version: the copy named 42.7 is believed
 * (the fake itself would answer 99.9), and only when the search's first file
 * resolves to such a name. */
static void test_nvrtc_version_from_name(void **state) {
  (void)state;
  char dir[] = "/tmp/kc-gpu-name-XXXXXX", real[64], link[64], v[16];
  char err[KC_ERRBUF_SIZE] = "";
  assert_non_null(mkdtemp(dir));
  snprintf(real, sizeof real, "%s/libnvrtc.so.42.7.1", dir);
  snprintf(link, sizeof link, "%s/libnvrtc.so", dir);
  copy_file(FAKE_NVRTC, real);
  assert_int_equal(symlink("libnvrtc.so.42.7.1", link), 0);
  setenv("KCACHE_NVRTC", link, 1);
  assert_int_equal(kc_gpu_nvrtc_version_cached(NULL, v, err), KC_OK);
  assert_string_equal(v, "42.7");
  assert_int_equal(kc_gpu_nvrtc_version(v, err), KC_OK);
  assert_string_equal(v, "99.9"); /* a build asks the library itself */
  unlink(link);
  unlink(real);
  rmdir(dir);
}

/* ---- NVRTC's version from install metadata ---- */

/* A fake toolkit tree under a temporary directory, removed afterwards. */
typedef struct fake_tree {
  char root[32];
} fake_tree;

static void tree_init(fake_tree *t) {
  snprintf(t->root, sizeof t->root, "/tmp/kc-gpu-meta-XXXXXX");
  assert_non_null(mkdtemp(t->root));
}

/* <root>/<rel>, its parent directories made. */
static const char *tree_path(fake_tree *t, const char *rel, char out[512]) {
  snprintf(out, 512, "%s/%s", t->root, rel);
  for (char *p = out + strlen(t->root) + 1; (p = strchr(p, '/')); p++) {
    *p = '\0';
    assert_true(mkdir(out, 0755) == 0 || errno == EEXIST);
    *p = '/';
  }
  return out;
}

static void tree_text(fake_tree *t, const char *rel, const char *text) {
  char path[512];
  write_text(tree_path(t, rel, path), text);
}

static void tree_link(fake_tree *t, const char *rel, const char *target) {
  char path[512];
  assert_int_equal(symlink(target, tree_path(t, rel, path)), 0);
}

static int rm_entry(const char *path, const struct stat *st, int flag,
                    struct FTW *ftw) {
  (void)st, (void)ftw;
  return flag == FTW_DP ? rmdir(path) : unlink(path);
}

static void tree_free(fake_tree *t) {
  assert_int_equal(nftw(t->root, rm_entry, 16, FTW_DEPTH | FTW_PHYS), 0);
}

/* A library file that dlopen refuses: an answer with it loaded nothing. */
#define NOT_AN_ELF "not an ELF: a fast path must not dlopen this\n"

/* version_cached's answer with $KCACHE_NVRTC at <root>/<rel>. */
static kc_err cached_at(fake_tree *t, const char *rel, const char *cache,
                        char v[16]) {
  char path[512], err[KC_ERRBUF_SIZE] = "";
  snprintf(path, sizeof path, "%s/%s", t->root, rel);
  setenv("KCACHE_NVRTC", path, 1);
  v[0] = '\0';
  return kc_gpu_nvrtc_version_cached(cache, v, err);
}

static const char toolkit_json[] =
    "{\"cuda\": {\"name\": \"CUDA SDK\", \"version\": \"13.6.0\"},\n"
    " \"cuda_nvrtc\": {\"name\": \"CUDA NVRTC\", \"version\": \"13.7.88\"}}\n";

/* A runfile toolkit: lib64 -> targets/x86_64-linux/lib, version.json at the
 * top. Found through $KCACHE_NVRTC and through $CUDA_HOME alike, and the
 * library (not loadable) is never loaded; nothing is remembered. */
static void test_nvrtc_meta_version_json(void **state) {
  (void)state;
  fake_tree t;
  char v[16], cache[512], err[KC_ERRBUF_SIZE] = "";
  tree_init(&t);
  tree_text(&t, "cuda/targets/x86_64-linux/lib/libnvrtc.so.13", NOT_AN_ELF);
  tree_link(&t, "cuda/lib64", "targets/x86_64-linux/lib");
  tree_text(&t, "cuda/version.json", toolkit_json);
  tree_path(&t, "nvrtc-version", cache);
  assert_int_equal(cached_at(&t, "cuda/lib64/libnvrtc.so.13", cache, v), KC_OK);
  assert_string_equal(v, "13.7"); /* MAJOR.MINOR of cuda_nvrtc's, not cuda's */
  assert_int_equal(access(cache, F_OK), -1);
  assert_int_equal(kc_gpu_nvrtc_version(v, err), KC_NO_NVRTC); /* no ELF */
  unsetenv("KCACHE_NVRTC");
  setenv("CUDA_HOME", tree_path(&t, "cuda", cache), 1);
  assert_int_equal(kc_gpu_nvrtc_version_cached(NULL, v, err), KC_OK);
  assert_string_equal(v, "13.7");
  tree_free(&t);
}

/* A wheel's RECORD line for the library: name and size must match. */
static void write_record(fake_tree *t, const char *dist, const char *lib,
                         long size) {
  char rel[256], text[512];
  snprintf(rel, sizeof rel, "%s/RECORD", dist);
  snprintf(text, sizeof text,
           "nvidia/cu13/include/nvrtc.h,sha256=x,44887\n"
           "%s,sha256=x,%ld\n%s/RECORD,,\n",
           lib, size, dist);
  tree_text(t, rel, text);
}

/* A pip-assembled toolkit (this kind of /usr/local/cuda): lib/ with a
 * dist-info/ beside it holding the cu13 wheel and, as a decoy, the cu12
 * wheel (its RECORD lists libnvrtc.so.12); then a plain site-packages. */
static void test_nvrtc_meta_dist_info(void **state) {
  (void)state;
  fake_tree t;
  char v[16];
  long size = (long)strlen(NOT_AN_ELF);
  tree_init(&t);
  tree_text(&t, "cuda/lib/libnvrtc.so.13", NOT_AN_ELF);
  tree_link(&t, "cuda/lib/libnvrtc.so", "libnvrtc.so.13");
  tree_link(&t, "cuda/lib64", "lib");
  write_record(&t, "cuda/dist-info/nvidia_cuda_nvrtc_cu12-12.4.127.dist-info",
               "nvidia/cuda_nvrtc/lib/libnvrtc.so.12", size);
  write_record(&t, "cuda/dist-info/nvidia_cuda_nvrtc-13.8.1.dist-info",
               "nvidia/cu13/lib/libnvrtc.so.13", size);
  assert_int_equal(cached_at(&t, "cuda/lib64/libnvrtc.so", NULL, v), KC_OK);
  assert_string_equal(v, "13.8");
  /* A RECORD of another size is another file: not believed, so loaded. */
  write_record(&t, "cuda/dist-info/nvidia_cuda_nvrtc-13.8.1.dist-info",
               "nvidia/cu13/lib/libnvrtc.so.13", size + 1);
  assert_int_equal(cached_at(&t, "cuda/lib64/libnvrtc.so", NULL, v),
                   KC_NO_NVRTC);
  /* site-packages: <site>/nvidia/cu13/lib, the dist-info in <site>. */
  tree_text(&t, "site/nvidia/cu13/lib/libnvrtc.so.13", NOT_AN_ELF);
  write_record(&t, "site/nvidia_cuda_nvrtc-13.9.0.dist-info",
               "nvidia/cu13/lib/libnvrtc.so.13", size);
  assert_int_equal(
      cached_at(&t, "site/nvidia/cu13/lib/libnvrtc.so.13", NULL, v), KC_OK);
  assert_string_equal(v, "13.9");
  tree_free(&t);
}

/* Metadata that cannot be read, or that contradicts the file's name, is
 * passed over: version.json malformed -> the dist-info; neither usable ->
 * the library (a copy of the fake, 99.9) is loaded and remembered; and a
 * remembered answer comes before metadata. */
static void test_nvrtc_meta_fallback(void **state) {
  (void)state;
  static const char *const bad_json[] = {
      "{\"cuda_nvrtc\": {\"version\": \"13.0",
      "[1, 2]",
      "",
      "{\"cuda_nvrtc\": {\"version\": 13.0}}",
      "{\"cuda_nvrtc\": {\"version\": \"v13\"}}",
      "{\"cuda_nvrtc\": {\"version\": \"13.0000.1\"}}",
      "{\"cuda_nvrtc\": \"13.0.88\"}"};
  fake_tree t;
  char v[16], cache[512], lib[512], rel[] = "cuda/lib64/libnvrtc.so.13";
  tree_init(&t);
  copy_file(FAKE_NVRTC, tree_path(&t, rel, lib));
  write_record(&t, "cuda/nvidia_cuda_nvrtc-13.8.1.dist-info",
               "nvidia/cu13/lib/libnvrtc.so.13", 0);
  for (size_t i = 0; i < sizeof bad_json / sizeof *bad_json; i++) {
    tree_text(&t, "cuda/version.json", bad_json[i]);
    assert_int_equal(cached_at(&t, rel, NULL, v), KC_OK);
    assert_string_equal(v, "99.9"); /* the dist-info's size is not the copy's */
  }
  struct stat st;
  assert_int_equal(stat(lib, &st), 0);
  write_record(&t, "cuda/nvidia_cuda_nvrtc-13.8.1.dist-info",
               "nvidia/cu13/lib/libnvrtc.so.13", (long)st.st_size);
  assert_int_equal(cached_at(&t, rel, NULL, v), KC_OK);
  assert_string_equal(v, "13.8"); /* malformed version.json, then dist-info */
  /* libnvrtc.so.13 is NVRTC 13.x: metadata saying 12.4 is not believed. */
  tree_text(&t, "cuda/version.json",
            "{\"cuda_nvrtc\": {\"version\": \"12.4.131\"}}");
  tree_link(&t, "cuda/lib64/libnvrtc.so", "libnvrtc.so.13");
  tree_path(&t, "nvrtc-version", cache);
  assert_int_equal(cached_at(&t, "cuda/lib64/libnvrtc.so", cache, v), KC_OK);
  assert_string_equal(v, "13.8");
  tree_text(&t, "cuda/nvidia_cuda_nvrtc-13.8.1.dist-info/RECORD", "");
  assert_int_equal(cached_at(&t, "cuda/lib64/libnvrtc.so", cache, v), KC_OK);
  assert_string_equal(v, "99.9"); /* loaded, and remembered */
  assert_int_equal(access(cache, F_OK), 0);
  tree_text(&t, "cuda/version.json",
            "{\"cuda_nvrtc\": {\"version\": \"13.2.0\"}}");
  assert_int_equal(cached_at(&t, "cuda/lib64/libnvrtc.so", cache, v), KC_OK);
  assert_string_equal(v, "99.9"); /* the remembered answer comes first */
  assert_int_equal(cached_at(&t, "cuda/lib64/libnvrtc.so", NULL, v), KC_OK);
  assert_string_equal(v, "13.2");
  tree_free(&t);
}

/* PyPI's nvidia-cuda-nvrtc in the active environment is found after the
 * toolkit: $VIRTUAL_ENV/lib/python3.N/site-packages/nvidia/cu13/lib. */
static void test_nvrtc_wheel_env(void **state) {
  (void)state;
  fake_tree t;
  char lib[512], v[16], err[KC_ERRBUF_SIZE] = "";
  tree_init(&t);
  copy_file(FAKE_NVRTC,
            tree_path(&t,
                      "lib/python3.12/site-packages/nvidia/cu13/lib/"
                      "libnvrtc.so.13",
                      lib));
  unsetenv("KCACHE_NVRTC");
  unsetenv("CONDA_PREFIX");
  setenv("CUDA_HOME", "/nonexistent/kcache-cuda", 1);
  setenv("VIRTUAL_ENV", t.root, 1);
  kc_err rc = kc_gpu_nvrtc_version(v, err);
  int has_toolkit = access("/usr/local/cuda/lib64/libnvrtc.so", F_OK) == 0 ||
                    access("/usr/local/cuda/lib64/libnvrtc.so.13", F_OK) == 0 ||
                    access("/usr/local/cuda/lib64/libnvrtc.so.12", F_OK) == 0;
  if (!has_toolkit) { /* nothing before the wheel: it is what loads */
    assert_int_equal(rc, KC_OK);
    assert_string_equal(v, "99.9");
    setenv("CONDA_PREFIX", t.root, 1); /* conda's prefix alike */
    assert_int_equal(kc_gpu_nvrtc_version(v, err), KC_OK);
    assert_string_equal(v, "99.9");
    assert_int_equal(kc_gpu_nvrtc_version_cached(NULL, v, err), KC_OK);
    assert_string_equal(v, "99.9");
    unsetenv("CONDA_PREFIX");
    setenv("VIRTUAL_ENV", "/nonexistent/kcache-venv", 1);
    if (kc_gpu_nvrtc_version(v, err) == KC_OK) /* one loaded before */
      assert_string_not_equal(v, "99.9");
    else /* the message names the environment's place */
      assert_contains(err,
                      "/nonexistent/kcache-venv/lib/python3*/site-packages");
  } else {
    print_message("  a toolkit NVRTC comes before the wheel here\n");
  }
  tree_free(&t);
}

static void test_nvrtc_too_old(void **state) {
  (void)state;
  setenv("KCACHE_NVRTC", OLD_NVRTC, 1);
  char v[16], err[KC_ERRBUF_SIZE] = "";
  assert_int_equal(kc_gpu_nvrtc_version(v, err), KC_NO_NVRTC);
  assert_contains(err, "nvrtcGetCUBIN");
}

/* An NVRTC loaded by path from a directory off the loader path (a PyPI
 * wheel's nvidia/cu13/lib) finds the builtins it dlopens by soname. */
static void test_nvrtc_builtins_beside(void **state) {
  (void)state;
  setenv("KCACHE_NVRTC", WHEEL_NVRTC, 1);
  kc_gpu_build_req req = {.name = "k.cu", .source = "x", .arch = "sm_90"};
  kc_gpu_build_out out;
  char err[KC_ERRBUF_SIZE] = "";
  kc_err rc = kc_gpu_build(&req, &out, err);
  if (rc != KC_OK)
    fail_msg("%s: %s", kc_err_name(rc), err);
  kc_gpu_build_out_free(&out);
}

static void test_nvrtc_cuda_home(void **state) {
  (void)state;
  unsetenv("KCACHE_NVRTC");
  setenv("CUDA_HOME", FAKE_CUDA_HOME, 1);
  char v[16], err[KC_ERRBUF_SIZE] = "";
  assert_int_equal(kc_gpu_nvrtc_version(v, err), KC_OK);
  assert_string_equal(v, "99.9"); /* $CUDA_HOME/lib64 comes first */
  setenv("CUDA_HOME", "/nonexistent/kcache-cuda", 1);
  kc_err rc = kc_gpu_nvrtc_version(v, err);
  if (rc == KC_OK) /* found further down the search order */
    assert_string_not_equal(v, "99.9");
  else /* nothing anywhere: the message names every place */
    assert_contains(err, "/nonexistent/kcache-cuda/lib64/libnvrtc.so");
  setenv("KCACHE_NVRTC", "", 1); /* empty counts as unset */
  unsetenv("CUDA_HOME");
  assert_int_equal(kc_gpu_nvrtc_version(v, err), rc);
}

/* ---- Driver ---- */

static void test_detect(void **state) {
  (void)state;
  kc_gpu_info info;
  char err[KC_ERRBUF_SIZE] = "";
  kc_err rc = kc_gpu_detect(&info, err);
  if (rc == KC_NO_DRIVER) {
    print_message("  %s\n", err);
    assert_int_equal(info.n_devices, 0);
    assert_contains(err, "CUDA");
    /* not found (rather than found and failing cuInit): every place the
     * driver is looked for is named, the container runtime's among them */
    if (!strstr(err, "cuInit") && !getenv("KCACHE_LIBCUDA"))
      assert_contains(err, "/usr/local/nvidia/lib64");
    return;
  }
  if (rc != KC_OK)
    fail_msg("%s: %s", kc_err_name(rc), err);
  assert_true(info.driver_version >= 11040);
  assert_true(info.n_devices > 0 && info.n_devices <= 16);
  for (int i = 0; i < info.n_devices; i++) {
    const kc_gpu_device *d = &info.devices[i];
    print_message("  GPU %d: %s, %d.%d, %s, %s, %llu MiB\n", d->ordinal,
                  d->name, d->cc_major, d->cc_minor, d->arch, d->uuid,
                  (unsigned long long)(d->total_mem >> 20));
    assert_int_equal(d->ordinal, i);
    assert_true(d->name[0] != '\0');
    assert_true(kc_arch_valid(d->arch));
    assert_true(kc_gpu_arch_runs_on(d->arch, d->cc_major, d->cc_minor));
    assert_int_equal(strlen(d->uuid), 40);
    assert_memory_equal(d->uuid, "GPU-", 4);
    assert_true(d->total_mem > 0);
  }
}

static const unsigned char not_code[] = "not a module";

static void test_load_check_no_driver(void **state) {
  (void)state;
  kc_gpu_info info;
  char err[KC_ERRBUF_SIZE] = "";
  if (kc_gpu_detect(&info, err) != KC_NO_DRIVER) {
    print_message("skipped: this host has a driver\n");
    skip();
  }
  const char *const entries[] = {"saxpy"};
  assert_int_equal(
      kc_gpu_load_check(0, not_code, sizeof not_code, entries, 1, err),
      KC_NO_DRIVER);
  assert_int_equal(kc_gpu_load_check(0, NULL, 0, entries, 1, err), KC_EINVAL);
}

/* Builds saxpy for the candidate arch and loads it: the driver's answer must
 * be what kc_gpu_arch_runs_on predicts. */
static void load_one(const kc_gpu_device *d, const char *arch) {
  kc_bucket b = bucket1("batch", 4);
  const char *const entries[] = {"saxpy", "scale"};
  kc_gpu_build_out out;
  char err[KC_ERRBUF_SIZE];
  assert_int_equal(build("saxpy.cu", arch, &b, entries, 2, &out, err), KC_OK);
  kc_err rc =
      kc_gpu_load_check(d->ordinal, out.code, out.code_len, entries, 2, err);
  int want = kc_gpu_arch_runs_on(arch, d->cc_major, d->cc_minor);
  print_message("  load %s on %d.%d: %s %s\n", arch, d->cc_major, d->cc_minor,
                kc_err_name(rc), rc ? err : "");
  if ((rc == KC_OK) != want)
    fail_msg("%s on %d.%d: driver says %s, rules say %d", arch, d->cc_major,
             d->cc_minor, kc_err_name(rc), want);
  if (rc != KC_OK)
    assert_int_equal(rc, KC_GPU);
  kc_gpu_build_out_free(&out);
}

static void test_load_check_gpu(void **state) {
  (void)state;
  kc_gpu_info info;
  char err[KC_ERRBUF_SIZE] = "";
  if (kc_gpu_detect(&info, err) != KC_OK) {
    print_message("skipped: no GPU (%s)\n", err);
    skip();
  }
  need_nvrtc();
  const kc_gpu_device *d = &info.devices[0];
  load_one(d, d->arch);
  static const char *const others[] = {"sm_75",      "sm_80",      "sm_86",
                                       "sm_90a",     "sm_100a",    "sm_120a",
                                       "compute_75", "compute_90a"};
  for (size_t i = 0; i < sizeof others / sizeof *others; i++)
    load_one(d, others[i]);
  const char *const typo[] = {"saxpy_typo"};
  kc_bucket b = bucket1("batch", 4);
  kc_gpu_build_out out;
  assert_int_equal(build("saxpy.cu", d->arch, &b, NULL, 0, &out, err), KC_OK);
  assert_int_equal(
      kc_gpu_load_check(d->ordinal, out.code, out.code_len, typo, 1, err),
      KC_GPU);
  assert_contains(err, "saxpy_typo");
  assert_int_equal(
      kc_gpu_load_check(d->ordinal, not_code, sizeof not_code, typo, 1, err),
      KC_GPU);
  kc_gpu_build_out_free(&out);
}

/* With the toolkit's stub libcuda: every symbol binds, cuInit fails. */
static void test_stub_driver(void **state) {
  (void)state;
  kc_gpu_info info;
  char err[KC_ERRBUF_SIZE] = "";
  assert_int_equal(kc_gpu_detect(&info, err), KC_NO_DRIVER);
  print_message("  %s\n", err);
  assert_contains(err, "cuInit: CUDA_ERROR_STUB_LIBRARY");
  assert_int_equal(info.n_devices, 0);
  const char *const entries[] = {"saxpy"};
  assert_int_equal(
      kc_gpu_load_check(0, not_code, sizeof not_code, entries, 1, err),
      KC_NO_DRIVER);
  assert_contains(err, "cuInit");
}

/* ---- The fake driver (tests/gpu_fake_cuda.c via KCACHE_LIBCUDA) ---- */

/* A function of the fake driver that gpu/cuda.c has loaded already. */
static void *fake_sym(const char *name) {
  const char *path = getenv("KCACHE_LIBCUDA");
  void *lib = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
  void *f = lib ? dlsym(lib, name) : NULL;
  if (!f)
    fail_msg("fake driver: no %s in %s", name, path ? path : "(unset)");
  return f;
}

static int fake_count(const char *name) {
  int (*f)(void);
  void *p = fake_sym(name);
  memcpy(&f, &p, sizeof p);
  return f();
}

static void test_fake_detect(void **state) {
  (void)state;
  kc_gpu_info info;
  char err[KC_ERRBUF_SIZE] = "";
  assert_int_equal(kc_gpu_detect(&info, err), KC_OK);
  assert_int_equal(info.driver_version, 13000);
  assert_int_equal(info.n_devices, 1);
  const kc_gpu_device *d = &info.devices[0];
  assert_string_equal(d->name, "kcache fake GPU");
  assert_int_equal(d->cc_major, 9);
  assert_int_equal(d->cc_minor, 0);
  assert_string_equal(d->arch, "sm_90a");
  assert_string_equal(d->uuid, "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf");
  assert_true(d->total_mem == (uint64_t)80 << 30);
  int v = 0;
  assert_int_equal(kc_gpu_driver_version(&v, err), KC_OK);
  assert_int_equal(v, 13000);
}

/* Many load checks create the primary context once, and each puts the
 * caller's current context back. */
static void test_fake_load_check(void **state) {
  (void)state;
  static const char mod[] = "fake-module saxpy scale";
  const char *const entries[] = {"saxpy", "scale"};
  char err[KC_ERRBUF_SIZE] = "";
  int (*get_current)(void **);
  void *p = fake_sym("cuCtxGetCurrent");
  memcpy(&get_current, &p, sizeof p);
  for (int i = 0; i < 20; i++) {
    /* PTX-like text with and without its NUL */
    size_t len = i % 2 ? sizeof mod : sizeof mod - 1;
    if (kc_gpu_load_check(0, mod, len, entries, 2, err) != KC_OK)
      fail_msg("load %d: %s", i, err);
    void *cur = (void *)1;
    assert_int_equal(get_current(&cur), 0);
    assert_null(cur);
  }
  assert_int_equal(fake_count("fake_cuda_contexts_created"), 1);
  assert_int_equal(fake_count("fake_cuda_primary_refs"), 1);

  assert_int_equal(
      kc_gpu_load_check(0, not_code, sizeof not_code, entries, 2, err), KC_GPU);
  assert_contains(err, "cuModuleLoadData: CUDA_ERROR_NO_BINARY_FOR_GPU");
  const char *const typo[] = {"saxpy", "saxpy_typo"};
  assert_int_equal(kc_gpu_load_check(0, mod, sizeof mod, typo, 2, err), KC_GPU);
  assert_contains(err, "entry 'saxpy_typo': cuModuleGetFunction: "
                       "CUDA_ERROR_NOT_FOUND");
  assert_int_equal(kc_gpu_load_check(1, mod, sizeof mod, entries, 2, err),
                   KC_GPU);
  assert_contains(err, "cuDeviceGet: CUDA_ERROR_INVALID_DEVICE");
  assert_int_equal(kc_gpu_load_check(-1, mod, sizeof mod, entries, 2, err),
                   KC_EINVAL);
  assert_int_equal(kc_gpu_load_check(64, mod, sizeof mod, entries, 2, err),
                   KC_EINVAL);
  assert_int_equal(fake_count("fake_cuda_contexts_created"), 1);
}

/* KCACHE_LIBCUDA names the driver, and nothing else is tried. */
static void test_fake_forced_missing(void **state) {
  (void)state;
  char *saved = dup_env("KCACHE_LIBCUDA");
  kc_gpu_info info;
  char err[KC_ERRBUF_SIZE] = "";
  setenv("KCACHE_LIBCUDA", "/nonexistent/kcache/libcuda.so.1", 1);
  kc_err rc = kc_gpu_detect(&info, err);
  put_env("KCACHE_LIBCUDA", saved);
  free(saved);
  assert_int_equal(rc, KC_NO_DRIVER);
  assert_contains(err, "KCACHE_LIBCUDA=/nonexistent/kcache/libcuda.so.1");
  assert_int_equal(info.n_devices, 0);
}

/* ---- Compatible targets ----
 *
 * The expected table is NVIDIA's published rules written out per target,
 * not derived from arch.c:
 *  - a cubin sm_XY runs on the same major X with minor >= Y (Blackwell
 *    compatibility guide, CUDA 13.0, 1.2: "a cubin generated for compute
 *    capability 8.6 is not supported to run on 8.0 ... 8.x is not supported
 *    on 9.0");
 *  - PTX compute_XY is JIT-compiled for any capability >= X.Y (same guide:
 *    "PTX code generated for compute capability 9.x is supported to run on
 *    compute capability 9.x or any higher revision (major or minor)");
 *  - 'a' (arch-specific, CUDA 12.0+): exactly X.Y, cubin and PTX alike;
 *  - 'f' (family-specific, CUDA 12.9+): the same major with minor >= Y
 *    ("compute_100f ... runs on 10.0 and 10.3"; NVIDIA blog "NVIDIA
 *    Blackwell and NVIDIA CUDA 12.9 Introduce Family-Specific Architecture
 *    Features", and the CUDA programming guide, compute capabilities).
 * Devices: every capability NVIDIA has shipped a target for. Every pair
 * of (target, device) is checked: a device missing from a row must not run
 * it. */
static const char *const compat_devices[] = {
    "5.0", "5.2", "5.3", "6.0", "6.1",  "6.2",  "7.0",  "7.2",  "7.5",  "8.0",
    "8.6", "8.7", "8.9", "9.0", "10.0", "10.1", "10.3", "11.0", "12.0", "12.1"};

static const struct {
  const char *arch, *runs_on; /* the devices, space-separated */
} compat_table[] = {
    {"sm_50", "5.0 5.2 5.3"},
    {"sm_52", "5.2 5.3"},
    {"sm_53", "5.3"},
    {"sm_60", "6.0 6.1 6.2"},
    {"sm_61", "6.1 6.2"},
    {"sm_62", "6.2"},
    {"sm_70", "7.0 7.2 7.5"},
    {"sm_72", "7.2 7.5"},
    {"sm_75", "7.5"},
    {"sm_80", "8.0 8.6 8.7 8.9"},
    {"sm_86", "8.6 8.7 8.9"},
    {"sm_87", "8.7 8.9"},
    {"sm_89", "8.9"},
    {"sm_90", "9.0"},
    {"sm_90a", "9.0"},
    {"sm_100", "10.0 10.1 10.3"},
    {"sm_100a", "10.0"},
    {"sm_100f", "10.0 10.1 10.3"},
    {"sm_101", "10.1 10.3"},
    {"sm_101a", "10.1"},
    {"sm_101f", "10.1 10.3"},
    {"sm_103", "10.3"},
    {"sm_103a", "10.3"},
    {"sm_103f", "10.3"},
    {"sm_110", "11.0"},
    {"sm_110a", "11.0"},
    {"sm_110f", "11.0"},
    {"sm_120", "12.0 12.1"},
    {"sm_120a", "12.0"},
    {"sm_120f", "12.0 12.1"},
    {"sm_121", "12.1"},
    {"sm_121a", "12.1"},
    {"sm_121f", "12.1"},
    {"compute_50", "5.0 5.2 5.3 6.0 6.1 6.2 7.0 7.2 7.5 8.0 8.6 8.7 8.9 9.0 "
                   "10.0 10.1 10.3 11.0 12.0 12.1"},
    {"compute_52", "5.2 5.3 6.0 6.1 6.2 7.0 7.2 7.5 8.0 8.6 8.7 8.9 9.0 10.0 "
                   "10.1 10.3 11.0 12.0 12.1"},
    {"compute_53", "5.3 6.0 6.1 6.2 7.0 7.2 7.5 8.0 8.6 8.7 8.9 9.0 10.0 10.1 "
                   "10.3 11.0 12.0 12.1"},
    {"compute_60", "6.0 6.1 6.2 7.0 7.2 7.5 8.0 8.6 8.7 8.9 9.0 10.0 10.1 10.3 "
                   "11.0 12.0 12.1"},
    {"compute_61",
     "6.1 6.2 7.0 7.2 7.5 8.0 8.6 8.7 8.9 9.0 10.0 10.1 10.3 11.0 12.0 12.1"},
    {"compute_62",
     "6.2 7.0 7.2 7.5 8.0 8.6 8.7 8.9 9.0 10.0 10.1 10.3 11.0 12.0 12.1"},
    {"compute_70",
     "7.0 7.2 7.5 8.0 8.6 8.7 8.9 9.0 10.0 10.1 10.3 11.0 12.0 12.1"},
    {"compute_72", "7.2 7.5 8.0 8.6 8.7 8.9 9.0 10.0 10.1 10.3 11.0 12.0 12.1"},
    {"compute_75", "7.5 8.0 8.6 8.7 8.9 9.0 10.0 10.1 10.3 11.0 12.0 12.1"},
    {"compute_80", "8.0 8.6 8.7 8.9 9.0 10.0 10.1 10.3 11.0 12.0 12.1"},
    {"compute_86", "8.6 8.7 8.9 9.0 10.0 10.1 10.3 11.0 12.0 12.1"},
    {"compute_87", "8.7 8.9 9.0 10.0 10.1 10.3 11.0 12.0 12.1"},
    {"compute_89", "8.9 9.0 10.0 10.1 10.3 11.0 12.0 12.1"},
    {"compute_90", "9.0 10.0 10.1 10.3 11.0 12.0 12.1"},
    {"compute_90a", "9.0"},
    {"compute_100", "10.0 10.1 10.3 11.0 12.0 12.1"},
    {"compute_100a", "10.0"},
    {"compute_100f", "10.0 10.1 10.3"},
    {"compute_101", "10.1 10.3 11.0 12.0 12.1"},
    {"compute_101a", "10.1"},
    {"compute_101f", "10.1 10.3"},
    {"compute_103", "10.3 11.0 12.0 12.1"},
    {"compute_103a", "10.3"},
    {"compute_103f", "10.3"},
    {"compute_110", "11.0 12.0 12.1"},
    {"compute_110a", "11.0"},
    {"compute_110f", "11.0"},
    {"compute_120", "12.0 12.1"},
    {"compute_120a", "12.0"},
    {"compute_120f", "12.0 12.1"},
    {"compute_121", "12.1"},
    {"compute_121a", "12.1"},
    {"compute_121f", "12.1"},
};

static int listed(const char *list, const char *dev) {
  size_t n = strlen(dev);
  for (const char *p = list; (p = strstr(p, dev)); p += n)
    if ((p == list || p[-1] == ' ') && (p[n] == ' ' || !p[n]))
      return 1;
  return 0;
}

static void test_compat_table(void **state) {
  (void)state;
  size_t n_dev = sizeof compat_devices / sizeof *compat_devices, pairs = 0;
  for (size_t i = 0; i < sizeof compat_table / sizeof *compat_table; i++) {
    assert_true(kc_arch_valid(compat_table[i].arch));
    for (size_t d = 0; d < n_dev; d++) {
      int major, minor;
      assert_int_equal(kc_gpu_cc_parse(compat_devices[d], &major, &minor), 0);
      int want = listed(compat_table[i].runs_on, compat_devices[d]);
      int got = kc_gpu_arch_runs_on(compat_table[i].arch, major, minor);
      if (got != want)
        fail_msg("%s on %s: got %d, want %d", compat_table[i].arch,
                 compat_devices[d], got, want);
      /* with a driver that reads the PTX, usable is runs_on */
      assert_int_equal(
          kc_gpu_arch_usable(compat_table[i].arch, major, minor, 87, 12080),
          want);
      pairs++;
    }
  }
  assert_int_equal(pairs, 66 * n_dev); /* 20 numbers, 7 a, 6 f, x2 kinds */
}

/* PTX ISA versions per CUDA release (PTX ISA manual, release history). */
static void test_ptx_isa(void **state) {
  (void)state;
  static const struct {
    const char *cuda;
    int isa;
  } w[] = {{"9.0", 60},    {"10.2", 65}, {"11.0", 70}, {"11.8", 78},
           {"12.0", 80},   {"12.5", 85}, {"12.6", 85}, {"12.7", 86},
           {"12.8", 87},   {"12.9", 88}, {"13.0", 90}, {"13.1", 91},
           {"12.8.1", 87}, {"8.0", 0},   {"99.0", 0},  {"", 0},
           {"abc", 0},     {"12", 0},    {"12.8x", 0}};
  for (size_t i = 0; i < sizeof w / sizeof *w; i++)
    if (kc_gpu_ptx_isa_written(w[i].cuda) != w[i].isa)
      fail_msg("written(%s) = %d, want %d", w[i].cuda,
               kc_gpu_ptx_isa_written(w[i].cuda), w[i].isa);
  assert_int_equal(kc_gpu_ptx_isa_written(NULL), 0);
  assert_int_equal(kc_gpu_ptx_isa_read(12080), 87);
  assert_int_equal(kc_gpu_ptx_isa_read(12090), 88);
  assert_int_equal(kc_gpu_ptx_isa_read(13000), 90);
  assert_int_equal(kc_gpu_ptx_isa_read(12065), 85); /* 12.6 */
  assert_int_equal(kc_gpu_ptx_isa_read(8000), 0);
  assert_int_equal(kc_gpu_ptx_isa_read(99000), 95); /* newer: at least */
  /* PTX never for a driver older than its ISA */
  assert_int_equal(kc_gpu_arch_usable("compute_80", 8, 9, 90, 12080), 0);
  assert_int_equal(kc_gpu_arch_usable("compute_80", 8, 9, 90, 13000), 1);
  assert_int_equal(kc_gpu_arch_usable("compute_80", 8, 9, 88, 12080), 0);
  assert_int_equal(kc_gpu_arch_usable("compute_80", 8, 9, 87, 12080), 1);
  assert_int_equal(kc_gpu_arch_usable("compute_80", 8, 9, 0, 13000), 0);
  assert_int_equal(kc_gpu_arch_usable("compute_80", 8, 9, 87, 0), 0);
  /* a cubin ignores the ISA; the arch rule still holds */
  assert_int_equal(kc_gpu_arch_usable("sm_86", 8, 9, 0, 0), 1);
  assert_int_equal(kc_gpu_arch_usable("sm_90a", 10, 0, 90, 13000), 0);
  assert_int_equal(kc_gpu_arch_usable("compute_90a", 10, 0, 90, 13000), 0);
  assert_int_equal(kc_gpu_arch_usable("compute_90a", 9, 0, 90, 13000), 1);
}

static void test_cc_parse(void **state) {
  (void)state;
  int ma = -1, mi = -1;
  assert_int_equal(kc_gpu_cc_parse("sm_89", &ma, &mi), 0);
  assert_true(ma == 8 && mi == 9);
  assert_int_equal(kc_gpu_cc_parse("sm_100a", &ma, &mi), 0);
  assert_true(ma == 10 && mi == 0);
  assert_int_equal(kc_gpu_cc_parse("compute_121f", &ma, &mi), 0);
  assert_true(ma == 12 && mi == 1);
  assert_int_equal(kc_gpu_cc_parse("8.6", &ma, &mi), 0);
  assert_true(ma == 8 && mi == 6);
  assert_int_equal(kc_gpu_cc_parse("10.3", &ma, &mi), 0);
  assert_true(ma == 10 && mi == 3);
  static const char *const bad[] = {NULL,     "",     "8",    "8.",   ".9",
                                    "8.10",   "08.9", " 8.9", "8.9 ", "sm_8",
                                    "gfx90a", "-8.9", "123.4"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    if (kc_gpu_cc_parse(bad[i], &ma, &mi) == 0)
      fail_msg("'%s' parsed as %d.%d", bad[i] ? bad[i] : "(null)", ma, mi);
}

/* The order warm tries compatible bundles in: exact capability first,
 * cubins of the same major by falling minor ('a', 'f', plain), then PTX,
 * the newest first. */
static void test_compat_order(void **state) {
  (void)state;
  static const struct {
    int major, minor, isa, driver;
    const char *want;
  } cases[] = {
      {8, 9, 87, 12080,
       "sm_89 sm_87 sm_86 sm_80 compute_89 compute_87 compute_86 compute_80 "
       "compute_75 compute_72 compute_70 compute_62 compute_61 compute_60 "
       "compute_53 compute_52 compute_50"},
      {8, 9, 90, 12080, "sm_89 sm_87 sm_86 sm_80"}, /* PTX too new */
      {8, 9, 0, 13000, "sm_89 sm_87 sm_86 sm_80"},  /* PTX ISA unknown */
      {9, 0, 0, 0, "sm_90a sm_90"},
      {10, 0, 0, 0, "sm_100a sm_100f sm_100"},
      {10, 3, 0, 0, "sm_103a sm_103f sm_103 sm_101f sm_101 sm_100f sm_100"},
      {12, 1, 0, 0, "sm_121a sm_121f sm_121 sm_120f sm_120"},
      {11, 0, 90, 13000,
       "sm_110a sm_110f sm_110 compute_110a compute_110f compute_110 "
       "compute_103 compute_101 compute_100 compute_90 compute_89 "
       "compute_87 compute_86 compute_80 compute_75 compute_72 compute_70 "
       "compute_62 compute_61 compute_60 compute_53 compute_52 compute_50"},
      {7, 5, 0, 0, "sm_75 sm_72 sm_70"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char out[80][KC_ARCH_MAX + 1], got[2048] = "";
    size_t n = kc_gpu_compat_archs(cases[i].major, cases[i].minor, cases[i].isa,
                                   cases[i].driver, out, 80);
    for (size_t k = 0; k < n; k++)
      snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s",
               k ? " " : "", out[k]);
    if (strcmp(got, cases[i].want) != 0)
      fail_msg("%d.%d: got '%s', want '%s'", cases[i].major, cases[i].minor,
               got, cases[i].want);
  }
  char small[2][KC_ARCH_MAX + 1];
  assert_int_equal(kc_gpu_compat_archs(8, 9, 87, 12080, small, 2), 2);
  assert_string_equal(small[1], "sm_87");
}

/* The driver's version without cuInit: what kc_gpu_detect says, or
 * KC_NO_DRIVER (and 0) where there is none. */
static void test_driver_version(void **state) {
  (void)state;
  kc_gpu_info gi;
  char err[KC_ERRBUF_SIZE] = "";
  int v = -1;
  kc_err e = kc_gpu_driver_version(&v, err);
  if (kc_gpu_detect(&gi, NULL) == KC_OK) {
    assert_int_equal(e, KC_OK);
    assert_int_equal(v, gi.driver_version);
    return;
  }
  if (e == KC_OK) { /* a driver without a usable device */
    assert_true(v >= 9000);
    return;
  }
  assert_int_equal(e, KC_NO_DRIVER);
  assert_int_equal(v, 0);
  assert_true(err[0] != '\0');
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--stub-driver") == 0) {
    const struct CMUnitTest stub[] = {cmocka_unit_test(test_stub_driver)};
    return cmocka_run_group_tests_name("gpu_stub_driver", stub, NULL, NULL);
  }
  if (argc > 1 && strcmp(argv[1], "--fake-driver") == 0) {
    if (!getenv("KCACHE_LIBCUDA")) {
      fprintf(stderr, "--fake-driver: set KCACHE_LIBCUDA\n");
      return 2;
    }
    const struct CMUnitTest fake[] = {
        cmocka_unit_test(test_fake_detect),
        cmocka_unit_test(test_fake_load_check),
        cmocka_unit_test(test_fake_forced_missing)};
    return cmocka_run_group_tests_name("gpu_fake_driver", fake, NULL, NULL);
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_arch_runs_on),
      cmocka_unit_test(test_arch_invalid),
      cmocka_unit_test(test_native_arch),
      cmocka_unit_test(test_ptx_entries),
      cmocka_unit_test(test_cubin_entries_robust),
      cmocka_unit_test(test_nvrtc_version),
      cmocka_unit_test(test_build_cubin_sm80),
      cmocka_unit_test(test_build_cubin_sm90a),
      cmocka_unit_test(test_build_ptx),
      cmocka_unit_test(test_bucket_define),
      cmocka_unit_test(test_multi_dim_bucket),
      cmocka_unit_test(test_compile_error),
      cmocka_unit_test(test_missing_entry),
      cmocka_unit_test(test_user_options),
      cmocka_unit_test(test_bad_requests),
      cmocka_unit_test(test_timeout),
      cmocka_unit_test(test_parallel_builds),
      cmocka_unit_test_setup_teardown(test_nvrtc_forced_missing, env_setup,
                                      env_teardown),
      cmocka_unit_test_setup_teardown(test_nvrtc_crash, env_setup,
                                      env_teardown),
      cmocka_unit_test_setup_teardown(test_nvrtc_version_cached, env_setup,
                                      env_teardown),
      cmocka_unit_test_setup_teardown(test_nvrtc_version_from_name, env_setup,
                                      env_teardown),
      cmocka_unit_test_setup_teardown(test_nvrtc_meta_version_json, env_setup,
                                      env_teardown),
      cmocka_unit_test_setup_teardown(test_nvrtc_meta_dist_info, env_setup,
                                      env_teardown),
      cmocka_unit_test_setup_teardown(test_nvrtc_meta_fallback, env_setup,
                                      env_teardown),
      cmocka_unit_test_setup_teardown(test_nvrtc_wheel_env, env_setup,
                                      env_teardown),
      cmocka_unit_test_setup_teardown(test_nvrtc_too_old, env_setup,
                                      env_teardown),
      cmocka_unit_test_setup_teardown(test_nvrtc_builtins_beside, env_setup,
                                      env_teardown),
      cmocka_unit_test_setup_teardown(test_nvrtc_cuda_home, env_setup,
                                      env_teardown),
      cmocka_unit_test(test_detect),
      cmocka_unit_test(test_load_check_no_driver),
      cmocka_unit_test(test_load_check_gpu),
      cmocka_unit_test(test_compat_table),
      cmocka_unit_test(test_ptx_isa),
      cmocka_unit_test(test_cc_parse),
      cmocka_unit_test(test_compat_order),
      cmocka_unit_test(test_driver_version),
  };
  return cmocka_run_group_tests_name("gpu", tests, NULL, NULL);
}
