/* fetch.c: parallel blob downloads with curl multi: up to c->parallel
 * transfers over the multi handle's connection pool, each streamed into a
 * temporary file while it is hashed; only a blob whose bytes hash to its name
 * is renamed into the cache. Nothing unverified is ever visible. */
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

/* Blobs are asked for with Accept-Encoding: zstd (issue 18): a server that
 * holds one compressed sends the frame as held, decoded here while it
 * streams into the temporary file; the SHA-256 and the size checked are the
 * content's, and the cache keeps the content (the loader reads it as is). */
#define ZOUT (128 * 1024)

typedef struct xfer {
  CURL *h;
  size_t idx; /* into the digest list */
  FILE *f;
  char tmp[PATH_MAX];
  kc_sha256 *sha;
  uint64_t got, want; /* want: the manifest's size */
  int too_big;        /* more bytes arrived than want: cut off */
  int zstd;           /* the response is Content-Encoding: zstd */
  int zbad;           /* the frame did not decode */
  size_t zleft;       /* the decoder's last hint: 0 at a frame's end */
  ZSTD_DCtx *dc;
  char *zout;
  struct curl_slist *hdrs; /* the client's headers and Accept-Encoding */
  char url[512];
  char ebuf[CURL_ERROR_SIZE];
} xfer;

typedef struct fetch_run {
  kc_client *c;
  const kc_file *const *files;
  size_t n, next;
  char *ok;
  uint64_t fetched;
  kc_err first;
  char *err;
} fetch_run;

static size_t take(xfer *x, const char *data, size_t n);

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
    if (ob.pos && take(x, x->zout, ob.pos) != ob.pos)
      return 0;
  }
  return n;
}

static size_t on_data(char *data, size_t size, size_t nmemb, void *arg) {
  xfer *x = arg;
  size_t n = size * nmemb;
  if (x->zstd)
    return on_frame(x, data, n);
  return take(x, data, n);
}

static size_t take(xfer *x, const char *data, size_t n) {
  if (n > x->want - x->got) { /* short return: libcurl aborts the transfer */
    x->too_big = 1;
    return 0;
  }
  if (kc_sha256_update(x->sha, data, n) != KC_OK ||
      fwrite(data, 1, n, x->f) != n)
    return 0;
  x->got += n;
  return n;
}

/* Keeps the first failure; the other transfers go on (their blobs are
 * still worth having). */
__attribute__((format(printf, 3, 4))) static void
fail(fetch_run *r, kc_err e, const char *fmt, ...) {
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

/* Arms x for digest idx; 0 on success. */
static int start(fetch_run *r, xfer *x, size_t idx) {
  char e2[KC_ERRBUF_SIZE];
  const char *digest = r->files[idx]->sha256;
  x->idx = idx;
  x->got = 0;
  x->want = r->files[idx]->size;
  x->too_big = 0;
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
  int fd = kcc_cache_tmp(r->c, x->tmp, e2);
  if (fd < 0 || !(x->f = fdopen(fd, "wb"))) {
    if (fd >= 0)
      close(fd);
    fail(r, KC_IO, "%s", e2);
    return -1;
  }
  kc_sha256_reset(x->sha);
  snprintf(x->url, sizeof x->url, "%s/v1/blobs/%s", r->c->url, digest);
  curl_easy_reset(x->h);
  kcc_http_setup(r->c, x->h, budget);
  curl_easy_setopt(x->h, CURLOPT_URL, x->url);
  curl_easy_setopt(x->h, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(x->h, CURLOPT_WRITEDATA, x);
  curl_easy_setopt(x->h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(x->h, CURLOPT_HEADERDATA, x);
  if (x->hdrs) /* decoded here, not by libcurl (which may lack zstd) */
    curl_easy_setopt(x->h, CURLOPT_HTTPHEADER, x->hdrs);
  /* A Content-Length above the size is refused before the body. */
  curl_easy_setopt(x->h, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)x->want);
  curl_easy_setopt(x->h, CURLOPT_PRIVATE, x);
  curl_easy_setopt(x->h, CURLOPT_ERRORBUFFER, x->ebuf);
  x->ebuf[0] = '\0';
  curl_multi_add_handle(r->c->multi, x->h);
  return 0;
}

static int deadline_passed(const kc_client *c) {
  return c->deadline_ms && kcc_now_ms() >= c->deadline_ms;
}

/* Verifies and renames a finished transfer. */
static void finish(fetch_run *r, xfer *x, CURLcode rc) {
  const char *digest = r->files[x->idx]->sha256;
  char d[KC_HEX_LEN + 1], dst[PATH_MAX], dir[PATH_MAX];
  long status = 0;
  curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &status);
  int bad = fclose(x->f) != 0;
  x->f = NULL;
  if (x->zbad || (rc == CURLE_OK && x->zstd && x->zleft))
    fail(r, KC_DIGEST_MISMATCH,
         "GET blob %.16s...: the server's zstd frame is corrupt or cut "
         "short; discarded", digest);
  else if (x->too_big || rc == CURLE_FILESIZE_EXCEEDED)
    fail(r, KC_DIGEST_MISMATCH,
         "GET blob %.16s...: the server sent more than the %llu bytes the "
         "manifest declares; cut off",
         digest, (unsigned long long)x->want);
  else if (rc == CURLE_OPERATION_TIMEDOUT && deadline_passed(r->c))
    fail(r, KC_DEADLINE, "GET blob %s: the deadline passed", digest);
  else if (rc != CURLE_OK)
    fail(r, rc == CURLE_OPERATION_TIMEDOUT ? KC_TIMEOUT : KC_UNAVAILABLE,
         "GET blob %s: %s", digest,
         x->ebuf[0] ? x->ebuf : curl_easy_strerror(rc));
  else if (status != 200)
    fail(r, status == 404 ? KC_NOT_FOUND : KC_PROTOCOL,
         "GET blob %s: server answered %ld", digest, status);
  else if (bad)
    fail(r, KC_IO, "write %s: disk error", x->tmp);
  else if (kc_sha256_final(x->sha, d) || strcmp(d, digest) != 0)
    fail(r, KC_DIGEST_MISMATCH,
         "blob %.16s... from the server hashes to %.16s...; discarded",
         digest, d);
  else {
    snprintf(dir, sizeof dir, "%s/blobs/%.2s", r->c->cache_dir, digest);
    mkdir(dir, 0755);
    kc_cache_blob_path(r->c, digest, dst, sizeof dst);
    if (rename(x->tmp, dst) == 0) {
      if (r->ok)
        r->ok[x->idx] = 1;
      r->fetched += x->got;
      return;
    }
    fail(r, KC_IO, "rename into %s: %s", dst, strerror(errno));
  }
  unlink(x->tmp);
}

/* The next digest that still needs fetching, or n. */
static size_t next_needed(fetch_run *r) {
  while (r->next < r->n) {
    size_t i = r->next++;
    const kc_file *f = r->files[i];
    if (!kcc_cache_blob_ok(r->c, f->sha256, f->size)) {
      int dup = 0; /* a blob shared by two bundles is fetched once */
      for (size_t j = 0; j < i && !dup; j++)
        dup = !strcmp(r->files[j]->sha256, f->sha256);
      if (!dup)
        return i;
    }
    if (r->ok)
      r->ok[i] = 1;
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

/* The client's headers plus Accept-Encoding: zstd; NULL out of memory. */
static struct curl_slist *accept_zstd(const struct curl_slist *l) {
  struct curl_slist *n = NULL, *t;
  for (; l; l = l->next, n = t)
    if (!(t = curl_slist_append(n, l->data)))
      break;
  if (!l && (t = curl_slist_append(n, "Accept-Encoding: zstd")))
    return t;
  curl_slist_free_all(n);
  return NULL;
}

kc_err kcc_fetch_blobs(kc_client *c, const kc_file *const *files, size_t n,
                       char *ok, uint64_t *fetched, char *err) {
  if (!c->url)
    return kc_errf(err, KC_UNAVAILABLE, "no server configured");
  int nx = c->parallel < (int)n ? c->parallel : (int)n;
  xfer *xs = calloc(nx ? (size_t)nx : 1, sizeof *xs);
  fetch_run r = {c, files, n, 0, ok, 0, KC_OK, err};
  kc_err e = xs ? KC_OK : kc_errf(err, KC_NOMEM, "out of memory");
  for (int k = 0; !e && k < nx; k++)
    if (!(xs[k].h = curl_easy_init()) || !(xs[k].sha = kc_sha256_new()) ||
        !(xs[k].dc = ZSTD_createDCtx()) || !(xs[k].zout = malloc(ZOUT)) ||
        !(xs[k].hdrs = accept_zstd(c->hdrs)))
      e = kc_errf(err, KC_NOMEM, "out of memory");
  if (!e)
    e = run(&r, xs, nx);
  for (int k = 0; xs && k < nx; k++) {
    if (xs[k].f) { /* interrupted: leave nothing behind */
      curl_multi_remove_handle(c->multi, xs[k].h);
      fclose(xs[k].f);
      unlink(xs[k].tmp);
    }
    if (xs[k].h)
      curl_easy_cleanup(xs[k].h);
    kc_sha256_free(xs[k].sha);
    ZSTD_freeDCtx(xs[k].dc);
    free(xs[k].zout);
    curl_slist_free_all(xs[k].hdrs);
  }
  free(xs);
  if (fetched)
    *fetched = r.fetched;
  return e;
}
