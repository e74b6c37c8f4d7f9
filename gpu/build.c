/* build.c: kc_gpu_build. Each compile runs in a forked child that sends its
 * answer (status, message, log, code) over a pipe; the parent reads it with
 * a deadline and kills the child when the deadline passes.
 *
 * Why a child: NVRTC can hang on a pathological source or die inside
 * (internal errors, out of memory); a process can be killed and its crash
 * stays its own, a thread's cannot.
 *
 * Why fork and not posix_spawn of a helper, although the caller may have
 * threads: libkcache is a static library linked into someone else's service,
 * so a helper binary would have to be installed and found at run time next to
 * every program that links it. fork needs nothing on disk. What makes it sound
 * enough: glibc's fork resets the malloc locks and the dynamic loader's lock
 * in the child, so the child's malloc and dlopen(libnvrtc) work even if
 * another thread held those locks at the fork; the child uses no stdio. The
 * remaining risk (a lock of some other library, or loader data caught
 * mid-update by a concurrent dlopen) can only make the child hang, and the
 * deadline turns that into KC_TIMEOUT: the caller never hangs. The child
 * dlopens NVRTC itself, so the caller's address space never maps it.
 * Cost: fork copies the caller's page tables (about 2 ms per 10 GiB
 * resident), small next to a compile.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpu_internal.h"

#define DEFAULT_TIMEOUT_S 600
#define WIRE_MAGIC 0x6b636731u            /* "kcg1" */
#define WIRE_PART_MAX ((uint64_t)1 << 31) /* bigger log or code: garbage */

/* Parent and child are one program image, so a plain struct is the format. */
typedef struct wire_hdr {
  uint32_t magic;
  int32_t status; /* kc_err */
  int32_t kind;   /* kc_file_kind */
  uint32_t msg_len;
  uint64_t log_len, code_len;
} wire_hdr;

static double now_s(void) { return (double)kc_clock_mono_us() / 1e6; }

/* ---- Child ---- */

static int write_all(int fd, const void *data, size_t n) {
  const char *p = data;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Never returns. _exit, not exit: the parent's atexit handlers and stdio
 * buffers are the parent's business. */
static _Noreturn void child_main(int fd, const kc_gpu_build_req *req) {
  kc_gpu_build_out out;
  char msg[KC_ERRBUF_SIZE] = "";
  kc_err rc = kcg_nvrtc_compile(req, &out, msg);
  const char *log = out.log ? out.log : "";
  wire_hdr h = {WIRE_MAGIC,        (int32_t)rc,
                (int32_t)out.kind, (uint32_t)strlen(msg),
                strlen(log),       out.code_len};
  int bad = write_all(fd, &h, sizeof h) || write_all(fd, msg, h.msg_len) ||
            write_all(fd, log, h.log_len) ||
            write_all(fd, out.code, out.code_len);
  kc_gpu_build_out_free(&out);
  _exit(bad ? 1 : 0);
}

/* ---- Parent: receiving ---- */

typedef struct rx {
  unsigned char *buf;
  size_t len, cap;
  size_t want; /* the whole answer's size, once the header is in; else 0 */
  wire_hdr h;
} rx;

static kc_err rx_header(rx *r, char *err) {
  memcpy(&r->h, r->buf, sizeof r->h);
  if (r->h.magic != WIRE_MAGIC || r->h.msg_len >= KC_ERRBUF_SIZE ||
      r->h.log_len > WIRE_PART_MAX || r->h.code_len > WIRE_PART_MAX)
    return kc_errf(err, KC_BUILD_FAILED, "garbled answer from the NVRTC child");
  r->want = sizeof r->h + r->h.msg_len + r->h.log_len + r->h.code_len;
  if (r->len > r->want)
    return kc_errf(err, KC_BUILD_FAILED, "NVRTC child sent too much");
  unsigned char *b = r->want > r->cap ? realloc(r->buf, r->want) : r->buf;
  if (!b)
    return kc_errf(err, KC_NOMEM, "out of memory (%zu-byte build)", r->want);
  r->buf = b;
  r->cap = r->want > r->cap ? r->want : r->cap;
  return KC_OK;
}

static int poll_ms(double left_s) {
  double ms = left_s * 1000.0 + 1.0; /* round up: never spin at 0 ms */
  return ms > INT_MAX ? INT_MAX : (int)ms;
}

/* One read; 1 at EOF, 0 when there is more to come, -1 on error (err set). */
static int rx_read(int fd, rx *r, kc_err *rc, char *err) {
  size_t room = (r->want ? r->want : r->cap) - r->len;
  ssize_t got = read(fd, r->buf + r->len, room);
  if (got < 0 && (errno == EINTR || errno == EAGAIN))
    return 0;
  if (got < 0) {
    *rc = kc_errf(err, KC_IO, "reading from the NVRTC child: %s",
                  strerror(errno));
    return -1;
  }
  if (got == 0)
    return 1;
  r->len += (size_t)got;
  if (!r->want && r->len >= sizeof r->h && (*rc = rx_header(r, err)) != KC_OK)
    return -1;
  return 0;
}

/* Reads until the answer is whole, EOF (the child is gone), the deadline or
 * an error. The answer's own length ends the read, not EOF: a process that
 * another thread forks meanwhile inherits the pipe's write end and would
 * hold EOF back until it exits. */
static kc_err receive(int fd, double deadline, rx *r, char *err) {
  r->cap = 64 * 1024;
  if (!(r->buf = malloc(r->cap)))
    return kc_errf(err, KC_NOMEM, "out of memory");
  kc_err rc = KC_OK;
  while (!r->want || r->len < r->want) {
    double left = deadline - now_s();
    if (left <= 0)
      return KC_TIMEOUT;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n = poll(&p, 1, poll_ms(left));
    if (n < 0 && errno != EINTR)
      return kc_errf(err, KC_IO, "poll: %s", strerror(errno));
    if (n <= 0)
      continue;
    int st = rx_read(fd, r, &rc, err);
    if (st != 0)
      return st < 0 ? rc : KC_OK;
  }
  return KC_OK;
}

/* ---- Parent: the child's end ---- */

static int reap(pid_t pid, int *status) {
  for (;;) {
    if (waitpid(pid, status, 0) == pid)
      return 0;
    if (errno != EINTR)
      return -1; /* ECHILD: the caller ignores SIGCHLD, or reaped it */
  }
}

static kc_err no_answer(int reaped, int status, char *err) {
  if (reaped && WIFSIGNALED(status))
    return kc_errf(err, KC_BUILD_FAILED, "NVRTC child died with signal %d",
                   WTERMSIG(status));
  if (reaped && WIFEXITED(status))
    return kc_errf(err, KC_BUILD_FAILED,
                   "NVRTC child exited with status %d before answering",
                   WEXITSTATUS(status));
  return kc_errf(err, KC_BUILD_FAILED,
                 "NVRTC child ended before answering (exit status unknown)");
}

static char *copy_part(const unsigned char *p, size_t n) {
  char *s = malloc(n + 1); /* NUL after code too: PTX goes to the driver */
  if (s) {
    memcpy(s, p, n);
    s[n] = '\0';
  }
  return s;
}

static int known_err(int32_t e) {
  switch ((kc_err)e) {
#define KC_GPU_CASE_(name, num, http, code, msg) case KC_##name:
    KC_ERRNO_MAP(KC_GPU_CASE_)
#undef KC_GPU_CASE_
    return 1;
  }
  return 0;
}

static kc_err unpack(const rx *r, kc_gpu_build_out *out, char *err) {
  const unsigned char *p = r->buf + sizeof r->h;
  if (err)
    snprintf(err, KC_ERRBUF_SIZE, "%.*s", (int)r->h.msg_len, (const char *)p);
  p += r->h.msg_len;
  out->log = copy_part(p, r->h.log_len);
  p += r->h.log_len;
  out->kind = (kc_file_kind)r->h.kind;
  if (r->h.status == KC_OK && !(out->code = copy_part(p, r->h.code_len)))
    return kc_errf(err, KC_NOMEM, "out of memory (%zu bytes of code)",
                   (size_t)r->h.code_len);
  out->code_len = out->code ? r->h.code_len : 0;
  return known_err(r->h.status) ? (kc_err)r->h.status : KC_INTERNAL;
}

static kc_err conclude(const kc_gpu_build_req *req, kc_err rc, const rx *r,
                       int reaped, int status, kc_gpu_build_out *out,
                       char *err) {
  if (rc == KC_TIMEOUT)
    return kc_errf(err, KC_TIMEOUT,
                   "%s: NVRTC build for %s timed out after %d s (child killed)",
                   req->name ? req->name : "kernel.cu", req->arch,
                   req->timeout_s ? req->timeout_s : DEFAULT_TIMEOUT_S);
  if (rc != KC_OK)
    return rc;
  if (!r->want || r->len < r->want)
    return no_answer(reaped, status, err);
  return unpack(r, out, err);
}

/* ---- The call ---- */

static kc_err start_child(const kc_gpu_build_req *req, pid_t *pid, int *fd,
                          char *err) {
  int fds[2];
  /* CLOEXEC: a program another thread starts must not keep the write end */
  if (pipe2(fds, O_CLOEXEC) != 0)
    return kc_errf(err, KC_IO, "pipe: %s", strerror(errno));
  *pid = fork();
  if (*pid < 0) {
    int e = errno;
    close(fds[0]);
    close(fds[1]);
    return kc_errf(err, KC_BUILD_FAILED, "fork: %s", strerror(e));
  }
  if (*pid == 0) {
    close(fds[0]);
    child_main(fds[1], req);
  }
  close(fds[1]);
  *fd = fds[0];
  return KC_OK;
}

kc_err kc_gpu_build(const kc_gpu_build_req *req, kc_gpu_build_out *out,
                    char *err) {
  if (!out)
    return kc_errf(err, KC_EINVAL, "kc_gpu_build: out is NULL");
  memset(out, 0, sizeof *out);
  kc_err rc = kcg_build_req_check(req, err);
  double t0 = now_s();
  pid_t pid = -1;
  int fd = -1;
  if (rc == KC_OK)
    rc = start_child(req, &pid, &fd, err);
  if (rc == KC_OK) {
    rx r = {0};
    int timeout = req->timeout_s ? req->timeout_s : DEFAULT_TIMEOUT_S;
    rc = receive(fd, t0 + timeout, &r, err);
    close(fd);
    /* Whole answer, deadline or error: nothing more is wanted from the
     * child, so it goes now (a no-op if it already left). After a bare EOF it
     * has exited on its own, and its status says how. */
    if (rc != KC_OK || (r.want && r.len == r.want))
      kill(pid, SIGKILL);
    int status = 0, reaped = reap(pid, &status) == 0;
    rc = conclude(req, rc, &r, reaped, status, out, err);
    free(r.buf);
  }
  out->seconds = now_s() - t0;
  if (!out->log)
    out->log = calloc(1, 1); /* "" as promised; NULL only without memory */
  return rc;
}

void kc_gpu_build_out_free(kc_gpu_build_out *out) {
  if (!out)
    return;
  free(out->code);
  free(out->log);
  out->code = NULL;
  out->log = NULL;
  out->code_len = 0;
}
