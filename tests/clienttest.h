/* clienttest.h: what the tests of libkcache and the kcache CLI
 * (test_client_*.c) share: a fixture (a temporary directory, a real
 * kcached started on demand through tests/testsrv.h), small warmups,
 * clients, two runners of the kcache CLI (a shell line; an argv with its
 * peak memory and time), a fake kcached that lies or misbehaves, and
 * clienttest_run, every binary's main.
 *
 * Helpers fail the current cmocka test on an unexpected result; strings
 * they return are malloc'd and the caller's unless said otherwise. NVRTC
 * tests call need_nvrtc: a skip without NVRTC, a failure with CI=true. */
#ifndef KC_CLIENTTEST_H
#define KC_CLIENTTEST_H

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kcache.h"
#include "testsrv.h"

#ifndef KC_TEST_KERNELS
#define KC_TEST_KERNELS "tests/kernels"
#endif
#ifndef KCACHE_BIN
#define KCACHE_BIN "kcache"
#endif

#define MODEL "287e43e0540bf56af64cfcac0c9a5ab81409756e1cb5e27fab7e5d82d2f8cb5c"

/* ---- fixture ---- */

typedef struct fx {
  char dir[256];   /* temporary root */
  char cache[300]; /* dir/cache */
  char out[300];   /* dir/out */
  kc_testsrv srv;
  int have_srv;
} fx;

int fx_setup(void **state);
/* Stops the server, makes dir writable again (--out leaves read-only
 * files) and removes it. */
int fx_teardown(void **state);
/* A test with the fixture, for the tests[] array handed to clienttest_run. */
#define CT(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)
/* Ignores SIGPIPE, points KCACHE_DIR at a temporary directory (commands
 * run without --cache-dir must not touch ~/.cache), initializes libcurl,
 * runs the tests KC_TEST_FILTER (a cmocka glob: test_x*) leaves, and
 * cleans up. main's return value. */
int clienttest_run(const char *group, const struct CMUnitTest *tests, size_t n);

/* Starts the real kcached as f->srv: with no flags; with args
 * (NULL-terminated). */
void start_server(fx *f);
void start_server_with(fx *f, const char *const *args);
/* Skips the test without NVRTC (fails it with CI=true). */
void need_nvrtc(void);
void rmtree(const char *p);
double now_s(void); /* CLOCK_MONOTONIC */

/* ---- files ---- */

void write_text(const char *path, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The whole file, NUL-terminated (*len its length; len may be NULL); NULL
 * when it cannot be read. */
char *read_all(const char *path, size_t *len);
/* A file's text (up to 255 bytes), "" when it cannot be read; a static
 * buffer, overwritten by the next call. */
const char *text_of(const char *path);
/* Entries of a directory other than . and .. */
int entries_in(const char *dir);
/* Asserts that two caches hold the same blobs. */
void blobs_equal(const char *cache_a, const char *cache_b);

/* ---- warmups, clients, reports ---- */

/* A small warmup: `kernel` (tests/kernels/<kernel>.cu, entry `entry`) for
 * batch 1 and 4 on sm_80. Written to dir/<name>.json. toolchain_extra is
 * spliced into the toolchain object (may be ""). */
kc_warmup *warmup_for(fx *f, const char *name, const char *kernel,
                      const char *entry, const char *toolchain_extra);
/* warmup_for's saxpy with a pinned NVRTC (keys computable without a
 * toolkit): its two keys' fields (*k, the caller frees) and key strings. */
kc_warmup *fault_warmup(fx *f, kc_key_fields **k, char keys[2][65]);
/* A command-builder warmup (no toolkit needed): `sh -c script` for batch 1
 * on sm_90a, written to dir/<name>.json (path out). script: no quotes. */
void cmd_warmup(fx *f, const char *name, const char *script, char *path,
                size_t size);
/* A command-builder warmup of the model `name` (hash MODEL) for archs (a
 * JSON list body: "\"sm_80\""), batch 1 and 2, written to dir/<file>.json
 * (path out): each bundle is one file k.cubin holding "x<arch><batch>". */
void cubin_warmup(fx *f, const char *file, const char *name, const char *archs,
                  char *path, size_t size);
/* The one key of a cmd_warmup. */
void cmd_key(const char *path, char key[65]);
/* A client on cache (NULL: the default) and url; 20 s requests. */
kc_client *client_for(const char *cache, const char *url);
/* A sealed manifest of MODEL (sm_80, batch 2) over the texts, put in c's
 * cache as the files paths[i]. */
kc_manifest *manifest_of(kc_client *c, const char *const *paths,
                         const char *const *texts, size_t n);
/* How many items of the report have status s. */
size_t count(const kc_warm_report *r, kc_warm_status s);
/* The integer after "name": in a JSON text (asserted present). */
size_t json_count(const char *json, const char *name);
/* How many times needle occurs in s. */
int occurrences(const char *s, const char *needle);
/* Makes a token with `kcached token ROLE NAME`; appends its line to file. */
void make_token(const char *role, const char *name, const char *file,
                char *token, size_t size);

/* ---- the kcache CLI ---- */

/* Runs the kcache CLI (a shell line, KCACHE_URL, KCACHE_TOKEN and
 * KCACHE_CACERT unset) with env ("VAR=value ..." or "") before it; returns
 * its exit status, stdout+stderr in out (may be NULL). */
int run_cli(char *out, size_t out_size, const char *fmt, ...);
int run_cli_env(char *out, size_t out_size, const char *env, const char *fmt,
                ...);

/* What one run_kcache did. */
typedef struct run_res {
  int rc; /* exit status; 128 + signal when killed */
  long maxrss_kb;
  double secs;
  char out[16384]; /* stderr, and stdout unless it went to a file */
} run_res;

/* Runs kcache with args (NULL-terminated; no shell) and env additions
 * ("VAR=v" ..., NULL-terminated, may be NULL) after unsetting KCACHE_URL,
 * KCACHE_TOKEN and KCACHE_DIR; stdout to stdout_path when not NULL (else
 * with stderr into r->out). Its own peak memory from wait4. */
void run_kcache(run_res *r, const char *stdout_path, const char *const *env,
                const char *const *args);

/* ---- a fake kcached that lies: wrong blob bytes, unsafe manifests, and
 * faults: stalls, resets, garbage, floods ---- */

/* How the fake misbehaves on a route instead of answering. */
typedef enum fault {
  FAULT_NONE,    /* answers (the route's body, or a 500) */
  FAULT_STALL,   /* reads the request, then never answers */
  FAULT_RESET,   /* reads the request, then closes with RST (SO_LINGER 0) */
  FAULT_GARBAGE, /* answers bytes that are not HTTP */
  FAULT_SHORT,   /* 200 with a Content-Length above the bytes sent, close */
  FAULT_HTML     /* 500 with an HTML body (a proxy's error page) */
} fault;

/* A fake kcached on loopback: one connection at a time, each closed after
 * one answer (unless hold). Zero fields: every route answers 500. */
typedef struct fake {
  int fd;
  int port;
  char url[64];
  pthread_t thread;
  const char *lookup_body; /* answer to POST /v1/lookup */
  const char *bundle_body; /* answer to GET /v1/bundles/... */
  const char *blob_body;   /* answer to GET /v1/blobs/... */
  const char *fetch_body;  /* answer to POST /v1/blobs/fetch (else 500) */
  size_t fetch_len;        /* ... its length (0: strlen) */
  int fetch_status;        /* ... with this status (0: 200) */
  int fetches;             /* POST /v1/blobs/fetch requests seen (atomic) */
  int gets;                /* GET /v1/blobs/... requests seen (atomic) */
  fault lookup_fault;      /* instead of answering POST /v1/lookup */
  fault blob_fault;        /* instead of answering GET /v1/blobs/... */
  size_t blob_flood;       /* > 0: GET /v1/blobs/ answers this many bytes
                              (SIZE_MAX: without end) */
  const char *flood_route; /* ... or this route instead ("GET /v1/...") */
  int flood_length;        /* ... with a Content-Length (else without) */
  int drip;                /* every answer: one body byte every 0.5 s */
  size_t sent;             /* flood: bytes the client took (atomic) */
  int hold;                /* accepts, never reads nor answers: each
                              connection is held open until fake_stop */
  int held[64];            /* ... the connections held */
  int n_held;              /* ... how many */
  int conns;               /* connections accepted (atomic) */
  int stop;
} fake;

/* A socket listening on a free loopback port: its port, and
 * "http://127.0.0.1:PORT" in url. */
int listen_loopback(int *port, char *url, size_t cap);
/* Listens on a free loopback port (s->url) and serves from a thread. */
void fake_start(fake *s);
void fake_stop(fake *s);
/* The manifest JSON for key fields k[0] with one file `path` holding
 * content; its key in key_out. */
char *fake_manifest(const kc_key_fields *k, const char *path,
                    const char *content, char *key_out);
/* A lookup answer that found key with manifest. */
char *lookup_of(const char *key, const char *manifest);

#endif
