/* hexclock.c: the hex encoding and the clocks every module shares (one copy
 * each, so that a digit table or a clock's unit cannot drift apart). */
#include <time.h>

#include "kc_schema.h"

void kc_hex_encode(const void *bytes, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  const unsigned char *b = bytes;
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[b[i] >> 4];
    out[2 * i + 1] = digits[b[i] & 15];
  }
  out[2 * n] = '\0';
}

int kc_hex_digit(int c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

int kc_hex_decode(const char *hex, size_t n, unsigned char *out) {
  for (size_t i = 0; i < n; i++) {
    int hi = kc_hex_digit(hex[2 * i]);
    int lo = hi < 0 ? -1 : kc_hex_digit(hex[2 * i + 1]);
    if (lo < 0)
      return -1;
    out[i] = (unsigned char)(hi << 4 | lo);
  }
  return 0;
}

int64_t kc_clock_wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

struct timespec kc_clock_deadline(clockid_t clk, uint64_t us) {
  struct timespec ts;
  clock_gettime(clk, &ts);
  ts.tv_sec += (time_t)(us / 1000000u);
  ts.tv_nsec += (long)(us % 1000000u) * 1000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

uint64_t kc_clock_mono_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

int64_t kc_clock_mono_ms(void) { return (int64_t)(kc_clock_mono_us() / 1000); }
