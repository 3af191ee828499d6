/* cgs_auth.h - bearer tokens (auth.c): the --auth-tokens file and the
 * check of a call's `authorization: Bearer <token>` metadata.
 *
 * The file holds one entry a line: a token, or `sha256:` and the token's
 * SHA-256 in hex, optionally followed by white space and a label that the
 * log shows for the caller (default: `token-` and the hash's first 8 hex
 * digits). Blank lines and lines starting with `#` are skipped. Only hashes are
 * kept in memory; a presented token is hashed and compared with every entry in
 * constant time. Tokens never reach a log line. Not thread-safe: the loop
 * thread loads, checks, and swaps tables on SIGHUP. */
#ifndef CGS_AUTH_H
#define CGS_AUTH_H

#include <stddef.h>

#include <grpc/grpc.h>

typedef struct cgs_auth cgs_auth;

/* A token shorter than this is refused: it could be guessed. */
#define CGS_AUTH_MIN_TOKEN 16
/* Room for a label and its terminating zero. */
#define CGS_AUTH_LABEL_MAX 64

/* Reads path. Returns 0, or CG_EINVAL with err naming the file and the
 * line (never the token), or CG_ENOMEM. *out is owned by the caller. */
int cgs_auth_load(cgs_auth **out, const char *path, char *err, size_t errlen);
void cgs_auth_free(cgs_auth *a);
/* Entries loaded. */
size_t cgs_auth_count(const cgs_auth *a);

typedef enum {
  CGS_AUTH_OK = 0,
  CGS_AUTH_MISSING = -1, /* no authorization: Bearer metadata */
  CGS_AUTH_UNKNOWN = -2  /* a token no entry has */
} cgs_auth_result;

/* Checks md. On CGS_AUTH_OK, *label is the entry's label (storage of a:
 * copy it before a reload frees a). */
cgs_auth_result cgs_auth_check(const cgs_auth *a, const grpc_metadata_array *md,
                               const char **label);

#endif
