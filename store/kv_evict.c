/* kv_evict.c: RESP keys in eviction. Their last uses are batched in memory
 * (kvuses) like bundles' and written by kc_store_flush; evict.c's loop asks
 * kcs_kv_evict_first at each step whether a RESP key goes before the oldest
 * bundle; kv_max_bytes (--resp-max-bytes) is enforced here. */
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

#define KV_EVICT_BATCH 512 /* RESP keys removed per write transaction */

/* Evicts the oldest RESP key. 1 evicted, 0 none, -1 error in *e. */
static int evict_oldest(kc_store *s, MDB_txn *txn, kc_err *e, char *err) {
  char hex[KC_HEX_LEN + 1];
  int64_t t;
  kcs_kv_rec rec;
  if (kcs_first_unqueued(s, txn, s->kvlru, hex, &t))
    return 0;
  *e = kcs_kv_rec_get(txn, s, hex, &rec, NULL);
  if (*e == KC_NOT_FOUND) { /* an index entry without its record */
    unsigned char ik[8 + KC_HEX_LEN];
    kcs_time_key(ik, t, hex);
    MDB_val k = {sizeof ik, ik};
    *e = kcs_del(txn, s->kvlru, &k, err);
    return *e ? -1 : 1;
  }
  if (!*e)
    *e = kcs_kv_drop(s, txn, hex, &rec, 1, err);
  if (*e)
    return -1;
  s->txn_evicted_kv++; /* counted if the transaction commits */
  return 1;
}

int kcs_kv_evict_first(kc_store *s, MDB_txn *txn, int have_bundle,
                       int64_t bundle_last_s, kc_err *e, char *err) {
  char hex[KC_HEX_LEN + 1];
  int64_t t;
  uint64_t kv_bytes = 0, used = 0;
  if (kcs_first_unqueued(s, txn, s->kvlru, hex, &t))
    return 0;
  if ((*e = kcs_kv_bytes_get(txn, s, &kv_bytes)) ||
      (*e = kcs_bytes_get(txn, s, &used)))
    return -1;
  int over = s->kv_max_bytes && kv_bytes > s->kv_max_bytes;
  /* The bundles' share is what the RESP side may not take. bytes_used also
   * counts each RESP key's own bytes (KC_KV_KEY_BYTES): take them off too,
   * at least their fixed part, so keys are not counted as bundles. */
  uint64_t kv_side = kv_bytes;
  MDB_stat ms;
  if (mdb_stat(txn, s->kv, &ms) == 0)
    kv_side += (uint64_t)ms.ms_entries * KC_KV_KEY_OVERHEAD;
  int bundles_over =
      s->kv_max_bytes && s->max_bytes && s->max_bytes > s->kv_max_bytes &&
      used - (kv_side < used ? kv_side : used) > s->max_bytes - s->kv_max_bytes;
  if (have_bundle && !over && (bundles_over || bundle_last_s * 1000 <= t))
    return 0;
  return evict_oldest(s, txn, e, err);
}

/* ---- the RESP side's own limit ---- */

typedef struct cap_ctx {
  uint64_t target;
  int done;
} cap_ctx;

static kc_err cap_op(kc_store *s, MDB_txn *txn, void *ud, char *err) {
  cap_ctx *c = ud;
  kc_err e = KC_OK;
  c->done = 0;
  for (size_t i = 0; i < KV_EVICT_BATCH; i++) {
    uint64_t kv_bytes;
    if ((e = kcs_kv_bytes_get(txn, s, &kv_bytes)) || kv_bytes <= c->target) {
      c->done = 1;
      return e;
    }
    int r = evict_oldest(s, txn, &e, err);
    if (r <= 0) {
      c->done = 1;
      return e;
    }
  }
  return KC_OK;
}

kc_err kcs_kv_maybe_evict(kc_store *s, uint64_t incoming, char *err) {
  if (!s->kv_max_bytes)
    return KC_OK;
  kc_store_stats st;
  cap_ctx c = {0, 0};
  kc_err e = kc_store_stats_get(s, &st);
  if (e)
    return kc_errf(err, e, "reading the store's size");
  if (!kcs_over_high(s, s->kv_max_bytes, st.kv_bytes, incoming, &c.target))
    return KC_OK;
  kc_store_flush(s); /* recent reads count before choosing victims */
  while (!e && !c.done)
    e = kcs_write(s, cap_op, &c, err);
  return e;
}

/* ---- last uses ---- */

/* Moves a key's LRU entry to its last use; rewrites its record. */
static kc_err flush_one(kc_store *s, MDB_txn *txn, const kcs_use *use,
                        char *err) {
  char hex[KC_HEX_LEN + 1];
  memcpy(hex, use->key, KC_HEX_LEN);
  hex[KC_HEX_LEN] = '\0';
  MDB_val k = kcs_hex_val(hex), v;
  kcs_kv_rec rec;
  if (mdb_get(txn, s->kv, &k, &v) || v.mv_size < sizeof rec)
    return KC_OK; /* deleted or evicted since it was read */
  memcpy(&rec, v.mv_data, sizeof rec);
  if (use->last_used <= rec.last_used_ms)
    return KC_OK;
  kc_err e =
      kcs_lru_move(txn, s->kvlru, rec.last_used_ms, use->last_used, hex, err);
  if (e)
    return e;
  /* The record rewritten with its new last use; v points into a page the
   * put may move, hence the copy. */
  rec.last_used_ms = use->last_used;
  MDB_val rv = {v.mv_size, NULL};
  void *copy = malloc(v.mv_size);
  if (!copy)
    return kc_errf(err, KC_NOMEM, "out of memory");
  memcpy(copy, v.mv_data, v.mv_size);
  memcpy(copy, &rec, sizeof rec);
  if (!(e = kcs_put(txn, s->kv, &k, &rv, MDB_RESERVE, err)))
    memcpy(rv.mv_data, copy, v.mv_size);
  free(copy);
  return e;
}

kc_err kcs_kv_flush(kc_store *s) {
  return kcs_uses_flush(s, &s->kvuses, flush_one);
}
