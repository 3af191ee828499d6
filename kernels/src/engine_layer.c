/* engine_layer.c - a layer's outputs on an engine (cg/engine.h): the
 * gradient ops through cg_engine_run, diff_bias as one parallel pass over
 * diff_dst.
 *
 * diff_bias reads diff_dst once. NCX keeps each (n, c) plane contiguous:
 * threads take whole channels. NXC keeps each position's channels
 * contiguous: threads take blocks of positions into their own row of
 * sums, added up at the end. Runs of at most BLOCK elements are summed in
 * f32 (which vectorises) and added to double sums, so a channel of
 * millions of elements loses no more than the f32 rounding of one run. */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cg/dtype.h"
#include "cg/engine.h"
#include "now.h"

#define BLOCK 256

/* Element i of a tensor of dtype dt as f32. bf16 is the top half of an
 * f32, inlined here as the loops are bound by it. */
static inline float load(cg_dtype dt, const void *p, size_t i) {
  if (dt == CG_DTYPE_F32)
    return ((const float *)p)[i];
  if (dt == CG_DTYPE_BF16) {
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
  }
  return cg_f16_to_f32(((const uint16_t *)p)[i]);
}

/* Sum of n contiguous elements from index i. */
static double run_sum(cg_dtype dt, const void *p, size_t i, size_t n) {
  double acc = 0;
  while (n) {
    size_t m = n < BLOCK ? n : BLOCK;
    float part = 0;
    for (size_t k = 0; k < m; k++)
      part += load(dt, p, i + k);
    acc += part;
    i += m;
    n -= m;
  }
  return acc;
}

/* NCX: channel c is mb planes of sp contiguous elements. */
static void bias_ncx(const cg_geom *g, int threads, size_t sp, const void *dd,
                     double *sum) {
  int64_t oc = g->oc, mb = g->mb;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t c = 0; c < oc; c++) {
    double acc = 0;
    for (int64_t n = 0; n < mb; n++)
      acc +=
          run_sum(g->dtype, dd, ((size_t)n * (size_t)oc + (size_t)c) * sp, sp);
    sum[c] = acc;
  }
}

/* NXC: rows of oc contiguous channels, one per (n, position). Thread t
 * sums a contiguous block of rows into part[t], BLOCK rows at a time in
 * f32. */
static int bias_nxc(const cg_geom *g, int threads, size_t rows, const void *dd,
                    double *sum) {
  size_t oc = (size_t)g->oc;
  double *part = calloc((size_t)threads * oc, sizeof *part);
  float *run = malloc((size_t)threads * oc * sizeof *run);
  if (!part || !run) {
    free(part);
    free(run);
    return CG_ENOMEM;
  }
#pragma omp parallel num_threads(threads)
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    size_t lo = rows * (size_t)t / (size_t)nt;
    size_t hi = rows * (size_t)(t + 1) / (size_t)nt;
    double *acc = part + (size_t)t * oc;
    float *r = run + (size_t)t * oc;
    for (size_t b = lo; b < hi; b += BLOCK) {
      size_t e = hi - b < BLOCK ? hi : b + BLOCK;
      memset(r, 0, oc * sizeof *r);
      for (size_t row = b; row < e; row++)
        for (size_t c = 0; c < oc; c++)
          r[c] += load(g->dtype, dd, row * oc + c);
      for (size_t c = 0; c < oc; c++)
        acc[c] += r[c];
    }
  }
  for (size_t c = 0; c < oc; c++) {
    double s = 0;
    for (int t = 0; t < threads; t++)
      s += part[(size_t)t * oc + c];
    sum[c] = s;
  }
  free(part);
  free(run);
  return 0;
}

int cg_engine_bias(cg_engine *e, const cg_geom *geom, const void *diff_dst,
                   void *diff_bias, cg_run_info *info, char *err,
                   size_t errlen) {
  double t0 = cg__now_ms();
  if (!e || !geom || !diff_dst || !diff_bias || geom->oc < 1 || geom->nsp < 1 ||
      geom->nsp > CG_MAX_SPATIAL || cg_dtype_size(geom->dtype) == 0)
    return cg_errorf(err, errlen, CG_EINVAL, "engine: invalid bias request");
  size_t sp = 1;
  for (int a = 0; a < geom->nsp; a++)
    sp *= (size_t)geom->out_sp[a];
  int threads = cg_engine_threads(e);
  double *sum = malloc((size_t)geom->oc * sizeof *sum);
  if (!sum)
    return cg_errorf(err, errlen, CG_ENOMEM, "engine: out of memory");
  int rc = 0;
  if (geom->data_format == CG_DATA_NCX)
    bias_ncx(geom, threads, sp, diff_dst, sum);
  else
    rc = bias_nxc(geom, threads, (size_t)geom->mb * sp, diff_dst, sum);
  if (rc == 0)
    for (int64_t c = 0; c < geom->oc; c++)
      cg_store_f32(geom->dtype, diff_bias, (size_t)c, (float)sum[c]);
  free(sum);
  if (rc)
    return cg_errorf(err, errlen, rc, "engine: out of memory");
  if (info) {
    info->path = CG_PATH_NATIVE;
    info->cache_hit = 1;
    info->impl = "bias";
    info->compute_ms = cg__now_ms() - t0;
    info->threads = threads;
    info->runs = 0; /* no primitives */
  }
  return 0;
}

int cg_engine_run_output(cg_engine *e, const cg_layer *l, cg_grad g,
                         const void *const in[3], void *out, cg_run_info *info,
                         char *err, size_t errlen) {
  if (g == CG_GRAD_DIFF_SRC)
    return cg_engine_run(e, &l->data, in[l->data_in[0]], in[l->data_in[1]], out,
                         info, err, errlen);
  if (g == CG_GRAD_DIFF_WEIGHTS)
    return cg_engine_run(e, &l->weights, in[l->weights_in[0]],
                         in[l->weights_in[1]], out, info, err, errlen);
  return cg_engine_bias(e, &l->weights, in[l->weights_in[1]], out, info, err,
                        errlen);
}

int cg_engine_run_layer(cg_engine *e, const cg_layer *l,
                        const void *const in[3], void *const out[CG_GRAD_COUNT],
                        cg_run_info info[CG_GRAD_COUNT], char *err,
                        size_t errlen) {
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    if (!(l->grads & CG_GRAD_BIT(g)))
      continue;
    int rc = cg_engine_run_output(e, l, (cg_grad)g, in, out[g], &info[g], err,
                                  errlen);
    if (rc)
      return rc;
  }
  return 0;
}
