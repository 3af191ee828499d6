/* test_limits.c - the engine at the service limits (cg/limits.h), on every
 * ISA up to the machine's (et_main_per_isa): seeded problems of all six ops
 * in f32, bf16 and f16 whose strides, dilations, pads, kernel reach or
 * output_padding sit at or near the default limits, each with tensors of
 * at most 64 KiB, must match the reference; and every one of issue 25's
 * crashers that the limits let through. Prints, per ISA, the longest
 * compute time of one (primitive creation included, as a server's first
 * call of a geometry pays it) and the implementations that ran: the
 * acceptance figure of issue 25 (at most 50 ms), printed, not asserted.
 *
 * CG_LIMITS_SEED and CG_LIMITS_COUNT override the defaults;
 * CG_LIMITS_TRACE prints each case before it runs. */
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
#include "cg/limits.h"
#include "cg/reference.h"
#include "et.h"

#define DEFAULT_SEED 20261126u
#define DEFAULT_COUNT 720
#define SMALL_REQUEST (64 * 1024) /* bytes of a request's tensors */

typedef enum {
  AXIS_PLAIN,
  AXIS_STRIDE,   /* a stride near the limit */
  AXIS_DILATION, /* a dilation near the limit */
  AXIS_PAD,      /* pads near the limit, the largest stride */
  AXIS_KERNEL,   /* a kernel of many taps */
  AXIS_KINDS
} axis_kind;

static const char *const kind_names[AXIS_KINDS] = {"plain", "stride",
                                                   "dilation", "pad", "kernel"};

/* At the limit a quarter of the time, else below it. */
static int64_t near(et_rng *r, int64_t limit, int64_t low) {
  return et_range(r, 0, 3) ? et_range(r, low, limit) : limit;
}

/* One axis of kind k. Returns 0 when the draw gives no valid shape. */
static int draw_axis(et_rng *r, et_case *c, int a, axis_kind k) {
  int64_t kk = et_range(r, 1, 3), s = et_range(r, 1, 2), d = 1, in;
  int64_t pb = et_range(r, 0, 1), pe = et_range(r, 0, 1);
  in = et_range(r, 1, 4);
  switch (k) {
  case AXIS_STRIDE:
    s = near(r, CG_LIMIT_STRIDE_DEFAULT, 257);
    in = et_range(r, 1, c->deconv ? 2 : 3);
    break;
  case AXIS_DILATION:
    kk = et_range(r, 2, 3);
    d = near(r, CG_LIMIT_DILATION_DEFAULT, 257);
    s = 1;
    in = c->deconv ? 1 : et_range(r, 1, 2);
    if (!c->deconv) { /* pads that make the reach fit, and a little more */
      int64_t t = (kk - 1) * d + et_range(r, 0, 2) - in + 1;
      pb = t / 2;
      pe = t - pb;
    }
    break;
  case AXIS_PAD:
    s = CG_LIMIT_STRIDE_DEFAULT;
    kk = 1;
    pb = near(r, CG_LIMIT_PAD_DEFAULT, 1000);
    pe = near(r, CG_LIMIT_PAD_DEFAULT, 1000);
    /* A ConvTranspose needs the input the pads take back. */
    in = c->deconv ? (pb + pe + s - 1) / s + 1 : 1;
    break;
  case AXIS_KERNEL:
    kk = et_range(r, 64, 4096);
    s = 1;
    pb = pe = 0;
    in = c->deconv ? 1 : kk + et_range(r, 0, 2);
    break;
  default:
    break;
  }
  int64_t ek = (kk - 1) * d + 1;
  c->k[a] = kk;
  c->s[a] = s;
  c->d[a] = d;
  c->pb[a] = pb;
  c->pe[a] = pe;
  c->in_sp[a] = in;
  c->opad[a] = 0;
  if (!c->deconv) {
    if (in + pb + pe < ek)
      return 0;
    c->out_sp[a] = (in + pb + pe - ek) / s + 1;
  } else {
    c->out_sp[a] = s * (in - 1) + ek - pb - pe;
    if (c->out_sp[a] < 1)
      return 0;
    /* output_padding up to the stride (less than max(S, D)). */
    int64_t most = s > d ? s : d;
    if (k == AXIS_STRIDE && et_range(r, 0, 1)) {
      c->opad[a] = et_range(r, 0, most - 1);
      c->out_sp[a] += c->opad[a];
    }
  }
  return 1;
}

static int64_t prod(const int64_t *v, int n) {
  int64_t p = 1;
  for (int a = 0; a < n; a++)
    p *= v[a];
  return p;
}

/* Bytes of the tensors of the op's request: both data tensors and the
 * weights (an input or the output of every op but diff_bias). */
static int64_t request_bytes(const et_case *c) {
  int64_t e = c->mb * (c->ic * prod(c->in_sp, c->nsp) +
                       c->oc * prod(c->out_sp, c->nsp)) +
              c->oc * (c->ic / c->groups) * prod(c->k, c->nsp);
  return e * (int64_t)cg_dtype_size(c->dtype);
}

/* A problem with one axis of kind k and plain others, its tensors within
 * SMALL_REQUEST bytes. */
static void limit_case(et_rng *r, et_case *c, int deconv, cg_dtype dt,
                       axis_kind k) {
  for (;;) {
    memset(c, 0, sizeof *c);
    c->deconv = deconv;
    c->dtype = dt;
    c->nsp = (int)et_range(r, 1, 3);
    c->mb = et_range(r, 1, 2);
    switch (et_range(r, 0, 3)) {
    case 0: /* several channel blocks and a tail */
      c->groups = 1;
      c->ic = et_range(r, 9, 33);
      c->oc = et_range(r, 9, 33);
      break;
    case 1:
      c->groups = 2;
      c->ic = 2 * et_range(r, 1, 4);
      c->oc = 2 * et_range(r, 1, 4);
      break;
    default:
      c->groups = 1;
      c->ic = et_range(r, 1, 4);
      c->oc = et_range(r, 1, 4);
      break;
    }
    int big = (int)et_range(r, 0, c->nsp - 1), ok = 1;
    for (int a = 0; a < c->nsp && ok; a++)
      ok = draw_axis(r, c, a, a == big ? k : AXIS_PLAIN);
    if (!ok || request_bytes(c) > SMALL_REQUEST)
      continue;
    c->auto_pad = CG_AUTO_PAD_NONE;
    c->give_opad = deconv && et_range(r, 0, 1);
    c->give_dst_shape = 1;
    c->shape_as_input = (int)et_range(r, 0, 1);
    c->df = et_range(r, 0, 1) ? CG_DATA_NCX : CG_DATA_NXC;
    c->wf = deconv ? (et_range(r, 0, 1) ? CG_WEIGHTS_IOX : CG_WEIGHTS_XOI)
                   : (et_range(r, 0, 1) ? CG_WEIGHTS_OIX : CG_WEIGHTS_XIO);
    return;
  }
}

/* The slowest cases of a sweep, measured again afterwards: on a shared
 * machine one run's time can be another process's. */
#define SLOWEST 5
#define REMEASURE 3

typedef struct slow_case {
  double ms;
  et_case c;
  cg_op op;
  axis_kind kind;
} slow_case;

/* Keeps the SLOWEST slowest cases, slowest first. */
static void note_slow(slow_case *top, double ms, const et_case *c, cg_op op,
                      axis_kind kind) {
  int at = SLOWEST;
  while (at > 0 && top[at - 1].ms < ms)
    at--;
  if (at == SLOWEST)
    return;
  memmove(&top[at + 1], &top[at], sizeof *top * (SLOWEST - 1 - (size_t)at));
  top[at] = (slow_case){ms, *c, op, kind};
}

/* Runs op of c on e and the reference; fails on a mismatch. Returns the
 * engine's time, primitive creation included. */
static double check_case(cg_engine *e, et_rng *r, const et_case *c, cg_op op,
                         int i, const char **impl) {
  char err[512], desc[512];
  et_problem ep;
  cg_layer l;
  et_problem_build(&ep, c, op);
  et_case_str(c, op, desc, sizeof desc);
  if (cg_layer_resolve(&ep.p, &l, err, sizeof err))
    fail_msg("case %d: rejected: %s (%s)", i, err, desc);
  cg_limits lim;
  cg_limits_default(&lim);
  if (cg_layer_check_limits(&l, &lim, NULL, err, sizeof err))
    fail_msg("case %d: past the limits: %s (%s)", i, err, desc);
  const void *in[3] = {NULL, NULL, NULL};
  void *got[CG_GRAD_COUNT], *ref[CG_GRAD_COUNT];
  for (int t = 0; t < l.ninputs; t++)
    in[t] =
        et_random_tensor(r, c->dtype, l.in_bytes[t] / cg_dtype_size(c->dtype));
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    got[g] = et_alloc(l.out_bytes[g]);
    ref[g] = et_alloc(l.out_bytes[g]);
  }
  cg_run_info info[CG_GRAD_COUNT];
  memset(info, 0, sizeof info);
  if (cg_reference_layer(&l, in, ref, err, sizeof err))
    fail_msg("case %d: reference failed: %s (%s)", i, err, desc);
  int rc = cg_engine_run_layer(e, &l, in, got, info, err, sizeof err);
  if (rc)
    fail_msg("case %d: engine failed (%s): %s (%s)", i, cg_err_name(rc), err,
             desc);
  double ms = 0;
  *impl = "?";
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    if (!(l.grads & CG_GRAD_BIT(g)))
      continue;
    ms += info[g].compute_ms;
    if (g != CG_GRAD_DIFF_BIAS)
      *impl = info[g].impl;
    const cg_geom *geom = cg_layer_geom(&l, (cg_grad)g);
    et_diff d = et_compare(c->dtype, got[g], ref[g], l.out_elems[g]);
    int a = g == CG_GRAD_DIFF_SRC ? l.data_in[0] : l.weights_in[0];
    int b = g == CG_GRAD_DIFF_SRC ? l.data_in[1] : l.weights_in[1];
    /* diff_bias: one rounding to the dtype, and f32 sums over L. */
    double len = (double)geom->in_elems[1] / (double)geom->oc;
    double tol =
        g == CG_GRAD_DIFF_BIAS
            ? (c->dtype == CG_DTYPE_F32 ? 1e-5
                                        : 2.0 * cg_dtype_epsilon(c->dtype)) *
                      d.scale +
                  len * len * cg_dtype_epsilon(CG_DTYPE_F32)
            : et_tolerance(geom, d.scale,
                           et_max_abs(c->dtype, in[a], geom->in_elems[0]),
                           et_max_abs(c->dtype, in[b], geom->in_elems[1]));
    if (!(d.max_err <= tol))
      fail_msg("case %d %s: max error %g > tolerance %g (impl %s): %s", i,
               cg_grad_name((cg_grad)g), d.max_err, tol, info[g].impl, desc);
  }
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    free(got[g]);
    free(ref[g]);
  }
  for (int t = 0; t < 3; t++)
    free((void *)in[t]);
  return ms;
}

static void sweep_at_limits(void **state) {
  (void)state;
  static const cg_op ops[6] = {CG_OP_CONV_BWD_DATA,   CG_OP_CONV_BWD_WEIGHTS,
                               CG_OP_DECONV_BWD_DATA, CG_OP_DECONV_BWD_WEIGHTS,
                               CG_OP_CONV_BWD,        CG_OP_DECONV_BWD};
  static const cg_dtype dts[3] = {CG_DTYPE_BF16, CG_DTYPE_F32, CG_DTYPE_F16};
  const char *s = getenv("CG_LIMITS_SEED"), *n = getenv("CG_LIMITS_COUNT");
  et_rng rng = {s ? strtoull(s, NULL, 10) : DEFAULT_SEED};
  int count = n ? atoi(n) : DEFAULT_COUNT;
  cg_engine *e;
  char err[256];
  /* One thread: a team of two on a shared machine measures the other
   * processes; one core is the worst a request gets. */
  cg_engine_config cfg = {1, 0};
  slow_case top[SLOWEST];
  memset(top, 0, sizeof top);
  int per_kind[AXIS_KINDS] = {0};
  const char *impls[32];
  int impl_n[32], nimpl = 0;
  assert_int_equal(cg_engine_new(&e, &cfg, err, sizeof err), 0);
  /* oneDNN generates some kernels once per process, on first use (the
   * engine makes the f32 gemm's when created, others stay: bf16 gemm,
   * reorders); a warm-up round keeps them out of the figures, which are
   * about what a geometry costs. */
  et_rng warm = {DEFAULT_SEED + 1};
  for (int i = 0; i < 36; i++) {
    et_case c;
    const char *impl;
    cg_op op = ops[i % 6];
    limit_case(&warm, &c,
               op == CG_OP_DECONV_BWD_DATA || op == CG_OP_DECONV_BWD_WEIGHTS ||
                   op == CG_OP_DECONV_BWD,
               dts[(i / 6) % 3], (axis_kind)(1 + (i / 18) % 2 * 3));
    check_case(e, &warm, &c, op, -1 - i, &impl);
  }
  for (int i = 0; i < count; i++) {
    cg_op op = ops[i % 6];
    cg_dtype dt = dts[(i / 6) % 3];
    axis_kind k = (axis_kind)(1 + (i / 18) % (AXIS_KINDS - 1));
    int deconv = op == CG_OP_DECONV_BWD_DATA ||
                 op == CG_OP_DECONV_BWD_WEIGHTS || op == CG_OP_DECONV_BWD;
    et_case c;
    limit_case(&rng, &c, deconv, dt, k);
    if (getenv("CG_LIMITS_TRACE")) { /* which case crashed */
      char desc[512];
      et_case_str(&c, op, desc, sizeof desc);
      fprintf(stderr, "case %d: %s\n", i, desc);
    }
    const char *impl;
    double ms = check_case(e, &rng, &c, op, i, &impl);
    per_kind[k]++;
    note_slow(top, ms, &c, op, k);
    int j = 0;
    while (j < nimpl && strcmp(impls[j], impl) != 0)
      j++;
    if (j == nimpl && nimpl < 32) {
      impls[nimpl] = impl;
      impl_n[nimpl++] = 0;
    }
    if (j < nimpl)
      impl_n[j]++;
  }
  /* Each of the slowest again on fresh engines, primitive creation
   * included: the least of REMEASURE runs is what the geometry costs. */
  double worst = 0;
  int worst_at = 0;
  const char *worst_impl = "?";
  for (int t = 0; t < SLOWEST && top[t].ms > 0; t++) {
    double least = top[t].ms;
    const char *impl = "?";
    for (int r = 0; r < REMEASURE; r++) {
      cg_engine *fresh;
      assert_int_equal(cg_engine_new(&fresh, &cfg, err, sizeof err), 0);
      double ms =
          check_case(fresh, &rng, &top[t].c, top[t].op, -100 - t, &impl);
      cg_engine_free(fresh);
      if (ms < least)
        least = ms;
    }
    if (least > worst) {
      worst = least;
      worst_at = t;
      worst_impl = impl;
    }
  }
  char desc[512];
  et_case_str(&top[worst_at].c, top[worst_at].op, desc, sizeof desc);
  cg_engine_free(e);
  print_message("%s: %d problems of at most %d bytes at the limits (stride "
                "%d, dilation %d, pad %d, kernel %d); longest compute "
                "%.1f ms (%s, %s; the least of %d fresh runs of the %d "
                "slowest): %s\n",
                cg_backend_isa(), count, SMALL_REQUEST, per_kind[AXIS_STRIDE],
                per_kind[AXIS_DILATION], per_kind[AXIS_PAD],
                per_kind[AXIS_KERNEL], worst, kind_names[top[worst_at].kind],
                worst_impl, REMEASURE + 1, SLOWEST, desc);
  for (int j = 0; j < nimpl; j++)
    print_message("%s impl %s: %d\n", cg_backend_isa(), impls[j], impl_n[j]);
}

static int run(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(sweep_at_limits)};
  return cmocka_run_group_tests_name("engine_limits", tests, NULL, NULL);
}

int main(int argc, char **argv) {
  (void)argc;
  /* Every run creates its primitives, as a server's first call of a
   * geometry does: no oneDNN primitive cache (read at its first use). */
  setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "0", 1);
  return et_main_per_isa(argv, "engine_limits", run);
}
