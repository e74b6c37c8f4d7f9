/* warm.h: what the files of kc_warm share (warm.c: keys, bookkeeping and
 * the whole; warm_remote.c: the lookup, fetches, compatible archs and what
 * kcached lacks; warm_build.c: builds through leases, and waits): the
 * warm's context and its kcw_ helpers. Internal to libkcache. */
#ifndef KC_WARM_H
#define KC_WARM_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <errno.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "client_internal.h"
#include "kc_gpu.h"

#define KC_MAX_BUILD_JOBS 64
/* Beside a stand-in's files under --out: the arch its code is for. */
#define KCC_ARCH_FILE "kcache-arch"

typedef struct wctx {
  kc_client *c;
  const kc_warmup *w;
  const kc_warm_opts *o;
  kc_warm_report *rep;
  kc_key_fields *fields;
  kc_key_fields base;  /* the keys' fields without bucket and arch */
  kcc_compat cp;       /* the compatible-arch fallback (compat.c) */
  int cp_ready;        /* cp was set up (lazily: only when a key is missing) */
  int defer_compat;    /* --prefer-build with a builder: compat bundles are
                          fetched but kept as spares until the end */
  kc_manifest **ms;    /* ready bundles, per item */
  kc_manifest **spare; /* defer_compat: the stand-in, per item */
  char *pending;       /* 1 while an item is neither ready nor failed */
  char *remote_bad;    /* the server's copy failed verification: BAD_* */
  char *waiting;       /* another builder holds the lease */
  int *out_made;       /* --out: 1 when this run made the item's directory
                          (only those are removed again, or written without
                          looking for what an earlier warm left there) */
  int64_t *retry_at;   /* waiting: when its lease may have lapsed (ms) */
  int64_t *build_at;   /* waiting: when to build it here anyway (ms; 0 never) */
  kc_warm_status fetched_as; /* what a served bundle counts as now */
  kc_err remote_err; /* why the last lookup failed (KC_OK: it did not) */
  char remote_why[KC_ERRBUF_SIZE];
  int server_ok;
  int cant_write; /* an upload was refused (401/403): none tried again */
  char cant_why[KC_ERRBUF_SIZE];
  int jobs; /* concurrent builds */
  int64_t t0;
  size_t done;
} wctx;

/* Why an item's copy on the server is not used. BAD_BLOB: a blob it served
 * did not hash to its name; after the rebuild the blobs are offered back,
 * which makes kcached replace a copy that rotted on its disk. */
enum { BAD_NONE, BAD_OTHER, BAD_BLOB };

/* bookkeeping (warm.c) */
int kcw_deadline_passed(const wctx *x);
void kcw_failed(wctx *x, size_t i, kc_err e, const char *msg);
int kcw_is_compat(const wctx *x, size_t i, const kc_manifest *m);
int kcw_is_down(kc_err e);
void kcw_note(wctx *x, size_t i, kc_err e, const char *why);
void kcw_ready(wctx *x, size_t i, kc_warm_status s, kc_manifest *m);
void kcw_refused(wctx *x, kc_err e, const char *why);
kc_err kcw_remote_cause(const wctx *x, size_t i, const char **why);
double kcw_seconds_left(const wctx *x);
void kcw_server_down(wctx *x, const char *why);
double kcw_since(const wctx *x);
void kcw_warn(wctx *x, const char *why);

/* the lookup, fetches, compatible archs, what kcached lacks (warm_remote.c) */
kcc_compat *kcw_compat(wctx *x);
void kcw_out_dir_of(const wctx *x, size_t i, char *dir, size_t size);
void kcw_phase_local_compat(wctx *x);
void kcw_phase_offer_local(wctx *x);
void kcw_phase_remote(wctx *x, int waiting);
void kcw_use_spares(wctx *x);

/* builds through leases, and waits (warm_build.c) */
void kcw_phase_build(wctx *x);
void kcw_phase_wait(wctx *x);
void kcw_upload(wctx *x, size_t i, const kc_manifest *m);

#endif
