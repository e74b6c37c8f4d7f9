/* gpu_fake_nvrtc.c: a stand-in libnvrtc for tests/test_gpu.c, loaded through
 * $KCACHE_NVRTC or $CUDA_HOME/lib64/libnvrtc.so. It reports version 99.9 (so
 * a test can tell which NVRTC was loaded) and aborts inside
 * nvrtcCompileProgram, the way a crashing compiler would. Built without
 * nvrtcGetCUBIN (-DFAKE_NO_CUBIN) it is an NVRTC too old to use. Built with
 * -DFAKE_NEEDS_BUILTINS it compiles the way NVIDIA's does: by dlopen'ing
 * libnvrtc-builtins.so.99.9 by its soname, failing with NVRTC's own error
 * when the loader cannot find it (as a PyPI wheel's NVRTC does when its
 * directory is not on the loader path). -DFAKE_BUILTINS_LIB builds that
 * builtins library. */
#include <stdlib.h>

#ifdef FAKE_BUILTINS_LIB
int fake_nvrtc_builtins(void) { return 99; }
#else
#include <dlfcn.h>
#include <string.h>

typedef int nvrtcResult;
typedef struct fake_program *nvrtcProgram;

static int fake_program_token;

nvrtcResult nvrtcVersion(int *major, int *minor) {
  *major = 99;
  *minor = 9;
  return 0;
}
const char *nvrtcGetErrorString(nvrtcResult r) {
  return r ? "FAKE_ERROR" : "FAKE_SUCCESS";
}
nvrtcResult nvrtcCreateProgram(nvrtcProgram *p, const char *src,
                               const char *name, int n, const char *const *h,
                               const char *const *hn) {
  (void)src, (void)name, (void)n, (void)h, (void)hn;
  *p = (nvrtcProgram)(void *)&fake_program_token;
  return 0;
}
static const char *fake_log = "";

nvrtcResult nvrtcCompileProgram(nvrtcProgram p, int n, const char *const *o) {
  (void)p, (void)n, (void)o;
#ifdef FAKE_NEEDS_BUILTINS
  if (!dlopen("libnvrtc-builtins.so.99.9", RTLD_NOW)) {
    fake_log = "nvrtc: error: failed to open libnvrtc-builtins.so.99.9.\n";
    return 7; /* NVRTC_ERROR_BUILTIN_OPERATION_FAILURE */
  }
  return 0;
#else
  abort(); /* SIGABRT: the sanitizers leave it alone, unlike SIGSEGV */
#endif
}
nvrtcResult nvrtcDestroyProgram(nvrtcProgram *p) {
  *p = NULL;
  return 0;
}
nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram p, size_t *n) {
  (void)p;
  *n = strlen(fake_log) + 1;
  return 0;
}
nvrtcResult nvrtcGetProgramLog(nvrtcProgram p, char *log) {
  (void)p;
  memcpy(log, fake_log, strlen(fake_log) + 1);
  return 0;
}
#ifndef FAKE_NO_CUBIN
nvrtcResult nvrtcGetCUBINSize(nvrtcProgram p, size_t *n) {
  (void)p;
  *n = 0;
  return 0;
}
nvrtcResult nvrtcGetCUBIN(nvrtcProgram p, char *c) {
  (void)p, (void)c;
  return 0;
}
#endif
nvrtcResult nvrtcGetPTXSize(nvrtcProgram p, size_t *n) {
  (void)p;
  *n = 1;
  return 0;
}
nvrtcResult nvrtcGetPTX(nvrtcProgram p, char *c) {
  (void)p;
  c[0] = '\0';
  return 0;
}
#endif
