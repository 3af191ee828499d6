/* metrics.c - owns the metric figures of convgrad-server and their
 * Prometheus text rendering, process_* included (read from /proc). */
#include "cgs_metrics.h"

#include <dirent.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <grpc/status.h>

#include "cg/error.h"
#include "cg/problem.h"
#include "cgw.h"

#define N_OPS (CG_OP_ALL_COUNT + 1) /* 0: unknown */
#define N_DTYPES 4                  /* 0: unknown, then cg_dtype */
#define N_CODES (GRPC_STATUS_UNAUTHENTICATED + 1)

/* Seconds, from a small call's sub-millisecond answer to a large layer's
 * tens of seconds. */
static const double bucket_bounds[] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25,   0.5,   1,      2.5,   5,    10,    30,   60};
#define N_BUCKETS (sizeof bucket_bounds / sizeof bucket_bounds[0])

typedef struct histogram {
  uint64_t count[N_BUCKETS + 1]; /* per bucket, not cumulative; last: +Inf */
  double sum;
} histogram;

enum { H_REQUEST, H_QUEUE, H_COMPUTE, N_HISTOGRAMS };

static const struct {
  const char *name, *help;
} histogram_info[N_HISTOGRAMS] = {
    {"convgrad_request_seconds",
     "Compute calls from their arrival to their end, by op."},
    {"convgrad_queue_seconds", "Time Compute jobs waited for a worker, by op."},
    {"convgrad_compute_seconds",
     "Time workers computed Compute jobs (every output), by op."},
};

/* Everything a scrape shows of the calls, copied whole under the lock. */
typedef struct figures {
  uint64_t requests[N_OPS][N_DTYPES][N_CODES];
  histogram h[N_HISTOGRAMS][N_OPS];
  histogram queue_by_class[CGS_PEER_CLASSES];
  uint64_t refused[CGS_REFUSED_REASONS];
  uint64_t retried;
  uint64_t bytes_in, bytes_out, cache_hits, cache_misses;
  uint64_t stages[N_CODES]; /* Stage calls by status */
  uint64_t staged_bytes;    /* bytes they uploaded */
} figures;

static const char *const refusal_names[CGS_REFUSED_REASONS] = {
    "none", "queue_full", "inflight_bytes", "peer_calls", "draining"};

struct cgs_metrics {
  pthread_mutex_t mu;
  figures f; /* guarded by mu */
  cgs_metrics_gauges_cb gauges_cb;
  void *data;
};

int cgs_metrics_new(cgs_metrics **out, cgs_metrics_gauges_cb gauges_cb,
                    void *data) {
  cgs_metrics *m = calloc(1, sizeof *m);
  *out = m;
  if (!m)
    return CG_ENOMEM;
  pthread_mutex_init(&m->mu, NULL);
  m->gauges_cb = gauges_cb;
  m->data = data;
  return 0;
}

void cgs_metrics_free(cgs_metrics *m) {
  if (!m)
    return;
  pthread_mutex_destroy(&m->mu);
  free(m);
}

static void observe(histogram *h, double seconds) {
  size_t b = 0;
  while (b < N_BUCKETS && seconds > bucket_bounds[b])
    b++;
  h->count[b]++;
  h->sum += seconds;
}

void cgs_metrics_call_ended(cgs_metrics *m, const cgs_metrics_call *c) {
  int op = c->op > 0 && c->op < N_OPS ? c->op : 0;
  int dt = c->dtype > 0 && c->dtype < N_DTYPES ? c->dtype : 0;
  int code = c->code >= 0 && c->code < N_CODES ? c->code : GRPC_STATUS_UNKNOWN;
  pthread_mutex_lock(&m->mu);
  figures *f = &m->f;
  f->requests[op][dt][code]++;
  observe(&f->h[H_REQUEST][op], c->request_s);
  if (c->queued) {
    observe(&f->h[H_QUEUE][op], c->queue_s);
    if (c->peer_class < CGS_PEER_CLASSES)
      observe(&f->queue_by_class[c->peer_class], c->queue_s);
  }
  if (c->refused > CGS_REFUSED_NONE && c->refused < CGS_REFUSED_REASONS)
    f->refused[c->refused]++;
  if (c->retry_attempt)
    f->retried++;
  if (c->computed)
    observe(&f->h[H_COMPUTE][op], c->compute_s);
  f->bytes_in += c->bytes_in;
  f->bytes_out += c->bytes_out;
  f->cache_hits += c->cache_hits;
  f->cache_misses += c->cache_misses;
  pthread_mutex_unlock(&m->mu);
}

void cgs_metrics_stage_ended(cgs_metrics *m, int code, uint64_t bytes_in) {
  code = code >= 0 && code < N_CODES ? code : GRPC_STATUS_UNKNOWN;
  pthread_mutex_lock(&m->mu);
  m->f.stages[code]++;
  m->f.staged_bytes += bytes_in;
  pthread_mutex_unlock(&m->mu);
}

/* ---- rendering --------------------------------------------------------- */

/* A growing text; after a failed allocation every append is dropped and
 * failed stays set. */
typedef struct text {
  char *buf;
  size_t len, cap;
  int failed;
} text;

static void put(text *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void put(text *t, const char *fmt, ...) {
  for (;;) {
    if (t->failed)
      return;
    va_list ap;
    va_start(ap, fmt);
    /* ap is started on the line above; the analyzer loses it on long
     * chains of inlined calls (render_gauges'). */
    // NOLINTNEXTLINE(clang-analyzer-valist.Uninitialized)
    int n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
      t->failed = 1;
      return;
    }
    if ((size_t)n < t->cap - t->len) {
      t->len += (size_t)n;
      return;
    }
    size_t cap = 2 * t->cap + (size_t)n;
    char *b = realloc(t->buf, cap);
    if (!b) {
      t->failed = 1;
      return;
    }
    t->buf = b;
    t->cap = cap;
  }
}

static void family(text *t, const char *name, const char *type,
                   const char *help) {
  put(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A family of one unlabelled sample. */
static void scalar(text *t, const char *name, const char *type,
                   const char *help, uint64_t value) {
  family(t, name, type, help);
  put(t, "%s %" PRIu64 "\n", name, value);
}

static const char *op_label(int op) {
  return op ? cg_op_name((cg_op)op) : "unknown";
}

static const char *dtype_label(int dt) {
  return dt ? cg_dtype_name((cg_dtype)dt) : "unknown";
}

static uint64_t observations(const histogram *h) {
  uint64_t total = 0;
  for (size_t b = 0; b <= N_BUCKETS; b++)
    total += h->count[b];
  return total;
}

/* One series of a histogram family: its buckets, sum and count, labelled
 * label="value". */
static void render_series(text *t, const char *name, const char *label,
                          const char *value, const histogram *h) {
  uint64_t total = observations(h), cumulative = 0;
  for (size_t b = 0; b < N_BUCKETS; b++) {
    cumulative += h->count[b];
    put(t, "%s_bucket{%s=\"%s\",le=\"%g\"} %" PRIu64 "\n", name, label, value,
        bucket_bounds[b], cumulative);
  }
  put(t, "%s_bucket{%s=\"%s\",le=\"+Inf\"} %" PRIu64 "\n", name, label, value,
      total);
  put(t, "%s_sum{%s=\"%s\"} %.9g\n%s_count{%s=\"%s\"} %" PRIu64 "\n", name,
      label, value, h->sum, name, label, value, total);
}

static void render_histogram(text *t, int which, const figures *f) {
  const char *name = histogram_info[which].name;
  family(t, name, "histogram", histogram_info[which].help);
  /* Every known op is shown, so that rate() sees it from zero; calls
   * whose op is unknown only once there are some. */
  for (int op = 0; op < N_OPS; op++)
    if (op || observations(&f->h[which][op]))
      render_series(t, name, "op", op_label(op), &f->h[which][op]);
}

/* Refusals by reason, retries seen, and queue waits by peer class. */
static void render_load(text *t, const figures *f) {
  family(t, "convgrad_refusals_total", "counter",
         "Compute calls refused with retry-after-ms (retry later), by "
         "reason.");
  for (int r = CGS_REFUSED_NONE + 1; r < CGS_REFUSED_REASONS; r++)
    put(t, "convgrad_refusals_total{reason=\"%s\"} %" PRIu64 "\n",
        refusal_names[r], f->refused[r]);
  scalar(t, "convgrad_retried_requests_total", "counter",
         "Compute calls that were a client's retry (convgrad-retry-attempt "
         "metadata).",
         f->retried);
  family(t, "convgrad_queue_wait_seconds", "histogram",
         "Time Compute jobs waited for a worker, by how their client "
         "connects (unix socket, loopback, remote).");
  for (int c = 0; c < CGS_PEER_CLASSES; c++)
    render_series(t, "convgrad_queue_wait_seconds", "peer",
                  cgs_peer_class_name((cgs_peer_class)c),
                  &f->queue_by_class[c]);
}

static void render_calls(text *t, const figures *f) {
  family(t, "convgrad_requests_total", "counter",
         "Compute calls ended, by op, dtype and gRPC status code.");
  for (int op = 0; op < N_OPS; op++)
    for (int dt = 0; dt < N_DTYPES; dt++)
      for (int code = 0; code < N_CODES; code++)
        if (f->requests[op][dt][code])
          put(t,
              "convgrad_requests_total{op=\"%s\",dtype=\"%s\",code=\"%s\"} "
              "%" PRIu64 "\n",
              op_label(op), dtype_label(dt),
              cgw_status_name((grpc_status_code)code),
              f->requests[op][dt][code]);
  for (int h = 0; h < N_HISTOGRAMS; h++)
    render_histogram(t, h, f);
  render_load(t, f);
  scalar(t, "convgrad_received_bytes_total", "counter",
         "Tensor bytes received in Compute requests.", f->bytes_in);
  scalar(t, "convgrad_sent_bytes_total", "counter",
         "Tensor bytes sent in Compute results.", f->bytes_out);
  scalar(t, "convgrad_primitive_cache_hits_total", "counter",
         "oneDNN primitive lookups served from an engine's cache (a "
         "worker's or the completion-queue thread's).",
         f->cache_hits);
  scalar(t, "convgrad_primitive_cache_misses_total", "counter",
         "oneDNN primitive lookups that created the primitives.",
         f->cache_misses);
  family(t, "convgrad_stage_requests_total", "counter",
         "Stage calls ended, by gRPC status code.");
  for (int code = 0; code < N_CODES; code++)
    if (f->stages[code])
      put(t, "convgrad_stage_requests_total{code=\"%s\"} %" PRIu64 "\n",
          cgw_status_name((grpc_status_code)code), f->stages[code]);
  scalar(t, "convgrad_staged_received_bytes_total", "counter",
         "Tensor bytes received in Stage calls.", f->staged_bytes);
}

/* The result checks' counters (cgs_checks.h). */
static void render_checks(text *t, const cgs_checks_counters *c) {
  scalar(t, "convgrad_result_checks_total", "counter",
         "Computed outputs checked by the adjoint identity before they were "
         "answered (--check-rate, --check-first-runs).",
         c->checked);
  scalar(t, "convgrad_result_check_failures_total", "counter",
         "Result checks that failed: a wrong result a kernel or a core "
         "computed.",
         c->failed);
  scalar(t, "convgrad_result_recomputes_total", "counter",
         "Failed outputs recomputed on another implementation, verified and "
         "answered.",
         c->recomputed);
  scalar(t, "convgrad_result_data_loss_total", "counter",
         "Failed outputs no recomputation verified: answered DATA_LOSS.",
         c->lost);
  scalar(t, "convgrad_warmup_result_checks_total", "counter",
         "Outputs of the warm-up's runs on random inputs checked (--warmup): "
         "the first runs --check-first-runs asks for, made before serving.",
         c->warmup_checked);
  scalar(t, "convgrad_warmup_result_check_failures_total", "counter",
         "Warm-up checks that failed: the layer's first calls are checked "
         "again.",
         c->warmup_failed);
  scalar(t, "convgrad_quarantined", "gauge",
         "1 when failed result checks quarantined this replica "
         "(--check-quarantine): health reports NOT_SERVING.",
         c->quarantined);
}

static void render_gauges(text *t, const cgs_metrics_gauges *g) {
  scalar(t, "convgrad_inflight_bytes", "gauge",
         "Tensor bytes reserved by admitted Compute calls.", g->inflight_bytes);
  scalar(t, "convgrad_queued_requests", "gauge",
         "Compute jobs waiting for a worker.", g->queued_requests);
  scalar(t, "convgrad_busy_workers", "gauge",
         "Workers whose cores are running a job.", g->busy_workers);
  scalar(t, "convgrad_inline_jobs_total", "counter",
         "Tiny Compute jobs the completion-queue thread ran itself, in their "
         "turn at the head of the queue; no gauge of workers counts them.",
         g->inline_jobs);
  scalar(t, "convgrad_bulk_deferred_total", "counter",
         "Request messages and result chunks of more than 64 KiB that the "
         "completion-queue thread handled after the events that were ready, "
         "clients taking turns.",
         g->bulk_deferred);
  scalar(t, "convgrad_workers", "gauge", "Compute workers.", g->workers);
  scalar(t, "convgrad_shm_regions", "gauge",
         "Shared-memory regions registered (RegisterRegion).", g->shm_regions);
  const cgs_store_stats *st = &g->store;
  scalar(t, "convgrad_store_bytes", "gauge",
         "Bytes of staged tensors held (--store-bytes), those dropped but "
         "still used by calls included.",
         st->bytes);
  scalar(t, "convgrad_store_entries", "gauge", "Staged tensors listed.",
         st->entries);
  scalar(t, "convgrad_store_hits_total", "counter",
         "Staged tensors found: named by a call, or staged again.", st->hits);
  scalar(t, "convgrad_store_misses_total", "counter",
         "Staged tensors not found: the call failed NOT_FOUND, or the Stage "
         "call uploaded.",
         st->misses);
  scalar(t, "convgrad_store_evictions_total", "counter",
         "Staged tensors dropped to make room (--store-bytes, "
         "--store-peer-share).",
         st->evictions);
  scalar(t, "convgrad_store_expired_total", "counter",
         "Staged tensors dropped after --store-ttl unused.", st->expired);
  render_checks(t, &g->checks);
}

/* ---- process_* ----------------------------------------------------------- */

/* The boot time, in seconds since the epoch, from /proc/stat; 0 if
 * unreadable. */
static double boot_time(void) {
  FILE *fp = fopen("/proc/stat", "r");
  char line[256];
  double btime = 0;
  while (fp && fgets(line, sizeof line, fp))
    if (strncmp(line, "btime ", 6) == 0) {
      btime = strtod(line + 6, NULL);
      break;
    }
  if (fp)
    fclose(fp);
  return btime;
}

static unsigned open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  unsigned n = 0;
  if (!d)
    return 0;
  for (struct dirent *e; (e = readdir(d));)
    n += e->d_name[0] != '.';
  closedir(d);
  return n ? n - 1 : 0; /* not the directory's own descriptor */
}

/* Fields 3..24 of /proc/self/stat, indexed by their proc(5) number (the
 * state, field 3, reads as 0). Returns 0, or -1 without /proc. */
static int read_stat(unsigned long long field[25]) {
  char buf[1024];
  FILE *fp = fopen("/proc/self/stat", "r");
  size_t n = fp ? fread(buf, 1, sizeof buf - 1, fp) : 0;
  if (fp)
    fclose(fp);
  buf[n] = '\0';
  /* The command, field 2, may hold spaces and parentheses. */
  const char *p = strrchr(buf, ')');
  if (!p)
    return -1;
  int k = 3;
  for (p++; k <= 24 && *p == ' '; k++) {
    field[k] = strtoull(p + 1, NULL, 10);
    p = strchr(p + 1, ' ');
    if (!p)
      break;
  }
  return k > 24 ? 0 : -1;
}

uint64_t cgs_metrics_rss_bytes(void) {
  unsigned long long f[25] = {0};
  if (read_stat(f) != 0)
    return 0;
  return f[24] * (uint64_t)sysconf(_SC_PAGESIZE);
}

static void render_process(text *t) {
  unsigned long long f[25] = {0};
  if (read_stat(f) != 0)
    return; /* no /proc: the family is left out rather than made up */
  unsigned long long utime = f[14], stime = f[15], start = f[22], vsize = f[23],
                     rss = f[24];
  double ticks = (double)sysconf(_SC_CLK_TCK);
  long page = sysconf(_SC_PAGESIZE);
  family(t, "process_cpu_seconds_total", "counter",
         "Total user and system CPU time spent in seconds.");
  put(t, "process_cpu_seconds_total %.2f\n", (double)(utime + stime) / ticks);
  family(t, "process_resident_memory_bytes", "gauge",
         "Resident memory size in bytes.");
  put(t, "process_resident_memory_bytes %llu\n",
      rss * (unsigned long long)page);
  family(t, "process_virtual_memory_bytes", "gauge",
         "Virtual memory size in bytes.");
  put(t, "process_virtual_memory_bytes %llu\n", vsize);
  family(t, "process_start_time_seconds", "gauge",
         "Start time of the process since unix epoch in seconds.");
  put(t, "process_start_time_seconds %.2f\n",
      boot_time() + (double)start / ticks);
  scalar(t, "process_open_fds", "gauge", "Number of open file descriptors.",
         open_fds());
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    family(t, "process_max_fds", "gauge",
           "Maximum number of open file descriptors.");
    put(t, "process_max_fds %llu\n", (unsigned long long)rl.rlim_cur);
  }
}

char *cgs_metrics_render(void *data, size_t *len) {
  cgs_metrics *m = data;
  figures *f = malloc(sizeof *f);
  if (!f)
    return NULL;
  pthread_mutex_lock(&m->mu);
  *f = m->f;
  pthread_mutex_unlock(&m->mu);
  cgs_metrics_gauges g = {0};
  if (m->gauges_cb)
    m->gauges_cb(m->data, &g);
  text t = {.cap = 16384};
  t.buf = malloc(t.cap);
  t.failed = !t.buf;
  render_calls(&t, f);
  render_gauges(&t, &g);
  render_process(&t);
  free(f);
  if (t.failed) {
    free(t.buf);
    return NULL;
  }
  *len = t.len;
  return t.buf;
}
