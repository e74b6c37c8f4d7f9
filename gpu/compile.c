/* compile.c: one NVRTC compile in the calling process: the options (target,
 * bucket defines, the user's), the log, the cubin or PTX, the entry check.
 * kc_gpu_build runs it inside a forked child (build.c). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.h"

/* Bucket dimension names become macro names: [a-z][a-z0-9_]* upper-cased. */
static int define_name_ok(const char *s) {
  if (!(*s >= 'a' && *s <= 'z'))
    return 0;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_'))
      return 0;
  return 1;
}

static kc_err check_strings(const char *const *v, size_t n, const char *what,
                            char *err) {
  if (n > 0 && !v)
    return kc_errf(err, KC_EINVAL, "%s: NULL array with %zu items", what, n);
  for (size_t i = 0; i < n; i++)
    if (!v[i] || !v[i][0])
      return kc_errf(err, KC_EINVAL, "%s[%zu]: empty", what, i);
  return KC_OK;
}

kc_err kcg_build_req_check(const kc_gpu_build_req *req, char *err) {
  if (!req || !req->source)
    return kc_errf(err, KC_EINVAL, "build request without source");
  if (!kc_arch_valid(req->arch))
    return kc_errf(err, KC_EINVAL, "arch '%s' is not (sm|compute)_XY[af]",
                   req->arch ? req->arch : "(null)");
  if (req->timeout_s < 0)
    return kc_errf(err, KC_EINVAL, "timeout_s %d is negative", req->timeout_s);
  const kc_bucket *b = req->bucket;
  if (b && b->n > KC_MAX_DIMS)
    return kc_errf(err, KC_EINVAL, "bucket: %zu dimensions (max %d)", b->n,
                   KC_MAX_DIMS);
  for (size_t i = 0; b && i < b->n; i++)
    if (!define_name_ok(b->dims[i].name))
      return kc_errf(err, KC_EINVAL, "bucket.%s: not a [a-z][a-z0-9_]* name",
                     b->dims[i].name);
  kc_err rc = check_strings(req->options, req->n_options, "options", err);
  return rc ? rc : check_strings(req->entries, req->n_entries, "entries", err);
}

/* ---- Options ---- */

typedef struct opt_list {
  const char **argv; /* what NVRTC gets */
  char **own;        /* the strings made here (target, defines) */
  size_t n, n_own;
} opt_list;

static char *define_for(const kc_dim *d) {
  char buf[KC_NAME_MAX + 32] = "-D";
  size_t i = 0;
  for (; d->name[i] && i < KC_NAME_MAX; i++)
    buf[2 + i] =
        (char)(d->name[i] -
               ('a' <= d->name[i] && d->name[i] <= 'z' ? 'a' - 'A' : 0));
  snprintf(buf + 2 + i, sizeof buf - 2 - i, "=%" PRIu64, d->value);
  return strdup(buf);
}

static void opts_free(opt_list *o) {
  for (size_t i = 0; o->own && i < o->n_own; i++)
    free(o->own[i]);
  free(o->own);
  free(o->argv);
}

static kc_err opts_make(const kc_gpu_build_req *req, opt_list *o, char *err) {
  size_t n_dims = req->bucket ? req->bucket->n : 0;
  o->own = calloc(1 + n_dims, sizeof *o->own);
  o->argv = calloc(1 + n_dims + req->n_options, sizeof *o->argv);
  if (!o->own || !o->argv)
    return kc_errf(err, KC_NOMEM, "out of memory (NVRTC options)");
  char target[64];
  snprintf(target, sizeof target, "--gpu-architecture=%s", req->arch);
  o->own[o->n_own++] = strdup(target);
  for (size_t i = 0; i < n_dims; i++)
    o->own[o->n_own++] = define_for(&req->bucket->dims[i]);
  for (size_t i = 0; i < o->n_own; i++)
    if (!(o->argv[o->n++] = o->own[i]))
      return kc_errf(err, KC_NOMEM, "out of memory (NVRTC options)");
  for (size_t i = 0; i < req->n_options; i++)
    o->argv[o->n++] = req->options[i];
  return KC_OK;
}

/* ---- NVRTC calls ---- */

static kc_err nv_fail(const kcg_nvrtc *api, const char *call, nvrtcResult r,
                      char *err) {
  return kc_errf(err, KC_BUILD_FAILED, "%s: %s", call, api->GetErrorString(r));
}

static kc_err get_log(const kcg_nvrtc *api, nvrtcProgram prog, char **log,
                      char *err) {
  size_t size = 0;
  nvrtcResult r = api->GetProgramLogSize(prog, &size);
  if (r != KCG_NVRTC_SUCCESS)
    return nv_fail(api, "nvrtcGetProgramLogSize", r, err);
  if (!(*log = calloc(size + 1, 1)))
    return kc_errf(err, KC_NOMEM, "out of memory (NVRTC log, %zu bytes)", size);
  if (size && (r = api->GetProgramLog(prog, *log)) != KCG_NVRTC_SUCCESS)
    return nv_fail(api, "nvrtcGetProgramLog", r, err);
  return KC_OK;
}

/* PTX comes NUL-terminated; code_len leaves the NUL out (the stored file is
 * plain text) but the buffer keeps it, so the PTX can go to the driver. */
static kc_err get_code(const kcg_nvrtc *api, nvrtcProgram prog,
                       kc_gpu_build_out *out, char *err) {
  int ptx = out->kind == KC_KIND_PTX;
  size_t size = 0;
  nvrtcResult r =
      ptx ? api->GetPTXSize(prog, &size) : api->GetCUBINSize(prog, &size);
  if (r != KCG_NVRTC_SUCCESS)
    return nv_fail(api, ptx ? "nvrtcGetPTXSize" : "nvrtcGetCUBINSize", r, err);
  if (!(out->code = calloc(size + 1, 1)))
    return kc_errf(err, KC_NOMEM, "out of memory (%zu bytes of code)", size);
  r = ptx ? api->GetPTX(prog, out->code) : api->GetCUBIN(prog, out->code);
  if (r != KCG_NVRTC_SUCCESS)
    return nv_fail(api, ptx ? "nvrtcGetPTX" : "nvrtcGetCUBIN", r, err);
  out->code_len = ptx ? strlen(out->code) : size;
  return KC_OK;
}

/* The line worth showing: the first one that says "error", else the first
 * (NVRTC may print warnings before the error). */
static void log_headline(const char *log, char *buf, size_t size) {
  const char *line = strstr(log, "error");
  if (line)
    while (line > log && line[-1] != '\n')
      line--;
  else
    line = log;
  size_t n = strcspn(line, "\n");
  snprintf(buf, size, "%.*s", (int)(n < size ? n : size - 1), line);
}

static kc_err compile_failed(const kcg_nvrtc *api, const kc_gpu_build_req *req,
                             nvrtcResult r, const char *log, char *err) {
  char line[KC_ERRBUF_SIZE];
  log_headline(log, line, sizeof line);
  const char *name = req->name ? req->name : "kernel.cu";
  if (r == KCG_NVRTC_ERROR_COMPILATION && line[0]) /* "name(4): error: ..." */
    return kc_errf(err, KC_BUILD_FAILED, "%s", line);
  if (r == KCG_NVRTC_ERROR_COMPILATION)
    return kc_errf(err, KC_BUILD_FAILED, "%s: compilation failed (empty log)",
                   name);
  return kc_errf(err, KC_BUILD_FAILED, "%s: nvrtcCompileProgram: %s%s%s", name,
                 api->GetErrorString(r), line[0] ? ": " : "", line);
}

static kc_err check_entries(const kc_gpu_build_req *req,
                            const kc_gpu_build_out *out, char *err) {
  for (size_t i = 0; i < req->n_entries; i++)
    if (!kcg_code_has_entry(out->kind, out->code, out->code_len,
                            req->entries[i]))
      return kc_errf(err, KC_BUILD_FAILED,
                     "%s: entry '%s' is not in the %s for %s (entries are "
                     "extern \"C\" kernel names)",
                     req->name ? req->name : "kernel.cu", req->entries[i],
                     kc_file_kind_name(out->kind), req->arch);
  return KC_OK;
}

static kc_err run_program(const kcg_nvrtc *api, const kc_gpu_build_req *req,
                          const opt_list *o, kc_gpu_build_out *out, char *err) {
  nvrtcProgram prog = NULL;
  nvrtcResult r = api->CreateProgram(
      &prog, req->source, req->name ? req->name : "kernel.cu", 0, NULL, NULL);
  if (r != KCG_NVRTC_SUCCESS)
    return nv_fail(api, "nvrtcCreateProgram", r, err);
  nvrtcResult cr = api->CompileProgram(prog, (int)o->n, o->argv);
  kc_err rc = get_log(api, prog, &out->log, err);
  if (rc == KC_OK && cr != KCG_NVRTC_SUCCESS)
    rc = compile_failed(api, req, cr, out->log, err);
  if (rc == KC_OK)
    rc = get_code(api, prog, out, err);
  api->DestroyProgram(&prog);
  return rc == KC_OK ? check_entries(req, out, err) : rc;
}

kc_err kcg_nvrtc_compile(const kc_gpu_build_req *req, kc_gpu_build_out *out,
                         char *err) {
  memset(out, 0, sizeof *out);
  kc_err rc = kcg_build_req_check(req, err);
  if (rc != KC_OK)
    return rc;
  out->kind =
      strncmp(req->arch, "compute_", 8) == 0 ? KC_KIND_PTX : KC_KIND_CUBIN;
  kcg_nvrtc api;
  if ((rc = kcg_nvrtc_open(&api, err)) != KC_OK)
    return rc;
  opt_list o = {0};
  rc = opts_make(req, &o, err);
  if (rc == KC_OK)
    rc = run_program(&api, req, &o, out, err);
  opts_free(&o);
  kcg_nvrtc_close(&api);
  if (rc != KC_OK) { /* the log stays: it is what explains a failure */
    free(out->code);
    out->code = NULL;
    out->code_len = 0;
  }
  return rc;
}
