/* demand.c: per-model histograms of the shapes services ran and of what they
 * missed (POST /v1/demand), counted in memory and merged into the "demand"
 * database once a second, bounded in memory and on disk so that no client can
 * grow them without limit (kc_store.h, "Demand"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

#define PEND_CAP (2 * KC_STORE_DEMAND_PENDING) /* slots; a power of two */
#define REC_VERSION 1
#define ENT_HEAD 11 /* u64 count, u8 kind, u16 length */

typedef struct pend {
  int used;
  uint8_t kind;
  char model[KC_HEX_LEN + 1];
  char *text;
  uint64_t count;
} pend;

struct kcs_demand {
  pthread_mutex_t lock;
  pend *slots; /* PEND_CAP, open addressing */
  size_t n;
  char models[KC_STORE_DEMAND_PENDING_MODELS][KC_HEX_LEN + 1];
  size_t entries[KC_STORE_DEMAND_PENDING_MODELS]; /* pending, per model */
  size_t n_models;
  size_t n_unknown, n_unknown_models; /* of models the store does not have */
};

/* An entry being merged: text borrowed from a record or a pend. */
typedef struct ent {
  uint64_t count;
  uint8_t kind;
  uint16_t len;
  const char *text;
} ent;

/* ---- shapes as text ---- */

static int cmp_dim(const void *a, const void *b) {
  return strcmp(((const kc_dim *)a)->name, ((const kc_dim *)b)->name);
}

kc_err kc_store_demand_shape_text(const kc_bucket *shape, char *text,
                                  char *err) {
  /* The key rules are the bucket rules: validate through them, with dummy
   * other fields, so that one rule decides what a dimension is. */
  kc_key_fields f;
  memset(&f, 0, sizeof f);
  memset(f.model, '0', KC_HEX_LEN);
  memset(f.build, '0', KC_HEX_LEN);
  strcpy(f.arch, "sm_80");
  if (shape->n > KC_MAX_DIMS)
    return kc_errf(err, KC_EINVAL, "%zu dimensions (at most 16)", shape->n);
  f.bucket = *shape;
  char why[KC_ERRBUF_SIZE] = "";
  if (kc_key_validate(&f, why)) {
    /* "bucket: ..." names the field of a key; say "shape" instead. */
    const char *p = strncmp(why, "bucket", 6) == 0 ? why + 6 : why;
    return kc_errf(err, KC_EINVAL, "shape%s", p);
  }
  qsort(f.bucket.dims, f.bucket.n, sizeof f.bucket.dims[0], cmp_dim);
  size_t used = 0;
  for (size_t i = 0; i < f.bucket.n; i++)
    used += (size_t)snprintf(text + used, KC_STORE_DEMAND_TEXT_MAX + 1 - used,
                             "%s%s=%llu", i ? "," : "", f.bucket.dims[i].name,
                             (unsigned long long)f.bucket.dims[i].value);
  return KC_OK;
}

kc_err kc_store_demand_shape_parse(const char *text, kc_bucket *out) {
  memset(out, 0, sizeof *out);
  const char *p = text;
  while (*p) {
    if (out->n == KC_MAX_DIMS)
      return KC_EINVAL;
    kc_dim *d = &out->dims[out->n++];
    const char *eq = strchr(p, '=');
    if (!eq || eq == p || (size_t)(eq - p) > KC_NAME_MAX)
      return KC_EINVAL;
    memcpy(d->name, p, (size_t)(eq - p));
    char *end;
    d->value = strtoull(eq + 1, &end, 10);
    if (end == eq + 1 || (*end && *end != ','))
      return KC_EINVAL;
    p = *end ? end + 1 : end;
  }
  return out->n ? KC_OK : KC_EINVAL;
}

/* ---- pending counts (memory) ---- */

static uint64_t pend_hash(const char *model, int kind, const char *text) {
  uint64_t h = 1469598103934665603ull;
  for (const char *p = model; *p; p++)
    h = (h ^ (unsigned char)*p) * 1099511628211ull;
  h = (h ^ (unsigned)kind) * 1099511628211ull;
  for (const char *p = text; *p; p++)
    h = (h ^ (unsigned char)*p) * 1099511628211ull;
  return h;
}

static struct kcs_demand *pending(kc_store *s) {
  struct kcs_demand *d = atomic_load(&s->demand_pending);
  if (d)
    return d;
  d = calloc(1, sizeof *d);
  if (!d || !(d->slots = calloc(PEND_CAP, sizeof *d->slots))) {
    free(d);
    return NULL;
  }
  pthread_mutex_init(&d->lock, NULL);
  struct kcs_demand *none = NULL;
  if (atomic_compare_exchange_strong(&s->demand_pending, &none, d))
    return d;
  pthread_mutex_destroy(&d->lock); /* another thread made it first */
  free(d->slots);
  free(d);
  return none;
}

/* The model's index in d->models, added if there is room for it: a model
 * the store does not have (unknown) may take only half of the model slots,
 * so that a flood of made-up models cannot crowd out real ones. -1 when
 * there is none (under d->lock). */
static int pend_model(struct kcs_demand *d, const char *model, int known) {
  for (size_t i = 0; i < d->n_models; i++)
    if (memcmp(d->models[i], model, KC_HEX_LEN) == 0)
      return (int)i;
  if (d->n_models == KC_STORE_DEMAND_PENDING_MODELS ||
      (!known && d->n_unknown_models >= KC_STORE_DEMAND_PENDING_MODELS / 2))
    return -1;
  memcpy(d->models[d->n_models], model, KC_HEX_LEN + 1);
  d->entries[d->n_models] = 0;
  d->n_unknown_models += !known;
  return (int)d->n_models++;
}

/* Counts into the table; 0 added, -1 full (under d->lock). A new entry
 * needs room three ways: in the table; within its model's share (at most
 * KC_STORE_DEMAND_ENTRIES pending, what a record keeps: one model's flood
 * takes at most a quarter of the table); and, for an unknown model, within
 * the half of the table unknown models may fill. */
static int pend_add(struct kcs_demand *d, const char *model, int kind,
                    const char *text, uint64_t count, int known) {
  size_t i = (size_t)pend_hash(model, kind, text) & (PEND_CAP - 1);
  while (d->slots[i].used &&
         (d->slots[i].kind != kind || strcmp(d->slots[i].model, model) ||
          strcmp(d->slots[i].text, text)))
    i = (i + 1) & (PEND_CAP - 1);
  pend *p = &d->slots[i];
  if (p->used) {
    p->count = p->count > UINT64_MAX - count ? UINT64_MAX : p->count + count;
    return 0;
  }
  if (d->n == KC_STORE_DEMAND_PENDING ||
      (!known && d->n_unknown >= KC_STORE_DEMAND_PENDING / 2))
    return -1;
  int m = pend_model(d, model, known);
  if (m < 0 || d->entries[m] >= KC_STORE_DEMAND_ENTRIES)
    return -1;
  if (!(p->text = strdup(text)))
    return -1;
  p->used = 1;
  p->kind = (uint8_t)kind;
  memcpy(p->model, model, KC_HEX_LEN + 1);
  p->count = count;
  d->n++;
  d->n_unknown += !known;
  d->entries[m]++;
  return 0;
}

static kc_err check_entry(kc_store_demand_kind kind, const char *text,
                          uint64_t count, char *err) {
  if (count < 1 || count > KC_STORE_DEMAND_COUNT_MAX)
    return kc_errf(err, KC_EINVAL, "count %llu is not in 1..%llu",
                   (unsigned long long)count, KC_STORE_DEMAND_COUNT_MAX);
  if (kind == KC_DEMAND_MISS_KEY)
    return kc_is_hex64(text)
               ? KC_OK
               : kc_errf(err, KC_BAD_KEY, "a missed key must be 64 hex digits");
  kc_bucket b;
  char canon[KC_STORE_DEMAND_TEXT_MAX + 1];
  if (kind != KC_DEMAND_SHAPE && kind != KC_DEMAND_MISS_SHAPE)
    return kc_errf(err, KC_EINVAL, "unknown demand kind %d", (int)kind);
  /* Only canonical text: one shape must never count under two names. */
  if (strlen(text) > KC_STORE_DEMAND_TEXT_MAX ||
      kc_store_demand_shape_parse(text, &b) ||
      kc_store_demand_shape_text(&b, canon, err) || strcmp(canon, text))
    return kc_errf(err, KC_EINVAL, "'%.64s' is not a shape's canonical text",
                   text);
  return KC_OK;
}

kc_err kc_store_demand_add(kc_store *s, const char *model,
                           kc_store_demand_kind kind, const char *text,
                           uint64_t count, int known, char *err) {
  if (!kc_is_hex64(model))
    return kc_errf(err, KC_BAD_KEY, "model must be 64 hex digits");
  kc_err e = check_entry(kind, text, count, err);
  if (e)
    return e;
  struct kcs_demand *d = pending(s);
  if (!d)
    return kc_errf(err, KC_NOMEM, "out of memory");
  pthread_mutex_lock(&d->lock);
  int rc = pend_add(d, model, (int)kind, text, count, known != 0);
  pthread_mutex_unlock(&d->lock);
  if (rc == 0)
    return KC_OK;
  return kc_errf(err, KC_BUSY, "the demand table is full until the next flush");
}

/* Moves the pending entries out (owned by the caller, n of them). */
static pend *pend_take(struct kcs_demand *d, size_t *n) {
  pthread_mutex_lock(&d->lock);
  pend *out = d->n ? malloc(d->n * sizeof *out) : NULL;
  *n = 0;
  for (size_t i = 0; out && i < PEND_CAP; i++)
    if (d->slots[i].used)
      out[(*n)++] = d->slots[i];
  if (out || !d->n) {
    memset(d->slots, 0, PEND_CAP * sizeof *d->slots);
    d->n = d->n_models = d->n_unknown = d->n_unknown_models = 0;
  }
  pthread_mutex_unlock(&d->lock);
  return out;
}

static void pend_free(pend *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    free(p[i].text);
  free(p);
}

/* ---- records ---- */

/* Decodes a record into ents (malloc'd, room for extra more); texts point
 * into the value. -1 on a damaged record or no memory. */
static int rec_decode(const MDB_val *v, kcs_demand_head *h, ent **out,
                      size_t extra) {
  *out = NULL;
  if (v->mv_size < sizeof *h)
    return -1;
  memcpy(h, v->mv_data, sizeof *h);
  if (h->version != REC_VERSION || h->n > KC_STORE_DEMAND_ENTRIES)
    return -1;
  ent *e = malloc((h->n + extra + 1) * sizeof *e);
  if (!e)
    return -1;
  const unsigned char *p = (const unsigned char *)v->mv_data + sizeof *h;
  const unsigned char *end = (const unsigned char *)v->mv_data + v->mv_size;
  for (uint32_t i = 0; i < h->n; i++) {
    if ((size_t)(end - p) < ENT_HEAD)
      return free(e), -1;
    memcpy(&e[i].count, p, 8);
    e[i].kind = p[8];
    memcpy(&e[i].len, p + 9, 2);
    p += ENT_HEAD;
    if ((size_t)(end - p) < e[i].len)
      return free(e), -1;
    e[i].text = (const char *)p;
    p += e[i].len;
  }
  *out = e;
  return 0;
}

static int cmp_ident(const void *a, const void *b) {
  const ent *x = a, *y = b;
  if (x->kind != y->kind)
    return x->kind < y->kind ? -1 : 1;
  if (x->len != y->len)
    return x->len < y->len ? -1 : 1;
  return memcmp(x->text, y->text, x->len);
}

/* Most counted first; ties in a fixed order so that drops are repeatable. */
static int cmp_count(const void *a, const void *b) {
  const ent *x = a, *y = b;
  if (x->count != y->count)
    return x->count > y->count ? -1 : 1;
  return cmp_ident(a, b);
}

/* Sums duplicates, keeps the most counted; returns the new n. */
static size_t merge(ent *e, size_t n, uint64_t *dropped) {
  qsort(e, n, sizeof *e, cmp_ident);
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (m && cmp_ident(&e[m - 1], &e[i]) == 0) {
      uint64_t c = e[m - 1].count;
      e[m - 1].count =
          c > UINT64_MAX - e[i].count ? UINT64_MAX : c + e[i].count;
    } else {
      e[m++] = e[i];
    }
  }
  qsort(e, m, sizeof *e, cmp_count);
  /* Keep the most counted, within both the entry and the byte bound (long
   * dimension names must not make a record megabytes). */
  size_t keep = 0, bytes = sizeof(kcs_demand_head);
  while (keep < m && keep < KC_STORE_DEMAND_ENTRIES &&
         bytes + ENT_HEAD + e[keep].len <= KC_STORE_DEMAND_RECORD_BYTES)
    bytes += ENT_HEAD + e[keep++].len;
  for (size_t i = keep; i < m; i++)
    *dropped =
        *dropped > UINT64_MAX - e[i].count ? UINT64_MAX : *dropped + e[i].count;
  return keep;
}

static void *rec_encode(const kcs_demand_head *h, const ent *e, size_t *len) {
  size_t n = sizeof *h;
  for (uint32_t i = 0; i < h->n; i++)
    n += ENT_HEAD + e[i].len;
  unsigned char *buf = malloc(n), *p = buf;
  if (!buf)
    return NULL;
  memcpy(p, h, sizeof *h);
  p += sizeof *h;
  for (uint32_t i = 0; i < h->n; i++) {
    memcpy(p, &e[i].count, 8);
    p[8] = e[i].kind;
    memcpy(p + 9, &e[i].len, 2);
    memcpy(p + ENT_HEAD, e[i].text, e[i].len);
    p += ENT_HEAD + e[i].len;
  }
  *len = n;
  return buf;
}

/* ---- flush: one write transaction ---- */

typedef struct flush_ud {
  pend *p; /* sorted by model */
  size_t n;
  int64_t now;
} flush_ud;

/* Whether the store has the model: a bundle of it (the models index) or a
 * warmup manifest. Only write tokens make either. */
static int model_known(kc_store *s, MDB_txn *txn, const char *model) {
  MDB_val k = {KC_HEX_LEN, (void *)model}, v;
  if (mdb_get(txn, s->warmups, &k, &v) == 0)
    return 1;
  MDB_cursor *cur;
  if (mdb_cursor_open(txn, s->models, &cur))
    return 0;
  int rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
  int known = rc == 0 && k.mv_size == 2 * KC_HEX_LEN &&
              memcmp(k.mv_data, model, KC_HEX_LEN) == 0;
  mdb_cursor_close(cur);
  return known;
}

int kc_store_model_known(kc_store *s, const char *model) {
  if (!kc_is_hex64(model))
    return 0;
  kc_store_read *r;
  if (kc_store_read_begin(s, &r))
    return 0;
  int known = model_known(s, r->txn, model);
  kc_store_read_end(r);
  return known;
}

/* Makes room for one more model when KC_STORE_DEMAND_MODELS are kept: drops
 * the record with the smallest total among models the store does not have;
 * only when every kept model is known, and the newcomer is known too, the
 * smallest known one. *room: 0 when the newcomer must be dropped (an
 * unknown model never displaces a known one's histogram). */
static kc_err evict_model(kc_store *s, MDB_txn *txn, int known, int *room,
                          char *err) {
  MDB_stat st;
  *room = 1;
  if (mdb_stat(txn, s->demand, &st) || st.ms_entries < KC_STORE_DEMAND_MODELS)
    return KC_OK;
  MDB_cursor *cur;
  int rc = mdb_cursor_open(txn, s->demand, &cur);
  if (rc)
    return kcs_mdb_err(rc, "demand", err);
  MDB_val k, v;
  char victim[2][KC_HEX_LEN]; /* [0] unknown, [1] known */
  uint64_t least[2] = {UINT64_MAX, UINT64_MAX};
  int found[2] = {0, 0};
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    kcs_demand_head h = {0};
    if (v.mv_size >= sizeof h)
      memcpy(&h, v.mv_data, sizeof h);
    if (k.mv_size != KC_HEX_LEN)
      continue;
    char m[KC_HEX_LEN + 1];
    memcpy(m, k.mv_data, KC_HEX_LEN);
    m[KC_HEX_LEN] = '\0';
    int kn = model_known(s, txn, m);
    if (!found[kn] || h.total < least[kn]) {
      least[kn] = h.total;
      memcpy(victim[kn], m, KC_HEX_LEN);
      found[kn] = 1;
    }
  }
  mdb_cursor_close(cur);
  int which = found[0] ? 0 : known && found[1] ? 1 : -1;
  if (which < 0) {
    *room = 0;
    return KC_OK;
  }
  MDB_val vk = {KC_HEX_LEN, victim[which]};
  return kcs_del(txn, s->demand, &vk, err);
}

/* Merges pend[0..n) (one model) into its record. */
static kc_err flush_model(kc_store *s, MDB_txn *txn, const pend *p, size_t n,
                          int64_t now, char *err) {
  MDB_val k = {KC_HEX_LEN, (void *)p[0].model}, v;
  kcs_demand_head h = {REC_VERSION, 0, 0, 0, now};
  ent *e = NULL;
  int rc = mdb_get(txn, s->demand, &k, &v);
  if (rc && rc != MDB_NOTFOUND)
    return kcs_mdb_err(rc, "demand", err);
  /* A damaged record starts over: it is telemetry. */
  if (rc == 0 && rec_decode(&v, &h, &e, n))
    h = (kcs_demand_head){REC_VERSION, 0, 0, 0, now};
  int room = 1;
  kc_err x =
      rc == MDB_NOTFOUND
          ? evict_model(s, txn, model_known(s, txn, p[0].model), &room, err)
          : KC_OK;
  if (x || !room) { /* !room: no unknown record to displace, dropped */
    free(e);
    return x;
  }
  if (!e && !(e = malloc((n + 1) * sizeof *e)))
    return kc_errf(err, KC_NOMEM, "out of memory");
  size_t m = h.n;
  for (size_t i = 0; i < n; i++) {
    e[m++] =
        (ent){p[i].count, p[i].kind, (uint16_t)strlen(p[i].text), p[i].text};
    h.total =
        h.total > UINT64_MAX - p[i].count ? UINT64_MAX : h.total + p[i].count;
  }
  h.n = (uint32_t)merge(e, m, &h.dropped);
  h.updated = now;
  size_t len = 0;
  void *buf = x ? NULL : rec_encode(&h, e, &len);
  if (!x && !buf)
    x = kc_errf(err, KC_NOMEM, "out of memory");
  /* e's texts may point into the old value: encode before the put. */
  free(e);
  v = (MDB_val){len, buf};
  if (!x)
    x = kcs_put(txn, s->demand, &k, &v, 0, err);
  free(buf);
  return x;
}

static kc_err flush_op(kc_store *s, MDB_txn *txn, void *arg, char *err) {
  flush_ud *u = arg;
  for (size_t i = 0; i < u->n;) {
    size_t j = i + 1;
    while (j < u->n && strcmp(u->p[j].model, u->p[i].model) == 0)
      j++;
    kc_err e = flush_model(s, txn, u->p + i, j - i, u->now, err);
    if (e)
      return e;
    i = j;
  }
  return KC_OK;
}

static int cmp_pend_model(const void *a, const void *b) {
  return strcmp(((const pend *)a)->model, ((const pend *)b)->model);
}

kc_err kc_store_demand_flush(kc_store *s, char *err) {
  struct kcs_demand *d = atomic_load(&s->demand_pending);
  size_t n = 0;
  pend *p = d ? pend_take(d, &n) : NULL;
  if (!n)
    return KC_OK;
  qsort(p, n, sizeof *p, cmp_pend_model);
  flush_ud u = {p, n, kcs_now()};
  kc_err e = kcs_write(s, flush_op, &u, err);
  pend_free(p, n);
  return e;
}

void kcs_demand_close(kc_store *s) {
  kc_store_demand_flush(s, NULL); /* what came in since the last tick */
  struct kcs_demand *d = atomic_exchange(&s->demand_pending, NULL);
  if (!d)
    return;
  pthread_mutex_destroy(&d->lock);
  for (size_t i = 0; i < PEND_CAP; i++)
    free(d->slots[i].text);
  free(d->slots);
  free(d);
}

/* ---- reading ---- */

static kc_err demand_copy(const MDB_val *v, kc_store_demand *out) {
  kcs_demand_head h;
  ent *e;
  if (rec_decode(v, &h, &e, 0))
    return KC_CORRUPT;
  size_t bytes = 0;
  for (uint32_t i = 0; i < h.n; i++)
    bytes += e[i].len + 1u;
  out->items = calloc(h.n + 1, sizeof *out->items);
  char *t = malloc(bytes + 1); /* every text, in one block */
  if (!out->items || !t) {
    free(e), free(t), free(out->items);
    out->items = NULL;
    return KC_NOMEM;
  }
  for (uint32_t i = 0; i < h.n; i++) {
    memcpy(t, e[i].text, e[i].len);
    t[e[i].len] = '\0';
    out->items[i] =
        (kc_store_demand_item){(kc_store_demand_kind)e[i].kind, t, e[i].count};
    t += e[i].len + 1;
  }
  if (!h.n)
    free(t);
  out->n = h.n;
  out->total = h.total;
  out->dropped = h.dropped;
  out->updated = h.updated;
  free(e);
  return KC_OK;
}

kc_err kc_store_demand_get(kc_store *s, const char *model, kc_store_demand *out,
                           char *err) {
  memset(out, 0, sizeof *out);
  if (!kc_is_hex64(model))
    return kc_errf(err, KC_BAD_KEY, "model must be 64 hex digits");
  kc_store_read *r;
  if (kc_store_read_begin(s, &r))
    return kc_errf(err, KC_IO, "cannot begin a read");
  MDB_val k = {KC_HEX_LEN, (void *)model}, v;
  int rc = mdb_get(r->txn, s->demand, &k, &v);
  kc_err e = KC_OK;
  if (rc == 0)
    e = demand_copy(&v, out);
  else if (rc != MDB_NOTFOUND)
    e = kcs_mdb_err(rc, "demand", err);
  kc_store_read_end(r);
  if (e == KC_CORRUPT || e == KC_NOMEM)
    kc_errf(err, e,
            e == KC_NOMEM ? "out of memory"
                          : "the demand record of %.64s is damaged",
            model);
  return e;
}

void kc_store_demand_free(kc_store_demand *d) {
  if (!d)
    return;
  /* Every text is in one block, starting at the first item's. */
  if (d->items)
    free((void *)(d->n ? d->items[0].text : NULL));
  free(d->items);
  memset(d, 0, sizeof *d);
}
