/* history.c: the last hour of kcached's counters in 10-second slots, a ring
 * buffer in memory (GET /v1/stats/history, the page's charts). The main
 * thread's once-a-second tick adds what each cumulative counter moved since
 * the previous tick to the slot of now; readers copy the complete slots
 * under the mutex. Nothing is kept across a restart. */
#include <stdlib.h>
#include <string.h>

#include "kcd.h"

typedef struct kcd_history {
  pthread_mutex_t mu;
  int64_t slot_t[KCD_HIST_SLOTS]; /* the slot's start; 0: empty */
  uint64_t v[KCD_HIST_SLOTS][KCD_H_N];
  uint64_t last[KCD_H_N]; /* the cumulative values at the last tick */
  int primed;             /* last[] holds a first reading */
} kcd_history;

static const char *const names[KCD_H_N] = {
    [KCD_H_REQUESTS] = "requests",   [KCD_H_HITS] = "hits",
    [KCD_H_MISSES] = "misses",       [KCD_H_BYTES_OUT] = "bytes_out",
    [KCD_H_EVICTIONS] = "evictions", [KCD_H_RESP] = "resp_commands"};

const char *kcd_hist_name(kcd_hist_counter c) {
  return (unsigned)c < KCD_H_N ? names[c] : "?";
}

/* The cumulative counters now: the store's (they stay at their last
 * reading while it is closed) and the front ends' (their status tables). */
static void read_counters(kcd_state *st, const uint64_t *last, uint64_t *v) {
  memcpy(v, last, KCD_H_N * sizeof *v);
  kc_store *s = kcd_store(st);
  kc_store_stats ss;
  if (s && kc_store_stats_get(s, &ss) == KC_OK) {
    v[KCD_H_HITS] = ss.hits;
    v[KCD_H_MISSES] = ss.misses;
    v[KCD_H_EVICTIONS] = ss.evicted_bundles + ss.evicted_blobs + ss.evicted_kv;
  }
  kcd_status_history(st, v);
}

static kcd_history *history_of(kcd_state *st) {
  kcd_history *h = atomic_load(&st->history);
  if (h)
    return h;
  if (!(h = calloc(1, sizeof *h)))
    return NULL;
  if (pthread_mutex_init(&h->mu, NULL)) {
    free(h);
    return NULL;
  }
  atomic_store(&st->history, h);
  return h;
}

void kcd_history_tick(kcd_state *st, int64_t now) {
  kcd_history *h = history_of(st);
  if (!h)
    return;
  uint64_t cur[KCD_H_N];
  read_counters(st, h->last, cur);
  int64_t t = now - now % KCD_HIST_STEP_S;
  size_t i = (size_t)(t / KCD_HIST_STEP_S) % KCD_HIST_SLOTS;
  pthread_mutex_lock(&h->mu);
  if (h->slot_t[i] != t) { /* a slot of an hour ago, or never used */
    h->slot_t[i] = t;
    memset(h->v[i], 0, sizeof h->v[i]);
  }
  for (int c = 0; c < KCD_H_N && h->primed; c++)
    /* a counter that went back (the store reopened) starts again */
    h->v[i][c] += cur[c] >= h->last[c] ? cur[c] - h->last[c] : cur[c];
  memcpy(h->last, cur, sizeof cur);
  h->primed = 1;
  pthread_mutex_unlock(&h->mu);
}

size_t kcd_history_read(kcd_state *st, int64_t now, int64_t *t,
                        uint64_t (*v)[KCD_H_N]) {
  kcd_history *h = atomic_load(&st->history);
  if (!h)
    return 0;
  int64_t cur = now - now % KCD_HIST_STEP_S;
  size_t n = 0;
  pthread_mutex_lock(&h->mu);
  /* oldest first: the slot after the current one is the oldest */
  for (int64_t s = cur - (KCD_HIST_SLOTS - 1) * KCD_HIST_STEP_S; s < cur;
       s += KCD_HIST_STEP_S) {
    size_t i = (size_t)(s / KCD_HIST_STEP_S) % KCD_HIST_SLOTS;
    if (s <= 0 || h->slot_t[i] != s)
      continue;
    t[n] = s;
    memcpy(v[n], h->v[i], sizeof v[n]);
    n++;
  }
  pthread_mutex_unlock(&h->mu);
  return n;
}

void kcd_history_free(kcd_state *st) {
  kcd_history *h = atomic_exchange(&st->history, NULL);
  if (!h)
    return;
  pthread_mutex_destroy(&h->mu);
  free(h);
}
