/* auth.c: bearer tokens with roles: the token file, constant-time checks,
 * reload on SIGHUP, and the `kcached token ROLE NAME` subcommand. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "kcd.h"

#define TOKEN_BYTES 32 /* 256 random bits */
#define TOKEN_PREFIX "kc_"

static const char *const role_names[] = {"none", "read", "write", "admin"};

const char *kcd_role_name(kcd_role r) {
  return (unsigned)r <= KCD_ROLE_ADMIN ? role_names[r] : "none";
}

int kcd_role_parse(const char *s, kcd_role *out) {
  for (int i = 0; i <= KCD_ROLE_ADMIN; i++) {
    if (strcmp(s, role_names[i]) == 0) {
      *out = (kcd_role)i;
      return 0;
    }
  }
  return -1;
}

int kcd_auth_init(kcd_auth *a) {
  memset(a, 0, sizeof *a);
  return pthread_rwlock_init(&a->lock, NULL) ? -1 : 0;
}

void kcd_auth_destroy(kcd_auth *a) {
  free(a->tokens);
  pthread_rwlock_destroy(&a->lock);
}

static int parse_digest(const char *hex, unsigned char out[32]) {
  if (strlen(hex) != 64)
    return -1;
  return kc_hex_decode(hex, 32, out);
}

/* Names go into logs and metrics: keep them to a plain, printable set. */
static int name_ok(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n >= KCD_NAME_MAX)
    return 0;
  for (; *s; s++)
    if (!isalnum((unsigned char)*s) && !strchr("_.@-", *s))
      return 0;
  return 1;
}

/* One non-comment line "role name sha256hex". */
static kc_err parse_line(char *line, kcd_token *t, const char *path,
                         unsigned lineno, char *err) {
  char *save = NULL;
  char *role = strtok_r(line, " \t", &save);
  char *name = strtok_r(NULL, " \t", &save);
  char *hex = strtok_r(NULL, " \t", &save);
  char *extra = strtok_r(NULL, " \t", &save);
  if (!role || !name || !hex || extra)
    return kc_errf(err, KC_BAD_TOKEN_FILE,
                   "%s:%u: expected 'role name sha256hex'", path, lineno);
  if (kcd_role_parse(role, &t->role) || t->role == KCD_ROLE_NONE)
    return kc_errf(err, KC_BAD_TOKEN_FILE,
                   "%s:%u: role must be read, write or admin", path, lineno);
  if (!name_ok(name))
    return kc_errf(err, KC_BAD_TOKEN_FILE,
                   "%s:%u: name must be 1-63 of [A-Za-z0-9_.@-]", path, lineno);
  if (parse_digest(hex, t->digest))
    return kc_errf(err, KC_BAD_TOKEN_FILE,
                   "%s:%u: third field must be the 64-hex SHA-256 of the token",
                   path, lineno);
  snprintf(t->name, sizeof t->name, "%s", name);
  return KC_OK;
}

static char *trim(char *s) {
  while (isspace((unsigned char)*s))
    s++;
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1]))
    s[--n] = '\0';
  return s;
}

/* The tokens read so far, with the line each came from. */
typedef struct tok_vec {
  kcd_token *v;
  unsigned *line;
  size_t n, cap;
} tok_vec;

static kc_err tok_grow(tok_vec *t, const char *path, char *err) {
  if (t->n < t->cap)
    return KC_OK;
  size_t cap = t->cap ? t->cap * 2 : 16;
  kcd_token *nv = realloc(t->v, cap * sizeof *nv);
  if (nv)
    t->v = nv;
  unsigned *nl = nv ? realloc(t->line, cap * sizeof *nl) : NULL;
  if (!nl)
    return kc_errf(err, KC_NOMEM, "%s: out of memory", path);
  t->line = nl;
  t->cap = cap;
  return KC_OK;
}

/* One token on two lines would let the first line's role (and name) win
 * without a word: an operator who added "admin" for a token already listed
 * as "read" would see it keep read. Refused, naming both lines. Token files
 * are short; a linear scan per line is fine. */
static kc_err check_dup(const tok_vec *t, const char *path, unsigned lineno,
                        char *err) {
  const kcd_token *last = &t->v[t->n];
  for (size_t i = 0; i < t->n; i++)
    if (memcmp(t->v[i].digest, last->digest, 32) == 0)
      return kc_errf(err, KC_BAD_TOKEN_FILE,
                     "%s:%u: the same token hash as line %u (%s %s); each "
                     "token may appear once",
                     path, lineno, t->line[i], kcd_role_name(t->v[i].role),
                     t->v[i].name);
  return KC_OK;
}

static kc_err read_tokens(FILE *f, const char *path, kcd_token **out,
                          size_t *n_out, char *err) {
  /* getline, not a fixed buffer: a long line read in pieces would let the
   * tail of a comment count as a token line (found by tests/fuzz). */
  char *line = NULL;
  size_t line_cap = 0;
  tok_vec t = {0};
  unsigned lineno = 0;
  kc_err e = KC_OK;
  while (!e && getline(&line, &line_cap, f) >= 0) {
    lineno++;
    char *s = trim(line);
    if (*s == '\0' || *s == '#')
      continue;
    if ((e = tok_grow(&t, path, err)))
      break;
    e = parse_line(s, &t.v[t.n], path, lineno, err);
    if (!e)
      e = check_dup(&t, path, lineno, err);
    if (!e)
      t.line[t.n++] = lineno;
  }
  free(line);
  free(t.line);
  kcd_token *v = t.v;
  size_t n = t.n;
  if (e) {
    free(v);
    return e;
  }
  *out = v;
  *n_out = n;
  return KC_OK;
}

kc_err kcd_auth_load(kcd_auth *a, const char *path, char *err) {
  kcd_token *v = NULL;
  size_t n = 0;
  if (path) {
    FILE *f = fopen(path, "re");
    if (!f)
      return kc_errf(err, KC_BAD_TOKEN_FILE, "%s: %s", path, strerror(errno));
    kc_err e = read_tokens(f, path, &v, &n, err);
    fclose(f);
    if (e)
      return e;
  }
  pthread_rwlock_wrlock(&a->lock);
  /* A file with no token where the table has some is most likely a
   * rewrite caught half-way (truncated, not yet written): swapping it in
   * would answer every client 401 until the next reload. */
  if (path && n == 0 && a->enabled && a->n > 0) {
    pthread_rwlock_unlock(&a->lock);
    return kc_errf(err, KC_BAD_TOKEN_FILE,
                   "%s: no token in the file (half-written?); to revoke "
                   "every token, restart kcached with it",
                   path);
  }
  kcd_token *old = a->tokens;
  a->tokens = v;
  a->n = n;
  a->enabled = path != NULL;
  atomic_fetch_add(&a->gen, 1);
  pthread_rwlock_unlock(&a->lock);
  free(old);
  return KC_OK;
}

int kcd_auth_enabled(kcd_auth *a) {
  pthread_rwlock_rdlock(&a->lock);
  int on = a->enabled;
  pthread_rwlock_unlock(&a->lock);
  return on;
}

size_t kcd_auth_count(kcd_auth *a) {
  pthread_rwlock_rdlock(&a->lock);
  size_t n = a->n;
  pthread_rwlock_unlock(&a->lock);
  return n;
}

/* Compares against every entry, whatever matches, so that the time taken
 * does not tell which entry (or how much of one) a guess came close to. */
static const kcd_token *find_token(const kcd_auth *a,
                                   const unsigned char digest[32]) {
  const kcd_token *hit = NULL;
  for (size_t i = 0; i < a->n; i++) {
    int same = CRYPTO_memcmp(a->tokens[i].digest, digest, 32) == 0;
    if (same && !hit)
      hit = &a->tokens[i];
  }
  return hit;
}

kcd_authn kcd_auth_check_token(kcd_auth *a, const char *want_name,
                               const void *token, size_t len, kcd_role *role,
                               char name[KCD_NAME_MAX]) {
  unsigned char d[32];
  unsigned int dlen = 0;
  *role = KCD_ROLE_NONE;
  memcpy(name, "-", 2); /* (no printf: every request comes here) */
  pthread_rwlock_rdlock(&a->lock);
  const kcd_token *t = NULL;
  int on = a->enabled;
  /* An empty token names none, even were its hash in the file. */
  if (on && token && len &&
      EVP_Digest(token, len, d, &dlen, EVP_sha256(), NULL))
    t = find_token(a, d);
  if (t && want_name && strcmp(t->name, want_name) != 0)
    t = NULL;     /* names are not secret: a plain compare */
  if (t || !on) { /* tokens off: admin (loopback only, enforced at start) */
    *role = t ? t->role : KCD_ROLE_ADMIN;
    if (t) /* t->name is NUL-ended within KCD_NAME_MAX (parse_line) */
      memcpy(name, t->name, strlen(t->name) + 1);
  }
  pthread_rwlock_unlock(&a->lock);
  if (t || !on)
    return KCD_AUTHN_OK;
  return token ? KCD_AUTHN_BAD : KCD_AUTHN_ANON;
}

uint64_t kcd_auth_gen(kcd_auth *a) { return atomic_load(&a->gen); }

void kcd_auth_digest(const void *token, size_t len, unsigned char out[32]) {
  unsigned int dlen = 0;
  if (!EVP_Digest(token, len, out, &dlen, EVP_sha256(), NULL))
    memset(out, 0, 32); /* names no token: the table holds no zero hash */
}

int kcd_auth_holds(kcd_auth *a, const unsigned char digest[32],
                   const char *name, kcd_role role) {
  pthread_rwlock_rdlock(&a->lock);
  const kcd_token *t = a->enabled ? find_token(a, digest) : NULL;
  int same = t && t->role == role && strcmp(t->name, name) == 0;
  pthread_rwlock_unlock(&a->lock);
  return same;
}

/* ---- kcached token ROLE NAME ---- */

int kcd_token_command(int argc, char **argv) {
  kcd_role role;
  if (argc != 3 || kcd_role_parse(argv[1], &role) || role == KCD_ROLE_NONE) {
    fprintf(stderr, "usage: kcached token read|write|admin NAME\n");
    return 2;
  }
  if (!name_ok(argv[2])) {
    fprintf(stderr, "kcached token: NAME must be 1-63 of [A-Za-z0-9_.@-]\n");
    return 2;
  }
  unsigned char raw[TOKEN_BYTES], d[32];
  char token[sizeof TOKEN_PREFIX + 2 * TOKEN_BYTES], dhex[65];
  unsigned int dlen = 0;
  if (RAND_bytes(raw, sizeof raw) != 1) {
    fprintf(stderr, "kcached token: no randomness available\n");
    return 1;
  }
  memcpy(token, TOKEN_PREFIX, sizeof TOKEN_PREFIX - 1);
  kc_hex_encode(raw, sizeof raw, token + sizeof TOKEN_PREFIX - 1);
  EVP_Digest(token, strlen(token), d, &dlen, EVP_sha256(), NULL);
  kc_hex_encode(d, sizeof d, dhex);
  printf("%s\n%s %s %s\n", token, kcd_role_name(role), argv[2], dhex);
  fprintf(stderr,
          "# line 1: the token (give it to the client as KCACHE_TOKEN; it is "
          "shown only now)\n# line 2: append it to the token file, then "
          "SIGHUP kcached\n");
  OPENSSL_cleanse(token, sizeof token);
  OPENSSL_cleanse(raw, sizeof raw);
  return 0;
}
