/* fuzz_resp.c: libFuzzer target for kcached's RESP2 parser (server/
 * resp_proto.c): kcd_resp_parse on arbitrary bytes, fed whole and again in
 * pieces (sizes taken from the input) into a buffer compacted between reads
 * as the listener does (kcd_resp_parser_done / _shift). Invariants: both
 * feedings give the same commands and the same error; every argument lies
 * inside the buffer; a command has at least one argument; an error is one
 * of Redis's protocol error texts; the argument table never grows beyond
 * what arrived (nothing is allocated on a client's word); the first-bytes
 * judge gives on a prefix the verdict it gives on the whole. The reply
 * writers are checked against the parser: every command, written back as
 * a multibulk by kcd_resp_array and kcd_resp_bulk, parses to the same
 * arguments; the RESP3 writers (nil, map, verbatim) write the exact frames.
 *
 * Input: byte 0 picks the limits (bit 0: unauthenticated limits; bit 1: a
 * 64-byte --resp-max-value), byte 1 the piece size (1..256), the rest is the
 * stream. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "resp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const known[] = {
    "Protocol error: invalid bulk length",
    "Protocol error: invalid multibulk length",
    "Protocol error: unbalanced quotes in request",
    "Protocol error: too big inline request",
    "Protocol error: too big mbulk count string",
    "Protocol error: too big bulk count string",
    "Protocol error: unauthenticated multibulk length",
    "Protocol error: unauthenticated bulk length",
    "Protocol error: expected '$', got '",
};

static void check_error(const char *e) {
  for (size_t i = 0; i < sizeof known / sizeof *known; i++)
    if (strncmp(e, known[i], strlen(known[i])) == 0)
      return;
  FZ_CHECK(0, "unknown protocol error text '%s'", e);
}

/* RESP3's writers on the first bytes of the input. */
static void check_resp3(const uint8_t *in, size_t n) {
  kcd_resp_buf b = {0};
  kcd_resp_verbatim(&b, in, n, 1);
  char head[32];
  int h = snprintf(head, sizeof head, "=%zu\r\ntxt:", n + 4);
  FZ_CHECK(b.len == (size_t)h + n + 2 && memcmp(b.p, head, (size_t)h) == 0 &&
               (n == 0 || memcmp(b.p + h, in, n) == 0) &&
               memcmp(b.p + h + n, "\r\n", 2) == 0,
           "verbatim frame of %zu bytes", n);
  b.len = 0;
  kcd_resp_nil(&b, 1);
  kcd_resp_map(&b, (long long)n, 1);
  kcd_resp_map(&b, (long long)n, 0);
  h = snprintf(head, sizeof head, "_\r\n%%%zu\r\n*%zu\r\n", n, 2 * n);
  FZ_CHECK(b.len == (size_t)h && memcmp(b.p, head, (size_t)h) == 0,
           "nil and map frames");
  kcd_resp_buf_free(&b);
}

/* Parses the stream in pieces of `step` (0: whole); the commands, each
 * argument as 4-byte length + bytes, then "E" + error or "M" (more).
 * *cmds: the length of the commands part; frames (unless NULL): the
 * commands written back as multibulk frames by the reply writers. */
static kcd_resp_buf feed(const uint8_t *in, size_t n, size_t step, int flags,
                         size_t *cmds, kcd_resp_buf *frames) {
  kcd_resp_parser p;
  kcd_resp_parser_init(&p, flags & 2 ? 64 : 1 << 20, 4096);
  p.unauth = flags & 1;
  kcd_resp_buf buf = {0}, out = {0};
  size_t fed = 0, arrived_args = 0;
  for (;;) {
    size_t k = step && n - fed > step ? step : n - fed;
    kcd_resp_buf_add(&buf, in + fed, k);
    fed += k;
    kcd_resp_res r;
    while ((r = kcd_resp_parse(&p, buf.p, buf.len)) == KCD_RESP_CMD) {
      FZ_CHECK(p.argc > 0, "a command without arguments");
      if (frames)
        kcd_resp_array(frames, (long long)p.argc);
      for (size_t i = 0; frames && i < p.argc; i++)
        kcd_resp_bulk(frames, buf.p + p.argv[i].off, p.argv[i].len);
      FZ_CHECK(p.pos <= buf.len, "parsed past the end");
      for (size_t i = 0; i < p.argc; i++) {
        FZ_CHECK(p.argv[i].off + p.argv[i].len <= p.pos,
                 "argument %zu "
                 "outside what was parsed",
                 i);
        uint32_t l = (uint32_t)p.argv[i].len;
        kcd_resp_buf_add(&out, &l, 4);
        kcd_resp_buf_add(&out, buf.p + p.argv[i].off, p.argv[i].len);
      }
      kcd_resp_buf_add(&out, "\n", 1);
      arrived_args += p.argc;
    }
    /* at most 16 entries, or twice the arguments that ever arrived */
    FZ_CHECK(p.argcap <= 16 || p.argcap <= 2 * (arrived_args + p.argc),
             "argument table of %zu on %zu arguments", p.argcap, p.argc);
    *cmds = out.len;
    if (r == KCD_RESP_ERR) {
      check_error(p.error);
      kcd_resp_buf_add(&out, "E", 1);
      kcd_resp_buf_add(&out, p.error, strlen(p.error));
      break;
    }
    FZ_CHECK(r == KCD_RESP_MORE, "result %d", (int)r);
    size_t done = kcd_resp_parser_done(&p);
    FZ_CHECK(done <= p.pos && p.pos <= buf.len, "done %zu pos %zu len %zu",
             done, p.pos, buf.len);
    if (done) /* buf.p is NULL before anything arrived */
      memmove(buf.p, buf.p + done, buf.len - done);
    buf.len -= done;
    kcd_resp_parser_shift(&p, done);
    if (fed == n) {
      kcd_resp_buf_add(&out, "M", 1);
      break;
    }
  }
  kcd_resp_buf_free(&buf);
  kcd_resp_parser_free(&p);
  return out;
}

/* The first-bytes judge (resp_admit.c) decides once: a verdict on a
 * prefix (fed in pieces of step) is the verdict on the whole stream. */
static void check_sniff(const uint8_t *in, size_t n, size_t step) {
  kcd_resp_sniff_res all = kcd_resp_sniff((const char *)in, n);
  for (size_t k = step; k < n; k += step) {
    kcd_resp_sniff_res part = kcd_resp_sniff((const char *)in, k);
    FZ_CHECK(part == KCD_SNIFF_MORE || part == all,
             "sniff of %zu bytes: %d, of all %zu: %d", k, (int)part, n,
             (int)all);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* beyond 64 KiB a line without its end is refused when it is seen: fed
   * whole, the same line may arrive complete (as in Redis) */
  if (size < 2 || size > 60000)
    return 0;
  int flags = data[0];
  size_t step = (size_t)data[1] + 1;
  size_t nwhole = 0, nparts = 0, nback = 0;
  kcd_resp_buf frames = {0};
  kcd_resp_buf whole = feed(data + 2, size - 2, 0, flags, &nwhole, &frames);
  kcd_resp_buf parts = feed(data + 2, size - 2, step, flags, &nparts, NULL);
  FZ_CHECK(!whole.oom && !parts.oom, "out of memory");
  /* a stream cut short may end "M" with fewer commands only when fed
   * whole ends in the same place: the results must be identical */
  FZ_CHECK(whole.len == parts.len &&
               (whole.len == 0 || memcmp(whole.p, parts.p, whole.len) == 0),
           "whole and in pieces of %zu differ", step);
  /* written back by the reply writers, the commands parse the same (under
   * the default limits, which admit whatever was accepted: an inline
   * argument is not bound by --resp-max-value, nor by the unauthenticated
   * limits, as in Redis) */
  if (frames.len) {
    kcd_resp_buf back =
        feed((const uint8_t *)frames.p, frames.len, 0, 0, &nback, NULL);
    FZ_CHECK(!frames.oom && !back.oom, "out of memory");
    FZ_CHECK(nback == nwhole && memcmp(back.p, whole.p, nwhole) == 0,
             "commands written back parse differently");
    kcd_resp_buf_free(&back);
  }
  kcd_resp_buf_free(&frames);
  check_resp3(data + 2, size - 2 < 64 ? size - 2 : 64);
  check_sniff(data + 2, size - 2, step);
  kcd_resp_buf_free(&whole);
  kcd_resp_buf_free(&parts);
  return 0;
}
