/* test_layer.c - a layer's backward on the engine: random
 * ConvolutionBackward and ConvTransposeBackward problems (ranks, strides,
 * dilations, pads, auto_pad, output_padding, groups, every layout and
 * f32/bf16/f16) with every subset of outputs must match the reference;
 * the parts resolve to the single ops' geometries; outputs not asked for
 * are left alone; and the reference's diff_bias matches a sum taken
 * straight from the NCX-indexed tensor. On every ISA up to the machine's
 * (et_main_per_isa). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cg/dtype.h"
#include "cg/engine.h"
#include "cg/layer.h"
#include "cg/reference.h"
#include "et.h"

#define SEED 20261125u
#define COUNT 420
#define SENTINEL 0x5a

/* diff_bias tolerance: the result's rounding to the dtype (1e-5 relative
 * for f32), plus f32 sums of runs of up to 256 elements out of L. */
static double bias_tolerance(cg_dtype dt, double scale, double l, double amax) {
  double round = dt == CG_DTYPE_F32 ? 1e-5 : 2.0 * cg_dtype_epsilon(dt);
  double run = l < 256 ? l : 256;
  return round * scale + run * cg_dtype_epsilon(CG_DTYPE_F32) * l * amax;
}

static int all_bytes(const void *p, size_t n, unsigned char v) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i] != v)
      return 0;
  return 1;
}

/* Bytes of output g whether l answers it or not. */
static size_t grad_bytes(const cg_layer *l, int g) {
  if (g == CG_GRAD_DIFF_BIAS)
    return (size_t)l->weights.oc * cg_dtype_size(l->dtype);
  return cg_layer_geom(l, (cg_grad)g)->out_bytes;
}

static void check_output(const cg_layer *l, int g, const void *got,
                         const void *ref, const void *const in[3],
                         const char *desc, int i) {
  cg_dtype dt = l->dtype;
  size_t n = l->out_elems[g];
  et_diff d = et_compare(dt, got, ref, n);
  double tol;
  if (g == CG_GRAD_DIFF_BIAS) {
    double len = (double)l->weights.in_elems[1] / (double)l->weights.oc;
    tol = bias_tolerance(dt, d.scale, len,
                         et_max_abs(dt, in[1], l->weights.in_elems[1]));
  } else {
    const cg_geom *geom = cg_layer_geom(l, (cg_grad)g);
    int a = g == CG_GRAD_DIFF_SRC ? l->data_in[0] : l->weights_in[0];
    int b = g == CG_GRAD_DIFF_SRC ? l->data_in[1] : l->weights_in[1];
    tol = et_tolerance(geom, d.scale, et_max_abs(dt, in[a], geom->in_elems[0]),
                       et_max_abs(dt, in[b], geom->in_elems[1]));
  }
  if (!(d.max_err <= tol))
    fail_msg("case %d %s: max error %g > tolerance %g (scale %g): %s", i,
             cg_grad_name((cg_grad)g), d.max_err, tol, d.scale, desc);
}

static void random_layers(void **state) {
  (void)state;
  static const cg_dtype dts[3] = {CG_DTYPE_F32, CG_DTYPE_BF16, CG_DTYPE_F16};
  et_rng rng = {SEED};
  cg_engine *e;
  char err[512], desc[512];
  cg_engine_config cfg = {2, 0};
  int per_grad[CG_GRAD_COUNT] = {0}, masks[8] = {0};
  assert_int_equal(cg_engine_new(&e, &cfg, err, sizeof err), 0);
  for (int i = 0; i < COUNT; i++) {
    int deconv = i & 1;
    cg_op op = deconv ? CG_OP_DECONV_BWD : CG_OP_CONV_BWD;
    cg_dtype dt = dts[(i / 2) % 3];
    et_case c;
    if (i % 5 == 4)
      et_case_random_wide(&rng, &c, deconv, dt);
    else
      et_case_random(&rng, &c, deconv, dt);
    et_problem ep;
    et_problem_build(&ep, &c, op);
    ep.p.grads = (unsigned)(i / 6) % 8; /* 0: all */
    et_case_str(&c, op, desc, sizeof desc);
    cg_layer l;
    if (cg_layer_resolve(&ep.p, &l, err, sizeof err))
      fail_msg("case %d: rejected: %s (%s)", i, err, desc);
    /* The parts are the single ops' geometries. */
    cg_geom gd =
        et_resolve(&c, deconv ? CG_OP_DECONV_BWD_DATA : CG_OP_CONV_BWD_DATA);
    cg_geom gw = et_resolve(&c, deconv ? CG_OP_DECONV_BWD_WEIGHTS
                                       : CG_OP_CONV_BWD_WEIGHTS);
    if (memcmp(&gw, &l.weights, sizeof gw) != 0 || gd.mb != l.data.mb ||
        gd.ic != l.data.ic ||
        memcmp(gd.in_sp, l.data.in_sp, sizeof gd.in_sp) != 0 ||
        memcmp(gd.pad_begin, l.data.pad_begin, sizeof gd.pad_begin) != 0 ||
        memcmp(gd.output_padding, l.data.output_padding,
               sizeof gd.output_padding) != 0)
      fail_msg("case %d: a part differs from its single op: %s", i, desc);

    const void *in[3];
    void *got[CG_GRAD_COUNT], *ref[CG_GRAD_COUNT];
    for (int t = 0; t < 3; t++)
      in[t] = et_random_tensor(&rng, dt, l.in_bytes[t] / cg_dtype_size(dt));
    for (int g = 0; g < CG_GRAD_COUNT; g++) {
      size_t bytes = grad_bytes(&l, g);
      got[g] = et_alloc(bytes);
      ref[g] = et_alloc(bytes);
      memset(got[g], SENTINEL, bytes);
    }
    cg_run_info info[CG_GRAD_COUNT];
    if (cg_reference_layer(&l, in, ref, err, sizeof err))
      fail_msg("case %d: reference failed: %s (%s)", i, err, desc);
    if (cg_engine_run_layer(e, &l, in, got, info, err, sizeof err))
      fail_msg("case %d: engine failed: %s (%s)", i, err, desc);
    masks[l.grads]++;
    for (int g = 0; g < CG_GRAD_COUNT; g++) {
      if (l.grads & CG_GRAD_BIT(g)) {
        check_output(&l, g, got[g], ref[g], in, desc, i);
        per_grad[g]++;
      } else if (!all_bytes(got[g], grad_bytes(&l, g), SENTINEL)) {
        fail_msg("case %d: %s was written but not asked for: %s", i,
                 cg_grad_name((cg_grad)g), desc);
      }
      free(got[g]);
      free(ref[g]);
    }
    for (int t = 0; t < 3; t++)
      free((void *)in[t]);
  }
  cg_engine_free(e);
  print_message("%d layers: diff_src %d, diff_weights %d, diff_bias %d; "
                "every mask 1..7 seen: %d\n",
                COUNT, per_grad[0], per_grad[1], per_grad[2],
                masks[1] && masks[2] && masks[3] && masks[4] && masks[5] &&
                    masks[6] && masks[7]);
  for (int m = 1; m < 8; m++)
    assert_true(masks[m] > 0);
}

/* diff_bias against sums indexed straight off the NCX and NXC layouts. */
static void bias_by_hand(void **state) {
  (void)state;
  for (int nxc = 0; nxc < 2; nxc++) {
    const int64_t mb = 3, oc = 5, h = 4, w = 7;
    float dd[3 * 5 * 4 * 7], want[5] = {0};
    for (int64_t n = 0; n < mb; n++)
      for (int64_t c = 0; c < oc; c++)
        for (int64_t y = 0; y < h; y++)
          for (int64_t x = 0; x < w; x++) {
            float v = (float)((n * 7 + c * 3 + y * 5 + x) % 11) - 5.0f;
            int64_t off = nxc ? ((n * h + y) * w + x) * oc + c
                              : ((n * oc + c) * h + y) * w + x;
            dd[off] = v;
            want[c] += v;
          }
    cg_geom g;
    memset(&g, 0, sizeof g);
    g.op = CG_OP_CONV_BWD_WEIGHTS;
    g.dtype = CG_DTYPE_F32;
    g.nsp = 2;
    g.mb = mb;
    g.groups = 1;
    g.oc = oc;
    g.ic = 1;
    g.out_sp[0] = h;
    g.out_sp[1] = w;
    g.data_format = nxc ? CG_DATA_NXC : CG_DATA_NCX;
    float ref[5], got[5];
    char err[256];
    cg_engine *e;
    cg_engine_config cfg = {2, 0};
    assert_int_equal(cg_reference_bias(&g, dd, ref, err, sizeof err), 0);
    assert_int_equal(cg_engine_new(&e, &cfg, err, sizeof err), 0);
    assert_int_equal(cg_engine_bias(e, &g, dd, got, NULL, err, sizeof err), 0);
    cg_engine_free(e);
    for (int c = 0; c < oc; c++) {
      assert_float_equal(ref[c], want[c], 0);
      assert_float_equal(got[c], want[c], 0);
    }
  }
}

static int run(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(bias_by_hand),
      cmocka_unit_test(random_layers),
  };
  return cmocka_run_group_tests_name("engine_layer", tests, NULL, NULL);
}

int main(int argc, char **argv) {
  (void)argc;
  return et_main_per_isa(argv, "engine_layer", run);
}
