/* rawhttp.c: raw TCP helpers of the HTTP hardening tests (see rawhttp.h). */
#include "rawhttp.h"
#include "testsrv.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int raw_send(int fd, const char *s) {
  size_t n = strlen(s);
  while (n > 0) {
    ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    s += w;
    n -= (size_t)w;
  }
  return 0;
}

int raw_read(int fd, char *buf, size_t cap, int ms) {
  size_t len = 0;
  long end = kc_testsrv_now_ms() + ms;
  int rc = 0;
  for (;;) {
    long left = end - kc_testsrv_now_ms();
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (left <= 0 || poll(&p, 1, (int)left) <= 0)
      break;
    char tmp[4096];
    ssize_t r = recv(fd, tmp, sizeof tmp, 0);
    if (r == 0) {
      rc = 1;
      break;
    }
    if (r < 0) {
      rc = -1;
      break;
    }
    size_t k = (size_t)r < cap - 1 - len ? (size_t)r : cap - 1 - len;
    memcpy(buf + len, tmp, k);
    len += k;
  }
  buf[len] = '\0';
  return rc;
}

int raw_closed_within(int fd, int ms) {
  char buf[8192];
  return raw_read(fd, buf, sizeof buf, ms) != 0;
}

int raw_exchange(int port, const char *req, char *buf, size_t cap, int ms) {
  int fd = kc_testsrv_connect(port);
  if (fd < 0)
    return -1;
  int rc = raw_send(fd, req) == 0 ? raw_read(fd, buf, cap, ms) : -1;
  close(fd);
  return rc;
}

int raw_status(const char *resp) {
  int st = 0;
  if (sscanf(resp, "HTTP/1.%*d %d", &st) != 1)
    return 0;
  return st;
}

int raw_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  socklen_t al = sizeof a;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int port = -1;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &al) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0)
    close(fd);
  return port;
}

int raw_connect_from(int port, const char *src) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_in a = {.sin_family = AF_INET};
  struct sockaddr_in to = {.sin_family = AF_INET,
                           .sin_port = htons((uint16_t)port)};
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (inet_pton(AF_INET, src, &a.sin_addr) != 1 ||
      bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
      connect(fd, (struct sockaddr *)&to, sizeof to) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int raw_is_closed(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  if (poll(&p, 1, 0) <= 0)
    return 0;
  char b[512];
  ssize_t r = recv(fd, b, sizeof b, MSG_DONTWAIT);
  return r <= 0;
}
