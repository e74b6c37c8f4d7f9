/* blob.c: content-addressed blobs. Bytes are written straight into LMDB's
 * reserved space (MDB_RESERVE) and never stored unless they hash to their
 * name; uploads arriving in pieces are hashed as they come and spooled in
 * memory (small) or to an unlinked temporary file (large), so no write
 * transaction is held while a client is slow. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "store_internal.h"

#define SPOOL_MEM (1u << 20) /* uploads up to this stay in memory */
#define COPY_CHUNK (1u << 20)

static kc_err check_digest(const char *digest, char *err) {
  if (!digest || !kc_is_hex64(digest))
    return kc_errf(err, KC_BAD_DIGEST,
                   "'%.80s' is not a lowercase 64-hex "
                   "SHA-256",
                   digest ? digest : "(null)");
  return KC_OK;
}

static kc_err get_meta(MDB_txn *txn, kc_store *s, const char *digest,
                       kcs_blob_meta *bm) {
  MDB_val k = kcs_hex_val(digest), v;
  int rc = mdb_get(txn, s->blobmeta, &k, &v);
  if (rc == MDB_NOTFOUND)
    return KC_NOT_FOUND;
  if (rc || kcs_blob_meta_read(&v, bm))
    return kcs_mdb_err(rc ? rc : MDB_CORRUPTED, "blob metadata", NULL);
  return KC_OK;
}

kc_err kc_store_blob_has(kc_store *s, const char *digest, uint64_t *size) {
  if (check_digest(digest, NULL))
    return KC_BAD_DIGEST;
  kc_store_read *r;
  kc_err e = kc_store_read_begin(s, &r);
  if (e)
    return e;
  kcs_blob_meta bm;
  e = get_meta(r->txn, s, digest, &bm);
  if (!e && size)
    *size = bm.size;
  kc_store_read_end(r);
  return e;
}

kc_err kcs_blob_check(MDB_txn *txn, kc_store *s, const char *digest,
                      char *err) {
  MDB_val k = kcs_hex_val(digest), v;
  int rc = mdb_get(txn, s->blobs, &k, &v);
  if (rc == MDB_NOTFOUND)
    return KC_NOT_FOUND;
  if (rc)
    return kcs_mdb_err(rc, "reading a blob", err);
  char got[KC_HEX_LEN + 1];
  kcs_blob_meta bm;
  kc_err e = get_meta(txn, s, digest, &bm);
  if (!e && bm.enc == KC_STORE_ZSTD) { /* the content is what is hashed */
    char why[KC_ERRBUF_SIZE] = "";
    e = kcs_zstd_hash(v.mv_data, v.mv_size, bm.size, got, why);
    if (e == KC_CORRUPT)
      return kc_errf(err, e,
                     "the held copy of blob %s does not decompress: "
                     "%s",
                     digest, why);
  } else {
    e = kc_sha256_hex(v.mv_data, v.mv_size, got);
  }
  if (e)
    return kc_errf(err, e, "hashing blob %s", digest);
  if (strcmp(got, digest) != 0)
    return kc_errf(err, KC_CORRUPT, "the held copy of blob %s hashes to %s",
                   digest, got);
  return KC_OK;
}

kc_err kc_store_blob_check(kc_store *s, const char *digest, char *err) {
  kc_err e = check_digest(digest, err);
  kc_store_read *r = NULL;
  if (!e && (e = kc_store_read_begin(s, &r)))
    kc_errf(err, e, "cannot begin a read of the store");
  if (!e)
    e = kcs_blob_check(r->txn, s, digest, err);
  kc_store_read_end(r);
  return e;
}

kc_err kc_store_blob_get_stored(kc_store_read *r, const char *digest,
                                const void **data, size_t *len,
                                kc_store_enc *enc, uint64_t *size) {
  if (check_digest(digest, NULL))
    return KC_BAD_DIGEST;
  MDB_val k = kcs_hex_val(digest), v;
  int rc = mdb_get(r->txn, r->s->blobs, &k, &v);
  if (rc == MDB_NOTFOUND)
    return KC_NOT_FOUND;
  if (rc)
    return kcs_mdb_err(rc, "reading a blob", NULL);
  *data = v.mv_data;
  *len = v.mv_size;
  *enc = KC_STORE_RAW;
  if (size)
    *size = v.mv_size;
  /* Only a value that begins as a frame can be one: a raw blob's read pays
   * four bytes' comparison, not a second lookup. */
  if (!kcs_zstd_magic(v.mv_data, v.mv_size))
    return KC_OK;
  kcs_blob_meta bm;
  kc_err e = get_meta(r->txn, r->s, digest, &bm);
  if (e)
    return e == KC_NOT_FOUND ? kcs_mdb_err(MDB_CORRUPTED, "blob metadata", NULL)
                             : e;
  *enc = (kc_store_enc)bm.enc;
  if (size)
    *size = bm.size;
  return KC_OK;
}

kc_err kc_store_blob_get(kc_store_read *r, const char *digest,
                         const void **data, size_t *len) {
  kc_store_enc enc;
  kc_err e = kc_store_blob_get_stored(r, digest, data, len, &enc, NULL);
  return !e && enc != KC_STORE_RAW ? KC_STORE_ENCODED : e;
}

/* ---- writing one blob ---- */

/* Where a blob's bytes come from: memory, or an fd (a file is read with
 * pread from `off`, so a retry after a full map can read it again). */
typedef struct blob_src {
  const char *digest;
  const void *mem;
  int fd;
  int seekable;
  off_t off;
  uint64_t len; /* bytes written into the map */
  uint64_t raw; /* the content's size (len unless enc != raw) */
  kc_store_enc enc;
  uint64_t zlen; /* decode: the frame's bytes at mem or fd */
  int decode;    /* the source is a zstd frame, stored decompressed */
  void *own;     /* a compressed copy made here: freed after the put */
  int own_fd;
  int verify;   /* hash while copying (fd sources not hashed yet) */
  int consumed; /* a pipe was read: it cannot be read again */
  int created;
  int from_tier; /* fetched from S3: not queued for it again */
  int repair;    /* may overwrite a held copy that fails its hash */
} blob_src;

static kc_err read_full(blob_src *src, unsigned char *dst, kc_sha256 *h,
                        char *err) {
  uint64_t done = 0;
  while (done < src->len) {
    size_t want =
        src->len - done > COPY_CHUNK ? COPY_CHUNK : (size_t)(src->len - done);
    ssize_t n = src->seekable
                    ? pread(src->fd, dst + done, want, src->off + (off_t)done)
                    : read(src->fd, dst + done, want);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return kc_errf(err, KC_IO,
                     "the blob's source ended after %llu of %llu "
                     "bytes%s%s",
                     (unsigned long long)done, (unsigned long long)src->len,
                     n < 0 ? ": " : "", n < 0 ? strerror(errno) : "");
    if (h)
      kc_sha256_update(h, dst + done, (size_t)n);
    done += (uint64_t)n;
  }
  return KC_OK;
}

static kc_err fill(blob_src *src, void *dst, char *err) {
  if (src->decode)
    return kcs_zstd_decode_into(src->mem, src->fd, src->zlen, dst, src->len,
                                err);
  if (src->mem) {
    memcpy(dst, src->mem, (size_t)src->len);
    return KC_OK;
  }
  if (src->consumed)
    return kc_errf(err, KC_STORE_FULL,
                   "the store was full and the blob's "
                   "stream cannot be read again");
  src->consumed = !src->seekable;
  kc_sha256 *h = src->verify ? kc_sha256_new() : NULL;
  if (src->verify && !h)
    return kc_errf(err, KC_NOMEM, "out of memory");
  char got[KC_HEX_LEN + 1];
  kc_err e = read_full(src, dst, h, err);
  if (!e && h && !kc_sha256_final(h, got) && strcmp(got, src->digest) != 0)
    e = kc_errf(err, KC_DIGEST_MISMATCH, "the content hashes to %s, not %s",
                got, src->digest);
  kc_sha256_free(h);
  return e;
}

/* The bytes into the space LMDB reserves for the value. */
static kc_err write_value(kc_store *s, MDB_txn *txn, blob_src *src, char *err) {
  MDB_val k = kcs_hex_val(src->digest), v = {(size_t)src->len, NULL};
  kc_err e = kcs_put(txn, s->blobs, &k, &v, MDB_RESERVE, err);
  return e ? e : fill(src, v.mv_data, err);
}

/* Written: queued for the durable tier (unless it came from there). */
static kc_err written(kc_store *s, MDB_txn *txn, blob_src *src, char *err) {
  kc_err e = KC_OK;
  if (!src->from_tier)
    e = kcs_queue_add(s, txn, KCS_Q_BLOB, src->digest, NULL, err);
  src->created = !e;
  return e;
}

/* The held copy is overwritten by the upload's bytes, verified against the
 * digest already: harmless if it was sound, a repair if it rotted. (Without
 * MDB_WRITEMAP LMDB writes new pages: readers keep the old snapshot.) */
static kc_err repair_op(kc_store *s, MDB_txn *txn, blob_src *src,
                        kcs_blob_meta *bm, char *err) {
  MDB_val k = kcs_hex_val(src->digest);
  kc_err e = write_value(s, txn, src, err);
  uint64_t old = kcs_blob_stored(bm), old_saved = bm->size - old;
  if (!e && (old != src->len || bm->size != src->raw ||
             bm->enc != (uint32_t)src->enc)) {
    bm->size = src->raw;
    bm->enc = src->enc;
    bm->stored = src->len;
    MDB_val mv = kcs_blob_meta_val(bm);
    if (!(e = kcs_put(txn, s->blobmeta, &k, &mv, 0, err)) &&
        !(e = kcs_bytes_add(txn, s, (int64_t)src->len - (int64_t)old, err)))
      e = kcs_saved_add(
          txn, s, (int64_t)(src->raw - src->len) - (int64_t)old_saved, err);
  }
  return e ? e : written(s, txn, src, err);
}

static kc_err put_op(kc_store *s, MDB_txn *txn, void *ud, char *err) {
  blob_src *src = ud;
  if (src->enc == KC_STORE_RAW)
    src->raw = src->len;
  kcs_blob_meta bm;
  kc_err e = get_meta(txn, s, src->digest, &bm);
  if (e == KC_OK && src->repair)
    return repair_op(s, txn, src, &bm, err);
  if (e != KC_NOT_FOUND) {
    src->created = 0; /* already held (or unreadable: e says) */
    return e;
  }
  if ((e = write_value(s, txn, src, err)))
    return e;
  int64_t now = kcs_now();
  bm = (kcs_blob_meta){src->raw, 0, now, now, src->len, src->enc, 0};
  MDB_val k = kcs_hex_val(src->digest), mv = kcs_blob_meta_val(&bm);
  unsigned char ok[8 + KC_HEX_LEN];
  kcs_time_key(ok, now, src->digest);
  MDB_val okv = {sizeof ok, ok}, empty = {0, ""};
  if ((e = kcs_put(txn, s->blobmeta, &k, &mv, 0, err)) ||
      (e = kcs_put(txn, s->orphans, &okv, &empty, 0, err)) ||
      (e = kcs_bytes_add(txn, s, (int64_t)src->len, err)) ||
      (e = kcs_saved_add(txn, s, (int64_t)(src->raw - src->len), err)))
    return e;
  return written(s, txn, src, err);
}

/* A raw source is compressed before the write transaction (the writer lock
 * is not held for it) and kept so when that halves it. An fd source
 * is hashed on the way when it was to be (verify). A pipe is not: it could
 * not be read again if the frame is not worth keeping. */
static kc_err maybe_compress(kc_store *s, blob_src *src, char *err) {
  int level = s->compress_level;
  if (level <= 0 || src->decode || src->enc != KC_STORE_RAW ||
      src->len < KCS_ZSTD_MIN || (!src->mem && !src->seekable))
    return KC_OK;
  size_t zlen = 0;
  if (src->mem) {
    kc_err e = kcs_zstd_compress(level, src->mem, (size_t)src->len, &src->own,
                                 &zlen, err);
    if (e || !src->own)
      return e;
    src->mem = src->own;
  } else {
    kc_sha256 *h = src->verify ? kc_sha256_new() : NULL;
    uint64_t n = 0;
    int fd = -1;
    char got[KC_HEX_LEN + 1];
    kc_err e = src->verify && !h
                   ? kc_errf(err, KC_NOMEM, "out of memory")
                   : kcs_zstd_compress_fd(s, level, src->fd, 1, src->off,
                                          src->len, h, &fd, &n, err);
    if (!e && h && !kc_sha256_final(h, got) && strcmp(got, src->digest))
      e = kc_errf(err, KC_DIGEST_MISMATCH, "the content hashes to %s, not %s",
                  got, src->digest);
    kc_sha256_free(h);
    if (!e && h)
      src->verify = 0; /* hashed just now */
    if (e || fd < 0) {
      if (fd >= 0)
        close(fd);
      return e;
    }
    src->fd = src->own_fd = fd;
    src->off = 0;
    zlen = (size_t)n;
  }
  src->raw = src->len;
  src->len = zlen;
  src->enc = KC_STORE_ZSTD;
  return KC_OK;
}

static void src_done(blob_src *src) {
  free(src->own);
  if (src->own_fd > 0)
    close(src->own_fd);
}

static kc_err put_checked(kc_store *s, blob_src *src, int *created, char *err);

static kc_err put_src(kc_store *s, blob_src *src, int *created, char *err) {
  if (created)
    *created = 0;
  kc_err e = check_digest(src->digest, err);
  if (e)
    return e;
  if (!src->repair && kc_store_blob_has(s, src->digest, NULL) == KC_OK) {
    if (!src->from_tier)
      kc_store_blob_touch(s, src->digest); /* its manifest is on its way */
    return KC_OK;
  }
  if (!(e = maybe_compress(s, src, err)))
    e = put_checked(s, src, created, err);
  src_done(src);
  return e;
}

static kc_err put_checked(kc_store *s, blob_src *src, int *created, char *err) {
  kc_err e;
  if (s->max_bytes && src->len > s->max_bytes)
    return kc_errf(err, KC_STORE_FULL,
                   "a blob of %llu bytes is larger than "
                   "the store's limit of %llu bytes",
                   (unsigned long long)src->len,
                   (unsigned long long)s->max_bytes);
  /* a repair takes the place of the held copy: no room to make */
  if (!src->repair && (e = kcs_maybe_evict(s, src->len, err)))
    return e;
  /* A client's upload is offered too: its manifest comes last, and a RESP
   * key of the same bytes deleted or evicted meanwhile must not free it
   * (kv_unref, kcs_blob_unref ask kcs_blob_touched). Marked before the
   * commit, so no moment is left between them; until a manifest references
   * it (bundle.c): then eviction frees it at once again. */
  if (!src->from_tier && !src->repair)
    kcs_uses_record(&s->fresh, src->digest, kcs_now());
  e = kcs_write(s, put_op, src, err);
  if (!e && src->repair)
    kc_store_blob_touch(s, src->digest); /* an orphan's window starts anew */
  if (!e && src->created && !src->from_tier)
    kcs_tier_kick(s);
  if (!e && created)
    *created = src->created;
  return e;
}

kc_err kc_store_blob_put(kc_store *s, const char *digest, const void *data,
                         size_t len, int *created, char *err) {
  char got[KC_HEX_LEN + 1];
  kc_err e = check_digest(digest, err);
  if (e)
    return e;
  /* Hash before the write transaction: the writer lock is not held for it. */
  if ((e = kc_sha256_hex(data, len, got)))
    return kc_errf(err, e, "hashing the blob");
  if (strcmp(got, digest) != 0)
    return kc_errf(err, KC_DIGEST_MISMATCH, "the content hashes to %s, not %s",
                   got, digest);
  blob_src src = {.digest = digest, .mem = len ? data : "", .len = len};
  return put_src(s, &src, created, err);
}

kc_err kc_store_blob_put_fd(kc_store *s, const char *digest, int fd,
                            uint64_t len, int *created, char *err) {
  off_t off = lseek(fd, 0, SEEK_CUR);
  blob_src src = {.digest = digest,
                  .fd = fd,
                  .seekable = off >= 0,
                  .off = off < 0 ? 0 : off,
                  .len = len,
                  .verify = 1};
  return put_src(s, &src, created, err);
}

/* ---- uploads in pieces ---- */

struct kc_store_upload {
  kc_store *s;
  kc_sha256 *h;
  unsigned char *buf; /* the first SPOOL_MEM bytes, until spilled */
  size_t len, cap;
  int fd;           /* the spool file once over SPOOL_MEM; -1 before */
  uint64_t size;    /* the content's bytes (hashed) */
  uint64_t spooled; /* bytes received (== size unless zstd) */
  /* kc_store_upload_zstd: the body is a frame, decoded as it arrives */
  ZSTD_DCtx *dc;
  unsigned char *zout;
  uint64_t max_out;
  size_t zleft;          /* the decoder's last hint: 0 at the end of a frame */
  uint64_t zcharged;     /* of the process's decoder budget (zstd.c) */
  unsigned char head[4]; /* the first bytes received (the frame's magic) */
  int from_tier;
  int verified; /* kcs_upload_verify passed: commit does not hash again */
  int repair;   /* kc_store_upload_repair */
};

void kcs_upload_from_tier(kc_store_upload *u) { u->from_tier = 1; }

void kc_store_upload_repair(kc_store_upload *u) { u->repair = 1; }

kc_err kc_store_upload_begin(kc_store *s, kc_store_upload **out, char *err) {
  kc_store_upload *u = calloc(1, sizeof *u);
  if (!u || !(u->h = kc_sha256_new())) {
    free(u);
    return kc_errf(err, KC_NOMEM, "out of memory");
  }
  u->s = s;
  u->fd = -1;
  *out = u;
  return KC_OK;
}

/* The spool file is unlinked from birth (O_TMPFILE): a crash leaves nothing. */
static kc_err spill(kc_store_upload *u, char *err) {
  u->fd = open(u->s->dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (u->fd < 0)
    return kcs_disk_err(u->s, errno, "making a spool file", err);
  size_t done = 0;
  while (done < u->len) {
    ssize_t n = write(u->fd, u->buf + done, u->len - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return kcs_disk_err(u->s, errno, "spooling an upload", err);
    done += (size_t)n;
  }
  free(u->buf);
  u->buf = NULL;
  u->cap = 0;
  return KC_OK;
}

static kc_err spool_write(kc_store_upload *u, const void *data, size_t len,
                          char *err) {
  const char *p = data;
  while (len) {
    ssize_t n = write(u->fd, p, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return kcs_disk_err(u->s, errno, "spooling an upload", err);
    p += n;
    len -= (size_t)n;
  }
  return KC_OK;
}

/* Doubling from 16 KiB: a small blob's buffer comes from the heap, not from
 * an mmap and its page faults per upload (SPOOL_MEM is over malloc's mmap
 * threshold). */
static int grow(kc_store_upload *u, size_t need) {
  size_t cap = u->cap ? u->cap : 16384;
  while (cap < need)
    cap *= 2;
  if (cap > SPOOL_MEM)
    cap = SPOOL_MEM;
  unsigned char *b = realloc(u->buf, cap);
  if (!b)
    return -1;
  u->buf = b;
  u->cap = cap;
  return 0;
}

void kc_store_upload_zstd(kc_store_upload *u, uint64_t max_out) {
  u->dc = kcs_zstd_dctx(KCS_ZSTD_WLOG_MAX);
  u->zout = malloc(128 * 1024);
  u->max_out = max_out;
  u->zleft = 1; /* nothing yet: a frame is due */
}

/* What the decoder holds (its window once the frame's header came) is
 * taken out of the process's decoder budget as it grows. */
static kc_err zstd_charge(kc_store_upload *u, char *err) {
  size_t have = ZSTD_sizeof_DCtx(u->dc);
  if (have <= u->zcharged)
    return KC_OK;
  if (kcs_zstd_charge(have - u->zcharged))
    return kc_errf(err, KC_BUSY,
                   "too many zstd bodies and reads are being "
                   "decoded at once: try again shortly");
  u->zcharged = have;
  return KC_OK;
}

/* Decodes one piece of the body, hashing what comes out. */
static kc_err zstd_take(kc_store_upload *u, const void *data, size_t len,
                        char *err) {
  kc_err e;
  if (!u->dc || !u->zout)
    return kc_errf(err, KC_NOMEM, "out of memory");
  ZSTD_inBuffer in = {data, len, 0};
  while (in.pos < in.size) {
    ZSTD_outBuffer ob = {u->zout, 128 * 1024, 0};
    size_t r = ZSTD_decompressStream(u->dc, &ob, &in);
    if (ZSTD_isError(r) &&
        ZSTD_getErrorCode(r) == ZSTD_error_frameParameter_windowTooLarge)
      return kc_errf(err, KC_EINVAL,
                     "the zstd body needs a decoding window "
                     "of more than %u MiB: compress it with a smaller window "
                     "(zstd -19 or lower, no --long or --ultra)",
                     1u << (KCS_ZSTD_WLOG_MAX - 20));
    if (ZSTD_isError(r))
      return kc_errf(err, KC_EINVAL,
                     "the body is not a valid zstd stream "
                     "(Content-Encoding: zstd): %s",
                     ZSTD_getErrorName(r));
    if ((e = zstd_charge(u, err)))
      return e;
    u->zleft = r;
    if ((u->size += ob.pos) > u->max_out)
      return kc_errf(err, KC_TOO_LARGE,
                     "the zstd body decompresses to more "
                     "than the limit of %llu bytes",
                     (unsigned long long)u->max_out);
    if ((e = kc_sha256_update(u->h, u->zout, ob.pos)))
      return kc_errf(err, e, "hashing an upload");
  }
  return KC_OK;
}

static void keep_head(kc_store_upload *u, const void *data, size_t len) {
  for (size_t i = 0; i < len && u->spooled + i < sizeof u->head; i++)
    u->head[u->spooled + i] = ((const unsigned char *)data)[i];
}

kc_err kc_store_upload_write(kc_store_upload *u, const void *data, size_t len,
                             char *err) {
  kc_err e = u->max_out ? zstd_take(u, data, len, err)
                        : kc_sha256_update(u->h, data, len);
  if (e)
    return u->max_out ? e : kc_errf(err, e, "hashing an upload");
  if (!u->max_out)
    u->size += len;
  keep_head(u, data, len);
  u->spooled += len;
  if (len == 0) /* memcpy's pointers must be valid even for 0 bytes */
    return KC_OK;
  if (u->fd < 0 && u->len + len <= SPOOL_MEM) {
    if (u->len + len > u->cap && grow(u, u->len + len))
      return kc_errf(err, KC_NOMEM, "out of memory");
    memcpy(u->buf + u->len, data, len);
    u->len += len;
    return KC_OK;
  }
  if (u->fd < 0 && (e = spill(u, err)))
    return e;
  return spool_write(u, data, len, err);
}

int kcs_upload_frame(const kc_store_upload *u, uint64_t *zlen) {
  *zlen = u->max_out ? u->spooled : 0;
  return u->max_out != 0;
}

uint64_t kc_store_upload_size(const kc_store_upload *u) {
  return u ? u->size : 0;
}

/* The upload's bytes when they are all in memory, else NULL. */
static const void *upload_mem(const kc_store_upload *u) {
  return u->fd >= 0 ? NULL : u->buf ? (const void *)u->buf : "";
}

kc_err kcs_upload_verify(kc_store_upload *u, const char *digest,
                         const void **mem, char *err) {
  char got[KC_HEX_LEN + 1];
  kc_err e = check_digest(digest, err);
  if (!e && u->max_out && u->zleft)
    e = kc_errf(err, KC_EINVAL,
                "the zstd body ends inside a frame "
                "(truncated after %llu bytes)",
                (unsigned long long)u->spooled);
  if (!e && (e = kc_sha256_final(u->h, got)))
    kc_errf(err, e, "hashing an upload");
  if (!e && strcmp(got, digest) != 0)
    e = kc_errf(err, KC_DIGEST_MISMATCH, "the content hashes to %s, not %s",
                got, digest);
  u->verified = !e;
  if (mem)
    *mem = upload_mem(u);
  return e;
}

/* A frame received is kept as it came when the store compresses and it
 * halves it (and begins as a frame: reads tell a held frame by its
 * magic); else the content goes into the map decompressed. */
static blob_src upload_src(kc_store_upload *u, const char *digest) {
  blob_src src = {.digest = digest,
                  .mem = upload_mem(u),
                  .fd = u->fd,
                  .seekable = 1,
                  .len = u->size,
                  .from_tier = u->from_tier,
                  .repair = u->repair};
  if (!u->max_out)
    return src;
  if (u->s->compress_level > 0 && u->size >= KCS_ZSTD_MIN &&
      kcs_zstd_magic(u->head, u->spooled) &&
      kcs_zstd_worth(u->size, u->spooled)) {
    src.enc = KC_STORE_ZSTD;
    src.raw = u->size;
    src.len = u->spooled;
  } else {
    src.decode = 1;
    src.zlen = u->spooled;
  }
  return src;
}

kc_err kc_store_upload_commit(kc_store_upload *u, const char *digest,
                              int *created, char *err) {
  kc_err e = u->verified ? KC_OK : kcs_upload_verify(u, digest, NULL, err);
  if (!e) {
    /* Hashed as it arrived: copied into the map without hashing again. */
    blob_src src = upload_src(u, digest);
    e = put_src(u->s, &src, created, err);
  }
  kc_store_upload_abort(u);
  return e;
}

typedef struct batch {
  blob_src *src;
  size_t n;
} batch;

static kc_err batch_op(kc_store *s, MDB_txn *txn, void *ud, char *err) {
  batch *b = ud;
  for (size_t i = 0; i < b->n; i++) {
    kc_err e = put_op(s, txn, &b->src[i], err);
    if (e)
      return e;
  }
  return KC_OK;
}

kc_err kcs_upload_commit_batch(kc_store *s, kc_store_upload *const *u,
                               const char *const *digests, size_t n,
                               char *err) {
  batch b = {calloc(n ? n : 1, sizeof *b.src), n};
  uint64_t total = 0;
  kc_err e = b.src ? KC_OK : kc_errf(err, KC_NOMEM, "out of memory");
  for (size_t i = 0; !e && i < n; i++) {
    if (!u[i]->verified || u[i]->fd >= 0)
      e = kc_errf(err, KC_EINVAL, "a batch takes verified in-memory uploads");
    b.src[i] = upload_src(u[i], digests[i]);
    b.src[i].from_tier = 1;
    total += b.src[i].len;
  }
  if (!e)
    e = kcs_maybe_evict(s, total, err);
  if (!e)
    e = kcs_write(s, batch_op, &b, err);
  free(b.src);
  for (size_t i = 0; i < n; i++)
    kc_store_upload_abort(u[i]);
  return e;
}

void kc_store_upload_abort(kc_store_upload *u) {
  if (!u)
    return;
  if (u->fd >= 0)
    close(u->fd);
  ZSTD_freeDCtx(u->dc);
  kcs_zstd_release(u->zcharged);
  free(u->zout);
  kc_sha256_free(u->h);
  free(u->buf);
  free(u);
}

/* ---- references ---- */

int kcs_blob_touched(kc_store *s, const char *digest, int64_t now) {
  return kcs_uses_last(&s->touched, digest) > now - KCS_UPLOAD_WINDOW_S ||
         kcs_uses_last(&s->fresh, digest) > now - KCS_UPLOAD_WINDOW_S;
}

/* An orphan offered again starts its upload window and grace anew. */
static kc_err retouch_op(kc_store *s, MDB_txn *txn, void *ud, char *err);

kc_err kcs_blob_retouch(kc_store *s, MDB_txn *txn, const char *digest,
                        char *err) {
  return retouch_op(s, txn, (void *)digest, err);
}

static kc_err retouch_op(kc_store *s, MDB_txn *txn, void *ud, char *err) {
  const char *digest = ud;
  kcs_blob_meta bm;
  kc_err e = get_meta(txn, s, digest, &bm);
  if (e || bm.refs > 0)
    return e == KC_NOT_FOUND ? KC_OK : e;
  unsigned char old[8 + KC_HEX_LEN], neu[8 + KC_HEX_LEN];
  kcs_time_key(old, bm.orphan_since, digest);
  bm.orphan_since = kcs_now();
  kcs_time_key(neu, bm.orphan_since, digest);
  MDB_val ov = {sizeof old, old}, nv = {sizeof neu, neu}, empty = {0, ""};
  MDB_val k = kcs_hex_val(digest), v = kcs_blob_meta_val(&bm);
  if ((e = kcs_del(txn, s->orphans, &ov, err)) ||
      (e = kcs_put(txn, s->orphans, &nv, &empty, 0, err)))
    return e;
  return kcs_put(txn, s->blobmeta, &k, &v, 0, err);
}

typedef struct touch {
  const char *digest;
  int retouch, requeue;
} touch;

static kc_err touch_op(kc_store *s, MDB_txn *txn, void *ud, char *err) {
  const touch *t = ud;
  kc_err e = t->retouch ? retouch_op(s, txn, (void *)t->digest, err) : KC_OK;
  if (!e && t->requeue)
    e = kcs_queue_add(s, txn, KCS_Q_BLOB, t->digest, NULL, err);
  return e;
}

void kc_store_blob_touch(kc_store *s, const char *digest) {
  if (check_digest(digest, NULL))
    return;
  int64_t now = kcs_now();
  int offered = kcs_blob_touched(s, digest, now); /* within the window */
  kcs_uses_record(&s->touched, digest, now);
  kcs_blob_meta bm = {0};
  kc_store_read *r;
  if (kc_store_read_begin(s, &r))
    return;
  kc_err e = get_meta(r->txn, s, digest, &bm);
  kc_store_read_end(r);
  /* Both rare, so one write is affordable: an unreferenced blob offered
   * again; and, once per upload window, a blob offered because a reader
   * missed it, which the bucket should hold too (If-None-Match makes that
   * one cheap request when it does). Not a write per duplicate PUT. */
  touch t = {digest, !e && bm.refs == 0 && bm.orphan_since < now - 60,
             !e && s->tier && !offered};
  if ((t.retouch || t.requeue) && kcs_write(s, touch_op, &t, NULL) == KC_OK &&
      t.requeue)
    kcs_tier_kick(s);
}

kc_err kcs_blob_drop(kc_store *s, MDB_txn *txn, const char *digest,
                     const kcs_blob_meta *bm, char *err) {
  MDB_val k = kcs_hex_val(digest);
  unsigned char ok[8 + KC_HEX_LEN];
  kcs_time_key(ok, bm->orphan_since, digest);
  MDB_val okv = {sizeof ok, ok};
  kc_err e;
  if ((e = kcs_del(txn, s->blobs, &k, err)) ||
      (e = kcs_del(txn, s->blobmeta, &k, err)) ||
      (bm->refs == 0 && (e = kcs_del(txn, s->orphans, &okv, err))))
    return e;
  uint64_t stored = kcs_blob_stored(bm);
  if ((e = kcs_saved_add(txn, s, -(int64_t)(bm->size - stored), err)))
    return e;
  return kcs_bytes_add(txn, s, -(int64_t)stored, err);
}

kc_err kcs_blob_remove(kc_store *s, MDB_txn *txn, const char *digest,
                       char *err) {
  kcs_blob_meta bm;
  kc_err e = get_meta(txn, s, digest, &bm);
  if (e == KC_NOT_FOUND)
    return KC_OK;
  if (e)
    return kc_errf(err, e, "blob %s: unreadable metadata", digest);
  return kcs_blob_drop(s, txn, digest, &bm, err);
}

kc_err kcs_blob_unref(kc_store *s, MDB_txn *txn, const char *digest,
                      int64_t now, int drop_now, char *err) {
  kcs_blob_meta bm;
  kc_err e = get_meta(txn, s, digest, &bm);
  if (e == KC_NOT_FOUND)
    return KC_OK; /* nothing to release */
  if (e)
    return kc_errf(err, e, "blob %s: unreadable metadata", digest);
  /* Eviction frees the bytes at once, unless a client just offered the blob
   * for a manifest still to come: that one becomes an orphan instead. */
  if (drop_now && bm.refs <= 1 && !kcs_blob_touched(s, digest, now)) {
    if (!(e = kcs_blob_drop(s, txn, digest, &bm, err)))
      s->txn_evicted_blobs++; /* counted if the transaction commits */
    return e;
  }
  if (bm.refs == 0)
    return KC_OK; /* an orphan already */
  MDB_val k = kcs_hex_val(digest), v = kcs_blob_meta_val(&bm);
  if (--bm.refs == 0) { /* an orphan from now: gc collects it after grace */
    bm.orphan_since = now;
    unsigned char ok[8 + KC_HEX_LEN];
    kcs_time_key(ok, now, digest);
    MDB_val okv = {sizeof ok, ok}, empty = {0, ""};
    if ((e = kcs_put(txn, s->orphans, &okv, &empty, 0, err)))
      return e;
  }
  return kcs_put(txn, s->blobmeta, &k, &v, 0, err);
}

kc_err kcs_blob_ref(kc_store *s, MDB_txn *txn, const char *digest, char *err) {
  kcs_blob_meta bm;
  kc_err e = get_meta(txn, s, digest, &bm);
  if (e)
    return e;
  if (bm.refs == 0) {
    unsigned char ok[8 + KC_HEX_LEN];
    kcs_time_key(ok, bm.orphan_since, digest);
    MDB_val okv = {sizeof ok, ok};
    if ((e = kcs_del(txn, s->orphans, &okv, err)))
      return e;
  }
  bm.refs++;
  MDB_val k = kcs_hex_val(digest), v = kcs_blob_meta_val(&bm);
  return kcs_put(txn, s->blobmeta, &k, &v, 0, err);
}
