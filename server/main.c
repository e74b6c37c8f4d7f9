/* main.c: kcached's life: flags, the `token` subcommand, start-up checks,
 * the store and the HTTP daemon; then the main thread waits for signals
 * (SIGTERM/SIGINT stop, SIGHUP reloads tokens) and does the periodic work
 * (flush last-use records, GC, expired leases, retry opening the store).
 *
 * Signals are blocked in every thread and taken with sigtimedwait here, so
 * no handler runs asynchronously and no global flag is needed. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "kcd.h"
#include "sdnotify.h"

#define GC_EVERY_S 60
#define STORE_RETRY_S 5
#define EXIT_STORE 3 /* the store could not be opened */
#define MAX_LEASES 65536

static int read_pem(const char *path, char **out) {
  char err[KC_ERRBUF_SIZE];
  size_t len;
  if (kc_read_file(path, out, &len, err)) {
    fprintf(stderr, "kcached: %s\n", err);
    return -1;
  }
  return 0;
}

static int load_tls(kcd_state *st) {
  if (!st->cfg.tls_cert)
    return 0;
  if (!kcd_tls_supported()) {
    fprintf(stderr, "kcached: this libmicrohttpd has no TLS support\n");
    return -1;
  }
  return read_pem(st->cfg.tls_cert, &st->tls_cert_pem) ||
                 read_pem(st->cfg.tls_key, &st->tls_key_pem)
             ? -1
             : 0;
}

static void free_tls(kcd_state *st) {
  if (st->tls_key_pem)
    OPENSSL_cleanse(st->tls_key_pem, strlen(st->tls_key_pem));
  free(st->tls_key_pem);
  free(st->tls_cert_pem);
}

/* LMDB's reader table has one slot per read open at once. Each connection
 * may hold one (a small GET served zero-copy, a lookup), each worker thread
 * one more of the store's short reads, and the scrub, the S3 tier's fetches
 * and slack the rest. Too few slots (512 for 1,024 connections) answered
 * every read 503 "busy" while /readyz said 200. */
static unsigned reader_slots(const kcd_config *c) {
  uint64_t n = (uint64_t)c->max_conns + c->threads +
               (c->s3_parallel ? c->s3_parallel : 16) + 64;
  return n > (1u << 22) ? 1u << 22 : (unsigned)n;
}

/* 0 when the store is open; the error names the directory either way. */
static int open_store(kcd_state *st, int will_retry) {
  kc_store_opts o = {.dir = st->cfg.data_dir,
                     .max_bytes = st->cfg.max_bytes,
                     .max_readers = reader_slots(&st->cfg),
                     .s3 = kcd_s3_opts(st)};
  o.kv_max_bytes = st->cfg.resp_max_bytes;
  o.compress_level = st->cfg.compress_level;
  char err[KC_ERRBUF_SIZE] = "";
  kc_store *s = NULL;
  kc_err e = kc_store_open(&o, &s, err);
  if (e) {
    kcd_log(st, "error", "%s (%s)%s", *err ? err : kc_strerror(e),
            kc_err_name(e), will_retry ? "; retrying" : "");
    return -1;
  }
  atomic_store(&st->store, s);
  kcd_log(st, "info", "store open in %s", st->cfg.data_dir);
  if (*kc_store_names_unindexed(s))
    kcd_log(st, "warn", "%s", kc_store_names_unindexed(s));
  return 0;
}

/* Written to a temporary name first: a reader never sees half a number. */
static int write_port_file(const char *path, unsigned port) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "we");
  if (!f)
    return -1;
  fprintf(f, "%u\n", port);
  if (fclose(f) != 0 || rename(tmp, path) != 0) {
    unlink(tmp);
    return -1;
  }
  return 0;
}

static void reload_tokens(kcd_state *st) {
  char err[KC_ERRBUF_SIZE] = "";
  if (!st->cfg.tokens)
    return kcd_log(st, "info", "SIGHUP: no token file to reload");
  if (kcd_auth_load(&st->auth, st->cfg.tokens, err))
    return kcd_log(st, "error", "SIGHUP: %s; keeping the old tokens", err);
  kcd_log(st, "info", "SIGHUP: reloaded %zu tokens from %s",
          kcd_auth_count(&st->auth), st->cfg.tokens);
}

/* A second's share of the scrub: --scrub-rate bytes, less what a blob
 * larger than that overdrew before. */
static void scrub(kcd_state *st, kc_store *s) {
  int64_t rate = (int64_t)st->cfg.scrub_rate;
  if (rate <= 0)
    return;
  /* unspent credit does not pile up; a debt is paid off first */
  st->scrub_credit = st->scrub_credit > 0 ? rate : st->scrub_credit + rate;
  while (st->scrub_credit > 0) {
    char err[KC_ERRBUF_SIZE] = "";
    kc_store_scrub *sc = &st->scrub;
    kc_err e = kc_store_scrub_step(s, sc, (uint64_t)st->scrub_credit, err);
    st->scrub_credit -= (int64_t)sc->cost;
    if (e) { /* a damaged tree fails the same way again: wait a minute */
      kcd_log(st, "error", "scrub: %s; trying again in a minute",
              *err ? err : kc_strerror(e));
      st->scrub_credit = -60 * rate;
      return;
    }
    if (sc->removed)
      kcd_log(st, "warn",
              "scrub: blob %s no longer hashes to its name (bit "
              "rot); removed it and the %zu bundles naming it",
              sc->bad, sc->bundles);
    if (!sc->bad[0])
      return; /* the second's budget is spent, or a pass ended */
  }
}

/* A full disk is logged when writes start and stop failing for it, not once
 * per failed request. */
static void disk_watch(kcd_state *st, kc_store *s) {
  int64_t since = kc_store_disk_full_since(s);
  if (!since == !st->disk_full_logged)
    return;
  st->disk_full_logged = since != 0;
  if (since)
    kcd_log(st, "error",
            "the disk holding %s is full: writes fail (507 "
            "disk_full) and /readyz answers 503 until space is freed",
            st->cfg.data_dir);
  else
    kcd_log(st, "info", "writes succeed again in %s", st->cfg.data_dir);
}

/* RESP keys past their expiry: reclaimed a bounded batch per second (they
 * already read as missing). */
static void expire_kv(kcd_state *st, kc_store *s) {
  char err[KC_ERRBUF_SIZE] = "";
  size_t removed = 0;
  kc_err e =
      kc_store_kv_expire_step(s, kcd_unix_now() * 1000, 1000, &removed, err);
  if (e)
    kcd_log(st, "error", "expiring RESP keys: %s", *err ? err : kc_strerror(e));
}

/* A full reader table answers reads 503 "busy". Said once when reads start
 * being refused, and once when none was for READERS_QUIET_S seconds (not at
 * the first quiet second: where reads are rare, that would flap). */
#define READERS_QUIET_S 10

static void watch_readers(kcd_state *st, kc_store *s) {
  kc_store_read_stats rs;
  kc_store_read_stats_get(s, &rs);
  int refused = rs.readers_full != st->readers_full_seen;
  st->readers_full_seen = rs.readers_full;
  st->readers_quiet_s = refused ? 0 : st->readers_quiet_s + 1;
  if (refused && !st->readers_full_now) {
    st->readers_full_now = 1;
    kcd_log(st, "error",
            "the store's reader table is full (%u slots, %llu reads open "
            "here): reads are answered 503 busy; another process reading the "
            "store (mdb_copy?), or more connections than --max-connections",
            rs.max_readers, (unsigned long long)rs.open);
  } else if (st->readers_full_now && st->readers_quiet_s >= READERS_QUIET_S) {
    st->readers_full_now = 0;
    kcd_log(st, "info",
            "the store's reader table: no read refused for %d s "
            "(%llu refused since start)",
            READERS_QUIET_S, (unsigned long long)rs.readers_full);
  }
}

/* Housekeeping once a second; EXIT_STORE when the store could not be
 * opened within --store-wait. */
static int maintain(kcd_state *st, int64_t *last_gc, int64_t *last_open) {
  int64_t now = kcd_unix_now();
  kcd_log_flush(st);
  kcd_http_sweep(st);
  kcd_lease_sweep(st->leases, kc_clock_mono_ms());
  kcd_history_tick(st, now);
  kc_store *s = kcd_store(st);
  if (!s) {
    if (now - st->started >= (int64_t)st->cfg.store_wait_s) {
      kcd_log(st, "error", "no store after %u s (--store-wait): exiting",
              st->cfg.store_wait_s);
      return EXIT_STORE;
    }
    if (now - *last_open >= STORE_RETRY_S) {
      *last_open = now;
      open_store(st, 1);
    }
    return 0;
  }
  kc_err e = kc_store_flush(s);
  if (e)
    kcd_log(st, "error", "flushing last-use records: %s", kc_strerror(e));
  if ((e = kc_store_demand_flush(s, NULL))) /* demand reports, batched */
    kcd_log(st, "error", "writing demand reports: %s", kc_strerror(e));
  disk_watch(st, s);
  if (now - *last_gc >= GC_EVERY_S) {
    char err[KC_ERRBUF_SIZE] = "";
    *last_gc = now;
    if ((e = kc_store_gc(s, now, err)))
      kcd_log(st, "error", "gc: %s", *err ? err : kc_strerror(e));
  }
  scrub(st, s);
  expire_kv(st, s);
  watch_readers(st, s);
  return 0;
}

/* Runs until SIGTERM or SIGINT (0), or maintain gives up (its code). */
static int serve(kcd_state *st, const sigset_t *set) {
  int64_t last_gc = kcd_unix_now(), last_open = last_gc;
  for (;;) {
    struct timespec tick = {1, 0};
    int sig = sigtimedwait(set, NULL, &tick);
    if (sig == SIGTERM || sig == SIGINT) {
      kcd_log(st, "info", "%s: stopping", strsignal(sig));
      return 0;
    }
    if (sig == SIGHUP) {
      reload_tokens(st);
      continue;
    }
    int rc = maintain(st, &last_gc, &last_open);
    if (rc)
      return rc;
  }
}

/* Stop accepting, let in-flight operations of both front ends finish
 * (bounded: --shutdown-timeout), then close; RESP first sends what replies
 * it holds, until the same deadline (kcd_resp_stop). */
static void shut_down(kcd_state *st) {
  kcd_sd_notify("STOPPING=1");
  kcd_http_quiesce(st);
  kcd_resp_quiesce(st);
  uint64_t deadline =
      kc_clock_mono_us() + (uint64_t)st->cfg.shutdown_s * 1000000u;
  while (kcd_svc_in_flight(st) > 0 && kc_clock_mono_us() < deadline) {
    struct timespec ms10 = {0, 10 * 1000 * 1000};
    nanosleep(&ms10, NULL);
  }
  int64_t left = kcd_svc_in_flight(st);
  if (left > 0)
    kcd_log(st, "warn",
            "cutting off %lld operations still in flight (HTTP "
            "requests, RESP commands)",
            (long long)left);
  kcd_http_stop(st);
  kcd_resp_stop(st);
  kc_store *s = atomic_exchange(&st->store, NULL);
  kc_store_close(s);
  kcd_log(st, "info", "stopped");
}

static void announce(kcd_state *st, unsigned port) {
  const kcd_config *c = &st->cfg;
  int v6 = strchr(c->host, ':') != NULL;
  kcd_log(st, "info",
          "listening on %s://%s%s%s:%u (threads %u, data %s, tls %s, "
          "metrics role %s, demand role %s)",
          st->tls_cert_pem ? "https" : "http", v6 ? "[" : "", c->host,
          v6 ? "]" : "", port, c->threads, c->data_dir,
          st->tls_cert_pem ? "on" : "off", kcd_role_name(c->metrics_role),
          kcd_role_name(c->demand_role));
  if (!c->tokens)
    kcd_log(st, "warn",
            "no token file: every client may read, write and delete; serving "
            "loopback only (--tokens FILE to require tokens)");
  else if (kcd_auth_count(&st->auth) == 0)
    kcd_log(st, "warn",
            "no token in %s: every request that needs a role "
            "gets 401 until a SIGHUP loads some",
            c->tokens);
  else
    kcd_log(st, "info", "%zu tokens from %s", kcd_auth_count(&st->auth),
            c->tokens);
  if (c->s3_endpoint)
    kcd_log(st, "info", "durable tier: s3 %s bucket %s prefix %s/",
            c->s3_endpoint, c->s3_bucket,
            c->s3_prefix ? c->s3_prefix : "kcache");
  char status[128];
  snprintf(status, sizeof status, "READY=1\nSTATUS=listening on port %u", port);
  kcd_sd_notify(status);
}

static int start_resp(kcd_state *st) {
  char err[KC_ERRBUF_SIZE] = "";
  unsigned port = 0;
  if (!st->cfg.resp_on)
    return 0;
  if (kcd_resp_start(st, &port, err)) {
    kcd_log(st, "error", "%s", err);
    return 1;
  }
  kcd_log(
      st, "info", "RESP (Redis protocol) on %s:%u (anonymous role %s)",
      st->cfg.resp_host, port,
      kcd_role_name(st->cfg.tokens ? st->cfg.resp_anon_role : KCD_ROLE_ADMIN));
  return 0;
}

static int start(kcd_state *st, sigset_t *set) {
  char err[KC_ERRBUF_SIZE] = "";
  st->logbuf = kcd_logbuf_new(); /* NULL: lines are written one by one */
  if (kcd_log_access_open(st, err)) {
    fprintf(stderr, "kcached: %s\n", err);
    return 2;
  }
  if (kcd_auth_init(&st->auth))
    return 1;
  if (kcd_auth_load(&st->auth, st->cfg.tokens, err)) {
    fprintf(stderr, "kcached: %s\n", err);
    return 2;
  }
  if (load_tls(st))
    return 2;
  int rc = kcd_s3_setup(st);
  if (rc)
    return rc;
  if (!(st->leases = kcd_leases_new(MAX_LEASES)))
    return 1;
  sigemptyset(set);
  sigaddset(set, SIGTERM);
  sigaddset(set, SIGINT);
  sigaddset(set, SIGHUP);
  /* Before any thread exists, so that every thread inherits the mask. */
  pthread_sigmask(SIG_BLOCK, set, NULL);
  signal(SIGPIPE, SIG_IGN);
  st->started = kcd_unix_now();
  /* Fail fast by default: a wrong path or permission is for the operator
   * (systemd, Kubernetes) to see; --store-wait is for volumes that appear
   * late. */
  if (open_store(st, st->cfg.store_wait_s > 0) && !st->cfg.store_wait_s)
    return EXIT_STORE;
  unsigned port = 0;
  if (kcd_http_start(st, &port, err)) {
    kcd_log(st, "error", "%s", err);
    return 1;
  }
  if (st->cfg.port_file && write_port_file(st->cfg.port_file, port)) {
    kcd_log(st, "error", "cannot write %s: %s", st->cfg.port_file,
            strerror(errno));
    return 1;
  }
  announce(st, port);
  return start_resp(st);
}

static void cleanup(kcd_state *st) {
  kcd_http_stop(st);
  kcd_resp_stop(st);
  kc_store_close(atomic_exchange(&st->store, NULL));
  kcd_s3_free(st);
  kcd_leases_free(st->leases);
  kcd_history_free(st);
  kcd_auth_destroy(&st->auth);
  free_tls(st);
  kcd_logbuf *b = st->logbuf;
  st->logbuf = NULL; /* the lines that follow are written at once */
  kcd_logbuf_free(b);
}

static int run(kcd_state *st) {
  sigset_t set;
  int rc = start(st, &set);
  if (rc == 0) {
    rc = serve(st, &set);
    shut_down(st);
  }
  cleanup(st);
  return rc;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "token") == 0)
    return kcd_token_command(argc - 1, argv + 1);
  kcd_state *st = calloc(1, sizeof *st);
  if (!st || kc_store_global_init())
    return 1;
  int rc = kcd_config_parse(&st->cfg, argc, argv);
  if (rc == 0)
    rc = kcd_config_check(&st->cfg);
  if (rc == 0)
    rc = run(st);
  free(st);
  return rc < 0 ? 0 : rc; /* < 0: --help or --version */
}
