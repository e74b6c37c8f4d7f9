/* test_store_blob.c: store/ unit tests (kc_store.h) of
 * blobs: open, round trips, the empty blob, digest mismatches, fd and
 * pipe uploads, streamed uploads, a 256 MiB blob, bad digests.
 * Fixtures and helpers: storetest.h. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "storetest.h"

/* ======================================================================= */
/* open                                                                     */

static void test_open_creates_dir_and_empty_stats(void **state) {
  fx *f = *state;
  char *sub = path_join(f->tmp, "fresh");
  kc_store *s = open_store(sub, 1 << 20, 0, 0);
  struct stat st;
  assert_int_equal(stat(sub, &st), 0);
  assert_true(S_ISDIR(st.st_mode));
  kc_store_stats ss = get_stats(s);
  assert_int_equal(ss.bytes_used, 0);
  assert_int_equal(ss.max_bytes, 1 << 20);
  assert_int_equal(ss.blobs, 0);
  assert_int_equal(ss.bundles, 0);
  assert_int_equal(ss.hits, 0);
  assert_int_equal(ss.misses, 0);
  assert_int_equal(ss.evicted_bundles, 0);
  assert_int_equal(ss.evicted_blobs, 0);
  assert_int_equal(ss.gc_blobs, 0);
  assert_true(ss.map_size > 0);
  assert_true(ss.map_used <= ss.map_size);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
  kc_store_close(NULL); /* NULL: nothing */
  free(sub);
}

static void test_open_bad(void **state) {
  fx *f = *state;
  kc_store *s = NULL;
  kc_store_opts o;
  memset(&o, 0, sizeof o);
  /* A regular file where the directory should be. */
  char *file = path_join(f->tmp, "plainfile");
  FILE *fp = fopen(file, "w");
  assert_non_null(fp);
  fputs("x", fp);
  fclose(fp);
  o.dir = file;
  errbuf[0] = '\0';
  kc_err e = kc_store_open(&o, &s, errbuf);
  assert_int_not_equal(e, KC_OK);
  assert_null(s);
  assert_true(errbuf[0] != '\0');
  /* Empty path. */
  o.dir = "";
  s = NULL;
  e = kc_store_open(&o, &s, errbuf);
  assert_int_not_equal(e, KC_OK);
  assert_null(s);
  free(file);
}

/* ======================================================================= */
/* blobs                                                                    */

static void test_blob_roundtrip(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  char hex[KC_HEX_LEN + 1], other[KC_HEX_LEN + 1];
  uint8_t *p = make_bytes(10000, 1, hex);
  uint8_t *q = make_bytes(10, 2, other);
  int created = -1;
  uint64_t size = 0;

  EXPECT(kc_store_blob_has(s, hex, &size), KC_NOT_FOUND);
  OK(kc_store_blob_put(s, hex, p, 10000, &created, errbuf));
  assert_int_equal(created, 1);
  OK(kc_store_blob_put(s, hex, p, 10000, &created, errbuf));
  assert_int_equal(created, 0);
  OK(kc_store_blob_has(s, hex, &size));
  assert_int_equal(size, 10000);
  OK(kc_store_blob_has(s, hex, NULL));
  EXPECT(kc_store_blob_has(s, other, &size), KC_NOT_FOUND);

  kc_store_read *r = NULL;
  const void *data = NULL, *data2 = NULL;
  size_t len = 0, len2 = 0;
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_blob_get(r, hex, &data, &len));
  assert_int_equal(len, 10000);
  assert_non_null(data);
  assert_ptr_not_equal(data, p);
  assert_memory_equal(data, p, 10000);
  /* Zero-copy: the same bytes of the map both times. */
  OK(kc_store_blob_get(r, hex, &data2, &len2));
  assert_ptr_equal(data, data2);
  assert_int_equal(len2, 10000);
  EXPECT(kc_store_blob_get(r, other, &data, &len), KC_NOT_FOUND);
  kc_store_read_end(r);
  kc_store_read_end(NULL);

  kc_store_stats st = get_stats(s);
  assert_int_equal(st.blobs, 1);
  assert_int_equal(st.bytes_used, 10000);
  kc_store_close(s);
  free(p);
  free(q);
}

/* The empty file is a legitimate file of a bundle. */
static void test_blob_empty(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  int created = -1;
  uint64_t size = 99;
  OK(kc_store_blob_put(s, SHA_EMPTY, "", 0, &created, errbuf));
  assert_int_equal(created, 1);
  OK(kc_store_blob_has(s, SHA_EMPTY, &size));
  assert_int_equal(size, 0);
  kc_store_read *r = NULL;
  const void *data = NULL;
  size_t len = 99;
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_blob_get(r, SHA_EMPTY, &data, &len));
  assert_int_equal(len, 0);
  kc_store_read_end(r);
  /* And a bundle can reference it. */
  char d[1][KC_HEX_LEN + 1] = {SHA_EMPTY};
  uint64_t sz[1] = {0};
  kc_manifest *m = make_manifest(M1, 1, 1, d, sz);
  put_bundle(s, m, 1);
  OK(kc_store_verify(s, errbuf));
  kc_manifest_free(m);
  kc_store_close(s);
}

static void test_blob_digest_mismatch(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  char hex[KC_HEX_LEN + 1], wrong[KC_HEX_LEN + 1];
  uint8_t *p = make_bytes(5000, 3, hex);
  uint8_t *q = make_bytes(5000, 4, wrong);
  int created = -1;
  EXPECT(kc_store_blob_put(s, wrong, p, 5000, &created, errbuf),
         KC_DIGEST_MISMATCH);
  assert_true(errbuf[0] != '\0');
  EXPECT(kc_store_blob_has(s, wrong, NULL), KC_NOT_FOUND);
  EXPECT(kc_store_blob_has(s, hex, NULL), KC_NOT_FOUND);
  /* One byte off. */
  p[4999] ^= 1;
  EXPECT(kc_store_blob_put(s, hex, p, 5000, &created, errbuf),
         KC_DIGEST_MISMATCH);
  /* Right bytes, wrong length. */
  p[4999] ^= 1;
  EXPECT(kc_store_blob_put(s, hex, p, 4999, &created, errbuf),
         KC_DIGEST_MISMATCH);
  EXPECT(kc_store_blob_has(s, hex, NULL), KC_NOT_FOUND);
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.blobs, 0);
  assert_int_equal(st.bytes_used, 0);
  /* A mismatch against a digest already held changes nothing either. */
  OK(kc_store_blob_put(s, hex, p, 5000, &created, errbuf));
  EXPECT(kc_store_blob_put(s, hex, q, 5000, &created, errbuf),
         KC_DIGEST_MISMATCH);
  kc_store_read *r = NULL;
  const void *data;
  size_t len;
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_blob_get(r, hex, &data, &len));
  assert_int_equal(len, 5000);
  assert_memory_equal(data, p, 5000);
  kc_store_read_end(r);
  kc_store_close(s);
  free(p);
  free(q);
}

static void expect_blob_bytes(kc_store *s, const char *hex, const void *want,
                              size_t n) {
  kc_store_read *r = NULL;
  const void *data = NULL;
  size_t len = 0;
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_blob_get(r, hex, &data, &len));
  assert_int_equal(len, n);
  assert_memory_equal(data, want, n);
  kc_store_read_end(r);
}

static void test_blob_put_fd_file(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  const size_t n = 3 * 1024 * 1024 + 17;
  char hex[KC_HEX_LEN + 1], head[KC_HEX_LEN + 1];
  uint8_t *p = make_bytes(n, 5, hex);
  char *path = path_join(f->tmp, "blob.bin");
  int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0600);
  assert_true(fd >= 0);
  write_all(fd, p, n);
  int created = -1;

  /* Wrong digest: nothing stored. */
  assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
  EXPECT(kc_store_blob_put_fd(s, Z64, fd, n, &created, errbuf),
         KC_DIGEST_MISMATCH);
  EXPECT(kc_store_blob_has(s, Z64, NULL), KC_NOT_FOUND);
  EXPECT(kc_store_blob_has(s, hex, NULL), KC_NOT_FOUND);

  assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
  OK(kc_store_blob_put_fd(s, hex, fd, n, &created, errbuf));
  assert_int_equal(created, 1);
  expect_blob_bytes(s, hex, p, n);

  /* len shorter than the file: exactly len bytes are read and stored. */
  assert_int_equal(kc_sha256_hex(p, 1000, head), KC_OK);
  assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
  OK(kc_store_blob_put_fd(s, head, fd, 1000, &created, errbuf));
  assert_int_equal(created, 1);
  expect_blob_bytes(s, head, p, 1000);

  /* The file ends before len: an error, not a hang, nothing stored. */
  char big[KC_HEX_LEN + 1];
  uint8_t *p2 = make_bytes(n + 100, 5, big);
  assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
  errbuf[0] = '\0';
  kc_err e = kc_store_blob_put_fd(s, big, fd, n + 100, &created, errbuf);
  assert_int_not_equal(e, KC_OK);
  EXPECT(kc_store_blob_has(s, big, NULL), KC_NOT_FOUND);

  /* A bad fd. */
  e = kc_store_blob_put_fd(s, big, -1, 10, &created, errbuf);
  assert_int_not_equal(e, KC_OK);

  /* Read from the file's current offset: bytes [777, 777 + 5000). */
  char mid[KC_HEX_LEN + 1];
  assert_int_equal(kc_sha256_hex(p + 777, 5000, mid), KC_OK);
  assert_int_equal(lseek(fd, 777, SEEK_SET), 777);
  OK(kc_store_blob_put_fd(s, mid, fd, 5000, &created, errbuf));
  assert_int_equal(created, 1);
  expect_blob_bytes(s, mid, p + 777, 5000);

  kc_store_stats st = get_stats(s);
  assert_int_equal(st.blobs, 3);
  assert_int_equal(st.bytes_used, n + 1000 + 5000);
  close(fd);
  kc_store_close(s);
  free(p);
  free(p2);
  free(path);
}

typedef struct pipe_writer {
  int fd;
  const uint8_t *p;
  size_t n;
} pipe_writer;

static void *pipe_writer_main(void *arg) {
  pipe_writer *w = arg;
  size_t off = 0;
  while (off < w->n) {
    size_t chunk = w->n - off < 7000 ? w->n - off : 7000; /* odd pieces */
    ssize_t k = write(w->fd, w->p + off, chunk);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      break;
    off += (size_t)k;
  }
  close(w->fd);
  return NULL;
}

static kc_err put_from_pipe(kc_store *s, const char *hex, const uint8_t *p,
                            size_t send, uint64_t len, int *created) {
  int pfd[2];
  assert_int_equal(pipe(pfd), 0);
  pipe_writer w = {pfd[1], p, send};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, pipe_writer_main, &w), 0);
  errbuf[0] = '\0';
  kc_err e = kc_store_blob_put_fd(s, hex, pfd[0], len, created, errbuf);
  close(pfd[0]); /* unblocks the writer if the store stopped reading */
  pthread_join(t, NULL);
  return e;
}

static void test_blob_put_fd_pipe(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  signal(SIGPIPE, SIG_IGN);
  /* Much larger than a pipe buffer: the store must read while we write. */
  const size_t n = 2 * 1024 * 1024 + 3;
  char hex[KC_HEX_LEN + 1];
  uint8_t *p = make_bytes(n, 6, hex);
  int created = -1;
  EXPECT(put_from_pipe(s, hex, p, n, n, &created), KC_OK);
  assert_int_equal(created, 1);
  expect_blob_bytes(s, hex, p, n);

  /* Again: already present. */
  EXPECT(put_from_pipe(s, hex, p, n, n, &created), KC_OK);
  assert_int_equal(created, 0);
  /* Already present: the header says fd is not read at all. An empty,
   * non-blocking pipe whose writer stays open shows it (a read would give
   * EAGAIN, not hang). */
  int q2[2];
  assert_int_equal(pipe(q2), 0);
  assert_int_equal(fcntl(q2[0], F_SETFL, O_NONBLOCK), 0);
  created = -1;
  OK(kc_store_blob_put_fd(s, hex, q2[0], n, &created, errbuf));
  assert_int_equal(created, 0);
  close(q2[0]);
  close(q2[1]);

  /* Wrong digest through a pipe. */
  char wrong[KC_HEX_LEN + 1];
  uint8_t *q = make_bytes(4096, 7, wrong);
  EXPECT(put_from_pipe(s, wrong, p, 4096, 4096, &created), KC_DIGEST_MISMATCH);
  EXPECT(kc_store_blob_has(s, wrong, NULL), KC_NOT_FOUND);

  /* The writer goes away early (EOF before len): an error, nothing stored. */
  kc_err e = put_from_pipe(s, wrong, q, 1000, 4096, &created);
  assert_int_not_equal(e, KC_OK);
  EXPECT(kc_store_blob_has(s, wrong, NULL), KC_NOT_FOUND);

  kc_store_stats st = get_stats(s);
  assert_int_equal(st.blobs, 1);
  kc_store_close(s);
  free(p);
  free(q);
}

static void test_upload_stream(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  const size_t n = 5 * 1024 * 1024 + 11;
  char hex[KC_HEX_LEN + 1];
  uint8_t *p = make_bytes(n, 8, hex);
  size_t files0 = count_files(f->dir);
  int created = -1;

  /* Commit in odd-sized pieces. */
  kc_store_upload *u = NULL;
  OK(kc_store_upload_begin(s, &u, errbuf));
  assert_non_null(u);
  assert_int_equal(kc_store_upload_size(u), 0);
  size_t off = 0, step = 1;
  while (off < n) {
    size_t k = n - off < step ? n - off : step;
    OK(kc_store_upload_write(u, p + off, k, errbuf));
    off += k;
    step = step * 3 + 1;
    if (step > 1000000)
      step = 12345;
  }
  OK(kc_store_upload_write(u, p, 0, errbuf)); /* empty write: nothing */
  assert_int_equal(kc_store_upload_size(u), n);
  OK(kc_store_upload_commit(u, hex, &created, errbuf));
  assert_int_equal(created, 1);
  expect_blob_bytes(s, hex, p, n);
  assert_int_equal(count_files(f->dir), files0);

  /* The same bytes again: already present. */
  OK(kc_store_upload_begin(s, &u, errbuf));
  OK(kc_store_upload_write(u, p, n, errbuf));
  OK(kc_store_upload_commit(u, hex, &created, errbuf));
  assert_int_equal(created, 0);

  /* Abort: nothing stored, no file left behind. */
  char hex2[KC_HEX_LEN + 1];
  uint8_t *q = make_bytes(200000, 9, hex2);
  OK(kc_store_upload_begin(s, &u, errbuf));
  OK(kc_store_upload_write(u, q, 200000, errbuf));
  assert_int_equal(kc_store_upload_size(u), 200000);
  kc_store_upload_abort(u);
  kc_store_upload_abort(NULL);
  EXPECT(kc_store_blob_has(s, hex2, NULL), KC_NOT_FOUND);
  assert_int_equal(count_files(f->dir), files0);

  /* Digest mismatch: nothing stored, no file left, u freed (ASan). */
  OK(kc_store_upload_begin(s, &u, errbuf));
  OK(kc_store_upload_write(u, q, 199999, errbuf));
  EXPECT(kc_store_upload_commit(u, hex2, &created, errbuf), KC_DIGEST_MISMATCH);
  EXPECT(kc_store_blob_has(s, hex2, NULL), KC_NOT_FOUND);
  assert_int_equal(count_files(f->dir), files0);

  /* A bad digest string at commit: an error, u freed. */
  OK(kc_store_upload_begin(s, &u, errbuf));
  OK(kc_store_upload_write(u, q, 10, errbuf));
  EXPECT_IN(kc_store_upload_commit(u, "NOTHEX", &created, errbuf),
            KC_BAD_DIGEST, KC_EINVAL);

  /* An empty upload, its one write empty before any buffer exists (UBSan
   * caught a memcpy to NULL there). */
  OK(kc_store_upload_begin(s, &u, errbuf));
  OK(kc_store_upload_write(u, p, 0, errbuf));
  OK(kc_store_upload_commit(u, SHA_EMPTY, &created, errbuf));
  assert_int_equal(created, 1);
  OK(kc_store_blob_has(s, SHA_EMPTY, NULL));

  /* Two uploads at once, committed in the other order. */
  kc_store_upload *u1 = NULL, *u2 = NULL;
  OK(kc_store_upload_begin(s, &u1, errbuf));
  OK(kc_store_upload_begin(s, &u2, errbuf));
  OK(kc_store_upload_write(u1, p, 1000, errbuf));
  OK(kc_store_upload_write(u2, q, 200000, errbuf));
  OK(kc_store_upload_write(u1, p + 1000, 1000, errbuf));
  char hex1k[KC_HEX_LEN + 1];
  assert_int_equal(kc_sha256_hex(p, 2000, hex1k), KC_OK);
  OK(kc_store_upload_commit(u2, hex2, &created, errbuf));
  assert_int_equal(created, 1);
  OK(kc_store_upload_commit(u1, hex1k, &created, errbuf));
  assert_int_equal(created, 1);
  expect_blob_bytes(s, hex2, q, 200000);
  expect_blob_bytes(s, hex1k, p, 2000);
  assert_int_equal(count_files(f->dir), files0);

  kc_store_stats st = get_stats(s);
  assert_int_equal(st.blobs, 4);
  assert_int_equal(st.bytes_used, n + 200000 + 2000);
  kc_store_close(s);
  free(p);
  free(q);
}

/* ======================================================================= */
/* large blobs                                                              */

/* 256 MiB and a bit, from a sparse file through kc_store_blob_put_fd, read
 * back zero-copy and re-hashed; then 48 MiB of non-zero bytes through a
 * streaming upload. Slow-ish (hashes ~700 MiB): a few seconds, ~3x under
 * ASan. Memory: the blob is never in heap (the map and page cache hold it). */
static void test_large_blob_256mib(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  const uint64_t n = (256ull << 20) + 7;
  char *path = path_join(f->tmp, "big.bin");
  int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0600);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, (off_t)n), 0);
  /* A few non-zero bytes so that the content is not trivially zeros. */
  assert_int_equal(pwrite(fd, "head", 4, 0), 4);
  assert_int_equal(pwrite(fd, "mid", 3, (off_t)(n / 2)), 3);
  assert_int_equal(pwrite(fd, "tail", 4, (off_t)(n - 4)), 4);
  char hex[KC_HEX_LEN + 1];
  uint64_t fsize = 0;
  OK(kc_sha256_file(path, hex, &fsize, errbuf));
  assert_int_equal(fsize, n);
  int created = -1;
  assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
  OK(kc_store_blob_put_fd(s, hex, fd, n, &created, errbuf));
  assert_int_equal(created, 1);
  close(fd);
  unlink(path);
  uint64_t size = 0;
  OK(kc_store_blob_has(s, hex, &size));
  assert_int_equal(size, n);
  kc_store_read *r = NULL;
  const void *data = NULL;
  size_t len = 0;
  char back[KC_HEX_LEN + 1];
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_blob_get(r, hex, &data, &len));
  assert_int_equal(len, n);
  assert_memory_equal((const char *)data + n - 4, "tail", 4);
  assert_int_equal(kc_sha256_hex(data, len, back), KC_OK);
  assert_string_equal(back, hex);
  kc_store_read_end(r);
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.bytes_used, n);

  /* 48 MiB through the streaming upload in 1 MiB pieces. */
  const size_t chunk = 1 << 20, pieces = 48;
  uint8_t *p = malloc(chunk);
  assert_non_null(p);
  kc_sha256 *h = kc_sha256_new();
  assert_non_null(h);
  kc_store_upload *u = NULL;
  OK(kc_store_upload_begin(s, &u, errbuf));
  for (size_t i = 0; i < pieces; i++) {
    fill(p, chunk, 2000 + i);
    assert_int_equal(kc_sha256_update(h, p, chunk), KC_OK);
    OK(kc_store_upload_write(u, p, chunk, errbuf));
  }
  char uhex[KC_HEX_LEN + 1];
  assert_int_equal(kc_sha256_final(h, uhex), KC_OK);
  kc_sha256_free(h);
  assert_int_equal(kc_store_upload_size(u), chunk * pieces);
  OK(kc_store_upload_commit(u, uhex, &created, errbuf));
  assert_int_equal(created, 1);
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_blob_get(r, uhex, &data, &len));
  assert_int_equal(len, chunk * pieces);
  fill(p, chunk, 2000 + 17);
  assert_memory_equal((const uint8_t *)data + 17 * chunk, p, chunk);
  kc_store_read_end(r);

  /* A bundle over both, and verify re-hashes them. */
  char d[2][KC_HEX_LEN + 1];
  strcpy(d[0], hex);
  strcpy(d[1], uhex);
  uint64_t sz[2] = {n, chunk * pieces};
  kc_manifest *m = make_manifest(M1, 1, 2, d, sz);
  put_bundle(s, m, 1);
  listing *l = list_model(s, M1);
  assert_int_equal(l->n, 1);
  assert_int_equal(l->bytes[0], n + chunk * pieces);
  listing_free(l);
  OK(kc_store_verify(s, errbuf));
  kc_manifest_free(m);
  free(p);
  free(path);
  kc_store_close(s);
}

/* ======================================================================= */
/* bad input                                                                */

static void test_bad_digests(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  char good[KC_HEX_LEN + 1];
  uint8_t *p = make_bytes(100, 160, good);
  char upper[KC_HEX_LEN + 1];
  strcpy(upper, good);
  for (char *c = upper; *c; c++)
    if (*c >= 'a' && *c <= 'f')
      *c = (char)(*c - 'a' + 'A');
  char longer[KC_HEX_LEN + 2];
  snprintf(longer, sizeof longer, "%s0", good);
  char shorter[KC_HEX_LEN];
  memcpy(shorter, good, KC_HEX_LEN - 1);
  shorter[KC_HEX_LEN - 1] = '\0';
  char nonhex[KC_HEX_LEN + 1];
  strcpy(nonhex, good);
  nonhex[10] = 'g';
  char traversal[KC_HEX_LEN + 1];
  memset(traversal, 'a', KC_HEX_LEN);
  memcpy(traversal, "../../../../etc/passwd", 22);
  traversal[KC_HEX_LEN] = '\0';
  const char *bad[] = {upper, longer, shorter, nonhex, traversal, "", "0"};
  int created = -1;
  uint64_t size;
  kc_store_read *r = NULL;
  const void *data;
  const char *json;
  size_t len;
  int pfd[2];
  assert_int_equal(pipe(pfd), 0);
  write_all(pfd[1], p, 100);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *b = bad[i];
    EXPECT_IN(kc_store_blob_put(s, b, p, 100, &created, errbuf), KC_BAD_DIGEST,
              KC_EINVAL);
    EXPECT_IN(kc_store_blob_put_fd(s, b, pfd[0], 0, &created, errbuf),
              KC_BAD_DIGEST, KC_EINVAL);
    EXPECT_IN(kc_store_blob_has(s, b, &size), KC_BAD_DIGEST, KC_EINVAL);
    EXPECT_IN(kc_store_bundle_has(s, b), KC_BAD_DIGEST, KC_EINVAL, KC_BAD_KEY);
    EXPECT_IN(kc_store_bundle_delete(s, b, errbuf), KC_BAD_DIGEST, KC_EINVAL,
              KC_BAD_KEY);
    OK(kc_store_read_begin(s, &r));
    EXPECT_IN(kc_store_blob_get(r, b, &data, &len), KC_BAD_DIGEST, KC_EINVAL);
    EXPECT_IN(kc_store_bundle_get(r, b, &json, &len), KC_BAD_DIGEST, KC_EINVAL,
              KC_BAD_KEY);
    kc_store_read_end(r);
    kc_store_upload *u = NULL;
    OK(kc_store_upload_begin(s, &u, errbuf));
    OK(kc_store_upload_write(u, p, 100, errbuf));
    EXPECT_IN(kc_store_upload_commit(u, b, &created, errbuf), KC_BAD_DIGEST,
              KC_EINVAL);
  }
  close(pfd[0]);
  close(pfd[1]);
  /* Bad-digest lookups are not misses of a bundle either way; nothing was
   * stored. */
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.blobs, 0);
  assert_int_equal(st.hits, 0);
  /* The good one still works. */
  OK(kc_store_blob_put(s, good, p, 100, &created, errbuf));
  OK(kc_store_blob_has(s, good, &size));
  assert_int_equal(size, 100);
  free(p);
  kc_store_close(s);
}

/* The read every front end's GET calls (kc_store_blob_read and kin): a
 * hit leaves the read open on the map's bytes; a miss without a tier ends
 * it and says what is missing. */
static void test_read_for_a_get(void **state) {
  fx *f = *state;
  kc_store *s = open_store(f->dir, 0, 0, 0);
  char hex[KC_HEX_LEN + 1];
  put_seed(s, 5000, 7, hex);
  uint8_t *p = make_bytes(5000, 7, hex);
  kc_store_read *rd = NULL;
  kc_store_blob_view v = {.heap = (void *)1};
  OK(kc_store_blob_read(s, hex, &rd, &v, errbuf));
  assert_non_null(rd);
  assert_null(v.heap);
  assert_int_equal(v.len, 5000);
  assert_int_equal(v.enc, KC_STORE_RAW);
  assert_int_equal(v.size, 5000);
  assert_memory_equal(v.data, p, 5000);
  kc_store_read_end(rd);

  rd = NULL;
  v.heap = (void *)1;
  EXPECT(kc_store_blob_read(s, Z64, &rd, &v, errbuf), KC_NOT_FOUND);
  assert_null(rd);
  assert_null(v.heap);
  assert_string_equal(errbuf, "no blob " Z64);
  size_t len = 0;
  const char *json = NULL;
  EXPECT(kc_store_bundle_read(s, Z64, &rd, &json, &len, errbuf), KC_NOT_FOUND);
  assert_null(rd);
  assert_string_equal(errbuf, "no bundle " Z64);
  EXPECT(kc_store_kv_read_through(s, "k", 1, 0, errbuf), KC_NOT_FOUND);
  assert_string_equal(errbuf, "no such key");
  free(p);
  kc_store_close(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      ST(test_open_creates_dir_and_empty_stats),
      ST(test_open_bad),
      ST(test_blob_roundtrip),
      ST(test_blob_empty),
      ST(test_blob_digest_mismatch),
      ST(test_blob_put_fd_file),
      ST(test_blob_put_fd_pipe),
      ST(test_upload_stream),
      ST(test_large_blob_256mib),
      ST(test_bad_digests),
      ST(test_read_for_a_get),
  };
  return storetest_run("store_blob", tests, sizeof tests / sizeof tests[0]);
}
