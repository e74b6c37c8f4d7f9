/* reads.c: what the store knows of its reads (the open ones, oldest first,
 * and the ones LMDB's reader table refused), and chunked copies of a blob,
 * each in a read of its own.
 *
 * Why: a read transaction pins every page freed after it began; held for a
 * whole response to a slow client, it kept a full store from reusing them
 * and writes failed with 507 far below --max-bytes (issue 14). Large blobs
 * are therefore served by kc_store_blob_copy, one short read per piece, and
 * the age of the oldest read is exported so that a pinned map shows. */
#include <string.h>
#include "store_internal.h"
#include "tier.h" /* kcs_mono_ms */

/* Appended at the tail: the list stays in begin order, so the head is the
 * oldest read (t0 is taken before the lock, so ties may differ by the time
 * it takes to get it: microseconds). */
void kcs_read_link(kc_store *s, kc_store_read *r) {
  r->t0_ms = kcs_mono_ms();
  r->next = NULL;
  r->prev = s->open_tail;
  if (s->open_tail)
    s->open_tail->next = r;
  else
    s->open_head = r;
  s->open_tail = r;
  s->n_open++;
}

void kcs_read_unlink(kc_store *s, kc_store_read *r) {
  if (r->prev)
    r->prev->next = r->next;
  else
    s->open_head = r->next;
  if (r->next)
    r->next->prev = r->prev;
  else
    s->open_tail = r->prev;
  r->prev = r->next = NULL;
  s->n_open--;
}

void kc_store_read_stats_get(kc_store *s, kc_store_read_stats *out) {
  memset(out, 0, sizeof *out);
  uint64_t now = kcs_mono_ms();
  pthread_mutex_lock(&s->pool_lock);
  out->open = s->n_open;
  if (s->open_head && now > s->open_head->t0_ms)
    out->oldest_age_ms = now - s->open_head->t0_ms;
  pthread_mutex_unlock(&s->pool_lock);
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
