/* warm.c: kc_warm, fetch-or-build of every (bucket, arch) of a warmup
 * manifest (docs/DESIGN.md, "Client warmup"): local cache, one batch lookup,
 * parallel verified fetches, single-flight builds through leases, a deadline
 * over all of it, and local builds when the server is down. */
#include "warm.h"

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

double kcw_since(const wctx *x) {
  return (kc_clock_mono_ms() - x->t0) / 1000.0;
}

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
int kcw_is_compat(const wctx *x, size_t i, const kc_manifest *m) {
  return strcmp(m->key, x->rep->items[i].key) != 0;
}

/* Item i is ready with bundle m (ownership moves to x). */
void kcw_ready(wctx *x, size_t i, kc_warm_status s, kc_manifest *m) {
  kc_warm_item *it = &x->rep->items[i];
  if (kcw_is_compat(x, i, m)) {
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
  it->seconds = kcw_since(x);
  progress(x, i);
}

void kcw_failed(wctx *x, size_t i, kc_err e, const char *msg) {
  kc_warm_item *it = &x->rep->items[i];
  x->pending[i] = 0;
  x->waiting[i] = 0;
  it->status = KC_WARM_FAILED;
  it->err = e;
  snprintf(it->message, sizeof it->message, "%s", msg);
  it->seconds = kcw_since(x);
  progress(x, i);
}

int kcw_deadline_passed(const wctx *x) {
  return x->c->deadline_ms && kc_clock_mono_ms() >= x->c->deadline_ms;
}

/* 0: no deadline; else what is left, never 0 (a passed deadline must not
 * read as none). */
double kcw_seconds_left(const wctx *x) {
  if (!x->c->deadline_ms)
    return 0;
  double s = (x->c->deadline_ms - kc_clock_mono_ms()) / 1000.0;
  return s > 0.001 ? s : 0.001;
}

void kcw_server_down(wctx *x, const char *why) {
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
void kcw_refused(wctx *x, kc_err e, const char *why) {
  if ((e != KC_UNAUTHORIZED && e != KC_FORBIDDEN) || x->rep->refused)
    return;
  x->rep->refused = e;
  snprintf(x->rep->refused_why, sizeof x->rep->refused_why, "%.400s", why);
}

/* The first server problem that is not an outage (a token without the
 * role, a bad answer) is worth a line for the operator. */
void kcw_warn(wctx *x, const char *why) {
  if (!x->rep->warning[0])
    snprintf(x->rep->warning, sizeof x->rep->warning,
             "kcached refused (%.400s): building locally", why);
}

int kcw_is_down(kc_err e) {
  return e == KC_UNAVAILABLE || e == KC_TIMEOUT || e == KC_NOT_READY;
}

/* Why the server's copy of item i was not used (a refused manifest, a
 * failed fetch): kept so that the item, failed or built here, says so. */
void kcw_note(wctx *x, size_t i, kc_err e, const char *why) {
  kc_warm_item *it = &x->rep->items[i];
  it->err = e;
  snprintf(it->message, sizeof it->message, "%s", why);
}

/* The server problem behind item i not being ready: its own note, else the
 * lookup's failure; KC_OK when the server simply lacks it. */
kc_err kcw_remote_cause(const wctx *x, size_t i, const char **why) {
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
      kcw_ready(x, i, KC_WARM_HIT_LOCAL, m);
    else if (e != KC_NOT_FOUND) /* damaged here: say so, fetch it again */
      snprintf(x->rep->items[i].message, KC_ERRBUF_SIZE, "%s", e2);
  }
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
    kcw_out_dir_of(x, i, dir, sizeof dir);
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
  kc_err e = kcw_remote_cause(x, i, &why);
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
  r->seconds = kcw_since(x);
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
            .t0 = kc_clock_mono_ms(),
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
      kcw_phase_remote(&x, 0);
    kcw_phase_local_compat(&x);
    kcw_phase_build(&x);
    kcw_phase_wait(&x);
    kcw_use_spares(&x);
    /* What is ready is written out even past the deadline: the service
     * starts with it, and every blob's size is known (no unbounded read). */
    int64_t deadline = c->deadline_ms;
    c->deadline_ms = 0;
    if (x.o->out_dir)
      materialize_all(&x);
    c->deadline_ms = deadline; /* the rest is inside it again */
    kcw_phase_offer_local(&x);
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
