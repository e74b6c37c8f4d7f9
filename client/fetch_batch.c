/* fetch_batch.c: small blobs fetched many per request, with
 * POST /v1/blobs/fetch (docs/DESIGN.md): a warm of 1024 bundles of 4 files
 * made 4096 GETs, and their per-request work on both sides, not the bytes,
 * set its time.
 *
 * The blobs are cut into batches (at most KCC_BATCH_ITEMS, KCC_BATCH_BYTES,
 * and at least as many batches as --parallel allows, so every connection
 * works, unless that leaves fewer than KCC_BATCH_MIN files to a batch),
 * each one POST on one of the pooled connections. Its answer is a
 * stream of items, "<sha256> <length> raw|zstd|missing\n" and the bytes;
 * each item is taken into memory as it streams (a zstd frame decoded on the
 * way, never past the manifest's size), hashed, and only when it hashes to
 * its name written to a temporary file with one write and renamed into
 * place, as a GET's blob is (fetch.c): nothing unverified is ever visible.
 * That hashing and writing is shared with a writer thread (see
 * KCC_WRITER_BYTES), joined before kcc_fetch_batched returns.
 *
 * What a batch does not bring (a blob marked missing, an answer cut short or
 * refused, a server without the route: 404/405, remembered for the client's
 * life) is left to the per-blob GETs of fetch.c, which also read through the
 * durable tier. A blob that came and failed its hash is a failure, as from a
 * GET, and is not asked for again. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "client_internal.h"

#define KCC_BATCH_ITEMS 1024
#define KCC_BATCH_BYTES ((uint64_t)8 << 20)
#define KCC_BATCH_MIN 8 /* files: fewer are not worth a connection more */
/* Nor are fewer bytes: a connection more costs a handshake and a server
 * thread's turn, while one connection on loopback carries a MiB in about
 * a millisecond. The demo model (36 blobs, 316 KiB) takes one, the one its
 * lookup opened (see run_one). */
#define KCC_BATCH_CONN_BYTES ((uint64_t)1 << 20)
#define LINE_CAP 128 /* "<64 hex> <length> missing\n" is under 100 */
/* Verify-and-write is shared with a second thread (the writer): the hash
 * and the file system were most of a warm of many small files' CPU, all on
 * one core of two. An item goes to the writer while less than
 * KCC_WRITER_BYTES wait for it, else this thread (which also receives)
 * takes it itself, so both stay busy and neither waits on the other until
 * the end. Below KCC_WRITER_MIN files the thread is not worth starting. */
#define KCC_WRITER_MIN 32
#define KCC_WRITER_MIN_BYTES ((uint64_t)1 << 20) /* and fewer bytes */
#define KCC_WRITER_BYTES ((uint64_t)1 << 20)
#define KCC_WRITER_SLOTS 1024
/* The writer hands written items' buffers back for the next items, rather
 * than one thread allocating and the other freeing each (glibc then grew
 * and trimmed the heap, and each new page was a fault: malloc and page
 * faults were about a tenth of a 1024-bundle warm's CPU). */
#define KCC_WRITER_SPARES 64
/* larger ones: 16 MiB held at most */
#define KCC_SPARE_MAX ((size_t)256 << 10)

typedef struct brun brun;

typedef struct batch {
  brun *r;
  CURL *h;
  const size_t *idx; /* its files (into run.files) */
  size_t n;
  char *body;     /* the request's JSON */
  size_t cur;     /* the item whose line or bytes come next */
  int in_data;    /* its bytes are coming (else its line) */
  int skip;       /* they are dropped: the item was refused */
  int zstd, zbad; /* zbad: 1 corrupt, 2 decodes to more than declared */
  size_t zleft;   /* the decoder's last hint: 0 at a frame's end */
  int status_seen, not_ok;
  char line[LINE_CAP];
  size_t line_len;
  uint64_t left; /* the current item's bytes still to come */
  char *buf;     /* its content (cap allocated; want + 1 used) */
  size_t cap;
  uint64_t got, want;
  ZSTD_DCtx *dc;
  int busy;
} batch;

/* A received item waiting for the writer: its file and its bytes. */
typedef struct witem {
  size_t fi; /* into run.files and run.state */
  char *buf; /* malloc'd; the writer keeps it as a spare or frees it */
  size_t len, cap;
} witem;

/* The writer's queue: a ring of KCC_WRITER_SLOTS, under one mutex. */
typedef struct writer {
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t more;
  witem q[KCC_WRITER_SLOTS];
  size_t head, len;
  uint64_t bytes; /* queued or being written */
  int idle;       /* waiting for more */
  int closed;
  witem spare[KCC_WRITER_SPARES]; /* written: buf and cap to use again */
  size_t n_spare;
} writer;

struct brun {
  kc_client *c;
  const kc_file *const *files;
  char *state;     /* per file: KCC_FETCH_* */
  size_t *idx;     /* the batched files, batch by batch */
  size_t *starts;  /* batch k: idx[starts[k] .. starts[k + 1]) */
  size_t nb, next; /* batches, the next to send */
  struct curl_slist *hdrs;
  char url[512];
  uint64_t fetched;
  kc_err first;
  char *err;
  writer *w; /* NULL: items are verified and written inline */
};

__attribute__((format(printf, 3, 4))) static void bfail(brun *r, kc_err e,
                                                        const char *fmt, ...) {
  va_list ap;
  if (r->w) /* the writer may fail at the same time */
    pthread_mutex_lock(&r->w->mu);
  if (!r->first) {
    r->first = e;
    if (r->err) {
      va_start(ap, fmt);
      vsnprintf(r->err, KC_ERRBUF_SIZE, fmt, ap);
      va_end(ap);
    }
  }
  if (r->w)
    pthread_mutex_unlock(&r->w->mu);
}

static const kc_file *file_of(brun *r, const batch *b) {
  return r->files[b->idx[b->cur]];
}

/* The item is over: the next one's line comes. */
static void next_item(batch *b) {
  b->cur++;
  b->in_data = b->skip = 0;
  b->line_len = 0;
}

/* An item's bytes, complete and of the declared size: hashed, and only when
 * they hash to the blob's name written once to tmp/ and renamed into place.
 * On the writer thread when there is one, else (and whenever the writer is
 * behind, see hand_over) on the receiving thread: both may publish at once
 * (kcc_cache_blob_publish). */
static void verify_write(brun *r, size_t fi, const char *buf, size_t len) {
  const kc_file *f = r->files[fi];
  char d[KC_HEX_LEN + 1], e2[KC_ERRBUF_SIZE];
  if (kc_sha256_hex(buf, len, d)) {
    bfail(r, KC_INTERNAL, "blob %.16s...: SHA-256 failed", f->sha256);
    return;
  }
  if (strcmp(d, f->sha256)) {
    bfail(r, KC_DIGEST_MISMATCH,
          "blob %.16s... from the server hashes to %.16s...; discarded",
          f->sha256, d);
    return;
  }
  kc_err e = kcc_cache_blob_write(r->c, buf, len, f->sha256, e2);
  if (e) {
    bfail(r, e, "%s", e2);
    return;
  }
  r->state[fi] = KCC_FETCH_DONE; /* each file's byte: one writer */
  __atomic_add_fetch(&r->fetched, len, __ATOMIC_RELAXED);
}

static void *writer_main(void *arg) {
  brun *r = arg;
  writer *w = r->w;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    while (!w->len && !w->closed) {
      w->idle = 1;
      pthread_cond_wait(&w->more, &w->mu);
      w->idle = 0;
    }
    if (!w->len)
      break; /* closed and drained */
    witem it = w->q[w->head];
    w->head = (w->head + 1) % KCC_WRITER_SLOTS;
    w->len--;
    pthread_mutex_unlock(&w->mu);
    verify_write(r, it.fi, it.buf, it.len);
    pthread_mutex_lock(&w->mu);
    w->bytes -= it.len;
    if (w->n_spare < KCC_WRITER_SPARES && it.cap <= KCC_SPARE_MAX)
      w->spare[w->n_spare++] = it;
    else
      free(it.buf);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

/* Queues b's item for the writer, which takes its buffer (b gets a new one
 * at its next item), unless enough waits for it already. 0, or -1: the
 * caller does it itself. */
static int hand_over(brun *r, batch *b) {
  writer *w = r->w;
  pthread_mutex_lock(&w->mu);
  if (w->len == KCC_WRITER_SLOTS || (w->len && w->bytes >= KCC_WRITER_BYTES)) {
    pthread_mutex_unlock(&w->mu);
    return -1;
  }
  w->q[(w->head + w->len) % KCC_WRITER_SLOTS] =
      (witem){b->idx[b->cur], b->buf, (size_t)b->got, b->cap};
  w->len++;
  w->bytes += b->got;
  if (w->idle)
    pthread_cond_signal(&w->more);
  witem sp = w->n_spare ? w->spare[--w->n_spare] : (witem){0};
  pthread_mutex_unlock(&w->mu);
  b->buf = sp.buf; /* NULL: on_line allocates one */
  b->cap = sp.cap;
  return 0;
}

/* The writer for a run of n items of `bytes` in all, or none (r->w stays
 * NULL): a thread only where there is work for two. */
static void writer_start(brun *r, size_t n, uint64_t bytes) {
  writer *w;
  if (n < KCC_WRITER_MIN || bytes < KCC_WRITER_MIN_BYTES ||
      !(w = calloc(1, sizeof *w)))
    return;
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->more, NULL);
  r->w = w;
  if (pthread_create(&w->th, NULL, writer_main, r) != 0) {
    r->w = NULL;
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->more);
    free(w);
  }
}

/* Lets the writer finish what is queued, and joins it: afterwards the
 * process is single-threaded again (builds fork). */
static void writer_stop(brun *r) {
  writer *w = r->w;
  if (!w)
    return;
  pthread_mutex_lock(&w->mu);
  w->closed = 1;
  pthread_cond_signal(&w->more);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->th, NULL);
  while (w->n_spare)
    free(w->spare[--w->n_spare].buf);
  r->w = NULL;
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->more);
  free(w);
}

/* A whole item arrived: checked here, then verified and written (by the
 * writer when there is one). */
static void item_done(brun *r, batch *b) {
  const kc_file *f = file_of(r, b);
  char *st = &r->state[b->idx[b->cur]];
  *st = KCC_FETCH_FAILED;
  if (b->skip) {
    /* refused at its line; fail() said why */
  } else if (b->zstd && b->zbad == 2)
    bfail(r, KC_DIGEST_MISMATCH,
          "fetch blob %.16s...: the server's zstd frame decodes to more than "
          "the %llu bytes the manifest declares; cut off",
          f->sha256, (unsigned long long)b->want);
  else if (b->zstd && (b->zbad || b->zleft))
    bfail(r, KC_DIGEST_MISMATCH,
          "fetch blob %.16s...: the server's zstd frame is corrupt or cut "
          "short; discarded",
          f->sha256);
  else if (b->got != b->want)
    bfail(r, KC_DIGEST_MISMATCH,
          "fetch blob %.16s...: the server sent %llu bytes, the manifest "
          "declares %llu; discarded",
          f->sha256, (unsigned long long)b->got, (unsigned long long)b->want);
  else if (!r->w || hand_over(r, b) != 0)
    verify_write(r, b->idx[b->cur], b->buf, (size_t)b->got);
  next_item(b);
}

/* An item's line: which blob, how long, how sent. 0, or -1 when the answer
 * cannot be followed (the rest is left to GETs). */
static int on_line(brun *r, batch *b) {
  const kc_file *f = file_of(r, b);
  char *end;
  b->line[b->line_len] = '\0';
  if (b->line_len < KC_HEX_LEN + 2 || b->line[KC_HEX_LEN] != ' ' ||
      memcmp(b->line, f->sha256, KC_HEX_LEN) != 0)
    return -1; /* not the blob asked for next */
  const char *p = b->line + KC_HEX_LEN + 1;
  if (*p < '0' || *p > '9')
    return -1;
  unsigned long long len = strtoull(p, &end, 10);
  if (*end != ' ')
    return -1;
  const char *how = end + 1;
  if (!strcmp(how, "missing")) { /* left for a GET (S3 read-through) */
    next_item(b);
    return 0;
  }
  b->zstd = !strcmp(how, "zstd");
  if (!b->zstd && strcmp(how, "raw"))
    return -1;
  b->in_data = 1;
  b->left = len;
  b->got = b->zbad = 0;
  b->zleft = 0;
  b->want = f->size;
  /* A raw blob of another size, or a frame larger than a frame of its
   * content can be (zstd's bound), is refused before its bytes. */
  if (b->zstd ? len > ZSTD_compressBound((size_t)f->size) : len != f->size) {
    bfail(r, KC_DIGEST_MISMATCH,
          "fetch blob %.16s...: the server sends %llu bytes %s for %llu "
          "declared; discarded",
          f->sha256, len, how, (unsigned long long)f->size);
    b->skip = 1;
  } else if (b->zstd) {
    ZSTD_DCtx_reset(b->dc, ZSTD_reset_session_only);
  }
  if (!b->skip && b->cap < f->size + 1) {
    char *nb = realloc(b->buf, (size_t)f->size + 1);
    if (!nb)
      return -1; /* the rest of this batch is left to GETs */
    b->buf = nb;
    b->cap = (size_t)f->size + 1;
  }
  if (!b->left)
    item_done(r, b);
  return 0;
}

/* Some of the current item's bytes. A frame decodes into buf, whose one
 * byte beyond the manifest's size tells a too-large content. */
static void on_bytes(batch *b, const char *p, size_t k) {
  if (b->skip)
    return;
  if (!b->zstd) {
    memcpy(b->buf + b->got, p, k);
    b->got += k;
    return;
  }
  ZSTD_inBuffer in = {p, k, 0};
  ZSTD_outBuffer ob = {b->buf, (size_t)b->want + 1, (size_t)b->got};
  while (!b->zbad && in.pos < in.size) {
    size_t in0 = in.pos, out0 = ob.pos;
    size_t rc = ZSTD_decompressStream(b->dc, &ob, &in);
    if (!ZSTD_isError(rc) && ob.pos > b->want)
      b->zbad = 2; /* too large */
    else if (ZSTD_isError(rc) || (in.pos == in0 && ob.pos == out0))
      b->zbad = 1;
    else
      b->zleft = rc;
  }
  b->got = ob.pos;
}

static size_t on_data(char *data, size_t size, size_t nmemb, void *arg) {
  batch *b = arg;
  brun *r = b->r;
  size_t n = size * nmemb;
  if (!b->status_seen) {
    long status = 0;
    curl_easy_getinfo(b->h, CURLINFO_RESPONSE_CODE, &status);
    b->status_seen = 1;
    b->not_ok = status != 200;
  }
  if (b->not_ok) /* an error's JSON: read and dropped */
    return n;
  for (const char *p = data, *end = data + n; p < end;) {
    if (b->cur >= b->n)
      return 0; /* more than asked for: stop */
    if (!b->in_data) {
      const char *nl = memchr(p, '\n', (size_t)(end - p));
      size_t k = (size_t)((nl ? nl : end) - p);
      if (b->line_len + k >= LINE_CAP)
        return 0;
      memcpy(b->line + b->line_len, p, k);
      b->line_len += k;
      p += k + (nl != NULL);
      if (nl && on_line(r, b) != 0)
        return 0;
      continue;
    }
    size_t k = (size_t)(end - p) < b->left ? (size_t)(end - p) : b->left;
    on_bytes(b, p, k);
    b->left -= k;
    p += k;
    if (!b->left)
      item_done(r, b);
  }
  return n;
}

/* The request of batch k on b, added to the multi handle when `multi`;
 * 0, or -1 (its files are left to GETs). */
static int start_on(brun *r, batch *b, size_t k, int multi) {
  long budget = kcc_http_budget_ms(r->c);
  size_t from = r->starts[k], n = r->starts[k + 1] - from;
  if (budget <= 0)
    return -1; /* the GETs say the deadline passed */
  free(b->body);
  if (!(b->body = malloc(n * (KC_HEX_LEN + 3) + 16)))
    return -1;
  size_t len = (size_t)sprintf(b->body, "{\"digests\":[");
  for (size_t i = 0; i < n; i++)
    len += (size_t)sprintf(b->body + len, "%s\"%s\"", i ? "," : "",
                           r->files[r->idx[from + i]]->sha256);
  len += (size_t)sprintf(b->body + len, "]}");
  b->idx = r->idx + from;
  b->n = n;
  b->cur = 0;
  b->in_data = b->skip = b->status_seen = b->not_ok = 0;
  b->line_len = 0;
  curl_easy_reset(b->h);
  kcc_http_setup(r->c, b->h, budget);
  curl_easy_setopt(b->h, CURLOPT_URL, r->url);
  curl_easy_setopt(b->h, CURLOPT_HTTPHEADER, r->hdrs);
  curl_easy_setopt(b->h, CURLOPT_POSTFIELDS, b->body);
  curl_easy_setopt(b->h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
  curl_easy_setopt(b->h, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(b->h, CURLOPT_WRITEDATA, b);
  curl_easy_setopt(b->h, CURLOPT_BUFFERSIZE, 256L << 10);
  if (multi && curl_multi_add_handle(r->c->multi, b->h) != CURLM_OK)
    return -1;
  b->busy = multi;
  return 0;
}

static int start(brun *r, batch *b, size_t k) { return start_on(r, b, k, 1); }

/* A batch's request ended: a server without the route is remembered. */
static void finish_on(brun *r, batch *b, int multi) {
  long status = 0;
  curl_easy_getinfo(b->h, CURLINFO_RESPONSE_CODE, &status);
  if (multi)
    curl_multi_remove_handle(r->c->multi, b->h);
  b->busy = 0;
  if (status == 404 || status == 405)
    r->c->no_batch = 1;
}

static void finish(brun *r, batch *b) { finish_on(r, b, 1); }

static void start_next(brun *r, batch *b, int *active) {
  while (r->next < r->nb && !r->c->no_batch)
    if (start(r, b, r->next++) == 0) {
      (*active)++;
      return;
    }
}

/* One batch: on the client's own handle, which keeps the connection its
 * lookup just used (a multi handle's transfer would open another). */
static void run_one(brun *r, batch *b) {
  CURL *own = b->h;
  b->h = r->c->easy;
  if (start_on(r, b, 0, 0) == 0) {
    curl_easy_perform(b->h);
    finish_on(r, b, 0);
  }
  b->h = own;
}

static void run(brun *r, batch *bs, int nx) {
  int active = 0, running;
  if (r->nb == 1) {
    run_one(r, &bs[0]);
    return;
  }
  for (int k = 0; k < nx; k++)
    start_next(r, &bs[k], &active);
  while (active > 0) {
    if (curl_multi_perform(r->c->multi, &running) != CURLM_OK)
      break;
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(r->c->multi, &left))) {
      if (msg->msg != CURLMSG_DONE)
        continue;
      batch *b = NULL;
      for (int k = 0; k < nx && !b; k++)
        if (bs[k].h == msg->easy_handle)
          b = &bs[k];
      finish(r, b);
      active--;
      start_next(r, b, &active);
    }
    if (active > 0)
      curl_multi_poll(r->c->multi, NULL, 0, 200, NULL);
  }
}

/* Cuts the files into batches: contiguous, each under the caps and near
 * an even share of the files and bytes, at least one batch per
 * connection. 0, or -1 out of memory. */
static int cut(brun *r, const size_t *todo, size_t n, int parallel) {
  uint64_t bytes = 0;
  for (size_t i = 0; i < n; i++)
    bytes += r->files[todo[i]]->size;
  size_t want = (n + KCC_BATCH_ITEMS - 1) / KCC_BATCH_ITEMS;
  size_t by_bytes = (size_t)((bytes + KCC_BATCH_BYTES - 1) / KCC_BATCH_BYTES);
  size_t conns = (size_t)(parallel > 0 ? parallel : 1);
  size_t by_work = (size_t)(bytes / KCC_BATCH_CONN_BYTES) + 1;
  if (conns > (n + KCC_BATCH_MIN - 1) / KCC_BATCH_MIN)
    conns = (n + KCC_BATCH_MIN - 1) / KCC_BATCH_MIN;
  if (conns > by_work)
    conns = by_work;
  want = want > by_bytes ? want : by_bytes;
  want = want > conns ? want : conns;
  want = want < n ? want : n;
  size_t per_n = (n + want - 1) / want;
  uint64_t per_b = (bytes + want - 1) / want;
  if (!(r->starts = calloc(n + 1, sizeof *r->starts)) ||
      !(r->idx = malloc((n ? n : 1) * sizeof *r->idx)))
    return -1;
  memcpy(r->idx, todo, n * sizeof *todo);
  uint64_t b = 0;
  for (size_t i = 0, cnt = 0; i < n; i++) {
    uint64_t s = r->files[todo[i]]->size;
    if (cnt && (cnt >= per_n || b + s > per_b + per_b / 4 ||
                b + s > KCC_BATCH_BYTES)) {
      r->starts[++r->nb] = i;
      cnt = 0;
      b = 0;
    }
    cnt++;
    b += s;
  }
  if (n)
    r->starts[++r->nb] = n;
  return 0;
}

/* The client's headers, the JSON body's type and Accept-Encoding: zstd. */
static struct curl_slist *headers_of(const struct curl_slist *l) {
  struct curl_slist *t = kcc_with_header(l, "Content-Type: application/json");
  struct curl_slist *n = t ? kcc_with_header(t, "Accept-Encoding: zstd") : NULL;
  curl_slist_free_all(t);
  return n;
}

kc_err kcc_fetch_batched(kc_client *c, const kc_file *const *files,
                         const size_t *todo, size_t n, char *state,
                         uint64_t *fetched, char *err) {
  brun r = {.c = c, .files = files, .state = state, .err = err};
  int nx = 0;
  batch *bs = NULL;
  *fetched = 0;
  if (!n || c->no_batch || !c->url)
    return KC_OK;
  snprintf(r.url, sizeof r.url, "%s/v1/blobs/fetch", c->url);
  if (cut(&r, todo, n, c->parallel) == 0 && (r.hdrs = headers_of(c->hdrs))) {
    nx = c->parallel < (int)r.nb ? c->parallel : (int)r.nb;
    bs = calloc((size_t)(nx > 0 ? nx : 1), sizeof *bs);
  }
  int ready = bs != NULL;
  for (int k = 0; ready && k < nx; k++)
    ready = (bs[k].r = &r) && (bs[k].h = curl_easy_init()) &&
            (bs[k].dc = ZSTD_createDCtx());
  if (ready) {
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++)
      bytes += files[todo[i]]->size;
    writer_start(&r, n, bytes);
    run(&r, bs, nx);
    writer_stop(&r);
  }
  for (int k = 0; bs && k < nx; k++) {
    if (bs[k].busy)
      curl_multi_remove_handle(c->multi, bs[k].h);
    if (bs[k].h)
      curl_easy_cleanup(bs[k].h);
    ZSTD_freeDCtx(bs[k].dc);
    free(bs[k].buf);
    free(bs[k].body);
  }
  free(bs);
  free(r.idx);
  free(r.starts);
  curl_slist_free_all(r.hdrs);
  *fetched = r.fetched;
  /* out of memory here only costs the batching: the GETs follow */
  return r.first;
}
