/* http.h: kcached's HTTP front end (libmicrohttpd), over the core (kcd.h):
 * the per-request context, the route table, replies, the handlers, open
 * connections and request framing. No RESP file includes it.
 *
 * A request flows one way: main.c starts http.c (libmicrohttpd glue), which
 * finds the route and method in the table (routes.c), checks the token
 * (its Bearer, through service.c and auth.c) and calls the handler
 * (routes_*.c); the handler parses, calls the service layer (service.c) or
 * the store, and answers through reply.c. Handlers call back into http.c
 * only through the request accessors kcd_header and kcd_query; http.c knows
 * handlers only through the table. When the request completes, http.c
 * counts it (http_metrics.c) and logs it (log.c). HTTP's state (kcd_http,
 * st->http) is its own: the core sees it only through the status table
 * http.c registers.
 *
 * Threads: a kcd_req is used by one thread at a time (the connection's
 * worker). */
#ifndef KCD_HTTP_H
#define KCD_HTTP_H

#include <jansson.h>

#include "kcd.h"

struct MHD_Connection;
struct MHD_Daemon;
typedef struct kcd_req kcd_req;
typedef struct kcd_op kcd_op;
typedef struct kcd_route kcd_route;

/* ---- the route table (routes.c) ---- */

/* Routes, as the table, metrics and messages know them. */
typedef enum kcd_route_id {
  KCD_R_OTHER,
  KCD_R_HEALTHZ,
  KCD_R_READYZ,
  KCD_R_METRICS,
  KCD_R_STATS,
  KCD_R_BLOBS,
  KCD_R_BUNDLES,
  KCD_R_LOOKUP,
  KCD_R_MODELS,
  KCD_R_LEASES,
  KCD_R_DEMAND,       /* POST /v1/demand */
  KCD_R_MODEL_DEMAND, /* GET /v1/models/{model}/demand */
  KCD_R_MODEL_INDEX,  /* GET /v1/models (routes_models.c) */
  KCD_R_WARMUP,       /* /v1/models/{model}/warmup */
  KCD_R_COVERAGE,     /* /v1/models/{model}/coverage */
  KCD_R_HISTORY,      /* /v1/stats/history */
  KCD_R_PAGE,         /* GET / and its two assets (server/http/page/) */
  KCD_R_PAGE_JS,
  KCD_R_PAGE_CSS,
  KCD_R_BLOBS_FETCH, /* POST /v1/blobs/fetch (routes_fetch.c) */
  KCD_N_ROUTES
} kcd_route_id;

typedef enum kcd_method {
  KCD_M_GET,
  KCD_M_HEAD,
  KCD_M_PUT,
  KCD_M_POST,
  KCD_M_DELETE,
  KCD_M_OTHER,
  KCD_N_METHODS
} kcd_method;

/* The route's name from the table ("other" for KCD_R_OTHER). */
const char *kcd_route_name(kcd_route_id id);
/* "GET", ..., "OTHER". */
const char *kcd_method_name(kcd_method m);

typedef enum kcd_body {
  KCD_BODY_NONE,
  KCD_BODY_JSON,
  KCD_BODY_STREAM
} kcd_body;
typedef enum kcd_param {
  KCD_P_NONE,
  KCD_P_DIGEST,
  KCD_P_KEY,
  KCD_P_MODEL
} kcd_param;

/* One method of one route. */
struct kcd_op {
  kcd_method method;
  kcd_role role;   /* least role it needs */
  int needs_store; /* 503 not_ready without a store */
  kcd_body body;
  /* Stream bodies: on the first call (may set r->early / return an error),
   * then for every piece. */
  kc_err (*begin)(kcd_req *r, char *err);
  kc_err (*data)(kcd_req *r, const char *p, size_t n, char *err);
  /* The last call: queue a response, return its MHD result. */
  int (*finish)(kcd_req *r);
};

struct kcd_route {
  kcd_route_id id;
  const char *name; /* in metrics and messages: "blobs", "healthz", ... */
  const char *path; /* exact, or a prefix ending in '/' followed by param */
  kcd_param param;
  const char *allow; /* the Allow header of a 405 */
  const kcd_op *ops;
  size_t n_ops;
  /* A param route's path after the param ("/warmup"); NULL: none. A route
   * with a suffix is tried before the routes without one. */
  const char *suffix;
};

/* Finds the route of a path (NULL: unknown) and copies its param, truncated
 * to cap - 1 bytes (then never valid hex64). */
const kcd_route *kcd_route_find(const char *url, char *param, size_t cap);
/* The method's operation on a route; NULL: 405. */
const kcd_op *kcd_route_op(const kcd_route *rt, kcd_method m);
/* The least role op needs: op->role, or --metrics-role on /metrics. */
kcd_role kcd_route_role(const kcd_route *rt, const kcd_op *op,
                        const kcd_state *st);
/* A request's method string to its kcd_method. */
kcd_method kcd_method_of(const char *method);

/* ---- HTTP's counters (http_metrics.c) ---- */

#define KCD_N_STATUS 20  /* distinct statuses counted, the last is "other" */
#define KCD_N_BUCKETS 16 /* request-duration histogram bounds, +Inf apart */

/* Relaxed atomics: statistics, not synchronization. The operations HTTP
 * serves are counted by the service layer (kcd.h's kcd_metrics). */
typedef struct kcd_http_metrics {
  _Atomic uint64_t requests[KCD_N_ROUTES][KCD_N_METHODS][KCD_N_STATUS];
  _Atomic uint64_t bytes_in, bytes_out;
  _Atomic uint64_t duration[KCD_N_BUCKETS + 1];
  _Atomic uint64_t duration_us_sum;
  _Atomic uint64_t uploads_aborted;
  /* routes_zstd.c: GETs of compressed blobs, those answered
   * with the frame (Accept-Encoding: zstd), PUTs that arrived as frames */
  _Atomic uint64_t zstd_gets, zstd_sent_frames, zstd_puts;
  /* connections shut down by the maintenance tick (conns.c) */
  _Atomic uint64_t cut_header_timeout, cut_slow_body;
  /* large blobs sent from the store's pages (loans.c); those whose client
   * was slow enough that they were copied and their read ended; those cut
   * instead (the answer budget refused the copy) */
  _Atomic uint64_t loans, loans_detached, loans_cut;
} kcd_http_metrics;

/* Counts a completed request. */
void kcd_http_observe(kcd_http_metrics *m, kcd_route_id r, kcd_method meth,
                      int status, uint64_t in, uint64_t out, uint64_t us);
/* HTTP's status table's functions (kcd_status; self: its kcd_http): its
 * Prometheus text, and its history counters (requests, bytes out). */
void kcd_http_metrics_render(void *self, void *f);
void kcd_http_history(void *self, uint64_t v[KCD_H_N]);

/* Parses a body as one JSON object whose fields are all in `allowed`
 * (NULL-terminated); the error names the first unknown field. */
kc_err kcd_json_object(const kcd_req *r, const char *const *allowed,
                       json_t **out, char *err);

/* ---- open connections (conns.c) ---- */

/* Every connection of the daemons, for the header deadline (conns.c says
 * why MHD's own timeout cannot be it). Thread-safe. */
typedef struct kcd_conns kcd_conns;
typedef struct kcd_conn kcd_conn;

kcd_conns *kcd_conns_new(void); /* NULL: out of memory */
void kcd_conns_free(kcd_conns *l);
/* A connection accepted (waiting for headers from now); NULL: no memory
 * (the connection then has no deadline). counted: a main-port connection,
 * counted per client address for kcd_conns_admit. */
kcd_conn *kcd_conn_open(kcd_conns *l, int fd, int counted);
/* Whether the main port takes one more connection from this address: it
 * holds less than half of the slots of max_conns still free (or none are,
 * which MHD refuses itself). Keeps room for new addresses. */
struct sockaddr;
int kcd_conns_admit(kcd_conns *l, const struct sockaddr *sa,
                    unsigned max_conns);
/* The probe port's slots (its MHD connection limit): a connection to it
 * that leaves fewer than a few free cuts the probe connection that has
 * waited longest for its headers (conns.c). Set before serving. */
void kcd_conns_probe_limit(kcd_conns *l, size_t slots);
/* Whether connections of l are plain HTTP, whose received bytes are
 * scanned (kcd_framing_scan); TLS ones are not. Set before serving. */
void kcd_conns_scan_raw(kcd_conns *l, int on);
/* Before MHD closes its descriptor; frees c (NULL: nothing). */
void kcd_conn_close(kcd_conns *l, kcd_conn *c);
/* The headers of a request are complete / a request ended (waiting for the
 * next one's headers from now). c may be NULL. */
void kcd_conn_headers_done(kcd_conn *c);
void kcd_conn_request_done(kcd_conn *c, uint64_t now_us); /* kc_clock_mono_us */
/* The raw target of the request being read, as MHD's URI log callback
 * saw it: where it is in MHD's read buffer, its length then, and
 * kcd_framing_target_flaw of it (MHD decodes it in place afterwards). Set
 * and read on the connection's thread. */
void kcd_conn_set_target(kcd_conn *c, const char *target, size_t len, int flaw);
const char *kcd_conn_target(const kcd_conn *c, size_t *len, int *flaw);
/* The peer's address as text, taken at kcd_conn_open; "-" for c NULL. */
const char *kcd_conn_remote(const kcd_conn *c);
/* A request body is being read (from its headers to its end): its bytes
 * are counted against --min-body-rate; the answer that follows is not. */
void kcd_conn_body_begin(kcd_conn *c);
void kcd_conn_body_end(kcd_conn *c);
void kcd_conn_body_bytes(kcd_conn *c, size_t n);

typedef struct kcd_sweep {
  uint64_t header_us;                 /* headers must be in within it */
  uint64_t body_window_us;            /* a body is judged once per window */
  uint64_t body_min_rate;             /* bytes/s over a window; 0: no minimum */
  size_t closed_headers, closed_body; /* out: connections shut down */
  size_t refused_length; /* out: answered from the received bytes (a
                            malformed Content-Length) since the last sweep */
  size_t cut_probe; /* out: probe-port connections cut to make room (conns.c)
                       since the last sweep */
} kcd_sweep;
/* Shuts down every connection waiting for headers for header_us or more,
 * and every one whose body brought less than body_min_rate bytes/s over a
 * window; counts them in w. */
void kcd_conns_sweep(kcd_conns *l, uint64_t now_us, kcd_sweep *w);

/* ---- request framing (framing.c) ---- */

/* A request as libmicrohttpd parsed it in place (framing.c says how). */
typedef struct kcd_raw_req {
  const char *method, *version; /* the access handler's arguments */
  const char *target; /* the raw target the URI log callback saw; NULL none */
  size_t target_len;  /* its length then */
  int target_flaw;    /* kcd_framing_target_flaw of it then */
} kcd_raw_req;

enum { KCD_TARGET_OK, KCD_TARGET_PCT00, KCD_TARGET_SPACE, KCD_TARGET_CTL };
/* What is wrong with a raw request target (KCD_TARGET_*): "%00", a space,
 * a control character; KCD_TARGET_OK: nothing. */
int kcd_framing_target_flaw(const char *target, size_t len);
/* RFC 9112's framing and syntax rules on a request (framing.c lists them):
 * KC_OK with *host the Host header's value (NULL: none), or KC_EINVAL
 * (400) / KC_NOT_IMPLEMENTED (501, a transfer coding other than chunked)
 * with the sentence in err. Call it on the access handler's first call. */
kc_err kcd_framing_check(struct MHD_Connection *conn, const kcd_raw_req *raw,
                         const char **host, char *err);
/* Whether a server without tokens answers a request with this Host value:
 * loopback addresses, localhost and *.localhost, the --listen host,
 * --allow-host names, and none or an empty one (HTTP/1.0; no browser sends
 * that). Any other name reaching a loopback server is a web page's, through
 * DNS rebinding. */
int kcd_framing_host_allowed(const kcd_config *c, const char *host);

/* The raw bytes of a request's header block as kcached receives them (only
 * on plain HTTP; framing.c says why): enough to find what libmicrohttpd
 * 0.9.75 answers itself, with two status lines, before the access handler
 * could see it: a first Content-Length that is not a decimal number, or
 * too large, without Transfer-Encoding. Per connection, on its thread. */
typedef struct kcd_scan {
  int on;            /* KCD_SCAN_OFF, _HEADERS (a block), _BODY (cl left),
                        or a chunked body's parts (framing.c) */
  int line;          /* lines it ended so far (0: the request line) */
  unsigned col;      /* bytes of the current line */
  unsigned mcl, mte; /* bytes of the names below matched at a line start */
  int cr;            /* the last byte was a CR */
  int in_cl;         /* in the first Content-Length's value */
  int cl_seen, te_seen, cl_digits, cl_bad, cl_big;
  uint64_t cl;
} kcd_scan;
enum { KCD_SCAN_OK, KCD_SCAN_BAD_LENGTH, KCD_SCAN_BIG_LENGTH };
enum {
  KCD_SCAN_OFF,
  KCD_SCAN_HEADERS,
  KCD_SCAN_BODY,
  KCD_SCAN_CHUNK_SIZE, /* a chunk-size line (cl: the size so far) */
  KCD_SCAN_CHUNK_DATA, /* cl bytes of a chunk's data left */
  KCD_SCAN_CHUNK_END,  /* the CRLF after a chunk's data */
  KCD_SCAN_TRAILER     /* the trailer lines after the last chunk */
};
/* Feeds received bytes; KCD_SCAN_OK, or what the block's end showed. */
int kcd_framing_scan(kcd_scan *s, const char *p, size_t n);
/* The answer kcached gives instead (a static HTTP response), for what
 * kcd_framing_scan returned. */
const char *kcd_framing_scan_answer(int verdict, size_t *len);

/* ---- kcached's recv() (recv.c) ---- */

/* The table of scanned descriptors (sized to the open-file limit); 0 when
 * there is no memory for it, and then nothing is scanned. */
int kcd_recv_init(void);
/* From now on recv() feeds fd's received bytes to s (NULL: to none);
 * cleared before the descriptor closes. */
void kcd_recv_scan(int fd, kcd_scan *s);
/* Connections answered and closed by the scan since the last call. */
size_t kcd_recv_refused_take(void);

/* ---- requests (http.c) ---- */

/* What the handler of a route sees. Pointers live until the request ends. */
struct kcd_req {
  /* Requests are recycled per thread (http.c). These strings are set (or
   * NUL-ended) by req_new, not zeroed: a GET would pay for 1 KiB of memset. */
  char method_str[16];
  char path[256]; /* for the log; truncated */
  char param[96]; /* {sha256}/{key}/{model} of the path (any length < 96) */
  char token_name[KCD_NAME_MAX];
  char early_msg[KC_ERRBUF_SIZE];
  /* Zeroed for each request from here to the end (KCD_REQ_ZERO_FROM): new
   * fields go below. */
  kcd_state *st;
  struct MHD_Connection *conn;
  const kcd_route *rt; /* the matched route; NULL: none (404) */
  const kcd_op *op;    /* its operation for the method; NULL: none (405) */
  kcd_method method;
  kcd_role role;
  uint64_t t0_us;
  uint64_t content_length; /* UINT64_MAX: unknown (chunked or none) */
  int has_body;
  uint64_t bytes_in, bytes_out;
  int status; /* of the queued response; 0 none yet */
  int queued; /* a response is queued: ignore further calls */
  /* an answer decided before the body was read (error, or "present") */
  int early;
  int discard;        /* read and drop the rest of the body */
  uint64_t drop_from; /* bytes_in when dropping began */
  kc_err early_err;
  /* JSON bodies */
  char *body;
  size_t body_len, body_cap;
  /* handler state */
  kc_store_upload *upload; /* aborted at completion if still set */
  kc_store_read *read;     /* ended at completion, if still held */
  int blob_present;
  int close_after;    /* answer with Connection: close (--health-listen) */
  kcd_req *next_free; /* the thread's free list */
};

#define KCD_REQ_ZERO_FROM offsetof(kcd_req, st)

/* Request accessors: a request header, a query argument; NULL: absent. */
const char *kcd_header(kcd_req *r, const char *name);
const char *kcd_query(kcd_req *r, const char *name);

/* The caller of an Authorization header (may be NULL): kcd_svc_auth of its
 * Bearer token (kcd_http_bearer in http.c). */
kcd_authn kcd_http_auth(kcd_state *st, const char *header, kcd_role *role,
                        char name[KCD_NAME_MAX]);
/* ---- large blobs lent from the map (loans.c) ---- */

typedef struct kcd_loans kcd_loans;
/* The loans and their reaper thread, for the HTTP daemon's life; NULL on
 * failure (then every large GET is copied in pieces). */
kcd_loans *kcd_loans_new(kcd_state *st);
/* After the daemon stopped (no response is left). NULL: nothing. */
void kcd_loans_free(kcd_loans *ls);

/* ---- HTTP's state (http.c makes it at kcd_http_start: st->http) ---- */

typedef struct kcd_http {
  kcd_state *st;
  struct MHD_Daemon *mhd;
  struct MHD_Daemon *mhd_health; /* --health-listen; NULL: none */
  kcd_conns *conns;              /* open connections (conns.c) */
  _Atomic int quiesced;          /* kcd_http_quiesce: new connections are
                                    closed unserved (http.c, on_accept) */
  /* bytes of answers held in memory until their clients read them
   * (reply.c), against --max-answer-memory */
  _Atomic uint64_t answer_bytes;
  struct kcd_dcache *dcache; /* decoded blobs (decoded_cache.c); NULL: off */
  kcd_loans *loans;          /* large blobs lent from the map (loans.c) */
  kcd_http_metrics metrics;
  kcd_status status; /* registered with the core */
} kcd_http;

/* ---- replies (reply.c) ---- */

/* Response helpers: each queues the response and returns the MHD result.
 * headers: NULL, or name, value, ..., NULL. */
enum kcd_mem { KCD_MEM_COPY, KCD_MEM_PERSISTENT, KCD_MEM_FREE };
int kcd_reply(kcd_req *r, int status, const char *ctype, const void *data,
              size_t len, enum kcd_mem mem, const char *const *headers);
/* A 200 whose body is a copy of the len bytes (at most KCD_ZERO_COPY_MAX)
 * at data inside the map of the request's read (r->read, ended here, so
 * no read waits for the client), with headers that depend only on `key`
 * (64 hex digits: the blob's digest) and ctype. Each thread keeps the last
 * responses built (REUSE_SLOTS), and one built for the same key and the
 * same bytes is queued again instead of a new one (a GET then costs no
 * response allocation, copy nor header copies). */
int kcd_reply_map(kcd_req *r, const char *key, const char *ctype,
                  const void *data, size_t len, const char *const *headers);
/* A body produced piece by piece: fill buf with up to max bytes of it from
 * offset pos; return how many (> 0), or -1 to abort the response (the
 * connection closes: the client sees a body shorter than its length; the
 * routes spare a blob they serve in pieces from eviction, so that only a
 * store that fails does that). */
typedef long (*kcd_piece_fn)(void *cls, uint64_t pos, char *buf, size_t max);
/* Answers a body of len bytes served by fn in pieces of at most `piece`
 * bytes, each asked for when the client has taken the one before; cls is
 * freed with free_cls (may be NULL) when the response is done, also when
 * queuing it fails. */
int kcd_reply_pieces(kcd_req *r, int status, const char *ctype, uint64_t len,
                     size_t piece, kcd_piece_fn fn, void *cls,
                     void (*free_cls)(void *), const char *const *headers);
/* A 200 over len bytes at data that another owner keeps alive until
 * release(cls) (called once MHD is done, or at once on failure): not
 * counted against --max-answer-memory, the owner bounds it (the decoded
 * cache). */
int kcd_reply_held(kcd_req *r, const char *ctype, const void *data, size_t len,
                   void (*release)(void *), void *cls,
                   const char *const *headers);
/* A 200 over len bytes at data, found by r->read in a large raw blob, sent
 * from the store's pages without a copy (loans.c); the read becomes the
 * loan's. -1 when no loan can be made now (too many held, or the bytes are
 * not lendable): nothing was queued and r->read is still the caller's. */
int kcd_reply_lent(kcd_req *r, const void *data, size_t len, const char *ctype,
                   const char *const *headers);
/* The answer budget (--max-answer-memory, st->answer_bytes): take len bytes
 * of it (0: over it, nothing taken; the first answer always goes), give
 * them back. */
int kcd_answer_budget_take(kcd_state *st, size_t len);
void kcd_answer_budget_give(kcd_state *st, size_t len);
/* Serializes a jansson value (stolen). */
int kcd_reply_json(kcd_req *r, int status, json_t *json,
                   const char *const *headers);
/* {"error":code,"message":msg} with extra fields of `extra` (stolen, may be
 * NULL); msg NULL: kc_strerror(e). Adds WWW-Authenticate to a 401, the
 * route's Allow to a 405, Retry-After to a 503 without caller headers. */
int kcd_reply_error_json(kcd_req *r, kc_err e, const char *msg, json_t *extra,
                         const char *const *headers);
int kcd_reply_error(kcd_req *r, kc_err e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* An error decided before the body was read: kcd_set_early records it in
 * r->early*, kcd_reply_early answers it (http.c calls it once the body was
 * read or dropped, or at once when there is none to wait for). */
void kcd_set_early(kcd_req *r, kc_err e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int kcd_reply_early(kcd_req *r);

/* A read held for a whole response pins every LMDB page freed after it
 * began: bodies from the map up to this size are copied before the read
 * ends (kcd_reply_map), larger blobs are lent with a read taken back from
 * a slow client (loans.c) or served in pieces, and other larger bodies are
 * copied out so that the read ends before the client's pace matters
 * (routes_blob.c, routes_bundle.c). */
#define KCD_ZERO_COPY_MAX (64 * 1024)

/* Handlers (routes_*.c): the functions of the route table; each finish
 * function queues one response through reply.c. */

/* ---- operator routes (routes_ops.c) ---- */

int kcd_healthz(kcd_req *r);
int kcd_readyz(kcd_req *r);
int kcd_metrics_get(kcd_req *r); /* --metrics-role decides who may */
int kcd_stats_get(kcd_req *r);

/* ---- blobs (routes_blob.c) ---- */

kc_err kcd_blob_put_begin(kcd_req *r, char *err);
kc_err kcd_blob_put_data(kcd_req *r, const char *p, size_t n, char *err);
int kcd_blob_put(kcd_req *r);
int kcd_blob_get(kcd_req *r); /* GET and HEAD */
/* What every blob GET shares (routes_blob.c, routes_zstd.c): the piece
 * size of a body copied out piece by piece, one short read per piece (also
 * routes_fetch.c's); the ETag, the blob's digest quoted; the headers of a
 * blob's answer (content-addressed bytes never change: caches may keep them
 * forever), name, value pairs to begin a header list with. */
#define KCD_BLOB_PIECE (128 * 1024)
#define KCD_ETAG_SIZE (KC_HEX_LEN + 3)
#define KCD_BLOB_HEADERS(etag)                                                 \
  "ETag", (etag), "Cache-Control", "public, max-age=31536000, immutable"
void kcd_blob_etag(const kcd_req *r, char out[KCD_ETAG_SIZE]);
/* If-None-Match: etag, a list holding it, or "*". */
int kcd_blob_not_modified(kcd_req *r, const char *etag);
/* routes_zstd.c: GET/HEAD of a blob held compressed, from the GET's read
 * (r->read, which it ends; v: the held frame and the content's size);
 * whether a request accepts zstd, and whether its body is a zstd frame
 * (Content-Encoding). */
int kcd_blob_get_encoded(kcd_req *r, const kc_store_blob_view *v);
int kcd_accepts_zstd(kcd_req *r);
int kcd_body_is_zstd(kcd_req *r);

/* ---- decoded blobs kept in memory (decoded_cache.c) ----
 * Content of compressed blobs for clients without zstd, by digest, least
 * recently used out, within a byte budget (--decoded-cache) that also
 * counts entries only answers still hold. Threads: any. NULL cache: off
 * (every get passes). */
typedef struct kcd_dcache kcd_dcache;
typedef struct kcd_dcache_stat {
  uint64_t budget, bytes, entries, hits, misses, evictions;
} kcd_dcache_stat;
kcd_dcache *kcd_dcache_new(uint64_t budget); /* NULL: 0 or no memory */
void kcd_dcache_free(kcd_dcache *c);
void kcd_dcache_stats(kcd_dcache *c, kcd_dcache_stat *s);
typedef struct kcd_dentry kcd_dentry;
typedef enum kcd_dcache_res {
  KCD_DC_HIT,  /* *out: the content, a reference held */
  KCD_DC_FILL, /* *out: len bytes to fill, then kcd_dcache_publish */
  KCD_DC_PASS  /* not cached (too big, no room, being filled): go without */
} kcd_dcache_res;
/* len: the content's size (a miss counts, and may make an entry to fill),
 * or KCD_DC_LOOK: a hit or nothing (no miss counted). */
#define KCD_DC_LOOK UINT64_MAX
kcd_dcache_res kcd_dcache_get(kcd_dcache *c, const char *digest, uint64_t len,
                              kcd_dentry **out);
void *kcd_dentry_data(kcd_dentry *e);
size_t kcd_dentry_len(const kcd_dentry *e);
/* A filled entry: ok (its content hashed to its digest) makes it visible,
 * else it is dropped. The filler's reference stays its own. */
void kcd_dcache_publish(kcd_dentry *e, int ok);
/* Drops a reference (a kcd_dentry *; the signature of a free callback). */
void kcd_dentry_release(void *e);

/* ---- many blobs in one answer (routes_fetch.c) ---- */

/* POST /v1/blobs/fetch: at most this many digests, and this many bytes of
 * blobs as sent (a held frame decoded for a client without zstd counts its
 * content) per answer (413 above either). */
#define KCD_FETCH_MAX_ITEMS 4096
#define KCD_FETCH_MAX_BYTES ((uint64_t)256 << 20)
#define KCD_FETCH_CTYPE "application/vnd.kcache.blobs"
int kcd_blobs_fetch(kcd_req *r);

/* ---- bundles, lookup (routes_bundle.c) ---- */

int kcd_bundle_get(kcd_req *r);
int kcd_bundle_put(kcd_req *r);
int kcd_bundle_delete(kcd_req *r);
int kcd_lookup(kcd_req *r);

/* ---- leases (routes_lease.c) ---- */

int kcd_lease_post(kcd_req *r);
int kcd_lease_delete(kcd_req *r);

/* ---- demand (routes_demand.c) ---- */

int kcd_demand_post(kcd_req *r);
int kcd_demand_get(kcd_req *r);
/* ---- models, coverage, history, the page (routes_models.c, page.c) ---- */

int kcd_models_index(kcd_req *r); /* GET /v1/models?limit&cursor */
int kcd_models_get(kcd_req *r);   /* GET /v1/models/{model} */
int kcd_warmup_get(kcd_req *r);
int kcd_warmup_put(kcd_req *r);
int kcd_coverage_get(kcd_req *r);
int kcd_model_purge(kcd_req *r); /* DELETE /v1/models/{model} */
int kcd_history_get(kcd_req *r); /* GET /v1/stats/history */
int kcd_page_get(kcd_req *r);    /* GET /, /app.js, /style.css */

#endif
