/* test_store_limits.c: the store at its limits: a limit lowered
 * below what a store holds (evicted at open, in committed batches; the
 * counters count what was removed), manifests counted in bytes used (also
 * after an upgrade), the model listing served from the index without parsing
 * manifests (and the fallback for older index records), and the lock that
 * keeps a second process off a store directory.
 *
 * Every test gets a fresh temporary directory. KC_TEST_FILTER=<glob> runs
 * some tests only. Links LMDB to make stores as an older version left them. */
#include <fnmatch.h>
#include <ftw.h>
#include <lmdb.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "kc_schema.h"
#include "kc_store.h"
#include "storetest.h"

#define MiB (1024ull * 1024)

/* ---- fixture: storetest's, and a tmpfs mounted by a test ---- */

static char g_mnt[280]; /* unmounted at teardown; tests run one at a time */

static int limits_teardown(void **state) {
  if (g_mnt[0])
    umount2(g_mnt, MNT_DETACH);
  g_mnt[0] = '\0';
  return fx_teardown(state);
}

/* ---- helpers ---- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Stores n deterministic bytes from seed; writes their digest. */
static void put_blob(kc_store *s, size_t n, uint64_t seed,
                     char hex[KC_HEX_LEN + 1]) {
  uint8_t *p = make_bytes(n, seed, hex);
  int created;
  OK(kc_store_blob_put(s, hex, p, n, &created, errbuf));
  free(p);
}

/* A sealed manifest of model M1, bucket {"batch": bucket}, naming the blob
 * (size bytes) at n_files paths: a large manifest over one small blob. */
static kc_manifest *manifest_of(uint64_t bucket, const char *blob,
                                uint64_t size, size_t n_files) {
  kc_manifest *m = manifest_base(M1, bucket);
  for (size_t i = 0; i < n_files; i++) {
    char path[64];
    const char *entries[] = {"a_kernel_entry_point_with_a_long_name"};
    snprintf(path, sizeof path, "kernels/some/dir/f%06zu.cubin", i);
    OK(kc_manifest_add_file(m, path, blob, size, KC_KIND_CUBIN, entries, 1,
                            errbuf));
  }
  OK(kc_manifest_seal(m, errbuf));
  return m;
}

static size_t json_len(const kc_manifest *m) {
  char *j = NULL;
  OK(kc_manifest_to_json(m, &j, errbuf));
  size_t n = strlen(j);
  free(j);
  return n;
}

/* A bundle over one new blob of size bytes; returns its manifest's length. */
static size_t put_bundle_blob(kc_store *s, uint64_t bucket, size_t size) {
  char d[KC_HEX_LEN + 1];
  put_blob(s, size, bucket + 1000, d);
  kc_manifest *m = manifest_of(bucket, d, size, 1);
  int created;
  OK(kc_store_bundle_put(s, m, &created, NULL, NULL, errbuf));
  size_t n = json_len(m);
  kc_manifest_free(m);
  return n;
}

/* Runs fn on the store's LMDB environment directly (store closed): to make
 * the records an older version wrote. */
static void with_env(const char *dir, void (*fn)(MDB_env *, MDB_txn *)) {
  MDB_env *env;
  MDB_txn *txn;
  assert_int_equal(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, 32);
  assert_int_equal(mdb_env_open(env, dir, 0, 0640), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
  fn(env, txn);
  assert_int_equal(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
}

/* ---- item 3: a limit lowered below what the store holds ---- */

/* Fills a map with 256 KiB bundles, then reopens it with a limit a tenth of
 * what it holds. The map cannot grow (a map smaller than the file keeps the
 * file's size, as a 1.6 GB store restarted with --max-bytes 100M keeps its
 * 1.6 GB when the derived map is 406 MB), so evicting everything at once in
 * one transaction fails for want of pages; batches do not. */
static void test_lowered_limit_recovers(void **state) {
  fx *f = *state;
  const uint64_t map = 24 * MiB, limit = 2 * MiB;
  kc_store *s = open_store(f->dir, 0, map, 0);
  uint64_t n = 0;
  while (get_stats(s).map_used < map / 100 * 93)
    put_bundle_blob(s, ++n, 256 * 1024);
  kc_store_stats before = get_stats(s);
  print_message(
      "filled: %llu bundles, %llu bytes used, map %llu of %llu\n",
      (unsigned long long)before.bundles, (unsigned long long)before.bytes_used,
      (unsigned long long)before.map_used, (unsigned long long)before.map_size);
  kc_store_close(s);

  s = open_store(f->dir, limit, 4 * MiB, 0);
  kc_store_stats st = get_stats(s);
  print_message("reopened with a %llu-byte limit: %llu bytes used, %llu "
                "bundles, %llu evicted\n",
                (unsigned long long)limit, (unsigned long long)st.bytes_used,
                (unsigned long long)st.bundles,
                (unsigned long long)st.evicted_bundles);
  assert_true(st.bytes_used <= limit); /* evicted at open */
  assert_int_equal(st.evicted_bundles, before.bundles - st.bundles);
  assert_int_equal(st.evicted_blobs + st.gc_blobs, before.blobs - st.blobs);
  for (int i = 0; i < 40; i++) /* writes work, and go on working */
    put_bundle_blob(s, 100000 + (uint64_t)i, 256 * 1024);
  st = get_stats(s);
  assert_true(st.bytes_used <= limit);
  assert_int_equal(st.evicted_bundles, before.bundles + 40 - st.bundles);
  assert_int_equal(st.evicted_blobs + st.gc_blobs,
                   before.blobs + 40 - st.blobs);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);

  /* The limit with the map derived from it (no map size given) too. */
  s = open_store(f->dir, limit / 4, 0, 0);
  st = get_stats(s);
  assert_true(st.bytes_used <= limit / 4);
  put_bundle_blob(s, 200000, 100 * 1024);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
}

/* ---- item 4: a full disk ---- */

/* Writes zeros into path until the file system is full. */
static void fill_disk(const char *path) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  setvbuf(f, NULL, _IONBF, 0);
  static char zero[64 * 1024];
  for (size_t chunk = sizeof zero; chunk >= 512; chunk /= 2)
    while (fwrite(zero, 1, chunk, f) == chunk)
      ;
  fclose(f);
}

/* On a full 16 MiB tmpfs: writes fail with KC_DISK_FULL and set the flag;
 * an eviction whose commit fails counts nothing; freeing space clears the
 * flag at the next commit, and the counters then equal what was removed. */
static void test_disk_full(void **state) {
  fx *f = *state;
  char *mnt = g_mnt, filler[300];
  snprintf(g_mnt, sizeof g_mnt, "%s/mnt", f->tmp);
  snprintf(filler, sizeof filler, "%s/filler", mnt);
  assert_int_equal(mkdir(mnt, 0700), 0);
  if (mount("tmpfs", mnt, "tmpfs", 0, "size=16m") != 0) {
    print_message("cannot mount a tmpfs: skipped\n");
    mnt[0] = '\0';
    skip();
  }
  free(f->dir);
  f->dir = path_join(mnt, "store");
  kc_store *s = open_store(f->dir, 0, 0, 0);
  for (uint64_t i = 0; i < 300; i++)
    put_bundle_blob(s, i + 1, 2048);
  kc_store_stats before = get_stats(s);
  fill_disk(filler);
  char d[KC_HEX_LEN + 1];
  unsigned char p[100 * 1024] = {1};
  assert_int_equal(kc_sha256_hex(p, sizeof p, d), KC_OK);
  int created;
  errbuf[0] = '\0';
  assert_int_equal(kc_store_blob_put(s, d, p, sizeof p, &created, errbuf),
                   KC_DISK_FULL);
  assert_non_null(strstr(errbuf, "full"));
  assert_true(get_stats(s).disk_full_since > 0);
  assert_true(kc_store_disk_full_since(s) > 0);
  kc_err e = kc_store_evict(s, 0, errbuf);
  kc_store_stats st = get_stats(s);
  print_message("evicting everything on a full disk: %s, %llu of %llu "
                "bundles left\n",
                kc_err_name(e), (unsigned long long)st.bundles,
                (unsigned long long)before.bundles);
  assert_int_equal(st.evicted_bundles, before.bundles - st.bundles);
  assert_int_equal(st.evicted_blobs, before.blobs - st.blobs);
  assert_int_equal(unlink(filler), 0);
  OK(kc_store_blob_put(s, d, p, sizeof p, &created, errbuf));
  assert_int_equal(get_stats(s).disk_full_since, 0);
  OK(kc_store_evict(s, 0, errbuf));
  st = get_stats(s);
  assert_int_equal(st.bundles, 0);
  assert_int_equal(st.evicted_bundles, before.bundles);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
}

/* ---- item 7: manifests count ---- */

static void drop_counted(MDB_env *env, MDB_txn *txn) {
  (void)env;
  MDB_dbi meta;
  assert_int_equal(mdb_dbi_open(txn, "meta", 0, &meta), 0);
  MDB_val k = {17, (void *)"manifests_counted"};
  assert_int_equal(mdb_del(txn, meta, &k, NULL), 0);
  uint64_t blobs_only = 100; /* what an older version counted */
  MDB_val bk = {10, (void *)"bytes_used"}, bv = {8, &blobs_only};
  assert_int_equal(mdb_put(txn, meta, &bk, &bv, 0), 0);
}

/* 16 bundles of 2000 files each naming one 100-byte blob: the manifests are
 * what takes the room, and what bytes used must show. */
static void test_manifests_counted(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  char d[KC_HEX_LEN + 1];
  put_blob(s, 100, 7, d);
  uint64_t want = 100;
  char first[KC_HEX_LEN + 1];
  size_t first_len = 0;
  for (uint64_t i = 0; i < 16; i++) {
    kc_manifest *m = manifest_of(i + 1, d, 100, 2000);
    int created;
    OK(kc_store_bundle_put(s, m, &created, NULL, NULL, errbuf));
    want += json_len(m);
    if (i == 0) {
      strcpy(first, m->key);
      first_len = json_len(m);
    }
    kc_manifest_free(m);
  }
  assert_true(want > 16 * 100000);
  assert_int_equal(get_stats(s).bytes_used, want);
  OK(kc_store_verify(s, errbuf));
  OK(kc_store_bundle_delete(s, first, errbuf));
  want -= first_len;
  assert_int_equal(get_stats(s).bytes_used, want);
  kc_store_close(s);

  /* A store from before manifests counted: recounted at open. */
  with_env(f->dir, drop_counted);
  s = open_store(f->dir, 0, 0, 0);
  assert_int_equal(get_stats(s).bytes_used, want);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
  s = open_store(f->dir, 0, 0, 0); /* once only */
  assert_int_equal(get_stats(s).bytes_used, want);
  kc_store_close(s);
}

/* A limit holds manifests too: large manifests over one small blob are
 * evicted when they cross it. */
static void test_manifests_evicted(void **state) {
  fx *f = *state;
  const uint64_t limit = 1 * MiB;
  kc_store *s = open_store(f->dir, limit, 0, 0);
  char d[KC_HEX_LEN + 1];
  put_blob(s, 100, 7, d);
  for (uint64_t i = 0; i < 24; i++) {
    kc_manifest *m = manifest_of(i + 1, d, 100, 1000); /* ~100 KB each */
    int created;
    OK(kc_store_bundle_put(s, m, &created, NULL, NULL, errbuf));
    kc_manifest_free(m);
    assert_true(get_stats(s).bytes_used <= limit);
  }
  kc_store_stats st = get_stats(s);
  assert_true(st.bundles < 24);
  assert_int_equal(st.evicted_bundles, 24 - st.bundles);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
}

/* ---- item 8: the model listing ---- */

typedef struct field_check {
  size_t n, with_fields;
  int bad;
  double fields_s, manifest_s; /* parsing each, as the server's handler does */
} field_check;

/* Checks an entry: the index's key fields are the manifest's, bytes and
 * created are right. */
static int check_cb(const kc_store_bundle_info *info, void *ud) {
  field_check *l = ud;
  l->n++;
  double t0 = now_s();
  json_t *k =
      info->fields ? json_loadb(info->fields, info->fields_len, 0, NULL) : NULL;
  double t1 = now_s();
  json_t *m = json_loadb(info->manifest, info->manifest_len, 0, NULL);
  l->fields_s += t1 - t0;
  l->manifest_s += now_s() - t1;
  if (k) {
    l->with_fields++;
    const char *names[] = {"bucket", "arch", "toolchain", "model", "build"};
    for (size_t i = 0; i < 5; i++)
      if (!json_equal(json_object_get(k, names[i]),
                      json_object_get(m, names[i])))
        l->bad = 1;
  }
  json_t *files = json_object_get(m, "files");
  const char *key = json_string_value(json_object_get(m, "key"));
  if (!key || strcmp(key, info->key) != 0 ||
      info->bytes != 100 * json_array_size(files) ||
      json_array_size(files) != 3000 || info->created <= 0 ||
      info->created > (int64_t)time(NULL))
    l->bad = 1;
  json_decref(m);
  json_decref(k);
  return 0;
}

static void empty_index(MDB_env *env, MDB_txn *txn) {
  (void)env;
  MDB_dbi models;
  MDB_cursor *cur;
  MDB_val k, v, empty = {0, ""};
  assert_int_equal(mdb_dbi_open(txn, "models", 0, &models), 0);
  assert_int_equal(mdb_cursor_open(txn, models, &cur), 0);
  size_t n = 0;
  unsigned char(*keys)[128] = calloc(1024, sizeof *keys);
  for (int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0 && n < 1024;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    assert_int_equal(k.mv_size, 128);
    memcpy(keys[n++], k.mv_data, 128);
  }
  mdb_cursor_close(cur);
  for (size_t i = 0; i < n; i++) {
    MDB_val key = {128, keys[i]};
    assert_int_equal(mdb_put(txn, models, &key, &empty, 0), 0);
  }
  free(keys);
}

static void test_model_list_fields(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  char d[KC_HEX_LEN + 1];
  put_blob(s, 100, 7, d);
  for (uint64_t i = 0; i < 128; i++) {
    kc_manifest *m = manifest_of(i + 1, d, 100, 3000); /* ~300 KB each */
    int created;
    OK(kc_store_bundle_put(s, m, &created, NULL, NULL, errbuf));
    kc_manifest_free(m);
  }
  field_check l = {0};
  OK(kc_store_model_list(s, M1, check_cb, &l));
  assert_int_equal(l.n, 128);
  assert_int_equal(l.with_fields, 128);
  assert_false(l.bad);
  print_message("bench: a listing of 128 bundles (~300 KB manifests) parses "
                "%.1f ms of key fields now, where it parsed %.1f ms of "
                "manifests\n",
                l.fields_s * 1000, l.manifest_s * 1000);
  kc_store_close(s);
  with_env(f->dir, empty_index); /* an index as an older version wrote it */
  s = open_store(f->dir, 0, 0, 0);
  field_check old = {0};
  OK(kc_store_model_list(s, M1, check_cb, &old));
  assert_int_equal(old.n, 128);
  assert_int_equal(old.with_fields, 0); /* the handler parses the manifest */
  assert_false(old.bad);
  kc_store_close(s);
}

/* ---- item 5: one process per directory ---- */

static void test_lock(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  kc_store_opts o = {.dir = f->dir};
  kc_store *s2 = NULL;
  char want[32];
  snprintf(want, sizeof want, "pid %ld", (long)getpid());
  /* another process */
  pid_t pid = fork();
  if (pid == 0) {
    char err[KC_ERRBUF_SIZE] = "";
    kc_err e = kc_store_open(&o, &s2, err);
    _exit(e == KC_LOCKED && strstr(err, want) ? 0 : 1);
  }
  int status = -1;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  /* this process, a second time */
  errbuf[0] = '\0';
  assert_int_equal(kc_store_open(&o, &s2, errbuf), KC_LOCKED);
  assert_non_null(strstr(errbuf, want));
  assert_null(s2);
  /* kcached.lock deleted while held: the directory is still locked */
  char lock[4096];
  snprintf(lock, sizeof lock, "%s/kcached.lock", f->dir);
  assert_int_equal(unlink(lock), 0);
  pid = fork();
  if (pid == 0) {
    char err[KC_ERRBUF_SIZE] = "";
    _exit(kc_store_open(&o, &s2, err) == KC_LOCKED ? 0 : 1);
  }
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  kc_store_close(s);
  OK(kc_store_open(&o, &s2, errbuf)); /* free again once closed */
  kc_store_close(s2);
}

int main(void) {
#define LT(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, limits_teardown)
  const struct CMUnitTest tests[] = {
      LT(test_lowered_limit_recovers), LT(test_disk_full),
      LT(test_manifests_counted),      LT(test_manifests_evicted),
      LT(test_model_list_fields),      LT(test_lock),
  };
#undef LT
  return storetest_run("store_limits", tests, sizeof tests / sizeof tests[0]);
}
