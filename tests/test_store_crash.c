/* test_store_crash.c: store/ unit tests (kc_store.h) of
 * reopen and crash safety: close and reopen, a smaller map, a writer
 * killed with SIGKILL in random places (KC_TEST_SEED: its seed).
 * Fixtures and helpers: storetest.h. */
#include <errno.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "storetest.h"

/* ======================================================================= */
/* reopen                                                                   */

static void test_close_reopen(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 50 * 1024 * 1024, 0, 100);
  char x[KC_HEX_LEN + 1], y[KC_HEX_LEN + 1], z[KC_HEX_LEN + 1],
      u[KC_HEX_LEN + 1];
  put_seed(s, 3000, 130, x); /* shared */
  kc_manifest *a = bundle_with_blob(s, M1, 1, 4000, 131, x, 3000, y);
  kc_manifest *b = bundle_with_blob(s, M1, 2, 5000, 132, x, 3000, z);
  put_seed(s, 6000, 133, u); /* unreferenced */
  char *aj = manifest_json(a), *bj = manifest_json(b);
  kc_store_read *r = NULL;
  const char *json;
  size_t len;
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_bundle_get(r, a->key, &json, &len));
  OK(kc_store_bundle_get(r, a->key, &json, &len));
  kc_store_read_end(r);
  OK(kc_store_flush(s));
  listing *l0 = list_model(s, M1);
  kc_store_stats st0 = get_stats(s);
  kc_store_close(s);

  s = open_store(f->dir, 50 * 1024 * 1024, 0, 100);
  kc_store_stats st1 = get_stats(s);
  assert_int_equal(st1.blobs, st0.blobs);
  assert_int_equal(st1.bundles, st0.bundles);
  assert_int_equal(st1.bytes_used, st0.bytes_used);
  assert_int_equal(blob_bytes(s), 3000 + 4000 + 5000 + 6000);
  assert_true(blob_present(s, x) && blob_present(s, y) && blob_present(s, z) &&
              blob_present(s, u));
  expect_bundle_json(s, a->key, aj);
  expect_bundle_json(s, b->key, bj);
  listing *l1 = list_model(s, M1);
  assert_int_equal(l1->n, 2);
  for (size_t i = 0; i < l0->n; i++) {
    ssize_t k = listing_find(l1, l0->keys[i]);
    assert_true(k >= 0);
    assert_int_equal(l1->hits[k], l0->hits[i]);
    assert_int_equal(l1->last_used[k], l0->last_used[i]);
    assert_int_equal(l1->created[k], l0->created[i]);
    assert_int_equal(l1->bytes[k], l0->bytes[i]);
  }
  ssize_t ka = listing_find(l1, a->key);
  assert_true(ka >= 0);
  assert_int_equal(l1->hits[ka], 2);
  listing_free(l0);
  listing_free(l1);
  OK(kc_store_verify(s, errbuf));

  /* Hits recorded without an explicit flush survive close (close flushes).
   * expect_bundle_json above got a and b once each in this session. */
  kc_store_close(s);
  s = open_store(f->dir, 50 * 1024 * 1024, 0, 100);
  l1 = list_model(s, M1);
  ssize_t kb = listing_find(l1, b->key);
  ka = listing_find(l1, a->key);
  assert_true(ka >= 0 && kb >= 0);
  assert_int_equal(l1->hits[ka], 3);
  assert_int_equal(l1->hits[kb], 1);
  listing_free(l1);

  /* Refcounts survived: deleting a releases y only; x is b's too. */
  OK(kc_store_bundle_delete(s, a->key, errbuf));
  OK(kc_store_gc(s, (int64_t)time(NULL) + 1000, errbuf));
  assert_false(blob_present(s, y));
  assert_false(blob_present(s, u));
  assert_true(blob_present(s, x));
  assert_true(blob_present(s, z));
  kc_store_close(s);

  /* And the deletion and gc persisted. */
  s = open_store(f->dir, 50 * 1024 * 1024, 0, 100);
  kc_store_stats st2 = get_stats(s);
  assert_int_equal(st2.blobs, 2);
  assert_int_equal(st2.bundles, 1);
  assert_int_equal(blob_bytes(s), 3000 + 5000);
  assert_int_equal(st2.hits, 0); /* since open */
  EXPECT(kc_store_bundle_has(s, a->key), KC_NOT_FOUND);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
  kc_manifest_free(a);
  kc_manifest_free(b);
  free(aj);
  free(bj);
}

/* Reopening with a map_size smaller than what the store holds still opens
 * it, with everything readable (LMDB never maps less than the data). */
static void test_reopen_smaller_map(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 64 * 1024 * 1024, 0);
  char d[24][KC_HEX_LEN + 1];
  for (int i = 0; i < 24; i++)
    put_seed(s, 128 * 1024, 180 + (uint64_t)i, d[i]);
  kc_store_close(s);
  s = open_store(f->dir, 0, 1024 * 1024, 0);
  for (int i = 0; i < 24; i++)
    assert_true(blob_present(s, d[i]));
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.blobs, 24);
  assert_true(st.map_size >= st.map_used);
  assert_true(st.map_used >= 24 * 128 * 1024);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
}

/* ======================================================================= */
/* crash safety                                                             */

#define CRASH_MODEL M2

/* The child: a stream of uploads, blob puts, bundle puts and deletes until
 * killed. Never returns. Signals the parent once the store is open, then
 * journals on the same pipe: "P<key>\n" after a bundle put returned,
 * "d<key>\n" before a delete and "D<key>\n" after it returned. */
static void journal(int fd, char tag, const char *key) {
  char line[KC_HEX_LEN + 2];
  line[0] = tag;
  memcpy(line + 1, key, KC_HEX_LEN);
  line[KC_HEX_LEN + 1] = '\n';
  if (write(fd, line, sizeof line) != (ssize_t)sizeof line)
    _exit(30);
}

static void crash_child(const char *dir, int round, int ready_fd) {
  kc_store_opts o;
  memset(&o, 0, sizeof o);
  o.dir = dir;
  o.grace_s = 1;
  kc_store *s = NULL;
  if (kc_store_open(&o, &s, NULL) != KC_OK)
    _exit(10);
  if (write(ready_fd, "r", 1) != 1)
    _exit(11);
  uint8_t *buf = malloc(300 * 1024);
  if (!buf)
    _exit(12);
  char keys[64][KC_HEX_LEN + 1];
  size_t n_keys = 0;
  for (uint64_t j = 0; j < 1000000; j++) {
    uint64_t id = (uint64_t)round * 1000000 + j;
    size_t nf = 1 + j % 3;
    char d[3][KC_HEX_LEN + 1];
    uint64_t sz[3];
    for (size_t i = 0; i < nf; i++) {
      sz[i] = 1 + (id * 7919 + i * 104729) % (256 * 1024);
      fill(buf, sz[i], id * 4 + i);
      kc_sha256_hex(buf, sz[i], d[i]);
      int created;
      kc_err e;
      if ((j + i) % 2) {
        e = kc_store_blob_put(s, d[i], buf, sz[i], &created, NULL);
      } else {
        kc_store_upload *u = NULL;
        e = kc_store_upload_begin(s, &u, NULL);
        if (e == KC_OK)
          e = kc_store_upload_write(u, buf, sz[i] / 2, NULL);
        if (e == KC_OK)
          e = kc_store_upload_write(u, buf + sz[i] / 2, sz[i] - sz[i] / 2,
                                    NULL);
        if (e == KC_OK)
          e = kc_store_upload_commit(u, d[i], &created, NULL);
        else
          kc_store_upload_abort(u);
      }
      if (e != KC_OK)
        _exit(20);
    }
    kc_manifest *m = kc_manifest_new();
    if (!m)
      _exit(21);
    strcpy(m->fields.model, CRASH_MODEL);
    strcpy(m->fields.build, B1);
    strcpy(m->fields.arch, "sm_80");
    m->fields.bucket.n = 1;
    strcpy(m->fields.bucket.dims[0].name, "seq");
    m->fields.bucket.dims[0].value = id;
    for (size_t i = 0; i < nf; i++) {
      char path[32];
      snprintf(path, sizeof path, "k%zu.ptx", i);
      if (kc_manifest_add_file(m, path, d[i], sz[i], KC_KIND_PTX, NULL, 0,
                               NULL) != KC_OK)
        _exit(22);
    }
    if (kc_manifest_seal(m, NULL) != KC_OK)
      _exit(23);
    int created;
    if (kc_store_bundle_put(s, m, &created, NULL, NULL, NULL) != KC_OK)
      _exit(24);
    journal(ready_fd, 'P', m->key);
    if (n_keys < 64)
      strcpy(keys[n_keys++], m->key);
    kc_manifest_free(m);
    /* Now and then: a delete, a gc, a flush (read first so there is
     * something to flush). */
    if (j % 5 == 4 && n_keys > 1) {
      n_keys--;
      journal(ready_fd, 'd', keys[n_keys]);
      if (kc_store_bundle_delete(s, keys[n_keys], NULL) != KC_OK)
        _exit(25);
      journal(ready_fd, 'D', keys[n_keys]);
    }
    if (j % 7 == 6 && kc_store_gc(s, (int64_t)time(NULL) + 10, NULL) != KC_OK)
      _exit(26);
    if (j % 3 == 2) {
      kc_store_read *r = NULL;
      const char *json;
      size_t len;
      if (kc_store_read_begin(s, &r) != KC_OK)
        _exit(27);
      kc_store_bundle_get(r, keys[0], &json, &len);
      kc_store_read_end(r);
      if (kc_store_flush(s) != KC_OK)
        _exit(28);
    }
  }
  _exit(0);
}

typedef struct verify_ctx {
  kc_store_read *r;
  size_t n, bad;
  char why[512];
} verify_ctx;

static int verify_cb(const kc_store_bundle_info *info, void *ud) {
  verify_ctx *v = ud;
  char why[512];
  v->n++;
  if (!info->manifest) {
    v->bad++;
    snprintf(v->why, sizeof v->why, "bundle %s: no manifest in listing",
             info->key);
    return 0;
  }
  if (!bundle_blobs_ok(v->r, info->manifest, info->manifest_len, why,
                       sizeof why)) {
    v->bad++;
    memcpy(v->why, why, sizeof why);
  }
  return 0;
}

static size_t check_crashed_store(const char *dir) {
  kc_store *s = open_store(dir, 0, 0, 1);
  OK(kc_store_verify(s, errbuf));
  verify_ctx v;
  memset(&v, 0, sizeof v);
  OK(kc_store_read_begin(s, &v.r));
  OK(kc_store_model_list(s, CRASH_MODEL, verify_cb, &v));
  kc_store_read_end(v.r);
  if (v.bad)
    fail_msg("%zu of %zu bundles incomplete after SIGKILL; first: %s", v.bad,
             v.n, v.why);
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.bundles, v.n);
  kc_store_close(s);
  return v.n;
}

/* What the children said they committed: every bundle whose put returned
 * is there after the kill unless a delete of it began; every bundle whose
 * delete returned is gone. */
#define JR_MAX 20000
typedef struct crash_journal {
  size_t n;
  char keys[JR_MAX][KC_HEX_LEN + 1];
  char state[JR_MAX]; /* 'P' put, 'd' delete begun, 'D' deleted */
} crash_journal;

static void read_journal(int fd, crash_journal *jr) {
  char line[KC_HEX_LEN + 2];
  size_t have = 0;
  for (;;) {
    ssize_t k = read(fd, line + have, sizeof line - have);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      break; /* a torn last line is dropped */
    have += (size_t)k;
    if (have < sizeof line)
      continue;
    have = 0;
    char tag = line[0];
    line[KC_HEX_LEN + 1] = '\0';
    const char *key = line + 1;
    size_t i;
    for (i = 0; i < jr->n; i++)
      if (memcmp(jr->keys[i], key, KC_HEX_LEN) == 0)
        break;
    if (i == jr->n) {
      if (jr->n == JR_MAX)
        continue;
      memcpy(jr->keys[i], key, KC_HEX_LEN);
      jr->keys[i][KC_HEX_LEN] = '\0';
      jr->n++;
    }
    jr->state[i] = tag;
  }
}

static void check_journal(const char *dir, const crash_journal *jr) {
  kc_store *s = open_store(dir, 0, 0, 1);
  for (size_t i = 0; i < jr->n; i++) {
    kc_err e = kc_store_bundle_has(s, jr->keys[i]);
    if (jr->state[i] == 'P' && e != KC_OK)
      fail_msg("bundle %s: put returned KC_OK before the kill, gone after "
               "(%s)",
               jr->keys[i], kc_err_name(e));
    if (jr->state[i] == 'D' && e != KC_NOT_FOUND)
      fail_msg("bundle %s: delete returned KC_OK before the kill, present "
               "after (%s)",
               jr->keys[i], kc_err_name(e));
  }
  kc_store_close(s);
}

static void test_crash_sigkill(void **state) {
  fx *f = *state;
  unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
  const char *env = getenv("KC_TEST_SEED");
  if (env)
    seed = (unsigned)strtoul(env, NULL, 10);
  print_message("crash test seed %u (KC_TEST_SEED)\n", seed);
  srand(seed);
  size_t last = 0;
  crash_journal *jr = calloc(1, sizeof *jr);
  assert_non_null(jr);
  for (int round = 0; round < 5; round++) {
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      close(pfd[0]);
      crash_child(f->dir, round, pfd[1]);
    }
    close(pfd[1]);
    char c;
    ssize_t k = read(pfd[0], &c, 1);
    if (k != 1) {
      close(pfd[0]);
      int st;
      waitpid(pid, &st, 0);
      fail_msg("child could not open the store (exit %d)",
               WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
    useconds_t delay = 50000 + (useconds_t)(rand() % 250000);
    usleep(delay);
    kill(pid, SIGKILL);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL))
      fail_msg("child ended by itself before the kill (status %d, exit %d)", st,
               WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    read_journal(pfd[0], jr);
    close(pfd[0]);
    last = check_crashed_store(f->dir);
    check_journal(f->dir, jr);
  }
  print_message("crash test: %zu bundles journaled as committed\n", jr->n);
  free(jr);
  print_message("crash test: %zu bundles after 5 kills\n", last);
  assert_true(last > 0);

  /* Accounting did not drift: delete everything, gc, and nothing is left. */
  kc_store *s = open_store(f->dir, 0, 0, 1);
  listing *l = list_model(s, CRASH_MODEL);
  while (l->n > 0) {
    for (size_t i = 0; i < l->n; i++)
      OK(kc_store_bundle_delete(s, l->keys[i], errbuf));
    listing_free(l);
    l = list_model(s, CRASH_MODEL);
  }
  listing_free(l);
  OK(kc_store_gc(s, (int64_t)time(NULL) + 100, errbuf));
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.bundles, 0);
  assert_int_equal(st.blobs, 0);
  assert_int_equal(st.bytes_used, 0);
  kc_store_close(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      ST(test_close_reopen),
      ST(test_reopen_smaller_map),
      ST(test_crash_sigkill),
  };
  return storetest_run("store_crash", tests, sizeof tests / sizeof tests[0]);
}
