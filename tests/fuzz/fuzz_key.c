/* fuzz_key.c: libFuzzer target for the key builder: kc_key_fields_parse, then
 * kc_key_canonical and kc_key_compute. Accepted fields must validate; the
 * key must be the SHA-256 of the canonical JSON; the canonical JSON must be
 * jansson's sorted compact form and parse back to the same fields and key;
 * the order of bucket dims and toolchain entries must not change the key;
 * and replacing a toolchain entry by itself must not either. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

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

/* Canonical JSON and key of f, both checked; *canon is malloc'd. */
static void canon_and_key(const kc_key_fields *f, char **canon,
                          char key[KC_HEX_LEN + 1]) {
  char err[KC_ERRBUF_SIZE], h[KC_HEX_LEN + 1];
  FZ_CHECK(kc_key_validate(f, err) == KC_OK, "accepted fields invalid: %s",
           err);
  FZ_CHECK(kc_key_canonical(f, canon, err) == KC_OK && *canon, "canonical: %s",
           err);
  FZ_CHECK(kc_key_compute(f, key, err) == KC_OK, "compute: %s", err);
  FZ_CHECK(kc_is_hex64(key), "key is not hex64: %s", key);
  FZ_CHECK(kc_sha256_hex(*canon, strlen(*canon), h) == KC_OK, "sha256");
  FZ_CHECK(strcmp(h, key) == 0, "key %s is not sha256(canonical) %s", key, h);
  for (const char *p = *canon; *p; p++)
    FZ_CHECK(*p != '\n' && *p != '\r', "canonical JSON has a line break");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[KC_ERRBUF_SIZE];
  kc_key_fields f, f2;
  memset(&f, 0xA5, sizeof f);
  kc_key_fields before = f;
  fz_err_reset(err);
  kc_err e = kc_key_fields_parse((const char *)data, size, &f, err);
  if (e) {
    fz_err_ok(err, 1, "kc_key_fields_parse");
    FZ_CHECK(e == KC_BAD_JSON || e == KC_BAD_KEY,
             "unexpected error code %d (%s): %s", (int)e, kc_strerror(e), err);
    FZ_CHECK(memcmp(&f, &before, sizeof f) == 0,
             "output changed on failure (the header says untouched)");
    return 0;
  }
  FZ_CHECK(f.bucket.n >= 1 && f.bucket.n <= KC_MAX_DIMS, "bucket.n %zu",
           f.bucket.n);
  FZ_CHECK(f.n_tools <= KC_MAX_TOOLS, "n_tools %zu", f.n_tools);
  FZ_CHECK(kc_arch_valid(f.arch), "arch '%s' accepted", f.arch);

  char *c1 = NULL, *c2 = NULL, *c3 = NULL, *c4 = NULL;
  char k1[KC_HEX_LEN + 1], k2[KC_HEX_LEN + 1], k3[KC_HEX_LEN + 1],
      k4[KC_HEX_LEN + 1];
  canon_and_key(&f, &c1, k1);

  /* Deterministic. */
  char kx[KC_HEX_LEN + 1];
  FZ_CHECK(kc_key_compute(&f, kx, err) == KC_OK && strcmp(kx, k1) == 0,
           "compute not deterministic");

  /* jansson's sorted compact form (docs/DESIGN.md, "The key"). */
  json_error_t je;
  json_t *j = json_loads(c1, JSON_REJECT_DUPLICATES, &je);
  FZ_CHECK(j, "canonical JSON is not JSON: %s\n%s", je.text, c1);
  char *jd = json_dumps(j, JSON_SORT_KEYS | JSON_COMPACT);
  FZ_CHECK(jd && strcmp(jd, c1) == 0, "not jansson's form:\n%s\n%s", c1,
           jd ? jd : "(null)");
  FZ_CHECK(json_integer_value(json_object_get(j, "v")) == 1, "v != 1: %s", c1);
  free(jd);
  json_decref(j);

  /* The canonical JSON re-parses to the same key (and is a fixpoint). */
  fz_err_reset(err);
  e = kc_key_fields_parse(c1, strlen(c1), &f2, err);
  FZ_CHECK(e == KC_OK, "canonical JSON does not parse: %s\n%s", err, c1);
  canon_and_key(&f2, &c2, k2);
  FZ_CHECK(strcmp(c1, c2) == 0, "canonical not a fixpoint:\n%s\n%s", c1, c2);
  FZ_CHECK(strcmp(k1, k2) == 0, "key changed over a round trip");

  /* Order of dims and tools does not matter. */
  kc_key_fields f3 = f;
  for (size_t i = 0; i < f3.bucket.n / 2; i++) {
    kc_dim t = f3.bucket.dims[i];
    f3.bucket.dims[i] = f3.bucket.dims[f3.bucket.n - 1 - i];
    f3.bucket.dims[f3.bucket.n - 1 - i] = t;
  }
  for (size_t i = 0; i < f3.n_tools / 2; i++) {
    kc_tool t = f3.tools[i];
    f3.tools[i] = f3.tools[f3.n_tools - 1 - i];
    f3.tools[f3.n_tools - 1 - i] = t;
  }
  canon_and_key(&f3, &c3, k3);
  FZ_CHECK(strcmp(c1, c3) == 0, "order changed the canonical JSON");
  FZ_CHECK(strcmp(k1, k3) == 0, "order changed the key");

  /* Setting an entry to its own value is a no-op. */
  if (f.n_tools > 0) {
    kc_key_fields f4 = f;
    const kc_tool *t = &f.tools[f.n_tools - 1];
    e = kc_key_set_tool(&f4, t->name, t->value, err);
    FZ_CHECK(e == KC_OK, "set_tool of an accepted entry: %s", err);
    FZ_CHECK(f4.n_tools == f.n_tools, "set_tool of an existing name added one");
    canon_and_key(&f4, &c4, k4);
    FZ_CHECK(strcmp(k1, k4) == 0, "set_tool to the same value changed the key");
  }
  free(c1);
  free(c2);
  free(c3);
  free(c4);
  return 0;
}
