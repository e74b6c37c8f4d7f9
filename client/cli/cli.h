/* cli.h: what the kcache CLI's files share: common options, exit codes. */
#ifndef KCLI_H
#define KCLI_H

#include <getopt.h>
#include <stdio.h>

#include "kcache.h"

/* Exit codes (documented in `kcache --help`). */
#define KCLI_EXIT_OK 0
#define KCLI_EXIT_FAIL 1  /* failed; warm --strict: not all ready */
#define KCLI_EXIT_USAGE 2 /* bad command line */

/* Options every command takes (cli_options.c has their table: flag,
 * environment variable, help); flags win over the environment. The strings
 * point into argv or the environment. */
typedef struct kcli_common {
  const char *url;       /* --url, KCACHE_URL */
  const char *token;     /* --token, KCACHE_TOKEN */
  const char *cacert;    /* --cacert, KCACHE_CACERT */
  const char *cache_dir; /* --cache-dir, KCACHE_DIR */
  int parallel;          /* --parallel */
  int allow_plaintext;   /* --allow-plaintext, KCACHE_ALLOW_PLAINTEXT=1 */
  long timeout_ms;       /* --timeout S, KCACHE_TIMEOUT; 0: the library's */
  int trust_cache_dir;   /* --trust-cache-dir, KCACHE_TRUST_DIR=1 */
} kcli_common;

/* Long-option ids of the common options start here; a command's own
 * options use ids (or letters) below it. */
#define KCLI_OPT_BASE 1000
/* Entries kcli_long_options may write: own options, common ones, --help
 * and the terminator. */
#define KCLI_LONGOPTS_MAX 32

/* *g from the environment; KCLI_EXIT_OK, or KCLI_EXIT_USAGE (said on
 * stderr) when a variable has a bad value. */
int kcli_common_init(kcli_common *g, const char *cmd);
/* lo (KCLI_LONGOPTS_MAX entries) = own (terminated by a zero entry; may be
 * NULL), then the common options, --help ('h') and a zero entry. */
void kcli_long_options(const struct option *own, struct option *lo);
/* Handles a common option (getopt id, optarg); 1 if it was one, -1 on a bad
 * value, 0 if not common. */
int kcli_common_opt(kcli_common *g, int id, const char *arg);
/* The common options' help lines, as "  --flag ARG   help (VARIABLE)". */
void kcli_common_help(FILE *f);
/* getopt_long over own options and the common ones: fn(a, opt, optarg)
 * takes each (0, or -1 on a bad value: "invalid value" and the usage);
 * --help prints usage, help, the common options and tail (may be NULL).
 * 0 go on (operands from optind), -1 help shown, else the exit code. */
int kcli_parse(const char *cmd, const char *usage, const char *help,
               const char *tail, const struct option *own,
               int (*fn)(void *a, int opt, const char *arg), void *a, int argc,
               char **argv);
/* Makes the client; prints the error and returns NULL on failure. */
kc_client *kcli_client(const kcli_common *g);
/* KCLI_EXIT_OK when a server URL is set, else says so: KCLI_EXIT_USAGE. */
int kcli_need_url(const kcli_common *g, const char *cmd);
/* "kcache CMD: message" on stderr; returns code. (cli_options.c) */
int kcli_fail(const char *cmd, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int kcli_usage(const char *cmd, const char *usage);

int kcli_cmd_warm(int argc, char **argv);
int kcli_cmd_push(int argc, char **argv);
int kcli_cmd_pull(int argc, char **argv);
int kcli_cmd_get(int argc, char **argv);
int kcli_cmd_put(int argc, char **argv);
int kcli_cmd_key(int argc, char **argv);
int kcli_cmd_ls(int argc, char **argv); /* cli_models.c */
int kcli_cmd_purge(int argc, char **argv);
int kcli_cmd_stat(int argc, char **argv);
int kcli_cmd_hash(int argc, char **argv);
int kcli_cmd_verify(int argc, char **argv);
int kcli_cmd_suggest(int argc, char **argv);

#endif
