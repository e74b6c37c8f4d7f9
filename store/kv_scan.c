/* kv_scan.c: walks over the RESP keys: SCAN and Redis's glob match, the
 * count, the reclaim of expired keys, the removal of the keys naming a
 * rotted blob (scrub) and their part of kc_store_verify. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

#define GLOB_DEPTH 1000 /* Redis's limit of nested '*' */

/* A class "[...]" (*p just past the '['), matched against c: moves *p and
 * *pl to its closing ']' (or, unclosed, to the pattern's last byte) as
 * Redis's stringmatchlen does. 1 when c is in the class. */
static int glob_class(const unsigned char **pp, size_t *plp, unsigned char c) {
  const unsigned char *p = *pp;
  size_t pl = *plp;
  int neg = pl && p[0] == '^', match = 0;
  if (neg) {
    p++;
    pl--;
  }
  for (;; p++, pl--) {
    if (pl == 0) { /* no ']': the class ends with the pattern */
      p--;
      pl++;
      break;
    }
    if (p[0] == '\\' && pl >= 2) {
      p++;
      pl--;
      match |= p[0] == c;
    } else if (p[0] == ']') {
      break;
    } else if (pl >= 3 && p[1] == '-') {
      unsigned char lo = p[0] < p[2] ? p[0] : p[2];
      unsigned char hi = p[0] < p[2] ? p[2] : p[0];
      p += 2;
      pl -= 2;
      match |= c >= lo && c <= hi;
    } else {
      match |= p[0] == c;
    }
  }
  *pp = p;
  *plp = pl;
  return neg != match;
}

/* Redis's stringmatchlen (util.c), case-sensitive, with every read of the
 * pattern bounded by its length (Redis relies on a terminating NUL).
 * *skip: a '*' found the rest cannot match at any later start either. */
static int glob(const unsigned char *p, size_t pl, const unsigned char *s,
                size_t sl, int *skip, int depth) {
  if (depth > GLOB_DEPTH)
    return 0;
  while (pl && sl) {
    if (p[0] == '*') {
      while (pl > 1 && p[1] == '*') {
        p++;
        pl--;
      }
      if (pl == 1)
        return 1;
      for (; sl; s++, sl--) {
        if (glob(p + 1, pl - 1, s, sl, skip, depth + 1))
          return 1;
        if (*skip)
          return 0;
      }
      *skip = 1;
      return 0;
    }
    if (p[0] == '[') {
      p++;
      pl--;
      if (!glob_class(&p, &pl, s[0]))
        return 0;
    } else if (p[0] != '?') {
      if (p[0] == '\\' && pl >= 2) {
        p++;
        pl--;
      }
      if (p[0] != s[0])
        return 0;
    }
    s++;
    sl--;
    p++;
    pl--;
  }
  /* Trailing stars match the rest, which is empty. (Redis answers 0 for
   * "*" against "", which its KEYS and SCAN never ask: they skip matching
   * for "*".) */
  while (sl == 0 && pl && p[0] == '*') {
    p++;
    pl--;
  }
  return pl == 0 && sl == 0;
}

int kc_store_kv_match(const void *pattern, size_t plen, const void *s,
                      size_t slen) {
  int skip = 0;
  return glob(pattern, plen, s, slen, &skip, 0);
}

/* ---- SCAN ---- */

/* The cursor is the first 16 hex digits of an LMDB key (64 bits). */
static uint64_t cursor_of(const MDB_val *k) {
  char h[17] = "";
  memcpy(h, k->mv_data, k->mv_size < 16 ? k->mv_size : 16);
  uint64_t c = strtoull(h, NULL, 16);
  return c ? c : 1; /* 0 says "done"; keys under 0000000000000001 are
                       ~2^-64 of them */
}

/* One record of the walk: passed to cb when live and matching. 1: cb said
 * stop. */
static int visit(kc_store *s, MDB_txn *txn, const MDB_val *v,
                 const void *pattern, size_t plen, int64_t now_ms,
                 kc_store_kv_cb cb, void *ud, size_t *given) {
  kcs_kv_rec rec;
  if (v->mv_size < sizeof rec)
    return 0;
  memcpy(&rec, v->mv_data, sizeof rec);
  const char *key = (const char *)v->mv_data + sizeof rec;
  if (v->mv_size != sizeof rec + rec.klen ||
      (rec.expire_ms && rec.expire_ms <= now_ms) ||
      (pattern && !kc_store_kv_match(pattern, plen, key, rec.klen)))
    return 0;
  char digest[KC_HEX_LEN + 1];
  memcpy(digest, rec.digest, KC_HEX_LEN);
  digest[KC_HEX_LEN] = '\0';
  MDB_val bk = kcs_hex_val(digest), bv;
  if (mdb_get(txn, s->blobmeta, &bk, &bv))
    return 0; /* its value is gone: a miss */
  (*given)++;
  return cb(key, rec.klen, ud) != 0;
}

static int seek(MDB_cursor *cur, uint64_t cursor, MDB_val *k, MDB_val *v) {
  if (!cursor)
    return mdb_cursor_get(cur, k, v, MDB_FIRST);
  char h[17];
  snprintf(h, sizeof h, "%016llx", (unsigned long long)cursor);
  k->mv_size = 16;
  k->mv_data = h;
  return mdb_cursor_get(cur, k, v, MDB_SET_RANGE);
}

kc_err kc_store_kv_scan(kc_store *s, uint64_t cursor, const void *pattern,
                        size_t plen, size_t count, int64_t now_ms,
                        kc_store_kv_cb cb, void *ud, uint64_t *next) {
  *next = 0;
  if (!count)
    count = 10;
  kc_store_read *r;
  MDB_cursor *cur;
  MDB_val k, v;
  kc_err e = kc_store_read_begin(s, &r);
  if (e)
    return e;
  int rc = mdb_cursor_open(r->txn, s->kv, &cur);
  if (rc) {
    kc_store_read_end(r);
    return kcs_mdb_err(rc, "walking the RESP keys", NULL);
  }
  size_t given = 0, seen = 0,
         most = count > SIZE_MAX / 10 ? SIZE_MAX : count * 10;
  int stop = 0;
  for (rc = seek(cur, cursor, &k, &v);
       rc == 0 && !stop && given < count && seen < most;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT), seen++)
    stop = visit(s, r->txn, &v, pattern, plen, now_ms, cb, ud, &given);
  if (rc == 0)
    *next = cursor_of(&k);
  else if (rc != MDB_NOTFOUND)
    e = kcs_mdb_err(rc, "walking the RESP keys", NULL);
  mdb_cursor_close(cur);
  kc_store_read_end(r);
  return e;
}

kc_err kc_store_kv_count(kc_store *s, uint64_t *n) {
  kc_store_read *r;
  MDB_stat st;
  *n = 0;
  kc_err e = kc_store_read_begin(s, &r);
  if (e)
    return e;
  int rc = mdb_stat(r->txn, s->kv, &st);
  if (!rc)
    *n = st.ms_entries;
  kc_store_read_end(r);
  return rc ? kcs_mdb_err(rc, "counting the RESP keys", NULL) : KC_OK;
}

/* ---- expiry ---- */

typedef struct expire_ctx {
  int64_t now_ms;
  size_t max, removed;
} expire_ctx;

static kc_err expire_op(kc_store *s, MDB_txn *txn, void *ud, char *err) {
  expire_ctx *c = ud;
  MDB_cursor *cur;
  MDB_val k, v;
  c->removed = 0;
  kc_err e = KC_OK;
  while (!e && c->removed < c->max) {
    if (mdb_cursor_open(txn, s->kvexp, &cur))
      return kc_errf(err, KC_IO, "cannot walk the RESP expiries");
    int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
    mdb_cursor_close(cur);
    if (rc || k.mv_size != 8 + KC_HEX_LEN ||
        (int64_t)kcs_be64_get(k.mv_data) > c->now_ms)
      return rc && rc != MDB_NOTFOUND ? kcs_mdb_err(rc, "expiries", err)
                                      : KC_OK;
    unsigned char ik[8 + KC_HEX_LEN]; /* a copy: k points into a page */
    memcpy(ik, k.mv_data, sizeof ik);
    MDB_val ikv = {sizeof ik, ik};
    char hex[KC_HEX_LEN + 1];
    memcpy(hex, ik + 8, KC_HEX_LEN);
    hex[KC_HEX_LEN] = '\0';
    kcs_kv_rec rec;
    e = kcs_kv_rec_get(txn, s, hex, &rec, NULL);
    if (e == KC_NOT_FOUND ||
        (!e && rec.expire_ms != (int64_t)kcs_be64_get(ik))) /* stale */
      e = kcs_del(txn, s->kvexp, &ikv, err);
    else if (!e && !(e = kcs_kv_drop(s, txn, hex, &rec, 0, err)))
      c->removed++;
  }
  return e;
}

kc_err kc_store_kv_expire_step(kc_store *s, int64_t now_ms, size_t max,
                               size_t *removed, char *err) {
  expire_ctx c = {now_ms, max, 0};
  kc_err e = max ? kcs_write(s, expire_op, &c, err) : KC_OK;
  if (removed)
    *removed = e ? 0 : c.removed;
  return e;
}

/* ---- scrub and verify ---- */

/* The LMDB keys of the records naming digest (a full walk: rot is rare). */
static kc_err naming(kc_store *s, MDB_txn *txn, const char *digest,
                     char (**hexes)[KC_HEX_LEN + 1], size_t *n, char *err) {
  MDB_cursor *cur;
  MDB_val k, v;
  size_t cap = 0;
  *hexes = NULL;
  *n = 0;
  int rc = mdb_cursor_open(txn, s->kv, &cur);
  if (rc)
    return kcs_mdb_err(rc, "walking the RESP keys", err);
  kc_err e = KC_OK;
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); !e && rc == 0;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    if (k.mv_size != KC_HEX_LEN || v.mv_size < sizeof(kcs_kv_rec) ||
        memcmp(v.mv_data, digest, KC_HEX_LEN) != 0)
      continue;
    if (*n == cap) {
      void *p = realloc(*hexes, (cap = cap ? 2 * cap : 8) * sizeof **hexes);
      if (!p) {
        e = kc_errf(err, KC_NOMEM, "out of memory");
        break;
      }
      *hexes = p;
    }
    memcpy((*hexes)[*n], k.mv_data, KC_HEX_LEN);
    (*hexes)[(*n)++][KC_HEX_LEN] = '\0';
  }
  if (!e && rc != MDB_NOTFOUND)
    e = kcs_mdb_err(rc, "walking the RESP keys", err);
  mdb_cursor_close(cur);
  return e;
}

kc_err kcs_kv_drop_naming(kc_store *s, MDB_txn *txn, const char *digest,
                          size_t *n, char *err) {
  char(*hexes)[KC_HEX_LEN + 1];
  kc_err e = naming(s, txn, digest, &hexes, n, err);
  for (size_t i = 0; !e && i < *n; i++) {
    kcs_kv_rec rec;
    if (!(e = kcs_kv_rec_get(txn, s, hexes[i], &rec, NULL)))
      e = kcs_kv_drop(s, txn, hexes[i], &rec, 0, err);
  }
  free(hexes);
  return e;
}

/* One record: its blob held with a reference and its size, its LRU entry
 * there, its key hashing to its name. */
static kc_err verify_rec(kc_store *s, MDB_txn *txn, const MDB_val *k,
                         const MDB_val *v, uint64_t *total, char *err) {
  char hex[KC_HEX_LEN + 1] = "", got[KC_HEX_LEN + 1] = "";
  kcs_kv_rec rec;
  memcpy(hex, k->mv_data, k->mv_size < KC_HEX_LEN ? k->mv_size : KC_HEX_LEN);
  if (k->mv_size != KC_HEX_LEN || v->mv_size < sizeof rec ||
      (memcpy(&rec, v->mv_data, sizeof rec),
       v->mv_size != sizeof rec + rec.klen) ||
      kc_sha256_hex((const char *)v->mv_data + sizeof rec, rec.klen, got) ||
      strcmp(got, hex) != 0)
    return kc_errf(err, KC_CORRUPT, "RESP key %s: bad record", hex);
  char digest[KC_HEX_LEN + 1];
  memcpy(digest, rec.digest, KC_HEX_LEN);
  digest[KC_HEX_LEN] = '\0';
  MDB_val bk = kcs_hex_val(digest), bv;
  kcs_blob_meta bm;
  if (mdb_get(txn, s->blobmeta, &bk, &bv) || kcs_blob_meta_read(&bv, &bm) ||
      bm.refs == 0 || bm.size != rec.size)
    return kc_errf(err, KC_CORRUPT,
                   "RESP key %s: value blob %s missing, "
                   "unreferenced or of another size",
                   hex, digest);
  unsigned char ik[8 + KC_HEX_LEN];
  kcs_time_key(ik, rec.last_used_ms, hex);
  MDB_val ikv = {sizeof ik, ik}, iv;
  if (mdb_get(txn, s->kvlru, &ikv, &iv))
    return kc_errf(err, KC_CORRUPT, "RESP key %s: no LRU entry", hex);
  kcs_time_key(ik, rec.expire_ms, hex);
  if (rec.expire_ms && mdb_get(txn, s->kvexp, &ikv, &iv))
    return kc_errf(err, KC_CORRUPT, "RESP key %s: no expiry entry", hex);
  *total += rec.size;
  return KC_OK;
}

kc_err kcs_kv_key_bytes(kc_store *s, MDB_txn *txn, uint64_t *sum, char *err) {
  MDB_cursor *cur;
  MDB_val k, v;
  kcs_kv_rec rec;
  *sum = 0;
  int rc = mdb_cursor_open(txn, s->kv, &cur);
  if (rc)
    return kcs_mdb_err(rc, "counting the RESP keys", err);
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    if (v.mv_size < sizeof rec) {
      rc = MDB_CORRUPTED;
      break;
    }
    memcpy(&rec, v.mv_data, sizeof rec);
    *sum += KC_KV_KEY_BYTES(rec.klen);
  }
  mdb_cursor_close(cur);
  return rc == MDB_NOTFOUND ? KC_OK
                            : kcs_mdb_err(rc, "counting the RESP keys", err);
}

kc_err kcs_kv_verify(kc_store *s, MDB_txn *txn, char *err) {
  MDB_cursor *cur;
  MDB_val k, v;
  uint64_t total = 0, held = 0;
  if (mdb_cursor_open(txn, s->kv, &cur))
    return kc_errf(err, KC_IO, "cannot walk the RESP keys");
  kc_err e = KC_OK;
  for (int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); !e && rc == 0;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
    e = verify_rec(s, txn, &k, &v, &total, err);
  mdb_cursor_close(cur);
  if (!e && (e = kcs_kv_bytes_get(txn, s, &held)) == KC_OK && held != total)
    e = kc_errf(err, KC_CORRUPT, "RESP bytes says %llu, the keys hold %llu",
                (unsigned long long)held, (unsigned long long)total);
  return e;
}
