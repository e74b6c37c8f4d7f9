/* transport.c: requests to kcached over one reused libcurl easy handle, and the
 * one place where libcurl errors and error answers become kc_err. */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "client_internal.h"

typedef struct membuf {
  char *p;
  size_t len, cap;
  size_t max;  /* the most an answer may hold */
  int too_big; /* it held more: cut off */
  int retry_after_s;
} membuf;

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg) {
  membuf *b = arg;
  size_t n = size * nmemb;
  if (n > b->max - b->len) { /* short return: libcurl aborts the transfer */
    b->too_big = 1;
    return 0;
  }
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 4096;
    while (cap < b->len + n + 1)
      cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p)
      return 0; /* curl reports CURLE_WRITE_ERROR */
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, data, n);
  b->len += n;
  b->p[b->len] = '\0';
  return n;
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *arg) {
  membuf *b = arg;
  size_t n = size * nmemb;
  static const char name[] = "retry-after:";
  if (n > sizeof name && strncasecmp(data, name, sizeof name - 1) == 0)
    b->retry_after_s = atoi(data + sizeof name - 1);
  return n;
}

long kcc_http_budget_ms(const kc_client *c) {
  long t = c->timeout_ms;
  if (c->request_cap_ms > 0 && c->request_cap_ms < t)
    t = c->request_cap_ms;
  if (c->deadline_ms) {
    int64_t left = c->deadline_ms - kc_clock_mono_ms();
    if (left <= 0)
      return 0;
    if (left < t)
      t = (long)left;
  }
  return t;
}

void kcc_http_setup(kc_client *c, CURL *h, long timeout_ms) {
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L); /* threads; no SIGALRM */
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, c->connect_timeout_ms);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
  /* A server that drip-feeds a byte a second is abandoned long before the
   * whole-request limit: KC_TIMEOUT after low_speed_s below the rate. */
  if (c->low_speed_bps > 0) {
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, c->low_speed_bps);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, c->low_speed_s);
  }
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, c->hdrs);
  curl_easy_setopt(h, CURLOPT_USERAGENT, "libkcache/" KC_CLIENT_VERSION);
  curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
  /* Tokens must not leak to another host through a redirect. */
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  if (c->cacert)
    curl_easy_setopt(h, CURLOPT_CAINFO, c->cacert);
}

/* Transport failures, for every transfer of libkcache (transport.c,
 * blob_stream.c, fetch.c, demand.c): "cannot connect" is the server being
 * down (the warmup degrades to local builds); anything else is a broken
 * exchange. A write error is the write callback's: those that can fail for
 * another reason than memory say so before they get here. */
kc_err kcc_http_curl_error(const kc_client *c, int64_t deadline_ms, CURLcode rc,
                           const char *method, const char *path,
                           const char *detail, char *err) {
  const char *why = detail && *detail ? detail : curl_easy_strerror(rc);
  switch (rc) {
  case CURLE_OPERATION_TIMEDOUT:
    if (deadline_ms && kc_clock_mono_ms() >= deadline_ms)
      return kc_errf(err, KC_DEADLINE, "%s %s: the deadline passed", method,
                     path);
    return kc_errf(err, KC_TIMEOUT, "%s %s%s: %s", method, c->url, path, why);
  case CURLE_COULDNT_CONNECT:
  case CURLE_COULDNT_RESOLVE_HOST:
  case CURLE_COULDNT_RESOLVE_PROXY:
  case CURLE_SEND_ERROR:
  case CURLE_RECV_ERROR:
  case CURLE_GOT_NOTHING:
    return kc_errf(err, KC_UNAVAILABLE, "%s %s%s: %s", method, c->url, path,
                   why);
  case CURLE_OUT_OF_MEMORY:
  case CURLE_WRITE_ERROR:
    return kc_errf(err, KC_NOMEM, "%s %s: out of memory", method, path);
  default:
    return kc_errf(err, KC_UNAVAILABLE, "%s %s%s: %s", method, c->url, path,
                   why);
  }
}

kc_err kcc_http_do(kc_client *c, const char *method, const char *path,
                   const void *body, size_t len, kcc_http_resp *r, char *err) {
  return kcc_http_do_on(c, c->easy, method, path, body, len, r, err);
}

kc_err kcc_http_do_on(kc_client *c, CURL *h, const char *method,
                      const char *path, const void *body, size_t len,
                      kcc_http_resp *r, char *err) {
  memset(r, 0, sizeof *r);
  if (!c->url)
    return kc_errf(err, KC_UNAVAILABLE, "no server configured");
  long budget = kcc_http_budget_ms(c);
  if (budget <= 0)
    return kc_errf(err, KC_DEADLINE, "%s %s: the deadline passed", method,
                   path);
  char url[2048];
  if ((size_t)snprintf(url, sizeof url, "%s%s", c->url, path) >= sizeof url)
    return kc_errf(err, KC_EINVAL, "URL too long");
  curl_easy_reset(h); /* keeps the connection cache */
  kcc_http_setup(c, h, budget);
  membuf b = {.max = c->answer_max ? c->answer_max : KCC_ANSWER_MAX};
  char ebuf[CURL_ERROR_SIZE] = "";
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, ebuf);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &b);
  if (!strcmp(method, "HEAD"))
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  else if (strcmp(method, "GET"))
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
  if (body || !strcmp(method, "POST") || !strcmp(method, "PUT")) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body ? body : "");
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
  }
  CURLcode rc = curl_easy_perform(h);
  if (rc != CURLE_OK) {
    free(b.p);
    if (b.too_big)
      return kc_errf(err, KC_PROTOCOL,
                     "%s %s: the answer is larger than %zu bytes; cut off",
                     method, path, b.max);
    return kcc_http_curl_error(c, c->deadline_ms, rc, method, path, ebuf, err);
  }
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
  r->body = b.p;
  r->len = b.len;
  r->retry_after_s = b.retry_after_s;
  return KC_OK;
}

void kcc_http_resp_free(kcc_http_resp *r) {
  if (!r)
    return;
  free(r->body);
  r->body = NULL;
  r->len = 0;
}

/* The wire code back to the enum; unknown codes keep the status' meaning. */
static kc_err code_of(const char *code, long status) {
  if (code && !strcmp(code, "internal")) /* shared by NOMEM and INTERNAL */
    return KC_INTERNAL;
#define KC_ERR_MATCH_(name, num, http, wire, msg)                              \
  if (code && !strcmp(code, wire))                                             \
    return KC_##name;
  KC_ERRNO_MAP(KC_ERR_MATCH_)
#undef KC_ERR_MATCH_
  if (status == 401)
    return KC_UNAUTHORIZED;
  if (status == 403)
    return KC_FORBIDDEN;
  if (status == 404)
    return KC_NOT_FOUND;
  if (status == 503)
    return KC_UNAVAILABLE;
  return KC_PROTOCOL;
}

kc_err kcc_http_error(const kcc_http_resp *r, const char *what, char *err) {
  json_t *root = r->body ? json_loadb(r->body, r->len, 0, NULL) : NULL;
  const char *code = json_string_value(json_object_get(root, "error"));
  const char *msg = json_string_value(json_object_get(root, "message"));
  kc_err e = code_of(code, r->status);
  if (e == KC_OK)
    e = KC_PROTOCOL;
  kc_errf(err, e, "%s: server answered %ld%s%s", what, r->status,
          msg ? ": " : "", msg ? msg : "");
  json_decref(root);
  return e;
}

struct curl_slist *kcc_with_header(const struct curl_slist *l, const char *h) {
  struct curl_slist *n = NULL, *t;
  for (; l; l = l->next) {
    if (!(t = curl_slist_append(n, l->data)))
      break;
    n = t;
  }
  if (!l && (t = curl_slist_append(n, h)))
    return t;
  curl_slist_free_all(n);
  return NULL;
}
