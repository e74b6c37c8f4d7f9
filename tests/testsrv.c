/* testsrv.c: runs the real kcached for integration tests (see testsrv.h). */
#include "testsrv.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "kc_schema.h"

#ifndef KCACHED_BIN
#define KCACHED_BIN "kcached"
#endif

#define START_WAIT_MS 30000 /* sanitizer builds start slowly */
#define STOP_WAIT_MS 30000

const char *kc_testsrv_bin(void) {
  const char *b = getenv("KCACHED_BIN");
  return b && *b ? b : KCACHED_BIN;
}

long kc_testsrv_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void kc_testsrv_sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

int kc_testsrv_init(kc_testsrv *t) {
  memset(t, 0, sizeof *t);
  const char *tmp = getenv("TMPDIR");
  snprintf(t->dir, sizeof t->dir, "%s/kcache-srv-XXXXXX",
           tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(t->dir)) {
    t->dir[0] = '\0';
    return -1;
  }
  snprintf(t->data, sizeof t->data, "%s/data", t->dir);
  snprintf(t->log, sizeof t->log, "%s/kcached.log", t->dir);
  return 0;
}

static void free_args(kc_testsrv *t) {
  for (int i = 0; i < t->n_args; i++)
    free(t->args[i]);
  t->n_args = 0;
}

static int copy_args(kc_testsrv *t, const char *const *extra) {
  free_args(t);
  for (size_t i = 0; extra && extra[i]; i++) {
    if (t->n_args == KC_TESTSRV_MAX_ARGS ||
        !(t->args[t->n_args] = strdup(extra[i])))
      return -1;
    t->n_args++;
  }
  return 0;
}

static int has_tls(const kc_testsrv *t) {
  for (int i = 0; i < t->n_args; i++)
    if (strcmp(t->args[i], "--tls-cert") == 0)
      return 1;
  return 0;
}

/* In the child: output to the log, die with the test, exec kcached. */
static void child(const kc_testsrv *t, const char *port_file) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  int fd = open(t->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd >= 0) {
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
  }
  const char *argv[KC_TESTSRV_MAX_ARGS + 10];
  int n = 0;
  argv[n++] = kc_testsrv_bin();
  argv[n++] = "--listen";
  argv[n++] = "127.0.0.1:0";
  argv[n++] = "--port-file";
  argv[n++] = port_file;
  argv[n++] = "--data-dir";
  argv[n++] = t->data;
  for (int i = 0; i < t->n_args; i++)
    argv[n++] = t->args[i];
  argv[n] = NULL;
  execv(argv[0], (char *const *)argv);
  fprintf(stderr, "testsrv: exec %s: %s\n", argv[0], strerror(errno));
  _exit(127);
}

static int read_port(const char *path) {
  FILE *f = fopen(path, "r");
  int port = 0;
  if (!f)
    return 0;
  if (fscanf(f, "%d", &port) != 1)
    port = 0;
  fclose(f);
  return port;
}

static size_t discard(char *p, size_t s, size_t n, void *ud) {
  (void)p;
  (void)ud;
  return s * n;
}

static int healthy(const kc_testsrv *t) {
  CURL *c = curl_easy_init();
  char url[128];
  long status = 0;
  if (!c)
    return 0;
  snprintf(url, sizeof url, "%s/healthz", t->url);
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 2000L);
  /* Readiness only: the tests check certificates themselves. */
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 0L);
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 0L);
  if (curl_easy_perform(c) == CURLE_OK)
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(c);
  return status == 200;
}

/* Polls until the port file appears and /healthz answers, or the child dies. */
static int wait_ready(kc_testsrv *t, const char *port_file) {
  for (int waited = 0; waited < START_WAIT_MS; waited += 20) {
    int st;
    if (waitpid(t->pid, &st, WNOHANG) == t->pid) {
      t->pid = 0;
      return -1;
    }
    if (!t->port && (t->port = read_port(port_file)) > 0)
      snprintf(t->url, sizeof t->url, "%s://127.0.0.1:%d",
               has_tls(t) ? "https" : "http", t->port);
    if (t->port && healthy(t))
      return 0;
    kc_testsrv_sleep_ms(20);
  }
  kc_testsrv_kill(t);
  return -1;
}

static int launch(kc_testsrv *t) {
  char port_file[320];
  snprintf(port_file, sizeof port_file, "%s/port", t->dir);
  unlink(port_file);
  t->port = 0;
  t->url[0] = '\0';
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0)
    child(t, port_file);
  t->pid = pid;
  return wait_ready(t, port_file);
}

int kc_testsrv_start(kc_testsrv *t, const char *const *extra_args) {
  if (!t->dir[0] && kc_testsrv_init(t))
    return -1;
  if (copy_args(t, extra_args))
    return -1;
  return launch(t);
}

static int wait_exit(kc_testsrv *t, int ms) {
  for (int waited = 0; waited <= ms; waited += 10) {
    int st;
    pid_t r = waitpid(t->pid, &st, WNOHANG);
    if (r == t->pid || (r < 0 && errno == ECHILD)) {
      t->pid = 0;
      if (r < 0)
        return -1;
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    kc_testsrv_sleep_ms(10);
  }
  return -2;
}

int kc_testsrv_stop(kc_testsrv *t) {
  if (t->pid <= 0)
    return -1;
  kill(t->pid, SIGTERM);
  int rc = wait_exit(t, STOP_WAIT_MS);
  if (rc == -2) {
    kill(t->pid, SIGKILL);
    rc = wait_exit(t, STOP_WAIT_MS);
  }
  return rc;
}

int kc_testsrv_stop_checked(kc_testsrv *t, const char *name) {
  int rc = kc_testsrv_stop(t);
  if (rc == 0 || rc == -1)
    return 0;
  fprintf(stderr, "kcached %s exited %d on SIGTERM\n", name ? name : "", rc);
  kc_testsrv_show_log(t, name);
  return -1;
}

void kc_testsrv_kill(kc_testsrv *t) {
  if (t->pid <= 0)
    return;
  kill(t->pid, SIGKILL);
  wait_exit(t, STOP_WAIT_MS);
}

int kc_testsrv_restart(kc_testsrv *t) {
  if (!t->dir[0])
    return -1;
  if (t->pid > 0)
    kc_testsrv_stop(t);
  return launch(t);
}

static int rm_entry(const char *path, const struct stat *sb, int flag,
                    struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  remove(path);
  return 0;
}

void kc_testsrv_cleanup(kc_testsrv *t) {
  if (t->pid > 0)
    kc_testsrv_stop(t);
  if (t->dir[0])
    nftw(t->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  free_args(t);
  t->dir[0] = '\0';
}

/* Reads a whole file into memory (malloc'd); NULL on error. */
static char *read_all(FILE *f, size_t *len) {
  char *text = NULL;
  FILE *m = open_memstream(&text, len);
  char buf[65536];
  size_t got;
  while (m && (got = fread(buf, 1, sizeof buf, f)) > 0)
    fwrite(buf, 1, got, m);
  if (!m || ferror(f) || fclose(m) != 0) {
    free(text);
    return NULL;
  }
  return text;
}

char *kc_testsrv_slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  size_t len = 0;
  char *text = f ? read_all(f, &len) : NULL;
  if (f)
    fclose(f);
  return text ? text : strdup("");
}

void kc_testsrv_show_log(const kc_testsrv *t, const char *name) {
  FILE *f = fopen(t->log, "r");
  if (!f)
    return;
  char buf[4001];
  fseek(f, 0, SEEK_END);
  long end = ftell(f);
  fseek(f, end > 4000 ? end - 4000 : 0, SEEK_SET);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  fprintf(stderr, "---- kcached %s log (%s), last %zu bytes ----\n%s\n",
          name ? name : "", t->log, n, buf);
}

int kc_testsrv_log_count(const kc_testsrv *t, const char *needle, int echo) {
  FILE *f = fopen(t->log, "r");
  char line[4096];
  int n = 0;
  while (f && fgets(line, sizeof line, f))
    if (strstr(line, needle)) {
      if (echo)
        printf("  log: %s", line);
      n++;
    }
  if (f)
    fclose(f);
  return n;
}

int kc_testsrv_wait_log(const kc_testsrv *t, const char *text, int times,
                        long ms) {
  for (long t0 = kc_testsrv_now_ms();; kc_testsrv_sleep_ms(20)) {
    char *log = kc_testsrv_slurp(t->log);
    int n = 0;
    for (const char *p = log; p && (p = strstr(p, text)); p++)
      n++;
    free(log);
    if (n >= times)
      return 1;
    if (kc_testsrv_now_ms() - t0 >= ms)
      return 0;
  }
}

unsigned char *kc_testsrv_bytes(uint64_t seed, size_t n) {
  unsigned char *p = malloc(n ? n : 1);
  if (!p)
    abort();
  uint64_t x = seed;
  for (size_t i = 0; i < n; i += 8) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    memcpy(p + i, &z, n - i < 8 ? n - i : 8);
  }
  return p;
}

int kc_testsrv_rot(const kc_testsrv *t, const void *needle, size_t n) {
  char path[400];
  snprintf(path, sizeof path, "%s/data.mdb", t->data);
  FILE *f = fopen(path, "r+b");
  size_t len = 0;
  char *text = f ? read_all(f, &len) : NULL;
  int copies = text ? 0 : -1;
  for (char *p = text;
       n && p && (p = memmem(p, len - (size_t)(p - text), needle, n)); p += n) {
    if (fseek(f, (long)(p - text) + (long)(n / 2), SEEK_SET) != 0 ||
        fputc(p[n / 2] ^ 0x40, f) == EOF) {
      copies = -1;
      break;
    }
    copies++;
  }
  if (f && fclose(f) != 0)
    copies = -1;
  free(text);
  return copies;
}

int kc_testsrv_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  struct timeval tv = {20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

kc_manifest *kc_testsrv_manifest_base(const char *model, uint64_t batch,
                                      const char *arch) {
  kc_manifest *m = kc_manifest_new();
  if (!m)
    return NULL;
  snprintf(m->fields.model, sizeof m->fields.model, "%s", model);
  memset(m->fields.build, 'b', KC_HEX_LEN);
  snprintf(m->fields.arch, sizeof m->fields.arch, "%s", arch);
  m->fields.bucket.n = 1;
  snprintf(m->fields.bucket.dims[0].name, KC_NAME_MAX + 1, "batch");
  m->fields.bucket.dims[0].value = batch;
  m->fields.n_tools = 1;
  snprintf(m->fields.tools[0].name, KC_NAME_MAX + 1, "cuda");
  snprintf(m->fields.tools[0].value, KC_TOOL_VALUE_MAX + 1, "13.0");
  return m;
}

char *kc_testsrv_manifest(const char *model, uint64_t batch, const char *arch,
                          char (*digests)[65], const uint64_t *sizes, size_t n,
                          char key[65]) {
  kc_manifest *m = kc_testsrv_manifest_base(model, batch, arch);
  if (!m)
    return NULL;
  const char *entries[] = {"gemm"};
  char *json = NULL;
  char err[KC_ERRBUF_SIZE] = "";
  for (size_t i = 0; i < n; i++) {
    char path[32];
    snprintf(path, sizeof path, "k%zu.cubin", i);
    if (kc_manifest_add_file(m, path, digests[i], sizes[i], KC_KIND_CUBIN,
                             entries, 1, err))
      goto out;
  }
  if (kc_manifest_seal(m, err) || kc_manifest_to_json(m, &json, err))
    goto out;
  memcpy(key, m->key, 65);
out:
  if (!json)
    fprintf(stderr, "manifest: %s\n", err);
  kc_manifest_free(m);
  return json;
}

/* ---- HTTP ---- */

static size_t on_body(char *p, size_t s, size_t n, void *ud) {
  kc_testsrv_resp *r = ud;
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
  kc_testsrv_resp *r = ud;
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

static void set_body(CURL *c, const kc_testsrv_req *q, struct curl_slist **h,
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

static struct curl_slist *headers_of(const kc_testsrv_req *q) {
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

/* The options of one request on c, which has been reset. */
static void set_request(CURL *c, const char *url, const kc_testsrv_req *q,
                        kc_testsrv_resp *r, struct curl_slist **h,
                        chunk_src *src) {
  const char *method = q->method ? q->method : "GET";
  curl_easy_setopt(c, CURLOPT_URL, url);
  long timeout_ms = q->timeout_ms ? q->timeout_ms : 60000L;
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L); /* worker threads */
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
  if (q->cainfo)
    curl_easy_setopt(c, CURLOPT_CAINFO, q->cainfo);
  if (strcmp(method, "HEAD") == 0) {
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  } else {
    if (q->body || q->has_body)
      set_body(c, q, h, src);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  }
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, *h);
}

kc_testsrv_resp kc_testsrv_http(CURL *c, const char *base, const char *path,
                                kc_testsrv_req q) {
  kc_testsrv_resp r = {0};
  int own = c == NULL;
  if (own && !(c = curl_easy_init())) {
    r.rc = CURLE_FAILED_INIT;
    return r;
  }
  if (!own)
    curl_easy_reset(c); /* keeps the connection cache */
  char url[1024];
  snprintf(url, sizeof url, "%s%s", base, path);
  struct curl_slist *h = headers_of(&q);
  chunk_src src;
  set_request(c, url, &q, &r, &h, &src);
  long t0 = kc_testsrv_now_ms();
  r.rc = curl_easy_perform(c);
  r.ms = kc_testsrv_now_ms() - t0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
  curl_easy_getinfo(c, CURLINFO_NUM_CONNECTS, &r.connects);
  curl_slist_free_all(h);
  if (own)
    curl_easy_cleanup(c);
  if (!r.body)
    r.body = calloc(1, 1);
  return r;
}

kc_testsrv_resp kc_testsrv_get(const kc_testsrv *t, const char *fmt, ...) {
  char path[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(path, sizeof path, fmt, ap);
  va_end(ap);
  kc_testsrv_resp r = kc_testsrv_http(NULL, t->url, path, (kc_testsrv_req){0});
  if (r.rc != CURLE_OK)
    r.status = 0;
  return r;
}

long kc_testsrv_serves(const kc_testsrv *t, const char *key, const char *json,
                       const char (*digest)[65], const size_t *size,
                       const uint64_t *seed, size_t n) {
  kc_testsrv_resp r = kc_testsrv_get(t, "/v1/bundles/%s", key);
  long bad = r.status != 200             ? (r.status ? r.status : -2)
             : strcmp(r.body, json) != 0 ? -1
                                         : 0;
  kc_testsrv_resp_free(&r);
  for (size_t i = 0; i < n && !bad; i++) {
    r = kc_testsrv_get(t, "/v1/blobs/%s", digest[i]);
    unsigned char *bytes = kc_testsrv_bytes(seed[i], size[i]);
    if (r.status != 200)
      bad = r.status ? r.status : -2;
    else if (r.len != size[i] || memcmp(r.body, bytes, r.len) != 0)
      bad = -1;
    free(bytes);
    kc_testsrv_resp_free(&r);
  }
  return bad;
}

void kc_testsrv_resp_free(kc_testsrv_resp *r) {
  free(r->body);
  r->body = NULL;
}

int kc_testsrv_header(const kc_testsrv_resp *r, const char *name, char *out,
                      size_t cap) {
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

double kc_testsrv_metric(const kc_testsrv *t, const char *series) {
  kc_testsrv_resp r =
      kc_testsrv_http(NULL, t->url, "/metrics", (kc_testsrv_req){0});
  double v = -1;
  size_t n = strlen(series);
  int ok = r.rc == CURLE_OK && r.status == 200;
  for (char *line = r.body; ok && line && *line;) {
    char *nl = strchr(line, '\n');
    if (strncmp(line, series, n) == 0 && line[n] == ' ') {
      v = strtod(line + n + 1, NULL);
      break;
    }
    line = nl ? nl + 1 : NULL;
  }
  kc_testsrv_resp_free(&r);
  return v;
}

double kc_testsrv_metric_settle(const kc_testsrv *t, const char *series,
                                double want, long max_ms) {
  long t0 = kc_testsrv_now_ms(), nap = 10;
  double v = kc_testsrv_metric(t, series);
  while (v != want && kc_testsrv_now_ms() - t0 < max_ms) {
    kc_testsrv_sleep_ms(nap);
    nap = nap < 100 ? nap * 2 : 100; /* long waits: /metrics at 10 Hz */
    v = kc_testsrv_metric(t, series);
  }
  return v;
}

long kc_testsrv_drain(const kc_testsrv *t, long max_ms, double *depth) {
  long t0 = kc_testsrv_now_ms();
  double d = kc_testsrv_metric_settle(t, "kcached_s3_queue_depth", 0, max_ms);
  if (d == 0)
    return kc_testsrv_now_ms() - t0;
  if (depth)
    *depth = d;
  return -1;
}
