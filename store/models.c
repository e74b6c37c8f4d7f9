/* models.c: the store's view by model: every model with its figures (the
 * `models` index merged with `warmups`), warmup manifests (what a model wants
 * warm, so that its coverage can be told), and purging a model's bundles in
 * bounded write transactions. */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "store_internal.h"

/* ---- listing ---- */

typedef struct walk {
  kc_store *s;
  MDB_txn *txn;
  MDB_cursor *idx, *wu; /* models index, warmups */
  MDB_val ik, iv, wk, wv;
  int irc, wrc; /* 0: positioned on an entry */
} walk;

static int idx_ok(const walk *w) {
  return w->irc == 0 && w->ik.mv_size == 2 * KC_HEX_LEN;
}

static int wu_ok(const walk *w) {
  return w->wrc == 0 && w->wk.mv_size == KC_HEX_LEN;
}

/* Positions both cursors on the first entry after model `after` (NULL: on
 * the first entry). */
static void walk_seek(walk *w, const char *after) {
  if (!after) {
    w->irc = mdb_cursor_get(w->idx, &w->ik, &w->iv, MDB_FIRST);
    w->wrc = mdb_cursor_get(w->wu, &w->wk, &w->wv, MDB_FIRST);
    return;
  }
  w->ik = (MDB_val){KC_HEX_LEN, (void *)after};
  w->irc = mdb_cursor_get(w->idx, &w->ik, &w->iv, MDB_SET_RANGE);
  while (idx_ok(w) && memcmp(w->ik.mv_data, after, KC_HEX_LEN) <= 0)
    w->irc = mdb_cursor_get(w->idx, &w->ik, &w->iv, MDB_NEXT);
  w->wk = (MDB_val){KC_HEX_LEN, (void *)after};
  w->wrc = mdb_cursor_get(w->wu, &w->wk, &w->wv, MDB_SET_RANGE);
  while (wu_ok(w) && memcmp(w->wk.mv_data, after, KC_HEX_LEN) <= 0)
    w->wrc = mdb_cursor_get(w->wu, &w->wk, &w->wv, MDB_NEXT);
}

/* Adds one bundle's metadata (key: the index entry's second half). */
static void add_bundle(walk *w, kc_store_model_info *m) {
  MDB_val k = {KC_HEX_LEN, (char *)w->ik.mv_data + KC_HEX_LEN}, v;
  if (mdb_get(w->txn, w->s->bundlemeta, &k, &v) ||
      v.mv_size != sizeof(kcs_bundle_meta))
    return;
  kcs_bundle_meta bm;
  memcpy(&bm, v.mv_data, sizeof bm);
  m->bundles++;
  m->bytes += bm.bytes;
  m->hits += bm.hits;
  if (bm.last_used > m->last_used)
    m->last_used = bm.last_used;
}

/* The next model of the merged walk into *m; 0 when there is none. */
static int walk_next(walk *w, kc_store_model_info *m) {
  memset(m, 0, sizeof *m);
  int hi = idx_ok(w), hw = wu_ok(w);
  if (!hi && !hw)
    return 0;
  const char *id;
  if (hi && hw)
    id = memcmp(w->ik.mv_data, w->wk.mv_data, KC_HEX_LEN) <= 0 ? w->ik.mv_data
                                                               : w->wk.mv_data;
  else
    id = hi ? w->ik.mv_data : w->wk.mv_data;
  memcpy(m->model, id, KC_HEX_LEN);
  m->model[KC_HEX_LEN] = '\0';
  if (hw && memcmp(w->wk.mv_data, m->model, KC_HEX_LEN) == 0) {
    m->warmup = w->wv.mv_data;
    m->warmup_len = w->wv.mv_size;
    w->wrc = mdb_cursor_get(w->wu, &w->wk, &w->wv, MDB_NEXT);
  }
  while (idx_ok(w) && memcmp(w->ik.mv_data, m->model, KC_HEX_LEN) == 0) {
    add_bundle(w, m);
    w->irc = mdb_cursor_get(w->idx, &w->ik, &w->iv, MDB_NEXT);
  }
  return 1;
}

kc_err kc_store_models_list(kc_store *s, const char *after, size_t limit,
                            kc_store_model_cb cb, void *ud,
                            char next[KC_HEX_LEN + 1], char *err) {
  next[0] = '\0';
  if (after && !*after)
    after = NULL;
  if (after && !kc_is_hex64(after))
    return kc_errf(err, KC_EINVAL, "cursor: must be a model (64 hex digits)");
  kc_store_read *r;
  kc_err e = kc_store_read_begin(s, &r);
  if (e)
    return kc_errf(err, e, "cannot begin a read of the store");
  walk w = {.s = s, .txn = r->txn};
  int rc = mdb_cursor_open(r->txn, s->models, &w.idx);
  if (!rc && (rc = mdb_cursor_open(r->txn, s->warmups, &w.wu)))
    mdb_cursor_close(w.idx);
  if (rc) {
    kc_store_read_end(r);
    return kcs_mdb_err(rc, "listing models", err);
  }
  walk_seek(&w, after);
  kc_store_model_info m;
  size_t n = 0;
  int stopped = 0;
  while (n < limit && !stopped && walk_next(&w, &m)) {
    n++;
    memcpy(next, m.model, KC_HEX_LEN + 1);
    stopped = cb(&m, ud);
  }
  if (!stopped && !idx_ok(&w) && !wu_ok(&w))
    next[0] = '\0'; /* the walk reached the end */
  mdb_cursor_close(w.wu);
  mdb_cursor_close(w.idx);
  kc_store_read_end(r);
  return KC_OK;
}

/* ---- warmup manifests ---- */

typedef struct wu_put {
  const char *model, *name, *json;
  size_t len;
  int flags;
  const char *archs; /* "a,b": the archs this warm runs for; NULL none */
} wu_put;

/* The model.name of a stored warmup manifest (validated when it was put):
 * malloc'd, NULL when it has none or cannot be read. */
static char *stored_name(const MDB_val *v) {
  json_t *j = json_loadb(v->mv_data, v->mv_size, 0, NULL);
  const char *n =
      json_string_value(json_object_get(json_object_get(j, "model"), "name"));
  char *out = n ? strdup(n) : NULL;
  json_decref(j);
  return out;
}

/* ---- their bytes ----
 * A manifest counts in bytes_used (toward max_bytes) like a bundle's, and
 * all of them together may take at most 1/KCS_WARMUP_SHARE of the limit
 * (meta "warmup_bytes": their sum). A put past that share first drops the
 * manifests of models without bundles (hex order; never the model put),
 * and is refused KC_STORE_FULL when those are not enough. Eviction takes
 * such manifests too, after everything else (kcs_warmup_evict_one). */

static MDB_val wbytes_name(void) {
  MDB_val k = {12, (void *)"warmup_bytes"};
  return k;
}

static uint64_t wbytes_get(kc_store *s, MDB_txn *txn) {
  MDB_val k = wbytes_name(), v;
  uint64_t n = 0;
  if (mdb_get(txn, s->meta, &k, &v) == 0 && v.mv_size == sizeof n)
    memcpy(&n, v.mv_data, sizeof n);
  return n;
}

/* Adds delta to warmup_bytes and to bytes_used. */
static kc_err wbytes_add(kc_store *s, MDB_txn *txn, int64_t delta, char *err) {
  uint64_t n = wbytes_get(s, txn);
  n = delta < 0 && (uint64_t)-delta > n ? 0 : n + (uint64_t)delta;
  MDB_val k = wbytes_name(), v = {sizeof n, &n};
  kc_err e = kcs_put(txn, s->meta, &k, &v, 0, err);
  return e ? e : kcs_bytes_add(txn, s, delta, err);
}

kc_err kcs_warmup_sum(kc_store *s, MDB_txn *txn, uint64_t *sum, char *err) {
  return kcs_value_bytes(txn, s->warmups, "counting the warmup manifests", sum,
                         err);
}

kc_err kcs_warmup_bytes(kc_store *s, MDB_txn *txn, uint64_t *sum, char *err) {
  kc_err e = kcs_warmup_sum(s, txn, sum, err);
  MDB_val k = wbytes_name(), v = {sizeof *sum, sum};
  return e ? e : kcs_put(txn, s->meta, &k, &v, 0, err);
}

static uint64_t warmup_cap(const kc_store *s) {
  return (s->max_bytes ? s->max_bytes : s->map_size) / KCS_WARMUP_SHARE;
}

/* Whether the models index holds a bundle of model. */
static int has_bundles(kc_store *s, MDB_txn *txn, const char *model) {
  MDB_cursor *cur;
  if (mdb_cursor_open(txn, s->models, &cur))
    return 1; /* cannot tell: kept */
  MDB_val k = {KC_HEX_LEN, (void *)model}, v;
  int rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
  int has = rc == 0 && k.mv_size == 2 * KC_HEX_LEN &&
            memcmp(k.mv_data, model, KC_HEX_LEN) == 0;
  mdb_cursor_close(cur);
  return has;
}

/* The first model (hex order) with a manifest and no bundle, other than
 * keep (NULL: any), into out; 0 when there is none. */
static int bundleless(kc_store *s, MDB_txn *txn, const char *keep,
                      char out[KC_HEX_LEN + 1]) {
  MDB_cursor *cur;
  if (mdb_cursor_open(txn, s->warmups, &cur))
    return 0;
  MDB_val k, v;
  int found = 0;
  for (int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0 && !found;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    if (k.mv_size != KC_HEX_LEN ||
        (keep && memcmp(k.mv_data, keep, KC_HEX_LEN) == 0))
      continue;
    memcpy(out, k.mv_data, KC_HEX_LEN);
    out[KC_HEX_LEN] = '\0';
    found = !has_bundles(s, txn, out);
  }
  mdb_cursor_close(cur);
  return found;
}

static kc_err name_del(kc_store *s, MDB_txn *txn, const char *name,
                       const char *model, char *err);

/* Drops model's manifest, its name's entry and its warms' archs. */
static kc_err warmup_drop(kc_store *s, MDB_txn *txn, const char *model,
                          char *err) {
  MDB_val mk = kcs_hex_val(model), mv;
  if (mdb_get(txn, s->warmups, &mk, &mv) != 0)
    return kcs_del(txn, s->warmarchs, &mk, err);
  int64_t size = (int64_t)mv.mv_size;
  /* its name's entry goes, not another holder's of the same name */
  char *name = stored_name(&mv);
  kc_err e = name ? name_del(s, txn, name, model, err) : KC_OK;
  free(name);
  if (!e)
    e = kcs_del(txn, s->warmups, &mk, err);
  if (!e)
    e = kcs_del(txn, s->warmarchs, &mk, err);
  return e ? e : wbytes_add(s, txn, -size, err);
}

int kcs_warmup_evict_one(kc_store *s, MDB_txn *txn, kc_err *e, char *err) {
  char model[KC_HEX_LEN + 1];
  if (!bundleless(s, txn, NULL, model))
    return 0;
  *e = warmup_drop(s, txn, model, err);
  return *e ? -1 : 1;
}

/* Room for delta more manifest bytes within the share (see above). */
static kc_err warmup_room(kc_store *s, MDB_txn *txn, const char *model,
                          int64_t delta, char *err) {
  uint64_t cap = warmup_cap(s);
  char victim[KC_HEX_LEN + 1];
  while (delta > 0 && wbytes_get(s, txn) + (uint64_t)delta > cap) {
    if (!bundleless(s, txn, model, victim))
      return kc_errf(err, KC_STORE_FULL,
                     "warmup manifests would take more than their "
                     "share of the store (%llu bytes, 1/%d of its limit), "
                     "and every other one is of a model with bundles",
                     (unsigned long long)cap, KCS_WARMUP_SHARE);
    kc_err e = warmup_drop(s, txn, victim, err);
    if (e)
      return e;
  }
  return KC_OK;
}

/* ---- the name index ----
 * warmnames: model.name -> the models whose stored manifest has that name
 * (DUPSORT, 64-hex values), kept in the transaction that puts or purges the
 * manifest. Usually one model a name; an admin put (KC_WARMUP_RENAME) may
 * share a name, and then each holder sees the others. */

/* A name as a key: 1 to KCS_WARMNAME_MAX bytes (the schema allows 255). */
static int name_key(const char *name, MDB_val *k) {
  size_t n = strlen(name);
  *k = (MDB_val){n, (void *)name};
  return n >= 1 && n <= KCS_WARMNAME_MAX;
}

static kc_err name_add(kc_store *s, MDB_txn *txn, const char *name,
                       const char *model, char *err) {
  MDB_val k, v = {KC_HEX_LEN, (void *)model};
  if (!name_key(name, &k))
    return KC_OK; /* never a key: checked by kc_store_warmup_put */
  int rc = mdb_put(txn, s->warmnames, &k, &v, MDB_NODUPDATA);
  if (rc == MDB_KEYEXIST)
    rc = 0;
  if (rc == MDB_MAP_FULL)
    return KCS_MAP_FULL; /* kcs_write evicts and tries again */
  return rc ? kcs_mdb_err(rc, "indexing a model's name", err) : KC_OK;
}

/* Drops the pair (name, model) only: another holder of the name keeps it. */
static kc_err name_del(kc_store *s, MDB_txn *txn, const char *name,
                       const char *model, char *err) {
  MDB_val k, v = {KC_HEX_LEN, (void *)model};
  if (!name_key(name, &k))
    return KC_OK;
  int rc = mdb_del(txn, s->warmnames, &k, &v);
  if (rc == MDB_NOTFOUND)
    rc = 0;
  if (rc == MDB_MAP_FULL)
    return KCS_MAP_FULL; /* kcs_write evicts and tries again */
  return rc ? kcs_mdb_err(rc, "unindexing a model's name", err) : KC_OK;
}

/* Whether model's stored manifest has the name: an index pair without
 * one is stale (the manifest purged or renamed by a binary from before the
 * index, then this one again), and holds nothing. */
static int holds_name(kc_store *s, MDB_txn *txn, const char *model,
                      const char *name) {
  MDB_val k = {KC_HEX_LEN, (void *)model}, v;
  if (mdb_get(txn, s->warmups, &k, &v) != 0)
    return 0;
  char *n = stored_name(&v);
  int holds = n && strcmp(n, name) == 0;
  free(n);
  return holds;
}

/* name_holder without the index (the open could not build it): every
 * manifest read, in the order of their models. */
static int name_holder_walk(kc_store *s, MDB_txn *txn, const char *name,
                            const char *model, char other[KC_HEX_LEN + 1]) {
  MDB_cursor *cur;
  int rc = mdb_cursor_open(txn, s->warmups, &cur);
  if (rc)
    return -rc;
  MDB_val k, v;
  int found = 0;
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0 && !found;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    if (k.mv_size != KC_HEX_LEN || !memcmp(k.mv_data, model, KC_HEX_LEN))
      continue;
    char *n = stored_name(&v);
    if (n && strcmp(n, name) == 0) {
      memcpy(other, k.mv_data, KC_HEX_LEN);
      other[KC_HEX_LEN] = '\0';
      found = 1;
    }
    free(n);
  }
  mdb_cursor_close(cur);
  return found || rc == 0 || rc == MDB_NOTFOUND ? found : -rc;
}

#define STALE_MAX 16 /* stale pairs dropped by one look-up; more: the next */

/* The first model other than `model` holding name into other; 0 if none,
 * 1 if one, -rc on an LMDB error. Runs in the write transaction of a put:
 * a pair whose model's manifest lacks the name is dropped on the way (the
 * index repairs itself where it disagrees with the manifests). */
static int name_holder(kc_store *s, MDB_txn *txn, const char *name,
                       const char *model, char other[KC_HEX_LEN + 1]) {
  MDB_val k, v;
  if (!name_key(name, &k))
    return 0;
  if (s->names_why[0])
    return name_holder_walk(s, txn, name, model, other);
  MDB_cursor *cur;
  int rc = mdb_cursor_open(txn, s->warmnames, &cur);
  if (rc)
    return -rc;
  char stale[STALE_MAX][KC_HEX_LEN + 1];
  size_t n_stale = 0;
  int found = 0;
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_SET_KEY); rc == 0 && !found;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT_DUP)) {
    if (v.mv_size != KC_HEX_LEN || !memcmp(v.mv_data, model, KC_HEX_LEN))
      continue;
    memcpy(other, v.mv_data, KC_HEX_LEN);
    other[KC_HEX_LEN] = '\0';
    if (holds_name(s, txn, other, name))
      found = 1;
    else if (n_stale < STALE_MAX)
      memcpy(stale[n_stale++], other, KC_HEX_LEN + 1);
  }
  mdb_cursor_close(cur);
  if (!found && rc != 0 && rc != MDB_NOTFOUND)
    return -rc;
  /* dropped after the walk: a cursor does not survive deleting under it */
  for (size_t i = 0; i < n_stale; i++) {
    MDB_val sk, sv = {KC_HEX_LEN, stale[i]};
    name_key(name, &sk);
    int drc = mdb_del(txn, s->warmnames, &sk, &sv);
    if (drc && drc != MDB_NOTFOUND)
      return -drc;
  }
  return found;
}

static MDB_val built_flag(void) {
  MDB_val k = {16, (void *)"warmnames_built"};
  return k;
}

/* A store written before the index: built from every stored manifest, once
 * (meta "warmnames_built" says it was), in the transaction that opens the
 * databases. Later puts and purges keep it. */
kc_err kcs_warmnames_build(kc_store *s, MDB_txn *txn, char *err) {
  MDB_val fk = built_flag(), fv;
  if (mdb_get(txn, s->meta, &fk, &fv) == 0)
    return KC_OK;
  MDB_cursor *cur;
  int rc = mdb_drop(txn, s->warmnames, 0);
  if (!rc)
    rc = mdb_cursor_open(txn, s->warmups, &cur);
  if (rc)
    return kcs_mdb_err(rc, "indexing the models' names", err);
  MDB_val k, v;
  kc_err e = KC_OK;
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0 && !e;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    char model[KC_HEX_LEN + 1], *n = stored_name(&v);
    if (n && k.mv_size == KC_HEX_LEN) {
      memcpy(model, k.mv_data, KC_HEX_LEN);
      model[KC_HEX_LEN] = '\0';
      e = name_add(s, txn, n, model, err);
    }
    free(n);
  }
  mdb_cursor_close(cur);
  if (!e && rc != 0 && rc != MDB_NOTFOUND)
    e = kcs_mdb_err(rc, "indexing the models' names", err);
  fv = (MDB_val){1, (void *)"1"};
  return e ? e : kcs_put(txn, s->meta, &fk, &fv, 0, err);
}

/* A model's name is owned by the first manifest that gave it: without
 * KC_WARMUP_RENAME, a manifest may not change its model's name (old: the
 * name its stored manifest has, NULL when none or unreadable), nor take a
 * name another model's manifest holds (KC_CONFLICT, naming the holder).
 * Looked up in the name index inside the write transaction, so two
 * concurrent puts of one name cannot both pass. */
static kc_err warmup_name_check(kc_store *s, MDB_txn *txn, const wu_put *p,
                                const char *old, char *err) {
  char other[KC_HEX_LEN + 1];
  int rc = name_holder(s, txn, p->name, p->model, other);
  if (rc == -MDB_MAP_FULL)
    return KCS_MAP_FULL; /* dropping a stale pair: kcs_write evicts */
  if (rc < 0)
    return kcs_mdb_err(-rc, "checking a model's name", err);
  int renames = old && strcmp(old, p->name) != 0;
  /* both wrong: the model first in hex order is named, as a walk of the
   * manifests in their order would */
  if (renames && !(rc && memcmp(other, p->model, KC_HEX_LEN) < 0))
    return kc_errf(err, KC_CONFLICT,
                   "model %s is named '%.100s': renaming "
                   "it needs an admin token",
                   p->model, old);
  if (rc)
    return kc_errf(err, KC_CONFLICT,
                   "the name '%.100s' belongs to model "
                   "%s: taking it needs an admin token",
                   p->name, other);
  return KC_OK;
}

/* Whether the comma list has the arch (len bytes). */
static int list_has(const char *list, size_t n, const char *arch, size_t len) {
  for (const char *p = list, *end = list + n; p < end;) {
    const char *c = memchr(p, ',', (size_t)(end - p));
    size_t l = c ? (size_t)(c - p) : (size_t)(end - p);
    if (l == len && memcmp(p, arch, len) == 0)
      return 1;
    p += l + 1;
  }
  return 0;
}

/* The archs warms ran for: p->archs added to what is recorded while the
 * manifest stays the same (warms of one manifest on several runners, each
 * with its own --arch), replacing it when the manifest changed. */
static kc_err warm_archs_op(kc_store *s, MDB_txn *txn, const wu_put *p,
                            int same, char *err) {
  MDB_val k = kcs_hex_val(p->model), v;
  char buf[KC_STORE_WARM_ARCHS_MAX];
  size_t n = 0;
  if (same && mdb_get(txn, s->warmarchs, &k, &v) == 0 &&
      v.mv_size < sizeof buf) {
    memcpy(buf, v.mv_data, v.mv_size);
    n = v.mv_size;
  }
  if (!p->archs && !same)
    return kcs_del(txn, s->warmarchs, &k, err);
  for (const char *a = p->archs; a && *a;) {
    size_t l = strcspn(a, ",");
    if (!list_has(buf, n, a, l) && n + l + 1 < sizeof buf) {
      if (n)
        buf[n++] = ',';
      memcpy(buf + n, a, l);
      n += l;
    }
    a += l + (a[l] == ',');
  }
  if (!n)
    return KC_OK;
  v = (MDB_val){n, buf};
  return kcs_put(txn, s->warmarchs, &k, &v, 0, err);
}

static kc_err warmup_put_op(kc_store *s, MDB_txn *txn, void *ud, char *err) {
  wu_put *p = ud;
  MDB_val k = kcs_hex_val(p->model), v = {p->len, (void *)p->json}, old;
  int had = mdb_get(txn, s->warmups, &k, &old) == 0;
  /* copied out: old points into the map, which the put below changes */
  char *oldname = had ? stored_name(&old) : NULL;
  int same =
      had && old.mv_size == p->len && memcmp(old.mv_data, p->json, p->len) == 0;
  int64_t delta = (int64_t)p->len - (had ? (int64_t)old.mv_size : 0);
  kc_err e = KC_OK;
  if (!(p->flags & KC_WARMUP_RENAME))
    e = warmup_name_check(s, txn, p, oldname, err);
  if (!e)
    e = warmup_room(s, txn, p->model, delta, err);
  if (!e)
    e = warm_archs_op(s, txn, p, same, err);
  if (!e)
    e = kcs_put(txn, s->warmups, &k, &v, 0, err);
  if (!e)
    e = wbytes_add(s, txn, delta, err);
  if (!e && oldname && strcmp(oldname, p->name) != 0)
    e = name_del(s, txn, oldname, p->model, err);
  if (!e)
    e = name_add(s, txn, p->name, p->model, err);
  free(oldname);
  return e;
}

kc_err kc_store_warmup_put(kc_store *s, const char *model, const char *name,
                           const char *json, size_t len, int flags,
                           const char *archs, char *err) {
  if (!kc_is_hex64(model))
    return kc_errf(err, KC_BAD_KEY, "a model is 64 lowercase hex digits");
  if (!len)
    return kc_errf(err, KC_BAD_WARMUP, "an empty warmup manifest");
  if (!name || !*name)
    return kc_errf(err, KC_BAD_WARMUP, "a warmup manifest without a name");
  if (strlen(name) > KCS_WARMNAME_MAX)
    return kc_errf(err, KC_BAD_WARMUP, "model.name: over %d bytes",
                   KCS_WARMNAME_MAX);
  if (archs && strlen(archs) >= KC_STORE_WARM_ARCHS_MAX)
    return kc_errf(err, KC_EINVAL, "archs: over %d bytes",
                   KC_STORE_WARM_ARCHS_MAX - 1);
  wu_put p = {model, name, json, len, flags, archs && *archs ? archs : NULL};
  kc_err e = kcs_maybe_evict(s, len, err); /* it counts in bytes_used */
  return e ? e : kcs_write(s, warmup_put_op, &p, err);
}

kc_err kc_store_warm_archs_get(kc_store *s, const char *model,
                               char out[KC_STORE_WARM_ARCHS_MAX]) {
  out[0] = '\0';
  if (!kc_is_hex64(model))
    return KC_BAD_KEY;
  kc_store_read *r;
  kc_err e = kc_store_read_begin(s, &r);
  if (e)
    return e;
  MDB_val k = kcs_hex_val(model), v;
  int rc = mdb_get(r->txn, s->warmarchs, &k, &v);
  if (rc == 0 && v.mv_size < KC_STORE_WARM_ARCHS_MAX) {
    memcpy(out, v.mv_data, v.mv_size);
    out[v.mv_size] = '\0';
  }
  kc_store_read_end(r);
  return rc == 0 && out[0] ? KC_OK : KC_NOT_FOUND;
}

kc_err kc_store_warmup_get(kc_store *s, const char *model, char **json,
                           size_t *len, char *err) {
  *json = NULL;
  *len = 0;
  if (!kc_is_hex64(model))
    return kc_errf(err, KC_BAD_KEY, "a model is 64 lowercase hex digits");
  kc_store_read *r;
  kc_err e = kc_store_read_begin(s, &r);
  if (e)
    return kc_errf(err, e, "cannot begin a read of the store");
  MDB_val k = kcs_hex_val(model), v;
  int rc = mdb_get(r->txn, s->warmups, &k, &v);
  if (rc == 0) {
    *json = malloc(v.mv_size + 1);
    if (*json) {
      memcpy(*json, v.mv_data, v.mv_size);
      (*json)[v.mv_size] = '\0';
      *len = v.mv_size;
    }
  }
  kc_store_read_end(r);
  if (rc == MDB_NOTFOUND)
    return kc_errf(err, KC_NOT_FOUND, "no warmup manifest for model %s", model);
  if (rc)
    return kcs_mdb_err(rc, "reading a warmup manifest", err);
  return *json ? KC_OK : kc_errf(err, KC_NOMEM, "out of memory");
}

/* ---- purge ---- */

typedef struct purge {
  const char *model;
  char (*keys)[KC_HEX_LEN + 1]; /* KC_STORE_PURGE_BATCH of them */
  size_t dropped;               /* by the last batch */
} purge;

/* One batch: collects up to KC_STORE_PURGE_BATCH of the model's keys, then
 * drops them (an LMDB cursor does not survive deleting under it). A batch
 * that finds none also drops the warmup manifest. */
static kc_err purge_op(kc_store *s, MDB_txn *txn, void *ud, char *err) {
  purge *p = ud;
  p->dropped = 0;
  char(*keys)[KC_HEX_LEN + 1] = p->keys;
  size_t n = 0;
  MDB_cursor *cur;
  int rc = mdb_cursor_open(txn, s->models, &cur);
  if (rc)
    return kcs_mdb_err(rc, "purging a model", err);
  MDB_val k = {KC_HEX_LEN, (void *)p->model}, v;
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
       rc == 0 && n < KC_STORE_PURGE_BATCH && k.mv_size == 2 * KC_HEX_LEN &&
       memcmp(k.mv_data, p->model, KC_HEX_LEN) == 0;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    memcpy(keys[n], (char *)k.mv_data + KC_HEX_LEN, KC_HEX_LEN);
    keys[n++][KC_HEX_LEN] = '\0';
  }
  mdb_cursor_close(cur);
  kc_err e = KC_OK;
  for (size_t i = 0; !e && i < n; i++) {
    e = kcs_bundle_drop(s, txn, keys[i], 0, err);
    if (!e)
      e = kcs_queue_add(s, txn, KCS_Q_DELETE, keys[i], p->model, err);
  }
  if (!e && n == 0)
    e = warmup_drop(s, txn, p->model, err);
  if (!e)
    p->dropped = n;
  return e;
}

kc_err kc_store_model_purge(kc_store *s, const char *model, size_t *removed,
                            char *err) {
  if (removed)
    *removed = 0;
  if (!kc_is_hex64(model))
    return kc_errf(err, KC_BAD_KEY, "a model is 64 lowercase hex digits");
  purge p = {model, malloc(KC_STORE_PURGE_BATCH * (KC_HEX_LEN + 1)), 0};
  if (!p.keys)
    return kc_errf(err, KC_NOMEM, "out of memory");
  kc_err e;
  do {
    if ((e = kcs_write(s, purge_op, &p, err))) {
      free(p.keys);
      return e;
    }
    if (removed)
      *removed += p.dropped;
    if (p.dropped)
      kcs_tier_kick(s);
  } while (p.dropped);
  free(p.keys);
  return KC_OK;
}
