/* kc_store.h: LMDB storage of blobs (digest -> bytes) and bundles (key ->
 * manifest), the per-model index, access bookkeeping and eviction.
 *
 * Threads: a kc_store is shared by all threads. Any number of threads may read
 * at once (kc_store_read_*); writes (put, delete, evict, gc, flush) serialize
 * on LMDB's single write transaction and may be called from any thread. Read
 * handles are opened with MDB_NOTLS, so a handle may move between threads, but
 * one handle is used by one thread at a time.
 *
 * Durability: every write is one LMDB write transaction; a bundle and the
 * refcounts of its blobs change together, so readers and a process that
 * restarts after a crash see a bundle whole or not at all.
 *
 * Errors: kc_err, plus a sentence in `err` (KC_ERRBUF_SIZE, may be NULL).
 * A full LMDB map is never a crash: a write that finds it full evicts (least
 * recently used bundles, then old unreferenced blobs) down to the low-water
 * mark of what is held and tries once more; KC_STORE_FULL when that is not
 * enough. With max_bytes set, a put that would cross the high-water mark evicts
 * first. What is held counts blobs, manifests, warmup manifests and RESP keys
 * (KC_KV_KEY_BYTES each). Eviction runs in transactions of a few removals each;
 * the eviction counters count what was committed. A disk that is full (ENOSPC,
 * EDQUOT) is KC_DISK_FULL, not KC_IO.
 *
 * On disk: dir/data.mdb and dir/lock.mdb (copy a live store with
 * `mdb_copy -c DIR OUT`). The layout of the named databases is in
 * store_internal.h.
 */
#ifndef KC_STORE_H
#define KC_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "kc_error.h"
#include "kc_schema.h"

typedef struct kc_store kc_store;

/* The durable tier: an S3-compatible bucket shared by several stores (one per
 * kcached replica; docs/DESIGN.md, Scale-out). Layout under prefix:
 *   P/blobs/<sha256>          the blob's bytes
 *   P/bundles/<key>           the canonical manifest
 *   P/models/<model>/<key>    empty: lists a model's bundles
 *   P/leases/<key>            {"holder","token","expires_ms"}: a build lease
 * Strings are copied at open; the secret is wiped at close. */
typedef struct kc_store_s3 {
  const char *endpoint, *bucket, *region; /* region NULL: us-east-1 */
  const char *prefix;                     /* NULL or "": "kcache" */
  int path_style;
  const char *access_key, *secret_key, *session_token;
  unsigned parallel;         /* S3 requests at once for read-through; 0: 16 */
  uint64_t max_object_bytes; /* largest blob read through; 0: 4 GiB */
  /* Where the tier says what happens in the background (queue errors, a
   * corrupt object, conditional writes missing); level "info", "warn" or
   * "error". May be NULL. Called from the tier's threads. */
  void (*log)(void *ud, const char *level, const char *msg);
  void *log_ud;
} kc_store_s3;

typedef struct kc_store_opts {
  const char *dir;    /* created if missing */
  uint64_t max_bytes; /* limit on blob and manifest bytes (warmup
                         manifests: at most 1/8 of it); 0: none */
  uint64_t map_size;  /* LMDB map size; 0: derived from max_bytes, or 64 GiB */
  uint64_t grace_s;   /* unreferenced blobs older than this are collected;
                         0: default 3600 */
  unsigned max_readers;  /* LMDB reader slots: reads open at once (pooled
                            handles keep theirs); 0: 512 */
  int high_water_pct;    /* eviction starts above this % of max_bytes; 0: 95 */
  int low_water_pct;     /* and stops below this %; 0: 85 */
  const kc_store_s3 *s3; /* NULL: no durable tier */
  uint64_t kv_max_bytes; /* what RESP keys (kv.c) may reference, inside
                            max_bytes (--resp-max-bytes); 0: no own limit */
  /* zstd level (1..22) for new blobs, each kept compressed when that saves
   * at least an eighth of its bytes, else raw; 0: every blob raw
   * (--compress-level). Blobs are named by the SHA-256 of their
   * content whatever the encoding; max_bytes counts stored bytes. */
  int compress_level;
  /* A GET records a RESP key's use only when the last one recorded (or its
   * SET) is at least this old, so eviction orders keys to within it; 0:
   * 10 s (KCS_KV_USE_GRAIN_MS), < 0: every GET (exact order; tests). */
  int64_t kv_use_grain_ms;
} kc_store_opts;

/* Process-wide set-up of the libraries the durable tier uses (libcurl's
 * global init): once, in main, before any thread starts. */
kc_err kc_store_global_init(void);

/* Opens (creating if needed) the store in opts->dir. *out owned by caller.
 * One process serves a directory: the open takes an exclusive lock on the
 * directory and on dir/kcached.lock (holding its pid) until kc_store_close
 * (the directory's lock is the one that counts: the file can be deleted),
 * and answers
 * KC_LOCKED, naming the holder's pid, while another process (or another open
 * store of this process) holds it. A store holding more than max_bytes (the
 * limit was lowered) is evicted down to the low-water mark at open. */
kc_err kc_store_open(const kc_store_opts *opts, kc_store **out, char *err);
/* Flushes pending last-use records, closes. No read handle may be open.
 * NULL: nothing. */
void kc_store_close(kc_store *s);
/* Why the store runs without its index of warmup names (its map was full
 * when the open built it: the name check reads every manifest instead, and
 * the next open tries again); "" when the index is there. */
const char *kc_store_names_unindexed(const kc_store *s);

/* ---- Zero-copy reads ---- */

typedef struct kc_store_read kc_store_read; /* one LMDB read transaction */

/* Begins a read; end it soon (a long read pins old pages and grows the map). */
kc_err kc_store_read_begin(kc_store *s, kc_store_read **out);
/* Ends the read; every pointer it gave becomes invalid. NULL: nothing. */
void kc_store_read_end(kc_store_read *r);

/* How a blob's bytes are held. */
typedef enum kc_store_enc { KC_STORE_RAW = 0, KC_STORE_ZSTD = 1 } kc_store_enc;
/* kc_store_blob_get's answer for a blob held compressed: a code of its own
 * (never an answer on the wire; 500 if one ever leaked), so that it cannot
 * be mistaken for a front end's 501 not_implemented. */
#define KC_STORE_ENCODED KC_ENCODED

/* Which read of a blob, for whom (each a line; "raw": a blob held
 * compressed answers KC_STORE_ENCODED):
 *   kc_store_blob_read        a GET of one blob: one read, the bytes as held
 *                             (frame or content) and the content's size, S3
 *                             on a miss; every front end (kcd_svc_blob_read).
 *   kc_store_blob_get_stored  the bytes as held inside the caller's read, no
 *                             S3: several blobs in one read (routes_fetch.c).
 *   kc_store_blob_get         raw bytes inside the caller's read, no S3: the
 *                             store's own kc_store_blob_copy, and tests.
 *   kc_store_blob_copy        raw, a range copied in a read of its own: a
 *                             large raw blob's pieces (routes_blob.c).
 *   kc_store_blob_stream_*    piece by piece, each in a read of its own, as
 *                             held or decoded: a large compressed blob's
 *                             pieces (routes_zstd.c, routes_fetch.c).
 *   kc_store_lend             raw, the pages of a blob found in the caller's
 *                             read lent without a copy (loans.c).
 *   kc_store_fetch_blob[_copy] S3 only, into the store (and a small one's
 *                             bytes): the read-through inside
 *                             kc_store_blob_read, bundles and keys.
 *   kc_store_blob_check       hashes the held copy: a repair's check, never a
 *                             GET's.
 * A GET ends its read before any reply it copies or streams: a read held at
 * a client's pace pins every page freed after it began. */

/* Blob bytes, pointing into LMDB's map: valid until kc_store_read_end(r).
 * Records a use of nothing (blobs are used through bundles). A blob held
 * zstd-compressed answers KC_STORE_ENCODED: read it with
 * kc_store_blob_get_stored or kc_store_blob_stream. */
kc_err kc_store_blob_get(kc_store_read *r, const char *digest,
                         const void **data, size_t *len);
/* The bytes as held (a zstd frame when *enc is KC_STORE_ZSTD), pointing into
 * the map, and the content's size (*size, may be NULL). */
kc_err kc_store_blob_get_stored(kc_store_read *r, const char *digest,
                                const void **data, size_t *len,
                                kc_store_enc *enc, uint64_t *size);

/* A blob read piece by piece, each piece in a read of its own (as
 * kc_store_blob_copy), decompressed on the way when `decode` (no whole-blob
 * copy: a zstd stream decoder keeps its window), else as held. */
typedef struct kc_store_blob_stream kc_store_blob_stream;
/* *len: the bytes the pieces will give; *enc: how they come (KC_STORE_RAW
 * when decoded); *size: the content's size. Any may be NULL. A decoded
 * stream takes its decoder's memory out of a process-wide budget: KC_BUSY
 * when that is spent (try again later, or take the frame as it is held). */
kc_err kc_store_blob_stream_open(kc_store *s, const char *digest, int decode,
                                 kc_store_blob_stream **out, uint64_t *len,
                                 kc_store_enc *enc, uint64_t *size);
/* The next up to max bytes into buf: how many (0 at the end), -1 when the
 * blob went away or failed to decompress. */
long kc_store_blob_stream_read(kc_store_blob_stream *b, char *buf, size_t max);
void kc_store_blob_stream_free(kc_store_blob_stream *b);
/* Bytes of the decoder budget that open streams and uploads hold now. */
uint64_t kc_store_zstd_decode_memory(void);
/* Decompresses a held frame (zlen bytes) into dst, which takes exactly raw
 * bytes; KC_CORRUPT when the frame is not that. */
kc_err kc_store_zstd_decode(const void *z, size_t zlen, void *dst, size_t raw,
                            char *err);
/* Copies up to cap bytes of a blob from offset off into buf (*n: how many;
 * 0 at or past the end) and its size into *size (may be NULL), inside a read
 * of its own that ends before the call returns: a response served piece by
 * piece pins no page between pieces, however slow its client. A blob's bytes
 * never change under its digest; KC_NOT_FOUND when it is gone (evicted
 * between two pieces). */
kc_err kc_store_blob_copy(kc_store *s, const char *digest, uint64_t off,
                          void *buf, size_t cap, size_t *n, uint64_t *size);

/* A large raw blob's bytes lent to a response without a copy (lend.c): a
 * second mapping of the store's file over the blob's pages. kc_store_lend
 * takes the read r that kc_store_blob_get found data in (len bytes) and
 * holds it, so the pages stay the blob's; KC_EINVAL when the bytes are not
 * where a large value sits (copy them instead; r is still the caller's).
 * kc_store_lent_detach swaps a private copy in at the same address and ends
 * the read (for a client that is slow to take the bytes: a held read pins
 * every page freed after it began); the address and the bytes stay the
 * same, and a thread reading them meanwhile sees no change. On failure the
 * read is still held: KC_NOMEM, the bytes are still there; KC_IO, the range
 * may be unreadable (a swap failed half-way): stop sending from it. Not
 * thread-safe against kc_store_lent_free: the caller orders the two. */
typedef struct kc_store_lent kc_store_lent;
kc_err kc_store_lend(kc_store_read *r, const void *data, size_t len,
                     kc_store_lent **out);
const void *kc_store_lent_bytes(const kc_store_lent *l);
size_t kc_store_lent_size(const kc_store_lent *l);
/* Whether the loan still holds its read (not detached). */
int kc_store_lent_held(const kc_store_lent *l);
kc_err kc_store_lent_detach(kc_store_lent *l);
/* Unmaps, and ends the read if still held. NULL: nothing. */
void kc_store_lent_free(kc_store_lent *l);
/* A blob being sent in pieces (kc_store_blob_copy, a blob stream): for the
 * next 10 minutes eviction spares it as it spares a fresh upload (an
 * evicted bundle's blob becomes an orphan instead of going at once), so
 * that its client gets it whole. Memory only, no write: call it again to
 * renew. */
void kc_store_blob_spare(kc_store *s, const char *digest);

/* The reads open now (kc_store_read_begin to kc_store_read_end, the store's
 * own included) and the reads LMDB's reader table refused (KC_BUSY): a read
 * held open pins every page freed after it began, so an old one means a map
 * that cannot reuse its free pages. */
typedef struct kc_store_read_stats {
  uint64_t open;          /* reads open now */
  uint64_t oldest_age_ms; /* age of the oldest open read; 0: none */
  uint64_t readers_full; /* reads refused for a full reader table, since open */
  unsigned max_readers;  /* slots of the reader table (opts.max_readers) */
} kc_store_read_stats;
void kc_store_read_stats_get(kc_store *s, kc_store_read_stats *out);
/* Bundle manifest JSON (canonical), pointing into the map; valid until
 * kc_store_read_end(r). Counts a hit and records the last use in memory
 * (flushed in batches, never one write transaction per read). */
kc_err kc_store_bundle_get(kc_store_read *r, const char *key, const char **json,
                           size_t *len);

/* ---- Blobs ---- */

/* 0/KC_OK if held (and *size set when size != NULL), KC_NOT_FOUND if not. */
kc_err kc_store_blob_has(kc_store *s, const char *digest, uint64_t *size);
/* Hashes the held copy (GETs serve it unhashed, zero-copy): KC_OK when it
 * hashes to its name, KC_CORRUPT (err names the hash) when the bytes rotted,
 * KC_NOT_FOUND when none is held. */
kc_err kc_store_blob_check(kc_store *s, const char *digest, char *err);
/* A client offered a blob the store holds (a PUT answered "already
 * present"): for the next 10 minutes eviction spares it as it spares a fresh
 * upload, so the manifest that follows finds it. Kept in memory (an orphan's
 * upload window is also moved on disk). A put of a held blob does this. */
void kc_store_blob_touch(kc_store *s, const char *digest);
/* Stores bytes under their digest; KC_DIGEST_MISMATCH (nothing stored) when
 * they do not hash to it. *created: 1 new, 0 already present. */
kc_err kc_store_blob_put(kc_store *s, const char *digest, const void *data,
                         size_t len, int *created, char *err);
/* Same, reading len bytes from fd (a file or a pipe) into the space LMDB
 * reserves for the value (MDB_RESERVE), hashing as it goes: the bytes are
 * held once, in LMDB's pages, never copied through a buffer of ours. A file is
 * read with pread from its current offset; a blob already held is not read
 * from fd at all (*created 0). */
kc_err kc_store_blob_put_fd(kc_store *s, const char *digest, int fd,
                            uint64_t len, int *created, char *err);

/* A streaming upload: bytes are hashed while they arrive and spooled, the
 * first MiB in memory and beyond that to an unlinked temporary file
 * (O_TMPFILE) in the store's directory, with no write transaction held
 * meanwhile; commit copies them into the map in one transaction. For a server
 * receiving a body in pieces. One upload is used by one thread at a time. */
typedef struct kc_store_upload kc_store_upload;
kc_err kc_store_upload_begin(kc_store *s, kc_store_upload **out, char *err);
kc_err kc_store_upload_write(kc_store_upload *u, const void *data, size_t len,
                             char *err);
uint64_t kc_store_upload_size(const kc_store_upload *u);
/* Verifies the digest (KC_DIGEST_MISMATCH: nothing stored) and stores. Frees u
 * whatever the result. */
kc_err kc_store_upload_commit(kc_store_upload *u, const char *digest,
                              int *created, char *err);
/* Drops an upload (client went away). NULL: nothing. */
void kc_store_upload_abort(kc_store_upload *u);
/* Lets the commit overwrite a held copy of the blob (*created 1 then) with
 * the upload's bytes, verified against the digest first. For an upload of a
 * blob kc_store_blob_check found corrupt. */
void kc_store_upload_repair(kc_store_upload *u);
/* Before the first write: the bytes to come are one zstd stream (a PUT with
 * Content-Encoding: zstd). They are decompressed as they arrive, the digest
 * is that of the output, and more than max_out bytes of output stop the
 * upload (KC_TOO_LARGE: a decompression bomb); a corrupt frame answers
 * KC_EINVAL at the write, a truncated one at the commit. The frame is kept as
 * received when the store compresses and it halves the bytes, else the
 * content is stored raw. kc_store_upload_size counts the output. */
void kc_store_upload_zstd(kc_store_upload *u, uint64_t max_out);

/* ---- Bundles ---- */

/* Stores a validated manifest, write-once: *created 1 new; 0 when an
 * identical bundle is there; KC_CONFLICT when a different one holds the key.
 * KC_MISSING_BLOBS when referenced blobs are absent: *missing (malloc'd array
 * of malloc'd digests, free with kc_store_strv_free) lists them when missing is
 * not NULL. KC_BAD_MANIFEST when a file's size is not its blob's. The blobs'
 * refcounts change in the same transaction. */
kc_err kc_store_bundle_put(kc_store *s, const kc_manifest *m, int *created,
                           char ***missing, size_t *n_missing, char *err);
/* Deletes a bundle and drops its blobs' refcounts (blobs left unreferenced are
 * collected by gc after the grace period). KC_NOT_FOUND if absent. */
kc_err kc_store_bundle_delete(kc_store *s, const char *key, char *err);
/* KC_OK if present, KC_NOT_FOUND if not (no hit counted). */
kc_err kc_store_bundle_has(kc_store *s, const char *key);

void kc_store_strv_free(char **v, size_t n);

/* One bundle of a model, for listings. */
typedef struct kc_store_bundle_info {
  char key[KC_HEX_LEN + 1];
  uint64_t bytes;    /* sum of its files' sizes */
  int64_t created;   /* unix seconds */
  int64_t last_used; /* unix seconds */
  uint64_t hits;
  const char *manifest; /* canonical JSON, valid during the callback only */
  size_t manifest_len;
  /* The canonical key JSON ({"arch","bucket","build","model","toolchain",
   * "v"}; kc_key_canonical), valid during the callback only: what a listing
   * shows, without parsing a manifest that may be megabytes. NULL for a
   * bundle stored before the index held it: parse manifest then. */
  const char *fields;
  size_t fields_len;
} kc_store_bundle_info;

/* Calls cb for each bundle of model (64 hex) inside one read transaction, in
 * key order; cb returns non-zero to stop. A model with no bundle: KC_OK and
 * no call. last_used and hits are as of the last flush. */
typedef int (*kc_store_bundle_cb)(const kc_store_bundle_info *info, void *ud);
kc_err kc_store_model_list(kc_store *s, const char *model,
                           kc_store_bundle_cb cb, void *ud);

/* ---- Bookkeeping, eviction, GC ---- */

typedef struct kc_store_stats {
  uint64_t bytes_used; /* bytes of blobs, manifests, warmup manifests and
                          RESP keys held
                          (KC_KV_KEY_BYTES each; a compressed blob
                          counts its stored bytes) */
  uint64_t max_bytes;  /* 0: no limit */
  uint64_t map_size;
  uint64_t map_used; /* pages in use * page size */
  uint64_t blobs;
  uint64_t bundles;
  uint64_t hits, misses; /* bundle gets since open */
  uint64_t evicted_bundles, evicted_blobs, gc_blobs; /* since open */
  uint64_t scrub_bytes, scrub_passes, scrub_corrupt; /* since open */
  /* blobs the scrub passed over unhashed: a frame from before the window
   * bound whose decoder the budget could not hold then (since open) */
  uint64_t scrub_skipped;
  /* Unix time since when writes fail for lack of disk (a commit or an
   * upload's spool file got ENOSPC or EDQUOT: KC_DISK_FULL); 0 when they do
   * not. Cleared by the next commit that succeeds. Reads still work. */
  int64_t disk_full_since;
  uint64_t kv_keys;      /* RESP keys held (expired not yet reclaimed too) */
  uint64_t kv_expires;   /* of them, those with an expiry (the kvexp index's
                            entries: O(1), exact) */
  uint64_t kv_bytes;     /* value bytes they reference, each key counted
                            (a value two keys share counts twice) */
  uint64_t kv_max_bytes; /* 0: no own limit */
  uint64_t kv_hits, kv_misses, evicted_kv; /* since open */
  uint64_t bytes_raw; /* bytes_used with each compressed blob counted at
                         its content's size (== bytes_used: none) */
} kc_store_stats;

/* The same flag without a read transaction (for a readiness probe). */
int64_t kc_store_disk_full_since(kc_store *s);

kc_err kc_store_stats_get(kc_store *s, kc_store_stats *out);
/* Writes pending last-use times and hit counts in one transaction (and
 * RESP keys' last uses in a second). */
kc_err kc_store_flush(kc_store *s);
/* Evicts least recently used bundles (and RESP keys, by the rules in "RESP
 * keys" below), then blobs unreferenced for over 10
 * minutes (younger ones are likely uploads whose manifest is on its way),
 * oldest first, then warmup manifests of models without bundles, until
 * bytes used is at most target_bytes or nothing is left to evict. Called by
 * puts above the high-water mark. */
kc_err kc_store_evict(kc_store *s, uint64_t target_bytes, char *err);
/* Collects blobs no bundle references that are older than the grace period
 * (now: unix seconds, so tests can move the clock). */
kc_err kc_store_gc(kc_store *s, int64_t now, char *err);
/* Re-hashes every blob and re-validates every bundle (its blobs present).
 * Returns KC_CORRUPT with the first problem in err. A blob whose frame's
 * decoder does not fit the decoder budget now is not verified, and the
 * walk goes on: with no problem found, KC_BUSY says how many were not. */
kc_err kc_store_verify(kc_store *s, char *err);

/* The scrub (scrub.c). GETs serve blobs from the map without hashing them,
 * so bytes that rot on the disk would be served until a client noticed. The
 * scrub hashes the blobs in digest order, a budget at a time, resuming where
 * its last step stopped, and removes a blob that no longer hashes to its name
 * together with every bundle naming it, in one transaction: no read that
 * begins after it gets those bytes; the next client rebuilds the bundle
 * (or, with the durable tier, reads it through from S3, verified). The blob
 * is not removed when a repair (kc_store_upload_repair) replaced its bytes
 * in between. */
typedef struct kc_store_scrub {
  char next[KC_HEX_LEN + 1]; /* the next blob to hash; "": the first */
  uint64_t cost;             /* what the last step spent of its budget */
  char bad[KC_HEX_LEN + 1];  /* the corrupt blob the last step found, or "" */
  int removed;               /* it was removed (not repaired meanwhile) */
  size_t bundles;            /* bundles removed with it */
  size_t kv_keys;            /* RESP keys removed with it (their value) */
  int loaded;                /* next was read from the store (first step) */
  int64_t saved;             /* when next was last written to the store */
} kc_store_scrub;
/* One step: hashes blobs from sc->next until budget is spent (a blob costs
 * its size, at least 4 KiB), the last blob is hashed (the pass ends, and the
 * next step starts again at the first), or a corrupt one is found (sc->bad;
 * removed in a write transaction). Start from a zeroed kc_store_scrub: the
 * first step resumes where an earlier process stopped (the position is
 * written to the store every 5 minutes). One thread at a time per
 * kc_store_scrub. */
kc_err kc_store_scrub_step(kc_store *s, kc_store_scrub *sc, uint64_t budget,
                           char *err);

/* ---- The durable tier (opts->s3; tier.c, tier_read.c, tier_lease.c) ----
 *
 * Write-through: a blob or bundle put that creates something, and a bundle
 * delete, add an entry to a queue kept in LMDB in the same transaction, so
 * the queue survives a crash exactly as the data does. One background thread
 * uploads the entries in order (a bundle's blobs were queued before it, so no
 * replica finds a manifest whose blobs are missing), retrying with backoff
 * (100 ms doubling to 30 s) while S3 fails; eviction skips bundles still
 * queued. An entry S3 refuses 8 times for a reason retrying does not cure
 * (a 4xx) is set aside until the next open, so the rest goes on. Blobs and
 * manifests are written with If-None-Match: * (a 412 means another replica
 * was first: for a blob the same bytes; for a manifest S3's copy wins for
 * every replica, and a different local one is replaced by it: see
 * kc_store_bundle_put_once). Before a manifest, each of its blobs is
 * checked with a HEAD and uploaded when missing (blobs held before the tier
 * was configured, or removed from the bucket since); a blob a client offers
 * again (kc_store_blob_touch) is queued again for the same reason, once per
 * 10-minute upload window.
 *
 * Read-through (the fetch functions): an object found in S3 is verified (a
 * blob against its digest, a manifest against its key and its blobs) and
 * stored in LMDB under the usual limits, without being queued again. A
 * corrupt object (a blob whose bytes do not hash to its name, a manifest
 * under another key) is deleted from the bucket, counted and never stored
 * (KC_CORRUPT); a manifest this version cannot parse is a miss, left in
 * place (a newer replica may read it). Concurrent fetches of one object share
 * one request. After a failure to reach S3, fetches answer KC_UNAVAILABLE at
 * once for 2 s rather than make every miss wait for a timeout.
 *
 * Threads: any. Without a tier every fetch is KC_NOT_FOUND and every lease
 * call KC_OK. */

/* kc_store_bundle_put, write-once across replicas (tier_once.c). A key the
 * store lacks is first read through from the bucket (not counted as a
 * read-through): when the bucket holds a different manifest, KC_CONFLICT
 * (err says the bucket's copy won) and the store now holds the bucket's
 * copy, so this replica serves what the fleet built; the same manifest:
 * *created 0. Absent from the bucket, or the bucket cannot be asked (S3
 * down, an error): stored and queued as kc_store_bundle_put does; should the
 * queue then find another manifest in the bucket, the bucket's replaces the
 * local one (counted in once_replaced). Without a tier, or for a key held:
 * kc_store_bundle_put. What every front end's bundle PUT calls. */
kc_err kc_store_bundle_put_once(kc_store *s, const kc_manifest *m, int *created,
                                char ***missing, size_t *n_missing, char *err);

/* Makes the blob local from S3 when the store lacks it. KC_OK: held now;
 * KC_NOT_FOUND: S3 lacks it too (or no tier); KC_CORRUPT; KC_UNAVAILABLE. */
kc_err kc_store_fetch_blob(kc_store *s, const char *digest, char *err);
/* The same, and for a blob of at most 1 MiB fetched by this call, its
 * verified bytes in *data (malloc'd, the caller frees; NULL otherwise: read
 * the store then). Those bytes are answered before the store's commit, which
 * follows on the tier's fill thread (the bucket holds the durable copy, so
 * the client does not wait for LMDB's sync); other askers of the same blob
 * wait for that commit. */
kc_err kc_store_fetch_blob_copy(kc_store *s, const char *digest, void **data,
                                size_t *len, char *err);
/* The same for a bundle: its manifest and every blob it names. */
kc_err kc_store_fetch_bundle(kc_store *s, const char *key, char *err);
/* fetch_bundle for n keys, at most opts->s3->parallel at once; results[i]
 * gets each key's answer. */
void kc_store_fetch_bundles(kc_store *s, const char *const *keys, size_t n,
                            kc_err *results);
/* Fetches the bundles of model that S3 lists and the store lacks, so that
 * kc_store_model_list shows them. KC_OK also when S3 lists none. */
kc_err kc_store_fetch_model(kc_store *s, const char *model, char *err);

/* A blob as a GET's read found it (kc_store_blob_read). */
typedef struct kc_store_blob_view {
  const void *data; /* the bytes as held: the zstd frame when enc says so */
  size_t len;       /* of data */
  kc_store_enc enc; /* how data holds the content */
  uint64_t size;    /* the content's size (len when raw) */
  void *heap;       /* fetched from S3 by this call: data, malloc'd (raw) */
} kc_store_blob_view;
/* A GET's read with read-through, what every front end calls: begins *rd
 * and finds the blob as held (v->data, v->len point into the map until
 * kc_store_read_end(*rd); v->enc says whether they are the content or its
 * zstd frame, v->size is the content's size); a miss asks the tier once. A
 * small blob fetched by this call comes back in v->heap instead (the
 * content, malloc'd, the caller frees; v->data points at it, *rd is NULL):
 * answered before the store's commit. Errors end *rd (NULL): KC_CORRUPT,
 * KC_NOT_FOUND (also when S3 could not be asked: err says why), or the
 * store's error. */
kc_err kc_store_blob_read(kc_store *s, const char *digest, kc_store_read **rd,
                          kc_store_blob_view *v, char *err);
/* The same for a bundle's manifest. */
kc_err kc_store_bundle_read(kc_store *s, const char *key, kc_store_read **rd,
                            const char **json, size_t *len, char *err);

#define KC_STORE_HOLDER_MAX 128
/* A build lease in the bucket, shared by every replica: created with
 * If-None-Match: *, an expired one taken over with If-Match on its ETag.
 * KC_OK: granted (also where S3 cannot be reached or ignores conditional
 * writes: then leases hold per replica only, and the tier logs it);
 * KC_LEASED: another holder (held_by, *remaining_ms until it expires).
 * token: the local lease's token, kept in the object so release can check. */
kc_err kc_store_lease_acquire(kc_store *s, const char *key, const char *holder,
                              const char *token, uint64_t ttl_ms,
                              char held_by[KC_STORE_HOLDER_MAX + 1],
                              uint64_t *remaining_ms, char *err);
/* Ends the lease in the bucket when it still carries token (by replacing it
 * with an expired one, on its ETag), unless the bundle built under it still
 * waits in this store's upload queue: then it runs out by itself. KC_OK,
 * KC_FORBIDDEN (another token holds it), KC_NOT_FOUND (none live, or no
 * tier), or the S3 error. For a release that reaches a replica other than
 * the one that granted the lease. */
kc_err kc_store_lease_release(kc_store *s, const char *key, const char *token);
/* 1 when the bucket's lease of key carries token and has run out (it was
 * released through another replica, or expired): the replica that granted
 * it may forget its own record. 0 otherwise, or when S3 cannot say. */
int kc_store_lease_ended(kc_store *s, const char *key, const char *token);

#define KC_STORE_S3_BUCKETS 12 /* request-duration histogram bounds */
typedef struct kc_store_tier_stats {
  int enabled;
  int up;          /* the last S3 request reached S3 */
  int conditional; /* If-None-Match honoured: 1 yes, 0 no, -1 not known yet */
  uint64_t queue_depth;
  uint64_t uploaded; /* queue entries done */
  uint64_t parked;   /* entries S3 refused for good, set aside (since open) */
  uint64_t requests, errors;
  uint64_t rt_hit, rt_miss, rt_corrupt, rt_error; /* read-through outcomes */
  /* Write-once across replicas (kc_store_bundle_put_once): PUTs refused
   * because the bucket held another manifest; local bundles replaced by the
   * bucket's after the queue found it there first. Since open. */
  uint64_t once_refused, once_replaced;
  double bounds_s[KC_STORE_S3_BUCKETS];
  uint64_t duration[KC_STORE_S3_BUCKETS + 1]; /* per bucket, not cumulative */
  uint64_t duration_us_sum;
} kc_store_tier_stats;

kc_err kc_store_tier_stats_get(kc_store *s, kc_store_tier_stats *out);

/* ---- RESP keys (kv.c, kv_scan.c, kv_evict.c) ----
 *
 * The store side of kcached's Redis protocol listener. A RESP key (binary,
 * 1..KC_KV_KEY_MAX bytes) maps to (value digest, size, absolute expiry): the
 * value is an ordinary content-addressed blob, referenced (refcounted) by
 * the key as a bundle references its files, so identical values are stored
 * once; a blob shared by a bundle and a RESP key survives deleting either,
 * and a blob only RESP keys reference is neither an orphan nor collected by
 * gc. Deleting or overwriting a key frees a value nothing else references at
 * once. RESP keys take part in LRU eviction (last uses batched in memory as
 * bundle reads are); with kv_max_bytes set, RESP keys are evicted first while
 * they hold more than it, bundles first while they hold more than the rest.
 * A scrub that removes a rotted blob removes the RESP keys naming it. Keys
 * with an expiry read as missing from then on and are reclaimed by
 * kc_store_kv_expire_step. Bad key length: KC_BAD_KEY. */
#define KC_KV_KEY_MAX 65536 /* bytes of one RESP key */
/* What one RESP key costs in bytes_used (and toward max_bytes) besides its
 * value's blob: its record (a 96-byte header, the 64-hex LMDB key, the key's
 * bytes) and its index entries (kvlru and kvexp, 72 bytes each, the expiry
 * one counted whether or not the key has one), with LMDB's 8-byte node
 * headers: 328 + the key's length. Not counted in kv_bytes (the values). */
#define KC_KV_KEY_OVERHEAD 328
#define KC_KV_KEY_BYTES(klen) ((uint64_t)KC_KV_KEY_OVERHEAD + (uint64_t)(klen))

/* ---- reads: inside a kc_store_read (one LMDB read txn) ---- */

typedef struct kc_store_kv_val {
  const void *data; /* the value, pointing into LMDB's map: valid until
                       kc_store_read_end() of the read it came from */
  size_t len;
  int64_t expire_ms; /* absolute unix ms; 0: no expiry */
  /* KC_STORE_ZSTD: data is a zstd frame of len bytes that decompresses to
   * the value's size bytes (kc_store_zstd_decode); raw: size == len. */
  kc_store_enc enc;
  uint64_t size;
} kc_store_kv_val;

/* KC_OK: found and not expired at now_ms (out filled). KC_NOT_FOUND: no such
 * key, expired, or its blob is gone (evicted/scrubbed). Counts a hit/miss
 * and batches "last used" as bundle reads do (no write txn per read). */
kc_err kc_store_kv_get(kc_store_read *r, const void *key, size_t klen,
                       int64_t now_ms, kc_store_kv_val *out);

/* Metadata only (EXISTS, TTL, PTTL, TYPE, STRLEN): no hit counted. */
kc_err kc_store_kv_meta(kc_store_read *r, const void *key, size_t klen,
                        int64_t now_ms, uint64_t *size, int64_t *expire_ms);

/* ---- writes: a batch in ONE write transaction, synced before return ---- */

typedef enum kc_store_kv_opcode {
  KC_KV_SET,     /* key = val, with flags and expire_ms */
  KC_KV_DEL,     /* done = 1 if a live key was removed */
  KC_KV_EXPIRE,  /* expire_ms absolute; <= now_ms deletes; done = 1 if the
                    key exists (and flags KC_KV_NX/XX/GT/LT not refusing) */
  KC_KV_PERSIST, /* done = 1 if the key existed and had an expiry */
  KC_KV_FLUSH    /* every RESP key; done = number removed (as a count) */
} kc_store_kv_opcode;

#define KC_KV_NX 1      /* SET: only if absent; EXPIRE: only if no expiry */
#define KC_KV_XX 2      /* SET: only if present; EXPIRE: only if it has one */
#define KC_KV_KEEPTTL 4 /* SET: keep the old expiry */
#define KC_KV_GET 8     /* SET: return the old value (old/old_len/had_old) */
#define KC_KV_GT 16     /* EXPIRE GT */
#define KC_KV_LT 32     /* EXPIRE LT */

typedef struct kc_store_kv_op {
  kc_store_kv_opcode op;
  const void *key;
  size_t klen;
  const void *val; /* SET: the value (borrowed for the call) */
  size_t vlen;
  int flags;
  int64_t expire_ms; /* SET/EXPIRE: absolute unix ms; 0 none */
  /* results */
  kc_err err;    /* this op's own error (KC_STORE_FULL, KC_TOO_LARGE, ...);
                    the others of the batch still apply */
  uint64_t done; /* see each opcode; SET: 1 written, 0 refused by NX/XX */
  int had_old;   /* KC_KV_GET: the key existed */
  void *old;     /* KC_KV_GET: malloc'd copy of the old value; caller frees */
  size_t old_len;
  /* SET: the SHA-256 (hex) of key and value when already computed
   * (kc_store_kv_set_settled did): hashed set, apply does not hash again.
   * Zero them (hashed 0) when key or value change. */
  int hashed;
  char key_hex[KC_HEX_LEN + 1], val_hex[KC_HEX_LEN + 1];
} kc_store_kv_op;

/* Applies ops in order in one write transaction and commits it (durable on
 * return: a SIGKILL after this returned KC_OK loses nothing). This is the
 * group commit: the listener gathers concurrent clients' writes (and a
 * MULTI/EXEC's commands) into one call. Values are hashed (SHA-256) before
 * the write lock is taken. Returns an error only when nothing was committed
 * (then every op's err is set too). */
kc_err kc_store_kv_apply(kc_store *s, kc_store_kv_op *ops, size_t n,
                         int64_t now_ms, char *err);

/* A SET decided from the committed state alone, without a write: a read
 * r's snapshot is committed and synced (LMDB publishes a transaction to
 * readers only after its sync), so when the key already holds this value
 * and this expiry (1, op->done = 1; its use is recorded as a GET's), or NX
 * or XX refuse the SET (1, op->done = 0), nothing need be written and the
 * caller may answer at once, as durably as after a commit. 0: it must go
 * through kc_store_kv_apply (the hashes stay in op for it). The caller
 * must have no write of its own not yet applied before this one (its
 * effect would be missed). KC_KV_GET, an expiry in the past, a value over
 * the limits, a bad key: 0. */
int kc_store_kv_set_settled(kc_store_read *r, kc_store_kv_op *op,
                            int64_t now_ms);

/* Read-through (the durable tier, opts->s3): after a miss, makes the key
 * local from the bucket (its record and value, verified) unless it expired
 * by now_ms; then read it again. A key written here since is kept. KC_OK:
 * held now; KC_NOT_FOUND: the bucket lacks it too (or no tier); KC_BAD_KEY,
 * KC_UNAVAILABLE (S3 failed within 2 s), KC_CORRUPT. Writes (SET, EXPIRE,
 * PERSIST, DEL, FLUSH) go through to the bucket by the tier's queue, as
 * bundles do (a key waiting there is not evicted); eviction and expiry
 * reclaim here leave the bucket's copy. Threads: any; not inside a read. */
kc_err kc_store_kv_fetch(kc_store *s, const void *key, size_t klen,
                         int64_t now_ms, char *err);
/* kc_store_kv_fetch with the read-through's rule of the other kinds: S3
 * unreachable or failing reads as a miss (KC_NOT_FOUND, err says why);
 * KC_OK and KC_CORRUPT as they are. What RESP's fetchers call. */
kc_err kc_store_kv_read_through(kc_store *s, const void *key, size_t klen,
                                int64_t now_ms, char *err);

/* ---- iteration, counts, expiry ---- */

/* SCAN: up to `count` live keys from cursor (0: the start), matching the
 * Redis glob `pattern` (NULL: all), each passed to cb (return nonzero to
 * stop). *next: the cursor to continue from, 0 when the walk is done. The
 * cursor is opaque (e.g. the first 8 bytes of the next LMDB key, big
 * endian); keys may repeat across calls but a key present throughout is
 * returned at least once, as Redis promises. Visits at most 10 * count
 * entries per call even when few match (bounded work, like Redis). */
typedef int (*kc_store_kv_cb)(const void *key, size_t klen, void *ud);
kc_err kc_store_kv_scan(kc_store *s, uint64_t cursor, const void *pattern,
                        size_t plen, size_t count, int64_t now_ms,
                        kc_store_kv_cb cb, void *ud, uint64_t *next);

/* Redis's glob match (*, ?, [abc], [^a], [a-z], \x), exposed for KEYS/SCAN
 * tests: 1 match, 0 not. */
int kc_store_kv_match(const void *pattern, size_t plen, const void *s,
                      size_t slen);

/* DBSIZE: RESP keys held (expired but not yet reclaimed may be counted). */
kc_err kc_store_kv_count(kc_store *s, uint64_t *n);

/* Background reclaim of expired keys: removes at most max of them in one
 * write transaction; *removed how many. Called from kcached's once-a-second
 * maintenance tick. */
kc_err kc_store_kv_expire_step(kc_store *s, int64_t now_ms, size_t max,
                               size_t *removed, char *err);

/* ---- Demand (demand.c): the shapes clients saw and what they missed ----
 *
 * Telemetry from services (POST /v1/demand): per model, a histogram of the
 * shapes it ran and of what it asked for and did not find. Adds only count in
 * memory (no write transaction); kc_store_demand_flush, called once a second
 * by kcached's maintenance tick, merges them into the "demand" database in
 * one transaction. Everything is bounded: at most KC_STORE_DEMAND_PENDING
 * distinct entries (from at most KC_STORE_DEMAND_PENDING_MODELS models) wait
 * in memory, and beyond that adds are dropped and counted; on disk at most
 * KC_STORE_DEMAND_ENTRIES entries and KC_STORE_DEMAND_RECORD_BYTES per model
 * (the least counted are dropped, their counts added to the model's
 * `dropped`) and KC_STORE_DEMAND_MODELS models (a new model replaces the one
 * with the smallest total): at most 128 MiB in all.
 *
 * Known models (with a bundle or a warmup manifest, which only write tokens
 * make) are kept from other models' floods: a model may have at most
 * KC_STORE_DEMAND_ENTRIES entries pending; models the store does not have
 * may fill at most half of the pending entries and model slots; and on disk
 * a new model displaces the unknown model with the smallest total, a known
 * one only when every kept model is known and the newcomer is known too
 * (an unknown newcomer is then dropped). */

#define KC_STORE_DEMAND_ENTRIES 4096
#define KC_STORE_DEMAND_MODELS 1024
#define KC_STORE_DEMAND_RECORD_BYTES (128 * 1024)
#define KC_STORE_DEMAND_PENDING 16384
#define KC_STORE_DEMAND_PENDING_MODELS 256
#define KC_STORE_DEMAND_COUNT_MAX 4294967295ULL /* one add's count */
/* What one report (POST /v1/demand) may add up to: a larger one is scaled
 * down to it, each count in proportion (at least 1). A service's library
 * sends every 2 s, so this is half a million runs a second of one model. */
#define KC_STORE_DEMAND_REPORT_MAX (1ULL << 20)
/* Longest entry text: 16 dims of "name=value," (32 + 1 + 16 + 1 bytes). */
#define KC_STORE_DEMAND_TEXT_MAX 800

typedef enum kc_store_demand_kind {
  KC_DEMAND_SHAPE = 0,      /* a shape the service ran */
  KC_DEMAND_MISS_SHAPE = 1, /* a shape no bucket held */
  KC_DEMAND_MISS_KEY = 2    /* a bundle key asked for and not there */
} kc_store_demand_kind;

typedef struct kc_store_demand_item {
  kc_store_demand_kind kind;
  /* Shapes: canonical "name=value,name=value" (names sorted); keys: 64 hex.
   * Owned by the kc_store_demand it is in. */
  const char *text;
  uint64_t count;
} kc_store_demand_item;

typedef struct kc_store_demand {
  uint64_t total;   /* every count ever added, dropped ones included */
  uint64_t dropped; /* counts of entries dropped to keep the bound */
  int64_t updated;  /* unix seconds of the last flush that touched it */
  size_t n;
  kc_store_demand_item *items; /* count descending, then kind, then text */
} kc_store_demand;

/* Checks a shape by the bucket rules (1..16 dims, names [a-z][a-z0-9_]{0,31},
 * unique, values 0..2^53) and writes its canonical text into text
 * (KC_STORE_DEMAND_TEXT_MAX + 1 bytes). KC_EINVAL with a sentence. */
kc_err kc_store_demand_shape_text(const kc_bucket *shape, char *text,
                                  char *err);
/* Parses canonical text back into a bucket. KC_EINVAL if it is not one. */
kc_err kc_store_demand_shape_parse(const char *text, kc_bucket *out);
/* Counts one entry for model (64 hex) in memory. text: a shape's canonical
 * text, or a key (64 hex) for KC_DEMAND_MISS_KEY; count 1..COUNT_MAX;
 * known: kc_store_model_known(model), asked once per report by the caller.
 * KC_BUSY when the pending table, or the model's share or the unknown
 * models' share of it, is full (dropped: nothing counted). Any thread;
 * never a write transaction. */
kc_err kc_store_demand_add(kc_store *s, const char *model,
                           kc_store_demand_kind kind, const char *text,
                           uint64_t count, int known, char *err);
/* 1 when the store has a bundle or a warmup manifest of model (one read). */
int kc_store_model_known(kc_store *s, const char *model);
/* Merges what is pending into the database in one write transaction. On
 * failure the pending counts are lost (telemetry) and the error returned.
 * Any thread; kcached's maintenance tick and kc_store_close call it. */
kc_err kc_store_demand_flush(kc_store *s, char *err);
/* The model's histogram as last flushed; an unknown model gives n = 0.
 * *out is filled and owned by the caller (kc_store_demand_free). */
kc_err kc_store_demand_get(kc_store *s, const char *model, kc_store_demand *out,
                           char *err);
void kc_store_demand_free(kc_store_demand *d);
/* ---- Models (models.c): every model, its warmup manifest, a purge ---- */

/* One model, for GET /v1/models: a model with bundles, or with a warmup
 * manifest, or both. Figures add up its bundles (hits and last use as of the
 * last flush). */
typedef struct kc_store_model_info {
  char model[KC_HEX_LEN + 1];
  uint64_t bundles, bytes, hits;
  int64_t last_used;  /* unix seconds, the latest of its bundles; 0: none */
  const char *warmup; /* its warmup manifest (as uploaded), valid during the
                         callback only; NULL: none */
  size_t warmup_len;
} kc_store_model_info;
typedef int (*kc_store_model_cb)(const kc_store_model_info *m, void *ud);

/* Calls cb for up to `limit` models in hex order, after `after` (NULL or "":
 * from the first), inside one read transaction; cb returns non-zero to stop.
 * next: "" when the walk reached the end, else the last model given (pass it
 * as `after` to go on). Work is one index entry per bundle of the models
 * listed. Threads: any. */
kc_err kc_store_models_list(kc_store *s, const char *after, size_t limit,
                            kc_store_model_cb cb, void *ud,
                            char next[KC_HEX_LEN + 1], char *err);
/* Stores the model's warmup manifest (the caller validated it; name is its
 * model.name), replacing an older one, in one write transaction. A name
 * belongs to the first model that stored it: without KC_WARMUP_RENAME in
 * flags, KC_CONFLICT when the model's stored manifest has another name or
 * another model's manifest has this one (the name index, warmnames). An
 * empty name, or one over 511 bytes, is KC_BAD_WARMUP. Manifests count in
 * bytes_used and together take at most 1/8 of max_bytes (of the map without
 * it): a put past that drops manifests of other models without bundles,
 * and is KC_STORE_FULL when those are not enough. */
#define KC_WARMUP_RENAME 1 /* may rename, or share a name (admin) */
/* archs: "a,b", the archs this warm runs for (its --arch, else the
 * manifest's; NULL: neither). They are added to the archs recorded for the
 * model while its manifest stays byte for byte the same, and replace them
 * when it changed (kc_store_warm_archs_get; at most 64 archs' worth). */
#define KC_STORE_WARM_ARCHS_MAX 2048
kc_err kc_store_warmup_put(kc_store *s, const char *model, const char *name,
                           const char *json, size_t len, int flags,
                           const char *archs, char *err);
/* The archs warms of the model ran for ("a,b", in the order first seen);
 * KC_NOT_FOUND when none is recorded. */
kc_err kc_store_warm_archs_get(kc_store *s, const char *model,
                               char out[KC_STORE_WARM_ARCHS_MAX]);
/* The model's warmup manifest: *json malloc'd (NUL-terminated), the caller
 * frees it. KC_NOT_FOUND when none was stored. */
kc_err kc_store_warmup_get(kc_store *s, const char *model, char **json,
                           size_t *len, char *err);
/* Deletes every bundle of the model, as kc_store_bundle_delete does one
 * (blobs left unreferenced become orphans for gc; the durable tier gets a
 * delete for each), in write transactions of at most KC_STORE_PURGE_BATCH
 * bundles each, so readers and other writers get their turn between
 * them; then its warmup manifest. *removed: bundles deleted (may be NULL).
 * A model with nothing: KC_OK, 0. */
#define KC_STORE_PURGE_BATCH 256
kc_err kc_store_model_purge(kc_store *s, const char *model, size_t *removed,
                            char *err);

#endif
