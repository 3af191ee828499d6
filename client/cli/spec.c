/* spec.c - the CLI's problem holder (cgc_spec), list parsing, seeded random
 * tensors, the comparison against the reference, and the mapping from
 * library errors to exit codes. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cg/dtype.h"
#include "spec.h"

void cgc_spec_init(cgc_spec *s) {
  memset(s, 0, sizeof *s);
  s->dtype = CG_DTYPE_F32;
  s->groups = 1;
}

static cg_ints cgc__ints(const cgc_list *l) {
  cg_ints r = {l->v, l->len};
  return r;
}

void cgc_spec_problem(const cgc_spec *s, cg_problem *p) {
  cg_problem_init(p);
  p->op = s->op;
  p->dtype = s->dtype;
  p->attrs.strides = cgc__ints(&s->strides);
  p->attrs.pads_begin = cgc__ints(&s->pads_begin);
  p->attrs.pads_end = cgc__ints(&s->pads_end);
  p->attrs.dilations = cgc__ints(&s->dilations);
  p->attrs.output_padding = cgc__ints(&s->output_padding);
  p->attrs.dst_shape = cgc__ints(&s->dst_shape);
  p->attrs.weights_shape = cgc__ints(&s->weights_shape);
  p->attrs.groups = s->groups;
  p->attrs.auto_pad = s->auto_pad;
  p->attrs.data_format = s->data_format;
  p->attrs.weights_format = s->weights_format;
  for (int i = 0; i < cgc_spec_ninputs(s); i++) {
    p->input_dims[i].v = s->dims[i];
    p->input_dims[i].len = (size_t)s->rank[i];
  }
  p->grads = s->grads;
  p->has_shape_input = s->has_shape_input;
  p->shape_input = cgc__ints(&s->shape_input);
  p->out_data_format = s->out_data_format;
  p->out_weights_format = s->out_weights_format;
}

static void cgc__list_copy(cgc_list *dst, cg_ints src) {
  dst->len = src.len < CG_MAX_ATTR_LEN ? src.len : CG_MAX_ATTR_LEN;
  if (dst->len)
    memcpy(dst->v, src.v, dst->len * sizeof(int64_t));
}

void cgc_spec_from_problem(cgc_spec *s, const cg_problem *p) {
  cgc_spec_init(s);
  s->op = p->op;
  s->dtype = p->dtype;
  cgc__list_copy(&s->strides, p->attrs.strides);
  cgc__list_copy(&s->pads_begin, p->attrs.pads_begin);
  cgc__list_copy(&s->pads_end, p->attrs.pads_end);
  cgc__list_copy(&s->dilations, p->attrs.dilations);
  cgc__list_copy(&s->output_padding, p->attrs.output_padding);
  cgc__list_copy(&s->dst_shape, p->attrs.dst_shape);
  cgc__list_copy(&s->weights_shape, p->attrs.weights_shape);
  s->groups = p->attrs.groups;
  s->auto_pad = p->attrs.auto_pad;
  s->data_format = p->attrs.data_format;
  s->weights_format = p->attrs.weights_format;
  for (int i = 0; i < 2; i++) {
    cgc_list l;
    cgc__list_copy(&l, p->input_dims[i]);
    s->rank[i] = (int)(l.len < CG_MAX_RANK ? l.len : CG_MAX_RANK);
    memcpy(s->dims[i], l.v, (size_t)s->rank[i] * sizeof(int64_t));
  }
  s->has_shape_input = p->has_shape_input;
  cgc__list_copy(&s->shape_input, p->shape_input);
  s->out_data_format = p->out_data_format;
  s->out_weights_format = p->out_weights_format;
}

int cgc_spec_input_bytes(const cgc_spec *s, int i, size_t *nbytes, char *err,
                         size_t errlen) {
  int64_t n = 1;
  for (int d = 0; d < s->rank[i]; d++) {
    if (s->dims[i][d] < 0)
      return cg_errorf(err, errlen, CG_EINVAL,
                       "input %d (%s): dim %d is negative (%lld)", i,
                       cg_op_input_name(s->op, i), d, (long long)s->dims[i][d]);
    /* Saturating, so that a later zero dim still empties the tensor. */
    if (__builtin_mul_overflow(n, s->dims[i][d], &n))
      n = INT64_MAX;
  }
  if (n > CGC_MAX_INPUT_ELEMS)
    return cg_errorf(err, errlen, CG_ERANGE,
                     "input %d (%s): more than the limit of %lld elements "
                     "(the server's default max_tensor_elements)",
                     i, cg_op_input_name(s->op, i),
                     (long long)CGC_MAX_INPUT_ELEMS);
  *nbytes = (size_t)n * cg_dtype_size(s->dtype);
  return 0;
}

void cgc_spec_to_layer(cgc_spec *s, cg_op layer) {
  s->op = layer;
  s->rank[2] = (int)s->weights_shape.len;
  memcpy(s->dims[2], s->weights_shape.v,
         s->weights_shape.len * sizeof(int64_t));
  s->weights_shape.len = 0;
}

void cgc_compare_output(const cg_layer *l, int g, const void *out,
                        const void *ref, cgc_diff *d) {
  cg_geom geom = *cg_layer_geom(l, (cg_grad)g);
  geom.out_elems = l->out_elems[g];
  cgc_compare(&geom, out, ref, d);
}

int cgc_spec_ninputs(const cgc_spec *s) {
  return cg_op_is_layer(s->op) ? 3 : 2;
}

static cgc_layout cgc__weights_layout(cg_weights_format f) {
  return f == CG_WEIGHTS_DEFAULT ? CGC_LAYOUT_DEFAULT : (cgc_layout)(f + 2);
}

void cgc_spec_request_n(const cgc_spec *s, const void *const *in,
                        const size_t *n, cgc_request *r) {
  cg_problem p;
  cgc_spec_problem(s, &p);
  cgc_request_init(r);
  r->op = s->op;
  r->attrs = p.attrs;
  for (int i = 0; i < cgc_spec_ninputs(s); i++) {
    cgc_tensor_view *v = &r->inputs[i];
    v->dtype = s->dtype;
    v->rank = s->rank[i];
    memcpy(v->dims, s->dims[i], sizeof v->dims);
    v->layout = CGC_LAYOUT_DEFAULT;
    v->data = in[i];
    v->nbytes = n[i];
  }
  r->has_shape_input = s->has_shape_input;
  r->shape_input = p.shape_input;
  if (cg_op_is_layer(s->op)) {
    r->output_layout = (cgc_layout)s->out_data_format;
    r->weights_output_layout = cgc__weights_layout(s->out_weights_format);
    r->grads = s->grads;
  } else if (cg_op_outputs_weights(s->op)) {
    r->output_layout = cgc__weights_layout(s->out_weights_format);
  } else {
    r->output_layout = (cgc_layout)s->out_data_format;
  }
}

void cgc_spec_request(const cgc_spec *s, const void *in0, size_t n0,
                      const void *in1, size_t n1, cgc_request *r) {
  const void *in[3] = {in0, in1, NULL};
  size_t n[3] = {n0, n1, 0};
  cgc_spec_request_n(s, in, n, r);
}

int cgc_list_parse(const char *text, cgc_list *l) {
  const char *p = text;
  l->len = 0;
  if (!text || !*text)
    return CG_EINVAL;
  while (*p) {
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (end == p || errno)
      return CG_EINVAL;
    if (l->len >= CG_MAX_ATTR_LEN)
      return CG_EINVAL;
    l->v[l->len++] = v;
    p = end;
    if (*p == ',' || *p == 'x')
      p++;
    else if (*p)
      return CG_EINVAL;
  }
  return 0;
}

static double cgc__reduction_len(const cg_geom *g) {
  double k = 1, osp = 1, isp = 1;
  for (int i = 0; i < g->nsp; i++) {
    k *= (double)g->kernel[i];
    osp *= (double)g->out_sp[i];
    isp *= (double)g->in_sp[i];
  }
  int64_t oc_per_group = g->oc / g->groups;
  switch (g->op) {
  case CG_OP_CONV_BWD_DATA:
  case CG_OP_DECONV_BWD_DATA:
    return (double)oc_per_group * k;
  default:
    return (double)g->mb * (osp > isp ? osp : isp);
  }
}

void cgc_compare(const cg_geom *g, const void *out, const void *ref,
                 cgc_diff *d) {
  memset(d, 0, sizeof *d);
  for (size_t i = 0; i < g->out_elems; i++) {
    double r = cg_load_f32(g->dtype, ref, i);
    double o = cg_load_f32(g->dtype, out, i);
    double e = fabs(o - r);
    if (fabs(r) > d->max_ref)
      d->max_ref = fabs(r);
    /* NaN anywhere is a mismatch: keep it visible in max_abs. */
    if (e > d->max_abs || e != e) {
      d->max_abs = e;
      d->worst = i;
    }
  }
  double scale = d->max_ref > 1e-3 ? d->max_ref : 1e-3;
  /* Output rounding of the dtype plus f32 accumulation over the reduction
   * (random-walk growth), with a safety factor; real bugs are O(1). */
  d->tol = scale * (2.0 * cg_dtype_epsilon(g->dtype) +
                    16.0 * ldexp(1.0, -24) * sqrt(cgc__reduction_len(g)));
  d->max_rel = d->max_abs / scale;
  d->ok = d->max_abs <= d->tol;
}

int cgc_exit_for(int rc, const cgc_status *st) {
  if (rc == CGC_ERPC) {
    switch (st->code) {
    case GRPC_STATUS_UNAVAILABLE:
    case GRPC_STATUS_DEADLINE_EXCEEDED:
      return CGC_EXIT_UNAVAILABLE;
    case GRPC_STATUS_INVALID_ARGUMENT:
      return CGC_EXIT_REJECTED;
    default:
      return CGC_EXIT_SERVER;
    }
  }
  if (rc == CGC_EPROTO)
    return CGC_EXIT_SERVER;
  if (rc == CG_EINVAL || rc == CG_ERANGE)
    return CGC_EXIT_INPUT;
  return CGC_EXIT_INTERNAL;
}
