/* testrgw.h: a real single-node Ceph RADOS Gateway for the S3 tests
 * (test_s3, test_scaleout), started and stopped with scripts/ceph-rgw.sh.
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

typedef struct kc_testrgw {
  char dir[256];      /* the cluster's directory ("" when none) */
  int owned;          /* 1: started here, kc_testrgw_down stops and removes */
  char endpoint[128]; /* "http://127.0.0.1:PORT" */
  char region[64];
  char access[128];   /* AWS_ACCESS_KEY_ID */
  char secret[128];   /* AWS_SECRET_ACCESS_KEY */
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

#endif
