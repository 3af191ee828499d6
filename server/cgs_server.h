/* cgs_server.h - the server object (server.c): its life cycle, the
 * state its method handlers share, and the method table they register
 * through.
 *
 * Threads: every function here runs on the libuv loop thread, and the loop
 * thread owns every field but those the Compute calls use from the
 * completion-queue thread and the workers (cgs_call.h): cfg (read-only
 * once started), cq, pool, peers, calls, metrics, regions and store, which are
 * thread-safe, inflight_bytes and stopped_accepting (atomic) and auth
 * (under auth_mu). Compute runs in the cgs_pool workers.
 *
 * Life cycle: cgs_server_start() -> warm-up (calls are accepted and
 * queue; health NOT_SERVING) -> ready (on_ready: SERVING) -> serving ->
 * cgs_server_drain() (on
 * SIGTERM/SIGINT): stop accepting, health NOT_SERVING, in-flight calls
 * finish within cfg->grace_ms, then everything is torn down on the loop and
 * on_stopped runs; after that uv_run() returns once main closes its own
 * handles, and cgs_server_close() frees the rest. */
#ifndef CGS_SERVER_H
#define CGS_SERVER_H

#include <stdatomic.h>
#include <stdint.h>

#include <grpc/grpc.h>
#include <uv.h>

#include "cgs_auth.h"
#include "cgs_calls.h"
#include "cgs_config.h"
#include "cgs_cq.h"
#include "cgs_httpd.h"
#include "cgs_listen.h"
#include "cgs_metrics.h"
#include "cgs_peers.h"
#include "cgs_pool.h"
#include "cgs_region.h"
#include "cgs_store.h"
#include "cgs_warmup.h"

typedef struct cgs_call cgs_call;
typedef struct cgs_health cgs_health;
typedef struct cgs_server cgs_server;

/* A method a handler module serves; the server registers every entry of
 * its table with grpc and keeps `slots` call requests posted for each. */
typedef struct cgs_method_def {
  const char *path; /* "/package.Service/Method" */
  /* 1: grpc reads the first request message before handing the call over
   * (unary methods: start gets it as payload). 0: the handler receives
   * its messages itself and payload is NULL. */
  int reads_first;
  /* Requests kept posted, so that bursts of new calls find one waiting
   * (grpc queues the rest until the loop posts more). */
  int slots;
  /* 1: with --auth-tokens the call needs a token (0: only with
   * --auth-health). The server checks it before start. */
  int needs_token;
  /* 1: its calls arrive, are checked and started on the completion-queue
   * thread instead of the loop. */
  int on_cq;
  /* The loop thread; Compute's, the completion-queue thread (it says so
   * with on_cq). Takes ownership of call's reference and of payload;
   * deadline as grpc reported it; client: the label of the caller's token,
   * or NULL without --auth-tokens (valid during the call only); md: the
   * request's metadata (during start only). */
  void (*start)(cgs_server *s, grpc_call *call, gpr_timespec deadline,
                grpc_byte_buffer *payload, const char *client,
                const grpc_metadata_array *md);
} cgs_method_def;

/* Room for the registered handles of the server's method table. */
#define CGS_METHODS_MAX 12

struct cgs_server {
  const cgs_config *cfg;
  uv_loop_t *loop;
  grpc_server *grpc;
  cgs_cq cq;
  void *methods[CGS_METHODS_MAX]; /* grpc's handles, in table order */
  cgs_listeners listeners;
  int port; /* the first TCP address's bound port (--listen ...:0); 0 when
               there is none */

  cgs_pool *pool;
  cgs_warmup warmup; /* --warmup's layers, which the pool borrows */
  /* Sent by the last worker to finish its warm-up: health turns SERVING
   * and on_ready runs, unless the server drains by then. */
  uv_async_t warm_async;
  int ready;
  void (*on_ready)(cgs_server *s);
  cgs_health *health;
  cgs_peers *peers; /* calls receiving, turns and log budgets per peer */
  cgs_calls calls;  /* the live Compute calls */
  uv_timer_t housekeeping_timer;
  uint64_t calls_ended_at_tick; /* Compute calls over at the last tick */
  uint64_t busy_at_ms;          /* loop time of the last tick that saw a call */
  int gave_back;                /* memory handed back since busy_at_ms */
  uv_timer_t calls_timer;       /* the Compute calls' timeouts */
  /* The token table (NULL without --auth-tokens), replaced by SIGHUP
   * under auth_mu, which Compute's admission reads it under. */
  cgs_auth *auth;
  pthread_mutex_t auth_mu;
  cgs_regions *regions; /* shared-memory regions; NULL with --shm off */
  cgs_store *store;     /* staged tensors; NULL with --store-bytes 0 */
  cgs_metrics *metrics;
  cgs_httpd *metrics_http; /* NULL without --metrics-listen */
  int metrics_port;        /* its bound port; 0 without */

  /* reserved by live Compute calls */
  _Atomic uint64_t inflight_bytes;

  /* shutdown */
  int draining;
  /* grpc_server_shutdown_and_notify was called (Compute's call requests
   * are posted again on the completion-queue thread) */
  atomic_int stopped_accepting;
  int grace_expired;
  int torn_down;
  uv_timer_t grace_timer;
  cgs_tag shutdown_tag;
  void (*on_stopped)(cgs_server *s);
};

/* Loads --warmup, creates the grpc server, binds cfg->listen, starts the
 * cq thread and the worker pool (which warms up) and posts the first call
 * requests; on_ready runs on the loop once the workers are warm. s is owned by
 * the caller and must outlive the loop run. Returns 0 or a negative CG_E* code
 * with err filled (nothing left running then). */
int cgs_server_start(cgs_server *s, uv_loop_t *loop, const cgs_config *cfg,
                     void (*on_ready)(cgs_server *s),
                     void (*on_stopped)(cgs_server *s), char *err,
                     size_t errlen);
/* Begins graceful shutdown; idempotent. */
void cgs_server_drain(cgs_server *s);
/* Frees what outlives the loop run (every call object is freed by then)
 * and removes the unix sockets. Call after uv_run returns, whether the
 * start succeeded or not. */
void cgs_server_close(cgs_server *s);

/* Reloads --auth-tokens (SIGHUP): the new table replaces the old one only
 * if the file loads; calls already admitted go on either way. */
void cgs_server_reload(cgs_server *s);

#endif
