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

/* ---- canonical JSON ----
 * Written directly rather than built as jansson objects and dumped: a warm
 * of 1024 bundles computes 2048 keys (its own, and each served manifest's
 * checked), and jansson's objects were most of that cost. The bytes are
 * exactly kci_dump(kci_key_to_json(f)) (test_schema compares them): keys
 * sorted by strcmp, no spaces, integers in decimal. Validated fields need
 * no escaping but for '"' and '\\' in tool values (printable ASCII); names
 * are [a-z0-9_.-]. */

/* Room for any valid fields: each byte of the struct at most twice (a
 * value's escapes; a name's quotes, colon and comma fit in its NUL and
 * padding), and the fixed text. */
#define KEY_CANON_MAX (2 * sizeof(kc_key_fields) + 128)

typedef struct kbuf {
  char *p;
  size_t n;
} kbuf;

static void put(kbuf *b, const char *s) {
  size_t k = strlen(s);
  memcpy(b->p + b->n, s, k);
  b->n += k;
}

static void put_str(kbuf *b, const char *s) {
  b->p[b->n++] = '"';
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      b->p[b->n++] = '\\';
    b->p[b->n++] = *s;
  }
  b->p[b->n++] = '"';
}

/* ix[0..n): the order of n names (stride bytes apart from first) by
 * strcmp; n is at most KC_MAX_TOOLS. */
static void sort_names(const char *first, size_t stride, size_t n,
                       size_t *ix) {
  for (size_t i = 0; i < n; i++) {
    size_t j = i;
    for (; j && strcmp(first + ix[j - 1] * stride, first + i * stride) > 0;
         j--)
      ix[j] = ix[j - 1];
    ix[j] = i;
  }
}

/* The canonical JSON of valid fields into out (KEY_CANON_MAX bytes). */
static size_t canonical_into(const kc_key_fields *f, char *out) {
  kbuf b = {out, 0};
  size_t ix[KC_MAX_TOOLS > KC_MAX_DIMS ? KC_MAX_TOOLS : KC_MAX_DIMS];
  char num[24];
  put(&b, "{\"arch\":");
  put_str(&b, f->arch);
  put(&b, ",\"bucket\":{");
  sort_names(f->bucket.dims[0].name, sizeof f->bucket.dims[0], f->bucket.n,
             ix);
  for (size_t i = 0; i < f->bucket.n; i++) {
    const kc_dim *d = &f->bucket.dims[ix[i]];
    put(&b, i ? "," : "");
    put_str(&b, d->name);
    snprintf(num, sizeof num, ":%llu", (unsigned long long)d->value);
    put(&b, num);
  }
  put(&b, "},\"build\":");
  put_str(&b, f->build);
  put(&b, ",\"model\":");
  put_str(&b, f->model);
  put(&b, ",\"toolchain\":{");
  sort_names(f->tools[0].name, sizeof f->tools[0], f->n_tools, ix);
  for (size_t i = 0; i < f->n_tools; i++) {
    put(&b, i ? "," : "");
    put_str(&b, f->tools[ix[i]].name);
    put(&b, ":");
    put_str(&b, f->tools[ix[i]].value);
  }
  put(&b, "},\"v\":1}");
  b.p[b.n] = '\0';
  return b.n;
}

kc_err kc_key_canonical(const kc_key_fields *f, char **out, char *err) {
  if (!out)
    return kci_err(err, KC_EINVAL, "key: NULL output");
  *out = NULL;
  kc_err e = kc_key_validate(f, err);
  if (e)
    return e;
  char buf[KEY_CANON_MAX];
  size_t n = canonical_into(f, buf);
  if (!(*out = malloc(n + 1)))
    return kci_err(err, KC_NOMEM, "key: out of memory");
  memcpy(*out, buf, n + 1);
  return KC_OK;
}

kc_err kc_key_compute(const kc_key_fields *f, char key[KC_HEX_LEN + 1],
                      char *err) {
  char buf[KEY_CANON_MAX];
  if (!key)
    return kci_err(err, KC_EINVAL, "key: NULL output");
  kc_err e = kc_key_validate(f, err);
  if (e)
    return e;
  e = kc_sha256_hex(buf, canonical_into(f, buf), key);
  if (e)
    return kci_err(err, e, "key: %s", kc_strerror(e));
  return KC_OK;
}

static kc_err key_fields_from(const kci_ctx *c, json_t *root,
                              kc_key_fields *f) {
  kci_key_json j = {0};
  json_t *v = NULL;
  if (kci_unpack(c, root, "key fields", "{s?o s?o s?o s?o s?o s?o !}",
                 "model", &j.model, "bucket", &j.bucket, "arch", &j.arch,
                 "toolchain", &j.toolchain, "build", &j.build, "v", &v))
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
