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
  if (parse_arch(arch, &a) != 0 || cc_major < 1 || cc_minor < 0 ||
      cc_minor > 9)
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
