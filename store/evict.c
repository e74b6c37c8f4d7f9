/* evict.c: writing the batched last-use records (uses.c gathers them), LRU
 * eviction, and GC of unreferenced blobs after their grace period. The full
 * verification is in verify.c. */
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

#define EVICT_BATCH 512 /* bundles or blobs removed per write transaction */

static int64_t time_of(const unsigned char *k) {
  return (int64_t)kcs_be64_get(k);
}

/* ---- flush ---- */

kc_err kcs_lru_move(MDB_txn *txn, MDB_dbi lru, int64_t from, int64_t to,
                    const char *hex, char *err) {
  unsigned char old[8 + KC_HEX_LEN], neu[8 + KC_HEX_LEN];
  kcs_time_key(old, from, hex);
  kcs_time_key(neu, to, hex);
  MDB_val ov = {sizeof old, old}, nv = {sizeof neu, neu}, empty = {0, ""};
  kc_err e = kcs_del(txn, lru, &ov, err);
  return e ? e : kcs_put(txn, lru, &nv, &empty, 0, err);
}

static kc_err flush_one(kc_store *s, MDB_txn *txn, const kcs_use *use,
                        char *err) {
  MDB_val k = kcs_hex_val(use->key), v;
  kcs_bundle_meta bm;
  if (mdb_get(txn, s->bundlemeta, &k, &v) || v.mv_size != sizeof bm)
    return KC_OK; /* deleted or evicted since it was read */
  memcpy(&bm, v.mv_data, sizeof bm);
  kc_err e;
  if (use->last_used > bm.last_used) {
    if ((e = kcs_lru_move(txn, s->lru, bm.last_used, use->last_used, use->key,
                          err)))
      return e;
    bm.last_used = use->last_used;
  }
  bm.hits += use->hits;
  MDB_val mv = {sizeof bm, &bm};
  return kcs_put(txn, s->bundlemeta, &k, &mv, 0, err);
}

typedef struct uses_ctx {
  kcs_use *u;
  size_t n;
  kcs_use_fn *one;
} uses_ctx;

static kc_err flush_op(kc_store *s, MDB_txn *txn, void *ud, char *err) {
  uses_ctx *c = ud;
  kc_err e = KC_OK;
  for (size_t i = 0; !e && i < c->n; i++)
    e = c->one(s, txn, &c->u[i], err);
  return e;
}

kc_err kcs_uses_flush(kc_store *s, kcs_uses *u, kcs_use_fn *one) {
  uses_ctx c = {.one = one};
  c.n = kcs_uses_take(u, &c.u);
  kc_err e = c.n ? kcs_write(s, flush_op, &c, NULL) : KC_OK;
  free(c.u); /* on failure the records are dropped: they are advisory */
  return e;
}

kc_err kc_store_flush(kc_store *s) {
  kcs_uses_prune(&s->touched, kcs_now() - KCS_UPLOAD_WINDOW_S);
  kcs_uses_prune(&s->fresh, kcs_now() - KCS_UPLOAD_WINDOW_S);
  kc_err e = kcs_uses_flush(s, &s->uses, flush_one);
  kc_err ek = kcs_kv_flush(s); /* RESP keys' (kv_evict.c) */
  return e ? e : ek;
}

/* ---- eviction ---- */

uint64_t kcs_low_target(const kc_store *s, uint64_t used) {
  uint64_t base = s->max_bytes ? s->max_bytes : used;
  return base / 100 * (uint64_t)s->low_pct;
}

/* First entry of an index (lru or orphans): its 64-hex tail. */
static int first_of(MDB_txn *txn, MDB_dbi dbi, char hex[KC_HEX_LEN + 1],
                    int64_t *t) {
  MDB_cursor *cur;
  MDB_val k, v;
  if (mdb_cursor_open(txn, dbi, &cur))
    return -1;
  int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
  if (rc == 0 && k.mv_size == 8 + KC_HEX_LEN) {
    memcpy(hex, (char *)k.mv_data + 8, KC_HEX_LEN);
    hex[KC_HEX_LEN] = '\0';
    *t = time_of(k.mv_data);
  }
  mdb_cursor_close(cur);
  return rc == 0 && k.mv_size == 8 + KC_HEX_LEN ? 0 : -1;
}

int kcs_first_unqueued(kc_store *s, MDB_txn *txn, MDB_dbi dbi,
                       char hex[KC_HEX_LEN + 1], int64_t *t) {
  MDB_cursor *cur;
  MDB_val k, v;
  if (mdb_cursor_open(txn, dbi, &cur))
    return -1;
  int found = -1;
  for (int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    if (k.mv_size != 8 + KC_HEX_LEN)
      continue;
    memcpy(hex, (char *)k.mv_data + 8, KC_HEX_LEN);
    hex[KC_HEX_LEN] = '\0';
    if (!kcs_queue_pending(s, txn, hex)) {
      *t = time_of(k.mv_data);
      found = 0;
      break;
    }
  }
  mdb_cursor_close(cur);
  return found;
}

/* Drops the oldest orphan blob. 1 dropped, 0 none left, <0 error in *e.
 * An orphan spared since it became one (kc_store_blob_spare: a slow client
 * reading it in pieces; kc_store_blob_touch: offered again) is not
 * dropped: its orphan time moves to now, and the next oldest is looked
 * at. (A first upload's window is older_than's business.) */
static int drop_orphan(kc_store *s, MDB_txn *txn, int64_t older_than, kc_err *e,
                       char *err) {
  char digest[KC_HEX_LEN + 1], last[KC_HEX_LEN + 1] = "";
  int64_t since = 0, now = kcs_now();
  for (int skipped = 0; skipped < 64; skipped++) {
    if (first_of(txn, s->orphans, digest, &since) || since >= older_than ||
        !strcmp(digest, last)) /* the one just moved on came first again */
      return 0;
    /* spared (touched) since it became an orphan, and lately */
    int64_t spared = kcs_uses_last(&s->touched, digest);
    if (spared >= since && spared > now - KCS_UPLOAD_WINDOW_S) {
      if ((*e = kcs_blob_retouch(s, txn, digest, err)))
        return -1;
      memcpy(last, digest, sizeof last);
      continue;
    }
    MDB_val k = kcs_hex_val(digest), v;
    kcs_blob_meta bm;
    if (mdb_get(txn, s->blobmeta, &k, &v) || kcs_blob_meta_read(&v, &bm)) {
      *e = kc_errf(err, KC_CORRUPT, "orphan %s has no metadata", digest);
      return -1;
    }
    *e = kcs_blob_drop(s, txn, digest, &bm, err);
    return *e ? -1 : 1;
  }
  return 0; /* 64 marked in a row: the rest waits for the next pass */
}

/* Evicts at most `limit` items; *done when below target or nothing is left. */
kc_err kcs_evict_some(kc_store *s, MDB_txn *txn, uint64_t target, size_t limit,
                      int *done, char *err) {
  kc_err e = KC_OK;
  uint64_t used;
  *done = 0;
  for (size_t i = 0; i < limit; i++) {
    if ((e = kcs_bytes_get(txn, s, &used)) || used <= target) {
      *done = 1;
      return e;
    }
    char key[KC_HEX_LEN + 1];
    int64_t t = 0;
    int have = kcs_first_unqueued(s, txn, s->lru, key, &t) == 0;
    int kv = kcs_kv_evict_first(s, txn, have, t, &e, err); /* kv_evict.c */
    if (kv < 0)
      return e;
    if (kv > 0)
      continue;
    if (have) { /* LRU bundles (and RESP keys) first */
      if ((e = kcs_bundle_drop(s, txn, key, 1, err)))
        return e;
      s->txn_evicted_bundles++; /* counted if the transaction commits */
      continue;
    }
    /* then unreferenced blobs, oldest first */
    int r = drop_orphan(s, txn, kcs_now() - KCS_UPLOAD_WINDOW_S, &e, err);
    if (r < 0)
      return e;
    if (r > 0) {
      s->txn_evicted_blobs++;
      continue;
    }
    /* last, warmup manifests of models without bundles (models.c) */
    r = kcs_warmup_evict_one(s, txn, &e, err);
    if (r < 0)
      return e;
    if (r == 0) {
      *done = 1; /* nothing left to evict */
      return KC_OK;
    }
  }
  return KC_OK;
}

kc_err kcs_evict_txn(kc_store *s, MDB_txn *txn, uint64_t target, char *err) {
  int done;
  return kcs_evict_some(s, txn, target, SIZE_MAX, &done, err);
}

typedef struct evict_ctx {
  uint64_t target;
  int done;
} evict_ctx;

static kc_err evict_op(kc_store *s, MDB_txn *txn, void *ud, char *err) {
  evict_ctx *c = ud;
  return kcs_evict_some(s, txn, c->target, EVICT_BATCH, &c->done, err);
}

kc_err kc_store_evict(kc_store *s, uint64_t target_bytes, char *err) {
  kc_store_flush(s); /* recent reads count before choosing victims */
  evict_ctx c = {target_bytes, 0};
  kc_err e = KC_OK;
  while (!e && !c.done)
    e = kcs_write(s, evict_op, &c, err);
  return e;
}

int kcs_over_high(const kc_store *s, uint64_t limit, uint64_t used,
                  uint64_t incoming, uint64_t *target) {
  if (!limit || used + incoming <= limit / 100 * (uint64_t)s->high_pct)
    return 0;
  uint64_t low = limit / 100 * (uint64_t)s->low_pct;
  *target = low > incoming ? low - incoming : 0;
  return 1;
}

kc_err kcs_maybe_evict(kc_store *s, uint64_t incoming, char *err) {
  if (!s->max_bytes)
    return KC_OK;
  kc_store_stats st;
  uint64_t target;
  kc_err e = kc_store_stats_get(s, &st);
  if (e)
    return kc_errf(err, e, "reading the store's size");
  if (!kcs_over_high(s, s->max_bytes, st.bytes_used, incoming, &target))
    return KC_OK;
  return kc_store_evict(s, target, err);
}

/* ---- gc ---- */

typedef struct gc_ctx {
  int64_t cutoff;
  int done;
} gc_ctx;

static kc_err gc_op(kc_store *s, MDB_txn *txn, void *ud, char *err) {
  gc_ctx *c = ud;
  kc_err e = KC_OK;
  c->done = 0;
  for (size_t i = 0; i < EVICT_BATCH; i++) {
    int r = drop_orphan(s, txn, c->cutoff, &e, err);
    if (r < 0)
      return e;
    if (r == 0) {
      c->done = 1;
      return KC_OK;
    }
    s->txn_gc_blobs++;
  }
  return KC_OK;
}

kc_err kc_store_gc(kc_store *s, int64_t now, char *err) {
  /* An orphan is collected once it has been one for the whole grace period:
   * a client uploads blobs first and the manifest last. */
  gc_ctx c = {now - (int64_t)s->grace_s, 0};
  kc_err e = KC_OK;
  while (!e && !c.done)
    e = kcs_write(s, gc_op, &c, err);
  return e;
}
