/* test_server_fetch.c: POST /v1/blobs/fetch, many blobs in one
 * answer: hits, missing and mixed lists in the order asked (duplicates
 * included), raw and zstd-held blobs with and without Accept-Encoding:
 * zstd, an answer of many pieces, bad bodies and digests (400, nothing
 * lost), too many digests or bytes (413), the method (405), and the roles
 * (a read token may, none may not). The real kcached on loopback. */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "servertest.h"

/* One item of an answer. */
typedef struct item {
  char digest[65];
  char how[16]; /* raw, zstd, missing */
  const char *bytes;
  size_t len;
} item;

/* Splits an answer into its items (at most max); how many, or -1 when it is
 * not framed as docs/DESIGN.md says. */
static long parse(const resp *r, item *it, size_t max) {
  const char *p = r->body, *end = r->body + r->len;
  size_t n = 0;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    unsigned long long len;
    if (!nl || n == max || (size_t)(nl - p) > 100)
      return -1;
    char line[128];
    snprintf(line, sizeof line, "%.*s", (int)(nl - p), p);
    if (sscanf(line, "%64s %llu %15s", it[n].digest, &len, it[n].how) != 3)
      return -1;
    it[n].bytes = nl + 1;
    it[n].len = (size_t)len;
    if (len > (unsigned long long)(end - (nl + 1)))
      return -1;
    p = nl + 1 + len;
    n++;
  }
  return (long)n;
}

static resp fetch(const kc_testsrv *t, const char *token, const char *body,
                  int zstd) {
  return http(t, "/v1/blobs/fetch",
              (req){.method = "POST",
                    .token = token,
                    .body = body,
                    .len = strlen(body),
                    .header = zstd ? "Accept-Encoding: zstd" : NULL});
}

/* {"digests":[d0, d1, ...]} */
static char *body_of(char (*d)[65], size_t n) {
  char *b = malloc(n * 67 + 32);
  size_t len = (size_t)sprintf(b, "{\"digests\":[");
  for (size_t i = 0; i < n; i++)
    len += (size_t)sprintf(b + len, "%s\"%s\"", i ? "," : "", d[i]);
  sprintf(b + len, "]}");
  return b;
}

static char *text_bytes(size_t n, unsigned seed) {
  char *p = malloc(n ? n : 1);
  for (size_t i = 0; i < n; i++)
    p[i] = (char)('a' + (i / 7 + seed) % 26);
  return p;
}

/* The item's content: its bytes, or its frame decoded. */
static void expect_item(const item *x, const char *digest, const char *p,
                        size_t n) {
  assert_string_equal(x->digest, digest);
  if (!strcmp(x->how, "raw")) {
    assert_int_equal(x->len, n);
    assert_memory_equal(x->bytes, p, n);
    return;
  }
  assert_string_equal(x->how, "zstd");
  assert_true(x->len < n); /* held compressed, sent as held */
  char *out = malloc(n + 1);
  size_t got = ZSTD_decompress(out, n + 1, x->bytes, x->len);
  assert_false(ZSTD_isError(got));
  assert_int_equal(got, n);
  assert_memory_equal(out, p, n);
  free(out);
}

/* Hits, a miss, a duplicate and an empty blob, in the order asked; a
 * compressible blob comes as its frame only to a client that takes zstd. */
static void t_mixed(void **state) {
  (void)state;
  char d[6][65], v[64];
  char *rnd = malloc(5000), *txt = text_bytes(70000, 3);
  fill_random(rnd, 5000, 41);
  assert_int_equal(put_blob(&S, NULL, rnd, 5000, d[0]), 201);
  assert_int_equal(put_blob(&S, NULL, txt, 70000, d[1]), 201);
  assert_int_equal(put_blob(&S, NULL, "", 0, d[2]), 201);
  sha_hex("never stored", 12, d[3]);
  strcpy(d[4], d[0]);
  strcpy(d[5], d[1]);
  char *body = body_of(d, 6);
  static const char *const hit = "kcached_ops_total{op=\"get\",frontend="
                                 "\"http\",result=\"hit\"}",
                           *miss = "kcached_ops_total{op=\"get\",frontend="
                                   "\"http\",result=\"miss\"}";
  long hits = metric(&S, hit), misses = metric(&S, miss);
  for (int zstd = 0; zstd < 2; zstd++) {
    resp r = fetch(&S, NULL, body, zstd);
    assert_int_equal(r.status, 200);
    assert_true(header(&r, "Content-Type", v, sizeof v));
    assert_string_equal(v, "application/vnd.kcache.blobs");
    item it[8];
    assert_int_equal(parse(&r, it, 8), 6);
    expect_item(&it[0], d[0], rnd, 5000);
    expect_item(&it[1], d[1], txt, 70000);
    assert_string_equal(it[1].how, zstd ? "zstd" : "raw");
    expect_item(&it[2], d[2], "", 0);
    assert_string_equal(it[3].digest, d[3]);
    assert_string_equal(it[3].how, "missing");
    assert_int_equal(it[3].len, 0);
    expect_item(&it[4], d[0], rnd, 5000);
    expect_item(&it[5], d[1], txt, 70000);
    resp_free(&r);
  }
  /* each item counts as a GET of it: five hits and a miss per answer (a
   * series not yet shown is -1) */
  assert_int_equal(metric(&S, hit) - (hits < 0 ? 0 : hits), 10);
  assert_int_equal(metric(&S, miss) - (misses < 0 ? 0 : misses), 2);
  resp r = fetch(&S, NULL, "{\"digests\":[]}", 0); /* nothing asked */
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, 0);
  resp_free(&r);
  free(body);
  free(rnd);
  free(txt);
}

/* An answer of many 128 KiB pieces: small blobs sharing pieces, large
 * ones spanning several, held raw and compressed, all exact. */
static void t_many_pieces(void **state) {
  (void)state;
  enum { N = 60 };
  char d[N][65];
  char *p[N];
  size_t n[N];
  for (size_t i = 0; i < N; i++) {
    n[i] = i % 10 == 9 ? 600000 + i : 1000 + 997 * i;
    p[i] = i % 2 ? text_bytes(n[i], (unsigned)i) : malloc(n[i]);
    if (i % 2 == 0)
      fill_random(p[i], n[i], (unsigned)i);
    long st = put_blob(&S, NULL, p[i], n[i], d[i]);
    assert_true(st == 200 || st == 201);
  }
  char *body = body_of(d, N);
  for (int zstd = 0; zstd < 2; zstd++) {
    resp r = fetch(&S, NULL, body, zstd);
    assert_int_equal(r.status, 200);
    item it[N];
    assert_int_equal(parse(&r, it, N), N);
    for (size_t i = 0; i < N; i++)
      expect_item(&it[i], d[i], p[i], n[i]);
    resp_free(&r);
  }
  for (size_t i = 0; i < N; i++)
    free(p[i]);
  free(body);
}

/* Each bad body is a 400 with a JSON error that says what, and the server
 * goes on serving what it holds. */
static void t_bad_bodies(void **state) {
  (void)state;
  char d[65], b[400];
  assert_int_equal(put_blob(&S, NULL, "kept", 4, d), 201);
  for (size_t i = 0; i < N_BAD_HEX; i++) {
    snprintf(b, sizeof b, "{\"digests\":[\"%s\",\"%s\"]}", d, bad_hex[i]);
    resp r = fetch(&S, NULL, b, 0);
    assert_error(&r, 400, "bad_digest");
    assert_true(error_mentions(&r, "digests[1]"));
    resp_free(&r);
  }
  static const struct {
    const char *body, *code, *says;
  } bad[] = {
      {"{\"digests\":[", "bad_json", "malformed"},
      {"[\"a\"]", "bad_request", "object"},
      {"{\"digests\":\"abc\"}", "bad_request", "array"},
      {"{\"digests\":[1]}", "bad_digest", "digests[0]"},
      {"{\"digests\":[],\"more\":1}", "bad_request", "unknown field"},
      {"{\"digests\":[],\"digests\":[]}", "bad_json", "duplicate"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    resp r = fetch(&S, NULL, bad[i].body, 0);
    assert_error(&r, 400, bad[i].code);
    assert_true(error_mentions(&r, bad[i].says));
    resp_free(&r);
  }
  snprintf(b, sizeof b, "{\"digests\":[\"%s\"]}", d); /* nothing lost */
  resp r = fetch(&S, NULL, b, 0);
  item it[1];
  assert_int_equal(r.status, 200);
  assert_int_equal(parse(&r, it, 1), 1);
  expect_item(&it[0], d, "kept", 4);
  resp_free(&r);
  r = http(&S, "/v1/blobs/fetch", (req){0});
  assert_error(&r, 405, "method_not_allowed");
  char v[64];
  assert_true(header(&r, "Allow", v, sizeof v));
  assert_string_equal(v, "POST");
  resp_free(&r);
}

/* Over 4096 digests, or over 256 MiB of blobs (one of 900 KB asked for
 * 300 times): 413, saying how to do better. */
static void t_too_large(void **state) {
  (void)state;
  enum { MANY = 4097 };
  char(*d)[65] = malloc(MANY * sizeof *d);
  char *p = malloc(900000);
  fill_random(p, 900000, 5);
  assert_int_equal(put_blob(&S, NULL, p, 900000, d[0]), 201);
  for (size_t i = 1; i < MANY; i++)
    strcpy(d[i], d[0]);
  char *body = body_of(d, MANY);
  resp r = fetch(&S, NULL, body, 0);
  assert_error(&r, 413, "too_large");
  assert_true(error_mentions(&r, "at most 4096"));
  resp_free(&r);
  free(body);
  body = body_of(d, 300);
  r = fetch(&S, NULL, body, 0);
  assert_error(&r, 413, "too_large");
  assert_true(error_mentions(&r, "ask for fewer"));
  resp_free(&r);
  free(body);
  body = body_of(d, 3); /* within the bounds: served */
  r = fetch(&S, NULL, body, 0);
  item it[3];
  assert_int_equal(r.status, 200);
  assert_int_equal(parse(&r, it, 3), 3);
  expect_item(&it[2], d[0], p, 900000);
  resp_free(&r);
  free(body);
  free(d);
  free(p);
}

/* With tokens: a read token may, no token may not (401), a bad one 401. */
static void t_roles(void **state) {
  (void)state;
  kc_testsrv A;
  char file[600], rd[128], wr[128], d[65], b[200];
  assert_int_equal(kc_testsrv_init(&A), 0);
  snprintf(file, sizeof file, "%s/tokens", A.dir);
  new_token("read", "reader", file, rd, sizeof rd);
  new_token("write", "writer", file, wr, sizeof wr);
  const char *const args[] = {"--tokens", file, NULL};
  assert_int_equal(kc_testsrv_start(&A, args), 0);
  assert_int_equal(put_blob(&A, wr, "secret", 6, d), 201);
  snprintf(b, sizeof b, "{\"digests\":[\"%s\"]}", d);
  resp r = fetch(&A, NULL, b, 0);
  assert_error(&r, 401, "unauthorized");
  resp_free(&r);
  r = fetch(&A, "not-a-token", b, 0);
  assert_error(&r, 401, "unauthorized");
  resp_free(&r);
  const char *ok[] = {rd, wr};
  for (int i = 0; i < 2; i++) {
    item it[1];
    r = fetch(&A, ok[i], b, 0);
    assert_int_equal(r.status, 200);
    assert_int_equal(parse(&r, it, 1), 1);
    expect_item(&it[0], d, "secret", 6);
    resp_free(&r);
  }
  assert_int_equal(kc_testsrv_stop_checked(&A, "tokens"), 0);
  kc_testsrv_cleanup(&A);
}

int main(void) {
  const struct CMUnitTest api[] = {
      cmocka_unit_test(t_mixed),
      cmocka_unit_test(t_many_pieces),
      cmocka_unit_test(t_bad_bodies),
      cmocka_unit_test(t_too_large),
  };
  const struct CMUnitTest own[] = {cmocka_unit_test(t_roles)};
  servertest_init();
  int fails =
      cmocka_run_group_tests_name("fetch", api, open_setup, open_teardown);
  fails += cmocka_run_group_tests_name("fetch_roles", own, NULL, NULL);
  return fails ? 1 : 0;
}
