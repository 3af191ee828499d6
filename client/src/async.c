/* async.c - asynchronous calls: cgc_call_start hands a call to the
 * channel's pool of threads, each of which runs one call at a time the way
 * cgc_compute does (compute.c's cgc__job, retries included); the caller
 * waits for some outputs (cgc_call_wait) or the whole call
 * (cgc_call_finish). Threads start as calls need them, up to
 * CGC__POOL_MAX, and end with the channel. */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

/* Threads per channel: calls beyond them queue. A trainer keeps about one
 * call per layer in flight; each thread mostly waits on its completion
 * queue. */
#define CGC__POOL_MAX 64

struct cgc_call {
  cgc_channel *ch;
  cgc__job *job;
  gpr_timespec deadline;
  cgc_call *next; /* in the pool's queue */
  pthread_mutex_t mu;
  pthread_cond_t changed; /* an output became whole, or the call ended */
  unsigned whole;         /* outputs whole so far */
  int ended;              /* rc, res and st are final */
  int rc;
  cgc_result res;
  cgc_status st;
};

void cgc__pool_init(cgc__pool *p) {
  memset(p, 0, sizeof *p);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->work, NULL);
  pthread_cond_init(&p->ended, NULL);
}

/* Told by the running call of each output that became whole. */
static void cgc__call_whole(void *arg, unsigned whole) {
  cgc_call *c = arg;
  pthread_mutex_lock(&c->mu);
  c->whole = whole;
  pthread_cond_broadcast(&c->changed);
  pthread_mutex_unlock(&c->mu);
}

static void cgc__call_run(cgc_call *c) {
  cgc_result res;
  cgc_status st;
  int rc = cgc__job_run(c->job, c->deadline, cgc__call_whole, c, &res, &st);
  pthread_mutex_lock(&c->mu);
  c->rc = rc;
  c->res = res;
  c->st = st;
  c->ended = 1;
  pthread_cond_broadcast(&c->changed);
  pthread_mutex_unlock(&c->mu);
}

static void *cgc__pool_main(void *arg) {
  cgc__pool *p = arg;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (!p->head && !p->closing) {
      p->idle++;
      pthread_cond_wait(&p->work, &p->mu);
      p->idle--;
    }
    cgc_call *c = p->head;
    if (!c)
      break; /* closing, and nothing left */
    p->head = c->next;
    if (!p->head)
      p->tail = NULL;
    p->queued--;
    pthread_mutex_unlock(&p->mu);
    cgc__call_run(c);
    pthread_mutex_lock(&p->mu);
  }
  p->threads--;
  pthread_cond_broadcast(&p->ended);
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

/* Starts one more thread; p->mu held. Signals stay with the caller's
 * threads (a Python trainer's SIGINT goes to its main thread). Returns 0
 * or -1 (the queued call then waits for a busy thread). */
static int cgc__pool_grow(cgc__pool *p) {
  pthread_t t;
  pthread_attr_t attr;
  sigset_t all, old;
  sigfillset(&all);
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&t, &attr, cgc__pool_main, p);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  pthread_attr_destroy(&attr);
  if (rc != 0)
    return -1;
  pthread_setname_np(t, "cgc-call");
  p->threads++;
  return 0;
}

void cgc__pool_close(cgc__pool *p) {
  pthread_mutex_lock(&p->mu);
  p->closing = 1;
  pthread_cond_broadcast(&p->work);
  while (p->threads > 0)
    pthread_cond_wait(&p->ended, &p->mu);
  pthread_mutex_unlock(&p->mu);
  pthread_cond_destroy(&p->work);
  pthread_cond_destroy(&p->ended);
  pthread_mutex_destroy(&p->mu);
}

int cgc_call_start(cgc_channel *ch, const cgc_request *req,
                   void *const data[CG_GRAD_COUNT],
                   const size_t cap[CG_GRAD_COUNT], cgc_call **out,
                   cgc_status *st) {
  cgc__job *job;
  *out = NULL;
  int rc = cgc__job_new(&job, ch, req, data, cap, st);
  if (rc)
    return rc;
  unsigned wants = cgc__job_wants(job);
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    if ((wants & CG_GRAD_BIT(g)) && !data[g]) {
      cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                      "data[%d]: NULL buffer for %s", g,
                      cg_grad_name((cg_grad)g));
      cgc__job_free(job);
      return CG_EINVAL;
    }
  cgc_call *c = calloc(1, sizeof *c);
  if (!c) {
    cgc__job_free(job);
    cgc__status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return CG_ENOMEM;
  }
  c->ch = ch;
  c->job = job;
  c->deadline = cgc__deadline(ch, req->deadline_ms);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->changed, NULL);

  cgc__pool *p = &ch->pool;
  pthread_mutex_lock(&p->mu);
  if (p->tail)
    p->tail->next = c;
  else
    p->head = c;
  p->tail = c;
  p->queued++;
  /* Each queued call needs a thread of its own, up to the bound. */
  if (p->queued > p->idle && p->threads < CGC__POOL_MAX &&
      cgc__pool_grow(p) != 0 && p->threads == 0) {
    /* No thread, none coming: take the call back. */
    p->head = p->tail = NULL;
    p->queued--;
    pthread_mutex_unlock(&p->mu);
    cgc__status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED,
                    "cannot start a thread for the call");
    pthread_cond_destroy(&c->changed);
    pthread_mutex_destroy(&c->mu);
    cgc__job_free(job);
    free(c);
    return CG_ENOMEM;
  }
  pthread_cond_signal(&p->work);
  pthread_mutex_unlock(&p->mu);
  *out = c;
  cgc__status_ok(st);
  return 0;
}

/* c->mu held: 1 once the outputs in grads are whole or the call ended. */
static int cgc__call_settled(const cgc_call *c, unsigned grads) {
  return c->ended || (c->whole & grads) == grads;
}

int cgc_call_wait(cgc_call *c, unsigned grads, int64_t timeout_ms,
                  cgc_status *st) {
  unsigned wants = cgc__job_wants(c->job);
  grads = grads ? grads & wants : wants;
  struct timespec until;
  if (timeout_ms >= 0) {
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)(timeout_ms / 1000);
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
  }
  int rc = 0;
  pthread_mutex_lock(&c->mu);
  while (!cgc__call_settled(c, grads) && rc != ETIMEDOUT)
    rc = timeout_ms >= 0 ? pthread_cond_timedwait(&c->changed, &c->mu, &until)
                         : pthread_cond_wait(&c->changed, &c->mu);
  if ((c->whole & grads) == grads)
    rc = 0;
  else if (c->ended) {
    rc = c->rc ? c->rc : CGC_EPROTO; /* ended well without an output */
    if (st)
      *st = c->st;
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
  int rc = c->rc;
  if (res)
    *res = c->res;
  if (st)
    *st = c->st;
  memset(out, 0, CG_GRAD_COUNT * sizeof *out);
  if (!rc) {
    cgc__job_take(c->job, outs);
    for (int g = 0; g < CG_GRAD_COUNT; g++)
      if (outs[g]) {
        out[g] = *outs[g];
        free(outs[g]); /* the struct; the data is the caller's */
      }
  }
  cgc__job_free(c->job);
  pthread_cond_destroy(&c->changed);
  pthread_mutex_destroy(&c->mu);
  free(c);
  return rc;
}
