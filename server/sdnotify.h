/* sdnotify.h: systemd readiness notification (sd_notify protocol) without
 * libsystemd. */
#ifndef KCD_SDNOTIFY_H
#define KCD_SDNOTIFY_H

/* Sends `state` (e.g. "READY=1", "STOPPING=1", "STATUS=...", several joined
 * by '\n') as one datagram to the AF_UNIX socket named by $NOTIFY_SOCKET: a
 * path, or an abstract name written with a leading '@'.
 *
 * Returns 1 when sent, 0 when NOTIFY_SOCKET is unset or empty (not started by
 * a service manager: nothing to do), a negative errno on failure (-EINVAL for
 * an unsupported address, or the socket()/sendto() error). Failure is never
 * fatal for the caller: the manager just does not learn the state.
 *
 * Borrows `state` for the call only. Safe from any thread; it reads the
 * environment, so do not call it while another thread runs setenv(). */
int kcd_sd_notify(const char *state);

#endif
