/* bench_threads.c - figures for the adaptive thread policy (a benchmark,
 * not a test: it prints figures and asserts nothing). Issue 14, item 3:
 *
 * (a) The default server (no flags) and one caller: for every row of the
 *     problem list, both gradient ops of its family, in f32 and bf16, the
 *     server's compute_ms (its ResultHeader) against cg_engine run in this
 *     process with every core on the same layouts. Target <= 1.10.
 * (b) 8 concurrent callers on the ResNet rows, f32: calls per second of
 *     the default server against the best static setting of
 *     --workers/--threads-per-worker (one worker a core, or one worker
 *     with every core). Target >= 0.95.
 *
 * Every rep interleaves the variants it compares (the shared VM drifts by
 * tens of percent within a minute), and the figures are medians over
 * reps. --spin N starts the servers with GOMP_SPINCOUNT=N instead of the
 * server's own wait policy, to compare wait policies. */
#include <getopt.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "bench.h"
#include "cg/bdesc.h"
#include "cg/dtype.h"
#include "cg/engine.h"
#include "cgc/client.h"
#include "ts.h"

#define CALLERS 8
#define MAX_ROWS 64

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One Compute call into out; its server-side compute_ms in *compute. */
static int call(cgc_channel *ch, const bench_prob *p, void *out,
                double *compute) {
  cgc_request r;
  bench_request_of(&r, p);
  cgc_tensor t;
  cgc_result res;
  cgc_status st;
  int rc = cgc_compute_into(ch, &r, out, p->g.out_bytes, &t, &res, &st);
  if (rc != 0)
    fprintf(stderr, "  compute failed: %s\n", st.message);
  else if (compute)
    *compute = res.compute_ms;
  return rc;
}

typedef struct server {
  const char *name;
  const char *args[8];
  ts_server srv;
  cgc_channel *ch[CALLERS];
  int up;
} server;

static int server_up(server *s) {
  char err[256];
  if (ts_server_start(&s->srv, s->args) != 0)
    return -1;
  for (int i = 0; i < CALLERS; i++)
    if (cgc_channel_new(&s->ch[i], s->srv.target, NULL, err, sizeof err))
      return -1;
  s->up = 1;
  return 0;
}

static void server_down(server *s) {
  for (int i = 0; i < CALLERS; i++)
    cgc_channel_free(s->ch[i]);
  if (s->up)
    ts_server_stop(&s->srv, SIGTERM, 60000);
}

static int rows_read(const char *path, cg_bdesc *rows) {
  FILE *f = fopen(path, "r");
  char line[512], err[256];
  int n = 0;
  while (f && n < MAX_ROWS && fgets(line, sizeof line, f)) {
    int is_problem = 0;
    if (cg_bdesc_parse_line(line, &rows[n], &is_problem, err, sizeof err) ==
            0 &&
        is_problem)
      n++;
  }
  if (f)
    fclose(f);
  return n;
}

static void ops_of(const cg_bdesc *d, cg_op ops[2]) {
  ops[0] = d->deconv ? CG_OP_DECONV_BWD_DATA : CG_OP_CONV_BWD_DATA;
  ops[1] = d->deconv ? CG_OP_DECONV_BWD_WEIGHTS : CG_OP_CONV_BWD_WEIGHTS;
}

/* ---- (a) one caller ---- */

static void figure_a(const cg_bdesc *rows, int nrows, int reps, server *s) {
  cg_engine *e = NULL;
  cg_engine_config ecfg = {.threads = omp_get_num_procs()};
  char err[256];
  if (cg_engine_new(&e, &ecfg, err, sizeof err) != 0) {
    fprintf(stderr, "engine: %s\n", err);
    return;
  }
  printf("\n(a) default server, one caller: server compute_ms / in-process "
         "cg_engine with %d threads (target <= 1.10)\n",
         ecfg.threads);
  printf("%-42s %-28s %-5s %9s %9s %6s %6s\n", "problem", "op", "dtype",
         "inproc ms", "server ms", "ratio", "best");
  int total = 0, ok = 0;
  double worst = 0;
  static const cg_dtype dts[2] = {CG_DTYPE_F32, CG_DTYPE_BF16};
  for (int r = 0; r < nrows; r++) {
    cg_op ops[2];
    ops_of(&rows[r], ops);
    for (int k = 0; k < 4; k++) {
      bench_prob p;
      if (bench_prob_init(&p, &rows[r], ops[k % 2], dts[k / 2]) != 0) {
        bench_prob_free(&p);
        continue;
      }
      double *ti = calloc((size_t)reps, sizeof *ti);
      double *ts = calloc((size_t)reps, sizeof *ts);
      double warm;
      int good = ti && ts &&
                 cg_engine_run(e, &p.g, p.in[0], p.in[1], p.out, NULL, err,
                               sizeof err) == 0 &&
                 call(s->ch[0], &p, p.out, &warm) == 0;
      for (int i = 0; good && i < reps; i++) {
        double t0 = ts_now_ms();
        good = cg_engine_run(e, &p.g, p.in[0], p.in[1], p.out, NULL, err,
                             sizeof err) == 0;
        ti[i] = ts_now_ms() - t0;
        /* This process's idle OpenMP threads spin for a while after a
         * run: the pause keeps them off the server's cores. */
        usleep(30 * 1000);
        good = good && call(s->ch[0], &p, p.out, &ts[i]) == 0;
      }
      if (good) {
        double best = ts[0], besti = ti[0];
        for (int i = 1; i < reps; i++) {
          best = ts[i] < best ? ts[i] : best;
          besti = ti[i] < besti ? ti[i] : besti;
        }
        double mi = median(ti, reps), ms = median(ts, reps);
        printf("%-42.42s %-28s %-5s %9.2f %9.2f %6.2f %6.2f\n", rows[r].name,
               cg_op_name(ops[k % 2]), cg_dtype_name(dts[k / 2]), mi, ms,
               ms / mi, best / besti);
        fflush(stdout);
        total++;
        ok += ms / mi <= 1.10;
        worst = ms / mi > worst ? ms / mi : worst;
      }
      free(ti);
      free(ts);
      bench_prob_free(&p);
    }
  }
  printf("(a) %d of %d rows within 1.10, worst %.2f\n", ok, total, worst);
  cg_engine_free(e);
}

/* ---- (b) 8 callers ---- */

typedef struct caller {
  cgc_channel *ch;
  const bench_prob *p;
  void *out;
  double until;
  long calls;
} caller;

static void *caller_main(void *v) {
  caller *c = v;
  while (ts_now_ms() < c->until)
    if (call(c->ch, c->p, c->out, NULL) == 0)
      c->calls++;
  return NULL;
}

/* Calls per second of CALLERS threads on s for secs seconds. */
static double throughput(server *s, const bench_prob *p, double secs) {
  caller c[CALLERS];
  pthread_t th[CALLERS];
  double until = ts_now_ms() + secs * 1e3;
  long calls = 0;
  for (int i = 0; i < CALLERS; i++) {
    c[i] = (caller){s->ch[i], p, malloc(p->g.out_bytes), until, 0};
    pthread_create(&th[i], NULL, caller_main, &c[i]);
  }
  for (int i = 0; i < CALLERS; i++) {
    pthread_join(th[i], NULL);
    calls += c[i].calls;
    free(c[i].out);
  }
  return (double)calls / secs;
}

static void figure_b(const cg_bdesc *rows, int nrows, int reps, double secs,
                     server *sv, int nsv) {
  printf("\n(b) %d concurrent callers, f32, calls/s (median of %d reps of "
         "%.1f s, servers interleaved); ratio = default / best static "
         "(target >= 0.95)\n",
         CALLERS, reps, secs);
  printf("%-42s %-28s", "problem", "op");
  for (int k = 0; k < nsv; k++)
    printf(" %10.10s", sv[k].name);
  printf(" %6s\n", "ratio");
  int total = 0, ok = 0;
  double worst = 10;
  for (int r = 0; r < nrows; r++) {
    if (strncmp(rows[r].name, "resnet", 6) != 0)
      continue;
    cg_op ops[2];
    ops_of(&rows[r], ops);
    for (int k = 0; k < 2; k++) {
      bench_prob p;
      if (bench_prob_init(&p, &rows[r], ops[k], CG_DTYPE_F32) != 0) {
        bench_prob_free(&p);
        continue;
      }
      double tp[8][32], med[8];
      for (int i = 0; i < reps && i < 32; i++)
        for (int v = 0; v < nsv; v++) {
          if (i == 0) /* warm: primitives and buffers */
            throughput(&sv[v], &p, secs / 4);
          tp[v][i] = throughput(&sv[v], &p, secs);
        }
      printf("%-42.42s %-28s", rows[r].name, cg_op_name(ops[k]));
      double best_static = 0;
      for (int v = 0; v < nsv; v++) {
        med[v] = median(tp[v], reps < 32 ? reps : 32);
        printf(" %10.1f", med[v]);
        if (v > 0 && med[v] > best_static)
          best_static = med[v];
      }
      double ratio = med[0] / best_static;
      printf(" %6.2f\n", ratio);
      fflush(stdout);
      total++;
      ok += ratio >= 0.95;
      worst = ratio < worst ? ratio : worst;
      bench_prob_free(&p);
    }
  }
  printf("(b) %d of %d rows at >= 0.95, worst %.2f\n", ok, total, worst);
}

int main(int argc, char **argv) {
  const char *problems = CGS_BENCH_PROBLEMS, *spin = NULL;
  int reps = 7, reps_b = 3, only = 0;
  double secs = 2;
  static const struct option lo[] = {{"problems", required_argument, 0, 'p'},
                                     {"reps", required_argument, 0, 'r'},
                                     {"reps-b", required_argument, 0, 'R'},
                                     {"seconds", required_argument, 0, 's'},
                                     {"spin", required_argument, 0, 'S'},
                                     {"only", required_argument, 0, 'o'},
                                     {"help", no_argument, 0, 'h'},
                                     {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    switch (c) {
    case 'p':
      problems = optarg;
      break;
    case 'r':
      reps = atoi(optarg) > 0 ? atoi(optarg) : 1;
      break;
    case 'R':
      reps_b = atoi(optarg) > 0 ? atoi(optarg) : 1;
      break;
    case 's':
      secs = atof(optarg) > 0 ? atof(optarg) : 1;
      break;
    case 'S':
      spin = optarg;
      break;
    case 'o':
      only = optarg[0];
      break;
    default:
      printf("usage: %s [--problems FILE] [--reps N] [--reps-b N] "
             "[--seconds S] [--spin GOMP_SPINCOUNT] [--only a|b]\n",
             argv[0]);
      return c == 'h' ? 0 : 2;
    }
  }
  static cg_bdesc rows[MAX_ROWS];
  int nrows = rows_read(problems, rows);
  if (nrows == 0) {
    fprintf(stderr, "no problems in %s\n", problems);
    return 1;
  }
  /* This process's libgomp has read its environment already. */
  if (spin)
    setenv("GOMP_SPINCOUNT", spin, 1);
  grpc_init();
  printf("cpu isa %s, oneDNN %s, %d cores this process may use\n",
         cg_backend_isa(), cg_backend_version(), omp_get_num_procs());
  server sv[3] = {
      {.name = "default", .args = {NULL}},
      {.name = "2x1 static",
       .args = {"--workers", "2", "--threads-per-worker", "1", NULL}},
      {.name = "1x2 static",
       .args = {"--workers", "1", "--threads-per-worker", "2", NULL}},
  };
  int nsv = only == 'a' ? 1 : 3, rc = 0;
  for (int i = 0; i < nsv && rc == 0; i++) {
    rc = server_up(&sv[i]);
    if (rc == 0)
      printf("%-10s %s", sv[i].name, sv[i].srv.ready);
  }
  if (rc == 0 && only != 'b')
    figure_a(rows, nrows, reps, &sv[0]);
  if (rc == 0 && only != 'a')
    figure_b(rows, nrows, reps_b, secs, sv, nsv);
  for (int i = 0; i < nsv; i++)
    server_down(&sv[i]);
  grpc_shutdown();
  return rc == 0 ? 0 : 1;
}
