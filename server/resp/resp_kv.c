/* resp_kv.c: the string commands over kc_store_kv_*: reads run here in the
 * round's read transaction (values copied into the reply, or a GET's left
 * in the map for the reply's writev); writes become
 * ops of the connection's job (resp_commit.c commits them) and their
 * replies are written when the job comes back (kcd_resp_job_reply), but
 * for a SET the committed state already settles (set_settled).
 * Options, their conflicts and error texts follow Redis 7. */
#include <stdlib.h>
#include <string.h>

#include "resp.h"

static int key_ok(size_t len) { return len >= 1 && len <= KC_KV_KEY_MAX; }

/* A write's key: an error reply when the store cannot hold it. */
static int write_key_ok(kcd_resp_ctx *x, size_t i) {
  if (key_ok(x->lens[i]))
    return 1;
  kcd_resp_errorf(x->out, "ERR key must be 1 to %d bytes", KC_KV_KEY_MAX);
  return 0;
}

/* ---- reads ---- */

static kc_err meta1(kcd_resp_ctx *x, size_t i, uint64_t *size, int64_t *exp) {
  if (!key_ok(x->lens[i]))
    return KC_NOT_FOUND;
  kc_store_read *r = kcd_resp_read(x);
  if (!r)
    return KC_NOT_READY;
  kc_err e = kc_store_kv_meta(r, ARG(i), x->now_ms, size, exp);
  if (e && e != KC_NOT_FOUND)
    kcd_resp_store_err(x->out, e, NULL);
  return e;
}

/* A value as a bulk string: one held compressed is decompressed
 * straight into the output buffer, no copy between. A frame that does not
 * decode to its size (rot the scrub has not reached yet) reads as a miss. */
static void reply_value(kcd_resp_buf *b, const kc_store_kv_val *v, int resp3) {
  if (v->enc != KC_STORE_ZSTD) {
    kcd_resp_bulk(b, v->data, v->len);
    return;
  }
  char head[32];
  int n = snprintf(head, sizeof head, "$%llu\r\n", (unsigned long long)v->size);
  if (kcd_resp_buf_reserve(b, (size_t)n + (size_t)v->size + 2))
    return;
  size_t start = b->len;
  kcd_resp_buf_add(b, head, (size_t)n);
  if (kc_store_zstd_decode(v->data, v->len, b->p + b->len, (size_t)v->size,
                           NULL)) {
    b->len = start;
    kcd_resp_nil(b, resp3);
    return;
  }
  b->len += (size_t)v->size;
  kcd_resp_buf_add(b, "\r\n", 2);
}

/* A raw value of a plaintext connection's GET, outside EXEC and jobs: its
 * reply's room is reserved and its header and end written, but the value
 * is left in the map for conn_flush's writev (no copy here, the kernel
 * copies it once). 0: not taken (reply_value copies it). */
/* "$n\r\n" into h (32 bytes); its length. Not snprintf: that cost a
 * 4 KiB GET more than its copy did. */
static size_t bulk_head(char *h, size_t n) {
  char d[24];
  size_t k = 0, len = 0;
  do
    d[k++] = (char)('0' + n % 10);
  while ((n /= 10) > 0);
  h[len++] = '$';
  while (k)
    h[len++] = d[--k];
  h[len++] = '\r';
  h[len++] = '\n';
  return len;
}

static int ref_value(kcd_resp_ctx *x, const kc_store_kv_val *v) {
  kcd_resp_conn *c = x->c;
  kcd_resp_buf *b = x->out;
  if (v->enc == KC_STORE_ZSTD || v->len < KCD_RESP_REF_MIN || c->ssl ||
      x->exec || b != &c->out || c->nrefs >= KCD_RESP_REFS)
    return 0;
  char head[32];
  size_t n = bulk_head(head, v->len);
  if (kcd_resp_buf_reserve(b, n + v->len + 2))
    return 0; /* reply_value meets the same limit and says so */
  kcd_resp_buf_add(b, head, n);
  c->refs[c->nrefs++] =
      (kcd_resp_ref){.off = b->len, .len = v->len, .p = v->data};
  b->len += v->len;
  kcd_resp_buf_add(b, "\r\n", 2);
  return 1;
}

static void family(kcd_resp_ctx *x, size_t i, int hit) {
  kcd_resp_family_count(&x->c->srv->families, ARG(i), hit);
}

/* GET's miss offered to the tier (kcd_svc_kv_get's callback). */
typedef struct get_ask {
  kcd_resp_ctx *x;
  int asked; /* 1: the tier took it; the command runs again */
} get_ask;

static int ask_tier(void *arg, const void *key, size_t klen) {
  get_ask *g = arg;
  return g->asked = kcd_resp_fetch_key(g->x, key, klen);
}

void kcd_resp_c_get(kcd_resp_ctx *x) {
  kc_store_kv_val v;
  /* no read (and no error reply) for a key the store cannot hold */
  kc_store_read *rd = key_ok(x->lens[1]) ? kcd_resp_read(x) : NULL;
  get_ask g = {x, 0};
  kc_err e = kcd_svc_kv_get(x->st, KCD_FE_RESP, rd, ARG(1), x->now_ms, &v,
                            ask_tier, &g);
  if (e == KC_OK) {
    family(x, 1, 1);
    if (!ref_value(x, &v))
      reply_value(x->out, &v, x->c->resp3);
  } else if (e == KC_NOT_FOUND && !g.asked) {
    family(x, 1, 0); /* a miss read through is counted when it replies */
    kcd_resp_nil(x->out, x->c->resp3);
  } else if (e != KC_NOT_FOUND && rd) { /* no rd: kcd_resp_read replied */
    kcd_resp_store_err(x->out, e, NULL);
  }
}

/* With the durable tier: asks for every missing key (1: asked, no reply
 * now). meta, not get: hits are counted once, by the reply's pass. */
static int mget_fetch(kcd_resp_ctx *x) {
  int asked = 0;
  for (size_t i = 1; i < x->argc && x->st->s3; i++) {
    uint64_t size;
    int64_t exp;
    if (!key_ok(x->lens[i]) || kc_store_kv_meta(x->c->rd, ARG(i), x->now_ms,
                                                &size, &exp) != KC_NOT_FOUND)
      continue;
    if (!kcd_resp_fetch_key(x, ARG(i)))
      break; /* inside EXEC, or fetched already */
    asked = 1;
  }
  return asked;
}

void kcd_resp_c_mget(kcd_resp_ctx *x) {
  if (!kcd_resp_read(x) || mget_fetch(x))
    return;
  kcd_resp_array(x->out, (long long)x->argc - 1);
  /* past the output limit the reply is taken back (resp_cmd.c): stop */
  for (size_t i = 1; i < x->argc && !x->out->over; i++) {
    kc_store_kv_val v;
    kc_err e = kcd_svc_kv_get(x->st, KCD_FE_RESP, x->c->rd, ARG(i), x->now_ms,
                              &v, NULL, NULL);
    family(x, i, e == KC_OK);
    if (e == KC_OK)
      reply_value(x->out, &v, x->c->resp3);
    else /* an error cannot be one element of a reply already begun */
      kcd_resp_nil(x->out, x->c->resp3);
  }
}

void kcd_resp_c_exists(kcd_resp_ctx *x) {
  long long n = 0;
  for (size_t i = 1; i < x->argc; i++) {
    uint64_t size;
    int64_t exp;
    kc_err e = meta1(x, i, &size, &exp);
    if (e && e != KC_NOT_FOUND)
      return;
    n += e == KC_OK;
  }
  kcd_resp_int(x->out, n);
}

static void ttl(kcd_resp_ctx *x, int ms) {
  uint64_t size;
  int64_t exp;
  kc_err e = meta1(x, 1, &size, &exp);
  if (e == KC_NOT_FOUND)
    return kcd_resp_int(x->out, -2);
  if (e)
    return;
  if (exp == 0)
    return kcd_resp_int(x->out, -1);
  int64_t left = exp - x->now_ms;
  if (left < 0)
    left = 0;
  kcd_resp_int(x->out, ms ? left : (left + 500) / 1000);
}

void kcd_resp_c_ttl(kcd_resp_ctx *x) { ttl(x, 0); }
void kcd_resp_c_pttl(kcd_resp_ctx *x) { ttl(x, 1); }

void kcd_resp_c_type(kcd_resp_ctx *x) {
  uint64_t size;
  int64_t exp;
  kc_err e = meta1(x, 1, &size, &exp);
  if (e == KC_OK || e == KC_NOT_FOUND)
    kcd_resp_simple(x->out, e == KC_OK ? "string" : "none");
}

void kcd_resp_c_strlen(kcd_resp_ctx *x) {
  uint64_t size = 0;
  int64_t exp;
  kc_err e = meta1(x, 1, &size, &exp);
  if (e == KC_OK || e == KC_NOT_FOUND)
    kcd_resp_int(x->out, e == KC_OK ? (long long)size : 0);
}

void kcd_resp_c_dbsize(kcd_resp_ctx *x) {
  kc_store *s = kcd_resp_store(x);
  uint64_t n = 0;
  if (s)
    kcd_resp_read_forward(x->c); /* kc_store_kv_count reads on its own */
  kc_err e = s ? kc_store_kv_count(s, &n) : KC_OK;
  if (s && e)
    kcd_resp_store_err(x->out, e, NULL);
  else if (s)
    kcd_resp_int(x->out, (long long)n);
}

/* ---- writes ---- */

/* A SET the committed state settles (kc_store_kv_set_settled: the key
 * holds this value and expiry already, or NX/XX refuse it) is answered at
 * once, with no commit: that state is synced, so the +OK promises what a
 * commit's would. Only with no write of this connection open before it
 * (the open job's ops are not in that state) and outside EXEC. 1: replied;
 * 0: o goes to the commit, with its hashes. */
static int set_settled(kcd_resp_ctx *x, kc_store_kv_op *o, kcd_resp_rk rk) {
  kc_store *s = kcd_store(x->st);
  kcd_resp_conn *c = x->c;
  if (x->job || x->exec || !s || (rk != KCD_RK_SET && rk != KCD_RK_SUM))
    return 0;
  /* the batch's read (kcd_resp_read's), but no error reply when LMDB
   * refuses one (no reader slot): the SET then just goes to the commit */
  if (kcd_resp_read_lend(c, s) != KC_OK)
    return 0;
  if (!kcd_svc_kv_set_settled(x->st, KCD_FE_RESP, c->rd, o, x->now_ms))
    return 0;
  if (rk == KCD_RK_SUM)
    kcd_resp_int(x->out, (long long)o->done);
  else if (o->done)
    kcd_resp_simple(x->out, "OK");
  else
    kcd_resp_nil(x->out, x->c->resp3);
  return 1;
}

/* Adds a SET op and its reply item (or replies at once: set_settled). */
static void add_set(kcd_resp_ctx *x, int flags, int64_t exp, kcd_resp_rk rk,
                    size_t ki) {
  kc_store_kv_op op = {.op = KC_KV_SET,
                       .key = x->argv[ki],
                       .klen = x->lens[ki],
                       .val = x->argv[ki + 1],
                       .vlen = x->lens[ki + 1],
                       .flags = flags,
                       .expire_ms = exp};
  if (set_settled(x, &op, rk))
    return;
  kcd_resp_job *j = kcd_resp_job_of(x);
  if (!j)
    return;
  size_t first = j->nops;
  kc_store_kv_op *o = kcd_resp_job_op(j, KC_KV_SET, ARG(ki));
  if (!o || kcd_resp_job_item(j, rk, first)) {
    j->nops = first;
    return kcd_resp_error(x->out, "OOM out of memory");
  }
  *o = op;
  j->val_bytes += o->vlen;
}

enum { O_EX = 1 << 8, O_PX = 1 << 9, O_EXAT = 1 << 10, O_PXAT = 1 << 11 };
#define O_TIME (O_EX | O_PX | O_EXAT | O_PXAT)

/* One SET option at argv[*i]; -1 on a syntax error. */
static int set_opt(kcd_resp_ctx *x, size_t *i, int *f, size_t *ti) {
  const char *a = x->argv[*i];
  size_t n = x->lens[*i];
  int more = *i + 1 < x->argc;
  static const struct {
    const char *w;
    int bit;
  } times[] = {{"ex", O_EX}, {"px", O_PX}, {"exat", O_EXAT}, {"pxat", O_PXAT}};
  if (kcd_resp_is(a, n, "nx") && !(*f & KC_KV_XX))
    return *f |= KC_KV_NX, 0;
  if (kcd_resp_is(a, n, "xx") && !(*f & KC_KV_NX))
    return *f |= KC_KV_XX, 0;
  if (kcd_resp_is(a, n, "get"))
    return *f |= KC_KV_GET, 0;
  if (kcd_resp_is(a, n, "keepttl") && !(*f & O_TIME))
    return *f |= KC_KV_KEEPTTL, 0;
  for (size_t t = 0; t < 4; t++) {
    int others = O_TIME & ~times[t].bit;
    if (kcd_resp_is(a, n, times[t].w) && !(*f & (KC_KV_KEEPTTL | others)) &&
        more) {
      *f |= times[t].bit;
      *ti = ++*i;
      return 0;
    }
  }
  return -1;
}

void kcd_resp_c_set(kcd_resp_ctx *x) {
  int f = 0;
  size_t ti = 0;
  for (size_t i = 3; i < x->argc; i++)
    if (set_opt(x, &i, &f, &ti))
      return kcd_resp_err_syntax(x->out);
  int64_t exp = 0;
  if (f & O_TIME) {
    int secs = (f & (O_EX | O_EXAT)) != 0;
    int64_t base = (f & (O_EX | O_PX)) ? x->now_ms : 0;
    if (kcd_resp_expire_at(x, ti, secs, base, 1, "set", &exp))
      return;
  }
  if (!write_key_ok(x, 1))
    return;
  add_set(x, f & ~O_TIME, exp, (f & KC_KV_GET) ? KCD_RK_SET_GET : KCD_RK_SET,
          1);
}

/* SETEX/PSETEX key time value: the value moves to argv[3]. */
static void setex(kcd_resp_ctx *x, int secs, const char *cmd) {
  int64_t exp;
  if (kcd_resp_expire_at(x, 2, secs, x->now_ms, 1, cmd, &exp) ||
      !write_key_ok(x, 1))
    return;
  kcd_resp_job *j = kcd_resp_job_of(x);
  if (!j)
    return;
  size_t first = j->nops;
  kc_store_kv_op *o = kcd_resp_job_op(j, KC_KV_SET, ARG(1));
  if (!o || kcd_resp_job_item(j, KCD_RK_OK, first)) {
    j->nops = first;
    return kcd_resp_error(x->out, "OOM out of memory");
  }
  o->val = x->argv[3];
  o->vlen = x->lens[3];
  o->expire_ms = exp;
  j->val_bytes += o->vlen;
}

void kcd_resp_c_setex(kcd_resp_ctx *x) { setex(x, 1, "setex"); }
void kcd_resp_c_psetex(kcd_resp_ctx *x) { setex(x, 0, "psetex"); }

void kcd_resp_c_setnx(kcd_resp_ctx *x) {
  if (write_key_ok(x, 1))
    add_set(x, KC_KV_NX, 0, KCD_RK_SUM, 1);
}

/* Ops of one kind over argv[from..) stepping `step`, replied as one item.
 * DEL and PERSIST skip a key the store cannot hold (it cannot exist). */
static void add_ops(kcd_resp_ctx *x, kc_store_kv_opcode op, size_t from,
                    size_t step, kcd_resp_rk rk) {
  int skip = op == KC_KV_DEL || op == KC_KV_PERSIST;
  for (size_t i = from; i < x->argc && op == KC_KV_SET; i += step)
    if (!write_key_ok(x, i))
      return;
  kcd_resp_job *j = kcd_resp_job_of(x);
  if (!j)
    return;
  size_t first = j->nops;
  for (size_t i = from; i < x->argc || (op == KC_KV_FLUSH && i == from);
       i += step) {
    if (skip && !key_ok(x->lens[i]))
      continue;
    kc_store_kv_op *o = op == KC_KV_FLUSH ? kcd_resp_job_op(j, op, NULL, 0)
                                          : kcd_resp_job_op(j, op, ARG(i));
    if (!o)
      return j->nops = first, kcd_resp_error(x->out, "OOM out of memory");
    if (step == 2) {
      o->val = x->argv[i + 1];
      o->vlen = x->lens[i + 1];
      j->val_bytes += o->vlen;
    }
  }
  if (kcd_resp_job_item(j, rk, first))
    j->nops = first, kcd_resp_error(x->out, "OOM out of memory");
}

void kcd_resp_c_mset(kcd_resp_ctx *x) {
  if (x->argc % 2 == 0)
    return kcd_resp_err_arity(x->out, "mset");
  add_ops(x, KC_KV_SET, 1, 2, KCD_RK_OK);
}

void kcd_resp_c_del(kcd_resp_ctx *x) {
  add_ops(x, KC_KV_DEL, 1, 1, KCD_RK_SUM);
}

void kcd_resp_c_persist(kcd_resp_ctx *x) {
  add_ops(x, KC_KV_PERSIST, 1, 1, KCD_RK_SUM);
}

void kcd_resp_c_flush(kcd_resp_ctx *x) {
  if (x->argc > 2 || (x->argc == 2 && !kcd_resp_is(ARG(1), "async") &&
                      !kcd_resp_is(ARG(1), "sync")))
    return kcd_resp_err_syntax(x->out);
  add_ops(x, KC_KV_FLUSH, x->argc, 1, KCD_RK_OK);
}
