/* manifest_parse.c: bundle manifest JSON -> kc_manifest. jansson's strict
 * unpack rejects unknown fields; every type and rule error names its field
 * ("files[2].path: '..' segment not allowed"). Mirrors bundle.schema.json. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema_internal.h"

#define BUNDLE_SCHEMA "kcache.bundle/v1"

static kc_err path_from_json(const kci_ctx *c, json_t *v, const char *what,
                             char **out) {
  const char *s = NULL;
  if (kci_str(c, v, what, &s))
    return c->code;
  if (kc_path_validate(s, what, c->err))
    return c->code;
  if (!(*out = strdup(s)))
    return kci_err(c->err, KC_NOMEM, "%s: out of memory", what);
  return KC_OK;
}

static kc_err kind_from_json(const kci_ctx *c, json_t *v, const char *what,
                             kc_file_kind *out) {
  const char *s = NULL;
  if (kci_str(c, v, what, &s))
    return c->code;
  if (kc_file_kind_parse(s, out) != 0)
    return kci_bad(c,
                   "%s: '%.40s' is not one of cubin, ptx, fatbin, ltoir, "
                   "file",
                   what, s);
  return KC_OK;
}

static kc_err file_from_json(const kci_ctx *c, json_t *v, size_t i,
                             kc_file *f) {
  char what[KCI_WHAT_SIZE], w[KCI_WHAT_SIZE];
  json_t *path = NULL, *sha = NULL, *size = NULL, *kind = NULL, *ent = NULL;
  const char *s = NULL;
  snprintf(what, sizeof what, "files[%zu]", i);
  if (kci_unpack(c, v, what, "{s?o s?o s?o s?o s?o !}", "path", &path, "sha256",
                 &sha, "size", &size, "kind", &kind, "entries", &ent))
    return c->code;
  snprintf(w, sizeof w, "files[%zu].path", i);
  if (path_from_json(c, path, w, &f->path))
    return c->code;
  snprintf(w, sizeof w, "files[%zu].sha256", i);
  if (kci_str(c, sha, w, &s) || !kci_check_hex(c, s, w))
    return c->code;
  memcpy(f->sha256, s, KC_HEX_LEN + 1);
  snprintf(w, sizeof w, "files[%zu].size", i);
  if (kci_uint(c, size, w, 0, KC_BUCKET_VALUE_MAX, &f->size))
    return c->code;
  snprintf(w, sizeof w, "files[%zu].kind", i);
  if (kind_from_json(c, kind, w, &f->kind))
    return c->code;
  snprintf(w, sizeof w, "files[%zu].entries", i);
  return kci_strv(c, ent, w, kci_check_ident, &f->entries, &f->n_entries);
}

static kc_err files_from_json(const kci_ctx *c, json_t *v, kc_manifest *m) {
  if (kci_type(c, v, JSON_ARRAY, "files"))
    return c->code;
  size_t n = json_array_size(v);
  if (n == 0)
    return kci_bad(c, "files: at least one file required");
  if (n > KC_MANIFEST_MAX_FILES)
    return kci_bad(c, "files: %zu files, at most %d in one bundle", n,
                   KC_MANIFEST_MAX_FILES);
  if (!(m->files = calloc(n, sizeof *m->files)))
    return kci_err(c->err, KC_NOMEM, "files: out of memory");
  m->n_files = n; /* zeroed slots free cleanly if a later one fails */
  for (size_t i = 0; i < n; i++)
    if (file_from_json(c, json_array_get(v, i), i, &m->files[i]))
      return c->code;
  return KC_OK;
}

/* An optional string field, copied. */
static kc_err opt_str(const kci_ctx *c, json_t *v, const char *what,
                      char **out) {
  const char *s = NULL;
  if (!v)
    return KC_OK;
  if (kci_str(c, v, what, &s))
    return c->code;
  if (!(*out = strdup(s)))
    return kci_err(c->err, KC_NOMEM, "%s: out of memory", what);
  return KC_OK;
}

static kc_err producer_from_json(const kci_ctx *c, json_t *v, kc_producer *p) {
  json_t *builder = NULL, *host = NULL, *secs = NULL, *created = NULL;
  if (!v)
    return KC_OK;
  if (kci_unpack(c, v, "producer", "{s?o s?o s?o s?o !}", "builder", &builder,
                 "host", &host, "seconds", &secs, "created", &created))
    return c->code;
  if (opt_str(c, builder, "producer.builder", &p->builder) ||
      opt_str(c, host, "producer.host", &p->host) ||
      opt_str(c, created, "producer.created", &p->created))
    return c->code;
  if (!secs)
    return KC_OK;
  if (!json_is_number(secs))
    return kci_bad(c, "producer.seconds: must be a number");
  p->seconds = json_number_value(secs);
  if (p->seconds < 0)
    return kci_bad(c, "producer.seconds: value below 0");
  return KC_OK;
}

static kc_err manifest_from_json(const kci_ctx *c, json_t *root,
                                 kc_manifest *m) {
  json_t *schema = NULL, *key = NULL, *files = NULL, *producer = NULL;
  kci_key_json j = {0};
  const char *s = NULL;
  if (kci_unpack(c, root, "manifest", "{s?o s?o s?o s?o s?o s?o s?o s?o s?o !}",
                 "schema", &schema, "key", &key, "model", &j.model, "bucket",
                 &j.bucket, "arch", &j.arch, "toolchain", &j.toolchain, "build",
                 &j.build, "files", &files, "producer", &producer))
    return c->code;
  if (kci_str(c, schema, "schema", &s))
    return c->code;
  if (strcmp(s, BUNDLE_SCHEMA) != 0)
    return kci_bad(c, "schema: must be '" BUNDLE_SCHEMA "'");
  if (kci_str(c, key, "key", &s) || !kci_check_hex(c, s, "key"))
    return c->code;
  memcpy(m->key, s, KC_HEX_LEN + 1);
  if (kci_key_from_json(c, &j, &m->fields) || files_from_json(c, files, m))
    return c->code;
  return producer_from_json(c, producer, &m->producer);
}

kc_err kc_manifest_parse(const char *json, size_t len, kc_manifest **out,
                         char *err) {
  json_t *root;
  if (!out)
    return kci_err(err, KC_EINVAL, "manifest: NULL output");
  *out = NULL;
  kc_err e = kci_load(json, len, &root, err);
  if (e)
    return e;
  e = kc_manifest_parse_json(root, out, err);
  json_decref(root);
  return e;
}

kc_err kc_manifest_parse_json(json_t *root, kc_manifest **out, char *err) {
  const kci_ctx c = {KC_BAD_MANIFEST, err};
  if (!out)
    return kci_err(err, KC_EINVAL, "manifest: NULL output");
  *out = NULL;
  kc_manifest *m = kc_manifest_new();
  kc_err e = m ? manifest_from_json(&c, root, m)
               : kci_err(err, KC_NOMEM, "manifest: out of memory");
  /* The struct rules (unique paths) and then the key, which is only worth
   * hashing once everything else holds. */
  if (!e)
    e = kc_manifest_validate(m, err);
  if (!e)
    e = kc_manifest_check_key(m, err);
  if (e) {
    kc_manifest_free(m);
    return e;
  }
  *out = m;
  return KC_OK;
}
