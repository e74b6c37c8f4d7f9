/* test_store_zstd.c: store/ unit tests of blobs held zstd-compressed (issue
 * 18): compressible, incompressible, empty and large blobs through put,
 * put_fd and streamed uploads; uploads that arrive compressed (kept as
 * received, stored raw when not worth it or when the store does not
 * compress; corrupt, truncated and bomb frames refused, nothing stored);
 * piece-by-piece reads decoded or as held; verify and the scrub catching a
 * frame that decompresses to the wrong digest; a store written without
 * compression opened with it; RESP values. Fixtures: storetest.h. */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define ZSTD_STATIC_LINKING_ONLY /* ZSTD_getFrameHeader */
#include <zstd.h>

#include <lmdb.h>

#include "storetest.h"
#include "zstdframe.h"

/* ZSTD_createDCtx, linked with --wrap: fails while dctx_fail is set. */
ZSTD_DCtx *__real_ZSTD_createDCtx(void);
ZSTD_DCtx *__wrap_ZSTD_createDCtx(void);
static int dctx_fail;
ZSTD_DCtx *__wrap_ZSTD_createDCtx(void) {
  return dctx_fail ? NULL : __real_ZSTD_createDCtx();
}

static kc_store *open_z(const char *dir, int level) {
  kc_store_opts o;
  memset(&o, 0, sizeof o);
  o.dir = dir;
  o.map_size = 256u << 20;
  o.compress_level = level;
  kc_store *s = NULL;
  OK(kc_store_open(&o, &s, errbuf));
  return s;
}

/* Text-like bytes: a few words repeated with a counter, as a cubin's tables
 * repeat (about a quarter of their size at level 3). */
static uint8_t *text_bytes(size_t n, uint64_t seed, char hex[KC_HEX_LEN + 1]) {
  uint8_t *p = malloc(n ? n : 1);
  assert_non_null(p);
  for (size_t i = 0; i < n;) {
    char w[64];
    int k = snprintf(w, sizeof w, "ld.global.f32 %%r%llu, [%%rd%zu];\n",
                     (unsigned long long)seed, (i / 37) % 97);
    for (int j = 0; j < k && i < n; j++)
      p[i++] = (uint8_t)w[j];
  }
  OK(kc_sha256_hex(p, n, hex));
  return p;
}

static void expect_content(kc_store *s, const char *hex, const uint8_t *want,
                           size_t n, size_t piece) {
  kc_store_blob_stream *b = NULL;
  uint64_t len = 0, size = 0;
  kc_store_enc enc = KC_STORE_ZSTD;
  OK(kc_store_blob_stream_open(s, hex, 1, &b, &len, &enc, &size));
  assert_int_equal(len, n);
  assert_int_equal(size, n);
  assert_int_equal(enc, KC_STORE_RAW);
  uint8_t *got = malloc(n + piece);
  size_t at = 0;
  long r;
  while ((r = kc_store_blob_stream_read(b, (char *)got + at, piece)) > 0)
    at += (size_t)r;
  assert_int_equal(r, 0);
  assert_int_equal(at, n);
  assert_memory_equal(got, want, n);
  kc_store_blob_stream_free(b);
  free(got);
}

static kc_store_enc enc_of(kc_store *s, const char *hex, size_t *stored) {
  kc_store_read *r;
  OK(kc_store_read_begin(s, &r));
  const void *d;
  size_t len;
  kc_store_enc enc;
  uint64_t size;
  OK(kc_store_blob_get_stored(r, hex, &d, &len, &enc, &size));
  kc_store_read_end(r);
  if (stored)
    *stored = len;
  return enc;
}

/* A GET's read (kc_store_blob_read) of a blob held compressed: one read,
 * left open on the held frame, which decodes to the content; the content's
 * size beside it. */
static void expect_read_as_held(kc_store *s, const char *hex, const void *p,
                                size_t n, size_t stored) {
  kc_store_read_stats before, during;
  kc_store_read_stats_get(s, &before);
  kc_store_read *rd = NULL;
  kc_store_blob_view v;
  OK(kc_store_blob_read(s, hex, &rd, &v, errbuf));
  kc_store_read_stats_get(s, &during);
  assert_int_equal(during.open, before.open + 1);
  assert_non_null(rd);
  assert_null(v.heap);
  assert_int_equal(v.enc, KC_STORE_ZSTD);
  assert_int_equal(v.len, stored);
  assert_int_equal(v.size, n);
  uint8_t *out = malloc(n);
  assert_non_null(out);
  OK(kc_store_zstd_decode(v.data, v.len, out, n, errbuf));
  assert_memory_equal(out, p, n);
  free(out);
  kc_store_read_end(rd);
  kc_store_read_stats_get(s, &during);
  assert_int_equal(during.open, before.open);
}

static void test_compressible_kept_compressed(void **state) {
  fx *f = *state;
  kc_store *s = open_z(f->dir, 3);
  char hex[KC_HEX_LEN + 1];
  const size_t n = 12280;
  uint8_t *p = text_bytes(n, 1, hex);
  int created = 0;
  OK(kc_store_blob_put(s, hex, p, n, &created, errbuf));
  assert_int_equal(created, 1);
  size_t stored = 0;
  assert_int_equal(enc_of(s, hex, &stored), KC_STORE_ZSTD);
  assert_true(stored <= n / 2); /* kept when it halves the content */
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.bytes_used, stored); /* stored bytes are counted */
  assert_int_equal(st.bytes_raw, n);
  uint64_t size = 0;
  OK(kc_store_blob_has(s, hex, &size));
  assert_int_equal(size, n); /* the content's size */
  kc_store_read *r;
  OK(kc_store_read_begin(s, &r));
  const void *d;
  size_t len;
  EXPECT(kc_store_blob_get(r, hex, &d, &len), KC_STORE_ENCODED);
  kc_store_read_end(r);
  expect_read_as_held(s, hex, p, n, stored);
  expect_content(s, hex, p, n, 1000);
  OK(kc_store_blob_check(s, hex, errbuf));
  OK(kc_store_verify(s, errbuf));
  /* a bundle over it, deleted, collected: the counters come back to 0 */
  kc_manifest *m = make_manifest(M1, 1, 1, &hex, (uint64_t[]){n});
  put_bundle(s, m, 1);
  OK(kc_store_verify(s, errbuf));
  OK(kc_store_bundle_delete(s, m->key, errbuf));
  OK(kc_store_gc(s, INT64_MAX / 2, errbuf));
  st = get_stats(s);
  assert_false(blob_present(s, hex));
  assert_int_equal(st.bytes_used, st.bytes_raw);
  OK(kc_store_verify(s, errbuf));
  kc_manifest_free(m);
  kc_store_close(s);
  free(p);
}

static void test_incompressible_empty_small_raw(void **state) {
  fx *f = *state;
  kc_store *s = open_z(f->dir, 3);
  char hex[KC_HEX_LEN + 1];
  size_t sizes[] = {0, 1, 63, 100000};
  for (size_t i = 0; i < 4; i++) {
    uint8_t *p = make_bytes(sizes[i], 40 + i, hex);
    int created;
    OK(kc_store_blob_put(s, hex, p, sizes[i], &created, errbuf));
    assert_int_equal(enc_of(s, hex, NULL), KC_STORE_RAW);
    kc_store_read *r;
    OK(kc_store_read_begin(s, &r));
    const void *d;
    size_t len;
    OK(kc_store_blob_get(r, hex, &d, &len)); /* zero-copy as always */
    assert_int_equal(len, sizes[i]);
    kc_store_read_end(r);
    expect_content(s, hex, p, sizes[i], 4096);
    free(p);
  }
  /* a tiny compressible one stays raw too: no frame pays under 64 bytes */
  char small[40];
  memset(small, 'a', sizeof small);
  OK(kc_sha256_hex(small, sizeof small, hex));
  OK(kc_store_blob_put(s, hex, small, sizeof small, NULL, errbuf));
  assert_int_equal(enc_of(s, hex, NULL), KC_STORE_RAW);
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.bytes_used, st.bytes_raw);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
}

/* Large: through put_fd (a file) and a streamed upload spilled to disk. */
static void test_large_fd_and_upload(void **state) {
  fx *f = *state;
  kc_store *s = open_z(f->dir, 3);
  char hex[KC_HEX_LEN + 1], hex2[KC_HEX_LEN + 1];
  const size_t n = 6u << 20;
  uint8_t *p = text_bytes(n, 7, hex);
  char *path = path_join(f->tmp, "big");
  int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0600);
  write_all(fd, p, n);
  lseek(fd, 0, SEEK_SET);
  int created = 0;
  OK(kc_store_blob_put_fd(s, hex, fd, n, &created, errbuf));
  close(fd);
  assert_int_equal(created, 1);
  assert_int_equal(enc_of(s, hex, NULL), KC_STORE_ZSTD);
  expect_content(s, hex, p, n, 128 * 1024);
  uint8_t *q = text_bytes(n, 8, hex2);
  kc_store_upload *u;
  OK(kc_store_upload_begin(s, &u, errbuf));
  for (size_t at = 0; at < n; at += 300000)
    OK(kc_store_upload_write(u, q + at, n - at < 300000 ? n - at : 300000,
                             errbuf));
  OK(kc_store_upload_commit(u, hex2, &created, errbuf));
  assert_int_equal(enc_of(s, hex2, NULL), KC_STORE_ZSTD);
  expect_content(s, hex2, q, n, 100000);
  /* a wrong digest on put_fd: nothing stored */
  fd = open(path, O_RDONLY);
  EXPECT(kc_store_blob_put_fd(s, Z64, fd, n, &created, errbuf),
         KC_DIGEST_MISMATCH);
  close(fd);
  assert_false(blob_present(s, Z64));
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
  unlink(path);
  free(path);
  free(p);
  free(q);
}

static void *frame_of(const void *p, size_t n, int level, size_t *zlen) {
  size_t cap = ZSTD_compressBound(n);
  void *z = malloc(cap);
  *zlen = ZSTD_compress(z, cap, p, n, level);
  assert_false(ZSTD_isError(*zlen));
  return z;
}

static kc_err upload_frame(kc_store *s, const char *hex, const void *z,
                           size_t zlen, uint64_t max_out, size_t piece) {
  kc_store_upload *u;
  OK(kc_store_upload_begin(s, &u, errbuf));
  kc_store_upload_zstd(u, max_out);
  errbuf[0] = '\0';
  for (size_t at = 0; at < zlen; at += piece) {
    kc_err e = kc_store_upload_write(
        u, (const char *)z + at, zlen - at < piece ? zlen - at : piece, errbuf);
    if (e) {
      kc_store_upload_abort(u);
      return e;
    }
  }
  return kc_store_upload_commit(u, hex, NULL, errbuf);
}

static void test_upload_arrives_compressed(void **state) {
  fx *f = *state;
  kc_store *s = open_z(f->dir, 3);
  char hex[KC_HEX_LEN + 1];
  const size_t n = 200000;
  uint8_t *p = text_bytes(n, 3, hex);
  size_t zlen;
  void *z = frame_of(p, n, 5, &zlen);
  OK(upload_frame(s, hex, z, zlen, 1u << 30, 7000));
  size_t stored = 0;
  assert_int_equal(enc_of(s, hex, &stored), KC_STORE_ZSTD);
  assert_int_equal(stored, zlen); /* kept as received */
  kc_store_read *r;
  OK(kc_store_read_begin(s, &r));
  const void *d;
  size_t len;
  kc_store_enc enc;
  OK(kc_store_blob_get_stored(r, hex, &d, &len, &enc, NULL));
  assert_memory_equal(d, z, zlen);
  kc_store_read_end(r);
  expect_content(s, hex, p, n, 65536);
  /* incompressible content sent as a frame: stored raw */
  char hex2[KC_HEX_LEN + 1];
  uint8_t *q = make_bytes(50000, 9, hex2);
  size_t qlen;
  void *qz = frame_of(q, 50000, 1, &qlen);
  OK(upload_frame(s, hex2, qz, qlen, 1u << 30, 4096));
  assert_int_equal(enc_of(s, hex2, &stored), KC_STORE_RAW);
  assert_int_equal(stored, 50000);
  expect_content(s, hex2, q, 50000, 4096);
  /* the empty content as a frame */
  size_t elen;
  void *ez = frame_of("", 0, 3, &elen);
  OK(upload_frame(s, SHA_EMPTY, ez, elen, 1u << 30, 100));
  assert_int_equal(enc_of(s, SHA_EMPTY, &stored), KC_STORE_RAW);
  assert_int_equal(stored, 0);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
  /* a store that does not compress stores the content raw */
  char *d2 = path_join(f->tmp, "plain");
  s = open_z(d2, 0);
  OK(upload_frame(s, hex, z, zlen, 1u << 30, 7000));
  assert_int_equal(enc_of(s, hex, &stored), KC_STORE_RAW);
  assert_int_equal(stored, n);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
  free(d2);
  free(p);
  free(z);
  free(q);
  free(qz);
  free(ez);
}

static void test_bad_frames_store_nothing(void **state) {
  fx *f = *state;
  kc_store *s = open_z(f->dir, 3);
  char hex[KC_HEX_LEN + 1];
  const size_t n = 100000;
  uint8_t *p = text_bytes(n, 4, hex);
  size_t zlen;
  uint8_t *z = frame_of(p, n, 3, &zlen);
  /* truncated: a clean prefix, then the body ends */
  EXPECT(upload_frame(s, hex, z, zlen / 2, 1u << 30, 1000), KC_EINVAL);
  assert_non_null(strstr(errbuf, "truncated"));
  /* corrupt: not a frame at all */
  EXPECT(upload_frame(s, hex, p, n, 1u << 30, 1000), KC_EINVAL);
  assert_non_null(strstr(errbuf, "zstd"));
  /* corrupt inside: a frame whose block header is garbage */
  uint8_t *bad = malloc(zlen);
  memcpy(bad, z, zlen);
  memset(bad + 6, 0xff, 8);
  kc_err e = upload_frame(s, hex, bad, zlen, 1u << 30, 1000);
  assert_true(e == KC_EINVAL || e == KC_DIGEST_MISMATCH);
  /* a bomb: 64 MiB of zeros in a few KiB, with a limit of 1 MiB of output */
  size_t bn = 64u << 20, blen;
  uint8_t *zeros = calloc(1, bn);
  char bhex[KC_HEX_LEN + 1];
  OK(kc_sha256_hex(zeros, bn, bhex));
  void *bomb = frame_of(zeros, bn, 3, &blen);
  assert_true(blen < 65536);
  EXPECT(upload_frame(s, bhex, bomb, blen, 1u << 20, 4096), KC_TOO_LARGE);
  /* a good frame under another name */
  EXPECT(upload_frame(s, Z64, z, zlen, 1u << 30, 1000), KC_DIGEST_MISMATCH);
  assert_false(blob_present(s, hex));
  assert_false(blob_present(s, bhex));
  assert_false(blob_present(s, Z64));
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.blobs, 0);
  assert_int_equal(st.bytes_used, 0);
  assert_int_equal(count_files(f->dir), 3); /* data, lock, kcached.lock */
  kc_store_close(s);
  free(p);
  free(z);
  free(bad);
  free(zeros);
  free(bomb);
}

/* Flips a byte in the middle of every copy of pat in dir's files. */
static int flip_in_dir(const char *dir, const uint8_t *pat, size_t plen) {
  DIR *dp = opendir(dir);
  assert_non_null(dp);
  struct dirent *de;
  int flipped = 0;
  while ((de = readdir(dp)) != NULL) {
    char *path = path_join(dir, de->d_name);
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
      int fd = open(path, O_RDWR);
      uint8_t *buf = malloc((size_t)st.st_size);
      assert_int_equal(pread(fd, buf, (size_t)st.st_size, 0), st.st_size);
      uint8_t *hit = memmem(buf, (size_t)st.st_size, pat, plen);
      if (hit) {
        /* a literal byte near the end: the frame still decodes, to other
         * bytes (no checksum in the frame) or fails: both are rot */
        uint8_t b = hit[plen - 9] ^ 0x01;
        assert_int_equal(pwrite(fd, &b, 1, hit - buf + (off_t)plen - 9), 1);
        flipped++;
      }
      free(buf);
      close(fd);
    }
    free(path);
  }
  closedir(dp);
  return flipped;
}

static void test_verify_and_scrub_catch_bad_frame(void **state) {
  fx *f = *state;
  kc_store *s = open_z(f->dir, 3);
  char hex[KC_HEX_LEN + 1];
  const size_t n = 30000;
  uint8_t *p = text_bytes(n, 5, hex);
  OK(kc_store_blob_put(s, hex, p, n, NULL, errbuf));
  kc_store_read *r;
  OK(kc_store_read_begin(s, &r));
  const void *d;
  size_t zlen;
  kc_store_enc enc;
  OK(kc_store_blob_get_stored(r, hex, &d, &zlen, &enc, NULL));
  assert_int_equal(enc, KC_STORE_ZSTD);
  uint8_t *frame = malloc(zlen);
  memcpy(frame, d, zlen);
  kc_store_read_end(r);
  kc_manifest *m = make_manifest(M1, 1, 1, &hex, (uint64_t[]){n});
  put_bundle(s, m, 1);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
  assert_true(flip_in_dir(f->dir, frame, zlen) >= 1);
  s = open_z(f->dir, 3);
  EXPECT(kc_store_verify(s, errbuf), KC_CORRUPT);
  EXPECT(kc_store_blob_check(s, hex, errbuf), KC_CORRUPT);
  kc_store_scrub sc = {0};
  for (int i = 0; i < 4 && !sc.removed; i++)
    OK(kc_store_scrub_step(s, &sc, UINT64_MAX, errbuf));
  assert_string_equal(sc.bad, hex);
  assert_int_equal(sc.removed, 1);
  assert_false(blob_present(s, hex));
  assert_false(bundle_present(s, m->key));
  OK(kc_store_verify(s, errbuf));
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.bytes_used, st.bytes_raw);
  kc_store_close(s);
  kc_manifest_free(m);
  free(frame);
  free(p);
}

/* A store written with compression off (the old layout: raw blobs, short
 * records) opened with it: old blobs read raw, new ones compressed, the
 * byte count adds up; and back to off: the compressed ones still read. */
static void test_old_store_keeps_working(void **state) {
  fx *f = *state;
  kc_store *s = open_z(f->dir, 0);
  char h1[KC_HEX_LEN + 1], h2[KC_HEX_LEN + 1];
  uint8_t *p1 = text_bytes(20000, 11, h1), *p2 = text_bytes(20000, 12, h2);
  OK(kc_store_blob_put(s, h1, p1, 20000, NULL, errbuf));
  assert_int_equal(enc_of(s, h1, NULL), KC_STORE_RAW);
  kc_manifest *m1 = make_manifest(M1, 1, 1, &h1, (uint64_t[]){20000});
  put_bundle(s, m1, 1);
  kc_store_close(s);
  s = open_z(f->dir, 3);
  assert_int_equal(enc_of(s, h1, NULL), KC_STORE_RAW);
  expect_content(s, h1, p1, 20000, 3000);
  OK(kc_store_blob_put(s, h2, p2, 20000, NULL, errbuf));
  assert_int_equal(enc_of(s, h2, NULL), KC_STORE_ZSTD);
  char both[2][KC_HEX_LEN + 1];
  strcpy(both[0], h1);
  strcpy(both[1], h2);
  kc_manifest *m2 = make_manifest(M2, 1, 2, both, (uint64_t[]){20000, 20000});
  put_bundle(s, m2, 1);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
  s = open_z(f->dir, 0);
  expect_content(s, h2, p2, 20000, 3000);
  OK(kc_store_bundle_delete(s, m1->key, errbuf));
  OK(kc_store_bundle_delete(s, m2->key, errbuf));
  OK(kc_store_gc(s, INT64_MAX / 2, errbuf));
  kc_store_stats st = get_stats(s);
  assert_int_equal(st.blobs, 0);
  assert_int_equal(st.bytes_used, 0);
  assert_int_equal(st.bytes_raw, 0);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
  kc_manifest_free(m1);
  kc_manifest_free(m2);
  free(p1);
  free(p2);
}

/* RESP values follow the same rule; a GET decodes them. */
static void test_kv_values(void **state) {
  fx *f = *state;
  kc_store *s = open_z(f->dir, 3);
  char hex[KC_HEX_LEN + 1];
  uint8_t *p = text_bytes(9000, 13, hex);
  kc_store_kv_op op = {
      .op = KC_KV_SET, .key = "k", .klen = 1, .val = p, .vlen = 9000};
  OK(kc_store_kv_apply(s, &op, 1, 0, errbuf));
  assert_int_equal(op.err, KC_OK);
  assert_int_equal(enc_of(s, hex, NULL), KC_STORE_ZSTD);
  kc_store_read *r;
  OK(kc_store_read_begin(s, &r));
  kc_store_kv_val v;
  OK(kc_store_kv_get(r, "k", 1, 0, &v));
  assert_int_equal(v.enc, KC_STORE_ZSTD);
  assert_int_equal(v.size, 9000);
  uint8_t *out = malloc(9000);
  OK(kc_store_zstd_decode(v.data, v.len, out, 9000, errbuf));
  assert_memory_equal(out, p, 9000);
  kc_store_read_end(r);
  /* SET ... GET hands back the old value decoded */
  kc_store_kv_op op2 = {.op = KC_KV_SET,
                        .key = "k",
                        .klen = 1,
                        .val = "x",
                        .vlen = 1,
                        .flags = KC_KV_GET};
  OK(kc_store_kv_apply(s, &op2, 1, 0, errbuf));
  assert_int_equal(op2.old_len, 9000);
  assert_memory_equal(op2.old, p, 9000);
  free(op2.old);
  /* redis-benchmark's kind of value, printable random letters: its frame
   * saves about a quarter, all entropy-coded literals, dear to decode on
   * every GET: kept raw */
  uint8_t letters[4096];
  uint64_t x = 88172645463325252u; /* xorshift64 */
  for (size_t i = 0; i < sizeof letters; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    letters[i] = (uint8_t)('0' + x % 75);
  }
  kc_store_kv_op op3 = {.op = KC_KV_SET,
                        .key = "b",
                        .klen = 1,
                        .val = letters,
                        .vlen = sizeof letters};
  OK(kc_store_kv_apply(s, &op3, 1, 0, errbuf));
  size_t zl = 0;
  void *zf = frame_of(letters, sizeof letters, 3, &zl);
  assert_true(zl < sizeof letters - sizeof letters / 8); /* saves an eighth */
  free(zf);
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_kv_get(r, "b", 1, 0, &v));
  assert_int_equal(v.enc, KC_STORE_RAW);
  assert_memory_equal(v.data, letters, sizeof letters);
  kc_store_read_end(r);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
  free(out);
  free(p);
}

/* A PUT's frame asking for a decoding window over 2^23 (2^27: 128 MiB a
 * reader once it is stored) is refused with a clear error, nothing stored;
 * one at 2^23 is taken. The decoder budget is whole again after both. */
static void test_wide_window_refused(void **state) {
  fx *f = *state;
  kc_store *s = open_z(f->dir, 3);
  size_t n = 12u << 20, zlen;
  uint8_t *zeros = calloc(1, n);
  char hex[KC_HEX_LEN + 1];
  OK(kc_sha256_hex(zeros, n, hex));
  void *z = kc_test_wide_frame(zeros, n, 27, &zlen);
  assert_true(zlen < 65536);
  EXPECT(upload_frame(s, hex, z, zlen, 1u << 30, 65536), KC_EINVAL);
  assert_non_null(strstr(errbuf, "window"));
  assert_false(blob_present(s, hex));
  assert_int_equal(kc_store_zstd_decode_memory(), 0);
  free(z);
  z = kc_test_wide_frame(zeros, n, 23, &zlen);
  OK(upload_frame(s, hex, z, zlen, 1u << 30, 65536));
  assert_int_equal(enc_of(s, hex, NULL), KC_STORE_ZSTD);
  expect_content(s, hex, zeros, n, 128 * 1024);
  assert_int_equal(kc_store_zstd_decode_memory(), 0);
  kc_store_close(s);
  free(z);
  free(zeros);
}

/* Readers decoding on the way share one process-wide budget of decoder
 * memory: opening streams of a blob with a wide window stops with KC_BUSY
 * long before their windows add up to gigabytes, and each stream closed
 * gives its share back. Frames written by the store at level 22 keep
 * their window within 2^23. */
static void test_decoder_budget(void **state) {
  fx *f = *state;
  kc_store *s = open_z(f->dir, 22);
  size_t n = 24u << 20;
  uint8_t *p = malloc(n);
  for (size_t i = 0; i < n; i++) /* compressible, but not to nothing */
    p[i] = (uint8_t)((i * 2654435761u) >> 24 & 0x0f);
  char hex[KC_HEX_LEN + 1];
  OK(kc_sha256_hex(p, n, hex));
  int created;
  OK(kc_store_blob_put(s, hex, p, n, &created, errbuf));
  kc_store_read *r;
  const void *z;
  size_t zlen;
  kc_store_enc enc;
  OK(kc_store_read_begin(s, &r));
  OK(kc_store_blob_get_stored(r, hex, &z, &zlen, &enc, NULL));
  assert_int_equal(enc, KC_STORE_ZSTD);
  ZSTD_frameHeader fh;
  assert_int_equal(ZSTD_getFrameHeader(&fh, z, zlen), 0);
  assert_true(fh.windowSize <= (8u << 20)); /* level 22 asks for 2^27 */
  kc_store_read_end(r);
  enum { MAXS = 400 };
  kc_store_blob_stream *b[MAXS];
  size_t open = 0;
  kc_err e = KC_OK;
  while (open < MAXS && (e = kc_store_blob_stream_open(
                             s, hex, 1, &b[open], NULL, NULL, NULL)) == KC_OK)
    open++;
  assert_int_equal(e, KC_BUSY);
  assert_true(open >= 16); /* 8 MiB windows: room for 30 */
  assert_true(kc_store_zstd_decode_memory() <= (256u << 20));
  kc_store_blob_stream_free(b[--open]);
  OK(kc_store_blob_stream_open(s, hex, 1, &b[open++], NULL, NULL, NULL));
  /* a stream as held (the frame itself) takes no decoder */
  kc_store_blob_stream *raw;
  OK(kc_store_blob_stream_open(s, hex, 0, &raw, NULL, NULL, NULL));
  kc_store_blob_stream_free(raw);
  while (open)
    kc_store_blob_stream_free(b[--open]);
  assert_int_equal(kc_store_zstd_decode_memory(), 0);
  expect_content(s, hex, p, n, 128 * 1024);
  assert_int_equal(kc_store_zstd_decode_memory(), 0);
  kc_store_close(s);
  free(p);
}

/* ---- frames stored before the window bound ---- */

/* A store holding blob hex as the frame z, as one written before frames'
 * windows were bounded would: hex is put first (the store's own frame),
 * then its held bytes, blobmeta's stored length and bytes_used are
 * rewritten under the store's back. The blobmeta record's layout: size,
 * refs, created, orphan_since, stored (u64 each), enc, pad (u32). */
static void store_as_old(const char *dir, const char *hex, uint64_t n,
                         const void *z, size_t zlen) {
  char *path = path_join(dir, "src");
  int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0600);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, (off_t)n), 0); /* n zeros, sparse */
  kc_store *s = open_z(dir, 3);
  int created = 0;
  OK(kc_store_blob_put_fd(s, hex, fd, n, &created, errbuf));
  close(fd);
  unlink(path);
  free(path);
  assert_int_equal(enc_of(s, hex, NULL), KC_STORE_ZSTD);
  kc_store_close(s);
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi blobs, blobmeta, meta;
  assert_int_equal(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, 32);
  assert_int_equal(mdb_env_open(env, dir, 0, 0640), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
  assert_int_equal(mdb_dbi_open(txn, "blobs", 0, &blobs), 0);
  assert_int_equal(mdb_dbi_open(txn, "blobmeta", 0, &blobmeta), 0);
  assert_int_equal(mdb_dbi_open(txn, "meta", 0, &meta), 0);
  MDB_val k = {KC_HEX_LEN, (void *)hex}, v;
  assert_int_equal(mdb_get(txn, blobs, &k, &v), 0);
  uint64_t was = v.mv_size, stored = zlen, used;
  v = (MDB_val){zlen, (void *)z};
  assert_int_equal(mdb_put(txn, blobs, &k, &v, 0), 0);
  unsigned char rec[48];
  assert_int_equal(mdb_get(txn, blobmeta, &k, &v), 0);
  assert_int_equal(v.mv_size, sizeof rec);
  memcpy(rec, v.mv_data, sizeof rec);
  memcpy(rec + 32, &stored, sizeof stored);
  v = (MDB_val){sizeof rec, rec};
  assert_int_equal(mdb_put(txn, blobmeta, &k, &v, 0), 0);
  MDB_val uk = {10, "bytes_used"};
  assert_int_equal(mdb_get(txn, meta, &uk, &v), 0);
  memcpy(&used, v.mv_data, sizeof used);
  used = used - was + zlen;
  v = (MDB_val){sizeof used, &used};
  assert_int_equal(mdb_put(txn, meta, &uk, &v, 0), 0);
  assert_int_equal(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
}

/* n zeros held as blob hex (set here) in one frame with a 2^wlog window,
 * as a store written before the bound would hold them (store_as_old). */
static void plant_old_zeros(const char *dir, size_t n, int wlog,
                            char hex[KC_HEX_LEN + 1]) {
  uint8_t *zeros = calloc(1, n); /* untouched: the shared zero page */
  assert_non_null(zeros);
  OK(kc_sha256_hex(zeros, n, hex));
  size_t zlen;
  void *z = kc_test_wide_frame(zeros, n, wlog, &zlen);
  free(zeros);
  ZSTD_frameHeader fh;
  assert_int_equal(ZSTD_getFrameHeader(&fh, z, zlen), 0);
  assert_int_equal(fh.windowSize, (unsigned long long)1 << wlog);
  store_as_old(dir, hex, n, z, zlen);
  free(z);
}

/* Peak resident memory (VmHWM) in KiB since the last reset_hwm. */
static long hwm_kib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %ld kB", &kib) == 1)
      break;
  if (f)
    fclose(f);
  return kib;
}

static int reset_hwm(void) {
  int fd = open("/proc/self/clear_refs", O_WRONLY);
  int ok = fd >= 0 && write(fd, "5", 1) == 1;
  if (fd >= 0)
    close(fd);
  return ok;
}

/* A 256 MiB blob of zeros held as a frame with a 32 MiB window (stored
 * before the bound): verify and the scrub hash it as a stream through a
 * decoder with that window, never a buffer of the content's size, and
 * find it sound. Peak memory (VmHWM, reset before) grows by the window
 * and some, well under the 256 MiB a whole decode would touch. */
static void test_old_wide_frame_streams(void **state) {
  fx *f = *state;
  char hex[KC_HEX_LEN + 1];
  plant_old_zeros(f->dir, 256u << 20, 25, hex); /* a 32 MiB window */
  kc_store *s = open_z(f->dir, 3);
  if (!reset_hwm()) {
    kc_store_close(s);
    skip();
  }
  /* each measured from its own reset: a sanitizer's quarantine keeps
   * what the one before freed resident */
  long before = hwm_kib();
  OK(kc_store_verify(s, errbuf));
  long grew = hwm_kib() - before;
  assert_true(reset_hwm());
  before = hwm_kib();
  kc_store_scrub sc;
  memset(&sc, 0, sizeof sc);
  OK(kc_store_scrub_step(s, &sc, UINT64_MAX, errbuf));
  long grew2 = hwm_kib() - before;
  print_message("256 MiB held with a 32 MiB window: peak RSS +%ld KiB "
                "(verify), +%ld KiB (scrub)\n",
                grew, grew2);
  assert_true(before > 0);
  assert_true(grew < 96 * 1024);
  assert_true(grew2 < 96 * 1024);
  OK(kc_store_blob_check(s, hex, errbuf));
  assert_string_equal(sc.bad, "");
  assert_true(blob_present(s, hex));
  assert_int_equal(kc_store_zstd_decode_memory(), 0);
  kc_store_close(s);
}

/* Its decoder is charged to the decoder budget as a GET's stream is: a
 * 2^27 window (128 MiB) beside a stream holding another does not fit, and
 * verify says the blob is not verified (KC_BUSY) rather than decoding it
 * whole; the scrub keeps it, counts it and goes on. Both go on past it to
 * a second such blob. With the stream closed both pass,
 * and the budget is whole again. */
static void test_old_wide_frame_over_budget(void **state) {
  fx *f = *state;
  size_t n = 4u << 20;
  char hex[KC_HEX_LEN + 1], hex2[KC_HEX_LEN + 1];
  plant_old_zeros(f->dir, n, 27, hex);
  /* a second such blob (zeros, one byte fewer): verify and the scrub go on
   * past the first */
  plant_old_zeros(f->dir, n - 1, 27, hex2);
  kc_store *s = open_z(f->dir, 3);
  kc_store_blob_stream *b;
  OK(kc_store_blob_stream_open(s, hex, 1, &b, NULL, NULL, NULL));
  uint64_t held = kc_store_zstd_decode_memory();
  assert_true(held > (128u << 20));
  EXPECT(kc_store_verify(s, errbuf), KC_BUSY);
  assert_non_null(strstr(errbuf, "2 blob(s) not verified"));
  kc_store_scrub sc;
  memset(&sc, 0, sizeof sc);
  OK(kc_store_scrub_step(s, &sc, UINT64_MAX, errbuf));
  assert_string_equal(sc.bad, "");
  assert_true(blob_present(s, hex));
  assert_true(blob_present(s, hex2));
  kc_store_stats st;
  OK(kc_store_stats_get(s, &st));
  assert_int_equal(st.scrub_skipped, 2);
  assert_int_equal(kc_store_zstd_decode_memory(), held);
  kc_store_blob_stream_free(b);
  OK(kc_store_verify(s, errbuf));
  OK(kc_store_scrub_step(s, &sc, UINT64_MAX, errbuf));
  assert_string_equal(sc.bad, "");
  uint8_t *zeros = calloc(1, n);
  assert_non_null(zeros);
  expect_content(s, hex, zeros, n, 128 * 1024);
  free(zeros);
  assert_int_equal(kc_store_zstd_decode_memory(), 0);
  kc_store_close(s);
}

/* A decoder for an old wide frame that cannot be made (out of memory)
 * gives back what was charged for it: the budget is whole again. */
static void test_wide_decoder_fails_releases(void **state) {
  fx *f = *state;
  char hex[KC_HEX_LEN + 1];
  plant_old_zeros(f->dir, 4u << 20, 25, hex);
  kc_store *s = open_z(f->dir, 3);
  assert_int_equal(kc_store_zstd_decode_memory(), 0);
  dctx_fail = 1;
  EXPECT(kc_store_verify(s, errbuf), KC_NOMEM);
  dctx_fail = 0;
  assert_int_equal(kc_store_zstd_decode_memory(), 0);
  OK(kc_store_verify(s, errbuf));
  kc_store_close(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      ST(test_compressible_kept_compressed),
      ST(test_incompressible_empty_small_raw),
      ST(test_large_fd_and_upload),
      ST(test_upload_arrives_compressed),
      ST(test_bad_frames_store_nothing),
      ST(test_verify_and_scrub_catch_bad_frame),
      ST(test_old_store_keeps_working),
      ST(test_kv_values),
      ST(test_wide_window_refused),
      ST(test_decoder_budget),
      ST(test_old_wide_frame_streams),
      ST(test_old_wide_frame_over_budget),
      ST(test_wide_decoder_fails_releases),
  };
  return storetest_run("store_zstd", tests, sizeof tests / sizeof tests[0]);
}
