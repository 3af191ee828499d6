/* test_layer.c - cg_layer_resolve: the single ops resolve into one output
 * exactly as cg_problem_resolve, a layer op into the backward-data and
 * backward-weights geometries of its inputs and diff_bias [OC], and every
 * broken layer request fails with a message naming the field. */
#include "cg/layer.h"
#include "kt.h"

/* ConvolutionBackward, groups 2: src (2, 8, 5, 5) NCX, weights OIX
 * (6, 4, 3, 3), stride 2, pads 1: diff_dst (2, 6, 3, 3). */
static cg_problem conv_layer(const cg_ints *in) {
  cg_problem p = kt_problem(CG_OP_CONV_BWD, in[0], in[1]);
  p.input_dims[2] = in[2];
  p.attrs.data_format = CG_DATA_NCX;
  p.attrs.weights_format = CG_WEIGHTS_OIX;
  p.attrs.groups = 2;
  static const int64_t two[] = {2, 2}, one[] = {1, 1};
  p.attrs.strides = (cg_ints){two, 2};
  p.attrs.pads_begin = p.attrs.pads_end = (cg_ints){one, 2};
  return p;
}

static int layer_fails(const cg_problem *p, int code, const char *want) {
  cg_layer l;
  char err[256] = "";
  int rc = cg_layer_resolve(p, &l, err, sizeof err);
  if (rc != code)
    fail_msg("expected %s containing \"%s\", got %s: \"%s\"", cg_err_name(code),
             want, cg_err_name(rc), err);
  if (strstr(err, want) == NULL)
    fail_msg("message \"%s\" lacks \"%s\"", err, want);
  return 0;
}

/* The outputs' shapes as the server's log and crash report print them;
 * a rank a crash damaged stays within the arrays. */
static void outputs_as_text(void **state) {
  (void)state;
  cg_ints in[3] = {L(2, 8, 5, 5), L(2, 6, 3, 3), L(6, 4, 3, 3)};
  cg_problem p = conv_layer(in);
  cg_layer l;
  char err[256], buf[128];
  assert_int_equal(cg_layer_resolve(&p, &l, err, sizeof err), 0);
  cg_text t;
  cg_text_init(&t, buf, sizeof buf);
  cg_layer_text_outputs(&t, &l);
  assert_string_equal(buf, "2x8x5x5,6x4x3x3,6");
  l.grads = CG_GRAD_BIT(CG_GRAD_DIFF_WEIGHTS);
  l.out_rank[CG_GRAD_DIFF_WEIGHTS] = 1 << 30;
  cg_text_init(&t, buf, sizeof buf);
  cg_layer_text_outputs(&t, &l);
  assert_int_equal(strncmp(buf, "6x4x3x3x", 8), 0);
  assert_true(t.len < sizeof buf);
}

static void conv_layer_outputs(void **state) {
  (void)state;
  cg_ints in[3] = {L(2, 8, 5, 5), L(2, 6, 3, 3), L(6, 4, 3, 3)};
  cg_problem p = conv_layer(in);
  cg_layer l;
  char err[256];
  assert_int_equal(cg_layer_resolve(&p, &l, err, sizeof err), 0);
  assert_int_equal(l.grads, CG_GRADS_ALL);
  assert_int_equal(cg_layer_noutputs(&l), 3);
  assert_int_equal(l.ninputs, 3);
  assert_int_equal(l.data.op, CG_OP_CONV_BWD_DATA);
  assert_int_equal(l.weights.op, CG_OP_CONV_BWD_WEIGHTS);
  kt_dims_eq(l.out_dims[CG_GRAD_DIFF_SRC], in[0]);
  kt_dims_eq(l.out_dims[CG_GRAD_DIFF_WEIGHTS], in[2]);
  assert_int_equal(l.out_rank[CG_GRAD_DIFF_BIAS], 1);
  assert_int_equal(l.out_dims[CG_GRAD_DIFF_BIAS][0], 6);
  assert_int_equal(l.out_bytes[CG_GRAD_DIFF_BIAS], 6 * 4);
  assert_int_equal(l.in_bytes[0], 2 * 8 * 25 * 4);
  assert_int_equal(l.in_bytes[1], 2 * 6 * 9 * 4);
  assert_int_equal(l.in_bytes[2], 6 * 4 * 9 * 4);
  /* Inputs of each part: diff_dst and weights; src and diff_dst. */
  assert_int_equal(l.data_in[0], 1);
  assert_int_equal(l.data_in[1], 2);
  assert_int_equal(l.weights_in[0], 0);
  assert_int_equal(l.weights_in[1], 1);
  /* Both parts are the single ops' own geometries. */
  cg_problem d = kt_problem(CG_OP_CONV_BWD_DATA, in[1], in[2]);
  d.attrs = p.attrs;
  d.attrs.dst_shape = in[0];
  cg_geom gd = kt_resolve_ok(&d);
  assert_memory_equal(&gd, &l.data, sizeof gd);
  cg_problem w = kt_problem(CG_OP_CONV_BWD_WEIGHTS, in[0], in[1]);
  w.attrs = p.attrs;
  w.attrs.weights_shape = in[2];
  cg_geom gw = kt_resolve_ok(&w);
  assert_memory_equal(&gw, &l.weights, sizeof gw);
  assert_true(cg_layer_flops(&l) ==
              cg_geom_flops(&gd) + cg_geom_flops(&gw) + 2 * 6 * 9);
}

static void subsets_and_layouts(void **state) {
  (void)state;
  cg_ints in[3] = {L(2, 8, 5, 5), L(2, 6, 3, 3), L(6, 4, 3, 3)};
  cg_problem p = conv_layer(in);
  cg_layer l;
  char err[256];
  p.grads = CG_GRAD_BIT(CG_GRAD_DIFF_WEIGHTS) | CG_GRAD_BIT(CG_GRAD_DIFF_BIAS);
  p.out_data_format = CG_DATA_NXC;
  p.out_weights_format = CG_WEIGHTS_XIO;
  assert_int_equal(cg_layer_resolve(&p, &l, err, sizeof err), 0);
  assert_int_equal(cg_layer_noutputs(&l), 2);
  assert_int_equal(l.out_bytes[CG_GRAD_DIFF_SRC], 0);
  kt_dims_eq(l.out_dims[CG_GRAD_DIFF_WEIGHTS], L(3, 3, 4, 6));
  assert_int_equal(l.data.out_data_format, CG_DATA_NXC);
  p.grads = CG_GRAD_BIT(CG_GRAD_DIFF_SRC);
  assert_int_equal(cg_layer_resolve(&p, &l, err, sizeof err), 0);
  kt_dims_eq(l.out_dims[CG_GRAD_DIFF_SRC], L(2, 5, 5, 8));
  assert_true(cg_layer_flops(&l) == cg_geom_flops(&l.data));
}

/* ConvTranspose 5 -> 10 with stride 2, kernel 3, pads 1: output_padding
 * 1 is implied by the shapes, given or not. */
static void deconv_layer_output_padding(void **state) {
  (void)state;
  cg_ints in[3] = {L(1, 4, 5), L(1, 6, 10), L(4, 3, 3)};
  cg_problem p = kt_problem(CG_OP_DECONV_BWD, in[0], in[1]);
  p.input_dims[2] = in[2];
  p.attrs.data_format = CG_DATA_NCX;
  p.attrs.weights_format = CG_WEIGHTS_IOX;
  p.attrs.groups = 2;
  p.attrs.strides = L(2);
  p.attrs.pads_begin = p.attrs.pads_end = L(1);
  cg_layer l;
  char err[256];
  assert_int_equal(cg_layer_resolve(&p, &l, err, sizeof err), 0);
  assert_int_equal(l.data.op, CG_OP_DECONV_BWD_DATA);
  assert_int_equal(l.data.output_padding[0], 1);
  kt_dims_eq(l.out_dims[CG_GRAD_DIFF_SRC], in[0]);
  kt_dims_eq(l.out_dims[CG_GRAD_DIFF_WEIGHTS], in[2]);
  assert_int_equal(l.out_dims[CG_GRAD_DIFF_BIAS][0], 6);
  p.attrs.output_padding = L(0);
  layer_fails(&p, CG_EINVAL, "output_padding[0]: the shapes imply 1, got 0");
}

static void single_ops_one_output(void **state) {
  (void)state;
  cg_problem p = kt_problem(CG_OP_CONV_BWD_WEIGHTS, L(1, 2, 5), L(1, 3, 3));
  p.attrs.data_format = CG_DATA_NCX;
  p.attrs.weights_format = CG_WEIGHTS_OIX;
  p.attrs.weights_shape = L(3, 2, 3);
  cg_layer l;
  char err[256];
  assert_int_equal(cg_layer_resolve(&p, &l, err, sizeof err), 0);
  assert_int_equal(l.grads, CG_GRAD_BIT(CG_GRAD_DIFF_WEIGHTS));
  assert_int_equal(l.ninputs, 2);
  kt_dims_eq(l.out_dims[CG_GRAD_DIFF_WEIGHTS], L(3, 2, 3));
  cg_geom g = kt_resolve_ok(&p);
  assert_memory_equal(&g, &l.weights, sizeof g);
  p.grads = CG_GRAD_BIT(CG_GRAD_DIFF_BIAS);
  layer_fails(&p, CG_EINVAL, "outputs: ConvolutionBackwardWeights has one");
}

static void invalid_layer_requests(void **state) {
  (void)state;
  cg_ints in[3] = {L(2, 8, 5, 5), L(2, 6, 3, 3), L(6, 4, 3, 3)};
  cg_problem p = conv_layer(in);
  cg_problem q;

  q = p;
  q.input_dims[2] = L(6, 3, 3, 3);
  layer_fails(&q, CG_EINVAL, "weights: expected 4 input channels per group");
  q = p;
  q.input_dims[2] = L(5, 4, 3, 3);
  layer_fails(&q, CG_EINVAL, "weights: expected 6 output channels");
  q = p;
  q.input_dims[2] = L(6, 4, 3);
  layer_fails(&q, CG_EINVAL, "weights: expected rank 4");
  q = p;
  q.input_dims[1] = L(2, 6, 4, 3);
  layer_fails(&q, CG_EINVAL, "diff_dst[2]: must be 3 for src size 5");
  q = p;
  q.input_dims[1] = L(3, 6, 3, 3);
  layer_fails(&q, CG_EINVAL, "diff_dst[0]: batch 3 does not match src");
  q = p;
  q.input_dims[0] = L(2, 7, 5, 5);
  layer_fails(&q, CG_EINVAL, "groups: src channels");
  q = p;
  q.attrs.output_padding = L(1, 1);
  layer_fails(&q, CG_EINVAL,
              "output_padding: not an attribute of ConvolutionBackward");
  q = p;
  q.attrs.dst_shape = in[0];
  layer_fails(&q, CG_EINVAL,
              "dst_shape: not an attribute of "
              "ConvolutionBackward");
  q = p;
  q.attrs.weights_shape = in[2];
  layer_fails(&q, CG_EINVAL, "weights_shape: not an attribute of");
  q = p;
  q.has_shape_input = 1;
  q.shape_input = in[2];
  layer_fails(&q, CG_EINVAL, "shape input: ConvolutionBackward takes src");
  q = p;
  q.grads = 8;
  layer_fails(&q, CG_EINVAL, "outputs: unknown output");
  q = p;
  q.attrs.weights_format = CG_WEIGHTS_IOX;
  layer_fails(&q, CG_EINVAL,
              "weights_format: IOX is a ConvTranspose layout; "
              "ConvolutionBackward takes");
  q = p;
  q.out_weights_format = CG_WEIGHTS_XOI;
  layer_fails(&q, CG_EINVAL, "out_weights_format: XOI is a ConvTranspose");
  q = p;
  q.out_data_format = (cg_data_format)7;
  layer_fails(&q, CG_EINVAL, "out_data_format: invalid value 7");
  /* cg_problem_resolve is for the single ops. */
  cg_geom g;
  char err[256];
  assert_int_equal(cg_problem_resolve(&p, &g, err, sizeof err), CG_EINVAL);
  assert_non_null(strstr(err, "op: ConvolutionBackward has several outputs"));
}

static void names(void **state) {
  (void)state;
  cg_op op;
  cg_grad g;
  assert_int_equal(cg_op_parse("ConvolutionBackward", &op), 0);
  assert_int_equal(op, CG_OP_CONV_BWD);
  assert_int_equal(cg_op_parse("ConvTransposeBackward", &op), 0);
  assert_int_equal(op, CG_OP_DECONV_BWD);
  assert_string_equal(cg_op_input_name(CG_OP_DECONV_BWD, 2), "weights");
  assert_null(cg_op_output_name(CG_OP_CONV_BWD));
  assert_true(cg_op_is_layer(CG_OP_CONV_BWD));
  assert_false(cg_op_is_layer(CG_OP_CONV_BWD_WEIGHTS));
  for (int i = 0; i < CG_GRAD_COUNT; i++) {
    assert_int_equal(cg_grad_parse(cg_grad_name((cg_grad)i), &g), 0);
    assert_int_equal(g, i);
  }
  assert_int_equal(cg_grad_parse("diff_dst", &g), CG_EINVAL);
  assert_null(cg_grad_name((cg_grad)3));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(outputs_as_text),
      cmocka_unit_test(conv_layer_outputs),
      cmocka_unit_test(subsets_and_layouts),
      cmocka_unit_test(deconv_layer_output_padding),
      cmocka_unit_test(single_ops_one_output),
      cmocka_unit_test(invalid_layer_requests),
      cmocka_unit_test(names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
