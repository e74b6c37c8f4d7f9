/* resp.c: the RESP listener: one epoll thread owns every connection
 * (nonblocking sockets, level-triggered). A readable connection reads once,
 * runs every complete command in its buffer (pipelining) and writes the
 * replies with one write; writes go to the committer as one job per batch
 * (see resp.h for the ordering rules). Committed jobs come back through an
 * eventfd. With --tls-cert (and not --resp-tls off) every connection
 * speaks TLS (resp_tls.c): the same loop, reads and writes through
 * OpenSSL, the interest widened while a read waits to write or a write to
 * read. */
#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "resp.h"

#define READ_MIN (16 * 1024)
#define KEEP_MAX (256 * 1024) /* buffers above this are freed when empty */
#define EVENTS 64

size_t kcd_resp_clients(kcd_resp *r) { return r ? atomic_load(&r->nconns) : 0; }
uint64_t kcd_resp_port(kcd_resp *r) { return r ? r->port : 0; }

/* ---- the pool of big input buffers ----
 * A big value's input buffer grows from READ_MIN by doubling (realloc
 * copies what came so far, and the new pages fault in) and is freed once
 * the value ran. The next big value of any connection instead takes a
 * buffer that a value which really arrived left here: warm pages, one copy
 * of the few bytes read so far. A client's declared length only chooses
 * among buffers held already; it never makes one (the parser's rule: the
 * buffer grows with bytes that arrived). Bounded in count and bytes, freed
 * when no value took one for KCD_RESP_POOL_IDLE_MS. A taker gets the
 * buffer's old bytes past its len, which nothing reads: every read of the
 * input stops at len. Listener thread only. */

/* Keeps b's memory for a later taker (b is emptied either way). */
static void pool_put(kcd_resp *r, kcd_resp_buf *b) {
  if (!b->oom && b->cap <= KCD_RESP_POOL_BYTES && r->npool < KCD_RESP_POOL_N &&
      r->pool_bytes + b->cap <= KCD_RESP_POOL_BYTES) {
    r->pool[r->npool++] = (kcd_resp_buf){.p = b->p, .cap = b->cap};
    r->pool_bytes += b->cap;
    memset(b, 0, sizeof *b);
    return;
  }
  kcd_resp_buf_free(b);
}

/* Moves in's bytes into a pooled buffer of at least need bytes, the
 * smallest that holds fit (the value as declared) if one does, else the
 * largest; 0 when none is big enough. */
static int pool_swap(kcd_resp *r, kcd_resp_buf *in, size_t need, size_t fit) {
  size_t best = r->npool;
  for (size_t i = 0; i < r->npool; i++) {
    size_t cap = r->pool[i].cap;
    if (cap < need)
      continue;
    if (best == r->npool) {
      best = i;
      continue;
    }
    size_t bc = r->pool[best].cap;
    if (cap >= fit ? bc < fit || cap < bc : bc < fit && cap > bc)
      best = i;
  }
  if (best == r->npool)
    return 0;
  kcd_resp_buf b = r->pool[best];
  r->pool[best] = r->pool[--r->npool];
  r->pool_bytes -= b.cap;
  r->pool_used_ms = kc_clock_mono_ms();
  if (in->len)
    memcpy(b.p, in->p, in->len);
  b.len = in->len;
  if (in->cap > KEEP_MAX)
    pool_put(r, in);
  else
    kcd_resp_buf_free(in);
  *in = b;
  return 1;
}

/* Frees the pool when no value took from it for a while. */
static void pool_trim(kcd_resp *r, int force) {
  if (!r->npool ||
      (!force && kc_clock_mono_ms() - r->pool_used_ms < KCD_RESP_POOL_IDLE_MS))
    return;
  while (r->npool)
    free(r->pool[--r->npool].p);
  r->pool_bytes = 0;
}

/* Room for `room` more input bytes: a pooled buffer before a realloc.
 * fit: the bytes the command being read declares it needs in all. */
static int in_reserve(kcd_resp_conn *c, size_t room, size_t fit) {
  kcd_resp_buf *b = &c->in;
  if (b->cap - b->len >= room && !b->oom)
    return 0;
  /* a first READ_MIN buffer is not taken from the pool: most commands
   * are small; past it, READ_MIN bytes have arrived */
  if (!b->oom && b->len + room > READ_MIN &&
      pool_swap(c->srv, b, b->len + room, fit))
    return 0;
  return kcd_resp_buf_reserve(b, room);
}

/* ---- connections ---- */

static void conn_free(kcd_resp_conn *c) {
  kcd_resp_queue_free(c);
  free(c->queue);
  kcd_resp_job_free(c->job);
  kcd_resp_job_free(c->fetch);
  kcd_resp_buf_free(&c->in);
  kcd_resp_buf_free(&c->out);
  kcd_resp_parser_free(&c->parser);
  free(c->name);
  free(c->av);
  free(c->al);
  free(c);
}

/* Freed once the events of this round are handled: a later event of the
 * same round may still name it (and sees fd -1). */
static void bury(kcd_resp_conn *c) {
  c->next = c->srv->grave;
  c->srv->grave = c;
}

static void conn_close(kcd_resp_conn *c) {
  kcd_resp *r = c->srv;
  if (c->fd < 0)
    return;
  kcd_resp_admit_release(r, c);
  epoll_ctl(r->ep, EPOLL_CTL_DEL, c->fd, NULL);
  kcd_resp_tls_close(c);
  close(c->fd);
  c->fd = -1;
  c->rd = NULL; /* the round's read, lent */
  c->nrefs = 0;
  if (c->prev)
    c->prev->next = c->next;
  else
    r->conns = c->next;
  if (c->next)
    c->next->prev = c->prev;
  atomic_fetch_sub(&r->nconns, 1);
  c->dead = 1;
  if (!c->inflight) /* else the committer still holds its job */
    bury(c);
}

static size_t pending(const kcd_resp_conn *c) {
  return c->out.len - c->out_off;
}

/* A job is with the committer or the fetchers: an operation in flight
 * (service.c), which graceful shutdown waits for, until on_done wrote its
 * reply. */
static void inflight_begin(kcd_resp_conn *c) {
  c->inflight = 1;
  kcd_svc_begin(c->srv->st, KCD_FE_RESP);
}

/* Commands may run: nothing in flight, not closing, output below the mark. */
static int may_run(const kcd_resp_conn *c) {
  /* a reply that did not fit (written after a commit) left the output
   * short of it: nothing more may follow, the connection closes */
  return !c->inflight && !c->closing && pending(c) <= KCD_RESP_OUT_HIGH &&
         !c->out.over && !c->out.oom;
}

/* Reading too (after the peer's EOF there is nothing more to read). */
static int may_read(const kcd_resp_conn *c) { return may_run(c) && !c->eof; }

/* Sets the epoll interest from the state: read while commands may run,
 * write while replies wait or while commands already buffered wait to run
 * (backlog: the socket is writable at once, so the next round of events
 * runs them, after the other connections' events of this round); with TLS
 * also the way a read or a write that could not go on waits (a handshake's
 * write, a key update's read). */
static void conn_interest(kcd_resp_conn *c) {
  unsigned want = 0;
  if (may_read(c) || c->tls_wr_want_rd)
    want |= EPOLLIN;
  if (pending(c) || (c->backlog && may_run(c)) ||
      (c->tls_rd_want_wr && may_read(c))) /* no spin */
    want |= EPOLLOUT;
  if (want == c->events)
    return;
  struct epoll_event ev = {.events = want, .data.ptr = c};
  epoll_ctl(c->srv->ep, EPOLL_CTL_MOD, c->fd, &ev);
  c->events = want;
}

static ssize_t sock_write(kcd_resp_conn *c, const void *p, size_t n) {
  return c->ssl ? kcd_resp_tls_write(c, p, n) : write(c->fd, p, n);
}

static ssize_t sock_read(kcd_resp_conn *c, void *p, size_t n) {
  return c->ssl ? kcd_resp_tls_read(c, p, n) : read(c->fd, p, n);
}

/* What waits, with the values of c->refs taken from the map: one writev. */
static ssize_t write_refs(kcd_resp_conn *c) {
  struct iovec iov[2 * KCD_RESP_REFS + 1];
  int k = 0;
  size_t at = c->out_off;
  for (size_t i = 0; i < c->nrefs; i++) {
    const kcd_resp_ref *f = &c->refs[i];
    if (f->off + f->len <= at)
      continue; /* sent already: not met today (out_off is 0 while refs
                 * exist: process moves sent bytes out before it adds any,
                 * and refs_settle drops them after the first write), kept
                 * so the offsets stay right whatever out_off is */
    if (f->off > at)
      iov[k++] = (struct iovec){c->out.p + at, f->off - at};
    size_t skip = at > f->off ? at - f->off : 0;
    iov[k++] = (struct iovec){(char *)f->p + skip, f->len - skip};
    at = f->off + f->len;
  }
  if (c->out.len > at)
    iov[k++] = (struct iovec){c->out.p + at, c->out.len - at};
  return writev(c->fd, iov, k);
}

/* After the write: the unsent part of each value is copied into its room
 * in out, so nothing unsent points into the map when the round's read
 * ends (the sent part is never written again: the next write starts at
 * out_off). */
static void refs_settle(kcd_resp_conn *c) {
  for (size_t i = 0; i < c->nrefs; i++) {
    const kcd_resp_ref *f = &c->refs[i];
    if (f->off + f->len <= c->out_off)
      continue;
    size_t skip = c->out_off > f->off ? c->out_off - f->off : 0;
    memcpy(c->out.p + f->off + skip, (const char *)f->p + skip, f->len - skip);
  }
  c->nrefs = 0;
}

/* One write of what waits; 0 ok (maybe partly sent), -1 closed. */
static int conn_flush(kcd_resp_conn *c) {
  if (c->out.oom || c->out.over) { /* a reply no budget had room for */
    if (c->out.over)
      kcd_resp_refuse(c, KCD_WHY_OUTPUT);
    return conn_close(c), -1;
  }
  while (pending(c)) {
    ssize_t n = c->nrefs ? write_refs(c)
                         : sock_write(c, c->out.p + c->out_off, pending(c));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      break;
    if (n <= 0)
      return conn_close(c), -1;
    c->out_off += (size_t)n;
    c->io_ms = kc_clock_mono_ms();
    atomic_fetch_add(&c->srv->bytes_out, (uint64_t)n);
    break; /* level-triggered: EPOLLOUT brings the rest */
  }
  refs_settle(c);
  if (!pending(c)) {
    c->out.len = c->out_off = 0;
    if (c->out.cap > KEEP_MAX)
      kcd_resp_buf_free(&c->out);
    if ((c->closing || (c->eof && !c->backlog)) && !c->inflight)
      return conn_close(c), -1;
  }
  conn_interest(c);
  return 0;
}

/* ---- running commands ---- */

static int argv_room(kcd_resp_conn *c, size_t n) {
  if (n <= c->avcap)
    return 0;
  const char **av = realloc(c->av, n * sizeof *av);
  if (av)
    c->av = av;
  size_t *al = realloc(c->al, n * sizeof *al);
  if (al)
    c->al = al;
  if (!av || !al)
    return -1;
  c->avcap = n;
  return 0;
}

/* Sends the open job to the committer, or replies at once when it holds no
 * write (an EXEC of reads). */
static void submit(kcd_resp_conn *c) {
  kcd_resp_job *j = c->job;
  if (!j)
    return;
  c->job = NULL;
  c->rd = NULL;
  if (j->nops == 0) {
    kcd_resp_job_reply(j, &c->out);
    kcd_resp_job_free(j);
    return;
  }
  inflight_begin(c);
  kcd_resp_commit_submit(c->srv, j);
}

/* A command that must see the writes before it (a read) waits for the
 * open job; queueing in MULTI and store-less commands need not. */
static int is_barrier(const kcd_resp_conn *c, const kcd_resp_cmd *cmd) {
  if (!cmd || (cmd->flags & (KCD_CF_WRITE | KCD_CF_NOSTORE)))
    return 0;
  return !(c->in_multi && !(cmd->flags & KCD_CF_NOMULTI));
}

/* The token AUTH gave this connection still grants its role; checked
 * again only after a SIGHUP swapped the token table in. */
static int token_valid(kcd_resp_conn *c) {
  kcd_auth *a = &c->srv->st->auth;
  if (!c->tok_set)
    return 1;
  uint64_t gen = kcd_auth_gen(a);
  if (gen == c->auth_gen)
    return 1;
  if (kcd_auth_holds(a, c->tok_digest, c->user, c->role))
    return c->auth_gen = gen, 1;
  kcd_log(c->srv->st, "info",
          "RESP: closing the connection of token '%s' "
          "from %s: the token was removed or its role changed",
          c->user, c->remote);
  kcd_resp_refuse(c, KCD_WHY_REVOKED);
  return 0;
}

static void run_parsed(kcd_resp_conn *c) {
  kcd_resp_parser *p = &c->parser;
  kcd_resp_ctx x = {.c = c,
                    .st = c->srv->st,
                    .job = c->job,
                    .now_ms = kc_clock_wall_ms(),
                    .argc = p->argc};
  for (size_t i = 0; i < p->argc; i++) {
    c->av[i] = c->in.p + p->argv[i].off;
    c->al[i] = p->argv[i].len;
  }
  x.argv = c->av;
  x.lens = c->al;
  /* an HTTP request (a browser's cross-protocol POST): nothing of it runs */
  if (kcd_resp_is_http(x.argv, x.lens, x.argc, p->inl)) {
    kcd_resp_refuse(c, KCD_WHY_HTTP);
    c->closing = 1;
    return;
  }
  if (!token_valid(c)) {
    c->closing = 1;
    return;
  }
  x.out = c->job ? &c->job->pre : &c->out;
  atomic_fetch_add(&c->srv->commands_total, 1);
  kcd_resp_dispatch(&x);
  c->job = x.job;
}

/* The protocol error goes after every reply before it; then close. */
static void proto_error(kcd_resp_conn *c) {
  kcd_resp_buf *b = c->job ? &c->job->pre : &c->out;
  size_t before = b->len;
  kcd_resp_errorf(b, "ERR %s", c->parser.error);
  if (c->job)
    kcd_resp_job_item(c->job, KCD_RK_PRE, before);
  c->closing = 1;
}

/* The first bytes must be RESP or an inline command: 1 when they are,
 * 0 to wait for more, or with the connection refused. */
static int sniff(kcd_resp_conn *c) {
  kcd_resp_sniff_res s = kcd_resp_sniff(c->in.p, c->in.len);
  if (s == KCD_SNIFF_OK)
    return c->sniffed = 1;
  if (s == KCD_SNIFF_BAD) {
    kcd_resp_refuse(c, KCD_WHY_NOT_RESP);
    kcd_resp_error(&c->out, "ERR Protocol error: expected a RESP array "
                            "('*') or an inline command");
    c->closing = 1;
  }
  return 0;
}

/* The job is full enough: send it before parsing more. */
static int job_full(const kcd_resp_job *j) {
  return j &&
         (j->nops >= KCD_RESP_JOB_OPS || j->val_bytes >= KCD_RESP_JOB_BYTES);
}

/* One parsed command: 1 to go on, 0 to stop. */
static int step(kcd_resp_conn *c) {
  kcd_resp_parser *p = &c->parser;
  if (!c->held) {
    if (job_full(c->job))
      return 0;
    if (!c->sniffed && !sniff(c))
      return 0;
    kcd_resp_res res = kcd_resp_parse(p, c->in.p, c->in.len);
    if (res == KCD_RESP_MORE)
      return 0;
    if (res != KCD_RESP_CMD) {
      if (res == KCD_RESP_NOMEM)
        c->parser.error = "out of memory";
      proto_error(c);
      return 0;
    }
    if (argv_room(c, p->argc))
      return c->closing = 1, 0;
  }
  const kcd_resp_cmd *cmd =
      kcd_resp_cmd_find(c->in.p + p->argv[0].off, p->argv[0].len);
  if (c->job && is_barrier(c, cmd)) {
    c->held = 1; /* run it when the job is back */
    return 0;
  }
  c->held = 0;
  run_parsed(c);
  c->fetched = 0;
  if (c->fetch) { /* a read-through: run it again when the keys are here */
    kcd_resp_job *j = c->fetch;
    c->fetch = NULL;
    c->held = 1;
    c->rd = NULL;
    inflight_begin(c);
    kcd_resp_fetch_submit(c->srv, j);
    return 0;
  }
  return !c->closing;
}

/* A command of many arguments grew the tables (16 bytes an argument in
 * the parser, 16 in av/al): freed once it ran, so that one such command
 * does not leave them on the connection for good. */
static void shrink_args(kcd_resp_conn *c) {
  if (c->parser.inmb || c->held || c->inflight)
    return;
  if (c->parser.argcap > KCD_RESP_ARGS_KEEP)
    kcd_resp_parser_free(&c->parser), c->srv->trim = 1;
  if (c->avcap > KCD_RESP_ARGS_KEEP) {
    free(c->av);
    free(c->al);
    c->av = NULL;
    c->al = NULL;
    c->avcap = 0;
  }
}

/* glibc keeps freed tables in the listener's arena, resident, and did not
 * always reuse them for the next big command (40 commands of 60000
 * arguments left 75 MB): hand them back, at most once a second. */
static void trim_heap(kcd_resp *r) {
  if (!r->trim)
    return;
  r->trim = 0;
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

static void compact(kcd_resp_conn *c) {
  size_t n = kcd_resp_parser_done(&c->parser);
  if (n == 0 || c->inflight || c->held)
    return;
  memmove(c->in.p, c->in.p + n, c->in.len - n);
  c->in.len -= n;
  kcd_resp_parser_shift(&c->parser, n);
  if (c->in.len == 0 && c->in.cap > KEEP_MAX && !c->parser.inmb) {
    c->srv->pool_used_ms =
        kc_clock_mono_ms(); /* a fresh buffer waits its time */
    pool_put(c->srv, &c->in);
  }
  shrink_args(c);
}

/* Runs buffered commands until one must wait (more input, a commit, a
 * fetch) or the output passes KCD_RESP_OUT_HIGH; then backlog says complete
 * commands may remain, for conn_interest to come back to them. */
static void process(kcd_resp_conn *c) {
  int go;
  c->backlog = 0;
  /* what was sent goes: the output limit then counts unsent bytes only */
  if (c->out_off && pending(c) <= KCD_RESP_OUT_HIGH) {
    memmove(c->out.p, c->out.p + c->out_off, pending(c));
    c->out.len -= c->out_off;
    c->out_off = 0;
  }
  while ((go = may_run(c)) && step(c))
    ;
  c->backlog = !go && !c->inflight && !c->closing;
  submit(c);
  c->rd = NULL;
  compact(c);
}

/* Ends the round's read, which every batch of the round borrowed
 * (kcd_resp_read): one LMDB read per round of events, not one per batch.
 * A read renewed per request paid its begin and end and, at its first
 * use of each database, a lookup of that database's root: a fifth of a
 * one-command batch's instructions. Ended before epoll_wait blocks (a
 * held read pins the pages freed after it) and before committed jobs
 * are answered, so a connection's next command sees its writes; a batch
 * that runs later in a round sees the state as of the round's first
 * read, which no reply of a later commit has announced yet. Also ended
 * before a command that opens its own, newer read (SCAN, KEYS, DBSIZE,
 * INFO: kcd_resp_read_forward) and before on_accept pauses: within a
 * pipeline the state the commands see then only moves forward, never
 * back (DBSIZE counting a key that a later EXISTS of the old read would
 * miss). */
static void round_end(kcd_resp *r) {
  kc_store_read_end(r->rd);
  r->rd = NULL;
}

kc_err kcd_resp_read_lend(kcd_resp_conn *c, kc_store *s) {
  kcd_resp *r = c->srv;
  if (c->rd)
    return KC_OK;
  /* begun by the round's first batch that reads */
  kc_err e = r->rd ? KC_OK : kc_store_read_begin(s, &r->rd);
  if (e)
    r->rd = NULL;
  c->rd = r->rd;
  return e;
}

/* Ending the round's read mid-batch: this connection's replies that point
 * into it are copied into out first. No other connection holds any: each
 * one's batch is followed by its write (conn_flush), which settles them. */
void kcd_resp_read_forward(kcd_resp_conn *c) {
  refs_settle(c);
  c->rd = NULL;
  round_end(c->srv);
}

/* ---- I/O events ---- */

/* What OpenSSL decrypted beyond the last read (the rest of a record):
 * the socket will not signal it, so it is taken now. At most a record. */
static int read_tls_pending(kcd_resp_conn *c) {
  size_t more;
  while ((more = kcd_resp_tls_pending(c)) > 0) {
    if (kcd_resp_buf_reserve(&c->in, more))
      return -1;
    ssize_t n = kcd_resp_tls_read(c, c->in.p + c->in.len, more);
    if (n <= 0)
      break;
    c->in.len += (size_t)n;
    atomic_fetch_add(&c->srv->bytes_in, (uint64_t)n);
  }
  return 0;
}

/* A connection that never finished its TLS handshake is counted. */
static void read_failed(kcd_resp_conn *c) {
  if (kcd_resp_tls_in_handshake(c))
    atomic_fetch_add(&c->srv->tls_failed, 1);
  conn_close(c);
}

static void on_read(kcd_resp_conn *c) {
  size_t want = kcd_resp_parser_want(&c->parser, c->in.len);
  /* grow with what arrives (at most doubling), never to a declared size */
  size_t room = want > c->in.len ? c->in.len : want;
  if (room < READ_MIN)
    room = READ_MIN;
  if (in_reserve(c, room, c->in.len + want))
    return conn_close(c);
  ssize_t n = sock_read(c, c->in.p + c->in.len, c->in.cap - c->in.len);
  if (n < 0 && (errno == EAGAIN || errno == EINTR))
    return conn_interest(c); /* TLS: maybe waiting to write */
  if (n < 0)
    return read_failed(c);
  if (n == 0) { /* EOF: answer what came, then close */
    c->eof = 1;
  } else {
    c->in.len += (size_t)n;
    c->io_ms = kc_clock_mono_ms();
    atomic_fetch_add(&c->srv->bytes_in, (uint64_t)n);
    if (read_tls_pending(c))
      return conn_close(c);
  }
  process(c);
  conn_flush(c);
}

static void on_event(kcd_resp_conn *c, unsigned ev) {
  if (c->fd < 0)
    return;
  /* TLS: a write that waited to read, a read that waited to write */
  if ((ev & EPOLLIN) && c->tls_wr_want_rd && conn_flush(c))
    return;
  if ((ev & EPOLLOUT) && c->tls_rd_want_wr && may_read(c)) {
    on_read(c);
    return;
  }
  if ((ev & EPOLLIN) && may_read(c)) {
    on_read(c);
    return;
  }
  if (ev & EPOLLOUT) {
    if (conn_flush(c))
      return;
    /* drained, or below the mark with commands waiting: run them */
    if ((!pending(c) || c->backlog) && may_run(c)) {
      process(c);
      conn_flush(c);
    }
    return;
  }
  if (ev & (EPOLLHUP | EPOLLERR))
    conn_close(c);
}

/* A refused connection gets Redis's text where it can read one (not
 * over TLS: no handshake was made), then is closed. */
static void refuse_at_accept(kcd_resp *r, int fd, kcd_resp_why why) {
  static const char full[] = "-ERR max number of clients reached\r\n";
  static const char per_ip[] = "-ERR max number of clients from this "
                               "address reached\r\n";
  const char *msg = why == KCD_WHY_PER_IP ? per_ip : full;
  size_t n = why == KCD_WHY_PER_IP ? sizeof per_ip - 1 : sizeof full - 1;
  ssize_t w = r->tls_ctx ? 0 : write(fd, msg, n);
  (void)w;
  atomic_fetch_add(&r->refused[why], 1);
  close(fd);
}

static kcd_resp_conn *conn_new(kcd_resp *r, int fd) {
  kcd_resp_conn *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->srv = r;
  c->fd = fd;
  c->accepted_ms = c->io_ms = kc_clock_mono_ms();
  c->out.limit = (size_t)r->st->cfg.resp_output_limit;
  c->out.bud = &r->outbud;
  return c;
}

static void on_accept(kcd_resp *r) {
  for (;;) {
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    int fd = accept4(r->lfd, (struct sockaddr *)&sa, &sl,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
                   errno == ENOMEM)) {
      /* out of descriptors: the listening socket stays readable; pause a
       * little rather than spin on it, with the round's read (begun by an
       * earlier event of this round) ended first, so the pause pins no
       * pages; the round's later events begin a new one */
      round_end(r);
      struct timespec ms10 = {0, 10 * 1000 * 1000};
      nanosleep(&ms10, NULL);
      return;
    }
    if (fd < 0)
      return;
    kcd_resp_conn *c = conn_new(r, fd);
    if (!c) {
      close(fd);
      continue;
    }
    kcd_resp_why why = kcd_resp_admit(r, c, (struct sockaddr *)&sa);
    if (why != KCD_WHY_N) {
      free(c);
      refuse_at_accept(r, fd, why);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->id = ++r->next_id;
    if (r->tls_ctx && kcd_resp_tls_accept(c)) {
      kcd_resp_admit_release(r, c);
      free(c);
      close(fd);
      continue;
    }
    kcd_auth *a = &r->st->auth;
    c->role = kcd_auth_enabled(a) ? r->st->cfg.resp_anon_role : KCD_ROLE_ADMIN;
    kcd_resp_parser_init(&c->parser, r->st->cfg.resp_max_value,
                         KCD_RESP_MAX_ARGS);
    c->parser.unauth = kcd_auth_enabled(a) && c->role == KCD_ROLE_NONE;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    c->events = EPOLLIN;
    if (epoll_ctl(r->ep, EPOLL_CTL_ADD, fd, &ev)) {
      kcd_resp_admit_release(r, c);
      kcd_resp_tls_close(c);
      conn_free(c);
      close(fd);
      continue;
    }
    c->next = r->conns;
    if (r->conns)
      r->conns->prev = c;
    r->conns = c;
    atomic_fetch_add(&r->nconns, 1);
    atomic_fetch_add(&r->conns_total, 1);
  }
}

/* Jobs the committer finished: reply, and go on with each connection. */
static void on_done(kcd_resp *r) {
  uint64_t v;
  ssize_t n = read(r->efd, &v, sizeof v);
  (void)n;
  pthread_mutex_lock(&r->dlock);
  kcd_resp_job *j = r->dhead;
  r->dhead = r->dtail = NULL;
  pthread_mutex_unlock(&r->dlock);
  if (j) /* their commits came after the round's read */
    round_end(r);
  while (j) {
    kcd_resp_job *next = j->next;
    kcd_resp_conn *c = j->conn;
    c->inflight = 0;
    c->fetched = j->fetch;
    if (c->dead) {
      kcd_resp_job_free(j);
      bury(c);
    } else {
      kcd_resp_job_reply(j, &c->out);
      kcd_resp_job_free(j);
      process(c); /* may hand the next job over (in flight again) */
      conn_flush(c);
    }
    kcd_svc_end(r->st, KCD_FE_RESP); /* its reply is written, or no one
                                        waits for it */
    j = next;
  }
}

static void free_grave(kcd_resp *r) {
  while (r->grave) {
    kcd_resp_conn *c = r->grave;
    r->grave = c->next;
    conn_free(c);
  }
}

/* Frees the buffers and argument tables of a connection that waits for
 * its next command (Redis frees an idle client's query buffer too): 10,000
 * idle connections then hold their structs, not 16K-256K buffers each. */
static void trim_idle(kcd_resp_conn *c) {
  if (pending(c) || c->in.len || c->parser.inmb || c->held || c->inflight ||
      c->job)
    return;
  if (c->out.cap || c->in.cap || c->parser.argcap || c->avcap)
    c->srv->trim = 1;
  kcd_resp_buf_free(&c->out);
  c->out_off = 0;
  if (c->in.cap > KEEP_MAX)
    pool_put(c->srv, &c->in);
  else
    kcd_resp_buf_free(&c->in);
  kcd_resp_parser_free(&c->parser);
  free(c->av);
  free(c->al);
  c->av = NULL;
  c->al = NULL;
  c->avcap = 0;
}

/* 1 when the sweep closes c: a TLS handshake not done in time (a silent
 * client holds no slot), --resp-timeout, --resp-output-stall, or a token
 * a SIGHUP removed or changed. */
static int sweep_closes(kcd_resp_conn *c, int64_t now) {
  const kcd_config *cfg = &c->srv->st->cfg;
  int64_t quiet = now - c->io_ms;
  if (c->ssl && kcd_resp_tls_in_handshake(c) &&
      now - c->accepted_ms > KCD_RESP_TLS_HS_MS) {
    atomic_fetch_add(&c->srv->tls_failed, 1);
    return 1;
  }
  kcd_resp_why why = KCD_WHY_N;
  if (!c->inflight && cfg->resp_timeout_s &&
      quiet > (int64_t)cfg->resp_timeout_s * 1000)
    why = KCD_WHY_IDLE;
  else if (cfg->resp_output_stall_s && pending(c) > KCD_RESP_OUT_HIGH &&
           quiet > (int64_t)cfg->resp_output_stall_s * 1000)
    why = KCD_WHY_STALLED;
  if (why != KCD_WHY_N)
    return kcd_resp_refuse(c, why), 1;
  if (!token_valid(c)) /* counted and logged */
    return 1;
  if (quiet > KCD_RESP_TRIM_MS)
    trim_idle(c);
  return 0;
}

/* Once a second: every connection's deadlines and token, idle buffers. */
static void sweep(kcd_resp *r, int64_t *last) {
  int64_t now = kc_clock_mono_ms();
  if (now - *last < 1000)
    return;
  *last = now;
  for (kcd_resp_conn *c = r->conns, *next; c; c = next) {
    next = c->next;
    if (sweep_closes(c, now))
      conn_close(c);
  }
  trim_heap(r);
}

/* Graceful shutdown (kcd_resp_quiesce): no new connection; the open ones
 * go on until kcd_resp_stop. */
static void stop_accepting(kcd_resp *r) {
  if (!atomic_load(&r->quiesce) || r->lfd < 0)
    return;
  epoll_ctl(r->ep, EPOLL_CTL_DEL, r->lfd, NULL);
  close(r->lfd);
  r->lfd = -1;
}

/* Connections with a reply not all sent, or still to come (a job). */
static int n_unsent(const kcd_resp *r) {
  int n = 0;
  for (const kcd_resp_conn *c = r->conns; c; c = c->next)
    n += pending(c) > 0 || c->inflight;
  return n;
}

static void dispatch(kcd_resp *r, const struct epoll_event *ev) {
  if (ev->data.ptr == &r->lfd)
    on_accept(r);
  else if (ev->data.ptr == &r->efd)
    on_done(r);
  else
    on_event(ev->data.ptr, ev->events);
}

/* Graceful shutdown's end: every connection stops reading and running
 * commands and closes once its replies are sent (jobs still finishing
 * reply too), until r->drain_until_ms; what is unsent then is cut, and
 * the log says so. */
static void drain_replies(kcd_resp *r) {
  struct epoll_event ev[EVENTS];
  for (kcd_resp_conn *c = r->conns, *next; c; c = next) {
    next = c->next;
    c->closing = 1;
    if (pending(c) || c->inflight)
      conn_interest(c); /* conn_flush closes it once all is out */
    else
      conn_close(c);
  }
  while (n_unsent(r) && kc_clock_mono_ms() < r->drain_until_ms) {
    int n = epoll_wait(r->ep, ev, EVENTS, 50);
    for (int i = 0; i < n; i++)
      dispatch(r, &ev[i]);
    round_end(r);
    free_grave(r);
  }
  int left = n_unsent(r);
  if (left)
    kcd_log(r->st, "warn", "cutting off %d RESP replies still being sent",
            left);
}

static void *io_main(void *arg) {
  kcd_resp *r = arg;
  struct epoll_event ev[EVENTS];
  int64_t swept = kc_clock_mono_ms();
  while (!atomic_load(&r->stop)) {
    stop_accepting(r);
    int n = epoll_wait(r->ep, ev, EVENTS, 1000);
    for (int i = 0; i < n; i++)
      dispatch(r, &ev[i]);
    round_end(r);
    sweep(r, &swept);
    free_grave(r);
    pool_trim(r, 0);
  }
  if (atomic_load(&r->quiesce))
    drain_replies(r);
  while (r->conns)
    conn_close(r->conns);
  free_grave(r);
  pool_trim(r, 1);
  return NULL;
}

/* ---- start and stop ---- */

static kc_err bind_listen(kcd_resp *r, const char *host, unsigned port,
                          char *err) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE},
                  *res = NULL;
  char ps[16];
  snprintf(ps, sizeof ps, "%u", port);
  int rc = getaddrinfo(host, ps, &hints, &res);
  if (rc)
    return kc_errf(err, KC_IO, "--resp-listen %s: %s", host, gai_strerror(rc));
  r->lfd = socket(res->ai_family,
                  res->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  if (r->lfd >= 0)
    setsockopt(r->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (r->lfd < 0 || bind(r->lfd, res->ai_addr, res->ai_addrlen) ||
      listen(r->lfd, 511)) {
    kc_err e = kc_errf(err, KC_IO, "--resp-listen %s:%u: %s", host, port,
                       strerror(errno));
    freeaddrinfo(res);
    return e;
  }
  freeaddrinfo(res);
  struct sockaddr_storage sa;
  socklen_t sl = sizeof sa;
  getsockname(r->lfd, (struct sockaddr *)&sa, &sl);
  r->port = sa.ss_family == AF_INET6
                ? ntohs(((struct sockaddr_in6 *)&sa)->sin6_port)
                : ntohs(((struct sockaddr_in *)&sa)->sin_port);
  return KC_OK;
}

static int watch(kcd_resp *r, int fd, void *tag) {
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = tag};
  return epoll_ctl(r->ep, EPOLL_CTL_ADD, fd, &ev);
}

static kcd_resp *resp_new(kcd_state *st) {
  kcd_resp *r = calloc(1, sizeof *r);
  if (!r)
    return NULL;
  r->st = st;
  r->lfd = r->efd = r->ep = -1;
  r->outbud.limit = (size_t)st->cfg.resp_output_total;
  pthread_mutex_init(&r->qlock, NULL);
  pthread_cond_init(&r->qcond, NULL);
  pthread_mutex_init(&r->dlock, NULL);
  r->status = (kcd_status){.self = r,
                           .metrics = kcd_resp_metrics_render,
                           .stats = kcd_resp_stats,
                           .history = kcd_resp_history};
  return r;
}

kc_err kcd_resp_start(kcd_state *st, unsigned *port, char *err) {
  kcd_resp *r = resp_new(st);
  if (!r)
    return kc_errf(err, KC_NOMEM, "out of memory");
  st->resp = r;
  kcd_status_register(st, KCD_FE_RESP, &r->status);
  kc_err e = kcd_resp_tls_init(r, err);
  if (!e)
    e = bind_listen(r, st->cfg.resp_host, st->cfg.resp_port, err);
  if (e)
    return e;
  r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  r->ep = epoll_create1(EPOLL_CLOEXEC);
  if (r->efd < 0 || r->ep < 0 || watch(r, r->lfd, &r->lfd) ||
      watch(r, r->efd, &r->efd))
    return kc_errf(err, KC_IO, "RESP listener: %s", strerror(errno));
  if (kcd_resp_commit_start(r) || kcd_resp_fetch_start(r))
    return kc_errf(err, KC_NOMEM, "RESP committer thread: cannot start");
  if (pthread_create(&r->io, NULL, io_main, r))
    return kc_errf(err, KC_NOMEM, "RESP listener thread: cannot start");
  r->io_started = 1;
  *port = r->port;
  return KC_OK;
}

void kcd_resp_quiesce(kcd_state *st) {
  kcd_resp *r = st->resp;
  if (!r)
    return;
  r->drain_until_ms = kc_clock_mono_ms() + (int64_t)st->cfg.shutdown_s * 1000;
  atomic_store(&r->quiesce, 1);
  uint64_t one = 1; /* wakes the listener (on_done finds no job) */
  ssize_t n = write(r->efd, &one, sizeof one);
  (void)n;
}

/* After both threads are gone: jobs the committer finished for
 * connections that closed meanwhile. */
static void drain_done(kcd_resp *r) {
  kcd_resp_job *j = r->dhead;
  r->dhead = r->dtail = NULL;
  while (j) {
    kcd_resp_job *next = j->next;
    kcd_resp_conn *c = j->conn;
    kcd_resp_job_free(j);
    conn_free(c);
    kcd_svc_end(r->st, KCD_FE_RESP);
    j = next;
  }
}

void kcd_resp_stop(kcd_state *st) {
  kcd_resp *r = st->resp;
  if (!r)
    return;
  st->resp = NULL;
  kcd_status_unregister(st, KCD_FE_RESP);
  atomic_store(&r->stop, 1);
  if (r->io_started)
    pthread_join(r->io, NULL);
  kcd_resp_commit_stop(r); /* applies what was queued, then ends */
  kcd_resp_fetch_stop(r);
  drain_done(r);
  if (r->lfd >= 0)
    close(r->lfd);
  if (r->efd >= 0)
    close(r->efd);
  if (r->ep >= 0)
    close(r->ep);
  pthread_mutex_destroy(&r->qlock);
  pthread_cond_destroy(&r->qcond);
  pthread_mutex_destroy(&r->dlock);
  kcd_resp_tls_free(r);
  kcd_resp_admit_free(r);
  free(r);
}
