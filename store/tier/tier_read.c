/* tier_read.c: read-through from the durable tier: a miss in LMDB is fetched
 * from S3, verified (blobs against their digest while they stream, manifests
 * against their key) and stored, never queued back. One fetch per object at a
 * time: later askers wait for the first one's answer. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tier.h"

struct kcs_flight {
  kcs_flight *next;
  char kind;
  char hex[KC_HEX_LEN + 1];
  int done, waiters;
  kc_err result;
  char err[KC_ERRBUF_SIZE];
};

struct kcs_fill {
  kcs_fill *next;
  kc_store_upload *u;
  char digest[KC_HEX_LEN + 1];
  kcs_flight *f;
};

/* One fetch: where a blob's bytes go (data NULL: only into the store), and
 * whether the flight ends later, on the fill thread. */
typedef struct fetch_ctx {
  kcs_flight *f;
  int deferred;
  int quiet; /* a bundle PUT's check (tier_once.c): not a read-through */
  void **data;
  size_t *len;
} fetch_ctx;

typedef kc_err (*fetch_fn)(kcs_tier *t, const char *hex, fetch_ctx *c,
                           char *err);

static kcs_flight *flight_find(kcs_tier *t, char kind, const char *hex) {
  for (kcs_flight *f = t->flights; f; f = f->next)
    if (f->kind == kind && strcmp(f->hex, hex) == 0)
      return f;
  return NULL;
}

static kc_err flight_wait(kcs_tier *t, kcs_flight *f, char *err) {
  f->waiters++;
  while (!f->done)
    pthread_cond_wait(&t->fl_cv, &t->fl_mu);
  kc_err e = f->result;
  if (err && e)
    memcpy(err, f->err, KC_ERRBUF_SIZE);
  if (--f->waiters == 0)
    free(f); /* the leader unlinked it when done */
  pthread_mutex_unlock(&t->fl_mu);
  return e;
}

static void flight_end(kcs_tier *t, kcs_flight *f, kc_err e, const char *err) {
  pthread_mutex_lock(&t->fl_mu);
  for (kcs_flight **pp = &t->flights; *pp; pp = &(*pp)->next)
    if (*pp == f) {
      *pp = f->next;
      break;
    }
  f->done = 1;
  f->result = e;
  if (err)
    memcpy(f->err, err, KC_ERRBUF_SIZE);
  int free_now = f->waiters == 0;
  pthread_cond_broadcast(&t->fl_cv);
  pthread_mutex_unlock(&t->fl_mu);
  if (free_now)
    free(f);
}

/* Runs fn once for (kind, hex) however many threads ask at once. */
static kc_err single_flight(kcs_tier *t, char kind, const char *hex,
                            fetch_fn fn, fetch_ctx *c, char *err) {
  pthread_mutex_lock(&t->fl_mu);
  kcs_flight *f = flight_find(t, kind, hex);
  if (f)
    return flight_wait(t, f, err); /* unlocks */
  f = calloc(1, sizeof *f);
  if (f) {
    f->kind = kind;
    memcpy(f->hex, hex, KC_HEX_LEN + 1);
    f->next = t->flights;
    t->flights = f;
  }
  pthread_mutex_unlock(&t->fl_mu);
  if (!f)
    return kc_errf(err, KC_NOMEM, "out of memory");
  char ferr[KC_ERRBUF_SIZE] = "";
  c->f = f;
  kc_err e = fn(t, hex, c, ferr);
  if (!c->deferred)
    flight_end(t, f, e, ferr);
  if (err && e)
    memcpy(err, ferr, KC_ERRBUF_SIZE);
  return e;
}

kc_err kcs_tier_outcome(kcs_tier *t, kc_err e) {
  if (!e)
    atomic_fetch_add(&t->rt_hit, 1);
  else if (e == KC_NOT_FOUND)
    atomic_fetch_add(&t->rt_miss, 1);
  else if (e != KC_CORRUPT)
    atomic_fetch_add(&t->rt_error, 1);
  return e;
}

/* A bad object in the bucket: never stored; deleted so that the next upload
 * of the right bytes (a PUT with If-None-Match) is not refused by it. */
kc_err kcs_tier_corrupt(kcs_tier *t, kcs3 *h, const char *obj, char *err) {
  char why[KC_ERRBUF_SIZE];
  snprintf(why, sizeof why, "%s", err ? err : "");
  atomic_fetch_add(&t->rt_corrupt, 1);
  uint64_t t0 = kc_clock_mono_us();
  kc_err de = kcs_tier_done(t, t0, kcs3_delete(h, obj, NULL));
  kcs_tier_logf(t, "error", "S3 object %s is corrupt (%s); not served, %s", obj,
                why, de ? "and deleting it failed" : "deleted");
  return kc_errf(err, KC_CORRUPT,
                 "S3's copy %s failed verification (%s); "
                 "not served",
                 obj, why);
}

/* A blob object on its way into an upload: one marked
 * x-amz-meta-kcache-encoding: zstd is a frame, decoded as it
 * arrives (and kept as it came when the store compresses). */
typedef struct obj_sink {
  kc_store_upload *u;
  kcs3 *h;
  uint64_t max_out;
  int looked; /* the mark was looked for (before the first piece) */
} obj_sink;

static void look_for_mark(obj_sink *o) {
  char v[32];
  if (!o->looked &&
      kcs3_answer_header(o->h, "x-amz-meta-kcache-encoding", v, sizeof v) &&
      strcmp(v, "zstd") == 0)
    kc_store_upload_zstd(o->u, o->max_out);
  o->looked = 1;
}

static kc_err to_upload(const void *data, size_t len, void *ud) {
  obj_sink *o = ud;
  look_for_mark(o);
  return kc_store_upload_write(o->u, data, len, NULL);
}

/* ---- fills committed after the answer ---- */

#define FILL_BATCH 64
#define FILL_GATHER_MS 10 /* fills gathered into one transaction (one sync) */

/* Takes up to FILL_BATCH fills (fill_mu held). */
static size_t take_fills(kcs_tier *t, kcs_fill **out) {
  size_t n = 0;
  while (t->fills && n < FILL_BATCH) {
    out[n++] = t->fills;
    t->fills = t->fills->next;
  }
  if (!t->fills)
    t->fills_tail = &t->fills;
  return n;
}

static void commit_fills(kcs_tier *t, kcs_fill **x, size_t n) {
  kc_store_upload *u[FILL_BATCH];
  const char *d[FILL_BATCH];
  for (size_t i = 0; i < n; i++) {
    u[i] = x[i]->u;
    d[i] = x[i]->digest;
  }
  char err[KC_ERRBUF_SIZE] = "";
  kc_err e = kcs_upload_commit_batch(t->s, u, d, n, err);
  if (e)
    kcs_tier_logf(t, "warn", "storing %zu blobs fetched from S3: %s", n, err);
  for (size_t i = 0; i < n; i++) {
    flight_end(t, x[i]->f, e, err);
    free(x[i]);
  }
}

/* Waits a moment after the first fill so that those arriving meanwhile
 * share its transaction: one sync for many small blobs. */
static void gather(kcs_tier *t) {
  struct timespec ts =
      kc_clock_deadline(CLOCK_REALTIME, (uint64_t)FILL_GATHER_MS * 1000);
  while (!atomic_load(&t->fill_stop) &&
         pthread_cond_timedwait(&t->fill_cv, &t->fill_mu, &ts) == 0)
    ;
}

static void *filler_main(void *ud) {
  kcs_tier *t = ud;
  kcs_fill *x[FILL_BATCH];
  pthread_mutex_lock(&t->fill_mu);
  for (;;) {
    while (!t->fills && !atomic_load(&t->fill_stop))
      pthread_cond_wait(&t->fill_cv, &t->fill_mu);
    if (!t->fills)
      break; /* stopping, and nothing left */
    gather(t);
    size_t n = take_fills(t, x);
    pthread_mutex_unlock(&t->fill_mu);
    commit_fills(t, x, n);
    pthread_mutex_lock(&t->fill_mu);
  }
  pthread_mutex_unlock(&t->fill_mu);
  return NULL;
}

int kcs_filler_start(kcs_tier *t) {
  if (pthread_create(&t->filler, NULL, filler_main, t))
    return -1;
  t->filler_started = 1;
  return 0;
}

void kcs_filler_stop(kcs_tier *t) {
  if (!t->filler_started)
    return;
  pthread_mutex_lock(&t->fill_mu);
  atomic_store(&t->fill_stop, 1);
  pthread_cond_signal(&t->fill_cv);
  pthread_mutex_unlock(&t->fill_mu);
  pthread_join(t->filler, NULL);
}

/* Hands a verified in-memory blob to the caller now and to the fill thread
 * to commit; the flight ends there. KC_OK, or NOMEM (then commit here). */
static kc_err serve_then_fill(kcs_tier *t, kc_store_upload *u,
                              const char *digest, const void *mem,
                              fetch_ctx *c) {
  size_t len = (size_t)kc_store_upload_size(u);
  uint64_t zlen = 0;
  kcs_fill *x = malloc(sizeof *x);
  void *copy = malloc(len ? len : 1);
  /* a frame received is served decoded (its content was verified) */
  if (!x || !copy ||
      (kcs_upload_frame(u, &zlen) &&
       kc_store_zstd_decode(mem, (size_t)zlen, copy, len, NULL))) {
    free(x);
    free(copy);
    return KC_NOMEM;
  }
  if (!zlen)
    memcpy(copy, mem, len);
  *c->data = copy;
  *c->len = len;
  *x = (kcs_fill){.u = u, .f = c->f};
  memcpy(x->digest, digest, KC_HEX_LEN + 1);
  c->deferred = 1;
  pthread_mutex_lock(&t->fill_mu);
  if (!t->fills) /* else the filler is gathering: no need to wake it */
    pthread_cond_signal(&t->fill_cv);
  *t->fills_tail = x;
  t->fills_tail = &x->next;
  pthread_mutex_unlock(&t->fill_mu);
  return KC_OK;
}

/* The fetched bytes: verified, then stored (or served first, then stored). */
static kc_err keep_blob(kcs_tier *t, kc_store_upload *u, const char *digest,
                        fetch_ctx *c, char *err) {
  const void *mem = NULL;
  kc_err e = kcs_upload_verify(u, digest, &mem, err);
  if (e) {
    kc_store_upload_abort(u);
    return e;
  }
  if (c->data && mem && serve_then_fill(t, u, digest, mem, c) == KC_OK)
    return KC_OK;
  return kc_store_upload_commit(u, digest, NULL, err);
}

static kc_err get_blob(kcs_tier *t, const char *digest, fetch_ctx *c,
                       char *err) {
  if (kc_store_blob_has(t->s, digest, NULL) == KC_OK)
    return KC_OK; /* a put or an earlier fetch got it meanwhile */
  kc_store_upload *u;
  kc_err e = kc_store_upload_begin(t->s, &u, err);
  if (e)
    return e;
  kcs_upload_from_tier(u);
  kcs3 *h = kcs_tier_handle(t);
  if (!h) {
    kc_store_upload_abort(u);
    return kc_errf(err, KC_NOMEM, "cannot make an S3 handle");
  }
  char obj[KCS3_KEY_MAX + 1];
  kcs_tier_obj(t, obj, "blobs", digest);
  uint64_t t0 = kc_clock_mono_us();
  obj_sink o = {u, h, t->max_object, 0};
  e = kcs_tier_done(
      t, t0,
      kcs3_get_stream(h, obj, t->max_object, to_upload, &o, NULL, NULL, err));
  if (!e)
    look_for_mark(&o); /* an empty body took no piece */
  if (e)
    kc_store_upload_abort(u);
  else if ((e = keep_blob(t, u, digest, c, err)) == KC_DIGEST_MISMATCH)
    e = kcs_tier_corrupt(t, h, obj, err);
  kcs_tier_put_handle(t, h);
  return kcs_tier_outcome(t, e);
}

static kc_err check_manifest(const char *key, const char *data, size_t len,
                             kc_manifest **m, char *err) {
  kc_err e = kc_manifest_parse(data, len, m, err);
  if (!e && strcmp((*m)->key, key) != 0)
    e = kc_errf(err, KC_KEY_MISMATCH, "it holds the manifest of %s", (*m)->key);
  return e;
}

static kc_err get_manifest(kcs_tier *t, const char *key, kc_manifest **m,
                           char *err) {
  kcs3 *h = kcs_tier_handle(t);
  if (!h)
    return kc_errf(err, KC_NOMEM, "cannot make an S3 handle");
  char obj[KCS3_KEY_MAX + 1];
  kcs_tier_obj(t, obj, "bundles", key);
  void *data = NULL;
  size_t len = 0;
  uint64_t t0 = kc_clock_mono_us();
  kc_err e = kcs_tier_done(
      t, t0, kcs3_get(h, obj, KCS_MANIFEST_MAX, &data, &len, NULL, err));
  if (!e && (e = check_manifest(key, data, len, m, err)) == KC_KEY_MISMATCH) {
    e = kcs_tier_corrupt(t, h, obj, err);
  } else if (e && e != KC_NOMEM && data) {
    /* A manifest this version cannot read (a newer one, or damage): not
     * served, not deleted (a newer replica may use it); a miss here. */
    char why[KC_ERRBUF_SIZE];
    snprintf(why, sizeof why, "%s", err ? err : "");
    e = kc_errf(err, KC_NOT_FOUND, "S3's manifest %s cannot be read here: %s",
                obj, why);
  }
  free(data);
  kcs_tier_put_handle(t, h);
  return e;
}

static kc_err get_bundle(kcs_tier *t, const char *key, fetch_ctx *c,
                         char *err) {
  if (kc_store_bundle_has(t->s, key) == KC_OK)
    return KC_OK;
  kc_manifest *m = NULL;
  kc_err e = get_manifest(t, key, &m, err);
  for (size_t i = 0; !e && i < m->n_files; i++) {
    e = kc_store_fetch_blob(t->s, m->files[i].sha256, err);
    if (e == KC_NOT_FOUND)
      kc_errf(err, e, "S3 holds bundle %s but not its blob %s", key,
              m->files[i].sha256);
  }
  if (!e)
    e = kcs_bundle_put(t->s, m, 0, NULL, NULL, NULL, err);
  kc_manifest_free(m);
  return c->quiet ? e : kcs_tier_outcome(t, e);
}

kc_err kcs_tier_down(kcs_tier *t, int quiet, char *err) {
  if ((uint64_t)kc_clock_mono_ms() >= atomic_load(&t->down_until_ms))
    return KC_OK;
  if (!quiet)
    atomic_fetch_add(&t->rt_error, 1);
  return kc_errf(err, KC_UNAVAILABLE,
                 "S3 cannot be reached (retrying in the "
                 "background)");
}

kc_err kc_store_fetch_blob_copy(kc_store *s, const char *digest, void **data,
                                size_t *len, char *err) {
  kcs_tier *t = s->tier;
  if (data)
    *data = NULL;
  if (!t || !kc_is_hex64(digest))
    return kc_errf(err, KC_NOT_FOUND, "no blob %s", digest);
  kc_err e = kcs_tier_down(t, 0, err);
  fetch_ctx c = {.data = data, .len = len};
  return e ? e : single_flight(t, KCS_Q_BLOB, digest, get_blob, &c, err);
}

kc_err kc_store_fetch_blob(kc_store *s, const char *digest, char *err) {
  return kc_store_fetch_blob_copy(s, digest, NULL, NULL, err);
}

kc_err kcs_tier_fetch_bundle(kc_store *s, const char *key, int quiet,
                             char *err) {
  kcs_tier *t = s->tier;
  if (!t || !kc_is_hex64(key))
    return kc_errf(err, KC_NOT_FOUND, "no bundle %s", key);
  kc_err e = kcs_tier_down(t, quiet, err);
  fetch_ctx c = {.quiet = quiet};
  return e ? e : single_flight(t, KCS_Q_BUNDLE, key, get_bundle, &c, err);
}

kc_err kc_store_fetch_bundle(kc_store *s, const char *key, char *err) {
  return kcs_tier_fetch_bundle(s, key, 0, err);
}

/* ---- many at once ---- */

typedef struct many {
  kc_store *s;
  const char *const *keys;
  kc_err *results;
  size_t n;
  _Atomic size_t next;
} many;

static void *many_main(void *ud) {
  many *m = ud;
  for (size_t i; (i = atomic_fetch_add(&m->next, 1)) < m->n;)
    m->results[i] = kc_store_fetch_bundle(m->s, m->keys[i], NULL);
  return NULL;
}

void kc_store_fetch_bundles(kc_store *s, const char *const *keys, size_t n,
                            kc_err *results) {
  many m = {.s = s, .keys = keys, .results = results, .n = n};
  size_t n_threads = s->tier ? s->tier->parallel : 1;
  if (n_threads > n)
    n_threads = n;
  pthread_t th[64];
  if (n_threads > 64)
    n_threads = 64;
  size_t started = 0;
  /* this thread is one of the fetchers */
  while (started + 1 < n_threads &&
         pthread_create(&th[started], NULL, many_main, &m) == 0)
    started++;
  many_main(&m);
  for (size_t i = 0; i < started; i++)
    pthread_join(th[i], NULL);
}

/* ---- a model's listing ---- */

typedef struct listed {
  kc_store *s;
  size_t skip; /* bytes of "PREFIX/models/MODEL/" */
  char **keys;
  size_t n, cap;
} listed;

static int on_listed(const kcs3_entry *e, void *ud) {
  listed *l = ud;
  const char *key = e->key + l->skip;
  if (strlen(e->key) <= l->skip || !kc_is_hex64(key) ||
      kc_store_bundle_has(l->s, key) == KC_OK)
    return 0;
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 64;
    char **k = realloc(l->keys, cap * sizeof *k);
    if (!k)
      return 1;
    l->keys = k;
    l->cap = cap;
  }
  return (l->keys[l->n] = strdup(key)) ? (l->n++, 0) : 1;
}

static kc_err list_model(kcs_tier *t, const char *model, listed *l, char *err) {
  kcs3 *h = kcs_tier_handle(t);
  if (!h)
    return kc_errf(err, KC_NOMEM, "cannot make an S3 handle");
  char pre[KCS3_KEY_MAX + 1];
  snprintf(pre, sizeof pre, "%s/models/%s/", t->prefix, model);
  l->skip = strlen(pre);
  uint64_t t0 = kc_clock_mono_us();
  kc_err e = kcs_tier_done(t, t0, kcs3_list(h, pre, on_listed, l, err));
  kcs_tier_put_handle(t, h);
  return e;
}

kc_err kc_store_fetch_model(kc_store *s, const char *model, char *err) {
  kcs_tier *t = s->tier;
  if (!t || !kc_is_hex64(model))
    return KC_OK;
  listed l = {.s = s};
  kc_err e = kcs_tier_down(t, 0, err);
  if (!e)
    e = list_model(t, model, &l, err);
  kc_err *res = l.n ? calloc(l.n, sizeof *res) : NULL;
  if (!e && l.n && !res)
    e = kc_errf(err, KC_NOMEM, "out of memory");
  if (!e && l.n)
    kc_store_fetch_bundles(s, (const char *const *)l.keys, l.n, res);
  for (size_t i = 0; !e && i < l.n; i++)
    if (res[i] && res[i] != KC_NOT_FOUND)
      e = kc_errf(err, res[i], "fetching bundle %s of model %s from S3",
                  l.keys[i], model);
  kc_store_strv_free(l.keys, l.n);
  free(res);
  return e;
}

/* ---- the read-through of every front end ----
 * What a GET of a blob, a bundle or a RESP key does on a miss, in one place
 * (HTTP's handlers and RESP's fetchers call these): ask the tier once, and
 * read an answer other than "found" or "corrupt" as a miss, whose sentence
 * says why S3 could not tell when it failed. A cache miss is always a safe
 * answer. */

static kc_err rt_miss(kc_err e, char *err, const char *what, const char *id) {
  char why[KC_ERRBUF_SIZE];
  if (!err)
    return KC_NOT_FOUND;
  snprintf(why, sizeof why, "%s", err);
  if (e == KC_NOT_FOUND || !*why)
    return kc_errf(err, KC_NOT_FOUND, "no %s%s%s", what, id ? " " : "",
                   id ? id : "");
  return kc_errf(err, KC_NOT_FOUND, "no %s%s%s (and S3 could not say: %s)",
                 what, id ? " " : "", id ? id : "", why);
}

kc_err kc_store_blob_read(kc_store *s, const char *digest, kc_store_read **rd,
                          kc_store_blob_view *v, char *err) {
  *v = (kc_store_blob_view){0};
  for (int fetched = 0;; fetched = 1) {
    kc_err e = kc_store_read_begin(s, rd);
    if (e)
      return kc_errf(err, e, "cannot begin a read of the store");
    e = kc_store_blob_get_stored(*rd, digest, &v->data, &v->len, &v->enc,
                                 &v->size);
    if (!e)
      return KC_OK;
    kc_store_read_end(*rd);
    *rd = NULL;
    if (e != KC_NOT_FOUND)
      return kc_errf(err, e, "cannot read blob %s", digest);
    if (fetched)
      return kc_errf(err, e, "no blob %s", digest);
    e = kc_store_fetch_blob_copy(s, digest, &v->heap, &v->len, err);
    if (!e && v->heap) { /* served decoded: the content */
      v->data = v->heap;
      v->enc = KC_STORE_RAW;
      v->size = v->len;
      return KC_OK;
    }
    if (e == KC_CORRUPT)
      return e;
    if (e) /* not in S3 either, or S3 unreachable: a miss */
      return rt_miss(e, err, "blob", digest);
  }
}

kc_err kc_store_bundle_read(kc_store *s, const char *key, kc_store_read **rd,
                            const char **json, size_t *len, char *err) {
  for (int fetched = 0;; fetched = 1) {
    kc_err e = kc_store_read_begin(s, rd);
    if (e)
      return kc_errf(err, e, "cannot begin a read of the store");
    e = kc_store_bundle_get(*rd, key, json, len);
    if (!e)
      return KC_OK;
    kc_store_read_end(*rd);
    *rd = NULL;
    if (e != KC_NOT_FOUND)
      return kc_errf(err, e, "cannot read bundle %s", key);
    if (fetched)
      return kc_errf(err, e, "no bundle %s", key);
    e = kc_store_fetch_bundle(s, key, err);
    if (e == KC_CORRUPT)
      return e;
    if (e)
      return rt_miss(e, err, "bundle", key);
  }
}

kc_err kc_store_kv_read_through(kc_store *s, const void *key, size_t klen,
                                int64_t now_ms, char *err) {
  kc_err e = kc_store_kv_fetch(s, key, klen, now_ms, err);
  if (!e || e == KC_CORRUPT)
    return e;
  return rt_miss(e, err, "such key", NULL);
}
