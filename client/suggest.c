/* suggest.c: buckets that minimise padding over observed shapes (suggest.h
 * says the cost, the 1-D dynamic programme and the product over dimensions). */
#include <stdlib.h>
#include <string.h>

#include "suggest.h"

#define COST_MAX (~(kcc_cost)0)

static int cmp_point(const void *a, const void *b) {
  uint64_t x = ((const kcc_point *)a)->value, y = ((const kcc_point *)b)->value;
  return x < y ? -1 : x > y;
}

/* Sorts and merges equal values into q (malloc'd); the distinct count. */
static size_t distinct(const kcc_point *p, size_t n, kcc_point **q) {
  *q = malloc((n + 1) * sizeof **q);
  if (!*q)
    return 0;
  memcpy(*q, p, n * sizeof *p);
  qsort(*q, n, sizeof **q, cmp_point);
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (m && (*q)[m - 1].value == (*q)[i].value)
      (*q)[m - 1].count += (*q)[i].count;
    else
      (*q)[m++] = (*q)[i];
  }
  return m;
}

/* The DP over x[1..n] (1-based, prefix sums W, S) with k segments; fills
 * cut[j * (n + 1) + i] = the first index of the last segment. */
static kcc_cost dp_run(const kcc_point *x, size_t n, size_t k,
                       const kcc_cost *W, const kcc_cost *S, uint32_t *cut,
                       kcc_cost *prev, kcc_cost *cur) {
#define SEG(a, i)                                                              \
  ((kcc_cost)x[(i)-1].value * (W[i] - W[(a)-1]) - (S[i] - S[(a)-1]))
  for (size_t i = 1; i <= n; i++) {
    prev[i] = SEG(1, i);
    cut[1 * (n + 1) + i] = 1;
  }
  for (size_t j = 2; j <= k; j++) {
    for (size_t i = j; i <= n; i++) {
      kcc_cost best = COST_MAX;
      uint32_t at = (uint32_t)i;
      for (size_t a = j; a <= i; a++) {
        kcc_cost c = prev[a - 1] + SEG(a, i);
        if (c < best) {
          best = c;
          at = (uint32_t)a;
        }
      }
      cur[i] = best;
      cut[j * (n + 1) + i] = at;
    }
    memcpy(prev + j, cur + j, (n + 1 - j) * sizeof *cur);
  }
#undef SEG
  return prev[n];
}

kc_err kcc_suggest_1d(const kcc_point *p, size_t n, size_t k, uint64_t *bounds,
                      size_t *n_bounds, kcc_cost *waste) {
  *n_bounds = 0;
  *waste = 0;
  if (k < 1 || k > KCC_SUGGEST_K_MAX)
    return KC_EINVAL;
  if (!n)
    return KC_OK;
  kcc_point *x;
  size_t m = distinct(p, n, &x);
  if (!m)
    return KC_NOMEM;
  size_t kk = k < m ? k : m; /* more segments never cost more */
  kcc_cost *W = calloc(m + 1, sizeof *W), *S = calloc(m + 1, sizeof *S);
  kcc_cost *prev = calloc(m + 1, sizeof *prev),
           *cur = calloc(m + 1, sizeof *cur);
  uint32_t *cut = calloc((kk + 1) * (m + 1), sizeof *cut);
  kc_err e = W && S && prev && cur && cut ? KC_OK : KC_NOMEM;
  for (size_t i = 1; !e && i <= m; i++) {
    W[i] = W[i - 1] + x[i - 1].count;
    S[i] = S[i - 1] + (kcc_cost)x[i - 1].count * x[i - 1].value;
  }
  if (!e) {
    *waste = dp_run(x, m, kk, W, S, cut, prev, cur);
    /* Walk the cuts back from the last value: each segment's boundary is
     * its largest value. */
    size_t i = m;
    for (size_t j = kk; j >= 1 && i >= 1; j--) {
      bounds[j - 1] = x[i - 1].value;
      i = cut[j * (m + 1) + i] - 1;
    }
    *n_bounds = kk;
  }
  free(W), free(S), free(prev), free(cur), free(cut), free(x);
  return e;
}

/* ---- several dimensions ---- */

static int cmp_dim(const void *a, const void *b) {
  return strcmp(((const kc_dim *)a)->name, ((const kc_dim *)b)->name);
}

static kc_bucket sorted(const kc_bucket *b) {
  kc_bucket s = *b;
  qsort(s.dims, s.n, sizeof s.dims[0], cmp_dim);
  return s;
}

/* The padding of shape s (sorted) in bucket b; COST_MAX when b does not hold
 * it. */
static kcc_cost pad(const kc_bucket *s, const kc_bucket *b) {
  kc_bucket t = sorted(b);
  if (t.n != s->n)
    return COST_MAX;
  kcc_cost c = 0;
  for (size_t i = 0; i < s->n; i++) {
    if (strcmp(t.dims[i].name, s->dims[i].name) ||
        t.dims[i].value < s->dims[i].value)
      return COST_MAX;
    c += t.dims[i].value - s->dims[i].value;
  }
  return c;
}

void kcc_suggest_waste(const kcc_shape *s, size_t n, const kc_bucket *b,
                       size_t nb, kcc_cost *waste, uint64_t *beyond) {
  *waste = 0;
  *beyond = 0;
  for (size_t i = 0; i < n; i++) {
    kc_bucket sh = sorted(&s[i].shape);
    kcc_cost best = COST_MAX;
    for (size_t j = 0; j < nb; j++) {
      kcc_cost c = pad(&sh, &b[j]);
      best = c < best ? c : best;
    }
    if (best == COST_MAX)
      *beyond += s[i].count;
    else
      *waste += best * s[i].count;
  }
}

static int cmp_bucket(const void *a, const void *b) {
  const kc_bucket *x = a, *y = b;
  for (size_t i = 0; i < x->n; i++)
    if (x->dims[i].value != y->dims[i].value)
      return x->dims[i].value < y->dims[i].value ? -1 : 1;
  return 0;
}

/* The smallest bound >= v (bounds ascending, the last >= every value). */
static uint64_t bound_of(const uint64_t *bounds, size_t nb, uint64_t v) {
  size_t lo = 0, hi = nb - 1;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (bounds[mid] >= v)
      hi = mid;
    else
      lo = mid + 1;
  }
  return bounds[lo];
}

/* Segments dimension d of the (sorted) shapes on its marginal. */
static kc_err one_dim(const kcc_shape *s, const kc_bucket *sh, size_t n,
                      size_t d, size_t k, uint64_t *bounds, size_t *nb,
                      kcc_cost *waste) {
  kcc_point *p = malloc((n + 1) * sizeof *p);
  if (!p)
    return KC_NOMEM;
  for (size_t i = 0; i < n; i++)
    p[i] = (kcc_point){sh[i].dims[d].value, s[i].count};
  kc_err e = kcc_suggest_1d(p, n, k, bounds, nb, waste);
  free(p);
  return e;
}

/* The observed cells: each shape padded per dimension, then deduplicated. */
static size_t cells(kc_bucket *sh, size_t n,
                    uint64_t (*bounds)[KCC_SUGGEST_K_MAX], const size_t *nb) {
  for (size_t i = 0; i < n; i++)
    for (size_t d = 0; d < sh[i].n; d++)
      sh[i].dims[d].value = bound_of(bounds[d], nb[d], sh[i].dims[d].value);
  qsort(sh, n, sizeof *sh, cmp_bucket);
  size_t m = 0;
  for (size_t i = 0; i < n; i++)
    if (!m || cmp_bucket(&sh[m - 1], &sh[i]))
      sh[m++] = sh[i];
  return m;
}

static kc_err check_names(const kc_bucket *sh, size_t n, char *err) {
  for (size_t i = 1; i < n; i++) {
    int same = sh[i].n == sh[0].n;
    for (size_t d = 0; same && d < sh[0].n; d++)
      same = !strcmp(sh[i].dims[d].name, sh[0].dims[d].name);
    if (!same)
      return kc_errf(err, KC_EINVAL,
                     "shapes %zu and 0 have different dimensions", i);
  }
  return KC_OK;
}

kc_err kcc_suggest(const kcc_shape *s, size_t n, size_t k, kc_bucket **out,
                   size_t *n_out, kcc_cost *waste, char *err) {
  *out = NULL;
  *n_out = 0;
  *waste = 0;
  if (k < 1 || k > KCC_SUGGEST_K_MAX)
    return kc_errf(err, KC_EINVAL, "k must be 1..%d", KCC_SUGGEST_K_MAX);
  if (!n)
    return KC_OK;
  kc_bucket *sh = malloc(n * sizeof *sh);
  if (!sh)
    return kc_errf(err, KC_NOMEM, "out of memory");
  for (size_t i = 0; i < n; i++)
    sh[i] = sorted(&s[i].shape);
  kc_err e = check_names(sh, n, err);
  uint64_t bounds[KC_MAX_DIMS][KCC_SUGGEST_K_MAX];
  size_t nb[KC_MAX_DIMS];
  for (size_t d = 0; !e && d < sh[0].n; d++) {
    kcc_cost w;
    e = one_dim(s, sh, n, d, k, bounds[d], &nb[d], &w);
    *waste += w;
    if (e)
      kc_errf(err, e, "out of memory");
  }
  if (e) {
    free(sh);
    return e;
  }
  *n_out = cells(sh, n, bounds, nb);
  *out = sh;
  return KC_OK;
}

void kcc_cost_text(kcc_cost c, char out[40]) {
  char tmp[40];
  size_t n = 0;
  do {
    tmp[n++] = (char)('0' + (int)(c % 10));
    c /= 10;
  } while (c);
  for (size_t i = 0; i < n; i++)
    out[i] = tmp[n - 1 - i];
  out[n] = '\0';
}
