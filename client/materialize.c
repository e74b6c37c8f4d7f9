/* materialize.c: a bundle's files under a directory (`kcache warm --out`,
 * `kcache pull DIR`), never outside it, each file whole or not at all.
 *
 * A file is a hard link to its blob in the local cache when the two are on
 * one file system: no byte is read or written again, and a name appears
 * whole (link is atomic). Across file systems (or where links are refused)
 * the blob is copied with copy_file_range (a reflink where the file system
 * has them) into a temporary name beside the file, then renamed over it.
 * Cached blobs are read-only (cache.c), so linked files are too: a write
 * through a link needs a chmod first (by the cache's owner) or root. What
 * such a writer changes is caught by the cache's re-hash on its next use
 * and fetched again; a file already linked under another --out keeps it
 * until its warm runs again; docs/DESIGN.md, "Client warmup", step 5. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client_internal.h"

/* Opens the directory that will hold rel's last segment, making the ones
 * before it. Each step is openat(O_NOFOLLOW) from the previous one, so a
 * symlink planted inside the target cannot lead a write outside it. */
static int open_parent(int root, const char *rel, const char **leaf,
                       kc_err *why, char *err) {
  char seg[KC_PATH_MAX + 1];
  const char *p = rel, *slash = strchr(p, '/');
  if (!slash) { /* the common case: a file at the bundle's top */
    *leaf = rel;
    return root;
  }
  *why = KC_IO;
  int fd = dup(root);
  if (fd < 0)
    kc_errf(err, KC_IO, "%s: %s", rel, strerror(errno));
  for (; fd >= 0 && slash; slash = strchr(p, '/')) {
    size_t n = (size_t)(slash - p);
    memcpy(seg, p, n);
    seg[n] = '\0';
    if (mkdirat(fd, seg, 0755) != 0 && errno != EEXIST) {
      kc_errf(err, KC_IO, "mkdir %s: %s", seg, strerror(errno));
      close(fd);
      return -1;
    }
    int next = openat(fd, seg, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) {
      *why = errno == ELOOP || errno == ENOTDIR ? KC_UNSAFE_PATH : KC_IO;
      kc_errf(err, *why, "%s: %s", rel,
              errno == ELOOP ? "a symlink is in the way" : strerror(errno));
    }
    close(fd);
    fd = next;
    p = slash + 1;
  }
  *leaf = p;
  return fd;
}

/* A temporary name beside leaf, unique in this process (threads share
 * it) and across processes (the pid). */
static void tmp_name(char *out, size_t size, const char *leaf) {
  static unsigned long seq;
  unsigned long n = __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED);
  snprintf(out, size, ".%.200s.kc-%ld-%lu", leaf, (long)getpid(), n);
}

/* Copies len bytes of src to dst: copy_file_range (in the kernel, a
 * reflink where it can), else read and write. 0, or -1 with errno. */
static int copy_bytes(int src, int dst, uint64_t len) {
  off_t in = 0, out = 0;
  int plain = 0;
  while ((uint64_t)in < len) {
    size_t want = len - (uint64_t)in > (1u << 30)
                      ? (1u << 30)
                      : (size_t)(len - (uint64_t)in);
    ssize_t n = -1;
    if (!plain) {
      n = copy_file_range(src, &in, dst, &out, want, 0);
      if (n < 0 && (errno == EXDEV || errno == ENOSYS || errno == EINVAL ||
                    errno == EOPNOTSUPP || errno == EPERM)) {
        plain = 1; /* an older kernel, or file systems it cannot join */
        continue;
      }
    } else { /* at the same offsets: copy_file_range moved none */
      char buf[64 << 10];
      n = pread(src, buf, want < sizeof buf ? want : sizeof buf, in);
      for (ssize_t done = 0; n > 0 && done < n;) {
        ssize_t w = pwrite(dst, buf + done, (size_t)(n - done), out + done);
        if (w < 0 && errno == EINTR)
          continue;
        if (w <= 0)
          return -1;
        done += w;
      }
      if (n > 0) {
        in += n;
        out += n;
      }
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      if (n == 0)
        errno = EIO; /* the blob is shorter than it was a moment ago */
      return -1;
    }
  }
  return 0;
}

/* The blob at path (a regular file of st's size) copied to a temporary
 * name in dfd, renamed over leaf. */
static kc_err copy_in(int dfd, const char *leaf, const char *path,
                      const struct stat *st, char *err) {
  char tmp[KC_PATH_MAX + 64];
  int src = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (src < 0)
    return kc_errf(err, KC_IO, "open %s: %s", path, strerror(errno));
  tmp_name(tmp, sizeof tmp, leaf);
  int dst = openat(dfd, tmp,
                   O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444);
  if (dst < 0) {
    int saved = errno;
    close(src);
    return kc_errf(err, KC_IO, "create %s: %s", tmp, strerror(saved));
  }
  int bad = copy_bytes(src, dst, (uint64_t)st->st_size) != 0;
  int saved = errno;
  close(src);
  if (close(dst) != 0 && !bad) {
    bad = 1;
    saved = errno;
  }
  /* renameat replaces a symlink named leaf itself, never its target. */
  if (!bad && renameat(dfd, tmp, dfd, leaf) != 0) {
    bad = 1;
    saved = errno;
  }
  if (bad) {
    unlinkat(dfd, tmp, 0);
    return kc_errf(err, KC_IO, "write %s: %s", leaf, strerror(saved));
  }
  return KC_OK;
}

/* leaf becomes the blob at path: a hard link (leaf missing: one linkat,
 * atomic; present: a link under a temporary name renamed over it), or a
 * copy where a link cannot be made. */
static kc_err place(int dfd, const char *leaf, const char *path,
                    const struct stat *st, char *err) {
  char tmp[KC_PATH_MAX + 64];
  struct stat t;
  if (linkat(AT_FDCWD, path, dfd, leaf, 0) == 0)
    return KC_OK;
  if (errno == EEXIST) {
    if (fstatat(dfd, leaf, &t, AT_SYMLINK_NOFOLLOW) == 0 &&
        t.st_dev == st->st_dev && t.st_ino == st->st_ino)
      return KC_OK; /* that very file already (a second warm) */
    tmp_name(tmp, sizeof tmp, leaf);
    if (linkat(AT_FDCWD, path, dfd, tmp, 0) == 0) {
      if (renameat(dfd, tmp, dfd, leaf) == 0)
        return KC_OK;
      int saved = errno;
      unlinkat(dfd, tmp, 0);
      return kc_errf(err, KC_IO, "rename %s: %s", leaf, strerror(saved));
    }
  }
  if (errno == EXDEV || errno == EPERM || errno == EMLINK ||
      errno == EOPNOTSUPP || errno == EACCES)
    return copy_in(dfd, leaf, path, st, err); /* no link: a copy */
  return kc_errf(err, KC_IO, "link %s: %s", leaf, strerror(errno));
}

/* The blob of f as it is cached: a regular file of its size (and with the
 * mode wanted: a blob cached before blobs were read-only is made so). */
static kc_err cached_blob(const kc_client *c, const kc_file *f, char *path,
                          struct stat *st, char *err) {
  kc_cache_blob_path(c, f->sha256, path, PATH_MAX);
  if (lstat(path, st) != 0)
    return kc_errf(err, errno == ENOENT ? KC_NOT_FOUND : KC_IO,
                   "blob %s of %s: %s", f->sha256, f->path, strerror(errno));
  if (!S_ISREG(st->st_mode) || (uint64_t)st->st_size != f->size)
    return kc_errf(err, KC_CORRUPT,
                   "local blob %s is not a regular file of %llu bytes", path,
                   (unsigned long long)f->size);
  mode_t want = 0444 & ~c->umask;
  if ((st->st_mode & 07777) != want && chmod(path, want) != 0)
    return kc_errf(err, KC_IO, "chmod %s: %s", path, strerror(errno));
  return KC_OK;
}

static kc_err materialize_file(kc_client *c, int root, const kc_file *f,
                               int verified, char *err) {
  const char *leaf;
  char path[PATH_MAX];
  struct stat st;
  kc_err e = kc_path_validate(f->path, "path", err);
  if (!e && !verified) /* re-hashed here: nothing unverified is placed */
    e = kcc_cache_blob_verify(c, f->sha256, f->size, err);
  if (!e)
    e = cached_blob(c, f, path, &st, err);
  if (e)
    return e;
  kc_err why = KC_OK;
  int dfd = open_parent(root, f->path, &leaf, &why, err);
  e = dfd < 0 ? why : place(dfd, leaf, path, &st, err);
  if (dfd >= 0 && dfd != root)
    close(dfd);
  return e;
}

kc_err kcc_materialize(kc_client *c, const kc_manifest *m, const char *dir,
                       int verified, int *made, char *err) {
  kc_err e = KC_OK;
  /* one mkdir when the parent is there (a warm's second bundle on); none
   * when this run made it already (kc_warm, during the fetch) */
  if (!made || !*made) {
    if (mkdir(dir, 0755) == 0) {
      if (made)
        *made = 1;
    } else if (errno == ENOENT) { /* parents missing: this run makes it */
      e = kcc_mkdirs(dir, err);
      if (!e && made)
        *made = 1;
    } else if (errno != EEXIST) {
      e = kcc_mkdirs(dir, err);
    }
  }
  if (e)
    return e;
  int root = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (root < 0)
    return kc_errf(err, KC_IO, "open %s: %s", dir, strerror(errno));
  for (size_t i = 0; !e && i < m->n_files; i++)
    e = materialize_file(c, root, &m->files[i], verified, err);
  close(root);
  return e;
}

kc_err kc_materialize(kc_client *c, const kc_manifest *m, const char *dir,
                      char *err) {
  return kcc_materialize(c, m, dir, 0, NULL, err);
}
