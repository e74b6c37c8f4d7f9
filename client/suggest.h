/* suggest.h: bucket suggestion from observed demand (`kcache suggest`):
 * optimal 1-D segmentation by dynamic programming, and its product over
 * several dimensions. Internal to libkcache (the CLI and tests/test_suggest.c
 * use it); never installed.
 *
 * Cost. A shape runs in the smallest bucket that holds it: one with the same
 * dimension names and every value >= the shape's. Its padding is the sum over
 * dimensions of (bucket value - shape value); the waste of a set of buckets
 * is the sum over observed shapes of count x padding. A shape no bucket holds
 * adds nothing to the waste and is counted apart (`beyond`).
 *
 * One dimension. Given weighted values, kcc_suggest_1d picks at most k
 * boundaries among the observed values, the largest always among them, that
 * minimise the waste: dp[j][i] = min over a of dp[j-1][a-1] + cost(a..i),
 * cost(a..i) = x_i * W(a..i) - S(a..i) from prefix sums; exact, O(k n^2) time
 * for n distinct values. (A boundary between observed values only adds
 * padding, so the optimum uses observed values.)
 *
 * Several dimensions. Each dimension is segmented on its marginal (the
 * counts of each of its values over all shapes), and the buckets are the
 * cells of the product grid of those boundaries that some observed shape
 * falls in (at most k^d, at most one per distinct shape). Because the padding
 * is a sum over dimensions and a grid cell's dimensions are chosen
 * independently, this is exactly the least waste over all product grids with
 * at most k boundaries per dimension; it is not always the least over every
 * set of buckets (a non-grid set can do better with the same count). */
#ifndef KCC_SUGGEST_H
#define KCC_SUGGEST_H

#include <stddef.h>
#include <stdint.h>

#include "kc_schema.h"

#define KCC_SUGGEST_K_MAX 64 /* boundaries per dimension */

/* Padding totals are exact: count (2^64) x value (2^53) overflows 64 bits. */
typedef unsigned __int128 kcc_cost;

typedef struct kcc_point {
  uint64_t value;
  uint64_t count;
} kcc_point;

typedef struct kcc_shape {
  kc_bucket shape;
  uint64_t count;
} kcc_shape;

/* Optimal boundaries of p[0..n) (any order; equal values are merged), at
 * most k (1..KCC_SUGGEST_K_MAX): bounds (k entries) ascending, *n_bounds,
 * *waste. n == 0: no bounds, waste 0. KC_EINVAL on a bad k, KC_NOMEM. */
kc_err kcc_suggest_1d(const kcc_point *p, size_t n, size_t k, uint64_t *bounds,
                      size_t *n_bounds, kcc_cost *waste);

/* The waste of buckets b[0..nb) for shapes s[0..n), and the count of shapes
 * no bucket holds. */
void kcc_suggest_waste(const kcc_shape *s, size_t n, const kc_bucket *b,
                       size_t nb, kcc_cost *waste, uint64_t *beyond);

/* Suggested buckets for s[0..n), which must all have the same dimension
 * names: per dimension kcc_suggest_1d on its marginal, then the observed
 * cells of the product grid, sorted. *out malloc'd (free), *n_out; *waste
 * their waste. KC_EINVAL when the shapes' dimensions differ or k is bad. */
kc_err kcc_suggest(const kcc_shape *s, size_t n, size_t k, kc_bucket **out,
                   size_t *n_out, kcc_cost *waste, char *err);

/* A cost as decimal text (out: 40 bytes). */
void kcc_cost_text(kcc_cost c, char out[40]);

#endif
