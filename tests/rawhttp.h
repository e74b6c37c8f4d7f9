/* rawhttp.h: raw TCP for the HTTP hardening tests (tests/server.cmake):
 * bytes exactly as written (libcurl would fix what the tests break on
 * purpose), and what came back until the server closed or a timeout.
 * Connections: kc_testsrv_connect; the clock: kc_testsrv_now_ms (testsrv.h). */
#ifndef KC_RAWHTTP_H
#define KC_RAWHTTP_H

#include <stddef.h>

/* Writes all of s; 0 ok, -1 when the server closed or reset. */
int raw_send(int fd, const char *s);
/* Reads into buf (NUL-terminated, at most cap - 1 bytes) until the server
 * closes (returns 1), ms pass (0) or an error such as a reset (-1). */
int raw_read(int fd, char *buf, size_t cap, int ms);
/* Whether the server closed fd within ms (1), or it is still open (0); data
 * that arrives first is skipped. */
int raw_closed_within(int fd, int ms);
/* Sends req on a new connection and reads until close or ms; returns what
 * raw_read returns, or -1 when it could not connect. */
int raw_exchange(int port, const char *req, char *buf, size_t cap, int ms);
/* The status of a response's first line ("HTTP/1.1 400 ..."), 0 if none. */
int raw_status(const char *resp);
/* A connection to 127.0.0.1:port from the loopback address src
 * ("127.0.0.2": another client address, as far as the server can tell);
 * -1 on error. */
int raw_connect_from(int port, const char *src);
/* Whether the server closed fd (EOF or reset), without waiting; data that
 * arrived is read and dropped. */
int raw_is_closed(int fd);
/* A free loopback port (bound, read back, closed). */
int raw_free_port(void);

#endif
