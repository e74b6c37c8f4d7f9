/* lease.c: build leases, one builder per key across the fleet: an in-memory
 * table (chained hash, one mutex) with expiry by TTL. Leases are advisory and
 * die with the process: a restart just lets the next replica build. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "kcd.h"

#define N_SLOTS 1024 /* power of two */

typedef struct lease {
  struct lease *next;
  char key[KC_HEX_LEN + 1];
  char token[KCD_LEASE_TOKEN_LEN + 1];
  char holder[KCD_HOLDER_MAX + 1];
  uint64_t expires_ms;
} lease;

struct kcd_leases {
  pthread_mutex_t mu;
  lease *slots[N_SLOTS];
  size_t n, max;
};

kcd_leases *kcd_leases_new(size_t max) {
  kcd_leases *l = calloc(1, sizeof *l);
  if (!l)
    return NULL;
  if (pthread_mutex_init(&l->mu, NULL)) {
    free(l);
    return NULL;
  }
  l->max = max;
  return l;
}

void kcd_leases_free(kcd_leases *l) {
  if (!l)
    return;
  for (size_t i = 0; i < N_SLOTS; i++) {
    for (lease *e = l->slots[i], *next; e; e = next) {
      next = e->next;
      free(e);
    }
  }
  pthread_mutex_destroy(&l->mu);
  free(l);
}

/* Keys are SHA-256 hex (checked by the router): their digits are uniform. */
static size_t slot_of(const char *key) {
  unsigned char b[2] = {0, 0};
  (void)kc_hex_decode(key, 2, b);
  return ((size_t)b[0] << 8 | b[1]) & (N_SLOTS - 1);
}

/* The live lease of key, dropping an expired one on the way. */
static lease **find(kcd_leases *l, const char *key, uint64_t now_ms) {
  lease **pp = &l->slots[slot_of(key)];
  while (*pp) {
    lease *e = *pp;
    if (e->expires_ms <= now_ms) {
      *pp = e->next;
      free(e);
      l->n--;
      continue;
    }
    if (strcmp(e->key, key) == 0)
      return pp;
    pp = &e->next;
  }
  return pp;
}

static int new_token(char out[KCD_LEASE_TOKEN_LEN + 1]) {
  unsigned char raw[KCD_LEASE_TOKEN_LEN / 2];
  if (RAND_bytes(raw, sizeof raw) != 1)
    return -1;
  kc_hex_encode(raw, sizeof raw, out);
  return 0;
}

static kc_err grant(kcd_leases *l, lease **pp, const char *key,
                    const char *holder, uint64_t expires_ms,
                    kcd_lease_info *info) {
  if (l->n >= l->max)
    return KC_BUSY;
  lease *e = calloc(1, sizeof *e);
  if (!e)
    return KC_NOMEM;
  if (new_token(e->token)) {
    free(e);
    return KC_INTERNAL;
  }
  memcpy(e->key, key, KC_HEX_LEN);
  strncpy(e->holder, holder, KCD_HOLDER_MAX);
  e->expires_ms = expires_ms;
  *pp = e;
  l->n++;
  memcpy(info->token, e->token, sizeof info->token);
  return KC_OK;
}

kc_err kcd_lease_acquire(kcd_leases *l, const char *key, const char *holder,
                         uint64_t ttl_ms, uint64_t now_ms,
                         kcd_lease_info *info) {
  memset(info, 0, sizeof *info);
  pthread_mutex_lock(&l->mu);
  lease **pp = find(l, key, now_ms);
  kc_err e;
  if (*pp) {
    memcpy(info->holder, (*pp)->holder, sizeof info->holder);
    memcpy(info->token, (*pp)->token, sizeof info->token);
    info->remaining_ms = (*pp)->expires_ms - now_ms;
    e = KC_LEASED;
  } else {
    info->remaining_ms = ttl_ms;
    e = grant(l, pp, key, holder, now_ms + ttl_ms, info);
  }
  pthread_mutex_unlock(&l->mu);
  return e;
}

kc_err kcd_lease_release(kcd_leases *l, const char *key, const char *token,
                         uint64_t now_ms) {
  pthread_mutex_lock(&l->mu);
  lease **pp = find(l, key, now_ms);
  lease *e = *pp;
  kc_err res = KC_NOT_FOUND;
  if (e) {
    /* The token is the holder's only credential: compare in constant time. */
    int ok = strlen(token) == KCD_LEASE_TOKEN_LEN &&
             CRYPTO_memcmp(e->token, token, KCD_LEASE_TOKEN_LEN) == 0;
    res = ok ? KC_OK : KC_FORBIDDEN;
    if (ok) {
      *pp = e->next;
      free(e);
      l->n--;
    }
  }
  pthread_mutex_unlock(&l->mu);
  return res;
}

size_t kcd_lease_sweep(kcd_leases *l, uint64_t now_ms) {
  pthread_mutex_lock(&l->mu);
  for (size_t i = 0; i < N_SLOTS; i++) {
    lease **pp = &l->slots[i];
    while (*pp) {
      lease *e = *pp;
      if (e->expires_ms <= now_ms) {
        *pp = e->next;
        free(e);
        l->n--;
      } else {
        pp = &e->next;
      }
    }
  }
  size_t n = l->n;
  pthread_mutex_unlock(&l->mu);
  return n;
}

size_t kcd_lease_count(kcd_leases *l) {
  pthread_mutex_lock(&l->mu);
  size_t n = l->n;
  pthread_mutex_unlock(&l->mu);
  return n;
}

int kcd_lease_held(kcd_leases *l, const char *key, uint64_t now_ms,
                   char holder[KCD_HOLDER_MAX + 1]) {
  pthread_mutex_lock(&l->mu);
  lease **pp = find(l, key, now_ms);
  int held = *pp != NULL;
  if (held && holder)
    memcpy(holder, (*pp)->holder, KCD_HOLDER_MAX + 1);
  pthread_mutex_unlock(&l->mu);
  return held;
}
