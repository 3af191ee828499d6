/* layout.h - internal: the dims of a data or weights tensor in a given
 * layout, shared by problem.c (output dims, strides), bdesc.c (building
 * problems from descriptors) and layer.c, and the resolver layer.c builds
 * on. Defined in problem.c. */
#ifndef CG_SRC_LAYOUT_H
#define CG_SRC_LAYOUT_H

#include "cg/problem.h"

/* Data tensor (n, c, sp[nsp]) in format f (DEFAULT = NXC). */
void cg__data_dims(cg_data_format f, int nsp, int64_t n, int64_t c,
                   const int64_t *sp, int64_t dims[CG_MAX_RANK]);
/* Weights of op with forward channels oc, ic, groups g and kernel k[nsp]
 * in format f (DEFAULT = the op's default): Convolution (OC, IC/g, K),
 * ConvTranspose (IC, OC/g, K) in IOX terms, letters placed per f. */
void cg__weights_dims(cg_op op, cg_weights_format f, int nsp, int64_t oc,
                      int64_t ic, int64_t g, const int64_t *k,
                      int64_t dims[CG_MAX_RANK]);

/* cg_problem_resolve for a single-output part of a layer's backward
 * (layer_op CG_OP_CONV_BWD or CG_OP_DECONV_BWD): messages name layer_op,
 * and the shape input is the layer's "weights" or "src" tensor.
 * CG_OP_INVALID resolves p on its own. */
int cg__problem_resolve_in(const cg_problem *p, cg_op layer_op, cg_geom *geom,
                           char *err, size_t errlen);

#endif
