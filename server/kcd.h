/* kcd.h: kcached's core, what both front ends (HTTP: http.h, RESP: resp.h)
 * stand on: the configuration, the daemon state (one struct, passed to
 * every handler), tokens, leases, the counters of the operations, the
 * service layer, the log, the durable tier's settings, the history, the
 * front ends' status tables, and each front end's face for main.c. One
 * section per .c file.
 *
 * The layers, nginx's way: main.c -> a front end (http.h: http.c, routes,
 * replies, connections, framing; resp.h: the Redis protocol) -> the core
 * (the service layer, service.c, and the rest of this header) -> the store.
 * A front end includes this header and its own, never the other's; the core
 * includes neither, and reads a front end only through the status table it
 * registers (kcd_status: /metrics, /v1/stats, the history).
 * scripts/check_layers.py checks the rule (ctest layers).
 *
 * Threads: the state is shared by every libmicrohttpd worker thread, the
 * RESP threads and the main thread; its parts are either immutable after
 * start (cfg), atomic (metrics, store pointer) or lock their own data
 * (auth, leases). */
#ifndef KCD_H
#define KCD_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kc_error.h"
#include "kc_schema.h"
#include "kc_store.h"

typedef struct kcd_state kcd_state;

/* ---- roles and tokens (auth.c) ---- */

typedef enum kcd_role {
  KCD_ROLE_NONE = 0, /* anonymous */
  KCD_ROLE_READ = 1,
  KCD_ROLE_WRITE = 2, /* implies read */
  KCD_ROLE_ADMIN = 3  /* implies write and read */
} kcd_role;

#define KCD_NAME_MAX 64 /* token names, bytes with the NUL */

typedef struct kcd_token {
  kcd_role role;
  char name[KCD_NAME_MAX];
  unsigned char digest[32]; /* SHA-256 of the token */
} kcd_token;

/* The token table. enabled == 0: no token file, every request is admin. */
typedef struct kcd_auth {
  pthread_rwlock_t lock;
  int enabled;
  kcd_token *tokens;
  size_t n;
  _Atomic uint64_t gen; /* +1 at every table swapped in (SIGHUP) */
} kcd_auth;

/* Outcome of checking a token. */
typedef enum kcd_authn {
  KCD_AUTHN_ANON, /* none offered (role NONE) */
  KCD_AUTHN_OK,   /* a known token: role and name filled */
  KCD_AUTHN_BAD   /* one that names no token (HTTP: or a malformed header) */
} kcd_authn;

int kcd_auth_init(kcd_auth *a);
void kcd_auth_destroy(kcd_auth *a);
/* Reads a token file and swaps it in; on error the old table stays and err
 * says which line is wrong. path NULL: auth disabled. Refused as well: a
 * token hash on two lines (err names both), and a file with no token while
 * the table holds some (a rewrite caught half-way; an empty file at start
 * is loaded, main.c warns). */
kc_err kcd_auth_load(kcd_auth *a, const char *path, char *err);
/* Checks a token in constant time per entry (the front end took it from
 * its framing: HTTP's Bearer header, RESP's AUTH [name] token); with
 * want_name the token must also be that name's. token NULL: none offered,
 * KCD_AUTHN_ANON; an empty one: KCD_AUTHN_BAD. Tokens off: KCD_AUTHN_OK,
 * admin, whatever is offered. Front ends call it through kcd_svc_auth. */
kcd_authn kcd_auth_check_token(kcd_auth *a, const char *want_name,
                               const void *token, size_t len, kcd_role *role,
                               char name[KCD_NAME_MAX]);
int kcd_auth_enabled(kcd_auth *a);
size_t kcd_auth_count(kcd_auth *a);
/* The table's generation: it moves whenever a load swapped a table in.
 * Front ends that keep a role for a whole connection (RESP) compare it to
 * see whether their token must be checked again. */
uint64_t kcd_auth_gen(kcd_auth *a);
/* SHA-256 of a token, as the table keeps it. */
void kcd_auth_digest(const void *token, size_t len, unsigned char out[32]);
/* 1 when the table holds a token of this digest, under this name and role
 * (the token still grants what it granted); 0 once it was removed or
 * changed. */
int kcd_auth_holds(kcd_auth *a, const unsigned char digest[32],
                   const char *name, kcd_role role);
/* "read" / "write" / "admin" / "none" and back (-1: unknown). */
const char *kcd_role_name(kcd_role r);
int kcd_role_parse(const char *s, kcd_role *out);
/* `kcached token ROLE NAME`: prints a new token and its file line; exit code.
 */
int kcd_token_command(int argc, char **argv);

/* ---- leases (lease.c) ---- */

typedef struct kcd_leases kcd_leases;

#define KCD_LEASE_TOKEN_LEN 32 /* hex digits of a lease token */
#define KCD_HOLDER_MAX 128     /* holder names, bytes without the NUL */

typedef struct kcd_lease_info {
  char token[KCD_LEASE_TOKEN_LEN + 1]; /* granted: the new token; refused:
                                          the holder's (for the S3 tier's
                                          check; never sent) */
  char holder[KCD_HOLDER_MAX + 1];     /* refused: who holds it */
  uint64_t remaining_ms;               /* until expiry */
} kcd_lease_info;

/* max: most leases held at once (KC_BUSY beyond). NULL on out of memory. */
kcd_leases *kcd_leases_new(size_t max);
void kcd_leases_free(kcd_leases *l);
/* KC_OK granted (info->token), KC_LEASED (info->holder, remaining_ms),
 * KC_BUSY when the table is full. now_ms: a monotonic clock. */
kc_err kcd_lease_acquire(kcd_leases *l, const char *key, const char *holder,
                         uint64_t ttl_ms, uint64_t now_ms,
                         kcd_lease_info *info);
/* KC_OK released, KC_NOT_FOUND no live lease, KC_FORBIDDEN wrong token. */
kc_err kcd_lease_release(kcd_leases *l, const char *key, const char *token,
                         uint64_t now_ms);
/* Drops expired leases; returns how many are left. */
size_t kcd_lease_sweep(kcd_leases *l, uint64_t now_ms);
/* Leases held (expired ones included until the next sweep). */
size_t kcd_lease_count(kcd_leases *l);
/* 1 when key has a live lease (holder copied when not NULL), else 0. */
int kcd_lease_held(kcd_leases *l, const char *key, uint64_t now_ms,
                   char holder[KCD_HOLDER_MAX + 1]);

/* ---- metrics (metrics.c) ---- */

/* The front ends, and the operations they share: the op label of
 * kcached_ops_total (service.c counts them, metrics.c names them). */
typedef enum kcd_fe { KCD_FE_HTTP, KCD_FE_RESP, KCD_N_FE } kcd_fe;
typedef enum kcd_svc_op {
  KCD_OP_GET,    /* a blob, a bundle (HTTP), a key (RESP) */
  KCD_OP_LOOKUP, /* each key of POST /v1/lookup */
  KCD_OP_PUT,    /* a blob offered for upload */
  KCD_OP_LEASE_TAKE,
  KCD_OP_LEASE_RELEASE,
  KCD_OP_AUTH, /* a token checked (tokens on) */
  KCD_OP_SET,  /* a key written: a bundle (HTTP PUT), a key (RESP) */
  KCD_N_OPS
} kcd_svc_op;
typedef enum kcd_svc_res {
  KCD_RES_OK,
  KCD_RES_HIT,
  KCD_RES_MISS,
  KCD_RES_ERROR,
  KCD_RES_PRESENT, /* put: held already; lease_take: the bundle exists */
  KCD_RES_NEW,     /* put: the upload is taken */
  KCD_RES_REPAIR,  /* put: taken to replace a held copy that fails its hash */
  KCD_RES_GRANTED, /* lease_take */
  KCD_RES_HELD,    /* lease_take: another holder has it */
  KCD_RES_DENIED,  /* auth: no such token; lease_release: not its token */
  KCD_RES_REFUSED, /* set: NX/XX (RESP) said no */
  KCD_N_RES
} kcd_svc_res;

/* The core's counters: what the service layer counts for every front end.
 * Each front end keeps its own (http.h, resp.h) and shows them through its
 * status table (below). */
typedef struct kcd_metrics {
  /* operations begun and not answered, per front end (service.c): HTTP
   * requests, RESP commands waiting for a commit or a fetch */
  _Atomic int64_t in_flight[KCD_N_FE];
  /* kcached_ops_total{op,frontend,result} (service.c) */
  _Atomic uint64_t ops[KCD_N_OPS][KCD_N_FE][KCD_N_RES];
} kcd_metrics;

/* Prometheus text of every metric: the core's, then each front end's
 * (its status table); malloc'd, *len set. NULL: no memory. */
char *kcd_metrics_render(kcd_state *st, size_t *len);
/* The Prometheus text helpers the front ends' tables use (f: a FILE *). */
void kcd_metric_counter(void *f, const char *name, const char *help,
                        uint64_t v);
void kcd_metric_gauge(void *f, const char *name, const char *help, uint64_t v);
/* A histogram from per-bucket counts (n bounds in seconds, then +Inf). */
void kcd_metric_histogram(void *f, const char *name, const char *help,
                          const double *bounds_s, const uint64_t *counts, int n,
                          uint64_t sum_us);

/* ---- configuration (config.c) ---- */

typedef enum kcd_log_format { KCD_LOG_TEXT, KCD_LOG_JSON } kcd_log_format;

typedef struct kcd_config {
  char host[256]; /* from --listen */
  unsigned port;  /* 0: pick one */
  const char *data_dir;
  uint64_t max_bytes;      /* store limit; 0 none */
  uint64_t max_blob_bytes; /* one blob (a zstd PUT: its decompressed bytes) */
  int compress_level;      /* zstd level of blobs at rest; 0 raw */
  uint64_t max_json_bytes; /* manifests, lookups, lease requests */
  const char *tokens;      /* token file or NULL */
  unsigned threads;
  kcd_log_format log_format;
  const char *access_log; /* NULL: with the log on stderr; "off"; a file */
  const char *port_file;
  const char *tls_cert, *tls_key;
  int allow_plaintext;
  unsigned timeout_s; /* idle connection timeout */
  unsigned max_conns;
  unsigned shutdown_s;   /* grace for in-flight requests at SIGTERM */
  unsigned store_wait_s; /* retry opening the store this long at start */
  kcd_role metrics_role; /* role /metrics needs (default none) */
  kcd_role demand_role;  /* role POST /v1/demand needs (default write) */
  uint64_t lease_max_ttl_s;
  uint64_t scrub_rate; /* bytes hashed per second by the scrub; 0 off */
  /* the durable tier (s3cfg.c); endpoint NULL: none */
  const char *s3_endpoint, *s3_bucket, *s3_prefix, *s3_region;
  const char *s3_credentials; /* AWS shared-credentials file, or NULL */
  int s3_path_style;
  unsigned s3_parallel;
  /* the Redis protocol listener (resp.c); resp_port 0 with resp_on: pick */
  int resp_on;
  char resp_host[256];
  unsigned resp_port;
  uint64_t resp_max_value; /* longest RESP argument */
  kcd_role resp_anon_role; /* role before AUTH when tokens are on */
  uint64_t resp_max_bytes; /* the store's kv_max_bytes; 0 none */
  int resp_tls;            /* --resp-tls: -1 unset (on with a certificate),
                              0 plaintext RESP beside HTTPS, 1 on */
  /* slow clients and probes (conns.c, http.c) */
  unsigned header_timeout_s; /* a request's headers must be in within it */
  unsigned max_conns_per_ip; /* 0: no per-address cap */
  uint64_t min_body_rate;    /* bytes/s a body must average per --timeout */
  char health_host[256];     /* --health-listen; health_port 0 with an */
  unsigned health_port;      /* empty host: none */
  /* strict HTTP (framing.c): without --tokens, the Host names answered
   * besides loopback and --listen's (comma-separated; "*": any) */
  const char *allow_hosts;
  uint64_t max_answer_memory; /* bytes of unread answers held; 0: no cap */
  uint64_t decoded_cache;     /* --decoded-cache bytes; 0: off */
  /* RESP admission and budgets (resp.c, resp_admit.c) */
  unsigned resp_max_conns;        /* --resp-max-connections */
  unsigned resp_max_conns_per_ip; /* 0: no per-address cap */
  unsigned resp_timeout_s;        /* idle RESP connections; 0: never */
  uint64_t resp_output_limit;     /* one connection's reply bytes; 0: auto */
  uint64_t resp_output_total;     /* every RESP connection's, together */
  unsigned resp_output_stall_s;   /* unsent replies over the soft mark this
                                     long without progress: close; 0 never */
} kcd_config;

/* Parses flags over KCACHED_* environment variables over defaults. Returns 0
 * to run, -1 when --help or --version printed, 2 on a bad flag (message on
 * stderr). argv strings are borrowed: they live as long as the process. */
int kcd_config_parse(kcd_config *c, int argc, char **argv);
/* Checks combinations (loopback without tokens, TLS) and prints why not. */
int kcd_config_check(const kcd_config *c);
/* 1 if host is a loopback address (127/8, ::1, localhost). */
int kcd_host_is_loopback(const char *host);

/* ---- the daemon's state (main.c fills it) ---- */

struct kcd_state {
  kcd_config cfg;
  _Atomic(kc_store *) store; /* NULL while the store is not open */
  kcd_auth auth;
  kcd_leases *leases;
  kcd_metrics metrics;
  char *tls_cert_pem, *tls_key_pem; /* read once at start */
  int64_t started;                  /* unix seconds */
  struct kcd_logbuf *logbuf;        /* NULL: every line written at once */
  struct kcd_s3 *s3;                /* NULL: no durable tier */
  kc_store_scrub scrub; /* where the scrub goes on (main thread only) */
  int64_t scrub_credit; /* bytes it may hash now; < 0 after a big blob */
  int disk_full_logged; /* main.c: a full disk was logged (disk_watch) */
  /* each front end's own state, opaque here (http.h, resp.h); NULL while
   * it is not started (RESP: also without --resp-listen) */
  struct kcd_http *http;
  _Atomic(struct kcd_resp *) resp;
  /* what each front end shows of itself (kcd_status_register) */
  _Atomic(const struct kcd_status *) status[KCD_N_FE];
  /* LMDB's reader table (main thread only): refusals seen by the last tick,
   * whether it counts as full (logged once per change), seconds without a
   * refusal. */
  uint64_t readers_full_seen;
  int readers_full_now;
  unsigned readers_quiet_s;
  /* per-10-second counters of the last hour (history.c); NULL until the
   * first tick */
  _Atomic(struct kcd_history *) history;
};

/* The store, or NULL while it is not open: the one way to reach it. */
static inline kc_store *kcd_store(kcd_state *st) {
  return atomic_load(&st->store);
}

/* ---- the service layer (service.c) ----
 * The rules both front ends (HTTP: routes_*.c, RESP: resp_*.c) share, over
 * the daemon state and plain arguments, never a request: a handler parses,
 * calls one of these (or the store's read-through, kc_store_blob_read and
 * kin), and replies. Each counts itself in kcached_ops_total under the
 * front end it is given. Threads: any. */

/* An operation begun / answered (HTTP: a request; RESP: a command waiting
 * for a commit or a fetch); graceful shutdown waits for their sum. */
void kcd_svc_begin(kcd_state *st, kcd_fe fe);
void kcd_svc_end(kcd_state *st, kcd_fe fe);
int64_t kcd_svc_in_flight(kcd_state *st); /* every front end's */
/* Counts n operations op of fe with result res (a relaxed atomic add). */
void kcd_svc_count(kcd_state *st, kcd_svc_op op, kcd_fe fe, kcd_svc_res res,
                   uint64_t n);
/* Counts a GET's answer: KC_OK a hit (a blob held compressed too),
 * KC_NOT_FOUND a miss, anything else an error. */
void kcd_svc_count_get(kcd_state *st, kcd_fe fe, kc_err e);

/* Reads and writes with no rule beyond the store, each counted as its
 * operation, so that no handler counts for itself. A blob's and a bundle's
 * GET (kc_store_blob_read / kc_store_bundle_read, counted as get: the
 * answer's kc_err as kcd_svc_count_get reads it); a bundle's PUT
 * (kc_store_bundle_put_once, counted as set: new, present or error). */
kc_err kcd_svc_blob_read(kcd_state *st, kcd_fe fe, const char *digest,
                         kc_store_read **rd, kc_store_blob_view *v, char *err);
kc_err kcd_svc_bundle_read(kcd_state *st, kcd_fe fe, const char *key,
                           kc_store_read **rd, const char **json, size_t *len,
                           char *err);
kc_err kcd_svc_bundle_put(kcd_state *st, kcd_fe fe, const kc_manifest *m,
                          int *created, char ***missing, size_t *n_missing,
                          char *err);
/* Entry i of a many-entry read, inside rd: KC_OK a hit, KC_NOT_FOUND a miss,
 * another code stops the read (the callback words err). */
typedef kc_err (*kcd_svc_read_fn)(void *arg, kc_store_read *rd, size_t i);
/* n entries in one short read of the store, each by `each`; once all are
 * read they are counted as op (hit or miss); a stopped read counts none.
 * POST /v1/blobs/fetch's items are op get. */
kc_err kcd_svc_read_each(kcd_state *st, kcd_fe fe, kcd_svc_op op, size_t n,
                         kcd_svc_read_fn each, void *arg, char *err);
/* A miss of a key's GET offered to the durable tier: 1 when the tier takes
 * it (the command replies later, when it is run again). */
typedef int (*kcd_svc_miss_fn)(void *arg, const void *key, size_t klen);
/* A key's GET (RESP's GET and each key of MGET), counted as get: KC_OK a
 * hit; KC_NOT_FOUND a miss (a key the store cannot hold is one), not
 * counted when `tier` (may be NULL) takes it: it is counted when the
 * command runs again; rd NULL: KC_NOT_READY, an error. */
kc_err kcd_svc_kv_get(kcd_state *st, kcd_fe fe, kc_store_read *rd,
                      const void *key, size_t klen, int64_t now_ms,
                      kc_store_kv_val *v, kcd_svc_miss_fn tier, void *arg);
/* kc_store_kv_set_settled (a SET the committed state settles with no
 * commit), counted as set (present, or refused by NX/XX) when it did. */
int kcd_svc_kv_set_settled(kcd_state *st, kcd_fe fe, kc_store_read *rd,
                           kc_store_kv_op *o, int64_t now_ms);
/* The SETs among n committed ops, counted as set: new, refused (NX/XX), or
 * error (err: the commit's, or the op's own). */
void kcd_svc_kv_sets_done(kcd_state *st, kcd_fe fe, const kc_store_kv_op *ops,
                          size_t n, kc_err err);
/* POST /v1/lookup's keys: the tier's prefetch (kcd_svc_prefetch_bundles),
 * then kcd_svc_read_each as op lookup (`each` reads an unreadable bundle as
 * missing). */
kc_err kcd_svc_lookup(kcd_state *st, kcd_fe fe, const char *const *keys,
                      size_t n, kcd_svc_read_fn each, void *arg, char *err);

/* Checks a token (the front end took it from its own framing: HTTP's
 * "Bearer", RESP's AUTH). token NULL: none offered (KCD_AUTHN_ANON); an
 * empty one names no token (KCD_AUTHN_BAD); want_name non-NULL: the token
 * must be that name's. Tokens off: KCD_AUTHN_OK, admin, whatever is
 * offered. */
kcd_authn kcd_svc_auth(kcd_state *st, kcd_fe fe, const char *want_name,
                       const void *token, size_t len, kcd_role *role,
                       char name[KCD_NAME_MAX]);

/* A blob offered for upload: KCD_RES_PRESENT (held: touched for the
 * manifest to come; skip the body), KCD_RES_NEW (take the upload), or
 * KCD_RES_REPAIR (repair_asked, and the held copy fails its hash: take the
 * upload, kc_store_upload_repair, to replace it; logged). Only an offer that
 * asks for repair pays for hashing the held copy. */
kcd_svc_res kcd_svc_blob_offer(kcd_state *st, kcd_fe fe, const char *digest,
                               int repair_asked);

/* The build lease of a bundle key. *present set: the bundle exists (held,
 * or read through from the tier), no lease taken. Otherwise KC_OK granted
 * (info->token), KC_LEASED (info->holder, remaining_ms), KC_BUSY (the table
 * is full), or another error. The local lease first (single-flight in this
 * replica), then the bucket's, which every replica sees. */
kc_err kcd_svc_lease_take(kcd_state *st, kcd_fe fe, const char *key,
                          const char *holder, uint64_t ttl_s,
                          kcd_lease_info *info, int *present);
/* KC_OK released, KC_NOT_FOUND no live lease, KC_FORBIDDEN another token. A
 * lease granted through another replica is released too (the bucket's copy
 * decides). */
kc_err kcd_svc_lease_release(kcd_state *st, kcd_fe fe, const char *key,
                             const char *token);

/* Before a lookup's read: the keys the store lacks are fetched from the
 * durable tier, in parallel (nothing without one). */
void kcd_svc_prefetch_bundles(kcd_state *st, const char *const *keys, size_t n);

/* ---- connections per client address (addrs.c) ----
 * The table both front ends' per-address caps count in. Not locked: the
 * caller's lock (HTTP's conns.c) or thread (RESP's listener) owns it. */

typedef struct kcd_addrs kcd_addrs;
struct sockaddr;

kcd_addrs *kcd_addrs_new(void); /* NULL: out of memory */
void kcd_addrs_free(kcd_addrs *t);
/* A client address as 16 bytes (IPv4 as ::ffff:a.b.c.d), and as text when
 * text is not NULL; 0 when sa is not IP (key zeroed, text "-"). */
int kcd_addr_key(const struct sockaddr *sa, unsigned char key[16], char *text,
                 size_t cap);
/* Connections counted for addr. */
size_t kcd_addrs_count(kcd_addrs *t, const unsigned char addr[16]);
/* One more (0), or -1 out of memory (nothing counted); one fewer (nothing
 * when none is counted). */
int kcd_addrs_add(kcd_addrs *t, const unsigned char addr[16]);
void kcd_addrs_sub(kcd_addrs *t, const unsigned char addr[16]);

/* ---- the durable tier's settings (s3cfg.c) ---- */

/* Fills st->s3 from the --s3-* flags and the credentials (the file of
 * --s3-credentials, else AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
 * AWS_SESSION_TOKEN); 0 ok (also without --s3-endpoint), 2 with a message on
 * stderr. Secrets are never logged. */
int kcd_s3_setup(kcd_state *st);
/* The store's view of it; NULL without a tier. */
const kc_store_s3 *kcd_s3_opts(const kcd_state *st);
/* Wipes the secrets. */
void kcd_s3_free(kcd_state *st);

/* ---- log (log.c) ---- */

typedef struct kcd_logbuf kcd_logbuf; /* buffered access lines */
kcd_logbuf *kcd_logbuf_new(void);
/* Writes what is left, frees. NULL: nothing. */
void kcd_logbuf_free(kcd_logbuf *b);
/* Opens --access-log FILE (appending) for the access lines; NULL or "off":
 * nothing to open. Call once at start, after kcd_logbuf_new. */
kc_err kcd_log_access_open(kcd_state *st, char *err);
/* Writes the buffered access lines now (the maintenance tick, once a second).
 */
void kcd_log_flush(const kcd_state *st);

void kcd_log(const kcd_state *st, const char *level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void kcd_vlog(const kcd_state *st, const char *level, const char *fmt,
              va_list ap);

typedef struct kcd_access {
  const char *method, *path, *remote, *token;
  int status;
  uint64_t bytes_in, bytes_out, us;
  uint64_t now_us; /* kc_clock_mono_us() at the end, for the timestamp;
                      0: none */
} kcd_access;
void kcd_log_access(const kcd_state *st, const kcd_access *a);

/* ---- clocks (log.c; the monotonic and millisecond ones are schema's
 * kc_clock_mono_us and kc_clock_wall_ms) ---- */

int64_t kcd_unix_now(void); /* wall clock, seconds */

/* ---- the front ends, for main.c (http.c, resp.c) ---- */

/* Starts libmicrohttpd (st->http: its state, its status registered);
 * *port: the bound port. */
kc_err kcd_http_start(kcd_state *st, unsigned *port, char *err);
/* The maintenance tick: closes connections past --header-timeout. */
void kcd_http_sweep(kcd_state *st);
/* Serves no new connection (each is closed at once); in-flight requests
 * and open connections go on. */
void kcd_http_quiesce(kcd_state *st);
/* Stops the daemons and frees st->http. */
void kcd_http_stop(kcd_state *st);
/* 1 if this libmicrohttpd was built with TLS (GnuTLS). */
int kcd_tls_supported(void);

/* The Redis protocol listener (resp.c): binds --resp-listen and starts the
 * threads; *port: the bound port. */
kc_err kcd_resp_start(kcd_state *st, unsigned *port, char *err);
/* Graceful shutdown: accepts no new connection; those open go on (their
 * operations in flight end as kcd_svc_in_flight counts). NULL st->resp:
 * nothing. */
void kcd_resp_quiesce(kcd_state *st);
/* Closes every connection, stops the threads. After kcd_resp_quiesce it
 * first sends the replies already made (a GET answered at once from the
 * store is in no operation in flight, and a large one to a slow reader
 * was cut), reading and running nothing more, until --shutdown-timeout
 * after the quiesce at most. NULL st->resp: nothing. */
void kcd_resp_stop(kcd_state *st);

/* ---- the last hour, per 10 seconds (history.c) ---- */

#define KCD_HIST_STEP_S 10
#define KCD_HIST_SLOTS 360 /* an hour */
typedef enum kcd_hist_counter {
  KCD_H_REQUESTS,  /* HTTP requests completed */
  KCD_H_HITS,      /* bundle reads that found the bundle */
  KCD_H_MISSES,    /* and that did not */
  KCD_H_BYTES_OUT, /* response body bytes */
  KCD_H_EVICTIONS, /* bundles, blobs and RESP keys evicted */
  KCD_H_RESP,      /* RESP commands */
  KCD_H_N
} kcd_hist_counter;
/* The counters' names in JSON ("requests", ...). */
const char *kcd_hist_name(kcd_hist_counter c);
/* Adds what the counters moved since the last tick to the slot of now
 * (unix seconds). Main thread, once a second; creates st->history. */
void kcd_history_tick(kcd_state *st, int64_t now);
/* The complete slots of the last hour, oldest first: t[i] (the slot's start,
 * unix seconds) and v[i][KCD_H_N]; returns how many (at most
 * KCD_HIST_SLOTS). Any thread. */
size_t kcd_history_read(kcd_state *st, int64_t now, int64_t *t,
                        uint64_t (*v)[KCD_H_N]);
/* At exit, after the listeners stopped. */
void kcd_history_free(kcd_state *st);

/* ---- what each front end shows of itself (status.c) ----
 * The core reads a front end only through the table it registers when it
 * starts (as nginx's stub_status reads counters, or a Redis module
 * registers an INFO callback): /metrics, /v1/stats and the history call
 * each registered table's functions, and know nothing else of HTTP or
 * RESP. A front end registers before its threads serve and unregisters
 * before it frees `self`; main.c stops HTTP (the readers of /metrics and
 * /v1/stats) before RESP. */
typedef struct kcd_status {
  void *self; /* the front end's state, passed to each function */
  /* Appends its Prometheus text to f (a FILE *). */
  void (*metrics)(void *self, void *f);
  /* Sets its fields of GET /v1/stats on o (a jansson object); may be NULL. */
  void (*stats)(void *self, void *o);
  /* Writes the cumulative values of the history counters it owns into
   * v (KCD_H_REQUESTS, ...); leaves the others. May be NULL. */
  void (*history)(void *self, uint64_t v[KCD_H_N]);
} kcd_status;
void kcd_status_register(kcd_state *st, kcd_fe fe, const kcd_status *t);
void kcd_status_unregister(kcd_state *st, kcd_fe fe);
/* Whether fe registered a table (it is started). */
int kcd_status_up(kcd_state *st, kcd_fe fe);
/* Each registered table's metrics / stats / history, HTTP's first. */
void kcd_status_metrics(kcd_state *st, void *f);
void kcd_status_stats(kcd_state *st, void *o);
void kcd_status_history(kcd_state *st, uint64_t v[KCD_H_N]);

#endif
