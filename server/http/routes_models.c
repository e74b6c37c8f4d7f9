/* routes_models.c: the routes by model and the page's data: GET /v1/models
 * (every model with its name and figures, paginated), GET /v1/models/{model}
 * (the model's bundles), the warmup manifest of
 * a model (PUT stores what it wants warm, GET returns it), its coverage
 * (expected buckets x archs, each cell present, missing or building),
 * DELETE /v1/models/{model} (purge) and GET /v1/stats/history. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"

#define LIST_DEFAULT 100
#define LIST_MAX 1000

/* ---- coverage ---- */

/* What coverage is computed from: the expected buckets and archs (from the
 * warmup manifest; without one, those the bundles have) and the bundles. */
typedef struct cov {
  json_t *buckets, *archs; /* arrays: bucket objects, arch strings */
  json_t *bundles;         /* [{key, fields, bytes, hits, last_used}] */
  json_t *manifest_archs;  /* the manifest's archs (array), or NULL */
  const char *archs_from;  /* "warm", "manifest" or "bundles" */
  int expected;            /* a warmup manifest set buckets (and archs) */
  char *name;              /* the model's name, or NULL */
} cov;

static void cov_free(cov *c) {
  json_decref(c->buckets);
  json_decref(c->archs);
  json_decref(c->manifest_archs);
  json_decref(c->bundles);
  free(c->name);
}

static int collect_bundle(const kc_store_bundle_info *info, void *ud) {
  json_t *f = info->fields
                  ? json_loadb(info->fields, info->fields_len, 0, NULL)
                  : json_loadb(info->manifest, info->manifest_len, 0, NULL);
  json_t *o = json_pack("{ss so sI sI sI sI}", "key", info->key, "fields",
                        f ? f : json_object(), "bytes", (json_int_t)info->bytes,
                        "hits", (json_int_t)info->hits, "last_used",
                        (json_int_t)info->last_used, "created",
                        (json_int_t)info->created);
  return !o || json_array_append_new(ud, o);
}

/* 1 when the array holds a value equal to v. */
static int in_array(json_t *arr, json_t *v) {
  size_t i;
  json_t *x;
  json_array_foreach(arr, i, x) if (json_equal(x, v)) return 1;
  return 0;
}

/* Appends v to the array unless an equal value is there. */
static void add_unique(json_t *arr, json_t *v) {
  if (!in_array(arr, v))
    json_array_append(arr, v);
}

/* Expected cells from the warmup manifest (validated when it was stored). */
static void cov_from_warmup(cov *c, const char *json, size_t len) {
  kc_warmup *w = NULL;
  if (kc_warmup_parse(json, len, NULL, &w, NULL))
    return;
  c->expected = 1;
  c->name = strdup(w->model_name);
  for (size_t i = 0; i < w->n_buckets; i++)
    json_array_append_new(c->buckets, kc_bucket_to_json(&w->buckets[i]));
  c->manifest_archs = json_array();
  for (size_t i = 0; i < w->n_archs; i++)
    json_array_append_new(c->manifest_archs, json_string(w->archs[i]));
  kc_warmup_free(w);
}

/* The columns: the archs the model's warms ran for (their --arch, recorded
 * with the manifest they sent), else the manifest's, else (cov_from_bundles)
 * those its bundles have. */
static void cov_archs(kcd_req *r, const char *model, cov *c) {
  char list[KC_STORE_WARM_ARCHS_MAX];
  if (c->expected &&
      kc_store_warm_archs_get(kcd_store(r->st), model, list) == KC_OK) {
    int same = 1; /* as a set, the manifest's: say "manifest" */
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t;
         t = strtok_r(NULL, ",", &save)) {
      json_t *a = json_string(t);
      same &= in_array(c->manifest_archs, a);
      json_array_append_new(c->archs, a);
    }
    same &= json_array_size(c->archs) == json_array_size(c->manifest_archs);
    c->archs_from = same ? "manifest" : "warm";
  } else if (json_array_size(c->manifest_archs)) {
    json_array_extend(c->archs, c->manifest_archs);
    c->archs_from = "manifest";
  } else {
    c->archs_from = "bundles";
  }
}

/* Archs (and, without a manifest, buckets) the bundles have fill in what the
 * manifest leaves open: a manifest without archs builds for the local GPU. */
static void cov_from_bundles(cov *c) {
  int archs = json_array_size(c->archs) == 0;
  size_t i;
  json_t *b;
  json_array_foreach(c->bundles, i, b) {
    json_t *f = json_object_get(b, "fields");
    if (!c->expected && json_object_get(f, "bucket"))
      add_unique(c->buckets, json_object_get(f, "bucket"));
    if (archs && json_is_string(json_object_get(f, "arch")))
      add_unique(c->archs, json_object_get(f, "arch"));
  }
}

static kc_err cov_load(kcd_req *r, const char *model, const char *warmup,
                       size_t wlen, cov *c) {
  memset(c, 0, sizeof *c);
  c->buckets = json_array();
  c->archs = json_array();
  c->bundles = json_array();
  if (!c->buckets || !c->archs || !c->bundles)
    return KC_NOMEM;
  char *own = NULL;
  size_t olen = 0;
  if (!warmup && kc_store_warmup_get(kcd_store(r->st), model, &own, &olen,
                                     NULL) == KC_OK) {
    warmup = own;
    wlen = olen;
  }
  if (warmup)
    cov_from_warmup(c, warmup, wlen);
  free(own);
  cov_archs(r, model, c);
  kc_err e =
      kc_store_model_list(kcd_store(r->st), model, collect_bundle, c->bundles);
  if (e && e != KC_NOT_FOUND)
    return e;
  cov_from_bundles(c);
  return KC_OK;
}

/* One cell: the bundles of this (bucket, arch), added up. */
static json_t *cell_of(const cov *c, json_t *bucket, json_t *arch,
                       json_t *used) {
  uint64_t bytes = 0, hits = 0, n = 0;
  int64_t last = 0;
  size_t i;
  json_t *b;
  json_array_foreach(c->bundles, i, b) {
    json_t *f = json_object_get(b, "fields");
    if (!json_equal(json_object_get(f, "bucket"), bucket) ||
        !json_equal(json_object_get(f, "arch"), arch))
      continue;
    json_array_set_new(used, i, json_true());
    n++;
    bytes += (uint64_t)json_integer_value(json_object_get(b, "bytes"));
    hits += (uint64_t)json_integer_value(json_object_get(b, "hits"));
    int64_t lu = json_integer_value(json_object_get(b, "last_used"));
    last = lu > last ? lu : last;
  }
  return json_pack("{ss sI sI sI sI}", "state", n ? "present" : "missing",
                   "bundles", (json_int_t)n, "bytes", (json_int_t)bytes, "hits",
                   (json_int_t)hits, "last_used", (json_int_t)last);
}

/* A missing cell is building when the key it would have with the toolchain
 * and build of one of the model's bundles holds a lease: the server cannot
 * tell the key of a cell no bundle shares fields with. */
static void mark_building(kcd_req *r, const cov *c, json_t *cell,
                          json_t *bucket, json_t *arch) {
  size_t i;
  json_t *b;
  json_array_foreach(c->bundles, i, b) {
    json_t *f = json_deep_copy(json_object_get(b, "fields"));
    json_object_set(f, "bucket", bucket);
    json_object_set(f, "arch", arch);
    char *txt = json_dumps(f, JSON_COMPACT);
    json_decref(f);
    kc_key_fields kf;
    char key[KC_HEX_LEN + 1], holder[KCD_HOLDER_MAX + 1];
    int ok = txt && !kc_key_fields_parse(txt, strlen(txt), &kf, NULL) &&
             !kc_key_compute(&kf, key, NULL);
    free(txt);
    if (ok && kcd_lease_held(r->st->leases, key, kc_clock_mono_ms(), holder)) {
      json_object_set_new(cell, "state", json_string("building"));
      json_object_set_new(cell, "holder", json_string(holder));
      json_object_set_new(cell, "key", json_string(key));
      return;
    }
  }
}

/* The matrix: cells[bucket][arch], and counts. */
static json_t *cov_matrix(kcd_req *r, const cov *c, json_t *used,
                          size_t *present) {
  json_t *rows = json_array();
  size_t bi, ai;
  json_t *bucket, *arch;
  *present = 0;
  json_array_foreach(c->buckets, bi, bucket) {
    json_t *row = json_array();
    json_array_foreach(c->archs, ai, arch) {
      json_t *cell = cell_of(c, bucket, arch, used);
      if (json_integer_value(json_object_get(cell, "bundles")))
        (*present)++;
      else if (r)
        mark_building(r, c, cell, bucket, arch);
      json_array_append_new(row, cell);
    }
    json_array_append_new(rows, row);
  }
  return rows;
}

/* Bundles of no expected cell ("present but no longer expected"). */
static json_t *cov_extra(const cov *c, json_t *used) {
  json_t *extra = json_array();
  size_t i;
  json_t *b;
  json_array_foreach(c->bundles, i, b) {
    if (json_is_true(json_array_get(used, i)))
      continue;
    json_t *f = json_object_get(b, "fields");
    json_array_append_new(extra,
                          json_pack("{sO sO* sO* sO sO sO}", "key",
                                    json_object_get(b, "key"), "bucket",
                                    json_object_get(f, "bucket"), "arch",
                                    json_object_get(f, "arch"), "bytes",
                                    json_object_get(b, "bytes"), "hits",
                                    json_object_get(b, "hits"), "last_used",
                                    json_object_get(b, "last_used")));
  }
  return extra;
}

/* The used-flags array: one false per bundle. */
static json_t *used_flags(const cov *c) {
  json_t *used = json_array();
  for (size_t i = 0; used && i < json_array_size(c->bundles); i++)
    json_array_append_new(used, json_false());
  return used;
}

int kcd_coverage_get(kcd_req *r) {
  cov c;
  kc_err e = cov_load(r, r->param, NULL, 0, &c);
  if (e) {
    cov_free(&c);
    return kcd_reply_error(r, e, "cannot read model %s", r->param);
  }
  json_t *used = used_flags(&c);
  size_t present = 0;
  json_t *cells = cov_matrix(r, &c, used, &present);
  json_t *o = json_pack(
      "{ss so sb sO sO so so sI sI ss sO*}", "model", r->param, "name",
      c.name ? json_string(c.name) : json_null(), "warmup", c.expected,
      "buckets", c.buckets, "archs", c.archs, "cells", cells, "extra",
      cov_extra(&c, used), "present", (json_int_t)present, "expected",
      (json_int_t)(json_array_size(c.buckets) * json_array_size(c.archs)),
      "archs_from", c.archs_from, "manifest_archs", c.manifest_archs);
  json_decref(used);
  cov_free(&c);
  return kcd_reply_json(r, 200, o, NULL);
}

/* ---- GET /v1/models ---- */

static int list_model(const kc_store_model_info *m, void *ud) {
  json_t *o =
      json_pack("{ss sn sI sI sI sI}", "model", m->model, "name", "bundles",
                (json_int_t)m->bundles, "bytes", (json_int_t)m->bytes, "hits",
                (json_int_t)m->hits, "last_used", (json_int_t)m->last_used);
  if (!o)
    return 1;
  if (m->warmup) { /* kept only for the coverage pass below */
    json_object_set_new(o, "warmup_json",
                        json_stringn(m->warmup, m->warmup_len));
  }
  return json_array_append_new(ud, o);
}

/* Adds name and coverage ("present"/"expected") to each listed model, out
 * of the listing's read (each is a read of its own). */
static void list_coverage(kcd_req *r, json_t *models) {
  size_t i;
  json_t *o;
  json_array_foreach(models, i, o) {
    const char *w = json_string_value(json_object_get(o, "warmup_json"));
    const char *model = json_string_value(json_object_get(o, "model"));
    cov c;
    if (cov_load(r, model, w, w ? strlen(w) : 0, &c) == KC_OK) {
      json_t *used = used_flags(&c);
      size_t present = 0;
      json_decref(cov_matrix(NULL, &c, used, &present));
      json_decref(used);
      if (c.name)
        json_object_set_new(o, "name", json_string(c.name));
      json_object_set_new(o, "coverage",
                          json_pack("{sI sI sb}", "present",
                                    (json_int_t)present, "expected",
                                    (json_int_t)(json_array_size(c.buckets) *
                                                 json_array_size(c.archs)),
                                    "warmup", c.expected));
    }
    cov_free(&c);
    json_object_del(o, "warmup_json");
  }
}

static int parse_limit(kcd_req *r, size_t *limit) {
  const char *q = kcd_query(r, "limit");
  *limit = LIST_DEFAULT;
  if (!q)
    return 0;
  char *end;
  long v = strtol(q, &end, 10);
  if (!*q || *end || v < 1 || v > LIST_MAX)
    return -1;
  *limit = (size_t)v;
  return 0;
}

int kcd_models_index(kcd_req *r) {
  size_t limit;
  if (parse_limit(r, &limit))
    return kcd_reply_error(r, KC_EINVAL, "limit: an integer from 1 to %d",
                           LIST_MAX);
  const char *cursor = kcd_query(r, "cursor");
  json_t *models = json_array();
  char next[KC_HEX_LEN + 1], err[KC_ERRBUF_SIZE] = "";
  kc_err e = models ? kc_store_models_list(kcd_store(r->st), cursor, limit,
                                           list_model, models, next, err)
                    : KC_NOMEM;
  if (e) {
    json_decref(models);
    return kcd_reply_error_json(r, e, err, NULL, NULL);
  }
  list_coverage(r, models);
  int auth = kcd_auth_enabled(&r->st->auth);
  return kcd_reply_json(r, 200,
                        json_pack("{so so ss ss* sb}", "models", models, "next",
                                  *next ? json_string(next) : json_null(),
                                  "role", kcd_role_name(r->role), "token",
                                  auth && *r->token_name ? r->token_name : NULL,
                                  "auth", auth),
                        NULL);
}

/* ---- GET /v1/models/{model} ---- */

/* One listing entry: the key fields worth showing, from the index's copy of
 * the key fields (a manifest may be megabytes; older stores lack the copy). */
static int model_entry(const kc_store_bundle_info *info, void *ud) {
  json_t *list = ud;
  json_t *m = info->fields
                  ? json_loadb(info->fields, info->fields_len, 0, NULL)
                  : json_loadb(info->manifest, info->manifest_len, 0, NULL);
  json_t *o = json_pack(
      "{ss sO* sO* sO* sI sI sI sI}", "key", info->key, "bucket",
      json_object_get(m, "bucket"), "arch", json_object_get(m, "arch"),
      "toolchain", json_object_get(m, "toolchain"), "bytes",
      (json_int_t)info->bytes, "created", (json_int_t)info->created,
      "last_used", (json_int_t)info->last_used, "hits", (json_int_t)info->hits);
  json_decref(m);
  if (!o || json_array_append_new(list, o))
    return 1; /* out of memory: stop */
  return 0;
}

int kcd_models_get(kcd_req *r) {
  json_t *list = json_array();
  if (!list)
    return kcd_reply_error(r, KC_NOMEM, "out of memory");
  char err[KC_ERRBUF_SIZE] = "";
  /* A replica lists what the bucket holds, not only what it has seen. */
  kc_err e = kc_store_fetch_model(kcd_store(r->st), r->param, err);
  if (e)
    kcd_log(r->st, "warn", "listing model %s in S3: %s", r->param, err);
  e = kc_store_model_list(kcd_store(r->st), r->param, model_entry, list);
  if (e && e != KC_NOT_FOUND) {
    json_decref(list);
    return kcd_reply_error(r, e, "cannot list model %s", r->param);
  }
  return kcd_reply_json(
      r, 200, json_pack("{ss so}", "model", r->param, "bundles", list), NULL);
}

/* ---- the warmup manifest ---- */

int kcd_warmup_get(kcd_req *r) {
  char *json = NULL, err[KC_ERRBUF_SIZE] = "";
  size_t len = 0;
  kc_err e = kc_store_warmup_get(kcd_store(r->st), r->param, &json, &len, err);
  if (e)
    return kcd_reply_error_json(r, e, err, NULL, NULL);
  return kcd_reply(r, 200, "application/json", json, len, KCD_MEM_FREE, NULL);
}

/* Validated by schema/'s parser, under the URL's model; kept as sent. A
 * model's name belongs to the first manifest that gave it: a write token
 * may replace a manifest under the same name, renaming or taking another
 * model's name needs admin (409 conflict), so a name a purge resolves
 * cannot be re-pointed by a write token. */
/* The archs a warm runs for: ?archs=a,b (its --arch, each a valid arch, at
 * most 64), else the manifest's; "" for neither. -1 on a bad list. */
static int run_archs(kcd_req *r, const kc_warmup *w, char *out, size_t cap) {
  const char *q = kcd_query(r, "archs");
  size_t n = 0, count = 0;
  out[0] = '\0';
  if (!q) {
    for (size_t i = 0; i < w->n_archs && n + strlen(w->archs[i]) + 2 < cap; i++)
      n +=
          (size_t)snprintf(out + n, cap - n, "%s%s", i ? "," : "", w->archs[i]);
    return 0;
  }
  char one[64];
  for (const char *a = q;; a++) {
    size_t l = strcspn(a, ",");
    if (l == 0 || l >= sizeof one || ++count > 64 || n + l + 2 >= cap)
      return -1;
    memcpy(one, a, l);
    one[l] = '\0';
    if (!kc_arch_valid(one))
      return -1;
    n += (size_t)snprintf(out + n, cap - n, "%s%s", n ? "," : "", one);
    a += l;
    if (!*a)
      return 0;
  }
}

int kcd_warmup_put(kcd_req *r) {
  char err[KC_ERRBUF_SIZE] = "", archs[KC_STORE_WARM_ARCHS_MAX];
  kc_warmup *w = NULL;
  const char *body = r->body ? r->body : "";
  kc_err e = kc_warmup_parse(body, r->body_len, NULL, &w, err);
  if (e)
    return kcd_reply_error_json(r, e == KC_NOMEM ? e : KC_BAD_WARMUP, err, NULL,
                                NULL);
  if (run_archs(r, w, archs, sizeof archs)) {
    kc_warmup_free(w);
    return kcd_reply_error(r, KC_EINVAL,
                           "archs: a comma list of at most 64 "
                           "archs (sm_80, sm_90a, compute_90, ...)");
  }
  int same = strcmp(w->model_hash, r->param) == 0;
  size_t cells = w->n_buckets * w->n_archs;
  if (!same) {
    kc_warmup_free(w);
    return kcd_reply_error(r, KC_KEY_MISMATCH,
                           "model.hash: the manifest's "
                           "model is not the URL's %s",
                           r->param);
  }
  char *old = NULL;
  size_t olen = 0;
  int had = kc_store_warmup_get(kcd_store(r->st), r->param, &old, &olen,
                                NULL) == KC_OK;
  free(old);
  int flags = r->role >= KCD_ROLE_ADMIN ? KC_WARMUP_RENAME : 0;
  e = kc_store_warmup_put(kcd_store(r->st), r->param, w->model_name, body,
                          r->body_len, flags, archs, err);
  kc_warmup_free(w);
  if (e)
    return kcd_reply_error_json(r, e, err, NULL, NULL);
  return kcd_reply_json(r, had ? 200 : 201,
                        json_pack("{ss sb sI}", "model", r->param, "created",
                                  !had, "cells", (json_int_t)cells),
                        NULL);
}

/* ---- DELETE /v1/models/{model} ---- */

int kcd_model_purge(kcd_req *r) {
  char err[KC_ERRBUF_SIZE] = "";
  size_t removed = 0;
  kc_err e = kc_store_model_purge(kcd_store(r->st), r->param, &removed, err);
  kcd_log(r->st, "info", "purge of model %s by %s: %zu bundles removed%s%s",
          r->param, r->token_name, removed, e ? ", then: " : "", e ? err : "");
  if (e)
    return kcd_reply_error_json(r, e, err, NULL, NULL);
  return kcd_reply_json(
      r, 200,
      json_pack("{ss sI}", "model", r->param, "removed", (json_int_t)removed),
      NULL);
}

/* ---- GET /v1/stats/history ---- */

static json_t *history_points(kcd_req *r, int64_t now) {
  int64_t *t = malloc(KCD_HIST_SLOTS * sizeof *t);
  uint64_t(*v)[KCD_H_N] = malloc(KCD_HIST_SLOTS * sizeof *v);
  size_t n = t && v ? kcd_history_read(r->st, now, t, v) : 0;
  json_t *pts = json_array();
  for (size_t i = 0; pts && i < n; i++) {
    json_t *p = json_pack("{sI}", "t", (json_int_t)t[i]);
    for (int c = 0; p && c < KCD_H_N; c++)
      json_object_set_new(p, kcd_hist_name((kcd_hist_counter)c),
                          json_integer((json_int_t)v[i][c]));
    json_array_append_new(pts, p);
  }
  free(t);
  free(v);
  return pts;
}

/* What the page shows beside the charts: gauges of now. */
static json_t *history_now(kcd_req *r) {
  kc_store *s = kcd_store(r->st);
  kc_store_stats ss = {0};
  int up = s && kc_store_stats_get(s, &ss) == KC_OK;
  json_t *o =
      json_pack("{sb sI sI sb sI sI sI}", "store_up", up, "leases",
                (json_int_t)kcd_lease_count(r->st->leases), "in_flight",
                (json_int_t)atomic_load(&r->st->metrics.in_flight[KCD_FE_HTTP]),
                "resp", kcd_status_up(r->st, KCD_FE_RESP), "kv_keys",
                (json_int_t)ss.kv_keys, "kv_bytes", (json_int_t)ss.kv_bytes,
                "kv_max_bytes", (json_int_t)ss.kv_max_bytes);
  kc_store_tier_stats t;
  if (o && r->st->s3 && s && kc_store_tier_stats_get(s, &t) == KC_OK)
    json_object_set_new(o, "s3",
                        json_pack("{sb sI sI sI sI}", "up", t.up, "queue_depth",
                                  (json_int_t)t.queue_depth, "errors",
                                  (json_int_t)t.errors, "parked",
                                  (json_int_t)t.parked, "uploaded",
                                  (json_int_t)t.uploaded));
  return o;
}

int kcd_history_get(kcd_req *r) {
  int64_t now = kcd_unix_now();
  return kcd_reply_json(
      r, 200,
      json_pack("{sI sI so so}", "step_s", (json_int_t)KCD_HIST_STEP_S, "now",
                (json_int_t)now, "points", history_points(r, now), "gauges",
                history_now(r)),
      NULL);
}
