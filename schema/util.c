/* util.c: error formatting, typed jansson getters that name the failing field,
 * string vectors, canonical dumping and whole-file reads for schema/. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema_internal.h"

static kc_err kci_verr(char *err, kc_err code, const char *fmt, va_list ap) {
  if (!err)
    return code;
  vsnprintf(err, KC_ERRBUF_SIZE, fmt, ap);
  for (char *p = err; *p; p++)
    if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e)
      *p = '?';
  return code;
}

kc_err kci_err(char *err, kc_err code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  kci_verr(err, code, fmt, ap);
  va_end(ap);
  return code;
}

kc_err kci_bad(const kci_ctx *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  kci_verr(c->err, c->code, fmt, ap);
  va_end(ap);
  return c->code;
}

kc_err kci_load(const char *json, size_t len, json_t **out, char *err) {
  json_error_t je;
  *out = NULL;
  if (!json)
    return kci_err(err, KC_EINVAL, "json: NULL buffer");
  /* Duplicate keys would let two readers of one manifest disagree on it. */
  *out = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
  if (!*out)
    return kci_err(err, KC_BAD_JSON, "line %d, column %d: %s", je.line,
                   je.column, je.text);
  return KC_OK;
}

kc_err kci_unpack(const kci_ctx *c, json_t *obj, const char *what,
                  const char *fmt, ...) {
  json_error_t je;
  va_list ap;
  if (kci_type(c, obj, JSON_OBJECT, what))
    return c->code;
  va_start(ap, fmt);
  int rc = json_vunpack_ex(obj, &je, 0, fmt, ap);
  va_end(ap);
  if (rc == 0)
    return KC_OK;
  /* jansson lists the leftover keys after this phrase; keep just the list. */
  const char *tail = strstr(je.text, "left unpacked: ");
  if (tail)
    return kci_bad(c, "%s: unknown field(s): %s", what, tail + 15);
  return kci_bad(c, "%s: %s", what, je.text);
}

static const char *kci_type_name(json_type t) {
  switch (t) {
  case JSON_OBJECT:
    return "an object";
  case JSON_ARRAY:
    return "an array";
  case JSON_STRING:
    return "a string";
  case JSON_INTEGER:
    return "an integer";
  case JSON_REAL:
    return "a number";
  case JSON_TRUE:
  case JSON_FALSE:
    return "a boolean";
  default:
    return "null";
  }
}

kc_err kci_type(const kci_ctx *c, json_t *v, json_type t, const char *what) {
  if (!v)
    return kci_bad(c, "%s: missing", what);
  if (json_typeof(v) != t)
    return kci_bad(c, "%s: must be %s", what, kci_type_name(t));
  return KC_OK;
}

kc_err kci_str(const kci_ctx *c, json_t *v, const char *what,
               const char **out) {
  if (kci_type(c, v, JSON_STRING, what))
    return c->code;
  *out = json_string_value(v);
  /* C consumers see strings up to the first NUL: refuse hidden tails. */
  if (strlen(*out) != json_string_length(v))
    return kci_bad(c, "%s: contains a NUL byte", what);
  return KC_OK;
}

kc_err kci_uint(const kci_ctx *c, json_t *v, const char *what, uint64_t lo,
                uint64_t hi, uint64_t *out) {
  if (kci_type(c, v, JSON_INTEGER, what))
    return c->code;
  json_int_t x = json_integer_value(v);
  if (x < 0 || (uint64_t)x < lo)
    return kci_bad(c, "%s: value below %llu", what, (unsigned long long)lo);
  if ((uint64_t)x > hi) {
    if (hi == KC_BUCKET_VALUE_MAX)
      return kci_bad(c, "%s: value above 2^53", what);
    return kci_bad(c, "%s: value above %llu", what, (unsigned long long)hi);
  }
  *out = (uint64_t)x;
  return KC_OK;
}

void kci_strv_free(char **v, size_t n) {
  if (!v)
    return;
  for (size_t i = 0; i < n; i++)
    free(v[i]);
  free(v);
}

static kc_err kci_strv_item(const kci_ctx *c, json_t *v, const char *what,
                            size_t i, kci_check_fn check, char **out) {
  char w[KCI_WHAT_SIZE];
  const char *s = NULL;
  snprintf(w, sizeof w, "%s[%zu]", what, i);
  if (kci_str(c, json_array_get(v, i), w, &s))
    return c->code;
  if (check && !check(c, s, w))
    return c->code;
  if (!(*out = strdup(s)))
    return kci_err(c->err, KC_NOMEM, "%s: out of memory", w);
  return KC_OK;
}

kc_err kci_strv(const kci_ctx *c, json_t *v, const char *what,
                kci_check_fn check, char ***out, size_t *n) {
  *out = NULL;
  *n = 0;
  if (!v)
    return KC_OK;
  if (kci_type(c, v, JSON_ARRAY, what))
    return c->code;
  size_t len = json_array_size(v);
  if (len == 0)
    return KC_OK;
  char **sv = calloc(len, sizeof *sv);
  if (!sv)
    return kci_err(c->err, KC_NOMEM, "%s: out of memory", what);
  for (size_t i = 0; i < len; i++) {
    kc_err e = kci_strv_item(c, v, what, i, check, &sv[i]);
    if (e) {
      kci_strv_free(sv, len);
      return e;
    }
  }
  *out = sv;
  *n = len;
  return KC_OK;
}

kc_err kci_strv_dup(const char *const *src, size_t n, char ***out) {
  *out = NULL;
  if (n == 0)
    return KC_OK;
  char **v = calloc(n, sizeof *v);
  if (!v)
    return KC_NOMEM;
  for (size_t i = 0; i < n; i++) {
    if (!src[i] || !(v[i] = strdup(src[i]))) {
      kci_strv_free(v, n);
      return src[i] ? KC_NOMEM : KC_EINVAL;
    }
  }
  *out = v;
  return KC_OK;
}

static kc_err kci_io(char *err, const char *path, int e) {
  char buf[128];
  /* strerror is not reentrant; the GNU strerror_r returns the message. */
  const char *msg = strerror_r(e, buf, sizeof buf);
  return kci_err(err, KC_IO, "%s: %s", path, msg);
}

static kc_err kci_read_all(FILE *f, const char *path, char **out, size_t *len,
                           char *err) {
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  while (buf) {
    n += fread(buf + n, 1, cap - n - 1, f);
    if (n < cap - 1)
      break;
    char *bigger = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
    if (!bigger)
      free(buf);
    buf = bigger;
    cap *= 2;
  }
  if (!buf)
    return kci_err(err, KC_NOMEM, "%s: out of memory", path);
  if (ferror(f)) {
    free(buf);
    return kci_io(err, path, errno ? errno : EIO);
  }
  buf[n] = '\0';
  *out = buf;
  if (len)
    *len = n;
  return KC_OK;
}

kc_err kc_read_file(const char *path, char **out, size_t *len, char *err) {
  if (!path || !out)
    return kci_err(err, KC_EINVAL, "read_file: NULL argument");
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f)
    return kci_io(err, path, errno);
  kc_err e = kci_read_all(f, path, out, len, err);
  fclose(f);
  return e;
}
