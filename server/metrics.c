/* metrics.c: GET /metrics in the Prometheus text format: the operations
 * both front ends count (service.c), the store's and the durable tier's
 * figures, then each front end's own (its status table: HTTP's requests,
 * RESP's commands). Counters are relaxed atomics: statistics, not
 * synchronization. */
#include <stdio.h>
#include <stdlib.h>

#include "kcd.h"

#define GET(field) atomic_load_explicit(&(field), memory_order_relaxed)

void kcd_metric_counter(void *fp, const char *name, const char *help,
                        uint64_t v) {
  fprintf(fp, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name,
          name, (unsigned long long)v);
}

void kcd_metric_gauge(void *fp, const char *name, const char *help,
                      uint64_t v) {
  fprintf(fp, "# HELP %s %s\n# TYPE %s gauge\n%s %llu\n", name, help, name,
          name, (unsigned long long)v);
}

void kcd_metric_histogram(void *fp, const char *name, const char *help,
                          const double *bounds_s, const uint64_t *counts, int n,
                          uint64_t sum_us) {
  FILE *f = fp;
  fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  uint64_t cum = 0;
  for (int b = 0; b < n; b++) {
    cum += counts[b];
    fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", name, bounds_s[b],
            (unsigned long long)cum);
  }
  cum += counts[n];
  fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
  fprintf(f, "%s_sum %.6f\n%s_count %llu\n", name, (double)sum_us / 1e6, name,
          (unsigned long long)cum);
}

/* Read transactions: an old one pins the pages freed after it began, so a
 * full store cannot reuse them (writes then fail with 507). */
static void render_reads(FILE *f, kc_store *s) {
  kc_store_read_stats rs;
  kc_store_read_stats_get(s, &rs);
  kcd_metric_gauge(f, "kcached_store_reads_open",
                   "LMDB read transactions open.", rs.open);
  fprintf(f,
          "# HELP kcached_store_oldest_read_seconds Age of the oldest "
          "open LMDB read transaction (0: none).\n# TYPE "
          "kcached_store_oldest_read_seconds gauge\n"
          "kcached_store_oldest_read_seconds %.3f\n",
          (double)rs.oldest_age_ms / 1000.0);
  kcd_metric_gauge(f, "kcached_store_reader_slots",
                   "Slots of LMDB's reader table.", rs.max_readers);
  kcd_metric_counter(
      f, "kcached_store_readers_full_total",
      "Reads refused (503 busy) because the reader table was full.",
      rs.readers_full);
}

static void render_store(FILE *f, kcd_state *st) {
  kc_store *s = kcd_store(st);
  kc_store_stats ss = {0};
  int up = s && kc_store_stats_get(s, &ss) == KC_OK;
  kcd_metric_gauge(f, "kcached_store_up", "1 when the store is open.",
                   (uint64_t)up);
  if (s) /* takes no read: shown also when the reader table is full */
    render_reads(f, s);
  if (!up)
    return;
  kcd_metric_gauge(f, "kcached_store_bytes",
                   "Blob bytes held (stored: compressed "
                   "blobs count their compressed bytes).",
                   ss.bytes_used);
  kcd_metric_gauge(f, "kcached_store_raw_bytes",
                   "Blob bytes held, each counted at its "
                   "content's size (uncompressed).",
                   ss.bytes_raw);
  kcd_metric_gauge(f, "kcached_store_limit_bytes",
                   "Store size limit (0: none).", ss.max_bytes);
  kcd_metric_gauge(f, "kcached_store_map_bytes", "LMDB map size.", ss.map_size);
  kcd_metric_gauge(f, "kcached_store_map_used_bytes", "LMDB pages in use.",
                   ss.map_used);
  kcd_metric_gauge(f, "kcached_store_blobs", "Blobs held.", ss.blobs);
  kcd_metric_gauge(f, "kcached_store_bundles", "Bundles held.", ss.bundles);
  kcd_metric_counter(f, "kcached_hits_total",
                     "Bundle reads that found the bundle.", ss.hits);
  kcd_metric_counter(f, "kcached_misses_total", "Bundle reads that did not.",
                     ss.misses);
  kcd_metric_counter(f, "kcached_evicted_bundles_total",
                     "Bundles evicted (LRU).", ss.evicted_bundles);
  kcd_metric_counter(f, "kcached_evicted_blobs_total", "Blobs evicted.",
                     ss.evicted_blobs);
  kcd_metric_counter(f, "kcached_gc_blobs_total",
                     "Unreferenced blobs collected.", ss.gc_blobs);
  kcd_metric_counter(f, "kcached_scrub_bytes_total",
                     "Blob bytes the scrub re-hashed.", ss.scrub_bytes);
  kcd_metric_counter(f, "kcached_scrub_passes_total",
                     "Scrub passes over every blob completed.",
                     ss.scrub_passes);
  kcd_metric_counter(
      f, "kcached_scrub_corrupt_total",
      "Blobs the scrub found not hashing to their name; removed with the "
      "bundles naming them.",
      ss.scrub_corrupt);
  kcd_metric_counter(
      f, "kcached_scrub_skipped_total",
      "Blobs the scrub passed over unhashed: a frame from before the "
      "window bound whose decoder did not fit the decoder memory then "
      "(tried again the next pass).",
      ss.scrub_skipped);
}

static void render_s3(FILE *f, kcd_state *st) {
  kc_store *s = kcd_store(st);
  kc_store_tier_stats t;
  if (!st->s3 || !s || kc_store_tier_stats_get(s, &t) != KC_OK)
    return;
  kcd_metric_gauge(f, "kcached_s3_up", "1 when the last S3 request reached S3.",
                   (uint64_t)t.up);
  fprintf(f,
          "# HELP kcached_s3_conditional_writes 1 when S3 honours "
          "If-None-Match, 0 when not, -1 not known yet.\n# TYPE "
          "kcached_s3_conditional_writes gauge\nkcached_s3_conditional_writes "
          "%d\n",
          t.conditional);
  kcd_metric_gauge(f, "kcached_s3_queue_depth",
                   "Write-through entries not yet in S3 (kept in LMDB).",
                   t.queue_depth);
  kcd_metric_counter(f, "kcached_s3_uploaded_total",
                     "Write-through entries done.", t.uploaded);
  kcd_metric_counter(
      f, "kcached_s3_parked_total",
      "Write-through entries S3 refused 8 times, set aside until the "
      "next start.",
      t.parked);
  kcd_metric_counter(f, "kcached_s3_requests_total", "S3 requests.",
                     t.requests);
  kcd_metric_counter(f, "kcached_s3_errors_total", "S3 requests that failed.",
                     t.errors);
  kcd_metric_counter(
      f, "kcached_s3_corrupt_total",
      "Objects in S3 that failed verification (deleted, not served).",
      t.rt_corrupt);
  fputs("# HELP kcached_s3_read_through_total Misses asked of S3, by "
        "outcome (error: S3 failed, or was skipped for 2 s after it "
        "did).\n# TYPE kcached_s3_read_through_total counter\n",
        f);
  const char *names[] = {"hit", "miss", "corrupt", "error"};
  uint64_t v[] = {t.rt_hit, t.rt_miss, t.rt_corrupt, t.rt_error};
  for (int i = 0; i < 4; i++)
    fprintf(f, "kcached_s3_read_through_total{result=\"%s\"} %llu\n", names[i],
            (unsigned long long)v[i]);
  fputs("# HELP kcached_s3_write_once_conflicts_total Bundle manifests that "
        "met another replica's in the bucket: refused (a PUT answered 409, "
        "the bucket's copy kept) or replaced (the upload queue found the "
        "bucket's copy first; the local one gave way).\n# TYPE "
        "kcached_s3_write_once_conflicts_total counter\n",
        f);
  fprintf(f,
          "kcached_s3_write_once_conflicts_total{outcome=\"refused\"} "
          "%llu\nkcached_s3_write_once_conflicts_total{outcome=\"replaced\"} "
          "%llu\n",
          (unsigned long long)t.once_refused,
          (unsigned long long)t.once_replaced);
  kcd_metric_histogram(f, "kcached_s3_request_duration_seconds",
                       "S3 requests of the durable tier.", t.bounds_s,
                       t.duration, KC_STORE_S3_BUCKETS, t.duration_us_sum);
}

/* The older per-purpose counters, kept by name: cells of ops_total, summed
 * over the front ends. */
static uint64_t ops_sum(kcd_metrics *m, kcd_svc_op op, kcd_svc_res res) {
  uint64_t n = 0;
  for (int fe = 0; fe < KCD_N_FE; fe++)
    n += GET(m->ops[op][fe][res]);
  return n;
}

/* The older per-purpose counters of operations, kept by name. */
static void render_named_ops(FILE *f, kcd_metrics *m) {
  kcd_metric_counter(f, "kcached_leases_granted_total", "Leases granted.",
                     ops_sum(m, KCD_OP_LEASE_TAKE, KCD_RES_GRANTED));
  kcd_metric_counter(f, "kcached_leases_refused_total",
                     "Lease requests refused (held).",
                     ops_sum(m, KCD_OP_LEASE_TAKE, KCD_RES_HELD));
  kcd_metric_counter(f, "kcached_leases_present_total",
                     "Lease requests answered 'present' (bundle exists).",
                     ops_sum(m, KCD_OP_LEASE_TAKE, KCD_RES_PRESENT));
  kcd_metric_counter(
      f, "kcached_blobs_corrupt_total",
      "Repair offers (X-Kcache-Repair) that found the held copy not "
      "hashing to its name; the offer's verified bytes replace it.",
      ops_sum(m, KCD_OP_PUT, KCD_RES_REPAIR));
}

/* ---- operations both front ends share (service.c counts them) ---- */

static const char *const fe_names[KCD_N_FE] = {"http", "resp"};
static const char *const op_names[KCD_N_OPS] = {
    "get", "lookup", "put", "lease_take", "lease_release", "auth", "set"};
static const char *const res_names[KCD_N_RES] = {
    "ok",     "hit",     "miss", "error",  "present", "new",
    "repair", "granted", "held", "denied", "refused"};

/* The results each op can have (shown at 0 until counted); -1 ends. */
static const int op_results[KCD_N_OPS][6] = {
    [KCD_OP_GET] = {KCD_RES_HIT, KCD_RES_MISS, KCD_RES_ERROR, -1},
    [KCD_OP_LOOKUP] = {KCD_RES_HIT, KCD_RES_MISS, -1},
    [KCD_OP_PUT] = {KCD_RES_PRESENT, KCD_RES_NEW, KCD_RES_REPAIR, -1},
    [KCD_OP_LEASE_TAKE] = {KCD_RES_GRANTED, KCD_RES_HELD, KCD_RES_PRESENT,
                           KCD_RES_ERROR, -1},
    [KCD_OP_LEASE_RELEASE] = {KCD_RES_OK, KCD_RES_MISS, KCD_RES_DENIED,
                              KCD_RES_ERROR, -1},
    [KCD_OP_AUTH] = {KCD_RES_OK, KCD_RES_DENIED, -1},
    [KCD_OP_SET] = {KCD_RES_NEW, KCD_RES_PRESENT, KCD_RES_REFUSED,
                    KCD_RES_ERROR, -1},
};

/* Which front end serves which op: RESP has no bundles, lookups or leases
 * (yet); an op shown for a front end that never does it would only read as
 * "unused". */
static int fe_does(int fe, int op) {
  return fe == KCD_FE_HTTP || op == KCD_OP_GET || op == KCD_OP_AUTH ||
         op == KCD_OP_SET;
}

static void render_ops(FILE *f, kcd_metrics *m) {
  fputs("# HELP kcached_ops_total Operations by what they were (the same "
        "op for every front end), the front end that served them, and "
        "their result.\n# TYPE kcached_ops_total counter\n",
        f);
  for (int op = 0; op < KCD_N_OPS; op++)
    for (int fe = 0; fe < KCD_N_FE; fe++)
      for (int i = 0; fe_does(fe, op) && op_results[op][i] >= 0; i++) {
        int res = op_results[op][i];
        fprintf(f,
                "kcached_ops_total{op=\"%s\",frontend=\"%s\","
                "result=\"%s\"} %llu\n",
                op_names[op], fe_names[fe], res_names[res],
                (unsigned long long)GET(m->ops[op][fe][res]));
      }
  fputs("# HELP kcached_ops_in_flight Operations begun and not answered, "
        "by front end (graceful shutdown waits for them).\n# TYPE "
        "kcached_ops_in_flight gauge\n",
        f);
  for (int fe = 0; fe < KCD_N_FE; fe++) {
    int64_t v = atomic_load(&m->in_flight[fe]);
    fprintf(f, "kcached_ops_in_flight{frontend=\"%s\"} %lld\n", fe_names[fe],
            (long long)(v > 0 ? v : 0));
  }
}

char *kcd_metrics_render(kcd_state *st, size_t *len) {
  char *buf = NULL;
  FILE *f = open_memstream(&buf, len);
  if (!f)
    return NULL;
  render_named_ops(f, &st->metrics);
  render_ops(f, &st->metrics);
  render_store(f, st);
  render_s3(f, st);
  kcd_status_metrics(st, f);
  kcd_metric_gauge(f, "kcached_start_time_seconds",
                   "Unix time kcached started.", (uint64_t)st->started);
  if (fclose(f) != 0) {
    free(buf);
    return NULL;
  }
  return buf;
}
