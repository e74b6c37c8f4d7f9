/* test_error.c: the error table gives every code a message, a wire code and
 * an HTTP status, and the numbers never move. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "kc_error.h"

static void test_known_codes(void **state) {
  (void)state;
  assert_int_equal(KC_OK, 0);
  assert_int_equal(KC_STORE_FULL, 8);
  assert_int_equal(kc_err_http_status(KC_STORE_FULL), 507);
  assert_string_equal(kc_err_code(KC_STORE_FULL), "store_full");
  assert_int_equal(kc_err_http_status(KC_DIGEST_MISMATCH), 422);
  assert_int_equal(kc_err_http_status(KC_MISSING_BLOBS), 409);
  assert_int_equal(kc_err_http_status(KC_UNAUTHORIZED), 401);
  assert_string_equal(kc_err_name(KC_NOT_FOUND), "KC_NOT_FOUND");
  assert_string_equal(kc_strerror(KC_NO_NVRTC), "NVRTC not found");
  /* The store's "held compressed" signal has its own code, not 501's. */
  assert_int_equal(KC_ENCODED, 38);
  assert_int_equal(kc_err_http_status(KC_ENCODED), 500);
  assert_int_not_equal(KC_ENCODED, KC_NOT_IMPLEMENTED);
}

static void test_unknown_code(void **state) {
  (void)state;
  assert_string_equal(kc_strerror((kc_err)9999), "unknown error");
  assert_int_equal(kc_err_http_status((kc_err)-1), 500);
}

static void test_errf(void **state) {
  (void)state;
  char buf[KC_ERRBUF_SIZE];
  assert_int_equal(kc_errf(buf, KC_BAD_MANIFEST, "files[%d].path: bad", 2),
                   KC_BAD_MANIFEST);
  assert_string_equal(buf, "files[2].path: bad");
  assert_int_equal(kc_errf(NULL, KC_IO, "x"), KC_IO);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_known_codes),
      cmocka_unit_test(test_unknown_code),
      cmocka_unit_test(test_errf),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
