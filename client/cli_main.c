/* cli_main.c: the kcache CLI: process-wide setup (curl_global_init, which the
 * library leaves to its caller), command dispatch, shared option handling. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "cli.h"

static const char usage_text[] =
    "usage: kcache COMMAND [OPTIONS] [ARGS]\n"
    "\n"
    "commands:\n"
    "  warm MANIFEST    fetch or build every (bucket, arch) of a warmup "
    "manifest\n"
    "  push DIR         upload a bundle directory\n"
    "  pull KEY DIR     download a bundle into DIR\n"
    "  get DIGEST       download a blob (to stdout or -o FILE)\n"
    "  put FILE...      upload files as blobs, print their digests\n"
    "  key FIELDS.json  print the key of key fields\n"
    "  ls MODEL         list a model's bundles on the server\n"
    "  stat             server statistics\n"
    "  hash FILE...     model hash of weight and config files\n"
    "  verify MANIFEST  load every cubin of a model on this host's GPU\n"
    "\n"
    "`kcache COMMAND --help` for a command's options. Every command takes\n"
    "--url, --token, --cacert (or KCACHE_URL, KCACHE_TOKEN, KCACHE_CACERT)\n"
    "and --cache-dir (KCACHE_DIR).\n"
    "\n"
    "exit status: 0 ok; 1 the operation failed (warm: with --strict, some\n"
    "bundle is not ready); 2 usage error.\n";

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

void kcli_common_env(kcli_common *g) {
  memset(g, 0, sizeof *g);
  g->url = getenv("KCACHE_URL");
  g->token = getenv("KCACHE_TOKEN");
  g->cacert = getenv("KCACHE_CACERT");
  const char *pt = getenv("KCACHE_ALLOW_PLAINTEXT");
  g->allow_plaintext = pt && !strcmp(pt, "1");
}

int kcli_common_opt(kcli_common *g, int opt, const char *arg) {
  switch (opt) {
  case 1000: g->url = arg; return 1;
  case 1001: g->token = arg; return 1;
  case 1002: g->cacert = arg; return 1;
  case 1003: g->cache_dir = arg; return 1;
  case 1005: g->allow_plaintext = 1; return 1;
  case 1004: {
    char *end;
    long n = strtol(arg, &end, 10);
    if (*end || n < 1 || n > 256)
      return -1;
    g->parallel = (int)n;
    return 1;
  }
  default: return 0;
  }
}

kc_client *kcli_client(const kcli_common *g) {
  char err[KC_ERRBUF_SIZE];
  kc_client *c = NULL;
  kc_client_opts o = {.url = g->url, .token = g->token, .cacert = g->cacert,
                      .cache_dir = g->cache_dir, .parallel = g->parallel,
                      .allow_plaintext = g->allow_plaintext};
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

typedef struct command {
  const char *name;
  int (*fn)(int, char **);
} command;

static const command commands[] = {
    {"warm", kcli_cmd_warm}, {"push", kcli_cmd_push}, {"pull", kcli_cmd_pull},
    {"get", kcli_cmd_get},   {"put", kcli_cmd_put},   {"key", kcli_cmd_key},
    {"ls", kcli_cmd_ls},     {"stat", kcli_cmd_stat}, {"hash", kcli_cmd_hash},
    {"verify", kcli_cmd_verify}};

int main(int argc, char **argv) {
  if (argc < 2) {
    fputs(usage_text, stderr);
    return KCLI_EXIT_USAGE;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
      !strcmp(argv[1], "help")) {
    fputs(usage_text, stdout);
    return KCLI_EXIT_OK;
  }
  if (!strcmp(argv[1], "--version")) {
    printf("kcache %s\n", KC_CLIENT_VERSION);
    return KCLI_EXIT_OK;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
    if (strcmp(argv[1], commands[i].name))
      continue;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
      return kcli_fail(argv[1], KCLI_EXIT_FAIL, "curl_global_init failed");
    int rc = commands[i].fn(argc - 1, argv + 1);
    curl_global_cleanup();
    return rc;
  }
  fprintf(stderr, "kcache: unknown command '%s'\n\n%s", argv[1], usage_text);
  return KCLI_EXIT_USAGE;
}
