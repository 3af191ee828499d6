/* bench_wire.c - the server's CPU per MB moved over TCP loopback (issue
 * 38: off-host, the server's one core, not the link, set the step), for
 * this build's server and, with --baseline, another build's, in one run
 * (a benchmark: it prints figures and asserts nothing).
 *
 * Each server runs on one core (--cpus and --io-cpus, the last core by
 * default, one worker) with --store-bytes 256M unless asked; this client
 * runs on the other cores. Cases, each a block of --calls calls through
 * libcgclient:
 *   up      ConvolutionBackwardWeights mb16ic64ih56oc64oh56kh1ph0, f32: two
 *           12.25 MiB inputs up in 1 MiB chunks, 16 KiB down;
 *   updown  ConvolutionBackwardData of the same row: 12.25 MiB up (and the
 *           16 KiB weights), 12.25 MiB down;
 *   inline  ConvolutionBackwardWeights mb2ic64ih28oc64oh28kh1ph0: 0.77 MiB
 *           up, all in the header message;
 *   stage   cgc_stage_private of --stage-mib MiB (nothing hashed);
 *   stage-sha    cgc_stage of as many fresh bytes (the server hashes them);
 *   stage-small  cgc_stage_private of 512 KiB, all in the header message.
 * Per block, from /proc/PID/task/TID before and after: the CPU of the
 * completion-queue thread (cq: gRPC's polling, TCP reads and writes, and
 * the calls' handling), of the workers (the kernels) and of all the
 * server's threads (the first figure of each one's schedstat, in ns; a
 * thread that ended within the block is missed), each divided by the MiB
 * the block moved (up + down); this client's CPU per MiB, which the
 * link's other end pays (CLOCK_PROCESS_CPUTIME_ID); and the server's
 * minor page faults per MiB: memory touched for the first time, which
 * costs far more than the copies on a VM (3.5 ms/MiB on this one). Rounds
 * interleave the servers (the first of a round alternates); the figures
 * are medians over rounds, and the ratio row the median of each round's
 * ratio. The load average goes beside each round: run it on a quiet
 * machine, or take only the ratios. */
#include <dirent.h>
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "cg/bdesc.h"
#include "cgc/client.h"
#include "ts.h"

#define MIB (1024.0 * 1024.0)
#define MAX_ROUNDS 64

enum { C_UP, C_UPDOWN, C_INLINE, C_STAGE, C_STAGE_SHA, C_STAGE_SMALL, CASES };
static const char *const case_names[CASES] = {
    "up", "updown", "inline", "stage", "stage-sha", "stage-small"};
/* Bytes of a stage-small call: whole in its header message. */
#define STAGE_SMALL_BYTES (512u << 10)
/* The figures of a block: ms of CPU per MiB, by thread group. */
enum { F_CQ, F_WORKERS, F_OTHER, F_TOTAL, F_CLIENT, F_FAULTS, F_WALL, FIGS };
static const char *const fig_names[FIGS] = {
    "cq", "workers", "other", "total", "client", "faults/MiB", "wall ms/call"};

typedef struct target {
  const char *name;
  const char *bin; /* NULL: this build's (CGS_SERVER_PATH) */
  ts_server srv;
  cgc_channel *ch;
  double fig[CASES][FIGS][MAX_ROUNDS];
} target;

typedef struct cpu_split {
  double cq, workers, total; /* seconds */
  double faults;             /* the process's minor page faults */
} cpu_split;

/* Seconds a thread has run: the first figure of its schedstat, in ns
 * (/proc/PID/stat counts in ticks of 10 ms, too coarse for a block). */
static double run_seconds(const char *path) {
  FILE *f = fopen(path, "r");
  unsigned long long ns = 0;
  if (f) {
    if (fscanf(f, "%llu", &ns) != 1)
      ns = 0;
    fclose(f);
  }
  return (double)ns / 1e9;
}

/* The server's CPU so far, by thread group (threads named by the server:
 * cg-cq and cg-worker-N). */
static cpu_split cpu_of(pid_t pid) {
  cpu_split s = {0, 0, 0, bench_proc_stat(pid).minflt};
  char path[96], comm[32];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *dir = opendir(path);
  struct dirent *e;
  while (dir && (e = readdir(dir)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    snprintf(path, sizeof path, "/proc/%d/task/%.16s/comm", (int)pid,
             e->d_name);
    FILE *f = fopen(path, "r");
    if (!f)
      continue;
    size_t n = fread(comm, 1, sizeof comm - 1, f);
    fclose(f);
    comm[n] = '\0';
    snprintf(path, sizeof path, "/proc/%d/task/%.16s/schedstat", (int)pid,
             e->d_name);
    double t = run_seconds(path);
    s.total += t;
    if (!strncmp(comm, "cg-cq", 5))
      s.cq += t;
    else if (!strncmp(comm, "cg-worker", 9))
      s.workers += t;
  }
  if (dir)
    closedir(dir);
  return s;
}

typedef struct work {
  bench_prob p[3]; /* up, updown, inline */
  unsigned char *stage_bytes;
  size_t stage_len;
  uint64_t salt; /* makes each stage-sha upload new content */
  int calls;
  int gap_ms; /* sleep before each call, as a trainer computes between */
} work;

/* MiB one call of case k moves, up and down. */
static double mib_of(const work *w, int k) {
  if (k == C_STAGE_SMALL)
    return STAGE_SMALL_BYTES / MIB;
  if (k >= C_STAGE)
    return (double)w->stage_len / MIB;
  const bench_prob *p = &w->p[k];
  return (double)(p->g.in_bytes[0] + p->g.in_bytes[1] + p->g.out_bytes) / MIB;
}

static int one_call(target *t, work *w, int k) {
  double ms;
  unsigned char id[CGC_STAGED_ID_BYTES];
  cgc_stage_result res;
  cgc_status st;
  int rc;
  switch (k) {
  case C_UP:
  case C_UPDOWN:
  case C_INLINE:
    return bench_e2e_once(t->ch, &w->p[k], w->p[k].out, &ms);
  case C_STAGE:
    rc = cgc_stage_private(t->ch, w->stage_bytes, w->stage_len, 60000, id, &res,
                           &st);
    break;
  case C_STAGE_SMALL:
    rc = cgc_stage_private(t->ch, w->stage_bytes, STAGE_SMALL_BYTES, 60000, id,
                           &res, &st);
    break;
  default:
    w->salt++;
    memcpy(w->stage_bytes, &w->salt, sizeof w->salt);
    rc = cgc_stage(t->ch, w->stage_bytes, w->stage_len, 60000, id, &res, &st);
    if (rc == 0 && res.present)
      fprintf(stderr, "  stage-sha: the server held the bytes already\n");
    break;
  }
  if (rc != 0)
    fprintf(stderr, "  %s: %s\n", case_names[k], st.message);
  return rc;
}

static int block(target *t, work *w, int k, int r) {
  if (one_call(t, w, k) != 0) /* warm: buffers, kernels, windows */
    return -1;
  cpu_split a = cpu_of(t->srv.pid);
  double t0 = ts_now_ms(), own0 = bench_own_cpu_seconds();
  for (int i = 0; i < w->calls; i++) {
    bench_idle(w->gap_ms * 1000);
    if (one_call(t, w, k) != 0)
      return -1;
  }
  double wall = ts_now_ms() - t0 - (double)w->gap_ms * w->calls,
         own = bench_own_cpu_seconds() - own0;
  cpu_split b = cpu_of(t->srv.pid);
  double mib = mib_of(w, k) * w->calls;
  double cq = b.cq - a.cq, wk = b.workers - a.workers, tot = b.total - a.total;
  t->fig[k][F_CQ][r] = cq * 1e3 / mib;
  t->fig[k][F_WORKERS][r] = wk * 1e3 / mib;
  t->fig[k][F_OTHER][r] = (tot - cq - wk) * 1e3 / mib;
  t->fig[k][F_TOTAL][r] = tot * 1e3 / mib;
  t->fig[k][F_CLIENT][r] = own * 1e3 / mib;
  t->fig[k][F_FAULTS][r] = (b.faults - a.faults) / mib;
  t->fig[k][F_WALL][r] = wall / w->calls;
  return 0;
}

static double median(const double *v, int n) {
  double copy[MAX_ROUNDS];
  memcpy(copy, v, sizeof *v * (size_t)n);
  return bench_percentile(copy, n, 0.5);
}

static void print_load(void) {
  double l[3];
  if (getloadavg(l, 3) == 3)
    printf("load %.2f %.2f %.2f", l[0], l[1], l[2]);
}

/* --store-bytes of the servers: a store smaller than what a run stages
 * recycles the memory of the entries it drops; a bigger one keeps taking
 * fresh memory, as a server does while its store fills up. */
static const char *store_bytes = "256M";

static int start_target(target *t, int cpu) {
  char cpus[16], err[256];
  snprintf(cpus, sizeof cpus, "%d", cpu);
  const char *args[] = {
      "--cpus",    cpus,          "--io-cpus", cpus, "--store-bytes",
      store_bytes, "--log-level", "warn",      NULL};
  int rc = t->bin ? ts_server_start_bin(&t->srv, t->bin, args)
                  : ts_server_start(&t->srv, args);
  if (rc != 0)
    return -1;
  if (cgc_channel_new(&t->ch, t->srv.target, NULL, err, sizeof err) != 0) {
    fprintf(stderr, "%s: %s\n", t->name, err);
    return -1;
  }
  printf("%s: %s", t->name, t->srv.ready);
  return 0;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_wire [--baseline BIN] [--rounds N] [--calls N]\n"
          "                  [--stage-mib N] [--cpu N] [--cases LIST]\n"
          "                  [--store-bytes SIZE] [--gap-ms N]\n"
          "  --baseline BIN  another build's convgrad-server, interleaved\n"
          "  --rounds N      rounds (default 7, at most 64)\n"
          "  --calls N       calls per block (default 8)\n"
          "  --stage-mib N   bytes of a Stage call (default 16)\n"
          "  --cpu N         the servers' core (default: the last)\n"
          "  --cases LIST    comma list of up,updown,inline,stage,stage-sha,\n"
          "                  stage-small (default: all)\n"
          "  --gap-ms N      sleep N ms (0-999) before each call, as a\n"
          "                  trainer computes between its calls\n"
          "  --store-bytes S the servers' store (default 256M: it fills\n"
          "                  up and recycles; 4G: fresh memory throughout)\n");
}

int main(int argc, char **argv) {
  static const struct option opts[] = {
      {"baseline", required_argument, 0, 'b'},
      {"rounds", required_argument, 0, 'r'},
      {"calls", required_argument, 0, 'c'},
      {"stage-mib", required_argument, 0, 's'},
      {"cpu", required_argument, 0, 'p'},
      {"cases", required_argument, 0, 'k'},
      {"store-bytes", required_argument, 0, 'S'},
      {"gap-ms", required_argument, 0, 'g'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  const char *baseline = NULL,
             *cases = "up,updown,inline,stage,stage-sha,stage-small";
  int rounds = 7, cpu = bench_last_cpu(), stage_mib = 16, o;
  work w;
  memset(&w, 0, sizeof w);
  w.calls = 8;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (o) {
    case 'b':
      baseline = optarg;
      break;
    case 'r':
      rounds = atoi(optarg);
      break;
    case 'c':
      w.calls = atoi(optarg);
      break;
    case 's':
      stage_mib = atoi(optarg);
      break;
    case 'p':
      cpu = atoi(optarg);
      break;
    case 'k':
      cases = optarg;
      break;
    case 'g':
      w.gap_ms = atoi(optarg);
      break;
    case 'S':
      store_bytes = optarg;
      break;
    case 'h':
      usage(stdout);
      return 0;
    default:
      usage(stderr);
      return 2;
    }
  }
  if (rounds < 1 || rounds > MAX_ROUNDS || w.calls < 1 || stage_mib < 1 ||
      w.gap_ms < 0 || w.gap_ms > 999 || stage_mib > 1024 || cpu < 0) {
    usage(stderr);
    return 2;
  }
  int on[CASES] = {0};
  for (int k = 0; k < CASES; k++) {
    const char *p = strstr(cases, case_names[k]);
    size_t n = strlen(case_names[k]);
    /* "stage" must not match inside "stage-sha" alone. */
    while (p && ((p != cases && p[-1] != ',') || (p[n] && p[n] != ',')))
      p = strstr(p + 1, case_names[k]);
    on[k] = p != NULL;
  }
  /* The client keeps off the servers' core. */
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 1) {
    CPU_CLR(cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
  }
  cg_bdesc d;
  char err[256];
  if (cg_bdesc_parse("mb16ic64ih56oc64oh56kh1ph0", 0, &d, err, sizeof err) ||
      bench_prob_init(&w.p[C_UP], &d, CG_OP_CONV_BWD_WEIGHTS, CG_DTYPE_F32) ||
      bench_prob_init(&w.p[C_UPDOWN], &d, CG_OP_CONV_BWD_DATA, CG_DTYPE_F32) ||
      cg_bdesc_parse("mb2ic64ih28oc64oh28kh1ph0", 0, &d, err, sizeof err) ||
      bench_prob_init(&w.p[C_INLINE], &d, CG_OP_CONV_BWD_WEIGHTS, CG_DTYPE_F32))
    return 1;
  w.stage_len = (size_t)stage_mib << 20;
  w.stage_bytes = malloc(w.stage_len);
  if (!w.stage_bytes)
    return 1;
  for (size_t i = 0; i < w.stage_len; i++)
    w.stage_bytes[i] = (unsigned char)(i * 2654435761u >> 13);

  grpc_init();
  target t[2];
  memset(t, 0, sizeof t);
  int n = baseline ? 2 : 1;
  t[0].name = "this";
  t[1].name = "baseline";
  t[1].bin = baseline;
  for (int i = 0; i < n; i++)
    if (start_target(&t[i], cpu) != 0)
      return 1;
  int failed = 0;
  for (int r = 0; r < rounds && !failed; r++) {
    printf("round %d: ", r + 1);
    print_load();
    printf("\n");
    fflush(stdout);
    for (int k = 0; k < CASES && !failed; k++)
      for (int i = 0; on[k] && i < n && !failed; i++)
        failed = block(&t[(i + r) % n], &w, k, r) != 0;
  }
  printf("\nserver CPU per MiB moved (ms/MiB; medians of %d rounds of %d "
         "calls; server on core %d, one worker); ",
         rounds, w.calls, cpu);
  print_load();
  printf("\n%-10s %-9s", "case", "target");
  for (int f = 0; f < FIGS; f++)
    printf(" %12s", fig_names[f]);
  printf("\n");
  for (int k = 0; k < CASES && !failed; k++) {
    if (!on[k])
      continue;
    for (int i = 0; i < n; i++) {
      printf("%-10s %-9s", case_names[k], t[i].name);
      for (int f = 0; f < FIGS; f++)
        printf(" %12.3f", median(t[i].fig[k][f], rounds));
      printf("\n");
    }
    if (n == 2) {
      printf("%-10s %-9s", case_names[k], "ratio");
      for (int f = 0; f < FIGS; f++) {
        double rs[MAX_ROUNDS];
        for (int r = 0; r < rounds; r++)
          rs[r] =
              t[1].fig[k][f][r] > 0 ? t[0].fig[k][f][r] / t[1].fig[k][f][r] : 0;
        printf(" %12.3f", median(rs, rounds));
      }
      printf("\n");
    }
  }
  printf("(MiB per call:");
  for (int k = 0; k < CASES; k++)
    printf(" %s %.2f", case_names[k], mib_of(&w, k));
  printf(")\n");
  for (int i = 0; i < n; i++) {
    cgc_channel_free(t[i].ch);
    ts_server_stop(&t[i].srv, SIGTERM, 60000);
  }
  for (int i = 0; i < 3; i++)
    bench_prob_free(&w.p[i]);
  free(w.stage_bytes);
  grpc_shutdown();
  return failed;
}
