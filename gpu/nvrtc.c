/* nvrtc.c: finding and loading libnvrtc with dlopen, its version, and one
 * compile in the calling process (kc_gpu_build runs that in a child). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu_internal.h"

_Static_assert(sizeof(void *) == sizeof(void (*)(void)),
               "dlsym needs function and object pointers of one size");

const char *kcg_load_syms(void *lib, const kcg_sym *syms, size_t n) {
  for (size_t i = 0; i < n; i++) {
    void *p = dlsym(lib, syms[i].name);
    if (!p && !syms[i].optional)
      return syms[i].name;
    memcpy(syms[i].slot, &p, sizeof p);
  }
  return NULL;
}

/* ---- Loading ---- */

/* The sonames tried in each directory: the unversioned development link
 * first, then the runtime sonames of the toolkits kcache knows (13, 12). */
static const char *const nvrtc_files[] = {"libnvrtc.so", "libnvrtc.so.13",
                                          "libnvrtc.so.12"};
#define N_FILES (sizeof nvrtc_files / sizeof nvrtc_files[0])
#define FILES_GLOB "libnvrtc.so{,.13,.12}"

/* Why the search failed: the places tried and the first loader error of a
 * file that exists but did not load (a wrong architecture, a missing
 * libnvrtc-builtins), which is the one worth reading. */
typedef struct search_log {
  char places[KC_ERRBUF_SIZE];
  char why[KC_ERRBUF_SIZE];
} search_log;

static void add_place(search_log *s, const char *place) {
  size_t used = strlen(s->places);
  snprintf(s->places + used, sizeof s->places - used, "%s%s",
           used ? ", " : "", place);
}

static kc_err bind_syms(kcg_nvrtc *api, char *err) {
  const kcg_sym syms[] = {
      {"nvrtcVersion", &api->Version, 0},
      {"nvrtcGetErrorString", &api->GetErrorString, 0},
      {"nvrtcCreateProgram", &api->CreateProgram, 0},
      {"nvrtcCompileProgram", &api->CompileProgram, 0},
      {"nvrtcDestroyProgram", &api->DestroyProgram, 0},
      {"nvrtcGetProgramLogSize", &api->GetProgramLogSize, 0},
      {"nvrtcGetProgramLog", &api->GetProgramLog, 0},
      {"nvrtcGetCUBINSize", &api->GetCUBINSize, 0},
      {"nvrtcGetCUBIN", &api->GetCUBIN, 0},
      {"nvrtcGetPTXSize", &api->GetPTXSize, 0},
      {"nvrtcGetPTX", &api->GetPTX, 0},
  };
  const char *missing = kcg_load_syms(api->lib, syms, sizeof syms / sizeof *syms);
  if (!missing)
    return KC_OK;
  kc_errf(err, KC_NO_NVRTC, "%s is not a usable NVRTC: it lacks %s (NVRTC "
          "11.1 or later needed)", api->path, missing);
  dlclose(api->lib);
  api->lib = NULL;
  return KC_NO_NVRTC;
}

/* RTLD_NODELETE: NVRTC is a C++ library with static state; unmapping it on
 * dlclose saves nothing (the next build maps it again) and tears down state
 * that its own threads or atexit handlers may still reach. */
#define NVRTC_DLOPEN_FLAGS (RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)

/* dlopen one candidate; a file that exists but fails to load is remembered. */
static int try_load(kcg_nvrtc *api, const char *file, search_log *s) {
  api->lib = dlopen(file, NVRTC_DLOPEN_FLAGS);
  if (api->lib) {
    snprintf(api->path, sizeof api->path, "%s", file);
    return 0;
  }
  const char *e = dlerror();
  if (!s->why[0] && strchr(file, '/') && access(file, F_OK) == 0)
    snprintf(s->why, sizeof s->why, "; %s", e ? e : "dlopen failed");
  return -1;
}

static int try_dir(kcg_nvrtc *api, const char *dir, search_log *s) {
  char path[512], place[600];
  for (size_t i = 0; i < N_FILES; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, nvrtc_files[i]);
    if (try_load(api, path, s) == 0)
      return 0;
  }
  snprintf(place, sizeof place, "%s/" FILES_GLOB, dir);
  add_place(s, place);
  return -1;
}

/* $KCACHE_NVRTC names one file and nothing else is tried: whoever set it
 * wants that toolchain, and the key records its version. */
static kc_err open_forced(kcg_nvrtc *api, const char *file, char *err) {
  api->lib = dlopen(file, NVRTC_DLOPEN_FLAGS);
  if (!api->lib) {
    const char *e = dlerror();
    return kc_errf(err, KC_NO_NVRTC,
                   "NVRTC not found (searched: KCACHE_NVRTC=%s: %s)", file,
                   e ? e : "dlopen failed");
  }
  snprintf(api->path, sizeof api->path, "%s", file);
  return bind_syms(api, err);
}

kc_err kcg_nvrtc_open(kcg_nvrtc *api, char *err) {
  memset(api, 0, sizeof *api);
  const char *forced = getenv("KCACHE_NVRTC");
  if (forced && *forced)
    return open_forced(api, forced, err);
  search_log s = {{0}, {0}};
  const char *home = getenv("CUDA_HOME");
  char dir[512];
  if (home && *home) {
    snprintf(dir, sizeof dir, "%s/lib64", home);
    if (try_dir(api, dir, &s) == 0)
      return bind_syms(api, err);
  }
  if ((!home || strcmp(home, "/usr/local/cuda") != 0) &&
      try_dir(api, "/usr/local/cuda/lib64", &s) == 0)
    return bind_syms(api, err);
  for (size_t i = 0; i < N_FILES; i++)
    if (try_load(api, nvrtc_files[i], &s) == 0)
      return bind_syms(api, err);
  add_place(&s, FILES_GLOB " on the loader path");
  return kc_errf(err, KC_NO_NVRTC,
                 "NVRTC not found (searched: %s; set KCACHE_NVRTC or "
                 "CUDA_HOME)%s", s.places, s.why);
}

void kcg_nvrtc_close(kcg_nvrtc *api) {
  if (api && api->lib)
    dlclose(api->lib);
  if (api)
    api->lib = NULL;
}

kc_err kc_gpu_nvrtc_version(char out[16], char *err) {
  kcg_nvrtc api;
  kc_err rc = kcg_nvrtc_open(&api, err);
  if (rc != KC_OK)
    return rc;
  int major = 0, minor = 0;
  nvrtcResult r = api.Version(&major, &minor);
  kcg_nvrtc_close(&api);
  if (r != KCG_NVRTC_SUCCESS)
    return kc_errf(err, KC_NO_NVRTC, "nvrtcVersion failed (%d)", r);
  snprintf(out, 16, "%d.%d", major, minor);
  return KC_OK;
}
