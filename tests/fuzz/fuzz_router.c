/* fuzz_router.c: libFuzzer target for kcached's request router (routes.c):
 * kcd_route_find (path matching and the {param} copy into a bounded buffer),
 * kcd_route_op (method dispatch) and the route's Allow list of a 405,
 * kcd_route_name / kcd_method_of (the table's names), and kcd_json_object
 * (the strict JSON bodies of POST /v1/lookup and POST /v1/leases/{key}).
 *
 * Input: "METHOD PATH\nBODY" (a request line without the version; a first
 * line without a space is a GET of that path). The query string is not
 * here: libmicrohttpd splits it off and parses it before kcached sees the
 * path (kcd_query is MHD_lookup_connection_value), so no code of ours parses
 * one. The results are checked against a reference table written from
 * docs/DESIGN.md's API, independent of routes.c. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "http.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fz_init_jansson();
  return 0;
}

/* docs/DESIGN.md, "HTTP API". */
static const struct ref_route {
  const char *path; /* exact, or prefix when param */
  kcd_route_id id;
  int param;
  const char *methods; /* space-separated */
  const char *suffix;  /* after the param ("/warmup"); tried first */
} ref[] = {
    {"/healthz", KCD_R_HEALTHZ, 0, "GET HEAD", NULL},
    {"/readyz", KCD_R_READYZ, 0, "GET HEAD", NULL},
    {"/metrics", KCD_R_METRICS, 0, "GET HEAD", NULL},
    {"/v1/stats", KCD_R_STATS, 0, "GET HEAD", NULL},
    {"/v1/lookup", KCD_R_LOOKUP, 0, "POST", NULL},
    /* before "/v1/blobs/": an exact path wins over a param route */
    {"/v1/blobs/fetch", KCD_R_BLOBS_FETCH, 0, "POST", NULL},
    {"/v1/blobs/", KCD_R_BLOBS, 1, "GET HEAD PUT", NULL},
    {"/v1/bundles/", KCD_R_BUNDLES, 1, "GET HEAD PUT DELETE", NULL},
    {"/v1/models/", KCD_R_MODELS, 1, "GET HEAD DELETE", NULL},
    {"/v1/leases/", KCD_R_LEASES, 1, "POST DELETE", NULL},
    {"/v1/models", KCD_R_MODEL_INDEX, 0, "GET HEAD", NULL},
    {"/v1/models/", KCD_R_WARMUP, 1, "GET HEAD PUT", "/warmup"},
    {"/v1/models/", KCD_R_COVERAGE, 1, "GET HEAD", "/coverage"},
    {"/v1/stats/history", KCD_R_HISTORY, 0, "GET HEAD", NULL},
    {"/v1/demand", KCD_R_DEMAND, 0, "POST", NULL},
    {"/v1/models/", KCD_R_MODEL_DEMAND, 1, "GET HEAD", "/demand"},
    {"/", KCD_R_PAGE, 0, "GET HEAD", NULL},
    {"/app.js", KCD_R_PAGE_JS, 0, "GET HEAD", NULL},
    {"/style.css", KCD_R_PAGE_CSS, 0, "GET HEAD", NULL},
};

/* The reference's match of path: a route with a suffix first (prefix, a
 * param without '/', the suffix), then the others. *tail, *tail_len: the
 * param's text in path. */
static const struct ref_route *ref_find(const char *path, const char **tail,
                                        size_t *tail_len) {
  size_t pl = strlen(path);
  for (int pass = 0; pass < 2; pass++)
    for (size_t i = 0; i < sizeof ref / sizeof ref[0]; i++) {
      const struct ref_route *r = &ref[i];
      size_t n = strlen(r->path), sl = r->suffix ? strlen(r->suffix) : 0;
      if ((pass == 0) != (r->suffix != NULL))
        continue;
      if (r->suffix && (pl < n + sl || strncmp(path, r->path, n) ||
                        strcmp(path + pl - sl, r->suffix) ||
                        memchr(path + n, '/', pl - n - sl)))
        continue;
      if (!r->suffix && (r->param ? strncmp(path, r->path, n) != 0
                                  : strcmp(path, r->path) != 0))
        continue;
      *tail = path + n;
      *tail_len = pl - n - sl;
      return r;
    }
  return NULL;
}

/* 1 if `word` is one of the items of a list separated by `seps`. */
static int in_list(const char *list, const char *word, const char *seps) {
  size_t n = strlen(word);
  for (const char *p = list; *p;) {
    p += strspn(p, seps);
    size_t k = strcspn(p, seps);
    if (k == n && strncmp(p, word, n) == 0)
      return 1;
    p += k;
  }
  return 0;
}

static int is_hex64(const char *s) {
  size_t i = 0;
  for (; s[i]; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
      return 0;
  return i == 64;
}

static void check_route(const char *path, size_t cap) {
  /* Exactly cap bytes, so that a write past it is an ASan report. */
  char *param = malloc(cap);
  FZ_CHECK(param, "malloc");
  memset(param, 'Z', cap);
  const kcd_route *rt = kcd_route_find(path, param, cap);
  FZ_CHECK(memchr(param, '\0', cap), "param not NUL-terminated (cap %zu)", cap);

  const char *tail = NULL;
  size_t tl = 0;
  const struct ref_route *want = ref_find(path, &tail, &tl);
  if (!want) {
    FZ_CHECK(rt == NULL, "'%s' routed to %s; docs/DESIGN.md has no such route",
             path, kcd_route_name(rt->id));
    FZ_CHECK(param[0] == '\0', "no route but param '%s'", param);
    free(param);
    return;
  }
  FZ_CHECK(rt != NULL, "'%s' not routed; docs/DESIGN.md routes it to %s", path,
           kcd_route_name(want->id));
  FZ_CHECK(rt->id == want->id, "'%s' routed to %s, not %s", path,
           kcd_route_name(rt->id), kcd_route_name(want->id));
  FZ_CHECK((rt->param != KCD_P_NONE) == want->param, "param kind of %s", path);
  /* metrics.c names a route by its id: the same name as the table's. */
  FZ_CHECK(strcmp(kcd_route_name(rt->id), rt->name) == 0, "name of %s",
           rt->name);
  FZ_CHECK(strcmp(rt->name, "other") != 0, "route name");

  if (want->param) {
    size_t pl = strlen(param);
    FZ_CHECK(pl == (tl < cap - 1 ? tl : cap - 1),
             "param of '%s' is %zu bytes (cap %zu)", path, pl, cap);
    FZ_CHECK(strncmp(param, tail, pl) == 0, "param is not the path's tail");
    /* http.c accepts the param only if it is a SHA-256; a truncated one
     * never is (kcd.h) as long as cap - 1 > 64: true of http.c's 96, not of
     * caps of 65 or less, where 64 hex digits can be the cut of a longer
     * tail. */
    char *whole = strndup(tail, tl);
    FZ_CHECK(whole, "strndup");
    if (cap > 65)
      FZ_CHECK(kc_is_hex64(param) == is_hex64(whole),
               "hex64 check of param '%s' (tail '%s', cap %zu)", param, whole,
               cap);
    free(whole);
  } else {
    FZ_CHECK(param[0] == '\0', "param '%s' on a route without one", param);
  }

  /* Every method: an op iff docs/DESIGN.md lists it, and the Allow header of a
   * 405 names exactly those. */
  for (int m = 0; m < KCD_N_METHODS; m++) {
    const kcd_op *op = kcd_route_op(rt, (kcd_method)m);
    const char *name = kcd_method_name((kcd_method)m);
    FZ_CHECK(kcd_method_of(name) == (kcd_method)m, "method %s", name);
    int listed = m != KCD_M_OTHER && in_list(want->methods, name, " ");
    FZ_CHECK(!!op == listed, "%s %s: op %p, docs/DESIGN.md %s", name,
             want->path, (const void *)op, listed ? "lists it" : "does not");
    FZ_CHECK(in_list(rt->allow, name, ", ") == listed, "Allow '%s' and %s",
             rt->allow, name);
    if (!op)
      continue;
    FZ_CHECK(op->method == (kcd_method)m, "op of another method");
    FZ_CHECK(op->finish, "op without finish");
    FZ_CHECK(op->role <= KCD_ROLE_ADMIN, "role %d", (int)op->role);
    FZ_CHECK(op->body != KCD_BODY_STREAM || (op->begin && op->data),
             "stream op without begin/data");
  }
  free(param);
}

static void check_body(const kcd_route *rt, const char *body, size_t len) {
  static const char *const lookup[] = {"keys", NULL};
  static const char *const lease[] = {"holder", "ttl_s", NULL};
  static const char *const fetch[] = {"digests", NULL};
  const char *const *allowed = rt && rt->id == KCD_R_LEASES        ? lease
                               : rt && rt->id == KCD_R_BLOBS_FETCH ? fetch
                                                                   : lookup;
  kcd_req r;
  memset(&r, 0, sizeof r);
  char *copy = NULL;
  if (len) { /* exactly len bytes, no NUL, like http.c's body buffer */
    copy = malloc(len);
    FZ_CHECK(copy, "malloc");
    memcpy(copy, body, len);
  }
  r.body = copy;
  r.body_len = len;
  char err[KC_ERRBUF_SIZE];
  json_t *j = (json_t *)&r; /* must be reset */
  fz_err_reset(err);
  kc_err e = kcd_json_object(&r, allowed, &j, err);
  if (e) {
    FZ_CHECK(j == NULL, "error but *out set");
    fz_err_ok(err, 0, "kcd_json_object");
    FZ_CHECK(e == KC_BAD_JSON || e == KC_EINVAL, "code %d", (int)e);
  } else {
    FZ_CHECK(json_is_object(j), "not an object");
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v) {
      (void)v;
      size_t i = 0;
      while (allowed[i] && strcmp(allowed[i], k))
        i++;
      FZ_CHECK(allowed[i], "field '%s' not allowed but accepted", k);
    }
    json_decref(j);
  }
  free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *in = (const char *)data;
  const char *nl = memchr(in, '\n', size);
  size_t line_len = nl ? (size_t)(nl - in) : size;
  const char *sp = memchr(in, ' ', line_len);
  char method[16] = "GET";
  const char *p = in;
  size_t plen = line_len;
  if (sp) {
    size_t ml = (size_t)(sp - in);
    /* kcd_req.method_str is 16 bytes; longer methods are OTHER anyway */
    snprintf(method, sizeof method, "%.*s", (int)(ml < 15 ? ml : 15), in);
    p = sp + 1;
    plen = line_len - ml - 1;
  }
  /* MHD hands over a C string: the path ends at a NUL. */
  char *path = malloc(plen + 1);
  FZ_CHECK(path, "malloc");
  memcpy(path, p, plen);
  path[plen] = '\0';

  check_route(path, 96); /* sizeof kcd_req.param */
  check_route(path, 1 + size % 97);

  char param[96];
  const kcd_route *rt = kcd_route_find(path, param, sizeof param);
  const kcd_op *op = rt ? kcd_route_op(rt, kcd_method_of(method)) : NULL;
  (void)op;
  if (nl)
    check_body(rt, nl + 1, size - line_len - 1);
  free(path);
  return 0;
}
