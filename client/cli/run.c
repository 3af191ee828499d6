/* run.c - `convgrad run`: one op from flags, a benchdnn descriptor or a
 * oneDNN graph JSON op file; tensors from .npy files or seeded random; the
 * results (several for the layer ops) to .npy; --check against the local
 * plain-C reference. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg/dtype.h"
#include "cg/reference.h"
#include "cli.h"
#include "graph.h"
#include "npy.h"

static const char cgc__run_help[] =
    "Usage: convgrad run (--op NAME | --graph FILE.json) [flags] [options]\n"
    "Runs one convolution-gradient op on the server.\n"
    "\n"
    "Problem:\n"
    "  --op NAME            ConvolutionBackwardData, "
    "ConvolutionBackwardWeights,\n"
    "                       ConvTransposeBackwardData, "
    "ConvTransposeBackwardWeights\n"
    "                       (or the older ...BackpropData/...BackpropFilters),"
    "\n"
    "                       or a layer's whole backward: ConvolutionBackward,\n"
    "                       ConvTransposeBackward (inputs src, diff_dst,\n"
    "                       weights)\n"
    "  --outputs L          layer ops: the outputs wanted, a comma list of\n"
    "                       diff_src, diff_weights, diff_bias (default all)\n"
    "  --graph FILE         op, attrs, dtype and input shapes from a oneDNN "
    "graph\n"
    "                       JSON op file; flags below override it\n"
    "  --graph-op N         use the N-th gradient op of the file (default 0)\n"
    "  --problem DESC       benchdnn descriptor (mb2ic16ih14oc32oh14kh3ph1) "
    "for\n"
    "                       --op; a ConvTranspose op reads it as a "
    "deconvolution\n"
    "  --dtype T            f32 (default), bf16, f16\n"
    "  --strides L --pads-begin L --pads-end L --dilations L --output-padding "
    "L\n"
    "                       comma lists, one value per spatial dim\n"
    "  --groups G --auto-pad none|same_upper|same_lower|valid\n"
    "  --data-format NCX|NXC --weights-format OIX|XIO|IOX|XOI\n"
    "  --dst-shape L --weights-shape L  the output shape attribute\n"
    "  --shape-input        send dst_shape/weights_shape as the third input\n"
    "  --output-format F    wanted layout of the output (layer ops: a comma\n"
    "                       list of a data and a weights layout, e.g. "
    "NXC,XIO)\n"
    "Tensors:\n"
    "  --in0 FILE.npy --in1 FILE.npy   the op's inputs in op order (e.g.\n"
    "                       diff_dst and weights; --in2 for a layer op's\n"
    "                       weights); shapes come from the files\n"
    "  --in0-shape L --in1-shape L --in2-shape L   shapes of random inputs\n"
    "  --seed N             seed of the random inputs (default 1)\n"
    "  --out FILE.npy       write the result (f32 '<f4', f16 '<f2', bf16 as\n"
    "                       '<u2' raw bits; C order); a layer op writes one\n"
    "                       file per output, FILE.diff_src.npy, ...\n"
    "  --check              compare with the local reference; prints max abs\n"
    "                       and max rel error (|diff| / max|ref|); exit 1 if\n"
    "                       above the dtype's tolerance\n"
    "  --shm                pass the tensors in a shared-memory region (a\n"
    "                       server on this host: unix:PATH or loopback)\n";

/* run's string-valued options, in the order of the option table; their
 * values are read once every flag is known, because --graph and --problem
 * come first and the other flags override them. */
enum {
  R_OP,
  R_GRAPH,
  R_GRAPH_OP,
  R_PROBLEM,
  R_DTYPE,
  R_STRIDES,
  R_PADS_BEGIN,
  R_PADS_END,
  R_DILATIONS,
  R_OUTPUT_PADDING,
  R_GROUPS,
  R_AUTO_PAD,
  R_DATA_FORMAT,
  R_WEIGHTS_FORMAT,
  R_DST_SHAPE,
  R_WEIGHTS_SHAPE,
  R_OUTPUT_FORMAT,
  R_IN0,
  R_IN1,
  R_IN2,
  R_IN0_SHAPE,
  R_IN1_SHAPE,
  R_IN2_SHAPE,
  R_SEED,
  R_OUT,
  R_OUTPUTS,
  R_COUNT
};
static const char *const cgc__run_names[R_COUNT] = {
    [R_OP] = "op",
    [R_GRAPH] = "graph",
    [R_GRAPH_OP] = "graph-op",
    [R_PROBLEM] = "problem",
    [R_DTYPE] = "dtype",
    [R_STRIDES] = "strides",
    [R_PADS_BEGIN] = "pads-begin",
    [R_PADS_END] = "pads-end",
    [R_DILATIONS] = "dilations",
    [R_OUTPUT_PADDING] = "output-padding",
    [R_GROUPS] = "groups",
    [R_AUTO_PAD] = "auto-pad",
    [R_DATA_FORMAT] = "data-format",
    [R_WEIGHTS_FORMAT] = "weights-format",
    [R_DST_SHAPE] = "dst-shape",
    [R_WEIGHTS_SHAPE] = "weights-shape",
    [R_OUTPUT_FORMAT] = "output-format",
    [R_IN0] = "in0",
    [R_IN1] = "in1",
    [R_IN2] = "in2",
    [R_IN0_SHAPE] = "in0-shape",
    [R_IN1_SHAPE] = "in1-shape",
    [R_IN2_SHAPE] = "in2-shape",
    [R_SEED] = "seed",
    [R_OUT] = "out",
    [R_OUTPUTS] = "outputs"};

static const int cgc__run_in[3] = {R_IN0, R_IN1, R_IN2};
static const int cgc__run_in_shape[3] = {R_IN0_SHAPE, R_IN1_SHAPE, R_IN2_SHAPE};

/* --output-format: one layout of the output's kind, or for a layer op a
 * comma list of up to one data and one weights layout. */
static int cgc__run_output_format(cgc_spec *s, const char *text) {
  char buf[64];
  int layer = cg_op_is_layer(s->op);
  snprintf(buf, sizeof buf, "%s", text);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t;
       t = strtok_r(NULL, ",", &save)) {
    int bad;
    if (layer)
      bad = cg_data_format_parse(t, &s->out_data_format) &&
            cg_weights_format_parse(t, &s->out_weights_format);
    else if (cg_op_outputs_weights(s->op))
      bad = t != buf || cg_weights_format_parse(t, &s->out_weights_format);
    else
      bad = t != buf || cg_data_format_parse(t, &s->out_data_format);
    if (bad)
      return cgc_cli_usage("run", "--output-format '%s' does not fit %s", text,
                           layer ? "diff_src and diff_weights"
                                 : cg_op_output_name(s->op));
  }
  return 0;
}

/* --outputs: a comma list of output names into s->grads. */
static int cgc__run_outputs(cgc_spec *s, const char *text) {
  char buf[64];
  if (!cg_op_is_layer(s->op))
    return cgc_cli_usage("run",
                         "--outputs: %s has one output; only "
                         "ConvolutionBackward and "
                         "ConvTransposeBackward take a choice",
                         cg_op_name(s->op));
  snprintf(buf, sizeof buf, "%s", text);
  s->grads = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t;
       t = strtok_r(NULL, ",", &save)) {
    cg_grad g;
    if (cg_grad_parse(t, &g))
      return cgc_cli_usage("run",
                           "--outputs: unknown output '%s' (diff_src, "
                           "diff_weights, diff_bias)",
                           t);
    s->grads |= CG_GRAD_BIT(g);
  }
  if (!s->grads)
    return cgc_cli_usage("run", "--outputs: name at least one output");
  return 0;
}

/* Applies the attribute and shape flags (v, and --shape-input) on top of
 * s. */
static int cgc__run_apply(cgc_spec *s, const char *const *v, int shape_input) {
  static const struct {
    int id;
    size_t off;
  } lists[] = {
      {R_STRIDES, offsetof(cgc_spec, strides)},
      {R_PADS_BEGIN, offsetof(cgc_spec, pads_begin)},
      {R_PADS_END, offsetof(cgc_spec, pads_end)},
      {R_DILATIONS, offsetof(cgc_spec, dilations)},
      {R_OUTPUT_PADDING, offsetof(cgc_spec, output_padding)},
      {R_DST_SHAPE, offsetof(cgc_spec, dst_shape)},
      {R_WEIGHTS_SHAPE, offsetof(cgc_spec, weights_shape)},
  };
  int code;
  if ((code = cgc_cli_name("run", CGC_CLI_OP, v[R_OP], &s->op)) ||
      (code = cgc_cli_name("run", CGC_CLI_DTYPE, v[R_DTYPE], &s->dtype)))
    return code;
  for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++) {
    const char *t = v[lists[i].id];
    if (t && cgc_list_parse(t, (cgc_list *)((char *)s + lists[i].off)))
      return cgc_cli_usage("run",
                           "--%s: expected a comma list of integers, "
                           "got '%s'",
                           cgc__run_names[lists[i].id], t);
  }
  cgc_cli_num groups = {s->groups, INT64_MIN / 2, INT64_MAX / 2,
                        "--groups: expected an integer", NULL};
  if ((code = cgc_cli_number("run", v[R_GROUPS], &groups)))
    return code;
  s->groups = groups.v;
  if (v[R_AUTO_PAD] && cg_auto_pad_parse(v[R_AUTO_PAD], &s->auto_pad))
    return cgc_cli_usage("run", "--auto-pad: unknown value '%s'",
                         v[R_AUTO_PAD]);
  if ((code = cgc_cli_name("run", CGC_CLI_DATA_FORMAT, v[R_DATA_FORMAT],
                           &s->data_format)) ||
      (code = cgc_cli_name("run", CGC_CLI_WEIGHTS_FORMAT, v[R_WEIGHTS_FORMAT],
                           &s->weights_format)))
    return code;
  if (v[R_OUTPUT_FORMAT] && s->op &&
      (code = cgc__run_output_format(s, v[R_OUTPUT_FORMAT])))
    return code;
  if (v[R_OUTPUTS] && s->op && (code = cgc__run_outputs(s, v[R_OUTPUTS])))
    return code;
  for (int i = 0; i < 3; i++) {
    const char *t = v[cgc__run_in_shape[i]];
    cgc_list l;
    if (!t)
      continue;
    if (cgc_list_parse(t, &l) || l.len > CG_MAX_RANK)
      return cgc_cli_usage("run", "--in%d-shape: expected up to %d dims", i,
                           CG_MAX_RANK);
    s->rank[i] = (int)l.len;
    memcpy(s->dims[i], l.v, l.len * sizeof(int64_t));
  }
  if (shape_input) {
    const cgc_list *l =
        s->op == CG_OP_CONV_BWD_DATA ? &s->dst_shape : &s->weights_shape;
    if (!s->op || s->op == CG_OP_DECONV_BWD_DATA || cg_op_is_layer(s->op) ||
        l->len == 0)
      return cgc_cli_usage("run", "--shape-input needs --dst-shape "
                                  "(ConvolutionBackwardData) or "
                                  "--weights-shape (BackwardWeights ops)");
    s->has_shape_input = 1;
    s->shape_input = *l;
  }
  return 0;
}

/* Reads input i from a .npy file, converting to the problem's dtype, or
 * with take_dtype making the file's dtype the problem's. */
static int cgc__run_load(cgc_spec *s, int i, const char *path, int take_dtype,
                         void **data, size_t *nbytes) {
  char err[512];
  cgc_npy n;
  if (cgc_npy_read(path, &n, err, sizeof err)) {
    fprintf(stderr, "convgrad run: %s\n", err);
    return CGC_EXIT_INPUT;
  }
  if (n.rank > CG_MAX_RANK) {
    fprintf(stderr, "convgrad run: %s: rank %d above %d\n", path, n.rank,
            CG_MAX_RANK);
    cgc_npy_free(&n);
    return CGC_EXIT_INPUT;
  }
  if (s->rank[i] == 0) {
    s->rank[i] = n.rank;
    memcpy(s->dims[i], n.dims, (size_t)n.rank * sizeof(int64_t));
  } else if (s->rank[i] != n.rank ||
             memcmp(s->dims[i], n.dims, (size_t)n.rank * sizeof(int64_t)) !=
                 0) {
    fprintf(stderr,
            "convgrad run: %s: shape differs from the problem's %s shape\n",
            path, cg_op_input_name(s->op, i));
    cgc_npy_free(&n);
    return CGC_EXIT_INPUT;
  }
  if (take_dtype)
    s->dtype = n.dtype;
  if (n.dtype == s->dtype) {
    *data = n.data;
    *nbytes = n.nbytes;
    return 0;
  }
  size_t elems = n.nbytes / cg_dtype_size(n.dtype);
  size_t bytes = elems * cg_dtype_size(s->dtype);
  void *conv = malloc(bytes ? bytes : 1);
  if (!conv) {
    cgc_npy_free(&n);
    fprintf(stderr, "convgrad run: out of memory\n");
    return CGC_EXIT_INTERNAL;
  }
  cg_convert(s->dtype, conv, n.dtype, n.data, elems);
  cgc_npy_free(&n);
  *data = conv;
  *nbytes = bytes;
  return 0;
}

static void cgc__print_dims(const int64_t *d, int rank) {
  printf("[");
  for (int i = 0; i < rank; i++)
    printf("%s%lld", i ? ", " : "", (long long)d[i]);
  printf("]");
}

/* --check of output g: the reference's, compared element-wise. */
static int cgc__run_check_one(const cg_layer *l, int g, const void *ref,
                              const cgc_tensor *out) {
  if (l->out_bytes[g] != out->nbytes || l->out_rank[g] != out->rank ||
      memcmp(l->out_dims[g], out->dims, (size_t)out->rank * sizeof(int64_t)) !=
          0) {
    fprintf(stderr,
            "convgrad run: check failed: the server's %s shape differs "
            "from the reference's\n",
            cg_grad_name((cg_grad)g));
    return CGC_EXIT_FAIL;
  }
  cgc_diff d;
  cgc_compare_output(l, g, out->data, ref, &d);
  printf("check%s%s: max abs err %.3g, max rel err %.3g (rel tolerance "
         "%.3g): %s\n",
         cg_op_is_layer(l->op) ? " " : "",
         cg_op_is_layer(l->op) ? cg_grad_name((cg_grad)g) : "", d.max_abs,
         d.max_rel, d.tol / (d.max_ref > 1e-3 ? d.max_ref : 1e-3),
         d.ok ? "OK" : "MISMATCH");
  if (d.ok)
    return CGC_EXIT_OK;
  fprintf(stderr,
          "convgrad run: %s differs from the reference (max abs err %.3g at "
          "element %zu)\n",
          cg_grad_name((cg_grad)g), d.max_abs, d.worst);
  return CGC_EXIT_FAIL;
}

/* --check: the reference on the same inputs, every output compared. */
static int cgc__run_check(const cgc_spec *s, const void *const in[3],
                          cgc_tensor *const out[CG_GRAD_COUNT]) {
  cg_problem p;
  cg_layer l;
  char err[512];
  void *ref[CG_GRAD_COUNT] = {NULL};
  int code = CGC_EXIT_OK;
  cgc_spec_problem(s, &p);
  if (cg_layer_resolve(&p, &l, err, sizeof err)) {
    fprintf(stderr, "convgrad run: cannot check: %s\n", err);
    return CGC_EXIT_INPUT;
  }
  for (int g = 0; g < CG_GRAD_COUNT && !code; g++)
    if ((l.grads & CG_GRAD_BIT(g)) &&
        !(ref[g] = malloc(l.out_bytes[g] ? l.out_bytes[g] : 1))) {
      fprintf(stderr, "convgrad run: out of memory for the reference\n");
      code = CGC_EXIT_INTERNAL;
    }
  if (!code && cg_reference_layer(&l, in, ref, err, sizeof err)) {
    fprintf(stderr, "convgrad run: reference failed: %s\n", err);
    code = CGC_EXIT_INTERNAL;
  }
  for (int g = 0; g < CG_GRAD_COUNT && !code; g++)
    if (l.grads & CG_GRAD_BIT(g))
      code = cgc__run_check_one(&l, g, ref[g], out[g]);
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    free(ref[g]);
  return code;
}

/* The spec from --graph, --problem or the flags alone, flags winning. */
static int cgc__run_spec(cgc_spec *s, const char **v, int shape_input,
                         int graph_op) {
  char err[512];
  int code;
  if (v[R_GRAPH] && v[R_PROBLEM])
    return cgc_cli_usage("run", "--graph and --problem exclude each other");
  cgc_spec_init(s);
  if (v[R_GRAPH]) {
    if (cgc_graph_load(v[R_GRAPH], graph_op, s, err, sizeof err)) {
      fprintf(stderr, "convgrad run: %s\n", err);
      return CGC_EXIT_INPUT;
    }
  } else if (v[R_PROBLEM]) {
    cg_bdesc d;
    cg_bdesc_problem bp;
    /* The descriptor's shapes follow the op, dtype and layouts of the
     * flags, so those are read first. */
    if ((code = cgc__run_apply(s, v, 0)) != 0)
      return code;
    if (!s->op)
      return cgc_cli_usage("run", "--problem needs a valid --op");
    int deconv = s->op == CG_OP_DECONV_BWD_DATA ||
                 s->op == CG_OP_DECONV_BWD_WEIGHTS || s->op == CG_OP_DECONV_BWD;
    /* A layer op's problem is its backward-weights op's, with the
     * weights as the third input. */
    cg_op layer = cg_op_is_layer(s->op) ? s->op : CG_OP_INVALID;
    cg_op op = !layer   ? s->op
               : deconv ? CG_OP_DECONV_BWD_WEIGHTS
                        : CG_OP_CONV_BWD_WEIGHTS;
    if (cg_bdesc_parse(v[R_PROBLEM], deconv, &d, err, sizeof err) ||
        cg_bdesc_problem_init(&bp, &d, op, s->dtype, s->data_format,
                              s->weights_format, err, sizeof err))
      return cgc_cli_usage("run", "--problem: %s", err);
    cgc_spec_from_problem(s, &bp.problem);
    if (layer)
      cgc_spec_to_layer(s, layer);
  }
  if ((code = cgc__run_apply(s, v, shape_input)) != 0)
    return code;
  if (!s->op)
    return cgc_cli_usage("run", "give --op NAME or --graph FILE");
  return 0;
}

/* The inputs: read from --inN files, else random from the seed. The
 * caller frees in[] whatever this returns. */
static int cgc__run_inputs(cgc_spec *s, const char **v, uint64_t seed,
                           void *in[3], size_t nbytes[3]) {
  char err[512];
  int code;
  /* Without an explicit dtype, a .npy in0 decides it; it is read once, so
   * that it may be a pipe. */
  int dtype_from_in0 = !v[R_DTYPE] && !v[R_GRAPH] && !v[R_PROBLEM];
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  int n = cgc_spec_ninputs(s);
  if (n < 3 && (v[R_IN2] || v[R_IN2_SHAPE]))
    return cgc_cli_usage("run", "--in2: only ConvolutionBackward and "
                                "ConvTransposeBackward take a third input");
  for (int i = 0; i < n && i < 3; i++) {
    const char *file = v[cgc__run_in[i]];
    if (file) {
      if ((code = cgc__run_load(s, i, file, i == 0 && dtype_from_in0, &in[i],
                                &nbytes[i])) != 0)
        return code;
      continue;
    }
    if (s->rank[i] == 0)
      return cgc_cli_usage("run",
                           "input %d (%s): give --in%d FILE.npy or "
                           "--in%d-shape",
                           i, cg_op_input_name(s->op, i), i, i);
    if (cgc_spec_input_bytes(s, i, &nbytes[i], err, sizeof err)) {
      fprintf(stderr, "convgrad run: %s\n", err);
      return CGC_EXIT_INPUT;
    }
    in[i] = malloc(nbytes[i] ? nbytes[i] : 1);
    if (!in[i]) {
      fprintf(stderr, "convgrad run: out of memory for a %zu-byte input\n",
              nbytes[i]);
      return CGC_EXIT_INTERNAL;
    }
    cg_fill_uniform(s->dtype, in[i], nbytes[i] / cg_dtype_size(s->dtype),
                    &state);
  }
  return 0;
}

/* What came back: the result's shape and the call's figures. */
static void cgc__run_report(const cgc_spec *s,
                            cgc_tensor *const out[CG_GRAD_COUNT],
                            const cgc_result *res) {
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    if (!out[g])
      continue;
    printf("%s %s: %s ", cg_op_name(s->op), cg_dtype_name(out[g]->dtype),
           cg_grad_name((cg_grad)g));
    cgc__print_dims(out[g]->dims, out[g]->rank);
    printf(" %s, %zu bytes\n", cgc_layout_name(out[g]->layout), out[g]->nbytes);
  }
  printf("server: queue %.3f ms, compute %.3f ms, path %s, worker %s",
         res->queue_ms, res->compute_ms, res->compute_path, res->worker);
  if (res->npads) {
    printf(", pads ");
    cgc__print_dims(res->pads_begin, res->npads);
    printf("/");
    cgc__print_dims(res->pads_end, res->npads);
  }
  printf("\nclient: total %.3f ms, %d attempt%s, %llu bytes up, %llu down\n",
         res->total_ms, res->attempts, res->attempts == 1 ? "" : "s",
         (unsigned long long)res->bytes_sent,
         (unsigned long long)res->bytes_received);
  /* Bandwidth only means something for streams of several MiB. */
  if (res->upload_ms > 0 && res->bytes_sent >= (4u << 20))
    printf("transfer: upload %.1f ms (%.2f GB/s)\n", res->upload_ms,
           (double)res->bytes_sent / res->upload_ms / 1e6);
  if (res->download_ms > 0 && res->bytes_received >= (4u << 20))
    printf("transfer: download %.1f ms (%.2f GB/s)\n", res->download_ms,
           (double)res->bytes_received / res->download_ms / 1e6);
}

/* --out: the path of output g. A single op writes the file named; a
 * layer op writes one per output, its name before the .npy. */
static void cgc__run_out_path(const cgc_spec *s, const char *out, int g,
                              char *path, size_t cap) {
  size_t n = strlen(out);
  if (!cg_op_is_layer(s->op)) {
    snprintf(path, cap, "%s", out);
    return;
  }
  if (n >= 4 && strcmp(out + n - 4, ".npy") == 0)
    n -= 4;
  snprintf(path, cap, "%.*s.%s.npy", (int)n, out, cg_grad_name((cg_grad)g));
}

static int cgc__run_write(const cgc_spec *s, const char *out,
                          cgc_tensor *const t[CG_GRAD_COUNT]) {
  char err[512], path[4096];
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    if (!t[g])
      continue;
    cgc__run_out_path(s, out, g, path, sizeof path);
    if (cgc_npy_write(path, t[g]->dtype, t[g]->rank, t[g]->dims, t[g]->data,
                      t[g]->nbytes, err, sizeof err)) {
      fprintf(stderr, "convgrad run: %s\n", err);
      return CGC_EXIT_INTERNAL;
    }
    printf("wrote %s\n", path);
  }
  return CGC_EXIT_OK;
}

/* --shm: the request staged in a region (m), its outputs written there
 * and described by placed[g], which out[g] points at. */
static int cgc__run_shm(const cgc_spec *s, cgc_channel *ch, cgc_request *req,
                        cgc_cli_shm *m, cgc_tensor placed[CG_GRAD_COUNT],
                        cgc_tensor *out[CG_GRAD_COUNT], cgc_result *res,
                        cgc_status *st) {
  cg_problem p;
  cg_layer l;
  size_t out_bytes[CG_GRAD_COUNT] = {0};
  int rc;
  cgc_spec_problem(s, &p);
  if ((rc = cg_layer_resolve(&p, &l, st->message, sizeof st->message)) != 0) {
    st->code = GRPC_STATUS_INVALID_ARGUMENT;
    return rc;
  }
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    if (l.grads & CG_GRAD_BIT(g))
      out_bytes[g] = l.out_bytes[g];
  if (cgc_cli_shm_stage(m, ch, req, out_bytes, &rc, st) != 0)
    return rc;
  rc = cgc_compute_layer_into(ch, req, m->into, m->cap, placed, res, st);
  for (int g = 0; g < CG_GRAD_COUNT && !rc; g++)
    out[g] = placed[g].data ? &placed[g] : NULL;
  return rc;
}

int cgc_cmd_run(int argc, char **argv) {
  const char *v[R_COUNT] = {NULL};
  cgc_cli cli;
  cgc_spec s;
  void *in[3] = {NULL, NULL, NULL};
  size_t nbytes[3] = {0, 0, 0};
  cgc_channel *ch = NULL;
  cgc_tensor *out[CG_GRAD_COUNT] = {NULL};
  cgc_cli_shm m = {0};
  cgc_tensor placed[CG_GRAD_COUNT];
  int code = 0, shape_input = 0, check = 0, shm = 0;
  cgc_cli_num seed = {1, 0, INT64_MAX,
                      "--seed: expected a non-negative integer", NULL};
  cgc_cli_num graph_op = {0, 0, 1000, "--graph-op: expected an index", NULL};
  cgc_cli_opt opts[R_COUNT + 4];
  for (int i = 0; i < R_COUNT; i++)
    opts[i] = (cgc_cli_opt){cgc__run_names[i], CGC_CLI_STR, &v[i]};
  opts[R_COUNT] = (cgc_cli_opt){"shape-input", CGC_CLI_FLAG, &shape_input};
  opts[R_COUNT + 1] = (cgc_cli_opt){"check", CGC_CLI_FLAG, &check};
  opts[R_COUNT + 2] = (cgc_cli_opt){"shm", CGC_CLI_FLAG, &shm};
  opts[R_COUNT + 3] = (cgc_cli_opt){NULL, 0, NULL};

  cgc_cli_init(&cli, "run", cgc__run_help, 0);
  if (cgc_cli_parse(&cli, opts, argc, argv, &code))
    return code;
  if ((code = cgc_cli_number("run", v[R_SEED], &seed)) ||
      (code = cgc_cli_number("run", v[R_GRAPH_OP], &graph_op)) ||
      (code = cgc__run_spec(&s, v, shape_input, (int)graph_op.v)))
    return code;
  if ((code = cgc__run_inputs(&s, v, (uint64_t)seed.v, in, nbytes)) ||
      (code = cgc_cli_connect(&cli, &ch)))
    goto out;
  cgc_request req;
  cgc_result res;
  cgc_status st;
  cgc_spec_request_n(&s, (const void *const *)in, nbytes, &req);
  int rc = shm ? cgc__run_shm(&s, ch, &req, &m, placed, out, &res, &st)
               : cgc_compute_layer(ch, &req, out, &res, &st);
  if (rc) {
    code = cgc_cli_fail(&cli, rc, &st);
    goto out;
  }
  cgc__run_report(&s, out, &res);
  cgc_cli_verify_report(&cli, ch, stdout);
  if (v[R_OUT] && (code = cgc__run_write(&s, v[R_OUT], out)))
    goto out;
  if (check)
    code = cgc__run_check(&s, (const void *const *)in, out);
out:
  for (int g = 0; g < CG_GRAD_COUNT && !shm; g++)
    cgc_tensor_free(out[g]);
  cgc_cli_shm_close(&m);
  cgc_channel_free(ch);
  for (int i = 0; i < 3; i++)
    free(in[i]);
  return code;
}
