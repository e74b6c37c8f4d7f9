/* fuzz_manifest.c: libFuzzer target for the bundle manifest parser
 * (kc_manifest_parse). Every input must be either refused with a proper
 * message or accepted; an accepted manifest's canonical JSON
 * (kc_manifest_to_json) must parse again to the same manifest and the same
 * bytes (canonical form is a fixpoint). An input refused only because its
 * "key" is wrong is parsed again with the key computed from its fields, so
 * that mutations of the fields reach the canonical writer too. */
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

static void round_trip(const kc_manifest *m) {
  char err[KC_ERRBUF_SIZE], key[KC_HEX_LEN + 1];
  FZ_CHECK(kc_is_hex64(m->key), "accepted key is not hex64");
  FZ_CHECK(kc_manifest_validate(m, err) == KC_OK, "accepted, then invalid: %s",
           err);
  FZ_CHECK(kc_manifest_check_key(m, err) == KC_OK,
           "accepted, then key mismatch: %s", err);
  FZ_CHECK(kc_key_compute(&m->fields, key, err) == KC_OK, "key: %s", err);
  FZ_CHECK(strcmp(key, m->key) == 0, "key %s != computed %s", m->key, key);
  FZ_CHECK(m->n_files >= 1, "accepted a manifest with no files");

  char *j1 = NULL, *j1b = NULL, *j2 = NULL;
  kc_err e = kc_manifest_to_json(m, &j1, err);
  FZ_CHECK(e == KC_OK && j1, "to_json of an accepted manifest: %s", err);
  FZ_CHECK(kc_manifest_to_json(m, &j1b, err) == KC_OK, "to_json: %s", err);
  FZ_CHECK(strcmp(j1, j1b) == 0, "to_json is not deterministic:\n%s\n%s", j1,
           j1b);
  FZ_CHECK(!strchr(j1, '\n'), "canonical JSON has a newline: %s", j1);

  kc_manifest *m2 = NULL;
  fz_err_reset(err);
  e = kc_manifest_parse(j1, strlen(j1), &m2, err);
  if (e)
    fz_err_ok(err, 1, "reparse");
  FZ_CHECK(e == KC_OK && m2, "canonical JSON does not parse (%s): %s\n%s",
           kc_strerror(e), err, j1);
  FZ_CHECK(kc_manifest_to_json(m2, &j2, err) == KC_OK, "to_json(m2): %s", err);
  FZ_CHECK(strcmp(j1, j2) == 0, "canonical form is not a fixpoint:\n%s\n%s", j1,
           j2);
  FZ_CHECK(strcmp(m->key, m2->key) == 0, "key changed over a round trip");
  FZ_CHECK(m->n_files == m2->n_files, "file count changed over a round trip");
  FZ_CHECK(kc_manifest_equal(m, m2), "round trip not kc_manifest_equal");
  FZ_CHECK(kc_manifest_equal(m2, m), "kc_manifest_equal not symmetric");

  /* Sealing recomputes the same key. */
  FZ_CHECK(kc_manifest_seal(m2, err) == KC_OK, "seal: %s", err);
  FZ_CHECK(strcmp(m->key, m2->key) == 0, "seal changed the key");

  /* The canonical JSON is what jansson writes with sorted keys, compactly
   * (docs/DESIGN.md), reals with 15 significant digits (kc_schema.h), so
   * jansson's own re-dump gives the same bytes. */
  json_error_t je;
  json_t *j = json_loads(j1, JSON_REJECT_DUPLICATES, &je);
  FZ_CHECK(j, "jansson cannot read the canonical JSON: %s", je.text);
  char *jd =
      json_dumps(j, JSON_SORT_KEYS | JSON_COMPACT | JSON_REAL_PRECISION(15));
  FZ_CHECK(jd, "json_dumps");
  FZ_CHECK(strcmp(jd, j1) == 0, "not jansson's canonical form:\n%s\n%s", j1,
           jd);
  free(jd);
  json_decref(j);

  kc_manifest_free(m2);
  free(j1);
  free(j1b);
  free(j2);
}

/* The input with "key" replaced by the key of its own fields, or NULL. */
static char *with_computed_key(const uint8_t *data, size_t size) {
  static const char *const names[] = {"model", "bucket", "arch", "toolchain",
                                      "build"};
  json_error_t je;
  json_t *root =
      json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &je);
  if (!json_is_object(root)) {
    json_decref(root);
    return NULL;
  }
  json_t *kf = json_object();
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    json_t *v = json_object_get(root, names[i]);
    if (v)
      json_object_set(kf, names[i], v);
  }
  char *text = json_dumps(kf, JSON_COMPACT);
  json_decref(kf);
  kc_key_fields f;
  char err[KC_ERRBUF_SIZE], key[KC_HEX_LEN + 1];
  char *out = NULL;
  /* The manifest parser validated these fields already (the key is checked
   * last), so the key-fields parser must accept them too. */
  kc_err e = text ? kc_key_fields_parse(text, strlen(text), &f, err) : KC_NOMEM;
  FZ_CHECK(e == KC_OK,
           "manifest fields valid but kc_key_fields_parse refuses them: %s\n%s",
           err, text ? text : "(null)");
  FZ_CHECK(kc_key_compute(&f, key, err) == KC_OK, "key_compute: %s", err);
  json_object_set_new(root, "key", json_string(key));
  out = json_dumps(root, JSON_COMPACT);
  free(text);
  json_decref(root);
  return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[KC_ERRBUF_SIZE];
  static kc_manifest sentinel;
  kc_manifest *m = &sentinel; /* the parser must reset it to NULL */
  fz_err_reset(err);
  kc_err e = kc_manifest_parse((const char *)data, size, &m, err);
  if (e == KC_OK) {
    FZ_CHECK(m != NULL, "KC_OK without a manifest");
    round_trip(m);
    kc_manifest_free(m);
    return 0;
  }
  FZ_CHECK(m == NULL, "error %d but *out set", (int)e);
  fz_err_ok(err, 1, "kc_manifest_parse");
  FZ_CHECK(e == KC_BAD_JSON || e == KC_BAD_MANIFEST || e == KC_KEY_MISMATCH,
           "unexpected error code %d (%s): %s", (int)e, kc_strerror(e), err);
  if (e != KC_KEY_MISMATCH)
    return 0;

  char *fixed = with_computed_key(data, size);
  if (!fixed)
    return 0;
  fz_err_reset(err);
  e = kc_manifest_parse(fixed, strlen(fixed), &m, err);
  FZ_CHECK(e == KC_OK,
           "refused only for its key, but with the computed key: "
           "%s: %s\n%s",
           kc_strerror(e), err, fixed);
  round_trip(m);
  kc_manifest_free(m);
  free(fixed);
  kc_manifest_free(NULL);
  return 0;
}
