/* resp_cmd.c: the command table, lookup, the checks Redis makes before a
 * command runs (unknown command, arity, NOAUTH, NOPERM, in that order),
 * MULTI/EXEC/DISCARD, Redis's error replies (a store error's among them)
 * and expire arithmetic, and the handlers' access to reads, writes and the
 * store. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "resp.h"

#define R_NONE KCD_ROLE_NONE
#define R_READ KCD_ROLE_READ
#define R_WRITE KCD_ROLE_WRITE
#define R_ADMIN KCD_ROLE_ADMIN
#define W KCD_CF_WRITE
#define NS KCD_CF_NOSTORE
#define NA KCD_CF_NOAUTH
#define NM KCD_CF_NOMULTI

static const kcd_resp_cmd cmds[] = {
    {"get", 2, 0, R_READ, kcd_resp_c_get},
    {"set", -3, W, R_WRITE, kcd_resp_c_set},
    {"mget", -2, 0, R_READ, kcd_resp_c_mget},
    {"mset", -3, W, R_WRITE, kcd_resp_c_mset},
    {"setex", 4, W, R_WRITE, kcd_resp_c_setex},
    {"psetex", 4, W, R_WRITE, kcd_resp_c_psetex},
    {"setnx", 3, W, R_WRITE, kcd_resp_c_setnx},
    {"exists", -2, 0, R_READ, kcd_resp_c_exists},
    {"del", -2, W, R_WRITE, kcd_resp_c_del},
    {"unlink", -2, W, R_WRITE, kcd_resp_c_del},
    {"ttl", 2, 0, R_READ, kcd_resp_c_ttl},
    {"pttl", 2, 0, R_READ, kcd_resp_c_pttl},
    {"expire", -3, W, R_WRITE, kcd_resp_c_expire},
    {"pexpire", -3, W, R_WRITE, kcd_resp_c_pexpire},
    {"expireat", -3, W, R_WRITE, kcd_resp_c_expireat},
    {"pexpireat", -3, W, R_WRITE, kcd_resp_c_pexpireat},
    {"persist", 2, W, R_WRITE, kcd_resp_c_persist},
    {"type", 2, 0, R_READ, kcd_resp_c_type},
    {"strlen", 2, 0, R_READ, kcd_resp_c_strlen},
    {"scan", -2, 0, R_READ, kcd_resp_c_scan},
    {"keys", 2, 0, R_READ, kcd_resp_c_keys},
    {"dbsize", 1, 0, R_READ, kcd_resp_c_dbsize},
    {"flushdb", -1, W, R_ADMIN, kcd_resp_c_flush},
    {"flushall", -1, W, R_ADMIN, kcd_resp_c_flush},
    {"ping", -1, NS, R_NONE, kcd_resp_c_ping},
    {"echo", 2, NS, R_NONE, kcd_resp_c_echo},
    {"quit", -1, NS | NA | NM, R_NONE, kcd_resp_c_quit},
    {"hello", -1, NS | NA | NM, R_NONE, kcd_resp_c_hello},
    {"auth", -2, NS | NA | NM, R_NONE, kcd_resp_c_auth},
    {"select", 2, NS, R_NONE, kcd_resp_c_select},
    {"client", -2, NS, R_NONE, kcd_resp_c_client},
    {"command", -1, NS, R_NONE, kcd_resp_c_command},
    {"config", -2, NS, R_READ, kcd_resp_c_config},
    {"info", -1, 0, R_READ, kcd_resp_c_info},
    {"multi", 1, NS | NM, R_NONE, kcd_resp_c_multi},
    {"exec", 1, NM, R_NONE, kcd_resp_c_exec},
    {"discard", 1, NS | NM, R_NONE, kcd_resp_c_discard},
};
#define N_CMDS (sizeof cmds / sizeof cmds[0])

_Static_assert(N_CMDS <= KCD_RESP_N_CMDS, "KCD_RESP_N_CMDS too small");

size_t kcd_resp_cmd_count(void) { return N_CMDS; }

const kcd_resp_cmd *kcd_resp_cmd_at(size_t i) {
  return i < N_CMDS ? &cmds[i] : NULL;
}

/* 1 when the command left a write item tagged to be counted when its
 * reply is written (kcd_resp_job_reply): its result is known only then. */
static int deferred(const kcd_resp_ctx *x, size_t items_before) {
  const kcd_resp_job *j = x->job;
  for (size_t k = items_before; j && k < j->nitems; k++)
    if (j->items[k].cmd)
      return 1;
  return 0;
}

/* Counts the command by its first reply byte ('-': an error); a write
 * whose result comes from the commit is counted when it replies. */
static void count(kcd_resp_ctx *x, const kcd_resp_cmd *cmd,
                  const kcd_resp_buf *b, size_t before, size_t items_before) {
  kcd_resp *r = x->c->srv;
  if (x->c->fetch || deferred(x, items_before))
    return; /* counted when it runs again, or when it replies */
  size_t i = cmd ? (size_t)(cmd - cmds) : N_CMDS;
  int err = b->len > before && b->p[before] == '-';
  atomic_fetch_add(err ? &r->cmd_err[i] : &r->cmd_ok[i], 1);
}

int kcd_resp_is(const char *s, size_t n, const char *word) {
  return strlen(word) == n && strncasecmp(s, word, n) == 0;
}

const kcd_resp_cmd *kcd_resp_cmd_find(const char *name, size_t len) {
  for (size_t i = 0; i < N_CMDS; i++)
    if (kcd_resp_is(name, len, cmds[i].name))
      return &cmds[i];
  return NULL;
}

/* ---- Redis's error texts ---- */

void kcd_resp_err_arity(kcd_resp_buf *b, const char *name) {
  kcd_resp_errorf(b, "ERR wrong number of arguments for '%s' command", name);
}

void kcd_resp_err_syntax(kcd_resp_buf *b) {
  kcd_resp_error(b, "ERR syntax error");
}

void kcd_resp_err_int(kcd_resp_buf *b) {
  kcd_resp_error(b, "ERR value is not an integer or out of range");
}

void kcd_resp_store_err(kcd_resp_buf *b, kc_err e, const char *msg) {
  if (e == KC_STORE_FULL)
    kcd_resp_error(b,
                   "OOM command not allowed when used memory > 'maxmemory'.");
  else if (e == KC_NOT_READY)
    kcd_resp_error(b, "LOADING the store is not open yet");
  else
    kcd_resp_errorf(b, "ERR %s", msg && *msg ? msg : kc_strerror(e));
}

/* Redis's expire checks: a relative time (base now) or an absolute one
 * (base 0) in seconds or ms, to absolute ms; -1 with the error written. */
int kcd_resp_expire_at(kcd_resp_ctx *x, size_t i, int secs, int64_t base,
                       int positive, const char *cmd, int64_t *out) {
  long long v;
  if (kcd_resp_ll(ARG(i), &v))
    return kcd_resp_err_int(x->out), -1;
  int bad = positive && v <= 0;
  if (secs && (v > LLONG_MAX / 1000 || v < LLONG_MIN / 1000))
    bad = 1;
  if (!bad && secs)
    v *= 1000;
  if (!bad && v > LLONG_MAX - base)
    bad = 1;
  if (!bad)
    v += base;
  if (bad || (positive && v <= 0))
    return kcd_resp_errorf(x->out, "ERR invalid expire time in '%s' command",
                           cmd),
           -1;
  *out = v;
  return 0;
}

/* "unknown command 'foo', with args beginning with: 'a' 'b' ": the name
 * and the arguments cut at 128 bytes, as Redis writes them. */
void kcd_resp_err_unknown(kcd_resp_ctx *x) {
  char args[160] = "";
  size_t used = 0;
  for (size_t i = 1; i < x->argc && used < 128; i++) {
    int room = 128 - (int)used;
    int take = x->lens[i] < (size_t)room ? (int)x->lens[i] : room;
    int n =
        snprintf(args + used, sizeof args - used, "'%.*s' ", take, x->argv[i]);
    if (n < 0)
      break;
    used += (size_t)n < sizeof args - used ? (size_t)n : sizeof args - used - 1;
    /* a NUL inside an argument ends it, as in Redis's %s */
    used = strlen(args);
  }
  int nl = x->lens[0] < 128 ? (int)x->lens[0] : 128;
  kcd_resp_errorf(x->out,
                  "ERR unknown command '%.*s', with args beginning "
                  "with: %s",
                  nl, x->argv[0], args);
}

/* ---- access for handlers ---- */

kc_store *kcd_resp_store(kcd_resp_ctx *x) {
  kc_store *s = kcd_store(x->st);
  if (!s)
    kcd_resp_error(x->out, "LOADING the store is not open yet");
  return s;
}

kc_store_read *kcd_resp_read(kcd_resp_ctx *x) {
  kcd_resp_conn *c = x->c;
  if (c->rd)
    return c->rd;
  kc_store *s = kcd_resp_store(x);
  if (!s)
    return NULL;
  kc_err e = kcd_resp_read_lend(c, s); /* the round's read (resp.c) */
  if (e)
    kcd_resp_errorf(x->out, "ERR %s", kc_strerror(e));
  return c->rd;
}

/* ---- dispatch ---- */

static int arity_ok(const kcd_resp_cmd *cmd, size_t argc) {
  return cmd->arity > 0 ? argc == (size_t)cmd->arity
                        : argc >= (size_t)-cmd->arity;
}

static int needs_auth(const kcd_resp_conn *c) {
  return !c->authed && c->role == KCD_ROLE_NONE &&
         kcd_auth_enabled(&c->srv->st->auth);
}

/* Redis discards a transaction whose EXEC itself is rejected. */
static void discard(kcd_resp_conn *c);

/* The checks before running; 0 when it may run, else an error is written
 * (and an open MULTI is marked to fail at EXEC). */
static int check(kcd_resp_ctx *x, const kcd_resp_cmd *cmd) {
  kcd_resp_conn *c = x->c;
  char err[256] = "";
  if (!cmd) {
    kcd_resp_err_unknown(x);
  } else if (!arity_ok(cmd, x->argc)) {
    snprintf(err, sizeof err, "wrong number of arguments for '%s' command",
             cmd->name);
  } else if (needs_auth(c) && !(cmd->flags & KCD_CF_NOAUTH)) {
    kcd_resp_error(x->out, "NOAUTH Authentication required.");
  } else if (cmd->role > c->role) {
    kcd_resp_errorf(x->out,
                    "NOPERM this user has no permissions to run the "
                    "'%s' command",
                    cmd->name);
  } else {
    return 0;
  }
  if (*err && c->in_multi && cmd->fn == kcd_resp_c_exec) {
    kcd_resp_errorf(x->out, "EXECABORT Transaction discarded because of: %s",
                    err);
    discard(c);
    return -1;
  }
  if (*err)
    kcd_resp_errorf(x->out, "ERR %s", err);
  if (c->in_multi)
    c->multi_dirty = 1;
  return -1;
}

static int queue_cmd(kcd_resp_ctx *x) {
  kcd_resp_conn *c = x->c;
  if (c->nqueue == c->capqueue) {
    size_t cap = c->capqueue ? c->capqueue * 2 : 8;
    kcd_resp_queued *q = realloc(c->queue, cap * sizeof *q);
    if (!q)
      return -1;
    c->queue = q;
    c->capqueue = cap;
  }
  kcd_resp_queued *q = &c->queue[c->nqueue];
  q->argc = 0;
  q->argv = calloc(x->argc, sizeof *q->argv);
  q->lens = calloc(x->argc, sizeof *q->lens);
  c->nqueue++; /* freed with the queue, even half filled */
  if (!q->argv || !q->lens)
    return -1;
  for (size_t i = 0; i < x->argc; i++) {
    if (!(q->argv[i] = malloc(x->lens[i] + 1)))
      return -1;
    memcpy(q->argv[i], x->argv[i], x->lens[i]);
    q->argv[i][x->lens[i]] = '\0';
    q->lens[i] = x->lens[i];
    q->argc++;
  }
  return 0;
}

/* The reply did not fit the connection's output limit or every
 * connection's budget (MGET of a big key repeated, readers that do not
 * read): what it wrote goes, an error says why. When even that cannot be
 * written, the buffer counts as out of memory: the connection closes. */
static void over_budget(kcd_resp_ctx *x, kcd_resp_buf *b, size_t b0,
                        const kcd_resp_cmd *cmd) {
  b->len = b0;
  b->over = 0;
  kcd_resp_errorf(b,
                  "ERR the reply of '%s' would pass the output limit "
                  "(--resp-output-limit, --resp-output-total): read the "
                  "replies sent, or ask for fewer keys at once",
                  cmd ? cmd->name : "?");
  atomic_fetch_add(&x->c->srv->refused[KCD_WHY_OUTPUT], 1);
  if (b->over)
    b->oom = 1;
}

/* Runs fn; what it writes to the job's pre buffer becomes an item, so that
 * replies keep their order around the job's writes. */
static void run(kcd_resp_ctx *x, const kcd_resp_cmd *cmd) {
  kcd_resp_job *j = x->job;
  size_t before = j ? j->pre.len : 0;
  if (j)
    x->out = &j->pre;
  kcd_resp_buf *b = x->out;
  size_t b0 = b->len;
  if (cmd)
    cmd->fn(x);
  if (b->over)
    over_budget(x, b, b0, cmd);
  if (x->job && x->job == j && j->pre.len > before)
    kcd_resp_job_item(j, KCD_RK_PRE, before);
}

void kcd_resp_dispatch(kcd_resp_ctx *x) {
  const kcd_resp_cmd *cmd = kcd_resp_cmd_find(x->argv[0], x->lens[0]);
  kcd_resp_job *j = x->job;
  if (j)
    x->out = &j->pre;
  kcd_resp_buf *b = x->out;
  size_t before = b->len, items = j ? j->nitems : 0;
  if (check(x, cmd) == 0) {
    if (x->c->in_multi && !(cmd->flags & KCD_CF_NOMULTI)) {
      if (queue_cmd(x))
        kcd_resp_error(x->out, "OOM out of memory");
      else
        kcd_resp_simple(x->out, "QUEUED");
    } else {
      x->c->cur_cmd = (unsigned)(cmd - cmds) + 1;
      run(x, cmd);
      x->c->cur_cmd = 0;
      return count(x, cmd, b, before, x->job == j ? items : 0);
    }
  }
  count(x, cmd, b, before, items);
  if (j && j->pre.len > before)
    kcd_resp_job_item(j, KCD_RK_PRE, before);
}

/* ---- MULTI / EXEC / DISCARD ---- */

void kcd_resp_queue_free(kcd_resp_conn *c) {
  for (size_t i = 0; i < c->nqueue; i++) {
    for (size_t k = 0; k < c->queue[i].argc; k++)
      free(c->queue[i].argv[k]);
    free(c->queue[i].argv);
    free(c->queue[i].lens);
  }
  c->nqueue = 0;
}

/* The job's ops point into the queued arguments: it takes them over. */
static void own_queue(kcd_resp_conn *c, kcd_resp_job *j) {
  size_t n = 0;
  for (size_t i = 0; i < c->nqueue; i++)
    n += c->queue[i].argc;
  char **v = n ? malloc(n * sizeof *v) : NULL;
  if (n && !v) { /* cannot keep them: the ops must not run */
    j->nops = j->nitems = j->pre.len = 0;
    kcd_resp_error(&j->pre, "OOM out of memory");
    kcd_resp_job_item(j, KCD_RK_PRE, 0);
    return kcd_resp_queue_free(c);
  }
  for (size_t i = 0; i < c->nqueue; i++) {
    for (size_t k = 0; k < c->queue[i].argc; k++)
      v[j->nowned++] = c->queue[i].argv[k];
    c->queue[i].argc = 0;
  }
  j->owned = v;
  kcd_resp_queue_free(c);
}

static void discard(kcd_resp_conn *c) {
  kcd_resp_queue_free(c);
  c->in_multi = c->multi_dirty = 0;
}

void kcd_resp_c_multi(kcd_resp_ctx *x) {
  if (x->c->in_multi)
    return kcd_resp_error(x->out, "ERR MULTI calls can not be nested");
  x->c->in_multi = 1;
  x->c->multi_dirty = 0;
  kcd_resp_simple(x->out, "OK");
}

void kcd_resp_c_discard(kcd_resp_ctx *x) {
  if (!x->c->in_multi)
    return kcd_resp_error(x->out, "ERR DISCARD without MULTI");
  discard(x->c);
  kcd_resp_simple(x->out, "OK");
}

/* The queued commands run now, in order: reads against the state before
 * EXEC (this batch's read transaction), writes as ops of one job, so that
 * they commit together in one transaction. */
void kcd_resp_c_exec(kcd_resp_ctx *x) {
  kcd_resp_conn *c = x->c;
  if (!c->in_multi)
    return kcd_resp_error(x->out, "ERR EXEC without MULTI");
  if (c->multi_dirty) {
    discard(c);
    return kcd_resp_error(x->out, "EXECABORT Transaction discarded because "
                                  "of previous errors.");
  }
  kcd_resp_job *j = kcd_resp_job_of(x);
  if (!j)
    return discard(c);
  size_t before = j->pre.len;
  kcd_resp_array(&j->pre, (long long)c->nqueue);
  kcd_resp_job_item(j, KCD_RK_PRE, before);
  c->cur_cmd = 0; /* the queued commands were counted when queued */
  for (size_t i = 0; i < c->nqueue; i++) {
    kcd_resp_queued *q = &c->queue[i];
    kcd_resp_ctx y = *x;
    y.job = j;
    y.exec = 1;
    y.argc = q->argc;
    y.argv = (const char *const *)q->argv;
    y.lens = q->lens;
    run(&y, kcd_resp_cmd_find(q->argv[0], q->lens[0]));
  }
  own_queue(c, j);
  c->in_multi = c->multi_dirty = 0;
}
