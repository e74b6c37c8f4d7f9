/* testrgw.h: a real single-node Ceph RADOS Gateway for the S3 tests
 * (test_s3, test_scaleout), started and stopped with scripts/ceph-rgw.sh;
 * and kc_testrgw_pair, the scale-out tests' fixture: two kcached replicas
 * (kc_testsrv) over one bucket of it.
 *
 * kc_testrgw_up starts a cluster in a new temporary directory (installing
 * the Ceph packages when missing; a watchdog stops it if the test process
 * dies first), or, with KC_TEST_S3_ENV=FILE, uses one that is already
 * running (FILE: the env file ceph-rgw.sh wrote into its directory; that
 * cluster is never stopped here, but rgw-stop/rgw-start act on it).
 *
 * Skipping: where the packages cannot be installed (the script's exit 77),
 * kc_testrgw_up returns 77, which a test passes on as ctest's skip status,
 * unless CI=true (or 1): then a missing RGW is a failure (-1).
 * Not thread-safe: one thread drives one kc_testrgw.
 */
#ifndef KC_TESTRGW_H
#define KC_TESTRGW_H

#include <stddef.h>

#include "kcs3.h"
#include "testsrv.h"

typedef struct kc_testrgw {
  char dir[256];      /* the cluster's directory ("" when none) */
  int owned;          /* 1: started here, kc_testrgw_down stops and removes */
  char endpoint[128]; /* "http://127.0.0.1:PORT" */
  char region[64];
  char access[128]; /* AWS_ACCESS_KEY_ID */
  char secret[128]; /* AWS_SECRET_ACCESS_KEY */
} kc_testrgw;

/* Starts (or finds, see above) the RGW and fills r. `who` names the test in
 * the messages on stderr. 0 up; 77 skip (said why on stderr); -1 failed
 * (said why). */
int kc_testrgw_up(kc_testrgw *r, const char *who);
/* Creates the bucket "<stem>-<pid>" (its name into bucket) and sets
 * AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY to r's (kcached replicas take
 * their credentials from the environment). *s3 (may be NULL: closed) is an
 * open client of it, the caller's. 0 ok, -1 failed (said why on stderr). */
int kc_testrgw_bucket(const kc_testrgw *r, const char *stem, char *bucket,
                      size_t cap, kcs3 **s3);
/* The arguments that point a kcached replica at r's bucket under prefix
 * (--s3-endpoint, --s3-bucket, --s3-prefix, --s3-region, --s3-path-style),
 * then extra (NULL-terminated, may be NULL), then NULL, into args (cap
 * entries; the strings are r's, bucket, prefix and extra). 0 ok, -1 when
 * they do not fit. */
int kc_testrgw_replica_args(const kc_testrgw *r, const char *bucket,
                            const char *prefix, const char *const *extra,
                            const char **args, size_t cap);
/* Stops radosgw alone ("S3 is down": connections are refused) / starts it
 * again on the same port and data. 0 ok, else the script's status. */
int kc_testrgw_gateway_stop(kc_testrgw *r);
int kc_testrgw_gateway_start(kc_testrgw *r);
/* Stops the cluster and removes its directory when it was started here;
 * nothing otherwise. Safe to call twice. */
void kc_testrgw_down(kc_testrgw *r);
/* The end of a test's main: kc_testrgw_down, then the exit status from
 * what kc_testrgw_up said (`up`) and the failed cases: 1 when any failed or
 * the RGW did not start, 77 when the RGW part was skipped, else 0. */
int kc_testrgw_finish(kc_testrgw *r, int up, int fails);

/* ---- two kcached replicas over one bucket ---- */

typedef struct kc_testrgw_pair {
  kc_testrgw rgw;
  char bucket[64];
  kcs3 *s3;        /* the test's own client of the bucket */
  kc_testsrv a, b; /* the replicas of the running case */
  char prefix[64]; /* the running case's --s3-prefix */
} kc_testrgw_pair;

/* Starts A and B on p's bucket under prefix, with extra arguments (may be
 * NULL). 0 ok, -1 when one did not start. */
int kc_testrgw_pair_start(kc_testrgw_pair *p, const char *prefix,
                          const char *const *extra);
/* After a case: stops A and B, each of which must exit 0 on SIGTERM and
 * have no S3 secret in its log; removes their directories; puts the
 * credentials back in the environment and radosgw up again (a failed case
 * may have left them off). 0 ok, -1 (said why on stderr). */
int kc_testrgw_pair_stop(kc_testrgw_pair *p);
/* Both replicas' log tails on stderr. */
void kc_testrgw_pair_show_logs(const kc_testrgw_pair *p);
/* The end of a scale-out test's main: starts the RGW (kc_testrgw_up, who
 * names the test), makes the bucket "<stem>-<pid>" with p->s3, runs the
 * cmocka group tests (n of them) as `group`, closes p->s3, and returns
 * kc_testrgw_finish's status counting `fails` (failed cases of an earlier
 * group) too. */
struct CMUnitTest;
int kc_testrgw_pair_run(kc_testrgw_pair *p, const char *who, const char *stem,
                        const char *group, const struct CMUnitTest *tests,
                        size_t n, int fails);
/* In a cmocka test: fails it (with both logs) unless cond. */
#define KC_TESTRGW_REQUIRE(p, cond, ...)                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      kc_testrgw_pair_show_logs(p);                                            \
      fail_msg(__VA_ARGS__);                                                   \
    }                                                                          \
  } while (0)

#endif
