/* test_adjoint.c - the adjoint identity
 *   <F(x, W), dy> = <x, bwd_data(dy, W)> = <W, bwd_weights(x, dy)>
 * for F = Convolution and F = ConvTranspose (cg_reference_forward), with
 * the two gradients from the reference and from the engine, on seeded
 * random f32 problems. All three sides are the same triple sum over the
 * index set, so they must agree to f32 round-off of that sum; the scale is
 * the same sum over absolute values. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cg/dtype.h"
#include "cg/engine.h"
#include "cg/reference.h"
#include "et.h"

#define CASES_PER_FAMILY 150

static double dot(const float *a, const float *b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++)
    s += (double)a[i] * (double)b[i];
  return s;
}

static float *abs_copy(const float *a, size_t n) {
  float *r = et_alloc(n * sizeof *r);
  for (size_t i = 0; i < n; i++)
    r[i] = fabsf(a[i]);
  return r;
}

typedef int (*grad_fn)(cg_engine *e, const cg_geom *g, const void *in0,
                       const void *in1, void *out, char *err, size_t errlen);

static int run_reference(cg_engine *e, const cg_geom *g, const void *in0,
                         const void *in1, void *out, char *err, size_t errlen) {
  (void)e;
  return cg_reference_run(g, in0, in1, out, err, errlen);
}

static int run_engine(cg_engine *e, const cg_geom *g, const void *in0,
                      const void *in1, void *out, char *err, size_t errlen) {
  return cg_engine_run(e, g, in0, in1, out, NULL, err, errlen);
}

static void family(int deconv) {
  et_rng rng = {deconv ? 0xadc0ffee : 0xc0ffee};
  cg_op op_d = deconv ? CG_OP_DECONV_BWD_DATA : CG_OP_CONV_BWD_DATA;
  cg_op op_w = deconv ? CG_OP_DECONV_BWD_WEIGHTS : CG_OP_CONV_BWD_WEIGHTS;
  cg_engine *e;
  cg_engine_config cfg = {0, 0};
  char err[256], desc[512];
  int checked = 0;
  double worst = 0;

  assert_int_equal(cg_engine_new(&e, &cfg, err, sizeof err), 0);
  for (int i = 0; i < CASES_PER_FAMILY; i++) {
    et_case c;
    et_case_random(&rng, &c, deconv, CG_DTYPE_F32);
    /* Every tensor in one layout per kind, so buffers pair element-wise. */
    c.odf = CG_DATA_DEFAULT;
    c.owf = c.wf;
    cg_geom gd = et_resolve(&c, op_d), gw = et_resolve(&c, op_w);
    et_case_str(&c, op_d, desc, sizeof desc);
    size_t nx = gw.in_elems[0], ny = gd.in_elems[0], nw = gd.in_elems[1];
    assert_int_equal(gd.out_elems, nx);
    assert_int_equal(gw.out_elems, nw);
    assert_int_equal(gw.in_elems[1], ny);

    float *x = et_random_tensor(&rng, CG_DTYPE_F32, nx);
    float *w = et_random_tensor(&rng, CG_DTYPE_F32, nw);
    float *dy = et_random_tensor(&rng, CG_DTYPE_F32, ny);
    float *y = et_alloc(ny * sizeof *y), *bd = et_alloc(nx * sizeof *bd);
    float *bw = et_alloc(nw * sizeof *bw);
    float *ax = abs_copy(x, nx), *aw = abs_copy(w, nw), *ady = abs_copy(dy, ny);

    assert_int_equal(cg_reference_forward(&gd, x, w, y, err, sizeof err), 0);
    double lhs = dot(y, dy, ny);
    assert_int_equal(cg_reference_forward(&gd, ax, aw, y, err, sizeof err), 0);
    double scale = dot(y, ady, ny);

    static const grad_fn impls[2] = {run_reference, run_engine};
    static const char *const names[2] = {"reference", "engine"};
    for (int k = 0; k < 2; k++) {
      if (impls[k](e, &gd, dy, w, bd, err, sizeof err))
        fail_msg("%s bwd_data failed: %s (%s)", names[k], err, desc);
      if (impls[k](e, &gw, x, dy, bw, err, sizeof err))
        fail_msg("%s bwd_weights failed: %s (%s)", names[k], err, desc);
      double mid = dot(x, bd, nx), rhs = dot(w, bw, nw);
      double tol = 1e-5 * scale;
      double dev = fmax(fabs(lhs - mid), fabs(lhs - rhs));
      if (!(dev <= tol))
        fail_msg("case %d %s: <F(x,W),dy> = %.9g, <x,bwd_data> = %.9g, "
                 "<W,bwd_weights> = %.9g (tolerance %.3g): %s",
                 i, names[k], lhs, mid, rhs, tol, desc);
      if (scale > 0 && dev / scale > worst)
        worst = dev / scale;
    }
    checked += scale > 0;
    free(x);
    free(w);
    free(dy);
    free(y);
    free(bd);
    free(bw);
    free(ax);
    free(aw);
    free(ady);
  }
  cg_engine_free(e);
  print_message("adjoint %s: %d problems (%d with a non-zero sum), worst "
                "deviation / abs-sum %.3g\n",
                deconv ? "ConvTranspose" : "Convolution", CASES_PER_FAMILY,
                checked, worst);
  /* Nearly every random problem has products; a run where most sums are
   * empty would test nothing. */
  assert_true(checked > CASES_PER_FAMILY * 9 / 10);
}

static void test_convolution(void **state) {
  (void)state;
  family(0);
}

static void test_convtranspose(void **state) {
  (void)state;
  family(1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_convolution),
      cmocka_unit_test(test_convtranspose),
  };
  return cmocka_run_group_tests_name("engine_adjoint", tests, NULL, NULL);
}
