/* bench_kernels.c - benchmark of cg_engine against a direct oneDNN
 * execution of the same problem (not a test).
 *
 * Reads a problem list in benchdnn descriptor syntax (cg/bdesc.h; lines
 * starting "deconv:" are deconvolutions), and for each problem, each of the
 * two gradient ops of its family and each dtype prints the engine's median
 * time, GFLOP/s, and the ratio to a direct oneDNN sequence written here by
 * hand the way a oneDNN user would: primitive descriptors on
 * format_tag_any, reorders from and to the same user layouts the engine
 * gets, everything created once and executed in a loop. Engine and direct
 * runs alternate, so machine load affects both alike. The outputs of the
 * two are compared as a sanity check (exit status 1 on mismatch).
 *
 * ratio = direct median / engine median: > 1 means the engine is faster;
 * best = the same for the fastest run of each (less sensitive to a loaded
 * machine); n = timed iterations. */
#include <getopt.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include "cg/bdesc.h"
#include "cg/dtype.h"
#include "cg/engine.h"

#include "bench_util.h"

#define DNNL_OK(call)                                                          \
  do {                                                                         \
    dnnl_status_t st_ = (call);                                                \
    if (st_ != dnnl_success) {                                                 \
      fprintf(stderr, "direct: %s: %s\n", #call, dnnl_status2str(st_));        \
      goto fail;                                                               \
    }                                                                          \
  } while (0)

/* Iteration cap and per-side time budget for short rows. */
#define MAX_ITERS 200
#define ITER_BUDGET_MS 500.0

typedef struct options {
  const char *problems, *single, *filter;
  int dtypes[4]; /* indexed by cg_dtype */
  int iters, warmup, threads;
  cg_data_format df;
  cg_weights_format wf;
} options;

/* ---- the direct oneDNN sequence --------------------------------------- */

typedef struct direct {
  dnnl_engine_t eng;
  dnnl_stream_t stream;
  dnnl_primitive_t prim, reorder[3];
  dnnl_memory_t user[3], inner[3];
  int arg[3];
} direct;

static int is_deconv(cg_op op) {
  return op == CG_OP_DECONV_BWD_DATA || op == CG_OP_DECONV_BWD_WEIGHTS;
}

static int is_bwd_data(cg_op op) {
  return op == CG_OP_CONV_BWD_DATA || op == CG_OP_DECONV_BWD_DATA;
}

static void direct_free(direct *d) {
  dnnl_primitive_destroy(d->prim);
  for (int i = 0; i < 3; i++) {
    dnnl_primitive_destroy(d->reorder[i]);
    dnnl_memory_destroy(d->user[i]);
    dnnl_memory_destroy(d->inner[i]);
  }
  dnnl_stream_destroy(d->stream);
  dnnl_engine_destroy(d->eng);
  memset(d, 0, sizeof *d);
}

/* User memory descriptor of slot i (0, 1: inputs, 2: output). */
static dnnl_status_t user_md(dnnl_memory_desc_t *md, const cg_geom *g, int i,
                             const dnnl_dims_t src, const dnnl_dims_t wei,
                             const dnnl_dims_t dst, int wnd,
                             dnnl_data_type_t dt) {
  int64_t st[CG_MAX_RANK + 1];
  dnnl_dims_t strides;
  int weights =
      (i == 1 && is_bwd_data(g->op)) || (i == 2 && !is_bwd_data(g->op));
  if (weights) {
    cg_geom_weights_strides(
        g, i == 2 ? g->out_weights_format : g->weights_format, st);
    for (int a = 0; a < wnd; a++)
      strides[a] = st[a + (g->groups > 1 ? 0 : 1)];
    return dnnl_memory_desc_init_by_strides(md, wnd, wei, dt, strides);
  }
  int is_src = i == 2 || (i == 0 && !is_bwd_data(g->op));
  cg_geom_data_strides(g, i == 2 ? g->out_data_format : g->data_format,
                       is_src ? g->ic : g->oc, is_src ? g->in_sp : g->out_sp,
                       st);
  for (int a = 0; a < 2 + g->nsp; a++)
    strides[a] = st[a];
  return dnnl_memory_desc_init_by_strides(md, 2 + g->nsp, is_src ? src : dst,
                                          dt, strides);
}

static int direct_init(direct *d, const cg_geom *g, const void *in0,
                       const void *in1, void *out) {
  dnnl_data_type_t udt = g->dtype == CG_DTYPE_BF16  ? dnnl_bf16
                         : g->dtype == CG_DTYPE_F16 ? dnnl_f16
                                                    : dnnl_f32;
  /* oneDNN 2.6 has no f16 convolution on CPU, and no bf16 one below
   * avx512_core: compute in f32 there, converting in the reorders, as the
   * engine does. */
  dnnl_data_type_t cdt = cg_backend_dtype_native(g->dtype) ? udt : dnnl_f32;
  int grouped = g->groups > 1, nd = 2 + g->nsp, wnd = nd + grouped;
  dnnl_dims_t src = {g->mb, g->ic}, dst = {g->mb, g->oc}, wei = {0};
  dnnl_dims_t strides, dil, pl, pr;
  dnnl_memory_desc_t smd, wmd, dmd;
  dnnl_primitive_desc_t hint = NULL, pd = NULL, rpd = NULL;
  void *ptr[3] = {(void *)in0, (void *)in1, out};

  memset(d, 0, sizeof *d);
  if (grouped)
    wei[0] = g->groups;
  wei[grouped] = g->oc / g->groups;
  wei[grouped + 1] = g->ic / g->groups;
  for (int a = 0; a < g->nsp; a++) {
    if (g->output_padding[a]) {
      fprintf(stderr, "direct: output_padding is not supported here\n");
      return -1;
    }
    src[2 + a] = g->in_sp[a];
    dst[2 + a] = g->out_sp[a];
    wei[grouped + 2 + a] = g->kernel[a];
    strides[a] = g->stride[a];
    dil[a] = g->dilation[a] - 1;
    pl[a] = g->pad_begin[a];
    pr[a] = g->pad_end[a];
  }
  DNNL_OK(dnnl_engine_create(&d->eng, dnnl_cpu, 0));
  DNNL_OK(dnnl_stream_create(&d->stream, d->eng, dnnl_stream_default_flags));
  DNNL_OK(
      dnnl_memory_desc_init_by_tag(&smd, nd, src, cdt, dnnl_format_tag_any));
  DNNL_OK(
      dnnl_memory_desc_init_by_tag(&wmd, wnd, wei, cdt, dnnl_format_tag_any));
  DNNL_OK(
      dnnl_memory_desc_init_by_tag(&dmd, nd, dst, cdt, dnnl_format_tag_any));
  if (!is_deconv(g->op)) {
    dnnl_convolution_desc_t fd, bd;
    DNNL_OK(dnnl_dilated_convolution_forward_desc_init(
        &fd, dnnl_forward_training, dnnl_convolution_direct, &smd, &wmd, NULL,
        &dmd, strides, dil, pl, pr));
    DNNL_OK(dnnl_primitive_desc_create(&hint, &fd, NULL, d->eng, NULL));
    if (is_bwd_data(g->op))
      DNNL_OK(dnnl_dilated_convolution_backward_data_desc_init(
          &bd, dnnl_convolution_direct, &smd, &wmd, &dmd, strides, dil, pl,
          pr));
    else
      DNNL_OK(dnnl_dilated_convolution_backward_weights_desc_init(
          &bd, dnnl_convolution_direct, &smd, &wmd, NULL, &dmd, strides, dil,
          pl, pr));
    DNNL_OK(dnnl_primitive_desc_create(&pd, &bd, NULL, d->eng, hint));
  } else {
    dnnl_deconvolution_desc_t fd, bd;
    DNNL_OK(dnnl_dilated_deconvolution_forward_desc_init(
        &fd, dnnl_forward_training, dnnl_deconvolution_direct, &smd, &wmd, NULL,
        &dmd, strides, dil, pl, pr));
    DNNL_OK(dnnl_primitive_desc_create(&hint, &fd, NULL, d->eng, NULL));
    if (is_bwd_data(g->op))
      DNNL_OK(dnnl_dilated_deconvolution_backward_data_desc_init(
          &bd, dnnl_deconvolution_direct, &smd, &wmd, &dmd, strides, dil, pl,
          pr));
    else
      DNNL_OK(dnnl_dilated_deconvolution_backward_weights_desc_init(
          &bd, dnnl_deconvolution_direct, &smd, &wmd, NULL, &dmd, strides, dil,
          pl, pr));
    DNNL_OK(dnnl_primitive_desc_create(&pd, &bd, NULL, d->eng, hint));
  }
  DNNL_OK(dnnl_primitive_create(&d->prim, pd));

  static const dnnl_query_t q_data[3] = {
      dnnl_query_diff_dst_md, dnnl_query_weights_md, dnnl_query_diff_src_md};
  static const dnnl_query_t q_wei[3] = {
      dnnl_query_src_md, dnnl_query_diff_dst_md, dnnl_query_diff_weights_md};
  static const int a_data[3] = {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS,
                                DNNL_ARG_DIFF_SRC};
  static const int a_wei[3] = {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST,
                               DNNL_ARG_DIFF_WEIGHTS};
  for (int i = 0; i < 3; i++) {
    dnnl_memory_desc_t umd;
    const dnnl_memory_desc_t *pmd = dnnl_primitive_desc_query_md(
        pd, is_bwd_data(g->op) ? q_data[i] : q_wei[i], 0);
    d->arg[i] = is_bwd_data(g->op) ? a_data[i] : a_wei[i];
    DNNL_OK(user_md(&umd, g, i, src, wei, dst, wnd, udt));
    DNNL_OK(dnnl_memory_create(&d->user[i], &umd, d->eng, ptr[i]));
    if (dnnl_memory_desc_equal(&umd, pmd))
      continue;
    DNNL_OK(
        dnnl_memory_create(&d->inner[i], pmd, d->eng, DNNL_MEMORY_ALLOCATE));
    if (i == 2)
      DNNL_OK(dnnl_reorder_primitive_desc_create(&rpd, pmd, d->eng, &umd,
                                                 d->eng, NULL));
    else
      DNNL_OK(dnnl_reorder_primitive_desc_create(&rpd, &umd, d->eng, pmd,
                                                 d->eng, NULL));
    DNNL_OK(dnnl_primitive_create(&d->reorder[i], rpd));
    dnnl_primitive_desc_destroy(rpd);
    rpd = NULL;
  }
  dnnl_primitive_desc_destroy(pd);
  dnnl_primitive_desc_destroy(hint);
  return 0;
fail:
  dnnl_primitive_desc_destroy(rpd);
  dnnl_primitive_desc_destroy(pd);
  dnnl_primitive_desc_destroy(hint);
  direct_free(d);
  return -1;
}

static int direct_run(direct *d) {
  dnnl_exec_arg_t args[3];
  for (int i = 0; i < 2; i++)
    if (d->reorder[i]) {
      args[0] = (dnnl_exec_arg_t){DNNL_ARG_FROM, d->user[i]};
      args[1] = (dnnl_exec_arg_t){DNNL_ARG_TO, d->inner[i]};
      DNNL_OK(dnnl_primitive_execute(d->reorder[i], d->stream, 2, args));
    }
  for (int i = 0; i < 3; i++)
    args[i] =
        (dnnl_exec_arg_t){d->arg[i], d->inner[i] ? d->inner[i] : d->user[i]};
  DNNL_OK(dnnl_primitive_execute(d->prim, d->stream, 3, args));
  if (d->reorder[2]) {
    args[0] = (dnnl_exec_arg_t){DNNL_ARG_FROM, d->inner[2]};
    args[1] = (dnnl_exec_arg_t){DNNL_ARG_TO, d->user[2]};
    DNNL_OK(dnnl_primitive_execute(d->reorder[2], d->stream, 2, args));
  }
  DNNL_OK(dnnl_stream_wait(d->stream));
  return 0;
fail:
  return -1;
}

/* ---- measurement ------------------------------------------------------ */

/* Largest |a - b| relative to the largest |b|. */
static double rel_diff(cg_dtype dt, const void *a, const void *b, size_t n) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < n; i++) {
    double x = cg_load_f32(dt, a, i), y = cg_load_f32(dt, b, i);
    if (!(fabs(x - y) <= err))
      err = isnan(x - y) ? INFINITY : fabs(x - y);
    scale = fmax(scale, fabs(y));
  }
  return scale > 0 ? err / scale : err;
}

/* Benchmarks one op/dtype of a descriptor; returns 0, 1 on an output
 * mismatch, -1 on failure. */
static int bench_one(const options *o, const cg_bdesc *bd, cg_op op,
                     cg_dtype dt, cg_engine *e) {
  cg_bdesc_problem bp;
  cg_geom g;
  char err[256];
  int rc = -1;
  void *in0 = NULL, *in1 = NULL, *out = NULL, *check = NULL;
  double *te = NULL, *td = NULL;
  direct d;
  int have_direct = 0;
  cg_run_info info = {0};

  if (cg_bdesc_problem_init(&bp, bd, op, dt, o->df, o->wf, err, sizeof err) ||
      cg_problem_resolve(&bp.problem, &g, err, sizeof err)) {
    fprintf(stderr, "%s: %s\n", bd->name, err);
    goto out;
  }
  in0 = malloc(g.in_bytes[0]);
  in1 = malloc(g.in_bytes[1]);
  /* Both sides write the same output buffer, so neither gets luckier
   * cache placement of its output than the other. */
  out = calloc(1, g.out_bytes);
  check = calloc(1, g.out_bytes);
  te = calloc(MAX_ITERS, sizeof *te);
  td = calloc(MAX_ITERS, sizeof *td);
  if (!in0 || !in1 || !out || !check || !te || !td) {
    fprintf(stderr, "%s: out of memory\n", bd->name);
    goto out;
  }
  uint64_t seed = 1;
  cg_fill_uniform(dt, in0, g.in_elems[0], &seed);
  cg_fill_uniform(dt, in1, g.in_elems[1], &seed);
  if (direct_init(&d, &g, in0, in1, out))
    goto out;
  have_direct = 1;

  double warm_ms = 0;
  for (int i = 0; i < o->warmup; i++) {
    double t0 = bench_now_ms();
    if (cg_engine_run(e, &g, in0, in1, out, &info, err, sizeof err)) {
      fprintf(stderr, "%s: engine: %s\n", bd->name, err);
      goto out;
    }
    warm_ms = bench_now_ms() - t0;
    if (direct_run(&d))
      goto out;
  }
  /* Short rows get more iterations (up to ~0.5 s per side) so that the
   * median is not at the mercy of a few scheduler hiccups. */
  int iters = o->iters;
  if (warm_ms > 0 && warm_ms * iters < ITER_BUDGET_MS)
    iters = (int)(ITER_BUDGET_MS / warm_ms);
  if (iters > MAX_ITERS)
    iters = MAX_ITERS;
  if (iters < o->iters)
    iters = o->iters;
  /* Alternate which side runs first so neither always finds the inputs
   * warm in cache from the other. */
  for (int i = 0; i < iters; i++) {
    for (int side = 0; side < 2; side++) {
      int engine_turn = (side == 0) == (i % 2 == 0);
      double t0 = bench_now_ms();
      if (engine_turn) {
        if (cg_engine_run(e, &g, in0, in1, out, &info, err, sizeof err)) {
          fprintf(stderr, "%s: engine: %s\n", bd->name, err);
          goto out;
        }
        te[i] = bench_now_ms() - t0;
      } else {
        if (direct_run(&d))
          goto out;
        td[i] = bench_now_ms() - t0;
      }
    }
  }
  /* bench_median() sorts, so the minimum is element 0 afterwards. */
  double me = bench_median(te, iters), md = bench_median(td, iters);
  double best = td[0] / te[0];
  /* The check: the engine's result, then the direct one over it. */
  if (cg_engine_run(e, &g, in0, in1, out, &info, err, sizeof err)) {
    fprintf(stderr, "%s: engine: %s\n", bd->name, err);
    goto out;
  }
  memcpy(check, out, g.out_bytes);
  memset(out, 0, g.out_bytes);
  if (direct_run(&d))
    goto out;
  double diff = rel_diff(dt, check, out, g.out_elems);
  /* Same kernels on the same data: only the f32 path of f16 may round
   * differently. */
  double limit = dt == CG_DTYPE_F32 ? 1e-5 : 2 * cg_dtype_epsilon(dt);
  printf("%-42s %-28s %-5s %10.3f %9.1f %10.3f %6.2f %6.2f %4d  %-9s %-28s "
         "%s\n",
         bd->name, cg_op_name(op), cg_dtype_name(dt), me, g.flops / (me * 1e6),
         md, md / me, best, iters,
         info.path == CG_PATH_NATIVE ? "native" : "via-f32", info.impl,
         diff <= limit ? "ok" : "MISMATCH");
  fflush(stdout);
  rc = diff <= limit ? 0 : 1;
out:
  if (have_direct)
    direct_free(&d);
  free(in0);
  free(in1);
  free(out);
  free(check);
  free(te);
  free(td);
  return rc;
}

static int bench_desc(const options *o, const cg_bdesc *bd, cg_engine *e) {
  cg_op ops[2] = {CG_OP_CONV_BWD_DATA, CG_OP_CONV_BWD_WEIGHTS};
  int rc = 0;
  if (bd->deconv) {
    ops[0] = CG_OP_DECONV_BWD_DATA;
    ops[1] = CG_OP_DECONV_BWD_WEIGHTS;
  }
  if (o->filter && !strstr(bd->name, o->filter))
    return 0;
  for (int dt = CG_DTYPE_F32; dt <= CG_DTYPE_F16; dt++)
    for (int k = 0; k < 2; k++)
      if (o->dtypes[dt]) {
        int r = bench_one(o, bd, ops[k], (cg_dtype)dt, e);
        if (r && !rc)
          rc = r;
      }
  return rc;
}

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: cg_bench_kernels [options]\n"
      "  -p, --problems FILE   benchdnn descriptor list (default %s)\n"
      "  -P, --problem DESC    one descriptor instead of a file\n"
      "  -f, --filter TEXT     only problems whose name contains TEXT\n"
      "  -d, --dtypes LIST     comma list of f32,bf16,f16 (default f32,bf16)\n"
      "  -n, --iters N         least timed iterations per row (default 15;\n"
      "                        short rows run more, up to 0.5 s a side)\n"
      "  -w, --warmup N        untimed runs first (default 3)\n"
      "  -t, --threads N       OpenMP threads (default: omp_get_max_threads)\n"
      "  -l, --layout FMT      data layout NCX or NXC (default NXC)\n"
      "  -W, --weights FMT     weights layout (default: the op's default)\n"
      "  -h, --help\n",
      CG_BENCH_PROBLEMS);
}

int main(int argc, char **argv) {
  options o = {.problems = CG_BENCH_PROBLEMS,
               .dtypes = {0, 1, 1, 0},
               .iters = 15,
               .warmup = 3,
               .df = CG_DATA_NXC,
               .wf = CG_WEIGHTS_DEFAULT};
  static const struct option longopts[] = {
      {"problems", required_argument, NULL, 'p'},
      {"problem", required_argument, NULL, 'P'},
      {"filter", required_argument, NULL, 'f'},
      {"dtypes", required_argument, NULL, 'd'},
      {"iters", required_argument, NULL, 'n'},
      {"warmup", required_argument, NULL, 'w'},
      {"threads", required_argument, NULL, 't'},
      {"layout", required_argument, NULL, 'l'},
      {"weights", required_argument, NULL, 'W'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  int c, status = 0;
  char err[256];
  cg_engine *e = NULL;
  FILE *f = NULL;

  while ((c = getopt_long(argc, argv, "p:P:f:d:n:w:t:l:W:h", longopts, NULL)) !=
         -1) {
    switch (c) {
    case 'p':
      o.problems = optarg;
      break;
    case 'P':
      o.single = optarg;
      break;
    case 'f':
      o.filter = optarg;
      break;
    case 'd':
      if (bench_parse_dtypes(optarg, o.dtypes)) {
        fprintf(stderr, "--dtypes: unknown dtype in \"%s\"\n", optarg);
        return 2;
      }
      break;
    case 'n':
      o.iters = atoi(optarg);
      break;
    case 'w':
      o.warmup = atoi(optarg);
      break;
    case 't':
      o.threads = atoi(optarg);
      break;
    case 'l':
      if (cg_data_format_parse(optarg, &o.df)) {
        fprintf(stderr, "--layout: expected NCX or NXC, got \"%s\"\n", optarg);
        return 2;
      }
      break;
    case 'W':
      if (cg_weights_format_parse(optarg, &o.wf)) {
        fprintf(stderr, "--weights: unknown format \"%s\"\n", optarg);
        return 2;
      }
      break;
    case 'h':
      usage(stdout);
      return 0;
    default:
      usage(stderr);
      return 2;
    }
  }
  if (o.iters < 1 || o.iters > MAX_ITERS || o.warmup < 0 || o.threads < 0) {
    fprintf(stderr, "--iters must be in 1..%d, --warmup and --threads >= 0\n",
            MAX_ITERS);
    return 2;
  }
  if (o.threads)
    omp_set_num_threads(o.threads); /* for the direct runs */
  cg_engine_config cfg = {o.threads ? o.threads : omp_get_max_threads(), 0};
  if (cg_engine_new(&e, &cfg, err, sizeof err)) {
    fprintf(stderr, "engine: %s\n", err);
    return 1;
  }
  printf("# oneDNN %s, ISA %s, %d threads, data %s, weights %s, >= %d iters "
         "(median)\n",
         cg_backend_version(), cg_backend_isa(), cfg.threads,
         cg_data_format_name(o.df),
         o.wf == CG_WEIGHTS_DEFAULT ? "default" : cg_weights_format_name(o.wf),
         o.iters);
  printf("%-42s %-28s %-5s %10s %9s %10s %6s %6s %4s  %-9s %-28s %s\n",
         "# problem", "op", "dtype", "engine_ms", "GFLOP/s", "direct_ms",
         "ratio", "best", "n", "path", "impl", "check");

  if (o.single) {
    cg_bdesc bd;
    int is_problem;
    if (cg_bdesc_parse_line(o.single, &bd, &is_problem, err, sizeof err) ||
        !is_problem) {
      fprintf(stderr, "--problem: %s\n", is_problem ? err : "no descriptor");
      status = 2;
      goto out;
    }
    if (!bd.name[0])
      snprintf(bd.name, sizeof bd.name, "%.63s", o.single);
    status = bench_desc(&o, &bd, e) ? 1 : 0;
    goto out;
  }
  f = fopen(o.problems, "r");
  if (!f) {
    fprintf(stderr, "cannot open %s\n", o.problems);
    status = 1;
    goto out;
  }
  char line[512];
  for (int ln = 1; fgets(line, sizeof line, f); ln++) {
    cg_bdesc bd;
    int is_problem;
    if (cg_bdesc_parse_line(line, &bd, &is_problem, err, sizeof err)) {
      fprintf(stderr, "%s:%d: %s\n", o.problems, ln, err);
      status = 1;
      continue;
    }
    if (is_problem && bench_desc(&o, &bd, e))
      status = 1;
  }
out:
  if (f)
    fclose(f);
  cg_engine_free(e);
  return status;
}
