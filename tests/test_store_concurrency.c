/* test_store_concurrency.c: store/ unit tests (kc_store.h) of
 * threads: concurrent readers during writes, concurrent writers,
 * a read handle moved between threads.
 * Fixtures and helpers: storetest.h. */
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "storetest.h"

/* ======================================================================= */
/* concurrent readers                                                       */

#define CC_PRE 32
#define CC_WRITES 150
#define CC_READERS 3

typedef struct cc_ctx {
  kc_store *s;
  char shared[KC_HEX_LEN + 1];
  char keys[CC_PRE + CC_WRITES][KC_HEX_LEN + 1];
  atomic_size_t published; /* keys[0..published) were committed */
  atomic_int done;
  atomic_size_t reads, found, errors;
  char why[512];
  pthread_mutex_t mu;
} cc_ctx;

static void cc_note(cc_ctx *c, const char *why) {
  pthread_mutex_lock(&c->mu);
  if (atomic_fetch_add(&c->errors, 1) == 0)
    snprintf(c->why, sizeof c->why, "%s", why);
  pthread_mutex_unlock(&c->mu);
}

/* Bundle i: a unique blob (seed 1000+i) plus the shared one. Deletable
 * (odd i < CC_PRE) bundles may vanish; others must stay once published. */
static int cc_put(cc_ctx *c, size_t i) {
  char d[2][KC_HEX_LEN + 1];
  uint64_t sz[2];
  sz[0] = 512 + (i % 13) * 300;
  sz[1] = 2048;
  uint8_t *p = malloc(sz[0]);
  if (!p)
    return -1;
  fill(p, sz[0], 1000 + i);
  kc_sha256_hex(p, sz[0], d[0]);
  strcpy(d[1], c->shared);
  int created;
  kc_err e = kc_store_blob_put(c->s, d[0], p, sz[0], &created, NULL);
  free(p);
  if (e != KC_OK)
    return -1;
  kc_manifest *m = kc_manifest_new();
  strcpy(m->fields.model, M1);
  strcpy(m->fields.build, B1);
  strcpy(m->fields.arch, "sm_90");
  m->fields.bucket.n = 1;
  strcpy(m->fields.bucket.dims[0].name, "seq");
  m->fields.bucket.dims[0].value = i;
  for (size_t k = 0; k < 2; k++) {
    char path[16];
    snprintf(path, sizeof path, "f%zu", k);
    if (kc_manifest_add_file(m, path, d[k], sz[k], KC_KIND_FILE, NULL, 0,
                             NULL) != KC_OK)
      return -1;
  }
  if (kc_manifest_seal(m, NULL) != KC_OK)
    return -1;
  e = kc_store_bundle_put(c->s, m, &created, NULL, NULL, NULL);
  strcpy(c->keys[i], m->key);
  kc_manifest_free(m);
  return e == KC_OK ? 0 : -1;
}

static void *cc_reader(void *arg) {
  cc_ctx *c = arg;
  unsigned rs = (unsigned)(uintptr_t)pthread_self();
  char why[512];
  while (!atomic_load(&c->done)) {
    size_t pub = atomic_load(&c->published);
    kc_store_read *r = NULL;
    if (kc_store_read_begin(c->s, &r) != KC_OK) {
      cc_note(c, "read_begin failed");
      break;
    }
    for (int q = 0; q < 8; q++) {
      size_t i = (size_t)rand_r(&rs) % pub;
      const char *json;
      size_t len;
      kc_err e = kc_store_bundle_get(r, c->keys[i], &json, &len);
      atomic_fetch_add(&c->reads, 1);
      int deletable = i < CC_PRE && (i % 2);
      if (e == KC_NOT_FOUND && deletable)
        continue;
      if (e != KC_OK) {
        snprintf(why, sizeof why, "bundle %zu (published) get: %s", i,
                 kc_err_name(e));
        cc_note(c, why);
        continue;
      }
      atomic_fetch_add(&c->found, 1);
      if (!bundle_blobs_ok(r, json, len, why, sizeof why))
        cc_note(c, why);
    }
    kc_store_read_end(r);
  }
  return NULL;
}

static void test_concurrent_readers(void **state) {
  fx *f = *state;
  cc_ctx *c = calloc(1, sizeof *c);
  assert_non_null(c);
  pthread_mutex_init(&c->mu, NULL);
  c->s = open_store(f->dir, 0, 0, 1);
  put_seed(c->s, 2048, 999, c->shared);
  for (size_t i = 0; i < CC_PRE; i++)
    assert_int_equal(cc_put(c, i), 0);
  atomic_store(&c->published, CC_PRE);
  pthread_t th[CC_READERS];
  for (int t = 0; t < CC_READERS; t++)
    assert_int_equal(pthread_create(&th[t], NULL, cc_reader, c), 0);
  /* The writer: new bundles, deletes of odd pre-made ones with gc (their
   * blobs really go), flushes of the readers' hits. */
  int wfail = 0;
  for (size_t i = CC_PRE; i < CC_PRE + CC_WRITES && !wfail; i++) {
    if (cc_put(c, i) != 0)
      wfail = 1;
    atomic_store(&c->published, i + 1);
    size_t del = (i - CC_PRE) * 2 + 1;
    if (del < CC_PRE) {
      if (kc_store_bundle_delete(c->s, c->keys[del], NULL) != KC_OK)
        wfail = 2;
      if (kc_store_gc(c->s, (int64_t)time(NULL) + 100, NULL) != KC_OK)
        wfail = 3;
    }
    if (i % 10 == 0 && kc_store_flush(c->s) != KC_OK)
      wfail = 4;
  }
  usleep(100000);
  atomic_store(&c->done, 1);
  for (int t = 0; t < CC_READERS; t++)
    pthread_join(th[t], NULL);
  print_message("concurrent: %zu reads, %zu found, %zu errors\n",
                atomic_load(&c->reads), atomic_load(&c->found),
                atomic_load(&c->errors));
  if (wfail)
    fail_msg("writer failed at step %d", wfail);
  if (atomic_load(&c->errors))
    fail_msg("%zu inconsistent reads; first: %s", atomic_load(&c->errors),
             c->why);
  assert_true(atomic_load(&c->found) > 100);
  kc_store_stats st = get_stats(c->s);
  assert_int_equal(st.bundles, CC_PRE + CC_WRITES - CC_PRE / 2);
  assert_int_equal(st.hits, atomic_load(&c->found));
  OK(kc_store_verify(c->s, errbuf));
  kc_store_close(c->s);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

/* Writers on several threads: puts, uploads and deletes serialize; the
 * counts and bytes agree at the end. */
#define CW_THREADS 3
#define CW_EACH 40

typedef struct cw_arg {
  kc_store *s;
  int t;
  int fail;
  char why[KC_ERRBUF_SIZE + 64];
} cw_arg;

static void *cw_main(void *p) {
  cw_arg *a = p;
  char e[KC_ERRBUF_SIZE];
  uint8_t *buf = malloc(8192);
  for (int i = 0; i < CW_EACH && !a->fail && buf; i++) {
    size_t n = 1000 + (size_t)(a->t * 37 + i * 101) % 7000;
    char hex[KC_HEX_LEN + 1];
    fill(buf, n, (uint64_t)(a->t * 1000 + i) + 300000);
    kc_sha256_hex(buf, n, hex);
    int created;
    kc_err rc;
    if (i % 2) {
      rc = kc_store_blob_put(a->s, hex, buf, n, &created, e);
    } else {
      kc_store_upload *u = NULL;
      rc = kc_store_upload_begin(a->s, &u, e);
      if (!rc)
        rc = kc_store_upload_write(u, buf, n, e);
      if (!rc)
        rc = kc_store_upload_commit(u, hex, &created, e);
      else
        kc_store_upload_abort(u);
    }
    if (!rc) {
      kc_manifest *m = kc_manifest_new();
      strcpy(m->fields.model, M2);
      strcpy(m->fields.build, B1);
      strcpy(m->fields.arch, "sm_100a");
      m->fields.bucket.n = 1;
      strcpy(m->fields.bucket.dims[0].name, "t");
      m->fields.bucket.dims[0].value = (uint64_t)(a->t * 1000 + i);
      rc =
          kc_manifest_add_file(m, "x.cubin", hex, n, KC_KIND_CUBIN, NULL, 0, e);
      if (!rc)
        rc = kc_manifest_seal(m, e);
      if (!rc)
        rc = kc_store_bundle_put(a->s, m, &created, NULL, NULL, e);
      /* Every fourth one is deleted again. */
      if (!rc && i % 4 == 3)
        rc = kc_store_bundle_delete(a->s, m->key, e);
      kc_manifest_free(m);
    }
    if (rc) {
      a->fail = 1;
      snprintf(a->why, sizeof a->why, "thread %d step %d: %s (%s)", a->t, i,
               kc_err_name(rc), e);
    }
  }
  free(buf);
  return NULL;
}

static void test_concurrent_writers(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 3600);
  pthread_t th[CW_THREADS];
  cw_arg args[CW_THREADS];
  memset(args, 0, sizeof args);
  for (int t = 0; t < CW_THREADS; t++) {
    args[t].s = s;
    args[t].t = t;
    assert_int_equal(pthread_create(&th[t], NULL, cw_main, &args[t]), 0);
  }
  for (int t = 0; t < CW_THREADS; t++)
    pthread_join(th[t], NULL);
  for (int t = 0; t < CW_THREADS; t++)
    if (args[t].fail)
      fail_msg("%s", args[t].why);
  uint64_t bytes = 0;
  for (int t = 0; t < CW_THREADS; t++)
    for (int i = 0; i < CW_EACH; i++)
      bytes += 1000 + (uint64_t)(t * 37 + i * 101) % 7000;
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.bundles, CW_THREADS * CW_EACH * 3 / 4);
  assert_int_equal(st.blobs, CW_THREADS * CW_EACH);
  assert_int_equal(blob_bytes(s), bytes);
  listing *l = list_model(s, M2);
  assert_int_equal(l->n, CW_THREADS * CW_EACH * 3 / 4);
  listing_free(l);
  OK(kc_store_verify(s, errbuf));
  /* The deleted bundles' blobs are orphans: gc takes exactly those. */
  OK(kc_store_gc(s, (int64_t)time(NULL) + 3601, errbuf));
  st = get_stats(s);
  assert_int_equal(st.gc_blobs, CW_THREADS * CW_EACH / 4);
  assert_int_equal(st.blobs, CW_THREADS * CW_EACH * 3 / 4);
  kc_store_close(s);
}

/* A read handle begun on one thread and used on another (MDB_NOTLS). */
typedef struct handoff {
  kc_store_read *r;
  const char *key;
  kc_err e;
  size_t len;
} handoff;

static void *handoff_main(void *arg) {
  handoff *h = arg;
  const char *json;
  h->e = kc_store_bundle_get(h->r, h->key, &json, &h->len);
  return NULL;
}

static void test_read_handle_moves_threads(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  kc_manifest *m = bundle_with_blob(s, M1, 1, 100, 140, NULL, 0, NULL);
  char *want = manifest_json(m);
  handoff h = {NULL, m->key, KC_INTERNAL, 0};
  OK(kc_store_read_begin(s, &h.r));
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, handoff_main, &h), 0);
  pthread_join(t, NULL);
  assert_int_equal(h.e, KC_OK);
  assert_int_equal(h.len, strlen(want));
  /* Meanwhile a write commits; the open read still works. */
  kc_manifest *m2 = bundle_with_blob(s, M1, 2, 100, 141, NULL, 0, NULL);
  const char *json;
  size_t len;
  OK(kc_store_bundle_get(h.r, m->key, &json, &len));
  /* Snapshot: a bundle committed after the read began is not visible. */
  EXPECT(kc_store_bundle_get(h.r, m2->key, &json, &len), KC_NOT_FOUND);
  kc_store_read_end(h.r);
  expect_bundle_json(s, m->key, want);
  free(want);
  kc_manifest_free(m);
  kc_manifest_free(m2);
  kc_store_close(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      ST(test_concurrent_readers),
      ST(test_concurrent_writers),
      ST(test_read_handle_moves_threads),
  };
  return storetest_run("store_concurrency", tests,
                       sizeof tests / sizeof tests[0]);
}
