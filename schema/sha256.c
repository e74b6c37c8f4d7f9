/* sha256.c: SHA-256 as lowercase hex over OpenSSL's EVP interface, one-shot,
 * streaming and for whole files. OpenSSL failures become KC_INTERNAL here. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "schema_internal.h"

struct kc_sha256 {
  EVP_MD_CTX *ctx;
  int done; /* EVP forbids updates after final: refuse them ourselves */
};

/* Every request's digest or key is checked: byte arithmetic with no early
 * exit and no table, so that the compiler checks 16 or 32 bytes at once. */
int kc_is_hex64(const char *s) {
  if (!s || strnlen(s, KC_HEX_LEN + 1) != KC_HEX_LEN)
    return 0;
  unsigned char bad = 0;
  for (int i = 0; i < KC_HEX_LEN; i++) {
    unsigned char c = (unsigned char)s[i];
    bad |= (unsigned char)((unsigned char)(c - '0') > 9) &
           (unsigned char)((unsigned char)(c - 'a') > 5);
  }
  return !bad;
}

/* OpenSSL 3 looks EVP_sha256() up in its provider tables at every init
 * (EVP_MD_fetch: half the instructions of a RESP GET's key hash); the
 * implementation is fetched once and kept for the process. */
static EVP_MD *sha256_fetched;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;

static void sha256_fetch(void) {
  sha256_fetched = EVP_MD_fetch(NULL, "SHA256", NULL);
}

static const EVP_MD *sha256_md(void) {
  pthread_once(&sha256_once, sha256_fetch);
  return sha256_fetched ? sha256_fetched : EVP_sha256();
}

kc_err kc_sha256_hex(const void *data, size_t len, char out[KC_HEX_LEN + 1]) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  if ((!data && len) || !out)
    return KC_EINVAL;
  if (!EVP_Digest(data ? data : "", len, md, &mdlen, sha256_md(), NULL))
    return KC_INTERNAL;
  kc_hex_encode(md, KC_HEX_LEN / 2, out);
  return KC_OK;
}

kc_sha256 *kc_sha256_new(void) {
  kc_sha256 *h = calloc(1, sizeof *h);
  if (!h)
    return NULL;
  h->ctx = EVP_MD_CTX_new();
  if (!h->ctx || kc_sha256_reset(h) != KC_OK) {
    kc_sha256_free(h);
    return NULL;
  }
  return h;
}

kc_err kc_sha256_reset(kc_sha256 *h) {
  if (!h)
    return KC_EINVAL;
  h->done = 0;
  return EVP_DigestInit_ex(h->ctx, sha256_md(), NULL) ? KC_OK : KC_INTERNAL;
}

kc_err kc_sha256_update(kc_sha256 *h, const void *data, size_t len) {
  if (!h || h->done || (!data && len))
    return KC_EINVAL;
  if (len == 0)
    return KC_OK;
  return EVP_DigestUpdate(h->ctx, data, len) ? KC_OK : KC_INTERNAL;
}

kc_err kc_sha256_final(kc_sha256 *h, char out[KC_HEX_LEN + 1]) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  if (!h || h->done || !out)
    return KC_EINVAL;
  h->done = 1;
  if (!EVP_DigestFinal_ex(h->ctx, md, &mdlen))
    return KC_INTERNAL;
  kc_hex_encode(md, KC_HEX_LEN / 2, out);
  return KC_OK;
}

void kc_sha256_free(kc_sha256 *h) {
  if (!h)
    return;
  EVP_MD_CTX_free(h->ctx);
  free(h);
}

static kc_err kc_sha256_stream(FILE *f, kc_sha256 *h, uint64_t *total) {
  unsigned char buf[32768]; /* small enough for any thread stack */
  size_t n;
  *total = 0;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
    kc_err e = kc_sha256_update(h, buf, n);
    if (e)
      return e;
    *total += n;
  }
  return ferror(f) ? KC_IO : KC_OK;
}

kc_err kc_sha256_file(const char *path, char out[KC_HEX_LEN + 1],
                      uint64_t *size, char *err) {
  char ebuf[128];
  uint64_t total = 0;
  if (!path || !out)
    return kci_err(err, KC_EINVAL, "sha256_file: NULL argument");
  FILE *f = fopen(path, "rb");
  if (!f)
    return kci_err(err, KC_IO, "%s: %s", path,
                   strerror_r(errno, ebuf, sizeof ebuf));
  kc_sha256 *h = kc_sha256_new();
  kc_err e = h ? kc_sha256_stream(f, h, &total) : KC_NOMEM;
  int saved = errno;
  if (e == KC_OK)
    e = kc_sha256_final(h, out);
  kc_sha256_free(h);
  fclose(f);
  if (e == KC_IO)
    return kci_err(err, KC_IO, "%s: %s", path,
                   strerror_r(saved ? saved : EIO, ebuf, sizeof ebuf));
  if (e)
    return kci_err(err, e, "%s: %s", path, kc_strerror(e));
  if (size)
    *size = total;
  return KC_OK;
}
