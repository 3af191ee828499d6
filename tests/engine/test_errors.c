/* test_errors.c - failures inside the engine and oneDNN come back as error
 * codes with a message, never as crashes, and leave the engine usable. */
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

/* A small valid Convolution backward-data problem. */
static cg_geom valid_geom(et_rng *r) {
  et_case c;
  do
    et_case_random(r, &c, 0, CG_DTYPE_F32);
  while (c.nsp != 2);
  return et_resolve(&c, CG_OP_CONV_BWD_DATA);
}

static void expect_fail(cg_engine *e, const cg_geom *g, const void *in0,
                        const void *in1, void *out, int code,
                        const char *want) {
  char err[256] = "";
  int rc = cg_engine_run(e, g, in0, in1, out, NULL, err, sizeof err);
  if (rc != code)
    fail_msg("expected %s, got %s: \"%s\"", cg_err_name(code), cg_err_name(rc),
             err);
  if (!strstr(err, want))
    fail_msg("message \"%s\" lacks \"%s\"", err, want);
}

static void test_bad_config(void **state) {
  (void)state;
  cg_engine *e = (cg_engine *)&e; /* must be reset to NULL */
  cg_engine_config cfg = {-2, 0};
  char err[128];
  assert_int_equal(cg_engine_new(&e, &cfg, err, sizeof err), CG_EINVAL);
  assert_null(e);
  assert_non_null(strstr(err, "threads"));
  cg_engine_free(NULL);
}

static void test_errors_surface_as_codes(void **state) {
  (void)state;
  et_rng r = {99};
  cg_engine *e;
  cg_engine_config cfg = {1, 8};
  char err[256];
  cg_geom g = valid_geom(&r);
  void *in0 = et_random_tensor(&r, CG_DTYPE_F32, g.in_elems[0]);
  void *in1 = et_random_tensor(&r, CG_DTYPE_F32, g.in_elems[1]);
  void *out = et_alloc(g.out_bytes), *ref = et_alloc(g.out_bytes);
  assert_int_equal(cg_reference_run(&g, in0, in1, ref, err, sizeof err), 0);
  assert_int_equal(cg_engine_new(&e, &cfg, err, sizeof err), 0);

  /* Geometry oneDNN rejects: the output no longer follows from the input
   * (a geom cg_problem_resolve would never produce). */
  cg_geom bad = g;
  bad.out_sp[0] += 1;
  expect_fail(e, &bad, in0, in1, out, CG_EBACKEND, "invalid_arguments");
  expect_fail(e, &bad, in0, in1, out, CG_EBACKEND, "oneDNN");
  assert_int_equal(cg_engine_cache_size(e), 0); /* failures are not cached */

  bad = g;
  bad.op = CG_OP_INVALID;
  expect_fail(e, &bad, in0, in1, out, CG_EINVAL, "op");
  bad = g;
  bad.dtype = (cg_dtype)9;
  expect_fail(e, &bad, in0, in1, out, CG_EINVAL, "dtype");
  bad = g;
  bad.nsp = 4;
  expect_fail(e, &bad, in0, in1, out, CG_EINVAL, "spatial rank");
  bad = g;
  bad.groups = 0;
  expect_fail(e, &bad, in0, in1, out, CG_EINVAL, "groups");
  expect_fail(e, &g, NULL, in1, out, CG_EINVAL, "NULL");
  expect_fail(e, &g, in0, in1, NULL, CG_EINVAL, "NULL");
  /* No error buffer is fine too. */
  bad = g;
  bad.out_sp[0] += 1;
  assert_int_equal(cg_engine_run(e, &bad, in0, in1, out, NULL, NULL, 0),
                   CG_EBACKEND);

  /* The engine still works. */
  assert_int_equal(cg_engine_run(e, &g, in0, in1, out, NULL, err, sizeof err),
                   0);
  et_diff d = et_compare(CG_DTYPE_F32, out, ref, g.out_elems);
  assert_true(d.max_err <= 1e-5 * d.scale);
  assert_int_equal(cg_engine_cache_size(e), 1);

  /* The reference validates too. */
  bad = g;
  bad.op = CG_OP_INVALID;
  assert_int_equal(cg_reference_run(&bad, in0, in1, out, err, sizeof err),
                   CG_EINVAL);

  cg_engine_free(e);
  free(in0);
  free(in1);
  free(out);
  free(ref);
}

static void test_backend_facts(void **state) {
  (void)state;
  const char *v = cg_backend_version(), *isa = cg_backend_isa();
  assert_non_null(v);
  assert_int_equal(strncmp(v, "2.", 2), 0); /* oneDNN 2.x, e.g. "2.6.3" */
  assert_non_null(isa);
  assert_true(strlen(isa) > 0);
  assert_null(strstr(isa, "cpu_isa_"));
  assert_int_equal(cg_backend_dtype_native(CG_DTYPE_F32), 1);
  assert_int_equal(cg_backend_dtype_native(CG_DTYPE_INVALID), 0);
  print_message("oneDNN %s, ISA %s, native bf16 %d, native f16 %d\n", v, isa,
                cg_backend_dtype_native(CG_DTYPE_BF16),
                cg_backend_dtype_native(CG_DTYPE_F16));
}

/* The reported path follows cg_backend_dtype_native: f32 and native types
 * run in their own type, the others through f32. */
static void test_compute_path(void **state) {
  (void)state;
  cg_engine *e;
  cg_engine_config cfg = {0, 0};
  char err[256];
  assert_int_equal(cg_engine_new(&e, &cfg, err, sizeof err), 0);
  for (int dt = CG_DTYPE_F32; dt <= CG_DTYPE_F16; dt++) {
    et_rng r = {11};
    et_case c;
    do
      et_case_random(&r, &c, 0, (cg_dtype)dt);
    while (c.nsp != 2 || c.groups != 1);
    cg_geom g = et_resolve(&c, CG_OP_CONV_BWD_DATA);
    void *in0 = et_random_tensor(&r, g.dtype, g.in_elems[0]);
    void *in1 = et_random_tensor(&r, g.dtype, g.in_elems[1]);
    void *out = et_alloc(g.out_bytes);
    cg_run_info info;
    assert_int_equal(
        cg_engine_run(e, &g, in0, in1, out, &info, err, sizeof err), 0);
    assert_int_equal(info.path, cg_backend_dtype_native(g.dtype)
                                    ? CG_PATH_NATIVE
                                    : CG_PATH_F32_CONVERT);
    assert_non_null(info.impl);
    assert_true(info.compute_ms >= 0);
    free(in0);
    free(in1);
    free(out);
  }
  cg_engine_free(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_config),
      cmocka_unit_test(test_errors_surface_as_codes),
      cmocka_unit_test(test_backend_facts),
      cmocka_unit_test(test_compute_path),
  };
  return cmocka_run_group_tests_name("engine_errors", tests, NULL, NULL);
}
