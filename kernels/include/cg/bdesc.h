/* cg/bdesc.h - oneDNN benchdnn problem descriptors
 * ("mb8ic64ih56oc64oh56kh3ph1", "g32mb8ic32ih112oc32oh112kh3ph1",
 * 3D "id/kd/pd") and their mapping to the four gradient ops.
 *
 * Used by the benchmarks and `convgrad bench`. The descriptor rules are
 * those of benchdnn's str2desc (oneDNN's tests/benchdnn/doc/knobs_desc.md;
 * tests/data/benchdnn-problems.json holds oneDNN's lists, parsed):
 * defaults mb2 g1 s1 d0 p0, missing output sizes derived, end padding
 * derived and clamped at 0. No allocation; thread-safe. */
#ifndef CG_BDESC_H
#define CG_BDESC_H

#include <stdint.h>

#include "cg/problem.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cg_bdesc {
  int deconv; /* 1: a deconvolution descriptor (i = ConvTranspose input) */
  int nsp;
  int64_t g, mb, ic, oc;
  int64_t in_sp[CG_MAX_SPATIAL], out_sp[CG_MAX_SPATIAL];
  int64_t kernel[CG_MAX_SPATIAL], stride[CG_MAX_SPATIAL];
  int64_t dilation[CG_MAX_SPATIAL]; /* graph convention: 1 = none */
  int64_t pad_begin[CG_MAX_SPATIAL], pad_end[CG_MAX_SPATIAL];
  char name[64];
} cg_bdesc;

/* Parses one descriptor. deconv says which family the text belongs to (a
 * problem list marks deconvolution lines; see cg_bdesc_parse_line).
 * Returns 0 or CG_EINVAL with the offending token in err. */
CG_EXPORT int cg_bdesc_parse(const char *text, int deconv, cg_bdesc *out,
                             char *err, size_t errlen);

/* Parses one line of a problem-list file: blank lines and '#' comments set
 * *is_problem = 0; "deconv:" before a descriptor marks a deconvolution.
 * Returns 0 or CG_EINVAL. */
CG_EXPORT int cg_bdesc_parse_line(const char *line, cg_bdesc *out,
                                  int *is_problem, char *err, size_t errlen);

/* A problem-list line that also names how to run the descriptor:
 *   [deconv:]DESC [op=NAME] [dtype=DT] [data_format=F] [weights_format=F]
 * (the words after the descriptor in any order; '#' starts a comment).
 * Defaults: the layer op of the descriptor's family (ConvolutionBackward
 * or ConvTransposeBackward, every output), f32, DEFAULT layouts. So every
 * line of a cg_bdesc_parse_line list is one. */
typedef struct cg_bdesc_run {
  cg_bdesc desc;
  cg_op op;
  cg_dtype dtype;
  cg_data_format data_format;
  cg_weights_format weights_format;
} cg_bdesc_run;

/* Parses one such line: blank lines and comments set *is_problem = 0.
 * Returns 0 or CG_EINVAL naming the word or option at fault (op and family
 * mismatches are left to cg_bdesc_problem_init). */
CG_EXPORT int cg_bdesc_parse_run(const char *line, cg_bdesc_run *out,
                                 int *is_problem, char *err, size_t errlen);

/* The storage a cg_problem built from a descriptor points into. */
typedef struct cg_bdesc_problem {
  cg_problem problem;
  int64_t dims[2][CG_MAX_RANK];
  int64_t strides[CG_MAX_SPATIAL], dilations[CG_MAX_SPATIAL];
  int64_t pads_begin[CG_MAX_SPATIAL], pads_end[CG_MAX_SPATIAL];
  int64_t shape[CG_MAX_RANK + 1];
} cg_bdesc_problem;

/* Builds the problem for op (a CONV_* op for a convolution descriptor, a
 * DECONV_* op for a deconvolution one; the layer ops take src, diff_dst
 * and the weights as their three inputs) in dtype and the given layouts
 * (DEFAULT allowed). The result points into *out, so *out must not move
 * while the problem is used. Returns 0 or CG_EINVAL (op family mismatch). */
CG_EXPORT int cg_bdesc_problem_init(cg_bdesc_problem *out, const cg_bdesc *d,
                                    cg_op op, cg_dtype dtype,
                                    cg_data_format data_format,
                                    cg_weights_format weights_format, char *err,
                                    size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
