/* bench_call.c - what the server adds around the kernel, per call (issue
 * 26), against a bare gRPC C-core echo and, with --baseline, another build
 * of the server, all in one run (a benchmark: it prints figures and
 * asserts nothing).
 *
 * tiny: one caller, the tiny row mb1ic4ih8oc4oh8kh3ph1 ConvolutionBackwardData
 *   f32, its tensors inline, and a unary echo of 64 bytes on the bare
 *   server (bench.c), over TCP loopback and a unix socket: rounds of blocks
 *   of calls, each target and transport in turn, so that all see the same
 *   machine. The tiny row goes through libcgclient, as trainers call, and
 *   through a raw C-core client as lean as the echo's (one batch: the
 *   request, the half-close, the answer and the status), so that the
 *   server's share shows apart from the client library's. Per target: the
 *   median over rounds of each block's p50, its ratio to the echo's p50 of
 *   the same round (figure (a), target <= 1.5), and the process's CPU time
 *   (user + sys, /proc/PID/stat) per call over every block (figure (b),
 *   target <= 2x the echo's), and this client process's, which shows the
 *   client library's own cost beside the raw client's. With --idle-us N every
 * call of every target follows N microseconds of sleep instead of the previous
 * call, as a trainer's call follows its own compute: what a call costs once the
 *   client, the server and the kernel have gone idle.
 * resnet: throughput at concurrency 8 (threads sharing one channel) on the
 *   ResNet rows of the problem list, both gradient ops, f32, over TCP: the
 *   servers take turns for --seconds each round, the first of a round
 *   alternating; the median calls/s and its ratio to the baseline's
 *   (figure (e), target >= 1.0).
 *
 * Servers run with their defaults (2 workers, adaptive threads) unless
 * --server-arg adds flags; nothing is pinned. Run it under
 * flock /work/coord/bench.lock on a shared machine. */
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>

#include "bench.h"
#include "cg/bdesc.h"
#include "convgrad/v1/convgrad.pb-c.h"
#include "ts.h"

#define MAX_SERVER_ARGS 16
#define ECHO_BYTES 64

enum { TCP, UNIX_SOCKET, TRANSPORTS };
static const char *const transport_names[TRANSPORTS] = {"tcp", "unix"};
/* How a server is called: libcgclient, or the raw one-batch client. */
enum { VIA_LIB, VIA_RAW, VIAS };
static const char *const via_names[VIAS] = {"lib", "raw"};

/* A server under test: this build's, or the baseline. */
typedef struct target {
  const char *name;
  const char *bin; /* NULL: the bare echo server */
  pid_t pid;
  ts_server srv;
  char sock[128];
  grpc_channel *raw[TRANSPORTS]; /* the echo's, or the raw client's */
  cgc_channel *ch[TRANSPORTS];
  double *p50[TRANSPORTS][VIAS];         /* per round */
  double *rate;                          /* resnet: calls/s per round */
  double cpu_s[TRANSPORTS][VIAS];        /* over every tiny block */
  double client_cpu_s[TRANSPORTS][VIAS]; /* this process's, the same */
  long calls[TRANSPORTS][VIAS];
} target;

static int start_server(target *t, int k, const char *const *extra) {
  snprintf(t->sock, sizeof t->sock, "/tmp/cg-bench-call-%ld-%d.sock",
           (long)getpid(), k);
  char listen[192], unix_target[160], err[256];
  snprintf(listen, sizeof listen, "127.0.0.1:0,unix:%s", t->sock);
  const char *args[4 + MAX_SERVER_ARGS] = {"--listen", listen};
  int n = 2;
  for (int i = 0; extra[i] && n < 3 + MAX_SERVER_ARGS; i++)
    args[n++] = extra[i];
  args[n] = NULL;
  if (ts_server_start_bin(&t->srv, t->bin, args) != 0)
    return -1;
  t->pid = t->srv.pid;
  snprintf(unix_target, sizeof unix_target, "unix:%s", t->sock);
  if (cgc_channel_new(&t->ch[TCP], t->srv.target, NULL, err, sizeof err) ||
      cgc_channel_new(&t->ch[UNIX_SOCKET], unix_target, NULL, err,
                      sizeof err)) {
    fprintf(stderr, "%s: %s\n", t->name, err);
    return -1;
  }
  grpc_channel_credentials *cr = grpc_insecure_credentials_create();
  t->raw[TCP] = grpc_channel_create(t->srv.target, cr, NULL);
  t->raw[UNIX_SOCKET] = grpc_channel_create(unix_target, cr, NULL);
  grpc_channel_credentials_release(cr);
  printf("%s: %s", t->name, t->srv.ready);
  return 0;
}

static void stop_target(target *t) {
  for (int x = 0; x < TRANSPORTS; x++) {
    if (t->raw[x])
      grpc_channel_destroy(t->raw[x]);
    cgc_channel_free(t->ch[x]);
    for (int v = 0; v < VIAS; v++)
      free(t->p50[x][v]);
  }
  free(t->rate);
  if (t->bin) {
    ts_server_stop(&t->srv, SIGTERM, 60000);
  } else if (t->pid > 0) {
    kill(t->pid, SIGKILL);
    waitpid(t->pid, NULL, 0);
  }
  unlink(t->sock);
}

/* Which of n targets goes i-th in round r: the order turns each round,
 * so that none always follows the same one. */
static int turn(int i, int r, int n) {
  return (i + r) % n;
}

/* The tiny row, its request packed once for the raw client, and how long
 * every call waits before it starts. */
typedef struct tiny_row {
  bench_prob p;
  grpc_byte_buffer *raw;
  int idle_us; /* --idle-us; 0: back to back */
} tiny_row;

/* One call of t over transport x via v, after row->idle_us of sleep;
 * microseconds, negative when it failed. */
static double one_call(target *t, int x, int v, const tiny_row *row) {
  double ms;
  bench_idle(row->idle_us);
  if (!t->bin)
    return bench_echo_unary_us(t->raw[x], ECHO_BYTES);
  if (v == VIA_LIB)
    return bench_e2e_once(t->ch[x], &row->p, row->p.out, &ms) == 0 ? ms * 1e3
                                                                   : -1;
  /* A copy of the packed request (slice references, no bytes copied). */
  grpc_byte_buffer *msg = grpc_byte_buffer_copy(row->raw);
  double us = bench_unary_us(t->raw[x], "/convgrad.v1.ConvGrad/Compute", msg);
  grpc_byte_buffer_destroy(msg);
  return us;
}

/* One block of calls of t over transport x via v; its p50 in us. */
static double block(target *t, int x, int v, const tiny_row *row, double *lat,
                    int calls) {
  for (int i = 0; i < 20; i++) /* the channel was idle for a while */
    one_call(t, x, v, row);
  double cpu0 = bench_proc_stat(t->pid).cpu_s, own0 = bench_own_cpu_seconds();
  for (int i = 0; i < calls; i++)
    if ((lat[i] = one_call(t, x, v, row)) < 0)
      return 0;
  t->cpu_s[x][v] += bench_proc_stat(t->pid).cpu_s - cpu0;
  t->client_cpu_s[x][v] += bench_own_cpu_seconds() - own0;
  t->calls[x][v] += calls;
  return bench_percentile(lat, calls, 0.5);
}

static double median(const double *v, int n) {
  double *copy = malloc(sizeof *copy * (size_t)n);
  if (!copy)
    return 0;
  memcpy(copy, v, sizeof *copy * (size_t)n);
  double m = bench_percentile(copy, n, 0.5);
  free(copy);
  return m;
}

/* The tiny row's request with its tensors inline, as one message. */
static grpc_byte_buffer *tiny_request(void) {
  ts_desc d = ts_tiny_desc(3);
  ts_problem tp;
  if (ts_problem_init(&tp, &d) != 0)
    return NULL;
  for (int i = 0; i < 2; i++) {
    tp.tensors[i].data.data = tp.in[i];
    tp.tensors[i].data.len = tp.g.in_bytes[i];
  }
  Convgrad__V1__ComputeRequest r = CONVGRAD__V1__COMPUTE_REQUEST__INIT;
  r.kind_case = CONVGRAD__V1__COMPUTE_REQUEST__KIND_HEADER;
  r.header = &tp.header;
  size_t n = protobuf_c_message_get_packed_size(&r.base);
  grpc_slice sl = grpc_slice_malloc(n);
  protobuf_c_message_pack(&r.base, GRPC_SLICE_START_PTR(sl));
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  ts_problem_free(&tp);
  return bb;
}

/* The rows of one via of the tiny figures. */
static void tiny_print(target *ts, int nt, int x, int v, int rounds,
                       double *ratio) {
  for (int k = v == VIA_LIB ? 0 : 1; k < nt; k++) {
    int kv = k ? v : VIA_RAW; /* the echo has one client */
    for (int r = 0; r < rounds; r++)
      ratio[r] = ts[k].p50[x][kv][r] / ts[0].p50[x][VIA_RAW][r];
    double cpu = ts[k].cpu_s[x][kv] / (double)ts[k].calls[x][kv] * 1e6;
    double echo_cpu =
        ts[0].cpu_s[x][VIA_RAW] / (double)ts[0].calls[x][VIA_RAW] * 1e6;
    double client_cpu =
        ts[k].client_cpu_s[x][kv] / (double)ts[k].calls[x][kv] * 1e6;
    printf("%-5s %-9s %-4s %9.1f %8.2f %12.1f %8.2f %12.1f\n",
           transport_names[x], ts[k].name, k ? via_names[v] : "raw",
           median(ts[k].p50[x][kv], rounds), median(ratio, rounds), cpu,
           cpu / echo_cpu, client_cpu);
  }
}

static void tiny(target *ts, int nt, int rounds, int calls, int idle_us) {
  cg_bdesc d;
  char err[256];
  tiny_row row = {.idle_us = idle_us};
  double *lat = malloc(sizeof *lat * (size_t)calls);
  double *ratio = malloc(sizeof *ratio * (size_t)rounds);
  if (!lat || !ratio ||
      cg_bdesc_parse("mb1ic4ih8oc4oh8kh3ph1", 0, &d, err, sizeof err) ||
      bench_prob_init(&row.p, &d, CG_OP_CONV_BWD_DATA, CG_DTYPE_F32) != 0 ||
      !(row.raw = tiny_request())) {
    free(lat);
    free(ratio);
    return;
  }
  for (int r = 0; r < rounds; r++)
    for (int x = 0; x < TRANSPORTS; x++)
      for (int i = 0; i < nt; i++) {
        int k = turn(i, r, nt);
        for (int v = k ? 0 : VIA_RAW; v < VIAS; v++)
          ts[k].p50[x][v][r] = block(&ts[k], x, v, &row, lat, calls);
      }
  printf("\ntiny mb1ic4ih8oc4oh8kh3ph1 ConvolutionBackwardData f32, one "
         "caller, against a %d B unary echo on the bare C core; %d rounds of "
         "%d calls; client: libcgclient (lib) or one raw C-core batch (raw, "
         "as the echo's); p50: median of the rounds' p50s; ratios: medians "
         "of the rounds' ratios; cpu: user + sys of the server process per "
         "call; client cpu: this process's per call; each call after %d us "
         "idle\n",
         ECHO_BYTES, rounds, calls, idle_us);
  printf("%-5s %-9s %-4s %9s %8s %12s %8s %12s\n", "via", "server", "cli",
         "p50 us", "/echo", "cpu us/call", "/echo", "client cpu");
  for (int x = 0; x < TRANSPORTS; x++)
    for (int v = 0; v < VIAS; v++)
      tiny_print(ts, nt, x, v, rounds, ratio);
  for (int x = 0; nt == 3 && x < TRANSPORTS; x++)
    for (int v = 0; v < VIAS; v++) {
      for (int r = 0; r < rounds; r++)
        ratio[r] = ts[1].p50[x][v][r] / ts[2].p50[x][v][r];
      printf("%s %s: server / baseline p50 %.2f, cpu per call %.2f\n",
             transport_names[x], via_names[v], median(ratio, rounds),
             (ts[1].cpu_s[x][v] / (double)ts[1].calls[x][v]) /
                 (ts[2].cpu_s[x][v] / (double)ts[2].calls[x][v]));
    }
  grpc_byte_buffer_destroy(row.raw);
  free(ratio);
  free(lat);
  bench_prob_free(&row.p);
}

/* ---- resnet: throughput at concurrency 8 ---- */

#define CONCURRENCY 8

typedef struct caller {
  cgc_channel *ch;
  const bench_prob *p;
  void *out;
  double until;
  long calls, errors;
} caller;

static void *caller_main(void *v) {
  caller *c = v;
  double ms;
  while (ts_now_ms() < c->until) {
    if (bench_e2e_once(c->ch, c->p, c->out, &ms) == 0)
      c->calls++;
    else
      c->errors++;
  }
  return NULL;
}

/* Calls per second of CONCURRENCY callers of p on ch for seconds. */
static double throughput(cgc_channel *ch, const bench_prob *p, double seconds,
                         long *errors) {
  pthread_t th[CONCURRENCY];
  caller c[CONCURRENCY];
  double t0 = ts_now_ms();
  int started = 0;
  for (int i = 0; i < CONCURRENCY; i++) {
    c[i] = (caller){.ch = ch,
                    .p = p,
                    .out = malloc(p->g.out_bytes),
                    .until = t0 + seconds * 1e3};
    if (c[i].out && pthread_create(&th[i], NULL, caller_main, &c[i]) == 0)
      started++;
    else
      break;
  }
  long calls = 0;
  for (int i = 0; i < started; i++) {
    pthread_join(th[i], NULL);
    calls += c[i].calls;
    *errors += c[i].errors;
  }
  for (int i = 0; i < CONCURRENCY && i <= started; i++)
    free(c[i].out);
  return (double)calls / ((ts_now_ms() - t0) / 1e3);
}

static void resnet(target *ts, int nt, const char *path, int rounds,
                   double seconds) {
  FILE *f = fopen(path, "r");
  if (!f)
    return;
  printf("\nthroughput at concurrency %d over TCP, f32, %d rounds of %.0f s "
         "per server (calls/s, medians; ratio: of the rounds' ratios)\n",
         CONCURRENCY, rounds, seconds);
  printf("%-44s %-28s", "problem", "op");
  for (int k = 1; k < nt; k++)
    printf(" %10s", ts[k].name);
  printf("%s\n", nt == 3 ? "   ratio" : "");
  double *ratio = malloc(sizeof *ratio * (size_t)rounds);
  char line[512], err[256];
  cg_bdesc d;
  while (ratio && fgets(line, sizeof line, f)) {
    int is_problem = 0;
    if (cg_bdesc_parse_line(line, &d, &is_problem, err, sizeof err) != 0 ||
        !is_problem || d.deconv || strncmp(d.name, "resnet", 6) != 0)
      continue;
    for (int op = 0; op < 2; op++) {
      bench_prob p;
      cg_op o = op ? CG_OP_CONV_BWD_WEIGHTS : CG_OP_CONV_BWD_DATA;
      if (bench_prob_init(&p, &d, o, CG_DTYPE_F32) != 0)
        continue;
      long errors = 0;
      for (int r = 0; r < rounds; r++)
        for (int i = 1; i < nt; i++) {
          int k = 1 + turn(i - 1, r, nt - 1);
          ts[k].rate[r] = throughput(ts[k].ch[TCP], &p, seconds, &errors);
        }
      printf("%-44.44s %-28s", d.name, cg_op_name(o));
      for (int k = 1; k < nt; k++)
        printf(" %10.1f", median(ts[k].rate, rounds));
      if (nt == 3) {
        for (int r = 0; r < rounds; r++)
          ratio[r] = ts[1].rate[r] / ts[2].rate[r];
        printf(" %7.2f", median(ratio, rounds));
      }
      printf("%s\n", errors ? "  (calls failed)" : "");
      fflush(stdout);
      bench_prob_free(&p);
    }
  }
  free(ratio);
  fclose(f);
}

int main(int argc, char **argv) {
  const char *problems = CGS_BENCH_PROBLEMS, *baseline = NULL;
  const char *server = CGS_SERVER_PATH, *only = NULL;
  const char *extra[MAX_SERVER_ARGS + 1] = {NULL};
  int rounds = 5, calls = 2000, nextra = 0, idle_us = 0;
  double seconds = 3;
  static const struct option lo[] = {{"server", required_argument, 0, 's'},
                                     {"baseline", required_argument, 0, 'b'},
                                     {"rounds", required_argument, 0, 'r'},
                                     {"calls", required_argument, 0, 'c'},
                                     {"seconds", required_argument, 0, 't'},
                                     {"only", required_argument, 0, 'o'},
                                     {"idle-us", required_argument, 0, 'i'},
                                     {"problems", required_argument, 0, 'p'},
                                     {"server-arg", required_argument, 0, 'a'},
                                     {"help", no_argument, 0, 'h'},
                                     {0, 0, 0, 0}};
  int opt;
  while ((opt = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    switch (opt) {
    case 's':
      server = optarg;
      break;
    case 'b':
      baseline = optarg;
      break;
    case 'r':
      rounds = atoi(optarg) > 0 ? atoi(optarg) : 1;
      break;
    case 'c':
      calls = atoi(optarg) > 10 ? atoi(optarg) : 10;
      break;
    case 't':
      seconds = atof(optarg) > 0 ? atof(optarg) : 1;
      break;
    case 'o':
      only = optarg;
      break;
    case 'i':
      idle_us = bench_idle_us(optarg);
      break;
    case 'p':
      problems = optarg;
      break;
    case 'a':
      if (nextra < MAX_SERVER_ARGS)
        extra[nextra++] = optarg;
      break;
    default:
      printf("usage: %s [--server BIN] [--baseline BIN] [--rounds N] "
             "[--calls N] [--seconds S] [--only tiny|resnet] [--idle-us N] "
             "[--problems FILE] [--server-arg ARG]...\n"
             "  --idle-us N  tiny: sleep N microseconds before each call "
             "(default 0: back to back)\n",
             argv[0]);
      return opt == 'h' ? 0 : 2;
    }
  }
  target ts[3] = {{.name = "echo"},
                  {.name = "server", .bin = server},
                  {.name = "baseline", .bin = baseline}};
  int nt = baseline ? 3 : 2;
  /* The echo server forks before grpc is initialised here. */
  snprintf(ts[0].sock, sizeof ts[0].sock, "/tmp/cg-bench-call-%ld-echo.sock",
           (long)getpid());
  char addrs[192];
  snprintf(addrs, sizeof addrs, "127.0.0.1:0,unix:%s", ts[0].sock);
  int port = 0;
  ts[0].pid = bench_echo_start(addrs, -1, &port);
  if (ts[0].pid < 0 || port <= 0) {
    fprintf(stderr, "cannot start the echo server\n");
    return 1;
  }
  grpc_init();
  char target_str[2][160];
  snprintf(target_str[TCP], sizeof target_str[TCP], "127.0.0.1:%d", port);
  snprintf(target_str[UNIX_SOCKET], sizeof target_str[UNIX_SOCKET], "unix:%s",
           ts[0].sock);
  grpc_channel_credentials *cr = grpc_insecure_credentials_create();
  for (int x = 0; x < TRANSPORTS; x++)
    ts[0].raw[x] = grpc_channel_create(target_str[x], cr, NULL);
  grpc_channel_credentials_release(cr);
  int ok = 1;
  for (int k = 0; k < nt; k++) {
    for (int x = 0; x < TRANSPORTS; x++)
      for (int v = 0; v < VIAS; v++)
        ok = ok && (ts[k].p50[x][v] = calloc((size_t)rounds, sizeof(double)));
    ok = ok && (ts[k].rate = calloc((size_t)rounds, sizeof(double)));
    ok = ok && (k == 0 || start_server(&ts[k], k, extra) == 0);
  }
  if (ok && (!only || strcmp(only, "tiny") == 0))
    tiny(ts, nt, rounds, calls, idle_us);
  if (ok && (!only || strcmp(only, "resnet") == 0))
    resnet(ts, nt, problems, rounds, seconds);
  for (int k = 0; k < nt; k++)
    stop_target(&ts[k]);
  grpc_shutdown();
  return ok ? 0 : 1;
}
