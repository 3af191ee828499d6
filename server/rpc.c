/* rpc.c - owns the grpc server, its completion queue and the thread that
 * drains it into the libuv loop, method registration, call requests,
 * unary replies and the shutdown sequence. */
#include "cgs_server.h"

#include <inttypes.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/compression.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "cg/error.h"
#include "cgs_buf.h"
#include "cgs_call.h"
#include "cgs_health.h"
#include "cgs_info.h"
#include "cgs_log.h"
#include "cgs_peers.h"
#include "cgw.h"

/* Requests kept posted per method, so that bursts of new calls find one
 * waiting (grpc queues the rest until the loop posts more). */
/* Period of the peer sweep and the heap trim. */
#define HOUSEKEEPING_MS 2000

static const int slots_per_method[CGS_M_COUNT] = {32, 2, 4, 4, 2};

/* Methods whose first request message grpc reads before handing over the
 * call: the unary ones. Compute reads its own, so that it holds the call
 * (and counts it against its peer, with the idle timeout running) from
 * the stream's headers on: grpc would keep a stream that never sends a
 * message out of our sight, for as long as its client likes. Watch reads
 * its own. */
static const int first_with_call[CGS_M_COUNT] = {0, 1, 1, 0, 0};

static const char *const method_paths[CGS_M_COUNT] = {
    "/convgrad.v1.ConvGrad/Compute", "/convgrad.v1.ConvGrad/GetServerInfo",
    "/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch", NULL};

const char *cgs_status_name(grpc_status_code code) {
  return cgw_status_name(code);
}

grpc_call_error cgs_rpc_batch(cgs_server *s, grpc_call *call,
                              const grpc_op *ops, size_t n, cgs_tag *tag) {
  /* grpc's shutdown notification does not wait for calls to be released,
   * only for them to be over; after it no batch may touch the queue. */
  if (atomic_load(&s->cq_closed))
    return GRPC_CALL_ERROR_COMPLETION_QUEUE_SHUTDOWN;
  grpc_call_error e = grpc_call_start_batch(call, ops, n, tag, NULL);
  if (e != GRPC_CALL_OK)
    cgs_error("grpc_call_start_batch: %s", grpc_call_error_to_string(e));
  return e;
}

/* ---- completion-queue thread ---------------------------------------- */

static void *cq_main(void *arg) {
  cgs_server *s = arg;
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL);
  pthread_setname_np(pthread_self(), "cg-cq");
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(
        s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    cgs_tag *t = ev.type == GRPC_OP_COMPLETE ? ev.tag : NULL;
    if (t && t->fast && !(t = t->fast(t, ev.success)))
      continue; /* handled on this thread */
    pthread_mutex_lock(&s->ev_mu);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) {
      s->cq_exited = 1;
    } else if (t) {
      t->ok = ev.success;
      t->next = NULL;
      if (s->ev_tail)
        s->ev_tail->next = t;
      else
        s->ev_head = t;
      s->ev_tail = t;
    }
    int exited = s->cq_exited;
    pthread_mutex_unlock(&s->ev_mu);
    uv_async_send(&s->cq_async);
    if (exited)
      break;
  }
  return NULL;
}

static void teardown(cgs_server *s);

/* Loop thread: runs the callback of every tag the cq thread handed over. */
static void on_cq_async(uv_async_t *h) {
  cgs_server *s = h->data;
  pthread_mutex_lock(&s->ev_mu);
  cgs_tag *t = s->ev_head;
  s->ev_head = s->ev_tail = NULL;
  int exited = s->cq_exited;
  pthread_mutex_unlock(&s->ev_mu);
  while (t) {
    cgs_tag *next = t->next;
    t->cb(t, t->ok);
    t = next;
  }
  if (exited && !s->torn_down)
    teardown(s);
}

/* ---- call requests --------------------------------------------------- */

typedef struct slot {
  cgs_tag tag;
  cgs_server *s;
  cgs_method m;
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array md;
  grpc_byte_buffer *payload;
  grpc_call_details details; /* generic calls only */
} slot;

static void on_slot(cgs_tag *t, int ok);

static int request_slot(cgs_server *s, cgs_method m) {
  slot *sl = calloc(1, sizeof *sl);
  if (!sl) {
    cgs_error("out of memory posting a call request");
    return CG_ENOMEM;
  }
  sl->tag.cb = on_slot;
  sl->s = s;
  sl->m = m;
  grpc_metadata_array_init(&sl->md);
  grpc_call_details_init(&sl->details);
  grpc_call_error e;
  if (m == CGS_M_GENERIC)
    e = grpc_server_request_call(s->grpc, &sl->call, &sl->details, &sl->md,
                                 s->cq, s->cq, &sl->tag);
  else
    e = grpc_server_request_registered_call(
        s->grpc, s->methods[m], &sl->call, &sl->deadline, &sl->md,
        first_with_call[m] ? &sl->payload : NULL, s->cq, s->cq, &sl->tag);
  if (e != GRPC_CALL_OK) {
    cgs_error("requesting a call: %s", grpc_call_error_to_string(e));
    grpc_metadata_array_destroy(&sl->md);
    grpc_call_details_destroy(&sl->details);
    free(sl);
    return CG_EINTERNAL;
  }
  return 0;
}

static void on_slot(cgs_tag *t, int ok) {
  slot *sl = cgs_container_of(t, slot, tag);
  cgs_server *s = sl->s;
  if (ok) {
    /* Draining keeps taking calls (to refuse them with UNAVAILABLE) until
     * the listener closes. */
    if (!s->stopped_accepting)
      request_slot(s, sl->m);
    switch (sl->m) {
    case CGS_M_COMPUTE:
      cgs_call_start(s, sl->call, sl->deadline);
      break;
    case CGS_M_INFO:
      cgs_info_handle(s, sl->call, sl->payload);
      break;
    case CGS_M_CHECK:
      cgs_health_check(s->health, sl->call, sl->payload);
      break;
    case CGS_M_WATCH:
      cgs_health_watch(s->health, sl->call);
      break;
    default: {
      char msg[300];
      char *method = grpc_slice_to_c_string(sl->details.method);
      char *peer = grpc_call_get_peer(sl->call);
      snprintf(msg, sizeof msg, "unknown method %s", method);
      if (cgs_peer_log_allowed(cgs_peers_get(s->peers, peer, uv_hrtime()),
                               uv_hrtime(), s->cfg->peer_log_rate)) {
        char logged[300], from[128];
        cgs_log_value(logged, sizeof logged, method);
        cgs_log_value(from, sizeof from, peer);
        cgs_info("unary method=%s peer=%s status=UNIMPLEMENTED", logged, from);
      }
      gpr_free(peer);
      gpr_free(method);
      cgs_rpc_reply(s, sl->call, NULL, GRPC_STATUS_UNIMPLEMENTED, msg);
      break;
    }
    }
  }
  /* !ok: the server is shutting down and the request was withdrawn. */
  grpc_metadata_array_destroy(&sl->md);
  grpc_call_details_destroy(&sl->details);
  free(sl);
}

/* ---- unary replies --------------------------------------------------- */

typedef struct reply {
  cgs_tag tag;
  cgs_server *s;
  grpc_call *call;
  grpc_byte_buffer *msg;
  grpc_slice details;
  int cancelled;
} reply;

static void on_reply_done(cgs_tag *t, int ok) {
  reply *r = cgs_container_of(t, reply, tag);
  (void)ok; /* either way the call is over */
  if (r->msg)
    grpc_byte_buffer_destroy(r->msg);
  grpc_slice_unref(r->details);
  grpc_call_unref(r->call);
  r->s->unary_active--;
  free(r);
}

void cgs_rpc_reply(cgs_server *s, grpc_call *call, grpc_byte_buffer *msg,
                   grpc_status_code code, const char *details) {
  reply *r = calloc(1, sizeof *r);
  if (!r) {
    /* Cannot track a batch: cancelling needs no memory of ours. */
    grpc_call_cancel_with_status(call, GRPC_STATUS_RESOURCE_EXHAUSTED,
                                 "server out of memory", NULL);
    grpc_call_unref(call);
    if (msg)
      grpc_byte_buffer_destroy(msg);
    return;
  }
  r->tag.cb = on_reply_done;
  r->s = s;
  r->call = call;
  r->msg = msg;
  r->details = grpc_slice_from_copied_string(details ? details : "");
  grpc_op ops[4];
  size_t n = 0;
  memset(ops, 0, sizeof ops);
  ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  if (msg) {
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = msg;
  }
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = code;
  ops[n++].data.send_status_from_server.status_details = &r->details;
  ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[n++].data.recv_close_on_server.cancelled = &r->cancelled;
  s->unary_active++;
  if (cgs_rpc_batch(s, call, ops, n, &r->tag) != GRPC_CALL_OK)
    on_reply_done(&r->tag, 0);
}

/* ---- shutdown -------------------------------------------------------- */

/* Closes the listener and asks grpc to report when every call is over.
 * Deferred while compute calls are in flight: until then the server
 * answers new calls UNAVAILABLE itself, whereas grpc ends a call that
 * arrives as it shuts down with CANCELLED, which a client cannot tell
 * from its own cancellation and does not retry. */
static void stop_accepting(cgs_server *s) {
  if (s->stopped_accepting)
    return;
  s->stopped_accepting = 1;
  grpc_server_shutdown_and_notify(s->grpc, s->cq, &s->shutdown_tag);
}

static void maybe_finish_drain(cgs_server *s) {
  /* Watch streams would hold the server open forever: end them once the
   * real work is done. */
  if (s->draining && s->compute_active == 0 && !s->torn_down) {
    cgs_health_end_watches(s->health);
    stop_accepting(s);
  }
}

void cgs_server_compute_ended(cgs_server *s) {
  s->calls_ended++;
  maybe_finish_drain(s);
}

static void report_suppressed(const cgs_peer *e) {
  char addr[128];
  cgs_log_value(addr, sizeof addr, e->addr);
  cgs_warn("peer=%s: %" PRIu64 " failed calls not logged "
           "(--peer-log-rate)",
           addr, e->suppressed);
}

/* Every HOUSEKEEPING_MS: reports and forgets idle peers, and hands the
 * heap's free memory back to the system once calls have ended. The
 * allocator keeps up to M_TRIM_THRESHOLD (main.c) otherwise, so a burst
 * of calls (honest or not) would leave the process at its peak. After a
 * whole quiet period the tensor-buffer cache goes too: a training loop
 * calls far more often than that and keeps it warm. */
static void on_housekeeping(uv_timer_t *h) {
  cgs_server *s = h->data;
  cgs_peers_sweep(s->peers, uv_hrtime(), report_suppressed);
  int ended = s->calls_ended != s->calls_ended_at_tick;
  s->calls_ended_at_tick = s->calls_ended;
  if (!ended && s->compute_active == 0 && cgs_buf_cached_bytes()) {
    cgs_buf_drain();
    malloc_trim(0);
  } else if (ended) {
    malloc_trim(0);
  }
}

static void on_grace_timer(uv_timer_t *h) {
  cgs_server *s = h->data;
  s->grace_expired = 1;
  cgs_warn("grace period over: cancelling %u in-flight calls",
           s->compute_active);
  stop_accepting(s); /* grpc cancels all calls only after a shutdown */
  /* Ours first, so that each call ends with our UNAVAILABLE and its
   * message rather than grpc's generic cancel. */
  cgs_call_cancel_all(s);
  grpc_server_cancel_all_calls(s->grpc);
  cgs_health_end_watches(s->health);
}

static void on_shutdown_notified(cgs_tag *t, int ok) {
  cgs_server *s = cgs_container_of(t, cgs_server, shutdown_tag);
  (void)ok;
  cgs_info("all calls finished; stopping");
  uv_timer_stop(&s->grace_timer);
  atomic_store(&s->cq_closed, 1);
  grpc_completion_queue_shutdown(s->cq);
}

void cgs_server_close(cgs_server *s) {
  cgs_peers_free(s->peers);
  s->peers = NULL;
}

void cgs_server_drain(cgs_server *s) {
  if (s->draining) {
    /* A second signal: do not wait for the grace period. */
    if (!s->grace_expired && !s->torn_down)
      uv_timer_start(&s->grace_timer, on_grace_timer, 0, 0);
    return;
  }
  s->draining = 1;
  cgs_info("draining: %u compute calls and %u other calls in flight, grace "
           "%.1f s",
           s->compute_active, s->unary_active,
           (double)s->cfg->grace_ms / 1000.0);
  cgs_health_set_serving(s->health, 0);
  uv_timer_start(&s->grace_timer, on_grace_timer, s->cfg->grace_ms, 0);
  maybe_finish_drain(s);
}

static void on_handle_closed(uv_handle_t *h) { (void)h; }

static void on_last_closed(uv_handle_t *h) {
  cgs_server *s = h->data;
  if (s->on_stopped)
    s->on_stopped(s);
}

/* Loop thread, after the cq thread saw GRPC_QUEUE_SHUTDOWN: no grpc event
 * can arrive any more. */
static void teardown(cgs_server *s) {
  s->torn_down = 1;
  pthread_join(s->cq_thread, NULL);
  /* Every grpc operation has completed: calls still around (a deadline
   * that fired as grpc finished them) can only end now. */
  cgs_call_cancel_all(s);
  s->cq_thread_started = 0;
  grpc_server_destroy(s->grpc);
  s->grpc = NULL;
  grpc_completion_queue_destroy(s->cq);
  s->cq = NULL;
  /* Workers finish what they run; their jobs' calls free themselves. */
  cgs_debug("waiting for the workers to finish their current jobs");
  cgs_pool_close(s->pool);
  cgs_debug("workers stopped");
  s->pool = NULL;
  cgs_health_free(s->health);
  s->health = NULL;
  pthread_mutex_destroy(&s->ev_mu);
  uv_close((uv_handle_t *)&s->grace_timer, on_handle_closed);
  uv_close((uv_handle_t *)&s->housekeeping_timer, on_handle_closed);
  uv_close((uv_handle_t *)&s->cq_async, on_last_closed);
}

/* ---- start ----------------------------------------------------------- */

int cgs_server_start(cgs_server *s, uv_loop_t *loop, const cgs_config *cfg,
                     void (*on_stopped)(cgs_server *s), char *err,
                     size_t errlen) {
  int rc = 0;
  memset(s, 0, sizeof *s);
  s->cfg = cfg;
  s->loop = loop;
  s->on_stopped = on_stopped;
  s->shutdown_tag.cb = on_shutdown_notified;
  s->next_call_id = 1;
  pthread_mutex_init(&s->ev_mu, NULL);

  grpc_arg args[] = {
      /* Refuse to share a port with another process. */
      {.type = GRPC_ARG_INTEGER,
       .key = GRPC_ARG_ALLOW_REUSEPORT,
       .value.integer = 0},
      /* The default 64 KiB initial window makes each upload's first
       * megabytes wait for window updates: 2-8 ms per call here before
       * the BDP estimate catches up. */
      {.type = GRPC_ARG_INTEGER,
       .key = GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
       .value.integer = (int)cfg->stream_window_bytes},
      /* Streams one connection may hold; each costs grpc memory before
       * any of ours is spent. */
      {.type = GRPC_ARG_INTEGER,
       .key = GRPC_ARG_MAX_CONCURRENT_STREAMS,
       .value.integer = (int)cfg->max_streams_per_connection},
      /* Identity only: grpc inflates a compressed message whole before any
       * size limit of ours applies, so 1 MB of gzip became 1 GiB of heap.
       * Tensors hardly compress; a gzip request is refused UNIMPLEMENTED
       * at its headers. */
      {.type = GRPC_ARG_INTEGER,
       .key = GRPC_COMPRESSION_CHANNEL_ENABLED_ALGORITHMS_BITSET,
       .value.integer = 1 << GRPC_COMPRESS_NONE},
      /* A connection with no call for this long is closed (clients
       * reconnect transparently), so idle sockets cannot pile up. */
      {.type = GRPC_ARG_INTEGER,
       .key = GRPC_ARG_MAX_CONNECTION_IDLE_MS,
       .value.integer = 10 * 60 * 1000},
  };
  grpc_channel_args cargs = {.num_args = sizeof args / sizeof args[0],
                             .args = args};
  s->grpc = grpc_server_create(&cargs, NULL);
  s->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(s->grpc, s->cq, NULL);
  for (int m = 0; m < CGS_M_GENERIC; m++) {
    s->methods[m] = grpc_server_register_method(
        s->grpc, method_paths[m], NULL,
        first_with_call[m] ? GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER
                           : GRPC_SRM_PAYLOAD_NONE,
        0);
    if (!s->methods[m]) {
      rc = cg_errorf(err, errlen, CG_EINTERNAL, "cannot register %s",
                     method_paths[m]);
      goto fail_grpc;
    }
  }
  grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
  s->port = grpc_server_add_http2_port(s->grpc, cfg->listen, creds);
  grpc_server_credentials_release(creds);
  if (s->port <= 0) {
    rc = cg_errorf(err, errlen, CG_EINVAL,
                   "--listen: cannot bind '%s' (in use or not HOST:PORT)",
                   cfg->listen);
    goto fail_grpc;
  }
  if ((rc = cgs_peers_new(&s->peers)) != 0) {
    cg_errorf(err, errlen, rc, "peers: out of memory");
    goto fail_grpc;
  }
  if ((rc = cgs_health_new(&s->health, s)) != 0) {
    cg_errorf(err, errlen, rc, "health: out of memory");
    goto fail_grpc;
  }
  if ((rc = cgs_pool_new(&s->pool, loop, cfg, cgs_call_job_done, s, err,
                         errlen)) != 0)
    goto fail_health;
  uv_async_init(loop, &s->cq_async, on_cq_async);
  s->cq_async.data = s;
  uv_timer_init(loop, &s->grace_timer);
  s->grace_timer.data = s;
  uv_timer_init(loop, &s->housekeeping_timer);
  s->housekeeping_timer.data = s;
  if (pthread_create(&s->cq_thread, NULL, cq_main, s) != 0) {
    rc = cg_errorf(err, errlen, CG_EINTERNAL, "cannot start the cq thread");
    cgs_pool_close(s->pool);
    uv_close((uv_handle_t *)&s->grace_timer, on_handle_closed);
    uv_close((uv_handle_t *)&s->housekeeping_timer, on_handle_closed);
    uv_close((uv_handle_t *)&s->cq_async, on_handle_closed);
    goto fail_health;
  }
  s->cq_thread_started = 1;
  uv_timer_start(&s->housekeeping_timer, on_housekeeping, HOUSEKEEPING_MS,
                 HOUSEKEEPING_MS);
  grpc_server_start(s->grpc);
  for (int m = 0; m < CGS_M_COUNT; m++)
    for (int i = 0; i < slots_per_method[m]; i++)
      request_slot(s, (cgs_method)m);
  return 0;

fail_health:
  cgs_health_free(s->health);
fail_grpc:
  /* Never started: nothing to drain. */
  cgs_peers_free(s->peers);
  s->peers = NULL;
  grpc_server_destroy(s->grpc);
  grpc_completion_queue_shutdown(s->cq);
  grpc_completion_queue_destroy(s->cq);
  pthread_mutex_destroy(&s->ev_mu);
  return rc;
}
