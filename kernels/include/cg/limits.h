/* cg/limits.h - the service limits on a problem's spatial attributes:
 * strides, dilations, pads, output_padding and the effective and padded
 * extents they make.
 *
 * cg_problem_resolve checks what the operator semantics allow (and what
 * oneDNN's int descriptors can hold); these limits are narrower. They keep
 * every value far above what real networks use (proto/SEMANTICS.md
 * "Service limits" names the largest values found) and far below where
 * oneDNN 2.6's JIT kernels stop being safe or honest: the kernels multiply
 * strides, dilations and pads by their tile and block sizes in 32-bit
 * arithmetic, and some do work in proportion to strides and pads rather
 * than to the tensors (see limits.c for the reasoning, kernel by kernel).
 * A server may lower a limit or raise it up to its CG_LIMIT_*_MAX; the
 * engine refuses any geometry past the maxima, whoever built it.
 * Thread-safe; no allocation. */
#ifndef CG_LIMITS_H
#define CG_LIMITS_H

#include <stddef.h>
#include <stdint.h>

#include "cg/layer.h"
#include "cg/problem.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  CG_LIMIT_STRIDE = 0,           /* every strides[d] */
  CG_LIMIT_DILATION = 1,         /* every dilations[d] */
  CG_LIMIT_PAD = 2,              /* every pads_begin[d] and pads_end[d],
                                    given or from auto_pad */
  CG_LIMIT_OUTPUT_PADDING = 3,   /* every output_padding[d] (ConvTranspose) */
  CG_LIMIT_EFFECTIVE_EXTENT = 4, /* (K-1)*D+1, the kernel's reach, on every
                                    spatial axis */
  CG_LIMIT_PADDED_EXTENT = 5     /* the larger side with its pads on every
                                    axis: Convolution input + PB + PE,
                                    ConvTranspose output + PB + PE */
} cg_limit;
#define CG_LIMIT_COUNT 6

/* Defaults and the largest values the engine takes. Plain integer
 * literals, so that a server's option table can spell them. */
#define CG_LIMIT_STRIDE_DEFAULT 4096
#define CG_LIMIT_STRIDE_MAX 65536
#define CG_LIMIT_DILATION_DEFAULT 4096
#define CG_LIMIT_DILATION_MAX 65536
#define CG_LIMIT_PAD_DEFAULT 65536
#define CG_LIMIT_PAD_MAX 1048576
#define CG_LIMIT_OUTPUT_PADDING_DEFAULT 4095
#define CG_LIMIT_OUTPUT_PADDING_MAX 65535
#define CG_LIMIT_EFFECTIVE_EXTENT_DEFAULT 65536
#define CG_LIMIT_EFFECTIVE_EXTENT_MAX 1048576
#define CG_LIMIT_PADDED_EXTENT_DEFAULT 16777216
#define CG_LIMIT_PADDED_EXTENT_MAX 1073741824

/* Inclusive maxima, indexed by cg_limit. */
typedef struct cg_limits {
  int64_t max[CG_LIMIT_COUNT];
} cg_limits;

/* Fills l with the defaults / with the maxima. */
CG_EXPORT void cg_limits_default(cg_limits *l);
CG_EXPORT void cg_limits_max(cg_limits *l);
/* "stride", "dilation", "pad", "output_padding", "effective extent",
 * "padded extent"; "?" out of range. Static strings. */
CG_EXPORT const char *cg_limit_name(cg_limit which);

/* Checks the attribute values p gives (strides, dilations, pads unless
 * auto_pad computes them, output_padding) against l, before anything
 * else about p, so that a value past a limit is refused as such whatever
 * the rest of the request. Returns 0 or CG_EINVAL as below. */
CG_EXPORT int cg_problem_check_limits(const cg_problem *p, const cg_limits *l,
                                      cg_limit *which, char *err,
                                      size_t errlen);
/* Checks a resolved geometry against l: the values above, those auto_pad
 * and the shapes imply, and the effective and padded extents. Returns 0, or
 * CG_EINVAL with a message naming the field and the limit ("strides[1]: 8388607
 * exceeds the limit 4096 on stride") and, when which is not NULL, the limit in
 * *which. */
CG_EXPORT int cg_geom_check_limits(const cg_geom *g, const cg_limits *l,
                                   cg_limit *which, char *err, size_t errlen);
/* The same for every part of a layer that its outputs need. */
CG_EXPORT int cg_layer_check_limits(const cg_layer *ly, const cg_limits *l,
                                    cg_limit *which, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
