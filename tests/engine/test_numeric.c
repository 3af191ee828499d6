/* test_numeric.c - the oneDNN-derived numeric cases
 * (tests/data/onednn-numeric-cases.json) against the reference and the
 * engine, in f32, bf16 and f16 (every value in the file is exact in all
 * three types).
 *
 * Forward cases run on both sides of the identity SEMANTICS.md states:
 * Convolution(x, W) == ConvTransposeBackwardData(diff_dst = x, W) and
 * ConvTranspose(x, W) == ConvolutionBackwardData(diff_dst = x, W), with the
 * same weights array read in the other family's spelling (OIX <-> IOX,
 * XIO <-> XOI). The reference also computes them with
 * cg_reference_forward. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>
#include <cmocka.h>

#include "cg/dtype.h"
#include "cg/engine.h"
#include "cg/reference.h"
#include "et.h"

typedef struct tensor {
  int64_t shape[CG_MAX_RANK];
  int rank;
  float *data;
  size_t n;
} tensor;

typedef struct ncase {
  char name[160];
  char op[64];
  int relu;
  int64_t strides[3], pb[3], pe[3], dil[3], groups;
  size_t nstrides, npb, npe, ndil;
  cg_data_format df;
  cg_weights_format wf;
  int64_t dst_shape[CG_MAX_RANK];
  size_t ndst_shape;
  tensor in[2]; /* in op input order (forward: src, weights) */
  tensor expected;
} ncase;

static cJSON *cases_json;
static cg_engine *engine;

static size_t read_ints(const cJSON *arr, int64_t *out, size_t max) {
  size_t n = 0;
  const cJSON *it;
  if (!cJSON_IsArray(arr))
    return 0;
  cJSON_ArrayForEach(it, arr) {
    assert_true(n < max);
    out[n++] = (int64_t)it->valuedouble;
  }
  return n;
}

static void read_tensor(const cJSON *t, tensor *out) {
  int64_t n = 1;
  const cJSON *it;
  assert_non_null(t);
  out->rank =
      (int)read_ints(cJSON_GetObjectItem(t, "shape"), out->shape, CG_MAX_RANK);
  for (int i = 0; i < out->rank; i++)
    n *= out->shape[i];
  out->n = (size_t)n;
  out->data = et_alloc(out->n * sizeof(float));
  size_t i = 0;
  cJSON_ArrayForEach(it, cJSON_GetObjectItem(t, "data")) {
    assert_true(i < out->n);
    out->data[i++] = (float)it->valuedouble;
  }
  assert_int_equal(i, out->n);
}

/* The file writes every shape channel-first (N, C, X...) and weights in
 * the channel-first spelling of their format ((A, B, X...) for XBA); its
 * one NXC/XOI case has C = 1 so the element order is unchanged. Convert
 * the shapes to the order the format names. */
static void to_data_order(int64_t *s, int rank, cg_data_format f) {
  if (f != CG_DATA_NXC)
    return;
  int64_t c = s[1];
  memmove(&s[1], &s[2], (size_t)(rank - 2) * sizeof *s);
  s[rank - 1] = c;
}

static void to_weights_order(int64_t *s, int rank, cg_weights_format f) {
  if (f != CG_WEIGHTS_XIO && f != CG_WEIGHTS_XOI)
    return;
  int64_t a = s[0], b = s[1];
  memmove(&s[0], &s[2], (size_t)(rank - 2) * sizeof *s);
  s[rank - 2] = b;
  s[rank - 1] = a;
}

static void parse_case(const cJSON *j, ncase *c) {
  const cJSON *attrs = cJSON_GetObjectItem(j, "attrs");
  const cJSON *ins = cJSON_GetObjectItem(j, "inputs");
  memset(c, 0, sizeof *c);
  snprintf(c->name, sizeof c->name, "%s",
           cJSON_GetStringValue(cJSON_GetObjectItem(j, "name")));
  snprintf(c->op, sizeof c->op, "%s",
           cJSON_GetStringValue(cJSON_GetObjectItem(j, "op")));
  c->relu = cJSON_IsTrue(cJSON_GetObjectItem(j, "post_relu"));
  c->nstrides = read_ints(cJSON_GetObjectItem(attrs, "strides"), c->strides, 3);
  c->npb = read_ints(cJSON_GetObjectItem(attrs, "pads_begin"), c->pb, 3);
  c->npe = read_ints(cJSON_GetObjectItem(attrs, "pads_end"), c->pe, 3);
  c->ndil = read_ints(cJSON_GetObjectItem(attrs, "dilations"), c->dil, 3);
  c->ndst_shape = read_ints(cJSON_GetObjectItem(attrs, "dst_shape"),
                            c->dst_shape, CG_MAX_RANK);
  c->groups = (int64_t)cJSON_GetObjectItem(attrs, "groups")->valuedouble;
  assert_int_equal(
      cg_data_format_parse(
          cJSON_GetStringValue(cJSON_GetObjectItem(attrs, "data_format")),
          &c->df),
      0);
  assert_int_equal(
      cg_weights_format_parse(
          cJSON_GetStringValue(cJSON_GetObjectItem(attrs, "weights_format")),
          &c->wf),
      0);
  /* Inputs come in op order: the gradient ops name theirs, the forward
   * ops take src and weights. */
  cg_op op;
  const char *names[2] = {"src", "weights"};
  if (cg_op_parse(c->op, &op) == 0) {
    names[0] = cg_op_input_name(op, 0);
    names[1] = cg_op_input_name(op, 1);
  }
  for (int i = 0; i < 2; i++)
    read_tensor(cJSON_GetObjectItem(ins, names[i]), &c->in[i]);
  read_tensor(cJSON_GetObjectItem(j, "expected"), &c->expected);
  int rank = c->in[0].rank;
  to_data_order(c->in[0].shape, rank, c->df);
  to_weights_order(c->in[1].shape, rank, c->wf);
  to_data_order(c->expected.shape, rank, c->df);
  if (c->ndst_shape)
    to_data_order(c->dst_shape, rank, c->df);
}

static void free_case(ncase *c) {
  for (int i = 0; i < 2; i++)
    free(c->in[i].data);
  free(c->expected.data);
}

/* The spelling of the same weights array in the other family (conv OIX
 * (OC, IC/g, K) is ConvTranspose IOX (IC', OC'/g, K), XIO is XOI), or
 * DEFAULT for the older ConvTranspose spellings, which have none. */
static cg_weights_format other_family(int conv, cg_weights_format f) {
  if (conv)
    return f == CG_WEIGHTS_OIX ? CG_WEIGHTS_IOX : CG_WEIGHTS_XOI;
  if (f == CG_WEIGHTS_IOX)
    return CG_WEIGHTS_OIX;
  return f == CG_WEIGHTS_XOI ? CG_WEIGHTS_XIO : CG_WEIGHTS_DEFAULT;
}

/* A problem of op on c's attributes with the given input shapes. */
static void build(cg_problem *p, const ncase *c, cg_op op, cg_dtype dt,
                  const int64_t *d0, const int64_t *d1, cg_weights_format wf,
                  const int64_t *dst_shape) {
  int rank = c->in[0].rank;
  cg_problem_init(p);
  p->op = op;
  p->dtype = dt;
  p->attrs.strides = (cg_ints){c->strides, c->nstrides};
  p->attrs.pads_begin = (cg_ints){c->pb, c->npb};
  p->attrs.pads_end = (cg_ints){c->pe, c->npe};
  p->attrs.dilations = (cg_ints){c->dil, c->ndil};
  p->attrs.groups = c->groups;
  p->attrs.data_format = c->df;
  p->attrs.weights_format = wf;
  p->input_dims[0] = (cg_ints){d0, (size_t)rank};
  p->input_dims[1] = (cg_ints){d1, (size_t)rank};
  if (dst_shape)
    p->attrs.dst_shape = (cg_ints){dst_shape, (size_t)rank};
}

static cg_geom resolve(const cg_problem *p, const ncase *c) {
  cg_geom g;
  char err[256];
  int rc = cg_problem_resolve(p, &g, err, sizeof err);
  if (rc)
    fail_msg("%s: resolve failed: %s", c->name, err);
  return g;
}

static void *to_dtype(cg_dtype dt, const tensor *t) {
  void *p = et_alloc(t->n * cg_dtype_size(dt));
  cg_convert(dt, p, CG_DTYPE_F32, t->data, t->n);
  return p;
}

/* Checks got (n elements of dt) against the case's expectation. */
static void expect(const ncase *c, cg_dtype dt, const void *got, size_t n,
                   const char *who) {
  assert_int_equal(n, c->expected.n);
  for (size_t i = 0; i < n; i++) {
    double v = cg_load_f32(dt, got, i);
    if (c->relu && v < 0)
      v = 0;
    double want = c->expected.data[i];
    if (fabs(v - want) > 1e-5 * fmax(1.0, fabs(want)))
      fail_msg("%s [%s, %s]: element %zu is %g, expected %g", c->name, who,
               cg_dtype_name(dt), i, v, want);
  }
}

/* Runs geom on the reference and the engine and checks both. */
static void run_both(const ncase *c, const cg_geom *g, const void *in0,
                     const void *in1) {
  char err[256];
  cg_run_info info;
  void *ref = et_alloc(g->out_bytes), *got = et_alloc(g->out_bytes);
  for (int i = 0; i < g->in_rank; i++)
    assert_int_equal(g->out_dims[i], c->expected.shape[i]);
  assert_int_equal(cg_reference_run(g, in0, in1, ref, err, sizeof err), 0);
  expect(c, g->dtype, ref, g->out_elems, "reference");
  if (cg_engine_run(engine, g, in0, in1, got, &info, err, sizeof err))
    fail_msg("%s: engine failed: %s", c->name, err);
  expect(c, g->dtype, got, g->out_elems, "engine");
  free(ref);
  free(got);
}

static void run_case(const ncase *c, cg_dtype dt) {
  char err[256];
  cg_problem p;
  cg_geom g;
  void *in0 = to_dtype(dt, &c->in[0]), *in1 = to_dtype(dt, &c->in[1]);
  cg_op op;

  if (strcmp(c->op, "Convolution") == 0 ||
      strcmp(c->op, "ConvTranspose") == 0) {
    int conv = strcmp(c->op, "Convolution") == 0;
    cg_weights_format other = other_family(conv, c->wf);
    /* The gradient op that computes this forward op. */
    if (other != CG_WEIGHTS_DEFAULT) {
      build(&p, c, conv ? CG_OP_DECONV_BWD_DATA : CG_OP_CONV_BWD_DATA, dt,
            c->in[0].shape, c->in[1].shape, other,
            conv ? NULL : c->expected.shape);
      g = resolve(&p, c);
      run_both(c, &g, in0, in1);
    }
    /* The reference's forward on a geometry of the op's own family. */
    build(&p, c, conv ? CG_OP_CONV_BWD_DATA : CG_OP_DECONV_BWD_DATA, dt,
          c->expected.shape, c->in[1].shape, c->wf,
          conv ? c->in[0].shape : NULL);
    g = resolve(&p, c);
    void *dst = et_alloc(c->expected.n * cg_dtype_size(dt));
    assert_int_equal(cg_reference_forward(&g, in0, in1, dst, err, sizeof err),
                     0);
    expect(c, dt, dst, c->expected.n, "reference forward");
    free(dst);
  } else {
    assert_int_equal(cg_op_parse(c->op, &op), 0);
    build(&p, c, op, dt, c->in[0].shape, c->in[1].shape, c->wf,
          c->ndst_shape ? c->dst_shape : NULL);
    g = resolve(&p, c);
    run_both(c, &g, in0, in1);
  }
  free(in0);
  free(in1);
}

/* ---- the same case in every layout ------------------------------------ */

/* Offset of data element (n, c, s) (s: flattened spatial index). */
static size_t d_off(cg_data_format f, int64_t nc, int64_t ns, int64_t n,
                    int64_t c, int64_t sp) {
  return (size_t)(f == CG_DATA_NCX ? (n * nc + c) * ns + sp
                                   : (n * ns + sp) * nc + c);
}

/* Offset of weights element (o, i, k) given the extents no, ni of the
 * format's O and I dims and the kernel volume nk. */
static size_t w_off(cg_weights_format f, int64_t no, int64_t ni, int64_t nk,
                    int64_t o, int64_t i, int64_t k) {
  switch (f) {
  case CG_WEIGHTS_OIX:
    return (size_t)((o * ni + i) * nk + k);
  case CG_WEIGHTS_IOX:
    return (size_t)((i * no + o) * nk + k);
  case CG_WEIGHTS_XIO:
    return (size_t)((k * ni + i) * no + o);
  default: /* XOI */
    return (size_t)((k * no + o) * ni + i);
  }
}

/* Re-lays a data tensor (and its shape) from format `from` to `to`. */
static void relayout_data(const tensor *t, cg_data_format from,
                          cg_data_format to, tensor *out) {
  int r = t->rank, nsp = r - 2;
  int64_t n = t->shape[0],
          c = from == CG_DATA_NCX ? t->shape[1] : t->shape[r - 1];
  const int64_t *sp = from == CG_DATA_NCX ? &t->shape[2] : &t->shape[1];
  int64_t ns = 1, shape[CG_MAX_RANK];
  for (int a = 0; a < nsp; a++)
    ns *= sp[a];
  et_data_dims(nsp, to, n, c, sp, shape);
  *out = *t;
  memcpy(out->shape, shape, sizeof shape);
  out->data = et_alloc(t->n * sizeof(float));
  for (int64_t in = 0; in < n; in++)
    for (int64_t ic = 0; ic < c; ic++)
      for (int64_t is = 0; is < ns; is++)
        out->data[d_off(to, c, ns, in, ic, is)] =
            t->data[d_off(from, c, ns, in, ic, is)];
}

static void relayout_weights(const tensor *t, cg_weights_format from,
                             cg_weights_format to, tensor *out) {
  int r = t->rank, nsp = r - 2;
  int xfirst = from == CG_WEIGHTS_XIO || from == CG_WEIGHTS_XOI;
  const int64_t *k = xfirst ? &t->shape[0] : &t->shape[2];
  int64_t a = t->shape[xfirst ? nsp : 0], b = t->shape[xfirst ? nsp + 1 : 1];
  /* (a, b) are the channel dims in the order `from` names them. */
  int o_first = from == CG_WEIGHTS_OIX || from == CG_WEIGHTS_XOI;
  int64_t no = o_first ? a : b, ni = o_first ? b : a, nk = 1;
  for (int d = 0; d < nsp; d++)
    nk *= k[d];
  *out = *t;
  int64_t c0 = (to == CG_WEIGHTS_OIX || to == CG_WEIGHTS_XOI) ? no : ni;
  int64_t c1 = (to == CG_WEIGHTS_OIX || to == CG_WEIGHTS_XOI) ? ni : no;
  if (to == CG_WEIGHTS_XIO || to == CG_WEIGHTS_XOI) {
    for (int d = 0; d < nsp; d++)
      out->shape[d] = k[d];
    out->shape[nsp] = c0;
    out->shape[nsp + 1] = c1;
  } else {
    int64_t kk[CG_MAX_SPATIAL];
    memcpy(kk, k, (size_t)nsp * sizeof *kk);
    out->shape[0] = c0;
    out->shape[1] = c1;
    for (int d = 0; d < nsp; d++)
      out->shape[2 + d] = kk[d];
  }
  out->data = et_alloc(t->n * sizeof(float));
  for (int64_t o = 0; o < no; o++)
    for (int64_t i = 0; i < ni; i++)
      for (int64_t kx = 0; kx < nk; kx++)
        out->data[w_off(to, no, ni, nk, o, i, kx)] =
            t->data[w_off(from, no, ni, nk, o, i, kx)];
}

/* c re-laid out in data format df and weights format wf. */
static void make_variant(const ncase *c, cg_data_format df,
                         cg_weights_format wf, ncase *v) {
  *v = *c;
  relayout_data(&c->in[0], c->df, df, &v->in[0]);
  relayout_weights(&c->in[1], c->wf, wf, &v->in[1]);
  relayout_data(&c->expected, c->df, df, &v->expected);
  if (c->ndst_shape) {
    tensor t = {.rank = (int)c->ndst_shape};
    memcpy(t.shape, c->dst_shape, sizeof t.shape);
    int r = t.rank;
    int64_t ch = c->df == CG_DATA_NCX ? t.shape[1] : t.shape[r - 1];
    const int64_t *sp = c->df == CG_DATA_NCX ? &t.shape[2] : &t.shape[1];
    int64_t spc[CG_MAX_SPATIAL];
    memcpy(spc, sp, (size_t)(r - 2) * sizeof *spc);
    et_data_dims(r - 2, df, t.shape[0], ch, spc, v->dst_shape);
  }
  v->df = df;
  v->wf = wf;
}

static void test_cases(void **state) {
  static const cg_weights_format conv_f[] = {CG_WEIGHTS_OIX, CG_WEIGHTS_XIO};
  static const cg_weights_format ct_f[] = {CG_WEIGHTS_IOX, CG_WEIGHTS_XOI,
                                           CG_WEIGHTS_OIX, CG_WEIGHTS_XIO};
  static const cg_data_format data_f[] = {CG_DATA_NCX, CG_DATA_NXC};
  cg_dtype dt = *(cg_dtype *)*state;
  const cJSON *j;
  int n = 0, variants = 0;
  cJSON_ArrayForEach(j, cases_json) {
    ncase c;
    parse_case(j, &c);
    int conv = strncmp(c.op, "Convolution", 11) == 0;
    const cg_weights_format *wfs = conv ? conv_f : ct_f;
    int nwf = conv ? 2 : 4;
    for (int d = 0; d < 2; d++)
      for (int w = 0; w < nwf; w++) {
        ncase v;
        make_variant(&c, data_f[d], wfs[w], &v);
        snprintf(v.name, sizeof v.name, "%.100s [%s/%s]", c.name,
                 cg_data_format_name(v.df), cg_weights_format_name(v.wf));
        run_case(&v, dt);
        free_case(&v);
        variants++;
      }
    free_case(&c);
    n++;
  }
  assert_int_equal(n, 6);
  assert_int_equal(variants, 2 * (2 + 2 + 4 + 4 + 4 + 2));
}

static int setup(void **state) {
  (void)state;
  char path[1024], err[256];
  const char *dir = getenv("CG_TEST_DATA");
  snprintf(path, sizeof path, "%s/onednn-numeric-cases.json",
           dir ? dir : "tests/data");
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "cannot open %s\n", path);
    return -1;
  }
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  cases_json = cJSON_Parse(buf);
  if (!cases_json || !cJSON_IsArray(cases_json))
    return -1;
  cg_engine_config cfg = {0, 0};
  if (cg_engine_new(&engine, &cfg, err, sizeof err)) {
    fprintf(stderr, "engine: %s\n", err);
    return -1;
  }
  return 0;
}

static int teardown(void **state) {
  (void)state;
  cg_engine_free(engine);
  cJSON_Delete(cases_json);
  return 0;
}

int main(void) {
  static cg_dtype f32 = CG_DTYPE_F32, bf16 = CG_DTYPE_BF16, f16 = CG_DTYPE_F16;
  const struct CMUnitTest tests[] = {
      {"cases_f32", test_cases, NULL, NULL, &f32},
      {"cases_bf16", test_cases, NULL, NULL, &bf16},
      {"cases_f16", test_cases, NULL, NULL, &f16},
  };
  return cmocka_run_group_tests_name("engine_numeric", tests, setup, teardown);
}
