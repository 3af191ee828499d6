/* test_invalid.c - invalid problems: each one is a valid base problem with
 * one thing broken, and must fail with its own error code and a message
 * that names the field. */
#include <inttypes.h>

#include "kt.h"

/* Valid bases, one per op (checked by base_problems_are_valid). Their
 * lists are static: the returned problem outlives the function. */
#define SL(name, ...)                                                          \
  static const int64_t name##_v[] = {__VA_ARGS__};                             \
  const cg_ints name = {name##_v, sizeof(name##_v) / sizeof(int64_t)}

static cg_problem conv_data(void) { /* g 2: IC 8, OC 8, 5x5, 3x3 pad 1 */
  SL(dd, 2, 8, 5, 5);
  SL(w, 8, 4, 3, 3);
  SL(pad, 1, 1);
  cg_problem p = kt_problem(CG_OP_CONV_BWD_DATA, dd, w);
  p.attrs.data_format = CG_DATA_NCX;
  p.attrs.weights_format = CG_WEIGHTS_OIX;
  p.attrs.groups = 2;
  p.attrs.pads_begin = pad;
  p.attrs.pads_end = pad;
  p.attrs.dst_shape = dd;
  return p;
}

static cg_problem conv_weights(void) {
  SL(x, 2, 8, 5, 5);
  SL(w, 8, 4, 3, 3);
  SL(pad, 1, 1);
  cg_problem p = kt_problem(CG_OP_CONV_BWD_WEIGHTS, x, x);
  p.attrs.data_format = CG_DATA_NCX;
  p.attrs.weights_format = CG_WEIGHTS_OIX;
  p.attrs.groups = 2;
  p.attrs.pads_begin = pad;
  p.attrs.pads_end = pad;
  p.attrs.weights_shape = w;
  return p;
}

static cg_problem deconv_data(void) { /* IC 4, OC 6, g 2, 5 -> 9, S 2 */
  SL(dd, 2, 6, 9);
  SL(w, 4, 3, 3);
  SL(one, 1);
  SL(two, 2);
  cg_problem p = kt_problem(CG_OP_DECONV_BWD_DATA, dd, w);
  p.attrs.data_format = CG_DATA_NCX;
  p.attrs.weights_format = CG_WEIGHTS_IOX;
  p.attrs.groups = 2;
  p.attrs.strides = two;
  p.attrs.pads_begin = one;
  p.attrs.pads_end = one;
  return p;
}

static cg_problem deconv_weights(void) {
  SL(src, 2, 4, 5);
  SL(dd, 2, 6, 9);
  SL(w, 4, 3, 3);
  SL(one, 1);
  SL(two, 2);
  cg_problem p = kt_problem(CG_OP_DECONV_BWD_WEIGHTS, src, dd);
  p.attrs.data_format = CG_DATA_NCX;
  p.attrs.weights_format = CG_WEIGHTS_IOX;
  p.attrs.groups = 2;
  p.attrs.strides = two;
  p.attrs.pads_begin = one;
  p.attrs.pads_end = one;
  p.attrs.weights_shape = w;
  return p;
}

static void base_problems_are_valid(void **state) {
  (void)state;
  cg_problem p = conv_data();
  kt_resolve_ok(&p);
  p = conv_weights();
  kt_resolve_ok(&p);
  p = deconv_data();
  cg_geom g = kt_resolve_ok(&p);
  kt_dims_eq(g.out_dims, L(2, 4, 5));
  p = deconv_weights();
  kt_resolve_ok(&p);
}

static int ncases;

/* One invalid problem: start from base, apply the statements, expect code
 * and a message containing msg. */
#define INVALID(base, code, msg, ...)                                          \
  do {                                                                         \
    cg_problem p = base();                                                     \
    __VA_ARGS__;                                                               \
    kt_resolve_fails(&p, code, msg);                                           \
    ncases++;                                                                  \
  } while (0)

static void bad_enums(void **state) {
  (void)state;
  INVALID(conv_data, CG_EINVAL, "op: invalid value 0", p.op = CG_OP_INVALID);
  INVALID(conv_data, CG_EINVAL, "op: invalid value 7", p.op = (cg_op)7);
  INVALID(conv_data, CG_EINVAL, "dtype: invalid value 0",
          p.dtype = CG_DTYPE_INVALID);
  INVALID(conv_data, CG_EINVAL, "dtype: invalid value 9",
          p.dtype = (cg_dtype)9);
  INVALID(conv_data, CG_EINVAL, "data_format: invalid value 5",
          p.attrs.data_format = (cg_data_format)5);
  INVALID(conv_data, CG_EINVAL, "weights_format: invalid value 9",
          p.attrs.weights_format = (cg_weights_format)9);
  INVALID(conv_data, CG_EINVAL, "auto_pad: invalid value 4",
          p.attrs.auto_pad = (cg_auto_pad)4);
  INVALID(conv_data, CG_EINVAL, "out_data_format: invalid value -1",
          p.out_data_format = (cg_data_format)-1);
  INVALID(conv_weights, CG_EINVAL, "out_weights_format: invalid value 5",
          p.out_weights_format = (cg_weights_format)5);
  INVALID(conv_data, CG_EINVAL,
          "weights_format: IOX is a ConvTranspose layout; "
          "ConvolutionBackwardData takes OIX or XIO",
          p.attrs.weights_format = CG_WEIGHTS_IOX);
  INVALID(conv_weights, CG_EINVAL, "weights_format: XOI is a ConvTranspose",
          p.attrs.weights_format = CG_WEIGHTS_XOI);
  INVALID(conv_weights, CG_EINVAL,
          "out_weights_format: IOX is a ConvTranspose layout",
          p.out_weights_format = CG_WEIGHTS_IOX);
  INVALID(conv_data, CG_EINVAL,
          "out_weights_format: ConvolutionBackwardData outputs a data tensor",
          p.out_weights_format = CG_WEIGHTS_OIX);
  INVALID(deconv_weights, CG_EINVAL,
          "out_data_format: ConvTransposeBackwardWeights outputs weights",
          p.out_data_format = CG_DATA_NCX);
}

static void bad_ranks_and_dims(void **state) {
  (void)state;
  INVALID(conv_data, CG_EINVAL, "diff_dst: rank must be 3, 4 or 5, got 2",
          p.input_dims[0] = L(2, 8));
  INVALID(conv_data, CG_EINVAL, "diff_dst: rank must be 3, 4 or 5, got 6",
          p.input_dims[0] = L(2, 8, 5, 5, 1, 1));
  INVALID(conv_data, CG_EINVAL, "weights: expected rank 4 (as diff_dst), got 3",
          p.input_dims[1] = L(8, 4, 3));
  INVALID(conv_weights, CG_EINVAL, "diff_dst: expected rank 4 (as src), got 5",
          p.input_dims[1] = L(2, 8, 5, 5, 1));
  INVALID(conv_data, CG_EINVAL, "diff_dst[1]: must be > 0, got 0",
          p.input_dims[0] = L(2, 0, 5, 5));
  INVALID(conv_data, CG_EINVAL, "weights[2]: must be > 0, got -3",
          p.input_dims[1] = L(8, 4, -3, 3));
  INVALID(conv_data, CG_EINVAL, "dst_shape: expected rank 4",
          p.attrs.dst_shape = L(2, 8, 5));
  INVALID(conv_data, CG_EINVAL, "dst_shape[3]: must be > 0, got 0",
          p.attrs.dst_shape = L(2, 8, 5, 0));
  INVALID(conv_weights, CG_EINVAL, "weights_shape: expected rank 4",
          p.attrs.weights_shape = L(8, 4, 3, 3, 3));
  INVALID(conv_data, CG_EINVAL, "diff_dst: NULL dims with length 4",
          p.input_dims[0].v = NULL);
}

static void bad_attribute_lists(void **state) {
  (void)state;
  INVALID(conv_data, CG_EINVAL, "strides[1]: must be > 0, got 0",
          p.attrs.strides = L(1, 0));
  INVALID(conv_data, CG_EINVAL, "strides[0]: must be > 0, got -2",
          p.attrs.strides = L(-2, 1));
  INVALID(conv_data, CG_EINVAL,
          "strides: expected 2 values for 2 spatial dims, got 3",
          p.attrs.strides = L(1, 1, 1));
  INVALID(conv_data, CG_EINVAL,
          "strides: expected 2 values for 2 spatial dims, got 1",
          p.attrs.strides = L(1));
  INVALID(conv_data, CG_EINVAL,
          "strides: expected 3 values for 3 spatial dims, got 2",
          p.input_dims[0] = L(2, 8, 5, 5, 5);
          p.input_dims[1] = L(8, 4, 3, 3, 3);
          p.attrs.dst_shape = L(2, 8, 5, 5, 5); p.attrs.strides = L(1, 1));
  INVALID(conv_weights, CG_EINVAL, "dilations[0]: must be > 0, got 0",
          p.attrs.dilations = L(0, 1));
  INVALID(conv_weights, CG_EINVAL,
          "dilations: expected 2 values for 2 spatial dims, got 4",
          p.attrs.dilations = L(1, 1, 1, 1));
  INVALID(conv_weights, CG_EINVAL, "pads_begin[1]: must be >= 0, got -1",
          p.attrs.pads_begin = L(1, -1));
  INVALID(conv_weights, CG_EINVAL,
          "pads_end: expected 2 values for 2 spatial dims, got 3",
          p.attrs.pads_end = L(1, 1, 0));
  INVALID(deconv_data, CG_EINVAL, "output_padding[0]: must be >= 0, got -1",
          p.attrs.output_padding = L(-1));
  INVALID(deconv_weights, CG_EINVAL,
          "output_padding: expected 1 values for 1 spatial dims, got 2",
          p.attrs.output_padding = L(1, 0));
  /* All-zero lists are fine at any length, but not beyond the cap. */
  INVALID(conv_weights, CG_EINVAL, "pads_begin: 17 values, at most 16",
          p.attrs.pads_begin =
              L(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
  INVALID(conv_weights, CG_EINVAL, "strides: NULL values with length 2",
          p.attrs.strides.v = NULL;
          p.attrs.strides.len = 2);
  INVALID(conv_data, CG_EINVAL, "groups: must be > 0, got 0",
          p.attrs.groups = 0);
  INVALID(conv_data, CG_EINVAL, "groups: must be > 0, got -2",
          p.attrs.groups = -2);
}

static void inapplicable_attributes(void **state) {
  (void)state;
  INVALID(conv_weights, CG_EINVAL,
          "output_padding: not an attribute of ConvolutionBackwardWeights",
          p.attrs.output_padding = L(0, 0));
  INVALID(conv_weights, CG_EINVAL,
          "dst_shape: not an attribute of ConvolutionBackwardWeights",
          p.attrs.dst_shape = L(2, 8, 5, 5));
  INVALID(deconv_data, CG_EINVAL,
          "dst_shape: not an attribute of ConvTransposeBackwardData",
          p.attrs.dst_shape = L(2, 4, 5));
  INVALID(conv_data, CG_EINVAL,
          "weights_shape: not an attribute of ConvolutionBackwardData",
          p.attrs.weights_shape = L(8, 4, 3, 3));
  INVALID(deconv_data, CG_EINVAL,
          "weights_shape: not an attribute of ConvTransposeBackwardData",
          p.attrs.weights_shape = L(4, 3, 3));
  INVALID(deconv_data, CG_EINVAL,
          "shape input: ConvTransposeBackwardData takes only diff_dst",
          p.has_shape_input = 1;
          p.shape_input = L(2, 4, 5));
}

static void channel_and_group_mismatches(void **state) {
  (void)state;
  INVALID(conv_data, CG_EINVAL,
          "weights: expected 8 output channels (OC of diff_dst), got 6",
          p.input_dims[1] = L(6, 4, 3, 3));
  INVALID(conv_data, CG_EINVAL,
          "groups: diff_dst channels (OC=8) are not divisible by groups=3",
          p.attrs.groups = 3);
  INVALID(conv_data, CG_EINVAL,
          "weights: expected 8 input channels per group (IC=16, groups=2), "
          "got 4",
          p.attrs.dst_shape = L(2, 16, 5, 5));
  INVALID(conv_data, CG_EINVAL,
          "groups: dst_shape channels (IC=7) are not divisible by groups=2",
          p.attrs.dst_shape = L(2, 7, 5, 5));
  /* Depthwise with a data tensor that does not have g channels. */
  INVALID(conv_data, CG_EINVAL,
          "groups: dst_shape channels (IC=4) are not divisible by groups=8",
          p.attrs.groups = 8;
          p.input_dims[1] = L(8, 1, 3, 3); p.attrs.dst_shape = L(2, 4, 5, 5));
  INVALID(conv_weights, CG_EINVAL,
          "weights_shape: expected 4 input channels per group (IC=8, "
          "groups=2), got 8",
          p.attrs.weights_shape = L(8, 8, 3, 3));
  INVALID(conv_weights, CG_EINVAL,
          "weights_shape: expected 8 output channels (OC of diff_dst), got 4",
          p.attrs.weights_shape = L(4, 4, 3, 3));
  INVALID(conv_weights, CG_EINVAL,
          "groups: src channels (IC=9) are not divisible by groups=2",
          p.input_dims[0] = L(2, 9, 5, 5));
  INVALID(deconv_data, CG_EINVAL,
          "weights: expected 3 output channels per group (OC=6, groups=2), "
          "got 6",
          p.input_dims[1] = L(4, 6, 3));
  INVALID(deconv_data, CG_EINVAL,
          "groups: weights channels (IC=5) are not divisible by groups=2",
          p.input_dims[1] = L(5, 3, 3));
  /* The seed spec's IOX (IC/g, OC, K) spelling is not accepted. */
  INVALID(deconv_weights, CG_EINVAL,
          "weights_shape: expected 4 input channels (IC of src), got 2",
          p.attrs.weights_shape = L(2, 6, 3));
  INVALID(deconv_weights, CG_EINVAL,
          "weights_shape: expected 3 output channels per group (OC=6, "
          "groups=2), got 4",
          p.attrs.weights_shape = L(4, 4, 3));
}

static void shape_inconsistencies(void **state) {
  (void)state;
  INVALID(conv_weights, CG_EINVAL,
          "diff_dst[0]: batch 3 does not match src batch 2",
          p.input_dims[1] = L(3, 8, 5, 5));
  INVALID(conv_data, CG_EINVAL,
          "dst_shape[0]: batch 1 does not match diff_dst batch 2",
          p.attrs.dst_shape = L(1, 8, 5, 5));
  INVALID(conv_weights, CG_EINVAL, "diff_dst[2]: must be 5 for src size 5",
          p.input_dims[1] = L(2, 8, 4, 5));
  INVALID(conv_data, CG_EINVAL,
          "weights: effective kernel 9 on spatial dim 0 is larger than the "
          "padded dst_shape size 7",
          p.input_dims[1] = L(8, 4, 9, 3));
  INVALID(conv_weights, CG_EINVAL,
          "weights_shape: effective kernel 9 on spatial dim 1",
          p.attrs.dilations = L(1, 4));
  INVALID(deconv_weights, CG_EINVAL,
          "diff_dst[2]: must be 9 + output_padding in [0, 2) for src size 5",
          p.input_dims[1] = L(2, 6, 12));
  INVALID(deconv_weights, CG_EINVAL,
          "output_padding[0]: the shapes imply 0, got 1",
          p.attrs.output_padding = L(1));
  INVALID(deconv_data, CG_EINVAL,
          "output_padding[0]: must be < max(stride, dilation) = 2, got 2",
          p.attrs.output_padding = L(2));
  INVALID(deconv_data, CG_EINVAL,
          "diff_dst[2]: size 1 is smaller than the effective kernel 5",
          p.input_dims[0] = L(2, 6, 1);
          p.input_dims[1] = L(4, 3, 5));
  INVALID(conv_data, CG_EINVAL, "dst_shape: required with auto_pad=same_upper",
          p.attrs.dst_shape.len = 0;
          p.attrs.auto_pad = CG_AUTO_PAD_SAME_UPPER);
  INVALID(conv_data, CG_EINVAL, "dst_shape: cannot infer spatial dim 0",
          p.attrs.dst_shape.len = 0;
          p.attrs.pads_begin = L(5, 1); p.attrs.pads_end = L(5, 1);
          p.input_dims[0] = L(2, 8, 1, 5));
  INVALID(conv_data, CG_EINVAL,
          "output_padding[1]: must be < strides[1] (2) to infer dst_shape",
          p.attrs.dst_shape.len = 0;
          p.attrs.strides = L(2, 2); p.input_dims[0] = L(2, 8, 3, 3);
          p.attrs.output_padding = L(1, 2));
  INVALID(conv_weights, CG_EINVAL, "weights_shape: required",
          p.attrs.weights_shape.len = 0);
}

static void overflowing_sizes(void **state) {
  (void)state;
  INVALID(conv_data, CG_ERANGE,
          "diff_dst[0]: 4294967296 exceeds the largest dim 2147483647",
          p.input_dims[0] = L(INT64_C(4294967296), 8, 5, 5));
  INVALID(conv_weights, CG_ERANGE, "strides[0]: 3000000000 exceeds",
          p.attrs.strides = L(INT64_C(3000000000), 1));
  INVALID(conv_weights, CG_ERANGE, "groups: 2147483648 exceeds",
          p.attrs.groups = INT64_C(2147483648));
  INVALID(conv_weights, CG_ERANGE, "pads_end[1]: 9223372036854775807 exceeds",
          p.attrs.pads_end = L(1, INT64_MAX));
  /* (2^31-1)^3 elements do not fit in size_t. */
  INVALID(conv_weights, CG_ERANGE, "src: element count overflows",
          p.attrs.groups = 1;
          p.input_dims[0] = L(2147483647, 2147483647, 2147483647);
          p.input_dims[1] = L(2147483647, 1, 2147483647);
          p.attrs.weights_shape = L(1, 2147483647, 1);
          p.attrs.pads_begin.len = 0; p.attrs.pads_end.len = 0);
  /* ~2^63 elements fit; their f32 bytes do not. */
  INVALID(conv_weights, CG_ERANGE, "src: byte size of", p.attrs.groups = 1;
          p.input_dims[0] = L(2147483647, 2147483647, 2);
          p.input_dims[1] = L(2147483647, 1, 2);
          p.attrs.weights_shape = L(1, 2147483647, 1);
          p.attrs.pads_begin.len = 0; p.attrs.pads_end.len = 0);
  /* The inferred diff_src would be 2^32 wide. */
  INVALID(conv_data, CG_ERANGE, "dst_shape: inferred spatial dim 1 is",
          p.attrs.dst_shape.len = 0;
          p.attrs.strides = L(1, 2); p.input_dims[0] = L(2, 8, 5, 2147483647));
  /* IC = groups * ICg beyond the dim cap. */
  INVALID(conv_data, CG_ERANGE, "weights: IC = groups x 4",
          p.attrs.dst_shape.len = 0;
          p.attrs.groups = 1073741824; p.input_dims[0] = L(1, 1073741824, 5, 5);
          p.input_dims[1] = L(1073741824, 4, 3, 3));
}

/* oneDNN 2.6 checks descriptors in int: the effective kernel, pads_end +
 * stride and the padded size must stay within 2^31-1, or it refuses the
 * problem (or checks wrapped values). */
static void beyond_onednn_int(void **state) {
  (void)state;
  const int64_t h = INT64_C(1) << 30;
  /* The case: stride and pads of 2^30 around a 1x1 kernel. */
  INVALID(conv_data, CG_ERANGE,
          "strides[0]: 1073741824 + pads_end[0] 1073741824 exceeds oneDNN's "
          "int limit 2147483647",
          p.attrs.groups = 1;
          p.input_dims[0] = L(1, 4, 3, 3); p.input_dims[1] = L(4, 4, 1, 1);
          p.attrs.dst_shape = L(1, 4, 1, 1); p.attrs.strides = L(h, h);
          p.attrs.pads_begin = L(h, h); p.attrs.pads_end = L(h, h));
  INVALID(conv_weights, CG_ERANGE,
          "pads_begin[1], pads_end[1]: src size 5 padded by "
          "1073741824+1073741824 is 2147483653, above oneDNN's int limit",
          p.attrs.pads_begin = L(1, h);
          p.attrs.pads_end = L(1, h));
  INVALID(deconv_weights, CG_ERANGE,
          "dilations[0]: effective kernel (3-1)*1073741824+1 = 2147483649 "
          "exceeds oneDNN's int limit",
          p.attrs.dilations = L(h));
  /* Pads from auto_pad count too: T = EK - 1 = 2^31 - 2 around 5. */
  INVALID(conv_weights, CG_ERANGE,
          "pads_begin[0], pads_end[0]: src size 5 padded by "
          "1073741823+1073741823 is 2147483651",
          p.attrs.auto_pad = CG_AUTO_PAD_SAME_UPPER;
          p.attrs.dilations = L(h - 1, 1));
  INVALID(deconv_data, CG_ERANGE,
          "strides[0]: 2147483647 + pads_end[0] 1 exceeds",
          p.attrs.strides = L(2147483647));

  /* Right at the limits oneDNN takes them. */
  cg_problem p = conv_data();
  p.attrs.groups = 1;
  p.input_dims[0] = L(1, 4, 3, 3);
  p.input_dims[1] = L(4, 4, 1, 1);
  p.attrs.dst_shape = L(1, 4, 1, 1);
  p.attrs.strides = L(h - 1, h - 1);
  p.attrs.pads_begin = L(h - 1, h - 1);
  p.attrs.pads_end = L(h - 1, h - 1);
  kt_resolve_ok(&p);
  p = deconv_data();
  p.attrs.strides = L(2147483646);
  kt_resolve_ok(&p);
  /* EK = 2^31 - 1, padded to 1 + 2 * (2^30 - 1) = 2^31 - 1. */
  p = deconv_weights();
  p.attrs.dilations = L(h - 1);
  p.attrs.pads_begin = L(h - 1);
  p.attrs.pads_end = L(h - 1);
  p.input_dims[0] = L(2, 4, 1);
  p.input_dims[1] = L(2, 6, 1);
  kt_resolve_ok(&p);
}

/* A buffer whose byte length does not match its shape and dtype. */
static void wrong_byte_length(void **state) {
  (void)state;
  cg_problem p = deconv_weights();
  p.dtype = CG_DTYPE_F16;
  cg_geom g = kt_resolve_ok(&p);
  char err[128];
  assert_int_equal(
      cg_geom_check_input_bytes(&g, 1, 2 * 6 * 9 * 4, err, sizeof(err)),
      CG_EINVAL);
  assert_string_equal(err, "diff_dst: expected 216 bytes (108 x f16), got 432");
  assert_int_equal(cg_geom_check_input_bytes(&g, 0, 41, err, sizeof(err)),
                   CG_EINVAL);
  assert_non_null(strstr(err, "src: expected 80 bytes"));
  assert_int_equal(cg_geom_check_input_bytes(&g, 1, 216, err, sizeof(err)), 0);
  ncases += 2;
}

/* Errors with a NULL or tiny buffer still return the code. */
static void error_buffer_optional(void **state) {
  (void)state;
  cg_problem p = conv_data();
  p.attrs.strides = L(0, 1);
  cg_geom g;
  assert_int_equal(cg_problem_resolve(&p, &g, NULL, 0), CG_EINVAL);
  char small[8];
  assert_int_equal(cg_problem_resolve(&p, &g, small, sizeof(small)), CG_EINVAL);
  assert_string_equal(small, "strides");
}

static void count_cases(void **state) {
  (void)state;
  printf("%d invalid problems rejected with their code and field\n", ncases);
  assert_true(ncases >= 40);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(base_problems_are_valid),
      cmocka_unit_test(bad_enums),
      cmocka_unit_test(bad_ranks_and_dims),
      cmocka_unit_test(bad_attribute_lists),
      cmocka_unit_test(inapplicable_attributes),
      cmocka_unit_test(channel_and_group_mismatches),
      cmocka_unit_test(shape_inconsistencies),
      cmocka_unit_test(overflowing_sizes),
      cmocka_unit_test(beyond_onednn_int),
      cmocka_unit_test(wrong_byte_length),
      cmocka_unit_test(error_buffer_optional),
      cmocka_unit_test(count_cases),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
