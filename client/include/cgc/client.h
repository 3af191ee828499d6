/* cgc/client.h - libcgclient: the C client of the convgrad service.
 *
 * A cgc_channel is a connection (gRPC C core, insecure transport) to one
 * server or to several replicas balanced by gRPC's own round_robin policy.
 * Each op call uploads the input tensors in chunks straight from the
 * caller's memory, and reassembles the streamed result into one owned
 * allocation (cgc_tensor). Failed calls are retried on UNAVAILABLE, and
 * on the server's "retry later" refusals, with exponential backoff inside
 * the call's deadline: the ops are pure functions of their inputs, so
 * repeating one is always safe.
 *
 * Conventions (every function below):
 * - Returns 0 on success or a negative code: a CG_E* code from cg/error.h
 *   for a problem detected locally (bad argument, out of memory), or one of
 *   the CGC_E* codes below. cgc_strerror() names any of them.
 * - A cgc_status *st (may be NULL) receives the gRPC status code and the
 *   server's message when a call fails; for local failures code is
 *   GRPC_STATUS_INVALID_ARGUMENT / RESOURCE_EXHAUSTED / INTERNAL and the
 *   message says what was wrong. On success st->code is GRPC_STATUS_OK and
 *   st->message is empty.
 * - Pointers passed in are borrowed for the duration of the call only.
 *
 * Thread-safety: a cgc_channel may be shared by any number of threads and
 * used for concurrent calls (grpc_channel is thread-safe and every call
 * uses its own completion queue). Everything else (cgc_tensor,
 * cgc_server_info, option structs) is plain data owned by one thread. */
#ifndef CGC_CLIENT_H
#define CGC_CLIENT_H

#include <grpc/status.h>
#include <stddef.h>
#include <stdint.h>

#include "cg/error.h"
#include "cg/problem.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CGC_EXPORT __attribute__((visibility("default")))

/* Client-side codes; they do not overlap the CG_E* table. */
#define CGC_ERRNO_MAP(X)                                                       \
  X(RPC, -20, "the server answered with an error status")                      \
  X(PROTO, -21, "malformed response from the server")                          \
  X(TIMEDOUT, -22, "the wait timed out; the call goes on")

typedef enum {
#define CGC__ERR_ENUM(name, value, msg) CGC_E##name = (value),
  CGC_ERRNO_MAP(CGC__ERR_ENUM)
#undef CGC__ERR_ENUM
} cgc_errno;

/* The library's version, "MAJOR.MINOR.PATCH": the release it belongs to.
 * While MAJOR is 0 the soname carries MAJOR.MINOR (libcgclient.so.0.2),
 * and every minor release may change the ABI (CHANGELOG.md). Static
 * string; thread-safe. */
CGC_EXPORT const char *cgc_version(void);

/* Static string for any CG_E* or CGC_E* code; never NULL. */
CGC_EXPORT const char *cgc_strerror(int err);
/* "OK", "INVALID_ARGUMENT", ... for a gRPC status code; never NULL. */
CGC_EXPORT const char *cgc_status_code_name(grpc_status_code code);

#define CGC_MESSAGE_MAX 512
typedef struct cgc_status {
  grpc_status_code code;
  char message[CGC_MESSAGE_MAX]; /* the server's message, NUL-terminated */
} cgc_status;

/* ------------------------------------------------------------------ */
/* Channel */

typedef struct cgc_options {
  /* Default deadline of one call, retries and backoff included. */
  int64_t deadline_ms; /* default 60000 */
  /* Largest single gRPC message sent or received (both directions). Chunks
   * keep messages small, so this only bounds what a server may send. */
  int64_t max_message_bytes; /* default 16 MiB */
  /* Bytes of tensor data per uploaded message. A request whose tensors
   * fit in one such message travels whole with the header.
   * Keep it below the server's receive cap (gRPC's default: 4 MiB) minus
   * a few KiB of framing. */
  size_t upload_chunk_bytes; /* default 1 MiB; 0 = default */
  /* Largest response chunk asked of the server; 0 = server default,
   * else at least 1024. With 0, a call whose one output the request says
   * is at most 64 KiB asks for 64 KiB, so that the output comes whole in
   * one message whatever the server's default (see cgc_compute). */
  uint32_t download_chunk_bytes;
  /* Largest result this client accepts (checked before allocating). */
  uint64_t max_output_bytes; /* default 4 GiB */
  /* Retries of a call that failed with UNAVAILABLE, or was refused with
   * "retry later" (RESOURCE_EXHAUSTED or UNAVAILABLE carrying the trailing
   * metadata retry-after-ms: a full queue, a busy in-flight budget); a
   * RESOURCE_EXHAUSTED without it is a limit and is not retried. The
   * exponential step starts at backoff_initial_ms and is multiplied by
   * backoff_multiplier up to backoff_max_ms. A "retry later" waits the
   * server's retry-after-ms plus a uniformly random part of the step
   * (full jitter: refused callers come back spread out), and is not
   * retried when the hint alone passes the call's deadline. An
   * UNAVAILABLE without a hint waits the step +-20%, ending early when the
   * channel, down after the failure, is READY again (a restarted server
   * is retried at once). No wait passes the deadline; a retry of a "retry
   * later" refusal that the deadline overtakes (in flight or queued in the
   * server) ends the call with that refusal, its message noting the cut,
   * rather than DEADLINE_EXCEEDED. Each retried attempt
   * carries the request metadata "convgrad-retry-attempt: N" (N = 1 for
   * the first retry). 0 = no retry. */
  int retries;                /* default 5 */
  int64_t backoff_initial_ms; /* default 50 */
  int64_t backoff_max_ms;     /* default 2000; also caps gRPC reconnects */
  double backoff_multiplier;  /* default 2.0 */
  /* TLS: paths of PEM files, each NULL (or "") for none; all NULL is
   * plaintext. tls_ca_file: the roots the server's certificate must chain
   * to (NULL with a client certificate: the system's roots). tls_cert_file
   * and tls_key_file (together): this client's certificate, for a server
   * that requires one (mutual TLS). The files are read and checked by
   * cgc_channel_new: a missing file, a key that does not match, or a
   * certificate past its dates is refused there. */
  const char *tls_ca_file;
  const char *tls_cert_file;
  const char *tls_key_file;
  /* The name the server's certificate must carry, instead of the
   * target's host (an IP address, or a name the certificate lacks);
   * needs TLS. */
  const char *tls_server_name;
  /* Bearer token sent with every call ("authorization: Bearer TOKEN"),
   * for a server started with --auth-tokens. NULL: $CONVGRAD_TOKEN if set,
   * else none; "": none. Printable ASCII without spaces. Sent in clear
   * without TLS: keep it to loopback and unix sockets then. */
  const char *token;
  /* One call over several replicas (client/README.md, "Replicas"). 0:
   * one gRPC channel balanced by round_robin; each call is served whole
   * by one replica. N >= 1: the channel keeps a connection of its own to
   * each replica: each address of a list target ("a:p,b:p", "ipv4:...",
   * which must then hold N addresses), or N to any other target, over
   * which a call's parts pipeline. A call whose minibatch and work are
   * large enough is split along the minibatch into parts sent as calls of
   * their own: diff_src is concatenated, diff_weights and diff_bias are
   * summed in part order (bf16 and f16 in f32, rounded once), so the
   * result is the same bits whichever replica answered each part. Parts
   * go to the replicas in proportion to their measured speed and load, a
   * part whose replica fails goes to another within the deadline, and a
   * part much slower than usual gets a backup on another replica (see
   * hedge_budget). Smaller calls go whole to the least loaded replica.
   * Blocking and asynchronous calls (cgc_call_start) alike. */
  int replicas;
  /* Parts of one call at most; 0: as many as the replicas' measured
   * speeds and link say (at most 8, or 2 x replicas if more), chosen the
   * first time the channel sees a shape and kept (client/README.md,
   * "Replicas"): set it for results that are the same bits from one
   * process to the next. */
  int split_parts;
  /* Least work of a part, in flops (2 x multiply-adds); 0: 200 MFLOP. A
   * call under 2 parts' worth is never split. */
  uint64_t split_min_flops;
  /* Backup parts sent at most, as a fraction of the parts sent (default
   * 0.05; at most 40 parts' worth saved up); 0: none. A part gets one when
   * it has not answered after the 95th percentile of the latencies of its
   * shape and 3 x their median (once 8 are known); a replica left out for
   * being slow gets a copy of a part now and then (a probe), from the same
   * budget. */
  double hedge_budget;
  /* The client's own checks of what it receives (proto/SEMANTICS.md
   * "Result checks"): the fraction of calls (0 to 1) whose every output
   * is checked against the call's inputs by the adjoint identity, with the
   * server's code (kernels/src/check.c) on the thread receiving it, before
   * the output counts as whole; when above 0, the first call of each
   * shape the channel sees too. An output that fails its check is asked
   * for again at once: on another replica (replicas; round_robin's next
   * address for a list target), or once more on the one server, and
   * checked again. If that fails too the call ends with CGC_ERPC and
   * DATA_LOSS, the message naming the output, op, geometry and the
   * replica. Each failed check is counted (cgc_verify_stats_get) and told
   * (verify_notify). Default: $CONVGRAD_VERIFY_RATE if set, else 0. */
  double verify_rate;
  /* Told one line for each failed check (on the thread that checked);
   * NULL: the line goes to stderr. */
  void (*verify_notify)(void *arg, const char *line);
  void *verify_notify_arg;
} cgc_options;

/* Fills o with the defaults above. Thread-safe. */
CGC_EXPORT void cgc_options_init(cgc_options *o);

typedef struct cgc_channel cgc_channel;

/* Creates a channel to target. Accepted targets:
 *   "HOST:PORT"                  one server (gRPC's default resolver);
 *   "dns:///NAME:PORT"           every address NAME resolves to;
 *   "ipv4:A:P,B:P" / "ipv6:..."  an explicit address list;
 *   "HOST:PORT,HOST:PORT,..."    turned into an ipv4:/ipv6: list (host
 *                                names resolved once, here);
 *   "unix:PATH".
 * Each is checked here without resolving anything (HOST:PORT syntax with
 * a port in 1..65535, ipv4:/ipv6: addresses, a name after dns:/unix:).
 * Calls are balanced across addresses by gRPC's round_robin policy. opts
 * may be NULL (defaults). Connecting is lazy: an unreachable server shows up
 * as UNAVAILABLE on the first call, not here. On success *out is owned by
 * the caller (cgc_channel_free). Returns 0, CG_EINVAL (bad target or
 * option, message in err) or CG_ENOMEM. Thread-safe. */
CGC_EXPORT int cgc_channel_new(cgc_channel **out, const char *target,
                               const cgc_options *opts, char *err,
                               size_t errlen);
/* Closes the channel; calls still running on it must have returned, and
 * asynchronous ones been finished. Regions still registered through it are
 * unregistered first. NULL is accepted. */
CGC_EXPORT void cgc_channel_free(cgc_channel *ch);
/* The gRPC target string the channel was created with (after rewriting a
 * HOST:PORT list). Owned by ch. */
CGC_EXPORT const char *cgc_channel_target(const cgc_channel *ch);

/* ------------------------------------------------------------------ */
/* Tensors */

/* Mirrors the wire Layout enum (convgrad.proto). */
typedef enum {
  CGC_LAYOUT_DEFAULT = 0, /* take it from the attributes */
  CGC_LAYOUT_NCX = 1,
  CGC_LAYOUT_NXC = 2,
  CGC_LAYOUT_OIX = 3,
  CGC_LAYOUT_XIO = 4,
  CGC_LAYOUT_IOX = 5,
  CGC_LAYOUT_XOI = 6
} cgc_layout;

/* Canonical names ("NCX", ...; "default" for 0, "?" out of range). */
CGC_EXPORT const char *cgc_layout_name(cgc_layout l);

/* Bytes of a staged tensor's id: the SHA-256 of its bytes, or a private
 * id (cgc_stage_private): CGC_PRIVATE_ID_TAG, then random bytes. */
#define CGC_STAGED_ID_BYTES 32
#define CGC_PRIVATE_ID_TAG "cgc:priv"
#define CGC_PRIVATE_ID_TAG_BYTES 8

/* A borrowed input tensor: dense little-endian elements of dtype in the
 * named layout, nbytes = product(dims) * cg_dtype_size(dtype). The data is
 * read directly while the call runs (not copied as a whole) and must stay
 * valid and unchanged until the call returns. */
typedef struct cgc_tensor_view {
  cg_dtype dtype;
  int rank; /* 1 .. CG_MAX_RANK */
  int64_t dims[CG_MAX_RANK];
  cgc_layout layout; /* DEFAULT: from the attributes */
  const void *data;
  size_t nbytes;
  /* NULL, or the id cgc_stage gave for these bytes (CGC_STAGED_ID_BYTES,
   * borrowed like data, which must still hold them): the call names the
   * server's staged copy instead of sending them. Should the server have
   * lost it (evicted, expired, restarted: NOT_FOUND with the ids), the
   * call is retried at once with the bytes of every staged view sent, so
   * that it never waits on the store twice. A view in a registered region
   * goes as a region reference, never staged. */
  const unsigned char *staged;
} cgc_tensor_view;

/* A result tensor owned by the caller; free it with cgc_tensor_free. The
 * data is 64-byte aligned. */
typedef struct cgc_tensor {
  cg_dtype dtype;
  int rank;
  int64_t dims[CG_MAX_RANK];
  cgc_layout layout;
  void *data;
  size_t nbytes;
} cgc_tensor;

/* Frees t and its data; NULL is accepted. */
CGC_EXPORT void cgc_tensor_free(cgc_tensor *t);

/* ------------------------------------------------------------------ */
/* Compute */

/* Everything the server told about one call besides the tensor. */
typedef struct cgc_result {
  double queue_ms;       /* server: waiting for a worker */
  double compute_ms;     /* server: oneDNN execution, reorders included */
  double total_ms;       /* client: wall time of the successful attempt */
  char compute_path[16]; /* "native" or "f32_convert" */
  char worker[64];       /* the server worker that ran it */
  int npads;             /* entries in pads_begin / pads_end */
  int64_t pads_begin[CG_MAX_SPATIAL], pads_end[CG_MAX_SPATIAL];
  int attempts;        /* 1 + retries that were needed */
  uint64_t bytes_sent; /* tensor bytes uploaded (last attempt) */
  uint64_t bytes_received;
  /* Client-side phases of the successful attempt, for bandwidth figures:
   * upload_ms from the start until the last request chunk was accepted by
   * gRPC (0 when the request fit one message), download_ms from the
   * first ResultHeader to the last output byte. */
  double upload_ms, download_ms;
  /* Server compute of each output (compute_ms is their sum), by cg_grad;
   * 0 where the call did not ask for it. */
  double output_compute_ms[CG_GRAD_COUNT];
} cgc_result;

/* One request. The attributes are the kernels' cg_attrs (same meaning as
 * the wire Attributes; lists borrowed). */
typedef struct cgc_request {
  cg_op op;
  cg_attrs attrs;
  /* The op's inputs in op order (see cg/problem.h): two for the single
   * ops, src, diff_dst and weights for the layer ops (CG_OP_CONV_BWD,
   * CG_OP_DECONV_BWD). */
  cgc_tensor_view inputs[3];
  /* Single ops only: dst_shape / weights_shape as a tensor (sent as s64).
   * It wins over the attribute on the server. */
  int has_shape_input;
  cg_ints shape_input;
  /* DEFAULT: the matching input's layout. Layer ops: diff_src's. */
  cgc_layout output_layout;
  /* Layer ops only: diff_weights' layout (DEFAULT: the weights'), and the
   * outputs wanted, CG_GRAD_BIT()s (0: all three). */
  cgc_layout weights_output_layout;
  unsigned grads;
  int64_t deadline_ms; /* 0: the channel's default */
} cgc_request;

/* Zeroes r and initialises its attributes (cg_attrs_init). */
CGC_EXPORT void cgc_request_init(cgc_request *r);

/* Runs one op on the server. On success *out is a new tensor owned by the
 * caller and res (may be NULL) is filled. On failure *out is NULL and the
 * return value is CGC_ERPC (st has the server's status), CGC_EPROTO (the
 * server broke the wire contract), CG_EINVAL (the request is malformed
 * locally, e.g. nbytes disagrees with dims), CG_ERANGE or CG_ENOMEM.
 * Thread-safe (concurrent calls on one channel are fine). Blocks until the
 * call ends or its deadline passes.
 * A call whose request fits one message (upload_chunk_bytes) and whose
 * answer is one message by the wire contract (one output, in a registered
 * region or of at most 64 KiB by the shape the request gives it: a
 * dst_shape, weights_shape or shape tensor, or a layer op's inputs) runs
 * as one gRPC batch, as a unary call does. Such a call cannot read on
 * past the first message: a server that broke the contract by sending
 * more would hold it until its deadline (DEADLINE_EXCEEDED); others read
 * every message and name what was wrong (CGC_EPROTO). */
CGC_EXPORT int cgc_compute(cgc_channel *ch, const cgc_request *req,
                           cgc_tensor **out, cgc_result *res, cgc_status *st);

/* Like cgc_compute, but the result lands in the caller's memory: data
 * (cap bytes, any alignment) receives it, and *out describes it with
 * out->data = data (nothing to free). For callers that reuse their
 * gradient buffers: no allocation per call, and no page faults on fresh
 * memory, which cost about as much as the copy for large results. A
 * result larger than cap fails with CG_ELIMIT (RESOURCE_EXHAUSTED, the
 * message gives both sizes). data may be written even when the call
 * fails. */
CGC_EXPORT int cgc_compute_into(cgc_channel *ch, const cgc_request *req,
                                void *data, size_t cap, cgc_tensor *out,
                                cgc_result *res, cgc_status *st);

/* A layer op (or any op): every output asked for, out[g] by cg_grad (a
 * new tensor owned by the caller; NULL where not asked). The server sends
 * the outputs one after another, each as a single op's result. A
 * cgc_compute call on a layer op must ask for exactly one output. Returns
 * and thread-safety as cgc_compute; on failure every out[g] is NULL. */
CGC_EXPORT int cgc_compute_layer(cgc_channel *ch, const cgc_request *req,
                                 cgc_tensor *out[CG_GRAD_COUNT],
                                 cgc_result *res, cgc_status *st);
/* cgc_compute_into for several outputs: output g lands in data[g] (cap[g]
 * bytes), which must be set for every output asked for; out[g] describes
 * it (zeroed where not asked). */
CGC_EXPORT int cgc_compute_layer_into(cgc_channel *ch, const cgc_request *req,
                                      void *const data[CG_GRAD_COUNT],
                                      const size_t cap[CG_GRAD_COUNT],
                                      cgc_tensor out[CG_GRAD_COUNT],
                                      cgc_result *res, cgc_status *st);

/* A layer's backward in one call: src, diff_dst and weights sent once,
 * the outputs in grads (CG_GRAD_BIT()s, 0: all) returned in out as by
 * cgc_compute_layer.
 *   ConvolutionBackward:   diff_src, diff_weights, diff_bias
 *   ConvTransposeBackward: diff_src, diff_weights, diff_bias */
CGC_EXPORT int cgc_conv_bwd(cgc_channel *ch, const cg_attrs *attrs,
                            const cgc_tensor_view *src,
                            const cgc_tensor_view *diff_dst,
                            const cgc_tensor_view *weights, unsigned grads,
                            cgc_tensor *out[CG_GRAD_COUNT], cgc_result *res,
                            cgc_status *st);
CGC_EXPORT int cgc_deconv_bwd(cgc_channel *ch, const cg_attrs *attrs,
                              const cgc_tensor_view *src,
                              const cgc_tensor_view *diff_dst,
                              const cgc_tensor_view *weights, unsigned grads,
                              cgc_tensor *out[CG_GRAD_COUNT], cgc_result *res,
                              cgc_status *st);

/* The four ops; shorthands for cgc_compute with the channel's default
 * deadline. Same return values, ownership and thread-safety.
 *   ConvolutionBackwardData:      diff_dst, weights     -> diff_src
 *   ConvolutionBackwardWeights:   src, diff_dst         -> diff_weights
 *   ConvTransposeBackwardData:    diff_dst, weights     -> diff_src
 *   ConvTransposeBackwardWeights: src, diff_dst         -> diff_weights */
CGC_EXPORT int cgc_conv_bwd_data(cgc_channel *ch, const cg_attrs *attrs,
                                 const cgc_tensor_view *diff_dst,
                                 const cgc_tensor_view *weights,
                                 cgc_tensor **diff_src, cgc_result *res,
                                 cgc_status *st);
CGC_EXPORT int cgc_conv_bwd_weights(cgc_channel *ch, const cg_attrs *attrs,
                                    const cgc_tensor_view *src,
                                    const cgc_tensor_view *diff_dst,
                                    cgc_tensor **diff_weights, cgc_result *res,
                                    cgc_status *st);
CGC_EXPORT int cgc_deconv_bwd_data(cgc_channel *ch, const cg_attrs *attrs,
                                   const cgc_tensor_view *diff_dst,
                                   const cgc_tensor_view *weights,
                                   cgc_tensor **diff_src, cgc_result *res,
                                   cgc_status *st);
CGC_EXPORT int cgc_deconv_bwd_weights(cgc_channel *ch, const cg_attrs *attrs,
                                      const cgc_tensor_view *src,
                                      const cgc_tensor_view *diff_dst,
                                      cgc_tensor **diff_weights,
                                      cgc_result *res, cgc_status *st);

/* ------------------------------------------------------------------ */
/* Asynchronous calls: start a call, go on, collect it later */

/* A call started by cgc_call_start, until cgc_call_finish. */
typedef struct cgc_call cgc_call;

/* Starts req on ch and returns at once: the channel's engine (one thread
 * driving one completion queue, started with the channel's first
 * asynchronous call) runs the call, retries included, beside any number of
 * others, while the caller goes on, so one thread may keep many calls in
 * flight. The outputs land in the
 * caller's memory as with cgc_compute_layer_into: data[g] (cap[g] bytes)
 * for each output asked for (the single ops' one output, the layer ops'
 * grads); in a registered region, the server writes them in place. The
 * deadline (req->deadline_ms, else the channel's) counts from now. req,
 * everything it points to (attribute lists, input data) and data[] are
 * borrowed until cgc_call_finish returns. On success *out must be ended
 * with cgc_call_finish. Returns 0, or CG_EINVAL / CG_ENOMEM / CG_ERANGE
 * (and, on a channel with replicas, CG_ELIMIT for a buffer smaller than
 * its output) with st filled and nothing started. Thread-safe. */
CGC_EXPORT int cgc_call_start(cgc_channel *ch, const cgc_request *req,
                              void *const data[CG_GRAD_COUNT],
                              const size_t cap[CG_GRAD_COUNT], cgc_call **out,
                              cgc_status *st);
/* Told that call c has ended (cgc_call_finish will not wait), with the arg
 * given to cgc_call_start_notify. It runs on the engine's thread, holding
 * c's lock: it must return quickly, and must not call cgc_call_* on c
 * (hand c to another thread, which finishes it). */
typedef void (*cgc_call_end_fn)(cgc_call *c, void *arg);
/* cgc_call_start, and notify (may be NULL) is told once when the call
 * ends: a caller with many calls in flight learns which one to finish
 * without a thread waiting on each. */
CGC_EXPORT int cgc_call_start_notify(cgc_channel *ch, const cgc_request *req,
                                     void *const data[CG_GRAD_COUNT],
                                     const size_t cap[CG_GRAD_COUNT],
                                     cgc_call_end_fn notify, void *arg,
                                     cgc_call **out, cgc_status *st);
/* Waits, up to timeout_ms (negative: without bound), until every output
 * in grads (CG_GRAD_BIT()s; 0: every output the call asks for) is whole.
 * An output is whole once its last byte is in; its data is final from
 * then on, even if the call fails later on another output: a retry asks
 * only for the outputs still missing. Returns 0 when they are whole,
 * CGC_ETIMEDOUT when the time passed first (the call goes on), or the
 * call's failure (as cgc_call_finish would return it, st filled) when it
 * ended without them. Thread-safe; any number of threads may wait. */
CGC_EXPORT int cgc_call_wait(cgc_call *c, unsigned grads, int64_t timeout_ms,
                             cgc_status *st);
/* 1 when the call has ended (cgc_call_finish returns at once), else 0. */
CGC_EXPORT int cgc_call_done(cgc_call *c);
/* Waits for the call to end, fills out, res and st, and frees c. Returns
 * as cgc_compute_layer_into: 0 with out[g] describing output g in data[g]
 * (zeroed where not asked), or a negative code (every out[g] zeroed). A
 * call must be finished exactly once, and before its channel is freed. */
CGC_EXPORT int cgc_call_finish(cgc_call *c, cgc_tensor out[CG_GRAD_COUNT],
                               cgc_result *res, cgc_status *st);

/* ------------------------------------------------------------------ */
/* Staged tensors: inputs uploaded ahead of the calls that need them */

/* What one cgc_stage call did. */
typedef struct cgc_stage_result {
  int present;         /* the server held the bytes already: none were sent */
  uint64_t bytes_sent; /* tensor bytes uploaded */
  uint64_t ttl_ms;     /* the entry lives this long after its last use */
  double total_ms;     /* wall time, retries included */
  int attempts;        /* 1 + retries */
} cgc_stage_result;

/* Stages the nbytes (> 0) at data on the server behind ch (Stage, see
 * proto/SEMANTICS.md "Staged tensors"): hashes them (SHA-256) into id,
 * asks whether the server holds that content already, and uploads it only
 * when not. Views whose staged points at id then send no bytes. With
 * several servers behind ch each call goes to one of them: staging suits
 * one server, or ranks sharing one: once half of the first 8 calls naming
 * ids the channel had just staged found them missing, staging is off for
 * the channel (its calls send staged views' bytes, and cgc_stage fails
 * FAILED_PRECONDITION at once, saying why; proto/SEMANTICS.md, "A pool
 * behind one target"). deadline_ms 0: the channel's default.
 * Retries like cgc_compute. Returns 0 with id and res (may be NULL)
 * filled, CGC_ERPC (st: FAILED_PRECONDITION from a server without a
 * store or once staging is off, RESOURCE_EXHAUSTED over its limits),
 * CG_EINVAL or CG_ENOMEM.
 * Thread-safe; blocks until done. */
CGC_EXPORT int cgc_stage(cgc_channel *ch, const void *data, size_t nbytes,
                         int64_t deadline_ms,
                         unsigned char id[CGC_STAGED_ID_BYTES],
                         cgc_stage_result *res, cgc_status *st);

/* cgc_stage for bytes no other caller has (a layer's src): hashes
 * nothing, and names them by a private id, drawn at random into id
 * (CGC_PRIVATE_ID_TAG, then 24 random bytes), which only calls from
 * this client's peer (its token's label, else its address) can name on
 * the server (StageHeader.private_id; proto/SEMANTICS.md, "Private
 * ids"). The same bytes staged twice are two entries: no present. A
 * server that predates private ids refuses them INVALID_ARGUMENT (its
 * hash of the bytes is not the id): stage with cgc_stage there. */
CGC_EXPORT int cgc_stage_private(cgc_channel *ch, const void *data,
                                 size_t nbytes, int64_t deadline_ms,
                                 unsigned char id[CGC_STAGED_ID_BYTES],
                                 cgc_stage_result *res, cgc_status *st);

/* ------------------------------------------------------------------ */
/* A share for the caller's own cores */

/* How many of the first rows of req's minibatch (a layer op) a caller
 * should compute itself, taking local_ms (its own time for req whole,
 * measured) in proportion, while ch's server computes the rest, so that
 * the call ends soonest: the server's speed and the link's are those measured
 * by a call of req's shape whole on ch (its compute_ms over the flops, its
 * bytes over the rest of its time; a call that moved no bytes, over
 * regions, makes them free); the server's rows are costed as ch
 * would run them (pipelined over a channel of one replica, else whole,
 * their staged inputs not sent). *rows is 0 when a share would not end
 * the call 5 % sooner (a fast server, a slow caller, nothing measured)
 * or either side's work would be under split_min_flops; at most the
 * minibatch less one. The caller sums its diff_weights and diff_bias
 * first, then the server's (client/README.md, "A share for the caller").
 * Returns 0, or CG_EINVAL (st filled) for a request that does not
 * resolve, is not a layer op, or has a minibatch under 2. Thread-safe. */
CGC_EXPORT int cgc_local_rows(cgc_channel *ch, const cgc_request *req,
                              const cgc_result *measured, double local_ms,
                              int64_t *rows, cgc_status *st);

/* ------------------------------------------------------------------ */
/* Shared-memory regions: tensors passed by reference on one host */

/* A POSIX shared-memory object this process created and mapped. Once it
 * is registered on a channel, the cgc_compute* calls on that channel send
 * every input view whose bytes lie inside it as a reference instead of
 * bytes, and have every output whose caller buffer (the _into calls) lies
 * inside it written there by the server: no copy, no transfer. Regions
 * need the server on the same host, or in the same IPC namespace (a
 * sidecar container with a shared IPC namespace); a remote server answers
 * NOT_FOUND at registration. The caller keeps a region alive, and its
 * bytes unchanged, while calls use it, and must not shrink it: the server
 * fails calls on a truncated region (FAILED_PRECONDITION). */
typedef struct cgc_region cgc_region;

/* Creates and maps an object of bytes (> 0) read-write, mode 0600, under
 * key ("/NAME", NAME of [A-Za-z0-9._-]; NULL: a fresh
 * "/PREFIXPID-N-RANDOM", PREFIX $CONVGRAD_SHM_PREFIX, the variable of the
 * server's --shm-prefix, else "convgrad-"). An existing key is refused
 * (CG_EINVAL). With $CONVGRAD_SHM_GROUP set (a group name or number) the
 * object belongs to that group with mode 0660, for a server running as
 * another user in that group (the Debian package's convgrad); the caller
 * must be a member (CG_EINVAL otherwise, and for an unknown group).
 * Returns 0 with *out owned by the caller (cgc_region_free), or a negative
 * code with err filled. */
CGC_EXPORT int cgc_region_create(cgc_region **out, const char *key,
                                 size_t bytes, char *err, size_t errlen);
/* The mapping (page-aligned), its size and the object's key. */
CGC_EXPORT void *cgc_region_data(const cgc_region *r);
CGC_EXPORT size_t cgc_region_size(const cgc_region *r);
CGC_EXPORT const char *cgc_region_key(const cgc_region *r);
/* A view of the tensor at offset in r: dtype, dims (rank of them) and
 * layout; nbytes follows. Returns 0, or CG_EINVAL / CG_ERANGE with st
 * filled when it does not fit r or offset is not a multiple of the element
 * size. */
CGC_EXPORT int cgc_region_view(cgc_region *r, size_t offset, cg_dtype dtype,
                               int rank, const int64_t *dims, cgc_layout layout,
                               cgc_tensor_view *v, cgc_status *st);
/* Registers r with the server behind ch (RegisterRegion; the name is the
 * key without its '/'). A region is registered on one channel at a time.
 * When a call finds its regions unknown to the server (it restarted, or
 * dropped them after its --region-idle-timeout unused), the library
 * registers them again and retries the call once. Returns like
 * cgc_health. Thread-safe. */
CGC_EXPORT int cgc_region_register(cgc_channel *ch, cgc_region *r,
                                   cgc_status *st);
/* UnregisterRegion; calls on the channel send r's bytes again. Calls
 * already running on the server finish with the region. */
CGC_EXPORT int cgc_region_unregister(cgc_region *r, cgc_status *st);
/* Removes r's object name (shm_unlink) and keeps the mapping: the memory
 * stays valid until cgc_region_free, but no process can open the object
 * any more, and it leaves nothing behind in /dev/shm should this process
 * die. A registered region is unregistered first (the server opens
 * regions by name, so a restarted server could not take it back). For
 * callers whose arrays over a region may outlive its use. Returns 0, or
 * the unregistration's failure (the name is removed all the same). */
CGC_EXPORT int cgc_region_unlink(cgc_region *r, cgc_status *st);
/* Unregisters r (when registered and its channel is alive), unmaps it and
 * removes the object. NULL is accepted. */
CGC_EXPORT void cgc_region_free(cgc_region *r);

/* ------------------------------------------------------------------ */
/* Health and server info */

/* Mirrors grpc.health.v1.HealthCheckResponse.ServingStatus. */
typedef enum {
  CGC_HEALTH_UNKNOWN = 0,
  CGC_HEALTH_SERVING = 1,
  CGC_HEALTH_NOT_SERVING = 2,
  CGC_HEALTH_SERVICE_UNKNOWN = 3
} cgc_health_status;

CGC_EXPORT const char *cgc_health_status_name(cgc_health_status s);

/* grpc.health.v1.Health/Check for service ("" or NULL: the whole server).
 * deadline_ms 0 means the channel default. Returns 0 with *out set,
 * CGC_ERPC (st says why: UNAVAILABLE when nobody answers, NOT_FOUND for an
 * unknown service) or CGC_EPROTO. Retries like cgc_compute. Thread-safe. */
CGC_EXPORT int cgc_health(cgc_channel *ch, const char *service,
                          int64_t deadline_ms, cgc_health_status *out,
                          cgc_status *st);

typedef struct cgc_op_info {
  cg_op op;
  const char *const *names; /* accepted names, canonical first */
  size_t n_names;
  const char *const *inputs;
  size_t n_inputs;
  const char *output;         /* the single ops' output; "" for the layer ops */
  const char *const *outputs; /* every output it can answer */
  size_t n_outputs;
} cgc_op_info;

typedef struct cgc_dtype_info {
  int dtype;  /* wire DType: cg_dtype values, 4 = s32, 5 = s64 */
  int native; /* 0: computed in f32 and converted */
} cgc_dtype_info;

/* convgrad.v1.ServerInfo. Every pointer points into storage owned by the
 * struct itself and lives until cgc_server_info_free. */
typedef struct cgc_server_info {
  const char *version;
  const cgc_op_info *ops;
  size_t n_ops;
  const cgc_dtype_info *dtypes;
  size_t n_dtypes;
  const char *onednn_version;
  const char *cpu_isa;
  uint32_t workers, threads_per_worker;
  const int32_t *cpus;
  size_t n_cpus;
  uint64_t max_request_bytes, max_tensor_elements, max_inflight_bytes;
  uint32_t queue_depth, default_chunk_bytes;
  uint64_t idle_timeout_ms, stream_window_bytes;
  uint64_t max_request_flops; /* 0: no limit */
  const int32_t *io_cpus;     /* cores of the server's loop and gRPC threads */
  size_t n_io_cpus;           /* 0: not pinned */
  /* "adaptive" or "static" (ServerInfo.threads_policy); "" from older
   * servers. */
  const char *threads_policy;
  /* Shared-memory regions: "local", "on" or "off" (ServerInfo.shm; "" from
   * older servers), and their limits. */
  const char *shm;
  uint32_t max_regions;
  uint64_t max_region_bytes;
  /* The service limits on spatial attributes (Limits.max_stride ...); 0
   * from older servers. */
  uint64_t max_stride, max_dilation, max_pad, max_output_padding;
  uint64_t max_effective_extent, max_padded_extent;
  /* The store of staged tensors (Limits.store_*, ServerInfo.store); all
   * 0 from a server without one. */
  uint64_t store_bytes, store_ttl_ms, store_peer_bytes;
  uint64_t store_held_bytes, store_entries, store_hits, store_misses;
  uint64_t store_evictions, store_expired;
  void *priv_; /* library-owned storage behind the pointers above */
} cgc_server_info;

/* convgrad.v1.ConvGrad/GetServerInfo. On success *out is owned by the
 * caller (cgc_server_info_free). Returns like cgc_health. Thread-safe. */
CGC_EXPORT int cgc_server_info_get(cgc_channel *ch, int64_t deadline_ms,
                                   cgc_server_info **out, cgc_status *st);
/* Frees info; NULL is accepted. */
CGC_EXPORT void cgc_server_info_free(cgc_server_info *info);

/* ------------------------------------------------------------------ */
/* The client's result checks (cgc_options.verify_rate) */

typedef struct cgc_verify_stats {
  uint64_t calls;   /* calls checked: sampled, or the first of a shape */
  uint64_t outputs; /* outputs checked (retries and parts included) */
  uint64_t failed;  /* outputs that failed their check */
  /* Calls on which a check failed that ended with verified results (from
   * another attempt), and those that did not (DATA_LOSS, or another
   * failure of the attempt after). */
  uint64_t recovered, lost;
} cgc_verify_stats;

/* The counts of ch's checks since it was made. Thread-safe. */
CGC_EXPORT void cgc_verify_stats_get(const cgc_channel *ch,
                                     cgc_verify_stats *out);

#ifdef __cplusplus
}
#endif
#endif
