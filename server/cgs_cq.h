/* cgs_cq.h - the completion queue: the thread that waits on it, the tags
 * its operations complete with, the hand-off of some of those tags to the
 * libuv loop, and the batches and unary replies every handler starts on it.
 *
 * Threads: one completion-queue thread ("cg-cq") blocks in
 * grpc_completion_queue_next. A tag marked on_cq runs its cb there, at
 * once (the Compute calls: see cgs_call.h); every other tag goes to the
 * loop through a locked list and uv_async_send, and the loop runs their
 * cbs in completion order. cgs_cq_batch, cgs_cq_reply, cgs_cq_release and
 * cgs_cq_acquire run on any thread, cgs_cq_defer on the completion-queue
 * thread; every other function here on the loop thread. */
#ifndef CGS_CQ_H
#define CGS_CQ_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include <grpc/grpc.h>
#include <uv.h>

#include "cgs_fairq.h"
#include "cgw.h"

/* A completion-queue tag. Objects embed one per kind of operation they
 * may have pending (at most one of each at a time), so handing a tag to
 * the loop needs no allocation. cb runs on the completion-queue thread
 * when on_cq is set, else on the loop thread. */
typedef struct cgs_tag cgs_tag;
typedef void (*cgs_tag_cb)(cgs_tag *tag, int ok);
struct cgs_tag {
  cgs_tag_cb cb;
  int on_cq;     /* 1: cb runs on the completion-queue thread */
  int ok;        /* grpc_event.success */
  cgs_tag *next; /* link in the cq -> loop list */
};

/* The completion-queue thread's bulk work: result chunks to send and
 * request chunks to copy, the events that move a call's tensor bytes
 * (tens of microseconds to milliseconds each). They wait while other
 * events are ready (cgs_cq_defer), so that a small call's request, answer
 * and end are not handled after another caller's megabytes; and flows
 * take turns, one item each (cgs_fairq.h), so a client with 64 calls in
 * flight moves one chunk per turn as a client with one does. */
typedef struct cgs_bulk_item cgs_bulk_item;
struct cgs_bulk_item {
  void (*run)(cgs_bulk_item *it); /* set by the owner, who embeds it */
  cgs_fairq_item q;               /* the queue's */
};

/* Declare to ThreadSanitizer an ordering that grpc makes with its own
 * locks, which it cannot see in the uninstrumented library: what a thread
 * did before cgs_cq_release(p) happens before what another does after
 * cgs_cq_acquire(p). A tag's completion comes after the call that handed
 * it to grpc (cgs_cq_batch, and the cq thread, declare that one), a zero-
 * copy slice's free after the batch that sent it. No-ops without
 * ThreadSanitizer (cgw.h). */
static inline void cgs_cq_release(void *p) {
  cgw_tsan_release(p);
}
static inline void cgs_cq_acquire(void *p) {
  cgw_tsan_acquire(p);
}

typedef struct cgs_cq cgs_cq;
struct cgs_cq {
  grpc_completion_queue *q;
  pthread_t thread;
  uv_async_t async;
  pthread_mutex_t mu;
  cgs_tag *head, *tail; /* under mu: completed tags for the loop */
  int exited;           /* under mu: the thread saw GRPC_QUEUE_SHUTDOWN */
  int exit_reported;    /* on_exit ran (loop thread) */
  /* cgs_cq_shutdown was called. Written by the loop thread, read by
   * cgs_cq_batch on both threads. */
  atomic_int closed;
  atomic_uint replies; /* unary replies in flight */
  void (*on_exit)(cgs_cq *cq);
  /* Set before cgs_cq_start, or NULL: runs on the cq thread once it has
   * waited CGS_CQ_IDLE_S for an event after a tag that ran there (tiny
   * jobs run on it: their engine's buffers go back then). */
  void (*on_idle)(void *data);
  void *idle_data;
  cgs_fairq bulk;         /* cq thread: work deferred by cgs_cq_defer */
  atomic_ullong deferred; /* items ever deferred (any thread reads) */
};

#define CGS_CQ_IDLE_S 1
/* Events the cq thread handles at most, while bulk work waits, before it
 * runs one item of it anyway: the queue may never be empty under load,
 * and the bytes must move. */
#define CGS_CQ_BULK_EVERY 8

/* Creates the queue (for a grpc server to register before it starts).
 * Returns 0 or CG_EINTERNAL. */
int cgs_cq_init(cgs_cq *cq);
/* Starts the thread and the loop's side of the hand-off. on_exit runs on
 * the loop once the queue is shut down, every tag before that has run and
 * the thread is joined: no grpc event can arrive any more. Returns 0 or
 * CG_EINTERNAL (the async handle is then closing; cgs_cq_destroy still frees
 * the queue). */
int cgs_cq_start(cgs_cq *cq, uv_loop_t *loop, void (*on_exit)(cgs_cq *cq));
/* Shuts the queue down: batches are refused from now on, and the thread
 * exits once grpc has delivered every pending event. */
void cgs_cq_shutdown(cgs_cq *cq);
/* After on_exit, once the grpc server is destroyed: frees the queue and
 * closes the async handle (close_cb gets it). */
void cgs_cq_close(cgs_cq *cq, uv_close_cb close_cb);
/* Frees a queue whose thread never started. */
void cgs_cq_destroy(cgs_cq *cq);

/* Starts a batch; logs and returns the grpc_call_error on failure (then
 * the tag will not fire). Refuses once the queue is shut down: grpc's
 * shutdown notification does not wait for calls to be released. Any
 * thread. */
grpc_call_error cgs_cq_batch(cgs_cq *cq, grpc_call *call, const grpc_op *ops,
                             size_t n, cgs_tag *tag);
/* Completion-queue thread only: runs it->run on this thread once no
 * event is ready (or CGS_CQ_BULK_EVERY events on), after the bulk work
 * of flows with fewer turns (cgs_fairq.h); *flow_turn is its flow's
 * state. Before the thread exits, every deferred item runs (batches are
 * refused by then). */
void cgs_cq_defer(cgs_cq *cq, cgs_bulk_item *it, uint64_t *flow_turn);
/* Finishes a unary (or not yet answered) call: sends initial metadata,
 * msg when not NULL, and the status, then releases the call (on the
 * completion-queue thread). Takes ownership of call's reference and of
 * msg. Any thread. */
void cgs_cq_reply(cgs_cq *cq, grpc_call *call, grpc_byte_buffer *msg,
                  grpc_status_code code, const char *details);

#endif
