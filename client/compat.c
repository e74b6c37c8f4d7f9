/* compat.c: kc_warm's compatible-arch fallback (docs/DESIGN.md,
 * "Compatible archs"): which device the bundles are for, and for a missing
 * key, the keys of the bundles that would serve that device instead, best
 * first. The rules themselves are gpu/'s (kc_gpu_compat_archs): one rule
 * for "runs on", shared with `kcache verify`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "kc_gpu.h"

static const char *tool_of(const kc_key_fields *f, const char *name) {
  for (size_t i = 0; i < f->n_tools; i++)
    if (!strcmp(f->tools[i].name, name))
      return f->tools[i].value;
  return NULL;
}

/* "12.8" -> 12080 (cuDriverGetVersion's unit); 0 when not a version. */
static int driver_of(const char *v) {
  int ma = 0, mi = 0;
  if (!v || sscanf(v, "%d.%d", &ma, &mi) != 2 || ma < 1 || mi < 0 || mi > 99)
    return 0;
  return ma * 1000 + mi * 10;
}

/* The device: the option, else the first GPU (kc_gpu_detect: cuInit, the
 * costly part, only then). The driver: the manifest's pinned "driver" (what
 * PTX keys hold), else the detected one (with the option: the driver's
 * version alone, no cuInit); 0 when unknown. */
static kc_err find_device(kcc_compat *cp, const kc_warm_opts *o,
                          const kc_key_fields *base, char *err) {
  kc_gpu_info gi;
  const char *pinned = tool_of(base, "driver");
  int driver = 0;
  if (o->device_arch) {
    if (kc_gpu_cc_parse(o->device_arch, &cp->cc_major, &cp->cc_minor) != 0)
      return kc_errf(err, KC_EINVAL, "device arch '%.20s': not sm_XY or X.Y",
                     o->device_arch);
    snprintf(cp->device, sizeof cp->device, "%.20s (given)", o->device_arch);
    if (!pinned && kc_gpu_driver_version(&driver, NULL) != KC_OK)
      driver = 0;
  } else if (kc_gpu_detect(&gi, NULL) == KC_OK && gi.n_devices > 0) {
    cp->cc_major = gi.devices[0].cc_major;
    cp->cc_minor = gi.devices[0].cc_minor;
    driver = gi.driver_version;
    snprintf(cp->device, sizeof cp->device, "%d.%d (GPU 0)", cp->cc_major,
             cp->cc_minor);
  } else {
    return KC_OK; /* no device: no fallback */
  }
  cp->on = 1;
  /* A PTX key holds the driver: the manifest's pin (in base already), else
   * the detected one; with neither, no PTX fallback (driver_version 0). */
  cp->driver_version = pinned ? driver_of(pinned) : driver;
  if (!pinned && driver)
    snprintf(cp->driver, sizeof cp->driver, "%d.%d", driver / 1000,
             driver % 1000 / 10);
  return KC_OK;
}

kc_err kcc_compat_init(kcc_compat *cp, const kc_warm_opts *o,
                       const kc_key_fields *base, char *err) {
  memset(cp, 0, sizeof *cp);
  if (o->no_compat)
    return KC_OK;
  kc_err e = find_device(cp, o, base, err);
  if (e || !cp->on)
    return e;
  /* The PTX a bundle holds is what its toolkit writes: the key's nvrtc
   * (else cuda) says which ISA. Unknown: no PTX fallback. */
  const char *tk = tool_of(base, "nvrtc");
  int isa = kc_gpu_ptx_isa_written(tk ? tk : tool_of(base, "cuda"));
  if (!(cp->archs = calloc(KCC_COMPAT_MAX, sizeof *cp->archs)))
    return kc_errf(err, KC_NOMEM, "out of memory");
  cp->n_archs =
      kc_gpu_compat_archs(cp->cc_major, cp->cc_minor, isa, cp->driver_version,
                          cp->archs, KCC_COMPAT_MAX);
  return KC_OK;
}

void kcc_compat_free(kcc_compat *cp) {
  free(cp->archs);
  cp->archs = NULL;
  cp->n_archs = 0;
}

int kcc_compat_applies(const kcc_compat *cp, const char *arch) {
  return cp->on && kc_gpu_arch_runs_on(arch, cp->cc_major, cp->cc_minor);
}

size_t kcc_compat_keys(const kcc_compat *cp, const kc_key_fields *base,
                       const kc_key_fields *item, char (*keys)[KC_HEX_LEN + 1],
                       size_t max) {
  size_t n = 0;
  if (!kcc_compat_applies(cp, item->arch))
    return 0;
  kc_key_fields *f = malloc(sizeof *f);
  for (size_t i = 0; f && i < cp->n_archs && n < max; i++) {
    if (!strcmp(cp->archs[i], item->arch))
      continue; /* the exact key is the item's own */
    *f = *base;
    f->bucket = item->bucket;
    snprintf(f->arch, sizeof f->arch, "%s", cp->archs[i]);
    if (!strncmp(f->arch, "compute_", 8) && cp->driver[0] &&
        kc_key_set_tool(f, "driver", cp->driver, NULL) != KC_OK)
      continue;
    if (kc_key_compute(f, keys[n], NULL) == KC_OK)
      n++;
  }
  free(f);
  return n;
}
