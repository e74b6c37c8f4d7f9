/* kcs3.h: a small S3 client (libcurl with CURLOPT_AWS_SIGV4, expat for the
 * XML answers) for the store's durable tier (docs/DESIGN.md, Scale-out).
 * Internal to store/: not installed, not part of kc_store.h, and no libcurl
 * type appears here.
 *
 * Works against AWS S3, Ceph RGW and MinIO: path-style URLs
 * (ENDPOINT/BUCKET/KEY, what RGW and MinIO want on a bare host:port) or
 * virtual-host URLs (BUCKET.HOST/KEY, AWS's default). Every request carries
 * `x-amz-content-sha256` (the payload's SHA-256; RGW rejects a SigV4 request
 * without it) and every upload a Content-Length.
 *
 * Threads: a kcs3 handle owns one CURL easy handle and its connection cache,
 * so one thread at a time may use a handle (it may move between threads
 * between calls). For parallel requests open one handle per worker. The
 * process must call curl_global_init() once in main before the first
 * kcs3_open (libcurl's rule: it is not thread-safe on every platform).
 *
 * Errors: kc_err, plus a sentence in `err` (KC_ERRBUF_SIZE, may be NULL) that
 * names the operation, the key, the HTTP status and S3's <Code> and
 * <Message> ("S3 PUT kc/blobs/ab..: HTTP 403 SignatureDoesNotMatch (check
 * the access key and secret) (request tx..)"). Secrets are
 * never written into it or anywhere else. The mapping (one place, s3.c):
 *   KC_UNAVAILABLE  cannot connect / connection lost (retry later)
 *   KC_TIMEOUT      a connect or request timeout passed (retry later)
 *   KC_IO           HTTP 5xx: S3's own failure, SlowDown (retry with backoff)
 *   KC_NOT_FOUND    HTTP 404 (NoSuchKey, NoSuchBucket: the message says which)
 *   KC_CONFLICT     HTTP 412: a conditional write lost (If-None-Match: * on an
 *                   existing key, If-Match on a changed one)
 *   KC_BUSY         HTTP 409 ConditionalRequestConflict / OperationAborted:
 *                   a concurrent conditional write; retry
 *   KC_TOO_LARGE    a GET body over the caller's cap
 *   KC_PROTOCOL     any other HTTP status (4xx: credentials, region, request),
 *                   or an answer that does not parse: do not retry blindly
 *   KC_NOMEM, KC_EINVAL as usual.
 * kcs3_retryable() tells the write-through queue which ones to retry.
 */
#ifndef KCS3_H
#define KCS3_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kc_error.h"

typedef struct kcs3 kcs3;

/* Room for an ETag. ETags are given without their HTTP quotes
 * ("d41d8cd98f00b204e9800998ecf8427e"; multipart ones are longer), the same
 * from put, get, head and list, and sent unquoted in If-Match: Ceph RGW 16
 * compares a PUT's If-Match byte for byte with its unquoted ETag (a quoted
 * one never matches, checked here). AWS S3 and MinIO with an unquoted
 * If-Match on PUT are not verified here yet. */
#define KCS3_ETAG_MAX 128
/* Longest object key S3 allows, in bytes. */
#define KCS3_KEY_MAX 1024

typedef struct kcs3_opts {
  const char *endpoint; /* "http://127.0.0.1:7480", "https://s3.amazonaws.com";
                           no path for virtual-host style */
  const char *bucket;   /* 3..63 bytes */
  const char *region;   /* SigV4 scope; NULL: "us-east-1" */
  int path_style;       /* 1: ENDPOINT/BUCKET/KEY; 0: BUCKET.HOST/KEY */
  /* Credentials, filled by the caller (kcached reads AWS_ACCESS_KEY_ID and
   * AWS_SECRET_ACCESS_KEY); copied by kcs3_open, wiped by kcs3_close. */
  const char *access_key;
  const char *secret_key;
  const char *session_token; /* NULL, or STS's token (x-amz-security-token) */
  long connect_timeout_ms;   /* 0: 3000 */
  long timeout_ms;           /* whole request; 0: 30000. Raise it for big
                                objects: a 256 MiB GET needs seconds. */
  unsigned list_max_keys;    /* keys per ListObjectsV2 page; 0: the server's
                                default (1000). Tests set 2 to exercise
                                continuation tokens. */
  /* NULL, or a flag another thread may set: a request in progress then
   * stops within about a second (KC_IO), so a closing kcached does not wait
   * out a long upload's timeout. Borrowed: it must outlive the handle. */
  const _Atomic int *abort_flag;
} kcs3_opts;

/* Checks the options and makes a handle (no request is sent). *out owned by
 * the caller (kcs3_close). KC_EINVAL names the bad option. */
kc_err kcs3_open(const kcs3_opts *o, kcs3 **out, char *err);
/* Closes the connections, wipes the secret. NULL: nothing. */
void kcs3_close(kcs3 *c);

/* 1 when an error is worth retrying later (UNAVAILABLE, TIMEOUT, IO, BUSY). */
int kcs3_retryable(kc_err e);
/* 1 when the last answer on c refused the bucket as a whole rather than one
 * object: 401, 403 (credentials, a policy), a redirect (wrong region or
 * endpoint), NoSuchBucket, an expired or invalid token or key. A queue waits
 * such a failure out instead of setting the entry aside. */
int kcs3_refuses_bucket(const kcs3 *c);
/* Makes kcs3_refuses_bucket 0 until the next answer: for a caller whose next
 * failure may come before any request is sent. */
void kcs3_forget_answer(kcs3 *c);

/* ---- Objects. `key` is the object key (<= KCS3_KEY_MAX bytes, not empty);
 * any bytes are encoded for the URL here. ---- */

typedef struct kcs3_put_opts {
  int if_none_match;        /* 1: If-None-Match: * (create only): KC_CONFLICT
                               when the key exists. Write-once and leases
                               across replicas rest on this. */
  const char *if_match;     /* non-NULL: If-Match: this ETag, quoted or not
                               (replace only that version): KC_CONFLICT when
                               it changed */
  const char *sha256_hex;   /* non-NULL: the body's SHA-256 (64 hex) when the
                               caller knows it (a blob's digest): not hashed
                               again, and S3 checks the bytes against it */
  int unsigned_payload;     /* 1: send x-amz-content-sha256: UNSIGNED-PAYLOAD
                               (no hashing of a big body whose digest is not
                               known; TLS still protects it on the way) */
  const char *content_type; /* NULL: application/octet-stream */
  const char *encoding;     /* non-NULL: x-amz-meta-kcache-encoding: this
                               (a blob held compressed: "zstd") */
} kcs3_put_opts;

/* PUT len bytes from data (len may be 0). popts may be NULL (unconditional).
 * etag (may be NULL) gets the new object's ETag. */
kc_err kcs3_put(kcs3 *c, const char *key, const void *data, size_t len,
                const kcs3_put_opts *popts, char etag[KCS3_ETAG_MAX],
                char *err);

/* GET the object into a malloc'd buffer *data (the caller frees it; one NUL
 * byte follows the *len bytes, for text); KC_TOO_LARGE (nothing returned)
 * when it is over max_bytes (> 0). etag may be NULL. */
kc_err kcs3_get(kcs3 *c, const char *key, size_t max_bytes, void **data,
                size_t *len, char etag[KCS3_ETAG_MAX], char *err);

/* Where a streaming GET puts the bytes, in order, in pieces of any size;
 * anything but KC_OK stops the transfer and kcs3_get_stream returns it.
 * (Read-through writes into LMDB's reserved space and hashes as it goes.) */
typedef kc_err (*kcs3_sink)(const void *data, size_t len, void *ud);

/* GET, streaming the body into sink without holding it whole; KC_TOO_LARGE
 * once it passes max_bytes (> 0; at once when Content-Length says so, before
 * any byte reaches the sink). *size (may be NULL): bytes delivered. A failed
 * transfer may have delivered some bytes first: the sink's owner discards
 * them. */
kc_err kcs3_get_stream(kcs3 *c, const char *key, uint64_t max_bytes,
                       kcs3_sink sink, void *ud, uint64_t *size,
                       char etag[KCS3_ETAG_MAX], char *err);

/* A header of the answer being received or last received on c (a sink may
 * ask before its first piece is taken): 1 with its value in out, 0 when
 * absent. For object metadata such as x-amz-meta-kcache-encoding. */
int kcs3_answer_header(kcs3 *c, const char *name, char *out, size_t cap);

/* HEAD: size and ETag (either may be NULL); KC_NOT_FOUND when absent. */
kc_err kcs3_head(kcs3 *c, const char *key, uint64_t *size,
                 char etag[KCS3_ETAG_MAX], char *err);

/* DELETE. S3 answers 204 whether or not the key existed, so a missing key is
 * KC_OK too (deleting is idempotent). */
kc_err kcs3_delete(kcs3 *c, const char *key, char *err);

/* One listed object; pointers valid during the callback only. */
typedef struct kcs3_entry {
  const char *key;
  uint64_t size;
  const char *etag;
} kcs3_entry;

/* Called once per key in key order; return 0 to go on, anything else to stop
 * (kcs3_list then returns KC_OK). */
typedef int (*kcs3_list_cb)(const kcs3_entry *e, void *ud);

/* Every key that starts with prefix (NULL or "": all), following
 * ListObjectsV2 continuation tokens page by page. */
kc_err kcs3_list(kcs3 *c, const char *prefix, kcs3_list_cb cb, void *ud,
                 char *err);

/* ---- The bucket ---- */

/* Creates the bucket (with a LocationConstraint outside us-east-1); one that
 * this account already owns is KC_OK. For tests and first-time setup. */
kc_err kcs3_bucket_create(kcs3 *c, char *err);
/* Deletes the (empty) bucket. For tests. */
kc_err kcs3_bucket_delete(kcs3 *c, char *err);

#endif
