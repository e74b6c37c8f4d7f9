/* decoded_cache.c: blobs held zstd-compressed, kept decoded in memory for
 * the clients that do not take frames (curl, wget, urllib), so that a hot
 * blob is decoded once and then answered from memory.
 *
 * Keyed by digest, least recently used first out, one mutex (what is done
 * under it is a table probe and a list move). Entries are refcounted: an
 * answer holds a reference until libmicrohttpd is done with it, so an
 * entry dropped from the table while it is sent lives on until then. Every
 * live entry counts in `bytes`, those in the table and those only answers
 * hold, so the cache's memory never passes its budget: when the entries
 * that can be dropped do not make room, a new one is not made (the GET is
 * answered as without a cache).
 *
 * An entry is filled by the one GET that made it (others asking meanwhile
 * are answered without the cache: no two decodes of one blob in memory)
 * and is visible only once its content hashed to its digest: the cache
 * never holds bytes other than the blob's, whatever happened to the frame.
 * Whether a blob is still held is the store's to say: a GET consults the
 * cache only after the store found the blob (so a deleted, evicted or
 * scrubbed blob is 404, cached or not). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"

struct kcd_dentry {
  kcd_dcache *c;
  struct kcd_dentry *hnext;       /* table chain */
  struct kcd_dentry *prev, *next; /* LRU list; NULL while filling */
  unsigned refs;                  /* under c->mu */
  int linked;                     /* in the table */
  int ready;                      /* filled and verified */
  size_t len;
  char digest[KC_HEX_LEN];
  unsigned char data[]; /* len bytes */
};

struct kcd_dcache {
  pthread_mutex_t mu;
  uint64_t budget, max_entry, bytes, entries;
  kcd_dentry **table;
  size_t nbuckets;         /* a power of two */
  kcd_dentry *head, *tail; /* most and least recently used */
  _Atomic uint64_t hits, misses, evictions;
};

#define ENTRY_COST(len) ((uint64_t)sizeof(kcd_dentry) + (uint64_t)(len))

/* Digests are uniform: their first 16 hex digits make the hash. */
static size_t bucket_of(const kcd_dcache *c, const char *digest) {
  uint64_t h = 0;
  for (int i = 0; i < 16; i++) {
    char ch = digest[i];
    h = h << 4 | (uint64_t)(ch <= '9' ? ch - '0' : (ch | 0x20) - 'a' + 10);
  }
  return (size_t)(h & (c->nbuckets - 1));
}

kcd_dcache *kcd_dcache_new(uint64_t budget) {
  if (!budget)
    return NULL;
  kcd_dcache *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  /* one bucket per 4 KiB of budget, 1024 to 2^20 */
  size_t n = 1024;
  while (n < (1u << 20) && (uint64_t)n * 4096 < budget)
    n <<= 1;
  c->table = calloc(n, sizeof *c->table);
  if (!c->table || pthread_mutex_init(&c->mu, NULL)) {
    free(c->table);
    free(c);
    return NULL;
  }
  c->nbuckets = n;
  c->budget = budget;
  /* one blob may take a quarter: a big one does not flush the rest */
  c->max_entry = budget / 4;
  return c;
}

void kcd_dcache_free(kcd_dcache *c) {
  if (!c)
    return;
  for (size_t i = 0; i < c->nbuckets; i++)
    for (kcd_dentry *e = c->table[i], *n; e; e = n) {
      n = e->hnext;
      free(e);
    }
  pthread_mutex_destroy(&c->mu);
  free(c->table);
  free(c);
}

static void lru_unlink(kcd_dcache *c, kcd_dentry *e) {
  if (e->prev)
    e->prev->next = e->next;
  else if (c->head == e)
    c->head = e->next;
  if (e->next)
    e->next->prev = e->prev;
  else if (c->tail == e)
    c->tail = e->prev;
  e->prev = e->next = NULL;
}

static void lru_push(kcd_dcache *c, kcd_dentry *e) {
  e->prev = NULL;
  e->next = c->head;
  if (c->head)
    c->head->prev = e;
  c->head = e;
  if (!c->tail)
    c->tail = e;
}

static kcd_dentry *find(kcd_dcache *c, const char *digest) {
  for (kcd_dentry *e = c->table[bucket_of(c, digest)]; e; e = e->hnext)
    if (memcmp(e->digest, digest, KC_HEX_LEN) == 0)
      return e;
  return NULL;
}

/* Under mu: frees e once nothing holds it, else the last release does. */
static void put_ref(kcd_dcache *c, kcd_dentry *e) {
  if (--e->refs || e->linked)
    return;
  c->bytes -= ENTRY_COST(e->len);
  free(e);
}

/* Under mu: out of the table and the list; freed when no answer holds it. */
static void unlink_entry(kcd_dcache *c, kcd_dentry *e) {
  kcd_dentry **p = &c->table[bucket_of(c, e->digest)];
  while (*p != e)
    p = &(*p)->hnext;
  *p = e->hnext;
  lru_unlink(c, e);
  e->linked = 0;
  c->entries--;
  e->refs++; /* put_ref's rule: freed at zero when unlinked */
  put_ref(c, e);
}

/* Under mu: drops least recently used entries until need more bytes fit;
 * whether they do. */
static int make_room(kcd_dcache *c, uint64_t need) {
  while (c->bytes + need > c->budget && c->tail) {
    unlink_entry(c, c->tail);
    atomic_fetch_add(&c->evictions, 1);
  }
  return c->bytes + need <= c->budget;
}

kcd_dcache_res kcd_dcache_get(kcd_dcache *c, const char *digest, uint64_t len,
                              kcd_dentry **out) {
  *out = NULL;
  if (!c)
    return KCD_DC_PASS;
  pthread_mutex_lock(&c->mu);
  kcd_dentry *e = find(c, digest);
  if (e && e->ready) {
    e->refs++;
    lru_unlink(c, e);
    lru_push(c, e);
    pthread_mutex_unlock(&c->mu);
    atomic_fetch_add(&c->hits, 1);
    *out = e;
    return KCD_DC_HIT;
  }
  if (len == KCD_DC_LOOK) { /* a look only: the caller comes back */
    pthread_mutex_unlock(&c->mu);
    return KCD_DC_PASS;
  }
  atomic_fetch_add(&c->misses, 1);
  /* being filled by another GET, too big, or no room */
  if (e || len > c->max_entry || !make_room(c, ENTRY_COST(len))) {
    pthread_mutex_unlock(&c->mu);
    return KCD_DC_PASS;
  }
  e = malloc(sizeof *e + (len ? (size_t)len : 1));
  if (!e) {
    pthread_mutex_unlock(&c->mu);
    return KCD_DC_PASS;
  }
  *e = (kcd_dentry){.c = c, .refs = 1, .linked = 1, .len = (size_t)len};
  memcpy(e->digest, digest, KC_HEX_LEN);
  size_t b = bucket_of(c, digest);
  e->hnext = c->table[b];
  c->table[b] = e;
  c->bytes += ENTRY_COST(len);
  c->entries++;
  pthread_mutex_unlock(&c->mu);
  *out = e;
  return KCD_DC_FILL;
}

void *kcd_dentry_data(kcd_dentry *e) { return e->data; }
size_t kcd_dentry_len(const kcd_dentry *e) { return e->len; }

void kcd_dcache_publish(kcd_dentry *e, int ok) {
  kcd_dcache *c = e->c;
  pthread_mutex_lock(&c->mu);
  if (ok && e->linked) {
    e->ready = 1;
    lru_push(c, e);
  } else if (e->linked) {
    unlink_entry(c, e);
  }
  pthread_mutex_unlock(&c->mu);
}

void kcd_dentry_release(void *entry) {
  kcd_dentry *e = entry;
  kcd_dcache *c = e->c;
  pthread_mutex_lock(&c->mu);
  put_ref(c, e);
  pthread_mutex_unlock(&c->mu);
}

void kcd_dcache_stats(kcd_dcache *c, kcd_dcache_stat *s) {
  memset(s, 0, sizeof *s);
  if (!c)
    return;
  pthread_mutex_lock(&c->mu);
  s->bytes = c->bytes;
  s->entries = c->entries;
  pthread_mutex_unlock(&c->mu);
  s->budget = c->budget;
  s->hits = atomic_load(&c->hits);
  s->misses = atomic_load(&c->misses);
  s->evictions = atomic_load(&c->evictions);
}
