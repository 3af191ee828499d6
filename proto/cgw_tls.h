/* cgw_tls.h - TLS credential files as both ends load them (cgw_tls.c):
 * a CA bundle, a certificate chain and its private key, read and checked
 * with OpenSSL before gRPC sees them, so that a missing file, a key that
 * does not match its certificate or a certificate outside its validity
 * period is refused at start with the option's name, rather than failing
 * every handshake later. Thread-safe (no shared state). */
#ifndef CGW_TLS_H
#define CGW_TLS_H

#include <stddef.h>

/* Paths, each NULL or "" when not given. */
typedef struct cgw_tls_files {
  const char *ca;   /* PEM bundle of trusted certificates */
  const char *cert; /* PEM certificate chain, leaf first */
  const char *key;  /* PEM private key of the leaf */
} cgw_tls_files;

/* The files' contents, NUL-terminated, from malloc; NULL where no file
 * was given. Owned by the caller: cgw_tls_free. */
typedef struct cgw_tls_pem {
  char *ca, *cert, *key;
  char subject[256]; /* the leaf's subject (RFC 2253); "" without cert */
} cgw_tls_pem;

/* Reads and checks the files: each holds PEM of its kind, cert and key
 * come together, the key matches the leaf, and the leaf is valid now.
 * names are the options' names for messages ({"--tls-ca", "--tls-cert",
 * "--tls-key"}). Returns 0, or CG_EINVAL with err naming the option, the
 * file and the problem (out is then empty). */
int cgw_tls_load(const cgw_tls_files *files, const char *const names[3],
                 cgw_tls_pem *out, char *err, size_t errlen);
/* Frees p's contents, the key's bytes wiped first. */
void cgw_tls_free(cgw_tls_pem *p);

#endif
