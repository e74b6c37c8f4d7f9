/* test_server_disk.c: kcached at the edges of its disk: a full
 * disk answers 507 disk_full (small uploads at the commit, large ones while
 * spooling), /readyz says 503 disk_full while reads still work, the state is
 * logged once each way, and freeing space brings writes back; and a second
 * kcached on a data directory another one serves refuses to start, naming
 * the first one's pid.
 *
 * The disk test mounts a 16 MiB tmpfs (needs root, or CAP_SYS_ADMIN): where
 * the mount fails it is skipped. Also: the model listing of 128 bundles with
 * large manifests answers the same from the index's key fields as from the
 * manifests (a store written before the index held them), with timings. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <jansson.h>
#include <lmdb.h>

#include "kc_schema.h"
#include "servertest.h"

/* ---- helpers ---- */

/* The error code of a JSON error body, "" when none. */
static const char *code_of(const resp *r, char out[64]) {
  json_t *j = body_json(r);
  const char *e = json_string_value(json_object_get(j, "error"));
  snprintf(out, 64, "%s", e ? e : "");
  json_decref(j);
  return out;
}

/* Expects status (and, when code is not NULL, that error code). */
#define EXPECT_HTTP(r, want, code)                                             \
  do {                                                                         \
    char c_[64];                                                               \
    if ((r).status != (want) ||                                                \
        ((code) && strcmp(code_of(&(r), c_), (code) ? (code) : "") != 0))      \
      fail_msg("%s:%d: got %ld (curl %d) %s, want %d %s", __FILE__, __LINE__,  \
               (r).status, (int)(r).rc, (r).body ? (r).body : "", (want),      \
               (code) ? (code) : "");                                          \
  } while (0)

/* PUT /v1/blobs/<digest> of n bytes made from seed. */
static resp put_seed_blob(const kc_testsrv *t, size_t n, unsigned seed,
                          char hex[KC_HEX_LEN + 1]) {
  char *p = malloc(n);
  assert_non_null(p);
  fill_random(p, n, seed);
  sha_hex(p, n, hex);
  char path[128];
  snprintf(path, sizeof path, "/v1/blobs/%s", hex);
  resp r = http(t, path, (req){.method = "PUT", .body = p, .len = n});
  free(p);
  return r;
}

/* Writes zeros into path until the file system is full. */
static void fill_disk(const char *path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  assert_true(fd >= 0);
  static char zero[64 * 1024];
  for (size_t chunk = sizeof zero; chunk >= 512; chunk /= 2)
    while (write(fd, zero, chunk) == (ssize_t)chunk)
      ;
  close(fd);
}

/* ---- a full disk ---- */

typedef struct disk_fx {
  char mnt[300];
  int mounted;
  kc_testsrv t;
} disk_fx;

/* Stops the server and unmounts, also after a failed assertion. */
static int disk_teardown(void **state) {
  disk_fx *f = *state;
  kc_testsrv_stop(&f->t);
  if (f->mounted)
    umount2(f->mnt, MNT_DETACH);
  kc_testsrv_cleanup(&f->t);
  free(f);
  return 0;
}

static int disk_setup(void **state) {
  disk_fx *f = calloc(1, sizeof *f);
  *state = f;
  return f && kc_testsrv_init(&f->t) == 0 ? 0 : -1;
}

static void t_disk_full(void **state) {
  disk_fx *f = *state;
  snprintf(f->mnt, sizeof f->mnt, "%s/mnt", f->t.dir);
  assert_int_equal(mkdir(f->mnt, 0700), 0);
  if (mount("tmpfs", f->mnt, "tmpfs", 0, "size=16m") != 0) {
    print_message("cannot mount a tmpfs (%s): skipped\n", strerror(errno));
    skip();
  }
  f->mounted = 1;
  char data[400], filler[400];
  snprintf(data, sizeof data, "%s/data", f->mnt);
  snprintf(filler, sizeof filler, "%s/filler", f->mnt);
  const char *args[] = {"--data-dir", data, NULL};
  assert_int_equal(kc_testsrv_start(&f->t, args), 0);
  char a[KC_HEX_LEN + 1], h[KC_HEX_LEN + 1], path[128];
  resp r = put_seed_blob(&f->t, 10000, 1, a);
  EXPECT_HTTP(r, 201, NULL);
  resp_free(&r);

  fill_disk(filler);
  r = put_seed_blob(&f->t, 100 * 1024, 2, h); /* in memory, then the commit */
  EXPECT_HTTP(r, 507, "disk_full");
  resp_free(&r);
  r = put_seed_blob(&f->t, 3 * 1024 * 1024, 3, h); /* spooled to a file */
  EXPECT_HTTP(r, 507, "disk_full");
  resp_free(&r);
  r = http(&f->t, "/readyz", (req){0});
  EXPECT_HTTP(r, 503, "disk_full");
  resp_free(&r);
  r = http(&f->t, "/healthz", (req){0});
  EXPECT_HTTP(r, 200, NULL);
  resp_free(&r);
  snprintf(path, sizeof path, "/v1/blobs/%s", a);
  r = http(&f->t, path, (req){0}); /* reads still work */
  EXPECT_HTTP(r, 200, NULL);
  assert_int_equal(r.len, 10000);
  resp_free(&r);
  assert_true(kc_testsrv_wait_log(&f->t, "is full: writes fail", 1, 5000));

  assert_int_equal(unlink(filler), 0); /* space freed */
  r = put_seed_blob(&f->t, 100 * 1024, 2, h);
  EXPECT_HTTP(r, 201, NULL);
  resp_free(&r);
  r = http(&f->t, "/readyz", (req){0});
  EXPECT_HTTP(r, 200, NULL);
  resp_free(&r);
  r = put_seed_blob(&f->t, 3 * 1024 * 1024, 3, h);
  EXPECT_HTTP(r, 201, NULL);
  resp_free(&r);
  assert_true(kc_testsrv_wait_log(&f->t, "writes succeed again", 1, 5000));
  /* logged once per change, not per failed request */
  char *log = kc_testsrv_slurp(f->t.log);
  const char *first = strstr(log, "is full: writes fail");
  assert_non_null(first);
  assert_null(strstr(first + 1, "is full: writes fail"));
  free(log);

  assert_int_equal(kc_testsrv_stop(&f->t), 0);
}

/* Writes zeros into path until the file system has about `left` bytes
 * free. */
static void fill_disk_but(const char *path, uint64_t left) {
  struct statvfs v;
  char dir[400];
  snprintf(dir, sizeof dir, "%s", path);
  *strrchr(dir, '/') = '\0';
  assert_int_equal(statvfs(dir, &v), 0);
  uint64_t avail = (uint64_t)v.f_bavail * v.f_frsize;
  assert_true(avail > left);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  assert_true(fd >= 0);
  static char zero[64 * 1024];
  for (uint64_t n = avail - left; n;) {
    size_t c = n < sizeof zero ? (size_t)n : sizeof zero;
    assert_int_equal(write(fd, zero, c), (ssize_t)c);
    n -= c;
  }
  close(fd);
}

/* The disk filling up under small uploads (in memory, then one commit):
 * the commit that runs out of room part way is a short write of LMDB's
 * pages, which LMDB answers EIO. It must read as what it is: 507
 * disk_full, /readyz 503, one log line; and space freed brings writes
 * back. */
static void t_disk_fills_up(void **state) {
  disk_fx *f = *state;
  snprintf(f->mnt, sizeof f->mnt, "%s/mnt", f->t.dir);
  assert_int_equal(mkdir(f->mnt, 0700), 0);
  if (mount("tmpfs", f->mnt, "tmpfs", 0, "size=16m") != 0) {
    print_message("cannot mount a tmpfs (%s): skipped\n", strerror(errno));
    skip();
  }
  f->mounted = 1;
  char data[400], filler[400], h[KC_HEX_LEN + 1];
  snprintf(data, sizeof data, "%s/data", f->mnt);
  snprintf(filler, sizeof filler, "%s/filler", f->mnt);
  const char *args[] = {"--data-dir", data, NULL};
  assert_int_equal(kc_testsrv_start(&f->t, args), 0);
  fill_disk_but(filler, 3 * 1024 * 1024);
  resp r = {0};
  int n = 0;
  do { /* 200 KB each, random: about 15 fit */
    resp_free(&r);
    r = put_seed_blob(&f->t, 200 * 1000, 100 + (unsigned)n, h);
  } while (r.status == 201 && ++n < 60);
  assert_true(n > 0 && n < 60);
  EXPECT_HTTP(r, 507, "disk_full");
  resp_free(&r);
  r = put_seed_blob(&f->t, 200 * 1000, 999, h); /* and the next one */
  EXPECT_HTTP(r, 507, "disk_full");
  resp_free(&r);
  r = http(&f->t, "/readyz", (req){0});
  EXPECT_HTTP(r, 503, "disk_full");
  resp_free(&r);
  assert_true(kc_testsrv_wait_log(&f->t, "is full: writes fail", 1, 5000));
  assert_int_equal(unlink(filler), 0);
  r = put_seed_blob(&f->t, 1000, 999, h);
  EXPECT_HTTP(r, 201, NULL);
  resp_free(&r);
  r = http(&f->t, "/readyz", (req){0});
  EXPECT_HTTP(r, 200, NULL);
  resp_free(&r);
  char *log = kc_testsrv_slurp(f->t.log);
  const char *first = strstr(log, "is full: writes fail");
  assert_non_null(first);
  assert_null(strstr(first + 1, "is full: writes fail"));
  free(log);
  assert_int_equal(kc_testsrv_stop(&f->t), 0);
}

/* ---- two servers, one directory ---- */

/* Runs kcached on data with its output in out; its exit status (20 s at
 * most, then -1). */
static int run_second(const char *data, const char *out) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 1);
    dup2(fd, 2);
    execl(kc_testsrv_bin(), kc_testsrv_bin(), "--listen", "127.0.0.1:0",
          "--data-dir", data, (char *)NULL);
    _exit(127);
  }
  for (int i = 0; i < 400; i++) {
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    usleep(50 * 1000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

static void t_two_servers_one_dir(void **state) {
  (void)state;
  kc_testsrv a = {0}, b = {0};
  assert_int_equal(kc_testsrv_start(&a, NULL), 0);
  char out[300], want[64];
  snprintf(out, sizeof out, "%s/second.log", a.dir);
  int rc = run_second(a.data, out);
  char *log = kc_testsrv_slurp(out);
  snprintf(want, sizeof want, "pid %ld", (long)a.pid);
  if (rc != 3 || !strstr(log, want))
    fail_msg("second kcached: exit %d, want 3 and \"%s\" in:\n%s", rc, want,
             log);
  free(log);
  assert_int_equal(kc_testsrv_stop(&a), 0);
  /* once the first is gone, the directory is free */
  assert_int_equal(kc_testsrv_init(&b), 0);
  const char *args[] = {"--data-dir", a.data, NULL};
  assert_int_equal(kc_testsrv_start(&b, args), 0);
  resp r = http(&b, "/readyz", (req){0});
  EXPECT_HTTP(r, 200, NULL);
  resp_free(&r);
  kc_testsrv_stop(&b);
  kc_testsrv_cleanup(&b);
  kc_testsrv_cleanup(&a);
}

/* ---- the model listing ---- */

#define M1 "5a7cc462c675f9d5693bae11d480f09c3c01ae53617500e6475623784622159c"

/* A manifest of 3000 files (~300 KB) naming one blob, bucket batch=b. */
static char *big_manifest(uint64_t b, const char *blob, char key[65]) {
  kc_manifest *m = kc_testsrv_manifest_base(M1, b, b % 2 ? "sm_90a" : "sm_80");
  assert_non_null(m);
  for (size_t i = 0; i < 3000; i++) {
    char path[64];
    const char *entries[] = {"a_kernel_entry_point_with_a_long_name"};
    snprintf(path, sizeof path, "kernels/some/dir/f%06zu.cubin", i);
    assert_int_equal(kc_manifest_add_file(m, path, blob, 100, KC_KIND_CUBIN,
                                          entries, 1, NULL),
                     KC_OK);
  }
  assert_int_equal(kc_manifest_seal(m, NULL), KC_OK);
  char *json = NULL;
  assert_int_equal(kc_manifest_to_json(m, &json, NULL), KC_OK);
  strcpy(key, m->key);
  kc_manifest_free(m);
  return json;
}

/* The listing's bundles array, and how long the GET took (ms). */
static json_t *list_models(const kc_testsrv *t, double *ms) {
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  resp r = http(t, "/v1/models/" M1, (req){0});
  clock_gettime(CLOCK_MONOTONIC, &b);
  *ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6;
  EXPECT_HTTP(r, 200, NULL);
  json_t *j = json_loadb(r.body, r.len, 0, NULL);
  resp_free(&r);
  json_t *list = json_incref(json_object_get(j, "bundles"));
  json_decref(j);
  assert_non_null(list);
  return list;
}

/* Empties the model index's records, as a version before them wrote it. */
static void empty_index(const char *data) {
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi models;
  MDB_cursor *cur;
  MDB_val k, v, empty = {0, ""};
  assert_int_equal(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, 32);
  assert_int_equal(mdb_env_open(env, data, 0, 0640), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
  assert_int_equal(mdb_dbi_open(txn, "models", 0, &models), 0);
  assert_int_equal(mdb_cursor_open(txn, models, &cur), 0);
  static unsigned char keys[256][128];
  size_t n = 0;
  for (int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0 && n < 256;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
    memcpy(keys[n++], k.mv_data, 128);
  mdb_cursor_close(cur);
  for (size_t i = 0; i < n; i++) {
    MDB_val key = {128, keys[i]};
    assert_int_equal(mdb_put(txn, models, &key, &empty, 0), 0);
  }
  assert_int_equal(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
}

static void t_model_listing(void **state) {
  (void)state;
  kc_testsrv t = {0};
  assert_int_equal(kc_testsrv_start(&t, NULL), 0);
  char blob[KC_HEX_LEN + 1], key[65], path[128];
  resp r = put_seed_blob(&t, 100, 9, blob);
  EXPECT_HTTP(r, 201, NULL);
  resp_free(&r);
  for (uint64_t i = 1; i <= 128; i++) {
    char *json = big_manifest(i, blob, key);
    snprintf(path, sizeof path, "/v1/bundles/%s", key);
    r = http(&t, path,
             (req){.method = "PUT", .body = json, .len = strlen(json)});
    EXPECT_HTTP(r, 201, NULL);
    resp_free(&r);
    free(json);
  }
  double now_ms, old_ms;
  json_t *now = list_models(&t, &now_ms);
  assert_int_equal(json_array_size(now), 128);
  size_t i;
  json_t *e;
  json_array_foreach(now, i, e) {
    const char *arch = json_string_value(json_object_get(e, "arch"));
    json_int_t batch = json_integer_value(
        json_object_get(json_object_get(e, "bucket"), "batch"));
    assert_true(batch >= 1 && batch <= 128);
    assert_string_equal(arch, batch % 2 ? "sm_90a" : "sm_80");
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(e, "toolchain"), "cuda")),
                        "13.0");
    assert_int_equal(json_integer_value(json_object_get(e, "bytes")),
                     3000 * 100);
  }
  assert_int_equal(kc_testsrv_stop(&t), 0);
  empty_index(t.data); /* the listing now parses the manifests */
  assert_int_equal(kc_testsrv_restart(&t), 0);
  json_t *old = list_models(&t, &old_ms);
  assert_true(json_equal(now, old)); /* the same answer either way */
  print_message("bench: GET /v1/models of 128 bundles (~300 KB manifests): "
                "%.1f ms from the index, %.1f ms parsing the manifests\n",
                now_ms, old_ms);
  json_decref(now);
  json_decref(old);
  kc_testsrv_stop(&t);
  kc_testsrv_cleanup(&t);
}

int main(void) {
  curl_global_init(CURL_GLOBAL_ALL);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(t_disk_full, disk_setup, disk_teardown),
      cmocka_unit_test_setup_teardown(t_disk_fills_up, disk_setup,
                                      disk_teardown),
      cmocka_unit_test(t_two_servers_one_dir),
      cmocka_unit_test(t_model_listing),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  curl_global_cleanup();
  return rc;
}
