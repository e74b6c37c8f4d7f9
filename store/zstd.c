/* zstd.c: blobs held zstd-compressed. A blob is still named by
 * the SHA-256 of its content; its blobmeta record says how its bytes are
 * held (a raw blob keeps the short record stores always had). Compression,
 * whole-frame decoding (verify, scrub, a PUT's frame stored raw), the
 * "zstd_saved" counter behind stats' bytes_raw, and blobs read piece by
 * piece, decompressed on the way, with one short read per piece. libzstd
 * does every byte of the coding. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define ZSTD_STATIC_LINKING_ONLY /* ZSTD_estimateDStreamSize_fromFrame */
#include <zstd.h>
#include <zstd_errors.h>

#include "store_internal.h"

#define IO_CHUNK (128 * 1024)

/* ---- metadata ---- */

int kcs_blob_meta_read(const MDB_val *v, kcs_blob_meta *bm) {
  memset(bm, 0, sizeof *bm);
  if (v->mv_size != KCS_BLOB_META_RAW && v->mv_size != KCS_BLOB_META_ZSTD)
    return -1;
  memcpy(bm, v->mv_data, v->mv_size);
  if (v->mv_size == KCS_BLOB_META_RAW || bm->enc == KC_STORE_RAW) {
    bm->enc = KC_STORE_RAW;
    bm->stored = bm->size;
  }
  return 0;
}

MDB_val kcs_blob_meta_val(kcs_blob_meta *bm) {
  MDB_val v = {bm->enc == KC_STORE_RAW ? KCS_BLOB_META_RAW : KCS_BLOB_META_ZSTD,
               bm};
  return v;
}

uint64_t kcs_blob_stored(const kcs_blob_meta *bm) {
  return bm->enc == KC_STORE_RAW ? bm->size : bm->stored;
}

static MDB_val saved_name(void) {
  MDB_val k = {10, (void *)"zstd_saved"};
  return k;
}

kc_err kcs_saved_get(MDB_txn *txn, kc_store *s, uint64_t *out) {
  MDB_val k = saved_name(), v;
  int rc = mdb_get(txn, s->meta, &k, &v);
  *out = 0;
  if (rc == MDB_NOTFOUND)
    return KC_OK;
  if (rc || v.mv_size != sizeof *out)
    return kcs_mdb_err(rc ? rc : MDB_CORRUPTED, "reading zstd_saved", NULL);
  memcpy(out, v.mv_data, sizeof *out);
  return KC_OK;
}

kc_err kcs_saved_add(MDB_txn *txn, kc_store *s, int64_t delta, char *err) {
  uint64_t n;
  kc_err e = kcs_saved_get(txn, s, &n);
  if (e || delta == 0)
    return e;
  n = delta < 0 && (uint64_t)-delta > n ? 0 : n + (uint64_t)delta;
  MDB_val k = saved_name(), v = {sizeof n, &n};
  return kcs_put(txn, s->meta, &k, &v, 0, err);
}

/* ---- compression ---- */

/* Kept compressed only when the frame is at most half the content. A frame
 * that saves less is mostly literals (entropy coding only: redis-benchmark's
 * random letters save a quarter, machine code a third at most), and those
 * decode at 10-20 instructions a byte on every read that is not sent the
 * frame, where a copy costs 0.1: see DESIGN.md, "Blobs at rest and on the
 * wire: zstd". */
uint64_t kcs_zstd_keep_max(uint64_t raw) { return raw / 2; }

int kcs_zstd_worth(uint64_t raw, uint64_t z) {
  return z <= kcs_zstd_keep_max(raw);
}

int kcs_zstd_magic(const void *p, size_t n) {
  static const unsigned char m[4] = {0x28, 0xb5, 0x2f, 0xfd};
  return n >= 4 && memcmp(p, m, 4) == 0;
}

/* The level, and its window capped at KCS_ZSTD_WLOG_MAX (levels 20-22
 * ask for up to 2^27 for large inputs): every frame written here decodes
 * within a bounded decoder's window. */
static size_t set_level(ZSTD_CCtx *cc, int level, uint64_t len) {
  size_t r = ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, level);
  if (!ZSTD_isError(r) &&
      ZSTD_getCParams(level, len, 0).windowLog > KCS_ZSTD_WLOG_MAX)
    r = ZSTD_CCtx_setParameter(cc, ZSTD_c_windowLog, KCS_ZSTD_WLOG_MAX);
  return r;
}

kc_err kcs_zstd_compress(int level, const void *src, size_t len, void **out,
                         size_t *outlen, char *err) {
  *out = NULL;
  *outlen = 0;
  if (level <= 0 || len < KCS_ZSTD_MIN)
    return KC_OK;
  /* Room for a frame worth keeping only: libzstd stops as soon as one
   * does not fit. */
  size_t cap = (size_t)kcs_zstd_keep_max(len);
  void *buf = malloc(cap);
  if (!buf)
    return kc_errf(err, KC_NOMEM, "out of memory");
  ZSTD_CCtx *cc = ZSTD_createCCtx();
  size_t n = cc ? set_level(cc, level, len) : 0;
  if (cc && !ZSTD_isError(n))
    n = ZSTD_compress2(cc, buf, cap, src, len);
  ZSTD_freeCCtx(cc);
  if (!cc) {
    free(buf);
    return kc_errf(err, KC_NOMEM, "out of memory");
  }
  if (ZSTD_isError(n)) {
    free(buf);
    return KC_OK; /* dstSize_tooSmall: incompressible */
  }
  *out = buf;
  *outlen = n;
  return KC_OK;
}

static ssize_t read_at(int fd, int seekable, off_t off, void *buf, size_t n) {
  for (;;) {
    ssize_t r = seekable ? pread(fd, buf, n, off) : read(fd, buf, n);
    if (r >= 0 || errno != EINTR)
      return r;
  }
}

static kc_err write_all(kc_store *s, int fd, const void *p, size_t n,
                        char *err) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0)
      return kcs_disk_err(s, errno, "spooling a compressed blob", err);
    c += w;
    n -= (size_t)w;
  }
  return KC_OK;
}

typedef struct zfd {
  kc_store *s;
  ZSTD_CCtx *cc;
  int out;
  uint64_t outlen, cap;
  unsigned char *in, *obuf;
} zfd;

/* Feeds one piece (end: the last) and spools what comes out; 1 when the
 * output outgrew what is worth keeping. */
static int zfd_feed(zfd *z, const void *p, size_t n, int end, kc_err *e,
                    char *err) {
  ZSTD_inBuffer in = {p, n, 0};
  size_t left;
  do {
    ZSTD_outBuffer ob = {z->obuf, IO_CHUNK, 0};
    left = ZSTD_compressStream2(z->cc, &ob, &in,
                                end ? ZSTD_e_end : ZSTD_e_continue);
    if (ZSTD_isError(left)) {
      *e = kc_errf(err, KC_INTERNAL, "zstd: %s", ZSTD_getErrorName(left));
      return 0;
    }
    z->outlen += ob.pos;
    if (z->outlen > z->cap)
      return 1;
    if ((*e = write_all(z->s, z->out, z->obuf, ob.pos, err)))
      return 0;
  } while (in.pos < in.size || (end && left));
  return 0;
}

kc_err kcs_zstd_compress_fd(kc_store *s, int level, int fd, int seekable,
                            off_t off, uint64_t len, kc_sha256 *h, int *outfd,
                            uint64_t *outlen, char *err) {
  *outfd = -1;
  zfd z = {s,
           ZSTD_createCCtx(),
           -1,
           0,
           kcs_zstd_keep_max(len),
           malloc(IO_CHUNK),
           malloc(IO_CHUNK)};
  kc_err e =
      z.cc && z.in && z.obuf ? KC_OK : kc_errf(err, KC_NOMEM, "out of memory");
  if (!e && (z.out = open(s->dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600)) < 0)
    e = kcs_disk_err(s, errno, "making a spool file", err);
  if (!e) {
    set_level(z.cc, level, len);
    ZSTD_CCtx_setPledgedSrcSize(z.cc, len);
  }
  int over = 0;
  for (uint64_t done = 0; !e && !over && done < len;) {
    size_t want = len - done > IO_CHUNK ? IO_CHUNK : (size_t)(len - done);
    ssize_t n = read_at(fd, seekable, off + (off_t)done, z.in, want);
    if (n <= 0) {
      e = kc_errf(err, KC_IO,
                  "the blob's source ended after %llu of %llu "
                  "bytes",
                  (unsigned long long)done, (unsigned long long)len);
      break;
    }
    done += (uint64_t)n;
    if (h)
      kc_sha256_update(h, z.in, (size_t)n);
    over = zfd_feed(&z, z.in, (size_t)n, done == len, &e, err);
  }
  ZSTD_freeCCtx(z.cc);
  free(z.in);
  free(z.obuf);
  if (e || over) {
    if (z.out >= 0)
      close(z.out);
    return e;
  }
  *outfd = z.out;
  *outlen = z.outlen;
  return KC_OK;
}

/* ---- decoding ---- */

/* Decoder memory, process-wide. Every streaming decoder is made with
 * ZSTD_d_windowLogMax KCS_ZSTD_WLOG_MAX (a frame asking for more is refused
 * before a byte of window is allocated), and the decoders that live as long
 * as a client (a GET decoded on the way, a PUT of a frame) take their
 * buffers out of one budget of KCS_ZSTD_DECODE_BUDGET bytes: a reader
 * beyond it gets KC_BUSY (503 and Retry-After), never more memory. Whole
 * frames decoded into a buffer the caller holds (RESP GET, a frame stored
 * raw) need no window at all: libzstd's single pass reads back from the
 * output itself. */
static _Atomic uint64_t decode_used;

int kcs_zstd_charge(uint64_t n) {
  uint64_t cur = atomic_load(&decode_used);
  do {
    if (n > KCS_ZSTD_DECODE_BUDGET || cur > KCS_ZSTD_DECODE_BUDGET - n)
      return -1;
  } while (!atomic_compare_exchange_weak(&decode_used, &cur, cur + n));
  return 0;
}

void kcs_zstd_release(uint64_t n) { atomic_fetch_sub(&decode_used, n); }

uint64_t kc_store_zstd_decode_memory(void) { return atomic_load(&decode_used); }

ZSTD_DCtx *kcs_zstd_dctx(unsigned wlog_max) {
  ZSTD_DCtx *dc = ZSTD_createDCtx();
  if (dc && ZSTD_isError(ZSTD_DCtx_setParameter(dc, ZSTD_d_windowLogMax,
                                                (int)wlog_max))) {
    ZSTD_freeDCtx(dc);
    dc = NULL;
  }
  return dc;
}

/* One decoding context per thread for single-pass decodes, made on the
 * thread's first and freed when it exits: making one costs more than
 * decoding a 4 KiB value (a RESP GET paid ~10 us for it). Single pass
 * allocates nothing in it beyond its fixed tables. */
static pthread_key_t dc_key;
static pthread_once_t dc_once = PTHREAD_ONCE_INIT;
static _Thread_local ZSTD_DCtx *dc_mine;

static void dc_gone(void *dc) { ZSTD_freeDCtx(dc); }
static void dc_key_make(void) { pthread_key_create(&dc_key, dc_gone); }

static ZSTD_DCtx *thread_dctx(void) {
  if (dc_mine)
    return dc_mine;
  pthread_once(&dc_once, dc_key_make);
  ZSTD_DCtx *dc = kcs_zstd_dctx(KCS_ZSTD_WLOG_MAX);
  if (dc && pthread_setspecific(dc_key, dc)) {
    ZSTD_freeDCtx(dc);
    return NULL;
  }
  return dc_mine = dc;
}

/* The whole frame at z into dst, which holds exactly raw bytes. */
static kc_err decode_flat(const void *z, size_t zlen, void *dst, size_t raw,
                          char *err) {
  ZSTD_DCtx *dc = thread_dctx();
  if (!dc)
    return kc_errf(err, KC_NOMEM, "out of memory");
  if (zlen == 0)
    return kc_errf(err, KC_CORRUPT, "the frame is empty");
  size_t n = ZSTD_decompressDCtx(dc, dst, raw, z, zlen);
  if (ZSTD_isError(n) && ZSTD_getErrorCode(n) == ZSTD_error_dstSize_tooSmall)
    return kc_errf(err, KC_CORRUPT,
                   "the frame decompresses to more than "
                   "%llu bytes",
                   (unsigned long long)raw);
  if (ZSTD_isError(n))
    return kc_errf(err, KC_CORRUPT, "zstd: %s", ZSTD_getErrorName(n));
  if (n != raw)
    return kc_errf(err, KC_CORRUPT,
                   "the frame decompresses to another size "
                   "(%llu of %llu bytes)",
                   (unsigned long long)n, (unsigned long long)raw);
  return KC_OK;
}

/* Decodes the stored frame, chunk by chunk of input, calling sink on each
 * piece of output; KC_CORRUPT when it is not one complete frame (or frames)
 * of exactly raw bytes. A frame in memory of up to FLAT_MAX bytes of
 * content is decoded in a single pass into a buffer of its size and given
 * to the sink at once; the rest stream through a decoder and one buffer of
 * IO_CHUNK, whatever their size. */
typedef kc_err (*zsink)(void *ud, const void *p, size_t n);

#define FLAT_MAX (1024 * 1024)

/* What a streaming decoder needs for the frames at z: the largest window
 * (log2, at least KCS_ZSTD_WLOG_MAX) and the memory it will allocate for
 * it. Frames that do not parse leave both as they are (the decoder reports
 * them as it meets them). */
static void frames_need(const void *z, size_t zlen, unsigned *wlog,
                        uint64_t *need) {
  const char *p = z;
  *wlog = KCS_ZSTD_WLOG_MAX;
  *need = 0;
  while (zlen) {
    ZSTD_frameHeader fh;
    size_t fl = ZSTD_findFrameCompressedSize(p, zlen);
    if (ZSTD_isError(fl) || fl > zlen || ZSTD_getFrameHeader(&fh, p, fl))
      return;
    if (fh.frameType == ZSTD_frame) {
      size_t buf =
          ZSTD_decodingBufferSize_min(fh.windowSize, fh.frameContentSize);
      uint64_t n = ZSTD_isError(buf) ? UINT64_MAX
                                     : (uint64_t)ZSTD_estimateDCtxSize() +
                                           ZSTD_BLOCKSIZE_MAX + buf;
      if (n > *need)
        *need = n;
      while (*wlog < ZSTD_WINDOWLOG_MAX &&
             fh.windowSize > ((uint64_t)1 << *wlog))
        (*wlog)++;
    }
    p += fl;
    zlen -= fl;
  }
}

/* The decoder for the frames in memory at z (fd: a PUT's spooled frame,
 * already held to the bound). A frame stored before the window was bounded
 * gets the window it asks for, its memory taken from the decoder budget as
 * a stream's is: beyond it the frame is not verified now (KC_BUSY), rather
 * than decoded whole into a buffer of its content's size (gigabytes, for a
 * blob that large). *charged: what to give back. */
static kc_err walk_decoder(const void *z, size_t zlen, ZSTD_DCtx **dc,
                           uint64_t *charged, char *err) {
  unsigned wlog = KCS_ZSTD_WLOG_MAX;
  uint64_t need = 0;
  *charged = 0;
  if (z)
    frames_need(z, zlen, &wlog, &need);
  if (wlog > KCS_ZSTD_WLOG_MAX) {
    if (kcs_zstd_charge(need))
      return kc_errf(err, KC_BUSY,
                     "the frame asks for a %llu MiB decoding "
                     "window, more than the decoder memory free now (of "
                     "%llu MiB): not verified",
                     (unsigned long long)(need >> 20),
                     (unsigned long long)(KCS_ZSTD_DECODE_BUDGET >> 20));
    *charged = need;
  }
  if (!(*dc = kcs_zstd_dctx(wlog))) {
    /* decode_each returns without releasing: give the charge back here */
    kcs_zstd_release(*charged);
    *charged = 0;
    return kc_errf(err, KC_NOMEM, "out of memory");
  }
  return KC_OK;
}

static kc_err decode_each(const void *mem, int fd, uint64_t zlen, uint64_t raw,
                          zsink sink, void *ud, char *err) {
  if (mem && raw <= FLAT_MAX) {
    void *flat = malloc(raw ? (size_t)raw : 1);
    kc_err e = flat ? decode_flat(mem, (size_t)zlen, flat, (size_t)raw, err)
                    : kc_errf(err, KC_NOMEM, "out of memory");
    if (!e && raw)
      e = sink(ud, flat, (size_t)raw);
    free(flat);
    return e;
  }
  ZSTD_DCtx *dc = NULL;
  uint64_t charged;
  kc_err e = walk_decoder(mem, (size_t)zlen, &dc, &charged, err);
  if (e)
    return e;
  unsigned char *obuf = malloc(IO_CHUNK), *ibuf = mem ? NULL : malloc(IO_CHUNK);
  e = obuf && (mem || ibuf) ? KC_OK : kc_errf(err, KC_NOMEM, "out of memory");
  uint64_t got = 0, pos = 0;
  size_t left = 1;
  while (!e && pos < zlen) {
    size_t want = zlen - pos > IO_CHUNK ? IO_CHUNK : (size_t)(zlen - pos);
    ZSTD_inBuffer in = {(const char *)mem + pos, want, 0};
    if (!mem) {
      ssize_t n = read_at(fd, 1, (off_t)pos, ibuf, want);
      if (n <= 0) {
        e = kc_errf(err, KC_IO, "reading a spooled frame");
        break;
      }
      in = (ZSTD_inBuffer){ibuf, (size_t)n, 0};
    }
    while (!e && in.pos < in.size) {
      ZSTD_outBuffer ob = {obuf, IO_CHUNK, 0};
      left = ZSTD_decompressStream(dc, &ob, &in);
      if (ZSTD_isError(left))
        e = kc_errf(err, KC_CORRUPT, "zstd: %s", ZSTD_getErrorName(left));
      else if ((got += ob.pos) > raw)
        e = kc_errf(err, KC_CORRUPT,
                    "the frame decompresses to more than "
                    "%llu bytes",
                    (unsigned long long)raw);
      else if (ob.pos)
        e = sink(ud, obuf, ob.pos);
    }
    pos += in.size;
  }
  /* flush what the decoder still holds */
  while (!e && left) {
    ZSTD_inBuffer in = {NULL, 0, 0};
    ZSTD_outBuffer ob = {obuf, IO_CHUNK, 0};
    left = ZSTD_decompressStream(dc, &ob, &in);
    if (ZSTD_isError(left) || ob.pos == 0)
      break;
    if ((got += ob.pos) > raw)
      e = kc_errf(err, KC_CORRUPT, "the frame decompresses to too much");
    else
      e = sink(ud, obuf, ob.pos);
  }
  if (!e && (left || got != raw))
    e = kc_errf(err, KC_CORRUPT, "the frame %s (%llu of %llu bytes)",
                left ? "is truncated" : "decompresses to another size",
                (unsigned long long)got, (unsigned long long)raw);
  ZSTD_freeDCtx(dc);
  kcs_zstd_release(charged);
  free(obuf);
  free(ibuf);
  return e;
}

typedef struct into {
  unsigned char *dst;
  uint64_t at;
} into;

static kc_err sink_into(void *ud, const void *p, size_t n) {
  into *d = ud;
  memcpy(d->dst + d->at, p, n);
  d->at += n;
  return KC_OK;
}

kc_err kcs_zstd_decode_into(const void *mem, int fd, uint64_t zlen, void *dst,
                            uint64_t raw, char *err) {
  if (mem)
    return decode_flat(mem, (size_t)zlen, dst, (size_t)raw, err);
  into d = {dst, 0};
  return decode_each(NULL, fd, zlen, raw, sink_into, &d, err);
}

kc_err kc_store_zstd_decode(const void *z, size_t zlen, void *dst, size_t raw,
                            char *err) {
  return kcs_zstd_decode_into(z, -1, zlen, dst, raw, err);
}

static kc_err sink_hash(void *ud, const void *p, size_t n) {
  return kc_sha256_update(ud, p, n);
}

kc_err kcs_zstd_hash(const void *z, size_t zlen, uint64_t raw,
                     char got[KC_HEX_LEN + 1], char *err) {
  kc_sha256 *h = kc_sha256_new();
  if (!h)
    return kc_errf(err, KC_NOMEM, "out of memory");
  kc_err e = decode_each(z ? z : "", -1, zlen, raw, sink_hash, h, err);
  if (!e)
    e = kc_sha256_final(h, got);
  kc_sha256_free(h);
  return e;
}

typedef struct same_as {
  const unsigned char *val;
  uint64_t at;
} same_as;

static kc_err sink_cmp(void *ud, const void *p, size_t n) {
  same_as *d = ud;
  if (memcmp(d->val + d->at, p, n) != 0)
    return KC_CORRUPT; /* differs: stops decoding */
  d->at += n;
  return KC_OK;
}

int kcs_zstd_equals(const void *z, size_t zlen, const void *val, size_t n) {
  same_as d = {val, 0};
  return decode_each(z ? z : "", -1, zlen, n, sink_cmp, &d, NULL) == KC_OK;
}

/* ---- a blob read piece by piece ---- */

struct kc_store_blob_stream {
  kc_store *s;
  char digest[KC_HEX_LEN + 1];
  ZSTD_DCtx *dc;    /* NULL: the held bytes go out as they are */
  uint64_t charged; /* of the decoder budget */
  uint64_t zpos;    /* bytes of the held copy consumed */
  uint64_t stored, out, len;
  int done;
};

/* The stream's decoder, its memory (as the frame's header says it will
 * be) taken from the budget first. A frame held from before the window was
 * bounded gets the window it asks for, up to libzstd's default limit: the
 * budget bounds it. */
static kc_err stream_decoder(kc_store_blob_stream *b, const void *z,
                             size_t zlen) {
  ZSTD_frameHeader fh;
  if (ZSTD_getFrameHeader(&fh, z, zlen) != 0)
    return KC_CORRUPT; /* not a frame the reads could decode either */
  /* what ZSTD_decompressStream will allocate for this frame */
  size_t need = ZSTD_estimateDCtxSize() + ZSTD_BLOCKSIZE_MAX +
                ZSTD_decodingBufferSize_min(fh.windowSize, fh.frameContentSize);
  if (ZSTD_isError(need))
    return KC_CORRUPT;
  unsigned wlog = KCS_ZSTD_WLOG_MAX;
  while (wlog < ZSTD_WINDOWLOG_LIMIT_DEFAULT &&
         fh.windowSize > ((uint64_t)1 << wlog))
    wlog++;
  if (kcs_zstd_charge(need))
    return KC_BUSY;
  b->charged = need;
  return (b->dc = kcs_zstd_dctx(wlog)) ? KC_OK : KC_NOMEM;
}

kc_err kc_store_blob_stream_open(kc_store *s, const char *digest, int decode,
                                 kc_store_blob_stream **out, uint64_t *len,
                                 kc_store_enc *enc, uint64_t *size) {
  kc_store_read *r;
  kc_err e = kc_store_read_begin(s, &r);
  if (e)
    return e;
  const void *data;
  size_t n;
  kc_store_enc how = KC_STORE_RAW;
  uint64_t sz = 0;
  e = kc_store_blob_get_stored(r, digest, &data, &n, &how, &sz);
  if (e) {
    kc_store_read_end(r);
    return e;
  }
  kc_store_blob_stream *b = calloc(1, sizeof *b);
  if (!b) {
    kc_store_read_end(r);
    return KC_NOMEM;
  }
  if (decode && how == KC_STORE_ZSTD && (e = stream_decoder(b, data, n))) {
    kc_store_read_end(r);
    kc_store_blob_stream_free(b);
    return e;
  }
  kc_store_read_end(r);
  b->s = s;
  snprintf(b->digest, sizeof b->digest, "%s", digest);
  b->stored = n;
  b->len = b->dc ? sz : n;
  *out = b;
  if (len)
    *len = b->len;
  if (enc)
    *enc = b->dc ? KC_STORE_RAW : how;
  if (size)
    *size = sz;
  return KC_OK;
}

/* One step of decoding inside the caller's read: input from zpos on. */
static long stream_decode(kc_store_blob_stream *b, const void *z, size_t zlen,
                          char *buf, size_t max) {
  ZSTD_outBuffer ob = {buf, max, 0};
  while (ob.pos < ob.size && !b->done) {
    ZSTD_inBuffer in = {(const char *)z + b->zpos, zlen - b->zpos, 0};
    size_t before = ob.pos;
    size_t left = ZSTD_decompressStream(b->dc, &ob, &in);
    b->zpos += in.pos;
    if (ZSTD_isError(left))
      return -1;
    if (left == 0 && b->zpos == zlen)
      b->done = 1;
    else if (in.pos == 0 && ob.pos == before && b->zpos == zlen)
      break; /* truncated: no input left, no output either (-1 below) */
  }
  /* a later frame of the same blob may ask for a larger window (up to the
   * decoder's bound): what it took beyond the charge is charged now */
  size_t have = ZSTD_sizeof_DCtx(b->dc);
  if (have > b->charged) {
    if (kcs_zstd_charge(have - b->charged))
      return -1;
    b->charged = have;
  }
  b->out += ob.pos;
  /* called only while bytes are due: none coming means a bad frame */
  return b->out > b->len || ob.pos == 0 ? -1 : (long)ob.pos;
}

long kc_store_blob_stream_read(kc_store_blob_stream *b, char *buf, size_t max) {
  if (b->out >= b->len)
    return 0;
  kc_store_read *r;
  if (kc_store_read_begin(b->s, &r))
    return -1;
  const void *z;
  size_t zlen;
  kc_store_enc enc;
  long got = -1;
  /* the blob's bytes never change under its digest; a copy of another
   * length (evicted and stored again otherwise) aborts the response */
  if (!kc_store_blob_get_stored(r, b->digest, &z, &zlen, &enc, NULL) &&
      zlen == b->stored) {
    if (b->dc) {
      got = stream_decode(b, z, zlen, buf, max);
    } else {
      size_t take = zlen - b->out < max ? zlen - (size_t)b->out : max;
      memcpy(buf, (const char *)z + b->out, take);
      b->out += take;
      got = (long)take;
    }
  }
  kc_store_read_end(r);
  return got;
}

void kc_store_blob_stream_free(kc_store_blob_stream *b) {
  if (!b)
    return;
  ZSTD_freeDCtx(b->dc);
  kcs_zstd_release(b->charged);
  free(b);
}
