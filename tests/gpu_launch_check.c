/* gpu_launch_check.c: compat on real silicon, for scripts/gpu-check.sh.
 * Builds tests/kernels/saxpy.cu with NVRTC for a list of targets, loads each
 * on GPU 0 with kc_gpu_load_check, compares the driver's answer with
 * kc_gpu_arch_runs_on, and launches saxpy from every module that loaded,
 * checking y = a * x + y element by element. Also checks, with no GPU, that
 * the rules refuse an arch-specific cubin (sm_90a) on every other
 * capability.
 *
 * usage: gpu_launch_check [KERNELS_DIR]   (default: the source tree's)
 * Prints lines "ROW\t<name>\t<PASS|FAIL|SKIP>\t<detail>" (the table rows)
 * and details on stderr. Exit 0 when no row failed, 1 otherwise, 2 usage.
 * The launch binds its own few driver calls (CUDA 13 cuda.h ABI); the
 * library binds only what kcache needs. */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.h"

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr;

typedef struct drv {
  CUresult (*Init)(unsigned);
  CUresult (*DeviceGet)(CUdevice *, int);
  CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*ModuleLoadData)(CUmodule *, const void *);
  CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*ModuleUnload)(CUmodule);
  CUresult (*MemAlloc)(CUdeviceptr *, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
  CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                           unsigned, unsigned, unsigned, CUstream, void **,
                           void **);
  CUresult (*CtxSynchronize)(void);
  CUresult (*GetErrorName)(CUresult, const char **);
} drv;

static int rows_failed;

static void row(const char *name, const char *status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void row(const char *name, const char *status, const char *fmt, ...) {
  va_list ap;
  printf("ROW\t%s\t%s\t", name, status);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
  fflush(stdout);
  rows_failed |= strcmp(status, "FAIL") == 0;
}

/* The driver kc_gpu_detect loaded (RTLD_NOLOAD finds it by soname), else
 * the one $KCACHE_LIBCUDA names. */
static int drv_open(drv *d, char *err, size_t cap) {
  const char *forced = getenv("KCACHE_LIBCUDA");
  void *lib = forced && *forced
                  ? dlopen(forced, RTLD_NOW | RTLD_NOLOAD)
                  : dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!lib) {
    snprintf(err, cap, "libcuda is not loaded");
    return -1;
  }
  const kcg_sym syms[] = {
      {"cuInit", &d->Init, 0},
      {"cuDeviceGet", &d->DeviceGet, 0},
      {"cuDevicePrimaryCtxRetain", &d->PrimaryCtxRetain, 0},
      {"cuCtxSetCurrent", &d->CtxSetCurrent, 0},
      {"cuModuleLoadData", &d->ModuleLoadData, 0},
      {"cuModuleGetFunction", &d->ModuleGetFunction, 0},
      {"cuModuleUnload", &d->ModuleUnload, 0},
      {"cuMemAlloc_v2", &d->MemAlloc, 0},
      {"cuMemFree_v2", &d->MemFree, 0},
      {"cuMemcpyHtoD_v2", &d->MemcpyHtoD, 0},
      {"cuMemcpyDtoH_v2", &d->MemcpyDtoH, 0},
      {"cuLaunchKernel", &d->LaunchKernel, 0},
      {"cuCtxSynchronize", &d->CtxSynchronize, 0},
      {"cuGetErrorName", &d->GetErrorName, 0},
  };
  const char *missing = kcg_load_syms(lib, syms, sizeof syms / sizeof *syms);
  if (missing) {
    snprintf(err, cap, "libcuda lacks %s", missing);
    return -1;
  }
  return 0;
}

static const char *cu_name(const drv *d, CUresult r) {
  const char *s = NULL;
  return d->GetErrorName(r, &s) == 0 && s ? s : "CUDA error";
}

#define N_ELEMS 4099 /* not a multiple of the block: the tail is checked */
#define BATCH 4

/* Launches saxpy (2 * x + y) from the module; 0 when every element is
 * right. */
static int launch_saxpy(const drv *d, const void *image, char *why,
                        size_t cap) {
  CUmodule mod = NULL;
  CUfunction fn;
  CUdeviceptr dx = 0, dy = 0;
  static float x[N_ELEMS], y[N_ELEMS], out[N_ELEMS];
  int n = N_ELEMS, bad = -1;
  float a = 2.0f;
  for (int i = 0; i < n; i++) {
    x[i] = (float)(i % 1000);
    y[i] = (float)(i % 7) - 3.0f;
  }
  CUresult r;
  const char *step = "cuModuleLoadData";
  if ((r = d->ModuleLoadData(&mod, image)) ||
      (step = "cuModuleGetFunction",
       r = d->ModuleGetFunction(&fn, mod, "saxpy")) ||
      (step = "cuMemAlloc", r = d->MemAlloc(&dx, sizeof x)) ||
      (r = d->MemAlloc(&dy, sizeof y)) ||
      (step = "cuMemcpyHtoD", r = d->MemcpyHtoD(dx, x, sizeof x)) ||
      (r = d->MemcpyHtoD(dy, y, sizeof y))) {
    snprintf(why, cap, "%s: %s", step, cu_name(d, r));
    goto out;
  }
  void *args[] = {&a, &dx, &dy, &n};
  unsigned threads = 128,
           blocks = (unsigned)((n + BATCH * 128 - 1) / (BATCH * 128));
  step = "cuLaunchKernel";
  if ((r = d->LaunchKernel(fn, blocks, 1, 1, threads, 1, 1, 0, NULL, args,
                           NULL)) ||
      (step = "cuCtxSynchronize", r = d->CtxSynchronize()) ||
      (step = "cuMemcpyDtoH", r = d->MemcpyDtoH(out, dy, sizeof out))) {
    snprintf(why, cap, "%s: %s", step, cu_name(d, r));
    goto out;
  }
  bad = 0;
  for (int i = 0; i < n; i++)
    if (out[i] != a * x[i] + y[i]) {
      snprintf(why, cap, "y[%d] = %g, want %g", i, out[i], a * x[i] + y[i]);
      bad = -1;
      break;
    }
out:
  if (dx)
    d->MemFree(dx);
  if (dy)
    d->MemFree(dy);
  if (mod)
    d->ModuleUnload(mod);
  return bad;
}

/* ---- Rules (no GPU) ---- */

static void rules_row(void) {
  static const int caps[][2] = {{5, 0},  {5, 2},  {6, 0},  {6, 1},  {7, 0},
                                {7, 5},  {8, 0},  {8, 6},  {8, 7},  {8, 9},
                                {9, 0},  {10, 0}, {10, 1}, {10, 3}, {11, 0},
                                {12, 0}, {12, 1}};
  size_t n = sizeof caps / sizeof *caps, runs = 0, wrong = 0;
  char where[64] = "";
  for (size_t i = 0; i < n; i++) {
    int r = kc_gpu_arch_runs_on("sm_90a", caps[i][0], caps[i][1]);
    runs += r;
    if (r != (caps[i][0] == 9 && caps[i][1] == 0))
      wrong++;
    if (r)
      snprintf(where + strlen(where), sizeof where - strlen(where), "%s%d.%d",
               where[0] ? " " : "", caps[i][0], caps[i][1]);
  }
  int sm80_on_90 = kc_gpu_arch_runs_on("sm_80", 9, 0);
  int ptx80_on_90 = kc_gpu_arch_runs_on("compute_80", 9, 0);
  row("compat rules: sm_90a only on 9.0",
      !wrong && !sm80_on_90 && ptx80_on_90 ? "PASS" : "FAIL",
      "kc_gpu_arch_runs_on(sm_90a) is true on %zu of %zu capabilities (%s); "
      "sm_80 cubin on 9.0: %d; compute_80 PTX on 9.0: %d",
      runs, n, where[0] ? where : "none", sm80_on_90, ptx80_on_90);
}

/* ---- On the GPU ---- */

typedef struct result {
  const char *arch;
  int rules, loaded, ran;
  char why[KC_ERRBUF_SIZE];
} result;

static char *read_kernel(const char *dir) {
  char path[1024], err[KC_ERRBUF_SIZE], *src = NULL;
  size_t len = 0;
  snprintf(path, sizeof path, "%s/saxpy.cu", dir);
  if (kc_read_file(path, &src, &len, err) != KC_OK) {
    fprintf(stderr, "gpu_launch_check: %s\n", err);
    return NULL;
  }
  return src;
}

static void one_arch(const drv *d, const kc_gpu_device *dev, const char *src,
                     result *res) {
  kc_bucket b = {.n = 1};
  snprintf(b.dims[0].name, sizeof b.dims[0].name, "batch");
  b.dims[0].value = BATCH;
  const char *const entries[] = {"saxpy", "scale"};
  kc_gpu_build_req req = {.name = "saxpy.cu",
                          .source = src,
                          .arch = res->arch,
                          .bucket = &b,
                          .entries = entries,
                          .n_entries = 2,
                          .timeout_s = 120};
  kc_gpu_build_out out;
  res->rules = kc_gpu_arch_runs_on(res->arch, dev->cc_major, dev->cc_minor);
  kc_err e = kc_gpu_build(&req, &out, res->why);
  if (e == KC_OK) {
    e = kc_gpu_load_check(dev->ordinal, out.code, out.code_len, entries, 2,
                          res->why);
    res->loaded = e == KC_OK;
    if (res->loaded)
      res->ran = launch_saxpy(d, out.code, res->why, sizeof res->why) == 0;
  } else {
    res->loaded = -1; /* not built */
  }
  fprintf(stderr, "  %-12s rules %d, %s%s%s\n", res->arch, res->rules,
          res->loaded < 0 ? "build failed"
          : res->loaded   ? "loaded"
                          : "refused",
          res->loaded > 0 ? (res->ran ? ", ran correctly" : ", RUN FAILED")
                          : "",
          res->why[0] ? res->why : "");
  kc_gpu_build_out_free(&out);
}

static const result *find(const result *r, size_t n, const char *arch) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(r[i].arch, arch))
      return &r[i];
  return NULL;
}

static void append(char *buf, size_t cap, const char *s) {
  size_t used = strlen(buf);
  snprintf(buf + used, cap - used, "%s%s", used ? " " : "", s);
}

static void gpu_rows(const drv *d, const kc_gpu_device *dev, const char *src) {
  static const char *const archs[] = {
      "native",     "sm_75",      "sm_80",       "sm_86",       "sm_89",
      "sm_90",      "sm_90a",     "sm_100a",     "sm_120a",     "compute_75",
      "compute_80", "compute_90", "compute_90a", "compute_100a"};
  enum { N = sizeof archs / sizeof *archs };
  result res[N];
  memset(res, 0, sizeof res);
  size_t n = 0;
  for (size_t i = 0; i < N; i++) {
    const char *a = strcmp(archs[i], "native") ? archs[i] : dev->arch;
    if (i > 0 && !strcmp(a, dev->arch))
      continue; /* the native arch is tried first, once */
    res[n].arch = a;
    one_arch(d, dev, src, &res[n++]);
  }
  char loads[512] = "", refuses[512] = "", disagree[512] = "", ran[512] = "",
       runfail[1024] = "", unbuilt[512] = "";
  for (size_t i = 0; i < n; i++) {
    const result *r = &res[i];
    if (r->loaded < 0) {
      append(unbuilt, sizeof unbuilt, r->arch);
      continue;
    }
    append(r->loaded ? loads : refuses, sizeof loads, r->arch);
    if (r->loaded != r->rules)
      append(disagree, sizeof disagree, r->arch);
    if (r->loaded && r->ran)
      append(ran, sizeof ran, r->arch);
    else if (r->loaded) {
      char one[KC_ERRBUF_SIZE + 80];
      snprintf(one, sizeof one, "%s (%s)", r->arch, r->why);
      append(runfail, sizeof runfail, one);
    }
  }
  row("compat: driver vs kc_gpu_arch_runs_on",
      disagree[0] || unbuilt[0] ? "FAIL" : "PASS",
      "%s (%d.%d): loads %s; refuses %s%s%s%s%s", dev->name, dev->cc_major,
      dev->cc_minor, loads[0] ? loads : "none", refuses[0] ? refuses : "none",
      disagree[0] ? "; DISAGREE: " : "", disagree,
      unbuilt[0] ? "; NOT BUILT: " : "", unbuilt);
  row("compat: loaded code runs (saxpy, 4099 floats)",
      runfail[0] || !ran[0] ? "FAIL" : "PASS", "correct from %s%s%s",
      ran[0] ? ran : "none", runfail[0] ? "; FAILED: " : "", runfail);
  const result *s80 = find(res, n, "sm_80"), *p80 = find(res, n, "compute_80"),
               *s90a = find(res, n, "sm_90a"), *s100a = find(res, n, "sm_100a");
  if (dev->cc_major == 9 && dev->cc_minor == 0 && s80 && p80 && s90a && s100a) {
    int ok = s80->loaded == 0 && p80->loaded == 1 && p80->ran &&
             s90a->loaded == 1 && s90a->ran && s100a->loaded == 0;
    row("compat: sm_80 and sm_90a on a 9.0 GPU", ok ? "PASS" : "FAIL",
        "sm_80 cubin %s%s%s; compute_80 PTX %s; sm_90a cubin %s; sm_100a "
        "cubin (arch-specific for 10.0) %s%s%s",
        s80->loaded ? "LOADED" : "refused by the driver",
        s80->loaded ? "" : ": ", s80->loaded ? "" : s80->why,
        p80->ran ? "JIT-compiled and ran" : "FAILED",
        s90a->ran ? "loaded and ran" : "FAILED",
        s100a->loaded ? "LOADED" : "refused by the driver",
        s100a->loaded ? "" : ": ", s100a->loaded ? "" : s100a->why);
  } else {
    row("compat: sm_80 and sm_90a on a 9.0 GPU", "SKIP",
        "the GPU is %d.%d, not 9.0 (the rows above still compare every "
        "target with the rules)",
        dev->cc_major, dev->cc_minor);
  }
}

int main(int argc, char **argv) {
  if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
    fprintf(stderr, "usage: gpu_launch_check [KERNELS_DIR]\n");
    return 2;
  }
  const char *dir = argc == 2 ? argv[1] : KC_GPU_KERNELS;
  rules_row();
  kc_gpu_info info;
  char err[KC_ERRBUF_SIZE] = "", v[16];
  if (kc_gpu_detect(&info, err) != KC_OK) {
    row("compat: driver vs kc_gpu_arch_runs_on", "SKIP", "no GPU: %s", err);
    return rows_failed;
  }
  const kc_gpu_device *dev = &info.devices[0];
  fprintf(stderr, "gpu_launch_check: GPU 0: %s, %d.%d (%s), driver %d\n",
          dev->name, dev->cc_major, dev->cc_minor, dev->arch,
          info.driver_version);
  if (kc_gpu_nvrtc_version(v, err) != KC_OK) {
    row("compat: driver vs kc_gpu_arch_runs_on", "FAIL",
        "a GPU but no NVRTC: %s", err);
    return 1;
  }
  drv d;
  char *src = read_kernel(dir);
  if (!src || drv_open(&d, err, sizeof err) != 0) {
    row("compat: driver vs kc_gpu_arch_runs_on", "FAIL", "%s",
        src ? err : "saxpy.cu not found");
    free(src);
    return 1;
  }
  fprintf(stderr, "gpu_launch_check: NVRTC %s\n", v);
  CUdevice cd;
  CUcontext ctx;
  CUresult r;
  if ((r = d.Init(0)) || (r = d.DeviceGet(&cd, dev->ordinal)) ||
      (r = d.PrimaryCtxRetain(&ctx, cd)) || (r = d.CtxSetCurrent(ctx))) {
    row("compat: driver vs kc_gpu_arch_runs_on", "FAIL",
        "no context on GPU 0: %s", cu_name(&d, r));
    free(src);
    return 1;
  }
  gpu_rows(&d, dev, src);
  free(src);
  return rows_failed;
}
