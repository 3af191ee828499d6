/* internal.h - what the libcgclient sources share, grouped by the file
 * that defines it: the channel struct (channel.c), the status helpers
 * (errors.c), a call's buffers and the unary call (call.c), deadlines and
 * the retry loop (retry.c), the Compute job (compute.c), one call over
 * several replicas (split.c), regions (region.c) and the client's result
 * checks (verify.c). sync.c (the blocking calls) and async.c (the engine)
 * use them. Not installed. */
#ifndef CGC_INTERNAL_H
#define CGC_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/support/time.h>

#include "cg/layer.h"
#include "cgc/client.h"
#include "cgw.h"

/* The engine of a channel's asynchronous calls (async.c): a completion
 * queue and the thread that drives it, both made with the first call. */
typedef struct cgc__engine {
  pthread_mutex_t mu; /* guards starting it */
  grpc_completion_queue *cq;
  pthread_t thread;
} cgc__engine;
void cgc__engine_init(cgc__engine *e);
/* Ends the engine's thread and queue (no call may be in flight). */
void cgc__engine_close(cgc__engine *e);
/* Cancels c, a call of cgc__call_start (cgc__job_cancel); it must still
 * be finished. */
void cgc__call_cancel(cgc_call *c);

/* What a cgc_call runs, behind cgc_call_wait and cgc_call_finish: one
 * Compute job (async.c) or a call split over replicas (split.c). */
typedef struct cgc__call_ops {
  unsigned (*wants)(const void *obj); /* the outputs asked for */
  /* The ended call's code, result and status (res and st may be NULL). */
  int (*result)(void *obj, cgc_result *res, cgc_status *st);
  /* Hands over the outputs of a call that ended with 0 (structs owned by
   * the taker, data in the caller's buffers). */
  void (*take)(void *obj, cgc_tensor *out[CG_GRAD_COUNT]);
  void (*free)(void *obj);
  void (*cancel)(void *obj); /* NULL: the call cannot be cancelled */
} cgc__call_ops;
/* Hears that outputs of c became whole (whole: all so far), on the
 * thread that drives c, holding c's lock (as cgc_call_end_fn). */
typedef void (*cgc__call_whole_fn)(cgc_call *c, void *arg, unsigned whole);
/* A call running obj, told of its outputs by cgc__call_whole and of its
 * end by cgc__call_ended (arg: the call); on_whole and notify (may be
 * NULL) hear of them with arg. NULL when out of memory. */
cgc_call *cgc__call_new(const cgc__call_ops *ops, void *obj,
                        cgc__call_whole_fn on_whole, cgc_call_end_fn notify,
                        void *arg);
void cgc__call_whole(void *c, unsigned whole); /* a cgc__whole_fn */
void cgc__call_ended(void *c);                 /* a cgc__end_fn */
/* How a call's outputs are checked: as the channel's verifier draws
 * (verify_rate, or a shape new to it: a checked call is counted), or as
 * the caller of a split part or failover decided. */
typedef enum {
  CGC__CHECK_DRAW,
  CGC__CHECK_ALWAYS,
  CGC__CHECK_NEVER
} cgc__check_mode;
/* cgc_call_start_notify on ch's one server (a channel without replicas,
 * or one replica's), with on_whole (may be NULL) told of the outputs as
 * they become whole, and its outputs checked as check says. data[g] must
 * be set for each output asked for. */
int cgc__call_start(cgc_channel *ch, const cgc_request *req,
                    void *const data[CG_GRAD_COUNT],
                    const size_t cap[CG_GRAD_COUNT], cgc__check_mode check,
                    cgc__call_whole_fn on_whole, cgc_call_end_fn notify,
                    void *arg, cgc_call **out, cgc_status *st);

/* Bounds of cgc_options.replicas and split_parts. */
#define CGC__REPLICAS_MAX 64
#define CGC__PARTS_MAX 256

/* One replica of a channel with cgc_options.replicas: its own channel
 * (made and freed by channel.c) and what the split has measured of it
 * (split.c), under the parent's split_mu. */
#define CGC__REPLICA_SHAPES 16
typedef struct cgc__replica {
  cgc_channel *ch;     /* owned */
  double ms_per_gflop; /* server compute: the median of figs; 0: unknown */
  double figs[3];      /* its last compute figures (ms per GFLOP), a ring */
  int nfigs, next_fig;
  double measured_ms;   /* when a part last measured it (cgc__now_ms) */
  double bytes_per_ms;  /* the link, a moving average; 0: unknown */
  int outstanding;      /* parts and calls in flight on it */
  double down_until_ms; /* after a failure: picked only if all are down */
  /* An attempt of it lost to a copy started after it and was cancelled,
   * and it has answered nothing since: no backup goes to it (cgc__give_up) */
  int stuck;
  /* The shapes it has answered lately (cgc__shape_key; 0 free), a ring. */
  uint64_t shapes[CGC__REPLICA_SHAPES];
  int shapes_next;
} cgc__replica;

/* What the split of a channel with replicas has measured (split.c),
 * allocated with the replicas (channel.c), under split_mu: latencies
 * kept per part shape, and shapes tracked. */
#define CGC__LAT_RING 32
#define CGC__LAT_SHAPES 32

/* Latencies of the parts of one shape, for the hedge delay. */
typedef struct cgc__lat {
  uint64_t key; /* 0: free */
  double ms[CGC__LAT_RING];
  int n, next;
} cgc__lat;

typedef struct cgc__split cgc__split;

/* The number of parts a channel cut a request's shape into, the first
 * time it saw it (split.c, cgc__auto_cut). */
#define CGC__CUTS 64
typedef struct cgc__cut {
  uint64_t key; /* 0: free */
  int nparts;
} cgc__cut;

struct cgc__split_stats {
  /* Backups that may go now: each part first sent adds hedge_budget, up
   * to its share of CGC__HEDGE_WINDOW parts (at least 1); a backup or a
   * probe takes 1 (split.c). */
  double hedge_tokens;
  cgc__lat lat[CGC__LAT_SHAPES];
  cgc__cut cuts[CGC__CUTS];
  /* The thread that drives the channel's split calls (split.c), started
   * with the first, and the calls it drives. */
  cgc__split *active;
  pthread_t driver;
  int driver_on, stop;
  /* Counts what the replicas' engine threads tell of the parts (outputs
   * whole, calls ended): they hold a part's call lock, so they take
   * this lock, never split_mu. Made with the driver. */
  pthread_mutex_t ev_mu;
  pthread_cond_t ev;
  unsigned events;
};

/* The client's result checks of a channel (verify.c): which calls,
 * the counts, where a failure is told. */
#define CGC__VERIFY_SHAPES 64
typedef struct cgc__verifier {
  double rate;   /* cgc_options.verify_rate */
  uint64_t seed; /* of the draws and the probes, per channel */
  void (*notify)(void *arg, const char *line);
  void *notify_arg;
  atomic_uint_fast64_t draws;
  atomic_uint_fast64_t calls, outputs, failed, recovered, lost;
  pthread_mutex_t mu;                  /* shapes */
  uint64_t shapes[CGC__VERIFY_SHAPES]; /* seen, by cgc__shape_key; 0 free */
} cgc__verifier;

/* Whether staging pays on a channel (stage.c): the ids it staged lately,
 * and how the first calls naming one of them fared. A channel whose
 * target spreads calls over servers that share no store (round_robin
 * over an address list) stages on one server and computes on another:
 * once half of CGC__STAGE_WINDOW such calls found the server without an
 * id staged moments before, staging is off for good (cgc_stage refuses,
 * staged views go as bytes). A replica's channel reports to its
 * parent's, where cgc_stage runs.
 *
 * A restarted server lost every id staged before, and their misses tell
 * nothing of the target; a restart drops the connection, so the watch
 * counts the times its channel left READY (conn_cq, polled whenever the
 * window is judged or fed: the drop is on the queue before a new
 * connection can carry a call) and the calls that saw UNAVAILABLE, and
 * judges only ids staged since the last of them (lost). */
#define CGC__STAGE_RING 64
#define CGC__STAGE_WINDOW 8
typedef struct cgc__stage_watch {
  pthread_mutex_t mu;
  struct {
    unsigned char id[CGC_STAGED_ID_BYTES];
    double at_ms;  /* cgc__now_ms() when cgc_stage returned it; 0: free */
    double ttl_ms; /* the server's, as the Stage answered */
    unsigned lost; /* the watch's lost when it was staged */
  } ring[CGC__STAGE_RING];
  int next;
  unsigned lost;     /* connections dropped and calls that saw UNAVAILABLE */
  int calls, misses; /* of the window, so far */
  atomic_int off;
  /* The connectivity watch on chan (the channel's own, not owned): a
   * grpc_channel_watch_connectivity_state armed with conn_state on
   * conn_cq (owned). */
  grpc_channel *chan;
  grpc_completion_queue *conn_cq;
  grpc_connectivity_state conn_state;
} cgc__stage_watch;

/* Completion queues kept for reuse: one per call in flight at the
 * channel's busiest, up to this many. */
#define CGC__CQ_CACHE 64

struct cgc_channel {
  grpc_channel *chan;
  cgc_options opts; /* immutable after cgc_channel_new */
  char *target;
  /* The token's metadata, sent with every call; count 0 without one. */
  grpc_metadata auth_md;
  size_t auth_md_count;
  /* Regions registered through this channel (region.c). */
  pthread_mutex_t regions_mu;
  cgc_region *regions;
  cgc__engine engine; /* runs the asynchronous calls */
  /* The completion queues of ended calls, empty, for the next ones:
   * creating and destroying one per call costs a tiny call (tests/README.md,
   * "Design figures"). */
  pthread_mutex_t cqs_mu;
  grpc_completion_queue *cqs[CGC__CQ_CACHE];
  int ncqs;
  /* cgc_options.replicas > 0: the replicas and the split's state
   * (split.c), under split_mu. */
  cgc__replica *replicas;
  int nreplicas;
  pthread_mutex_t split_mu;
  struct cgc__split_stats *stats;
  /* The result checks: this channel's own (verify), or for a replica's
   * channel its parent's, which draws the calls and counts (vf). */
  cgc__verifier verify;
  cgc__verifier *vf;
  /* Attempts more after a failed check: 1, or 0 on a replica's channel,
   * whose parent sends the output to another replica instead. */
  int verify_retries;
  /* Whether staging pays (stage.c): this channel's own (stage_watch), or
   * for a replica's channel its parent's (sw). */
  cgc__stage_watch stage_watch;
  cgc__stage_watch *sw;
};

/* cgc_channel_new; parent: NULL, or the channel whose replica this one
 * is: its connections are then not shared with other channels to the
 * same address, and its result checks are the parent's (vf). */
int cgc__channel_new(cgc_channel **out, const char *target,
                     const cgc_options *opts, cgc_channel *parent, char *err,
                     size_t errlen);

/* stage.c: a Compute call that named staged ids (ids: by input) reached
 * a server, which lacked those in missing; tells ch's stage watch. */
void cgc__stage_seen(cgc_channel *ch, const cgc_request *req, unsigned ids,
                     unsigned missing);
/* stage.c: a call on ch saw UNAVAILABLE: ids staged before may be lost in
 * a restart, and their misses tell nothing of the target. */
void cgc__stage_unavailable(cgc_channel *ch);
/* stage.c: starts the connectivity watch of ch's own stage watch, on
 * ch->chan (a channel that is no replica's). */
void cgc__stage_watch_start(cgc_channel *ch);
/* stage.c: ends it, after grpc_channel_destroy(ch->chan) (which ends the
 * watch); a no-op on a watch never started. */
void cgc__stage_watch_close(cgc_channel *ch);
/* 1 when staging is off on ch (cgc__stage_watch). */
int cgc__stage_off(const cgc_channel *ch);
/* 1 when a staged id is a private one (CGC_PRIVATE_ID_TAG). */
int cgc__stage_id_private(const unsigned char *id);

/* errors.c: statuses. */

/* Writes code and a printf-style message into st (may be NULL). */
void cgc__status_set(cgc_status *st, grpc_status_code code, const char *fmt,
                     ...) __attribute__((format(printf, 3, 4)));
/* Sets st (may be NULL) to OK with an empty message: every successful
 * call does, so without a printf. */
void cgc__status_ok(cgc_status *st);
/* Copies a gRPC status (details slice) into st. */
void cgc__status_from_grpc(cgc_status *st, grpc_status_code code,
                           grpc_slice details);

/* retry.c: deadlines and the retry loop. */

/* Absolute monotonic deadline deadline_ms from now (0: channel default). */
gpr_timespec cgc__deadline(const cgc_channel *ch, int64_t deadline_ms);
/* Milliseconds since an arbitrary monotonic origin. */
double cgc__now_ms(void);
/* Fills until with clock's time ms from now (none when ms <= 0, about
 * 31 years at most): the deadline of a pthread_cond_timedwait on a
 * condition variable of that clock. */
void cgc__clock_after_ms(clockid_t clock, double ms, struct timespec *until);

/* Request metadata on a retried attempt: "convgrad-retry-attempt: N", N
 * = 1 for the first retry, so the server can count retries. */
#define CGC__RETRY_ATTEMPT_KEY "convgrad-retry-attempt"
/* Trailing metadata of a "retry later" refusal: the milliseconds the
 * server asks the caller to wait, in decimal. */
#define CGC__RETRY_AFTER_KEY "retry-after-ms"

/* What one attempt of a call is told, and tells back. */
typedef struct cgc__try {
  gpr_timespec deadline; /* the call's, retries included */
  int retry;             /* 0 for the first attempt, N for the Nth retry */
  /* Set by the attempt: the server's retry-after-ms, -1 when it sent
   * none. */
  int64_t retry_after_ms;
} cgc__try;

/* A completion-queue event's handler: every tag the library hands gRPC on
 * a queue that cgc__tag_run drives is one of these, embedded in what the
 * event belongs to (container_of style), so that one loop drives any mix
 * of calls, waits and batches. */
typedef struct cgc__tag cgc__tag;
struct cgc__tag {
  void (*run)(cgc__tag *tag, int success);
};
/* Hands tag to gRPC with an operation: what this thread did before
 * happens before the handler runs, for ThreadSanitizer, which cannot see
 * gRPC's own locks (the handler may run on the engine's thread). */
static inline void *cgc__tag_give(cgc__tag *tag) {
  cgw_tsan_release(tag);
  return tag;
}
/* Runs the handler of ev (a GRPC_OP_COMPLETE event of a cgc__tag). */
static inline void cgc__tag_run(grpc_event ev) {
  cgc__tag *tag = ev.tag;
  cgw_tsan_acquire(tag);
  tag->run(tag, ev.success);
}

/* A call's retries, as steps that an event loop or a blocking loop takes:
 * after each attempt cgc__retry_next decides; a retry then waits
 * (cgc__retry_watch) for its time or for the channel to come back. */
typedef struct cgc__retrier {
  cgc_channel *ch;
  cgc__try t;     /* the next attempt's */
  double backoff; /* the next retry's exponential step, ms */
  uint64_t seed;  /* jitter: a generator per call needs no lock */
  /* The "retry later" refusal the attempt now running retries, if any. */
  cgc_status refusal;
  int retrying_refusal;
  /* The wait before the next attempt. */
  gpr_timespec wake;
  int was_down; /* the channel was not READY in the wait */
} cgc__retrier;
/* attempts: how many attempts of the call were made before (they count as
 * retries: numbered, and against the channel's retries). */
void cgc__retry_init(cgc__retrier *r, cgc_channel *ch, gpr_timespec deadline,
                     int attempts);
/* An attempt ended with rc and st (filled when rc != 0): returns 1 when it
 * is to be retried (after the wait cgc__retry_watch runs; r->t numbers the
 * retry), else 0 with rc final and st its status. Retried: UNAVAILABLE,
 * and RESOURCE_EXHAUSTED with a retry-after-ms trailer ("retry later"); a
 * RESOURCE_EXHAUSTED without one is permanent (a size limit); no retry
 * whose wait would pass the deadline, none past the channel's retries. A
 * retry of a "retry later" refusal that the deadline overtakes ends the
 * call with that refusal, noting the cut, not DEADLINE_EXCEEDED. */
int cgc__retry_next(cgc__retrier *r, int rc, cgc_status *st);
/* The wait before a retry, one step per event: with first set it starts,
 * else it takes the event (success) of the watch it started. Returns 1
 * once the wait is over, else 0 after watching the channel on cq with tag
 * (one event to come; NULL for a queue this thread drives alone). The wait ends
 * early once the channel turns READY after being anything else. */
int cgc__retry_watch(cgc__retrier *r, int first, int success,
                     grpc_completion_queue *cq, cgc__tag *tag);
/* How many attempts the call made (cgc_result.attempts) once
 * cgc__retry_next returned 0. */
int cgc__retry_attempts(const cgc__retrier *r);

/* One attempt of a blocking call: returns 0 or a negative code with st
 * filled. */
typedef int (*cgc__attempt_fn)(cgc_channel *ch, void *ctx, cgc__try *t,
                               cgc_status *st);
/* Runs attempt on this thread until cgc__retry_next says it is done,
 * waiting between attempts on a completion queue of the channel's. */
int cgc__with_retry(cgc_channel *ch, gpr_timespec deadline,
                    cgc__attempt_fn attempt, void *ctx, cgc_status *st);

/* call.c: a call's buffers and ops, completion queues, the unary call. */

/* Keeps count of the gRPC slices that still point into caller memory
 * (chunks sent in place, cgw_request_chunk): a call may end (the server
 * refuses the header, say) while the transport still holds queued chunks,
 * and must not return before gRPC has dropped every reference to the
 * caller's buffers. */
typedef struct cgc__pin cgc__pin;
/* A pin holding its call's reference; NULL when out of memory. */
cgc__pin *cgc__pin_new(void);
/* One more slice over the caller's memory, whose free is
 * cgc__pin_unref(pin) (on any of gRPC's threads). */
void cgc__pin_ref(cgc__pin *pin);
void cgc__pin_unref(void *pin);
/* Returns once gRPC holds no slice of pin's (or after 30 s: writes handed
 * to the socket finish quickly, queued ones are dropped when the stream
 * closes), and drops the call's reference: pin is gone. */
void cgc__pin_release(cgc__pin *pin);

/* What one call's batches read from and write into. The function that
 * runs the call owns it: cgc__call_io_init, then cgc__call_io_free, which
 * frees whatever it still holds. */
typedef struct cgc__call_io {
  /* The request metadata: the channel's token, the retry number. */
  grpc_metadata md[2];
  size_t md_count;
  char retry_value[16]; /* the retry number's text, md points into it */
  grpc_byte_buffer *send_bb, *recv_bb;
  grpc_metadata_array initial_md, trailing_md;
  grpc_status_code code;
  grpc_slice details;
  const char *error_string;
} cgc__call_io;
/* retry: 0 for a first attempt, N for the Nth retry (sent as
 * convgrad-retry-attempt). io must not move while the call runs. */
void cgc__call_io_init(cgc__call_io *io, const cgc_channel *ch, int retry);
/* The retry-after-ms the server sent with its status, -1 for none (or a
 * value that is not a decimal count of milliseconds). */
int64_t cgc__call_io_retry_after(const cgc__call_io *io);

/* The opening ops of a call whose request fits one message: send the
 * initial metadata (io->md), io->send_bb and the half-close, receive the
 * initial metadata and the first response message. Fills ops[0..4]. */
void cgc__ops_one_message(grpc_op ops[5], cgc__call_io *io);
/* Fills *op as GRPC_OP_RECV_STATUS_ON_CLIENT into io. */
void cgc__op_recv_status(grpc_op *op, cgc__call_io *io);
/* A unary call as two steps, for a caller that drives the completion
 * queue: one batch of six ops. */
typedef struct cgc__unary_call {
  grpc_call *call;
  cgc__call_io io;
  const char *method; /* static */
} cgc__unary_call;
/* Starts method with the serialized request req as attempt t on cq, its
 * completion an event of tag (NULL: a queue this thread drives alone).
 * Returns 0, or CGC_ERPC with st filled and nothing started. */
int cgc__unary_start(cgc__unary_call *u, cgc_channel *ch,
                     grpc_completion_queue *cq, cgc__tag *tag,
                     const char *method, const void *req, size_t reqlen,
                     const cgc__try *t, cgc_status *st);
/* After its completion: frees what u holds, sets t->retry_after_ms, and
 * with resp set hands over the serialized response (caller frees).
 * Returns 0, CGC_ERPC, CGC_EPROTO or CG_ENOMEM with st filled. */
int cgc__unary_end(cgc__unary_call *u, cgc__try *t, void **resp,
                   size_t *resplen, cgc_status *st);
/* cgc__unary_start and _end on a queue of the channel's, waited for on
 * this thread. */
int cgc__unary(cgc_channel *ch, const char *method, const void *req,
               size_t reqlen, cgc__try *t, void **resp, size_t *resplen,
               cgc_status *st);

/* A completion queue for one call on ch, owned by the caller until
 * cgc__cq_give: an ended call's, else a new one. */
grpc_completion_queue *cgc__cq_take(cgc_channel *ch);
/* Gives back a queue of cgc__cq_take with no event left in it (every
 * batch and watch started on it completed): kept for the next call, or
 * destroyed when ch keeps enough. */
void cgc__cq_give(cgc_channel *ch, grpc_completion_queue *cq);
/* Destroys the completion queues ch keeps (cgc_channel_free). */
void cgc__cqs_close(cgc_channel *ch);
/* Shuts cq down, takes what is left in it, and destroys it. */
void cgc__cq_destroy(grpc_completion_queue *cq);
/* Frees what io holds. */
void cgc__call_io_free(cgc__call_io *io);

/* compute.c: one Compute call, as cgc_compute* and the asynchronous calls
 * (async.c) run it. */
typedef struct cgc__job cgc__job;
/* Hears, on the thread running the call, each time an output has become
 * whole: whole is every output whole so far (CG_GRAD_BIT()s), and
 * CGC__SENT once the last chunk of a request longer than one message has
 * been handed to the transport (its upload is over). */
typedef void (*cgc__whole_fn)(void *arg, unsigned whole);
#define CGC__SENT (1u << 31)
/* Hears, once, that the call ended: its code, result and status are
 * final (cgc__job_result). The call is done with the job before it
 * tells, so the listener may hand it to another thread to take and free. */
typedef void (*cgc__end_fn)(void *arg);
/* Checks req and prepares a call of it on ch: output g lands in into[g]
 * when into and into[g] are set, else in a new allocation. req and what it
 * points to are borrowed until cgc__job_free. Returns 0 with *out, or a
 * negative code with st filled. */
int cgc__job_new(cgc__job **out, cgc_channel *ch, const cgc_request *req,
                 void *const *into, const size_t *into_cap,
                 cgc__check_mode check, cgc_status *st);
/* The outputs the call asks for. */
unsigned cgc__job_wants(const cgc__job *j);
/* Starts the call on cq, retries included (a retry asks only for the
 * outputs not yet whole), to end by deadline. Whoever drives cq hands its
 * events to cgc__tag_run; the call is done once on_end is told, on the
 * thread of its last event (this one, when it could not start). on_whole
 * (may be NULL) is told of outputs as they become whole; both get arg. */
void cgc__job_start(cgc__job *j, grpc_completion_queue *cq,
                    gpr_timespec deadline, cgc__whole_fn on_whole,
                    cgc__end_fn on_end, void *arg);
/* An ended call's code (0 or negative), result and status (res and st
 * may be NULL). */
int cgc__job_result(cgc__job *j, cgc_result *res, cgc_status *st);
/* Hands over the outputs of a call that ended with 0 (NULL where not
 * asked). */
void cgc__job_take(cgc__job *j, cgc_tensor *out[CG_GRAD_COUNT]);
/* Waits until gRPC holds no slice of the caller's tensors, then frees j and
 * the outputs it still holds; NULL is accepted. Not on a thread that
 * drives the call's completion queue. */
void cgc__job_free(cgc__job *j);
/* Cancels j's attempt in flight (the server sees CANCELLED) and any
 * retry: j ends soon, at the latest when a retry's wait ends.
 * Thread-safe. */
void cgc__job_cancel(cgc__job *j);

/* The outputs req asks for (CG_GRAD_BIT()s), or 0 after filling st. */
unsigned cgc__request_wants(const cgc_request *req, cgc_status *st);
/* One blocking call on ch's one server, on this thread: output g lands in
 * into[g] when into and into[g] are set, else in a new allocation; out[g]
 * receives each output asked for; its outputs checked as check says.
 * (sync.c's calls take a channel's replicas to cgc__split_compute
 * instead.) */
int cgc__compute(cgc_channel *ch, const cgc_request *req, void *const *into,
                 const size_t *into_cap, cgc__check_mode check,
                 cgc_tensor *out[CG_GRAD_COUNT], cgc_result *res,
                 cgc_status *st);

/* split.c: a call on a channel with replicas: split along the minibatch
 * when it pays, else whole on the least loaded replica. As cgc__compute. */
int cgc__split_compute(cgc_channel *ch, const cgc_request *req,
                       void *const *into, const size_t *into_cap,
                       cgc_tensor *out[CG_GRAD_COUNT], cgc_result *res,
                       cgc_status *st);
/* cgc_call_start_notify on a channel with replicas: split as above, its
 * parts driven by the channel's split thread, or whole on one replica. */
int cgc__split_start(cgc_channel *ch, const cgc_request *req,
                     void *const data[CG_GRAD_COUNT],
                     const size_t cap[CG_GRAD_COUNT], cgc_call_end_fn notify,
                     void *arg, cgc_call **out, cgc_status *st);
/* Ends the split thread of ch (no call in flight): cgc_channel_free. */
void cgc__split_close(cgc_channel *ch);

/* verify.c: what a request is to the kernels, and the client's checks of
 * the results it receives (cgc_options.verify_rate). */

/* The kernels' problem of req, with the formats its views name (lists
 * borrowed from req). */
void cgc__request_problem(const cgc_request *req, cg_problem *p);
/* A hash (never 0) of what decides a request's shape: op, outputs and
 * the inputs' dtypes, layouts and dims. */
uint64_t cgc__shape_key(const cgc_request *r);

void cgc__verifier_init(cgc__verifier *v, const cgc_options *o);
void cgc__verifier_destroy(cgc__verifier *v);
/* 1 when the outputs of req are to be checked, with *seed the probes';
 * else 0. Thread-safe. */
int cgc__verify_pick(cgc__verifier *v, const cgc_request *req,
                     cgc__check_mode mode, uint64_t *seed);
/* Checks output g of req (resolved as l), received as t from peer and the
 * server's worker (each may be NULL). Returns 0 when it passed (or could
 * not run for want of memory: the output stands, as on the server), or
 * CGC_ERPC with st DATA_LOSS naming the output, op, geometry and replica,
 * after counting the failure and telling its line. Thread-safe. */
int cgc__verify_output(cgc__verifier *v, const cg_layer *l, cg_grad g,
                       const cgc_request *req, const cgc_tensor *t,
                       uint64_t seed, const char *peer, const char *worker,
                       cgc_status *st);
/* 1 when rc and st are a failed check's (cgc__verify_output). */
int cgc__verify_failure(int rc, const cgc_status *st);
/* A call on which a check failed ended with rc: recovered or lost. */
void cgc__verify_settled(cgc__verifier *v, int rc);

/* region.c: shared-memory regions. */

/* The region registered on ch that holds the n bytes at p, or NULL;
 * *offset gets p's offset in it. */
const cgc_region *cgc__region_find(cgc_channel *ch, const void *p, size_t n,
                                   uint64_t *offset);
/* The name r is registered under. */
const char *cgc__region_name(const cgc_region *r);
/* RegisterRegion for r, on cq with tag as cgc__unary_start does (the
 * server restarted, or dropped it unused); r stays in its channel's
 * list. Returns like cgc__unary_start. */
int cgc__region_register_start(cgc__unary_call *u, cgc_channel *ch,
                               const cgc_region *r, grpc_completion_queue *cq,
                               cgc__tag *tag, const cgc__try *t,
                               cgc_status *st);
/* Unregisters every region still registered on ch (cgc_channel_free). */
void cgc__regions_close(cgc_channel *ch);

#endif
