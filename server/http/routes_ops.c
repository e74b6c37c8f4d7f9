/* routes_ops.c: the operator's routes: GET/HEAD /healthz (the process
 * answers), /readyz (the store is open), /metrics (Prometheus text, rendered
 * by metrics.c) and /v1/stats (the store's figures as JSON: the bundles'
 * and the RESP keys', then what each front end's status table adds). */
#include "http.h"

static int reply_status(kcd_req *r, int code, const char *status) {
  return kcd_reply_json(r, code, json_pack("{ss}", "status", status), NULL);
}

int kcd_healthz(kcd_req *r) { return reply_status(r, 200, "ok"); }

/* Not ready also while writes fail for lack of disk: a balancer then sends
 * uploads elsewhere (reads still work here; /healthz stays 200). */
int kcd_readyz(kcd_req *r) {
  kc_store *s = kcd_store(r->st);
  if (!s)
    return kcd_reply_error_json(r, KC_NOT_READY, NULL, NULL, NULL);
  int64_t since = kc_store_disk_full_since(s);
  if (since)
    return kcd_reply_json(r, 503,
                          json_pack("{ss ss sI}", "error",
                                    kc_err_code(KC_DISK_FULL), "message",
                                    "the disk holding the store is full: "
                                    "writes fail, reads work",
                                    "since", (json_int_t)since),
                          NULL);
  return reply_status(r, 200, "ready");
}

int kcd_metrics_get(kcd_req *r) {
  size_t len = 0;
  char *text = kcd_metrics_render(r->st, &len);
  if (!text)
    return kcd_reply_error(r, KC_NOMEM, "out of memory");
  return kcd_reply(r, 200, "text/plain; version=0.0.4; charset=utf-8", text,
                   len, KCD_MEM_FREE, NULL);
}

/* The RESP side of the store: its keys and the bytes their values take
 * (inside bytes_used, which counts blobs of bundles and RESP values alike).
 * resp_clients is 0 here, and RESP's status table sets it when it runs. */
static json_t *stats_kv(const kc_store_stats *s) {
  return json_pack(
      "{sI sI sI sI sI sI sI sI}", "kv_keys", (json_int_t)s->kv_keys,
      "kv_expires", (json_int_t)s->kv_expires, "kv_bytes",
      (json_int_t)s->kv_bytes, "kv_max_bytes", (json_int_t)s->kv_max_bytes,
      "kv_hits", (json_int_t)s->kv_hits, "kv_misses", (json_int_t)s->kv_misses,
      "evicted_kv", (json_int_t)s->evicted_kv, "resp_clients", (json_int_t)0);
}

int kcd_stats_get(kcd_req *r) {
  kc_store_stats s;
  kc_err e = kc_store_stats_get(kcd_store(r->st), &s);
  if (e)
    return kcd_reply_error(r, e, "cannot read the store's figures");
  json_t *o = json_pack(
      "{sI sI sI sI sI sI sI sI sI sI sI sI sI}", "bytes_used",
      (json_int_t)s.bytes_used, "max_bytes", (json_int_t)s.max_bytes,
      "map_size", (json_int_t)s.map_size, "map_used", (json_int_t)s.map_used,
      "blobs", (json_int_t)s.blobs, "bundles", (json_int_t)s.bundles, "hits",
      (json_int_t)s.hits, "misses", (json_int_t)s.misses, "evicted_bundles",
      (json_int_t)s.evicted_bundles, "evicted_blobs",
      (json_int_t)s.evicted_blobs, "gc_blobs", (json_int_t)s.gc_blobs, "leases",
      (json_int_t)kcd_lease_count(r->st->leases), "uptime_s",
      (json_int_t)(kcd_unix_now() - r->st->started));
  json_t *kv = stats_kv(&s);
  if (o && kv)
    json_object_update(o, kv);
  /* bytes_used counts stored (compressed) bytes; bytes_raw the content */
  if (o)
    json_object_set_new(o, "bytes_raw", json_integer((json_int_t)s.bytes_raw));
  json_decref(kv);
  if (o) /* the front ends' own fields (RESP's clients and key families) */
    kcd_status_stats(r->st, o);
  return kcd_reply_json(r, 200, o, NULL);
}
