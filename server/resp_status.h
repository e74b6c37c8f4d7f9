/* resp_status.h: what the rest of kcached reads of the RESP front end
 * (/metrics, /v1/stats, the page's history): its counters and key
 * families, nothing of its connections or commands. resp.h is RESP's own;
 * no file outside the front end includes it. Each call takes st->resp,
 * which is NULL without --resp-listen. */
#ifndef KCD_RESP_STATUS_H
#define KCD_RESP_STATUS_H

#include <stddef.h>
#include <stdint.h>

#include "kcd.h"

typedef struct kcd_resp kcd_resp;
typedef struct kcd_resp_families kcd_resp_families;

/* Connections open (resp.c); 0 for r NULL. */
size_t kcd_resp_clients(kcd_resp *r);
/* Commands run since start (resp_info.c); 0 for r NULL. */
uint64_t kcd_resp_commands(kcd_resp *r);

/* The family table of r (resp.c), read by /v1/stats; NULL when r is NULL
 * (no --resp-listen). Owned by r: valid while the listener is. */
kcd_resp_families *kcd_resp_families_of(kcd_resp *r);
/* Calls fn for every family ready (then "other" with name NULL). */
void kcd_resp_family_each(kcd_resp_families *t,
                          void (*fn)(const char *name, size_t len,
                                     uint64_t hits, uint64_t misses, void *ud),
                          void *ud);

/* Appends kcached_resp_* metrics (Prometheus text) to f; nothing without
 * --resp-listen. f is a FILE *. */
void kcd_resp_metrics_render(kcd_state *st, void *f);

#endif
