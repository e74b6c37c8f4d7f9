/* gpu_fake_cuda.c: a stand-in libcuda.so.1 for `test_gpu --fake-driver`
 * (loaded through $KCACHE_LIBCUDA), so that gpu/cuda.c's paths past cuInit
 * run on hosts without a GPU: one device, "kcache fake GPU", compute
 * capability 9.0, driver 13.0. Modules are text: "fake-module ENTRY..." loads
 * (its entries resolve), anything else is CUDA_ERROR_NO_BINARY_FOR_GPU. Like
 * the real driver, a module needs a current context, and the primary context
 * is created when its first reference is retained and destroyed when its
 * last is released; fake_cuda_contexts_created() counts the creations.
 * The functions have cuda.h's ABI (CUDA 13.0). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct {
  unsigned char bytes[16];
} CUuuid;

enum {
  OK = 0,
  INVALID_VALUE = 1,
  NOT_INITIALIZED = 3,
  INVALID_DEVICE = 101,
  INVALID_CONTEXT = 201,
  NO_BINARY_FOR_GPU = 209,
  NOT_FOUND = 500,
};

struct CUctx_st {
  int device;
};
struct CUmod_st {
  char *text;
};

static struct CUctx_st primary = {0};
static int initialized, primary_refs, contexts_created;
static _Thread_local CUcontext current;

int fake_cuda_contexts_created(void) { return contexts_created; }
int fake_cuda_primary_refs(void) { return primary_refs; }

CUresult cuInit(unsigned flags) {
  if (flags)
    return INVALID_VALUE;
  initialized = 1;
  return OK;
}
CUresult cuDriverGetVersion(int *v) {
  *v = 13000;
  return OK;
}
CUresult cuDeviceGetCount(int *n) {
  if (!initialized)
    return NOT_INITIALIZED;
  *n = 1;
  return OK;
}
CUresult cuDeviceGet(CUdevice *d, int ordinal) {
  if (!initialized)
    return NOT_INITIALIZED;
  if (ordinal != 0)
    return INVALID_DEVICE;
  *d = 0;
  return OK;
}
CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
  if (d != 0 || len < 1)
    return INVALID_VALUE;
  strncpy(name, "kcache fake GPU", (size_t)len - 1);
  name[len - 1] = '\0';
  return OK;
}
CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
  if (d != 0)
    return INVALID_DEVICE;
  if (attr == 75) /* COMPUTE_CAPABILITY_MAJOR */
    *v = 9;
  else if (attr == 76) /* COMPUTE_CAPABILITY_MINOR */
    *v = 0;
  else
    return INVALID_VALUE;
  return OK;
}
CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) {
  if (d != 0)
    return INVALID_DEVICE;
  for (int i = 0; i < 16; i++)
    u->bytes[i] = (unsigned char)(0xa0 + i);
  return OK;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
  if (d != 0)
    return INVALID_DEVICE;
  *bytes = (size_t)80 << 30;
  return OK;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
  if (!initialized)
    return NOT_INITIALIZED;
  if (d != 0)
    return INVALID_DEVICE;
  if (primary_refs++ == 0)
    contexts_created++;
  *c = &primary;
  return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  if (d != 0 || primary_refs == 0)
    return INVALID_CONTEXT;
  primary_refs--;
  return OK;
}
CUresult cuCtxGetCurrent(CUcontext *c) {
  *c = current;
  return OK;
}
CUresult cuCtxSetCurrent(CUcontext c) {
  if (c && primary_refs == 0) /* destroyed */
    return INVALID_CONTEXT;
  current = c;
  return OK;
}
CUresult cuModuleLoadData(CUmodule *m, const void *image) {
  if (!current || primary_refs == 0)
    return INVALID_CONTEXT;
  if (strncmp(image, "fake-module ", 12) != 0)
    return NO_BINARY_FOR_GPU;
  if (!(*m = malloc(sizeof **m)) || !((*m)->text = strdup(image))) {
    free(*m);
    return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
  }
  return OK;
}
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
  size_t n = strlen(name);
  for (const char *p = m->text + 12; (p = strstr(p, name)); p += n)
    if (p[-1] == ' ' && (p[n] == ' ' || p[n] == '\0')) {
      *f = (CUfunction)(void *)m;
      return OK;
    }
  return NOT_FOUND;
}
CUresult cuModuleUnload(CUmodule m) {
  free(m->text);
  free(m);
  return OK;
}

static const struct {
  CUresult r;
  const char *name, *text;
} errors[] = {
    {OK, "CUDA_SUCCESS", "no error"},
    {INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU",
     "no kernel image is available for execution on the device"},
    {NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
};

static CUresult describe(CUresult r, const char **s, int text) {
  for (size_t i = 0; i < sizeof errors / sizeof *errors; i++)
    if (errors[i].r == r) {
      *s = text ? errors[i].text : errors[i].name;
      return OK;
    }
  *s = NULL;
  return INVALID_VALUE;
}
CUresult cuGetErrorName(CUresult r, const char **s) {
  return describe(r, s, 0);
}
CUresult cuGetErrorString(CUresult r, const char **s) {
  return describe(r, s, 1);
}
