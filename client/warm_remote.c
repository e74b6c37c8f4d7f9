/* warm_remote.c: kc_warm's questions to kcached: one batched lookup and
 * parallel verified fetches (phase 2), the compatible-arch fallback, and
 * what this host holds that kcached lacks (phase 5). */
#include "warm.h"

/* ---- phase 2: one lookup, parallel fetches ---- */

/* A fetched bundle for item i: ready, or with --prefer-build a stand-in
 * kept for the end (its blobs are cached now, so it costs nothing then). */
static void got_bundle(wctx *x, size_t i, kc_manifest *m) {
  if (x->defer_compat && kcw_is_compat(x, i, m)) {
    kc_manifest_free(x->spare[i]);
    x->spare[i] = m;
    return;
  }
  kcw_ready(x, i, x->fetched_as, m);
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
      if (found[k] && !kcw_is_compat(x, idx[k], found[k]))
        kcw_note(x, idx[k], KC_NOMEM, "out of memory");
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
    if (kcw_is_compat(x, idx[k], found[k]))
      continue; /* a stand-in that failed: the key itself is not at fault */
    if (e == KC_DIGEST_MISMATCH)
      x->remote_bad[idx[k]] = BAD_BLOB; /* never used; rebuilt below */
    if (e)
      kcw_note(x, idx[k], e, why);
  }
  free(put);
  free(res);
  free(all);
}

/* --out: the directory of item i's bundle, DIR/<arch>/<bucket>. */
void kcw_out_dir_of(const wctx *x, size_t i, char *dir, size_t size) {
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
    kcw_out_dir_of(j->x, j->idx[k], dir, sizeof dir);
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
  if (kcw_is_down(e))
    kcw_server_down(x, e2);
  take_fetched(x, found, idx, n, ok, e, e2);
  free(ok);
}

/* A lookup that failed: remembered for the report of every key it left
 * pending (one warning, not one line per key). */
static void lookup_failed(wctx *x, kc_err e, const char *why) {
  x->remote_err = e;
  snprintf(x->remote_why, sizeof x->remote_why, "%s", why);
  kcw_refused(x, e, why);
  if (kcw_is_down(e))
    kcw_server_down(x, why);
  else if (e == KC_DEADLINE && !x->rep->warning[0])
    snprintf(x->rep->warning, sizeof x->rep->warning,
             "kcached did not answer before the deadline (%.400s)", why);
  else
    kcw_warn(x, why);
}

/* A served manifest for item i's own key that failed validation: never
 * used, and said so. */
static void note_refused(wctx *x, size_t i, kc_err refused) {
  char why[KC_ERRBUF_SIZE];
  snprintf(why, sizeof why, "the server's manifest was refused: %s",
           kc_strerror(refused));
  kcw_note(x, i, refused, why);
}

/* A stalled kcached must not eat the whole deadline: the lookup gets half
 * of what is left (a second at least), so that when it does not answer, the
 * local builds still have the other half. */
static long lookup_cap_ms(const wctx *x) {
  if (!x->c->deadline_ms)
    return 0;
  int64_t half = (x->c->deadline_ms - kc_clock_mono_ms()) / 2;
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
kcc_compat *kcw_compat(wctx *x) {
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
  const kcc_compat *cp = x->spare[i] || !alts ? NULL : kcw_compat(x);
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
void kcw_phase_remote(wctx *x, int waiting) {
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
  if (left && kcw_compat(x) && x->cp.on)
    remote_pass(x, waiting, 1);
}

/* Keys still missing after the lookup: a stand-in in the local cache (a
 * replica whose server is down, or that fetched one before). */
void kcw_phase_local_compat(wctx *x) {
  char(*alt)[KC_HEX_LEN + 1] = NULL;
  for (size_t i = 0; i < x->rep->n_items; i++) {
    const kcc_compat *cp = x->pending[i] ? kcw_compat(x) : NULL;
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
void kcw_use_spares(wctx *x) {
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
    kcw_ready(x, i, KC_WARM_HIT_COMPAT, m);
    snprintf(it->message, sizeof it->message, "%s", why);
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
  kcw_refused(x, e, e2);
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
void kcw_phase_offer_local(wctx *x) {
  size_t n_local = 0, n_keys = 0;
  for (size_t i = 0; i < x->rep->n_items; i++)
    n_local += x->rep->items[i].status == KC_WARM_HIT_LOCAL && x->ms[i];
  /* a token known to be read-only (a 401/403 on a lease or an upload in
   * this warm, a 403 in an earlier one of this client) could not upload what
   * the server lacks: the question is not asked */
  if (!n_local || !x->server_ok || x->o->no_upload || x->cant_write ||
      kcw_deadline_passed(x))
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
    kcw_upload(x, i, x->ms[i]);
    if (it->uploaded)
      snprintf(it->message, sizeof it->message,
               "uploaded: kcached did not hold it");
  }
  free(keys);
  json_decref(root);
}
