/* scrub.c: the background scrub. GETs serve blobs from the map without
 * hashing them (zero-copy), so bytes that rot on the disk would be served
 * until a client noticed. The scrub re-hashes every blob, a budget at a
 * time, and removes one that no longer hashes to its name together with
 * every bundle naming it. */
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

#define MIN_COST 4096    /* a tiny blob still costs a cursor step and a hash */
#define SAVE_EVERY_S 300 /* how often the position is written to meta */

static MDB_val next_name(void) {
  MDB_val k = {10, (void *)"scrub_next"};
  return k;
}

/* Where an earlier process stopped: a pass of a large store outlasts the
 * time between restarts, and starting each at the first blob would never
 * reach the last ones. */
static void load_pos(kc_store *s, kc_store_scrub *sc) {
  kc_store_read *r;
  MDB_val k = next_name(), v;
  sc->loaded = 1;
  if (kc_store_read_begin(s, &r))
    return;
  if (mdb_get(r->txn, s->meta, &k, &v) == 0 && v.mv_size == KC_HEX_LEN) {
    memcpy(sc->next, v.mv_data, KC_HEX_LEN);
    sc->next[KC_HEX_LEN] = '\0';
    if (!kc_is_hex64(sc->next))
      sc->next[0] = '\0';
  }
  kc_store_read_end(r);
}

static kc_err save_op(kc_store *s, MDB_txn *txn, void *ud, char *err) {
  const char *next = ud;
  MDB_val k = next_name(), v = {strlen(next), (void *)next};
  return kcs_put(txn, s->meta, &k, &v, 0, err);
}

/* Advisory: a position not saved only costs hashing some blobs again. */
static void save_pos(kc_store *s, kc_store_scrub *sc) {
  int64_t now = kcs_now();
  if (now - sc->saved < SAVE_EVERY_S)
    return;
  sc->saved = now;
  kcs_write(s, save_op, sc->next, NULL);
}

/* Positions cur at the first blob at or after `from` ("": the first). */
static int seek(MDB_cursor *cur, const char *from, MDB_val *k, MDB_val *v) {
  if (!*from)
    return mdb_cursor_get(cur, k, v, MDB_FIRST);
  *k = kcs_hex_val(from);
  return mdb_cursor_get(cur, k, v, MDB_SET_RANGE);
}

static void key_hex(const MDB_val *k, char out[KC_HEX_LEN + 1]) {
  size_t n = k->mv_size < KC_HEX_LEN ? k->mv_size : KC_HEX_LEN;
  memcpy(out, k->mv_data, n);
  out[n] = '\0';
}

/* Hashes one blob; a name that its bytes do not hash to goes to bad. */
static kc_err hash_one(kc_store *s, MDB_txn *txn, const MDB_val *k,
                       const MDB_val *v, kc_store_scrub *sc, char *err) {
  char name[KC_HEX_LEN + 1], got[KC_HEX_LEN + 1] = "";
  key_hex(k, name);
  kcs_blob_meta bm = {.enc = KC_STORE_RAW};
  MDB_val mv, mk = *k;
  /* a compressed blob is hashed as its content */
  if (kcs_zstd_magic(v->mv_data, v->mv_size) &&
      !mdb_get(txn, s->blobmeta, &mk, &mv))
    kcs_blob_meta_read(&mv, &bm);
  kc_err e = bm.enc == KC_STORE_ZSTD
                 ? kcs_zstd_hash(v->mv_data, v->mv_size, bm.size, got, NULL)
                 : kc_sha256_hex(v->mv_data, v->mv_size, got);
  if (e == KC_CORRUPT) /* does not decompress to its size: rotted */
    e = KC_OK;
  /* a frame from before the window bound whose decoder the budget cannot
   * hold now: not verified, kept, tried again the next pass */
  int skipped = e == KC_BUSY;
  if (e && !skipped)
    return kc_errf(err, e, "hashing blob %s", name);
  if (skipped)
    atomic_fetch_add(&s->scrub_skipped, 1);
  sc->cost += v->mv_size > MIN_COST ? v->mv_size : MIN_COST;
  atomic_fetch_add(&s->scrub_bytes, v->mv_size);
  if (!skipped && strcmp(got, name) != 0)
    memcpy(sc->bad, name, sizeof name);
  return KC_OK;
}

/* In one read: hashes blobs from sc->next on until the budget is spent, the
 * blobs end (a pass: next is "" again) or a corrupt one is found. */
static kc_err hash_some(kc_store *s, kc_store_scrub *sc, uint64_t budget,
                        char *err) {
  kc_store_read *r;
  MDB_cursor *cur;
  MDB_val k, v;
  kc_err e = kc_store_read_begin(s, &r);
  if (e)
    return kc_errf(err, e, "cannot begin a read of the store");
  if (mdb_cursor_open(r->txn, s->blobs, &cur)) {
    kc_store_read_end(r);
    return kc_errf(err, KC_IO, "cannot walk the blobs");
  }
  int rc = seek(cur, sc->next, &k, &v);
  while (!e && rc == 0 && !*sc->bad && sc->cost < budget) {
    e = hash_one(s, r->txn, &k, &v, sc, err);
    rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
  }
  if (!e && rc == 0)
    key_hex(&k, sc->next);
  else if (!e && rc == MDB_NOTFOUND) {
    sc->next[0] = '\0';
    atomic_fetch_add(&s->scrub_passes, 1);
  } else if (!e)
    e = kcs_mdb_err(rc, "walking the blobs", err);
  mdb_cursor_close(cur);
  kc_store_read_end(r);
  return e;
}

/* Whether the manifest v names the blob: a cheap search for the digest, then
 * the parse that makes sure it is a file's (not the model or the key). */
static int names_blob(const MDB_val *v, const char *digest) {
  if (!memmem(v->mv_data, v->mv_size, digest, KC_HEX_LEN))
    return 0;
  kc_manifest *m = NULL;
  if (kc_manifest_parse(v->mv_data, v->mv_size, &m, NULL))
    return 0;
  int found = 0;
  for (size_t i = 0; !found && i < m->n_files; i++)
    found = strcmp(m->files[i].sha256, digest) == 0;
  kc_manifest_free(m);
  return found;
}

/* The keys of the bundles naming digest (malloc'd, *n of them). A full walk
 * of the bundles: rot is rare, and no index maps a blob to its bundles. */
static kc_err naming_bundles(kc_store *s, MDB_txn *txn, const char *digest,
                             char (**keys)[KC_HEX_LEN + 1], size_t *n,
                             char *err) {
  MDB_cursor *cur;
  MDB_val k, v;
  size_t cap = 0;
  *keys = NULL;
  *n = 0;
  if (mdb_cursor_open(txn, s->bundles, &cur))
    return kc_errf(err, KC_IO, "cannot walk the bundles");
  kc_err e = KC_OK;
  int rc;
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); !e && rc == 0;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    if (!names_blob(&v, digest))
      continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 8;
      void *p = realloc(*keys, cap * sizeof **keys);
      if (!p) {
        e = kc_errf(err, KC_NOMEM, "out of memory");
        break;
      }
      *keys = p;
    }
    key_hex(&k, (*keys)[(*n)++]);
  }
  if (!e && rc != MDB_NOTFOUND) /* a walk cut short would miss bundles */
    e = kcs_mdb_err(rc, "walking the bundles", err);
  mdb_cursor_close(cur);
  return e;
}

/* Removes sc->bad and the bundles naming it, unless a repair replaced the
 * bytes (or something removed them) since the read that found them. */
static kc_err remove_op(kc_store *s, MDB_txn *txn, void *ud, char *err) {
  kc_store_scrub *sc = ud;
  sc->bundles = 0; /* kcs_write may run this twice (map full) */
  sc->removed = 0;
  if (kcs_blob_check(txn, s, sc->bad, NULL) != KC_CORRUPT)
    return KC_OK;
  char(*keys)[KC_HEX_LEN + 1];
  size_t n;
  kc_err e = naming_bundles(s, txn, sc->bad, &keys, &n, err);
  /* drop_blobs 0: the bundles' other blobs stay (orphans, gc'd later) */
  for (size_t i = 0; !e && i < n; i++)
    e = kcs_bundle_drop(s, txn, keys[i], 0, err);
  free(keys);
  size_t n_kv = 0; /* and the RESP keys whose value it is (kv_scan.c) */
  if (!e)
    e = kcs_kv_drop_naming(s, txn, sc->bad, &n_kv, err);
  sc->kv_keys = e ? 0 : n_kv;
  if (!e)
    e = kcs_blob_remove(s, txn, sc->bad, err);
  if (!e) {
    sc->bundles = n;
    sc->removed = 1;
  }
  return e;
}

kc_err kc_store_scrub_step(kc_store *s, kc_store_scrub *sc, uint64_t budget,
                           char *err) {
  sc->cost = 0;
  sc->bad[0] = '\0';
  sc->bundles = 0;
  sc->kv_keys = 0;
  sc->removed = 0;
  if (!sc->loaded)
    load_pos(s, sc);
  kc_err e = hash_some(s, sc, budget, err);
  if (!e)
    save_pos(s, sc);
  if (e || !*sc->bad)
    return e;
  if ((e = kcs_write(s, remove_op, sc, err))) {
    memcpy(sc->next, sc->bad, sizeof sc->next); /* try it again next step */
    return e;
  }
  if (sc->removed)
    atomic_fetch_add(&s->scrub_corrupt, 1);
  return KC_OK;
}
