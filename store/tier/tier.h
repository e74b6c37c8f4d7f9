/* tier.h: what tier.c (queue, worker, stats), tier_read.c (read-through) and
 * tier_lease.c (leases in the bucket) share. Internal to store/.
 *
 * The queue lives in two named databases of the store:
 *   s3queue  be64(seq) -> kind (1 byte) + key (64 hex) [+ model (64 hex)]
 *   s3pend   bundle key -> be64(seq of its latest bundle entry): bundles
 *            whose manifest is not in S3 yet (eviction skips them: their
 *            only copy is here); cleared by that entry alone, so a delete
 *            and a new put of the key keep it pending
 *   s3dead   entries S3 refused for good (KC_PROTOCOL and the like, 8
 *            times, not a refusal of the whole bucket): set aside so the
 *            rest of the queue moves; queued again at the next start (after
 *            the operator fixed what was wrong)
 */
#ifndef KC_TIER_H
#define KC_TIER_H

#include <pthread.h>
#include <stdatomic.h>

#include "kcs3.h"
#include "store_internal.h"

#define KCS_MANIFEST_MAX (4u << 20) /* the largest manifest read from S3 */

typedef struct kcs_flight kcs_flight; /* tier_read.c: one fetch in progress */
typedef struct kcs_fill kcs_fill; /* tier_read.c: a fetched blob to commit */

struct kcs_tier {
  kc_store *s;
  kcs3_opts o; /* strings owned (secret wiped at close) */
  char *prefix;
  unsigned parallel;
  uint64_t max_object;
  void (*log)(void *ud, const char *level, const char *msg);
  void *log_ud;
  /* the queue worker */
  _Atomic int stop;
  pthread_t worker;
  int started;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* kicked by puts, and by close */
  int kicked;
  kcs3 *wh; /* the worker's own handle */
  /* handles for read-through and leases */
  pthread_mutex_t pool_mu;
  pthread_cond_t pool_cv;
  kcs3 **idle;
  size_t n_idle, n_made;
  /* fetches in progress (tier_read.c) */
  pthread_mutex_t fl_mu;
  pthread_cond_t fl_cv;
  kcs_flight *flights;
  /* fetched blobs committed after they were served (tier_read.c) */
  pthread_t filler;
  int filler_started;
  _Atomic int fill_stop;
  pthread_mutex_t fill_mu;
  pthread_cond_t fill_cv;
  kcs_fill *fills, **fills_tail;
  /* state and counters */
  _Atomic uint64_t down_until_ms; /* fetches fail fast until then */
  _Atomic int up, conditional;
  _Atomic uint64_t uploaded, requests, errors, parked;
  _Atomic uint64_t rt_hit, rt_miss, rt_corrupt, rt_error;
  _Atomic uint64_t once_refused, once_replaced; /* tier_once.c */
  _Atomic uint64_t dur[KC_STORE_S3_BUCKETS + 1], dur_sum_us;
};

void kcs_tier_logf(kcs_tier *t, const char *level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* "PREFIX/KIND/hex" (kind "blobs", "bundles", "leases") into out. */
void kcs_tier_obj(const kcs_tier *t, char out[KCS3_KEY_MAX + 1],
                  const char *kind, const char *hex);
/* Counts a request that began at t0_us (kc_clock_mono_us) and ended with e;
 * marks S3 up, or down for 2 s when e says it could not be reached. Returns
 * e. */
kc_err kcs_tier_done(kcs_tier *t, uint64_t t0_us, kc_err e);
/* A handle from the pool (blocks while `parallel` are in use); NULL when one
 * cannot be made. Give it back with kcs_tier_put_handle. */
kcs3 *kcs_tier_handle(kcs_tier *t);
void kcs_tier_put_handle(kcs_tier *t, kcs3 *h);

/* tier_read.c: an object that failed verification: counted, logged, deleted
 * from the bucket with h. Returns KC_CORRUPT (err says why). */
kc_err kcs_tier_corrupt(kcs_tier *t, kcs3 *h, const char *obj, char *err);
/* tier_read.c: counts the outcome of one read-through (a hit, a miss, or
 * an error; KC_CORRUPT is kcs_tier_corrupt's to count). Returns e. */
kc_err kcs_tier_outcome(kcs_tier *t, kc_err e);
/* tier_read.c: S3 failed a moment ago: KC_UNAVAILABLE at once instead of
 * waiting for it again (counted as a read-through error unless quiet);
 * KC_OK when S3 is not known to be down. */
kc_err kcs_tier_down(kcs_tier *t, int quiet, char *err);
/* tier_read.c: kc_store_fetch_bundle; quiet (a bundle PUT's check) leaves
 * the read-through counters alone. */
kc_err kcs_tier_fetch_bundle(kc_store *s, const char *key, int quiet,
                             char *err);
/* tier_once.c: the queue's PUT of key's manifest found `data` (len bytes),
 * a different manifest, in the bucket: another replica won the key. The
 * bucket's copy replaces the local one (its blobs fetched first; one write
 * transaction), logged and counted. KC_OK also when the bucket's copy cannot
 * be parsed by this version (kept: logged). Runs on the worker thread (t->wh).
 */
kc_err kcs_tier_adopt(kcs_tier *t, const char *key, const void *data,
                      size_t len, char *err);

/* tier_read.c: the thread that commits served fills; stop commits what is
 * left, then joins. */
int kcs_filler_start(kcs_tier *t);
void kcs_filler_stop(kcs_tier *t);

/* tier.c: a blob's object for the bucket: its bytes as held (pointing into
 * r's map) and the put's options (create-only; a compressed blob's
 * x-amz-meta-kcache-encoding: zstd). */
kc_err kcs_tier_blob_obj(kc_store_read *r, const char *digest,
                         const void **data, size_t *len, kcs3_put_opts *po);

#endif
