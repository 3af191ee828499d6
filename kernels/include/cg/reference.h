/* cg/reference.h - plain-loop reference implementations of the four ops
 * and of the forward Convolution / ConvTranspose they differentiate.
 *
 * Independent of oneDNN on purpose: tests and `convgrad run --check`
 * compare the engine against these. Accumulates in double and rounds once
 * to the output dtype. Buffers are in the layouts geom names (any
 * cg_data_format / cg_weights_format). Thread-safe, slow, no allocation
 * beyond what the call frees before returning. */
#ifndef CG_REFERENCE_H
#define CG_REFERENCE_H

#include "cg/problem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Computes geom->op: in0/in1 are the op's inputs in order (sizes
 * geom->in_bytes), out receives geom->out_bytes in geom's output layout.
 * Returns 0 or a negative CG_E* code. */
CG_EXPORT int cg_reference_run(const cg_geom *geom, const void *in0,
                               const void *in1, void *out, char *err,
                               size_t errlen);

/* The forward op of geom (Convolution for CONV_* ops, ConvTranspose for
 * DECONV_* ops): src has the forward input shape (mb, ic, in_sp) in
 * geom->data_format, weights are in geom->weights_format, dst receives
 * (mb, oc, out_sp) in geom->data_format. For the adjoint-identity tests. */
CG_EXPORT int cg_reference_forward(const cg_geom *geom, const void *src,
                                   const void *weights, void *dst, char *err,
                                   size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
