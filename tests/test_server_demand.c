/* test_server_demand.c: kcached integration tests (the real binary on a free
 * loopback port) of demand feedback: POST /v1/demand and GET
 * /v1/models/{model}/demand; counts batched by the once-a-second flush, the
 * read role, bad input answered 400 naming the element, persistence across a
 * graceful stop and a SIGKILL, and the bounds a hostile client meets (100k
 * distinct shapes, more models than kept). Helpers: servertest.h. */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "servertest.h"

static resp demand_post(const kc_testsrv *t, const char *token,
                        const char *body) {
  return http(t, "/v1/demand",
              (req){.method = "POST",
                    .token = token,
                    .body = body,
                    .len = strlen(body),
                    .has_body = 1});
}

static json_t *demand_get(const kc_testsrv *t, const char *token,
                          const char *model) {
  char path[160];
  snprintf(path, sizeof path, "/v1/models/%s/demand", model);
  resp r = http(t, path, (req){.token = token});
  assert_int_equal(r.status, 200);
  json_t *j = body_json(&r);
  resp_free(&r);
  assert_non_null(j);
  return j;
}

static uint64_t total_of(json_t *j) {
  return (uint64_t)json_integer_value(json_object_get(j, "total"));
}

/* Polls until the model's total reaches want (the flush runs once a
 * second); returns the last answer. */
static json_t *await_total(const kc_testsrv *t, const char *token,
                           const char *model, uint64_t want) {
  long end = kc_testsrv_now_ms() + 8000;
  for (;;) {
    json_t *j = demand_get(t, token, model);
    if (total_of(j) >= want || kc_testsrv_now_ms() > end)
      return j;
    json_decref(j);
    kc_testsrv_sleep_ms(100);
  }
}

/* The count of the shape (or key) in the answer's list; 0 when absent. */
static uint64_t count_of(json_t *j, const char *list, const char *key,
                         uint64_t batch, uint64_t seq) {
  size_t i;
  json_t *it;
  json_array_foreach(json_object_get(j, list), i, it) {
    json_t *s = json_object_get(it, "shape");
    uint64_t c = (uint64_t)json_integer_value(json_object_get(it, "count"));
    if (key && json_is_string(json_object_get(it, "key")) &&
        !strcmp(json_string_value(json_object_get(it, "key")), key))
      return c;
    if (!key && s &&
        (uint64_t)json_integer_value(json_object_get(s, "batch")) == batch &&
        (uint64_t)json_integer_value(json_object_get(s, "seq")) == seq)
      return c;
  }
  return 0;
}

#define KEY_1 "1111111111111111111111111111111111111111111111111111111111111111"

static void t_demand_counts(void **state) {
  (void)state;
  resp r = demand_post(
      &S, NULL,
      "{\"model\":\"" MODEL_A "\",\"shapes\":[{\"batch\":8,\"seq\":1000},"
      "{\"seq\":1000,\"batch\":8},{\"shape\":{\"batch\":2,\"seq\":10},"
      "\"count\":5}],\"misses\":[\"" KEY_1 "\",{\"batch\":64,\"seq\":9000}]}");
  assert_int_equal(r.status, 200);
  json_t *j = body_json(&r);
  assert_int_equal(json_integer_value(json_object_get(j, "accepted")), 5);
  assert_int_equal(json_integer_value(json_object_get(j, "dropped")), 0);
  json_decref(j);
  resp_free(&r);
  j = await_total(&S, NULL, MODEL_A, 9);
  assert_int_equal(total_of(j), 9);
  /* Order of dimensions does not matter: one shape, counted twice. */
  assert_int_equal(count_of(j, "shapes", NULL, 8, 1000), 2);
  assert_int_equal(count_of(j, "shapes", NULL, 2, 10), 5);
  assert_int_equal(count_of(j, "misses", KEY_1, 0, 0), 1);
  assert_int_equal(count_of(j, "misses", NULL, 64, 9000), 1);
  /* Most counted first. */
  json_t *first = json_array_get(json_object_get(j, "shapes"), 0);
  assert_int_equal(json_integer_value(json_object_get(first, "count")), 5);
  assert_true(json_integer_value(json_object_get(j, "updated")) > 0);
  json_decref(j);
  /* An unknown model: an empty histogram; the listing route is unchanged. */
  j = demand_get(&S, NULL, MODEL_B);
  assert_int_equal(total_of(j), 0);
  assert_int_equal(json_array_size(json_object_get(j, "shapes")), 0);
  json_decref(j);
  r = http(&S, "/v1/models/" MODEL_A, (req){0});
  assert_int_equal(r.status, 200);
  j = body_json(&r);
  assert_non_null(json_object_get(j, "bundles"));
  json_decref(j);
  resp_free(&r);
}

static void t_demand_bad(void **state) {
  (void)state;
  static const struct {
    const char *body, *code, *mention;
  } cases[] = {
      {"{", "bad_json", "malformed"},
      {"[]", "bad_request", "object"},
      {"{\"model\":\"" MODEL_A "\",\"extra\":1}", "bad_request", "extra"},
      {"{\"shapes\":[]}", "bad_key", "model"},
      {"{\"model\":\"ABC\"}", "bad_key", "model"},
      {"{\"model\":\"" MODEL_A "\",\"shapes\":{}}", "bad_request",
       "shapes: not an array"},
      {"{\"model\":\"" MODEL_A "\",\"shapes\":[{\"batch\":1},5]}",
       "bad_request", "shapes[1]: not an object"},
      {"{\"model\":\"" MODEL_A "\",\"shapes\":[{\"Batch\":1}]}", "bad_request",
       "shapes[0]: invalid name 'Batch'"},
      {"{\"model\":\"" MODEL_A "\",\"shapes\":[{\"batch\":-1}]}", "bad_request",
       "shapes[0].batch: not an integer in 0..2^53"},
      {"{\"model\":\"" MODEL_A "\",\"shapes\":[{\"batch\":1.5}]}",
       "bad_request", "shapes[0].batch"},
      {"{\"model\":\"" MODEL_A "\",\"shapes\":[{\"batch\":9007199254740993}]}",
       "bad_request", "0..2^53"},
      {"{\"model\":\"" MODEL_A "\",\"shapes\":[{\"batch\":\"8\"}]}",
       "bad_request", "shapes[0].batch"},
      {"{\"model\":\"" MODEL_A "\",\"shapes\":[{}]}", "bad_request",
       "0 dimensions"},
      {"{\"model\":\"" MODEL_A "\",\"shapes\":[{\"shape\":{\"b\":1},"
       "\"count\":0}]}",
       "bad_request", "shapes[0].count"},
      {"{\"model\":\"" MODEL_A "\",\"shapes\":[{\"shape\":{\"b\":1},"
       "\"x\":1}]}",
       "bad_request", "only \"shape\" and \"count\""},
      {"{\"model\":\"" MODEL_A "\",\"misses\":[\"nothex\"]}", "bad_key",
       "misses[0]"},
      {"{\"model\":\"" MODEL_A "\",\"misses\":[{\"seq\":-4}]}", "bad_request",
       "misses[0].seq"},
      {"{\"model\":\"" MODEL_A "\",\"shapes\":[{\"a\\nb\":-1}]}", "bad_request",
       "shapes[0].a?b: not an integer"},
      {"{\"model\":\"" MODEL_A "\",\"shapes\":[{\"a\":1,\"a\":2}]}", "bad_json",
       "duplicate"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    resp r = demand_post(&S, NULL, cases[i].body);
    assert_error(&r, 400, cases[i].code);
    if (!error_mentions(&r, cases[i].mention))
      fail_msg("case %zu: %s", i, r.body);
    resp_free(&r);
  }
  /* 17 dimensions, and more than 4096 elements in one report. */
  char body[300000];
  size_t n = (size_t)snprintf(body, sizeof body,
                              "{\"model\":\"" MODEL_B "\",\"shapes\":[{");
  for (int d = 0; d < 17; d++)
    n += (size_t)snprintf(body + n, sizeof body - n, "%s\"d%d\":1",
                          d ? "," : "", d);
  snprintf(body + n, sizeof body - n, "}]}");
  resp r = demand_post(&S, NULL, body);
  assert_error(&r, 400, "bad_request");
  assert_true(error_mentions(&r, "17 dimensions"));
  resp_free(&r);
  n = (size_t)snprintf(body, sizeof body,
                       "{\"model\":\"" MODEL_B "\",\"shapes\":[");
  for (int i = 0; i < 4097; i++)
    n += (size_t)snprintf(body + n, sizeof body - n, "%s{\"b\":%d}",
                          i ? "," : "", i);
  snprintf(body + n, sizeof body - n, "]}");
  r = demand_post(&S, NULL, body);
  assert_error(&r, 400, "bad_request");
  assert_true(error_mentions(&r, "more than 4096"));
  resp_free(&r);
  /* A bad report counts nothing, not even its good elements. */
  r = demand_post(
      &S, NULL, "{\"model\":\"" MODEL_B "\",\"shapes\":[{\"b\":1},{\"B\":1}]}");
  assert_int_equal(r.status, 400);
  resp_free(&r);
  r = http(&S, "/v1/models/XYZ/demand", (req){0});
  assert_error(&r, 400, "bad_key");
  resp_free(&r);
  r = http(&S, "/v1/models/" MODEL_A "/demand", (req){.method = "POST"});
  assert_error(&r, 405, "method_not_allowed");
  resp_free(&r);
  kc_testsrv_sleep_ms(1500);
  json_t *j = demand_get(&S, NULL, MODEL_B);
  assert_int_equal(total_of(j), 0);
  json_decref(j);
}

/* Reporting demand needs the write role by default (it steers `kcache
 * suggest`): a read token gets 403, and reads the histogram. Counts survive
 * a graceful stop right after the POST (the store's close flushes) and a
 * SIGKILL after a flush. */
static void t_demand_roles_restart(void **state) {
  (void)state;
  kc_testsrv t;
  char file[300], rd[128], wr[128];
  assert_int_equal(kc_testsrv_init(&t), 0);
  snprintf(file, sizeof file, "%s/tokens", t.dir);
  new_token("read", "svc", file, rd, sizeof rd);
  new_token("write", "ci", file, wr, sizeof wr);
  const char *const args[] = {"--tokens", file, NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  const char *body = "{\"model\":\"" MODEL_A "\",\"shapes\":[{\"shape\":"
                     "{\"batch\":4},\"count\":7}]}";
  resp r = demand_post(&t, NULL, body);
  assert_error(&r, 401, "unauthorized");
  resp_free(&r);
  r = demand_post(&t, rd, body);
  assert_error(&r, 403, "forbidden");
  resp_free(&r);
  r = demand_post(&t, wr, body);
  assert_int_equal(r.status, 200);
  resp_free(&r);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  assert_int_equal(kc_testsrv_restart(&t), 0);
  json_t *j = demand_get(&t, rd, MODEL_A);
  assert_int_equal(total_of(j), 7);
  json_decref(j);
  r = demand_post(&t, wr, body);
  assert_int_equal(r.status, 200);
  resp_free(&r);
  json_decref(await_total(&t, rd, MODEL_A, 14));
  kc_testsrv_kill(&t);
  assert_int_equal(kc_testsrv_restart(&t), 0);
  j = demand_get(&t, rd, MODEL_A);
  assert_int_equal(total_of(j), 14);
  json_decref(j);
  kc_testsrv_cleanup(&t);
}

/* Appends 4096 distinct shapes starting at base to a report. */
static char *flood_body(const char *model, int base) {
  size_t cap = 4096 * 40 + 200, n;
  char *b = malloc(cap);
  assert_non_null(b);
  n = (size_t)snprintf(b, cap, "{\"model\":\"%s\",\"shapes\":[", model);
  for (int i = 0; i < 4096; i++)
    n += (size_t)snprintf(b + n, cap - n, "%s{\"batch\":%d,\"seq\":7}",
                          i ? "," : "", base + i);
  snprintf(b + n, cap - n, "]}");
  return b;
}

/* 100k distinct shapes: what is kept stays within 4096 entries, the heavy
 * shape survives, and the rest is counted as dropped, in memory or on
 * disk. */
static void t_demand_hostile_shapes(void **state) {
  (void)state;
  static const char model[] =
      "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd";
  char heavy[256];
  snprintf(heavy, sizeof heavy,
           "{\"model\":\"%s\",\"shapes\":[{\"shape\":{\"batch\":1,\"seq\":1},"
           "\"count\":1000}]}",
           model);
  resp r = demand_post(&S, NULL, heavy);
  assert_int_equal(r.status, 200);
  resp_free(&r);
  json_decref(await_total(&S, NULL, model, 1000));
  uint64_t accepted = 0, dropped = 0;
  for (int k = 0; k < 25; k++) { /* 102,400 shapes */
    char *b = flood_body(model, 2 + k * 4096);
    r = demand_post(&S, NULL, b);
    free(b);
    assert_int_equal(r.status, 200);
    json_t *j = body_json(&r);
    accepted += (uint64_t)json_integer_value(json_object_get(j, "accepted"));
    dropped += (uint64_t)json_integer_value(json_object_get(j, "dropped"));
    json_decref(j);
    resp_free(&r);
  }
  assert_int_equal(accepted + dropped, 25 * 4096);
  json_t *j = await_total(&S, NULL, model, 1000 + accepted);
  assert_int_equal(total_of(j), 1000 + accepted);
  assert_true(json_array_size(json_object_get(j, "shapes")) <= 4096);
  assert_true(accepted <= 4096 ||
              json_integer_value(json_object_get(j, "dropped")) > 0);
  assert_int_equal(count_of(j, "shapes", NULL, 1, 1), 1000);
  json_decref(j);
}

/* Long dimension names: the record stays within its byte bound (128 KiB), so
 * fewer than 4096 such shapes are kept. */
static void t_demand_hostile_bytes(void **state) {
  (void)state;
  static const char model[] =
      "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee";
  size_t cap = 1000 * 700 + 200, n;
  char *b = malloc(cap);
  assert_non_null(b);
  n = (size_t)snprintf(b, cap, "{\"model\":\"%s\",\"shapes\":[", model);
  for (int i = 0; i < 1000; i++) {
    n += (size_t)snprintf(b + n, cap - n, "%s{", i ? "," : "");
    for (int d = 0; d < 16; d++)
      n += (size_t)snprintf(b + n, cap - n,
                            "%s\"dimension_with_a_long_name_%02d\":%d",
                            d ? "," : "", d, d ? d : 1000000 + i);
    n += (size_t)snprintf(b + n, cap - n, "}");
  }
  snprintf(b + n, cap - n, "]}");
  resp r = demand_post(&S, NULL, b);
  free(b);
  assert_int_equal(r.status, 200);
  resp_free(&r);
  json_t *j = await_total(&S, NULL, model, 1000);
  assert_int_equal(total_of(j), 1000);
  size_t kept = json_array_size(json_object_get(j, "shapes"));
  print_message("kept %zu of 1000 long shapes\n", kept);
  assert_true(kept > 100 && kept < 400);
  assert_int_equal(json_integer_value(json_object_get(j, "dropped")),
                   1000 - (json_int_t)kept);
  json_decref(j);
}

/* More models than are kept: at most 1024 have a histogram. */
static void t_demand_hostile_models(void **state) {
  (void)state;
  enum { N = 1100 };
  char model[65], body[200];
  int sent = 0;
  for (int round = 0; sent < N; round++) {
    int start = sent;
    /* under 128 a flush: models the store does not have may take half of
     * the 256 pending model slots */
    for (; sent < N && sent < start + 100; sent++) {
      snprintf(model, sizeof model, "%064x", 0x100000 + sent);
      snprintf(body, sizeof body,
               "{\"model\":\"%s\",\"shapes\":[{\"batch\":%d}]}", model, sent);
      resp r = demand_post(&S, NULL, body);
      assert_int_equal(r.status, 200);
      resp_free(&r);
    }
    snprintf(model, sizeof model, "%064x", 0x100000 + sent - 1);
    json_decref(await_total(&S, NULL, model, 1));
  }
  int kept = 0;
  for (int i = 0; i < N; i++) {
    snprintf(model, sizeof model, "%064x", 0x100000 + i);
    json_t *j = demand_get(&S, NULL, model);
    kept += total_of(j) > 0;
    json_decref(j);
  }
  assert_true(kept <= 1024);
  assert_true(kept >= 1000); /* the newest are there */
}

/* --demand-role read: services holding a read token report (the
 * kc_demand_note flow); no token still may not. A role that is not read or
 * write is refused at start. */
static void t_demand_read_role_flag(void **state) {
  (void)state;
  kc_testsrv t;
  char file[300], rd[128];
  assert_int_equal(kc_testsrv_init(&t), 0);
  snprintf(file, sizeof file, "%s/tokens", t.dir);
  new_token("read", "svc", file, rd, sizeof rd);
  const char *const bad[] = {"--tokens", file, "--demand-role", "none", NULL};
  assert_int_not_equal(kc_testsrv_start(&t, bad), 0);
  kc_testsrv_stop(&t);
  const char *const args[] = {"--tokens", file, "--demand-role", "read", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  const char *body = "{\"model\":\"" MODEL_A "\",\"shapes\":[{\"batch\":4}]}";
  resp r = demand_post(&t, NULL, body);
  assert_error(&r, 401, "unauthorized");
  resp_free(&r);
  r = demand_post(&t, rd, body);
  assert_int_equal(r.status, 200);
  resp_free(&r);
  json_decref(await_total(&t, rd, MODEL_A, 1));
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

/* One report adds at most 2^20 in all: a count of 2^32-1 is scaled down,
 * the other elements in proportion (at least 1). */
static void t_demand_report_cap(void **state) {
  (void)state;
  static const char model[] =
      "abababababababababababababababababababababababababababababababab";
  char body[300];
  snprintf(body, sizeof body,
           "{\"model\":\"%s\",\"shapes\":[{\"shape\":{\"batch\":1,\"seq\":1},"
           "\"count\":4294967295},{\"batch\":2,\"seq\":2}]}",
           model);
  resp r = demand_post(&S, NULL, body);
  assert_int_equal(r.status, 200);
  json_t *j = body_json(&r);
  assert_true(json_is_true(json_object_get(j, "scaled")));
  json_decref(j);
  resp_free(&r);
  j = await_total(&S, NULL, model, 1);
  assert_true(total_of(j) <= (1u << 20) + 1);
  assert_true(count_of(j, "shapes", NULL, 1, 1) >= (1u << 20) - 1);
  assert_int_equal(count_of(j, "shapes", NULL, 2, 2), 1);
  json_decref(j);
  snprintf(body, sizeof body, /* within the cap: as sent */
           "{\"model\":\"%s\",\"shapes\":[{\"shape\":{\"batch\":3,\"seq\":3},"
           "\"count\":1000}]}",
           model);
  r = demand_post(&S, NULL, body);
  j = body_json(&r);
  assert_true(json_is_false(json_object_get(j, "scaled")));
  json_decref(j);
  resp_free(&r);
}

/* A model kcached has (a warmup manifest) keeps its histogram through a
 * flood of made-up models with large totals, and its reports are taken in
 * the second the flood fills the pending table. */
static void t_demand_known_model_kept(void **state) {
  (void)state;
  kc_testsrv t;
  static const char known[] =
      "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";
  assert_int_equal(kc_testsrv_init(&t), 0);
  assert_int_equal(kc_testsrv_start(&t, NULL), 0);
  char w[600], body[300], model[65];
  snprintf(w, sizeof w,
           "{\"schema\":\"kcache.warmup/v1\",\"model\":{\"name\":\"real\","
           "\"hash\":\"%s\"},\"archs\":[\"sm_80\"],\"builder\":{\"command\":"
           "[\"true\"]},\"buckets\":[{\"batch\":1}]}",
           known);
  resp r = http(&t,
                "/v1/models/5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"
                "5a5a5a5a5a5a5a5a5a5a/warmup",
                (req){.method = "PUT", .body = w, .len = strlen(w)});
  assert_int_equal(r.status, 201);
  resp_free(&r);
  snprintf(body, sizeof body, "{\"model\":\"%s\",\"shapes\":[{\"batch\":8}]}",
           known);
  r = demand_post(&t, NULL, body);
  assert_int_equal(r.status, 200);
  resp_free(&r);
  json_decref(await_total(&t, NULL, known, 1));
  /* in one second: four made-up models of 4096 shapes each, then the known
   * model's report */
  for (int m = 0; m < 4; m++) {
    snprintf(model, sizeof model, "%064x", 0xf00000 + m);
    char *b = flood_body(model, 10);
    r = demand_post(&t, NULL, b);
    free(b);
    assert_int_equal(r.status, 200);
    resp_free(&r);
  }
  r = demand_post(&t, NULL, body);
  json_t *j = body_json(&r);
  assert_int_equal(json_integer_value(json_object_get(j, "dropped")), 0);
  json_decref(j);
  resp_free(&r);
  json_decref(await_total(&t, NULL, known, 2)); /* flushed */
  /* 1100 made-up models, each with a total far above the known one's */
  for (int sent = 0; sent < 1100;) {
    int start = sent;
    for (; sent < 1100 && sent < start + 100; sent++) {
      snprintf(model, sizeof model, "%064x", 0x200000 + sent);
      snprintf(body, sizeof body,
               "{\"model\":\"%s\",\"shapes\":[{\"shape\":{\"batch\":1},"
               "\"count\":1000000}]}",
               model);
      r = demand_post(&t, NULL, body);
      assert_int_equal(r.status, 200);
      resp_free(&r);
    }
    json_decref(await_total(&t, NULL, model, 1));
  }
  j = demand_get(&t, NULL, known);
  assert_true(total_of(j) >= 2);
  assert_true(count_of(j, "shapes", NULL, 8, 0) >= 2); /* {"batch":8} */
  json_decref(j);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

int main(void) {
  const struct CMUnitTest api[] = {
      cmocka_unit_test(t_demand_counts),
      cmocka_unit_test(t_demand_bad),
      cmocka_unit_test(t_demand_hostile_shapes),
      cmocka_unit_test(t_demand_hostile_bytes),
      cmocka_unit_test(t_demand_hostile_models),
      cmocka_unit_test(t_demand_report_cap),
  };
  const struct CMUnitTest own[] = {
      cmocka_unit_test(t_demand_roles_restart),
      cmocka_unit_test(t_demand_read_role_flag),
      cmocka_unit_test(t_demand_known_model_kept),
  };
  servertest_init();
  int fails = 0;
  fails += cmocka_run_group_tests_name("api", api, open_setup, open_teardown);
  fails += cmocka_run_group_tests_name("own", own, NULL, NULL);
  curl_global_cleanup();
  return fails ? 1 : 0;
}
