/* async.c - asynchronous calls on the channel's engine: one completion
 * queue that every asynchronous call of the channel uses, driven by one
 * thread (started with the first call), which advances each call's state
 * machine (compute.c's cgc__job: batches, retries, the waits between them)
 * as its events arrive. Any number of calls in flight cost no thread of
 * their own. The caller waits for some outputs (cgc_call_wait) or the
 * whole call (cgc_call_finish), or hears of its end (cgc_call_start_notify).
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

struct cgc_call {
  const cgc__call_ops *ops; /* a Compute job's, or a split call's */
  void *obj;
  cgc__call_whole_fn on_whole; /* may be NULL */
  cgc_call_end_fn notify;      /* may be NULL */
  void *notify_arg;
  pthread_mutex_t mu;
  pthread_cond_t changed; /* an output became whole, or the call ended */
  unsigned whole;         /* outputs whole so far */
  int ended;              /* the call's result is final */
};

/* One thread drives the queue: a call's events are handled one at a time
 * whichever thread runs them (cgc__job's lock), and on the two cores this
 * service is measured on a second thread only competes with the server;
 * the CPU a call costs is a few tens of microseconds of event handling. */
static void *cgc__engine_main(void *arg) {
  grpc_completion_queue *cq = arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(
        cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN)
      return NULL;
    if (ev.type == GRPC_OP_COMPLETE)
      cgc__tag_run(ev);
  }
}

/* The engine's queue, its thread started on first use. Signals stay with
 * the caller's threads (a Python trainer's SIGINT goes to its main
 * thread). NULL after filling st when the thread cannot start. */
static grpc_completion_queue *cgc__engine_cq(cgc_channel *ch, cgc_status *st) {
  cgc__engine *e = &ch->engine;
  pthread_mutex_lock(&e->mu);
  if (!e->cq) {
    sigset_t all, old;
    sigfillset(&all);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&e->thread, NULL, cgc__engine_main, cq);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == 0) {
      pthread_setname_np(e->thread, "cgc-engine");
      e->cq = cq;
    } else {
      grpc_completion_queue_shutdown(cq);
      grpc_completion_queue_destroy(cq);
      cgc__status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED,
                      "cannot start the channel's engine thread");
    }
  }
  grpc_completion_queue *cq = e->cq;
  pthread_mutex_unlock(&e->mu);
  return cq;
}

void cgc__engine_init(cgc__engine *e) {
  memset(e, 0, sizeof *e);
  pthread_mutex_init(&e->mu, NULL);
}

void cgc__engine_close(cgc__engine *e) {
  if (e->cq) {
    /* No call is in flight: the queue is empty, and shutting it down ends
     * the thread's wait. */
    grpc_completion_queue_shutdown(e->cq);
    pthread_join(e->thread, NULL);
    grpc_completion_queue_destroy(e->cq);
    e->cq = NULL;
  }
  pthread_mutex_destroy(&e->mu);
}

void cgc__call_whole(void *arg, unsigned whole) {
  cgc_call *c = arg;
  pthread_mutex_lock(&c->mu);
  c->whole = whole;
  pthread_cond_broadcast(&c->changed);
  if (c->on_whole)
    c->on_whole(c, c->notify_arg, whole);
  pthread_mutex_unlock(&c->mu);
}

void cgc__call_ended(void *arg) {
  cgc_call *c = arg;
  /* Read before the call is marked ended: from then on a waiter may
   * finish and free it. */
  cgc_call_end_fn notify = c->notify;
  void *notify_arg = c->notify_arg;
  pthread_mutex_lock(&c->mu);
  c->ended = 1;
  pthread_cond_broadcast(&c->changed);
  /* Under the lock, so that the call outlives the notification: a
   * cgc_call_finish waits for the lock before it frees it. */
  if (notify)
    notify(c, notify_arg);
  pthread_mutex_unlock(&c->mu);
}

cgc_call *cgc__call_new(const cgc__call_ops *ops, void *obj,
                        cgc__call_whole_fn on_whole, cgc_call_end_fn notify,
                        void *arg) {
  cgc_call *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->ops = ops;
  c->obj = obj;
  c->on_whole = on_whole;
  c->notify = notify;
  c->notify_arg = arg;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->changed, NULL);
  return c;
}

static unsigned cgc__job_ops_wants(const void *j) {
  return cgc__job_wants(j);
}
static int cgc__job_ops_result(void *j, cgc_result *res, cgc_status *st) {
  return cgc__job_result(j, res, st);
}
static void cgc__job_ops_take(void *j, cgc_tensor *out[CG_GRAD_COUNT]) {
  cgc__job_take(j, out);
}
static void cgc__job_ops_free(void *j) {
  cgc__job_free(j);
}
static void cgc__job_ops_cancel(void *j) {
  cgc__job_cancel(j);
}
static const cgc__call_ops cgc__job_ops = {
    cgc__job_ops_wants, cgc__job_ops_result, cgc__job_ops_take,
    cgc__job_ops_free, cgc__job_ops_cancel};

int cgc__call_start(cgc_channel *ch, const cgc_request *req,
                    void *const data[CG_GRAD_COUNT],
                    const size_t cap[CG_GRAD_COUNT], cgc__check_mode check,
                    cgc__call_whole_fn on_whole, cgc_call_end_fn notify,
                    void *arg, cgc_call **out, cgc_status *st) {
  cgc__job *job;
  *out = NULL;
  int rc = cgc__job_new(&job, ch, req, data, cap, check, st);
  if (rc)
    return rc;
  grpc_completion_queue *cq = cgc__engine_cq(ch, st);
  cgc_call *c =
      cq ? cgc__call_new(&cgc__job_ops, job, on_whole, notify, arg) : NULL;
  if (!c) {
    cgc__job_free(job);
    if (cq)
      cgc__status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return CG_ENOMEM;
  }
  *out = c;
  cgc__status_ok(st);
  /* The call may end, and be told so, before this returns. */
  cgc__job_start(job, cq, cgc__deadline(ch, req->deadline_ms), cgc__call_whole,
                 cgc__call_ended, c);
  return 0;
}

/* c->mu held: 1 once the outputs in grads are whole or the call ended. */
static int cgc__call_settled(const cgc_call *c, unsigned grads) {
  return c->ended || (c->whole & grads) == grads;
}

int cgc_call_wait(cgc_call *c, unsigned grads, int64_t timeout_ms,
                  cgc_status *st) {
  unsigned wants = c->ops->wants(c->obj);
  grads = grads ? grads & wants : wants;
  struct timespec until;
  if (timeout_ms >= 0)
    cgc__clock_after_ms(CLOCK_REALTIME, (double)timeout_ms, &until);
  int rc = 0;
  pthread_mutex_lock(&c->mu);
  /* Any error ends the wait (ETIMEDOUT, or EINVAL for a deadline the
   * clock cannot take), which otherwise would come back at once with
   * the mutex held, for ever. */
  while (!cgc__call_settled(c, grads) && rc == 0)
    rc = timeout_ms >= 0 ? pthread_cond_timedwait(&c->changed, &c->mu, &until)
                         : pthread_cond_wait(&c->changed, &c->mu);
  if ((c->whole & grads) == grads)
    rc = 0;
  else if (c->ended) {
    rc = c->ops->result(c->obj, NULL, st);
    if (!rc)
      rc = CGC_EPROTO; /* ended well without an output */
  } else {
    rc = CGC_ETIMEDOUT;
    cgc__status_set(st, GRPC_STATUS_DEADLINE_EXCEEDED,
                    "waited %lld ms; the call goes on", (long long)timeout_ms);
  }
  pthread_mutex_unlock(&c->mu);
  if (rc == 0)
    cgc__status_ok(st);
  return rc;
}

void cgc__call_cancel(cgc_call *c) {
  c->ops->cancel(c->obj);
}

int cgc_call_done(cgc_call *c) {
  pthread_mutex_lock(&c->mu);
  int ended = c->ended;
  pthread_mutex_unlock(&c->mu);
  return ended;
}

int cgc_call_finish(cgc_call *c, cgc_tensor out[CG_GRAD_COUNT], cgc_result *res,
                    cgc_status *st) {
  cgc_tensor *outs[CG_GRAD_COUNT];
  pthread_mutex_lock(&c->mu);
  while (!c->ended)
    pthread_cond_wait(&c->changed, &c->mu);
  pthread_mutex_unlock(&c->mu);
  int rc = c->ops->result(c->obj, res, st);
  memset(out, 0, CG_GRAD_COUNT * sizeof *out);
  if (!rc) {
    c->ops->take(c->obj, outs);
    for (int g = 0; g < CG_GRAD_COUNT; g++)
      if (outs[g]) {
        out[g] = *outs[g];
        free(outs[g]); /* the struct; the data is the caller's */
      }
  }
  c->ops->free(c->obj);
  pthread_cond_destroy(&c->changed);
  pthread_mutex_destroy(&c->mu);
  free(c);
  return rc;
}
