/* build_key.c: building a key locally: the NVRTC builder (one file per kernel,
 * the bucket as -D defines) or the command builder (any program, whose
 * output directory becomes the bundle), and the "build" key field, the hash
 * of everything a builder reads. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "client_internal.h"
#include "kc_gpu.h"

/* Bumped when a builder's output for the same inputs changes. */
#define NVRTC_BUILDER_ID "kcache-nvrtc/1"
#define COMMAND_BUILDER_ID "kcache-command/1"

static json_t *strv_json(char *const *v, size_t n) {
  json_t *a = json_array();
  for (size_t i = 0; a && i < n; i++)
    json_array_append_new(a, json_string(v[i]));
  return a;
}

static kc_err kernel_json(const kc_kernel *k, json_t **out, char *err) {
  char d[KC_HEX_LEN + 1];
  kc_err e = kc_sha256_file(k->source, d, NULL, err);
  if (e)
    return e;
  *out = json_pack("{ss ss so so}", "name", k->name, "source", d, "entries",
                   strv_json(k->entries, k->n_entries), "options",
                   strv_json(k->options, k->n_options));
  return *out ? KC_OK : kc_errf(err, KC_NOMEM, "out of memory");
}

/* Argument words naming a file under the manifest's directory bring that
 * file's content in: editing the warmup script must change the key. */
static json_t *command_files(const kc_warmup *w) {
  json_t *o = json_object();
  for (size_t i = 0; o && i < w->n_command; i++) {
    char p[PATH_MAX], d[KC_HEX_LEN + 1];
    struct stat st;
    const char *a = w->command[i];
    if (strchr(a, '{'))
      continue;
    snprintf(p, sizeof p, "%s/%s", a[0] == '/' ? "" : w->base_dir, a);
    if (stat(p, &st) == 0 && S_ISREG(st.st_mode) &&
        kc_sha256_file(p, d, NULL, NULL) == KC_OK)
      json_object_set_new(o, a, json_string(d));
  }
  return o;
}

kc_err kcc_build_hash(const kc_warmup *w, char out[KC_HEX_LEN + 1], char *err) {
  json_t *root;
  kc_err e = KC_OK;
  if (w->n_command) {
    root = json_pack("{ss so so}", "builder", COMMAND_BUILDER_ID, "command",
                     strv_json(w->command, w->n_command), "files",
                     command_files(w));
  } else {
    json_t *ks = json_array();
    for (size_t i = 0; !e && ks && i < w->n_kernels; i++) {
      json_t *k = NULL;
      if (!(e = kernel_json(&w->kernels[i], &k, err)))
        json_array_append_new(ks, k);
    }
    root = json_pack("{ss so}", "builder", NVRTC_BUILDER_ID, "kernels",
                     ks ? ks : json_array());
  }
  char *s = !e && root ? json_dumps(root, JSON_SORT_KEYS | JSON_COMPACT) : NULL;
  json_decref(root);
  if (e)
    return e;
  if (!s)
    return kc_errf(err, KC_NOMEM, "out of memory");
  e = kc_sha256_hex(s, strlen(s), out);
  free(s);
  return e;
}

static void set_producer(kc_manifest *m, const char *builder, double secs) {
  char host[256] = "", when[32];
  time_t now = time(NULL);
  struct tm tm;
  gethostname(host, sizeof host - 1);
  gmtime_r(&now, &tm);
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  m->producer.builder = strdup(builder);
  m->producer.host = host[0] ? strdup(host) : NULL;
  m->producer.created = strdup(when);
  m->producer.seconds = secs;
}

static int timeout_of(const kc_warmup *w, double seconds) {
  int t = w->timeout_s > 0 ? w->timeout_s : 600;
  if (seconds > 0 && seconds < t)
    t = seconds < 1 ? 1 : (int)seconds;
  return t;
}

/* One kernel into the cache and the manifest. */
static kc_err build_kernel(kc_client *c, const kc_kernel *k,
                           const kc_key_fields *f, int timeout_s,
                           kc_manifest *m, char *err) {
  char *src = NULL, path[KC_PATH_MAX + 1], d[KC_HEX_LEN + 1];
  kc_gpu_build_out o = {0};
  kc_err e = kc_read_file(k->source, &src, NULL, err);
  if (e)
    return e;
  kc_gpu_build_req q = {.name = k->name,
                        .source = src,
                        .arch = f->arch,
                        .options = (const char *const *)k->options,
                        .n_options = k->n_options,
                        .bucket = &f->bucket,
                        .entries = (const char *const *)k->entries,
                        .n_entries = k->n_entries,
                        .timeout_s = timeout_s};
  e = kc_gpu_build(&q, &o, err);
  free(src);
  if (!e)
    e = kc_cache_blob_put(c, o.code, o.code_len, d, err);
  if (!e) {
    snprintf(path, sizeof path, "%s.%s", k->name, kc_file_kind_name(o.kind));
    e = kc_manifest_add_file(m, path, d, o.code_len, o.kind,
                             (const char *const *)k->entries, k->n_entries,
                             err);
  }
  kc_gpu_build_out_free(&o);
  return e;
}

/* The key names the NVRTC that built it: a version pinned in the manifest,
 * or one learnt without loading NVRTC (kc_gpu_nvrtc_version_cached: a file
 * name, a remembered answer, install metadata), must be the loaded one's. */
static int nvrtc_matches(const kc_key_fields *f, const char *ver) {
  for (size_t i = 0; i < f->n_tools; i++)
    if (!strcmp(f->tools[i].name, "nvrtc"))
      return !strcmp(f->tools[i].value, ver);
  return 0;
}

static kc_err build_nvrtc(kc_client *c, const kc_warmup *w,
                          const kc_key_fields *f, double seconds,
                          kc_manifest *m, char *err) {
  char ver[16] = "", builder[64];
  int64_t t0 = kc_clock_mono_ms();
  kc_err e = kc_gpu_nvrtc_version(ver, err);
  if (!e && !nvrtc_matches(f, ver))
    e = kc_errf(err, KC_BUILD_FAILED,
                "the key names another NVRTC than the %s this host loads "
                "(pinned in the manifest, or the toolkit's version metadata "
                "disagrees with its library): a build here would be stored "
                "under the wrong key",
                ver);
  for (size_t i = 0; !e && i < w->n_kernels; i++) {
    double left =
        seconds > 0 ? seconds - (kc_clock_mono_ms() - t0) / 1000.0 : 0;
    if (seconds > 0 && left <= 0)
      return kc_errf(err, KC_DEADLINE, "the deadline passed while building");
    e = build_kernel(c, &w->kernels[i], f, timeout_of(w, left), m, err);
  }
  snprintf(builder, sizeof builder, "nvrtc %s", ver);
  if (!e)
    set_producer(m, builder, (kc_clock_mono_ms() - t0) / 1000.0);
  return e;
}

/* ---- command builder ---- */

/* "{name}" -> the bucket's value, "{arch}", "{out}"; others left as are. */
static char *substitute(const char *a, const kc_key_fields *f,
                        const char *out) {
  char buf[8192];
  size_t n = 0;
  while (*a && n < sizeof buf - 1) {
    const char *end = *a == '{' ? strchr(a, '}') : NULL;
    char name[64] = "", val[PATH_MAX] = "";
    int hit = 0;
    if (end && end - a - 1 < (long)sizeof name) {
      memcpy(name, a + 1, (size_t)(end - a - 1));
      hit = 1;
      if (!strcmp(name, "arch"))
        snprintf(val, sizeof val, "%s", f->arch);
      else if (!strcmp(name, "out"))
        snprintf(val, sizeof val, "%s", out);
      else {
        hit = 0;
        for (size_t i = 0; i < f->bucket.n; i++)
          if (!strcmp(name, f->bucket.dims[i].name)) {
            snprintf(val, sizeof val, "%llu",
                     (unsigned long long)f->bucket.dims[i].value);
            hit = 1;
          }
      }
    }
    if (hit) {
      n += (size_t)snprintf(buf + n, sizeof buf - n, "%s", val);
      a = end + 1;
    } else {
      buf[n++] = *a++;
    }
    if (n >= sizeof buf)
      n = sizeof buf - 1;
  }
  buf[n] = '\0';
  return strdup(buf);
}

static void child(const kc_warmup *w, char **argv) {
  setpgid(0, 0); /* so a timeout kills the whole tree */
  if (w->base_dir && chdir(w->base_dir) != 0)
    _exit(126);
  dup2(2, 1); /* our stdout may carry a JSON report */
  execvp(argv[0], argv);
  _exit(127);
}

/* Waits for pid, killing its process group after timeout_s. */
static kc_err wait_child(pid_t pid, int timeout_s, char *err) {
  int64_t end = kc_clock_mono_ms() + (int64_t)timeout_s * 1000;
  int st = 0;
  for (;;) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid)
      break;
    if (r < 0 && errno != EINTR)
      return kc_errf(err, KC_INTERNAL, "waitpid: %s", strerror(errno));
    if (kc_clock_mono_ms() >= end) {
      kill(-pid, SIGKILL);
      waitpid(pid, &st, 0);
      return kc_errf(err, KC_TIMEOUT, "builder command killed after %d s",
                     timeout_s);
    }
    struct timespec ts = {0, 20 * 1000000L};
    nanosleep(&ts, NULL);
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
    return KC_OK;
  if (WIFEXITED(st))
    return kc_errf(err, KC_BUILD_FAILED, "builder command exited with %d%s",
                   WEXITSTATUS(st),
                   WEXITSTATUS(st) == 127 ? " (not found)" : "");
  return kc_errf(err, KC_BUILD_FAILED, "builder command killed by signal %d",
                 WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

static kc_err run_command(const kc_warmup *w, const kc_key_fields *f,
                          const char *out, int timeout_s, char *err) {
  char **argv = calloc(w->n_command + 1, sizeof *argv);
  kc_err e = argv ? KC_OK : kc_errf(err, KC_NOMEM, "out of memory");
  for (size_t i = 0; !e && i < w->n_command; i++)
    if (!(argv[i] = substitute(w->command[i], f, out)))
      e = kc_errf(err, KC_NOMEM, "out of memory");
  if (!e) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
      child(w, argv);
    e = pid < 0 ? kc_errf(err, KC_INTERNAL, "fork: %s", strerror(errno))
                : wait_child(pid, timeout_s, err);
  }
  for (size_t i = 0; argv && i < w->n_command; i++)
    free(argv[i]);
  free(argv);
  return e;
}

static kc_err build_command(kc_client *c, const kc_warmup *w,
                            const kc_key_fields *f, double seconds,
                            kc_manifest **out, char *err) {
  char dir[PATH_MAX];
  int64_t t0 = kc_clock_mono_ms();
  snprintf(dir, sizeof dir, "%s/tmp/build-XXXXXX", c->cache_dir);
  if (!mkdtemp(dir))
    return kc_errf(err, KC_IO, "mkdtemp %s: %s", dir, strerror(errno));
  kc_err e = run_command(w, f, dir, timeout_of(w, seconds), err);
  if (!e && (e = kc_bundle_from_dir(c, dir, NULL, f, out, err)) == KC_NOT_FOUND)
    e = kc_errf(err, KC_BUILD_FAILED, "builder command left no file in {out}");
  if (!e) {
    set_producer(*out, w->command[0], (kc_clock_mono_ms() - t0) / 1000.0);
    e = kc_manifest_seal(*out, err);
  }
  kcc_rmtree(dir);
  return e;
}

kc_err kcc_build_key(kc_client *c, const kc_warmup *w, const kc_key_fields *f,
                     double seconds, kc_manifest **out, char *err) {
  *out = NULL;
  if (w->n_command)
    return build_command(c, w, f, seconds, out, err);
  kc_manifest *m = kc_manifest_new();
  if (!m)
    return kc_errf(err, KC_NOMEM, "out of memory");
  m->fields = *f;
  kc_err e = build_nvrtc(c, w, f, seconds, m, err);
  if (!e)
    e = kc_manifest_seal(m, err);
  if (e) {
    kc_manifest_free(m);
    return e;
  }
  *out = m;
  return KC_OK;
}
