/* header.c - checks a call's ComputeHeader and turns it into a
 * cg_problem and input sizes (see cgs_header.h). */
#include "cgs_header.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cgs_store.h"

/* Where a refusal goes: the status code and the message buffer. */
typedef struct refusal {
  grpc_status_code *code;
  char *msg;
  size_t msglen;
} refusal;

static void refuse(refusal *r, grpc_status_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void refuse(refusal *r, grpc_status_code code, const char *fmt, ...) {
  *r->code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->msg, r->msglen, fmt, ap);
  va_end(ap);
}

static const char *layout_name(int l) {
  static const char *const names[] = {"UNSPECIFIED", "NCX", "NXC", "OIX",
                                      "XIO",         "IOX", "XOI"};
  return l >= 0 && l <= 6 ? names[l] : "?";
}

static int is_data_layout(int l) {
  return l == CONVGRAD__V1__LAYOUT__NCX || l == CONVGRAD__V1__LAYOUT__NXC;
}

static int is_weights_layout(int l) {
  return l >= CONVGRAD__V1__LAYOUT__OIX && l <= CONVGRAD__V1__LAYOUT__XOI;
}

/* Wire Layout <-> kernels enums (values line up but are not the same). */
static cg_data_format to_data_format(int l) {
  return (cg_data_format)l;
}
static cg_weights_format to_weights_format(int l) {
  return l ? (cg_weights_format)(l - 2) : CG_WEIGHTS_DEFAULT;
}

/* Size of input i in bytes into *len; -1 after refuse(). */
static int tensor_size(refusal *r, int i, const Convgrad__V1__Tensor *t,
                       size_t esize, uint64_t max, size_t *len) {
  uint64_t elems = 1;
  if (t->n_shape < 1 || t->n_shape > CG_MAX_RANK) {
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
           "inputs[%d].shape: rank %zu, expected %s", i, t->n_shape,
           i == 2 ? "1" : "3 to 5");
    return -1;
  }
  for (size_t d = 0; d < t->n_shape; d++) {
    if (t->shape[d] <= 0) {
      refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
             "inputs[%d].shape[%zu]: must be > 0, got %" PRId64, i, d,
             t->shape[d]);
      return -1;
    }
    if (__builtin_mul_overflow(elems, (uint64_t)t->shape[d], &elems)) {
      refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
             "inputs[%d].shape: element count overflows", i);
      return -1;
    }
  }
  if (elems > max) {
    refuse(r, GRPC_STATUS_RESOURCE_EXHAUSTED,
           "inputs[%d]: %" PRIu64 " elements exceed the limit %" PRIu64
           " (--max-tensor-elements); it cannot run on this server",
           i, elems, max);
    return -1;
  }
  /* elems <= 2^48 and esize <= 8: no overflow; size_t is 64-bit here. */
  *len = (size_t)(elems * esize);
  if (t->data.len > *len) {
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
           "inputs[%d].data: %zu bytes, but shape and dtype make %zu", i,
           t->data.len, *len);
    return -1;
  }
  return 0;
}

/* Checks a tensor's layout against the attribute it must agree with and
 * adopts it when the attribute is unspecified. */
static int check_layout(refusal *r, int i, int layout, int weights, int *attr) {
  if (layout == 0)
    return 0;
  if (weights ? !is_weights_layout(layout) : !is_data_layout(layout)) {
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
           "inputs[%d].layout: %s (%d) is not a %s layout", i,
           layout_name(layout), layout, weights ? "weights" : "data");
    return -1;
  }
  if (*attr == 0) {
    *attr = layout;
  } else if (*attr != layout) {
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
           "inputs[%d].layout: %s disagrees with attrs.%s_format %s", i,
           layout_name(layout), weights ? "weights" : "data",
           layout_name(*attr));
    return -1;
  }
  return 0;
}

static cg_ints ints(const int64_t *v, size_t n) {
  return (cg_ints){v, n};
}

/* header.op and the number of inputs it takes. */
static int check_op(refusal *r, const Convgrad__V1__ComputeHeader *h,
                    cgs_header_info *info) {
  if (h->op < 1 || h->op > CG_OP_ALL_COUNT) {
    if (h->op == 0)
      refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
             "header.op: not set (OP_UNSPECIFIED); name one of the six ops");
    else
      refuse(r, GRPC_STATUS_INVALID_ARGUMENT, "header.op: unknown value %d",
             (int)h->op);
    return -1;
  }
  cg_op op = (cg_op)h->op;
  info->prob.op = op;
  if (cg_op_is_layer(op)) {
    if (h->n_inputs != 3) {
      refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
             "header.inputs: %s takes src, diff_dst and weights, got %zu "
             "tensors",
             cg_op_name(op), h->n_inputs);
      return -1;
    }
    info->ninputs = 3;
    return 0;
  }
  const char *opt = cg_op_input_name(op, 2); /* the shape tensor */
  if (h->n_inputs < 2 || h->n_inputs > (opt ? 3u : 2u)) {
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
           "header.inputs: %s takes %s and %s%s%s, got %zu tensors",
           cg_op_name(op), cg_op_input_name(op, 0), cg_op_input_name(op, 1),
           opt ? ", optionally then " : "", opt ? opt : "", h->n_inputs);
    return -1;
  }
  info->ninputs = (int)h->n_inputs;
  return 0;
}

/* The enums and groups of attrs; the lists are the kernels' to check. */
static int check_attrs(refusal *r, const Convgrad__V1__Attributes *a) {
  int data_fmt = a->data_format, w_fmt = a->weights_format;
  if ((int)a->auto_pad < 0 || a->auto_pad > CONVGRAD__V1__AUTO_PAD__VALID) {
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT, "attrs.auto_pad: unknown value %d",
           (int)a->auto_pad);
    return -1;
  }
  if (data_fmt != 0 && !is_data_layout(data_fmt)) {
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
           "attrs.data_format: %s (%d) is not NCX or NXC",
           layout_name(data_fmt), data_fmt);
    return -1;
  }
  if (w_fmt != 0 && !is_weights_layout(w_fmt)) {
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
           "attrs.weights_format: %s (%d) is not OIX, XIO, IOX or XOI",
           layout_name(w_fmt), w_fmt);
    return -1;
  }
  if (a->groups < 0) {
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
           "attrs.groups: must be > 0, got %" PRId64, a->groups);
    return -1;
  }
  return 0;
}

/* 1 when inputs[i] of op is a weights tensor. */
static int is_weights_input(cg_op op, int i) {
  if (cg_op_is_layer(op))
    return i == 2;
  return i == 1 && (op == CG_OP_CONV_BWD_DATA || op == CG_OP_DECONV_BWD_DATA);
}

/* The data tensors the op takes: its shape tensor, if any, comes after. */
static int float_inputs(cg_op op) {
  return cg_op_is_layer(op) ? 3 : 2;
}

/* inputs[i], a float tensor of the request's one dtype, in a layout that
 * agrees with attrs (an unset format takes the tensor's). */
static int check_float_input(refusal *r, const Convgrad__V1__ComputeHeader *h,
                             int i, cg_problem *p, int *data_fmt, int *w_fmt) {
  const Convgrad__V1__Tensor *t = h->inputs[i];
  if (t->dtype < CONVGRAD__V1__DTYPE__F32 ||
      t->dtype > CONVGRAD__V1__DTYPE__F16) {
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
           "inputs[%d].dtype: %d is not F32, BF16 or F16", i, (int)t->dtype);
    return -1;
  }
  if (i > 0 && t->dtype != h->inputs[0]->dtype) {
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
           "inputs[%d].dtype: %s differs from inputs[0].dtype %s", i,
           cg_dtype_name((cg_dtype)t->dtype),
           cg_dtype_name((cg_dtype)h->inputs[0]->dtype));
    return -1;
  }
  p->dtype = (cg_dtype)t->dtype;
  int w = is_weights_input(p->op, i);
  return check_layout(r, i, t->layout, w, w ? w_fmt : data_fmt);
}

/* inputs[2]: the optional shape tensor, 1-D integers without a layout. */
static int check_shape_input(refusal *r, const Convgrad__V1__Tensor *t,
                             cg_op op) {
  if (t->dtype != CONVGRAD__V1__DTYPE__S32 &&
      t->dtype != CONVGRAD__V1__DTYPE__S64) {
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
           "inputs[2].dtype: a %s tensor must be S32 or S64",
           cg_op_input_name(op, 2));
    return -1;
  }
  if (t->n_shape != 1 || t->shape[0] < 1 || t->shape[0] > CG_MAX_RANK) {
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
           "inputs[2].shape: a %s tensor is 1-D with 1 to %d values",
           cg_op_input_name(op, 2), CG_MAX_RANK);
    return -1;
  }
  if (t->layout != 0) {
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
           "inputs[2].layout: a shape tensor has no layout");
    return -1;
  }
  return 0;
}

/* A RegionRef's name: what RegisterRegion accepts is checked there; here
 * only that it is set. */
static int check_region_name(refusal *r, const char *field,
                             const Convgrad__V1__RegionRef *ref) {
  if (!ref->name || !ref->name[0] || strlen(ref->name) > 64) {
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
           "%s.name: must name a registered region (1 to 64 characters)",
           field);
    return -1;
  }
  return 0;
}

/* inputs[i].region, when set: instead of data, exactly the tensor. */
static int check_input_region(refusal *r, int i, const Convgrad__V1__Tensor *t,
                              size_t len) {
  if (!t->region)
    return 0;
  char field[32];
  snprintf(field, sizeof field, "inputs[%d].region", i);
  if (t->data.len) {
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
           "inputs[%d]: data and region are exclusive (%zu bytes of data)", i,
           t->data.len);
    return -1;
  }
  if (t->region->byte_size != len) {
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
           "%s.byte_size: %" PRIu64 ", but shape and dtype make %zu", field,
           t->region->byte_size, len);
    return -1;
  }
  return check_region_name(r, field, t->region);
}

/* inputs[i].staged, when set: instead of data or a region, a store
 * entry's SHA-256. */
static int check_input_staged(refusal *r, int i,
                              const Convgrad__V1__Tensor *t) {
  if (!t->staged)
    return 0;
  if (t->data.len || t->region) {
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
           "inputs[%d]: staged excludes data and region", i);
    return -1;
  }
  if (t->staged->sha256.len != CGS_STORE_ID_BYTES) {
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
           "inputs[%d].staged.sha256: %zu bytes, expected %d", i,
           t->staged->sha256.len, CGS_STORE_ID_BYTES);
    return -1;
  }
  return 0;
}

/* dtypes, layouts and sizes of the tensors, and their total. */
static int check_inputs(refusal *r, const Convgrad__V1__ComputeHeader *h,
                        const cgs_config *cfg, cgs_header_info *info,
                        int *data_fmt, int *w_fmt) {
  cg_problem *p = &info->prob;
  uint64_t total = 0;
  for (int i = 0; i < info->ninputs; i++) {
    const Convgrad__V1__Tensor *t = h->inputs[i];
    size_t esize;
    if (i < float_inputs(p->op)) {
      if (check_float_input(r, h, i, p, data_fmt, w_fmt) != 0)
        return -1;
      esize = cg_dtype_size(p->dtype);
    } else {
      if (check_shape_input(r, t, p->op) != 0)
        return -1;
      esize = t->dtype == CONVGRAD__V1__DTYPE__S32 ? 4 : 8;
    }
    if (tensor_size(r, i, t, esize, cfg->max_tensor_elements,
                    &info->in_len[i]) != 0 ||
        check_input_region(r, i, t, info->in_len[i]) != 0 ||
        check_input_staged(r, i, t) != 0)
      return -1;
    info->in_esize[i] = esize;
    total += info->in_len[i];
  }
  if (total > cfg->max_request_bytes) {
    refuse(r, GRPC_STATUS_RESOURCE_EXHAUSTED,
           "inputs: %" PRIu64 " bytes exceed the limit %" PRIu64
           " (--max-request-bytes); it cannot run on this server",
           total, cfg->max_request_bytes);
    return -1;
  }
  return 0;
}

/* header.output_layout and weights_output_layout: unset, or of the kind
 * of the output each one sets. */
static int check_output_layouts(refusal *r,
                                const Convgrad__V1__ComputeHeader *h,
                                cg_problem *p) {
  int layer = cg_op_is_layer(p->op);
  int out = h->output_layout, wout = h->weights_output_layout;
  int want_w = !layer && cg_op_outputs_weights(p->op);
  if (out && (want_w ? !is_weights_layout(out) : !is_data_layout(out))) {
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
           "header.output_layout: %s (%d) is not a %s layout%s",
           layout_name(out), out, want_w ? "weights" : "data",
           layer ? " (it sets diff_src's; weights_output_layout sets "
                   "diff_weights')"
                 : "");
    return -1;
  }
  if (wout && !layer) {
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
           "header.weights_output_layout: only ConvolutionBackward and "
           "ConvTransposeBackward take it; %s's layout is output_layout",
           cg_op_name(p->op));
    return -1;
  }
  if (wout && !is_weights_layout(wout)) {
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
           "header.weights_output_layout: %s (%d) is not a weights layout",
           layout_name(wout), wout);
    return -1;
  }
  if (want_w)
    p->out_weights_format = to_weights_format(out);
  else
    p->out_data_format = to_data_format(out);
  if (wout)
    p->out_weights_format = to_weights_format(wout);
  return 0;
}

static const char *output_name(int o) {
  const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(
      &convgrad__v1__output__descriptor, o);
  return v ? v->name : "?";
}

/* The one output of a single op, as a wire Output. */
static int own_output(cg_op op) {
  return cg_op_outputs_weights(op) ? CONVGRAD__V1__OUTPUT__DIFF_WEIGHTS
                                   : CONVGRAD__V1__OUTPUT__DIFF_SRC;
}

/* header.outputs: the layer ops' choice, each output once; the single ops
 * may only name their own. */
static int check_outputs(refusal *r, const Convgrad__V1__ComputeHeader *h,
                         cg_problem *p) {
  unsigned mask = 0;
  for (size_t i = 0; i < h->n_outputs; i++) {
    int o = (int)h->outputs[i];
    if (o < CONVGRAD__V1__OUTPUT__DIFF_SRC ||
        o > CONVGRAD__V1__OUTPUT__DIFF_BIAS) {
      refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
             "header.outputs[%zu]: unknown value %d", i, o);
      return -1;
    }
    unsigned bit = CG_GRAD_BIT(o - CONVGRAD__V1__OUTPUT__DIFF_SRC);
    if (mask & bit) {
      refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
             "header.outputs[%zu]: %s is listed twice", i, output_name(o));
      return -1;
    }
    mask |= bit;
  }
  if (cg_op_is_layer(p->op)) {
    p->grads = mask;
    return 0;
  }
  int own = own_output(p->op);
  if (mask && mask != CG_GRAD_BIT(own - CONVGRAD__V1__OUTPUT__DIFF_SRC)) {
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
           "header.outputs: %s answers %s only", cg_op_name(p->op),
           output_name(own));
    return -1;
  }
  return 0;
}

/* header.output_regions: each names an output the call answers, once,
 * and a region; info->out_region[g] points at each. */
static int check_output_regions(refusal *r,
                                const Convgrad__V1__ComputeHeader *h,
                                const cg_problem *p, cgs_header_info *info) {
  int layer = cg_op_is_layer(p->op);
  int own = own_output(p->op);
  for (size_t k = 0; k < h->n_output_regions; k++) {
    const Convgrad__V1__OutputRegion *o = h->output_regions[k];
    char field[48];
    snprintf(field, sizeof field, "header.output_regions[%zu]", k);
    int out = o->output;
    if (!out && !layer)
      out = own;
    if (out < CONVGRAD__V1__OUTPUT__DIFF_SRC ||
        out > CONVGRAD__V1__OUTPUT__DIFF_BIAS) {
      refuse(r, GRPC_STATUS_INVALID_ARGUMENT, "%s.output: %s value %d", field,
             out ? "unknown" : "the layer ops need an output,", out);
      return -1;
    }
    int g = out - CONVGRAD__V1__OUTPUT__DIFF_SRC;
    if ((layer && p->grads && !(p->grads & CG_GRAD_BIT(g))) ||
        (!layer && out != own)) {
      refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
             "%s.output: %s is not an output this call answers", field,
             output_name(out));
      return -1;
    }
    if (info->out_region[g]) {
      refuse(r, GRPC_STATUS_INVALID_ARGUMENT, "%s.output: %s is listed twice",
             field, output_name(out));
      return -1;
    }
    if (!o->region) {
      refuse(r, GRPC_STATUS_INVALID_ARGUMENT, "%s.region: missing", field);
      return -1;
    }
    snprintf(field + strlen(field), sizeof field - strlen(field), ".region");
    if (check_region_name(r, field, o->region) != 0)
      return -1;
    info->out_region[g] = o->region;
  }
  return 0;
}

/* The problem's attributes and input dims, viewing the header's lists. */
static void take_attrs(cg_problem *p, const Convgrad__V1__ComputeHeader *h,
                       const Convgrad__V1__Attributes *a, int data_fmt,
                       int w_fmt) {
  p->attrs.strides = ints(a->strides, a->n_strides);
  p->attrs.pads_begin = ints(a->pads_begin, a->n_pads_begin);
  p->attrs.pads_end = ints(a->pads_end, a->n_pads_end);
  p->attrs.dilations = ints(a->dilations, a->n_dilations);
  p->attrs.output_padding = ints(a->output_padding, a->n_output_padding);
  p->attrs.groups = a->groups ? a->groups : 1;
  p->attrs.auto_pad = (cg_auto_pad)a->auto_pad;
  p->attrs.data_format = to_data_format(data_fmt);
  p->attrs.weights_format = to_weights_format(w_fmt);
  p->attrs.dst_shape = ints(a->dst_shape, a->n_dst_shape);
  p->attrs.weights_shape = ints(a->weights_shape, a->n_weights_shape);
  for (int i = 0; i < float_inputs(p->op); i++)
    p->input_dims[i] = ints(h->inputs[i]->shape, h->inputs[i]->n_shape);
}

/* header.response_chunk_bytes, or the server's default; at most the
 * largest chunk the server sends. */
static int take_chunk_bytes(refusal *r, const Convgrad__V1__ComputeHeader *h,
                            const cgs_config *cfg, cgs_header_info *info) {
  if (h->response_chunk_bytes &&
      h->response_chunk_bytes < CGS_MIN_CHUNK_BYTES) {
    /* One message per few bytes would hold the call's memory for hours. */
    refuse(r, GRPC_STATUS_INVALID_ARGUMENT,
           "header.response_chunk_bytes: must be 0 (the server's default) or "
           "at least %u, got %u",
           CGS_MIN_CHUNK_BYTES, h->response_chunk_bytes);
    return -1;
  }
  info->chunk_bytes = h->response_chunk_bytes ? h->response_chunk_bytes
                                              : (size_t)cfg->chunk_bytes;
  if (info->chunk_bytes > CGS_MAX_CHUNK_BYTES)
    info->chunk_bytes = CGS_MAX_CHUNK_BYTES;
  return 0;
}

int cgs_header_check(const Convgrad__V1__ComputeHeader *h,
                     const cgs_config *cfg, cgs_header_info *info,
                     grpc_status_code *code, char *msg, size_t msglen) {
  refusal r = {code, msg, msglen};
  memset(info, 0, sizeof *info);
  cg_problem_init(&info->prob);
  if (check_op(&r, h, info) != 0)
    return -1;
  Convgrad__V1__Attributes empty = CONVGRAD__V1__ATTRIBUTES__INIT;
  const Convgrad__V1__Attributes *a = h->attrs ? h->attrs : &empty;
  int data_fmt = a->data_format, w_fmt = a->weights_format;
  if (check_attrs(&r, a) != 0 ||
      check_inputs(&r, h, cfg, info, &data_fmt, &w_fmt) != 0 ||
      check_output_layouts(&r, h, &info->prob) != 0 ||
      check_outputs(&r, h, &info->prob) != 0 ||
      check_output_regions(&r, h, &info->prob, info) != 0)
    return -1;
  take_attrs(&info->prob, h, a, data_fmt, w_fmt);
  return take_chunk_bytes(&r, h, cfg, info);
}
