/* reply.c: how a request is answered. Every answer goes through kcd_reply
 * (or kcd_reply_map, which reuses a small blob's response, or
 * kcd_reply_pieces), which queues one libmicrohttpd response on the
 * request's connection and records its status and size for the access log
 * and metrics (http.c reads them when the request completes). Above it: JSON
 * bodies, error bodies with the headers their status implies (WWW-Authenticate,
 * Allow, Retry-After), and early answers: errors decided before the body was
 * read, answered once http.c has read or dropped it.
 *
 * Handlers (routes_*.c) and http.c call in here; nothing here calls back into
 * http.c or a handler. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "http.h"

/* ---- the budget of answers not yet read ----
 *
 * A body built in memory (KCD_MEM_FREE, KCD_MEM_COPY) lives until its
 * client has read it all: a client that asks and never reads held an 8 MB
 * lookup answer each time (768 of them: 5.2 GB). Bodies over ANSWER_SMALL
 * are counted in st->http->answer_bytes until MHD frees them, and one that
 * would take the count over --max-answer-memory is not made: 503 busy with
 * Retry-After, sent from a small body. The first answer always goes (held
 * is 0), so any one answer can be served: the bound is the larger of the
 * flag and the largest answer, plus ANSWER_SMALL per connection. Bodies of
 * the map (kcd_reply_map) and pieces (kcd_reply_pieces) hold no copy. */
#define ANSWER_SMALL (64 * 1024)

typedef struct counted_body {
  kcd_state *st;
  void *data;
  size_t len;
} counted_body;

void kcd_answer_budget_give(kcd_state *st, size_t len) {
  atomic_fetch_sub(&st->http->answer_bytes, len);
}

static void counted_free(void *cls) {
  counted_body *b = cls;
  kcd_answer_budget_give(b->st, b->len);
  free(b->data);
  free(b);
}

int kcd_answer_budget_take(kcd_state *st, size_t len) {
  uint64_t cap = st->cfg.max_answer_memory;
  uint64_t old = atomic_fetch_add(&st->http->answer_bytes, len);
  if (!cap || old == 0 || old + len <= cap)
    return 1;
  atomic_fetch_sub(&st->http->answer_bytes, len);
  return 0;
}

/* A response over data (freed with it, or copied first), counted against
 * the budget; NULL on no memory (data freed when it was ours). */
static struct MHD_Response *counted_response(kcd_state *st, const void *data,
                                             size_t len, enum kcd_mem mem) {
  counted_body *b = malloc(sizeof *b);
  void *body = mem == KCD_MEM_FREE ? (void *)data : malloc(len);
  struct MHD_Response *resp = NULL;
  if (b && body) {
    if (mem != KCD_MEM_FREE)
      memcpy(body, data, len);
    *b = (counted_body){st, body, len};
    resp = MHD_create_response_from_buffer_with_free_callback_cls(
        len, body, counted_free, b);
  }
  if (!resp) {
    atomic_fetch_sub(&st->http->answer_bytes, len);
    free(body);
    free(b);
  }
  return resp;
}

static struct MHD_Response *make_response(const void *data, size_t len,
                                          enum kcd_mem mem) {
  if (mem == KCD_MEM_FREE)
    return MHD_create_response_from_buffer_with_free_callback(len, (void *)data,
                                                              free);
  return MHD_create_response_from_buffer(len, (void *)data,
                                         mem == KCD_MEM_PERSISTENT
                                             ? MHD_RESPMEM_PERSISTENT
                                             : MHD_RESPMEM_MUST_COPY);
}

/* Content-Type (when given) and headers: name, value pairs, NULL-ended. */
static void add_headers(struct MHD_Response *resp, const char *ctype,
                        const char *const *headers) {
  if (ctype)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
  for (size_t i = 0; headers && headers[i] && headers[i + 1]; i += 2)
    MHD_add_response_header(resp, headers[i], headers[i + 1]);
}

/* Records a queued answer for the access log and metrics. */
static void note_queued(kcd_req *r, int status, uint64_t len) {
  r->status = status;
  r->queued = 1;
  int bodyless = r->method == KCD_M_HEAD || status == 204 || status == 304;
  r->bytes_out = bodyless ? 0 : len;
}

int kcd_reply(kcd_req *r, int status, const char *ctype, const void *data,
              size_t len, enum kcd_mem mem, const char *const *headers) {
  struct MHD_Response *resp;
  if (mem == KCD_MEM_PERSISTENT || len <= ANSWER_SMALL) {
    resp = make_response(data, len, mem);
  } else if (!kcd_answer_budget_take(r->st, len)) {
    if (mem == KCD_MEM_FREE)
      free((void *)data);
    return kcd_reply_error(
        r, KC_BUSY,
        "answers not yet read by their "
        "clients hold %llu bytes; this one (%zu bytes) "
        "would pass --max-answer-memory %llu: try again",
        (unsigned long long)atomic_load(&r->st->http->answer_bytes), len,
        (unsigned long long)r->st->cfg.max_answer_memory);
  } else {
    resp = counted_response(r->st, data, len, mem);
    if (!resp)
      return MHD_NO;
  }
  if (!resp) {
    if (mem == KCD_MEM_FREE)
      free((void *)data);
    return MHD_NO;
  }
  add_headers(resp, ctype, headers);
  if (r->close_after)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
  enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)status, resp);
  MHD_destroy_response(resp);
  note_queued(r, status, len);
  return ret;
}

/* ---- small blobs, copied, and their responses reused ----
 *
 * A small blob's bytes are copied out of the map before the read ends:
 * MHD sends a response when the socket takes it, and one the socket does
 * not take at once (a 1500-byte MTU's segments, a small receive window)
 * would keep a read over the map open at its client's pace, pinning every
 * page freed after it began. The copy costs less than building the
 * response, so each thread keeps the last ones built (REUSE_SLOTS): a
 * slot is taken again when its bytes are the ones the read just found. */

/* Per thread, direct-mapped by the key's first hex digits. A slot holds one
 * reference to its response; MHD takes its own for each queue. */
#define REUSE_SLOTS 64

typedef struct reuse_slot {
  struct MHD_Response *resp;
  const void *copy; /* the response's body, freed with it */
  size_t len;
  const char *ctype;
  char key[KC_HEX_LEN];
} reuse_slot;

static _Thread_local reuse_slot reuse[REUSE_SLOTS];
static pthread_key_t reuse_key;
static pthread_once_t reuse_once = PTHREAD_ONCE_INIT;

/* At the thread's end (MHD's workers end with the daemon). */
static void reuse_free(void *slots) {
  reuse_slot *t = slots;
  for (size_t i = 0; i < REUSE_SLOTS; i++) {
    if (t[i].resp)
      MHD_destroy_response(t[i].resp);
    t[i].resp = NULL;
  }
}

static void reuse_key_make(void) { pthread_key_create(&reuse_key, reuse_free); }

/* The slot's response when it holds these bytes (compared whole: a blob
 * repaired in place keeps its key and length). */
static int slot_holds(const reuse_slot *sl, const char *key, const char *ctype,
                      const void *data, size_t len) {
  return sl->resp && sl->len == len && sl->ctype == ctype &&
         memcmp(sl->key, key, KC_HEX_LEN) == 0 &&
         memcmp(sl->copy, data, len) == 0;
}

static struct MHD_Response *map_response(const char *key, const char *ctype,
                                         const void *data, size_t len,
                                         const char *const *headers) {
  unsigned char b0 = 0; /* the key is checked hex: its first byte */
  (void)kc_hex_decode(key, 1, &b0);
  reuse_slot *sl = &reuse[b0 % REUSE_SLOTS];
  if (slot_holds(sl, key, ctype, data, len))
    return sl->resp;
  void *copy = malloc(len ? len : 1);
  if (!copy)
    return NULL;
  memcpy(copy, data, len);
  struct MHD_Response *resp =
      MHD_create_response_from_buffer_with_free_callback(len, copy, free);
  if (!resp) {
    free(copy);
    return NULL;
  }
  add_headers(resp, ctype, headers);
  if (!sl->resp) {
    pthread_once(&reuse_once, reuse_key_make);
    pthread_setspecific(reuse_key, reuse);
  } else {
    MHD_destroy_response(sl->resp); /* dropped here; MHD may still hold it */
  }
  *sl = (reuse_slot){resp, copy, len, ctype, ""};
  memcpy(sl->key, key, KC_HEX_LEN);
  return resp;
}

int kcd_reply_map(kcd_req *r, const char *key, const char *ctype,
                  const void *data, size_t len, const char *const *headers) {
  struct MHD_Response *resp = map_response(key, ctype, data, len, headers);
  kc_store_read_end(r->read); /* the bytes are copied (or not sent) */
  r->read = NULL;
  if (!resp)
    return MHD_NO;
  enum MHD_Result ret = MHD_queue_response(r->conn, 200, resp);
  note_queued(r, 200, len);
  return ret;
}

/* ---- bodies another owner holds (the decoded cache) ---- */

int kcd_reply_held(kcd_req *r, const char *ctype, const void *data, size_t len,
                   void (*release)(void *), void *cls,
                   const char *const *headers) {
  struct MHD_Response *resp =
      MHD_create_response_from_buffer_with_free_callback_cls(len, (void *)data,
                                                             release, cls);
  if (!resp) {
    release(cls);
    return MHD_NO;
  }
  add_headers(resp, ctype, headers);
  if (r->close_after)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
  enum MHD_Result ret = MHD_queue_response(r->conn, 200, resp);
  MHD_destroy_response(resp); /* released once MHD is done with it */
  note_queued(r, 200, len);
  return ret;
}

/* ---- bodies served in pieces ---- */

typedef struct pieces {
  kcd_piece_fn fn;
  void *cls;
  void (*free_cls)(void *);
} pieces;

static ssize_t piece_cb(void *cls, uint64_t pos, char *buf, size_t max) {
  pieces *p = cls;
  long n = p->fn(p->cls, pos, buf, max);
  return n > 0 ? (ssize_t)n : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void pieces_free(void *cls) {
  pieces *p = cls;
  if (p->free_cls)
    p->free_cls(p->cls);
  free(p);
}

int kcd_reply_pieces(kcd_req *r, int status, const char *ctype, uint64_t len,
                     size_t piece, kcd_piece_fn fn, void *cls,
                     void (*free_cls)(void *), const char *const *headers) {
  pieces *p = malloc(sizeof *p);
  struct MHD_Response *resp = NULL;
  if (p) {
    *p = (pieces){fn, cls, free_cls};
    resp =
        MHD_create_response_from_callback(len, piece, piece_cb, p, pieces_free);
  }
  if (!resp) {
    if (free_cls)
      free_cls(cls);
    free(p);
    return MHD_NO;
  }
  add_headers(resp, ctype, headers);
  enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)status, resp);
  MHD_destroy_response(resp); /* freed with p once MHD is done with it */
  note_queued(r, status, len);
  return ret;
}

int kcd_reply_json(kcd_req *r, int status, json_t *json,
                   const char *const *headers) {
  char *text = json ? json_dumps(json, JSON_COMPACT) : NULL;
  json_decref(json);
  if (!text)
    return MHD_NO;
  return kcd_reply(r, status, "application/json", text, strlen(text),
                   KCD_MEM_FREE, headers);
}

/* ---- errors ---- */

/* Messages quote client input; jansson refuses invalid UTF-8 and logs must
 * stay one line, so keep them to printable ASCII. */
static void sanitize(char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
      *s = '?';
}

/* Adds the headers an error status implies to the caller's list. A 405 names
 * the methods of the matched route (r->rt), from the route table. */
static void error_headers(const kcd_req *r, kc_err e, const char *const *in,
                          const char **out, size_t cap) {
  size_t n = 0;
  for (size_t i = 0; in && in[i] && in[i + 1] && n + 4 < cap; i += 2) {
    out[n++] = in[i];
    out[n++] = in[i + 1];
  }
  if (e == KC_UNAUTHORIZED) {
    out[n++] = MHD_HTTP_HEADER_WWW_AUTHENTICATE;
    out[n++] = "Bearer realm=\"kcache\"";
  } else if (e == KC_METHOD && r->op == NULL && r->rt) {
    out[n++] = MHD_HTTP_HEADER_ALLOW;
    out[n++] = r->rt->allow;
  } else if ((e == KC_BUSY || e == KC_NOT_READY) && !in) {
    out[n++] = MHD_HTTP_HEADER_RETRY_AFTER;
    out[n++] = e == KC_BUSY ? "1" : "5";
  }
  out[n] = NULL;
}

int kcd_reply_error_json(kcd_req *r, kc_err e, const char *msg, json_t *extra,
                         const char *const *headers) {
  char m[KC_ERRBUF_SIZE];
  snprintf(m, sizeof m, "%s", msg && *msg ? msg : kc_strerror(e));
  sanitize(m);
  json_t *o = extra ? extra : json_object();
  if (!o)
    return MHD_NO;
  json_object_set_new(o, "error", json_string(kc_err_code(e)));
  json_object_set_new(o, "message", json_string(m));
  const char *h[20];
  error_headers(r, e, headers, h, sizeof h / sizeof *h);
  return kcd_reply_json(r, kc_err_http_status(e), o, h);
}

int kcd_reply_error(kcd_req *r, kc_err e, const char *fmt, ...) {
  char m[KC_ERRBUF_SIZE];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m, sizeof m, fmt, ap);
  va_end(ap);
  return kcd_reply_error_json(r, e, m, NULL, NULL);
}

/* ---- early answers ---- */

void kcd_set_early(kcd_req *r, kc_err e, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->early_msg, sizeof r->early_msg, fmt, ap);
  va_end(ap);
  r->early = 1;
  r->early_err = e;
}

int kcd_reply_early(kcd_req *r) {
  return kcd_reply_error_json(r, r->early_err, r->early_msg, NULL, NULL);
}
