/* cli_cmds.c: the small kcache commands: push, pull, get, put, key, stat,
 * hash (ls and purge are in cli_models.c). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "cli.h"

/* The manifest a pulled directory carries, so that `push DIR` round-trips. */
#define BUNDLE_FILE "kcache-bundle.json"

typedef struct cmd_spec {
  const char *name;
  const char *usage;
  const char *help;
  int min_args, max_args; /* positional; max -1: any */
  int needs_url;
} cmd_spec;

/* Parses the common options and an optional extra one ('o' with an
 * argument, 'f' fields, 'j' json) and, for get, --max-size into *max_size
 * (may be NULL: not taken). Returns 0 and sets *first to the first
 * positional, or the exit code (-1 for --help, which exits 0). */
static int parse(const cmd_spec *s, int argc, char **argv, kcli_common *g,
                 const char **extra, const char **max_size, int *first) {
  static const struct option own[] = {
      {"output", required_argument, NULL, 'o'},
      {"fields", required_argument, NULL, 'f'},
      {"json", no_argument, NULL, 'j'},
      {"max-size", required_argument, NULL, 'm'},
      {NULL, 0, NULL, 0}};
  struct option lo[KCLI_LONGOPTS_MAX];
  int opt, rc = kcli_common_init(g, s->name);
  if (rc)
    return rc;
  kcli_long_options(own, lo);
  optind = 0;
  while ((opt = getopt_long(argc, argv, "ho:", lo, NULL)) != -1) {
    if (opt == 'h') {
      printf("%s\n%s\noptions:\n", s->usage, s->help);
      kcli_common_help(stdout);
      return -1;
    }
    if ((opt == 'o' || opt == 'f' || opt == 'j') && extra)
      *extra = opt == 'j' ? "json" : optarg;
    else if (opt == 'm' && max_size)
      *max_size = optarg;
    else if (opt == '?' || kcli_common_opt(g, opt, optarg) != 1)
      return kcli_usage(s->name, s->usage);
  }
  int n = argc - optind;
  if (n < s->min_args || (s->max_args >= 0 && n > s->max_args))
    return kcli_usage(s->name, s->usage);
  *first = optind;
  return 0;
}

#define PARSE_OR_RETURN(spec, extra)                                           \
  kcli_common g;                                                               \
  int first = 0;                                                               \
  int prc_ = parse(&spec, argc, argv, &g, extra, NULL, &first);                \
  if (prc_)                                                                    \
    return prc_ < 0 ? KCLI_EXIT_OK : prc_;                                     \
  if ((spec).needs_url && kcli_need_url(&g, (spec).name))                      \
    return KCLI_EXIT_USAGE;

/* Messages name their file once: kc_read_file's names it already, a
 * parser's does not (it only sees the text), so parse errors are named
 * here. */
static kc_err named(kc_err e, const char *path, const char *inner, char *err) {
  return e ? kc_errf(err, e, "%s: %s", path, inner) : KC_OK;
}

/* Key fields from a JSON file. */
static kc_err read_fields(const char *path, kc_key_fields *f, char *err) {
  char *json = NULL, inner[KC_ERRBUF_SIZE];
  size_t len = 0;
  kc_err e = kc_read_file(path, &json, &len, err);
  if (!e)
    e = named(kc_key_fields_parse(json, len, f, inner), path, inner, err);
  free(json);
  return e;
}

/* ---- push ---- */

static const cmd_spec push_spec = {
    "push",
    "usage: kcache push DIR [--fields FIELDS.json]\n",
    "Upload a bundle directory: with --fields, every file under DIR becomes\n"
    "the bundle of those key fields; without, DIR/" BUNDLE_FILE " (written by\n"
    "`kcache pull`) names the files, and each is checked against it.\n"
    "Prints the key.\n",
    1,
    1,
    1};

/* The manifest in DIR, its files re-hashed and cached. */
static kc_err push_manifest(kc_client *c, const char *dir, kc_manifest **out,
                            char *err) {
  char p[PATH_MAX], *json = NULL, inner[KC_ERRBUF_SIZE];
  size_t len = 0;
  snprintf(p, sizeof p, "%s/" BUNDLE_FILE, dir);
  kc_err e = kc_read_file(p, &json, &len, err);
  if (!e)
    e = named(kc_manifest_parse(json, len, out, inner), p, inner, err);
  free(json);
  char root[PATH_MAX], real[PATH_MAX];
  if (!e && !realpath(dir, root))
    e = kc_errf(err, KC_IO, "%s: %s", dir, strerror(errno));
  for (size_t i = 0; !e && i < (*out)->n_files; i++) {
    char d[KC_HEX_LEN + 1];
    const kc_file *f = &(*out)->files[i];
    size_t n = strlen(root);
    snprintf(p, sizeof p, "%s/%s", dir, f->path);
    /* a symlink may name a file of the directory, not one outside it */
    int found = realpath(p, real) != NULL;
    if (!found) {
      e = kc_errf(err, KC_IO, "%s: %s", p, strerror(errno));
      break;
    }
    if (strncmp(real, root, n) || real[n] != '/') {
      e = kc_errf(err, KC_UNSAFE_PATH, "%s: leads outside %s (to %s)", p, dir,
                  real);
      break;
    }
    e = kc_cache_blob_put_file(c, p, d, NULL, err);
    if (!e && strcmp(d, f->sha256) != 0)
      e = kc_errf(err, KC_DIGEST_MISMATCH, "%s: changed since it was pulled",
                  p);
  }
  return e;
}

int kcli_cmd_push(int argc, char **argv) {
  const char *fields_path = NULL;
  PARSE_OR_RETURN(push_spec, &fields_path);
  char err[KC_ERRBUF_SIZE];
  kc_manifest *m = NULL;
  kc_key_fields f;
  kc_client *c = kcli_client(&g);
  if (!c)
    return KCLI_EXIT_FAIL;
  kc_err e = KC_OK;
  if (fields_path) {
    e = read_fields(fields_path, &f, err);
    if (!e)
      e = kc_bundle_from_dir(c, argv[first], BUNDLE_FILE, &f, &m, err);
  } else {
    e = push_manifest(c, argv[first], &m, err);
  }
  if (!e)
    e = kc_client_push(c, m, err);
  if (!e)
    printf("%s\n", m->key);
  kc_manifest_free(m);
  kc_client_free(c);
  return e ? kcli_fail("push", KCLI_EXIT_FAIL, "%s", err) : KCLI_EXIT_OK;
}

/* ---- pull ---- */

static const cmd_spec pull_spec = {
    "pull",
    "usage: kcache pull KEY DIR\n",
    "Download a bundle (local cache first) and write its files under DIR,\n"
    "with its manifest as DIR/" BUNDLE_FILE ".\n",
    2,
    2,
    0};

int kcli_cmd_pull(int argc, char **argv) {
  PARSE_OR_RETURN(pull_spec, NULL);
  char err[KC_ERRBUF_SIZE], p[PATH_MAX], *json = NULL;
  kc_manifest *m = NULL;
  const char *key = argv[first], *dir = argv[first + 1];
  if (!kc_is_hex64(key))
    return kcli_fail("pull", KCLI_EXIT_USAGE, "KEY: must be 64 lowercase hex");
  kc_client *c = kcli_client(&g);
  if (!c)
    return KCLI_EXIT_FAIL;
  kc_err e = kc_client_pull(c, key, &m, err);
  if (!e && err[0]) /* a cached copy was not used: say why */
    fprintf(stderr, "kcache pull: warning: %s\n", err);
  if (!e)
    e = kc_materialize(c, m, dir, err);
  if (!e)
    e = kc_manifest_to_json(m, &json, err);
  snprintf(p, sizeof p, "%s/" BUNDLE_FILE, dir);
  if (!e)
    e = kc_write_file_atomic(p, json, strlen(json), err);
  if (!e)
    printf("%zu files into %s\n", m->n_files, dir);
  free(json);
  kc_manifest_free(m);
  kc_client_free(c);
  return e ? kcli_fail("pull", KCLI_EXIT_FAIL, "%s", err) : KCLI_EXIT_OK;
}

/* ---- get, put ---- */

static const cmd_spec get_spec = {
    "get",
    "usage: kcache get DIGEST [-o FILE] [--max-size SIZE]\n",
    "Download a blob, streamed (never held in memory), hashed on the way.\n"
    "  -o, --output FILE  write to FILE: a temporary file beside it, renamed\n"
    "                     only when the bytes hash to DIGEST (default:\n"
    "                     stdout, where a mismatch is an error at the end,\n"
    "                     after the bytes went out)\n"
    "  --max-size SIZE    stop after SIZE bytes (K, M, G suffixes; default\n"
    "                     1G, kcached's largest blob by default): a longer\n"
    "                     answer is cut off there and the command fails\n",
    1,
    1,
    1};

/* "123", "64K", "16M", "1G" (powers of 1024); 0 and overflow are errors. */
static int parse_size(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  int shift = !strcmp(end, "K") || !strcmp(end, "k")   ? 10
              : !strcmp(end, "M") || !strcmp(end, "m") ? 20
              : !strcmp(end, "G") || !strcmp(end, "g") ? 30
              : !*end                                  ? 0
                                                       : -1;
  if (errno || end == s || *s == '-' || shift < 0 || !v ||
      v > (UINT64_MAX >> shift))
    return -1;
  *out = (uint64_t)v << shift;
  return 0;
}

/* Streams the blob into a temporary file beside path, renamed over path
 * only when it verified. */
static kc_err get_to_file(kc_client *c, const char *digest, const char *path,
                          uint64_t max, char *err) {
  char tmp[PATH_MAX];
  if (snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", path) >= (int)sizeof tmp)
    return kc_errf(err, KC_EINVAL, "%s: path too long", path);
  int fd = mkstemp(tmp);
  if (fd < 0)
    return kc_errf(err, KC_IO, "create %s: %s", tmp, strerror(errno));
  kc_err e = kc_client_blob_get_fd(c, digest, fd, max, NULL, err);
  if (close(fd) != 0 && !e)
    e = kc_errf(err, KC_IO, "write %s: %s", tmp, strerror(errno));
  if (!e && chmod(tmp, 0644) != 0)
    e = kc_errf(err, KC_IO, "chmod %s: %s", tmp, strerror(errno));
  if (!e && rename(tmp, path) != 0)
    e = kc_errf(err, KC_IO, "rename %s: %s", path, strerror(errno));
  if (e)
    unlink(tmp);
  return e;
}

int kcli_cmd_get(int argc, char **argv) {
  const char *out = NULL, *max_arg = NULL;
  kcli_common g;
  int first = 0;
  uint64_t max = KC_BLOB_GET_MAX;
  char err[KC_ERRBUF_SIZE];
  int rc = parse(&get_spec, argc, argv, &g, &out, &max_arg, &first);
  if (rc)
    return rc < 0 ? KCLI_EXIT_OK : rc;
  if (kcli_need_url(&g, "get"))
    return KCLI_EXIT_USAGE;
  if (max_arg && parse_size(max_arg, &max) != 0)
    return kcli_fail("get", KCLI_EXIT_USAGE,
                     "--max-size: '%s' is not a size (123, 64K, 16M, 1G)",
                     max_arg);
  if (!kc_is_hex64(argv[first]))
    return kcli_fail("get", KCLI_EXIT_USAGE,
                     "DIGEST: must be 64 lowercase hex");
  kc_client *c = kcli_client(&g);
  if (!c)
    return KCLI_EXIT_FAIL;
  kc_err e;
  if (out) {
    e = get_to_file(c, argv[first], out, max, err);
  } else {
    fflush(stdout);
    e = kc_client_blob_get_fd(c, argv[first], STDOUT_FILENO, max, NULL, err);
  }
  kc_client_free(c);
  return e ? kcli_fail("get", KCLI_EXIT_FAIL, "%s", err) : KCLI_EXIT_OK;
}

static const cmd_spec put_spec = {
    "put",
    "usage: kcache put FILE...\n",
    "Upload files as blobs; prints \"<sha256>  <file>\" per file.\n",
    1,
    -1,
    1};

int kcli_cmd_put(int argc, char **argv) {
  PARSE_OR_RETURN(put_spec, NULL);
  char err[KC_ERRBUF_SIZE], d[KC_HEX_LEN + 1];
  kc_client *c = kcli_client(&g);
  if (!c)
    return KCLI_EXIT_FAIL;
  kc_err e = KC_OK;
  for (int i = first; !e && i < argc; i++) {
    char *data = NULL;
    size_t len = 0;
    e = kc_read_file(argv[i], &data, &len, err);
    if (!e)
      e = kc_client_blob_put(c, data, len, d, err);
    if (!e)
      printf("%s  %s\n", d, argv[i]);
    free(data);
  }
  kc_client_free(c);
  return e ? kcli_fail("put", KCLI_EXIT_FAIL, "%s", err) : KCLI_EXIT_OK;
}

/* ---- key, hash ---- */

static const cmd_spec key_spec = {
    "key",
    "usage: kcache key FIELDS.json [--json]\n",
    "Print the key of key fields {\"model\",\"bucket\",\"arch\",\"toolchain\","
    "\"build\"};\n--json prints the canonical JSON it is the hash of, too.\n",
    1,
    1,
    0};

int kcli_cmd_key(int argc, char **argv) {
  const char *json_flag = NULL;
  PARSE_OR_RETURN(key_spec, &json_flag);
  char err[KC_ERRBUF_SIZE], inner[KC_ERRBUF_SIZE], key[KC_HEX_LEN + 1];
  char *canon = NULL;
  kc_key_fields f;
  const char *path = argv[first];
  kc_err e = read_fields(path, &f, err);
  if (!e)
    e = named(kc_key_compute(&f, key, inner), path, inner, err);
  if (!e && json_flag)
    e = named(kc_key_canonical(&f, &canon, inner), path, inner, err);
  if (!e)
    printf("%s\n", key);
  if (canon)
    printf("%s\n", canon);
  free(canon);
  return e ? kcli_fail("key", KCLI_EXIT_FAIL, "%s", err) : KCLI_EXIT_OK;
}

static const cmd_spec hash_spec = {
    "hash",
    "usage: kcache hash FILE...\n",
    "Print the model hash of weight and config files: the SHA-256 of the\n"
    "lines \"<sha256>  <base name>\" of the files, in the order given.\n",
    1,
    -1,
    0};

int kcli_cmd_hash(int argc, char **argv) {
  PARSE_OR_RETURN(hash_spec, NULL);
  char err[KC_ERRBUF_SIZE], h[KC_HEX_LEN + 1];
  kc_err e = kc_model_hash((const char *const *)argv + first,
                           (size_t)(argc - first), h, err);
  if (e)
    return kcli_fail("hash", KCLI_EXIT_FAIL, "%s", err);
  printf("%s\n", h);
  return KCLI_EXIT_OK;
}

/* ---- stat (ls and purge: cli_models.c) ---- */

static const cmd_spec stat_spec = {
    "stat",
    "usage: kcache stat [--json]\n",
    "Print the server's statistics: store use against --max-bytes, bundles\n"
    "and blobs, hits and misses, evictions, the Redis port's keys.\n"
    "--json prints GET /v1/stats as the server sent it.\n",
    0,
    0,
    1};

/* n bytes as "12.3 MiB" (binary units, as --max-bytes takes them) */
static const char *human_bytes(json_int_t n, char buf[32]) {
  static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = (double)n;
  int u = 0;
  while (v >= 1024 && u < 5)
    v /= 1024, u++;
  snprintf(buf, 32, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
  return buf;
}

static json_int_t stat_int(json_t *root, const char *name) {
  return json_integer_value(json_object_get(root, name));
}

static void stat_print(json_t *r) {
  char a[32], b[32];
  json_int_t used = stat_int(r, "bytes_used"), max = stat_int(r, "max_bytes");
  json_int_t hits = stat_int(r, "hits"), misses = stat_int(r, "misses");
  if (max > 0)
    printf("store     %s of %s (--max-bytes), %.0f%%\n", human_bytes(used, a),
           human_bytes(max, b), 100.0 * (double)used / (double)max);
  else
    printf("store     %s; no --max-bytes limit: set one (the disk fills)\n",
           human_bytes(used, a));
  printf("map       %s of %s\n", human_bytes(stat_int(r, "map_used"), a),
         human_bytes(stat_int(r, "map_size"), b));
  printf("bundles   %lld in %lld blobs\n", (long long)stat_int(r, "bundles"),
         (long long)stat_int(r, "blobs"));
  printf("lookups   %lld hits, %lld misses", (long long)hits,
         (long long)misses);
  if (hits + misses)
    printf(" (%.0f%% hit)", 100.0 * (double)hits / (double)(hits + misses));
  printf("\nevicted   %lld bundles, %lld blobs; leases held %lld\n",
         (long long)stat_int(r, "evicted_bundles"),
         (long long)stat_int(r, "evicted_blobs"),
         (long long)stat_int(r, "leases"));
  printf("redis     %lld keys, %s; %lld hits, %lld misses\n",
         (long long)stat_int(r, "kv_keys"),
         human_bytes(stat_int(r, "kv_bytes"), a),
         (long long)stat_int(r, "kv_hits"),
         (long long)stat_int(r, "kv_misses"));
  printf("uptime    %lld s\n", (long long)stat_int(r, "uptime_s"));
}

int kcli_cmd_stat(int argc, char **argv) {
  const char *json = NULL;
  PARSE_OR_RETURN(stat_spec, &json);
  char err[KC_ERRBUF_SIZE], *body = NULL;
  kc_client *c = kcli_client(&g);
  if (!c)
    return KCLI_EXIT_FAIL;
  kc_err e = kc_client_stats(c, &body, err);
  json_t *root = e || json ? NULL : json_loads(body, 0, NULL);
  if (!e && json)
    puts(body);
  else if (root)
    stat_print(root);
  else if (!e)
    e = kc_errf(err, KC_BAD_JSON, "GET /v1/stats: not JSON");
  json_decref(root);
  free(body);
  kc_client_free(c);
  return e ? kcli_fail("stat", KCLI_EXIT_FAIL, "%s", err) : KCLI_EXIT_OK;
}
