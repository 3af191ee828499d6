/* pool.c - owns the pinned compute workers, their engines and the bounded
 * job queue; a worker hands each finished job to done_cb itself. */
#include "cgs_pool.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cg/dtype.h"
#include "cgs_buf.h"
#include "cgs_crash.h"
#include "cgs_log.h"
#include "cgs_sig.h"

/* Layers a worker ran that the completion-queue thread may build next. */
#define WORKER_BUILT_SLOTS 64

typedef struct worker {
  cgs_pool *pool;
  unsigned index;
  pthread_t thread;
  int started;
  char name[16];     /* pthread names are at most 15 characters */
  cpu_set_t cpus;    /* the cores it is pinned to */
  pthread_cond_t cv; /* a job for it, or stop */
  int waiting;       /* asleep for want of work and not yet woken */
  unsigned lent_to;  /* 1 + index of the worker running on its cores, or
                        0: a lent worker starts no job */
  int *team;         /* cores of the running job's threads, in order */
  int *pinned;       /* cores the engine's team is pinned to */
  int team_threads;  /* threads it is pinned for; 0 = not pinned */
} worker;

struct cgs_pool {
  const cgs_config *cfg;
  cgs_pool_done_cb done_cb;
  void *data;

  pthread_mutex_t mu;
  pthread_cond_t ready_cv; /* a worker finished start-up */
  cgs_fairq queue;         /* waiting jobs (their cgs_job.q) */
  double mean_run_ms;      /* of recent jobs, a moving average */
  unsigned admitted;       /* places held: reserved, queued or running */
  int stop;
  unsigned ready, failed; /* start-up accounting */
  char start_err[320];    /* worker name + engine message */

  unsigned nworkers;
  worker *workers;

  /* The completion-queue thread's jobs (cgs_pool_run_inline): its engine,
   * made for its first job, and the fields below touched by that thread
   * only. */
  cg_engine *cq_engine;
  int cq_engine_failed;    /* its creation failed: workers run every job */
  int cq_holding;          /* its engine keeps buffers from a job */
  uint64_t cq_build_after; /* uv_hrtime before which it builds nothing */
  /* Under mu: the layers (cg_layer_primitives_hash) a worker ran after
   * they missed the cq engine's cache, by the hash's low bits. */
  uint64_t worker_built[WORKER_BUILT_SLOTS];
  uint64_t inline_jobs; /* under mu: jobs the cq thread ran */
  cgs_checks *checks;   /* the jobs' result checks (thread-safe) */

  cgs_pool_warm warm;   /* empty without --warmup */
  unsigned warm_active; /* under mu: workers still warming up */
};

static void pin_and_name(worker *w) {
  /* OpenMP threads the engine starts inherit this mask. */
  int rc = pthread_setaffinity_np(pthread_self(), sizeof w->cpus, &w->cpus);
  if (rc != 0)
    cgs_warn("%s: cannot pin to its cores: %s", w->name, strerror(rc));
  pthread_setname_np(pthread_self(), w->name);
}

/* Core k of worker i's own cores. */
static int own_core(const cgs_pool *p, unsigned i, unsigned k) {
  unsigned tpw = p->cfg->threads_per_worker;
  return p->cfg->cpus.cpu[(i * tpw + k) % p->cfg->cpus.n];
}

/* Work under which a job runs on its worker's own cores even when others
 * are idle: waking a second OpenMP thread, and its spinning afterwards,
 * cost more than it saves. Measured in-process here (AMX Xeon, f32, one
 * thread against two pinned): 2.4 MFLOP 33 against 52 us, 7 MFLOP 81
 * against 124 us, 14 MFLOP 172 against 166 us, 29 MFLOP 269 against 194
 * us; the tiny row (18 KFLOP) 19 against 88 us. */
#define BORROW_MIN_FLOPS 10e6

/* The work of every output job asks for. */
static double job_flops(const cgs_job *job) {
  double flops = 0;
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    if (job->layer->grads & CG_GRAD_BIT(g))
      flops += cg_layer_geom(job->layer, (cg_grad)g)->flops;
  return flops;
}

/* Adaptive policy, with p->mu held, once w has taken job: when no other
 * job waits and job is large enough, w borrows every idle worker, and its
 * job runs on their cores too. Fills w->team and returns the thread
 * count. A borrowed worker stays asleep until give_back(): a running
 * OpenMP team cannot shrink, so a job started on a lent core would share
 * it with a team thread, and both jobs would run at the pace of that
 * shared core. */
static int borrow(cgs_pool *p, worker *w, const cgs_job *job) {
  unsigned tpw = p->cfg->threads_per_worker;
  int n = 0;
  for (unsigned k = 0; k < tpw; k++)
    w->team[n++] = own_core(p, w->index, k);
  if (p->cfg->threads_policy != CGS_THREADS_ADAPTIVE || p->queue.head ||
      job_flops(job) < BORROW_MIN_FLOPS)
    return n;
  for (unsigned i = 0; i < p->nworkers; i++) {
    worker *o = &p->workers[i];
    if (o == w || !o->waiting || o->lent_to)
      continue;
    o->lent_to = w->index + 1;
    for (unsigned k = 0; k < tpw; k++)
      w->team[n++] = own_core(p, i, k);
  }
  return n;
}

static void wake_one(cgs_pool *p);

/* With p->mu held: the workers w borrowed are free again, and wake for
 * the jobs that queued meanwhile (w takes the first itself). */
static void give_back(cgs_pool *p, worker *w) {
  unsigned lent = 0;
  for (unsigned i = 0; i < p->nworkers; i++)
    if (p->workers[i].lent_to == w->index + 1) {
      p->workers[i].lent_to = 0;
      lent++;
    }
  for (unsigned q = 1; q < p->queue.n && lent; q++, lent--)
    wake_one(p);
}

/* Least work of one minibatch slice: 16 GFLOP per thread (80 ms of one
 * avx512 core at 200 GFLOPS) and 16 rows. Slices cost what their weights
 * lose in reuse: with 44 MB of weights (256 -> 256 channels, 13x13),
 * f32 slices of 8 rows ran 7-9% slower than the whole mb 64, of 16 rows
 * 4%; with ResNet's 3x3 layers at mb 128-256, 0-1%. The benchmark
 * problems (under 2 GFLOP) run whole. */
#define SLICE_FLOPS_PER_THREAD 16e9

/* Least time a worker waits idle before it frees its engine's buffers
 * (--keep-warm when longer), so back-to-back jobs keep them. */
#define RELEASE_AFTER_MIN_MS 1000
#define SLICE_MIN_ROWS 16

/* Rows per slice of job's minibatch: the whole of it but for a
 * backward-data job of at least two slices' work, which gets slices of
 * equal size (one cached primitive) but for a smaller last one.
 * Backward-weights jobs run whole: oneDNN cannot accumulate into
 * diff_weights, so each slice would need its own partial result to add
 * up, in f32 for bf16 and f16 outputs, and round differently from one
 * run. */
static int64_t slice_rows(const cg_geom *g, unsigned threads) {
  double per_slice = SLICE_FLOPS_PER_THREAD * threads;
  if (cg_op_outputs_weights(g->op) || g->flops < 2 * per_slice ||
      g->mb < 2 * (int64_t)SLICE_MIN_ROWS)
    return g->mb;
  int64_t n = (int64_t)(per_slice / (g->flops / (double)g->mb)) + 1;
  if (n < SLICE_MIN_ROWS)
    n = SLICE_MIN_ROWS;
  int64_t slices = (g->mb + n - 1) / n;
  return (g->mb + slices - 1) / slices;
}

/* CG_EINTERNAL when the loop no longer wants job, after done of all
 * parts (what they are) ran; else 0. */
static int discarded(cgs_job *job, int64_t done, int64_t all,
                     const char *what) {
  if (!atomic_load(&job->discard))
    return 0;
  snprintf(job->err, sizeof job->err,
           "discarded after %" PRId64 " of %" PRId64 " %s", done, all, what);
  return CG_EINTERNAL;
}

/* Runs job's diff_src in minibatch slices, checking between them whether
 * the job is still wanted: a running primitive cannot be interrupted, a
 * slice ends soon. The rows of a data tensor are contiguous in both
 * layouts. */
static int run_slices(cg_engine *engine, cgs_job *job, unsigned threads) {
  const cg_layer *l = job->layer;
  const cg_geom *g = &l->data;
  const void *in0 = job->in[l->data_in[0]], *in1 = job->in[l->data_in[1]];
  void *out = job->out[CG_GRAD_DIFF_SRC];
  cg_run_info *info = &job->info[CG_GRAD_DIFF_SRC];
  int64_t step = slice_rows(g, threads);
  if (step == g->mb)
    return cg_engine_run(engine, g, in0, in1, out, info, job->err,
                         sizeof job->err);
  size_t in_row = g->in_bytes[0] / (size_t)g->mb;
  size_t out_row = g->out_bytes / (size_t)g->mb;
  double ms = 0;
  for (int64_t r = 0; r < g->mb; r += step) {
    int rc = r ? discarded(job, r, g->mb, "minibatch rows") : 0;
    if (rc != 0)
      return rc;
    cg_geom s;
    cg_geom_slice_mb(g, g->mb - r < step ? g->mb - r : step, &s);
    rc = cg_engine_run(engine, &s, (const char *)in0 + (size_t)r * in_row, in1,
                       (char *)out + (size_t)r * out_row, info, job->err,
                       sizeof job->err);
    if (rc != 0)
      return rc;
    ms += info->compute_ms;
  }
  info->compute_ms = ms;
  return 0;
}

/* Every output of job in order, each through the result checks (none
 * when checks is NULL), checking between them whether the job is still
 * wanted; with early, job->output_done hears of each but the last as
 * soon as it is computed and checked. */
static int run_outputs(cgs_checks *checks, cg_engine *engine, cgs_job *job,
                       unsigned threads, int early) {
  const cg_layer *l = job->layer;
  int done = 0;
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    if (!(l->grads & CG_GRAD_BIT(g)))
      continue;
    int rc = done ? discarded(job, done, cg_layer_noutputs(l), "outputs") : 0;
    if (rc == 0)
      rc = g == CG_GRAD_DIFF_SRC
               ? run_slices(engine, job, threads)
               : cg_engine_run_output(engine, l, (cg_grad)g, job->in,
                                      job->out[g], &job->info[g], job->err,
                                      sizeof job->err);
    if (rc == 0 && checks)
      rc = cgs_checks_output(checks, engine, job, (cg_grad)g, (int)threads);
    if (rc != 0)
      return rc;
    if (++done < cg_layer_noutputs(l) && early && job->output_done)
      job->output_done(job, g);
  }
  return 0;
}

/* Points the engine's team at w->team unless it already is: pinning costs
 * a parallel region. A team that starts the one pinned keeps its pins
 * (cg_engine_set_threads). */
static int pin_team(worker *w, cg_engine *engine, int threads, char *err,
                    size_t errlen) {
  size_t bytes = (size_t)threads * sizeof *w->team;
  if (threads <= w->team_threads && memcmp(w->team, w->pinned, bytes) == 0)
    return cg_engine_set_threads(engine, threads, NULL, err, errlen);
  int rc = cg_engine_set_threads(engine, threads, w->team, err, errlen);
  w->team_threads = rc == 0 ? threads : 0;
  if (rc == 0)
    memcpy(w->pinned, w->team, bytes);
  return rc;
}

/* Readies job's figures for a run by runner, a worker (CGS_POOL_CQ: the
 * completion-queue thread) from t0 on; 0 when the job is still wanted. */
static int job_begin(cgs_job *job, unsigned runner, uint64_t t0) {
  job->queue_ms = (double)(t0 - job->t_submit) / 1e6;
  job->worker = runner;
  job->err[0] = '\0';
  memset(job->info, 0, sizeof job->info);
  job->checked = job->recomputed = 0;
  if (!atomic_load(&job->discard))
    return 0;
  /* Cancelled after it was picked: nobody wants the result. */
  job->rc = CG_EINTERNAL;
  snprintf(job->err, sizeof job->err, "discarded before it ran");
  return -1;
}

static void run_job(worker *w, cg_engine *engine, cgs_job *job, int threads) {
  if (job_begin(job, w->index, uv_hrtime()) != 0)
    return;
  cgs_debug("%s runs a job with %d threads after %.3f ms in the queue", w->name,
            threads, job->queue_ms);
  cgs_crash_job_start(w->index, job->call_id, job->peer, job->layer);
  job->rc = pin_team(w, engine, threads, job->err, sizeof job->err);
  if (job->rc == 0)
    job->rc = run_outputs(w->pool->checks, engine, job, (unsigned)threads, 1);
  cgs_crash_job_end(w->index);
}

/* Checked runs the warm-up makes of a layer at one thread count, at
 * most: --check-first-runs may ask for up to a million, and start-up
 * must end; the callers' runs after these are checked up to its count. */
#define WARM_RUNS_MAX 8

/* The checked runs warm_run makes at each thread count. */
static unsigned warm_runs(const cgs_pool *p) {
  unsigned n = p->cfg->check_first_runs;
  return n < WARM_RUNS_MAX ? n : WARM_RUNS_MAX;
}

/* Runs the outputs of job on team (n cores, pinned): warm_runs() times,
 * each on inputs drawn afresh from *fill and each output checked, so
 * that these runs are the first runs of the layer the result checks want
 * on this engine (cgs_checks.h); once on its zeroed inputs without
 * checks when --check-first-runs is 0. Returns 0 or the failure's code
 * with job->err filled. */
static int warm_run(worker *w, cg_engine *engine, cgs_job *job, int n,
                    uint64_t *fill) {
  const cg_layer *l = job->layer;
  unsigned runs = warm_runs(w->pool);
  cgs_checks *checks = runs ? w->pool->checks : NULL;
  int rc = pin_team(w, engine, n, job->err, sizeof job->err);
  for (unsigned r = 0; rc == 0 && r < (runs ? runs : 1); r++) {
    for (int i = 0; checks && i < l->ninputs && i < 3; i++)
      cg_fill_uniform(l->dtype, (void *)job->in[i],
                      l->in_bytes[i] / cg_dtype_size(l->dtype), fill);
    rc = run_outputs(checks, engine, job, (unsigned)n, 0);
  }
  return rc;
}

/* Runs layer l (see warm_run) on its own buffers, freed here into the
 * buffer cache, whose pages the first call's tensors then reuse, with
 * each thread count a job of l gets on an idle pool: w's own cores, and
 * every core when borrow() would lend them. Returns 0 or a CG_E* code
 * with job->err filled. */
static int warm_layer(worker *w, cg_engine *engine, const cg_layer *l,
                      cgs_job *job) {
  cgs_pool *p = w->pool;
  void *bufs[3 + CG_GRAD_COUNT] = {0};
  int rc = 0, nb = 0;
  uint64_t fill = cg_layer_primitives_hash(l);
  memset(job, 0, sizeof *job);
  job->layer = l;
  job->warmup = 1;
  atomic_init(&job->discard, 0);
  for (int i = 0; i < l->ninputs && i < 3; i++, nb++)
    if (!(bufs[nb] = cgs_buf_alloc(l->in_bytes[i])))
      rc = CG_ENOMEM;
    else
      job->in[i] = memset(bufs[nb], 0, l->in_bytes[i]);
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    if (l->grads & CG_GRAD_BIT(g)) {
      if (!(bufs[nb] = cgs_buf_alloc(l->out_bytes[g])))
        rc = CG_ENOMEM;
      job->out[g] = bufs[nb++];
    }
  if (rc)
    snprintf(job->err, sizeof job->err, "out of memory for its tensors");
  unsigned tpw = p->cfg->threads_per_worker;
  int n = 0;
  for (unsigned k = 0; k < tpw; k++)
    w->team[n++] = own_core(p, w->index, k);
  if (!rc)
    rc = warm_run(w, engine, job, n, &fill);
  if (!rc && p->cfg->threads_policy == CGS_THREADS_ADAPTIVE &&
      p->nworkers > 1 && job_flops(job) >= BORROW_MIN_FLOPS) {
    for (unsigned i = 0; i < p->nworkers; i++)
      for (unsigned k = 0; i != w->index && k < tpw; k++)
        w->team[n++] = own_core(p, i, k);
    rc = warm_run(w, engine, job, n, &fill);
  }
  for (int i = 0; i < nb; i++)
    cgs_buf_free(bufs[i]);
  return rc;
}

/* Builds every warm-up layer on w's engine before w takes a job, then
 * tells the pool's warm.done if w was the last. A tiny layer is also
 * marked built for the completion-queue thread, which then builds it from
 * oneDNN's global cache on its first call rather than sending it to a
 * worker. */
static void warm_up(worker *w, cg_engine *engine) {
  cgs_pool *p = w->pool;
  cgs_job job;
  int failed = 0;
  uint64_t t0 = uv_hrtime();
  for (size_t i = 0; i < p->warm.n; i++) {
    const cg_layer *l = &p->warm.layers[i];
    pthread_mutex_lock(&p->mu);
    int stop = p->stop;
    pthread_mutex_unlock(&p->mu);
    if (stop)
      break;
    if (warm_layer(w, engine, l, &job) != 0) {
      cgs_warn("%s: warm-up layer %zu (%s): %s; skipped", w->name, i + 1,
               cg_op_name(l->op), job.err);
      failed = 1;
      continue;
    }
    uint64_t key = cg_layer_primitives_hash(l);
    pthread_mutex_lock(&p->mu);
    p->worker_built[key % WORKER_BUILT_SLOTS] = key;
    pthread_mutex_unlock(&p->mu);
  }
  /* A layer that failed (its check among others) may have run unchecked
   * or wrong: every layer's first calls are checked then, as without
   * warm-up. */
  if (failed)
    cg_engine_forget_runs(engine);
  if (p->warm.n)
    cgs_info("%s: warmed up %zu layers in %.1f ms, %zu cached, checked "
             "runs: %u a layer and thread count",
             w->name, p->warm.n, (double)(uv_hrtime() - t0) / 1e6,
             cg_engine_cache_size(engine), warm_runs(p));
  pthread_mutex_lock(&p->mu);
  int last = --p->warm_active == 0;
  pthread_mutex_unlock(&p->mu);
  if (last && p->warm.done)
    p->warm.done(p->warm.arg);
}

cgs_checks *cgs_pool_checks(cgs_pool *p) {
  return p->checks;
}

/* Jobs the moving average of run times spans, about. */
#define MEAN_RUN_JOBS 8

static void *worker_main(void *arg) {
  worker *w = arg;
  cgs_pool *p = w->pool;
  cgs_sig_block_async();
  pin_and_name(w);

  cg_engine *engine = NULL;
  cg_engine_config ecfg = {.threads = (int)p->cfg->threads_per_worker,
                           .cache_capacity = 0};
  char err[256] = "";
  int rc = cg_engine_new(&engine, &ecfg, err, sizeof err);
  pthread_mutex_lock(&p->mu);
  if (rc != 0) {
    p->failed++;
    snprintf(p->start_err, sizeof p->start_err, "%s: engine: %s", w->name, err);
  } else {
    p->ready++;
  }
  pthread_cond_broadcast(&p->ready_cv);
  pthread_mutex_unlock(&p->mu);
  if (rc != 0)
    return NULL;
  warm_up(w, engine);

  /* The engine keeps buffers from the last job, released once idle for
   * --keep-warm (1 s at least); not those warm-up left, which are what the
   * first call of a warmed shape needs however long it takes to come (else it
   * faults them in again: res2a's first compute after 1.5 s idle took
   * 150-480 ms released, 60-110 kept, its repeats 40; load 4-6). Bounded
   * by the --warmup list. */
  int holding = 0;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    while (!p->stop && (!p->queue.head || w->lent_to)) {
      w->waiting = 1;
      if (!holding) {
        pthread_cond_wait(&w->cv, &p->mu);
        continue;
      }
      /* Idle for --keep-warm: the engine's buffers (up to several times
       * a job's tensors, outside --max-inflight-bytes) go back to the
       * heap, and to the system with the housekeeping's trim, so an idle
       * server holds only what its budget says. Until then a trainer's
       * next step finds them mapped: those over M_MMAP_THRESHOLD (main.c)
       * are unmapped when freed, and a batch-32 conv1 weights call after
       * 1.5 s idle took 400-416 ms against 55 back to back when they were
       * freed after 1 s. Not trimmed here: malloc_trim walks the one
       * arena with its lock held (145 ms under bench_fair's load), and
       * every other thread's malloc waits for it. */
      uint64_t after_ms = p->cfg->keep_warm_ms > RELEASE_AFTER_MIN_MS
                              ? p->cfg->keep_warm_ms
                              : RELEASE_AFTER_MIN_MS;
      struct timespec until;
      clock_gettime(CLOCK_REALTIME, &until);
      uint64_t ns = (uint64_t)until.tv_nsec + after_ms % 1000 * 1000000;
      until.tv_sec += (time_t)(after_ms / 1000 + ns / 1000000000);
      until.tv_nsec = (long)(ns % 1000000000);
      if (pthread_cond_timedwait(&w->cv, &p->mu, &until) == ETIMEDOUT &&
          !p->queue.head) {
        w->waiting = 0; /* busy for a moment: submit should wake another */
        pthread_mutex_unlock(&p->mu);
        size_t n = cg_engine_release(engine);
        cgs_debug("%s idle: released %zu bytes of engine buffers", w->name, n);
        holding = 0;
        pthread_mutex_lock(&p->mu);
      }
    }
    w->waiting = 0;
    cgs_fairq_item *it = w->lent_to ? NULL : cgs_fairq_pop(&p->queue);
    if (!it) { /* stop requested and nothing queued */
      pthread_mutex_unlock(&p->mu);
      break;
    }
    cgs_job *job = cgs_container_of(it, cgs_job, q);
    int threads = borrow(p, w, job);
    pthread_mutex_unlock(&p->mu);

    uint64_t t0 = uv_hrtime();
    run_job(w, engine, job, threads);
    double ms = (double)(uv_hrtime() - t0) / 1e6;
    holding = 1;
    pthread_mutex_lock(&p->mu);
    p->mean_run_ms =
        p->mean_run_ms > 0
            ? p->mean_run_ms + (ms - p->mean_run_ms) / MEAN_RUN_JOBS
            : ms;
    give_back(p, w);
    p->admitted--; /* the job's place */
    if (job->cq_key && job->rc == 0)
      p->worker_built[job->cq_key % WORKER_BUILT_SLOTS] = job->cq_key;
    pthread_mutex_unlock(&p->mu);
    /* The answer starts from here: handing the job to another thread
     * would cost a wake-up before its first byte goes out. */
    p->done_cb(job, p->data);
  }
  cg_engine_free(engine);
  return NULL;
}

static void pool_free(cgs_pool *p) {
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->ready_cv);
  for (unsigned i = 0; p->workers && i < p->nworkers; i++) {
    pthread_cond_destroy(&p->workers[i].cv);
    free(p->workers[i].team);
  }
  free(p->workers);
  cg_engine_free(p->cq_engine);
  cgs_checks_free(p->checks);
  free(p);
}

static void stop_and_join(cgs_pool *p) {
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  for (unsigned i = 0; i < p->nworkers; i++)
    pthread_cond_signal(&p->workers[i].cv);
  pthread_mutex_unlock(&p->mu);
  for (unsigned i = 0; i < p->nworkers; i++)
    if (p->workers[i].started)
      pthread_join(p->workers[i].thread, NULL);
}

int cgs_pool_new(cgs_pool **out, const cgs_config *cfg,
                 const cgs_pool_warm *warm, cgs_pool_done_cb done_cb,
                 void *data, char *err, size_t errlen) {
  int rc = 0;
  *out = NULL;
  cgs_pool *p = calloc(1, sizeof *p);
  if (!p)
    return cg_errorf(err, errlen, CG_ENOMEM, "pool: out of memory");
  p->cfg = cfg;
  p->done_cb = done_cb;
  p->data = data;
  p->nworkers = cfg->workers;
  if (warm)
    p->warm = *warm;
  p->warm_active = p->nworkers;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->ready_cv, NULL);
  p->workers = calloc(p->nworkers, sizeof *p->workers);
  if (!p->workers || cgs_checks_new(&p->checks, cfg) != 0) {
    rc = cg_errorf(err, errlen, CG_ENOMEM, "pool: out of memory");
    goto fail_workers;
  }
  for (unsigned i = 0; i < p->nworkers; i++) {
    worker *w = &p->workers[i];
    pthread_cond_init(&w->cv, NULL);
    size_t most = (size_t)p->nworkers * cfg->threads_per_worker;
    w->team = malloc(2 * most * sizeof *w->team);
    w->pinned = w->team + most;
    if (!w->team) {
      rc = cg_errorf(err, errlen, CG_ENOMEM, "pool: out of memory");
      goto fail_workers;
    }
    CPU_ZERO(&w->cpus);
    for (unsigned k = 0; k < cfg->threads_per_worker; k++) {
      unsigned slot = (i * cfg->threads_per_worker + k) % cfg->cpus.n;
      CPU_SET(cfg->cpus.cpu[slot], &w->cpus);
    }
  }
  for (unsigned i = 0; i < p->nworkers; i++) {
    worker *w = &p->workers[i];
    w->pool = p;
    w->index = i;
    snprintf(w->name, sizeof w->name, "cg-worker-%u", i % 100000u);
    int e = pthread_create(&w->thread, NULL, worker_main, w);
    if (e != 0) {
      rc = cg_errorf(err, errlen, CG_EINTERNAL, "pool: pthread_create: %s",
                     strerror(e));
      goto fail_threads;
    }
    w->started = 1;
  }
  pthread_mutex_lock(&p->mu);
  while (p->ready + p->failed < p->nworkers)
    pthread_cond_wait(&p->ready_cv, &p->mu);
  pthread_mutex_unlock(&p->mu);
  if (p->failed) {
    rc = cg_errorf(err, errlen, CG_EBACKEND, "%s", p->start_err);
    goto fail_threads;
  }
  *out = p;
  return 0;

fail_threads:
  stop_and_join(p);
  pool_free(p);
  return rc;
fail_workers:
  pool_free(p);
  return rc;
}

/* Picks a sleeping worker for a new job (with p->mu held), preferring one
 * pinned to the core the caller runs on: the hand-off to it and back then
 * stays on one core (an eventfd round trip cost 4.9 us here, 18.1 us
 * across cores), and marks it woken; NULL when none sleeps. A busy pool
 * needs no wake-up: workers look at the queue before they sleep. */
static worker *pick_sleeper(cgs_pool *p) {
  int cpu = sched_getcpu();
  worker *pick = NULL;
  for (unsigned i = 0; i < p->nworkers; i++) {
    worker *w = &p->workers[i];
    if (!w->waiting || w->lent_to)
      continue;
    if (!pick)
      pick = w;
    if (cpu >= 0 && CPU_ISSET(cpu, &w->cpus)) {
      pick = w;
      break;
    }
  }
  if (pick)
    pick->waiting = 0; /* the next job wakes another one */
  return pick;
}

/* Wakes a sleeping worker for a new job, with p->mu held. */
static void wake_one(cgs_pool *p) {
  worker *w = pick_sleeper(p);
  if (w)
    pthread_cond_signal(&w->cv);
}

int cgs_pool_reserve(cgs_pool *p) {
  int rc = 0;
  pthread_mutex_lock(&p->mu);
  if (p->admitted >= p->nworkers + p->cfg->queue_depth)
    rc = CG_ELIMIT;
  else
    p->admitted++;
  pthread_mutex_unlock(&p->mu);
  return rc;
}

void cgs_pool_unreserve(cgs_pool *p) {
  pthread_mutex_lock(&p->mu);
  p->admitted--;
  pthread_mutex_unlock(&p->mu);
}

void cgs_pool_submit(cgs_pool *p, cgs_job *job, uint64_t *flow_turn) {
  const unsigned data_only = CG_GRAD_BIT(CG_GRAD_DIFF_SRC);
  /* A data-gradient job passes its flow's weight-gradient jobs. */
  job->q.urgent = job->layer->grads == data_only;
  job->q.deferrable = (job->layer->grads & ~data_only) != 0;
  pthread_mutex_lock(&p->mu);
  job->t_submit = uv_hrtime();
  cgs_fairq_push(&p->queue, &job->q, flow_turn);
  worker *w = pick_sleeper(p);
  pthread_mutex_unlock(&p->mu);
  /* Signalled after the unlock: a worker woken while the mutex is held
   * runs at once on the other core and sleeps again on the mutex (its
   * futex wait and wake were 6% of a tiny call's server time). A worker
   * that wakes meanwhile by itself takes the job and finds no work
   * after this signal. */
  if (w)
    pthread_cond_signal(&w->cv);
}

/* With p->mu held. */
static unsigned idle_workers(const cgs_pool *p) {
  unsigned n = 0;
  for (unsigned i = 0; i < p->nworkers; i++)
    n += p->workers[i].waiting && !p->workers[i].lent_to;
  return n;
}

/* Work under which a job may run on the completion-queue thread: the
 * tiny row (18 KFLOP) ran 19 us on one thread here (AMX Xeon, f32), and
 * a job of 1 MFLOP runs for tens of microseconds, about what its hand-off
 * to a worker and back costs (a wake-up each way); above it, the calls
 * whose bytes the cq thread moves would wait longer than the hand-off
 * saves. */
#define INLINE_MAX_FLOPS 1e6
/* ... and whose tensors, in and out, come to at most this: FLOPs count
 * products only, and a strided job of a few FLOPs may write a large
 * tensor of zeros (diff_src of a 1x1 kernel with a large stride). Here,
 * on one thread: such jobs of 64-256 KiB ran 40-70 us, one of 1 MiB and
 * 128 FLOPs 3-5 ms. It also bounds the buffers the cq engine keeps
 * between jobs. */
#define INLINE_MAX_BYTES ((size_t)256 << 10)
/* The cq thread spends at most 1/INLINE_BUILD_SHARE of its time building
 * primitives: after a build that took t, none for INLINE_BUILD_SHARE * t.
 * A build of a layer a worker just ran takes oneDNN's primitive from its
 * global cache (0.03-0.11 ms for tiny problems here, against 0.2-0.8 ms
 * for a JIT compile, which that bound also covers when oneDNN's cache has
 * evicted it). */
#define INLINE_BUILD_SHARE 100

/* The bytes of job's tensors, in and out. */
static size_t job_bytes(const cgs_job *job) {
  const cg_layer *l = job->layer;
  size_t bytes = 0;
  for (int i = 0; i < l->ninputs && i < 3; i++)
    bytes += l->in_bytes[i];
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    if (l->grads & CG_GRAD_BIT(g))
      bytes += l->out_bytes[g];
  return bytes;
}

/* 0 when the cq thread has its engine (made on its first tiny job). */
static int cq_engine_ready(cgs_pool *p) {
  if (p->cq_engine || p->cq_engine_failed)
    return p->cq_engine ? 0 : -1;
  cg_engine_config ecfg = {.threads = 1, .cache_capacity = 0};
  char err[256];
  if (cg_engine_new(&p->cq_engine, &ecfg, err, sizeof err) == 0)
    return 0;
  p->cq_engine_failed = 1;
  cgs_warn("cg-cq: no engine for tiny jobs, workers run them: %s", err);
  return -1;
}

int cgs_pool_run_inline(cgs_pool *p, cgs_job *job, uint64_t *flow_turn) {
  job->cq_key = 0;
  if (job_flops(job) >= INLINE_MAX_FLOPS || job_bytes(job) > INLINE_MAX_BYTES ||
      cq_engine_ready(p) != 0)
    return 0;
  int cached = cg_engine_layer_cached(p->cq_engine, job->layer);
  uint64_t key = cached ? 0 : cg_layer_primitives_hash(job->layer);
  uint64_t t0 = uv_hrtime();
  pthread_mutex_lock(&p->mu);
  int build = !cached && key && t0 >= p->cq_build_after &&
              p->worker_built[key % WORKER_BUILT_SLOTS] == key;
  /* Its turn would put it first in the queue: a worker would take it
   * next, once one is free (a running job cannot be interrupted), so it
   * passes no one by running now. Ties go to the jobs waiting. */
  if (!cgs_fairq_would_lead(&p->queue, flow_turn) || !(cached || build)) {
    pthread_mutex_unlock(&p->mu);
    job->cq_key = key; /* a worker's run of it lets the cq thread build it */
    return 0;
  }
  job->t_submit = t0;
  cgs_fairq_take_turn(&p->queue, flow_turn);
  p->inline_jobs++;
  pthread_mutex_unlock(&p->mu);

  if (job_begin(job, CGS_POOL_CQ, t0) == 0) {
    cgs_crash_job_start(CGS_CRASH_CQ, job->call_id, job->peer, job->layer);
    job->rc = run_outputs(p->checks, p->cq_engine, job, 1, 0);
    cgs_crash_job_end(CGS_CRASH_CQ);
  }
  uint64_t t1 = uv_hrtime();
  p->cq_holding = 1;
  if (build)
    p->cq_build_after = t1 + (t1 - t0) * INLINE_BUILD_SHARE;
  /* mean_run_ms stays the workers': what a waiting job waits for. */
  pthread_mutex_lock(&p->mu);
  p->admitted--; /* the job's place */
  pthread_mutex_unlock(&p->mu);
  return 1;
}

void cgs_pool_cq_idle(cgs_pool *p) {
  if (!p->cq_holding)
    return;
  size_t n = cg_engine_release(p->cq_engine); /* trimmed as a worker's */
  p->cq_holding = 0;
  cgs_debug("cg-cq idle: released %zu bytes of engine buffers", n);
}

int cgs_pool_cancel(cgs_pool *p, cgs_job *job) {
  int removed = 0;
  pthread_mutex_lock(&p->mu);
  if (job->q.queued) {
    cgs_fairq_remove(&p->queue, &job->q);
    p->admitted--;
    removed = 1;
  }
  pthread_mutex_unlock(&p->mu);
  return removed;
}

unsigned cgs_pool_idle(cgs_pool *p) {
  pthread_mutex_lock(&p->mu);
  unsigned n = idle_workers(p);
  pthread_mutex_unlock(&p->mu);
  return n;
}

void cgs_pool_load(cgs_pool *p, unsigned *queued, unsigned *busy,
                   uint64_t *inline_jobs) {
  pthread_mutex_lock(&p->mu);
  *queued = (unsigned)p->queue.n;
  *busy = p->nworkers - idle_workers(p);
  *inline_jobs = p->inline_jobs;
  pthread_mutex_unlock(&p->mu);
}

double cgs_pool_mean_run_ms(cgs_pool *p) {
  pthread_mutex_lock(&p->mu);
  double ms = p->mean_run_ms;
  pthread_mutex_unlock(&p->mu);
  return ms;
}

const char *cgs_pool_worker_name(const cgs_pool *p, unsigned i) {
  if (i == CGS_POOL_CQ)
    return "cg-cq";
  return i < p->nworkers ? p->workers[i].name : "?";
}

void cgs_pool_close(cgs_pool *p) {
  if (!p)
    return;
  stop_and_join(p);
  pool_free(p);
}
