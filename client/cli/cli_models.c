/* cli_models.c: `kcache ls` (every model, or one model's bundles, or its
 * coverage matrix with --matrix) and `kcache purge MODEL`. A model is named
 * by its hash or by the name in its warmup manifest. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cli.h"

static const char ls_usage[] = "usage: kcache ls [MODEL] [--matrix] [--json]\n";
static const char ls_help[] =
    "Without MODEL, list every model on the server: name, hash, coverage\n"
    "(cells present of those its warmup manifest expects), bundles, bytes,\n"
    "hits, last use. With MODEL (a name or a 64-hex hash), list its\n"
    "bundles; with --matrix, print its coverage: bucket rows, arch columns.\n"
    "  --matrix         the coverage matrix of MODEL\n"
    "  --json           the server's JSON as it is\n";
static const char purge_usage[] =
    "usage: kcache purge MODEL [--confirm HASH]\n";
static const char purge_help[] =
    "Delete every bundle of MODEL (a name or a 64-hex hash) on the server\n"
    "(admin token); blobs no other bundle uses are collected by its GC.\n"
    "A name is confirmed with the hash it resolves to: --confirm, or typed\n"
    "at the prompt on a terminal; without either, nothing is deleted and\n"
    "the hash is shown. A name two models share is refused.\n"
    "  --confirm HASH   the model's hash, or its first 12+ hex digits\n";

typedef struct models_args {
  kcli_common g;
  int json, matrix;
  const char *model;   /* NULL: none given */
  const char *confirm; /* purge --confirm: NULL none */
} models_args;

/* Common options, --json and --matrix; 0, -1 for --help, or an exit code. */
static int models_parse(const char *cmd, const char *usage, const char *help,
                        models_args *a, int argc, char **argv) {
  static const struct option own[] = {{"json", no_argument, NULL, 'j'},
                                      {"matrix", no_argument, NULL, 'm'},
                                      {"confirm", required_argument, NULL, 'C'},
                                      {NULL, 0, NULL, 0}};
  struct option lo[KCLI_LONGOPTS_MAX];
  memset(a, 0, sizeof *a);
  int opt, rc = kcli_common_init(&a->g, cmd);
  if (rc)
    return rc;
  kcli_long_options(own, lo);
  optind = 0;
  while ((opt = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    if (opt == 'h') {
      printf("%s\n%s\noptions:\n", usage, help);
      kcli_common_help(stdout);
      return -1;
    }
    if (opt == 'j')
      a->json = 1;
    else if (opt == 'm')
      a->matrix = 1;
    else if (opt == 'C' && !strcmp(cmd, "purge"))
      a->confirm = optarg;
    else if (opt == '?' || kcli_common_opt(&a->g, opt, optarg) != 1)
      return kcli_usage(cmd, usage);
  }
  int n = argc - optind;
  if (n > 1 || (n < 1 && (a->matrix || !strcmp(cmd, "purge"))))
    return kcli_usage(cmd, usage);
  a->model = n ? argv[optind] : NULL;
  return kcli_need_url(&a->g, cmd);
}

/* models_parse, then the client; NULL with *rc the exit code (0 after
 * --help). */
static kc_client *models_open(const char *cmd, const char *usage,
                              const char *help, models_args *a, int argc,
                              char **argv, int *rc) {
  int r = models_parse(cmd, usage, help, a, argc, argv);
  *rc = r < 0 ? KCLI_EXIT_OK : r;
  kc_client *c = r ? NULL : kcli_client(&a->g);
  if (!r && !c)
    *rc = KCLI_EXIT_FAIL;
  return c;
}

static void human(uint64_t n, char *out, size_t cap) {
  const char *u[] = {"B", "K", "M", "G", "T"};
  double v = (double)n;
  int i = 0;
  while (v >= 1024 && i < 4) {
    v /= 1024;
    i++;
  }
  snprintf(out, cap, i ? "%.1f%s" : "%.0f%s", v, u[i]);
}

static void ago(int64_t t, char *out, size_t cap) {
  int64_t s = t ? (int64_t)time(NULL) - t : -1;
  if (s < 0)
    snprintf(out, cap, "%s", t ? "now" : "never");
  else if (s < 3600)
    snprintf(out, cap, "%llds ago", (long long)s);
  else
    snprintf(out, cap, "%lldh ago", (long long)(s / 3600));
}

#define JI(o, k) ((long long)json_integer_value(json_object_get((o), (k))))
#define JS(o, k) json_string_value(json_object_get((o), (k)))

static void print_models(json_t *models) {
  size_t i;
  json_t *m;
  json_array_foreach(models, i, m) {
    char cov[32] = "-", bytes[16], last[24];
    json_t *c = json_object_get(m, "coverage");
    if (c)
      snprintf(cov, sizeof cov, "%lld/%lld", JI(c, "present"),
               JI(c, "expected"));
    human((uint64_t)JI(m, "bytes"), bytes, sizeof bytes);
    ago(JI(m, "last_used"), last, sizeof last);
    const char *name = JS(m, "name");
    printf("%-24.64s %.12s  %7s %7lld %8s %8lld  %s\n", name ? name : "-",
           JS(m, "model") ? JS(m, "model") : "?", cov, JI(m, "bundles"), bytes,
           JI(m, "hits"), last);
  }
}

/* Every page of GET /v1/models. */
static int ls_all(kc_client *c, int raw) {
  char cursor[KC_HEX_LEN + 1] = "", err[KC_ERRBUF_SIZE], *body = NULL;
  if (!raw)
    printf("%-24s %-12s  %7s %7s %8s %8s  %s\n", "NAME", "HASH", "COVER",
           "BUNDLES", "BYTES", "HITS", "LAST USE");
  do {
    kc_err e = kc_client_models(c, cursor, &body, err);
    if (e)
      return kcli_fail("ls", KCLI_EXIT_FAIL, "%s", err);
    json_t *root = json_loads(body, 0, NULL);
    if (raw)
      puts(body);
    else
      print_models(json_object_get(root, "models"));
    free(body);
    const char *next = JS(root, "next");
    snprintf(cursor, sizeof cursor, "%s",
             next && kc_is_hex64(next) ? next : "");
    json_decref(root);
  } while (*cursor);
  return KCLI_EXIT_OK;
}

/* One line per bundle of GET /v1/models/{model}. */
static void print_bundles(const json_t *list) {
  size_t i;
  json_t *b;
  json_array_foreach(list, i, b) {
    char *bucket =
        json_dumps(json_object_get(b, "bucket"), JSON_COMPACT | JSON_SORT_KEYS);
    printf("%s  %-8s %-28s %10lld B  %lld hits\n", JS(b, "key"), JS(b, "arch"),
           bucket ? bucket : "-", JI(b, "bytes"), JI(b, "hits"));
    free(bucket);
  }
}

/* "batch=8,seq=1024" of a bucket object. */
static void bucket_text(json_t *b, char *out, size_t cap) {
  char *j = json_dumps(b, JSON_COMPACT | JSON_SORT_KEYS);
  size_t n = 0;
  for (const char *p = j ? j : ""; *p && n + 1 < cap; p++)
    if (*p != '{' && *p != '}' && *p != '"')
      out[n++] = *p == ':' ? '=' : *p;
  out[n] = '\0';
  free(j);
}

/* Where the columns come from: the archs the warms ran for (--arch), the
 * manifest's, or the bundles'. */
static void print_archs_from(json_t *cov) {
  const char *from = JS(cov, "archs_from");
  json_t *m = json_object_get(cov, "manifest_archs"), *a;
  size_t i;
  if (!from)
    return;
  printf("archs: %s", !strcmp(from, "warm")       ? "those its warms ran for"
                      : !strcmp(from, "manifest") ? "the manifest's"
                                                  : "those its bundles have");
  if (!strcmp(from, "warm") && json_array_size(m)) {
    printf(" (the manifest lists");
    json_array_foreach(m, i, a) printf(" %s", json_string_value(a));
    putchar(')');
  }
  putchar('\n');
}

static void print_matrix(json_t *cov) {
  json_t *archs = json_object_get(cov, "archs"), *a, *b;
  size_t i, j;
  const char *name = JS(cov, "name");
  printf("%s  %s  %lld/%lld present%s\n", name ? name : "-", JS(cov, "model"),
         JI(cov, "present"), JI(cov, "expected"),
         json_is_true(json_object_get(cov, "warmup"))
             ? ""
             : " (no warmup manifest: the cells its bundles have)");
  print_archs_from(cov);
  printf("%-24s", "bucket \\ arch");
  json_array_foreach(archs, j, a) printf(" %-10s", json_string_value(a));
  putchar('\n');
  json_array_foreach(json_object_get(cov, "buckets"), i, b) {
    char bt[128], cell[16];
    bucket_text(b, bt, sizeof bt);
    printf("%-24.24s", bt);
    json_t *row = json_array_get(json_object_get(cov, "cells"), i);
    json_array_foreach(archs, j, a) {
      json_t *c = json_array_get(row, j);
      const char *st = JS(c, "state");
      if (st && !strcmp(st, "present"))
        human((uint64_t)JI(c, "bytes"), cell, sizeof cell);
      else
        snprintf(cell, sizeof cell, "%s",
                 st && !strcmp(st, "building") ? "building" : "-");
      printf(" %-10s", cell);
    }
    putchar('\n');
  }
  size_t n = json_array_size(json_object_get(cov, "extra"));
  if (n)
    printf("%zu bundles present but no longer expected\n", n);
}

static int ls_model(kc_client *c, const models_args *a) {
  char err[KC_ERRBUF_SIZE], model[KC_HEX_LEN + 1], *body = NULL;
  kc_err e = kc_client_model_resolve(c, a->model, model, err);
  if (!e)
    e = a->matrix ? kc_client_coverage(c, model, &body, err)
                  : kc_client_model_list(c, model, &body, err);
  if (e)
    return kcli_fail("ls", KCLI_EXIT_FAIL, "%s", err);
  json_t *root = json_loads(body, 0, NULL);
  if (a->json || !root)
    puts(body);
  else if (a->matrix)
    print_matrix(root);
  else
    print_bundles(json_object_get(root, "bundles"));
  json_decref(root);
  free(body);
  return KCLI_EXIT_OK;
}

int kcli_cmd_ls(int argc, char **argv) {
  models_args a;
  int rc;
  kc_client *c = models_open("ls", ls_usage, ls_help, &a, argc, argv, &rc);
  if (!c)
    return rc;
  rc = a.model ? ls_model(c, &a) : ls_all(c, a.json);
  kc_client_free(c);
  return rc;
}

/* 1 when text is the hash or a prefix of it of at least 12 hex digits. */
static int confirms(const char *text, const char *hash) {
  size_t n = strlen(text);
  while (n &&
         (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == ' '))
    n--;
  if (n < 12 || n > KC_HEX_LEN)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (!((text[i] >= '0' && text[i] <= '9') ||
          (text[i] >= 'a' && text[i] <= 'f')))
      return 0;
  return strncmp(text, hash, n) == 0;
}

/* Bundles the server holds for model (-1 when it cannot tell). */
static long long bundle_count(kc_client *c, const char *model) {
  char err[KC_ERRBUF_SIZE], *body = NULL;
  if (kc_client_model_list(c, model, &body, err))
    return -1;
  json_t *root = json_loads(body, 0, NULL);
  free(body);
  long long n =
      root ? (long long)json_array_size(json_object_get(root, "bundles")) : -1;
  json_decref(root);
  return n;
}

/* A purge by name deletes only the hash its user saw: the name is resolved
 * (refused when two models share it), then the hash is confirmed by
 * --confirm or typed on a terminal. Without either, the hash is shown and
 * nothing is deleted: a name a manifest gave is not proof of identity.
 * KCLI_EXIT_OK to go on. */
static int purge_confirm(kc_client *c, const models_args *a,
                         const char *model) {
  if (kc_is_hex64(a->model))
    return KCLI_EXIT_OK; /* the hash itself was given */
  long long n = bundle_count(c, model);
  char what[256];
  snprintf(what, sizeof what, "'%.100s' is model %s (%lld bundles)", a->model,
           model, n);
  if (a->confirm) {
    if (confirms(a->confirm, model))
      return KCLI_EXIT_OK;
    return kcli_fail("purge", KCLI_EXIT_FAIL,
                     "%s: --confirm %.80s is not "
                     "its hash; nothing deleted",
                     what, a->confirm);
  }
  if (isatty(0) && isatty(2)) {
    char line[128] = "";
    fprintf(stderr,
            "%s.\nType its hash (at least the first 12 hex digits) "
            "to purge it: ",
            what);
    if (fgets(line, sizeof line, stdin) && confirms(line, model))
      return KCLI_EXIT_OK;
    return kcli_fail("purge", KCLI_EXIT_FAIL,
                     "not confirmed; nothing "
                     "deleted");
  }
  return kcli_fail("purge", KCLI_EXIT_FAIL,
                   "%s; to purge it: kcache purge "
                   "%.100s --confirm %.12s (nothing deleted)",
                   what, a->model, model);
}

int kcli_cmd_purge(int argc, char **argv) {
  models_args a;
  int rc;
  kc_client *c =
      models_open("purge", purge_usage, purge_help, &a, argc, argv, &rc);
  if (!c)
    return rc;
  char err[KC_ERRBUF_SIZE], model[KC_HEX_LEN + 1], *body = NULL;
  kc_err e = kc_client_model_resolve(c, a.model, model, err);
  if (e) {
    kc_client_free(c);
    return kcli_fail("purge", KCLI_EXIT_FAIL, "%s", err);
  }
  if ((rc = purge_confirm(c, &a, model))) {
    kc_client_free(c);
    return rc;
  }
  e = kc_client_model_purge(c, model, &body, err);
  kc_client_free(c);
  if (e)
    return kcli_fail("purge", KCLI_EXIT_FAIL, "%s", err);
  json_t *root = json_loads(body, 0, NULL);
  if (a.json)
    puts(body);
  else
    printf("purged %lld bundles of %s\n", JI(root, "removed"), model);
  json_decref(root);
  free(body);
  return KCLI_EXIT_OK;
}
