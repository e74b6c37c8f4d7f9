/* resp_admit.c: who may hold a RESP connection, and what is not RESP.
 *
 * Admission: at most --resp-max-connections connections, and at most
 * --resp-max-connections-per-ip from one address (counted in addrs.c's
 * table, as the HTTP side's; this one is the listener thread's), as the
 * HTTP side's --max-connections and --max-connections-per-ip.
 *
 * The cross-protocol guard: a web page can make a browser send an HTTP
 * request to the RESP port (fetch with mode no-cors); its body lines would
 * run as inline commands (SET, FLUSHALL). Redis closes a connection whose
 * command is POST or Host: and logs "Possible SECURITY ATTACK detected";
 * kcached does the same, also for any inline line that ends in HTTP/x (GET
 * / HTTP/1.1, PUT, OPTIONS...), and refuses a connection whose first bytes
 * are neither a RESP array nor a plausible inline command. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "resp.h"

const char *const kcd_resp_why_names[KCD_WHY_N] = {
    "max_connections", "per_ip", "http",           "not_resp",
    "token_revoked",   "idle",   "output_stalled", "output_limit"};

/* ---- admission ---- */

kcd_resp_why kcd_resp_admit(kcd_resp *r, kcd_resp_conn *c,
                            const struct sockaddr *sa) {
  const kcd_config *cfg = &r->st->cfg;
  kcd_addr_key(sa, c->addr, c->remote, sizeof c->remote);
  if (atomic_load(&r->nconns) >= cfg->resp_max_conns)
    return KCD_WHY_MAX_CONNS;
  if (!cfg->resp_max_conns_per_ip)
    return KCD_WHY_N;
  if (!r->addrs && !(r->addrs = kcd_addrs_new()))
    return KCD_WHY_MAX_CONNS; /* out of memory: as full */
  if (kcd_addrs_count(r->addrs, c->addr) >= cfg->resp_max_conns_per_ip)
    return KCD_WHY_PER_IP;
  if (kcd_addrs_add(r->addrs, c->addr))
    return KCD_WHY_MAX_CONNS;
  c->counted = 1;
  return KCD_WHY_N;
}

void kcd_resp_admit_release(kcd_resp *r, kcd_resp_conn *c) {
  if (!c->counted)
    return;
  c->counted = 0;
  kcd_addrs_sub(r->addrs, c->addr);
}

void kcd_resp_admit_free(kcd_resp *r) {
  kcd_addrs_free(r->addrs);
  r->addrs = NULL;
}

void kcd_resp_refuse(kcd_resp_conn *c, kcd_resp_why why) {
  kcd_resp *r = c->srv;
  atomic_fetch_add(&r->refused[why], 1);
  if (why != KCD_WHY_HTTP)
    return;
  /* a page can send this in a loop: one line a second at most */
  int64_t now = kc_clock_mono_ms();
  if (r->attack_logged_ms && now - r->attack_logged_ms < 1000) {
    r->attack_unlogged++;
    return;
  }
  kcd_log(r->st, "warn",
          "Possible SECURITY ATTACK detected. It looks like somebody is "
          "sending POST or Host: commands (an HTTP request) to the RESP "
          "port. This is likely due to an attacker attempting to use Cross "
          "Protocol Scripting to compromise your kcached instance. "
          "Connection from %s aborted (%llu more not logged since the last "
          "line).",
          c->remote, (unsigned long long)r->attack_unlogged);
  r->attack_logged_ms = now;
  r->attack_unlogged = 0;
}

/* ---- the guard ---- */

static int is_letter(char ch) {
  return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z');
}

kcd_resp_sniff_res kcd_resp_sniff(const char *buf, size_t len) {
  size_t i = 0;
  while (i < len &&
         (buf[i] == '\r' || buf[i] == '\n' || buf[i] == ' ' || buf[i] == '\t'))
    i++;
  if (i == len)
    return KCD_SNIFF_MORE;
  if (buf[i] == '*')
    return KCD_SNIFF_OK;
  if (!is_letter(buf[i]))
    return KCD_SNIFF_BAD;
  size_t start = i;
  for (; i < len; i++) {
    unsigned char ch = (unsigned char)buf[i];
    if (ch == '\n')
      return KCD_SNIFF_OK;
    if (ch == '\r' && i + 1 < len && buf[i + 1] != '\n')
      return KCD_SNIFF_BAD; /* a bare CR inside the line */
    if (ch != '\r' && ch != '\t' && (ch < 0x20 || ch > 0x7e))
      return KCD_SNIFF_BAD;
    if (i - start > KCD_RESP_INLINE_MAX)
      return KCD_SNIFF_OK; /* the parser refuses it: too big inline */
  }
  return KCD_SNIFF_MORE;
}

int kcd_resp_is_http(const char *const *argv, const size_t *lens, size_t argc,
                     int inl) {
  if (argc == 0)
    return 0;
  if ((lens[0] == 4 && strncasecmp(argv[0], "post", 4) == 0) ||
      (lens[0] == 5 && strncasecmp(argv[0], "host:", 5) == 0))
    return 1;
  /* METHOD TARGET HTTP/1.1: RESP clients frame as arrays; an inline line
   * ending in a protocol version is a request line */
  return inl && argc >= 2 && lens[argc - 1] >= 5 &&
         strncmp(argv[argc - 1], "HTTP/", 5) == 0;
}
