/* cg/problem.h - describing a convolution-gradient problem, validating it
 * and inferring its output shape.
 *
 * A cg_problem is what a caller asked for: the op, its attributes as given
 * (lists may be empty, meaning "default"), and the dims of the input
 * tensors. cg_problem_resolve() checks all of it against the rules in
 * proto/SEMANTICS.md and produces a cg_geom: the fully resolved
 * geometry (every pad, stride and output dim known) that the reference and
 * the oneDNN engine consume. Nothing here allocates; every pointer in a
 * cg_problem is borrowed from the caller for the duration of the call. */
#ifndef CG_PROBLEM_H
#define CG_PROBLEM_H

#include <stddef.h>
#include <stdint.h>

#include "cg/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CG_MAX_SPATIAL 3
#define CG_MAX_RANK (2 + CG_MAX_SPATIAL)
/* Longest attribute list accepted. Longer all-zero lists are accepted for
 * pads/output_padding (oneDNN graph JSON writes 12 zeros); anything longer
 * than this is rejected before it is looked at. */
#define CG_MAX_ATTR_LEN 16
/* Largest accepted dim or attribute value. Keeping every value below 2^31
 * makes all the shape arithmetic of cg_problem_resolve exact in int64_t.
 * oneDNN 2.6 checks its descriptors in int, so on every spatial axis the
 * effective kernel (K-1)*D+1, pads_end + stride and the padded size of the
 * larger side (Convolution input, ConvTranspose output) are capped at it
 * too. Larger values are rejected with CG_ERANGE. */
#define CG_MAX_DIM ((int64_t)2147483647)

typedef enum {
  CG_OP_INVALID = 0,
  CG_OP_CONV_BWD_DATA = 1,      /* ConvolutionBackwardData */
  CG_OP_CONV_BWD_WEIGHTS = 2,   /* ConvolutionBackwardWeights */
  CG_OP_DECONV_BWD_DATA = 3,    /* ConvTransposeBackwardData */
  CG_OP_DECONV_BWD_WEIGHTS = 4, /* ConvTransposeBackwardWeights */
  /* A layer's whole backward: several outputs, resolved by
   * cg_layer_resolve (cg/layer.h), not cg_problem_resolve. */
  CG_OP_CONV_BWD = 5,  /* ConvolutionBackward */
  CG_OP_DECONV_BWD = 6 /* ConvTransposeBackward */
} cg_op;
/* The single-output ops are 1..CG_OP_COUNT; every op 1..CG_OP_ALL_COUNT. */
#define CG_OP_COUNT 4
#define CG_OP_ALL_COUNT 6

/* The outputs of a layer's backward, in the order they are answered. */
typedef enum {
  CG_GRAD_DIFF_SRC = 0,
  CG_GRAD_DIFF_WEIGHTS = 1,
  CG_GRAD_DIFF_BIAS = 2
} cg_grad;
#define CG_GRAD_COUNT 3
#define CG_GRAD_BIT(g) (1u << (g))
#define CG_GRADS_ALL 7u

typedef enum {
  CG_DTYPE_INVALID = 0,
  CG_DTYPE_F32 = 1,
  CG_DTYPE_BF16 = 2,
  CG_DTYPE_F16 = 3
} cg_dtype;

typedef enum {
  CG_DATA_DEFAULT = 0, /* NXC, as the spec says */
  CG_DATA_NCX = 1,
  CG_DATA_NXC = 2
} cg_data_format;

/* Spelled as the spec spells them; what the letters mean depends on the op
 * (see SEMANTICS.md "Weights layouts"): OIX for ConvTranspose is the older
 * spelling (OC/g, IC, K...). */
typedef enum {
  CG_WEIGHTS_DEFAULT = 0, /* XIO for convolution, XOI for ConvTranspose */
  CG_WEIGHTS_OIX = 1,
  CG_WEIGHTS_XIO = 2,
  CG_WEIGHTS_IOX = 3,
  CG_WEIGHTS_XOI = 4
} cg_weights_format;

typedef enum {
  CG_AUTO_PAD_NONE = 0,
  CG_AUTO_PAD_SAME_UPPER = 1,
  CG_AUTO_PAD_SAME_LOWER = 2,
  CG_AUTO_PAD_VALID = 3
} cg_auto_pad;

/* A borrowed list of integers; len 0 means "not given". */
typedef struct cg_ints {
  const int64_t *v;
  size_t len;
} cg_ints;

typedef struct cg_attrs {
  cg_ints strides;        /* empty: all 1 */
  cg_ints pads_begin;     /* empty: all 0 */
  cg_ints pads_end;       /* empty: all 0 */
  cg_ints dilations;      /* empty: all 1 (1 = no dilation) */
  cg_ints output_padding; /* empty: not given (implied by the shapes) */
  int64_t groups;         /* must be > 0; cg_attrs_init sets 1 */
  cg_auto_pad auto_pad;
  cg_data_format data_format;
  cg_weights_format weights_format;
  cg_ints dst_shape;     /* ConvolutionBackwardData only; empty: not given */
  cg_ints weights_shape; /* BackwardWeights ops only; empty: not given */
} cg_attrs;

typedef struct cg_problem {
  cg_op op;       /* any of the six (cg_problem_resolve takes the first four) */
  cg_dtype dtype; /* of every data tensor */
  cg_attrs attrs;
  /* Dims of the two data inputs, in the op's input order, each in its own
   * layout (data_format for data tensors, weights_format for weights):
   *   CONV_BWD_DATA:      diff_dst, weights
   *   CONV_BWD_WEIGHTS:   src, diff_dst
   *   DECONV_BWD_DATA:    diff_dst, weights
   *   DECONV_BWD_WEIGHTS: src, diff_dst
   *   CONV_BWD, DECONV_BWD: src, diff_dst, weights (the third) */
  cg_ints input_dims[3];
  /* The optional shape input (dst_shape or weights_shape), already widened
   * to int64 by the caller; it wins over the attribute. */
  int has_shape_input;
  cg_ints shape_input;
  /* Wanted layout of the output. Only the one matching the output kind may
   * be set (diff_src: data, diff_weights: weights); DEFAULT means the same
   * layout as the corresponding input. */
  cg_data_format out_data_format;
  cg_weights_format out_weights_format;
  /* CONV_BWD and DECONV_BWD: the outputs wanted, CG_GRAD_BIT()s; 0 means
   * all three. Must be 0 for the other ops. */
  unsigned grads;
} cg_problem;

/* Fully resolved geometry. Channel and spatial names are those of the
 * forward op the gradient belongs to: for Convolution ops "in" is
 * src/diff_src and "out" is diff_dst; for ConvTranspose ops "in" is the
 * ConvTranspose input (src/diff_src) and "out" its output (diff_dst). */
typedef struct cg_geom {
  cg_op op;
  cg_dtype dtype;
  int nsp; /* spatial rank, 1..3 */
  int64_t mb, groups;
  int64_t ic, oc; /* total channels of forward input / output */
  int64_t in_sp[CG_MAX_SPATIAL], out_sp[CG_MAX_SPATIAL];
  int64_t kernel[CG_MAX_SPATIAL];
  int64_t stride[CG_MAX_SPATIAL];
  int64_t dilation[CG_MAX_SPATIAL]; /* graph convention: 1 = none */
  int64_t pad_begin[CG_MAX_SPATIAL], pad_end[CG_MAX_SPATIAL];
  int64_t output_padding[CG_MAX_SPATIAL]; /* ConvTranspose ops; else 0 */
  cg_data_format data_format;             /* never DEFAULT */
  cg_weights_format weights_format;       /* never DEFAULT */
  cg_data_format out_data_format;         /* layout of a diff_src output */
  cg_weights_format out_weights_format;   /* layout of a diff_weights output */
  /* The tensors as the caller lays them out, in op input order. */
  int in_rank;
  int64_t in_dims[2][CG_MAX_RANK];
  size_t in_elems[2], in_bytes[2];
  int64_t out_dims[CG_MAX_RANK];
  size_t out_elems, out_bytes;
  double flops; /* 2 * multiply-adds, for benchmarks */
} cg_geom;

/* Sets every attribute to its default (groups = 1, lists empty). */
CG_EXPORT void cg_attrs_init(cg_attrs *a);
/* Zeroes p and initialises its attributes. */
CG_EXPORT void cg_problem_init(cg_problem *p);

/* Validates p, a single-output op, and fills geom. Returns 0, CG_EINVAL
 * (message names the field, e.g. "strides[1]: must be > 0, got 0") or CG_ERANGE
 * (a dim or a size overflows). Thread-safe; no allocation. */
CG_EXPORT int cg_problem_resolve(const cg_problem *p, cg_geom *geom, char *err,
                                 size_t errlen);

/* Name <-> enum. Parsers return 0 or CG_EINVAL. Op names accept both spec
 * generations (ConvolutionBackpropData, ConvolutionBackpropFilters, ...)
 * with or without a "-1" suffix; auto_pad any letter case; formats and
 * dtypes exactly as written ("f32", "bf16", "f16"). */
CG_EXPORT int cg_op_parse(const char *name, cg_op *out);
CG_EXPORT int cg_dtype_parse(const char *name, cg_dtype *out);
CG_EXPORT int cg_data_format_parse(const char *name, cg_data_format *out);
CG_EXPORT int cg_weights_format_parse(const char *name, cg_weights_format *out);
CG_EXPORT int cg_auto_pad_parse(const char *name, cg_auto_pad *out);
/* Canonical names; "?" for out-of-range values. Static strings. */
CG_EXPORT const char *cg_op_name(cg_op op);
CG_EXPORT const char *cg_dtype_name(cg_dtype dt);
CG_EXPORT const char *cg_data_format_name(cg_data_format f);
CG_EXPORT const char *cg_weights_format_name(cg_weights_format f);
CG_EXPORT const char *cg_auto_pad_name(cg_auto_pad a);
/* NULL-terminated list of every accepted name of op (canonical first). */
CG_EXPORT const char *const *cg_op_aliases(cg_op op);
/* Bytes per element; 0 for an invalid dtype. */
CG_EXPORT size_t cg_dtype_size(cg_dtype dt);

/* The op's input names in order ("diff_dst", "weights"); index 2 names the
 * optional shape input ("dst_shape", "weights_shape") or, for CONV_BWD and
 * DECONV_BWD, "weights". NULL for an index the op does not have. The
 * output name of a single-output op is "diff_src" or "diff_weights" (NULL
 * for any other op). */
CG_EXPORT const char *cg_op_input_name(cg_op op, int index);
CG_EXPORT const char *cg_op_output_name(cg_op op);
/* 1 for CONV_BWD and DECONV_BWD. */
CG_EXPORT int cg_op_is_layer(cg_op op);
/* "diff_src", "diff_weights", "diff_bias"; NULL out of range. */
CG_EXPORT const char *cg_grad_name(cg_grad g);
/* Parses one of those names; 0 or CG_EINVAL. */
CG_EXPORT int cg_grad_parse(const char *name, cg_grad *out);
/* 1 when the op's output is a weights tensor. */
CG_EXPORT int cg_op_outputs_weights(cg_op op);

/* Element strides of the tensors of geom in a fixed logical order, for
 * any layout. Data tensors: [n][c][x...] with c = channels and the spatial
 * sizes sp (nsp of them). Weights: [g][o][i][x...] with o the forward op's
 * output channels per group and i its input channels per group, the order
 * oneDNN uses for both convolution and deconvolution weights. */
CG_EXPORT void cg_geom_data_strides(const cg_geom *g, cg_data_format fmt,
                                    int64_t channels, const int64_t *sp,
                                    int64_t strides[CG_MAX_RANK]);
CG_EXPORT void cg_geom_weights_strides(const cg_geom *g, cg_weights_format fmt,
                                       int64_t strides[CG_MAX_RANK + 1]);

/* Checks that a buffer received for input `index` (0 or 1, op input order)
 * holds exactly geom->in_bytes[index] bytes. Returns 0 or CG_EINVAL with a
 * message such as "diff_dst: expected 1024 bytes (256 x f32), got 1000".
 * Thread-safe. */
CG_EXPORT int cg_geom_check_input_bytes(const cg_geom *g, int index,
                                        size_t nbytes, char *err,
                                        size_t errlen);

/* Work of the direct convolution behind geom, in flops: 2 * multiply-adds,
 * where multiply-adds = mb * groups * OCg * ICg * prod(kernel) *
 * prod(spatial of the convolution's dst), the dst being diff_dst for
 * Convolution ops and the ConvTranspose input for ConvTranspose ops. Exact
 * in integers and saturated at UINT64_MAX, so a limit can be checked
 * against it for any geometry cg_problem_resolve accepts. */
CG_EXPORT uint64_t cg_geom_flops(const cg_geom *g);

/* A bound, in the same units, on the work oneDNN's kernels do for geom:
 * cg_geom_flops plus 2 for every element of the three tensors (reorders,
 * conversions, zeroing) and for every element of the larger side padded
 * on every axis (the Convolution input or the ConvTranspose output, with
 * pads_begin + pads_end: the extent that strided and padded kernels sweep,
 * at least stride * (smaller side - 1) + effective kernel). Saturated at
 * UINT64_MAX. The engine keeps its kernels within a small multiple of it
 * (engine.c, jit_usable); --max-request-flops is checked against it. */
CG_EXPORT uint64_t cg_geom_work(const cg_geom *g);

/* The geometry of n minibatch rows of g (0 < n <= g->mb): every data
 * tensor (inputs and output) has n rows and the weights are whole. The
 * minibatch is the outermost dim of both data layouts, so row r of a data
 * tensor starts at r * (its bytes / g->mb). The slices of a backward-data
 * problem are independent; those of a backward-weights problem each
 * compute a partial diff_weights. Returns 0 or CG_EINVAL for a bad n. */
CG_EXPORT int cg_geom_slice_mb(const cg_geom *g, int64_t n, cg_geom *slice);

#ifdef __cplusplus
}
#endif
#endif
