/* warm.c: kc_warm, fetch-or-build of every (bucket, arch) of a warmup
 * manifest (docs/DESIGN.md, "Client warmup"): local cache, one batch lookup,
 * parallel verified fetches, single-flight builds through leases, a deadline
 * over all of it, and local builds when the server is down. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <errno.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "client_internal.h"
#include "kc_gpu.h"

#define KC_MAX_BUILD_JOBS 64
/* Beside a stand-in's files under --out: the arch its code is for. */
#define KCC_ARCH_FILE "kcache-arch"

typedef struct wctx {
  kc_client *c;
  const kc_warmup *w;
  const kc_warm_opts *o;
  kc_warm_report *rep;
  kc_key_fields *fields;
  kc_key_fields base;  /* the keys' fields without bucket and arch */
  kcc_compat cp;       /* the compatible-arch fallback (compat.c) */
  int cp_ready;        /* cp was set up (lazily: only when a key is missing) */
  int defer_compat;    /* --prefer-build with a builder: compat bundles are
                          fetched but kept as spares until the end */
  kc_manifest **ms;    /* ready bundles, per item */
  kc_manifest **spare; /* defer_compat: the stand-in, per item */
  char *pending;       /* 1 while an item is neither ready nor failed */
  char *remote_bad;    /* the server's copy failed verification: BAD_* */
  char *waiting;       /* another builder holds the lease */
  int *out_made;       /* --out: 1 when this run made the item's directory
                          (only those are removed again, or written without
                          looking for what an earlier warm left there) */
  int64_t *retry_at;   /* waiting: when its lease may have lapsed (ms) */
  int64_t *build_at;   /* waiting: when to build it here anyway (ms; 0 never) */
  kc_warm_status fetched_as; /* what a served bundle counts as now */
  kc_err remote_err; /* why the last lookup failed (KC_OK: it did not) */
  char remote_why[KC_ERRBUF_SIZE];
  int server_ok;
  int cant_write; /* an upload was refused (401/403): none tried again */
  char cant_why[KC_ERRBUF_SIZE];
  int jobs; /* concurrent builds */
  int64_t t0;
  size_t done;
} wctx;

/* Why an item's copy on the server is not used. BAD_BLOB: a blob it served
 * did not hash to its name; after the rebuild the blobs are offered back,
 * which makes kcached replace a copy that rotted on its disk. */
enum { BAD_NONE, BAD_OTHER, BAD_BLOB };

static const char *const status_names[KC_WARM_N_STATUS] = {
    "hit-local", "hit-remote", "built", "waited", "failed", "hit-compat"};

const char *kc_warm_status_name(kc_warm_status s) {
  return (unsigned)s < KC_WARM_N_STATUS ? status_names[s] : "unknown";
}

/* ---- keys ---- */

/* cache: where the NVRTC version is remembered (NULL: load NVRTC to ask). */
static kc_err pin_nvrtc(kc_key_fields *f, const kc_warmup *w, const char *cache,
                        char *err) {
  char ver[16] = "", e2[KC_ERRBUF_SIZE];
  const char *pinned = NULL, *cuda = NULL;
  for (size_t i = 0; i < w->n_tools; i++) {
    if (!strcmp(w->tools[i].name, "nvrtc"))
      pinned = w->tools[i].value;
    if (!strcmp(w->tools[i].name, "cuda"))
      cuda = w->tools[i].value;
  }
  if (!pinned && kc_gpu_nvrtc_version_cached(cache, ver, e2) != KC_OK)
    return kc_errf(err, KC_NO_NVRTC,
                   "%s; the NVRTC version is part of every key: install the "
                   "toolkit, or pin \"nvrtc\" and \"cuda\" in the manifest's "
                   "toolchain to fetch without one",
                   e2);
  kc_err e = kc_key_set_tool(f, "nvrtc", pinned ? pinned : ver, err);
  if (!e && !cuda)
    e = kc_key_set_tool(f, "cuda", pinned ? pinned : ver, err);
  return e;
}

/* PTX runs through the driver's JIT: its version is part of the key. */
static kc_err pin_driver(kc_key_fields *f, const kc_warmup *w, char *err) {
  char v[32], e2[KC_ERRBUF_SIZE];
  kc_gpu_info gi;
  for (size_t i = 0; i < w->n_tools; i++)
    if (!strcmp(w->tools[i].name, "driver"))
      return KC_OK;
  if (kc_gpu_detect(&gi, e2) != KC_OK)
    return kc_errf(err, KC_NO_DRIVER,
                   "arch %s is PTX, whose key holds the driver version: %s "
                   "(or pin \"driver\" in the toolchain)",
                   f->arch, e2);
  snprintf(v, sizeof v, "%d.%d", gi.driver_version / 1000,
           gi.driver_version % 1000 / 10);
  return kc_key_set_tool(f, "driver", v, err);
}

static kc_err resolve_archs(const kc_warmup *w, const char *const *archs,
                            size_t n_archs, char (**out)[KC_ARCH_MAX + 1],
                            size_t *n, char *err) {
  kc_gpu_info gi;
  char e2[KC_ERRBUF_SIZE];
  size_t m = n_archs ? n_archs : w->n_archs;
  if (!m && kc_gpu_detect(&gi, e2) != KC_OK)
    return kc_errf(err, KC_NO_DRIVER,
                   "the manifest names no archs and there is no GPU to "
                   "detect (%s): give --arch",
                   e2);
  if (!m)
    m = 1;
  *out = calloc(m, sizeof **out);
  if (!*out)
    return kc_errf(err, KC_NOMEM, "out of memory");
  for (size_t i = 0; i < m; i++) {
    const char *a = n_archs      ? archs[i]
                    : w->n_archs ? w->archs[i]
                                 : gi.devices[0].arch;
    if (!kc_arch_valid(a)) {
      free(*out);
      return kc_errf(err, KC_EINVAL, "arch '%.20s': not a valid target", a);
    }
    snprintf((*out)[i], KC_ARCH_MAX + 1, "%s", a);
  }
  *n = m;
  return KC_OK;
}

static kc_err base_fields(const kc_warmup *w, const char *nvrtc_cache,
                          kc_key_fields *f, char *err) {
  memset(f, 0, sizeof *f);
  memcpy(f->model, w->model_hash, sizeof f->model);
  for (size_t i = 0; i < w->n_tools; i++)
    f->tools[i] = w->tools[i];
  f->n_tools = w->n_tools;
  kc_err e = kcc_build_hash(w, f->build, err);
  if (!e && w->n_kernels)
    e = pin_nvrtc(f, w, nvrtc_cache, err);
  return e;
}

/* <cache dir>/nvrtc-version: the NVRTC version of this host's toolkit. */
static void nvrtc_cache_of(const kc_client *c, char out[PATH_MAX]) {
  snprintf(out, PATH_MAX, "%s/nvrtc-version", c->cache_dir);
}

static kc_err warm_keys(const kc_warmup *w, const char *nvrtc_cache,
                        const char *const *archs, size_t n_archs,
                        kc_key_fields **fields, size_t *n,
                        kc_key_fields *base_out, char *err) {
  char(*av)[KC_ARCH_MAX + 1] = NULL;
  size_t na = 0;
  kc_key_fields base;
  *fields = NULL;
  *n = 0;
  kc_err e = resolve_archs(w, archs, n_archs, &av, &na, err);
  if (e)
    return e;
  if (!(e = base_fields(w, nvrtc_cache, &base, err)) &&
      !(*fields = calloc(w->n_buckets * na + 1, sizeof **fields)))
    e = kc_errf(err, KC_NOMEM, "out of memory");
  for (size_t b = 0; !e && b < w->n_buckets; b++) {
    for (size_t a = 0; !e && a < na; a++) {
      kc_key_fields *f = &(*fields)[b * na + a];
      *f = base;
      f->bucket = w->buckets[b];
      snprintf(f->arch, sizeof f->arch, "%s", av[a]);
      if (!strncmp(f->arch, "compute_", 8))
        e = pin_driver(f, w, err);
      if (!e)
        e = kc_key_validate(f, err);
    }
  }
  free(av);
  if (e) {
    free(*fields);
    *fields = NULL;
    return e;
  }
  *n = w->n_buckets * na;
  if (base_out)
    *base_out = base;
  return KC_OK;
}

kc_err kc_warm_keys(const kc_warmup *w, const char *const *archs,
                    size_t n_archs, kc_key_fields **fields, size_t *n,
                    char *err) {
  return warm_keys(w, NULL, archs, n_archs, fields, n, NULL, err);
}

kc_err kc_warm_bundle(kc_client *c, const kc_warmup *w, const kc_bucket *bucket,
                      const char *arch, kc_manifest **out, char *err) {
  kc_key_fields f;
  char key[KC_HEX_LEN + 1];
  *out = NULL;
  if (!kc_arch_valid(arch))
    return kc_errf(err, KC_EINVAL, "arch: not a valid target");
  char cache[PATH_MAX];
  nvrtc_cache_of(c, cache);
  kc_err e = base_fields(w, cache, &f, err);
  if (e)
    return e;
  f.bucket = *bucket;
  snprintf(f.arch, sizeof f.arch, "%s", arch);
  if (!strncmp(arch, "compute_", 8) && (e = pin_driver(&f, w, err)))
    return e;
  if ((e = kc_key_compute(&f, key, err)))
    return e;
  if (kc_cache_bundle_get(c, key, out, NULL) == KC_OK)
    return KC_OK;
  return kc_client_has_server(c)
             ? kc_client_pull(c, key, out, err)
             : kc_errf(err, KC_NOT_FOUND, "bundle %.12s... is not cached", key);
}

/* ---- bookkeeping ---- */

static double since(const wctx *x) { return (kcc_now_ms() - x->t0) / 1000.0; }

static uint64_t bundle_bytes(const kc_manifest *m) {
  uint64_t b = 0;
  for (size_t i = 0; i < m->n_files; i++)
    b += m->files[i].size;
  return b;
}

static void progress(wctx *x, size_t i) {
  x->done++;
  if (x->o->progress) {
    kc_warm_progress p = {x->done, x->rep->n_items, &x->rep->items[i]};
    x->o->progress(&p, x->o->progress_arg);
  }
}

/* Bundle m is a stand-in for item i's key (another arch). */
static int is_compat(const wctx *x, size_t i, const kc_manifest *m) {
  return strcmp(m->key, x->rep->items[i].key) != 0;
}

/* Item i is ready with bundle m (ownership moves to x). */
static void ready(wctx *x, size_t i, kc_warm_status s, kc_manifest *m) {
  kc_warm_item *it = &x->rep->items[i];
  if (is_compat(x, i, m)) {
    s = KC_WARM_HIT_COMPAT;
    snprintf(it->compat_arch, sizeof it->compat_arch, "%s", m->fields.arch);
    memcpy(it->compat_key, m->key, sizeof it->compat_key);
  }
  x->ms[i] = m;
  x->pending[i] = 0;
  x->waiting[i] = 0;
  it->status = s;
  it->err = KC_OK;
  it->bytes = bundle_bytes(m);
  it->n_files = m->n_files;
  it->seconds = since(x);
  progress(x, i);
}

static void failed(wctx *x, size_t i, kc_err e, const char *msg) {
  kc_warm_item *it = &x->rep->items[i];
  x->pending[i] = 0;
  x->waiting[i] = 0;
  it->status = KC_WARM_FAILED;
  it->err = e;
  snprintf(it->message, sizeof it->message, "%s", msg);
  it->seconds = since(x);
  progress(x, i);
}

static int deadline_passed(const wctx *x) {
  return x->c->deadline_ms && kcc_now_ms() >= x->c->deadline_ms;
}

/* 0: no deadline; else what is left, never 0 (a passed deadline must not
 * read as none). */
static double seconds_left(const wctx *x) {
  if (!x->c->deadline_ms)
    return 0;
  double s = (x->c->deadline_ms - kcc_now_ms()) / 1000.0;
  return s > 0.001 ? s : 0.001;
}

static void server_down(wctx *x, const char *why) {
  if (!x->server_ok)
    return;
  x->server_ok = 0;
  x->rep->server_down = 1;
  snprintf(x->rep->warning, sizeof x->rep->warning,
           "kcached unreachable (%.400s): building locally, nothing uploaded",
           why);
}

/* The first 401 or 403 of this warm, whatever asked: --strict fails on
 * it (a CI prepopulation must not go green with kcached left empty). */
static void refused(wctx *x, kc_err e, const char *why) {
  if ((e != KC_UNAUTHORIZED && e != KC_FORBIDDEN) || x->rep->refused)
    return;
  x->rep->refused = e;
  snprintf(x->rep->refused_why, sizeof x->rep->refused_why, "%.400s", why);
}

/* The first server problem that is not an outage (a token without the
 * role, a bad answer) is worth a line for the operator. */
static void warn(wctx *x, const char *why) {
  if (!x->rep->warning[0])
    snprintf(x->rep->warning, sizeof x->rep->warning,
             "kcached refused (%.400s): building locally", why);
}

static int is_down(kc_err e) {
  return e == KC_UNAVAILABLE || e == KC_TIMEOUT || e == KC_NOT_READY;
}

/* Why the server's copy of item i was not used (a refused manifest, a
 * failed fetch): kept so that the item, failed or built here, says so. */
static void note(wctx *x, size_t i, kc_err e, const char *why) {
  kc_warm_item *it = &x->rep->items[i];
  it->err = e;
  snprintf(it->message, sizeof it->message, "%s", why);
}

/* The server problem behind item i not being ready: its own note, else the
 * lookup's failure; KC_OK when the server simply lacks it. */
static kc_err remote_cause(const wctx *x, size_t i, const char **why) {
  const kc_warm_item *it = &x->rep->items[i];
  if (it->err) {
    *why = it->message;
    return it->err;
  }
  *why = x->remote_why;
  return x->remote_err;
}

/* ---- phase 1: local cache ---- */

static void phase_local(wctx *x) {
  /* An empty cache (a new replica): one look at bundles/ instead of a
   * failed open per key (1024 of them for 1024 bundles). */
  if (x->rep->n_items > 8 && !kcc_cache_has_bundles(x->c))
    return;
  for (size_t i = 0; i < x->rep->n_items; i++) {
    kc_manifest *m = NULL;
    char e2[KC_ERRBUF_SIZE];
    kc_err e = kc_cache_bundle_get(x->c, x->rep->items[i].key, &m, e2);
    if (e == KC_OK)
      ready(x, i, KC_WARM_HIT_LOCAL, m);
    else if (e != KC_NOT_FOUND) /* damaged here: say so, fetch it again */
      snprintf(x->rep->items[i].message, KC_ERRBUF_SIZE, "%s", e2);
  }
}

/* ---- phase 2: one lookup, parallel fetches ---- */

/* A fetched bundle for item i: ready, or with --prefer-build a stand-in
 * kept for the end (its blobs are cached now, so it costs nothing then). */
static void got_bundle(wctx *x, size_t i, kc_manifest *m) {
  if (x->defer_compat && is_compat(x, i, m)) {
    kc_manifest_free(x->spare[i]);
    x->spare[i] = m;
    return;
  }
  ready(x, i, x->fetched_as, m);
}

/* After the fetch: each bundle whose blobs all came (ok[], in the order
 * they were asked for) is stored and used; e and why: the fetch's first
 * failure. */
static void take_fetched(wctx *x, kc_manifest **found, const size_t *idx,
                         size_t n, const char *ok, kc_err e, const char *why) {
  /* first the bundles whose blobs all came, stored together */
  const kc_manifest **put = calloc(n + 1, sizeof *put);
  kc_err *res = calloc(n + 1, sizeof *res);
  char *all = calloc(n + 1, 1);
  size_t np = 0;
  if (!put || !res || !all) {
    free(put);
    free(res);
    free(all);
    for (size_t k = 0; k < n; k++)
      if (found[k] && !is_compat(x, idx[k], found[k]))
        note(x, idx[k], KC_NOMEM, "out of memory");
    return;
  }
  for (size_t k = 0; k < n; k++) {
    if (!found[k])
      continue;
    all[k] = 1;
    for (size_t j = 0; j < found[k]->n_files; j++)
      all[k] &= *ok++;
    if (all[k])
      put[np++] = found[k];
  }
  kcc_cache_bundles_put(x->c, put, np, res);
  np = 0;
  for (size_t k = 0; k < n; k++) {
    if (!found[k])
      continue;
    if (all[k] && res[np++] == KC_OK) {
      got_bundle(x, idx[k], found[k]);
      found[k] = NULL;
      continue;
    }
    if (is_compat(x, idx[k], found[k]))
      continue; /* a stand-in that failed: the key itself is not at fault */
    if (e == KC_DIGEST_MISMATCH)
      x->remote_bad[idx[k]] = BAD_BLOB; /* never used; rebuilt below */
    if (e)
      note(x, idx[k], e, why);
  }
  free(put);
  free(res);
  free(all);
}

/* --out: the directory of item i's bundle, DIR/<arch>/<bucket>. */
static void out_dir_of(const wctx *x, size_t i, char *dir, size_t size) {
  char label[256];
  const kc_warm_item *it = &x->rep->items[i];
  kc_bucket_label(&it->bucket, label, sizeof label);
  snprintf(dir, size, "%s/%s/%s", x->o->out_dir, it->arch, label);
}

/* The directories under --out of the bundles a fetch brings, made on a
 * second thread while the fetch runs: each is a new inode, which on a busy
 * file system waits as long as a blob's file, and they need not wait for
 * the blobs. Empty until materialize_all links the files in; one whose
 * bundle did not come is removed there. */
typedef struct dirs_job {
  wctx *x;
  kc_manifest **found;
  const size_t *idx;
  size_t n;
  pthread_t th;
  int on;
} dirs_job;

static void *dirs_run(void *arg) {
  dirs_job *j = arg;
  char dir[PATH_MAX];
  for (size_t k = 0; k < j->n; k++) {
    if (!j->found[k] || j->x->out_made[j->idx[k]])
      continue;
    out_dir_of(j->x, j->idx[k], dir, sizeof dir);
    int r = mkdir(dir, 0755);
    if (r != 0 && errno == ENOENT) { /* its parent first: DIR/<arch> */
      char *slash = strrchr(dir, '/');
      *slash = '\0';
      r = kcc_mkdirs(dir, NULL) == KC_OK ? 0 : -1;
      *slash = '/';
      r = r == 0 ? mkdir(dir, 0755) : -1;
    }
    j->x->out_made[j->idx[k]] = r == 0;
  }
  return NULL;
}

static void dirs_start(dirs_job *j) {
  size_t m = 0;
  for (size_t k = 0; k < j->n; k++)
    m += j->found[k] != NULL;
  j->on = j->x->o->out_dir && m >= 32 &&
          pthread_create(&j->th, NULL, dirs_run, j) == 0;
}

/* The served bundles' blobs, all at once: one pool of transfers. */
static void fetch_found(wctx *x, kc_manifest **found, size_t *idx, size_t n) {
  size_t nd = 0;
  for (size_t k = 0; k < n; k++)
    nd += found[k] ? found[k]->n_files : 0;
  const kc_file **d = calloc(nd + 1, sizeof *d);
  char *ok = calloc(nd + 1, 1), e2[KC_ERRBUF_SIZE] = "";
  uint64_t got = 0;
  if (!d || !ok) {
    free(d);
    free(ok);
    return;
  }
  nd = 0;
  for (size_t k = 0; k < n; k++)
    for (size_t j = 0; found[k] && j < found[k]->n_files; j++)
      d[nd++] = &found[k]->files[j];
  /* ok[] says which blobs are cached now: no second look at each */
  dirs_job dj = {.x = x, .found = found, .idx = idx, .n = n};
  dirs_start(&dj);
  kc_err e = kcc_fetch_blobs(x->c, d, nd, ok, &got, e2);
  if (dj.on) /* joined: builds fork, single-threaded */
    pthread_join(dj.th, NULL);
  free(d);
  x->rep->bytes_fetched += got;
  if (is_down(e))
    server_down(x, e2);
  take_fetched(x, found, idx, n, ok, e, e2);
  free(ok);
}

/* A lookup that failed: remembered for the report of every key it left
 * pending (one warning, not one line per key). */
static void lookup_failed(wctx *x, kc_err e, const char *why) {
  x->remote_err = e;
  snprintf(x->remote_why, sizeof x->remote_why, "%s", why);
  refused(x, e, why);
  if (is_down(e))
    server_down(x, why);
  else if (e == KC_DEADLINE && !x->rep->warning[0])
    snprintf(x->rep->warning, sizeof x->rep->warning,
             "kcached did not answer before the deadline (%.400s)", why);
  else
    warn(x, why);
}

/* A served manifest for item i's own key that failed validation: never
 * used, and said so. */
static void note_refused(wctx *x, size_t i, kc_err refused) {
  char why[KC_ERRBUF_SIZE];
  snprintf(why, sizeof why, "the server's manifest was refused: %s",
           kc_strerror(refused));
  note(x, i, refused, why);
}

/* A stalled kcached must not eat the whole deadline: the lookup gets half
 * of what is left (a second at least), so that when it does not answer, the
 * local builds still have the other half. */
static long lookup_cap_ms(const wctx *x) {
  if (!x->c->deadline_ms)
    return 0;
  int64_t half = (x->c->deadline_ms - kcc_now_ms()) / 2;
  return half > 1000 ? (long)half : 1000;
}

/* The keys of one POST /v1/lookup: each item's own, then its stand-ins
 * best first (compat.c), all in the same round trip. */
typedef struct lookup_set {
  size_t n; /* keys */
  const char *keys[KC_LOOKUP_MAX];
  size_t item[KC_LOOKUP_MAX];  /* the item each key is for */
  char (*alt)[KC_HEX_LEN + 1]; /* stand-in keys (KC_LOOKUP_MAX) */
  size_t n_alt;
  char scratch[KCC_COMPAT_MAX][KC_HEX_LEN + 1]; /* one item's stand-ins */
} lookup_set;

/* Per item, the first key found (its own, else the best stand-in): moved
 * out of found into pick. Returns the number of items. */
static size_t pick_found(wctx *x, lookup_set *s, kc_manifest **found,
                         const kc_err *refused, kc_manifest **pick,
                         size_t *idx) {
  size_t m = 0;
  for (size_t j = 0; j < s->n; j++) {
    size_t i = s->item[j];
    int own = s->keys[j] == x->rep->items[i].key;
    if (own) { /* a new item starts */
      idx[m] = i;
      pick[m++] = NULL;
      if (refused[j])
        note_refused(x, i, refused[j]);
    }
    if (found[j] && !pick[m - 1]) {
      pick[m - 1] = found[j];
      found[j] = NULL;
    }
  }
  return m;
}

static void lookup_run(wctx *x, lookup_set *s) {
  kc_manifest **found = calloc(s->n + 1, sizeof *found);
  kc_manifest **pick = calloc(s->n + 1, sizeof *pick);
  kc_err *refused = calloc(s->n + 1, sizeof *refused);
  size_t *idx = calloc(s->n + 1, sizeof *idx);
  char e2[KC_ERRBUF_SIZE] = "";
  if (found && pick && refused && idx) {
    x->c->request_cap_ms = lookup_cap_ms(x);
    kc_err e = kcc_lookup_checked(x->c, s->keys, s->n, found, refused, e2);
    x->c->request_cap_ms = 0;
    if (e) {
      lookup_failed(x, e, e2);
    } else {
      x->remote_err = KC_OK;
      size_t m = pick_found(x, s, found, refused, pick, idx);
      fetch_found(x, pick, idx, m);
    }
  }
  for (size_t k = 0; found && pick && k < s->n; k++) {
    kc_manifest_free(found[k]);
    kc_manifest_free(pick[k]);
  }
  free(idx);
  free(refused);
  free(pick);
  free(found);
  s->n = s->n_alt = 0;
}

/* The compatible-arch fallback, set up when first needed (detecting the
 * device costs a driver load). */
static kcc_compat *compat(wctx *x) {
  if (!x->cp_ready && !x->o->no_compat) {
    x->cp_ready = 1;
    if (kcc_compat_init(&x->cp, x->o, &x->base, NULL) != KC_OK)
      memset(&x->cp, 0, sizeof x->cp); /* device_arch checked in setup */
  }
  return x->cp_ready ? &x->cp : NULL;
}

/* Adds item i (its key and, with alts, its stand-ins) to s, running s
 * first when they would not fit. */
static void lookup_add(wctx *x, lookup_set *s, size_t i, int alts) {
  char(*alt)[KC_HEX_LEN + 1] = s->scratch;
  const kcc_compat *cp = x->spare[i] || !alts ? NULL : compat(x);
  size_t na =
      cp ? kcc_compat_keys(cp, &x->base, &x->fields[i], alt, KCC_COMPAT_MAX)
         : 0;
  if (s->n + 1 + na > KC_LOOKUP_MAX)
    lookup_run(x, s);
  s->item[s->n] = i;
  s->keys[s->n++] = x->rep->items[i].key;
  for (size_t k = 0; k < na; k++) {
    memcpy(s->alt[s->n_alt], alt[k], sizeof alt[k]);
    s->item[s->n] = i;
    s->keys[s->n++] = s->alt[s->n_alt++];
  }
}

static int wanted(const wctx *x, size_t i, int waiting) {
  return x->pending[i] && (!waiting || x->waiting[i]);
}

/* One pass: lookups (per 4096 keys) for the wanted keys (with alts, and
 * their stand-ins), and their blobs in parallel. */
static void remote_pass(wctx *x, int waiting, int alts) {
  lookup_set *s = calloc(1, sizeof *s);
  if (s && !(s->alt = calloc(KC_LOOKUP_MAX, sizeof *s->alt))) {
    free(s);
    s = NULL;
  }
  for (size_t i = 0; s && i < x->rep->n_items && x->server_ok; i++)
    if (wanted(x, i, waiting))
      lookup_add(x, s, i, alts);
  if (s && s->n && x->server_ok)
    lookup_run(x, s);
  if (s)
    free(s->alt);
  free(s);
}

/* The pending keys (only the waiting ones when `waiting`) and their
 * stand-ins in the same round trip. Past KCC_COMPAT_INLINE keys (a bulk
 * warm, where every key's stand-ins would cost more than they save), the
 * keys first, then the stand-ins of those still missing. */
static void phase_remote(wctx *x, int waiting) {
  size_t m = 0;
  for (size_t i = 0; i < x->rep->n_items; i++)
    m += wanted(x, i, waiting);
  if (m <= KCC_COMPAT_INLINE || x->o->no_compat) {
    remote_pass(x, waiting, !x->o->no_compat);
    return;
  }
  remote_pass(x, waiting, 0);
  size_t left = 0;
  for (size_t i = 0; i < x->rep->n_items; i++)
    left += wanted(x, i, waiting);
  if (left && compat(x) && x->cp.on)
    remote_pass(x, waiting, 1);
}

/* Keys still missing after the lookup: a stand-in in the local cache (a
 * replica whose server is down, or that fetched one before). */
static void phase_local_compat(wctx *x) {
  char(*alt)[KC_HEX_LEN + 1] = NULL;
  for (size_t i = 0; i < x->rep->n_items; i++) {
    const kcc_compat *cp = x->pending[i] ? compat(x) : NULL;
    if (cp && !alt && !(alt = calloc(KCC_COMPAT_MAX, sizeof *alt)))
      return;
    size_t na =
        cp ? kcc_compat_keys(cp, &x->base, &x->fields[i], alt, KCC_COMPAT_MAX)
           : 0;
    for (size_t k = 0; k < na && x->pending[i] && !x->spare[i]; k++) {
      kc_manifest *m = NULL;
      if (kc_cache_bundle_get(x->c, alt[k], &m, NULL) == KC_OK)
        got_bundle(x, i, m);
    }
  }
  free(alt);
}

/* --prefer-build: an item that was not built or fetched in time (or whose
 * build failed) takes its stand-in after all. */
static void use_spares(wctx *x) {
  for (size_t i = 0; i < x->rep->n_items; i++) {
    kc_warm_item *it = &x->rep->items[i];
    if (!x->spare[i] || (!x->pending[i] && it->status != KC_WARM_FAILED))
      continue;
    char why[KC_ERRBUF_SIZE];
    snprintf(why, sizeof why, "the %s build was not ready (%.400s)", it->arch,
             x->pending[i] ? "the deadline passed" : it->message);
    kc_manifest *m = x->spare[i];
    x->spare[i] = NULL;
    if (!x->pending[i])
      x->done--; /* counted once already, as failed */
    ready(x, i, KC_WARM_HIT_COMPAT, m);
    snprintf(it->message, sizeof it->message, "%s", why);
  }
}

/* ---- phase 3: build (single-flight through leases) ---- */

/* Fetches a bundle that appeared on the server. */
static kc_err fetch_one(wctx *x, size_t i, kc_warm_status s, char *err) {
  kc_manifest *m = NULL;
  uint64_t got = 0;
  kc_err e = kc_client_bundle_get(x->c, x->rep->items[i].key, &m, err);
  const kc_file **d = m ? calloc(m->n_files + 1, sizeof *d) : NULL;
  if (!e && !d)
    e = kc_errf(err, KC_NOMEM, "out of memory");
  for (size_t j = 0; !e && j < m->n_files; j++)
    d[j] = &m->files[j];
  if (!e)
    e = kcc_fetch_blobs(x->c, d, m->n_files, NULL, &got, err);
  free(d);
  x->rep->bytes_fetched += got;
  if (!e)
    e = kc_cache_bundle_put(x->c, m, err);
  if (e) {
    kc_manifest_free(m);
    return e;
  }
  ready(x, i, s, m);
  return KC_OK;
}

/* The rebuilt bundle's blobs go back to a server that served one of them
 * corrupt (its manifest stays: the server holds one for the key). */
static void offer_blobs(wctx *x, const kc_manifest *m) {
  char e2[KC_ERRBUF_SIZE] = "", why[KC_ERRBUF_SIZE + 64];
  kc_err e = KC_OK;
  for (size_t j = 0; !e && j < m->n_files; j++) {
    void *data = NULL;
    size_t len = 0;
    e = kcc_cache_blob_read(x->c, m->files[j].sha256, m->files[j].size, &data,
                            &len, e2);
    if (!e)
      e = kc_client_blob_repair(x->c, data, len, e2);
    free(data);
  }
  if (is_down(e)) {
    server_down(x, e2);
  } else if (e) {
    snprintf(why, sizeof why, "offering a bundle's blobs back: %s", e2);
    warn(x, why);
  }
}

/* The token cannot write (a lease or an upload got 401/403): nothing is
 * uploaded for the rest of the warm. A 403 (the token's role refused) the
 * client remembers for its life (a later warm does not offer hit-local
 * bundles back); a 401 may be a token being reloaded, so the next warm
 * tries again. */
static void cannot_write(wctx *x, kc_err e, const char *why) {
  refused(x, e, why);
  if (!x->cant_write)
    snprintf(x->cant_why, sizeof x->cant_why, "%.400s", why);
  x->cant_write = 1;
  if (e == KC_FORBIDDEN)
    x->c->cant_write = 1;
}

static void upload(wctx *x, size_t i, const kc_manifest *m) {
  char e2[KC_ERRBUF_SIZE];
  kc_warm_item *it = &x->rep->items[i];
  if (x->o->no_upload || !x->server_ok)
    return;
  if (x->remote_bad[i] == BAD_BLOB)
    offer_blobs(x, m);
  if (x->remote_bad[i])
    return;
  kc_err e = x->cant_write ? KC_FORBIDDEN : kc_client_push(x->c, m, e2);
  if (!e)
    it->uploaded = 1;
  else if (is_down(e))
    server_down(x, e2);
  else if (e == KC_FORBIDDEN || e == KC_UNAUTHORIZED) {
    /* the token cannot write: said once per item, asked once per warm */
    cannot_write(x, e, e2);
    snprintf(it->message, sizeof it->message,
             "not uploaded: the token cannot write (%.420s)", x->cant_why);
  } else if (e == KC_CONFLICT) /* write-once: another build got there first */
    snprintf(it->message, sizeof it->message,
             "not uploaded: kcached already holds another build of this key "
             "(the first complete upload wins)");
  else
    snprintf(it->message, sizeof it->message, "upload failed: %.450s", e2);
}

/* One build to run: the item, and the lease we hold on it (if any). The
 * build fills m or e and msg; only the calling process touches the report,
 * the client's HTTP handles and the leases. */
typedef struct job {
  size_t i;
  int leased;
  char token[KC_LEASE_TOKEN_MAX];
  kc_manifest *m;
  kc_err e;
  char msg[KC_ERRBUF_SIZE];
} job;

/* Builds into the local cache. */
static void run_job(wctx *x, job *j) {
  j->e = kcc_build_key(x->c, x->w, &x->fields[j->i], seconds_left(x), &j->m,
                       j->msg);
  if (!j->e && strcmp(j->m->key, x->rep->items[j->i].key) != 0)
    j->e = kc_errf(j->msg, KC_INTERNAL, "built bundle's key differs");
  if (!j->e)
    j->e = kc_cache_bundle_put(x->c, j->m, j->msg);
}

/* What a build process reports per job: small enough (< PIPE_BUF) for one
 * atomic write. */
typedef struct job_rec {
  size_t k;
  kc_err e;
  char msg[KC_ERRBUF_SIZE];
} job_rec;

/* A build process: jobs k, k + stride, ... into the local cache (atomic
 * renames, so processes never see each other's half files), results down
 * the pipe. _exit: the parent's handles and atexit work are not ours. */
static void build_proc(wctx *x, job *jobs, size_t n, size_t k, size_t stride,
                       int fd) {
  for (; k < n; k += stride) {
    job_rec r = {.k = k};
    run_job(x, &jobs[k]);
    r.e = jobs[k].e;
    memcpy(r.msg, jobs[k].msg, sizeof r.msg);
    if (write(fd, &r, sizeof r) != (ssize_t)sizeof r)
      _exit(1);
  }
  _exit(0);
}

/* Takes the results of one build process; its manifests come back from the
 * local cache (verified on the way). */
static void collect(wctx *x, job *jobs, size_t n, int fd, pid_t pid) {
  job_rec r;
  while (read(fd, &r, sizeof r) == (ssize_t)sizeof r) {
    if (r.k >= n)
      continue;
    job *j = &jobs[r.k];
    j->e = r.e;
    memcpy(j->msg, r.msg, sizeof j->msg);
    if (!j->e)
      j->e = kc_cache_bundle_get(x->c, x->rep->items[j->i].key, &j->m, j->msg);
  }
  close(fd);
  waitpid(pid, NULL, 0);
}

/* Runs n builds, up to x->jobs at once in forked processes. Processes, not
 * threads: kc_gpu_build forks, and forking from a multi-threaded process is
 * unsafe under sanitizers and with allocators other than glibc's. A job no
 * process reported on (it crashed, or fork failed) runs here. */
static void run_jobs(wctx *x, job *jobs, size_t n) {
  size_t np = n < (size_t)x->jobs ? n : (size_t)x->jobs;
  pid_t pids[KC_MAX_BUILD_JOBS];
  int fds[KC_MAX_BUILD_JOBS];
  for (size_t k = 0; k < n; k++) { /* "not reported" until a process does */
    jobs[k].e = KC_INTERNAL;
    jobs[k].msg[0] = '\0';
  }
  fflush(NULL);
  for (size_t p = 0; np > 1 && p < np; p++) {
    int fd[2];
    pids[p] = -1;
    if (pipe(fd) != 0)
      continue;
    pids[p] = fork();
    if (pids[p] == 0) {
      close(fd[0]);
      build_proc(x, jobs, n, p, np, fd[1]);
    }
    close(fd[1]);
    fds[p] = fd[0];
    if (pids[p] < 0)
      close(fd[0]);
  }
  for (size_t p = 0; np > 1 && p < np; p++)
    if (pids[p] > 0)
      collect(x, jobs, n, fds[p], pids[p]);
  for (size_t k = 0; k < n; k++)
    if (jobs[k].e == KC_INTERNAL && !jobs[k].msg[0])
      run_job(x, &jobs[k]);
}

/* Upload, release, record: on the calling thread. */
static void finish_job(wctx *x, job *j) {
  if (j->e) {
    kc_manifest_free(j->m);
    failed(x, j->i, deadline_passed(x) ? KC_DEADLINE : j->e, j->msg);
  } else {
    upload(x, j->i, j->m);
    ready(x, j->i, KC_WARM_BUILT, j->m);
  }
  if (j->leased && x->server_ok)
    kc_client_lease_release(x->c, x->rep->items[j->i].key, j->token, NULL);
  j->m = NULL;
}

static void build_all(wctx *x, job *jobs, size_t n) {
  if (!n)
    return;
  run_jobs(x, jobs, n);
  for (size_t k = 0; k < n; k++)
    finish_job(x, &jobs[k]);
}

/* Item i's lease is another's: remembered for the report, polled until the
 * lease ends; with a deadline, built here anyway once lease_wait_s (or
 * half of what was left) has passed: a holder that died, hangs or squats
 * must not cost the whole deadline when this host can build. */
static void held(wctx *x, size_t i, const kcc_lease_info *li) {
  kc_warm_item *it = &x->rep->items[i];
  int64_t now = kcc_now_ms();
  x->waiting[i] = 1;
  x->retry_at[i] = now + (int64_t)li->retry_after_s * 1000;
  snprintf(it->lease_holder, sizeof it->lease_holder, "%s",
           li->holder[0] ? li->holder : "(not said)");
  it->lease_expires_s = li->expires_s < 0 ? -1 : since(x) + li->expires_s;
  it->lease_expires_at[0] = '\0';
  if (li->expires_s >= 0) {
    time_t end = time(NULL) + (time_t)li->expires_s;
    struct tm tm;
    gmtime_r(&end, &tm);
    strftime(it->lease_expires_at, sizeof it->lease_expires_at,
             "%Y-%m-%dT%H:%M:%SZ", &tm);
  }
  double wait = x->o->lease_wait_s;
  if (x->build_at[i] || !x->c->deadline_ms || wait < 0)
    return;
  x->build_at[i] =
      now + (wait > 0 ? (int64_t)(wait * 1000) : (x->c->deadline_ms - now) / 2);
}

/* A waiting key whose holder has had its share of the deadline: built here
 * without the lease (j filled). */
static void take_over(wctx *x, size_t i, job *j) {
  kc_warm_item *it = &x->rep->items[i];
  memset(j, 0, sizeof *j);
  j->i = i;
  x->waiting[i] = 0;
  snprintf(it->message, sizeof it->message,
           "built here: '%.200s' holds the lease (until %s) and had not "
           "delivered after %.1f s",
           it->lease_holder,
           it->lease_expires_at[0] ? it->lease_expires_at : "unknown",
           since(x));
}

/* What to do with item i: 1 when this warmer must build it (j filled),
 * 0 when it was fetched, failed, or another builder holds its lease. */
static int claim(wctx *x, size_t i, int was_waiting, job *j) {
  char e2[KC_ERRBUF_SIZE];
  kc_lease_state st;
  int ttl = x->o->lease_ttl_s > 0 ? x->o->lease_ttl_s : 300;
  memset(j, 0, sizeof *j);
  j->i = i;
  if (!x->server_ok || x->remote_bad[i])
    return 1;
  kcc_lease_info li;
  kc_err e =
      kcc_lease_take(x->c, x->rep->items[i].key, ttl, &st, j->token, &li, e2);
  if (is_down(e)) {
    server_down(x, e2);
    return 1;
  }
  if (e) { /* e.g. a read-only token: build for ourselves */
    if (e == KC_FORBIDDEN || e == KC_UNAUTHORIZED)
      cannot_write(x, e, e2);
    snprintf(x->rep->items[i].message, KC_ERRBUF_SIZE, "lease: %.450s", e2);
    warn(x, e2);
    x->remote_bad[i] = BAD_OTHER;
    return 1;
  }
  if (st == KC_LEASE_HELD) { /* ask again when the holder's lease ends */
    held(x, i, &li);
    return 0;
  }
  if (st == KC_LEASE_GRANTED) {
    j->leased = 1;
    return 1;
  }
  e = fetch_one(x, i, was_waiting ? KC_WARM_WAITED : KC_WARM_HIT_REMOTE, e2);
  if (e && deadline_passed(x)) {
    failed(x, i, KC_DEADLINE, e2);
    return 0;
  }
  if (e) { /* present but unusable: never used, rebuilt here */
    x->remote_bad[i] = e == KC_DIGEST_MISMATCH ? BAD_BLOB : BAD_OTHER;
    snprintf(x->rep->items[i].message, KC_ERRBUF_SIZE, "%s", e2);
  }
  return e != KC_OK;
}

/* Whether item i's key had stand-ins looked for, in words: which archs
 * that run on the device were asked for and not found, or why none were. */
static void compat_said(wctx *x, size_t i, char *out, size_t size) {
  const kcc_compat *cp = compat(x);
  const char *arch = x->rep->items[i].arch;
  if (x->o->no_compat) {
    snprintf(out, size, "no compatible bundle looked for (--no-compat)");
    return;
  }
  if (!cp || !cp->on) {
    snprintf(out, size,
             "no compatible bundle looked for (no GPU detected; "
             "--device-arch names one)");
    return;
  }
  if (!kcc_compat_applies(cp, arch)) {
    snprintf(out, size,
             "no compatible bundle looked for (%s does not run "
             "on %s)",
             arch, cp->device);
    return;
  }
  size_t n = (size_t)snprintf(out, size,
                              "no compatible bundle found either "
                              "(looked for");
  size_t k = 0;
  for (size_t a = 0; a < cp->n_archs && n < size; a++) {
    if (!strcmp(cp->archs[a], arch))
      continue;
    if (k++ == 6) {
      n += (size_t)snprintf(out + n, size - n, " and %zu more",
                            cp->n_archs - a - 1);
      break;
    }
    n += (size_t)snprintf(out + n, size - n, "%s %s", k > 1 ? "," : "",
                          cp->archs[a]);
  }
  if (n < size)
    snprintf(out + n, size - n, "%s: what runs on %s)", k ? "" : " none",
             cp->device);
}

/* Fetch only: the key fails, with the server's failure when there was one
 * (a stalled, reset or garbled answer is not "missing"), and whether a
 * compatible bundle was looked for. */
static void fail_no_build(wctx *x, size_t i) {
  char msg[KC_ERRBUF_SIZE], alt[KC_ERRBUF_SIZE / 2];
  const char *why = "";
  kc_err e = remote_cause(x, i, &why);
  compat_said(x, i, alt, sizeof alt);
  if (!e) {
    snprintf(msg, sizeof msg, "not cached; %s; and --no-build", alt);
    failed(x, i, KC_NOT_FOUND, msg);
    return;
  }
  snprintf(msg, sizeof msg, "not fetched (%.200s); %.250s; and --no-build", why,
           alt);
  failed(x, i, e, msg);
}

/* Claims up to x->jobs keys, builds them at once, repeats: leases are taken
 * just before building, so concurrent warmers split the remaining keys. */
static void claim_and_build(wctx *x, int waiting_round) {
  job jobs[KC_MAX_BUILD_JOBS];
  size_t n = 0;
  for (size_t i = 0; i < x->rep->n_items; i++) {
    if (!x->pending[i] || x->waiting[i] != waiting_round)
      continue;
    if (deadline_passed(x))
      break;
    int64_t now = kcc_now_ms();
    if (waiting_round && now < x->retry_at[i]) {
      if (!x->build_at[i] || now < x->build_at[i])
        continue;
      take_over(x, i, &jobs[n]);
      if (++n == (size_t)x->jobs) {
        build_all(x, jobs, n);
        n = 0;
      }
      continue;
    }
    if (x->o->no_build) { /* never claims, so never waits either */
      fail_no_build(x, i);
      continue;
    }
    if (!claim(x, i, waiting_round, &jobs[n]))
      continue;
    x->waiting[i] = 0;
    if (++n == (size_t)x->jobs) {
      build_all(x, jobs, n);
      n = 0;
    }
  }
  build_all(x, jobs, n);
}

static void phase_build(wctx *x) { claim_and_build(x, 0); }

/* ---- phase 4: wait for other builders ---- */

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

static size_t n_waiting(const wctx *x) {
  size_t n = 0;
  for (size_t i = 0; i < x->rep->n_items; i++)
    n += x->pending[i] && x->waiting[i];
  return n;
}

/* Polls with one lookup per round for all waiting keys (a startup storm of
 * replicas costs one request each per round, backing off to 2 s); a key
 * whose holder's lease has run out is claimed again: built here if the
 * holder died, fetched if it just finished. */
static void phase_wait(wctx *x) {
  double poll = x->o->poll_s > 0 ? x->o->poll_s : 0.2;
  x->fetched_as = KC_WARM_WAITED;
  while (n_waiting(x) && !deadline_passed(x)) {
    double left = seconds_left(x), nap = poll;
    if (x->c->deadline_ms && left < nap)
      nap = left;
    for (size_t i = 0; i < x->rep->n_items; i++) { /* a take-over due */
      double due = (x->build_at[i] - kcc_now_ms()) / 1000.0;
      if (x->pending[i] && x->waiting[i] && x->build_at[i] && due < nap)
        nap = due > 0.01 ? due : 0.01;
    }
    sleep_s(nap);
    if (x->server_ok)
      phase_remote(x, 1);
    claim_and_build(x, 1);
    if (poll < 2.0)
      poll = poll * 1.5 < 2.0 ? poll * 1.5 : 2.0;
  }
}

/* ---- phase 5: what this host holds and kcached lacks ---- */

static int cmp_key(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The keys kcached holds for the warm's model (GET /v1/models/{model}),
 * sorted, into *keys (pointers into *root); -1 when it cannot say. */
static int server_keys(wctx *x, json_t **root, const char ***keys, size_t *n) {
  char *text = NULL;
  char hex[KC_HEX_LEN + 1];
  memcpy(hex, x->w->model_hash, sizeof hex);
  /* Within half of what is left of the deadline and 2 s at most: a warm
   * cache must not wait long on a server that stalls. */
  long cap = lookup_cap_ms(x);
  x->c->request_cap_ms = cap && cap < 2000 ? cap : 2000;
  char e2[KC_ERRBUF_SIZE];
  kc_err e = kc_client_model_list(x->c, hex, &text, e2);
  x->c->request_cap_ms = 0;
  refused(x, e, e2);
  *root = e ? NULL : json_loads(text, 0, NULL);
  free(text);
  json_t *bs = json_object_get(*root, "bundles");
  *n = json_array_size(bs);
  if (!json_is_array(bs) || !(*keys = calloc(*n + 1, sizeof **keys))) {
    json_decref(*root);
    *root = NULL;
    return -1;
  }
  for (size_t k = 0; k < *n; k++) {
    const char *key =
        json_string_value(json_object_get(json_array_get(bs, k), "key"));
    (*keys)[k] = key ? key : "";
  }
  qsort(*keys, *n, sizeof **keys, cmp_key);
  return 0;
}

/* Keys served from the local cache are not asked of kcached; when it lacks
 * them (a purge, a server that lost its data, one never filled), the host
 * that holds them is the one to put them back: uploaded as a build would
 * be (write role; a read token's refusal is a note, not a failure), and
 * the item says so. */
static void phase_offer_local(wctx *x) {
  size_t n_local = 0, n_keys = 0;
  for (size_t i = 0; i < x->rep->n_items; i++)
    n_local += x->rep->items[i].status == KC_WARM_HIT_LOCAL && x->ms[i];
  /* a token known to be read-only (a 401/403 on a lease or an upload in
   * this warm, a 403 in an earlier one of this client) could not upload what
   * the server lacks: the question is not asked */
  if (!n_local || !x->server_ok || x->o->no_upload || x->cant_write ||
      deadline_passed(x))
    return;
  json_t *root = NULL;
  const char **keys = NULL;
  if (server_keys(x, &root, &keys, &n_keys) != 0)
    return; /* it could not say: nothing is offered blindly */
  for (size_t i = 0; i < x->rep->n_items && x->server_ok; i++) {
    kc_warm_item *it = &x->rep->items[i];
    const char *key = it->key;
    if (it->status != KC_WARM_HIT_LOCAL || !x->ms[i] ||
        bsearch(&key, keys, n_keys, sizeof *keys, cmp_key))
      continue;
    upload(x, i, x->ms[i]);
    if (it->uploaded)
      snprintf(it->message, sizeof it->message,
               "uploaded: kcached did not hold it");
  }
  free(keys);
  json_decref(root);
}

/* ---- the whole ---- */

/* A stand-in's directory, DIR/<arch asked>/<bucket>/, holds another arch's
 * code: KCC_ARCH_FILE beside it names that arch, so that a copy of DIR
 * cannot pass it off as the arch of its path (sm_89 cubins under sm_80/ on
 * an 8.0 GPU). An exact bundle's directory has none (one left by an
 * earlier stand-in is removed). A bundle with a file of that name keeps
 * it. */
static kc_err mark_arch(wctx *x, size_t i, const char *dir, char *err) {
  char p[PATH_MAX + 32], text[KC_ARCH_MAX + 2];
  const kc_manifest *m = x->ms[i];
  for (size_t k = 0; k < m->n_files; k++)
    if (!strcmp(m->files[k].path, KCC_ARCH_FILE))
      return KC_OK;
  snprintf(p, sizeof p, "%s/%s", dir, KCC_ARCH_FILE);
  if (x->rep->items[i].status != KC_WARM_HIT_COMPAT) {
    if (!x->out_made[i]) /* a new directory holds none */
      unlink(p);
    return KC_OK;
  }
  int n = snprintf(text, sizeof text, "%s\n", m->fields.arch);
  return kc_write_file_atomic(p, text, (size_t)n, err);
}

/* Items [from, to) written out: each its own directory and its own item,
 * so two threads can share the work (materialize_all). Every ready
 * bundle's blobs were hashed during this warm (fetched, built, or checked
 * in the local cache): linked or copied without hashing them again. */
static void materialize_run(void *arg, size_t from, size_t to) {
  wctx *x = arg;
  char dir[PATH_MAX], e2[KC_ERRBUF_SIZE];
  for (size_t i = from; i < to; i++) {
    kc_warm_item *it = &x->rep->items[i];
    out_dir_of(x, i, dir, sizeof dir);
    if (!x->ms[i]) {
      /* made during a fetch that did not bring it: removed (if still
       * empty); a directory this run did not make is left alone */
      if (x->out_made[i])
        rmdir(dir);
      continue;
    }
    int made = x->out_made[i];
    kc_err e = kcc_materialize(x->c, x->ms[i], dir, 1, &made, e2);
    x->out_made[i] = made;
    if (!e)
      e = mark_arch(x, i, dir, e2);
    if (e) {
      it->status = KC_WARM_FAILED;
      it->err = e;
      snprintf(it->message, sizeof it->message, "materialize: %.450s", e2);
    }
  }
}

/* From 32 bundles on, on two threads (joined before it returns): a new
 * directory per bundle, and on ext4 each new inode costs a scan of the
 * group's recently freed ones, CPU that a second core halves. */
static void materialize_all(wctx *x) {
  kcc_halves(x->rep->n_items, x->rep->n_items >= 32, materialize_run, x);
}

/* A key still pending at the end: the deadline passed; with what the
 * server did meanwhile, if anything. */
static void fail_deadline(wctx *x, size_t i) {
  kc_warm_item *it = &x->rep->items[i];
  char msg[KC_ERRBUF_SIZE];
  const char *why = "";
  kc_err e = remote_cause(x, i, &why);
  if (x->waiting[i] && it->lease_holder[0] && it->lease_expires_s >= 0)
    snprintf(msg, sizeof msg,
             "the deadline passed waiting on '%.200s', whose lease on it "
             "ends at %s (%.0f s after the start)",
             it->lease_holder, it->lease_expires_at, it->lease_expires_s);
  else if (x->waiting[i] && it->lease_holder[0])
    snprintf(msg, sizeof msg,
             "the deadline passed waiting on '%.200s', who holds its lease",
             it->lease_holder);
  else if (e && e != KC_DEADLINE)
    snprintf(msg, sizeof msg, "the deadline passed (earlier: %.440s)", why);
  else if (e == KC_DEADLINE)
    snprintf(msg, sizeof msg, "the deadline passed (%.460s)", why);
  else
    snprintf(msg, sizeof msg, "the deadline passed");
  it->status = KC_WARM_FAILED;
  it->err = KC_DEADLINE;
  memcpy(it->message, msg, sizeof it->message);
}

static kc_err summarize(wctx *x, char *err) {
  kc_warm_report *r = x->rep;
  kc_err first = KC_OK;
  size_t n_failed = 0;
  for (size_t i = 0; i < r->n_items; i++) {
    kc_warm_item *it = &r->items[i];
    if (x->pending[i]) /* the deadline passed before its turn */
      fail_deadline(x, i);
    r->counts[it->status]++;
    if (it->status != KC_WARM_FAILED)
      r->bytes += it->bytes;
    else if (!n_failed++)
      first = it->err;
  }
  r->seconds = since(x);
  if (first)
    kc_errf(err, first, "%zu of %zu bundles not ready (first: %s)", n_failed,
            r->n_items, kc_strerror(first));
  return first;
}

/* The keys of items [from, to): canonical JSON of the fields, hashed.
 * Each half keeps its own first failure (e[0]: the one from item 0). */
typedef struct keys_job {
  wctx *x;
  kc_err e[2];
  char err[2][KC_ERRBUF_SIZE];
} keys_job;

static void keys_run(void *arg, size_t from, size_t to) {
  keys_job *j = arg;
  int h = from != 0;
  for (size_t i = from; i < to && !j->e[h]; i++)
    j->e[h] =
        kc_key_compute(&j->x->fields[i], j->x->rep->items[i].key, j->err[h]);
}

/* Every item's key; from 32 keys on, a second thread computes half of
 * them (a 1024-bundle warm spent about 8 ms here, on one core of two). */
static kc_err keys_of(wctx *x, size_t n, char *err) {
  keys_job j = {.x = x};
  kcc_halves(n, n >= 32, keys_run, &j);
  int h = j.e[0] ? 0 : 1;
  if (!j.e[h])
    return KC_OK;
  if (err)
    memcpy(err, j.err[h], KC_ERRBUF_SIZE);
  return j.e[h];
}

static kc_err setup(wctx *x, char *err) {
  size_t n = 0;
  char cache[PATH_MAX];
  int ma, mi;
  if (x->o->device_arch && kc_gpu_cc_parse(x->o->device_arch, &ma, &mi))
    return kc_errf(err, KC_EINVAL,
                   "device arch '%.20s': not sm_XY (sm_89) or X.Y (8.9)",
                   x->o->device_arch);
  nvrtc_cache_of(x->c, cache);
  kc_err e = warm_keys(x->w, cache, x->o->archs, x->o->n_archs, &x->fields, &n,
                       &x->base, err);
  if (e)
    return e;
  x->rep->items = calloc(n + 1, sizeof *x->rep->items);
  x->ms = calloc(n + 1, sizeof *x->ms);
  x->pending = calloc(n + 1, 1);
  x->remote_bad = calloc(n + 1, 1);
  x->waiting = calloc(n + 1, 1);
  x->retry_at = calloc(n + 1, sizeof *x->retry_at);
  x->build_at = calloc(n + 1, sizeof *x->build_at);
  x->spare = calloc(n + 1, sizeof *x->spare);
  x->out_made = calloc(n + 1, sizeof *x->out_made);
  if (!x->rep->items || !x->ms || !x->pending || !x->remote_bad ||
      !x->waiting || !x->retry_at || !x->build_at || !x->spare || !x->out_made)
    return kc_errf(err, KC_NOMEM, "out of memory");
  x->rep->n_items = n;
  for (size_t i = 0; i < n; i++) {
    kc_warm_item *it = &x->rep->items[i];
    it->bucket = x->fields[i].bucket;
    it->lease_expires_s = -1;
    memcpy(it->arch, x->fields[i].arch, sizeof it->arch);
    x->pending[i] = 1;
  }
  return keys_of(x, n, err);
}

static void teardown(wctx *x) {
  for (size_t i = 0; x->ms && i < x->rep->n_items; i++)
    kc_manifest_free(x->ms[i]);
  for (size_t i = 0; x->spare && i < x->rep->n_items; i++)
    kc_manifest_free(x->spare[i]);
  free(x->spare);
  kcc_compat_free(&x->cp);
  free(x->ms);
  free(x->fields);
  free(x->pending);
  free(x->remote_bad);
  free(x->waiting);
  free(x->out_made);
  free(x->retry_at);
  free(x->build_at);
  x->c->deadline_ms = 0;
}

/* --prefer-build builds only where a builder is: the command, or NVRTC. */
static int have_builder(wctx *x) {
  char cache[PATH_MAX], v[16];
  if (x->o->no_build)
    return 0;
  if (!x->w->n_kernels)
    return 1;
  nvrtc_cache_of(x->c, cache);
  return kc_gpu_nvrtc_version_cached(cache, v, NULL) == KC_OK;
}

static int build_jobs(const kc_warm_opts *o) {
  long n = o->build_jobs > 0 ? o->build_jobs : sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 1)
    n = 1;
  if (n > (o->build_jobs > 0 ? KC_MAX_BUILD_JOBS : 8))
    n = o->build_jobs > 0 ? KC_MAX_BUILD_JOBS : 8;
  return (int)n;
}

kc_err kc_warm(kc_client *c, const kc_warmup *w, const kc_warm_opts *o,
               kc_warm_report *report, char *err) {
  kc_warm_opts none = {0};
  wctx x = {.c = c,
            .w = w,
            .o = o ? o : &none,
            .rep = report,
            .server_ok = kc_client_has_server(c),
            .t0 = kcc_now_ms(),
            .fetched_as = KC_WARM_HIT_REMOTE};
  x.jobs = build_jobs(x.o);
  x.cant_write = c->cant_write;
  if (x.cant_write)
    snprintf(x.cant_why, sizeof x.cant_why,
             "a write was refused earlier on this client");
  memset(report, 0, sizeof *report);
  memcpy(report->model, w->model_hash, sizeof report->model);
  if (x.o->deadline_s > 0)
    c->deadline_ms = x.t0 + (int64_t)(x.o->deadline_s * 1000);
  kc_err e = setup(&x, err);
  if (!e) {
    phase_local(&x);
    x.defer_compat = x.o->prefer_build && have_builder(&x);
    if (x.server_ok)
      phase_remote(&x, 0);
    phase_local_compat(&x);
    phase_build(&x);
    phase_wait(&x);
    use_spares(&x);
    /* What is ready is written out even past the deadline: the service
     * starts with it, and every blob's size is known (no unbounded read). */
    int64_t deadline = c->deadline_ms;
    c->deadline_ms = 0;
    if (x.o->out_dir)
      materialize_all(&x);
    c->deadline_ms = deadline; /* the rest is inside it again */
    phase_offer_local(&x);
    e = summarize(&x, err);
    kc_demand_warm_report(c, w, report); /* demand.c: misses, buckets */
  }
  teardown(&x);
  return e;
}

void kc_warm_report_free(kc_warm_report *r) {
  if (!r)
    return;
  free(r->items);
  r->items = NULL;
  r->n_items = 0;
}
