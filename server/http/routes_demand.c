/* routes_demand.c: POST /v1/demand (services report the shapes they ran and
 * what they asked for and did not find) and GET /v1/models/{model}/demand
 * (the model's histogram). The store counts in memory and writes once a
 * second (kc_store.h, "Demand"); this file only validates and converts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"

/* One validated entry of a report. */
typedef struct dentry {
  kc_store_demand_kind kind;
  uint64_t count;
  char text[KC_STORE_DEMAND_TEXT_MAX + 1];
} dentry;

/* name cut to 32 bytes, non-printable bytes as '?' (messages quote it). */
static void clean(const char *name, char out[KC_NAME_MAX + 1]) {
  size_t i = 0;
  for (; name[i] && i < KC_NAME_MAX; i++)
    out[i] = name[i] > ' ' && name[i] < 127 ? name[i] : '?';
  out[i] = '\0';
}

/* A bucket object {"name":int,...} into canonical text. */
static kc_err parse_dims(json_t *o, const char *what, char *text, char *err) {
  kc_bucket b;
  memset(&b, 0, sizeof b);
  size_t n = json_object_size(o);
  if (n < 1 || n > KC_MAX_DIMS)
    return kc_errf(err, KC_EINVAL, "%s: %zu dimensions (1 to 16)", what, n);
  const char *name;
  json_t *v;
  json_object_foreach(o, name, v) {
    char shown[KC_NAME_MAX + 1];
    clean(name, shown);
    if (strlen(name) > KC_NAME_MAX)
      return kc_errf(err, KC_EINVAL, "%s: name '%s...' is over 32 bytes", what,
                     shown);
    json_int_t x = json_integer_value(v);
    if (!json_is_integer(v) || x < 0 || (uint64_t)x > KC_BUCKET_VALUE_MAX)
      return kc_errf(err, KC_EINVAL, "%s.%s: not an integer in 0..2^53", what,
                     shown);
    kc_dim *d = &b.dims[b.n++];
    memcpy(d->name, name, strlen(name) + 1);
    d->value = (uint64_t)x;
  }
  char why[KC_ERRBUF_SIZE] = "";
  if (kc_store_demand_shape_text(&b, text, why))
    /* why says "shape...": name the element instead. */
    return kc_errf(err, KC_EINVAL, "%s%s", what,
                   strncmp(why, "shape", 5) == 0 ? why + 5 : why);
  return KC_OK;
}

/* count: absent (1), or an integer in 1..COUNT_MAX. */
static kc_err parse_count(json_t *c, const char *what, uint64_t *out,
                          char *err) {
  *out = 1;
  if (!c)
    return KC_OK;
  json_int_t x = json_integer_value(c);
  if (!json_is_integer(c) || x < 1 || (uint64_t)x > KC_STORE_DEMAND_COUNT_MAX)
    return kc_errf(err, KC_EINVAL, "%s.count: not an integer in 1..%llu", what,
                   KC_STORE_DEMAND_COUNT_MAX);
  *out = (uint64_t)x;
  return KC_OK;
}

/* A shape element: {"batch":8,...}, or {"shape":{...},"count":n}. */
static kc_err parse_shape(json_t *v, const char *what, dentry *d, char *err) {
  if (!json_is_object(v))
    return kc_errf(err, KC_EINVAL, "%s: not an object", what);
  json_t *inner = json_object_get(v, "shape");
  d->count = 1;
  if (!json_is_object(inner))
    return parse_dims(v, what, d->text, err);
  json_t *c = json_object_get(v, "count");
  if (json_object_size(v) != 1 + (c != NULL))
    return kc_errf(err, KC_EINVAL,
                   "%s: a counted shape has only \"shape\" and \"count\"",
                   what);
  kc_err e = parse_count(c, what, &d->count, err);
  if (e)
    return e;
  char w[64];
  snprintf(w, sizeof w, "%s.shape", what);
  return parse_dims(inner, w, d->text, err);
}

/* A miss: a key (64 hex), {"key":hex,"count":n}, or a shape as above. */
static kc_err parse_miss(json_t *v, const char *what, dentry *d, char *err) {
  json_t *k = json_object_get(v, "key"), *c = json_object_get(v, "count");
  if (json_is_string(k)) {
    if (json_object_size(v) != 1 + (c != NULL))
      return kc_errf(err, KC_EINVAL,
                     "%s: a counted key has only \"key\" and \"count\"", what);
    kc_err e = parse_count(c, what, &d->count, err);
    if (e)
      return e;
    v = k;
  } else if (!json_is_string(v)) {
    d->kind = KC_DEMAND_MISS_SHAPE;
    return parse_shape(v, what, d, err);
  } else {
    d->count = 1;
  }
  d->kind = KC_DEMAND_MISS_KEY;
  if (!kc_is_hex64(json_string_value(v)))
    return kc_errf(err, KC_BAD_KEY, "%s: a key must be 64 lowercase hex digits",
                   what);
  memcpy(d->text, json_string_value(v), KC_HEX_LEN + 1);
  return KC_OK;
}

static kc_err parse_list(json_t *root, const char *field, dentry *out,
                         size_t *n, char *err) {
  json_t *a = json_object_get(root, field);
  if (!a)
    return KC_OK;
  if (!json_is_array(a))
    return kc_errf(err, KC_EINVAL, "%s: not an array", field);
  if (*n + json_array_size(a) > KC_LOOKUP_MAX)
    return kc_errf(err, KC_EINVAL,
                   "more than %d shapes and misses in one report",
                   KC_LOOKUP_MAX);
  size_t i;
  json_t *v;
  json_array_foreach(a, i, v) {
    char what[32];
    snprintf(what, sizeof what, "%s[%zu]", field, i);
    dentry *d = &out[(*n)++];
    d->kind = KC_DEMAND_SHAPE;
    kc_err e = strcmp(field, "misses") ? parse_shape(v, what, d, err)
                                       : parse_miss(v, what, d, err);
    if (e)
      return e;
  }
  return KC_OK;
}

static kc_err parse_report(kcd_req *r, char model[KC_HEX_LEN + 1], dentry **out,
                           size_t *n, char *err) {
  static const char *const allowed[] = {"model", "shapes", "misses", NULL};
  json_t *root = NULL;
  *out = NULL;
  *n = 0;
  kc_err e = kcd_json_object(r, allowed, &root, err);
  if (e)
    return e;
  const char *m = json_string_value(json_object_get(root, "model"));
  if (!m || !kc_is_hex64(m))
    e = kc_errf(err, KC_BAD_KEY, "model: must be 64 lowercase hex digits");
  else if (!(*out = malloc(KC_LOOKUP_MAX * sizeof **out)))
    e = kc_errf(err, KC_NOMEM, "out of memory");
  else if (!(e = parse_list(root, "shapes", *out, n, err)))
    e = parse_list(root, "misses", *out, n, err);
  if (!e)
    memcpy(model, m, KC_HEX_LEN + 1);
  json_decref(root);
  return e;
}

/* One report adds at most KC_STORE_DEMAND_REPORT_MAX (a client chooses its
 * counts): a larger one is scaled down, each count in proportion and at
 * least 1, so that its shape of traffic is kept and its weight bounded.
 * 1 when it was scaled. */
static int scale_report(dentry *d, size_t n) {
  unsigned __int128 sum = 0;
  for (size_t i = 0; i < n; i++)
    sum += d[i].count;
  if (sum <= KC_STORE_DEMAND_REPORT_MAX)
    return 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t c = (uint64_t)((unsigned __int128)d[i].count *
                            KC_STORE_DEMAND_REPORT_MAX / sum);
    d[i].count = c ? c : 1;
  }
  return 1;
}

int kcd_demand_post(kcd_req *r) {
  char err[KC_ERRBUF_SIZE] = "", model[KC_HEX_LEN + 1];
  dentry *d = NULL;
  size_t n = 0, dropped = 0;
  kc_err e = parse_report(r, model, &d, &n, err);
  if (e) {
    free(d);
    return kcd_reply_error_json(r, e, err, NULL, NULL);
  }
  /* Validated whole before counting: a bad report counts nothing. */
  int scaled = scale_report(d, n);
  int known = kc_store_model_known(kcd_store(r->st), model);
  for (size_t i = 0; i < n; i++)
    if (kc_store_demand_add(kcd_store(r->st), model, d[i].kind, d[i].text,
                            d[i].count, known, NULL))
      dropped++;
  free(d);
  return kcd_reply_json(r, 200,
                        json_pack("{sI sI sb}", "accepted",
                                  (json_int_t)(n - dropped), "dropped",
                                  (json_int_t)dropped, "scaled", scaled),
                        NULL);
}

/* A histogram item as JSON: {"shape":{...}|"key":hex, "count":n}. */
static json_t *item_json(const kc_store_demand_item *it) {
  if (it->kind == KC_DEMAND_MISS_KEY)
    return json_pack("{ss sI}", "key", it->text, "count",
                     (json_int_t)it->count);
  kc_bucket b;
  if (kc_store_demand_shape_parse(it->text, &b))
    return NULL;
  return json_pack("{so sI}", "shape", kc_bucket_to_json(&b), "count",
                   (json_int_t)it->count);
}

int kcd_demand_get(kcd_req *r) {
  char err[KC_ERRBUF_SIZE] = "";
  kc_store_demand d;
  kc_err e = kc_store_demand_get(kcd_store(r->st), r->param, &d, err);
  if (e)
    return kcd_reply_error_json(r, e, err, NULL, NULL);
  json_t *shapes = json_array(), *misses = json_array();
  for (size_t i = 0; i < d.n; i++) {
    json_t *j = item_json(&d.items[i]);
    if (j)
      json_array_append_new(
          d.items[i].kind == KC_DEMAND_SHAPE ? shapes : misses, j);
  }
  json_t *o = json_pack("{ss sI sI sI so so}", "model", r->param, "total",
                        (json_int_t)d.total, "dropped", (json_int_t)d.dropped,
                        "updated", (json_int_t)d.updated, "shapes", shapes,
                        "misses", misses);
  kc_store_demand_free(&d);
  if (!o)
    return kcd_reply_error(r, KC_NOMEM, "out of memory");
  return kcd_reply_json(r, 200, o, NULL);
}
