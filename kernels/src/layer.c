/* layer.c - resolving any request into its outputs (cg/layer.h). A layer
 * op is resolved as its two single ops: backward weights first, with the
 * weights tensor as weights_shape, so that every message names the
 * layer's own tensors; then backward data, with src as dst_shape
 * (Convolution) or with the output_padding the shapes imply
 * (ConvTranspose), which reproduces src's shape exactly. */
#include <string.h>

#include "cg/layer.h"
#include "layout.h"

static int is_deconv_layer(cg_op op) {
  return op == CG_OP_DECONV_BWD;
}

static void set_output(cg_layer *l, cg_grad g, const int64_t *dims, int rank,
                       size_t elems, size_t bytes) {
  l->out_rank[g] = rank;
  memcpy(l->out_dims[g], dims, sizeof(int64_t) * (size_t)rank);
  l->out_elems[g] = elems;
  l->out_bytes[g] = bytes;
}

void cg_layer_of_geom(const cg_geom *g, cg_layer *l) {
  memset(l, 0, sizeof *l);
  l->op = g->op;
  l->dtype = g->dtype;
  cg_grad out =
      cg_op_outputs_weights(g->op) ? CG_GRAD_DIFF_WEIGHTS : CG_GRAD_DIFF_SRC;
  l->grads = CG_GRAD_BIT(out);
  l->ninputs = 2;
  l->in_bytes[0] = g->in_bytes[0];
  l->in_bytes[1] = g->in_bytes[1];
  if (out == CG_GRAD_DIFF_SRC)
    l->data = *g;
  else
    l->weights = *g;
  l->data_in[0] = l->weights_in[0] = 0;
  l->data_in[1] = l->weights_in[1] = 1;
  set_output(l, out, g->out_dims, g->in_rank, g->out_elems, g->out_bytes);
}

static int refuse_layer_attrs(const cg_problem *p, char *err, size_t errlen) {
  const char *opn = cg_op_name(p->op);
  if (p->grads & ~CG_GRADS_ALL)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "outputs: unknown output in mask 0x%x", p->grads);
  if (p->attrs.dst_shape.len > 0)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "dst_shape: not an attribute of %s (src gives the shape "
                     "of diff_src)",
                     opn);
  if (p->attrs.weights_shape.len > 0)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "weights_shape: not an attribute of %s (weights gives "
                     "the shape of diff_weights)",
                     opn);
  if (p->has_shape_input)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "shape input: %s takes src, diff_dst and weights only",
                     opn);
  return 0;
}

/* The backward-data part, from the resolved backward-weights part w. */
static int resolve_data(const cg_problem *p, const cg_geom *w, cg_geom *d,
                        char *err, size_t errlen) {
  cg_problem q = *p;
  int64_t op[CG_MAX_SPATIAL];
  q.grads = 0;
  q.input_dims[0] = p->input_dims[1];
  q.input_dims[1] = p->input_dims[2];
  q.input_dims[2] = (cg_ints){NULL, 0};
  q.out_weights_format = CG_WEIGHTS_DEFAULT;
  if (is_deconv_layer(p->op)) {
    q.op = CG_OP_DECONV_BWD_DATA;
    memcpy(op, w->output_padding, sizeof op);
    q.attrs.output_padding = (cg_ints){op, (size_t)w->nsp};
  } else {
    q.op = CG_OP_CONV_BWD_DATA;
    q.has_shape_input = 1;
    q.shape_input = p->input_dims[0];
  }
  int rc = cg__problem_resolve_in(&q, p->op, d, err, errlen);
  if (rc)
    return rc;
  for (int a = 0; a < w->nsp; a++)
    if (d->in_sp[a] != w->in_sp[a])
      return cg_errorf(err, errlen, CG_EINVAL,
                       "src: spatial dim %d is %lld, but diff_dst and "
                       "weights make diff_src %lld",
                       a, (long long)w->in_sp[a], (long long)d->in_sp[a]);
  return 0;
}

static int resolve_layer(const cg_problem *p, cg_layer *l, char *err,
                         size_t errlen) {
  int rc = refuse_layer_attrs(p, err, errlen);
  if (rc)
    return rc;
  cg_problem q = *p;
  q.op = is_deconv_layer(p->op) ? CG_OP_DECONV_BWD_WEIGHTS
                                : CG_OP_CONV_BWD_WEIGHTS;
  q.grads = 0;
  q.input_dims[2] = (cg_ints){NULL, 0};
  q.has_shape_input = 1;
  q.shape_input = p->input_dims[2];
  q.out_data_format = CG_DATA_DEFAULT;
  if ((rc = cg__problem_resolve_in(&q, p->op, &l->weights, err, errlen)) ||
      (rc = resolve_data(p, &l->weights, &l->data, err, errlen)))
    return rc;
  l->grads = p->grads ? p->grads : CG_GRADS_ALL;
  l->ninputs = 3;
  l->in_bytes[0] = l->weights.in_bytes[0];
  l->in_bytes[1] = l->weights.in_bytes[1];
  l->in_bytes[2] = l->data.in_bytes[1];
  l->data_in[0] = 1;
  l->data_in[1] = 2;
  l->weights_in[0] = 0;
  l->weights_in[1] = 1;
  if (l->grads & CG_GRAD_BIT(CG_GRAD_DIFF_SRC))
    set_output(l, CG_GRAD_DIFF_SRC, l->data.out_dims, l->data.in_rank,
               l->data.out_elems, l->data.out_bytes);
  if (l->grads & CG_GRAD_BIT(CG_GRAD_DIFF_WEIGHTS))
    set_output(l, CG_GRAD_DIFF_WEIGHTS, l->weights.out_dims, l->weights.in_rank,
               l->weights.out_elems, l->weights.out_bytes);
  /* OC < 2^31 and 8-byte elements at most: no overflow. */
  int64_t oc = l->weights.oc;
  set_output(l, CG_GRAD_DIFF_BIAS, &oc, 1, (size_t)oc,
             (size_t)oc * cg_dtype_size(p->dtype));
  return 0;
}

int cg_layer_resolve(const cg_problem *p, cg_layer *l, char *err,
                     size_t errlen) {
  int rc;
  if (!cg_op_is_layer(p->op)) {
    cg_geom g;
    rc = cg_problem_resolve(p, &g, err, errlen);
    if (rc == 0)
      cg_layer_of_geom(&g, l);
    return rc;
  }
  cg_layer r;
  memset(&r, 0, sizeof r);
  r.op = p->op;
  r.dtype = p->dtype;
  if ((rc = resolve_layer(p, &r, err, errlen)) == 0)
    *l = r;
  return rc;
}

const cg_geom *cg_layer_geom(const cg_layer *l, cg_grad g) {
  return g == CG_GRAD_DIFF_SRC ? &l->data : &l->weights;
}

int cg_layer_noutputs(const cg_layer *l) {
  return __builtin_popcount(l->grads);
}

uint64_t cg_layer_work(const cg_layer *l) {
  uint64_t f = 0, add;
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    if (!(l->grads & CG_GRAD_BIT(g)))
      continue;
    add = g == CG_GRAD_DIFF_BIAS ? (uint64_t)l->weights.in_elems[1]
                                 : cg_geom_work(cg_layer_geom(l, (cg_grad)g));
    if (__builtin_add_overflow(f, add, &f))
      return UINT64_MAX;
  }
  return f;
}

/* A rank read from memory a crash may have damaged, kept to its array. */
static size_t rank_of(int rank) {
  return rank < 0 ? 0 : rank > CG_MAX_RANK ? CG_MAX_RANK : (size_t)rank;
}

void cg_layer_text_outputs(cg_text *t, const cg_layer *l) {
  for (int g = 0, n = 0; g < CG_GRAD_COUNT; g++) {
    if (!(l->grads & CG_GRAD_BIT(g)))
      continue;
    if (n++)
      cg_text_append(t, ",", 1);
    cg_text_dims(t, l->out_dims[g], rank_of(l->out_rank[g]));
  }
}

static void append_ints(cg_text *t, const char *key, const int64_t *v, int n) {
  cg_text_str(t, " ");
  cg_text_str(t, key);
  cg_text_str(t, "=");
  for (int i = 0; i < n && i < CG_MAX_SPATIAL; i++) {
    if (i)
      cg_text_str(t, ",");
    cg_text_int(t, v[i]);
  }
}

void cg_layer_text_geometry(cg_text *t, const cg_layer *l) {
  /* The geometry of the first output: every part shares the attributes. */
  const cg_geom *g =
      (l->grads & CG_GRAD_BIT(CG_GRAD_DIFF_SRC)) ? &l->data : &l->weights;
  cg_text_str(t, "op=");
  cg_text_str(t, cg_op_name(l->op));
  cg_text_str(t, " dtype=");
  cg_text_str(t, cg_dtype_name(l->dtype));
  cg_text_str(t, " in=");
  for (int i = 0; i < l->ninputs && i < 3; i++) {
    /* A layer's inputs: src and diff_dst of its weights part, then the
     * weights its data part reads. */
    const cg_geom *p = i < 2 && l->ninputs == 3 ? &l->weights
                       : l->ninputs == 3        ? &l->data
                                                : g;
    if (i)
      cg_text_str(t, ",");
    cg_text_dims(t, p->in_dims[i < 2 ? i : 1], rank_of(p->in_rank));
  }
  cg_text_str(t, " out=");
  cg_layer_text_outputs(t, l);
  cg_text_str(t, " groups=");
  cg_text_int(t, g->groups);
  append_ints(t, "strides", g->stride, g->nsp);
  append_ints(t, "dilations", g->dilation, g->nsp);
  append_ints(t, "pads_begin", g->pad_begin, g->nsp);
  append_ints(t, "pads_end", g->pad_end, g->nsp);
  append_ints(t, "output_padding", g->output_padding, g->nsp);
  cg_text_str(t, " data_format=");
  cg_text_str(t, cg_data_format_name(g->data_format));
  cg_text_str(t, " weights_format=");
  cg_text_str(t, cg_weights_format_name(g->weights_format));
}

uint64_t cg_layer_flops(const cg_layer *l) {
  uint64_t f = 0, add;
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    if (!(l->grads & CG_GRAD_BIT(g)))
      continue;
    add = g == CG_GRAD_DIFF_BIAS ? (uint64_t)l->weights.in_elems[1]
                                 : cg_geom_flops(cg_layer_geom(l, (cg_grad)g));
    if (__builtin_add_overflow(f, add, &f))
      return UINT64_MAX;
  }
  return f;
}
