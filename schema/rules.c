/* rules.c: the field rules of docs/DESIGN.md's key table (hex digests, arch,
 * bucket, toolchain), checked on C structs and on jansson values, and the
 * conversions between the two. Keys, bundle and warmup manifests share them. */
#include <stdio.h>
#include <string.h>

#include "schema_internal.h"

#define DIM_NAME_RULE "[a-z][a-z0-9_]{0,31}"
#define TOOL_NAME_RULE "[a-z][a-z0-9_.-]{0,31}"
#define ARCH_RULE "(sm|compute)_[0-9]{2,3}[af]?"

static int lower(char ch) { return ch >= 'a' && ch <= 'z'; }
static int digit(char ch) { return ch >= '0' && ch <= '9'; }

int kc_arch_valid(const char *arch) {
  const char *p;
  if (!arch)
    return 0;
  if (strncmp(arch, "sm_", 3) == 0)
    p = arch + 3;
  else if (strncmp(arch, "compute_", 8) == 0)
    p = arch + 8;
  else
    return 0;
  size_t nd = 0;
  while (digit(p[nd]))
    nd++;
  if (nd < 2 || nd > 3)
    return 0;
  p += nd;
  if (*p == 'a' || *p == 'f')
    p++;
  return *p == '\0';
}

/* name matches [a-z][a-z0-9_<extra>]{0,31} */
static int name_ok(const char *s, const char *extra) {
  size_t n = strlen(s);
  if (n < 1 || n > KC_NAME_MAX || !lower(s[0]))
    return 0;
  for (size_t i = 1; i < n; i++)
    if (!lower(s[i]) && !digit(s[i]) && s[i] != '_' && !strchr(extra, s[i]))
      return 0;
  return 1;
}

int kci_check_term(const kci_ctx *c, const char *s, size_t cap,
                   const char *what) {
  if (memchr(s, '\0', cap))
    return 1;
  kci_bad(c, "%s: not NUL-terminated", what);
  return 0;
}

int kci_check_hex(const kci_ctx *c, const char *s, const char *what) {
  if (kc_is_hex64(s))
    return 1;
  kci_bad(c, "%s: must be 64 lowercase hex digits", what);
  return 0;
}

int kci_check_arch(const kci_ctx *c, const char *s, const char *what) {
  if (kc_arch_valid(s))
    return 1;
  kci_bad(c, "%s: '%.40s' is not a valid arch (want " ARCH_RULE ")", what, s);
  return 0;
}

int kci_check_ident(const kci_ctx *c, const char *s, const char *what) {
  size_t n = strlen(s);
  if (n > KC_PATH_MAX) {
    kci_bad(c, "%s: longer than 255 bytes", what);
    return 0;
  }
  int ok =
      n > 0 && (lower(s[0]) || (s[0] >= 'A' && s[0] <= 'Z') || s[0] == '_');
  for (size_t i = 1; ok && i < n; i++)
    ok = lower(s[i]) || (s[i] >= 'A' && s[i] <= 'Z') || digit(s[i]) ||
         s[i] == '_';
  if (!ok)
    kci_bad(c, "%s: '%.40s' is not a C identifier", what, s);
  return ok;
}

static int check_dim_name(const kci_ctx *c, const char *s, const char *what) {
  if (name_ok(s, ""))
    return 1;
  kci_bad(c, "%s: invalid name '%.40s' (want " DIM_NAME_RULE ")", what, s);
  return 0;
}

int kci_check_tool_name(const kci_ctx *c, const char *s, const char *what) {
  if (name_ok(s, ".-"))
    return 1;
  kci_bad(c, "%s: invalid name '%.40s' (want " TOOL_NAME_RULE ")", what, s);
  return 0;
}

/* what is the entry's own name ("toolchain.cuda"). */
int kci_check_tool_value(const kci_ctx *c, const char *s, const char *what) {
  size_t n = strlen(s);
  if (n > KC_TOOL_VALUE_MAX) {
    kci_bad(c, "%s: value longer than 128 bytes", what);
    return 0;
  }
  for (size_t i = 0; i < n; i++) {
    if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e) {
      kci_bad(c, "%s: value must be printable ASCII (0x20-0x7e)", what);
      return 0;
    }
  }
  return 1;
}

static kc_err check_dim(const kci_ctx *c, const kc_dim *d, const char *what) {
  char w[KCI_WHAT_SIZE];
  if (!kci_check_term(c, d->name, sizeof d->name, what) ||
      !check_dim_name(c, d->name, what))
    return c->code;
  snprintf(w, sizeof w, "%s.%s", what, d->name);
  if (d->value > KC_BUCKET_VALUE_MAX)
    return kci_bad(c, "%s: value above 2^53", w);
  return KC_OK;
}

kc_err kci_bucket_check(const kci_ctx *c, const kc_bucket *b,
                        const char *what) {
  if (b->n < 1)
    return kci_bad(c, "%s: empty (1 to 16 entries)", what);
  if (b->n > KC_MAX_DIMS)
    return kci_bad(c, "%s: %zu entries (at most 16)", what, b->n);
  for (size_t i = 0; i < b->n; i++) {
    if (check_dim(c, &b->dims[i], what))
      return c->code;
    for (size_t j = 0; j < i; j++)
      if (strcmp(b->dims[i].name, b->dims[j].name) == 0)
        return kci_bad(c, "%s: duplicate name '%s'", what, b->dims[i].name);
  }
  return KC_OK;
}

static kc_err check_tool(const kci_ctx *c, const kc_tool *t, const char *what) {
  char w[KCI_WHAT_SIZE];
  if (!kci_check_term(c, t->name, sizeof t->name, what) ||
      !kci_check_tool_name(c, t->name, what))
    return c->code;
  snprintf(w, sizeof w, "%s.%s", what, t->name);
  if (!kci_check_term(c, t->value, sizeof t->value, w) ||
      !kci_check_tool_value(c, t->value, w))
    return c->code;
  return KC_OK;
}

kc_err kci_tools_check(const kci_ctx *c, const kc_tool *t, size_t n,
                       const char *what) {
  if (n > KC_MAX_TOOLS)
    return kci_bad(c, "%s: %zu entries (at most 32)", what, n);
  for (size_t i = 0; i < n; i++) {
    if (check_tool(c, &t[i], what))
      return c->code;
    for (size_t j = 0; j < i; j++)
      if (strcmp(t[i].name, t[j].name) == 0)
        return kci_bad(c, "%s: duplicate name '%s'", what, t[i].name);
  }
  return KC_OK;
}

kc_err kci_key_check(const kci_ctx *c, const kc_key_fields *f) {
  if (!kci_check_term(c, f->model, sizeof f->model, "model") ||
      !kci_check_hex(c, f->model, "model") ||
      !kci_check_term(c, f->build, sizeof f->build, "build") ||
      !kci_check_hex(c, f->build, "build") ||
      !kci_check_term(c, f->arch, sizeof f->arch, "arch") ||
      !kci_check_arch(c, f->arch, "arch"))
    return c->code;
  if (kci_bucket_check(c, &f->bucket, "bucket"))
    return c->code;
  return kci_tools_check(c, f->tools, f->n_tools, "toolchain");
}

/* ---- from jansson ---- */

kc_err kci_bucket_from_json(const kci_ctx *c, json_t *v, const char *what,
                            kc_bucket *b) {
  char w[KCI_WHAT_SIZE];
  const char *name;
  json_t *val;
  if (kci_type(c, v, JSON_OBJECT, what))
    return c->code;
  size_t n = json_object_size(v);
  if (n < 1 || n > KC_MAX_DIMS)
    return kci_bucket_check(c, &(kc_bucket){.n = n}, what);
  memset(b, 0, sizeof *b);
  json_object_foreach(v, name, val) {
    if (!check_dim_name(c, name, what))
      return c->code;
    kc_dim *d = &b->dims[b->n++];
    snprintf(w, sizeof w, "%s.%s", what, name);
    if (kci_uint(c, val, w, 0, KC_BUCKET_VALUE_MAX, &d->value))
      return c->code;
    memcpy(d->name, name, strlen(name) + 1);
  }
  return kci_bucket_check(c, b, what);
}

kc_err kci_tools_from_json(const kci_ctx *c, json_t *v, const char *what,
                           kc_tool *t, size_t *n) {
  char w[KCI_WHAT_SIZE];
  const char *name, *s = NULL;
  json_t *val;
  if (kci_type(c, v, JSON_OBJECT, what))
    return c->code;
  if (json_object_size(v) > KC_MAX_TOOLS)
    return kci_bad(c, "%s: %zu entries (at most 32)", what,
                   json_object_size(v));
  *n = 0;
  json_object_foreach(v, name, val) {
    if (!kci_check_tool_name(c, name, what))
      return c->code;
    snprintf(w, sizeof w, "%s.%s", what, name);
    if (kci_str(c, val, w, &s) || !kci_check_tool_value(c, s, w))
      return c->code;
    kc_tool *tool = &t[(*n)++];
    memset(tool, 0, sizeof *tool);
    memcpy(tool->name, name, strlen(name) + 1);
    memcpy(tool->value, s, strlen(s) + 1);
  }
  return KC_OK;
}

/* Copies a string field that check accepted into a fixed array of cap. */
static kc_err fixed_from_json(const kci_ctx *c, json_t *v, const char *what,
                              kci_check_fn check, char *out, size_t cap) {
  const char *s = NULL;
  if (kci_str(c, v, what, &s) || !check(c, s, what))
    return c->code;
  if (strlen(s) >= cap) /* the checks bound the length; stay safe anyway */
    return kci_bad(c, "%s: too long", what);
  memcpy(out, s, strlen(s) + 1);
  return KC_OK;
}

kc_err kci_key_from_json(const kci_ctx *c, const kci_key_json *j,
                         kc_key_fields *f) {
  memset(f, 0, sizeof *f);
  if (fixed_from_json(c, j->model, "model", kci_check_hex, f->model,
                      sizeof f->model) ||
      kci_bucket_from_json(c, j->bucket, "bucket", &f->bucket) ||
      fixed_from_json(c, j->arch, "arch", kci_check_arch, f->arch,
                      sizeof f->arch) ||
      kci_tools_from_json(c, j->toolchain, "toolchain", f->tools,
                          &f->n_tools) ||
      fixed_from_json(c, j->build, "build", kci_check_hex, f->build,
                      sizeof f->build))
    return c->code;
  return KC_OK;
}
