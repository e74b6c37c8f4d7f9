/* sdnotify.c: one datagram to $NOTIFY_SOCKET, so Type=notify units and other
 * supervisors learn when kcached listens and when it stops. */
#include "sdnotify.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int kcd_sd_notify(const char *state) {
  const char *name = getenv("NOTIFY_SOCKET");
  if (name == NULL || name[0] == '\0')
    return 0;

  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  size_t len = strlen(name);
  /* vsock: and other transports of newer systemd are not supported. */
  if ((name[0] != '/' && name[0] != '@') || len >= sizeof sa.sun_path)
    return -EINVAL;
  memcpy(sa.sun_path, name, len);
  if (name[0] == '@')
    sa.sun_path[0] =
        '\0'; /* abstract: the length below bounds the name, no NUL */
  socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);

  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  size_t n = strlen(state);
  ssize_t sent =
      sendto(fd, state, n, MSG_NOSIGNAL, (const struct sockaddr *)&sa, salen);
  int err = sent < 0 ? errno : ((size_t)sent == n ? 0 : EMSGSIZE);
  close(fd);
  return err ? -err : 1;
}
