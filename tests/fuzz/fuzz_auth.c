/* fuzz_auth.c: libFuzzer target for kcached's token file (auth.c):
 * kcd_auth_load on a file made of the input, then kcd_http_auth (http.c's
 * Bearer parsing, then service.c's token check) on an Authorization header
 * taken from the input.
 *
 * Input: the first line is the header ("Bearer <token>"; an empty first line
 * means no header), the rest is the token file. The file is a memfd read
 * through /proc/self/fd/N, since kcd_auth_load takes a path. Results are
 * checked against a reference reading of docs/DESIGN.md's format ("role name
 * sha256(token)" lines, '#' comments): every token loaded must be a whole,
 * non-comment line of the file; a file is loaded exactly when every
 * non-comment line is well-formed, no token hash repeats and it holds a
 * token (the table it replaces has one); a failed load keeps the old table. */
#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#include <openssl/sha.h>

#include "fuzz_common.h"
#include "kcd.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int fd_file = -1, fd_base = -1;
static char path_file[64], path_base[64];

/* The table every load replaces; token "kc_fuzz_base". */
static const char base_token[] = "kc_fuzz_base";

static void put(int fd, const void *p, size_t n) {
  FZ_CHECK(ftruncate(fd, 0) == 0, "ftruncate");
  FZ_CHECK(n == 0 || pwrite(fd, p, n, 0) == (ssize_t)n, "pwrite");
}

static void to_hex(const unsigned char *b, size_t n, char *out) {
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = hex[b[i] >> 4];
    out[2 * i + 1] = hex[b[i] & 15];
  }
  out[2 * n] = '\0';
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fd_file = memfd_create("kc_fuzz_tokens", MFD_CLOEXEC);
  fd_base = memfd_create("kc_fuzz_base", MFD_CLOEXEC);
  FZ_CHECK(fd_file >= 0 && fd_base >= 0, "memfd_create");
  snprintf(path_file, sizeof path_file, "/proc/self/fd/%d", fd_file);
  snprintf(path_base, sizeof path_base, "/proc/self/fd/%d", fd_base);
  unsigned char d[32];
  char line[128], hex[65];
  SHA256((const unsigned char *)base_token, strlen(base_token), d);
  to_hex(d, 32, hex);
  int n = snprintf(line, sizeof line, "read base %s\n", hex);
  put(fd_base, line, (size_t)n);
  return 0;
}

/* ---- the reference reading ---- */

typedef struct ref_tok {
  kcd_role role;
  char name[KCD_NAME_MAX];
  unsigned char digest[32];
} ref_tok;

static int hexv(int c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* Parses one whole line as "role name hex"; 0 if it is a well-formed entry.
 * Only entries matter here: the check is that nothing else becomes one. */
static int ref_line(char *s, ref_tok *t) {
  char *save = NULL;
  char *role = strtok_r(s, " \t", &save);
  char *name = strtok_r(NULL, " \t", &save);
  char *hex = strtok_r(NULL, " \t", &save);
  if (!role || !name || !hex || strtok_r(NULL, " \t", &save))
    return -1;
  if (strcmp(role, "read") == 0)
    t->role = KCD_ROLE_READ;
  else if (strcmp(role, "write") == 0)
    t->role = KCD_ROLE_WRITE;
  else if (strcmp(role, "admin") == 0)
    t->role = KCD_ROLE_ADMIN;
  else
    return -1;
  if (strlen(name) >= KCD_NAME_MAX || strlen(hex) != 64)
    return -1;
  for (const char *c = name; *c; c++)
    if (!isalnum((unsigned char)*c) && !strchr("_.@-", *c))
      return -1;
  snprintf(t->name, sizeof t->name, "%s", name);
  for (int i = 0; i < 32; i++) {
    int hi = hexv(hex[2 * i]), lo = hexv(hex[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return -1;
    t->digest[i] = (unsigned char)(hi << 4 | lo);
  }
  return 0;
}

/* Reads the file the way docs/DESIGN.md describes it: lines split at '\n' (a C
 * string each: a NUL ends it), trimmed, blank and '#' lines skipped.
 * Returns the number of non-comment lines; the well-formed ones in *out. */
static size_t ref_read(const char *p, size_t n, ref_tok **out, size_t *n_ok) {
  size_t lines = 0, ok = 0;
  ref_tok *v = calloc(n / 2 + 1, sizeof *v);
  FZ_CHECK(v, "calloc");
  while (n > 0) {
    const char *nl = memchr(p, '\n', n);
    size_t len = nl ? (size_t)(nl - p) : n;
    char *s = malloc(len + 1);
    FZ_CHECK(s, "malloc");
    memcpy(s, p, len);
    s[len] = '\0';
    char *t = s;
    while (isspace((unsigned char)*t))
      t++;
    size_t tl = strlen(t);
    while (tl && isspace((unsigned char)t[tl - 1]))
      t[--tl] = '\0';
    if (*t && *t != '#') {
      lines++;
      if (ref_line(t, &v[ok]) == 0)
        ok++;
    }
    free(s);
    p += len + (nl ? 1 : 0);
    n -= len + (nl ? 1 : 0);
  }
  *out = v;
  *n_ok = ok;
  return lines;
}

/* Whether two entries share a token hash (the file is then refused). */
static int ref_dup(const ref_tok *v, size_t n) {
  for (size_t i = 0; i < n; i++)
    for (size_t j = i + 1; j < n; j++)
      if (memcmp(v[i].digest, v[j].digest, 32) == 0)
        return 1;
  return 0;
}

/* ---- the checks ---- */

static const ref_tok *ref_find(const ref_tok *v, size_t n,
                               const unsigned char d[32]) {
  for (size_t i = 0; i < n; i++)
    if (memcmp(v[i].digest, d, 32) == 0)
      return &v[i];
  return NULL;
}

/* Checks kcd_http_auth(header) (HTTP's Bearer parsing, then the service
 * layer's token check) against the table `v` (as the reference reads it). */
static void check_header(kcd_state *st, const char *header, const ref_tok *v,
                         size_t n) {
  kcd_role role = (kcd_role)77;
  char name[KCD_NAME_MAX];
  memset(name, 'X', sizeof name);
  kcd_authn r = kcd_http_auth(st, header, &role, name);
  FZ_CHECK(memchr(name, '\0', sizeof name), "name not NUL-terminated");
  if (!header) {
    FZ_CHECK(r == KCD_AUTHN_ANON && role == KCD_ROLE_NONE,
             "no header: result %d role %d", (int)r, (int)role);
    return;
  }
  /* "Bearer" (any case), then spaces or tabs, then a non-empty token. */
  const char *tok = NULL;
  if (strncasecmp(header, "Bearer", 6) == 0 &&
      (header[6] == ' ' || header[6] == '\t')) {
    tok = header + 6;
    while (*tok == ' ' || *tok == '\t')
      tok++;
    if (!*tok)
      tok = NULL;
  }
  const ref_tok *want = NULL;
  if (tok) {
    unsigned char d[32];
    SHA256((const unsigned char *)tok, strlen(tok), d);
    want = ref_find(v, n, d);
  }
  if (!want) {
    FZ_CHECK(r == KCD_AUTHN_BAD && role == KCD_ROLE_NONE,
             "header '%s' names no token, but result %d role %d", header,
             (int)r, (int)role);
    FZ_CHECK(strcmp(name, "-") == 0, "name '%s' for a bad token", name);
    return;
  }
  FZ_CHECK(r == KCD_AUTHN_OK, "header '%s' names '%s' but result %d", header,
           want->name, (int)r);
  FZ_CHECK(role == want->role && strcmp(name, want->name) == 0,
           "header names '%s' (role %d), got '%s' (role %d)", want->name,
           (int)want->role, name, (int)role);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *in = (const char *)data;
  const char *nl = memchr(in, '\n', size);
  size_t hl = nl ? (size_t)(nl - in) : size;
  char *header = NULL;
  if (hl) {
    header = malloc(hl + 1);
    FZ_CHECK(header, "malloc");
    memcpy(header, in, hl);
    header[hl] = '\0';
  }
  const char *file = nl ? nl + 1 : in + size;
  size_t flen = size - (size_t)(file - in);
  put(fd_file, file, flen);

  kcd_state *st = calloc(1, sizeof *st);
  FZ_CHECK(st, "calloc");
  kcd_auth *a = &st->auth;
  FZ_CHECK(kcd_auth_init(a) == 0, "kcd_auth_init");
  char err[KC_ERRBUF_SIZE];

  /* Open mode: every request is admin. */
  FZ_CHECK(kcd_auth_load(a, NULL, err) == KC_OK, "load(NULL): %s", err);
  FZ_CHECK(!kcd_auth_enabled(a) && kcd_auth_count(a) == 0, "open mode");
  kcd_role role;
  char name[KCD_NAME_MAX];
  FZ_CHECK(kcd_http_auth(st, header, &role, name) == KCD_AUTHN_OK &&
               role == KCD_ROLE_ADMIN,
           "open mode is not admin");

  ref_tok base;
  FZ_CHECK(kcd_auth_load(a, path_base, err) == KC_OK, "base: %s", err);
  FZ_CHECK(kcd_auth_enabled(a) && kcd_auth_count(a) == 1, "base table");
  memset(&base, 0, sizeof base);
  base.role = KCD_ROLE_READ;
  snprintf(base.name, sizeof base.name, "base");
  memcpy(base.digest, a->tokens[0].digest, 32);

  ref_tok *v = NULL;
  size_t n_ok = 0;
  size_t lines = ref_read(file, flen, &v, &n_ok);

  fz_err_reset(err);
  kc_err e = kcd_auth_load(a, path_file, err);
  /* A good file: every non-comment line well-formed, no token twice, and at
   * least one token (the base table has one: an empty file is refused). */
  int good = lines == n_ok && n_ok > 0 && !ref_dup(v, n_ok);
  if (e) {
    fz_err_ok(err, 0, "kcd_auth_load");
    FZ_CHECK(e == KC_BAD_TOKEN_FILE || e == KC_NOMEM, "code %d", (int)e);
    FZ_CHECK(e == KC_NOMEM || !good, "a good file was refused: %s", err);
    FZ_CHECK(strstr(err, path_file), "message does not name the file: %s", err);
    /* The old table stays. */
    FZ_CHECK(kcd_auth_enabled(a) && kcd_auth_count(a) == 1,
             "a failed load changed the table");
    check_header(st, header, &base, 1);
  } else {
    FZ_CHECK(good,
             "a file the reference refuses was loaded (%zu lines, %zu "
             "well-formed, empty or a token twice?)",
             lines, n_ok);
    FZ_CHECK(kcd_auth_enabled(a), "loaded but not enabled");
    size_t n = kcd_auth_count(a);
    /* Each entry loaded is one well-formed line of the file, in order. */
    FZ_CHECK(n == lines && n == n_ok,
             "loaded %zu entries from a file of %zu non-comment lines (%zu "
             "well-formed)",
             n, lines, n_ok);
    for (size_t i = 0; i < n; i++) {
      const kcd_token *t = &a->tokens[i];
      FZ_CHECK(t->role == v[i].role && strcmp(t->name, v[i].name) == 0 &&
                   memcmp(t->digest, v[i].digest, 32) == 0,
               "entry %zu ('%s', role %d) is not line %zu of the file", i,
               t->name, (int)t->role, i);
      FZ_CHECK(t->role >= KCD_ROLE_READ && t->role <= KCD_ROLE_ADMIN, "role %d",
               (int)t->role);
      for (const char *c = t->name; *c; c++)
        FZ_CHECK(isalnum((unsigned char)*c) || strchr("_.@-", *c),
                 "name '%s' has byte 0x%02x", t->name, (unsigned char)*c);
    }
    check_header(st, header, v, n);
  }
  free(v);
  kcd_auth_destroy(a);
  free(st);
  free(header);
  return 0;
}
