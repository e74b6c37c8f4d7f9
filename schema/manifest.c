/* manifest.c: bundle manifests in memory: building, the path and file rules,
 * validation, sealing (computing the key) and canonical serialization. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema_internal.h"

static const char *const kind_names[] = {"cubin", "ptx", "fatbin", "ltoir",
                                         "file"};
#define N_KINDS (sizeof kind_names / sizeof kind_names[0])

const char *kc_file_kind_name(kc_file_kind k) {
  return (unsigned)k < N_KINDS ? kind_names[k] : "unknown";
}

int kc_file_kind_parse(const char *s, kc_file_kind *out) {
  for (size_t i = 0; s && i < N_KINDS; i++) {
    if (strcmp(s, kind_names[i]) == 0) {
      if (out)
        *out = (kc_file_kind)i;
      return 0;
    }
  }
  return -1;
}

/* One '/'-separated segment of n bytes at s. */
static kc_err path_segment(const kci_ctx *c, const char *s, size_t n,
                           const char *what) {
  if (n == 0)
    return kci_bad(c, "%s: empty segment not allowed", what);
  if (n == 1 && s[0] == '.')
    return kci_bad(c, "%s: '.' segment not allowed", what);
  if (n == 2 && s[0] == '.' && s[1] == '.')
    return kci_bad(c, "%s: '..' segment not allowed", what);
  return KC_OK;
}

kc_err kc_path_validate(const char *path, const char *what, char *err) {
  const kci_ctx c = {KC_UNSAFE_PATH, err};
  if (!what)
    what = "path";
  if (!path)
    return kci_bad(&c, "%s: missing", what);
  size_t n = strlen(path);
  if (n == 0)
    return kci_bad(&c, "%s: empty", what);
  if (n > KC_PATH_MAX)
    return kci_bad(&c, "%s: longer than 255 bytes", what);
  if (path[0] == '/')
    return kci_bad(&c, "%s: absolute path not allowed", what);
  if (strchr(path, '\\'))
    return kci_bad(&c, "%s: backslash not allowed", what);
  for (const char *s = path;;) {
    const char *slash = strchr(s, '/');
    size_t len = slash ? (size_t)(slash - s) : strlen(s);
    if (path_segment(&c, s, len, what))
      return c.code;
    if (!slash)
      return KC_OK;
    s = slash + 1;
  }
}

/* JSON text is UTF-8, and the canonical form writes strings as they are:
 * jansson's own rule (what it would parse) says which strings are. */
static int utf8_ok(const char *s) {
  json_t *j = json_string(s);
  json_decref(j);
  return j != NULL;
}

/* The rules of one file; i names it in messages. */
static kc_err check_file(const kci_ctx *c, const kc_file *f, size_t i) {
  char w[KCI_WHAT_SIZE];
  snprintf(w, sizeof w, "files[%zu].path", i);
  if (kc_path_validate(f->path, w, c->err))
    return c->code; /* a bad path is a bad manifest, not KC_UNSAFE_PATH */
  if (!utf8_ok(f->path))
    return kci_bad(c, "%s: not valid UTF-8", w);
  snprintf(w, sizeof w, "files[%zu].sha256", i);
  if (!kci_check_term(c, f->sha256, sizeof f->sha256, w) ||
      !kci_check_hex(c, f->sha256, w))
    return c->code;
  if (f->size > KC_BUCKET_VALUE_MAX)
    return kci_bad(c, "files[%zu].size: value above 2^53", i);
  if ((unsigned)f->kind >= N_KINDS)
    return kci_bad(c, "files[%zu].kind: unknown kind %d", i, (int)f->kind);
  if (f->n_entries && !f->entries)
    return kci_bad(c, "files[%zu].entries: NULL with %zu entries", i,
                   f->n_entries);
  for (size_t j = 0; j < f->n_entries; j++) {
    snprintf(w, sizeof w, "files[%zu].entries[%zu]", i, j);
    if (!f->entries[j])
      return kci_bad(c, "%s: missing", w);
    if (!kci_check_ident(c, f->entries[j], w))
      return c->code;
  }
  return KC_OK;
}

static int cmp_file_path(const void *a, const void *b) {
  const kc_file *x = *(const kc_file *const *)a,
                *y = *(const kc_file *const *)b;
  int r = strcmp(x->path, y->path);
  return r ? r : (x < y ? -1 : x > y);
}

/* The files ordered by path (bytes): canonical order and duplicate search. */
static const kc_file **sorted_files(const kc_manifest *m) {
  const kc_file **v = malloc(m->n_files * sizeof *v);
  if (!v)
    return NULL;
  for (size_t i = 0; i < m->n_files; i++)
    v[i] = &m->files[i];
  qsort(v, m->n_files, sizeof *v, cmp_file_path);
  return v;
}

static kc_err check_unique_paths(const kci_ctx *c, const kc_manifest *m) {
  const kc_file **v = sorted_files(m);
  kc_err e = KC_OK;
  if (!v)
    return kci_err(c->err, KC_NOMEM, "files: out of memory");
  for (size_t i = 1; i < m->n_files && !e; i++) {
    if (strcmp(v[i - 1]->path, v[i]->path) == 0)
      e = kci_bad(c, "files[%zu].path: duplicate of files[%zu].path '%.40s'",
                  (size_t)(v[i] - m->files), (size_t)(v[i - 1] - m->files),
                  v[i]->path);
  }
  free(v);
  return e;
}

static kc_err check_producer(const kci_ctx *c, const kc_producer *p) {
  if (!isfinite(p->seconds) || p->seconds < 0)
    return kci_bad(c, "producer.seconds: must be a finite number >= 0");
  if (p->builder && !utf8_ok(p->builder))
    return kci_bad(c, "producer.builder: not valid UTF-8");
  if (p->host && !utf8_ok(p->host))
    return kci_bad(c, "producer.host: not valid UTF-8");
  if (p->created && !utf8_ok(p->created))
    return kci_bad(c, "producer.created: not valid UTF-8");
  return KC_OK;
}

kc_err kc_manifest_validate(const kc_manifest *m, char *err) {
  const kci_ctx c = {KC_BAD_MANIFEST, err};
  if (!m)
    return kci_err(err, KC_EINVAL, "manifest: NULL");
  if (kci_key_check(&c, &m->fields))
    return c.code;
  if (m->n_files == 0 || !m->files)
    return kci_bad(&c, "files: at least one file required");
  if (m->n_files > KC_MANIFEST_MAX_FILES)
    return kci_bad(&c, "files: %zu files, at most %d in one bundle", m->n_files,
                   KC_MANIFEST_MAX_FILES);
  for (size_t i = 0; i < m->n_files; i++)
    if (check_file(&c, &m->files[i], i))
      return c.code;
  if (check_unique_paths(&c, m))
    return c.code;
  return check_producer(&c, &m->producer);
}

kc_err kc_manifest_seal(kc_manifest *m, char *err) {
  kc_err e = kc_manifest_validate(m, err);
  if (e)
    return e;
  e = kc_key_compute(&m->fields, m->key, err);
  return e == KC_BAD_KEY ? KC_BAD_MANIFEST : e;
}

kc_manifest *kc_manifest_new(void) { return calloc(1, sizeof(kc_manifest)); }

static void file_clear(kc_file *f) {
  free(f->path);
  kci_strv_free(f->entries, f->n_entries);
}

void kc_manifest_free(kc_manifest *m) {
  if (!m)
    return;
  for (size_t i = 0; i < m->n_files; i++)
    file_clear(&m->files[i]);
  free(m->files);
  free(m->producer.builder);
  free(m->producer.host);
  free(m->producer.created);
  free(m);
}

kc_err kc_manifest_add_file(kc_manifest *m, const char *path,
                            const char sha256[KC_HEX_LEN + 1], uint64_t size,
                            kc_file_kind kind, const char *const *entries,
                            size_t n_entries, char *err) {
  const kci_ctx c = {KC_BAD_MANIFEST, err};
  if (!m || !sha256)
    return kci_err(err, KC_EINVAL, "add_file: NULL argument");
  /* Check the borrowed strings in place: nothing is copied until they pass. */
  kc_file probe = {.path = (char *)path,
                   .size = size,
                   .kind = kind,
                   .n_entries = n_entries,
                   .entries = (char **)entries};
  snprintf(probe.sha256, sizeof probe.sha256, "%.64s", sha256);
  if (m->n_files >= KC_MANIFEST_MAX_FILES)
    return kci_bad(&c, "files: at most %d in one bundle",
                   KC_MANIFEST_MAX_FILES);
  if (!kc_is_hex64(sha256))
    return kci_bad(&c, "files[%zu].sha256: must be 64 lowercase hex digits",
                   m->n_files);
  if (check_file(&c, &probe, m->n_files))
    return c.code;
  kc_file *files = realloc(m->files, (m->n_files + 1) * sizeof *files);
  if (!files)
    return kci_err(err, KC_NOMEM, "files: out of memory");
  m->files = files;
  kc_file *f = &files[m->n_files];
  *f = probe;
  f->entries = NULL;
  f->path = strdup(path);
  if (!f->path || kci_strv_dup(entries, n_entries, &f->entries)) {
    free(f->path);
    return kci_err(err, KC_NOMEM, "files: out of memory");
  }
  m->n_files++;
  return KC_OK;
}

/* ---- canonical JSON (json_out.c) ---- */

/* {"entries":[...],"kind":..,"path":..,"sha256":..,"size":..}: sorted keys,
 * entries only when there are some. */
static void file_out(kci_jbuf *b, const kc_file *f) {
  kci_jb_lit(b, "{");
  if (f->n_entries) {
    kci_jb_lit(b, "\"entries\":[");
    for (size_t i = 0; i < f->n_entries; i++) {
      kci_jb_lit(b, i ? "," : "");
      kci_jb_str(b, f->entries[i]);
    }
    kci_jb_lit(b, "],");
  }
  kci_jb_lit(b, "\"kind\":");
  kci_jb_str(b, kc_file_kind_name(f->kind));
  kci_jb_lit(b, ",\"path\":");
  kci_jb_str(b, f->path);
  kci_jb_lit(b, ",\"sha256\":");
  kci_jb_str(b, f->sha256);
  kci_jb_lit(b, ",\"size\":");
  kci_jb_u64(b, f->size);
  kci_jb_lit(b, "}");
}

/* Files in path order, so that the order a builder listed them in does not
 * make two equal bundles differ. */
static void files_out(kci_jbuf *b, const kc_manifest *m) {
  const kc_file **v = sorted_files(m);
  if (!v) {
    b->oom = 1;
    return;
  }
  kci_jb_lit(b, "[");
  for (size_t i = 0; i < m->n_files; i++) {
    kci_jb_lit(b, i ? "," : "");
    file_out(b, v[i]);
  }
  kci_jb_lit(b, "]");
  free(v);
}

/* ,"producer":{...}, omitted entirely when empty; seconds <= 0 means "not
 * measured". */
static void producer_out(kci_jbuf *b, const kc_producer *p) {
  const char *sep = "";
  if (!p->builder && !p->host && !p->created && !(p->seconds > 0))
    return;
  kci_jb_lit(b, ",\"producer\":{");
  if (p->builder) {
    kci_jb_lit(b, "\"builder\":");
    kci_jb_str(b, p->builder);
    sep = ",";
  }
  if (p->created) {
    kci_jb_lit(b, sep);
    kci_jb_lit(b, "\"created\":");
    kci_jb_str(b, p->created);
    sep = ",";
  }
  if (p->host) {
    kci_jb_lit(b, sep);
    kci_jb_lit(b, "\"host\":");
    kci_jb_str(b, p->host);
    sep = ",";
  }
  if (p->seconds > 0) {
    kci_jb_lit(b, sep);
    kci_jb_lit(b, "\"seconds\":");
    kci_jb_real(b, p->seconds);
  }
  kci_jb_lit(b, "}");
}

/* The manifest's keys in strcmp order: arch, bucket, build, files, key,
 * model, producer, schema, toolchain. */
static char *manifest_text(const kc_manifest *m) {
  kci_jbuf b = {0};
  kci_jb_lit(&b, "{\"arch\":");
  kci_jb_str(&b, m->fields.arch);
  kci_jb_lit(&b, ",\"bucket\":");
  kci_jb_bucket(&b, &m->fields.bucket);
  kci_jb_lit(&b, ",\"build\":");
  kci_jb_str(&b, m->fields.build);
  kci_jb_lit(&b, ",\"files\":");
  files_out(&b, m);
  kci_jb_lit(&b, ",\"key\":");
  kci_jb_str(&b, m->key);
  kci_jb_lit(&b, ",\"model\":");
  kci_jb_str(&b, m->fields.model);
  producer_out(&b, &m->producer);
  kci_jb_lit(&b, ",\"schema\":\"kcache.bundle/v1\",\"toolchain\":");
  kci_jb_tools(&b, m->fields.tools, m->fields.n_tools);
  kci_jb_lit(&b, "}");
  return kci_jb_take(&b);
}

static kc_err check_key(const kc_manifest *m, char *err) {
  char expect[KC_HEX_LEN + 1];
  kc_err e = kc_key_compute(&m->fields, expect, err);
  if (e)
    return e == KC_BAD_KEY ? KC_BAD_MANIFEST : e;
  if (strcmp(m->key, expect) != 0)
    return kci_err(err, KC_KEY_MISMATCH,
                   "key: does not match the fields (expected %s)", expect);
  return KC_OK;
}

kc_err kc_manifest_check_key(const kc_manifest *m, char *err) {
  if (!m)
    return kci_err(err, KC_EINVAL, "manifest: NULL");
  if (!memchr(m->key, '\0', sizeof m->key) || !kc_is_hex64(m->key))
    return kci_err(err, KC_BAD_MANIFEST,
                   "key: must be 64 lowercase hex digits");
  return check_key(m, err);
}

kc_err kc_manifest_to_json(const kc_manifest *m, char **out, char *err) {
  if (!out)
    return kci_err(err, KC_EINVAL, "manifest: NULL output");
  *out = NULL;
  kc_err e = kc_manifest_validate(m, err);
  if (!e)
    e = kc_manifest_check_key(m, err);
  return e ? e : kc_manifest_to_json_valid(m, out, err);
}

kc_err kc_manifest_to_json_valid(const kc_manifest *m, char **out, char *err) {
  if (!out)
    return kci_err(err, KC_EINVAL, "manifest: NULL output");
  if (!(*out = manifest_text(m)))
    return kci_err(err, KC_NOMEM, "manifest: out of memory");
  return KC_OK;
}

int kc_manifest_equal(const kc_manifest *a, const kc_manifest *b) {
  char *x = NULL, *y = NULL;
  int eq = a && b && kc_manifest_to_json(a, &x, NULL) == KC_OK &&
           kc_manifest_to_json(b, &y, NULL) == KC_OK && strcmp(x, y) == 0;
  free(x);
  free(y);
  return eq;
}
