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

int main(void) {
  const struct CMUnitTest tests[] = {
      ST(test_first_holder_keeps_name),
      ST(test_shared_name_and_purge),
      ST(test_index_built_for_old_store),
      ST(test_bad_names),
  };
  return storetest_run("store_models", tests, sizeof tests / sizeof tests[0]);
}
