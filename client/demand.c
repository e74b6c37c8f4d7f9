/* demand.c: demand feedback from a service (kcache.h, "Demand feedback"):
 * kc_demand_note counts shapes in memory under a mutex, and a background
 * thread per client (started by the first note) sends the counts to kcached
 * in batches (POST /v1/demand) on its own libcurl handle, so that noting never
 * waits on the network; kc_demand_flush and kc_client_free send what is left
 * with a short timeout. kc_warm reports the keys it asked for and did not
 * find (kc_demand_warm_report), and leaves its buckets here so that a later
 * note of a shape no bucket holds also counts as a miss. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "client_internal.h"

#define DEM_CAP 8192      /* slots: twice KC_DEMAND_BUFFER, a power of two */
#define DEM_ROUND_MS 2000 /* the thread sends at least this often */
#define DEM_SEND_MS 2000  /* one POST's most, in the thread */
#define DEM_BATCH 4096    /* elements in one POST (kcached's limit) */
#define DEM_MODELS 16     /* models whose buckets classify notes */

typedef enum { K_SHAPE, K_MISS_SHAPE, K_MISS_KEY } dkind;

typedef struct dslot {
  int used;
  dkind kind;
  char model[KC_HEX_LEN + 1];
  kc_bucket shape; /* sorted by name; K_MISS_KEY: unused */
  char key[KC_HEX_LEN + 1];
  uint64_t count;
} dslot;

typedef struct dmodel {
  char model[KC_HEX_LEN + 1];
  size_t n;
  kc_bucket *buckets;
} dmodel;

struct kcc_demand {
  pthread_mutex_t lock; /* slots, models, stats, stop, wake */
  pthread_cond_t wake;
  dslot *slots;
  size_t n;
  dmodel models[DEM_MODELS];
  size_t n_models;
  kc_demand_stats stats;
  int thread_on, stop;
  pthread_t thread;
  pthread_mutex_t send_lock; /* one sender at a time on easy */
  CURL *easy;
};

/* ---- the buffer ---- */

static int cmp_dim(const void *a, const void *b) {
  return strcmp(((const kc_dim *)a)->name, ((const kc_dim *)b)->name);
}

static uint64_t slot_hash(const dslot *s) {
  uint64_t h = 1469598103934665603ull;
  const unsigned char *p = (const unsigned char *)s->model;
  for (int i = 0; i < KC_HEX_LEN; i++)
    h = (h ^ p[i]) * 1099511628211ull;
  h = (h ^ (unsigned)s->kind) * 1099511628211ull;
  for (size_t i = 0; s->kind != K_MISS_KEY && i < s->shape.n; i++)
    h = (h ^ s->shape.dims[i].value ^ (unsigned char)s->shape.dims[i].name[0]) *
        1099511628211ull;
  for (size_t i = 0; s->kind == K_MISS_KEY && i < 16; i++)
    h = (h ^ (unsigned char)s->key[i]) * 1099511628211ull;
  return h;
}

static int same_shape(const kc_bucket *a, const kc_bucket *b) {
  if (a->n != b->n)
    return 0;
  for (size_t i = 0; i < a->n; i++)
    if (a->dims[i].value != b->dims[i].value ||
        strcmp(a->dims[i].name, b->dims[i].name))
      return 0;
  return 1;
}

static int same(const dslot *a, const dslot *b) {
  if (a->kind != b->kind || memcmp(a->model, b->model, KC_HEX_LEN))
    return 0;
  return a->kind == K_MISS_KEY ? !memcmp(a->key, b->key, KC_HEX_LEN)
                               : same_shape(&a->shape, &b->shape);
}

/* Counts s (under d->lock); full: dropped. */
static void buf_add(struct kcc_demand *d, const dslot *s) {
  size_t i = (size_t)slot_hash(s) & (DEM_CAP - 1);
  while (d->slots[i].used && !same(&d->slots[i], s))
    i = (i + 1) & (DEM_CAP - 1);
  if (d->slots[i].used) {
    d->slots[i].count += s->count;
  } else if (d->n < KC_DEMAND_BUFFER) {
    d->slots[i] = *s;
    d->slots[i].used = 1;
    d->n++;
  } else {
    d->stats.dropped += s->count;
    return;
  }
  d->stats.noted += s->count;
}

/* 1 if a bucket of the same dimensions holds the shape (sorted dims). */
static int held(const dmodel *m, const kc_bucket *s) {
  for (size_t b = 0; b < m->n; b++) {
    kc_bucket k = m->buckets[b];
    qsort(k.dims, k.n, sizeof k.dims[0], cmp_dim);
    int ok = k.n == s->n;
    for (size_t i = 0; ok && i < s->n; i++)
      ok = !strcmp(k.dims[i].name, s->dims[i].name) &&
           k.dims[i].value >= s->dims[i].value;
    if (ok)
      return 1;
  }
  return 0;
}

static const dmodel *known(const struct kcc_demand *d, const char *model) {
  for (size_t i = 0; i < d->n_models; i++)
    if (!memcmp(d->models[i].model, model, KC_HEX_LEN))
      return &d->models[i];
  return NULL;
}

/* ---- sending ---- */

typedef struct capbuf {
  char p[4096];
  size_t len;
} capbuf;

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg) {
  capbuf *b = arg;
  size_t n = size * nmemb, room = sizeof b->p - 1 - b->len;
  memcpy(b->p + b->len, data, n < room ? n : room);
  b->len += n < room ? n : room;
  b->p[b->len] = '\0';
  return n;
}

/* One POST /v1/demand on d->easy (under send_lock). */
static kc_err post(kc_client *c, CURL *h, const char *body, long timeout_ms,
                   char *err) {
  char url[2048];
  if ((size_t)snprintf(url, sizeof url, "%s/v1/demand", c->url) >= sizeof url)
    return kc_errf(err, KC_EINVAL, "URL too long");
  capbuf b = {.len = 0};
  curl_easy_reset(h);
  kcc_http_setup(c, h, timeout_ms);
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
  CURLcode rc = curl_easy_perform(h);
  if (rc != CURLE_OK) /* no deadline: the sender thread outlives a warmup's */
    return kcc_http_curl_error(c, 0, rc, "POST", "/v1/demand", NULL, err);
  kcc_http_resp r = {.body = b.p, .len = b.len};
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
  return r.status == 200 ? KC_OK : kcc_http_error(&r, "POST /v1/demand", err);
}

static json_t *slot_json(const dslot *s) {
  json_int_t n = (json_int_t)(s->count > 4294967295u ? 4294967295u : s->count);
  if (s->kind == K_MISS_KEY)
    return json_pack("{ss sI}", "key", s->key, "count", n);
  return json_pack("{so sI}", "shape", kc_bucket_to_json(&s->shape), "count",
                   n);
}

/* Sends s[0..n) (one model) in POSTs of at most DEM_BATCH elements. */
static kc_err send_model(kc_client *c, CURL *h, const dslot *s, size_t n,
                         long timeout_ms, uint64_t *sent, char *err) {
  kc_err first = KC_OK;
  for (size_t i = 0; i < n; i += DEM_BATCH) {
    json_t *shapes = json_array(), *misses = json_array();
    uint64_t count = 0;
    for (size_t j = i; j < n && j < i + DEM_BATCH; j++) {
      json_array_append_new(s[j].kind == K_SHAPE ? shapes : misses,
                            slot_json(&s[j]));
      count += s[j].count;
    }
    json_t *o = json_pack("{ss so so}", "model", s[0].model, "shapes", shapes,
                          "misses", misses);
    char *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    kc_err e = body ? post(c, h, body, timeout_ms, err)
                    : kc_errf(err, KC_NOMEM, "out of memory");
    free(body);
    if (!e)
      *sent += count;
    else if (!first)
      first = e;
  }
  return first;
}

static int cmp_slot_model(const void *a, const void *b) {
  return memcmp(((const dslot *)a)->model, ((const dslot *)b)->model,
                KC_HEX_LEN);
}

/* Takes what is buffered and sends it; what fails is counted and dropped
 * (telemetry is not worth a retry queue). */
static kc_err send_all(kc_client *c, struct kcc_demand *d, long timeout_ms,
                       char *err) {
  pthread_mutex_lock(&d->send_lock);
  pthread_mutex_lock(&d->lock);
  size_t n = 0;
  dslot *s = d->n ? malloc(d->n * sizeof *s) : NULL;
  for (size_t i = 0; s && i < DEM_CAP; i++)
    if (d->slots[i].used)
      s[n++] = d->slots[i];
  if (s) {
    memset(d->slots, 0, DEM_CAP * sizeof *d->slots);
    d->n = 0;
  }
  pthread_mutex_unlock(&d->lock);
  kc_err first = KC_OK;
  uint64_t sent = 0, total = 0;
  if (n)
    qsort(s, n, sizeof *s, cmp_slot_model);
  for (size_t i = 0; i < n;) {
    size_t j = i + 1;
    while (j < n && !memcmp(s[j].model, s[i].model, KC_HEX_LEN))
      j++;
    kc_err e = send_model(c, d->easy, s + i, j - i, timeout_ms, &sent, err);
    if (e && !first)
      first = e;
    i = j;
  }
  for (size_t i = 0; i < n; i++)
    total += s[i].count;
  free(s);
  pthread_mutex_lock(&d->lock);
  d->stats.sent += sent;
  d->stats.failed += total - sent;
  pthread_mutex_unlock(&d->lock);
  pthread_mutex_unlock(&d->send_lock);
  return first;
}

static void *sender(void *arg) {
  kc_client *c = arg;
  struct kcc_demand *d = c->demand;
  pthread_mutex_lock(&d->lock);
  while (!d->stop) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += DEM_ROUND_MS / 1000;
    pthread_cond_timedwait(&d->wake, &d->lock, &ts);
    if (d->stop || !d->n)
      continue;
    pthread_mutex_unlock(&d->lock);
    send_all(c, d, DEM_SEND_MS, NULL);
    pthread_mutex_lock(&d->lock);
  }
  pthread_mutex_unlock(&d->lock);
  return NULL;
}

/* ---- the handle's part ---- */

/* c->demand, made at the first use; NULL when out of memory. */
static struct kcc_demand *demand_of(kc_client *c) {
  struct kcc_demand *d = atomic_load(&c->demand);
  if (d)
    return d;
  d = calloc(1, sizeof *d);
  if (!d || !(d->slots = calloc(DEM_CAP, sizeof *d->slots)) ||
      !(d->easy = curl_easy_init())) {
    if (d)
      free(d->slots);
    free(d);
    return NULL;
  }
  pthread_mutex_init(&d->lock, NULL);
  pthread_mutex_init(&d->send_lock, NULL);
  pthread_cond_init(&d->wake, NULL);
  struct kcc_demand *none = NULL;
  if (atomic_compare_exchange_strong(&c->demand, &none, d))
    return d;
  curl_easy_cleanup(d->easy); /* another thread made one first */
  pthread_mutex_destroy(&d->lock);
  pthread_mutex_destroy(&d->send_lock);
  pthread_cond_destroy(&d->wake);
  free(d->slots);
  free(d);
  return none;
}

void kcc_demand_free(kc_client *c) {
  struct kcc_demand *d = atomic_load(&c->demand);
  if (!d)
    return;
  pthread_mutex_lock(&d->lock);
  d->stop = 1;
  pthread_cond_signal(&d->wake);
  pthread_mutex_unlock(&d->lock);
  if (d->thread_on)
    pthread_join(d->thread, NULL);
  if (c->url)
    send_all(c, d, KCC_DEMAND_FREE_MS, NULL);
  atomic_store(&c->demand, NULL);
  curl_easy_cleanup(d->easy);
  pthread_mutex_destroy(&d->lock);
  pthread_mutex_destroy(&d->send_lock);
  pthread_cond_destroy(&d->wake);
  for (size_t i = 0; i < d->n_models; i++)
    free(d->models[i].buckets);
  free(d->slots);
  free(d);
}

/* ---- public ---- */

/* Checks and sorts a shape by the bucket rules (kc_key_validate's). */
static kc_err check_shape(const char *model, const kc_bucket *shape,
                          kc_bucket *out) {
  kc_key_fields f;
  if (!model || !shape || !kc_is_hex64(model) || shape->n > KC_MAX_DIMS)
    return KC_EINVAL;
  memset(&f, 0, sizeof f);
  memcpy(f.model, model, KC_HEX_LEN);
  memset(f.build, '0', KC_HEX_LEN);
  memcpy(f.arch, "sm_80", 6);
  f.bucket = *shape;
  if (kc_key_validate(&f, NULL))
    return KC_EINVAL;
  *out = *shape;
  qsort(out->dims, out->n, sizeof out->dims[0], cmp_dim);
  return KC_OK;
}

kc_err kc_demand_note(kc_client *c, const char *model, const kc_bucket *shape) {
  dslot s = {.kind = K_SHAPE, .count = 1};
  if (!c || check_shape(model, shape, &s.shape))
    return KC_EINVAL;
  if (!c->url)
    return KC_OK;
  struct kcc_demand *d = demand_of(c);
  if (!d)
    return KC_NOMEM;
  memcpy(s.model, model, KC_HEX_LEN + 1);
  pthread_mutex_lock(&d->lock);
  uint64_t dropped = d->stats.dropped;
  buf_add(d, &s);
  const dmodel *m = known(d, model);
  if (m && !held(m, &s.shape)) {
    s.kind = K_MISS_SHAPE;
    buf_add(d, &s);
  }
  int busy = d->stats.dropped != dropped;
  if (!d->thread_on && !d->stop)
    d->thread_on = !pthread_create(&d->thread, NULL, sender, c);
  if (d->n >= KC_DEMAND_BUFFER / 2)
    pthread_cond_signal(&d->wake);
  pthread_mutex_unlock(&d->lock);
  return busy ? KC_BUSY : KC_OK;
}

kc_err kc_demand_flush(kc_client *c, long timeout_ms, char *err) {
  struct kcc_demand *d = c ? atomic_load(&c->demand) : NULL;
  if (!d || !c->url)
    return KC_OK;
  return send_all(c, d, timeout_ms > 0 ? timeout_ms : KCC_DEMAND_FREE_MS, err);
}

void kc_demand_get_stats(kc_client *c, kc_demand_stats *out) {
  struct kcc_demand *d = atomic_load(&c->demand);
  memset(out, 0, sizeof *out);
  if (!d)
    return;
  pthread_mutex_lock(&d->lock);
  *out = d->stats;
  pthread_mutex_unlock(&d->lock);
}

/* Remembers the warmup's buckets for the model (under d->lock). */
static void learn_buckets(struct kcc_demand *d, const kc_warmup *w) {
  dmodel *m = (dmodel *)known(d, w->model_hash);
  if (!m && d->n_models < DEM_MODELS)
    m = &d->models[d->n_models++];
  if (!m)
    return;
  kc_bucket *b = malloc((w->n_buckets + 1) * sizeof *b);
  if (!b)
    return;
  memcpy(b, w->buckets, w->n_buckets * sizeof *b);
  free(m->buckets);
  memcpy(m->model, w->model_hash, KC_HEX_LEN + 1);
  m->buckets = b;
  m->n = w->n_buckets;
}

void kc_demand_warm_report(kc_client *c, const kc_warmup *w,
                           const kc_warm_report *r) {
  if (!c || !w || !r || !c->url)
    return;
  struct kcc_demand *d = demand_of(c);
  if (!d)
    return;
  pthread_mutex_lock(&d->lock);
  learn_buckets(d, w);
  /* A server that could not be asked did not say the keys were missing. */
  for (size_t i = 0; !r->server_down && i < r->n_items; i++) {
    const kc_warm_item *it = &r->items[i];
    if (it->status == KC_WARM_HIT_LOCAL || it->status == KC_WARM_HIT_REMOTE)
      continue;
    dslot s = {.kind = K_MISS_KEY, .count = 1};
    memcpy(s.model, w->model_hash, KC_HEX_LEN + 1);
    memcpy(s.key, it->key, KC_HEX_LEN + 1);
    buf_add(d, &s);
  }
  pthread_mutex_unlock(&d->lock);
}

kc_err kc_client_demand_get(kc_client *c, const char *model, char **json,
                            char *err) {
  char path[128];
  kcc_http_resp r;
  *json = NULL;
  if (!kc_is_hex64(model))
    return kc_errf(err, KC_EINVAL, "model: must be 64 lowercase hex digits");
  snprintf(path, sizeof path, "/v1/models/%s/demand", model);
  kc_err e = kcc_http_do(c, "GET", path, NULL, 0, &r, err);
  if (e)
    return e;
  if (r.status != 200)
    e = kcc_http_error(&r, path, err);
  else if (!(*json = r.body ? r.body : strdup("")))
    e = kc_errf(err, KC_NOMEM, "out of memory");
  else
    r.body = NULL; /* handed to the caller */
  kcc_http_resp_free(&r);
  return e;
}
