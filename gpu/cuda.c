/* cuda.c: the CUDA driver through dlopen("libcuda.so.1"): device detection
 * and the load check. Only the handful of driver calls kcache needs are
 * declared here, with the ABI of cuda.h (CUDA 11.4 and later drivers). */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>

#include "gpu_internal.h"

typedef int CUresult; /* CUDA_SUCCESS = 0 */
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUuuid {
  unsigned char bytes[16];
} CUuuid;

#define CU_SUCCESS 0
#define CU_ATTR_CC_MAJOR 75 /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
#define CU_ATTR_CC_MINOR 76 /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR */

/* The _v2 names are what cuda.h's macros resolve the plain names to. */
typedef struct cu_api {
  void *lib;
  CUresult (*Init)(unsigned flags);
  CUresult (*DriverGetVersion)(int *version);
  CUresult (*DeviceGetCount)(int *count);
  CUresult (*DeviceGet)(CUdevice *dev, int ordinal);
  CUresult (*DeviceGetName)(char *name, int len, CUdevice dev);
  CUresult (*DeviceGetAttribute)(int *value, int attr, CUdevice dev);
  CUresult (*DeviceGetUuid_v2)(CUuuid *uuid, CUdevice dev);
  CUresult (*DeviceGetUuid)(CUuuid *uuid, CUdevice dev);
  CUresult (*DeviceTotalMem)(size_t *bytes, CUdevice dev);
  CUresult (*PrimaryCtxRetain)(CUcontext *ctx, CUdevice dev);
  CUresult (*CtxGetCurrent)(CUcontext *ctx);
  CUresult (*CtxSetCurrent)(CUcontext ctx);
  CUresult (*ModuleLoadData)(CUmodule *mod, const void *image);
  CUresult (*ModuleGetFunction)(CUfunction *fn, CUmodule mod, const char *name);
  CUresult (*ModuleUnload)(CUmodule mod);
  CUresult (*GetErrorName)(CUresult r, const char **s);
  CUresult (*GetErrorString)(CUresult r, const char **s);
} cu_api;

/* Where the driver is looked for when $KCACHE_LIBCUDA does not name it:
 * the loader path first (LD_LIBRARY_PATH, ld.so.cache), then the places
 * drivers are installed that a container or a scrubbed environment often
 * leaves off it: the NVIDIA container runtime's /usr/local/nvidia/lib64,
 * the distributions' library directories, WSL's. Never the toolkit's
 * stubs/ directory: that libcuda only answers CUDA_ERROR_STUB_LIBRARY. */
static const char *const cuda_dirs[] = {
    "/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib/wsl/lib"};
#define N_CUDA_DIRS (sizeof cuda_dirs / sizeof *cuda_dirs)

/* RTLD_NODELETE: after cuInit the driver runs threads inside libcuda;
 * unmapping it on dlclose would pull the code out from under them. The
 * driver stays loaded for the life of the process, as in any CUDA program. */
#define CUDA_DLOPEN_FLAGS (RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)

/* dlopen of the driver; on failure, err says every place searched and the
 * loader's first complaint. */
static void *cu_dlopen(char *err) {
  const char *forced = getenv("KCACHE_LIBCUDA");
  if (forced && *forced) { /* that driver or none: no silent fallback */
    void *lib = dlopen(forced, CUDA_DLOPEN_FLAGS);
    const char *e = lib ? NULL : dlerror();
    if (!lib)
      kc_errf(err, KC_NO_DRIVER, "no CUDA driver (KCACHE_LIBCUDA=%s: %s)",
              forced, e ? e : "dlopen failed");
    return lib;
  }
  void *lib = dlopen("libcuda.so.1", CUDA_DLOPEN_FLAGS);
  if (lib)
    return lib;
  const char *e = dlerror();
  char first[300], path[300];
  snprintf(first, sizeof first, "%s", e ? e : "dlopen failed");
  for (size_t i = 0; i < N_CUDA_DIRS; i++) {
    snprintf(path, sizeof path, "%s/libcuda.so.1", cuda_dirs[i]);
    if (access(path, F_OK) == 0 && (lib = dlopen(path, CUDA_DLOPEN_FLAGS)))
      return lib;
  }
  char dirs[400] = "";
  for (size_t i = 0, used = 0; i < N_CUDA_DIRS; i++) {
    snprintf(dirs + used, sizeof dirs - used, "%s%s", i ? ", " : "",
             cuda_dirs[i]);
    used = strlen(dirs);
  }
  kc_errf(err, KC_NO_DRIVER,
          "no CUDA driver (libcuda.so.1 not on the loader "
          "path: %s; nor in %s; set KCACHE_LIBCUDA)",
          first, dirs);
  return NULL;
}

static kc_err cu_open(cu_api *api, char *err) {
  memset(api, 0, sizeof *api);
  api->lib = cu_dlopen(err);
  if (!api->lib)
    return KC_NO_DRIVER;
  const kcg_sym syms[] = {
      {"cuInit", &api->Init, 0},
      {"cuDriverGetVersion", &api->DriverGetVersion, 0},
      {"cuDeviceGetCount", &api->DeviceGetCount, 0},
      {"cuDeviceGet", &api->DeviceGet, 0},
      {"cuDeviceGetName", &api->DeviceGetName, 0},
      {"cuDeviceGetAttribute", &api->DeviceGetAttribute, 0},
      {"cuDeviceGetUuid_v2", &api->DeviceGetUuid_v2, 1},
      {"cuDeviceGetUuid", &api->DeviceGetUuid, 1},
      {"cuDeviceTotalMem_v2", &api->DeviceTotalMem, 0},
      {"cuDevicePrimaryCtxRetain", &api->PrimaryCtxRetain, 0},
      {"cuCtxGetCurrent", &api->CtxGetCurrent, 0},
      {"cuCtxSetCurrent", &api->CtxSetCurrent, 0},
      {"cuModuleLoadData", &api->ModuleLoadData, 0},
      {"cuModuleGetFunction", &api->ModuleGetFunction, 0},
      {"cuModuleUnload", &api->ModuleUnload, 0},
      {"cuGetErrorName", &api->GetErrorName, 0},
      {"cuGetErrorString", &api->GetErrorString, 0},
  };
  const char *missing =
      kcg_load_syms(api->lib, syms, sizeof syms / sizeof *syms);
  if (!missing && !api->DeviceGetUuid_v2 && !api->DeviceGetUuid)
    missing = "cuDeviceGetUuid"; /* one of the two is enough */
  if (!missing)
    return KC_OK;
  dlclose(api->lib);
  api->lib = NULL;
  return kc_errf(err, KC_NO_DRIVER,
                 "libcuda.so.1 lacks %s (driver older "
                 "than CUDA 11.4?)",
                 missing);
}

static void cu_close(cu_api *api) {
  if (api->lib)
    dlclose(api->lib);
  api->lib = NULL;
}

/* Errors met where the driver cannot name them itself: the toolkit's stub
 * libcuda (a common container mistake: it shadows the real driver on
 * LD_LIBRARY_PATH) answers cuGetErrorName with an error too. */
static const struct {
  CUresult code;
  const char *name, *text;
} cu_known[] = {
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {34, "CUDA_ERROR_STUB_LIBRARY",
     "the toolkit's stub libcuda was loaded instead of the driver"},
    {35, "CUDA_ERROR_INSUFFICIENT_DRIVER", "the driver is older than needed"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
};

/* "cuModuleLoadData: CUDA_ERROR_NO_BINARY_FOR_GPU (no kernel image is
 * available for execution on the device)" */
static kc_err cu_fail(const cu_api *api, kc_err code, const char *what,
                      CUresult r, char *err) {
  const char *name = NULL, *text = NULL;
  if (api->GetErrorName(r, &name) != CU_SUCCESS || !name ||
      api->GetErrorString(r, &text) != CU_SUCCESS || !text)
    for (size_t i = 0; i < sizeof cu_known / sizeof *cu_known; i++)
      if (cu_known[i].code == r) {
        name = cu_known[i].name;
        text = cu_known[i].text;
      }
  if (!name || !text)
    return kc_errf(err, code, "%s: CUDA error %d", what, r);
  return kc_errf(err, code, "%s: %s (%s)", what, name, text);
}

/* ---- Detection ---- */

static void format_uuid(const CUuuid *u, char out[41]) {
  const unsigned char *b = u->bytes;
  snprintf(out, 41,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
           "%02x%02x%02x%02x%02x%02x",
           b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10],
           b[11], b[12], b[13], b[14], b[15]);
}

static kc_err describe(const cu_api *api, int ordinal, kc_gpu_device *d,
                       char *err) {
  CUdevice dev;
  CUuuid uuid;
  size_t mem = 0;
  CUresult r;
  d->ordinal = ordinal;
  if ((r = api->DeviceGet(&dev, ordinal)) != CU_SUCCESS)
    return cu_fail(api, KC_GPU, "cuDeviceGet", r, err);
  if ((r = api->DeviceGetName(d->name, sizeof d->name, dev)) != CU_SUCCESS ||
      (r = api->DeviceGetAttribute(&d->cc_major, CU_ATTR_CC_MAJOR, dev)) ||
      (r = api->DeviceGetAttribute(&d->cc_minor, CU_ATTR_CC_MINOR, dev)))
    return cu_fail(api, KC_GPU, "cuDeviceGetName/Attribute", r, err);
  d->name[sizeof d->name - 1] = '\0';
  r = (api->DeviceGetUuid_v2 ? api->DeviceGetUuid_v2
                             : api->DeviceGetUuid)(&uuid, dev);
  if (r != CU_SUCCESS)
    return cu_fail(api, KC_GPU, "cuDeviceGetUuid", r, err);
  format_uuid(&uuid, d->uuid);
  if ((r = api->DeviceTotalMem(&mem, dev)) != CU_SUCCESS)
    return cu_fail(api, KC_GPU, "cuDeviceTotalMem", r, err);
  d->total_mem = mem;
  if (kcg_native_arch(d->cc_major, d->cc_minor, d->arch) != 0)
    return kc_errf(err, KC_GPU,
                   "device %d: compute capability %d.%d is out "
                   "of range",
                   ordinal, d->cc_major, d->cc_minor);
  return KC_OK;
}

static kc_err detect_all(const cu_api *api, kc_gpu_info *out, char *err) {
  CUresult r = api->Init(0);
  if (r != CU_SUCCESS) /* no device, the toolkit's stub, a broken install */
    return cu_fail(api, KC_NO_DRIVER, "no usable CUDA driver: cuInit", r, err);
  if ((r = api->DriverGetVersion(&out->driver_version)) != CU_SUCCESS)
    return cu_fail(api, KC_GPU, "cuDriverGetVersion", r, err);
  int count = 0;
  if ((r = api->DeviceGetCount(&count)) != CU_SUCCESS)
    return cu_fail(api, KC_GPU, "cuDeviceGetCount", r, err);
  if (count <= 0)
    return kc_errf(err, KC_NO_DRIVER,
                   "no CUDA device (driver %d.%d sees "
                   "none)",
                   out->driver_version / 1000, out->driver_version % 1000 / 10);
  int max = (int)(sizeof out->devices / sizeof out->devices[0]);
  for (int i = 0; i < count && i < max; i++) {
    kc_err rc = describe(api, i, &out->devices[i], err);
    if (rc != KC_OK)
      return rc;
    out->n_devices = i + 1;
  }
  return KC_OK;
}

kc_err kc_gpu_detect(kc_gpu_info *out, char *err) {
  if (!out)
    return kc_errf(err, KC_EINVAL, "kc_gpu_detect: out is NULL");
  memset(out, 0, sizeof *out);
  cu_api api;
  kc_err rc = cu_open(&api, err);
  if (rc != KC_OK)
    return rc;
  rc = detect_all(&api, out, err);
  cu_close(&api);
  if (rc != KC_OK)
    out->n_devices = 0;
  return rc;
}

kc_err kc_gpu_driver_version(int *out, char *err) {
  cu_api api;
  *out = 0;
  kc_err rc = cu_open(&api, err);
  if (rc != KC_OK)
    return rc;
  /* cuDriverGetVersion needs no cuInit: no device is touched */
  CUresult r = api.DriverGetVersion(out);
  if (r != CU_SUCCESS)
    rc = cu_fail(&api, KC_NO_DRIVER, "cuDriverGetVersion", r, err);
  cu_close(&api);
  return rc;
}

/* ---- Load check ---- */

/* cuModuleLoadData reads PTX up to its NUL, and a PTX file on disk has none:
 * text (not an ELF cubin, not a fatbin) without one gets a terminated copy. */
static const void *image_for_driver(const void *code, size_t len, void **copy) {
  const unsigned char *b = code;
  static const unsigned char fatbin[4] = {0x50, 0xed, 0x55, 0xba};
  *copy = NULL;
  if ((len >= 4 && (memcmp(b,
                           "\x7f"
                           "ELF",
                           4) == 0 ||
                    memcmp(b, fatbin, 4) == 0)) ||
      b[len - 1] == '\0')
    return code;
  if ((*copy = malloc(len + 1)) == NULL)
    return NULL;
  memcpy(*copy, code, len);
  ((char *)*copy)[len] = '\0';
  return *copy;
}

static kc_err load_entries(const cu_api *api, const void *image,
                           const char *const *entries, size_t n, char *err) {
  CUmodule mod = NULL;
  CUresult r = api->ModuleLoadData(&mod, image);
  if (r != CU_SUCCESS)
    return cu_fail(api, KC_GPU, "cuModuleLoadData", r, err);
  kc_err rc = KC_OK;
  for (size_t i = 0; i < n && rc == KC_OK; i++) {
    CUfunction fn;
    char what[300];
    if ((r = api->ModuleGetFunction(&fn, mod, entries[i])) != CU_SUCCESS) {
      snprintf(what, sizeof what, "entry '%.200s': cuModuleGetFunction",
               entries[i]);
      rc = cu_fail(api, KC_GPU, what, r, err);
    }
  }
  api->ModuleUnload(mod);
  return rc;
}

/* The primary context is the one the runtime API and every framework share.
 * It is retained once per device and kept for the life of the process:
 * releasing the last reference destroys it, and creating it again costs a
 * real GPU hundreds of milliseconds (`kcache verify` loads dozens of files
 * one by one). The driver frees it at exit, as in any CUDA program. */
#define KEPT_MAX 64
static pthread_mutex_t kept_mu = PTHREAD_MUTEX_INITIALIZER;
static CUcontext kept_ctx[KEPT_MAX];

/* ordinal is in [0, KEPT_MAX) (kc_gpu_load_check checks). */
static CUresult primary_ctx(const cu_api *api, int ordinal, CUdevice dev,
                            CUcontext *ctx) {
  CUresult r = CU_SUCCESS;
  pthread_mutex_lock(&kept_mu);
  if (kept_ctx[ordinal])
    *ctx = kept_ctx[ordinal];
  else if ((r = api->PrimaryCtxRetain(ctx, dev)) == CU_SUCCESS)
    kept_ctx[ordinal] = *ctx;
  pthread_mutex_unlock(&kept_mu);
  return r;
}

/* The calling thread's current context is put back afterwards. */
static kc_err check_on_device(const cu_api *api, int ordinal, const void *image,
                              const char *const *entries, size_t n, char *err) {
  CUresult r = api->Init(0);
  if (r != CU_SUCCESS)
    return cu_fail(api, KC_NO_DRIVER, "no usable CUDA driver: cuInit", r, err);
  CUdevice dev;
  CUcontext ctx = NULL, prev = NULL;
  if ((r = api->DeviceGet(&dev, ordinal)) != CU_SUCCESS)
    return cu_fail(api, KC_GPU, "cuDeviceGet", r, err);
  if ((r = primary_ctx(api, ordinal, dev, &ctx)) != CU_SUCCESS)
    return cu_fail(api, KC_GPU, "cuDevicePrimaryCtxRetain", r, err);
  kc_err rc = KC_OK;
  if (api->CtxGetCurrent(&prev) != CU_SUCCESS)
    prev = NULL;
  if ((r = api->CtxSetCurrent(ctx)) != CU_SUCCESS)
    rc = cu_fail(api, KC_GPU, "cuCtxSetCurrent", r, err);
  else
    rc = load_entries(api, image, entries, n, err);
  api->CtxSetCurrent(prev);
  return rc;
}

kc_err kc_gpu_load_check(int ordinal, const void *code, size_t len,
                         const char *const *entries, size_t n_entries,
                         char *err) {
  if (!code || len == 0 || (n_entries > 0 && !entries))
    return kc_errf(err, KC_EINVAL, "load check: no code or no entries");
  if (ordinal < 0 || ordinal >= KEPT_MAX)
    return kc_errf(err, KC_EINVAL, "load check: device %d out of range",
                   ordinal);
  for (size_t i = 0; i < n_entries; i++)
    if (!entries[i] || !entries[i][0])
      return kc_errf(err, KC_EINVAL, "load check: entries[%zu] is empty", i);
  cu_api api;
  kc_err rc = cu_open(&api, err);
  if (rc != KC_OK)
    return rc;
  void *copy;
  const void *image = image_for_driver(code, len, &copy);
  if (!image)
    rc = kc_errf(err, KC_NOMEM, "out of memory (%zu-byte image)", len);
  else
    rc = check_on_device(&api, ordinal, image, entries, n_entries, err);
  free(copy);
  cu_close(&api);
  return rc;
}
