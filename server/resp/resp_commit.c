/* resp_commit.c: the group commit. Connections hand their writes over as
 * jobs (a queue); one committer thread takes every job waiting, applies all
 * their ops in ONE kc_store_kv_apply (one LMDB write transaction, synced),
 * and hands the jobs back to the listener, which only then replies: a +OK
 * is never sent for a write that is not durable. While a batch commits, the
 * next one gathers, so the sync cost is shared by every client writing at
 * that moment. The jobs themselves: resp_job.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "resp.h"

#define BATCH_OPS 20000 /* ops of one apply (jobs are never split) */
#ifndef GATHER_US
/* longest wait for the last batch's writers to return */
#define GATHER_US 200
#endif

/* ---- the committer ---- */

/* Waits on ccond until qlen reaches want or qstop, up to until (NULL: no
 * limit). Called with qlock held. */
static void wait_for(kcd_resp *r, size_t want, const struct timespec *until) {
  r->qwant = want;
  while (!r->qstop && r->qlen < want)
    if (until ? pthread_cond_timedwait(&r->ccond, &r->qlock, until)
              : pthread_cond_wait(&r->ccond, &r->qlock))
      break; /* timed out */
  r->qwant = 0;
}

/* The gather: when the last commit held jobs of several connections, they
 * are likely writing again (a client answered sends its next write); wait
 * up to GATHER_US for as many jobs as the last commit held, so the next
 * sync is shared by them rather than paid twice. A lone writer (last batch
 * of one job) never waits. Called with qlock held. */
static void gather(kcd_resp *r, size_t last_jobs) {
  if (GATHER_US <= 0 || last_jobs < 2 || r->qlen >= last_jobs)
    return;
  /* ccond's clock */
  struct timespec until =
      kc_clock_deadline(CLOCK_MONOTONIC, (uint64_t)GATHER_US);
  wait_for(r, last_jobs, &until);
}

/* Takes jobs from the queue up to BATCH_OPS ops (at least one job); NULL
 * when stopping and nothing is left. *njobs: in, the last batch's jobs;
 * out, this one's. */
static kcd_resp_job *take(kcd_resp *r, size_t *nops, size_t *njobs) {
  pthread_mutex_lock(&r->qlock);
  if (!r->qhead)
    wait_for(r, 1, NULL);
  gather(r, *njobs);
  *njobs = 0;
  kcd_resp_job *head = r->qhead, *last = NULL;
  *nops = 0;
  for (kcd_resp_job *j = head; j; j = j->next) {
    if (last && *nops + j->nops > BATCH_OPS)
      break;
    *nops += j->nops;
    ++*njobs;
    last = j;
  }
  if (last) {
    r->qhead = last->next;
    if (!r->qhead)
      r->qtail = NULL;
    last->next = NULL;
    r->qlen -= *njobs;
  }
  pthread_mutex_unlock(&r->qlock);
  return last ? head : NULL;
}

static void fail_all(kcd_resp_job *jobs, kc_err e, const char *msg) {
  for (kcd_resp_job *j = jobs; j; j = j->next) {
    j->err = e;
    snprintf(j->errmsg, sizeof j->errmsg, "%s", msg);
    for (size_t i = 0; i < j->nops; i++)
      j->ops[i].err = e;
  }
}

const unsigned kcd_resp_batch_le[KCD_RESP_BATCH_BUCKETS] = {
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000};

static void observe_batch(kcd_resp *r, size_t n) {
  int i = 0;
  while (i < KCD_RESP_BATCH_BUCKETS && n > kcd_resp_batch_le[i])
    i++;
  atomic_fetch_add(&r->batch_bucket[i], 1);
  atomic_fetch_add(&r->batch_sum, n);
}

/* Applies the ops of every job in one call; results go back to each op. */
static void apply(kcd_resp *r, kcd_resp_job *jobs, size_t n) {
  kc_store *s = kcd_store(r->st);
  kc_store_kv_op *all = s ? malloc(n * sizeof *all) : NULL;
  if (!s || !all) { /* a failed commit all the same */
    atomic_fetch_add(&r->commit_errors, 1);
    free(all);
    return fail_all(jobs, s ? KC_NOMEM : KC_NOT_READY,
                    s ? "out of memory" : "the store is not open");
  }
  size_t k = 0;
  for (kcd_resp_job *j = jobs; j; j = j->next) {
    memcpy(all + k, j->ops, j->nops * sizeof *all);
    k += j->nops;
  }
  char err[KC_ERRBUF_SIZE] = "";
  kc_err e = kc_store_kv_apply(s, all, n, kc_clock_wall_ms(), err);
  k = 0;
  for (kcd_resp_job *j = jobs; j; j = j->next) {
    memcpy(j->ops, all + k, j->nops * sizeof *all);
    k += j->nops;
    if (e) {
      j->err = e;
      snprintf(j->errmsg, sizeof j->errmsg, "%s", *err ? err : kc_strerror(e));
    }
  }
  free(all);
  atomic_fetch_add(&r->commits, 1);
  observe_batch(r, n);
  if (e)
    atomic_fetch_add(&r->commit_errors, 1);
  else
    atomic_fetch_add(&r->committed_ops, n);
}

static void *commit_main(void *arg) {
  kcd_resp *r = arg;
  size_t n, njobs = 0;
  kcd_resp_job *jobs;
  while ((jobs = take(r, &n, &njobs))) {
    apply(r, jobs, n);
    while (jobs) {
      kcd_resp_job *next = jobs->next;
      kcd_resp_job_done(r, jobs);
      jobs = next;
    }
  }
  return NULL;
}

int kcd_resp_commit_start(kcd_resp *r) {
  pthread_condattr_t a;
  if (pthread_condattr_init(&a))
    return -1;
  int bad = pthread_condattr_setclock(&a, CLOCK_MONOTONIC) ||
            pthread_cond_init(&r->ccond, &a);
  pthread_condattr_destroy(&a);
  if (bad)
    return -1;
  r->qlen = r->qwant = 0;
  if (pthread_create(&r->committer, NULL, commit_main, r)) {
    pthread_cond_destroy(&r->ccond);
    return -1;
  }
  r->committer_started = 1;
  return 0;
}

void kcd_resp_commit_stop(kcd_resp *r) {
  if (!r->committer_started)
    return;
  pthread_mutex_lock(&r->qlock);
  r->qstop = 1;
  pthread_cond_signal(&r->ccond);
  pthread_mutex_unlock(&r->qlock);
  pthread_join(r->committer, NULL);
  pthread_cond_destroy(&r->ccond);
  r->committer_started = 0;
}
