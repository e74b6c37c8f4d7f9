/* resp_info.c: INFO (sections server, clients, memory, stats, keyspace)
 * with kcached's true figures, in Redis's "# Section\r\nkey:value\r\n"
 * text. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

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
    kcd_resp_buf_add(b, tmp,
                     (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
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
  linef(b, "kcached_tls:%d", x->c->srv->tls_ctx != NULL);
  linef(b, "maxclients:%u", x->st->cfg.resp_max_conns);
}

/* The process's resident set, from /proc/self/statm; 0 when unknown. */
static uint64_t rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "re");
  unsigned long long size = 0, resident = 0;
  if (!f)
    return 0;
  int n = fscanf(f, "%llu %llu", &size, &resident);
  fclose(f);
  long page = sysconf(_SC_PAGESIZE);
  return n == 2 && page > 0 ? (uint64_t)resident * (uint64_t)page : 0;
}

/* used_memory is the RESP keys' value bytes (what maxmemory bounds), the
 * process's own memory is used_memory_rss. */
static void sec_memory(const kc_store_stats *s, kcd_resp_ctx *x,
                       kcd_resp_buf *b) {
  linef(b, "# Memory");
  linef(b, "used_memory:%llu", (unsigned long long)s->kv_bytes);
  linef(b, "used_memory_rss:%llu", (unsigned long long)rss_bytes());
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
  linef(b, "evicted_keys:%llu", (unsigned long long)s->evicted_kv);
  linef(b, "total_net_input_bytes:%llu",
        (unsigned long long)atomic_load(&r->bytes_in));
  linef(b, "total_net_output_bytes:%llu",
        (unsigned long long)atomic_load(&r->bytes_out));
  linef(b, "kcached_commits:%llu",
        (unsigned long long)atomic_load(&r->commits));
  linef(b, "kcached_committed_ops:%llu",
        (unsigned long long)atomic_load(&r->committed_ops));
}

static void sec_keyspace(const kc_store_stats *s, kcd_resp_ctx *x,
                         kcd_resp_buf *b) {
  linef(b, "# Keyspace");
  (void)x;
  if (s->kv_keys) /* Redis leaves an empty db out */
    linef(b, "db0:keys=%llu,expires=%llu,avg_ttl=0",
          (unsigned long long)s->kv_keys, (unsigned long long)s->kv_expires);
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
  kc_store *s = kcd_store(x->st);
  if ((want[S_MEMORY] || want[S_STATS] || want[S_KEYSPACE]) && s) {
    kcd_resp_read_forward(x->c); /* the stats are read on their own */
    kc_store_stats_get(s, &st);
  }
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
    kcd_resp_verbatim(x->out, b.p ? b.p : "", b.len, x->c->resp3);
  kcd_resp_buf_free(&b);
}

/* ---- /metrics ---- */

void kcd_resp_history(void *self, uint64_t v[KCD_H_N]) {
  kcd_resp *r = self;
  v[KCD_H_RESP] = atomic_load(&r->commands_total);
}

static void render_commands(FILE *f, kcd_resp *r) {
  fprintf(f,
          "# HELP kcached_resp_commands_total RESP commands by command and "
          "result (error: an error reply, a failed commit included).\n# TYPE "
          "kcached_resp_commands_total counter\n");
  for (size_t i = 0; i <= kcd_resp_cmd_count(); i++) {
    const kcd_resp_cmd *c = kcd_resp_cmd_at(i);
    const char *name = c ? c->name : "unknown";
    fprintf(f,
            "kcached_resp_commands_total{cmd=\"%s\",result=\"ok\"} %llu\n"
            "kcached_resp_commands_total{cmd=\"%s\",result=\"error\"} %llu\n",
            name, (unsigned long long)atomic_load(&r->cmd_ok[i]), name,
            (unsigned long long)atomic_load(&r->cmd_err[i]));
  }
}

/* Family names are printable without '"' or '\' (resp_family.c). */
static void family_line(const char *name, size_t len, uint64_t hits,
                        uint64_t misses, void *ud) {
  FILE *f = ud;
  int n = name ? (int)len : 5;
  const char *s = name ? name : "other";
  fprintf(f,
          "kcached_resp_key_reads_total{family=\"%.*s\",result=\"hit\"} "
          "%llu\nkcached_resp_key_reads_total{family=\"%.*s\",result=\"miss\"}"
          " %llu\n",
          n, s, (unsigned long long)hits, n, s, (unsigned long long)misses);
}

static void render_batches(FILE *f, kcd_resp *r) {
  fprintf(f, "# HELP kcached_resp_commit_batch_ops Write ops per group commit."
             "\n# TYPE kcached_resp_commit_batch_ops histogram\n");
  uint64_t cum = 0;
  for (int i = 0; i <= KCD_RESP_BATCH_BUCKETS; i++) {
    cum += atomic_load(&r->batch_bucket[i]);
    if (i < KCD_RESP_BATCH_BUCKETS)
      fprintf(f, "kcached_resp_commit_batch_ops_bucket{le=\"%u\"} %llu\n",
              kcd_resp_batch_le[i], (unsigned long long)cum);
    else
      fprintf(f, "kcached_resp_commit_batch_ops_bucket{le=\"+Inf\"} %llu\n",
              (unsigned long long)cum);
  }
  fprintf(f,
          "kcached_resp_commit_batch_ops_sum %llu\n"
          "kcached_resp_commit_batch_ops_count %llu\n",
          (unsigned long long)atomic_load(&r->batch_sum),
          (unsigned long long)cum);
}

void kcd_resp_metrics_render(void *self, void *fp) {
  FILE *f = fp;
  kcd_resp *r = self;
  render_commands(f, r);
  fprintf(f, "# HELP kcached_resp_key_reads_total RESP value reads (GET, MGET)"
             " by key family (the prefix before the first ':') and result.\n"
             "# TYPE kcached_resp_key_reads_total counter\n");
  kcd_resp_family_each(&r->families, family_line, f);
  fprintf(f,
          "# HELP kcached_resp_connections RESP connections open.\n"
          "# TYPE kcached_resp_connections gauge\nkcached_resp_connections "
          "%zu\n",
          kcd_resp_clients(r));
  kcd_metric_counter(f, "kcached_resp_connections_total",
                     "RESP connections accepted.",
                     atomic_load(&r->conns_total));
  kcd_metric_counter(
      f, "kcached_resp_tls_handshake_failures_total",
      "RESP connections closed before their TLS handshake ended.",
      atomic_load(&r->tls_failed));
  kcd_metric_counter(f, "kcached_resp_received_bytes_total",
                     "RESP bytes read from clients (after TLS).",
                     atomic_load(&r->bytes_in));
  kcd_metric_counter(f, "kcached_resp_sent_bytes_total",
                     "RESP bytes written to clients (before TLS).",
                     atomic_load(&r->bytes_out));
  kcd_metric_counter(f, "kcached_resp_commits_total",
                     "Group commits of RESP writes "
                     "(one LMDB transaction each).",
                     atomic_load(&r->commits));
  kcd_metric_counter(
      f, "kcached_resp_commit_errors_total",
      "Group commits that failed (every write of them replied an error).",
      atomic_load(&r->commit_errors));
  kcd_metric_counter(f, "kcached_resp_committed_ops_total",
                     "RESP write ops committed (failed commits not counted).",
                     atomic_load(&r->committed_ops));
  render_batches(f, r);
  fprintf(f, "# HELP kcached_resp_refused_total RESP connections refused or "
             "closed by a rule, by reason.\n# TYPE kcached_resp_refused_total "
             "counter\n");
  for (int i = 0; i < KCD_WHY_N; i++)
    fprintf(f, "kcached_resp_refused_total{reason=\"%s\"} %llu\n",
            kcd_resp_why_names[i],
            (unsigned long long)atomic_load(&r->refused[i]));
}

/* ---- /v1/stats ---- */

/* One key family of the RESP reads as a JSON object. The names are client
 * bytes, but printable ASCII without '"' or '\' (else the key counts as
 * "other"); jansson escapes them anyway. */
static void family_json(const char *name, size_t len, uint64_t hits,
                        uint64_t misses, void *ud) {
  json_t *o = json_pack("{so sI sI}", "family",
                        name ? json_stringn(name, len) : json_string("other"),
                        "hits", (json_int_t)hits, "misses", (json_int_t)misses);
  json_array_append_new(ud, o); /* NULL o (out of memory): not appended */
}

/* "resp_families": the GET/MGET reads per key family, learned order,
 * "other" last. */
void kcd_resp_stats(void *self, void *o) {
  kcd_resp *r = self;
  json_object_set_new(o, "resp_clients",
                      json_integer((json_int_t)kcd_resp_clients(r)));
  json_t *a = json_array();
  if (!a)
    return;
  kcd_resp_family_each(&r->families, family_json, a);
  json_object_set_new(o, "resp_families", a);
}
