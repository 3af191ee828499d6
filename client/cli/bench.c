/* bench.c - `convgrad bench`: end-to-end latency percentiles and
 * throughput for a benchdnn-style problem list (cg/bdesc.h) at a given
 * concurrency, as a table or JSON, with the retries the calls needed and
 * the calls that failed. Threads share one channel. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cJSON.h>

#include "cli.h"

static const char cgc__bench_help[] =
    "Usage: convgrad bench (--problems FILE | --problem DESC) [flags] "
    "[options]\n"
    "Measures end-to-end latency (p50/p90/p99) and throughput per problem\n"
    "and op, with N concurrent callers sharing one channel.\n"
    "  --problems FILE  benchdnn-style list: one descriptor per line,\n"
    "                   'deconv:' marks a deconvolution, '#' comments\n"
    "  --problem DESC   one descriptor (repeatable)\n"
    "  --deconv         --problem descriptors are deconvolutions\n"
    "  --op NAME        only this op (default: both data and weights\n"
    "                   gradients of each descriptor's family)\n"
    "  --dtype T        f32 (default), bf16, f16\n"
    "  --data-format F --weights-format F   layouts (default NXC, XIO/XOI)\n"
    "  --concurrency N  concurrent callers (default 1)\n"
    "  --requests N     timed requests per row (default 200)\n"
    "  --duration S     end each row's timed part after S seconds, if\n"
    "                   its requests are not all done by then\n"
    "  --warmup N       untimed requests per row first (default 10)\n"
    "  --json           print JSON instead of a table\n"
    "  --shm            pass tensors in a shared-memory region per caller\n"
    "                   (a server on this host: unix:PATH or loopback)\n"
    "Calls refused with \"retry later\" are retried (--retries); the\n"
    "retries column counts them. A call that still fails is counted in\n"
    "the errors column and left out of the latencies; the run goes on, and\n"
    "exits with the first failure's code at the end.\n";

#define CGC__MAX_PROBLEMS 256

typedef struct cgc__bench_row {
  cgc_spec spec;
  cg_geom geom;
  char name[64];
  void *in[2];
  /* results */
  double *lat_ms; /* by request; < 0 for a failed call */
  atomic_long next;
  double stop_s;       /* no request starts after this; 0: none */
  long n, errors, ran; /* ran: requests started */
  long retries;
  double compute_ms_sum, queue_ms_sum;
  double wall_s;
  int first_rc;
  cgc_status first_st;
  pthread_mutex_t mu;
} cgc__bench_row;

typedef struct cgc__bench_worker {
  cgc_channel *ch;
  cgc__bench_row *row;
  int shm; /* --shm */
} cgc__bench_worker;

/* Keeps a caller's first failure as the row's. */
static void cgc__bench_failed(cgc__bench_row *r, int rc, const cgc_status *st) {
  pthread_mutex_lock(&r->mu);
  if (!r->first_rc) {
    r->first_rc = rc;
    r->first_st = *st;
  }
  pthread_mutex_unlock(&r->mu);
}

static double cgc__now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *cgc__bench_thread(void *arg) {
  cgc__bench_worker *w = arg;
  cgc__bench_row *r = w->row;
  cgc_request req;
  cgc_spec_request(&r->spec, r->in[0], r->geom.in_bytes[0], r->in[1],
                   r->geom.in_bytes[1], &req);
  double qsum = 0, csum = 0;
  long errs = 0, retries = 0;
  /* One result buffer per thread, reused like a trainer's gradient
   * buffer: the figures leave out allocation and first-touch faults. With
   * --shm it lies in the thread's region, beside the inputs' copies. */
  size_t cap = r->geom.out_bytes ? r->geom.out_bytes : 1;
  cgc_cli_shm m = {0};
  void *buf = NULL;
  if (w->shm) {
    size_t out_bytes[CG_GRAD_COUNT] = {0};
    int g = cg_op_outputs_weights(r->geom.op) ? CG_GRAD_DIFF_WEIGHTS
                                              : CG_GRAD_DIFF_SRC;
    int rc;
    cgc_status st;
    out_bytes[g] = cap;
    if (cgc_cli_shm_stage(&m, w->ch, &req, out_bytes, &rc, &st) != 0) {
      cgc__bench_failed(r, rc, &st);
      pthread_mutex_lock(&r->mu);
      r->errors++;
      pthread_mutex_unlock(&r->mu);
      cgc_cli_shm_close(&m);
      return NULL;
    }
    buf = m.into[g];
  } else {
    buf = malloc(cap);
  }
  for (;;) {
    double t0 = cgc__now_s();
    if (r->stop_s > 0 && t0 >= r->stop_s)
      break;
    long i = atomic_fetch_add(&r->next, 1);
    if (i >= r->n)
      break;
    cgc_tensor out;
    cgc_result res = {.attempts = 1};
    cgc_status st;
    int rc = CG_ENOMEM;
    if (buf)
      rc = cgc_compute_into(w->ch, &req, buf, cap, &out, &res, &st);
    else
      st = (cgc_status){GRPC_STATUS_RESOURCE_EXHAUSTED,
                        "out of memory for the result buffer"};
    r->lat_ms[i] = (cgc__now_s() - t0) * 1e3;
    retries += res.attempts > 1 ? res.attempts - 1 : 0;
    if (rc) {
      r->lat_ms[i] = -1;
      errs++;
      cgc__bench_failed(r, rc, &st);
    } else {
      qsum += res.queue_ms;
      csum += res.compute_ms;
    }
  }
  if (w->shm)
    cgc_cli_shm_close(&m);
  else
    free(buf);
  pthread_mutex_lock(&r->mu);
  r->errors += errs;
  r->retries += retries;
  r->queue_ms_sum += qsum;
  r->compute_ms_sum += csum;
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

static int cgc__cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v; 0 when empty. */
static double cgc__pct(const double *v, long n, double p) {
  if (n == 0)
    return 0;
  long k = (long)(p / 100.0 * (double)n + 0.999999) - 1;
  if (k < 0)
    k = 0;
  if (k >= n)
    k = n - 1;
  return v[k];
}

/* Runs warmup then n timed requests of row r on `conc` threads, for at
 * most duration_s seconds (0: no bound); r->n becomes the number of
 * successful calls, their latencies sorted first in r->lat_ms. */
static int cgc__bench_row_run(cgc_channel *ch, cgc__bench_row *r, long warmup,
                              long n, double duration_s, int conc, int shm) {
  pthread_t th[256];
  cgc__bench_worker w = {ch, r, shm};
  r->lat_ms = calloc((size_t)(n > warmup ? n : warmup) + 1, sizeof(double));
  if (!r->lat_ms)
    return CGC_EXIT_INTERNAL;
  pthread_mutex_init(&r->mu, NULL);
  r->n = warmup;
  atomic_store(&r->next, 0);
  cgc__bench_thread(&w);
  r->errors = r->retries = 0;
  r->first_rc = 0; /* the warmup's failures are not the row's */
  r->queue_ms_sum = r->compute_ms_sum = 0;
  r->n = n;
  atomic_store(&r->next, 0);
  double t0 = cgc__now_s();
  r->stop_s = duration_s > 0 ? t0 + duration_s : 0;
  int started = 0;
  for (; started < conc; started++)
    if (pthread_create(&th[started], NULL, cgc__bench_thread, &w) != 0)
      break;
  if (started == 0)
    cgc__bench_thread(&w);
  for (int i = 0; i < started; i++)
    pthread_join(th[i], NULL);
  r->wall_s = cgc__now_s() - t0;
  long ran = atomic_load(&r->next), ok = 0;
  r->ran = ran < n ? ran : n;
  for (long i = 0; i < r->ran; i++)
    if (r->lat_ms[i] >= 0)
      r->lat_ms[ok++] = r->lat_ms[i];
  r->n = ok;
  qsort(r->lat_ms, (size_t)ok, sizeof(double), cgc__cmp_double);
  return 0;
}

/* Adds the rows of descriptor d (text: how it was written, the row name
 * when the descriptor has no n<name> of its own). */
static int cgc__bench_add(cgc__bench_row *rows, int *nrows, const cg_bdesc *d,
                          const char *text, cg_op only, cg_dtype dt,
                          cg_data_format df, cg_weights_format wf) {
  cg_op ops[2];
  if (d->deconv) {
    ops[0] = CG_OP_DECONV_BWD_DATA;
    ops[1] = CG_OP_DECONV_BWD_WEIGHTS;
  } else {
    ops[0] = CG_OP_CONV_BWD_DATA;
    ops[1] = CG_OP_CONV_BWD_WEIGHTS;
  }
  for (int i = 0; i < 2; i++) {
    char err[256];
    cg_bdesc_problem bp;
    cg_problem p;
    if (only && ops[i] != only)
      continue;
    if (*nrows >= CGC__MAX_PROBLEMS) {
      fprintf(stderr, "convgrad bench: more than %d rows\n", CGC__MAX_PROBLEMS);
      return CGC_EXIT_USAGE;
    }
    cgc__bench_row *r = &rows[*nrows];
    memset(r, 0, sizeof *r);
    if (d->name[0]) {
      snprintf(r->name, sizeof r->name, "%s", d->name);
    } else {
      text += strspn(text, " \t");
      if (!strncmp(text, "deconv:", 7))
        text += 7 + strspn(text + 7, " \t");
      snprintf(r->name, sizeof r->name, "%.*s", (int)strcspn(text, " \t#"),
               text);
    }
    int bad =
        cg_bdesc_problem_init(&bp, d, ops[i], dt, df, wf, err, sizeof err);
    if (!bad) {
      cgc_spec_from_problem(&r->spec, &bp.problem);
      cgc_spec_problem(&r->spec, &p);
      bad = cg_problem_resolve(&p, &r->geom, err, sizeof err);
    }
    /* The inputs are allocated before the first call. */
    for (int k = 0; !bad && k < 2; k++) {
      size_t nbytes;
      bad = cgc_spec_input_bytes(&r->spec, k, &nbytes, err, sizeof err);
    }
    if (bad) {
      fprintf(stderr, "convgrad bench: %s: %s\n", r->name, err);
      return CGC_EXIT_INPUT;
    }
    (*nrows)++;
  }
  return 0;
}

static int cgc__bench_load(const char *path, cgc__bench_row *rows, int *nrows,
                           cg_op only, cg_dtype dt, cg_data_format df,
                           cg_weights_format wf) {
  char line[512], err[256];
  int lineno = 0, code = 0;
  FILE *fp = fopen(path, "r");
  if (!fp) {
    fprintf(stderr, "convgrad bench: %s: cannot open\n", path);
    return CGC_EXIT_INPUT;
  }
  while (!code && fgets(line, sizeof line, fp)) {
    cg_bdesc d;
    int is_problem;
    lineno++;
    line[strcspn(line, "\r\n")] = '\0';
    if (cg_bdesc_parse_line(line, &d, &is_problem, err, sizeof err)) {
      fprintf(stderr, "convgrad bench: %s:%d: %s\n", path, lineno, err);
      code = CGC_EXIT_INPUT;
    } else if (is_problem) {
      code = cgc__bench_add(rows, nrows, &d, line, only, dt, df, wf);
    }
  }
  fclose(fp);
  return code;
}

/* The rows of --problems FILE and of each --problem DESC. */
static int cgc__bench_rows(const char *file, const cgc_cli_strs *descs,
                           int deconv, cg_op only, cg_dtype dt,
                           cg_data_format df, cg_weights_format wf,
                           cgc__bench_row *rows, int *nrows) {
  int code = 0;
  if (file)
    code = cgc__bench_load(file, rows, nrows, only, dt, df, wf);
  for (int i = 0; !code && i < descs->n; i++) {
    char err[256];
    cg_bdesc d;
    if (cg_bdesc_parse(descs->v[i], deconv, &d, err, sizeof err))
      return cgc_cli_usage("bench", "--problem: %s", err);
    code = cgc__bench_add(rows, nrows, &d, descs->v[i], only, dt, df, wf);
  }
  if (!code && *nrows == 0) {
    fprintf(stderr, "convgrad bench: no problem matches\n");
    code = CGC_EXIT_INPUT;
  }
  return code;
}

/* One measured row: a line of the table (name column w wide), or an
 * object appended to jrows. */
static void cgc__bench_print(const cgc__bench_row *r, int w, long long conc,
                             cJSON *jrows) {
  double p50 = cgc__pct(r->lat_ms, r->n, 50),
         p90 = cgc__pct(r->lat_ms, r->n, 90),
         p99 = cgc__pct(r->lat_ms, r->n, 99);
  double rps = (double)r->n / r->wall_s;
  long ok = r->n ? r->n : 1;
  double mbs =
      rps *
      (double)(r->geom.in_bytes[0] + r->geom.in_bytes[1] + r->geom.out_bytes) /
      1e6;
  double cms = r->compute_ms_sum / (double)ok;
  if (!jrows) {
    printf("%-*s %-28s %-4s %4lld %6ld %8.3f %8.3f %8.3f %9.1f %9.1f "
           "%10.3f %7ld %6ld\n",
           w, r->name, cg_op_name(r->spec.op), cg_dtype_name(r->spec.dtype),
           conc, r->n, p50, p90, p99, rps, mbs, cms, r->retries, r->errors);
    fflush(stdout);
    return;
  }
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "problem", r->name);
  cJSON_AddStringToObject(o, "op", cg_op_name(r->spec.op));
  cJSON_AddStringToObject(o, "dtype", cg_dtype_name(r->spec.dtype));
  cJSON_AddNumberToObject(o, "concurrency", (double)conc);
  cJSON_AddNumberToObject(o, "requests", (double)r->n);
  cJSON_AddNumberToObject(o, "p50_ms", p50);
  cJSON_AddNumberToObject(o, "p90_ms", p90);
  cJSON_AddNumberToObject(o, "p99_ms", p99);
  cJSON_AddNumberToObject(o, "requests_per_s", rps);
  cJSON_AddNumberToObject(o, "mb_per_s", mbs);
  cJSON_AddNumberToObject(o, "server_compute_ms", cms);
  cJSON_AddNumberToObject(o, "server_queue_ms", r->queue_ms_sum / (double)ok);
  cJSON_AddNumberToObject(o, "retries", (double)r->retries);
  cJSON_AddNumberToObject(o, "errors", (double)r->errors);
  cJSON_AddNumberToObject(o, "gflops", r->geom.flops * rps / 1e9);
  cJSON_AddItemToArray(jrows, o);
}

/* Measures every row in turn on random inputs, printing each as it ends;
 * jrows collects them for --json (NULL for the table). */
static int cgc__bench_run(cgc_cli *cli, cgc_channel *ch, cgc__bench_row *rows,
                          int nrows, long warmup, long nreq, double duration_s,
                          int conc, int shm, cJSON *jrows) {
  uint64_t seed = 7;
  int code, w = 7; /* the problem column fits the longest name */
  const cgc__bench_row *failed = NULL;
  for (int i = 0; i < nrows; i++)
    if ((int)strlen(rows[i].name) > w)
      w = (int)strlen(rows[i].name);
  if (!jrows)
    printf("%-*s %-28s %-4s %4s %6s %8s %8s %8s %9s %9s %10s %7s %6s\n", w,
           "problem", "op", "type", "conc", "n", "p50 ms", "p90 ms", "p99 ms",
           "req/s", "MB/s", "compute ms", "retries", "errors");
  for (int i = 0; i < nrows; i++) {
    cgc__bench_row *r = &rows[i];
    for (int k = 0; k < 2; k++) {
      r->in[k] = malloc(r->geom.in_bytes[k] ? r->geom.in_bytes[k] : 1);
      if (!r->in[k]) {
        fprintf(stderr, "convgrad bench: out of memory\n");
        return CGC_EXIT_INTERNAL;
      }
      cg_fill_uniform(r->geom.dtype, r->in[k], r->geom.in_elems[k], &seed);
    }
    if ((code = cgc__bench_row_run(ch, r, warmup, nreq, duration_s, conc,
                                   shm)) != 0)
      return code;
    if (r->errors && !failed)
      failed = r;
    cgc__bench_print(r, w, conc, jrows);
  }
  return failed ? cgc_cli_fail(cli, failed->first_rc, &failed->first_st) : 0;
}

int cgc_cmd_bench(int argc, char **argv) {
  cgc_cli cli;
  const char *file = NULL;
  cgc_cli_strs descs = {{NULL}, 0};
  int deconv = 0, json = 0, shm = 0, code = 0;
  cg_op only = CG_OP_INVALID;
  cg_dtype dt = CG_DTYPE_F32;
  cg_data_format df = CG_DATA_DEFAULT;
  cg_weights_format wf = CG_WEIGHTS_DEFAULT;
  cgc_cli_num conc = {1, 1, 256, "--concurrency must be 1..256"};
  cgc_cli_num nreq = {200, 1, 10000000, "--requests must be >= 1"};
  cgc_cli_num warmup = {10, 0, 1000000, "--warmup must be >= 0"};
  cgc_cli_num duration = {0, 0, 86400, "--duration must be 0..86400 seconds"};
  const cgc_cli_opt opts[] = {{"problems", CGC_CLI_STR, &file},
                              {"problem", CGC_CLI_STRS, &descs},
                              {"deconv", CGC_CLI_FLAG, &deconv},
                              {"op", CGC_CLI_OP, &only},
                              {"dtype", CGC_CLI_DTYPE, &dt},
                              {"data-format", CGC_CLI_DATA_FORMAT, &df},
                              {"weights-format", CGC_CLI_WEIGHTS_FORMAT, &wf},
                              {"concurrency", CGC_CLI_NUM, &conc},
                              {"requests", CGC_CLI_NUM, &nreq},
                              {"warmup", CGC_CLI_NUM, &warmup},
                              {"duration", CGC_CLI_NUM, &duration},
                              {"json", CGC_CLI_FLAG, &json},
                              {"shm", CGC_CLI_FLAG, &shm},
                              {NULL, 0, NULL}};
  cgc_cli_init(&cli, "bench", cgc__bench_help, 0);
  if (cgc_cli_parse(&cli, opts, argc, argv, &code))
    return code;
  if (!file && descs.n == 0)
    return cgc_cli_usage("bench", "give --problems FILE or --problem DESC");

  cgc__bench_row *rows = calloc(CGC__MAX_PROBLEMS, sizeof *rows);
  cgc_channel *ch = NULL;
  int nrows = 0;
  if (!rows) {
    fprintf(stderr, "convgrad bench: out of memory\n");
    return CGC_EXIT_INTERNAL;
  }
  if ((code = cgc__bench_rows(file, &descs, deconv, only, dt, df, wf, rows,
                              &nrows)) == 0 &&
      (code = cgc_cli_connect(&cli, &ch)) == 0) {
    cJSON *jrows = json ? cJSON_CreateArray() : NULL;
    code = cgc__bench_run(&cli, ch, rows, nrows, (long)warmup.v, (long)nreq.v,
                          (double)duration.v, (int)conc.v, shm, jrows);
    char *text = jrows ? cJSON_Print(jrows) : NULL;
    if (text)
      printf("%s\n", text);
    cJSON_free(text);
    cJSON_Delete(jrows);
  }
  for (int i = 0; i < nrows; i++) {
    free(rows[i].in[0]);
    free(rows[i].in[1]);
    free(rows[i].lat_ms);
    if (rows[i].lat_ms)
      pthread_mutex_destroy(&rows[i].mu);
  }
  free(rows);
  cgc_channel_free(ch);
  return code;
}
