/* test_problem.c - shape inference, auto_pad and layout strides of
 * cg_problem_resolve on hand-computed cases (SEMANTICS.md formulas). */
#include "kt.h"

/* SAME_* with an odd total: the odd unit goes to the end for SAME_UPPER
 * and to the beginning for SAME_LOWER (not the swapped formulas of
 * ConvolutionBackwardData.rst). */
static void same_odd_total_conv(void **state) {
  (void)state;
  /* in 7, K 4, S 2: T = (ceil(7/2)-1)*2 + 4 - 7 = 3, out = 4. */
  cg_problem p = kt_problem(CG_OP_CONV_BWD_WEIGHTS, L(1, 1, 7), L(1, 1, 4));
  p.attrs.data_format = CG_DATA_NCX;
  p.attrs.weights_format = CG_WEIGHTS_OIX;
  p.attrs.weights_shape = L(1, 1, 4);
  p.attrs.strides = L(2);
  p.attrs.auto_pad = CG_AUTO_PAD_SAME_UPPER;
  cg_geom g = kt_resolve_ok(&p);
  assert_int_equal(g.pad_begin[0], 1);
  assert_int_equal(g.pad_end[0], 2);
  p.attrs.auto_pad = CG_AUTO_PAD_SAME_LOWER;
  g = kt_resolve_ok(&p);
  assert_int_equal(g.pad_begin[0], 2);
  assert_int_equal(g.pad_end[0], 1);

  /* ConvolutionBackwardData: the reference size is dst_shape's. */
  cg_problem q = kt_problem(CG_OP_CONV_BWD_DATA, L(1, 1, 6, 6), L(1, 1, 4, 4));
  q.attrs.data_format = CG_DATA_NCX;
  q.attrs.weights_format = CG_WEIGHTS_OIX;
  q.attrs.dst_shape = L(1, 1, 6, 6);
  q.attrs.pads_begin = L(7, 7); /* ignored with auto_pad */
  q.attrs.auto_pad = CG_AUTO_PAD_SAME_UPPER;
  g = kt_resolve_ok(&q);
  assert_int_equal(g.pad_begin[0], 1);
  assert_int_equal(g.pad_end[1], 2);
  q.attrs.auto_pad = CG_AUTO_PAD_SAME_LOWER;
  g = kt_resolve_ok(&q);
  assert_int_equal(g.pad_begin[1], 2);
  assert_int_equal(g.pad_end[0], 1);
}

/* ConvTranspose ops use T = max(0, EK - S) whatever the sizes. */
static void same_odd_total_deconv(void **state) {
  (void)state;
  cg_problem p =
      kt_problem(CG_OP_DECONV_BWD_DATA, L(1, 1, 6, 6), L(1, 1, 4, 4));
  p.attrs.data_format = CG_DATA_NCX;
  p.attrs.weights_format = CG_WEIGHTS_IOX;
  p.attrs.auto_pad = CG_AUTO_PAD_SAME_UPPER;
  cg_geom g = kt_resolve_ok(&p);
  assert_int_equal(g.pad_begin[0], 1);
  assert_int_equal(g.pad_end[0], 2);
  kt_dims_eq(g.out_dims, L(1, 1, 6, 6));
  p.attrs.auto_pad = CG_AUTO_PAD_SAME_LOWER;
  g = kt_resolve_ok(&p);
  assert_int_equal(g.pad_begin[1], 2);
  assert_int_equal(g.pad_end[1], 1);

  /* K 3, S 2: T = 1. diff_dst 7 gives diff_src 3 with an implied
   * output_padding of 1 (2*2 + 3 - 1 = 6, 7 - 6 = 1). */
  cg_problem q = kt_problem(CG_OP_DECONV_BWD_WEIGHTS, L(1, 3, 2), L(1, 7, 2));
  q.attrs.weights_format = CG_WEIGHTS_XOI;
  q.attrs.weights_shape = L(3, 2, 2);
  q.attrs.strides = L(2);
  q.attrs.auto_pad = CG_AUTO_PAD_SAME_LOWER;
  g = kt_resolve_ok(&q);
  assert_int_equal(g.pad_begin[0], 1);
  assert_int_equal(g.pad_end[0], 0);
  assert_int_equal(g.output_padding[0], 1);
  kt_dims_eq(g.out_dims, L(3, 2, 2));
  /* A given output_padding must equal the implied one. */
  q.attrs.output_padding = L(0);
  kt_resolve_fails(&q, CG_EINVAL, "output_padding[0]: the shapes imply 1");
}

static void dilation_and_stride(void **state) {
  (void)state;
  /* D 3, K 3: EK 7; src 10 -> diff_dst 4. */
  cg_problem p = kt_problem(CG_OP_CONV_BWD_WEIGHTS, L(1, 2, 10), L(1, 4, 4));
  p.attrs.data_format = CG_DATA_NCX;
  p.attrs.weights_format = CG_WEIGHTS_OIX;
  p.attrs.weights_shape = L(4, 2, 3);
  p.attrs.dilations = L(3);
  cg_geom g = kt_resolve_ok(&p);
  assert_int_equal(g.kernel[0], 3);
  assert_int_equal(g.dilation[0], 3);
  kt_dims_eq(g.out_dims, L(4, 2, 3));
  /* SAME with dilation: T = 7 - 1 = 6 at stride 1. */
  p.input_dims[1] = L(1, 4, 10);
  p.attrs.auto_pad = CG_AUTO_PAD_SAME_UPPER;
  g = kt_resolve_ok(&p);
  assert_int_equal(g.pad_begin[0], 3);
  assert_int_equal(g.pad_end[0], 3);

  /* Stride 3 > kernel 2: inferred diff_src = 3*(3-1) + 2 = 8, and an
   * output_padding of 2 (< S) gives 10. */
  cg_problem q = kt_problem(CG_OP_CONV_BWD_DATA, L(1, 3, 1), L(2, 1, 1));
  q.attrs.strides = L(3);
  g = kt_resolve_ok(&q);
  kt_dims_eq(g.out_dims, L(1, 8, 1));
  q.attrs.output_padding = L(2);
  g = kt_resolve_ok(&q);
  kt_dims_eq(g.out_dims, L(1, 10, 1));
  q.attrs.output_padding = L(3);
  kt_resolve_fails(&q, CG_EINVAL, "output_padding[0]: must be < strides[0]");
}

/* A negative SAME total is clamped to 0 (1x1 kernel, stride 2, even size). */
static void negative_total_clamped(void **state) {
  (void)state;
  cg_problem p = kt_problem(CG_OP_CONV_BWD_DATA, L(1, 7, 7, 8), L(1, 1, 4, 8));
  p.attrs.strides = L(2, 2);
  p.attrs.dst_shape = L(1, 14, 14, 4);
  p.attrs.auto_pad = CG_AUTO_PAD_SAME_UPPER;
  cg_geom g = kt_resolve_ok(&p);
  assert_int_equal(g.pad_begin[0], 0);
  assert_int_equal(g.pad_end[0], 0);
  assert_int_equal(g.pad_end[1], 0);
  kt_dims_eq(g.out_dims, L(1, 14, 14, 4));

  cg_problem q = kt_problem(CG_OP_DECONV_BWD_DATA, L(1, 14, 4), L(1, 4, 2));
  q.attrs.strides = L(2);
  q.attrs.auto_pad = CG_AUTO_PAD_SAME_LOWER;
  g = kt_resolve_ok(&q);
  assert_int_equal(g.pad_begin[0], 0);
  assert_int_equal(g.pad_end[0], 0);
  kt_dims_eq(g.out_dims, L(1, 7, 2));
}

static void missing_shapes(void **state) {
  (void)state;
  /* groups 2, XIO (K, ICg=4, OC=8): IC = 8; 2*(7-1) + 3 - 1 - 1 = 13. */
  cg_problem p = kt_problem(CG_OP_CONV_BWD_DATA, L(2, 7, 7, 8), L(3, 3, 4, 8));
  p.attrs.groups = 2;
  p.attrs.strides = L(2, 2);
  p.attrs.pads_begin = L(1, 1);
  p.attrs.pads_end = L(1, 1);
  cg_geom g = kt_resolve_ok(&p);
  kt_dims_eq(g.out_dims, L(2, 13, 13, 8));
  assert_int_equal(g.ic, 8);
  p.attrs.output_padding = L(1, 0);
  g = kt_resolve_ok(&p);
  kt_dims_eq(g.out_dims, L(2, 14, 13, 8));
  /* No inference with SAME_*. */
  p.attrs.auto_pad = CG_AUTO_PAD_SAME_LOWER;
  kt_resolve_fails(&p, CG_EINVAL, "dst_shape: required with auto_pad");

  cg_problem w = kt_problem(CG_OP_CONV_BWD_WEIGHTS, L(1, 3, 8), L(1, 4, 6));
  kt_resolve_fails(&w, CG_EINVAL, "weights_shape: required");
  w.op = CG_OP_DECONV_BWD_WEIGHTS;
  kt_resolve_fails(&w, CG_EINVAL, "weights_shape: required");
  /* An empty shape input means "not given" too. */
  w.has_shape_input = 1;
  kt_resolve_fails(&w, CG_EINVAL, "weights_shape: required");
}

static void shape_input_wins(void **state) {
  (void)state;
  cg_problem p = kt_problem(CG_OP_CONV_BWD_DATA, L(1, 1, 6, 6), L(1, 1, 3, 3));
  p.attrs.data_format = CG_DATA_NCX;
  p.attrs.weights_format = CG_WEIGHTS_OIX;
  p.attrs.dst_shape = L(1, 1, 9, 9); /* inconsistent on its own */
  kt_resolve_fails(&p, CG_EINVAL, "diff_dst[2]: must be 7");
  p.has_shape_input = 1;
  p.shape_input = L(1, 1, 8, 8);
  cg_geom g = kt_resolve_ok(&p);
  kt_dims_eq(g.out_dims, L(1, 1, 8, 8));

  cg_problem w = kt_problem(CG_OP_CONV_BWD_WEIGHTS, L(1, 8, 3), L(1, 6, 4));
  w.attrs.weights_shape = L(5, 3, 4);
  w.has_shape_input = 1;
  w.shape_input = L(3, 3, 4);
  g = kt_resolve_ok(&w);
  kt_dims_eq(g.out_dims, L(3, 3, 4));
  assert_int_equal(g.kernel[0], 3);
}

/* IOX with groups is (IC, OC/g, K), as oneDNN and PyTorch use it. */
static void iox_with_groups(void **state) {
  (void)state;
  cg_problem p = kt_problem(CG_OP_DECONV_BWD_WEIGHTS, L(2, 4, 2), L(2, 4, 2));
  p.attrs.data_format = CG_DATA_NCX;
  p.attrs.weights_format = CG_WEIGHTS_IOX;
  p.attrs.groups = 2;
  p.attrs.pads_begin = L(1);
  p.attrs.pads_end = L(1);
  p.attrs.weights_shape = L(4, 2, 3);
  cg_geom g = kt_resolve_ok(&p);
  kt_dims_eq(g.out_dims, L(4, 2, 3));
  assert_int_equal(g.ic, 4);
  assert_int_equal(g.oc, 4);
  /* The seed spec's (IC/g, OC, K) is rejected. */
  p.attrs.weights_shape = L(2, 4, 3);
  kt_resolve_fails(&p, CG_EINVAL,
                   "weights_shape: expected 4 input channels (IC of src), "
                   "got 2");
  /* Asking for the older OIX spelling (OC/g, IC, K) of the output. */
  p.attrs.weights_shape = L(4, 2, 3);
  p.out_weights_format = CG_WEIGHTS_OIX;
  g = kt_resolve_ok(&p);
  kt_dims_eq(g.out_dims, L(2, 4, 3));

  /* ConvTransposeBackwardData: diff_src C = IC from the weights. */
  cg_problem d = kt_problem(CG_OP_DECONV_BWD_DATA, L(1, 6, 5), L(4, 3, 3));
  d.attrs.data_format = CG_DATA_NCX;
  d.attrs.weights_format = CG_WEIGHTS_IOX;
  d.attrs.groups = 2;
  g = kt_resolve_ok(&d);
  kt_dims_eq(g.out_dims, L(1, 4, 3));
  assert_int_equal(g.oc, 6);
}

/* ConvTransposeBackwardData inference with and without output_padding. */
static void deconv_data_inference(void **state) {
  (void)state;
  /* S 2, K 3, pads 1+1: diff_dst 8 -> floor((8+2-3)/2)+1 = 4, implied
   * output_padding 1. */
  cg_problem p = kt_problem(CG_OP_DECONV_BWD_DATA, L(1, 8, 6), L(3, 6, 5));
  p.attrs.strides = L(2);
  p.attrs.pads_begin = L(1);
  p.attrs.pads_end = L(1);
  cg_geom g = kt_resolve_ok(&p);
  kt_dims_eq(g.out_dims, L(1, 4, 5));
  assert_int_equal(g.output_padding[0], 1);
  p.attrs.output_padding = L(1);
  g = kt_resolve_ok(&p);
  kt_dims_eq(g.out_dims, L(1, 4, 5));
  p.attrs.output_padding = L(0);
  kt_resolve_fails(&p, CG_EINVAL, "output_padding[0]: 0 leaves diff_dst");
  /* Dilation 3 > stride 2 allows output_padding up to 2. */
  p.attrs.dilations = L(3);
  p.attrs.output_padding = L(2);
  p.input_dims[0] = L(1, 13, 6);
  g = kt_resolve_ok(&p);
  /* (13 + 2 - 7 - 2) / 2 + 1 = 4 */
  kt_dims_eq(g.out_dims, L(1, 4, 5));
  p.attrs.output_padding = L(3);
  kt_resolve_fails(&p, CG_EINVAL,
                   "output_padding[0]: must be < max(stride, dilation) = 3");
}

static void sizes_and_flops(void **state) {
  (void)state;
  cg_problem p = kt_problem(CG_OP_CONV_BWD_DATA, L(2, 4, 5, 5), L(4, 3, 3, 3));
  p.dtype = CG_DTYPE_BF16;
  p.attrs.data_format = CG_DATA_NCX;
  p.attrs.weights_format = CG_WEIGHTS_OIX;
  p.attrs.pads_begin = L(1, 1);
  p.attrs.pads_end = L(1, 1);
  p.out_data_format = CG_DATA_NXC;
  cg_geom g = kt_resolve_ok(&p);
  assert_int_equal(g.in_rank, 4);
  kt_dims_eq(g.in_dims[0], L(2, 4, 5, 5));
  kt_dims_eq(g.in_dims[1], L(4, 3, 3, 3));
  assert_int_equal(g.in_elems[0], 200);
  assert_int_equal(g.in_bytes[0], 400);
  assert_int_equal(g.in_bytes[1], 216);
  kt_dims_eq(g.out_dims, L(2, 5, 5, 3));
  assert_int_equal(g.out_elems, 150);
  assert_int_equal(g.out_bytes, 300);
  assert_int_equal(g.out_data_format, CG_DATA_NXC);
  assert_int_equal(g.data_format, CG_DATA_NCX);
  /* 2 * mb 2 * OC 4 * 25 points * ICg 3 * 9 taps */
  assert_true(g.flops == 2.0 * 2 * 4 * 25 * 3 * 9);
  assert_int_equal(cg_geom_flops(&g), 2 * 2 * 4 * 25 * 3 * 9);

  char err[128];
  assert_int_equal(cg_geom_check_input_bytes(&g, 0, 400, err, sizeof(err)), 0);
  assert_int_equal(cg_geom_check_input_bytes(&g, 1, 215, err, sizeof(err)),
                   CG_EINVAL);
  assert_string_equal(err, "weights: expected 216 bytes (108 x bf16), got 215");
  assert_int_equal(cg_geom_check_input_bytes(&g, 0, 0, err, sizeof(err)),
                   CG_EINVAL);
  assert_non_null(strstr(err, "diff_dst: expected 400 bytes"));
  assert_int_equal(cg_geom_check_input_bytes(&g, 2, 0, err, sizeof(err)),
                   CG_EINVAL);
}

/* Defaults: NXC data, XIO (conv) / XOI (deconv) weights, output layout =
 * input layout; 12-zero pads lists; both op name generations. */
static void defaults_and_names(void **state) {
  (void)state;
  cg_problem p = kt_problem(CG_OP_CONV_BWD_DATA, L(1, 4, 4, 2), L(1, 1, 3, 2));
  p.attrs.pads_begin = L(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  p.attrs.output_padding = L(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  cg_geom g = kt_resolve_ok(&p);
  assert_int_equal(g.data_format, CG_DATA_NXC);
  assert_int_equal(g.weights_format, CG_WEIGHTS_XIO);
  assert_int_equal(g.out_data_format, CG_DATA_NXC);
  kt_dims_eq(g.out_dims, L(1, 4, 4, 3));
  assert_int_equal(g.stride[1], 1);
  assert_int_equal(g.dilation[0], 1);

  cg_problem d = kt_problem(CG_OP_DECONV_BWD_WEIGHTS, L(1, 2, 3), L(1, 4, 5));
  d.attrs.weights_shape = L(3, 5, 3);
  g = kt_resolve_ok(&d);
  assert_int_equal(g.weights_format, CG_WEIGHTS_XOI);
  assert_int_equal(g.out_weights_format, CG_WEIGHTS_XOI);

  static const struct {
    const char *name;
    cg_op op;
  } ops[] = {
      {"ConvolutionBackwardData", CG_OP_CONV_BWD_DATA},
      {"ConvolutionBackpropData", CG_OP_CONV_BWD_DATA},
      {"ConvolutionBackpropData-1", CG_OP_CONV_BWD_DATA},
      {"ConvolutionBackwardWeights-1", CG_OP_CONV_BWD_WEIGHTS},
      {"ConvolutionBackpropFilters", CG_OP_CONV_BWD_WEIGHTS},
      {"ConvTransposeBackwardData", CG_OP_DECONV_BWD_DATA},
      {"ConvTransposeBackpropData-1", CG_OP_DECONV_BWD_DATA},
      {"ConvTransposeBackwardWeights", CG_OP_DECONV_BWD_WEIGHTS},
      {"ConvTransposeBackpropFilters-1", CG_OP_DECONV_BWD_WEIGHTS},
  };
  for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
    cg_op op = CG_OP_INVALID;
    assert_int_equal(cg_op_parse(ops[i].name, &op), 0);
    assert_int_equal(op, ops[i].op);
  }
  cg_op op;
  assert_int_equal(cg_op_parse("convolutionbackwarddata", &op), CG_EINVAL);
  assert_int_equal(cg_op_parse("ConvolutionBackwardData-2", &op), CG_EINVAL);
  assert_int_equal(cg_op_parse(NULL, &op), CG_EINVAL);
  for (int o = 1; o <= CG_OP_COUNT; o++) {
    const char *const *a = cg_op_aliases((cg_op)o);
    assert_string_equal(a[0], cg_op_name((cg_op)o));
    int n = 0;
    for (; a[n] != NULL; n++) {
      assert_int_equal(cg_op_parse(a[n], &op), 0);
      assert_int_equal(op, o);
    }
    assert_int_equal(n, 4);
  }
  assert_null(cg_op_aliases(CG_OP_INVALID)[0]);
  assert_string_equal(cg_op_name((cg_op)9), "?");

  cg_auto_pad ap;
  const char *const pads[] = {"None", "NONE", "same_upper", "SAME_LOWER",
                              "Valid"};
  const cg_auto_pad want[] = {CG_AUTO_PAD_NONE, CG_AUTO_PAD_NONE,
                              CG_AUTO_PAD_SAME_UPPER, CG_AUTO_PAD_SAME_LOWER,
                              CG_AUTO_PAD_VALID};
  for (int i = 0; i < 5; i++) {
    assert_int_equal(cg_auto_pad_parse(pads[i], &ap), 0);
    assert_int_equal(ap, want[i]);
  }
  assert_int_equal(cg_auto_pad_parse("foo", &ap), CG_EINVAL);
  assert_int_equal(cg_auto_pad_parse("same", &ap), CG_EINVAL);
  assert_string_equal(cg_auto_pad_name(CG_AUTO_PAD_SAME_LOWER), "same_lower");

  cg_dtype dt;
  assert_int_equal(cg_dtype_parse("bf16", &dt), 0);
  assert_int_equal(dt, CG_DTYPE_BF16);
  assert_int_equal(cg_dtype_parse("F32", &dt), CG_EINVAL);
  assert_int_equal(cg_dtype_size(CG_DTYPE_F16), 2);
  assert_int_equal(cg_dtype_size(CG_DTYPE_F32), 4);
  assert_int_equal(cg_dtype_size(CG_DTYPE_INVALID), 0);
  cg_data_format df;
  assert_int_equal(cg_data_format_parse("NCX", &df), 0);
  assert_int_equal(df, CG_DATA_NCX);
  assert_int_equal(cg_data_format_parse("ncx", &df), CG_EINVAL);
  cg_weights_format wf;
  assert_int_equal(cg_weights_format_parse("XOI", &wf), 0);
  assert_int_equal(wf, CG_WEIGHTS_XOI);
  assert_int_equal(cg_weights_format_parse("OIHW", &wf), CG_EINVAL);
  assert_string_equal(cg_weights_format_name(CG_WEIGHTS_IOX), "IOX");
  assert_string_equal(cg_data_format_name(CG_DATA_NXC), "NXC");
  assert_string_equal(cg_dtype_name(CG_DTYPE_F16), "f16");

  assert_string_equal(cg_op_input_name(CG_OP_CONV_BWD_WEIGHTS, 0), "src");
  assert_string_equal(cg_op_input_name(CG_OP_CONV_BWD_WEIGHTS, 2),
                      "weights_shape");
  assert_string_equal(cg_op_input_name(CG_OP_DECONV_BWD_DATA, 1), "weights");
  assert_null(cg_op_input_name(CG_OP_DECONV_BWD_DATA, 2));
  assert_string_equal(cg_op_output_name(CG_OP_DECONV_BWD_DATA), "diff_src");
  assert_string_equal(cg_op_output_name(CG_OP_DECONV_BWD_WEIGHTS),
                      "diff_weights");
  assert_true(cg_op_outputs_weights(CG_OP_CONV_BWD_WEIGHTS));
  assert_false(cg_op_outputs_weights(CG_OP_CONV_BWD_DATA));
}

/* Strides of every weights format against an index built by hand from the
 * layout table of SEMANTICS.md, on a grouped 2D problem: g 2, IC 4, OC 6,
 * K 3x2. For every physical position the logical [g][o][i][kh][kw] address
 * must land on that position. */
static void check_weights_format(const cg_geom *g, cg_weights_format asked,
                                 cg_weights_format f, int deconv) {
  const int64_t G = 2, ICg = 2, OCg = 3, IC = 4, OC = 6, KH = 3, KW = 2;
  int64_t st[CG_MAX_RANK + 1];
  cg_geom_weights_strides(g, asked, st);
  int64_t d0, d1, pos = 0;
  /* Physical dims in row-major order, as (A, B, kh, kw) or (kh, kw, A, B). */
  int kfirst = f == CG_WEIGHTS_XIO || f == CG_WEIGHTS_XOI;
  int ofirst = f == CG_WEIGHTS_OIX || f == CG_WEIGHTS_XOI;
  int64_t osz = deconv ? OCg : OC, isz = deconv ? IC : ICg;
  d0 = ofirst ? osz : isz;
  d1 = ofirst ? isz : osz;
  for (int64_t x0 = 0; x0 < (kfirst ? KH : d0); x0++)
    for (int64_t x1 = 0; x1 < (kfirst ? KW : d1); x1++)
      for (int64_t x2 = 0; x2 < (kfirst ? d0 : KH); x2++)
        for (int64_t x3 = 0; x3 < (kfirst ? d1 : KW); x3++, pos++) {
          int64_t a = kfirst ? x2 : x0, b = kfirst ? x3 : x1;
          int64_t kh = kfirst ? x0 : x2, kw = kfirst ? x1 : x3;
          int64_t O = ofirst ? a : b, I = ofirst ? b : a;
          int64_t grp, o, i;
          if (deconv) { /* I holds all IC; group = I / ICg */
            grp = I / ICg, i = I % ICg, o = O;
          } else { /* O holds all OC; group = O / OCg */
            grp = O / OCg, o = O % OCg, i = I;
          }
          int64_t off =
              grp * st[0] + o * st[1] + i * st[2] + kh * st[3] + kw * st[4];
          if (off != pos)
            fail_msg("%s %s: (g%lld o%lld i%lld kh%lld kw%lld) -> %lld, "
                     "expected %lld",
                     deconv ? "deconv" : "conv", cg_weights_format_name(f),
                     (long long)grp, (long long)o, (long long)i, (long long)kh,
                     (long long)kw, (long long)off, (long long)pos);
        }
  assert_int_equal(pos, G * OCg * ICg * KH * KW);
}

static void weights_strides(void **state) {
  (void)state;
  cg_problem c =
      kt_problem(CG_OP_CONV_BWD_WEIGHTS, L(1, 5, 5, 4), L(1, 3, 4, 6));
  c.attrs.groups = 2;
  c.attrs.weights_shape = L(3, 2, 2, 6);
  cg_geom g = kt_resolve_ok(&c);
  check_weights_format(&g, CG_WEIGHTS_OIX, CG_WEIGHTS_OIX, 0);
  check_weights_format(&g, CG_WEIGHTS_XIO, CG_WEIGHTS_XIO, 0);
  check_weights_format(&g, CG_WEIGHTS_DEFAULT, CG_WEIGHTS_XIO, 0);

  cg_problem d =
      kt_problem(CG_OP_DECONV_BWD_WEIGHTS, L(1, 3, 4, 4), L(1, 5, 5, 6));
  d.attrs.groups = 2;
  d.attrs.weights_shape = L(3, 2, 3, 4); /* XOI: (K, OCg, IC) */
  g = kt_resolve_ok(&d);
  check_weights_format(&g, CG_WEIGHTS_IOX, CG_WEIGHTS_IOX, 1);
  check_weights_format(&g, CG_WEIGHTS_XOI, CG_WEIGHTS_XOI, 1);
  check_weights_format(&g, CG_WEIGHTS_OIX, CG_WEIGHTS_OIX, 1);
  check_weights_format(&g, CG_WEIGHTS_XIO, CG_WEIGHTS_XIO, 1);
  check_weights_format(&g, CG_WEIGHTS_DEFAULT, CG_WEIGHTS_XOI, 1);
}

/* Data strides: [n][c][x...] for NCX and NXC, checked on a 3D tensor. */
static void data_strides(void **state) {
  (void)state;
  cg_problem p =
      kt_problem(CG_OP_CONV_BWD_DATA, L(2, 3, 4, 5, 6), L(1, 1, 1, 3, 6));
  cg_geom g = kt_resolve_ok(&p);
  const int64_t sp[3] = {3, 4, 5};
  int64_t st[CG_MAX_RANK];
  cg_geom_data_strides(&g, CG_DATA_NCX, 6, sp, st);
  kt_dims_eq(st, L(360, 60, 20, 5, 1));
  cg_geom_data_strides(&g, CG_DATA_NXC, 6, sp, st);
  kt_dims_eq(st, L(360, 1, 120, 30, 6));
}

/* cg_geom_flops against counts by hand: 2 * mb * groups * OCg * ICg *
 * kernel points * dst points of the direct convolution. */
static void flops_by_hand(void **state) {
  (void)state;
  /* The CPU hog of issue 12: 3-D, 31^3 kernel, pads 15 keep 24^3. */
  cg_problem w = kt_problem(CG_OP_CONV_BWD_WEIGHTS, L(1, 24, 24, 24, 16),
                            L(1, 24, 24, 24, 16));
  w.attrs.weights_shape = L(31, 31, 31, 16, 16);
  w.attrs.pads_begin = L(15, 15, 15);
  w.attrs.pads_end = L(15, 15, 15);
  cg_geom g = kt_resolve_ok(&w);
  assert_int_equal(cg_geom_flops(&g),
                   UINT64_C(2) * 16 * 16 * 29791 * 13824); /* 210.9 G */

  /* ConvTranspose, groups 2: its input (4 ch, 5 points) is the dst of the
   * direct convolution; stride 2 and a 3-tap kernel make 11 outputs. */
  cg_problem d = kt_problem(CG_OP_DECONV_BWD_DATA, L(2, 11, 6), L(3, 3, 4));
  d.attrs.groups = 2;
  d.attrs.strides = L(2);
  g = kt_resolve_ok(&d);
  assert_int_equal(g.in_sp[0], 5);
  assert_int_equal(cg_geom_flops(&g), 2 * 2 * 2 * 3 * 2 * 3 * 5);
  assert_true(g.flops == (double)cg_geom_flops(&g));

  /* Depthwise 2-D, stride 2: ICg = OCg = 1. */
  cg_problem dw =
      kt_problem(CG_OP_CONV_BWD_WEIGHTS, L(3, 9, 9, 8), L(3, 4, 4, 8));
  dw.attrs.groups = 8;
  dw.attrs.strides = L(2, 2);
  dw.attrs.weights_shape = L(3, 3, 1, 8);
  g = kt_resolve_ok(&dw);
  assert_int_equal(cg_geom_flops(&g), 2 * 3 * 8 * 1 * 1 * 9 * 16);

  /* The largest dims saturate instead of wrapping. */
  cg_geom big;
  memset(&big, 0, sizeof big);
  big.op = CG_OP_CONV_BWD_WEIGHTS;
  big.nsp = 3;
  big.mb = big.ic = big.oc = CG_MAX_DIM;
  big.groups = 1;
  for (int i = 0; i < 3; i++)
    big.kernel[i] = big.out_sp[i] = CG_MAX_DIM;
  assert_true(cg_geom_flops(&big) == UINT64_MAX);
  big.mb = big.ic = big.oc = 1;
  big.kernel[0] = big.kernel[1] = big.kernel[2] = 1;
  big.out_sp[0] = big.out_sp[1] = big.out_sp[2] = 1 << 20;
  assert_true(cg_geom_flops(&big) == UINT64_C(1) << 61);
  big.out_sp[0] = big.out_sp[1] = big.out_sp[2] = 1 << 21; /* 2 * 2^63 */
  assert_true(cg_geom_flops(&big) == UINT64_MAX);
}

/* A slice of n rows has the geometry of the same problem with mb = n. */
static void expect_slice(cg_problem *p, cg_ints in0_n, cg_ints in1_n) {
  cg_geom g = kt_resolve_ok(p), s;
  assert_int_equal(cg_geom_slice_mb(&g, 0, &s), CG_EINVAL);
  assert_int_equal(cg_geom_slice_mb(&g, g.mb + 1, &s), CG_EINVAL);
  assert_int_equal(cg_geom_slice_mb(&g, in0_n.v[0], &s), 0);
  p->input_dims[0] = in0_n;
  p->input_dims[1] = in1_n;
  cg_geom want = kt_resolve_ok(p);
  assert_int_equal(s.mb, want.mb);
  for (int t = 0; t < 2; t++) {
    kt_dims_eq(s.in_dims[t], (cg_ints){want.in_dims[t], (size_t)want.in_rank});
    assert_int_equal(s.in_elems[t], want.in_elems[t]);
    assert_int_equal(s.in_bytes[t], want.in_bytes[t]);
  }
  kt_dims_eq(s.out_dims, (cg_ints){want.out_dims, (size_t)want.in_rank});
  assert_int_equal(s.out_elems, want.out_elems);
  assert_int_equal(s.out_bytes, want.out_bytes);
  assert_int_equal(cg_geom_flops(&s), cg_geom_flops(&want));
}

static void slices(void **state) {
  (void)state;
  cg_problem d = kt_problem(CG_OP_CONV_BWD_DATA, L(5, 4, 4, 6), L(3, 3, 2, 6));
  d.dtype = CG_DTYPE_BF16;
  d.attrs.pads_begin = d.attrs.pads_end = L(1, 1);
  expect_slice(&d, L(2, 4, 4, 6), L(3, 3, 2, 6));
  cg_problem t = kt_problem(CG_OP_DECONV_BWD_DATA, L(3, 4, 11), L(6, 4, 3));
  t.attrs.data_format = CG_DATA_NCX;
  t.attrs.weights_format = CG_WEIGHTS_IOX;
  t.attrs.strides = L(2);
  expect_slice(&t, L(1, 4, 11), L(6, 4, 3));
  cg_problem w =
      kt_problem(CG_OP_CONV_BWD_WEIGHTS, L(4, 7, 7, 8), L(4, 5, 5, 2));
  w.attrs.weights_shape = L(3, 3, 8, 2);
  expect_slice(&w, L(3, 7, 7, 8), L(3, 5, 5, 2));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(same_odd_total_conv),
      cmocka_unit_test(same_odd_total_deconv),
      cmocka_unit_test(dilation_and_stride),
      cmocka_unit_test(negative_total_clamped),
      cmocka_unit_test(missing_shapes),
      cmocka_unit_test(shape_input_wins),
      cmocka_unit_test(iox_with_groups),
      cmocka_unit_test(deconv_data_inference),
      cmocka_unit_test(sizes_and_flops),
      cmocka_unit_test(flops_by_hand),
      cmocka_unit_test(slices),
      cmocka_unit_test(defaults_and_names),
      cmocka_unit_test(weights_strides),
      cmocka_unit_test(data_strides),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
