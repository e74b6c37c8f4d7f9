/* error.c: lookups into the KC_ERRNO_MAP table. */
#include "kc_error.h"

#include <stdarg.h>
#include <stdio.h>

#define KC_ROW_(name, num, http, code, msg)                                    \
  [num] = {msg, code, "KC_" #name, http},
static const struct {
  const char *msg, *code, *name;
  int http;
} kc_errtab[] = {KC_ERRNO_MAP(KC_ROW_)};
#undef KC_ROW_

#define KC_NERR (sizeof kc_errtab / sizeof kc_errtab[0])

static int kc_err_known(kc_err e) {
  return (unsigned)e < KC_NERR && kc_errtab[e].msg != NULL;
}

const char *kc_strerror(kc_err e) {
  return kc_err_known(e) ? kc_errtab[e].msg : "unknown error";
}

const char *kc_err_code(kc_err e) {
  return kc_err_known(e) ? kc_errtab[e].code : "internal";
}

int kc_err_http_status(kc_err e) {
  return kc_err_known(e) ? kc_errtab[e].http : 500;
}

const char *kc_err_name(kc_err e) {
  return kc_err_known(e) ? kc_errtab[e].name : "KC_UNKNOWN";
}

kc_err kc_errf(char *buf, kc_err e, const char *fmt, ...) {
  if (buf) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, KC_ERRBUF_SIZE, fmt, ap);
    va_end(ap);
  }
  return e;
}
