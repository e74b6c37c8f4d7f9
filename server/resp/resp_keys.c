/* resp_keys.c: the key-space commands (EXPIRE and its kin, SCAN, KEYS). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "resp.h"

#define SCAN_COUNT_MAX 100000 /* one SCAN visits at most 10x this */
#define KEYS_STEP 1000
#define PATTERN_STARS 16 /* '*' runs a KEYS/SCAN pattern may hold */
#define PATTERN_MAX 1024 /* and its bytes */

/* A pattern's cost per key grows with its '*' runs (each may retry the
 * rest of the pattern at every later byte): KEYS with a crafted one froze
 * Redis's thread for 19 s. Refused above the limits, which no key family
 * prefix needs; 0 when it may run, else the error is written. */
static int pattern_ok(kcd_resp_ctx *x, const char *p, size_t n) {
  size_t stars = 0;
  for (size_t i = 0; i < n; i++) {
    if (p[i] == '\\')
      i++;
    else if (p[i] == '*' && (i == 0 || p[i - 1] != '*'))
      stars++;
  }
  if (n <= PATTERN_MAX && stars <= PATTERN_STARS)
    return 0;
  kcd_resp_errorf(x->out,
                  "ERR pattern too complex: at most %d '*' runs "
                  "and %d bytes",
                  PATTERN_STARS, PATTERN_MAX);
  return -1;
}

/* ---- EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT ---- */

/* NX XX GT LT after the time; -1 with Redis's error written. */
static int expire_flags(kcd_resp_ctx *x, int *flags) {
  static const struct {
    const char *w;
    int f;
  } words[] = {
      {"nx", KC_KV_NX}, {"xx", KC_KV_XX}, {"gt", KC_KV_GT}, {"lt", KC_KV_LT}};
  *flags = 0;
  for (size_t i = 3; i < x->argc; i++) {
    size_t w = 0;
    while (w < 4 && !kcd_resp_is(ARG(i), words[w].w))
      w++;
    if (w == 4) {
      kcd_resp_errorf(x->out, "ERR Unsupported option %.*s",
                      (int)(x->lens[i] > 128 ? 128 : x->lens[i]), x->argv[i]);
      return -1;
    }
    *flags |= words[w].f;
  }
  if ((*flags & KC_KV_NX) && (*flags & (KC_KV_XX | KC_KV_GT | KC_KV_LT))) {
    kcd_resp_error(x->out, "ERR NX and XX, GT or LT options at the same time "
                           "are not compatible");
    return -1;
  }
  if ((*flags & KC_KV_GT) && (*flags & KC_KV_LT)) {
    kcd_resp_error(x->out,
                   "ERR GT and LT options at the same time are not compatible");
    return -1;
  }
  return 0;
}

static void expire(kcd_resp_ctx *x, int secs, int absolute, const char *cmd) {
  int flags;
  int64_t at;
  if (expire_flags(x, &flags) ||
      kcd_resp_expire_at(x, 2, secs, absolute ? 0 : x->now_ms, 0, cmd, &at))
    return;
  if (x->lens[1] < 1 || x->lens[1] > KC_KV_KEY_MAX)
    return kcd_resp_int(x->out, 0); /* no such key can exist */
  kcd_resp_job *j = kcd_resp_job_of(x);
  if (!j)
    return;
  size_t first = j->nops;
  kc_store_kv_op *o = kcd_resp_job_op(j, KC_KV_EXPIRE, ARG(1));
  if (!o || kcd_resp_job_item(j, KCD_RK_SUM, first)) {
    j->nops = first;
    return kcd_resp_error(x->out, "OOM out of memory");
  }
  o->flags = flags;
  o->expire_ms = at;
}

void kcd_resp_c_expire(kcd_resp_ctx *x) { expire(x, 1, 0, "expire"); }
void kcd_resp_c_pexpire(kcd_resp_ctx *x) { expire(x, 0, 0, "pexpire"); }
void kcd_resp_c_expireat(kcd_resp_ctx *x) { expire(x, 1, 1, "expireat"); }
void kcd_resp_c_pexpireat(kcd_resp_ctx *x) { expire(x, 0, 1, "pexpireat"); }

/* ---- SCAN and KEYS ---- */

typedef struct found {
  kcd_resp_buf keys; /* bulk strings */
  size_t n, max;
} found;

static int collect(const void *key, size_t klen, void *ud) {
  found *f = ud;
  kcd_resp_bulk(&f->keys, key, klen);
  f->n++;
  return f->keys.oom || f->n >= f->max;
}

static int parse_cursor(const char *s, size_t n, uint64_t *out) {
  uint64_t v = 0;
  if (n == 0 || n > 20)
    return -1;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9' ||
        v > (UINT64_MAX - (uint64_t)(s[i] - '0')) / 10)
      return -1;
    v = v * 10 + (uint64_t)(s[i] - '0');
  }
  *out = v;
  return 0;
}

typedef struct scan_args {
  uint64_t cursor;
  const char *pat;
  size_t plen;
  long long count;
  int other_type; /* TYPE names a type kcached does not hold */
} scan_args;

static int scan_opts(kcd_resp_ctx *x, scan_args *a) {
  if (parse_cursor(ARG(1), &a->cursor))
    return kcd_resp_error(x->out, "ERR invalid cursor"), -1;
  for (size_t i = 2; i < x->argc; i += 2) {
    if (i + 1 >= x->argc)
      return kcd_resp_err_syntax(x->out), -1;
    if (kcd_resp_is(ARG(i), "count")) {
      if (kcd_resp_ll(ARG(i + 1), &a->count))
        return kcd_resp_err_int(x->out), -1;
      if (a->count < 1)
        return kcd_resp_err_syntax(x->out), -1;
    } else if (kcd_resp_is(ARG(i), "match")) {
      int all = kcd_resp_is(ARG(i + 1), "*");
      if (pattern_ok(x, ARG(i + 1)))
        return -1;
      a->pat = all ? NULL : x->argv[i + 1];
      a->plen = all ? 0 : x->lens[i + 1];
    } else if (kcd_resp_is(ARG(i), "type")) {
      a->other_type = !kcd_resp_is(ARG(i + 1), "string");
    } else {
      return kcd_resp_err_syntax(x->out), -1;
    }
  }
  return 0;
}

void kcd_resp_c_scan(kcd_resp_ctx *x) {
  scan_args a = {.count = 10};
  if (scan_opts(x, &a))
    return;
  kc_store *s = kcd_resp_store(x);
  if (!s)
    return;
  if (a.count > SCAN_COUNT_MAX)
    a.count = SCAN_COUNT_MAX;
  kcd_resp_read_forward(x->c); /* kc_store_kv_scan reads on its own */
  found f = {.max = (size_t)a.count};
  uint64_t next = 0;
  kc_err e = a.other_type
                 ? KC_OK
                 : kc_store_kv_scan(s, a.cursor, a.pat, a.plen, (size_t)a.count,
                                    x->now_ms, collect, &f, &next);
  if (e || f.keys.oom) {
    kcd_resp_store_err(x->out, e ? e : KC_NOMEM, NULL);
  } else {
    char cur[24];
    snprintf(cur, sizeof cur, "%llu", (unsigned long long)next);
    kcd_resp_array(x->out, 2);
    kcd_resp_bulk_str(x->out, cur);
    kcd_resp_array(x->out, (long long)f.n);
    kcd_resp_buf_add(x->out, f.keys.p, f.keys.len);
  }
  kcd_resp_buf_free(&f.keys);
}

/* KEYS walks the whole key space in SCAN steps but returns at most
 * KCD_RESP_KEYS_MAX keys (documented in --help); a key may repeat when the
 * store changes during the walk, as with SCAN. */
void kcd_resp_c_keys(kcd_resp_ctx *x) {
  kc_store *s = kcd_resp_store(x);
  if (!s)
    return;
  int all = kcd_resp_is(ARG(1), "*");
  if (pattern_ok(x, ARG(1)))
    return;
  kcd_resp_read_forward(x->c); /* kc_store_kv_scan reads on its own */
  found f = {.max = KCD_RESP_KEYS_MAX};
  uint64_t cursor = 0;
  kc_err e = KC_OK;
  do {
    size_t room = f.max - f.n < KEYS_STEP ? f.max - f.n : KEYS_STEP;
    found step = {.max = room};
    e = kc_store_kv_scan(s, cursor, all ? NULL : x->argv[1],
                         all ? 0 : x->lens[1], room, x->now_ms, collect, &step,
                         &cursor);
    kcd_resp_buf_add(&f.keys, step.keys.p, step.keys.len);
    f.n += step.n;
    f.keys.oom |= step.keys.oom;
    kcd_resp_buf_free(&step.keys);
  } while (!e && !f.keys.oom && cursor != 0 && f.n < f.max);
  if (e || f.keys.oom) {
    kcd_resp_store_err(x->out, e ? e : KC_NOMEM, NULL);
  } else {
    kcd_resp_array(x->out, (long long)f.n);
    kcd_resp_buf_add(x->out, f.keys.p, f.keys.len);
  }
  kcd_resp_buf_free(&f.keys);
}
