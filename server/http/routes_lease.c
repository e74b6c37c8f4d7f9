/* routes_lease.c: POST /v1/leases/{key} (take the build lease, or learn the
 * bundle is present, or who holds it and when to retry) and
 * DELETE /v1/leases/{key}?lease=<token>. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "http.h"

#define DEFAULT_TTL_S 300

typedef struct lease_req {
  const char *holder;
  uint64_t ttl_s;
} lease_req;

static kc_err check_holder(const char *h, char *err) {
  size_t n = strlen(h);
  if (n == 0 || n > KCD_HOLDER_MAX)
    return kc_errf(err, KC_EINVAL, "holder: must be 1-%d bytes",
                   KCD_HOLDER_MAX);
  for (; *h; h++)
    if ((unsigned char)*h < 0x20 || (unsigned char)*h > 0x7e)
      return kc_errf(err, KC_EINVAL, "holder: printable ASCII only");
  return KC_OK;
}

/* {"holder": "...", "ttl_s": N}, both optional; an empty body is allowed. */
static kc_err parse_lease(kcd_req *r, json_t **root, lease_req *out,
                          char *err) {
  static const char *const allowed[] = {"holder", "ttl_s", NULL};
  out->holder = strcmp(r->token_name, "-") ? r->token_name : "anonymous";
  out->ttl_s = DEFAULT_TTL_S;
  if (r->body_len == 0)
    return KC_OK;
  kc_err e = kcd_json_object(r, allowed, root, err);
  if (e)
    return e;
  json_t *h = json_object_get(*root, "holder");
  json_t *t = json_object_get(*root, "ttl_s");
  if (h && !json_is_string(h))
    return kc_errf(err, KC_EINVAL, "holder: must be a string");
  if (h && (e = check_holder(json_string_value(h), err)))
    return e;
  uint64_t max = r->st->cfg.lease_max_ttl_s;
  if (t && (!json_is_integer(t) || json_integer_value(t) < 1 ||
            (uint64_t)json_integer_value(t) > max))
    return kc_errf(err, KC_EINVAL, "ttl_s: must be an integer in 1..%llu",
                   (unsigned long long)max);
  if (h)
    out->holder = json_string_value(h);
  if (t)
    out->ttl_s = (uint64_t)json_integer_value(t);
  return KC_OK;
}

static int reply_leased(kcd_req *r, const kcd_lease_info *info) {
  uint64_t secs = (info->remaining_ms + 999) / 1000;
  char retry[24];
  snprintf(retry, sizeof retry, "%llu", (unsigned long long)(secs ? secs : 1));
  const char *const h[] = {"Retry-After", retry, NULL};
  char msg[KC_ERRBUF_SIZE];
  snprintf(msg, sizeof msg, "'%s' holds the lease for %llu more seconds",
           info->holder, (unsigned long long)secs);
  json_t *extra = json_pack("{ss sI}", "holder", info->holder, "expires_s",
                            (json_int_t)secs);
  return kcd_reply_error_json(r, KC_LEASED, msg, extra, h);
}

/* The bundle present, a lease granted, or why not (service.c decides). */
static int take(kcd_req *r, const lease_req *q) {
  kcd_lease_info info;
  int present = 0;
  kc_err e = kcd_svc_lease_take(r->st, KCD_FE_HTTP, r->param, q->holder,
                                q->ttl_s, &info, &present);
  if (present)
    return kcd_reply_json(r, 200, json_pack("{ss}", "status", "present"), NULL);
  if (e == KC_LEASED)
    return reply_leased(r, &info);
  if (e == KC_BUSY)
    return kcd_reply_error(r, e, "too many leases held; try again later");
  if (e)
    return kcd_reply_error(r, e, "cannot grant a lease");
  return kcd_reply_json(r, 201,
                        json_pack("{ss ss sI}", "lease", info.token, "key",
                                  r->param, "expires_s", (json_int_t)q->ttl_s),
                        NULL);
}

/* A web page may POST across origins without CORS (a form, or fetch in
 * no-cors mode), but only with a form's content types and without
 * Authorization. Requiring JSON, or a token's header, keeps a page from
 * squatting leases on a loopback kcached without tokens. */
static int json_or_token(kcd_req *r) {
  if (kcd_header(r, "Authorization"))
    return 1;
  const char *ct = kcd_header(r, "Content-Type");
  static const char json[] = "application/json";
  if (!ct)
    return 0;
  while (*ct == ' ' || *ct == '\t')
    ct++;
  if (strncasecmp(ct, json, sizeof json - 1) != 0)
    return 0;
  ct += sizeof json - 1;
  return *ct == '\0' || *ct == ';' || *ct == ' ' || *ct == '\t';
}

int kcd_lease_post(kcd_req *r) {
  char err[KC_ERRBUF_SIZE] = "";
  json_t *root = NULL;
  lease_req q;
  if (!json_or_token(r))
    return kcd_reply_error(r, KC_UNSUPPORTED_MEDIA,
                           "a lease request needs "
                           "Content-Type: application/json (or a token): "
                           "web pages cannot send it across origins");
  kc_err e = parse_lease(r, &root, &q, err);
  int ret = e ? kcd_reply_error_json(r, e, err, NULL, NULL) : take(r, &q);
  json_decref(root); /* q.holder may point into it until here */
  return ret;
}

int kcd_lease_delete(kcd_req *r) {
  const char *token = kcd_query(r, "lease");
  if (!token || !*token)
    return kcd_reply_error(r, KC_EINVAL,
                           "lease: the ?lease=<token> query is missing");
  kc_err e = kcd_svc_lease_release(r->st, KCD_FE_HTTP, r->param, token);
  if (e == KC_NOT_FOUND)
    return kcd_reply_error(r, e, "no live lease on %s", r->param);
  if (e == KC_FORBIDDEN)
    return kcd_reply_error(r, e, "the lease token does not match");
  return kcd_reply(r, 204, NULL, "", 0, KCD_MEM_PERSISTENT, NULL);
}
