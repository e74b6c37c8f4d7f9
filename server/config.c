/* config.c: kcached's flags, each with a KCACHED_* environment variable
 * (flags win), their defaults, --help, and the start-up safety checks
 * (no open server off loopback, no tokens in clear on a network). */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "kcd.h"

#ifndef KCACHE_VERSION
#define KCACHE_VERSION "0.1.0"
#endif

typedef int (*setter)(kcd_config *c, const char *v);

typedef struct opt {
  const char *name, *arg, *env, *help;
  setter set;
} opt;

static int parse_u64(const char *v, uint64_t max, uint64_t *out) {
  char *end;
  if (!isdigit((unsigned char)v[0]))
    return -1;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (errno || *end || x > max)
    return -1;
  *out = x;
  return 0;
}

/* "4096", "4K", "16MiB", "1G", "2TB": binary multiples. */
static int parse_size(const char *v, uint64_t *out) {
  char *end;
  if (!isdigit((unsigned char)v[0]))
    return -1;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (errno)
    return -1;
  static const char units[] = "KMGT";
  const char *u = *end ? strchr(units, toupper((unsigned char)*end)) : NULL;
  int shift = u ? 10 * (int)(u - units + 1) : 0;
  if (*end && !u)
    return -1;
  if (u)
    end++;
  if (*end && strcasecmp(end, "iB") && strcasecmp(end, "B"))
    return -1;
  if (shift && x > (UINT64_MAX >> shift))
    return -1;
  *out = (uint64_t)x << shift;
  return 0;
}

static int parse_bool(const char *v, int *out) {
  static const char *const yes[] = {"1", "true", "yes", "on"};
  static const char *const no[] = {"0", "false", "no", "off", ""};
  for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
    if (strcasecmp(v, yes[i]) == 0)
      return *out = 1, 0;
  for (size_t i = 0; i < sizeof no / sizeof *no; i++)
    if (strcasecmp(v, no[i]) == 0)
      return *out = 0, 0;
  return -1;
}

/* "host:port" or "[v6]:port". */
static int set_listen(kcd_config *c, const char *v) {
  const char *colon = strrchr(v, ':');
  const char *h = v;
  size_t hlen = colon ? (size_t)(colon - v) : 0;
  uint64_t port;
  if (!colon || hlen == 0 || parse_u64(colon + 1, 65535, &port))
    return -1;
  if (h[0] == '[') {
    if (hlen < 3 || h[hlen - 1] != ']')
      return -1;
    h++;
    hlen -= 2;
  }
  if (hlen >= sizeof c->host)
    return -1;
  memcpy(c->host, h, hlen);
  c->host[hlen] = '\0';
  c->port = (unsigned)port;
  return 0;
}

static int set_port_file(kcd_config *c, const char *v) {
  return *v ? (c->port_file = v, 0) : -1;
}
static int set_data_dir(kcd_config *c, const char *v) {
  return *v ? (c->data_dir = v, 0) : -1;
}
static int set_max_bytes(kcd_config *c, const char *v) {
  return parse_size(v, &c->max_bytes);
}
static int set_max_blob(kcd_config *c, const char *v) {
  return parse_size(v, &c->max_blob_bytes) || !c->max_blob_bytes ? -1 : 0;
}
static int set_max_json(kcd_config *c, const char *v) {
  return parse_size(v, &c->max_json_bytes) || c->max_json_bytes < 1024 ? -1 : 0;
}
static int set_scrub_rate(kcd_config *c, const char *v) {
  /* at most 1T: the credit arithmetic stays far from int64's limits */
  return parse_size(v, &c->scrub_rate) || c->scrub_rate > (1ull << 40) ? -1 : 0;
}
static int set_tokens(kcd_config *c, const char *v) {
  c->tokens = *v ? v : NULL;
  return 0;
}
static int set_tls_cert(kcd_config *c, const char *v) {
  c->tls_cert = *v ? v : NULL;
  return 0;
}
static int set_tls_key(kcd_config *c, const char *v) {
  c->tls_key = *v ? v : NULL;
  return 0;
}
static int set_plaintext(kcd_config *c, const char *v) {
  return parse_bool(v ? v : "1", &c->allow_plaintext);
}
static int set_uint(unsigned *dst, const char *v, uint64_t lo, uint64_t hi) {
  uint64_t x;
  if (parse_u64(v, hi, &x) || x < lo)
    return -1;
  *dst = (unsigned)x;
  return 0;
}
static int set_threads(kcd_config *c, const char *v) {
  return set_uint(&c->threads, v, 1, 256);
}
static int set_timeout(kcd_config *c, const char *v) {
  return set_uint(&c->timeout_s, v, 1, 86400);
}
static int set_max_conns(kcd_config *c, const char *v) {
  return set_uint(&c->max_conns, v, 1, 1000000);
}
static int set_shutdown(kcd_config *c, const char *v) {
  return set_uint(&c->shutdown_s, v, 0, 3600);
}
static int set_store_wait(kcd_config *c, const char *v) {
  return set_uint(&c->store_wait_s, v, 0, 86400);
}
static int set_lease_ttl(kcd_config *c, const char *v) {
  return parse_u64(v, 7 * 86400, &c->lease_max_ttl_s) || !c->lease_max_ttl_s
             ? -1
             : 0;
}
static int set_metrics_role(kcd_config *c, const char *v) {
  return kcd_role_parse(v, &c->metrics_role);
}
/* read or write: demand is counted from a token, never anonymously. */
static int set_demand_role(kcd_config *c, const char *v) {
  kcd_role r;
  if (kcd_role_parse(v, &r) || r == KCD_ROLE_NONE || r == KCD_ROLE_ADMIN)
    return -1;
  c->demand_role = r;
  return 0;
}
static int set_s3_endpoint(kcd_config *c, const char *v) {
  c->s3_endpoint = *v ? v : NULL;
  return 0;
}
static int set_s3_bucket(kcd_config *c, const char *v) {
  c->s3_bucket = *v ? v : NULL;
  return 0;
}
static int set_s3_prefix(kcd_config *c, const char *v) {
  /* no leading or trailing slash, no empty segment */
  if (!*v || v[0] == '/' || v[strlen(v) - 1] == '/' || strstr(v, "//"))
    return -1;
  c->s3_prefix = v;
  return 0;
}
static int set_s3_region(kcd_config *c, const char *v) {
  return *v ? (c->s3_region = v, 0) : -1;
}
static int set_s3_path_style(kcd_config *c, const char *v) {
  return parse_bool(v ? v : "1", &c->s3_path_style);
}
static int set_s3_credentials(kcd_config *c, const char *v) {
  c->s3_credentials = *v ? v : NULL;
  return 0;
}
static int set_s3_parallel(kcd_config *c, const char *v) {
  return set_uint(&c->s3_parallel, v, 1, 64);
}
static int set_resp_listen(kcd_config *c, const char *v) {
  if (!*v)
    return c->resp_on = 0, 0;
  kcd_config t = *c; /* set_listen writes host and port: borrow them */
  if (set_listen(&t, v))
    return -1;
  memcpy(c->resp_host, t.host, sizeof c->resp_host);
  c->resp_port = t.port;
  c->resp_on = 1;
  return 0;
}
static int set_resp_max_value(kcd_config *c, const char *v) {
  return parse_size(v, &c->resp_max_value) || !c->resp_max_value ||
                 c->resp_max_value > (1ull << 40)
             ? -1
             : 0;
}
static int set_resp_anon(kcd_config *c, const char *v) {
  return kcd_role_parse(v, &c->resp_anon_role) ||
                 c->resp_anon_role == KCD_ROLE_ADMIN
             ? -1
             : 0;
}
static int set_resp_tls(kcd_config *c, const char *v) {
  return parse_bool(v, &c->resp_tls);
}
static int set_compress_level(kcd_config *c, const char *v) {
  unsigned n;
  if (set_uint(&n, v, 0, 19))
    return -1;
  c->compress_level = (int)n;
  return 0;
}
static int set_resp_max_bytes(kcd_config *c, const char *v) {
  return parse_size(v, &c->resp_max_bytes);
}
static int set_header_timeout(kcd_config *c, const char *v) {
  return set_uint(&c->header_timeout_s, v, 1, 3600);
}
static int set_min_body_rate(kcd_config *c, const char *v) {
  return parse_size(v, &c->min_body_rate) || c->min_body_rate > (1ull << 30)
             ? -1
             : 0;
}
static int set_max_conns_per_ip(kcd_config *c, const char *v) {
  return set_uint(&c->max_conns_per_ip, v, 0, 1000000);
}
/* RESP admission and budgets: one block (resp.c, resp_admit.c). */
static int set_resp_max_conns(kcd_config *c, const char *v) {
  return set_uint(&c->resp_max_conns, v, 1, 1000000);
}
static int set_resp_max_conns_per_ip(kcd_config *c, const char *v) {
  return set_uint(&c->resp_max_conns_per_ip, v, 0, 1000000);
}
static int set_resp_timeout(kcd_config *c, const char *v) {
  return set_uint(&c->resp_timeout_s, v, 0, 31536000);
}
static int set_resp_output_limit(kcd_config *c, const char *v) {
  /* 0: auto; else at least room for the soft mark and an error line */
  return parse_size(v, &c->resp_output_limit) ||
                 (c->resp_output_limit && c->resp_output_limit < (2u << 20))
             ? -1
             : 0;
}
static int set_resp_output_total(kcd_config *c, const char *v) {
  return parse_size(v, &c->resp_output_total) ||
                 c->resp_output_total < (2u << 20)
             ? -1
             : 0;
}
static int set_resp_output_stall(kcd_config *c, const char *v) {
  return set_uint(&c->resp_output_stall_s, v, 0, 86400);
}
/* HOST:PORT as --listen reads it; empty: no health listener. */
static int set_health_listen(kcd_config *c, const char *v) {
  kcd_config tmp;
  if (!*v) {
    c->health_host[0] = '\0';
    return 0;
  }
  if (set_listen(&tmp, v))
    return -1;
  memcpy(c->health_host, tmp.host, sizeof c->health_host);
  c->health_port = tmp.port;
  return 0;
}
static int set_log_format(kcd_config *c, const char *v) {
  if (strcmp(v, "text") == 0)
    c->log_format = KCD_LOG_TEXT;
  else if (strcmp(v, "json") == 0)
    c->log_format = KCD_LOG_JSON;
  else
    return -1;
  return 0;
}

static int set_access_log(kcd_config *c, const char *v) {
  if (!*v)
    return -1;
  c->access_log = v; /* "off", or a file opened at start (log.c) */
  return 0;
}

/* ---- strict HTTP and connection shares (framing.c, http.c) ---- */
static int set_allow_host(kcd_config *c, const char *v) {
  c->allow_hosts = *v ? v : NULL;
  return 0;
}
static int set_max_answer_memory(kcd_config *c, const char *v) {
  return parse_size(v, &c->max_answer_memory);
}
static int set_decoded_cache(kcd_config *c, const char *v) {
  return parse_size(v, &c->decoded_cache);
}

static const opt opts[] = {
    {"listen", "HOST:PORT", "KCACHED_LISTEN",
     "address to serve on (default 127.0.0.1:8080); port 0 picks a free one",
     set_listen},
    {"port-file", "FILE", "KCACHED_PORT_FILE",
     "write the bound port here once listening", set_port_file},
    {"data-dir", "DIR", "KCACHED_DATA_DIR",
     "the LMDB store (default ./kcache-data; created if missing)",
     set_data_dir},
    {"max-bytes", "SIZE", "KCACHED_MAX_BYTES",
     "store size limit; least recently used bundles are evicted above it "
     "(default 0: none beyond the map)",
     set_max_bytes},
    {"max-blob-bytes", "SIZE", "KCACHED_MAX_BLOB_BYTES",
     "largest blob accepted (default 1G); larger uploads get 413",
     set_max_blob},
    {"scrub-rate", "SIZE", "KCACHED_SCRUB_RATE",
     "bytes per second the scrub re-hashes: a blob that no longer hashes to "
     "its name (bit rot) is removed with the bundles naming it, so it is "
     "not served again (default 8M; 0: off)",
     set_scrub_rate},
    {"max-json-bytes", "SIZE", "KCACHED_MAX_JSON_BYTES",
     "largest manifest, lookup or lease body (default 4M)", set_max_json},
    {"tokens", "FILE", "KCACHED_TOKENS",
     "token file: lines 'role name sha256hex' (see 'kcached token'); "
     "SIGHUP re-reads it. Without one, everything is allowed and only "
     "loopback addresses are served",
     set_tokens},
    {"tls-cert", "FILE", "KCACHED_TLS_CERT",
     "PEM certificate chain: serve HTTPS", set_tls_cert},
    {"tls-key", "FILE", "KCACHED_TLS_KEY", "PEM private key of --tls-cert",
     set_tls_key},
    {"allow-plaintext", NULL, "KCACHED_ALLOW_PLAINTEXT",
     "accept tokens over plain HTTP on a non-loopback address (behind a "
     "TLS-terminating proxy only)",
     set_plaintext},
    {"threads", "N", "KCACHED_THREADS", "worker threads (default: one per CPU)",
     set_threads},
    {"timeout", "SECONDS", "KCACHED_TIMEOUT",
     "close a connection idle this long (default 30)", set_timeout},
    {"max-connections", "N", "KCACHED_MAX_CONNECTIONS",
     "connections served at once (default 1024)", set_max_conns},
    {"header-timeout", "SECONDS", "KCACHED_HEADER_TIMEOUT",
     "close a connection whose request headers are not all in this long "
     "after it opened or its last request ended (default 10)",
     set_header_timeout},
    {"min-body-rate", "SIZE", "KCACHED_MIN_BODY_RATE",
     "close a connection whose request body averages fewer bytes a second "
     "than this over a --timeout window (default 1K; 0: no minimum)",
     set_min_body_rate},
    {"max-connections-per-ip", "N", "KCACHED_MAX_CONNECTIONS_PER_IP",
     "connections one client address may hold (default 256; 0: no cap). "
     "Behind a proxy every client has the proxy's address: raise it or 0",
     set_max_conns_per_ip},
    {"health-listen", "HOST:PORT", "KCACHED_HEALTH_LISTEN",
     "also answer /healthz, /readyz and /metrics (only those) on this "
     "address, with its own few connections, so that probes are answered "
     "while --max-connections is used up (default none)",
     set_health_listen},
    {"shutdown-timeout", "SECONDS", "KCACHED_SHUTDOWN_TIMEOUT",
     "on SIGTERM, wait this long for in-flight requests (default 10)",
     set_shutdown},
    {"store-wait", "SECONDS", "KCACHED_STORE_WAIT",
     "when the store cannot be opened at start, keep retrying this long "
     "(serving /healthz, 503 on /readyz) before exiting 3 (default 0: exit "
     "at once)",
     set_store_wait},
    {"lease-max-ttl", "SECONDS", "KCACHED_LEASE_MAX_TTL",
     "longest lease a builder may ask for (default 3600)", set_lease_ttl},
    {"metrics-role", "ROLE", "KCACHED_METRICS_ROLE",
     "role GET /metrics needs: none, read, write, admin (default none)",
     set_metrics_role},
    {"demand-role", "ROLE", "KCACHED_DEMAND_ROLE",
     "role POST /v1/demand needs: write (default), or read to let services "
     "holding a read token report the shapes they run (kc_demand_note)",
     set_demand_role},
    {"log-format", "text|json", "KCACHED_LOG_FORMAT",
     "log lines on stderr (default text)", set_log_format},
    {"access-log", "off|FILE", "KCACHED_ACCESS_LOG",
     "one line per request: off, or appended to FILE (default: with the "
     "other log lines on stderr)",
     set_access_log},
    {"s3-endpoint", "URL", "KCACHED_S3_ENDPOINT",
     "durable tier: an S3-compatible endpoint (https://s3.amazonaws.com, "
     "http://rgw:7480); bundles are written through to it and read through "
     "from it. Credentials: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY "
     "(AWS_SESSION_TOKEN) or --s3-credentials",
     set_s3_endpoint},
    {"s3-bucket", "NAME", "KCACHED_S3_BUCKET",
     "the bucket every replica shares (with --s3-endpoint)", set_s3_bucket},
    {"s3-prefix", "PREFIX", "KCACHED_S3_PREFIX",
     "object keys start with PREFIX/ (default kcache)", set_s3_prefix},
    {"s3-region", "REGION", "KCACHED_S3_REGION",
     "SigV4 region (default us-east-1)", set_s3_region},
    {"s3-path-style", NULL, "KCACHED_S3_PATH_STYLE",
     "ENDPOINT/BUCKET/KEY URLs (Ceph RGW, MinIO) instead of BUCKET.HOST/KEY",
     set_s3_path_style},
    {"s3-credentials", "FILE", "KCACHED_S3_CREDENTIALS",
     "AWS shared-credentials file ([default] or $AWS_PROFILE: "
     "aws_access_key_id, aws_secret_access_key, aws_session_token)",
     set_s3_credentials},
    {"s3-parallel", "N", "KCACHED_S3_PARALLEL",
     "S3 requests at once for read-through (default 16)", set_s3_parallel},
    {"resp-listen", "HOST:PORT", "KCACHED_RESP_LISTEN",
     "also speak the Redis protocol (RESP2, RESP3 after HELLO 3) here, for "
     "torch.compile's and Triton's Redis caches (default: off; port 0 picks "
     "one). Strings only: GET SET MGET MSET DEL EXPIRE TTL SCAN KEYS "
     "MULTI/EXEC ...; KEYS returns at most 100000 keys. AUTH takes a token "
     "of --tokens (AUTH TOKEN or AUTH NAME TOKEN). With --tls-cert it speaks "
     "TLS (rediss://) unless --resp-tls off; off loopback it needs "
     "--tokens, and TLS or --allow-plaintext",
     set_resp_listen},
    {"resp-max-value", "SIZE", "KCACHED_RESP_MAX_VALUE",
     "longest RESP argument (value) accepted (default 512M)",
     set_resp_max_value},
    {"resp-anonymous-role", "none|read|write", "KCACHED_RESP_ANONYMOUS_ROLE",
     "with --tokens, the role of a RESP client before AUTH (default none: "
     "-NOAUTH)",
     set_resp_anon},
    {"compress-level", "N", "KCACHED_COMPRESS_LEVEL",
     "zstd level (1-19) of blobs at rest: each is kept compressed when that "
     "halves its bytes, else raw, and sent compressed to clients "
     "that accept zstd; --max-bytes counts stored bytes (default 3; 0: off)",
     set_compress_level},
    {"resp-max-bytes", "SIZE", "KCACHED_RESP_MAX_BYTES",
     "value bytes RESP keys may hold; above it their least recently used "
     "are evicted first (default 0: only --max-bytes)",
     set_resp_max_bytes},
    {"resp-tls", "on|off", "KCACHED_RESP_TLS",
     "whether the RESP listener speaks TLS when --tls-cert is given "
     "(default on); off keeps RESP plaintext (Triton's redis.Redis) while "
     "HTTP stays HTTPS; off loopback, off needs --allow-plaintext",
     set_resp_tls},
    /* strict HTTP and connection shares (framing.c, http.c) */
    {"allow-host", "NAME[,NAME]...", "KCACHED_ALLOW_HOST",
     "without --tokens, Host names answered besides localhost, loopback "
     "addresses and the --listen host (a proxy's or an SSH tunnel's name); "
     "other names get 403, as a web page reaching a loopback kcached by DNS "
     "rebinding would ('*': any)",
     set_allow_host},
    {"max-answer-memory", "SIZE", "KCACHED_MAX_ANSWER_MEMORY",
     "bytes of HTTP answers (lookups, manifests, read-through blobs) held in "
     "memory until their clients read them, and of large blobs sent from "
     "the store's pages (the copy a stalled client's GET may need, set "
     "aside when the GET starts); an answer over it gets 503 busy with "
     "Retry-After before its first byte, unless it would be the only one, "
     "and a blob over it is sent in pieces instead; an answer that started "
     "is never cut. Blobs sent from the store's pages hold at most 256 MiB "
     "whatever this says (default 1G; 0: no cap on the rest)",
     set_max_answer_memory},
    {"decoded-cache", "SIZE", "KCACHED_DECODED_CACHE",
     "memory for blobs held compressed kept decoded, for clients that do "
     "not send Accept-Encoding: zstd (curl, wget): a hot one is decoded "
     "once; least recently used out, one blob at most a quarter of it "
     "(default 256M; 0: off)",
     set_decoded_cache},
    {"resp-max-connections", "N", "KCACHED_RESP_MAX_CONNECTIONS",
     "RESP connections open at once; more are answered '-ERR max number of "
     "clients reached' and closed (default 10000, Redis's maxclients)",
     set_resp_max_conns},
    {"resp-max-connections-per-ip", "N", "KCACHED_RESP_MAX_CONNECTIONS_PER_IP",
     "RESP connections one client address may hold (default 256; 0: no "
     "cap)",
     set_resp_max_conns_per_ip},
    {"resp-timeout", "SECONDS", "KCACHED_RESP_TIMEOUT",
     "close a RESP connection that sent and received nothing this long, "
     "as Redis's timeout (default 0: never)",
     set_resp_timeout},
    {"resp-output-limit", "SIZE", "KCACHED_RESP_OUTPUT_LIMIT",
     "reply bytes one RESP connection may hold unsent: a reply that would "
     "pass it (MGET of a big key repeated) is answered an error instead "
     "(default 0: --resp-max-value + 2M)",
     set_resp_output_limit},
    {"resp-output-total", "SIZE", "KCACHED_RESP_OUTPUT_TOTAL",
     "reply bytes every RESP connection together may hold; a reply that "
     "would pass it is answered an error (default 1G, or "
     "--resp-output-limit when larger; not less than it)",
     set_resp_output_total},
    {"resp-output-stall", "SECONDS", "KCACHED_RESP_OUTPUT_STALL",
     "close a RESP connection holding more than 1M of unsent replies whose "
     "client read none of it this long (default 60; 0: never)",
     set_resp_output_stall},
};
#define N_OPTS (sizeof opts / sizeof opts[0])

static void usage(FILE *f) {
  fprintf(f,
          "usage: kcached [OPTION]...\n"
          "       kcached token read|write|admin NAME\n\n"
          "kcached serves the kcache HTTP API (docs/DESIGN.md) from an LMDB "
          "store.\n"
          "Every option can also be set by its environment variable; the "
          "option wins.\nSIZE takes K, M, G, T suffixes (powers of 1024).\n\n");
  for (size_t i = 0; i < N_OPTS; i++) {
    char left[64];
    snprintf(left, sizeof left, "--%s%s%s", opts[i].name,
             opts[i].arg ? " " : "", opts[i].arg ? opts[i].arg : "");
    fprintf(f, "  %-28s %s\n  %-28s [%s]\n", left, opts[i].help, "",
            opts[i].env);
  }
  fprintf(
      f,
      "  %-28s this text\n  %-28s print the version\n\n"
      "Subcommand:\n  token ROLE NAME              print a new random token "
      "and its token-file line\n\n"
      "Signals: SIGTERM/SIGINT stop gracefully; SIGHUP re-reads the token "
      "file.\n"
      "Exit status: 0 stopped by a signal; 1 could not start; 2 bad "
      "option or token file; 3 the store could not be opened.\n",
      "--help", "--version");
}

static void defaults(kcd_config *c) {
  memset(c, 0, sizeof *c);
  snprintf(c->host, sizeof c->host, "127.0.0.1");
  c->port = 8080;
  c->data_dir = "./kcache-data";
  c->max_blob_bytes = 1ull << 30;
  c->max_json_bytes = 4ull << 20;
  c->scrub_rate = 8ull << 20;
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  c->threads = n > 0 ? (unsigned)n : 1;
  c->timeout_s = 30;
  c->max_conns = 1024;
  c->header_timeout_s = 10;
  c->max_conns_per_ip = 256;
  c->min_body_rate = 1024;
  c->shutdown_s = 10;
  c->lease_max_ttl_s = 3600;
  c->demand_role = KCD_ROLE_WRITE;
  c->resp_max_value = 512ull << 20;
  c->resp_tls = -1;
  c->compress_level = 3;
  c->max_answer_memory = 1ull << 30;
  c->decoded_cache = 256ull << 20;
  c->resp_max_conns = 10000;
  c->resp_max_conns_per_ip = 256;
  c->resp_output_stall_s = 60;
}

static int from_env(kcd_config *c) {
  for (size_t i = 0; i < N_OPTS; i++) {
    const char *v = getenv(opts[i].env);
    if (!v)
      continue;
    if (opts[i].set(c, v)) {
      fprintf(stderr, "kcached: %s: invalid value '%s' (see kcached --help)\n",
              opts[i].env, v);
      return 2;
    }
  }
  return 0;
}

static int from_flags(kcd_config *c, int argc, char **argv) {
  struct option lo[N_OPTS + 3];
  for (size_t i = 0; i < N_OPTS; i++)
    lo[i] = (struct option){opts[i].name,
                            opts[i].arg ? required_argument : no_argument, NULL,
                            (int)(i + 256)};
  lo[N_OPTS] = (struct option){"help", no_argument, NULL, 'h'};
  lo[N_OPTS + 1] = (struct option){"version", no_argument, NULL, 'V'};
  lo[N_OPTS + 2] = (struct option){0, 0, 0, 0};
  int ch;
  opterr = 0;
  while ((ch = getopt_long(argc, argv, ":hV", lo, NULL)) != -1) {
    if (ch == 'h')
      return usage(stdout), -1;
    if (ch == 'V')
      return printf("kcached %s\n", KCACHE_VERSION), -1;
    if (ch < 256) {
      fprintf(stderr, "kcached: %s '%s' (see kcached --help)\n",
              ch == ':' ? "missing value for" : "unknown option",
              argv[optind - 1]);
      return 2;
    }
    const opt *o = &opts[ch - 256];
    if (o->set(c, optarg)) {
      fprintf(stderr,
              "kcached: --%s: invalid value '%s' (see kcached --help)\n",
              o->name, optarg ? optarg : "");
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "kcached: unexpected argument '%s' (see kcached --help)\n",
            argv[optind]);
    return 2;
  }
  return 0;
}

int kcd_config_parse(kcd_config *c, int argc, char **argv) {
  defaults(c);
  int rc = from_env(c);
  rc = rc ? rc : from_flags(c, argc, argv);
  /* auto: a reply of the largest value fits beside the soft mark's 1M */
  if (!rc && !c->resp_output_limit)
    c->resp_output_limit = c->resp_max_value + (2u << 20);
  /* auto: 1G, or room for one largest reply when values may be larger */
  if (!rc && !c->resp_output_total)
    c->resp_output_total =
        c->resp_output_limit > (1ull << 30) ? c->resp_output_limit : 1ull << 30;
  return rc;
}

int kcd_host_is_loopback(const char *host) {
  unsigned char a[16];
  if (strcmp(host, "localhost") == 0)
    return 1;
  if (inet_pton(AF_INET, host, a) == 1)
    return a[0] == 127;
  if (inet_pton(AF_INET6, host, a) == 1) {
    static const unsigned char lo6[16] = {[15] = 1};
    static const unsigned char v4map[12] = {[10] = 0xff, [11] = 0xff};
    return memcmp(a, lo6, 16) == 0 ||
           (memcmp(a, v4map, 12) == 0 && a[12] == 127);
  }
  return 0; /* a name: we cannot know what it resolves to later */
}

/* Off loopback RESP needs tokens, and TLS (--tls-cert: RESP speaks TLS
 * too unless --resp-tls off) or --allow-plaintext. */
static int resp_flags_check(const kcd_config *c) {
  if (c->resp_output_limit > c->resp_output_total) {
    fprintf(stderr,
            "kcached: --resp-output-limit (%llu bytes; by default "
            "--resp-max-value + 2M) is above --resp-output-total (%llu): no "
            "largest reply could be sent; raise --resp-output-total\n",
            (unsigned long long)c->resp_output_limit,
            (unsigned long long)c->resp_output_total);
    return 2;
  }
  if (c->resp_tls == 1 && !c->tls_cert) {
    fprintf(stderr, "kcached: --resp-tls on needs --tls-cert/--tls-key\n");
    return 2;
  }
  if (kcd_host_is_loopback(c->resp_host))
    return 0;
  if (!c->tokens) {
    fprintf(stderr,
            "kcached: refusing --resp-listen on %s without --tokens: "
            "anyone who can reach it could write and delete.\n",
            c->resp_host);
    return 2;
  }
  if (!c->allow_plaintext && (!c->tls_cert || c->resp_tls == 0)) {
    fprintf(stderr,
            "kcached: --resp-listen on %s would send tokens in clear: "
            "give --tls-cert/--tls-key (RESP then speaks TLS; not with "
            "--resp-tls off), or add --allow-plaintext on a trusted "
            "network.\n",
            c->resp_host);
    return 2;
  }
  return 0;
}

int kcd_config_check(const kcd_config *c) {
  if (!c->tls_cert != !c->tls_key) {
    fprintf(stderr, "kcached: --tls-cert and --tls-key go together\n");
    return 2;
  }
  if (!c->s3_endpoint != !c->s3_bucket) {
    fprintf(stderr, "kcached: --s3-endpoint and --s3-bucket go together\n");
    return 2;
  }
  if (c->s3_endpoint && c->max_blob_bytes > (5ull << 30)) {
    fprintf(stderr, "kcached: --max-blob-bytes over 5G with --s3-endpoint: "
                    "S3 takes at most 5 GiB in one PUT\n");
    return 2;
  }
  if (c->resp_on && resp_flags_check(c))
    return 2;
  if (kcd_host_is_loopback(c->host))
    return 0;
  if (!c->tokens) {
    fprintf(stderr,
            "kcached: refusing to listen on %s without --tokens: anyone who "
            "can reach it could write and delete. Listen on 127.0.0.1, or "
            "give a token file (kcached token ROLE NAME makes tokens).\n",
            c->host);
    return 2;
  }
  if (!c->tls_cert && !c->allow_plaintext) {
    fprintf(stderr,
            "kcached: refusing to send tokens in clear on %s: give "
            "--tls-cert/--tls-key, or --allow-plaintext behind a "
            "TLS-terminating proxy.\n",
            c->host);
    return 2;
  }
  return 0;
}
