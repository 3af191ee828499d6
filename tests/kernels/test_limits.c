/* test_limits.c - the service limits on spatial attributes (cg/limits.h):
 * each limit holds at its value and refuses one past it, naming the field,
 * the value and the limit; auto_pad's computed pads, ConvTranspose
 * output_padding and the layer ops are checked like given values; and
 * cg_geom_work counts the padded extent that strides and pads make. */
#include "cg/layer.h"
#include "cg/limits.h"
#include "kt.h"

/* A 1-D problem: op over src/dst of the given sizes and attributes. */
static cg_geom conv_w(int64_t in, int64_t k, int64_t s, int64_t d, int64_t pb,
                      int64_t pe) {
  int64_t reach = (k - 1) * d + 1, out = (in + pb + pe - reach) / s + 1;
  cg_problem p = kt_problem(CG_OP_CONV_BWD_WEIGHTS, L(1, in, 1), L(1, out, 1));
  p.attrs.weights_shape = L(k, 1, 1);
  p.attrs.strides = L(s);
  p.attrs.dilations = L(d);
  p.attrs.pads_begin = L(pb);
  p.attrs.pads_end = L(pe);
  return kt_resolve_ok(&p);
}

static void expect_over(const cg_geom *g, const cg_limits *l, cg_limit want,
                        const char *text) {
  char err[256] = "";
  cg_limit which = CG_LIMIT_COUNT;
  int rc = cg_geom_check_limits(g, l, &which, err, sizeof err);
  if (rc != CG_EINVAL || which != want || !strstr(err, text))
    fail_msg("expected %s over (\"%s\"), got %s, %s: \"%s\"",
             cg_limit_name(want), text, cg_err_name(rc), cg_limit_name(which),
             err);
}

static void expect_within(const cg_geom *g, const cg_limits *l) {
  char err[256] = "";
  if (cg_geom_check_limits(g, l, NULL, err, sizeof err) != 0)
    fail_msg("refused: %s", err);
}

static void each_limit_at_and_past(void **state) {
  (void)state;
  cg_limits l;
  cg_limits_default(&l);
  int64_t s = CG_LIMIT_STRIDE_DEFAULT, d = CG_LIMIT_DILATION_DEFAULT;
  int64_t p = CG_LIMIT_PAD_DEFAULT;
  cg_geom g = conv_w(1, 1, s, 1, 0, 0);
  expect_within(&g, &l);
  g = conv_w(1, 1, s + 1, 1, 0, 0);
  expect_over(&g, &l, CG_LIMIT_STRIDE,
              "strides[0]: 4097 exceeds the limit 4096 on strides");
  g = conv_w(1, 2, 1, d, d / 2, d - d / 2);
  expect_within(&g, &l);
  g = conv_w(1, 2, 1, d + 1, 0, d + 1);
  expect_over(&g, &l, CG_LIMIT_DILATION,
              "dilations[0]: 4097 exceeds the limit 4096 on dilations");
  g = conv_w(1, 1, s, 1, p, 0);
  expect_within(&g, &l);
  g = conv_w(1, 1, s, 1, p + 1, 0);
  expect_over(&g, &l, CG_LIMIT_PAD,
              "pads_begin[0]: 65537 exceeds the limit 65536 on pads");
  g = conv_w(1, 1, s, 1, 0, p + 1);
  expect_over(&g, &l, CG_LIMIT_PAD, "pads_end[0]: 65537 exceeds");
  /* The reach of an undilated kernel is its size. */
  int64_t e = CG_LIMIT_EFFECTIVE_EXTENT_DEFAULT;
  g = conv_w(e, e, 1, 1, 0, 0);
  expect_within(&g, &l);
  g = conv_w(e + 1, e + 1, 1, 1, 0, 0);
  expect_over(&g, &l, CG_LIMIT_EFFECTIVE_EXTENT,
              "dilations[0], weights: the kernel's effective extent "
              "(65537-1)*1+1 = 65537 exceeds the limit 65536");
  int64_t x = CG_LIMIT_PADDED_EXTENT_DEFAULT;
  g = conv_w(x - 2, 1, 1, 1, 1, 1);
  expect_within(&g, &l);
  g = conv_w(x - 1, 1, 1, 1, 1, 1);
  expect_over(&g, &l, CG_LIMIT_PADDED_EXTENT,
              "pads_begin[0], pads_end[0]: the input extent 16777215 padded "
              "by 1+1 is 16777217, above the limit 16777216");
  /* A server may set lower limits. */
  l.max[CG_LIMIT_STRIDE] = 2;
  g = conv_w(5, 1, 3, 1, 0, 0);
  expect_over(&g, &l, CG_LIMIT_STRIDE, "the limit 2 on strides");
}

/* auto_pad's pads and a ConvTranspose's output_padding count too, and the
 * ConvTranspose's padded side is its output. */
static void computed_pads_and_deconv(void **state) {
  (void)state;
  cg_limits l;
  cg_limits_default(&l);
  l.max[CG_LIMIT_PAD] = 3;
  /* SAME_UPPER on a 9-tap kernel over 5 points: 8 pads, 4 + 4. */
  cg_problem p = kt_problem(CG_OP_CONV_BWD_WEIGHTS, L(1, 5, 1), L(1, 5, 1));
  p.attrs.weights_shape = L(9, 1, 1);
  p.attrs.auto_pad = CG_AUTO_PAD_SAME_UPPER;
  cg_geom g = kt_resolve_ok(&p);
  expect_over(&g, &l, CG_LIMIT_PAD, "pads_begin[0]: 4 exceeds the limit 3");

  cg_limits_default(&l);
  l.max[CG_LIMIT_OUTPUT_PADDING] = 2;
  l.max[CG_LIMIT_PADDED_EXTENT] = 12;
  /* ConvTranspose: 3 inputs, stride 4, 1 tap: 4*2+1 = 9, + 3 = 12. */
  cg_problem d = kt_problem(CG_OP_DECONV_BWD_WEIGHTS, L(1, 3, 1), L(1, 12, 1));
  d.attrs.weights_shape = L(1, 1, 1);
  d.attrs.strides = L(4);
  g = kt_resolve_ok(&d);
  assert_int_equal(g.output_padding[0], 3);
  expect_over(&g, &l, CG_LIMIT_OUTPUT_PADDING,
              "output_padding[0]: 3 exceeds the limit 2 on output_padding");
  l.max[CG_LIMIT_OUTPUT_PADDING] = 3;
  expect_within(&g, &l);
  d.attrs.pads_end = L(1);
  d.input_dims[1] = L(1, 11, 1);
  g = kt_resolve_ok(&d);
  l.max[CG_LIMIT_PADDED_EXTENT] = 11;
  expect_over(&g, &l, CG_LIMIT_PADDED_EXTENT,
              "the output extent 11 padded by 0+1 is 12, above the limit 11");
}

/* A layer op is checked through the parts its outputs need. */
static void layer_parts(void **state) {
  (void)state;
  cg_limits l;
  cg_limits_default(&l);
  l.max[CG_LIMIT_STRIDE] = 2;
  cg_problem p = kt_problem(CG_OP_CONV_BWD, L(1, 9, 1), L(1, 3, 1));
  p.input_dims[2] = L(3, 1, 1);
  p.attrs.strides = L(3);
  cg_layer ly;
  char err[256];
  assert_int_equal(cg_layer_resolve(&p, &ly, err, sizeof err), 0);
  cg_limit which;
  assert_int_equal(cg_layer_check_limits(&ly, &l, &which, err, sizeof err),
                   CG_EINVAL);
  assert_int_equal(which, CG_LIMIT_STRIDE);
  assert_non_null(strstr(err, "strides[0]: 3 exceeds the limit 2"));
  p.grads = CG_GRAD_BIT(CG_GRAD_DIFF_BIAS);
  assert_int_equal(cg_layer_resolve(&p, &ly, err, sizeof err), 0);
  assert_int_equal(cg_layer_check_limits(&ly, &l, NULL, err, sizeof err),
                   CG_EINVAL);
  l.max[CG_LIMIT_STRIDE] = 3;
  assert_int_equal(cg_layer_check_limits(&ly, &l, NULL, err, sizeof err), 0);
}

/* The defaults sit below the maxima, and the names are the fields'. */
static void defaults_and_names(void **state) {
  (void)state;
  cg_limits def, most;
  cg_limits_default(&def);
  cg_limits_max(&most);
  for (int i = 0; i < CG_LIMIT_COUNT; i++) {
    assert_true(def.max[i] > 0 && def.max[i] <= most.max[i]);
    assert_string_not_equal(cg_limit_name((cg_limit)i), "?");
  }
  assert_string_equal(cg_limit_name(CG_LIMIT_COUNT), "?");
  assert_string_equal(cg_limit_name(CG_LIMIT_STRIDE), "stride");
}

/* cg_geom_work: the multiply-adds, 2 per element of each tensor and 2 per
 * element of the padded larger side. */
static void work_counts_padded_extent(void **state) {
  (void)state;
  /* A 1-point src, 1 tap, stride 4096, pads 4096 both sides: 3 outputs
   * over a padded extent of 8193. */
  cg_geom g = conv_w(1, 1, 4096, 1, 4096, 4096);
  assert_int_equal(g.out_sp[0], 3);
  assert_int_equal(cg_geom_flops(&g), 2 * 3);
  assert_int_equal(cg_geom_work(&g), 2 * 3 + 2 * (1 + 3 + 1) + 2 * 8193);
  /* ConvTranspose: the output is the padded side. */
  cg_problem d = kt_problem(CG_OP_DECONV_BWD_DATA, L(2, 11, 6), L(3, 3, 4));
  d.attrs.groups = 2;
  d.attrs.strides = L(2);
  g = kt_resolve_ok(&d);
  assert_int_equal(cg_geom_work(&g), cg_geom_flops(&g) + 2 * (2 * 11 * 6) +
                                         2 * (3 * 3 * 4) + 2 * (2 * 5 * 4) +
                                         2 * (2 * 6 * 11));
  /* Saturated, not wrapped. */
  g.mb = INT64_MAX / 2;
  assert_true(cg_geom_work(&g) == UINT64_MAX);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(each_limit_at_and_past),
      cmocka_unit_test(computed_pads_and_deconv),
      cmocka_unit_test(layer_parts),
      cmocka_unit_test(defaults_and_names),
      cmocka_unit_test(work_counts_padded_extent),
  };
  return cmocka_run_group_tests_name("kernels_limits", tests, NULL, NULL);
}
