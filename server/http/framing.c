/* framing.c: the request framing checks RFC 9112 requires and
 * libmicrohttpd 0.9.75 does not make (a request-smuggling surface when a
 * proxy in front frames the same bytes another way):
 *
 * - Content-Length together with Transfer-Encoding (MHD lets chunked win
 *   and keeps the connection; RFC 9112 6.1: "ought to be handled as an
 *   error" by a server, which then closes);
 * - Content-Length twice with different values (MHD uses the first);
 * - a Transfer-Encoding other than exactly "chunked" (MHD waits for a body
 *   it cannot frame until the idle timeout): 501;
 * - a header name that is not an RFC 9110 token ("Transfer-Encoding :"
 *   arrives as the name "Transfer-Encoding " and was ignored);
 * - "%00" in the raw URI (MHD decodes it and the path is cut at the NUL;
 *   http.c records it from MHD's URI log callback, before decoding);
 *
 * and the request syntax MHD 0.9.75 is lenient about (kcd_syntax below):
 *
 * - obs-fold (RFC 9112 5.2): MHD appends a continuation line to the header
 *   *name* ("Content-Length:\r\n 35" became a header "Content-Length35",
 *   so the body was read as the next request);
 * - a NUL byte in a header line (MHD keeps the value up to it and drops the
 *   rest) or in the request target (the path is cut at it);
 * - a bare CR or another control character in a header value;
 * - a space or control character in the request target;
 * - no Host on HTTP/1.1, or two Hosts (RFC 9112 3.2).
 *
 * MHD shows none of these through its API, but it parses in place: the
 * request line and the header lines stay in its read buffer, each line
 * ended by one NUL (LF) or two (CRLF), each name by the NUL that was its
 * colon, and every header name and value it hands out points into that
 * block in order. A header whose name is not where the previous line ended
 * was moved by a fold (MHD reallocates the name to append the continuation);
 * bytes other than those NULs between one line's value and the next line's
 * name were hidden by a NUL. So the check walks the headers MHD parsed
 * against the block [method, method + header size) it parsed them from.
 *
 * http.c runs the check on the access handler's first call (all headers
 * in) and answers a failure at once with Connection: close: the bytes that
 * follow cannot be trusted to be a body or a next request. */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <microhttpd.h>

#include "http.h"

/* How the header lines sit in MHD's read buffer (see above). */
enum layout { LAYOUT_OK, LAYOUT_FOLD, LAYOUT_NUL };

/* What the headers of one request say about its framing and syntax. */
typedef struct framing {
  const char *cl;    /* the first Content-Length */
  int cl_differ;     /* a later one with another value */
  int n_te;          /* Transfer-Encoding headers */
  const char *te;    /* the first one */
  char bad_name[64]; /* the first name that is not a token */
  char ctl_name[64]; /* the first header whose value holds a control char */
  int n_host;
  const char *host; /* the first Host */
  /* the layout walk: the block parsed, where the last line's value ended */
  const char *blk, *blk_end, *pos;
  enum layout layout;
} framing;

/* RFC 9110 5.6.2 tchar. */
static int is_tchar(unsigned char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
      (c >= '0' && c <= '9'))
    return 1;
  switch (c) { /* (no strchr: every header name of every request) */
  case '!':
  case '#':
  case '$':
  case '%':
  case '&':
  case '\'':
  case '*':
  case '+':
  case '-':
  case '.':
  case '^':
  case '_':
  case '`':
  case '|':
  case '~':
    return 1;
  default:
    return 0;
  }
}

static int is_token(const char *s, size_t n) {
  if (!n)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (!is_tchar((unsigned char)s[i]))
      return 0;
  return 1;
}

/* RFC 9110 5.5: a field value is visible characters, SP, HTAB and
 * obs-text; CR, LF, NUL and the other controls are not. */
static int has_ctl(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if ((c < 0x20 && c != '\t') || c == 0x7f)
      return 1;
  }
  return 0;
}

static int in_block(const framing *f, const char *p) {
  return (uintptr_t)p >= (uintptr_t)f->blk &&
         (uintptr_t)p <= (uintptr_t)f->blk_end;
}

/* Whether [from, to) holds only NULs, between min and max of them: the end
 * of a line (1: LF, 2: CRLF), or of the last line and the empty one. */
static int nul_run(const char *from, const char *to, size_t min, size_t max) {
  if ((uintptr_t)to < (uintptr_t)from)
    return 0;
  size_t n = (size_t)(to - from);
  if (n < min || n > max)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (from[i])
      return 0;
  return 1;
}

/* One header line where MHD parsed it: its name right after the previous
 * line's end, its colon's NUL, only blanks to its value. */
static enum layout line_layout(const framing *f, const char *name, size_t nlen,
                               const char *value, size_t vlen) {
  if (!in_block(f, name) || !in_block(f, value) || !in_block(f, value + vlen) ||
      (uintptr_t)name < (uintptr_t)f->pos ||
      (uintptr_t)value < (uintptr_t)(name + nlen + 1))
    return LAYOUT_FOLD; /* the name was moved: a continuation was appended */
  if (!nul_run(f->pos, name, 1, 2))
    return LAYOUT_NUL;
  for (const char *p = name + nlen + 1; p < value; p++)
    if (*p != ' ' && *p != '\t')
      return LAYOUT_NUL;
  return LAYOUT_OK;
}

static void note_name(char *out, size_t cap, const char *name) {
  if (!out[0])
    snprintf(out, cap, "%s", name);
}

static enum MHD_Result on_header(void *cls, enum MHD_ValueKind kind,
                                 const char *name, size_t nlen,
                                 const char *value, size_t vlen) {
  framing *f = cls;
  (void)kind;
  if (!value)
    value = "", vlen = 0;
  if (f->layout == LAYOUT_OK && f->blk) {
    f->layout = line_layout(f, name, nlen, value, vlen);
    f->pos = value + vlen;
  }
  if (!is_token(name, nlen)) {
    note_name(f->bad_name, sizeof f->bad_name, name);
    return MHD_YES;
  }
  if (has_ctl(value, vlen))
    note_name(f->ctl_name, sizeof f->ctl_name, name);
  if (strcasecmp(name, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
    if (!f->cl)
      f->cl = value;
    else if (strcmp(f->cl, value) != 0)
      f->cl_differ = 1;
  } else if (strcasecmp(name, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
    if (!f->n_te++)
      f->te = value;
  } else if (strcasecmp(name, MHD_HTTP_HEADER_HOST) == 0) {
    if (!f->n_host++)
      f->host = value;
  }
  return MHD_YES;
}

/* The bytes of a request target that need a second look: controls, space,
 * DEL and '%' (every GET's target passes here). */
static int target_suspect(unsigned char c) {
  return c <= ' ' || c == 0x7f || c == '%';
}

int kcd_framing_target_flaw(const char *t, size_t len) {
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)t[i];
    if (!target_suspect(c))
      continue;
    if (c == ' ')
      return KCD_TARGET_SPACE;
    if (c < ' ' || c == 0x7f)
      return KCD_TARGET_CTL;
    if (c == '%' && i + 2 < len && t[i + 1] == '0' && t[i + 2] == '0')
      return KCD_TARGET_PCT00;
  }
  return KCD_TARGET_OK;
}

/* The raw target: up to the space before the version (a NUL before it
 * ended the string MHD logged), and no flaw when it was logged. */
static kc_err check_target(const kcd_raw_req *raw, char *err) {
  static const char *const what[] = {[KCD_TARGET_PCT00] = "%00 (a NUL byte)",
                                     [KCD_TARGET_SPACE] = "a space",
                                     [KCD_TARGET_CTL] = "a control character"};
  if (!raw->target)
    return KC_OK;
  if (raw->target + raw->target_len + 1 != raw->version)
    return kc_errf(err, KC_EINVAL,
                   "the request target holds a NUL byte: "
                   "refused");
  if (raw->target_flaw)
    return kc_errf(err, KC_EINVAL,
                   "the request target holds %s: refused "
                   "(RFC 9112 3.2: percent-encode it)",
                   what[raw->target_flaw]);
  return KC_OK;
}

/* Sets up the layout walk over MHD's block of the request's header lines;
 * 0 when MHD did not parse it in place as expected (then refused). */
static int layout_begin(struct MHD_Connection *conn, const kcd_raw_req *raw,
                        framing *f) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
  if (!ci || !raw->method || !raw->version)
    return 0;
  f->blk = raw->method;
  f->blk_end = raw->method + ci->header_size;
  f->pos = raw->version + strlen(raw->version);
  return in_block(f, raw->version) && in_block(f, f->pos);
}

static kc_err check_headers(const framing *f, const kcd_raw_req *raw,
                            char *err) {
  if (f->layout == LAYOUT_FOLD)
    return kc_errf(err, KC_EINVAL,
                   "a header line continues on the next "
                   "line (obs-fold): refused (RFC 9112 5.2)");
  if (f->layout == LAYOUT_NUL || !nul_run(f->pos, f->blk_end, 2, 4))
    return kc_errf(err, KC_EINVAL, "a header line holds a NUL byte: refused");
  if (f->bad_name[0])
    return kc_errf(err, KC_EINVAL,
                   "header name '%.60s' is not a token "
                   "(whitespace before the colon?): refused (RFC 9112 5.1)",
                   f->bad_name);
  if (f->ctl_name[0])
    return kc_errf(err, KC_EINVAL,
                   "the value of header '%.60s' holds a "
                   "control character (a bare CR?): refused (RFC 9110 5.5)",
                   f->ctl_name);
  if (f->n_host > 1)
    return kc_errf(err, KC_EINVAL,
                   "Host given %d times: refused (RFC 9112 "
                   "3.2)",
                   f->n_host);
  if (!f->n_host && strcmp(raw->version, MHD_HTTP_VERSION_1_1) == 0)
    return kc_errf(err, KC_EINVAL,
                   "no Host header in a version 1.1 request: "
                   "refused (RFC 9112 3.2)");
  return KC_OK;
}

static kc_err check_framing(const framing *f, char *err) {
  if (f->cl_differ)
    return kc_errf(err, KC_EINVAL,
                   "Content-Length given twice with "
                   "different values: refused (RFC 9112 6.3)");
  if (f->n_te && f->cl)
    return kc_errf(err, KC_EINVAL,
                   "both Content-Length and "
                   "Transfer-Encoding: refused (RFC 9112 6.1)");
  if (f->n_te > 1 || (f->n_te && strcasecmp(f->te, "chunked") != 0))
    return kc_errf(err, KC_NOT_IMPLEMENTED,
                   "Transfer-Encoding '%.60s' is "
                   "not supported: only chunked",
                   f->n_te > 1 ? "(given twice)" : f->te);
  return KC_OK;
}

kc_err kcd_framing_check(struct MHD_Connection *conn, const kcd_raw_req *raw,
                         const char **host, char *err) {
  kc_err e = check_target(raw, err);
  if (e)
    return e;
  framing f = {0};
  if (!layout_begin(conn, raw, &f))
    return kc_errf(err, KC_EINVAL, "malformed request line: refused");
  MHD_get_connection_values_n(conn, MHD_HEADER_KIND, on_header, &f);
  if ((e = check_headers(&f, raw, err)) || (e = check_framing(&f, err)))
    return e;
  *host = f.host;
  return KC_OK;
}

/* ---- Host names a server without tokens answers (DNS rebinding) ---- */

/* The host of a Host value, lowercased, without port, brackets or a final
 * dot: "[::1]:8080" -> "::1", "LocalHost.:80" -> "localhost". 0: too long. */
static int host_name(const char *v, char *out, size_t cap) {
  size_t n;
  if (v[0] == '[') {
    const char *close = strchr(v, ']');
    if (!close)
      return 0;
    v++;
    n = (size_t)(close - v);
  } else {
    const char *colon = strchr(v, ':');
    n = colon ? (size_t)(colon - v) : strlen(v);
  }
  while (n &&
         (v[n - 1] == ' ' || v[n - 1] == '\t')) /* MHD keeps trailing OWS */
    n--;
  if (n && v[n - 1] == '.')
    n--;
  if (n >= cap)
    return 0;
  for (size_t i = 0; i < n; i++)
    out[i] = (char)tolower((unsigned char)v[i]);
  out[n] = '\0';
  return 1;
}

/* Whether name is in the comma-separated list (case-insensitive; "*": any). */
static int in_list(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *p = list; p && *p;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if ((len == 1 && *p == '*') ||
        (len == n && n && strncasecmp(p, name, n) == 0))
      return 1;
    p = comma ? comma + 1 : NULL;
  }
  return 0;
}

int kcd_framing_host_allowed(const kcd_config *c, const char *host) {
  char h[256];
  if (!host || !*host)
    return 1; /* HTTP/1.0 may omit it; a browser always names the host */
  if (!host_name(host, h, sizeof h))
    return in_list(c->allow_hosts, "*");
  size_t n = strlen(h);
  return kcd_host_is_loopback(h) ||
         (n > 10 && strcmp(h + n - 10, ".localhost") == 0) ||
         strcasecmp(h, c->host) == 0 || in_list(c->allow_hosts, h);
}

/* ---- the raw header block: what MHD answers before kcached can ----
 *
 * libmicrohttpd 0.9.75 answers a malformed Content-Length itself while
 * parsing the headers (400, or 413 when too large), and then its state
 * machine builds the same answer's headers a second time: the client reads
 * two status lines (a proxy may take the second as the next request's
 * answer). No callback runs between the headers' arrival and that answer,
 * so conns.c hands this scanner the bytes as they are received, and when
 * it reports one, answers it here and closes the connection instead.
 * It follows the connection's bytes from its first: a header block, then
 * the body its Content-Length gives (skipped), then the next block, so a
 * pipelined request is seen, and a body whose bytes look like headers is
 * never read as headers (it used to re-arm when a request completed, while
 * MHD may already hold the next one: a false 400). A chunked body is
 * followed too, chunk by chunk (RFC 9112 7.1), so the request after it is
 * scanned as well; a chunk framing it cannot follow stops the scan for the
 * rest of the connection (MHD refuses that body and closes the connection
 * itself). Content-Length 2^64-1 is too large: MHD takes that value for
 * "no length" and waits for the connection's end. The body is always
 * skipped whole: MHD
 * 0.9.75 takes an answer only on the headers-only call or after the whole
 * request (MHD_queue_response refuses one in between), and an answer on
 * the headers-only call (an early answer) sets discard_request, so MHD
 * closes the connection after it instead of reading the next request from
 * where the body would have been; its own error answers close too. */

static const char SCAN_CL[] = "content-length:";
static const char SCAN_TE[] = "transfer-encoding:";

/* One byte of the first Content-Length's value, as MHD reads it: blanks
 * before the digits, then digits only (trailing blanks count as junk). */
static void scan_cl_byte(kcd_scan *s, unsigned char c) {
  if (c >= '0' && c <= '9') {
    if (s->cl_bad)
      return;
    if (s->cl > (UINT64_MAX - (c - '0')) / 10)
      s->cl_big = 1;
    s->cl = s->cl * 10 + (c - '0');
    s->cl_digits = 1;
  } else if (!((c == ' ' || c == '\t') && !s->cl_digits)) {
    s->cl_bad = 1;
  }
}

static void scan_byte(kcd_scan *s, unsigned char c) {
  if (s->line > 0) {
    if (s->in_cl) {
      scan_cl_byte(s, c);
    } else {
      unsigned char l = (unsigned char)tolower(c);
      if (s->mcl == s->col && s->mcl < sizeof SCAN_CL - 1 &&
          l == (unsigned char)SCAN_CL[s->mcl] &&
          ++s->mcl == sizeof SCAN_CL - 1 && !s->cl_seen)
        s->cl_seen = s->in_cl = 1;
      if (s->mte == s->col && s->mte < sizeof SCAN_TE - 1 &&
          l == (unsigned char)SCAN_TE[s->mte] && ++s->mte == sizeof SCAN_TE - 1)
        s->te_seen = 1;
    }
  }
  s->col++;
}

/* A line ended: the next, or the block's end and its verdict. */
static int scan_eol(kcd_scan *s) {
  if (s->col == 0 && s->line > 0) {
    if (s->te_seen) { /* MHD ignores Content-Length beside TE */
      memset(s, 0, sizeof *s);
      s->on = KCD_SCAN_CHUNK_SIZE; /* a chunked body, followed */
      return KCD_SCAN_OK;
    }
    if (s->cl_seen && (s->cl_bad || !s->cl_digits))
      return s->on = KCD_SCAN_OFF, KCD_SCAN_BAD_LENGTH;
    /* UINT64_MAX is MHD's MHD_SIZE_UNKNOWN: it would wait for the end */
    if (s->cl_seen && (s->cl_big || s->cl == UINT64_MAX))
      return s->on = KCD_SCAN_OFF, KCD_SCAN_BIG_LENGTH;
    uint64_t body = s->cl_seen ? s->cl : 0;
    memset(s, 0, sizeof *s);
    s->cl = body; /* the body's bytes still to skip */
    s->on = body ? KCD_SCAN_BODY : KCD_SCAN_HEADERS;
    return KCD_SCAN_OK;
  }
  if (s->col > 0 || s->line > 0) /* empty lines before a request: skipped */
    s->line++;
  s->col = s->mcl = s->mte = 0;
  s->in_cl = 0;
  return KCD_SCAN_OK;
}

/* Whether nothing in the rest of the current line can change the verdict:
 * the request line once begun, or a header line whose name matched neither
 * SCAN_CL nor SCAN_TE and that is not the first Content-Length's value.
 * Then only where the line ends matters. */
static int line_settled(const kcd_scan *s) {
  if (s->cr || s->in_cl || s->col == 0)
    return 0;
  return s->line == 0 || (s->mcl != s->col && s->mte != s->col);
}

/* Bytes of a settled line up to its next CR or LF (or the buffer's end):
 * counted, not looked at one by one (most of a request's bytes). */
static size_t line_skip(kcd_scan *s, const char *p, size_t n) {
  const char *cr = memchr(p, '\r', n);
  const char *lf = memchr(p, '\n', cr ? (size_t)(cr - p) : n);
  size_t k = lf ? (size_t)(lf - p) : cr ? (size_t)(cr - p) : n;
  s->col += (unsigned)k;
  return k;
}

/* ---- a chunked body (RFC 9112 7.1), as MHD 0.9.75 reads one ----
 * chunk-size in hex, an extension after ';' ignored, CRLF (or LF); the
 * data; CRLF; ... a last chunk of size 0, trailer lines and an empty line.
 * Anything else: the scan stops (MHD refuses the body and closes). */

static int hexval(unsigned char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  c = (unsigned char)tolower(c);
  return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* A line of the chunked framing ended (its LF). */
static void chunk_eol(kcd_scan *s) {
  s->cr = 0;
  if (s->on == KCD_SCAN_CHUNK_SIZE) {
    if (!s->cl_digits)
      s->on = KCD_SCAN_OFF;
    else
      s->on = s->cl ? KCD_SCAN_CHUNK_DATA : KCD_SCAN_TRAILER;
    s->cl_digits = s->in_cl = 0;
    s->col = 0;
  } else if (s->on == KCD_SCAN_CHUNK_END) {
    s->on = KCD_SCAN_CHUNK_SIZE;
    s->cl = 0;
  } else if (s->col == 0) { /* the empty line after the trailers */
    memset(s, 0, sizeof *s);
    s->on = KCD_SCAN_HEADERS;
  } else {
    s->col = 0;
  }
}

/* One byte of the chunked framing outside chunk data. */
static void chunk_byte(kcd_scan *s, unsigned char c) {
  if (c == '\n') {
    chunk_eol(s);
    return;
  }
  if (s->cr || (c == '\r' && s->on == KCD_SCAN_CHUNK_SIZE && !s->cl_digits)) {
    s->on = KCD_SCAN_OFF; /* a bare CR, or no size before the line's end */
    return;
  }
  if (c == '\r') {
    s->cr = 1;
    return;
  }
  if (s->on == KCD_SCAN_CHUNK_END) {
    s->on = KCD_SCAN_OFF; /* data longer than its size */
  } else if (s->on == KCD_SCAN_TRAILER) {
    s->col++;
  } else if (!s->in_cl) { /* the size, then maybe an extension */
    int h = hexval(c);
    if (h >= 0 && s->cl <= (UINT64_MAX >> 4)) {
      s->cl = s->cl << 4 | (uint64_t)h;
      s->cl_digits = 1;
    } else if (c == ';' && s->cl_digits) {
      s->in_cl = 1;
    } else {
      s->on = KCD_SCAN_OFF;
    }
  }
}

/* Skips chunk data, or the body of a Content-Length: up to n bytes; what
 * comes after them. */
static size_t body_skip(kcd_scan *s, size_t n) {
  uint64_t k = n < s->cl ? n : s->cl;
  s->cl -= k;
  if (s->cl == 0)
    s->on = s->on == KCD_SCAN_BODY ? KCD_SCAN_HEADERS : KCD_SCAN_CHUNK_END;
  return (size_t)k;
}

int kcd_framing_scan(kcd_scan *s, const char *p, size_t n) {
  for (size_t i = 0; i < n && s->on; i++) {
    if (s->on == KCD_SCAN_BODY || s->on == KCD_SCAN_CHUNK_DATA) {
      i += body_skip(s, n - i) - 1; /* then the next block, or chunk */
      continue;
    }
    if (s->on >= KCD_SCAN_CHUNK_SIZE) {
      chunk_byte(s, (unsigned char)p[i]);
      continue;
    }
    if (line_settled(s) && (i += line_skip(s, p + i, n - i)) == n)
      break;
    unsigned char c = (unsigned char)p[i];
    if (s->cr) {
      s->cr = 0;
      if (c == '\n') {
        int v = scan_eol(s);
        if (v)
          return v;
        continue;
      }
      scan_byte(s, '\r'); /* a bare CR: inside the line, as MHD keeps it */
    }
    if (c == '\r') {
      s->cr = 1;
    } else if (c == '\n') {
      int v = scan_eol(s);
      if (v)
        return v;
    } else {
      scan_byte(s, c);
    }
  }
  return KCD_SCAN_OK;
}

#define SCAN_ANSWER(status, code, msg)                                         \
  "HTTP/1.1 " status "\r\nConnection: close\r\nContent-Type: "                 \
  "application/json\r\nContent-Length: " #code "\r\n\r\n" msg

const char *kcd_framing_scan_answer(int verdict, size_t *len) {
  static const char bad[] = SCAN_ANSWER(
      "400 Bad Request", 98,
      "{\"error\":\"bad_request\",\"message\":"
      "\"Content-Length is not a decimal number: refused (RFC 9112 6.3)\"}");
  static const char big[] =
      SCAN_ANSWER("413 Content Too Large", 70,
                  "{\"error\":\"too_large\",\"message\":"
                  "\"Content-Length is too large a number\"}");
  const char *a = verdict == KCD_SCAN_BIG_LENGTH ? big : bad;
  *len = verdict == KCD_SCAN_BIG_LENGTH ? sizeof big - 1 : sizeof bad - 1;
  return a;
}
