/* resp.h: kcached's Redis protocol listener (RESP2, and RESP3 after
 * HELLO 3; TLS with --tls-cert unless --resp-tls off), internal to server/.
 *
 * Parts:
 *   resp_proto.c  the parser (multibulk and inline commands, incremental,
 *                 Redis's protocol error texts) and the reply writers; pure,
 *                 no I/O, fuzzed by tests/fuzz/fuzz_resp.c
 *   resp.c        the listener: one epoll thread, nonblocking sockets,
 *                 pipelining (every complete command of a read is run, the
 *                 replies go out in one write), output bound per connection
 *   resp_tls.c    TLS (OpenSSL, independent of the HTTP side's GnuTLS):
 *                 the SSL_CTX, nonblocking reads and writes for resp.c
 *   resp_family.c hits and misses per key family, for /metrics and
 *                 /v1/stats
 *   resp_commit.c the committer thread: the group commit of writes
 *   resp_job.c    a job's life: made, filled, handed to the committer and
 *                 back, answered, freed
 *   resp_cmd.c    the command table, arity, auth and role checks, MULTI;
 *                 Redis's error replies (a store error's), expire arithmetic
 *   resp_kv.c     the string commands (GET/SET family, TTL, EXISTS, ...)
 *   resp_keys.c   EXPIRE and kin, SCAN, KEYS; the replies of committed writes
 *   resp_admin.c  connection and server commands (HELLO, AUTH, CONFIG, ...)
 *   resp_info.c   INFO, and the kcached_resp_* metrics of /metrics
 *   resp_fetch.c  read-through from the durable tier (fetcher threads)
 *   resp_admit.c  admission (--resp-max-connections, per address), the
 *                 cross-protocol guard (HTTP sent to the RESP port)
 *
 * Threads: a connection belongs to the listener thread. Its writes go to the
 * committer as a job (kcd_resp_job): the committer applies the ops of every
 * job waiting in ONE kc_store_kv_apply (one LMDB write transaction, synced),
 * then hands the jobs back to the listener, which writes the replies. A
 * connection with a job in flight reads nothing more and runs nothing more
 * (its input buffer, which the ops point into, stays put), so its replies
 * keep the order of its commands and a read after a write sees the write.
 *
 * Reads run on the listener thread in one LMDB read transaction per batch of
 * commands; a value is copied into the output buffer, so no read transaction
 * is held while a slow client drains its output. A connection runs no more
 * commands while more than KCD_RESP_OUT_HIGH bytes wait to be sent: its
 * memory is bounded by that plus one reply. A reply may not take the
 * connection's unsent bytes past --resp-output-limit, nor every
 * connection's reply buffers together past --resp-output-total: such a
 * reply is answered an error instead (kcd_resp_buf's limit and budget).
 */
#ifndef KCD_RESP_H
#define KCD_RESP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kcd.h"

typedef struct kcd_resp kcd_resp;
typedef struct kcd_resp_families kcd_resp_families;

#define KCD_RESP_MAX_ARGS 65536         /* arguments of one command */
#define KCD_RESP_ARGS_KEEP 1024         /* argument tables above: freed after */
#define KCD_RESP_TRIM_MS 2000           /* idle this long: buffers freed */
#define KCD_RESP_INLINE_MAX (64 * 1024) /* an inline command, a count line */
#define KCD_RESP_OUT_HIGH (1024 * 1024) /* stop running commands above */
/* GET values of at least KCD_RESP_REF_MIN bytes go out by writev from the
 * map, at most KCD_RESP_REFS per batch (kcd_resp_conn.refs) */
#define KCD_RESP_REFS 16
#define KCD_RESP_REF_MIN 2048
#define KCD_RESP_KEYS_MAX 100000        /* KEYS returns at most this many */
#define KCD_RESP_JOB_OPS 10000          /* a pipeline's writes per job */
#define KCD_RESP_JOB_BYTES (64u << 20)  /* and their value bytes */
#define KCD_RESP_N_CMDS 64              /* room in the metrics per command */
#define KCD_RESP_FETCHERS 4             /* read-through threads (S3 tier) */
#define KCD_RESP_TLS_HS_MS 10000        /* a TLS handshake's time limit */
#define KCD_RESP_FAMILIES 32            /* key families counted by name */
#define KCD_RESP_FAMILY_MAX 48          /* longest family name counted */
#define KCD_RESP_BATCH_BUCKETS 14       /* the commit batch size histogram */
#define KCD_RESP_POOL_N 8               /* big input buffers kept (resp.c) */
#define KCD_RESP_POOL_BYTES (32u << 20) /* their capacity in all */
#define KCD_RESP_POOL_IDLE_MS 2000      /* freed after this without a taker */

/* ---- key families (resp_family.c) ----
 * A key's family is its prefix before the first ':' ("pt2:..." -> "pt2");
 * the first KCD_RESP_FAMILIES names seen get their own counters, every
 * other key (no ':', too long, unprintable, or past the table) counts as
 * "other". Lock-free: a slot is claimed with a CAS, then published. */
typedef struct kcd_resp_family {
  _Atomic int state; /* 0 free, 1 being filled, 2 ready */
  size_t len;
  char name[KCD_RESP_FAMILY_MAX];
  _Atomic uint64_t hits, misses;
} kcd_resp_family;

struct kcd_resp_families {
  kcd_resp_family f[KCD_RESP_FAMILIES];
  _Atomic uint64_t other_hits, other_misses;
};

/* Counts one read of key (hit or miss) under its family. */
void kcd_resp_family_count(kcd_resp_families *t, const void *key, size_t klen,
                           int hit);
/* Calls fn for every family ready (then "other" with name NULL). */
void kcd_resp_family_each(kcd_resp_families *t,
                          void (*fn)(const char *name, size_t len,
                                     uint64_t hits, uint64_t misses, void *ud),
                          void *ud);

/* ---- buffers and replies (resp_proto.c) ---- */

/* Bytes that many buffers share (the reply buffers of every connection,
 * --resp-output-total): the sum of their capacities beyond the first
 * KCD_RESP_BUDGET_FREE bytes of each stays <= limit. Listener thread only. */
#define KCD_RESP_BUDGET_FREE (16u * 1024)
typedef struct kcd_resp_budget {
  size_t used, limit;
} kcd_resp_budget;

/* A growable byte buffer; after a failed allocation oom is set and every
 * later append is dropped (the connection is then closed). With a limit
 * (0: none) len may not pass it, and with a budget its capacity counts
 * there: a growth past either sets over instead (and drops appends too);
 * the caller that sees over takes its reply back and answers an error
 * (resp_cmd.c), or closes the connection. */
typedef struct kcd_resp_buf {
  char *p;
  size_t len, cap;
  int oom;
  int over;
  size_t limit;
  kcd_resp_budget *bud;
} kcd_resp_buf;

/* Room for `more` bytes after len; -1 (and oom or over) when it cannot. */
int kcd_resp_buf_reserve(kcd_resp_buf *b, size_t more);
void kcd_resp_buf_add(kcd_resp_buf *b, const void *p, size_t n);
/* Frees the memory; limit and budget stay. */
void kcd_resp_buf_free(kcd_resp_buf *b);

void kcd_resp_simple(kcd_resp_buf *b, const char *s); /* +s */
void kcd_resp_error(kcd_resp_buf *b, const char *s);  /* -s (CR/LF -> ' ') */
void kcd_resp_errorf(kcd_resp_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void kcd_resp_int(kcd_resp_buf *b, long long v); /* :v */
void kcd_resp_bulk(kcd_resp_buf *b, const void *p, size_t n);
void kcd_resp_bulk_str(kcd_resp_buf *b, const char *s);
void kcd_resp_null(kcd_resp_buf *b);               /* $-1 */
void kcd_resp_array(kcd_resp_buf *b, long long n); /* *n */
/* The replies that differ in RESP3 (resp3: the connection said HELLO 3). */
void kcd_resp_nil(kcd_resp_buf *b, int resp3);              /* $-1 or _ */
void kcd_resp_map(kcd_resp_buf *b, long long n, int resp3); /* *2n or %n */
/* A text reply: bulk in RESP2, a verbatim string (=, "txt:") in RESP3. */
void kcd_resp_verbatim(kcd_resp_buf *b, const void *p, size_t n, int resp3);

/* ---- the parser (resp_proto.c) ---- */

typedef struct kcd_resp_arg {
  size_t off, len; /* bytes of the input buffer */
} kcd_resp_arg;

typedef struct kcd_resp_parser {
  uint64_t max_bulk; /* longest argument (--resp-max-value) */
  size_t max_args;   /* most arguments of one command */
  int unauth;        /* Redis's limits for clients yet to authenticate */
  size_t pos;        /* where parsing goes on in the buffer */
  size_t start;      /* where the multibulk command being read began */
  int inmb;          /* inside a multibulk command */
  long long nleft;   /* its arguments still to come */
  long long bulk;    /* the next argument's length; -1: its $ line next */
  kcd_resp_arg *argv;
  size_t argc, argcap;
  int inl;           /* the last command returned was inline */
  const char *error; /* KCD_RESP_ERR: the text after "-ERR " */
  char errbuf[64];
} kcd_resp_parser;

typedef enum kcd_resp_res {
  KCD_RESP_MORE, /* no complete command yet: read more */
  KCD_RESP_CMD,  /* argv[0..argc) is one command; pos is past it */
  KCD_RESP_ERR,  /* a protocol error: reply error, then close */
  KCD_RESP_NOMEM
} kcd_resp_res;

void kcd_resp_parser_init(kcd_resp_parser *p, uint64_t max_bulk,
                          size_t max_args);
void kcd_resp_parser_free(kcd_resp_parser *p);
/* Parses the next command of buf[0..len) from p->pos. Inline commands are
 * unquoted in place (buf is written). Empty commands are skipped. */
kcd_resp_res kcd_resp_parse(kcd_resp_parser *p, char *buf, size_t len);
/* Bytes at the start of the buffer no longer needed: before the command
 * being read (its arguments are offsets into it), else before pos. */
size_t kcd_resp_parser_done(const kcd_resp_parser *p);
/* The first n bytes (n <= kcd_resp_parser_done) were dropped. */
void kcd_resp_parser_shift(kcd_resp_parser *p, size_t n);
/* Bytes the parser still needs before it can return a command, when it
 * knows (a bulk being read); 0 when it does not. A read-size hint only. */
size_t kcd_resp_parser_want(const kcd_resp_parser *p, size_t len);

/* ---- the cross-protocol guard (resp_admit.c) ---- */

typedef enum kcd_resp_sniff_res {
  KCD_SNIFF_MORE, /* cannot tell yet */
  KCD_SNIFF_OK,   /* a RESP array, or a line that may be an inline command */
  KCD_SNIFF_BAD   /* neither (binary, a TLS hello, a JSON body): refuse */
} kcd_resp_sniff_res;

/* Judges the first bytes of a connection: after blank lines, '*', or a
 * line of printable ASCII that begins with a letter (command names are
 * letters). A line longer than KCD_RESP_INLINE_MAX is left to the parser. */
kcd_resp_sniff_res kcd_resp_sniff(const char *buf, size_t len);
/* 1 when a parsed command is what an HTTP client sends: a first word POST
 * or Host: (any framing, as Redis checks), or an inline line whose last
 * word begins with "HTTP/" (a request line: GET / HTTP/1.1). */
int kcd_resp_is_http(const char *const *argv, const size_t *lens, size_t argc,
                     int inl);

/* ---- connections (resp.c), jobs (resp_job.c) ---- */

/* Why a connection was refused or closed by a rule (metrics). */
typedef enum kcd_resp_why {
  KCD_WHY_MAX_CONNS, /* --resp-max-connections */
  KCD_WHY_PER_IP,    /* --resp-max-connections-per-ip */
  KCD_WHY_HTTP,      /* an HTTP request (cross-protocol) */
  KCD_WHY_NOT_RESP,  /* first bytes neither RESP nor inline */
  KCD_WHY_REVOKED,   /* its token was removed or changed */
  KCD_WHY_IDLE,      /* --resp-timeout */
  KCD_WHY_STALLED,   /* --resp-output-stall */
  KCD_WHY_OUTPUT,    /* a reply over the output budget */
  KCD_WHY_N
} kcd_resp_why;
extern const char *const kcd_resp_why_names[KCD_WHY_N];

typedef struct kcd_resp_conn kcd_resp_conn;

/* How the replies of a job's write item are written once it is applied. */
typedef enum kcd_resp_rk {
  KCD_RK_PRE,     /* bytes of job->pre */
  KCD_RK_OK,      /* +OK (MSET, FLUSHDB) */
  KCD_RK_SET,     /* +OK, or a null when NX/XX refused */
  KCD_RK_SET_GET, /* the old value, or a null */
  KCD_RK_SUM,     /* :sum of done (DEL, EXPIRE, PERSIST, SETNX) */
} kcd_resp_rk;

typedef struct kcd_resp_item {
  kcd_resp_rk kind;
  size_t first, n; /* ops, or the byte range of pre */
  int resp3;       /* the connection's protocol when the command ran */
  unsigned cmd;    /* 1 + the command's index: count its result when the
                      reply is written (0: counted already) */
} kcd_resp_item;

typedef struct kcd_resp_job {
  kcd_resp_conn *conn;
  kc_store_kv_op *ops;
  size_t nops, capops;
  uint64_t val_bytes;
  kcd_resp_item *items;
  size_t nitems, capitems;
  kcd_resp_buf pre; /* replies decided before the commit */
  char **owned;     /* MULTI's copies of arguments, freed with the job */
  size_t nowned;
  int fetch;  /* a read-through: ops name keys to fetch from S3 */
  kc_err err; /* the whole apply failed */
  char errmsg[KC_ERRBUF_SIZE];
  struct kcd_resp_job *next;
} kcd_resp_job;

kcd_resp_job *kcd_resp_job_new(kcd_resp_conn *c);
void kcd_resp_job_free(kcd_resp_job *j);
/* A new op (zeroed but for op, key), NULL on out of memory. */
kc_store_kv_op *kcd_resp_job_op(kcd_resp_job *j, kc_store_kv_opcode op,
                                const void *key, size_t klen);
/* Appends an item for ops [first, nops) or pre [first, pre.len). */
int kcd_resp_job_item(kcd_resp_job *j, kcd_resp_rk kind, size_t first);
/* Writes every item's reply into out, freeing old values. */
void kcd_resp_job_reply(kcd_resp_job *j, kcd_resp_buf *out);

/* A MULTI's queued command: its own copy of the arguments. */
typedef struct kcd_resp_queued {
  size_t argc;
  char **argv;
  size_t *lens;
} kcd_resp_queued;

/* out's bytes [off, off + len) are a value's, not copied there yet: the
 * write takes them from p, in the round's read (resp.c, conn_flush) */
typedef struct kcd_resp_ref {
  size_t off, len;
  const void *p;
} kcd_resp_ref;

struct kcd_resp_conn {
  kcd_resp *srv;
  int fd;
  uint64_t id;
  int resp3;        /* HELLO 3 said: RESP3 replies */
  unsigned cur_cmd; /* 1 + the index of the command being dispatched */
  /* TLS (resp_tls.c): NULL without --tls-cert */
  void *ssl;           /* SSL * */
  int64_t accepted_ms; /* the handshake must end within KCD_RESP_TLS_HS_MS */
  int tls_rd_want_wr, tls_wr_want_rd; /* a read waits to write, and back */
  kcd_resp_buf in, out;
  size_t out_off;                   /* bytes of out already sent */
  kcd_resp_ref refs[KCD_RESP_REFS]; /* only from process() to conn_flush */
  size_t nrefs;
  kcd_resp_parser parser;
  unsigned events; /* epoll interest now */
  int sniffed;     /* the first bytes were judged (kcd_resp_sniff) */
  int64_t io_ms;   /* last byte read or sent (--resp-timeout) */
  int64_t sent_ms; /* last byte sent, or when output began to wait */
  /* the peer (--resp-max-connections-per-ip, logs) */
  unsigned char addr[16]; /* IPv6, or IPv4 mapped */
  char remote[48];
  int counted; /* holds a slot of its address */
  /* who */
  int authed;
  kcd_role role;
  char user[KCD_NAME_MAX];
  /* the token AUTH took its role from: after a SIGHUP changed the table
   * (auth_gen moved) it must still grant that role, or the connection is
   * closed */
  int tok_set;
  unsigned char tok_digest[32];
  uint64_t auth_gen;
  char *name; /* CLIENT SETNAME */
  /* MULTI */
  int in_multi, multi_dirty;
  kcd_resp_queued *queue;
  size_t nqueue, capqueue;
  /* writes */
  kcd_resp_job *job;   /* being filled (not in flight) */
  int inflight;        /* a job is with the committer */
  int held;            /* parser's argv is a command to run after it */
  kcd_resp_job *fetch; /* keys the command being run wants read through */
  int fetched;         /* the held command ran its read-through: no more */
  int closing;         /* close once out is sent */
  int eof;             /* the peer sent EOF: answer what came, then close */
  int backlog;         /* process() stopped at KCD_RESP_OUT_HIGH: complete
                          commands may wait in the input buffer */
  int dead;            /* the socket is gone: free when the job returns */
  kc_store_read *rd;   /* the round's read (kcd_resp.rd), lent to a batch */
  const char **av;     /* the parsed command as pointers, for the ctx */
  size_t *al, avcap;
  struct kcd_resp_conn *prev, *next;
};

/* The listener (resp.c) and its committer (resp_commit.c). */

struct kcd_resp {
  kcd_state *st;
  int lfd, efd, ep; /* listening socket, eventfd, epoll */
  unsigned port;
  pthread_t io, committer;
  int io_started, committer_started;
  _Atomic int stop;
  _Atomic int quiesce;    /* graceful shutdown: stop accepting (resp.c) */
  int64_t drain_until_ms; /* set before quiesce: kcd_resp_stop's last sends
                             end by then (resp.c, drain_replies) */
  uint64_t next_id;
  _Atomic size_t nconns;
  _Atomic uint64_t conns_total, commands_total, commits, committed_ops;
  _Atomic uint64_t commit_errors, bytes_in, bytes_out, tls_failed;
  /* connections refused or closed by a rule, by reason (kcd_resp_why) */
  _Atomic uint64_t refused[KCD_WHY_N];
  kcd_resp_budget outbud;   /* every connection's reply buffer */
  kcd_addrs *addrs;         /* per address (resp_admit.c); NULL until
                               the first connection counted */
  int trim;                 /* big tables were freed: trim the heap */
  int64_t attack_logged_ms; /* the cross-protocol log line, at most 1/s */
  uint64_t attack_unlogged;
  /* ops per commit: counts per bucket (kcd_resp_batch_le), sum in ops */
  _Atomic uint64_t batch_bucket[KCD_RESP_BATCH_BUCKETS + 1], batch_sum;
  kcd_resp_families families;
  kcd_status status; /* registered with the core */
  void *tls_ctx;     /* SSL_CTX *, NULL without --tls-cert */
  /* per command of the table (the last: unknown), replies ok / error */
  _Atomic uint64_t cmd_ok[KCD_RESP_N_CMDS + 1], cmd_err[KCD_RESP_N_CMDS + 1];
  kcd_resp_conn *conns; /* listener thread only */
  kcd_resp_conn *grave; /* closed, freed after this round of events */
  kc_store_read *rd;    /* this round's read, lent to each batch (c->rd) */
  /* input buffers of big values, kept for the next one (resp.c; listener
   * thread only): at most KCD_RESP_POOL_N, KCD_RESP_POOL_BYTES in all,
   * freed after KCD_RESP_POOL_IDLE_MS without a taker */
  kcd_resp_buf pool[KCD_RESP_POOL_N];
  size_t npool, pool_bytes;
  int64_t pool_used_ms;
  /* jobs waiting for the committer (qcond: for the fetchers, resp_fetch.c) */
  pthread_mutex_t qlock;
  pthread_cond_t qcond;
  kcd_resp_job *qhead, *qtail;
  int qstop;
  /* the committer's own condition (resp_commit.c): a submit signals it only
   * when the committer waits for that many jobs (qwant, 0: not waiting),
   * so a gather is not woken by every job */
  pthread_cond_t ccond;
  size_t qlen, qwant;
  /* jobs committed, for the listener */
  pthread_mutex_t dlock;
  kcd_resp_job *dhead, *dtail;
  /* read-through fetches (the durable tier), for the fetcher threads */
  pthread_t fetchers[KCD_RESP_FETCHERS];
  int nfetchers;
  kcd_resp_job *fhead, *ftail;
  int fstop;
};

/* What a command handler sees. */
typedef struct kcd_resp_ctx {
  kcd_resp_conn *c;
  kcd_state *st;
  kcd_resp_buf *out; /* where replies go (conn->out, or job->pre) */
  kcd_resp_job *job; /* where write ops go; made on demand if NULL */
  int exec;          /* inside EXEC: reads use the state before it */
  int64_t now_ms;    /* wall clock, unix ms */
  size_t argc;
  const char *const *argv; /* not NUL-terminated: use lens */
  const size_t *lens;
} kcd_resp_ctx;

/* The read transaction of this batch (begun on first use); NULL with an
 * error reply written when the store is not open or LMDB refuses. */
kc_store_read *kcd_resp_read(kcd_resp_ctx *x);
/* Lends c's batch the round's read (c->rd), begun here when the round has
 * none; resp.c ends it (round_end). The error, with c->rd NULL, when LMDB
 * refuses one; no reply written. */
kc_err kcd_resp_read_lend(kcd_resp_conn *c, kc_store *s);
/* Called by a command that opens its own read of the store (SCAN, KEYS,
 * DBSIZE, INFO's counts) before it does: ends the round's read, so the
 * commands after it begin a newer one (resp.c, round_end). */
void kcd_resp_read_forward(kcd_resp_conn *c);
/* The job write ops go into (made on demand); NULL with "-OOM" written. */
kcd_resp_job *kcd_resp_job_of(kcd_resp_ctx *x);
/* The store, or NULL with "-LOADING" written. */
kc_store *kcd_resp_store(kcd_resp_ctx *x);

/* Read-through (the durable tier): with one configured, a read that misses
 * asks for the key here instead of replying: the command is run again once
 * the fetchers made it local (or found it missing). 1: asked (write no
 * reply), 0: reply the miss now (no tier, inside EXEC, or already fetched). */
int kcd_resp_fetch_key(kcd_resp_ctx *x, const void *key, size_t klen);
void kcd_resp_fetch_submit(kcd_resp *r, kcd_resp_job *j);
int kcd_resp_fetch_start(kcd_resp *r);
void kcd_resp_fetch_stop(kcd_resp *r);

/* Appends j to a job queue (head, tail), under the queue's lock: the
 * committer's, the fetchers' and the listener's (resp_job.c). */
void kcd_resp_job_append(kcd_resp_job **head, kcd_resp_job **tail,
                         kcd_resp_job *j);
/* Hands a job with ops to the committer (resp_job.c). */
void kcd_resp_commit_submit(kcd_resp *r, kcd_resp_job *j);
int kcd_resp_commit_start(kcd_resp *r);
void kcd_resp_commit_stop(kcd_resp *r);
/* The listener's side: a committed job comes back (resp_job.c; resp.c's
 * on_done takes it). */
void kcd_resp_job_done(kcd_resp *r, kcd_resp_job *j);

/* The upper bounds of the batch size histogram's buckets (the last one,
 * index KCD_RESP_BATCH_BUCKETS, is +Inf). */
extern const unsigned kcd_resp_batch_le[KCD_RESP_BATCH_BUCKETS];

/* ---- admission (resp_admit.c; listener thread) ---- */

struct sockaddr;
/* Takes a slot for a new connection from sa (its address and remote are
 * filled): KCD_WHY_N when admitted, else the cap that refused it. */
kcd_resp_why kcd_resp_admit(kcd_resp *r, kcd_resp_conn *c,
                            const struct sockaddr *sa);
/* Gives its slot back (a closed connection). */
void kcd_resp_admit_release(kcd_resp *r, kcd_resp_conn *c);
void kcd_resp_admit_free(kcd_resp *r);
/* Counts a connection closed by a rule; the cross-protocol ones are also
 * logged (at most a line a second, with how many were not). */
void kcd_resp_refuse(kcd_resp_conn *c, kcd_resp_why why);

/* ---- TLS (resp_tls.c) ---- */

/* The SSL_CTX from the PEM texts kcached read at start (st->tls_*_pem). */
kc_err kcd_resp_tls_init(kcd_resp *r, char *err);
void kcd_resp_tls_free(kcd_resp *r);
/* A new connection's SSL object (server side); -1 when it cannot be made. */
int kcd_resp_tls_accept(kcd_resp_conn *c);
void kcd_resp_tls_close(kcd_resp_conn *c);
/* read(2)/write(2) through TLS: >0 bytes, 0 the peer closed, -1 with errno
 * EAGAIN (the tls_*_want_* flags say which way it waits) or another error
 * (the handshake failed: a plaintext client, a bad certificate). */
ssize_t kcd_resp_tls_read(kcd_resp_conn *c, void *buf, size_t n);
ssize_t kcd_resp_tls_write(kcd_resp_conn *c, const void *buf, size_t n);
/* Decrypted bytes OpenSSL holds that the socket no longer signals. */
size_t kcd_resp_tls_pending(kcd_resp_conn *c);
/* 1 while the handshake is not done. */
int kcd_resp_tls_in_handshake(kcd_resp_conn *c);

/* ---- commands (resp_cmd.c, resp_kv.c, resp_admin.c) ---- */

typedef void (*kcd_resp_fn)(kcd_resp_ctx *x);

/* A handler's argument i as (pointer, length), for the calls that take
 * both. */
#define ARG(i) x->argv[i], x->lens[i]

#define KCD_CF_WRITE 1   /* adds write ops (joins the pipeline's job) */
#define KCD_CF_NOSTORE 2 /* touches no store: may run while a job is open */
#define KCD_CF_NOAUTH 4  /* allowed before AUTH (AUTH, HELLO, QUIT) */
#define KCD_CF_NOMULTI 8 /* runs at once inside MULTI (EXEC, DISCARD, ...) */

typedef struct kcd_resp_cmd {
  const char *name; /* lowercase */
  int arity;        /* > 0 exactly, < 0 at least -arity (with the name) */
  int flags;
  kcd_role role;
  kcd_resp_fn fn;
} kcd_resp_cmd;

/* The command named by argv[0], NULL if none. */
const kcd_resp_cmd *kcd_resp_cmd_find(const char *name, size_t len);
size_t kcd_resp_cmd_count(void);
/* Frees a MULTI's queued commands. */
void kcd_resp_queue_free(kcd_resp_conn *c);
/* Runs one command (checks, MULTI queueing, dispatch). */
void kcd_resp_dispatch(kcd_resp_ctx *x);
/* Redis's "unknown command" and arity errors, NOAUTH and NOPERM. */
void kcd_resp_err_unknown(kcd_resp_ctx *x);
void kcd_resp_err_arity(kcd_resp_buf *b, const char *name);
void kcd_resp_err_syntax(kcd_resp_buf *b);
void kcd_resp_err_int(kcd_resp_buf *b);
/* An integer argument (Redis's string2ll: no spaces, no '+'). */
int kcd_resp_ll(const char *s, size_t n, long long *out);
/* Case-insensitive equality of an argument with a word. */
int kcd_resp_is(const char *s, size_t n, const char *word);

/* The reply of a store error (-OOM when full, -LOADING when not open). */
void kcd_resp_store_err(kcd_resp_buf *b, kc_err e, const char *msg);
/* Redis's expire arithmetic: argv[i] in seconds (secs) or ms, plus base
 * (now for relative times, 0 for absolute), to absolute ms; positive: it
 * must be > 0 (SET, SETEX). -1 with the error reply written. */
int kcd_resp_expire_at(kcd_resp_ctx *x, size_t i, int secs, int64_t base,
                       int positive, const char *cmd, int64_t *out);

/* handlers */
void kcd_resp_c_get(kcd_resp_ctx *x);
void kcd_resp_c_mget(kcd_resp_ctx *x);
void kcd_resp_c_set(kcd_resp_ctx *x);
void kcd_resp_c_setex(kcd_resp_ctx *x);
void kcd_resp_c_psetex(kcd_resp_ctx *x);
void kcd_resp_c_setnx(kcd_resp_ctx *x);
void kcd_resp_c_mset(kcd_resp_ctx *x);
void kcd_resp_c_exists(kcd_resp_ctx *x);
void kcd_resp_c_del(kcd_resp_ctx *x);
void kcd_resp_c_ttl(kcd_resp_ctx *x);
void kcd_resp_c_pttl(kcd_resp_ctx *x);
void kcd_resp_c_expire(kcd_resp_ctx *x);
void kcd_resp_c_pexpire(kcd_resp_ctx *x);
void kcd_resp_c_expireat(kcd_resp_ctx *x);
void kcd_resp_c_pexpireat(kcd_resp_ctx *x);
void kcd_resp_c_persist(kcd_resp_ctx *x);
void kcd_resp_c_type(kcd_resp_ctx *x);
void kcd_resp_c_strlen(kcd_resp_ctx *x);
void kcd_resp_c_scan(kcd_resp_ctx *x);
void kcd_resp_c_keys(kcd_resp_ctx *x);
void kcd_resp_c_dbsize(kcd_resp_ctx *x);
void kcd_resp_c_flush(kcd_resp_ctx *x);
void kcd_resp_c_ping(kcd_resp_ctx *x);
void kcd_resp_c_echo(kcd_resp_ctx *x);
void kcd_resp_c_quit(kcd_resp_ctx *x);
void kcd_resp_c_hello(kcd_resp_ctx *x);
void kcd_resp_c_auth(kcd_resp_ctx *x);
void kcd_resp_c_select(kcd_resp_ctx *x);
void kcd_resp_c_client(kcd_resp_ctx *x);
void kcd_resp_c_command(kcd_resp_ctx *x);
void kcd_resp_c_config(kcd_resp_ctx *x);
void kcd_resp_c_info(kcd_resp_ctx *x);
void kcd_resp_c_multi(kcd_resp_ctx *x);
void kcd_resp_c_exec(kcd_resp_ctx *x);
void kcd_resp_c_discard(kcd_resp_ctx *x);

/* The command at index i of the table (metrics); NULL past the end. */
const kcd_resp_cmd *kcd_resp_cmd_at(size_t i);

/* ---- the listener (resp.c), for main.c and the handlers ---- */

/* kcd_resp_start, kcd_resp_quiesce and kcd_resp_stop: kcd.h (main.c's). */
uint64_t kcd_resp_port(kcd_resp *r);
/* Connections open. */
size_t kcd_resp_clients(kcd_resp *r);

/* ---- RESP's status table for the core (resp_info.c; self: the
 * kcd_resp) ---- */

/* The kcached_resp_* metrics (Prometheus text) appended to f. */
void kcd_resp_metrics_render(void *self, void *f);
/* /v1/stats: "resp_clients" and "resp_families" (the GET/MGET reads per
 * key family) set on o, a jansson object. */
void kcd_resp_stats(void *self, void *o);
/* The history's KCD_H_RESP: commands run since start. */
void kcd_resp_history(void *self, uint64_t v[KCD_H_N]);

#endif
