/* impl_catalogue.h - which oneDNN 2.6 implementations cg_engine avoids on
 * which problems (private).
 *
 * Pure functions of an implementation's name (dnnl_query_impl_info_str),
 * the problem's geometry and the engine's thread count: no oneDNN call, no
 * state, safe from any thread. The engine walks oneDNN's implementations in
 * its order of preference and takes the first that cg__impl_usable accepts. */
#ifndef CG_IMPL_CATALOGUE_H
#define CG_IMPL_CATALOGUE_H

#include <stdint.h>

#include "cg/problem.h"

static inline int cg__op_is_deconv(cg_op op) {
  return op == CG_OP_DECONV_BWD_DATA || op == CG_OP_DECONV_BWD_WEIGHTS;
}

static inline int cg__op_is_bwd_data(cg_op op) {
  return op == CG_OP_CONV_BWD_DATA || op == CG_OP_DECONV_BWD_DATA;
}

/* 1 when oneDNN 2.6's implementation impl computes g right at threads
 * threads, within its 32-bit offsets and in bounded time; 0 when the
 * engine must take the next one. */
int cg__impl_usable(const char *impl, const cg_geom *g, int threads);

/* Bytes of one sample of the data tensors as the JIT kernels may address
 * it (saturates at INT64_MAX), for the message that refuses a problem no
 * implementation takes. */
int64_t cg__sample_reach_bytes(const cg_geom *g);

#endif
