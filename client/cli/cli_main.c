/* cli_main.c: the kcache CLI: process-wide setup (curl_global_init, which the
 * library leaves to its caller), command dispatch, --help. The options
 * every command takes, and the error and usage lines, are in
 * cli_options.c. */
#include <stdio.h>
#include <string.h>

#include <curl/curl.h>

#include "cli.h"

static const char usage_head[] =
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
    "  ls [MODEL]       list every model, or a model's bundles (--matrix:\n"
    "                   its coverage)\n"
    "  purge MODEL      delete every bundle of a model (admin)\n"
    "  stat             server statistics\n"
    "  hash FILE...     model hash of weight and config files\n"
    "  verify MANIFEST  load every cubin of a model on this host's GPU\n"
    "  suggest [MODEL]  buckets that fit the shapes a model ran (demand)\n"
    "\n"
    "`kcache COMMAND --help` for a command's options. Every command takes\n"
    "these (an option wins over its environment variable):\n";

static const char usage_tail[] =
    "\n"
    "exit status: 0 ok; 1 the operation failed (warm: with --strict, some\n"
    "bundle is not ready); 2 usage error.\n";

static void usage(FILE *f) {
  fputs(usage_head, f);
  kcli_common_help(f);
  fputs(usage_tail, f);
}

typedef struct command {
  const char *name;
  int (*fn)(int, char **);
} command;

static const command commands[] = {
    {"warm", kcli_cmd_warm},       {"push", kcli_cmd_push},
    {"pull", kcli_cmd_pull},       {"get", kcli_cmd_get},
    {"put", kcli_cmd_put},         {"key", kcli_cmd_key},
    {"ls", kcli_cmd_ls},           {"stat", kcli_cmd_stat},
    {"hash", kcli_cmd_hash},       {"verify", kcli_cmd_verify},
    {"suggest", kcli_cmd_suggest}, {"purge", kcli_cmd_purge}};

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return KCLI_EXIT_USAGE;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
      !strcmp(argv[1], "help")) {
    usage(stdout);
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
  fprintf(stderr, "kcache: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return KCLI_EXIT_USAGE;
}
