/* servertest.c: the helpers of kcached's integration tests (see
 * servertest.h). */
#include "servertest.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- HTTP ---- */

resp http_on(CURL *c, const char *base, const char *path, req q) {
  return kc_testsrv_http(c, base, path, q);
}

resp http(const kc_testsrv *t, const char *path, req q) {
  return kc_testsrv_http(NULL, t->url, path, q);
}

void resp_free(resp *r) { kc_testsrv_resp_free(r); }

int header(const resp *r, const char *name, char *out, size_t cap) {
  return kc_testsrv_header(r, name, out, cap);
}

json_t *body_json(const resp *r) {
  return r->body ? json_loadb(r->body, r->len, 0, NULL) : NULL;
}

/* Asserts a JSON error body {"error": code, "message": "..."}. */
void assert_error(const resp *r, long status, const char *code) {
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

int error_mentions(const resp *r, const char *needle) {
  json_t *j = body_json(r);
  const char *msg = json_string_value(json_object_get(j, "message"));
  int ok = msg && strstr(msg, needle) != NULL;
  if (!ok)
    fprintf(stderr, "message '%s' lacks '%s'\n", msg ? msg : "(none)", needle);
  json_decref(j);
  return ok;
}

long metric(const kc_testsrv *t, const char *name) {
  return (long)kc_testsrv_metric(t, name);
}

const char *const bad_hex[N_BAD_HEX] = {
    "2CF24DBA5FB0A30E26E83B2AC5B9E29E1B161E5C1FA7425E73043362938B9824",
    "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b982",
    "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b98244",
    "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b982g",
    "",
    "..%2F..%2Fetc%2Fpasswd",
    "abc/def",
};
void sha_hex(const void *p, size_t n, char out[65]) {
  assert_int_equal(kc_sha256_hex(p, n, out), KC_OK);
}

void fill_random(char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1103515245u + 12345u;
    p[i] = (char)(seed >> 16);
  }
}

long put_blob(const kc_testsrv *t, const char *token, const void *p, size_t n,
              char digest[65]) {
  char path[128];
  sha_hex(p, n, digest);
  snprintf(path, sizeof path, "/v1/blobs/%s", digest);
  resp r = http(
      t, path,
      (req){
          .method = "PUT", .token = token, .body = p, .len = n, .has_body = 1});
  resp_free(&r);
  return r.status;
}

/* A manifest (canonical JSON, malloc'd) of one file per digest. */
char *make_manifest(const char *model, uint64_t batch, const char *arch,
                    char (*digests)[65], const uint64_t *sizes, size_t n,
                    char key[65]) {
  char *json = kc_testsrv_manifest(model, batch, arch, digests, sizes, n, key);
  assert_non_null(json);
  return json;
}

/* Uploads n fresh blobs and a bundle over them; returns its manifest. */
char *store_bundle(const kc_testsrv *t, const char *token, const char *model,
                   uint64_t batch, unsigned seed, char key[65]) {
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
  resp r = http(
      t, path,
      (req){
          .method = "PUT", .token = token, .body = json, .len = strlen(json)});
  assert_true(r.status == 201 || r.status == 200);
  resp_free(&r);
  return json;
}

void check_kept(const kc_testsrv *t, const char *d, const char *blob, size_t n,
                const char *key, const char *json) {
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

/* Runs a shell command; output (stdout and stderr) into out. */
int run_sh(const char *cmd, char *out, size_t cap) {
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

int run_kcached(const char *args, char *out, size_t cap) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "env -u KCACHED_THREADS %s %s 2>&1",
           kc_testsrv_bin(), args);
  return run_sh(cmd, out, cap);
}

/* Makes a token with `kcached token` and appends its line to file. */
void new_token(const char *role, const char *name, const char *file,
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

int raw_connect(int port) {
  int fd = kc_testsrv_connect(port);
  assert_true(fd >= 0);
  return fd;
}

void raw_send(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    assert_true(w > 0);
    c += w;
    n -= (size_t)w;
  }
}

/* Reads until the peer closes or the buffer is full. */
size_t raw_recv_all(int fd, char *buf, size_t cap) {
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

kc_testsrv S;

int open_setup(void **state) {
  (void)state;
  static const char *const args[] = {"--max-blob-bytes", "1M",
                                     "--max-json-bytes", "1M", NULL};
  return kc_testsrv_start(&S, args);
}

int open_teardown(void **state) {
  (void)state;
  int rc = kc_testsrv_stop(&S);
  if (rc != 0) {
    fprintf(stderr, "kcached exited %d\n", rc);
    kc_testsrv_show_log(&S, "S");
  }
  kc_testsrv_cleanup(&S);
  return rc == 0 ? 0 : -1;
}

void servertest_init(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  signal(SIGPIPE, SIG_IGN);
}
