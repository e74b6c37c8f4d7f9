/* conns.c: every open connection of kcached's HTTP daemons, for the limit
 * libmicrohttpd 0.9.75 lacks: a deadline for a request's headers
 * (--header-timeout).
 *
 * MHD's --timeout is an inactivity timer: any byte restarts it, so a client
 * that sends one header line every few seconds holds its connection (and a
 * slot of --max-connections) for ever. Shortening it per connection
 * (MHD_set_connection_option) does not help for the same reason. So each
 * connection records when it began waiting for a request's headers (its
 * accept, or the end of the previous request on a kept-alive connection);
 * http.c clears that when the headers are complete (the access handler's
 * first call), and the maintenance tick (main.c, once a second) shuts down
 * the socket of every connection still waiting past the deadline. MHD then
 * sees the socket end and closes the connection in its own thread.
 *
 * A body has the same problem (a byte every --timeout - 1 s keeps it), so
 * while one is read the tick also checks, once per --timeout window, that
 * it brought at least --min-body-rate bytes a second over the window.
 *
 * It also keeps room for new client addresses on the main port (with
 * --max-connections-per-ip on): an address is admitted while it holds less
 * than half of the slots still free (kcd_conns_admit), so addresses that
 * reconnect as fast as they are cut can each take a shrinking share but
 * never the last slots, and a new address always finds one.
 *
 * The probe port (--health-listen) keeps room the other way: its few slots
 * go to whoever connects, and a probe sends its request at once, so when a
 * new connection leaves fewer than PROBE_SPARE of them free, the one that
 * has waited longest for its request's headers is cut. Half-open requests
 * from any number of addresses then only ever cut each other, and a probe
 * from a new address is accepted and answered.
 *
 * The list's lock makes the shutdown safe: MHD tells us a connection closed
 * (kcd_conn_close, from MHD_CONNECTION_NOTIFY_CLOSED) before it closes the
 * descriptor, so a descriptor found in the list under the lock is still this
 * connection's and cannot have been reused. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http.h"

#define PROBE_SPARE 4 /* probe-port slots kept free (kcd_conns_probe_limit) */

/* The fields below are written by the connection's thread and read by the
 * tick's sweep, each on its own: no order between them is needed, so the
 * per-request stores are relaxed (a seq_cst store is a full barrier). */
#define STORE(a, v) atomic_store_explicit((a), (v), memory_order_relaxed)
#define LOAD(a) atomic_load_explicit((a), memory_order_relaxed)

struct kcd_conn {
  kcd_conn *prev, *next;
  int fd;
  _Atomic uint64_t waiting_since_us; /* 0: not waiting for headers */
  const char *target;                /* kcd_conn_set_target: the raw */
  size_t target_len;                 /* target, only on the connection's */
  int target_flaw;                   /* thread */
  _Atomic uint64_t body_since_us;    /* this body window began; 0: no body */
  _Atomic uint64_t body_bytes;       /* body bytes in this window */
  char remote[INET6_ADDRSTRLEN];     /* the peer's address, for the log */
  unsigned char addr[16];            /* and as a key (IPv4 mapped) */
  int counted;                       /* in the main port's counts */
  int addr_counted; /* and in its address's (kcd_addrs_add had memory) */
  kcd_scan scan;    /* the received bytes' framing */
  int scanned;      /* its bytes are scanned (plain HTTP) */
};

struct kcd_conns {
  pthread_mutex_t lock;
  kcd_conn *head;
  size_t n_counted; /* main-port connections */
  size_t n_probe;   /* probe-port ones */
  size_t probe_max; /* the probe port's slots; 0: none cut */
  kcd_addrs *addrs; /* main-port connections per address */
  int scan_raw;     /* plain HTTP: scan received bytes */
};

static _Atomic size_t probe_cut; /* probe_make_room's, for the sweep's log */

/* Scanning starts at accept, where the first header block does, and the
 * scanner follows the requests from there (framing.c); not for TLS: its
 * bytes are ciphertext. */
static void scan_arm(kcd_conn *c, int on) {
  memset(&c->scan, 0, sizeof c->scan);
  c->scan.on = on;
}

void kcd_conns_scan_raw(kcd_conns *l, int on) {
  l->scan_raw = on && kcd_recv_init();
}

kcd_conns *kcd_conns_new(void) {
  kcd_conns *l = calloc(1, sizeof *l);
  if (l && !(l->addrs = kcd_addrs_new())) {
    free(l);
    return NULL;
  }
  if (l && pthread_mutex_init(&l->lock, NULL)) {
    kcd_addrs_free(l->addrs);
    free(l);
    return NULL;
  }
  return l;
}

void kcd_conns_free(kcd_conns *l) {
  if (!l)
    return;
  while (l->head) /* none left once the daemons stopped; just in case */
    kcd_conn_close(l, l->head);
  kcd_addrs_free(l->addrs);
  pthread_mutex_destroy(&l->lock);
  free(l);
}

/* Once per connection, not per request's log line. */
static void remote_of(int fd, char *out, size_t cap, unsigned char key[16]) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0)
    ss.ss_family = AF_UNSPEC;
  kcd_addr_key((const struct sockaddr *)&ss, key, out, cap);
}

int kcd_conns_admit(kcd_conns *l, const struct sockaddr *sa,
                    unsigned max_conns) {
  unsigned char key[16];
  if (!l || !kcd_addr_key(sa, key, NULL, 0))
    return 1;
  pthread_mutex_lock(&l->lock);
  size_t held = kcd_addrs_count(l->addrs, key);
  size_t free_slots = max_conns > l->n_counted ? max_conns - l->n_counted : 0;
  pthread_mutex_unlock(&l->lock);
  /* none free: MHD refuses it anyway (--max-connections) */
  return free_slots == 0 || 2 * held < free_slots;
}

void kcd_conns_probe_limit(kcd_conns *l, size_t slots) { l->probe_max = slots; }

/* Under the lock: when the probe port has fewer than PROBE_SPARE slots
 * free, shuts down the probe connection (not c) that has waited longest
 * for its request's headers; MHD then closes it in its thread. */
static void probe_make_room(kcd_conns *l, const kcd_conn *c) {
  if (!l->probe_max || l->n_probe + PROBE_SPARE < l->probe_max)
    return;
  kcd_conn *oldest = NULL;
  uint64_t since_oldest = 0;
  for (kcd_conn *o = l->head; o; o = o->next) {
    uint64_t since = LOAD(&o->waiting_since_us);
    if (o == c || o->counted || since == 0)
      continue;
    if (!oldest || since < since_oldest)
      oldest = o, since_oldest = since;
  }
  if (!oldest)
    return;
  STORE(&oldest->waiting_since_us, 0); /* once: MHD closes it soon */
  shutdown(oldest->fd, SHUT_RDWR);
  atomic_fetch_add_explicit(&probe_cut, 1, memory_order_relaxed);
}

const char *kcd_conn_remote(const kcd_conn *c) { return c ? c->remote : "-"; }

kcd_conn *kcd_conn_open(kcd_conns *l, int fd, int counted) {
  kcd_conn *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->fd = fd;
  c->counted = counted;
  remote_of(fd, c->remote, sizeof c->remote, c->addr);
  STORE(&c->waiting_since_us, kc_clock_mono_us());
  c->scanned = l->scan_raw;
  scan_arm(c, c->scanned);
  if (c->scanned)
    kcd_recv_scan(fd, &c->scan);
  pthread_mutex_lock(&l->lock);
  if (counted) {
    /* no memory: the address is not counted, and so not uncounted at
     * close (that would lower another connection's count) */
    c->addr_counted = kcd_addrs_add(l->addrs, c->addr) == 0;
    l->n_counted++;
  } else {
    l->n_probe++;
    probe_make_room(l, c);
  }
  c->next = l->head;
  if (l->head)
    l->head->prev = c;
  l->head = c;
  pthread_mutex_unlock(&l->lock);
  return c;
}

void kcd_conn_close(kcd_conns *l, kcd_conn *c) {
  if (!c)
    return;
  if (c->scanned)
    kcd_recv_scan(c->fd, NULL);
  pthread_mutex_lock(&l->lock);
  if (c->addr_counted)
    kcd_addrs_sub(l->addrs, c->addr);
  if (c->counted)
    l->n_counted--;
  else
    l->n_probe--;
  if (c->prev)
    c->prev->next = c->next;
  else
    l->head = c->next;
  if (c->next)
    c->next->prev = c->prev;
  pthread_mutex_unlock(&l->lock);
  free(c);
}

void kcd_conn_headers_done(kcd_conn *c) {
  if (!c)
    return;
  STORE(&c->waiting_since_us, 0);
}

void kcd_conn_request_done(kcd_conn *c, uint64_t now_us) {
  if (!c)
    return;
  STORE(&c->body_since_us, 0);
  STORE(&c->waiting_since_us, now_us);
}

void kcd_conn_body_begin(kcd_conn *c) {
  if (!c)
    return;
  STORE(&c->body_bytes, 0);
  STORE(&c->body_since_us, kc_clock_mono_us());
}

void kcd_conn_body_end(kcd_conn *c) {
  if (c)
    STORE(&c->body_since_us, 0);
}

void kcd_conn_body_bytes(kcd_conn *c, size_t n) {
  if (c)
    atomic_fetch_add_explicit(&c->body_bytes, n, memory_order_relaxed);
}

void kcd_conn_set_target(kcd_conn *c, const char *target, size_t len,
                         int flaw) {
  if (!c)
    return;
  c->target = target;
  c->target_len = len;
  c->target_flaw = flaw;
}

const char *kcd_conn_target(const kcd_conn *c, size_t *len, int *flaw) {
  *len = c ? c->target_len : 0;
  *flaw = c ? c->target_flaw : 0;
  return c ? c->target : NULL;
}

/* Whether c has waited for headers past the deadline. */
static int headers_late(kcd_conn *c, uint64_t now, const kcd_sweep *w) {
  uint64_t since = LOAD(&c->waiting_since_us);
  if (since == 0 || now < since || now - since < w->header_us)
    return 0;
  STORE(&c->waiting_since_us, 0); /* once: MHD closes it soon */
  return 1;
}

/* Whether c's body brought less than the minimum over a window that ended;
 * a window that ended well starts the next one. The exchange fails when
 * the request ended meanwhile (body_since_us 0): nothing to judge. */
static int body_slow(kcd_conn *c, uint64_t now, const kcd_sweep *w) {
  uint64_t since = LOAD(&c->body_since_us);
  if (!w->body_min_rate || since == 0 || now < since ||
      now - since < w->body_window_us)
    return 0;
  uint64_t got = atomic_exchange(&c->body_bytes, 0);
  uint64_t want = w->body_min_rate * ((now - since) / 1000000u);
  uint64_t next = got < want ? 0 : now;
  return atomic_compare_exchange_strong(&c->body_since_us, &since, next) &&
         got < want;
}

void kcd_conns_sweep(kcd_conns *l, uint64_t now_us, kcd_sweep *w) {
  w->closed_headers = w->closed_body = 0;
  w->refused_length = kcd_recv_refused_take();
  w->cut_probe = atomic_exchange(&probe_cut, 0);
  pthread_mutex_lock(&l->lock);
  for (kcd_conn *c = l->head; c; c = c->next) {
    int late = headers_late(c, now_us, w);
    int slow = !late && body_slow(c, now_us, w);
    if (!late && !slow)
      continue;
    shutdown(c->fd, SHUT_RDWR);
    w->closed_headers += (size_t)late;
    w->closed_body += (size_t)slow;
  }
  pthread_mutex_unlock(&l->lock);
}
