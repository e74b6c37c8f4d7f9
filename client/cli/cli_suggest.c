/* cli_suggest.c: `kcache suggest`: reads a model's demand histogram from
 * kcached (GET /v1/models/{model}/demand), proposes K buckets per dimension
 * that minimise padding over the observed shapes (suggest.h says how), prints
 * the padding before (the buckets of --manifest, else of the warmup manifest
 * kcached holds) and after, and writes the warmup manifest with its buckets
 * replaced. MODEL is a name or a hash, as for ls and purge. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"
#include "suggest.h"

static const char suggest_usage[] =
    "usage: kcache suggest [MODEL] [--buckets K] [--manifest FILE]\n"
    "                      [--out FILE]\n";

static const char suggest_help[] =
    "\n"
    "Propose buckets from the shapes a model ran (reported by services with\n"
    "kc_demand_note and kept by kcached), so that buckets follow traffic.\n"
    "Each dimension is segmented on its own (optimal by dynamic programming,\n"
    "boundaries at observed values); the buckets are the cells of their\n"
    "product that some observed shape falls in. MODEL (a name or a 64-hex\n"
    "hash) defaults to the manifest's model.hash. Without --manifest, the\n"
    "warmup manifest kcached holds for MODEL gives the 'before'.\n"
    "\n"
    "  --buckets K      boundaries per dimension (1..64, default 4)\n"
    "  --manifest FILE  the warmup manifest: its buckets are the 'before',\n"
    "                   its dimensions the ones considered\n"
    "  --out FILE       write the manifest with the suggested buckets (may be\n"
    "                   FILE itself; written atomically). Without demand the\n"
    "                   manifest is written unchanged\n"
    "\noptions for every command:\n";

typedef struct sargs {
  kcli_common g;
  size_t k;
  const char *model, *manifest, *out;
} sargs;

static int suggest_opt(void *arg_, int opt, const char *arg) {
  sargs *a = arg_;
  char *end;
  long n;
  switch (opt) {
  case 'k':
    n = strtol(arg, &end, 10);
    if (*end || n < 1 || n > KCC_SUGGEST_K_MAX)
      return -1;
    a->k = (size_t)n;
    return 0;
  case 'm':
    a->manifest = arg;
    return 0;
  case 'o':
    a->out = arg;
    return 0;
  default:
    return kcli_common_opt(&a->g, opt, arg) == 1 ? 0 : -1;
  }
}

/* 0 go on, -1 help shown, else the exit code. */
static int suggest_parse(sargs *a, int argc, char **argv) {
  static const struct option own[] = {
      {"buckets", required_argument, NULL, 'k'},
      {"manifest", required_argument, NULL, 'm'},
      {"out", required_argument, NULL, 'o'},
      {NULL, 0, NULL, 0}};
  int rc = kcli_parse("suggest", suggest_usage, suggest_help, NULL, own,
                      suggest_opt, a, argc, argv);
  if (rc)
    return rc;
  int n = argc - optind;
  if (n > 1 || (n == 0 && !a->manifest) || (a->out && !a->manifest))
    return kcli_usage("suggest", suggest_usage);
  a->model = n ? argv[optind] : NULL;
  if (a->model && !*a->model)
    return kcli_fail("suggest", KCLI_EXIT_USAGE, "MODEL is empty");
  return kcli_need_url(&a->g, "suggest");
}

/* A JSON bucket object into b; -1 when it is not one. */
static int bucket_of(json_t *o, kc_bucket *b) {
  const char *name;
  json_t *v;
  memset(b, 0, sizeof *b);
  if (!json_is_object(o) || json_object_size(o) > KC_MAX_DIMS)
    return -1;
  json_object_foreach(o, name, v) {
    if (strlen(name) > KC_NAME_MAX || !json_is_integer(v) ||
        json_integer_value(v) < 0)
      return -1;
    kc_dim *d = &b->dims[b->n++];
    memcpy(d->name, name, strlen(name) + 1);
    d->value = (uint64_t)json_integer_value(v);
  }
  return b->n ? 0 : -1;
}

/* "batch,seq": the sorted names of b, the set shapes are grouped by. */
static void names_of(const kc_bucket *b, char *out, size_t cap) {
  char label[1024];
  kc_bucket_label(b, label, sizeof label);
  size_t n = 0;
  out[0] = '\0';
  for (char *save = NULL, *t = strtok_r(label, ",", &save); t && n < cap;
       t = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(t, '=');
    if (eq)
      *eq = '\0';
    n += (size_t)snprintf(out + n, cap - n, "%s%s", n ? "," : "", t);
  }
}

/* The histogram's shapes of the dimensions dims ("" : the most counted
 * set, written back into dims). *ignored: runs of other dimensions. */
static size_t pick_shapes(json_t *hist, char *dims, size_t cap, kcc_shape **out,
                          uint64_t *ignored) {
  json_t *shapes = json_object_get(hist, "shapes"), *it;
  size_t n = json_array_size(shapes), m = 0, i;
  *out = calloc(n + 1, sizeof **out);
  *ignored = 0;
  if (!*out)
    return 0;
  json_array_foreach(shapes, i, it) {
    kcc_shape *s = &(*out)[m];
    json_int_t c = json_integer_value(json_object_get(it, "count"));
    if (bucket_of(json_object_get(it, "shape"), &s->shape) || c < 1)
      continue;
    s->count = (uint64_t)c;
    char nm[600];
    names_of(&s->shape, nm, sizeof nm);
    if (!dims[0]) /* listed most counted first: its set is the first */
      snprintf(dims, cap, "%s", nm);
    if (strcmp(nm, dims))
      *ignored += s->count;
    else
      m++;
  }
  return m;
}

static void print_waste(const char *when, size_t nb, kcc_cost w, uint64_t runs,
                        uint64_t beyond) {
  char t[40];
  kcc_cost_text(w, t);
  printf("%-7s %zu buckets, padding %s (%.2f per run)", when, nb, t,
         runs > beyond ? (double)w / (double)(runs - beyond) : 0.0);
  if (beyond)
    printf(", %llu runs beyond every bucket", (unsigned long long)beyond);
  putchar('\n');
}

/* The manifest with buckets b (sorted dims), checked, written atomically. */
static int write_manifest(const sargs *a, const kc_bucket *b, size_t n) {
  char err[KC_ERRBUF_SIZE];
  json_error_t je;
  json_t *root = json_load_file(a->manifest, JSON_REJECT_DUPLICATES, &je);
  json_t *list = json_array();
  for (size_t i = 0; root && b && i < n; i++) {
    json_array_append_new(list, kc_bucket_to_json(&b[i]));
  }
  if (root && b)
    json_object_set_new(root, "buckets", list);
  else
    json_decref(list);
  char *text = root ? json_dumps(root, JSON_INDENT(2)) : NULL;
  json_decref(root);
  kc_warmup *w = NULL;
  kc_err e = text ? kc_warmup_parse(text, strlen(text), NULL, &w, err)
                  : kc_errf(err, KC_BAD_WARMUP, "%s: %s", a->manifest, je.text);
  kc_warmup_free(w);
  if (!e) {
    size_t len = strlen(text);
    text[len] = '\n'; /* json_dumps' buffer has room for its NUL */
    e = kc_write_file_atomic(a->out, text, len + 1, err);
  }
  free(text);
  if (e)
    return kcli_fail("suggest", KCLI_EXIT_FAIL, "%s", err);
  printf("wrote %s\n", a->out);
  return KCLI_EXIT_OK;
}

/* The histogram of the model, parsed; NULL after saying why. */
static json_t *fetch_hist(kc_client *c, const char *model) {
  char err[KC_ERRBUF_SIZE], *body = NULL;
  kc_err e = kc_client_demand_get(c, model, &body, err);
  json_t *j = e ? NULL : json_loads(body, 0, NULL);
  free(body);
  if (e)
    kcli_fail("suggest", KCLI_EXIT_FAIL, "%s", err);
  else if (!json_is_object(j))
    kcli_fail("suggest", KCLI_EXIT_FAIL,
              "kcached sent a demand body that "
              "is not a JSON object");
  return j;
}

static uint64_t runs_of(const kcc_shape *s, size_t n) {
  uint64_t r = 0;
  for (size_t i = 0; i < n; i++)
    r += s[i].count;
  return r;
}

/* Prints before and after and the buckets; writes --out. */
static int report(const sargs *a, const kc_warmup *w, const kcc_shape *s,
                  size_t n, const char *dims, uint64_t ignored,
                  const char *w_from) {
  char err[KC_ERRBUF_SIZE], label[1024];
  kc_bucket *out = NULL;
  size_t nout = 0;
  kcc_cost after, before;
  uint64_t beyond, runs = runs_of(s, n);
  if (kcc_suggest(s, n, a->k, &out, &nout, &after, err))
    return kcli_fail("suggest", KCLI_EXIT_FAIL, "%s", err);
  printf("%llu runs of %zu distinct shapes (%s)", (unsigned long long)runs, n,
         dims);
  if (ignored)
    printf("; %llu runs of other dimensions ignored",
           (unsigned long long)ignored);
  putchar('\n');
  if (w) {
    kcc_suggest_waste(s, n, w->buckets, w->n_buckets, &before, &beyond);
    print_waste("before:", w->n_buckets, before, runs, beyond);
    if (w_from)
      printf("        (%s)\n", w_from);
  }
  kcc_suggest_waste(s, n, out, nout, &after, &beyond);
  print_waste("after:", nout, after, runs, beyond);
  for (size_t i = 0; i < nout; i++) {
    kc_bucket_label(&out[i], label, sizeof label);
    printf("  %s\n", label);
  }
  int rc = a->out ? write_manifest(a, out, nout) : KCLI_EXIT_OK;
  free(out);
  return rc;
}

/* The warmup manifest kcached holds for model, parsed; NULL when it has
 * none (or it does not parse: then said, and suggest goes on without). */
static kc_warmup *server_warmup(kc_client *c, const char *model) {
  char err[KC_ERRBUF_SIZE], *json = NULL;
  kc_warmup *w = NULL;
  kc_err e = kc_client_warmup_get(c, model, &json, err);
  if (!e && kc_warmup_parse(json, strlen(json), NULL, &w, err)) {
    fprintf(stderr, "kcache suggest: the warmup manifest kcached holds: %s\n",
            err);
    w = NULL;
  } else if (e && e != KC_NOT_FOUND) {
    fprintf(stderr, "kcache suggest: %s\n", err);
  }
  free(json);
  return w;
}

/* The model: MODEL resolved (a name or a hash), else the manifest's. */
static int pick_model(kc_client *c, const sargs *a, const kc_warmup *w,
                      char model[KC_HEX_LEN + 1]) {
  char err[KC_ERRBUF_SIZE];
  if (!a->model) {
    snprintf(model, KC_HEX_LEN + 1, "%s", w->model_hash);
    return KCLI_EXIT_OK;
  }
  if (kc_client_model_resolve(c, a->model, model, err))
    return kcli_fail("suggest", KCLI_EXIT_FAIL, "%s", err);
  if (w && strcmp(model, w->model_hash))
    return kcli_fail("suggest", KCLI_EXIT_USAGE,
                     "MODEL is not the manifest's model.hash");
  return KCLI_EXIT_OK;
}

int kcli_cmd_suggest(int argc, char **argv) {
  sargs a = {.k = 4};
  char err[KC_ERRBUF_SIZE], dims[600] = "", model[KC_HEX_LEN + 1];
  int rc = kcli_common_init(&a.g, "suggest");
  if (!rc)
    rc = suggest_parse(&a, argc, argv);
  if (rc)
    return rc < 0 ? KCLI_EXIT_OK : rc;
  kc_warmup *w = NULL;
  if (a.manifest && kc_warmup_load(a.manifest, &w, err))
    return kcli_fail("suggest", KCLI_EXIT_FAIL, "%s", err);
  kc_client *c = kcli_client(&a.g);
  rc = c ? pick_model(c, &a, w, model) : KCLI_EXIT_FAIL;
  const char *w_from = NULL;
  if (!rc && !w && (w = server_warmup(c, model)))
    w_from = "the buckets of the warmup manifest kcached holds";
  if (w)
    names_of(&w->buckets[0], dims, sizeof dims);
  json_t *hist = rc ? NULL : fetch_hist(c, model);
  kc_client_free(c);
  kcc_shape *s = NULL;
  uint64_t ignored = 0;
  size_t n = hist ? pick_shapes(hist, dims, sizeof dims, &s, &ignored) : 0;
  if (!rc && !hist)
    rc = KCLI_EXIT_FAIL;
  else if (!rc && !n) {
    printf("no demand recorded for model %s%s; buckets unchanged\n", model,
           ignored ? " in the manifest's dimensions" : "");
    rc = a.out ? write_manifest(&a, NULL, 0) : KCLI_EXIT_OK;
  } else if (!rc) {
    rc = report(&a, w, s, n, dims, ignored, w_from);
  }
  free(s);
  json_decref(hist);
  kc_warmup_free(w);
  return rc;
}
