/* test_shape_sweep.c - a seeded sweep of random forward problems: the test
 * computes the forward shapes itself (SEMANTICS.md formulas, every layout
 * written out here independently of problem.c), states the gradient
 * problem, and checks that cg_problem_resolve gives back the same
 * geometry, and that an off-by-one diff_dst is rejected when no valid
 * problem has that size. */
#include "kt.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static int64_t rnd(int64_t lo, int64_t hi) { /* inclusive */
  rng ^= rng >> 12;
  rng ^= rng << 25;
  rng ^= rng >> 27;
  uint64_t r = (rng * 0x2545f4914f6cdd1dull) >> 33;
  return lo + (int64_t)(r % (uint64_t)(hi - lo + 1));
}

typedef struct {
  cg_op op;
  int nsp, deconv;
  int64_t mb, g, ic, oc;
  int64_t xi[3], xo[3], k[3], s[3], d[3], pb[3], pe[3], op_pad[3];
  cg_auto_pad ap;
  cg_data_format df, odf;
  cg_weights_format wf, owf;
} fwd;

static void data_dims(cg_data_format f, const fwd *p, int64_t c,
                      const int64_t *sp, int64_t *out) {
  out[0] = p->mb;
  if (f == CG_DATA_NCX) {
    out[1] = c;
    for (int i = 0; i < p->nsp; i++)
      out[2 + i] = sp[i];
  } else {
    for (int i = 0; i < p->nsp; i++)
      out[1 + i] = sp[i];
    out[1 + p->nsp] = c;
  }
}

/* The layout table of SEMANTICS.md, one row per (format, op family). */
static void weights_dims(cg_weights_format f, const fwd *p, int64_t *out) {
  int64_t o = p->deconv ? p->oc / p->g : p->oc;
  int64_t i = p->deconv ? p->ic : p->ic / p->g;
  int n = p->nsp;
  switch (f) {
  case CG_WEIGHTS_OIX:
    out[0] = o, out[1] = i;
    for (int a = 0; a < n; a++)
      out[2 + a] = p->k[a];
    break;
  case CG_WEIGHTS_IOX:
    out[0] = i, out[1] = o;
    for (int a = 0; a < n; a++)
      out[2 + a] = p->k[a];
    break;
  case CG_WEIGHTS_XIO:
    for (int a = 0; a < n; a++)
      out[a] = p->k[a];
    out[n] = i, out[n + 1] = o;
    break;
  default: /* XOI */
    for (int a = 0; a < n; a++)
      out[a] = p->k[a];
    out[n] = o, out[n + 1] = i;
    break;
  }
}

/* Draws a valid forward problem; returns 0 when the draw has no valid
 * output (kernel larger than the padded input) and must be redrawn. */
static int draw(fwd *p) {
  static const cg_weights_format conv_wf[] = {CG_WEIGHTS_OIX, CG_WEIGHTS_XIO};
  static const cg_weights_format deconv_wf[] = {CG_WEIGHTS_OIX, CG_WEIGHTS_XIO,
                                                CG_WEIGHTS_IOX, CG_WEIGHTS_XOI};
  memset(p, 0, sizeof(*p));
  p->op = (cg_op)rnd(1, 4);
  p->deconv =
      p->op == CG_OP_DECONV_BWD_DATA || p->op == CG_OP_DECONV_BWD_WEIGHTS;
  p->nsp = (int)rnd(1, 3);
  p->mb = rnd(1, 3);
  p->g = rnd(1, 4);
  p->ic = p->g * rnd(1, 3);
  p->oc = p->g * rnd(1, 3);
  p->ap = (cg_auto_pad)rnd(0, 3);
  p->df = (cg_data_format)rnd(1, 2);
  p->odf = (cg_data_format)rnd(1, 2);
  p->wf = p->deconv ? deconv_wf[rnd(0, 3)] : conv_wf[rnd(0, 1)];
  p->owf = p->deconv ? deconv_wf[rnd(0, 3)] : conv_wf[rnd(0, 1)];
  for (int a = 0; a < p->nsp; a++) {
    int64_t xi = rnd(1, 12), k = rnd(1, 4), s = rnd(1, 3), d = rnd(1, 3);
    int64_t ek = (k - 1) * d + 1, pb = 0, pe = 0, t = 0;
    switch (p->ap) {
    case CG_AUTO_PAD_NONE:
      pb = rnd(0, 3), pe = rnd(0, 3);
      break;
    case CG_AUTO_PAD_SAME_UPPER:
    case CG_AUTO_PAD_SAME_LOWER:
      t = p->deconv ? ek - s : ((xi + s - 1) / s - 1) * s + ek - xi;
      t = t < 0 ? 0 : t;
      pb = p->ap == CG_AUTO_PAD_SAME_UPPER ? t / 2 : t - t / 2;
      pe = t - pb;
      break;
    default:
      break;
    }
    int64_t xo;
    if (p->deconv) {
      int64_t lim = s > d ? s : d;
      p->op_pad[a] = rnd(0, lim - 1);
      xo = s * (xi - 1) + ek - pb - pe + p->op_pad[a];
      if (xo < 1)
        return 0;
    } else {
      if (xi + pb + pe < ek)
        return 0;
      xo = (xi + pb + pe - ek) / s + 1;
    }
    p->xi[a] = xi, p->xo[a] = xo, p->k[a] = k, p->s[a] = s, p->d[a] = d;
    p->pb[a] = pb, p->pe[a] = pe;
  }
  return 1;
}

static void random_forward_problems(void **state) {
  (void)state;
  int valid = 0, rejected = 0, per_op[5] = {0};
  for (int iter = 0; valid < 3000; iter++) {
    assert_true(iter < 100000);
    fwd f;
    if (!draw(&f))
      continue;
    int rank = f.nsp + 2;
    int64_t src[5], dst[5], w[5], want_out[5], strides[3], dil[3], pb[3], pe[3],
        opad[3];
    data_dims(f.df, &f, f.ic, f.xi, src);
    data_dims(f.df, &f, f.oc, f.xo, dst);
    weights_dims(f.wf, &f, w);
    for (int a = 0; a < f.nsp; a++) {
      strides[a] = f.s[a], dil[a] = f.d[a], pb[a] = f.pb[a], pe[a] = f.pe[a];
      opad[a] = f.op_pad[a];
    }
    cg_problem p;
    cg_problem_init(&p);
    p.op = f.op;
    p.dtype = (cg_dtype)rnd(1, 3);
    p.attrs.groups = f.g;
    p.attrs.auto_pad = f.ap;
    p.attrs.data_format = f.df;
    p.attrs.weights_format = f.wf;
    p.attrs.strides = (cg_ints){strides, (size_t)f.nsp};
    p.attrs.dilations = (cg_ints){dil, (size_t)f.nsp};
    if (f.ap == CG_AUTO_PAD_NONE) {
      p.attrs.pads_begin = (cg_ints){pb, (size_t)f.nsp};
      p.attrs.pads_end = (cg_ints){pe, (size_t)f.nsp};
    }
    int exact = 1; /* diff_dst fixed by the other shapes */
    if (cg_op_outputs_weights(f.op)) {
      p.input_dims[0] = (cg_ints){src, (size_t)rank};
      p.input_dims[1] = (cg_ints){dst, (size_t)rank};
      p.attrs.weights_shape = (cg_ints){w, (size_t)rank};
      p.out_weights_format = f.owf;
      weights_dims(f.owf, &f, want_out);
    } else {
      p.input_dims[0] = (cg_ints){dst, (size_t)rank};
      p.input_dims[1] = (cg_ints){w, (size_t)rank};
      p.out_data_format = f.odf;
      data_dims(f.odf, &f, f.ic, f.xi, want_out);
      if (f.op == CG_OP_CONV_BWD_DATA) {
        int same =
            f.ap == CG_AUTO_PAD_SAME_UPPER || f.ap == CG_AUTO_PAD_SAME_LOWER;
        if (same || rnd(0, 1)) {
          p.attrs.dst_shape = (cg_ints){src, (size_t)rank};
        } else {
          /* Inference needs the remainder the floor dropped. */
          for (int a = 0; a < f.nsp; a++)
            opad[a] =
                (f.xi[a] + f.pb[a] + f.pe[a] - ((f.k[a] - 1) * f.d[a] + 1)) %
                f.s[a];
          p.attrs.output_padding = (cg_ints){opad, (size_t)f.nsp};
          exact = 0;
        }
      }
    }
    int given_op = f.deconv && rnd(0, 1);
    if (f.deconv) {
      /* Floor inference recovers diff_src only when output_padding < S. */
      for (int a = 0; a < f.nsp; a++)
        if (f.op == CG_OP_DECONV_BWD_DATA && f.op_pad[a] >= f.s[a])
          given_op = 1;
      if (given_op)
        p.attrs.output_padding = (cg_ints){opad, (size_t)f.nsp};
      if (f.op == CG_OP_DECONV_BWD_DATA && !given_op)
        exact = 0;
    }

    cg_geom g;
    char err[256];
    if (cg_problem_resolve(&p, &g, err, sizeof(err)) != 0)
      fail_msg("iteration %d (%s, nsp %d, auto_pad %s): %s", iter,
               cg_op_name(f.op), f.nsp, cg_auto_pad_name(f.ap), err);
    kt_dims_eq(g.out_dims, (cg_ints){want_out, (size_t)rank});
    assert_int_equal(g.ic, f.ic);
    assert_int_equal(g.oc, f.oc);
    assert_int_equal(g.mb, f.mb);
    for (int a = 0; a < f.nsp; a++) {
      assert_int_equal(g.pad_begin[a], f.pb[a]);
      assert_int_equal(g.pad_end[a], f.pe[a]);
      assert_int_equal(g.kernel[a], f.k[a]);
      assert_int_equal(g.in_sp[a], f.xi[a]);
      assert_int_equal(g.out_sp[a], f.xo[a]);
      assert_int_equal(g.output_padding[a], f.deconv ? f.op_pad[a] : 0);
    }
    valid++;
    per_op[f.op]++;

    /* diff_dst one larger on one axis. Convolution: never valid with the
     * other shapes fixed. ConvTranspose weights: valid only while the
     * implied output_padding stays below max(S, D) and none was given. */
    if (!exact)
      continue;
    int a = (int)rnd(0, f.nsp - 1);
    int idx = f.df == CG_DATA_NCX ? 2 + a : 1 + a;
    dst[idx]++;
    int64_t lim = f.s[a] > f.d[a] ? f.s[a] : f.d[a];
    int still_valid =
        f.op == CG_OP_DECONV_BWD_WEIGHTS && !given_op && f.op_pad[a] + 1 < lim;
    if (f.op == CG_OP_DECONV_BWD_DATA)
      still_valid = f.s[a] == 1; /* exact division by 1 */
    int rc = cg_problem_resolve(&p, &g, err, sizeof(err));
    if (still_valid != (rc == 0))
      fail_msg("iteration %d (%s): diff_dst[%d] + 1 %s: %s", iter,
               cg_op_name(f.op), idx,
               still_valid ? "should be accepted" : "should be rejected",
               rc ? err : "accepted");
    if (rc != 0) {
      assert_int_equal(rc, CG_EINVAL);
      rejected++;
    }
  }
  printf("%d random problems resolved (%d/%d/%d/%d per op), %d off-by-one "
         "diff_dst sizes rejected\n",
         valid, per_op[1], per_op[2], per_op[3], per_op[4], rejected);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(random_forward_problems),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
