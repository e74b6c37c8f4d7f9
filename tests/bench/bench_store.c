/* bench_store.c: store/ throughput and reopen time.
 *
 *   bench_store [--dir DIR] [--runs R] [--small N] [--large N] [--bundles N]
 *               [--sync-populate] [--no-throughput] [--no-reopen] [--keep]
 *
 * 1. Put and get throughput for 4 KiB blobs (--small, default 2000 per run)
 *    and 16 MiB blobs (--large, default 16 per run): each run is a fresh
 *    store; puts are kc_store_blob_put (one durable write transaction each,
 *    digests computed beforehand, the store re-hashes); gets are one read
 *    transaction per kc_store_blob_get and read every byte (as a server
 *    sending it would). Median of --runs (default 5) runs, in MB/s and ops/s.
 * 2. Reopen: a store holding --bundles small bundles (default 1,000,000; 1,000
 *    models, bucket {"batch": i}, all sharing one 4 KiB blob, so only bundle
 *    puts grow) is closed and opened again; kc_store_open alone, and open +
 *    kc_store_stats_get + one bundle get, median of --runs, with the page
 *    cache warm and cold (posix_fadvise DONTNEED on the store's files).
 *    Target: open under 1 s.
 *
 * Populating: the store API commits (and syncs) one transaction per bundle
 * put, about 1-5 ms on an ordinary disk, so 1M synced puts take 20-80 min.
 * By default this program turns LMDB's syncs off *while populating only*: it
 * defines fdatasync/fsync/msync here (they return 0 while `g_nosync` is set)
 * and strips O_DSYNC from open() (LMDB opens its meta-page fd with it), which
 * shadow libc's for liblmdb. The data written is the same; only durability of
 * the population run is skipped. The store is then closed, its files synced
 * with syncfs, and every measured open/put/get runs with real syncs.
 * --sync-populate populates with real syncs. The populated store is kept in
 * DIR/reopen-N and reused by later runs of the same N (delete it to redo).
 * Populating 1M bundles this way took 103 s on the 2-core dev VM (about
 * 10-15k puts/s; the store's files: 1.4 GiB); progress is printed.
 *
 * Seen on that VM (build-store, RelWithDebInfo, 2026-11-23):
 *   bench_store --dir /tmp/kcbench --runs 5
 *   4 KiB  x 2000: put 7.5 MB/s (1832 ops/s), get 2574 MB/s (628k ops/s)
 *   16 MiB x 16:   put 481 MB/s (29 ops/s),   get 5539 MB/s (330 ops/s)
 *   reopen 1M bundles: open 0.27 ms warm, 0.66 ms cold (target < 1 s)
 *
 * DIR defaults to a new mkdtemp directory under $TMPDIR (or /tmp), removed at
 * exit unless --keep or --dir was given. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "kc_schema.h"
#include "kc_store.h"

/* ---- sync interposition for populating (see the header comment) ---- */

static volatile int g_nosync;

int fdatasync(int fd) {
  if (g_nosync)
    return 0;
  return (int)syscall(SYS_fdatasync, fd);
}

int fsync(int fd) {
  if (g_nosync)
    return 0;
  return (int)syscall(SYS_fsync, fd);
}

int msync(void *addr, size_t len, int flags) {
  if (g_nosync)
    return 0;
  return (int)syscall(SYS_msync, addr, len, flags);
}

int open(const char *path, int flags, ...) {
  mode_t mode = 0;
  if (flags & (O_CREAT | __O_TMPFILE)) {
    va_list ap;
    va_start(ap, flags);
    mode = (mode_t)va_arg(ap, int);
    va_end(ap);
  }
  if (g_nosync)
    flags &= ~(O_DSYNC | O_SYNC);
  return (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode);
}

/* ---- helpers ---- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* snprintf that refuses to cut a path. */
static void pathf(char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void pathf(char *buf, size_t size, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, size, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= size) {
    fprintf(stderr, "bench_store: path too long\n");
    exit(1);
  }
}

static void die(const char *what, kc_err e, const char *err) {
  fprintf(stderr, "bench_store: %s: %s (%s)\n", what, kc_err_name(e),
          err ? err : "");
  exit(1);
}

static void fill(uint8_t *p, size_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    memcpy(p + i, &x, 8);
  }
  for (size_t i = n & ~(size_t)7; i < n; i++)
    p[i] = (uint8_t)i;
}

static int rm_entry(const char *p, const struct stat *st, int flag,
                    struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(p);
}

static void rm_rf(const char *p) {
  nftw(p, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static kc_store *open_store(const char *dir, uint64_t map_size) {
  kc_store_opts o;
  memset(&o, 0, sizeof o);
  o.dir = dir;
  o.map_size = map_size;
  kc_store *s = NULL;
  char err[KC_ERRBUF_SIZE] = "";
  kc_err e = kc_store_open(&o, &s, err);
  if (e != KC_OK)
    die("open", e, err);
  return s;
}

/* Drops the store's files from the page cache (clean pages only). */
static void drop_cache(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *de;
  if (!d)
    return;
  while ((de = readdir(d)) != NULL) {
    char p[4096];
    pathf(p, sizeof p, "%s/%s", dir, de->d_name);
    int fd = open(p, O_RDONLY);
    if (fd < 0)
      continue;
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
      fdatasync(fd);
      posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    }
    close(fd);
  }
  closedir(d);
}

static uint64_t dir_bytes(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *de;
  uint64_t sum = 0;
  if (!d)
    return 0;
  while ((de = readdir(d)) != NULL) {
    char p[4096];
    struct stat st;
    pathf(p, sizeof p, "%s/%s", dir, de->d_name);
    if (stat(p, &st) == 0 && S_ISREG(st.st_mode))
      sum += (uint64_t)st.st_blocks * 512;
  }
  closedir(d);
  return sum;
}

/* ---- 1. throughput ---- */

static volatile uint64_t g_sink;

static void bench_blobs(const char *base, size_t blob, size_t count, int runs) {
  double put_t[64], get_t[64];
  /* Blob i: a common random body with i stamped in its first 8 bytes, so a
   * run of 16 MiB blobs needs one buffer, not count of them. */
  uint8_t *body = malloc(blob);
  char(*hex)[KC_HEX_LEN + 1] = malloc(count * sizeof *hex);
  if (!body || !hex) {
    fprintf(stderr, "bench_store: out of memory\n");
    exit(1);
  }
  fill(body, blob, blob);
  for (int r = 0; r < runs; r++) {
    char dir[4096];
    pathf(dir, sizeof dir, "%s/tp-%zu-%d", base, blob, r);
    rm_rf(dir);
    for (size_t i = 0; i < count; i++) {
      uint64_t tag = ((uint64_t)r << 40) | i;
      memcpy(body, &tag, 8);
      kc_sha256_hex(body, blob, hex[i]);
    }
    kc_store *s = open_store(dir, 0);
    char err[KC_ERRBUF_SIZE] = "";
    double t0 = now_s();
    for (size_t i = 0; i < count; i++) {
      uint64_t tag = ((uint64_t)r << 40) | i;
      int created;
      memcpy(body, &tag, 8);
      kc_err e = kc_store_blob_put(s, hex[i], body, blob, &created, err);
      if (e != KC_OK)
        die("blob put", e, err);
    }
    put_t[r] = now_s() - t0;
    t0 = now_s();
    uint64_t acc = 0;
    for (size_t i = 0; i < count; i++) {
      kc_store_read *rd = NULL;
      const void *data;
      size_t len;
      kc_err e = kc_store_read_begin(s, &rd);
      if (e == KC_OK)
        e = kc_store_blob_get(rd, hex[i], &data, &len);
      if (e != KC_OK || len != blob)
        die("blob get", e, NULL);
      const uint64_t *w = data;
      for (size_t k = 0; k < len / 8; k++)
        acc ^= w[k];
      kc_store_read_end(rd);
    }
    g_sink = acc;
    get_t[r] = now_s() - t0;
    kc_store_close(s);
    rm_rf(dir);
  }
  double tp = median(put_t, runs), tg = median(get_t, runs);
  double mb = (double)blob * (double)count / 1e6;
  printf("%-8s x %6zu  put: %9.1f MB/s %10.0f ops/s   get: %9.1f MB/s "
         "%10.0f ops/s   (median of %d)\n",
         blob >= (1u << 20) ? "16 MiB" : "4 KiB", count, mb / tp,
         (double)count / tp, mb / tg, (double)count / tg, runs);
  fflush(stdout);
  free(body);
  free(hex);
}

/* ---- 2. reopen a store of many bundles ---- */

static void model_of(size_t i, char out[KC_HEX_LEN + 1]) {
  char name[32];
  snprintf(name, sizeof name, "model-%zu", i / 1000);
  kc_sha256_hex(name, strlen(name), out);
}

static void make_bundle(kc_manifest *m, size_t i, const char *blob,
                        uint64_t blob_size) {
  char err[KC_ERRBUF_SIZE] = "";
  memset(&m->fields, 0, sizeof m->fields);
  model_of(i, m->fields.model);
  strcpy(m->fields.build,
         "e844adc60c72d254b27e713b88e72a8338fbb13944b1499c212495e376cd3d11");
  strcpy(m->fields.arch, "sm_90a");
  m->fields.bucket.n = 1;
  strcpy(m->fields.bucket.dims[0].name, "batch");
  m->fields.bucket.dims[0].value = i;
  m->fields.n_tools = 1;
  strcpy(m->fields.tools[0].name, "cuda");
  strcpy(m->fields.tools[0].value, "13.0");
  if (m->n_files == 0) {
    const char *entries[] = {"gemm"};
    kc_err e = kc_manifest_add_file(m, "gemm.cubin", blob, blob_size,
                                    KC_KIND_CUBIN, entries, 1, err);
    if (e != KC_OK)
      die("manifest", e, err);
  }
  kc_err e = kc_manifest_seal(m, err);
  if (e != KC_OK)
    die("seal", e, err);
}

static void populate(const char *dir, size_t n, int sync_populate) {
  char marker[4096];
  pathf(marker, sizeof marker, "%s.done", dir);
  if (access(marker, F_OK) == 0) {
    printf("reopen: reusing %s (%zu bundles)\n", dir, n);
    return;
  }
  rm_rf(dir);
  g_nosync = !sync_populate;
  kc_store *s = open_store(dir, 0);
  char err[KC_ERRBUF_SIZE] = "";
  uint8_t blob[4096];
  char hex[KC_HEX_LEN + 1];
  fill(blob, sizeof blob, 42);
  kc_sha256_hex(blob, sizeof blob, hex);
  int created;
  kc_err e = kc_store_blob_put(s, hex, blob, sizeof blob, &created, err);
  if (e != KC_OK)
    die("blob put", e, err);
  kc_manifest *m = kc_manifest_new();
  double t0 = now_s(), tl = t0;
  size_t step = n >= 20 ? n / 20 : 1;
  printf("reopen: populating %zu bundles in %s (%s syncs)\n", n, dir,
         sync_populate ? "with" : "without");
  fflush(stdout);
  for (size_t i = 0; i < n; i++) {
    make_bundle(m, i, hex, sizeof blob);
    e = kc_store_bundle_put(s, m, &created, NULL, NULL, err);
    if (e != KC_OK)
      die("bundle put", e, err);
    if ((i + 1) % step == 0) {
      double t = now_s();
      printf("  %zu/%zu  %.1f s  (%.0f puts/s lately)\n", i + 1, n, t - t0,
             (double)step / (t - tl));
      fflush(stdout);
      tl = t;
    }
  }
  kc_manifest_free(m);
  kc_store_close(s);
  g_nosync = 0;
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    syncfs(fd);
    close(fd);
  }
  printf("reopen: populated in %.1f s; store files %.1f MiB\n", now_s() - t0,
         (double)dir_bytes(dir) / (1 << 20));
  FILE *f = fopen(marker, "w");
  if (f)
    fclose(f);
}

static void bench_reopen(const char *base, size_t n, int runs,
                         int sync_populate) {
  char dir[4096];
  pathf(dir, sizeof dir, "%s/reopen-%zu", base, n);
  populate(dir, n, sync_populate);
  char hex[KC_HEX_LEN + 1];
  uint8_t blob[4096];
  fill(blob, sizeof blob, 42);
  kc_sha256_hex(blob, sizeof blob, hex);
  kc_manifest *m = kc_manifest_new();
  for (int cold = 0; cold < 2; cold++) {
    double t_open[64], t_all[64];
    kc_store_stats st;
    for (int r = 0; r < runs; r++) {
      if (cold)
        drop_cache(dir);
      double t0 = now_s();
      kc_store *s = open_store(dir, 0);
      double t1 = now_s();
      kc_err e = kc_store_stats_get(s, &st);
      if (e != KC_OK)
        die("stats", e, NULL);
      make_bundle(m, (size_t)r * 7919 % n, hex, sizeof blob);
      kc_store_read *rd = NULL;
      const char *json;
      size_t len;
      e = kc_store_read_begin(s, &rd);
      if (e == KC_OK)
        e = kc_store_bundle_get(rd, m->key, &json, &len);
      if (e != KC_OK)
        die("bundle get after reopen", e, NULL);
      kc_store_read_end(rd);
      double t2 = now_s();
      kc_store_close(s);
      t_open[r] = t1 - t0;
      t_all[r] = t2 - t0;
      if (st.bundles != n) {
        fprintf(stderr, "bench_store: store holds %llu bundles, want %zu\n",
                (unsigned long long)st.bundles, n);
        exit(1);
      }
    }
    double o = median(t_open, runs);
    printf("reopen %zu bundles (%s cache): open %.3f ms, open+stats+get %.3f "
           "ms (median of %d)%s\n",
           n, cold ? "cold" : "warm", o * 1e3, median(t_all, runs) * 1e3, runs,
           o < 1.0 ? "" : "  ** over the 1 s target **");
    fflush(stdout);
  }
  kc_manifest_free(m);
}

int main(int argc, char **argv) {
  const char *dir = NULL;
  int runs = 5, sync_populate = 0, do_tp = 1, do_reopen = 1, keep = 0;
  size_t small = 2000, large = 16, bundles = 1000000;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--dir") && v)
      dir = v, i++;
    else if (!strcmp(a, "--runs") && v)
      runs = atoi(v), i++;
    else if (!strcmp(a, "--small") && v)
      small = strtoull(v, NULL, 10), i++;
    else if (!strcmp(a, "--large") && v)
      large = strtoull(v, NULL, 10), i++;
    else if (!strcmp(a, "--bundles") && v)
      bundles = strtoull(v, NULL, 10), i++;
    else if (!strcmp(a, "--sync-populate"))
      sync_populate = 1;
    else if (!strcmp(a, "--no-throughput"))
      do_tp = 0;
    else if (!strcmp(a, "--no-reopen"))
      do_reopen = 0;
    else if (!strcmp(a, "--keep"))
      keep = 1;
    else {
      fprintf(stderr,
              "usage: %s [--dir DIR] [--runs R] [--small N] [--large N] "
              "[--bundles N] [--sync-populate] [--no-throughput] "
              "[--no-reopen] [--keep]\n",
              argv[0]);
      return 2;
    }
  }
  if (runs < 1 || runs > 64 || bundles < 1 || small < 1 || large < 1) {
    fprintf(stderr, "bench_store: runs 1..64, counts >= 1\n");
    return 2;
  }
  char tmpl[4096];
  int made = 0;
  if (!dir) {
    const char *t = getenv("TMPDIR");
    snprintf(tmpl, sizeof tmpl, "%s/kc_bench_store.XXXXXX",
             t && *t ? t : "/tmp");
    if (!mkdtemp(tmpl)) {
      perror("mkdtemp");
      return 1;
    }
    dir = tmpl;
    made = 1;
  } else {
    mkdir(dir, 0700);
  }
  printf("bench_store: dir %s\n", dir);
  if (do_tp) {
    bench_blobs(dir, 4096, small, runs);
    bench_blobs(dir, 16u << 20, large, runs);
  }
  if (do_reopen)
    bench_reopen(dir, bundles, runs, sync_populate);
  if (made && !keep)
    rm_rf(dir);
  return 0;
}
