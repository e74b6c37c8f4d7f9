/* tier_once.c: write-once across replicas. A bundle key names one manifest
 * for the whole fleet, and the bucket decides which. Two halves:
 *   - before a bundle PUT of a key this replica lacks, the bucket is asked
 *     (a read-through of the key): another manifest there refuses the PUT
 *     (KC_CONFLICT) and is kept locally instead (kc_store_bundle_put_once);
 *   - the check cannot close every race (a replica cut off from S3 accepts
 *     locally; two replicas may check at once): when the queue's PUT with
 *     If-None-Match finds another manifest already there, the bucket's copy
 *     replaces the local one (kcs_tier_adopt).
 * Either way every replica ends up serving the bucket's manifest. */
#include <stdlib.h>
#include <string.h>

#include "tier.h"

kc_err kc_store_bundle_put_once(kc_store *s, const kc_manifest *m, int *created,
                                char ***missing, size_t *n_missing, char *err) {
  kcs_tier *t = s->tier;
  if (!t || kc_manifest_check_key(m, NULL) != KC_OK ||
      kc_store_bundle_has(s, m->key) != KC_NOT_FOUND)
    return kc_store_bundle_put(s, m, created, missing, n_missing, err);
  /* KC_OK: the bucket's copy is local now, and the local write-once below
   * compares it with the client's. Anything else: decided locally. */
  char ferr[KC_ERRBUF_SIZE] = "";
  kc_err fe = kcs_tier_fetch_bundle(s, m->key, 1, ferr);
  if (fe && fe != KC_NOT_FOUND && fe != KC_UNAVAILABLE && fe != KC_TIMEOUT)
    kcs_tier_logf(t, "warn",
                  "bundle PUT %s: asking S3 first failed (%s); "
                  "accepted here, the upload queue settles it",
                  m->key, ferr);
  kc_err e = kc_store_bundle_put(s, m, created, missing, n_missing, err);
  if (e == KC_CONFLICT && fe == KC_OK) {
    atomic_fetch_add(&t->once_refused, 1);
    kc_errf(err, e,
            "the bucket holds a different bundle for key %s (another "
            "replica stored it first); this replica serves that one now",
            m->key);
  }
  return e;
}

/* The bucket's manifest names another key: deleted there (counted), so the
 * queue's next try of this entry can put ours. */
static kc_err adopt_corrupt(kcs_tier *t, const char *obj, const char *key,
                            const kc_manifest *m, char *err) {
  kc_errf(err, KC_KEY_MISMATCH, "it holds the manifest of %s, not %s", m->key,
          key);
  return kcs_tier_corrupt(t, t->wh, obj, err);
}

kc_err kcs_tier_adopt(kcs_tier *t, const char *key, const void *data,
                      size_t len, char *err) {
  char obj[KCS3_KEY_MAX + 1], why[KC_ERRBUF_SIZE] = "";
  kcs_tier_obj(t, obj, "bundles", key);
  kc_manifest *m = NULL;
  kc_err e = kc_manifest_parse(data, len, &m, why);
  if (e == KC_NOMEM)
    return kc_errf(err, e, "out of memory");
  if (e) { /* a newer replica's, or damage: this one could not serve it */
    kcs_tier_logf(t, "warn",
                  "S3 holds a different manifest at %s that this "
                  "version cannot read (%s); the local copy stays",
                  obj, why);
    return KC_OK;
  }
  if (strcmp(m->key, key) != 0)
    e = adopt_corrupt(t, obj, key, m, err);
  for (size_t i = 0; !e && i < m->n_files; i++)
    if ((e = kc_store_fetch_blob(t->s, m->files[i].sha256, err)) ==
        KC_NOT_FOUND)
      kc_errf(err, e, "S3 holds bundle %s but not its blob %s", key,
              m->files[i].sha256);
  if (!e)
    e = kcs_bundle_put(t->s, m, KCS_PUT_REPLACE, NULL, NULL, NULL, err);
  kc_manifest_free(m);
  if (e)
    return e;
  atomic_fetch_add(&t->once_replaced, 1);
  kcs_tier_logf(t, "warn",
                "S3 holds a different manifest at %s (another "
                "replica stored it first): the bucket's copy wins for every "
                "replica; the local bundle %s was replaced by it",
                obj, key);
  return KC_OK;
}
