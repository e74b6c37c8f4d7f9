/* client_internal.h: what the files of libkcache share; never installed. */
#ifndef KCC_CLIENT_INTERNAL_H
#define KCC_CLIENT_INTERNAL_H

#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include <curl/curl.h>

#include "kcache.h"

struct kc_client {
  char *url; /* without a trailing '/'; NULL: no server */
  char *token;
  char *cacert;
  char *cache_dir;
  char *holder;
  long connect_timeout_ms;
  long timeout_ms;
  long low_speed_bps, low_speed_s; /* 0 bps: no low-speed limit */
  int parallel;
  CURL *easy;              /* one handle for sequential requests: keeps the
                              connection alive between them */
  CURL *easy2;             /* a second one, made when first needed: the
                              other half of a large lookup (client.c) */
  CURLM *multi;            /* parallel blob fetches; pools connections */
  struct curl_slist *hdrs; /* Authorization, no Expect: 100-continue */
  int64_t deadline_ms;     /* monotonic; 0: none (set by kc_warm) */
  long request_cap_ms;     /* > 0: one request's most (kc_warm's lookup) */
  size_t answer_max;       /* > 0: the largest answer kcc_http_do takes
                              (kc_client_blob_get: any); 0: KCC_ANSWER_MAX */
  _Atomic(struct kcc_demand *) demand; /* demand.c; NULL until first used */
  int no_batch;                /* the server lacks POST /v1/blobs/fetch (it
                                  answered 404/405): GETs only from then on */
  int cant_write;              /* the token was refused a write (403 on a
                                 lease or an upload): kc_warm offers nothing
                                 back (warm.c) */
  unsigned char blob_dir[256]; /* what is known of blobs/<2 hex>/: KCC_DIR_* */
  mode_t umask;                /* the process's, read once at kc_client_new: the
                                  mode cached (and linked) blobs get */
};

/* What is known of a blob fan-out directory (bits), so that a warm makes
 * each once and probes for blobs only where some may be (cache.c). */
enum {
  KCC_DIR_LOOKED = 1, /* looked at during this fetch */
  KCC_DIR_ABSENT = 2, /* ... and missing then: no blob to probe for in it
                         (this fetch dedupes its own digests) */
  KCC_DIR_MADE = 4    /* exists: made or seen by this client */
};
/* JSON answers (manifests, lookups of 4096 keys, stats) above this are a
 * server gone wrong: cut off rather than held in memory. */
#define KCC_ANSWER_MAX ((size_t)256 << 20)

/* ---- demand.c ---- */

#define KCC_DEMAND_FREE_MS 1000 /* the last send's bound at kc_client_free */
/* Stops the sender thread, sends what is left, frees (kc_client_free). */
void kcc_demand_free(kc_client *c);

/* ---- transport.c ---- */

typedef struct kcc_http_resp {
  long status;
  char *body; /* malloc'd, NUL-terminated; may be NULL when empty */
  size_t len;
  int retry_after_s;
} kcc_http_resp;

void kcc_http_resp_free(kcc_http_resp *r);
/* One request on c->easy; body may be NULL. Transport errors are
 * KC_UNAVAILABLE / KC_TIMEOUT; any HTTP status is KC_OK (check r->status). */
kc_err kcc_http_do(kc_client *c, const char *method, const char *path,
                   const void *body, size_t len, kcc_http_resp *r, char *err);
/* The same on handle h (c->easy or c->easy2), one thread per handle. */
kc_err kcc_http_do_on(kc_client *c, CURL *h, const char *method,
                      const char *path, const void *body, size_t len,
                      kcc_http_resp *r, char *err);
/* A libcurl failure of method path -> kc_err and its message
 * ("<method> <url><path>: <why>"; detail: libcurl's error buffer, may be ""
 * or NULL): the one place libcurl's codes are mapped. A timeout once
 * deadline_ms (kc_clock_mono_ms's clock; 0: none) has passed is KC_DEADLINE. */
kc_err kcc_http_curl_error(const kc_client *c, int64_t deadline_ms, CURLcode rc,
                           const char *method, const char *path,
                           const char *detail, char *err);
/* Error answer -> kc_err and its message ("server: <message>"). */
kc_err kcc_http_error(const kcc_http_resp *r, const char *what, char *err);
/* A copy of l with one more header h; NULL when out of memory. */
struct curl_slist *kcc_with_header(const struct curl_slist *l, const char *h);
/* Applies the handle's common options (TLS, auth, timeouts). */
void kcc_http_setup(kc_client *c, CURL *h, long timeout_ms);
/* Milliseconds left before the deadline, capped to c->timeout_ms; 0 when it
 * has passed. */
long kcc_http_budget_ms(const kc_client *c);

/* ---- client.c ---- */

/* kc_client_lookup, and refused[i] (may be NULL): why the manifest served
 * for keys[i] was refused (KC_OK: none served, or a valid one). */
kc_err kcc_lookup_checked(kc_client *c, const char *const *keys, size_t n,
                          kc_manifest **found, kc_err *refused, char *err);

/* What a lease answer says beyond its state. */
typedef struct kcc_lease_info {
  int retry_after_s;                    /* >= 1 */
  char holder[KC_LEASE_HOLDER_MAX + 1]; /* held: who; "" when not said */
  double expires_s; /* held: seconds left; -1 when not said */
} kcc_lease_info;

/* kc_client_lease_take, and what a 409 says of the holder. */
kc_err kcc_lease_take(kc_client *c, const char *key, int ttl_s,
                      kc_lease_state *state, char token[KC_LEASE_TOKEN_MAX],
                      kcc_lease_info *info, char *err);

/* ---- fetch.c: parallel verified blob downloads into the cache ---- */

/* Fetches each file's blob (those already cached are skipped) with up to
 * c->parallel transfers over pooled connections, hashing while streaming,
 * renaming into place only when the hash matches. A transfer is cut off as
 * soon as more bytes arrive than the file's size (a server cannot make us
 * read 2 GiB for a 200 KB blob). ok[i] (may be NULL) is set to 1 for each
 * blob now cached. Returns the first failure. *fetched gets the bytes
 * received (may be NULL). */
kc_err kcc_fetch_blobs(kc_client *c, const kc_file *const *files, size_t n,
                       char *ok, uint64_t *fetched, char *err);

/* ---- fetch_batch.c: many small blobs per request ---- */

/* What became of a file's blob in a fetch. */
enum { KCC_FETCH_TODO = 0, KCC_FETCH_DONE = 1, KCC_FETCH_FAILED = 2 };
/* Fetches the blobs of files[todo[0..n)] (distinct, not cached, each small
 * enough to be held in memory) with POST /v1/blobs/fetch over up to
 * c->parallel pooled connections, verifying each before it is renamed into
 * place. state[todo[k]] becomes DONE, FAILED (it came and was refused: the
 * error says why), or stays TODO: for a GET (missing on the server, an
 * answer cut short, a server without the route: c->no_batch is set then).
 * Returns the first failure; *fetched gets the bytes received. */
kc_err kcc_fetch_batched(kc_client *c, const kc_file *const *files,
                         const size_t *todo, size_t n, char *state,
                         uint64_t *fetched, char *err);

/* ---- cache.c ---- */

/* 1 when the blob is cached as a regular file of that size. */
int kcc_cache_blob_ok(const kc_client *c, const char *digest, uint64_t size);
/* kcc_cache_blob_ok, without the lstat when the blob's directory was
 * missing when first looked at (one lstat per directory instead of one per
 * blob in an empty cache). Fetches call kcc_cache_forget_dirs when they
 * start, so a look holds for one fetch only. */
int kcc_cache_blob_maybe(kc_client *c, const char *digest, uint64_t size);
void kcc_cache_forget_dirs(kc_client *c);
/* Writes data to a new file in tmp/ (path out, PATH_MAX): mkstemp, one
 * write, close. The file is removed on failure. */
kc_err kcc_cache_write_tmp(const kc_client *c, const void *data, size_t len,
                           char tmp[PATH_MAX], char *err);
/* kc_cache_bundle_put of ms[0..n), res[k] each one's result; from 32 on,
 * half of them on a second thread (joined before it returns). ms must be
 * manifests as parsed (validated, keys checked): they are not again. */
void kcc_cache_bundles_put(kc_client *c, const kc_manifest *const *ms, size_t n,
                           kc_err *res);
/* Renames a verified tmp file to blobs/<2 hex>/<digest>, making the
 * directory the first time this client needs it; tmp is removed on
 * failure. */
kc_err kcc_cache_blob_publish(kc_client *c, const char *tmp, const char *digest,
                              char *err);
/* Verified bytes of blob digest into the cache: kcc_cache_write_tmp, then
 * kcc_cache_blob_publish. */
kc_err kcc_cache_blob_write(kc_client *c, const void *data, size_t len,
                            const char *digest, char *err);
/* A temporary file in cache/tmp; path must hold PATH_MAX. fd or -1. */
int kcc_cache_tmp(const kc_client *c, char *path, char *err);
/* 0 when bundles/ holds no entry (a fresh cache: a warm need not look for
 * each of its keys), 1 when it does or cannot be read. */
int kcc_cache_has_bundles(const kc_client *c);
/* The cached blob is a regular file of that size hashing to digest (else
 * KC_CORRUPT and removed, as kcc_cache_blob_read). */
kc_err kcc_cache_blob_verify(kc_client *c, const char *digest, uint64_t size,
                             char *err);
/* Loads a blob file verified against digest and its manifest's size into
 * memory (NUL after). A mismatch, a symlink or any other type than a regular
 * file deletes the name (KC_CORRUPT); c's deadline stops the hashing
 * (KC_DEADLINE). */
kc_err kcc_cache_blob_read(kc_client *c, const char *digest, uint64_t size,
                           void **data, size_t *len, char *err);

/* ---- compat.c: kc_warm's compatible-arch fallback ---- */

/* Room for every target NVIDIA has, cubin and PTX (gpu/arch.c: 66). */
#define KCC_COMPAT_MAX 96
/* kc_warm asks for stand-ins in the same lookup as the keys up to this
 * many pending keys; past it, in a second lookup for the keys missing. */
#define KCC_COMPAT_INLINE 256

typedef struct kcc_compat {
  int on;                 /* a device is known and the fallback wanted */
  int cc_major, cc_minor; /* the device */
  int driver_version;     /* its driver (12080 = 12.8); 0: unknown, no PTX */
  char driver[16];        /* "driver" field PTX keys get ("" when the
                             manifest pins it) */
  char device[40];        /* for messages: "8.9 (GPU 0)", "sm_89 (given)" */
  char (*archs)[KC_ARCH_MAX + 1]; /* what can serve it, best first */
  size_t n_archs;
} kcc_compat;

/* Finds the device (o->device_arch, else the first GPU; none: cp->on 0) and
 * the targets that serve it. base: the keys' fields without bucket and arch
 * (its nvrtc/cuda say which PTX ISA a bundle holds). KC_EINVAL for a
 * device_arch that is not one. */
kc_err kcc_compat_init(kcc_compat *cp, const kc_warm_opts *o,
                       const kc_key_fields *base, char *err);
void kcc_compat_free(kcc_compat *cp);
/* 1 when a key of arch is for this device (its arch runs on it). */
int kcc_compat_applies(const kcc_compat *cp, const char *arch);
/* The keys that may stand in for item's, best first, its own left out
 * (none when item's arch is not for this device). */
size_t kcc_compat_keys(const kcc_compat *cp, const kc_key_fields *base,
                       const kc_key_fields *item, char (*keys)[KC_HEX_LEN + 1],
                       size_t max);

/* ---- files.c ---- */

/* mkdir -p, mode 0755 (0700 for the cache root is set by the caller). */
kc_err kcc_mkdirs(const char *path, char *err);
/* Writes all len bytes to fd, retrying EINTR; KC_IO with write's errno
 * (left as it was when write returned 0). */
kc_err kcc_write_all(int fd, const void *data, size_t len);
/* Removes a directory tree (for tests and the command builder's scratch). */
void kcc_rmtree(const char *path);
/* strdup that tolerates NULL. */
char *kcc_strdup0(const char *s);
/* fn(arg, from, to) over [0, n): with two (and n >= 2), a second thread
 * takes [0, n/2) while this one does [n/2, n); one thread does it all
 * when two is 0 or the thread cannot be made. Returns when both are done. */
void kcc_halves(size_t n, int two, void (*fn)(void *, size_t, size_t),
                void *arg);

/* ---- blob_stream.c ---- */

/* A blob's bytes as they arrive: hashed, and written to fd (or, fd < 0,
 * copied into buf, room for max bytes), at most max in all. */
typedef struct kcc_sink {
  kc_sha256 *sha;
  int fd;
  char *buf;
  uint64_t got, max;
  int too_big;   /* more than max came: the first max were taken */
  int write_bad; /* fd refused a write */
} kcc_sink;
/* Takes n bytes; fewer (a short count, which stops a libcurl transfer)
 * when they go past max or a write fails. One writer for every download
 * (fetch.c's GETs, kc_client_blob_get_fd). */
size_t kcc_sink_take(kcc_sink *s, const char *data, size_t n);

/* ---- materialize.c ---- */

/* kc_materialize; verified: every blob of m was hashed by this process
 * since it was cached (kc_warm's ready bundles), so it is linked or copied
 * without hashing it again. made (may be NULL): in, 1 when this run made
 * dir already (no mkdir); out, set to 1 when this call made it. */
kc_err kcc_materialize(kc_client *c, const kc_manifest *m, const char *dir,
                       int verified, int *made, char *err);

/* ---- build_key.c ---- */

/* Builds one key (fields f, index in w's buckets: bucket) into a sealed
 * manifest whose blobs are in the local cache. seconds bounds the build. */
kc_err kcc_build_key(kc_client *c, const kc_warmup *w, const kc_key_fields *f,
                     double seconds, kc_manifest **out, char *err);
/* The builder-input hash for the "build" key field. */
kc_err kcc_build_hash(const kc_warmup *w, char out[KC_HEX_LEN + 1], char *err);

#endif
