/* loans.c: large blobs sent from the store's pages without a copy
 * (kc_store_lend), and the thread that takes a loan back from a client that
 * is slow to read it.
 *
 * A GET of a large raw blob used to be copied out of LMDB's map piece by
 * piece (routes_blob.c, kc_store_blob_copy), so that no read was held at a
 * client's pace: a held read pins every page freed after it began, and a
 * full store then answers writes 507 far below --max-bytes. That copy was a
 * quarter of a 16 MiB GET's CPU. A loan sends the bytes where they are, and
 * its read is held only while the client keeps up: the reaper takes back a
 * loan older than LOAN_HOLD_MS, so a stalled client pins pages for at most
 * LOAN_HOLD_MS + LOAN_TICK_MS (plus the copy). Taking it back is a detach:
 * a private copy takes the pages' place, at the same address, and the read
 * ends.
 *
 * A GET that started ends with the whole body, so the memory of that copy
 * is set aside when the loan is made, not when it is taken back: a loan
 * takes its length from the answer budget (--max-answer-memory) and from
 * LOANS_RESERVE_MAX (a bound whatever the flag says, "no cap" included)
 * until its response is freed. When either refuses, no loan is made and the
 * blob is served in pieces from the start (routes_blob.c), which holds no
 * read and no copy of the blob. A fast client (16 MiB on loopback: about
 * 5 ms) gives the reservation back at once and costs no copy. A detach that
 * fails for memory leaves the loan holding its read (the bytes intact) and
 * is tried again at the next tick; only a swap that left a hole at the
 * address (lend.c: KC_IO, the kernel failed mremap and a mapping back) cuts
 * the connection: its client sees a short body, never other bytes.
 *
 * Only blobs up to LOAN_MAX_BYTES are lent, at most LOANS_HELD hold a read
 * at once, and none under TLS (gnutls copies the bytes anyway, and a failed
 * swap must not leave it a hole to read): the rest are served in pieces.
 * The reaper copies outside the registry's lock: a loan it works on is
 * marked busy, and its free waits for it. */
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "http.h"

/* Loans holding a read at once. */
#define LOANS_HELD 8
/* The largest blob lent: a detach copies at most this much. */
#define LOAN_MAX_BYTES (64u << 20)
/* Bytes lent at once, each loan counted whole (what detaching them all
 * would copy): a bound of its own, since --max-answer-memory may be 0. */
#define LOANS_RESERVE_MAX (256u << 20)
/* Then a loan's pages are copied and its read ends. */
#define LOAN_HOLD_MS 500
/* How often the reaper looks. */
#define LOAN_TICK_MS 100

typedef struct loan {
  kcd_loans *owner;
  kc_store_lent *lent;
  int fd;   /* the connection's socket, to cut it */
  int busy; /* the reaper is detaching it (outside the lock) */
  int cut;  /* shut down: no more tries */
  uint64_t t0_ms;
  size_t reserved; /* its length, set aside for its copy until freed */
  struct loan *prev, *next;
} loan;

struct kcd_loans {
  kcd_state *st;
  pthread_mutex_t lock;
  pthread_cond_t wake; /* the reaper: a loan was made, or stop */
  pthread_cond_t idle; /* a free: a busy loan is no longer */
  loan *head;
  unsigned held;     /* loans whose read is still held */
  uint64_t reserved; /* bytes of the loans alive (LOANS_RESERVE_MAX) */
  int stop;
  pthread_t reaper;
};

/* One loan taken back (busy, lock not held): detached into the memory its
 * loan set aside. A detach refused memory keeps the read (tried again at
 * the next tick); one that left a hole where the bytes were cuts. */
static void take_back(kcd_loans *ls, loan *l) {
  kc_err e = kc_store_lent_detach(l->lent);
  if (!e) {
    atomic_fetch_add(&ls->st->http->metrics.loans_detached, 1);
    return;
  }
  if (e == KC_NOMEM)
    return;
  /* The response is alive (its free waits for busy), so the socket is
   * still this connection's: libmicrohttpd closes it after the response. */
  shutdown(l->fd, SHUT_RDWR);
  l->cut = 1;
  atomic_fetch_add(&ls->st->http->metrics.loans_cut, 1);
}

/* Takes back the loans held longer than LOAN_HOLD_MS. */
static void reap(kcd_loans *ls) {
  loan *due[LOANS_HELD];
  size_t n = 0;
  uint64_t now = kc_clock_mono_ms();
  for (loan *l = ls->head; l && n < LOANS_HELD; l = l->next)
    if (kc_store_lent_held(l->lent) && !l->cut &&
        now - l->t0_ms >= LOAN_HOLD_MS) {
      l->busy = 1;
      due[n++] = l;
    }
  if (!n)
    return;
  pthread_mutex_unlock(&ls->lock);
  for (size_t i = 0; i < n; i++)
    take_back(ls, due[i]);
  pthread_mutex_lock(&ls->lock);
  for (size_t i = 0; i < n; i++) {
    if (!kc_store_lent_held(due[i]->lent))
      ls->held--;
    due[i]->busy = 0;
  }
  pthread_cond_broadcast(&ls->idle);
}

static void *reaper_main(void *arg) {
  kcd_loans *ls = arg;
  pthread_mutex_lock(&ls->lock);
  while (!ls->stop) {
    if (!ls->held) { /* nothing to watch: sleep until a loan is made */
      pthread_cond_wait(&ls->wake, &ls->lock);
      continue;
    }
    struct timespec ts =
        kc_clock_deadline(CLOCK_MONOTONIC, LOAN_TICK_MS * 1000u);
    pthread_cond_timedwait(&ls->wake, &ls->lock, &ts);
    reap(ls);
  }
  pthread_mutex_unlock(&ls->lock);
  return NULL;
}

kcd_loans *kcd_loans_new(kcd_state *st) {
  kcd_loans *ls = calloc(1, sizeof *ls);
  pthread_condattr_t ca;
  if (!ls)
    return NULL;
  ls->st = st;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  int ok = !pthread_mutex_init(&ls->lock, NULL) &&
           !pthread_cond_init(&ls->wake, &ca) &&
           !pthread_cond_init(&ls->idle, NULL) &&
           !pthread_create(&ls->reaper, NULL, reaper_main, ls);
  pthread_condattr_destroy(&ca);
  if (!ok) {
    free(ls);
    return NULL;
  }
  return ls;
}

/* After the HTTP daemon stopped: every response, so every loan, is freed. */
void kcd_loans_free(kcd_loans *ls) {
  if (!ls)
    return;
  pthread_mutex_lock(&ls->lock);
  ls->stop = 1;
  pthread_cond_signal(&ls->wake);
  pthread_mutex_unlock(&ls->lock);
  pthread_join(ls->reaper, NULL);
  pthread_cond_destroy(&ls->idle);
  pthread_cond_destroy(&ls->wake);
  pthread_mutex_destroy(&ls->lock);
  free(ls);
}

/* MHD freed the response (sent, or its connection closed). */
static void loan_free(void *cls) {
  loan *l = cls;
  kcd_loans *ls = l->owner;
  pthread_mutex_lock(&ls->lock);
  while (l->busy)
    pthread_cond_wait(&ls->idle, &ls->lock);
  if (l->prev)
    l->prev->next = l->next;
  else
    ls->head = l->next;
  if (l->next)
    l->next->prev = l->prev;
  if (kc_store_lent_held(l->lent))
    ls->held--;
  ls->reserved -= l->reserved;
  pthread_mutex_unlock(&ls->lock);
  kcd_answer_budget_give(ls->st, l->reserved);
  kc_store_lent_free(l->lent);
  free(l);
}

/* A loan of the read's len bytes at data, linked in, its copy's memory set
 * aside; NULL when none may be made now (the read is then still the
 * caller's). */
static loan *loan_make(kcd_loans *ls, kc_store_read *read, const void *data,
                       size_t len, int fd) {
  loan *l = calloc(1, sizeof *l);
  if (!l)
    return NULL;
  pthread_mutex_lock(&ls->lock);
  int room = ls->held < LOANS_HELD && ls->reserved + len <= LOANS_RESERVE_MAX;
  if (!room || !kcd_answer_budget_take(ls->st, len)) {
    pthread_mutex_unlock(&ls->lock);
    free(l);
    return NULL;
  }
  if (kc_store_lend(read, data, len, &l->lent)) {
    pthread_mutex_unlock(&ls->lock);
    kcd_answer_budget_give(ls->st, len);
    free(l);
    return NULL;
  }
  l->owner = ls;
  l->fd = fd;
  l->t0_ms = kc_clock_mono_ms();
  l->reserved = len;
  ls->reserved += len;
  l->next = ls->head;
  if (ls->head)
    ls->head->prev = l;
  ls->head = l;
  if (!ls->held++)
    pthread_cond_signal(&ls->wake);
  pthread_mutex_unlock(&ls->lock);
  return l;
}

/* The connection's socket; -1 when MHD does not say. */
static int conn_fd(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  return ci ? (int)ci->connect_fd : -1;
}

int kcd_reply_lent(kcd_req *r, const void *data, size_t len, const char *ctype,
                   const char *const *headers) {
  kcd_loans *ls = r->st->http->loans;
  int fd = conn_fd(r->conn);
  loan *l =
      ls && r->read && !r->st->tls_cert_pem && len <= LOAN_MAX_BYTES && fd >= 0
          ? loan_make(ls, r->read, data, len, fd)
          : NULL;
  if (!l)
    return -1;
  r->read = NULL; /* the loan's now */
  atomic_fetch_add(&r->st->http->metrics.loans, 1);
  return kcd_reply_held(r, ctype, kc_store_lent_bytes(l->lent), len, loan_free,
                        l, headers);
}
