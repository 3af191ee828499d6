/* cgs_server.h - the server object and its gRPC plumbing (rpc.c).
 *
 * Threads: the libuv loop thread owns every field here and every call
 * object. One completion-queue thread blocks in grpc_completion_queue_next
 * and hands each finished operation's tag to the loop through a locked
 * list and uv_async_send; the loop drains the whole list per wake-up and
 * runs each tag's callback. Compute runs in the cgs_pool workers.
 *
 * Life cycle: cgs_server_start() -> serving -> cgs_server_drain() (on
 * SIGTERM/SIGINT): stop accepting, health NOT_SERVING, in-flight calls
 * finish within cfg->grace_ms, then everything is torn down on the loop and
 * on_stopped runs; after that uv_run() returns once main closes its own
 * handles, and cgs_server_close() frees the rest. */
#ifndef CGS_SERVER_H
#define CGS_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>
#include <uv.h>

#include "cgs_config.h"
#include "cgs_peers.h"
#include "cgs_pool.h"

#define cgs_container_of(ptr, type, member)                                    \
  ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

/* A completion-queue tag. Objects embed one per kind of operation they
 * may have pending (at most one of each at a time), so handing a tag to
 * the loop needs no allocation. cb runs on the loop thread. fast, when
 * set, runs first on the completion-queue thread: it returns NULL when it
 * handled the event there, else the tag whose cb the loop should run. */
typedef struct cgs_tag cgs_tag;
typedef void (*cgs_tag_cb)(cgs_tag *tag, int ok);
typedef cgs_tag *(*cgs_tag_fast)(cgs_tag *tag, int ok);
struct cgs_tag {
  cgs_tag_cb cb;
  cgs_tag_fast fast; /* NULL: always the loop */
  int ok;            /* grpc_event.success */
  cgs_tag *next;     /* link in the cq -> loop list */
};

typedef enum {
  CGS_M_COMPUTE = 0, /* /convgrad.v1.ConvGrad/Compute, bidi stream */
  CGS_M_INFO,        /* /convgrad.v1.ConvGrad/GetServerInfo, unary */
  CGS_M_CHECK,       /* /grpc.health.v1.Health/Check, unary */
  CGS_M_WATCH,       /* /grpc.health.v1.Health/Watch, server stream */
  CGS_M_GENERIC,     /* anything else: UNIMPLEMENTED */
  CGS_M_COUNT
} cgs_method;

typedef struct cgs_call cgs_call;
typedef struct cgs_health cgs_health;
typedef struct cgs_server cgs_server;

struct cgs_server {
  const cgs_config *cfg;
  uv_loop_t *loop;
  grpc_server *grpc;
  grpc_completion_queue *cq;
  void *methods[CGS_M_COUNT];
  int port; /* the bound port (useful with --listen ...:0) */

  /* cq thread -> loop hand-off */
  pthread_t cq_thread;
  int cq_thread_started;
  uv_async_t cq_async;
  pthread_mutex_t ev_mu;
  cgs_tag *ev_head, *ev_tail;
  int cq_exited; /* under ev_mu: the cq thread saw GRPC_QUEUE_SHUTDOWN */

  cgs_pool *pool;
  cgs_health *health;
  cgs_peers *peers; /* live calls and log budgets per client address */
  uv_timer_t housekeeping_timer;
  uint64_t calls_ended, calls_ended_at_tick; /* Compute calls freed */

  /* admission accounting (loop thread) */
  uint64_t inflight_bytes; /* reserved by live Compute calls */
  unsigned compute_active; /* Compute calls not yet freed */
  unsigned unary_active;   /* unary replies in flight */
  cgs_call *calls;         /* live Compute calls, for cancel on grace end */
  uint64_t next_call_id;

  /* shutdown */
  int draining;
  int stopped_accepting; /* grpc_server_shutdown_and_notify was called */
  int grace_expired;
  /* grpc_completion_queue_shutdown was called. Written by the loop thread,
   * read by cgs_rpc_batch on both threads (the fast paths run it on the
   * completion-queue thread). */
  atomic_int cq_closed;
  int torn_down;
  uv_timer_t grace_timer;
  cgs_tag shutdown_tag;
  void (*on_stopped)(cgs_server *s);
};

/* Creates the grpc server, binds cfg->listen, starts the cq thread and the
 * worker pool and posts the first call requests. s is owned by the caller
 * and must outlive the loop run. Returns 0 or a negative CG_E* code with
 * err filled (nothing left running then). */
int cgs_server_start(cgs_server *s, uv_loop_t *loop, const cgs_config *cfg,
                     void (*on_stopped)(cgs_server *s), char *err,
                     size_t errlen);
/* Begins graceful shutdown; idempotent. Loop thread only. */
void cgs_server_drain(cgs_server *s);
/* Frees what outlives the loop run (every call object is freed by then).
 * Call after uv_run returns, whether the start succeeded or not. */
void cgs_server_close(cgs_server *s);

/* Starts a batch; logs and returns the grpc_call_error on failure (then
 * the tag will not fire). Refuses once the completion queue is closing. */
grpc_call_error cgs_rpc_batch(cgs_server *s, grpc_call *call,
                              const grpc_op *ops, size_t n, cgs_tag *tag);
/* Finishes a unary (or not yet answered) call: sends initial metadata,
 * msg when not NULL, and the status, then releases the call. Takes
 * ownership of call's reference and of msg. */
void cgs_rpc_reply(cgs_server *s, grpc_call *call, grpc_byte_buffer *msg,
                   grpc_status_code code, const char *details);
/* Called by call.c when a Compute call object is freed: lets a draining
 * server finish. */
void cgs_server_compute_ended(cgs_server *s);

/* grpc status code names ("RESOURCE_EXHAUSTED"). */
const char *cgs_status_name(grpc_status_code code);

#endif
