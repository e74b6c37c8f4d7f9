/* zstdframe.h: zstd frames with a chosen window, for the tests of the
 * window bound (test_store_zstd, test_server_zstd). Include after cmocka.h
 * and zstd.h. */
#ifndef KC_TEST_ZSTDFRAME_H
#define KC_TEST_ZSTDFRAME_H

/* n bytes at p as one frame with a window of 2^wlog and no content size in
 * its header (streamed): a decoder must hold the whole window, however small
 * the frame. The caller frees it. */
static void *kc_test_wide_frame(const void *p, size_t n, int wlog,
                                size_t *zlen) {
  ZSTD_CCtx *cc = ZSTD_createCCtx();
  assert_non_null(cc);
  assert_false(
      ZSTD_isError(ZSTD_CCtx_setParameter(cc, ZSTD_c_windowLog, wlog)));
  assert_false(
      ZSTD_isError(ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 0)));
  size_t cap = ZSTD_compressBound(n);
  void *z = malloc(cap);
  assert_non_null(z);
  ZSTD_outBuffer out = {z, cap, 0};
  /* fed in pieces: given all at once, libzstd would size the window to
   * the input */
  size_t left = 0;
  for (size_t at = 0; at < n; at += 1u << 20) {
    size_t k = n - at < (1u << 20) ? n - at : 1u << 20;
    ZSTD_inBuffer in = {(const char *)p + at, k, 0};
    ZSTD_EndDirective end = at + k == n ? ZSTD_e_end : ZSTD_e_continue;
    do
      left = ZSTD_compressStream2(cc, &out, &in, end);
    while (!ZSTD_isError(left) && (in.pos < in.size || (end && left)));
    assert_false(ZSTD_isError(left));
  }
  ZSTD_freeCCtx(cc);
  *zlen = out.pos;
  return z;
}

#endif
