/* mhd_static.c: the HTTP library's ceiling for bench_http.sh: libmicrohttpd
 * answering every request with one static buffer (the bytes of a file read
 * at start), with the same daemon flags kcached uses (one internal polling
 * thread, epoll, turbo). No routing, no store, no log: what is left is the
 * library and the kernel.
 * Usage: mhd_static FILE PORT-FILE   (listens on a free loopback port) */
#include <microhttpd.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *buf;
static size_t len;

static enum MHD_Result answer(void *cls, struct MHD_Connection *c,
                              const char *url, const char *method,
                              const char *version, const char *up,
                              size_t *up_size, void **ctx) {
  (void)cls, (void)url, (void)method, (void)version, (void)up, (void)up_size;
  static int first;
  if (*ctx != &first) { /* headers only: answer on the next call */
    *ctx = &first;
    return MHD_YES;
  }
  struct MHD_Response *r =
      MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_PERSISTENT);
  enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ret;
}

int main(int argc, char **argv) {
  if (argc != 3)
    return fprintf(stderr, "usage: mhd_static FILE PORT-FILE\n"), 2;
  FILE *f = fopen(argv[1], "rb");
  if (!f || !(buf = malloc(64 << 20)))
    return perror(argv[1]), 1;
  len = fread(buf, 1, 64 << 20, f);
  fclose(f);
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_TURBO, 0, NULL,
      NULL, answer, NULL, MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_END);
  if (!d)
    return fprintf(stderr, "mhd_static: cannot start\n"), 1;
  const union MHD_DaemonInfo *di =
      MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  FILE *p = fopen(argv[2], "w");
  if (!p)
    return perror(argv[2]), 1;
  fprintf(p, "%u\n", di->port);
  fclose(p);
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGTERM);
  sigaddset(&s, SIGINT);
  sigprocmask(SIG_BLOCK, &s, NULL);
  int sig;
  sigwait(&s, &sig);
  MHD_stop_daemon(d);
  return 0;
}
