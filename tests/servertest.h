/* servertest.h: what kcached's integration tests (test_server_*.c) share:
 * HTTP calls with cmocka-friendly names over kc_testsrv_http, JSON error
 * checks, blobs and bundles to upload, raw sockets (for what libcurl will not
 * do: hang up mid-body), shell commands, and S, the shared open server (no
 * tokens, 1 MiB limits) of the "api" groups.
 *
 * Helpers fail the current cmocka test on an unexpected answer; strings they
 * return are malloc'd and the caller's. Not thread-safe. */
#ifndef KC_SERVERTEST_H
#define KC_SERVERTEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <jansson.h>

#include "kc_schema.h"
#include "testsrv.h"

#define MODEL_A                                                                \
  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define MODEL_B                                                                \
  "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"

/* ---- HTTP ---- */

typedef kc_testsrv_resp resp;
typedef kc_testsrv_req req;

/* kc_testsrv_http, kc_testsrv_resp_free and kc_testsrv_header by short
 * names. http: a fresh handle to server t. */
resp http_on(CURL *c, const char *base, const char *path, req q);
resp http(const kc_testsrv *t, const char *path, req q);
void resp_free(resp *r);
int header(const resp *r, const char *name, char *out, size_t cap);
/* The body parsed as JSON (NULL when it is not); the caller decrefs. */
json_t *body_json(const resp *r);
/* Asserts a JSON error body {"error": code, "message": "..."}. */
void assert_error(const resp *r, long status, const char *code);
/* 1 when the error message contains needle (else says so on stderr). */
int error_mentions(const resp *r, const char *needle);
/* A sample of /metrics (an integer), -1 when absent. */
long metric(const kc_testsrv *t, const char *name);

/* ---- data ---- */

/* Digests a route must refuse: upper case, short, long, not hex, empty, a
 * path. */
#define N_BAD_HEX 7
extern const char *const bad_hex[N_BAD_HEX];
void sha_hex(const void *p, size_t n, char out[65]);
/* Deterministic bytes from a seed (an LCG). */
void fill_random(char *p, size_t n, unsigned seed);
/* PUTs the blob (writes its digest); the HTTP status. */
long put_blob(const kc_testsrv *t, const char *token, const void *p, size_t n,
              char digest[65]);
/* kc_testsrv_manifest, asserted. */
char *make_manifest(const char *model, uint64_t batch, const char *arch,
                    char (*digests)[65], const uint64_t *sizes, size_t n,
                    char key[65]);
/* Uploads two fresh blobs and a bundle over them; returns its manifest. */
char *store_bundle(const kc_testsrv *t, const char *token, const char *model,
                   uint64_t batch, unsigned seed, char key[65]);
/* Asserts that t serves the blob d (n bytes) and the bundle key as json. */
void check_kept(const kc_testsrv *t, const char *d, const char *blob, size_t n,
                const char *key, const char *json);

/* ---- processes and files ---- */

/* Runs a shell command; output (stdout and stderr) into out (may be NULL);
 * its exit status, -1 when it did not exit. */
int run_sh(const char *cmd, char *out, size_t cap);
/* Runs kcached with args (a shell string), output into out; exit status. */
int run_kcached(const char *args, char *out, size_t cap);
/* Makes a token with `kcached token` and appends its line to file. */
void new_token(const char *role, const char *name, const char *file,
               char *token, size_t cap);

/* ---- raw sockets ---- */

/* kc_testsrv_connect, asserted. */
int raw_connect(int port);
void raw_send(int fd, const void *p, size_t n);
/* Reads until the peer closes or the buffer is full; NUL-terminates. */
size_t raw_recv_all(int fd, char *buf, size_t cap);

/* ---- the shared open server ---- */

extern kc_testsrv S; /* no tokens, small limits */
/* Group setup and teardown: start S; stop it (a log tail when it did not
 * exit 0) and remove its directory. */
int open_setup(void **state);
int open_teardown(void **state);

/* Once in main: curl_global_init and SIGPIPE ignored. */
void servertest_init(void);

#endif
