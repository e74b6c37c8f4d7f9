/* verify.c: kc_store_verify, the full check an operator (or a test after a
 * crash) runs: every blob hashes to its name and matches its metadata, the
 * byte count adds up, every bundle parses, has its key, and has its blobs. */
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

/* skipped: blobs not verified (their frame's decoder does not fit the
 * budget now); counted, and the walk goes on. */
static kc_err verify_blobs(kc_store *s, MDB_txn *txn, uint64_t *skipped,
                           char *err) {
  MDB_cursor *cur;
  MDB_val k, v;
  uint64_t total = 0, used;
  if (mdb_cursor_open(txn, s->blobs, &cur))
    return kc_errf(err, KC_IO, "cannot walk the blobs");
  kc_err e = KC_OK;
  int rc;
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); !e && rc == 0;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    char name[KC_HEX_LEN + 1] = "";
    memcpy(name, k.mv_data, k.mv_size < KC_HEX_LEN ? k.mv_size : KC_HEX_LEN);
    MDB_val mv;
    kcs_blob_meta bm;
    /* a compressed blob is hashed as its content (kcs_blob_check) */
    if (mdb_get(txn, s->blobmeta, &k, &mv) || kcs_blob_meta_read(&mv, &bm) ||
        kcs_blob_stored(&bm) != v.mv_size)
      e = kc_errf(err, KC_CORRUPT, "blob %s: metadata missing or wrong", name);
    else if (k.mv_size != KC_HEX_LEN)
      e = kc_errf(err, KC_CORRUPT, "blob %s: a malformed name", name);
    else
      e = kcs_blob_check(txn, s, name, err);
    if (e == KC_BUSY) { /* a wide frame from before the window bound */
      (*skipped)++;
      e = KC_OK;
    }
    total += v.mv_size;
  }
  mdb_cursor_close(cur);
  uint64_t manifests = 0;
  if (!e)
    e = kcs_manifest_bytes(s, txn, &manifests, err);
  total += manifests;
  uint64_t keys = 0; /* RESP keys' own bytes (KC_KV_KEY_BYTES) */
  if (!e)
    e = kcs_kv_key_bytes(s, txn, &keys, err);
  total += keys;
  uint64_t warmups = 0;
  if (!e)
    e = kcs_warmup_sum(s, txn, &warmups, err);
  total += warmups;
  if (!e && (e = kcs_bytes_get(txn, s, &used)) == KC_OK && used != total)
    e = kc_errf(err, KC_CORRUPT,
                "bytes used says %llu, blobs, manifests, warmup "
                "manifests and RESP keys hold %llu",
                (unsigned long long)used, (unsigned long long)total);
  return e;
}

static kc_err verify_bundle(kc_store *s, MDB_txn *txn, MDB_val *k, MDB_val *v,
                            char *err) {
  char key[KC_HEX_LEN + 1] = "";
  memcpy(key, k->mv_data, k->mv_size < KC_HEX_LEN ? k->mv_size : KC_HEX_LEN);
  kc_manifest *m = NULL;
  char why[KC_ERRBUF_SIZE] = "";
  if (kc_manifest_parse(v->mv_data, v->mv_size, &m, why))
    return kc_errf(err, KC_CORRUPT, "bundle %s: %s", key, why);
  kc_err e =
      strcmp(m->key, key) == 0
          ? KC_OK
          : kc_errf(err, KC_CORRUPT, "bundle %s holds key %s", key, m->key);
  for (size_t i = 0; !e && i < m->n_files; i++) {
    MDB_val bk = kcs_hex_val(m->files[i].sha256), bv;
    kcs_blob_meta bm;
    if (mdb_get(txn, s->blobmeta, &bk, &bv) || kcs_blob_meta_read(&bv, &bm))
      e = kc_errf(err, KC_CORRUPT, "bundle %s: blob %s missing", key,
                  m->files[i].sha256);
    else if (bm.refs == 0 || bm.size != m->files[i].size)
      e = kc_errf(err, KC_CORRUPT,
                  "bundle %s: blob %s has %llu refs and "
                  "%llu bytes",
                  key, m->files[i].sha256, (unsigned long long)bm.refs,
                  (unsigned long long)bm.size);
  }
  kc_manifest_free(m);
  return e;
}

static kc_err verify_bundles(kc_store *s, MDB_txn *txn, char *err) {
  MDB_cursor *cur;
  MDB_val k, v;
  if (mdb_cursor_open(txn, s->bundles, &cur))
    return kc_errf(err, KC_IO, "cannot walk the bundles");
  kc_err e = KC_OK;
  for (int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); !e && rc == 0;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
    e = verify_bundle(s, txn, &k, &v, err);
  mdb_cursor_close(cur);
  return e;
}

kc_err kc_store_verify(kc_store *s, char *err) {
  kc_store_read *r;
  kc_err e = kc_store_read_begin(s, &r);
  if (e)
    return kc_errf(err, e, "cannot begin a read of the store");
  uint64_t skipped = 0;
  if (!(e = verify_blobs(s, r->txn, &skipped, err)))
    e = verify_bundles(s, r->txn, err);
  if (!e)
    e = kcs_kv_verify(s, r->txn, err); /* RESP keys (kv_scan.c) */
  kc_store_read_end(r);
  if (!e && skipped)
    e = kc_errf(err, KC_BUSY,
                "%llu blob(s) not verified: their frames' decoding windows "
                "do not fit the decoder memory free now (everything else "
                "verified)",
                (unsigned long long)skipped);
  return e;
}
