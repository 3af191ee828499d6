/* test_server_crash_text.c - the job text a crash report carries
 * (cgs_crash_describe), without a server: the call's id, its peer escaped
 * as every log value is (a peer cannot end the record or add a key), the
 * op, dtype, shapes and attributes of a single op and of a layer op, and a
 * text cut to its buffer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cg/layer.h"
#include "cgs_crash.h"

#define L(...)                                                                 \
  ((cg_ints){(const int64_t[]){__VA_ARGS__},                                   \
             sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)})

static cg_layer resolve(cg_problem *p) {
  cg_layer l;
  char err[256];
  if (cg_layer_resolve(p, &l, err, sizeof err))
    fail_msg("rejected: %s", err);
  return l;
}

static void single_op(void **state) {
  (void)state;
  cg_problem p;
  cg_problem_init(&p);
  p.op = CG_OP_CONV_BWD_WEIGHTS;
  p.dtype = CG_DTYPE_BF16;
  p.attrs.data_format = CG_DATA_NCX;
  p.attrs.weights_format = CG_WEIGHTS_OIX;
  p.input_dims[0] = L(1, 2, 5, 9);
  p.input_dims[1] = L(1, 2, 3, 3);
  p.attrs.weights_shape = L(2, 2, 3, 3);
  p.attrs.strides = L(1, 4);
  p.attrs.pads_end = L(0, 2);
  cg_layer l = resolve(&p);
  char buf[768];
  cgs_crash_describe(buf, sizeof buf, 42, "ipv4:127.0.0.1:5000", &l);
  assert_string_equal(
      buf, "job: compute id=42 peer=ipv4:127.0.0.1:5000 "
           "op=ConvolutionBackwardWeights dtype=bf16 in=1x2x5x9,1x2x3x3 "
           "out=2x2x3x3 groups=1 strides=1,4 dilations=1,1 pads_begin=0,0 "
           "pads_end=0,2 output_padding=0,0 data_format=NCX "
           "weights_format=OIX");
  /* A peer that tries to end the record and forge a key. */
  cgs_crash_describe(buf, sizeof buf, 1, "x\n2026 error crash job=none a=b",
                     &l);
  assert_non_null(strstr(buf, "peer=\"x\\x0a2026 error crash job=none "
                              "a=b\" op="));
  assert_null(strchr(buf, '\n'));
  /* Cut to the buffer, never past it. */
  char small[40];
  memset(small, 'z', sizeof small);
  cgs_crash_describe(small, 32, 1, "p", &l);
  assert_int_equal(strlen(small), 31);
  assert_int_equal(small[32], 'z');
}

static void layer_op(void **state) {
  (void)state;
  cg_problem p;
  cg_problem_init(&p);
  p.op = CG_OP_DECONV_BWD;
  p.dtype = CG_DTYPE_F32;
  p.input_dims[0] = L(2, 3, 4); /* src, NXC */
  p.input_dims[1] = L(2, 7, 6); /* diff_dst */
  p.input_dims[2] = L(3, 6, 4); /* weights, XOI */
  p.attrs.strides = L(2);
  p.grads = CG_GRAD_BIT(CG_GRAD_DIFF_WEIGHTS) | CG_GRAD_BIT(CG_GRAD_DIFF_BIAS);
  cg_layer l = resolve(&p);
  char buf[768];
  cgs_crash_describe(buf, sizeof buf, 7, "unix:/run/cg.sock", &l);
  assert_string_equal(
      buf, "job: compute id=7 peer=unix:/run/cg.sock op=ConvTransposeBackward "
           "dtype=f32 in=2x3x4,2x7x6,3x6x4 out=3x6x4,6 groups=1 strides=2 "
           "dilations=1 pads_begin=0 pads_end=0 output_padding=0 "
           "data_format=NXC weights_format=XOI");
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(single_op),
                                     cmocka_unit_test(layer_op)};
  return cmocka_run_group_tests_name("server_crash_text", tests, NULL, NULL);
}
