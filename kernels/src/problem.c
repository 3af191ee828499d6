/* problem.c - validation and shape inference of a cg_problem into a
 * cg_geom, following proto/SEMANTICS.md, and the layout stride
 * helpers. Owns every rule about which shapes and attributes are legal.
 *
 * Every dim and attribute value is capped at CG_MAX_DIM (< 2^31) before any
 * arithmetic, so the spatial formulas below cannot overflow int64_t (each
 * product of two capped values is < 2^62). The sums oneDNN computes in int
 * are capped at CG_MAX_DIM too (check_int_range). Element counts and byte
 * sizes are products of up to five dims and are checked with
 * __builtin_mul_overflow. */
#include <inttypes.h>
#include <string.h>

#include "cg/problem.h"
#include "layout.h"

#define LLD PRId64

/* Everything resolve() works on: the request, the errors buffer and the
 * attribute lists after defaults. */
typedef struct {
  const cg_problem *p;
  cg_geom *g;
  char *err;
  size_t errlen;
  int deconv; /* a ConvTranspose op */
  int rank, nsp;
  int64_t ek[CG_MAX_SPATIAL]; /* effective kernel */
  int has_op;                 /* output_padding given */
  int64_t op[CG_MAX_SPATIAL];
  /* The dst_shape / weights_shape in effect (input beats attribute). */
  cg_ints shape;
  const char *shape_name;
  /* The op messages name: the problem's, or the layer op it is part of. */
  cg_op layer_op;
  const char *opn;
} ctx;

void cg_attrs_init(cg_attrs *a) {
  memset(a, 0, sizeof(*a));
  a->groups = 1;
  a->auto_pad = CG_AUTO_PAD_NONE;
  a->data_format = CG_DATA_DEFAULT;
  a->weights_format = CG_WEIGHTS_DEFAULT;
}

void cg_problem_init(cg_problem *p) {
  memset(p, 0, sizeof(*p));
  cg_attrs_init(&p->attrs);
}

/* ---- layouts ---------------------------------------------------------- */

/* Positions of the O dim, the I dim and the first kernel dim of a weights
 * tensor in format f. The letters sit at the same place for every op; what
 * they count differs (see cg__weights_dims). */
static void weights_positions(cg_weights_format f, int nsp, int *o, int *i,
                              int *k) {
  switch (f) {
  case CG_WEIGHTS_OIX:
    *o = 0, *i = 1, *k = 2;
    break;
  case CG_WEIGHTS_IOX:
    *i = 0, *o = 1, *k = 2;
    break;
  case CG_WEIGHTS_XOI:
    *k = 0, *o = nsp, *i = nsp + 1;
    break;
  case CG_WEIGHTS_XIO:
  default:
    *k = 0, *i = nsp, *o = nsp + 1;
    break;
  }
}

static int is_deconv(cg_op op) {
  return op == CG_OP_DECONV_BWD_DATA || op == CG_OP_DECONV_BWD_WEIGHTS ||
         op == CG_OP_DECONV_BWD;
}

static cg_weights_format default_weights_format(cg_op op) {
  return is_deconv(op) ? CG_WEIGHTS_XOI : CG_WEIGHTS_XIO;
}

/* Sizes of the O and I dims: Convolution weights hold (OC, IC/g), all
 * ConvTranspose spellings hold (OC/g, IC). */
void cg__weights_dims(cg_op op, cg_weights_format f, int nsp, int64_t oc,
                      int64_t ic, int64_t g, const int64_t *k,
                      int64_t dims[CG_MAX_RANK]) {
  int po, pi, pk;
  if (f == CG_WEIGHTS_DEFAULT)
    f = default_weights_format(op);
  weights_positions(f, nsp, &po, &pi, &pk);
  dims[po] = is_deconv(op) ? oc / g : oc;
  dims[pi] = is_deconv(op) ? ic : ic / g;
  for (int d = 0; d < nsp; d++)
    dims[pk + d] = k[d];
}

static void weights_dims(const cg_geom *g, cg_weights_format f,
                         int64_t dims[CG_MAX_RANK]) {
  cg__weights_dims(g->op, f, g->nsp, g->oc, g->ic, g->groups, g->kernel, dims);
}

void cg__data_dims(cg_data_format f, int nsp, int64_t n, int64_t c,
                   const int64_t *sp, int64_t dims[CG_MAX_RANK]) {
  dims[0] = n;
  if (f == CG_DATA_NCX) {
    dims[1] = c;
    for (int d = 0; d < nsp; d++)
      dims[2 + d] = sp[d];
  } else {
    for (int d = 0; d < nsp; d++)
      dims[1 + d] = sp[d];
    dims[1 + nsp] = c;
  }
}

/* Index of spatial axis d / of the channel dim in a data tensor. */
static int data_sp_index(cg_data_format f, int d) {
  return f == CG_DATA_NCX ? 2 + d : 1 + d;
}

static int data_c_index(cg_data_format f, int nsp) {
  return f == CG_DATA_NCX ? 1 : 1 + nsp;
}

static void data_split(cg_data_format f, int nsp, const int64_t *dims,
                       int64_t *n, int64_t *c, int64_t *sp) {
  *n = dims[0];
  *c = dims[data_c_index(f, nsp)];
  for (int d = 0; d < nsp; d++)
    sp[d] = dims[data_sp_index(f, d)];
}

void cg_geom_data_strides(const cg_geom *g, cg_data_format fmt,
                          int64_t channels, const int64_t *sp,
                          int64_t strides[CG_MAX_RANK]) {
  int64_t s = 1;
  if (fmt == CG_DATA_NCX) {
    for (int d = g->nsp - 1; d >= 0; d--) {
      strides[2 + d] = s;
      s *= sp[d];
    }
    strides[1] = s;
    s *= channels;
  } else {
    strides[1] = 1;
    s = channels;
    for (int d = g->nsp - 1; d >= 0; d--) {
      strides[2 + d] = s;
      s *= sp[d];
    }
  }
  strides[0] = s;
}

void cg_geom_weights_strides(const cg_geom *g, cg_weights_format fmt,
                             int64_t strides[CG_MAX_RANK + 1]) {
  int64_t dims[CG_MAX_RANK] = {0}, phys[CG_MAX_RANK] = {0};
  int rank = g->nsp + 2, po = 0, pi = 0, pk = 0;
  if (fmt == CG_WEIGHTS_DEFAULT)
    fmt = default_weights_format(g->op);
  weights_dims(g, fmt, dims);
  weights_positions(fmt, g->nsp, &po, &pi, &pk);
  int64_t s = 1;
  for (int d = rank - 1; d >= 0; d--) {
    phys[d] = s;
    s *= dims[d];
  }
  /* The group index selects a block of the dim that holds total channels:
   * O for Convolution, I for ConvTranspose. */
  if (is_deconv(g->op))
    strides[0] = (g->ic / g->groups) * phys[pi];
  else
    strides[0] = (g->oc / g->groups) * phys[po];
  strides[1] = phys[po];
  strides[2] = phys[pi];
  for (int d = 0; d < g->nsp; d++)
    strides[3 + d] = phys[pk + d];
}

int cg_geom_check_input_bytes(const cg_geom *g, int index, size_t nbytes,
                              char *err, size_t errlen) {
  if (index < 0 || index > 1)
    return cg_errorf(err, errlen, CG_EINVAL, "input index %d out of range",
                     index);
  if (nbytes != g->in_bytes[index])
    return cg_errorf(err, errlen, CG_EINVAL,
                     "%s: expected %zu bytes (%zu x %s), got %zu",
                     cg_op_input_name(g->op, index), g->in_bytes[index],
                     g->in_elems[index], cg_dtype_name(g->dtype), nbytes);
  return 0;
}

/* ---- validation helpers ----------------------------------------------- */

static int check_dims(ctx *c, const char *name, cg_ints t) {
  if (t.len > 0 && t.v == NULL)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "%s: NULL dims with length %zu", name, t.len);
  if (t.len != (size_t)c->rank)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "%s: expected rank %d (as %s), got %zu", name, c->rank,
                     cg_op_input_name(c->p->op, 0), t.len);
  for (int d = 0; d < c->rank; d++) {
    if (t.v[d] <= 0)
      return cg_errorf(c->err, c->errlen, CG_EINVAL,
                       "%s[%d]: must be > 0, got %" LLD, name, d, t.v[d]);
    if (t.v[d] > CG_MAX_DIM)
      return cg_errorf(c->err, c->errlen, CG_ERANGE,
                       "%s[%d]: %" LLD " exceeds the largest dim %" LLD, name,
                       d, t.v[d], CG_MAX_DIM);
  }
  return 0;
}

static int all_zero(cg_ints l) {
  for (size_t i = 0; i < l.len; i++)
    if (l.v[i] != 0)
      return 0;
  return 1;
}

/* Resolves one attribute list into out[nsp]. Empty means def. With
 * zeros_any_len, an all-zero list of any length means zeros (oneDNN's graph
 * JSON writes 12). Sets *given when the list carried values for every
 * spatial dim (an all-zero list of another length is the serialised
 * default, not a request). */
static int attr_list(ctx *c, const char *name, cg_ints l, int64_t min,
                     int zeros_any_len, int64_t def, int64_t *out, int *given) {
  if (given != NULL)
    *given = 0;
  for (int d = 0; d < c->nsp; d++)
    out[d] = def;
  if (l.len == 0)
    return 0;
  if (l.v == NULL)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "%s: NULL values with length %zu", name, l.len);
  if (l.len > CG_MAX_ATTR_LEN)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "%s: %zu values, at most %d accepted", name, l.len,
                     CG_MAX_ATTR_LEN);
  if (l.len != (size_t)c->nsp) {
    if (zeros_any_len && all_zero(l)) {
      for (int d = 0; d < c->nsp; d++)
        out[d] = 0;
      return 0;
    }
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "%s: expected %d values for %d spatial dims, got %zu",
                     name, c->nsp, c->nsp, l.len);
  }
  for (int d = 0; d < c->nsp; d++) {
    if (l.v[d] < min)
      return cg_errorf(c->err, c->errlen, CG_EINVAL,
                       "%s[%d]: must be %s, got %" LLD, name, d,
                       min > 0 ? "> 0" : ">= 0", l.v[d]);
    if (l.v[d] > CG_MAX_DIM)
      return cg_errorf(c->err, c->errlen, CG_ERANGE,
                       "%s[%d]: %" LLD " exceeds the largest value %" LLD, name,
                       d, l.v[d], CG_MAX_DIM);
    out[d] = l.v[d];
  }
  if (given != NULL)
    *given = 1;
  return 0;
}

/* Enums, formats and which attributes the op has. */
/* Every enum in range. */
static int check_enum_ranges(const ctx *c) {
  const cg_problem *p = c->p;
  const cg_attrs *a = &p->attrs;
  if (cg_op_is_layer(p->op))
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "op: %s has several outputs (cg_layer_resolve)",
                     cg_op_name(p->op));
  if (p->op < 1 || p->op > CG_OP_COUNT)
    return cg_errorf(c->err, c->errlen, CG_EINVAL, "op: invalid value %d",
                     (int)p->op);
  if (p->grads != 0)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "outputs: %s has one output; only ConvolutionBackward "
                     "and ConvTransposeBackward take a choice",
                     c->opn);
  if (p->input_dims[2].len != 0)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "inputs: %s takes two data tensors, got a third", c->opn);
  if (cg_dtype_size(p->dtype) == 0)
    return cg_errorf(c->err, c->errlen, CG_EINVAL, "dtype: invalid value %d",
                     (int)p->dtype);
  if ((int)a->data_format < 0 || a->data_format > CG_DATA_NXC)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "data_format: invalid value %d", (int)a->data_format);
  if ((int)a->weights_format < 0 || a->weights_format > CG_WEIGHTS_XOI)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "weights_format: invalid value %d",
                     (int)a->weights_format);
  if ((int)a->auto_pad < 0 || a->auto_pad > CG_AUTO_PAD_VALID)
    return cg_errorf(c->err, c->errlen, CG_EINVAL, "auto_pad: invalid value %d",
                     (int)a->auto_pad);
  if ((int)p->out_data_format < 0 || p->out_data_format > CG_DATA_NXC)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "out_data_format: invalid value %d",
                     (int)p->out_data_format);
  if ((int)p->out_weights_format < 0 || p->out_weights_format > CG_WEIGHTS_XOI)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "out_weights_format: invalid value %d",
                     (int)p->out_weights_format);
  return 0;
}

/* The layouts the op takes, and only the output format of its kind. */
static int check_layouts_for_op(const ctx *c) {
  const cg_problem *p = c->p;
  const cg_attrs *a = &p->attrs;
  const char *opn = c->opn;
  int outw = cg_op_outputs_weights(p->op);
  if (!c->deconv) {
    if (a->weights_format == CG_WEIGHTS_IOX ||
        a->weights_format == CG_WEIGHTS_XOI)
      return cg_errorf(c->err, c->errlen, CG_EINVAL,
                       "weights_format: %s is a ConvTranspose layout; %s "
                       "takes OIX or XIO",
                       cg_weights_format_name(a->weights_format), opn);
    if (p->out_weights_format == CG_WEIGHTS_IOX ||
        p->out_weights_format == CG_WEIGHTS_XOI)
      return cg_errorf(c->err, c->errlen, CG_EINVAL,
                       "out_weights_format: %s is a ConvTranspose layout; %s "
                       "takes OIX or XIO",
                       cg_weights_format_name(p->out_weights_format), opn);
  }
  if (outw && p->out_data_format != CG_DATA_DEFAULT)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "out_data_format: %s outputs weights; set "
                     "out_weights_format instead",
                     opn);
  if (!outw && p->out_weights_format != CG_WEIGHTS_DEFAULT)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "out_weights_format: %s outputs a data tensor; set "
                     "out_data_format instead",
                     opn);
  return 0;
}

/* groups, and only the attributes the op has. */
static int check_op_attrs(const ctx *c) {
  const cg_problem *p = c->p;
  const cg_attrs *a = &p->attrs;
  const char *opn = c->opn;
  int outw = cg_op_outputs_weights(p->op);
  if (a->groups <= 0)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "groups: must be > 0, got %" LLD, a->groups);
  if (a->groups > CG_MAX_DIM)
    return cg_errorf(c->err, c->errlen, CG_ERANGE,
                     "groups: %" LLD " exceeds the largest value %" LLD,
                     a->groups, CG_MAX_DIM);
  if (p->op == CG_OP_CONV_BWD_WEIGHTS && a->output_padding.len > 0)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "output_padding: not an attribute of %s", opn);
  if (p->op != CG_OP_CONV_BWD_DATA && a->dst_shape.len > 0)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "dst_shape: not an attribute of %s", opn);
  if (!outw && a->weights_shape.len > 0)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "weights_shape: not an attribute of %s", opn);
  if (p->op == CG_OP_DECONV_BWD_DATA && p->has_shape_input)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "shape input: %s takes only diff_dst and weights", opn);

  return 0;
}

static int check_enums(ctx *c) {
  const cg_problem *p = c->p;
  const cg_attrs *a = &p->attrs;
  cg_geom *g = c->g;
  int rc = check_enum_ranges(c);
  if (!rc)
    rc = check_layouts_for_op(c);
  if (!rc)
    rc = check_op_attrs(c);
  if (rc)
    return rc;
  g->op = p->op;
  g->dtype = p->dtype;
  g->groups = a->groups;
  g->data_format =
      a->data_format == CG_DATA_DEFAULT ? CG_DATA_NXC : a->data_format;
  g->weights_format = a->weights_format == CG_WEIGHTS_DEFAULT
                          ? default_weights_format(p->op)
                          : a->weights_format;
  g->out_data_format = p->out_data_format == CG_DATA_DEFAULT
                           ? g->data_format
                           : p->out_data_format;
  g->out_weights_format = p->out_weights_format == CG_WEIGHTS_DEFAULT
                              ? g->weights_format
                              : p->out_weights_format;
  return 0;
}

static int check_attr_lists(ctx *c) {
  const cg_attrs *a = &c->p->attrs;
  cg_geom *g = c->g;
  int rc;
  if ((rc = attr_list(c, "strides", a->strides, 1, 0, 1, g->stride, NULL)) ||
      (rc =
           attr_list(c, "dilations", a->dilations, 1, 0, 1, g->dilation, NULL)))
    return rc;
  /* With auto_pad set the pads are computed, and the spec says the given
   * lists are ignored, not validated. */
  if (a->auto_pad == CG_AUTO_PAD_NONE &&
      ((rc = attr_list(c, "pads_begin", a->pads_begin, 0, 1, 0, g->pad_begin,
                       NULL)) ||
       (rc = attr_list(c, "pads_end", a->pads_end, 0, 1, 0, g->pad_end, NULL))))
    return rc;
  if ((rc = attr_list(c, "output_padding", a->output_padding, 0, 1, 0, c->op,
                      &c->has_op)))
    return rc;
  return 0;
}

/* Picks the shape input or attribute and checks its rank and dims. */
static int pick_shape(ctx *c) {
  const cg_problem *p = c->p;
  int wshape = cg_op_outputs_weights(p->op);
  /* Inside a layer's backward the shape comes from an input tensor. */
  if (c->layer_op)
    c->shape_name = wshape ? "weights" : "src";
  else
    c->shape_name = wshape ? "weights_shape" : "dst_shape";
  if (p->has_shape_input && p->shape_input.len > 0)
    c->shape = p->shape_input;
  else
    c->shape = wshape ? p->attrs.weights_shape : p->attrs.dst_shape;
  if (c->shape.len == 0)
    return 0;
  return check_dims(c, c->shape_name, c->shape);
}

/* Reads the (O, I, K) of a weights tensor or weights_shape in g's weights
 * format and fills g->kernel and the effective kernel. */
static void read_weights(ctx *c, const int64_t *w, int64_t *o, int64_t *i) {
  int po, pi, pk;
  weights_positions(c->g->weights_format, c->nsp, &po, &pi, &pk);
  *o = w[po];
  *i = w[pi];
  for (int d = 0; d < c->nsp; d++) {
    c->g->kernel[d] = w[pk + d];
    c->ek[d] = (c->g->kernel[d] - 1) * c->g->dilation[d] + 1;
  }
}

/* auto_pad. For Convolution ops `in` is the forward input size; the
 * ConvTranspose ops use the forward ConvTranspose rule T = max(0, EK - S),
 * which gives the forward op's pads for every output_padding. */
static void auto_pads(ctx *c, const int64_t *in) {
  cg_geom *g = c->g;
  cg_auto_pad ap = c->p->attrs.auto_pad;
  if (ap == CG_AUTO_PAD_NONE)
    return;
  for (int d = 0; d < c->nsp; d++) {
    int64_t t = 0, s = g->stride[d];
    if (ap != CG_AUTO_PAD_VALID) {
      if (c->deconv)
        t = c->ek[d] - s;
      else
        t = ((in[d] + s - 1) / s - 1) * s + c->ek[d] - in[d];
      if (t < 0)
        t = 0;
    }
    /* SAME_UPPER puts the odd unit at the end, SAME_LOWER at the start. */
    g->pad_begin[d] = ap == CG_AUTO_PAD_SAME_LOWER ? (t + 1) / 2 : t / 2;
    g->pad_end[d] = t - g->pad_begin[d];
  }
}

/* oneDNN 2.6 checks a descriptor in int (src/common/convolution.cpp and
 * deconvolution.cpp): the effective kernel 1 + (K-1)*D, the padded size of
 * the larger side, big - EK + PB + PE, and PE + S must all fit, or it
 * refuses the descriptor (or worse, checks a wrapped value). big is the
 * Convolution input or the ConvTranspose output, named big_name. */
static int check_int_range(ctx *c, const char *big_name, const int64_t *big) {
  cg_geom *g = c->g;
  for (int d = 0; d < c->nsp; d++) {
    int64_t padded;
    if (c->ek[d] > CG_MAX_DIM)
      return cg_errorf(c->err, c->errlen, CG_ERANGE,
                       "dilations[%d]: effective kernel (%" LLD "-1)*%" LLD
                       "+1 = %" LLD " exceeds oneDNN's int limit %" LLD,
                       d, g->kernel[d], g->dilation[d], c->ek[d], CG_MAX_DIM);
    if (g->pad_end[d] + g->stride[d] > CG_MAX_DIM)
      return cg_errorf(c->err, c->errlen, CG_ERANGE,
                       "strides[%d]: %" LLD " + pads_end[%d] %" LLD
                       " exceeds oneDNN's int limit %" LLD,
                       d, g->stride[d], d, g->pad_end[d], CG_MAX_DIM);
    padded = big[d] + g->pad_begin[d] + g->pad_end[d];
    if (padded > CG_MAX_DIM)
      return cg_errorf(c->err, c->errlen, CG_ERANGE,
                       "pads_begin[%d], pads_end[%d]: %s size %" LLD
                       " padded by %" LLD "+%" LLD " is %" LLD
                       ", above oneDNN's int limit %" LLD,
                       d, d, big_name, big[d], g->pad_begin[d], g->pad_end[d],
                       padded, CG_MAX_DIM);
  }
  return 0;
}

/* Convolution: out = floor((in + PB + PE - EK) / S) + 1 on every axis. */
static int check_conv_relation(ctx *c, const char *in_name,
                               const char *w_name) {
  cg_geom *g = c->g;
  cg_data_format f = g->data_format;
  int rc;
  if ((rc = check_int_range(c, in_name, g->in_sp)))
    return rc;
  for (int d = 0; d < c->nsp; d++) {
    int64_t padded = g->in_sp[d] + g->pad_begin[d] + g->pad_end[d];
    if (padded < c->ek[d])
      return cg_errorf(c->err, c->errlen, CG_EINVAL,
                       "%s: effective kernel %" LLD " on spatial dim %d is "
                       "larger than the padded %s size %" LLD,
                       w_name, c->ek[d], d, in_name, padded);
    int64_t want = (padded - c->ek[d]) / g->stride[d] + 1;
    if (g->out_sp[d] != want)
      return cg_errorf(
          c->err, c->errlen, CG_EINVAL,
          "diff_dst[%d]: must be %" LLD " for %s size %" LLD " (stride %" LLD
          ", effective kernel %" LLD ", pads %" LLD "+%" LLD "), got %" LLD,
          data_sp_index(f, d), want, in_name, g->in_sp[d], g->stride[d],
          c->ek[d], g->pad_begin[d], g->pad_end[d], g->out_sp[d]);
  }
  return 0;
}

/* ConvTranspose: out = S*(in-1) + EK - PB - PE + output_padding with
 * 0 <= output_padding < max(S, D); a given output_padding must equal the
 * one the shapes imply. */
static int check_deconv_relation(ctx *c, const char *in_name) {
  cg_geom *g = c->g;
  cg_data_format f = g->data_format;
  int rc;
  if ((rc = check_int_range(c, "diff_dst", g->out_sp)))
    return rc;
  for (int d = 0; d < c->nsp; d++) {
    int64_t s = g->stride[d];
    int64_t lim = s > g->dilation[d] ? s : g->dilation[d];
    int64_t base =
        s * (g->in_sp[d] - 1) + c->ek[d] - g->pad_begin[d] - g->pad_end[d];
    int64_t implied = g->out_sp[d] - base;
    if (implied < 0 || implied >= lim)
      return cg_errorf(c->err, c->errlen, CG_EINVAL,
                       "diff_dst[%d]: must be %" LLD
                       " + output_padding in [0, %" LLD ") for %s size %" LLD
                       " (stride %" LLD ", effective kernel %" LLD
                       ", pads %" LLD "+%" LLD "), got %" LLD,
                       data_sp_index(f, d), base, lim, in_name, g->in_sp[d], s,
                       c->ek[d], g->pad_begin[d], g->pad_end[d], g->out_sp[d]);
    if (c->has_op && c->op[d] != implied)
      return cg_errorf(c->err, c->errlen, CG_EINVAL,
                       "output_padding[%d]: the shapes imply %" LLD
                       ", got %" LLD,
                       d, implied, c->op[d]);
    g->output_padding[d] = implied;
  }
  return 0;
}

/* 0 <= output_padding < max(S, D) for the ConvTranspose ops. */
static int check_op_range(ctx *c) {
  cg_geom *g = c->g;
  for (int d = 0; c->has_op && d < c->nsp; d++) {
    int64_t s = g->stride[d];
    int64_t lim = s > g->dilation[d] ? s : g->dilation[d];
    if (c->op[d] >= lim)
      return cg_errorf(c->err, c->errlen, CG_EINVAL,
                       "output_padding[%d]: must be < max(stride, dilation) = "
                       "%" LLD ", got %" LLD,
                       d, lim, c->op[d]);
  }
  return 0;
}

static int check_divisible(ctx *c, const char *what, const char *tensor,
                           int64_t ch) {
  if (ch % c->g->groups != 0)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "groups: %s channels (%s=%" LLD
                     ") are not divisible by groups=%" LLD,
                     tensor, what, ch, c->g->groups);
  return 0;
}

/* The O / I dim of a weights tensor (name) against the data: Convolution
 * weights hold OC and IC/g, ConvTranspose weights OC/g and IC. */
static int check_weights_o(ctx *c, const char *name, int64_t wo) {
  cg_geom *g = c->g;
  if (!c->deconv && wo != g->oc)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "%s: expected %" LLD " output channels (OC of diff_dst), "
                     "got %" LLD,
                     name, g->oc, wo);
  if (c->deconv && wo != g->oc / g->groups)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "%s: expected %" LLD " output channels per group (OC=%" LLD
                     ", groups=%" LLD "), got %" LLD,
                     name, g->oc / g->groups, g->oc, g->groups, wo);
  return 0;
}

static int check_weights_i(ctx *c, const char *name, int64_t wi) {
  cg_geom *g = c->g;
  if (!c->deconv && wi != g->ic / g->groups)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "%s: expected %" LLD " input channels per group (IC=%" LLD
                     ", groups=%" LLD "), got %" LLD,
                     name, g->ic / g->groups, g->ic, g->groups, wi);
  if (c->deconv && wi != g->ic)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "%s: expected %" LLD
                     " input channels (IC of src), got %" LLD,
                     name, g->ic, wi);
  return 0;
}

/* ---- the four ops ----------------------------------------------------- */

static int resolve_conv_bwd_data(ctx *c) {
  cg_geom *g = c->g;
  const cg_problem *p = c->p;
  int64_t n, wo, wi;
  int rc;
  data_split(g->data_format, c->nsp, p->input_dims[0].v, &n, &g->oc, g->out_sp);
  read_weights(c, p->input_dims[1].v, &wo, &wi);
  g->mb = n;
  if ((rc = check_weights_o(c, "weights", wo)) ||
      (rc = check_divisible(c, "OC", "diff_dst", g->oc)))
    return rc;
  g->ic = g->groups * wi;
  if (c->shape.len > 0) {
    int64_t sn, sc;
    data_split(g->data_format, c->nsp, c->shape.v, &sn, &sc, g->in_sp);
    if (sn != n)
      return cg_errorf(c->err, c->errlen, CG_EINVAL,
                       "%s[0]: batch %" LLD " does not match diff_dst batch "
                       "%" LLD,
                       c->shape_name, sn, n);
    g->ic = sc;
    if ((rc = check_divisible(c, "IC", c->shape_name, sc)) ||
        (rc = check_weights_i(c, "weights", wi)))
      return rc;
    auto_pads(c, g->in_sp);
  } else {
    cg_auto_pad ap = p->attrs.auto_pad;
    if (ap == CG_AUTO_PAD_SAME_UPPER || ap == CG_AUTO_PAD_SAME_LOWER)
      return cg_errorf(c->err, c->errlen, CG_EINVAL,
                       "dst_shape: required with auto_pad=%s (the diff_src "
                       "size cannot be inferred)",
                       cg_auto_pad_name(ap));
    if (g->ic > CG_MAX_DIM)
      return cg_errorf(c->err, c->errlen, CG_ERANGE,
                       "weights: IC = groups x %" LLD " = %" LLD
                       " exceeds the largest dim %" LLD,
                       wi, g->ic, CG_MAX_DIM);
    auto_pads(c, NULL);
    /* Older spec and PyTorch: diff_src = S*(Xo-1) + EK - PB - PE + op. */
    for (int d = 0; d < c->nsp; d++) {
      if (c->op[d] >= g->stride[d])
        return cg_errorf(c->err, c->errlen, CG_EINVAL,
                         "output_padding[%d]: must be < strides[%d] (%" LLD
                         ") to infer dst_shape, got %" LLD,
                         d, d, g->stride[d], c->op[d]);
      int64_t xi = g->stride[d] * (g->out_sp[d] - 1) + c->ek[d] -
                   g->pad_begin[d] - g->pad_end[d] + c->op[d];
      if (xi <= 0)
        return cg_errorf(c->err, c->errlen, CG_EINVAL,
                         "dst_shape: cannot infer spatial dim %d: the pads "
                         "(%" LLD "+%" LLD ") leave %" LLD,
                         d, g->pad_begin[d], g->pad_end[d], xi);
      if (xi > CG_MAX_DIM)
        return cg_errorf(c->err, c->errlen, CG_ERANGE,
                         "dst_shape: inferred spatial dim %d is %" LLD
                         ", above the largest dim %" LLD,
                         d, xi, CG_MAX_DIM);
      g->in_sp[d] = xi;
    }
  }
  return check_conv_relation(c, c->shape.len > 0 ? c->shape_name : "diff_src",
                             "weights");
}

/* src and diff_dst of both BackwardWeights ops. */
static int read_src_diff_dst(ctx *c) {
  cg_geom *g = c->g;
  const cg_problem *p = c->p;
  int64_t n2;
  data_split(g->data_format, c->nsp, p->input_dims[0].v, &g->mb, &g->ic,
             g->in_sp);
  data_split(g->data_format, c->nsp, p->input_dims[1].v, &n2, &g->oc,
             g->out_sp);
  if (n2 != g->mb)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "diff_dst[0]: batch %" LLD " does not match src batch "
                     "%" LLD,
                     n2, g->mb);
  if (c->shape.len == 0)
    return cg_errorf(c->err, c->errlen, CG_EINVAL,
                     "weights_shape: required for %s (as the shape input or "
                     "the attribute)",
                     c->opn);
  int rc;
  if ((rc = check_divisible(c, "IC", "src", g->ic)) ||
      (rc = check_divisible(c, "OC", "diff_dst", g->oc)))
    return rc;
  return 0;
}

static int resolve_conv_bwd_weights(ctx *c) {
  cg_geom *g = c->g;
  int64_t wo, wi;
  int rc;
  if ((rc = read_src_diff_dst(c)))
    return rc;
  read_weights(c, c->shape.v, &wo, &wi);
  if ((rc = check_weights_i(c, c->shape_name, wi)) ||
      (rc = check_weights_o(c, c->shape_name, wo)))
    return rc;
  auto_pads(c, g->in_sp);
  return check_conv_relation(c, "src", c->shape_name);
}

static int resolve_deconv_bwd_data(ctx *c) {
  cg_geom *g = c->g;
  const cg_problem *p = c->p;
  int64_t wo, wi;
  int rc;
  data_split(g->data_format, c->nsp, p->input_dims[0].v, &g->mb, &g->oc,
             g->out_sp);
  read_weights(c, p->input_dims[1].v, &wo, &wi);
  if ((rc = check_divisible(c, "OC", "diff_dst", g->oc)) ||
      (rc = check_weights_o(c, "weights", wo)))
    return rc;
  g->ic = wi;
  if ((rc = check_divisible(c, "IC", "weights", g->ic)) ||
      (rc = check_op_range(c)))
    return rc;
  auto_pads(c, NULL);
  for (int d = 0; d < c->nsp; d++) {
    int64_t s = g->stride[d];
    int64_t num =
        g->out_sp[d] + g->pad_begin[d] + g->pad_end[d] - c->ek[d] - c->op[d];
    if (num < 0)
      return cg_errorf(c->err, c->errlen, CG_EINVAL,
                       "diff_dst[%d]: size %" LLD " is smaller than the "
                       "effective kernel %" LLD " - pads (%" LLD "+%" LLD
                       ") + output_padding %" LLD,
                       data_sp_index(g->data_format, d), g->out_sp[d], c->ek[d],
                       g->pad_begin[d], g->pad_end[d], c->op[d]);
    /* Given output_padding must make the division exact; without it the
     * floor picks the one diff_src size whose implied padding is < S. */
    if (c->has_op && num % s != 0)
      return cg_errorf(c->err, c->errlen, CG_EINVAL,
                       "output_padding[%d]: %" LLD " leaves diff_dst size %" LLD
                       " unreachable with stride %" LLD,
                       d, c->op[d], g->out_sp[d], s);
    g->in_sp[d] = num / s + 1;
  }
  return check_deconv_relation(c, "diff_src");
}

static int resolve_deconv_bwd_weights(ctx *c) {
  int64_t wo, wi;
  int rc;
  if ((rc = read_src_diff_dst(c)))
    return rc;
  read_weights(c, c->shape.v, &wo, &wi);
  if ((rc = check_weights_i(c, c->shape_name, wi)) ||
      (rc = check_weights_o(c, c->shape_name, wo)) || (rc = check_op_range(c)))
    return rc;
  auto_pads(c, NULL);
  return check_deconv_relation(c, "src");
}

/* ---- sizes ------------------------------------------------------------ */

static int count(ctx *c, const char *name, const int64_t *dims, size_t *elems,
                 size_t *bytes) {
  size_t e = 1;
  for (int d = 0; d < c->rank; d++) {
    if (__builtin_mul_overflow(e, (size_t)dims[d], &e))
      return cg_errorf(c->err, c->errlen, CG_ERANGE,
                       "%s: element count overflows (dims up to [%d] = %" LLD
                       ")",
                       name, d, dims[d]);
  }
  if (__builtin_mul_overflow(e, cg_dtype_size(c->g->dtype), bytes))
    return cg_errorf(c->err, c->errlen, CG_ERANGE,
                     "%s: byte size of %zu %s elements overflows", name, e,
                     cg_dtype_name(c->g->dtype));
  *elems = e;
  return 0;
}

static int fill_sizes(ctx *c) {
  cg_geom *g = c->g;
  const cg_problem *p = c->p;
  int rc;
  g->in_rank = c->rank;
  for (int t = 0; t < 2; t++) {
    memcpy(g->in_dims[t], p->input_dims[t].v, sizeof(int64_t) * c->rank);
    if ((rc = count(c, cg_op_input_name(p->op, t), g->in_dims[t],
                    &g->in_elems[t], &g->in_bytes[t])))
      return rc;
  }
  if (cg_op_outputs_weights(p->op))
    weights_dims(g, g->out_weights_format, g->out_dims);
  else
    cg__data_dims(g->out_data_format, c->nsp, g->mb, g->ic, g->in_sp,
                  g->out_dims);
  if ((rc = count(c, cg_op_output_name(p->op), g->out_dims, &g->out_elems,
                  &g->out_bytes)))
    return rc;
  /* Multiply-adds of the forward op: every output point of a Convolution
   * reads ICg*K inputs; every input point of a ConvTranspose feeds OCg*K
   * outputs. The gradients do the same work. */
  double k = 1, osp = 1, isp = 1;
  for (int d = 0; d < c->nsp; d++) {
    k *= (double)g->kernel[d];
    osp *= (double)g->out_sp[d];
    isp *= (double)g->in_sp[d];
  }
  int64_t ic_per_group = g->ic / g->groups, oc_per_group = g->oc / g->groups;
  if (c->deconv)
    g->flops =
        2.0 * (double)g->mb * (double)g->ic * isp * (double)oc_per_group * k;
  else
    g->flops =
        2.0 * (double)g->mb * (double)g->oc * osp * (double)ic_per_group * k;
  return 0;
}

static uint64_t mul_sat(uint64_t a, int64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, (uint64_t)b, &r) ? UINT64_MAX : r;
}

uint64_t cg_geom_flops(const cg_geom *g) {
  /* Every dst point of the direct convolution reads ICg * K inputs for
   * each of its OC channels; a ConvTranspose's input is that dst. */
  const int64_t *dst_sp = is_deconv(g->op) ? g->in_sp : g->out_sp;
  uint64_t f = mul_sat(2, g->mb);
  f = mul_sat(f, g->oc);
  f = mul_sat(f, g->ic / g->groups);
  for (int d = 0; d < g->nsp; d++)
    f = mul_sat(mul_sat(f, g->kernel[d]), dst_sp[d]);
  return f;
}

uint64_t cg_geom_work(const cg_geom *g) {
  /* Every element of the tensors, and of the padded larger side that the
   * kernels sweep (stride phases and pads included: on every axis it is
   * at least S * (small - 1) + EK), counts as one multiply-add. */
  const int64_t *big_sp = is_deconv(g->op) ? g->out_sp : g->in_sp;
  uint64_t padded = mul_sat(2, g->mb);
  padded = mul_sat(padded, is_deconv(g->op) ? g->oc : g->ic);
  for (int d = 0; d < g->nsp; d++)
    padded = mul_sat(padded, big_sp[d] + g->pad_begin[d] + g->pad_end[d]);
  uint64_t elems = mul_sat(2, (int64_t)(g->in_elems[0] + g->in_elems[1]));
  uint64_t w = cg_geom_flops(g), add = mul_sat(2, (int64_t)g->out_elems);
  if (__builtin_add_overflow(w, padded, &w) ||
      __builtin_add_overflow(w, elems, &w) ||
      __builtin_add_overflow(w, add, &w))
    return UINT64_MAX;
  return w;
}

int cg_geom_slice_mb(const cg_geom *g, int64_t n, cg_geom *slice) {
  if (n <= 0 || n > g->mb)
    return CG_EINVAL;
  /* Backward-data ops take weights second and give a data tensor. */
  int data_out = !cg_op_outputs_weights(g->op);
  *slice = *g;
  slice->mb = n;
  for (int t = 0; t < (data_out ? 1 : 2); t++) {
    slice->in_dims[t][0] = n;
    slice->in_elems[t] = g->in_elems[t] / (size_t)g->mb * (size_t)n;
    slice->in_bytes[t] = g->in_bytes[t] / (size_t)g->mb * (size_t)n;
  }
  if (data_out) {
    slice->out_dims[0] = n;
    slice->out_elems = g->out_elems / (size_t)g->mb * (size_t)n;
    slice->out_bytes = g->out_bytes / (size_t)g->mb * (size_t)n;
  }
  slice->flops = g->flops / (double)g->mb * (double)n;
  return 0;
}

int cg__problem_resolve_in(const cg_problem *p, cg_op layer_op, cg_geom *geom,
                           char *err, size_t errlen) {
  cg_geom g;
  ctx c;
  int rc;
  memset(&g, 0, sizeof(g));
  memset(&c, 0, sizeof(c));
  c.layer_op = layer_op;
  c.opn = cg_op_name(layer_op ? layer_op : p->op);
  c.p = p;
  c.g = &g;
  c.err = err;
  c.errlen = errlen;
  c.deconv = is_deconv(p->op);
  if (err != NULL && errlen > 0)
    err[0] = '\0';

  if ((rc = check_enums(&c)))
    goto out;
  c.rank = (int)p->input_dims[0].len;
  if (c.rank < 3 || c.rank > CG_MAX_RANK) {
    rc =
        cg_errorf(err, errlen, CG_EINVAL, "%s: rank must be 3, 4 or 5, got %zu",
                  cg_op_input_name(p->op, 0), p->input_dims[0].len);
    goto out;
  }
  c.nsp = c.rank - 2;
  g.nsp = c.nsp;
  if ((rc = check_dims(&c, cg_op_input_name(p->op, 0), p->input_dims[0])) ||
      (rc = check_dims(&c, cg_op_input_name(p->op, 1), p->input_dims[1])) ||
      (rc = check_attr_lists(&c)) || (rc = pick_shape(&c)))
    goto out;

  switch (p->op) {
  case CG_OP_CONV_BWD_DATA:
    rc = resolve_conv_bwd_data(&c);
    break;
  case CG_OP_CONV_BWD_WEIGHTS:
    rc = resolve_conv_bwd_weights(&c);
    break;
  case CG_OP_DECONV_BWD_DATA:
    rc = resolve_deconv_bwd_data(&c);
    break;
  default:
    rc = resolve_deconv_bwd_weights(&c);
    break;
  }
  if (rc || (rc = fill_sizes(&c)))
    goto out;
  *geom = g;
out:
  return rc;
}

int cg_problem_resolve(const cg_problem *p, cg_geom *geom, char *err,
                       size_t errlen) {
  return cg__problem_resolve_in(p, CG_OP_INVALID, geom, err, errlen);
}
