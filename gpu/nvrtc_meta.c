/* nvrtc_meta.c: NVRTC's version from the install metadata NVIDIA ships next
 * to the library, read without loading the library.
 *
 * Why: the version is a field of every key, and loading libnvrtc (~100 MB)
 * just to ask it costs ~40 ms of every warmup on a fresh cache directory
 * when the file is named libnvrtc.so.13 (pip wheels, pip-assembled
 * toolkits), whose name gives only the major.
 *
 * The rule, on the library's real path (symlinks resolved) <lib>/<file>,
 * where <lib> is named lib or lib64 and <top> is the directory above it:
 *  1. a CUDA toolkit's version.json, "cuda_nvrtc": {"version": "13.0.88"}:
 *     <top>/version.json, or <root>/version.json for
 *     <root>/targets/<triple>/lib;
 *  2. a wheel's dist-info directory nvidia_cuda_nvrtc[_cuNN]-X.Y.Z.dist-info
 *     in <top>, in <top>/dist-info/, or in the site-packages directory of a
 *     wheel layout (<site>/nvidia/<pkg>/lib); the version is in its name, and
 *     it counts only when its RECORD lists a file of the library's name and
 *     size (so a cu12 and a cu13 wheel side by side cannot be confused).
 * Nothing else is searched. An answer that contradicts the major in the
 * file's name (libnvrtc.so.13) is passed over. Only MAJOR.MINOR is kept:
 * what nvrtcVersion answers and what keys hold. */
#include <dirent.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gpu_internal.h"

/* 1 to 3 decimal digits; the character after them, or NULL. */
static const char *number(const char *s, unsigned *val) {
  const char *p = s;
  for (*val = 0; *p >= '0' && *p <= '9' && p - s < 4; p++)
    *val = *val * 10 + (unsigned)(*p - '0');
  return p > s && p - s < 4 ? p : NULL;
}

/* "13.0.88" -> "13.0". -1 unless it is MAJOR.MINOR, then '.' or the end. */
static int major_minor(const char *v, char out[16]) {
  unsigned major, minor;
  const char *p = number(v, &major);
  if (!p || *p != '.' || !(p = number(p + 1, &minor)) ||
      (*p != '\0' && *p != '.'))
    return -1;
  snprintf(out, 16, "%u.%u", major, minor);
  return 0;
}

/* The directory part of path, and its last component in *base. */
static int split(const char *path, char dir[PATH_MAX], const char **base) {
  const char *slash = strrchr(path, '/');
  if (!slash || slash == path || (size_t)(slash - path) >= PATH_MAX)
    return -1;
  memcpy(dir, path, (size_t)(slash - path));
  dir[slash - path] = '\0';
  *base = slash + 1;
  return 0;
}

static int named(const char *path, const char *name) {
  const char *slash = strrchr(path, '/');
  return slash && strcmp(slash + 1, name) == 0;
}

/* ---- 1. version.json of a CUDA toolkit ---- */

static int version_json(const char *root, char out[16]) {
  char file[PATH_MAX + 16];
  snprintf(file, sizeof file, "%s/version.json", root);
  FILE *f = fopen(file, "re");
  json_t *j = f ? json_loadf(f, 0, NULL) : NULL;
  if (f)
    fclose(f);
  json_t *v = json_object_get(json_object_get(j, "cuda_nvrtc"), "version");
  int rc = json_is_string(v) ? major_minor(json_string_value(v), out) : -1;
  json_decref(j);
  return rc;
}

/* <top>/version.json; for <root>/targets/<triple>/lib, <root>/version.json. */
static int from_toolkit(const char *lib, const char *top, char out[16]) {
  char targets[PATH_MAX], root[PATH_MAX];
  const char *b;
  if (version_json(top, out) == 0)
    return 0;
  if (!named(lib, "lib") || split(top, targets, &b) != 0 ||
      !named(targets, "targets") || split(targets, root, &b) != 0)
    return -1;
  return version_json(root, out);
}

/* ---- 2. dist-info of a pip wheel ---- */

/* 1 if RECORD ("path,hash,size" lines) lists a file named base of size. */
static int record_lists(const char *dist, const char *base, long long size) {
  char file[PATH_MAX + 300], line[1024];
  snprintf(file, sizeof file, "%s/RECORD", dist);
  FILE *f = fopen(file, "re");
  int found = 0;
  while (f && !found && fgets(line, sizeof line, f)) {
    char *comma = strchr(line, ','), *last = strrchr(line, ',');
    if (!comma || comma == last)
      continue;
    *comma = '\0';
    const char *slash = strrchr(line, '/');
    found =
        strcmp(slash ? slash + 1 : line, base) == 0 && atoll(last + 1) == size;
  }
  if (f)
    fclose(f);
  return found;
}

/* "nvidia_cuda_nvrtc[_cuNN]-X.Y.Z.dist-info" -> "X.Y"; -1 for other names. */
static int dist_version(const char *name, char out[16]) {
  static const char pfx[] = "nvidia_cuda_nvrtc", sfx[] = ".dist-info";
  size_t n = strlen(name), np = sizeof pfx - 1, ns = sizeof sfx - 1;
  const char *dash = strchr(name, '-');
  if (strncmp(name, pfx, np) != 0 || (name[np] != '-' && name[np] != '_') ||
      n <= ns || strcmp(name + n - ns, sfx) != 0 || !dash)
    return -1;
  return major_minor(dash + 1, out);
}

/* The first nvrtc dist-info of dir whose RECORD lists the library. */
static int scan_dist_infos(const char *dir, const char *base, long long size,
                           char out[16]) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char dist[PATH_MAX + 260];
  int rc = -1;
  while (d && rc != 0 && (e = readdir(d)) != NULL) {
    if (dist_version(e->d_name, out) != 0)
      continue;
    snprintf(dist, sizeof dist, "%s/%s", dir, e->d_name);
    if (record_lists(dist, base, size))
      rc = 0;
  }
  if (d)
    closedir(d);
  return rc;
}

/* <top>, <top>/dist-info, and <site> for <site>/nvidia/<pkg>/lib. */
static int from_wheel(const char *top, const char *base, long long size,
                      char out[16]) {
  char sub[PATH_MAX + 16], nvidia[PATH_MAX], site[PATH_MAX];
  const char *b;
  snprintf(sub, sizeof sub, "%s/dist-info", top);
  if (scan_dist_infos(top, base, size, out) == 0 ||
      scan_dist_infos(sub, base, size, out) == 0)
    return 0;
  if (split(top, nvidia, &b) != 0 || !named(nvidia, "nvidia") ||
      split(nvidia, site, &b) != 0)
    return -1;
  return scan_dist_infos(site, base, size, out);
}

/* ---- The rule ---- */

/* libnvrtc.so.13 names major 13: the metadata must say 13.x. A name with no
 * single major (libnvrtc.so) says nothing. */
static int agrees_with_name(const char *base, const char *ver) {
  unsigned major;
  char tail;
  if (sscanf(base, "libnvrtc.so.%u%c", &major, &tail) != 1)
    return 1;
  return (unsigned)atoi(ver) == major;
}

int kcg_nvrtc_meta_version(const char *real, char out[16]) {
  char lib[PATH_MAX], top[PATH_MAX], v[16];
  const char *base, *b;
  struct stat st;
  if (split(real, lib, &base) != 0 || split(lib, top, &b) != 0 ||
      (!named(lib, "lib") && !named(lib, "lib64")) || stat(real, &st) != 0)
    return -1;
  if ((from_toolkit(lib, top, v) == 0 && agrees_with_name(base, v)) ||
      (from_wheel(top, base, (long long)st.st_size, v) == 0 &&
       agrees_with_name(base, v))) {
    memcpy(out, v, 16);
    return 0;
  }
  return -1;
}
