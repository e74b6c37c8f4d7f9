/* testrgw.c: a Ceph RGW for the S3 tests through scripts/ceph-rgw.sh (see
 * testrgw.h). */
#include "testrgw.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef KC_SOURCE_DIR
#error "KC_SOURCE_DIR must name the source tree (for scripts/ceph-rgw.sh)"
#endif

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Runs scripts/ceph-rgw.sh CMD r->dir; its exit status (-1: not run). The
 * watchdog stops the cluster if this process dies before kc_testrgw_down. */
static int run_script(const kc_testrgw *r, const char *cmd) {
  char script[512], owner[32];
  snprintf(script, sizeof script, "%s/scripts/ceph-rgw.sh", KC_SOURCE_DIR);
  snprintf(owner, sizeof owner, "%ld", (long)getpid());
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    setenv("KCACHE_RGW_OWNER_PID", owner, 1);
    execl("/bin/bash", "bash", script, cmd, r->dir, (char *)NULL);
    _exit(127);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0)
    ;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Reads `export NAME=VALUE` lines. 0 when every value we need was there. */
static int read_env(kc_testrgw *r, const char *path) {
  char line[512];
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  struct {
    const char *name;
    char *dst;
    size_t cap;
  } want[] = {{"KCACHE_S3_ENDPOINT", r->endpoint, sizeof r->endpoint},
              {"KCACHE_S3_REGION", r->region, sizeof r->region},
              {"AWS_ACCESS_KEY_ID", r->access, sizeof r->access},
              {"AWS_SECRET_ACCESS_KEY", r->secret, sizeof r->secret}};
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\r\n")] = '\0';
    const char *l = strncmp(line, "export ", 7) == 0 ? line + 7 : line;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
      size_t n = strlen(want[i].name);
      if (strncmp(l, want[i].name, n) == 0 && l[n] == '=')
        snprintf(want[i].dst, want[i].cap, "%s", l + n + 1);
    }
  }
  fclose(f);
  return r->endpoint[0] && r->region[0] && r->access[0] && r->secret[0] ? 0
                                                                        : -1;
}

static int in_ci(void) {
  const char *ci = getenv("CI");
  return ci && (strcmp(ci, "true") == 0 || strcmp(ci, "1") == 0);
}

/* 0 up, 77 cannot be installed here, -1 failed. */
static int start(kc_testrgw *r, const char *who) {
  const char *given = getenv("KC_TEST_S3_ENV");
  if (given && given[0]) {
    /* ceph-rgw.sh writes DIR/env: the directory is the file's */
    snprintf(r->dir, sizeof r->dir, "%s", given);
    char *slash = strrchr(r->dir, '/');
    if (slash)
      *slash = '\0';
    else
      snprintf(r->dir, sizeof r->dir, ".");
    return read_env(r, given) == 0 ? 0 : -1;
  }
  const char *tmp = getenv("TMPDIR");
  snprintf(r->dir, sizeof r->dir, "%s/kcache-s3-XXXXXX",
           tmp && tmp[0] ? tmp : "/tmp");
  if (!mkdtemp(r->dir)) {
    r->dir[0] = '\0';
    return -1;
  }
  r->owned = 1;
  double t0 = now_s();
  int rc = run_script(r, "start");
  if (rc == 77)
    return 77;
  if (rc != 0)
    return -1;
  fprintf(stderr, "%s: RGW up in %.1f s\n", who, now_s() - t0);
  char env[300];
  snprintf(env, sizeof env, "%s/env", r->dir);
  return read_env(r, env) == 0 ? 0 : -1;
}

int kc_testrgw_up(kc_testrgw *r, const char *who) {
  memset(r, 0, sizeof *r);
  int up = start(r, who);
  if (up == 0)
    return 0;
  if (up == 77 && !in_ci()) {
    fprintf(stderr,
            "%s: no Ceph RGW here (packages cannot be installed): "
            "RGW tests skipped\n",
            who);
    return 77;
  }
  fprintf(stderr, "%s: the Ceph RGW did not start%s\n", who,
          up == 77 ? " (CI=true: a missing RGW is a failure)" : "");
  return -1;
}

int kc_testrgw_gateway_stop(kc_testrgw *r) {
  return r->dir[0] ? run_script(r, "rgw-stop") : -1;
}

int kc_testrgw_gateway_start(kc_testrgw *r) {
  return r->dir[0] ? run_script(r, "rgw-start") : -1;
}

void kc_testrgw_down(kc_testrgw *r) {
  if (!r->dir[0] || !r->owned)
    return;
  double t0 = now_s();
  run_script(r, "stop"); /* also after a failed start: it cleans up */
  if (r->endpoint[0])
    fprintf(stderr, "RGW stopped in %.1f s\n", now_s() - t0);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", r->dir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", r->dir);
  r->dir[0] = '\0';
  r->owned = 0;
}

int kc_testrgw_finish(kc_testrgw *r, int up, int fails) {
  kc_testrgw_down(r);
  if (fails || (up != 0 && up != 77))
    return 1;
  return up == 77 ? 77 : 0;
}

int kc_testrgw_bucket(const kc_testrgw *r, const char *stem, char *bucket,
                      size_t cap, kcs3 **s3) {
  char err[KC_ERRBUF_SIZE] = "";
  kcs3 *c = NULL;
  snprintf(bucket, cap, "%s-%ld", stem, (long)getpid());
  kcs3_opts o = {.endpoint = r->endpoint,
                 .bucket = bucket,
                 .region = r->region,
                 .path_style = 1,
                 .access_key = r->access,
                 .secret_key = r->secret};
  if (kcs3_open(&o, &c, err) != KC_OK || kcs3_bucket_create(c, err) != KC_OK) {
    fprintf(stderr, "bucket %s: %s\n", bucket, err);
    kcs3_close(c);
    return -1;
  }
  setenv("AWS_ACCESS_KEY_ID", r->access, 1);
  setenv("AWS_SECRET_ACCESS_KEY", r->secret, 1);
  if (s3)
    *s3 = c;
  else
    kcs3_close(c);
  return 0;
}

int kc_testrgw_replica_args(const kc_testrgw *r, const char *bucket,
                            const char *prefix, const char *const *extra,
                            const char **args, size_t cap) {
  const char *base[] = {"--s3-endpoint", r->endpoint,   "--s3-bucket",
                        bucket,          "--s3-prefix", prefix,
                        "--s3-region",   r->region,     "--s3-path-style"};
  size_t nb = sizeof base / sizeof base[0], ne = 0;
  while (extra && extra[ne])
    ne++;
  if (nb + ne + 1 > cap)
    return -1;
  memcpy(args, base, sizeof base);
  for (size_t i = 0; i < ne; i++)
    args[nb + i] = extra[i];
  args[nb + ne] = NULL;
  return 0;
}

/* ---- two kcached replicas over one bucket ---- */

int kc_testrgw_pair_start(kc_testrgw_pair *p, const char *prefix,
                          const char *const *extra) {
  const char *args[KC_TESTSRV_MAX_ARGS];
  snprintf(p->prefix, sizeof p->prefix, "%s", prefix);
  if (kc_testrgw_replica_args(&p->rgw, p->bucket, p->prefix, extra, args,
                              KC_TESTSRV_MAX_ARGS) != 0) {
    fprintf(stderr, "too many arguments for the replicas\n");
    return -1;
  }
  if (kc_testsrv_start(&p->a, args) != 0) {
    fprintf(stderr, "replica A did not start\n");
    return -1;
  }
  if (kc_testsrv_start(&p->b, args) != 0) {
    fprintf(stderr, "replica B did not start\n");
    return -1;
  }
  return 0;
}

/* 1 when a kcached log holds the secret. */
static int log_has_secret(const kc_testsrv *t, const char *secret) {
  char *text = t->log[0] ? kc_testsrv_slurp(t->log) : NULL;
  int found = text && secret[0] && strstr(text, secret) != NULL;
  free(text);
  return found;
}

int kc_testrgw_pair_stop(kc_testrgw_pair *p) {
  int rc = 0;
  kc_testsrv *both[] = {&p->a, &p->b};
  for (int i = 0; i < 2; i++) {
    if (kc_testsrv_stop_checked(both[i], i ? "B" : "A"))
      rc = -1;
    if (log_has_secret(both[i], p->rgw.secret)) {
      fprintf(stderr, "the S3 secret appears in %s\n", both[i]->log);
      rc = -1;
    }
    kc_testsrv_cleanup(both[i]);
    memset(both[i], 0, sizeof *both[i]);
  }
  setenv("AWS_ACCESS_KEY_ID", p->rgw.access, 1);
  setenv("AWS_SECRET_ACCESS_KEY", p->rgw.secret, 1);
  if (kc_testrgw_gateway_start(&p->rgw) != 0) {
    fprintf(stderr, "radosgw did not come back\n");
    rc = -1;
  }
  return rc;
}

void kc_testrgw_pair_show_logs(const kc_testrgw_pair *p) {
  kc_testsrv_show_log(&p->a, "A");
  kc_testsrv_show_log(&p->b, "B");
}

int kc_testrgw_pair_run(kc_testrgw_pair *p, const char *who, const char *stem,
                        const char *group, const struct CMUnitTest *tests,
                        size_t n, int fails) {
  int up = kc_testrgw_up(&p->rgw, who);
  if (up == 0) {
    if (kc_testrgw_bucket(&p->rgw, stem, p->bucket, sizeof p->bucket, &p->s3) !=
        0)
      fails++;
    else
      fails += _cmocka_run_group_tests(group, tests, n, NULL, NULL);
    kcs3_close(p->s3);
    p->s3 = NULL;
  }
  return kc_testrgw_finish(&p->rgw, up, fails);
}
