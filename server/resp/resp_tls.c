/* resp_tls.c: TLS for the RESP listener, with OpenSSL (the HTTP side uses
 * libmicrohttpd's GnuTLS; this does not depend on it). The SSL_CTX is made
 * from the PEM texts kcached read at start (--tls-cert, --tls-key), so both
 * listeners present the same certificate. Connections stay nonblocking:
 * SSL_read/SSL_write return WANT_READ or WANT_WRITE as EAGAIN, and the
 * connection's tls_*_want_* flags tell resp.c which epoll event to wait
 * for (a read may need to write during the handshake, a write may need to
 * read). The handshake runs inside the first reads; resp.c closes a
 * connection whose handshake has not ended after KCD_RESP_TLS_HS_MS. */
#include <errno.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <string.h>

#include "resp.h"

static kc_err tls_err(char *err, const char *what) {
  char why[256] = "unknown error";
  unsigned long e = ERR_get_error();
  if (e)
    ERR_error_string_n(e, why, sizeof why);
  ERR_clear_error();
  return kc_errf(err, KC_EINVAL, "RESP TLS: %s: %s", what, why);
}

/* The leaf certificate, then every further one of the PEM as the chain. */
static int use_chain(SSL_CTX *ctx, const char *pem) {
  BIO *b = BIO_new_mem_buf(pem, -1);
  X509 *x = b ? PEM_read_bio_X509_AUX(b, NULL, NULL, NULL) : NULL;
  int ok = x && SSL_CTX_use_certificate(ctx, x) == 1;
  X509_free(x);
  while (ok && (x = PEM_read_bio_X509(b, NULL, NULL, NULL)))
    if (SSL_CTX_add0_chain_cert(ctx, x) != 1) { /* takes x on success */
      X509_free(x);
      ok = 0;
    }
  BIO_free(b);
  if (ok)
    ERR_clear_error(); /* the end of the PEM reads as an error */
  return ok ? 0 : -1;
}

static int use_key(SSL_CTX *ctx, const char *pem) {
  BIO *b = BIO_new_mem_buf(pem, -1);
  EVP_PKEY *k = b ? PEM_read_bio_PrivateKey(b, NULL, NULL, NULL) : NULL;
  int ok = k && SSL_CTX_use_PrivateKey(ctx, k) == 1 &&
           SSL_CTX_check_private_key(ctx) == 1;
  EVP_PKEY_free(k);
  BIO_free(b);
  return ok ? 0 : -1;
}

kc_err kcd_resp_tls_init(kcd_resp *r, char *err) {
  kcd_state *st = r->st;
  if (!st->tls_cert_pem || !st->tls_key_pem || st->cfg.resp_tls == 0)
    return KC_OK; /* plaintext RESP (--resp-tls off) */
  SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
  if (!ctx)
    return tls_err(err, "SSL_CTX_new");
  r->tls_ctx = ctx;
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  /* partial writes: out is sent as the socket takes it; moving buffer: out
   * may be reallocated (replies appended) between a WANT_WRITE and the
   * retry, which always passes at least the bytes tried before */
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE |
                            SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                            SSL_MODE_RELEASE_BUFFERS);
  SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION);
#ifdef SSL_OP_IGNORE_UNEXPECTED_EOF
  /* a client that closes without close_notify (most Redis clients) is an
   * end of stream: what it sent before is still answered */
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
#endif
  if (use_chain(ctx, st->tls_cert_pem))
    return tls_err(err, st->cfg.tls_cert ? st->cfg.tls_cert : "certificate");
  if (use_key(ctx, st->tls_key_pem))
    return tls_err(err, st->cfg.tls_key ? st->cfg.tls_key : "private key");
  return KC_OK;
}

void kcd_resp_tls_free(kcd_resp *r) {
  SSL_CTX_free(r->tls_ctx);
  r->tls_ctx = NULL;
}

int kcd_resp_tls_accept(kcd_resp_conn *c) {
  SSL *s = SSL_new(c->srv->tls_ctx);
  if (!s || SSL_set_fd(s, c->fd) != 1) {
    SSL_free(s);
    ERR_clear_error();
    return -1;
  }
  SSL_set_accept_state(s);
  c->ssl = s;
  return 0;
}

/* A quiet close_notify when the handshake is done (one try, nonblocking:
 * a client that does not read it loses nothing). */
void kcd_resp_tls_close(kcd_resp_conn *c) {
  SSL *s = c->ssl;
  if (!s)
    return;
  if (SSL_is_init_finished(s))
    SSL_shutdown(s);
  SSL_free(s);
  ERR_clear_error(); /* the error queue is per thread: leave it clean */
  c->ssl = NULL;
}

/* Maps an SSL_read/SSL_write result <= 0 to 0 (closed) or -1 (errno). */
static ssize_t failed(kcd_resp_conn *c, int rc, int reading) {
  int e = SSL_get_error(c->ssl, rc);
  ERR_clear_error();
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
    int other = reading ? e == SSL_ERROR_WANT_WRITE : e == SSL_ERROR_WANT_READ;
    if (reading)
      c->tls_rd_want_wr = other;
    else
      c->tls_wr_want_rd = other;
    errno = EAGAIN;
    return -1;
  }
  if (e == SSL_ERROR_ZERO_RETURN)
    return 0; /* close_notify */
  int sys = e == SSL_ERROR_SYSCALL && errno && errno != EAGAIN &&
            errno != EWOULDBLOCK && errno != EINTR;
  if (!sys)
    errno = EPROTO; /* a TLS error: a plaintext client, a bad record */
  return -1;
}

ssize_t kcd_resp_tls_read(kcd_resp_conn *c, void *buf, size_t n) {
  c->tls_rd_want_wr = 0;
  int want = n > (size_t)1 << 30 ? 1 << 30 : (int)n;
  int rc = SSL_read(c->ssl, buf, want);
  return rc > 0 ? rc : failed(c, rc, 1);
}

ssize_t kcd_resp_tls_write(kcd_resp_conn *c, const void *buf, size_t n) {
  c->tls_wr_want_rd = 0;
  int want = n > (size_t)1 << 30 ? 1 << 30 : (int)n;
  int rc = SSL_write(c->ssl, buf, want);
  return rc > 0 ? rc : failed(c, rc, 0);
}

size_t kcd_resp_tls_pending(kcd_resp_conn *c) {
  int n = c->ssl ? SSL_pending(c->ssl) : 0;
  return n > 0 ? (size_t)n : 0;
}

int kcd_resp_tls_in_handshake(kcd_resp_conn *c) {
  return c->ssl && !SSL_is_init_finished(c->ssl);
}
