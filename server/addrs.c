/* addrs.c: connections per client address, for the per-address caps of
 * both front ends (HTTP's --max-connections-per-ip in conns.c, RESP's
 * --resp-max-connections-per-ip in resp_admit.c): a chained hash of
 * 16-byte addresses (IPv4 mapped into IPv6) to counts. Not locked: the
 * caller's lock or thread owns it. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "kcd.h"

#define ADDR_BUCKETS 1024

typedef struct addr_count {
  struct addr_count *next;
  unsigned char addr[16];
  size_t n;
} addr_count;

struct kcd_addrs {
  addr_count *bucket[ADDR_BUCKETS];
};

kcd_addrs *kcd_addrs_new(void) { return calloc(1, sizeof(kcd_addrs)); }

void kcd_addrs_free(kcd_addrs *t) {
  if (!t)
    return;
  for (size_t i = 0; i < ADDR_BUCKETS; i++)
    while (t->bucket[i]) {
      addr_count *a = t->bucket[i];
      t->bucket[i] = a->next;
      free(a);
    }
  free(t);
}

int kcd_addr_key(const struct sockaddr *sa, unsigned char key[16], char *text,
                 size_t cap) {
  memset(key, 0, 16);
  if (text)
    snprintf(text, cap, "-");
  if (sa && sa->sa_family == AF_INET) {
    const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
    key[10] = key[11] = 0xff;
    memcpy(key + 12, &s4->sin_addr, 4);
    if (text)
      inet_ntop(AF_INET, &s4->sin_addr, text, (socklen_t)cap);
    return 1;
  }
  if (sa && sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
    memcpy(key, &s6->sin6_addr, 16);
    if (text)
      inet_ntop(AF_INET6, &s6->sin6_addr, text, (socklen_t)cap);
    return 1;
  }
  return 0;
}

/* Where addr's count is, or would be linked. */
static addr_count **slot(kcd_addrs *t, const unsigned char addr[16]) {
  uint32_t h = 2166136261u; /* FNV-1a */
  for (int i = 0; i < 16; i++)
    h = (h ^ addr[i]) * 16777619u;
  addr_count **pp = &t->bucket[h % ADDR_BUCKETS];
  while (*pp && memcmp((*pp)->addr, addr, 16) != 0)
    pp = &(*pp)->next;
  return pp;
}

size_t kcd_addrs_count(kcd_addrs *t, const unsigned char addr[16]) {
  addr_count **pp = slot(t, addr);
  return *pp ? (*pp)->n : 0;
}

int kcd_addrs_add(kcd_addrs *t, const unsigned char addr[16]) {
  addr_count **pp = slot(t, addr);
  if (!*pp) {
    if (!(*pp = calloc(1, sizeof **pp)))
      return -1;
    memcpy((*pp)->addr, addr, 16);
  }
  (*pp)->n++;
  return 0;
}

void kcd_addrs_sub(kcd_addrs *t, const unsigned char addr[16]) {
  addr_count **pp = slot(t, addr), *a = *pp;
  if (a && --a->n == 0) {
    *pp = a->next;
    free(a);
  }
}
