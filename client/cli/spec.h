/* spec.h - a convolution-gradient problem as the convgrad CLI holds it:
 * the op, dtype, attributes and input dims in storage of its own (flags,
 * graph JSON and benchdnn descriptors all fill one), plus the helpers the
 * subcommands share: random tensors, the reference check, and the exit
 * codes. Single-threaded use per object. */
#ifndef CGC_SPEC_H
#define CGC_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "cg/bdesc.h"
#include "cg/dtype.h"
#include "cg/layer.h"
#include "cg/problem.h"
#include "cgc/client.h"

/* Exit codes of the convgrad CLI (also printed by --help). */
enum {
  CGC_EXIT_OK = 0,
  CGC_EXIT_FAIL = 1,        /* results differ / health not SERVING */
  CGC_EXIT_USAGE = 2,       /* bad flag or argument */
  CGC_EXIT_INPUT = 3,       /* unreadable/invalid .npy or JSON, bad problem */
  CGC_EXIT_UNAVAILABLE = 4, /* server down or not answering in time */
  CGC_EXIT_REJECTED = 5,    /* the server answered INVALID_ARGUMENT */
  CGC_EXIT_SERVER = 6,      /* any other server error status */
  CGC_EXIT_INTERNAL = 7     /* local failure: memory, writing output */
};

#define CGC_EXIT_CODES_HELP                                                    \
  "Exit codes: 0 ok, 1 mismatch or not SERVING, 2 usage error, 3 bad input\n"  \
  "file or problem, 4 server unavailable or deadline exceeded, 5 server\n"     \
  "rejected the request (INVALID_ARGUMENT), 6 other server error, 7 local\n"   \
  "failure (memory, writing output).\n"

typedef struct cgc_list {
  int64_t v[CG_MAX_ATTR_LEN];
  size_t len;
} cgc_list;

typedef struct cgc_spec {
  cg_op op;
  cg_dtype dtype;
  cgc_list strides, pads_begin, pads_end, dilations, output_padding;
  cgc_list dst_shape, weights_shape;
  int64_t groups;
  cg_auto_pad auto_pad;
  cg_data_format data_format;
  cg_weights_format weights_format;
  /* The data inputs: two, or three for the layer ops. */
  int rank[3]; /* 0: not known yet */
  int64_t dims[3][CG_MAX_RANK];
  int has_shape_input;
  cgc_list shape_input;
  cg_data_format out_data_format;
  cg_weights_format out_weights_format;
  unsigned grads; /* layer ops: CG_GRAD_BIT()s wanted, 0 = all */
} cgc_spec;

/* Data inputs of s's op: 2, or 3 for the layer ops. */
int cgc_spec_ninputs(const cgc_spec *s);

void cgc_spec_init(cgc_spec *s);
/* Fills p with pointers into s (s must outlive p). */
void cgc_spec_problem(const cgc_spec *s, cg_problem *p);
/* Builds a request whose tensors (dims from s) point at in[i] (n[i]
 * bytes), i < cgc_spec_ninputs(s). */
void cgc_spec_request_n(const cgc_spec *s, const void *const *in,
                        const size_t *n, cgc_request *r);
/* The same for a single op's two inputs. */
void cgc_spec_request(const cgc_spec *s, const void *in0, size_t n0,
                      const void *in1, size_t n1, cgc_request *r);
/* Elements the CLI allows in one input it makes up (random data): the
 * server's default max_tensor_elements, so that a mistyped shape is
 * refused before it is allocated. */
#define CGC_MAX_INPUT_ELEMS ((int64_t)1 << 30)
/* Bytes of input i (product of its dims times the dtype size) into
 * *nbytes. Returns 0, or CG_EINVAL (a negative dim) / CG_ERANGE (more than
 * CGC_MAX_INPUT_ELEMS elements) with err naming the input and the limit. */
int cgc_spec_input_bytes(const cgc_spec *s, int i, size_t *nbytes, char *err,
                         size_t errlen);
/* Turns s, a backward-weights op's spec, into that of its layer op
 * (CG_OP_CONV_BWD or CG_OP_DECONV_BWD): weights_shape becomes the third
 * input's dims. */
void cgc_spec_to_layer(cgc_spec *s, cg_op layer);
/* Copies a descriptor-built problem into s. */
void cgc_spec_from_problem(cgc_spec *s, const cg_problem *p);

/* "2,2" / "1x4x8x8" into l. Returns 0 or CG_EINVAL. */
int cgc_list_parse(const char *text, cgc_list *l);

typedef struct cgc_diff {
  double max_abs, max_rel, max_ref, tol;
  size_t worst; /* index of max_abs */
  int ok;
} cgc_diff;
/* Compares out with the reference result for geom (same layout), with a
 * tolerance from the dtype's rounding and the reduction length. */
void cgc_compare(const cg_geom *g, const void *out, const void *ref,
                 cgc_diff *d);
/* Compares output g of a call of l with the reference's ref, as
 * cgc_compare, with the tolerance of the op behind it (diff_bias: the
 * backward-weights op's). */
void cgc_compare_output(const cg_layer *l, int g, const void *out,
                        const void *ref, cgc_diff *d);

/* Exit code for a failed library call. */
int cgc_exit_for(int rc, const cgc_status *st);

#endif
