/* smoke.c - `convgrad smoke`: waits until the server is SERVING, then runs
 * every op (the layer ops with every output, and without diff_src) over a
 * fixed set of small problems (1D/2D/3D, groups,
 * depthwise, strides, dilations, pads, SAME auto_pad, both data formats,
 * every weights format, f32/bf16/f16, shape inputs, output layouts) and
 * checks each result against the local reference. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cg/reference.h"
#include "cli.h"

static const char cgc__smoke_help[] =
    "Usage: convgrad smoke [--wait SECONDS] [--quiet] [options]\n"
    "Waits until the server reports SERVING (retrying for up to --wait\n"
    "seconds, default 30), then runs each of the six ops over small random\n"
    "problems covering 1D/2D/3D, groups, depthwise, strides, dilations,\n"
    "pads, SAME auto_pad, NCX/NXC, every weights format, f32/bf16/f16,\n"
    "shape inputs and output layouts, and checks every result against the\n"
    "local reference. Exits 0 only if all match.\n"
    "  --wait SECONDS   how long to wait for the server (default 30)\n"
    "  --quiet          print failures and the summary only\n";

typedef struct cgc__case {
  const char *label;
  int nsp;
  int64_t mb, ic, oc, g;
  int64_t in[3], k[3], s[3], d[3], p[3];
  int same; /* auto_pad same_upper */
} cgc__case;

/* ic/oc are the forward op's: for ConvTranspose cases the channels of its
 * input and output. */
static const cgc__case cgc__cases[] = {
    {"2d", 2, 2, 4, 6, 1, {7, 7}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 0},
    {"2d-g2-s2", 2, 2, 4, 6, 2, {8, 6}, {3, 2}, {2, 2}, {1, 1}, {1, 0}, 0},
    {"1d-dil2-s2", 1, 2, 3, 4, 1, {11}, {3}, {2}, {2}, {2}, 0},
    {"3d-depthwise",
     3,
     1,
     4,
     4,
     4,
     {4, 5, 4},
     {2, 2, 2},
     {1, 1, 1},
     {1, 1, 1},
     {0, 0, 0},
     0},
    {"2d-same-upper", 2, 1, 2, 4, 1, {6, 5}, {3, 3}, {2, 2}, {1, 1}, {0, 0}, 1},
};

/* dtype, data format, weights-format style (0: O/I first, 1: X first;
 * ConvTranspose adds 2, 3: the older OIX / XIO spellings). */
static const struct {
  cg_dtype dt;
  cg_data_format df;
  int style;
} cgc__combos[] = {{CG_DTYPE_F32, CG_DATA_NCX, 0},
                   {CG_DTYPE_F32, CG_DATA_NXC, 1},
                   {CG_DTYPE_BF16, CG_DATA_NXC, 2},
                   {CG_DTYPE_F16, CG_DATA_NCX, 3}};

static int cgc__data_dims(cg_data_format df, int nsp, int64_t n, int64_t c,
                          const int64_t *sp, int64_t *out) {
  out[0] = n;
  if (df == CG_DATA_NCX) {
    out[1] = c;
    memcpy(out + 2, sp, (size_t)nsp * sizeof(int64_t));
  } else {
    memcpy(out + 1, sp, (size_t)nsp * sizeof(int64_t));
    out[nsp + 1] = c;
  }
  return nsp + 2;
}

/* Weights dims in format wf from the two channel counts named by the
 * format letters: a = the "O/I-first" pair, b the other. */
static int cgc__weights_dims(int x_first, int nsp, int64_t first,
                             int64_t second, const int64_t *k, int64_t *out) {
  if (!x_first) {
    out[0] = first;
    out[1] = second;
    memcpy(out + 2, k, (size_t)nsp * sizeof(int64_t));
  } else {
    memcpy(out, k, (size_t)nsp * sizeof(int64_t));
    out[nsp] = second;
    out[nsp + 1] = first;
  }
  return nsp + 2;
}

/* Builds the spec for case c, op and combo; variant 1 sends the shape as
 * a tensor, variant 2 asks for the other data/weights output layout,
 * variant 3 (layer ops) skips diff_src as a first layer would. A layer op
 * is built as its backward-weights op, then turned into it. */
static void cgc__build(cgc_spec *s, const cgc__case *c, cg_op op, int combo,
                       int variant) {
  cg_op layer = cg_op_is_layer(op) ? op : CG_OP_INVALID;
  if (layer)
    op = layer == CG_OP_CONV_BWD ? CG_OP_CONV_BWD_WEIGHTS
                                 : CG_OP_DECONV_BWD_WEIGHTS;
  int deconv = op == CG_OP_DECONV_BWD_DATA || op == CG_OP_DECONV_BWD_WEIGHTS;
  int style = cgc__combos[combo].style;
  int64_t out_sp[3], wd[CG_MAX_RANK];
  int wrank;
  cgc_spec_init(s);
  s->op = op;
  s->dtype = cgc__combos[combo].dt;
  s->data_format = cgc__combos[combo].df;
  s->groups = c->g;
  s->strides.len = s->dilations.len = (size_t)c->nsp;
  for (int i = 0; i < c->nsp; i++) {
    int64_t ek = (c->k[i] - 1) * c->d[i] + 1, pb, pe;
    s->strides.v[i] = c->s[i];
    s->dilations.v[i] = c->d[i];
    if (c->same) {
      int64_t t = deconv ? ek - c->s[i]
                         : ((c->in[i] + c->s[i] - 1) / c->s[i] - 1) * c->s[i] +
                               ek - c->in[i];
      t = t > 0 ? t : 0;
      pb = t / 2;
      pe = t - pb;
    } else {
      pb = pe = c->p[i];
    }
    out_sp[i] = deconv ? c->s[i] * (c->in[i] - 1) + ek - pb - pe
                       : (c->in[i] + pb + pe - ek) / c->s[i] + 1;
  }
  if (c->same) {
    s->auto_pad = CG_AUTO_PAD_SAME_UPPER;
  } else {
    s->pads_begin.len = s->pads_end.len = (size_t)c->nsp;
    for (int i = 0; i < c->nsp; i++)
      s->pads_begin.v[i] = s->pads_end.v[i] = c->p[i];
  }
  if (!deconv) {
    s->weights_format = style % 2 ? CG_WEIGHTS_XIO : CG_WEIGHTS_OIX;
    wrank = cgc__weights_dims(style % 2, c->nsp, c->oc, c->ic / c->g, c->k, wd);
  } else if (style < 2) {
    s->weights_format = style ? CG_WEIGHTS_XOI : CG_WEIGHTS_IOX;
    wrank = cgc__weights_dims(style, c->nsp, c->ic, c->oc / c->g, c->k, wd);
  } else {
    s->weights_format = style == 3 ? CG_WEIGHTS_XIO : CG_WEIGHTS_OIX;
    wrank =
        cgc__weights_dims(style == 3, c->nsp, c->oc / c->g, c->ic, c->k, wd);
  }
  int64_t src[CG_MAX_RANK], dst[CG_MAX_RANK];
  int drank = cgc__data_dims(s->data_format, c->nsp, c->mb, c->ic, c->in, src);
  cgc__data_dims(s->data_format, c->nsp, c->mb, c->oc, out_sp, dst);
  s->rank[0] = s->rank[1] = drank;
  switch (op) {
  case CG_OP_CONV_BWD_DATA:
  case CG_OP_DECONV_BWD_DATA:
    memcpy(s->dims[0], dst, sizeof dst);
    memcpy(s->dims[1], wd, sizeof wd);
    s->rank[1] = wrank;
    /* SAME needs the shape; the others infer it on alternate combos. */
    if (op == CG_OP_CONV_BWD_DATA && (c->same || combo % 2 || variant == 1)) {
      s->dst_shape.len = (size_t)drank;
      memcpy(s->dst_shape.v, src, sizeof src);
    }
    break;
  default:
    memcpy(s->dims[0], src, sizeof src);
    memcpy(s->dims[1], dst, sizeof dst);
    s->weights_shape.len = (size_t)wrank;
    memcpy(s->weights_shape.v, wd, sizeof wd);
    break;
  }
  if (variant == 1) {
    s->has_shape_input = 1;
    s->shape_input =
        op == CG_OP_CONV_BWD_DATA ? s->dst_shape : s->weights_shape;
  } else if (variant == 2) {
    if (layer)
      s->out_data_format =
          s->data_format == CG_DATA_NCX ? CG_DATA_NXC : CG_DATA_NCX;
    if (cg_op_outputs_weights(op))
      s->out_weights_format =
          !deconv ? (s->weights_format == CG_WEIGHTS_OIX ? CG_WEIGHTS_XIO
                                                         : CG_WEIGHTS_OIX)
                  : (s->weights_format == CG_WEIGHTS_IOX ? CG_WEIGHTS_XOI
                                                         : CG_WEIGHTS_IOX);
    else
      s->out_data_format =
          s->data_format == CG_DATA_NCX ? CG_DATA_NXC : CG_DATA_NCX;
  }
  if (layer) {
    cgc_spec_to_layer(s, layer);
    if (variant == 3)
      s->grads =
          CG_GRAD_BIT(CG_GRAD_DIFF_WEIGHTS) | CG_GRAD_BIT(CG_GRAD_DIFF_BIAS);
  }
}

/* Runs one case, every output it asks for; returns 1 if all matched. */
static int cgc__smoke_one(cgc_channel *ch, const cgc_spec *s, const char *label,
                          uint64_t seed, int quiet) {
  cg_problem p;
  cg_layer l;
  char err[512], what[160];
  void *in[3] = {NULL}, *ref[CG_GRAD_COUNT] = {NULL};
  cgc_tensor *out[CG_GRAD_COUNT] = {NULL};
  int ok = 0;
  double worst = 0;
  snprintf(what, sizeof what, "%-28s %-4s %s/%s %s", cg_op_name(s->op),
           cg_dtype_name(s->dtype), cg_data_format_name(s->data_format),
           cg_weights_format_name(s->weights_format), label);
  cgc_spec_problem(s, &p);
  if (cg_layer_resolve(&p, &l, err, sizeof err)) {
    printf("FAIL  %s: local problem invalid: %s\n", what, err);
    return 0;
  }
  for (int i = 0; i < l.ninputs; i++)
    if (!(in[i] = malloc(l.in_bytes[i]))) {
      printf("FAIL  %s: out of memory\n", what);
      goto out;
    }
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    if ((l.grads & CG_GRAD_BIT(g)) && !(ref[g] = malloc(l.out_bytes[g]))) {
      printf("FAIL  %s: out of memory\n", what);
      goto out;
    }
  for (int i = 0; i < l.ninputs; i++)
    cg_fill_uniform(s->dtype, in[i], l.in_bytes[i] / cg_dtype_size(s->dtype),
                    &seed);
  cgc_request req;
  cgc_status st;
  cgc_spec_request_n(s, (const void *const *)in, l.in_bytes, &req);
  int rc = cgc_compute_layer(ch, &req, out, NULL, &st);
  if (rc) {
    printf("FAIL  %s: %s: %s\n", what,
           rc == CGC_ERPC ? cgc_status_code_name(st.code) : cgc_strerror(rc),
           st.message);
    goto out;
  }
  if (cg_reference_layer(&l, (const void *const *)in, ref, err, sizeof err)) {
    printf("FAIL  %s: reference: %s\n", what, err);
    goto out;
  }
  ok = 1;
  for (int g = 0; g < CG_GRAD_COUNT && ok; g++) {
    if (!(l.grads & CG_GRAD_BIT(g)))
      continue;
    if (out[g]->nbytes != l.out_bytes[g] || out[g]->rank != l.out_rank[g] ||
        memcmp(out[g]->dims, l.out_dims[g],
               (size_t)out[g]->rank * sizeof(int64_t)) != 0) {
      printf("FAIL  %s: %s shape differs from the reference\n", what,
             cg_grad_name((cg_grad)g));
      ok = 0;
      goto out;
    }
    cgc_diff d;
    cgc_compare_output(&l, g, out[g]->data, ref[g], &d);
    ok = d.ok;
    worst = d.max_rel > worst ? d.max_rel : worst;
  }
  if (!ok || !quiet)
    printf("%s  %s  max rel err %.2g\n", ok ? "ok  " : "FAIL", what, worst);
out:
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    cgc_tensor_free(out[g]);
    free(ref[g]);
  }
  for (int i = 0; i < 3; i++)
    free(in[i]);
  return ok;
}

/* Polls Health/Check until SERVING or wait_s passes. */
static int cgc__smoke_wait(const cgc_cli *cli, cgc_channel *ch, double wait_s) {
  struct timespec t0, now;
  cgc_status st = {GRPC_STATUS_UNAVAILABLE, "no answer"};
  cgc_health_status hs = CGC_HEALTH_UNKNOWN;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    int rc = cgc_health(ch, "", 1000, &hs, &st);
    if (rc == 0 && hs == CGC_HEALTH_SERVING)
      return 0;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double el = (double)(now.tv_sec - t0.tv_sec) +
                (double)(now.tv_nsec - t0.tv_nsec) / 1e9;
    if (el >= wait_s) {
      if (rc == 0)
        fprintf(stderr, "convgrad smoke: server %s is %s after %.0f s\n",
                cli->target, cgc_health_status_name(hs), wait_s);
      else
        fprintf(stderr,
                "convgrad smoke: server %s not reachable after %.0f s: %s: "
                "%s\n",
                cli->target, wait_s, cgc_status_code_name(st.code), st.message);
      return CGC_EXIT_UNAVAILABLE;
    }
    struct timespec ts = {0, 200L * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

int cgc_cmd_smoke(int argc, char **argv) {
  cgc_cli cli;
  int code, quiet = 0;
  cgc_cli_num wait_s = {30, 0, 86400, "--wait: expected seconds", NULL};
  const cgc_cli_opt opts[] = {{"wait", CGC_CLI_NUM, &wait_s},
                              {"quiet", CGC_CLI_FLAG, &quiet},
                              {NULL, 0, NULL}};
  cgc_channel *ch;
  cgc_cli_init(&cli, "smoke", cgc__smoke_help, 0);
  if (cgc_cli_start(&cli, opts, argc, argv, &ch, &code))
    return code;
  if ((code = cgc__smoke_wait(&cli, ch, (double)wait_s.v)) != 0)
    goto out;

  int total = 0, passed = 0;
  uint64_t seed = 1;
  const size_t ncases = sizeof cgc__cases / sizeof cgc__cases[0];
  const size_t ncombos = sizeof cgc__combos / sizeof cgc__combos[0];
  for (size_t ci = 0; ci < ncases; ci++)
    for (int op = CG_OP_CONV_BWD_DATA; op <= CG_OP_DECONV_BWD; op++)
      for (size_t k = 0; k < ncombos; k++) {
        cgc_spec s;
        cgc__build(&s, &cgc__cases[ci], (cg_op)op, (int)k, 0);
        total++;
        passed += cgc__smoke_one(ch, &s, cgc__cases[ci].label, seed++, quiet);
      }
  /* Shape tensors and non-default output layouts, on the first two cases. */
  for (size_t ci = 0; ci < 2; ci++)
    for (int op = CG_OP_CONV_BWD_DATA; op <= CG_OP_DECONV_BWD; op++)
      for (int variant = 1; variant <= 3; variant++) {
        static const char *const names[] = {"", "shape-input",
                                            "other-out-layout", "first-layer"};
        char label[64];
        cgc_spec s;
        /* Shape inputs are for the ops that have one; skipping diff_src is
         * for the layer ops. */
        if ((variant == 1 &&
             (op == CG_OP_DECONV_BWD_DATA || cg_op_is_layer((cg_op)op))) ||
            (variant == 3 && !cg_op_is_layer((cg_op)op)))
          continue;
        cgc__build(&s, &cgc__cases[ci], (cg_op)op, (int)ci, variant);
        snprintf(label, sizeof label, "%s %s", cgc__cases[ci].label,
                 names[variant]);
        total++;
        passed += cgc__smoke_one(ch, &s, label, seed++, quiet);
      }
  printf("smoke: %d/%d passed against %s\n", passed, total, cli.target);
  code = passed == total ? CGC_EXIT_OK : CGC_EXIT_FAIL;
out:
  cgc_channel_free(ch);
  return code;
}
