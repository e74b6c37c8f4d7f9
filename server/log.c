/* log.c: kcached's log lines on stderr, text or JSON: messages and one access
 * line per request. Lines are written whole, so lines from worker threads
 * never interleave. Access lines are many and small: they are gathered and
 * written 64 KiB at a time, and within a second by kcd_log_flush (like
 * nginx's access_log buffer=64k flush=1s); any other line flushes them first,
 * so the log keeps its order. Paths and messages are escaped: they come from
 * clients, and a newline in a URL must not forge a log line.
 *
 * --access-log off drops the access lines; --access-log FILE appends them to
 * FILE instead (then message lines need not flush them first).
 *
 * The access line is on the path of every request (a 4 KiB GET costs a few
 * microseconds in all): it is formatted without printf, and the time of day
 * is converted once a second per thread, not per line (vfprintf, strftime
 * and the time-zone code took 8% of a GET's cycles). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kcd.h"

#define LINE_MAX_ 4096

int64_t kcd_unix_now(void) { return (int64_t)time(NULL); }

/* "2026-11-22T08:00:00.123Z" */
static void timestamp(char out[32]) {
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  size_t n = strftime(out, 32, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(out + n, 32 - n, ".%03ldZ", ts.tv_nsec / 1000000L);
}

/* Appends s escaped: JSON string rules, or %XX for text mode (where spaces
 * separate fields). Stops before overflowing; *pos stays within cap. */
static void put_esc(char *buf, size_t cap, size_t *pos, const char *s,
                    int json) {
  for (; s && *s && *pos + 8 < cap; s++) {
    unsigned char c = (unsigned char)*s;
    if (json && (c == '"' || c == '\\')) {
      buf[(*pos)++] = '\\';
      buf[(*pos)++] = (char)c;
    } else if (c >= 0x20 && c < 0x7f && (json || c != ' ')) {
      buf[(*pos)++] = (char)c;
    } else if (json) {
      *pos += (size_t)snprintf(buf + *pos, cap - *pos, "\\u%04x", c);
    } else {
      buf[(*pos)++] = '%';
      kc_hex_encode(&c, 1, buf + *pos); /* and a NUL, overwritten next */
      *pos += 2;
    }
  }
}

static void put_raw(char *buf, size_t cap, size_t *pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void put_raw(char *buf, size_t cap, size_t *pos, const char *fmt, ...) {
  if (*pos >= cap)
    return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + *pos, cap - *pos, fmt, ap);
  va_end(ap);
  if (n > 0)
    *pos = *pos + (size_t)n < cap ? *pos + (size_t)n : cap - 1;
}

#define ACCESS_BUF (64 * 1024)

struct kcd_logbuf {
  pthread_mutex_t lock;
  int fd; /* where access lines go: stderr, or --access-log FILE */
  size_t len;
  char data[ACCESS_BUF];
};

static void write_fd(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return; /* nowhere to report a failing log */
    p += w;
    n -= (size_t)w;
  }
}

static void write_all(const char *p, size_t n) {
  write_fd(STDERR_FILENO, p, n);
}

kcd_logbuf *kcd_logbuf_new(void) {
  kcd_logbuf *b = malloc(sizeof *b); /* 64 KiB: not worth zeroing */
  if (!b)
    return NULL;
  b->len = 0;
  b->fd = STDERR_FILENO;
  pthread_mutex_init(&b->lock, NULL);
  return b;
}

kc_err kcd_log_access_open(kcd_state *st, char *err) {
  const char *path = st->cfg.access_log;
  if (!path || strcmp(path, "off") == 0)
    return KC_OK;
  if (!st->logbuf)
    return kc_errf(err, KC_NOMEM, "out of memory");
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  if (fd < 0)
    return kc_errf(err, KC_IO, "--access-log %s: %s", path, strerror(errno));
  st->logbuf->fd = fd;
  return KC_OK;
}

void kcd_logbuf_free(kcd_logbuf *b) {
  if (!b)
    return;
  write_fd(b->fd, b->data, b->len);
  if (b->fd != STDERR_FILENO)
    close(b->fd);
  pthread_mutex_destroy(&b->lock);
  free(b);
}

void kcd_log_flush(const kcd_state *st) {
  kcd_logbuf *b = st ? st->logbuf : NULL;
  if (!b)
    return;
  pthread_mutex_lock(&b->lock);
  write_fd(b->fd, b->data, b->len);
  b->len = 0;
  pthread_mutex_unlock(&b->lock);
}

/* A message line: written at once, after the access lines before it. */
static void emit(const kcd_state *st, char *buf, size_t pos) {
  buf[pos++] = '\n';
  kcd_logbuf *b = st ? st->logbuf : NULL;
  if (b && b->fd != STDERR_FILENO)
    b = NULL; /* access lines go elsewhere: no order to keep */
  if (b)
    pthread_mutex_lock(&b->lock);
  if (b && b->len) {
    write_all(b->data, b->len);
    b->len = 0;
  }
  write_all(buf, pos);
  if (b)
    pthread_mutex_unlock(&b->lock);
}

static void emit_access(const kcd_state *st, char *buf, size_t pos) {
  kcd_logbuf *b = st->logbuf;
  buf[pos++] = '\n';
  if (!b)
    return write_all(buf, pos);
  pthread_mutex_lock(&b->lock);
  if (b->len + pos > sizeof b->data) {
    write_fd(b->fd, b->data, b->len);
    b->len = 0;
  }
  memcpy(b->data + b->len, buf, pos);
  b->len += pos;
  pthread_mutex_unlock(&b->lock);
}

void kcd_vlog(const kcd_state *st, const char *level, const char *fmt,
              va_list ap) {
  char msg[LINE_MAX_ / 2], ts[32], buf[LINE_MAX_];
  size_t pos = 0;
  int json = st && st->cfg.log_format == KCD_LOG_JSON;
  vsnprintf(msg, sizeof msg, fmt, ap);
  timestamp(ts);
  if (json) {
    put_raw(buf, sizeof buf, &pos, "{\"ts\":\"%s\",\"level\":\"%s\",\"msg\":\"",
            ts, level);
    put_esc(buf, sizeof buf, &pos, msg, 1);
    put_raw(buf, sizeof buf, &pos, "\"}");
  } else {
    put_raw(buf, sizeof buf, &pos, "%s %s ", ts, level);
    /* Messages are ours, spaces welcome; only control bytes are escaped. */
    for (const char *s = msg; *s && pos + 4 < sizeof buf; s++)
      buf[pos++] = ((unsigned char)*s < 0x20) ? '?' : *s;
  }
  emit(st, buf, pos);
}

void kcd_log(const kcd_state *st, const char *level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  kcd_vlog(st, level, fmt, ap);
  va_end(ap);
}

/* ---- the access line, without printf ---- */

/* Per thread: the second's part of the timestamp, "2026-11-22T08:00:00",
 * converted once a second, and the wall clock's offset from the monotonic
 * one, measured once a second, so that a line stamped with the request's
 * own monotonic reading costs no clock call (a step of the wall clock shows
 * within a second; NTP's slewing moves it 0.5 ms a second at most). */
static _Thread_local struct {
  time_t sec;
  char text[24];
  uint64_t calib_us; /* monotonic, when offset_us was measured; 0: never */
  int64_t offset_us; /* wall minus monotonic */
} ts_cache = {-1, "", 0, 0};

static int64_t wall_us(uint64_t mono_us) {
  if (!mono_us || !ts_cache.calib_us || mono_us < ts_cache.calib_us ||
      mono_us - ts_cache.calib_us > 1000000u) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t m = kc_clock_mono_us();
    ts_cache.offset_us =
        (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000 - (int64_t)m;
    ts_cache.calib_us = m;
    if (!mono_us)
      mono_us = m;
  }
  return (int64_t)mono_us + ts_cache.offset_us;
}

/* "2026-11-22T08:00:00.123Z" into out (24 bytes, no NUL) for a monotonic
 * reading (0: now); returns 24. */
static size_t fast_timestamp(char *out, uint64_t mono_us) {
  int64_t w = wall_us(mono_us);
  time_t sec = (time_t)(w / 1000000);
  if (sec != ts_cache.sec) {
    struct tm tm;
    gmtime_r(&sec, &tm);
    if (strftime(ts_cache.text, sizeof ts_cache.text, "%Y-%m-%dT%H:%M:%S",
                 &tm) != 19)
      memcpy(ts_cache.text, "1970-01-01T00:00:00", 19);
    ts_cache.sec = sec;
  }
  unsigned ms = (unsigned)(w / 1000 % 1000);
  memcpy(out, ts_cache.text, 19);
  out[19] = '.';
  out[20] = (char)('0' + ms / 100);
  out[21] = (char)('0' + ms / 10 % 10);
  out[22] = (char)('0' + ms % 10);
  out[23] = 'Z';
  return 24;
}

typedef struct line {
  char *buf;
  size_t pos, cap; /* cap keeps 32 bytes spare for a number and the '\n' */
} line;

static void put_lit(line *l, const char *s, size_t n) {
  if (l->pos + n + 32 > l->cap)
    return;
  memcpy(l->buf + l->pos, s, n);
  l->pos += n;
}
#define PUT_LIT(l, s) put_lit((l), (s), sizeof(s) - 1)

static void put_u64(line *l, uint64_t v) {
  char d[20];
  size_t n = 0;
  do
    d[n++] = (char)('0' + v % 10);
  while ((v /= 10) && n < sizeof d);
  while (n) /* cap's spare room holds 20 digits */
    l->buf[l->pos++] = d[--n];
}

/* Bytes written as they are: printable ASCII, and in text mode no space; in
 * JSON no quote or backslash. A table per mode (bit 0: text, bit 1: JSON):
 * every byte of every access line is looked up. */
#define PLAIN_RANGE(a)                                                         \
  [a] = 3, [a + 1] = 3, [a + 2] = 3, [a + 3] = 3, [a + 4] = 3, [a + 5] = 3,    \
  [a + 6] = 3, [a + 7] = 3, [a + 8] = 3, [a + 9] = 3, [a + 10] = 3,            \
  [a + 11] = 3, [a + 12] = 3, [a + 13] = 3, [a + 14] = 3, [a + 15] = 3
#pragma GCC diagnostic push /* the ranges first, then their exceptions */
#pragma GCC diagnostic ignored "-Woverride-init"
static const unsigned char plain_tab[256] = {
    PLAIN_RANGE(0x20), PLAIN_RANGE(0x30), PLAIN_RANGE(0x40), PLAIN_RANGE(0x50),
    PLAIN_RANGE(0x60), PLAIN_RANGE(0x70), [' '] = 2, /* JSON only */
    ['"'] = 1,                                       /* text only */
    ['\\'] = 1,                                      /* text only */
    [0x7f] = 0};
#pragma GCC diagnostic pop

static int plain(unsigned char c, int json) { return plain_tab[c] >> json & 1; }

/* Appends s escaped (put_esc) with a fast run for the common bytes. */
static void put_str(line *l, const char *s, int json) {
  if (!s)
    return;
  for (;;) {
    const char *q = s;
    while (plain((unsigned char)*q, json))
      q++;
    put_lit(l, s, (size_t)(q - s));
    if (!*q)
      return;
    char one[2] = {*q, 0};
    if (l->pos + 40 < l->cap)
      put_esc(l->buf, l->pos + 40, &l->pos, one, json);
    s = q + 1;
  }
}

static void access_json(line *l, const kcd_access *a) {
  PUT_LIT(l, "{\"ts\":\"");
  l->pos += fast_timestamp(l->buf + l->pos, a->now_us);
  PUT_LIT(l, "\",\"level\":\"access\",\"remote\":\"");
  put_str(l, a->remote, 1);
  PUT_LIT(l, "\",\"method\":\"");
  put_str(l, a->method, 1);
  PUT_LIT(l, "\",\"path\":\"");
  put_str(l, a->path, 1);
  PUT_LIT(l, "\",\"status\":");
  put_u64(l, (uint64_t)(a->status < 0 ? 0 : a->status));
  PUT_LIT(l, ",\"bytes_in\":");
  put_u64(l, a->bytes_in);
  PUT_LIT(l, ",\"bytes_out\":");
  put_u64(l, a->bytes_out);
  PUT_LIT(l, ",\"us\":");
  put_u64(l, a->us);
  PUT_LIT(l, ",\"token\":\"");
  put_str(l, a->token, 1);
  PUT_LIT(l, "\"}");
}

static void access_text(line *l, const kcd_access *a) {
  l->pos += fast_timestamp(l->buf + l->pos, a->now_us);
  PUT_LIT(l, " access ");
  put_str(l, a->remote, 0);
  PUT_LIT(l, " ");
  put_str(l, a->method, 0);
  PUT_LIT(l, " ");
  put_str(l, a->path, 0);
  PUT_LIT(l, " ");
  put_u64(l, (uint64_t)(a->status < 0 ? 0 : a->status));
  PUT_LIT(l, " in=");
  put_u64(l, a->bytes_in);
  PUT_LIT(l, " out=");
  put_u64(l, a->bytes_out);
  PUT_LIT(l, " us=");
  put_u64(l, a->us);
  PUT_LIT(l, " token=");
  put_str(l, a->token, 0);
}

void kcd_log_access(const kcd_state *st, const kcd_access *a) {
  if (st->cfg.access_log && strcmp(st->cfg.access_log, "off") == 0)
    return;
  char buf[LINE_MAX_];
  line l = {buf, 0, sizeof buf};
  if (st->cfg.log_format == KCD_LOG_JSON)
    access_json(&l, a);
  else
    access_text(&l, a);
  emit_access(st, buf, l.pos);
}
