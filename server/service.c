/* service.c: the rules both front ends share (kcd.h, "the service layer"):
 * what HTTP's handlers (routes_*.c) and RESP's commands (resp_*.c) would
 * otherwise each decide: operations in flight (graceful shutdown waits for
 * them), the token check, a blob offered for upload (held already, or
 * taken to repair a bad copy), build leases across replicas, a lookup's
 * prefetch from the durable tier, and the reads and writes that need no
 * rule beyond the store (GETs, a bundle's PUT, RESP's SETs, many-entry
 * reads), so that no handler counts for itself. Functions take the daemon
 * state and plain arguments, never a request or a connection; each counts
 * what it did in kcached_ops_total under the front end it is given.
 *
 * Counters are relaxed atomics (statistics, not synchronization), as in
 * metrics.c: no lock and no allocation is added to any request's path. */
#include <stdlib.h>
#include <string.h>

#include "kcd.h"

#define ADD(field, v)                                                          \
  atomic_fetch_add_explicit(&(field), (v), memory_order_relaxed)

/* ---- operations in flight, counts ---- */

void kcd_svc_begin(kcd_state *st, kcd_fe fe) {
  atomic_fetch_add(&st->metrics.in_flight[fe], 1);
}

void kcd_svc_end(kcd_state *st, kcd_fe fe) {
  atomic_fetch_sub(&st->metrics.in_flight[fe], 1);
}

int64_t kcd_svc_in_flight(kcd_state *st) {
  int64_t n = 0;
  for (int fe = 0; fe < KCD_N_FE; fe++)
    n += atomic_load(&st->metrics.in_flight[fe]);
  return n;
}

void kcd_svc_count(kcd_state *st, kcd_svc_op op, kcd_fe fe, kcd_svc_res res,
                   uint64_t n) {
  if ((unsigned)op < KCD_N_OPS && (unsigned)fe < KCD_N_FE &&
      (unsigned)res < KCD_N_RES && n)
    ADD(st->metrics.ops[op][fe][res], n);
}

void kcd_svc_count_get(kcd_state *st, kcd_fe fe, kc_err e) {
  kcd_svc_res res = e == KC_OK          ? KCD_RES_HIT
                    : e == KC_NOT_FOUND ? KCD_RES_MISS
                                        : KCD_RES_ERROR;
  kcd_svc_count(st, KCD_OP_GET, fe, res, 1);
}

/* ---- tokens ---- */

kcd_authn kcd_svc_auth(kcd_state *st, kcd_fe fe, const char *want_name,
                       const void *token, size_t len, kcd_role *role,
                       char name[KCD_NAME_MAX]) {
  kcd_authn res =
      kcd_auth_check_token(&st->auth, want_name, token, len, role, name);
  /* Counted where a token was offered and checked: tokens are on exactly
   * when a token file was given (kcd_auth_load). */
  if (token && res != KCD_AUTHN_OK)
    kcd_svc_count(st, KCD_OP_AUTH, fe, KCD_RES_DENIED, 1);
  else if (token && st->cfg.tokens)
    kcd_svc_count(st, KCD_OP_AUTH, fe, KCD_RES_OK, 1);
  return res;
}

/* ---- uploads ---- */

kcd_svc_res kcd_svc_blob_offer(kcd_state *st, kcd_fe fe, const char *digest,
                               int repair_asked) {
  kc_store *s = kcd_store(st);
  char why[KC_ERRBUF_SIZE] = "";
  kc_err held = kc_store_blob_has(s, digest, NULL);
  if (held == KC_OK && repair_asked)
    held = kc_store_blob_check(s, digest, why);
  kcd_svc_res res = KCD_RES_NEW;
  if (held == KC_OK) {
    /* Content-addressed: a held blob is these bytes already. */
    kc_store_blob_touch(s, digest); /* kept for the manifest to come */
    res = KCD_RES_PRESENT;
  } else if (held == KC_CORRUPT) {
    kcd_log(st, "warn", "%s; taking the upload offered to replace it", why);
    res = KCD_RES_REPAIR;
  }
  kcd_svc_count(st, KCD_OP_PUT, fe, res, 1);
  return res;
}

/* ---- leases ---- */

static kc_err acquire(kcd_state *st, const char *key, const char *holder,
                      uint64_t ttl_s, kcd_lease_info *info) {
  kc_store *s = kcd_store(st);
  kc_err e = kcd_lease_acquire(st->leases, key, holder, ttl_s * 1000,
                               kc_clock_mono_ms(), info);
  /* Our record of a lease its holder released through another replica: the
   * bucket says it ended, so forget it and grant. */
  if (e == KC_LEASED && st->s3 && kc_store_lease_ended(s, key, info->token) &&
      kcd_lease_release(st->leases, key, info->token, kc_clock_mono_ms()) ==
          KC_OK)
    e = kcd_lease_acquire(st->leases, key, holder, ttl_s * 1000,
                          kc_clock_mono_ms(), info);
  if (e || !st->s3)
    return e;
  uint64_t remaining = 0;
  e = kc_store_lease_acquire(s, key, holder, info->token, ttl_s * 1000,
                             info->holder, &remaining, NULL);
  if (e == KC_LEASED) {
    kcd_lease_release(st->leases, key, info->token, kc_clock_mono_ms());
    info->remaining_ms = remaining;
  }
  return e;
}

kc_err kcd_svc_lease_take(kcd_state *st, kcd_fe fe, const char *key,
                          const char *holder, uint64_t ttl_s,
                          kcd_lease_info *info, int *present) {
  kc_store *s = kcd_store(st);
  *present = kc_store_bundle_has(s, key) == KC_OK ||
             kc_store_fetch_bundle(s, key, NULL) == KC_OK;
  if (*present) {
    kcd_svc_count(st, KCD_OP_LEASE_TAKE, fe, KCD_RES_PRESENT, 1);
    return KC_OK;
  }
  kc_err e = acquire(st, key, holder, ttl_s, info);
  kcd_svc_res res = KCD_RES_ERROR;
  if (!e) {
    res = KCD_RES_GRANTED;
  } else if (e == KC_LEASED) {
    res = KCD_RES_HELD;
  }
  kcd_svc_count(st, KCD_OP_LEASE_TAKE, fe, res, 1);
  return e;
}

kc_err kcd_svc_lease_release(kcd_state *st, kcd_fe fe, const char *key,
                             const char *token) {
  kc_err e = kcd_lease_release(st->leases, key, token, kc_clock_mono_ms());
  /* Granted here or through another replica (a load balancer need not send
   * the release where the lease came from): the bucket's copy decides, and
   * a local record that disagrees is another replica's stale grant. */
  kc_err se =
      st->s3 ? kc_store_lease_release(kcd_store(st), key, token) : KC_NOT_FOUND;
  if (se == KC_OK || (e == KC_NOT_FOUND && se == KC_FORBIDDEN))
    e = se;
  kcd_svc_count(st, KCD_OP_LEASE_RELEASE, fe,
                !e                  ? KCD_RES_OK
                : e == KC_NOT_FOUND ? KCD_RES_MISS
                : e == KC_FORBIDDEN ? KCD_RES_DENIED
                                    : KCD_RES_ERROR,
                1);
  return e;
}

/* ---- reads and writes: each counted as its operation ---- */

kc_err kcd_svc_blob_read(kcd_state *st, kcd_fe fe, const char *digest,
                         kc_store_read **rd, kc_store_blob_view *v, char *err) {
  kc_err e = kc_store_blob_read(kcd_store(st), digest, rd, v, err);
  kcd_svc_count_get(st, fe, e);
  return e;
}

kc_err kcd_svc_bundle_read(kcd_state *st, kcd_fe fe, const char *key,
                           kc_store_read **rd, const char **json, size_t *len,
                           char *err) {
  kc_err e = kc_store_bundle_read(kcd_store(st), key, rd, json, len, err);
  kcd_svc_count_get(st, fe, e);
  return e;
}

kc_err kcd_svc_bundle_put(kcd_state *st, kcd_fe fe, const kc_manifest *m,
                          int *created, char ***missing, size_t *n_missing,
                          char *err) {
  kc_err e = kc_store_bundle_put_once(kcd_store(st), m, created, missing,
                                      n_missing, err);
  kcd_svc_count(st, KCD_OP_SET, fe,
                e          ? KCD_RES_ERROR
                : *created ? KCD_RES_NEW
                           : KCD_RES_PRESENT,
                1);
  return e;
}

kc_err kcd_svc_read_each(kcd_state *st, kcd_fe fe, kcd_svc_op op, size_t n,
                         kcd_svc_read_fn each, void *arg, char *err) {
  kc_store_read *rd;
  kc_err e = kc_store_read_begin(kcd_store(st), &rd);
  if (e)
    return kc_errf(err, e, "cannot begin a read of the store");
  uint64_t misses = 0;
  for (size_t i = 0; !e && i < n; i++) {
    e = each(arg, rd, i);
    if (e == KC_NOT_FOUND) {
      misses++;
      e = KC_OK;
    }
  }
  kc_store_read_end(rd);
  if (!e) { /* all read: counted at once, two atomic adds */
    kcd_svc_count(st, op, fe, KCD_RES_HIT, n - misses);
    kcd_svc_count(st, op, fe, KCD_RES_MISS, misses);
  }
  return e;
}

kc_err kcd_svc_lookup(kcd_state *st, kcd_fe fe, const char *const *keys,
                      size_t n, kcd_svc_read_fn each, void *arg, char *err) {
  kcd_svc_prefetch_bundles(st, keys, n);
  return kcd_svc_read_each(st, fe, KCD_OP_LOOKUP, n, each, arg, err);
}

kc_err kcd_svc_kv_get(kcd_state *st, kcd_fe fe, kc_store_read *rd,
                      const void *key, size_t klen, int64_t now_ms,
                      kc_store_kv_val *v, kcd_svc_miss_fn tier, void *arg) {
  kc_err e = klen < 1 || klen > KC_KV_KEY_MAX ? KC_NOT_FOUND
             : !rd                            ? KC_NOT_READY
                   : kc_store_kv_get(rd, key, klen, now_ms, v);
  if (e == KC_NOT_FOUND && tier && tier(arg, key, klen))
    return KC_NOT_FOUND; /* asked of the tier: counted when it answers */
  kcd_svc_count_get(st, fe, e);
  return e;
}

int kcd_svc_kv_set_settled(kcd_state *st, kcd_fe fe, kc_store_read *rd,
                           kc_store_kv_op *o, int64_t now_ms) {
  if (!kc_store_kv_set_settled(rd, o, now_ms))
    return 0;
  kcd_svc_count(st, KCD_OP_SET, fe, o->done ? KCD_RES_PRESENT : KCD_RES_REFUSED,
                1);
  return 1;
}

void kcd_svc_kv_sets_done(kcd_state *st, kcd_fe fe, const kc_store_kv_op *ops,
                          size_t n, kc_err err) {
  for (size_t k = 0; k < n; k++) {
    if (ops[k].op != KC_KV_SET)
      continue;
    kcd_svc_res res = err || ops[k].err ? KCD_RES_ERROR
                      : ops[k].done     ? KCD_RES_NEW
                                        : KCD_RES_REFUSED;
    kcd_svc_count(st, KCD_OP_SET, fe, res, 1);
  }
}

/* ---- lookups ---- */

void kcd_svc_prefetch_bundles(kcd_state *st, const char *const *keys,
                              size_t n) {
  kc_store *s = kcd_store(st);
  if (!st->s3 || !s)
    return;
  const char **miss = malloc((n ? n : 1) * sizeof *miss);
  kc_err *res = malloc((n ? n : 1) * sizeof *res);
  size_t m = 0;
  for (size_t i = 0; miss && res && i < n; i++)
    if (kc_store_bundle_has(s, keys[i]) == KC_NOT_FOUND)
      miss[m++] = keys[i];
  if (m)
    kc_store_fetch_bundles(s, miss, m, res);
  free(miss);
  free(res);
}
