/* cq.c - owns the completion queue, the thread that drains it (running
 * some tags itself, handing the rest to the libuv loop), and the batches
 * and unary replies started on it. */
#include "cgs_cq.h"

#include <stdlib.h>
#include <string.h>

#include <grpc/support/time.h>

#include "cg/error.h"
#include "cgs_log.h"
#include "cgs_sig.h"

grpc_call_error cgs_cq_batch(cgs_cq *cq, grpc_call *call, const grpc_op *ops,
                             size_t n, cgs_tag *tag) {
  if (atomic_load(&cq->closed))
    return GRPC_CALL_ERROR_COMPLETION_QUEUE_SHUTDOWN;
  cgs_cq_release(tag);
  grpc_call_error e = grpc_call_start_batch(call, ops, n, tag, NULL);
  if (e != GRPC_CALL_OK)
    cgs_error("grpc_call_start_batch: %s", grpc_call_error_to_string(e));
  return e;
}

/* ---- completion-queue thread ---------------------------------------- */

void cgs_cq_defer(cgs_cq *cq, cgs_bulk_item *it, uint64_t *flow_turn) {
  cgs_fairq_push(&cq->bulk, &it->q, flow_turn);
  atomic_fetch_add(&cq->deferred, 1);
}

static void run_bulk(cgs_cq *cq) {
  cgs_bulk_item *it =
      cgs_container_of(cgs_fairq_pop(&cq->bulk), cgs_bulk_item, q);
  it->run(it);
}

static void *cq_main(void *arg) {
  cgs_cq *cq = arg;
  cgs_sig_block_async();
  pthread_setname_np(pthread_self(), "cg-cq");
  int ran = 0;            /* a tag ran here since on_idle last did */
  unsigned since_run = 0; /* events handled since bulk work last ran */
  for (;;) {
    gpr_timespec until;
    if (cq->bulk.head) {
      if (since_run >= CGS_CQ_BULK_EVERY) {
        run_bulk(cq);
        since_run = 0;
        continue;
      }
      /* Whatever is ready first: grpc still polls the sockets once. */
      until = gpr_inf_past(GPR_CLOCK_MONOTONIC);
    } else if (ran && cq->on_idle) {
      until = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                           gpr_time_from_seconds(CGS_CQ_IDLE_S, GPR_TIMESPAN));
    } else {
      until = gpr_inf_future(GPR_CLOCK_MONOTONIC);
    }
    grpc_event ev = grpc_completion_queue_next(cq->q, until, NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT) {
      if (cq->bulk.head) {
        run_bulk(cq);
        since_run = 0;
        ran = 1;
        continue;
      }
      if (cq->on_idle) /* only with on_idle set */
        cq->on_idle(cq->idle_data);
      ran = 0;
      continue;
    }
    since_run++;
    cgs_tag *t = ev.type == GRPC_OP_COMPLETE ? ev.tag : NULL;
    if (t)
      cgs_cq_acquire(t);
    if (t && t->on_cq) {
      t->cb(t, ev.success);
      ran = 1;
      continue;
    }
    if (ev.type == GRPC_QUEUE_SHUTDOWN)
      while (cq->bulk.head) /* their batches are refused now */
        run_bulk(cq);
    pthread_mutex_lock(&cq->mu);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) {
      cq->exited = 1;
    } else if (t) {
      t->ok = ev.success;
      t->next = NULL;
      if (cq->tail)
        cq->tail->next = t;
      else
        cq->head = t;
      cq->tail = t;
    }
    int exited = cq->exited;
    pthread_mutex_unlock(&cq->mu);
    uv_async_send(&cq->async);
    if (exited)
      break;
  }
  return NULL;
}

/* Loop thread: runs the callback of every tag the cq thread handed over. */
static void on_cq_async(uv_async_t *h) {
  cgs_cq *cq = h->data;
  pthread_mutex_lock(&cq->mu);
  cgs_tag *t = cq->head;
  cq->head = cq->tail = NULL;
  int exited = cq->exited;
  pthread_mutex_unlock(&cq->mu);
  while (t) {
    cgs_tag *next = t->next;
    t->cb(t, t->ok);
    t = next;
  }
  if (exited && !cq->exit_reported) {
    cq->exit_reported = 1;
    pthread_join(cq->thread, NULL);
    cq->on_exit(cq);
  }
}

/* ---- life cycle ------------------------------------------------------ */

int cgs_cq_init(cgs_cq *cq) {
  memset(cq, 0, sizeof *cq);
  cq->q = grpc_completion_queue_create_for_next(NULL);
  if (!cq->q)
    return CG_EINTERNAL;
  pthread_mutex_init(&cq->mu, NULL);
  return 0;
}

static void on_async_closed(uv_handle_t *h) {
  (void)h;
}

int cgs_cq_start(cgs_cq *cq, uv_loop_t *loop, void (*on_exit)(cgs_cq *cq)) {
  cq->on_exit = on_exit;
  uv_async_init(loop, &cq->async, on_cq_async);
  cq->async.data = cq;
  if (pthread_create(&cq->thread, NULL, cq_main, cq) != 0) {
    uv_close((uv_handle_t *)&cq->async, on_async_closed);
    return CG_EINTERNAL;
  }
  return 0;
}

void cgs_cq_shutdown(cgs_cq *cq) {
  atomic_store(&cq->closed, 1);
  grpc_completion_queue_shutdown(cq->q);
}

void cgs_cq_close(cgs_cq *cq, uv_close_cb close_cb) {
  grpc_completion_queue_destroy(cq->q);
  cq->q = NULL;
  pthread_mutex_destroy(&cq->mu);
  uv_close((uv_handle_t *)&cq->async, close_cb);
}

void cgs_cq_destroy(cgs_cq *cq) {
  grpc_completion_queue_shutdown(cq->q);
  grpc_completion_queue_destroy(cq->q);
  cq->q = NULL;
  pthread_mutex_destroy(&cq->mu);
}

/* ---- unary replies --------------------------------------------------- */

typedef struct reply {
  cgs_tag tag;
  cgs_cq *cq;
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
  r->cq->replies--;
  free(r);
}

void cgs_cq_reply(cgs_cq *cq, grpc_call *call, grpc_byte_buffer *msg,
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
  r->tag.on_cq = 1;
  r->cq = cq;
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
  cq->replies++;
  if (cgs_cq_batch(cq, call, ops, n, &r->tag) != GRPC_CALL_OK)
    on_reply_done(&r->tag, 0);
}
