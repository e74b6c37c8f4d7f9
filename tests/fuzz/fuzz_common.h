/* fuzz_common.h: what every kcache libFuzzer target shares: a check that
 * aborts (so libFuzzer records the input as a crash) with a message, and the
 * contract of an error buffer (NUL-terminated, printable ASCII; kc_schema.h).
 */
#ifndef KC_FUZZ_COMMON_H
#define KC_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "kc_error.h"

#define FZ_CHECK(cond, ...)                                                    \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "\n*** fuzz invariant failed at %s:%d: %s\n*** ",        \
              __FILE__, __LINE__, #cond);                                      \
      fprintf(stderr, __VA_ARGS__);                                            \
      fputc('\n', stderr);                                                     \
      abort();                                                                 \
    }                                                                          \
  } while (0)

/* Fill an error buffer with a non-NUL byte, so that a function that says it
 * wrote a message but did not terminate it is caught by fz_err_ok. */
static inline void fz_err_reset(char *err) { memset(err, 'X', KC_ERRBUF_SIZE); }

/* An error message: NUL-terminated within KC_ERRBUF_SIZE. printable: every
 * byte 0x20..0x7e (what schema/ promises for texts that go into JSON bodies
 * and logs). */
static inline void fz_err_ok(const char *err, int printable, const char *what) {
  const char *nul = memchr(err, '\0', KC_ERRBUF_SIZE);
  FZ_CHECK(nul != NULL, "%s: error message not NUL-terminated", what);
  FZ_CHECK(nul != err, "%s: empty error message", what);
  if (printable)
    for (const char *p = err; p < nul; p++)
      FZ_CHECK(*p >= 0x20 && *p <= 0x7e,
               "%s: byte 0x%02x at %zu of the error message is not printable "
               "ASCII: %s",
               what, (unsigned char)*p, (size_t)(p - err), err);
}

/* jansson seeds its hash function from /dev/urandom; a fixed seed keeps runs
 * (and the order of object iteration) reproducible. */
static inline void fz_init_jansson(void) { json_object_seed(0x6b636163u); }

#endif
