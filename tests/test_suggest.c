/* test_suggest.c: the bucket suggestion of `kcache suggest` (client/suggest.c)
 * against brute force on small random inputs: the 1-D dynamic programme
 * against every choice of boundaries, and the product over two dimensions
 * against every product grid; plus the waste function and bad input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "suggest.h"

static unsigned rng = 12345;
static unsigned rnd(unsigned n) {
  rng = rng * 1103515245u + 12345u;
  return (rng >> 16) % n;
}

/* The waste of bounds (ascending) over p; COST_MAX-ish when a value is above
 * the last. */
static kcc_cost waste_1d(const kcc_point *p, size_t n, const uint64_t *b,
                         size_t nb) {
  kcc_cost w = 0;
  for (size_t i = 0; i < n; i++) {
    size_t j = 0;
    while (j < nb && b[j] < p[i].value)
      j++;
    if (j == nb)
      return ~(kcc_cost)0;
    w += (kcc_cost)(b[j] - p[i].value) * p[i].count;
  }
  return w;
}

/* Distinct values of p, ascending, into v; their number. */
static size_t values(const kcc_point *p, size_t n, uint64_t *v) {
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    size_t j = 0;
    while (j < m && v[j] != p[i].value)
      j++;
    if (j == m)
      v[m++] = p[i].value;
  }
  for (size_t i = 1; i < m; i++)
    for (size_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
      uint64_t t = v[j];
      v[j] = v[j - 1];
      v[j - 1] = t;
    }
  return m;
}

/* Every subset of at most k distinct values (the largest always in). */
static kcc_cost brute_1d(const kcc_point *p, size_t n, size_t k) {
  uint64_t v[32], b[32];
  size_t m = values(p, n, v);
  kcc_cost best = ~(kcc_cost)0;
  for (unsigned mask = 0; mask < (1u << m); mask++) {
    size_t nb = 0;
    for (size_t i = 0; i < m; i++)
      if (mask >> i & 1)
        b[nb++] = v[i];
    if (nb == 0 || nb > k)
      continue;
    kcc_cost w = waste_1d(p, n, b, nb);
    best = w < best ? w : best;
  }
  return best;
}

static void random_points(kcc_point *p, size_t n, unsigned range) {
  for (size_t i = 0; i < n; i++)
    p[i] = (kcc_point){rnd(range), 1 + rnd(6)};
}

static void t_dp_matches_brute_force(void **state) {
  (void)state;
  for (int round = 0; round < 3000; round++) {
    kcc_point p[12];
    size_t n = 1 + rnd(12), k = 1 + rnd(6), nb;
    random_points(p, n, round % 2 ? 12 : 1000);
    uint64_t b[KCC_SUGGEST_K_MAX];
    kcc_cost w;
    assert_int_equal(kcc_suggest_1d(p, n, k, b, &nb, &w), KC_OK);
    kcc_cost want = brute_1d(p, n, k);
    if (w != want)
      fail_msg("round %d: dp %llu, brute force %llu", round,
               (unsigned long long)w, (unsigned long long)want);
    /* The boundaries it returns have the waste it says. */
    assert_true(waste_1d(p, n, b, nb) == w);
    uint64_t v[32];
    size_t m = values(p, n, v);
    assert_int_equal(nb, k < m ? k : m);
    assert_int_equal(b[nb - 1], v[m - 1]);
    for (size_t i = 1; i < nb; i++)
      assert_true(b[i - 1] < b[i]);
  }
}

static void t_dp_edges(void **state) {
  (void)state;
  uint64_t b[KCC_SUGGEST_K_MAX];
  size_t nb = 99;
  kcc_cost w = 7;
  assert_int_equal(kcc_suggest_1d(NULL, 0, 3, b, &nb, &w), KC_OK);
  assert_int_equal(nb, 0);
  assert_true(w == 0);
  kcc_point p[3] = {{8, 1}, {1, 1}, {8, 5}};
  assert_int_equal(kcc_suggest_1d(p, 3, 0, b, &nb, &w), KC_EINVAL);
  assert_int_equal(kcc_suggest_1d(p, 3, KCC_SUGGEST_K_MAX + 1, b, &nb, &w),
                   KC_EINVAL);
  /* As many buckets as values: no padding. */
  assert_int_equal(kcc_suggest_1d(p, 3, 5, b, &nb, &w), KC_OK);
  assert_int_equal(nb, 2);
  assert_true(w == 0);
  /* One bucket: the largest value; 1 pads by 7. */
  assert_int_equal(kcc_suggest_1d(p, 3, 1, b, &nb, &w), KC_OK);
  assert_int_equal(b[0], 8);
  assert_true(w == 7);
  /* Exact past 64 bits: 2^53 x 2^32 x 2 counts. */
  kcc_point big[2] = {{0, 4294967295u}, {1ull << 53, 1}};
  assert_int_equal(kcc_suggest_1d(big, 2, 1, b, &nb, &w), KC_OK);
  assert_true(w == (kcc_cost)(1ull << 53) * 4294967295u);
  char text[40];
  kcc_cost_text(w, text);
  assert_string_equal(text, "38685626218660934335856640");
}

/* n random 2-D shapes (batch, seq) with small values. */
static void random_shapes(kcc_shape *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    memset(&s[i], 0, sizeof s[i]);
    s[i].shape.n = 2;
    /* Names out of order on purpose: suggest sorts them. */
    snprintf(s[i].shape.dims[0].name, sizeof s[i].shape.dims[0].name, "seq");
    snprintf(s[i].shape.dims[1].name, sizeof s[i].shape.dims[1].name, "batch");
    s[i].shape.dims[0].value = rnd(9);
    s[i].shape.dims[1].value = 1 + rnd(7);
    s[i].count = 1 + rnd(4);
  }
}

/* The least waste over every product grid with at most k values per
 * dimension, each the set of some observed values. */
static kcc_cost brute_grid(const kcc_shape *s, size_t n, size_t k) {
  kcc_point pb[16], ps[16];
  uint64_t vb[32], vs[32];
  for (size_t i = 0; i < n; i++) {
    pb[i] = (kcc_point){s[i].shape.dims[1].value, s[i].count};
    ps[i] = (kcc_point){s[i].shape.dims[0].value, s[i].count};
  }
  size_t mb = values(pb, n, vb), ms = values(ps, n, vs);
  kcc_cost best = ~(kcc_cost)0;
  kc_bucket grid[64];
  for (unsigned x = 1; x < (1u << mb); x++)
    for (unsigned y = 1; y < (1u << ms); y++) {
      if ((size_t)__builtin_popcount(x) > k ||
          (size_t)__builtin_popcount(y) > k)
        continue;
      size_t ng = 0;
      for (size_t i = 0; i < mb; i++)
        for (size_t j = 0; j < ms; j++)
          if ((x >> i & 1) && (y >> j & 1)) {
            kc_bucket *g = &grid[ng++];
            memset(g, 0, sizeof *g);
            g->n = 2;
            snprintf(g->dims[0].name, sizeof g->dims[0].name, "batch");
            snprintf(g->dims[1].name, sizeof g->dims[1].name, "seq");
            g->dims[0].value = vb[i];
            g->dims[1].value = vs[j];
          }
      kcc_cost w;
      uint64_t beyond;
      kcc_suggest_waste(s, n, grid, ng, &w, &beyond);
      if (!beyond && w < best)
        best = w;
    }
  return best;
}

static void t_grid_matches_brute_force(void **state) {
  (void)state;
  for (int round = 0; round < 300; round++) {
    kcc_shape s[16];
    size_t n = 1 + rnd(10), k = 1 + rnd(3), nout;
    random_shapes(s, n);
    kc_bucket *out;
    kcc_cost w, w2;
    uint64_t beyond;
    char err[KC_ERRBUF_SIZE];
    assert_int_equal(kcc_suggest(s, n, k, &out, &nout, &w, err), KC_OK);
    assert_true(w == brute_grid(s, n, k));
    /* Its buckets hold every shape, with the waste it says, and are at most
     * k per dimension and one per distinct shape. */
    kcc_suggest_waste(s, n, out, nout, &w2, &beyond);
    assert_int_equal(beyond, 0);
    assert_true(w2 == w);
    assert_true(nout <= k * k && nout <= n);
    free(out);
  }
}

static void t_waste_and_bad_input(void **state) {
  (void)state;
  kcc_shape s[2];
  memset(s, 0, sizeof s);
  s[0].shape.n = 1;
  strcpy(s[0].shape.dims[0].name, "batch");
  s[0].shape.dims[0].value = 3;
  s[0].count = 2;
  s[1] = s[0];
  s[1].shape.dims[0].value = 100;
  kc_bucket b = {.n = 1, .dims = {{"batch", 8}}};
  kcc_cost w;
  uint64_t beyond;
  kcc_suggest_waste(s, 2, &b, 1, &w, &beyond);
  assert_true(w == 10);        /* 2 x (8 - 3) */
  assert_int_equal(beyond, 2); /* 100 is past the largest bucket */
  kc_bucket other = {.n = 1, .dims = {{"seq", 128}}};
  kcc_suggest_waste(s, 1, &other, 1, &w, &beyond);
  assert_int_equal(beyond, 2); /* other dimensions hold nothing */
  strcpy(s[1].shape.dims[0].name, "seq");
  kc_bucket *out;
  size_t n;
  char err[KC_ERRBUF_SIZE];
  assert_int_equal(kcc_suggest(s, 2, 2, &out, &n, &w, err), KC_EINVAL);
  assert_non_null(strstr(err, "different dimensions"));
  assert_int_equal(kcc_suggest(s, 1, 0, &out, &n, &w, err), KC_EINVAL);
}

/* The worst case kcached can hold: 4096 distinct values, k = 16. */
static void t_dp_large(void **state) {
  (void)state;
  static kcc_point p[4096];
  for (size_t i = 0; i < 4096; i++)
    p[i] = (kcc_point){i * 3 + 1, 1 + rnd(100)};
  uint64_t b[KCC_SUGGEST_K_MAX];
  size_t nb;
  kcc_cost w;
  clock_t t0 = clock();
  assert_int_equal(kcc_suggest_1d(p, 4096, 16, b, &nb, &w), KC_OK);
  assert_int_equal(nb, 16);
  assert_int_equal(b[15], 4095 * 3 + 1);
  assert_true(waste_1d(p, 4096, b, nb) == w);
  print_message("4096 values, k 16: %.2f s\n",
                (double)(clock() - t0) / CLOCKS_PER_SEC);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_dp_matches_brute_force),
      cmocka_unit_test(t_dp_edges),
      cmocka_unit_test(t_grid_matches_brute_force),
      cmocka_unit_test(t_waste_and_bad_input),
      cmocka_unit_test(t_dp_large),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
