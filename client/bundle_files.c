/* bundle_files.c: bundles as files: one file's bytes in memory, a bundle
 * from a directory, push and pull (materialize.c writes one out). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client_internal.h"

kc_err kc_bundle_file_bytes(kc_client *c, const kc_manifest *m,
                            const char *path, void **data, size_t *len,
                            char *err) {
  for (size_t i = 0; i < m->n_files; i++)
    if (!strcmp(m->files[i].path, path))
      return kcc_cache_blob_read(c, m->files[i].sha256, m->files[i].size, data,
                                 len, err);
  return kc_errf(err, KC_NOT_FOUND, "bundle %.12s... has no file %s", m->key,
                 path);
}

/* ---- a bundle from a directory ---- */

static kc_file_kind kind_of(const char *path) {
  static const struct {
    const char *ext;
    kc_file_kind k;
  } t[] = {{".cubin", KC_KIND_CUBIN},
           {".ptx", KC_KIND_PTX},
           {".fatbin", KC_KIND_FATBIN},
           {".ltoir", KC_KIND_LTOIR}};
  size_t n = strlen(path);
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    size_t e = strlen(t[i].ext);
    if (n > e && !strcmp(path + n - e, t[i].ext))
      return t[i].k;
  }
  return KC_KIND_FILE;
}

typedef struct walk {
  kc_client *c;
  kc_manifest *m;
  size_t root_len;
  const char *skip;
  kc_err e;
  char *err;
  char real_root[PATH_MAX];     /* realpath of the root */
  char bad[KC_ERRBUF_SIZE / 2]; /* refused names, "a -> /x, b (dangling)" */
  size_t n_bad;
  int bad_cut; /* the list of names was cut short */
  int depth;
} walk;

#define KCC_WALK_DEPTH 64 /* directories deep, symlinked ones included */

static kc_err add_path(walk *w, const char *full) {
  const char *rel = full + w->root_len + 1;
  char d[KC_HEX_LEN + 1];
  uint64_t size = 0;
  kc_err e = kc_path_validate(rel, rel, w->err);
  if (!e)
    e = kc_cache_blob_put_file(w->c, full, d, &size, w->err);
  if (!e)
    e = kc_manifest_add_file(w->m, rel, d, size, kind_of(rel), NULL, 0, w->err);
  return e;
}

/* A name the bundle cannot take: kept for one error naming them all. The
 * count stays exact; the list ends in "..." once it no longer fits. */
static void refuse(walk *w, const char *full, const char *why,
                   const char *target) {
  size_t n = strlen(w->bad), room = sizeof w->bad - n;
  if (w->n_bad++ && w->bad_cut)
    return;
  int r = snprintf(w->bad + n, room, "%s%s%s%s", n ? ", " : "",
                   full + w->root_len + 1, why, target ? target : "");
  if (r < 0 || (size_t)r >= room) {
    memcpy(w->bad + sizeof w->bad - 4, "...", 4);
    w->bad_cut = 1;
  }
}

/* realpath p inside the root (not the root itself)? */
static int inside(const walk *w, const char *real) {
  size_t n = strlen(w->real_root);
  return !strncmp(real, w->real_root, n) &&
         (real[n] == '/' || (n == 1 && real[1]));
}

static kc_err walk_dir(walk *w, const char *dir);

/* A symlink is followed when it resolves inside the root (a build that
 * links lib.so -> lib.so.1 ships both names); one that leads out of it, or
 * nowhere, is refused: the bundle would miss a file, or carry one from
 * outside the build. */
static kc_err add_link(walk *w, const char *p) {
  char real[PATH_MAX];
  struct stat st;
  if (!realpath(p, real)) {
    refuse(w, p, " (dangling)", NULL);
    return KC_OK;
  }
  if (!inside(w, real)) {
    refuse(w, p, " -> ", real);
    return KC_OK;
  }
  if (stat(real, &st) != 0)
    return kc_errf(w->err, KC_IO, "%s: %s", real, strerror(errno));
  if (S_ISDIR(st.st_mode))
    return walk_dir(w, p);
  if (S_ISREG(st.st_mode))
    return add_path(w, p);
  refuse(w, p, " (not a regular file)", NULL);
  return KC_OK;
}

static kc_err walk_entry(walk *w, const char *p) {
  struct stat st;
  if (w->skip && !strcmp(p + w->root_len + 1, w->skip))
    return KC_OK;
  if (lstat(p, &st) != 0)
    return kc_errf(w->err, KC_IO, "%s: %s", p, strerror(errno));
  if (S_ISDIR(st.st_mode))
    return walk_dir(w, p);
  if (S_ISREG(st.st_mode))
    return add_path(w, p);
  if (S_ISLNK(st.st_mode))
    return add_link(w, p);
  refuse(w, p, " (not a regular file)", NULL); /* a FIFO, a socket */
  return KC_OK;
}

static kc_err walk_dir(walk *w, const char *dir) {
  if (++w->depth > KCC_WALK_DEPTH) /* symlinked directories in a loop */
    return kc_errf(w->err, KC_UNSAFE_PATH,
                   "%s: directories nest deeper than %d (a symlink loop?)", dir,
                   KCC_WALK_DEPTH);
  DIR *d = opendir(dir);
  struct dirent *de;
  if (!d)
    return kc_errf(w->err, KC_IO, "opendir %s: %s", dir, strerror(errno));
  kc_err e = KC_OK;
  while (!e && (de = readdir(d))) {
    char p[PATH_MAX];
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
      continue;
    if (snprintf(p, sizeof p, "%s/%s", dir, de->d_name) >= (int)sizeof p)
      e = kc_errf(w->err, KC_UNSAFE_PATH, "%s/%s: path too long", dir,
                  de->d_name);
    else
      e = walk_entry(w, p);
  }
  closedir(d);
  w->depth--;
  return e;
}

kc_err kc_bundle_from_dir(kc_client *c, const char *dir, const char *skip,
                          const kc_key_fields *f, kc_manifest **out,
                          char *err) {
  walk w = {.c = c, .skip = skip, .err = err};
  char *root = w.real_root;
  *out = NULL;
  if (!realpath(dir, root))
    return kc_errf(err, KC_IO, "%s: %s", dir, strerror(errno));
  w.root_len = strlen(root);
  if (!(w.m = kc_manifest_new()))
    return kc_errf(err, KC_NOMEM, "out of memory");
  w.m->fields = *f;
  kc_err e = walk_dir(&w, root);
  if (!e && w.n_bad)
    e = kc_errf(err, KC_UNSAFE_PATH,
                "%s: %zu name%s refused (a symlink must stay inside the "
                "directory; only regular files are kept): %s",
                dir, w.n_bad, w.n_bad == 1 ? "" : "s", w.bad);
  if (!e && !w.m->n_files)
    e = kc_errf(err, KC_NOT_FOUND, "%s: no regular file in it", root);
  if (!e)
    e = kc_manifest_seal(w.m, err);
  if (e) {
    kc_manifest_free(w.m);
    return e;
  }
  *out = w.m;
  return KC_OK;
}

/* ---- push, pull ---- */

kc_err kc_client_push(kc_client *c, const kc_manifest *m, char *err) {
  kc_err e = KC_OK;
  for (size_t i = 0; !e && i < m->n_files; i++) {
    void *data = NULL;
    size_t len = 0;
    e = kcc_cache_blob_read(c, m->files[i].sha256, m->files[i].size, &data,
                            &len, err);
    if (!e)
      e = kc_client_blob_put(c, data, len, NULL, err);
    free(data);
  }
  return e ? e : kc_client_bundle_put(c, m, err);
}

/* The blobs of m into the cache, in parallel. */
static kc_err fetch_manifest_blobs(kc_client *c, const kc_manifest *m,
                                   uint64_t *fetched, char *err) {
  const kc_file **d = calloc(m->n_files ? m->n_files : 1, sizeof *d);
  if (!d)
    return kc_errf(err, KC_NOMEM, "out of memory");
  for (size_t i = 0; i < m->n_files; i++)
    d[i] = &m->files[i];
  kc_err e = kcc_fetch_blobs(c, d, m->n_files, NULL, fetched, err);
  free(d);
  return e;
}

/* Same files (paths, contents, sizes, kinds, entries): the key already
 * binds the fields, but not the file list. */
static int same_files(const kc_manifest *a, const kc_manifest *b) {
  if (a->n_files != b->n_files)
    return 0;
  for (size_t i = 0; i < a->n_files; i++) {
    const kc_file *x = &a->files[i], *y = &b->files[i];
    int same = !strcmp(x->path, y->path) && !strcmp(x->sha256, y->sha256) &&
               x->size == y->size && x->kind == y->kind &&
               x->n_entries == y->n_entries;
    for (size_t j = 0; same && j < x->n_entries; j++)
      same = !strcmp(x->entries[j], y->entries[j]);
    if (!same)
      return 0;
  }
  return 1;
}

/* The server's manifest for key into the cache, its blobs fetched. */
static kc_err pull_remote(kc_client *c, const char *key, kc_manifest **m,
                          char *err) {
  kc_err e = *m ? KC_OK : kc_client_bundle_get(c, key, m, err);
  if (!e)
    e = fetch_manifest_blobs(c, *m, NULL, err);
  if (!e)
    e = kc_cache_bundle_put(c, *m, err);
  return e;
}

kc_err kc_client_pull(kc_client *c, const char *key, kc_manifest **out,
                      char *err) {
  kc_manifest *m = NULL, *served = NULL;
  char e2[KC_ERRBUF_SIZE] = "";
  if (out)
    *out = NULL;
  if (err)
    err[0] = '\0';
  kc_err e = kc_cache_bundle_get(c, key, &m, NULL);
  /* A cached copy is checked against the server's when one answers (within
   * 5 s: a stalled server must not hold up a copy we have): the key does
   * not bind the file list, so this is what catches a manifest swapped in
   * the cache directory. */
  kc_err se = KC_UNAVAILABLE;
  if (!e && c->url) {
    c->request_cap_ms = 5000;
    se = kc_client_bundle_get(c, key, &served, e2);
    c->request_cap_ms = 0;
  }
  if (!se && !same_files(m, served)) {
    kc_manifest_free(m);
    m = served;
    served = NULL;
    if (err)
      snprintf(err, KC_ERRBUF_SIZE,
               "the cached manifest of %.12s... lists other files than the "
               "server's: not used, replaced by the server's",
               key);
    e = KC_CORRUPT;
  }
  kc_manifest_free(served);
  if (e) {
    char warn[KC_ERRBUF_SIZE];
    snprintf(warn, sizeof warn, "%s", err ? err : "");
    e = pull_remote(c, key, &m, err);
    if (!e && err) /* on success, err keeps the warning */
      snprintf(err, KC_ERRBUF_SIZE, "%s", warn);
  }
  if (!e && out)
    *out = m;
  else
    kc_manifest_free(m);
  return e;
}

/* The bundles' manifests of one lookup, and every blob they name in one
 * batch: out[i] for each found[i] whose blobs all arrived, in the cache. */
static kc_err pull_found(kc_client *c, kc_manifest **found, size_t n,
                         kc_manifest **out, char *err) {
  size_t nf = 0, k = 0;
  for (size_t i = 0; i < n; i++)
    nf += found[i] ? found[i]->n_files : 0;
  const kc_file **d = calloc(nf ? nf : 1, sizeof *d);
  char *ok = calloc(nf ? nf : 1, 1);
  kc_err e = d && ok ? KC_OK : kc_errf(err, KC_NOMEM, "out of memory");
  for (size_t i = 0; !e && i < n; i++)
    for (size_t j = 0; found[i] && j < found[i]->n_files; j++)
      d[k++] = &found[i]->files[j];
  if (!e && nf)
    e = kcc_fetch_blobs(c, d, nf, ok, NULL, err);
  k = 0;
  for (size_t i = 0; ok && i < n; i++) {
    int all = found[i] != NULL;
    for (size_t j = 0; found[i] && j < found[i]->n_files; j++)
      all &= ok[k++];
    char e2[KC_ERRBUF_SIZE];
    kc_err pe = all ? kc_cache_bundle_put(c, found[i], e2) : KC_OK;
    if (all && !pe) {
      out[i] = found[i];
      found[i] = NULL;
    } else if (pe && !e)
      e = kc_errf(err, pe, "%s", e2);
  }
  free(d);
  free(ok);
  return e;
}

kc_err kc_client_pull_many(kc_client *c, const char *const *keys, size_t n,
                           kc_manifest **out, char *err) {
  if (err)
    err[0] = '\0';
  for (size_t i = 0; i < n; i++)
    out[i] = NULL;
  kc_err first = KC_OK;
  for (size_t at = 0; at < n; at += KC_LOOKUP_MAX) {
    size_t m = n - at < KC_LOOKUP_MAX ? n - at : KC_LOOKUP_MAX;
    kc_manifest **found = calloc(m, sizeof *found);
    if (!found)
      return kc_errf(err, KC_NOMEM, "out of memory");
    char e2[KC_ERRBUF_SIZE];
    kc_err e = kc_client_lookup(c, keys + at, m, found, e2);
    if (!e)
      e = pull_found(c, found, m, out + at, e2);
    for (size_t i = 0; i < m; i++)
      kc_manifest_free(found[i]);
    free(found);
    if (e && !first)
      first = kc_errf(err, e, "%s", e2);
    if (e == KC_UNAVAILABLE || e == KC_TIMEOUT || e == KC_DEADLINE)
      break; /* the server is gone: no second lookup */
  }
  return first;
}
