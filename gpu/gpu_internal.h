/* gpu_internal.h: what the files of gpu/ share and nobody else sees: the
 * hand-declared slices of the CUDA driver and NVRTC APIs (nothing includes
 * cuda.h or nvrtc.h, so kcache builds on hosts without the toolkit), the
 * loaders that fill them with dlopen/dlsym, and the in-process NVRTC compile
 * that kc_gpu_build runs inside its child.
 */
#ifndef KC_GPU_INTERNAL_H
#define KC_GPU_INTERNAL_H

#include <stddef.h>

#include "kc_gpu.h"

/* ---- dlsym into typed function pointers ---- */

/* A symbol to resolve: its name, where the pointer goes, and whether its
 * absence is fatal. The slot is a function-pointer field seen as bytes:
 * kcg_load_syms memcpy's dlsym's void * into it, which is the defined way
 * (POSIX guarantees both have the same representation) and keeps -Wpedantic
 * and strict aliasing quiet. */
typedef struct kcg_sym {
  const char *name;
  void *slot;
  int optional;
} kcg_sym;

/* Resolves every symbol of the table; returns the name of the first required
 * one that is missing, or NULL when all are there. */
const char *kcg_load_syms(void *lib, const kcg_sym *syms, size_t n);

/* ---- NVRTC (declared from nvrtc.h, CUDA 11.1 and later) ---- */

typedef int nvrtcResult; /* NVRTC_SUCCESS = 0 */
typedef struct _nvrtcProgram *nvrtcProgram;
#define KCG_NVRTC_SUCCESS 0
#define KCG_NVRTC_ERROR_COMPILATION 6 /* the source does not compile */

typedef struct kcg_nvrtc {
  void *lib;
  char path[512]; /* the file that was loaded, for logs */
  nvrtcResult (*Version)(int *major, int *minor);
  const char *(*GetErrorString)(nvrtcResult r);
  nvrtcResult (*CreateProgram)(nvrtcProgram *prog, const char *src,
                               const char *name, int n_headers,
                               const char *const *headers,
                               const char *const *include_names);
  nvrtcResult (*CompileProgram)(nvrtcProgram prog, int n_options,
                                const char *const *options);
  nvrtcResult (*DestroyProgram)(nvrtcProgram *prog);
  nvrtcResult (*GetProgramLogSize)(nvrtcProgram prog, size_t *size);
  nvrtcResult (*GetProgramLog)(nvrtcProgram prog, char *log);
  nvrtcResult (*GetCUBINSize)(nvrtcProgram prog, size_t *size);
  nvrtcResult (*GetCUBIN)(nvrtcProgram prog, char *cubin);
  nvrtcResult (*GetPTXSize)(nvrtcProgram prog, size_t *size);
  nvrtcResult (*GetPTX)(nvrtcProgram prog, char *ptx);
} kcg_nvrtc;

/* Finds and loads NVRTC (order in kc_gpu.h). KC_NO_NVRTC names every path
 * tried; a $KCACHE_NVRTC that does not load is an error, never a silent
 * fallback to another NVRTC (it would build with a toolchain the key does
 * not name). */
kc_err kcg_nvrtc_open(kcg_nvrtc *api, char *err);
void kcg_nvrtc_close(kcg_nvrtc *api);

/* NVRTC's MAJOR.MINOR ("13.0") from NVIDIA's install metadata describing the
 * library file at real (symlinks resolved): a toolkit's version.json or a
 * wheel's nvidia_cuda_nvrtc*.dist-info, found only at the few places
 * nvrtc_meta.c names. Nothing is loaded. 0, or -1 when none applies. */
int kcg_nvrtc_meta_version(const char *real, char out[16]);

/* KC_EINVAL for a request kc_gpu_build cannot run (checked before forking). */
kc_err kcg_build_req_check(const kc_gpu_build_req *req, char *err);

/* The whole compile, in the calling process: options, NVRTC, log, code, and
 * the entry check. Fills out like kc_gpu_build (out->seconds excepted).
 * kc_gpu_build runs it in a child; it is exposed for that child only. */
kc_err kcg_nvrtc_compile(const kc_gpu_build_req *req, kc_gpu_build_out *out,
                         char *err);

/* ---- Output inspection (code.c) ---- */

/* 1 if a cubin (ELF symbol table) or PTX text defines a kernel `name`. */
int kcg_code_has_entry(kc_file_kind kind, const void *code, size_t len,
                       const char *name);

/* ---- Arch (arch.c) ---- */

/* The native cubin target of a compute capability (see kc_gpu_device.arch);
 * 0 on success, -1 if the capability is out of range. */
int kcg_native_arch(int cc_major, int cc_minor, char out[KC_ARCH_MAX + 1]);

#endif
