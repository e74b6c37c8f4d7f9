/* files.c: small helpers of libkcache: mkdir -p, atomic writes, tree
 * removal, bucket labels, a loop split over two threads. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client_internal.h"

char *kcc_strdup0(const char *s) { return s ? strdup(s) : NULL; }

typedef struct half_part {
  void (*fn)(void *, size_t, size_t);
  void *arg;
  size_t from, to;
} half_part;

static void *half_run(void *arg) {
  half_part *p = arg;
  p->fn(p->arg, p->from, p->to);
  return NULL;
}

void kcc_halves(size_t n, int two, void (*fn)(void *, size_t, size_t),
                void *arg) {
  size_t half = two ? n / 2 : 0;
  half_part a = {fn, arg, 0, half};
  pthread_t th;
  int on = half && pthread_create(&th, NULL, half_run, &a) == 0;
  fn(arg, on ? half : 0, n); /* without a second thread: all of it here */
  if (on)
    pthread_join(th, NULL);
}

kc_err kcc_mkdirs(const char *path, char *err) {
  char p[PATH_MAX];
  if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p)
    return kc_errf(err, KC_EINVAL, "%s: path too long", path);
  for (char *s = p + 1; *s; s++) {
    if (*s != '/')
      continue;
    *s = '\0';
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
      return kc_errf(err, KC_IO, "mkdir %s: %s", p, strerror(errno));
    *s = '/';
  }
  if (mkdir(p, 0755) != 0 && errno != EEXIST)
    return kc_errf(err, KC_IO, "mkdir %s: %s", p, strerror(errno));
  return KC_OK;
}

kc_err kcc_write_all(int fd, const void *data, size_t len) {
  const char *p = data;
  while (len) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return KC_IO;
    p += n;
    len -= (size_t)n;
  }
  return KC_OK;
}

kc_err kc_write_file_atomic(const char *path, const void *data, size_t len,
                            char *err) {
  char tmp[PATH_MAX];
  if (snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", path) >= (int)sizeof tmp)
    return kc_errf(err, KC_EINVAL, "%s: path too long", path);
  int fd = mkstemp(tmp);
  if (fd < 0)
    return kc_errf(err, KC_IO, "create %s: %s", tmp, strerror(errno));
  kc_err e = kcc_write_all(fd, data, len);
  int saved = errno;
  if (close(fd) != 0 && !e) {
    e = KC_IO;
    saved = errno;
  }
  if (!e && fchmodat(AT_FDCWD, tmp, 0644, 0) != 0) {
    e = KC_IO;
    saved = errno;
  }
  if (!e && rename(tmp, path) != 0) {
    e = KC_IO;
    saved = errno;
  }
  if (e) {
    unlink(tmp);
    return kc_errf(err, KC_IO, "write %s: %s", path, strerror(saved));
  }
  return KC_OK;
}

static int rm_one(const char *p, const struct stat *st, int flag,
                  struct FTW *f) {
  (void)st;
  (void)f;
  if (flag == FTW_DP)
    rmdir(p);
  else
    unlink(p);
  return 0;
}

void kcc_rmtree(const char *path) {
  nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static int cmp_dim(const void *a, const void *b) {
  return strcmp(((const kc_dim *)a)->name, ((const kc_dim *)b)->name);
}

void kc_bucket_label(const kc_bucket *b, char *out, size_t out_size) {
  kc_dim d[KC_MAX_DIMS];
  size_t n = b->n < KC_MAX_DIMS ? b->n : KC_MAX_DIMS;
  memcpy(d, b->dims, n * sizeof *d);
  qsort(d, n, sizeof *d, cmp_dim);
  size_t used = 0;
  if (out_size)
    out[0] = '\0';
  for (size_t i = 0; i < n && used < out_size; i++) {
    int w = snprintf(out + used, out_size - used, "%s%s=%llu", i ? "," : "",
                     d[i].name, (unsigned long long)d[i].value);
    if (w < 0)
      break;
    used += (size_t)w;
  }
}

kc_err kc_model_hash(const char *const *paths, size_t n,
                     char out[KC_HEX_LEN + 1], char *err) {
  kc_sha256 *h = kc_sha256_new();
  if (!h)
    return kc_errf(err, KC_NOMEM, "out of memory");
  kc_err e = KC_OK;
  for (size_t i = 0; i < n && !e; i++) {
    char d[KC_HEX_LEN + 1], line[PATH_MAX + 80];
    uint64_t size;
    if ((e = kc_sha256_file(paths[i], d, &size, err)))
      break;
    const char *base = strrchr(paths[i], '/');
    int len =
        snprintf(line, sizeof line, "%s  %s\n", d, base ? base + 1 : paths[i]);
    e = kc_sha256_update(h, line, (size_t)len);
  }
  if (!e)
    e = kc_sha256_final(h, out);
  kc_sha256_free(h);
  return e;
}
