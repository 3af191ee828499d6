/* npy.c - the .npy reader and writer of the convgrad CLI: a strict parser
 * of the header dict NumPy writes ({'descr': .., 'fortran_order': ..,
 * 'shape': (..)}) and a writer producing version 1.0 files. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "npy.h"

#include "cg/text.h"

static const char cgc__npy_magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

/* Step by which the data buffer of a pipe grows. */
#define CGC__NPY_CHUNK ((size_t)1 << 20)

/* Finds "'key'" in the header dict and returns the text after its colon. */
static const char *cgc__npy_key(const char *hdr, const char *key) {
  char pat[32];
  snprintf(pat, sizeof pat, "'%s'", key);
  const char *p = strstr(hdr, pat);
  if (!p)
    return NULL;
  p += strlen(pat);
  while (*p == ' ')
    p++;
  if (*p != ':')
    return NULL;
  p++;
  while (*p == ' ')
    p++;
  return p;
}

static int cgc__npy_parse_header(const char *hdr, cgc_npy *out,
                                 const char *path, char *err, size_t errlen) {
  const char *d = cgc__npy_key(hdr, "descr");
  const char *f = cgc__npy_key(hdr, "fortran_order");
  const char *s = cgc__npy_key(hdr, "shape");
  if (!d || !f || !s)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "%s: .npy header lacks descr, fortran_order or shape",
                     path);
  if (strncmp(d, "'<f4'", 5) == 0)
    out->dtype = CG_DTYPE_F32;
  else if (strncmp(d, "'<f2'", 5) == 0)
    out->dtype = CG_DTYPE_F16;
  else if (strncmp(d, "'<u2'", 5) == 0)
    out->dtype = CG_DTYPE_BF16;
  else {
    const char *e = d + 1 < hdr + strlen(hdr) ? strchr(d + 1, '\'') : NULL;
    int n = e ? (int)(e - d + 1) : 6;
    return cg_errorf(err, errlen, CG_EINVAL,
                     "%s: element type %.*s is not supported (use '<f4' f32, "
                     "'<f2' f16 or '<u2' bf16 bits)",
                     path, n, d);
  }
  if (strncmp(f, "True", 4) == 0)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "%s: Fortran-order arrays are not supported; save "
                     "np.ascontiguousarray(a)",
                     path);
  if (strncmp(f, "False", 5) != 0)
    return cg_errorf(err, errlen, CG_EINVAL, "%s: bad fortran_order value",
                     path);
  if (*s != '(')
    return cg_errorf(err, errlen, CG_EINVAL, "%s: bad shape in .npy header",
                     path);
  s++;
  out->rank = 0;
  for (;;) {
    while (*s == ' ' || *s == ',')
      s++;
    if (*s == ')')
      break;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || errno || v < 0)
      return cg_errorf(err, errlen, CG_EINVAL, "%s: bad shape in .npy header",
                       path);
    if (out->rank >= CGC_NPY_MAX_RANK)
      return cg_errorf(err, errlen, CG_EINVAL, "%s: rank above %d", path,
                       CGC_NPY_MAX_RANK);
    out->dims[out->rank++] = v;
    s = end;
  }
  size_t n = cg_dtype_size(out->dtype);
  for (int i = 0; i < out->rank; i++)
    if (__builtin_mul_overflow(n, (size_t)out->dims[i], &n))
      return cg_errorf(err, errlen, CG_ERANGE, "%s: shape overflows", path);
  out->nbytes = n;
  return 0;
}

/* Reads the out->nbytes of array data that must end fp. The header alone
 * does not decide the allocation, since a few bytes of it can declare
 * terabytes: a regular file must hold that much first, and a pipe's buffer
 * grows only with the data that arrives. */
static int cgc__npy_read_data(FILE *fp, cgc_npy *out, const char *path,
                              char *err, size_t errlen) {
  size_t want = out->nbytes, cap = want, got = 0;
  struct stat st;
  long pos = -1;
  int sized = fstat(fileno(fp), &st) == 0 && S_ISREG(st.st_mode) &&
              (pos = ftell(fp)) >= 0;
  size_t held = sized && st.st_size > pos ? (size_t)(st.st_size - pos) : 0;
  if (!sized && cap > CGC__NPY_CHUNK)
    cap = CGC__NPY_CHUNK;
  if (!sized || held == want) {
    for (;;) {
      void *grown = realloc(out->data, cap ? cap : 1);
      if (!grown)
        return cg_errorf(err, errlen, CG_ENOMEM,
                         "%s: out of memory for %zu bytes", path, cap);
      out->data = grown;
      got += fread((char *)out->data + got, 1, cap - got, fp);
      if (got < cap || cap == want)
        break;
      cap = want - cap > cap ? 2 * cap : want;
    }
    held = got;
  }
  if (held != want)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "%s: file holds %zu bytes of data, its header declares "
                     "%zu",
                     path, held, want);
  if (fgetc(fp) != EOF)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "%s: extra bytes after the %zu bytes of data its header "
                     "declares",
                     path, want);
  return 0;
}

int cgc_npy_read(const char *path, cgc_npy *out, char *err, size_t errlen) {
  int rc = 0;
  unsigned char pre[12];
  char *hdr = NULL;
  FILE *fp;
  memset(out, 0, sizeof *out);
  fp = fopen(path, "rb");
  if (!fp)
    return cg_errorf(err, errlen, CG_EINVAL, "%s: %s", path, strerror(errno));
  if (fread(pre, 1, 10, fp) != 10 || memcmp(pre, cgc__npy_magic, 6) != 0) {
    rc = cg_errorf(err, errlen, CG_EINVAL, "%s: not a .npy file", path);
    goto out;
  }
  size_t hlen;
  if (pre[6] == 1) {
    hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
  } else if (pre[6] == 2 || pre[6] == 3) {
    if (fread(pre + 10, 1, 2, fp) != 2) {
      rc = cg_errorf(err, errlen, CG_EINVAL, "%s: truncated header", path);
      goto out;
    }
    hlen = (size_t)pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 |
           (size_t)pre[11] << 24;
  } else {
    rc = cg_errorf(err, errlen, CG_EINVAL, "%s: .npy version %d unsupported",
                   path, pre[6]);
    goto out;
  }
  if (hlen > 1 << 20) {
    rc = cg_errorf(err, errlen, CG_EINVAL, "%s: header too large", path);
    goto out;
  }
  hdr = malloc(hlen + 1);
  if (!hdr) {
    rc = CG_ENOMEM;
    goto out;
  }
  if (fread(hdr, 1, hlen, fp) != hlen) {
    rc = cg_errorf(err, errlen, CG_EINVAL, "%s: truncated header", path);
    goto out;
  }
  hdr[hlen] = '\0';
  rc = cgc__npy_parse_header(hdr, out, path, err, errlen);
  if (rc)
    goto out;
  rc = cgc__npy_read_data(fp, out, path, err, errlen);
out:
  fclose(fp);
  free(hdr);
  if (rc) {
    free(out->data);
    memset(out, 0, sizeof *out);
  }
  return rc;
}

int cgc_npy_write(const char *path, cg_dtype dtype, int rank,
                  const int64_t *dims, const void *data, size_t nbytes,
                  char *err, size_t errlen) {
  const char *descr = dtype == CG_DTYPE_F32    ? "<f4"
                      : dtype == CG_DTYPE_F16  ? "<f2"
                      : dtype == CG_DTYPE_BF16 ? "<u2"
                                               : NULL;
  char dict[256], shape[160];
  if (!descr || rank < 0 || rank > CGC_NPY_MAX_RANK)
    return cg_errorf(err, errlen, CG_EINVAL, "%s: unsupported array", path);
  cg_text t;
  cg_text_init(&t, shape, sizeof shape);
  for (int i = 0; i < rank; i++)
    cg_text_appendf(&t, "%s%lld", i ? ", " : "", (long long)dims[i]);
  /* Python writes a 1-tuple with a trailing comma. */
  const char *comma = rank == 1 ? "," : "";
  int dl =
      snprintf(dict, sizeof dict,
               "{'descr': '%s', 'fortran_order': False, 'shape': (%s%s), }",
               descr, shape, comma);
  /* Magic (6) + version (2) + length (2) + dict + padding + '\n' is a
   * multiple of 64, as NumPy writes it. */
  size_t total = 10 + (size_t)dl + 1;
  size_t pad = (64 - total % 64) % 64;
  FILE *fp = fopen(path, "wb");
  if (!fp)
    return cg_errorf(err, errlen, CG_EINVAL, "%s: %s", path, strerror(errno));
  size_t hlen = (size_t)dl + pad + 1;
  unsigned char pre[10];
  memcpy(pre, cgc__npy_magic, 6);
  pre[6] = 1;
  pre[7] = 0;
  pre[8] = (unsigned char)(hlen & 0xff);
  pre[9] = (unsigned char)(hlen >> 8);
  int ok = fwrite(pre, 1, 10, fp) == 10 &&
           fwrite(dict, 1, (size_t)dl, fp) == (size_t)dl;
  for (size_t i = 0; ok && i < pad; i++)
    ok = fputc(' ', fp) != EOF;
  ok = ok && fputc('\n', fp) != EOF && fwrite(data, 1, nbytes, fp) == nbytes;
  if (fclose(fp) != 0)
    ok = 0;
  if (!ok)
    return cg_errorf(err, errlen, CG_EINVAL, "%s: write failed: %s", path,
                     strerror(errno));
  return 0;
}

void cgc_npy_free(cgc_npy *n) {
  if (!n)
    return;
  free(n->data);
  memset(n, 0, sizeof *n);
}
