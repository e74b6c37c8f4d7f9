/* cache.c: the local content-addressed cache ($KCACHE_DIR): blobs named by
 * their SHA-256, canonical bundle manifests by key. Everything lands by
 * rename, so a crash or a second process never sees half a file, and every
 * read is re-hashed, so a file damaged on disk is noticed and fetched again. */
#include <dirent.h>
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

int kcc_cache_blob_ok(const kc_client *c, const char *digest, uint64_t size) {
  char p[PATH_MAX];
  struct stat st;
  kc_cache_blob_path(c, digest, p, sizeof p);
  return lstat(p, &st) == 0 && S_ISREG(st.st_mode) &&
         (uint64_t)st.st_size == size;
}

/* Opens a cached blob for reading, only when it is a regular file of the
 * size its manifest declares: a symlink (to /dev/zero, say), a FIFO or a
 * 1 TiB sparse file in its place is refused before a byte is read.
 * O_NONBLOCK: opening a FIFO must not wait for a writer. Anything wrong is
 * KC_CORRUPT and the name is removed, so that it is fetched again. */
static kc_err open_blob(const char *p, const char *digest, uint64_t size,
                        int *out, char *err) {
  struct stat st;
  int fd = open(p, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  *out = -1;
  if (fd < 0 && errno == ENOENT)
    return kc_errf(err, KC_NOT_FOUND, "blob %s is not in the local cache",
                   digest);
  if (fd < 0 && errno != ELOOP) /* EACCES, EMFILE: not the blob's fault */
    return kc_errf(err, KC_IO, "open %s: %s", p, strerror(errno));
  const char *why = fd < 0                 ? "a symlink"
                    : fstat(fd, &st) != 0  ? strerror(errno)
                    : !S_ISREG(st.st_mode) ? "not a regular file"
                    : (uint64_t)st.st_size != size
                        ? "not the size its manifest declares"
                        : NULL;
  if (!why) {
    *out = fd;
    return KC_OK;
  }
  if (fd >= 0)
    close(fd);
  unlink(p);
  return kc_errf(err, KC_CORRUPT, "local blob %s is %s; removed, will refetch",
                 p, why);
}

/* Hashes `size` bytes of fd (into buf when not NULL), giving up when c's
 * deadline passes: a large cached blob must not hold a warmup past it. */
static kc_err hash_fd(kc_client *c, int fd, uint64_t size, char *buf,
                      char d[KC_HEX_LEN + 1], char *err) {
  enum { CHUNK = 1 << 20 };
  char *tmp = buf ? NULL : malloc(CHUNK);
  kc_sha256 *h = kc_sha256_new();
  kc_err e =
      h && (buf || tmp) ? KC_OK : kc_errf(err, KC_NOMEM, "out of memory");
  for (uint64_t done = 0; !e && done < size;) {
    if (c->deadline_ms && kc_clock_mono_ms() >= c->deadline_ms) {
      e = kc_errf(err, KC_DEADLINE,
                  "the deadline passed while checking the local cache");
      break;
    }
    size_t want = size - done < CHUNK ? (size_t)(size - done) : CHUNK;
    char *at = buf ? buf + done : tmp;
    ssize_t n = read(fd, at, want);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      e = kc_errf(err, KC_IO, "read: %s", n ? strerror(errno) : "short file");
    else
      e = kc_sha256_update(h, at, (size_t)n);
    done += n > 0 ? (uint64_t)n : 0;
  }
  if (!e)
    e = kc_sha256_final(h, d);
  kc_sha256_free(h);
  free(tmp);
  return e;
}

/* Checks (and with data, loads) one cached blob against its name and size. */
static kc_err blob_check(kc_client *c, const char *digest, uint64_t size,
                         void **data, char *err) {
  char p[PATH_MAX], d[KC_HEX_LEN + 1];
  kc_cache_blob_path(c, digest, p, sizeof p);
  int fd;
  kc_err e = open_blob(p, digest, size, &fd, err);
  if (e)
    return e;
  char *buf = NULL;
  if (data && !(buf = malloc(size + 1)))
    e = kc_errf(err, KC_NOMEM, "out of memory");
  if (!e)
    e = hash_fd(c, fd, size, buf, d, err);
  close(fd);
  if (!e && strcmp(d, digest) != 0) {
    unlink(p); /* never serve it again; the next warmup refetches */
    e = kc_errf(err, KC_CORRUPT,
                "local blob %s is corrupt (hashes to %.12s...); removed", p, d);
  }
  if (e) {
    free(buf);
    return e;
  }
  if (data) {
    buf[size] = '\0';
    *data = buf;
  }
  return KC_OK;
}

/* Read-only from birth (0444 less the umask): a cached file is never
 * written again once renamed into place, and `--out` links blobs into the
 * service's directory, where a read-only inode keeps a service (not run as
 * root) from writing through the link into the cache and every other
 * directory linked to it. The name is unique by pid and a counter (O_EXCL
 * catches a leftover of an earlier process with the same pid). */
int kcc_cache_tmp(const kc_client *c, char *path, char *err) {
  static unsigned long seq;
  for (int tries = 0; tries < 100; tries++) {
    unsigned long n = __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED);
    snprintf(path, PATH_MAX, "%s/tmp/part-%ld-%lu", c->cache_dir,
             (long)getpid(), n);
    int fd =
        open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444);
    if (fd >= 0 || errno != EEXIST) {
      if (fd < 0)
        kc_errf(err, KC_IO, "create %s: %s", path, strerror(errno));
      return fd;
    }
  }
  kc_errf(err, KC_IO, "create %s: %s", path, strerror(EEXIST));
  return -1;
}

/* The fan-out directory blobs/<2 hex>/ of a digest, 0..255. */
static int fan_of(const char *digest) {
  unsigned char b;
  return kc_hex_decode(digest, 1, &b) == 0 ? b : 0;
}

int kcc_cache_blob_maybe(kc_client *c, const char *digest, uint64_t size) {
  int k = fan_of(digest);
  if (!(c->blob_dir[k] & KCC_DIR_LOOKED)) { /* one look per directory */
    char p[PATH_MAX];
    struct stat st;
    snprintf(p, sizeof p, "%s/blobs/%.2s", c->cache_dir, digest);
    c->blob_dir[k] |= KCC_DIR_LOOKED;
    if (lstat(p, &st) == 0)
      c->blob_dir[k] |= KCC_DIR_MADE;
    else
      c->blob_dir[k] = KCC_DIR_LOOKED | KCC_DIR_ABSENT;
  }
  return !(c->blob_dir[k] & KCC_DIR_ABSENT) &&
         kcc_cache_blob_ok(c, digest, size);
}

void kcc_cache_forget_dirs(kc_client *c) {
  for (int k = 0; k < 256; k++)
    c->blob_dir[k] &= KCC_DIR_MADE;
}

kc_err kcc_cache_write_tmp(const kc_client *c, const void *data, size_t len,
                           char tmp[PATH_MAX], char *err) {
  int fd = kcc_cache_tmp(c, tmp, err);
  if (fd < 0)
    return KC_IO;
  errno = 0;
  int saved = kcc_write_all(fd, data, len) ? (errno ? errno : ENOSPC) : 0;
  if (close(fd) != 0 && !saved)
    saved = errno;
  if (!saved)
    return KC_OK;
  unlink(tmp);
  return kc_errf(err, KC_IO, "write %s: %s", tmp, strerror(saved));
}

/* Made once per client: a directory that vanished meanwhile (another
 * process cleaned the cache) is made again when the rename says so. */
kc_err kcc_cache_blob_publish(kc_client *c, const char *tmp, const char *digest,
                              char *err) {
  char dst[PATH_MAX];
  int k = fan_of(digest);
  kc_cache_blob_path(c, digest, dst, sizeof dst);
  for (int tries = 0; tries < 2; tries++) {
    /* atomic: a batch's writer thread publishes beside the receiving one
     * (fetch_batch.c); a lost bit would only cost a mkdir */
    if (!(__atomic_load_n(&c->blob_dir[k], __ATOMIC_RELAXED) & KCC_DIR_MADE)) {
      char dir[PATH_MAX];
      snprintf(dir, sizeof dir, "%s/blobs/%.2s", c->cache_dir, digest);
      if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        break;
      __atomic_fetch_or(&c->blob_dir[k], KCC_DIR_MADE, __ATOMIC_RELAXED);
    }
    if (rename(tmp, dst) == 0)
      return KC_OK;
    if (errno != ENOENT)
      break;
    __atomic_fetch_and(&c->blob_dir[k], (unsigned char)~KCC_DIR_MADE,
                       __ATOMIC_RELAXED); /* gone: make it again */
  }
  int saved = errno;
  unlink(tmp);
  return kc_errf(err, KC_IO, "rename into %s: %s", dst, strerror(saved));
}

kc_err kcc_cache_blob_write(kc_client *c, const void *data, size_t len,
                            const char *digest, char *err) {
  char tmp[PATH_MAX];
  kc_err e = kcc_cache_write_tmp(c, data, len, tmp, err);
  return e ? e : kcc_cache_blob_publish(c, tmp, digest, err);
}

kc_err kc_cache_blob_put(kc_client *c, const void *data, size_t len,
                         char digest_out[KC_HEX_LEN + 1], char *err) {
  char d[KC_HEX_LEN + 1];
  kc_err e = kc_sha256_hex(data, len, d);
  if (e)
    return kc_errf(err, e, "sha256: %s", kc_strerror(e));
  if (digest_out)
    memcpy(digest_out, d, sizeof d);
  if (kcc_cache_blob_ok(c, d, len))
    return KC_OK; /* content-addressed: same name, same bytes */
  return kcc_cache_blob_write(c, data, len, d, err);
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

kc_err kcc_cache_blob_read(kc_client *c, const char *digest, uint64_t size,
                           void **data, size_t *len, char *err) {
  if (size >= SIZE_MAX)
    return kc_errf(err, KC_NOMEM, "blob %s: too large to load", digest);
  kc_err e = blob_check(c, digest, size, data, err);
  if (!e)
    *len = (size_t)size;
  return e;
}

kc_err kcc_cache_blob_verify(kc_client *c, const char *digest, uint64_t size,
                             char *err) {
  return blob_check(c, digest, size, NULL, err);
}

/* Every blob of m present and hashing right; the first bad one is removed. */
static kc_err check_blobs(kc_client *c, const kc_manifest *m, char *err) {
  for (size_t i = 0; i < m->n_files; i++) {
    char e2[KC_ERRBUF_SIZE] = "";
    kc_err e = blob_check(c, m->files[i].sha256, m->files[i].size, NULL, e2);
    if (e == KC_NOT_FOUND)
      return kc_errf(err, e, "blob %s of %s is not cached", m->files[i].sha256,
                     m->files[i].path);
    if (e)
      return kc_errf(err, e, "%s: %s", m->files[i].path, e2);
  }
  return KC_OK;
}

/* A cached manifest's text: a regular file (not a link, not a FIFO) of at
 * most KCC_MANIFEST_MAX bytes, else removed (KC_CORRUPT). */
#define KCC_MANIFEST_MAX (64u << 20)
static kc_err read_manifest(const char *p, char **json, size_t *len,
                            char *err) {
  struct stat st;
  int fd = open(p, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT)
    return KC_NOT_FOUND;
  const char *why = fd < 0 ? (errno == ELOOP ? "a symlink" : strerror(errno))
                    : fstat(fd, &st) != 0           ? strerror(errno)
                    : !S_ISREG(st.st_mode)          ? "not a regular file"
                    : st.st_size > KCC_MANIFEST_MAX ? "too large"
                                                    : NULL;
  char *buf = why ? NULL : malloc((size_t)st.st_size + 1);
  size_t got = 0;
  while (buf && got < (size_t)st.st_size) {
    ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    got += (size_t)n;
  }
  if (fd >= 0)
    close(fd);
  if (!why && (!buf || got != (size_t)st.st_size))
    why = buf ? "short" : "too large to load";
  if (why) {
    free(buf);
    unlink(p);
    return kc_errf(err, KC_CORRUPT, "local manifest %s is %s; removed", p, why);
  }
  buf[got] = '\0';
  *json = buf;
  *len = got;
  return KC_OK;
}

int kcc_cache_has_bundles(const kc_client *c) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/bundles", c->cache_dir);
  DIR *d = opendir(p);
  if (!d)
    return errno != ENOENT; /* cannot tell: look for each */
  const struct dirent *e;
  int any = 0;
  while (!any && (e = readdir(d)))
    any = strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  closedir(d);
  return any;
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
  kc_err e = read_manifest(p, &json, &len, err);
  if (e == KC_NOT_FOUND)
    return kc_errf(err, e, "bundle %s is not in the local cache", key);
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
    return e == KC_NOT_FOUND || e == KC_IO || e == KC_DEADLINE ? e : KC_CORRUPT;
  }
  *out = m;
  return KC_OK;
}

/* json, m's canonical text, written once to tmp/ and renamed into place:
 * no other system call. */
static kc_err bundle_write(kc_client *c, const kc_manifest *m, char *json,
                           char *err) {
  char p[PATH_MAX], tmp[PATH_MAX];
  bundle_path(c, m->key, p, sizeof p);
  kc_err e = kcc_cache_write_tmp(c, json, strlen(json), tmp, err);
  free(json);
  if (!e && rename(tmp, p) != 0) {
    int saved = errno;
    unlink(tmp);
    e = kc_errf(err, KC_IO, "rename into %s: %s", p, strerror(saved));
  }
  return e;
}

kc_err kc_cache_bundle_put(kc_client *c, const kc_manifest *m, char *err) {
  char *json = NULL;
  kc_err e = kc_manifest_to_json(m, &json, err);
  return e ? e : bundle_write(c, m, json, err);
}

/* Many manifests at once (a warm of many bundles): each is its own file,
 * so two threads write them, one half each; a warm of 1024 bundles spent
 * about an eighth of its CPU here, on one core of two. */
typedef struct puts_job {
  kc_client *c;
  const kc_manifest *const *ms;
  kc_err *res;
} puts_job;

/* The manifests were validated and their keys checked when they were
 * parsed (kcc_lookup_checked): not again here. */
static void puts_run(void *arg, size_t from, size_t to) {
  puts_job *p = arg;
  for (size_t k = from; k < to; k++) {
    char *json = NULL;
    p->res[k] = kc_manifest_to_json_valid(p->ms[k], &json, NULL);
    if (!p->res[k])
      p->res[k] = bundle_write(p->c, p->ms[k], json, NULL);
  }
}

void kcc_cache_bundles_put(kc_client *c, const kc_manifest *const *ms, size_t n,
                           kc_err *res) {
  puts_job j = {c, ms, res};
  kcc_halves(n, n >= 32, puts_run, &j);
}
