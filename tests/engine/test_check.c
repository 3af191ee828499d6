/* test_check.c - the result checks (cg/check.h) on seeded random problems
 * of all four ops, ranks 1-3, every layout, groups, strides, pads,
 * dilations and f32/bf16/f16 (et_case_random, and its wide variant for
 * oneDNN's channel blocks and tails):
 * - correct results pass: the engine's, and the reference's;
 * - one bit flipped among the top 16 of one element of the engine's
 *   result is caught whenever it takes the result outside the
 *   reference's tolerance (et_tolerance);
 * - the layer ops' three outputs, diff_bias included, each pass, and a
 *   flipped diff_bias is caught.
 * The sweep (test_sweep.c) also checks every result it computes, on every
 * ISA up to the machine's. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cg/check.h"
#include "cg/dtype.h"
#include "cg/engine.h"
#include "cg/reference.h"
#include "et.h"

/* Problems of the narrow family; a quarter as many wide ones. Sanitizer
 * builds (CG_SANITIZED) run a fifth of them: the loops are what they
 * instrument, the statistics are the release build's. */
#define CASES 400

static int cases_scaled(int n) {
  return getenv("CG_SANITIZED") ? n / 5 : n;
}

static const cg_op ops[4] = {CG_OP_CONV_BWD_DATA, CG_OP_CONV_BWD_WEIGHTS,
                             CG_OP_DECONV_BWD_DATA, CG_OP_DECONV_BWD_WEIGHTS};
static const cg_dtype dts[3] = {CG_DTYPE_F32, CG_DTYPE_BF16, CG_DTYPE_F16};

/* Flips one bit among the top 16 of element i of buf. */
static void flip(cg_dtype dt, void *buf, size_t i, int bit) {
  if (dt == CG_DTYPE_F32)
    ((uint32_t *)buf)[i] ^= 1u << (16 + bit);
  else
    ((uint16_t *)buf)[i] ^= (uint16_t)(1u << bit);
}

typedef struct tally {
  int cases, injected, wrong, missed; /* missed: wrong and not caught */
  double worst;                       /* of the correct results */
} tally;

static void run_case(cg_engine *e, et_rng *rng, int i, int wide, tally *t) {
  cg_op op = ops[i % 4];
  cg_dtype dt = dts[(i / 4) % 3];
  et_case c;
  char err[256], desc[512];
  if (wide)
    et_case_random_wide(rng, &c, op >= CG_OP_DECONV_BWD_DATA, dt);
  else
    et_case_random(rng, &c, op >= CG_OP_DECONV_BWD_DATA, dt);
  cg_geom g = et_resolve(&c, op);
  et_case_str(&c, op, desc, sizeof desc);
  void *in0 = et_random_tensor(rng, dt, g.in_elems[0]);
  void *in1 = et_random_tensor(rng, dt, g.in_elems[1]);
  void *ref = et_alloc(g.out_bytes), *got = et_alloc(g.out_bytes);
  cg_check_result r;
  uint64_t seed = et_next(rng);

  if (cg_reference_run(&g, in0, in1, ref, err, sizeof err))
    fail_msg("case %d: reference failed: %s (%s)", i, err, desc);
  if (cg_engine_run(e, &g, in0, in1, got, NULL, err, sizeof err))
    fail_msg("case %d: engine failed: %s (%s)", i, err, desc);
  const void *outs[2] = {ref, got};
  for (int k = 0; k < 2; k++) {
    if (cg_check_run(&g, in0, in1, outs[k], seed, 2, &r, err, sizeof err))
      fail_msg("case %d: check failed to run: %s (%s)", i, err, desc);
    if (r.failed)
      fail_msg("case %d: the %s's correct result failed %lld of %lld "
               "comparisons (worst |diff| %g > tolerance %g): %s",
               i, k ? "engine" : "reference", (long long)r.failed,
               (long long)r.compared, r.worst_diff, r.worst_tol, desc);
    if (r.worst > t->worst)
      t->worst = r.worst;
  }
  double tol = et_tolerance(&g, et_compare(dt, ref, ref, g.out_elems).scale,
                            et_max_abs(dt, in0, g.in_elems[0]),
                            et_max_abs(dt, in1, g.in_elems[1]));
  /* A few flips per case, each on its own copy. */
  for (int f = 0; f < 4; f++) {
    size_t at = (size_t)et_range(rng, 0, (int64_t)g.out_elems - 1);
    int bit = (int)et_range(rng, 0, 15);
    flip(dt, got, at, bit);
    et_diff d = et_compare(dt, got, ref, g.out_elems);
    if (cg_check_run(&g, in0, in1, got, seed + 1 + (uint64_t)f, 2, &r, err,
                     sizeof err))
      fail_msg("case %d: check failed to run: %s (%s)", i, err, desc);
    int wrong = !(d.max_err <= tol);
    t->injected++;
    t->wrong += wrong;
    if (wrong && !r.failed) {
      t->missed++;
      if (getenv("CG_CHECK_VERBOSE"))
        print_message("missed: case %d elem %zu bit %d: error %g (tolerance "
                      "%g), worst check %g: %s\n",
                      i, at, bit, d.max_err, tol, r.worst, desc);
    }
    flip(dt, got, at, bit);
  }
  t->cases++;
  free(in0);
  free(in1);
  free(ref);
  free(got);
}

/* max_missed_pct: flips outside the reference's tolerance the check may
 * miss, in percent of the flips. A check compares sums over a group's
 * channels, whose rounding it must allow for: a flip of a low mantissa
 * bit of a bf16 or f16 element is only a few units in the last place, and
 * hides in that allowance more often where groups have tens of channels
 * (the wide problems) than a few. */
static void cases(int wide, uint64_t seed, int count, int max_missed_pct) {
  cg_engine *e;
  cg_engine_config cfg = {0, 0};
  char err[256];
  et_rng rng = {seed};
  tally t = {0};
  assert_int_equal(cg_engine_new(&e, &cfg, err, sizeof err), 0);
  for (int i = 0; i < count; i++)
    run_case(e, &rng, i, wide, &t);
  cg_engine_free(e);
  print_message("%s: %d problems pass (worst |diff|/tolerance %.3g); %d "
                "flips, %d outside the reference's tolerance, %d of those "
                "missed (%.2f%% of the flips)\n",
                wide ? "wide" : "narrow", t.cases, t.worst, t.injected, t.wrong,
                t.missed, 100.0 * t.missed / t.injected);
  /* Most flips matter: a run where few do would test little. */
  assert_true(t.wrong > t.injected / 2);
  assert_true(t.missed * 100 <= t.injected * max_missed_pct);
}

static void test_ops(void **state) {
  (void)state;
  cases(0, 0x37c0ffee, cases_scaled(CASES), 1);
}

static void test_ops_wide(void **state) {
  (void)state;
  cases(1, 0x37beef, cases_scaled(CASES / 4), 5);
}

/* The layer ops: every output passes; a flipped diff_bias fails. */
static void test_layer(void **state) {
  (void)state;
  cg_engine *e;
  cg_engine_config cfg = {0, 0};
  char err[256], desc[512];
  et_rng rng = {0x37ba5};
  assert_int_equal(cg_engine_new(&e, &cfg, err, sizeof err), 0);
  for (int i = 0; i < 48; i++) {
    int deconv = i % 2;
    cg_dtype dt = dts[(i / 2) % 3];
    et_case c;
    et_problem ep;
    cg_layer l;
    et_case_random(&rng, &c, deconv, dt);
    cg_op op = deconv ? CG_OP_DECONV_BWD : CG_OP_CONV_BWD;
    et_problem_build(&ep, &c, op);
    et_case_str(&c, op, desc, sizeof desc);
    assert_int_equal(cg_layer_resolve(&ep.p, &l, err, sizeof err), 0);
    void *in[3], *out[CG_GRAD_COUNT];
    cg_run_info info[CG_GRAD_COUNT];
    for (int k = 0; k < l.ninputs; k++)
      in[k] = et_random_tensor(&rng, dt, l.in_bytes[k] / cg_dtype_size(dt));
    for (int g = 0; g < CG_GRAD_COUNT; g++)
      out[g] = et_alloc(l.out_bytes[g]);
    if (cg_engine_run_layer(e, &l, (const void *const *)in, out, info, err,
                            sizeof err))
      fail_msg("layer %d: %s (%s)", i, err, desc);
    for (int g = 0; g < CG_GRAD_COUNT; g++) {
      cg_check_result r;
      assert_int_equal(cg_check_output(&l, (cg_grad)g, (const void *const *)in,
                                       out[g], (uint64_t)i, 1, &r, err,
                                       sizeof err),
                       0);
      if (r.failed || r.compared == 0)
        fail_msg("layer %d: %s failed %lld of %lld comparisons: %s", i,
                 cg_grad_name((cg_grad)g), (long long)r.failed,
                 (long long)r.compared, desc);
    }
    /* The sign of channel 0's diff_bias. */
    flip(dt, out[CG_GRAD_DIFF_BIAS], 0, 15);
    cg_check_result r;
    assert_int_equal(
        cg_check_output(&l, CG_GRAD_DIFF_BIAS, (const void *const *)in,
                        out[CG_GRAD_DIFF_BIAS], 0, 1, &r, err, sizeof err),
        0);
    double b = cg_load_f32(dt, out[CG_GRAD_DIFF_BIAS], 0);
    if (b != 0 && r.failed != 1)
      fail_msg("layer %d: flipped diff_bias[0] = %g not caught: %s", i, b,
               desc);
    for (int k = 0; k < l.ninputs; k++)
      free(in[k]);
    for (int g = 0; g < CG_GRAD_COUNT; g++)
      free(out[g]);
  }
  cg_engine_free(e);
}

/* An error common to every channel (here +1 on every element, what the
 * fault-injection build's broken geometry returns) cannot cancel between
 * channels: with +-1 probes it did whenever a group's signs summed to
 * zero (37% of draws for 4 channels). */
static void test_offset_caught(void **state) {
  (void)state;
  et_rng rng = {0x0ff5e7};
  char err[256], desc[512];
  for (int i = 0; i < 200; i++) {
    cg_op op = ops[i % 4];
    cg_dtype dt = dts[(i / 4) % 3];
    et_case c;
    et_case_random(&rng, &c, op >= CG_OP_DECONV_BWD_DATA, dt);
    cg_geom g = et_resolve(&c, op);
    et_case_str(&c, op, desc, sizeof desc);
    void *in0 = et_random_tensor(&rng, dt, g.in_elems[0]);
    void *in1 = et_random_tensor(&rng, dt, g.in_elems[1]);
    void *out = et_alloc(g.out_bytes);
    assert_int_equal(cg_reference_run(&g, in0, in1, out, err, sizeof err), 0);
    for (size_t k = 0; k < g.out_elems; k++)
      cg_store_f32(dt, out, k, cg_load_f32(dt, out, k) + 1.0f);
    cg_check_result r;
    assert_int_equal(
        cg_check_run(&g, in0, in1, out, (uint64_t)i, 1, &r, err, sizeof err),
        0);
    if (r.failed == 0)
      fail_msg("case %d: +1 on every element not caught: %s", i, desc);
    free(in0);
    free(in1);
    free(out);
  }
}

/* Non-finite inputs make a NaN result legitimate: skipped, not failed. */
static void test_nonfinite_skipped(void **state) {
  (void)state;
  et_rng rng = {0x37};
  et_case c;
  char err[256];
  et_case_random(&rng, &c, 0, CG_DTYPE_F32);
  cg_geom g = et_resolve(&c, CG_OP_CONV_BWD_DATA);
  float *in0 = et_random_tensor(&rng, CG_DTYPE_F32, g.in_elems[0]);
  float *in1 = et_random_tensor(&rng, CG_DTYPE_F32, g.in_elems[1]);
  float *out = et_alloc(g.out_bytes);
  for (size_t i = 0; i < g.in_elems[0]; i++)
    in0[i] = NAN;
  assert_int_equal(cg_reference_run(&g, in0, in1, out, err, sizeof err), 0);
  cg_check_result r;
  assert_int_equal(cg_check_run(&g, in0, in1, out, 1, 1, &r, err, sizeof err),
                   0);
  assert_int_equal(r.failed, 0);
  assert_true(r.skipped > 0);
  free(in0);
  free(in1);
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ops),
      cmocka_unit_test(test_ops_wide),
      cmocka_unit_test(test_layer),
      cmocka_unit_test(test_offset_caught),
      cmocka_unit_test(test_nonfinite_skipped),
  };
  return cmocka_run_group_tests_name("engine_check", tests, NULL, NULL);
}
