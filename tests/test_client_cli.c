/* test_client_cli.c: the kcache CLI's own checks: usage errors, `kcache
 * key` and hashing, manifest errors, a names file read once, environment
 * and flags, no token sent in clear by accident, `kcache verify`. Fixture
 * and the CLI runner: clienttest.h. */
#include "clienttest.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include "kc_gpu.h"

/* ---- unit: CLI ---- */

static void test_cli_usage(void **state) {
  (void)state;
  char out[8192];
  assert_int_equal(run_cli(out, sizeof out, ""), 2);
  assert_int_equal(run_cli(out, sizeof out, "--help"), 0);
  assert_non_null(strstr(out, "exit status"));
  assert_int_equal(run_cli(out, sizeof out, "nosuchcommand"), 2);
  assert_int_equal(run_cli(out, sizeof out, "warm"), 2);
  assert_int_equal(run_cli(out, sizeof out, "warm --help"), 0);
  assert_non_null(strstr(out, "--deadline"));
  assert_int_equal(run_cli(out, sizeof out, "warm x.json --deadline abc"), 2);
  assert_int_equal(run_cli(out, sizeof out, "warm x.json --arch sm_8"), 2);
  assert_int_equal(run_cli(out, sizeof out, "warm a.json b.json"), 2);
  assert_int_equal(run_cli(out, sizeof out, "pull onlykey"), 2);
  assert_int_equal(run_cli(out, sizeof out, "pull notakey dir"), 2);
  assert_int_equal(run_cli(out, sizeof out, "hash"), 2);
  assert_int_equal(run_cli(out, sizeof out, "stat --bogus"), 2);
  assert_int_equal(run_cli(out, sizeof out, "stat"), 2);
  assert_non_null(strstr(out, "KCACHE_URL"));
  for (const char *const *cmd =
           (const char *const[]){"push", "pull", "get", "put", "key", "ls",
                                 "stat", "hash", "verify", NULL};
       *cmd; cmd++)
    assert_int_equal(run_cli(out, sizeof out, "%s --help", *cmd), 0);
}

static void test_cli_key_hash(void **state) {
  fx *f = *state;
  char out[8192], p[400];
  snprintf(p, sizeof p, "%s/fields.json", f->dir);
  write_text(p,
             "{\"model\":\"%s\",\"bucket\":{\"batch\":8,\"seq\":1024},"
             "\"arch\":\"sm_90a\",\"toolchain\":{\"cuda\":\"13.0\","
             "\"nvrtc\":\"13.0\"},\"build\":\"%s\"}",
             MODEL, MODEL);
  assert_int_equal(run_cli(out, sizeof out, "key %s", p), 0);
  out[64] = '\0';
  assert_true(kc_is_hex64(out));
  write_text(p, "{\"model\":\"%s\",\"arch\":\"sm_9\"}", MODEL);
  assert_int_equal(run_cli(out, sizeof out, "key %s", p), 1);
  assert_int_equal(run_cli(out, sizeof out, "hash %s", p), 0);
}

/* Manifest errors name their field, in the library and in the CLI. */
static void test_manifest_errors(void **state) {
  fx *f = *state;
  char out[8192], p[400];
  snprintf(p, sizeof p, "%s/bad.json", f->dir);
  write_text(p,
             "{\"schema\":\"kcache.warmup/v1\",\"model\":{\"name\":\"t\","
             "\"hash\":\"%s\"},\"archs\":[\"sm_8x\"],\"kernels\":[{\"name\":"
             "\"a\",\"source\":\"a.cu\",\"entries\":[\"a\"]}],\"buckets\":"
             "[{\"batch\":1}]}",
             MODEL);
  assert_int_equal(
      run_cli(out, sizeof out, "warm %s --cache-dir %s", p, f->cache), 1);
  assert_non_null(strstr(out, "archs[0]"));
  write_text(p, "{\"schema\":\"kcache.warmup/v1\",\"model\":{\"name\":\"t\","
                "\"hash\":\"nothex\"},\"kernels\":[],\"buckets\":[]}");
  assert_int_equal(
      run_cli(out, sizeof out, "warm %s --cache-dir %s", p, f->cache), 1);
  assert_non_null(strstr(out, "model.hash"));
}

/* A failing command names its file once, not "f: f: No such file". */
static void test_cli_names_file_once(void **state) {
  fx *f = *state;
  char out[8192], missing[400], bad[400], dir[400], bundle[450];
  snprintf(missing, sizeof missing, "%s/missing.json", f->dir);
  snprintf(bad, sizeof bad, "%s/bad.json", f->dir);
  snprintf(dir, sizeof dir, "%s/pushdir", f->dir);
  snprintf(bundle, sizeof bundle, "%s/kcache-bundle.json", dir);
  write_text(bad, "{");
  assert_int_equal(mkdir(dir, 0755), 0);
  write_text(bundle, "{");
  const char *url = "--url http://127.0.0.1:1"; /* never reached */
  struct {
    char args[1400];
    const char *file, *says;
  } c[9];
  size_t n = 0;
#define CASE(file_, says_, ...)                                                \
  (snprintf(c[n].args, sizeof c[n].args, __VA_ARGS__), c[n].file = file_,      \
   c[n++].says = says_)
  CASE(missing, "No such file", "warm %s", missing);
  CASE(bad, "line 1", "warm %s", bad);
  CASE(missing, "No such file", "key %s", missing);
  CASE(bad, "line 1", "key %s", bad);
  CASE(missing, "No such file", "hash %s", missing);
  CASE(missing, "No such file", "put %s %s", missing, url);
  CASE(missing, "No such file", "push %s --fields %s %s", dir, missing, url);
  CASE(bad, "line 1", "push %s --fields %s %s", dir, bad, url);
  CASE(bundle, "line 1", "push %s %s", dir, url);
#undef CASE
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(run_cli(out, sizeof out, "%s", c[i].args), 1);
    if (occurrences(out, c[i].file) != 1 || !strstr(out, c[i].says))
      fail_msg("kcache %s: %s", c[i].args, out);
  }
}

/* The common options come from one table: each flag and its variable reach
 * the client, the flag wins, and --help lists both. */
static void test_cli_env_and_flags(void **state) {
  fx *f = *state;
  char out[8192], env[700], from_env[400], from_flag[400], p[450];
  snprintf(from_env, sizeof from_env, "%s/env-cache", f->dir);
  snprintf(from_flag, sizeof from_flag, "%s/flag-cache", f->dir);
  snprintf(env, sizeof env, "KCACHE_DIR=%s", from_env);
  /* pull needs no server; the client makes its cache before it fails */
  assert_int_equal(
      run_cli_env(out, sizeof out, env, "pull %s %s", MODEL, f->out), 1);
  snprintf(p, sizeof p, "%s/blobs", from_env);
  assert_int_equal(access(p, F_OK), 0);
  rmtree(from_env);
  assert_int_equal(run_cli_env(out, sizeof out, env,
                               "pull %s %s --cache-dir %s", MODEL, f->out,
                               from_flag),
                   1);
  snprintf(p, sizeof p, "%s/blobs", from_flag);
  assert_int_equal(access(p, F_OK), 0);
  assert_int_not_equal(access(from_env, F_OK), 0);
  /* a token in clear off loopback: refused unless the variable says 1 */
  const char *tok = "KCACHE_URL=http://0.0.0.0:1 KCACHE_TOKEN=t";
  assert_int_equal(run_cli_env(out, sizeof out, tok, "stat"), 1);
  assert_non_null(strstr(out, "in clear"));
  snprintf(env, sizeof env, "%s KCACHE_ALLOW_PLAINTEXT=1", tok);
  assert_int_equal(run_cli_env(out, sizeof out, env, "stat"), 1);
  assert_null(strstr(out, "in clear"));
  assert_int_equal(run_cli_env(out, sizeof out, tok, "stat --allow-plaintext"),
                   1);
  assert_null(strstr(out, "in clear"));
  assert_int_equal(run_cli(out, sizeof out, "stat --parallel 0"), 2);
  assert_int_equal(run_cli(out, sizeof out, "--help"), 0);
  for (const char *const *v =
           (const char *const[]){"--url", "KCACHE_URL", "KCACHE_TOKEN",
                                 "KCACHE_CACERT", "--cache-dir", "KCACHE_DIR",
                                 "--parallel", "KCACHE_ALLOW_PLAINTEXT", NULL};
       *v; v++)
    assert_non_null(strstr(out, *v));
}

/* Tokens do not cross a network in clear by accident. */
static void test_plaintext_token(void **state) {
  fx *f = *state;
  char err[KC_ERRBUF_SIZE];
  kc_client *c = NULL;
  kc_client_opts o = {
      .url = "http://kcache.example:8080", .token = "t", .cache_dir = f->cache};
  assert_int_equal(kc_client_new(&o, &c, err), KC_EINVAL);
  assert_non_null(strstr(err, "in clear"));
  o.allow_plaintext = 1;
  assert_int_equal(kc_client_new(&o, &c, err), KC_OK);
  kc_client_free(c);
  o.allow_plaintext = 0;
  o.url = "http://127.0.0.1:8080";
  assert_int_equal(kc_client_new(&o, &c, err), KC_OK);
  kc_client_free(c);
  o.url = "https://kcache.example";
  assert_int_equal(kc_client_new(&o, &c, err), KC_OK);
  kc_client_free(c);
}

/* verify without a GPU: a clean error, exit 1; with one, it loads. */
static void test_cli_verify(void **state) {
  fx *f = *state;
  char out[8192], p[400], err[KC_ERRBUF_SIZE];
  kc_gpu_info gi;
  kc_warmup_free(warmup_for(f, "w", "saxpy", "saxpy", ""));
  snprintf(p, sizeof p, "%s/w.json", f->dir);
  int rc = run_cli(out, sizeof out, "verify %s --cache-dir %s", p, f->cache);
  if (kc_gpu_detect(&gi, err) != KC_OK) {
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "kcache verify: "));
    return;
  }
  need_nvrtc();
  assert_int_equal(run_cli(out, sizeof out,
                           "warm %s --cache-dir %s --arch %s"
                           " --quiet",
                           p, f->cache, gi.devices[0].arch),
                   0);
  rc = run_cli(out, sizeof out, "verify %s --cache-dir %s --arch %s", p,
               f->cache, gi.devices[0].arch);
  print_message("%s", out);
  assert_int_equal(rc, 0);
}

/* --strict is what a CI prepopulation runs: a token kcached refuses (401
 * wrong or revoked, 403 read-only) fails it with one line, whether the
 * local cache was empty (everything built, nothing uploaded) or full
 * (nothing to build: only the question of what kcached holds is asked).
 * Without --strict it stays a warning and exit 0. */
static void test_strict_refused_token(void **state) {
  fx *f = *state;
  char out[16384], tokens[400], wtok[256], rtok[256], w[400], env[1200];
  snprintf(tokens, sizeof tokens, "%s/tokens", f->dir);
  make_token("write", "ci", tokens, wtok, sizeof wtok);
  make_token("read", "svc", tokens, rtok, sizeof rtok);
  start_server_with(f, (const char *const[]){"--tokens", tokens, NULL});
  cmd_warmup(f, "ws", "printf built > {out}/k.bin", w, sizeof w);
  const char *bad[] = {"kc_0000wrong", rtok};
  for (int k = 0; k < 2; k++) {
    snprintf(env, sizeof env, "KCACHE_URL=%s KCACHE_TOKEN=%s KCACHE_DIR=%s/c%d",
             f->srv.url, bad[k], f->dir, k);
    /* empty local cache: built, not uploaded */
    assert_int_equal(run_cli_env(out, sizeof out, env, "warm %s --strict", w),
                     1);
    assert_int_equal(occurrences(out, "kcached refused the token"), 1);
    /* full local cache: nothing built, still refused */
    assert_int_equal(run_cli_env(out, sizeof out, env, "warm %s --strict", w),
                     1);
    assert_non_null(strstr(out, "hit-local"));
    assert_non_null(strstr(out, k ? "403" : "401"));
    assert_int_equal(run_cli_env(out, sizeof out, env, "warm %s", w), 0);
  }
  /* the write token: the same --strict warm passes, and uploads */
  snprintf(env, sizeof env, "KCACHE_URL=%s KCACHE_TOKEN=%s KCACHE_DIR=%s/c0",
           f->srv.url, wtok, f->dir);
  assert_int_equal(run_cli_env(out, sizeof out, env, "warm %s --strict", w), 0);
  assert_non_null(strstr(out, "uploaded: kcached did not hold it"));
}

/* No NVRTC to compute the keys with (an image without the toolkit, a
 * manifest that pins no "nvrtc"): a warning and exit 0, so the service
 * starts; --strict fails. */
static void test_no_nvrtc_is_a_warning(void **state) {
  fx *f = *state;
  char out[8192], w[400], env[600];
  snprintf(w, sizeof w, "%s/k.cu", f->dir);
  FILE *fp = fopen(w, "w");
  assert_non_null(fp);
  fputs("extern \"C\" __global__ void k() {}\n", fp);
  fclose(fp);
  snprintf(w, sizeof w, "%s/nopin.json", f->dir);
  assert_non_null(fp = fopen(w, "w"));
  fprintf(fp,
          "{\"schema\":\"kcache.warmup/v1\",\"model\":{\"name\":\"np\","
          "\"hash\":\"%s\"},\"archs\":[\"sm_80\"],\"kernels\":[{"
          "\"name\":\"k\",\"source\":\"k.cu\",\"entries\":[\"k\"]}],"
          "\"buckets\":[{\"batch\":1}]}",
          MODEL);
  fclose(fp);
  snprintf(env, sizeof env, "KCACHE_NVRTC=%s/none.so KCACHE_DIR=%s/c", f->dir,
           f->dir);
  assert_int_equal(run_cli_env(out, sizeof out, env, "warm %s", w), 0);
  assert_non_null(strstr(out, "warning: NVRTC not found"));
  assert_int_equal(run_cli_env(out, sizeof out, env, "warm %s --strict", w), 1);
}

/* --token's value is blanked in argv once parsed (as curl does): ps and
 * /proc/PID/cmdline do not show it for the rest of the run. The command
 * is held by a listener that never accepts. */
static void test_token_flag_blanked(void **state) {
  fx *f = *state;
  (void)f;
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  assert_int_equal(bind(ls, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(ls, 4), 0);
  assert_int_equal(getsockname(ls, (struct sockaddr *)&a, &al), 0);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d", ntohs(a.sin_port));
  pid_t pid = fork();
  if (pid == 0) {
    execl(KCACHE_BIN, "kcache", "stat", "--url", url, "--token",
          "kc_secret_in_argv", "--timeout", "20", (char *)NULL);
    _exit(127);
  }
  char path[64], buf[4096];
  snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
  int hidden = 0, seen_stat = 0;
  for (int i = 0; i < 300 && !hidden; i++) { /* 3 s at most */
    int fd = open(path, O_RDONLY);
    ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
    if (fd >= 0)
      close(fd);
    if (n > 0) {
      for (ssize_t k = 0; k < n; k++)
        buf[k] = buf[k] ? buf[k] : ' ';
      buf[n] = 0;
      seen_stat |= strstr(buf, " stat ") != NULL;
      hidden = seen_stat && !strstr(buf, "kc_secret_in_argv");
    }
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  close(ls);
  assert_true(hidden);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      CT(test_cli_usage),
      CT(test_cli_key_hash),
      CT(test_manifest_errors),
      CT(test_cli_names_file_once),
      CT(test_cli_env_and_flags),
      CT(test_plaintext_token),
      CT(test_cli_verify),
      CT(test_strict_refused_token),
      CT(test_no_nvrtc_is_a_warning),
      CT(test_token_flag_blanked),
  };
  return clienttest_run("client_cli", tests, sizeof tests / sizeof tests[0]);
}
