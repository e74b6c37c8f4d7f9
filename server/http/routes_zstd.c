/* routes_zstd.c: blobs held zstd-compressed on the wire.
 *
 * GET of a blob the store holds compressed: a client that sends
 * Accept-Encoding: zstd gets the held frame as it is (Content-Encoding:
 * zstd; copied before the read ends up to KCD_ZERO_COPY_MAX, larger ones
 * copied out piece by piece, one short read per piece, as routes_blob.c
 * does, the blob spared from eviction meanwhile);
 * any other client gets the content: up to KCD_ZERO_COPY_MAX decoded whole
 * in one pass, larger ones decompressed piece by piece with a short read per
 * piece (never a whole-blob copy). HEAD gives the content's
 * length; the ETag is the content's digest either way; Vary: Accept-Encoding.
 * Raw blobs never come here: routes_blob.c serves them as always.
 *
 * PUT with Content-Encoding: zstd: the store decodes the body as it arrives
 * (kc_store_upload_zstd), bounded by --max-blob-bytes of output. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "http.h"

#define PIECE (128 * 1024)
#define ETAG_SIZE (KC_HEX_LEN + 3)

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

static int matches_etag(kcd_req *r, const char *tag) {
  const char *inm = kcd_header(r, "If-None-Match");
  if (!inm)
    return 0;
  while (*inm == ' ')
    inm++;
  return strcmp(inm, "*") == 0 || strstr(inm, tag) != NULL;
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

static int reply_stream(kcd_req *r, kc_store_blob_stream *b, uint64_t len,
                        const char *const *h) {
  streamed *x = malloc(sizeof *x);
  if (!x) {
    kc_store_blob_stream_free(b);
    return kcd_reply_error(r, KC_NOMEM, "out of memory");
  }
  x->s = kcd_store(r->st);
  x->b = b;
  snprintf(x->digest, sizeof x->digest, "%.64s", r->param);
  kc_store_blob_spare(x->s, x->digest);
  return kcd_reply_pieces(r, 200, "application/octet-stream", len, PIECE,
                          stream_piece, x, stream_free, h);
}

/* The held frame (small), copied: its read ends before it is sent. */
static int reply_frame(kcd_req *r, const char *const *h) {
  const void *data;
  size_t len;
  kc_store_enc enc;
  kc_err e = kc_store_read_begin(kcd_store(r->st), &r->read);
  if (!e)
    e = kc_store_blob_get_stored(r->read, r->param, &data, &len, &enc, NULL);
  /* stored raw since the stream was chosen (dropped, then uploaded plain):
   * never raw bytes under Content-Encoding: zstd */
  if (!e && enc != KC_STORE_ZSTD)
    e = KC_BUSY;
  int ret = e ? kcd_reply_error_json(r, e, "cannot read the blob", NULL, NULL)
              : kcd_reply(r, 200, "application/octet-stream", data, len,
                          KCD_MEM_COPY, h);
  kc_store_read_end(r->read);
  r->read = NULL;
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

/* What one read of the held frame decided for a client without zstd. */
typedef struct decoded {
  kcd_dentry *entry; /* the decoded cache's entry (hit or filled), or */
  void *buf;         /* a small blob decoded whole into a buffer, */
  size_t len;        /* of this length; neither: stream it */
  kc_err err;
  char msg[KC_ERRBUF_SIZE];
} decoded;

/* One read picks the path (a cache hit needs none): the frame is looked up
 * once, and then either filled into the decoded cache (one pass, the
 * thread's decoding context, hashed, kept), or, when the cache passes (no
 * cache, too big, no room, being filled) and the blob is small, decoded
 * whole into a buffer of its size (no stream decoder or window to set up:
 * those cost more than the decode). Larger ones are left to the stream,
 * whose open says why when the blob cannot be read. */
static void decode_pick(kcd_req *r, decoded *d) {
  kcd_dcache *c = r->st->http->dcache;
  memset(d, 0, sizeof *d);
  if (c && kcd_dcache_get(c, r->param, KCD_DC_LOOK, &d->entry) == KCD_DC_HIT)
    return;
  d->entry = NULL;
  const void *z;
  size_t zlen;
  kc_store_enc enc;
  uint64_t size = 0;
  kc_store_read *rd;
  if (kc_store_read_begin(kcd_store(r->st), &rd))
    return;
  if (kc_store_blob_get_stored(rd, r->param, &z, &zlen, &enc, &size) ||
      enc != KC_STORE_ZSTD) {
    kc_store_read_end(rd);
    return;
  }
  kcd_dentry *e = NULL;
  kcd_dcache_res res = c ? kcd_dcache_get(c, r->param, size, &e) : KCD_DC_PASS;
  if (res == KCD_DC_HIT) { /* filled by another since the look */
    kc_store_read_end(rd);
    d->entry = e;
    return;
  }
  if (res == KCD_DC_FILL) {
    d->err = fill_entry(r, e, z, zlen, d->msg);
    kc_store_read_end(rd);
    kcd_dcache_publish(e, !d->err);
    if (d->err)
      kcd_dentry_release(e);
    else
      d->entry = e;
    return;
  }
  if (size <= KCD_ZERO_COPY_MAX) {
    d->buf = malloc(size ? (size_t)size : 1);
    d->len = (size_t)size;
    d->err = d->buf ? kc_store_zstd_decode(z, zlen, d->buf, d->len, d->msg)
                    : KC_NOMEM;
  }
  kc_store_read_end(rd);
}

/* For a client without zstd, from one read (decode_pick); 0 in *replied:
 * go on with a stream. */
static int reply_decoded(kcd_req *r, const char *const *h, int *replied) {
  decoded d;
  decode_pick(r, &d);
  *replied = d.entry || d.buf || d.err;
  if (d.err) {
    free(d.buf);
    return kcd_reply_error_json(
        r, d.err, *d.msg ? d.msg : "cannot read the blob", NULL, NULL);
  }
  if (d.entry)
    return reply_entry(r, d.entry, h);
  if (d.buf)
    return kcd_reply(r, 200, "application/octet-stream", d.buf, d.len,
                     KCD_MEM_FREE, h);
  return 0;
}

int kcd_blob_get_encoded(kcd_req *r) {
  char etag[ETAG_SIZE];
  snprintf(etag, sizeof etag, "\"%.64s\"", r->param);
  /* HEAD describes the content; a GET without zstd gets it decoded */
  int frame = r->method != KCD_M_HEAD && kcd_accepts_zstd(r);
  const char *const h[] = {"ETag",
                           etag,
                           "Cache-Control",
                           "public, max-age=31536000, immutable",
                           "Vary",
                           "Accept-Encoding",
                           frame ? "Content-Encoding" : NULL,
                           "zstd",
                           NULL};
  if (matches_etag(r, etag))
    return kcd_reply(r, 304, NULL, "", 0, KCD_MEM_PERSISTENT, h);
  if (!frame && r->method != KCD_M_HEAD) {
    int replied, ret = reply_decoded(r, h, &replied);
    if (replied) {
      atomic_fetch_add(&r->st->http->metrics.zstd_gets, 1);
      return ret;
    }
  }
  kc_store_blob_stream *b = NULL;
  uint64_t len = 0;
  kc_err e = kc_store_blob_stream_open(kcd_store(r->st), r->param, !frame, &b,
                                       &len, NULL, NULL);
  if (e)
    return kcd_reply_error_json(
        r, e, e == KC_NOT_FOUND ? "no such blob" : "cannot read the blob", NULL,
        NULL);
  atomic_fetch_add(&r->st->http->metrics.zstd_gets, 1);
  if (frame)
    atomic_fetch_add(&r->st->http->metrics.zstd_sent_frames, 1);
  if (frame && len <= KCD_ZERO_COPY_MAX) {
    kc_store_blob_stream_free(b);
    return reply_frame(r, h);
  }
  return reply_stream(r, b, len, h);
}
