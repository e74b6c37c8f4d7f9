/* key.c: bundle keys: validation, canonical key JSON (sorted keys,
 * compact) and its SHA-256, parsing key fields, editing the toolchain. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema_internal.h"

kc_err kc_key_validate(const kc_key_fields *f, char *err) {
  const kci_ctx c = {KC_BAD_KEY, err};
  if (!f)
    return kci_err(err, KC_EINVAL, "key fields: NULL");
  return kci_key_check(&c, f);
}

/* The canonical key JSON of valid fields (json_out.c): sorted keys,
 * compact, "v":1 last. NULL when out of memory. */
static char *canonical(const kc_key_fields *f) {
  kci_jbuf b = {0};
  kci_jb_lit(&b, "{\"arch\":");
  kci_jb_str(&b, f->arch);
  kci_jb_lit(&b, ",\"bucket\":");
  kci_jb_bucket(&b, &f->bucket);
  kci_jb_lit(&b, ",\"build\":");
  kci_jb_str(&b, f->build);
  kci_jb_lit(&b, ",\"model\":");
  kci_jb_str(&b, f->model);
  kci_jb_lit(&b, ",\"toolchain\":");
  kci_jb_tools(&b, f->tools, f->n_tools);
  kci_jb_lit(&b, ",\"v\":1}");
  return kci_jb_take(&b);
}

kc_err kc_key_canonical(const kc_key_fields *f, char **out, char *err) {
  if (!out)
    return kci_err(err, KC_EINVAL, "key: NULL output");
  *out = NULL;
  kc_err e = kc_key_validate(f, err);
  if (e)
    return e;
  if (!(*out = canonical(f)))
    return kci_err(err, KC_NOMEM, "key: out of memory");
  return KC_OK;
}

kc_err kc_key_compute(const kc_key_fields *f, char key[KC_HEX_LEN + 1],
                      char *err) {
  char *canon;
  if (!key)
    return kci_err(err, KC_EINVAL, "key: NULL output");
  kc_err e = kc_key_canonical(f, &canon, err);
  if (e)
    return e;
  e = kc_sha256_hex(canon, strlen(canon), key);
  free(canon);
  if (e)
    return kci_err(err, e, "key: %s", kc_strerror(e));
  return KC_OK;
}

static kc_err key_fields_from(const kci_ctx *c, json_t *root,
                              kc_key_fields *f) {
  kci_key_json j = {0};
  json_t *v = NULL;
  if (kci_unpack(c, root, "key fields", "{s?o s?o s?o s?o s?o s?o !}", "model",
                 &j.model, "bucket", &j.bucket, "arch", &j.arch, "toolchain",
                 &j.toolchain, "build", &j.build, "v", &v))
    return c->code;
  /* v is optional in input (the canonical form always carries it) */
  if (v && !(json_is_integer(v) && json_integer_value(v) == 1))
    return kci_bad(c, "v: must be 1");
  return kci_key_from_json(c, &j, f);
}

kc_err kc_key_fields_parse(const char *json, size_t len, kc_key_fields *out,
                           char *err) {
  const kci_ctx c = {KC_BAD_KEY, err};
  kc_key_fields f;
  json_t *root;
  if (!out)
    return kci_err(err, KC_EINVAL, "key fields: NULL output");
  kc_err e = kci_load(json, len, &root, err);
  if (e)
    return e;
  e = key_fields_from(&c, root, &f);
  json_decref(root);
  if (e == KC_OK)
    *out = f; /* out is untouched on failure */
  return e;
}

kc_err kc_key_set_tool(kc_key_fields *f, const char *name, const char *value,
                       char *err) {
  const kci_ctx c = {KC_BAD_KEY, err};
  if (!f || !name || !value)
    return kci_err(err, KC_EINVAL, "toolchain: NULL argument");
  if (!kci_check_tool_name(&c, name, "toolchain"))
    return c.code;
  char w[KCI_WHAT_SIZE];
  snprintf(w, sizeof w, "toolchain.%s", name);
  if (!kci_check_tool_value(&c, value, w))
    return c.code;
  kc_tool t = {{0}, {0}}; /* the checks bound both lengths */
  memcpy(t.name, name, strlen(name) + 1);
  memcpy(t.value, value, strlen(value) + 1);
  if (kci_tools_check(&c, f->tools, f->n_tools, "toolchain"))
    return c.code;
  for (size_t i = 0; i < f->n_tools; i++) {
    if (strcmp(f->tools[i].name, name) == 0) {
      f->tools[i] = t;
      return KC_OK;
    }
  }
  if (f->n_tools == KC_MAX_TOOLS)
    return kci_bad(&c, "toolchain: full (at most 32 entries)");
  f->tools[f->n_tools++] = t;
  return KC_OK;
}
