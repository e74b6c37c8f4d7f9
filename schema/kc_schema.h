/* kc_schema.h: the data model shared by every module: SHA-256 helpers, bundle
 * keys, bundle manifests, warmup manifests and shape buckets (docs/DESIGN.md,
 * "The key", "The bundle manifest", "The warmup manifest").
 *
 * Threads: every function is reentrant; objects are not shared-safe for
 * concurrent mutation. Errors: each function returns a kc_err and, when `err`
 * is not NULL, writes a sentence of at most KC_ERRBUF_SIZE bytes into it that
 * names the failing field ("files[2].path: '..' segment not allowed").
 */
#ifndef KC_SCHEMA_H
#define KC_SCHEMA_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "kc_error.h"

#define KC_HEX_LEN 64         /* SHA-256 as lowercase hex, without NUL */
#define KC_MAX_DIMS 16        /* bucket entries */
#define KC_MAX_TOOLS 32       /* toolchain entries */
#define KC_NAME_MAX 32        /* bucket dim / toolchain name bytes */
#define KC_TOOL_VALUE_MAX 128 /* toolchain value bytes */
#define KC_ARCH_MAX 15        /* "compute_100f" and room */
#define KC_PATH_MAX 255       /* manifest file path bytes */
#define KC_BUCKET_VALUE_MAX 9007199254740992ULL /* 2^53 */
#define KC_LOOKUP_MAX 4096 /* keys in one POST /v1/lookup */
/* Files in one bundle manifest. A Triton cache entry is about 6 files per
 * kernel (cubin, ptx, ttir, ttgir, llir, json) and an Inductor compile of a
 * large model a few hundred kernels: about 2,000 files; this leaves twice
 * that. It bounds what one manifest costs (refcounts in one transaction, a
 * fetch per blob, S3 HEADs) whatever --max-json-bytes allows. */
#define KC_MANIFEST_MAX_FILES 4096

/* ---- SHA-256 (OpenSSL EVP) ---- */

/* 1 if s is exactly 64 lowercase hex digits followed by NUL. */
int kc_is_hex64(const char *s);
/* Hash a buffer; writes 64 hex digits and a NUL into out. */
kc_err kc_sha256_hex(const void *data, size_t len, char out[KC_HEX_LEN + 1]);

typedef struct kc_sha256 kc_sha256; /* streaming hasher, opaque */
/* New hasher; the caller owns it (kc_sha256_free). NULL on out of memory. */
kc_sha256 *kc_sha256_new(void);
kc_err kc_sha256_update(kc_sha256 *h, const void *data, size_t len);
/* Finishes; the hasher may then only be freed or reset. */
kc_err kc_sha256_final(kc_sha256 *h, char out[KC_HEX_LEN + 1]);
kc_err kc_sha256_reset(kc_sha256 *h);
void kc_sha256_free(kc_sha256 *h);
/* Hash a whole file (streams it); KC_IO with errno text on failure. */
kc_err kc_sha256_file(const char *path, char out[KC_HEX_LEN + 1],
                      uint64_t *size, char *err);

/* ---- Keys ---- */

typedef struct kc_dim {
  char name[KC_NAME_MAX + 1];
  uint64_t value; /* 0..2^53 */
} kc_dim;

typedef struct kc_tool {
  char name[KC_NAME_MAX + 1];
  char value[KC_TOOL_VALUE_MAX + 1];
} kc_tool;

typedef struct kc_bucket {
  size_t n;                 /* 1..KC_MAX_DIMS */
  kc_dim dims[KC_MAX_DIMS]; /* any order; canonical JSON sorts them */
} kc_bucket;

/* The fields a key is the hash of. Plain data, no pointers: copy freely. */
typedef struct kc_key_fields {
  char model[KC_HEX_LEN + 1];
  char build[KC_HEX_LEN + 1];
  char arch[KC_ARCH_MAX + 1];
  kc_bucket bucket;
  size_t n_tools;
  kc_tool tools[KC_MAX_TOOLS]; /* the toolchain map; any order */
} kc_key_fields;

/* Validates every field by docs/DESIGN.md's rules (duplicate names
 * included). */
kc_err kc_key_validate(const kc_key_fields *f, char *err);
/* Canonical key JSON (sorted keys, compact, one line, no NUL inside).
 * Validates first. *out is malloc'd, the caller frees it. */
kc_err kc_key_canonical(const kc_key_fields *f, char **out, char *err);
/* The key: SHA-256 hex of the canonical JSON. */
kc_err kc_key_compute(const kc_key_fields *f, char key[KC_HEX_LEN + 1],
                      char *err);
/* Parse key fields from JSON: {"model","bucket","arch","toolchain","build"}
 * and optional "v":1; unknown fields are rejected. */
kc_err kc_key_fields_parse(const char *json, size_t len, kc_key_fields *out,
                           char *err);
/* Add or replace a toolchain entry (validated). */
kc_err kc_key_set_tool(kc_key_fields *f, const char *name, const char *value,
                       char *err);
/* 1 if arch matches ^(sm|compute)_[0-9]{2,3}[af]?$ */
int kc_arch_valid(const char *arch);

/* ---- Bundle manifests ---- */

typedef enum kc_file_kind {
  KC_KIND_CUBIN,
  KC_KIND_PTX,
  KC_KIND_FATBIN,
  KC_KIND_LTOIR,
  KC_KIND_FILE
} kc_file_kind;

const char *kc_file_kind_name(kc_file_kind k);            /* "cubin", ... */
int kc_file_kind_parse(const char *s, kc_file_kind *out); /* 0 ok, -1 bad */

typedef struct kc_file {
  char *path; /* relative, normalized (kc_path_validate) */
  char sha256[KC_HEX_LEN + 1];
  uint64_t size;
  kc_file_kind kind;
  size_t n_entries;
  char **entries; /* kernel entry points (may be 0) */
} kc_file;

typedef struct kc_producer {
  char *builder; /* may be NULL */
  char *host;    /* may be NULL */
  double seconds;
  char *created; /* RFC 3339 UTC "2026-11-22T08:00:00Z", may be NULL */
} kc_producer;

/* A bundle manifest. Everything it points to is owned by it. */
typedef struct kc_manifest {
  char key[KC_HEX_LEN + 1];
  kc_key_fields fields;
  size_t n_files;
  kc_file *files;
  kc_producer producer;
} kc_manifest;

/* Parse and validate a manifest (schema "kcache.bundle/v1"): every field,
 * path rules, unique paths, and key == key computed from the fields
 * (KC_KEY_MISMATCH otherwise). *out is owned by the caller. */
kc_err kc_manifest_parse(const char *json, size_t len, kc_manifest **out,
                         char *err);
/* The same from a parsed JSON value (jansson's json_t, loaded with
 * JSON_REJECT_DUPLICATES by the caller): a lookup answer's manifests are
 * taken from the answer as parsed, not dumped and parsed again. */
struct json_t;
kc_err kc_manifest_parse_json(struct json_t *root, kc_manifest **out,
                              char *err);
/* Validate every rule of an in-memory manifest except the key. */
kc_err kc_manifest_validate(const kc_manifest *m, char *err);
/* Validate, then compute and store m->key from m->fields. */
kc_err kc_manifest_seal(kc_manifest *m, char *err);
/* KC_OK if m->key is the key computed from m->fields; KC_KEY_MISMATCH with
 * "key: does not match the fields (expected <hex>)" otherwise; KC_BAD_MANIFEST
 * if the key is not hex or the fields are invalid. (Added by schema/.) */
kc_err kc_manifest_check_key(const kc_manifest *m, char *err);
/* Canonical JSON of a (valid) manifest; *out malloc'd, caller frees. The same
 * manifest always gives the same bytes. */
kc_err kc_manifest_to_json(const kc_manifest *m, char **out, char *err);
/* The same without checking m again: for a manifest kc_manifest_parse,
 * kc_manifest_parse_json or kc_manifest_seal accepted, unchanged since (a
 * warm writes each served manifest into the local cache, and validating
 * and rehashing each a second time was most of that work's CPU). */
kc_err kc_manifest_to_json_valid(const kc_manifest *m, char **out, char *err);
/* (schema/ notes on the canonical form: files are written in path byte order,
 * so the order a builder listed them in does not matter; empty "entries" and
 * an empty "producer" are left out; producer.seconds <= 0 means unknown and is
 * left out; reals are written with 15 significant digits ("1.84").) */
/* Empty manifest to fill (calloc'd); free with kc_manifest_free. */
kc_manifest *kc_manifest_new(void);
/* Append a file (strings copied). */
kc_err kc_manifest_add_file(kc_manifest *m, const char *path,
                            const char sha256[KC_HEX_LEN + 1], uint64_t size,
                            kc_file_kind kind, const char *const *entries,
                            size_t n_entries, char *err);
void kc_manifest_free(kc_manifest *m);
/* 1 if both describe the same bundle (same canonical JSON). */
int kc_manifest_equal(const kc_manifest *a, const kc_manifest *b);

/* Path rules: relative, '/'-separated, no '..', no leading '/', no empty or
 * '.' segment, no NUL or backslash, 1..255 bytes. `what` prefixes the error
 * ("files[2].path"). */
kc_err kc_path_validate(const char *path, const char *what, char *err);
/* (schema/ note: kc_path_validate returns KC_UNSAFE_PATH; inside a manifest
 * the same failure is KC_BAD_MANIFEST. Error texts written by schema/ are
 * always printable ASCII: user input in them is cut and non-ASCII bytes are
 * shown as '?', so they can go into JSON bodies and logs as they are.) */

/* ---- Warmup manifests ---- */

typedef struct kc_kernel {
  char *name;
  char *source; /* resolved against the manifest's directory */
  size_t n_entries;
  char **entries;
  size_t n_options;
  char **options;
} kc_kernel;

typedef struct kc_warmup {
  char *model_name;
  char model_hash[KC_HEX_LEN + 1];
  size_t n_archs; /* 0: detect the local GPU's */
  char (*archs)[KC_ARCH_MAX + 1];
  size_t n_tools;
  kc_tool tools[KC_MAX_TOOLS];
  size_t n_kernels; /* NVRTC builder; 0 when a command builds */
  kc_kernel *kernels;
  size_t n_command; /* command builder argv; 0 when kernels build */
  char **command;
  int timeout_s; /* per build; default 600 */
  size_t n_buckets;
  kc_bucket *buckets;
  char *base_dir; /* directory relative paths resolve against */
} kc_warmup;

/* Parse and validate (schema "kcache.warmup/v1"). base_dir may be NULL (".").
 */
kc_err kc_warmup_parse(const char *json, size_t len, const char *base_dir,
                       kc_warmup **out, char *err);
/* Read a file and parse it; base_dir is the file's directory. */
kc_err kc_warmup_load(const char *path, kc_warmup **out, char *err);
void kc_warmup_free(kc_warmup *w);

/* ---- Shape buckets ---- */

/* Smallest power of two >= n, clamped into [min, max] (min <= max, both > 0);
 * n > max: KC_TOO_LARGE. */
kc_err kc_bucket_pow2(uint64_t n, uint64_t min, uint64_t max, uint64_t *out);
/* Smallest of the ascending bounds that holds n; n above the largest:
 * KC_TOO_LARGE. */
kc_err kc_bucket_boundary(uint64_t n, const uint64_t *bounds, size_t n_bounds,
                          uint64_t *out);
/* A bucket as a new JSON object {"name": value, ...} in its dims' order;
 * NULL without memory. Every bucket kcache writes as JSON goes through it
 * (the key's canonical form is json_out.c's, sorted). */
struct json_t *kc_bucket_to_json(const kc_bucket *b);

/* ---- Hex and clocks (hexclock.c) ---- */

/* Writes n bytes as 2n lowercase hex digits and a NUL into out. */
void kc_hex_encode(const void *bytes, size_t n, char *out);
/* The value of one hex digit, either case; -1 if c is not one. */
int kc_hex_digit(int c);
/* Reads 2n hex digits (either case) into n bytes; -1 if one is not hex
 * (out is then partly written). Length is the caller's to check. */
int kc_hex_decode(const char *hex, size_t n, unsigned char *out);
/* The wall clock (CLOCK_REALTIME), milliseconds since the Unix epoch. */
int64_t kc_clock_wall_ms(void);
/* The monotonic clock (CLOCK_MONOTONIC), microseconds: for intervals. */
uint64_t kc_clock_mono_us(void);
/* The same in milliseconds, signed (deadlines and idle times subtract):
 * the one millisecond monotonic clock of kcached, libkcache and the store
 * (store/reads.c's read ages alone use a coarser one). */
int64_t kc_clock_mono_ms(void);
/* The time `us` microseconds from now on clock clk: a deadline for
 * pthread_cond_timedwait on a condition variable of that clock. */
struct timespec kc_clock_deadline(clockid_t clk, uint64_t us);

/* ---- Misc ---- */

/* Read a whole file into a NUL-terminated malloc'd buffer. */
kc_err kc_read_file(const char *path, char **out, size_t *len, char *err);

#endif
