/* routes_zstd.c: blobs held zstd-compressed on the wire.
 *
 * GET of a blob the store holds compressed: a client that sends
 * Accept-Encoding: zstd gets the held frame as it is (Content-Encoding:
 * zstd; zero-copy from the map up to KCD_ZERO_COPY_MAX, larger ones copied
 * out piece by piece, one short read per piece, as routes_blob.c does);
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

static long stream_piece(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos; /* asked for in order: the stream keeps its own place */
  return kc_store_blob_stream_read(cls, buf, max);
}

static void stream_free(void *cls) { kc_store_blob_stream_free(cls); }

/* The held frame, zero-copy: r->read ends once it is sent (completion). */
static int reply_frame(kcd_req *r, const char *const *h) {
  const void *data;
  size_t len;
  kc_store_enc enc;
  kc_err e = kc_store_read_begin(kcd_store(r->st), &r->read);
  if (!e)
    e = kc_store_blob_get_stored(r->read, r->param, &data, &len, &enc, NULL);
  if (e) {
    kc_store_read_end(r->read);
    r->read = NULL;
    return kcd_reply_error_json(r, e, "cannot read the blob", NULL, NULL);
  }
  return kcd_reply(r, 200, "application/octet-stream", data, len,
                   KCD_MEM_PERSISTENT, h);
}

/* A small blob for a client without zstd: decoded whole, in one pass, into
 * a buffer of its size (the thread's decoding context, no stream decoder
 * or window to set up: those cost more than the decode). 0: not small,
 * go on with a stream; else the reply's result. */
static int reply_small_decoded(kcd_req *r, const char *const *h,
                               int *replied) {
  const void *z;
  size_t zlen;
  kc_store_enc enc;
  uint64_t size = 0;
  kc_store_read *rd;
  char err[KC_ERRBUF_SIZE] = "";
  *replied = 0;
  kc_err e = kc_store_read_begin(kcd_store(r->st), &rd);
  if (e)
    return 0; /* the stream's open says why */
  e = kc_store_blob_get_stored(rd, r->param, &z, &zlen, &enc, &size);
  void *buf = NULL;
  if (!e && enc == KC_STORE_ZSTD && size <= KCD_ZERO_COPY_MAX) {
    buf = malloc(size ? (size_t)size : 1);
    e = buf ? kc_store_zstd_decode(z, zlen, buf, (size_t)size, err)
            : KC_NOMEM;
    *replied = 1;
  }
  kc_store_read_end(rd);
  if (!*replied)
    return 0;
  if (e) {
    free(buf);
    return kcd_reply_error_json(r, e, *err ? err : "cannot read the blob",
                                NULL, NULL);
  }
  return kcd_reply(r, 200, "application/octet-stream", buf, (size_t)size,
                   KCD_MEM_FREE, h);
}

static int reply_entry(kcd_req *r, kcd_dentry *e, const char *const *h) {
  return kcd_reply_held(r, "application/octet-stream", kcd_dentry_data(e),
                        kcd_dentry_len(e), kcd_dentry_release, e, h);
}

/* Fills e (the content of the frame r->param names, e's length) in one
 * pass and checks it hashes to the digest. */
static kc_err fill_entry(kcd_req *r, kcd_dentry *e, const void *z,
                         size_t zlen, char *err) {
  kc_err x = kc_store_zstd_decode(z, zlen, kcd_dentry_data(e),
                                  kcd_dentry_len(e), err);
  char got[KC_HEX_LEN + 1];
  if (!x)
    x = kc_sha256_hex(kcd_dentry_data(e), kcd_dentry_len(e), got);
  if (!x && memcmp(got, r->param, KC_HEX_LEN) != 0)
    x = kc_errf(err, KC_CORRUPT, "the held frame decodes to other content "
                "than the blob's (sha256 %s)", got);
  return x;
}

/* For a client without zstd, from the decoded cache: a hit answers from
 * memory; a miss the cache takes is decoded whole into the new entry
 * (one pass, the thread's decoding context, inside one short read),
 * hashed, and kept. 0: not answered here (no cache, not held compressed,
 * or the cache passes: too big, no room, being filled). */
static int reply_cached(kcd_req *r, const char *const *h, int *replied) {
  kcd_dcache *c = r->st->dcache;
  kcd_dentry *e;
  *replied = 0;
  if (!c)
    return 0;
  if (kcd_dcache_get(c, r->param, KCD_DC_LOOK, &e) == KCD_DC_HIT)
    return *replied = 1, reply_entry(r, e, h);
  const void *z;
  size_t zlen;
  kc_store_enc enc;
  uint64_t size = 0;
  kc_store_read *rd;
  char err[KC_ERRBUF_SIZE] = "";
  if (kc_store_read_begin(kcd_store(r->st), &rd))
    return 0; /* the stream's open says why */
  kc_err x = kc_store_blob_get_stored(rd, r->param, &z, &zlen, &enc, &size);
  kcd_dcache_res res = x || enc != KC_STORE_ZSTD
                           ? KCD_DC_PASS
                           : kcd_dcache_get(c, r->param, size, &e);
  if (res == KCD_DC_FILL)
    x = fill_entry(r, e, z, zlen, err);
  kc_store_read_end(rd);
  if (res == KCD_DC_PASS)
    return 0;
  *replied = 1;
  if (res == KCD_DC_FILL)
    kcd_dcache_publish(e, !x);
  if (x) {
    kcd_dentry_release(e);
    return kcd_reply_error_json(r, x, *err ? err : "cannot read the blob",
                                NULL, NULL);
  }
  return reply_entry(r, e, h);
}

int kcd_blob_get_encoded(kcd_req *r) {
  char etag[ETAG_SIZE];
  snprintf(etag, sizeof etag, "\"%.64s\"", r->param);
  /* HEAD describes the content; a GET without zstd gets it decoded */
  int frame = r->method != KCD_M_HEAD && kcd_accepts_zstd(r);
  const char *const h[] = {"ETag", etag, "Cache-Control",
                           "public, max-age=31536000, immutable", "Vary",
                           "Accept-Encoding",
                           frame ? "Content-Encoding" : NULL, "zstd", NULL};
  if (matches_etag(r, etag))
    return kcd_reply(r, 304, NULL, "", 0, KCD_MEM_PERSISTENT, h);
  if (!frame && r->method != KCD_M_HEAD) {
    int replied, ret = reply_cached(r, h, &replied);
    if (!replied)
      ret = reply_small_decoded(r, h, &replied);
    if (replied) {
      atomic_fetch_add(&r->st->metrics.zstd_gets, 1);
      return ret;
    }
  }
  kc_store_blob_stream *b = NULL;
  uint64_t len = 0;
  kc_err e = kc_store_blob_stream_open(kcd_store(r->st), r->param,
                                       !frame, &b, &len, NULL, NULL);
  if (e)
    return kcd_reply_error_json(r, e, e == KC_NOT_FOUND ? "no such blob"
                                : "cannot read the blob", NULL, NULL);
  atomic_fetch_add(&r->st->metrics.zstd_gets, 1);
  if (frame)
    atomic_fetch_add(&r->st->metrics.zstd_sent_frames, 1);
  if (frame && len <= KCD_ZERO_COPY_MAX) {
    kc_store_blob_stream_free(b);
    return reply_frame(r, h);
  }
  return kcd_reply_pieces(r, 200, "application/octet-stream", len, PIECE,
                          stream_piece, b, stream_free, h);
}
