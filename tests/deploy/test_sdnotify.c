/* test_sdnotify.c: kcd_sd_notify() against real datagram sockets (path and
 * abstract). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "sdnotify.h"

struct fixture {
  char dir[64];
  char path[128];
  int fd;
};

static int setup(void **state) {
  struct fixture *f = calloc(1, sizeof *f);
  assert_non_null(f);
  strcpy(f->dir, "/tmp/kcache-sdnotify-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  f->fd = -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  struct fixture *f = *state;
  if (f->fd >= 0)
    close(f->fd);
  if (f->path[0] == '/')
    unlink(f->path);
  rmdir(f->dir);
  unsetenv("NOTIFY_SOCKET");
  free(f);
  return 0;
}

/* Binds a datagram socket at `name` (leading '@' = abstract). */
static int listen_at(const char *name) {
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  size_t len = strlen(name);
  memcpy(sa.sun_path, name, len);
  if (name[0] == '@')
    sa.sun_path[0] = '\0';
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  assert_int_equal(
      bind(fd, (struct sockaddr *)&sa,
           (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len)),
      0);
  return fd;
}

static void expect_datagram(int fd, const char *want) {
  char buf[256];
  ssize_t n = recv(fd, buf, sizeof buf - 1, MSG_DONTWAIT);
  assert_true(n >= 0);
  buf[n] = '\0';
  assert_string_equal(buf, want);
}

static void test_unset_is_noop(void **state) {
  (void)state;
  unsetenv("NOTIFY_SOCKET");
  assert_int_equal(kcd_sd_notify("READY=1"), 0);
  setenv("NOTIFY_SOCKET", "", 1);
  assert_int_equal(kcd_sd_notify("READY=1"), 0);
}

static void test_path_socket(void **state) {
  struct fixture *f = *state;
  snprintf(f->path, sizeof f->path, "%s/notify", f->dir);
  f->fd = listen_at(f->path);
  setenv("NOTIFY_SOCKET", f->path, 1);
  assert_int_equal(kcd_sd_notify("READY=1"), 1);
  expect_datagram(f->fd, "READY=1");
  assert_int_equal(kcd_sd_notify("STOPPING=1\nSTATUS=bye"), 1);
  expect_datagram(f->fd, "STOPPING=1\nSTATUS=bye");
}

static void test_abstract_socket(void **state) {
  struct fixture *f = *state;
  char name[108];
  /* the temp dir's random suffix keeps parallel runs apart */
  snprintf(name, sizeof name, "@kcache-test-%ld-%s", (long)getpid(),
           f->dir + 5);
  f->fd = listen_at(name);
  setenv("NOTIFY_SOCKET", name, 1);
  assert_int_equal(kcd_sd_notify("READY=1"), 1);
  expect_datagram(f->fd, "READY=1");
}

static void test_bad_addresses(void **state) {
  struct fixture *f = *state;
  setenv("NOTIFY_SOCKET", "relative/path", 1);
  assert_int_equal(kcd_sd_notify("READY=1"), -EINVAL);
  setenv("NOTIFY_SOCKET", "vsock:2:1234", 1);
  assert_int_equal(kcd_sd_notify("READY=1"), -EINVAL);
  char lng[200];
  memset(lng, 'a', sizeof lng - 1);
  lng[0] = '/';
  lng[sizeof lng - 1] = '\0';
  setenv("NOTIFY_SOCKET", lng, 1);
  assert_int_equal(kcd_sd_notify("READY=1"), -EINVAL);
  char missing[128];
  snprintf(missing, sizeof missing, "%s/nobody-listens", f->dir);
  setenv("NOTIFY_SOCKET", missing, 1);
  assert_true(kcd_sd_notify("READY=1") < 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_unset_is_noop, setup, teardown),
      cmocka_unit_test_setup_teardown(test_path_socket, setup, teardown),
      cmocka_unit_test_setup_teardown(test_abstract_socket, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_addresses, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
