/* sync.c - the Compute calls of client.h: the blocking ones (cgc_compute*,
 * cgc_conv_bwd* and the other per-op forms) and the starts of the
 * asynchronous ones (cgc_call_start*): each checks which outputs the call
 * asks for and where they land, then runs it on the channel's replicas
 * (split.c) or on its one server (compute.c on this thread, or the
 * channel's engine, async.c). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Every blocking call, as cgc__compute. */
static int cgc__run(cgc_channel *ch, const cgc_request *req, void *const *into,
                    const size_t *into_cap, cgc_tensor *out[CG_GRAD_COUNT],
                    cgc_result *res, cgc_status *st) {
  if (!ch->nreplicas)
    return cgc__compute(ch, req, into, into_cap, CGC__CHECK_DRAW, out, res, st);
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    out[g] = NULL;
  return cgc__split_compute(ch, req, into, into_cap, out, res, st);
}

/* 0 when data holds a buffer for every output req asks for, else
 * CG_EINVAL with st filled. */
static int cgc__check_into(const cgc_request *req, void *const *data,
                           cgc_status *st) {
  unsigned w = cgc__request_wants(req, st);
  if (!w)
    return CG_EINVAL;
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    if ((w & CG_GRAD_BIT(g)) && !data[g]) {
      cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                      "data[%d]: NULL buffer for %s", g,
                      cg_grad_name((cg_grad)g));
      return CG_EINVAL;
    }
  return 0;
}

/* The one output a single-output call asks for; -1 after filling st. */
static int cgc__single(const cgc_request *req, cgc_status *st) {
  unsigned w = cgc__request_wants(req, st);
  if (w && (w & (w - 1)) == 0)
    return __builtin_ctz(w);
  if (w)
    cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                    "grads: %s asks for several outputs; use "
                    "cgc_compute_layer",
                    cg_op_name(req->op));
  return -1;
}

int cgc_compute(cgc_channel *ch, const cgc_request *req, cgc_tensor **out,
                cgc_result *res, cgc_status *st) {
  cgc_tensor *outs[CG_GRAD_COUNT];
  int g = cgc__single(req, st);
  *out = NULL;
  if (g < 0)
    return CG_EINVAL;
  int rc = cgc__run(ch, req, NULL, NULL, outs, res, st);
  if (!rc)
    *out = outs[g];
  return rc;
}

int cgc_compute_into(cgc_channel *ch, const cgc_request *req, void *data,
                     size_t cap, cgc_tensor *out, cgc_result *res,
                     cgc_status *st) {
  void *into[CG_GRAD_COUNT] = {NULL};
  size_t caps[CG_GRAD_COUNT] = {0};
  cgc_tensor *outs[CG_GRAD_COUNT];
  if (!data) {
    cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT, "data: NULL buffer");
    return CG_EINVAL;
  }
  int g = cgc__single(req, st);
  if (g < 0)
    return CG_EINVAL;
  into[g] = data;
  caps[g] = cap;
  int rc = cgc__run(ch, req, into, caps, outs, res, st);
  if (!rc) {
    *out = *outs[g];
    free(outs[g]);
  }
  return rc;
}

int cgc_compute_layer(cgc_channel *ch, const cgc_request *req,
                      cgc_tensor *out[CG_GRAD_COUNT], cgc_result *res,
                      cgc_status *st) {
  return cgc__run(ch, req, NULL, NULL, out, res, st);
}

int cgc_compute_layer_into(cgc_channel *ch, const cgc_request *req,
                           void *const data[CG_GRAD_COUNT],
                           const size_t cap[CG_GRAD_COUNT],
                           cgc_tensor out[CG_GRAD_COUNT], cgc_result *res,
                           cgc_status *st) {
  cgc_tensor *outs[CG_GRAD_COUNT];
  if (cgc__check_into(req, data, st) != 0)
    return CG_EINVAL;
  int rc = cgc__run(ch, req, data, cap, outs, res, st);
  for (int g = 0; !rc && g < CG_GRAD_COUNT; g++) {
    memset(&out[g], 0, sizeof out[g]);
    if (outs[g]) {
      out[g] = *outs[g];
      free(outs[g]);
    }
  }
  return rc;
}

static int cgc__op(cgc_channel *ch, cg_op op, const cg_attrs *attrs,
                   const cgc_tensor_view *in0, const cgc_tensor_view *in1,
                   cgc_tensor **out, cgc_result *res, cgc_status *st) {
  cgc_request r;
  cgc_request_init(&r);
  r.op = op;
  if (attrs)
    r.attrs = *attrs;
  r.inputs[0] = *in0;
  r.inputs[1] = *in1;
  return cgc_compute(ch, &r, out, res, st);
}

int cgc_conv_bwd_data(cgc_channel *ch, const cg_attrs *attrs,
                      const cgc_tensor_view *diff_dst,
                      const cgc_tensor_view *weights, cgc_tensor **diff_src,
                      cgc_result *res, cgc_status *st) {
  return cgc__op(ch, CG_OP_CONV_BWD_DATA, attrs, diff_dst, weights, diff_src,
                 res, st);
}

int cgc_conv_bwd_weights(cgc_channel *ch, const cg_attrs *attrs,
                         const cgc_tensor_view *src,
                         const cgc_tensor_view *diff_dst,
                         cgc_tensor **diff_weights, cgc_result *res,
                         cgc_status *st) {
  return cgc__op(ch, CG_OP_CONV_BWD_WEIGHTS, attrs, src, diff_dst, diff_weights,
                 res, st);
}

int cgc_deconv_bwd_data(cgc_channel *ch, const cg_attrs *attrs,
                        const cgc_tensor_view *diff_dst,
                        const cgc_tensor_view *weights, cgc_tensor **diff_src,
                        cgc_result *res, cgc_status *st) {
  return cgc__op(ch, CG_OP_DECONV_BWD_DATA, attrs, diff_dst, weights, diff_src,
                 res, st);
}

static int cgc__layer(cgc_channel *ch, cg_op op, const cg_attrs *attrs,
                      const cgc_tensor_view *const in[3], unsigned grads,
                      cgc_tensor *out[CG_GRAD_COUNT], cgc_result *res,
                      cgc_status *st) {
  cgc_request r;
  cgc_request_init(&r);
  r.op = op;
  if (attrs)
    r.attrs = *attrs;
  for (int i = 0; i < 3; i++)
    r.inputs[i] = *in[i];
  r.grads = grads;
  return cgc_compute_layer(ch, &r, out, res, st);
}

int cgc_conv_bwd(cgc_channel *ch, const cg_attrs *attrs,
                 const cgc_tensor_view *src, const cgc_tensor_view *diff_dst,
                 const cgc_tensor_view *weights, unsigned grads,
                 cgc_tensor *out[CG_GRAD_COUNT], cgc_result *res,
                 cgc_status *st) {
  const cgc_tensor_view *in[3] = {src, diff_dst, weights};
  return cgc__layer(ch, CG_OP_CONV_BWD, attrs, in, grads, out, res, st);
}

int cgc_deconv_bwd(cgc_channel *ch, const cg_attrs *attrs,
                   const cgc_tensor_view *src, const cgc_tensor_view *diff_dst,
                   const cgc_tensor_view *weights, unsigned grads,
                   cgc_tensor *out[CG_GRAD_COUNT], cgc_result *res,
                   cgc_status *st) {
  const cgc_tensor_view *in[3] = {src, diff_dst, weights};
  return cgc__layer(ch, CG_OP_DECONV_BWD, attrs, in, grads, out, res, st);
}

int cgc_deconv_bwd_weights(cgc_channel *ch, const cg_attrs *attrs,
                           const cgc_tensor_view *src,
                           const cgc_tensor_view *diff_dst,
                           cgc_tensor **diff_weights, cgc_result *res,
                           cgc_status *st) {
  return cgc__op(ch, CG_OP_DECONV_BWD_WEIGHTS, attrs, src, diff_dst,
                 diff_weights, res, st);
}

int cgc_call_start_notify(cgc_channel *ch, const cgc_request *req,
                          void *const data[CG_GRAD_COUNT],
                          const size_t cap[CG_GRAD_COUNT],
                          cgc_call_end_fn notify, void *arg, cgc_call **out,
                          cgc_status *st) {
  *out = NULL;
  if (cgc__check_into(req, data, st) != 0)
    return CG_EINVAL;
  if (ch->nreplicas)
    return cgc__split_start(ch, req, data, cap, notify, arg, out, st);
  return cgc__call_start(ch, req, data, cap, CGC__CHECK_DRAW, NULL, notify, arg,
                         out, st);
}

int cgc_call_start(cgc_channel *ch, const cgc_request *req,
                   void *const data[CG_GRAD_COUNT],
                   const size_t cap[CG_GRAD_COUNT], cgc_call **out,
                   cgc_status *st) {
  return cgc_call_start_notify(ch, req, data, cap, NULL, NULL, out, st);
}
