/* clienttest.c: the shared fixture and helpers of the libkcache and
 * kcache CLI tests (clienttest.h). */
#include "clienttest.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <curl/curl.h>

#include "kc_gpu.h"

/* ---- fixture ---- */

int fx_setup(void **state) {
  fx *f = calloc(1, sizeof *f);
  const char *tmp = getenv("TMPDIR");
  snprintf(f->dir, sizeof f->dir, "%s/kcache-client-XXXXXX",
           tmp && *tmp ? tmp : "/tmp");
  assert_non_null(mkdtemp(f->dir));
  snprintf(f->cache, sizeof f->cache, "%s/cache", f->dir);
  snprintf(f->out, sizeof f->out, "%s/out", f->dir);
  *state = f;
  return 0;
}

void rmtree(const char *p) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
  if (system(cmd) != 0)
    fprintf(stderr, "cannot remove %s\n", p);
}

int fx_teardown(void **state) {
  fx *f = *state;
  char cmd[700];
  if (f->have_srv)
    kc_testsrv_cleanup(&f->srv);
  snprintf(cmd, sizeof cmd, "chmod -R u+w '%s' 2>/dev/null; rm -rf '%s'",
           f->dir, f->dir);
  if (system(cmd) != 0)
    fprintf(stderr, "cannot remove %s\n", f->dir);
  free(f);
  return 0;
}

void start_server(fx *f) { start_server_with(f, NULL); }

void start_server_with(fx *f, const char *const *args) {
  assert_int_equal(kc_testsrv_start(&f->srv, args), 0);
  f->have_srv = 1;
}

void need_nvrtc(void) {
  char v[16], err[KC_ERRBUF_SIZE] = "";
  if (kc_gpu_nvrtc_version(v, err) == KC_OK)
    return;
  const char *ci = getenv("CI");
  if (ci && strcmp(ci, "true") == 0)
    fail_msg("CI=true and NVRTC is missing: %s", err);
  print_message("skipped: %s\n", err);
  skip();
}

void write_text(const char *path, const char *fmt, ...) {
  FILE *fp = fopen(path, "w");
  assert_non_null(fp);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(fp, fmt, ap);
  va_end(ap);
  fclose(fp);
}

kc_warmup *warmup_for(fx *f, const char *name, const char *kernel,
                      const char *entry, const char *toolchain_extra) {
  char path[400], err[KC_ERRBUF_SIZE];
  snprintf(path, sizeof path, "%s/%s.json", f->dir, name);
  write_text(path,
             "{\"schema\":\"kcache.warmup/v1\",\"model\":{\"name\":\"t\","
             "\"hash\":\"%s\"},\"archs\":[\"sm_80\"],\"toolchain\":{\"app\":"
             "\"test\"%s},\"kernels\":[{\"name\":\"%s\",\"source\":"
             "\"%s/%s.cu\",\"entries\":[\"%s\"]}],\"buckets\":[{\"batch\":1},"
             "{\"batch\":4}]}",
             MODEL, toolchain_extra, kernel, KC_TEST_KERNELS, kernel, entry);
  kc_warmup *w = NULL;
  kc_err e = kc_warmup_load(path, &w, err);
  if (e)
    fail_msg("warmup: %s", err);
  return w;
}

kc_client *client_for(const char *cache, const char *url) {
  char err[KC_ERRBUF_SIZE];
  kc_client *c = NULL;
  kc_client_opts o = {.url = url,
                      .cache_dir = cache,
                      .timeout_ms = 20000,
                      .connect_timeout_ms = 1000};
  kc_err e = kc_client_new(&o, &c, err);
  if (e)
    fail_msg("kc_client_new: %s", err);
  return c;
}

size_t count(const kc_warm_report *r, kc_warm_status s) { return r->counts[s]; }

static int run_cliv(char *out, size_t out_size, const char *env,
                    const char *fmt, va_list ap) {
  char args[2048], cmd[2600];
  vsnprintf(args, sizeof args, fmt, ap);
  /* The caller's server settings must not leak into the tests. */
  snprintf(cmd, sizeof cmd,
           "env -u KCACHE_URL -u KCACHE_TOKEN -u KCACHE_CACERT %s %s %s 2>&1",
           env, KCACHE_BIN, args);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t n = out ? fread(out, 1, out_size - 1, p) : 0;
  if (out)
    out[n] = '\0';
  else {
    char sink[4096];
    while (fread(sink, 1, sizeof sink, p) > 0) {
    }
  }
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

int run_cli(char *out, size_t out_size, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = run_cliv(out, out_size, "", fmt, ap);
  va_end(ap);
  return rc;
}

int run_cli_env(char *out, size_t out_size, const char *env, const char *fmt,
                ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = run_cliv(out, out_size, env, fmt, ap);
  va_end(ap);
  return rc;
}

int occurrences(const char *s, const char *needle) {
  int n = 0;
  for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle))
    n++;
  return n;
}

char *read_all(const char *path, size_t *len) {
  FILE *fp = fopen(path, "rb");
  if (!fp)
    return NULL;
  char *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n + 4096 + 1 > cap) {
      cap = cap ? cap * 2 : 8192;
      buf = realloc(buf, cap);
      assert_non_null(buf);
    }
    size_t r = fread(buf + n, 1, 4096, fp);
    if (!r)
      break;
    n += r;
  }
  fclose(fp);
  buf[n] = '\0';
  if (len)
    *len = n;
  return buf;
}

void run_kcache(run_res *r, const char *stdout_path, const char *const *env,
                const char *const *args) {
  char errp[] = "/tmp/kcache-cwarm-err-XXXXXX";
  int efd = mkstemp(errp);
  assert_true(efd >= 0);
  const char *argv[64] = {KCACHE_BIN};
  size_t n = 1;
  for (; args[n - 1]; n++) {
    assert_true(n < 63);
    argv[n] = args[n - 1];
  }
  argv[n] = NULL;
  double t0 = now_s();
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int ofd = stdout_path
                  ? open(stdout_path, O_WRONLY | O_CREAT | O_TRUNC, 0644)
                  : efd;
    if (ofd < 0)
      _exit(126);
    dup2(ofd, 1);
    dup2(efd, 2);
    unsetenv("KCACHE_URL");
    unsetenv("KCACHE_TOKEN");
    unsetenv("KCACHE_DIR");
    for (size_t i = 0; env && env[i]; i++)
      putenv((char *)env[i]);
    execv(KCACHE_BIN, (char *const *)argv);
    _exit(127);
  }
  int st = 0;
  struct rusage ru;
  assert_int_equal(wait4(pid, &st, 0, &ru), pid);
  r->secs = now_s() - t0;
  r->maxrss_kb = ru.ru_maxrss;
  r->rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  close(efd);
  char *text = read_all(errp, NULL);
  unlink(errp);
  snprintf(r->out, sizeof r->out, "%s", text ? text : "");
  free(text);
}

int clienttest_run(const char *group, const struct CMUnitTest *tests,
                   size_t n) {
  char home_cache[256];
  const char *tmp = getenv("TMPDIR");
  snprintf(home_cache, sizeof home_cache, "%s/kcache-default-XXXXXX",
           tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(home_cache))
    return 1;
  setenv("KCACHE_DIR", home_cache, 1);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  if (getenv("KC_TEST_FILTER"))
    cmocka_set_test_filter(getenv("KC_TEST_FILTER"));
  int rc = _cmocka_run_group_tests(group, tests, n, NULL, NULL);
  curl_global_cleanup();
  rmtree(home_cache);
  return rc;
}

/* ---- a fake kcached that lies: wrong blob bytes, unsafe manifests, and
 * faults: stalls, resets, garbage ---- */

static void fake_reply_n(int c, int status, const char *body, size_t len) {
  char head[256];
  int n = snprintf(head, sizeof head,
                   "HTTP/1.1 %d X\r\nContent-Length: %zu\r\nContent-Type: "
                   "application/json\r\nConnection: close\r\n\r\n",
                   status, len);
  if (write(c, head, (size_t)n) < 0 || write(c, body, len) < 0)
    return;
}

static void fake_reply(int c, int status, const char *body) {
  fake_reply_n(c, status, body, strlen(body));
}

/* Misbehaves on connection c, whose request head has been read. */
static void fake_fault(int c, fault f) {
  static const char garbage[] = "\x16\x03\x01\xff\xfeSSH-2.0 not http\r\n\r\n";
  static const char short_head[] =
      "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\nConnection: close\r\n"
      "\r\nthe first few bytes";
  static const char html[] =
      "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/html\r\n"
      "Content-Length: 46\r\nConnection: close\r\n\r\n"
      "<html><body>502 Bad Gateway</body></html>\n\n\n\n\n";
  const char *out = f == FAULT_GARBAGE ? garbage
                    : f == FAULT_SHORT ? short_head
                    : f == FAULT_HTML  ? html
                                       : NULL;
  if (f == FAULT_STALL) { /* until the client gives up (or 10 s) */
    char sink[4096];
    struct timeval tv = {10, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    while (read(c, sink, sizeof sink) > 0) {
    }
  } else if (f == FAULT_RESET) {
    struct linger l = {.l_onoff = 1, .l_linger = 0};
    setsockopt(c, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  } else if (out && write(c, out, strlen(out)) < 0) {
    return;
  }
}

/* A 200 whose body is far larger than any manifest declares: sent until
 * the client stops reading (the bytes it took are counted in s->sent). */
static void fake_flood(fake *s, int c) {
  static char chunk[1 << 20];
  char head[256];
  int n = s->flood_length
              ? snprintf(head, sizeof head,
                         "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n"
                         "Connection: close\r\n\r\n",
                         s->blob_flood)
              : snprintf(head, sizeof head,
                         "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");
  memset(chunk, 'x', sizeof chunk);
  if (send(c, head, (size_t)n, MSG_NOSIGNAL) != n)
    return;
  for (size_t done = 0; done < s->blob_flood;) {
    size_t want = s->blob_flood - done < sizeof chunk ? s->blob_flood - done
                                                      : sizeof chunk;
    ssize_t w = send(c, chunk, want, MSG_NOSIGNAL);
    if (w <= 0)
      break;
    done += (size_t)w;
    __atomic_store_n(&s->sent, done, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&s->stop, __ATOMIC_SEQ_CST)) /* an endless flood */
      break;
  }
}

/* An answer that promises 1000 bytes and sends one every 0.5 s, until the
 * client hangs up (or 30 s, or the fake stops). */
static void fake_drip(fake *s, int c) {
  static const char head[] =
      "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n";
  if (send(c, head, strlen(head), MSG_NOSIGNAL) < 0)
    return;
  for (int i = 0; i < 60 && !__atomic_load_n(&s->stop, __ATOMIC_SEQ_CST); i++) {
    struct timespec ts = {0, 500 * 1000000L};
    nanosleep(&ts, NULL);
    if (send(c, "{", 1, MSG_NOSIGNAL) != 1)
      break;
  }
}

/* Reads the request head (and ignores any body: we close afterwards). */
static void fake_serve(fake *s, int c) {
  char req[8192] = "";
  size_t n = 0;
  while (n < sizeof req - 1 && !strstr(req, "\r\n\r\n")) {
    ssize_t r = read(c, req + n, sizeof req - 1 - n);
    if (r <= 0)
      break;
    n += (size_t)r;
    req[n] = '\0';
  }
  req[n] = '\0';
  if (!strncmp(req, "POST /v1/blobs/fetch ", 21))
    __atomic_add_fetch(&s->fetches, 1, __ATOMIC_SEQ_CST);
  if (!strncmp(req, "GET /v1/blobs/", 14))
    __atomic_add_fetch(&s->gets, 1, __ATOMIC_SEQ_CST);
  fault f = !strncmp(req, "POST /v1/lookup", 15)  ? s->lookup_fault
            : !strncmp(req, "GET /v1/blobs/", 14) ? s->blob_fault
                                                  : FAULT_NONE;
  if (f == FAULT_STALL || f == FAULT_RESET) {
    fake_fault(c, f);
    return; /* no orderly close: the caller's close() is the reset */
  }
  if (s->drip) {
    fake_drip(s, c);
    return;
  }
  const char *route = s->flood_route ? s->flood_route : "GET /v1/blobs/";
  if (s->blob_flood && !strncmp(req, route, strlen(route))) {
    fake_flood(s, c);
    return;
  }
  if (f != FAULT_NONE)
    fake_fault(c, f);
  else if (!strncmp(req, "POST /v1/lookup", 15) && s->lookup_body)
    fake_reply(c, 200, s->lookup_body);
  else if (!strncmp(req, "GET /v1/bundles/", 16) && s->bundle_body)
    fake_reply(c, 200, s->bundle_body);
  else if (!strncmp(req, "GET /v1/blobs/", 14) && s->blob_body)
    fake_reply(c, 200, s->blob_body);
  else if (!strncmp(req, "POST /v1/blobs/fetch ", 21) && s->fetch_body)
    fake_reply_n(c, s->fetch_status ? s->fetch_status : 200, s->fetch_body,
                 s->fetch_len ? s->fetch_len : strlen(s->fetch_body));
  else
    fake_reply(c, 500, "{\"error\":\"internal\",\"message\":\"fake\"}");
  shutdown(c, SHUT_WR);
  while (read(c, req, sizeof req) > 0) {
  }
}

static void *fake_main(void *arg) {
  fake *s = arg;
  for (;;) {
    int c = accept(s->fd, NULL, NULL);
    if (c < 0 || __atomic_load_n(&s->stop, __ATOMIC_SEQ_CST)) {
      if (c >= 0)
        close(c);
      return NULL;
    }
    __atomic_add_fetch(&s->conns, 1, __ATOMIC_SEQ_CST);
    if (s->hold) { /* never read, never answered */
      if (s->n_held < 64)
        s->held[s->n_held++] = c;
      else
        close(c);
      continue;
    }
    fake_serve(s, c);
    close(c);
  }
}

int listen_loopback(int *port, char *url, size_t cap) {
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(fd, 64), 0);
  getsockname(fd, (struct sockaddr *)&a, &len);
  *port = ntohs(a.sin_port);
  snprintf(url, cap, "http://127.0.0.1:%d", *port);
  return fd;
}

void fake_start(fake *s) {
  s->fd = listen_loopback(&s->port, s->url, sizeof s->url);
  assert_int_equal(pthread_create(&s->thread, NULL, fake_main, s), 0);
}

void fake_stop(fake *s) {
  __atomic_store_n(&s->stop, 1, __ATOMIC_SEQ_CST);
  /* Wake accept() with a connection of our own. */
  int c = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)s->port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (connect(c, (struct sockaddr *)&a, sizeof a) != 0)
    fprintf(stderr, "fake_stop: connect: %s\n", strerror(errno));
  close(c);
  pthread_join(s->thread, NULL);
  for (int i = 0; i < s->n_held; i++)
    close(s->held[i]);
  close(s->fd);
}

/* The manifest JSON for key fields k[0] with one file. */
char *fake_manifest(const kc_key_fields *k, const char *path,
                    const char *content, char *key_out) {
  char err[KC_ERRBUF_SIZE], d[65], *json = NULL;
  kc_manifest *m = kc_manifest_new();
  m->fields = *k;
  kc_sha256_hex(content, strlen(content), d);
  assert_int_equal(kc_manifest_add_file(m, "placeholder.cubin", d,
                                        strlen(content), KC_KIND_CUBIN, NULL, 0,
                                        err),
                   KC_OK);
  assert_int_equal(kc_manifest_seal(m, err), KC_OK);
  assert_int_equal(kc_manifest_to_json(m, &json, err), KC_OK);
  strcpy(key_out, m->key);
  kc_manifest_free(m);
  /* Swap the path in the text: the fake may serve what we may not build. */
  char *at = strstr(json, "placeholder.cubin");
  size_t need = strlen(json) + strlen(path) + 1;
  char *out = malloc(need);
  snprintf(out, need, "%.*s%s%s", (int)(at - json), json, path,
           at + strlen("placeholder.cubin"));
  free(json);
  return out;
}

char *lookup_of(const char *key, const char *manifest) {
  size_t need = strlen(manifest) + 200;
  char *s = malloc(need);
  snprintf(s, need, "{\"found\":{\"%s\":%s},\"missing\":[]}", key, manifest);
  return s;
}

kc_manifest *manifest_of(kc_client *c, const char *const *paths,
                         const char *const *texts, size_t n) {
  char err[KC_ERRBUF_SIZE], d[65];
  kc_manifest *m = kc_manifest_new();
  strcpy(m->fields.model, MODEL);
  memset(m->fields.build, 'b', 64);
  strcpy(m->fields.arch, "sm_80");
  m->fields.bucket.n = 1;
  strcpy(m->fields.bucket.dims[0].name, "batch");
  m->fields.bucket.dims[0].value = 2;
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(kc_cache_blob_put(c, texts[i], strlen(texts[i]), d, err),
                     KC_OK);
    assert_int_equal(kc_manifest_add_file(m, paths[i], d, strlen(texts[i]),
                                          KC_KIND_FILE, NULL, 0, err),
                     KC_OK);
  }
  if (kc_manifest_seal(m, err))
    fail_msg("seal: %s", err);
  return m;
}

void blobs_equal(const char *cache_a, const char *cache_b) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "diff -r '%s/blobs' '%s/blobs' >/dev/null", cache_a,
           cache_b);
  assert_int_equal(system(cmd), 0);
}

size_t json_count(const char *json, const char *name) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\": ", name);
  const char *at = strstr(json, pat);
  assert_non_null(at);
  return (size_t)atoi(at + strlen(pat));
}

/* Makes a token with `kcached token ROLE NAME`; appends its line to file. */
void make_token(const char *role, const char *name, const char *file,
                char *token, size_t size) {
  char cmd[600], line[512];
  snprintf(cmd, sizeof cmd, "%s token %s %s 2>/dev/null", kc_testsrv_bin(),
           role, name);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  FILE *out = fopen(file, "a");
  assert_non_null(out);
  while (fgets(line, sizeof line, p)) {
    line[strcspn(line, "\n")] = '\0';
    if (line[0] == '#' || !line[0])
      continue;
    if (!strchr(line, ' '))
      snprintf(token, size, "%.200s", line);
    else
      fprintf(out, "%s\n", line);
  }
  fclose(out);
  assert_int_equal(pclose(p), 0);
  assert_true(token[0] != '\0');
}

double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec / 1e9;
}

/* Keys computable without a toolkit (pinned NVRTC), and their key strings. */
kc_warmup *fault_warmup(fx *f, kc_key_fields **k, char keys[2][65]) {
  char err[KC_ERRBUF_SIZE];
  size_t n = 0;
  kc_warmup *w = warmup_for(f, "w", "saxpy", "saxpy",
                            ",\"nvrtc\":\"13.0\",\"cuda\":\"13.0\"");
  assert_int_equal(kc_warm_keys(w, NULL, 0, k, &n, err), KC_OK);
  assert_int_equal(n, 2);
  for (size_t i = 0; i < 2; i++)
    assert_int_equal(kc_key_compute(&(*k)[i], keys[i], err), KC_OK);
  return w;
}

/* A command-builder warmup (no toolkit needed): `sh -c script` for batch 1
 * on sm_90a, written to dir/<name>.json (path out). script: no quotes. */
void cmd_warmup(fx *f, const char *name, const char *script, char *path,
                size_t size) {
  snprintf(path, size, "%s/%s.json", f->dir, name);
  write_text(path,
             "{\"schema\":\"kcache.warmup/v1\",\"model\":{\"name\":\"t\","
             "\"hash\":\"%s\"},\"archs\":[\"sm_90a\"],\"builder\":{"
             "\"command\":[\"sh\",\"-c\",\"%s\"],\"timeout_s\":30},"
             "\"buckets\":[{\"batch\":1}]}",
             MODEL, script);
}

void cubin_warmup(fx *f, const char *file, const char *name, const char *archs,
                  char *path, size_t size) {
  snprintf(path, size, "%s/%s.json", f->dir, file);
  write_text(path,
             "{\"schema\":\"kcache.warmup/v1\",\"model\":{\"name\":\"%s\","
             "\"hash\":\"%s\"},\"archs\":[%s],\"builder\":{\"command\":"
             "[\"sh\",\"-c\",\"printf x{arch}{batch} > {out}/k.cubin\"],"
             "\"timeout_s\":30},\"buckets\":[{\"batch\":1},{\"batch\":2}]}",
             name, MODEL, archs);
}

/* The one key of a cmd_warmup. */
void cmd_key(const char *path, char key[65]) {
  char err[KC_ERRBUF_SIZE];
  kc_warmup *w = NULL;
  kc_key_fields *k = NULL;
  size_t n = 0;
  assert_int_equal(kc_warmup_load(path, &w, err), KC_OK);
  assert_int_equal(kc_warm_keys(w, NULL, 0, &k, &n, err), KC_OK);
  assert_int_equal(n, 1);
  assert_int_equal(kc_key_compute(&k[0], key, err), KC_OK);
  free(k);
  kc_warmup_free(w);
}

/* A file's text (up to 255 bytes), "" when it cannot be read. */
const char *text_of(const char *path) {
  static char buf[256];
  char *data = NULL;
  size_t len = 0;
  buf[0] = '\0';
  if (kc_read_file(path, &data, &len, NULL) == KC_OK)
    snprintf(buf, sizeof buf, "%s", data);
  free(data);
  return buf;
}

/* Entries of a directory other than . and .. */
int entries_in(const char *dir) {
  char cmd[600], out[64] = "";
  snprintf(cmd, sizeof cmd, "ls -A '%s' | wc -l", dir);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  assert_non_null(fgets(out, sizeof out, p));
  pclose(p);
  return atoi(out);
}
