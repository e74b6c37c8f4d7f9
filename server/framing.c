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
 *   http.c records it from MHD's URI log callback, before decoding).
 *
 * http.c runs the check on the access handler's first call (all headers
 * in) and answers a failure at once with Connection: close: the bytes that
 * follow cannot be trusted to be a body or a next request. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <microhttpd.h>

#include "kcd.h"

/* What the headers of one request say about its framing. */
typedef struct framing {
  const char *cl;   /* the first Content-Length */
  int cl_differ;    /* a later one with another value */
  int n_te;         /* Transfer-Encoding headers */
  const char *te;   /* the first one */
  char bad_name[64]; /* the first name that is not a token */
} framing;

/* RFC 9110 5.6.2 tchar. */
static int is_tchar(unsigned char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
      (c >= '0' && c <= '9'))
    return 1;
  switch (c) { /* (no strchr: every header name of every request) */
  case '!': case '#': case '$': case '%': case '&': case '\'': case '*':
  case '+': case '-': case '.': case '^': case '_': case '`': case '|':
  case '~':
    return 1;
  default:
    return 0;
  }
}

static int is_token(const char *s) {
  if (!*s)
    return 0;
  for (; *s; s++)
    if (!is_tchar((unsigned char)*s))
      return 0;
  return 1;
}

static enum MHD_Result on_header(void *cls, enum MHD_ValueKind kind,
                                 const char *name, const char *value) {
  framing *f = cls;
  (void)kind;
  if (!is_token(name)) {
    if (!f->bad_name[0])
      snprintf(f->bad_name, sizeof f->bad_name, "%s", name);
    return MHD_YES;
  }
  if (strcasecmp(name, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
    if (!f->cl)
      f->cl = value ? value : "";
    else if (strcmp(f->cl, value ? value : "") != 0)
      f->cl_differ = 1;
  } else if (strcasecmp(name, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
    if (!f->n_te++)
      f->te = value ? value : "";
  }
  return MHD_YES;
}

kc_err kcd_framing_check(struct MHD_Connection *conn, int raw_nul,
                         char *err) {
  if (raw_nul)
    return kc_errf(err, KC_EINVAL, "the request target holds %%00 (a NUL "
                   "byte): refused");
  framing f = {0};
  MHD_get_connection_values(conn, MHD_HEADER_KIND, on_header, &f);
  if (f.bad_name[0])
    return kc_errf(err, KC_EINVAL, "header name '%.60s' is not a token "
                   "(whitespace before the colon?): refused (RFC 9112 5.1)",
                   f.bad_name);
  if (f.cl_differ)
    return kc_errf(err, KC_EINVAL, "Content-Length given twice with "
                   "different values: refused (RFC 9112 6.3)");
  if (f.n_te && f.cl)
    return kc_errf(err, KC_EINVAL, "both Content-Length and "
                   "Transfer-Encoding: refused (RFC 9112 6.1)");
  if (f.n_te > 1 || (f.n_te && strcasecmp(f.te, "chunked") != 0))
    return kc_errf(err, KC_NOT_IMPLEMENTED, "Transfer-Encoding '%.60s' is "
                   "not supported: only chunked",
                   f.n_te > 1 ? "(given twice)" : f.te);
  return KC_OK;
}
