/* test_store_models.c: store/ unit tests of warmup manifests' names
 * (store/models.c): a name stays with the first model that stored it
 * (KC_CONFLICT for a rename or a taken name without KC_WARMUP_RENAME), an
 * admin's shared name held by both, a purge freeing its own model's hold
 * only, and a store written before the name index (built at open). Links
 * LMDB to make a store as an older version left it. Fixtures: storetest.h. */
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storetest.h"

/* mdb_del, linked with --wrap: the next del_full calls say MDB_MAP_FULL
 * (a map too full for the pages a delete copies). */
int __real_mdb_del(MDB_txn *txn, MDB_dbi dbi, MDB_val *key, MDB_val *data);
int __wrap_mdb_del(MDB_txn *txn, MDB_dbi dbi, MDB_val *key, MDB_val *data);
static int del_full;
int __wrap_mdb_del(MDB_txn *txn, MDB_dbi dbi, MDB_val *key, MDB_val *data) {
  if (del_full > 0) {
    del_full--;
    return MDB_MAP_FULL;
  }
  return __real_mdb_del(txn, dbi, key, data);
}

/* mdb_put, the same way (put_full). */
int __real_mdb_put(MDB_txn *txn, MDB_dbi dbi, MDB_val *key, MDB_val *data,
                   unsigned flags);
int __wrap_mdb_put(MDB_txn *txn, MDB_dbi dbi, MDB_val *key, MDB_val *data,
                   unsigned flags);
static int put_full;
int __wrap_mdb_put(MDB_txn *txn, MDB_dbi dbi, MDB_val *key, MDB_val *data,
                   unsigned flags) {
  if (put_full > 0) {
    put_full--;
    return MDB_MAP_FULL;
  }
  return __real_mdb_put(txn, dbi, key, data, flags);
}

#define M3 "3333333333333333333333333333333333333333333333333333333333333333"
#define M4 "4444444444444444444444444444444444444444444444444444444444444444"

static kc_store *open_m(const char *dir) {
  kc_store_opts o;
  memset(&o, 0, sizeof o);
  o.dir = dir;
  o.map_size = 64u << 20;
  kc_store *s = NULL;
  OK(kc_store_open(&o, &s, errbuf));
  return s;
}

/* Puts model's manifest named name; what the store answered. errbuf holds
 * its message. */
static kc_err put_named(kc_store *s, const char *model, const char *name,
                        int flags) {
  char json[1024];
  snprintf(json, sizeof json,
           "{\"version\":1,\"model\":{\"name\":\"%s\",\"hash\":\"%s\"},"
           "\"kernels\":[]}",
           name, model);
  errbuf[0] = '\0';
  return kc_store_warmup_put(s, model, name, json, strlen(json), flags, NULL,
                             errbuf);
}

static void purge(kc_store *s, const char *model) {
  size_t removed;
  OK(kc_store_model_purge(s, model, &removed, errbuf));
}

/* First come, first named: another model may not take the name, the
 * holder may not rename itself, and either may put its manifest again. */
static void test_first_holder_keeps_name(void **state) {
  fx *f = *state;
  kc_store *s = open_m(f->dir);
  assert_int_equal(put_named(s, M1, "llm", 0), KC_OK);
  assert_int_equal(put_named(s, M1, "llm", 0), KC_OK); /* replaced */
  assert_int_equal(put_named(s, M2, "llm", 0), KC_CONFLICT);
  assert_non_null(strstr(errbuf, M1)); /* names the holder */
  assert_int_equal(put_named(s, M1, "other", 0), KC_CONFLICT);
  assert_non_null(strstr(errbuf, "renaming"));
  assert_int_equal(put_named(s, M2, "vision", 0), KC_OK);
  assert_int_equal(put_named(s, M2, "vision", 0), KC_OK);
  /* an admin rename frees the old name and holds the new one */
  assert_int_equal(put_named(s, M1, "llm2", KC_WARMUP_RENAME), KC_OK);
  assert_int_equal(put_named(s, M3, "llm", 0), KC_OK);
  assert_int_equal(put_named(s, M4, "llm2", 0), KC_CONFLICT);
  assert_non_null(strstr(errbuf, M1));
  assert_int_equal(put_named(s, M2, "llm2", 0), KC_CONFLICT); /* a rename */
  assert_non_null(strstr(errbuf, "renaming"));
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
  /* the same after a reopen */
  s = open_m(f->dir);
  assert_int_equal(put_named(s, M4, "llm2", 0), KC_CONFLICT);
  assert_int_equal(put_named(s, M1, "llm2", 0), KC_OK);
  kc_store_close(s);
}

/* An admin may share a name: both models then hold it, and neither may put
 * under it without admin while the other holds it. A purge drops its own
 * model's hold only: the other keeps the name. */
static void test_shared_name_and_purge(void **state) {
  fx *f = *state;
  kc_store *s = open_m(f->dir);
  assert_int_equal(put_named(s, M1, "llm", 0), KC_OK);
  assert_int_equal(put_named(s, M2, "llm", KC_WARMUP_RENAME), KC_OK);
  assert_int_equal(put_named(s, M1, "llm", 0), KC_CONFLICT);
  assert_non_null(strstr(errbuf, M2));
  assert_int_equal(put_named(s, M2, "llm", 0), KC_CONFLICT);
  assert_non_null(strstr(errbuf, M1));
  purge(s, M2);
  /* M1 still holds it: a third model may not take it */
  assert_int_equal(put_named(s, M3, "llm", 0), KC_CONFLICT);
  assert_non_null(strstr(errbuf, M1));
  assert_int_equal(put_named(s, M1, "llm", 0), KC_OK);
  purge(s, M1);
  assert_int_equal(put_named(s, M3, "llm", 0), KC_OK);
  /* a purged model's name is free to anyone, itself included */
  assert_int_equal(put_named(s, M1, "vision", 0), KC_OK);
  purge(s, M1);
  assert_int_equal(put_named(s, M2, "vision", 0), KC_OK);
  kc_store_close(s);
}

/* A store as a version before the name index left it: no "warmnames"
 * database and no "warmnames_built" flag in meta. */
static void drop_index(const char *dir) {
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi names, meta;
  assert_int_equal(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, 32);
  assert_int_equal(mdb_env_open(env, dir, 0, 0640), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
  assert_int_equal(
      mdb_dbi_open(txn, "warmnames", MDB_DUPSORT | MDB_DUPFIXED, &names), 0);
  assert_int_equal(mdb_drop(txn, names, 1), 0);
  assert_int_equal(mdb_dbi_open(txn, "meta", 0, &meta), 0);
  MDB_val flag = {16, "warmnames_built"};
  int rc = mdb_del(txn, meta, &flag, NULL);
  assert_true(rc == 0 || rc == MDB_NOTFOUND);
  assert_int_equal(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
}

/* Opening such a store builds the index from the stored manifests, once:
 * a put under another model's name is still refused, a shared name still
 * held by both. */
static void test_index_built_for_old_store(void **state) {
  fx *f = *state;
  kc_store *s = open_m(f->dir);
  assert_int_equal(put_named(s, M1, "llm", 0), KC_OK);
  assert_int_equal(put_named(s, M2, "vision", 0), KC_OK);
  assert_int_equal(put_named(s, M3, "vision", KC_WARMUP_RENAME), KC_OK);
  kc_store_close(s);
  drop_index(f->dir);
  s = open_m(f->dir);
  assert_int_equal(put_named(s, M3, "llm", KC_WARMUP_RENAME), KC_OK);
  kc_store_close(s);
  drop_index(f->dir);
  s = open_m(f->dir);
  /* a model with no manifest yet may not take a held name */
  assert_int_equal(put_named(s, M4, "llm", 0), KC_CONFLICT);
  assert_non_null(strstr(errbuf, M3)); /* of M1 and M3, the first */
  assert_int_equal(put_named(s, M1, "x", 0), KC_CONFLICT); /* a rename */
  assert_int_equal(put_named(s, M2, "vision", 0), KC_OK);  /* M3 let go */
  purge(s, M1);
  assert_int_equal(put_named(s, M2, "llm", KC_WARMUP_RENAME), KC_OK);
  purge(s, M3);
  assert_int_equal(put_named(s, M1, "llm", 0), KC_CONFLICT);
  assert_non_null(strstr(errbuf, M2));
  kc_store_close(s);
}

/* Names the index cannot key are refused before anything is stored. */
static void test_bad_names(void **state) {
  fx *f = *state;
  kc_store *s = open_m(f->dir);
  assert_int_equal(put_named(s, M1, "", 0), KC_BAD_WARMUP);
  char big[600];
  memset(big, 'n', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  assert_int_equal(put_named(s, M1, big, 0), KC_BAD_WARMUP);
  char *json = NULL;
  size_t len;
  EXPECT(kc_store_warmup_get(s, M1, &json, &len, errbuf), KC_NOT_FOUND);
  kc_store_close(s);
}

/* Plants the pair (name, model) in the name index, as an older binary's
 * purge or rename could leave it: no manifest of model says name. */
static void plant_pair(const char *dir, const char *name, const char *model) {
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi names;
  assert_int_equal(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, 32);
  assert_int_equal(mdb_env_open(env, dir, 0, 0640), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
  assert_int_equal(
      mdb_dbi_open(txn, "warmnames", MDB_DUPSORT | MDB_DUPFIXED, &names), 0);
  MDB_val k = {strlen(name), (void *)name}, v = {64, (void *)model};
  assert_int_equal(mdb_put(txn, names, &k, &v, 0), 0);
  assert_int_equal(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
}

/* How many models the name index lists under name. */
static size_t pairs_of(const char *dir, const char *name) {
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi names;
  MDB_cursor *cur;
  assert_int_equal(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, 32);
  assert_int_equal(mdb_env_open(env, dir, 0, 0640), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
  assert_int_equal(mdb_dbi_open(txn, "warmnames", 0, &names), 0);
  assert_int_equal(mdb_cursor_open(txn, names, &cur), 0);
  MDB_val k = {strlen(name), (void *)name}, v;
  size_t n = 0;
  if (mdb_cursor_get(cur, &k, &v, MDB_SET_KEY) == 0 &&
      mdb_cursor_count(cur, &n) != 0)
    n = 0;
  mdb_cursor_close(cur);
  mdb_txn_abort(txn);
  mdb_env_close(env);
  return n;
}

/* The index repairs itself: a pair whose model has no manifest, or one of
 * another name, holds nothing; the put that finds it drops it, and the
 * name goes to the model that puts it. */
static void test_stale_pair_ignored(void **state) {
  fx *f = *state;
  kc_store *s = open_m(f->dir);
  assert_int_equal(put_named(s, M1, "vision", 0), KC_OK);
  kc_store_close(s);
  plant_pair(f->dir, "llm", M3); /* M3: no manifest */
  plant_pair(f->dir, "llm", M1); /* M1's manifest says "vision" */
  assert_int_equal(pairs_of(f->dir, "llm"), 2);
  s = open_m(f->dir);
  assert_int_equal(put_named(s, M2, "llm", 0), KC_OK);
  kc_store_close(s);
  assert_int_equal(pairs_of(f->dir, "llm"), 1); /* M2's: the stale dropped */
  s = open_m(f->dir);
  /* M2 holds it now, and nothing else does */
  assert_int_equal(put_named(s, M4, "llm", 0), KC_CONFLICT);
  assert_non_null(strstr(errbuf, M2));
  purge(s, M2);
  assert_int_equal(put_named(s, M4, "llm", 0), KC_OK);
  assert_int_equal(put_named(s, M1, "vision", 0), KC_OK);
  kc_store_close(s);
}

/* A purge whose name delete finds the map full is a full map as any other
 * write's: the store evicts and tries again, and the purge succeeds. */
static void test_purge_name_map_full(void **state) {
  fx *f = *state;
  kc_store *s = open_m(f->dir);
  assert_int_equal(put_named(s, M1, "llm", 0), KC_OK);
  del_full = 1; /* the purge's first delete: its name's */
  size_t removed = 1;
  kc_err e = kc_store_model_purge(s, M1, &removed, errbuf);
  del_full = 0;
  if (e)
    fail_msg("purge: %s (%s)", kc_err_name(e), errbuf);
  assert_int_equal(removed, 0);
  char *json = NULL;
  size_t len;
  EXPECT(kc_store_warmup_get(s, M1, &json, &len, errbuf), KC_NOT_FOUND);
  assert_int_equal(put_named(s, M2, "llm", 0), KC_OK); /* the name is free */
  kc_store_close(s);
}

/* A store from before the index whose map is too full to build it at open
 * (its first put says so) opens anyway without it, says why, and the name
 * rule holds by reading the manifests; the next open builds the index. */
static void test_open_full_map_without_index(void **state) {
  fx *f = *state;
  kc_store *s = open_m(f->dir);
  assert_int_equal(put_named(s, M1, "llm", 0), KC_OK);
  assert_int_equal(put_named(s, M2, "vision", 0), KC_OK);
  kc_store_close(s);
  drop_index(f->dir);
  kc_store_opts o;
  memset(&o, 0, sizeof o);
  o.dir = f->dir;
  o.map_size = 64u << 20;
  put_full = 1; /* the build's first name */
  errbuf[0] = '\0';
  kc_err e = kc_store_open(&o, &s, errbuf);
  put_full = 0;
  if (e)
    fail_msg("open: %s (%s)", kc_err_name(e), errbuf);
  print_message("%s\n", kc_store_names_unindexed(s));
  assert_non_null(strstr(kc_store_names_unindexed(s), "too full"));
  assert_int_equal(put_named(s, M4, "llm", 0), KC_CONFLICT);
  assert_non_null(strstr(errbuf, M1));
  assert_int_equal(put_named(s, M1, "x", 0), KC_CONFLICT); /* a rename */
  assert_int_equal(put_named(s, M3, "free", 0), KC_OK);
  kc_store_close(s);
  s = open_m(f->dir); /* built now */
  assert_string_equal(kc_store_names_unindexed(s), "");
  assert_int_equal(put_named(s, M4, "vision", 0), KC_CONFLICT);
  assert_non_null(strstr(errbuf, M2));
  kc_store_close(s);
}

/* ---- warmup manifests' bytes ---- */

#define MiB (1024u * 1024u)

/* model's manifest named name, padded to size bytes. */
static kc_err put_sized(kc_store *s, const char *model, const char *name,
                        size_t size) {
  char *json = malloc(size + 1);
  assert_non_null(json);
  int n = snprintf(json, size + 1,
                   "{\"version\":1,\"model\":{\"name\":\"%s\",\"hash\":\"%s\"},"
                   "\"kernels\":[],\"pad\":\"",
                   name, model);
  assert_true(n > 0 && (size_t)n + 2 <= size);
  memset(json + n, 'p', size - (size_t)n - 2);
  memcpy(json + size - 2, "\"}", 2);
  json[size] = '\0';
  errbuf[0] = '\0';
  kc_err e = kc_store_warmup_put(s, model, name, json, size, 0, NULL, errbuf);
  free(json);
  return e;
}

static void model_hex(unsigned i, char out[KC_HEX_LEN + 1]) {
  snprintf(out, KC_HEX_LEN + 1, "%064x", i + 0x1000);
}

static int warmup_held(kc_store *s, const char *model) {
  char *json = NULL;
  size_t len = 0;
  kc_err e = kc_store_warmup_get(s, model, &json, &len, errbuf);
  free(json);
  return e == KC_OK;
}

/* Manifests count in bytes_used; a replace counts the difference and a
 * purge gives them back. They were not counted at all, so that any number
 * of them filled the map (every write then failed) while bytes_used stayed
 * far below --max-bytes. */
static void test_warmup_bytes_counted(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 8 * MiB, 64 * MiB, 0);
  uint64_t base = get_stats(s).bytes_used;
  OK(put_sized(s, M1, "one", 10000));
  assert_int_equal(get_stats(s).bytes_used, base + 10000);
  OK(put_sized(s, M1, "one", 4000));
  assert_int_equal(get_stats(s).bytes_used, base + 4000);
  OK(put_sized(s, M2, "two", 3000));
  assert_int_equal(get_stats(s).bytes_used, base + 7000);
  purge(s, M1);
  assert_int_equal(get_stats(s).bytes_used, base + 3000);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
  s = open_store(f->dir, 8 * MiB, 64 * MiB, 0);
  assert_int_equal(get_stats(s).bytes_used, base + 3000);
  kc_store_close(s);
}

/* A store from before the count: its manifests are counted once, at open. */
static void test_warmup_bytes_counted_once(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 64 * MiB, 0);
  OK(put_sized(s, M1, "one", 5000));
  OK(put_sized(s, M2, "two", 7000));
  uint64_t used = get_stats(s).bytes_used;
  kc_store_close(s);
  MDB_env *env; /* as the version before the count left it */
  MDB_txn *txn;
  MDB_dbi meta;
  assert_int_equal(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, 32);
  assert_int_equal(mdb_env_open(env, f->dir, 0, 0640), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
  assert_int_equal(mdb_dbi_open(txn, "meta", 0, &meta), 0);
  uint64_t old = used - 12000;
  MDB_val bk = {10, "bytes_used"}, bv = {sizeof old, &old};
  MDB_val flag = {15, "warmups_counted"}, wb = {12, "warmup_bytes"};
  assert_int_equal(mdb_put(txn, meta, &bk, &bv, 0), 0);
  assert_int_equal(mdb_del(txn, meta, &flag, NULL), 0);
  assert_int_equal(mdb_del(txn, meta, &wb, NULL), 0);
  assert_int_equal(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
  for (int i = 0; i < 2; i++) { /* counted at the first open only */
    s = open_store(f->dir, 0, 64 * MiB, 0);
    assert_int_equal(get_stats(s).bytes_used, used);
    OK(kc_store_verify(s, errbuf));
    kc_store_close(s);
  }
}

/* Together they take at most 1/8 of max_bytes: a put past that drops the
 * manifests of models without bundles (never one with), and is refused
 * when those are not enough; eviction takes such manifests last. 278
 * manifests of 1.25 MB under 64M used to fill the map. */
static void test_warmup_share(void **state) {
  fx *f = *state;
  const uint64_t limit = 8 * MiB, share = limit / 8;
  kc_store *s = open_store(f->dir, limit, 64 * MiB, 0);
  kc_manifest *m = bundle_with_blob(s, M1, 1, 4096, 7, NULL, 0, NULL);
  kc_manifest_free(m);
  OK(put_sized(s, M1, "kept", 400 * 1024)); /* a model with a bundle */
  char model[KC_HEX_LEN + 1], name[32];
  for (unsigned i = 0; i < 60; i++) { /* 12 MiB of them */
    model_hex(i, model);
    snprintf(name, sizeof name, "flood%u", i);
    OK(put_sized(s, model, name, 200 * 1024));
  }
  kc_store_stats st = get_stats(s);
  print_message("60 manifests of 200 KiB: %llu bytes used, map %llu\n",
                (unsigned long long)st.bytes_used,
                (unsigned long long)st.map_used);
  assert_true(st.bytes_used <= 4096 + share);
  assert_true(warmup_held(s, M1));
  model_hex(59, model);
  assert_true(warmup_held(s, model)); /* the last put */
  model_hex(0, model);
  assert_false(warmup_held(s, model)); /* dropped for it */
  /* past the share with only M1's left to drop: refused */
  m = bundle_with_blob(s, M2, 1, 4096, 8, NULL, 0, NULL);
  kc_manifest_free(m);
  EXPECT(put_sized(s, M2, "big", 700 * 1024), KC_STORE_FULL);
  assert_non_null(strstr(errbuf, "share"));
  assert_true(warmup_held(s, M1));
  OK(kc_store_verify(s, errbuf));
  /* eviction: bundles first, then the manifests of models without them */
  OK(kc_store_evict(s, 0, errbuf));
  assert_false(warmup_held(s, M1));
  model_hex(59, model);
  assert_false(warmup_held(s, model));
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      ST(test_first_holder_keeps_name),     ST(test_shared_name_and_purge),
      ST(test_index_built_for_old_store),   ST(test_bad_names),
      ST(test_stale_pair_ignored),          ST(test_purge_name_map_full),
      ST(test_open_full_map_without_index), ST(test_warmup_bytes_counted),
      ST(test_warmup_bytes_counted_once),   ST(test_warmup_share),
  };
  return storetest_run("store_models", tests, sizeof tests / sizeof tests[0]);
}
