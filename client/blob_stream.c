/* blob_stream.c: one blob streamed from kcached to a file descriptor,
 * hashed on the way and cut off at a size limit: a blob is never held in
 * memory, so a server that answers without end costs the caller `max`
 * bytes of output at most, not its memory. */
#include <stdio.h>
#include <string.h>

#include "client_internal.h"

/* An error answer's JSON is kept up to this much (the rest is dropped). */
#define ERR_BODY_MAX 4096

size_t kcc_sink_take(kcc_sink *s, const char *data, size_t n) {
  size_t k = n < s->max - s->got ? n : (size_t)(s->max - s->got);
  if (k < n) /* up to max taken; the short return stops the transfer */
    s->too_big = 1;
  if (kc_sha256_update(s->sha, data, k) != KC_OK)
    return 0;
  if (s->fd < 0) {
    if (k) /* memcpy of 0 bytes from or to NULL is still undefined */
      memcpy(s->buf + s->got, data, k);
  } else if (kcc_write_all(s->fd, data, k) != KC_OK) {
    s->write_bad = 1;
    return 0;
  }
  s->got += k;
  return k;
}

typedef struct sink {
  CURL *h;
  kcc_sink s;                   /* to the caller's descriptor */
  long status;                  /* 0 until the body starts */
  char ebody[ERR_BODY_MAX + 1]; /* not a 200: its body, for the message */
  size_t elen;
} sink;

static size_t on_chunk(char *data, size_t size, size_t nmemb, void *arg) {
  sink *s = arg;
  size_t n = size * nmemb;
  if (!s->status)
    curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &s->status);
  if (s->status != 200) { /* an error's JSON: to memory, never to fd */
    size_t k = n < ERR_BODY_MAX - s->elen ? n : ERR_BODY_MAX - s->elen;
    memcpy(s->ebody + s->elen, data, k);
    s->elen += k;
    return n;
  }
  return kcc_sink_take(&s->s, data, n);
}

/* Only a 200's body goes to the descriptor. */
static kc_err stream_get(kc_client *c, const char *path, sink *s, char *err) {
  char url[2048], ebuf[CURL_ERROR_SIZE] = "";
  long budget = kcc_http_budget_ms(c);
  if (budget <= 0)
    return kc_errf(err, KC_DEADLINE, "GET %s: the deadline passed", path);
  snprintf(url, sizeof url, "%s%s", c->url, path);
  curl_easy_reset(c->easy);
  kcc_http_setup(c, c->easy, budget);
  curl_easy_setopt(c->easy, CURLOPT_URL, url);
  curl_easy_setopt(c->easy, CURLOPT_ERRORBUFFER, ebuf);
  curl_easy_setopt(c->easy, CURLOPT_WRITEFUNCTION, on_chunk);
  curl_easy_setopt(c->easy, CURLOPT_WRITEDATA, s);
  /* A Content-Length above the limit is refused before the body. */
  curl_easy_setopt(c->easy, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)s->s.max);
  CURLcode rc = curl_easy_perform(c->easy);
  curl_easy_getinfo(c->easy, CURLINFO_RESPONSE_CODE, &s->status);
  if (s->s.too_big || rc == CURLE_FILESIZE_EXCEEDED)
    return kc_errf(err, KC_TOO_LARGE,
                   "GET %s: the answer is larger than %llu bytes "
                   "(--max-size); cut off",
                   path, (unsigned long long)s->s.max);
  if (s->s.write_bad)
    return kc_errf(err, KC_IO, "GET %s: writing the output failed", path);
  if (rc != CURLE_OK)
    return kcc_http_curl_error(c, c->deadline_ms, rc, "GET", path, ebuf, err);
  return KC_OK;
}

kc_err kc_client_blob_get_fd(kc_client *c, const char *digest, int fd,
                             uint64_t max, uint64_t *len, char *err) {
  char path[128], d[KC_HEX_LEN + 1] = "";
  sink s = {.h = c->easy, .s = {.fd = fd, .max = max ? max : KC_BLOB_GET_MAX}};
  if (len)
    *len = 0;
  if (!kc_is_hex64(digest))
    return kc_errf(err, KC_BAD_DIGEST, "digest: must be 64 lowercase hex");
  /* the sink reads fd < 0 as "into its buffer", which this call has not */
  if (fd < 0)
    return kc_errf(err, KC_EINVAL, "fd: %d is not a descriptor", fd);
  if (!c->url)
    return kc_errf(err, KC_UNAVAILABLE, "no server configured");
  if (!(s.s.sha = kc_sha256_new()))
    return kc_errf(err, KC_NOMEM, "out of memory");
  snprintf(path, sizeof path, "/v1/blobs/%s", digest);
  kc_err e = stream_get(c, path, &s, err);
  if (!e && s.status != 200) { /* the error answer, as every call says it */
    kcc_http_resp r = {.status = s.status, .body = s.ebody, .len = s.elen};
    e = kcc_http_error(&r, path, err);
  }
  if (!e && (kc_sha256_final(s.s.sha, d) || strcmp(d, digest) != 0))
    e = kc_errf(err, KC_DIGEST_MISMATCH,
                "blob %s: the server sent bytes hashing to %s", digest, d);
  kc_sha256_free(s.s.sha);
  if (len)
    *len = s.s.got;
  return e;
}
