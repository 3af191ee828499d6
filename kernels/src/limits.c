/* limits.c - the service limits on spatial attributes (cg/limits.h): their
 * defaults and maxima, and the check of a resolved geometry against them.
 *
 * Why these values. Real networks (proto/SEMANTICS.md "Service limits"
 * lists the sources) use strides up to 256 (WaveGlow's upsampling
 * ConvTranspose1d; wav2vec 2.0's encoder uses 5, ViT patch embeddings
 * 14 to 32, learned STFT-like filterbanks 512 to 1024 at most), dilations up
 * to 512 (WaveNet) or 2048 (deep TCNs), pads no larger than the kernel's
 * reach, and spatial extents up to about 2^20 (1M-base DNA models). Each
 * default leaves a wide margin above those.
 *
 * Why they are safe. oneDNN 2.6's JIT kernels keep their configuration in
 * int and form offsets as products of strides, pads and dilations with
 * their unroll, block and tile sizes (up to 32 output columns times a
 * 16- to 64-channel block times 4 bytes: 2^13 per unit of stride), and
 * some do work in proportion to those attributes: the AMX backward-data
 * kernel emits a zeroing store for every stride phase at primitive
 * creation (stride - 1 of them per row, (stride_h - 1) x (32 + reach)
 * per image row) and copies a window of (10 + reach_h) x (32 + reach_w)
 * for every 10 x 32 block it computes; the AMX and AVX512-BF16
 * backward-weights kernels transpose each source row into
 * (iw / stride + pad + 32) x stride elements and count the whole buffer
 * in int. The per-axis maxima keep each single product far inside int
 * (a 65536 stride is 2^29 bytes of offset at 2^13 a unit), and the
 * engine (engine.c, jit_usable and amx_bwd_data_usable) hands every
 * problem whose products with the tensor extents could still leave int,
 * or whose attribute-driven work would outgrow its tensors, to oneDNN's
 * gemm-based implementation, which indexes in 64 bits and does work in
 * proportion to the multiply-adds. --max-request-flops then bounds that
 * work (cg_geom_work counts the padded extents). */
#include <inttypes.h>

#include "cg/limits.h"

#define LLD PRId64

static const char *const limit_names[CG_LIMIT_COUNT] = {
    "stride",         "dilation",         "pad",
    "output_padding", "effective extent", "padded extent"};

void cg_limits_default(cg_limits *l) {
  l->max[CG_LIMIT_STRIDE] = CG_LIMIT_STRIDE_DEFAULT;
  l->max[CG_LIMIT_DILATION] = CG_LIMIT_DILATION_DEFAULT;
  l->max[CG_LIMIT_PAD] = CG_LIMIT_PAD_DEFAULT;
  l->max[CG_LIMIT_OUTPUT_PADDING] = CG_LIMIT_OUTPUT_PADDING_DEFAULT;
  l->max[CG_LIMIT_EFFECTIVE_EXTENT] = CG_LIMIT_EFFECTIVE_EXTENT_DEFAULT;
  l->max[CG_LIMIT_PADDED_EXTENT] = CG_LIMIT_PADDED_EXTENT_DEFAULT;
}

void cg_limits_max(cg_limits *l) {
  l->max[CG_LIMIT_STRIDE] = CG_LIMIT_STRIDE_MAX;
  l->max[CG_LIMIT_DILATION] = CG_LIMIT_DILATION_MAX;
  l->max[CG_LIMIT_PAD] = CG_LIMIT_PAD_MAX;
  l->max[CG_LIMIT_OUTPUT_PADDING] = CG_LIMIT_OUTPUT_PADDING_MAX;
  l->max[CG_LIMIT_EFFECTIVE_EXTENT] = CG_LIMIT_EFFECTIVE_EXTENT_MAX;
  l->max[CG_LIMIT_PADDED_EXTENT] = CG_LIMIT_PADDED_EXTENT_MAX;
}

const char *cg_limit_name(cg_limit which) {
  return (int)which >= 0 && which < CG_LIMIT_COUNT ? limit_names[which] : "?";
}

static int is_deconv(cg_op op) {
  return op == CG_OP_DECONV_BWD_DATA || op == CG_OP_DECONV_BWD_WEIGHTS;
}

static int over(cg_limit which, cg_limit *out) {
  if (out)
    *out = which;
  return CG_EINVAL;
}

/* The values of one attribute list against limit lim. */
static int check_list(const char *name, cg_ints v, cg_limit lim,
                      const cg_limits *l, cg_limit *which, char *err,
                      size_t errlen) {
  size_t n = v.v && v.len < CG_MAX_ATTR_LEN ? v.len : 0;
  for (size_t i = 0; i < n; i++)
    if (v.v[i] > l->max[lim])
      return cg_errorf(err, errlen, over(lim, which),
                       "%s[%zu]: %" LLD " exceeds the limit %" LLD " on %s",
                       name, i, v.v[i], l->max[lim], name);
  return 0;
}

int cg_problem_check_limits(const cg_problem *p, const cg_limits *l,
                            cg_limit *which, char *err, size_t errlen) {
  const cg_attrs *a = &p->attrs;
  int rc =
      check_list("strides", a->strides, CG_LIMIT_STRIDE, l, which, err, errlen);
  if (!rc)
    rc = check_list("dilations", a->dilations, CG_LIMIT_DILATION, l, which, err,
                    errlen);
  /* With auto_pad the given pads are ignored (cg_problem_resolve). */
  if (!rc && a->auto_pad == CG_AUTO_PAD_NONE)
    rc = check_list("pads_begin", a->pads_begin, CG_LIMIT_PAD, l, which, err,
                    errlen);
  if (!rc && a->auto_pad == CG_AUTO_PAD_NONE)
    rc = check_list("pads_end", a->pads_end, CG_LIMIT_PAD, l, which, err,
                    errlen);
  if (!rc)
    rc = check_list("output_padding", a->output_padding,
                    CG_LIMIT_OUTPUT_PADDING, l, which, err, errlen);
  return rc;
}

int cg_geom_check_limits(const cg_geom *g, const cg_limits *l, cg_limit *which,
                         char *err, size_t errlen) {
  const int64_t *m = l->max;
  for (int d = 0; d < g->nsp; d++) {
    int64_t s = g->stride[d], dil = g->dilation[d];
    int64_t reach = (g->kernel[d] - 1) * dil + 1;
    /* The larger side: the Convolution input, the ConvTranspose output. */
    int64_t big = is_deconv(g->op) ? g->out_sp[d] : g->in_sp[d];
    int64_t padded = big + g->pad_begin[d] + g->pad_end[d];
    if (s > m[CG_LIMIT_STRIDE])
      return cg_errorf(err, errlen, over(CG_LIMIT_STRIDE, which),
                       "strides[%d]: %" LLD " exceeds the limit %" LLD
                       " on strides",
                       d, s, m[CG_LIMIT_STRIDE]);
    if (dil > m[CG_LIMIT_DILATION])
      return cg_errorf(err, errlen, over(CG_LIMIT_DILATION, which),
                       "dilations[%d]: %" LLD " exceeds the limit %" LLD
                       " on dilations",
                       d, dil, m[CG_LIMIT_DILATION]);
    if (g->pad_begin[d] > m[CG_LIMIT_PAD])
      return cg_errorf(err, errlen, over(CG_LIMIT_PAD, which),
                       "pads_begin[%d]: %" LLD " exceeds the limit %" LLD
                       " on pads",
                       d, g->pad_begin[d], m[CG_LIMIT_PAD]);
    if (g->pad_end[d] > m[CG_LIMIT_PAD])
      return cg_errorf(err, errlen, over(CG_LIMIT_PAD, which),
                       "pads_end[%d]: %" LLD " exceeds the limit %" LLD
                       " on pads",
                       d, g->pad_end[d], m[CG_LIMIT_PAD]);
    if (g->output_padding[d] > m[CG_LIMIT_OUTPUT_PADDING])
      return cg_errorf(err, errlen, over(CG_LIMIT_OUTPUT_PADDING, which),
                       "output_padding[%d]: %" LLD " exceeds the limit %" LLD
                       " on output_padding",
                       d, g->output_padding[d], m[CG_LIMIT_OUTPUT_PADDING]);
    if (reach > m[CG_LIMIT_EFFECTIVE_EXTENT])
      return cg_errorf(err, errlen, over(CG_LIMIT_EFFECTIVE_EXTENT, which),
                       "dilations[%d], weights: the kernel's effective "
                       "extent (%" LLD "-1)*%" LLD "+1 = %" LLD
                       " exceeds the limit %" LLD " on effective extents",
                       d, g->kernel[d], dil, reach,
                       m[CG_LIMIT_EFFECTIVE_EXTENT]);
    if (padded > m[CG_LIMIT_PADDED_EXTENT])
      return cg_errorf(
          err, errlen, over(CG_LIMIT_PADDED_EXTENT, which),
          "pads_begin[%d], pads_end[%d]: the %s extent %" LLD " padded by %" LLD
          "+%" LLD " is %" LLD ", above the limit %" LLD " on padded extents",
          d, d, is_deconv(g->op) ? "output" : "input", big, g->pad_begin[d],
          g->pad_end[d], padded, m[CG_LIMIT_PADDED_EXTENT]);
  }
  return 0;
}

int cg_layer_check_limits(const cg_layer *ly, const cg_limits *l,
                          cg_limit *which, char *err, size_t errlen) {
  /* diff_bias comes from the weights part's diff_dst. */
  if ((ly->grads & CG_GRAD_BIT(CG_GRAD_DIFF_SRC)) &&
      cg_geom_check_limits(&ly->data, l, which, err, errlen))
    return CG_EINVAL;
  if ((ly->grads & ~CG_GRAD_BIT(CG_GRAD_DIFF_SRC)) &&
      cg_geom_check_limits(&ly->weights, l, which, err, errlen))
    return CG_EINVAL;
  return 0;
}
