/* routes_zstd.c: blobs held zstd-compressed on the wire.
 *
 * GET of a blob the store holds compressed, from the GET's one read
 * (routes_blob.c's kcd_svc_blob_read, which found the frame and the
 * content's size): a client that sends Accept-Encoding: zstd gets the held
 * frame as it is (Content-Encoding: zstd; copied before the read ends up to
 * KCD_ZERO_COPY_MAX, larger ones copied out piece by piece, one short read
 * per piece, as routes_blob.c does, the blob spared from eviction
 * meanwhile); any other client gets the content: from the decoded cache
 * (filled from the held frame on a miss), or up to KCD_ZERO_COPY_MAX decoded
 * whole from the held frame, larger ones decompressed piece by piece with a
 * short read per piece (never a whole-blob copy). The read ends before any
 * reply that is copied or streamed. HEAD gives the content's length (no
 * further read); the ETag is the content's digest either way; Vary:
 * Accept-Encoding. Raw blobs never come here: routes_blob.c serves them.
 *
 * PUT with Content-Encoding: zstd: the store decodes the body as it arrives
 * (kc_store_upload_zstd), bounded by --max-blob-bytes of output. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "http.h"

/* Whether a weight (after "q=") is a qvalue above 0 (RFC 9110 12.4.2:
 * "0" or "1", then "." and up to 3 digits). "nan", "-1" or "2" are not:
 * strtod took "nan" as a q over 0. */
static int q_positive(const char *q) {
  if (*q != '0' && *q != '1')
    return 0;
  int pos = *q++ == '1';
  if (*q == '.')
    for (int i = 0; i < 3 && *++q >= '0' && *q <= '9'; i++)
      pos |= *q != '0';
  else if (*q >= '0' && *q <= '9')
    return 0;
  return pos;
}

/* Does a comma-separated coding list name `coding` with a q other than 0? */
static int lists_coding(const char *v, const char *coding) {
  size_t cl = strlen(coding);
  while (v && *v) {
    while (*v == ' ' || *v == '\t' || *v == ',')
      v++;
    const char *end = v + strcspn(v, ",");
    const char *semi = memchr(v, ';', (size_t)(end - v));
    const char *name_end = semi ? semi : end;
    while (name_end > v && (name_end[-1] == ' ' || name_end[-1] == '\t'))
      name_end--;
    if ((size_t)(name_end - v) == cl && strncasecmp(v, coding, cl) == 0) {
      const char *q = semi ? strstr(semi, "q=") : NULL;
      return !(q && q < end) || q_positive(q + 2);
    }
    v = end;
  }
  return 0;
}

int kcd_accepts_zstd(kcd_req *r) {
  return lists_coding(kcd_header(r, "Accept-Encoding"), "zstd");
}

int kcd_body_is_zstd(kcd_req *r) {
  const char *v = kcd_header(r, "Content-Encoding");
  return v && lists_coding(v, "zstd");
}

/* Ends the GET's read. A blob to be sent in pieces is spared first: no
 * eviction between this read and the first piece's own. */
static void end_read(kcd_req *r, int spare) {
  if (spare)
    kc_store_blob_spare(kcd_store(r->st), r->param);
  kc_store_read_end(r->read);
  r->read = NULL;
}

/* A blob served in pieces: its stream, and the digest to spare it by (its
 * client gets it whole though churn would evict it meanwhile). */
typedef struct streamed {
  kc_store *s;
  kc_store_blob_stream *b;
  char digest[KC_HEX_LEN + 1];
} streamed;

static long stream_piece(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos; /* asked for in order: the stream keeps its own place */
  streamed *x = cls;
  kc_store_blob_spare(x->s, x->digest);
  return kc_store_blob_stream_read(x->b, buf, max);
}

static void stream_free(void *cls) {
  streamed *x = cls;
  kc_store_blob_stream_free(x->b);
  free(x);
}

/* A large blob in pieces, after the GET's read ended (end_read spared it):
 * the frame as held, or its content decoded on the way (`decode`). */
static int reply_stream(kcd_req *r, int decode, const char *const *h) {
  kc_store_blob_stream *b = NULL;
  uint64_t len = 0;
  kc_store_enc enc = KC_STORE_RAW;
  kc_err e = kc_store_blob_stream_open(kcd_store(r->st), r->param, decode, &b,
                                       &len, &enc, NULL);
  /* stored raw since the read (dropped, then uploaded plain): never raw
   * bytes under Content-Encoding: zstd */
  if (!e && !decode && enc != KC_STORE_ZSTD) {
    kc_store_blob_stream_free(b);
    e = KC_BUSY;
  }
  if (e)
    return kcd_reply_error_json(
        r, e, e == KC_NOT_FOUND ? "no such blob" : "cannot read the blob", NULL,
        NULL);
  atomic_fetch_add(&r->st->http->metrics.zstd_gets, 1);
  if (!decode)
    atomic_fetch_add(&r->st->http->metrics.zstd_sent_frames, 1);
  streamed *x = malloc(sizeof *x);
  if (!x) {
    kc_store_blob_stream_free(b);
    return kcd_reply_error(r, KC_NOMEM, "out of memory");
  }
  x->s = kcd_store(r->st);
  x->b = b;
  snprintf(x->digest, sizeof x->digest, "%.64s", r->param);
  return kcd_reply_pieces(r, 200, "application/octet-stream", len,
                          KCD_BLOB_PIECE, stream_piece, x, stream_free, h);
}

/* For a client with zstd: the held frame, copied before the read ends when
 * small, else in pieces. */
static int reply_frame(kcd_req *r, const kc_store_blob_view *v,
                       const char *const *h) {
  if (v->len > KCD_ZERO_COPY_MAX) {
    end_read(r, 1);
    return reply_stream(r, 0, h);
  }
  atomic_fetch_add(&r->st->http->metrics.zstd_gets, 1);
  atomic_fetch_add(&r->st->http->metrics.zstd_sent_frames, 1);
  int ret = kcd_reply(r, 200, "application/octet-stream", v->data, v->len,
                      KCD_MEM_COPY, h);
  end_read(r, 0);
  return ret;
}

static int reply_entry(kcd_req *r, kcd_dentry *e, const char *const *h) {
  return kcd_reply_held(r, "application/octet-stream", kcd_dentry_data(e),
                        kcd_dentry_len(e), kcd_dentry_release, e, h);
}

/* Fills e (the content of the frame r->param names, e's length) in one
 * pass and checks it hashes to the digest. */
static kc_err fill_entry(kcd_req *r, kcd_dentry *e, const void *z, size_t zlen,
                         char *err) {
  kc_err x =
      kc_store_zstd_decode(z, zlen, kcd_dentry_data(e), kcd_dentry_len(e), err);
  char got[KC_HEX_LEN + 1];
  if (!x)
    x = kc_sha256_hex(kcd_dentry_data(e), kcd_dentry_len(e), got);
  if (!x && memcmp(got, r->param, KC_HEX_LEN) != 0)
    x = kc_errf(err, KC_CORRUPT,
                "the held frame decodes to other content "
                "than the blob's (sha256 %s)",
                got);
  return x;
}

/* What the GET's read of the held frame decided for a client without zstd. */
typedef struct decoded {
  kcd_dentry *entry; /* the decoded cache's entry (hit or filled), or */
  void *buf;         /* a small blob decoded whole into a buffer, */
  size_t len;        /* of this length; neither: stream it */
  kc_err err;
  char msg[KC_ERRBUF_SIZE];
} decoded;

/* From the held frame, the path: a hit in the decoded cache, or a fill of
 * it (one pass, the thread's decoding context, hashed, kept), or, when the
 * cache passes (no cache, too big, no room, being filled) and the blob is
 * small, a whole decode into a buffer of its size (no stream decoder or
 * window to set up: those cost more than the decode). Larger ones are left
 * to the stream, whose open says why when the blob cannot be read. Ends the
 * read (a blob left to the stream spared first). */
static void decode_pick(kcd_req *r, const kc_store_blob_view *v, decoded *d) {
  kcd_dcache *c = r->st->http->dcache;
  memset(d, 0, sizeof *d);
  kcd_dentry *e = NULL;
  kcd_dcache_res res =
      c ? kcd_dcache_get(c, r->param, v->size, &e) : KCD_DC_PASS;
  if (res == KCD_DC_HIT) {
    end_read(r, 0);
    d->entry = e;
    return;
  }
  if (res == KCD_DC_FILL) {
    d->err = fill_entry(r, e, v->data, v->len, d->msg);
    end_read(r, 0);
    kcd_dcache_publish(e, !d->err);
    if (d->err)
      kcd_dentry_release(e);
    else
      d->entry = e;
    return;
  }
  if (v->size <= KCD_ZERO_COPY_MAX) {
    d->buf = malloc(v->size ? (size_t)v->size : 1);
    d->len = (size_t)v->size;
    d->err = d->buf
                 ? kc_store_zstd_decode(v->data, v->len, d->buf, d->len, d->msg)
                 : KC_NOMEM;
  }
  end_read(r, !d->buf && !d->err);
}

/* For a client without zstd: the content, from the held frame (decode_pick)
 * or, for a large blob the cache passes, decoded piece by piece. */
static int reply_decoded(kcd_req *r, const kc_store_blob_view *v,
                         const char *const *h) {
  decoded d;
  decode_pick(r, v, &d);
  if (!d.entry && !d.buf && !d.err)
    return reply_stream(r, 1, h);
  atomic_fetch_add(&r->st->http->metrics.zstd_gets, 1);
  if (d.err) {
    free(d.buf);
    return kcd_reply_error_json(
        r, d.err, *d.msg ? d.msg : "cannot read the blob", NULL, NULL);
  }
  if (d.entry)
    return reply_entry(r, d.entry, h);
  return kcd_reply(r, 200, "application/octet-stream", d.buf, d.len,
                   KCD_MEM_FREE, h);
}

/* HEAD: the content's length, no body (MHD never asks a HEAD's reader). */
static long no_piece(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)cls, (void)pos, (void)buf, (void)max;
  return -1;
}

int kcd_blob_get_encoded(kcd_req *r, const kc_store_blob_view *v) {
  char etag[KCD_ETAG_SIZE];
  kcd_blob_etag(r, etag);
  /* HEAD describes the content; a GET without zstd gets it decoded */
  int frame = r->method != KCD_M_HEAD && kcd_accepts_zstd(r);
  const char *const h[] = {KCD_BLOB_HEADERS(etag),
                           "Vary",
                           "Accept-Encoding",
                           frame ? "Content-Encoding" : NULL,
                           "zstd",
                           NULL};
  if (kcd_blob_not_modified(r, etag)) {
    end_read(r, 0);
    return kcd_reply(r, 304, NULL, "", 0, KCD_MEM_PERSISTENT, h);
  }
  if (frame)
    return reply_frame(r, v, h);
  if (r->method != KCD_M_HEAD)
    return reply_decoded(r, v, h);
  uint64_t size = v->size;
  end_read(r, 0);
  atomic_fetch_add(&r->st->http->metrics.zstd_gets, 1);
  return kcd_reply_pieces(r, 200, "application/octet-stream", size,
                          KCD_BLOB_PIECE, no_piece, NULL, NULL, h);
}
