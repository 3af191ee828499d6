/* ts.h - support for the server's end-to-end tests: start a real
 * convgrad-server on an ephemeral port, talk to it with raw gRPC C-core
 * calls (so that tests can also send what no well-behaved client would),
 * and build problems whose expected results come from cg_reference_run.
 * Not thread-safe unless a function says so. */
#ifndef TS_H
#define TS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <grpc/grpc.h>

#include "cg/problem.h"
#include "convgrad/v1/convgrad.pb-c.h"

/* ---- the server process ---- */

typedef struct ts_server {
  pid_t pid;
  int port;
  char target[64];    /* "127.0.0.1:PORT" */
  char ready[512];    /* the readiness line */
  char log_path[128]; /* the server's stderr */
  int stdout_fd;
} ts_server;

/* Starts CGS_SERVER_PATH --listen 127.0.0.1:0 plus args (NULL-terminated,
 * may be NULL) and waits up to 60 s for the readiness line. Returns 0. */
int ts_server_start(ts_server *s, const char *const *args);
/* The same with the server binary at path (another build's, say). */
int ts_server_start_bin(ts_server *s, const char *path,
                        const char *const *args);
/* Sends sig (0: none) and waits up to timeout_ms for the exit; SIGKILLs
 * after that. Returns the exit status, or -1 when it had to be killed or
 * died from a signal. */
int ts_server_stop(ts_server *s, int sig, int timeout_ms);
/* The fixture most groups share: grpc_init, a server started with args
 * (as ts_server_start) and a channel to it. Returns 0. */
int ts_fixture_start(ts_server *s, grpc_channel **ch, const char *const *args);
/* Undoes ts_fixture_start: closes ch, stops the server with SIGTERM (30 s)
 * and shuts gRPC down. Returns 0 when the server exited cleanly. */
int ts_fixture_stop(ts_server *s, grpc_channel *ch);
/* cmocka group setup and teardown for groups whose tests start their own
 * servers: grpc_init and grpc_shutdown. Return 0. */
int ts_group_grpc_init(void **state);
int ts_group_grpc_shutdown(void **state);
/* Number of lines of the server's log containing needle. */
int ts_server_log_count(const ts_server *s, const char *needle);

/* ---- raw calls ---- */

grpc_channel *ts_channel(const ts_server *s);
/* A channel whose receive window stays at 64 KiB (no BDP probing): a
 * client on it that stops reading stalls the server's sends at once. */
grpc_channel *ts_channel_small_window(const ts_server *s);

typedef struct ts_call {
  grpc_call *call;
  grpc_completion_queue *cq;
  grpc_metadata_array md, trailing;
  grpc_status_code code;
  grpc_slice details;
  int got_md;
  int status_started;
} ts_call;

/* Opens a call to method ("/convgrad.v1.ConvGrad/Compute"); deadline_ms 0
 * means none. Sends the initial metadata. Returns 0 or -1. */
int ts_call_open(ts_call *c, grpc_channel *ch, const char *method,
                 int64_t deadline_ms);
/* Sends one message of raw bytes / a packed protobuf. 0, or -1 when the
 * call is already over. */
int ts_call_send(ts_call *c, const void *bytes, size_t len);
int ts_call_send_msg(ts_call *c, const ProtobufCMessage *m);
int ts_call_close_send(ts_call *c);
/* Receives one message into *bb (NULL at the end of the stream). Returns 0
 * or -1 when the call failed. */
int ts_call_recv(ts_call *c, grpc_byte_buffer **bb);
/* Waits for the final status; msg gets its details. */
grpc_status_code ts_call_finish(ts_call *c, char *msg, size_t len);
void ts_call_cancel(ts_call *c);
void ts_call_free(ts_call *c);

/* ---- Compute, the well-behaved way ---- */

typedef struct ts_opts {
  size_t inline_bytes; /* tensor bytes put in the header's Tensor.data */
  size_t chunk_bytes;  /* bytes per DataChunk message; 0 = 1 MiB */
  int64_t deadline_ms; /* 0 = 60 s */
  uint32_t response_chunk_bytes;
} ts_opts;

typedef struct ts_result {
  grpc_status_code code;
  char msg[512];
  Convgrad__V1__ResultHeader *hdr; /* NULL unless the header arrived */
  unsigned char *data;             /* the output bytes */
  size_t nbytes;
  size_t nchunks, max_chunk;
} ts_result;

/* Sends h (whose inputs' data fields are ignored) with the tensor bytes
 * data[i] of lengths len[i], then collects the answer. Returns 0; the
 * outcome, transport failures included, is r->code. */
int ts_compute(grpc_channel *ch, const Convgrad__V1__ComputeHeader *h,
               const void *const *data, const size_t *len, const ts_opts *o,
               ts_result *r);
void ts_result_free(ts_result *r);

/* Health Check of service; returns the ServingStatus or -code on error. */
int ts_health(grpc_channel *ch, const char *service);

/* ---- problems with reference results ---- */

typedef struct ts_problem {
  cg_problem p; /* lists point into the arrays below */
  int64_t dims[2][CG_MAX_RANK];
  int64_t strides[CG_MAX_SPATIAL], pads_begin[CG_MAX_SPATIAL],
      pads_end[CG_MAX_SPATIAL], dilations[CG_MAX_SPATIAL];
  int64_t shape_attr[CG_MAX_RANK]; /* dst_shape / weights_shape */
  cg_geom g;
  void *in[2]; /* random inputs, geom sizes */
  void *ref;   /* reference output (NULL until ts_problem_reference) */
  /* wire form */
  Convgrad__V1__Attributes attrs;
  Convgrad__V1__Tensor tensors[2];
  Convgrad__V1__Tensor *tensor_ptrs[2];
  Convgrad__V1__ComputeHeader header;
} ts_problem;

/* Fills tp from a benchdnn-like description of the FORWARD op shape:
 * op, dtype, data format (NCX/NXC), weights format (0 = default), groups,
 * nsp spatial dims, mb, ic, oc, in spatial (is), kernel (ks), stride,
 * pad (symmetric), dilation (1 = none), and random inputs (seed). Returns 0,
 * or a CG_E* code when the description is not a valid problem. */
typedef struct ts_desc {
  cg_op op;
  cg_dtype dtype;
  cg_data_format dfmt;
  cg_weights_format wfmt;
  int64_t groups, mb, ic, oc;
  int nsp;
  int64_t is[CG_MAX_SPATIAL], ks[CG_MAX_SPATIAL];
  int64_t stride, pad, dil;
  uint64_t seed;
} ts_desc;
int ts_problem_init(ts_problem *tp, const ts_desc *d);
/* The tiny row: ConvolutionBackwardData f32, the default data format
 * (NXC), mb 1, 4 -> 4 channels, 8x8, 3x3 kernel, pad 1, inputs from seed. */
ts_desc ts_tiny_desc(uint64_t seed);
/* Computes tp->ref with cg_reference_run. Returns 0 or a CG_E* code. */
int ts_problem_reference(ts_problem *tp);
/* Compares out (geom out_bytes) with tp->ref within the dtype's tolerance;
 * returns the number of mismatches and prints the first few. */
size_t ts_problem_check(const ts_problem *tp, const void *out);
/* Sends tp to the server and checks the header and data against ref.
 * Returns 0 when everything matched, else prints why and returns -1. */
int ts_problem_run(grpc_channel *ch, ts_problem *tp, const ts_opts *o);
void ts_problem_free(ts_problem *tp);
/* A compute-heavy problem with small tensors (no reference), grown until
 * one run on the server behind ch computes for at least min_ms; *took gets
 * that time (the server's compute_ms). On a fast core it passes the default
 * --max-request-flops: start that server with --max-request-flops 0. Returns 0
 * or -1. */
int ts_problem_slow(grpc_channel *ch, ts_problem *tp, double min_ms,
                    double *took);
/* The same with a backward-data problem of big minibatch, grown to at
 * least four minibatch slices' work on two threads whatever the core's
 * speed, so that the server runs it in slices; needs --max-request-flops
 * 0. */
int ts_problem_slow_bwd_data(grpc_channel *ch, ts_problem *tp, double min_ms,
                             double *took);

/* ---- calls in background threads ---- */

/* Runs tp on ch in a thread; when tp->ref is set the result is checked.
 * The thread works on a heap copy of what it needs (tp's tensors and
 * reference must outlive it): when a failed assertion leaves the test
 * before ts_bg_join, it never writes into the dead stack frame. */
struct ts_bg_state;
typedef struct ts_bg {
  struct ts_bg_state *st; /* owned by the thread until joined */
  pthread_t th;
  /* Filled by ts_bg_join. */
  grpc_status_code code;
  char msg[512];
  int checked; /* OK and equal to tp->ref */
} ts_bg;
int ts_bg_start(ts_bg *b, grpc_channel *ch, const ts_problem *tp,
                int64_t deadline_ms);
void ts_bg_join(ts_bg *b);

/* A Health/Watch("") stream read in a thread until it ends; heap state as
 * for ts_bg. */
struct ts_watch_state;
typedef struct ts_watch {
  struct ts_watch_state *st;
  pthread_t th;
  /* Filled by ts_watch_join. */
  int seen[16]; /* statuses in order of arrival */
  int nseen;
  grpc_status_code code; /* the stream's final status */
} ts_watch;
int ts_watch_start(ts_watch *w, grpc_channel *ch);
void ts_watch_join(ts_watch *w);

/* Waits up to timeout_ms until the server log has count lines containing
 * needle. Returns 0 or -1. */
int ts_server_wait_log(const ts_server *s, const char *needle, int count,
                       int timeout_ms);

/* GetServerInfo of the server behind ch, or NULL (freed with
 * convgrad__v1__server_info__free_unpacked). */
Convgrad__V1__ServerInfo *ts_server_info(grpc_channel *ch);

/* A random valid small problem of one of the four ops, f32/bf16/f16,
 * ranks 1-3, either data format, any weights format of the op, groups,
 * strides, pads and dilations, drawn from *state (which advances).
 * Returns 0 or -1. */
int ts_random_problem(ts_problem *tp, uint64_t *state);

/* Monotonic milliseconds. Thread-safe. */
double ts_now_ms(void);

#endif
