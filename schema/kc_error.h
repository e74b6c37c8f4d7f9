/* kc_error.h: the one error enum of kcache, with its message and HTTP status.
 *
 * Every module returns kc_err. The table below is the only place a code is
 * defined: append new codes at the end, never renumber (codes appear in logs
 * and in the C ABI). Thread-safe: everything here is constant data.
 */
#ifndef KC_ERROR_H
#define KC_ERROR_H

/* X(NAME, number, http status, snake_case code for the wire, message) */
#define KC_ERRNO_MAP(X)                                                        \
  X(OK, 0, 200, "ok", "success")                                               \
  X(EINVAL, 1, 400, "bad_request", "invalid argument")                         \
  X(NOMEM, 2, 500, "internal", "out of memory")                                \
  X(IO, 3, 500, "io_error", "input/output error")                              \
  X(NOT_FOUND, 4, 404, "not_found", "not found")                               \
  X(BAD_DIGEST, 5, 400, "bad_digest", "not a lowercase 64-hex SHA-256")        \
  X(DIGEST_MISMATCH, 6, 422, "digest_mismatch",                                \
    "content does not hash to its SHA-256 name")                               \
  X(TOO_LARGE, 7, 413, "too_large", "too large")                               \
  X(STORE_FULL, 8, 507, "store_full", "the store is full")                     \
  X(BAD_MANIFEST, 9, 400, "bad_manifest", "invalid manifest")                  \
  X(KEY_MISMATCH, 10, 422, "key_mismatch",                                     \
    "the key does not match the manifest's fields")                            \
  X(MISSING_BLOBS, 11, 409, "missing_blobs",                                   \
    "the manifest references blobs the store does not hold")                   \
  X(CONFLICT, 12, 409, "conflict", "a different bundle holds this key")        \
  X(BAD_KEY, 13, 400, "bad_key", "invalid key or key fields")                  \
  X(BAD_JSON, 14, 400, "bad_json", "malformed JSON")                           \
  X(LEASED, 15, 409, "leased", "another builder holds the lease")              \
  X(UNAUTHORIZED, 16, 401, "unauthorized", "missing or invalid token")         \
  X(FORBIDDEN, 17, 403, "forbidden", "the token lacks the role")               \
  X(METHOD, 18, 405, "method_not_allowed", "method not allowed")               \
  X(NOT_READY, 19, 503, "not_ready", "the store is not open")                  \
  X(CORRUPT, 20, 500, "corrupt", "stored data failed verification")            \
  X(UNSAFE_PATH, 21, 400, "unsafe_path", "path escapes its directory")         \
  X(NO_DRIVER, 22, 500, "no_cuda_driver", "no CUDA driver")                    \
  X(NO_NVRTC, 23, 500, "nvrtc_not_found", "NVRTC not found")                   \
  X(BUILD_FAILED, 24, 500, "build_failed", "the build failed")                 \
  X(TIMEOUT, 25, 504, "timeout", "timed out")                                  \
  X(UNAVAILABLE, 26, 503, "unavailable", "the server cannot be reached")       \
  X(PROTOCOL, 27, 502, "bad_response", "unexpected answer from the server")    \
  X(DEADLINE, 28, 504, "deadline", "the deadline passed")                      \
  X(BAD_WARMUP, 29, 400, "bad_warmup", "invalid warmup manifest")              \
  X(INTERNAL, 30, 500, "internal", "internal error")                           \
  X(BAD_TOKEN_FILE, 31, 500, "bad_token_file", "invalid token file")           \
  X(BUSY, 32, 503, "busy", "resource busy, try again")                         \
  X(GPU, 33, 500, "cuda_error", "CUDA driver call failed")                     \
  X(DISK_FULL, 34, 507, "disk_full", "the disk holding the store is full")     \
  X(LOCKED, 35, 503, "locked", "another process serves this store directory")  \
  X(NOT_IMPLEMENTED, 36, 501, "not_implemented", "not implemented")            \
  X(UNSUPPORTED_MEDIA, 37, 415, "unsupported_media_type",                      \
    "the body's type or content coding is not accepted here")                  \
  X(ENCODED, 38, 500, "internal",                                              \
    "the blob is held compressed: read it as stored")

typedef enum kc_err {
#define KC_ERR_ENUM_(name, num, http, code, msg) KC_##name = num,
  KC_ERRNO_MAP(KC_ERR_ENUM_)
#undef KC_ERR_ENUM_
} kc_err;

/* Human message of an error ("the store is full"). Never NULL; static. */
const char *kc_strerror(kc_err e);
/* Wire code ("store_full"). Never NULL; static. */
const char *kc_err_code(kc_err e);
/* HTTP status the server answers with. */
int kc_err_http_status(kc_err e);
/* Symbol name ("KC_STORE_FULL"), for logs and tests. Never NULL; static. */
const char *kc_err_name(kc_err e);

/* Size of the error-detail buffers that functions fill ("files[2].path: '..'
 * segment not allowed"). A NULL buffer is allowed everywhere. */
#define KC_ERRBUF_SIZE 512

/* printf into an error buffer (NULL buf: nothing); returns e, so that
 * `return kc_errf(buf, KC_BAD_MANIFEST, "files[%zu].path: ...", i);` reads. */
kc_err kc_errf(char *buf, kc_err e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
