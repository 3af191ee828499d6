/* cgw_tls.c - owns reading and checking TLS credential files (OpenSSL's
 * PEM readers and X509 checks). */
#include "cgw_tls.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "cg/error.h"

/* PEM files are a few kilobytes; a CA bundle of every public root is
 * about 200 KiB. */
#define MAX_PEM_BYTES (4u << 20)

static int given(const char *path) {
  return path && *path;
}

/* Reads path whole into a NUL-terminated buffer from malloc. */
static int read_file(const char *name, const char *path, char **out, char *err,
                     size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return cg_errorf(err, errlen, CG_EINVAL, "%s %s: %s", name, path,
                     strerror(errno));
  char *buf = malloc(MAX_PEM_BYTES + 1);
  size_t n = buf ? fread(buf, 1, MAX_PEM_BYTES + 1, f) : 0;
  int bad = buf && ferror(f);
  fclose(f);
  if (!buf || bad || n > MAX_PEM_BYTES) {
    free(buf);
    return cg_errorf(err, errlen, CG_EINVAL, "%s %s: %s", name, path,
                     !buf  ? "out of memory"
                     : bad ? "cannot be read"
                           : "larger than 4 MiB");
  }
  buf[n] = '\0';
  *out = buf;
  return 0;
}

/* The first certificate of pem, or NULL. */
static X509 *first_cert(const char *pem) {
  BIO *b = BIO_new_mem_buf(pem, -1);
  X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
  BIO_free(b);
  return x;
}

/* t as "Jan  2 03:04:05 2026 GMT". */
static void format_time(const ASN1_TIME *t, char *buf, size_t len) {
  BIO *b = BIO_new(BIO_s_mem());
  int n = b && ASN1_TIME_print(b, t) ? BIO_read(b, buf, (int)len - 1) : 0;
  buf[n > 0 ? n : 0] = '\0';
  BIO_free(b);
}

/* The leaf of out->cert: a certificate, valid now, whose key is out->key;
 * fills out->subject. */
static int check_leaf(const char *const names[3], const cgw_tls_files *f,
                      cgw_tls_pem *out, char *err, size_t errlen) {
  X509 *x = first_cert(out->cert);
  if (!x)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "%s %s: no PEM certificate in the file", names[1],
                     f->cert);
  int rc = 0;
  BIO *kb = BIO_new_mem_buf(out->key, -1);
  EVP_PKEY *key = kb ? PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL) : NULL;
  BIO_free(kb);
  char when[64];
  if (!key) {
    rc = cg_errorf(err, errlen, CG_EINVAL,
                   "%s %s: no PEM private key in the file (an encrypted "
                   "key is not supported)",
                   names[2], f->key);
  } else if (X509_check_private_key(x, key) != 1) {
    rc = cg_errorf(err, errlen, CG_EINVAL,
                   "%s %s: the key does not match the certificate of %s %s",
                   names[2], f->key, names[1], f->cert);
  } else if (X509_cmp_current_time(X509_get0_notAfter(x)) < 0) {
    format_time(X509_get0_notAfter(x), when, sizeof when);
    rc = cg_errorf(err, errlen, CG_EINVAL, "%s %s: the certificate expired %s",
                   names[1], f->cert, when);
  } else if (X509_cmp_current_time(X509_get0_notBefore(x)) > 0) {
    format_time(X509_get0_notBefore(x), when, sizeof when);
    rc = cg_errorf(err, errlen, CG_EINVAL,
                   "%s %s: the certificate is not valid before %s", names[1],
                   f->cert, when);
  } else {
    BIO *b = BIO_new(BIO_s_mem());
    int n = b && X509_NAME_print_ex(b, X509_get_subject_name(x), 0,
                                    XN_FLAG_RFC2253) >= 0
                ? BIO_read(b, out->subject, (int)sizeof out->subject - 1)
                : 0;
    out->subject[n > 0 ? n : 0] = '\0';
    BIO_free(b);
  }
  EVP_PKEY_free(key);
  X509_free(x);
  ERR_clear_error(); /* nothing of this may surface in a later call */
  return rc;
}

int cgw_tls_load(const cgw_tls_files *f, const char *const names[3],
                 cgw_tls_pem *out, char *err, size_t errlen) {
  int rc = 0;
  memset(out, 0, sizeof *out);
  if (given(f->cert) != given(f->key))
    return cg_errorf(err, errlen, CG_EINVAL, "%s and %s go together", names[1],
                     names[2]);
  if (given(f->ca)) {
    if ((rc = read_file(names[0], f->ca, &out->ca, err, errlen)) != 0)
      goto fail;
    X509 *x = first_cert(out->ca);
    ERR_clear_error();
    if (!x) {
      rc = cg_errorf(err, errlen, CG_EINVAL,
                     "%s %s: no PEM certificate in the file", names[0], f->ca);
      goto fail;
    }
    X509_free(x);
  }
  if (given(f->cert)) {
    if ((rc = read_file(names[1], f->cert, &out->cert, err, errlen)) != 0 ||
        (rc = read_file(names[2], f->key, &out->key, err, errlen)) != 0 ||
        (rc = check_leaf(names, f, out, err, errlen)) != 0)
      goto fail;
  }
  return 0;
fail:
  cgw_tls_free(out);
  return rc;
}

void cgw_tls_free(cgw_tls_pem *p) {
  if (p->key)
    OPENSSL_cleanse(p->key, strlen(p->key));
  free(p->ca);
  free(p->cert);
  free(p->key);
  memset(p, 0, sizeof *p);
}
