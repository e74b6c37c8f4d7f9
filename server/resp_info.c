/* resp_info.c: INFO (sections server, clients, memory, stats, keyspace)
 * with kcached's true figures, in Redis's "# Section\r\nkey:value\r\n"
 * text. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "resp.h"

#ifndef KCACHE_VERSION
#define KCACHE_VERSION "0.1.0"
#endif

static void linef(kcd_resp_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void linef(kcd_resp_buf *b, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n > 0)
    kcd_resp_buf_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
  kcd_resp_buf_add(b, "\r\n", 2);
}

static void sec_server(kcd_resp_ctx *x, kcd_resp_buf *b) {
  int64_t up = kcd_unix_now() - x->st->started;
  linef(b, "# Server");
  linef(b, "redis_version:7.0.0");
  linef(b, "redis_mode:standalone");
  linef(b, "kcached_version:%s", KCACHE_VERSION);
  linef(b, "arch_bits:%d", (int)(sizeof(void *) * 8));
  linef(b, "process_id:%ld", (long)getpid());
  linef(b, "tcp_port:%llu", (unsigned long long)kcd_resp_port(x->c->srv));
  linef(b, "uptime_in_seconds:%lld", (long long)up);
  linef(b, "uptime_in_days:%lld", (long long)(up / 86400));
}

static void sec_clients(kcd_resp_ctx *x, kcd_resp_buf *b) {
  linef(b, "# Clients");
  linef(b, "connected_clients:%zu", kcd_resp_clients(x->c->srv));
  linef(b, "maxclients:%d", KCD_RESP_MAX_CONNS);
}

static void sec_memory(const kc_store_stats *s, kcd_resp_ctx *x,
                       kcd_resp_buf *b) {
  linef(b, "# Memory");
  linef(b, "used_memory:%llu", (unsigned long long)s->kv_bytes);
  linef(b, "used_memory_dataset:%llu", (unsigned long long)s->kv_bytes);
  linef(b, "kcached_store_bytes:%llu", (unsigned long long)s->bytes_used);
  linef(b, "maxmemory:%llu", (unsigned long long)x->st->cfg.resp_max_bytes);
  linef(b, "maxmemory_policy:allkeys-lru");
}

static void sec_stats(const kc_store_stats *s, kcd_resp_ctx *x,
                      kcd_resp_buf *b) {
  kcd_resp *r = x->c->srv;
  linef(b, "# Stats");
  linef(b, "total_connections_received:%llu",
        (unsigned long long)atomic_load(&r->conns_total));
  linef(b, "total_commands_processed:%llu",
        (unsigned long long)atomic_load(&r->commands_total));
  linef(b, "keyspace_hits:%llu", (unsigned long long)s->kv_hits);
  linef(b, "keyspace_misses:%llu", (unsigned long long)s->kv_misses);
  linef(b, "kcached_commits:%llu", (unsigned long long)atomic_load(&r->commits));
  linef(b, "kcached_committed_ops:%llu",
        (unsigned long long)atomic_load(&r->committed_ops));
}

/* ---- counting keys with an expiry ---- */

#define EXPIRES_WALK_MAX 100000 /* keys looked at; beyond, extrapolated */

typedef struct walk {
  kcd_resp_buf keys; /* 4-byte length + key, one SCAN step's */
  size_t n;
} walk;

static int walk_cb(const void *key, size_t klen, void *ud) {
  walk *w = ud;
  uint32_t l = (uint32_t)klen;
  kcd_resp_buf_add(&w->keys, &l, 4);
  kcd_resp_buf_add(&w->keys, key, klen);
  w->n++;
  return w->keys.oom;
}

/* Of the keys in w, how many have an expiry. */
static uint64_t with_expiry(kc_store *s, const walk *w, int64_t now) {
  kc_store_read *r = NULL;
  uint64_t n = 0;
  if (kc_store_read_begin(s, &r))
    return 0;
  for (size_t off = 0; off + 4 <= w->keys.len;) {
    uint32_t l;
    memcpy(&l, w->keys.p + off, 4);
    uint64_t size;
    int64_t exp = 0;
    if (kc_store_kv_meta(r, w->keys.p + off + 4, l, now, &size, &exp) ==
            KC_OK && exp)
      n++;
    off += 4 + l;
  }
  kc_store_read_end(r);
  return n;
}

/* INFO's expires=: counted over the key space (SCAN steps, then their
 * metadata), exact up to EXPIRES_WALK_MAX keys, extrapolated beyond. */
static uint64_t count_expires(kc_store *s, uint64_t keys, int64_t now) {
  uint64_t cursor = 0, seen = 0, expiring = 0;
  do {
    walk w = {0};
    if (kc_store_kv_scan(s, cursor, NULL, 0, 1000, now, walk_cb, &w, &cursor)) {
      kcd_resp_buf_free(&w.keys);
      break;
    }
    expiring += with_expiry(s, &w, now);
    seen += w.n;
    kcd_resp_buf_free(&w.keys);
  } while (cursor != 0 && seen < EXPIRES_WALK_MAX);
  if (cursor != 0 && seen && keys > seen)
    expiring = (uint64_t)((double)expiring * (double)keys / (double)seen);
  return expiring;
}

static void sec_keyspace(const kc_store_stats *s, kcd_resp_ctx *x,
                         kcd_resp_buf *b) {
  linef(b, "# Keyspace");
  kc_store *st = atomic_load(&x->st->store);
  if (s->kv_keys && st) /* Redis leaves an empty db out */
    linef(b, "db0:keys=%llu,expires=%llu,avg_ttl=0",
          (unsigned long long)s->kv_keys,
          (unsigned long long)count_expires(st, s->kv_keys, x->now_ms));
}

typedef enum { S_SERVER, S_CLIENTS, S_MEMORY, S_STATS, S_KEYSPACE, S_N } sec;
static const char *const sec_names[S_N] = {"server", "clients", "memory",
                                           "stats", "keyspace"};

/* Which sections the arguments ask for (none, all, default, everything:
 * every one); unknown names add nothing. */
static void wanted(kcd_resp_ctx *x, int want[S_N]) {
  int all = x->argc == 1;
  for (size_t i = 1; i < x->argc; i++) {
    if (kcd_resp_is(x->argv[i], x->lens[i], "all") ||
        kcd_resp_is(x->argv[i], x->lens[i], "default") ||
        kcd_resp_is(x->argv[i], x->lens[i], "everything"))
      all = 1;
    for (int s = 0; s < S_N; s++)
      want[s] |= kcd_resp_is(x->argv[i], x->lens[i], sec_names[s]);
  }
  for (int s = 0; s < S_N && all; s++)
    want[s] = 1;
}

void kcd_resp_c_info(kcd_resp_ctx *x) {
  int want[S_N] = {0};
  wanted(x, want);
  kc_store_stats st = {0};
  kc_store *s = atomic_load(&x->st->store);
  if ((want[S_MEMORY] || want[S_STATS] || want[S_KEYSPACE]) && s)
    kc_store_stats_get(s, &st);
  kcd_resp_buf b = {0};
  for (int i = 0; i < S_N; i++) {
    if (!want[i])
      continue;
    if (b.len)
      kcd_resp_buf_add(&b, "\r\n", 2);
    if (i == S_SERVER)
      sec_server(x, &b);
    else if (i == S_CLIENTS)
      sec_clients(x, &b);
    else if (i == S_MEMORY)
      sec_memory(&st, x, &b);
    else if (i == S_STATS)
      sec_stats(&st, x, &b);
    else
      sec_keyspace(&st, x, &b);
  }
  if (b.oom)
    kcd_resp_error(x->out, "OOM out of memory");
  else
    kcd_resp_bulk(x->out, b.p ? b.p : "", b.len);
  kcd_resp_buf_free(&b);
}

/* ---- /metrics ---- */

void kcd_resp_metrics_render(kcd_state *st, void *fp) {
  FILE *f = fp;
  kcd_resp *r = st->resp;
  if (!r)
    return;
  fprintf(f, "# HELP kcached_resp_commands_total RESP commands by command and "
          "result (error: an error reply).\n# TYPE "
          "kcached_resp_commands_total counter\n");
  for (size_t i = 0; i <= kcd_resp_cmd_count(); i++) {
    const kcd_resp_cmd *c = kcd_resp_cmd_at(i);
    const char *name = c ? c->name : "unknown";
    fprintf(f, "kcached_resp_commands_total{cmd=\"%s\",result=\"ok\"} %llu\n"
            "kcached_resp_commands_total{cmd=\"%s\",result=\"error\"} %llu\n",
            name, (unsigned long long)atomic_load(&r->cmd_ok[i]), name,
            (unsigned long long)atomic_load(&r->cmd_err[i]));
  }
  fprintf(f, "# HELP kcached_resp_connections RESP connections open.\n"
          "# TYPE kcached_resp_connections gauge\nkcached_resp_connections "
          "%zu\n", kcd_resp_clients(r));
  fprintf(f, "# HELP kcached_resp_commits_total Group commits of RESP writes "
          "(one LMDB transaction each).\n# TYPE kcached_resp_commits_total "
          "counter\nkcached_resp_commits_total %llu\n",
          (unsigned long long)atomic_load(&r->commits));
  fprintf(f, "# HELP kcached_resp_committed_ops_total RESP write ops "
          "committed.\n# TYPE kcached_resp_committed_ops_total counter\n"
          "kcached_resp_committed_ops_total %llu\n",
          (unsigned long long)atomic_load(&r->committed_ops));
}
