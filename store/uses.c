/* uses.c: the in-memory table of last uses and hits that readers fill, so a
 * GET never needs a write transaction; kc_store_flush writes it in one. */
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

#define USES_CAP0 1024

int kcs_uses_init(kcs_uses *u) {
  memset(u, 0, sizeof *u);
  pthread_mutex_init(&u->lock, NULL);
  u->cap = USES_CAP0;
  u->slots = calloc(u->cap, sizeof *u->slots);
  return u->slots ? 0 : -1;
}

void kcs_uses_destroy(kcs_uses *u) {
  pthread_mutex_destroy(&u->lock);
  free(u->slots);
  u->slots = NULL;
}

/* Keys are SHA-256 hex, uniformly spread: FNV-1a of a prefix is enough. */
static size_t home(const char *key, size_t cap) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < 16; i++)
    h = (h ^ (unsigned char)key[i]) * 1099511628211ull;
  return (size_t)h & (cap - 1);
}

static kcs_use *probe(kcs_use *slots, size_t cap, const char *key) {
  size_t i = home(key, cap);
  while (slots[i].used && memcmp(slots[i].key, key, KC_HEX_LEN) != 0)
    i = (i + 1) & (cap - 1);
  return &slots[i];
}

static int grow(kcs_uses *u) {
  size_t cap = u->cap * 2;
  kcs_use *slots = calloc(cap, sizeof *slots);
  if (!slots)
    return -1;
  for (size_t i = 0; i < u->cap; i++)
    if (u->slots[i].used)
      *probe(slots, cap, u->slots[i].key) = u->slots[i];
  free(u->slots);
  u->slots = slots;
  u->cap = cap;
  return 0;
}

void kcs_uses_record(kcs_uses *u, const char *key, int64_t now) {
  pthread_mutex_lock(&u->lock);
  /* Out of memory only loses a last-use record: advisory data. */
  int full = u->max_n && u->n >= u->max_n; /* at its bound: never grown */
  if (u->slots && (u->n + 1 <= u->cap / 2 || full || grow(u) == 0)) {
    kcs_use *s = probe(u->slots, u->cap, key);
    if (!s->used && full) {
      pthread_mutex_unlock(&u->lock); /* full: this key is not recorded */
      return;
    }
    if (!s->used) {
      memcpy(s->key, key, KC_HEX_LEN);
      s->used = 1;
      u->n++;
    }
    if (now > s->last_used)
      s->last_used = now;
    s->hits++;
  }
  pthread_mutex_unlock(&u->lock);
}

size_t kcs_uses_take(kcs_uses *u, kcs_use **out) {
  *out = NULL;
  size_t n = 0;
  pthread_mutex_lock(&u->lock);
  if (u->n && (*out = malloc(u->n * sizeof **out))) {
    for (size_t i = 0; i < u->cap; i++)
      if (u->slots[i].used)
        (*out)[n++] = u->slots[i];
    memset(u->slots, 0, u->cap * sizeof *u->slots);
    u->n = 0;
  }
  pthread_mutex_unlock(&u->lock);
  return n;
}

int64_t kcs_uses_last(kcs_uses *u, const char *key) {
  pthread_mutex_lock(&u->lock);
  const kcs_use *s = u->slots ? probe(u->slots, u->cap, key) : NULL;
  int64_t t = s && s->used ? s->last_used : 0;
  pthread_mutex_unlock(&u->lock);
  return t;
}

void kcs_uses_forget(kcs_uses *u, const char *key) {
  pthread_mutex_lock(&u->lock);
  kcs_use *s = u->slots ? probe(u->slots, u->cap, key) : NULL;
  if (s && s->used)
    s->last_used = 0; /* the slot stays (probing): pruned by the next flush */
  pthread_mutex_unlock(&u->lock);
}

/* Rebuilt under the lock, never emptied first: a reader asking whether a
 * key is marked (kcs_blob_touched, on a thread that evicts) must never see
 * a kept mark missing for a moment. Out of memory: nothing is pruned. */
void kcs_uses_prune(kcs_uses *u, int64_t before) {
  pthread_mutex_lock(&u->lock);
  size_t kept = 0;
  for (size_t i = 0; u->slots && i < u->cap; i++)
    kept += u->slots[i].used && u->slots[i].last_used >= before;
  /* nothing to prune: no new table (a rebuild a tick is needless churn) */
  kcs_use *slots =
      u->slots && kept < u->n ? calloc(u->cap, sizeof *slots) : NULL;
  if (slots) {
    size_t n = 0;
    for (size_t i = 0; i < u->cap; i++)
      if (u->slots[i].used && u->slots[i].last_used >= before) {
        *probe(slots, u->cap, u->slots[i].key) = u->slots[i];
        n++;
      }
    free(u->slots);
    u->slots = slots;
    u->n = n;
  }
  pthread_mutex_unlock(&u->lock);
}
