/* kt.h - helpers shared by the kernels unit tests: building cg_problems
 * from literal lists and asserting on resolve results. */
#ifndef CG_TESTS_KT_H
#define CG_TESTS_KT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cg/problem.h"

/* A borrowed list from a literal: L(1, 2, 3). The compound literal lives
 * until the end of the enclosing block. */
#define L(...)                                                                 \
  ((cg_ints){(const int64_t[]){__VA_ARGS__},                                   \
             sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)})

/* A problem with its two inputs, in op input order. */
static inline cg_problem kt_problem(cg_op op, cg_ints in0, cg_ints in1) {
  cg_problem p;
  cg_problem_init(&p);
  p.op = op;
  p.dtype = CG_DTYPE_F32;
  p.input_dims[0] = in0;
  p.input_dims[1] = in1;
  return p;
}

/* Resolves p and fails the test with the message if it is rejected. */
static inline cg_geom kt_resolve_ok(const cg_problem *p) {
  cg_geom g;
  char err[256];
  int rc = cg_problem_resolve(p, &g, err, sizeof(err));
  if (rc != 0)
    fail_msg("unexpected rejection (%s): %s", cg_err_name(rc), err);
  return g;
}

/* Expects p to be rejected with code and a message containing want. */
static inline void kt_resolve_fails(const cg_problem *p, int code,
                                    const char *want) {
  cg_geom g;
  char err[256];
  int rc = cg_problem_resolve(p, &g, err, sizeof(err));
  if (rc != code)
    fail_msg("expected %s containing \"%s\", got %s: \"%s\"", cg_err_name(code),
             want, cg_err_name(rc), rc ? err : "");
  if (strstr(err, want) == NULL)
    fail_msg("message \"%s\" lacks \"%s\"", err, want);
}

/* Asserts that dims[0..n) equals want. */
static inline void kt_dims_eq(const int64_t *dims, cg_ints want) {
  for (size_t i = 0; i < want.len; i++)
    if (dims[i] != want.v[i])
      fail_msg("dim %zu: expected %lld, got %lld", i, (long long)want.v[i],
               (long long)dims[i]);
}

#endif
