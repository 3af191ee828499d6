/* cg/check.h - checks of a computed gradient by the adjoint identity, at a
 * small fraction of the op's cost, so that a server can check the results
 * it answers (proto/SEMANTICS.md "Result checks").
 *
 * Every gradient op is a derivative of one bilinear form, the forward
 * op's <F(x, W), dy>. A gradient R of tensor X satisfies <P, R> = that
 * form with X replaced by P, for any probe P. The probes here are random
 * weights across the output's channels within a group (a sign times a
 * magnitude in [1, 2)) and a single position elsewhere: P = u (x) e_j.
 * All of them at once
 * cost one pass over R for the left sides and, for the right sides, a
 * convolution with one channel per group on the output's side: about
 * 1/C of the op for diff_src (C its channels per group) and 1/C' for
 * diff_weights (C' the larger of the data tensors' channels per group).
 * Each position j then carries its own comparison with its own tolerance
 * (check.c derives it), so one wrong element fails the comparison of its
 * position against the rounding noise of a group's channels only.
 *
 * Accumulates in double; plain C loops, parallel over the minibatch with
 * the given OpenMP threads. Thread-safe; allocates what the call frees.
 *
 * libcgkernels exports these functions. libcgclient has its own copy of
 * the same code, built without OpenMP (threads is then 1) and hidden
 * (CG_CHECK_HIDDEN), for its callers' checks of what they receive
 * (cgc_options.verify_rate). */
#ifndef CG_CHECK_H
#define CG_CHECK_H

#include <stdint.h>

#include "cg/layer.h"
#include "cg/problem.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef CG_CHECK_HIDDEN
#define CG_CHECK_API
#else
#define CG_CHECK_API CG_EXPORT
#endif

typedef struct cg_check_result {
  int64_t compared; /* comparisons made */
  /* Comparisons left out: a sum there is not finite, or could overflow
   * the dtype (an Inf or NaN in the inputs, or magnitudes near the
   * dtype's largest value), so no bound holds. */
  int64_t skipped;
  int64_t failed; /* comparisons outside their tolerance */
  double worst;   /* largest |difference| / tolerance (Inf: NaN or Inf) */
  double worst_diff, worst_tol; /* at that comparison */
  /* Where: a data output's (minibatch row, group, spatial index in
   * row-major order); diff_weights' (group, kernel index in row-major
   * order, channel within the group of the side not summed over);
   * diff_bias' (channel, 0, 0). */
  int64_t worst_at[3];
} cg_check_result;

/* Checks out, the output of geom->op for inputs in0 and in1 (as
 * cg_engine_run takes them, in geom's layouts), with the probes drawn
 * from seed (the same seed, the same probes on every machine). threads
 * < 1 means 1. Fills res; returns 0 (whether or not the result passed:
 * res->failed says), CG_EINVAL (a geom cg_problem_resolve would not make,
 * a NULL buffer), CG_ERANGE or CG_ENOMEM. */
CG_CHECK_API int cg_check_run(const cg_geom *geom, const void *in0,
                              const void *in1, const void *out, uint64_t seed,
                              int threads, cg_check_result *res, char *err,
                              size_t errlen);

/* Checks diff_bias against diff_dst directly (geom as for
 * cg_reference_bias): every channel's sum, in double. */
CG_CHECK_API int cg_check_bias(const cg_geom *geom, const void *diff_dst,
                               const void *diff_bias, cg_check_result *res,
                               char *err, size_t errlen);

/* Output g of l, computed from the request's data inputs in[]. */
CG_CHECK_API int cg_check_output(const cg_layer *l, cg_grad g,
                                 const void *const in[3], const void *out,
                                 uint64_t seed, int threads,
                                 cg_check_result *res, char *err,
                                 size_t errlen);

/* splitmix64's finaliser: the probes' weights, and the server's and the
 * client's draws of which calls to check, come from it. */
CG_CHECK_API uint64_t cg_check_mix64(uint64_t x);

/* A seed for one process's draws, different from run to run: the wall
 * clock, the process id and salt (an address of the caller's) mixed. */
CG_CHECK_API uint64_t cg_check_seed(const void *salt);

#ifdef __cplusplus
}
#endif
#endif
