/* compute.c - convgrad.v1.ConvGrad/Compute from the client side: encodes
 * the request stream (a ComputeHeader, carrying the tensors when the
 * request fits one message, else followed by DataChunk messages whose
 * data slices point straight at the caller's tensors), and decodes the
 * response stream into one output allocation: the shared codec (cgw.h)
 * finds each chunk's data in the received slices, so each received chunk
 * byte is copied exactly once. (A small result that rides in
 * ResultHeader.data is copied three times: out of the slices, by
 * protobuf-c, and into place.) */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cgw.h"
#include "convgrad/v1/convgrad.pb-c.h"
#include "internal.h"

/* Keeps count of the gRPC slices that still point into caller memory.
 * The call may end (e.g. the server rejects the header) while the
 * transport still holds queued chunks; cgc_compute must not return before
 * gRPC has dropped every reference to the caller's buffers. */
typedef struct cgc__pin {
  atomic_long refs; /* 1 for the attempt + 1 per live slice */
} cgc__pin;

static void cgc__pin_unref(void *p) {
  cgc__pin *pin = p;
  if (atomic_fetch_sub(&pin->refs, 1) == 1)
    free(pin);
}

/* Longest ResultHeader accepted: a handful of ints and two short strings,
 * plus ResultHeader.data, which the wire contract caps at 64 KiB. */
#define CGC__MAX_INLINE_BYTES 65536
#define CGC__MAX_HEADER_BYTES (65536 + CGC__MAX_INLINE_BYTES)
/* How long to wait for gRPC to release the caller's buffers after a call
 * ended; writes already handed to the socket finish quickly, queued ones
 * are dropped when the stream closes. */
#define CGC__PIN_WAIT_MS 30000

enum { CGC__TAG_SEND = 1, CGC__TAG_RECV = 2, CGC__TAG_STATUS = 3 };

typedef struct cgc__attempt {
  const cgc_request *req;
  const cgc_options *opts;
  /* upload cursor */
  size_t inline_len[2]; /* bytes sent inside the header message */
  int cur;              /* input being chunked; 2 = done */
  size_t off;           /* offset into inputs[cur] */
  cgc__pin *pin;
  /* download */
  int have_header;
  double t_header; /* cgc__now_ms() when the ResultHeader arrived */
  void *into;      /* caller memory for the result (cgc_compute_into) */
  size_t into_cap;
  cgc_tensor *out; /* its data is into when that is set, else owned */
  uint64_t received;
  cgc_result res;
  char perr[256]; /* protocol error found while parsing */
} cgc__attempt;

/* Same numbering on the wire except weights formats, which share the wire
 * Layout enum with the data formats. */
static Convgrad__V1__Layout cgc__wire_weights(cg_weights_format f) {
  return f == CG_WEIGHTS_DEFAULT ? CONVGRAD__V1__LAYOUT__LAYOUT_UNSPECIFIED
                                 : (Convgrad__V1__Layout)(f + 2);
}

static int cgc__check_view(const cgc_tensor_view *v, int index,
                           cgc_status *st) {
  size_t es = cg_dtype_size(v->dtype), n = 1;
  if (es == 0) {
    cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                    "inputs[%d].dtype: invalid (%d)", index, (int)v->dtype);
    return CG_EINVAL;
  }
  if (v->rank < 1 || v->rank > CG_MAX_RANK) {
    cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                    "inputs[%d].rank: must be 1..%d, got %d", index,
                    CG_MAX_RANK, v->rank);
    return CG_EINVAL;
  }
  if ((int)v->layout < 0 || v->layout > CGC_LAYOUT_XOI) {
    cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                    "inputs[%d].layout: invalid (%d)", index, (int)v->layout);
    return CG_EINVAL;
  }
  for (int i = 0; i < v->rank; i++) {
    if (v->dims[i] < 0 || __builtin_mul_overflow(n, (size_t)v->dims[i], &n)) {
      cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                      "inputs[%d].dims[%d]: negative or overflowing (%lld)",
                      index, i, (long long)v->dims[i]);
      return CG_ERANGE;
    }
  }
  if (__builtin_mul_overflow(n, es, &n) || n != v->nbytes) {
    cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                    "inputs[%d].nbytes: dims x %zu-byte elements need %zu "
                    "bytes, got %zu",
                    index, es, n, v->nbytes);
    return CG_EINVAL;
  }
  if (v->nbytes && !v->data) {
    cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT, "inputs[%d].data: NULL",
                    index);
    return CG_EINVAL;
  }
  return 0;
}

/* Packs the first message: the header, carrying the tensors too when the
 * whole request fits one upload chunk. A bigger request sends the header
 * alone: the server gets the call (and reserves and allocates) while the
 * data is still on its way, and every data byte takes the server's chunk
 * path, which copies it once, instead of the header's unpacking, which
 * copies it three times (3-6% faster calls of 11-32 MB here). */
static grpc_byte_buffer *cgc__encode_header(cgc__attempt *a) {
  const cgc_request *r = a->req;
  const cg_attrs *at = &r->attrs;
  Convgrad__V1__ComputeRequest msg = CONVGRAD__V1__COMPUTE_REQUEST__INIT;
  Convgrad__V1__ComputeHeader hdr = CONVGRAD__V1__COMPUTE_HEADER__INIT;
  Convgrad__V1__Attributes attrs = CONVGRAD__V1__ATTRIBUTES__INIT;
  Convgrad__V1__Tensor t[3] = {CONVGRAD__V1__TENSOR__INIT,
                               CONVGRAD__V1__TENSOR__INIT,
                               CONVGRAD__V1__TENSOR__INIT};
  Convgrad__V1__Tensor *tp[3] = {&t[0], &t[1], &t[2]};
  int64_t dims[2][CG_MAX_RANK];

#define CGC__LIST(name)                                                        \
  attrs.n_##name = at->name.len;                                               \
  attrs.name = (int64_t *)at->name.v
  CGC__LIST(strides);
  CGC__LIST(pads_begin);
  CGC__LIST(pads_end);
  CGC__LIST(dilations);
  CGC__LIST(output_padding);
  CGC__LIST(dst_shape);
  CGC__LIST(weights_shape);
#undef CGC__LIST
  attrs.groups = at->groups;
  attrs.auto_pad = (Convgrad__V1__AutoPad)at->auto_pad;
  attrs.data_format = (Convgrad__V1__Layout)at->data_format;
  attrs.weights_format = cgc__wire_weights(at->weights_format);

  int all_inline =
      r->inputs[0].nbytes <= a->opts->upload_chunk_bytes &&
      r->inputs[1].nbytes <= a->opts->upload_chunk_bytes - r->inputs[0].nbytes;
  for (int i = 0; i < 2; i++) {
    const cgc_tensor_view *v = &r->inputs[i];
    memcpy(dims[i], v->dims, sizeof dims[i]);
    t[i].dtype = (Convgrad__V1__DType)v->dtype;
    t[i].n_shape = (size_t)v->rank;
    t[i].shape = dims[i];
    t[i].layout = (Convgrad__V1__Layout)v->layout;
    size_t n = all_inline ? v->nbytes : 0;
    t[i].data.len = n;
    t[i].data.data = (uint8_t *)v->data;
    a->inline_len[i] = n;
  }
  int64_t shape_dims[1];
  if (r->has_shape_input) {
    /* Tiny, so always inline: a prefix of nothing but itself. */
    shape_dims[0] = (int64_t)r->shape_input.len;
    t[2].dtype = CONVGRAD__V1__DTYPE__S64;
    t[2].n_shape = 1;
    t[2].shape = shape_dims;
    t[2].data.len = r->shape_input.len * sizeof(int64_t);
    t[2].data.data = (uint8_t *)r->shape_input.v;
  }
  hdr.op = (Convgrad__V1__Op)r->op;
  hdr.attrs = &attrs;
  hdr.n_inputs = r->has_shape_input ? 3 : 2;
  hdr.inputs = tp;
  hdr.output_layout = (Convgrad__V1__Layout)r->output_layout;
  hdr.response_chunk_bytes = a->opts->download_chunk_bytes;
  msg.kind_case = CONVGRAD__V1__COMPUTE_REQUEST__KIND_HEADER;
  msg.header = &hdr;

  a->cur = 0;
  a->off = a->inline_len[0];
  return cgw_pack(&msg.base);
}

/* Moves the upload cursor past finished inputs; returns 1 if bytes remain. */
static int cgc__upload_left(cgc__attempt *a) {
  while (a->cur < 2 && a->off >= a->req->inputs[a->cur].nbytes) {
    a->cur++;
    if (a->cur < 2)
      a->off = a->inline_len[a->cur];
  }
  return a->cur < 2;
}

/* The next ComputeRequest{chunk: DataChunk{input, data}}, its data in
 * place in the caller's tensor. */
static grpc_byte_buffer *cgc__encode_chunk(cgc__attempt *a) {
  const cgc_tensor_view *v = &a->req->inputs[a->cur];
  size_t left = v->nbytes - a->off;
  size_t n =
      left < a->opts->upload_chunk_bytes ? left : a->opts->upload_chunk_bytes;
  atomic_fetch_add(&a->pin->refs, 1);
  grpc_byte_buffer *bb =
      cgw_request_chunk((uint32_t)a->cur, (const char *)v->data + a->off, n,
                        cgc__pin_unref, a->pin);
  a->off += n;
  a->res.bytes_sent += n;
  return bb;
}

static int cgc__perr(cgc__attempt *a, const char *msg) {
  if (!a->perr[0])
    snprintf(a->perr, sizeof a->perr, "malformed response: %s", msg);
  return CGC_EPROTO;
}

/* The ResultHeader arrived: check it and allocate the output. */
static int cgc__on_header(cgc__attempt *a, const uint8_t *buf, size_t len) {
  Convgrad__V1__ResultHeader *h =
      convgrad__v1__result_header__unpack(NULL, len, buf);
  int rc = 0;
  if (!h)
    return cgc__perr(a, "undecodable ResultHeader");
  cg_dtype dt = (cg_dtype)h->dtype;
  size_t es = cg_dtype_size(dt), n = 1;
  if (es == 0 || h->dtype > CONVGRAD__V1__DTYPE__F16) {
    rc = cgc__perr(a, "ResultHeader.dtype is not f32/bf16/f16");
    goto out;
  }
  if (h->n_shape < 1 || h->n_shape > CG_MAX_RANK) {
    rc = cgc__perr(a, "ResultHeader.shape has a bad rank");
    goto out;
  }
  for (size_t i = 0; i < h->n_shape; i++)
    if (h->shape[i] < 0 || __builtin_mul_overflow(n, (size_t)h->shape[i], &n)) {
      rc = cgc__perr(a, "ResultHeader.shape overflows");
      goto out;
    }
  if (__builtin_mul_overflow(n, es, &n) || n != h->total_bytes) {
    rc = cgc__perr(a, "ResultHeader.total_bytes disagrees with the shape");
    goto out;
  }
  if (h->total_bytes > a->opts->max_output_bytes) {
    snprintf(a->perr, sizeof a->perr,
             "result of %llu bytes exceeds max_output_bytes %llu",
             (unsigned long long)h->total_bytes,
             (unsigned long long)a->opts->max_output_bytes);
    rc = CG_ELIMIT;
    goto out;
  }
  if (h->n_pads_begin > CG_MAX_SPATIAL || h->n_pads_end != h->n_pads_begin) {
    rc = cgc__perr(a, "ResultHeader pads have a bad length");
    goto out;
  }
  if (h->data.len != 0 && h->data.len != n) {
    rc = cgc__perr(a, "ResultHeader.data is not the whole result");
    goto out;
  }
  if (a->into && n > a->into_cap) {
    snprintf(a->perr, sizeof a->perr,
             "result of %zu bytes does not fit the caller's %zu-byte buffer", n,
             a->into_cap);
    rc = CG_ELIMIT;
    goto out;
  }
  cgc_tensor *t = calloc(1, sizeof *t);
  void *data = a->into;
  size_t alloc = (n + 63) & ~(size_t)63;
  if (!t || (!a->into && posix_memalign(&data, 64, alloc ? alloc : 64) != 0)) {
    free(t);
    snprintf(a->perr, sizeof a->perr, "out of memory for a %zu-byte result", n);
    rc = CG_ENOMEM;
    goto out;
  }
  t->dtype = dt;
  t->rank = (int)h->n_shape;
  for (size_t i = 0; i < h->n_shape; i++)
    t->dims[i] = h->shape[i];
  t->layout = (h->layout >= 0 && h->layout <= CONVGRAD__V1__LAYOUT__XOI)
                  ? (cgc_layout)h->layout
                  : CGC_LAYOUT_DEFAULT;
  t->data = data;
  t->nbytes = n;
  if (h->data.len) {
    memcpy(data, h->data.data, n);
    a->received = n;
  }
  a->out = t;
  a->have_header = 1;
  a->t_header = cgc__now_ms();
  a->res.queue_ms = h->queue_ms;
  a->res.compute_ms = h->compute_ms;
  snprintf(a->res.compute_path, sizeof a->res.compute_path, "%s",
           h->compute_path ? h->compute_path : "");
  snprintf(a->res.worker, sizeof a->res.worker, "%s",
           h->worker ? h->worker : "");
  a->res.npads = (int)h->n_pads_begin;
  for (size_t i = 0; i < h->n_pads_begin; i++) {
    a->res.pads_begin[i] = h->pads_begin[i];
    a->res.pads_end[i] = h->pads_end[i];
  }
out:
  convgrad__v1__result_header__free_unpacked(h, NULL);
  return rc;
}

/* Copies the ResultHeader's encoding out of the message and decodes it. */
static int cgc__read_header(cgc__attempt *a, grpc_byte_buffer *bb,
                            const cgw_view *v) {
  if (a->have_header)
    return cgc__perr(a, "a second ResultHeader");
  if (v->len > CGC__MAX_HEADER_BYTES)
    return cgc__perr(a, "ResultHeader too large");
  uint8_t *buf = malloc(v->len ? v->len : 1);
  if (!buf)
    return cgc__perr(a, "out of memory");
  int rc = cgw_copy(bb, v->off, v->len, buf) != 0
               ? cgc__perr(a, "unreadable message")
               : cgc__on_header(a, buf, v->len);
  free(buf);
  return rc;
}

/* Copies a chunk's data from the message into place in the result. */
static int cgc__read_chunk(cgc__attempt *a, grpc_byte_buffer *bb,
                           const cgw_view *v) {
  if (!a->have_header)
    return cgc__perr(a, "data chunk before the ResultHeader");
  if (v->len > a->out->nbytes - a->received)
    return cgc__perr(a, "more data than ResultHeader.total_bytes");
  if (cgw_copy(bb, v->off, v->len, (uint8_t *)a->out->data + a->received))
    return cgc__perr(a, "unreadable message");
  a->received += v->len;
  return 0;
}

static int cgc__on_message(cgc__attempt *a, grpc_byte_buffer *bb) {
  cgw_view v;
  char why[128];
  if (cgw_scan_response(bb, &v, why, sizeof why) != 0)
    return cgc__perr(a, why);
  switch (v.kind) {
  case CGW_HEADER:
    return cgc__read_header(a, bb, &v);
  case CGW_CHUNK:
    return cgc__read_chunk(a, bb, &v);
  default:
    return 0; /* a message that sets nothing adds nothing */
  }
}

/* Drops the attempt's result tensor, keeping the caller's memory. */
static void cgc__drop_out(cgc__attempt *a) {
  if (a->out && a->into)
    free(a->out);
  else
    cgc_tensor_free(a->out);
  a->out = NULL;
}

static int cgc__start(grpc_call *call, grpc_op *ops, size_t n, intptr_t tag) {
  return grpc_call_start_batch(call, ops, n, (void *)tag, NULL) == GRPC_CALL_OK
             ? 0
             : CGC_ERPC;
}

/* One Compute call on a completion queue of its own: send batches (one at
 * a time), receive batches (one at a time) and the status batch, driven
 * until none is pending. */
static int cgc__compute_attempt(cgc_channel *ch, void *vctx,
                                gpr_timespec deadline, cgc_status *st) {
  cgc__attempt *a = vctx;
  int rc = 0;
  grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
  grpc_call *call = NULL;
  cgc__call_io io;
  int send_busy = 0, recv_busy = 0, status_busy = 0, sending = 0;
  int status_started = 0, batch_failed = 0, local_rc = 0;
  grpc_op ops[5];
  double t0 = cgc__now_ms(), t_last = t0;

  cgc__call_io_init(&io);
  /* Reset what a previous attempt left. */
  cgc__drop_out(a);
  a->have_header = 0;
  a->received = 0;
  a->perr[0] = '\0';
  memset(&a->res, 0, sizeof a->res);
  a->pin = calloc(1, sizeof *a->pin);
  if (!a->pin) {
    cgc__status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    rc = CG_ENOMEM;
    goto out;
  }
  atomic_init(&a->pin->refs, 1);
  io.send_bb = cgc__encode_header(a);
  a->res.bytes_sent = a->inline_len[0] + a->inline_len[1];

  call = grpc_channel_create_call(
      ch->chan, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
      grpc_slice_from_static_string("/convgrad.v1.ConvGrad/Compute"), NULL,
      deadline, NULL);
  if (!call) {
    cgc__status_set(st, GRPC_STATUS_INTERNAL, "cannot create the call");
    rc = CGC_ERPC;
    goto out;
  }

  grpc_op status_op;
  cgc__op_recv_status(&status_op, &io);

  cgc__ops_one_message(ops, &io);
  sending = cgc__upload_left(a);
  if (!sending) {
    /* The whole request fits one message: a single batch sends it and
     * waits for the first answer, which keeps small calls to three
     * completions (this, the data, the status). */
    if (cgc__start(call, ops, 5, CGC__TAG_RECV))
      goto start_failed;
    recv_busy = 1;
  } else {
    /* A long upload: ask for the status now so that a rejection stops
     * the upload early. */
    if (cgc__start(call, &status_op, 1, CGC__TAG_STATUS))
      goto start_failed;
    status_busy = status_started = 1;
    if (cgc__start(call, ops, 2, CGC__TAG_SEND))
      goto start_failed;
    send_busy = 1;
    if (cgc__start(call, ops + 3, 2, CGC__TAG_RECV))
      goto start_failed;
    recv_busy = 1;
  }

  while (send_busy || recv_busy || status_busy) {
    /* The call's deadline bounds every pending batch. */
    grpc_event ev = grpc_completion_queue_next(
        cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    if (ev.type != GRPC_OP_COMPLETE)
      break;
    switch ((intptr_t)ev.tag) {
    case CGC__TAG_SEND:
      send_busy = 0;
      grpc_byte_buffer_destroy(io.send_bb);
      io.send_bb = NULL;
      if (!ev.success)
        sending = 0; /* the call is over; the status says why */
      else if (!sending)
        a->res.upload_ms = cgc__now_ms() - t0;
      if (sending) {
        io.send_bb = cgc__encode_chunk(a);
        sending = cgc__upload_left(a);
        memset(ops, 0, sizeof ops);
        ops[0].op = GRPC_OP_SEND_MESSAGE;
        ops[0].data.send_message.send_message = io.send_bb;
        ops[1].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        if (cgc__start(call, ops, sending ? 1 : 2, CGC__TAG_SEND) == 0)
          send_busy = 1;
        else
          batch_failed = 1;
      }
      break;
    case CGC__TAG_RECV: {
      recv_busy = 0;
      if (io.recv_bb && !local_rc)
        local_rc = cgc__on_message(a, io.recv_bb);
      int ended = !io.recv_bb;
      if (io.recv_bb)
        grpc_byte_buffer_destroy(io.recv_bb);
      io.recv_bb = NULL;
      if (local_rc)
        grpc_call_cancel_with_status(call, GRPC_STATUS_CANCELLED,
                                     "client rejected the response", NULL);
      /* Once all the announced bytes are in, the status is asked for at
       * once; reading on still catches a server that sends more. */
      int all_in = a->have_header && a->received == a->out->nbytes;
      if (all_in && !status_started)
        t_last = cgc__now_ms();
      if (!ended && !local_rc) {
        grpc_op rop;
        memset(&rop, 0, sizeof rop);
        rop.op = GRPC_OP_RECV_MESSAGE;
        rop.data.recv_message.recv_message = &io.recv_bb;
        if (cgc__start(call, &rop, 1, CGC__TAG_RECV) == 0)
          recv_busy = 1;
        else
          batch_failed = 1;
      }
      if ((ended || local_rc || all_in) && !status_started && !batch_failed) {
        if (cgc__start(call, &status_op, 1, CGC__TAG_STATUS) == 0)
          status_busy = status_started = 1;
        else
          batch_failed = 1;
      }
      break;
    }
    case CGC__TAG_STATUS:
      status_busy = 0;
      break;
    }
    if (batch_failed) {
      /* Everything pending completes (as failed) after a cancel. */
      grpc_call_cancel(call, NULL);
      sending = 0;
    }
  }

  if (batch_failed) {
    cgc__status_set(st, GRPC_STATUS_INTERNAL, "cannot start a call batch");
    rc = CGC_ERPC;
  } else if (local_rc) {
    cgc__status_set(st,
                    local_rc == CGC_EPROTO ? GRPC_STATUS_INTERNAL
                                           : GRPC_STATUS_RESOURCE_EXHAUSTED,
                    "%s", a->perr);
    rc = local_rc;
  } else if (io.code != GRPC_STATUS_OK) {
    cgc__status_from_grpc(st, io.code, io.details);
    rc = CGC_ERPC;
  } else if (!a->have_header || a->received != a->out->nbytes) {
    cgc__status_set(st, GRPC_STATUS_INTERNAL, "malformed response: %s",
                    a->have_header ? "the stream ended before all data"
                                   : "no ResultHeader");
    rc = CGC_EPROTO;
  } else {
    a->res.total_ms = cgc__now_ms() - t0;
    a->res.download_ms = t_last - a->t_header;
    a->res.bytes_received = a->received;
    cgc__status_set(st, GRPC_STATUS_OK, "%s", "");
  }
  goto out;

start_failed:
  cgc__status_set(st, GRPC_STATUS_INTERNAL, "cannot start a call batch");
  rc = CGC_ERPC;
  grpc_call_cancel(call, NULL);
  while (send_busy || recv_busy || status_busy) {
    grpc_event ev = grpc_completion_queue_next(
        cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    if (ev.type != GRPC_OP_COMPLETE)
      break;
    if ((intptr_t)ev.tag == CGC__TAG_SEND)
      send_busy = 0;
    else if ((intptr_t)ev.tag == CGC__TAG_RECV)
      recv_busy = 0;
    else
      status_busy = 0;
  }
out:
  cgc__call_end(call, cq, &io);
  if (a->pin) {
    /* Only return once gRPC holds no slice of the caller's tensors. */
    double until = cgc__now_ms() + CGC__PIN_WAIT_MS;
    while (atomic_load(&a->pin->refs) > 1 && cgc__now_ms() < until) {
      struct timespec ts = {0, 200000};
      nanosleep(&ts, NULL);
    }
    cgc__pin_unref(a->pin);
    a->pin = NULL;
  }
  if (rc)
    cgc__drop_out(a);
  return rc;
}

void cgc_request_init(cgc_request *r) {
  memset(r, 0, sizeof *r);
  cg_attrs_init(&r->attrs);
}

void cgc_tensor_free(cgc_tensor *t) {
  if (!t)
    return;
  free(t->data);
  free(t);
}

/* cgc_compute and cgc_compute_into: into NULL = allocate the result. */
static int cgc__compute(cgc_channel *ch, const cgc_request *req, void *into,
                        size_t into_cap, cgc_tensor **out, cgc_result *res,
                        cgc_status *st) {
  cgc__attempt a;
  int rc, attempts = 0;
  *out = NULL;
  if (req->op < CG_OP_CONV_BWD_DATA || req->op > CG_OP_DECONV_BWD_WEIGHTS) {
    cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT, "op: invalid (%d)",
                    (int)req->op);
    return CG_EINVAL;
  }
  for (int i = 0; i < 2; i++)
    if ((rc = cgc__check_view(&req->inputs[i], i, st)) != 0)
      return rc;
  if (req->has_shape_input &&
      (req->shape_input.len == 0 || req->shape_input.len > CG_MAX_RANK ||
       !req->shape_input.v)) {
    cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                    "shape_input: must have 1..%d values", CG_MAX_RANK);
    return CG_EINVAL;
  }
  memset(&a, 0, sizeof a);
  a.req = req;
  a.opts = &ch->opts;
  a.into = into;
  a.into_cap = into_cap;
  rc = cgc__with_retry(ch, cgc__deadline(ch, req->deadline_ms),
                       cgc__compute_attempt, &a, &attempts, st);
  a.res.attempts = attempts;
  if (res)
    *res = a.res;
  if (!rc)
    *out = a.out;
  return rc;
}

int cgc_compute(cgc_channel *ch, const cgc_request *req, cgc_tensor **out,
                cgc_result *res, cgc_status *st) {
  return cgc__compute(ch, req, NULL, 0, out, res, st);
}

int cgc_compute_into(cgc_channel *ch, const cgc_request *req, void *data,
                     size_t cap, cgc_tensor *out, cgc_result *res,
                     cgc_status *st) {
  cgc_tensor *t = NULL;
  if (!data) {
    cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT, "data: NULL buffer");
    return CG_EINVAL;
  }
  int rc = cgc__compute(ch, req, data, cap, &t, res, st);
  if (!rc) {
    *out = *t;
    free(t);
  }
  return rc;
}

static int cgc__op(cgc_channel *ch, cg_op op, const cg_attrs *attrs,
                   const cgc_tensor_view *in0, const cgc_tensor_view *in1,
                   cgc_tensor **out, cgc_result *res, cgc_status *st) {
  cgc_request r;
  cgc_request_init(&r);
  r.op = op;
  if (attrs)
    r.attrs = *attrs;
  r.inputs[0] = *in0;
  r.inputs[1] = *in1;
  return cgc_compute(ch, &r, out, res, st);
}

int cgc_conv_bwd_data(cgc_channel *ch, const cg_attrs *attrs,
                      const cgc_tensor_view *diff_dst,
                      const cgc_tensor_view *weights, cgc_tensor **diff_src,
                      cgc_result *res, cgc_status *st) {
  return cgc__op(ch, CG_OP_CONV_BWD_DATA, attrs, diff_dst, weights, diff_src,
                 res, st);
}

int cgc_conv_bwd_weights(cgc_channel *ch, const cg_attrs *attrs,
                         const cgc_tensor_view *src,
                         const cgc_tensor_view *diff_dst,
                         cgc_tensor **diff_weights, cgc_result *res,
                         cgc_status *st) {
  return cgc__op(ch, CG_OP_CONV_BWD_WEIGHTS, attrs, src, diff_dst, diff_weights,
                 res, st);
}

int cgc_deconv_bwd_data(cgc_channel *ch, const cg_attrs *attrs,
                        const cgc_tensor_view *diff_dst,
                        const cgc_tensor_view *weights, cgc_tensor **diff_src,
                        cgc_result *res, cgc_status *st) {
  return cgc__op(ch, CG_OP_DECONV_BWD_DATA, attrs, diff_dst, weights, diff_src,
                 res, st);
}

int cgc_deconv_bwd_weights(cgc_channel *ch, const cg_attrs *attrs,
                           const cgc_tensor_view *src,
                           const cgc_tensor_view *diff_dst,
                           cgc_tensor **diff_weights, cgc_result *res,
                           cgc_status *st) {
  return cgc__op(ch, CG_OP_DECONV_BWD_WEIGHTS, attrs, src, diff_dst,
                 diff_weights, res, st);
}
