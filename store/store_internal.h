/* store_internal.h: what the store's .c files share: the struct kc_store, the
 * layout of the named databases and their records, and the helpers that run
 * one write transaction with map-full recovery. Not installed.
 *
 * Layout (one LMDB environment in opts->dir; keys are 64-hex strings):
 *   blobs     digest -> bytes
 *   blobmeta  digest -> blob_meta (size, refcount, created, orphan_since)
 *   orphans   be64(orphan_since) digest -> "" : blobs no bundle references,
 *             oldest first (GC and the second phase of eviction walk it)
 *   bundles   key -> canonical manifest JSON
 *   bundlemeta key -> bundle_meta (bytes, created, last_used, hits, model)
 *   models    model key -> canonical key JSON (empty before it was kept):
 *             the per-model index, listed without parsing manifests
 *   lru       be64(last_used) key -> "" : bundles, least recently used first
 *   meta      "bytes_used" -> u64 (blobs, manifests, RESP keys), "layout" ->
 * u32, "manifests_counted" -> u32 (bytes_used counts manifests; stores written
 * before lack it and are recounted at open), "kv_keys_counted" -> u32 (likewise
 * for RESP keys' own bytes, KC_KV_KEY_BYTES each), "scrub_next" -> 64 hex
 *             (where the scrub goes on; scrub.c)
 *   s3queue, s3pend, s3dead: the durable tier's upload queue (tier.h)
 *   kv        hex(sha256(RESP key)) -> kcs_kv_rec + the key's bytes (kv.c)
 *   kvlru     be64(last_used_ms) hex -> "" : RESP keys, least recent first
 *   kvexp     be64(expire_ms) hex -> "" : RESP keys with an expiry, soonest
 *             first (kc_store_kv_expire_step walks it)
 *   meta      also "kv_bytes" -> u64: the value bytes RESP keys reference
 *   demand    model hex -> kcs_demand_head + entries (demand.c): the
 *             model's histogram of shapes and misses; each entry is u64
 *             count, u8 kind, u16 length, then that many bytes of text
 *             (packed, host-endian), count descending
 *   warmups   model (64 hex) -> the model's warmup manifest JSON, as uploaded
 *             (PUT /v1/models/{model}/warmup; models.c); counted in
 *             bytes_used, their sum in meta "warmup_bytes" (meta
 *             "warmups_counted": a store from before that was counted)
 *   warmnames model.name -> model (64 hex), DUPSORT: the models whose stored
 *             manifest has that name (one, unless an admin shared it); kept
 *             with warmups, built at open for a store from before it (meta
 *             "warmnames_built")
 * Records are host-endian structs (an LMDB file is not portable across
 * architectures anyway); be64 prefixes make LMDB's byte order the time order.
 */
#ifndef KC_STORE_INTERNAL_H
#define KC_STORE_INTERNAL_H

#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>

#include "kc_store.h"

#define KCS_LAYOUT 1
/* Eviction spares a blob uploaded or offered (a PUT answered "already
 * present") this recently: its manifest is on its way. */
#define KCS_UPLOAD_WINDOW_S 600
/* Read handles (with their reset transactions, which keep their reader
 * slots) kept for reuse, in KCS_SHARDS pools: each thread uses one, so
 * that a GET takes no lock another thread's GETs take. */
#define KCS_SHARDS 4
#define KCS_SHARD_POOL 16 /* 64 in all */

typedef struct kcs_shard {
  pthread_mutex_t lock;
  kc_store_read *pool[KCS_SHARD_POOL]; /* ended reads, transactions reset */
  size_t n_pool;
  /* Reads begun on this shard and open now, oldest first (reads.c). */
  kc_store_read *open_head, *open_tail;
  uint64_t n_open;
  char pad[64]; /* the next shard's lock on another cache line */
} kcs_shard;

typedef struct kcs_blob_meta {
  uint64_t size; /* of the content (uncompressed) */
  uint64_t refs;
  int64_t created;
  int64_t orphan_since; /* valid when refs == 0 */
  /* A compressed blob's record is longer (KCS_BLOB_META_ZSTD
   * bytes); a raw one keeps the old KCS_BLOB_META_RAW bytes, so stores
   * written before compression read as they are. */
  uint64_t stored; /* bytes held in `blobs` (enc != raw only) */
  uint32_t enc;    /* kc_store_enc */
  uint32_t pad;
} kcs_blob_meta;
#define KCS_BLOB_META_RAW 32
#define KCS_BLOB_META_ZSTD ((size_t)sizeof(kcs_blob_meta))

/* zstd.c: a blobmeta value of either length into *bm (a raw record's stored
 * is its size); -1 when neither. */
int kcs_blob_meta_read(const MDB_val *v, kcs_blob_meta *bm);
/* The value to write for *bm: the raw record's length when it is raw. */
MDB_val kcs_blob_meta_val(kcs_blob_meta *bm);
/* Bytes the blob takes in the map (what bytes_used counts). */
uint64_t kcs_blob_stored(const kcs_blob_meta *bm);

typedef struct kcs_bundle_meta {
  uint64_t bytes;
  int64_t created;
  int64_t last_used;
  uint64_t hits;
  char model[KC_HEX_LEN];
} kcs_bundle_meta;

/* Last uses and hits seen by readers, written in batches (kc_store_flush). */
typedef struct kcs_use {
  char key[KC_HEX_LEN];
  int64_t last_used;
  uint64_t hits;
  int used; /* slot taken */
} kcs_use;

typedef struct kcs_uses {
  pthread_mutex_t lock;
  kcs_use *slots;
  size_t cap, n; /* open addressing; cap a power of two, n <= cap / 2 */
  size_t max_n;  /* 0: no bound; else a new key past it is not recorded */
} kcs_uses;

/* The bound of the tables of marks (touched: spared or offered again;
 * fresh: first uploads awaiting their manifest): a mark lives for the
 * upload window, so a write-heavy load would otherwise grow them by every
 * upload of the last 10 minutes. 3 MiB each at most; past it a mark is
 * not taken (the protection it gives is lost for that blob, nothing
 * else). */
#define KCS_MARKS_MAX 16384

/* How fresh a RESP key's recorded last use must be for a GET to record no
 * new one (kv.c; the default of kc_store_opts.kv_use_grain_ms): eviction's
 * order of keys is this coarse. */
#define KCS_KV_USE_GRAIN_MS 10000

/* A RESP key's record in kv; the key's bytes follow it. */
typedef struct kcs_kv_rec {
  char digest[KC_HEX_LEN]; /* the value's blob */
  uint64_t size;
  int64_t expire_ms; /* absolute unix ms; 0: none */
  int64_t last_used_ms;
  uint32_t klen;
  uint32_t spare;
} kcs_kv_rec;

typedef struct kcs_tier kcs_tier;

struct kc_store {
  MDB_env *env;
  MDB_dbi blobs, blobmeta, orphans, bundles, bundlemeta, models, lru, meta;
  MDB_dbi s3queue, s3pend, s3dead;
  MDB_dbi kv, kvlru, kvexp; /* RESP keys (kv.c) */
  MDB_dbi demand;           /* demand histograms (demand.c) */
  /* demand.c's pending counts: made at the first add (NULL before). */
  _Atomic(struct kcs_demand *) demand_pending;
  MDB_dbi warmups;   /* model hex -> its warmup manifest (models.c) */
  MDB_dbi warmarchs; /* model hex -> archs its warms ran for, "a,b" */
  MDB_dbi warmnames; /* model.name -> model hex, DUPSORT (models.c) */
  /* non-empty: why the name index could not be built at open (a full map);
   * the name check walks the manifests instead, and the next open builds */
  char names_why[160];
  uint64_t kv_max_bytes;
  int64_t kv_use_grain_ms; /* opts->kv_use_grain_ms, the default filled in */
  kcs_uses kvuses; /* last uses of RESP keys, by hex(sha256(key)), in ms */
  _Atomic uint64_t kv_hits, kv_misses, evicted_kv;
  kcs_tier *tier; /* NULL: no durable tier */
  char *dir;
  uint64_t max_bytes, map_size, grace_s;
  int high_pct, low_pct;
  int compress_level; /* zstd level for new blobs; 0: kept raw */
  kcs_uses uses;
  kcs_uses touched; /* blobs offered again by clients, by digest (memory) */
  kcs_uses fresh;   /* blobs first uploaded by clients, until a manifest
                       references them (memory; kcs_blob_touched) */
  kcs_shard shards[KCS_SHARDS]; /* read handles: pools and open reads */
  _Atomic uint64_t hits, misses, evicted_bundles, evicted_blobs, gc_blobs;
  _Atomic uint64_t scrub_bytes, scrub_passes, scrub_corrupt; /* scrub.c */
  _Atomic uint64_t scrub_skipped; /* scrub.c: blobs passed over unhashed */
  /* limits.c: the directory's lock (held while open), and when commits
   * began failing for lack of disk (0: they do not). */
  int lock_fd, dir_lock_fd;
  _Atomic int64_t disk_full_since;
  /* Removals by the write transaction in progress (only its thread touches
   * them: LMDB has one writer), added to the counters above at commit. */
  uint64_t txn_evicted_bundles, txn_evicted_blobs, txn_gc_blobs, txn_evicted_kv;
  /* Reads refused because LMDB's reader table was full. */
  _Atomic uint64_t readers_full;
};

/* The head of a demand record. */
typedef struct kcs_demand_head {
  uint32_t version; /* 1 */
  uint32_t n;       /* entries that follow */
  uint64_t total, dropped;
  int64_t updated;
} kcs_demand_head;

/* demand.c: flushes what is pending and frees it (kc_store_close). */
void kcs_demand_close(kc_store *s);

struct kc_store_read {
  kc_store *s;
  kcs_shard *shard; /* whose pool and open list it is in */
  MDB_txn *txn;
  kc_store_read *prev, *next; /* in shard->open_head's list */
  uint64_t t0_ms;             /* when it began (monotonic) */
};

/* reads.c: links a read that just began into its shard's open list, and
 * unlinks one that ends; the caller holds the shard's lock. */
void kcs_read_link(kcs_shard *sh, kc_store_read *r);
void kcs_read_unlink(kcs_shard *sh, kc_store_read *r);
/* The calling thread's shard of s (threads are spread over them in the
 * order they first read). */
kcs_shard *kcs_shard_mine(kc_store *s);

/* One LMDB error to kc_err, with a sentence naming what was being done. */
kc_err kcs_mdb_err(int rc, const char *what, char *err);
int64_t kcs_now(void);

/* Runs op(s, txn, ud, err) in a write transaction and commits it. When the map
 * is full, evicts (down to the low-water mark of what is held) and tries once
 * more; still full: KC_STORE_FULL. op returns KC_OK to commit, an error to
 * abort, or KCS_MAP_FULL (from kcs_put and friends) to trigger the retry. */
typedef kc_err (*kcs_write_fn)(kc_store *s, MDB_txn *txn, void *ud, char *err);
kc_err kcs_write(kc_store *s, kcs_write_fn op, void *ud, char *err);
/* Marks an op's failure as "the map is full" (distinct from every kc_err). */
#define KCS_MAP_FULL ((kc_err)-1)
/* mdb_put with MDB_MAP_FULL turned into KCS_MAP_FULL. */
kc_err kcs_put(MDB_txn *txn, MDB_dbi dbi, MDB_val *k, MDB_val *v,
               unsigned flags, char *err);
kc_err kcs_del(MDB_txn *txn, MDB_dbi dbi, MDB_val *k, char *err);

/* meta "bytes_used" inside a transaction. */
kc_err kcs_bytes_get(MDB_txn *txn, kc_store *s, uint64_t *out);
kc_err kcs_bytes_add(MDB_txn *txn, kc_store *s, int64_t delta, char *err);

/* 64-byte keys (hex without NUL) and be64 + hex composite keys. Big-endian
 * numbers sort in LMDB's byte order. */
MDB_val kcs_hex_val(const char *hex);
void kcs_be64_put(unsigned char out[8], uint64_t v);
uint64_t kcs_be64_get(const unsigned char *p);
void kcs_time_key(unsigned char out[8 + KC_HEX_LEN], int64_t t,
                  const char *hex);

/* blob.c: drop one reference to a blob (refs 0: an orphan since now, or, with
 * drop_now, deleted at once, as eviction wants). */
kc_err kcs_blob_unref(kc_store *s, MDB_txn *txn, const char *digest,
                      int64_t now, int drop_now, char *err);
/* blob.c: takes a reference; an orphan stops being one. KC_NOT_FOUND if the
 * blob is absent. */
kc_err kcs_blob_ref(kc_store *s, MDB_txn *txn, const char *digest, char *err);
/* blob.c: deletes a blob and its metadata and orphan entry; frees its bytes. */
kc_err kcs_blob_drop(kc_store *s, MDB_txn *txn, const char *digest,
                     const kcs_blob_meta *bm, char *err);
/* blob.c: the same by digest (its metadata read here); KC_OK if absent. */
kc_err kcs_blob_remove(kc_store *s, MDB_txn *txn, const char *digest,
                       char *err);
/* blob.c: hashes the held copy: KC_OK when it hashes to its name,
 * KC_CORRUPT (err names the hash) when not, KC_NOT_FOUND when none is held. */
kc_err kcs_blob_check(MDB_txn *txn, kc_store *s, const char *digest, char *err);

/* ---- zstd.c: compression of blobs ---- */

#define KCS_ZSTD_MIN 64 /* smaller blobs are kept raw: no frame pays */
/* The largest window (log2) a decoder gets: frames written here never ask
 * for more (the level's window is capped), a PUT's frame that does is
 * refused. 8 MiB: level 19's window; 22 and --long ask for up to 128 MiB. */
#define KCS_ZSTD_WLOG_MAX 23
/* Decoder memory held for clients (GETs decoded on the way, PUTs of
 * frames), process-wide; beyond it they get KC_BUSY. */
#define KCS_ZSTD_DECODE_BUDGET ((uint64_t)256 << 20)
/* Takes n bytes of the budget (0), or -1 when they are not there. */
int kcs_zstd_charge(uint64_t n);
void kcs_zstd_release(uint64_t n);
/* A streaming decoder whose window is at most 2^wlog_max bytes. */
struct ZSTD_DCtx_s *kcs_zstd_dctx(unsigned wlog_max);
/* Worth keeping: the frame is at most kcs_zstd_keep_max(raw) bytes (half
 * the content). */
int kcs_zstd_worth(uint64_t raw, uint64_t z);
uint64_t kcs_zstd_keep_max(uint64_t raw);
/* Does the buffer begin with a zstd frame's magic number? */
int kcs_zstd_magic(const void *p, size_t n);
/* Compresses len bytes at level into a malloc'd *out when that is worth
 * keeping; *out NULL (and KC_OK) when not. */
kc_err kcs_zstd_compress(int level, const void *src, size_t len, void **out,
                         size_t *outlen, char *err);
/* Compresses len bytes read from fd (pread from off, or read when not
 * seekable) into an unlinked temporary file in dir (*outfd, -1 when not
 * worth keeping), hashing the content into h when h != NULL. */
kc_err kcs_zstd_compress_fd(kc_store *s, int level, int fd, int seekable,
                            off_t off, uint64_t len, kc_sha256 *h, int *outfd,
                            uint64_t *outlen, char *err);
/* Decompresses a whole frame (mem, or fd when mem is NULL: pread from 0)
 * of zlen bytes into dst, which holds exactly raw bytes. */
kc_err kcs_zstd_decode_into(const void *mem, int fd, uint64_t zlen, void *dst,
                            uint64_t raw, char *err);
/* Hashes what a stored frame decompresses to (hex into got); KC_CORRUPT
 * when it does not decompress to exactly raw bytes. */
kc_err kcs_zstd_hash(const void *z, size_t zlen, uint64_t raw,
                     char got[KC_HEX_LEN + 1], char *err);
/* 1 when a stored frame decompresses to exactly val's n bytes; decoding
 * stops at the first difference. */
int kcs_zstd_equals(const void *z, size_t zlen, const void *val, size_t n);
/* meta "zstd_saved": content bytes minus stored bytes of compressed blobs
 * (bytes_used + this = the content's size). */
kc_err kcs_saved_add(MDB_txn *txn, kc_store *s, int64_t delta, char *err);
kc_err kcs_saved_get(MDB_txn *txn, kc_store *s, uint64_t *out);
/* blob.c: 1 (and the frame's bytes in *zlen) when the upload received a
 * zstd frame (kc_store_upload_zstd): its spool holds the frame. */
int kcs_upload_frame(const kc_store_upload *u, uint64_t *zlen);
/* bundle.c: deletes a bundle, its index entries and its blob references. */
kc_err kcs_bundle_drop(kc_store *s, MDB_txn *txn, const char *key,
                       int drop_blobs, char *err);
/* evict.c: evicts in the open txn until bytes used <= target. */
kc_err kcs_evict_txn(kc_store *s, MDB_txn *txn, uint64_t target, char *err);
/* evict.c: moves hex's entry in a time-keyed index (lru, kvlru) from time
 * `from` to time `to`. */
kc_err kcs_lru_move(MDB_txn *txn, MDB_dbi lru, int64_t from, int64_t to,
                    const char *hex, char *err);
/* evict.c: writes the last uses batched in u, each with one, in one write
 * transaction (kc_store_flush: bundles'; kcs_kv_flush: RESP keys'). */
typedef kc_err kcs_use_fn(kc_store *s, MDB_txn *txn, const kcs_use *use,
                          char *err);
kc_err kcs_uses_flush(kc_store *s, kcs_uses *u, kcs_use_fn *one);
/* evict.c: whether used + incoming bytes cross limit's high-water mark; if
 * so, *target: the low-water mark less incoming (what eviction leaves). */
int kcs_over_high(const kc_store *s, uint64_t limit, uint64_t used,
                  uint64_t incoming, uint64_t *target);
/* evict.c: the least recently used entry of a time-keyed index (lru for
 * bundles, kvlru for RESP keys) whose item is not waiting for the durable
 * tier's queue (an item not yet in S3 must stay): its 64-hex tail and time.
 * 0 found, -1 none. */
int kcs_first_unqueued(kc_store *s, MDB_txn *txn, MDB_dbi dbi,
                       char hex[KC_HEX_LEN + 1], int64_t *t);
/* evict.c: the low-water target for a store holding `used` bytes. */
uint64_t kcs_low_target(const kc_store *s, uint64_t used);
/* evict.c: before a write that adds `incoming` bytes: above the high-water
 * mark, evicts down to the low-water mark less what comes in. */
kc_err kcs_maybe_evict(kc_store *s, uint64_t incoming, char *err);

/* uses.c: in-memory last-use table. */
int kcs_uses_init(kcs_uses *u);
void kcs_uses_destroy(kcs_uses *u);
void kcs_uses_record(kcs_uses *u, const char *key, int64_t now);
/* Takes the table's contents (caller frees *out), leaving it empty. */
size_t kcs_uses_take(kcs_uses *u, kcs_use **out);
/* The last time recorded for key; 0 when none. */
int64_t kcs_uses_last(kcs_uses *u, const char *key);
/* Forgets entries recorded before `before`. */
void kcs_uses_prune(kcs_uses *u, int64_t before);
/* Forgets key's last use (a later record starts it anew). */
void kcs_uses_forget(kcs_uses *u, const char *key);
/* Queue kinds; a RESP key's: 'v' upload its record (marks it pending, as
 * a bundle), 'w' delete its record (kv_tier.c). */
enum {
  KCS_Q_BLOB = 'b',
  KCS_Q_BUNDLE = 'm',
  KCS_Q_DELETE = 'x',
  KCS_Q_KV = 'v',
  KCS_Q_KVDEL = 'w'
};
/* tier.c: the upload queue. Each adds inside the caller's write transaction
 * (nothing without a tier). A bundle entry also marks the bundle pending;
 * model is the bundle's model for a delete entry, else NULL. */
kc_err kcs_queue_add(kc_store *s, MDB_txn *txn, char kind, const char *key,
                     const char *model, char *err);
/* 1 if the bundle's manifest waits in the queue (eviction skips it). */
int kcs_queue_pending(kc_store *s, MDB_txn *txn, const char *key);
kc_err kcs_queue_unpend(kc_store *s, MDB_txn *txn, const char *key, char *err);
/* Wakes the worker after a commit that queued something. */
void kcs_tier_kick(kc_store *s);
kc_err kcs_tier_open(kc_store *s, const kc_store_s3 *o, char *err);
void kcs_tier_close(kc_store *s);
/* blob.c: an upload filled from S3 is not queued again. */
void kcs_upload_from_tier(kc_store_upload *u);
/* blob.c: checks the bytes against digest now (commit then skips it);
 * *mem: the bytes when they are all in memory, else NULL (valid until commit
 * or abort). */
kc_err kcs_upload_verify(kc_store_upload *u, const char *digest,
                         const void **mem, char *err);
/* blob.c: stores n verified in-memory uploads (fetched from S3: not queued)
 * in one transaction, so one sync serves them all; frees them. KC_OK, or an
 * error and none stored. */
kc_err kcs_upload_commit_batch(kc_store *s, kc_store_upload *const *u,
                               const char *const *digests, size_t n, char *err);
/* bundle.c: kc_store_bundle_put; `mode` 0 (fetched from S3: not queued) or
 * a sum of: KCS_PUT_QUEUE queued for S3; KCS_PUT_REPLACE a different bundle
 * held under the key is dropped in the same transaction instead of
 * answering KC_CONFLICT (the bucket's copy won the write-once race). */
enum { KCS_PUT_QUEUE = 1, KCS_PUT_REPLACE = 2 };
kc_err kcs_bundle_put(kc_store *s, const kc_manifest *m, int mode, int *created,
                      char ***missing, size_t *n_missing, char *err);

/* ---- limits.c: the lock, disk full, bounded eviction, upgrades ---- */

/* One attempt at op: begin, op, commit (store.c). KCS_MAP_FULL as is. */
kc_err kcs_write_once(kc_store *s, kcs_write_fn op, void *ud, char *err);
/* After a commit (rc its result): counts the transaction's removals when it
 * committed, tracks disk full; returns rc as a kc_err (KC_DISK_FULL for
 * ENOSPC and EDQUOT, KCS_MAP_FULL for a full map). */
kc_err kcs_commit_done(kc_store *s, int rc, char *err);
/* Forgets the removals of a transaction that was aborted. */
void kcs_txn_reset(kc_store *s);
/* A failure to write the disk: KC_DISK_FULL (and the store's flag set) for
 * ENOSPC and EDQUOT, else KC_IO; the sentence names what and the errno. */
kc_err kcs_disk_err(kc_store *s, int errnum, const char *what, char *err);
/* Locks opts->dir for this process (the directory itself, and
 * dir/kcached.lock with our pid inside); KC_LOCKED naming the holder's pid
 * when another process holds it. */
kc_err kcs_lock_dir(kc_store *s, char *err);
void kcs_unlock_dir(kc_store *s);
/* At open, after the tier: counts the manifests of a store written before
 * they were counted, and evicts down to the limit a store that holds more
 * than max_bytes (restarted with a lower --max-bytes). */
kc_err kcs_open_limits(kc_store *s, char *err);
/* The map size to open dir's store with: want, or, when the data file is
 * about that size or larger (a limit lowered since it grew), the file's size
 * and room to work in: a map the exact size of its file cannot evict. */
uint64_t kcs_map_with_room(const char *dir, uint64_t want);
/* The sum of the sizes of every value of dbi (what: the error's wording). */
kc_err kcs_value_bytes(MDB_txn *txn, MDB_dbi dbi, const char *what,
                       uint64_t *sum, char *err);
/* The bytes of all manifests (what bytes used counts beside blobs). */
kc_err kcs_manifest_bytes(kc_store *s, MDB_txn *txn, uint64_t *sum, char *err);
/* Evicts down to target in transactions of a few removals each, each
 * committed: a full map frees pages the next one can use. */
kc_err kcs_evict_batched(kc_store *s, uint64_t target, char *err);
/* evict.c: evicts at most limit items in txn; *done when bytes used is at
 * most target or nothing is left. */
kc_err kcs_evict_some(kc_store *s, MDB_txn *txn, uint64_t target, size_t limit,
                      int *done, char *err);

/* blob.c: 1 if a client offered this blob within the upload window (again,
 * or first, for a manifest still to come). */
int kcs_blob_touched(kc_store *s, const char *digest, int64_t now);
/* An orphan's time moves to now in txn (its grace starts anew); a blob
 * that is referenced or absent is left alone. */
kc_err kcs_blob_retouch(kc_store *s, MDB_txn *txn, const char *digest,
                        char *err);

/* models.c: the longest model.name the name index takes (an LMDB key;
 * the warmup schema allows 255 bytes). */
#define KCS_WARMNAME_MAX 511
/* models.c: builds warmnames from the stored manifests, unless meta says
 * it was built (a store written before the index), in txn. */
kc_err kcs_warmnames_build(kc_store *s, MDB_txn *txn, char *err);
/* models.c: warmup manifests together take at most 1/KCS_WARMUP_SHARE of
 * max_bytes (of the map without one). */
#define KCS_WARMUP_SHARE 8
/* models.c: the sum of the stored warmup manifests' sizes into *sum. */
kc_err kcs_warmup_sum(kc_store *s, MDB_txn *txn, uint64_t *sum, char *err);
/* models.c: the same, written to meta "warmup_bytes" too (limits.c counts
 * them once in bytes_used). */
kc_err kcs_warmup_bytes(kc_store *s, MDB_txn *txn, uint64_t *sum, char *err);
/* models.c: drops the first warmup manifest (hex order) of a model without
 * bundles: 1 dropped, 0 none, -1 an error in *e. Eviction's last step. */
int kcs_warmup_evict_one(kc_store *s, MDB_txn *txn, kc_err *e, char *err);

/* ---- RESP keys (kv.c, kv_scan.c, kv_evict.c) ---- */
/* meta "kv_bytes" inside a transaction. */
kc_err kcs_kv_bytes_get(MDB_txn *txn, kc_store *s, uint64_t *out);
/* A record by its LMDB key (64 hex); KC_NOT_FOUND when absent. *key points
 * into the map (the RESP key's bytes). */
kc_err kcs_kv_rec_get(MDB_txn *txn, kc_store *s, const char *hex,
                      kcs_kv_rec *rec, const void **key);
/* Deletes a RESP key's record and index entries and drops its blob
 * reference (a value nothing else references is freed at once; counted as
 * evicted when `evicting`). */
kc_err kcs_kv_drop(kc_store *s, MDB_txn *txn, const char *hex,
                   const kcs_kv_rec *rec, int evicting, char *err);
/* kv.c: writes a record and its index entries, adds its bytes (the blob
 * referenced already). */
kc_err kcs_kv_rec_put(kc_store *s, MDB_txn *txn, const char *hex,
                      const kcs_kv_rec *rec, const void *key, char *err);
/* kv_tier.c, from the tier's worker: uploads a RESP key's record (and its
 * value when the bucket lacks it); KC_OK when the key is gone. */
kc_err kcs_kv_upload(kcs_tier *t, kc_store_read *r, const char *hex, char *err);
/* kv_tier.c: deletes a RESP key's record from the bucket. */
kc_err kcs_kv_delete_obj(kcs_tier *t, const char *hex, char *err);
/* kv_evict.c: one step of eviction (evict.c's loop): evicts the least
 * recently used RESP key when the RESP side is over kv_max_bytes, or when it
 * is older than the oldest evictable bundle (have_bundle, bundle_last_s) and
 * the bundle side is not over its share. 1: evicted one; 0: take the bundle
 * (or orphans); -1: error in *e. */
int kcs_kv_evict_first(kc_store *s, MDB_txn *txn, int have_bundle,
                       int64_t bundle_last_s, kc_err *e, char *err);
/* kv_evict.c: before writing `incoming` value bytes: evicts RESP keys while
 * the RESP side would cross kv_max_bytes' high-water mark. */
kc_err kcs_kv_maybe_evict(kc_store *s, uint64_t incoming, char *err);
/* kv_evict.c: writes RESP keys' pending last uses (from kc_store_flush). */
kc_err kcs_kv_flush(kc_store *s);
/* kv_scan.c: removes the RESP keys whose value is blob digest (scrub). */
kc_err kcs_kv_drop_naming(kc_store *s, MDB_txn *txn, const char *digest,
                          size_t *n, char *err);
/* kv_scan.c: checks every RESP key's record, blob and index entries. */
kc_err kcs_kv_verify(kc_store *s, MDB_txn *txn, char *err);
/* *sum: what the RESP keys count in bytes_used, KC_KV_KEY_BYTES each
 * (kv_scan.c; verify and the recount of older stores at open). */
kc_err kcs_kv_key_bytes(kc_store *s, MDB_txn *txn, uint64_t *sum, char *err);

#endif
