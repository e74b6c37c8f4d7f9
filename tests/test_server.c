/* test_server.c: kcached integration tests: the real binary on a free
 * loopback port with a temporary store, spoken to over HTTP with libcurl:
 * every route and status of DESIGN.md's table, bad input, the auth matrix,
 * leases, keep-alive, restart, SIGHUP, TLS, flags, graceful stop. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <jansson.h>

#include "kc_schema.h"
#include "testsrv.h"

/* ---- HTTP client helpers ---- */

typedef struct resp {
  long status;
  char *body;
  size_t len;
  char hdrs[16384];
  size_t hlen;
  long connects;
  CURLcode rc;
} resp;

typedef struct req {
  const char *method;          /* default GET */
  const char *token;           /* Authorization: Bearer */
  const char *auth;            /* a raw Authorization value instead */
  const void *body;
  size_t len;
  int has_body;
  int chunked;                 /* send the body with chunked encoding */
  int expect;                  /* keep curl's Expect: 100-continue */
  const char *header;          /* one extra "Name: value" */
  const char *cainfo;          /* TLS: verify against this CA */
} req;

static void resp_free(resp *r) {
  free(r->body);
  r->body = NULL;
}

static size_t on_body(char *p, size_t s, size_t n, void *ud) {
  resp *r = ud;
  char *nb = realloc(r->body, r->len + s * n + 1);
  if (!nb)
    return 0;
  memcpy(nb + r->len, p, s * n);
  r->body = nb;
  r->len += s * n;
  r->body[r->len] = '\0';
  return s * n;
}

/* Keeps the headers of the last response only (not a 100 Continue). */
static size_t on_header(char *p, size_t s, size_t n, void *ud) {
  resp *r = ud;
  size_t len = s * n;
  if (len >= 5 && strncmp(p, "HTTP/", 5) == 0)
    r->hlen = 0;
  if (r->hlen + len < sizeof r->hdrs) {
    memcpy(r->hdrs + r->hlen, p, len);
    r->hlen += len;
    r->hdrs[r->hlen] = '\0';
  }
  return len;
}

typedef struct chunk_src {
  const char *p;
  size_t left;
} chunk_src;

static size_t on_read(char *buf, size_t s, size_t n, void *ud) {
  chunk_src *c = ud;
  size_t k = s * n < c->left ? s * n : c->left;
  if (k > 7000)
    k = 7000; /* several chunks */
  memcpy(buf, c->p, k);
  c->p += k;
  c->left -= k;
  return k;
}

static void set_body(CURL *c, const req *q, struct curl_slist **h,
                     chunk_src *src) {
  if (q->chunked) {
    src->p = q->body;
    src->left = q->len;
    curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(c, CURLOPT_READDATA, src);
    *h = curl_slist_append(*h, "Transfer-Encoding: chunked");
  } else {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, q->body ? q->body : "");
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->len);
  }
}

static struct curl_slist *headers_of(const req *q) {
  struct curl_slist *h = NULL;
  char line[512];
  if (q->token) {
    snprintf(line, sizeof line, "Authorization: Bearer %s", q->token);
    h = curl_slist_append(h, line);
  } else if (q->auth) {
    snprintf(line, sizeof line, "Authorization: %s", q->auth);
    h = curl_slist_append(h, line);
  }
  if (!q->expect)
    h = curl_slist_append(h, "Expect:");
  if (q->header)
    h = curl_slist_append(h, q->header);
  return h;
}

/* One request on handle c (NULL: a fresh one). */
static resp http_on(CURL *c, const char *base, const char *path, req q) {
  resp r = {0};
  int own = c == NULL;
  if (own)
    c = curl_easy_init();
  else
    curl_easy_reset(c); /* keeps the connection cache */
  char url[1024];
  snprintf(url, sizeof url, "%s%s", base, path);
  const char *method = q.method ? q.method : "GET";
  struct curl_slist *h = headers_of(&q);
  chunk_src src;
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &r);
  if (q.cainfo)
    curl_easy_setopt(c, CURLOPT_CAINFO, q.cainfo);
  if (strcmp(method, "HEAD") == 0)
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  else if (q.body || q.has_body)
    set_body(c, &q, &h, &src);
  if (strcmp(method, "HEAD") != 0)
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
  r.rc = curl_easy_perform(c);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
  curl_easy_getinfo(c, CURLINFO_NUM_CONNECTS, &r.connects);
  curl_slist_free_all(h);
  if (own)
    curl_easy_cleanup(c);
  return r;
}

static resp http(const kc_testsrv *t, const char *path, req q) {
  return http_on(NULL, t->url, path, q);
}

/* The value of a response header (case-insensitive name), copied. */
static int header(const resp *r, const char *name, char *out, size_t cap) {
  size_t n = strlen(name);
  for (const char *p = r->hdrs; p && *p;) {
    if (strncasecmp(p, name, n) == 0 && p[n] == ':') {
      p += n + 1;
      while (*p == ' ')
        p++;
      size_t k = strcspn(p, "\r\n");
      snprintf(out, cap, "%.*s", (int)k, p);
      return 1;
    }
    p = strchr(p, '\n');
    if (p)
      p++;
  }
  return 0;
}

static json_t *body_json(const resp *r) {
  return r->body ? json_loadb(r->body, r->len, 0, NULL) : NULL;
}

/* Asserts a JSON error body {"error": code, "message": "..."}. */
static void assert_error(const resp *r, long status, const char *code) {
  if (r->status != status)
    fprintf(stderr, "expected %ld %s, got %ld: %s\n", status, code, r->status,
            r->body ? r->body : "");
  assert_int_equal(r->status, status);
  json_t *j = body_json(r);
  assert_non_null(j);
  assert_string_equal(json_string_value(json_object_get(j, "error")), code);
  const char *msg = json_string_value(json_object_get(j, "message"));
  assert_non_null(msg);
  assert_true(strlen(msg) > 0);
  json_decref(j);
}

static int error_mentions(const resp *r, const char *needle) {
  json_t *j = body_json(r);
  const char *msg = json_string_value(json_object_get(j, "message"));
  int ok = msg && strstr(msg, needle) != NULL;
  if (!ok)
    fprintf(stderr, "message '%s' lacks '%s'\n", msg ? msg : "(none)", needle);
  json_decref(j);
  return ok;
}

/* ---- data helpers ---- */

static void sha_hex(const void *p, size_t n, char out[65]) {
  assert_int_equal(kc_sha256_hex(p, n, out), KC_OK);
}

static void fill_random(char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1103515245u + 12345u;
    p[i] = (char)(seed >> 16);
  }
}

static long put_blob(const kc_testsrv *t, const char *token, const void *p,
                     size_t n, char digest[65]) {
  char path[128];
  sha_hex(p, n, digest);
  snprintf(path, sizeof path, "/v1/blobs/%s", digest);
  resp r = http(t, path, (req){.method = "PUT", .token = token, .body = p,
                               .len = n, .has_body = 1});
  resp_free(&r);
  return r.status;
}

/* A manifest (canonical JSON, malloc'd) of one file per digest. */
static char *make_manifest(const char *model, uint64_t batch, const char *arch,
                           char (*digests)[65], const uint64_t *sizes,
                           size_t n, char key[65]) {
  kc_manifest *m = kc_manifest_new();
  assert_non_null(m);
  snprintf(m->fields.model, sizeof m->fields.model, "%s", model);
  memset(m->fields.build, 'b', KC_HEX_LEN);
  snprintf(m->fields.arch, sizeof m->fields.arch, "%s", arch);
  m->fields.bucket.n = 1;
  snprintf(m->fields.bucket.dims[0].name, KC_NAME_MAX + 1, "batch");
  m->fields.bucket.dims[0].value = batch;
  m->fields.n_tools = 1;
  snprintf(m->fields.tools[0].name, KC_NAME_MAX + 1, "cuda");
  snprintf(m->fields.tools[0].value, KC_TOOL_VALUE_MAX + 1, "13.0");
  const char *entries[] = {"gemm"};
  for (size_t i = 0; i < n; i++) {
    char path[32];
    snprintf(path, sizeof path, "k%zu.cubin", i);
    assert_int_equal(kc_manifest_add_file(m, path, digests[i], sizes[i],
                                          KC_KIND_CUBIN, entries, 1, NULL),
                     KC_OK);
  }
  char err[KC_ERRBUF_SIZE] = "";
  kc_err e = kc_manifest_seal(m, err);
  if (e)
    fprintf(stderr, "seal: %s\n", err);
  assert_int_equal(e, KC_OK);
  char *json = NULL;
  assert_int_equal(kc_manifest_to_json(m, &json, err), KC_OK);
  memcpy(key, m->key, 65);
  kc_manifest_free(m);
  return json;
}

static const char *MODEL_A =
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
static const char *MODEL_B =
    "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";

/* Uploads n fresh blobs and a bundle over them; returns its manifest. */
static char *store_bundle(const kc_testsrv *t, const char *token,
                          const char *model, uint64_t batch, unsigned seed,
                          char key[65]) {
  char digests[2][65];
  uint64_t sizes[2] = {1000 + seed % 100, 3000};
  char buf[4096];
  for (int i = 0; i < 2; i++) {
    fill_random(buf, sizes[i], seed * 7 + (unsigned)i);
    long st = put_blob(t, token, buf, sizes[i], digests[i]);
    assert_true(st == 201 || st == 200);
  }
  char *json = make_manifest(model, batch, "sm_90a", digests, sizes, 2, key);
  char path[128];
  snprintf(path, sizeof path, "/v1/bundles/%s", key);
  resp r = http(t, path, (req){.method = "PUT", .token = token, .body = json,
                               .len = strlen(json)});
  assert_true(r.status == 201 || r.status == 200);
  resp_free(&r);
  return json;
}

/* Reads a whole file (the server log), NUL-terminated; caller frees. */
static char *slurp(const char *path) {
  char *buf = NULL;
  size_t len = 0;
  char err[KC_ERRBUF_SIZE];
  if (kc_read_file(path, &buf, &len, err))
    return strdup("");
  return buf;
}

/* Runs a shell command; output (stdout and stderr) into out. */
static int run_sh(const char *cmd, char *out, size_t cap) {
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t n = 0;
  if (out) {
    n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
  } else {
    char sink[4096];
    while (fread(sink, 1, sizeof sink, p) > 0) {
    }
  }
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- raw sockets (for what libcurl will not do: hang up mid-body) ---- */

static int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  struct timeval tv = {20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

static void raw_send(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    assert_true(w > 0);
    c += w;
    n -= (size_t)w;
  }
}

/* Reads until the peer closes or the buffer is full. */
static size_t raw_recv_all(int fd, char *buf, size_t cap) {
  size_t n = 0;
  for (;;) {
    ssize_t r = recv(fd, buf + n, cap - 1 - n, 0);
    if (r <= 0)
      break;
    n += (size_t)r;
    if (n + 1 >= cap)
      break;
  }
  buf[n] = '\0';
  return n;
}

/* ---- the shared open server ---- */

static kc_testsrv S; /* no tokens, small limits */

static int open_setup(void **state) {
  (void)state;
  static const char *const args[] = {"--max-blob-bytes", "1M",
                                     "--max-json-bytes", "1M", NULL};
  return kc_testsrv_start(&S, args);
}

static int open_teardown(void **state) {
  (void)state;
  int rc = kc_testsrv_stop(&S);
  if (rc != 0) {
    char *log = slurp(S.log);
    fprintf(stderr, "kcached exited %d; log tail:\n%s\n", rc,
            strlen(log) > 4000 ? log + strlen(log) - 4000 : log);
    free(log);
  }
  kc_testsrv_cleanup(&S);
  return rc == 0 ? 0 : -1;
}

static void t_health(void **state) {
  (void)state;
  resp r = http(&S, "/healthz", (req){0});
  assert_int_equal(r.status, 200);
  json_t *j = body_json(&r);
  assert_string_equal(json_string_value(json_object_get(j, "status")), "ok");
  json_decref(j);
  resp_free(&r);
  r = http(&S, "/readyz", (req){0});
  assert_int_equal(r.status, 200);
  resp_free(&r);
  r = http(&S, "/healthz", (req){.method = "HEAD"});
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, 0);
  resp_free(&r);
}

static void t_unknown_routes(void **state) {
  (void)state;
  const char *paths[] = {"/", "/nope", "/v1", "/v1/blob/x", "/healthz/",
                         "/v2/blobs/x", "/v1/stats/x", "/V1/lookup"};
  for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
    resp r = http(&S, paths[i], (req){0});
    assert_error(&r, 404, "not_found");
    resp_free(&r);
  }
}

static void t_wrong_methods(void **state) {
  (void)state;
  char d[65];
  sha_hex("x", 1, d);
  char blob[128], bundle[128], model[128], lease[128];
  snprintf(blob, sizeof blob, "/v1/blobs/%s", d);
  snprintf(bundle, sizeof bundle, "/v1/bundles/%s", d);
  snprintf(model, sizeof model, "/v1/models/%s", d);
  snprintf(lease, sizeof lease, "/v1/leases/%s", d);
  struct {
    const char *method, *path, *allow;
  } cases[] = {
      {"DELETE", "/healthz", "GET, HEAD"},
      {"POST", "/readyz", "GET, HEAD"},
      {"PUT", "/metrics", "GET, HEAD"},
      {"DELETE", "/v1/stats", "GET, HEAD"},
      {"POST", blob, "GET, HEAD, PUT"},
      {"DELETE", blob, "GET, HEAD, PUT"},
      {"POST", bundle, "GET, HEAD, PUT, DELETE"},
      {"GET", "/v1/lookup", "POST"},
      {"PUT", "/v1/lookup", "POST"},
      {"PUT", model, "GET, HEAD"},
      {"GET", lease, "POST, DELETE"},
      {"PATCH", lease, "POST, DELETE"},
      {"OPTIONS", "/healthz", "GET, HEAD"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    resp r = http(&S, cases[i].path, (req){.method = cases[i].method});
    assert_error(&r, 405, "method_not_allowed");
    char allow[128] = "";
    assert_true(header(&r, "Allow", allow, sizeof allow));
    assert_string_equal(allow, cases[i].allow);
    resp_free(&r);
  }
}

static void t_blob_roundtrip(void **state) {
  (void)state;
  char data[5000], d[65], path[128], etag[128], v[128];
  fill_random(data, sizeof data, 1);
  assert_int_equal(put_blob(&S, NULL, data, sizeof data, d), 201);
  assert_int_equal(put_blob(&S, NULL, data, sizeof data, d), 200);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(&S, path, (req){0});
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, sizeof data);
  assert_memory_equal(r.body, data, sizeof data);
  snprintf(etag, sizeof etag, "\"%s\"", d);
  assert_true(header(&r, "ETag", v, sizeof v));
  assert_string_equal(v, etag);
  assert_true(header(&r, "Content-Type", v, sizeof v));
  assert_string_equal(v, "application/octet-stream");
  resp_free(&r);
  r = http(&S, path, (req){.method = "HEAD"});
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, 0);
  assert_true(header(&r, "Content-Length", v, sizeof v));
  assert_int_equal(atoi(v), (int)sizeof data);
  resp_free(&r);
  char inm[160];
  snprintf(inm, sizeof inm, "If-None-Match: %s", etag);
  r = http(&S, path, (req){.header = inm});
  assert_int_equal(r.status, 304);
  assert_int_equal(r.len, 0);
  assert_true(header(&r, "ETag", v, sizeof v));
  resp_free(&r);
  r = http(&S, path, (req){.header = "If-None-Match: \"0000\""});
  assert_int_equal(r.status, 200);
  resp_free(&r);
}

static void t_blob_missing(void **state) {
  (void)state;
  char d[65], path[128];
  sha_hex("never stored", 12, d);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(&S, path, (req){0});
  assert_error(&r, 404, "not_found");
  resp_free(&r);
  r = http(&S, path, (req){.method = "HEAD"});
  assert_int_equal(r.status, 404);
  resp_free(&r);
}

static const char *bad_hex[] = {
    "2CF24DBA5FB0A30E26E83B2AC5B9E29E1B161E5C1FA7425E73043362938B9824",
    "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b982",
    "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b98244",
    "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b982g",
    "",
    "..%2F..%2Fetc%2Fpasswd",
    "abc/def",
};
#define N_BAD_HEX (sizeof bad_hex / sizeof *bad_hex)

static void t_blob_bad_digest(void **state) {
  (void)state;
  for (size_t i = 0; i < N_BAD_HEX; i++) {
    char path[256];
    snprintf(path, sizeof path, "/v1/blobs/%s", bad_hex[i]);
    resp r = http(&S, path, (req){0});
    assert_error(&r, 400, "bad_digest");
    resp_free(&r);
    r = http(&S, path, (req){.method = "PUT", .body = "x", .len = 1});
    assert_error(&r, 400, "bad_digest");
    resp_free(&r);
  }
}

static void t_blob_mismatch(void **state) {
  (void)state;
  char d[65], path[128];
  sha_hex("the real bytes", 14, d);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(&S, path, (req){.method = "PUT", .body = "other bytes!!!",
                                .len = 14});
  assert_error(&r, 422, "digest_mismatch");
  resp_free(&r);
  r = http(&S, path, (req){0});
  assert_int_equal(r.status, 404); /* nothing stored */
  resp_free(&r);
}

static void t_blob_too_large(void **state) {
  (void)state;
  size_t n = 2u << 20; /* the server takes 1 MiB */
  char *big = malloc(n), d[65], path[128];
  fill_random(big, n, 5);
  sha_hex(big, n, d);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(&S, path, (req){.method = "PUT", .body = big, .len = n});
  assert_error(&r, 413, "too_large");
  resp_free(&r);
  r = http(&S, path, (req){.method = "PUT", .body = big, .len = n,
                           .expect = 1});
  assert_error(&r, 413, "too_large");
  resp_free(&r);
  r = http(&S, path, (req){.method = "PUT", .body = big, .len = n,
                           .chunked = 1});
  assert_error(&r, 413, "too_large");
  resp_free(&r);
  r = http(&S, path, (req){0});
  assert_int_equal(r.status, 404);
  resp_free(&r);
  free(big);
  /* A huge announced body is refused from its headers alone. */
  char head[512], reply[4096];
  int fd = raw_connect(S.port);
  int h = snprintf(head, sizeof head,
                   "PUT /v1/blobs/%s HTTP/1.1\r\nHost: x\r\n"
                   "Content-Length: 1073741824\r\n\r\n",
                   d);
  raw_send(fd, head, (size_t)h);
  raw_recv_all(fd, reply, sizeof reply);
  close(fd);
  assert_non_null(strstr(reply, "HTTP/1.1 413"));
  assert_non_null(strstr(reply, "\"too_large\""));
}

static void t_blob_pieces(void **state) {
  (void)state;
  size_t n = 900 * 1024;
  char *data = malloc(n), d[65], path[128];
  fill_random(data, n, 9);
  assert_int_equal(put_blob(&S, NULL, data, n, d), 201);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(&S, path, (req){0});
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, n);
  assert_memory_equal(r.body, data, n);
  resp_free(&r);
  /* chunked transfer encoding */
  fill_random(data, n, 10);
  sha_hex(data, 300 * 1024, d);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  r = http(&S, path, (req){.method = "PUT", .body = data, .len = 300 * 1024,
                           .chunked = 1});
  assert_int_equal(r.status, 201);
  resp_free(&r);
  r = http(&S, path, (req){0});
  assert_int_equal(r.len, 300 * 1024);
  assert_memory_equal(r.body, data, 300 * 1024);
  resp_free(&r);
  free(data);
}

static long metric(const kc_testsrv *t, const char *name) {
  resp r = http(t, "/metrics", (req){0});
  long v = -1;
  for (const char *p = r.body; p && (p = strstr(p, name));) {
    if ((p == r.body || p[-1] == '\n') && p[strlen(name)] == ' ') {
      v = atol(p + strlen(name) + 1);
      break;
    }
    p += strlen(name);
  }
  resp_free(&r);
  return v;
}

static void t_upload_disconnect(void **state) {
  (void)state;
  char d[65], head[512], piece[65536];
  sha_hex("never completed", 15, d);
  long before = metric(&S, "kcached_uploads_aborted_total");
  int fd = raw_connect(S.port);
  int n = snprintf(head, sizeof head,
                   "PUT /v1/blobs/%s HTTP/1.1\r\nHost: x\r\n"
                   "Content-Length: 524288\r\n\r\n",
                   d);
  raw_send(fd, head, (size_t)n);
  memset(piece, 'z', sizeof piece);
  raw_send(fd, piece, sizeof piece);
  sleep_ms(200);
  close(fd); /* mid-body */
  long after = before;
  for (int i = 0; i < 100 && after <= before; i++) {
    sleep_ms(50);
    after = metric(&S, "kcached_uploads_aborted_total");
  }
  assert_true(after > before);
  char path[128];
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(&S, path, (req){0});
  assert_int_equal(r.status, 404);
  resp_free(&r);
}

static void t_bundle_roundtrip(void **state) {
  (void)state;
  char key[65], path[128];
  char *json = store_bundle(&S, NULL, MODEL_A, 1, 11, key);
  snprintf(path, sizeof path, "/v1/bundles/%s", key);
  resp r = http(&S, path, (req){.method = "PUT", .body = json,
                                .len = strlen(json)});
  assert_int_equal(r.status, 200); /* identical, already there */
  resp_free(&r);
  r = http(&S, path, (req){0});
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, strlen(json));
  assert_memory_equal(r.body, json, r.len);
  resp_free(&r);
  r = http(&S, path, (req){.method = "HEAD"});
  assert_int_equal(r.status, 200);
  resp_free(&r);
  r = http(&S, path, (req){.method = "DELETE"});
  assert_int_equal(r.status, 204);
  assert_int_equal(r.len, 0);
  resp_free(&r);
  r = http(&S, path, (req){0});
  assert_error(&r, 404, "not_found");
  resp_free(&r);
  r = http(&S, path, (req){.method = "DELETE"});
  assert_error(&r, 404, "not_found");
  resp_free(&r);
  free(json);
}

static void t_bundle_conflict(void **state) {
  (void)state;
  char key[65], key2[65], path[128], d[1][65];
  char *json = store_bundle(&S, NULL, MODEL_A, 2, 12, key);
  uint64_t size = 7;
  assert_int_equal(put_blob(&S, NULL, "other!!", 7, d[0]), 201);
  char *other = make_manifest(MODEL_A, 2, "sm_90a", d, &size, 1, key2);
  assert_string_equal(key, key2); /* same fields, different files */
  snprintf(path, sizeof path, "/v1/bundles/%s", key);
  resp r = http(&S, path, (req){.method = "PUT", .body = other,
                                .len = strlen(other)});
  assert_error(&r, 409, "conflict");
  resp_free(&r);
  free(json);
  free(other);
}

static void t_bundle_missing_blobs(void **state) {
  (void)state;
  char d[2][65], key[65], path[128];
  uint64_t sizes[2] = {10, 20};
  sha_hex("absent one", 10, d[0]);
  sha_hex("absent two", 10, d[1]);
  char *json = make_manifest(MODEL_A, 3, "sm_80", d, sizes, 2, key);
  snprintf(path, sizeof path, "/v1/bundles/%s", key);
  resp r = http(&S, path, (req){.method = "PUT", .body = json,
                                .len = strlen(json)});
  assert_error(&r, 409, "missing_blobs");
  json_t *j = body_json(&r);
  json_t *missing = json_object_get(j, "missing");
  assert_true(json_is_array(missing));
  assert_int_equal(json_array_size(missing), 2);
  for (int i = 0; i < 2; i++) {
    int seen = 0;
    for (size_t k = 0; k < 2; k++)
      seen |= strcmp(json_string_value(json_array_get(missing, k)), d[i]) == 0;
    assert_true(seen);
  }
  json_decref(j);
  resp_free(&r);
  r = http(&S, path, (req){0});
  assert_int_equal(r.status, 404);
  resp_free(&r);
  free(json);
}

static void t_bundle_key_mismatch(void **state) {
  (void)state;
  char d[1][65], key[65], path[128];
  uint64_t size = 3;
  assert_true(put_blob(&S, NULL, "abc", 3, d[0]) / 100 == 2);
  char *json = make_manifest(MODEL_A, 4, "sm_90a", d, &size, 1, key);
  /* a valid manifest under another key's URL */
  char other[65];
  sha_hex("another key", 11, other);
  snprintf(path, sizeof path, "/v1/bundles/%s", other);
  resp r = http(&S, path, (req){.method = "PUT", .body = json,
                                .len = strlen(json)});
  assert_error(&r, 422, "key_mismatch");
  resp_free(&r);
  /* a manifest whose key is not the hash of its fields */
  json_t *j = json_loads(json, 0, NULL);
  json_object_set_new(j, "key", json_string(other));
  char *forged = json_dumps(j, JSON_COMPACT);
  r = http(&S, path, (req){.method = "PUT", .body = forged,
                           .len = strlen(forged)});
  assert_error(&r, 422, "key_mismatch");
  resp_free(&r);
  free(forged);
  json_decref(j);
  free(json);
}

/* PUTs json with one change made by edit(); asserts 400 and the code. */
static void put_edited(const char *json, const char *key,
                       void (*edit)(json_t *), const char *code,
                       const char *mention) {
  json_t *j = json_loads(json, 0, NULL);
  edit(j);
  char *text = json_dumps(j, JSON_COMPACT);
  char path[128];
  snprintf(path, sizeof path, "/v1/bundles/%s", key);
  resp r = http(&S, path, (req){.method = "PUT", .body = text,
                                .len = strlen(text)});
  assert_error(&r, 400, code);
  if (mention)
    assert_true(error_mentions(&r, mention));
  resp_free(&r);
  free(text);
  json_decref(j);
}

static void edit_arch_type(json_t *j) { json_object_set_new(j, "arch", json_integer(5)); }
static void edit_files_type(json_t *j) { json_object_set_new(j, "files", json_string("x")); }
static void edit_size_type(json_t *j) {
  json_object_set_new(json_array_get(json_object_get(j, "files"), 0), "size",
                      json_string("12"));
}
static void edit_unknown(json_t *j) { json_object_set_new(j, "surprise", json_true()); }
static void set_path(json_t *j, const char *p) {
  json_object_set_new(json_array_get(json_object_get(j, "files"), 0), "path",
                      json_string(p));
}
static void edit_dotdot(json_t *j) { set_path(j, "../evil.cubin"); }
static void edit_abs(json_t *j) { set_path(j, "/etc/passwd"); }
static void edit_deep(json_t *j) { set_path(j, "a/../../b.cubin"); }
static void edit_backslash(json_t *j) { set_path(j, "a\\..\\b"); }
static void edit_bad_sha(json_t *j) {
  json_object_set_new(json_array_get(json_object_get(j, "files"), 0), "sha256",
                      json_string("ABC"));
}

static void t_bundle_bad_manifests(void **state) {
  (void)state;
  char d[1][65], key[65], path[128];
  uint64_t size = 3;
  assert_true(put_blob(&S, NULL, "def", 3, d[0]) / 100 == 2);
  char *json = make_manifest(MODEL_A, 5, "sm_90a", d, &size, 1, key);
  put_edited(json, key, edit_arch_type, "bad_manifest", "arch");
  put_edited(json, key, edit_files_type, "bad_manifest", "files");
  put_edited(json, key, edit_size_type, "bad_manifest", "size");
  put_edited(json, key, edit_unknown, "bad_manifest", "surprise");
  put_edited(json, key, edit_dotdot, "bad_manifest", "files[0].path");
  put_edited(json, key, edit_abs, "bad_manifest", "files[0].path");
  put_edited(json, key, edit_deep, "bad_manifest", "files[0].path");
  put_edited(json, key, edit_backslash, "bad_manifest", "files[0].path");
  put_edited(json, key, edit_bad_sha, "bad_manifest", "sha256");
  snprintf(path, sizeof path, "/v1/bundles/%s", key);
  const char *malformed[] = {"{not json", "[]", "", "{\"key\":", "null"};
  for (size_t i = 0; i < sizeof malformed / sizeof *malformed; i++) {
    resp r = http(&S, path, (req){.method = "PUT", .body = malformed[i],
                                  .len = strlen(malformed[i]),
                                  .has_body = 1});
    assert_int_equal(r.status, 400);
    json_t *e = body_json(&r);
    const char *code = json_string_value(json_object_get(e, "error"));
    assert_true(strcmp(code, "bad_json") == 0 ||
                strcmp(code, "bad_manifest") == 0);
    json_decref(e);
    resp_free(&r);
  }
  resp r = http(&S, path, (req){0});
  assert_int_equal(r.status, 404); /* none of that was stored */
  resp_free(&r);
  free(json);
}

static void t_bundle_bad_key(void **state) {
  (void)state;
  for (size_t i = 0; i < N_BAD_HEX; i++) {
    char path[256];
    snprintf(path, sizeof path, "/v1/bundles/%s", bad_hex[i]);
    resp r = http(&S, path, (req){0});
    assert_error(&r, 400, "bad_key");
    resp_free(&r);
    r = http(&S, path, (req){.method = "PUT", .body = "{}", .len = 2});
    assert_error(&r, 400, "bad_key");
    resp_free(&r);
    r = http(&S, path, (req){.method = "DELETE"});
    assert_error(&r, 400, "bad_key");
    resp_free(&r);
  }
}

static void t_json_too_large(void **state) {
  (void)state;
  size_t n = 2u << 20;
  char *big = malloc(n), key[65], path[128];
  memset(big, ' ', n);
  big[0] = '{';
  big[n - 1] = '}';
  sha_hex("k", 1, key);
  snprintf(path, sizeof path, "/v1/bundles/%s", key);
  resp r = http(&S, path, (req){.method = "PUT", .body = big, .len = n});
  assert_error(&r, 413, "too_large");
  resp_free(&r);
  r = http(&S, "/v1/lookup", (req){.method = "POST", .body = big, .len = n,
                                   .chunked = 1});
  assert_error(&r, 413, "too_large");
  resp_free(&r);
  free(big);
}

static void t_lookup(void **state) {
  (void)state;
  char k1[65], k2[65], absent[65];
  char *j1 = store_bundle(&S, NULL, MODEL_A, 6, 21, k1);
  char *j2 = store_bundle(&S, NULL, MODEL_A, 7, 22, k2);
  sha_hex("absent key", 10, absent);
  char body[512];
  snprintf(body, sizeof body, "{\"keys\":[\"%s\",\"%s\",\"%s\",\"%s\"]}", k1,
           absent, k2, k1);
  resp r = http(&S, "/v1/lookup", (req){.method = "POST", .body = body,
                                        .len = strlen(body)});
  assert_int_equal(r.status, 200);
  json_t *j = body_json(&r);
  json_t *found = json_object_get(j, "found");
  assert_int_equal(json_object_size(found), 2);
  assert_string_equal(
      json_string_value(json_object_get(json_object_get(found, k1), "key")), k1);
  assert_non_null(json_object_get(found, k2));
  json_t *missing = json_object_get(j, "missing");
  assert_int_equal(json_array_size(missing), 1);
  assert_string_equal(json_string_value(json_array_get(missing, 0)), absent);
  json_decref(j);
  resp_free(&r);
  r = http(&S, "/v1/lookup", (req){.method = "POST", .body = "{\"keys\":[]}",
                                   .len = 11});
  assert_int_equal(r.status, 200);
  resp_free(&r);
  free(j1);
  free(j2);
}

static char *many_keys(size_t n) {
  size_t cap = 16 + n * 68;
  char *b = malloc(cap);
  size_t pos = (size_t)snprintf(b, cap, "{\"keys\":[");
  for (size_t i = 0; i < n; i++) {
    char k[65], seed[32];
    int len = snprintf(seed, sizeof seed, "%zu", i);
    sha_hex(seed, (size_t)len, k);
    pos += (size_t)snprintf(b + pos, cap - pos, "%s\"%s\"", i ? "," : "", k);
  }
  snprintf(b + pos, cap - pos, "]}");
  return b;
}

static void lookup_expect(const char *body, long status, const char *code,
                          const char *mention) {
  resp r = http(&S, "/v1/lookup", (req){.method = "POST", .body = body,
                                        .len = strlen(body), .has_body = 1});
  if (code)
    assert_error(&r, status, code);
  else
    assert_int_equal(r.status, status);
  if (mention)
    assert_true(error_mentions(&r, mention));
  resp_free(&r);
}

static void t_lookup_limits(void **state) {
  (void)state;
  char *ok = many_keys(KC_LOOKUP_MAX);
  lookup_expect(ok, 200, NULL, NULL);
  free(ok);
  char *over = many_keys(KC_LOOKUP_MAX + 1);
  lookup_expect(over, 400, "bad_request", "4096");
  free(over);
  lookup_expect("{\"keys\":\"abc\"}", 400, "bad_request", "keys");
  lookup_expect("{\"keys\":[1]}", 400, "bad_key", "keys[0]");
  lookup_expect("{\"keys\":[\"ABC\"]}", 400, "bad_key", "keys[0]");
  lookup_expect("{\"keys\":[],\"extra\":1}", 400, "bad_request", "extra");
  lookup_expect("{\"keys\":[", 400, "bad_json", NULL);
  lookup_expect("", 400, "bad_json", NULL);
  lookup_expect("[1,2]", 400, "bad_request", NULL);
  lookup_expect("{}", 400, "bad_request", "keys");
}

static void t_models(void **state) {
  (void)state;
  char k1[65], k2[65], k3[65], path[128];
  free(store_bundle(&S, NULL, MODEL_B, 8, 31, k1));
  free(store_bundle(&S, NULL, MODEL_B, 16, 32, k2));
  free(store_bundle(&S, NULL, MODEL_A, 8, 33, k3));
  snprintf(path, sizeof path, "/v1/models/%s", MODEL_B);
  resp r = http(&S, path, (req){0});
  assert_int_equal(r.status, 200);
  json_t *j = body_json(&r);
  json_t *list = json_object_get(j, "bundles");
  assert_int_equal(json_array_size(list), 2);
  size_t i;
  json_t *e;
  json_array_foreach(list, i, e) {
    const char *k = json_string_value(json_object_get(e, "key"));
    assert_true(strcmp(k, k1) == 0 || strcmp(k, k2) == 0);
    assert_true(json_is_object(json_object_get(e, "bucket")));
    assert_string_equal(json_string_value(json_object_get(e, "arch")), "sm_90a");
    assert_true(json_is_object(json_object_get(e, "toolchain")));
    assert_true(json_integer_value(json_object_get(e, "bytes")) > 3000);
    assert_true(json_is_integer(json_object_get(e, "created")));
    assert_true(json_is_integer(json_object_get(e, "hits")));
  }
  json_decref(j);
  resp_free(&r);
  snprintf(path, sizeof path, "/v1/models/%s", "dddd");
  r = http(&S, path, (req){0});
  assert_error(&r, 400, "bad_key");
  resp_free(&r);
}

static void t_stats(void **state) {
  (void)state;
  resp r = http(&S, "/v1/stats", (req){0});
  assert_int_equal(r.status, 200);
  json_t *j = body_json(&r);
  const char *fields[] = {"bytes_used", "max_bytes", "blobs", "bundles",
                          "hits", "misses", "evicted_bundles", "evicted_blobs"};
  for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
    assert_true(json_is_integer(json_object_get(j, fields[i])));
  assert_true(json_integer_value(json_object_get(j, "blobs")) > 0);
  json_decref(j);
  resp_free(&r);
}

static void t_metrics(void **state) {
  (void)state;
  resp r = http(&S, "/metrics", (req){0});
  assert_int_equal(r.status, 200);
  char ct[128];
  assert_true(header(&r, "Content-Type", ct, sizeof ct));
  assert_non_null(strstr(ct, "text/plain"));
  const char *want[] = {
      "kcached_requests_total{route=\"blobs\",method=\"GET\",status=\"200\"}",
      "kcached_requests_total{route=\"other\",method=\"GET\",status=\"404\"}",
      "kcached_request_duration_seconds_bucket{le=\"+Inf\"}",
      "kcached_request_duration_seconds_count",
      "kcached_received_bytes_total", "kcached_sent_bytes_total",
      "kcached_hits_total", "kcached_misses_total", "kcached_store_bytes",
      "kcached_store_limit_bytes", "kcached_evicted_bundles_total",
      "kcached_leases_granted_total", "kcached_leases_refused_total",
      "# TYPE kcached_request_duration_seconds histogram"};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    if (!strstr(r.body, want[i]))
      fprintf(stderr, "missing metric %s\n", want[i]);
    assert_non_null(strstr(r.body, want[i]));
  }
  resp_free(&r);
}

static resp lease_post(CURL *c, const char *key, const char *body) {
  char path[128];
  snprintf(path, sizeof path, "/v1/leases/%s", key);
  return http_on(c, S.url, path,
                 (req){.method = "POST", .body = body,
                       .len = body ? strlen(body) : 0, .has_body = 1});
}

static resp lease_delete(CURL *c, const char *key, const char *token) {
  char path[256];
  snprintf(path, sizeof path, "/v1/leases/%s?lease=%s", key, token);
  return http_on(c, S.url, path, (req){.method = "DELETE"});
}

static void t_leases(void **state) {
  (void)state;
  CURL *a = curl_easy_init(), *b = curl_easy_init();
  char key[65], token[128], v[64];
  char *json = store_bundle(&S, NULL, MODEL_A, 40, 41, key);
  char path[128];
  snprintf(path, sizeof path, "/v1/bundles/%s", key);
  resp r = http(&S, path, (req){.method = "DELETE"}); /* absent again */
  resp_free(&r);
  r = lease_post(a, key, "{\"holder\":\"replica-a\",\"ttl_s\":60}");
  assert_int_equal(r.status, 201);
  json_t *j = body_json(&r);
  snprintf(token, sizeof token, "%s",
           json_string_value(json_object_get(j, "lease")));
  assert_true(strlen(token) >= 16);
  assert_int_equal(json_integer_value(json_object_get(j, "expires_s")), 60);
  json_decref(j);
  resp_free(&r);
  r = lease_post(b, key, "{\"holder\":\"replica-b\",\"ttl_s\":60}");
  assert_error(&r, 409, "leased");
  j = body_json(&r);
  assert_string_equal(json_string_value(json_object_get(j, "holder")),
                      "replica-a");
  json_decref(j);
  assert_true(header(&r, "Retry-After", v, sizeof v));
  assert_true(atoi(v) >= 1 && atoi(v) <= 60);
  resp_free(&r);
  r = lease_delete(b, key, "0123456789abcdef0123456789abcdef");
  assert_error(&r, 403, "forbidden");
  resp_free(&r);
  r = lease_delete(a, key, token);
  assert_int_equal(r.status, 204);
  resp_free(&r);
  r = lease_delete(a, key, token);
  assert_error(&r, 404, "not_found");
  resp_free(&r);
  r = lease_post(b, key, NULL); /* defaults: holder, 300 s */
  assert_int_equal(r.status, 201);
  resp_free(&r);
  r = http(&S, path, (req){.method = "PUT", .body = json, .len = strlen(json)});
  assert_int_equal(r.status, 201);
  resp_free(&r);
  r = lease_post(a, key, "{\"holder\":\"replica-a\"}");
  assert_int_equal(r.status, 200);
  j = body_json(&r);
  assert_string_equal(json_string_value(json_object_get(j, "status")),
                      "present");
  json_decref(j);
  resp_free(&r);
  free(json);
  curl_easy_cleanup(a);
  curl_easy_cleanup(b);
}

static void t_lease_ttl(void **state) {
  (void)state;
  char key[65];
  sha_hex("short lease", 11, key);
  resp r = lease_post(NULL, key, "{\"holder\":\"a\",\"ttl_s\":1}");
  assert_int_equal(r.status, 201);
  resp_free(&r);
  r = lease_post(NULL, key, "{\"holder\":\"b\",\"ttl_s\":1}");
  assert_int_equal(r.status, 409);
  resp_free(&r);
  sleep_ms(1300);
  r = lease_post(NULL, key, "{\"holder\":\"b\",\"ttl_s\":1}");
  assert_int_equal(r.status, 201);
  resp_free(&r);
}

static void t_lease_bad(void **state) {
  (void)state;
  char key[65];
  sha_hex("bad lease", 9, key);
  const char *bodies[] = {"{\"holder\":\"a\",\"x\":1}", "{\"ttl_s\":\"x\"}",
                          "{\"ttl_s\":0}",           "{\"ttl_s\":99999999}",
                          "{\"holder\":5}",          "{\"holder\":\"\"}",
                          "{\"holder\":",            "[]"};
  for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) {
    resp r = lease_post(NULL, key, bodies[i]);
    assert_int_equal(r.status, 400);
    resp_free(&r);
  }
  resp r = lease_post(NULL, "ABC", "{}");
  assert_error(&r, 400, "bad_key");
  resp_free(&r);
  char path[128];
  snprintf(path, sizeof path, "/v1/leases/%s", key);
  r = http(&S, path, (req){.method = "DELETE"});
  assert_error(&r, 400, "bad_request");
  resp_free(&r);
}

static void t_keepalive(void **state) {
  (void)state;
  CURL *c = curl_easy_init();
  char data[4096], d[65], path[128], fresh[65];
  fill_random(data, sizeof data, 50);
  assert_true(put_blob(&S, NULL, data, sizeof data, d) / 100 == 2);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  for (int i = 0; i < 60; i++) {
    resp r;
    long want = 200;
    switch (i % 6) {
    case 0: r = http_on(c, S.url, path, (req){0}); break;
    case 1: r = http_on(c, S.url, path, (req){.method = "HEAD"}); break;
    case 2: r = http_on(c, S.url, "/healthz", (req){0}); break;
    case 3: r = http_on(c, S.url, "/nope", (req){0}); want = 404; break;
    case 4:
      r = http_on(c, S.url, "/healthz", (req){.method = "DELETE"});
      want = 405;
      break;
    default: {
      char blob[64], p2[128];
      snprintf(blob, sizeof blob, "keepalive blob %d", i);
      sha_hex(blob, strlen(blob), fresh);
      snprintf(p2, sizeof p2, "/v1/blobs/%s", fresh);
      r = http_on(c, S.url, p2, (req){.method = "PUT", .body = blob,
                                      .len = strlen(blob)});
      want = 201;
    }
    }
    assert_int_equal(r.rc, CURLE_OK);
    assert_int_equal(r.status, want);
    if (i > 0) {
      if (r.connects != 0)
        fprintf(stderr, "request %d opened a new connection\n", i);
      assert_int_equal(r.connects, 0);
    }
    resp_free(&r);
  }
  curl_easy_cleanup(c);
}

static void t_access_log(void **state) {
  (void)state;
  char *log = slurp(S.log);
  assert_non_null(strstr(log, " GET /healthz 200 "));
  assert_non_null(strstr(log, "us="));
  assert_non_null(strstr(log, "no token file"));
  free(log);
}

/* ---- auth ---- */

typedef struct toks {
  char read[80], write[80], admin[80];
} toks;

/* Makes a token with `kcached token` and appends its line to file. */
static void new_token(const char *role, const char *name, const char *file,
                      char *token, size_t cap) {
  char cmd[1024], out[512];
  snprintf(cmd, sizeof cmd, "%s token %s %s 2>/dev/null", kc_testsrv_bin(),
           role, name);
  assert_int_equal(run_sh(cmd, out, sizeof out), 0);
  char *nl = strchr(out, '\n');
  assert_non_null(nl);
  *nl = '\0';
  assert_true(strlen(out) < cap);
  memcpy(token, out, strlen(out) + 1);
  FILE *f = fopen(file, "a");
  assert_non_null(f);
  fputs(nl + 1, f);
  fclose(f);
}

static kc_testsrv A;
static toks T;
static char token_file[512];

static int auth_setup(void **state) {
  (void)state;
  if (kc_testsrv_init(&A))
    return -1;
  snprintf(token_file, sizeof token_file, "%s/tokens", A.dir);
  FILE *f = fopen(token_file, "w");
  fputs("# kcache tokens\n\n", f);
  fclose(f);
  new_token("read", "reader", token_file, T.read, sizeof T.read);
  new_token("write", "ci-writer", token_file, T.write, sizeof T.write);
  new_token("admin", "ops", token_file, T.admin, sizeof T.admin);
  const char *const args[] = {"--tokens", token_file, NULL};
  return kc_testsrv_start(&A, args);
}

static int auth_teardown(void **state) {
  (void)state;
  int rc = kc_testsrv_stop(&A);
  kc_testsrv_cleanup(&A);
  return rc == 0 ? 0 : -1;
}

typedef struct route_case {
  const char *method;
  char path[160];
  const char *body;
  int need; /* 0 none, 1 read, 2 write, 3 admin */
} route_case;

static size_t route_cases(route_case *c, const char *d, const char *key) {
  size_t n = 0;
  c[n++] = (route_case){"GET", "/healthz", NULL, 0};
  c[n++] = (route_case){"GET", "/readyz", NULL, 0};
  c[n++] = (route_case){"GET", "/metrics", NULL, 0};
  c[n++] = (route_case){"GET", "/v1/stats", NULL, 1};
  c[n] = (route_case){"GET", "", NULL, 1};
  snprintf(c[n++].path, sizeof c->path, "/v1/blobs/%s", d);
  c[n] = (route_case){"HEAD", "", NULL, 1};
  snprintf(c[n++].path, sizeof c->path, "/v1/blobs/%s", d);
  c[n] = (route_case){"PUT", "", "x", 2};
  snprintf(c[n++].path, sizeof c->path, "/v1/blobs/%s", d);
  c[n] = (route_case){"GET", "", NULL, 1};
  snprintf(c[n++].path, sizeof c->path, "/v1/bundles/%s", key);
  c[n] = (route_case){"PUT", "", "{}", 2};
  snprintf(c[n++].path, sizeof c->path, "/v1/bundles/%s", key);
  c[n] = (route_case){"DELETE", "", NULL, 3};
  snprintf(c[n++].path, sizeof c->path, "/v1/bundles/%s", key);
  c[n++] = (route_case){"POST", "/v1/lookup", "{\"keys\":[]}", 1};
  c[n] = (route_case){"GET", "", NULL, 1};
  snprintf(c[n++].path, sizeof c->path, "/v1/models/%s", MODEL_A);
  c[n] = (route_case){"POST", "", "{\"holder\":\"x\",\"ttl_s\":1}", 2};
  snprintf(c[n++].path, sizeof c->path, "/v1/leases/%s", key);
  /* another key: no lease there, so a permitted DELETE answers 404 */
  c[n] = (route_case){"DELETE", "", NULL, 2};
  snprintf(c[n++].path, sizeof c->path,
           "/v1/leases/%s?lease=00000000000000000000000000000000", d);
  return n;
}

static void t_auth_matrix(void **state) {
  (void)state;
  char d[65], key[65];
  sha_hex("x", 1, d);
  sha_hex("some key", 8, key);
  route_case cases[32];
  size_t n = route_cases(cases, d, key);
  const char *tokens[4] = {NULL, T.read, T.write, T.admin};
  for (size_t i = 0; i < n; i++) {
    for (int role = 0; role < 4; role++) {
      route_case *c = &cases[i];
      resp r = http(&A, c->path,
                    (req){.method = c->method, .token = tokens[role],
                          .body = c->body, .len = c->body ? strlen(c->body) : 0});
      long want = c->need == 0 || role >= c->need ? 0 : role == 0 ? 401 : 403;
      if ((want && r.status != want) ||
          (!want && (r.status == 401 || r.status == 403)))
        fprintf(stderr, "%s %s as role %d: got %ld\n", c->method, c->path,
                role, r.status);
      if (want)
        assert_int_equal(r.status, want);
      else
        assert_true(r.status != 401 && r.status != 403);
      if (r.status == 401) {
        char v[128];
        assert_true(header(&r, "WWW-Authenticate", v, sizeof v));
      }
      if (want && strcmp(c->method, "HEAD") != 0)
        assert_error(&r, want, want == 401 ? "unauthorized" : "forbidden");
      resp_free(&r);
    }
    /* a token nobody issued, and a header that is not Bearer */
    if (cases[i].need) {
      resp r = http(&A, cases[i].path,
                    (req){.method = cases[i].method, .token = "kc_forged"});
      assert_int_equal(r.status, 401);
      resp_free(&r);
      r = http(&A, cases[i].path,
               (req){.method = cases[i].method, .auth = "Basic dXNlcjpwYXNz"});
      assert_int_equal(r.status, 401);
      resp_free(&r);
    }
  }
}

static void t_auth_tokens_not_logged(void **state) {
  (void)state;
  char d[65];
  assert_int_equal(put_blob(&A, T.write, "logged?", 7, d), 201);
  /* Access lines reach the log within a second (buffered). */
  char *log = slurp(A.log);
  for (int i = 0; i < 40 && !strstr(log, d); i++) {
    free(log);
    sleep_ms(100);
    log = slurp(A.log);
  }
  assert_non_null(strstr(log, d));
  assert_null(strstr(log, T.read));
  assert_null(strstr(log, T.write));
  assert_null(strstr(log, T.admin));
  assert_non_null(strstr(log, "token=ci-writer"));
  free(log);
}

/* ---- servers of their own ---- */

static void t_metrics_role(void **state) {
  (void)state;
  kc_testsrv t;
  assert_int_equal(kc_testsrv_init(&t), 0);
  char file[512], tok[80];
  snprintf(file, sizeof file, "%s/tokens", t.dir);
  new_token("read", "prom", file, tok, sizeof tok);
  const char *const args[] = {"--tokens", file, "--metrics-role", "read", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  resp r = http(&t, "/metrics", (req){0});
  assert_int_equal(r.status, 401);
  resp_free(&r);
  r = http(&t, "/metrics", (req){.token = tok});
  assert_int_equal(r.status, 200);
  resp_free(&r);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

static void check_kept(const kc_testsrv *t, const char *d, const char *blob,
                       size_t n, const char *key, const char *json) {
  char path[128];
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(t, path, (req){0});
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, n);
  assert_memory_equal(r.body, blob, n);
  resp_free(&r);
  snprintf(path, sizeof path, "/v1/bundles/%s", key);
  r = http(t, path, (req){0});
  assert_int_equal(r.status, 200);
  assert_string_equal(r.body, json);
  resp_free(&r);
}

static void t_restart_keeps_data(void **state) {
  (void)state;
  kc_testsrv t = {0};
  assert_int_equal(kc_testsrv_start(&t, NULL), 0);
  char blob[10000], d[65], key[65];
  fill_random(blob, sizeof blob, 60);
  assert_int_equal(put_blob(&t, NULL, blob, sizeof blob, d), 201);
  char *json = store_bundle(&t, NULL, MODEL_A, 60, 61, key);
  assert_int_equal(kc_testsrv_stop(&t), 0); /* graceful: exit 0 */
  assert_int_equal(kc_testsrv_restart(&t), 0);
  check_kept(&t, d, blob, sizeof blob, key, json);
  kc_testsrv_kill(&t); /* a crash loses nothing committed either */
  assert_int_equal(kc_testsrv_restart(&t), 0);
  check_kept(&t, d, blob, sizeof blob, key, json);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
  free(json);
}

/* A PUT with X-Kcache-Repair: 1 (what a client sends after a blob we served
 * failed its hash). */
static long put_repair(const kc_testsrv *t, const void *p, size_t n,
                       const char *digest) {
  char path[128];
  snprintf(path, sizeof path, "/v1/blobs/%s", digest);
  resp r = http(t, path, (req){.method = "PUT", .body = p, .len = n,
                               .has_body = 1, .header = "X-Kcache-Repair: 1"});
  resp_free(&r);
  return r.status;
}

/* Bit rot in a held blob: GETs serve the held bytes unhashed (clients
 * verify); a plain offer is "present" unhashed; a repair offer of other
 * bytes is refused; one of the right bytes replaces them; counted. */
static void t_blob_rot_repaired(void **state) {
  (void)state;
  kc_testsrv t = {0};
  /* the scrub off: it would remove the rotted blob before the client */
  const char *const args[] = {"--scrub-rate", "0", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  char blob[20000], d[65], key[65], path[128];
  fill_random(blob, sizeof blob, 62);
  assert_int_equal(put_blob(&t, NULL, blob, sizeof blob, d), 201);
  char *json = store_bundle(&t, NULL, MODEL_A, 62, 63, key);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  assert_true(kc_testsrv_rot(&t, blob, sizeof blob) >= 1);
  assert_int_equal(kc_testsrv_restart(&t), 0);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(&t, path, (req){0});
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, sizeof blob);
  assert_memory_not_equal(r.body, blob, sizeof blob); /* rotted, as held */
  resp_free(&r);
  assert_int_equal(put_blob(&t, NULL, blob, sizeof blob, d), 200);
  assert_int_equal(metric(&t, "kcached_blobs_corrupt_total"), 0);
  char wrong[sizeof blob];
  memcpy(wrong, blob, sizeof blob);
  wrong[0] ^= 1; /* other bytes under the digest: refused, the rot stays */
  assert_int_equal(put_repair(&t, wrong, sizeof wrong, d), 422);
  assert_int_equal(put_repair(&t, blob, sizeof blob, d), 201);
  assert_int_equal(put_repair(&t, blob, sizeof blob, d), 200); /* sound */
  assert_int_equal(metric(&t, "kcached_blobs_corrupt_total"), 2);
  check_kept(&t, d, blob, sizeof blob, key, json);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
  free(json);
}

/* The scrub (default --scrub-rate) finds a rotted blob by itself and removes
 * it with the bundle naming it: neither is served; the next upload stays. */
static void t_scrub_removes_rotted(void **state) {
  (void)state;
  kc_testsrv t = {0};
  assert_int_equal(kc_testsrv_start(&t, NULL), 0);
  char blob[3000], d[65], key[65], path[128];
  char *json = store_bundle(&t, NULL, MODEL_A, 64, 64, key);
  fill_random(blob, sizeof blob, 64 * 7 + 1); /* store_bundle's 2nd blob */
  assert_int_equal(put_blob(&t, NULL, blob, sizeof blob, d), 200);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  assert_true(kc_testsrv_rot(&t, blob, sizeof blob) >= 1);
  assert_int_equal(kc_testsrv_restart(&t), 0);
  long found = 0;
  for (int i = 0; i < 500 && found == 0; i++) {
    if ((found = metric(&t, "kcached_scrub_corrupt_total")) == 0)
      sleep_ms(20);
  }
  assert_int_equal(found, 1);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(&t, path, (req){0});
  assert_int_equal(r.status, 404);
  resp_free(&r);
  snprintf(path, sizeof path, "/v1/bundles/%s", key);
  r = http(&t, path, (req){0});
  assert_int_equal(r.status, 404);
  resp_free(&r);
  /* The client's rebuild uploads both again; the scrub leaves them. */
  free(json);
  json = store_bundle(&t, NULL, MODEL_A, 64, 64, key);
  long passes = metric(&t, "kcached_scrub_passes_total");
  for (int i = 0; i < 500 && metric(&t, "kcached_scrub_passes_total") <
                                 passes + 2; i++)
    sleep_ms(20);
  assert_true(metric(&t, "kcached_scrub_passes_total") >= passes + 2);
  assert_int_equal(metric(&t, "kcached_scrub_corrupt_total"), 1);
  check_kept(&t, d, blob, sizeof blob, key, json);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
  free(json);
}

static long status_with(const kc_testsrv *t, const char *token) {
  resp r = http(t, "/v1/stats", (req){.token = token});
  resp_free(&r);
  return r.status;
}

static long wait_status(const kc_testsrv *t, const char *token, long want) {
  long st = 0;
  for (int i = 0; i < 250 && st != want; i++) {
    st = status_with(t, token);
    if (st != want)
      sleep_ms(20);
  }
  return st;
}

static void t_sighup_reload(void **state) {
  (void)state;
  kc_testsrv t;
  assert_int_equal(kc_testsrv_init(&t), 0);
  char file[512], first[80], second[80], side[512];
  snprintf(file, sizeof file, "%s/tokens", t.dir);
  snprintf(side, sizeof side, "%s/side", t.dir);
  new_token("read", "first", file, first, sizeof first);
  new_token("read", "second", side, second, sizeof second);
  const char *const args[] = {"--tokens", file, NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  assert_int_equal(status_with(&t, first), 200);
  assert_int_equal(status_with(&t, second), 401);
  /* add the second token */
  char *line = slurp(side);
  FILE *f = fopen(file, "a");
  fputs(line, f);
  fclose(f);
  kill(t.pid, SIGHUP);
  assert_int_equal(wait_status(&t, second, 200), 200);
  /* drop the first */
  f = fopen(file, "w");
  fputs(line, f);
  fclose(f);
  free(line);
  kill(t.pid, SIGHUP);
  assert_int_equal(wait_status(&t, first, 401), 401);
  assert_int_equal(status_with(&t, second), 200);
  /* a broken file keeps the tokens there were */
  f = fopen(file, "w");
  fputs("this is not a token line\n", f);
  fclose(f);
  kill(t.pid, SIGHUP);
  sleep_ms(300);
  assert_int_equal(status_with(&t, second), 200);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  char *log = slurp(t.log);
  assert_non_null(strstr(log, "keeping the old tokens"));
  free(log);
  kc_testsrv_cleanup(&t);
}

static int make_certs(const char *dir) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "cd '%s' && ( "
           "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "
           "'/CN=kcache test CA' -keyout ca.key -out ca.crt && "
           "openssl req -newkey rsa:2048 -nodes -subj '/CN=127.0.0.1' "
           "-keyout srv.key -out srv.csr && "
           "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > ext.cnf && "
           "openssl x509 -req -in srv.csr -CA ca.crt -CAkey ca.key "
           "-CAcreateserial -days 2 -extfile ext.cnf -out srv.crt ) 2>&1",
           dir);
  return run_sh(cmd, NULL, 0);
}

static void t_tls(void **state) {
  (void)state;
  kc_testsrv t;
  assert_int_equal(kc_testsrv_init(&t), 0);
  assert_int_equal(make_certs(t.dir), 0);
  char cert[512], key[512], ca[512], file[512], tok[80];
  snprintf(cert, sizeof cert, "%s/srv.crt", t.dir);
  snprintf(key, sizeof key, "%s/srv.key", t.dir);
  snprintf(ca, sizeof ca, "%s/ca.crt", t.dir);
  snprintf(file, sizeof file, "%s/tokens", t.dir);
  new_token("write", "tls-client", file, tok, sizeof tok);
  const char *const args[] = {"--tls-cert", cert, "--tls-key", key,
                              "--tokens", file, NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  assert_int_equal(strncmp(t.url, "https://", 8), 0);
  resp r = http(&t, "/healthz", (req){.cainfo = ca});
  assert_int_equal(r.rc, CURLE_OK);
  assert_int_equal(r.status, 200);
  resp_free(&r);
  char blob[3000], d[65], path[128];
  fill_random(blob, sizeof blob, 70);
  sha_hex(blob, sizeof blob, d);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  r = http(&t, path, (req){.method = "PUT", .token = tok, .body = blob,
                           .len = sizeof blob, .cainfo = ca});
  assert_int_equal(r.status, 201);
  resp_free(&r);
  r = http(&t, path, (req){.token = tok, .cainfo = ca});
  assert_int_equal(r.status, 200);
  assert_memory_equal(r.body, blob, sizeof blob);
  resp_free(&r);
  /* without the CA the certificate does not verify */
  r = http(&t, "/healthz", (req){.cainfo = "/nonexistent-ca.crt"});
  assert_int_not_equal(r.rc, CURLE_OK);
  resp_free(&r);
  /* plain HTTP to the TLS port gets no answer */
  char plain[96];
  snprintf(plain, sizeof plain, "http://127.0.0.1:%d", t.port);
  r = http_on(NULL, plain, "/healthz", (req){0});
  assert_true(r.rc != CURLE_OK || r.status != 200);
  resp_free(&r);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

static void t_readyz_not_open(void **state) {
  (void)state;
  kc_testsrv t;
  assert_int_equal(kc_testsrv_init(&t), 0);
  char file[512];
  snprintf(file, sizeof file, "%s/not-a-dir", t.dir);
  FILE *f = fopen(file, "w");
  fputs("x", f);
  fclose(f);
  const char *const args[] = {"--data-dir", file, "--store-wait", "60", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  resp r = http(&t, "/healthz", (req){0});
  assert_int_equal(r.status, 200);
  resp_free(&r);
  r = http(&t, "/readyz", (req){0});
  assert_error(&r, 503, "not_ready");
  resp_free(&r);
  char d[65], path[128];
  sha_hex("x", 1, d);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  r = http(&t, path, (req){0});
  assert_error(&r, 503, "not_ready");
  resp_free(&r);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

static int run_kcached(const char *args, char *out, size_t cap) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "env -u KCACHED_THREADS %s %s 2>&1",
           kc_testsrv_bin(), args);
  return run_sh(cmd, out, cap);
}

/* Without --store-wait, a data directory that cannot hold a store stops
 * kcached at once: exit 3 and a message naming the path. */
static void t_store_unopenable_exits(void **state) {
  (void)state;
  static char out[4096];
  char dir[] = "/tmp/kcd-unopenable-XXXXXX", args[512];
  assert_non_null(mkdtemp(dir));
  char file[300];
  snprintf(file, sizeof file, "%s/not-a-dir", dir);
  FILE *f = fopen(file, "w");
  assert_non_null(f);
  fclose(f);
  snprintf(args, sizeof args, "--listen 127.0.0.1:0 --data-dir %s", file);
  assert_int_equal(run_kcached(args, out, sizeof out), 3);
  assert_non_null(strstr(out, file));
  unlink(file);
  rmdir(dir);
}

static void t_flags(void **state) {
  (void)state;
  static char out[16384];
  assert_int_equal(run_kcached("--help", out, sizeof out), 0);
  const char *flags[] = {"--listen", "--port-file", "--data-dir",
                         "--max-bytes", "--max-blob-bytes", "--tokens",
                         "--threads", "--log-format", "--tls-cert",
                         "--tls-key", "--allow-plaintext", "KCACHED_LISTEN",
                         "KCACHED_DATA_DIR", "KCACHED_THREADS", "token ROLE",
                         "--scrub-rate", "KCACHED_SCRUB_RATE"};
  for (size_t i = 0; i < sizeof flags / sizeof *flags; i++)
    assert_non_null(strstr(out, flags[i]));
  const char *bad[] = {"--bogus", "--threads 0", "--threads x",
                       "--log-format xml", "--listen nocolon",
                       "--max-bytes 12Q", "--listen 127.0.0.1:99999",
                       "--scrub-rate 2T", "--scrub-rate -1",
                       "stray-argument", "--tokens /nonexistent/tokens "
                                         "--listen 127.0.0.1:0"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    int rc = run_kcached(bad[i], out, sizeof out);
    if (rc != 2)
      fprintf(stderr, "kcached %s: exit %d\n", bad[i], rc);
    assert_int_equal(rc, 2);
    assert_true(strlen(out) > 0);
  }
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "KCACHED_LOG_FORMAT=yaml %s --help 2>&1",
           kc_testsrv_bin());
  assert_int_equal(run_sh(cmd, out, sizeof out), 2);
  assert_non_null(strstr(out, "KCACHED_LOG_FORMAT"));
  /* refusals */
  assert_int_equal(run_kcached("--listen 0.0.0.0:0", out, sizeof out), 2);
  assert_non_null(strstr(out, "refusing"));
}

static void t_refuse_plaintext(void **state) {
  (void)state;
  char dir[] = "/tmp/kcache-flags-XXXXXX", file[128], tok[80], args[512];
  static char out[4096];
  assert_non_null(mkdtemp(dir));
  snprintf(file, sizeof file, "%s/tokens", dir);
  new_token("read", "x", file, tok, sizeof tok);
  snprintf(args, sizeof args, "--listen 0.0.0.0:0 --tokens %s", file);
  assert_int_equal(run_kcached(args, out, sizeof out), 2);
  assert_non_null(strstr(out, "--allow-plaintext"));
  snprintf(args, sizeof args, "--listen [::]:0 --tokens %s", file);
  assert_int_equal(run_kcached(args, out, sizeof out), 2);
  snprintf(args, sizeof args, "--listen 127.0.0.1:0 --tls-cert %s", file);
  assert_int_equal(run_kcached(args, out, sizeof out), 2);
  unlink(file);
  rmdir(dir);
}

static void t_token_command(void **state) {
  (void)state;
  char cmd[1024], out[1024];
  snprintf(cmd, sizeof cmd, "%s token write ci-7 2>/dev/null",
           kc_testsrv_bin());
  assert_int_equal(run_sh(cmd, out, sizeof out), 0);
  char token[128], role[16], name[64], hex[80];
  assert_int_equal(sscanf(out, "%127s %15s %63s %79s", token, role, name, hex),
                   4);
  assert_string_equal(role, "write");
  assert_string_equal(name, "ci-7");
  char want[65];
  sha_hex(token, strlen(token), want);
  assert_string_equal(hex, want);
  char again[1024];
  assert_int_equal(run_sh(cmd, again, sizeof again), 0);
  assert_string_not_equal(out, again); /* random */
  snprintf(cmd, sizeof cmd, "%s token root x 2>&1", kc_testsrv_bin());
  assert_int_equal(run_sh(cmd, out, sizeof out), 2);
  snprintf(cmd, sizeof cmd, "%s token read 'bad name' 2>&1", kc_testsrv_bin());
  assert_int_equal(run_sh(cmd, out, sizeof out), 2);
}

static void t_json_log(void **state) {
  (void)state;
  kc_testsrv t = {0};
  const char *const args[] = {"--log-format", "json", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  resp r = http(&t, "/nope%0A%22injected", (req){0});
  resp_free(&r);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  char *log = slurp(t.log), *save = NULL;
  int access = 0;
  for (char *line = strtok_r(log, "\n", &save); line;
       line = strtok_r(NULL, "\n", &save)) {
    if (strncmp(line, "==", 2) == 0)
      continue; /* a sanitizer's own report is not ours */
    json_t *j = json_loads(line, 0, NULL);
    if (!j)
      fprintf(stderr, "not JSON: %s\n", line);
    assert_non_null(j);
    assert_non_null(json_object_get(j, "ts"));
    if (strcmp(json_string_value(json_object_get(j, "level")), "access") == 0) {
      access++;
      assert_true(json_is_integer(json_object_get(j, "status")));
      assert_true(json_is_integer(json_object_get(j, "us")));
      assert_non_null(json_object_get(j, "token"));
      assert_non_null(json_object_get(j, "method"));
    }
    json_decref(j);
  }
  assert_true(access >= 2);
  free(log);
  kc_testsrv_cleanup(&t);
}

/* SIGTERM while an upload is half sent: it still completes. */
static void t_graceful_stop(void **state) {
  (void)state;
  kc_testsrv t = {0};
  assert_int_equal(kc_testsrv_start(&t, NULL), 0);
  size_t n = 200000;
  char *blob = malloc(n), d[65], head[512], reply[4096];
  fill_random(blob, n, 80);
  sha_hex(blob, n, d);
  int fd = raw_connect(t.port);
  int h = snprintf(head, sizeof head,
                   "PUT /v1/blobs/%s HTTP/1.1\r\nHost: x\r\n"
                   "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                   d, n);
  raw_send(fd, head, (size_t)h);
  raw_send(fd, blob, n / 2);
  sleep_ms(200);
  kill(t.pid, SIGTERM);
  sleep_ms(300);
  raw_send(fd, blob + n / 2, n - n / 2);
  raw_recv_all(fd, reply, sizeof reply);
  close(fd);
  assert_non_null(strstr(reply, "HTTP/1.1 201"));
  int waited = 0, rc = -1, st;
  while (waited < 30000 && waitpid(t.pid, &st, WNOHANG) == 0) {
    sleep_ms(20);
    waited += 20;
  }
  rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  t.pid = 0;
  assert_int_equal(rc, 0);
  /* new connections are refused once it stops listening */
  assert_int_equal(kc_testsrv_restart(&t), 0);
  char path[128];
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(&t, path, (req){0});
  assert_int_equal(r.status, 200);
  resp_free(&r);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
  free(blob);
}

/* A client that sends half a request and stalls is cut off. */
static void t_idle_timeout(void **state) {
  (void)state;
  kc_testsrv t = {0};
  const char *const args[] = {"--timeout", "1", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  int fd = raw_connect(t.port);
  raw_send(fd, "GET /healthz HTTP/1.1\r\nHo", 26);
  char buf[256];
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  ssize_t n = recv(fd, buf, sizeof buf, 0); /* blocks until closed */
  clock_gettime(CLOCK_MONOTONIC, &b);
  close(fd);
  assert_true(n <= 0);
  double waited = (double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
  assert_true(waited >= 0.5 && waited < 10);
  resp r = http(&t, "/healthz", (req){0}); /* others are still served */
  assert_int_equal(r.status, 200);
  resp_free(&r);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

/* Every flag has a KCACHED_* variable; flags win over them. */
static void t_env_vars(void **state) {
  (void)state;
  kc_testsrv t = {0};
  setenv("KCACHED_MAX_BLOB_BYTES", "2K", 1);
  setenv("KCACHED_LOG_FORMAT", "json", 1);
  const char *const args[] = {"--log-format", "text", NULL};
  int rc = kc_testsrv_start(&t, args);
  unsetenv("KCACHED_MAX_BLOB_BYTES");
  unsetenv("KCACHED_LOG_FORMAT");
  assert_int_equal(rc, 0);
  char blob[3000], d[65];
  fill_random(blob, sizeof blob, 90);
  assert_int_equal(put_blob(&t, NULL, blob, sizeof blob, d), 413);
  assert_int_equal(put_blob(&t, NULL, blob, 2000, d), 201);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  char *log = slurp(t.log);
  assert_non_null(strstr(log, " info listening on ")); /* text, not JSON */
  free(log);
  kc_testsrv_cleanup(&t);
}

int main(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest api[] = {
      cmocka_unit_test(t_health),
      cmocka_unit_test(t_unknown_routes),
      cmocka_unit_test(t_wrong_methods),
      cmocka_unit_test(t_blob_roundtrip),
      cmocka_unit_test(t_blob_missing),
      cmocka_unit_test(t_blob_bad_digest),
      cmocka_unit_test(t_blob_mismatch),
      cmocka_unit_test(t_blob_too_large),
      cmocka_unit_test(t_blob_pieces),
      cmocka_unit_test(t_upload_disconnect),
      cmocka_unit_test(t_bundle_roundtrip),
      cmocka_unit_test(t_bundle_conflict),
      cmocka_unit_test(t_bundle_missing_blobs),
      cmocka_unit_test(t_bundle_key_mismatch),
      cmocka_unit_test(t_bundle_bad_manifests),
      cmocka_unit_test(t_bundle_bad_key),
      cmocka_unit_test(t_json_too_large),
      cmocka_unit_test(t_lookup),
      cmocka_unit_test(t_lookup_limits),
      cmocka_unit_test(t_models),
      cmocka_unit_test(t_stats),
      cmocka_unit_test(t_leases),
      cmocka_unit_test(t_lease_ttl),
      cmocka_unit_test(t_lease_bad),
      cmocka_unit_test(t_keepalive),
      cmocka_unit_test(t_metrics),
      cmocka_unit_test(t_access_log),
  };
  const struct CMUnitTest auth[] = {
      cmocka_unit_test(t_auth_matrix),
      cmocka_unit_test(t_auth_tokens_not_logged),
  };
  const struct CMUnitTest own[] = {
      cmocka_unit_test(t_metrics_role),
      cmocka_unit_test(t_restart_keeps_data),
      cmocka_unit_test(t_blob_rot_repaired),
      cmocka_unit_test(t_scrub_removes_rotted),
      cmocka_unit_test(t_sighup_reload),
      cmocka_unit_test(t_tls),
      cmocka_unit_test(t_readyz_not_open),
      cmocka_unit_test(t_store_unopenable_exits),
      cmocka_unit_test(t_flags),
      cmocka_unit_test(t_refuse_plaintext),
      cmocka_unit_test(t_token_command),
      cmocka_unit_test(t_json_log),
      cmocka_unit_test(t_graceful_stop),
      cmocka_unit_test(t_idle_timeout),
      cmocka_unit_test(t_env_vars),
  };
  int fails = cmocka_run_group_tests_name("api", api, open_setup, open_teardown);
  fails += cmocka_run_group_tests_name("auth", auth, auth_setup, auth_teardown);
  fails += cmocka_run_group_tests_name("own servers", own, NULL, NULL);
  curl_global_cleanup();
  return fails ? 1 : 0;
}
