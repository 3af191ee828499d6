/* call.c - owns the Compute call state machine: admission (the request's
 * assembly is upload.c's: header checks, buffers, chunks, the layer; here
 * the queue and the in-flight reservation), handing the job to the pool,
 * streaming the result back without copying it, timeouts, cancellation,
 * the request log and its metrics.
 *
 * Threads: see cgs_call.h. Every handler holds the call's mutex; the call
 * is freed by whichever thread drops its last reference, after unlocking:
 * handlers end with release(). */
#include "cgs_call.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "cg/layer.h"
#include "cg/text.h"
#include "cgs_buf.h"
#include "cgs_log.h"
#include "cgs_peers.h"
#include "cgs_shm.h"
#include "cgs_upload.h"
#include "cgs_wire.h"
#include "cgw.h"
#include "convgrad/v1/convgrad.pb-c.h"

/* Results up to this size ride in ResultHeader.data (the wire contract
 * promises clients no more): the whole answer is one message in one batch
 * with the status, instead of two sequential send batches. */
#define INLINE_RESULT_MAX ((size_t)64 * 1024)
/* A result batch or request message moving more tensor bytes than this
 * waits for the completion-queue thread's other ready events, its flow
 * taking turns with others (cgs_cq_defer): what a small call is answered
 * at once within, the same bound. */
#define BULK_MIN_BYTES INLINE_RESULT_MAX

typedef enum {
  ST_RECV_HEADER, /* waiting for the first message */
  ST_RECV_DATA,   /* filling input tensors from chunks */
  ST_QUEUED,      /* job handed to the pool (waiting or running) */
  ST_SENDING,     /* streaming the result */
  ST_DONE         /* final status batch started */
} call_state;

static const char *const state_names[] = {
    "receiving the header", "receiving data", "queued", "sending", "done"};

/* An output tensor, shared with grpc slices that reference it. */
typedef struct outbuf {
  atomic_int refs;
  void *data;
} outbuf;

struct cgs_call {
  cgs_server *s;
  grpc_call *call;
  uint64_t id;
  char *peer;
  char client[160]; /* the caller: its token's label, else its certificate's
                       subject (mutual TLS); "" when neither */
  cgs_peer *from;   /* held until the call is freed */
  cgs_peer *flow;   /* whose turns its job waits for: its token's label
                       (held too) with --auth-tokens, else from */
  int receiving;    /* counted in from's receiving (--max-calls-per-peer) */
  cgs_peer_class peer_class;
  unsigned retry_attempt;  /* the client's convgrad-retry-attempt, 0 if none */
  cgs_refusal refused;     /* a "retry later" refusal, for the metrics */
  unsigned retry_after_ms; /* its hint, sent as trailing metadata */
  /* retry-after-ms and convgrad-missing-staged, while the status goes
   * out */
  grpc_metadata trailer[2];
  size_t ntrailer;
  /* A Stage call (cgs_stage_method) instead of a Compute call: the one
   * input is the entry's bytes, which go into the store once verified. */
  int stage;
  int stage_present;      /* the store held the entry: nothing uploaded */
  int stage_stored;       /* the bytes went in: answered once no batch is out */
  grpc_metadata stage_md; /* convgrad-stage, while it goes out */
  pthread_mutex_t mu;     /* see the top of the file */
  /* One for the call's life, dropped once it is over (release()), and one
   * for each sweep holding it. */
  atomic_uint refs;
  int over; /* the life reference is dropped */
  cgs_calls_link link;
  /* When the sweep must look at the call (uv_hrtime ns): its deadline, or
   * --idle-timeout after the last progress while bytes move, or the end of
   * the --min-upload-rate window; DUE_NEVER when none applies. */
  _Atomic uint64_t due;
  cgs_tag tag_recv, tag_send, tag_close;
  /* A received message (recv_bb, recv_pending still set) and the next
   * result chunk (send_pending set, no batch out yet) deferred as bulk
   * work: cgs_cq_defer. */
  cgs_bulk_item bulk_recv, bulk_send;
  call_state st;

  /* grpc side */
  int recv_pending, send_pending;
  int close_received, cancelled;
  int server_cancelled; /* we cancelled the call ourselves */
  int half_closed;      /* client sent END_STREAM */
  int md_sent;          /* initial metadata went out */
  int finished;         /* final status decided; nothing more to send */
  int grpc_released;    /* grpc_call_unref done */
  int job_busy;         /* the pool holds job */
  int place_held;       /* a pool place is reserved for job, not yet used */
  int job_picked;       /* a worker took job: its queue_ms and worker are set */
  char worker[32];      /* that worker's name; the log may outlive the pool */
  grpc_byte_buffer *recv_bb, *send_bb;
  grpc_slice status_slice;
  int status_slice_set;
  grpc_status_code status;
  char msg[512];
  const char *ended_in; /* state when the end was decided, for messages */
  uint64_t t_start, deadline_at; /* uv_hrtime ns; deadline 0 = none */
  uint64_t t_send;               /* the result header went out */
  uint64_t t_sent;               /* the last result batch completed */
  uint64_t t_reply;    /* the batch with the final status went to grpc */
  uint64_t t_progress; /* the last request message or result batch */
  /* The --min-upload-rate window: bytes_in at its start, and its start. */
  uint64_t rate_bytes, rate_from;

  cgs_upload up;     /* the request's tensors and, once resolved, its layer */
  uint64_t reserved; /* bytes counted in s->inflight_bytes */

  /* result: the outputs of layer, sent one after another in cg_grad order,
   * each as soon as it is computed (diff_src while the worker computes the
   * weights' gradients) */
  cgs_job job;
  outbuf *out[CG_GRAD_COUNT];
  unsigned computed_grads; /* CG_GRAD_BIT of the outputs computed */
  int send_waiting; /* an output went out whole, the next is not computed */
  int cur_out;      /* the output being sent */
  size_t sent;      /* bytes of it sent */
  size_t sent_all;  /* bytes of every output sent */
};

#define DUE_NEVER UINT64_MAX

static void stop_timer(cgs_call *c) {
  atomic_store(&c->due, DUE_NEVER);
}

/* ---- helpers ---------------------------------------------------------- */

/* Also grpc's slice free, on any of its threads. */
static void outbuf_unref(void *p) {
  outbuf *o = p;
  cgs_cq_acquire(o);
  if (atomic_fetch_sub(&o->refs, 1) == 1) {
    cgs_buf_free(o->data);
    free(o);
  }
}

/* ---- end of a call ---------------------------------------------------- */

static double ms_between(uint64_t from, uint64_t to) {
  return from && to > from ? (double)(to - from) / 1e6 : 0.0;
}

/* A call's figures, taken once when it ends: its log line and its
 * metrics read the same times and bytes. */
typedef struct call_record {
  int computed; /* the job ran to the end (the call can still have failed
                   after it, a cancel while sending, say: its figures are
                   true) */
  cg_compute_path path; /* f32_convert if any output took it */
  double recv_ms;       /* arrival -> the job's submission */
  double queue_ms;      /* submitted -> picked up; 0 if never picked */
  double compute_ms;    /* the job's run over every output; 0 without one */
  double send_ms;       /* the result header -> the last result batch */
  double total_ms;      /* arrival -> end */
  double reply_ms;      /* arrival -> the status batch handed to grpc */
  uint64_t bytes_in, bytes_out;
} call_record;

static void call_record_fill(const cgs_call *c, call_record *r) {
  memset(r, 0, sizeof *r);
  r->computed = c->job_picked && c->job.rc == 0;
  r->path = CG_PATH_NATIVE;
  for (int g = 0; r->computed && g < CG_GRAD_COUNT; g++) {
    r->compute_ms += c->job.info[g].compute_ms;
    if (c->job.info[g].path != CG_PATH_NATIVE)
      r->path = c->job.info[g].path;
  }
  r->recv_ms = ms_between(c->t_start, c->job.t_submit);
  r->queue_ms = c->job_picked ? c->job.queue_ms : 0.0;
  r->send_ms = ms_between(c->t_send, c->t_sent);
  r->total_ms = ms_between(c->t_start, uv_hrtime());
  r->reply_ms = ms_between(c->t_start, c->t_reply);
  r->bytes_in = c->up.bytes_in;
  r->bytes_out = c->sent_all;
}

/* " key=" and ms with three decimals. */
static void append_ms(cg_text *t, const char *key, double ms) {
  cg_text_str(t, key);
  cg_text_fixed3(t, ms);
}

static void log_call(cgs_call *c, const call_record *r) {
  /* A flood of failing calls (resets, refusals) must not flood the log:
   * a peer's failure lines are rate-limited, and the sweep reports how
   * many were left out. */
  if (c->status != GRPC_STATUS_OK && c->status != GRPC_STATUS_INTERNAL &&
      !cgs_peers_log_allowed(c->s->peers, c->from, uv_hrtime(),
                             c->s->cfg->peer_log_rate))
    return;
  cgs_log_level level =
      c->status == GRPC_STATUS_INTERNAL ? CGS_LOG_WARN : CGS_LOG_INFO;
  if (!cgs_log_enabled(level))
    return;
  char line[2048], peer[128], client[2 * sizeof c->client],
      msg[2 * sizeof c->msg];
  /* Built without printf, which cost more than the tiny row's kernel;
   * every client-controlled value goes through cgs_log_value. */
  cg_text t;
  cg_text_init(&t, line, sizeof line);
  cg_text_str(&t, c->stage ? "stage id=" : "compute id=");
  cg_text_int(&t, (int64_t)c->id);
  cgs_log_value(peer, sizeof peer, c->peer ? c->peer : "?");
  cg_text_str(&t, " peer=");
  cg_text_str(&t, peer);
  cgs_log_value(client, sizeof client, c->client[0] ? c->client : "-");
  cg_text_str(&t, " client=");
  cg_text_str(&t, client);
  cg_text_str(&t, " op=");
  cg_text_str(&t, c->up.prob.op ? cg_op_name(c->up.prob.op) : "-");
  cg_text_str(&t, " dtype=");
  cg_text_str(&t, c->up.prob.dtype ? cg_dtype_name(c->up.prob.dtype) : "-");
  cg_text_str(&t, " in=");
  cg_text_str(&t, c->up.shapes[0] ? c->up.shapes : "-");
  cg_text_str(&t, " out=");
  if (c->up.resolved) {
    /* As cut to 96 bytes before. */
    char out[96];
    cg_text o;
    cg_text_init(&o, out, sizeof out);
    cg_layer_text_outputs(&o, &c->up.layer);
    cg_text_str(&t, out);
  } else {
    cg_text_str(&t, "-");
  }
  cg_text_str(&t, " bytes_in=");
  cg_text_int(&t, (int64_t)r->bytes_in);
  cg_text_str(&t, " bytes_out=");
  cg_text_int(&t, (int64_t)r->bytes_out);
  append_ms(&t, " recv_ms=", r->recv_ms);
  append_ms(&t, " queue_ms=", r->queue_ms);
  append_ms(&t, " compute_ms=", r->compute_ms);
  append_ms(&t, " send_ms=", r->send_ms);
  append_ms(&t, " total_ms=", r->total_ms);
  append_ms(&t, " reply_ms=", r->reply_ms);
  cg_text_str(&t, " path=");
  cg_text_str(&t, r->computed
                      ? (r->path == CG_PATH_NATIVE ? "native" : "f32_convert")
                      : "-");
  cg_text_str(&t, " worker=");
  cg_text_str(&t, c->job_picked ? c->worker : "-");
  cg_text_str(&t, " status=");
  cg_text_str(&t, cgw_status_name(c->status));
  if (c->msg[0]) {
    cgs_log_value(msg, sizeof msg, c->msg);
    cg_text_str(&t, " msg=");
    cg_text_str(&t, msg);
  }
  /* Last, and only for a checked job, so that other lines keep their
   * form. */
  if (c->job_picked && (c->job.checked || c->job.rc == CG_EDATALOSS)) {
    cg_text_str(&t, " check=");
    cg_text_str(&t, c->job.recomputed           ? "recomputed"
                    : c->job.rc == CG_EDATALOSS ? "failed"
                                                : "passed");
  }
  cgs_log_str(level, line);
}

static void count_call(cgs_call *c, const call_record *r) {
  if (c->stage) {
    cgs_metrics_stage_ended(c->s->metrics, c->status, r->bytes_in);
    return;
  }
  cgs_metrics_call m = {.op = c->up.prob.op,
                        .dtype = c->up.prob.dtype,
                        .code = c->status,
                        .request_s = r->total_ms / 1e3,
                        .queued = c->job_picked,
                        .queue_s = r->queue_ms / 1e3,
                        .computed = r->computed,
                        .compute_s = r->compute_ms / 1e3,
                        .bytes_in = r->bytes_in,
                        .bytes_out = r->bytes_out,
                        .refused = c->refused,
                        .retry_attempt = c->retry_attempt,
                        .peer_class = c->peer_class};
  for (int g = 0; m.computed && g < CG_GRAD_COUNT; g++) {
    /* diff_bias is a plain pass, no primitive to look up. */
    if (!(c->up.layer.grads & CG_GRAD_BIT(g)) || g == CG_GRAD_DIFF_BIAS)
      continue;
    if (c->job.info[g].cache_hit)
      m.cache_hits++;
    else
      m.cache_misses++;
  }
  cgs_metrics_call_ended(c->s->metrics, &m);
}

/* Once nothing holds c any more. */
static void free_call(cgs_call *c) {
  cgs_server *s = c->s;
  call_record r;
  call_record_fill(c, &r);
  atomic_fetch_sub(&s->inflight_bytes, c->reserved);
  /* After the release: a reader of the line, or a scrape, that sees the
   * call ended sees its bytes returned. */
  log_call(c, &r);
  count_call(c, &r);
  cgs_upload_close(&c->up);
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    if (c->out[g])
      outbuf_unref(c->out[g]);
  if (c->status_slice_set)
    grpc_slice_unref(c->status_slice);
  for (size_t i = 0; i < c->ntrailer; i++) {
    grpc_slice_unref(c->trailer[i].key);
    grpc_slice_unref(c->trailer[i].value);
  }
  gpr_free(c->peer);
  if (c->flow != c->from)
    cgs_peers_release(s->peers, c->flow);
  cgs_peers_release(s->peers, c->from);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

/* The one close path, which every handler ends with: unlocks c, whose
 * mutex the caller holds, and drops the held references the caller took
 * (a sweep's); once grpc is done with the call it is released, and once
 * the worker has returned the job too the call leaves the live list and
 * drops its life reference as well. Whoever drops the last frees it. */
static void release_refs(cgs_call *c, unsigned held) {
  if (!c->grpc_released && c->finished && c->close_received &&
      !c->recv_pending && !c->send_pending) {
    c->grpc_released = 1;
    grpc_call_unref(c->call);
    c->call = NULL;
  }
  int over = c->grpc_released && !c->job_busy && !c->over;
  if (over) {
    c->over = 1;
    atomic_store(&c->due, DUE_NEVER);
    cgs_calls_remove(&c->s->calls, &c->link);
  }
  pthread_mutex_unlock(&c->mu);
  unsigned drop = held + (unsigned)over;
  if (drop && atomic_fetch_sub(&c->refs, drop) == drop)
    free_call(c);
}

static void release(cgs_call *c) {
  release_refs(c, 0);
}

static void on_send(cgs_tag *t, int ok);

/* Cancels the grpc call with the status already recorded in c. gRPC then
 * reports the call as cancelled to on_close, which must not take that for
 * the client's doing. */
static void cancel_with_status(cgs_call *c) {
  c->server_cancelled = 1;
  grpc_call_cancel_with_status(c->call, c->status, c->msg, NULL);
}

/* The call's request is in, or will never be: it no longer counts against
 * its peer's --max-calls-per-peer. */
static void stop_receiving(cgs_call *c) {
  if (c->receiving) {
    c->receiving = 0;
    cgs_peers_stop_receiving(c->s->peers, c->from);
  }
}

/* A call that ends while its request arrives has nothing else allocated
 * (no job, no output yet): its inputs go, and its reservation with them,
 * before the client can see the status, so a stalled upload's memory is
 * back once its end is decided. */
static void drop_upload(cgs_call *c) {
  cgs_upload_free_inputs(&c->up);
  atomic_fetch_sub(&c->s->inflight_bytes, c->reserved);
  c->reserved = 0;
}

/* The trailing metadata of a refusal the client should retry. */
#define RETRY_AFTER_KEY "retry-after-ms"

static void vfinish(cgs_call *c, grpc_status_code code, const char *fmt,
                    va_list ap) {
  if (c->finished)
    return;
  c->finished = 1;
  c->ended_in = state_names[c->st];
  c->status = code;
  if (c->receiving)
    drop_upload(c);
  stop_receiving(c);
  if (c->place_held) {
    cgs_pool_unreserve(c->s->pool);
    c->place_held = 0;
  }
  /* ap comes started from finish() and vfinish's other callers; the
   * analyzer loses that on some of their paths. */
  // NOLINTNEXTLINE(clang-analyzer-valist.Uninitialized)
  vsnprintf(c->msg, sizeof c->msg, fmt, ap);
  stop_timer(c);
  if (c->job_busy) {
    if (cgs_pool_cancel(c->s->pool, &c->job))
      c->job_busy = 0; /* never ran: its buffers are free to go */
    else
      atomic_store(&c->job.discard, 1); /* runs to the end, discarded */
  }
  if (c->close_received)
    return; /* the client is gone: nobody to tell */
  if (c->send_pending) {
    /* A chunk is in flight and grpc allows one send batch at a time. */
    cancel_with_status(c);
    return;
  }
  grpc_op ops[2];
  size_t n = 0;
  memset(ops, 0, sizeof ops);
  if (!c->md_sent) {
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    c->md_sent = 1;
  }
  c->status_slice = grpc_slice_from_copied_string(c->msg);
  c->status_slice_set = 1;
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = code;
  ops[n].data.send_status_from_server.status_details = &c->status_slice;
  if (c->retry_after_ms) {
    char ms[16];
    snprintf(ms, sizeof ms, "%u", c->retry_after_ms);
    c->trailer[c->ntrailer].key =
        grpc_slice_from_static_string(RETRY_AFTER_KEY);
    c->trailer[c->ntrailer++].value = grpc_slice_from_copied_string(ms);
  }
  if (code == GRPC_STATUS_NOT_FOUND && c->up.missing[0]) {
    c->trailer[c->ntrailer].key =
        grpc_slice_from_static_string(CGS_MISSING_STAGED_KEY);
    c->trailer[c->ntrailer++].value =
        grpc_slice_from_copied_string(c->up.missing);
  }
  ops[n].data.send_status_from_server.trailing_metadata_count = c->ntrailer;
  ops[n].data.send_status_from_server.trailing_metadata = c->trailer;
  n++;
  c->st = ST_DONE;
  c->send_pending = 1;
  c->t_reply = uv_hrtime();
  if (cgs_cq_batch(&c->s->cq, c->call, ops, n, &c->tag_send) != GRPC_CALL_OK) {
    c->send_pending = 0;
    cancel_with_status(c);
  }
}

/* Ends the call with code unless its end is already decided. Does not free
 * c: callers end with release(). */
static void finish(cgs_call *c, grpc_status_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void finish(cgs_call *c, grpc_status_code code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfinish(c, code, fmt, ap);
  va_end(ap);
}

/* Refuses the call "retry later" for reason: finish() with the hint
 * retry_after_ms in trailing metadata (RETRY_AFTER_KEY), which tells the
 * client that nothing ran and that trying again is expected. */
static void refuse(cgs_call *c, cgs_refusal reason, unsigned retry_after_ms,
                   grpc_status_code code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void refuse(cgs_call *c, cgs_refusal reason, unsigned retry_after_ms,
                   grpc_status_code code, const char *fmt, ...) {
  if (c->finished)
    return;
  c->refused = reason;
  c->retry_after_ms = retry_after_ms ? retry_after_ms : 1;
  va_list ap;
  va_start(ap, fmt);
  vfinish(c, code, fmt, ap);
  va_end(ap);
}

/* Hints of the refusals, in ms. A busy server's: about the time its
 * workers take to run what waits now, from their recent jobs, within
 * these bounds. */
#define BUSY_RETRY_MIN_MS 5
#define BUSY_RETRY_MAX_MS 2000
/* Calls still receiving their request end within an upload, usually. */
#define PEER_RETRY_MS 100
/* A draining server is going away: its replacement or another replica
 * takes calls after about this long. */
#define DRAIN_RETRY_MS 1000

static unsigned busy_retry_ms(cgs_server *s) {
  unsigned queued, busy;
  uint64_t inline_jobs;
  cgs_pool_load(s->pool, &queued, &busy, &inline_jobs);
  double ms = cgs_pool_mean_run_ms(s->pool) *
              ((double)queued / (double)s->cfg->workers + 1.0);
  if (ms < BUSY_RETRY_MIN_MS)
    return BUSY_RETRY_MIN_MS;
  return ms > BUSY_RETRY_MAX_MS ? BUSY_RETRY_MAX_MS : (unsigned)ms;
}

/* 1 while bytes should be moving: the request arriving (its header
 * included: a stream that never sends one would hold its place for as
 * long as its deadline), or a result batch out. */
static int moving(const cgs_call *c) {
  return c->st == ST_RECV_HEADER || c->st == ST_RECV_DATA || c->send_pending;
}

/* Sets when the sweep looks at the call next, for what comes first: the
 * deadline, or, while bytes move, --idle-timeout after the last progress.
 * A client that stalls would otherwise hold its reserved bytes for as long
 * as its deadline, which may be never. No libuv timer per call: the loop
 * sweeps the live calls every few tens of milliseconds (cgs_call_sweep),
 * so arming is one store on whichever thread made progress. */
static void arm_timer(cgs_call *c) {
  uint64_t due = c->deadline_at ? c->deadline_at : DUE_NEVER;
  uint64_t idle = c->s->cfg->idle_timeout_ms * 1000000u;
  if (idle && moving(c) && c->t_progress + idle < due)
    due = c->t_progress + idle;
  if (idle && c->s->cfg->min_upload_rate && c->st == ST_RECV_DATA &&
      c->rate_from + idle < due)
    due = c->rate_from + idle;
  atomic_store(&c->due, due);
}

/* 1 when the call's deadline has (about) passed. A client cancels at its
 * own deadline, which our copy (taken when the header arrived) trails by
 * the transit time: a cancel that close to it is the deadline. */
static int past_deadline(const cgs_call *c) {
  return c->deadline_at && uv_hrtime() + 50ull * 1000000u >= c->deadline_at;
}

/* ---- sending the result ----------------------------------------------- */

/* Fills op with the final OK status, which the batch being built will
 * carry, and records the call as finished. */
static void add_ok_status(cgs_call *c, grpc_op *op) {
  c->finished = 1;
  c->ended_in = state_names[c->st];
  c->status = GRPC_STATUS_OK;
  c->st = ST_DONE;
  c->status_slice = grpc_slice_from_static_string("");
  c->status_slice_set = 1;
  op->op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  op->data.send_status_from_server.status = GRPC_STATUS_OK;
  op->data.send_status_from_server.status_details = &c->status_slice;
}

/* Starts a result batch (c->send_bb, if any, is its message). grpc only
 * refuses one once the server is closing: the call ends there. */
static void send_failed(cgs_call *c);

static void start_send(cgs_call *c, const grpc_op *ops, size_t n) {
  c->send_pending = 1;
  if (c->st == ST_DONE)
    c->t_reply = uv_hrtime();
  if (cgs_cq_batch(&c->s->cq, c->call, ops, n, &c->tag_send) == GRPC_CALL_OK) {
    c->t_progress = uv_hrtime();
    arm_timer(c);
    return;
  }
  send_failed(c);
}

/* A send batch could not start: the call ends there. */
static void send_failed(cgs_call *c) {
  c->send_pending = 0;
  if (c->send_bb) {
    grpc_byte_buffer_destroy(c->send_bb);
    c->send_bb = NULL;
  }
  if (!c->finished)
    c->ended_in = state_names[c->st];
  c->finished = 1;
  c->status = GRPC_STATUS_INTERNAL;
  snprintf(c->msg, sizeof c->msg, "cannot start a send batch");
  stop_timer(c);
  cancel_with_status(c);
}

/* Fills op with the next result chunk of len bytes (c->send_bb, a slice
 * over the output memory). */
static void chunk_op(cgs_call *c, size_t len, grpc_op *op) {
  outbuf *o = c->out[c->cur_out];
  atomic_fetch_add(&o->refs, 1); /* dropped by the slice */
  cgs_cq_release(o);
  c->send_bb =
      cgw_response_chunk((char *)o->data + c->sent, len, outbuf_unref, o);
  c->sent += len;
  c->sent_all += len;
  op->op = GRPC_OP_SEND_MESSAGE;
  op->data.send_message.send_message = c->send_bb;
}

/* The output after g, or -1 after the last. */
static int next_output(const cgs_call *c, int g) {
  for (g++; g < CG_GRAD_COUNT; g++)
    if (c->up.layer.grads & CG_GRAD_BIT(g))
      return g;
  return -1;
}

/* Bytes of the output being sent that are still to go. */
static size_t left_to_send(const cgs_call *c) {
  return c->up.layer.out_bytes[c->cur_out] - c->sent;
}

static void send_header(cgs_call *c, int out);

/* Starts the batch of the output's next len bytes (may be 0), with the OK
 * status when last. */
static void send_chunk(cgs_call *c, size_t len, int last) {
  grpc_op ops[2];
  size_t n = 0;
  memset(ops, 0, sizeof ops);
  if (len)
    chunk_op(c, len, &ops[n++]);
  if (last)
    add_ok_status(c, &ops[n++]); /* the last chunk carries it */
  start_send(c, ops, n);
}

/* The next result batch: a chunk of the output being sent, the last one
 * with the OK status when no output follows (a chunk of more than
 * BULK_MIN_BYTES as bulk work, in its flow's turn), or the next output's
 * header. Completion-queue thread. */
static void send_next(cgs_call *c) {
  size_t left = left_to_send(c);
  int next = next_output(c, c->cur_out);
  if (left == 0 && next >= 0) {
    if (c->computed_grads & CG_GRAD_BIT(next))
      send_header(c, next);
    else
      c->send_waiting = 1; /* answer() goes on */
    return;
  }
  size_t len = left < c->up.chunk_bytes ? left : c->up.chunk_bytes;
  if (len > BULK_MIN_BYTES) {
    /* No batch is out, but none may start, and the call stays. */
    c->send_pending = 1;
    cgs_cq_defer(&c->s->cq, &c->bulk_send, &c->flow->bulk_turn);
    return;
  }
  send_chunk(c, len, left == len && next < 0);
}

/* The deferred chunk's turn (see send_next). */
static void run_bulk_send(cgs_bulk_item *it) {
  cgs_call *c = cgs_container_of(it, cgs_call, bulk_send);
  pthread_mutex_lock(&c->mu);
  c->send_pending = 0;
  if (!c->finished) { /* else ended meanwhile: nothing more goes out */
    size_t left = left_to_send(c);
    size_t len = left < c->up.chunk_bytes ? left : c->up.chunk_bytes;
    send_chunk(c, len, left == len && next_output(c, c->cur_out) < 0);
  }
  release(c);
}

static Convgrad__V1__Layout output_layout(const cgs_call *c, int out) {
  if (out == CG_GRAD_DIFF_SRC)
    return (Convgrad__V1__Layout)c->up.layer.data.out_data_format;
  if (out == CG_GRAD_DIFF_WEIGHTS)
    return (Convgrad__V1__Layout)(c->up.layer.weights.out_weights_format + 2);
  return CONVGRAD__V1__LAYOUT__LAYOUT_UNSPECIFIED;
}

/* Starts output out with its header, which carries the whole output when
 * it is small, and the OK status too when it is also the last. */
static void send_header(cgs_call *c, int out) {
  const cg_geom *g = cg_layer_geom(&c->up.layer, (cg_grad)out);
  const cg_run_info *info = &c->job.info[out];
  size_t bytes = c->up.layer.out_bytes[out];
  Convgrad__V1__ResultHeader h = CONVGRAD__V1__RESULT_HEADER__INIT;
  int64_t pb[CG_MAX_SPATIAL], pe[CG_MAX_SPATIAL];
  for (int i = 0; i < g->nsp; i++) {
    pb[i] = g->pad_begin[i];
    pe[i] = g->pad_end[i];
  }
  h.output = (Convgrad__V1__Output)(out + CONVGRAD__V1__OUTPUT__DIFF_SRC);
  h.dtype = (Convgrad__V1__DType)g->dtype;
  h.n_shape = (size_t)c->up.layer.out_rank[out];
  h.shape = c->up.layer.out_dims[out];
  h.layout = output_layout(c, out);
  h.total_bytes = bytes;
  h.queue_ms = c->job.queue_ms;
  h.compute_ms = info->compute_ms;
  h.compute_path = info->path == CG_PATH_NATIVE ? "native" : "f32_convert";
  h.n_pads_begin = h.n_pads_end = (size_t)g->nsp;
  h.pads_begin = pb;
  h.pads_end = pe;
  h.worker = c->worker;
  Convgrad__V1__RegionRef at = CONVGRAD__V1__REGION_REF__INIT;
  int in_region = c->up.out_at[out] != NULL;
  int whole =
      in_region || (bytes <= INLINE_RESULT_MAX && bytes <= c->up.chunk_bytes);
  if (in_region) {
    at.name = (char *)cgs_region_name(c->up.out_region[out]);
    at.offset = cgs_region_offset(c->up.out_region[out], c->up.out_at[out]);
    at.byte_size = bytes;
    h.region = &at;
  } else if (whole) {
    h.data.data = c->out[out]->data; /* packed by copy: at most 64 KiB */
    h.data.len = bytes;
  }
  Convgrad__V1__ComputeResponse r = CONVGRAD__V1__COMPUTE_RESPONSE__INIT;
  r.kind_case = CONVGRAD__V1__COMPUTE_RESPONSE__KIND_HEADER;
  r.header = &h;
  c->send_bb = cgw_pack(&r.base);

  grpc_op ops[3];
  size_t n = 0;
  memset(ops, 0, sizeof ops);
  if (!c->md_sent) {
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    c->md_sent = 1;
    c->t_send = uv_hrtime();
  }
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n++].data.send_message.send_message = c->send_bb;
  c->st = ST_SENDING;
  c->cur_out = out;
  c->sent = 0;
  if (whole) {
    c->sent = bytes;
    if (!in_region)
      c->sent_all += bytes;
    /* Waiting for the client's half-close here would cost a second
     * send batch on most calls: its notification trails the compute. */
    if (next_output(c, out) < 0)
      add_ok_status(c, &ops[n++]);
  }
  start_send(c, ops, n);
}

static void stage_answer(cgs_call *c);

static void on_send(cgs_tag *t, int ok) {
  cgs_call *c = cgs_container_of(t, cgs_call, tag_send);
  pthread_mutex_lock(&c->mu);
  c->send_pending = 0;
  if (c->send_bb) {
    grpc_byte_buffer_destroy(c->send_bb);
    c->send_bb = NULL;
  }
  if (!ok) {
    /* Nothing of this batch reached the client, a final status included:
     * the stream broke (client cancelled, deadline, shutdown). An error
     * status we decided ourselves (and cancelled the call with) stays. */
    if (!c->finished || c->status == GRPC_STATUS_OK) {
      int late = past_deadline(c);
      const char *in = c->finished ? c->ended_in : state_names[c->st];
      c->finished = 1;
      c->status = late ? GRPC_STATUS_DEADLINE_EXCEEDED : GRPC_STATUS_CANCELLED;
      snprintf(c->msg, sizeof c->msg, "%s while %s",
               late ? "deadline exceeded" : "cancelled by the client", in);
    }
    stop_timer(c);
  } else if (!c->finished) {
    if (!c->stage)
      send_next(c);
    else if (c->stage_stored)
      stage_answer(c);
  } else {
    stop_timer(c); /* the last batch is out */
    if (c->status == GRPC_STATUS_OK && c->st == ST_DONE)
      c->t_sent = uv_hrtime();
  }
  release(c);
}

/* ---- the worker's answer ---------------------------------------------- */

/* Starts sending from output g, computed (c->mu held), unless the call
 * has ended: its regions are checked first, as the client may have
 * changed them under the call. */
static void send_from(cgs_call *c, int g) {
  grpc_status_code code;
  char msg[sizeof c->msg];
  if (c->finished)
    return;
  if (cgs_upload_regions_check(&c->up, &code, msg, sizeof msg) != 0)
    finish(c, code, "%s", msg);
  else
    send_header(c, g);
}

/* The job ran (c->mu held): the thread that ran it starts the answer, or
 * goes on with it after the outputs that went out early. */
static void answer(cgs_call *c) {
  c->job_picked = 1;
  snprintf(c->worker, sizeof c->worker, "%s",
           cgs_pool_worker_name(c->s->pool, c->job.worker));
  if (c->finished)
    return;
  if (c->job.rc != 0) {
    finish(c, cgs_wire_status(c->job.rc), "%s", c->job.err);
    return;
  }
  c->computed_grads = c->up.layer.grads;
  if (c->st != ST_SENDING) {
    send_from(c, next_output(c, -1));
  } else if (c->send_waiting) {
    c->send_waiting = 0;
    send_from(c, next_output(c, c->cur_out));
  } /* else the send under way goes on with the rest (on_send) */
}

/* On the worker: output g is computed and others follow. It goes out
 * now if it is the first (diff_src: the caller's backward pass waits for
 * it, not for the weights' gradients). */
static void output_done(cgs_job *job, int g) {
  cgs_call *c = cgs_container_of(job, cgs_call, job);
  pthread_mutex_lock(&c->mu);
  c->computed_grads |= CG_GRAD_BIT(g);
  if (c->st == ST_QUEUED && g == next_output(c, -1)) {
    snprintf(c->worker, sizeof c->worker, "%s",
             cgs_pool_worker_name(c->s->pool, job->worker));
    send_from(c, g);
  }
  release(c);
}

/* The worker that ran the job starts the answer itself (see cgs_call.h). */
void cgs_call_job_done(cgs_job *job, void *data) {
  cgs_call *c = cgs_container_of(job, cgs_call, job);
  (void)data;
  pthread_mutex_lock(&c->mu);
  c->job_busy = 0;
  answer(c);
  release(c);
}

/* ---- admission -------------------------------------------------------- */

/* Reserves bytes of the in-flight budget. */
static int reserve(cgs_call *c, uint64_t bytes, const char *what) {
  cgs_server *s = c->s;
  uint64_t max = s->cfg->max_inflight_bytes;
  if (bytes > max - c->reserved) {
    /* Even an idle server cannot take it: retrying cannot help. */
    finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
           "%s: the request needs %" PRIu64 " bytes in all, more than the "
           "whole in-flight budget %" PRIu64
           " (--max-inflight-bytes); it cannot run on this server",
           what, c->reserved + bytes, max);
    return -1;
  }
  uint64_t held = atomic_load(&s->inflight_bytes);
  do {
    if (held > max - bytes) {
      refuse(c, CGS_REFUSED_INFLIGHT, busy_retry_ms(s),
             GRPC_STATUS_RESOURCE_EXHAUSTED,
             "%s: needs %" PRIu64 " bytes but other requests hold %" PRIu64
             " of %" PRIu64 " (--max-inflight-bytes); retry later",
             what, bytes, held - c->reserved, max);
      return -1;
    }
  } while (
      !atomic_compare_exchange_weak(&s->inflight_bytes, &held, held + bytes));
  c->reserved += bytes;
  return 0;
}

/* Resolves the layer and reserves its outputs; -1 after finish(). */
static int resolve(cgs_call *c) {
  grpc_status_code code;
  char msg[sizeof c->msg];
  if (cgs_upload_resolve(&c->up, c->s->cfg, &code, msg, sizeof msg) != 0) {
    finish(c, code, "%s", msg);
    return -1;
  }
  return reserve(c, cgs_upload_out_bytes(&c->up), "outputs");
}

static void inputs_complete(cgs_call *c) {
  if (!c->up.resolved && resolve(c) != 0)
    return;
  stop_receiving(c); /* the request is in; outputs are allocated next */
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    if (!(c->up.layer.grads & CG_GRAD_BIT(g)))
      continue;
    if (c->up.out_at[g]) { /* written in place: nothing to stream */
      c->job.out[g] = c->up.out_at[g];
      continue;
    }
    size_t bytes = c->up.layer.out_bytes[g];
    outbuf *o = calloc(1, sizeof *o);
    void *data = o ? cgs_buf_alloc(bytes) : NULL;
    if (!data) {
      free(o);
      finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s: cannot allocate %zu bytes",
             cg_grad_name((cg_grad)g), bytes);
      return;
    }
    atomic_init(&o->refs, 1);
    o->data = data;
    c->out[g] = o;
    c->job.out[g] = data;
  }
  c->job.layer = &c->up.layer;
  c->job.call_id = c->id;
  c->job.peer = c->peer;
  for (int i = 0; i < 3; i++)
    c->job.in[i] = c->up.in_buf[i];
  atomic_init(&c->job.discard, 0);
  c->job.output_done = output_done;
  c->place_held = 0; /* the job's from here: the pool gives it back */
  if (cgs_pool_run_inline(c->s->pool, &c->job, &c->flow->turn)) {
    /* A tiny job ran here: no hand-off to a worker and back. */
    answer(c);
    return;
  }
  cgs_pool_submit(c->s->pool, &c->job, &c->flow->turn);
  c->job_busy = 1;
  c->st = ST_QUEUED;
}

/* ---- Stage ------------------------------------------------------------ */

/* The key of the initial metadata a Stage call's header is answered
 * with: STAGE_PRESENT (the answer follows) or STAGE_UPLOAD (send the
 * bytes). */
#define STAGE_KEY "convgrad-stage"
#define STAGE_PRESENT "present"
#define STAGE_UPLOAD "upload"

/* Fills op with the initial metadata of a Stage call's answer, value
 * STAGE_PRESENT or STAGE_UPLOAD. */
static void stage_md_op(cgs_call *c, const char *value, grpc_op *op) {
  c->stage_md.key = grpc_slice_from_static_string(STAGE_KEY);
  c->stage_md.value = grpc_slice_from_static_string(value);
  op->op = GRPC_OP_SEND_INITIAL_METADATA;
  op->data.send_initial_metadata.count = 1;
  op->data.send_initial_metadata.metadata = &c->stage_md;
  c->md_sent = 1;
  c->t_send = uv_hrtime();
}

/* The StageResponse and OK, with the initial metadata when it has not
 * gone out yet (an entry the store held). */
static void stage_answer(cgs_call *c) {
  Convgrad__V1__StageResponse r = CONVGRAD__V1__STAGE_RESPONSE__INIT;
  r.sha256.data = c->up.stage_id;
  r.sha256.len = CGS_STORE_ID_BYTES;
  r.byte_size = c->up.in_len[0];
  r.present = c->stage_present;
  r.ttl_ms = c->s->cfg->store_ttl_ms;
  c->send_bb = cgw_pack(&r.base);
  grpc_op ops[3];
  size_t n = 0;
  memset(ops, 0, sizeof ops);
  if (!c->md_sent)
    stage_md_op(c, STAGE_PRESENT, &ops[n++]);
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n++].data.send_message.send_message = c->send_bb;
  c->st = ST_SENDING;
  add_ok_status(c, &ops[n++]);
  start_send(c, ops, n);
}

/* The upload is in: its bytes, verified (or under a private id), go into
 * the store. */
static void stage_complete(cgs_call *c) {
  grpc_status_code code;
  char msg[sizeof c->msg];
  unsigned char *data;
  size_t len;
  int retry;
  stop_receiving(c);
  if (cgs_upload_stage_take(&c->up, &data, &len, &code, msg, sizeof msg) != 0) {
    finish(c, code, "%s", msg);
    return;
  }
  /* The bytes are the store's now, counted in its budget. */
  drop_upload(c);
  if (cgs_store_put(c->s->store, c->up.owner, c->flow->addr,
                    c->up.stage_private, c->up.stage_id, data, len,
                    cgs_store_now_ms(), &retry, &code, msg, sizeof msg) != 0) {
    if (retry)
      refuse(c, CGS_REFUSED_NONE, PEER_RETRY_MS, code, "%s", msg);
    else
      finish(c, code, "%s", msg);
    return;
  }
  c->stage_stored = 1;
  c->st = ST_SENDING;
  if (!c->send_pending)
    stage_answer(c); /* else once the metadata is out (on_send) */
}

static void handle_stage_header(cgs_call *c, grpc_byte_buffer *bb) {
  grpc_status_code code;
  char msg[sizeof c->msg];
  cgs_upload *u = &c->up;
  if (!c->s->store) {
    finish(c, GRPC_STATUS_FAILED_PRECONDITION,
           "this server keeps no staged tensors (--store-bytes 0); send the "
           "bytes with each call");
    return;
  }
  if (cgs_upload_stage_header(u, bb, c->s->cfg, &code, msg, sizeof msg) != 0) {
    finish(c, code, "%s", msg);
    return;
  }
  if (cgs_store_touch(c->s->store, u->owner,
                      u->stage_private ? c->flow->addr : NULL, u->stage_id,
                      u->in_len[0], cgs_store_now_ms())) {
    stop_receiving(c);
    c->stage_present = 1;
    stage_answer(c);
    return;
  }
  if (cgs_store_admit(c->s->store, u->in_len[0], &code, msg, sizeof msg) != 0) {
    finish(c, code, "%s", msg);
    return;
  }
  if (reserve(c, u->in_len[0], "header.byte_size") != 0)
    return;
  if (cgs_upload_alloc(u, &code, msg, sizeof msg) != 0) {
    finish(c, code, "%s", msg);
    return;
  }
  c->st = ST_RECV_DATA;
  c->rate_from = uv_hrtime();
  c->rate_bytes = u->bytes_in;
  if (cgs_upload_complete(u)) {
    stage_complete(c);
    return;
  }
  grpc_op op;
  memset(&op, 0, sizeof op);
  stage_md_op(c, STAGE_UPLOAD, &op);
  start_send(c, &op, 1);
}

static void handle_header(cgs_call *c, grpc_byte_buffer *bb) {
  grpc_status_code code;
  char msg[sizeof c->msg];
  if (c->stage) {
    handle_stage_header(c, bb);
    return;
  }
  if (cgs_upload_header(&c->up, bb, c->s->cfg, &code, msg, sizeof msg) != 0) {
    finish(c, code, "%s", msg);
    return;
  }
  if (cgs_pool_reserve(c->s->pool) != 0) {
    /* Refuse before the client uploads anything. */
    refuse(c, CGS_REFUSED_QUEUE_FULL, busy_retry_ms(c->s),
           GRPC_STATUS_RESOURCE_EXHAUSTED,
           "queue full: %u requests are running, uploading or waiting for "
           "a worker (--workers + --queue-depth); retry later",
           c->s->cfg->workers + c->s->cfg->queue_depth);
    return;
  }
  c->place_held = 1;
  if (reserve(c, cgs_upload_in_bytes(&c->up), "inputs") != 0)
    return;
  if (cgs_upload_alloc(&c->up, &code, msg, sizeof msg) != 0) {
    finish(c, code, "%s", msg);
    return;
  }
  cgs_debug("compute id=%" PRIu64 " admitted: reserved %" PRIu64
            " bytes, %" PRIu64 " in flight",
            c->id, c->reserved, c->s->inflight_bytes);
  /* Without a shape tensor still to come, validate before the upload. */
  if (!cgs_upload_needs_shape(&c->up) && resolve(c) != 0)
    return;
  c->st = ST_RECV_DATA;
  c->rate_from = uv_hrtime();
  c->rate_bytes = c->up.bytes_in;
  if (cgs_upload_complete(&c->up))
    inputs_complete(c);
}

static void handle_chunk(cgs_call *c, const cgs_chunk_view *v,
                         grpc_byte_buffer *bb) {
  grpc_status_code code;
  char msg[sizeof c->msg];
  if (cgs_upload_chunk(&c->up, v, bb, &code, msg, sizeof msg) != 0) {
    finish(c, code, "%s", msg);
    return;
  }
  if (cgs_upload_complete(&c->up))
    (c->stage ? stage_complete : inputs_complete)(c);
}

/* ---- receiving -------------------------------------------------------- */

static void on_recv(cgs_tag *t, int ok);

/* Asks grpc for the next request message; 0 or -1. */
static int start_recv(cgs_call *c) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &c->recv_bb;
  c->recv_pending = 1;
  if (cgs_cq_batch(&c->s->cq, c->call, &op, 1, &c->tag_recv) == GRPC_CALL_OK)
    return 0;
  c->recv_pending = 0;
  return -1;
}

static void post_recv(cgs_call *c) {
  if (c->half_closed || c->finished || c->recv_pending)
    return;
  if (start_recv(c) != 0)
    finish(c, GRPC_STATUS_INTERNAL, "cannot start a receive batch");
}

static void handle_message(cgs_call *c, grpc_byte_buffer *bb) {
  char err[256];
  cgs_msg_kind kind;
  cgs_chunk_view v;
  if (cgs_wire_scan_request(bb, &kind, &v, err, sizeof err) != 0) {
    finish(c, GRPC_STATUS_INVALID_ARGUMENT, "%s", err);
    return;
  }
  if (c->st == ST_RECV_HEADER) {
    if (kind != CGS_MSG_HEADER)
      finish(c, GRPC_STATUS_INVALID_ARGUMENT,
             "request: the first message must set header");
    else
      handle_header(c, bb);
  } else if (kind == CGS_MSG_HEADER) {
    finish(c, GRPC_STATUS_INVALID_ARGUMENT,
           "request: header sent twice (only the first message sets it)");
  } else if (c->st == ST_RECV_DATA) {
    handle_chunk(c, &v, bb);
  } else if (v.data_len) {
    finish(c, GRPC_STATUS_INVALID_ARGUMENT,
           "chunk.data: %zu bytes beyond the declared tensors", v.data_len);
  }
}

/* Takes one received message, or the end of the client's stream when bb
 * is NULL, and asks for the next message. Consumes bb. */
static void take_message(cgs_call *c, grpc_byte_buffer *bb) {
  if (!c->finished) {
    if (!bb) {
      c->half_closed = 1;
      if (c->st == ST_RECV_HEADER)
        finish(c, GRPC_STATUS_INVALID_ARGUMENT,
               "request: stream ended before the header");
      else if (c->st == ST_RECV_DATA)
        finish(c, GRPC_STATUS_INVALID_ARGUMENT,
               "inputs[%d].data: stream ended after %zu of %zu bytes",
               c->up.cur, c->up.in_fill[c->up.cur], c->up.in_len[c->up.cur]);
    } else {
      post_recv(c); /* early: bytes past the tensors are seen sooner */
      handle_message(c, bb);
      c->t_progress = uv_hrtime();
      if (!c->finished)
        arm_timer(c);
    }
  }
  if (bb)
    grpc_byte_buffer_destroy(bb);
}

/* The received message (ok: a message or the end of the stream) is
 * taken; the next receive may start. */
static void take_recv(cgs_call *c, int ok) {
  grpc_byte_buffer *bb = c->recv_bb;
  c->recv_bb = NULL;
  c->recv_pending = 0;
  if (ok)
    take_message(c, bb);
  else if (bb)
    grpc_byte_buffer_destroy(bb);
}

/* A message of more than BULK_MIN_BYTES is taken as bulk work, in its
 * flow's turn; recv_pending stays set until then. */
static void on_recv(cgs_tag *t, int ok) {
  cgs_call *c = cgs_container_of(t, cgs_call, tag_recv);
  pthread_mutex_lock(&c->mu);
  if (ok && c->recv_bb && !c->finished &&
      grpc_byte_buffer_length(c->recv_bb) > BULK_MIN_BYTES)
    cgs_cq_defer(&c->s->cq, &c->bulk_recv, &c->flow->bulk_turn);
  else
    take_recv(c, ok);
  release(c);
}

/* The deferred message's turn (see on_recv). */
static void run_bulk_recv(cgs_bulk_item *it) {
  cgs_call *c = cgs_container_of(it, cgs_call, bulk_recv);
  pthread_mutex_lock(&c->mu);
  take_recv(c, 1);
  release(c);
}

/* ---- deadline, cancellation ------------------------------------------- */

/* Where the call is, for messages; takes a queued job back from the pool
 * so that the answer ("queued" or "running") stays true. */
static const char *where(cgs_call *c) {
  if (c->st != ST_QUEUED)
    return state_names[c->st];
  if (c->job_busy && cgs_pool_cancel(c->s->pool, &c->job)) {
    c->job_busy = 0;
    return "queued";
  }
  return "running";
}

static void on_close(cgs_tag *t, int ok) {
  cgs_call *c = cgs_container_of(t, cgs_call, tag_close);
  (void)ok;
  pthread_mutex_lock(&c->mu);
  c->close_received = 1;
  int late = past_deadline(c);
  if (c->finished && c->cancelled && !c->server_cancelled &&
      c->status != GRPC_STATUS_CANCELLED &&
      c->status != GRPC_STATUS_DEADLINE_EXCEEDED) {
    /* The client cancelled before our status reached it: its cancel can
     * look like a half-close, which ended the call as a truncated
     * stream. */
    c->status = late ? GRPC_STATUS_DEADLINE_EXCEEDED : GRPC_STATUS_CANCELLED;
    snprintf(c->msg, sizeof c->msg, "%s while %s",
             late ? "deadline exceeded" : "cancelled by the client",
             c->ended_in);
  }
  if (!c->finished) {
    /* Nothing goes out any more; finish() only records and stops work. */
    const char *in = where(c);
    finish(c, late ? GRPC_STATUS_DEADLINE_EXCEEDED : GRPC_STATUS_CANCELLED,
           "%s while %s",
           late ? "deadline exceeded" : "cancelled by the client", in);
  }
  release(c);
}

/* The idle timeout: nothing arrived, or the client stopped taking the
 * result, for --idle-timeout. */
static void stalled(cgs_call *c) {
  double secs = (double)c->s->cfg->idle_timeout_ms / 1e3;
  char why[256];
  if (c->st == ST_RECV_HEADER)
    snprintf(why, sizeof why, "no request header for %g s (--idle-timeout)",
             secs);
  else if (c->st == ST_RECV_DATA)
    snprintf(why, sizeof why,
             "no request data for %g s while receiving inputs[%d] (%zu of "
             "%zu bytes) (--idle-timeout)",
             secs, c->up.cur, c->up.in_fill[c->up.cur],
             c->up.in_len[c->up.cur]);
  else
    snprintf(why, sizeof why,
             "the client took no result data for %g s (%zu of %zu bytes "
             "of %s sent) (--idle-timeout)",
             secs, c->sent, c->up.layer.out_bytes[c->cur_out],
             cg_grad_name((cg_grad)c->cur_out));
  if (!c->finished) {
    finish(c, GRPC_STATUS_DEADLINE_EXCEEDED, "%s", why);
  } else if (c->send_pending && !c->close_received) {
    /* The last batch, OK status included, is stuck behind a client that
     * stopped reading; grpc allows no second batch to say so. */
    c->status = GRPC_STATUS_DEADLINE_EXCEEDED;
    snprintf(c->msg, sizeof c->msg, "%s", why);
    cancel_with_status(c);
  }
}

/* At the end of each --idle-timeout window of the upload: 1 when the
 * window brought less than --min-upload-rate asks (or than the bytes
 * still missing at its start), else 0 and the next window opens. Every
 * message resets the idle timeout, so without this a client trickling a
 * byte a second would hold its place and memory for ever. */
static int slow_upload(cgs_call *c) {
  uint64_t rate = c->s->cfg->min_upload_rate;
  uint64_t window = c->s->cfg->idle_timeout_ms * 1000000u, now = uv_hrtime();
  if (!rate || !window || c->st != ST_RECV_DATA || now < c->rate_from + window)
    return 0;
  uint64_t got = c->up.bytes_in - c->rate_bytes;
  double need = (double)rate * (double)(now - c->rate_from) / 1e9;
  if ((double)(got + cgs_upload_missing(&c->up)) < need)
    need = (double)(got + cgs_upload_missing(&c->up));
  if ((double)got < need)
    return 1;
  c->rate_from = now;
  c->rate_bytes = c->up.bytes_in;
  return 0;
}

/* The sweep found c due (see arm_timer) and holds a reference to it. */
static void on_timer(cgs_call *c) {
  pthread_mutex_lock(&c->mu);
  uint64_t idle = c->s->cfg->idle_timeout_ms * 1000000u;
  if (past_deadline(c)) {
    if (!c->finished) {
      const char *in = where(c);
      finish(c, GRPC_STATUS_DEADLINE_EXCEEDED, "deadline exceeded while %s",
             in);
    }
  } else if (idle && moving(c) && uv_hrtime() >= c->t_progress + idle) {
    stalled(c);
  } else if (!c->finished && slow_upload(c)) {
    finish(c, GRPC_STATUS_DEADLINE_EXCEEDED,
           "inputs[%d].data: %" PRIu64 " bytes in the last %g s, below "
           "--min-upload-rate %" PRIu64 " bytes/s (%zu of %zu bytes "
           "received)",
           c->up.cur, c->up.bytes_in - c->rate_bytes,
           (double)c->s->cfg->idle_timeout_ms / 1e3, c->s->cfg->min_upload_rate,
           c->up.in_fill[c->up.cur], c->up.in_len[c->up.cur]);
  } else if (!c->finished) {
    arm_timer(c); /* progress since it was armed */
  }
  release_refs(c, 1);
}

/* Live calls, each with a reference taken under the list's lock. */
typedef struct held_call {
  cgs_call *c;
} held_call;
typedef struct held {
  held_call *v;
  size_t n, cap;
  uint64_t due_by; /* only calls due by then; 0: every call */
} held;

static void hold(cgs_calls_link *l, void *arg) {
  held *h = arg;
  cgs_call *c = cgs_container_of(l, cgs_call, link);
  if (h->n == h->cap || (h->due_by && atomic_load(&c->due) > h->due_by))
    return;
  atomic_fetch_add(&c->refs, 1);
  h->v[h->n++].c = c;
}

/* Takes a reference on the live calls due by due_by (0: all) into h; a
 * call that arrives meanwhile may be left for the next time. */
static void hold_live(cgs_server *s, held *h, uint64_t due_by) {
  h->n = 0;
  h->due_by = due_by;
  h->cap = cgs_calls_live(&s->calls);
  h->v = h->cap ? malloc(h->cap * sizeof *h->v) : NULL;
  if (h->v)
    cgs_calls_each(&s->calls, hold, h);
}

void cgs_call_sweep(cgs_server *s) {
  held h;
  hold_live(s, &h, uv_hrtime());
  for (size_t i = 0; i < h.n; i++)
    on_timer(h.v[i].c);
  free(h.v);
}

void cgs_call_cancel_all(cgs_server *s) {
  held h;
  hold_live(s, &h, 0);
  for (size_t i = 0; i < h.n; i++) {
    cgs_call *c = h.v[i].c;
    pthread_mutex_lock(&c->mu);
    finish(c, GRPC_STATUS_UNAVAILABLE,
           "server shut down before the request finished; retry elsewhere");
    c->server_cancelled = 1; /* see cgs_call.h */
    release_refs(c, 1);
  }
  free(h.v);
}

/* The subject of the certificate the client presented, if any (only
 * mutual TLS asks for one). */
static void read_client_identity(cgs_call *c) {
  grpc_auth_context *ctx = grpc_call_auth_context(c->call);
  if (!ctx)
    return;
  grpc_auth_property_iterator it = grpc_auth_context_find_properties_by_name(
      ctx, GRPC_X509_SUBJECT_PROPERTY_NAME);
  const grpc_auth_property *p = grpc_auth_property_iterator_next(&it);
  if (p) {
    size_t n = p->value_length < sizeof c->client - 1 ? p->value_length
                                                      : sizeof c->client - 1;
    memcpy(c->client, p->value, n);
    c->client[n] = '\0';
  }
  grpc_auth_context_release(ctx);
}

/* Fills a new call object (client: its token's label, or NULL) and links
 * it into the server's list. */
static void init_call(cgs_call *c, cgs_server *s, grpc_call *call,
                      const char *client) {
  /* Before grpc's peer string and auth context, which its log counts. */
  c->t_start = c->t_progress = uv_hrtime();
  c->s = s;
  c->call = call;
  c->peer = grpc_call_get_peer(call);
  read_client_identity(c);
  c->from = cgs_peers_hold(s->peers, c->peer, c->t_start);
  c->flow = c->from;
  if (client) { /* the token's label names the caller before its certificate */
    snprintf(c->client, sizeof c->client, "%s", client);
    c->flow = cgs_peers_hold_label(s->peers, client, c->t_start);
  }
  c->peer_class = cgs_peer_classify(c->peer);
  pthread_mutex_init(&c->mu, NULL);
  atomic_init(&c->refs, 1);
  atomic_init(&c->due, DUE_NEVER);
  cgs_tag *tags[] = {&c->tag_recv, &c->tag_send, &c->tag_close};
  void (*cbs[])(cgs_tag *, int) = {on_recv, on_send, on_close};
  for (int i = 0; i < 3; i++) {
    tags[i]->cb = cbs[i];
    tags[i]->on_cq = 1;
  }
  c->bulk_recv.run = run_bulk_recv;
  c->bulk_send.run = run_bulk_send;
  c->st = ST_RECV_HEADER;
  c->id = cgs_calls_add(&s->calls, &c->link);
  if (cgs_log_enabled(CGS_LOG_DEBUG)) {
    char peer[128];
    cgs_log_value(peer, sizeof peer, c->peer);
    cgs_debug("compute id=%" PRIu64 " started, peer %s", c->id, peer);
  }
}

/* Watches the call's end and refuses it when the server drains, its peer
 * holds too many calls or its deadline has passed; -1 after finish(). */
static int accept_call(cgs_call *c, gpr_timespec deadline) {
  cgs_server *s = c->s;
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  op.data.recv_close_on_server.cancelled = &c->cancelled;
  if (cgs_cq_batch(&s->cq, c->call, &op, 1, &c->tag_close) != GRPC_CALL_OK) {
    c->close_received = 1; /* no notification will come */
    grpc_call_cancel(c->call, NULL);
    finish(c, GRPC_STATUS_INTERNAL, "cannot watch the call");
    return -1;
  }
  if (cgs_calls_draining(&s->calls)) {
    refuse(c, CGS_REFUSED_DRAINING, DRAIN_RETRY_MS, GRPC_STATUS_UNAVAILABLE,
           "server is shutting down; retry elsewhere");
    return -1;
  }
  /* Only calls still receiving their request count: those can hold a
   * place without sending anything. Calls whose request is in wait their
   * turn in the fair queue however many a peer has. */
  unsigned receiving;
  if (cgs_peers_start_receiving(s->peers, c->from, s->cfg->max_calls_per_peer,
                                &receiving) != 0) {
    refuse(c, CGS_REFUSED_PEER_CALLS, PEER_RETRY_MS,
           GRPC_STATUS_RESOURCE_EXHAUSTED,
           "this client address has %u calls still sending their request, "
           "at most %u are allowed (--max-calls-per-peer); retry later",
           receiving, s->cfg->max_calls_per_peer);
    return -1;
  }
  c->receiving = 1;
  gpr_timespec dl = gpr_convert_clock_type(deadline, GPR_CLOCK_MONOTONIC);
  if (gpr_time_cmp(dl, gpr_inf_future(GPR_CLOCK_MONOTONIC)) != 0) {
    int64_t ms =
        gpr_time_to_millis(gpr_time_sub(dl, gpr_now(GPR_CLOCK_MONOTONIC)));
    if (ms <= 0) {
      finish(c, GRPC_STATUS_DEADLINE_EXCEEDED,
             "deadline exceeded before the call started");
      return -1;
    }
    c->deadline_at = c->t_start + (uint64_t)ms * 1000000u;
  }
  return 0;
}

/* The attempt number a retrying client sends (convgrad-retry-attempt: N,
 * 1 for the first retry); 0 when absent or not a number. */
static unsigned retry_attempt(const grpc_metadata_array *md) {
  for (size_t i = 0; md && i < md->count; i++) {
    if (!grpc_slice_str_cmp(md->metadata[i].key, "convgrad-retry-attempt")) {
      char v[12];
      size_t n = GRPC_SLICE_LENGTH(md->metadata[i].value);
      if (n == 0 || n >= sizeof v)
        return 0;
      memcpy(v, GRPC_SLICE_START_PTR(md->metadata[i].value), n);
      v[n] = '\0';
      char *end;
      unsigned long a = strtoul(v, &end, 10);
      return *end || a > 1000000 ? 0 : (unsigned)a;
    }
  }
  return 0;
}

/* A Compute call, or a Stage call when stage is set. */
static void start_call(cgs_server *s, grpc_call *call, gpr_timespec deadline,
                       const char *client, const grpc_metadata_array *md,
                       int stage) {
  cgs_call *c = calloc(1, sizeof *c);
  if (!c) {
    cgs_cq_reply(&s->cq, call, NULL, GRPC_STATUS_RESOURCE_EXHAUSTED,
                 "server out of memory");
    return;
  }
  init_call(c, s, call, client);
  c->stage = stage;
  c->retry_attempt = retry_attempt(md);
  const char *no_shm = NULL;
  cgs_regions *rs = cgs_shm_for_peer(s, c->peer, &no_shm);
  cgs_upload_use_regions(&c->up, rs, no_shm, client);
  cgs_upload_use_store(&c->up, s->store, c->flow->addr);
  /* The sweep may find it from now on. */
  pthread_mutex_lock(&c->mu);
  if (accept_call(c, deadline) == 0) {
    post_recv(c);
    arm_timer(c);
  }
  release(c);
}

static void start(cgs_server *s, grpc_call *call, gpr_timespec deadline,
                  grpc_byte_buffer *payload, const char *client,
                  const grpc_metadata_array *md) {
  (void)payload; /* registered without: the call receives its own */
  start_call(s, call, deadline, client, md, 0);
}

static void start_stage(cgs_server *s, grpc_call *call, gpr_timespec deadline,
                        grpc_byte_buffer *payload, const char *client,
                        const grpc_metadata_array *md) {
  (void)payload;
  start_call(s, call, deadline, client, md, 1);
}

/* grpc does not read the first message: the call is handed over at its
 * HTTP/2 headers, so that the per-peer limit and the idle timeout cover
 * streams that never send one (grpc would keep those out of our sight for
 * as long as their client likes). */
const cgs_method_def cgs_call_method = {
    .path = "/convgrad.v1.ConvGrad/Compute",
    .reads_first = 0,
    .slots = 32,
    .needs_token = 1,
    .on_cq = 1,
    .start = start,
};

/* A Compute call's upload, the same admission and timeouts. */
const cgs_method_def cgs_stage_method = {
    .path = "/convgrad.v1.ConvGrad/Stage",
    .reads_first = 0,
    .slots = 8,
    .needs_token = 1,
    .on_cq = 1,
    .start = start_stage,
};
