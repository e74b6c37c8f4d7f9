/* kcache.h: libkcache, the client of kcached. Fetch-or-build warmup of a
 * model's compiled kernels (kc_warm), and the building blocks under it: blob
 * and bundle get/put, batch lookup, build leases, a local content-addressed
 * cache, and materializing a bundle into a directory or into memory.
 *
 * Process-wide setup is the caller's job (no global state in the library):
 * call curl_global_init(CURL_GLOBAL_DEFAULT) once in main() before the first
 * kc_client_new, and curl_global_cleanup() at exit; a host that has no
 * libcurl of its own (a binding) calls kc_global_init() instead.
 *
 * Threads: a kc_client is used by one thread at a time (like a CURL easy
 * handle); distinct handles may be used concurrently. Functions without a
 * handle are reentrant.
 *
 * Errors: every function returns a kc_err (kc_error.h) and, when `err` is not
 * NULL, writes one sentence (at most KC_ERRBUF_SIZE bytes) saying what failed.
 * Network failures are KC_UNAVAILABLE (cannot connect, TLS refused),
 * KC_TIMEOUT, or KC_DEADLINE (kc_warm's deadline passed); an error answer
 * from the server is mapped back to its kc_err code (KC_PROTOCOL when it
 * is not one of ours).
 *
 * Ownership: whatever a function returns through an out-pointer belongs to
 * the caller and is freed with the function named next to it. `*_free(NULL)`
 * does nothing. Input pointers are borrowed for the duration of the call only.
 *
 * Local cache layout ($KCACHE_DIR, default ~/.cache/kcache):
 *   blobs/<2 hex>/<64 hex>   file contents, named by their SHA-256
 *   bundles/<key>.json       canonical bundle manifests
 *   tmp/                     temporary files, renamed into place when whole
 * Several processes may share one cache directory: files only ever appear
 * whole (rename), and a name always means the same bytes.
 */
#ifndef KCACHE_H
#define KCACHE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kc_error.h"
#include "kc_schema.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KC_CLIENT_VERSION "0.1.0"

/* ---- For bindings (python/kcache/_lib.py): ABI, process set-up, free ---- */

/* The layout of the structs a binding mirrors field by field (kc_dim,
 * kc_tool, kc_bucket, kc_key_fields, kc_client_opts, kc_warm_opts,
 * kc_warm_report): bumped whenever one changes. A binding checks
 * kc_abi_version() against the value it was written for, and
 * kc_abi_sizeof("kc_warm_report") against its own size, at load. */
#define KC_ABI_VERSION 2
int kc_abi_version(void);
/* sizeof the named struct of this header or kc_schema.h; 0: unknown name. */
size_t kc_abi_sizeof(const char *type);
/* curl_global_init(CURL_GLOBAL_DEFAULT), once per process whoever calls it
 * (thread-safe); for a host with no libcurl of its own. KC_OK, or
 * KC_UNAVAILABLE when libcurl's set-up failed. */
kc_err kc_global_init(char *err);
/* Frees what libkcache returned for the caller to free (strings, bodies,
 * bytes): a binding may not share the library's malloc. NULL: nothing. */
void kc_free(void *p);
#define KC_LEASE_TOKEN_MAX 128
#define KC_LEASE_HOLDER_MAX 128 /* kcached: 1-128 printable ASCII */

/* ---- The client handle ---- */

typedef struct kc_client kc_client; /* opaque */

typedef struct kc_client_opts {
  const char *url;         /* "http://host:port"; NULL or "": no server
                              (local cache and local builds only) */
  const char *token;       /* bearer token; NULL: none */
  const char *cacert;      /* CA bundle (PEM) for https; NULL: system's */
  const char *cache_dir;   /* NULL: $KCACHE_DIR, else $HOME/.cache/kcache */
  long connect_timeout_ms; /* 0: 3000 */
  long timeout_ms;         /* whole request (a blob transfer included);
                              0: 300000 */
  long low_speed_bps;      /* a transfer slower than this ... */
  long low_speed_s;        /* ... for this long is abandoned (KC_TIMEOUT):
                              a server that drip-feeds a byte a second;
                              0: 1024 B/s for 30 s; < 0: no such limit */
  int parallel;            /* concurrent blob transfers; 0: 8 */
  const char *holder;      /* lease holder name; NULL: "<hostname>:<pid>" */
  int allow_plaintext;     /* send the token over http:// to a host that is
                              not loopback (behind a TLS-terminating proxy) */
  int trust_cache_dir;     /* use a cache directory that others can write
                              (see kc_client_new) */
} kc_client_opts;

/* Makes a client and its cache directory (created if missing, mode 0700).
 * The local cache is trusted: what it holds is served without asking the
 * server. So a cache directory (or its blobs/, bundles/, tmp/) that is owned
 * by another user or writable by group or others is refused (KC_FORBIDDEN,
 * naming it) unless o->trust_cache_dir; an empty one that is ours is made
 * 0700. Copies every string of o; o may be freed afterwards. A token with
 * an http:// URL to a host other than loopback is KC_EINVAL unless
 * o->allow_plaintext: tokens do not cross a network in clear by accident.
 * *out: kc_client_free. */
kc_err kc_client_new(const kc_client_opts *o, kc_client **out, char *err);
void kc_client_free(kc_client *c);
/* The cache directory in use; valid while c lives. */
const char *kc_client_cache_dir(const kc_client *c);
/* 1 when a server URL is set. */
int kc_client_has_server(const kc_client *c);
/* Every later request on c ends within `seconds` from now (KC_DEADLINE
 * once it has passed, without a request); <= 0: no such bound. kc_warm
 * sets its own for its run and clears it when it returns: this is for what
 * a caller sends around a warm within the same deadline. */
void kc_client_set_deadline(kc_client *c, double seconds);

/* ---- Blobs ---- */

/* GET /v1/blobs/{digest} into memory, verified: KC_DIGEST_MISMATCH when the
 * bytes do not hash to digest (they are then discarded). *data is malloc'd
 * (caller frees), one extra NUL byte after *len. */
kc_err kc_client_blob_get(kc_client *c, const char *digest, void **data,
                          size_t *len, char *err);
/* The same GET streamed to fd as it arrives, never held in memory, hashed
 * on the way: at most max bytes (0: KC_BLOB_GET_MAX) are written; a longer
 * answer is cut off there (KC_TOO_LARGE). The bytes are written before
 * they can be checked: KC_DIGEST_MISMATCH at the end means fd holds bytes
 * that are not the blob (write to a temporary file and rename it only on
 * KC_OK to publish nothing unverified). *len (may be NULL): bytes written.
 * fd below 0: KC_EINVAL. */
#define KC_BLOB_GET_MAX ((uint64_t)1 << 30) /* kcached's --max-blob-bytes */
kc_err kc_client_blob_get_fd(kc_client *c, const char *digest, int fd,
                             uint64_t max, uint64_t *len, char *err);
/* PUT /v1/blobs/{sha256 of data}; digest_out (may be NULL) receives it.
 * Stored or already present are both KC_OK. */
kc_err kc_client_blob_put(kc_client *c, const void *data, size_t len,
                          char digest_out[KC_HEX_LEN + 1], char *err);
/* The same PUT with X-Kcache-Repair: 1, for a blob this server served
 * corrupt: kcached hashes its held copy and, when it rotted, stores these
 * (verified) bytes in its place. */
kc_err kc_client_blob_repair(kc_client *c, const void *data, size_t len,
                             char *err);

/* ---- Bundles ---- */

/* GET /v1/bundles/{key}, parsed and validated (kc_manifest_parse: paths are
 * safe, the key matches its fields) and checked to be `key`'s bundle.
 * KC_NOT_FOUND when absent. *out: kc_manifest_free. */
kc_err kc_client_bundle_get(kc_client *c, const char *key, kc_manifest **out,
                            char *err);
/* PUT /v1/bundles/{m->key} with kc_manifest_to_json. Blobs must be uploaded
 * first (KC_MISSING_BLOBS otherwise). Identical bundle present: KC_OK;
 * a different one: KC_CONFLICT. */
kc_err kc_client_bundle_put(kc_client *c, const kc_manifest *m, char *err);
/* POST /v1/lookup: found[i] is keys[i]'s manifest (validated, as in
 * kc_client_bundle_get) or NULL when missing or invalid. found is an array of
 * n pointers the caller provides; free each with kc_manifest_free. n <=
 * KC_LOOKUP_MAX. On an error every found[i] is NULL. From 256 keys on, half
 * of them go on a second connection at the same time. */
kc_err kc_client_lookup(kc_client *c, const char *const *keys, size_t n,
                        kc_manifest **found, char *err);

/* ---- Leases ---- */

typedef enum kc_lease_state {
  KC_LEASE_GRANTED, /* token is ours: build, upload, then release */
  KC_LEASE_PRESENT, /* the bundle exists: fetch it */
  KC_LEASE_HELD     /* another holder builds it; retry_after_s says when */
} kc_lease_state;

/* POST /v1/leases/{key} {"holder","ttl_s"}. token (when granted) must hold
 * KC_LEASE_TOKEN_MAX bytes. retry_after_s may be NULL. */
kc_err kc_client_lease_take(kc_client *c, const char *key, int ttl_s,
                            kc_lease_state *state,
                            char token[KC_LEASE_TOKEN_MAX], int *retry_after_s,
                            char *err);
/* DELETE /v1/leases/{key}?lease=token. */
kc_err kc_client_lease_release(kc_client *c, const char *key, const char *token,
                               char *err);

/* ---- Other reads ---- */

/* GET /v1/models/{model} and GET /v1/stats: the JSON body as returned.
 * *json is malloc'd, the caller frees it. */
kc_err kc_client_model_list(kc_client *c, const char *model, char **json,
                            char *err);
kc_err kc_client_stats(kc_client *c, char **json, char *err);

/* ---- Models (models.c) ---- */

/* GET /v1/models?limit=1000[&cursor=]: one page of every model's name and
 * figures; the answer's "next" continues. *json malloc'd, caller frees. */
kc_err kc_client_models(kc_client *c, const char *cursor, char **json,
                        char *err);
/* GET /v1/models/{model}/coverage. *json malloc'd, caller frees. */
kc_err kc_client_coverage(kc_client *c, const char *model, char **json,
                          char *err);
/* DELETE /v1/models/{model} (admin): {"model","removed"}. *json malloc'd. */
kc_err kc_client_model_purge(kc_client *c, const char *model, char **json,
                             char *err);
/* PUT /v1/models/{model}/warmup: the warmup manifest's bytes (write role;
 * KC_FORBIDDEN for a read token). */
kc_err kc_client_warmup_put(kc_client *c, const char *model, const char *json,
                            size_t len, char *err);
/* The same, saying which archs the warm runs for (kc_warm_opts.archs, its
 * --arch; none: the manifest's): kcached shows them as the coverage's
 * columns. */
kc_err kc_client_warmup_put_archs(kc_client *c, const char *model,
                                  const char *json, size_t len,
                                  const char *const *archs, size_t n_archs,
                                  char *err);
/* GET /v1/models/{model}/warmup: the manifest kcached holds (KC_NOT_FOUND:
 * none). *json malloc'd, caller frees. */
kc_err kc_client_warmup_get(kc_client *c, const char *model, char **json,
                            char *err);
/* The model a user named: a 64-hex hash as is, else the one model whose
 * warmup manifest has that name (KC_NOT_FOUND: none; KC_EINVAL: several). */
kc_err kc_client_model_resolve(kc_client *c, const char *name_or_hash,
                               char out[KC_HEX_LEN + 1], char *err);

/* ---- Local cache ---- */

/* The bundle from the local cache, every blob present and re-hashed; a blob
 * that fails its hash is deleted (so that it is fetched again) and the call
 * answers KC_CORRUPT. KC_NOT_FOUND when not cached. *out: kc_manifest_free. */
kc_err kc_cache_bundle_get(kc_client *c, const char *key, kc_manifest **out,
                           char *err);
/* Stores bytes as a blob (atomic: temp file + rename). */
kc_err kc_cache_blob_put(kc_client *c, const void *data, size_t len,
                         char digest_out[KC_HEX_LEN + 1], char *err);
/* Stores a (valid, sealed) manifest whose blobs are all cached. */
kc_err kc_cache_bundle_put(kc_client *c, const kc_manifest *m, char *err);
/* Copies a file into the cache under its hash (digest and size out; size
 * may be NULL). */
kc_err kc_cache_blob_put_file(kc_client *c, const char *path,
                              char digest[KC_HEX_LEN + 1], uint64_t *size,
                              char *err);
/* Path of a cached blob (whether or not it exists) into out (PATH_MAX). */
void kc_cache_blob_path(const kc_client *c, const char *digest, char *out,
                        size_t out_size);

/* ---- Materialize ---- */

/* Puts every file of m (whose blobs are in the local cache) under dir,
 * creating subdirectories; each blob is verified first and each name
 * appears whole. A file is a hard link to its read-only cached blob when
 * dir is on the cache's file system (else a copy): a tool that rewrites
 * such a file in place gets EACCES, and must replace it (write a new file,
 * rename it over) instead. Each path is checked again (kc_path_validate)
 * and never followed through a symlink out of dir: nothing is written
 * outside dir. */
kc_err kc_materialize(kc_client *c, const kc_manifest *m, const char *dir,
                      char *err);
/* The bytes of one file of m (by its path), from the local cache, verified:
 * for cuModuleLoadData. *data malloc'd (caller frees), NUL after *len.
 * KC_NOT_FOUND when m has no such path. */
kc_err kc_bundle_file_bytes(kc_client *c, const kc_manifest *m,
                            const char *path, void **data, size_t *len,
                            char *err);

/* Push: upload every blob of m from the local cache, then m. */
kc_err kc_client_push(kc_client *c, const kc_manifest *m, char *err);
/* Pull: bundle from local cache or server (blobs fetched in parallel and
 * verified), stored in the local cache; *out (may be NULL) gets the
 * manifest (kc_manifest_free). A cached copy is compared with the server's
 * manifest when the server answers (the key binds the fields, not the file
 * list): one that lists other files is replaced by the server's, and err
 * (which is "" on a plain success) says so while the call returns KC_OK. */
kc_err kc_client_pull(kc_client *c, const char *key, kc_manifest **out,
                      char *err);
/* Many bundles into the local cache at once, as kc_warm fetches: one
 * POST /v1/lookup (per KC_LOOKUP_MAX keys) for their manifests, then every
 * blob they name in one parallel batch (small ones many per request), each
 * SHA-256 checked. out, an array of n pointers the caller provides: out[i]
 * is keys[i]'s manifest (kc_manifest_free) when it was served and all its
 * blobs arrived, else NULL (the server lacks it, or a blob failed). Unlike
 * kc_client_pull, the local cache is not consulted first: ask only for the
 * keys the caller lacks. Returns KC_OK, or the first failure (a lookup or a
 * blob), with what was pulled before it still in out. */
kc_err kc_client_pull_many(kc_client *c, const char *const *keys, size_t n,
                           kc_manifest **out, char *err);
/* A manifest for every regular file under dir (recursively; `skip`, a
 * relative path, may be NULL, left out), blobs stored in the local cache,
 * fields copied from f, sealed. A symlink that resolves inside dir is
 * followed (the file is stored under the link's name too); one that leads
 * outside dir or nowhere, and any other type than a file or directory, is
 * refused: KC_UNSAFE_PATH naming them. kind from the extension (.cubin,
 * .ptx, .fatbin, .ltoir, else file). No file: KC_NOT_FOUND.
 * *out: kc_manifest_free. */
kc_err kc_bundle_from_dir(kc_client *c, const char *dir, const char *skip,
                          const kc_key_fields *f, kc_manifest **out, char *err);

/* ---- Warmup ---- */

typedef enum kc_warm_status {
  KC_WARM_HIT_LOCAL,  /* already in the local cache */
  KC_WARM_HIT_REMOTE, /* fetched from kcached */
  KC_WARM_BUILT,      /* built here (and uploaded when a server is up) */
  KC_WARM_WAITED,     /* another builder held the lease; fetched when done */
  KC_WARM_FAILED,     /* not ready: see err and message */
  KC_WARM_HIT_COMPAT, /* this key is missing; a bundle of another arch that
                         runs on this device is used (compat_arch) */
  KC_WARM_N_STATUS
} kc_warm_status;

const char *kc_warm_status_name(kc_warm_status s); /* "hit-local", ... */

typedef struct kc_warm_item {
  char key[KC_HEX_LEN + 1];
  char arch[KC_ARCH_MAX + 1];
  kc_bucket bucket;
  kc_warm_status status;
  kc_err err;                   /* KC_OK unless failed */
  char message[KC_ERRBUF_SIZE]; /* why it failed, or a warning */
  uint64_t bytes;               /* bundle size (sum of its files) */
  size_t n_files;
  double seconds; /* when it was ready (or failed), counted
                     from the start of the warmup */
  int uploaded;   /* built and stored on the server */
  /* Another builder's lease on this key, when one was met ("" none): who
   * held it, and when it ends (seconds from the start of the warmup, and
   * the UTC time "2026-11-25T08:30:00Z"; -1 and "" when not said). */
  char lease_holder[KC_LEASE_HOLDER_MAX + 1];
  double lease_expires_s;
  char lease_expires_at[24];
  /* hit-compat: the bundle used instead (its arch and key); "" otherwise.
   * The bundle's files are what that arch's build wrote (a PTX fallback
   * has .ptx files where the exact build has .cubin). */
  char compat_arch[KC_ARCH_MAX + 1];
  char compat_key[KC_HEX_LEN + 1];
} kc_warm_item;

typedef struct kc_warm_report {
  char model[KC_HEX_LEN + 1];
  size_t n_items;
  kc_warm_item *items; /* owned by the report */
  size_t counts[KC_WARM_N_STATUS];
  uint64_t bytes;         /* total of ready bundles */
  uint64_t bytes_fetched; /* over the network */
  double seconds;
  int server_down;              /* a server was set but could not be reached */
  char warning[KC_ERRBUF_SIZE]; /* "" or a sentence for the operator */
  /* The first 401 or 403 kcached answered (a wrong, revoked or read-only
   * token where a write was needed), and its message; KC_OK when none.
   * kc_warm goes on without the server; `kcache warm --strict` fails. */
  kc_err refused;
  char refused_why[KC_ERRBUF_SIZE];
} kc_warm_report;

/* Frees what the report owns (not r itself). */
void kc_warm_report_free(kc_warm_report *r);
/* One line per key and a summary, for people. */
void kc_warm_report_print(const kc_warm_report *r, FILE *f);
/* The report as JSON; *out malloc'd, the caller frees it. */
kc_err kc_warm_report_json(const kc_warm_report *r, char **out, char *err);

typedef struct kc_warm_progress {
  size_t done, total;       /* keys finished (any status) of all keys */
  const kc_warm_item *item; /* the key just finished; borrowed for the call */
} kc_warm_progress;
typedef void (*kc_warm_progress_fn)(const kc_warm_progress *p, void *arg);

typedef struct kc_warm_opts {
  const char *const *archs; /* overrides the manifest's archs; may be NULL */
  size_t n_archs;
  int no_build;        /* fetch only: keys the server lacks fail at once
                          (no build, no lease taken, no waiting) */
  int no_upload;       /* build locally but do not store on the server */
  double deadline_s;   /* bounds the whole warmup; <= 0: none */
  const char *out_dir; /* materialize each ready bundle into
                          out_dir/<arch>/<dim>=<v>,<dim>=<v>/ ; may be NULL */
  int lease_ttl_s;     /* 0: 300 */
  double poll_s;       /* waiting on another builder: the first interval,
                          growing to 2 s; 0: 0.2 s */
  int build_jobs;      /* keys built at once, one forked process each;
                          0: online CPUs, at most 8 */
  double lease_wait_s; /* with a deadline: how long a key waits on another
                          builder's lease before it is built here anyway
                          (not leased; uploaded, the first complete upload
                          wins); 0: half of what is left of the deadline
                          when the wait starts; < 0: never (wait until the
                          lease lapses or the deadline passes) */
  /* Compatible-arch fallback (docs/DESIGN.md, "Compatible archs"): a key
   * that is missing is served by a bundle of another arch that runs on the
   * target device (hit-compat), found in the same lookup, best first. Only
   * when the device is known: device_arch ("sm_89", "8.9"), else the first GPU
   * detected; neither: no fallback. Only for keys whose own arch runs on
   * that device. PTX only with a known driver (detected, else the
   * manifest's "driver") that reads its ISA. */
  const char *device_arch; /* NULL: detect */
  int no_compat;           /* no fallback */
  int prefer_build;        /* build the exact arch when a builder is here; the
                              compatible bundle (fetched meanwhile) is used only
                              when that build is not ready by the deadline or
                              fails */
  kc_warm_progress_fn progress; /* may be NULL; called on the caller's thread */
  void *progress_arg;
} kc_warm_opts;

/* The keys of a warmup: for each bucket x arch (bucket-major), the key
 * fields. archs: as in kc_warm_opts, then the manifest's, then the local
 * GPU's. *fields is malloc'd (caller frees), *n entries. Needs NVRTC's
 * version for the NVRTC builder unless the manifest's toolchain pins "nvrtc"
 * (and then "cuda" too): fetching hosts without a toolkit pin it. */
kc_err kc_warm_keys(const kc_warmup *w, const char *const *archs,
                    size_t n_archs, kc_key_fields **fields, size_t *n,
                    char *err);

/* Fetch-or-build every key of w (docs/DESIGN.md, "Client warmup"):
 *  1. keys from kc_warm_keys; 2. the local cache (every blob checked for
 *     type and size, then re-hashed, within the deadline);
 *  3. one POST /v1/lookup (per 4096 keys; with, for each key whose arch
 *     runs on the target device, the keys of the bundles that would serve
 *     it instead, best first: hit-compat, see kc_warm_opts.device_arch),
 *     then all missing blobs in parallel (c's parallelism) over pooled
 *     connections, hashed while streaming, renamed into the cache only
 *     when they match;
 *  4. for the rest: take the lease, build (o->build_jobs keys at once, each
 *     in a forked process; NVRTC itself in a child per kernel), upload blobs
 *     then the manifest, release; a lease held by another: poll until the
 *     bundle appears (fetched: "waited"), the lease lapses (built here),
 *     o->lease_wait_s has passed with a deadline set (built here without
 *     the lease), or the deadline (the item names the holder);
 *  5. o->out_dir: materialize every ready bundle.
 * A bundle whose served bytes fail verification is never used: it is built
 * here and not uploaded. A server that cannot be reached, or refuses (a
 * token without the role), is not an error by itself: keys are built
 * locally and report->warning says so.
 * Fills *report in every case (free with kc_warm_report_free; on an early
 * error, such as no NVRTC to compute keys with, it has no items) and
 * returns KC_OK when every key is ready, else the first failure's code
 * (KC_DEADLINE, KC_BUILD_FAILED, ...) with err summarizing.
 * Threads: uses c (one thread at a time) and forks: call it where fork is
 * safe (at service start-up, before other threads run, is the usual). */
kc_err kc_warm(kc_client *c, const kc_warmup *w, const kc_warm_opts *o,
               kc_warm_report *report, char *err);

/* The bundle of one (bucket, arch) of w, for a service at run time: the key
 * as kc_warm computes it, then the local cache, then the server (pulled and
 * verified). bucket must be one of w's buckets' shapes (pad a request's
 * shape first: kc_bucket_pow2, kc_bucket_boundary). *out: kc_manifest_free.
 * With kc_bundle_file_bytes, this is what a C service hands to
 * cuModuleLoadData:
 *
 *   kc_manifest *m;
 *   if (kc_warm_bundle(c, w, &bucket, "sm_90a", &m, err) == KC_OK &&
 *       kc_bundle_file_bytes(c, m, "gemm.cubin", &img, &len, err) == KC_OK)
 *     cuModuleLoadData(&mod, img);
 */
kc_err kc_warm_bundle(kc_client *c, const kc_warmup *w, const kc_bucket *bucket,
                      const char *arch, kc_manifest **out, char *err);

/* ---- Demand feedback (demand.c) ----
 *
 * What a service ran and what it missed, for kcached's per-model histogram
 * (POST /v1/demand) and `kcache suggest`, so that buckets follow traffic.
 * Cheap and safe on a hot path: a note is counted in memory (a mutex, no
 * I/O); a background thread per client, started by the first note, sends the
 * counts in batches every 2 s (sooner when half the buffer is used) on its
 * own connection. Nothing here fails or blocks the caller on the network:
 * a send that fails is counted (kc_demand_stats.failed) and dropped. */

#define KC_DEMAND_BUFFER 4096 /* distinct entries held between sends */

typedef struct kc_demand_stats {
  uint64_t noted;   /* counts buffered */
  uint64_t sent;    /* counts kcached accepted */
  uint64_t dropped; /* counts refused because the buffer was full */
  uint64_t failed;  /* counts whose POST failed */
} kc_demand_stats;

/* Notes one run of model (64 hex) at shape (the actual sizes, not padded):
 * 1..16 dims named [a-z][a-z0-9_]{0,31}, values 0..2^53. When kc_warm ran
 * for this model on c, a shape that none of the warmup's buckets holds (one
 * with the same dimensions and every value >= the shape's) is also counted as
 * a miss. KC_OK counted (also when c has no server: then nothing is kept);
 * KC_BUSY the buffer is full, dropped and counted; KC_EINVAL a bad shape or
 * model; KC_NOMEM. Threads: unlike the rest of kc_client, any number of
 * threads may call it at once, and while another thread uses c. */
kc_err kc_demand_note(kc_client *c, const char *model, const kc_bucket *shape);
/* Sends what is buffered now, each POST bounded by timeout_ms (<= 0: 1 s).
 * The first failure, or KC_OK. kc_client_free does this with 1 s. Threads:
 * like kc_demand_note. */
kc_err kc_demand_flush(kc_client *c, long timeout_ms, char *err);
/* Counters since the first note. Threads: like kc_demand_note. */
void kc_demand_get_stats(kc_client *c, kc_demand_stats *out);
/* What kc_warm calls with its report: buffers as misses the keys it asked
 * for and kcached did not have (built, waited, failed, or served by a
 * compatible arch: anything but hit-local and hit-remote; none when the server
 * was down), and remembers w's buckets so that later notes of a shape beyond
 * them count as misses. Sent with the next batch or at kc_client_free. */
void kc_demand_warm_report(kc_client *c, const kc_warmup *w,
                           const kc_warm_report *r);
/* GET /v1/models/{model}/demand: the model's histogram as JSON
 * ({"model","total","dropped","updated","shapes":[{"shape","count"}],
 * "misses":[{"key"|"shape","count"}]}); *json malloc'd, the caller frees. */
kc_err kc_client_demand_get(kc_client *c, const char *model, char **json,
                            char *err);

/* ---- Helpers ---- */

/* Model hash of files (weights, config): SHA-256 of the lines
 * "<sha256 of the file>  <base name>\n", one per file, in the given order,
 * so renaming or reordering files changes the model's identity. */
kc_err kc_model_hash(const char *const *paths, size_t n,
                     char out[KC_HEX_LEN + 1], char *err);
/* Writes data to path atomically: a temporary file in the same directory
 * renamed over path, so readers see the old file or the new, never half. */
kc_err kc_write_file_atomic(const char *path, const void *data, size_t len,
                            char *err);
/* "batch=8,seq=1024" (dims sorted by name) into out. */
void kc_bucket_label(const kc_bucket *b, char *out, size_t out_size);

#ifdef __cplusplus
}
#endif
#endif
