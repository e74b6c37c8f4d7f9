/* tier.c: the durable tier's write-through half: the upload queue kept in
 * LMDB, the worker thread that drains it into S3 in order, the handle pool,
 * request accounting and stats. Read-through is tier_read.c, leases
 * tier_lease.c. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <openssl/rand.h>

#include "tier.h"

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 30000
#define DOWN_FOR_MS 2000 /* fetches fail fast this long after S3 failed */
#define WORKER_TIMEOUT_MS 600000 /* one upload; close aborts it sooner */

static const double g_bounds[KC_STORE_S3_BUCKETS] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10};

/* ---- small helpers ---- */

void kcs_tier_logf(kcs_tier *t, const char *level, const char *fmt, ...) {
  if (!t->log)
    return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  t->log(t->log_ud, level, msg);
}

void kcs_tier_obj(const kcs_tier *t, char out[KCS3_KEY_MAX + 1],
                  const char *kind, const char *hex) {
  snprintf(out, KCS3_KEY_MAX + 1, "%s/%s/%s", t->prefix, kind, hex);
}

kc_err kcs_tier_done(kcs_tier *t, uint64_t t0_us, kc_err e) {
  uint64_t us = kc_clock_mono_us() - t0_us;
  size_t b = 0;
  while (b < KC_STORE_S3_BUCKETS && (double)us / 1e6 > g_bounds[b])
    b++;
  atomic_fetch_add(&t->dur[b], 1);
  atomic_fetch_add(&t->dur_sum_us, us);
  atomic_fetch_add(&t->requests, 1);
  int unreachable = e == KC_UNAVAILABLE || e == KC_TIMEOUT;
  if (e && e != KC_NOT_FOUND && e != KC_CONFLICT)
    atomic_fetch_add(&t->errors, 1);
  atomic_store(&t->up, !unreachable);
  atomic_store(&t->down_until_ms,
               unreachable ? (uint64_t)kc_clock_mono_ms() + DOWN_FOR_MS : 0);
  return e;
}

/* ---- handles ---- */

static kcs3 *new_handle(kcs_tier *t, long timeout_ms) {
  kcs3_opts o = t->o;
  o.timeout_ms = timeout_ms;
  kcs3 *h = NULL;
  char err[KC_ERRBUF_SIZE];
  if (kcs3_open(&o, &h, err))
    kcs_tier_logf(t, "error", "%s", err);
  return h;
}

kcs3 *kcs_tier_handle(kcs_tier *t) {
  kcs3 *h = NULL;
  pthread_mutex_lock(&t->pool_mu);
  while (!t->n_idle && t->n_made >= t->parallel)
    pthread_cond_wait(&t->pool_cv, &t->pool_mu);
  if (t->n_idle)
    h = t->idle[--t->n_idle];
  else
    t->n_made++;
  pthread_mutex_unlock(&t->pool_mu);
  if (h)
    return h;
  /* Fetches move whole blobs: allow a slow link 1 MB/s, and 30 s. */
  h = new_handle(t, 30000 + (long)(t->max_object / 1000));
  if (!h) {
    pthread_mutex_lock(&t->pool_mu);
    t->n_made--;
    pthread_cond_signal(&t->pool_cv);
    pthread_mutex_unlock(&t->pool_mu);
  }
  return h;
}

void kcs_tier_put_handle(kcs_tier *t, kcs3 *h) {
  if (!h)
    return;
  pthread_mutex_lock(&t->pool_mu);
  t->idle[t->n_idle++] = h;
  pthread_cond_signal(&t->pool_cv);
  pthread_mutex_unlock(&t->pool_mu);
}

/* ---- the queue (in the caller's write transaction) ---- */

static kc_err next_seq(kc_store *s, MDB_txn *txn, uint64_t *seq, char *err) {
  MDB_cursor *cur;
  MDB_val k, v;
  int rc = mdb_cursor_open(txn, s->s3queue, &cur);
  if (rc)
    return kcs_mdb_err(rc, "opening the S3 queue", err);
  rc = mdb_cursor_get(cur, &k, &v, MDB_LAST);
  mdb_cursor_close(cur);
  if (rc && rc != MDB_NOTFOUND)
    return kcs_mdb_err(rc, "reading the S3 queue", err);
  *seq = rc == 0 && k.mv_size == 8 ? kcs_be64_get(k.mv_data) + 1 : 1;
  return KC_OK;
}

kc_err kcs_queue_add(kc_store *s, MDB_txn *txn, char kind, const char *key,
                     const char *model, char *err) {
  if (!s->tier)
    return KC_OK;
  uint64_t seq = 0;
  kc_err e = next_seq(s, txn, &seq, err);
  if (e)
    return e;
  unsigned char sk[8], val[1 + 2 * KC_HEX_LEN];
  kcs_be64_put(sk, seq);
  val[0] = (unsigned char)kind;
  memcpy(val + 1, key, KC_HEX_LEN);
  if (model)
    memcpy(val + 1 + KC_HEX_LEN, model, KC_HEX_LEN);
  MDB_val k = {8, sk}, v = {1 + KC_HEX_LEN * (model ? 2u : 1u), val};
  if ((e = kcs_put(txn, s->s3queue, &k, &v, 0, err)) ||
      (kind != KCS_Q_BUNDLE && kind != KCS_Q_KV))
    return e;
  MDB_val pk = kcs_hex_val(key), sv = {8, sk};
  return kcs_put(txn, s->s3pend, &pk, &sv, 0, err);
}

int kcs_queue_pending(kc_store *s, MDB_txn *txn, const char *key) {
  if (!s->tier)
    return 0; /* the tier was switched off: nothing will drain the queue */
  MDB_val k = kcs_hex_val(key), v;
  return mdb_get(txn, s->s3pend, &k, &v) == 0;
}

kc_err kcs_queue_unpend(kc_store *s, MDB_txn *txn, const char *key, char *err) {
  MDB_val k = kcs_hex_val(key);
  return kcs_del(txn, s->s3pend, &k, err);
}

void kcs_tier_kick(kc_store *s) {
  kcs_tier *t = s->tier;
  if (!t)
    return;
  pthread_mutex_lock(&t->mu);
  t->kicked = 1;
  pthread_cond_signal(&t->cv);
  pthread_mutex_unlock(&t->mu);
}

/* ---- the worker: one entry ---- */

typedef struct entry {
  uint64_t seq;
  char kind;
  char key[KC_HEX_LEN + 1];
  char model[KC_HEX_LEN + 1];
} entry;

/* The first entry of the queue: 1 found, 0 empty, -1 error. */
static int queue_first(kc_store *s, entry *out) {
  kc_store_read *r;
  if (kc_store_read_begin(s, &r))
    return -1;
  MDB_cursor *cur;
  MDB_val k, v;
  int found = -1;
  if (mdb_cursor_open(r->txn, s->s3queue, &cur) == 0) {
    int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
    found = rc == MDB_NOTFOUND ? 0 : rc ? -1 : 1;
    if (found == 1 && (k.mv_size != 8 || v.mv_size < 1 + KC_HEX_LEN))
      found = -1;
    if (found == 1) {
      memset(out, 0, sizeof *out);
      out->seq = kcs_be64_get(k.mv_data);
      out->kind = *(const char *)v.mv_data;
      memcpy(out->key, (const char *)v.mv_data + 1, KC_HEX_LEN);
      if (v.mv_size >= 1 + 2 * KC_HEX_LEN)
        memcpy(out->model, (const char *)v.mv_data + 1 + KC_HEX_LEN,
               KC_HEX_LEN);
    }
    mdb_cursor_close(cur);
  }
  kc_store_read_end(r);
  return found;
}

/* Clears the bundle's pending mark if this entry is its latest. */
static kc_err unpend_if_latest(kc_store *s, MDB_txn *txn, const entry *en,
                               char *err) {
  MDB_val k = kcs_hex_val(en->key), v;
  if (mdb_get(txn, s->s3pend, &k, &v) || v.mv_size != 8 ||
      kcs_be64_get(v.mv_data) != en->seq)
    return KC_OK;
  return kcs_del(txn, s->s3pend, &k, err);
}

static kc_err pop_op(kc_store *s, MDB_txn *txn, void *ud, char *err) {
  const entry *en = ud;
  unsigned char sk[8];
  kcs_be64_put(sk, en->seq);
  MDB_val k = {8, sk};
  kc_err e = kcs_del(txn, s->s3queue, &k, err);
  if (!e && (en->kind == KCS_Q_BUNDLE || en->kind == KCS_Q_KV))
    e = unpend_if_latest(s, txn, en, err);
  return e;
}

/* Sets an entry S3 keeps refusing aside (its bundle stays pending). */
static kc_err park_op(kc_store *s, MDB_txn *txn, void *ud, char *err) {
  const entry *en = ud;
  unsigned char sk[8];
  kcs_be64_put(sk, en->seq);
  MDB_val k = {8, sk}, v;
  int rc = mdb_get(txn, s->s3queue, &k, &v);
  if (rc || v.mv_size > 1 + 2 * KC_HEX_LEN)
    return kcs_mdb_err(rc ? rc : MDB_CORRUPTED, "reading the S3 queue", err);
  /* a value read in a write txn lives only until the next update: copy it */
  unsigned char val[1 + 2 * KC_HEX_LEN];
  memcpy(val, v.mv_data, v.mv_size);
  MDB_val copy = {v.mv_size, val};
  kc_err e = kcs_put(txn, s->s3dead, &k, &copy, 0, err);
  return e ? e : kcs_del(txn, s->s3queue, &k, err);
}

/* The first parked entry, copied: 1 found, 0 none, -1 error. */
static int first_parked(kc_store *s, MDB_txn *txn, unsigned char key[8],
                        unsigned char *val, size_t *n) {
  MDB_cursor *cur;
  MDB_val k, v;
  if (mdb_cursor_open(txn, s->s3dead, &cur))
    return -1;
  int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
  int found = rc == MDB_NOTFOUND ? 0 : rc ? -1 : 1;
  if (found == 1 && (k.mv_size != 8 || v.mv_size > *n))
    found = -1;
  if (found == 1) {
    memcpy(key, k.mv_data, 8);
    memcpy(val, v.mv_data, v.mv_size);
    *n = v.mv_size;
  }
  mdb_cursor_close(cur);
  return found;
}

/* At start: what was set aside goes to the end of the queue again. */
static kc_err unpark_op(kc_store *s, MDB_txn *txn, void *ud, char *err) {
  (void)ud;
  unsigned char dk[8], val[1 + 2 * KC_HEX_LEN];
  size_t n = sizeof val;
  kc_err e = KC_OK;
  int found;
  while (!e && (found = first_parked(s, txn, dk, val, &n)) == 1) {
    MDB_val oldk = {8, dk};
    const char *key = (const char *)val + 1;
    if (n < 1 + KC_HEX_LEN)
      e = kc_errf(err, KC_IO, "a parked S3 entry is cut short");
    else if (!(e = kcs_queue_add(s, txn, (char)val[0], key,
                                 n == sizeof val ? key + KC_HEX_LEN : NULL,
                                 err)))
      e = kcs_del(txn, s->s3dead, &oldk, err);
    n = sizeof val;
  }
  if (!e && found < 0)
    e = kc_errf(err, KC_IO, "reading parked S3 entries");
  return e;
}

/* A blob's object as held: a compressed one goes up as its
 * frame, marked x-amz-meta-kcache-encoding: zstd (S3 checks the payload
 * hash of the frame, computed by s3.c); a raw one with its digest as the
 * payload hash. Read-through decodes by that mark. */
kc_err kcs_tier_blob_obj(kc_store_read *r, const char *digest,
                         const void **data, size_t *len, kcs3_put_opts *po) {
  kc_store_enc enc;
  kc_err e = kc_store_blob_get_stored(r, digest, data, len, &enc, NULL);
  *po = (kcs3_put_opts){.if_none_match = 1, .sha256_hex = digest};
  if (!e && enc == KC_STORE_ZSTD) {
    po->sha256_hex = NULL;
    po->encoding = "zstd";
  }
  return e;
}

static kc_err put_obj(kcs_tier *t, const char *obj, const void *data,
                      size_t len, const kcs3_put_opts *po, char *err) {
  uint64_t t0 = kc_clock_mono_us();
  return kcs_tier_done(t, t0, kcs3_put(t->wh, obj, data, len, po, NULL, err));
}

static kc_err put_blob(kcs_tier *t, kc_store_read *r, const char *digest,
                       char *err) {
  const void *data;
  size_t len;
  kcs3_put_opts po;
  kc_err e = kcs_tier_blob_obj(r, digest, &data, &len, &po);
  if (e == KC_NOT_FOUND)
    return KC_OK; /* collected as garbage since: nothing to keep */
  if (e)
    return kc_errf(err, e, "reading blob %s", digest);
  char obj[KCS3_KEY_MAX + 1];
  kcs_tier_obj(t, obj, "blobs", digest);
  e = put_obj(t, obj, data, len, &po, err);
  return e == KC_CONFLICT ? KC_OK : e; /* the same bytes are there */
}

/* Before a manifest goes up, every blob it names must be in the bucket: they
 * were queued before it, but a blob stored before the tier was configured,
 * or one a lifecycle rule or a corrupt copy's removal took away since, was
 * not. A HEAD each (cheap: they are there nearly always). */
static kc_err ensure_blobs(kcs_tier *t, kc_store_read *r, const MDB_val *jv,
                           char *err) {
  kc_manifest *m = NULL;
  kc_err e = kc_manifest_parse(jv->mv_data, jv->mv_size, &m, err);
  for (size_t i = 0; !e && i < m->n_files; i++) {
    char obj[KCS3_KEY_MAX + 1];
    kcs_tier_obj(t, obj, "blobs", m->files[i].sha256);
    uint64_t t0 = kc_clock_mono_us();
    e = kcs_tier_done(t, t0, kcs3_head(t->wh, obj, NULL, NULL, err));
    if (e == KC_NOT_FOUND)
      e = put_blob(t, r, m->files[i].sha256, err);
  }
  kc_manifest_free(m);
  return e;
}

/* S3 already holds a manifest under this key: the first writer won. A
 * different one comes back in *theirs (malloc'd) for kcs_tier_adopt, which
 * runs once the read of the local copy has ended. */
static kc_err manifest_exists(kcs_tier *t, const char *obj, const MDB_val *jv,
                              void **theirs, size_t *theirs_len, char *err) {
  void *data = NULL;
  size_t len = 0;
  uint64_t t0 = kc_clock_mono_us();
  kc_err e = kcs_tier_done(
      t, t0, kcs3_get(t->wh, obj, KCS_MANIFEST_MAX, &data, &len, NULL, err));
  if (!e && (len != jv->mv_size || memcmp(data, jv->mv_data, len) != 0)) {
    *theirs = data;
    *theirs_len = len;
    return KC_OK;
  }
  free(data);
  return e;
}

static kc_err upload_bundle(kcs_tier *t, kc_store_read *r, const entry *en,
                            void **theirs, size_t *theirs_len, char *err) {
  MDB_val k = kcs_hex_val(en->key), jv, mv;
  int rc = mdb_get(r->txn, t->s->bundles, &k, &jv);
  if (rc == MDB_NOTFOUND)
    return KC_OK; /* deleted since; its delete entry follows */
  if (rc || (rc = mdb_get(r->txn, t->s->bundlemeta, &k, &mv)) ||
      mv.mv_size != sizeof(kcs_bundle_meta))
    return kcs_mdb_err(rc ? rc : MDB_CORRUPTED, "reading a queued bundle", err);
  kcs_bundle_meta bm;
  memcpy(&bm, mv.mv_data, sizeof bm);
  char obj[KCS3_KEY_MAX + 1], model[KC_HEX_LEN + 1];
  kcs_tier_obj(t, obj, "bundles", en->key);
  kcs3_put_opts po = {.if_none_match = 1, .content_type = "application/json"};
  kc_err e = ensure_blobs(t, r, &jv, err);
  if (!e)
    e = put_obj(t, obj, jv.mv_data, jv.mv_size, &po, err);
  if (e == KC_CONFLICT)
    e = manifest_exists(t, obj, &jv, theirs, theirs_len, err);
  if (e)
    return e;
  /* then the marker that lists it under its model */
  memcpy(model, bm.model, KC_HEX_LEN);
  model[KC_HEX_LEN] = '\0';
  snprintf(obj, sizeof obj, "%s/models/%s/%s", t->prefix, model, en->key);
  return put_obj(t, obj, "", 0, NULL, err);
}

static kc_err delete_bundle(kcs_tier *t, const entry *en, char *err) {
  char obj[KCS3_KEY_MAX + 1];
  snprintf(obj, sizeof obj, "%s/models/%s/%s", t->prefix, en->model, en->key);
  uint64_t t0 = kc_clock_mono_us();
  kc_err e = kcs_tier_done(t, t0, kcs3_delete(t->wh, obj, err));
  if (e)
    return e;
  kcs_tier_obj(t, obj, "bundles", en->key);
  t0 = kc_clock_mono_us();
  return kcs_tier_done(t, t0, kcs3_delete(t->wh, obj, err));
}

static kc_err upload_one(kcs_tier *t, const entry *en, char *err) {
  if (en->kind == KCS_Q_DELETE)
    return delete_bundle(t, en, err);
  if (en->kind == KCS_Q_KVDEL) /* RESP keys: kv_tier.c */
    return kcs_kv_delete_obj(t, en->key, err);
  kc_store_read *r;
  kc_err e = kc_store_read_begin(t->s, &r);
  if (e)
    return kc_errf(err, e, "beginning a read for the S3 queue");
  void *theirs = NULL; /* the bucket's manifest, when another replica won */
  size_t theirs_len = 0;
  if (en->kind == KCS_Q_BLOB)
    e = put_blob(t, r, en->key, err);
  else if (en->kind == KCS_Q_BUNDLE)
    e = upload_bundle(t, r, en, &theirs, &theirs_len, err);
  else if (en->kind == KCS_Q_KV)
    e = kcs_kv_upload(t, r, en->key, err);
  else
    kcs_tier_logf(t, "error",
                  "S3 queue entry %llu has unknown kind %d; "
                  "dropped",
                  (unsigned long long)en->seq, en->kind);
  kc_store_read_end(r); /* after the PUT: the bytes came from the map */
  if (!e && theirs)
    e = kcs_tier_adopt(t, en->key, theirs, theirs_len, err);
  free(theirs);
  return e;
}

/* ---- the worker: the loop ---- */

/* Waits up to ms, or until stopping, or (kickable) a put queued something. */
static void wait_ms(kcs_tier *t, uint64_t ms, int kickable) {
  struct timespec ts = kc_clock_deadline(CLOCK_MONOTONIC, ms * 1000);
  pthread_mutex_lock(&t->mu);
  while (!(kickable && t->kicked) && !atomic_load(&t->stop) &&
         pthread_cond_timedwait(&t->cv, &t->mu, &ts) == 0)
    ;
  if (kickable)
    t->kicked = 0;
  pthread_mutex_unlock(&t->mu);
}

/* Does S3 honour If-None-Match: *? Two creates of one fresh key tell. */
static kc_err probe_conditional(kcs_tier *t, char *err) {
  unsigned char rnd[16];
  char hex[33], obj[KCS3_KEY_MAX + 1];
  RAND_bytes(rnd, sizeof rnd);
  kc_hex_encode(rnd, sizeof rnd, hex);
  kcs_tier_obj(t, obj, "probe", hex);
  kcs3_put_opts po = {.if_none_match = 1};
  kc_err e = put_obj(t, obj, "", 0, &po, err);
  if (!e)
    e = put_obj(t, obj, "", 0, &po, err);
  if (e && e != KC_CONFLICT)
    return e;
  atomic_store(&t->conditional, e == KC_CONFLICT);
  if (e != KC_CONFLICT)
    kcs_tier_logf(t, "warn",
                  "S3 at %s ignores If-None-Match: leases hold "
                  "per replica only, and concurrent manifests for one key "
                  "are last-writer-wins",
                  t->o.endpoint);
  kcs3_delete(t->wh, obj, NULL);
  return KC_OK;
}

/* An entry S3 refused this many times for a reason retrying will not cure
 * (a 4xx other than the conditional ones) is set aside. */
#define PARK_AFTER 8

/* Counts failures of the entry at the head; parks it when they say so (1:
 * parked). A refusal of the whole bucket (credentials revoked, a policy, the
 * bucket deleted) is not this entry's fault: setting entries aside one by
 * one would empty the queue into s3dead while nothing reaches S3. */
static int count_failure(kcs_tier *t, const entry *en, kc_err e,
                         const char *why, uint64_t *seq, int *fails) {
  if (kcs3_retryable(e) || e == KC_NOMEM || e == KC_STORE_FULL ||
      kcs3_refuses_bucket(t->wh)) {
    *fails = 0; /* S3 or the store is unwell, not this entry */
    return 0;
  }
  *fails = en->seq == *seq ? *fails + 1 : 1;
  *seq = en->seq;
  if (*fails < PARK_AFTER || kcs_write(t->s, park_op, (void *)en, NULL))
    return 0;
  atomic_fetch_add(&t->parked, 1);
  kcs_tier_logf(t, "error",
                "S3 refused queue entry %c %s %d times (%s); set "
                "aside until the next start, the rest of the queue goes on",
                en->kind, en->key, *fails, why);
  *fails = 0;
  return 1;
}

static kc_err step(kcs_tier *t, entry *en, int *idle, char *err) {
  *idle = 0;
  en->seq = 0;
  if (atomic_load(&t->conditional) < 0)
    return probe_conditional(t, err);
  int found = queue_first(t->s, en);
  if (found < 0)
    return kc_errf(err, KC_IO, "cannot read the S3 queue");
  if (found == 0) {
    *idle = 1;
    return KC_OK;
  }
  kcs3_forget_answer(t->wh); /* upload_one may fail before asking S3 */
  kc_err e = upload_one(t, en, err);
  if (!e && !(e = kcs_write(t->s, pop_op, en, err)))
    atomic_fetch_add(&t->uploaded, 1);
  return e;
}

static void *worker_main(void *ud) {
  kcs_tier *t = ud;
  uint64_t backoff = 0, fail_seq = 0;
  int fails = 0;
  while (!atomic_load(&t->stop)) {
    char err[KC_ERRBUF_SIZE] = "";
    int idle;
    entry en;
    kc_err e = step(t, &en, &idle, err);
    if (!e) {
      backoff = 0;
      if (idle)
        wait_ms(t, 1000, 1);
      continue;
    }
    if (en.seq && count_failure(t, &en, e, err, &fail_seq, &fails)) {
      backoff = 0; /* that entry is aside: the next one starts afresh */
      continue;
    }
    if (atomic_load(&t->stop))
      break;
    /* every failure waits and tries the same entry again: order matters */
    backoff = backoff ? backoff * 2 : BACKOFF_MIN_MS;
    if (backoff > BACKOFF_MAX_MS)
      backoff = BACKOFF_MAX_MS;
    unsigned jitter = 0;
    RAND_bytes((unsigned char *)&jitter, sizeof jitter);
    uint64_t wait = backoff / 2 + jitter % (backoff / 2 + 1);
    kcs_tier_logf(t, backoff >= BACKOFF_MAX_MS ? "error" : "warn",
                  "S3 write-through: %s (%s); retrying in %llu ms", err,
                  kc_strerror(e), (unsigned long long)wait);
    wait_ms(t, wait, 0); /* new puts do not cut a backoff short */
  }
  return NULL;
}

/* ---- open, close, stats ---- */

kc_err kc_store_global_init(void) {
  return curl_global_init(CURL_GLOBAL_DEFAULT) ? KC_INTERNAL : KC_OK;
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

static void free_opts(kcs3_opts *o) {
  free((char *)o->endpoint);
  free((char *)o->bucket);
  free((char *)o->region);
  free((char *)o->access_key);
  if (o->secret_key)
    OPENSSL_cleanse((char *)o->secret_key, strlen(o->secret_key));
  free((char *)o->secret_key);
  if (o->session_token)
    OPENSSL_cleanse((char *)o->session_token, strlen(o->session_token));
  free((char *)o->session_token);
}

static kc_err copy_opts(kcs_tier *t, const kc_store_s3 *o, char *err) {
  t->o.endpoint = dup_or_null(o->endpoint);
  t->o.bucket = dup_or_null(o->bucket);
  t->o.region = dup_or_null(o->region);
  t->o.path_style = o->path_style;
  t->o.access_key = dup_or_null(o->access_key);
  t->o.secret_key = dup_or_null(o->secret_key);
  t->o.session_token = dup_or_null(o->session_token);
  t->o.abort_flag = &t->stop;
  t->prefix = strdup(o->prefix && *o->prefix ? o->prefix : "kcache");
  t->parallel = o->parallel ? o->parallel : 16;
  t->max_object = o->max_object_bytes ? o->max_object_bytes : 4ull << 30;
  t->log = o->log;
  t->log_ud = o->log_ud;
  t->idle = calloc(t->parallel, sizeof *t->idle);
  if (!t->prefix || !t->idle || (o->endpoint && !t->o.endpoint) ||
      (o->secret_key && !t->o.secret_key))
    return kc_errf(err, KC_NOMEM, "out of memory");
  return KC_OK;
}

static void init_sync(kcs_tier *t) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&t->pool_mu, NULL);
  pthread_cond_init(&t->pool_cv, NULL);
  pthread_mutex_init(&t->fl_mu, NULL);
  pthread_cond_init(&t->fl_cv, NULL);
  pthread_mutex_init(&t->fill_mu, NULL);
  pthread_cond_init(&t->fill_cv, NULL);
  t->fills_tail = &t->fills;
}

kc_err kcs_tier_open(kc_store *s, const kc_store_s3 *o, char *err) {
  kcs_tier *t = calloc(1, sizeof *t);
  if (!t)
    return kc_errf(err, KC_NOMEM, "out of memory");
  s->tier = t;
  t->s = s;
  init_sync(t);
  atomic_store(&t->conditional, -1);
  atomic_store(&t->up, 1);
  kc_err e = copy_opts(t, o, err);
  if (!e) {
    kcs3_opts wo = t->o;
    wo.timeout_ms = WORKER_TIMEOUT_MS;
    e = kcs3_open(&wo, &t->wh, err); /* checks every option */
  }
  if (!e)
    e = kcs_write(s, unpark_op, NULL, err);
  if (!e && pthread_create(&t->worker, NULL, worker_main, t))
    e = kc_errf(err, KC_NOMEM, "cannot start the S3 queue's thread");
  t->started = !e;
  if (!e && kcs_filler_start(t))
    e = kc_errf(err, KC_NOMEM, "cannot start the S3 fill thread");
  return e;
}

void kcs_tier_close(kc_store *s) {
  kcs_tier *t = s->tier;
  if (!t)
    return;
  atomic_store(&t->stop, 1);
  kcs_tier_kick(s);
  if (t->started)
    pthread_join(t->worker, NULL);
  kcs_filler_stop(t);
  kcs3_close(t->wh);
  for (size_t i = 0; i < t->n_idle; i++)
    kcs3_close(t->idle[i]);
  free(t->idle);
  free(t->prefix);
  free_opts(&t->o);
  pthread_mutex_destroy(&t->mu);
  pthread_cond_destroy(&t->cv);
  pthread_mutex_destroy(&t->pool_mu);
  pthread_cond_destroy(&t->pool_cv);
  pthread_mutex_destroy(&t->fl_mu);
  pthread_cond_destroy(&t->fl_cv);
  pthread_mutex_destroy(&t->fill_mu);
  pthread_cond_destroy(&t->fill_cv);
  free(t);
  s->tier = NULL;
}

kc_err kc_store_tier_stats_get(kc_store *s, kc_store_tier_stats *out) {
  memset(out, 0, sizeof *out);
  kcs_tier *t = s->tier;
  if (!t)
    return KC_OK;
  out->enabled = 1;
  out->up = atomic_load(&t->up);
  out->conditional = atomic_load(&t->conditional);
  out->uploaded = atomic_load(&t->uploaded);
  out->parked = atomic_load(&t->parked);
  out->requests = atomic_load(&t->requests);
  out->errors = atomic_load(&t->errors);
  out->rt_hit = atomic_load(&t->rt_hit);
  out->rt_miss = atomic_load(&t->rt_miss);
  out->rt_corrupt = atomic_load(&t->rt_corrupt);
  out->rt_error = atomic_load(&t->rt_error);
  out->once_refused = atomic_load(&t->once_refused);
  out->once_replaced = atomic_load(&t->once_replaced);
  for (size_t i = 0; i < KC_STORE_S3_BUCKETS; i++)
    out->bounds_s[i] = g_bounds[i];
  for (size_t i = 0; i <= KC_STORE_S3_BUCKETS; i++)
    out->duration[i] = atomic_load(&t->dur[i]);
  out->duration_us_sum = atomic_load(&t->dur_sum_us);
  kc_store_read *r;
  kc_err e = kc_store_read_begin(s, &r);
  if (e)
    return e;
  MDB_stat st;
  if (mdb_stat(r->txn, s->s3queue, &st) == 0)
    out->queue_depth = st.ms_entries;
  kc_store_read_end(r);
  return KC_OK;
}
