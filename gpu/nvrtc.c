/* nvrtc.c: finding and loading libnvrtc with dlopen, its version, and one
 * compile in the calling process (kc_gpu_build runs that in a child). */
#include <dlfcn.h>
#include <glob.h>
#include <inttypes.h>
#include <limits.h>
#include <sys/stat.h>
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
  snprintf(s->places + used, sizeof s->places - used, "%s%s", used ? ", " : "",
           place);
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
  const char *missing =
      kcg_load_syms(api->lib, syms, sizeof syms / sizeof *syms);
  if (!missing)
    return KC_OK;
  kc_errf(err, KC_NO_NVRTC,
          "%s is not a usable NVRTC: it lacks %s (NVRTC "
          "11.1 or later needed)",
          api->path, missing);
  dlclose(api->lib);
  api->lib = NULL;
  return KC_NO_NVRTC;
}

/* NVRTC dlopens its builtins by soname ("libnvrtc-builtins.so.13.0") when a
 * program compiles, so a libnvrtc loaded by path from a directory that is not
 * on the loader path (a PyPI wheel's nvidia/cu13/lib, a toolkit outside
 * ld.so.conf) fails every compile with "failed to open
 * libnvrtc-builtins.so.13.0". Loading the builtins from the directory the
 * library came from first makes that dlopen find them by their soname. A
 * failure here is left for NVRTC to report. */
static void preload_builtins(const kcg_nvrtc *api) {
  const char *slash = strrchr(api->path, '/');
  int major = 0, minor = 0;
  if (!slash || api->Version(&major, &minor) != KCG_NVRTC_SUCCESS)
    return;
  char path[600];
  snprintf(path, sizeof path, "%.*s/libnvrtc-builtins.so.%d.%d",
           (int)(slash - api->path), api->path, major, minor);
  if (access(path, F_OK) == 0)
    (void)dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
}

static kc_err bind_and_preload(kcg_nvrtc *api, char *err) {
  kc_err rc = bind_syms(api, err);
  if (rc == KC_OK)
    preload_builtins(api);
  return rc;
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
  return bind_and_preload(api, err);
}

/* PyPI's nvidia-cuda-nvrtc in the active Python environment: its library
 * sits in site-packages/nvidia/cu13/lib (13.x) or nvidia/cuda_nvrtc/lib
 * (12.x) of $VIRTUAL_ENV or $CONDA_PREFIX, and torch's CUDA wheels depend on
 * it, so a torch environment has an NVRTC even without a toolkit. */
static const char *const env_roots[] = {"VIRTUAL_ENV", "CONDA_PREFIX"};
static const char *const wheel_globs[] = {
    "lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13",
    "lib/python3*/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"};
#define WHEEL_PLACE "lib/python3*/site-packages/nvidia/{cu13,cuda_nvrtc}/lib"

/* The n-th wheel library that exists (any Python 3 version), in out. */
static int wheel_file(size_t n, char out[512]) {
  size_t seen = 0;
  for (size_t r = 0; r < sizeof env_roots / sizeof *env_roots; r++) {
    const char *root = getenv(env_roots[r]);
    for (size_t g = 0; root && *root && g < 2; g++) {
      char pat[700];
      glob_t gl;
      snprintf(pat, sizeof pat, "%s/%s", root, wheel_globs[g]);
      if (glob(pat, 0, NULL, &gl) != 0)
        continue;
      for (size_t i = gl.gl_pathc; i-- > 0;)
        if (seen++ == n && strlen(gl.gl_pathv[i]) < 512) {
          snprintf(out, 512, "%s", gl.gl_pathv[i]);
          globfree(&gl);
          return 0;
        }
      globfree(&gl);
    }
  }
  return -1;
}

static int try_wheels(kcg_nvrtc *api, search_log *s) {
  char file[512], place[600];
  for (size_t n = 0; wheel_file(n, file) == 0; n++)
    if (try_load(api, file, s) == 0)
      return 0;
  for (size_t r = 0; r < sizeof env_roots / sizeof *env_roots; r++) {
    const char *root = getenv(env_roots[r]);
    if (root && *root) {
      snprintf(place, sizeof place, "%s/" WHEEL_PLACE, root);
      add_place(s, place);
    }
  }
  return -1;
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
      return bind_and_preload(api, err);
  }
  if ((!home || strcmp(home, "/usr/local/cuda") != 0) &&
      try_dir(api, "/usr/local/cuda/lib64", &s) == 0)
    return bind_and_preload(api, err);
  if (try_wheels(api, &s) == 0)
    return bind_and_preload(api, err);
  for (size_t i = 0; i < N_FILES; i++)
    if (try_load(api, nvrtc_files[i], &s) == 0)
      return bind_syms(api, err);
  add_place(&s, FILES_GLOB " on the loader path");
  return kc_errf(err, KC_NO_NVRTC,
                 "NVRTC not found (searched: %s; set KCACHE_NVRTC or "
                 "CUDA_HOME)%s",
                 s.places, s.why);
}

void kcg_nvrtc_close(kcg_nvrtc *api) {
  if (api && api->lib)
    dlclose(api->lib);
  if (api)
    api->lib = NULL;
}

/* Loads NVRTC, asks its version; path: the file that loaded. */
static kc_err load_version(char out[16], char path[512], char *err) {
  kcg_nvrtc api;
  kc_err rc = kcg_nvrtc_open(&api, err);
  if (rc != KC_OK)
    return rc;
  int major = 0, minor = 0;
  nvrtcResult r = api.Version(&major, &minor);
  snprintf(path, 512, "%s", api.path);
  kcg_nvrtc_close(&api);
  if (r != KCG_NVRTC_SUCCESS)
    return kc_errf(err, KC_NO_NVRTC, "nvrtcVersion failed (%d)", r);
  snprintf(out, 16, "%d.%d", major, minor);
  return KC_OK;
}

kc_err kc_gpu_nvrtc_version(char out[16], char *err) {
  char path[512];
  return load_version(out, path, err);
}

/* ---- The remembered version ---- */

/* The file kcg_nvrtc_open would try first, when it names one (the loader
 * path's own search cannot be predicted without loading). -1: none. */
static int first_file(char out[512]) {
  const char *forced = getenv("KCACHE_NVRTC"), *home = getenv("CUDA_HOME");
  if (forced && *forced) {
    snprintf(out, 512, "%s", forced);
    return strchr(forced, '/') && access(forced, F_OK) == 0 ? 0 : -1;
  }
  const char *dirs[2] = {home && *home ? home : NULL, "/usr/local/cuda"};
  for (size_t d = 0; d < 2; d++)
    for (size_t i = 0; dirs[d] && i < N_FILES; i++) {
      snprintf(out, 512, "%s/lib64/%s", dirs[d], nvrtc_files[i]);
      if (access(out, F_OK) == 0)
        return 0;
    }
  return wheel_file(0, out);
}

/* "path dev inode size mtime": changes whenever the library file does. */
static int identity(const char *path, char *out, size_t cap) {
  struct stat st;
  if (stat(path, &st) != 0)
    return -1;
  snprintf(out, cap, "%s %ju %ju %jd %jd.%09ld", path, (uintmax_t)st.st_dev,
           (uintmax_t)st.st_ino, (intmax_t)st.st_size,
           (intmax_t)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
  return 0;
}

/* The cache file holds one line: identity, a tab, the version. */
static int read_cached(const char *file, const char *id, char out[16]) {
  char line[1024];
  FILE *f = fopen(file, "re");
  if (!f)
    return -1;
  int ok = fgets(line, sizeof line, f) != NULL;
  fclose(f);
  size_t n = strlen(id);
  if (!ok || strncmp(line, id, n) != 0 || line[n] != '\t')
    return -1;
  const char *v = line + n + 1;
  size_t vn = strcspn(v, "\n");
  if (vn == 0 || vn >= 16)
    return -1;
  memcpy(out, v, vn);
  out[vn] = '\0';
  return 0;
}

/* Written whole or not at all (rename); a failure only costs the next load. */
static void write_cached(const char *file, const char *id, const char *ver) {
  char tmp[1100];
  snprintf(tmp, sizeof tmp, "%s.%ld.tmp", file, (long)getpid());
  FILE *f = fopen(tmp, "we");
  if (!f)
    return;
  int ok = fprintf(f, "%s\t%s\n", id, ver) > 0;
  if (fclose(f) != 0 || !ok || rename(tmp, file) != 0)
    unlink(tmp);
}

/* NVIDIA names the library file libnvrtc.so.MAJOR.MINOR.PATCH (the toolkit's
 * lib64, behind the libnvrtc.so and .so.MAJOR links), and nvrtcVersion
 * answers MAJOR.MINOR: the name tells without loading 100 MB. real: the
 * file's path with symlinks resolved. */
static int version_from_name(const char *real, char out[16]) {
  unsigned major, minor, patch;
  char tail;
  const char *base = strrchr(real, '/');
  base = base ? base + 1 : real;
  if (sscanf(base, "libnvrtc.so.%u.%u.%u%c", &major, &minor, &patch, &tail) !=
          3 ||
      major > 999 || minor > 999)
    return -1;
  snprintf(out, 16, "%u.%u", major, minor);
  return 0;
}

/* The answers that need no load, cheapest and surest first (kc_gpu.h). */
static int version_without_load(const char *first, const char *cache_file,
                                const char *id, char out[16]) {
  char real[PATH_MAX];
  if (!realpath(first, real))
    return -1;
  if (version_from_name(real, out) == 0)
    return 0;
  if (id[0] && read_cached(cache_file, id, out) == 0)
    return 0;
  return kcg_nvrtc_meta_version(real, out);
}

kc_err kc_gpu_nvrtc_version_cached(const char *cache_file, char out[16],
                                   char *err) {
  char first[512], id[800] = "", loaded[512];
  int found = first_file(first) == 0;
  int known = cache_file && found && identity(first, id, sizeof id) == 0;
  if (found && version_without_load(first, cache_file, id, out) == 0)
    return KC_OK;
  kc_err e = load_version(out, loaded, err);
  /* Remembered only when the file that loaded is the one predicted. */
  if (!e && known && strcmp(loaded, first) == 0)
    write_cached(cache_file, id, out);
  return e;
}
