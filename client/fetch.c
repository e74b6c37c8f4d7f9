/* fetch.c: parallel blob downloads with curl multi: up to c->parallel
 * transfers over the multi handle's connection pool, each hashed while it
 * streams; only a blob whose bytes hash to its name is renamed into the
 * cache. Nothing unverified is ever visible.
 *
 * File-system cost is per blob, so it is kept to a small constant (issue
 * 17): a blob up to KCC_FETCH_MEM is held in memory and, once verified,
 * written to a temporary file with one write and renamed into place
 * (open, write, close, rename); a larger one streams into its temporary
 * file with raw writes. Fan-out directories are made once per client, and a
 * blob is probed for only where its directory existed.
 *
 * Small blobs go first many per request (fetch_batch.c: POST
 * /v1/blobs/fetch); the GETs here take what that did not bring, and the
 * blobs too large to hold in memory. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "client_internal.h"

/* Blobs up to this size are verified in memory before touching the disk. */
#define KCC_FETCH_MEM ((uint64_t)1 << 20)
/* Blobs are asked for with Accept-Encoding: zstd: a server that
 * holds one compressed sends the frame as held, decoded here while it
 * streams into the temporary file; the SHA-256 and the size checked are the
 * content's, and the cache keeps the content (the loader reads it as is). */
#define ZOUT (128 * 1024)

typedef struct xfer {
  CURL *h;
  size_t idx; /* into the digest list */
  kcc_sink s; /* fd: a large blob's temporary file, -1: none (in memory,
                 buf, cap allocated); max: the manifest's size */
  size_t cap;
  char tmp[PATH_MAX];
  int busy;     /* a transfer is armed (its tmp file, if any, open) */
  int set_up;   /* the handle's fixed options are set */
  int zstd;     /* the response is Content-Encoding: zstd */
  int zbad;     /* the frame did not decode */
  size_t zleft; /* the decoder's last hint: 0 at a frame's end */
  ZSTD_DCtx *dc;
  char *zout;
  char url[512];
  char ebuf[CURL_ERROR_SIZE];
} xfer;

typedef struct fetch_run {
  kc_client *c;
  const kc_file *const *files;
  size_t *head; /* head[i]: the first file with files[i]'s digest (a
                    blob shared by two bundles is fetched once) */
  size_t n, next;
  size_t *todo; /* the distinct blobs not cached, in list order */
  size_t n_todo;
  char *state;             /* per file: KCC_FETCH_* (duplicates: see head) */
  struct curl_slist *hdrs; /* the client's and Accept-Encoding, for all */
  uint64_t fetched;
  kc_err first;
  char *err;
} fetch_run;

static size_t on_header(char *data, size_t size, size_t nmemb, void *arg) {
  xfer *x = arg;
  size_t n = size * nmemb;
  static const char name[] = "content-encoding:";
  if (n > sizeof name && !strncasecmp(data, name, sizeof name - 1)) {
    const char *v = data + sizeof name - 1;
    while (*v == ' ' || *v == '\t')
      v++;
    x->zstd = !strncasecmp(v, "zstd", 4);
  }
  return n;
}

/* A frame's piece: decoded, each output piece taken as plain bytes. */
static size_t on_frame(xfer *x, const char *data, size_t n) {
  ZSTD_inBuffer in = {data, n, 0};
  while (in.pos < in.size) {
    ZSTD_outBuffer ob = {x->zout, ZOUT, 0};
    size_t r = ZSTD_decompressStream(x->dc, &ob, &in);
    if (ZSTD_isError(r)) {
      x->zbad = 1;
      return 0;
    }
    x->zleft = r;
    if (ob.pos && kcc_sink_take(&x->s, x->zout, ob.pos) != ob.pos)
      return 0;
  }
  return n;
}

static size_t on_data(char *data, size_t size, size_t nmemb, void *arg) {
  xfer *x = arg;
  size_t n = size * nmemb;
  if (x->zstd)
    return on_frame(x, data, n);
  return kcc_sink_take(&x->s, data, n); /* short: libcurl aborts */
}

/* Keeps the first failure; the other transfers go on (their blobs are
 * still worth having). */
__attribute__((format(printf, 3, 4))) static void fail(fetch_run *r, kc_err e,
                                                       const char *fmt, ...) {
  va_list ap;
  if (r->first)
    return;
  r->first = e;
  if (!r->err)
    return;
  va_start(ap, fmt);
  vsnprintf(r->err, KC_ERRBUF_SIZE, fmt, ap);
  va_end(ap);
}

/* Where x's bytes go: memory for a small blob, its tmp file for a large
 * one. 0 on success. */
static int arm(fetch_run *r, xfer *x) {
  char e2[KC_ERRBUF_SIZE];
  x->s.fd = -1;
  if (x->s.max > KCC_FETCH_MEM) {
    if ((x->s.fd = kcc_cache_tmp(r->c, x->tmp, e2)) < 0) {
      fail(r, KC_IO, "%s", e2);
      return -1;
    }
  } else if (x->cap < x->s.max) {
    char *b = realloc(x->s.buf, (size_t)x->s.max);
    if (!b) {
      fail(r, KC_NOMEM, "out of memory");
      return -1;
    }
    x->s.buf = b;
    x->cap = (size_t)x->s.max;
  }
  x->busy = 1;
  return 0;
}

/* Arms x for digest idx; 0 on success. */
static int start(fetch_run *r, xfer *x, size_t idx) {
  const char *digest = r->files[idx]->sha256;
  x->idx = idx;
  x->s.got = 0;
  x->s.max = r->files[idx]->size;
  x->s.too_big = x->s.write_bad = 0;
  x->zstd = x->zbad = 0;
  x->zleft = 0;
  ZSTD_DCtx_reset(x->dc, ZSTD_reset_session_only);
  /* A passed deadline leaves no budget, and a timeout of 0 is libcurl's
   * "no limit": a transfer started now would wait on a stalled server
   * forever. */
  long budget = kcc_http_budget_ms(r->c);
  if (budget <= 0) {
    fail(r, KC_DEADLINE, "GET blob %s: the deadline passed", digest);
    return -1;
  }
  if (arm(r, x) != 0)
    return -1;
  kc_sha256_reset(x->s.sha);
  snprintf(x->url, sizeof x->url, "%s/v1/blobs/%s", r->c->url, digest);
  if (!x->set_up) { /* options stay on the handle from one blob to the next */
    kcc_http_setup(r->c, x->h, budget);
    curl_easy_setopt(x->h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(x->h, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(x->h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(x->h, CURLOPT_HEADERDATA, x);
    /* decoded here, not by libcurl (which may lack zstd) */
    curl_easy_setopt(x->h, CURLOPT_HTTPHEADER, r->hdrs);
    curl_easy_setopt(x->h, CURLOPT_PRIVATE, x);
    curl_easy_setopt(x->h, CURLOPT_ERRORBUFFER, x->ebuf);
    /* fewer, larger reads: a 48 KiB blob in one or two instead of four */
    curl_easy_setopt(x->h, CURLOPT_BUFFERSIZE, 256L << 10);
    x->set_up = 1;
  }
  curl_easy_setopt(x->h, CURLOPT_TIMEOUT_MS, budget);
  curl_easy_setopt(x->h, CURLOPT_URL, x->url);
  /* A Content-Length above the size is refused before the body. */
  curl_easy_setopt(x->h, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)x->s.max);
  x->ebuf[0] = '\0';
  curl_multi_add_handle(r->c->multi, x->h);
  return 0;
}

/* A failed transfer: transport.c maps libcurl's code and words it. */
static void fail_curl(fetch_run *r, xfer *x, CURLcode rc) {
  char e2[KC_ERRBUF_SIZE], path[128];
  snprintf(path, sizeof path, "/v1/blobs/%s", r->files[x->idx]->sha256);
  fail(r,
       kcc_http_curl_error(r->c, r->c->deadline_ms, rc, "GET", path, x->ebuf,
                           e2),
       "%s", e2);
}

/* Why a finished transfer is not a good blob: KC_OK when it is. */
static kc_err check(fetch_run *r, xfer *x, CURLcode rc, int bad) {
  const char *digest = r->files[x->idx]->sha256;
  char d[KC_HEX_LEN + 1];
  long status = 0;
  curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &status);
  if (x->zbad || (rc == CURLE_OK && x->zstd && x->zleft))
    fail(r, KC_DIGEST_MISMATCH,
         "GET blob %.16s...: the server's zstd frame is corrupt or cut "
         "short; discarded",
         digest);
  else if (x->s.too_big || rc == CURLE_FILESIZE_EXCEEDED)
    fail(r, KC_DIGEST_MISMATCH,
         "GET blob %.16s...: the server sent more than the %llu bytes the "
         "manifest declares; cut off",
         digest, (unsigned long long)x->s.max);
  else if (x->s.write_bad) /* the write error libcurl reports is ours */
    fail(r, KC_IO, "write %s: disk error", x->tmp);
  else if (rc != CURLE_OK)
    fail_curl(r, x, rc);
  else if (status != 200)
    fail(r, status == 404 ? KC_NOT_FOUND : KC_PROTOCOL,
         "GET blob %s: server answered %ld", digest, status);
  else if (bad)
    fail(r, KC_IO, "write %s: disk error", x->tmp);
  else if (kc_sha256_final(x->s.sha, d) || strcmp(d, digest) != 0)
    fail(r, KC_DIGEST_MISMATCH,
         "blob %.16s... from the server hashes to %.16s...; discarded", digest,
         d);
  else
    return KC_OK;
  return KC_IO; /* fail() kept the first failure and its sentence */
}

/* Verifies a finished transfer and renames it into place: a small blob is
 * written only now, once, after its hash matched. */
static void finish(fetch_run *r, xfer *x, CURLcode rc) {
  const char *digest = r->files[x->idx]->sha256;
  char e2[KC_ERRBUF_SIZE];
  int bad = x->s.fd >= 0 && close(x->s.fd) != 0;
  int on_disk = x->s.fd >= 0;
  x->s.fd = -1;
  x->busy = 0;
  if (check(r, x, rc, bad) != KC_OK) {
    if (on_disk)
      unlink(x->tmp);
    return;
  }
  /* both remove the temporary file when they fail */
  kc_err e = on_disk ? kcc_cache_blob_publish(r->c, x->tmp, digest, e2)
                     : kcc_cache_blob_write(r->c, x->s.buf, (size_t)x->s.got,
                                            digest, e2);
  if (e) {
    fail(r, e, "%s", e2);
    return;
  }
  r->state[x->idx] = KCC_FETCH_DONE;
  r->fetched += x->s.got;
}

static int cmp_digest(const void *a, const void *b) {
  const kc_file *const *x = *(const kc_file *const *const *)a;
  const kc_file *const *y = *(const kc_file *const *const *)b;
  int c = strcmp((*x)->sha256, (*y)->sha256);
  return c ? c : (x < y ? -1 : x > y);
}

/* head[] by sorting (O(n log n); ties keep the list's order). */
static int mark_dups(fetch_run *r) {
  const kc_file *const **p = calloc(r->n + 1, sizeof *p);
  if (!p || !(r->head = calloc(r->n + 1, sizeof *r->head))) {
    free(p);
    return -1;
  }
  for (size_t i = 0; i < r->n; i++)
    p[i] = &r->files[i];
  qsort(p, r->n, sizeof *p, cmp_digest);
  for (size_t k = 0, head = 0; k < r->n; k++) {
    if (k && strcmp((*p[k])->sha256, (*p[k - 1])->sha256) != 0)
      head = k;
    r->head[p[k] - r->files] = (size_t)(p[head] - r->files);
  }
  free(p);
  return 0;
}

/* The distinct blobs not cached yet into r->todo (the others are DONE);
 * a duplicate's state is its first copy's (set at the end). 0, or -1 out
 * of memory. */
static int find_todo(fetch_run *r) {
  if (!(r->todo = malloc((r->n ? r->n : 1) * sizeof *r->todo)))
    return -1;
  for (size_t i = 0; i < r->n; i++) {
    const kc_file *f = r->files[i];
    if (r->head[i] != i)
      continue;
    if (kcc_cache_blob_maybe(r->c, f->sha256, f->size))
      r->state[i] = KCC_FETCH_DONE;
    else
      r->todo[r->n_todo++] = i;
  }
  return 0;
}

/* The small blobs of the list, many per request; what they do not bring
 * stays TODO for the GETs. */
static void batched(fetch_run *r) {
  size_t *small = malloc((r->n_todo ? r->n_todo : 1) * sizeof *small), ns = 0;
  uint64_t got = 0;
  if (!small)
    return; /* the GETs take them all */
  for (size_t k = 0; k < r->n_todo; k++)
    if (r->files[r->todo[k]]->size <= KCC_FETCH_MEM)
      small[ns++] = r->todo[k];
  kc_err e =
      kcc_fetch_batched(r->c, r->files, small, ns, r->state, &got, r->err);
  if (e && !r->first)
    r->first = e; /* its sentence is in r->err */
  r->fetched += got;
  free(small);
}

/* How many GET transfers to make: one per blob the batches left, at most
 * parallel. */
static int gets_left(const fetch_run *r, int parallel) {
  int m = 0;
  for (size_t k = 0; k < r->n_todo && m < parallel; k++)
    m += r->state[r->todo[k]] == KCC_FETCH_TODO;
  return m;
}

/* The next blob a GET must bring, or n. */
static size_t next_needed(fetch_run *r) {
  while (r->next < r->n_todo) {
    size_t i = r->todo[r->next++];
    if (r->state[i] == KCC_FETCH_TODO)
      return i;
  }
  return r->n;
}

static void drain(fetch_run *r, int *active) {
  CURLMsg *msg;
  int left;
  while ((msg = curl_multi_info_read(r->c->multi, &left))) {
    if (msg->msg != CURLMSG_DONE)
      continue;
    xfer *x = NULL;
    CURLcode rc = msg->data.result;
    curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&x);
    curl_multi_remove_handle(r->c->multi, x->h);
    finish(r, x, rc);
    (*active)--;
    size_t i = next_needed(r);
    if (i < r->n && start(r, x, i) == 0)
      (*active)++;
  }
}

static kc_err run(fetch_run *r, xfer *xs, int nx) {
  int active = 0, running = 1;
  for (int k = 0; k < nx; k++) {
    size_t i = next_needed(r);
    if (i < r->n && start(r, &xs[k], i) == 0)
      active++;
  }
  while (active > 0) {
    if (curl_multi_perform(r->c->multi, &running) != CURLM_OK)
      break;
    drain(r, &active);
    if (active > 0)
      curl_multi_poll(r->c->multi, NULL, 0, 200, NULL);
  }
  return r->first;
}

kc_err kcc_fetch_blobs(kc_client *c, const kc_file *const *files, size_t n,
                       char *ok, uint64_t *fetched, char *err) {
  if (!c->url)
    return kc_errf(err, KC_UNAVAILABLE, "no server configured");
  fetch_run r = {.c = c, .files = files, .n = n, .err = err};
  kcc_cache_forget_dirs(c); /* a look at a directory holds for one fetch */
  kc_err e = (r.state = calloc(n ? n : 1, 1)) && mark_dups(&r) == 0 &&
                     find_todo(&r) == 0
                 ? KC_OK
                 : kc_errf(err, KC_NOMEM, "out of memory");
  if (!e)
    batched(&r);
  /* transfers only for what the batches left (usually nothing) */
  int nx = e ? 0 : gets_left(&r, c->parallel);
  xfer *xs = calloc(nx ? (size_t)nx : 1, sizeof *xs);
  if (!e &&
      (!xs ||
       (nx && !(r.hdrs = kcc_with_header(c->hdrs, "Accept-Encoding: zstd")))))
    e = kc_errf(err, KC_NOMEM, "out of memory");
  for (int k = 0; xs && k < nx; k++)
    xs[k].s.fd = -1;
  for (int k = 0; !e && k < nx; k++)
    if (!(xs[k].h = curl_easy_init()) || !(xs[k].s.sha = kc_sha256_new()) ||
        !(xs[k].dc = ZSTD_createDCtx()) || !(xs[k].zout = malloc(ZOUT)))
      e = kc_errf(err, KC_NOMEM, "out of memory");
  if (!e)
    e = run(&r, xs, nx);
  for (int k = 0; xs && k < nx; k++) {
    if (xs[k].busy) { /* interrupted: leave nothing behind */
      curl_multi_remove_handle(c->multi, xs[k].h);
      if (xs[k].s.fd >= 0) {
        close(xs[k].s.fd);
        unlink(xs[k].tmp);
      }
    }
    free(xs[k].s.buf);
    if (xs[k].h)
      curl_easy_cleanup(xs[k].h);
    kc_sha256_free(xs[k].s.sha);
    ZSTD_freeDCtx(xs[k].dc);
    free(xs[k].zout);
  }
  free(xs);
  curl_slist_free_all(r.hdrs);
  for (size_t i = 0; ok && r.head && i < n; i++)  /* a duplicate is there */
    ok[i] = r.state[r.head[i]] == KCC_FETCH_DONE; /* when its first copy is */
  free(r.head);
  free(r.todo);
  free(r.state);
  if (fetched)
    *fetched = r.fetched;
  return e;
}
