/* bench_check.c - what the result checks (cg/check.h) cost against the
 * compute they check, on the rows of tests/bench/problems.txt (by default
 * the ResNet-50 ones): for each row, op (backward data and weights) and
 * dtype, the engine's run and the check of its result, in interleaved
 * rounds, with the same OpenMP threads (a worker's team). Prints the
 * medians and the server's compute with checks over without, at rate 1
 * and at a given rate (the server's default): 1 + rate x check / run.
 *
 *   cg_bench_check [--rows PREFIX] [--rounds N] [--rate R] [--threads T]
 *                  [--dtypes f32,bf16,f16] [--data-format NCX|NXC]
 *
 * Heap settings as the server's (main.c): freed blocks of up to 32 MiB
 * stay in the heap, so buffers are not faulted in afresh every run.
 *
 * A benchmark: it prints figures and asserts nothing but that the checks
 * pass. */
#include <getopt.h>
#include <malloc.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg/bdesc.h"
#include "cg/check.h"
#include "cg/dtype.h"
#include "cg/engine.h"

#include "bench_util.h"

#define MAX_ROUNDS 64

typedef struct options {
  const char *rows;
  cg_data_format df;
  int rounds, threads;
  double rate;
  int dtypes[4];
} options;

/* One row, op and dtype; returns 0, or -1 on failure. */
static int bench_one(const options *o, const cg_bdesc *bd, cg_op op,
                     cg_dtype dt, cg_engine *e, double *worst_default) {
  cg_bdesc_problem bp;
  cg_geom g;
  char err[256];
  int rc = -1;
  double t_run[MAX_ROUNDS], t_check[MAX_ROUNDS];
  if (cg_bdesc_problem_init(&bp, bd, op, dt, o->df, CG_WEIGHTS_DEFAULT, err,
                            sizeof err) ||
      cg_problem_resolve(&bp.problem, &g, err, sizeof err)) {
    fprintf(stderr, "%s: %s\n", bd->name, err);
    return -1;
  }
  void *in0 = malloc(g.in_bytes[0]), *in1 = malloc(g.in_bytes[1]);
  void *out = malloc(g.out_bytes);
  if (!in0 || !in1 || !out)
    goto out;
  uint64_t seed = 1;
  cg_fill_uniform(dt, in0, g.in_elems[0], &seed);
  cg_fill_uniform(dt, in1, g.in_elems[1], &seed);
  cg_check_result r;
  cg_run_info info = {0};
  /* Warm: primitives made, buffers grown. */
  if (cg_engine_run(e, &g, in0, in1, out, &info, err, sizeof err) ||
      cg_check_run(&g, in0, in1, out, 1, o->threads, &r, err, sizeof err))
    goto fail;
  for (int i = 0; i < o->rounds; i++) {
    double t0 = bench_now_ms();
    if (cg_engine_run(e, &g, in0, in1, out, &info, err, sizeof err))
      goto fail;
    double t1 = bench_now_ms();
    if (cg_check_run(&g, in0, in1, out, (uint64_t)i, o->threads, &r, err,
                     sizeof err))
      goto fail;
    t_check[i] = bench_now_ms() - t1;
    t_run[i] = t1 - t0;
    if (r.failed) {
      fprintf(stderr, "%s %s %s: the check failed (|diff| %g > %g)\n", bd->name,
              cg_op_name(op), cg_dtype_name(dt), r.worst_diff, r.worst_tol);
      goto out;
    }
  }
  double run = bench_median(t_run, o->rounds),
         chk = bench_median(t_check, o->rounds);
  double at_default = 1 + o->rate * chk / run;
  if (at_default > *worst_default)
    *worst_default = at_default;
  printf("%-44s %-28s %-4s run %9.3f ms  check %8.3f ms  rate 1: %6.3fx  "
         "rate %g: %6.4fx  (%s)\n",
         bd->name, cg_op_name(op), cg_dtype_name(dt), run, chk,
         (run + chk) / run, o->rate, at_default, info.impl);
  fflush(stdout);
  rc = 0;
  goto out;
fail:
  fprintf(stderr, "%s %s %s: %s\n", bd->name, cg_op_name(op), cg_dtype_name(dt),
          err);
out:
  free(in0);
  free(in1);
  free(out);
  return rc;
}

int main(int argc, char **argv) {
  options o = {"resnet50", CG_DATA_NCX, 7, 0, 0.002, {0}};
  const char *dtypes = "f32,bf16";
  static const struct option longs[] = {
      {"rows", required_argument, NULL, 'r'},
      {"rounds", required_argument, NULL, 'n'},
      {"rate", required_argument, NULL, 'R'},
      {"threads", required_argument, NULL, 't'},
      {"dtypes", required_argument, NULL, 'd'},
      {"data-format", required_argument, NULL, 'f'},
      {NULL, 0, NULL, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
    switch (c) {
    case 'r':
      o.rows = optarg;
      break;
    case 'n':
      o.rounds = atoi(optarg);
      break;
    case 'R':
      o.rate = atof(optarg);
      break;
    case 't':
      o.threads = atoi(optarg);
      break;
    case 'd':
      dtypes = optarg;
      break;
    case 'f':
      if (cg_data_format_parse(optarg, &o.df) != 0) {
        fprintf(stderr, "--data-format: NCX or NXC\n");
        return 2;
      }
      break;
    default:
      fprintf(stderr,
              "usage: %s [--rows PREFIX] [--rounds N] [--rate R] "
              "[--threads T] [--dtypes LIST]\n",
              argv[0]);
      return 2;
    }
  }
  if (o.rounds < 1 || o.rounds > MAX_ROUNDS) {
    fprintf(stderr, "--rounds: 1..%d\n", MAX_ROUNDS);
    return 2;
  }
  if (bench_parse_dtypes(dtypes, o.dtypes)) {
    fprintf(stderr, "--dtypes: f32, bf16, f16, comma-separated\n");
    return 2;
  }
  if (o.threads < 1)
    o.threads = omp_get_max_threads();
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  cg_engine *e;
  char err[256];
  cg_engine_config cfg = {o.threads, 0};
  if (cg_engine_new(&e, &cfg, err, sizeof err)) {
    fprintf(stderr, "engine: %s\n", err);
    return 1;
  }
  printf("oneDNN %s on %s, %d threads, %s, %d interleaved rounds, medians\n",
         cg_backend_version(), cg_backend_isa(), o.threads,
         cg_data_format_name(o.df), o.rounds);
  FILE *f = fopen(CG_BENCH_PROBLEMS, "r");
  if (!f) {
    fprintf(stderr, "%s: cannot open\n", CG_BENCH_PROBLEMS);
    cg_engine_free(e);
    return 1;
  }
  char line[1024];
  int failed = 0;
  double worst = 1;
  while (fgets(line, sizeof line, f)) {
    cg_bdesc bd;
    int is_problem;
    if (cg_bdesc_parse_line(line, &bd, &is_problem, err, sizeof err) ||
        !is_problem || strncmp(bd.name, o.rows, strlen(o.rows)) != 0)
      continue;
    cg_op ops[2] = {bd.deconv ? CG_OP_DECONV_BWD_DATA : CG_OP_CONV_BWD_DATA,
                    bd.deconv ? CG_OP_DECONV_BWD_WEIGHTS
                              : CG_OP_CONV_BWD_WEIGHTS};
    for (int k = 0; k < 2; k++)
      for (int dt = CG_DTYPE_F32; dt <= CG_DTYPE_F16; dt++)
        if (o.dtypes[dt])
          failed |= bench_one(&o, &bd, ops[k], (cg_dtype)dt, e, &worst) != 0;
  }
  fclose(f);
  cg_engine_free(e);
  printf("worst compute with checks / without at rate %g: %.4fx\n", o.rate,
         worst);
  return failed;
}
