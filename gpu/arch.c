/* arch.c: which compile target runs on which GPU (NVIDIA's compatibility
 * rules, kc_gpu.h), and the native target chosen for a detected device. */
#include <stdio.h>
#include <string.h>

#include "gpu_internal.h"

typedef struct parsed_arch {
  int ptx;          /* compute_XY: PTX, JIT-compiled by the driver */
  int major, minor; /* XY = major * 10 + minor: sm_86 -> 8.6, sm_100 -> 10.0 */
  char suffix;      /* '\0', 'a' (arch-specific) or 'f' (family-specific) */
} parsed_arch;

/* Parses ^(sm|compute)_[1-9][0-9]{1,2}[af]?$. A leading zero ("sm_05") is
 * no real target; refusing it keeps "same major" meaningful. */
static int parse_arch(const char *s, parsed_arch *out) {
  if (!kc_arch_valid(s))
    return -1;
  out->ptx = s[0] == 'c';
  const char *p = s + (out->ptx ? 8 : 3);
  if (*p == '0')
    return -1;
  int n = 0;
  while (*p >= '0' && *p <= '9')
    n = n * 10 + (*p++ - '0');
  out->major = n / 10;
  out->minor = n % 10;
  out->suffix = *p;
  return 0;
}

static int cc_at_least(int major, int minor, int want_major, int want_minor) {
  return major > want_major || (major == want_major && minor >= want_minor);
}

int kc_gpu_arch_runs_on(const char *arch, int cc_major, int cc_minor) {
  parsed_arch a;
  if (parse_arch(arch, &a) != 0 || cc_major < 1 || cc_minor < 0 || cc_minor > 9)
    return 0;
  if (a.suffix == 'a') /* arch-specific features exist on that chip only */
    return cc_major == a.major && cc_minor == a.minor;
  if (a.suffix == 'f' || !a.ptx) /* family / binary compatibility: the same
                                    major, an equal or newer minor */
    return cc_major == a.major && cc_minor >= a.minor;
  /* Plain PTX: the driver JIT-compiles it for any newer GPU. */
  return cc_at_least(cc_major, cc_minor, a.major, a.minor);
}

/* The native target is what gets the most out of the device it was detected
 * on: sm_<major><minor>, plus the arch-specific "a" where NVIDIA has it and
 * where it matters (wgmma/TMA on 9.0, tcgen05 on 10.x and later): 9.0 ->
 * sm_90a, 10.0 -> sm_100a, 10.3 -> sm_103a, 12.0 -> sm_120a. Such a cubin runs
 * on exactly that capability, which is what a per-device cache wants; a
 * warmup manifest that wants one build for a family lists "sm_100f" itself. */
int kcg_native_arch(int cc_major, int cc_minor, char out[KC_ARCH_MAX + 1]) {
  if (cc_major < 1 || cc_major > 99 || cc_minor < 0 || cc_minor > 9)
    return -1;
  int wants_a = (cc_major == 9 && cc_minor == 0) || cc_major >= 10;
  snprintf(out, KC_ARCH_MAX + 1, "sm_%d%d%s", cc_major, cc_minor,
           wants_a ? "a" : "");
  return 0;
}

/* ---- Compatible targets (warm's fallback) ---- */

int kc_gpu_cc_parse(const char *s, int *major, int *minor) {
  parsed_arch a;
  if (s && parse_arch(s, &a) == 0) {
    *major = a.major;
    *minor = a.minor;
    return 0;
  }
  /* "8.9": one or two digits, a dot, one digit */
  int ma = 0, mi = 0, n = 0;
  if (!s || sscanf(s, "%2d.%1d%n", &ma, &mi, &n) != 2 || s[n] || ma < 1 ||
      s[0] < '1' || s[0] > '9')
    return -1;
  *major = ma;
  *minor = mi;
  return 0;
}

/* The PTX ISA version each CUDA release writes and reads (PTX ISA manual,
 * "Release History"), as 10 * major + minor: CUDA 12.8 -> PTX ISA 8.7.
 * 12.6 added none (8.5, as 12.5). */
static const struct {
  int cuda; /* 1000 * major + 10 * minor, cuDriverGetVersion's unit */
  int isa;
} isa_table[] = {
    {9000, 60},  {9010, 61},  {9020, 62},  {10000, 63}, {10010, 64},
    {10020, 65}, {11000, 70}, {11010, 71}, {11020, 72}, {11030, 73},
    {11040, 74}, {11050, 75}, {11060, 76}, {11070, 77}, {11080, 78},
    {12000, 80}, {12010, 81}, {12020, 82}, {12030, 83}, {12040, 84},
    {12050, 85}, {12060, 85}, {12070, 86}, {12080, 87}, {12090, 88},
    {13000, 90}, {13010, 91}, {13020, 92}, {13030, 93}, {13040, 94},
    {13050, 95},
};
#define N_ISA (sizeof isa_table / sizeof *isa_table)

int kc_gpu_ptx_isa_written(const char *cuda) {
  int ma = 0, mi = 0, n = 0;
  if (!cuda || sscanf(cuda, "%3d.%2d%n", &ma, &mi, &n) != 2 ||
      (cuda[n] && cuda[n] != '.'))
    return 0;
  for (size_t i = 0; i < N_ISA; i++)
    if (isa_table[i].cuda == ma * 1000 + mi * 10)
      return isa_table[i].isa;
  return 0; /* unknown (newer than the table): its PTX may be too new */
}

int kc_gpu_ptx_isa_read(int driver_version) {
  int isa = 0; /* a driver newer than the table reads at least its newest */
  for (size_t i = 0; i < N_ISA; i++)
    if (isa_table[i].cuda <= driver_version)
      isa = isa_table[i].isa;
  return isa;
}

int kc_gpu_arch_usable(const char *arch, int cc_major, int cc_minor,
                       int ptx_isa, int driver_version) {
  if (!kc_gpu_arch_runs_on(arch, cc_major, cc_minor))
    return 0;
  if (arch[0] != 'c')
    return 1;
  int reads = kc_gpu_ptx_isa_read(driver_version);
  return ptx_isa > 0 && reads > 0 && ptx_isa <= reads;
}

/* Every target NVIDIA has (nvcc --list-gpu-arch, CUDA 9 to 13) as XY, with
 * the suffixes it exists with: 'a' from 9.0, 'f' from 10.0 (CUDA 12.9). */
static const struct {
  int num;
  const char *suffixes; /* tried in this order: arch-specific first */
} real_archs[] = {
    {121, "af"}, {120, "af"}, {110, "af"}, {103, "af"}, {101, "af"},
    {100, "af"}, {90, "a"},   {89, ""},    {87, ""},    {86, ""},
    {80, ""},    {75, ""},    {72, ""},    {70, ""},    {62, ""},
    {61, ""},    {60, ""},    {53, ""},    {52, ""},    {50, ""},
};
#define N_REAL (sizeof real_archs / sizeof *real_archs)

/* Adds kind's targets (newest first; per number 'a', 'f', then plain) that
 * can serve the device. */
static size_t add_kind(const char *kind, int cc_major, int cc_minor,
                       int ptx_isa, int driver_version,
                       char (*out)[KC_ARCH_MAX + 1], size_t n, size_t max) {
  char a[KC_ARCH_MAX + 8];
  for (size_t i = 0; i < N_REAL && n < max; i++) {
    const char *s = real_archs[i].suffixes;
    for (size_t k = 0; k <= strlen(s) && n < max; k++) {
      snprintf(a, sizeof a, "%s_%d%.1s", kind, real_archs[i].num,
               k < strlen(s) ? s + k : "");
      if (strlen(a) <= KC_ARCH_MAX &&
          kc_gpu_arch_usable(a, cc_major, cc_minor, ptx_isa, driver_version))
        memcpy(out[n++], a, strlen(a) + 1);
    }
  }
  return n;
}

size_t kc_gpu_compat_archs(int cc_major, int cc_minor, int ptx_isa,
                           int driver_version, char (*out)[KC_ARCH_MAX + 1],
                           size_t max) {
  size_t n = add_kind("sm", cc_major, cc_minor, 0, 0, out, 0, max);
  return add_kind("compute", cc_major, cc_minor, ptx_isa, driver_version, out,
                  n, max);
}
