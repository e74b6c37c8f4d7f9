/* resp_admin.c: the connection and server commands: PING ECHO QUIT HELLO
 * AUTH SELECT CLIENT COMMAND CONFIG INFO, answered as Redis 7 answers them
 * (redis-py's and redis-benchmark's connect sequences included). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "resp.h"

#define REDIS_VERSION "7.0.0" /* what clients that check versions see */

#ifndef KCACHE_VERSION
#define KCACHE_VERSION "0.1.0"
#endif

void kcd_resp_c_ping(kcd_resp_ctx *x) {
  if (x->argc > 2)
    return kcd_resp_err_arity(x->out, "ping");
  if (x->argc == 2)
    return kcd_resp_bulk(x->out, ARG(1));
  kcd_resp_simple(x->out, "PONG");
}

void kcd_resp_c_echo(kcd_resp_ctx *x) { kcd_resp_bulk(x->out, ARG(1)); }

void kcd_resp_c_quit(kcd_resp_ctx *x) {
  kcd_resp_simple(x->out, "OK");
  x->c->closing = 1;
}

void kcd_resp_c_select(kcd_resp_ctx *x) {
  long long db;
  if (kcd_resp_ll(ARG(1), &db))
    return kcd_resp_err_int(x->out);
  if (db != 0)
    return kcd_resp_error(x->out, "ERR DB index is out of range");
  kcd_resp_simple(x->out, "OK");
}

/* ---- AUTH and HELLO ---- */

/* Checks name (NULL or "default": any token's) and token; 0 and the
 * connection takes the token's role, or -1 with WRONGPASS written. Without
 * a token file every AUTH succeeds (everything is allowed anyway). */
static int authenticate(kcd_resp_ctx *x, const char *name, size_t nlen,
                        const char *tok, size_t tlen) {
  kcd_auth *a = &x->st->auth;
  if (!kcd_auth_enabled(a))
    return 0;
  char want[KCD_NAME_MAX], got[KCD_NAME_MAX];
  const char *wp = NULL;
  if (name && !kcd_resp_is(name, nlen, "default")) {
    if (nlen >= sizeof want || memchr(name, '\0', nlen))
      nlen = sizeof want - 1; /* cannot match a token name; still checked */
    memcpy(want, name, nlen);
    want[nlen] = '\0';
    wp = want;
  }
  kcd_role role;
  uint64_t gen = kcd_auth_gen(a); /* before: a reload meanwhile re-checks */
  if (kcd_svc_auth(x->st, KCD_FE_RESP, wp, tok, tlen, &role, got) !=
      KCD_AUTHN_OK) {
    kcd_resp_error(x->out, "WRONGPASS invalid username-password pair or user "
                           "is disabled.");
    return -1;
  }
  kcd_resp_conn *c = x->c;
  c->authed = 1;
  c->role = role;
  c->parser.unauth = 0;
  snprintf(c->user, sizeof c->user, "%s", got);
  /* kept to check again after a SIGHUP (resp.c, token_valid) */
  kcd_auth_digest(tok, tlen, c->tok_digest);
  c->tok_set = 1;
  c->auth_gen = gen;
  return 0;
}

void kcd_resp_c_auth(kcd_resp_ctx *x) {
  if (x->argc > 3)
    return kcd_resp_err_syntax(x->out);
  int two = x->argc == 3;
  if (authenticate(x, two ? x->argv[1] : NULL, two ? x->lens[1] : 0,
                   ARG(x->argc - 1)) == 0)
    kcd_resp_simple(x->out, "OK");
}

/* Client names: printable, no spaces (Redis's validateClientName). */
static int name_ok(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (s[i] < '!' || s[i] > '~')
      return 0;
  return 1;
}

static void set_name(kcd_resp_conn *c, const char *s, size_t n) {
  free(c->name);
  c->name = n ? strndup(s, n) : NULL;
}

/* A map (RESP3) or a flat array (RESP2), in the protocol just chosen. */
static void hello_reply(kcd_resp_ctx *x) {
  kcd_resp_buf *b = x->out;
  int r3 = x->c->resp3;
  kcd_resp_map(b, 7, r3);
  kcd_resp_bulk_str(b, "server");
  kcd_resp_bulk_str(b, "redis");
  kcd_resp_bulk_str(b, "version");
  kcd_resp_bulk_str(b, REDIS_VERSION);
  kcd_resp_bulk_str(b, "proto");
  kcd_resp_int(b, r3 ? 3 : 2);
  kcd_resp_bulk_str(b, "id");
  kcd_resp_int(b, (long long)x->c->id);
  kcd_resp_bulk_str(b, "mode");
  kcd_resp_bulk_str(b, "standalone");
  kcd_resp_bulk_str(b, "role");
  kcd_resp_bulk_str(b, "master");
  kcd_resp_bulk_str(b, "modules");
  kcd_resp_array(b, 0);
}

/* HELLO [protover [AUTH name token] [SETNAME name]]: protover 2 or 3
 * switches the connection's replies (after AUTH succeeded, as in Redis);
 * without it the protocol stays. */
void kcd_resp_c_hello(kcd_resp_ctx *x) {
  long long ver = x->c->resp3 ? 3 : 2;
  if (x->argc >= 2 && kcd_resp_ll(ARG(1), &ver))
    return kcd_resp_error(x->out, "ERR Protocol version is not an integer or "
                                  "out of range");
  if (ver != 2 && ver != 3)
    return kcd_resp_error(x->out, "NOPROTO unsupported protocol version");
  size_t auth = 0, setname = 0;
  for (size_t i = 2; i < x->argc; i++) {
    size_t more = x->argc - 1 - i;
    if (kcd_resp_is(ARG(i), "auth") && more >= 2) {
      auth = i;
      i += 2;
    } else if (kcd_resp_is(ARG(i), "setname") && more) {
      if (!name_ok(ARG(i + 1)))
        return kcd_resp_error(x->out,
                              "ERR Client names cannot contain "
                              "spaces, newlines or special characters.");
      setname = ++i;
    } else {
      return kcd_resp_errorf(x->out, "ERR Syntax error in HELLO option '%.*s'",
                             (int)(x->lens[i] > 128 ? 128 : x->lens[i]),
                             x->argv[i]);
    }
  }
  if (auth && authenticate(x, ARG(auth + 1), ARG(auth + 2)))
    return;
  kcd_resp_conn *c = x->c;
  if (!c->authed && c->role == KCD_ROLE_NONE && kcd_auth_enabled(&x->st->auth))
    return kcd_resp_error(x->out,
                          "NOAUTH HELLO must be called with the client "
                          "already authenticated, otherwise the HELLO <proto> "
                          "AUTH <user> <pass> option can be used to "
                          "authenticate the client and select the RESP "
                          "protocol version at the same time");
  if (setname)
    set_name(c, ARG(setname));
  c->resp3 = ver == 3;
  hello_reply(x);
}

/* ---- CLIENT ---- */

static int sub_arity(kcd_resp_ctx *x, const char *sub, size_t lo, size_t hi) {
  if (x->argc >= lo && x->argc <= hi)
    return 0;
  kcd_resp_errorf(x->out, "ERR wrong number of arguments for '%s' command",
                  sub);
  return -1;
}

static void unknown_sub(kcd_resp_ctx *x, const char *cmd) {
  kcd_resp_errorf(x->out, "ERR unknown subcommand '%.*s'. Try %s HELP.",
                  (int)(x->lens[1] > 128 ? 128 : x->lens[1]), x->argv[1], cmd);
}

static void client_info(kcd_resp_ctx *x) {
  char line[256];
  int n = snprintf(line, sizeof line, "id=%llu name=%s db=0 user=%s resp=%d\n",
                   (unsigned long long)x->c->id, x->c->name ? x->c->name : "",
                   x->c->authed ? x->c->user : "default", x->c->resp3 ? 3 : 2);
  kcd_resp_verbatim(x->out, line,
                    n < 0                     ? 0
                    : (size_t)n < sizeof line ? (size_t)n
                                              : sizeof line - 1,
                    x->c->resp3);
}

void kcd_resp_c_client(kcd_resp_ctx *x) {
  kcd_resp_conn *c = x->c;
  if (kcd_resp_is(ARG(1), "setname")) {
    if (sub_arity(x, "client|setname", 3, 3))
      return;
    if (!name_ok(ARG(2)))
      return kcd_resp_error(x->out, "ERR Client names cannot contain spaces, "
                                    "newlines or special characters.");
    set_name(c, ARG(2));
    kcd_resp_simple(x->out, "OK");
  } else if (kcd_resp_is(ARG(1), "getname")) {
    if (sub_arity(x, "client|getname", 2, 2))
      return;
    c->name ? kcd_resp_bulk_str(x->out, c->name)
            : kcd_resp_nil(x->out, c->resp3);
  } else if (kcd_resp_is(ARG(1), "id")) {
    if (!sub_arity(x, "client|id", 2, 2))
      kcd_resp_int(x->out, (long long)c->id);
  } else if (kcd_resp_is(ARG(1), "info")) {
    if (!sub_arity(x, "client|info", 2, 2))
      client_info(x);
  } else if (kcd_resp_is(ARG(1), "setinfo")) {
    if (sub_arity(x, "client|setinfo", 4, 4))
      return;
    if (!kcd_resp_is(ARG(2), "lib-name") && !kcd_resp_is(ARG(2), "lib-ver"))
      return kcd_resp_errorf(x->out, "ERR Unrecognized option '%.*s'",
                             (int)(x->lens[2] > 128 ? 128 : x->lens[2]),
                             x->argv[2]);
    kcd_resp_simple(x->out, "OK");
  } else {
    unknown_sub(x, "CLIENT");
  }
}

/* ---- COMMAND, CONFIG ---- */

void kcd_resp_c_command(kcd_resp_ctx *x) {
  if (x->argc == 1)
    return kcd_resp_array(x->out, 0);
  if (kcd_resp_is(ARG(1), "count")) {
    if (!sub_arity(x, "command|count", 2, 2))
      kcd_resp_int(x->out, (long long)kcd_resp_cmd_count());
  } else if (kcd_resp_is(ARG(1), "docs")) {
    kcd_resp_map(x->out, 0, x->c->resp3);
  } else {
    unknown_sub(x, "COMMAND");
  }
}

/* CONFIG GET: the parameters clients ask for (redis-benchmark: save,
 * appendonly), with their true values; unknown ones are left out. */
static void config_get(kcd_resp_ctx *x) {
  char maxmem[24], maxbulk[24];
  snprintf(maxmem, sizeof maxmem, "%llu",
           (unsigned long long)x->st->cfg.resp_max_bytes);
  snprintf(maxbulk, sizeof maxbulk, "%llu",
           (unsigned long long)x->st->cfg.resp_max_value);
  const char *params[][2] = {{"save", ""},
                             {"appendonly", "no"},
                             {"databases", "1"},
                             {"maxmemory", maxmem},
                             {"proto-max-bulk-len", maxbulk},
                             {"maxclients", "10000"}};
  size_t np = sizeof params / sizeof params[0], hits = 0;
  int hit[sizeof params / sizeof params[0]] = {0};
  for (size_t p = 0; p < np; p++)
    for (size_t i = 2; i < x->argc && !hit[p]; i++)
      hit[p] = kc_store_kv_match(ARG(i), params[p][0], strlen(params[p][0]));
  for (size_t p = 0; p < np; p++)
    hits += (size_t)hit[p];
  kcd_resp_map(x->out, (long long)hits, x->c->resp3);
  for (size_t p = 0; p < np; p++)
    if (hit[p]) {
      kcd_resp_bulk_str(x->out, params[p][0]);
      kcd_resp_bulk_str(x->out, params[p][1]);
    }
}

void kcd_resp_c_config(kcd_resp_ctx *x) {
  if (kcd_resp_is(ARG(1), "get")) {
    if (x->argc < 3)
      return kcd_resp_err_arity(x->out, "config|get");
    config_get(x);
  } else if (kcd_resp_is(ARG(1), "resetstat")) {
    kcd_resp_simple(x->out, "OK");
  } else if (kcd_resp_is(ARG(1), "set")) {
    kcd_resp_error(x->out, "ERR CONFIG SET is not supported: kcached is "
                           "configured by its flags");
  } else {
    unknown_sub(x, "CONFIG");
  }
}
