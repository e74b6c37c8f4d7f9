/* json_out.c: the canonical JSON of keys and manifests, written directly.
 *
 * Building jansson objects and dumping them was most of the cost of a key
 * (a warm of 1024 bundles computes 2048) and of writing a manifest (1024
 * into the local cache). The bytes are exactly what jansson's
 * json_dumps(JSON_SORT_KEYS | JSON_COMPACT | JSON_REAL_PRECISION(15)) gave
 * for the same values: test_schema compares the two over random keys and
 * manifests, besides the committed key vectors. Callers write object keys
 * in strcmp order themselves, and only valid UTF-8 (the validators see to
 * it). */
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema_internal.h"

/* Room for k more bytes and a NUL; on failure b->oom, and writes stop. */
static int reserve(kci_jbuf *b, size_t k) {
  if (b->oom)
    return 0;
  if (b->n + k + 1 <= b->cap)
    return 1;
  size_t cap = b->cap ? b->cap * 2 : 512;
  while (cap < b->n + k + 1)
    cap *= 2;
  char *p = realloc(b->p, cap);
  if (!p) {
    b->oom = 1;
    return 0;
  }
  b->p = p;
  b->cap = cap;
  return 1;
}

void kci_jb_raw(kci_jbuf *b, const char *s, size_t len) {
  if (!reserve(b, len))
    return;
  memcpy(b->p + b->n, s, len);
  b->n += len;
  b->p[b->n] = '\0';
}

void kci_jb_lit(kci_jbuf *b, const char *s) { kci_jb_raw(b, s, strlen(s)); }

/* jansson's escapes: '"', '\\', the five short ones, and \u00XX (upper
 * case) for the other control bytes; everything else as it is. */
void kci_jb_str(kci_jbuf *b, const char *s) {
  static const char hex[] = "0123456789ABCDEF";
  size_t len = strlen(s);
  if (!reserve(b, 6 * len + 2))
    return;
  char *o = b->p + b->n;
  *o++ = '"';
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    const char *esc = c == '"'    ? "\\\""
                      : c == '\\' ? "\\\\"
                      : c == '\b' ? "\\b"
                      : c == '\f' ? "\\f"
                      : c == '\n' ? "\\n"
                      : c == '\r' ? "\\r"
                      : c == '\t' ? "\\t"
                                  : NULL;
    if (esc) {
      *o++ = esc[0];
      *o++ = esc[1];
    } else if (c < 0x20) {
      memcpy(o, "\\u00", 4);
      o[4] = hex[c >> 4];
      o[5] = hex[c & 15];
      o += 6;
    } else {
      *o++ = (char)c;
    }
  }
  *o++ = '"';
  b->n = (size_t)(o - b->p);
  b->p[b->n] = '\0';
}

void kci_jb_u64(kci_jbuf *b, uint64_t v) {
  char num[24];
  kci_jb_raw(b, num,
             (size_t)snprintf(num, sizeof num, "%llu", (unsigned long long)v));
}

/* jansson's jsonp_dtostr at precision 15: "%.15g" with the locale's
 * decimal point made '.' (libkcache runs in programs that set LC_NUMERIC:
 * de_DE would print "12,5"), ".0" added when that reads as an integer, and
 * the exponent without '+' or leading zeros. */
void kci_jb_real(kci_jbuf *b, double v) {
  char num[40];
  int len = snprintf(num, sizeof num - 2, "%.15g", v);
  if (len < 0 || (size_t)len >= sizeof num - 2) {
    b->oom = 1;
    return;
  }
  char point = *localeconv()->decimal_point, *at;
  if (point != '.' && point && (at = strchr(num, point)))
    *at = '.';
  if (!strchr(num, '.') && !strchr(num, 'e')) {
    memcpy(num + len, ".0", 3);
    len += 2;
  }
  char *start = strchr(num, 'e');
  if (start) {
    start++;
    char *end = start + 1;
    if (*start == '-')
      start++;
    while (*end == '0')
      end++;
    if (end != start) {
      memmove(start, end, (size_t)len - (size_t)(end - num) + 1);
      len -= (int)(end - start);
    }
  }
  kci_jb_raw(b, num, (size_t)len);
}

/* ix[0..n): the order of n names (stride bytes apart from first) by
 * strcmp, as JSON_SORT_KEYS orders object keys. */
static void sort_names(const char *first, size_t stride, size_t n, size_t *ix) {
  for (size_t i = 0; i < n; i++) {
    size_t j = i;
    for (; j && strcmp(first + ix[j - 1] * stride, first + i * stride) > 0; j--)
      ix[j] = ix[j - 1];
    ix[j] = i;
  }
}

void kci_jb_bucket(kci_jbuf *b, const kc_bucket *k) {
  size_t ix[KC_MAX_DIMS];
  sort_names(k->dims[0].name, sizeof k->dims[0], k->n, ix);
  kci_jb_lit(b, "{");
  for (size_t i = 0; i < k->n; i++) {
    kci_jb_lit(b, i ? "," : "");
    kci_jb_str(b, k->dims[ix[i]].name);
    kci_jb_lit(b, ":");
    kci_jb_u64(b, k->dims[ix[i]].value);
  }
  kci_jb_lit(b, "}");
}

void kci_jb_tools(kci_jbuf *b, const kc_tool *t, size_t n) {
  size_t ix[KC_MAX_TOOLS];
  sort_names(t[0].name, sizeof t[0], n, ix);
  kci_jb_lit(b, "{");
  for (size_t i = 0; i < n; i++) {
    kci_jb_lit(b, i ? "," : "");
    kci_jb_str(b, t[ix[i]].name);
    kci_jb_lit(b, ":");
    kci_jb_str(b, t[ix[i]].value);
  }
  kci_jb_lit(b, "}");
}

char *kci_jb_take(kci_jbuf *b) {
  if (b->oom || !reserve(b, 0)) {
    free(b->p);
    b->p = NULL;
    return NULL;
  }
  char *p = b->p;
  b->p = NULL;
  return p;
}
