/* lend.c: a large blob's bytes lent to a response without a copy, and
 * without a read held at the client's pace.
 *
 * The bytes are a second mapping of data.mdb over the blob's overflow pages
 * (read-only, shared: the same page-cache pages as LMDB's map). While the
 * read that found the blob is held, LMDB cannot reuse those pages, so the
 * bytes are the blob's. kc_store_lent_detach copies them into anonymous
 * memory and moves that over the mapping in one mremap, at the same
 * address, then ends the read: a reader of the address sees the same bytes
 * before and after, and no page of the store stays pinned. The caller
 * detaches a loan its client has not finished with soon (a stalled client);
 * a fast one costs no copy at all.
 *
 * Where the pages are: LMDB keeps a value that does not fit a leaf in
 * overflow pages, the value right after the first one's 16-byte header,
 * which holds the page's number and flags. That is LMDB's file format (it
 * does not change within a major version): the loan checks the header's
 * flags and the page's alignment in the map, and is refused (KC_EINVAL:
 * copy instead) when either is not as expected. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "store_internal.h"

/* The page header read here is LMDB 0.9's (struct MDB_page and P_OVERFLOW
 * in libraries/liblmdb/mdb.c, which lmdb.h does not export): pgno_t
 * mp_pgno (a size_t: 8 bytes on the 64-bit hosts kcached runs on), uint16_t
 * mp_pad, uint16_t mp_flags, then uint32_t mp_pages for an overflow page;
 * PAGEHDRSZ is the size up to mp_ptrs. Another major version may lay its
 * pages out otherwise: it must be checked before this builds. */
#if MDB_VERSION_MAJOR != 0
#error "store/lend.c reads LMDB 0.9's page header: check it for this LMDB"
#endif
#define LMDB_PAGEHDRSZ 16    /* PAGEHDRSZ: offsetof(MDB_page, mp_ptrs) */
#define LMDB_MP_PGNO 0       /* offsetof(MDB_page, mp_pgno) */
#define LMDB_MP_FLAGS 10     /* offsetof(MDB_page, mp_flags) */
#define LMDB_MP_PAGES 12     /* offsetof(MDB_page, mp_pages) */
#define LMDB_P_OVERFLOW 0x04 /* mp_flags of an overflow page */

struct kc_store_lent {
  kc_store_read *read; /* NULL once detached */
  char *map;           /* the mapping (page-aligned), maplen bytes */
  int fd;              /* data.mdb, and the mapping's offset in it */
  off_t at;
  size_t maplen, skip; /* the blob's first byte is at map + skip */
  size_t len;
};

/* The offset in data.mdb of the value at data (len bytes), from its
 * overflow page's header; 0 when it is not where an overflow value sits. */
static uint64_t value_offset(kc_store *s, const void *data, size_t len) {
  MDB_stat st;
  if (mdb_env_stat(s->env, &st) || st.ms_psize < LMDB_PAGEHDRSZ)
    return 0;
  const char *page = (const char *)data - LMDB_PAGEHDRSZ;
  uint64_t pgno;
  uint16_t flags;
  memcpy(&pgno, page + LMDB_MP_PGNO, sizeof pgno);
  memcpy(&flags, page + LMDB_MP_FLAGS, sizeof flags);
  uint32_t pages;
  memcpy(&pages, page + LMDB_MP_PAGES, sizeof pages);
  long os_page = sysconf(_SC_PAGESIZE);
  if (!(flags & LMDB_P_OVERFLOW) || os_page <= 0 ||
      (uintptr_t)page % (uintptr_t)os_page ||
      (uint64_t)pages * st.ms_psize < len + LMDB_PAGEHDRSZ)
    return 0;
  return pgno * st.ms_psize + LMDB_PAGEHDRSZ;
}

kc_err kc_store_lend(kc_store_read *r, const void *data, size_t len,
                     kc_store_lent **out) {
  int fd;
  uint64_t off = value_offset(r->s, data, len);
  if (!off || mdb_env_get_fd(r->s->env, &fd))
    return KC_EINVAL;
  long os_page = sysconf(_SC_PAGESIZE);
  kc_store_lent *l = calloc(1, sizeof *l);
  if (!l)
    return KC_NOMEM;
  uint64_t at = off - off % (uint64_t)os_page;
  l->skip = (size_t)(off - at);
  l->maplen = (l->skip + len + (size_t)os_page - 1) & ~((size_t)os_page - 1);
  l->len = len;
  l->fd = fd;
  l->at = (off_t)at;
  void *m = mmap(NULL, l->maplen, PROT_READ, MAP_SHARED, fd, l->at);
  if (m == MAP_FAILED) {
    free(l);
    return KC_IO;
  }
  l->map = m;
  /* The same bytes at both addresses, or the page arithmetic was wrong. */
  if (memcmp(l->map + l->skip - LMDB_PAGEHDRSZ,
             (const char *)data - LMDB_PAGEHDRSZ, LMDB_PAGEHDRSZ + 64) != 0) {
    munmap(m, l->maplen);
    free(l);
    return KC_EINVAL;
  }
  l->read = r;
  *out = l;
  return KC_OK;
}

const void *kc_store_lent_bytes(const kc_store_lent *l) {
  return l->map + l->skip;
}

size_t kc_store_lent_size(const kc_store_lent *l) { return l->len; }

int kc_store_lent_held(const kc_store_lent *l) { return l->read != NULL; }

kc_err kc_store_lent_detach(kc_store_lent *l) {
  if (!l->read)
    return KC_OK;
  void *copy = mmap(NULL, l->maplen, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (copy == MAP_FAILED)
    return KC_NOMEM;
  memcpy(copy, l->map, l->maplen);
  if (mprotect(copy, l->maplen, PROT_READ)) {
    munmap(copy, l->maplen);
    return KC_NOMEM;
  }
  if (mremap(copy, l->maplen, l->maplen, MREMAP_MAYMOVE | MREMAP_FIXED,
             l->map) == MAP_FAILED) {
    /* Linux may have unmapped the target before the move failed: the read
     * is still held, so mapping the file there again restores the same
     * bytes (a reader meanwhile met a hole: EFAULT, never other bytes).
     * Failing that, the range is kept reserved and unreadable, so that no
     * later mapping lands where a send still points. */
    munmap(copy, l->maplen);
    if (mmap(l->map, l->maplen, PROT_READ, MAP_SHARED | MAP_FIXED, l->fd,
             l->at) != MAP_FAILED)
      return KC_NOMEM;
    mmap(l->map, l->maplen, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    return KC_IO;
  }
  kc_store_read_end(l->read);
  l->read = NULL;
  return KC_OK;
}

void kc_store_lent_free(kc_store_lent *l) {
  if (!l)
    return;
  munmap(l->map, l->maplen);
  kc_store_read_end(l->read);
  free(l);
}

/* The record kc_store_blob_touch keeps, without its writes: a blob served
 * in pieces is not an offer of a manifest to come. */
void kc_store_blob_spare(kc_store *s, const char *digest) {
  kcs_uses_record(&s->touched, digest, kcs_now());
}
