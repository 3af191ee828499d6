/* test_graph.c - unit tests of the oneDNN graph JSON op reader: both
 * spec generations' files in tests/client/data (checked field by field and
 * resolved by the kernels' validator), and the rejections (unknown
 * attribute, non-dense strides, no gradient op, not JSON, attrs not an
 * object, a shape whose stride check overflows). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "graph.h"

static const char *data_dir;
static char tmp_path[128];

static void path_of(char *buf, size_t len, const char *name) {
  snprintf(buf, len, "%s/%s", data_dir, name);
}

static void assert_list(const cgc_list *l, size_t n, const int64_t *want) {
  assert_int_equal(l->len, n);
  for (size_t i = 0; i < n; i++)
    assert_int_equal(l->v[i], want[i]);
}

static void test_conv_bwd_data(void **state) {
  (void)state;
  char path[512], err[512];
  cgc_spec s;
  path_of(path, sizeof path, "conv_bwd_d_2d.json");
  assert_int_equal(cgc_graph_load(path, 0, &s, err, sizeof err), 0);
  assert_int_equal(s.op, CG_OP_CONV_BWD_DATA);
  assert_int_equal(s.dtype, CG_DTYPE_F32);
  assert_int_equal(s.data_format, CG_DATA_NCX);
  assert_int_equal(s.weights_format, CG_WEIGHTS_OIX);
  assert_int_equal(s.groups, 2);
  assert_int_equal(s.auto_pad, CG_AUTO_PAD_NONE);
  assert_list(&s.strides, 2, (const int64_t[]){2, 2});
  assert_list(&s.pads_begin, 2, (const int64_t[]){1, 1});
  assert_list(&s.dst_shape, 4, (const int64_t[]){1, 4, 8, 8});
  assert_int_equal(s.rank[0], 4);
  assert_int_equal(s.dims[0][1], 6);
  assert_int_equal(s.dims[1][0], 6);
  assert_int_equal(s.dims[1][1], 2);
  /* What the file describes is a valid problem with the file's output. */
  cg_problem p;
  cg_geom g;
  cgc_spec_problem(&s, &p);
  assert_int_equal(cg_problem_resolve(&p, &g, err, sizeof err), 0);
  assert_int_equal(g.out_dims[0], 1);
  assert_int_equal(g.out_dims[1], 4);
  assert_int_equal(g.out_dims[2], 8);
  assert_int_equal(g.out_dims[3], 8);
}

static void test_older_names_and_skips_other_ops(void **state) {
  (void)state;
  char path[512], err[512];
  cgc_spec s;
  path_of(path, sizeof path, "deconv_bwd_w_v06.json");
  assert_int_equal(cgc_graph_load(path, 0, &s, err, sizeof err), 0);
  assert_int_equal(s.op, CG_OP_DECONV_BWD_WEIGHTS);
  assert_int_equal(s.dtype, CG_DTYPE_BF16);
  assert_int_equal(s.data_format, CG_DATA_NXC);
  assert_int_equal(s.weights_format, CG_WEIGHTS_XOI);
  assert_int_equal(s.output_padding.len, 12);
  assert_list(&s.weights_shape, 4, (const int64_t[]){3, 3, 4, 3});
  cg_problem p;
  cg_geom g;
  cgc_spec_problem(&s, &p);
  if (cg_problem_resolve(&p, &g, err, sizeof err))
    fail_msg("resolve: %s", err);
  assert_int_equal(g.ic, 3);
  assert_int_equal(g.oc, 4);
  /* There is only one gradient op in the file. */
  assert_int_equal(cgc_graph_load(path, 1, &s, err, sizeof err), CG_EINVAL);
  assert_non_null(strstr(err, "found 1"));
}

static int th_write(const char *text) {
  FILE *fp = fopen(tmp_path, "w");
  if (!fp)
    return -1;
  fputs(text, fp);
  return fclose(fp);
}

static void expect_error(const char *json, const char *needle) {
  char err[512] = "";
  cgc_spec s;
  assert_int_equal(th_write(json), 0);
  assert_int_equal(cgc_graph_load(tmp_path, 0, &s, err, sizeof err), CG_EINVAL);
  if (!strstr(err, needle))
    fail_msg("message '%s' lacks '%s'", err, needle);
}

#define OP_HEAD                                                                \
  "{\"graph\": [{\"kind\": \"ConvolutionBackwardData\", \"attrs\": {"
#define TENSORS                                                                \
  "\"inputs\": [{\"dtype\": \"f32\", \"shape\": [1, 4, 4, 4]},"                \
  " {\"dtype\": \"f32\", \"shape\": [3, 3, 4, 4]}]}]}"

static void test_rejections(void **state) {
  (void)state;
  expect_error(OP_HEAD
               "\"kernel\": {\"type\": \"s64[]\", \"value\": [3]}}, " TENSORS,
               "attrs.kernel: unknown attribute");
  expect_error(OP_HEAD "\"strides\": {\"type\": \"s64[]\", \"value\": "
                       "[1.5, 1]}}, " TENSORS,
               "attrs.strides");
  expect_error(OP_HEAD "\"auto_pad\": {\"type\": \"string\", \"value\": "
                       "\"sideways\"}}, " TENSORS,
               "bad value 'sideways'");
  expect_error(OP_HEAD "}, \"inputs\": [{\"dtype\": \"f32\", \"shape\": "
                       "[1, 4, 4, 4], \"stride\": [64, 1, 16, 4]}, "
                       "{\"dtype\": \"f32\", \"shape\": [3, 3, 4, 4]}]}]}",
               "not dense");
  expect_error(OP_HEAD "}, \"inputs\": [{\"dtype\": \"s8\", \"shape\": "
                       "[1, 4, 4, 4]}, {\"dtype\": \"f32\", \"shape\": "
                       "[3, 3, 4, 4]}]}]}",
               "dtype 's8'");
  expect_error("{\"graph\": [{\"kind\": \"MatMul\"}]}", "found 0");
  expect_error("{\"nodes\": []}", "no \"graph\" array");
  expect_error("{\"graph\": [", "not valid JSON");
}

/* An "attrs" array once reached strcmp with its members' NULL names. */
static void test_attrs_array_rejected(void **state) {
  (void)state;
  expect_error(
      "{\"graph\": [{\"kind\": \"ConvolutionBackwardData\", "
      "\"attrs\": [{\"type\": \"s64[]\", \"value\": [1, 1]}], " TENSORS,
      "attrs must be an object");
  expect_error("{\"graph\": [{\"kind\": \"ConvolutionBackwardData\", "
               "\"attrs\": 3, " TENSORS,
               "attrs must be an object");
}

/* The dense-stride check multiplied the dims without an overflow check
 * (signed overflow, fatal under UBSan). */
static void test_stride_check_overflow(void **state) {
  (void)state;
  expect_error(OP_HEAD
               "}, \"inputs\": [{\"dtype\": \"f32\", \"shape\": "
               "[4294967296, 4294967296], \"stride\": [4294967296, 1]}, "
               "{\"dtype\": \"f32\", \"shape\": [3, 3, 4, 4]}]}]}",
               "inputs[0]: the shape's element count overflows");
}

int main(int argc, char **argv) {
  data_dir = argc > 1 ? argv[1] : "tests/client/data";
  snprintf(tmp_path, sizeof tmp_path, "/tmp/cgc-graph-test-%d.json",
           (int)getpid());
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conv_bwd_data),
      cmocka_unit_test(test_older_names_and_skips_other_ops),
      cmocka_unit_test(test_rejections),
      cmocka_unit_test(test_attrs_array_rejected),
      cmocka_unit_test(test_stride_check_overflow),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  unlink(tmp_path);
  return rc;
}
