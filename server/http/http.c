/* http.c: the libmicrohttpd glue: the access handler that turns MHD's calls
 * into route decisions, body delivery and one answer; the completion callback
 * that frees each request (ending zero-copy reads, aborting unfinished
 * uploads), counts and logs it; the request accessors handlers may call
 * (kcd_header, kcd_query); daemon start and stop.
 *
 * A request flows: on_request -> the route table (routes.c: route, op, role)
 * -> the op's handler (routes_*.c) -> an answer (reply.c). http.c knows the
 * handlers only through the table's begin/data/finish pointers.
 *
 * MHD calls the handler first with the headers only, then once per piece of
 * body, then once more with no data. Answering on the first call makes MHD
 * close the connection after the answer (0.9.75's MHD_queue_response sets
 * discard_request then), and the calls with body pieces cannot answer (it
 * refuses an answer until the whole request is in), so answers wait for
 * the last call (a refused small body is read and dropped first), except
 * where closing is the point: a refused body too large to drop, or a
 * client that asked "Expect: 100-continue" and so has not sent its body
 * yet. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <microhttpd.h>

#include "http.h"

/* An error decided while a body is still coming: read and drop up to this
 * much of it before answering, rather than answer and close at once. Closing
 * on unread data makes the kernel send a reset, which can destroy the answer
 * before the client reads it (nginx's "lingering close" problem). Beyond it,
 * or when the client waits for 100-continue, the answer goes out at once. */
#define DISCARD_MAX (4 * 1024 * 1024)
/* Per-connection memory: headers, and the window a body arrives in. MHD
 * 0.9.75 zeroes the pool twice per request (shrinking the read buffer, then
 * resetting the pool), so its size is paid by every request: 256 KiB served
 * 4 KiB GETs 40% slower than 32 KiB, and 16 KiB spends half of 32 KiB's 6%
 * of a small GET's cycles in memset (measured). Uploads arrive in
 * pieces of about this size; hashing and writing them, not the number of
 * pieces, is what they cost. */
#define CONN_MEMORY (16 * 1024)
#define NOTSENT_LOWAT (64 * 1024)

const char *kcd_header(kcd_req *r, const char *name) {
  return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

const char *kcd_query(kcd_req *r, const char *name) {
  return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, name);
}

/* ---- request life ---- */

static void read_length(kcd_req *r) {
  const char *cl = kcd_header(r, MHD_HTTP_HEADER_CONTENT_LENGTH);
  const char *te = kcd_header(r, MHD_HTTP_HEADER_TRANSFER_ENCODING);
  r->content_length = UINT64_MAX;
  if (cl) {
    char *end;
    unsigned long long v = strtoull(cl, &end, 10);
    if (*cl && !*end)
      r->content_length = v;
  }
  r->has_body = te != NULL || (cl && r->content_length != 0);
}

/* Requests are recycled: each MHD thread keeps up to REQ_FREE_MAX finished
 * ones, so a GET costs no calloc/free of this ~1 KiB struct and zeroes only
 * its fields (from KCD_REQ_ZERO_FROM), not the strings. A request is begun and
 * ended on its connection's thread; the lists are freed when the thread ends.
 */
#define REQ_FREE_MAX 64

static _Thread_local struct {
  kcd_req *head;
  unsigned n;
} req_free;
static pthread_key_t req_key;
static pthread_once_t req_once = PTHREAD_ONCE_INIT;

static void req_list_free(void *unused) {
  (void)unused;
  while (req_free.head) {
    kcd_req *r = req_free.head;
    req_free.head = r->next_free;
    free(r);
  }
  req_free.n = 0;
}

static void req_key_make(void) { pthread_key_create(&req_key, req_list_free); }

static kcd_req *req_alloc(void) {
  kcd_req *r = req_free.head;
  if (r) {
    req_free.head = r->next_free;
    req_free.n--;
  } else if (!(r = malloc(sizeof *r))) {
    return NULL;
  }
  memset((char *)r + KCD_REQ_ZERO_FROM, 0, sizeof *r - KCD_REQ_ZERO_FROM);
  return r;
}

static void req_release(kcd_req *r) {
  free(r->body);
  if (req_free.n >= REQ_FREE_MAX) {
    free(r);
    return;
  }
  if (!req_free.head) { /* the key's destructor frees the list at exit */
    pthread_once(&req_once, req_key_make);
    pthread_setspecific(req_key, &req_free);
  }
  r->next_free = req_free.head;
  req_free.head = r;
  req_free.n++;
}

/* Copies s into out[cap], cut to fit. */
static void copy_cut(char *out, size_t cap, const char *s) {
  size_t n = strlen(s);
  if (n >= cap)
    n = cap - 1;
  memcpy(out, s, n);
  out[n] = '\0';
}

static kcd_req *req_new(kcd_state *st, struct MHD_Connection *conn,
                        const char *url, const char *method) {
  kcd_req *r = req_alloc();
  if (!r)
    return NULL;
  r->st = st;
  r->conn = conn;
  r->t0_us = kc_clock_mono_us();
  r->method = kcd_method_of(method);
  copy_cut(r->method_str, sizeof r->method_str, method);
  copy_cut(r->path, sizeof r->path, url);
  r->param[0] = '\0';
  r->early_msg[0] = '\0';
  memcpy(r->token_name, "-", 2);
  read_length(r);
  kcd_svc_begin(st, KCD_FE_HTTP);
  return r;
}

/* The token of an Authorization header's value: NULL for no header, ""
 * when it is not "Bearer <token>" (which then names no token). */
static const char *kcd_http_bearer(const char *h) {
  if (!h)
    return NULL;
  if (strncasecmp(h, "Bearer", 6) != 0 || (h[6] != ' ' && h[6] != '\t'))
    return "";
  h += 6;
  while (*h == ' ' || *h == '\t')
    h++;
  return h;
}

kcd_authn kcd_http_auth(kcd_state *st, const char *header, kcd_role *role,
                        char name[KCD_NAME_MAX]) {
  const char *tok = kcd_http_bearer(header);
  return kcd_svc_auth(st, KCD_FE_HTTP, NULL, tok, tok ? strlen(tok) : 0, role,
                      name);
}

/* 401 or 403 unless the caller's token grants `need`. */
static int authorize(kcd_req *r, kcd_role need) {
  if (need == KCD_ROLE_NONE)
    return 0;
  kcd_authn a = kcd_http_auth(r->st, kcd_header(r, "Authorization"), &r->role,
                              r->token_name);
  if (a == KCD_AUTHN_ANON)
    kcd_set_early(r, KC_UNAUTHORIZED,
                  "this route needs a token "
                  "(Authorization: Bearer <token>)");
  else if (a == KCD_AUTHN_BAD)
    kcd_set_early(r, KC_UNAUTHORIZED, "the token is not valid");
  else if (r->role < need)
    kcd_set_early(r, KC_FORBIDDEN, "token '%s' has role %s; %s %s needs %s",
                  r->token_name, kcd_role_name(r->role), r->method_str,
                  r->rt->name, kcd_role_name(need));
  return r->early;
}

static void check_param(kcd_req *r, kcd_param p) {
  static const char *const what[] = {"", "digest", "key", "model"};
  if (p == KCD_P_NONE || kc_is_hex64(r->param))
    return;
  kcd_set_early(r, p == KCD_P_DIGEST ? KC_BAD_DIGEST : KC_BAD_KEY,
                "%s '%.80s' is not 64 lowercase hex digits (a SHA-256)",
                what[p], r->param);
}

/* A body's Content-Encoding: identity, or zstd on a blob PUT (the store
 * decodes it); any other (gzip, br, a list) would be stored as it came, so
 * it is refused: 415. */
static void check_coding(kcd_req *r) {
  const char *ce = kcd_header(r, MHD_HTTP_HEADER_CONTENT_ENCODING);
  if (!ce)
    return;
  size_t n = strlen(ce);
  while (n && (ce[n - 1] == ' ' || ce[n - 1] == '\t')) /* MHD keeps OWS */
    n--;
  int blob_put = r->rt->id == KCD_R_BLOBS && r->method == KCD_M_PUT;
  if ((n == 8 && strncasecmp(ce, "identity", 8) == 0) ||
      (blob_put && n == 4 && strncasecmp(ce, "zstd", 4) == 0))
    return;
  kcd_set_early(r, KC_UNSUPPORTED_MEDIA,
                "Content-Encoding '%.60s' is not "
                "accepted here: %s",
                ce, blob_put ? "identity or zstd" : "identity only");
}

static uint64_t body_limit(const kcd_req *r) {
  const kcd_config *c = &r->st->cfg;
  return r->op && r->op->body == KCD_BODY_STREAM ? c->max_blob_bytes
                                                 : c->max_json_bytes;
}

static void check_body(kcd_req *r) {
  uint64_t lim = body_limit(r);
  if (r->content_length != UINT64_MAX && r->content_length > lim)
    kcd_set_early(
        r, KC_TOO_LARGE, "a body of %llu bytes is over the limit of %llu",
        (unsigned long long)r->content_length, (unsigned long long)lim);
}

/* On the --health-listen daemon (start_health). */
static int is_health_daemon(const kcd_req *r) {
  if (!r->st->http->mhd_health)
    return 0;
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_DAEMON);
  return ci && ci->daemon == r->st->http->mhd_health;
}

/* Everything decided from the headers: route, method, token, path, store. */
static void req_begin(kcd_req *r) {
  const kcd_route *rt = kcd_route_find(r->path, r->param, sizeof r->param);
  if (!rt)
    return kcd_set_early(r, KC_NOT_FOUND, "no route for %.200s", r->path);
  r->close_after = is_health_daemon(r);
  if (r->close_after && rt->id != KCD_R_HEALTHZ && rt->id != KCD_R_READYZ &&
      rt->id != KCD_R_METRICS)
    return kcd_set_early(r, KC_NOT_FOUND,
                         "only /healthz, /readyz and "
                         "/metrics are served on --health-listen");
  r->rt = rt;
  r->op = kcd_route_op(rt, r->method);
  if (!r->op)
    return kcd_set_early(r, KC_METHOD, "%.16s is not allowed here; allowed: %s",
                         r->method_str, rt->allow);
  if (authorize(r, kcd_route_role(rt, r->op, r->st)))
    return;
  check_param(r, rt->param);
  if (r->early)
    return;
  if (r->op->needs_store && !kcd_store(r->st))
    return kcd_set_early(r, KC_NOT_READY, "the store is not open yet");
  check_coding(r);
  if (r->early)
    return;
  check_body(r);
  char err[KC_ERRBUF_SIZE] = "";
  kc_err e = !r->early && r->op->begin ? r->op->begin(r, err) : KC_OK;
  if (e)
    kcd_set_early(r, e, "%s", err);
}

static int expects_continue(kcd_req *r) {
  const char *x = kcd_header(r, MHD_HTTP_HEADER_EXPECT);
  return x && strcasecmp(x, "100-continue") == 0;
}

/* Whether an early answer goes out now (closing the connection) rather
 * than after the body was read and dropped. */
static int answer_now(kcd_req *r) {
  if (!r->has_body)
    return 0;
  if (expects_continue(r))
    return 1; /* the body has not been sent: nothing to drop */
  return r->content_length != UINT64_MAX && r->content_length > DISCARD_MAX;
}

/* The connection's entry in st->http->conns (NULL: none). */
static kcd_conn *conn_of(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

/* Framing and syntax the RFC refuses (framing.c): answered at once, and
 * the connection closed, since what follows is no trustworthy body or
 * request. Then, without tokens, a Host that is not this server's: a web
 * page that had its name resolve to 127.0.0.1 (DNS rebinding) must not
 * reach a loopback kcached that trusts every caller. */
static int refuse_framing(kcd_req *r, kcd_conn *c, const char *method,
                          const char *version) {
  char err[KC_ERRBUF_SIZE] = "";
  kcd_raw_req raw = {.method = method, .version = version};
  raw.target = kcd_conn_target(c, &raw.target_len, &raw.target_flaw);
  const char *host = NULL;
  kc_err e = kcd_framing_check(r->conn, &raw, &host, err);
  const kcd_config *cfg = &r->st->cfg;
  if (!e && !cfg->tokens && !is_health_daemon(r) &&
      !kcd_framing_host_allowed(cfg, host))
    e = kc_errf(err, KC_FORBIDDEN,
                "Host '%.100s' is not a name of this "
                "server (without --tokens only localhost, loopback addresses, "
                "the --listen host and --allow-host names are answered)",
                host ? host : "");
  if (!e)
    return 0;
  static const char *const close_hdr[] = {MHD_HTTP_HEADER_CONNECTION, "close",
                                          NULL};
  kcd_reply_error_json(r, e, err, NULL, close_hdr);
  return 1;
}

static int first_call(kcd_req *r, const char *method, const char *version) {
  kcd_conn *c = conn_of(r->conn);
  kcd_conn_headers_done(c);
  if (refuse_framing(r, c, method, version))
    return MHD_YES;
  if (r->has_body)
    kcd_conn_body_begin(c);
  req_begin(r);
  if (r->early) {
    if (answer_now(r))
      return kcd_reply_early(r);
    r->discard = 1;
    return MHD_YES;
  }
  /* A blob already present: its body would be dropped; say so before the
   * client sends it if it is waiting for permission. */
  if (r->discard && r->has_body && expects_continue(r))
    return r->op->finish(r);
  return MHD_YES;
}

static kc_err append_json(kcd_req *r, const char *p, size_t n, char *err) {
  uint64_t lim = r->st->cfg.max_json_bytes;
  if (r->body_len + n > lim)
    return kc_errf(err, KC_TOO_LARGE,
                   "the body is over the limit of %llu bytes",
                   (unsigned long long)lim);
  if (r->body_len + n + 1 > r->body_cap) {
    size_t cap = r->body_cap ? r->body_cap : 4096;
    while (cap < r->body_len + n + 1)
      cap *= 2;
    char *nb = realloc(r->body, cap);
    if (!nb)
      return kc_errf(err, KC_NOMEM, "out of memory reading the body");
    r->body = nb;
    r->body_cap = cap;
  }
  memcpy(r->body + r->body_len, p, n);
  r->body_len += n;
  r->body[r->body_len] = '\0';
  return KC_OK;
}

/* Drops body bytes after an early error, within DISCARD_MAX. */
static int drop(kcd_req *r) {
  if (r->bytes_in - r->drop_from > DISCARD_MAX)
    return kcd_reply_early(r);
  return MHD_YES;
}

static int body_piece(kcd_req *r, const char *p, size_t n) {
  char err[KC_ERRBUF_SIZE] = "";
  kc_err e = KC_OK;
  r->bytes_in += n;
  if (r->early)
    return drop(r);
  if (r->discard) {
    /* A present blob: dropping still has a bound, as a chunked body has no
     * length up front. */
    if (r->bytes_in > body_limit(r))
      e = kc_errf(err, KC_TOO_LARGE, "the body is over the limit of %llu bytes",
                  (unsigned long long)body_limit(r));
  } else if (r->op->body == KCD_BODY_STREAM) {
    e = r->op->data(r, p, n, err);
  } else {
    e = append_json(r, p, n, err);
  }
  if (!e)
    return MHD_YES;
  kcd_set_early(r, e, "%s", err);
  r->discard = 1;
  r->drop_from = r->bytes_in;
  return drop(r);
}

static int last_call(kcd_req *r) {
  if (r->early)
    return kcd_reply_early(r);
  return r->op->finish(r);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn,
                                  const char *url, const char *method,
                                  const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
  kcd_req *r = *con_cls;
  if (!r) {
    r = req_new(cls, conn, url, method);
    if (!r)
      return MHD_NO;
    *con_cls = r;
    return (enum MHD_Result)first_call(r, method, version);
  }
  size_t n = *upload_data_size;
  *upload_data_size = 0;
  if (n)
    kcd_conn_body_bytes(conn_of(conn), n);
  else
    kcd_conn_body_end(conn_of(conn)); /* all in; the answer may be slow */
  if (r->queued)
    return MHD_YES;
  if (n)
    return (enum MHD_Result)body_piece(r, upload_data, n);
  return (enum MHD_Result)last_call(r);
}

/* Accepted connections are served unless kcd_http_quiesce was called. On
 * the main port, with --max-connections-per-ip on, an address is also
 * turned away once it holds half of the slots still free (conns.c): a few
 * addresses that reconnect as fast as they are cut cannot take them all. */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr,
                                 socklen_t len) {
  const kcd_state *st = cls;
  (void)len;
  if (atomic_load(&st->http->quiesced))
    return MHD_NO;
  if (st->cfg.max_conns_per_ip &&
      !kcd_conns_admit(st->http->conns, addr, st->cfg.max_conns))
    return MHD_NO;
  return MHD_YES;
}

static enum MHD_Result on_accept_health(void *cls, const struct sockaddr *addr,
                                        socklen_t len) {
  const kcd_state *st = cls;
  (void)addr;
  (void)len;
  return atomic_load(&st->http->quiesced) ? MHD_NO : MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  kcd_state *st = cls;
  kcd_req *r = *con_cls;
  kcd_conn *c = conn_of(conn);
  (void)toe;
  uint64_t now = kc_clock_mono_us(); /* one clock reading serves all below */
  kcd_conn_request_done(c, now);     /* the next headers' wait begins */
  if (!r)
    return;
  *con_cls = NULL;
  if (r->upload) {
    kc_store_upload_abort(r->upload); /* client gone mid-upload */
    atomic_fetch_add(&st->http->metrics.uploads_aborted, 1);
  }
  kc_store_read_end(r->read); /* the zero-copy response is sent (or dead) */
  int status = r->status ? r->status : 499; /* nginx's "client closed" */
  uint64_t us = now - r->t0_us;
  kcd_route_id id = r->rt ? r->rt->id : KCD_R_OTHER;
  kcd_http_observe(&st->http->metrics, id, r->method, status, r->bytes_in,
                   r->bytes_out, us);
  kcd_access a = {r->method_str, r->path, kcd_conn_remote(c),
                  r->token_name, status,  r->bytes_in,
                  r->bytes_out,  us,      now};
  kcd_log_access(st, &a);
  kcd_svc_end(st, KCD_FE_HTTP);
  req_release(r);
}

/* ---- the daemon ---- */

/* Bounds the unsent bytes queued in each socket (not the window in flight,
 * so a long fat network still fills): a large blob then goes out in pieces
 * that are still in cache when the kernel copies them, instead of 4 MiB
 * sends from cold memory. 16 MiB GETs on loopback: 1.1 GB/s without it,
 * 1.9 GB/s with it (measured); 4 KiB GETs are unchanged. */
static void on_connection(void *cls, struct MHD_Connection *conn,
                          void **socket_ctx,
                          enum MHD_ConnectionNotificationCode code) {
  kcd_state *st = cls;
  if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
    kcd_conn_close(st->http->conns, *socket_ctx);
    *socket_ctx = NULL;
    return;
  }
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  int lowat = NOTSENT_LOWAT;
  if (!ci)
    return;
  setsockopt(ci->connect_fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat,
             sizeof lowat);
  const union MHD_ConnectionInfo *di =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_DAEMON);
  int main_port =
      !di || !st->http->mhd_health || di->daemon != st->http->mhd_health;
  *socket_ctx = kcd_conn_open(st->http->conns, ci->connect_fd, main_port);
}

/* MHD's URI log callback: the request line is in, its target still raw
 * (the access handler gets it decoded, cut at a %00); framing.c checks it
 * (kcd_framing_check). Returns the request's first con_cls: none. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn) {
  (void)cls;
  size_t len = uri ? strlen(uri) : 0;
  kcd_conn_set_target(conn_of(conn), uri, len,
                      uri ? kcd_framing_target_flaw(uri, len) : 0);
  return NULL;
}

/* MHD's own unescaping, skipped for the targets with nothing to decode (a
 * digest's path): it walks them a byte at a time. */
static size_t unescape(void *cls, struct MHD_Connection *conn, char *s) {
  (void)cls, (void)conn;
  return strchr(s, '%') ? MHD_http_unescape(s) : strlen(s);
}

static void mhd_logger(void *cls, const char *fmt, va_list ap) {
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  size_t n = strlen(msg);
  while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
    msg[--n] = '\0';
  /* names the port argument (0), not the address: listen_err says it */
  if (strncmp(msg, "Failed to bind to port", 22) == 0)
    return;
  kcd_log(cls, "mhd", "%s", msg);
}

/* Why a daemon could not listen on ai, as "127.0.0.1:8080: address already
 * in use (--listen)": the bind tried again here, for its errno. */
static kc_err listen_err(const char *flag, const char *host, unsigned port,
                         const struct addrinfo *ai, char *err) {
  int en = 0, one = 1;
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    en = errno;
  } else {
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); /* as MHD */
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0)
      en = errno;
    close(fd);
  }
  char addr[300], why[128];
  snprintf(addr, sizeof addr, strchr(host, ':') ? "[%s]:%u" : "%s:%u", host,
           port);
  if (!en)
    return kc_errf(err, KC_IO,
                   "cannot serve on %s (--%s; see the mhd line "
                   "above)",
                   addr, flag);
  snprintf(why, sizeof why, "%s", strerror(en));
  why[0] = (char)tolower((unsigned char)why[0]);
  return kc_errf(err, KC_IO, "%s: %s (--%s)", addr, why, flag);
}

static kc_err resolve(const char *flag, const char *host, unsigned port_no,
                      struct addrinfo **out, char *err) {
  struct addrinfo hints = {.ai_flags = AI_PASSIVE | AI_NUMERICSERV,
                           .ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM};
  char port[16];
  snprintf(port, sizeof port, "%u", port_no);
  int rc = getaddrinfo(host, port, &hints, out);
  if (rc)
    return kc_errf(err, KC_EINVAL, "--%s %s: %s", flag, host, gai_strerror(rc));
  return KC_OK;
}

static unsigned daemon_flags(const kcd_state *st, int family) {
  unsigned f = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ITC |
               MHD_USE_ERROR_LOG | MHD_USE_TURBO;
  if (family == AF_INET6)
    f |= MHD_USE_IPv6;
  if (st->tls_cert_pem)
    f |= MHD_USE_TLS;
  return f;
}

static void fill_options(kcd_state *st, const struct sockaddr *addr,
                         struct MHD_OptionItem *o) {
  const kcd_config *c = &st->cfg;
  size_t n = 0;
  /* The logger first, or MHD prints what comes before it on its own. */
  o[n++] = (struct MHD_OptionItem){MHD_OPTION_EXTERNAL_LOGGER,
                                   (intptr_t)mhd_logger, st};
  o[n++] = (struct MHD_OptionItem){MHD_OPTION_SOCK_ADDR, 0, (void *)addr};
  o[n++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_CONNECTION,
                                   (intptr_t)on_connection, st};
  o[n++] = (struct MHD_OptionItem){MHD_OPTION_URI_LOG_CALLBACK,
                                   (intptr_t)on_uri, st};
  o[n++] = (struct MHD_OptionItem){MHD_OPTION_UNESCAPE_CALLBACK,
                                   (intptr_t)unescape, NULL};
  o[n++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_COMPLETED,
                                   (intptr_t)on_completed, st};
  o[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_TIMEOUT,
                                   (intptr_t)c->timeout_s, NULL};
  o[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_LIMIT,
                                   (intptr_t)c->max_conns, NULL};
  o[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                                   (intptr_t)CONN_MEMORY, NULL};
  o[n++] = (struct MHD_OptionItem){MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024, NULL};
  if (c->max_conns_per_ip)
    o[n++] = (struct MHD_OptionItem){MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                                     (intptr_t)c->max_conns_per_ip, NULL};
  if (c->threads > 1)
    o[n++] = (struct MHD_OptionItem){MHD_OPTION_THREAD_POOL_SIZE,
                                     (intptr_t)c->threads, NULL};
  if (st->tls_cert_pem) {
    o[n++] =
        (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, st->tls_cert_pem};
    o[n++] =
        (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, st->tls_key_pem};
  }
  o[n] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
}

/* --health-listen: a daemon of its own (one thread, a few connections),
 * so that probes are answered while the main one is full; req_begin lets
 * only the probe routes through on it. One address holds at most
 * HEALTH_PER_IP of its connections, and each is closed after its answer
 * (reply.c: Connection: close), so kept-alive clients cannot hold them;
 * half-open requests from many addresses cannot either (conns.c cuts the
 * oldest waiting one when few slots are left). */
#define HEALTH_CONNS 32
#define HEALTH_PER_IP 4

static void fill_health_options(kcd_state *st, const struct sockaddr *addr,
                                struct MHD_OptionItem *o) {
  fill_options(st, addr, o); /* then trimmed to what a probe needs */
  size_t n = 0;
  for (size_t i = 0; o[i].option != MHD_OPTION_END; i++) {
    if (o[i].option == MHD_OPTION_THREAD_POOL_SIZE ||
        o[i].option == MHD_OPTION_PER_IP_CONNECTION_LIMIT)
      continue;
    if (o[i].option == MHD_OPTION_CONNECTION_LIMIT)
      o[i].value = HEALTH_CONNS;
    o[n++] = o[i];
  }
  o[n++] = (struct MHD_OptionItem){MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                                   HEALTH_PER_IP, NULL};
  o[n] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
}

static kc_err start_health(kcd_state *st, char *err) {
  const kcd_config *c = &st->cfg;
  if (!c->health_host[0])
    return KC_OK;
  struct addrinfo *ai = NULL;
  kc_err e = resolve("health-listen", c->health_host, c->health_port, &ai, err);
  if (e)
    return e;
  struct MHD_OptionItem opts[20];
  fill_health_options(st, ai->ai_addr, opts);
  kcd_conns_probe_limit(st->http->conns, HEALTH_CONNS);
  st->http->mhd_health =
      MHD_start_daemon(daemon_flags(st, ai->ai_family), 0, on_accept_health, st,
                       on_request, st, MHD_OPTION_ARRAY, opts, MHD_OPTION_END);
  if (!st->http->mhd_health)
    e = listen_err("health-listen", c->health_host, c->health_port, ai, err);
  freeaddrinfo(ai);
  if (e)
    return e;
  const union MHD_DaemonInfo *di =
      MHD_get_daemon_info(st->http->mhd_health, MHD_DAEMON_INFO_BIND_PORT);
  kcd_log(st, "info", "probes (/healthz, /readyz, /metrics) also on %s:%u",
          c->health_host, di ? di->port : c->health_port);
  return KC_OK;
}

void kcd_http_sweep(kcd_state *st) {
  const kcd_config *c = &st->cfg;
  if (!st->http)
    return;
  kcd_sweep w = {.header_us = (uint64_t)c->header_timeout_s * 1000000u,
                 .body_window_us = (uint64_t)c->timeout_s * 1000000u,
                 .body_min_rate = c->min_body_rate};
  kcd_conns_sweep(st->http->conns, kc_clock_mono_us(), &w);
  atomic_fetch_add(&st->http->metrics.cut_header_timeout, w.closed_headers);
  atomic_fetch_add(&st->http->metrics.cut_slow_body, w.closed_body);
  if (w.closed_headers)
    kcd_log(st, "warn",
            "closed %zu connections whose request headers were "
            "not complete within --header-timeout %u s",
            w.closed_headers, c->header_timeout_s);
  if (w.refused_length)
    kcd_log(st, "warn",
            "answered %zu requests with a malformed or too large "
            "Content-Length (400 or 413) and closed their connections",
            w.refused_length);
  if (w.cut_probe)
    kcd_log(st, "warn",
            "closed %zu probe-port connections waiting for their request's "
            "headers to keep its slots for probes",
            w.cut_probe);
  if (w.closed_body)
    kcd_log(st, "warn",
            "closed %zu connections whose request body came "
            "slower than --min-body-rate %llu bytes/s over %u s",
            w.closed_body, (unsigned long long)c->min_body_rate, c->timeout_s);
}

/* HTTP's state: connections, loans, the decoded cache, its counters, and
 * its status table, registered with the core. */
static kcd_http *http_new(kcd_state *st) {
  kcd_http *h = calloc(1, sizeof *h);
  if (!h || !(h->conns = kcd_conns_new())) {
    free(h);
    return NULL;
  }
  h->st = st;
  h->dcache = kcd_dcache_new(st->cfg.decoded_cache); /* NULL: off */
  h->status = (kcd_status){.self = h,
                           .metrics = kcd_http_metrics_render,
                           .history = kcd_http_history};
  st->http = h;
  if (!(h->loans = kcd_loans_new(st)))
    kcd_log(st, "warn", "no thread for blob loans: large GETs are copied");
  kcd_conns_scan_raw(h->conns, !st->tls_cert_pem);
  kcd_status_register(st, KCD_FE_HTTP, &h->status);
  return h;
}

kc_err kcd_http_start(kcd_state *st, unsigned *port, char *err) {
  if (!st->http && !http_new(st))
    return kc_errf(err, KC_NOMEM, "out of memory");
  struct addrinfo *ai = NULL;
  kc_err e = resolve("listen", st->cfg.host, st->cfg.port, &ai, err);
  if (e)
    return e;
  struct MHD_OptionItem opts[20];
  fill_options(st, ai->ai_addr, opts);
  st->http->mhd =
      MHD_start_daemon(daemon_flags(st, ai->ai_family), 0, on_accept, st,
                       on_request, st, MHD_OPTION_ARRAY, opts, MHD_OPTION_END);
  if (!st->http->mhd)
    e = listen_err("listen", st->cfg.host, st->cfg.port, ai, err);
  freeaddrinfo(ai);
  if (e)
    return e;
  const union MHD_DaemonInfo *di =
      MHD_get_daemon_info(st->http->mhd, MHD_DAEMON_INFO_BIND_PORT);
  *port = di ? di->port : st->cfg.port;
  return start_health(st, err);
}

/* MHD_quiesce_daemon is not used: with epoll and a thread pool it races a
 * worker removing the same listen socket from its epoll set, and
 * libmicrohttpd 0.9.75 then aborts the process ("Failed to remove listen
 * FD from epoll set", an open upstream defect; CI met it). Instead both
 * listeners keep their sockets until kcd_http_stop and close every
 * connection accepted from now on, unserved: to a client (and to a probe
 * of a stopping kcached) that is a server not there, as a refusal is. */
void kcd_http_quiesce(kcd_state *st) {
  if (st->http)
    atomic_store(&st->http->quiesced, 1);
}

void kcd_http_stop(kcd_state *st) {
  kcd_http *h = st->http;
  if (!h)
    return;
  kcd_status_unregister(st, KCD_FE_HTTP);
  if (h->mhd)
    MHD_stop_daemon(h->mhd);
  if (h->mhd_health)
    MHD_stop_daemon(h->mhd_health);
  kcd_conns_free(h->conns);   /* every connection is closed now */
  kcd_loans_free(h->loans);   /* and every response freed */
  kcd_dcache_free(h->dcache); /* no answer holds an entry */
  st->http = NULL;
  free(h);
}

int kcd_tls_supported(void) {
  return MHD_is_feature_supported(MHD_FEATURE_TLS) == MHD_YES;
}
