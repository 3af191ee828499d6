/* cg/layer.h - a request resolved into the outputs it answers: the one
 * output of the four single ops, or any subset of diff_src, diff_weights
 * and diff_bias for a layer's whole backward (ConvolutionBackward,
 * ConvTransposeBackward), which takes src, diff_dst and weights once each.
 *
 * A layer's backward is the backward-data and backward-weights ops of one
 * Convolution (or ConvTranspose) on shared inputs, plus diff_bias, the sum
 * of diff_dst over the minibatch and every spatial position, one value per
 * output channel (SEMANTICS.md "Fused backward"). A cg_layer holds the
 * resolved geometry of each part, so that the reference, the engine and
 * the server run the parts as they run the single ops. Nothing here
 * allocates. */
#ifndef CG_LAYER_H
#define CG_LAYER_H

#include "cg/problem.h"
#include "cg/text.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cg_layer {
  cg_op op;
  cg_dtype dtype;
  unsigned grads; /* CG_GRAD_BIT() of each output, answered in cg_grad order */
  int ninputs;    /* data tensors: 2, or 3 (src, diff_dst, weights) */
  size_t in_bytes[3];
  /* The parts, each valid when an output needs it (a layer op has both):
   * data    diff_dst, weights -> diff_src, inputs data_in[0..1];
   * weights src, diff_dst -> diff_weights, inputs weights_in[0..1]; its
   *         diff_dst (input weights_in[1]) also gives diff_bias. */
  cg_geom data, weights;
  int data_in[2], weights_in[2];
  /* Per cg_grad: diff_bias is [OC], the others have the inputs' rank. */
  int out_rank[CG_GRAD_COUNT];
  int64_t out_dims[CG_GRAD_COUNT][CG_MAX_RANK];
  size_t out_elems[CG_GRAD_COUNT], out_bytes[CG_GRAD_COUNT];
} cg_layer;

/* Validates p (any of the six ops) and fills l. For a layer op the three
 * input dims are src, diff_dst and weights, p->grads picks the outputs
 * (0: all three), and the shapes come from the inputs only: dst_shape,
 * weights_shape and a shape input are refused, and so is output_padding
 * for ConvolutionBackward. out_data_format sets diff_src's layout and
 * out_weights_format diff_weights' (DEFAULT: as the inputs). Returns 0,
 * CG_EINVAL or CG_ERANGE with a message naming the field, as
 * cg_problem_resolve. Thread-safe. */
CG_EXPORT int cg_layer_resolve(const cg_problem *p, cg_layer *l, char *err,
                               size_t errlen);

/* The one-output layer of a single op's resolved geometry. */
CG_EXPORT void cg_layer_of_geom(const cg_geom *g, cg_layer *l);

/* The geometry behind output g: l->data for diff_src, l->weights for
 * diff_weights and diff_bias. */
CG_EXPORT const cg_geom *cg_layer_geom(const cg_layer *l, cg_grad g);
/* Number of outputs. */
CG_EXPORT int cg_layer_noutputs(const cg_layer *l);
/* Work of every output, as cg_geom_flops (diff_bias counts one add per
 * diff_dst element), saturated at UINT64_MAX. */
CG_EXPORT uint64_t cg_layer_flops(const cg_layer *l);
/* The same with cg_geom_work: the bound --max-request-flops is held to. */
CG_EXPORT uint64_t cg_layer_work(const cg_layer *l);
/* Appends the shapes of the outputs l answers, "2x3x4,3x3" (ranks read
 * from a layer a crash may have damaged are kept to the arrays):
 * async-signal-safe, as cg/text.h is. */
CG_EXPORT void cg_layer_text_outputs(cg_text *t, const cg_layer *l);
/* Appends what l computes: "op=... dtype=... in=... out=... groups=...
 * strides=... dilations=... pads_begin=... pads_end=... output_padding=...
 * data_format=... weights_format=..." (the attributes of its first
 * output's part), for a record that must name a problem, the crash report
 * (async-signal-safe, as above) or a failed result check. */
CG_EXPORT void cg_layer_text_geometry(cg_text *t, const cg_layer *l);

#ifdef __cplusplus
}
#endif
#endif
