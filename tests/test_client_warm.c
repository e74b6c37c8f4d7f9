/* test_client_warm.c: the kcache CLI's warm and get at their edges, as a
 * user runs them: a server that accepts and never answers (every request
 * of a warm stays inside --deadline), a server that streams without end
 * (`kcache get` streams and stops at --max-size, in bounded memory),
 * --out's files (linked from the local cache where it can, copied where
 * not; verified, atomic per file, never outside DIR), the threads and
 * connections a small warm uses, a re-warm after a purge, and what a
 * stand-in (hit-compat) leaves under --out. The real kcached where a real
 * one is meant, and the fake server of the shared fixture (clienttest.h);
 * a counting proxy here. */
#include "clienttest.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

/* ---- the warm's deadline ---- */

/* A server that accepts and never answers: the warm (lookup, the warmup
 * manifest's upload, the demand report) ends near --deadline, its keys
 * built here, even with a request limit (--timeout) far beyond it. */
static void test_warm_deadline_stall(void **state) {
  fx *f = *state;
  char w[400], cache[400];
  fake s = {.hold = 1};
  fake_start(&s);
  cubin_warmup(f, "stall", "stall", "\"sm_80\"", w, sizeof w);
  snprintf(cache, sizeof cache, "%s/cache", f->dir);
  const double deadline = 3.0;
  run_res r;
  run_kcache(&r, NULL, NULL,
             (const char *[]){"warm", w, "--url", s.url, "--cache-dir", cache,
                              "--deadline", "3", "--timeout", "20", "--quiet",
                              NULL});
  fake_stop(&s);
  print_message("warm against a stalled server: %.2f s (deadline %.0f s), "
                "%d connections\n%s",
                r.secs, deadline, s.conns, r.out);
  assert_true(s.conns >= 1); /* it did ask, and got no answer */
  assert_int_equal(r.rc, 0);
  assert_true(r.secs < deadline + 1.0);
  assert_non_null(strstr(r.out, "unreachable")); /* the warning says why */
}

/* ---- kcache get: streamed, cut at --max-size ---- */

#define DIGEST_X                                                               \
  "1111111111111111111111111111111111111111111111111111111111111111"

/* An answer without end: get stops at --max-size, having written exactly
 * that much to stdout, and fails saying so; with -o nothing is left. */
static void test_get_max_size(void **state) {
  fx *f = *state;
  char outp[400], file[400];
  fake s = {.blob_flood = SIZE_MAX}; /* without end */
  fake_start(&s);
  snprintf(outp, sizeof outp, "%s/stdout", f->dir);
  snprintf(file, sizeof file, "%s/blob", f->dir);
  run_res r;
  run_kcache(&r, outp, NULL,
             (const char *[]){"get", DIGEST_X, "--url", s.url, "--max-size",
                              "4M", NULL});
  assert_int_equal(r.rc, 1);
  assert_non_null(strstr(r.out, "larger than 4194304 bytes"));
  struct stat st;
  assert_int_equal(stat(outp, &st), 0);
  assert_int_equal(st.st_size, 4 << 20);
  run_kcache(&r, NULL, NULL,
             (const char *[]){"get", DIGEST_X, "--url", s.url, "-o", file,
                              "--max-size", "1M", NULL});
  assert_int_equal(r.rc, 1);
  assert_int_not_equal(access(file, F_OK), 0);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s' | grep tmp-)\"", f->dir);
  assert_int_equal(system(cmd), 0); /* no temporary file left */
  /* a bad size is a usage error */
  run_kcache(&r, NULL, NULL,
             (const char *[]){"get", DIGEST_X, "--url", s.url, "--max-size",
                              "12Q", NULL});
  assert_int_equal(r.rc, 2);
  fake_stop(&s);
}

/* 256 MiB that are not the blob: streamed through in bounded memory (the
 * old get held all of it), then refused by their hash. */
static void test_get_streams(void **state) {
  fx *f = *state;
  fake s = {.blob_flood = (size_t)256 << 20};
  fake_start(&s);
  run_res r;
  run_kcache(&r, "/dev/null", NULL,
             (const char *[]){"get", DIGEST_X, "--url", s.url, NULL});
  fake_stop(&s);
  print_message("get of 256 MiB: peak RSS %ld KiB, %.2f s\n", r.maxrss_kb,
                r.secs);
  (void)f;
  assert_int_equal(r.rc, 1);
  assert_non_null(strstr(r.out, "hashing to"));
  assert_true(__atomic_load_n(&s.sent, __ATOMIC_SEQ_CST) >= (200u << 20));
  assert_true(r.maxrss_kb < 64 * 1024);
}

/* A real blob through the real kcached: stdout and -o, byte for byte. */
static void test_get_real(void **state) {
  fx *f = *state;
  char in[400], file[400], outp[400], digest[80] = "";
  start_server(f);
  snprintf(in, sizeof in, "%s/in.bin", f->dir);
  snprintf(file, sizeof file, "%s/got.bin", f->dir);
  snprintf(outp, sizeof outp, "%s/stdout.bin", f->dir);
  write_text(in, "some cubin bytes\n");
  run_res r;
  run_kcache(&r, NULL, NULL,
             (const char *[]){"put", in, "--url", f->srv.url, NULL});
  assert_int_equal(r.rc, 0);
  memcpy(digest, r.out, 64);
  run_kcache(&r, outp, NULL,
             (const char *[]){"get", digest, "--url", f->srv.url, NULL});
  assert_int_equal(r.rc, 0);
  char *a = read_all(outp, NULL);
  assert_string_equal(a, "some cubin bytes\n");
  free(a);
  run_kcache(
      &r, NULL, NULL,
      (const char *[]){"get", digest, "--url", f->srv.url, "-o", file, NULL});
  assert_int_equal(r.rc, 0);
  a = read_all(file, NULL);
  assert_string_equal(a, "some cubin bytes\n");
  free(a);
  /* missing: the server's 404 is said, nothing is written */
  run_kcache(
      &r, NULL, NULL,
      (const char *[]){"get", DIGEST_X, "--url", f->srv.url, "-o", outp, NULL});
  assert_int_equal(r.rc, 1);
  assert_non_null(strstr(r.out, "404"));
}

/* ---- --out: linked from the cache, copied across file systems ---- */

/* The command-builder model (2 buckets, sm_80) built and uploaded to the
 * real kcached by a first warm; *w loaded. */
static void seed_model(fx *f, kc_warmup **w, char *path, size_t size) {
  char cache[400], err[KC_ERRBUF_SIZE];
  start_server(f);
  cubin_warmup(f, "outmodel", "outmodel", "\"sm_80\"", path, size);
  snprintf(cache, sizeof cache, "%s/seed", f->dir);
  run_res r;
  run_kcache(&r, NULL, NULL,
             (const char *[]){"warm", path, "--url", f->srv.url, "--cache-dir",
                              cache, "--quiet", "--strict", NULL});
  if (r.rc != 0)
    fail_msg("seeding warm: %s", r.out);
  assert_int_equal(kc_warmup_load(path, w, err), KC_OK);
}

/* A fetch-only warm into out: n_local hit-local, n_remote hit-remote. */
static void warm_out(fx *f, const kc_warmup *w, const char *cache,
                     const char *out, size_t n_local, size_t n_remote) {
  char err[KC_ERRBUF_SIZE];
  kc_client *c = client_for(cache, f->srv.url);
  kc_warm_opts o = {.no_build = 1, .out_dir = out, .no_compat = 1};
  kc_warm_report r;
  kc_err e = kc_warm(c, w, &o, &r, err);
  if (e)
    fail_msg("warm --out: %s (%s)", err,
             r.n_items ? r.items[0].message : "no items");
  assert_int_equal(r.counts[KC_WARM_HIT_LOCAL], n_local);
  assert_int_equal(r.counts[KC_WARM_HIT_REMOTE], n_remote);
  kc_warm_report_free(&r);
  kc_client_free(c);
}

/* DIR's file for batch b and its cached blob: same bytes; *same: one
 * inode. */
static void check_out_file(const char *out, const char *cache, int b, int *same,
                           struct stat *st) {
  char p[600], text[64], d[65], bp[600];
  snprintf(p, sizeof p, "%s/sm_80/batch=%d/k.cubin", out, b);
  snprintf(text, sizeof text, "xsm_80%d", b);
  char *got = read_all(p, NULL);
  assert_non_null(got);
  assert_string_equal(got, text);
  free(got);
  assert_int_equal(lstat(p, st), 0);
  assert_true(S_ISREG(st->st_mode));
  assert_int_equal(st->st_mode & 0222, 0); /* read-only */
  kc_sha256_hex(text, strlen(text), d);
  snprintf(bp, sizeof bp, "%s/blobs/%.2s/%s", cache, d, d);
  struct stat cs;
  assert_int_equal(lstat(bp, &cs), 0);
  *same = cs.st_ino == st->st_ino && cs.st_dev == st->st_dev;
}

/* On one file system, --out's files are the cache's blobs, linked (no
 * second copy), read-only. A writer who gets through (root) damages the
 * cache's copy too: the next warm's re-hash finds it, fetches the blob
 * again and puts the good bytes back under DIR. */
static void test_out_linked(void **state) {
  fx *f = *state;
  char w_path[400], cache[400], out[400], p[600];
  kc_warmup *w = NULL;
  seed_model(f, &w, w_path, sizeof w_path);
  snprintf(cache, sizeof cache, "%s/c1", f->dir);
  snprintf(out, sizeof out, "%s/out", f->dir);
  warm_out(f, w, cache, out, 0, 2);
  struct stat st;
  int same = 0;
  for (int b = 1; b <= 2; b++) {
    check_out_file(out, cache, b, &same, &st);
    assert_true(same);
    assert_int_equal(st.st_nlink, 2);
  }
  /* a second warm into the same DIR: hit-local, the same links */
  warm_out(f, w, cache, out, 2, 0);
  check_out_file(out, cache, 1, &same, &st);
  assert_true(same);
  /* a service writes into its file */
  snprintf(p, sizeof p, "%s/sm_80/batch=1/k.cubin", out);
  int fd = open(p, O_WRONLY);
  if (fd < 0) {
    assert_int_equal(errno, EACCES); /* not root: the mode stops it */
    print_message("not root: a write into --out's file is refused\n");
  } else { /* root: it gets through, into the cache's inode too */
    assert_int_equal(write(fd, "HACKED!", 7), 7);
    close(fd);
    warm_out(f, w, cache, out, 1, 1); /* the damaged one fetched again */
  }
  check_out_file(out, cache, 1, &same, &st);
  assert_true(same);
  kc_warmup_free(w);
}

/* What stood at a file's name is replaced, never followed: a symlink to a
 * file outside DIR, a file of other bytes. */
static void test_out_replaces(void **state) {
  fx *f = *state;
  char w_path[400], cache[400], out[400], p[1000], victim[400];
  kc_warmup *w = NULL;
  seed_model(f, &w, w_path, sizeof w_path);
  snprintf(cache, sizeof cache, "%s/c1", f->dir);
  snprintf(out, sizeof out, "%s/out", f->dir);
  snprintf(victim, sizeof victim, "%s/victim", f->dir);
  write_text(victim, "keep me");
  snprintf(p, sizeof p, "mkdir -p %s/sm_80/batch=1 %s/sm_80/batch=2", out, out);
  assert_int_equal(system(p), 0);
  snprintf(p, sizeof p, "%s/sm_80/batch=1/k.cubin", out);
  assert_int_equal(symlink(victim, p), 0);
  snprintf(p, sizeof p, "%s/sm_80/batch=2/k.cubin", out);
  write_text(p, "stale bytes of an older build");
  warm_out(f, w, cache, out, 0, 2);
  struct stat st;
  int same = 0;
  for (int b = 1; b <= 2; b++) {
    check_out_file(out, cache, b, &same, &st);
    assert_true(same);
  }
  char *v = read_all(victim, NULL);
  assert_string_equal(v, "keep me");
  free(v);
  /* no temporary name left beside them */
  snprintf(p, sizeof p, "test -z \"$(find %s -name '.*kc-*')\"", out);
  assert_int_equal(system(p), 0);
  kc_warmup_free(w);
}

/* DIR on another file system than the cache (tmpfs): copies, whole, read
 * only, and the cache's blobs untouched. */
static void test_out_other_fs(void **state) {
  fx *f = *state;
  char w_path[400], cache[400], out[400];
  struct stat a, b;
  if (stat("/dev/shm", &a) != 0 || stat(f->dir, &b) != 0 ||
      a.st_dev == b.st_dev) {
    print_message("skipped: no /dev/shm on another file system than %s\n",
                  f->dir);
    skip();
  }
  kc_warmup *w = NULL;
  seed_model(f, &w, w_path, sizeof w_path);
  snprintf(cache, sizeof cache, "%s/c1", f->dir);
  snprintf(out, sizeof out, "/dev/shm/kcache-cwarm-out-%ld", (long)getpid());
  warm_out(f, w, cache, out, 0, 2);
  struct stat st;
  int same = 1;
  for (int i = 1; i <= 2; i++) {
    check_out_file(out, cache, i, &same, &st);
    assert_false(same);
    assert_int_equal(st.st_nlink, 1);
  }
  char cmd[500];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
  assert_int_equal(system(cmd), 0);
  kc_warmup_free(w);
}

/* ---- a re-warm after a purge; stand-ins under --out; --no-build ---- */

/* How many bundles kcached lists for MODEL. */
static int server_bundles(fx *f) {
  char err[KC_ERRBUF_SIZE], *json = NULL;
  kc_client *c = client_for(NULL, f->srv.url);
  assert_int_equal(kc_client_model_list(c, MODEL, &json, err), KC_OK);
  int n = 0;
  for (const char *p = json; (p = strstr(p, "\"key\"")); p++)
    n++;
  free(json);
  kc_client_free(c);
  return n;
}

/* The host that built the model still holds it after `kcache purge`: its
 * re-warm is hit-local, and since kcached now lacks the bundles it
 * uploads them (and says so), so the fleet has them again. A second
 * re-warm uploads nothing. */
static void test_purge_rewarm_uploads(void **state) {
  fx *f = *state;
  char w[400], cache[400];
  start_server(f);
  cubin_warmup(f, "purged", "purged", "\"sm_80\"", w, sizeof w);
  snprintf(cache, sizeof cache, "%s/c1", f->dir);
  run_res r;
  const char *warm[] = {"warm",        w,     "--url", f->srv.url,
                        "--cache-dir", cache, NULL};
  run_kcache(&r, NULL, NULL, warm);
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "2 built"));
  assert_int_equal(server_bundles(f), 2);
  run_kcache(&r, NULL, NULL,
             (const char *[]){"purge", "purged", "--confirm", MODEL, "--url",
                              f->srv.url, NULL});
  assert_int_equal(r.rc, 0);
  assert_int_equal(server_bundles(f), 0);
  run_kcache(&r, NULL, NULL, warm);
  print_message("%s", r.out);
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "2 hit-local"));
  assert_non_null(strstr(r.out, "2 hit-local bundles uploaded"));
  assert_int_equal(occurrences(r.out, "uploaded: kcached did not hold it"), 2);
  assert_int_equal(server_bundles(f), 2);
  /* another replica's empty cache now fetches them */
  char cache2[400];
  snprintf(cache2, sizeof cache2, "%s/c2", f->dir);
  run_kcache(&r, NULL, NULL,
             (const char *[]){"warm", w, "--url", f->srv.url, "--cache-dir",
                              cache2, "--no-build", "--strict", NULL});
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "2 hit-remote"));
  run_kcache(&r, NULL, NULL, warm);
  assert_int_equal(r.rc, 0);
  assert_null(strstr(r.out, "uploaded"));
}

/* The same with tokens: a read token's re-warm cannot put them back and
 * says so on each item (one refused upload, not one per bundle); a write
 * token's does. */
static void test_purge_rewarm_tokens(void **state) {
  fx *f = *state;
  char w[400], cache[400], tokens[400], rtok[256] = "", wtok[256] = "",
                                        atok[256] = "";
  snprintf(tokens, sizeof tokens, "%s/tokens", f->dir);
  make_token("read", "svc", tokens, rtok, sizeof rtok);
  make_token("write", "ci", tokens, wtok, sizeof wtok);
  make_token("admin", "ops", tokens, atok, sizeof atok);
  const char *const args[] = {"--tokens", tokens, NULL};
  start_server_with(f, args);
  cubin_warmup(f, "purged", "purged", "\"sm_80\"", w, sizeof w);
  snprintf(cache, sizeof cache, "%s/c1", f->dir);
  run_res r;
  run_kcache(&r, NULL, NULL,
             (const char *[]){"warm", w, "--url", f->srv.url, "--cache-dir",
                              cache, "--token", wtok, NULL});
  assert_int_equal(r.rc, 0);
  run_kcache(&r, NULL, NULL,
             (const char *[]){"purge", "purged", "--confirm", MODEL, "--url",
                              f->srv.url, "--token", atok, NULL});
  assert_int_equal(r.rc, 0);
  run_kcache(&r, NULL, NULL,
             (const char *[]){"warm", w, "--url", f->srv.url, "--cache-dir",
                              cache, "--token", rtok, NULL});
  print_message("%s", r.out);
  assert_int_equal(r.rc, 0);
  assert_int_equal(occurrences(r.out, "not uploaded: "), 2);
  assert_int_equal(occurrences(r.out, "403"), 2);
  run_kcache(&r, NULL, NULL,
             (const char *[]){"warm", w, "--url", f->srv.url, "--cache-dir",
                              cache, "--token", wtok, NULL});
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "2 hit-local bundles uploaded"));
}

/* A stand-in under --out (sm_86 code for the sm_89 key) says the arch its
 * code is for in DIR/sm_89/<bucket>/kcache-arch; once the exact bundle
 * exists, the next warm into DIR writes it and the file goes. */
static void test_out_compat_names_arch(void **state) {
  fx *f = *state;
  char w86[400], w89[400], cache[400], out[400], p[600];
  start_server(f);
  cubin_warmup(f, "w86", "compat", "\"sm_86\"", w86, sizeof w86);
  cubin_warmup(f, "w89", "compat", "\"sm_89\"", w89, sizeof w89);
  snprintf(out, sizeof out, "%s/out", f->dir);
  run_res r;
  snprintf(cache, sizeof cache, "%s/seed86", f->dir);
  run_kcache(&r, NULL, NULL,
             (const char *[]){"warm", w86, "--url", f->srv.url, "--cache-dir",
                              cache, "--strict", NULL});
  assert_int_equal(r.rc, 0);
  snprintf(cache, sizeof cache, "%s/c1", f->dir);
  run_kcache(&r, NULL, NULL,
             (const char *[]){"warm", w89, "--url", f->srv.url, "--cache-dir",
                              cache, "--device-arch", "sm_89", "--no-build",
                              "--strict", "--out", out, NULL});
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "2 hit-compat"));
  for (int b = 1; b <= 2; b++) {
    char want[16];
    snprintf(p, sizeof p, "%s/sm_89/batch=%d/kcache-arch", out, b);
    char *text = read_all(p, NULL);
    assert_non_null(text);
    assert_string_equal(text, "sm_86\n");
    free(text);
    snprintf(p, sizeof p, "%s/sm_89/batch=%d/k.cubin", out, b);
    snprintf(want, sizeof want, "xsm_86%d", b);
    text = read_all(p, NULL);
    assert_string_equal(text, want);
    free(text);
  }
  /* the exact build appears; a warm into the same DIR replaces both */
  snprintf(cache, sizeof cache, "%s/seed89", f->dir);
  run_kcache(&r, NULL, NULL,
             (const char *[]){"warm", w89, "--url", f->srv.url, "--cache-dir",
                              cache, "--no-compat", "--strict", NULL});
  assert_int_equal(r.rc, 0);
  snprintf(cache, sizeof cache, "%s/c2", f->dir);
  run_kcache(&r, NULL, NULL,
             (const char *[]){"warm", w89, "--url", f->srv.url, "--cache-dir",
                              cache, "--device-arch", "sm_89", "--no-build",
                              "--strict", "--out", out, NULL});
  assert_int_equal(r.rc, 0);
  assert_non_null(strstr(r.out, "2 hit-remote"));
  snprintf(p, sizeof p, "%s/sm_89/batch=1/kcache-arch", out);
  assert_int_not_equal(access(p, F_OK), 0);
  snprintf(p, sizeof p, "%s/sm_89/batch=1/k.cubin", out);
  char *text = read_all(p, NULL);
  assert_string_equal(text, "xsm_891");
  free(text);
}

/* A --no-build failure says whether a compatible bundle was looked for,
 * and which, or why not. */
static void test_no_build_says_compat(void **state) {
  fx *f = *state;
  char w89[400], cache[400];
  start_server(f);
  cubin_warmup(f, "w89", "compat", "\"sm_89\"", w89, sizeof w89);
  snprintf(cache, sizeof cache, "%s/c", f->dir);
  run_res r;
  run_kcache(&r, NULL, NULL,
             (const char *[]){"warm", w89, "--url", f->srv.url, "--cache-dir",
                              cache, "--device-arch", "sm_89", "--no-build",
                              NULL});
  print_message("%s", r.out);
  assert_int_equal(occurrences(r.out, "no compatible bundle found either "
                                      "(looked for sm_87, sm_86, sm_80: what "
                                      "runs on sm_89"),
                   2);
  run_kcache(&r, NULL, NULL,
             (const char *[]){"warm", w89, "--url", f->srv.url, "--cache-dir",
                              cache, "--no-compat", "--no-build", NULL});
  assert_int_equal(occurrences(r.out, "no compatible bundle looked for "
                                      "(--no-compat)"),
                   2);
  run_kcache(&r, NULL, NULL,
             (const char *[]){"warm", w89, "--url", f->srv.url, "--cache-dir",
                              cache, "--device-arch", "sm_80", "--no-build",
                              NULL});
  assert_int_equal(occurrences(r.out, "(sm_89 does not run on sm_80"), 2);
}

/* ---- the threads and connections of a small warm ---- */

/* pthread_create as libkcache calls it (-Wl,--wrap=pthread_create, see
 * tests/client.cmake): counted while `counting`; the test's own threads
 * call __real_pthread_create and are not. */
int __real_pthread_create(pthread_t *t, const pthread_attr_t *a,
                          void *(*fn)(void *), void *arg);
static int counting, threads_made;
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a,
                          void *(*fn)(void *), void *arg);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a,
                          void *(*fn)(void *), void *arg) {
  if (__atomic_load_n(&counting, __ATOMIC_SEQ_CST))
    __atomic_add_fetch(&threads_made, 1, __ATOMIC_SEQ_CST);
  return __real_pthread_create(t, a, fn, arg);
}

/* A TCP proxy in front of kcached that counts the connections made to it. */
typedef struct proxy {
  int fd, port, up_port;
  char url[64];
  pthread_t th;
  pthread_t pipes[64];
  int ends[64][2];
  int n, conns, stop;
} proxy;

typedef struct pipe_arg {
  int a, b;
} pipe_arg;

static void *proxy_pipe(void *arg) {
  pipe_arg p = *(pipe_arg *)arg;
  free(arg);
  char buf[64 << 10];
  struct pollfd fds[2] = {{p.a, POLLIN, 0}, {p.b, POLLIN, 0}};
  for (;;) {
    if (poll(fds, 2, 1000) < 0)
      break;
    int done = 0;
    for (int k = 0; k < 2 && !done; k++) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR)))
        continue;
      ssize_t n = read(fds[k].fd, buf, sizeof buf);
      if (n <= 0 || send(fds[1 - k].fd, buf, (size_t)n, MSG_NOSIGNAL) != n)
        done = 1;
    }
    if (done)
      break;
  }
  shutdown(p.a, SHUT_RDWR);
  shutdown(p.b, SHUT_RDWR);
  return NULL;
}

static void *proxy_main(void *arg) {
  proxy *x = arg;
  for (;;) {
    int c = accept(x->fd, NULL, NULL);
    if (c < 0 || __atomic_load_n(&x->stop, __ATOMIC_SEQ_CST) || x->n == 64) {
      if (c >= 0)
        close(c);
      return NULL;
    }
    __atomic_add_fetch(&x->conns, 1, __ATOMIC_SEQ_CST);
    int u = kc_testsrv_connect(x->up_port);
    pipe_arg *p = malloc(sizeof *p);
    if (u < 0 || !p) {
      close(c);
      free(p);
      continue;
    }
    *p = (pipe_arg){c, u};
    x->ends[x->n][0] = c;
    x->ends[x->n][1] = u;
    if (__real_pthread_create(&x->pipes[x->n], NULL, proxy_pipe, p) == 0)
      x->n++;
  }
}

static void proxy_start(proxy *x, int up_port) {
  x->up_port = up_port;
  x->fd = listen_loopback(&x->port, x->url, sizeof x->url);
  assert_int_equal(__real_pthread_create(&x->th, NULL, proxy_main, x), 0);
}

static void proxy_stop(proxy *x) {
  __atomic_store_n(&x->stop, 1, __ATOMIC_SEQ_CST);
  int c = kc_testsrv_connect(x->port);
  if (c >= 0)
    close(c);
  pthread_join(x->th, NULL);
  for (int i = 0; i < x->n; i++) {
    shutdown(x->ends[i][0], SHUT_RDWR);
    shutdown(x->ends[i][1], SHUT_RDWR);
    pthread_join(x->pipes[i], NULL);
    close(x->ends[i][0]);
    close(x->ends[i][1]);
  }
  close(x->fd);
}

/* 16 bundles of 3 files each, of `bytes` bytes ("small": a few). */
static void three_file_warmup(fx *f, const char *file, const char *gen,
                              char *path, size_t size) {
  char buckets[1024] = "";
  size_t n = 0;
  for (int i = 0; i < 16; i++)
    n += (size_t)snprintf(buckets + n, sizeof buckets - n, "%s{\"i\":%d}",
                          i ? "," : "", i);
  snprintf(path, size, "%s/%s.json", f->dir, file);
  write_text(path,
             "{\"schema\":\"kcache.warmup/v1\",\"model\":{\"name\":\"%s\","
             "\"hash\":\"%s\"},\"archs\":[\"sm_80\"],\"builder\":{\"command\":"
             "[\"sh\",\"-c\",\"for f in a b c; do %s > {out}/$f.cubin; "
             "done\"],\"timeout_s\":30},\"buckets\":[%s]}",
             file, MODEL, gen, buckets);
}

/* Seeds the model of path on kcached, then warms it into an empty cache
 * through a counting proxy: the connections and libkcache threads made. */
static void warm_counted(fx *f, const char *path, int *conns, int *threads) {
  char cache[400], err[KC_ERRBUF_SIZE];
  static int round;
  snprintf(cache, sizeof cache, "%s/seed%d", f->dir, round);
  run_res r;
  run_kcache(&r, NULL, NULL,
             (const char *[]){"warm", path, "--url", f->srv.url, "--cache-dir",
                              cache, "--strict", "--quiet", NULL});
  if (r.rc)
    fail_msg("seed: %s", r.out);
  kc_warmup *w = NULL;
  assert_int_equal(kc_warmup_load(path, &w, err), KC_OK);
  proxy x = {0};
  proxy_start(&x, f->srv.port);
  snprintf(cache, sizeof cache, "%s/fresh%d", f->dir, round++);
  kc_client *c = client_for(cache, x.url);
  kc_warm_opts o = {.no_build = 1, .no_compat = 1};
  kc_warm_report rep;
  __atomic_store_n(&threads_made, 0, __ATOMIC_SEQ_CST);
  __atomic_store_n(&counting, 1, __ATOMIC_SEQ_CST);
  kc_err e = kc_warm(c, w, &o, &rep, err);
  __atomic_store_n(&counting, 0, __ATOMIC_SEQ_CST);
  assert_int_equal(e, KC_OK);
  assert_int_equal(rep.counts[KC_WARM_HIT_REMOTE], 16);
  kc_warm_report_free(&rep);
  kc_client_free(c);
  *threads = __atomic_load_n(&threads_made, __ATOMIC_SEQ_CST);
  *conns = __atomic_load_n(&x.conns, __ATOMIC_SEQ_CST);
  proxy_stop(&x);
  kc_warmup_free(w);
}

/* A model the size of the demo's (16 bundles, 48 files, a few KiB) warms
 * from kcached on one connection (its lookup's) and no thread of
 * libkcache's own; 48 files of 32 KiB (1.5 MiB) get a writer thread and
 * a second connection, which shows the counting works. */
static void test_small_warm_threads_conns(void **state) {
  fx *f = *state;
  char small[400], big[400];
  int conns = 0, threads = 0;
  start_server(f);
  three_file_warmup(f, "small", "printf x{i}$f", small, sizeof small);
  warm_counted(f, small, &conns, &threads);
  print_message("16 bundles, 48 files of a few bytes: %d connections, %d "
                "threads\n",
                conns, threads);
  assert_int_equal(conns, 1);
  assert_int_equal(threads, 0);
  three_file_warmup(f, "big", "head -c 32768 /dev/urandom", big, sizeof big);
  warm_counted(f, big, &conns, &threads);
  print_message("16 bundles, 48 files of 32 KiB: %d connections, %d "
                "threads\n",
                conns, threads);
  assert_true(conns >= 2);
  assert_int_equal(threads, 1);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      CT(test_warm_deadline_stall),  CT(test_get_max_size),
      CT(test_get_streams),          CT(test_get_real),
      CT(test_out_linked),           CT(test_out_replaces),
      CT(test_out_other_fs),         CT(test_purge_rewarm_uploads),
      CT(test_purge_rewarm_tokens),  CT(test_out_compat_names_arch),
      CT(test_no_build_says_compat), CT(test_small_warm_threads_conns),
  };
  return clienttest_run("client_warm", tests, sizeof tests / sizeof tests[0]);
}
