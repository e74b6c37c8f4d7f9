/* page.c: GET / and its script and style sheet: one self-contained page,
 * embedded in the binary at build time (server/http/page/, embed.cmake),
 * that shows the cache through the JSON API. Its Content-Security-Policy lets
 * it load and connect only to this server, run no inline script and be framed
 * by no one; what it shows from the store goes in as text, never as HTML. */
#include <stddef.h>

#include "http.h"

extern const unsigned char kcd_page_index_html[], kcd_page_app_js[],
    kcd_page_style_css[];
extern const size_t kcd_page_index_html_len, kcd_page_app_js_len,
    kcd_page_style_css_len;

#define KCD_PAGE_CSP                                                           \
  "default-src 'self'; script-src 'self'; style-src 'self'; "                  \
  "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; "         \
  "base-uri 'none'; form-action 'none'"

int kcd_page_get(kcd_req *r) {
  static const char *const headers[] = {"Content-Security-Policy",
                                        KCD_PAGE_CSP,
                                        "X-Content-Type-Options",
                                        "nosniff",
                                        "X-Frame-Options",
                                        "DENY",
                                        "Referrer-Policy",
                                        "no-referrer",
                                        "Cache-Control",
                                        "no-cache",
                                        NULL};
  const void *data = kcd_page_index_html;
  size_t len = kcd_page_index_html_len;
  const char *ctype = "text/html; charset=utf-8";
  if (r->rt->id == KCD_R_PAGE_JS) {
    data = kcd_page_app_js;
    len = kcd_page_app_js_len;
    ctype = "text/javascript; charset=utf-8";
  } else if (r->rt->id == KCD_R_PAGE_CSS) {
    data = kcd_page_style_css;
    len = kcd_page_style_css_len;
    ctype = "text/css; charset=utf-8";
  }
  return kcd_reply(r, 200, ctype, data, len, KCD_MEM_PERSISTENT, headers);
}
