/* resp_fetch.c: read-through from the durable tier for RESP reads. A GET or
 * MGET that misses, with --s3-endpoint set, hands its missing keys to these
 * threads (kc_store_kv_read_through, the read-through every front end
 * shares: up to ~2 s of S3 each) instead of replying;
 * the connection waits as for a commit (resp.h), then runs the command
 * again, which now finds the keys or replies the miss. The listener thread
 * never waits for S3. Fetch errors (S3 unreachable, corrupt) read as a miss:
 * a cache miss is always a safe answer. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "resp.h"

int kcd_resp_fetch_key(kcd_resp_ctx *x, const void *key, size_t klen) {
  kcd_resp_conn *c = x->c;
  if (x->exec || c->fetched || !x->st->s3 || !c->srv->nfetchers)
    return 0;
  if (!c->fetch && !(c->fetch = kcd_resp_job_new(c)))
    return 0;
  c->fetch->fetch = 1;
  if (!kcd_resp_job_op(c->fetch, KC_KV_SET, key, klen)) {
    kcd_resp_job_free(c->fetch);
    c->fetch = NULL;
    return 0;
  }
  return 1;
}

void kcd_resp_fetch_submit(kcd_resp *r, kcd_resp_job *j) {
  pthread_mutex_lock(&r->qlock);
  kcd_resp_job_append(&r->fhead, &r->ftail, j);
  pthread_cond_broadcast(&r->qcond);
  pthread_mutex_unlock(&r->qlock);
}

/* The next fetch job; NULL when stopping. Shares the committer's lock and
 * condition (a broadcast wakes both kinds of thread). */
static kcd_resp_job *take(kcd_resp *r) {
  pthread_mutex_lock(&r->qlock);
  while (!r->fhead && !r->fstop)
    pthread_cond_wait(&r->qcond, &r->qlock);
  kcd_resp_job *j = r->fhead;
  if (j) {
    r->fhead = j->next;
    if (!r->fhead)
      r->ftail = NULL;
    j->next = NULL;
  }
  pthread_mutex_unlock(&r->qlock);
  return j;
}

static void *fetch_main(void *arg) {
  kcd_resp *r = arg;
  kcd_resp_job *j;
  while ((j = take(r))) {
    kc_store *s = kcd_store(r->st);
    for (size_t i = 0; s && i < j->nops; i++) {
      int64_t now = kc_clock_wall_ms();
      char err[KC_ERRBUF_SIZE];
      kc_store_kv_read_through(s, j->ops[i].key, j->ops[i].klen, now, err);
    }
    kcd_resp_job_done(r, j);
  }
  return NULL;
}

int kcd_resp_fetch_start(kcd_resp *r) {
  if (!r->st->s3)
    return 0;
  for (int i = 0; i < KCD_RESP_FETCHERS; i++) {
    if (pthread_create(&r->fetchers[i], NULL, fetch_main, r))
      return -1;
    r->nfetchers++;
  }
  return 0;
}

void kcd_resp_fetch_stop(kcd_resp *r) {
  pthread_mutex_lock(&r->qlock);
  r->fstop = 1;
  pthread_cond_broadcast(&r->qcond);
  pthread_mutex_unlock(&r->qlock);
  for (int i = 0; i < r->nfetchers; i++)
    pthread_join(r->fetchers[i], NULL);
  r->nfetchers = 0;
}
