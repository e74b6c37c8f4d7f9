/* cli_options.c: the options every kcache command takes, in one table: the
 * flag, its environment variable (the flag wins), its help line, and one
 * setter for both. The long options, the defaults from the environment and
 * the --help lines are all made from the table. Beside it, what every
 * command says when an option or the operation fails: kcli_fail's error
 * line and kcli_usage's usage line. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* ---- error and usage lines ---- */

int kcli_fail(const char *cmd, int code, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "kcache %s: ", cmd);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  return code;
}

int kcli_usage(const char *cmd, const char *usage) {
  fprintf(stderr, "%s(kcache %s --help for more)\n", usage, cmd);
  return KCLI_EXIT_USAGE;
}

/* ---- the option table ---- */

typedef struct kcli_opt {
  const char *name, *arg, *env, *help; /* arg NULL: a flag without value */
  int (*set)(kcli_common *g, const char *v); /* 0, or -1: a bad value */
} kcli_opt;

/* Strings are kept as given: argv and the environment outlive the command,
 * and the library reads "" as unset. */
static int set_url(kcli_common *g, const char *v) { return g->url = v, 0; }
static int set_token(kcli_common *g, const char *v) { return g->token = v, 0; }
static int set_cacert(kcli_common *g, const char *v) {
  return g->cacert = v, 0;
}
static int set_cache_dir(kcli_common *g, const char *v) {
  return g->cache_dir = v, 0;
}
static int set_parallel(kcli_common *g, const char *v) {
  char *end;
  long n = strtol(v, &end, 10);
  if (*end || n < 1 || n > 256)
    return -1;
  g->parallel = (int)n;
  return 0;
}
/* The flag (v NULL) turns it on; the variable does only as "1". */
static int set_plaintext(kcli_common *g, const char *v) {
  g->allow_plaintext = !v || !strcmp(v, "1");
  return 0;
}

static int set_timeout(kcli_common *g, const char *v) {
  char *end;
  double s = strtod(v, &end);
  if (*end || !(s >= 0.001) || s > 86400)
    return -1;
  g->timeout_ms = (long)(s * 1000);
  return 0;
}
static int set_trust(kcli_common *g, const char *v) {
  g->trust_cache_dir = !v || !strcmp(v, "1");
  return 0;
}

static const kcli_opt opts[] = {
    {"url", "URL", "KCACHE_URL", "kcached address", set_url},
    {"token", "TOKEN", "KCACHE_TOKEN",
     "bearer token; prefer the variable: the flag is blanked, but ps may "
     "see it first",
     set_token},
    {"cacert", "FILE", "KCACHE_CACERT", "CA bundle for https", set_cacert},
    {"cache-dir", "DIR", "KCACHE_DIR", "local cache, default ~/.cache/kcache",
     set_cache_dir},
    {"parallel", "N", NULL, "concurrent transfers (default 8)", set_parallel},
    {"allow-plaintext", NULL, "KCACHE_ALLOW_PLAINTEXT",
     "send the token over http:// beyond loopback", set_plaintext},
    {"timeout", "S", "KCACHE_TIMEOUT",
     "request limit in s (default 300; 30 s below 1 KiB/s)", set_timeout},
    {"trust-cache-dir", NULL, "KCACHE_TRUST_DIR",
     "trust a cache dir others may write", set_trust},
};
#define N_OPTS (sizeof opts / sizeof opts[0])

int kcli_common_init(kcli_common *g, const char *cmd) {
  memset(g, 0, sizeof *g);
  for (size_t i = 0; i < N_OPTS; i++) {
    const char *v = opts[i].env ? getenv(opts[i].env) : NULL;
    if (v && opts[i].set(g, v))
      return kcli_fail(cmd, KCLI_EXIT_USAGE, "%s: invalid value '%s'",
                       opts[i].env, v);
  }
  return KCLI_EXIT_OK;
}

void kcli_long_options(const struct option *own, struct option *lo) {
  size_t n = 0;
  while (own && own[n].name)
    n++;
  /* a programming error, caught by any run of the command */
  if (n + N_OPTS + 2 > KCLI_LONGOPTS_MAX)
    abort();
  memcpy(lo, own, n * sizeof *lo);
  for (size_t i = 0; i < N_OPTS; i++)
    lo[n++] = (struct option){opts[i].name,
                              opts[i].arg ? required_argument : no_argument,
                              NULL, KCLI_OPT_BASE + (int)i};
  lo[n++] = (struct option){"help", no_argument, NULL, 'h'};
  lo[n] = (struct option){NULL, 0, NULL, 0};
}

int kcli_parse(const char *cmd, const char *usage, const char *help,
               const char *tail, const struct option *own,
               int (*fn)(void *a, int opt, const char *arg), void *a, int argc,
               char **argv) {
  struct option lo[KCLI_LONGOPTS_MAX];
  int opt;
  kcli_long_options(own, lo);
  optind = 0;
  while ((opt = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    if (opt == 'h') {
      printf("%s%s", usage, help);
      kcli_common_help(stdout);
      if (tail)
        fputs(tail, stdout);
      return -1;
    }
    if (opt == '?' || fn(a, opt, optarg) != 0) {
      if (opt != '?')
        fprintf(stderr, "kcache %s: invalid value '%s'\n", cmd, optarg);
      return kcli_usage(cmd, usage);
    }
  }
  return 0;
}

/* --token's value is copied and blanked in argv, as curl does: ps and
 * /proc/PID/cmdline show the rest of the command line, not the secret,
 * for the whole run. (The variable is never in argv: the better way.) */
static const char *hide_token(char *arg) {
  static char copy[1024];
  size_t n = strlen(arg);
  if (n >= sizeof copy)
    return NULL;
  memcpy(copy, arg, n + 1);
  memset(arg, ' ', n);
  return copy;
}

int kcli_common_opt(kcli_common *g, int id, const char *arg) {
  if (id < KCLI_OPT_BASE || id >= KCLI_OPT_BASE + (int)N_OPTS)
    return 0;
  const kcli_opt *o = &opts[id - KCLI_OPT_BASE];
  /* arg is getopt's optarg: inside argv, which is writable */
  if (o->set == set_token && arg && !(arg = hide_token((char *)arg)))
    return -1;
  return o->set(g, arg) ? -1 : 1;
}

void kcli_common_help(FILE *f) {
  for (size_t i = 0; i < N_OPTS; i++) {
    char left[48], env[64] = "";
    snprintf(left, sizeof left, "--%s%s%s", opts[i].name,
             opts[i].arg ? " " : "", opts[i].arg ? opts[i].arg : "");
    if (opts[i].env) /* a flag's variable turns it on with 1 */
      snprintf(env, sizeof env, "(%s%s)", opts[i].env, opts[i].arg ? "" : "=1");
    int col = fprintf(f, "  %-16s %s", left, opts[i].help);
    /* the variable on a line of its own when it would pass column 80 */
    if (*env && col + 1 + (int)strlen(env) > 80)
      fprintf(f, "\n  %-16s", "");
    fprintf(f, "%s%s\n", *env ? " " : "", env);
  }
  fprintf(f, "  %-16s this text\n", "-h, --help");
}

kc_client *kcli_client(const kcli_common *g) {
  char err[KC_ERRBUF_SIZE];
  kc_client *c = NULL;
  kc_client_opts o = {.url = g->url,
                      .token = g->token,
                      .cacert = g->cacert,
                      .cache_dir = g->cache_dir,
                      .parallel = g->parallel,
                      .allow_plaintext = g->allow_plaintext,
                      .timeout_ms = g->timeout_ms,
                      .trust_cache_dir = g->trust_cache_dir};
  if (kc_client_new(&o, &c, err) != KC_OK) {
    kcli_fail("client", KCLI_EXIT_FAIL, "%s", err);
    return NULL;
  }
  return c;
}

int kcli_need_url(const kcli_common *g, const char *cmd) {
  if (g->url && *g->url)
    return KCLI_EXIT_OK;
  return kcli_fail(cmd, KCLI_EXIT_USAGE,
                   "no server: give --url or set KCACHE_URL");
}
