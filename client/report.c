/* report.c: the warmup report for people (one line per key, a summary) and
 * for machines (JSON). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "kcache.h"

static void human_bytes(uint64_t b, char *out, size_t n) {
  if (b >= 10ull << 20)
    snprintf(out, n, "%.1f MiB", b / 1048576.0);
  else if (b >= 10ull << 10)
    snprintf(out, n, "%.1f KiB", b / 1024.0);
  else
    snprintf(out, n, "%llu B", (unsigned long long)b);
}

void kc_warm_report_print(const kc_warm_report *r, FILE *f) {
  char label[256], size[32];
  for (size_t i = 0; i < r->n_items; i++) {
    const kc_warm_item *it = &r->items[i];
    kc_bucket_label(&it->bucket, label, sizeof label);
    human_bytes(it->bytes, size, sizeof size);
    char used[KC_ARCH_MAX + 16] = "";
    if (it->status == KC_WARM_HIT_COMPAT)
      snprintf(used, sizeof used, "  (used %s)", it->compat_arch);
    fprintf(f, "%-10s %-8s %-24s %.12s  %10s %7.2fs%s%s%s\n",
            kc_warm_status_name(it->status), it->arch, label, it->key, size,
            it->seconds, used, it->message[0] ? "  " : "", it->message);
  }
  human_bytes(r->bytes, size, sizeof size);
  fprintf(f,
          "%zu bundles: %zu hit-local, %zu hit-remote, %zu hit-compat, %zu "
          "built, %zu waited, %zu failed; %s in %.2fs\n",
          r->n_items, r->counts[KC_WARM_HIT_LOCAL],
          r->counts[KC_WARM_HIT_REMOTE], r->counts[KC_WARM_HIT_COMPAT],
          r->counts[KC_WARM_BUILT], r->counts[KC_WARM_WAITED],
          r->counts[KC_WARM_FAILED], size, r->seconds);
  size_t back = 0; /* held here, lacking on the server, uploaded */
  for (size_t i = 0; i < r->n_items; i++)
    back += r->items[i].status == KC_WARM_HIT_LOCAL && r->items[i].uploaded;
  if (back)
    fprintf(f, "%zu hit-local bundle%s uploaded: kcached did not hold %s\n",
            back, back == 1 ? "" : "s", back == 1 ? "it" : "them");
  if (r->warning[0])
    fprintf(f, "warning: %s\n", r->warning);
}

static json_t *item_json(const kc_warm_item *it) {
  json_t *o = json_pack("{ss ss so ss sI sI sf sb}", "key", it->key, "arch",
                        it->arch, "bucket", kc_bucket_to_json(&it->bucket),
                        "status", kc_warm_status_name(it->status), "bytes",
                        (json_int_t)it->bytes, "files", (json_int_t)it->n_files,
                        "seconds", it->seconds, "uploaded", it->uploaded);
  if (o && it->status == KC_WARM_FAILED)
    json_object_set_new(o, "error", json_string(kc_err_code(it->err)));
  if (o && it->message[0])
    json_object_set_new(o, "message", json_string(it->message));
  if (o && it->status == KC_WARM_HIT_COMPAT) /* the bundle used instead */
    json_object_set_new(
        o, "compat",
        json_pack("{ss ss}", "arch", it->compat_arch, "key", it->compat_key));
  if (o && it->lease_holder[0]) { /* another builder's lease was met */
    json_t *l = json_pack("{ss}", "holder", it->lease_holder);
    if (l && it->lease_expires_s >= 0) {
      json_object_set_new(l, "expires_s", json_real(it->lease_expires_s));
      json_object_set_new(l, "expires_at", json_string(it->lease_expires_at));
    }
    if (l)
      json_object_set_new(o, "lease", l);
  }
  return o;
}

kc_err kc_warm_report_json(const kc_warm_report *r, char **out, char *err) {
  json_t *items = json_array();
  json_t *counts = json_object();
  for (size_t i = 0; items && i < r->n_items; i++)
    json_array_append_new(items, item_json(&r->items[i]));
  for (int s = 0; counts && s < KC_WARM_N_STATUS; s++)
    json_object_set_new(counts, kc_warm_status_name((kc_warm_status)s),
                        json_integer((json_int_t)r->counts[s]));
  json_t *root =
      json_pack("{ss so so sI sI sf sb}", "model", r->model, "counts",
                counts ? counts : json_object(), "items",
                items ? items : json_array(), "bytes", (json_int_t)r->bytes,
                "bytes_fetched", (json_int_t)r->bytes_fetched, "seconds",
                r->seconds, "server_down", r->server_down);
  if (root && r->warning[0])
    json_object_set_new(root, "warning", json_string(r->warning));
  if (root && r->refused) /* {"code": "unauthorized", "message": ...} */
    json_object_set_new(root, "refused",
                        json_pack("{ss ss}", "code", kc_err_name(r->refused),
                                  "message", r->refused_why));
  *out = root ? json_dumps(root, JSON_INDENT(2)) : NULL;
  json_decref(root);
  return *out ? KC_OK : kc_errf(err, KC_NOMEM, "out of memory");
}
