/* npy.h - reading and writing NumPy .npy files (format 1.0-3.0) for the
 * convgrad CLI.
 *
 * Supported element types: '<f4' (f32), '<f2' (f16) and '<u2', which holds
 * bf16 as its raw 16-bit patterns (NumPy has no bfloat16: load it with
 * np.load(p).astype(np.uint32) << 16 viewed as float32, or save bf16 bits
 * as uint16). C order only; Fortran order and big-endian files are
 * rejected with a message saying so. Not thread-safe per object. */
#ifndef CGC_NPY_H
#define CGC_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "cg/problem.h"

#define CGC_NPY_MAX_RANK 8

typedef struct cgc_npy {
  cg_dtype dtype;
  int rank;
  int64_t dims[CGC_NPY_MAX_RANK];
  void *data; /* owned; nbytes long */
  size_t nbytes;
} cgc_npy;

/* Reads path into *out (zeroed first). Returns 0, CG_EINVAL (not a
 * supported .npy: the message names the reason) or CG_ENOMEM; err says
 * which file and why. On failure nothing is left to free. */
int cgc_npy_read(const char *path, cgc_npy *out, char *err, size_t errlen);

/* Writes a C-order array. Returns 0 or CG_EINVAL (cannot write; err has
 * the OS reason). */
int cgc_npy_write(const char *path, cg_dtype dtype, int rank,
                  const int64_t *dims, const void *data, size_t nbytes,
                  char *err, size_t errlen);

/* Frees out->data and zeroes *out; NULL is accepted. */
void cgc_npy_free(cgc_npy *n);

#endif
