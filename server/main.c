/* main.c - convgrad-server entry point: configuration, process-wide
 * tuning (OpenMP spin bound, malloc), the libuv loop, signal handling,
 * the readiness line and the exit status. The only place that exits the
 * process. */
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <uv.h>

#include "cg/engine.h"
#include "cg/text.h"
#include "cgs_buf.h"
#include "cgs_config.h"
#include "cgs_crash.h"
#include "cgs_log.h"
#include "cgs_notify.h"
#include "cgs_server.h"

typedef struct app {
  cgs_config cfg;
  uv_loop_t loop;
  cgs_server server;
  uv_signal_t sigterm, sigint, sighup;
  int signals_open;
  cgs_notify notify;
} app;

/* oneDNN runs on libgomp, whose idle team threads spin for 300,000 rounds
 * after every parallel region unless told otherwise: milliseconds of a
 * core after each job, taken from the loop and gRPC threads that are
 * moving the result out and the next request in. Sleeping at once
 * (OMP_WAIT_POLICY=passive) costs a futex wake-up in each of the many
 * parallel regions of a multi-threaded job instead. 10,000 rounds of
 * pause are about 0.2 ms on this AMX Xeon (one pause takes 18-20 ns
 * here), against 6 ms for the default: a job's team hands its cores
 * back soon, and the regions of one job still find it awake (figures,
 * and why fewer rounds were not taken: tests/README.md, "Design
 * figures"). libgomp reads the variables once, in its own constructor,
 * before main, and libc's start-up resets the environment an earlier
 * hook could have changed; so the server re-executes itself once with
 * the variable set. Either variable already in the environment wins.
 * Returns only when no exec was needed or it failed (then the spinning
 * default stays). */
static void exec_with_bounded_spin(char **argv) {
  if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT"))
    return;
  /* The real path, not /proc/self/exe, so that the process keeps its
   * name (comm) for ps, top and pkill. */
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0 || setenv("GOMP_SPINCOUNT", "10000", 1) != 0)
    return;
  self[n] = '\0';
  execv(self, argv);
  fprintf(stderr, "convgrad-server: warning: cannot re-execute with "
                  "GOMP_SPINCOUNT=10000; idle OpenMP threads will spin\n");
}

/* gRPC receives each message into fresh buffers of up to a few MiB and
 * frees them on another thread. glibc's defaults serve those with mmap or
 * trim them from the arena when freed, so every upload page-faulted its
 * way into zeroed pages again (half of the server's page faults; see
 * tests/README.md, "Design figures"). Keeping up to 32 MiB blocks in
 * the heap and 256 MiB of free heap unreturned reuses warm pages.
 * One arena: malloc_trim (the housekeeping's, once no call is live) gives
 * back the free top of the main arena only, and glibc trims the top of
 * another arena only on a free past M_TRIM_THRESHOLD, so the arenas of
 * gRPC's threads and the workers kept their peak: 64 + 16 calls in flight
 * for 20 s left an idle server at 90-112 MB (28 MB at start), against
 * 32 MB with one arena. Small blocks come from each thread's tcache
 * without the arena's lock. */
static void tune_malloc(void) {
  mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024);
  mallopt(M_TRIM_THRESHOLD, 256 * 1024 * 1024);
  mallopt(M_ARENA_MAX, 1);
}

static void on_signal(uv_signal_t *h, int signum) {
  app *a = h->data;
  cgs_info("received %s", signum == SIGTERM ? "SIGTERM" : "SIGINT");
  cgs_notify_stopping();
  cgs_server_drain(&a->server);
}

static void on_sighup(uv_signal_t *h, int signum) {
  app *a = h->data;
  (void)signum;
  cgs_server_reload(&a->server);
}

static void on_signal_closed(uv_handle_t *h) {
  (void)h;
}

static void close_signals(app *a) {
  if (!a->signals_open)
    return;
  a->signals_open = 0;
  uv_close((uv_handle_t *)&a->sigterm, on_signal_closed);
  uv_close((uv_handle_t *)&a->sigint, on_signal_closed);
  uv_close((uv_handle_t *)&a->sighup, on_signal_closed);
}

static void on_server_stopped(cgs_server *s) {
  app *a = cgs_container_of(s, app, server);
  close_signals(a);
  cgs_notify_close(&a->notify);
}

/* "listen=HOST:PORT" of the first TCP address (its bound port), or
 * "listen=-", then " unix=PATH" for each unix socket. */
static void format_listeners(const cgs_listeners *ls, char *buf, size_t cap) {
  cg_text t;
  cg_text_init(&t, buf, cap);
  int tcp = 0;
  for (int i = 0; i < ls->n && !tcp; i++) {
    const cgs_listener *l = &ls->l[i];
    if (l->path)
      continue;
    const char *colon = strrchr(l->target, ':');
    cg_text_appendf(&t, "listen=%.*s:%d", (int)(colon - l->target), l->target,
                    l->port);
    tcp = 1;
  }
  if (!tcp)
    cg_text_appendf(&t, "listen=-");
  for (int i = 0; i < ls->n; i++)
    if (ls->l[i].path)
      cg_text_appendf(&t, " unix=%s", ls->l[i].path);
}

/* The readiness line into line (cap bytes, without the newline), printed
 * to stdout. */
static void print_ready(const app *a, char *line, size_t cap) {
  char cpus[1024], io_cpus[1024], listen[1200];
  cgs_config_format_cpus(&a->cfg.cpus, cpus, sizeof cpus);
  cgs_config_format_cpus(&a->cfg.io_cpus, io_cpus, sizeof io_cpus);
  format_listeners(&a->server.listeners, listen, sizeof listen);
  if (a->server.metrics_http) {
    /* The configured host with the bound port (--metrics-listen ...:0). */
    const char *m = a->cfg.metrics_listen, *colon = strrchr(m, ':');
    size_t n = strlen(listen);
    snprintf(listen + n, sizeof listen - n, " metrics=%.*s:%d",
             (int)(colon - m), m, a->server.metrics_port);
  }
  if (a->cfg.tls_cert[0]) {
    size_t n = strlen(listen);
    snprintf(listen + n, sizeof listen - n, " tls=%s",
             a->cfg.tls_client_ca[0] ? "mutual" : "on");
  }
  snprintf(line, cap,
           "convgrad-server ready %s workers=%u threads_per_worker=%u "
           "threads_policy=%s cpus=%s io_cpus=%s isa=%s onednn=%s",
           listen, a->cfg.workers, a->cfg.threads_per_worker,
           cgs_threads_policy_name(a->cfg.threads_policy), cpus, io_cpus,
           cg_backend_isa(), cg_backend_version());
  /* stdout, one line, flushed: scripts and tests parse it. */
  printf("%s\n", line);
  fflush(stdout);
}

/* The workers are warm: the readiness line, and systemd's READY=1. */
static void on_server_ready(cgs_server *s) {
  app *a = cgs_container_of(s, app, server);
  char ready[4096];
  print_ready(a, ready, sizeof ready);
  cgs_notify_ready(&a->notify, &a->loop, ready);
}

/* --version: what an ops engineer or a bug report needs to know about
 * this binary on this machine. The ISA is the one oneDNN dispatches to
 * here (DNNL_MAX_CPU_ISA caps it). */
static void print_version(void) {
  printf("convgrad-server %s\noneDNN %s, ISA %s\ngRPC core %s\n", CGS_VERSION,
         cg_backend_version(), cg_backend_isa(), grpc_version_string());
}

int main(int argc, char **argv) {
  static app a; /* large; lives for the whole run */
  char err[512];
  exec_with_bounded_spin(argv);
  tune_malloc();
  int rc = cgs_config_defaults(&a.cfg, err, sizeof err);
  if (rc == 0)
    rc = cgs_config_load(&a.cfg, argc, argv, stdout, err, sizeof err);
  if (rc == 1)
    return 0; /* --help */
  if (rc == CGS_CONFIG_VERSION) {
    print_version();
    return 0;
  }
  cgs_log_set_level(a.cfg.log_level);
  if (rc == 0)
    rc = cgs_config_finish(&a.cfg, err, sizeof err);
  /* Before any thread, and before the regions' SIGBUS guard, which hands
   * it the faults outside regions. */
  if (rc == 0)
    rc = cgs_crash_install(err, sizeof err);
  if (rc != 0) {
    fprintf(stderr, "convgrad-server: %s\n", err);
    return 2;
  }

  /* Threads started from here on (grpc's, ours) inherit the loop's cores
   * (workers then pin themselves) and a mask with the shutdown signals
   * blocked, so that those reach the loop thread only. */
  if (a.cfg.io_cpus.n) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (unsigned i = 0; i < a.cfg.io_cpus.n; i++)
      CPU_SET(a.cfg.io_cpus.cpu[i], &set);
    int e = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    if (e != 0) {
      fprintf(stderr, "convgrad-server: --io-cpus: cannot pin: %s\n",
              strerror(e));
      return 2;
    }
  }
  sigset_t sigs, old;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &sigs, &old);
  signal(SIGPIPE, SIG_IGN);

  int exit_code = 0;
  /* Freed tensor buffers kept for reuse: up to a quarter of the budget. */
  cgs_buf_init((size_t)(a.cfg.max_inflight_bytes / 4));
  uv_loop_init(&a.loop);
  cgs_log_capture_grpc();
  grpc_init();
  rc = cgs_server_start(&a.server, &a.loop, &a.cfg, on_server_ready,
                        on_server_stopped, err, sizeof err);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    cgs_error("cannot start: %s", err);
    exit_code = 1;
  } else {
    uv_signal_init(&a.loop, &a.sigterm);
    uv_signal_init(&a.loop, &a.sigint);
    uv_signal_init(&a.loop, &a.sighup);
    a.sigterm.data = a.sigint.data = a.sighup.data = &a;
    a.signals_open = 1;
    uv_signal_start(&a.sigterm, on_signal, SIGTERM);
    uv_signal_start(&a.sigint, on_signal, SIGINT);
    uv_signal_start(&a.sighup, on_sighup, SIGHUP);
    if (a.cfg.warmup[0])
      cgs_info("warming up: %zu shapes from %s; health NOT_SERVING until "
               "done",
               a.server.warmup.n, a.cfg.warmup);
  }
  /* Runs until every handle is closed: after a drain, or at once after a
   * failed start (only close callbacks are left then). */
  uv_run(&a.loop, UV_RUN_DEFAULT);
  cgs_server_close(&a.server);
  if (uv_loop_close(&a.loop) != 0) {
    cgs_error("internal: libuv handles left open at exit");
    exit_code = 1;
  }
  grpc_shutdown();
  cgs_buf_drain();
  if (exit_code == 0)
    cgs_info("stopped");
  return exit_code;
}
