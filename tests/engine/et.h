/* et.h - helpers shared by the engine tests: a seeded generator of random
 * valid problems (described forward-style, then built for any op of the
 * family), tensor filling and tolerance-aware comparison. */
#ifndef CG_TESTS_ET_H
#define CG_TESTS_ET_H

#include <stddef.h>
#include <stdint.h>

#include "cg/engine.h"
#include "cg/problem.h"

/* A problem described through its forward op. Channel and spatial names
 * are those of cg_geom: "in" is the forward input, "out" its output. */
typedef struct et_case {
  int deconv; /* 0: Convolution family, 1: ConvTranspose family */
  cg_dtype dtype;
  int nsp;
  int64_t mb, groups, ic, oc;
  int64_t in_sp[3], out_sp[3];
  int64_t k[3], s[3], d[3];
  int64_t pb[3], pe[3]; /* resolved pads (what auto_pad yields) */
  int64_t opad[3];      /* ConvTranspose output_padding */
  cg_auto_pad auto_pad;
  int give_opad;      /* pass output_padding explicitly */
  int give_dst_shape; /* ConvolutionBackwardData: pass dst_shape */
  int shape_as_input; /* dst_shape / weights_shape as the shape input */
  cg_data_format df;
  cg_weights_format wf;
  cg_data_format odf;    /* for data outputs */
  cg_weights_format owf; /* for weights outputs */
} et_case;

/* A cg_problem together with the storage its lists point into. */
typedef struct et_problem {
  cg_problem p;
  int64_t dims[3][CG_MAX_RANK];
  int64_t strides[3], dil[3], pb[3], pe[3], opad[3];
  int64_t shape[CG_MAX_RANK];
} et_problem;

/* Deterministic generator (splitmix64). */
typedef struct et_rng {
  uint64_t s;
} et_rng;
uint64_t et_next(et_rng *r);
/* Uniform integer in [lo, hi]. */
int64_t et_range(et_rng *r, int64_t lo, int64_t hi);

/* Draws a random valid case of the given family and dtype. */
void et_case_random(et_rng *r, et_case *c, int deconv, cg_dtype dt);
/* The same with 9 to 64 channels (several of oneDNN's 16-channel blocks
 * plus tails) on smaller spatial sizes. */
void et_case_random_wide(et_rng *r, et_case *c, int deconv, cg_dtype dt);
/* Builds the problem of op (which must belong to c's family, the layer
 * ops included) into *ep. *ep must not move while ep->p is used. */
void et_problem_build(et_problem *ep, const et_case *c, cg_op op);
/* Resolves the problem of op for c and checks the geometry matches what
 * the case describes; fails the test otherwise. */
cg_geom et_resolve(const et_case *c, cg_op op);
/* One-line description of c for failure messages. */
void et_case_str(const et_case *c, cg_op op, char *buf, size_t n);

/* Dims of a data tensor (channels, spatial sizes) in format f. */
void et_data_dims(int nsp, cg_data_format f, int64_t mb, int64_t ch,
                  const int64_t *sp, int64_t *dims);
/* Dims of the weights of c in format f. */
void et_weights_dims(const et_case *c, cg_weights_format f, int64_t *dims);

/* Allocates n elements of dt filled with uniform values in [-1, 1]
 * rounded to dt. Caller frees. */
void *et_random_tensor(et_rng *r, cg_dtype dt, size_t n);
/* Allocates bytes of zeroed memory; fails the test when out of memory. */
void *et_alloc(size_t bytes);

/* Comparison of n elements of dt: max |got - want| and max |want|. */
typedef struct et_diff {
  double max_err, scale;
} et_diff;
et_diff et_compare(cg_dtype dt, const void *got, const void *want, size_t n);
/* Largest |x| over n elements of dt. */
double et_max_abs(cg_dtype dt, const void *buf, size_t n);

/* Tolerance on max abs error for an output of geometry g whose largest
 * reference magnitude is scale, with inputs bounded by amax0/amax1. f32:
 * 1e-5 * scale. bf16/f16: one rounding of the result to the type on each
 * side (2 * eps * scale) plus f32 accumulation error over the reduction
 * length L (L * 2^-24 * L * amax0 * amax1). */
double et_tolerance(const cg_geom *g, double scale, double amax0, double amax1);
/* Number of products summed into one output element of g. */
int64_t et_reduction_length(const cg_geom *g);

/* Runs run() in a copy of this program on this machine's ISA, then,
 * outside sanitizer builds (CG_SANITIZED unset), in one for each of avx2,
 * avx512_core and avx512_core_bf16 below it, with DNNL_MAX_CPU_ISA capping
 * oneDNN's dispatch there (it is read once per process); prints the ISAs
 * covered. Returns 0 when every run returned 0. For main(). */
int et_main_per_isa(char **argv, const char *name, int (*run)(void));

#endif
