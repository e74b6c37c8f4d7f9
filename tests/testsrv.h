/* testsrv.h: start the real kcached binary for integration tests: a temporary
 * directory, a free loopback port, readiness by GET /healthz, stop, kill,
 * restart on the same data.
 *
 * The directory holds data/ (the store), port (the port file) and kcached.log
 * (the server's stdout and stderr, appended across restarts). The binary is
 * $KCACHED_BIN when set, else the KCACHED_BIN this library was compiled with.
 * Not thread-safe: one thread drives one kc_testsrv.
 *
 * kc_testsrv_http is the tests' one HTTP client call (libcurl): any request
 * to any base URL, the status, body and headers back; it never asserts, so
 * worker threads may call it (each with its own handle).
 */
#ifndef KC_TESTSRV_H
#define KC_TESTSRV_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <curl/curl.h>

#include "kc_schema.h"

#define KC_TESTSRV_MAX_ARGS 32

typedef struct kc_testsrv {
  pid_t pid; /* 0 when not running */
  int port;
  char url[64];   /* "http://127.0.0.1:PORT" (https with --tls-cert) */
  char dir[256];  /* the temporary directory */
  char data[300]; /* dir/data */
  char log[300];  /* dir/kcached.log */
  int n_args;
  char *args[KC_TESTSRV_MAX_ARGS]; /* extra args, copied, reused by restart */
} kc_testsrv;

/* Zeroes t and makes its directory (so that a test can put a token file or
 * certificates there before starting). 0 ok, -1 error. kc_testsrv_start
 * calls it when t->dir is empty. */
int kc_testsrv_init(kc_testsrv *t);
/* Starts kcached with --listen 127.0.0.1:0 --port-file DIR/port --data-dir
 * DIR/data and extra_args (NULL-terminated, may be NULL; a later --data-dir
 * wins), waits until /healthz answers (30 s at most). 0 ok, -1 when it did not
 * come up (the log says why). */
int kc_testsrv_start(kc_testsrv *t, const char *const *extra_args);
/* SIGTERM and wait (30 s, then SIGKILL). Returns the exit status, 128+signal
 * when killed by one, -1 when not running. */
int kc_testsrv_stop(kc_testsrv *t);
/* kc_testsrv_stop, and when kcached did not exit 0 on SIGTERM (sanitizers
 * and valgrind report through it), says so on stderr with the log's tail,
 * headed by name. 0: exited 0 or was not running; -1 otherwise. */
int kc_testsrv_stop_checked(kc_testsrv *t, const char *name);
/* SIGKILL and wait: a crash, as far as the store can tell. */
void kc_testsrv_kill(kc_testsrv *t);
/* Stops if running and starts again on the same directory and arguments. */
int kc_testsrv_restart(kc_testsrv *t);
/* Stops if running, removes the directory, frees the arguments. */
void kc_testsrv_cleanup(kc_testsrv *t);
/* The kcached binary used. */
const char *kc_testsrv_bin(void);
/* Bit rot, for a stopped server: flips one byte in every copy of the n bytes
 * at needle in DIR/data/data.mdb. The number of copies changed, -1 when the
 * file cannot be read or written. */
int kc_testsrv_rot(const kc_testsrv *t, const void *needle, size_t n);

/* ---- small helpers of every integration test ---- */

/* Milliseconds of CLOCK_MONOTONIC. */
long kc_testsrv_now_ms(void);
void kc_testsrv_sleep_ms(long ms);
/* A whole file (a server log), NUL-terminated, malloc'd; "" (malloc'd) when
 * it cannot be read, NULL only when out of memory. */
char *kc_testsrv_slurp(const char *path);
/* The last 4000 bytes of t's log on stderr, headed by name (may be NULL),
 * for failure messages. */
void kc_testsrv_show_log(const kc_testsrv *t, const char *name);

/* Lines of t's log that contain needle; echo: print them ("  log: ...") on
 * stdout too. */
int kc_testsrv_log_count(const kc_testsrv *t, const char *needle, int echo);
/* Waits up to ms for text to stand times times in t's log: 1 when it does,
 * else 0. */
int kc_testsrv_wait_log(const kc_testsrv *t, const char *text, int times,
                        long ms);
/* Deterministic bytes for a seed (splitmix64), malloc'd (aborts when out of
 * memory: worker threads call it). */
unsigned char *kc_testsrv_bytes(uint64_t seed, size_t n);

/* A TCP connection to 127.0.0.1:port (close-on-exec, reads time out after
 * 20 s), for what libcurl will not send; the fd, -1 on error. */
int kc_testsrv_connect(int port);

/* A manifest of model, bucket {"batch": batch}, arch, a build of 'b's and
 * tool cuda 13.0, without files, not sealed; NULL when out of memory. */
kc_manifest *kc_testsrv_manifest_base(const char *model, uint64_t batch,
                                      const char *arch);
/* The canonical JSON (malloc'd) of a sealed manifest of model, bucket
 * {"batch": batch}, arch, a build of 'b's and tool cuda 13.0, with one file
 * k<i>.cubin (entry gemm) per digest; writes its key. NULL on error (said on
 * stderr): no asserts, worker threads call it. */
char *kc_testsrv_manifest(const char *model, uint64_t batch, const char *arch,
                          char (*digests)[65], const uint64_t *sizes, size_t n,
                          char key[65]);

/* ---- HTTP ---- */

typedef struct kc_testsrv_req {
  const char *method; /* default GET; HEAD asks for headers only */
  const char *token;  /* Authorization: Bearer TOKEN */
  const char *auth;   /* or a raw Authorization value */
  const void *body;   /* sent when not NULL, or when has_body */
  size_t len;
  int has_body;       /* send a body (empty when body is NULL) */
  int chunked;        /* send it with chunked encoding, in 7000-byte pieces */
  int expect;         /* keep curl's Expect: 100-continue */
  const char *header; /* one extra "Name: value" */
  const char *cainfo; /* TLS: verify against this CA */
  long timeout_ms;    /* the whole request; 0: 60 s */
} kc_testsrv_req;

typedef struct kc_testsrv_resp {
  CURLcode rc;
  long status; /* curl's CURLINFO_RESPONSE_CODE (0: no response) */
  char *body;  /* NUL-terminated, "" when none; the caller frees it
                * with kc_testsrv_resp_free (NULL only when out of
                * memory) */
  size_t len;
  char hdrs[16384]; /* the last response's header lines (not a 100) */
  size_t hlen;
  long connects; /* connections this request opened */
  long ms;       /* how long it took */
} kc_testsrv_resp;

/* One request for base + path on handle c (NULL: a fresh handle, cleaned up
 * after; else reset first, which keeps its connections). Never asserts. */
kc_testsrv_resp kc_testsrv_http(CURL *c, const char *base, const char *path,
                                kc_testsrv_req q);
void kc_testsrv_resp_free(kc_testsrv_resp *r);
/* GET of the path printf makes of fmt, on a fresh handle to t; status is
 * 0 unless the transfer completed. */
kc_testsrv_resp kc_testsrv_get(const kc_testsrv *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* 0 when t serves the bundle key exactly: json as its manifest, and n blobs
 * digest[i] of size[i] bytes made by kc_testsrv_bytes(seed[i], size[i]);
 * else the first status that was not 200 (-2: no answer), or -1 when the
 * bytes differ. */
long kc_testsrv_serves(const kc_testsrv *t, const char *key, const char *json,
                       const char (*digest)[65], const size_t *size,
                       const uint64_t *seed, size_t n);
/* The value of response header name (case-insensitive), copied to out: 1,
 * or 0 when absent. */
int kc_testsrv_header(const kc_testsrv_resp *r, const char *name, char *out,
                      size_t cap);

/* A sample of t's /metrics: series is the name with its labels, exactly
 * as the server writes it. -1 when absent (or /metrics did not answer 200). */
double kc_testsrv_metric(const kc_testsrv *t, const char *series);
/* kc_testsrv_metric once it reads want, or after max_ms (the last sample;
 * polled every 10 ms, backing off to 100 ms).
 * For what kcached counts when a request ends (kcached_requests_total,
 * bytes, durations): libmicrohttpd's completion callback, which can run
 * just after the client has read the whole answer. */
double kc_testsrv_metric_settle(const kc_testsrv *t, const char *series,
                                double want, long max_ms);
/* Polls kcached_s3_queue_depth until the write-through queue is empty: the
 * ms it took, -1 when it was not empty after max_ms (*depth: the last
 * sample, may be NULL). */
long kc_testsrv_drain(const kc_testsrv *t, long max_ms, double *depth);

#endif
