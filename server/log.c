/* log.c: kcached's log lines on stderr, text or JSON: messages and one access
 * line per request. Lines are written whole, so lines from worker threads
 * never interleave. Access lines are many and small: they are gathered and
 * written 64 KiB at a time, and within a second by kcd_log_flush (like
 * nginx's access_log buffer=64k flush=1s); any other line flushes them first,
 * so the log keeps its order. Paths and messages are escaped: they come from
 * clients, and a newline in a URL must not forge a log line. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kcd.h"

#define LINE_MAX_ 4096

uint64_t kcd_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

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
  static const char hex[] = "0123456789abcdef";
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
      buf[(*pos)++] = hex[c >> 4];
      buf[(*pos)++] = hex[c & 15];
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
  size_t len;
  char data[ACCESS_BUF];
};

static void write_all(const char *p, size_t n) {
  while (n) {
    ssize_t w = write(STDERR_FILENO, p, n);
    if (w <= 0)
      return; /* nowhere to report a failing log */
    p += w;
    n -= (size_t)w;
  }
}

kcd_logbuf *kcd_logbuf_new(void) {
  kcd_logbuf *b = calloc(1, sizeof *b);
  if (b)
    pthread_mutex_init(&b->lock, NULL);
  return b;
}

void kcd_logbuf_free(kcd_logbuf *b) {
  if (!b)
    return;
  write_all(b->data, b->len);
  pthread_mutex_destroy(&b->lock);
  free(b);
}

void kcd_log_flush(const kcd_state *st) {
  kcd_logbuf *b = st ? st->logbuf : NULL;
  if (!b)
    return;
  pthread_mutex_lock(&b->lock);
  write_all(b->data, b->len);
  b->len = 0;
  pthread_mutex_unlock(&b->lock);
}

/* A message line: written at once, after the access lines before it. */
static void emit(const kcd_state *st, char *buf, size_t pos) {
  buf[pos++] = '\n';
  kcd_logbuf *b = st ? st->logbuf : NULL;
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
    write_all(b->data, b->len);
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

static void access_json(char *buf, size_t cap, size_t *pos, const char *ts,
                        const kcd_access *a) {
  put_raw(buf, cap, pos, "{\"ts\":\"%s\",\"level\":\"access\",\"remote\":\"",
          ts);
  put_esc(buf, cap, pos, a->remote, 1);
  put_raw(buf, cap, pos, "\",\"method\":\"");
  put_esc(buf, cap, pos, a->method, 1);
  put_raw(buf, cap, pos, "\",\"path\":\"");
  put_esc(buf, cap, pos, a->path, 1);
  put_raw(buf, cap, pos,
          "\",\"status\":%d,\"bytes_in\":%llu,\"bytes_out\":%llu,\"us\":%llu,"
          "\"token\":\"",
          a->status, (unsigned long long)a->bytes_in,
          (unsigned long long)a->bytes_out, (unsigned long long)a->us);
  put_esc(buf, cap, pos, a->token, 1);
  put_raw(buf, cap, pos, "\"}");
}

static void access_text(char *buf, size_t cap, size_t *pos, const char *ts,
                        const kcd_access *a) {
  put_raw(buf, cap, pos, "%s access ", ts);
  put_esc(buf, cap, pos, a->remote, 0);
  put_raw(buf, cap, pos, " ");
  put_esc(buf, cap, pos, a->method, 0);
  put_raw(buf, cap, pos, " ");
  put_esc(buf, cap, pos, a->path, 0);
  put_raw(buf, cap, pos, " %d in=%llu out=%llu us=%llu token=", a->status,
          (unsigned long long)a->bytes_in, (unsigned long long)a->bytes_out,
          (unsigned long long)a->us);
  put_esc(buf, cap, pos, a->token, 0);
}

void kcd_log_access(const kcd_state *st, const kcd_access *a) {
  char ts[32], buf[LINE_MAX_];
  size_t pos = 0;
  timestamp(ts);
  if (st->cfg.log_format == KCD_LOG_JSON)
    access_json(buf, sizeof buf, &pos, ts, a);
  else
    access_text(buf, sizeof buf, &pos, ts, a);
  emit_access(st, buf, pos);
}
