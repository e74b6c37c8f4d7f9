/* resp_family.c: RESP reads counted per key family (the key's prefix
 * before its first ':'), for /metrics. A fixed table: the first
 * KCD_RESP_FAMILIES names seen are learned (first come, never forgotten),
 * every other key counts as "other". Lock-free: a new name claims a free
 * slot with a CAS, fills it and publishes it (release store), so /metrics,
 * on another thread, never reads a half-written name. Only the listener
 * thread counts today; were two threads to learn one name at the same
 * moment, it could take two slots (both counted, listed twice): harmless. */
#include <string.h>

#include "resp.h"

/* The family of a key: its length before ':', or -1 for "other" (no ':',
 * empty, too long, or bytes a Prometheus label should not carry). */
static long family_len(const char *k, size_t klen) {
  const char *colon =
      memchr(k, ':', klen < KCD_RESP_FAMILY_MAX ? klen : KCD_RESP_FAMILY_MAX);
  if (!colon || colon == k)
    return -1;
  for (const char *p = k; p < colon; p++)
    if (*p < '!' || *p > '~' || *p == '"' || *p == '\\')
      return -1;
  size_t n = (size_t)(colon - k);
  if (n == 5 && memcmp(k, "other", 5) == 0)
    return -1;
  return (long)n;
}

static void bump(kcd_resp_family *f, int hit) {
  atomic_fetch_add_explicit(hit ? &f->hits : &f->misses, 1,
                            memory_order_relaxed);
}

void kcd_resp_family_count(kcd_resp_families *t, const void *key, size_t klen,
                           int hit) {
  long n = family_len(key, klen);
  for (int i = 0; n >= 0 && i < KCD_RESP_FAMILIES; i++) {
    kcd_resp_family *f = &t->f[i];
    int st = atomic_load_explicit(&f->state, memory_order_acquire);
    if (st == 2 && f->len == (size_t)n && memcmp(f->name, key, (size_t)n) == 0)
      return bump(f, hit);
    if (st != 0)
      continue; /* another family, or one being filled */
    int zero = 0;
    if (!atomic_compare_exchange_strong(&f->state, &zero, 1))
      continue;
    memcpy(f->name, key, (size_t)n);
    f->len = (size_t)n;
    bump(f, hit);
    atomic_store_explicit(&f->state, 2, memory_order_release);
    return;
  }
  atomic_fetch_add_explicit(hit ? &t->other_hits : &t->other_misses, 1,
                            memory_order_relaxed);
}

void kcd_resp_family_each(kcd_resp_families *t,
                          void (*fn)(const char *name, size_t len,
                                     uint64_t hits, uint64_t misses, void *ud),
                          void *ud) {
  for (int i = 0; i < KCD_RESP_FAMILIES; i++) {
    kcd_resp_family *f = &t->f[i];
    if (atomic_load_explicit(&f->state, memory_order_acquire) == 2)
      fn(f->name, f->len, atomic_load(&f->hits), atomic_load(&f->misses), ud);
  }
  fn(NULL, 0, atomic_load(&t->other_hits), atomic_load(&t->other_misses), ud);
}
