/* warm_build.c: kc_warm's builds: single-flight through leases (phase 3),
 * uploads, and the wait for other builders (phase 4). */
#include "warm.h"

/* ---- phase 3: build (single-flight through leases) ---- */

/* Fetches a bundle that appeared on the server. */
static kc_err fetch_one(wctx *x, size_t i, kc_warm_status s, char *err) {
  kc_manifest *m = NULL;
  uint64_t got = 0;
  kc_err e = kc_client_bundle_get(x->c, x->rep->items[i].key, &m, err);
  const kc_file **d = m ? calloc(m->n_files + 1, sizeof *d) : NULL;
  if (!e && !d)
    e = kc_errf(err, KC_NOMEM, "out of memory");
  for (size_t j = 0; !e && j < m->n_files; j++)
    d[j] = &m->files[j];
  if (!e)
    e = kcc_fetch_blobs(x->c, d, m->n_files, NULL, &got, err);
  free(d);
  x->rep->bytes_fetched += got;
  if (!e)
    e = kc_cache_bundle_put(x->c, m, err);
  if (e) {
    kc_manifest_free(m);
    return e;
  }
  kcw_ready(x, i, s, m);
  return KC_OK;
}

/* The rebuilt bundle's blobs go back to a server that served one of them
 * corrupt (its manifest stays: the server holds one for the key). */
static void offer_blobs(wctx *x, const kc_manifest *m) {
  char e2[KC_ERRBUF_SIZE] = "", why[KC_ERRBUF_SIZE + 64];
  kc_err e = KC_OK;
  for (size_t j = 0; !e && j < m->n_files; j++) {
    void *data = NULL;
    size_t len = 0;
    e = kcc_cache_blob_read(x->c, m->files[j].sha256, m->files[j].size, &data,
                            &len, e2);
    if (!e)
      e = kc_client_blob_repair(x->c, data, len, e2);
    free(data);
  }
  if (kcw_is_down(e)) {
    kcw_server_down(x, e2);
  } else if (e) {
    snprintf(why, sizeof why, "offering a bundle's blobs back: %s", e2);
    kcw_warn(x, why);
  }
}

/* The token cannot write (a lease or an upload got 401/403): nothing is
 * uploaded for the rest of the warm. A 403 (the token's role refused) the
 * client remembers for its life (a later warm does not offer hit-local
 * bundles back); a 401 may be a token being reloaded, so the next warm
 * tries again. */
static void cannot_write(wctx *x, kc_err e, const char *why) {
  kcw_refused(x, e, why);
  if (!x->cant_write)
    snprintf(x->cant_why, sizeof x->cant_why, "%.400s", why);
  x->cant_write = 1;
  if (e == KC_FORBIDDEN)
    x->c->cant_write = 1;
}

void kcw_upload(wctx *x, size_t i, const kc_manifest *m) {
  char e2[KC_ERRBUF_SIZE];
  kc_warm_item *it = &x->rep->items[i];
  if (x->o->no_upload || !x->server_ok)
    return;
  if (x->remote_bad[i] == BAD_BLOB)
    offer_blobs(x, m);
  if (x->remote_bad[i])
    return;
  kc_err e = x->cant_write ? KC_FORBIDDEN : kc_client_push(x->c, m, e2);
  if (!e)
    it->uploaded = 1;
  else if (kcw_is_down(e))
    kcw_server_down(x, e2);
  else if (e == KC_FORBIDDEN || e == KC_UNAUTHORIZED) {
    /* the token cannot write: said once per item, asked once per warm */
    cannot_write(x, e, e2);
    snprintf(it->message, sizeof it->message,
             "not uploaded: the token cannot write (%.420s)", x->cant_why);
  } else if (e == KC_CONFLICT) /* write-once: another build got there first */
    snprintf(it->message, sizeof it->message,
             "not uploaded: kcached already holds another build of this key "
             "(the first complete upload wins)");
  else
    snprintf(it->message, sizeof it->message, "upload failed: %.450s", e2);
}

/* One build to run: the item, and the lease we hold on it (if any). The
 * build fills m or e and msg; only the calling process touches the report,
 * the client's HTTP handles and the leases. */
typedef struct job {
  size_t i;
  int leased;
  char token[KC_LEASE_TOKEN_MAX];
  kc_manifest *m;
  kc_err e;
  char msg[KC_ERRBUF_SIZE];
} job;

/* Builds into the local cache. */
static void run_job(wctx *x, job *j) {
  j->e = kcc_build_key(x->c, x->w, &x->fields[j->i], kcw_seconds_left(x), &j->m,
                       j->msg);
  if (!j->e && strcmp(j->m->key, x->rep->items[j->i].key) != 0)
    j->e = kc_errf(j->msg, KC_INTERNAL, "built bundle's key differs");
  if (!j->e)
    j->e = kc_cache_bundle_put(x->c, j->m, j->msg);
}

/* What a build process reports per job: small enough (< PIPE_BUF) for one
 * atomic write. */
typedef struct job_rec {
  size_t k;
  kc_err e;
  char msg[KC_ERRBUF_SIZE];
} job_rec;

/* A build process: jobs k, k + stride, ... into the local cache (atomic
 * renames, so processes never see each other's half files), results down
 * the pipe. _exit: the parent's handles and atexit work are not ours. */
static void build_proc(wctx *x, job *jobs, size_t n, size_t k, size_t stride,
                       int fd) {
  for (; k < n; k += stride) {
    job_rec r = {.k = k};
    run_job(x, &jobs[k]);
    r.e = jobs[k].e;
    memcpy(r.msg, jobs[k].msg, sizeof r.msg);
    if (write(fd, &r, sizeof r) != (ssize_t)sizeof r)
      _exit(1);
  }
  _exit(0);
}

/* Takes the results of one build process; its manifests come back from the
 * local cache (verified on the way). */
static void collect(wctx *x, job *jobs, size_t n, int fd, pid_t pid) {
  job_rec r;
  while (read(fd, &r, sizeof r) == (ssize_t)sizeof r) {
    if (r.k >= n)
      continue;
    job *j = &jobs[r.k];
    j->e = r.e;
    memcpy(j->msg, r.msg, sizeof j->msg);
    if (!j->e)
      j->e = kc_cache_bundle_get(x->c, x->rep->items[j->i].key, &j->m, j->msg);
  }
  close(fd);
  waitpid(pid, NULL, 0);
}

/* Runs n builds, up to x->jobs at once in forked processes. Processes, not
 * threads: kc_gpu_build forks, and forking from a multi-threaded process is
 * unsafe under sanitizers and with allocators other than glibc's. A job no
 * process reported on (it crashed, or fork failed) runs here. */
static void run_jobs(wctx *x, job *jobs, size_t n) {
  size_t np = n < (size_t)x->jobs ? n : (size_t)x->jobs;
  pid_t pids[KC_MAX_BUILD_JOBS];
  int fds[KC_MAX_BUILD_JOBS];
  for (size_t k = 0; k < n; k++) { /* "not reported" until a process does */
    jobs[k].e = KC_INTERNAL;
    jobs[k].msg[0] = '\0';
  }
  fflush(NULL);
  for (size_t p = 0; np > 1 && p < np; p++) {
    int fd[2];
    pids[p] = -1;
    if (pipe(fd) != 0)
      continue;
    pids[p] = fork();
    if (pids[p] == 0) {
      close(fd[0]);
      build_proc(x, jobs, n, p, np, fd[1]);
    }
    close(fd[1]);
    fds[p] = fd[0];
    if (pids[p] < 0)
      close(fd[0]);
  }
  for (size_t p = 0; np > 1 && p < np; p++)
    if (pids[p] > 0)
      collect(x, jobs, n, fds[p], pids[p]);
  for (size_t k = 0; k < n; k++)
    if (jobs[k].e == KC_INTERNAL && !jobs[k].msg[0])
      run_job(x, &jobs[k]);
}

/* Upload, release, record: on the calling thread. */
static void finish_job(wctx *x, job *j) {
  if (j->e) {
    kc_manifest_free(j->m);
    kcw_failed(x, j->i, kcw_deadline_passed(x) ? KC_DEADLINE : j->e, j->msg);
  } else {
    kcw_upload(x, j->i, j->m);
    kcw_ready(x, j->i, KC_WARM_BUILT, j->m);
  }
  if (j->leased && x->server_ok)
    kc_client_lease_release(x->c, x->rep->items[j->i].key, j->token, NULL);
  j->m = NULL;
}

static void build_all(wctx *x, job *jobs, size_t n) {
  if (!n)
    return;
  run_jobs(x, jobs, n);
  for (size_t k = 0; k < n; k++)
    finish_job(x, &jobs[k]);
}

/* Item i's lease is another's: remembered for the report, polled until the
 * lease ends; with a deadline, built here anyway once lease_wait_s (or
 * half of what was left) has passed: a holder that died, hangs or squats
 * must not cost the whole deadline when this host can build. */
static void held(wctx *x, size_t i, const kcc_lease_info *li) {
  kc_warm_item *it = &x->rep->items[i];
  int64_t now = kc_clock_mono_ms();
  x->waiting[i] = 1;
  x->retry_at[i] = now + (int64_t)li->retry_after_s * 1000;
  snprintf(it->lease_holder, sizeof it->lease_holder, "%s",
           li->holder[0] ? li->holder : "(not said)");
  it->lease_expires_s = li->expires_s < 0 ? -1 : kcw_since(x) + li->expires_s;
  it->lease_expires_at[0] = '\0';
  if (li->expires_s >= 0) {
    time_t end = time(NULL) + (time_t)li->expires_s;
    struct tm tm;
    gmtime_r(&end, &tm);
    strftime(it->lease_expires_at, sizeof it->lease_expires_at,
             "%Y-%m-%dT%H:%M:%SZ", &tm);
  }
  double wait = x->o->lease_wait_s;
  if (x->build_at[i] || !x->c->deadline_ms || wait < 0)
    return;
  x->build_at[i] =
      now + (wait > 0 ? (int64_t)(wait * 1000) : (x->c->deadline_ms - now) / 2);
}

/* A waiting key whose holder has had its share of the deadline: built here
 * without the lease (j filled). */
static void take_over(wctx *x, size_t i, job *j) {
  kc_warm_item *it = &x->rep->items[i];
  memset(j, 0, sizeof *j);
  j->i = i;
  x->waiting[i] = 0;
  snprintf(it->message, sizeof it->message,
           "built here: '%.200s' holds the lease (until %s) and had not "
           "delivered after %.1f s",
           it->lease_holder,
           it->lease_expires_at[0] ? it->lease_expires_at : "unknown",
           kcw_since(x));
}

/* What to do with item i: 1 when this warmer must build it (j filled),
 * 0 when it was fetched, failed, or another builder holds its lease. */
static int claim(wctx *x, size_t i, int was_waiting, job *j) {
  char e2[KC_ERRBUF_SIZE];
  kc_lease_state st;
  int ttl = x->o->lease_ttl_s > 0 ? x->o->lease_ttl_s : 300;
  memset(j, 0, sizeof *j);
  j->i = i;
  if (!x->server_ok || x->remote_bad[i])
    return 1;
  kcc_lease_info li;
  kc_err e =
      kcc_lease_take(x->c, x->rep->items[i].key, ttl, &st, j->token, &li, e2);
  if (kcw_is_down(e)) {
    kcw_server_down(x, e2);
    return 1;
  }
  if (e) { /* e.g. a read-only token: build for ourselves */
    if (e == KC_FORBIDDEN || e == KC_UNAUTHORIZED)
      cannot_write(x, e, e2);
    snprintf(x->rep->items[i].message, KC_ERRBUF_SIZE, "lease: %.450s", e2);
    kcw_warn(x, e2);
    x->remote_bad[i] = BAD_OTHER;
    return 1;
  }
  if (st == KC_LEASE_HELD) { /* ask again when the holder's lease ends */
    held(x, i, &li);
    return 0;
  }
  if (st == KC_LEASE_GRANTED) {
    j->leased = 1;
    return 1;
  }
  e = fetch_one(x, i, was_waiting ? KC_WARM_WAITED : KC_WARM_HIT_REMOTE, e2);
  if (e && kcw_deadline_passed(x)) {
    kcw_failed(x, i, KC_DEADLINE, e2);
    return 0;
  }
  if (e) { /* present but unusable: never used, rebuilt here */
    x->remote_bad[i] = e == KC_DIGEST_MISMATCH ? BAD_BLOB : BAD_OTHER;
    snprintf(x->rep->items[i].message, KC_ERRBUF_SIZE, "%s", e2);
  }
  return e != KC_OK;
}

/* Whether item i's key had stand-ins looked for, in words: which archs
 * that run on the device were asked for and not found, or why none were. */
static void compat_said(wctx *x, size_t i, char *out, size_t size) {
  const kcc_compat *cp = kcw_compat(x);
  const char *arch = x->rep->items[i].arch;
  if (x->o->no_compat) {
    snprintf(out, size, "no compatible bundle looked for (--no-compat)");
    return;
  }
  if (!cp || !cp->on) {
    snprintf(out, size,
             "no compatible bundle looked for (no GPU detected; "
             "--device-arch names one)");
    return;
  }
  if (!kcc_compat_applies(cp, arch)) {
    snprintf(out, size,
             "no compatible bundle looked for (%s does not run "
             "on %s)",
             arch, cp->device);
    return;
  }
  size_t n = (size_t)snprintf(out, size,
                              "no compatible bundle found either "
                              "(looked for");
  size_t k = 0;
  for (size_t a = 0; a < cp->n_archs && n < size; a++) {
    if (!strcmp(cp->archs[a], arch))
      continue;
    if (k++ == 6) {
      n += (size_t)snprintf(out + n, size - n, " and %zu more",
                            cp->n_archs - a - 1);
      break;
    }
    n += (size_t)snprintf(out + n, size - n, "%s %s", k > 1 ? "," : "",
                          cp->archs[a]);
  }
  if (n < size)
    snprintf(out + n, size - n, "%s: what runs on %s)", k ? "" : " none",
             cp->device);
}

/* Fetch only: the key fails, with the server's failure when there was one
 * (a stalled, reset or garbled answer is not "missing"), and whether a
 * compatible bundle was looked for. */
static void fail_no_build(wctx *x, size_t i) {
  char msg[KC_ERRBUF_SIZE], alt[KC_ERRBUF_SIZE / 2];
  const char *why = "";
  kc_err e = kcw_remote_cause(x, i, &why);
  compat_said(x, i, alt, sizeof alt);
  if (!e) {
    snprintf(msg, sizeof msg, "not cached; %s; and --no-build", alt);
    kcw_failed(x, i, KC_NOT_FOUND, msg);
    return;
  }
  snprintf(msg, sizeof msg, "not fetched (%.200s); %.250s; and --no-build", why,
           alt);
  kcw_failed(x, i, e, msg);
}

/* Claims up to x->jobs keys, builds them at once, repeats: leases are taken
 * just before building, so concurrent warmers split the remaining keys. */
static void claim_and_build(wctx *x, int waiting_round) {
  job jobs[KC_MAX_BUILD_JOBS];
  size_t n = 0;
  for (size_t i = 0; i < x->rep->n_items; i++) {
    if (!x->pending[i] || x->waiting[i] != waiting_round)
      continue;
    if (kcw_deadline_passed(x))
      break;
    int64_t now = kc_clock_mono_ms();
    if (waiting_round && now < x->retry_at[i]) {
      if (!x->build_at[i] || now < x->build_at[i])
        continue;
      take_over(x, i, &jobs[n]);
      if (++n == (size_t)x->jobs) {
        build_all(x, jobs, n);
        n = 0;
      }
      continue;
    }
    if (x->o->no_build) { /* never claims, so never waits either */
      fail_no_build(x, i);
      continue;
    }
    if (!claim(x, i, waiting_round, &jobs[n]))
      continue;
    x->waiting[i] = 0;
    if (++n == (size_t)x->jobs) {
      build_all(x, jobs, n);
      n = 0;
    }
  }
  build_all(x, jobs, n);
}

void kcw_phase_build(wctx *x) { claim_and_build(x, 0); }

/* ---- phase 4: wait for other builders ---- */

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

static size_t n_waiting(const wctx *x) {
  size_t n = 0;
  for (size_t i = 0; i < x->rep->n_items; i++)
    n += x->pending[i] && x->waiting[i];
  return n;
}

/* Polls with one lookup per round for all waiting keys (a startup storm of
 * replicas costs one request each per round, backing off to 2 s); a key
 * whose holder's lease has run out is claimed again: built here if the
 * holder died, fetched if it just finished. */
void kcw_phase_wait(wctx *x) {
  double poll = x->o->poll_s > 0 ? x->o->poll_s : 0.2;
  x->fetched_as = KC_WARM_WAITED;
  while (n_waiting(x) && !kcw_deadline_passed(x)) {
    double left = kcw_seconds_left(x), nap = poll;
    if (x->c->deadline_ms && left < nap)
      nap = left;
    for (size_t i = 0; i < x->rep->n_items; i++) { /* a take-over due */
      double due = (x->build_at[i] - kc_clock_mono_ms()) / 1000.0;
      if (x->pending[i] && x->waiting[i] && x->build_at[i] && due < nap)
        nap = due > 0.01 ? due : 0.01;
    }
    sleep_s(nap);
    if (x->server_ok)
      kcw_phase_remote(x, 1);
    claim_and_build(x, 1);
    if (poll < 2.0)
      poll = poll * 1.5 < 2.0 ? poll * 1.5 : 2.0;
  }
}
