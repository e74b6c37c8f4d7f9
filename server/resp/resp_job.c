/* resp_job.c: a RESP job's life. A connection's write commands fill one
 * job (kcd_resp_job_of: ops for the store, items saying how each command
 * is answered); the listener hands it to the committer
 * (kcd_resp_commit_submit, resp.c's submit), which applies it in a group
 * commit (resp_commit.c) and hands it back (kcd_resp_job_done); the
 * listener then writes its replies (kcd_resp_job_reply) and frees it. A
 * read-through job (resp_fetch.c) takes the fetchers' queue instead. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "resp.h"

/* ---- making and filling ---- */

kcd_resp_job *kcd_resp_job_new(kcd_resp_conn *c) {
  kcd_resp_job *j = calloc(1, sizeof *j);
  if (j)
    j->conn = c;
  if (j && c) /* replies made before the commit: the connection's limit */
    j->pre.limit = c->out.limit;
  return j;
}

void kcd_resp_job_free(kcd_resp_job *j) {
  if (!j)
    return;
  for (size_t i = 0; i < j->nops; i++)
    free(j->ops[i].old);
  for (size_t i = 0; i < j->nowned; i++)
    free(j->owned[i]);
  free(j->owned);
  free(j->ops);
  free(j->items);
  kcd_resp_buf_free(&j->pre);
  free(j);
}

kc_store_kv_op *kcd_resp_job_op(kcd_resp_job *j, kc_store_kv_opcode op,
                                const void *key, size_t klen) {
  if (j->nops == j->capops) {
    size_t cap = j->capops ? j->capops * 2 : 8;
    kc_store_kv_op *v = realloc(j->ops, cap * sizeof *v);
    if (!v)
      return NULL;
    j->ops = v;
    j->capops = cap;
  }
  kc_store_kv_op *o = &j->ops[j->nops++];
  memset(o, 0, sizeof *o);
  o->op = op;
  o->key = key;
  o->klen = klen;
  return o;
}

int kcd_resp_job_item(kcd_resp_job *j, kcd_resp_rk kind, size_t first) {
  if (j->nitems == j->capitems) {
    size_t cap = j->capitems ? j->capitems * 2 : 8;
    kcd_resp_item *v = realloc(j->items, cap * sizeof *v);
    if (!v)
      return -1;
    j->items = v;
    j->capitems = cap;
  }
  size_t end = kind == KCD_RK_PRE ? j->pre.len : j->nops;
  kcd_resp_conn *c = j->conn;
  j->items[j->nitems++] =
      (kcd_resp_item){kind, first, end - first, c ? c->resp3 : 0,
                      c && kind != KCD_RK_PRE ? c->cur_cmd : 0};
  return 0;
}

kcd_resp_job *kcd_resp_job_of(kcd_resp_ctx *x) {
  if (!x->job && !(x->job = kcd_resp_job_new(x->c)))
    kcd_resp_error(x->out, "OOM out of memory");
  return x->job;
}

/* ---- to the committer and back ---- */

void kcd_resp_job_append(kcd_resp_job **head, kcd_resp_job **tail,
                         kcd_resp_job *j) {
  j->next = NULL;
  if (*tail)
    (*tail)->next = j;
  else
    *head = j;
  *tail = j;
}

void kcd_resp_commit_submit(kcd_resp *r, kcd_resp_job *j) {
  pthread_mutex_lock(&r->qlock);
  kcd_resp_job_append(&r->qhead, &r->qtail, j);
  /* wake the committer only when it waits for this many (its wait_for,
   * resp_commit.c): a gather's writers arriving one by one do not each
   * switch to it */
  if (++r->qlen >= r->qwant && r->qwant)
    pthread_cond_signal(&r->ccond);
  pthread_mutex_unlock(&r->qlock);
}

/* Only the first job of a list the listener has not taken yet rings the
 * eventfd: on_done takes the whole list (a commit of 30 jobs: one write,
 * one wakeup, not 30). */
void kcd_resp_job_done(kcd_resp *r, kcd_resp_job *j) {
  pthread_mutex_lock(&r->dlock);
  int ring = !r->dhead;
  kcd_resp_job_append(&r->dhead, &r->dtail, j);
  pthread_mutex_unlock(&r->dlock);
  uint64_t one = 1;
  ssize_t n = ring ? write(r->efd, &one, sizeof one) : 0;
  (void)n;
}

/* ---- replies of committed writes ---- */

static void reply_ops(const kcd_resp_job *j, const kcd_resp_item *it,
                      kcd_resp_buf *out) {
  const kc_store_kv_op *o = j->ops + it->first;
  if (j->err)
    return kcd_resp_store_err(out, j->err, j->errmsg);
  long long sum = 0;
  for (size_t k = 0; k < it->n; k++) {
    if (o[k].err)
      return kcd_resp_store_err(out, o[k].err, NULL);
    sum += (long long)o[k].done;
  }
  switch (it->kind) {
  case KCD_RK_OK:
    return kcd_resp_simple(out, "OK");
  case KCD_RK_SET:
    return it->n && o[0].done ? kcd_resp_simple(out, "OK")
                              : kcd_resp_nil(out, it->resp3);
  case KCD_RK_SET_GET:
    return it->n && o[0].had_old ? kcd_resp_bulk(out, o[0].old, o[0].old_len)
                                 : kcd_resp_nil(out, it->resp3);
  default:
    return kcd_resp_int(out, sum);
  }
}

/* A write's result is counted in /metrics once known: an error found at
 * commit time counts as an error. */
static void count_reply(const kcd_resp_job *j, const kcd_resp_item *it,
                        const kcd_resp_buf *out, size_t before) {
  if (!it->cmd || !j->conn)
    return;
  kcd_resp *r = j->conn->srv;
  int err = out->len > before && out->p[before] == '-';
  atomic_fetch_add(err ? &r->cmd_err[it->cmd - 1] : &r->cmd_ok[it->cmd - 1], 1);
}

/* The SETs of a committed item, under kcached_ops_total's op="set" (the
 * ones the committed state settled are counted in resp_kv.c). */
static void count_sets(const kcd_resp_job *j, const kcd_resp_item *it) {
  if (it->kind == KCD_RK_PRE || !j->conn)
    return;
  kcd_svc_kv_sets_done(j->conn->srv->st, KCD_FE_RESP, j->ops + it->first, it->n,
                       j->err);
}

void kcd_resp_job_reply(kcd_resp_job *j, kcd_resp_buf *out) {
  for (size_t i = 0; i < j->nitems; i++) {
    const kcd_resp_item *it = &j->items[i];
    size_t before = out->len;
    if (it->kind == KCD_RK_PRE)
      kcd_resp_buf_add(out, j->pre.p + it->first, it->n);
    else
      reply_ops(j, it, out);
    count_reply(j, it, out, before);
    count_sets(j, it);
  }
}
