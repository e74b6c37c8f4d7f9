/* cache.c: the local content-addressed cache ($KCACHE_DIR): blobs named by
 * their SHA-256, canonical bundle manifests by key. Everything lands by
 * rename, so a crash or a second process never sees half a file, and every
 * read is re-hashed, so a file damaged on disk is noticed and fetched again. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client_internal.h"

void kc_cache_blob_path(const kc_client *c, const char *digest, char *out,
                        size_t out_size) {
  snprintf(out, out_size, "%s/blobs/%.2s/%s", c->cache_dir, digest, digest);
}

static void bundle_path(const kc_client *c, const char *key, char *out,
                        size_t out_size) {
  snprintf(out, out_size, "%s/bundles/%s.json", c->cache_dir, key);
}

int kcc_cache_blob_has(const kc_client *c, const char *digest) {
  char p[PATH_MAX];
  kc_cache_blob_path(c, digest, p, sizeof p);
  return access(p, F_OK) == 0;
}

int kcc_cache_tmp(const kc_client *c, char *path, char *err) {
  snprintf(path, PATH_MAX, "%s/tmp/part-XXXXXX", c->cache_dir);
  int fd = mkstemp(path);
  if (fd < 0)
    kc_errf(err, KC_IO, "create %s: %s", path, strerror(errno));
  return fd;
}

/* Makes blobs/<2 hex>/ on demand: 256 directories made lazily. */
static kc_err blob_dir(const kc_client *c, const char *digest, char *err) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/blobs/%.2s", c->cache_dir, digest);
  if (mkdir(p, 0755) != 0 && errno != EEXIST)
    return kc_errf(err, KC_IO, "mkdir %s: %s", p, strerror(errno));
  return KC_OK;
}

kc_err kc_cache_blob_put(kc_client *c, const void *data, size_t len,
                         char digest_out[KC_HEX_LEN + 1], char *err) {
  char d[KC_HEX_LEN + 1], p[PATH_MAX];
  kc_err e = kc_sha256_hex(data, len, d);
  if (e)
    return kc_errf(err, e, "sha256: %s", kc_strerror(e));
  if (digest_out)
    memcpy(digest_out, d, sizeof d);
  if (kcc_cache_blob_has(c, d))
    return KC_OK; /* content-addressed: same name, same bytes */
  if ((e = blob_dir(c, d, err)))
    return e;
  kc_cache_blob_path(c, d, p, sizeof p);
  return kc_write_file_atomic(p, data, len, err);
}

kc_err kc_cache_blob_put_file(kc_client *c, const char *path,
                              char digest[KC_HEX_LEN + 1], uint64_t *size,
                              char *err) {
  char *data = NULL;
  size_t len = 0;
  kc_err e = kc_read_file(path, &data, &len, err);
  if (e)
    return e;
  e = kc_cache_blob_put(c, data, len, digest, err);
  if (size)
    *size = len;
  free(data);
  return e;
}

kc_err kcc_cache_blob_read(kc_client *c, const char *digest, void **data,
                           size_t *len, char *err) {
  char p[PATH_MAX], d[KC_HEX_LEN + 1];
  char *buf = NULL;
  size_t n = 0;
  kc_cache_blob_path(c, digest, p, sizeof p);
  if (access(p, F_OK) != 0)
    return kc_errf(err, KC_NOT_FOUND, "blob %s is not in the local cache",
                   digest);
  kc_err e = kc_read_file(p, &buf, &n, err);
  if (e)
    return e;
  if ((e = kc_sha256_hex(buf, n, d)))
    goto fail;
  if (strcmp(d, digest) != 0) {
    unlink(p); /* never serve it again; the next warmup refetches */
    e = kc_errf(err, KC_CORRUPT,
                "local blob %s is corrupt (hashes to %.12s...); removed", p,
                d);
    goto fail;
  }
  *data = buf;
  *len = n;
  return KC_OK;
fail:
  free(buf);
  return e;
}

/* Every blob of m present and hashing right; the first bad one is removed. */
static kc_err check_blobs(kc_client *c, const kc_manifest *m, char *err) {
  for (size_t i = 0; i < m->n_files; i++) {
    char p[PATH_MAX], d[KC_HEX_LEN + 1];
    uint64_t size = 0;
    kc_cache_blob_path(c, m->files[i].sha256, p, sizeof p);
    if (access(p, F_OK) != 0)
      return kc_errf(err, KC_NOT_FOUND, "blob %s of %s is not cached",
                     m->files[i].sha256, m->files[i].path);
    kc_err e = kc_sha256_file(p, d, &size, err);
    if (e)
      return e;
    if (strcmp(d, m->files[i].sha256) != 0 || size != m->files[i].size) {
      unlink(p);
      return kc_errf(err, KC_CORRUPT,
                     "local blob of %s is corrupt; removed, will refetch",
                     m->files[i].path);
    }
  }
  return KC_OK;
}

kc_err kc_cache_bundle_get(kc_client *c, const char *key, kc_manifest **out,
                           char *err) {
  char p[PATH_MAX];
  char *json = NULL;
  size_t len = 0;
  kc_manifest *m = NULL;
  *out = NULL;
  if (!kc_is_hex64(key))
    return kc_errf(err, KC_BAD_KEY, "key: must be 64 lowercase hex digits");
  bundle_path(c, key, p, sizeof p);
  if (access(p, F_OK) != 0)
    return kc_errf(err, KC_NOT_FOUND, "bundle %s is not in the local cache",
                   key);
  kc_err e = kc_read_file(p, &json, &len, err);
  if (!e && (e = kc_manifest_parse(json, len, &m, err)) != KC_OK)
    unlink(p); /* a damaged manifest: drop it and fetch again */
  free(json);
  if (!e && strcmp(m->key, key) != 0) {
    unlink(p);
    e = kc_errf(err, KC_CORRUPT, "local bundle %s holds key %s", key, m->key);
  }
  if (!e)
    e = check_blobs(c, m, err);
  if (e) {
    kc_manifest_free(m);
    return e == KC_NOT_FOUND || e == KC_IO ? e : KC_CORRUPT;
  }
  *out = m;
  return KC_OK;
}

kc_err kc_cache_bundle_put(kc_client *c, const kc_manifest *m, char *err) {
  char p[PATH_MAX];
  char *json = NULL;
  kc_err e = kc_manifest_to_json(m, &json, err);
  if (e)
    return e;
  bundle_path(c, m->key, p, sizeof p);
  e = kc_write_file_atomic(p, json, strlen(json), err);
  free(json);
  return e;
}
