/* bundle.c: bundles (key -> canonical manifest), write-once, with their
 * blobs' refcounts, the per-model index and the LRU index changed in the same
 * write transaction as the manifest itself. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

void kc_store_strv_free(char **v, size_t n) {
  if (!v)
    return;
  for (size_t i = 0; i < n; i++)
    free(v[i]);
  free(v);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The distinct blob digests of a manifest, sorted; pointers into m. */
static const char **distinct_digests(const kc_manifest *m, size_t *n) {
  const char **d = malloc((m->n_files ? m->n_files : 1) * sizeof *d);
  if (!d)
    return NULL;
  for (size_t i = 0; i < m->n_files; i++)
    d[i] = m->files[i].sha256;
  qsort(d, m->n_files, sizeof *d, cmp_str);
  size_t k = 0;
  for (size_t i = 0; i < m->n_files; i++)
    if (k == 0 || strcmp(d[k - 1], d[i]) != 0)
      d[k++] = d[i];
  *n = k;
  return d;
}

static void model_key(unsigned char out[2 * KC_HEX_LEN], const char *model,
                      const char *key) {
  memcpy(out, model, KC_HEX_LEN);
  memcpy(out + KC_HEX_LEN, key, KC_HEX_LEN);
}

typedef struct put_ctx {
  const kc_manifest *m;
  const char *json;
  size_t json_len;
  char *info; /* the canonical key JSON: the model index's record */
  const char **digests;
  size_t n_digests;
  char **missing;
  size_t n_missing;
  int created;
  int queue;   /* for the durable tier (not when fetched from it) */
  int replace; /* a different bundle under the key goes (KCS_PUT_REPLACE) */
} put_ctx;

/* A file's size must be its blob's: a listing's bytes and a client's size
 * check depend on it. */
static kc_err check_sizes(kc_store *s, MDB_txn *txn, const kc_manifest *m,
                          char *err) {
  for (size_t i = 0; i < m->n_files; i++) {
    MDB_val k = kcs_hex_val(m->files[i].sha256), v;
    kcs_blob_meta bm;
    if (mdb_get(txn, s->blobmeta, &k, &v) || kcs_blob_meta_read(&v, &bm))
      continue; /* missing: find_missing says so */
    if (bm.size != m->files[i].size)
      return kc_errf(err, KC_BAD_MANIFEST,
                     "files[%zu].size: %llu, but blob "
                     "%s holds %llu bytes",
                     i, (unsigned long long)m->files[i].size,
                     m->files[i].sha256, (unsigned long long)bm.size);
  }
  return KC_OK;
}

static kc_err find_missing(kc_store *s, MDB_txn *txn, put_ctx *c, char *err) {
  kc_store_strv_free(c->missing, c->n_missing); /* from a first attempt */
  c->missing = NULL;
  c->n_missing = 0;
  for (size_t i = 0; i < c->n_digests; i++) {
    MDB_val k = kcs_hex_val(c->digests[i]), v;
    if (mdb_get(txn, s->blobmeta, &k, &v) != MDB_NOTFOUND)
      continue;
    if (!c->missing && !(c->missing = calloc(c->n_digests, sizeof(char *))))
      return kc_errf(err, KC_NOMEM, "out of memory");
    if (!(c->missing[c->n_missing] = strdup(c->digests[i])))
      return kc_errf(err, KC_NOMEM, "out of memory");
    c->n_missing++;
  }
  if (!c->n_missing)
    return KC_OK;
  return kc_errf(err, KC_MISSING_BLOBS,
                 "%zu of the bundle's %zu blobs are "
                 "not in the store (first: %s)",
                 c->n_missing, c->n_digests, c->missing[0]);
}

/* The manifest, its metadata and its index entries. */
static kc_err put_records(kc_store *s, MDB_txn *txn, put_ctx *c, char *err) {
  const kc_manifest *m = c->m;
  int64_t now = kcs_now();
  kcs_bundle_meta bm = {0, now, now, 0, {0}};
  for (size_t i = 0; i < m->n_files; i++)
    bm.bytes += m->files[i].size;
  memcpy(bm.model, m->fields.model, KC_HEX_LEN);
  unsigned char mk[2 * KC_HEX_LEN], lk[8 + KC_HEX_LEN];
  model_key(mk, m->fields.model, m->key);
  kcs_time_key(lk, now, m->key);
  MDB_val k = kcs_hex_val(m->key), jv = {c->json_len, (void *)c->json};
  MDB_val mv = {sizeof bm, &bm}, mkv = {sizeof mk, mk}, lkv = {sizeof lk, lk};
  MDB_val empty = {0, ""}, info = {strlen(c->info), c->info};
  kc_err e;
  if ((e = kcs_put(txn, s->bundles, &k, &jv, 0, err)) ||
      (e = kcs_put(txn, s->bundlemeta, &k, &mv, 0, err)) ||
      (e = kcs_put(txn, s->models, &mkv, &info, 0, err)) ||
      (e = kcs_put(txn, s->lru, &lkv, &empty, 0, err)))
    return e;
  /* what is held counts manifests too (a store can hold large ones) */
  return kcs_bytes_add(txn, s, (int64_t)c->json_len, err);
}

static kc_err put_op(kc_store *s, MDB_txn *txn, void *ud, char *err) {
  put_ctx *c = ud;
  MDB_val k = kcs_hex_val(c->m->key), v;
  int rc = mdb_get(txn, s->bundles, &k, &v);
  if (rc == 0) {
    /* Write-once: the first complete upload wins. */
    c->created = 0;
    if (v.mv_size == c->json_len && memcmp(v.mv_data, c->json, v.mv_size) == 0)
      return KC_OK;
    if (!c->replace)
      return kc_errf(err, KC_CONFLICT, "a different bundle holds key %s",
                     c->m->key);
    /* the bucket's copy won (tier_once.c): ours goes in this transaction */
    kc_err de = kcs_bundle_drop(s, txn, c->m->key, 0, err);
    if (de)
      return de;
  } else if (rc != MDB_NOTFOUND) {
    return kcs_mdb_err(rc, "reading a bundle", err);
  }
  kc_err e = find_missing(s, txn, c, err);
  if (!e)
    e = check_sizes(s, txn, c->m, err);
  for (size_t i = 0; !e && i < c->n_digests; i++)
    e = kcs_blob_ref(s, txn, c->digests[i], err);
  if (!e)
    e = put_records(s, txn, c, err);
  if (!e && c->queue)
    e = kcs_queue_add(s, txn, KCS_Q_BUNDLE, c->m->key, NULL, err);
  if (!e)
    c->created = 1;
  return e;
}

kc_err kc_store_bundle_put(kc_store *s, const kc_manifest *m, int *created,
                           char ***missing, size_t *n_missing, char *err) {
  return kcs_bundle_put(s, m, KCS_PUT_QUEUE, created, missing, n_missing, err);
}

kc_err kcs_bundle_put(kc_store *s, const kc_manifest *m, int mode, int *created,
                      char ***missing, size_t *n_missing, char *err) {
  if (created)
    *created = 0;
  if (missing)
    *missing = NULL;
  if (n_missing)
    *n_missing = 0;
  kc_err e = kc_manifest_check_key(m, err);
  if (e)
    return e;
  put_ctx c = {.m = m,
               .queue = mode & KCS_PUT_QUEUE,
               .replace = (mode & KCS_PUT_REPLACE) != 0};
  if ((e = kc_manifest_to_json(m, (char **)&c.json, err)))
    return e;
  c.json_len = strlen(c.json);
  if ((e = kc_key_canonical(&m->fields, &c.info, err)))
    c.info = NULL;
  else if (!(c.digests = distinct_digests(m, &c.n_digests)))
    e = kc_errf(err, KC_NOMEM, "out of memory");
  else if (!(e = kcs_maybe_evict(s, c.json_len, err)))
    e = kcs_write(s, put_op, &c, err);
  if (e == KC_MISSING_BLOBS && missing && n_missing) {
    *missing = c.missing;
    *n_missing = c.n_missing;
  } else {
    kc_store_strv_free(c.missing, c.n_missing);
  }
  /* Its manifest came: the blobs' first-upload marks end, but only once
   * committed (an aborted try, then eviction, must find them still
   * marked). */
  for (size_t i = 0; !e && c.created && i < c.n_digests; i++)
    kcs_uses_forget(&s->fresh, c.digests[i]);
  if (!e && c.created && c.queue)
    kcs_tier_kick(s);
  if (!e && created)
    *created = c.created;
  free((char *)c.json);
  free(c.info);
  free(c.digests);
  return e;
}

/* ---- delete ---- */

/* Releases a stored manifest's blobs. A manifest that no longer parses (a
 * damaged page) cannot say which blobs it held: they stay, and the bundle's
 * records still go, so one bad bundle never blocks eviction or a delete. */
static kc_err unref_blobs(kc_store *s, MDB_txn *txn, const MDB_val *jv,
                          int drop_blobs, char *err) {
  kc_manifest *m = NULL;
  if (kc_manifest_parse(jv->mv_data, jv->mv_size, &m, NULL))
    return KC_OK;
  size_t n = 0;
  const char **d = distinct_digests(m, &n);
  int64_t now = kcs_now();
  kc_err e = d ? KC_OK : kc_errf(err, KC_NOMEM, "out of memory");
  for (size_t i = 0; !e && i < n; i++)
    e = kcs_blob_unref(s, txn, d[i], now, drop_blobs, err);
  free(d);
  kc_manifest_free(m);
  return e;
}

kc_err kcs_bundle_drop(kc_store *s, MDB_txn *txn, const char *key,
                       int drop_blobs, char *err) {
  MDB_val k = kcs_hex_val(key), jv, mv;
  int rc = mdb_get(txn, s->bundles, &k, &jv);
  if (rc == MDB_NOTFOUND)
    return kc_errf(err, KC_NOT_FOUND, "no bundle %s", key);
  if (!rc)
    rc = mdb_get(txn, s->bundlemeta, &k, &mv);
  if (rc || mv.mv_size != sizeof(kcs_bundle_meta))
    return kcs_mdb_err(rc ? rc : MDB_CORRUPTED, "reading a bundle", err);
  kcs_bundle_meta bm;
  memcpy(&bm, mv.mv_data, sizeof bm);
  int64_t json_len = (int64_t)jv.mv_size;
  kc_err e = unref_blobs(s, txn, &jv, drop_blobs, err);
  if (!e)
    e = kcs_bytes_add(txn, s, -json_len, err);
  unsigned char mk[2 * KC_HEX_LEN], lk[8 + KC_HEX_LEN];
  model_key(mk, bm.model, key);
  kcs_time_key(lk, bm.last_used, key);
  MDB_val mkv = {sizeof mk, mk}, lkv = {sizeof lk, lk};
  if (e || (e = kcs_del(txn, s->models, &mkv, err)) ||
      (e = kcs_del(txn, s->lru, &lkv, err)) ||
      (e = kcs_queue_unpend(s, txn, key, err)) ||
      (e = kcs_del(txn, s->bundlemeta, &k, err)))
    return e;
  return kcs_del(txn, s->bundles, &k, err);
}

/* A delete reaches the durable tier too: else a read-through brings the
 * bundle back. */
static kc_err delete_op(kc_store *s, MDB_txn *txn, void *ud, char *err) {
  const char *key = ud;
  MDB_val k = kcs_hex_val(key), mv;
  char model[KC_HEX_LEN + 1] = "";
  if (mdb_get(txn, s->bundlemeta, &k, &mv) == 0 &&
      mv.mv_size == sizeof(kcs_bundle_meta)) {
    memcpy(model, (const char *)mv.mv_data + offsetof(kcs_bundle_meta, model),
           KC_HEX_LEN);
    model[KC_HEX_LEN] = '\0';
  }
  kc_err e = kcs_bundle_drop(s, txn, key, 0, err);
  if (!e && *model)
    e = kcs_queue_add(s, txn, KCS_Q_DELETE, key, model, err);
  return e;
}

kc_err kc_store_bundle_delete(kc_store *s, const char *key, char *err) {
  if (!kc_is_hex64(key))
    return kc_errf(err, KC_BAD_KEY, "a key is 64 lowercase hex digits");
  kc_err e = kcs_write(s, delete_op, (void *)key, err);
  if (!e)
    kcs_tier_kick(s);
  return e;
}

/* ---- reads ---- */

kc_err kc_store_bundle_has(kc_store *s, const char *key) {
  if (!kc_is_hex64(key))
    return KC_BAD_KEY;
  kc_store_read *r;
  kc_err e = kc_store_read_begin(s, &r);
  if (e)
    return e;
  MDB_val k = kcs_hex_val(key), v;
  int rc = mdb_get(r->txn, s->bundles, &k, &v);
  kc_store_read_end(r);
  if (rc == MDB_NOTFOUND)
    return KC_NOT_FOUND;
  return rc ? kcs_mdb_err(rc, "reading a bundle", NULL) : KC_OK;
}

kc_err kc_store_bundle_get(kc_store_read *r, const char *key, const char **json,
                           size_t *len) {
  kc_store *s = r->s;
  if (!kc_is_hex64(key))
    return KC_BAD_KEY;
  MDB_val k = kcs_hex_val(key), v;
  int rc = mdb_get(r->txn, s->bundles, &k, &v);
  if (rc == MDB_NOTFOUND) {
    atomic_fetch_add(&s->misses, 1);
    return KC_NOT_FOUND;
  }
  if (rc)
    return kcs_mdb_err(rc, "reading a bundle", NULL);
  atomic_fetch_add(&s->hits, 1);
  kcs_uses_record(&s->uses, key, kcs_now());
  *json = v.mv_data;
  *len = v.mv_size;
  return KC_OK;
}

/* One index entry of the model listing: its metadata, its key fields (the
 * index record; empty in stores written before it held them) and manifest. */
static int list_one(kc_store *s, MDB_txn *txn, const char *key,
                    const MDB_val *rec, kc_store_bundle_cb cb, void *ud) {
  MDB_val k = kcs_hex_val(key), mv, jv;
  if (mdb_get(txn, s->bundlemeta, &k, &mv) ||
      mv.mv_size != sizeof(kcs_bundle_meta) ||
      mdb_get(txn, s->bundles, &k, &jv))
    return 0; /* index ahead of data cannot happen in one txn; skip */
  kcs_bundle_meta bm;
  memcpy(&bm, mv.mv_data, sizeof bm);
  kc_store_bundle_info info = {.bytes = bm.bytes,
                               .created = bm.created,
                               .last_used = bm.last_used,
                               .hits = bm.hits,
                               .manifest = jv.mv_data,
                               .manifest_len = jv.mv_size,
                               .fields = rec->mv_size ? rec->mv_data : NULL,
                               .fields_len = rec->mv_size};
  memcpy(info.key, key, KC_HEX_LEN);
  info.key[KC_HEX_LEN] = '\0';
  return cb(&info, ud);
}

kc_err kc_store_model_list(kc_store *s, const char *model,
                           kc_store_bundle_cb cb, void *ud) {
  if (!kc_is_hex64(model))
    return KC_EINVAL;
  kc_store_read *r;
  kc_err e = kc_store_read_begin(s, &r);
  if (e)
    return e;
  MDB_cursor *cur;
  int rc = mdb_cursor_open(r->txn, s->models, &cur);
  if (rc) {
    kc_store_read_end(r);
    return kcs_mdb_err(rc, "listing a model", NULL);
  }
  MDB_val k = {KC_HEX_LEN, (void *)model}, v;
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
       rc == 0 && k.mv_size == 2 * KC_HEX_LEN &&
       memcmp(k.mv_data, model, KC_HEX_LEN) == 0;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    char key[KC_HEX_LEN + 1];
    memcpy(key, (char *)k.mv_data + KC_HEX_LEN, KC_HEX_LEN);
    key[KC_HEX_LEN] = '\0';
    if (list_one(s, r->txn, key, &v, cb, ud))
      break;
  }
  mdb_cursor_close(cur);
  kc_store_read_end(r);
  return KC_OK;
}
