/* cli.h: what the kcache CLI's files share: common options, exit codes. */
#ifndef KCLI_H
#define KCLI_H

#include <getopt.h>

#include "kcache.h"

/* Exit codes (documented in `kcache --help`). */
#define KCLI_EXIT_OK 0
#define KCLI_EXIT_FAIL 1  /* the operation failed; warm --strict: not all ready */
#define KCLI_EXIT_USAGE 2 /* bad command line */

/* Options every command takes; flags win over the environment. */
typedef struct kcli_common {
  const char *url;    /* --url, KCACHE_URL */
  const char *token;  /* --token, KCACHE_TOKEN */
  const char *cacert; /* --cacert, KCACHE_CACERT */
  const char *cache_dir; /* --cache-dir, KCACHE_DIR */
  int parallel;       /* --parallel */
  int allow_plaintext; /* --allow-plaintext, KCACHE_ALLOW_PLAINTEXT=1 */
} kcli_common;

/* Long options of kcli_common, ids >= 1000; CLI_COMMON_OPTS entries. */
#define CLI_COMMON_OPTS                                                        \
  {"url", required_argument, NULL, 1000},                                      \
      {"token", required_argument, NULL, 1001},                                \
      {"cacert", required_argument, NULL, 1002},                               \
      {"cache-dir", required_argument, NULL, 1003},                            \
      {"parallel", required_argument, NULL, 1004},                             \
      {"allow-plaintext", no_argument, NULL, 1005},                            \
      {"help", no_argument, NULL, 'h'}

#define CLI_COMMON_HELP                                                        \
  "  --url URL        kcached address (KCACHE_URL)\n"                          \
  "  --token TOKEN    bearer token (KCACHE_TOKEN)\n"                           \
  "  --cacert FILE    CA bundle for https (KCACHE_CACERT)\n"                   \
  "  --cache-dir DIR  local cache (KCACHE_DIR, default ~/.cache/kcache)\n"     \
  "  --parallel N     concurrent transfers (default 8)\n"                      \
  "  --allow-plaintext  send the token over http:// beyond loopback\n"        \
  "                   (KCACHE_ALLOW_PLAINTEXT=1)\n"                           \
  "  -h, --help       this text\n"

/* Handles a common option (opt id, optarg); 1 if it was one, -1 on a bad
 * value, 0 if not common. */
int kcli_common_opt(kcli_common *g, int opt, const char *arg);
void kcli_common_env(kcli_common *g);
/* Makes the client; prints the error and returns NULL on failure. */
kc_client *kcli_client(const kcli_common *g);
/* KCLI_EXIT_OK when a server URL is set, else says so: KCLI_EXIT_USAGE. */
int kcli_need_url(const kcli_common *g, const char *cmd);
/* "kcache CMD: message" on stderr; returns code. */
int kcli_fail(const char *cmd, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int kcli_usage(const char *cmd, const char *usage);

int kcli_cmd_warm(int argc, char **argv);
int kcli_cmd_push(int argc, char **argv);
int kcli_cmd_pull(int argc, char **argv);
int kcli_cmd_get(int argc, char **argv);
int kcli_cmd_put(int argc, char **argv);
int kcli_cmd_key(int argc, char **argv);
int kcli_cmd_ls(int argc, char **argv);
int kcli_cmd_stat(int argc, char **argv);
int kcli_cmd_hash(int argc, char **argv);
int kcli_cmd_verify(int argc, char **argv);

#endif
