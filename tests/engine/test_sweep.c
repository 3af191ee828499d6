/* test_sweep.c - a seeded sweep of random valid problems over all four ops,
 * ranks 1-3, NCX/NXC, every weights format of each op, output layouts,
 * groups (incl. depthwise), strides, dilations, pads, the four auto_pad
 * modes, output_padding and f32/bf16/f16: the engine must match the
 * reference within the dtype's tolerance (et_tolerance).
 *
 * A second, shorter sweep uses 9 to 64 channels, so oneDNN's blocked
 * layouts with several blocks and channel tails are covered too.
 *
 * CG_SWEEP_SEED and CG_SWEEP_COUNT override the defaults for a longer
 * exploratory run; the ctest entry uses the defaults. Both sweeps run on
 * every ISA up to the machine's (et_main_per_isa). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "cg/check.h"
#include "cg/dtype.h"
#include "cg/engine.h"
#include "cg/reference.h"
#include "et.h"

#define DEFAULT_SEED 20261121u
#define DEFAULT_COUNT 2000
#define WIDE_COUNT 240

typedef struct sweep_stats {
  int count, native, convert;
  double worst;     /* largest max_err / tolerance */
  double worst_rel; /* largest max_err / scale */
  double check;     /* largest |difference| / tolerance of cg_check_run */
} sweep_stats;

static void sweep(const char *label, uint64_t seed, int count, int wide,
                  int threads) {
  static const cg_op ops[4] = {CG_OP_CONV_BWD_DATA, CG_OP_CONV_BWD_WEIGHTS,
                               CG_OP_DECONV_BWD_DATA, CG_OP_DECONV_BWD_WEIGHTS};
  static const cg_dtype dts[4] = {CG_DTYPE_F32, CG_DTYPE_BF16, CG_DTYPE_F32,
                                  CG_DTYPE_F16};
  et_rng rng = {seed};
  sweep_stats st[4] = {{0}};
  int per_op[4] = {0}, ranks[4] = {0}, grouped = 0, depthwise = 0;
  int dilated = 0, strided = 0, autopad[4] = {0}, opad = 0, xio_like = 0;
  const char *impls[32];
  int impl_n[32], nimpl = 0;
  cg_engine *e;
  char err[512], desc[512];
  cg_engine_config cfg = {threads, 0};
  struct timespec t0, t1;

  clock_gettime(CLOCK_MONOTONIC, &t0);
  assert_int_equal(cg_engine_new(&e, &cfg, err, sizeof err), 0);
  for (int i = 0; i < count; i++) {
    cg_op op = ops[i % 4];
    /* The dtype cycles on i / 4 so every op sees every dtype. */
    cg_dtype dt = dts[(i / 4) % 4];
    et_case c;
    if (wide)
      et_case_random_wide(&rng, &c, op >= CG_OP_DECONV_BWD_DATA, dt);
    else
      et_case_random(&rng, &c, op >= CG_OP_DECONV_BWD_DATA, dt);
    cg_geom g = et_resolve(&c, op);
    et_case_str(&c, op, desc, sizeof desc);

    void *in0 = et_random_tensor(&rng, dt, g.in_elems[0]);
    void *in1 = et_random_tensor(&rng, dt, g.in_elems[1]);
    void *ref = et_alloc(g.out_bytes), *got = et_alloc(g.out_bytes);
    cg_run_info info;
    if (cg_reference_run(&g, in0, in1, ref, err, sizeof err))
      fail_msg("case %d: reference failed: %s (%s)", i, err, desc);
    if (cg_engine_run(e, &g, in0, in1, got, &info, err, sizeof err))
      fail_msg("case %d: engine failed: %s (%s)", i, err, desc);
    et_diff d = et_compare(dt, got, ref, g.out_elems);
    double tol = et_tolerance(&g, d.scale, et_max_abs(dt, in0, g.in_elems[0]),
                              et_max_abs(dt, in1, g.in_elems[1]));
    if (!(d.max_err <= tol))
      fail_msg("case %d: max error %g > tolerance %g (scale %g, impl %s, "
               "path %d): %s",
               i, d.max_err, tol, d.scale, info.impl, (int)info.path, desc);

    /* The result checks must pass every correct result: no false alarm
     * on any problem or ISA. */
    cg_check_result cr;
    if (cg_check_run(&g, in0, in1, got, (uint64_t)i, 1, &cr, err, sizeof err))
      fail_msg("case %d: check failed to run: %s (%s)", i, err, desc);
    if (cr.failed)
      fail_msg("case %d: false alarm: the check failed %lld of %lld "
               "comparisons (|diff| %g > tolerance %g at %lld,%lld,%lld; "
               "impl %s): %s",
               i, (long long)cr.failed, (long long)cr.compared, cr.worst_diff,
               cr.worst_tol, (long long)cr.worst_at[0],
               (long long)cr.worst_at[1], (long long)cr.worst_at[2], info.impl,
               desc);

    sweep_stats *s = &st[dt];
    if (cr.worst > s->check)
      s->check = cr.worst;
    s->count++;
    if (info.path == CG_PATH_NATIVE)
      s->native++;
    else
      s->convert++;
    if (tol > 0 && d.max_err / tol > s->worst)
      s->worst = d.max_err / tol;
    if (d.scale > 0 && d.max_err / d.scale > s->worst_rel)
      s->worst_rel = d.max_err / d.scale;
    int k = 0;
    while (k < nimpl && strcmp(impls[k], info.impl) != 0)
      k++;
    if (k == nimpl && nimpl < 32) {
      impls[nimpl] = info.impl;
      impl_n[nimpl++] = 0;
    }
    if (k < nimpl)
      impl_n[k]++;
    per_op[op - 1]++;
    ranks[c.nsp]++;
    grouped += c.groups > 1 && c.ic != c.groups;
    depthwise += c.groups > 1 && c.ic == c.groups && c.oc == c.groups;
    int dil = 0, str = 0, op_ = 0;
    for (int a = 0; a < c.nsp; a++) {
      dil |= c.d[a] > 1;
      str |= c.s[a] > 1;
      op_ |= c.opad[a] > 0;
    }
    dilated += dil;
    strided += str;
    opad += op_;
    autopad[c.auto_pad]++;
    xio_like += c.wf == CG_WEIGHTS_XIO || c.wf == CG_WEIGHTS_XOI;
    free(in0);
    free(in1);
    free(ref);
    free(got);
  }
  cg_engine_free(e);
  clock_gettime(CLOCK_MONOTONIC, &t1);

  print_message("%s: %d problems in %.1f s (ops %d/%d/%d/%d, rank1/2/3 "
                "%d/%d/%d, grouped %d, depthwise %d, dilated %d, strided %d, "
                "output_padding %d, auto_pad none/su/sl/valid %d/%d/%d/%d, "
                "X-first weights %d)\n",
                label, count,
                (double)(t1.tv_sec - t0.tv_sec) +
                    1e-9 * (double)(t1.tv_nsec - t0.tv_nsec),
                per_op[0], per_op[1], per_op[2], per_op[3], ranks[1], ranks[2],
                ranks[3], grouped, depthwise, dilated, strided, opad,
                autopad[0], autopad[1], autopad[2], autopad[3], xio_like);
  for (int dt = CG_DTYPE_F32; dt <= CG_DTYPE_F16; dt++)
    print_message("%s %s: %d problems (native %d, via f32 %d), worst "
                  "error/tolerance %.3g, worst error/scale %.3g, worst "
                  "check |diff|/tolerance %.3g (0 false alarms)\n",
                  label, cg_dtype_name((cg_dtype)dt), st[dt].count,
                  st[dt].native, st[dt].convert, st[dt].worst, st[dt].worst_rel,
                  st[dt].check);
  for (int k = 0; k < nimpl; k++)
    print_message("%s impl %s: %d\n", label, impls[k], impl_n[k]);
  assert_true(count < 500 ||
              (st[CG_DTYPE_F32].count > 0 && st[CG_DTYPE_BF16].count > 0 &&
               st[CG_DTYPE_F16].count > 0));
}

static uint64_t env_seed(uint64_t dflt) {
  const char *s = getenv("CG_SWEEP_SEED");
  return s ? strtoull(s, NULL, 10) : dflt;
}

static int env_count(int dflt) {
  const char *s = getenv("CG_SWEEP_COUNT");
  return s ? atoi(s) : dflt;
}

static void test_sweep(void **state) {
  (void)state;
  sweep("sweep", env_seed(DEFAULT_SEED), env_count(DEFAULT_COUNT), 0, 0);
}

static void test_sweep_wide(void **state) {
  (void)state;
  /* One OpenMP thread here, all of them above: oneDNN picks different
   * blockings and reductions per thread count. */
  sweep("sweep-wide", env_seed(DEFAULT_SEED) + 1, env_count(WIDE_COUNT), 1, 1);
}

static int run(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_sweep),
                                     cmocka_unit_test(test_sweep_wide)};
  return cmocka_run_group_tests_name("engine_sweep", tests, NULL, NULL);
}

int main(int argc, char **argv) {
  (void)argc;
  return et_main_per_isa(argv, "engine_sweep", run);
}
