/* s3cfg.c: the durable tier's settings: the --s3-* flags and the credentials
 * (an AWS shared-credentials file, or the AWS_* environment variables), handed
 * to the store, whose tier logs through kcd_log. Secrets are wiped at exit and
 * never written anywhere. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "kcd.h"

typedef struct kcd_s3 {
  kc_store_s3 opts;
  char *access, *secret, *session;
} kcd_s3;

static void wipe(char **s) {
  if (*s)
    OPENSSL_cleanse(*s, strlen(*s));
  free(*s);
  *s = NULL;
}

static void tier_log(void *ud, const char *level, const char *msg) {
  kcd_log(ud, level, "s3: %s", msg);
}

static char *trim(char *s) {
  while (*s == ' ' || *s == '\t')
    s++;
  size_t n = strlen(s);
  while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' ||
               s[n - 1] == '\r'))
    s[--n] = '\0';
  return s;
}

/* One "name = value" line of the wanted profile. */
static void cred_line(kcd_s3 *c, char *line) {
  char *eq = strchr(line, '=');
  if (!eq)
    return;
  *eq = '\0';
  const char *name = trim(line);
  char *value = trim(eq + 1);
  char **dst = strcmp(name, "aws_access_key_id") == 0       ? &c->access
               : strcmp(name, "aws_secret_access_key") == 0 ? &c->secret
               : strcmp(name, "aws_session_token") == 0     ? &c->session
                                                            : NULL;
  if (dst) {
    wipe(dst);
    *dst = strdup(value);
  }
}

/* The AWS CLI's format: [profile] sections ($AWS_PROFILE, else default). */
static int read_credentials(kcd_s3 *c, const char *path) {
  FILE *f = fopen(path, "re");
  if (!f) {
    fprintf(stderr, "kcached: --s3-credentials %s: cannot read it\n", path);
    return 2;
  }
  const char *profile = getenv("AWS_PROFILE");
  char want[160];
  snprintf(want, sizeof want, "[%s]",
           profile && *profile ? profile : "default");
  char *line = NULL;
  size_t cap = 0;
  int in = 0;
  while (getline(&line, &cap, f) > 0) {
    char *t = trim(line);
    if (*t == '[')
      in = strcmp(t, want) == 0;
    else if (in && *t && *t != '#' && *t != ';')
      cred_line(c, t);
  }
  if (line)
    OPENSSL_cleanse(line, cap);
  free(line);
  fclose(f);
  if (!c->access || !c->secret) {
    fprintf(stderr,
            "kcached: --s3-credentials %s: no aws_access_key_id and "
            "aws_secret_access_key in %s\n",
            path, want);
    return 2;
  }
  return 0;
}

static int env_credentials(kcd_s3 *c) {
  const char *a = getenv("AWS_ACCESS_KEY_ID");
  const char *s = getenv("AWS_SECRET_ACCESS_KEY");
  const char *t = getenv("AWS_SESSION_TOKEN");
  if (!a || !*a || !s || !*s) {
    fprintf(stderr, "kcached: --s3-endpoint needs credentials: set "
                    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give "
                    "--s3-credentials FILE\n");
    return 2;
  }
  c->access = strdup(a);
  c->secret = strdup(s);
  c->session = t && *t ? strdup(t) : NULL;
  return 0;
}

int kcd_s3_setup(kcd_state *st) {
  const kcd_config *cfg = &st->cfg;
  if (!cfg->s3_endpoint)
    return 0;
  kcd_s3 *c = calloc(1, sizeof *c);
  if (!c)
    return 1;
  st->s3 = c;
  int rc = cfg->s3_credentials ? read_credentials(c, cfg->s3_credentials)
                               : env_credentials(c);
  if (rc)
    return rc;
  if (!c->access || !c->secret)
    return 1;
  c->opts = (kc_store_s3){.endpoint = cfg->s3_endpoint,
                          .bucket = cfg->s3_bucket,
                          .region = cfg->s3_region,
                          .prefix = cfg->s3_prefix,
                          .path_style = cfg->s3_path_style,
                          .access_key = c->access,
                          .secret_key = c->secret,
                          .session_token = c->session,
                          .parallel = cfg->s3_parallel,
                          .max_object_bytes = cfg->max_blob_bytes,
                          .log = tier_log,
                          .log_ud = st};
  return 0;
}

const kc_store_s3 *kcd_s3_opts(const kcd_state *st) {
  return st->s3 ? &st->s3->opts : NULL;
}

void kcd_s3_free(kcd_state *st) {
  kcd_s3 *c = st->s3;
  if (!c)
    return;
  wipe(&c->access);
  wipe(&c->secret);
  wipe(&c->session);
  free(c);
  st->s3 = NULL;
}
