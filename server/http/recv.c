/* recv.c: the recv of libmicrohttpd.
 *
 * kcached defines recv(), so libmicrohttpd's calls (and every other in the
 * process: libcurl's, the RESP front end's) come here first. It receives
 * as glibc's would; for a descriptor of an open HTTP connection (this
 * table, set by conns.c while the connection is open) it also feeds the
 * bytes to kcd_framing_scan, which follows the requests' header blocks and
 * skips their bodies, and when that finds what libmicrohttpd would answer
 * wrongly it sends kcached's answer, ends the connection and tells
 * libmicrohttpd the peer closed (framing.c says why no callback can do
 * it). Descriptors beyond the table (the open-file limit at start) are not
 * scanned. */
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "http.h"

static _Atomic(kcd_scan *) *fd_scan;
static size_t fd_scan_n;
static _Atomic size_t scan_refused; /* for the sweep's log line */

int kcd_recv_init(void) {
  struct rlimit rl;
  size_t n = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                 ? (size_t)rl.rlim_cur
                 : 65536;
  if (n > (1u << 20))
    n = 1u << 20;
  if (!fd_scan && (fd_scan = calloc(n, sizeof *fd_scan)))
    fd_scan_n = n;
  return fd_scan != NULL;
}

void kcd_recv_scan(int fd, kcd_scan *s) {
  if (fd >= 0 && (size_t)fd < fd_scan_n)
    atomic_store(&fd_scan[fd], s);
}

size_t kcd_recv_refused_take(void) { return atomic_exchange(&scan_refused, 0); }

/* A connection's bytes (on its own thread); 1 when it was answered here
 * and closed. */
static int scan_received(int fd, kcd_scan *s, const void *buf, size_t n) {
  int v = kcd_framing_scan(s, buf, n);
  if (!v)
    return 0;
  size_t len;
  const char *a = kcd_framing_scan_answer(v, &len);
  (void)!send(fd, a, len, MSG_NOSIGNAL | MSG_DONTWAIT);
  shutdown(fd, SHUT_RDWR);
  atomic_fetch_add_explicit(&scan_refused, 1, memory_order_relaxed);
  return 1;
}

ssize_t recv(int fd, void *buf, size_t n, int flags) {
  ssize_t r = syscall(SYS_recvfrom, fd, buf, n, flags, NULL, NULL);
  if (r <= 0 || (flags & MSG_PEEK) || fd < 0 || (size_t)fd >= fd_scan_n)
    return r;
  kcd_scan *s = atomic_load_explicit(&fd_scan[fd], memory_order_acquire);
  if (s && s->on && scan_received(fd, s, buf, (size_t)r))
    return 0; /* libmicrohttpd: the client closed; it closes too */
  return r;
}
