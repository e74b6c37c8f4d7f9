/* test_schema.c: unit tests of schema/: SHA-256, keys against committed
 * vectors, every bundle and warmup manifest rule (code and message), bucket
 * helpers, and the shared good/bad examples that check_json_schema.py also
 * runs against the JSON Schema files.
 *
 * Usage: test_schema [TESTS_DIR] (default: the source tests/ directory). */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <locale.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "kc_schema.h"

#ifndef KC_TEST_DIR
#define KC_TEST_DIR "tests"
#endif

static const char *tests_dir = KC_TEST_DIR;
static char errbuf[KC_ERRBUF_SIZE];

#define M1 "5a7cc462c675f9d5693bae11d480f09c3c01ae53617500e6475623784622159c"
#define M2 "03cf86902340794268a9b9f40b667111cd3927e11061e8d6cde46aa2a4e6fad0"
#define B1 "e844adc60c72d254b27e713b88e72a8338fbb13944b1499c212495e376cd3d11"
#define B2 "4f6caf3fbf9346631e74a5cdcfb31184e0e3245eb39c994882b0f8e7b9a1b834"
#define Z64 "0000000000000000000000000000000000000000000000000000000000000000"
#define F64 "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff"
#define SHA_A "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"
#define KEY1 "d540614e05ed94c760d17278589527d366a7354beaa2b8bcb789b7e309a6e7a9"
#define P53 9007199254740992ULL

/* ---- helpers ---- */

/* Fails unless got == want and the error text contains sub. */
static void expect_err_at(kc_err got, kc_err want, const char *sub,
                          const char *file, int line) {
  if (got == want && strstr(errbuf, sub))
    return;
  print_error("%s:%d: got %s \"%s\"; want %s containing \"%s\"\n", file, line,
              kc_err_name(got), errbuf, kc_err_name(want), sub);
  _fail(file, line);
}
#define EXPECT_ERR(call, want, sub)                                            \
  do {                                                                         \
    errbuf[0] = '\0';                                                          \
    expect_err_at((call), (want), (sub), __FILE__, __LINE__);                  \
  } while (0)

static char *path_join(const char *a, const char *b) {
  char *p = malloc(strlen(a) + strlen(b) + 2);
  assert_non_null(p);
  sprintf(p, "%s/%s", a, b);
  return p;
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fputs(text, f) >= 0, 1);
  assert_int_equal(fclose(f), 0);
}

static int rm_entry(const char *p, const struct stat *st, int flag,
                    struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(p);
}

/* Fixture: a fresh temporary directory per test, removed afterwards. */
static int tmpdir_setup(void **state) {
  char *t = strdup("/tmp/kc_schema_test.XXXXXX");
  if (!t || !mkdtemp(t)) {
    free(t);
    return -1;
  }
  *state = t;
  return 0;
}

static int tmpdir_teardown(void **state) {
  int rc = nftw(*state, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  free(*state);
  return rc;
}

static void base_fields(kc_key_fields *f) {
  memset(f, 0, sizeof *f);
  strcpy(f->model, M1);
  strcpy(f->build, B1);
  strcpy(f->arch, "sm_90a");
  f->bucket.n = 2;
  strcpy(f->bucket.dims[0].name, "seq");
  f->bucket.dims[0].value = 1024;
  strcpy(f->bucket.dims[1].name, "batch");
  f->bucket.dims[1].value = 8;
  f->n_tools = 2;
  strcpy(f->tools[0].name, "nvrtc");
  strcpy(f->tools[0].value, "13.0");
  strcpy(f->tools[1].name, "cuda");
  strcpy(f->tools[1].value, "13.0");
}

/* ---- SHA-256 ---- */

static void test_sha256(void **state) {
  (void)state;
  char hex[KC_HEX_LEN + 1], hex2[KC_HEX_LEN + 1];
  assert_int_equal(kc_sha256_hex("", 0, hex), KC_OK);
  assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca4"
                           "95991b7852b855");
  assert_int_equal(kc_sha256_hex(NULL, 0, hex), KC_OK);
  assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca4"
                           "95991b7852b855");
  assert_int_equal(kc_sha256_hex("abc", 3, hex), KC_OK);
  assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb4"
                           "10ff61f20015ad");
  assert_int_equal(kc_sha256_hex(NULL, 3, hex), KC_EINVAL);

  kc_sha256 *h = kc_sha256_new();
  assert_non_null(h);
  const char *msg = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  for (size_t at = 0, len = strlen(msg); at < len; at += 5)
    assert_int_equal(kc_sha256_update(h, msg + at, len - at < 5 ? len - at : 5),
                     KC_OK);
  assert_int_equal(kc_sha256_final(h, hex), KC_OK);
  assert_string_equal(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6"
                           "ecedd419db06c1");
  /* finished: no more updates or finals until reset */
  assert_int_equal(kc_sha256_update(h, "x", 1), KC_EINVAL);
  assert_int_equal(kc_sha256_final(h, hex2), KC_EINVAL);
  assert_int_equal(kc_sha256_reset(h), KC_OK);
  assert_int_equal(kc_sha256_update(h, "abc", 3), KC_OK);
  assert_int_equal(kc_sha256_update(h, NULL, 0), KC_OK);
  assert_int_equal(kc_sha256_final(h, hex2), KC_OK);
  assert_string_equal(hex2, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb"
                            "410ff61f20015ad");
  kc_sha256_free(h);
  kc_sha256_free(NULL);
}

static void test_sha256_file(void **state) {
  char hex[KC_HEX_LEN + 1];
  uint64_t size = 0;
  char *p = path_join(*state, "a.bin");
  /* 100000 bytes cross the 32 KiB read buffer several times */
  char *big = malloc(100001);
  assert_non_null(big);
  memset(big, 'a', 100000);
  big[100000] = '\0';
  write_file(p, big);
  assert_int_equal(kc_sha256_file(p, hex, &size, errbuf), KC_OK);
  assert_int_equal(size, 100000);
  char want[KC_HEX_LEN + 1];
  assert_int_equal(kc_sha256_hex(big, 100000, want), KC_OK);
  assert_string_equal(hex, want);
  assert_int_equal(kc_sha256_file(p, hex, NULL, NULL), KC_OK);
  free(big);
  free(p);
  p = path_join(*state, "missing");
  EXPECT_ERR(kc_sha256_file(p, hex, &size, errbuf), KC_IO,
             "No such file or directory");
  assert_non_null(strstr(errbuf, "missing"));
  free(p);
  EXPECT_ERR(kc_sha256_file(*state, hex, &size, errbuf), KC_IO,
             "Is a directory");
}

static void test_is_hex64(void **state) {
  (void)state;
  assert_true(kc_is_hex64(M1));
  assert_true(kc_is_hex64(Z64));
  assert_false(kc_is_hex64(NULL));
  assert_false(kc_is_hex64(""));
  assert_false(kc_is_hex64(M1 "0"));
  assert_false(kc_is_hex64(&M1[1]));
  assert_false(kc_is_hex64("5A7cc462c675f9d5693bae11d480f09c3c01ae53617500e6475"
                           "623784622159c"));
  assert_false(kc_is_hex64("ga7cc462c675f9d5693bae11d480f09c3c01ae53617500e6475"
                           "623784622159c"));
}

/* The shared hex helpers: lowercase out, either case in, a non-digit (or
 * the string's end) refused; the clocks move forward. */
static void test_hex_and_clocks(void **state) {
  (void)state;
  const unsigned char raw[4] = {0x00, 0x9f, 0xa0, 0xff};
  unsigned char back[4];
  char hex[9];
  kc_hex_encode(raw, sizeof raw, hex);
  assert_string_equal(hex, "009fa0ff");
  assert_int_equal(kc_hex_decode("009FA0fF", 4, back), 0);
  assert_memory_equal(back, raw, 4);
  assert_int_equal(kc_hex_decode("0g", 1, back), -1);
  assert_int_equal(kc_hex_decode("0", 1, back), -1);
  assert_int_equal(kc_hex_digit('F'), 15);
  assert_int_equal(kc_hex_digit('/'), -1);
  assert_true(kc_clock_wall_ms() > 1700000000000LL); /* after 2023 */
  uint64_t t0 = kc_clock_mono_us();
  assert_true(kc_clock_mono_us() >= t0);
}

static void test_read_file(void **state) {
  char *text = NULL;
  size_t len = 0;
  char *p = path_join(*state, "t.txt");
  write_file(p, "hello\n");
  assert_int_equal(kc_read_file(p, &text, &len, errbuf), KC_OK);
  assert_int_equal(len, 6);
  assert_string_equal(text, "hello\n");
  free(text);
  free(p);
  p = path_join(*state, "nope.txt");
  EXPECT_ERR(kc_read_file(p, &text, &len, errbuf), KC_IO, "nope.txt: No such");
  assert_null(text);
  free(p);
  EXPECT_ERR(kc_read_file(NULL, &text, &len, errbuf), KC_EINVAL, "NULL");
}

/* ---- arch ---- */

static void test_arch(void **state) {
  (void)state;
  const char *good[] = {"sm_80",   "sm_86",      "sm_90a",       "sm_100f",
                        "sm_120a", "compute_90", "compute_100a", "compute_120f",
                        "sm_75",   "sm_999"};
  const char *bad[] = {"",       "sm_",      "sm_9",     "sm_1000", "sm_90b",
                       "SM_90",  "sm90",     "gfx90a",   "sm_90aa", "sm_90a ",
                       " sm_90", "compute_", "sm_9a",    "sm__90",  "sm_-90",
                       "cm_90",  "sm_90A",   "compute90"};
  for (size_t i = 0; i < sizeof good / sizeof *good; i++)
    if (!kc_arch_valid(good[i]))
      fail_msg("arch %s should be valid", good[i]);
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    if (kc_arch_valid(bad[i]))
      fail_msg("arch '%s' should be invalid", bad[i]);
  assert_false(kc_arch_valid(NULL));
}

/* ---- key vectors ---- */

typedef struct vdim {
  const char *name;
  uint64_t value;
} vdim;
typedef struct vtool {
  const char *name, *value;
} vtool;
/* One vector built field by field, in an order other than the canonical one;
 * entry i matches line i of tests/vectors/keys.txt. */
typedef struct key_vec {
  const char *model, *build, *arch;
  vdim dims[KC_MAX_DIMS + 1];    /* ends at a NULL name */
  vtool tools[KC_MAX_TOOLS + 1]; /* ends at a NULL name */
} key_vec;

#define V128                                                                   \
  " !'#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[/]^_`"          \
  "abcdefghijklmnopqrstuvwxyz{|}~ !'#$%&'()*+,-./0123456789:;<=>?@"

static const key_vec vectors[] = {
    {M1,
     B1,
     "sm_90a",
     {{"seq", 1024}, {"batch", 8}},
     {{"nvrtc", "13.0"}, {"cuda", "13.0"}}},
    {M1,
     B1,
     "sm_80",
     {{"seq", 1024}, {"batch", 8}},
     {{"nvrtc", "13.0"}, {"cuda", "13.0"}}},
    {M1,
     B2,
     "compute_90",
     {{"seq", 128}, {"batch", 1}},
     {{"nvrtc", "12.4"}, {"driver", "550.54.15"}, {"cuda", "12.4"}}},
    {F64, Z64, "sm_100f", {{"seq", 0}}, {{0}}},
    {M2, B2, "sm_86", {{"tokens", P53}}, {{"cuda", "12.8"}}},
    {M2,
     B1,
     "sm_89",
     {{"d", 3},
      {"o", 14},
      {"h", 7},
      {"j", 9},
      {"n", 13},
      {"l", 11},
      {"e", 4},
      {"f", 5},
      {"m", 12},
      {"i", 8},
      {"b", 1},
      {"a", 0},
      {"p", 15},
      {"g", 6},
      {"c", 2},
      {"k", 10}},
     {{"nvrtc", "12.9"}}},
    {M2,
     B1,
     "sm_120a",
     {{"batch", 4}},
     {{"t22", "22"}, {"t05", "5"},  {"t14", "14"}, {"t15", "15"}, {"t10", "10"},
      {"t09", "9"},  {"t11", "11"}, {"t16", "16"}, {"t25", "25"}, {"t26", "26"},
      {"t06", "6"},  {"t04", "4"},  {"t31", "31"}, {"t08", "8"},  {"t00", "0"},
      {"t21", "21"}, {"t19", "19"}, {"t12", "12"}, {"t24", "24"}, {"t23", "23"},
      {"t20", "20"}, {"t28", "28"}, {"t03", "3"},  {"t18", "18"}, {"t01", "1"},
      {"t30", "30"}, {"t17", "17"}, {"t29", "29"}, {"t07", "7"},  {"t02", "2"},
      {"t13", "13"}, {"t27", "27"}}},
    /* byte order: '-' < '.' < '0' < '_' < 'a' */
    {M1,
     B2,
     "compute_100",
     {{"aa", 4}, {"a_", 3}, {"b1_x", 5}, {"a0", 2}, {"a", 1}},
     {{"aa", "6"},
      {"a_", "5"},
      {"a0", "4"},
      {"a.b", "3"},
      {"a-b", "2"},
      {"a", "1"}}},
    {M1,
     B1,
     "sm_90",
     {{"seq", 256}, {"batch", 2}},
     {{"cuda", "13.0"}, {"app", "a\"b\\c /x"}}},
    {M2, B2, "sm_75", {{"seq", 64}}, {{"long", V128}}},
    {M1,
     B1,
     "sm_90a",
     {{"abcdefghijklmnopqrstuvwxyz_01234", 32}},
     {{"cuda", ""}, {"abcdefghijklmnopqrstuvwxyz_.-012", "max"}}},
    {M1,
     B1,
     "sm_90a",
     {{"seq", 1024}, {"batch", 8}},
     {{"triton", "3.3.0"},
      {"torch", "2.7.0+cu128"},
      {"nvrtc", "12.8"},
      {"cuda", "12.8"}}},
    {Z64,
     F64,
     "compute_120f",
     {{"seq", P53 - 1}, {"batch", 1}},
     {{"cuda", "13.0 (V13.0.48)"}}},
    {M2, B2, "sm_100a", {{"x", 1}}, {{"space", " "}}},
};
#define N_VECTORS (sizeof vectors / sizeof vectors[0])

/* Builds the fields through the public setters where there are some. */
static void vec_fields(const key_vec *v, kc_key_fields *f) {
  memset(f, 0, sizeof *f);
  strcpy(f->model, v->model);
  strcpy(f->build, v->build);
  strcpy(f->arch, v->arch);
  for (size_t i = 0; v->dims[i].name; i++) {
    strcpy(f->bucket.dims[i].name, v->dims[i].name);
    f->bucket.dims[i].value = v->dims[i].value;
    f->bucket.n++;
  }
  for (size_t i = 0; v->tools[i].name; i++)
    assert_int_equal(
        kc_key_set_tool(f, v->tools[i].name, v->tools[i].value, errbuf), KC_OK);
}

typedef struct vec_line {
  char key[KC_HEX_LEN + 1];
  char *json;
} vec_line;

/* Reads keys.txt: "<hex> <json>" lines, '#' comments. */
static size_t read_vectors(vec_line *out, size_t max) {
  char *path = path_join(tests_dir, "vectors/keys.txt"), *text, *save = NULL;
  assert_int_equal(kc_read_file(path, &text, NULL, errbuf), KC_OK);
  size_t n = 0;
  for (char *l = strtok_r(text, "\n", &save); l;
       l = strtok_r(NULL, "\n", &save)) {
    if (l[0] == '#')
      continue;
    assert_true(n < max);
    assert_int_equal(l[KC_HEX_LEN], ' ');
    memcpy(out[n].key, l, KC_HEX_LEN);
    out[n].key[KC_HEX_LEN] = '\0';
    out[n].json = strdup(l + KC_HEX_LEN + 1);
    n++;
  }
  free(text);
  free(path);
  return n;
}

static void free_vectors(vec_line *v, size_t n) {
  for (size_t i = 0; i < n; i++)
    free(v[i].json);
}

static void test_key_vectors(void **state) {
  (void)state;
  vec_line lines[64];
  size_t n = read_vectors(lines, 64);
  assert_int_equal(n, N_VECTORS);
  assert_true(n >= 12);
  for (size_t i = 0; i < n; i++) {
    kc_key_fields f;
    char *canon = NULL, key[KC_HEX_LEN + 1];
    vec_fields(&vectors[i], &f);
    assert_int_equal(kc_key_canonical(&f, &canon, errbuf), KC_OK);
    if (strcmp(canon, lines[i].json) != 0)
      fail_msg("vector %zu:\n got  %s\n want %s", i, canon, lines[i].json);
    assert_int_equal(kc_key_compute(&f, key, errbuf), KC_OK);
    assert_string_equal(key, lines[i].key);
    free(canon);
  }
  free_vectors(lines, n);
}

/* Parse each committed line, reverse the dims and tools, hash again. */
static void test_key_vectors_parsed(void **state) {
  (void)state;
  vec_line lines[64];
  size_t n = read_vectors(lines, 64);
  for (size_t i = 0; i < n; i++) {
    kc_key_fields f;
    char *canon = NULL, key[KC_HEX_LEN + 1];
    assert_int_equal(
        kc_key_fields_parse(lines[i].json, strlen(lines[i].json), &f, errbuf),
        KC_OK);
    for (size_t a = 0, b = f.bucket.n - 1; a < b; a++, b--) {
      kc_dim t = f.bucket.dims[a];
      f.bucket.dims[a] = f.bucket.dims[b];
      f.bucket.dims[b] = t;
    }
    for (size_t a = 0, b = f.n_tools ? f.n_tools - 1 : 0; a < b; a++, b--) {
      kc_tool t = f.tools[a];
      f.tools[a] = f.tools[b];
      f.tools[b] = t;
    }
    assert_int_equal(kc_key_canonical(&f, &canon, errbuf), KC_OK);
    assert_string_equal(canon, lines[i].json);
    assert_int_equal(kc_key_compute(&f, key, errbuf), KC_OK);
    assert_string_equal(key, lines[i].key);
    free(canon);
  }
  free_vectors(lines, n);
}

/* A random valid name of [a-z][a-z0-9_<extra>]*, unique among the n taken
 * (stride bytes apart from first). */
static void random_name(char *out, const char *extra, const char *first,
                        size_t stride, size_t n) {
  static const char base[] = "abcdefghijklmnopqrstuvwxyz0123456789_";
  char set[64];
  snprintf(set, sizeof set, "%s%s", base, extra);
  for (;;) {
    size_t len = 1 + (size_t)rand() % KC_NAME_MAX, i, dup = 0;
    out[0] = (char)('a' + rand() % 26);
    for (i = 1; i < len; i++)
      out[i] = set[(size_t)rand() % strlen(set)];
    out[len] = '\0';
    for (i = 0; i < n; i++)
      dup |= !strcmp(first + i * stride, out);
    if (!dup)
      return;
  }
}

/* The canonical form is written by hand (key.c): the same bytes as
 * jansson's sorted, compact dump of the same object, over random fields
 * (quotes, backslashes and every printable byte in values; names in any
 * order; up to 16 dims and 32 tools). */
static void test_key_canonical_matches_jansson(void **state) {
  (void)state;
  srand(17);
  for (int round = 0; round < 2000; round++) {
    kc_key_fields f;
    memset(&f, 0, sizeof f);
    strcpy(f.model, round % 2 ? M1 : M2);
    strcpy(f.build, round % 3 ? B1 : B2);
    strcpy(f.arch, round % 5 ? "sm_90a" : "compute_100f");
    json_t *o = json_pack("{ss ss ss si}", "arch", f.arch, "build", f.build,
                          "model", f.model, "v", 1);
    json_t *bk = json_object(), *tc = json_object();
    f.bucket.n = 1 + (size_t)rand() % KC_MAX_DIMS;
    for (size_t i = 0; i < f.bucket.n; i++) {
      kc_dim *d = &f.bucket.dims[i];
      random_name(d->name, "", f.bucket.dims[0].name, sizeof *d, i);
      d->value = ((uint64_t)rand() << 22 ^ (uint64_t)rand()) % (P53 + 1);
      json_object_set_new(bk, d->name, json_integer((json_int_t)d->value));
    }
    f.n_tools = (size_t)rand() % (KC_MAX_TOOLS + 1);
    for (size_t i = 0; i < f.n_tools; i++) {
      kc_tool *t = &f.tools[i];
      size_t len = (size_t)rand() % (KC_TOOL_VALUE_MAX + 1);
      random_name(t->name, ".-", f.tools[0].name, sizeof *t, i);
      for (size_t k = 0; k < len; k++)
        t->value[k] = (char)(0x20 + rand() % 95);
      json_object_set_new(tc, t->name, json_string(t->value));
    }
    json_object_set_new(o, "bucket", bk);
    json_object_set_new(o, "toolchain", tc);
    char *want = json_dumps(o, JSON_SORT_KEYS | JSON_COMPACT), *got = NULL;
    assert_int_equal(kc_key_canonical(&f, &got, errbuf), KC_OK);
    if (strcmp(got, want) != 0)
      fail_msg("round %d:\n got  %s\n want %s", round, got, want);
    free(got);
    free(want);
    json_decref(o);
  }
}

/* ---- manifest canonical form against jansson ---- */

static int cmp_path(const void *a, const void *b) {
  return strcmp((*(const kc_file *const *)a)->path,
                (*(const kc_file *const *)b)->path);
}

/* The canonical manifest as jansson made it before json_out.c: objects
 * built and dumped with sorted keys, compact, reals at precision 15. */
static char *manifest_by_jansson(const kc_manifest *m) {
  const kc_file **v = malloc(m->n_files * sizeof *v);
  json_t *files = json_array(), *bk = json_object(), *tc = json_object();
  for (size_t i = 0; i < m->n_files; i++)
    v[i] = &m->files[i];
  qsort(v, m->n_files, sizeof *v, cmp_path);
  for (size_t i = 0; i < m->n_files; i++) {
    json_t *o = json_pack("{ss ss sI ss}", "path", v[i]->path, "sha256",
                          v[i]->sha256, "size", (json_int_t)v[i]->size, "kind",
                          kc_file_kind_name(v[i]->kind));
    if (v[i]->n_entries) {
      json_t *a = json_array();
      for (size_t k = 0; k < v[i]->n_entries; k++)
        json_array_append_new(a, json_string(v[i]->entries[k]));
      json_object_set_new(o, "entries", a);
    }
    json_array_append_new(files, o);
  }
  free(v);
  for (size_t i = 0; i < m->fields.bucket.n; i++)
    json_object_set_new(
        bk, m->fields.bucket.dims[i].name,
        json_integer((json_int_t)m->fields.bucket.dims[i].value));
  for (size_t i = 0; i < m->fields.n_tools; i++)
    json_object_set_new(tc, m->fields.tools[i].name,
                        json_string(m->fields.tools[i].value));
  json_t *root = json_pack(
      "{ss ss so ss so ss ss so}", "schema", "kcache.bundle/v1", "key", m->key,
      "files", files, "arch", m->fields.arch, "bucket", bk, "build",
      m->fields.build, "model", m->fields.model, "toolchain", tc);
  const kc_producer *p = &m->producer;
  if (p->builder || p->host || p->created || p->seconds > 0) {
    json_t *o = json_object();
    if (p->builder)
      json_object_set_new(o, "builder", json_string(p->builder));
    if (p->host)
      json_object_set_new(o, "host", json_string(p->host));
    if (p->seconds > 0)
      json_object_set_new(o, "seconds", json_real(p->seconds));
    if (p->created)
      json_object_set_new(o, "created", json_string(p->created));
    json_object_set_new(root, "producer", o);
  }
  char *s =
      json_dumps(root, JSON_SORT_KEYS | JSON_COMPACT | JSON_REAL_PRECISION(15));
  json_decref(root);
  return s;
}

/* A random string of pieces: ASCII, 2- to 4-byte UTF-8, quotes,
 * backslashes (unless no_bs), control bytes, DEL. */
static void random_text(char *out, size_t max_pieces, int no_bs) {
  static const char *const piece[] = {"a",
                                      "Z",
                                      "0",
                                      "_",
                                      " ",
                                      "-",
                                      ".",
                                      "\"",
                                      "\\",
                                      "\t",
                                      "\n",
                                      "\r",
                                      "\b",
                                      "\f",
                                      "\x01",
                                      "\x1f",
                                      "\x7f",
                                      "\xc3\xa9",
                                      "\xe6\x97\xa5",
                                      "\xf0\x9f\x98\x80",
                                      "~",
                                      "{",
                                      "}",
                                      ":",
                                      ","};
  size_t n = 1 + (size_t)rand() % max_pieces;
  out[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    const char *p = piece[(size_t)rand() % (sizeof piece / sizeof *piece)];
    if (!(no_bs && *p == '\\'))
      strcat(out, p);
  }
}

/* json_out.c writes the canonical manifest by hand: the same bytes as
 * jansson's dump over random manifests (paths with UTF-8, quotes and
 * control bytes; entries; producers with every kind of real). */
static void test_manifest_canonical_matches_jansson(void **state) {
  (void)state;
  static const double secs[] = {0,    0.021,   1e-7,     3.0,       123456.789,
                                1e20, 1.0 / 3, 2.5e-300, 0.1 + 0.2, 7e15};
  size_t n_paths = 0, odd = 0; /* what the rounds covered */
  for (int round = 0; round < 800; round++) {
    if (round % 100 == 0)
      srand((unsigned)(29 + round / 100)); /* eight seeds */
    kc_manifest *m = kc_manifest_new();
    char d[65], path[80], host[80], ent[3][16];
    const char *ents[3] = {ent[0], ent[1], ent[2]};
    strcpy(m->fields.model, M1);
    strcpy(m->fields.build, B2);
    strcpy(m->fields.arch, "sm_90a");
    m->fields.bucket.n = 1;
    strcpy(m->fields.bucket.dims[0].name, "seq");
    m->fields.bucket.dims[0].value = (uint64_t)round;
    strcpy(m->fields.tools[0].name, "app");
    strcpy(m->fields.tools[0].value, "a\"b\\c");
    m->fields.n_tools = (size_t)(round % 2);
    for (int k = 0; k < 3; k++)
      snprintf(ent[k], sizeof ent[k], "k%d_%d", round, k);
    size_t nf = 1 + (size_t)rand() % 6;
    for (size_t i = 0; i < nf; i++) {
      /* unique ("3/..."), else seal refuses the duplicate */
      int at = snprintf(path, sizeof path, "%zu/", i);
      random_text(path + at, 8, 1);
      snprintf(d, sizeof d, "%064x", rand());
      /* a path the rules refuse (a "." or ".." segment) is skipped */
      if (kc_manifest_add_file(m, path, d, (uint64_t)rand() * 977,
                               (kc_file_kind)(rand() % (KC_KIND_FILE + 1)),
                               ents, (size_t)rand() % 4, NULL) == KC_OK) {
        n_paths++;
        for (const char *c = path; *c; c++)
          odd += (unsigned char)*c < 0x20 || (unsigned char)*c >= 0x80;
      }
    }
    if (!m->n_files)
      assert_int_equal(
          kc_manifest_add_file(m, "f", d, 1, KC_KIND_FILE, NULL, 0, NULL),
          KC_OK);
    random_text(host, 10, 0);
    m->producer.builder = round % 3 ? strdup("sh \"x\"") : NULL;
    m->producer.host = round % 4 ? strdup(host) : NULL;
    m->producer.created = round % 5 ? strdup("2026-11-25T13:00:00Z") : NULL;
    m->producer.seconds = round % 7 ? secs[(size_t)rand() % 10] : 0;
    assert_int_equal(kc_manifest_seal(m, errbuf), KC_OK);
    char *got = NULL, *want = manifest_by_jansson(m);
    assert_int_equal(kc_manifest_to_json(m, &got, errbuf), KC_OK);
    if (strcmp(got, want) != 0)
      fail_msg("round %d:\n got  %s\n want %s", round, got, want);
    free(got);
    free(want);
    kc_manifest_free(m);
  }
  /* the paths were mostly taken, with control and non-ASCII bytes */
  assert_true(n_paths >= 2000);
  assert_true(odd >= 1000);
}

/* A program using libkcache may set LC_NUMERIC: in de_DE, "%.15g" prints
 * 12,5, which jansson turned back into 12.5 and so must json_out.c. The
 * locale is compiled into a temporary directory (localedef, LOCPATH);
 * without localedef and the locales package's sources the test skips. */
static void test_manifest_real_in_comma_locale(void **state) {
  (void)state;
  char dir[] = "/tmp/kc-locale-XXXXXX", cmd[200], *json = NULL;
  assert_non_null(mkdtemp(dir));
  snprintf(cmd, sizeof cmd,
           "localedef -i de_DE -f UTF-8 %s/de_DE.UTF-8 >/dev/null 2>&1", dir);
  int made = system(cmd) == 0;
  setenv("LOCPATH", dir, 1);
  int on = made && setlocale(LC_NUMERIC, "de_DE.UTF-8") != NULL &&
           *localeconv()->decimal_point == ',';
  kc_manifest *m = NULL;
  if (on) {
    m = kc_manifest_new();
    strcpy(m->fields.model, M1);
    strcpy(m->fields.build, B1);
    strcpy(m->fields.arch, "sm_80");
    m->fields.bucket.n = 1;
    strcpy(m->fields.bucket.dims[0].name, "seq");
    assert_int_equal(kc_manifest_add_file(m, "a.cubin", B2, 1, KC_KIND_CUBIN,
                                          NULL, 0, errbuf),
                     KC_OK);
    m->producer.seconds = 12.5;
    assert_int_equal(kc_manifest_seal(m, errbuf), KC_OK);
    assert_int_equal(kc_manifest_to_json(m, &json, errbuf), KC_OK);
  }
  setlocale(LC_NUMERIC, "C");
  unsetenv("LOCPATH");
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0)
    print_message("cannot remove %s\n", dir);
  if (!on) {
    print_message("skipped: no de_DE locale (localedef, locales)\n");
    skip();
  }
  assert_non_null(strstr(json, "\"seconds\":12.5}"));
  kc_manifest *back = NULL;
  assert_int_equal(kc_manifest_parse(json, strlen(json), &back, errbuf), KC_OK);
  assert_true(back->producer.seconds == 12.5);
  kc_manifest_free(back);
  kc_manifest_free(m);
  free(json);
}

/* A path that is not UTF-8 is refused when it is added, as the canonical
 * form could not hold it. */
static void test_manifest_path_not_utf8(void **state) {
  (void)state;
  kc_manifest *m = kc_manifest_new();
  char d[65];
  memset(d, 'a', 64);
  d[64] = '\0';
  EXPECT_ERR(kc_manifest_add_file(m, "bad\xff.bin", d, 1, KC_KIND_FILE, NULL, 0,
                                  errbuf),
             KC_BAD_MANIFEST, "not valid UTF-8");
  assert_int_equal(m->n_files, 0);
  kc_manifest_free(m);
}

/* ---- key validation ---- */

static void test_key_validate_model_build_arch(void **state) {
  (void)state;
  kc_key_fields f;
  base_fields(&f);
  assert_int_equal(kc_key_validate(&f, errbuf), KC_OK);
  f.model[0] = 'A';
  EXPECT_ERR(kc_key_validate(&f, errbuf), KC_BAD_KEY,
             "model: must be 64 lowercase hex digits");
  base_fields(&f);
  f.model[63] = '\0';
  EXPECT_ERR(kc_key_validate(&f, errbuf), KC_BAD_KEY, "model: must be 64");
  base_fields(&f);
  f.build[10] = 'g';
  EXPECT_ERR(kc_key_validate(&f, errbuf), KC_BAD_KEY,
             "build: must be 64 lowercase hex digits");
  base_fields(&f);
  memset(f.model, 'a', sizeof f.model);
  EXPECT_ERR(kc_key_validate(&f, errbuf), KC_BAD_KEY,
             "model: not NUL-terminated");
  base_fields(&f);
  strcpy(f.arch, "sm_9");
  EXPECT_ERR(kc_key_validate(&f, errbuf), KC_BAD_KEY,
             "arch: 'sm_9' is not a valid arch");
  memset(f.arch, '9', sizeof f.arch);
  EXPECT_ERR(kc_key_validate(&f, errbuf), KC_BAD_KEY,
             "arch: not NUL-terminated");
  EXPECT_ERR(kc_key_validate(NULL, errbuf), KC_EINVAL, "NULL");
  /* a NULL error buffer is allowed */
  assert_int_equal(kc_key_validate(&f, NULL), KC_BAD_KEY);
}

static void test_key_validate_bucket(void **state) {
  (void)state;
  kc_key_fields f;
  base_fields(&f);
  f.bucket.n = 0;
  EXPECT_ERR(kc_key_validate(&f, errbuf), KC_BAD_KEY,
             "bucket: empty (1 to 16 entries)");
  f.bucket.n = 17;
  EXPECT_ERR(kc_key_validate(&f, errbuf), KC_BAD_KEY,
             "bucket: 17 entries (at most 16)");
  const char *bad_names[] = {"Seq", "1seq", "", "se-q", "_seq", "s q"};
  for (size_t i = 0; i < sizeof bad_names / sizeof *bad_names; i++) {
    base_fields(&f);
    snprintf(f.bucket.dims[0].name, sizeof f.bucket.dims[0].name, "%s",
             bad_names[i]);
    EXPECT_ERR(kc_key_validate(&f, errbuf), KC_BAD_KEY, "bucket: invalid name");
  }
  base_fields(&f);
  memset(f.bucket.dims[1].name, 'a', sizeof f.bucket.dims[1].name);
  EXPECT_ERR(kc_key_validate(&f, errbuf), KC_BAD_KEY,
             "bucket: not NUL-terminated");
  base_fields(&f);
  f.bucket.dims[0].value = P53 + 1;
  EXPECT_ERR(kc_key_validate(&f, errbuf), KC_BAD_KEY,
             "bucket.seq: value above 2^53");
  f.bucket.dims[0].value = P53; /* the limit itself is fine */
  assert_int_equal(kc_key_validate(&f, errbuf), KC_OK);
  strcpy(f.bucket.dims[1].name, "seq");
  EXPECT_ERR(kc_key_validate(&f, errbuf), KC_BAD_KEY,
             "bucket: duplicate name 'seq'");
}

static void test_key_validate_toolchain(void **state) {
  (void)state;
  kc_key_fields f;
  base_fields(&f);
  f.n_tools = 0; /* an empty toolchain is allowed */
  assert_int_equal(kc_key_validate(&f, errbuf), KC_OK);
  f.n_tools = 33;
  EXPECT_ERR(kc_key_validate(&f, errbuf), KC_BAD_KEY,
             "toolchain: 33 entries (at most 32)");
  const char *bad_names[] = {"Cuda", "_cuda", "1cuda", "", "cu da", "cu/da"};
  for (size_t i = 0; i < sizeof bad_names / sizeof *bad_names; i++) {
    base_fields(&f);
    strcpy(f.tools[1].name, bad_names[i]);
    EXPECT_ERR(kc_key_validate(&f, errbuf), KC_BAD_KEY,
               "toolchain: invalid name");
  }
  const char *bad_values[] = {"a\tb", "a\x7f", "caf\xc3\xa9", "\n"};
  for (size_t i = 0; i < sizeof bad_values / sizeof *bad_values; i++) {
    base_fields(&f);
    strcpy(f.tools[1].value, bad_values[i]);
    EXPECT_ERR(kc_key_validate(&f, errbuf), KC_BAD_KEY,
               "toolchain.cuda: value must be printable ASCII (0x20-0x7e)");
  }
  base_fields(&f);
  memset(f.tools[1].value, 'x', sizeof f.tools[1].value);
  EXPECT_ERR(kc_key_validate(&f, errbuf), KC_BAD_KEY,
             "toolchain.cuda: not NUL-terminated");
  base_fields(&f);
  strcpy(f.tools[1].name, "nvrtc");
  EXPECT_ERR(kc_key_validate(&f, errbuf), KC_BAD_KEY,
             "toolchain: duplicate name 'nvrtc'");
}

static void test_key_canonical_errors(void **state) {
  (void)state;
  kc_key_fields f;
  char *out = (char *)"x", key[KC_HEX_LEN + 1];
  base_fields(&f);
  strcpy(f.arch, "sm_9");
  EXPECT_ERR(kc_key_canonical(&f, &out, errbuf), KC_BAD_KEY, "arch:");
  assert_null(out);
  EXPECT_ERR(kc_key_compute(&f, key, errbuf), KC_BAD_KEY, "arch:");
  EXPECT_ERR(kc_key_canonical(&f, NULL, errbuf), KC_EINVAL, "NULL");
  EXPECT_ERR(kc_key_compute(&f, NULL, errbuf), KC_EINVAL, "NULL");
}

static void test_key_order_independent(void **state) {
  (void)state;
  kc_key_fields a, b;
  char ka[KC_HEX_LEN + 1], kb[KC_HEX_LEN + 1];
  base_fields(&a);
  base_fields(&b);
  kc_dim d = b.bucket.dims[0];
  b.bucket.dims[0] = b.bucket.dims[1];
  b.bucket.dims[1] = d;
  kc_tool t = b.tools[0];
  b.tools[0] = b.tools[1];
  b.tools[1] = t;
  assert_int_equal(kc_key_compute(&a, ka, errbuf), KC_OK);
  assert_int_equal(kc_key_compute(&b, kb, errbuf), KC_OK);
  assert_string_equal(ka, kb);
  assert_string_equal(ka, KEY1);
  /* anything else changes it */
  b.bucket.dims[0].value++;
  assert_int_equal(kc_key_compute(&b, kb, errbuf), KC_OK);
  assert_string_not_equal(ka, kb);
}

static void test_key_set_tool(void **state) {
  (void)state;
  kc_key_fields f;
  char name[16];
  memset(&f, 0, sizeof f);
  assert_int_equal(kc_key_set_tool(&f, "cuda", "12.0", errbuf), KC_OK);
  assert_int_equal(kc_key_set_tool(&f, "cuda", "13.0", errbuf), KC_OK);
  assert_int_equal(f.n_tools, 1);
  assert_string_equal(f.tools[0].value, "13.0");
  EXPECT_ERR(kc_key_set_tool(&f, "Torch", "2", errbuf), KC_BAD_KEY,
             "toolchain: invalid name 'Torch'");
  EXPECT_ERR(
      kc_key_set_tool(&f, "abcdefghijklmnopqrstuvwxyz0123456", "2", errbuf),
      KC_BAD_KEY, "toolchain: invalid name");
  char long_value[130];
  memset(long_value, 'v', 129);
  long_value[129] = '\0';
  EXPECT_ERR(kc_key_set_tool(&f, "torch", long_value, errbuf), KC_BAD_KEY,
             "toolchain.torch: value longer than 128 bytes");
  long_value[128] = '\0';
  assert_int_equal(kc_key_set_tool(&f, "torch", long_value, errbuf), KC_OK);
  EXPECT_ERR(kc_key_set_tool(&f, "torch", "a\tb", errbuf), KC_BAD_KEY,
             "toolchain.torch: value must be printable");
  for (int i = 0; f.n_tools < KC_MAX_TOOLS; i++) {
    snprintf(name, sizeof name, "t%d", i);
    assert_int_equal(kc_key_set_tool(&f, name, "1", errbuf), KC_OK);
  }
  EXPECT_ERR(kc_key_set_tool(&f, "one_more", "1", errbuf), KC_BAD_KEY,
             "toolchain: full (at most 32 entries)");
  assert_int_equal(kc_key_set_tool(&f, "cuda", "13.1", errbuf), KC_OK);
  EXPECT_ERR(kc_key_set_tool(NULL, "a", "b", errbuf), KC_EINVAL, "NULL");
  EXPECT_ERR(kc_key_set_tool(&f, NULL, "b", errbuf), KC_EINVAL, "NULL");
  EXPECT_ERR(kc_key_set_tool(&f, "a", NULL, errbuf), KC_EINVAL, "NULL");
}

/* ---- JSON mutation helper for the rule tables ---- */

/* A generated value for rules that need long input: "@name". */
static json_t *gen_value(const char *spec) {
  char buf[400];
  if (strcmp(spec, "@bucket17") == 0 || strcmp(spec, "@tools33") == 0) {
    int tools = spec[1] == 't';
    json_t *o = json_object();
    for (int i = 0; i < (tools ? 33 : 17); i++) {
      snprintf(buf, sizeof buf, "d%d", i);
      json_object_set_new(o, buf, tools ? json_string("1") : json_integer(i));
    }
    return o;
  }
  size_t n = strcmp(spec, "@path256") == 0    ? 256
             : strcmp(spec, "@ident256") == 0 ? 256
             : strcmp(spec, "@value129") == 0 ? 129
                                              : 0;
  assert_true(n > 0);
  memset(buf, 'a', n);
  buf[n] = '\0';
  return json_string(buf);
}

static json_t *value_of(const char *text) {
  if (text[0] == '@')
    return gen_value(text);
  json_error_t je;
  json_t *v = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
  if (!v)
    fail_msg("bad test value %s: %s", text, je.text);
  return v;
}

/* Sets (value != NULL) or deletes the element at a dotted path such as
 * "files.0.path" (numbers index arrays). */
static void set_at(json_t *root, const char *at, const char *value) {
  char path[128], *save = NULL;
  snprintf(path, sizeof path, "%s", at);
  json_t *parent = root;
  char *tok = strtok_r(path, ".", &save), *next;
  while ((next = strtok_r(NULL, ".", &save))) {
    parent = json_is_array(parent) ? json_array_get(parent, atoi(tok))
                                   : json_object_get(parent, tok);
    assert_non_null(parent);
    tok = next;
  }
  if (json_is_array(parent)) {
    size_t i = (size_t)atoi(tok);
    if (!value)
      assert_int_equal(json_array_remove(parent, i), 0);
    else if (i == json_array_size(parent))
      assert_int_equal(json_array_append_new(parent, value_of(value)), 0);
    else
      assert_int_equal(json_array_set_new(parent, i, value_of(value)), 0);
  } else if (!value) {
    assert_int_equal(json_object_del(parent, tok), 0);
  } else {
    assert_int_equal(json_object_set_new(parent, tok, value_of(value)), 0);
  }
}

typedef struct rule_case {
  const char *at;    /* dotted path to change */
  const char *value; /* JSON text, "@gen", or NULL to delete */
  kc_err code;
  const char *msg; /* expected substring */
} rule_case;

typedef kc_err (*parse_fn)(const char *json, size_t len, char *err);

static void run_cases(const char *base, const rule_case *cases, size_t n,
                      parse_fn parse) {
  for (size_t i = 0; i < n; i++) {
    json_t *root = json_loads(base, 0, NULL);
    assert_non_null(root);
    set_at(root, cases[i].at, cases[i].value);
    char *text = json_dumps(root, JSON_COMPACT);
    errbuf[0] = '\0';
    kc_err e = parse(text, strlen(text), errbuf);
    if (e != cases[i].code || !strstr(errbuf, cases[i].msg))
      fail_msg("case %zu (%s = %s): got %s \"%s\"; want %s \"%s\"", i,
               cases[i].at, cases[i].value ? cases[i].value : "(deleted)",
               kc_err_name(e), errbuf, kc_err_name(cases[i].code),
               cases[i].msg);
    free(text);
    json_decref(root);
  }
}

/* ---- key fields JSON ---- */

#define KEY_JSON                                                               \
  "{\"model\":\"" M1 "\",\"build\":\"" B1 "\",\"arch\":\"sm_90a\","            \
  "\"bucket\":{\"batch\":8,\"seq\":1024},"                                     \
  "\"toolchain\":{\"cuda\":\"13.0\",\"nvrtc\":\"13.0\"}}"

static kc_err parse_key(const char *json, size_t len, char *err) {
  kc_key_fields f;
  return kc_key_fields_parse(json, len, &f, err);
}

static const rule_case key_cases[] = {
    {"v", "2", KC_BAD_KEY, "v: must be 1"},
    {"v", "\"1\"", KC_BAD_KEY, "v: must be 1"},
    {"extra", "1", KC_BAD_KEY, "key fields: unknown field(s): extra"},
    {"model", NULL, KC_BAD_KEY, "model: missing"},
    {"model", "5", KC_BAD_KEY, "model: must be a string"},
    {"build", "\"abc\"", KC_BAD_KEY, "build: must be 64 lowercase hex digits"},
    {"arch", "\"sm_90x\"", KC_BAD_KEY, "arch: 'sm_90x' is not a valid arch"},
    {"bucket", NULL, KC_BAD_KEY, "bucket: missing"},
    {"bucket", "[1]", KC_BAD_KEY, "bucket: must be an object"},
    {"bucket", "{}", KC_BAD_KEY, "bucket: empty (1 to 16 entries)"},
    {"bucket", "@bucket17", KC_BAD_KEY, "bucket: 17 entries (at most 16)"},
    {"bucket.Seq", "1", KC_BAD_KEY, "bucket: invalid name 'Seq'"},
    {"bucket.abcdefghijklmnopqrstuvwxyz_012345", "1", KC_BAD_KEY,
     "bucket: invalid name 'abcdefghijklmnopqrstuvwxyz_012345'"},
    {"bucket.abcdefghijklmnopqrstuvwxyz_01234", "1", KC_OK, ""},
    {"bucket.seq", "\"8\"", KC_BAD_KEY, "bucket.seq: must be an integer"},
    {"bucket.seq", "8.0", KC_BAD_KEY, "bucket.seq: must be an integer"},
    {"bucket.seq", "-1", KC_BAD_KEY, "bucket.seq: value below 0"},
    {"bucket.seq", "9007199254740993", KC_BAD_KEY,
     "bucket.seq: value above 2^53"},
    {"toolchain", NULL, KC_BAD_KEY, "toolchain: missing"},
    {"toolchain", "@tools33", KC_BAD_KEY, "toolchain: 33 entries (at most 32)"},
    {"toolchain.CUDA", "\"1\"", KC_BAD_KEY, "toolchain: invalid name 'CUDA'"},
    {"toolchain.abcdefghijklmnopqrstuvwxyz_-01234", "\"1\"", KC_BAD_KEY,
     "toolchain: invalid name"},
    {"toolchain.abcdefghijklmnopqrstuvwxyz_-0123", "\"1\"", KC_OK, ""},
    {"toolchain.cuda", "13", KC_BAD_KEY, "toolchain.cuda: must be a string"},
    {"toolchain.cuda", "@value129", KC_BAD_KEY,
     "toolchain.cuda: value longer than 128 bytes"},
    {"toolchain.cuda", "\"a\\u00e9\"", KC_BAD_KEY,
     "toolchain.cuda: value must be printable ASCII"},
    {"toolchain.cuda", "\"a\\u0000b\"", KC_BAD_JSON, "line 1"},
};

static void test_key_fields_parse(void **state) {
  (void)state;
  kc_key_fields f;
  char key[KC_HEX_LEN + 1];
  assert_int_equal(kc_key_fields_parse(KEY_JSON, strlen(KEY_JSON), &f, errbuf),
                   KC_OK);
  assert_int_equal(kc_key_compute(&f, key, errbuf), KC_OK);
  assert_string_equal(key, KEY1);
  run_cases(KEY_JSON, key_cases, sizeof key_cases / sizeof *key_cases,
            parse_key);
  /* out is left alone on failure */
  memset(&f, 0x5a, sizeof f);
  EXPECT_ERR(kc_key_fields_parse("{", 1, &f, errbuf), KC_BAD_JSON,
             "line 1, column 1");
  assert_int_equal((unsigned char)f.model[0], 0x5a);
  const char *dup = "{\"model\":\"" M1 "\",\"model\":\"" M1 "\"}";
  EXPECT_ERR(kc_key_fields_parse(dup, strlen(dup), &f, errbuf), KC_BAD_JSON,
             "duplicate object key");
  EXPECT_ERR(kc_key_fields_parse("[]", 2, &f, errbuf), KC_BAD_KEY,
             "key fields: must be an object");
  EXPECT_ERR(kc_key_fields_parse(NULL, 0, &f, errbuf), KC_EINVAL, "NULL");
}

/* ---- bundle manifests ---- */

#define SHA_B "3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73eeaed59c009d"
#define SHA_C "2e7d2c03a9507ae265ecf5b5356885a53393a2029d241394997265a1a25aefc6"

#define MANIFEST_JSON                                                          \
  "{\"schema\":\"kcache.bundle/v1\",\"key\":\"" KEY1 "\","                     \
  "\"model\":\"" M1 "\",\"bucket\":{\"batch\":8,\"seq\":1024},"                \
  "\"arch\":\"sm_90a\",\"toolchain\":{\"cuda\":\"13.0\",\"nvrtc\":\"13.0\"},"  \
  "\"build\":\"" B1 "\",\"files\":["                                           \
  "{\"path\":\"gemm.cubin\",\"sha256\":\"" SHA_A "\",\"size\":5632,"           \
  "\"kind\":\"cubin\",\"entries\":[\"gemm\",\"gemm_bias_2\"]},"                \
  "{\"path\":\"sub/dir/gemm.ptx\",\"sha256\":\"" SHA_B "\",\"size\":100,"      \
  "\"kind\":\"ptx\"},"                                                         \
  "{\"path\":\"all.fatbin\",\"sha256\":\"" SHA_C "\",\"size\":0,"              \
  "\"kind\":\"fatbin\",\"entries\":[]}],"                                      \
  "\"producer\":{\"builder\":\"nvrtc 13.0\",\"host\":\"ci-7\","                \
  "\"seconds\":1.84,\"created\":\"2026-11-22T08:00:00Z\"}}"

/* Canonical form of MANIFEST_JSON: sorted keys, files in path order. */
#define MANIFEST_CANON                                                         \
  "{\"arch\":\"sm_90a\",\"bucket\":{\"batch\":8,\"seq\":1024},"                \
  "\"build\":\"" B1 "\",\"files\":["                                           \
  "{\"kind\":\"fatbin\",\"path\":\"all.fatbin\",\"sha256\":\"" SHA_C "\","     \
  "\"size\":0},"                                                               \
  "{\"entries\":[\"gemm\",\"gemm_bias_2\"],\"kind\":\"cubin\","                \
  "\"path\":\"gemm.cubin\",\"sha256\":\"" SHA_A "\",\"size\":5632},"           \
  "{\"kind\":\"ptx\",\"path\":\"sub/dir/gemm.ptx\",\"sha256\":\"" SHA_B "\","  \
  "\"size\":100}],\"key\":\"" KEY1 "\",\"model\":\"" M1 "\","                  \
  "\"producer\":{\"builder\":\"nvrtc 13.0\",\"created\":"                      \
  "\"2026-11-22T08:00:00Z\",\"host\":\"ci-7\",\"seconds\":1.84},"              \
  "\"schema\":\"kcache.bundle/v1\","                                           \
  "\"toolchain\":{\"cuda\":\"13.0\",\"nvrtc\":\"13.0\"}}"

static kc_err parse_manifest(const char *json, size_t len, char *err) {
  kc_manifest *m = (kc_manifest *)1;
  kc_err e = kc_manifest_parse(json, len, &m, err);
  if (e)
    assert_null(m);
  kc_manifest_free(m);
  return e;
}

static const rule_case manifest_cases[] = {
    /* document */
    {"schema", NULL, KC_BAD_MANIFEST, "schema: missing"},
    {"schema", "\"kcache.bundle/v2\"", KC_BAD_MANIFEST,
     "schema: must be 'kcache.bundle/v1'"},
    {"extra", "1", KC_BAD_MANIFEST, "manifest: unknown field(s): extra"},
    {"v", "1", KC_BAD_MANIFEST, "manifest: unknown field(s): v"},
    /* key */
    {"key", NULL, KC_BAD_MANIFEST, "key: missing"},
    {"key", "\"" KEY1 "0\"", KC_BAD_MANIFEST,
     "key: must be 64 lowercase hex digits"},
    {"key", "\"" M1 "\"", KC_KEY_MISMATCH,
     "key: does not match the fields (expected " KEY1 ")"},
    {"bucket.seq", "2048", KC_KEY_MISMATCH, "key: does not match the fields"},
    {"toolchain.torch", "\"2.7\"", KC_KEY_MISMATCH, "key: does not match"},
    /* key fields */
    {"model", NULL, KC_BAD_MANIFEST, "model: missing"},
    {"model", "\"" B1 "x\"", KC_BAD_MANIFEST,
     "model: must be 64 lowercase hex digits"},
    {"build", "null", KC_BAD_MANIFEST, "build: must be a string"},
    {"arch", "\"sm_9\"", KC_BAD_MANIFEST, "arch: 'sm_9' is not a valid arch"},
    {"arch", "90", KC_BAD_MANIFEST, "arch: must be a string"},
    {"bucket", "{}", KC_BAD_MANIFEST, "bucket: empty (1 to 16 entries)"},
    {"bucket", "@bucket17", KC_BAD_MANIFEST, "bucket: 17 entries (at most 16)"},
    {"bucket.9x", "1", KC_BAD_MANIFEST, "bucket: invalid name '9x'"},
    {"bucket.seq", "9007199254740993", KC_BAD_MANIFEST,
     "bucket.seq: value above 2^53"},
    {"bucket.seq", "-5", KC_BAD_MANIFEST, "bucket.seq: value below 0"},
    {"bucket.seq", "1e3", KC_BAD_MANIFEST, "bucket.seq: must be an integer"},
    {"toolchain", NULL, KC_BAD_MANIFEST, "toolchain: missing"},
    {"toolchain", "@tools33", KC_BAD_MANIFEST, "toolchain: 33 entries"},
    {"toolchain.Cuda", "\"1\"", KC_BAD_MANIFEST, "toolchain: invalid name"},
    {"toolchain.cuda", "\"13.0\\n\"", KC_BAD_MANIFEST,
     "toolchain.cuda: value must be printable ASCII"},
    {"toolchain.cuda", "@value129", KC_BAD_MANIFEST,
     "toolchain.cuda: value longer than 128 bytes"},
    /* files */
    {"files", NULL, KC_BAD_MANIFEST, "files: missing"},
    {"files", "{}", KC_BAD_MANIFEST, "files: must be an array"},
    {"files", "[]", KC_BAD_MANIFEST, "files: at least one file required"},
    {"files.1", "\"x\"", KC_BAD_MANIFEST, "files[1]: must be an object"},
    {"files.0.mode", "420", KC_BAD_MANIFEST,
     "files[0]: unknown field(s): mode"},
    {"files.0.path", NULL, KC_BAD_MANIFEST, "files[0].path: missing"},
    {"files.0.path", "7", KC_BAD_MANIFEST, "files[0].path: must be a string"},
    {"files.0.path", "\"\"", KC_BAD_MANIFEST, "files[0].path: empty"},
    {"files.2.path", "\"a/../b\"", KC_BAD_MANIFEST,
     "files[2].path: '..' segment not allowed"},
    {"files.2.path", "\"..\"", KC_BAD_MANIFEST, "'..' segment not allowed"},
    {"files.0.path", "\"/etc/passwd\"", KC_BAD_MANIFEST,
     "files[0].path: absolute path not allowed"},
    {"files.0.path", "\"a\\\\b\"", KC_BAD_MANIFEST,
     "files[0].path: backslash not allowed"},
    {"files.0.path", "\"a//b\"", KC_BAD_MANIFEST,
     "files[0].path: empty segment not allowed"},
    {"files.0.path", "\"a/\"", KC_BAD_MANIFEST, "empty segment not allowed"},
    {"files.0.path", "\"./a\"", KC_BAD_MANIFEST,
     "files[0].path: '.' segment not allowed"},
    {"files.0.path", "\"a/.\"", KC_BAD_MANIFEST, "'.' segment not allowed"},
    {"files.0.path", "@path256", KC_BAD_MANIFEST,
     "files[0].path: longer than 255 bytes"},
    {"files.0.path", "\"a\\u0000b\"", KC_BAD_JSON, "line 1"},
    {"files.1.path", "\"gemm.cubin\"", KC_BAD_MANIFEST,
     "files[1].path: duplicate of files[0].path 'gemm.cubin'"},
    {"files.0.sha256", NULL, KC_BAD_MANIFEST, "files[0].sha256: missing"},
    {"files.0.sha256", "\"ABC\"", KC_BAD_MANIFEST,
     "files[0].sha256: must be 64 lowercase hex digits"},
    {"files.0.size", NULL, KC_BAD_MANIFEST, "files[0].size: missing"},
    {"files.0.size", "-1", KC_BAD_MANIFEST, "files[0].size: value below 0"},
    {"files.0.size", "9007199254740993", KC_BAD_MANIFEST,
     "files[0].size: value above 2^53"},
    {"files.0.size", "5.0", KC_BAD_MANIFEST,
     "files[0].size: must be an integer"},
    {"files.0.size", "\"5\"", KC_BAD_MANIFEST,
     "files[0].size: must be an integer"},
    {"files.0.kind", NULL, KC_BAD_MANIFEST, "files[0].kind: missing"},
    {"files.0.kind", "\"elf\"", KC_BAD_MANIFEST,
     "files[0].kind: 'elf' is not one of cubin, ptx, fatbin, ltoir, file"},
    {"files.0.entries", "\"gemm\"", KC_BAD_MANIFEST,
     "files[0].entries: must be an array"},
    {"files.0.entries.1", "\"1gemm\"", KC_BAD_MANIFEST,
     "files[0].entries[1]: '1gemm' is not a C identifier"},
    {"files.0.entries.1", "\"gemm-2\"", KC_BAD_MANIFEST, "not a C identifier"},
    {"files.0.entries.1", "\"\"", KC_BAD_MANIFEST, "not a C identifier"},
    {"files.0.entries.0", "@ident256", KC_BAD_MANIFEST,
     "files[0].entries[0]: longer than 255 bytes"},
    {"files.0.entries.0", "3", KC_BAD_MANIFEST,
     "files[0].entries[0]: must be a string"},
    /* producer */
    {"producer", "[]", KC_BAD_MANIFEST, "producer: must be an object"},
    {"producer.pid", "1", KC_BAD_MANIFEST, "producer: unknown field(s): pid"},
    {"producer.builder", "1", KC_BAD_MANIFEST,
     "producer.builder: must be a string"},
    {"producer.host", "true", KC_BAD_MANIFEST,
     "producer.host: must be a string"},
    {"producer.created", "0", KC_BAD_MANIFEST,
     "producer.created: must be a string"},
    {"producer.seconds", "\"1\"", KC_BAD_MANIFEST,
     "producer.seconds: must be a number"},
    {"producer.seconds", "-0.5", KC_BAD_MANIFEST,
     "producer.seconds: value below 0"},
};

static void test_manifest_rules(void **state) {
  (void)state;
  assert_int_equal(parse_manifest(MANIFEST_JSON, strlen(MANIFEST_JSON), errbuf),
                   KC_OK);
  run_cases(MANIFEST_JSON, manifest_cases,
            sizeof manifest_cases / sizeof *manifest_cases, parse_manifest);
  EXPECT_ERR(parse_manifest("[1]", 3, errbuf), KC_BAD_MANIFEST,
             "manifest: must be an object");
  EXPECT_ERR(parse_manifest("{\"schema\":", 10, errbuf), KC_BAD_JSON,
             "line 1, column 10");
  EXPECT_ERR(parse_manifest("{\"a\":1,\"a\":2}", 13, errbuf), KC_BAD_JSON,
             "duplicate object key");
  EXPECT_ERR(parse_manifest("", 0, errbuf), KC_BAD_JSON, "line 1");
  EXPECT_ERR(kc_manifest_parse(MANIFEST_JSON, 5, NULL, errbuf), KC_EINVAL,
             "NULL");
}

static void test_manifest_parse_fields(void **state) {
  (void)state;
  kc_manifest *m = NULL;
  assert_int_equal(
      kc_manifest_parse(MANIFEST_JSON, strlen(MANIFEST_JSON), &m, errbuf),
      KC_OK);
  assert_string_equal(m->key, KEY1);
  assert_string_equal(m->fields.arch, "sm_90a");
  assert_int_equal(m->fields.bucket.n, 2);
  assert_int_equal(m->fields.n_tools, 2);
  assert_int_equal(m->n_files, 3);
  assert_string_equal(m->files[1].path, "sub/dir/gemm.ptx");
  assert_int_equal(m->files[0].size, 5632);
  assert_int_equal(m->files[0].kind, KC_KIND_CUBIN);
  assert_int_equal(m->files[0].n_entries, 2);
  assert_string_equal(m->files[0].entries[1], "gemm_bias_2");
  assert_int_equal(m->files[2].n_entries, 0);
  assert_int_equal(m->files[2].kind, KC_KIND_FATBIN);
  assert_string_equal(m->producer.builder, "nvrtc 13.0");
  assert_string_equal(m->producer.host, "ci-7");
  assert_string_equal(m->producer.created, "2026-11-22T08:00:00Z");
  assert_true(fabs(m->producer.seconds - 1.84) < 1e-12);
  kc_manifest_free(m);
  kc_manifest_free(NULL);
}

static void test_manifest_to_json(void **state) {
  (void)state;
  kc_manifest *m = NULL, *m2 = NULL;
  char *out = NULL, *out2 = NULL;
  assert_int_equal(
      kc_manifest_parse(MANIFEST_JSON, strlen(MANIFEST_JSON), &m, errbuf),
      KC_OK);
  assert_int_equal(kc_manifest_to_json(m, &out, errbuf), KC_OK);
  assert_string_equal(out, MANIFEST_CANON);
  /* the canonical form parses back to an equal manifest, same bytes */
  assert_int_equal(kc_manifest_parse(out, strlen(out), &m2, errbuf), KC_OK);
  assert_int_equal(kc_manifest_to_json(m2, &out2, errbuf), KC_OK);
  assert_string_equal(out, out2);
  assert_true(kc_manifest_equal(m, m2));
  /* file order is not part of the identity; the producer is */
  kc_file t = m2->files[0];
  m2->files[0] = m2->files[2];
  m2->files[2] = t;
  assert_true(kc_manifest_equal(m, m2));
  m2->producer.seconds = 2.5;
  assert_false(kc_manifest_equal(m, m2));
  assert_false(kc_manifest_equal(m, NULL));
  free(out);
  free(out2);
  /* a manifest whose key is stale does not serialize */
  m2->key[0] = m2->key[0] == '0' ? '1' : '0';
  EXPECT_ERR(kc_manifest_to_json(m2, &out, errbuf), KC_KEY_MISMATCH,
             "key: does not match the fields");
  assert_null(out);
  m2->key[0] = 'X';
  EXPECT_ERR(kc_manifest_to_json(m2, &out, errbuf), KC_BAD_MANIFEST,
             "key: must be 64 lowercase hex digits");
  EXPECT_ERR(kc_manifest_to_json(m, NULL, errbuf), KC_EINVAL, "NULL");
  EXPECT_ERR(kc_manifest_to_json(NULL, &out, errbuf), KC_EINVAL, "NULL");
  kc_manifest_free(m);
  kc_manifest_free(m2);
}

static void test_manifest_build(void **state) {
  (void)state;
  kc_manifest *m = kc_manifest_new();
  char *out = NULL;
  const char *entries[] = {"gemm"};
  assert_non_null(m);
  base_fields(&m->fields);
  EXPECT_ERR(kc_manifest_seal(m, errbuf), KC_BAD_MANIFEST,
             "files: at least one file required");
  assert_int_equal(kc_manifest_add_file(m, "gemm.cubin", SHA_A, 5632,
                                        KC_KIND_CUBIN, entries, 1, errbuf),
                   KC_OK);
  EXPECT_ERR(
      kc_manifest_add_file(m, "../x", SHA_A, 1, KC_KIND_FILE, NULL, 0, errbuf),
      KC_BAD_MANIFEST, "files[1].path: '..' segment not allowed");
  EXPECT_ERR(
      kc_manifest_add_file(m, NULL, SHA_A, 1, KC_KIND_FILE, NULL, 0, errbuf),
      KC_BAD_MANIFEST, "files[1].path: missing");
  const char short_sha[KC_HEX_LEN + 1] = "abc";
  EXPECT_ERR(
      kc_manifest_add_file(m, "x", short_sha, 1, KC_KIND_FILE, NULL, 0, errbuf),
      KC_BAD_MANIFEST, "files[1].sha256: must be 64 lowercase hex");
  EXPECT_ERR(kc_manifest_add_file(m, "x", SHA_A, P53 + 1, KC_KIND_FILE, NULL, 0,
                                  errbuf),
             KC_BAD_MANIFEST, "files[1].size: value above 2^53");
  EXPECT_ERR(
      kc_manifest_add_file(m, "x", SHA_A, 1, (kc_file_kind)9, NULL, 0, errbuf),
      KC_BAD_MANIFEST, "files[1].kind: unknown kind 9");
  const char *bad_entries[] = {"ok", "not ok"};
  EXPECT_ERR(kc_manifest_add_file(m, "x", SHA_A, 1, KC_KIND_FILE, bad_entries,
                                  2, errbuf),
             KC_BAD_MANIFEST, "files[1].entries[1]: 'not ok' is not a C");
  EXPECT_ERR(
      kc_manifest_add_file(m, "x", SHA_A, 1, KC_KIND_FILE, NULL, 2, errbuf),
      KC_BAD_MANIFEST, "files[1].entries: NULL with 2 entries");
  EXPECT_ERR(
      kc_manifest_add_file(NULL, "x", SHA_A, 1, KC_KIND_FILE, NULL, 0, errbuf),
      KC_EINVAL, "NULL");
  assert_int_equal(m->n_files, 1);
  assert_int_equal(kc_manifest_add_file(m, "sub/dir/gemm.ptx", SHA_B, 100,
                                        KC_KIND_PTX, NULL, 0, errbuf),
                   KC_OK);
  assert_int_equal(kc_manifest_seal(m, errbuf), KC_OK);
  assert_string_equal(m->key, KEY1);
  assert_int_equal(kc_manifest_check_key(m, errbuf), KC_OK);
  /* no producer: the field is left out */
  assert_int_equal(kc_manifest_to_json(m, &out, errbuf), KC_OK);
  assert_null(strstr(out, "producer"));
  free(out);
  /* seconds alone makes a producer; reals keep 15 significant digits */
  m->producer.seconds = 0.1;
  assert_int_equal(kc_manifest_to_json(m, &out, errbuf), KC_OK);
  assert_non_null(strstr(out, "\"producer\":{\"seconds\":0.1}"));
  free(out);
  /* duplicate paths appear only at validation */
  assert_int_equal(kc_manifest_add_file(m, "gemm.cubin", SHA_B, 1, KC_KIND_FILE,
                                        NULL, 0, errbuf),
                   KC_OK);
  EXPECT_ERR(kc_manifest_validate(m, errbuf), KC_BAD_MANIFEST,
             "files[2].path: duplicate of files[0].path 'gemm.cubin'");
  EXPECT_ERR(kc_manifest_seal(m, errbuf), KC_BAD_MANIFEST, "duplicate");
  kc_manifest_free(m);
}

static void test_manifest_validate_struct(void **state) {
  (void)state;
  kc_manifest *m = NULL;
  assert_int_equal(
      kc_manifest_parse(MANIFEST_JSON, strlen(MANIFEST_JSON), &m, errbuf),
      KC_OK);
  m->producer.seconds = -1;
  EXPECT_ERR(kc_manifest_validate(m, errbuf), KC_BAD_MANIFEST,
             "producer.seconds: must be a finite number >= 0");
  m->producer.seconds = NAN;
  EXPECT_ERR(kc_manifest_validate(m, errbuf), KC_BAD_MANIFEST,
             "producer.seconds: must be a finite number >= 0");
  m->producer.seconds = 0;
  m->producer.host[0] = (char)0xff;
  EXPECT_ERR(kc_manifest_validate(m, errbuf), KC_BAD_MANIFEST,
             "producer.host: not valid UTF-8");
  m->producer.host[0] = 'h';
  m->producer.builder[0] = (char)0xc3;
  m->producer.builder[1] = '\0';
  EXPECT_ERR(kc_manifest_validate(m, errbuf), KC_BAD_MANIFEST,
             "producer.builder: not valid UTF-8");
  m->producer.builder[0] = '\0';
  m->producer.created[0] = (char)0x80;
  EXPECT_ERR(kc_manifest_validate(m, errbuf), KC_BAD_MANIFEST,
             "producer.created: not valid UTF-8");
  m->producer.created[0] = '2';
  assert_int_equal(kc_manifest_validate(m, errbuf), KC_OK);
  strcpy(m->fields.arch, "sm_1");
  /* key field errors keep their text but become manifest errors */
  EXPECT_ERR(kc_manifest_validate(m, errbuf), KC_BAD_MANIFEST,
             "arch: 'sm_1' is not a valid arch");
  EXPECT_ERR(kc_manifest_check_key(m, errbuf), KC_BAD_MANIFEST, "arch:");
  strcpy(m->fields.arch, "sm_90a");
  memset(m->files[1].sha256, 'a', sizeof m->files[1].sha256);
  EXPECT_ERR(kc_manifest_validate(m, errbuf), KC_BAD_MANIFEST,
             "files[1].sha256: not NUL-terminated");
  m->files[1].sha256[KC_HEX_LEN] = '\0';
  m->files[0].entries[0][0] = '9';
  EXPECT_ERR(kc_manifest_validate(m, errbuf), KC_BAD_MANIFEST,
             "files[0].entries[0]: '9emm' is not a C identifier");
  free(m->files[0].entries[0]);
  m->files[0].entries[0] = NULL;
  EXPECT_ERR(kc_manifest_validate(m, errbuf), KC_BAD_MANIFEST,
             "files[0].entries[0]: missing");
  EXPECT_ERR(kc_manifest_validate(NULL, errbuf), KC_EINVAL, "NULL");
  EXPECT_ERR(kc_manifest_check_key(NULL, errbuf), KC_EINVAL, "NULL");
  kc_manifest_free(m);
}

static void test_path_validate(void **state) {
  (void)state;
  const char *good[] = {"a",          "a/b/c.cubin", "...",
                        "a..b/.c",    ".hidden",     "triton/abc/gemm.json",
                        "caf\xc3\xa9"};
  for (size_t i = 0; i < sizeof good / sizeof *good; i++)
    if (kc_path_validate(good[i], NULL, errbuf) != KC_OK)
      fail_msg("path %s: %s", good[i], errbuf);
  char p255[256];
  memset(p255, 'p', 255);
  p255[255] = '\0';
  assert_int_equal(kc_path_validate(p255, "x", errbuf), KC_OK);
  EXPECT_ERR(kc_path_validate("../up", NULL, errbuf), KC_UNSAFE_PATH,
             "path: '..' segment not allowed");
  EXPECT_ERR(kc_path_validate("a/b/..", "out", errbuf), KC_UNSAFE_PATH,
             "out: '..' segment not allowed");
  EXPECT_ERR(kc_path_validate("/abs", NULL, errbuf), KC_UNSAFE_PATH,
             "absolute path not allowed");
  EXPECT_ERR(kc_path_validate("a\\..\\b", NULL, errbuf), KC_UNSAFE_PATH,
             "backslash not allowed");
  EXPECT_ERR(kc_path_validate("", NULL, errbuf), KC_UNSAFE_PATH, "empty");
  EXPECT_ERR(kc_path_validate(NULL, NULL, errbuf), KC_UNSAFE_PATH, "missing");
}

static void test_file_kind(void **state) {
  (void)state;
  const char *names[] = {"cubin", "ptx", "fatbin", "ltoir", "file"};
  for (int k = KC_KIND_CUBIN; k <= KC_KIND_FILE; k++) {
    kc_file_kind out;
    assert_string_equal(kc_file_kind_name((kc_file_kind)k), names[k]);
    assert_int_equal(kc_file_kind_parse(names[k], &out), 0);
    assert_int_equal(out, k);
  }
  assert_string_equal(kc_file_kind_name((kc_file_kind)42), "unknown");
  assert_int_equal(kc_file_kind_parse("CUBIN", NULL), -1);
  assert_int_equal(kc_file_kind_parse(NULL, NULL), -1);
}

/* ---- warmup manifests ---- */

#define WARMUP_JSON                                                            \
  "{\"schema\":\"kcache.warmup/v1\","                                          \
  "\"model\":{\"name\":\"demo-mlp\",\"hash\":\"" M1 "\"},"                     \
  "\"archs\":[\"sm_80\",\"sm_90a\"],\"toolchain\":{\"app\":\"demo-1.2\"},"     \
  "\"kernels\":[{\"name\":\"gemm\",\"source\":\"kernels/gemm.cu\","            \
  "\"entries\":[\"gemm\"],\"options\":[\"--use_fast_math\"]},"                 \
  "{\"name\":\"softmax\",\"source\":\"/abs/softmax.cu\"}],"                    \
  "\"buckets\":[{\"batch\":1,\"seq\":128},{\"batch\":8,\"seq\":1024}]}"

#define BUILDER_JSON                                                           \
  "{\"schema\":\"kcache.warmup/v1\","                                          \
  "\"model\":{\"name\":\"demo\",\"hash\":\"" M2 "\"},"                         \
  "\"builder\":{\"command\":[\"python3\",\"warm.py\",\"--out\",\"{out}\"],"    \
  "\"timeout_s\":1200},\"buckets\":[{\"seq\":128}]}"

static kc_err parse_warmup(const char *json, size_t len, char *err) {
  kc_warmup *w = (kc_warmup *)1;
  kc_err e = kc_warmup_parse(json, len, "/srv", &w, err);
  if (e)
    assert_null(w);
  kc_warmup_free(w);
  return e;
}

static const rule_case warmup_cases[] = {
    {"schema", NULL, KC_BAD_WARMUP, "schema: missing"},
    {"schema", "\"kcache.bundle/v1\"", KC_BAD_WARMUP,
     "schema: must be 'kcache.warmup/v1'"},
    {"timeout_s", "600", KC_BAD_WARMUP, "warmup: unknown field(s): timeout_s"},
    /* model */
    {"model", NULL, KC_BAD_WARMUP, "model: missing"},
    {"model", "\"demo\"", KC_BAD_WARMUP, "model: must be an object"},
    {"model.version", "1", KC_BAD_WARMUP, "model: unknown field(s): version"},
    {"model.name", NULL, KC_BAD_WARMUP, "model.name: missing"},
    {"model.name", "\"\"", KC_BAD_WARMUP, "model.name: must be 1 to 255 bytes"},
    {"model.name", "\"a\\tb\"", KC_BAD_WARMUP, "model.name: must be 1 to 255"},
    {"model.name", "@path256", KC_BAD_WARMUP, "model.name: must be 1 to 255"},
    {"model.hash", NULL, KC_BAD_WARMUP, "model.hash: missing"},
    {"model.hash", "\"xyz\"", KC_BAD_WARMUP,
     "model.hash: must be 64 lowercase hex digits"},
    /* archs */
    {"archs", "\"sm_80\"", KC_BAD_WARMUP, "archs: must be an array"},
    {"archs", "[]", KC_BAD_WARMUP, "archs: empty"},
    {"archs.1", "\"sm_9\"", KC_BAD_WARMUP, "archs[1]: 'sm_9' is not a valid"},
    {"archs.1", "80", KC_BAD_WARMUP, "archs[1]: must be a string"},
    {"archs.2", "\"sm_80\"", KC_BAD_WARMUP,
     "archs[2]: duplicate of archs[0] 'sm_80'"},
    /* toolchain */
    {"toolchain", "[]", KC_BAD_WARMUP, "toolchain: must be an object"},
    {"toolchain.App", "\"1\"", KC_BAD_WARMUP, "toolchain: invalid name 'App'"},
    {"toolchain.app", "\"\\u00e9\"", KC_BAD_WARMUP,
     "toolchain.app: value must be printable ASCII"},
    {"toolchain.app", "@value129", KC_BAD_WARMUP,
     "toolchain.app: value longer than 128 bytes"},
    {"toolchain", "@tools33", KC_BAD_WARMUP, "toolchain: 33 entries"},
    /* kernels or builder */
    {"kernels", NULL, KC_BAD_WARMUP,
     "kernels: missing (give kernels or builder)"},
    {"builder", "{\"command\":[\"x\"]}", KC_BAD_WARMUP,
     "builder: not allowed together with kernels"},
    {"kernels", "{}", KC_BAD_WARMUP, "kernels: must be an array"},
    {"kernels", "[]", KC_BAD_WARMUP, "kernels: empty"},
    {"kernels.1", "[]", KC_BAD_WARMUP, "kernels[1]: must be an object"},
    {"kernels.0.defines", "[]", KC_BAD_WARMUP,
     "kernels[0]: unknown field(s): defines"},
    {"kernels.1.name", NULL, KC_BAD_WARMUP, "kernels[1].name: missing"},
    {"kernels.1.name", "\"a/b\"", KC_BAD_WARMUP,
     "kernels[1].name: 'a/b' is not a valid kernel name"},
    {"kernels.1.name", "\".x\"", KC_BAD_WARMUP, "is not a valid kernel name"},
    {"kernels.1.name", "@ident256", KC_BAD_WARMUP,
     "is not a valid kernel name"},
    {"kernels.1.name", "\"gemm\"", KC_BAD_WARMUP,
     "kernels[1].name: duplicate of kernels[0].name 'gemm'"},
    {"kernels.1.source", NULL, KC_BAD_WARMUP, "kernels[1].source: missing"},
    {"kernels.1.source", "\"\"", KC_BAD_WARMUP, "kernels[1].source: empty"},
    {"kernels.1.source", "1", KC_BAD_WARMUP,
     "kernels[1].source: must be a string"},
    {"kernels.0.entries", "\"gemm\"", KC_BAD_WARMUP,
     "kernels[0].entries: must be an array"},
    {"kernels.0.entries.0", "\"gemm()\"", KC_BAD_WARMUP,
     "kernels[0].entries[0]: 'gemm()' is not a C identifier"},
    {"kernels.0.options", "\"-O3\"", KC_BAD_WARMUP,
     "kernels[0].options: must be an array"},
    {"kernels.0.options.1", "3", KC_BAD_WARMUP,
     "kernels[0].options[1]: must be a string"},
    /* buckets */
    {"buckets", NULL, KC_BAD_WARMUP, "buckets: missing"},
    {"buckets", "{}", KC_BAD_WARMUP, "buckets: must be an array"},
    {"buckets", "[]", KC_BAD_WARMUP, "buckets: empty (at least one bucket)"},
    {"buckets.1", "8", KC_BAD_WARMUP, "buckets[1]: must be an object"},
    {"buckets.1", "{}", KC_BAD_WARMUP, "buckets[1]: empty (1 to 16 entries)"},
    {"buckets.1", "@bucket17", KC_BAD_WARMUP, "buckets[1]: 17 entries"},
    {"buckets.1.Seq", "1", KC_BAD_WARMUP, "buckets[1]: invalid name 'Seq'"},
    {"buckets.1.seq", "9007199254740993", KC_BAD_WARMUP,
     "buckets[1].seq: value above 2^53"},
    {"buckets.1.seq", "-1", KC_BAD_WARMUP, "buckets[1].seq: value below 0"},
    {"buckets.1.seq", "1.5", KC_BAD_WARMUP, "buckets[1].seq: must be an int"},
    {"buckets.2", "{\"seq\":128,\"batch\":1}", KC_BAD_WARMUP,
     "buckets[2]: duplicate of buckets[0]"},
};

/* Rules of the command builder, on BUILDER_JSON. */
static const rule_case builder_cases[] = {
    {"builder", "[]", KC_BAD_WARMUP, "builder: must be an object"},
    {"builder.env", "{}", KC_BAD_WARMUP, "builder: unknown field(s): env"},
    {"builder.command", NULL, KC_BAD_WARMUP, "builder.command: missing"},
    {"builder.command", "\"make\"", KC_BAD_WARMUP,
     "builder.command: must be an array"},
    {"builder.command", "[]", KC_BAD_WARMUP, "builder.command: empty"},
    {"builder.command.0", "\"\"", KC_BAD_WARMUP, "builder.command[0]: empty"},
    {"builder.command.2", "2", KC_BAD_WARMUP,
     "builder.command[2]: must be a string"},
    {"builder.timeout_s", "0", KC_BAD_WARMUP,
     "builder.timeout_s: value below 1"},
    {"builder.timeout_s", "86401", KC_BAD_WARMUP,
     "builder.timeout_s: value above 86400"},
    {"builder.timeout_s", "60.0", KC_BAD_WARMUP,
     "builder.timeout_s: must be an integer"},
    {"kernels", "[{\"name\":\"k\",\"source\":\"k.cu\"}]", KC_BAD_WARMUP,
     "builder: not allowed together with kernels"},
};

static void test_warmup_rules(void **state) {
  (void)state;
  assert_int_equal(parse_warmup(WARMUP_JSON, strlen(WARMUP_JSON), errbuf),
                   KC_OK);
  assert_int_equal(parse_warmup(BUILDER_JSON, strlen(BUILDER_JSON), errbuf),
                   KC_OK);
  run_cases(WARMUP_JSON, warmup_cases,
            sizeof warmup_cases / sizeof *warmup_cases, parse_warmup);
  run_cases(BUILDER_JSON, builder_cases,
            sizeof builder_cases / sizeof *builder_cases, parse_warmup);
  EXPECT_ERR(parse_warmup("{\"schema\":1,}", 13, errbuf), KC_BAD_JSON,
             "line 1, column");
  EXPECT_ERR(parse_warmup("\"x\"", 3, errbuf), KC_BAD_JSON, "line 1");
  EXPECT_ERR(parse_warmup("[]", 2, errbuf), KC_BAD_WARMUP,
             "warmup: must be an object");
  kc_warmup *w;
  EXPECT_ERR(kc_warmup_parse(WARMUP_JSON, 5, NULL, NULL, errbuf), KC_EINVAL,
             "NULL");
  EXPECT_ERR(kc_warmup_parse(NULL, 0, NULL, &w, errbuf), KC_EINVAL, "NULL");
}

static void test_warmup_fields(void **state) {
  (void)state;
  kc_warmup *w = NULL;
  assert_int_equal(
      kc_warmup_parse(WARMUP_JSON, strlen(WARMUP_JSON), "/srv/app", &w, errbuf),
      KC_OK);
  assert_string_equal(w->model_name, "demo-mlp");
  assert_string_equal(w->model_hash, M1);
  assert_int_equal(w->n_archs, 2);
  assert_string_equal(w->archs[1], "sm_90a");
  assert_int_equal(w->n_tools, 1);
  assert_string_equal(w->tools[0].name, "app");
  assert_string_equal(w->tools[0].value, "demo-1.2");
  assert_int_equal(w->n_kernels, 2);
  assert_string_equal(w->kernels[0].name, "gemm");
  assert_string_equal(w->kernels[0].source, "/srv/app/kernels/gemm.cu");
  assert_string_equal(w->kernels[1].source, "/abs/softmax.cu");
  assert_int_equal(w->kernels[0].n_entries, 1);
  assert_string_equal(w->kernels[0].entries[0], "gemm");
  assert_int_equal(w->kernels[0].n_options, 1);
  assert_string_equal(w->kernels[0].options[0], "--use_fast_math");
  assert_int_equal(w->kernels[1].n_entries, 0);
  assert_int_equal(w->n_command, 0);
  assert_int_equal(w->timeout_s, 600);
  assert_int_equal(w->n_buckets, 2);
  assert_int_equal(w->buckets[1].n, 2);
  assert_string_equal(w->base_dir, "/srv/app");
  kc_warmup_free(w);

  /* no base: relative sources stay relative to the working directory */
  assert_int_equal(
      kc_warmup_parse(WARMUP_JSON, strlen(WARMUP_JSON), NULL, &w, errbuf),
      KC_OK);
  assert_string_equal(w->base_dir, ".");
  assert_string_equal(w->kernels[0].source, "kernels/gemm.cu");
  kc_warmup_free(w);
  assert_int_equal(
      kc_warmup_parse(WARMUP_JSON, strlen(WARMUP_JSON), "rel/", &w, errbuf),
      KC_OK);
  assert_string_equal(w->kernels[0].source, "rel/kernels/gemm.cu");
  kc_warmup_free(w);

  assert_int_equal(
      kc_warmup_parse(BUILDER_JSON, strlen(BUILDER_JSON), "/x", &w, errbuf),
      KC_OK);
  assert_int_equal(w->n_kernels, 0);
  assert_int_equal(w->n_archs, 0);
  assert_int_equal(w->n_tools, 0);
  assert_int_equal(w->n_command, 4);
  assert_string_equal(w->command[0], "python3");
  assert_string_equal(w->command[3], "{out}");
  assert_int_equal(w->timeout_s, 1200);
  kc_warmup_free(w);
  kc_warmup_free(NULL);
}

static void test_warmup_load(void **state) {
  kc_warmup *w = NULL;
  char *sub = path_join(*state, "svc");
  assert_int_equal(mkdir(sub, 0700), 0);
  char *file = path_join(sub, "warmup.json");
  write_file(file, WARMUP_JSON);
  assert_int_equal(kc_warmup_load(file, &w, errbuf), KC_OK);
  assert_string_equal(w->base_dir, sub);
  char *src = path_join(sub, "kernels/gemm.cu");
  assert_string_equal(w->kernels[0].source, src);
  kc_warmup_free(w);
  free(src);
  write_file(file, "{\"schema\":\"kcache.warmup/v1\"}");
  EXPECT_ERR(kc_warmup_load(file, &w, errbuf), KC_BAD_WARMUP, "model: missing");
  assert_non_null(strstr(errbuf, "warmup.json: "));
  assert_null(w);
  write_file(file, "{oops");
  EXPECT_ERR(kc_warmup_load(file, &w, errbuf), KC_BAD_JSON, "line 1");
  free(file);
  file = path_join(sub, "absent.json");
  EXPECT_ERR(kc_warmup_load(file, &w, errbuf), KC_IO,
             "absent.json: No such file or directory");
  free(file);
  free(sub);
  EXPECT_ERR(kc_warmup_load(NULL, &w, errbuf), KC_EINVAL, "NULL");
}

/* ---- bucket helpers ---- */

static void test_bucket_pow2(void **state) {
  (void)state;
  static const struct {
    uint64_t n, min, max, want;
  } ok[] = {
      {0, 1, 1024, 1},
      {0, 16, 1024, 16},
      {1, 1, 1024, 1},
      {2, 1, 1024, 2},
      {3, 1, 1024, 4},
      {5, 1, 1024, 8},
      {8, 1, 1024, 8},
      {9, 1, 1024, 16},
      {1023, 1, 1024, 1024},
      {1024, 1, 1024, 1024},
      {3, 4, 64, 4},
      {600, 1, 1000, 1000},
      {1000, 1, 1000, 1000},
      {7, 7, 7, 7},
      {1, 3, 100, 3},
      {(1ULL << 63) + 1, 1, UINT64_MAX, UINT64_MAX},
      {1ULL << 63, 1, UINT64_MAX, 1ULL << 63},
      {UINT64_MAX, 1, UINT64_MAX, UINT64_MAX},
      {P53, 1, P53, P53},
  };
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    uint64_t out = 0;
    assert_int_equal(kc_bucket_pow2(ok[i].n, ok[i].min, ok[i].max, &out),
                     KC_OK);
    if (out != ok[i].want)
      fail_msg("pow2 case %zu: got %llu", i, (unsigned long long)out);
  }
  uint64_t out = 42;
  assert_int_equal(kc_bucket_pow2(1025, 1, 1024, &out), KC_TOO_LARGE);
  assert_int_equal(kc_bucket_pow2(8, 7, 7, &out), KC_TOO_LARGE);
  assert_int_equal(out, 42);
  assert_int_equal(kc_bucket_pow2(1, 0, 8, &out), KC_EINVAL);
  assert_int_equal(kc_bucket_pow2(1, 1, 0, &out), KC_EINVAL);
  assert_int_equal(kc_bucket_pow2(1, 16, 8, &out), KC_EINVAL);
  assert_int_equal(kc_bucket_pow2(1, 1, 8, NULL), KC_EINVAL);
}

static void test_bucket_boundary(void **state) {
  (void)state;
  const uint64_t b[] = {128, 512, 2048};
  static const struct {
    uint64_t n, want;
  } ok[] = {{0, 128},   {1, 128},   {127, 128},  {128, 128},
            {129, 512}, {512, 512}, {513, 2048}, {2048, 2048}};
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    uint64_t out = 0;
    assert_int_equal(kc_bucket_boundary(ok[i].n, b, 3, &out), KC_OK);
    assert_int_equal(out, ok[i].want);
  }
  uint64_t out = 42;
  assert_int_equal(kc_bucket_boundary(2049, b, 3, &out), KC_TOO_LARGE);
  assert_int_equal(kc_bucket_boundary(UINT64_MAX, b, 3, &out), KC_TOO_LARGE);
  assert_int_equal(out, 42);
  const uint64_t one[] = {64}, top[] = {1, UINT64_MAX};
  assert_int_equal(kc_bucket_boundary(64, one, 1, &out), KC_OK);
  assert_int_equal(out, 64);
  assert_int_equal(kc_bucket_boundary(65, one, 1, &out), KC_TOO_LARGE);
  assert_int_equal(kc_bucket_boundary(UINT64_MAX, top, 2, &out), KC_OK);
  assert_int_equal(out, UINT64_MAX);
  const uint64_t same[] = {128, 128}, down[] = {512, 128},
                 late[] = {1, 2, 3, 2};
  assert_int_equal(kc_bucket_boundary(1, same, 2, &out), KC_EINVAL);
  assert_int_equal(kc_bucket_boundary(1, down, 2, &out), KC_EINVAL);
  /* checked in full, even past the answer */
  assert_int_equal(kc_bucket_boundary(1, late, 4, &out), KC_EINVAL);
  assert_int_equal(kc_bucket_boundary(1, NULL, 3, &out), KC_EINVAL);
  assert_int_equal(kc_bucket_boundary(1, b, 0, &out), KC_EINVAL);
  assert_int_equal(kc_bucket_boundary(1, b, 3, NULL), KC_EINVAL);
}

/* ---- the examples shared with check_json_schema.py ---- */

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

typedef kc_err (*example_fn)(const char *dir, const char *text, size_t len,
                             char *err);

static kc_err example_bundle(const char *dir, const char *text, size_t len,
                             char *err) {
  (void)dir;
  return parse_manifest(text, len, err);
}

static kc_err example_warmup(const char *dir, const char *text, size_t len,
                             char *err) {
  kc_warmup *w = NULL;
  kc_err e = kc_warmup_parse(text, len, dir, &w, err);
  kc_warmup_free(w);
  return e;
}

/* Runs every *.json of kind/which; returns how many there were. */
static size_t run_examples(const char *kind, const char *which, example_fn fn,
                           int want_ok) {
  char rel[64], *names[256];
  size_t n = 0;
  snprintf(rel, sizeof rel, "schema_examples/%s/%s", kind, which);
  char *dir = path_join(tests_dir, rel);
  DIR *d = opendir(dir);
  if (!d)
    fail_msg("%s: %s", dir, strerror(errno));
  for (struct dirent *e; (e = readdir(d));) {
    size_t l = strlen(e->d_name);
    if (l > 5 && strcmp(e->d_name + l - 5, ".json") == 0 && n < 256)
      names[n++] = strdup(e->d_name);
  }
  closedir(d);
  qsort(names, n, sizeof *names, cmp_str);
  for (size_t i = 0; i < n; i++) {
    char *path = path_join(dir, names[i]), *text;
    size_t len;
    assert_int_equal(kc_read_file(path, &text, &len, errbuf), KC_OK);
    errbuf[0] = '\0';
    kc_err e = fn(dir, text, len, errbuf);
    if ((e == KC_OK) != want_ok)
      fail_msg("%s: got %s %s", path, kc_err_name(e), errbuf);
    if (!want_ok)
      print_message("  %s/%s/%s: %s\n", kind, which, names[i], errbuf);
    free(text);
    free(path);
    free(names[i]);
  }
  free(dir);
  return n;
}

static void test_examples(void **state) {
  (void)state;
  static const char *const kinds[] = {"bundle", "warmup"};
  for (size_t k = 0; k < 2; k++) {
    example_fn fn = k == 0 ? example_bundle : example_warmup;
    assert_true(run_examples(kinds[k], "good", fn, 1) > 0);
    assert_true(run_examples(kinds[k], "bad", fn, 0) > 0);
    /* rules JSON Schema cannot state (key == hash, unique paths, ...) */
    assert_true(run_examples(kinds[k], "bad_c_only", fn, 0) > 0);
  }
}

int main(int argc, char **argv) {
  if (argc > 1)
    tests_dir = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sha256),
      cmocka_unit_test_setup_teardown(test_sha256_file, tmpdir_setup,
                                      tmpdir_teardown),
      cmocka_unit_test(test_is_hex64),
      cmocka_unit_test(test_hex_and_clocks),
      cmocka_unit_test_setup_teardown(test_read_file, tmpdir_setup,
                                      tmpdir_teardown),
      cmocka_unit_test(test_arch),
      cmocka_unit_test(test_key_vectors),
      cmocka_unit_test(test_key_vectors_parsed),
      cmocka_unit_test(test_key_canonical_matches_jansson),
      cmocka_unit_test(test_manifest_canonical_matches_jansson),
      cmocka_unit_test(test_manifest_path_not_utf8),
      cmocka_unit_test(test_manifest_real_in_comma_locale),
      cmocka_unit_test(test_key_validate_model_build_arch),
      cmocka_unit_test(test_key_validate_bucket),
      cmocka_unit_test(test_key_validate_toolchain),
      cmocka_unit_test(test_key_canonical_errors),
      cmocka_unit_test(test_key_order_independent),
      cmocka_unit_test(test_key_set_tool),
      cmocka_unit_test(test_key_fields_parse),
      cmocka_unit_test(test_manifest_rules),
      cmocka_unit_test(test_manifest_parse_fields),
      cmocka_unit_test(test_manifest_to_json),
      cmocka_unit_test(test_manifest_build),
      cmocka_unit_test(test_manifest_validate_struct),
      cmocka_unit_test(test_path_validate),
      cmocka_unit_test(test_file_kind),
      cmocka_unit_test(test_warmup_rules),
      cmocka_unit_test(test_warmup_fields),
      cmocka_unit_test_setup_teardown(test_warmup_load, tmpdir_setup,
                                      tmpdir_teardown),
      cmocka_unit_test(test_bucket_pow2),
      cmocka_unit_test(test_bucket_boundary),
      cmocka_unit_test(test_examples),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
