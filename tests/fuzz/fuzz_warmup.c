/* fuzz_warmup.c: libFuzzer target for the warmup manifest parser
 * (kc_warmup_parse). Every input is refused with a proper message or
 * accepted; an accepted manifest must hold what the client relies on: one
 * builder (kernels xor command), at least one bucket, valid archs, relative
 * sources resolved under base_dir, and every (bucket, arch) must make a
 * valid key with the manifest's model hash and toolchain. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "kc_schema.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fz_init_jansson();
  return 0;
}

static void check_accepted(const kc_warmup *w, const char *base) {
  char err[KC_ERRBUF_SIZE];
  FZ_CHECK(w->model_name && w->model_name[0], "no model name");
  FZ_CHECK(kc_is_hex64(w->model_hash), "model hash not hex64");
  FZ_CHECK((w->n_kernels > 0) != (w->n_command > 0),
           "kernels %zu and command %zu: exactly one builder", w->n_kernels,
           w->n_command);
  FZ_CHECK(w->n_buckets >= 1 && w->buckets, "no buckets");
  FZ_CHECK(w->n_tools <= KC_MAX_TOOLS, "n_tools %zu", w->n_tools);
  FZ_CHECK(w->timeout_s > 0, "timeout_s %d", w->timeout_s);
  FZ_CHECK(w->base_dir && strcmp(w->base_dir, base) == 0, "base_dir '%s'",
           w->base_dir ? w->base_dir : "(null)");
  for (size_t i = 0; i < w->n_archs; i++)
    FZ_CHECK(kc_arch_valid(w->archs[i]), "archs[%zu] '%s'", i, w->archs[i]);
  for (size_t i = 0; i < w->n_command; i++)
    FZ_CHECK(w->command[i], "command[%zu] NULL", i);
  if (w->n_command)
    FZ_CHECK(w->command[0][0], "empty program");
  for (size_t i = 0; i < w->n_kernels; i++) {
    const kc_kernel *k = &w->kernels[i];
    FZ_CHECK(k->name && k->name[0] && k->source && k->source[0],
             "kernels[%zu]: empty name or source", i);
    size_t bl = strlen(base);
    FZ_CHECK(k->source[0] == '/' || strcmp(base, ".") == 0 ||
                 (strncmp(k->source, base, bl) == 0 && k->source[bl] == '/'),
             "kernels[%zu].source '%s' not under base '%s'", i, k->source,
             base);
    for (size_t j = 0; j < k->n_entries; j++)
      FZ_CHECK(k->entries[j], "entries[%zu] NULL", j);
    for (size_t j = 0; j < k->n_options; j++)
      FZ_CHECK(k->options[j], "options[%zu] NULL", j);
    for (size_t j = 0; j < i; j++)
      FZ_CHECK(strcmp(w->kernels[j].name, k->name) != 0,
               "duplicate kernel name '%s'", k->name);
  }
  /* Each (bucket, arch) is a key the client will compute. */
  kc_key_fields f;
  memset(&f, 0, sizeof f);
  memcpy(f.model, w->model_hash, sizeof f.model);
  memset(f.build, '0', KC_HEX_LEN);
  memcpy(f.tools, w->tools, sizeof f.tools);
  f.n_tools = w->n_tools;
  for (size_t b = 0; b < w->n_buckets; b++) {
    f.bucket = w->buckets[b];
    size_t na = w->n_archs ? w->n_archs : 1;
    for (size_t a = 0; a < na; a++) {
      snprintf(f.arch, sizeof f.arch, "%s",
               w->n_archs ? w->archs[a] : "sm_90a");
      char key[KC_HEX_LEN + 1];
      FZ_CHECK(kc_key_compute(&f, key, err) == KC_OK,
               "buckets[%zu] x archs[%zu] makes no valid key: %s", b, a, err);
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[KC_ERRBUF_SIZE];
  /* Both forms of base_dir: a given directory and NULL ("."). */
  const char *base = size & 1 ? "/srv/models/demo" : NULL;
  static kc_warmup sentinel;
  kc_warmup *w = &sentinel;
  fz_err_reset(err);
  kc_err e = kc_warmup_parse((const char *)data, size, base, &w, err);
  if (e) {
    FZ_CHECK(w == NULL, "error but *out set");
    fz_err_ok(err, 1, "kc_warmup_parse");
    FZ_CHECK(e == KC_BAD_JSON || e == KC_BAD_WARMUP,
             "unexpected error code %d (%s): %s", (int)e, kc_strerror(e), err);
    return 0;
  }
  FZ_CHECK(w != NULL && w != &sentinel, "KC_OK without a manifest");
  check_accepted(w, base ? base : ".");
  kc_warmup_free(w);
  kc_warmup_free(NULL);
  return 0;
}
