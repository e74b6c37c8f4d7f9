/* http_metrics.c: HTTP's own counters (requests by route, method and
 * status, the duration histogram, bytes, zstd, connections cut, loans, the
 * decoded cache) and their Prometheus text, which the core's /metrics
 * appends through HTTP's status table. Relaxed atomics: statistics, not
 * synchronization. */
#include <stdio.h>

#include "http.h"

/* Statuses kcached answers with; anything else counts as "other". */
static const int statuses[KCD_N_STATUS - 1] = {
    200, 201, 204, 304, 400, 401, 403, 404, 405, 408,
    409, 411, 413, 422, 499, 500, 503, 504, 507};

/* Upper bounds of the duration buckets, microseconds. */
static const uint64_t bounds_us[KCD_N_BUCKETS] = {
    100,   250,    500,    1000,   2500,    5000,    10000,   25000,
    50000, 100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000};

static size_t status_index(int status) {
  for (size_t i = 0; i < KCD_N_STATUS - 1; i++)
    if (statuses[i] == status)
      return i;
  return KCD_N_STATUS - 1;
}

#define ADD(field, v)                                                          \
  atomic_fetch_add_explicit(&(field), (v), memory_order_relaxed)
#define GET(field) atomic_load_explicit(&(field), memory_order_relaxed)

void kcd_http_observe(kcd_http_metrics *m, kcd_route_id r, kcd_method meth,
                      int status, uint64_t in, uint64_t out, uint64_t us) {
  if ((unsigned)r >= KCD_N_ROUTES)
    r = KCD_R_OTHER;
  if ((unsigned)meth >= KCD_N_METHODS)
    meth = KCD_M_OTHER;
  ADD(m->requests[r][meth][status_index(status)], 1);
  if (in)
    ADD(m->bytes_in, in);
  if (out)
    ADD(m->bytes_out, out);
  size_t b = 0;
  while (b < KCD_N_BUCKETS && us > bounds_us[b])
    b++;
  ADD(m->duration[b], 1);
  ADD(m->duration_us_sum, us);
}

static void render_requests(FILE *f, kcd_http_metrics *m) {
  fputs("# HELP kcached_requests_total HTTP requests by route, method and "
        "status.\n# TYPE kcached_requests_total counter\n",
        f);
  for (int r = 0; r < KCD_N_ROUTES; r++)
    for (int me = 0; me < KCD_N_METHODS; me++)
      for (int s = 0; s < KCD_N_STATUS; s++) {
        uint64_t v = GET(m->requests[r][me][s]);
        if (!v)
          continue;
        char st[16];
        if (s < KCD_N_STATUS - 1)
          snprintf(st, sizeof st, "%d", statuses[s]);
        else
          snprintf(st, sizeof st, "other");
        fprintf(f,
                "kcached_requests_total{route=\"%s\",method=\"%s\","
                "status=\"%s\"} %llu\n",
                kcd_route_name((kcd_route_id)r),
                kcd_method_name((kcd_method)me), st, (unsigned long long)v);
      }
}

static void render_histogram(FILE *f, kcd_http_metrics *m) {
  double bounds[KCD_N_BUCKETS];
  uint64_t counts[KCD_N_BUCKETS + 1];
  for (int b = 0; b < KCD_N_BUCKETS; b++)
    bounds[b] = (double)bounds_us[b] / 1e6;
  for (int b = 0; b <= KCD_N_BUCKETS; b++)
    counts[b] = GET(m->duration[b]);
  kcd_metric_histogram(f, "kcached_request_duration_seconds",
                       "Time from request headers to the response sent.",
                       bounds, counts, KCD_N_BUCKETS, GET(m->duration_us_sum));
}

/* The decoded cache (decoded_cache.c); zeros when off. */
static void render_dcache(FILE *f, kcd_dcache *c) {
  kcd_dcache_stat s;
  kcd_dcache_stats(c, &s);
  kcd_metric_counter(
      f, "kcached_decoded_cache_hits_total",
      "GETs of compressed blobs without zstd answered from the decoded "
      "cache.",
      s.hits);
  kcd_metric_counter(
      f, "kcached_decoded_cache_misses_total",
      "Of those GETs, not found there (decoded; kept when it fits).", s.misses);
  kcd_metric_counter(f, "kcached_decoded_cache_evictions_total",
                     "Entries dropped to make room.", s.evictions);
  kcd_metric_gauge(
      f, "kcached_decoded_cache_bytes",
      "Memory of decoded blobs, those answers still send included.", s.bytes);
  kcd_metric_gauge(f, "kcached_decoded_cache_limit_bytes", "--decoded-cache.",
                   s.budget);
  kcd_metric_gauge(f, "kcached_decoded_cache_entries", "Decoded blobs kept.",
                   s.entries);
}

static void render_self(FILE *f, kcd_http *h) {
  kcd_http_metrics *m = &h->metrics;
  kcd_metric_counter(f, "kcached_received_bytes_total",
                     "Request body bytes received.", GET(m->bytes_in));
  kcd_metric_counter(f, "kcached_sent_bytes_total", "Response body bytes sent.",
                     GET(m->bytes_out));
  kcd_metric_counter(f, "kcached_uploads_aborted_total",
                     "Uploads dropped (client gone, error).",
                     GET(m->uploads_aborted));
  kcd_metric_counter(
      f, "kcached_zstd_gets_total",
      "Blobs held zstd-compressed read by GETs and by items of POST "
      "/v1/blobs/fetch.",
      GET(m->zstd_gets));
  kcd_metric_counter(
      f, "kcached_zstd_frames_sent_total",
      "Of them, answered with the frame (Accept-Encoding: zstd).",
      GET(m->zstd_sent_frames));
  kcd_metric_counter(f, "kcached_zstd_puts_total",
                     "Blob PUTs that arrived zstd-compressed.",
                     GET(m->zstd_puts));
  render_dcache(f, h->dcache);
  int64_t inflight = atomic_load(&h->st->metrics.in_flight[KCD_FE_HTTP]);
  kcd_metric_gauge(f, "kcached_requests_in_flight", "Requests being served.",
                   inflight > 0 ? (uint64_t)inflight : 0);
}

/* Connections the header deadline and the body rate cut (conns.c). */
static void render_cuts(FILE *f, kcd_http_metrics *m) {
  fputs("# HELP kcached_connections_cut_total Connections closed for "
        "headers not complete within --header-timeout, or a body slower "
        "than --min-body-rate.\n# TYPE kcached_connections_cut_total "
        "counter\n",
        f);
  fprintf(f, "kcached_connections_cut_total{reason=\"header_timeout\"} %llu\n",
          (unsigned long long)GET(m->cut_header_timeout));
  fprintf(f, "kcached_connections_cut_total{reason=\"slow_body\"} %llu\n",
          (unsigned long long)GET(m->cut_slow_body));
  fputs("# HELP kcached_http_blob_loans_total Large blob GETs sent from the "
        "store's pages without a copy; detached: the client was slow, so "
        "the bytes were copied and the read ended; cut: the kernel failed "
        "that swap half-way, and the connection was closed.\n# TYPE "
        "kcached_http_blob_loans_total counter\n",
        f);
  fprintf(f, "kcached_http_blob_loans_total{result=\"sent\"} %llu\n",
          (unsigned long long)GET(m->loans));
  fprintf(f, "kcached_http_blob_loans_total{result=\"detached\"} %llu\n",
          (unsigned long long)GET(m->loans_detached));
  fprintf(f, "kcached_http_blob_loans_total{result=\"cut\"} %llu\n",
          (unsigned long long)GET(m->loans_cut));
}

void kcd_http_metrics_render(void *self, void *fp) {
  kcd_http *h = self;
  FILE *f = fp;
  render_requests(f, &h->metrics);
  render_histogram(f, &h->metrics);
  render_self(f, h);
  render_cuts(f, &h->metrics);
}

void kcd_http_history(void *self, uint64_t v[KCD_H_N]) {
  kcd_http_metrics *m = &((kcd_http *)self)->metrics;
  uint64_t n = 0;
  for (int r = 0; r < KCD_N_ROUTES; r++)
    for (int me = 0; me < KCD_N_METHODS; me++)
      for (int s = 0; s < KCD_N_STATUS; s++)
        n += GET(m->requests[r][me][s]);
  v[KCD_H_REQUESTS] = n;
  v[KCD_H_BYTES_OUT] = GET(m->bytes_out);
}
