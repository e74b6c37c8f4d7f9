/* kv.c: RESP keys (kc_store.h, "RESP keys"): a key maps to a record naming
 * its value's blob, the blob is an ordinary refcounted one. Reads (get,
 * meta) and the batched writes of kc_store_kv_apply, one write transaction
 * and one sync per batch. SCAN, expiry and verify are kv_scan.c, eviction
 * kv_evict.c. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

#define NONE ((size_t)-1)

_Static_assert(KC_KV_KEY_OVERHEAD >= sizeof(kcs_kv_rec) + KC_HEX_LEN +
                                         2 * (8 + KC_HEX_LEN) + 3 * 8,
               "KC_KV_KEY_OVERHEAD counts the record and both index entries");

static MDB_val kv_bytes_name(void) {
  MDB_val k = {8, (void *)"kv_bytes"};
  return k;
}

kc_err kcs_kv_bytes_get(MDB_txn *txn, kc_store *s, uint64_t *out) {
  MDB_val k = kv_bytes_name(), v;
  int rc = mdb_get(txn, s->meta, &k, &v);
  *out = 0;
  if (rc == MDB_NOTFOUND)
    return KC_OK;
  if (rc || v.mv_size != sizeof *out)
    return kcs_mdb_err(rc ? rc : MDB_CORRUPTED, "reading RESP bytes", NULL);
  memcpy(out, v.mv_data, sizeof *out);
  return KC_OK;
}

/* Adds delta to the RESP bytes counter in meta; with batch (a
 * kc_store_kv_apply) only to *batch, written once per commit (kv_bytes_put):
 * one meta write per commit, not two per op. */
static kc_err kv_bytes_add(MDB_txn *txn, kc_store *s, int64_t delta,
                           int64_t *batch, char *err) {
  if (batch)
    return *batch += delta, KC_OK;
  if (delta == 0)
    return KC_OK;
  uint64_t used;
  kc_err e = kcs_kv_bytes_get(txn, s, &used);
  if (e)
    return kc_errf(err, e, "reading RESP bytes");
  used = delta < 0 && (uint64_t)-delta > used ? 0 : used + (uint64_t)delta;
  MDB_val k = kv_bytes_name(), v = {sizeof used, &used};
  return kcs_put(txn, s->meta, &k, &v, 0, err);
}

/* One SHA-256 hasher per thread for the keys' hashes, made on the thread's
 * first key and freed when it exits: kc_sha256_hex makes and frees an
 * OpenSSL context per call, which cost a RESP GET more instructions than
 * hashing its key (a malloc, a free and the cleansing of the context). */
static pthread_key_t kh_key;
static pthread_once_t kh_once = PTHREAD_ONCE_INIT;
static _Thread_local kc_sha256 *kh_mine;

static void kh_gone(void *h) { kc_sha256_free(h); }
static void kh_key_make(void) { pthread_key_create(&kh_key, kh_gone); }

static kc_sha256 *thread_hasher(void) {
  if (kh_mine)
    return kh_mine;
  pthread_once(&kh_once, kh_key_make);
  kc_sha256 *h = kc_sha256_new();
  if (h && pthread_setspecific(kh_key, h)) {
    kc_sha256_free(h);
    return NULL;
  }
  return kh_mine = h;
}

static kc_err key_hex(const void *key, size_t klen, char hex[KC_HEX_LEN + 1]) {
  if (!key || klen == 0 || klen > KC_KV_KEY_MAX)
    return KC_BAD_KEY;
  kc_sha256 *h = thread_hasher();
  if (!h) /* out of memory for the context: the one-shot path */
    return kc_sha256_hex(key, klen, hex);
  kc_err e = kc_sha256_reset(h);
  if (!e)
    e = kc_sha256_update(h, key, klen);
  return e ? e : kc_sha256_final(h, hex);
}

kc_err kcs_kv_rec_get(MDB_txn *txn, kc_store *s, const char *hex,
                      kcs_kv_rec *rec, const void **key) {
  MDB_val k = kcs_hex_val(hex), v;
  int rc = mdb_get(txn, s->kv, &k, &v);
  if (rc == MDB_NOTFOUND)
    return KC_NOT_FOUND;
  if (rc || v.mv_size < sizeof *rec)
    return kcs_mdb_err(rc ? rc : MDB_CORRUPTED, "reading a RESP key", NULL);
  memcpy(rec, v.mv_data, sizeof *rec);
  if (v.mv_size != sizeof *rec + rec->klen)
    return kcs_mdb_err(MDB_CORRUPTED, "reading a RESP key", NULL);
  if (key)
    *key = (const char *)v.mv_data + sizeof *rec;
  return KC_OK;
}

/* The live record of key: present, the same key (not merely the same hash),
 * not expired at now_ms, and its blob held (*data, *len into the map). */
static kc_err live_rec(MDB_txn *txn, kc_store *s, const char *hex,
                       const void *key, size_t klen, int64_t now_ms,
                       kcs_kv_rec *rec, const void **data, size_t *len,
                       kc_store_enc *enc) {
  const void *held;
  kc_err e = kcs_kv_rec_get(txn, s, hex, rec, &held);
  if (e)
    return e;
  if (rec->klen != klen || memcmp(held, key, klen) != 0 ||
      (rec->expire_ms && rec->expire_ms <= now_ms))
    return KC_NOT_FOUND;
  char digest[KC_HEX_LEN + 1];
  memcpy(digest, rec->digest, KC_HEX_LEN);
  digest[KC_HEX_LEN] = '\0';
  MDB_val k = kcs_hex_val(digest), v;
  /* A blob evicted or scrubbed away under the key: a miss. */
  int rc = mdb_get(txn, s->blobs, &k, &v);
  if (rc == MDB_NOTFOUND)
    return KC_NOT_FOUND;
  if (rc)
    return kcs_mdb_err(rc, "reading a RESP value", NULL);
  kcs_blob_meta bm = {.size = v.mv_size};
  MDB_val mv;
  /* a frame's magic: the blob may be held compressed */
  if (kcs_zstd_magic(v.mv_data, v.mv_size) &&
      (mdb_get(txn, s->blobmeta, &k, &mv) || kcs_blob_meta_read(&mv, &bm)))
    return KC_NOT_FOUND;
  if (bm.size != rec->size)
    return KC_NOT_FOUND;
  if (enc)
    *enc = (kc_store_enc)bm.enc;
  if (data)
    *data = v.mv_data;
  if (len)
    *len = v.mv_size;
  return KC_OK;
}

kc_err kc_store_kv_get(kc_store_read *r, const void *key, size_t klen,
                       int64_t now_ms, kc_store_kv_val *out) {
  kc_store *s = r->s;
  char hex[KC_HEX_LEN + 1];
  kcs_kv_rec rec;
  kc_err e = key_hex(key, klen, hex);
  if (!e)
    e = live_rec(r->txn, s, hex, key, klen, now_ms, &rec, &out->data, &out->len,
                 &out->enc);
  if (e == KC_NOT_FOUND)
    atomic_fetch_add(&s->kv_misses, 1);
  if (e)
    return e;
  atomic_fetch_add(&s->kv_hits, 1);
  /* A key's last use moves in steps of kv_use_grain_ms: a GET of a key
   * whose record was used (or set) more recently records nothing, so a hot
   * key costs the table of uses and the write that flushes it once per step,
   * not on every GET (with 10,000 keys read in turn, 11% of a GET's CPU:
   * a cache miss in the table, and 10,000 record and index rewrites a
   * second). Eviction then orders keys to within that step. now_ms is
   * the caller's wall clock (expiry is in unix ms too): no second read. */
  if (now_ms - rec.last_used_ms >= s->kv_use_grain_ms)
    kcs_uses_record(&s->kvuses, hex, now_ms);
  out->expire_ms = rec.expire_ms;
  out->size = rec.size;
  return KC_OK;
}

kc_err kc_store_kv_meta(kc_store_read *r, const void *key, size_t klen,
                        int64_t now_ms, uint64_t *size, int64_t *expire_ms) {
  char hex[KC_HEX_LEN + 1];
  kcs_kv_rec rec;
  kc_err e = key_hex(key, klen, hex);
  if (!e)
    e = live_rec(r->txn, r->s, hex, key, klen, now_ms, &rec, NULL, NULL, NULL);
  if (e)
    return e;
  if (size)
    *size = rec.size;
  if (expire_ms)
    *expire_ms = rec.expire_ms;
  return KC_OK;
}

/* ---- the records and their index entries ---- */

static void idx_key(unsigned char out[8 + KC_HEX_LEN], int64_t t,
                    const char *hex) {
  kcs_time_key(out, t, hex);
}

static kc_err idx_put(MDB_txn *txn, MDB_dbi dbi, int64_t t, const char *hex,
                      char *err) {
  unsigned char ik[8 + KC_HEX_LEN];
  idx_key(ik, t, hex);
  MDB_val k = {sizeof ik, ik}, empty = {0, ""};
  return kcs_put(txn, dbi, &k, &empty, 0, err);
}

static kc_err idx_del(MDB_txn *txn, MDB_dbi dbi, int64_t t, const char *hex,
                      char *err) {
  unsigned char ik[8 + KC_HEX_LEN];
  idx_key(ik, t, hex);
  MDB_val k = {sizeof ik, ik};
  return kcs_del(txn, dbi, &k, err);
}

/* Drops one reference to a RESP value: the last one frees the blob at once
 * (a cache's DEL frees), unless an HTTP client just offered it for a
 * manifest on its way: then it is an orphan, as bundle.c leaves them. */
static kc_err kv_unref(kc_store *s, MDB_txn *txn, const char *digest,
                       int evicting, char *err) {
  MDB_val k = kcs_hex_val(digest), v;
  kcs_blob_meta bm;
  int64_t now = kcs_now();
  if (mdb_get(txn, s->blobmeta, &k, &v) || kcs_blob_meta_read(&v, &bm))
    return KC_OK; /* gone already (scrubbed): nothing to release */
  if (bm.refs <= 1 && !kcs_blob_touched(s, digest, now)) {
    kc_err e = kcs_blob_drop(s, txn, digest, &bm, err);
    if (!e && evicting)
      atomic_fetch_add(&s->evicted_blobs, 1);
    return e;
  }
  return kcs_blob_unref(s, txn, digest, now, 0, err);
}

static kc_err kv_drop(kc_store *s, MDB_txn *txn, const char *hex,
                      const kcs_kv_rec *rec, int evicting, int64_t *batch,
                      char *err) {
  char digest[KC_HEX_LEN + 1];
  memcpy(digest, rec->digest, KC_HEX_LEN);
  digest[KC_HEX_LEN] = '\0';
  MDB_val k = kcs_hex_val(hex);
  kc_err e;
  if ((e = kcs_del(txn, s->kv, &k, err)) ||
      (e = idx_del(txn, s->kvlru, rec->last_used_ms, hex, err)) ||
      (rec->expire_ms &&
       (e = idx_del(txn, s->kvexp, rec->expire_ms, hex, err))) ||
      (e = kv_bytes_add(txn, s, -(int64_t)rec->size, batch, err)) ||
      (e = kcs_bytes_add(txn, s, -(int64_t)KC_KV_KEY_BYTES(rec->klen), err)) ||
      (e = kcs_queue_unpend(s, txn, hex, err)))
    return e;
  return kv_unref(s, txn, digest, evicting, err);
}

kc_err kcs_kv_drop(kc_store *s, MDB_txn *txn, const char *hex,
                   const kcs_kv_rec *rec, int evicting, char *err) {
  return kv_drop(s, txn, hex, rec, evicting, NULL, err);
}

/* Stores the value's blob, absent until now (refs 1: never an orphan;
 * zval: its frame, when compressing saved an eighth), and queues it for
 * the durable tier. */
static kc_err value_store(kc_store *s, MDB_txn *txn, const char *digest,
                          const void *val, size_t len, const void *zval,
                          size_t zlen, char *err) {
  kc_err e;
  size_t put = zval ? zlen : len;
  MDB_val k = kcs_hex_val(digest), v = {put, NULL};
  if ((e = kcs_put(txn, s->blobs, &k, &v, MDB_RESERVE, err)))
    return e;
  if (put)
    memcpy(v.mv_data, zval ? zval : val, put);
  int64_t now = kcs_now();
  kcs_blob_meta bm = {len, 1, now, 0, put, zval ? KC_STORE_ZSTD : 0, 0};
  MDB_val mv = kcs_blob_meta_val(&bm);
  if ((e = kcs_put(txn, s->blobmeta, &k, &mv, 0, err)) ||
      (e = kcs_bytes_add(txn, s, (int64_t)put, err)) ||
      (e = kcs_saved_add(txn, s, (int64_t)(len - put), err)))
    return e;
  return kcs_queue_add(s, txn, KCS_Q_BLOB, digest, NULL, err);
}

static kc_err rec_write(kc_store *s, MDB_txn *txn, const char *hex,
                        const kcs_kv_rec *rec, const void *key, char *err) {
  MDB_val k = kcs_hex_val(hex), v = {sizeof *rec + rec->klen, NULL};
  kc_err e = kcs_put(txn, s->kv, &k, &v, MDB_RESERVE, err);
  if (e)
    return e;
  memcpy(v.mv_data, rec, sizeof *rec);
  memcpy((char *)v.mv_data + sizeof *rec, key, rec->klen);
  return KC_OK;
}

/* A new record, or one replacing old (its index entries then change only
 * where their time did). key must not point into the map. */
static kc_err rec_put(kc_store *s, MDB_txn *txn, const char *hex,
                      const kcs_kv_rec *rec, const kcs_kv_rec *old,
                      const void *key, int64_t *batch, char *err) {
  kc_err e = rec_write(s, txn, hex, rec, key, err);
  int64_t lru0 = old ? old->last_used_ms : 0, exp0 = old ? old->expire_ms : 0;
  int lru = !old || lru0 != rec->last_used_ms, exp = exp0 != rec->expire_ms;
  if (e || (lru && old && (e = idx_del(txn, s->kvlru, lru0, hex, err))) ||
      (lru && (e = idx_put(txn, s->kvlru, rec->last_used_ms, hex, err))) ||
      (exp && exp0 && (e = idx_del(txn, s->kvexp, exp0, hex, err))) ||
      (exp && rec->expire_ms &&
       (e = idx_put(txn, s->kvexp, rec->expire_ms, hex, err))))
    return e;
  /* the key's own bytes toward max_bytes (an overwrite: the same key) */
  int64_t meta = (int64_t)KC_KV_KEY_BYTES(rec->klen) -
                 (old ? (int64_t)KC_KV_KEY_BYTES(old->klen) : 0);
  if (meta && (e = kcs_bytes_add(txn, s, meta, err)))
    return e;
  return kv_bytes_add(
      txn, s, (int64_t)rec->size - (old ? (int64_t)old->size : 0), batch, err);
}

kc_err kcs_kv_rec_put(kc_store *s, MDB_txn *txn, const char *hex,
                      const kcs_kv_rec *rec, const void *key, char *err) {
  return rec_put(s, txn, hex, rec, NULL, key, NULL, err);
}

/* ---- kc_store_kv_apply ---- */

/* An op with what was computed before the write lock. */
typedef struct kv_job {
  kc_store_kv_op *op;
  char hex[KC_HEX_LEN + 1];    /* LMDB key: sha256 of the RESP key */
  char digest[KC_HEX_LEN + 1]; /* SET: the value's */
  int skip;                    /* failed on its own (op->err) */
  int noop;                    /* a SET that changed nothing stored */
  void *zval;                  /* SET: the value compressed, or NULL */
  size_t zlen;
  int ztried; /* compression tried (zval may stay NULL) */
} kv_job;

typedef struct apply_ctx {
  kv_job *jobs;
  size_t n;
  int64_t now_ms;
  size_t at;        /* the op running, for a full map */
  int64_t kv_bytes; /* the batch's change to the RESP bytes counter */
} apply_ctx;

/* The key's state for an op: *present (a record, live or not), *live. */
typedef struct kv_state {
  kcs_kv_rec rec;
  int present, live;
  const void *data;
  size_t len;
  kc_store_enc enc; /* KC_STORE_ZSTD: data is a frame of rec.size bytes */
} kv_state;

static kc_err state_of(kc_store *s, MDB_txn *txn, const kv_job *j,
                       int64_t now_ms, kv_state *st) {
  memset(st, 0, sizeof *st);
  kc_err e = live_rec(txn, s, j->hex, j->op->key, j->op->klen, now_ms, &st->rec,
                      &st->data, &st->len, &st->enc);
  if (e == KC_OK)
    st->present = st->live = 1;
  else if (e == KC_NOT_FOUND)
    st->present = kcs_kv_rec_get(txn, s, j->hex, &st->rec, NULL) == KC_OK;
  else
    return e;
  return KC_OK;
}

static kc_err copy_old(kc_store_kv_op *op, const kv_state *st, char *err) {
  op->had_old = st->live;
  if (!st->live)
    return KC_OK;
  size_t n = st->enc == KC_STORE_ZSTD ? (size_t)st->rec.size : st->len;
  op->old = malloc(n ? n : 1);
  if (!op->old)
    return kc_errf(err, KC_NOMEM, "out of memory");
  op->old_len = n;
  if (st->enc == KC_STORE_ZSTD)
    return kc_store_zstd_decode(st->data, st->len, op->old, n, err);
  if (st->len)
    memcpy(op->old, st->data, st->len);
  return KC_OK;
}

static int blob_held(kc_store *s, MDB_txn *txn, const char *digest) {
  MDB_val k = kcs_hex_val(digest), v;
  return mdb_get(txn, s->blobmeta, &k, &v) == 0;
}

/* The SET changes nothing stored: the key holds the same value with the same
 * expiry (redis-benchmark's SETs, a cache writing what it just read). Only
 * its use is recorded, in memory and batched as reads' are. */
static int set_is_noop(const kv_job *j, const kv_state *st, int64_t exp) {
  return st->live && st->rec.expire_ms == exp && st->rec.size == j->op->vlen &&
         memcmp(st->rec.digest, j->digest, KC_HEX_LEN) == 0;
}

/* The key's record now names the op's value: the new reference before the
 * old one goes (the same value is not freed and written again); a
 * replaced record keeps the index entries whose times did not change. */
static kc_err set_rec(kc_store *s, MDB_txn *txn, kv_job *j, const kv_state *st,
                      int64_t exp, int64_t *batch, char *err) {
  kc_store_kv_op *op = j->op;
  /* the same value: the old record's reference passes to the new one; a
   * blob scrubbed away under it (no reference left) is stored again */
  int same = st->present && memcmp(st->rec.digest, j->digest, KC_HEX_LEN) == 0;
  int held = same && (st->live || blob_held(s, txn, j->digest));
  kc_err e = held ? KC_OK : kcs_blob_ref(s, txn, j->digest, err);
  if (e == KC_NOT_FOUND) {
    /* absent: stored now, compressed here if it was held when compress_new
     * looked (evicted meanwhile) */
    e = j->ztried ? KC_OK
                  : (j->ztried = 1,
                     kcs_zstd_compress(s->compress_level, op->val, op->vlen,
                                       &j->zval, &j->zlen, err));
    if (!e)
      e = value_store(s, txn, j->digest, op->val, op->vlen, j->zval, j->zlen,
                      err);
  }
  /* a replaced record keeps its LRU entry: the use goes with the reads'
   * (kvuses, flushed once a second), not into this commit */
  int64_t now = kc_clock_wall_ms();
  kcs_kv_rec rec = {.size = op->vlen,
                    .expire_ms = exp,
                    .last_used_ms = st->present ? st->rec.last_used_ms : now,
                    .klen = (uint32_t)op->klen};
  memcpy(rec.digest, j->digest, KC_HEX_LEN);
  if (st->present)
    kcs_uses_record(&s->kvuses, j->hex, now);
  if (e ||
      (e = rec_put(s, txn, j->hex, &rec, st->present ? &st->rec : NULL, op->key,
                   batch, err)) ||
      !st->present || same)
    return e;
  char old[KC_HEX_LEN + 1];
  memcpy(old, st->rec.digest, KC_HEX_LEN);
  old[KC_HEX_LEN] = '\0';
  return kv_unref(s, txn, old, 0, err);
}

static kc_err op_set(kc_store *s, MDB_txn *txn, kv_job *j, int64_t now_ms,
                     int64_t *batch, char *err) {
  kc_store_kv_op *op = j->op;
  kv_state st;
  kc_err e = state_of(s, txn, j, now_ms, &st);
  if (!e && (op->flags & KC_KV_GET))
    e = copy_old(op, &st, err);
  if (e || ((op->flags & KC_KV_NX) && st.live) ||
      ((op->flags & KC_KV_XX) && !st.live))
    return e; /* done stays 0: refused */
  int64_t exp =
      (op->flags & KC_KV_KEEPTTL) && st.live ? st.rec.expire_ms : op->expire_ms;
  op->done = 1;
  if (exp && exp <= now_ms) /* set in the past: gone at once */
    return st.present ? kv_drop(s, txn, j->hex, &st.rec, 0, batch, err) : e;
  if (set_is_noop(j, &st, exp)) {
    j->noop = 1;
    kcs_uses_record(&s->kvuses, j->hex, kc_clock_wall_ms());
    return KC_OK;
  }
  return set_rec(s, txn, j, &st, exp, batch, err);
}

static kc_err op_del(kc_store *s, MDB_txn *txn, kv_job *j, int64_t now_ms,
                     int64_t *batch, char *err) {
  kv_state st;
  kc_err e = state_of(s, txn, j, now_ms, &st);
  if (e || !st.present)
    return e;
  j->op->done = (uint64_t)st.live;
  return kv_drop(s, txn, j->hex, &st.rec, 0, batch, err);
}

/* Redis 7's EXPIRE flags; no expiry counts as an infinite one for GT/LT. */
static int expire_refused(int flags, int64_t cur, int64_t want) {
  if ((flags & KC_KV_NX) && cur)
    return 1;
  if ((flags & KC_KV_XX) && !cur)
    return 1;
  if ((flags & KC_KV_GT) && (!cur || want <= cur))
    return 1;
  return (flags & KC_KV_LT) && cur && want >= cur;
}

static kc_err op_expire(kc_store *s, MDB_txn *txn, kv_job *j, int64_t now_ms,
                        int64_t *batch, char *err) {
  kc_store_kv_op *op = j->op;
  kv_state st;
  kc_err e = state_of(s, txn, j, now_ms, &st);
  if (e || !st.live ||
      expire_refused(op->flags, st.rec.expire_ms, op->expire_ms))
    return e;
  op->done = 1;
  if (op->expire_ms <= now_ms)
    return kv_drop(s, txn, j->hex, &st.rec, 0, batch, err);
  return KC_OK; /* set below by retime */
}

/* Rewrites a live record with a new expiry (EXPIRE, PERSIST). */
static kc_err retime(kc_store *s, MDB_txn *txn, kv_job *j, int64_t now_ms,
                     int64_t exp, char *err) {
  kv_state st;
  const void *key;
  kc_err e = state_of(s, txn, j, now_ms, &st);
  if (e || !st.live)
    return e;
  if ((e = kcs_kv_rec_get(txn, s, j->hex, &st.rec, &key)))
    return e;
  kcs_kv_rec rec = st.rec;
  rec.expire_ms = exp;
  MDB_val k = kcs_hex_val(j->hex), v = {sizeof rec + rec.klen, NULL};
  void *copy = malloc(rec.klen); /* key points into a page the put may move */
  if (!copy)
    return kc_errf(err, KC_NOMEM, "out of memory");
  memcpy(copy, key, rec.klen);
  if (!(e = kcs_put(txn, s->kv, &k, &v, MDB_RESERVE, err))) {
    memcpy(v.mv_data, &rec, sizeof rec);
    memcpy((char *)v.mv_data + sizeof rec, copy, rec.klen);
  }
  free(copy);
  if (!e && st.rec.expire_ms)
    e = idx_del(txn, s->kvexp, st.rec.expire_ms, j->hex, err);
  if (!e && exp)
    e = idx_put(txn, s->kvexp, exp, j->hex, err);
  return e;
}

static kc_err op_persist(kc_store *s, MDB_txn *txn, kv_job *j, int64_t now_ms,
                         char *err) {
  kv_state st;
  kc_err e = state_of(s, txn, j, now_ms, &st);
  if (e || !st.live || !st.rec.expire_ms)
    return e;
  j->op->done = 1;
  return retime(s, txn, j, now_ms, 0, err);
}

static kc_err op_flush(kc_store *s, MDB_txn *txn, kv_job *j, int64_t *batch,
                       char *err) {
  MDB_cursor *cur;
  MDB_val k, v;
  int rc = mdb_cursor_open(txn, s->kv, &cur);
  if (rc)
    return kcs_mdb_err(rc, "walking the RESP keys", err);
  kc_err e = KC_OK;
  while (!e && (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST)) == 0) {
    char hex[KC_HEX_LEN + 1] = "";
    kcs_kv_rec rec;
    if (k.mv_size != KC_HEX_LEN || v.mv_size < sizeof rec) {
      e = kcs_mdb_err(MDB_CORRUPTED, "walking the RESP keys", err);
      break;
    }
    memcpy(hex, k.mv_data, KC_HEX_LEN);
    memcpy(&rec, v.mv_data, sizeof rec);
    if (!(e = kv_drop(s, txn, hex, &rec, 0, batch, err)) &&
        !(e = kcs_queue_add(s, txn, KCS_Q_KVDEL, hex, NULL, err)))
      j->op->done++;
  }
  mdb_cursor_close(cur);
  if (!e && rc != MDB_NOTFOUND)
    e = kcs_mdb_err(rc, "walking the RESP keys", err);
  return e;
}

/* With the durable tier: after a write of the key (a DEL even of a key
 * evicted here: the bucket may hold it), its record goes up, or its
 * removal does. */
static kc_err queue_key(kc_store *s, MDB_txn *txn, const kv_job *j, char *err) {
  kc_store_kv_op *op = j->op;
  if (!s->tier || op->op == KC_KV_FLUSH || j->noop ||
      (!op->done && op->op != KC_KV_DEL))
    return KC_OK;
  kcs_kv_rec rec;
  kc_err e = kcs_kv_rec_get(txn, s, j->hex, &rec, NULL);
  if (e && e != KC_NOT_FOUND)
    return e;
  return kcs_queue_add(s, txn, e ? KCS_Q_KVDEL : KCS_Q_KV, j->hex, NULL, err);
}

static kc_err run_one(kc_store *s, MDB_txn *txn, kv_job *j, int64_t now_ms,
                      int64_t *batch, char *err);

static kc_err run_op(kc_store *s, MDB_txn *txn, kv_job *j, int64_t now_ms,
                     int64_t *batch, char *err) {
  kc_err e = run_one(s, txn, j, now_ms, batch, err);
  return e ? e : queue_key(s, txn, j, err);
}

static kc_err run_one(kc_store *s, MDB_txn *txn, kv_job *j, int64_t now_ms,
                      int64_t *batch, char *err) {
  kc_store_kv_op *op = j->op;
  switch (op->op) {
  case KC_KV_SET:
    return op_set(s, txn, j, now_ms, batch, err);
  case KC_KV_DEL:
    return op_del(s, txn, j, now_ms, batch, err);
  case KC_KV_EXPIRE: {
    kc_err e = op_expire(s, txn, j, now_ms, batch, err);
    if (e || !op->done || op->expire_ms <= now_ms)
      return e;
    return retime(s, txn, j, now_ms, op->expire_ms, err);
  }
  case KC_KV_PERSIST:
    return op_persist(s, txn, j, now_ms, err);
  case KC_KV_FLUSH:
    return op_flush(s, txn, j, batch, err);
  }
  return kc_errf(err, KC_EINVAL, "unknown RESP store op %d", (int)op->op);
}

static void reset_results(kc_store_kv_op *op) {
  free(op->old); /* from an attempt that was rolled back */
  op->old = NULL;
  op->old_len = 0;
  op->had_old = 0;
  op->done = 0;
}

static kc_err apply_op(kc_store *s, MDB_txn *txn, void *ud, char *err) {
  apply_ctx *c = ud;
  c->at = NONE;
  c->kv_bytes = 0;
  for (size_t i = 0; i < c->n; i++)
    if (!c->jobs[i].skip) {
      reset_results(c->jobs[i].op);
      c->jobs[i].noop = 0;
    }
  for (size_t i = 0; i < c->n; i++) {
    if (c->jobs[i].skip)
      continue;
    c->at = i;
    kc_err e = run_op(s, txn, &c->jobs[i], c->now_ms, &c->kv_bytes, err);
    if (e)
      return e;
  }
  c->at = NONE;
  return kv_bytes_add(txn, s, c->kv_bytes, NULL, err);
}

/* A SET's own refusals: too large for the limits, no value. */
static kc_err set_checks(const kc_store *s, const kc_store_kv_op *op) {
  if ((s->max_bytes && op->vlen + KC_KV_KEY_BYTES(op->klen) > s->max_bytes) ||
      (s->kv_max_bytes && op->vlen > s->kv_max_bytes))
    return KC_TOO_LARGE;
  return !op->val && op->vlen ? KC_EINVAL : KC_OK;
}

/* Checks and hashes an op before the write lock: 0 to run it, else its own
 * error is set. */
static int prepare(kc_store *s, kv_job *j) {
  kc_store_kv_op *op = j->op;
  op->old = NULL; /* not freed: the caller's before the call */
  op->old_len = 0;
  op->had_old = 0;
  op->done = 0;
  op->err = KC_OK;
  if (op->op == KC_KV_FLUSH)
    return 0;
  int hashed = op->op == KC_KV_SET && op->hashed;
  if (hashed)
    memcpy(j->hex, op->key_hex, sizeof j->hex);
  else if ((op->err = key_hex(op->key, op->klen, j->hex)))
    return -1;
  if (op->op != KC_KV_SET)
    return 0;
  if ((op->err = set_checks(s, op)))
    return -1;
  if (hashed)
    memcpy(j->digest, op->val_hex, sizeof j->digest);
  else
    op->err = kc_sha256_hex(op->vlen ? op->val : "", op->vlen, j->digest);
  return op->err ? -1 : 0;
}

/* Values whose blob is not held yet are compressed, before the write lock,
 * when that halves it; one already held (the same value
 * SET again, or under another key) is not: compressing it is wasted work
 * (most of a 4 KiB SET's CPU). A blob gone by the write is compressed
 * there (set_rec). */
static void compress_new(kc_store *s, kv_job *jobs, size_t n) {
  if (s->compress_level <= 0)
    return;
  kc_store_read *r = NULL;
  for (size_t i = 0; i < n; i++) {
    kv_job *j = &jobs[i];
    if (j->skip || j->op->op != KC_KV_SET || j->op->vlen < KCS_ZSTD_MIN)
      continue;
    if (!r && kc_store_read_begin(s, &r))
      r = NULL; /* no read: compress every value */
    if (r && blob_held(s, r->txn, j->digest))
      continue;
    j->ztried = 1;
    kc_err e = kcs_zstd_compress(s->compress_level, j->op->val, j->op->vlen,
                                 &j->zval, &j->zlen, NULL);
    if (e) {
      j->op->err = e;
      j->skip = 1;
    }
  }
  kc_store_read_end(r);
}

/* Room for the batch's values (and keys, which bytes_used counts) before
 * the write (eviction is writes of its own): under max_bytes and under the
 * RESP side's kv_max_bytes (values only). */
static kc_err make_room(kc_store *s, const kv_job *jobs, size_t n, char *err) {
  uint64_t values = 0, keys = 0;
  for (size_t i = 0; i < n; i++)
    if (!jobs[i].skip && jobs[i].op->op == KC_KV_SET) {
      values += jobs[i].op->vlen;
      keys += KC_KV_KEY_BYTES(jobs[i].op->klen);
    }
  if (!keys)
    return KC_OK;
  kc_err e = values ? kcs_kv_maybe_evict(s, values, err) : KC_OK;
  return e ? e : kcs_maybe_evict(s, values + keys, err);
}

/* Runs the batch; an op that fails (a value the full map cannot take, an
 * unreadable record) is taken out and the rest run again, so it fails
 * alone. */
static kc_err run_batch(kc_store *s, apply_ctx *c, char *err) {
  for (;;) {
    kc_err e = kcs_write(s, apply_op, c, err);
    if (e == KC_OK || c->at == NONE)
      return e;
    kv_job *j = &c->jobs[c->at];
    j->skip = 1;
    reset_results(j->op);
    j->op->err = e == KCS_MAP_FULL ? KC_STORE_FULL : e;
  }
}

kc_err kc_store_kv_apply(kc_store *s, kc_store_kv_op *ops, size_t n,
                         int64_t now_ms, char *err) {
  apply_ctx c = {calloc(n ? n : 1, sizeof *c.jobs), n, now_ms, NONE, 0};
  if (!c.jobs) {
    for (size_t i = 0; i < n; i++)
      ops[i].err = KC_NOMEM;
    return kc_errf(err, KC_NOMEM, "out of memory");
  }
  for (size_t i = 0; i < n; i++) {
    c.jobs[i].op = &ops[i];
    c.jobs[i].skip = prepare(s, &c.jobs[i]) != 0;
  }
  compress_new(s, c.jobs, n);
  size_t runnable = 0;
  for (size_t i = 0; i < n; i++)
    runnable += !c.jobs[i].skip;
  kc_err e = runnable ? make_room(s, c.jobs, n, err) : KC_OK;
  if (!e && runnable)
    e = run_batch(s, &c, err);
  for (size_t i = 0; e && i < n; i++) {
    reset_results(&ops[i]);
    if (!ops[i].err)
      ops[i].err = e;
  }
  if (!e)
    kcs_tier_kick(s);
  for (size_t i = 0; i < n; i++)
    free(c.jobs[i].zval);
  free(c.jobs);
  return e;
}

/* ---- a SET settled without a write ---- */

#define CMP_Z_MIN (64 * 1024) /* smaller frames: hashing costs less */
#define CMP_Z_RATIO 16        /* frames at most 1/16 of their content */

/* The live value st holds is val's bytes. A raw blob is compared, not
 * hashed: memcmp runs at memory speed, SHA-256 several times slower (most
 * of a 1 MiB SET's CPU), and equal bytes are equal digests. A compressed
 * one is compared through its frame when that frame is at most 1/16 of
 * the content (a big, very repetitive value: decompressing it runs at
 * memset-like speed, 6x faster than SHA-256 at 1 MiB here), else by its
 * digest (op->val_hex, computed here): decompressing a frame that
 * compresses less costs more than hashing (about 1 GB/s, SHA-256 with
 * SHA-NI 1.8 GB/s). */
static int same_value(const kv_state *st, kc_store_kv_op *op) {
  if (st->rec.size != op->vlen)
    return 0;
  if (st->enc != KC_STORE_ZSTD)
    return st->len == op->vlen &&
           (!op->vlen || memcmp(st->data, op->val, op->vlen) == 0);
  if (op->hashed) /* the caller's digest of val (kc_store_kv_op) */
    return memcmp(st->rec.digest, op->val_hex, KC_HEX_LEN) == 0;
  if (op->vlen >= CMP_Z_MIN && st->len <= op->vlen / CMP_Z_RATIO)
    return kcs_zstd_equals(st->data, st->len, op->val, op->vlen);
  if (kc_sha256_hex(op->vlen ? op->val : "", op->vlen, op->val_hex))
    return 0;
  op->hashed = 1; /* key_hex is filled by the caller */
  return memcmp(st->rec.digest, op->val_hex, KC_HEX_LEN) == 0;
}

int kc_store_kv_set_settled(kc_store_read *r, kc_store_kv_op *op,
                            int64_t now_ms) {
  kc_store *s = r->s;
  if (op->op != KC_KV_SET || (op->flags & KC_KV_GET) || set_checks(s, op))
    return 0;
  kv_job j = {.op = op};
  if (op->hashed)
    memcpy(j.hex, op->key_hex, sizeof j.hex);
  else if (key_hex(op->key, op->klen, j.hex))
    return 0;
  kv_state st;
  if (state_of(s, r->txn, &j, now_ms, &st))
    return 0;
  if (((op->flags & KC_KV_NX) && st.live) ||
      ((op->flags & KC_KV_XX) && !st.live)) {
    op->done = 0; /* refused, as op_set would */
    return 1;
  }
  int64_t exp =
      (op->flags & KC_KV_KEEPTTL) && st.live ? st.rec.expire_ms : op->expire_ms;
  memcpy(op->key_hex, j.hex, sizeof op->key_hex);
  /* live: not expired at now_ms, so neither is exp */
  if (st.live && exp == st.rec.expire_ms && same_value(&st, op)) {
    op->done = 1;
    kcs_uses_record(&s->kvuses, j.hex, kc_clock_wall_ms());
    return 1;
  }
  /* to the commit: hashed here, not under the write lock */
  if (!op->hashed &&
      kc_sha256_hex(op->vlen ? op->val : "", op->vlen, op->val_hex) == KC_OK)
    op->hashed = 1;
  return 0;
}
