/* kc_gpu.h: the GPU side of kcache, all through dlopen so that nothing needs
 * the CUDA toolkit or a driver to build or run: device detection (libcuda),
 * the NVRTC builder (libnvrtc), the load check, and arch compatibility rules.
 *
 * Threads: kc_gpu_detect, kc_gpu_arch_runs_on and kc_gpu_nvrtc_* are
 * reentrant. kc_gpu_build forks a child per build (a hung or crashing NVRTC
 * cannot take the caller down) and may be called from several threads.
 * Errors: kc_err plus a sentence in err (KC_ERRBUF_SIZE, may be NULL).
 */
#ifndef KC_GPU_H
#define KC_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "kc_error.h"
#include "kc_schema.h"

/* ---- Devices (libcuda.so.1) ---- */

typedef struct kc_gpu_device {
  int ordinal;
  char name[256];
  int cc_major, cc_minor;     /* compute capability */
  char arch[KC_ARCH_MAX + 1]; /* native cubin target: "sm_90a" for 9.0,
                                 "sm_100a" for 10.0, else "sm_86" ... */
  char uuid[41];              /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx":
                                 40 characters and the NUL */
  uint64_t total_mem;
} kc_gpu_device;

typedef struct kc_gpu_info {
  int driver_version; /* cuDriverGetVersion: 13000 = 13.0 */
  int n_devices;
  kc_gpu_device devices[16];
} kc_gpu_info;

/* Loads libcuda.so.1 with dlopen: $KCACHE_LIBCUDA (a path) alone when set,
 * else the loader path, then /usr/local/nvidia/lib64,
 * /usr/lib/{x86_64,aarch64}-linux-gnu, /usr/lib64 and /usr/lib/wsl/lib. No
 * driver, or no device: KC_NO_DRIVER with a sentence saying what was
 * searched; never a crash. */
kc_err kc_gpu_detect(kc_gpu_info *out, char *err);
/* The driver's version alone (cuDriverGetVersion: 13000 = 13.0), without
 * cuInit: cheap, and no device is touched. KC_NO_DRIVER without one. */
kc_err kc_gpu_driver_version(int *out, char *err);

/* ---- Arch compatibility ---- */

/* 1 if code built for arch (a cubin "sm_XY[af]" or PTX "compute_XY[af]") can
 * run on a device of compute capability major.minor, 0 if not. Rules: sm_XY
 * runs on X.Y' with the same major and Y' >= Y; sm_XYa only on exactly X.Y;
 * sm_XYf on the same major family with minor >= Y; compute_XY (PTX) on any
 * capability >= X.Y (JIT); compute_XYa only on X.Y; compute_XYf within the
 * family. */
int kc_gpu_arch_runs_on(const char *arch, int cc_major, int cc_minor);

/* A device's compute capability from "sm_89", "sm_90a", "compute_80" (the
 * suffix is ignored) or "8.9". 0, or -1 when s is neither. */
int kc_gpu_cc_parse(const char *s, int *major, int *minor);

/* PTX ISA versions, as 10 * major + minor (PTX ISA 8.7 -> 87), from NVIDIA's
 * table (PTX ISA manual, "Release History"):
 *  - written: what a toolkit of version cuda ("12.8", as NVRTC reports it)
 *    writes; 0 when the version is unknown (newer than the table: its PTX
 *    may be newer than any driver the table knows);
 *  - read: the newest a driver of driver_version (cuDriverGetVersion:
 *    12080 = 12.8) JIT-compiles; a driver newer than the table reads at
 *    least the table's newest; 0 below CUDA 9.0. */
int kc_gpu_ptx_isa_written(const char *cuda);
int kc_gpu_ptx_isa_read(int driver_version);

/* 1 when code for arch can serve a device of cc_major.cc_minor:
 * kc_gpu_arch_runs_on, and for PTX (compute_*) also a known ISA (ptx_isa,
 * as above) that the driver (driver_version) reads. A cubin ignores the last
 * two. */
int kc_gpu_arch_usable(const char *arch, int cc_major, int cc_minor,
                       int ptx_isa, int driver_version);

/* The targets that can serve the device, best first, into out (at most max;
 * the count is returned): cubins of the same major, the highest minor not
 * above the device's first ("a", then "f", then plain at each), then PTX,
 * the newest target first, when kc_gpu_arch_usable allows it (ptx_isa 0: no
 * PTX). Drawn from the targets NVIDIA has: sm_50..sm_121 and their a/f
 * variants (arch.c). */
size_t kc_gpu_compat_archs(int cc_major, int cc_minor, int ptx_isa,
                           int driver_version, char (*out)[KC_ARCH_MAX + 1],
                           size_t max);

/* ---- NVRTC ---- */

/* NVRTC's version ("13.0") via dlopen. Search order: $KCACHE_NVRTC, then
 * $CUDA_HOME/lib64, /usr/local/cuda/lib64, then PyPI's nvidia-cuda-nvrtc in
 * $VIRTUAL_ENV or $CONDA_PREFIX (lib/python3.N/site-packages/nvidia/cu13/lib
 * or nvidia/cuda_nvrtc/lib), then the loader path. A library loaded by path
 * gets the libnvrtc-builtins beside it preloaded (NVRTC opens them by
 * soname). KC_NO_NVRTC names every place searched. out must hold 16
 * bytes. */
kc_err kc_gpu_nvrtc_version(char out[16], char *err);
/* The same without loading a 100 MB library when it can (about 40 ms of
 * every warmup that builds nothing), for computing keys. The file the search
 * tries first ($KCACHE_NVRTC, else $CUDA_HOME/lib64, /usr/local/cuda/lib64
 * or an environment's wheel; symlinks resolved) is asked, in this order:
 *  1. its name, when NVIDIA named it libnvrtc.so.MAJOR.MINOR.PATCH;
 *  2. the answer remembered in cache_file (NULL: none) under that file's
 *     identity (path, device, inode, size, mtime);
 *  3. NVIDIA's install metadata about it (nvrtc_meta.c): the toolkit's
 *     version.json, or a nvidia_cuda_nvrtc*.dist-info whose RECORD lists the
 *     file, next to its lib/ directory;
 *  4. else NVRTC is loaded and asked (and the answer remembered; a write
 *     failure is ignored).
 * Only MAJOR.MINOR is answered, as kc_gpu_nvrtc_version does. The answer is
 * for keys only: a build always asks the NVRTC it loads
 * (kc_gpu_nvrtc_version) and refuses a key naming another version, so a
 * library replaced by hand under stale metadata fails its builds instead of
 * storing them under a wrong key. */
kc_err kc_gpu_nvrtc_version_cached(const char *cache_file, char out[16],
                                   char *err);

typedef struct kc_gpu_build_req {
  const char *name;   /* program name, for the log ("gemm.cu") */
  const char *source; /* CUDA C source text */
  const char *arch;   /* "sm_90a" -> cubin, "compute_90" -> PTX */
  const char *const *options;
  size_t n_options;        /* extra NVRTC options */
  const kc_bucket *bucket; /* passed as -D<NAME upper>=<value>; may be NULL */
  const char *const *entries;
  size_t n_entries; /* extern "C" kernel names;
  each must be in the output (ELF symbol table of
  the cubin, ".entry" of the PTX), else
  KC_BUILD_FAILED: no GPU needed to catch a typo */
  int timeout_s;    /* the child is killed after this; 0: 600 */
} kc_gpu_build_req;

typedef struct kc_gpu_build_out {
  void *code; /* cubin or PTX bytes (malloc'd) */
  size_t code_len;
  kc_file_kind kind; /* KC_KIND_CUBIN or KC_KIND_PTX */
  char *log;         /* NVRTC's log, malloc'd, may be "" */
  double seconds;
} kc_gpu_build_out;

/* Compiles in a child process. KC_BUILD_FAILED (log kept in out->log, the
 * log's first "error" line in err), KC_TIMEOUT, KC_NO_NVRTC, KC_EINVAL for a
 * bad request. NVRTC gets --gpu-architecture=<arch>, then -D<NAME>=<value> per
 * bucket dimension, then the user's options. PTX: code_len leaves out the
 * NUL, which the buffer still has. out->log is never NULL after the call
 * (short of memory). The caller frees with kc_gpu_build_out_free. */
kc_err kc_gpu_build(const kc_gpu_build_req *req, kc_gpu_build_out *out,
                    char *err);
void kc_gpu_build_out_free(kc_gpu_build_out *out);

/* ---- Load check ---- */

/* cuModuleLoadData on device `ordinal` (0 to 63) in its primary context,
 * then cuModuleGetFunction for each entry. The primary context is retained
 * on the first call and kept for the life of the process (creating it costs
 * a real GPU hundreds of ms; the driver frees it at exit). KC_NO_DRIVER without
 * a driver, KC_GPU with the CUDA error otherwise. Any thread; the calling
 * thread's current context is restored. PTX need not end with a NUL. */
kc_err kc_gpu_load_check(int ordinal, const void *code, size_t len,
                         const char *const *entries, size_t n_entries,
                         char *err);

#endif
