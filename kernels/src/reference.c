/* reference.c - plain-loop reference implementations of the four gradient
 * ops and the forward Convolution / ConvTranspose (cg/reference.h).
 *
 * Deliberately simple and independent of oneDNN: the tests judge the
 * engine by these loops, so they follow SEMANTICS.md "Math" literally.
 *
 * Every op here is one of three loops over the same index set. Both
 * forward ops relate a "strided" tensor position p to a "dense" position
 * q = p*S - PB + k*D (per spatial axis) through weight tap k:
 *   Convolution:   p runs over the conv output (diff_dst), q over its input;
 *   ConvTranspose: p runs over the ConvTranspose input, q over its output.
 * With `lo` the tensor indexed by p and `hi` the one indexed by q:
 *   to_lo: lo[p] += hi[q] * W   (conv forward, ConvTranspose bwd_data)
 *   to_hi: hi[q] += lo[p] * W   (conv bwd_data, ConvTranspose forward)
 *   to_w:  W     += lo[p] * hi[q]  (both bwd_weights)
 * Sums are kept in double and rounded once to the dtype at the end. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cg/dtype.h"
#include "cg/reference.h"
#include "plan.h"

typedef enum { REF_TO_LO, REF_TO_HI, REF_TO_W } ref_kind;

/* lo, hi, w: element offsets are computed from the plan; `acc` is the
 * double accumulator in the layout of the tensor being produced (same
 * strides as that tensor). in_* are the two inputs, as buffers of dt. */
static void plan_run(const cg__plan *pl, ref_kind kind, cg_dtype dt,
                     const void *lo, const void *hi, const void *w,
                     double *acc) {
  for (int64_t n = 0; n < pl->mb; n++)
    for (int64_t gr = 0; gr < pl->groups; gr++)
      for (int64_t cl = 0; cl < pl->lo_cg; cl++)
        for (int64_t ch = 0; ch < pl->hi_cg; ch++) {
          int64_t lo_c =
              n * pl->lo_st[0] + (gr * pl->lo_cg + cl) * pl->lo_st[1];
          int64_t hi_c =
              n * pl->hi_st[0] + (gr * pl->hi_cg + ch) * pl->hi_st[1];
          int64_t w_c = gr * pl->w_st[0] + cl * pl->w_st[1] + ch * pl->w_st[2];
          for (int64_t p0 = 0; p0 < pl->lo_sp[0]; p0++)
            for (int64_t p1 = 0; p1 < pl->lo_sp[1]; p1++)
              for (int64_t p2 = 0; p2 < pl->lo_sp[2]; p2++)
                for (int64_t k0 = 0; k0 < pl->k[0]; k0++)
                  for (int64_t k1 = 0; k1 < pl->k[1]; k1++)
                    for (int64_t k2 = 0; k2 < pl->k[2]; k2++) {
                      int64_t q0 = p0 * pl->s[0] - pl->pb[0] + k0 * pl->d[0];
                      int64_t q1 = p1 * pl->s[1] - pl->pb[1] + k1 * pl->d[1];
                      int64_t q2 = p2 * pl->s[2] - pl->pb[2] + k2 * pl->d[2];
                      if (q0 < 0 || q0 >= pl->hi_sp[0] || q1 < 0 ||
                          q1 >= pl->hi_sp[1] || q2 < 0 || q2 >= pl->hi_sp[2])
                        continue; /* padding: contributes 0 */
                      int64_t il = lo_c + p0 * pl->lo_st[2] +
                                   p1 * pl->lo_st[3] + p2 * pl->lo_st[4];
                      int64_t ih = hi_c + q0 * pl->hi_st[2] +
                                   q1 * pl->hi_st[3] + q2 * pl->hi_st[4];
                      int64_t iw = w_c + k0 * pl->w_st[3] + k1 * pl->w_st[4] +
                                   k2 * pl->w_st[5];
                      switch (kind) {
                      case REF_TO_LO:
                        acc[il] += (double)cg_load_f32(dt, hi, (size_t)ih) *
                                   (double)cg_load_f32(dt, w, (size_t)iw);
                        break;
                      case REF_TO_HI:
                        acc[ih] += (double)cg_load_f32(dt, lo, (size_t)il) *
                                   (double)cg_load_f32(dt, w, (size_t)iw);
                        break;
                      case REF_TO_W:
                        acc[iw] += (double)cg_load_f32(dt, lo, (size_t)il) *
                                   (double)cg_load_f32(dt, hi, (size_t)ih);
                        break;
                      }
                    }
        }
}

/* Runs one loop into a fresh double accumulator of n elements (the
 * output's element count; every layout here is dense) and rounds it into
 * out. */
static int run_plan(const cg_geom *g, const cg__plan *pl, ref_kind kind,
                    const void *lo, const void *hi, const void *w, void *out,
                    size_t n, char *err, size_t errlen) {
  int rc = 0;
  double *acc = NULL;

  if (n > SIZE_MAX / sizeof(double)) {
    rc = cg_errorf(err, errlen, CG_ERANGE,
                   "reference: output of %zu elements overflows", n);
    goto out;
  }
  acc = calloc(n ? n : 1, sizeof(double));
  if (!acc) {
    rc = cg_errorf(err, errlen, CG_ENOMEM,
                   "reference: cannot allocate %zu accumulators", n);
    goto out;
  }
  plan_run(pl, kind, g->dtype, lo, hi, w, acc);
  for (size_t i = 0; i < n; i++)
    cg_store_f32(g->dtype, out, i, (float)acc[i]);
out:
  free(acc);
  return rc;
}

static int check_geom(const cg_geom *g, char *err, size_t errlen) {
  if (!g || g->nsp < 1 || g->nsp > CG_MAX_SPATIAL || g->groups < 1 ||
      cg_dtype_size(g->dtype) == 0)
    return cg_errorf(err, errlen, CG_EINVAL, "reference: invalid geometry");
  switch (g->op) {
  case CG_OP_CONV_BWD_DATA:
  case CG_OP_CONV_BWD_WEIGHTS:
  case CG_OP_DECONV_BWD_DATA:
  case CG_OP_DECONV_BWD_WEIGHTS:
    return 0;
  default:
    return cg_errorf(err, errlen, CG_EINVAL, "reference: invalid op %d",
                     (int)g->op);
  }
}

int cg_reference_run(const cg_geom *geom, const void *in0, const void *in1,
                     void *out, char *err, size_t errlen) {
  cg__plan pl;
  int rc = check_geom(geom, err, errlen);
  if (rc)
    return rc;
  if (!in0 || !in1 || !out)
    return cg_errorf(err, errlen, CG_EINVAL, "reference: NULL buffer");

  cg_data_format df = geom->data_format, odf = geom->out_data_format;
  cg_weights_format wf = geom->weights_format, owf = geom->out_weights_format;
  switch (geom->op) {
  case CG_OP_CONV_BWD_DATA: /* in0 = diff_dst (lo), in1 = W; out = hi */
    cg__plan_init(&pl, geom, df, odf, wf);
    rc = run_plan(geom, &pl, REF_TO_HI, in0, NULL, in1, out, geom->out_elems,
                  err, errlen);
    break;
  case CG_OP_DECONV_BWD_DATA: /* in0 = diff_dst (hi), in1 = W; out = lo */
    cg__plan_init(&pl, geom, odf, df, wf);
    rc = run_plan(geom, &pl, REF_TO_LO, NULL, in0, in1, out, geom->out_elems,
                  err, errlen);
    break;
  case CG_OP_CONV_BWD_WEIGHTS: /* in0 = src (hi), in1 = diff_dst (lo) */
    cg__plan_init(&pl, geom, df, df, owf);
    rc = run_plan(geom, &pl, REF_TO_W, in1, in0, NULL, out, geom->out_elems,
                  err, errlen);
    break;
  default: /* DECONV_BWD_WEIGHTS: in0 = src (lo), in1 = diff_dst (hi) */
    cg__plan_init(&pl, geom, df, df, owf);
    rc = run_plan(geom, &pl, REF_TO_W, in0, in1, NULL, out, geom->out_elems,
                  err, errlen);
    break;
  }
  return rc;
}

int cg_reference_bias(const cg_geom *geom, const void *diff_dst,
                      void *diff_bias, char *err, size_t errlen) {
  int rc = check_geom(geom, err, errlen);
  if (rc)
    return rc;
  if (!diff_dst || !diff_bias)
    return cg_errorf(err, errlen, CG_EINVAL, "reference: NULL buffer");
  int64_t st[CG_MAX_RANK], sp = 1;
  cg_geom_data_strides(geom, geom->data_format, geom->oc, geom->out_sp, st);
  for (int a = 0; a < geom->nsp; a++)
    sp *= geom->out_sp[a];
  for (int64_t c = 0; c < geom->oc; c++) {
    double acc = 0;
    for (int64_t n = 0; n < geom->mb; n++)
      for (int64_t i = 0; i < sp; i++) {
        /* Spatial position i in row-major order over out_sp. */
        int64_t off = n * st[0] + c * st[1], rest = i;
        for (int a = geom->nsp - 1; a >= 0; a--) {
          off += (rest % geom->out_sp[a]) * st[2 + a];
          rest /= geom->out_sp[a];
        }
        acc += cg_load_f32(geom->dtype, diff_dst, (size_t)off);
      }
    cg_store_f32(geom->dtype, diff_bias, (size_t)c, (float)acc);
  }
  return 0;
}

int cg_reference_layer(const cg_layer *l, const void *const in[3],
                       void *const out[CG_GRAD_COUNT], char *err,
                       size_t errlen) {
  int rc = 0;
  for (int g = 0; g < CG_GRAD_COUNT && !rc; g++) {
    if (!(l->grads & CG_GRAD_BIT(g)))
      continue;
    if (g == CG_GRAD_DIFF_SRC)
      rc = cg_reference_run(&l->data, in[l->data_in[0]], in[l->data_in[1]],
                            out[g], err, errlen);
    else if (g == CG_GRAD_DIFF_WEIGHTS)
      rc = cg_reference_run(&l->weights, in[l->weights_in[0]],
                            in[l->weights_in[1]], out[g], err, errlen);
    else
      rc = cg_reference_bias(&l->weights, in[l->weights_in[1]], out[g], err,
                             errlen);
  }
  return rc;
}

int cg_reference_forward(const cg_geom *geom, const void *src,
                         const void *weights, void *dst, char *err,
                         size_t errlen) {
  cg__plan pl;
  size_t n = 1;
  int rc = check_geom(geom, err, errlen);
  if (rc)
    return rc;
  if (!src || !weights || !dst)
    return cg_errorf(err, errlen, CG_EINVAL, "reference: NULL buffer");

  /* dst is the forward output (mb, oc, out_sp). */
  int64_t dims[1 + CG_MAX_SPATIAL + 1];
  dims[0] = geom->mb;
  dims[1] = geom->oc;
  for (int a = 0; a < geom->nsp; a++)
    dims[2 + a] = geom->out_sp[a];
  for (int a = 0; a < 2 + geom->nsp; a++)
    if (__builtin_mul_overflow(n, (size_t)dims[a], &n))
      return cg_errorf(err, errlen, CG_ERANGE,
                       "reference: forward output size overflows");

  cg_data_format df = geom->data_format;
  if (geom->op == CG_OP_CONV_BWD_DATA || geom->op == CG_OP_CONV_BWD_WEIGHTS) {
    cg__plan_init(&pl, geom, df, df, geom->weights_format); /* lo = dst */
    rc =
        run_plan(geom, &pl, REF_TO_LO, NULL, src, weights, dst, n, err, errlen);
  } else {
    cg__plan_init(&pl, geom, df, df, geom->weights_format); /* hi = dst */
    rc =
        run_plan(geom, &pl, REF_TO_HI, src, NULL, weights, dst, n, err, errlen);
  }
  return rc;
}
