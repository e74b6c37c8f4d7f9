/* routes_fetch.c: POST /v1/blobs/fetch, many blobs in one answer.
 *
 * A warm of 1024 bundles of 4 small files made 4096 GETs; their per-request
 * cost on both sides, not the bytes, set its time. This route answers a list
 * of digests ({"digests": [...]}, at most KCD_FETCH_MAX_ITEMS) with one body:
 * for each digest, in the order asked, a header line
 *     <sha256> <length> raw|zstd|missing\n
 * then <length> bytes (none for missing). zstd is the frame the store holds,
 * passed through when the request has Accept-Encoding: zstd; without it a
 * held frame is decoded on the way (its line says raw and the content's
 * length). A missing blob is only marked: the client asks for it with a GET,
 * which reads it through from the durable tier.
 *
 * The answer's length is known before a byte goes out: one short read looks
 * every digest up (how it is held, how long). The body is then served in
 * pieces of KCD_BLOB_PIECE bytes, each piece in a read of its own (several
 * small blobs share one), so no read lasts as long as a slow client takes, as
 * for GETs (routes_blob.c). The blobs found are spared from eviction until they
 * are sent (the look-up spares them all; each piece renews the one it sends),
 * so that churn does not take one away from a slow client. A blob gone or
 * changed all the same between the look-up and its piece (deleted, a failing
 * store) aborts the answer: the client sees a body shorter than its length and
 * fetches what it lacks with GETs, never other bytes. The bytes asked for, as
 * sent, are bounded (KCD_FETCH_MAX_BYTES; 413 above). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"

/* "<64 hex> <20 digits> missing\n" */
#define LINE_MAX_ 96

typedef struct item {
  char digest[KC_HEX_LEN + 1];
  uint64_t len;        /* bytes after its line */
  kc_store_enc enc;    /* as held */
  int missing, decode; /* decode: held as zstd, sent decoded */
} item;

typedef struct answer {
  kc_store *s;
  item *it;
  size_t n;
  size_t cur;      /* the item being sent */
  uint64_t off;    /* bytes of it sent, its line included */
  size_t line_len; /* the current item's line */
  char line[LINE_MAX_];
  kc_store_blob_stream *dec; /* the current item's decoder, when decode */
  int64_t spared_ms;         /* when every item still to send was spared */
} answer;

/* Spares are marks that lapse (the store's upload window): an answer read
 * slowly renews the current item's with every piece, and every minute
 * those of the items still to come. */
static void spare_rest(answer *a) {
  int64_t now = (int64_t)(kc_clock_mono_us() / 1000);
  if (now - a->spared_ms < 60000)
    return;
  a->spared_ms = now;
  for (size_t i = a->cur; i < a->n; i++)
    if (!a->it[i].missing)
      kc_store_blob_spare(a->s, a->it[i].digest);
}

static const char *enc_name(const item *x) {
  return x->missing                              ? "missing"
         : x->enc == KC_STORE_ZSTD && !x->decode ? "zstd"
                                                 : "raw";
}

static size_t line_of(const item *x, char out[LINE_MAX_]) {
  int n = snprintf(out, LINE_MAX_, "%s %llu %s\n", x->digest,
                   (unsigned long long)x->len, enc_name(x));
  return n > 0 ? (size_t)n : 0;
}

static void answer_free(void *cls) {
  answer *a = cls;
  kc_store_blob_stream_free(a->dec);
  free(a->it);
  free(a);
}

/* Moves to the next item (its line ready). */
static void next_item(answer *a) {
  kc_store_blob_stream_free(a->dec);
  a->dec = NULL;
  a->cur++;
  a->off = 0;
  a->line_len = a->cur < a->n ? line_of(&a->it[a->cur], a->line) : 0;
}

/* Bytes of a held blob from `at`, in the piece's read (begun when first
 * needed). -1: the blob is gone or not as looked up. */
static long copy_held(answer *a, kc_store_read **rd, const item *x, uint64_t at,
                      char *buf, size_t max) {
  const void *data;
  size_t len;
  kc_store_enc enc;
  if (!*rd && kc_store_read_begin(a->s, rd) != KC_OK)
    return -1;
  if (kc_store_blob_get_stored(*rd, x->digest, &data, &len, &enc, NULL) ||
      len != x->len || enc != x->enc)
    return -1;
  size_t n = x->len - at < max ? (size_t)(x->len - at) : max;
  memcpy(buf, (const char *)data + at, n);
  return (long)n;
}

/* A decoded item's next bytes: the decoder reads in reads of its own. */
static long copy_decoded(answer *a, kc_store_read **rd, const item *x,
                         char *buf, size_t max) {
  kc_store_read_end(*rd); /* one read per thread at a time */
  *rd = NULL;
  if (!a->dec && kc_store_blob_stream_open(a->s, x->digest, 1, &a->dec, NULL,
                                           NULL, NULL) != KC_OK)
    return -1;
  long n = kc_store_blob_stream_read(a->dec, buf, max);
  return n > 0 ? n : -1; /* 0 before its length: it changed */
}

/* Fills buf with the next up to max bytes: lines and blobs, as many as fit. */
static long answer_piece(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos; /* asked for in order: the answer keeps its own place */
  answer *a = cls;
  kc_store_read *rd = NULL;
  size_t used = 0;
  spare_rest(a);
  while (used < max && a->cur < a->n) {
    const item *x = &a->it[a->cur];
    if (a->off < a->line_len) {
      size_t k = a->line_len - (size_t)a->off;
      k = k < max - used ? k : max - used;
      memcpy(buf + used, a->line + a->off, k);
      used += k;
      a->off += k;
      continue;
    }
    uint64_t at = a->off - a->line_len;
    if (x->missing || at == x->len) {
      next_item(a);
      continue;
    }
    kc_store_blob_spare(a->s, x->digest); /* renewed with every piece */
    long n = x->decode ? copy_decoded(a, &rd, x, buf + used, max - used)
                       : copy_held(a, &rd, x, at, buf + used, max - used);
    if (n < 0 || (uint64_t)n > x->len - at) {
      kc_store_read_end(rd);
      return -1;
    }
    used += (size_t)n;
    a->off += (uint64_t)n;
  }
  kc_store_read_end(rd);
  return used ? (long)used : -1;
}

/* The digests of the body, checked; KC_OK or the error with err set. */
static kc_err parse(kcd_req *r, answer *a, char *err) {
  static const char *const allowed[] = {"digests", NULL};
  json_t *j;
  kc_err e = kcd_json_object(r, allowed, &j, err);
  if (e)
    return e;
  json_t *ds = json_object_get(j, "digests");
  size_t n = json_array_size(ds);
  if (!json_is_array(ds))
    e = kc_errf(err, KC_EINVAL, "'digests' must be an array of SHA-256s");
  else if (n > KCD_FETCH_MAX_ITEMS)
    e = kc_errf(err, KC_TOO_LARGE,
                "%zu digests asked for; at most %d per request", n,
                KCD_FETCH_MAX_ITEMS);
  else if (!(a->it = calloc(n ? n : 1, sizeof *a->it)))
    e = kc_errf(err, KC_NOMEM, "out of memory");
  for (size_t i = 0; !e && i < n; i++) {
    const char *d = json_string_value(json_array_get(ds, i));
    if (!d || !kc_is_hex64(d))
      e = kc_errf(err, KC_BAD_DIGEST,
                  "digests[%zu] is not 64 lowercase hex digits (a SHA-256)", i);
    else
      memcpy(a->it[i].digest, d, KC_HEX_LEN + 1);
  }
  a->n = n;
  json_decref(j);
  return e;
}

/* What look_up's reads add up, item by item. */
typedef struct look {
  kcd_req *r;
  answer *a;
  int zstd_ok;
  uint64_t total, bytes;
  char *err;
} look;

/* Item i (kcd_svc_read_each's callback): how its blob is held and how long
 * its part is. */
static kc_err look_one(void *arg, kc_store_read *rd, size_t i) {
  look *l = arg;
  item *x = &l->a->it[i];
  const void *data;
  size_t len;
  uint64_t size = 0;
  kc_err e =
      kc_store_blob_get_stored(rd, x->digest, &data, &len, &x->enc, &size);
  if (e == KC_NOT_FOUND) {
    x->missing = 1;
  } else if (e) {
    return kc_errf(l->err, e, "cannot read blob %s", x->digest);
  } else {
    kc_store_blob_spare(l->a->s, x->digest); /* until its piece is sent */
    x->decode = x->enc == KC_STORE_ZSTD && !l->zstd_ok;
    x->len = x->decode ? size : len;
    if (x->enc == KC_STORE_ZSTD) /* counted as routes_zstd.c's GETs */
      atomic_fetch_add(&l->r->st->http->metrics.zstd_gets, 1);
    if (x->enc == KC_STORE_ZSTD && !x->decode)
      atomic_fetch_add(&l->r->st->http->metrics.zstd_sent_frames, 1);
  }
  char line[LINE_MAX_];
  l->total += line_of(x, line) + x->len;
  l->bytes += x->len;
  return e;
}

/* One short read: how each blob is held and how long its part is. *total:
 * the answer's length; *bytes: the blob bytes in it, as sent. Each item
 * counts as a GET of it (kcached_ops_total{op="get"}). */
static kc_err look_up(kcd_req *r, answer *a, int zstd_ok, uint64_t *total,
                      uint64_t *bytes, char *err) {
  look l = {r, a, zstd_ok, 0, 0, err};
  kc_err e = kcd_svc_read_each(r->st, KCD_FE_HTTP, KCD_OP_GET, a->n, look_one,
                               &l, err);
  *total = l.total;
  *bytes = l.bytes;
  return e;
}

int kcd_blobs_fetch(kcd_req *r) {
  char err[KC_ERRBUF_SIZE] = "";
  answer *a = calloc(1, sizeof *a);
  if (!a)
    return kcd_reply_error(r, KC_NOMEM, "out of memory");
  a->s = kcd_store(r->st);
  int zstd_ok = kcd_accepts_zstd(r);
  uint64_t total = 0, bytes = 0;
  kc_err e = parse(r, a, err);
  if (!e)
    e = look_up(r, a, zstd_ok, &total, &bytes, err);
  if (!e && bytes > KCD_FETCH_MAX_BYTES)
    e = kc_errf(err, KC_TOO_LARGE,
                "the blobs asked for are %llu bytes; at most %llu per "
                "request: ask for fewer",
                (unsigned long long)bytes,
                (unsigned long long)KCD_FETCH_MAX_BYTES);
  if (e) {
    answer_free(a);
    return kcd_reply_error_json(r, e, err, NULL, NULL);
  }
  const char *const h[] = {"Vary", "Accept-Encoding", "Cache-Control",
                           "no-store", NULL};
  if (!a->n) {
    answer_free(a);
    return kcd_reply(r, 200, KCD_FETCH_CTYPE, "", 0, KCD_MEM_PERSISTENT, h);
  }
  a->line_len = line_of(&a->it[0], a->line);
  return kcd_reply_pieces(r, 200, KCD_FETCH_CTYPE, total, KCD_BLOB_PIECE,
                          answer_piece, a, answer_free, h);
}
