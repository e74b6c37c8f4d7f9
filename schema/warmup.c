/* warmup.c: warmup manifests (what a service or CI job wants warm): parsing,
 * validation that names the failing field, and resolving kernel sources
 * against the manifest's directory. Mirrors warmup.schema.json. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema_internal.h"

#define WARMUP_SCHEMA "kcache.warmup/v1"
#define DEFAULT_TIMEOUT_S 600
#define MAX_TIMEOUT_S 86400
#define KERNEL_NAME_MAX 64
#define KERNEL_NAME_RULE "[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}"

void kc_warmup_free(kc_warmup *w) {
  if (!w)
    return;
  free(w->model_name);
  free(w->archs);
  for (size_t i = 0; i < w->n_kernels; i++) {
    free(w->kernels[i].name);
    free(w->kernels[i].source);
    kci_strv_free(w->kernels[i].entries, w->kernels[i].n_entries);
    kci_strv_free(w->kernels[i].options, w->kernels[i].n_options);
  }
  free(w->kernels);
  kci_strv_free(w->command, w->n_command);
  free(w->buckets);
  free(w->base_dir);
  free(w);
}

/* ---- model, archs ---- */

static kc_err model_from_json(const kci_ctx *c, json_t *v, kc_warmup *w) {
  json_t *name = NULL, *hash = NULL;
  const char *s = NULL;
  if (kci_unpack(c, v, "model", "{s?o s?o !}", "name", &name, "hash", &hash))
    return c->code;
  if (kci_str(c, name, "model.name", &s))
    return c->code;
  size_t n = strlen(s);
  int ok = n >= 1 && n <= 255;
  for (size_t i = 0; ok && i < n; i++)
    ok = (unsigned char)s[i] >= 0x20 && s[i] != 0x7f;
  if (!ok)
    return kci_bad(c, "model.name: must be 1 to 255 bytes without control "
                      "characters");
  if (!(w->model_name = strdup(s)))
    return kci_err(c->err, KC_NOMEM, "model.name: out of memory");
  if (kci_str(c, hash, "model.hash", &s) || !kci_check_hex(c, s, "model.hash"))
    return c->code;
  memcpy(w->model_hash, s, KC_HEX_LEN + 1);
  return KC_OK;
}

static kc_err arch_from_json(const kci_ctx *c, json_t *v, size_t i,
                             kc_warmup *w) {
  char what[KCI_WHAT_SIZE];
  const char *s = NULL;
  snprintf(what, sizeof what, "archs[%zu]", i);
  if (kci_str(c, v, what, &s) || !kci_check_arch(c, s, what))
    return c->code;
  for (size_t j = 0; j < i; j++)
    if (strcmp(w->archs[j], s) == 0)
      return kci_bad(c, "%s: duplicate of archs[%zu] '%s'", what, j, s);
  memcpy(w->archs[i], s, strlen(s) + 1);
  return KC_OK;
}

/* Absent: the local GPU's archs, detected by the client. */
static kc_err archs_from_json(const kci_ctx *c, json_t *v, kc_warmup *w) {
  if (!v)
    return KC_OK;
  if (kci_type(c, v, JSON_ARRAY, "archs"))
    return c->code;
  size_t n = json_array_size(v);
  /* An empty list is more likely a mistake than a wish to detect. */
  if (n == 0)
    return kci_bad(c, "archs: empty (leave it out to use the local GPU's)");
  if (!(w->archs = calloc(n, sizeof *w->archs)))
    return kci_err(c->err, KC_NOMEM, "archs: out of memory");
  for (size_t i = 0; i < n; i++)
    if (arch_from_json(c, json_array_get(v, i), i, w))
      return c->code;
  w->n_archs = n;
  return KC_OK;
}

/* ---- kernels ---- */

static int check_kernel_name(const kci_ctx *c, const char *s,
                             const char *what) {
  size_t n = strlen(s);
  /* The name becomes a file name in the bundle: no '/', no leading '.'. */
  int ok = n >= 1 && n <= KERNEL_NAME_MAX && s[0] != '.' && s[0] != '-';
  for (size_t i = 0; ok && i < n; i++)
    ok = (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
         (s[i] >= '0' && s[i] <= '9') || strchr("_.-", s[i]);
  if (!ok)
    kci_bad(
        c, "%s: '%.40s' is not a valid kernel name (want " KERNEL_NAME_RULE ")",
        what, s);
  return ok;
}

static char *resolve(const char *base, const char *src) {
  if (src[0] == '/' || !base || strcmp(base, ".") == 0)
    return strdup(src);
  size_t bl = strlen(base);
  int slash = bl > 0 && base[bl - 1] == '/';
  char *p = malloc(bl + 1 + strlen(src) + 1);
  if (p)
    sprintf(p, "%s%s%s", base, slash ? "" : "/", src);
  return p;
}

static kc_err source_from_json(const kci_ctx *c, json_t *v, const char *what,
                               const char *base, char **out) {
  const char *s = NULL;
  if (kci_str(c, v, what, &s))
    return c->code;
  if (!*s)
    return kci_bad(c, "%s: empty", what);
  if (!(*out = resolve(base, s)))
    return kci_err(c->err, KC_NOMEM, "%s: out of memory", what);
  return KC_OK;
}

static kc_err kernel_from_json(const kci_ctx *c, json_t *v, size_t i,
                               const char *base, kc_kernel *k) {
  char what[KCI_WHAT_SIZE], w[KCI_WHAT_SIZE];
  json_t *name = NULL, *src = NULL, *ent = NULL, *opt = NULL;
  const char *s = NULL;
  snprintf(what, sizeof what, "kernels[%zu]", i);
  if (kci_unpack(c, v, what, "{s?o s?o s?o s?o !}", "name", &name, "source",
                 &src, "entries", &ent, "options", &opt))
    return c->code;
  snprintf(w, sizeof w, "kernels[%zu].name", i);
  if (kci_str(c, name, w, &s) || !check_kernel_name(c, s, w))
    return c->code;
  if (!(k->name = strdup(s)))
    return kci_err(c->err, KC_NOMEM, "%s: out of memory", w);
  snprintf(w, sizeof w, "kernels[%zu].source", i);
  if (source_from_json(c, src, w, base, &k->source))
    return c->code;
  snprintf(w, sizeof w, "kernels[%zu].entries", i);
  if (kci_strv(c, ent, w, kci_check_ident, &k->entries, &k->n_entries))
    return c->code;
  snprintf(w, sizeof w, "kernels[%zu].options", i);
  return kci_strv(c, opt, w, NULL, &k->options, &k->n_options);
}

static kc_err kernels_from_json(const kci_ctx *c, json_t *v, kc_warmup *w) {
  if (kci_type(c, v, JSON_ARRAY, "kernels"))
    return c->code;
  size_t n = json_array_size(v);
  if (n == 0)
    return kci_bad(c, "kernels: empty (at least one kernel)");
  if (!(w->kernels = calloc(n, sizeof *w->kernels)))
    return kci_err(c->err, KC_NOMEM, "kernels: out of memory");
  w->n_kernels = n;
  for (size_t i = 0; i < n; i++) {
    kc_kernel *k = &w->kernels[i];
    if (kernel_from_json(c, json_array_get(v, i), i, w->base_dir, k))
      return c->code;
    /* Kernels are bundled under their names, which must not collide. */
    for (size_t j = 0; j < i; j++)
      if (strcmp(w->kernels[j].name, k->name) == 0)
        return kci_bad(c,
                       "kernels[%zu].name: duplicate of kernels[%zu].name "
                       "'%s'",
                       i, j, k->name);
  }
  return KC_OK;
}

/* ---- command builder ---- */

static kc_err builder_from_json(const kci_ctx *c, json_t *v, kc_warmup *w) {
  json_t *cmd = NULL, *timeout = NULL;
  uint64_t t = DEFAULT_TIMEOUT_S;
  if (kci_unpack(c, v, "builder", "{s?o s?o !}", "command", &cmd, "timeout_s",
                 &timeout))
    return c->code;
  if (kci_type(c, cmd, JSON_ARRAY, "builder.command"))
    return c->code;
  if (json_array_size(cmd) == 0)
    return kci_bad(c, "builder.command: empty (give the program and its "
                      "arguments)");
  if (kci_strv(c, cmd, "builder.command", NULL, &w->command, &w->n_command))
    return c->code;
  if (w->command[0][0] == '\0')
    return kci_bad(c, "builder.command[0]: empty");
  if (timeout &&
      kci_uint(c, timeout, "builder.timeout_s", 1, MAX_TIMEOUT_S, &t))
    return c->code;
  w->timeout_s = (int)t;
  return KC_OK;
}

/* ---- buckets ---- */

typedef struct sorted_bucket {
  kc_bucket b; /* dims in name order, so equal buckets compare equal */
  size_t index;
} sorted_bucket;

static int cmp_dim(const void *a, const void *b) {
  return strcmp(((const kc_dim *)a)->name, ((const kc_dim *)b)->name);
}

static int cmp_bucket(const void *pa, const void *pb) {
  const sorted_bucket *a = pa, *b = pb;
  if (a->b.n != b->b.n)
    return a->b.n < b->b.n ? -1 : 1;
  for (size_t i = 0; i < a->b.n; i++) {
    int r = strcmp(a->b.dims[i].name, b->b.dims[i].name);
    if (r)
      return r;
    if (a->b.dims[i].value != b->b.dims[i].value)
      return a->b.dims[i].value < b->b.dims[i].value ? -1 : 1;
  }
  return a->index < b->index ? -1 : a->index > b->index;
}

static kc_err check_unique_buckets(const kci_ctx *c, const kc_warmup *w) {
  sorted_bucket *s = malloc(w->n_buckets * sizeof *s);
  kc_err e = KC_OK;
  if (!s)
    return kci_err(c->err, KC_NOMEM, "buckets: out of memory");
  for (size_t i = 0; i < w->n_buckets; i++) {
    s[i].b = w->buckets[i];
    s[i].index = i;
    qsort(s[i].b.dims, s[i].b.n, sizeof(kc_dim), cmp_dim);
  }
  qsort(s, w->n_buckets, sizeof *s, cmp_bucket);
  for (size_t i = 1; i < w->n_buckets && !e; i++) {
    sorted_bucket a = s[i - 1], b = s[i];
    a.index = b.index = 0;
    if (cmp_bucket(&a, &b) == 0)
      e = kci_bad(c, "buckets[%zu]: duplicate of buckets[%zu]", s[i].index,
                  s[i - 1].index);
  }
  free(s);
  return e;
}

static kc_err buckets_from_json(const kci_ctx *c, json_t *v, kc_warmup *w) {
  char what[KCI_WHAT_SIZE];
  if (kci_type(c, v, JSON_ARRAY, "buckets"))
    return c->code;
  size_t n = json_array_size(v);
  if (n == 0)
    return kci_bad(c, "buckets: empty (at least one bucket)");
  if (!(w->buckets = calloc(n, sizeof *w->buckets)))
    return kci_err(c->err, KC_NOMEM, "buckets: out of memory");
  for (size_t i = 0; i < n; i++) {
    snprintf(what, sizeof what, "buckets[%zu]", i);
    if (kci_bucket_from_json(c, json_array_get(v, i), what, &w->buckets[i]))
      return c->code;
    w->n_buckets = i + 1;
  }
  return check_unique_buckets(c, w);
}

/* ---- the document ---- */

static kc_err build_from_json(const kci_ctx *c, json_t *kernels,
                              json_t *builder, kc_warmup *w) {
  if (kernels && builder)
    return kci_bad(c, "builder: not allowed together with kernels (give one)");
  if (!kernels && !builder)
    return kci_bad(c, "kernels: missing (give kernels or builder)");
  return kernels ? kernels_from_json(c, kernels, w)
                 : builder_from_json(c, builder, w);
}

static kc_err warmup_from_json(const kci_ctx *c, json_t *root, kc_warmup *w) {
  json_t *schema = NULL, *model = NULL, *archs = NULL, *tools = NULL,
         *kernels = NULL, *builder = NULL, *buckets = NULL;
  const char *s = NULL;
  if (kci_unpack(c, root, "warmup", "{s?o s?o s?o s?o s?o s?o s?o !}", "schema",
                 &schema, "model", &model, "archs", &archs, "toolchain", &tools,
                 "kernels", &kernels, "builder", &builder, "buckets", &buckets))
    return c->code;
  if (kci_str(c, schema, "schema", &s))
    return c->code;
  if (strcmp(s, WARMUP_SCHEMA) != 0)
    return kci_bad(c, "schema: must be '" WARMUP_SCHEMA "'");
  if (model_from_json(c, model, w) || archs_from_json(c, archs, w))
    return c->code;
  if (tools &&
      kci_tools_from_json(c, tools, "toolchain", w->tools, &w->n_tools))
    return c->code;
  if (build_from_json(c, kernels, builder, w))
    return c->code;
  return buckets_from_json(c, buckets, w);
}

kc_err kc_warmup_parse(const char *json, size_t len, const char *base_dir,
                       kc_warmup **out, char *err) {
  const kci_ctx c = {KC_BAD_WARMUP, err};
  json_t *root;
  if (!out)
    return kci_err(err, KC_EINVAL, "warmup: NULL output");
  *out = NULL;
  kc_err e = kci_load(json, len, &root, err);
  if (e)
    return e;
  kc_warmup *w = calloc(1, sizeof *w);
  if (w) {
    w->timeout_s = DEFAULT_TIMEOUT_S;
    w->base_dir = strdup(base_dir ? base_dir : ".");
  }
  if (!w || !w->base_dir)
    e = kci_err(err, KC_NOMEM, "warmup: out of memory");
  else
    e = warmup_from_json(&c, root, w);
  json_decref(root);
  if (e) {
    kc_warmup_free(w);
    return e;
  }
  *out = w;
  return KC_OK;
}

/* The directory part of path: "a/b.json" -> "a", "b.json" -> ".". */
static char *dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash)
    return strdup(".");
  size_t n = slash == path ? 1 : (size_t)(slash - path);
  char *d = malloc(n + 1);
  if (d) {
    memcpy(d, path, n);
    d[n] = '\0';
  }
  return d;
}

kc_err kc_warmup_load(const char *path, kc_warmup **out, char *err) {
  char *text, inner[KC_ERRBUF_SIZE] = "";
  size_t len;
  if (!path || !out)
    return kci_err(err, KC_EINVAL, "warmup: NULL argument");
  *out = NULL;
  kc_err e = kc_read_file(path, &text, &len, err);
  if (e)
    return e;
  char *dir = dir_of(path);
  if (dir)
    e = kc_warmup_parse(text, len, dir, out, inner);
  else
    e = kci_err(inner, KC_NOMEM, "out of memory");
  free(dir);
  free(text);
  /* Name the file (a CI log may show several manifests), once: a read
   * error from kc_read_file names it already, so only a parse error gets
   * the prefix, and callers print err as it is. */
  if (e)
    return kci_err(err, e, "%s: %s", path, inner);
  return KC_OK;
}
