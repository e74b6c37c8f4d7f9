/* client.c: the client handle and the plain HTTP API calls (blobs, bundles,
 * lookup, leases, models, stats). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include <zstd.h>

#include "client_internal.h"

/* The default kcache.h documents for o->cache_dir NULL, and the one place
 * the library reads the environment (the CLI passes its --cache-dir or
 * KCACHE_DIR in o->cache_dir). */
static kc_err default_cache_dir(char **out, char *err) {
  const char *env = getenv("KCACHE_DIR");
  const char *home = getenv("HOME");
  char p[PATH_MAX];
  if (env && *env)
    snprintf(p, sizeof p, "%s", env);
  else if (home && *home)
    snprintf(p, sizeof p, "%s/.cache/kcache", home);
  else
    return kc_errf(err, KC_EINVAL,
                   "no cache directory: set KCACHE_DIR or HOME");
  *out = strdup(p);
  return *out ? KC_OK : kc_errf(err, KC_NOMEM, "out of memory");
}

/* 1 when directory p has no entry but . and .. */
static int dir_empty(const char *p) {
  DIR *d = opendir(p);
  struct dirent *de;
  int n = 0;
  if (!d)
    return 0;
  while ((de = readdir(d)))
    n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
  closedir(d);
  return n == 0;
}

/* The trust boundary of the local cache (docs/DESIGN.md, "Client warmup"): what
 * it holds is served as is, so only its owner may write it. A directory of
 * another user, or one group or others can write (a shared volume, a
 * shared /tmp), is refused; an empty one of ours (a fresh volume) is made
 * private first. */
static kc_err check_private(const char *p, int trust, char *err) {
  struct stat st;
  if (stat(p, &st) != 0)
    return kc_errf(err, KC_IO, "%s: %s", p, strerror(errno));
  if (!S_ISDIR(st.st_mode))
    return kc_errf(err, KC_IO, "%s: not a directory", p);
  if (trust || (st.st_uid == geteuid() && !(st.st_mode & 022)))
    return KC_OK;
  if (st.st_uid == geteuid() && dir_empty(p) && chmod(p, 0700) == 0 &&
      dir_empty(p)) /* nothing slipped in before the chmod */
    return KC_OK;
  if (st.st_uid != geteuid())
    return kc_errf(err, KC_FORBIDDEN,
                   "cache directory %s belongs to uid %ld, not to us: "
                   "whoever writes it decides what kcache serves; use a "
                   "directory of our own, or trust it (--trust-cache-dir, "
                   "KCACHE_TRUST_DIR=1)",
                   p, (long)st.st_uid);
  return kc_errf(err, KC_FORBIDDEN,
                 "cache directory %s is writable by %s (mode %03o): whoever "
                 "writes it decides what kcache serves; chmod 700 it, or "
                 "trust it (--trust-cache-dir, KCACHE_TRUST_DIR=1)",
                 p, st.st_mode & 002 ? "others" : "its group",
                 (unsigned)(st.st_mode & 0777));
}

/* The cache root and its subdirectories: made 0700 (parents above the root
 * 0755), and checked private. */
static kc_err make_dirs(kc_client *c, int trust, char *err) {
  static const char *const sub[] = {"", "/blobs", "/bundles", "/tmp"};
  char parent[PATH_MAX];
  snprintf(parent, sizeof parent, "%s", c->cache_dir);
  char *slash = strrchr(parent, '/');
  kc_err e = KC_OK;
  if (slash && slash != parent) {
    *slash = '\0';
    e = kcc_mkdirs(parent, err);
  }
  for (size_t i = 0; !e && i < 4; i++) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s%s", c->cache_dir, sub[i]);
    if (mkdir(p, 0700) != 0 && errno != EEXIST)
      e = kc_errf(err, KC_IO, "mkdir %s: %s", p, strerror(errno));
    else
      e = check_private(p, trust, err);
  }
  return e;
}

/* The process's umask, read without changing it: umask(2) can only read
 * by setting, and the umask is process-wide, so setting it even for an
 * instant gives a file another thread creates then the wrong mode. Linux
 * says it in /proc/self/status (4.7 on); elsewhere a file is made in tmp/
 * with mode 0777 and its mode read back. Cached blobs get 0444 less it. */
static int umask_from_proc(mode_t *out) {
  char line[256];
  FILE *f = fopen("/proc/self/status", "re");
  int found = 0;
  while (f && !found && fgets(line, sizeof line, f)) {
    unsigned v;
    found = sscanf(line, "Umask: %o", &v) == 1;
    if (found)
      *out = (mode_t)(v & 0777);
  }
  if (f)
    fclose(f);
  return found;
}

static kc_err read_umask(kc_client *c, char *err) {
  char p[PATH_MAX];
  struct stat st;
  if (umask_from_proc(&c->umask))
    return KC_OK;
  static unsigned long seq; /* threads may make clients at once */
  snprintf(p, sizeof p, "%s/tmp/umask-%ld-%lu", c->cache_dir, (long)getpid(),
           __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED));
  unlink(p); /* a leftover of a crashed process with this pid */
  int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0777);
  if (fd < 0)
    return kc_errf(err, KC_IO, "create %s: %s", p, strerror(errno));
  int ok = fstat(fd, &st) == 0;
  close(fd);
  unlink(p);
  if (!ok)
    return kc_errf(err, KC_IO, "stat %s: %s", p, strerror(errno));
  c->umask = ~st.st_mode & 0777;
  return KC_OK;
}

static kc_err set_headers(kc_client *c) {
  /* Blob PUTs are small; a 100-continue round trip would double latency. */
  struct curl_slist *l = curl_slist_append(NULL, "Expect:");
  if (l && c->token) {
    size_t n = strlen(c->token) + 32;
    char *h = malloc(n);
    if (!h) {
      curl_slist_free_all(l);
      return KC_NOMEM;
    }
    snprintf(h, n, "Authorization: Bearer %s", c->token);
    struct curl_slist *l2 = curl_slist_append(l, h);
    free(h);
    if (!l2) {
      curl_slist_free_all(l);
      return KC_NOMEM;
    }
    l = l2;
  }
  c->hdrs = l;
  return l ? KC_OK : KC_NOMEM;
}

static char *default_holder(void) {
  char host[256] = "host", buf[300];
  gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  snprintf(buf, sizeof buf, "%.200s:%ld", host, (long)getpid());
  return strdup(buf);
}

static kc_err copy_opts(kc_client *c, const kc_client_opts *o, char *err) {
  const char *url = o && o->url && *o->url ? o->url : NULL;
  c->url = kcc_strdup0(url);
  if (c->url) {
    size_t n = strlen(c->url);
    while (n > 0 && c->url[n - 1] == '/')
      c->url[--n] = '\0';
  }
  c->token = kcc_strdup0(o && o->token && *o->token ? o->token : NULL);
  c->cacert = kcc_strdup0(o && o->cacert && *o->cacert ? o->cacert : NULL);
  c->holder = o && o->holder ? strdup(o->holder) : default_holder();
  c->connect_timeout_ms =
      o && o->connect_timeout_ms ? o->connect_timeout_ms : 3000;
  c->timeout_ms = o && o->timeout_ms > 0 ? o->timeout_ms : 300000;
  long lb = o ? o->low_speed_bps : 0, ls = o ? o->low_speed_s : 0;
  c->low_speed_bps = lb < 0 || ls < 0 ? 0 : lb ? lb : 1024;
  c->low_speed_s = ls ? ls : 30;
  c->parallel = o && o->parallel > 0 ? o->parallel : 8;
  if ((url && !c->url) || !c->holder)
    return kc_errf(err, KC_NOMEM, "out of memory");
  if (o && o->cache_dir && *o->cache_dir)
    return (c->cache_dir = strdup(o->cache_dir))
               ? KC_OK
               : kc_errf(err, KC_NOMEM, "out of memory");
  return default_cache_dir(&c->cache_dir, err);
}

/* "http://127.0.0.1:8080/..." -> 1 when the host is loopback. */
static int loopback_url(const char *url) {
  static const char *const hosts[] = {"127.", "localhost", "[::1]"};
  const char *h = url + strlen("http://");
  for (size_t i = 0; i < 3; i++)
    if (!strncmp(h, hosts[i], strlen(hosts[i])))
      return 1;
  return 0;
}

static kc_err check_plaintext(const kc_client *c, const kc_client_opts *o,
                              char *err) {
  if (!c->url || !c->token || (o && o->allow_plaintext))
    return KC_OK;
  if (strncmp(c->url, "http://", 7) != 0 || loopback_url(c->url))
    return KC_OK;
  return kc_errf(err, KC_EINVAL,
                 "refusing to send a token in clear to %.200s: use https, or "
                 "allow plaintext (behind a TLS-terminating proxy only)",
                 c->url);
}

/* ---- for bindings ---- */

int kc_abi_version(void) { return KC_ABI_VERSION; }

size_t kc_abi_sizeof(const char *type) {
  static const struct {
    const char *name;
    size_t size;
  } types[] = {{"kc_dim", sizeof(kc_dim)},
               {"kc_tool", sizeof(kc_tool)},
               {"kc_bucket", sizeof(kc_bucket)},
               {"kc_key_fields", sizeof(kc_key_fields)},
               {"kc_client_opts", sizeof(kc_client_opts)},
               {"kc_warm_opts", sizeof(kc_warm_opts)},
               {"kc_warm_report", sizeof(kc_warm_report)}};
  for (size_t i = 0; type && i < sizeof types / sizeof types[0]; i++)
    if (!strcmp(type, types[i].name))
      return types[i].size;
  return 0;
}

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc = CURLE_FAILED_INIT;

static void global_init_once(void) {
  global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

kc_err kc_global_init(char *err) {
  pthread_once(&global_once, global_init_once);
  return global_rc == CURLE_OK
             ? KC_OK
             : kc_errf(err, KC_UNAVAILABLE, "curl_global_init: %s",
                       curl_easy_strerror(global_rc));
}

void kc_free(void *p) { free(p); }

kc_err kc_client_new(const kc_client_opts *o, kc_client **out, char *err) {
  *out = NULL;
  kc_client *c = calloc(1, sizeof *c);
  if (!c)
    return kc_errf(err, KC_NOMEM, "out of memory");
  kc_err e = copy_opts(c, o, err);
  if (!e)
    e = check_plaintext(c, o, err);
  if (!e)
    e = make_dirs(c, o && o->trust_cache_dir, err);
  if (!e)
    e = read_umask(c, err);
  if (!e && set_headers(c))
    e = kc_errf(err, KC_NOMEM, "out of memory");
  if (!e && (!(c->easy = curl_easy_init()) || !(c->multi = curl_multi_init())))
    e = kc_errf(err, KC_NOMEM, "curl: cannot make a handle");
  if (!e)
    curl_multi_setopt(c->multi, CURLMOPT_MAX_HOST_CONNECTIONS,
                      (long)c->parallel);
  if (e) {
    kc_client_free(c);
    return e;
  }
  *out = c;
  return KC_OK;
}

void kc_client_free(kc_client *c) {
  if (!c)
    return;
  kcc_demand_free(c); /* before the handle's fields go */
  if (c->easy)
    curl_easy_cleanup(c->easy);
  if (c->easy2)
    curl_easy_cleanup(c->easy2);
  if (c->multi)
    curl_multi_cleanup(c->multi);
  curl_slist_free_all(c->hdrs);
  free(c->url);
  free(c->token);
  free(c->cacert);
  free(c->cache_dir);
  free(c->holder);
  free(c);
}

const char *kc_client_cache_dir(const kc_client *c) { return c->cache_dir; }
int kc_client_has_server(const kc_client *c) { return c->url != NULL; }

void kc_client_set_deadline(kc_client *c, double seconds) {
  c->deadline_ms =
      seconds > 0 ? kc_clock_mono_ms() + (int64_t)(seconds * 1000) : 0;
  if (seconds > 0 && c->deadline_ms == 0)
    c->deadline_ms = 1; /* 0 would read as none */
}

/* ---- blobs ---- */

kc_err kc_client_blob_get(kc_client *c, const char *digest, void **data,
                          size_t *len, char *err) {
  char path[128], d[KC_HEX_LEN + 1];
  kcc_http_resp r;
  if (!kc_is_hex64(digest))
    return kc_errf(err, KC_BAD_DIGEST, "digest: must be 64 lowercase hex");
  snprintf(path, sizeof path, "/v1/blobs/%s", digest);
  c->answer_max = SIZE_MAX; /* a blob of any size the server keeps */
  kc_err e = kcc_http_do(c, "GET", path, NULL, 0, &r, err);
  c->answer_max = 0;
  if (e)
    return e;
  if (r.status != 200) {
    e = kcc_http_error(&r, path, err);
    kcc_http_resp_free(&r);
    return e;
  }
  kc_sha256_hex(r.body ? r.body : "", r.len, d);
  if (strcmp(d, digest) != 0) {
    kcc_http_resp_free(&r);
    return kc_errf(err, KC_DIGEST_MISMATCH,
                   "blob %s: the server sent bytes hashing to %s; discarded",
                   digest, d);
  }
  if (!r.body && !(r.body = calloc(1, 1)))
    return kc_errf(err, KC_NOMEM, "out of memory");
  *data = r.body;
  *len = r.len;
  return KC_OK;
}

/* The body compressed (level 3) when that saves an eighth: sent
 * with Content-Encoding: zstd, the server verifies the content's digest. */
static void *compress_body(const void *data, size_t len, size_t *zlen) {
  if (len < 64)
    return NULL;
  size_t cap = len - len / 8;
  void *z = malloc(cap);
  if (!z)
    return NULL;
  *zlen = ZSTD_compress(z, cap, data, len, 3);
  if (ZSTD_isError(*zlen)) { /* did not fit: not worth it */
    free(z);
    return NULL;
  }
  return z;
}

static kc_err put_once(kc_client *c, const char *path, const void *body,
                       size_t len, long *status, char *err) {
  kcc_http_resp r;
  kc_err e = kcc_http_do(c, "PUT", path, body ? body : "", len, &r, err);
  if (e)
    return e;
  *status = r.status;
  if (r.status != 200 && r.status != 201)
    e = kcc_http_error(&r, path, err);
  kcc_http_resp_free(&r);
  return e;
}

/* A frame, with its header; a server without zstd support hashes the
 * frame itself and answers 422 or 415: the content goes again, raw. */
static kc_err put_zstd(kc_client *c, const char *path, const void *z,
                       size_t zlen, long *status, char *err) {
  struct curl_slist *saved = c->hdrs;
  struct curl_slist *l = kcc_with_header(saved, "Content-Encoding: zstd");
  if (!l)
    return kc_errf(err, KC_NOMEM, "out of memory");
  c->hdrs = l; /* kcc_http_do sends c->hdrs */
  kc_err e = put_once(c, path, z, zlen, status, err);
  c->hdrs = saved;
  curl_slist_free_all(l);
  return e;
}

kc_err kc_client_blob_put(kc_client *c, const void *data, size_t len,
                          char digest_out[KC_HEX_LEN + 1], char *err) {
  char path[128], d[KC_HEX_LEN + 1];
  kc_sha256_hex(data, len, d);
  if (digest_out)
    memcpy(digest_out, d, sizeof d);
  snprintf(path, sizeof path, "/v1/blobs/%s", d);
  size_t zlen = 0;
  void *z = compress_body(data, len, &zlen);
  long status = 0;
  kc_err e = KC_EINVAL;
  if (z) {
    e = put_zstd(c, path, z, zlen, &status, err);
    free(z);
    if (e == KC_OK || (status != 422 && status != 415 && status != 400))
      return e;
  }
  return put_once(c, path, data, len, &status, err);
}

kc_err kc_client_blob_repair(kc_client *c, const void *data, size_t len,
                             char *err) {
  struct curl_slist *saved = c->hdrs;
  struct curl_slist *l = kcc_with_header(saved, "X-Kcache-Repair: 1");
  if (!l)
    return kc_errf(err, KC_NOMEM, "out of memory");
  c->hdrs = l; /* kcc_http_do sends c->hdrs */
  kc_err e = kc_client_blob_put(c, data, len, NULL, err);
  c->hdrs = saved;
  curl_slist_free_all(l);
  return e;
}

/* ---- bundles ---- */

/* A served manifest: parsed with every rule (paths included) and bound to
 * the key asked for, so a server cannot hand us another bundle. From its
 * text, or (parsed not NULL) from a lookup answer as parsed. */
static kc_err served_manifest(const char *key, const char *json, size_t len,
                              json_t *parsed, kc_manifest **out, char *err) {
  char e2[KC_ERRBUF_SIZE];
  kc_err e = parsed ? kc_manifest_parse_json(parsed, out, e2)
                    : kc_manifest_parse(json, len, out, e2);
  if (e)
    return kc_errf(err, e, "served bundle %.12s... refused: %s", key, e2);
  if (strcmp((*out)->key, key) != 0) {
    kc_manifest_free(*out);
    *out = NULL;
    return kc_errf(err, KC_KEY_MISMATCH,
                   "served bundle for %.12s... is another key's", key);
  }
  return KC_OK;
}

kc_err kc_client_bundle_get(kc_client *c, const char *key, kc_manifest **out,
                            char *err) {
  char path[128];
  kcc_http_resp r;
  *out = NULL;
  if (!kc_is_hex64(key))
    return kc_errf(err, KC_BAD_KEY, "key: must be 64 lowercase hex digits");
  snprintf(path, sizeof path, "/v1/bundles/%s", key);
  kc_err e = kcc_http_do(c, "GET", path, NULL, 0, &r, err);
  if (e)
    return e;
  if (r.status == 200)
    e = served_manifest(key, r.body ? r.body : "", r.len, NULL, out, err);
  else
    e = kcc_http_error(&r, path, err);
  kcc_http_resp_free(&r);
  return e;
}

kc_err kc_client_bundle_put(kc_client *c, const kc_manifest *m, char *err) {
  char path[128];
  char *json = NULL;
  kcc_http_resp r;
  kc_err e = kc_manifest_to_json(m, &json, err);
  if (e)
    return e;
  snprintf(path, sizeof path, "/v1/bundles/%s", m->key);
  e = kcc_http_do(c, "PUT", path, json, strlen(json), &r, err);
  free(json);
  if (e)
    return e;
  if (r.status != 200 && r.status != 201)
    e = kcc_http_error(&r, path, err);
  kcc_http_resp_free(&r);
  return e;
}

static char *lookup_body(const char *const *keys, size_t n) {
  json_t *arr = json_array();
  for (size_t i = 0; arr && i < n; i++)
    json_array_append_new(arr, json_string(keys[i]));
  json_t *root = json_pack("{so}", "keys", arr ? arr : json_array());
  char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
  json_decref(root);
  return s;
}

/* Validating the served manifests (schema, then the key recomputed from
 * the fields and compared) was most of a 1024-bundle lookup's time, on one
 * core of two: from 32 manifests on, a second thread takes half of them.
 * Both only read the parsed answer (jansson's reads, "o" unpacks, take no
 * reference). */
typedef struct served_job {
  json_t *found;
  const char *const *keys;
  kc_manifest **out;
  kc_err *refused;
} served_job;

static void served_run(void *arg, size_t from, size_t to) {
  served_job *p = arg;
  for (size_t i = from; i < to; i++) {
    json_t *m = json_object_get(p->found, p->keys[i]);
    if (!m)
      continue;
    /* Not an object (a number, a string): no manifest. */
    kc_err e = json_is_object(m)
                   ? served_manifest(p->keys[i], NULL, 0, m, &p->out[i], NULL)
                   : KC_BAD_MANIFEST;
    if (p->refused)
      p->refused[i] = e;
  }
}

/* From this many keys a lookup is split in two (lookup_split): below, the
 * answers are small and a second connection is not worth its set-up. */
#define KCC_LOOKUP_SPLIT 256

static void check_served(json_t *found, const char *const *keys, size_t n,
                         kc_manifest **out, kc_err *refused, int two) {
  served_job j = {found, keys, out, refused};
  kcc_halves(n, two && json_object_size(found) >= 32, served_run, &j);
}

/* The connection a lookup's requests go on: h, c->easy or c->easy2; two:
 * its checks may take a second thread (it is not one half of two). */
typedef struct lk_conn {
  kc_client *c;
  CURL *h;
  int two;
} lk_conn;

/* found[i] from the answer; a manifest that fails validation stays NULL:
 * the caller rebuilds rather than trusting it. refused[i] (when not NULL)
 * says why, so that a report can tell "the server lied" from "missing".
 * left[i] is set for the keys the answer left out for its size
 * ("truncated": held, to be asked for again); *n_left counts them. */
static kc_err lookup_parse(const kcc_http_resp *r, const char *const *keys,
                           size_t n, kc_manifest **found, kc_err *refused,
                           char *left, size_t *n_left, int two, char *err) {
  json_error_t je;
  /* Duplicate keys are refused, as in any manifest's text: a manifest is
   * taken from the answer as parsed (dumping each and parsing it
   * again cost a sixth of a 1024-bundle warm's time). */
  json_t *root =
      json_loadb(r->body ? r->body : "", r->len, JSON_REJECT_DUPLICATES, &je);
  json_t *f = json_object_get(root, "found");
  if (!root)
    return kc_errf(err, KC_PROTOCOL, "lookup: the answer is not JSON (%s)",
                   je.text);
  if (!json_is_object(f)) {
    json_decref(root);
    return kc_errf(err, KC_PROTOCOL, "lookup: no \"found\" object in answer");
  }
  check_served(f, keys, n, found, refused, two);
  /* The truncated keys as a set: one look-up per key asked for, not a
   * comparison with each (4096 x 4096 at the most). */
  json_t *t = json_object_get(root, "truncated"), *set = json_object();
  for (size_t j = 0; set && j < json_array_size(t); j++) {
    const char *k = json_string_value(json_array_get(t, j));
    if (k && json_object_set_new(set, k, json_true()))
      break;
  }
  for (size_t i = 0; set && i < n; i++)
    if (!left[i] && !found[i] && json_object_get(set, keys[i])) {
      left[i] = 1;
      (*n_left)++;
    }
  json_decref(set);
  json_decref(root);
  return set ? KC_OK : kc_errf(err, KC_NOMEM, "out of memory");
}

/* One POST /v1/lookup of keys (found, refused and left as lookup_parse). */
static kc_err lookup_once(const lk_conn *k, const char *const *keys, size_t n,
                          kc_manifest **found, kc_err *refused, char *left,
                          size_t *n_left, char *err) {
  kcc_http_resp r;
  char *body = lookup_body(keys, n);
  if (!body)
    return kc_errf(err, KC_NOMEM, "out of memory");
  kc_err e = kcc_http_do_on(k->c, k->h, "POST", "/v1/lookup", body,
                            strlen(body), &r, err);
  free(body);
  if (e)
    return e;
  if (r.status == 200)
    e = lookup_parse(&r, keys, n, found, refused, left, n_left, k->two, err);
  else
    e = kcc_http_error(&r, "/v1/lookup", err);
  kcc_http_resp_free(&r);
  return e;
}

/* Asks again for the keys an answer left out for its size (docs/DESIGN.md,
 * "HTTP API", POST /v1/lookup's "truncated"): one lookup of them; *n_left
 * becomes how many this answer left out in turn, *got how many it brought. */
static kc_err lookup_rest(const lk_conn *lk, const char *const *keys, size_t n,
                          kc_manifest **found, kc_err *refused, char *left,
                          size_t *n_left, size_t *got, char *err) {
  size_t cap = *n_left, m = 0, again = 0;
  const char **k = malloc(cap * sizeof *k);
  size_t *at = malloc(cap * sizeof *at);
  kc_manifest **f = calloc(cap, sizeof *f);
  kc_err *rf = calloc(cap, sizeof *rf);
  char *l = calloc(cap, 1);
  kc_err e = KC_OK;
  if (!k || !at || !f || !rf || !l)
    e = kc_errf(err, KC_NOMEM, "out of memory");
  for (size_t i = 0; !e && i < n; i++)
    if (left[i] && m < cap) {
      at[m] = i;
      k[m++] = keys[i];
    }
  if (!e)
    e = lookup_once(lk, k, m, f, rf, l, &again, err);
  *got = 0;
  for (size_t j = 0; !e && j < m; j++) {
    found[at[j]] = f[j];
    *got += f[j] != NULL;
    if (refused)
      refused[at[j]] = rf[j];
    left[at[j]] = l[j];
  }
  *n_left = e ? 0 : again;
  free(k);
  free(at);
  free(f);
  free(rf);
  free(l);
  return e;
}

/* The keys, and those an answer leaves out for its size, on one
 * connection. */
static kc_err lookup_keys(const lk_conn *k, const char *const *keys, size_t n,
                          kc_manifest **found, kc_err *refused, char *err) {
  char *left = calloc(n ? n : 1, 1);
  size_t n_left = 0, got = 1;
  if (!left)
    return kc_errf(err, KC_NOMEM, "out of memory");
  kc_err e = lookup_once(k, keys, n, found, refused, left, &n_left, err);
  /* An answer that brings none of them ends it: those count as missing. */
  while (!e && n_left && got)
    e = lookup_rest(k, keys, n, found, refused, left, &n_left, &got, err);
  free(left);
  return e;
}

/* One half of a split lookup, on its own thread and connection. */
typedef struct lookup_half {
  lk_conn k;
  const char *const *keys;
  size_t n;
  kc_manifest **found;
  kc_err *refused;
  kc_err e;
  char err[KC_ERRBUF_SIZE];
} lookup_half;

static void *half_main(void *arg) {
  lookup_half *p = arg;
  p->e = lookup_keys(&p->k, p->keys, p->n, p->found, p->refused, p->err);
  return NULL;
}

/* A lookup of many keys is two requests at once, the second half on a
 * second connection and thread, so that both answers are parsed and
 * checked at the same time: parsing the 1 MB answer for 1024 bundles was
 * 16 ms on one core of two, before the checks were split. The thread is
 * joined before this returns (builds fork later). */
static kc_err lookup_split(kc_client *c, const char *const *keys, size_t n,
                           kc_manifest **found, kc_err *refused, char *err) {
  size_t h = n / 2;
  lookup_half b = {{c, c->easy2, 0},
                   keys + h,
                   n - h,
                   found + h,
                   refused ? refused + h : NULL,
                   KC_OK,
                   ""};
  pthread_t th;
  int on = pthread_create(&th, NULL, half_main, &b) == 0;
  lk_conn a = {c, c->easy, !on};
  kc_err e = lookup_keys(&a, keys, on ? h : n, found, refused, err);
  if (!on)
    return e;
  pthread_join(th, NULL);
  if (!e && b.e) {
    e = b.e;
    if (err)
      memcpy(err, b.err, KC_ERRBUF_SIZE);
  }
  return e;
}

kc_err kcc_lookup_checked(kc_client *c, const char *const *keys, size_t n,
                          kc_manifest **found, kc_err *refused, char *err) {
  for (size_t i = 0; i < n; i++) {
    found[i] = NULL;
    if (refused)
      refused[i] = KC_OK;
  }
  if (n > KC_LOOKUP_MAX)
    return kc_errf(err, KC_EINVAL, "lookup: %zu keys, at most %d", n,
                   KC_LOOKUP_MAX);
  lk_conn k = {c, c->easy, 1};
  kc_err e =
      n >= KCC_LOOKUP_SPLIT && (c->easy2 || (c->easy2 = curl_easy_init()))
          ? lookup_split(c, keys, n, found, refused, err)
          : lookup_keys(&k, keys, n, found, refused, err);
  /* A failed lookup finds nothing: not the half that came, nor what a
   * request for "truncated" keys brought before the next one failed. */
  for (size_t i = 0; e && i < n; i++) {
    kc_manifest_free(found[i]);
    found[i] = NULL;
    if (refused)
      refused[i] = KC_OK;
  }
  return e;
}

kc_err kc_client_lookup(kc_client *c, const char *const *keys, size_t n,
                        kc_manifest **found, char *err) {
  return kcc_lookup_checked(c, keys, n, found, NULL, err);
}

/* ---- leases ---- */

static kc_err lease_granted(const kcc_http_resp *r, char *token, char *err) {
  json_t *root = json_loadb(r->body ? r->body : "", r->len, 0, NULL);
  const char *t = json_string_value(json_object_get(root, "lease"));
  kc_err e = KC_OK;
  if (!t || strlen(t) >= KC_LEASE_TOKEN_MAX)
    e = kc_errf(err, KC_PROTOCOL, "lease: no valid \"lease\" in answer");
  else
    snprintf(token, KC_LEASE_TOKEN_MAX, "%s", t);
  json_decref(root);
  return e;
}

/* A 409's holder and seconds left, when the answer says. */
static void lease_held(const kcc_http_resp *r, kcc_lease_info *info) {
  json_t *root = json_loadb(r->body ? r->body : "", r->len, 0, NULL);
  const char *h = json_string_value(json_object_get(root, "holder"));
  json_t *x = json_object_get(root, "expires_s");
  if (h)
    snprintf(info->holder, sizeof info->holder, "%s", h);
  if (json_is_integer(x) && json_integer_value(x) >= 0)
    info->expires_s = (double)json_integer_value(x);
  json_decref(root);
}

kc_err kcc_lease_take(kc_client *c, const char *key, int ttl_s,
                      kc_lease_state *state, char token[KC_LEASE_TOKEN_MAX],
                      kcc_lease_info *info, char *err) {
  char path[128];
  kcc_http_resp r;
  memset(info, 0, sizeof *info);
  info->expires_s = -1;
  if (!kc_is_hex64(key))
    return kc_errf(err, KC_BAD_KEY, "key: must be 64 lowercase hex digits");
  json_t *b = json_pack("{ss si}", "holder", c->holder, "ttl_s",
                        ttl_s > 0 ? ttl_s : 300);
  char *body = b ? json_dumps(b, JSON_COMPACT) : NULL;
  json_decref(b);
  if (!body)
    return kc_errf(err, KC_NOMEM, "out of memory");
  snprintf(path, sizeof path, "/v1/leases/%s", key);
  /* JSON said so: kcached refuses a lease POST a web form could send */
  struct curl_slist *saved = c->hdrs;
  struct curl_slist *l =
      kcc_with_header(saved, "Content-Type: application/json");
  if (!l) {
    free(body);
    return kc_errf(err, KC_NOMEM, "out of memory");
  }
  c->hdrs = l; /* kcc_http_do sends c->hdrs */
  kc_err e = kcc_http_do(c, "POST", path, body, strlen(body), &r, err);
  c->hdrs = saved;
  curl_slist_free_all(l);
  free(body);
  if (e)
    return e;
  info->retry_after_s = r.retry_after_s > 0 ? r.retry_after_s : 1;
  if (r.status == 201) {
    *state = KC_LEASE_GRANTED;
    e = lease_granted(&r, token, err);
  } else if (r.status == 200) {
    *state = KC_LEASE_PRESENT;
  } else if (r.status == 409) {
    *state = KC_LEASE_HELD;
    lease_held(&r, info);
  } else {
    e = kcc_http_error(&r, path, err);
  }
  kcc_http_resp_free(&r);
  return e;
}

kc_err kc_client_lease_take(kc_client *c, const char *key, int ttl_s,
                            kc_lease_state *state,
                            char token[KC_LEASE_TOKEN_MAX], int *retry_after_s,
                            char *err) {
  kcc_lease_info info;
  kc_err e = kcc_lease_take(c, key, ttl_s, state, token, &info, err);
  if (!e && retry_after_s)
    *retry_after_s = info.retry_after_s;
  return e;
}

kc_err kc_client_lease_release(kc_client *c, const char *key, const char *token,
                               char *err) {
  char path[512];
  kcc_http_resp r;
  char *esc = curl_easy_escape(c->easy, token, 0);
  if (!esc)
    return kc_errf(err, KC_NOMEM, "out of memory");
  snprintf(path, sizeof path, "/v1/leases/%s?lease=%s", key, esc);
  curl_free(esc);
  kc_err e = kcc_http_do(c, "DELETE", path, NULL, 0, &r, err);
  if (e)
    return e;
  if (r.status != 204 && r.status != 200)
    e = kcc_http_error(&r, "DELETE lease", err);
  kcc_http_resp_free(&r);
  return e;
}

/* ---- models, stats ---- */

static kc_err get_json(kc_client *c, const char *path, char **json, char *err) {
  kcc_http_resp r;
  *json = NULL;
  kc_err e = kcc_http_do(c, "GET", path, NULL, 0, &r, err);
  if (e)
    return e;
  if (r.status != 200) {
    e = kcc_http_error(&r, path, err);
    kcc_http_resp_free(&r);
    return e;
  }
  *json = r.body ? r.body : strdup("");
  return *json ? KC_OK : kc_errf(err, KC_NOMEM, "out of memory");
}

kc_err kc_client_model_list(kc_client *c, const char *model, char **json,
                            char *err) {
  char path[128];
  if (!kc_is_hex64(model))
    return kc_errf(err, KC_EINVAL, "model: must be 64 lowercase hex digits");
  snprintf(path, sizeof path, "/v1/models/%s", model);
  return get_json(c, path, json, err);
}

kc_err kc_client_stats(kc_client *c, char **json, char *err) {
  return get_json(c, "/v1/stats", json, err);
}
