/* tier_lease.c: build leases shared by every replica, as objects in the
 * bucket: P/leases/<key> = {"holder","token","expires_ms"}. Created with
 * If-None-Match: * (one winner), an expired one replaced with If-Match on its
 * ETag (one winner again). expires_ms is wall-clock time: replicas' clocks
 * must agree to well under a lease's TTL (NTP does). A lease is advisory: when
 * S3 cannot say, the replica's own lease table decides alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "tier.h"

#define MAX_LEASE_OBJ 4096

typedef struct lease_obj {
  char holder[KC_STORE_HOLDER_MAX + 1];
  char token[80];
  int64_t expires_ms;
  char etag[KCS3_ETAG_MAX];
} lease_obj;

/* Leases go through the bucket: a tier that honours conditional writes (or
 * has not been probed yet) and that answered lately. */
static int shared(kcs_tier *t) {
  return t && atomic_load(&t->conditional) != 0 &&
         (uint64_t)kc_clock_mono_ms() >= atomic_load(&t->down_until_ms);
}

static char *lease_json(const char *holder, const char *token, int64_t exp) {
  json_t *o = json_pack("{sssssI}", "holder", holder, "token", token,
                        "expires_ms", (json_int_t)exp);
  char *s = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
  json_decref(o);
  return s;
}

/* An object that does not parse counts as expired (it is replaced). */
static void lease_parse(const char *data, size_t len, lease_obj *l) {
  json_t *o = json_loadb(data, len, 0, NULL);
  const char *holder = "", *token = "";
  json_int_t exp = 0;
  if (o && json_unpack(o, "{s:s,s:s,s:I}", "holder", &holder, "token", &token,
                       "expires_ms", &exp) != 0)
    exp = 0;
  snprintf(l->holder, sizeof l->holder, "%s", holder);
  snprintf(l->token, sizeof l->token, "%s", token);
  l->expires_ms = exp;
  json_decref(o);
}

static kc_err lease_get(kcs_tier *t, kcs3 *h, const char *obj, lease_obj *l,
                        char *err) {
  void *data = NULL;
  size_t len = 0;
  uint64_t t0 = kc_clock_mono_us();
  kc_err e = kcs_tier_done(
      t, t0, kcs3_get(h, obj, MAX_LEASE_OBJ, &data, &len, l->etag, err));
  if (!e)
    lease_parse(data, len, l);
  free(data);
  return e;
}

static kc_err lease_put(kcs_tier *t, kcs3 *h, const char *obj, const char *body,
                        const char *if_match, char *err) {
  kcs3_put_opts po = {.if_none_match = !if_match,
                      .if_match = if_match,
                      .content_type = "application/json"};
  uint64_t t0 = kc_clock_mono_us();
  return kcs_tier_done(t, t0,
                       kcs3_put(h, obj, body, strlen(body), &po, NULL, err));
}

/* Create, or take over an expired lease; a few rounds when others race
 * (412, or AWS's 409 ConditionalRequestConflict). Rounds used up: someone
 * else is winning, so not granted. */
static kc_err lease_take(kcs_tier *t, kcs3 *h, const char *obj,
                         const char *body, lease_obj *cur, char *err) {
  kc_err e = lease_put(t, h, obj, body, NULL, err);
  for (int round = 0; e == KC_CONFLICT || e == KC_BUSY; round++) {
    if (round == 4) {
      if (!*cur->holder)
        snprintf(cur->holder, sizeof cur->holder, "another replica");
      return KC_LEASED;
    }
    e = lease_get(t, h, obj, cur, err);
    if (e == KC_NOT_FOUND) { /* released meanwhile */
      e = lease_put(t, h, obj, body, NULL, err);
      continue;
    }
    if (e)
      break;
    if (cur->expires_ms > kc_clock_wall_ms())
      return KC_LEASED;
    e = lease_put(t, h, obj, body, cur->etag, err);
  }
  return e;
}

kc_err kc_store_lease_acquire(kc_store *s, const char *key, const char *holder,
                              const char *token, uint64_t ttl_ms,
                              char held_by[KC_STORE_HOLDER_MAX + 1],
                              uint64_t *remaining_ms, char *err) {
  kcs_tier *t = s->tier;
  if (!shared(t))
    return KC_OK; /* per replica only */
  char obj[KCS3_KEY_MAX + 1];
  kcs_tier_obj(t, obj, "leases", key);
  char *body = lease_json(holder, token, kc_clock_wall_ms() + (int64_t)ttl_ms);
  kcs3 *h = kcs_tier_handle(t);
  lease_obj cur = {0};
  kc_err e = body && h ? lease_take(t, h, obj, body, &cur, err) : KC_NOMEM;
  kcs_tier_put_handle(t, h);
  free(body);
  if (e == KC_LEASED) {
    snprintf(held_by, KC_STORE_HOLDER_MAX + 1, "%s", cur.holder);
    int64_t left = cur.expires_ms - kc_clock_wall_ms();
    *remaining_ms = left > 0 ? (uint64_t)left : 0;
    return kc_errf(err, KC_LEASED, "%s holds the lease of %s", cur.holder, key);
  }
  if (e)
    kcs_tier_logf(t, "warn",
                  "lease %s in S3: %s (%s); granted by this "
                  "replica alone",
                  key, err ? err : "", kc_strerror(e));
  return KC_OK;
}

/* 1 while the bundle waits in this store's upload queue. */
static int still_queued(kc_store *s, const char *key) {
  kc_store_read *r;
  if (kc_store_read_begin(s, &r))
    return 0;
  int q = kcs_queue_pending(s, r->txn, key);
  kc_store_read_end(r);
  return q;
}

kc_err kc_store_lease_release(kc_store *s, const char *key, const char *token) {
  kcs_tier *t = s->tier;
  if (!shared(t))
    return KC_NOT_FOUND;
  char obj[KCS3_KEY_MAX + 1];
  kcs_tier_obj(t, obj, "leases", key);
  kcs3 *h = kcs_tier_handle(t);
  lease_obj cur = {0};
  kc_err e = h ? lease_get(t, h, obj, &cur, NULL) : KC_NOMEM;
  if (!e && strcmp(cur.token, token) != 0)
    e = KC_FORBIDDEN;
  else if (!e && cur.expires_ms <= kc_clock_wall_ms())
    e = KC_NOT_FOUND;
  /* The bundle built under it is not in the bucket yet: other replicas
   * would not find it, so the lease stays until it expires (they find the
   * bundle by then). Else the lease is replaced by an expired one, on its
   * ETag: S3 has no conditional DELETE, and a plain one could remove a lease
   * someone took over meanwhile. */
  if (!e && !still_queued(s, key)) {
    char *body = lease_json(cur.holder, cur.token, 0);
    e = body ? lease_put(t, h, obj, body, cur.etag, NULL) : KC_NOMEM;
    free(body);
  }
  kcs_tier_put_handle(t, h);
  return e;
}

int kc_store_lease_ended(kc_store *s, const char *key, const char *token) {
  kcs_tier *t = s->tier;
  if (!shared(t))
    return 0;
  char obj[KCS3_KEY_MAX + 1];
  kcs_tier_obj(t, obj, "leases", key);
  kcs3 *h = kcs_tier_handle(t);
  lease_obj cur = {0};
  int ended = h && lease_get(t, h, obj, &cur, NULL) == KC_OK &&
              strcmp(cur.token, token) == 0 &&
              cur.expires_ms <= kc_clock_wall_ms();
  kcs_tier_put_handle(t, h);
  return ended;
}
