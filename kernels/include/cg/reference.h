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

#include "cg/layer.h"
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

/* diff_bias: the sum of diff_dst over the minibatch and every spatial
 * position, geom->oc values. diff_dst is geom's (mb, oc, out_sp) tensor
 * in geom->data_format, for any of the four ops' geometries. */
CG_EXPORT int cg_reference_bias(const cg_geom *geom, const void *diff_dst,
                                void *diff_bias, char *err, size_t errlen);

/* Every output of l: in[] are the request's data inputs in order, out[g]
 * receives output g (unused where l does not answer it). */
CG_EXPORT int cg_reference_layer(const cg_layer *l, const void *const in[3],
                                 void *const out[CG_GRAD_COUNT], char *err,
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
