/* bucket.c: padding a concrete size up to its shape bucket, by powers of two
 * or by a list of boundaries, so that a model needs a handful of bundles;
 * a bucket as a JSON object. */
#include <jansson.h>

#include "kc_schema.h"

json_t *kc_bucket_to_json(const kc_bucket *b) {
  json_t *o = json_object();
  for (size_t i = 0; o && i < b->n; i++)
    json_object_set_new(o, b->dims[i].name,
                        json_integer((json_int_t)b->dims[i].value));
  return o;
}

kc_err kc_bucket_pow2(uint64_t n, uint64_t min, uint64_t max, uint64_t *out) {
  if (!out || min == 0 || max == 0 || min > max)
    return KC_EINVAL;
  if (n > max)
    return KC_TOO_LARGE;
  uint64_t p = 1;
  while (p < n && p <= UINT64_MAX / 2)
    p <<= 1;
  /* p < n only past 2^63, where n <= max already: max holds it. */
  if (p < n || p > max)
    p = max;
  *out = p < min ? min : p;
  return KC_OK;
}

kc_err kc_bucket_boundary(uint64_t n, const uint64_t *bounds, size_t n_bounds,
                          uint64_t *out) {
  if (!out || !bounds || n_bounds == 0)
    return KC_EINVAL;
  /* Check the whole list, not just up to n: a bad list is a bug to report
   * whatever n is. */
  for (size_t i = 1; i < n_bounds; i++)
    if (bounds[i] <= bounds[i - 1])
      return KC_EINVAL;
  for (size_t i = 0; i < n_bounds; i++) {
    if (bounds[i] >= n) {
      *out = bounds[i];
      return KC_OK;
    }
  }
  return KC_TOO_LARGE;
}
