/* routes_blob.c: PUT /v1/blobs/{sha256} streamed into the store (hashed while
 * it arrives, never held whole in memory) and GET/HEAD: a small blob copied
 * out of LMDB's map before its read ends (reply.c reuses the response), a
 * large one lent from the store's pages (loans.c: its read taken back from
 * a slow client), else copied out piece by piece, each piece in a read of
 * its own, so no read lasts as long as a slow client takes. A GET that
 * started ends with the whole body. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"

/* A read held for a whole response pins every LMDB page freed after it
 * began: one client reading 40 MB at 10 kB/s kept a full store from reusing
 * its free pages, and writes failed with 507. Blobs up to
 * KCD_ZERO_COPY_MAX are copied before the read ends: sent zero-copy, they
 * did not always fit the socket's buffers at once (a 1500-byte MTU and a
 * small receive window), and their read then lasted as long as the client
 * took. Larger ones are lent (loans.c) or, when no loan can be made,
 * copied out KCD_BLOB_PIECE bytes at a time, one short read per piece. */

/* The param was checked to be 64 hex digits before any handler runs. (No
 * printf: every GET comes here.) */
void kcd_blob_etag(const kcd_req *r, char out[KCD_ETAG_SIZE]) {
  out[0] = '"';
  memcpy(out + 1, r->param, KC_HEX_LEN);
  out[KC_HEX_LEN + 1] = '"';
  out[KC_HEX_LEN + 2] = '\0';
}

int kcd_blob_not_modified(kcd_req *r, const char *etag) {
  const char *inm = kcd_header(r, "If-None-Match");
  if (!inm)
    return 0;
  while (*inm == ' ')
    inm++;
  return strcmp(inm, "*") == 0 || strstr(inm, etag) != NULL;
}

/* X-Kcache-Repair: 1: the client got this blob from us and it failed its
 * hash (GETs serve the held copy unhashed). */
static int repair_asked(kcd_req *r) {
  const char *v = kcd_header(r, "X-Kcache-Repair");
  return v && strcmp(v, "1") == 0;
}

kc_err kcd_blob_put_begin(kcd_req *r, char *err) {
  kcd_svc_res offer =
      kcd_svc_blob_offer(r->st, KCD_FE_HTTP, r->param, repair_asked(r));
  if (offer == KCD_RES_PRESENT) { /* skip the body */
    r->blob_present = 1;
    r->discard = 1;
    return KC_OK;
  }
  kc_err e = kc_store_upload_begin(kcd_store(r->st), &r->upload, err);
  if (!e && kcd_body_is_zstd(r)) { /* decoded as it arrives (routes_zstd.c) */
    kc_store_upload_zstd(r->upload, r->st->cfg.max_blob_bytes);
    atomic_fetch_add(&r->st->http->metrics.zstd_puts, 1);
  }
  if (!e && offer == KCD_RES_REPAIR) /* once verified, replaces the copy */
    kc_store_upload_repair(r->upload);
  return e;
}

kc_err kcd_blob_put_data(kcd_req *r, const char *p, size_t n, char *err) {
  uint64_t lim = r->st->cfg.max_blob_bytes;
  kc_err e;
  /* Chunked bodies carry no length up front: stop as soon as one is over. */
  if (kc_store_upload_size(r->upload) + n > lim)
    e = kc_errf(err, KC_TOO_LARGE, "the blob is over the limit of %llu bytes",
                (unsigned long long)lim);
  else
    e = kc_store_upload_write(r->upload, p, n, err);
  if (e) {
    kc_store_upload_abort(r->upload);
    r->upload = NULL;
    atomic_fetch_add(&r->st->http->metrics.uploads_aborted, 1);
  }
  return e;
}

static int reply_stored(kcd_req *r, int status, uint64_t size) {
  char etag[KCD_ETAG_SIZE];
  kcd_blob_etag(r, etag);
  const char *const h[] = {"ETag", etag, NULL};
  json_t *o = json_pack("{ss sI sb}", "sha256", r->param, "size",
                        (json_int_t)size, "created", status == 201);
  return kcd_reply_json(r, status, o, h);
}

int kcd_blob_put(kcd_req *r) {
  uint64_t size = 0;
  if (r->blob_present) {
    kc_store_blob_has(kcd_store(r->st), r->param, &size);
    return reply_stored(r, 200, size);
  }
  char err[KC_ERRBUF_SIZE] = "";
  int created = 0;
  size = kc_store_upload_size(r->upload);
  kc_store_upload *u = r->upload;
  r->upload = NULL; /* commit frees it, whatever the result */
  kc_err e = kc_store_upload_commit(u, r->param, &created, err);
  if (e)
    return kcd_reply_error_json(r, e, err, NULL, NULL);
  return reply_stored(r, created ? 201 : 200, size);
}

typedef struct blob_pieces {
  kc_store *s;
  char digest[KC_HEX_LEN + 1];
  uint64_t size;
} blob_pieces;

/* One piece, in a read of its own. The blob is spared from eviction while
 * it is served (renewed with each piece), so that a slow client gets it
 * whole; a blob whose bytes are gone all the same (deleted, or a failing
 * store) aborts the response: the client gets a short body, which it can
 * tell from the length and the hash, never other bytes. */
static long blob_piece(void *cls, uint64_t pos, char *buf, size_t max) {
  blob_pieces *b = cls;
  kc_store_blob_spare(b->s, b->digest);
  size_t n = 0;
  uint64_t size = 0;
  kc_err e = kc_store_blob_copy(b->s, b->digest, pos, buf, max, &n, &size);
  return e || size != b->size ? -1 : (long)n;
}

static int reply_pieces(kcd_req *r, uint64_t len, const char *const *h) {
  blob_pieces *b = malloc(sizeof *b);
  if (!b)
    return kcd_reply_error(r, KC_NOMEM, "out of memory");
  b->s = kcd_store(r->st);
  snprintf(b->digest, sizeof b->digest, "%.64s", r->param);
  b->size = len;
  return kcd_reply_pieces(r, 200, "application/octet-stream", len,
                          KCD_BLOB_PIECE, blob_piece, b, free, h);
}

int kcd_blob_get(kcd_req *r) {
  kc_store_blob_view v;
  char err[KC_ERRBUF_SIZE] = "";
  kc_err e = kcd_svc_blob_read(r->st, KCD_FE_HTTP, r->param, &r->read, &v, err);
  if (e)
    return kcd_reply_error_json(r, e, err, NULL, NULL);
  if (v.enc == KC_STORE_ZSTD) /* held compressed: routes_zstd.c, same read */
    return kcd_blob_get_encoded(r, &v);
  const void *data = v.data;
  void *heap = v.heap;
  size_t len = v.len;
  char etag[KCD_ETAG_SIZE];
  kcd_blob_etag(r, etag);
  const char *const h[] = {KCD_BLOB_HEADERS(etag), NULL};
  if (kcd_blob_not_modified(r, etag)) {
    kc_store_read_end(r->read);
    r->read = NULL;
    free(heap);
    return kcd_reply(r, 304, NULL, "", 0, KCD_MEM_PERSISTENT, h);
  }
  if (heap) /* fetched from S3 just now */
    return kcd_reply(r, 200, "application/octet-stream", heap, len,
                     KCD_MEM_FREE, h);
  int rc;
  if (len > KCD_ZERO_COPY_MAX &&
      (rc = kcd_reply_lent(r, data, len, "application/octet-stream", h)) >= 0)
    return rc;
  if (len > KCD_ZERO_COPY_MAX) {
    /* spared before the read ends: no eviction between it and the first
     * piece's own read */
    kc_store_blob_spare(kcd_store(r->st), r->param);
    kc_store_read_end(r->read);
    r->read = NULL;
    return reply_pieces(r, len, h);
  }
  /* Copied (or a response of the same bytes reused); r->read ends there. */
  return kcd_reply_map(r, r->param, "application/octet-stream", data, len, h);
}
