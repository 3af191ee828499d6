/* bench.c - `convgrad bench`: end-to-end latency percentiles and
 * throughput for a benchdnn-style problem list (cg/bdesc.h) at a given
 * concurrency, as a table or JSON, with the retries the calls needed and
 * the calls that failed. One thread keeps the calls in flight on the
 * channel's engine (cgc_call_start_notify), as a trainer would. */
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
    "and op, with N calls in flight on one channel.\n"
    "  --problems FILE  benchdnn-style list: one descriptor per line,\n"
    "                   'deconv:' marks a deconvolution, '#' comments\n"
    "  --problem DESC   one descriptor (repeatable)\n"
    "  --deconv         --problem descriptors are deconvolutions\n"
    "  --op NAME        only this op (default: both data and weights\n"
    "                   gradients of each descriptor's family); the layer\n"
    "                   ops (ConvolutionBackward, ConvTransposeBackward)\n"
    "                   time a layer's whole backward, all three outputs\n"
    "  --dtype T        f32 (default), bf16, f16\n"
    "  --data-format F --weights-format F   layouts (default NXC, XIO/XOI)\n"
    "  --concurrency N  calls in flight (default 1), from one thread\n"
    "  --requests N     timed requests per row (default 200)\n"
    "  --duration S     end each row's timed part after S seconds, if\n"
    "                   its requests are not all done by then\n"
    "  --warmup N       untimed requests per row first (default 10)\n"
    "  --json           print JSON instead of a table\n"
    "  --shm            pass tensors in a shared-memory region per call\n"
    "                   (a server on this host: unix:PATH or loopback)\n"
    "Calls refused with \"retry later\" are retried (--retries); the\n"
    "retries column counts them. A call that still fails is counted in\n"
    "the errors column and left out of the latencies; the run goes on, and\n"
    "exits with the first failure's code at the end.\n";

#define CGC__MAX_PROBLEMS 256

typedef struct cgc__bench_row {
  cgc_spec spec;
  cg_layer layer; /* the inputs' and outputs' sizes */
  char name[64];
  void *in[3];
  /* results */
  double *lat_ms;      /* by request; < 0 for a failed call */
  long n, errors, ran; /* ran: requests started */
  double stop_s;       /* no request starts after this; 0: none */
  long retries;
  double compute_ms_sum, queue_ms_sum;
  double wall_s;
  int first_rc;
  cgc_status first_st;
} cgc__bench_row;

/* The calls that ended, as the engine's thread tells of them, for the
 * thread that finishes them and starts the next. */
typedef struct cgc__bench_ended {
  pthread_mutex_t mu;
  pthread_cond_t cond;
  struct cgc__bench_slot *head;
} cgc__bench_ended;

/* One call in flight at a time: its request and output buffers, reused
 * like a trainer's gradient buffers (the figures leave out allocation and
 * first-touch faults); with --shm they lie in the slot's region, beside the
 * inputs' copies. */
typedef struct cgc__bench_slot {
  cgc_request req;
  cgc_cli_shm shm;
  void *into[CG_GRAD_COUNT];
  size_t cap[CG_GRAD_COUNT];
  cgc_call *call;
  long index;       /* the request it runs */
  double t0, t_end; /* its start, and its end as the engine saw it */
  cgc__bench_ended *ended;
  struct cgc__bench_slot *next; /* in ended's list */
} cgc__bench_slot;

/* Keeps the row's first failure. */
static void cgc__bench_failed(cgc__bench_row *r, int rc, const cgc_status *st) {
  if (!r->first_rc) {
    r->first_rc = rc;
    r->first_st = *st;
  }
}

static double cgc__now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* cgc_call_end_fn: the call ended, on the engine's thread. */
static void cgc__bench_call_ended(cgc_call *c, void *arg) {
  cgc__bench_slot *s = arg;
  (void)c;
  s->t_end = cgc__now_s();
  pthread_mutex_lock(&s->ended->mu);
  s->next = s->ended->head;
  s->ended->head = s;
  pthread_cond_signal(&s->ended->cond);
  pthread_mutex_unlock(&s->ended->mu);
}

/* Makes the request and buffers of every slot. Returns 0, or -1 after
 * counting the failure in r. */
static int cgc__bench_slots_init(cgc_channel *ch, cgc__bench_row *r,
                                 cgc__bench_slot *slots, int conc, int shm,
                                 cgc__bench_ended *ended) {
  size_t out_bytes[CG_GRAD_COUNT] = {0};
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    if (r->layer.grads & CG_GRAD_BIT(g))
      out_bytes[g] = r->layer.out_bytes[g] ? r->layer.out_bytes[g] : 1;
  for (int k = 0; k < conc; k++) {
    cgc__bench_slot *s = &slots[k];
    int rc = CG_ENOMEM;
    cgc_status st = {GRPC_STATUS_RESOURCE_EXHAUSTED,
                     "out of memory for the result buffers"};
    s->ended = ended;
    cgc_spec_request_n(&r->spec, (const void *const *)r->in, r->layer.in_bytes,
                       &s->req);
    if (shm) {
      if (cgc_cli_shm_stage(&s->shm, ch, &s->req, out_bytes, &rc, &st) == 0) {
        memcpy(s->into, s->shm.into, sizeof s->into);
        memcpy(s->cap, s->shm.cap, sizeof s->cap);
        continue;
      }
    } else {
      int ok = 1;
      for (int g = 0; g < CG_GRAD_COUNT; g++)
        if (out_bytes[g]) {
          s->cap[g] = out_bytes[g];
          ok &= (s->into[g] = malloc(out_bytes[g])) != NULL;
        }
      if (ok)
        continue;
    }
    r->errors++;
    cgc__bench_failed(r, rc, &st);
    return -1;
  }
  return 0;
}

static void cgc__bench_slots_free(cgc__bench_slot *slots, int conc, int shm) {
  for (int k = 0; k < conc; k++) {
    if (shm)
      cgc_cli_shm_close(&slots[k].shm);
    else
      for (int g = 0; g < CG_GRAD_COUNT; g++)
        free(slots[k].into[g]);
  }
}

/* Starts the next request of r on slot s: returns 1 when it is in flight,
 * 0 when none is left or the time is up, -1 when it failed to start (its
 * latency recorded as a failure). */
static int cgc__bench_start(cgc_channel *ch, cgc__bench_row *r,
                            cgc__bench_slot *s, long *next) {
  s->t0 = cgc__now_s();
  if (*next >= r->n || (r->stop_s > 0 && s->t0 >= r->stop_s))
    return 0;
  s->index = (*next)++;
  cgc_status st;
  int rc = cgc_call_start_notify(ch, &s->req, s->into, s->cap,
                                 cgc__bench_call_ended, s, &s->call, &st);
  if (rc == 0)
    return 1;
  r->lat_ms[s->index] = -1;
  r->errors++;
  cgc__bench_failed(r, rc, &st);
  return -1;
}

/* Finishes the call of slot s and records it. */
static void cgc__bench_finish(cgc__bench_row *r, cgc__bench_slot *s) {
  cgc_tensor out[CG_GRAD_COUNT];
  cgc_result res = {.attempts = 1};
  cgc_status st;
  int rc = cgc_call_finish(s->call, out, &res, &st);
  s->call = NULL;
  r->retries += res.attempts > 1 ? res.attempts - 1 : 0;
  if (rc) {
    r->lat_ms[s->index] = -1;
    r->errors++;
    cgc__bench_failed(r, rc, &st);
    return;
  }
  r->lat_ms[s->index] = (s->t_end - s->t0) * 1e3;
  r->queue_ms_sum += res.queue_ms;
  r->compute_ms_sum += res.compute_ms;
}

/* Runs r->n requests of row r with up to conc calls in flight, all from
 * this thread on the channel's engine: each ended call is finished and
 * its slot starts the next request. */
static void cgc__bench_phase(cgc_channel *ch, cgc__bench_row *r,
                             cgc__bench_slot *slots, int conc,
                             cgc__bench_ended *ended) {
  long next = 0;
  int inflight = 0;
  for (int k = 0; k < conc; k++) {
    int started;
    while ((started = cgc__bench_start(ch, r, &slots[k], &next)) < 0)
      ;
    inflight += started;
  }
  while (inflight > 0) {
    pthread_mutex_lock(&ended->mu);
    while (!ended->head)
      pthread_cond_wait(&ended->cond, &ended->mu);
    cgc__bench_slot *list = ended->head;
    ended->head = NULL;
    pthread_mutex_unlock(&ended->mu);
    while (list) {
      cgc__bench_slot *s = list;
      list = s->next;
      cgc__bench_finish(r, s);
      inflight--;
      int started;
      while ((started = cgc__bench_start(ch, r, s, &next)) < 0)
        ;
      inflight += started;
    }
  }
  r->ran = next;
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

/* Runs warmup requests one at a time, then n timed ones with conc in
 * flight, for at most duration_s seconds (0: no bound); r->n becomes the
 * number of successful calls, their latencies sorted first in r->lat_ms. */
static int cgc__bench_row_run(cgc_channel *ch, cgc__bench_row *r, long warmup,
                              long n, double duration_s, int conc, int shm) {
  cgc__bench_ended ended = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
                            NULL};
  cgc__bench_slot *slots = calloc((size_t)conc, sizeof *slots);
  r->lat_ms = calloc((size_t)(n > warmup ? n : warmup) + 1, sizeof(double));
  if (!r->lat_ms || !slots) {
    free(slots);
    return CGC_EXIT_INTERNAL;
  }
  if (cgc__bench_slots_init(ch, r, slots, conc, shm, &ended) == 0) {
    r->n = warmup;
    cgc__bench_phase(ch, r, slots, 1, &ended);
    r->errors = r->retries = 0;
    r->first_rc = 0; /* the warmup's failures are not the row's */
    r->queue_ms_sum = r->compute_ms_sum = 0;
    r->n = n;
    double t0 = cgc__now_s();
    r->stop_s = duration_s > 0 ? t0 + duration_s : 0;
    cgc__bench_phase(ch, r, slots, conc, &ended);
    r->wall_s = cgc__now_s() - t0;
  }
  cgc__bench_slots_free(slots, conc, shm);
  free(slots);
  pthread_cond_destroy(&ended.cond);
  pthread_mutex_destroy(&ended.mu);
  long ok = 0;
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
  /* The family's two single ops by default; --op one of them, or its
   * layer op, whose problem is the backward-weights op's with the weights
   * as the third input. */
  cg_op ops[2] = {d->deconv ? CG_OP_DECONV_BWD_DATA : CG_OP_CONV_BWD_DATA,
                  d->deconv ? CG_OP_DECONV_BWD_WEIGHTS
                            : CG_OP_CONV_BWD_WEIGHTS};
  cg_op layer = d->deconv ? CG_OP_DECONV_BWD : CG_OP_CONV_BWD;
  for (int i = 0; i < 2; i++) {
    char err[256];
    cg_bdesc_problem bp;
    cg_problem p;
    int as_layer = only == layer && i == 1;
    if (only && ops[i] != only && !as_layer)
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
      if (as_layer)
        cgc_spec_to_layer(&r->spec, layer);
      cgc_spec_problem(&r->spec, &p);
      bad = cg_layer_resolve(&p, &r->layer, err, sizeof err);
    }
    /* The inputs are allocated before the first call. */
    for (int k = 0; !bad && k < r->layer.ninputs; k++) {
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
  size_t bytes = 0;
  for (int k = 0; k < r->layer.ninputs; k++)
    bytes += r->layer.in_bytes[k];
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    bytes += r->layer.out_bytes[g];
  double mbs = rps * (double)bytes / 1e6;
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
  cJSON_AddNumberToObject(o, "gflops",
                          (double)cg_layer_flops(&r->layer) * rps / 1e9);
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
    for (int k = 0; k < r->layer.ninputs; k++) {
      size_t nbytes = r->layer.in_bytes[k];
      r->in[k] = malloc(nbytes ? nbytes : 1);
      if (!r->in[k]) {
        fprintf(stderr, "convgrad bench: out of memory\n");
        return CGC_EXIT_INTERNAL;
      }
      cg_fill_uniform(r->layer.dtype, r->in[k],
                      nbytes / cg_dtype_size(r->layer.dtype), &seed);
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
  cgc_cli_num conc = {1, 1, 256, "--concurrency must be 1..256", NULL};
  /* Each request's latency is kept (8 bytes). */
  cgc_cli_num nreq = {200, 1, 10000000, "--requests must be >= 1",
                      "--requests: too large, at most 10000000"};
  cgc_cli_num warmup = {10, 0, 1000000, "--warmup must be >= 0",
                        "--warmup: too large, at most 1000000"};
  cgc_cli_num duration = {0, 0, 86400, "--duration must be 0..86400 seconds",
                          NULL};
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
    cgc_cli_verify_report(&cli, ch, json ? stderr : stdout);
    char *text = jrows ? cJSON_Print(jrows) : NULL;
    if (text)
      printf("%s\n", text);
    cJSON_free(text);
    cJSON_Delete(jrows);
  }
  for (int i = 0; i < nrows; i++) {
    for (int k = 0; k < 3; k++)
      free(rows[i].in[k]);
    free(rows[i].lat_ms);
  }
  free(rows);
  cgc_channel_free(ch);
  return code;
}
