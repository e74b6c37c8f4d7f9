/* resp_admit.c: who may hold a RESP connection, and what is not RESP.
 *
 * Admission: at most --resp-max-connections connections, and at most
 * --resp-max-connections-per-ip from one address (a table of counts per
 * address, listener thread only), as the HTTP side's --max-connections and
 * --max-connections-per-ip.
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
    "max_connections", "per_ip", "http", "not_resp",
    "token_revoked", "idle", "output_stalled", "output_limit"};

/* ---- admission ---- */

struct kcd_resp_addr {
  unsigned char a[16];
  size_t n;
  struct kcd_resp_addr *next;
};

/* The peer as 16 bytes (IPv4 mapped into IPv6) and as text. */
static void addr_of(const struct sockaddr *sa, unsigned char a[16],
                    char *text, size_t cap) {
  memset(a, 0, 16);
  snprintf(text, cap, "-");
  if (sa && sa->sa_family == AF_INET) {
    const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
    a[10] = a[11] = 0xff;
    memcpy(a + 12, &s4->sin_addr, 4);
    inet_ntop(AF_INET, &s4->sin_addr, text, (socklen_t)cap);
  } else if (sa && sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
    memcpy(a, &s6->sin6_addr, 16);
    inet_ntop(AF_INET6, &s6->sin6_addr, text, (socklen_t)cap);
  }
}

static size_t bucket(const unsigned char a[16]) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (int i = 0; i < 16; i++)
    h = (h ^ a[i]) * 1099511628211ull;
  return (size_t)(h % KCD_RESP_ADDR_BUCKETS);
}

static struct kcd_resp_addr **find(kcd_resp *r, const unsigned char a[16]) {
  struct kcd_resp_addr **p = &r->addrs[bucket(a)];
  while (*p && memcmp((*p)->a, a, 16) != 0)
    p = &(*p)->next;
  return p;
}

kcd_resp_why kcd_resp_admit(kcd_resp *r, kcd_resp_conn *c,
                            const struct sockaddr *sa) {
  const kcd_config *cfg = &r->st->cfg;
  addr_of(sa, c->addr, c->remote, sizeof c->remote);
  if (atomic_load(&r->nconns) >= cfg->resp_max_conns)
    return KCD_WHY_MAX_CONNS;
  if (!cfg->resp_max_conns_per_ip)
    return KCD_WHY_N;
  struct kcd_resp_addr **p = find(r, c->addr);
  if (*p && (*p)->n >= cfg->resp_max_conns_per_ip)
    return KCD_WHY_PER_IP;
  if (!*p) {
    if (!(*p = calloc(1, sizeof **p)))
      return KCD_WHY_MAX_CONNS; /* out of memory: as full */
    memcpy((*p)->a, c->addr, 16);
  }
  (*p)->n++;
  c->counted = 1;
  return KCD_WHY_N;
}

void kcd_resp_admit_release(kcd_resp *r, kcd_resp_conn *c) {
  if (!c->counted)
    return;
  c->counted = 0;
  struct kcd_resp_addr **p = find(r, c->addr), *e = *p;
  if (e && --e->n == 0) {
    *p = e->next;
    free(e);
  }
}

void kcd_resp_admit_free(kcd_resp *r) {
  for (size_t i = 0; i < KCD_RESP_ADDR_BUCKETS; i++)
    while (r->addrs[i]) {
      struct kcd_resp_addr *e = r->addrs[i];
      r->addrs[i] = e->next;
      free(e);
    }
}

void kcd_resp_refuse(kcd_resp_conn *c, kcd_resp_why why) {
  kcd_resp *r = c->srv;
  atomic_fetch_add(&r->refused[why], 1);
  if (why != KCD_WHY_HTTP)
    return;
  /* a page can send this in a loop: one line a second at most */
  int64_t now = kcd_resp_mono_ms();
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
  while (i < len && (buf[i] == '\r' || buf[i] == '\n' || buf[i] == ' ' ||
                     buf[i] == '\t'))
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
