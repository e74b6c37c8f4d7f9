/* test_server_blob.c: kcached integration tests (the real binary on a free
 * loopback port, spoken to with libcurl) of blobs: round trips, missing and
 * bad digests, a mismatch, too large, a body in pieces, a client that hangs up
 * mid-upload, bit rot repaired by a client, the scrub removing a rotted blob.
 * Helpers and the shared open server: servertest.h. */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "servertest.h"

static void t_blob_roundtrip(void **state) {
  (void)state;
  char data[5000], d[65], path[128], etag[128], v[128];
  fill_random(data, sizeof data, 1);
  assert_int_equal(put_blob(&S, NULL, data, sizeof data, d), 201);
  assert_int_equal(put_blob(&S, NULL, data, sizeof data, d), 200);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(&S, path, (req){0});
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, sizeof data);
  assert_memory_equal(r.body, data, sizeof data);
  snprintf(etag, sizeof etag, "\"%s\"", d);
  assert_true(header(&r, "ETag", v, sizeof v));
  assert_string_equal(v, etag);
  assert_true(header(&r, "Content-Type", v, sizeof v));
  assert_string_equal(v, "application/octet-stream");
  resp_free(&r);
  r = http(&S, path, (req){.method = "HEAD"});
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, 0);
  assert_true(header(&r, "Content-Length", v, sizeof v));
  assert_int_equal(atoi(v), (int)sizeof data);
  resp_free(&r);
  char inm[160];
  snprintf(inm, sizeof inm, "If-None-Match: %s", etag);
  r = http(&S, path, (req){.header = inm});
  assert_int_equal(r.status, 304);
  assert_int_equal(r.len, 0);
  assert_true(header(&r, "ETag", v, sizeof v));
  resp_free(&r);
  r = http(&S, path, (req){.header = "If-None-Match: \"0000\""});
  assert_int_equal(r.status, 200);
  resp_free(&r);
}

/* Each server thread reuses the response it built for a small blob
 * (reply.c, kcd_reply_map), a slot per digest's first byte: blobs that
 * share a slot, asked for in turns, must each come with their own bytes
 * and ETag. One server thread, so that the slots are surely shared (the
 * slots are per thread, and a pool spreads the requests). */
static void t_blob_reused_responses(void **state) {
  (void)state;
  kc_testsrv t = {0};
  const char *const args[] = {"--threads", "1", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  enum { N = 24 };
  static char data[N][1200];
  char d[N][65], path[128], v[128], etag[80];
  int slot_of[64] = {0}, shared = 0;
  for (int i = 0; i < N; i++) {
    size_t n = 100 + (size_t)i * 37;
    fill_random(data[i], n, 700 + (unsigned)i);
    assert_int_equal(put_blob(&t, NULL, data[i], n, d[i]), 201);
    unsigned b = (unsigned)strtoul((char[3]){d[i][0], d[i][1], 0}, NULL, 16);
    shared |= slot_of[b % 64]++ > 0;
  }
  assert_true(shared); /* the seeds give two digests one slot */
  for (int round = 0; round < 3; round++)
    for (int i = 0; i < N; i++) {
      size_t n = 100 + (size_t)i * 37;
      snprintf(path, sizeof path, "/v1/blobs/%.64s", d[i]);
      resp r = http(&t, path, (req){.method = round == 1 ? "HEAD" : NULL});
      assert_int_equal(r.status, 200);
      assert_int_equal(r.len, round == 1 ? 0 : n);
      if (round != 1)
        assert_memory_equal(r.body, data[i], n);
      snprintf(etag, sizeof etag, "\"%.64s\"", d[i]);
      assert_true(header(&r, "ETag", v, sizeof v));
      assert_string_equal(v, etag);
      assert_true(header(&r, "Content-Length", v, sizeof v));
      assert_int_equal(atoi(v), (int)n);
      resp_free(&r);
    }
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
}

static void t_blob_missing(void **state) {
  (void)state;
  char d[65], path[128];
  sha_hex("never stored", 12, d);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(&S, path, (req){0});
  assert_error(&r, 404, "not_found");
  resp_free(&r);
  r = http(&S, path, (req){.method = "HEAD"});
  assert_int_equal(r.status, 404);
  resp_free(&r);
}

static void t_blob_bad_digest(void **state) {
  (void)state;
  for (size_t i = 0; i < N_BAD_HEX; i++) {
    char path[256];
    snprintf(path, sizeof path, "/v1/blobs/%s", bad_hex[i]);
    resp r = http(&S, path, (req){0});
    assert_error(&r, 400, "bad_digest");
    resp_free(&r);
    r = http(&S, path, (req){.method = "PUT", .body = "x", .len = 1});
    assert_error(&r, 400, "bad_digest");
    resp_free(&r);
  }
}

static void t_blob_mismatch(void **state) {
  (void)state;
  char d[65], path[128];
  sha_hex("the real bytes", 14, d);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(&S, path,
                (req){.method = "PUT", .body = "other bytes!!!", .len = 14});
  assert_error(&r, 422, "digest_mismatch");
  resp_free(&r);
  r = http(&S, path, (req){0});
  assert_int_equal(r.status, 404); /* nothing stored */
  resp_free(&r);
}

static void t_blob_too_large(void **state) {
  (void)state;
  size_t n = 2u << 20; /* the server takes 1 MiB */
  char *big = malloc(n), d[65], path[128];
  fill_random(big, n, 5);
  sha_hex(big, n, d);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(&S, path, (req){.method = "PUT", .body = big, .len = n});
  assert_error(&r, 413, "too_large");
  resp_free(&r);
  r = http(&S, path,
           (req){.method = "PUT", .body = big, .len = n, .expect = 1});
  assert_error(&r, 413, "too_large");
  resp_free(&r);
  r = http(&S, path,
           (req){.method = "PUT", .body = big, .len = n, .chunked = 1});
  assert_error(&r, 413, "too_large");
  resp_free(&r);
  r = http(&S, path, (req){0});
  assert_int_equal(r.status, 404);
  resp_free(&r);
  free(big);
  /* A huge announced body is refused from its headers alone. */
  char head[512], reply[4096];
  int fd = raw_connect(S.port);
  int h = snprintf(head, sizeof head,
                   "PUT /v1/blobs/%s HTTP/1.1\r\nHost: localhost\r\n"
                   "Content-Length: 1073741824\r\n\r\n",
                   d);
  raw_send(fd, head, (size_t)h);
  raw_recv_all(fd, reply, sizeof reply);
  close(fd);
  assert_non_null(strstr(reply, "HTTP/1.1 413"));
  assert_non_null(strstr(reply, "\"too_large\""));
}

static void t_blob_pieces(void **state) {
  (void)state;
  size_t n = 900 * 1024;
  char *data = malloc(n), d[65], path[128];
  fill_random(data, n, 9);
  assert_int_equal(put_blob(&S, NULL, data, n, d), 201);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(&S, path, (req){0});
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, n);
  assert_memory_equal(r.body, data, n);
  resp_free(&r);
  /* chunked transfer encoding */
  fill_random(data, n, 10);
  sha_hex(data, 300 * 1024, d);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  r = http(
      &S, path,
      (req){.method = "PUT", .body = data, .len = 300 * 1024, .chunked = 1});
  assert_int_equal(r.status, 201);
  resp_free(&r);
  r = http(&S, path, (req){0});
  assert_int_equal(r.len, 300 * 1024);
  assert_memory_equal(r.body, data, 300 * 1024);
  resp_free(&r);
  free(data);
}

static void t_upload_disconnect(void **state) {
  (void)state;
  char d[65], head[512], piece[65536];
  sha_hex("never completed", 15, d);
  long before = metric(&S, "kcached_uploads_aborted_total");
  int fd = raw_connect(S.port);
  int n = snprintf(head, sizeof head,
                   "PUT /v1/blobs/%s HTTP/1.1\r\nHost: localhost\r\n"
                   "Content-Length: 524288\r\n\r\n",
                   d);
  raw_send(fd, head, (size_t)n);
  memset(piece, 'z', sizeof piece);
  raw_send(fd, piece, sizeof piece);
  kc_testsrv_sleep_ms(200);
  close(fd); /* mid-body */
  long after = before;
  for (int i = 0; i < 100 && after <= before; i++) {
    kc_testsrv_sleep_ms(50);
    after = metric(&S, "kcached_uploads_aborted_total");
  }
  assert_true(after > before);
  char path[128];
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(&S, path, (req){0});
  assert_int_equal(r.status, 404);
  resp_free(&r);
}

/* A PUT with X-Kcache-Repair: 1 (what a client sends after a blob we served
 * failed its hash). */
static long put_repair(const kc_testsrv *t, const void *p, size_t n,
                       const char *digest) {
  char path[128];
  snprintf(path, sizeof path, "/v1/blobs/%s", digest);
  resp r = http(t, path,
                (req){.method = "PUT",
                      .body = p,
                      .len = n,
                      .has_body = 1,
                      .header = "X-Kcache-Repair: 1"});
  resp_free(&r);
  return r.status;
}

/* Bit rot in a held blob: GETs serve the held bytes unhashed (clients
 * verify); a plain offer is "present" unhashed; a repair offer of other
 * bytes is refused; one of the right bytes replaces them; counted. */
static void t_blob_rot_repaired(void **state) {
  (void)state;
  kc_testsrv t = {0};
  /* the scrub off: it would remove the rotted blob before the client */
  const char *const args[] = {"--scrub-rate", "0", NULL};
  assert_int_equal(kc_testsrv_start(&t, args), 0);
  char blob[20000], d[65], key[65], path[128];
  fill_random(blob, sizeof blob, 62);
  assert_int_equal(put_blob(&t, NULL, blob, sizeof blob, d), 201);
  char *json = store_bundle(&t, NULL, MODEL_A, 62, 63, key);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  assert_true(kc_testsrv_rot(&t, blob, sizeof blob) >= 1);
  assert_int_equal(kc_testsrv_restart(&t), 0);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(&t, path, (req){0});
  assert_int_equal(r.status, 200);
  assert_int_equal(r.len, sizeof blob);
  assert_memory_not_equal(r.body, blob, sizeof blob); /* rotted, as held */
  resp_free(&r);
  assert_int_equal(put_blob(&t, NULL, blob, sizeof blob, d), 200);
  assert_int_equal(metric(&t, "kcached_blobs_corrupt_total"), 0);
  char wrong[sizeof blob];
  memcpy(wrong, blob, sizeof blob);
  wrong[0] ^= 1; /* other bytes under the digest: refused, the rot stays */
  assert_int_equal(put_repair(&t, wrong, sizeof wrong, d), 422);
  assert_int_equal(put_repair(&t, blob, sizeof blob, d), 201);
  assert_int_equal(put_repair(&t, blob, sizeof blob, d), 200); /* sound */
  assert_int_equal(metric(&t, "kcached_blobs_corrupt_total"), 2);
  check_kept(&t, d, blob, sizeof blob, key, json);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
  free(json);
}

/* The scrub (default --scrub-rate) finds a rotted blob by itself and removes
 * it with the bundle naming it: neither is served; the next upload stays. */
static void t_scrub_removes_rotted(void **state) {
  (void)state;
  kc_testsrv t = {0};
  assert_int_equal(kc_testsrv_start(&t, NULL), 0);
  char blob[3000], d[65], key[65], path[128];
  char *json = store_bundle(&t, NULL, MODEL_A, 64, 64, key);
  fill_random(blob, sizeof blob, 64 * 7 + 1); /* store_bundle's 2nd blob */
  assert_int_equal(put_blob(&t, NULL, blob, sizeof blob, d), 200);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  assert_true(kc_testsrv_rot(&t, blob, sizeof blob) >= 1);
  assert_int_equal(kc_testsrv_restart(&t), 0);
  long found = 0;
  for (int i = 0; i < 500 && found == 0; i++) {
    if ((found = metric(&t, "kcached_scrub_corrupt_total")) == 0)
      kc_testsrv_sleep_ms(20);
  }
  assert_int_equal(found, 1);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  resp r = http(&t, path, (req){0});
  assert_int_equal(r.status, 404);
  resp_free(&r);
  snprintf(path, sizeof path, "/v1/bundles/%s", key);
  r = http(&t, path, (req){0});
  assert_int_equal(r.status, 404);
  resp_free(&r);
  /* The client's rebuild uploads both again; the scrub leaves them. */
  free(json);
  json = store_bundle(&t, NULL, MODEL_A, 64, 64, key);
  long passes = metric(&t, "kcached_scrub_passes_total");
  for (int i = 0;
       i < 500 && metric(&t, "kcached_scrub_passes_total") < passes + 2; i++)
    kc_testsrv_sleep_ms(20);
  assert_true(metric(&t, "kcached_scrub_passes_total") >= passes + 2);
  assert_int_equal(metric(&t, "kcached_scrub_corrupt_total"), 1);
  check_kept(&t, d, blob, sizeof blob, key, json);
  assert_int_equal(kc_testsrv_stop(&t), 0);
  kc_testsrv_cleanup(&t);
  free(json);
}

int main(void) {
  const struct CMUnitTest api[] = {
      cmocka_unit_test(t_blob_roundtrip),
      cmocka_unit_test(t_blob_reused_responses),
      cmocka_unit_test(t_blob_missing),
      cmocka_unit_test(t_blob_bad_digest),
      cmocka_unit_test(t_blob_mismatch),
      cmocka_unit_test(t_blob_too_large),
      cmocka_unit_test(t_blob_pieces),
      cmocka_unit_test(t_upload_disconnect),
  };
  const struct CMUnitTest own[] = {
      cmocka_unit_test(t_blob_rot_repaired),
      cmocka_unit_test(t_scrub_removes_rotted),
  };
  servertest_init();
  int fails = 0;
  fails += cmocka_run_group_tests_name("api", api, open_setup, open_teardown);
  fails += cmocka_run_group_tests_name("own servers", own, NULL, NULL);
  curl_global_cleanup();
  return fails ? 1 : 0;
}
