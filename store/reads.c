/* reads.c: what the store knows of its reads (the open ones, oldest first,
 * and the ones LMDB's reader table refused), and chunked copies of a blob,
 * each in a read of its own.
 *
 * Why: a read transaction pins every page freed after it began; held for a
 * whole response to a slow client, it kept a full store from reusing them
 * and writes failed with 507 far below --max-bytes. Large blobs
 * are therefore served by kc_store_blob_copy, one short read per piece, and
 * the age of the oldest read is exported so that a pinned map shows. */
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include "store_internal.h"

kcs_shard *kcs_shard_mine(kc_store *s) {
  static atomic_uint next;
  static _Thread_local unsigned mine = UINT32_MAX;
  if (mine == UINT32_MAX)
    mine = atomic_fetch_add(&next, 1) % KCS_SHARDS;
  return &s->shards[mine];
}

/* The read's start for the age of the oldest read: whole milliseconds
 * compared with kc_clock_mono_ms (CLOCK_MONOTONIC too), so the coarse clock
 * (a tick or so behind, no TSC read) is enough. Deliberately not
 * kc_clock_mono_ms itself: every GET begins a read and would pay its
 * clock read. */
static uint64_t coarse_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Appended at the tail: each list stays in begin order, so its head is its
 * oldest read, and the oldest of the heads is the store's. */
void kcs_read_link(kcs_shard *sh, kc_store_read *r) {
  r->t0_ms = coarse_ms();
  r->shard = sh;
  r->next = NULL;
  r->prev = sh->open_tail;
  if (sh->open_tail)
    sh->open_tail->next = r;
  else
    sh->open_head = r;
  sh->open_tail = r;
  sh->n_open++;
}

void kcs_read_unlink(kcs_shard *sh, kc_store_read *r) {
  if (r->prev)
    r->prev->next = r->next;
  else
    sh->open_head = r->next;
  if (r->next)
    r->next->prev = r->prev;
  else
    sh->open_tail = r->prev;
  r->prev = r->next = NULL;
  sh->n_open--;
}

void kc_store_read_stats_get(kc_store *s, kc_store_read_stats *out) {
  memset(out, 0, sizeof *out);
  uint64_t now = (uint64_t)kc_clock_mono_ms(), oldest = 0;
  for (size_t i = 0; i < KCS_SHARDS; i++) {
    kcs_shard *sh = &s->shards[i];
    pthread_mutex_lock(&sh->lock);
    out->open += sh->n_open;
    if (sh->open_head && (!oldest || sh->open_head->t0_ms < oldest))
      oldest = sh->open_head->t0_ms;
    pthread_mutex_unlock(&sh->lock);
  }
  if (oldest && now > oldest)
    out->oldest_age_ms = now - oldest;
  out->readers_full = atomic_load(&s->readers_full);
  unsigned slots = 0; /* LMDB's count: it rounds the table up to a page */
  if (mdb_env_get_maxreaders(s->env, &slots) == 0)
    out->max_readers = slots;
}

kc_err kc_store_blob_copy(kc_store *s, const char *digest, uint64_t off,
                          void *buf, size_t cap, size_t *n, uint64_t *size) {
  *n = 0;
  kc_store_read *r;
  kc_err e = kc_store_read_begin(s, &r);
  if (e)
    return e;
  const void *data;
  size_t len;
  e = kc_store_blob_get(r, digest, &data, &len);
  if (!e && size)
    *size = len;
  if (!e && off <= len) {
    size_t take = len - (size_t)off < cap ? len - (size_t)off : cap;
    memcpy(buf, (const char *)data + off, take);
    *n = take;
  }
  kc_store_read_end(r);
  return e;
}
