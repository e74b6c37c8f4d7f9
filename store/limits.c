/* limits.c: what keeps a store usable at its limits: one process per
 * directory (a lock file), a full disk told apart from other I/O errors,
 * eviction in bounded batches (a full map cannot hold one big eviction), and
 * the open-time work after a limit was lowered or a store was upgraded. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "store_internal.h"

/* Removals per transaction when evicting because the map is full or the
 * limit was lowered: each needs a few pages for the B-trees and the free
 * list, which a nearly full map still has; a failed batch is halved. */
#define FULL_BATCH 32
/* Free space under which a commit's EIO counts as a full disk: a short write
 * leaves less than a page, a little more covers a deletion in between. */
#define DISK_FULL_SLACK (1024ull * 1024)
/* Room beyond the data file a map keeps at open (kcs_map_with_room). */
#define MAP_ROOM_MIN (16ull * 1024 * 1024)

/* ---- commit bookkeeping ---- */

void kcs_txn_reset(kc_store *s) {
  s->txn_evicted_bundles = s->txn_evicted_blobs = s->txn_gc_blobs = 0;
  s->txn_evicted_kv = 0;
}

kc_err kcs_disk_err(kc_store *s, int errnum, const char *what, char *err) {
  if (errnum != ENOSPC && errnum != EDQUOT)
    return kc_errf(err, KC_IO, "%s: %s", what, strerror(errnum));
  int64_t zero = 0;
  atomic_compare_exchange_strong(&s->disk_full_since, &zero, kcs_now());
  return kc_errf(err, KC_DISK_FULL,
                 "%s: the disk holding the store (%s) is "
                 "full: %s",
                 what, s->dir, strerror(errnum));
}

/* Whether the file system holding the store has less than DISK_FULL_SLACK
 * bytes left for it (statvfs; 0 when it cannot tell). */
static int disk_nearly_full(const kc_store *s) {
  struct statvfs v;
  if (statvfs(s->dir, &v) != 0)
    return 0;
  return (uint64_t)v.f_bavail * v.f_frsize < DISK_FULL_SLACK;
}

kc_err kcs_commit_done(kc_store *s, int rc, char *err) {
  if (rc) {
    kcs_txn_reset(s);
    if (rc == MDB_MAP_FULL)
      return KCS_MAP_FULL;
    /* LMDB answers a short write of its pages with EIO, not ENOSPC: a commit
     * that fills the disk part way (the usual end of small uploads, whose
     * pages go straight to the data file) is a full disk when no room is
     * left after it. */
    if (rc == EIO && disk_nearly_full(s))
      rc = ENOSPC;
    if (rc == ENOSPC || rc == EDQUOT)
      return kcs_disk_err(s, rc, "commit", err);
    return kcs_mdb_err(rc, "commit", err);
  }
  atomic_store(&s->disk_full_since, 0);
  atomic_fetch_add(&s->evicted_bundles, s->txn_evicted_bundles);
  atomic_fetch_add(&s->evicted_blobs, s->txn_evicted_blobs);
  atomic_fetch_add(&s->gc_blobs, s->txn_gc_blobs);
  atomic_fetch_add(&s->evicted_kv, s->txn_evicted_kv);
  kcs_txn_reset(s);
  return KC_OK;
}

int64_t kc_store_disk_full_since(kc_store *s) {
  return s ? atomic_load(&s->disk_full_since) : 0;
}

/* ---- the directory lock ---- */

/* The pid written in the lock file, or -1. */
static long lock_holder(int fd) {
  char buf[32] = "";
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0)
    return -1;
  buf[n] = '\0';
  char *end;
  long pid = strtol(buf, &end, 10);
  return end != buf && pid > 0 ? pid : -1;
}

/* The lock that decides is on the directory itself: kcached.lock can be
 * deleted while held, and a second process would then lock a new file of
 * that name and share the store; the directory cannot be replaced while it
 * holds data.mdb. kcached.lock stays, locked too, for the holder's pid in
 * the message. */
static int lock_the_dir(kc_store *s, int *en) {
  int fd = open(s->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
    *en = errno;
    if (fd >= 0)
      close(fd);
    return -1;
  }
  s->dir_lock_fd = fd;
  return 0;
}

/* flock, not fcntl: its lock belongs to the open file, so a second open of
 * the directory in this same process is refused too (LMDB forbids that). */
kc_err kcs_lock_dir(kc_store *s, char *err) {
  char path[4096];
  snprintf(path, sizeof path, "%s/kcached.lock", s->dir);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
  if (fd < 0)
    return kc_errf(err, KC_IO, "cannot open %s: %s", path, strerror(errno));
  int en = 0;
  if (lock_the_dir(s, &en) != 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
    en = en ? en : errno;
    long pid = lock_holder(fd);
    close(fd);
    kcs_unlock_dir(s);
    if (en != EWOULDBLOCK)
      return kc_errf(err, KC_IO, "cannot lock %s: %s", path, strerror(en));
    if (pid > 0)
      return kc_errf(err, KC_LOCKED,
                     "%s is in use by another process (pid "
                     "%ld, in %s): one kcached per data directory",
                     s->dir, pid, path);
    return kc_errf(err, KC_LOCKED,
                   "%s is in use by another process (%s is "
                   "locked): one kcached per data directory",
                   s->dir, path);
  }
  char buf[32];
  int n = snprintf(buf, sizeof buf, "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, buf, (size_t)n, 0) != n) {
    kc_err e =
        kc_errf(err, KC_IO, "cannot write %s: %s", path, strerror(errno));
    close(fd);
    kcs_unlock_dir(s);
    return e;
  }
  s->lock_fd = fd;
  return KC_OK;
}

/* The file stays: removing it would race with a process about to lock it. */
void kcs_unlock_dir(kc_store *s) {
  if (s->lock_fd >= 0)
    close(s->lock_fd);
  if (s->dir_lock_fd >= 0)
    close(s->dir_lock_fd);
  s->lock_fd = s->dir_lock_fd = -1;
}

/* ---- bounded eviction ---- */

typedef struct batch_ctx {
  uint64_t target;
  size_t limit;
  int done;
} batch_ctx;

static kc_err batch_op(kc_store *s, MDB_txn *txn, void *ud, char *err) {
  batch_ctx *c = ud;
  return kcs_evict_some(s, txn, c->target, c->limit, &c->done, err);
}

kc_err kcs_evict_batched(kc_store *s, uint64_t target, char *err) {
  batch_ctx c = {target, FULL_BATCH, 0};
  while (!c.done) {
    kc_err e = kcs_write_once(s, batch_op, &c, err);
    if (e == KCS_MAP_FULL && c.limit > 1) {
      c.limit /= 2; /* fewer removals need fewer pages */
      c.done = 0;
      continue;
    }
    if (e == KCS_MAP_FULL)
      return kc_errf(err, KC_STORE_FULL,
                     "the store's map is too full to "
                     "evict even one item");
    if (e)
      return e;
  }
  return KC_OK;
}

/* ---- at open ---- */

uint64_t kcs_map_with_room(const char *dir, uint64_t want) {
  char path[4096];
  struct stat st;
  snprintf(path, sizeof path, "%s/data.mdb", dir);
  if (stat(path, &st) != 0 || (uint64_t)st.st_size + MAP_ROOM_MIN <= want)
    return want;
  /* LMDB would map exactly the file: not one free page beyond it, and even
   * an eviction needs some (copied B-tree pages, the free list). The map is
   * address space; the file grows only by the pages written. */
  return (uint64_t)st.st_size + (uint64_t)st.st_size / 16 + MAP_ROOM_MIN;
}

kc_err kcs_value_bytes(MDB_txn *txn, MDB_dbi dbi, const char *what,
                       uint64_t *sum, char *err) {
  MDB_cursor *cur;
  *sum = 0;
  int rc = mdb_cursor_open(txn, dbi, &cur);
  if (rc)
    return kcs_mdb_err(rc, what, err);
  MDB_val k, v; /* sizes only: the values' overflow pages are not read */
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
    *sum += v.mv_size;
  mdb_cursor_close(cur);
  return rc == MDB_NOTFOUND ? KC_OK : kcs_mdb_err(rc, what, err);
}

kc_err kcs_manifest_bytes(kc_store *s, MDB_txn *txn, uint64_t *sum, char *err) {
  return kcs_value_bytes(txn, s->bundles, "counting the manifests", sum, err);
}

/* A byte count added to bytes_used once per store, remembered by a flag in
 * meta: stores written before the count existed. */
typedef struct {
  const char *flag;
  kc_err (*bytes)(kc_store *, MDB_txn *, uint64_t *, char *);
} count_once;

static kc_err count_once_op(kc_store *s, MDB_txn *txn, void *ud, char *err) {
  const count_once *c = ud;
  MDB_val k = {strlen(c->flag), (void *)c->flag}, v;
  if (mdb_get(txn, s->meta, &k, &v) == 0)
    return KC_OK; /* counted already */
  uint64_t sum;
  kc_err e = c->bytes(s, txn, &sum, err);
  if (e)
    return e;
  uint32_t one = 1;
  MDB_val flag = {sizeof one, &one};
  e = kcs_bytes_add(txn, s, (int64_t)sum, err);
  return e ? e : kcs_put(txn, s->meta, &k, &flag, 0, err);
}

kc_err kcs_open_limits(kc_store *s, char *err) {
  /* Manifests first, then RESP keys, then warmup manifests (their counts
   * came later, in that order). */
  count_once manifests = {"manifests_counted", kcs_manifest_bytes};
  count_once kv_keys = {"kv_keys_counted", kcs_kv_key_bytes};
  count_once warmups = {"warmups_counted", kcs_warmup_bytes};
  kc_err e = kcs_write(s, count_once_op, &manifests, err);
  if (!e)
    e = kcs_write(s, count_once_op, &kv_keys, err);
  if (!e)
    e = kcs_write(s, count_once_op, &warmups, err);
  if (e == KC_STORE_FULL || e == KC_DISK_FULL)
    e = KC_OK; /* counted at the next open; the store still serves reads */
  if (e || !s->max_bytes)
    return e;
  kc_store_stats st;
  if (kc_store_stats_get(s, &st) || st.bytes_used <= s->max_bytes)
    return KC_OK;
  /* A lowered limit: evict now, in batches, rather than make every write
   * fail on a map that cannot hold one big eviction. Not fatal: a store
   * that cannot evict yet still serves reads. */
  kc_store_flush(s);
  kcs_evict_batched(s, kcs_low_target(s, st.bytes_used), NULL);
  return KC_OK;
}
