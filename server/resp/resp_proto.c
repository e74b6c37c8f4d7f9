/* resp_proto.c: RESP2 as Redis speaks it: the command parser (multibulk
 * "*N\r\n$L\r\n..." and inline "CMD arg \"quoted\"\r\n") and the reply
 * writers. Pure: no I/O, no global state.
 *
 * The parser is incremental: it keeps how far a multibulk command got, so a
 * large argument arriving in pieces is not re-scanned, and it never
 * allocates what a client declares (a count or a length) before the bytes
 * are there: the argument table grows as arguments arrive and the caller's
 * buffer grows as it reads. Arguments are offsets into the caller's buffer.
 * Errors carry Redis's exact texts ("Protocol error: invalid bulk length"). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "resp.h"

#define UNAUTH_MAX_ARGS 10 /* Redis's limits before AUTH */
#define UNAUTH_MAX_BULK 16384

/* ---- buffers ---- */

/* What a buffer of cap bytes counts in its budget: the first
 * KCD_RESP_BUDGET_FREE bytes are free, so that small replies (+OK, errors,
 * small values) go on while big ones fill the budget. */
static size_t budget_share(size_t cap) {
  return cap > KCD_RESP_BUDGET_FREE ? cap - KCD_RESP_BUDGET_FREE : 0;
}

int kcd_resp_buf_reserve(kcd_resp_buf *b, size_t more) {
  if (b->oom || b->over)
    return -1;
  if (b->cap - b->len >= more)
    return 0;
  if (more > SIZE_MAX / 2 - b->len)
    return b->oom = 1, -1;
  if (b->limit && b->len + more > b->limit)
    return b->over = 1, -1;
  /* doubling for many small appends; a big one (a value) gets what it
   * needs, not up to twice that, which a budget would count */
  size_t cap = b->cap ? b->cap * 2 : 256;
  if (cap - b->len < more)
    cap = b->len + more;
  if (b->limit && cap > b->limit)
    cap = b->limit; /* >= len + more */
  kcd_resp_budget *g = b->bud;
  size_t charge = budget_share(cap) - budget_share(b->cap);
  if (g && (g->used > g->limit || charge > g->limit - g->used))
    return b->over = 1, -1;
  char *p = realloc(b->p, cap);
  if (!p)
    return b->oom = 1, -1;
  if (g)
    g->used += charge;
  b->p = p;
  b->cap = cap;
  return 0;
}

void kcd_resp_buf_add(kcd_resp_buf *b, const void *p, size_t n) {
  if (n && kcd_resp_buf_reserve(b, n) == 0) {
    memcpy(b->p + b->len, p, n);
    b->len += n;
  }
}

void kcd_resp_buf_free(kcd_resp_buf *b) {
  kcd_resp_buf keep = {.limit = b->limit, .bud = b->bud};
  if (b->bud)
    b->bud->used -= budget_share(b->cap);
  free(b->p);
  *b = keep;
}

/* ---- replies ---- */

static void add_str(kcd_resp_buf *b, const char *s) {
  kcd_resp_buf_add(b, s, strlen(s));
}

/* "<type><v>\r\n", without printf: every reply has one or more. */
static void add_line(kcd_resp_buf *b, char type, long long v) {
  char tmp[32];
  size_t n = sizeof tmp;
  unsigned long long u =
      v < 0 ? 0 - (unsigned long long)v : (unsigned long long)v;
  tmp[--n] = '\n';
  tmp[--n] = '\r';
  do
    tmp[--n] = (char)('0' + u % 10);
  while (u /= 10);
  if (v < 0)
    tmp[--n] = '-';
  tmp[--n] = type;
  kcd_resp_buf_add(b, tmp + n, sizeof tmp - n);
}

void kcd_resp_simple(kcd_resp_buf *b, const char *s) {
  kcd_resp_buf_add(b, "+", 1);
  add_str(b, s);
  kcd_resp_buf_add(b, "\r\n", 2);
}

/* An error line may not hold CR or LF: Redis turns them into spaces. */
void kcd_resp_error(kcd_resp_buf *b, const char *s) {
  size_t n = strlen(s);
  if (kcd_resp_buf_reserve(b, n + 3))
    return;
  char *d = b->p + b->len;
  *d++ = '-';
  for (size_t i = 0; i < n; i++)
    *d++ = s[i] == '\r' || s[i] == '\n' ? ' ' : s[i];
  memcpy(d, "\r\n", 2);
  b->len += n + 3;
}

void kcd_resp_errorf(kcd_resp_buf *b, const char *fmt, ...) {
  char tmp[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  kcd_resp_error(b, tmp);
}

void kcd_resp_int(kcd_resp_buf *b, long long v) { add_line(b, ':', v); }

void kcd_resp_bulk(kcd_resp_buf *b, const void *p, size_t n) {
  if (kcd_resp_buf_reserve(b, n + 32))
    return;
  add_line(b, '$', (long long)n);
  kcd_resp_buf_add(b, p, n);
  kcd_resp_buf_add(b, "\r\n", 2);
}

void kcd_resp_bulk_str(kcd_resp_buf *b, const char *s) {
  kcd_resp_bulk(b, s, strlen(s));
}

void kcd_resp_null(kcd_resp_buf *b) { kcd_resp_buf_add(b, "$-1\r\n", 5); }

void kcd_resp_array(kcd_resp_buf *b, long long n) { add_line(b, '*', n); }

void kcd_resp_nil(kcd_resp_buf *b, int resp3) {
  if (resp3)
    kcd_resp_buf_add(b, "_\r\n", 3);
  else
    kcd_resp_null(b);
}

void kcd_resp_map(kcd_resp_buf *b, long long n, int resp3) {
  if (resp3)
    add_line(b, '%', n);
  else
    add_line(b, '*', 2 * n);
}

void kcd_resp_verbatim(kcd_resp_buf *b, const void *p, size_t n, int resp3) {
  if (!resp3)
    return kcd_resp_bulk(b, p, n);
  if (kcd_resp_buf_reserve(b, n + 36))
    return;
  add_line(b, '=', (long long)n + 4);
  kcd_resp_buf_add(b, "txt:", 4);
  kcd_resp_buf_add(b, p, n);
  kcd_resp_buf_add(b, "\r\n", 2);
}

/* ---- integers ---- */

/* Redis's string2ll: optional '-', digits, no leading zero (but "0"), no
 * spaces, no '+', no overflow. */
int kcd_resp_ll(const char *s, size_t n, long long *out) {
  if (n == 0 || n > 20)
    return -1;
  size_t i = 0;
  int neg = s[0] == '-';
  if (n == 1 && s[0] == '0')
    return *out = 0, 0;
  if (neg && ++i == n)
    return -1;
  if (s[i] < '1' || s[i] > '9')
    return -1;
  unsigned long long v = 0;
  for (; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return -1;
    unsigned d = (unsigned)(s[i] - '0');
    if (v > (~0ull - d) / 10)
      return -1;
    v = v * 10 + d;
  }
  if (neg ? v > (unsigned long long)INT64_MAX + 1
          : v > (unsigned long long)INT64_MAX)
    return -1;
  *out = neg ? (long long)(0 - v) : (long long)v;
  return 0;
}

/* ---- the parser ---- */

void kcd_resp_parser_init(kcd_resp_parser *p, uint64_t max_bulk,
                          size_t max_args) {
  memset(p, 0, sizeof *p);
  p->max_bulk = max_bulk;
  p->max_args = max_args;
  p->bulk = -1;
}

void kcd_resp_parser_free(kcd_resp_parser *p) {
  free(p->argv);
  p->argv = NULL;
  p->argc = p->argcap = 0;
}

static int push_arg(kcd_resp_parser *p, size_t off, size_t len) {
  if (p->argc == p->argcap) {
    size_t cap = p->argcap ? p->argcap * 2 : 16;
    kcd_resp_arg *v = realloc(p->argv, cap * sizeof *v);
    if (!v)
      return -1;
    p->argv = v;
    p->argcap = cap;
  }
  p->argv[p->argc++] = (kcd_resp_arg){off, len};
  return 0;
}

static kcd_resp_res fail(kcd_resp_parser *p, const char *msg) {
  snprintf(p->errbuf, sizeof p->errbuf, "Protocol error: %s", msg);
  p->error = p->errbuf;
  return KCD_RESP_ERR;
}

/* The line at pos ending in '\r' and one more byte (Redis does not check
 * that it is '\n'): its length, or -1 when it is not all there yet. */
static long long line_at(const char *buf, size_t len, size_t pos) {
  const char *cr = memchr(buf + pos, '\r', len - pos);
  if (!cr || (size_t)(cr - buf) + 2 > len)
    return -1;
  return cr - (buf + pos);
}

/* "*N\r\n": starts a multibulk command. */
static kcd_resp_res mb_count(kcd_resp_parser *p, const char *buf, size_t len) {
  long long n = line_at(buf, len, p->pos);
  if (n < 0)
    return len - p->pos > KCD_RESP_INLINE_MAX
               ? fail(p, "too big mbulk count string")
               : KCD_RESP_MORE;
  long long ll;
  if (kcd_resp_ll(buf + p->pos + 1, (size_t)n - 1, &ll) ||
      ll > (long long)p->max_args)
    return fail(p, "invalid multibulk length");
  if (ll > UNAUTH_MAX_ARGS && p->unauth)
    return fail(p, "unauthenticated multibulk length");
  p->start = p->pos;
  p->pos += (size_t)n + 2;
  p->argc = 0;
  if (ll > 0) {
    p->inmb = 1;
    p->nleft = ll;
    p->bulk = -1;
  }
  return KCD_RESP_CMD; /* with argc 0: the caller goes on */
}

/* "$L\r\n": the next argument's length. */
static kcd_resp_res mb_bulk_len(kcd_resp_parser *p, const char *buf,
                                size_t len) {
  long long n = line_at(buf, len, p->pos);
  if (n < 0)
    return len - p->pos > KCD_RESP_INLINE_MAX
               ? fail(p, "too big bulk count string")
               : KCD_RESP_MORE;
  if (buf[p->pos] != '$') {
    char what[40];
    snprintf(what, sizeof what, "expected '$', got '%c'", buf[p->pos]);
    return fail(p, what);
  }
  long long ll;
  if (kcd_resp_ll(buf + p->pos + 1, (size_t)n - 1, &ll) || ll < 0 ||
      (unsigned long long)ll > p->max_bulk)
    return fail(p, "invalid bulk length");
  if (ll > UNAUTH_MAX_BULK && p->unauth)
    return fail(p, "unauthenticated bulk length");
  p->pos += (size_t)n + 2;
  p->bulk = ll;
  return KCD_RESP_CMD;
}

static kcd_resp_res multibulk(kcd_resp_parser *p, const char *buf, size_t len) {
  while (p->nleft > 0) {
    if (p->pos >= len)
      return KCD_RESP_MORE;
    if (p->bulk < 0) {
      kcd_resp_res r = mb_bulk_len(p, buf, len);
      if (r != KCD_RESP_CMD)
        return r;
      continue;
    }
    if (len - p->pos < (size_t)p->bulk + 2)
      return KCD_RESP_MORE;
    if (push_arg(p, p->pos, (size_t)p->bulk))
      return KCD_RESP_NOMEM;
    p->pos += (size_t)p->bulk + 2;
    p->bulk = -1;
    p->nleft--;
  }
  p->inmb = 0;
  return KCD_RESP_CMD;
}

static int is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' ||
         c == '\f';
}

/* One escape inside "...": consumes from *r, returns the byte. */
static char dq_escape(const char *s, size_t end, size_t *r) {
  size_t i = *r; /* s[i] == '\\' and i + 1 < end */
  unsigned char b;
  if (s[i + 1] == 'x' && i + 3 < end && kc_hex_decode(s + i + 2, 1, &b) == 0) {
    *r = i + 4;
    return (char)b;
  }
  *r = i + 2;
  switch (s[i + 1]) {
  case 'n':
    return '\n';
  case 'r':
    return '\r';
  case 't':
    return '\t';
  case 'b':
    return '\b';
  case 'a':
    return '\a';
  default:
    return s[i + 1];
  }
}

/* One quoted word from s[*r] (the opening quote) to end, unquoted into
 * s[*w...]; -1 on unbalanced quotes (sdssplitargs's rules: the closing
 * quote must end the word). */
static int quoted(char *s, size_t end, size_t *r, size_t *w) {
  char q = s[(*r)++];
  for (;;) {
    if (*r >= end)
      return -1;
    char c = s[*r];
    if (c == q) {
      (*r)++;
      return *r < end && !is_space(s[*r]) ? -1 : 0;
    }
    if (c == '\\' && *r + 1 < end && (q == '"' || s[*r + 1] == '\''))
      c = q == '"' ? dq_escape(s, end, r) : (*r += 2, '\'');
    else
      (*r)++;
    s[(*w)++] = c;
  }
}

/* Splits s[0..end) into words in place, as Redis's sdssplitargs. */
static kcd_resp_res split_inline(kcd_resp_parser *p, char *buf, size_t start,
                                 size_t end) {
  size_t r = start, w = start;
  for (;;) {
    while (r < end && is_space(buf[r]))
      r++;
    if (r >= end)
      return KCD_RESP_CMD;
    size_t a = w;
    while (r < end && !is_space(buf[r])) {
      if (buf[r] == '"' || buf[r] == '\'') {
        if (quoted(buf, end, &r, &w))
          return fail(p, "unbalanced quotes in request");
        break;
      }
      buf[w++] = buf[r++];
    }
    if (push_arg(p, a, w - a))
      return KCD_RESP_NOMEM;
  }
}

static kcd_resp_res inline_cmd(kcd_resp_parser *p, char *buf, size_t len) {
  p->inl = 1;
  const char *nl = memchr(buf + p->pos, '\n', len - p->pos);
  if (!nl)
    return len - p->pos > KCD_RESP_INLINE_MAX
               ? fail(p, "too big inline request")
               : KCD_RESP_MORE;
  size_t end = (size_t)(nl - buf), next = end + 1;
  if (end > p->pos && buf[end - 1] == '\r')
    end--;
  /* sdssplitargs works on a C string: a NUL ends the line */
  const char *nul = memchr(buf + p->pos, '\0', end - p->pos);
  if (nul)
    end = (size_t)(nul - buf);
  p->argc = 0;
  kcd_resp_res r = split_inline(p, buf, p->pos, end);
  if (r == KCD_RESP_CMD)
    p->pos = next;
  return r;
}

kcd_resp_res kcd_resp_parse(kcd_resp_parser *p, char *buf, size_t len) {
  for (;;) {
    kcd_resp_res r;
    if (p->inmb)
      r = multibulk(p, buf, len);
    else if (p->pos >= len)
      return KCD_RESP_MORE;
    else if (buf[p->pos] == '*')
      r = (p->inl = 0, mb_count(p, buf, len));
    else
      r = inline_cmd(p, buf, len);
    if (r != KCD_RESP_CMD)
      return r;
    if (p->argc > 0 && !p->inmb)
      return KCD_RESP_CMD;
    /* an empty command, or a count line read: go on */
  }
}

size_t kcd_resp_parser_done(const kcd_resp_parser *p) {
  return p->inmb ? p->start : p->pos;
}

void kcd_resp_parser_shift(kcd_resp_parser *p, size_t n) {
  p->pos -= n;
  p->start -= p->inmb ? n : 0;
  if (p->inmb)
    for (size_t i = 0; i < p->argc; i++)
      p->argv[i].off -= n;
}

size_t kcd_resp_parser_want(const kcd_resp_parser *p, size_t len) {
  if (!p->inmb || p->bulk < 0)
    return 0;
  size_t need = p->pos + (size_t)p->bulk + 2;
  return need > len ? need - len : 0;
}
