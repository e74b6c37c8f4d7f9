/* cli_warm.c: `kcache warm` (fetch-or-build a warmup manifest) and
 * `kcache verify` (load every cubin of a model on this host's GPU). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "kc_gpu.h"

static const char warm_usage[] =
    "usage: kcache warm MANIFEST [--arch A,B] [--no-build] [--no-upload]\n"
    "                  [--deadline S] [--out DIR] [--json] [--strict]\n"
    "                  [--quiet] [--jobs N] [--lease-wait S|never]\n"
    "                  [--device-arch A] [--no-compat] [--prefer-build]\n";

static const char warm_help[] =
    "\n"
    "Fetch or build every (bucket, arch) of a warmup manifest: local cache\n"
    "first, then kcached, then a build (one builder per key fleet-wide).\n"
    "\n"
    "  --arch A,B       targets (default: the manifest's, else this GPU's)\n"
    "  --no-build       fetch only; keys nobody has are reported failed\n"
    "  --no-upload      build locally but do not store on the server\n"
    "  --deadline S     give up after S seconds (the service starts anyway)\n"
    "  --out DIR        write each bundle to DIR/<arch>/<dim>=<v>,.../\n"
    "  --json           JSON report on stdout\n"
    "  --strict         exit 1 unless every bundle is ready and kcached\n"
    "                   took the token (a 401 or 403 fails; CI uses this)\n"
    "  --quiet          no per-key lines, no progress bar\n"
    "  --jobs N         keys built at once (default: CPUs, at most 8)\n"
    "  --lease-wait S   with --deadline: wait S seconds on another builder's\n"
    "                   lease, then build here (default: half of what is\n"
    "                   left; never: wait to the deadline)\n"
    "  --device-arch A  the GPU the bundles are for (sm_89 or 8.9; default:\n"
    "                   GPU 0 if detected) (KCACHE_DEVICE_ARCH)\n"
    "  --no-compat      no fallback to a bundle of another arch that runs on\n"
    "                   that GPU (hit-compat) when a key is missing\n"
    "  --prefer-build   build a missing key where a builder is; a compatible\n"
    "                   bundle only if the build is not ready in time\n"
    "\noptions for every command:\n";

static const char warm_tail[] =
    "\n"
    "exit status: 0 done (with --strict: every bundle ready, the token\n"
    "taken); 1 warmup incomplete or a token refused with --strict, or the\n"
    "manifest is invalid; 2 usage. Without --strict, kcached down or no\n"
    "NVRTC to compute keys with is a warning and exit 0.\n";

typedef struct warm_args {
  kcli_common g;
  kc_warm_opts o;
  char *archs_buf;
  const char *archs[64];
  int json, strict, quiet;
  const char *manifest;
} warm_args;

static int split_archs(warm_args *a, const char *s) {
  free(a->archs_buf);
  if (!(a->archs_buf = strdup(s)))
    return -1;
  a->o.n_archs = 0;
  for (char *save = NULL, *t = strtok_r(a->archs_buf, ",", &save); t;
       t = strtok_r(NULL, ",", &save)) {
    if (a->o.n_archs == 64 || !kc_arch_valid(t))
      return -1;
    a->archs[a->o.n_archs++] = t;
  }
  a->o.archs = a->archs;
  return a->o.n_archs ? 0 : -1;
}

static int parse_deadline(const char *s, double *out) {
  char *end;
  double d = strtod(s, &end);
  if (*end || !(d > 0) || d > 1e7)
    return -1;
  *out = d;
  return 0;
}

/* "never" (-1), or seconds > 0. */
static int parse_lease_wait(const char *s, double *out) {
  if (!strcmp(s, "never")) {
    *out = -1;
    return 0;
  }
  return parse_deadline(s, out);
}

/* sm_89 or 8.9; "" (an empty variable): detect. */
static int parse_device(const char *s, const char **out) {
  int ma, mi;
  if (!*s) {
    *out = NULL;
    return 0;
  }
  if (kc_gpu_cc_parse(s, &ma, &mi) != 0)
    return -1;
  *out = s;
  return 0;
}

static int warm_opt(void *arg_, int opt, const char *arg) {
  warm_args *a = arg_;
  switch (opt) {
  case 'a':
    return split_archs(a, arg);
  case 'n':
    a->o.no_build = 1;
    return 0;
  case 'u':
    a->o.no_upload = 1;
    return 0;
  case 'd':
    return parse_deadline(arg, &a->o.deadline_s);
  case 'o':
    a->o.out_dir = arg;
    return 0;
  case 'j':
    a->json = 1;
    return 0;
  case 's':
    a->strict = 1;
    return 0;
  case 'q':
    a->quiet = 1;
    return 0;
  case 'L':
    return parse_lease_wait(arg, &a->o.lease_wait_s);
  case 'D':
    return parse_device(arg, &a->o.device_arch);
  case 'C':
    a->o.no_compat = 1;
    return 0;
  case 'P':
    a->o.prefer_build = 1;
    return 0;
  case 'J': {
    char *end;
    long n = strtol(arg, &end, 10);
    if (*end || n < 1 || n > 64)
      return -1;
    a->o.build_jobs = (int)n;
    return 0;
  }
  default:
    return kcli_common_opt(&a->g, opt, arg) == 1 ? 0 : -1;
  }
}

/* 0 go on, else the exit code (help is 0 through -1). */
static int warm_parse(warm_args *a, int argc, char **argv) {
  static const struct option own[] = {
      {"arch", required_argument, NULL, 'a'},
      {"no-build", no_argument, NULL, 'n'},
      {"no-upload", no_argument, NULL, 'u'},
      {"deadline", required_argument, NULL, 'd'},
      {"out", required_argument, NULL, 'o'},
      {"json", no_argument, NULL, 'j'},
      {"strict", no_argument, NULL, 's'},
      {"quiet", no_argument, NULL, 'q'},
      {"jobs", required_argument, NULL, 'J'},
      {"lease-wait", required_argument, NULL, 'L'},
      {"device-arch", required_argument, NULL, 'D'},
      {"no-compat", no_argument, NULL, 'C'},
      {"prefer-build", no_argument, NULL, 'P'},
      {NULL, 0, NULL, 0}};
  int rc = kcli_parse("warm", warm_usage, warm_help, warm_tail, own, warm_opt,
                      a, argc, argv);
  if (rc)
    return rc;
  if (argc - optind != 1)
    return kcli_usage("warm", warm_usage);
  a->manifest = argv[optind];
  return 0;
}

static void on_progress(const kc_warm_progress *p, void *arg) {
  (void)arg;
  int width = 30, fill = (int)(p->done * (size_t)width / p->total);
  fprintf(stderr, "\r[%.*s%*s] %zu/%zu %-10s", fill,
          "##############################", width - fill, "", p->done, p->total,
          kc_warm_status_name(p->item->status));
  if (p->done == p->total)
    fputc('\n', stderr);
}

static int warm_output(const warm_args *a, const kc_warm_report *r) {
  char err[KC_ERRBUF_SIZE];
  if (a->json) {
    char *s = NULL;
    if (kc_warm_report_json(r, &s, err) != KC_OK)
      return kcli_fail("warm", KCLI_EXIT_FAIL, "%s", err);
    puts(s);
    free(s);
  }
  if (!a->quiet || r->counts[KC_WARM_FAILED])
    kc_warm_report_print(r, a->json ? stderr : stdout);
  if (r->warning[0])
    fprintf(stderr, "kcache warm: warning: %s\n", r->warning);
  return 0;
}

/* Tells the server what this model wants warm (its page's coverage), when
 * the token can write: a read token's 403 (and an older kcached's 404) are
 * expected and skipped without a word. Sent after the warm (so that a
 * stalled server costs the warm nothing more), within its deadline. What
 * went wrong goes to note, printed after the warm's own report: the
 * manifest is a side matter, never the first line an operator reads. */
static void upload_warmup(kc_client *c, const warm_args *a, const kc_warmup *w,
                          char note[KC_ERRBUF_SIZE]) {
  char err[KC_ERRBUF_SIZE], *json = NULL;
  size_t len = 0;
  if (!kc_client_has_server(c) || a->o.no_upload ||
      kc_read_file(a->manifest, &json, &len, err))
    return;
  kc_err e = kc_client_warmup_put_archs(c, w->model_hash, json, len, a->o.archs,
                                        a->o.n_archs, err);
  free(json);
  if (e == KC_UNAVAILABLE || e == KC_TIMEOUT || e == KC_NOT_READY)
    snprintf(note, KC_ERRBUF_SIZE, "kcached unreachable (%.400s)", err);
  else if (e && e != KC_FORBIDDEN && e != KC_UNAUTHORIZED &&
           e != KC_NOT_FOUND && e != KC_METHOD)
    snprintf(note, KC_ERRBUF_SIZE,
             "the warmup manifest was not stored on the server: %.400s", err);
}

static double mono_s(void) { return (double)kc_clock_mono_us() / 1e6; }

/* Seconds of --deadline left since t0; a passed one is a millisecond (a
 * bound that only lets a request fail at once, never "none"). */
static double deadline_left(const warm_args *a, double t0) {
  double left = a->o.deadline_s - (mono_s() - t0);
  return left > 0.001 ? left : 0.001;
}

/* The exit status of a warm that ran. Without --strict every outcome is 0
 * (a service starts even when kcached is down or NVRTC is missing: the
 * reason is a warning); with it, a bundle not ready or a token kcached
 * refused (401, 403) is 1, with one line saying why. */
static int warm_status(const warm_args *a, const kc_warm_report *rep, kc_err e,
                       const char *err) {
  if (e && rep->n_items == 0) { /* nothing computed: the manifest or setup */
    if (e != KC_NO_NVRTC || a->strict)
      return kcli_fail("warm", KCLI_EXIT_FAIL, "%s", err);
    fprintf(stderr, "kcache warm: warning: %s (not --strict: exit 0)\n", err);
    return KCLI_EXIT_OK;
  }
  if (a->strict && rep->refused)
    return kcli_fail("warm", KCLI_EXIT_FAIL,
                     "kcached refused the token (%s): nothing was uploaded "
                     "with it; check KCACHE_TOKEN and its role",
                     rep->refused_why);
  if (e && !a->strict)
    fprintf(stderr, "kcache warm: %s (not --strict: exit 0)\n", err);
  return e && a->strict ? KCLI_EXIT_FAIL : KCLI_EXIT_OK;
}

static int warm_run(warm_args *a, kc_client *c, const kc_warmup *w,
                    kc_warm_report *rep) {
  char err[KC_ERRBUF_SIZE] = "", note[KC_ERRBUF_SIZE] = "";
  double t0 = mono_s();
  kc_err e = kc_warm(c, w, &a->o, rep, err);
  /* The warm's other requests, after it, within what is left of its
   * deadline: none of them may hold the service's start past it. */
  if (a->o.deadline_s > 0)
    kc_client_set_deadline(c, deadline_left(a, t0));
  if (!rep->server_down) /* a server that stalled is not asked again */
    upload_warmup(c, a, w, note);
  if (a->o.deadline_s > 0) /* the misses it noted: now, or dropped */
    kc_demand_flush(c, (long)(deadline_left(a, t0) * 1000) + 1, NULL);
  if (rep->n_items && warm_output(a, rep))
    return KCLI_EXIT_FAIL;
  if (note[0] && !a->quiet)
    fprintf(stderr, "kcache warm: warning: %s\n", note);
  return warm_status(a, rep, e, err);
}

int kcli_cmd_warm(int argc, char **argv) {
  warm_args a = {0};
  char err[KC_ERRBUF_SIZE] = "";
  kc_warmup *w = NULL;
  kc_warm_report rep = {0};
  int rc = kcli_common_init(&a.g, "warm");
  const char *dev = getenv("KCACHE_DEVICE_ARCH"); /* the flag wins */
  if (!rc && dev && parse_device(dev, &a.o.device_arch) != 0)
    rc = kcli_fail("warm", KCLI_EXIT_USAGE,
                   "KCACHE_DEVICE_ARCH: invalid value '%s'", dev);
  if (!rc)
    rc = warm_parse(&a, argc, argv);
  if (rc) {
    free(a.archs_buf);
    return rc < 0 ? KCLI_EXIT_OK : rc;
  }
  if (!a.quiet && isatty(2))
    a.o.progress = on_progress;
  kc_client *c = NULL;
  kc_err e = kc_warmup_load(a.manifest, &w, err);
  if (e)
    /* kc_warmup_load's message names the file already */
    rc = kcli_fail("warm", KCLI_EXIT_FAIL, "%s", err);
  else if (!(c = kcli_client(&a.g)))
    rc = KCLI_EXIT_FAIL;
  else
    rc = warm_run(&a, c, w, &rep);
  kc_warm_report_free(&rep);
  kc_client_free(c);
  kc_warmup_free(w);
  free(a.archs_buf);
  return rc;
}

/* ---- verify ---- */

static const char verify_usage[] =
    "usage: kcache verify MANIFEST [--device N] [--arch A]\n";
static const char verify_help[] =
    "\n"
    "On a GPU host: for every bundle of the warmup manifest (archs: --arch,\n"
    "else the manifest's, else the device's) whose arch runs on device N\n"
    "(default 0), take it from the local cache or the server and load each\n"
    "cubin and PTX file with cuModuleLoadData, resolving its entries.\n"
    "Without a GPU: a clean error, exit 1.\n\noptions:\n";

static int verify_bundle(kc_client *c, const kc_manifest *m, int dev,
                         size_t *n_ok) {
  char err[KC_ERRBUF_SIZE];
  int bad = 0;
  for (size_t i = 0; i < m->n_files; i++) {
    const kc_file *f = &m->files[i];
    void *data = NULL;
    size_t len = 0;
    if (f->kind != KC_KIND_CUBIN && f->kind != KC_KIND_PTX)
      continue;
    kc_err e = kc_bundle_file_bytes(c, m, f->path, &data, &len, err);
    if (!e)
      e = kc_gpu_load_check(dev, data, len, (const char *const *)f->entries,
                            f->n_entries, err);
    free(data);
    printf("%-4s %s %s/%s%s%s\n", e ? "FAIL" : "ok", m->fields.arch, m->key,
           f->path, e ? ": " : "", e ? err : "");
    bad |= e != KC_OK;
    *n_ok += e == KC_OK;
  }
  return bad;
}

static int verify_run(kc_client *c, const kc_warmup *w, int dev,
                      const kc_gpu_device *d, const char *arch_opt) {
  char err[KC_ERRBUF_SIZE], key[KC_HEX_LEN + 1];
  kc_key_fields *f = NULL;
  size_t n = 0, n_ok = 0, n_bundles = 0;
  const char *arch = arch_opt ? arch_opt : d->arch;
  int own = arch_opt || !w->n_archs; /* else the manifest's archs */
  if (kc_warm_keys(w, own ? &arch : NULL, own ? 1 : 0, &f, &n, err) != KC_OK)
    return kcli_fail("verify", KCLI_EXIT_FAIL, "%s", err);
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    kc_manifest *m = NULL;
    if (!kc_gpu_arch_runs_on(f[i].arch, d->cc_major, d->cc_minor))
      continue;
    kc_key_compute(&f[i], key, NULL);
    if (kc_client_pull(c, key, &m, err) != KC_OK) {
      printf("FAIL %s %s: %s\n", f[i].arch, key, err);
      bad = 1;
      continue;
    }
    n_bundles++;
    bad |= verify_bundle(c, m, dev, &n_ok);
    kc_manifest_free(m);
  }
  free(f);
  printf("%zu files of %zu bundles loaded on %s (%s)\n", n_ok, n_bundles,
         d->name, d->arch);
  if (!n_bundles)
    return kcli_fail("verify", KCLI_EXIT_FAIL,
                     "no bundle of this manifest runs on %s", d->arch);
  return bad ? KCLI_EXIT_FAIL : KCLI_EXIT_OK;
}

typedef struct verify_args {
  kcli_common g;
  int dev;
  const char *arch;
} verify_args;

static int verify_opt(void *arg, int opt, const char *val) {
  verify_args *a = arg;
  char *end;
  switch (opt) {
  case 'd': {
    long n = strtol(val, &end, 10);
    if (*end || n < 0 || n > 1024)
      return -1;
    a->dev = (int)n;
    return 0;
  }
  case 'a':
    a->arch = val;
    return kc_arch_valid(val) ? 0 : -1;
  default:
    return kcli_common_opt(&a->g, opt, val) == 1 ? 0 : -1;
  }
}

/* 0 go on (argv[optind] is the manifest), -1 --help, else the exit code. */
static int verify_parse(verify_args *a, int argc, char **argv) {
  static const struct option own[] = {{"device", required_argument, NULL, 'd'},
                                      {"arch", required_argument, NULL, 'a'},
                                      {NULL, 0, NULL, 0}};
  int rc = kcli_common_init(&a->g, "verify");
  if (!rc)
    rc = kcli_parse("verify", verify_usage, verify_help, NULL, own, verify_opt,
                    a, argc, argv);
  if (!rc && argc - optind != 1)
    rc = kcli_usage("verify", verify_usage);
  return rc;
}

int kcli_cmd_verify(int argc, char **argv) {
  verify_args a = {0};
  char err[KC_ERRBUF_SIZE];
  int rc = verify_parse(&a, argc, argv);
  if (rc)
    return rc < 0 ? KCLI_EXIT_OK : rc;
  int dev = a.dev;
  kc_gpu_info gi;
  if (kc_gpu_detect(&gi, err) != KC_OK)
    return kcli_fail("verify", KCLI_EXIT_FAIL, "%s", err);
  if (dev >= gi.n_devices)
    return kcli_fail("verify", KCLI_EXIT_FAIL, "no device %d (%d found)", dev,
                     gi.n_devices);
  kc_warmup *w = NULL;
  /* kc_warmup_load's message names the file already */
  if (kc_warmup_load(argv[optind], &w, err) != KC_OK)
    return kcli_fail("verify", KCLI_EXIT_FAIL, "%s", err);
  kc_client *c = kcli_client(&a.g);
  rc = c ? verify_run(c, w, dev, &gi.devices[dev], a.arch) : KCLI_EXIT_FAIL;
  kc_client_free(c);
  kc_warmup_free(w);
  return rc;
}
