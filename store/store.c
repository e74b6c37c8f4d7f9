/* store.c: opening and closing the LMDB environment, read handles (pooled),
 * the write-transaction helper with map-full recovery, and stats. */
#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "store_internal.h"

#define GiB (1024ull * 1024 * 1024)

kc_err kcs_mdb_err(int rc, const char *what, char *err) {
  if (rc == MDB_MAP_FULL)
    return kc_errf(err, KC_STORE_FULL, "%s: the store's map is full", what);
  if (rc == ENOMEM)
    return kc_errf(err, KC_NOMEM, "%s: out of memory", what);
  if (rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND || rc == MDB_INVALID)
    return kc_errf(err, KC_CORRUPT, "%s: %s", what, mdb_strerror(rc));
  if (rc == ENOSPC || rc == EDQUOT)
    return kc_errf(err, KC_DISK_FULL, "%s: %s", what, strerror(rc));
  if (rc == MDB_READERS_FULL)
    return kc_errf(err, KC_BUSY, "%s: %s", what, mdb_strerror(rc));
  return kc_errf(err, KC_IO, "%s: %s", what, mdb_strerror(rc));
}

int64_t kcs_now(void) { return (int64_t)time(NULL); }

MDB_val kcs_hex_val(const char *hex) {
  MDB_val v = {KC_HEX_LEN, (void *)hex};
  return v;
}

void kcs_be64_put(unsigned char out[8], uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8)
    out[i] = (unsigned char)(v & 0xff);
}

uint64_t kcs_be64_get(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = v << 8 | p[i];
  return v;
}

void kcs_time_key(unsigned char out[8 + KC_HEX_LEN], int64_t t,
                  const char *hex) {
  kcs_be64_put(out, t < 0 ? 0 : (uint64_t)t);
  memcpy(out + 8, hex, KC_HEX_LEN);
}

kc_err kcs_put(MDB_txn *txn, MDB_dbi dbi, MDB_val *k, MDB_val *v,
               unsigned flags, char *err) {
  int rc = mdb_put(txn, dbi, k, v, flags);
  if (rc == MDB_MAP_FULL)
    return KCS_MAP_FULL;
  return rc ? kcs_mdb_err(rc, "write", err) : KC_OK;
}

kc_err kcs_del(MDB_txn *txn, MDB_dbi dbi, MDB_val *k, char *err) {
  int rc = mdb_del(txn, dbi, k, NULL);
  if (rc == MDB_MAP_FULL)
    return KCS_MAP_FULL;
  if (rc == MDB_NOTFOUND)
    return KC_OK;
  return rc ? kcs_mdb_err(rc, "delete", err) : KC_OK;
}

static MDB_val bytes_name(void) {
  MDB_val k = {10, (void *)"bytes_used"};
  return k;
}

kc_err kcs_bytes_get(MDB_txn *txn, kc_store *s, uint64_t *out) {
  MDB_val k = bytes_name(), v;
  int rc = mdb_get(txn, s->meta, &k, &v);
  *out = 0;
  if (rc == MDB_NOTFOUND)
    return KC_OK;
  if (rc || v.mv_size != sizeof *out)
    return kcs_mdb_err(rc ? rc : MDB_CORRUPTED, "reading bytes used", NULL);
  memcpy(out, v.mv_data, sizeof *out);
  return KC_OK;
}

kc_err kcs_bytes_add(MDB_txn *txn, kc_store *s, int64_t delta, char *err) {
  uint64_t used;
  kc_err e = kcs_bytes_get(txn, s, &used);
  if (e)
    return kc_errf(err, e, "reading bytes used");
  used = delta < 0 && (uint64_t)-delta > used ? 0 : used + (uint64_t)delta;
  MDB_val k = bytes_name(), v = {sizeof used, &used};
  return kcs_put(txn, s->meta, &k, &v, 0, err);
}

/* One attempt: begin, op, commit. */
kc_err kcs_write_once(kc_store *s, kcs_write_fn op, void *ud, char *err) {
  MDB_txn *txn;
  int rc = mdb_txn_begin(s->env, NULL, 0, &txn);
  if (rc)
    return kcs_mdb_err(rc, "begin a write", err);
  kcs_txn_reset(s); /* ours from here: LMDB has one writer */
  kc_err e = op(s, txn, ud, err);
  if (e) {
    kcs_txn_reset(s);
    mdb_txn_abort(txn);
    return e;
  }
  rc = mdb_txn_commit(txn); /* frees txn even when it fails */
  return kcs_commit_done(s, rc, err);
}

/* Records the time of the last map-full eviction; see kcs_write. */
static kc_err bump_op(kc_store *s, MDB_txn *txn, void *ud, char *err) {
  (void)ud;
  int64_t now = kcs_now();
  MDB_val k = {10, (void *)"last_evict"}, v = {sizeof now, &now};
  return kcs_put(txn, s->meta, &k, &v, 0, err);
}

/* The low-water target of what the store holds now. */
static uint64_t low_target_now(kc_store *s) {
  uint64_t used = 0;
  kc_store_read *r;
  if (kc_store_read_begin(s, &r) == KC_OK) {
    kcs_bytes_get(r->txn, s, &used);
    kc_store_read_end(r);
  }
  return kcs_low_target(s, used);
}

kc_err kcs_write(kc_store *s, kcs_write_fn op, void *ud, char *err) {
  kc_err e = kcs_write_once(s, op, ud, err);
  if (e != KCS_MAP_FULL)
    return e;
  /* A cache answers a full map by evicting, then tries once more. Evicting
   * needs pages too, so it goes in small committed batches (one big
   * transaction would need more than a full map has). LMDB reuses the pages
   * that transaction N frees only from transaction N+2 on (an aborted one
   * does not count), hence the small commit in between. */
  kc_err ee = kcs_evict_batched(s, low_target_now(s), NULL);
  if (ee == KC_OK)
    ee = kcs_write_once(s, bump_op, NULL, NULL);
  if (ee == KC_OK)
    e = kcs_write_once(s, op, ud, err);
  if (e == KCS_MAP_FULL || e == KC_STORE_FULL)
    return kc_errf(err, KC_STORE_FULL,
                   "the store's map (%llu bytes) is full, and evicting did "
                   "not make enough room",
                   (unsigned long long)s->map_size);
  return e;
}

/* ---- open and close ---- */

static uint64_t derive_map_size(const kc_store_opts *o) {
  if (o->map_size)
    return o->map_size;
  if (!o->max_bytes)
    return 64 * GiB;
  /* Room for the B-trees, pages pinned by readers, and free pages that a
   * long read keeps from reuse: half again the limit, and 256 MiB. */
  return o->max_bytes + o->max_bytes / 2 + GiB / 4;
}

static kc_err open_dbis_txn(kc_store *s, int build, char *err) {
  struct {
    const char *name;
    MDB_dbi *dbi;
  } t[] = {{"blobs", &s->blobs},
           {"blobmeta", &s->blobmeta},
           {"orphans", &s->orphans},
           {"bundles", &s->bundles},
           {"bundlemeta", &s->bundlemeta},
           {"models", &s->models},
           {"lru", &s->lru},
           {"meta", &s->meta},
           {"s3queue", &s->s3queue},
           {"s3pend", &s->s3pend},
           {"s3dead", &s->s3dead},
           {"kv", &s->kv},
           {"kvlru", &s->kvlru},
           {"kvexp", &s->kvexp},
           {"demand", &s->demand},
           {"warmups", &s->warmups},
           {"warmarchs", &s->warmarchs}};
  MDB_txn *txn;
  int rc = mdb_txn_begin(s->env, NULL, 0, &txn);
  if (rc)
    return kcs_mdb_err(rc, "opening the databases", err);
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    rc = mdb_dbi_open(txn, t[i].name, MDB_CREATE, t[i].dbi);
    if (rc) {
      mdb_txn_abort(txn);
      return kcs_mdb_err(rc, t[i].name, err);
    }
  }
  /* a name's holders, sorted fixed-size values (models.c) */
  rc = mdb_dbi_open(txn, "warmnames", MDB_CREATE | MDB_DUPSORT | MDB_DUPFIXED,
                    &s->warmnames);
  if (rc) {
    mdb_txn_abort(txn);
    return kcs_mdb_err(rc, "warmnames", err);
  }
  uint32_t layout = KCS_LAYOUT;
  MDB_val k = {6, (void *)"layout"}, v = {sizeof layout, &layout}, old;
  rc = mdb_get(txn, s->meta, &k, &old);
  if (rc == 0 && (old.mv_size != sizeof layout ||
                  memcmp(old.mv_data, &layout, sizeof layout) != 0)) {
    mdb_txn_abort(txn);
    return kc_errf(err, KC_CORRUPT,
                   "%s holds a store of another layout version", s->dir);
  }
  if (rc == MDB_NOTFOUND)
    rc = mdb_put(txn, s->meta, &k, &v, 0);
  if (rc) {
    mdb_txn_abort(txn);
    return kcs_mdb_err(rc, "writing the layout version", err);
  }
  /* a store from before it */
  kc_err e = build ? kcs_warmnames_build(s, txn, err) : KC_OK;
  if (e) {
    mdb_txn_abort(txn);
    return e;
  }
  rc = mdb_txn_commit(txn);
  return rc ? kcs_mdb_err(rc, "opening the databases", err) : KC_OK;
}

/* The databases, and the name index built when the store has none. A map
 * too full for the build does not keep the store closed: it opens without
 * the index (names_why says why; the name check reads the manifests) and
 * the next open builds it. */
static kc_err open_dbis(kc_store *s, char *err) {
  kc_err e = open_dbis_txn(s, 1, err);
  if (e != KCS_MAP_FULL && e != KC_STORE_FULL)
    return e;
  snprintf(s->names_why, sizeof s->names_why,
           "the map (%llu bytes) was too full to build the index of warmup "
           "names: each name check reads every manifest until an open "
           "builds it",
           (unsigned long long)s->map_size);
  e = open_dbis_txn(s, 0, err);
  /* never the internal code: it has no message */
  return e == KCS_MAP_FULL ? kc_errf(err, KC_STORE_FULL,
                                     "opening the databases: the store's "
                                     "map is full")
                           : e;
}

const char *kc_store_names_unindexed(const kc_store *s) { return s->names_why; }

static kc_err make_dir(const char *dir, char *err) {
  if (mkdir(dir, 0750) == 0 || errno == EEXIST)
    return KC_OK;
  return kc_errf(err, KC_IO, "cannot create %s: %s", dir, strerror(errno));
}

static int try_open(kc_store *s, const kc_store_opts *o, uint64_t map_size) {
  int rc = mdb_env_create(&s->env);
  if (rc)
    return rc;
  mdb_env_set_mapsize(s->env, (size_t)map_size);
  /* 14, demand (demand.c), warmups, warmarchs, warmnames (models.c) */
  mdb_env_set_maxdbs(s->env, 18);
  mdb_env_set_maxreaders(s->env, o->max_readers ? o->max_readers : 512);
  /* NOTLS: a read transaction lives with a request, which may move between
   * libmicrohttpd's threads; NORDAHEAD: blob reads are random. */
  rc = mdb_env_open(s->env, s->dir, MDB_NOTLS | MDB_NORDAHEAD, 0640);
  if (rc) {
    mdb_env_close(s->env); /* a failed open leaves a handle to discard */
    s->env = NULL;
  }
  return rc;
}

static kc_err open_env(kc_store *s, const kc_store_opts *o, char *err) {
  uint64_t want = kcs_map_with_room(s->dir, derive_map_size(o));
  int rc = try_open(s, o, want);
  /* A default map is only address space; where that is limited (ulimit -v,
   * valgrind: mmap says ENOMEM or EINVAL), halve it rather than refuse to
   * start. */
  for (uint64_t m = want / 2;
       (rc == ENOMEM || rc == EINVAL) && !o->map_size && m >= GiB; m /= 2)
    rc = try_open(s, o, m);
  if (rc)
    return kc_errf(err, kcs_mdb_err(rc, "", NULL),
                   "cannot open the store in %s: %s", s->dir, mdb_strerror(rc));
  MDB_envinfo info;
  if (mdb_env_info(s->env, &info) == 0)
    s->map_size = info.me_mapsize; /* an existing larger map wins */
  int dead = 0;
  mdb_reader_check(s->env, &dead); /* slots of crashed processes */
  return open_dbis(s, err);
}

kc_err kc_store_open(const kc_store_opts *opts, kc_store **out, char *err) {
  *out = NULL;
  if (!opts || !opts->dir || !*opts->dir)
    return kc_errf(err, KC_EINVAL, "no store directory given");
  kc_store *s = calloc(1, sizeof *s);
  if (!s || !(s->dir = strdup(opts->dir))) {
    free(s);
    return kc_errf(err, KC_NOMEM, "out of memory");
  }
  s->lock_fd = s->dir_lock_fd = -1;
  s->max_bytes = opts->max_bytes;
  s->kv_max_bytes = opts->kv_max_bytes;
  s->kv_use_grain_ms =
      opts->kv_use_grain_ms ? opts->kv_use_grain_ms : KCS_KV_USE_GRAIN_MS;
  s->compress_level = opts->compress_level;
  s->grace_s = opts->grace_s ? opts->grace_s : 3600;
  s->high_pct = opts->high_water_pct > 0 ? opts->high_water_pct : 95;
  s->low_pct = opts->low_water_pct > 0 ? opts->low_water_pct : 85;
  if (s->low_pct > s->high_pct)
    s->low_pct = s->high_pct;
  for (size_t i = 0; i < KCS_SHARDS; i++)
    pthread_mutex_init(&s->shards[i].lock, NULL);
  kc_err e = kcs_uses_init(&s->uses) || kcs_uses_init(&s->touched) ||
                     kcs_uses_init(&s->fresh) || kcs_uses_init(&s->kvuses)
                 ? kc_errf(err, KC_NOMEM, "out of memory")
                 : make_dir(s->dir, err);
  s->touched.max_n = s->fresh.max_n = KCS_MARKS_MAX;
  if (!e)
    e = kcs_lock_dir(s, err); /* before LMDB: one process per directory */
  if (!e)
    e = open_env(s, opts, err);
  if (!e && opts->s3)
    e = kcs_tier_open(s, opts->s3, err);
  if (!e)
    e = kcs_open_limits(s, err);
  if (e) {
    kc_store_close(s);
    return e;
  }
  *out = s;
  return KC_OK;
}

void kc_store_close(kc_store *s) {
  if (!s)
    return;
  kcs_tier_close(s); /* its worker reads the store */
  if (s->env) {
    kc_store_flush(s);
    kcs_demand_close(s);
    for (size_t i = 0; i < KCS_SHARDS; i++)
      for (size_t j = 0; j < s->shards[i].n_pool; j++) {
        mdb_txn_abort(s->shards[i].pool[j]->txn);
        free(s->shards[i].pool[j]);
      }
    mdb_env_close(s->env);
  }
  kcs_unlock_dir(s); /* after LMDB is closed */
  kcs_uses_destroy(&s->uses);
  kcs_uses_destroy(&s->touched);
  kcs_uses_destroy(&s->fresh);
  kcs_uses_destroy(&s->kvuses);
  for (size_t i = 0; i < KCS_SHARDS; i++)
    pthread_mutex_destroy(&s->shards[i].lock);
  free(s->dir);
  free(s);
}

/* ---- read handles ---- */

/* A handle from the thread's shard's pool (its transaction reset), or a new
 * one; linked open either way. */
static kc_store_read *handle_get(kc_store *s) {
  kcs_shard *sh = kcs_shard_mine(s);
  pthread_mutex_lock(&sh->lock);
  kc_store_read *r = sh->n_pool ? sh->pool[--sh->n_pool] : NULL;
  if (r)
    kcs_read_link(sh, r); /* counted open from here */
  pthread_mutex_unlock(&sh->lock);
  if (r || !(r = malloc(sizeof *r)))
    return r;
  r->s = s;
  r->txn = NULL;
  pthread_mutex_lock(&sh->lock);
  kcs_read_link(sh, r);
  pthread_mutex_unlock(&sh->lock);
  return r;
}

kc_err kc_store_read_begin(kc_store *s, kc_store_read **out) {
  *out = NULL;
  kc_store_read *r = handle_get(s);
  if (!r)
    return KC_NOMEM;
  /* A reset transaction keeps its reader slot: renewing it is cheaper than
   * a new one, which matters for small GETs. */
  int rc = r->txn ? mdb_txn_renew(r->txn)
                  : mdb_txn_begin(s->env, NULL, MDB_RDONLY, &r->txn);
  if (rc) {
    pthread_mutex_lock(&r->shard->lock);
    kcs_read_unlink(r->shard, r);
    pthread_mutex_unlock(&r->shard->lock);
    if (r->txn)
      mdb_txn_abort(r->txn);
    free(r);
    if (rc == MDB_READERS_FULL) /* the server logs and counts it */
      atomic_fetch_add(&s->readers_full, 1);
    return kcs_mdb_err(rc, "begin a read", NULL);
  }
  *out = r;
  return KC_OK;
}

/* Back to the pool of the shard it began on (whichever thread ends it). */
void kc_store_read_end(kc_store_read *r) {
  if (!r)
    return;
  kcs_shard *sh = r->shard;
  mdb_txn_reset(r->txn);
  pthread_mutex_lock(&sh->lock);
  kcs_read_unlink(sh, r);
  if (sh->n_pool < KCS_SHARD_POOL) {
    sh->pool[sh->n_pool++] = r;
    r = NULL;
  }
  pthread_mutex_unlock(&sh->lock);
  if (r) {
    mdb_txn_abort(r->txn);
    free(r);
  }
}

/* ---- stats ---- */

static uint64_t entries(MDB_txn *txn, MDB_dbi dbi) {
  MDB_stat st;
  return mdb_stat(txn, dbi, &st) ? 0 : st.ms_entries;
}

kc_err kc_store_stats_get(kc_store *s, kc_store_stats *out) {
  memset(out, 0, sizeof *out);
  kc_store_read *r;
  kc_err e = kc_store_read_begin(s, &r);
  if (e)
    return e;
  e = kcs_bytes_get(r->txn, s, &out->bytes_used);
  uint64_t saved = 0;
  if (!e)
    e = kcs_saved_get(r->txn, s, &saved);
  out->bytes_raw = out->bytes_used + saved;
  out->blobs = entries(r->txn, s->blobs);
  out->bundles = entries(r->txn, s->bundles);
  out->kv_keys = entries(r->txn, s->kv);
  out->kv_expires = entries(r->txn, s->kvexp);
  if (!e)
    e = kcs_kv_bytes_get(r->txn, s, &out->kv_bytes);
  kc_store_read_end(r);
  MDB_envinfo info;
  MDB_stat st;
  if (mdb_env_info(s->env, &info) == 0 && mdb_env_stat(s->env, &st) == 0)
    out->map_used = (uint64_t)(info.me_last_pgno + 1) * st.ms_psize;
  out->max_bytes = s->max_bytes;
  out->map_size = s->map_size;
  out->hits = atomic_load(&s->hits);
  out->misses = atomic_load(&s->misses);
  out->evicted_bundles = atomic_load(&s->evicted_bundles);
  out->evicted_blobs = atomic_load(&s->evicted_blobs);
  out->gc_blobs = atomic_load(&s->gc_blobs);
  out->scrub_bytes = atomic_load(&s->scrub_bytes);
  out->scrub_passes = atomic_load(&s->scrub_passes);
  out->scrub_corrupt = atomic_load(&s->scrub_corrupt);
  out->scrub_skipped = atomic_load(&s->scrub_skipped);
  out->disk_full_since = atomic_load(&s->disk_full_since);
  out->kv_max_bytes = s->kv_max_bytes;
  out->kv_hits = atomic_load(&s->kv_hits);
  out->kv_misses = atomic_load(&s->kv_misses);
  out->evicted_kv = atomic_load(&s->evicted_kv);
  return e;
}
