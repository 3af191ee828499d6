/* plan.h - internal: a gradient problem as the one loop nest behind all
 * of its ops, shared by the plain reference (reference.c) and the result
 * checks (check.c). Both forward ops relate a "strided" position p of one
 * data tensor (lo) to a "dense" position q = p*S - PB + k*D of the other
 * (hi) through weight tap k (reference.c has the full story). */
#ifndef CG_SRC_PLAN_H
#define CG_SRC_PLAN_H

#include <stdint.h>

#include "cg/problem.h"

/* Geometry of one run, spatial axes padded to 3 at the front (size 1,
 * stride 0) so the loops need no rank cases. */
typedef struct cg__plan {
  int64_t mb, groups, lo_cg, hi_cg; /* channels per group of lo / hi */
  int64_t lo_sp[3], hi_sp[3], k[3], s[3], d[3], pb[3];
  /* element strides: [n][c][x0][x1][x2] for data, [g][lo][hi][x..] for W */
  int64_t lo_st[5], hi_st[5], w_st[6];
} cg__plan;

/* Fills a padded spatial triple from nsp values; missing leading axes get
 * `fill`. */
static inline void cg__pad3(int nsp, const int64_t *v, int64_t fill,
                            int64_t out[3]) {
  for (int a = 0; a < 3; a++) {
    int src = a - (3 - nsp);
    out[a] = src >= 0 ? v[src] : fill;
  }
}

/* Data strides of a tensor with the given channels/spatial dims in fmt,
 * as [n][c][x0][x1][x2] with zero strides on padded axes. */
static inline void cg__data_strides(const cg_geom *g, cg_data_format fmt,
                                    int64_t channels, const int64_t *sp,
                                    int64_t out[5]) {
  int64_t st[CG_MAX_RANK];
  cg_geom_data_strides(g, fmt, channels, sp, st);
  out[0] = st[0];
  out[1] = st[1];
  for (int a = 0; a < 3; a++) {
    int src = a - (3 - g->nsp);
    out[2 + a] = src >= 0 ? st[2 + src] : 0;
  }
}

/* Weights strides as [g][lo][hi][x0][x1][x2]. The helper returns
 * [g][o][i][x...] with o/i the forward op's output/input channels per
 * group: for Convolution lo = o, for ConvTranspose lo = i. */
static inline void cg__weights_strides(const cg_geom *g, cg_weights_format fmt,
                                       int convtranspose, int64_t out[6]) {
  int64_t st[CG_MAX_RANK + 1];
  cg_geom_weights_strides(g, fmt, st);
  out[0] = st[0];
  out[1] = convtranspose ? st[2] : st[1];
  out[2] = convtranspose ? st[1] : st[2];
  for (int a = 0; a < 3; a++) {
    int src = a - (3 - g->nsp);
    out[3 + a] = src >= 0 ? st[3 + src] : 0;
  }
}

/* lo_fmt / hi_fmt / w_fmt: layouts of the three tensors for this call. */
static inline void cg__plan_init(cg__plan *pl, const cg_geom *g,
                                 cg_data_format lo_fmt, cg_data_format hi_fmt,
                                 cg_weights_format w_fmt) {
  int ct = g->op == CG_OP_DECONV_BWD_DATA || g->op == CG_OP_DECONV_BWD_WEIGHTS;
  /* Convolution: lo = output side (oc, out_sp); ConvTranspose: lo = input
   * side (ic, in_sp). */
  int64_t lo_c = ct ? g->ic : g->oc, hi_c = ct ? g->oc : g->ic;
  const int64_t *lo_sp = ct ? g->in_sp : g->out_sp;
  const int64_t *hi_sp = ct ? g->out_sp : g->in_sp;

  pl->mb = g->mb;
  pl->groups = g->groups;
  pl->lo_cg = lo_c / g->groups;
  pl->hi_cg = hi_c / g->groups;
  cg__pad3(g->nsp, lo_sp, 1, pl->lo_sp);
  cg__pad3(g->nsp, hi_sp, 1, pl->hi_sp);
  cg__pad3(g->nsp, g->kernel, 1, pl->k);
  cg__pad3(g->nsp, g->stride, 1, pl->s);
  cg__pad3(g->nsp, g->dilation, 1, pl->d);
  cg__pad3(g->nsp, g->pad_begin, 0, pl->pb);
  cg__data_strides(g, lo_fmt, lo_c, lo_sp, pl->lo_st);
  cg__data_strides(g, hi_fmt, hi_c, hi_sp, pl->hi_st);
  cg__weights_strides(g, w_fmt, ct, pl->w_st);
}

#endif
