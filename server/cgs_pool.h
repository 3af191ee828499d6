/* cgs_pool.h - the compute worker pool: pthreads pinned to configured
 * cores, each owning a cg_engine, fed from one bounded queue in which the
 * callers' flows take turns (start-time fair queueing with one unit a
 * job: round robin between flows, first come first served within one,
 * but that a flow's data-gradient job passes its own waiting
 * weight-gradient jobs); a new job wakes an idle worker on the submitting
 * core if there is one.
 *
 * Threads: any thread may call these functions (one mutex) but
 * cgs_pool_new and cgs_pool_close, and the completion-queue thread's own
 * two. done_cb runs on the worker that ran the job, once its place is
 * given back. Compute never runs on the loop thread nor on libuv's
 * threadpool; tiny jobs run on the completion-queue thread
 * (cgs_pool_run_inline). */
#ifndef CGS_POOL_H
#define CGS_POOL_H

#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>

#include <uv.h>

#include "cg/engine.h"
#include "cg/layer.h"
#include "cgs_checks.h"
#include "cgs_config.h"
#include "cgs_fairq.h"

typedef struct cgs_pool cgs_pool;

/* One unit of work. The submitter owns the job and every buffer it points
 * to; the pool borrows them from cgs_pool_submit() until done_cb runs or
 * cgs_pool_cancel() returns 1. */
typedef struct cgs_job {
  /* Filled by the submitter: the outputs of layer, computed in cg_grad
   * order from the request's data inputs in[] into out[g]. */
  const cg_layer *layer;
  const void *in[3];
  void *out[CG_GRAD_COUNT];
  uint64_t call_id; /* what a crash report names (cgs_crash.h) */
  const char *peer;
  atomic_int discard; /* set by the loop: skip the run if not started,
                         and the rest of a sliced run */
  /* Optional: called on the worker as soon as output g is computed when
   * other outputs follow (diff_src before the weights' gradients), so
   * that it can go out while they are computed; out[g] is final then.
   * Not for the last output, nor on the completion-queue thread. */
  void (*output_done)(struct cgs_job *job, int g);
  /* Filled by the pool before done_cb. */
  int rc;        /* 0 or a CG_E* code; CG_EINTERNAL when discarded */
  char err[256]; /* message for rc */
  cg_run_info info[CG_GRAD_COUNT]; /* of each output, valid when rc == 0 */
  double queue_ms;                 /* submit -> a worker picked it up */
  /* CG_GRAD_BIT()s of the outputs checked (cgs_checks.h), and of those
   * answered recomputed after a failed check. */
  unsigned checked, recomputed;
  unsigned worker; /* index of the worker that ran it, or CGS_POOL_CQ */
  /* Pool-private. */
  int warmup; /* a warm-up run on random inputs (cgs_checks_output) */
  uint64_t t_submit;
  uint64_t cq_key;  /* not 0: the layer, which missed the cq engine */
  cgs_fairq_item q; /* its place in the queue */
} cgs_job;

typedef void (*cgs_pool_done_cb)(cgs_job *job, void *data);

/* cgs_job.worker of a job the completion-queue thread ran itself. */
#define CGS_POOL_CQ UINT_MAX

/* Layers whose primitives every worker builds before it takes its first
 * job (--warmup), and who hears when all have. */
typedef struct cgs_pool_warm {
  const cg_layer *layers; /* borrowed until done runs */
  size_t n;
  /* Runs once, on the last worker to finish its warm-up (at once on that
   * thread when n is 0); may be NULL. */
  void (*done)(void *arg);
  void *arg;
} cgs_pool_warm;

/* Starts cfg->workers threads, each pinned, named "cg-worker-N", with its
 * engine created in the thread itself. With warm (may be NULL), each
 * worker then runs every layer of warm->layers with the thread counts a
 * job of it would get on an idle pool (its own cores, and under the
 * adaptive policy every core when the layer is large enough to borrow),
 * so that its engine holds the primitives (oneDNN's JIT compile, 0.2 ms
 * to tens of ms each) and buffers before the first call: at each thread
 * count cfg->check_first_runs times (8 at most) on random inputs, each
 * output checked (the first runs the result checks want, cgs_checks.h),
 * or once unchecked when that is 0; jobs submitted meanwhile wait in the
 * queue. A layer that fails to run or to pass its checks is logged and
 * skipped, and the worker's first runs of every layer are left to the
 * callers. Returns 0, or CG_ENOMEM / CG_EBACKEND (engine creation
 * failed) / CG_EINTERNAL (thread or handle setup failed) with err filled;
 * nothing is left running on failure. */
int cgs_pool_new(cgs_pool **out, const cgs_config *cfg,
                 const cgs_pool_warm *warm, cgs_pool_done_cb done_cb,
                 void *data, char *err, size_t errlen);
/* Holds a place for a job to come: at most workers + queue_depth places
 * are held at once, so that a request is refused when it arrives rather
 * than after its upload. Returns 0, or CG_ELIMIT when every place is
 * held (the caller answers RESOURCE_EXHAUSTED). */
int cgs_pool_reserve(cgs_pool *p);
/* Gives back a place that no job will use. */
void cgs_pool_unreserve(cgs_pool *p);
/* Queues job on a place held with cgs_pool_reserve; the place is given
 * back when the job has run or is cancelled. *flow_turn is the state of
 * the flow job belongs to (0 for a new one), which the caller keeps and
 * only the pool touches, under its lock: the job runs after the waiting
 * jobs of every flow that has had fewer turns, so a flow with one job
 * waiting passes before another's long line. A job whose only output is
 * diff_src goes before its own flow's first waiting job that computes a
 * weight or bias gradient, in that job's turn: a trainer's backward pass
 * waits for grad_input, and its weight gradients can wait, though not for
 * more than CGS_FAIRQ_PASS_MAX such jobs each (cgs_fairq.h). */
void cgs_pool_submit(cgs_pool *p, cgs_job *job, uint64_t *flow_turn);
/* Takes job back if no worker has picked it up: returns 1 and done_cb will
 * not run for it. Returns 0 when it is running or finished (done_cb will
 * run or has run). */
int cgs_pool_cancel(cgs_pool *p, cgs_job *job);
/* Completion-queue thread only: runs job (a place held with
 * cgs_pool_reserve, filled as for cgs_pool_submit) on the calling thread
 * and returns 1 with the place given back and done_cb NOT called, or
 * returns 0 and the caller submits it. It runs there only when its turn
 * would put it first in the queue, ahead of every waiting job (the fair
 * order holds: its turn is taken as a queued job's would be; a worker
 * would take it next, once one is free), the job is under 1 MFLOP and
 * 256 KiB of tensors, and the thread's own engine (one OpenMP thread, the
 * workers' code path) has its primitives cached, or may build them: a worker
 * ran the same layer since it missed there (oneDNN then has the primitive in
 * its global cache), and building stays within 1% of the thread's time, which
 * also bounds a JIT compile when oneDNN's cache has evicted it. A client's new
 * shape is never compiled there on first sight. Not cancellable (it ends in
 * tens of microseconds). */
int cgs_pool_run_inline(cgs_pool *p, cgs_job *job, uint64_t *flow_turn);
/* Completion-queue thread, idle for a while: its engine's buffers go
 * back, as a worker's do. */
void cgs_pool_cq_idle(cgs_pool *p);
/* Workers asleep for want of work. */
unsigned cgs_pool_idle(cgs_pool *p);
/* Jobs waiting for a worker, workers whose cores run a job (their own
 * or, lent, another's) and the jobs the completion-queue thread ran so
 * far, which no worker count includes. Thread-safe, for the metrics'
 * thread, while the pool is open. */
void cgs_pool_load(cgs_pool *p, unsigned *queued, unsigned *busy,
                   uint64_t *inline_jobs);
/* The result checks the pool's jobs go through (owned by the pool). */
cgs_checks *cgs_pool_checks(cgs_pool *p);
/* Mean time a job held its worker, over the last few jobs (0 before the
 * first): what retry hints are made of. Thread-safe. */
double cgs_pool_mean_run_ms(cgs_pool *p);
/* Name of worker i ("cg-worker-0", "cg-cq" for CGS_POOL_CQ); static
 * storage of the pool. */
const char *cgs_pool_worker_name(const cgs_pool *p, unsigned i);
/* Stops the workers after their current job (done_cb runs for it), joins
 * them and frees the pool. No job may be queued. NULL is fine. */
void cgs_pool_close(cgs_pool *p);

#endif
