/* auth.c - owns the token table: parsing --auth-tokens, hashing, and the
 * constant-time lookup of a call's bearer token. */
#include "cgs_auth.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <grpc/slice.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "cg/error.h"

#define HASH_BYTES 32
/* Tokens are secrets, not documents: a line longer than this is refused. */
#define MAX_LINE 1024

typedef struct entry {
  unsigned char hash[HASH_BYTES];
  char label[CGS_AUTH_LABEL_MAX];
} entry;

struct cgs_auth {
  entry *e;
  size_t n;
};

static int sha256(const void *p, size_t n, unsigned char out[HASH_BYTES]) {
  unsigned int len = 0;
  return EVP_Digest(p, n, out, &len, EVP_sha256(), NULL) == 1 &&
                 len == HASH_BYTES
             ? 0
             : -1;
}

static int hex_value(int c) {
  return isdigit(c) ? c - '0' : isxdigit(c) ? tolower(c) - 'a' + 10 : -1;
}

/* One line's entry into *e: 0, or -1 with why filled. */
static int parse_line(char *line, entry *e, const char **why) {
  char *tok = strtok(line, " \t");
  char *label = strtok(NULL, " \t");
  if (strtok(NULL, " \t")) {
    *why = "expected a token or sha256:HEX, then an optional label";
    return -1;
  }
  for (const char *p = tok; *p; p++)
    if (!isgraph((unsigned char)*p)) {
      *why = "a token is printable ASCII";
      return -1;
    }
  if (strncmp(tok, "sha256:", 7) == 0) {
    const char *hex = tok + 7;
    if (strlen(hex) != 2 * (size_t)HASH_BYTES) {
      *why = "sha256: needs 64 hex digits";
      return -1;
    }
    for (size_t i = 0; i < HASH_BYTES; i++) {
      int hi = hex_value((unsigned char)hex[2 * i]),
          lo = hex_value((unsigned char)hex[2 * i + 1]);
      if (hi < 0 || lo < 0) {
        *why = "sha256: needs 64 hex digits";
        return -1;
      }
      e->hash[i] = (unsigned char)(hi << 4 | lo);
    }
  } else {
    if (strlen(tok) < CGS_AUTH_MIN_TOKEN) {
      *why = "a token needs at least 16 characters";
      return -1;
    }
    if (sha256(tok, strlen(tok), e->hash) != 0) {
      *why = "SHA-256 failed";
      return -1;
    }
    OPENSSL_cleanse(tok, strlen(tok));
  }
  if (label) {
    for (const char *p = label; *p; p++)
      if (!isalnum((unsigned char)*p) && !strchr("-_.@:", *p)) {
        *why = "a label is letters, digits and -_.@:";
        return -1;
      }
    snprintf(e->label, sizeof e->label, "%s", label);
  } else {
    snprintf(e->label, sizeof e->label, "token-%02x%02x%02x%02x", e->hash[0],
             e->hash[1], e->hash[2], e->hash[3]);
  }
  return 0;
}

int cgs_auth_load(cgs_auth **out, const char *path, char *err, size_t errlen) {
  *out = NULL;
  FILE *f = fopen(path, "r");
  if (!f)
    return cg_errorf(err, errlen, CG_EINVAL, "--auth-tokens %s: %s", path,
                     strerror(errno));
  cgs_auth *a = calloc(1, sizeof *a);
  if (!a) {
    fclose(f);
    return cg_errorf(err, errlen, CG_ENOMEM, "out of memory");
  }
  int rc = 0;
  char line[MAX_LINE + 2];
  size_t cap = 0;
  for (int no = 1; rc == 0 && fgets(line, sizeof line, f); no++) {
    size_t len = strlen(line);
    if (len > MAX_LINE) {
      rc = cg_errorf(err, errlen, CG_EINVAL,
                     "--auth-tokens %s: line %d is too long", path, no);
      break;
    }
    line[strcspn(line, "\r\n")] = '\0';
    char first = line[strspn(line, " \t")];
    if (first == '\0' || first == '#')
      continue;
    if (a->n == cap) {
      size_t ncap = cap ? 2 * cap : 8;
      entry *ne = realloc(a->e, ncap * sizeof *ne);
      if (!ne) {
        rc = cg_errorf(err, errlen, CG_ENOMEM, "out of memory");
        break;
      }
      a->e = ne;
      cap = ncap;
    }
    const char *why = NULL;
    if (parse_line(line, &a->e[a->n], &why) != 0)
      rc = cg_errorf(err, errlen, CG_EINVAL, "--auth-tokens %s: line %d: %s",
                     path, no, why);
    else
      a->n++;
  }
  OPENSSL_cleanse(line, sizeof line);
  if (rc == 0 && ferror(f))
    rc =
        cg_errorf(err, errlen, CG_EINVAL, "--auth-tokens %s: read error", path);
  if (rc == 0 && a->n == 0)
    rc = cg_errorf(err, errlen, CG_EINVAL,
                   "--auth-tokens %s: no token in the file", path);
  fclose(f);
  if (rc != 0) {
    cgs_auth_free(a);
    return rc;
  }
  *out = a;
  return 0;
}

void cgs_auth_free(cgs_auth *a) {
  if (!a)
    return;
  free(a->e);
  free(a);
}

size_t cgs_auth_count(const cgs_auth *a) {
  return a->n;
}

cgs_auth_result cgs_auth_check(const cgs_auth *a, const grpc_metadata_array *md,
                               const char **label) {
  static const char scheme[] = "Bearer ";
  const grpc_slice *value = NULL;
  for (size_t i = 0; i < md->count; i++)
    if (grpc_slice_str_cmp(md->metadata[i].key, "authorization") == 0)
      value = &md->metadata[i].value;
  if (!value)
    return CGS_AUTH_MISSING;
  const char *v = (const char *)GRPC_SLICE_START_PTR(*value);
  size_t n = GRPC_SLICE_LENGTH(*value);
  if (n < sizeof scheme - 1 || strncasecmp(v, scheme, sizeof scheme - 1) != 0)
    return CGS_AUTH_MISSING;
  unsigned char h[HASH_BYTES];
  if (sha256(v + sizeof scheme - 1, n - (sizeof scheme - 1), h) != 0)
    return CGS_AUTH_UNKNOWN;
  /* Every entry is compared, so the time says nothing of which matched. */
  size_t found = a->n;
  for (size_t i = 0; i < a->n; i++) {
    int same = CRYPTO_memcmp(h, a->e[i].hash, HASH_BYTES) == 0;
    found = same ? i : found;
  }
  if (found == a->n)
    return CGS_AUTH_UNKNOWN;
  *label = a->e[found].label;
  return CGS_AUTH_OK;
}
