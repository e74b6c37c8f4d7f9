/* kv_tier.c: RESP keys in the durable tier. A write (SET, EXPIRE, PERSIST)
 * queues a 'v' entry and a DEL or FLUSH a 'w' entry for the key, in the
 * write's transaction, after the value's blob entry; the worker (tier.c)
 * uploads the record as P/kv/<hex(sha256(key))> (last writer wins: RESP keys
 * change) or deletes it. A key evicted or reclaimed here stays in S3 (its
 * record carries its absolute expiry), and kc_store_kv_fetch reads it back.
 *
 * The object: "kcache-kv 1\n<digest> <size> <expire_ms>\n" and the key's
 * bytes: text, so replicas of any architecture read it. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tier.h"

#define KV_MAGIC "kcache-kv 1\n"
#define KV_HEAD_MAX 128

static void kv_obj(const kcs_tier *t, char out[KCS3_KEY_MAX + 1],
                   const char *hex) {
  kcs_tier_obj(t, out, "kv", hex);
}

/* ---- write-through (the worker's thread) ---- */

/* The value's blob in the bucket: queued before the record when it was new,
 * but one held before the tier was configured was not. A HEAD, and a PUT
 * when missing. */
static kc_err ensure_value(kcs_tier *t, kc_store_read *r, const char *digest,
                           char *err) {
  char obj[KCS3_KEY_MAX + 1];
  kcs_tier_obj(t, obj, "blobs", digest);
  uint64_t t0 = kc_clock_mono_us();
  kc_err e = kcs_tier_done(t, t0, kcs3_head(t->wh, obj, NULL, NULL, err));
  if (e != KC_NOT_FOUND)
    return e;
  const void *data;
  size_t len;
  kcs3_put_opts po;
  if ((e = kcs_tier_blob_obj(r, digest, &data, &len, &po)))
    return e == KC_NOT_FOUND ? KC_OK : e; /* gone: the record is moot */
  t0 = kc_clock_mono_us();
  e = kcs_tier_done(t, t0, kcs3_put(t->wh, obj, data, len, &po, NULL, err));
  return e == KC_CONFLICT ? KC_OK : e;
}

kc_err kcs_kv_upload(kcs_tier *t, kc_store_read *r, const char *hex,
                     char *err) {
  kcs_kv_rec rec;
  const void *key;
  kc_err e = kcs_kv_rec_get(r->txn, t->s, hex, &rec, &key);
  if (e == KC_NOT_FOUND)
    return KC_OK; /* deleted (a 'w' entry follows), evicted or expired */
  if (e)
    return kc_errf(err, e, "reading RESP key %s", hex);
  char digest[KC_HEX_LEN + 1], head[KV_HEAD_MAX];
  memcpy(digest, rec.digest, KC_HEX_LEN);
  digest[KC_HEX_LEN] = '\0';
  if ((e = ensure_value(t, r, digest, err)))
    return e;
  int n = snprintf(head, sizeof head, KV_MAGIC "%s %" PRIu64 " %" PRId64 "\n",
                   digest, rec.size, rec.expire_ms);
  size_t len = (size_t)n + rec.klen;
  char *body = malloc(len), obj[KCS3_KEY_MAX + 1];
  if (!body)
    return kc_errf(err, KC_NOMEM, "out of memory");
  memcpy(body, head, (size_t)n);
  memcpy(body + n, key, rec.klen);
  kv_obj(t, obj, hex);
  uint64_t t0 = kc_clock_mono_us();
  e = kcs_tier_done(t, t0, kcs3_put(t->wh, obj, body, len, NULL, NULL, err));
  free(body);
  return e;
}

kc_err kcs_kv_delete_obj(kcs_tier *t, const char *hex, char *err) {
  char obj[KCS3_KEY_MAX + 1];
  kv_obj(t, obj, hex);
  uint64_t t0 = kc_clock_mono_us();
  return kcs_tier_done(t, t0, kcs3_delete(t->wh, obj, err));
}

/* ---- read-through ---- */

/* Parses an object into rec; KC_NOT_FOUND when it is not this key's (or
 * cannot be read by this version). */
static kc_err parse(const char *data, size_t len, const void *key, size_t klen,
                    kcs_kv_rec *rec) {
  const char *nl;
  size_t m = sizeof KV_MAGIC - 1;
  if (len < m || memcmp(data, KV_MAGIC, m) != 0 ||
      !(nl = memchr(data + m, '\n', len - m)) || nl - data > KV_HEAD_MAX)
    return KC_NOT_FOUND;
  char line[KV_HEAD_MAX + 1], digest[KC_HEX_LEN + 1];
  memcpy(line, data + m, (size_t)(nl - data) - m);
  line[(nl - data) - (ptrdiff_t)m] = '\0';
  uint64_t size;
  int64_t exp;
  if (sscanf(line, "%64s %" SCNu64 " %" SCNd64, digest, &size, &exp) != 3 ||
      !kc_is_hex64(digest))
    return KC_NOT_FOUND;
  size_t off = (size_t)(nl - data) + 1;
  if (len - off != klen || memcmp(data + off, key, klen) != 0)
    return KC_NOT_FOUND; /* another key under this hash: never, but check */
  memset(rec, 0, sizeof *rec);
  memcpy(rec->digest, digest, KC_HEX_LEN);
  rec->size = size;
  rec->expire_ms = exp;
  rec->klen = (uint32_t)klen;
  return KC_OK;
}

static kc_err get_rec(kcs_tier *t, const char *hex, const void *key,
                      size_t klen, kcs_kv_rec *rec, char *err) {
  kcs3 *h = kcs_tier_handle(t);
  if (!h)
    return kc_errf(err, KC_NOMEM, "cannot make an S3 handle");
  char obj[KCS3_KEY_MAX + 1];
  kv_obj(t, obj, hex);
  void *data = NULL;
  size_t len = 0;
  uint64_t t0 = kc_clock_mono_us();
  kc_err e =
      kcs_tier_done(t, t0,
                    kcs3_get(h, obj, KV_HEAD_MAX + klen + sizeof KV_MAGIC,
                             &data, &len, NULL, err));
  kcs_tier_put_handle(t, h);
  if (e == KC_TOO_LARGE)
    e = KC_NOT_FOUND;
  if (!e)
    e = parse(data, len, key, klen, rec);
  free(data);
  return e;
}

typedef struct fill_ctx {
  const char *hex;
  const void *key;
  kcs_kv_rec rec;
} fill_ctx;

/* Stores the fetched record unless a local one is there (a local write
 * since wins); not queued: it came from the bucket. */
static kc_err fill_op(kc_store *s, MDB_txn *txn, void *ud, char *err) {
  fill_ctx *c = ud;
  kcs_kv_rec held;
  kc_err e = kcs_kv_rec_get(txn, s, c->hex, &held, NULL);
  if (e != KC_NOT_FOUND)
    return e;
  char digest[KC_HEX_LEN + 1];
  memcpy(digest, c->rec.digest, KC_HEX_LEN);
  digest[KC_HEX_LEN] = '\0';
  if ((e = kcs_blob_ref(s, txn, digest, err)))
    return e;
  c->rec.last_used_ms = kc_clock_wall_ms();
  return kcs_kv_rec_put(s, txn, c->hex, &c->rec, c->key, err);
}

kc_err kc_store_kv_fetch(kc_store *s, const void *key, size_t klen,
                         int64_t now_ms, char *err) {
  kcs_tier *t = s->tier;
  char hex[KC_HEX_LEN + 1], digest[KC_HEX_LEN + 1];
  if (!t)
    return kc_errf(err, KC_NOT_FOUND, "no durable tier");
  if (!key || !klen || klen > KC_KV_KEY_MAX || kc_sha256_hex(key, klen, hex))
    return kc_errf(err, KC_BAD_KEY, "a RESP key is 1 to %d bytes",
                   KC_KV_KEY_MAX);
  kc_err down = kcs_tier_down(t, 0, err);
  if (down)
    return down;
  fill_ctx c = {.hex = hex, .key = key};
  kc_err e = get_rec(t, hex, key, klen, &c.rec, err);
  if (!e && c.rec.expire_ms && c.rec.expire_ms <= now_ms)
    e = KC_NOT_FOUND;
  if (!e) {
    memcpy(digest, c.rec.digest, KC_HEX_LEN);
    digest[KC_HEX_LEN] = '\0';
    e = kc_store_fetch_blob(s, digest, err);
  }
  uint64_t size = 0;
  if (!e && (e = kc_store_blob_has(s, digest, &size)) == KC_OK &&
      size != c.rec.size)
    e = KC_NOT_FOUND;
  if (!e)
    e = kcs_write(s, fill_op, &c, err);
  return kcs_tier_outcome(t, e);
}
