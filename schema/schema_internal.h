/* schema_internal.h: helpers shared by the schema/ sources only (not
 * installed, not for other modules): error formatting, typed jansson getters
 * that name the failing field, and the bucket/toolchain/key-field rules that
 * keys, bundle manifests and warmup manifests have in common.
 *
 * jansson appears here and never in kc_schema.h, so that other modules do not
 * inherit its headers through ours.
 */
#ifndef KC_SCHEMA_INTERNAL_H
#define KC_SCHEMA_INTERNAL_H

#include <jansson.h>

#include "kc_schema.h"

/* Room for a field name in messages: "buckets[123].<32-byte name>" and more. */
#define KCI_WHAT_SIZE 128

/* Like kc_errf, but the message is forced to printable ASCII: messages quote
 * user input and end up in HTTP JSON bodies and logs, so they must never carry
 * control bytes or a UTF-8 sequence cut in half by truncation. */
kc_err kci_err(char *err, kc_err code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Where a parse reports: the error code of this document kind (KC_BAD_KEY,
 * KC_BAD_MANIFEST, KC_BAD_WARMUP) and the caller's buffer (may be NULL). */
typedef struct kci_ctx {
  kc_err code;
  char *err;
} kci_ctx;

/* kci_err with the context's code and buffer. */
kc_err kci_bad(const kci_ctx *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- jansson input ---- */

/* json_loadb with duplicate keys rejected; KC_BAD_JSON "line L, column C: ...".
 */
kc_err kci_load(const char *json, size_t len, json_t **out, char *err);
/* json_vunpack_ex on an object with a strict ("!") format of optional "s?o"
 * slots; an unknown field gives "<what>: unknown field(s): a, b". */
kc_err kci_unpack(const kci_ctx *c, json_t *obj, const char *what,
                  const char *fmt, ...);
/* v must be present and of type t: "<what>: missing" / "must be a string". */
kc_err kci_type(const kci_ctx *c, json_t *v, json_type t, const char *what);
/* A present string without embedded NUL. */
kc_err kci_str(const kci_ctx *c, json_t *v, const char *what, const char **out);
/* A present JSON integer (not a real) in [lo, hi]; hi == 2^53 reads "2^53". */
kc_err kci_uint(const kci_ctx *c, json_t *v, const char *what, uint64_t lo,
                uint64_t hi, uint64_t *out);
/* An optional array of strings (NULL v: none) copied into *out; each string
 * must satisfy check (NULL: any) whose message is written under what[i]. */
typedef int (*kci_check_fn)(const kci_ctx *c, const char *s, const char *what);
kc_err kci_strv(const kci_ctx *c, json_t *v, const char *what,
                kci_check_fn check, char ***out, size_t *n);
void kci_strv_free(char **v, size_t n);
/* Deep copy of a string vector (NULL on out of memory unless n == 0). */
kc_err kci_strv_dup(const char *const *src, size_t n, char ***out);

/* ---- Rules (return 1 if s passes, else 0 with a message in c) ---- */

int kci_check_hex(const kci_ctx *c, const char *s, const char *what);
int kci_check_arch(const kci_ctx *c, const char *s, const char *what);
int kci_check_ident(const kci_ctx *c, const char *s, const char *what);
int kci_check_tool_name(const kci_ctx *c, const char *s, const char *what);
/* what names the entry ("toolchain.cuda") */
int kci_check_tool_value(const kci_ctx *c, const char *s, const char *what);
/* s must be NUL-terminated within cap bytes (fixed arrays filled by hand). */
int kci_check_term(const kci_ctx *c, const char *s, size_t cap,
                   const char *what);

/* ---- Buckets, toolchains, key fields ---- */

kc_err kci_bucket_check(const kci_ctx *c, const kc_bucket *b, const char *what);
kc_err kci_tools_check(const kci_ctx *c, const kc_tool *t, size_t n,
                       const char *what);
kc_err kci_key_check(const kci_ctx *c, const kc_key_fields *f);

kc_err kci_bucket_from_json(const kci_ctx *c, json_t *v, const char *what,
                            kc_bucket *b);
kc_err kci_tools_from_json(const kci_ctx *c, json_t *v, const char *what,
                           kc_tool *t, size_t *n);
/* The key fields found in any object (key JSON, bundle manifest). */
typedef struct kci_key_json {
  json_t *model, *bucket, *arch, *toolchain, *build;
} kci_key_json;
kc_err kci_key_from_json(const kci_ctx *c, const kci_key_json *j,
                         kc_key_fields *f);

/* ---- json_out.c: canonical JSON text, written directly ---- */
/* A growing buffer, NUL-terminated after every write; oom: a write failed
 * (later ones do nothing). Start from {0}. */
typedef struct kci_jbuf {
  char *p;
  size_t n, cap;
  int oom;
} kci_jbuf;
void kci_jb_raw(kci_jbuf *b, const char *s, size_t len);
void kci_jb_lit(kci_jbuf *b, const char *s);
/* A string, quoted and escaped as jansson does (s is valid UTF-8). */
void kci_jb_str(kci_jbuf *b, const char *s);
void kci_jb_u64(kci_jbuf *b, uint64_t v);
/* A finite real as JSON_REAL_PRECISION(15) prints it. */
void kci_jb_real(kci_jbuf *b, double v);
/* A valid bucket or toolchain as an object, names sorted. */
void kci_jb_bucket(kci_jbuf *b, const kc_bucket *k);
void kci_jb_tools(kci_jbuf *b, const kc_tool *t, size_t n);
/* The text (the caller frees it), or NULL when a write ran out of memory. */
char *kci_jb_take(kci_jbuf *b);

#endif
