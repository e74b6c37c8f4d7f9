/* s3.c: the S3 client of kcs3.h: SigV4 requests through one reused CURL
 * easy handle, answers and S3 error bodies parsed with expat. */
#include "kcs3.h"

#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <expat.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kc_schema.h"

/* An error body or a list page bigger than these is not S3 talking. */
#define KCS3_ERRBODY_MAX (64 * 1024)
#define KCS3_LISTBODY_MAX (16 * 1024 * 1024)
/* Longest STS session token accepted (AWS's are ~1-2 KiB). */
#define KCS3_TOKEN_MAX 8192
/* Longest text of one XML element we keep (keys are <= 1024 bytes; tokens
 * are opaque but short in every implementation we know). */
#define KCS3_TEXT_MAX 4096

struct kcs3 {
  CURL *h;    /* one handle: its connection cache is the reuse */
  char *base; /* "http://host:port/bucket" or "https://bucket.host" */
  char *bucket;
  char *region;
  char *access_key;
  char *secret_key; /* wiped by kcs3_close */
  char *token;      /* may be NULL; wiped too */
  char sigv4[96];   /* "aws:amz:REGION:s3" */
  long connect_ms, timeout_ms;
  unsigned list_max_keys;
  const _Atomic int *abort_flag;
  char curlerr[CURL_ERROR_SIZE];
  int refused_bucket; /* the last answer: see kcs3_refuses_bucket */
};

/* ---- small helpers ---- */

static char *dupstr(const char *s) { return s ? strdup(s) : NULL; }

static void wipe_free(char *s) {
  if (s) {
    explicit_bzero(s, strlen(s));
    free(s);
  }
}

/* Copies an ETag for the caller without its quotes (kcs3.h says why); an
 * over-long one is cut (never overflows). */
static void copy_etag(char dst[KCS3_ETAG_MAX], const char *src) {
  if (!dst)
    return;
  if (!src)
    src = "";
  size_t n = strlen(src);
  if (n >= 2 && src[0] == '"' && src[n - 1] == '"') {
    src++;
    n -= 2;
  }
  snprintf(dst, KCS3_ETAG_MAX, "%.*s", (int)n, src);
}

/* Server text goes into our messages and logs: keep it printable and short so
 * a hostile or broken server cannot inject lines. */
static void printable(char *s) {
  for (; *s; s++)
    if (!isprint((unsigned char)*s))
      *s = '?';
}

/* A header value we send must not carry CR/LF (header injection). */
static int header_safe(const char *v) {
  for (; *v; v++)
    if (!isprint((unsigned char)*v))
      return 0;
  return 1;
}

/* ---- growable buffers ---- */

typedef struct kcs3_buf {
  char *p;
  size_t len, cap, max;
  int over;    /* the body passed max: aborted on purpose */
  int checked; /* status and length looked at (first write) */
  int failed;  /* the answer is an error status: buffer its body */
  CURL *h;
  kcs3_sink sink; /* non-NULL: a success body goes here, not into p */
  void *sink_ud;
  kc_err sink_err;   /* what the sink answered when it stopped us */
  uint64_t streamed; /* bytes given to the sink */
} kcs3_buf;

static int buf_reserve(kcs3_buf *b, size_t need) {
  if (need <= b->cap)
    return 0;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < need)
    cap = cap > SIZE_MAX / 2 ? need : cap * 2;
  char *p = realloc(b->p, cap);
  if (!p)
    return -1;
  b->p = p;
  b->cap = cap;
  return 0;
}

/* On the first bytes: an error answer gets the error-body cap, not the
 * caller's (a 404 body must not read as "too large"); a success whose
 * Content-Length is over the cap stops before any byte is stored, and one
 * under it is allocated once. */
static int buf_first_write(kcs3_buf *b) {
  long status = 0;
  curl_off_t cl = -1;
  b->checked = 1;
  curl_easy_getinfo(b->h, CURLINFO_RESPONSE_CODE, &status);
  if (status >= 300) {
    b->failed = 1;
    b->max = KCS3_ERRBODY_MAX;
    return 0;
  }
  curl_easy_getinfo(b->h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
  if (cl > 0 && (uint64_t)cl > b->max) {
    b->over = 1;
    return -1;
  }
  if (!b->sink && cl > 0 && buf_reserve(b, (size_t)cl + 1) != 0)
    return -1;
  return 0;
}

/* A success body of a streaming GET: counted against the cap, handed on. */
static size_t to_sink(kcs3_buf *b, const char *ptr, size_t len) {
  if (len > b->max - b->streamed) {
    b->over = 1;
    return 0;
  }
  kc_err e = b->sink(ptr, len, b->sink_ud);
  if (e != KC_OK) {
    b->sink_err = e;
    return 0;
  }
  b->streamed += len;
  return len;
}

static size_t on_write(char *ptr, size_t size, size_t n, void *ud) {
  kcs3_buf *b = ud;
  size_t len = size * n;
  if (!b->checked && buf_first_write(b) != 0)
    return 0;
  if (b->sink && !b->failed)
    return to_sink(b, ptr, len);
  if (len > b->max - b->len) {
    b->over = 1;
    return 0; /* aborts the transfer: CURLE_WRITE_ERROR */
  }
  if (buf_reserve(b, b->len + len + 1) != 0)
    return 0;
  memcpy(b->p + b->len, ptr, len);
  b->len += len;
  b->p[b->len] = '\0';
  return len;
}

/* ---- upload source (memory), rewindable: curl resends the body when a
 * reused connection turns out closed by the server. ---- */

typedef struct kcs3_src {
  const char *p;
  size_t len, off;
} kcs3_src;

static size_t on_read(char *dst, size_t size, size_t n, void *ud) {
  kcs3_src *s = ud;
  size_t left = s->len - s->off, want = size * n;
  if (want > left)
    want = left;
  if (want) /* an empty body may have no pointer */
    memcpy(dst, s->p + s->off, want);
  s->off += want;
  return want;
}

static int on_seek(void *ud, curl_off_t off, int origin) {
  kcs3_src *s = ud;
  if (origin != SEEK_SET || off < 0 || (uint64_t)off > s->len)
    return CURL_SEEKFUNC_CANTSEEK;
  s->off = (size_t)off;
  return CURL_SEEKFUNC_OK;
}

/* ---- URL encoding (SigV4's rule: RFC 3986 unreserved stay, the rest is
 * %XX in upper case). curl signs the path and query exactly as we write them
 * (curl 7.88 neither re-encodes nor sorts them), so this is the canonical
 * form too. ---- */

static int unreserved(unsigned char ch) {
  return isalnum(ch) || ch == '-' || ch == '.' || ch == '_' || ch == '~';
}

/* Appends s encoded; '/' kept when keep_slash (object keys). */
static int encode_into(kcs3_buf *b, const char *s, int keep_slash) {
  static const char hex[] = "0123456789ABCDEF";
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (buf_reserve(b, b->len + 4) != 0)
      return -1;
    if (unreserved(ch) || (keep_slash && ch == '/')) {
      b->p[b->len++] = (char)ch;
    } else {
      b->p[b->len++] = '%';
      b->p[b->len++] = hex[ch >> 4];
      b->p[b->len++] = hex[ch & 15];
    }
  }
  b->p[b->len] = '\0';
  return 0;
}

static int append(kcs3_buf *b, const char *s) {
  size_t n = strlen(s);
  if (buf_reserve(b, b->len + n + 1) != 0)
    return -1;
  memcpy(b->p + b->len, s, n + 1);
  b->len += n;
  return 0;
}

/* ---- XML (expat). A tiny event layer: each element's local name (the
 * namespace stripped) and depth, and the text of leaf elements. ---- */

typedef struct kcs3_xml kcs3_xml;
typedef void (*xml_end_fn)(kcs3_xml *x, int depth, const char *name,
                           const char *text);

struct kcs3_xml {
  XML_Parser p;
  int depth;
  char root[64];
  char parent[64];   /* local name of the element at depth - 1 */
  char stack[8][64]; /* local names by depth (deeper ones not kept) */
  char text[KCS3_TEXT_MAX + 1];
  size_t tlen;
  const char *bad; /* why parsing stopped, if it was our choice */
  int stopped;     /* the callback asked to stop: not an error */
  xml_end_fn on_end;
  void *ud;
};

#define XML_NS_SEP '|'

static const char *local_name(const char *name) {
  const char *l = strrchr(name, XML_NS_SEP);
  return l ? l + 1 : name;
}

static void xml_abort(kcs3_xml *x, const char *why) {
  if (!x->bad)
    x->bad = why;
  XML_StopParser(x->p, XML_FALSE);
}

static void XMLCALL xml_start(void *ud, const XML_Char *name,
                              const XML_Char **attrs) {
  kcs3_xml *x = ud;
  (void)attrs;
  if (x->bad || x->stopped)
    return; /* expat may still call after XML_StopParser */
  x->depth++;
  if (x->depth == 1)
    snprintf(x->root, sizeof x->root, "%s", local_name(name));
  if (x->depth <= 8)
    snprintf(x->stack[x->depth - 1], sizeof x->stack[0], "%s",
             local_name(name));
  x->tlen = 0;
  x->text[0] = '\0';
}

static void XMLCALL xml_end(void *ud, const XML_Char *name) {
  kcs3_xml *x = ud;
  if (x->bad || x->stopped)
    return;
  snprintf(x->parent, sizeof x->parent, "%s",
           x->depth >= 2 && x->depth <= 9 ? x->stack[x->depth - 2] : "");
  if (x->on_end)
    x->on_end(x, x->depth, local_name(name), x->text);
  x->depth--;
  x->tlen = 0;
  x->text[0] = '\0';
}

static void XMLCALL xml_chars(void *ud, const XML_Char *s, int len) {
  kcs3_xml *x = ud;
  if (x->bad || x->stopped)
    return;
  if ((size_t)len > KCS3_TEXT_MAX - x->tlen) {
    xml_abort(x, "an element's text is too long");
    return;
  }
  memcpy(x->text + x->tlen, s, (size_t)len);
  x->tlen += (size_t)len;
  x->text[x->tlen] = '\0';
}

/* S3 never sends a DTD; refusing one closes the door on entity tricks. */
static void XMLCALL xml_doctype(void *ud, const XML_Char *name,
                                const XML_Char *sysid, const XML_Char *pubid,
                                int has_internal) {
  (void)name, (void)sysid, (void)pubid, (void)has_internal;
  xml_abort(ud, "a DOCTYPE is not allowed");
}

/* Parses a whole document. 0 ok (or stopped by the callback); -1 with a
 * reason in `why` (static or expat's text). */
static int xml_parse(const char *doc, size_t len, xml_end_fn on_end, void *ud,
                     kcs3_xml *x, const char **why) {
  memset(x, 0, sizeof *x);
  x->on_end = on_end;
  x->ud = ud;
  x->p = XML_ParserCreateNS(NULL, XML_NS_SEP);
  if (!x->p) {
    *why = "out of memory";
    return -1;
  }
  XML_SetUserData(x->p, x);
  XML_SetElementHandler(x->p, xml_start, xml_end);
  XML_SetCharacterDataHandler(x->p, xml_chars);
  XML_SetStartDoctypeDeclHandler(x->p, xml_doctype);
  enum XML_Status st = XML_Parse(x->p, doc, (int)len, XML_TRUE);
  int rc = 0;
  if (x->stopped) {
    rc = 0;
  } else if (x->bad) {
    *why = x->bad;
    rc = -1;
  } else if (st != XML_STATUS_OK) {
    *why = XML_ErrorString(XML_GetErrorCode(x->p));
    rc = -1;
  }
  XML_ParserFree(x->p);
  x->p = NULL;
  return rc;
}

/* ---- S3 error bodies: <Error><Code/><Message/><RequestId/></Error> ---- */

typedef struct s3_error {
  char code[64];
  char message[160];
  char request_id[80];
} s3_error;

static void on_error_end(kcs3_xml *x, int depth, const char *name,
                         const char *text) {
  s3_error *e = x->ud;
  if (depth != 2 || strcmp(x->parent, "Error") != 0)
    return;
  if (strcmp(name, "Code") == 0)
    snprintf(e->code, sizeof e->code, "%s", text);
  else if (strcmp(name, "Message") == 0)
    snprintf(e->message, sizeof e->message, "%s", text);
  else if (strcmp(name, "RequestId") == 0)
    snprintf(e->request_id, sizeof e->request_id, "%s", text);
}

/* Fills e from an error body; a body that is not S3's XML leaves e empty
 * (HEAD answers have no body at all). */
static void parse_error_body(const kcs3_buf *b, s3_error *e) {
  kcs3_xml x;
  const char *why;
  memset(e, 0, sizeof *e);
  if (b->len == 0 || xml_parse(b->p, b->len, on_error_end, e, &x, &why) != 0)
    return;
  if (strcmp(x.root, "Error") != 0)
    memset(e, 0, sizeof *e);
  printable(e->code);
  printable(e->message);
  printable(e->request_id);
}

/* ---- one request ---- */

typedef struct kcs3_req {
  const char *op;     /* for messages: "PUT", "LIST", ... */
  const char *method; /* "GET", "PUT", "HEAD", "DELETE" */
  const char *key;    /* NULL: the bucket itself */
  const char *query;  /* canonical (sorted, encoded), or NULL */
  const void *body;   /* PUT only */
  size_t body_len;
  const char *payload_sha; /* 64 hex of the body; NULL: hashed here */
  const char *if_none_match, *if_match, *content_type;
  const char *encoding; /* x-amz-meta-kcache-encoding, or NULL */
  size_t max_body;      /* cap of a success body */
  kcs3_sink sink;       /* non-NULL: stream a success body there */
  void *sink_ud;
} kcs3_req;

typedef struct kcs3_resp {
  long status;
  kcs3_buf body;
  char etag[KCS3_ETAG_MAX];
  curl_off_t length; /* Content-Length, -1 unknown */
  s3_error s3;       /* parsed when status >= 300 */
} kcs3_resp;

static void resp_free(kcs3_resp *r) {
  free(r->body.p);
  memset(r, 0, sizeof *r);
}

static int build_url(const kcs3 *c, const kcs3_req *q, kcs3_buf *url) {
  if (append(url, c->base) != 0)
    return -1;
  if (q->key && (append(url, "/") != 0 || encode_into(url, q->key, 1) != 0))
    return -1;
  if (!q->key && append(url, "/") != 0) /* the bucket: "/bucket/" or "/" */
    return -1;
  if (q->query && (append(url, "?") != 0 || append(url, q->query) != 0))
    return -1;
  return 0;
}

static struct curl_slist *add_header(struct curl_slist *l, int *fail,
                                     const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static struct curl_slist *add_header(struct curl_slist *l, int *fail,
                                     const char *fmt, ...) {
  char line[KCS3_TOKEN_MAX + 64]; /* the longest header we send */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  struct curl_slist *n = curl_slist_append(l, line);
  if (!n) {
    *fail = 1;
    return l;
  }
  return n;
}

/* The headers of a request; NULL with *fail set on out of memory. */
static struct curl_slist *build_headers(const kcs3 *c, const kcs3_req *q,
                                        const char *sha, int *fail) {
  struct curl_slist *l = NULL;
  *fail = 0;
  /* RGW refuses a SigV4 request without it; curl signs it as the payload. */
  l = add_header(l, fail, "x-amz-content-sha256: %s", sha);
  if (c->token)
    l = add_header(l, fail, "x-amz-security-token: %s", c->token);
  if (q->if_none_match)
    l = add_header(l, fail, "If-None-Match: %s", q->if_none_match);
  if (q->if_match) /* unquoted: RGW 16 compares it byte for byte */
    l = add_header(l, fail, "If-Match: %s", q->if_match);
  if (q->encoding) /* signed like every x-amz- header */
    l = add_header(l, fail, "x-amz-meta-kcache-encoding: %s", q->encoding);
  /* No "Expect:" here to save the 100-continue round trip: curl 7.88 signs
   * a header emptied that way but does not send it (SignatureDoesNotMatch). */
  if (q->body)
    l = add_header(l, fail, "Content-Type: %s",
                   q->content_type ? q->content_type
                                   : "application/octet-stream");
  return l;
}

/* libcurl calls this about once a second, and more often while bytes move. */
static int on_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut,
                       curl_off_t un) {
  (void)dt, (void)dn, (void)ut, (void)un;
  const _Atomic int *flag = ud;
  return atomic_load(flag) ? 1 : 0;
}

static void set_common(kcs3 *c, const char *url, struct curl_slist *hdrs,
                       kcs3_resp *r) {
  CURL *h = c->h;
  if (c->abort_flag) {
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, (void *)c->abort_flag);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
  }
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, c->curlerr);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L); /* threads: no SIGALRM */
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, c->connect_ms);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, c->timeout_ms);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  /* a stalled transfer ends after 30 s under 1 KiB/s, whatever timeout_ms
   * allows (the queue's uploads hold an LMDB read meanwhile) */
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 30L);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L); /* a redirect is an error */
  curl_easy_setopt(h, CURLOPT_AWS_SIGV4, c->sigv4);
  curl_easy_setopt(h, CURLOPT_USERNAME, c->access_key);
  curl_easy_setopt(h, CURLOPT_PASSWORD, c->secret_key);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &r->body);
}

static void set_method(kcs3 *c, const kcs3_req *q, kcs3_src *src) {
  CURL *h = c->h;
  if (strcmp(q->method, "PUT") == 0) {
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(h, CURLOPT_READDATA, src);
    curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, on_seek);
    curl_easy_setopt(h, CURLOPT_SEEKDATA, src);
    /* a Content-Length on every upload: RGW wants it, no chunked bodies */
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)src->len);
    /* curl sends Expect: 100-continue on uploads; a proxy that never answers
     * 100 would cost the default 1 s on every PUT */
    curl_easy_setopt(h, CURLOPT_EXPECT_100_TIMEOUT_MS, 200L);
  } else if (strcmp(q->method, "HEAD") == 0) {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (strcmp(q->method, "DELETE") == 0) {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "DELETE");
  }
}

/* libcurl's errors, translated here and nowhere else. */
static kc_err curl_to_kc(CURLcode rc) {
  switch (rc) {
  case CURLE_COULDNT_RESOLVE_PROXY:
  case CURLE_COULDNT_RESOLVE_HOST:
  case CURLE_COULDNT_CONNECT:
  case CURLE_SEND_ERROR:
  case CURLE_RECV_ERROR:
  case CURLE_GOT_NOTHING:
  case CURLE_PARTIAL_FILE:
  case CURLE_SSL_CONNECT_ERROR:
    return KC_UNAVAILABLE;
  case CURLE_OPERATION_TIMEDOUT:
    return KC_TIMEOUT;
  case CURLE_OUT_OF_MEMORY:
    return KC_NOMEM;
  case CURLE_PEER_FAILED_VERIFICATION:
  case CURLE_UNSUPPORTED_PROTOCOL:
  case CURLE_URL_MALFORMAT:
  case CURLE_WEIRD_SERVER_REPLY:
    return KC_PROTOCOL; /* configuration or a non-S3 peer: retrying won't fix */
  default:
    return KC_IO;
  }
}

/* HTTP statuses of a finished exchange, translated here and nowhere else. */
static kc_err status_to_kc(long status, const s3_error *e) {
  if (status >= 200 && status < 300)
    return KC_OK;
  if (status == 404)
    return KC_NOT_FOUND;
  if (status == 412)
    return KC_CONFLICT;
  if (status == 409 && (strcmp(e->code, "ConditionalRequestConflict") == 0 ||
                        strcmp(e->code, "OperationAborted") == 0))
    return KC_BUSY;
  if (status >= 500)
    return KC_IO;
  return KC_PROTOCOL;
}

/* The sentence for a failed exchange: operation, key, status, S3's code and
 * message, request id. Never the credentials. */
static kc_err http_error(const kcs3 *c, const kcs3_req *q, const kcs3_resp *r,
                         kc_err e, char *err) {
  const s3_error *s = &r->s3;
  const char *hint = "";
  if (strcmp(s->code, "SignatureDoesNotMatch") == 0 ||
      strcmp(s->code, "InvalidAccessKeyId") == 0)
    hint = " (check the access key and secret)";
  else if (strcmp(s->code, "AuthorizationHeaderMalformed") == 0)
    hint = " (check the region)";
  return kc_errf(err, e, "S3 %s %s%s%s: HTTP %ld %s%s%s%s%s%s%s", q->op,
                 c->bucket, q->key ? "/" : "", q->key ? q->key : "", r->status,
                 s->code[0] ? s->code : "(no S3 error code)",
                 s->message[0] ? ": " : "", s->message, hint,
                 s->request_id[0] ? " (request " : "", s->request_id,
                 s->request_id[0] ? ")" : "");
}

static kc_err transport_error(const kcs3 *c, const kcs3_req *q,
                              const kcs3_resp *r, CURLcode rc, char *err) {
  if (r->body.over)
    return kc_errf(err, KC_TOO_LARGE, "S3 %s %s/%s: object over %zu bytes",
                   q->op, c->bucket, q->key ? q->key : "", q->max_body);
  if (r->body.sink_err != KC_OK)
    return kc_errf(err, r->body.sink_err,
                   "S3 %s %s/%s: the consumer stopped the transfer (%s)", q->op,
                   c->bucket, q->key ? q->key : "",
                   kc_err_name(r->body.sink_err));
  kc_err e = curl_to_kc(rc);
  return kc_errf(err, e, "S3 %s %s%s%s: %s", q->op, c->bucket,
                 q->key ? "/" : "", q->key ? q->key : "",
                 c->curlerr[0] ? c->curlerr : curl_easy_strerror(rc));
}

/* An answer about the bucket or the credentials, not about one object. */
static int refuses_bucket(const kcs3_resp *r) {
  static const char *const codes[] = {"NoSuchBucket",
                                      "ExpiredToken",
                                      "InvalidToken",
                                      "TokenRefreshRequired",
                                      "InvalidAccessKeyId",
                                      "SignatureDoesNotMatch",
                                      "AuthorizationHeaderMalformed",
                                      "PermanentRedirect",
                                      "TemporaryRedirect",
                                      "AccountProblem"};
  if (r->status == 401 || r->status == 403 || r->status == 301 ||
      r->status == 307)
    return 1;
  for (size_t i = 0; i < sizeof codes / sizeof *codes; i++)
    if (strcmp(r->s3.code, codes[i]) == 0)
      return 1;
  return 0;
}

static void read_answer(kcs3 *c, kcs3_resp *r) {
  struct curl_header *hd = NULL;
  curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &r->status);
  curl_easy_getinfo(c->h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &r->length);
  if (curl_easy_header(c->h, "ETag", 0, CURLH_HEADER, -1, &hd) == CURLHE_OK)
    copy_etag(r->etag, hd->value);
  if (r->status >= 300)
    parse_error_body(&r->body, &r->s3);
}

/* Sends one request and reads the answer into r (the caller frees it with
 * resp_free). KC_OK only for a 2xx answer. */
static kc_err perform(kcs3 *c, const kcs3_req *q, kcs3_resp *r, char *err) {
  char sha[KC_HEX_LEN + 1];
  kcs3_buf url = {0};
  kcs3_src src = {q->body, q->body_len, 0};
  int fail = 0;
  memset(r, 0, sizeof *r);
  c->refused_bucket = 0;
  r->body.max = q->max_body ? q->max_body : KCS3_ERRBODY_MAX;
  r->body.h = c->h;
  r->body.sink = q->sink;
  r->body.sink_ud = q->sink_ud;
  r->length = -1;
  if (q->payload_sha)
    snprintf(sha, sizeof sha, "%s", q->payload_sha);
  else if (kc_sha256_hex(q->body ? q->body : "", q->body_len, sha) != KC_OK)
    return kc_errf(err, KC_NOMEM, "S3 %s: cannot hash the body", q->op);
  if (build_url(c, q, &url) != 0) {
    free(url.p);
    return kc_errf(err, KC_NOMEM, "S3 %s: out of memory", q->op);
  }
  struct curl_slist *hdrs = build_headers(c, q, sha, &fail);
  if (fail) {
    curl_slist_free_all(hdrs);
    free(url.p);
    return kc_errf(err, KC_NOMEM, "S3 %s: out of memory", q->op);
  }
  /* reset keeps the connection cache: the reuse we want, no stale options */
  curl_easy_reset(c->h);
  c->curlerr[0] = '\0';
  set_common(c, url.p, hdrs, r);
  set_method(c, q, &src);
  CURLcode rc = curl_easy_perform(c->h);
  curl_slist_free_all(hdrs);
  free(url.p);
  if (rc != CURLE_OK)
    return transport_error(c, q, r, rc, err);
  read_answer(c, r);
  c->refused_bucket = refuses_bucket(r);
  kc_err e = status_to_kc(r->status, &r->s3);
  return e == KC_OK ? KC_OK : http_error(c, q, r, e, err);
}

/* ---- open / close ---- */

static int bucket_ok(const char *b) {
  size_t n = strlen(b);
  if (n < 3 || n > 63)
    return 0; /* RGW and S3 refuse shorter names */
  for (; *b; b++)
    if (!(islower((unsigned char)*b) || isdigit((unsigned char)*b) ||
          *b == '-' || *b == '.'))
      return 0;
  return 1;
}

static int region_ok(const char *r) {
  size_t n = strlen(r);
  if (n == 0 || n > 40)
    return 0;
  for (; *r; r++)
    if (!(isalnum((unsigned char)*r) || *r == '-' || *r == '_'))
      return 0;
  return 1;
}

static kc_err check_opts(const kcs3_opts *o, char *err) {
  if (!o || !o->endpoint || !o->bucket)
    return kc_errf(err, KC_EINVAL, "S3: endpoint and bucket are required");
  if (strncmp(o->endpoint, "http://", 7) != 0 &&
      strncmp(o->endpoint, "https://", 8) != 0)
    return kc_errf(err, KC_EINVAL, "S3 endpoint '%.200s': not http(s)://",
                   o->endpoint);
  if (!bucket_ok(o->bucket))
    return kc_errf(err, KC_EINVAL,
                   "S3 bucket '%.80s': 3-63 of [a-z0-9.-] expected", o->bucket);
  if (o->region && !region_ok(o->region))
    return kc_errf(err, KC_EINVAL, "S3 region '%.80s' is not valid", o->region);
  if (!o->access_key || !o->access_key[0] || !o->secret_key ||
      !o->secret_key[0])
    return kc_errf(err, KC_EINVAL, "S3: access key and secret key required");
  if (!header_safe(o->access_key) || strchr(o->access_key, ':') ||
      (o->session_token && !header_safe(o->session_token)))
    return kc_errf(err, KC_EINVAL, "S3: credentials contain bad characters");
  if (strlen(o->access_key) > 128 ||
      (o->session_token && strlen(o->session_token) > KCS3_TOKEN_MAX))
    return kc_errf(err, KC_EINVAL, "S3: access key or session token too long");
  return KC_OK;
}

/* "http://h:p[/path]" -> path-style "http://h:p[/path]/bucket", or
 * virtual-host "http://bucket.h:p" (a path is not allowed there). */
static kc_err make_base(kcs3 *c, const kcs3_opts *o, char *err) {
  const char *host = strstr(o->endpoint, "://") + 3;
  size_t scheme_len = (size_t)(host - o->endpoint);
  size_t n = strlen(o->endpoint);
  while (n > scheme_len && o->endpoint[n - 1] == '/')
    n--; /* "http://h/" and "http://h" mean the same */
  if (n == scheme_len)
    return kc_errf(err, KC_EINVAL, "S3 endpoint '%.200s' has no host",
                   o->endpoint);
  size_t cap = n + strlen(o->bucket) + 3;
  c->base = malloc(cap);
  if (!c->base)
    return kc_errf(err, KC_NOMEM, "S3: out of memory");
  if (o->path_style) {
    snprintf(c->base, cap, "%.*s/%s", (int)n, o->endpoint, o->bucket);
  } else {
    if (memchr(host, '/', n - scheme_len))
      return kc_errf(err, KC_EINVAL,
                     "S3 endpoint '%.200s': a path needs path-style URLs",
                     o->endpoint);
    snprintf(c->base, cap, "%.*s%s.%.*s", (int)scheme_len, o->endpoint,
             o->bucket, (int)(n - scheme_len), host);
  }
  return KC_OK;
}

kc_err kcs3_open(const kcs3_opts *o, kcs3 **out, char *err) {
  *out = NULL;
  kc_err e = check_opts(o, err);
  if (e != KC_OK)
    return e;
  kcs3 *c = calloc(1, sizeof *c);
  if (!c)
    return kc_errf(err, KC_NOMEM, "S3: out of memory");
  c->bucket = dupstr(o->bucket);
  c->region = dupstr(o->region ? o->region : "us-east-1");
  c->access_key = dupstr(o->access_key);
  c->secret_key = dupstr(o->secret_key);
  c->token = dupstr(o->session_token);
  c->h = curl_easy_init();
  if (!c->bucket || !c->region || !c->access_key || !c->secret_key ||
      (o->session_token && !c->token) || !c->h) {
    kcs3_close(c);
    return kc_errf(err, KC_NOMEM, "S3: out of memory");
  }
  e = make_base(c, o, err);
  if (e != KC_OK) {
    kcs3_close(c);
    return e;
  }
  snprintf(c->sigv4, sizeof c->sigv4, "aws:amz:%s:s3", c->region);
  c->connect_ms = o->connect_timeout_ms > 0 ? o->connect_timeout_ms : 3000;
  c->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 30000;
  c->list_max_keys = o->list_max_keys;
  c->abort_flag = o->abort_flag;
  *out = c;
  return KC_OK;
}

void kcs3_close(kcs3 *c) {
  if (!c)
    return;
  if (c->h)
    curl_easy_cleanup(c->h);
  free(c->base);
  free(c->bucket);
  free(c->region);
  free(c->access_key);
  wipe_free(c->secret_key);
  wipe_free(c->token);
  free(c);
}

int kcs3_retryable(kc_err e) {
  return e == KC_UNAVAILABLE || e == KC_TIMEOUT || e == KC_IO || e == KC_BUSY;
}

int kcs3_refuses_bucket(const kcs3 *c) { return c && c->refused_bucket; }

void kcs3_forget_answer(kcs3 *c) {
  if (c)
    c->refused_bucket = 0;
}

/* ---- objects ---- */

static kc_err check_key(const char *op, const char *key, char *err) {
  size_t n = key ? strlen(key) : 0;
  if (n == 0 || n > KCS3_KEY_MAX)
    return kc_errf(err, KC_EINVAL, "S3 %s: object key must be 1-%d bytes", op,
                   KCS3_KEY_MAX);
  return KC_OK;
}

kc_err kcs3_put(kcs3 *c, const char *key, const void *data, size_t len,
                const kcs3_put_opts *po, char etag[KCS3_ETAG_MAX], char *err) {
  kcs3_put_opts none = {0};
  kcs3_resp r;
  kc_err e = check_key("PUT", key, err);
  if (e != KC_OK)
    return e;
  if (!po)
    po = &none;
  if (!data && len > 0)
    return kc_errf(err, KC_EINVAL, "S3 PUT %s: no data", key);
  if (po->if_match && !header_safe(po->if_match))
    return kc_errf(err, KC_EINVAL, "S3 PUT %s: bad If-Match value", key);
  if (po->content_type && !header_safe(po->content_type))
    return kc_errf(err, KC_EINVAL, "S3 PUT %s: bad content type", key);
  if (po->encoding && !header_safe(po->encoding))
    return kc_errf(err, KC_EINVAL, "S3 PUT %s: bad encoding", key);
  if (po->sha256_hex && !kc_is_hex64(po->sha256_hex))
    return kc_errf(err, KC_EINVAL, "S3 PUT %s: sha256_hex is not 64 hex", key);
  const char *payload =
      po->unsigned_payload ? "UNSIGNED-PAYLOAD" : po->sha256_hex;
  char match[KCS3_ETAG_MAX];
  copy_etag(match, po->if_match); /* either form from the caller */
  kcs3_req q = {.op = "PUT",
                .method = "PUT",
                .key = key,
                .body = data ? data : "",
                .body_len = len,
                .payload_sha = payload,
                .if_none_match = po->if_none_match ? "*" : NULL,
                .if_match = po->if_match ? match : NULL,
                .content_type = po->content_type,
                .encoding = po->encoding};
  e = perform(c, &q, &r, err);
  if (e == KC_OK)
    copy_etag(etag, r.etag);
  resp_free(&r);
  return e;
}

kc_err kcs3_get(kcs3 *c, const char *key, size_t max_bytes, void **data,
                size_t *len, char etag[KCS3_ETAG_MAX], char *err) {
  kcs3_resp r;
  *data = NULL;
  *len = 0;
  kc_err e = check_key("GET", key, err);
  if (e != KC_OK)
    return e;
  if (max_bytes == 0)
    return kc_errf(err, KC_EINVAL, "S3 GET %s: max_bytes is 0", key);
  kcs3_req q = {
      .op = "GET", .method = "GET", .key = key, .max_body = max_bytes};
  e = perform(c, &q, &r, err);
  if (e == KC_OK && !r.body.p && buf_reserve(&r.body, 1) != 0)
    e = kc_errf(err, KC_NOMEM, "S3 GET %s: out of memory", key);
  if (e == KC_OK) {
    r.body.p[r.body.len] = '\0';
    *data = r.body.p;
    *len = r.body.len;
    r.body.p = NULL; /* handed to the caller */
    copy_etag(etag, r.etag);
  }
  resp_free(&r);
  return e;
}

kc_err kcs3_get_stream(kcs3 *c, const char *key, uint64_t max_bytes,
                       kcs3_sink sink, void *ud, uint64_t *size,
                       char etag[KCS3_ETAG_MAX], char *err) {
  kcs3_resp r;
  if (size)
    *size = 0;
  kc_err e = check_key("GET", key, err);
  if (e != KC_OK)
    return e;
  if (max_bytes == 0 || !sink)
    return kc_errf(err, KC_EINVAL, "S3 GET %s: no sink or max_bytes 0", key);
  kcs3_req q = {.op = "GET",
                .method = "GET",
                .key = key,
                .max_body = max_bytes > SIZE_MAX ? SIZE_MAX : (size_t)max_bytes,
                .sink = sink,
                .sink_ud = ud};
  e = perform(c, &q, &r, err);
  if (e == KC_OK) {
    if (size)
      *size = r.body.streamed;
    copy_etag(etag, r.etag);
  }
  resp_free(&r);
  return e;
}

int kcs3_answer_header(kcs3 *c, const char *name, char *out, size_t cap) {
  struct curl_header *hd = NULL;
  if (cap == 0 ||
      curl_easy_header(c->h, name, 0, CURLH_HEADER, -1, &hd) != CURLHE_OK)
    return 0;
  snprintf(out, cap, "%s", hd->value);
  return 1;
}

kc_err kcs3_head(kcs3 *c, const char *key, uint64_t *size,
                 char etag[KCS3_ETAG_MAX], char *err) {
  kcs3_resp r;
  kc_err e = check_key("HEAD", key, err);
  if (e != KC_OK)
    return e;
  kcs3_req q = {.op = "HEAD", .method = "HEAD", .key = key};
  e = perform(c, &q, &r, err);
  if (e == KC_OK && r.length < 0)
    e = kc_errf(err, KC_PROTOCOL, "S3 HEAD %s: no Content-Length", key);
  if (e == KC_OK) {
    if (size)
      *size = (uint64_t)r.length;
    copy_etag(etag, r.etag);
  }
  resp_free(&r);
  return e;
}

kc_err kcs3_delete(kcs3 *c, const char *key, char *err) {
  kcs3_resp r;
  kc_err e = check_key("DELETE", key, err);
  if (e != KC_OK)
    return e;
  kcs3_req q = {.op = "DELETE", .method = "DELETE", .key = key};
  e = perform(c, &q, &r, err);
  if (e == KC_NOT_FOUND && strcmp(r.s3.code, "NoSuchKey") == 0)
    e = KC_OK; /* some stores say 404 where S3 says 204: same outcome */
  resp_free(&r);
  return e;
}

/* ---- list (ListObjectsV2) ---- */

typedef struct list_state {
  kcs3_list_cb cb;
  void *ud;
  char key[KCS3_KEY_MAX + 1];
  char etag[KCS3_ETAG_MAX];
  uint64_t size;
  int have_key, have_size;
  int truncated;
  char *next_token; /* malloc'd */
  const char *bad;  /* a malformed entry */
} list_state;

static int parse_u64(const char *s, uint64_t *out) {
  char *end;
  if (!isdigit((unsigned char)s[0]))
    return -1;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end)
    return -1;
  *out = v;
  return 0;
}

static void list_content_end(kcs3_xml *x, list_state *s, const char *name,
                             const char *text) {
  if (strcmp(name, "Key") == 0) {
    if (strlen(text) > KCS3_KEY_MAX) {
      xml_abort(x, "a listed key is too long");
      return;
    }
    snprintf(s->key, sizeof s->key, "%s", text);
    s->have_key = 1;
  } else if (strcmp(name, "Size") == 0) {
    if (parse_u64(text, &s->size) != 0) {
      xml_abort(x, "a listed size is not a number");
      return;
    }
    s->have_size = 1;
  } else if (strcmp(name, "ETag") == 0) {
    copy_etag(s->etag, text);
  }
}

/* One <Contents> done: hand it to the caller. */
static void list_entry_done(kcs3_xml *x, list_state *s) {
  if (!s->have_key || !s->have_size) {
    xml_abort(x, "a <Contents> without Key or Size");
    return;
  }
  kcs3_entry e = {s->key, s->size, s->etag};
  if (s->cb(&e, s->ud) != 0) {
    x->stopped = 1;
    XML_StopParser(x->p, XML_FALSE);
  }
  s->have_key = s->have_size = 0;
  s->etag[0] = '\0';
}

static void on_list_end(kcs3_xml *x, int depth, const char *name,
                        const char *text) {
  list_state *s = x->ud;
  if (depth == 3 && strcmp(x->parent, "Contents") == 0) {
    list_content_end(x, s, name, text);
  } else if (depth != 2) {
    return;
  } else if (strcmp(name, "Contents") == 0) {
    list_entry_done(x, s);
  } else if (strcmp(name, "IsTruncated") == 0) {
    s->truncated = strcmp(text, "true") == 0;
  } else if (strcmp(name, "NextContinuationToken") == 0) {
    free(s->next_token);
    s->next_token = strdup(text);
    if (!s->next_token)
      xml_abort(x, "out of memory");
  }
}

/* The query of one page, parameters in SigV4's sorted order. */
static int list_query(const kcs3 *c, const char *prefix, const char *token,
                      kcs3_buf *q) {
  char num[32];
  if (token && (append(q, "continuation-token=") != 0 ||
                encode_into(q, token, 0) != 0 || append(q, "&") != 0))
    return -1;
  if (append(q, "list-type=2") != 0)
    return -1;
  snprintf(num, sizeof num, "&max-keys=%u", c->list_max_keys);
  if (c->list_max_keys && append(q, num) != 0)
    return -1;
  if (prefix && prefix[0] &&
      (append(q, "&prefix=") != 0 || encode_into(q, prefix, 0) != 0))
    return -1;
  return 0;
}

/* Parses one page; a 200 that is not a ListBucketResult is KC_PROTOCOL. */
static kc_err list_parse(const kcs3 *c, const kcs3_buf *body, list_state *s,
                         int *stopped, char *err) {
  kcs3_xml x;
  const char *why = NULL;
  s->truncated = 0;
  free(s->next_token);
  s->next_token = NULL;
  if (xml_parse(body->p ? body->p : "", body->len, on_list_end, s, &x, &why) !=
      0)
    return kc_errf(err, KC_PROTOCOL, "S3 LIST %s: bad XML answer: %s",
                   c->bucket, why);
  *stopped = x.stopped;
  if (!x.stopped && strcmp(x.root, "ListBucketResult") != 0)
    return kc_errf(err, KC_PROTOCOL,
                   "S3 LIST %s: answer is not a ListBucketResult", c->bucket);
  return KC_OK;
}

/* Fetches and parses one page; *token is replaced by the next one. */
static kc_err list_page(kcs3 *c, const char *prefix, char **token,
                        list_state *s, int *more, char *err) {
  kcs3_buf query = {0};
  kcs3_resp r;
  int stopped = 0;
  *more = 0;
  if (list_query(c, prefix, *token, &query) != 0) {
    free(query.p);
    return kc_errf(err, KC_NOMEM, "S3 LIST: out of memory");
  }
  kcs3_req q = {.op = "LIST",
                .method = "GET",
                .query = query.p,
                .max_body = KCS3_LISTBODY_MAX};
  kc_err e = perform(c, &q, &r, err);
  free(query.p);
  if (e == KC_OK)
    e = list_parse(c, &r.body, s, &stopped, err);
  resp_free(&r);
  if (e != KC_OK || stopped)
    return e;
  if (s->truncated && (!s->next_token || !s->next_token[0] ||
                       (*token && strcmp(*token, s->next_token) == 0)))
    return kc_errf(err, KC_PROTOCOL,
                   "S3 LIST %s: truncated without a new continuation token",
                   c->bucket); /* or we would loop for ever */
  free(*token);
  *token = s->truncated ? s->next_token : NULL;
  if (s->truncated)
    s->next_token = NULL; /* moved into *token */
  *more = s->truncated;
  return KC_OK;
}

kc_err kcs3_list(kcs3 *c, const char *prefix, kcs3_list_cb cb, void *ud,
                 char *err) {
  list_state *s = calloc(1, sizeof *s); /* ~1 KiB key buffer: off the stack */
  char *token = NULL;
  int more = 1;
  kc_err e = KC_OK;
  if (!s)
    return kc_errf(err, KC_NOMEM, "S3 LIST: out of memory");
  if (prefix && strlen(prefix) > KCS3_KEY_MAX)
    e = kc_errf(err, KC_EINVAL, "S3 LIST: prefix over %d bytes", KCS3_KEY_MAX);
  s->cb = cb;
  s->ud = ud;
  while (e == KC_OK && more)
    e = list_page(c, prefix, &token, s, &more, err);
  free(token);
  free(s->next_token);
  free(s);
  return e;
}

/* ---- bucket ---- */

kc_err kcs3_bucket_create(kcs3 *c, char *err) {
  char body[256] = "";
  kcs3_resp r;
  /* us-east-1 is the one region S3 wants no LocationConstraint for */
  if (strcmp(c->region, "us-east-1") != 0)
    snprintf(body, sizeof body,
             "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/"
             "2006-03-01/\"><LocationConstraint>%s</LocationConstraint>"
             "</CreateBucketConfiguration>",
             c->region);
  kcs3_req q = {.op = "CREATE",
                .method = "PUT",
                .body = body,
                .body_len = strlen(body),
                .content_type = "application/xml"};
  kc_err e = perform(c, &q, &r, err);
  if (e == KC_PROTOCOL && r.status == 409 &&
      strcmp(r.s3.code, "BucketAlreadyOwnedByYou") == 0)
    e = KC_OK;
  resp_free(&r);
  return e;
}

kc_err kcs3_bucket_delete(kcs3 *c, char *err) {
  kcs3_resp r;
  kcs3_req q = {.op = "DELETE", .method = "DELETE"};
  kc_err e = perform(c, &q, &r, err);
  resp_free(&r);
  return e;
}
