/* compute.c - convgrad.v1.ConvGrad/Compute from the client side: encodes
 * the request stream (a ComputeHeader, carrying the tensors when the
 * request fits one message, else followed by DataChunk messages whose
 * data slices point straight at the caller's tensors), and decodes the
 * response stream into one allocation per output (a layer op answers
 * several, one after another): the shared codec (cgw.h)
 * finds each chunk's data in the received slices, so each received chunk
 * byte is copied exactly once. (A small result that rides in
 * ResultHeader.data is copied three times: out of the slices, by
 * protobuf-c, and into place.) */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/support/alloc.h>

#include "cgw.h"
#include "convgrad/v1/convgrad.pb-c.h"
#include "internal.h"

/* Longest ResultHeader accepted: a handful of ints and two short strings,
 * plus ResultHeader.data, which the wire contract caps at 64 KiB. */
#define CGC__MAX_INLINE_BYTES 65536
#define CGC__MAX_HEADER_BYTES (65536 + CGC__MAX_INLINE_BYTES)
/* A ResultHeader of up to this many bytes (the tiny row's, with its 1 KiB
 * result in ResultHeader.data, is 1.1 KiB) is copied out of its message
 * onto the stack and decoded there; 4 KiB of each, on the thread running
 * the call. */
#define CGC__ARENA_BYTES 4096

/* A Compute call across its attempts (cgc__job in internal.h). */
typedef struct cgc__attempt {
  const cgc_request *req;
  const cgc_options *opts;
  int nin;            /* data inputs: 2, or 3 for a layer op */
  unsigned wants_all; /* CG_GRAD_BIT() of each output the call asks for */
  /* Outputs whole so far, in any attempt: final, never asked again. */
  unsigned done;
  unsigned wants; /* this attempt's: wants_all but done */
  /* This attempt's answer is one message by the wire contract (one output,
   * inline or in a region), and the response_chunk_bytes it asks for. */
  int one_message;
  uint32_t chunk_ask;
  cgc__whole_fn on_whole; /* told of each output once it is whole */
  void *whole_arg;
  /* upload cursor */
  size_t inline_len[3]; /* bytes sent inside the header message */
  int cur;              /* input being chunked; nin = done */
  size_t off;           /* offset into inputs[cur] */
  cgc__pin *pin;
  /* download: the outputs arrive in cg_grad order */
  int have_header; /* a ResultHeader arrived */
  int out_cur;     /* the output being received */
  unsigned got;    /* outputs whose header arrived */
  double t_header; /* cgc__now_ms() when the first ResultHeader arrived */
  /* Caller memory for each output (the _into calls), else NULL. */
  void *into[CG_GRAD_COUNT];
  size_t into_cap[CG_GRAD_COUNT];
  /* The outputs; their data is into[g] when that is set, else owned. */
  cgc_tensor *out[CG_GRAD_COUNT];
  /* Inputs and outputs in regions registered on the channel (else NULL),
   * and their offsets there: sent as references. */
  const cgc_region *in_reg[3], *out_reg[CG_GRAD_COUNT];
  uint64_t in_off[3], out_off[CG_GRAD_COUNT];
  uint64_t received; /* bytes of out[out_cur] */
  cgc_result res;
  char perr[256]; /* protocol error found while parsing */
  int in_regions; /* some input or output lies in a registered region */
  /* Staged inputs (views with staged set) the server lacked, by input
   * (its NOT_FOUND's convgrad-missing-staged), and those that go as
   * bytes from then on. */
  unsigned staged_missing, staged_as_bytes;
  /* The client's checks (verify.c): whether the outputs are checked, the
   * request's layer and the probes' seed; the outputs of this attempt
   * that failed theirs, with the last failure's status; the attempt's
   * call, whose peer a failure names. */
  int checking;
  cg_layer check_layer;
  uint64_t check_seed;
  cgc__verifier *vf;
  unsigned check_failed;
  cgc_status check_st;
  grpc_call *call;
} cgc__attempt;

/* The trailing metadata naming the staged ids a Compute call lacked. */
#define CGC__MISSING_STAGED_KEY "convgrad-missing-staged"

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

/* Fills ref with n bytes at offset in r; returns ref. */
static Convgrad__V1__RegionRef *cgc__ref(Convgrad__V1__RegionRef *ref,
                                         const cgc_region *r, uint64_t offset,
                                         uint64_t n) {
  Convgrad__V1__RegionRef init = CONVGRAD__V1__REGION_REF__INIT;
  *ref = init;
  ref->name = (char *)cgc__region_name(r);
  ref->offset = offset;
  ref->byte_size = n;
  return ref;
}

/* 1 when input i goes as a staged id. */
static int cgc__by_id(const cgc__attempt *a, int i) {
  return a->req->inputs[i].staged && !a->in_reg[i] &&
         !(a->staged_as_bytes & (1u << i));
}

/* Packs the first message: the header, carrying the tensors too when the
 * whole request fits one upload chunk. A bigger request sends the header
 * alone: the server gets the call (and reserves and allocates) while the
 * data is still on its way, and every data byte takes the server's chunk
 * path, which copies it once, instead of the header's unpacking, which
 * copies it three times (tests/README.md, "Design figures"). */
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
  int64_t dims[3][CG_MAX_RANK];
  Convgrad__V1__Output outputs[CG_GRAD_COUNT];

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

  size_t room = a->opts->upload_chunk_bytes;
  int all_inline = 1;
  for (int i = 0; i < a->nin && all_inline; i++) {
    size_t n = a->in_reg[i] || cgc__by_id(a, i) ? 0 : r->inputs[i].nbytes;
    all_inline = n <= room;
    room -= all_inline ? n : 0;
  }
  Convgrad__V1__RegionRef refs[3 + CG_GRAD_COUNT];
  Convgrad__V1__StagedRef staged[3];
  a->res.bytes_sent = 0;
  for (int i = 0; i < a->nin; i++) {
    const cgc_tensor_view *v = &r->inputs[i];
    memcpy(dims[i], v->dims, sizeof dims[i]);
    t[i].dtype = (Convgrad__V1__DType)v->dtype;
    t[i].n_shape = (size_t)v->rank;
    t[i].shape = dims[i];
    t[i].layout = (Convgrad__V1__Layout)v->layout;
    if (a->in_reg[i]) {
      t[i].region = cgc__ref(&refs[i], a->in_reg[i], a->in_off[i], v->nbytes);
      a->inline_len[i] = v->nbytes; /* nothing left to upload */
      continue;
    }
    if (cgc__by_id(a, i)) {
      Convgrad__V1__StagedRef init = CONVGRAD__V1__STAGED_REF__INIT;
      staged[i] = init;
      staged[i].sha256.data = (uint8_t *)v->staged;
      staged[i].sha256.len = CGC_STAGED_ID_BYTES;
      staged[i].private_id = cgc__stage_id_private(v->staged);
      t[i].staged = &staged[i];
      a->inline_len[i] = v->nbytes;
      continue;
    }
    size_t n = all_inline ? v->nbytes : 0;
    t[i].data.len = n;
    t[i].data.data = (uint8_t *)v->data;
    a->inline_len[i] = n;
    a->res.bytes_sent += n;
  }
  Convgrad__V1__OutputRegion placed[CG_GRAD_COUNT];
  Convgrad__V1__OutputRegion *placed_ptrs[CG_GRAD_COUNT];
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    if (!a->out_reg[g])
      continue;
    Convgrad__V1__OutputRegion init = CONVGRAD__V1__OUTPUT_REGION__INIT;
    Convgrad__V1__OutputRegion *o = &placed[hdr.n_output_regions];
    *o = init;
    o->output = (Convgrad__V1__Output)(CONVGRAD__V1__OUTPUT__DIFF_SRC + g);
    o->region =
        cgc__ref(&refs[3 + g], a->out_reg[g], a->out_off[g], a->into_cap[g]);
    placed_ptrs[hdr.n_output_regions++] = o;
  }
  hdr.output_regions = placed_ptrs;
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
  hdr.n_inputs = (size_t)a->nin + (r->has_shape_input ? 1 : 0);
  hdr.inputs = tp;
  hdr.output_layout = (Convgrad__V1__Layout)r->output_layout;
  hdr.weights_output_layout = (Convgrad__V1__Layout)r->weights_output_layout;
  /* A layer op names its outputs: a retry asks only for those still
   * missing. */
  for (int g = 0; g < CG_GRAD_COUNT && cg_op_is_layer(r->op); g++)
    if (a->wants & CG_GRAD_BIT(g))
      outputs[hdr.n_outputs++] =
          (Convgrad__V1__Output)(CONVGRAD__V1__OUTPUT__DIFF_SRC + g);
  hdr.outputs = outputs;
  hdr.response_chunk_bytes = a->chunk_ask;
  msg.kind_case = CONVGRAD__V1__COMPUTE_REQUEST__KIND_HEADER;
  msg.header = &hdr;

  a->cur = 0;
  a->off = a->inline_len[0];
  return cgw_pack(&msg.base);
}

/* Moves the upload cursor past finished inputs; returns 1 if bytes remain. */
static int cgc__upload_left(cgc__attempt *a) {
  while (a->cur < a->nin && a->off >= a->req->inputs[a->cur].nbytes) {
    a->cur++;
    if (a->cur < a->nin)
      a->off = a->inline_len[a->cur];
  }
  return a->cur < a->nin;
}

/* The next ComputeRequest{chunk: DataChunk{input, data}}, its data in
 * place in the caller's tensor. */
static grpc_byte_buffer *cgc__encode_chunk(cgc__attempt *a) {
  const cgc_tensor_view *v = &a->req->inputs[a->cur];
  size_t left = v->nbytes - a->off;
  size_t n =
      left < a->opts->upload_chunk_bytes ? left : a->opts->upload_chunk_bytes;
  cgc__pin_ref(a->pin);
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

/* The output a ResultHeader starts: the next one asked for, which the
 * header names (servers before the layer ops leave it unset, answering
 * the single output). -1 after cgc__perr. */
static int cgc__next_output(cgc__attempt *a,
                            const Convgrad__V1__ResultHeader *h) {
  unsigned left = a->wants & ~a->got;
  if (!left) {
    cgc__perr(a, "more outputs than were asked for");
    return -1;
  }
  int g = __builtin_ctz(left);
  if (h->output == CONVGRAD__V1__OUTPUT__OUTPUT_UNSPECIFIED &&
      a->wants == left && (left & (left - 1)) == 0)
    return g;
  if ((int)h->output != CONVGRAD__V1__OUTPUT__DIFF_SRC + g) {
    cgc__perr(a, "ResultHeader.output is not the next output asked for");
    return -1;
  }
  return g;
}

/* Checks a ResultHeader of output g against itself and the caller's
 * limits; *n gets the output's size. */
static int cgc__check_result(cgc__attempt *a,
                             const Convgrad__V1__ResultHeader *h, int g,
                             size_t *n) {
  size_t es = cg_dtype_size((cg_dtype)h->dtype);
  *n = 1;
  if (es == 0 || h->dtype > CONVGRAD__V1__DTYPE__F16)
    return cgc__perr(a, "ResultHeader.dtype is not f32/bf16/f16");
  if (h->n_shape < 1 || h->n_shape > CG_MAX_RANK)
    return cgc__perr(a, "ResultHeader.shape has a bad rank");
  for (size_t i = 0; i < h->n_shape; i++)
    if (h->shape[i] < 0 || __builtin_mul_overflow(*n, (size_t)h->shape[i], n))
      return cgc__perr(a, "ResultHeader.shape overflows");
  if (__builtin_mul_overflow(*n, es, n) || *n != h->total_bytes)
    return cgc__perr(a, "ResultHeader.total_bytes disagrees with the shape");
  if (h->total_bytes > a->opts->max_output_bytes) {
    snprintf(a->perr, sizeof a->perr,
             "result of %llu bytes exceeds max_output_bytes %llu",
             (unsigned long long)h->total_bytes,
             (unsigned long long)a->opts->max_output_bytes);
    return CG_ELIMIT;
  }
  if (h->n_pads_begin > CG_MAX_SPATIAL || h->n_pads_end != h->n_pads_begin)
    return cgc__perr(a, "ResultHeader pads have a bad length");
  if (h->data.len != 0 && h->data.len != *n)
    return cgc__perr(a, "ResultHeader.data is not the whole result");
  if (h->region && (!a->out_reg[g] || h->data.len ||
                    strcmp(h->region->name ? h->region->name : "",
                           cgc__region_name(a->out_reg[g])) != 0 ||
                    h->region->offset != a->out_off[g]))
    return cgc__perr(a, "ResultHeader.region is not where the output was "
                        "asked to go");
  if (a->into[g] && *n > a->into_cap[g]) {
    snprintf(a->perr, sizeof a->perr,
             "%s of %zu bytes does not fit the caller's %zu-byte buffer",
             cg_grad_name((cg_grad)g), *n, a->into_cap[g]);
    return CG_ELIMIT;
  }
  return 0;
}

/* Checks output g, just received, when the call is checked; 0 when it
 * passed or is not checked. */
static int cgc__check_output(cgc__attempt *a, int g) {
  if (!a->checking)
    return 0;
  char *peer = a->call ? grpc_call_get_peer(a->call) : NULL;
  int rc =
      cgc__verify_output(a->vf, &a->check_layer, (cg_grad)g, a->req, a->out[g],
                         a->check_seed, peer, a->res.worker, &a->check_st);
  gpr_free(peer);
  return rc;
}

/* Tells of the output being received once its last byte is in (and, in a
 * checked call, once it passed its check): from then on its data is
 * final, whatever happens to the rest of the call. */
static void cgc__mark_whole(cgc__attempt *a) {
  unsigned bit = CG_GRAD_BIT(a->out_cur);
  if (a->received != a->out[a->out_cur]->nbytes || (a->done & bit) ||
      (a->check_failed & bit))
    return;
  if (cgc__check_output(a, a->out_cur) != 0) {
    a->check_failed |= bit; /* asked for again, if the call retries */
    return;
  }
  a->done |= bit;
  if (a->on_whole)
    a->on_whole(a->whole_arg, a->done);
}

/* Copies the string src (NULL: empty) into dst of cap bytes, cut to fit. */
static void cgc__copy_text(char *dst, size_t cap, const char *src) {
  size_t n = src ? strnlen(src, cap - 1) : 0;
  if (n)
    memcpy(dst, src, n);
  dst[n] = '\0';
}

/* Allocates output g of a checked ResultHeader of n bytes (in the
 * caller's buffer, when there is one) and keeps the header's figures. */
static int cgc__take_result(cgc__attempt *a,
                            const Convgrad__V1__ResultHeader *h, int g,
                            size_t n) {
  cgc_tensor *t = calloc(1, sizeof *t);
  void *data = a->into[g];
  size_t alloc = (n + 63) & ~(size_t)63;
  if (!t || (!data && posix_memalign(&data, 64, alloc ? alloc : 64) != 0)) {
    free(t);
    snprintf(a->perr, sizeof a->perr, "out of memory for a %zu-byte result", n);
    return CG_ENOMEM;
  }
  t->dtype = (cg_dtype)h->dtype;
  t->rank = (int)h->n_shape;
  for (size_t i = 0; i < h->n_shape; i++)
    t->dims[i] = h->shape[i];
  t->layout = (h->layout >= 0 && h->layout <= CONVGRAD__V1__LAYOUT__XOI)
                  ? (cgc_layout)h->layout
                  : CGC_LAYOUT_DEFAULT;
  t->data = data;
  t->nbytes = n;
  a->received = 0;
  if (h->region) {
    a->received = n; /* the server wrote it in place */
  } else if (h->data.len) {
    memcpy(data, h->data.data, n);
    a->received = n;
    a->res.bytes_received += n;
  }
  a->out[g] = t;
  a->out_cur = g;
  a->got |= CG_GRAD_BIT(g);
  if (!a->have_header)
    a->t_header = cgc__now_ms();
  a->have_header = 1;
  a->res.queue_ms = h->queue_ms;
  a->res.output_compute_ms[g] = h->compute_ms;
  a->res.compute_ms += h->compute_ms;
  cgc__copy_text(a->res.compute_path, sizeof a->res.compute_path,
                 h->compute_path);
  cgc__copy_text(a->res.worker, sizeof a->res.worker, h->worker);
  a->res.npads = (int)h->n_pads_begin;
  for (size_t i = 0; i < h->n_pads_begin; i++) {
    a->res.pads_begin[i] = h->pads_begin[i];
    a->res.pads_end[i] = h->pads_end[i];
  }
  cgc__mark_whole(a);
  return 0;
}

/* Where protobuf-c puts a decoded ResultHeader: a buffer on the decoding
 * thread's stack, then the heap once that is full (a large
 * ResultHeader.data), so that a small answer is decoded without a malloc
 * and free per field (tests/README.md, "Design figures"). */
typedef struct cgc__arena {
  size_t used;
  int heap; /* allocations that went to the heap */
  _Alignas(max_align_t) unsigned char buf[CGC__ARENA_BYTES];
} cgc__arena;

static void *cgc__arena_alloc(void *data, size_t n) {
  cgc__arena *ar = data;
  size_t at = (ar->used + _Alignof(max_align_t) - 1) &
              ~(size_t)(_Alignof(max_align_t) - 1);
  if (at <= sizeof ar->buf && n <= sizeof ar->buf - at) {
    ar->used = at + n;
    return ar->buf + at;
  }
  ar->heap++;
  return malloc(n);
}

static void cgc__arena_free(void *data, void *p) {
  cgc__arena *ar = data;
  uintptr_t at = (uintptr_t)p, start = (uintptr_t)ar->buf;
  if (at - start >= sizeof ar->buf)
    free(p);
}

/* The ResultHeader arrived: check it and allocate the output. */
static int cgc__on_header(cgc__attempt *a, const uint8_t *buf, size_t len) {
  cgc__arena ar;
  ar.used = 0;
  ar.heap = 0;
  ProtobufCAllocator alloc = {cgc__arena_alloc, cgc__arena_free, &ar};
  Convgrad__V1__ResultHeader *h =
      convgrad__v1__result_header__unpack(&alloc, len, buf);
  if (!h)
    return cgc__perr(a, "undecodable ResultHeader");
  size_t n;
  int g = cgc__next_output(a, h);
  int rc = g < 0 ? CGC_EPROTO : cgc__check_result(a, h, g, &n);
  if (!rc)
    rc = cgc__take_result(a, h, g, n);
  if (ar.heap) /* else nothing of it outlives ar */
    convgrad__v1__result_header__free_unpacked(h, &alloc);
  return rc;
}

/* Copies the ResultHeader's encoding out of the message and decodes it. */
static int cgc__read_header(cgc__attempt *a, grpc_byte_buffer *bb,
                            const cgw_view *v) {
  if (a->have_header && a->received != a->out[a->out_cur]->nbytes)
    return cgc__perr(a, "a ResultHeader before the last output was whole");
  if (v->len > CGC__MAX_HEADER_BYTES)
    return cgc__perr(a, "ResultHeader too large");
  uint8_t small[CGC__ARENA_BYTES];
  uint8_t *buf = v->len <= sizeof small ? small : malloc(v->len);
  if (!buf)
    return cgc__perr(a, "out of memory");
  int rc = cgw_copy(bb, v->off, v->len, buf) != 0
               ? cgc__perr(a, "unreadable message")
               : cgc__on_header(a, buf, v->len);
  if (buf != small)
    free(buf);
  return rc;
}

/* Copies a chunk's data from the message into place in the result. */
static int cgc__read_chunk(cgc__attempt *a, grpc_byte_buffer *bb,
                           const cgw_view *v) {
  if (!a->have_header)
    return cgc__perr(a, "data chunk before the ResultHeader");
  cgc_tensor *t = a->out[a->out_cur];
  if (v->len > t->nbytes - a->received)
    return cgc__perr(a, "more data than ResultHeader.total_bytes");
  if (cgw_copy(bb, v->off, v->len, (uint8_t *)t->data + a->received))
    return cgc__perr(a, "unreadable message");
  a->received += v->len;
  a->res.bytes_received += v->len;
  cgc__mark_whole(a);
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

/* Drops the outputs in mask, keeping the caller's memory. */
static void cgc__drop_out(cgc__attempt *a, unsigned mask) {
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    if (!(mask & CG_GRAD_BIT(g)))
      continue;
    if (a->out[g] && a->into[g])
      free(a->out[g]);
    else
      cgc_tensor_free(a->out[g]);
    a->out[g] = NULL;
  }
}

/* 1 when every output asked for arrived whole. */
static int cgc__all_in(const cgc__attempt *a) {
  return a->have_header && a->got == a->wants &&
         a->received == a->out[a->out_cur]->nbytes;
}

static int cgc__start(grpc_call *call, grpc_op *ops, size_t n, cgc__tag *tag) {
  return grpc_call_start_batch(call, ops, n, cgc__tag_give(tag), NULL) ==
                 GRPC_CALL_OK
             ? 0
             : CGC_ERPC;
}

/* The live state of one attempt's call: its batches in flight and what
 * ended it. */
typedef struct cgc__flight {
  grpc_call *call;
  cgc__call_io io;
  grpc_op status_op;
  int send_busy, recv_busy, status_busy;
  int sending;        /* upload chunks remain */
  int status_started; /* the status batch was started */
  int one_batch;      /* ... as part of the only batch (all_tag) */
  int batch_failed;   /* a batch could not be started */
  int local_rc;       /* why this end rejected the response */
  double t0;          /* the call's start */
  double t_all_in;    /* when every output was whole; 0 before */
} cgc__flight;

/* The product of n dims times es bytes, SIZE_MAX when a dim is negative or
 * it overflows (the server refuses such a request). */
static size_t cgc__dims_bytes(const int64_t *v, size_t n, size_t es) {
  size_t bytes = es;
  for (size_t i = 0; i < n; i++)
    if (v[i] < 0 || __builtin_mul_overflow(bytes, (size_t)v[i], &bytes))
      return SIZE_MAX;
  return bytes;
}

/* At least the size of output g where the request states it, else
 * SIZE_MAX (SEMANTICS.md, "Output shapes"): a layer op's diff_src has
 * src's shape and diff_weights the weights', and diff_bias [OC] is no
 * larger than the weights (OC of them per input channel and kernel
 * point); a single op's shape tensor or dst_shape / weights_shape
 * attribute gives its output's. A shape the server infers is not
 * predicted here. */
static size_t cgc__output_bytes_bound(const cgc__attempt *a, int g) {
  const cgc_request *r = a->req;
  size_t es = cg_dtype_size(r->inputs[0].dtype);
  if (cg_op_is_layer(r->op))
    return g == CG_GRAD_DIFF_SRC ? r->inputs[0].nbytes : r->inputs[2].nbytes;
  if (r->has_shape_input)
    return cgc__dims_bytes(r->shape_input.v, r->shape_input.len, es);
  const cg_ints *shape = cg_op_outputs_weights(r->op) ? &r->attrs.weights_shape
                         : r->op == CG_OP_CONV_BWD_DATA ? &r->attrs.dst_shape
                                                        : NULL;
  return shape && shape->len ? cgc__dims_bytes(shape->v, shape->len, es)
                             : SIZE_MAX;
}

/* Decides whether this attempt's answer is one message, which lets a
 * request that is one message too run as one batch (cgc__open). By the
 * wire contract an output comes as one message when it goes to a region,
 * or is at most 64 KiB and at most response_chunk_bytes: for such an
 * output the attempt asks for chunks of 64 KiB when the caller left the
 * size to the server, whose own default may be as low as 1 KiB. */
static void cgc__plan_answer(cgc__attempt *a) {
  unsigned w = a->wants;
  uint32_t chunk = a->opts->download_chunk_bytes;
  size_t inline_max =
      chunk && chunk < CGC__MAX_INLINE_BYTES ? chunk : CGC__MAX_INLINE_BYTES;
  a->chunk_ask = chunk;
  a->one_message = 0;
  if (!w || (w & (w - 1)))
    return; /* several outputs: a header each */
  int g = __builtin_ctz(w);
  if (a->out_reg[g]) {
    a->one_message = 1;
  } else if (cgc__output_bytes_bound(a, g) <= inline_max) {
    a->one_message = 1;
    a->chunk_ask = chunk ? chunk : CGC__MAX_INLINE_BYTES;
  }
}

/* A Compute call: its attempts one after another on one completion queue,
 * each a state machine that the queue's events advance (cgc__tag_run), the
 * waits between them too (cgc__retrier), so that the caller's own thread
 * (a blocking call) or the channel's engine thread (async.c) drives any
 * number of calls alike. */
struct cgc__job {
  cgc__attempt a;
  cgc_channel *ch;
  grpc_completion_queue *cq;
  /* Held while an event of the call is handled, or the call is started:
   * the starting thread may still open batches when the first completes on
   * the engine's thread. */
  pthread_mutex_t mu;
  cgc__flight f;
  cgc__tag send_tag, recv_tag, status_tag, all_tag, wait_tag, reg_tag;
  cgc__retrier retry;
  int registered_again; /* the call's regions were registered anew */
  int stage_noted;      /* cgc__stage_seen was told of the call */
  /* The registration running: of the region at reg_next (cgc__region_at). */
  cgc__unary_call reg;
  cgc__try reg_try;
  int reg_next;
  cgc__end_fn on_end; /* told once the call ended */
  void *end_arg;
  int ended;     /* rc and st are final */
  int cancelled; /* cgc__job_cancel: no attempt after the current one */
  /* Attempts left after a failed check (cgc_channel.verify_retries), and
   * the attempts whose check failed. */
  int check_retries, check_failures;
  int rc;
  cgc_status st;
};

#define CGC__JOB_OF(tag, member)                                               \
  ((cgc__job *)(void *)((char *)(tag)-offsetof(cgc__job, member)))

/* Clears what a previous attempt left (but the outputs already whole). */
static void cgc__attempt_reset(cgc__attempt *a) {
  cgc__drop_out(a, ~a->done);
  a->wants = a->wants_all & ~a->done;
  cgc__plan_answer(a);
  a->have_header = 0;
  a->got = 0;
  a->received = 0;
  a->check_failed = 0;
  a->perr[0] = '\0';
  memset(&a->res, 0, sizeof a->res);
}

/* Pins the caller's tensors for an upload in chunks, whose slices point
 * into them; a request that fits one message is a copy and pins nothing.
 * One pin serves every attempt of the call. */
static int cgc__pin_inputs(cgc__attempt *a, cgc_status *st) {
  if (a->pin)
    return 0;
  a->pin = cgc__pin_new();
  if (!a->pin) {
    cgc__status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return CG_ENOMEM;
  }
  return 0;
}

/* Starts the first batches: the header, and for a long upload the status
 * too. Returns 0, or CGC_ERPC when a batch cannot start. */
static int cgc__open(cgc__job *j) {
  cgc__attempt *a = &j->a;
  cgc__flight *f = &j->f;
  grpc_op ops[6];
  cgc__op_recv_status(&f->status_op, &f->io);
  cgc__ops_one_message(ops, &f->io);
  f->sending = cgc__upload_left(a);
  if (!f->sending && a->one_message) {
    /* One message each way: one batch sends the request and receives the
     * answer and the status, as a unary call does (three batches cost
     * the client 10% more instructions per tiny call). The status batch
     * cannot end while a message is unread, so only an answer that is
     * one message by contract may go this way: a server that sent more
     * would hold the call until its deadline. */
    ops[5] = f->status_op;
    if (cgc__start(f->call, ops, 6, &j->all_tag))
      return CGC_ERPC;
    f->recv_busy = f->status_busy = f->status_started = f->one_batch = 1;
    return 0;
  }
  if (!f->sending) {
    /* The whole request fits one message: a single batch sends it and
     * waits for the first answer, which keeps small calls to three
     * completions (this, the data, the status). */
    if (cgc__start(f->call, ops, 5, &j->recv_tag))
      return CGC_ERPC;
    f->recv_busy = 1;
    return 0;
  }
  /* A long upload: ask for the status now so that a rejection stops the
   * upload early. */
  if (cgc__start(f->call, &f->status_op, 1, &j->status_tag))
    return CGC_ERPC;
  f->status_busy = f->status_started = 1;
  if (cgc__start(f->call, ops, 2, &j->send_tag))
    return CGC_ERPC;
  f->send_busy = 1;
  if (cgc__start(f->call, ops + 3, 2, &j->recv_tag))
    return CGC_ERPC;
  f->recv_busy = 1;
  return 0;
}

/* A send batch completed: sends the next chunk, the last one with the
 * half-close. */
static void cgc__on_sent(cgc__job *j, int success) {
  cgc__attempt *a = &j->a;
  cgc__flight *f = &j->f;
  f->send_busy = 0;
  grpc_byte_buffer_destroy(f->io.send_bb);
  f->io.send_bb = NULL;
  if (!success)
    f->sending = 0; /* the call is over; the status says why */
  else if (!f->sending) {
    a->res.upload_ms = cgc__now_ms() - f->t0;
    if (a->on_whole)
      a->on_whole(a->whole_arg, a->done | CGC__SENT);
  }
  if (!f->sending)
    return;
  f->io.send_bb = cgc__encode_chunk(a);
  f->sending = cgc__upload_left(a);
  grpc_op ops[2];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_MESSAGE;
  ops[0].data.send_message.send_message = f->io.send_bb;
  ops[1].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  if (cgc__start(f->call, ops, f->sending ? 1 : 2, &j->send_tag) == 0)
    f->send_busy = 1;
  else
    f->batch_failed = 1;
}

/* A receive batch completed: decodes its message, then asks for the next
 * one, and for the status once the stream ended, the response was rejected
 * or all the announced bytes are in. */
static void cgc__on_received(cgc__job *j) {
  cgc__attempt *a = &j->a;
  cgc__flight *f = &j->f;
  f->recv_busy = 0;
  int ended = !f->io.recv_bb;
  if (!ended) {
    if (!f->local_rc)
      f->local_rc = cgc__on_message(a, f->io.recv_bb);
    grpc_byte_buffer_destroy(f->io.recv_bb);
    f->io.recv_bb = NULL;
  }
  if (f->local_rc)
    grpc_call_cancel_with_status(f->call, GRPC_STATUS_CANCELLED,
                                 "client rejected the response", NULL);
  /* Once all the announced bytes are in, the status is asked for at once;
   * reading on still catches a server that sends more. */
  int all_in = cgc__all_in(a);
  if (all_in && !f->t_all_in)
    f->t_all_in = cgc__now_ms();
  if (!ended && !f->local_rc && !f->one_batch) {
    grpc_op rop;
    memset(&rop, 0, sizeof rop);
    rop.op = GRPC_OP_RECV_MESSAGE;
    rop.data.recv_message.recv_message = &f->io.recv_bb;
    if (cgc__start(f->call, &rop, 1, &j->recv_tag) == 0)
      f->recv_busy = 1;
    else
      f->batch_failed = 1;
  }
  if ((ended || f->local_rc || all_in) && !f->status_started &&
      !f->batch_failed) {
    if (cgc__start(f->call, &f->status_op, 1, &j->status_tag) == 0)
      f->status_busy = f->status_started = 1;
    else
      f->batch_failed = 1;
  }
}

/* The attempt's result from how its call ended. */
static int cgc__outcome(cgc__attempt *a, const cgc__flight *f, cgc_status *st) {
  if (f->batch_failed) {
    cgc__status_set(st, GRPC_STATUS_INTERNAL, "cannot start a call batch");
    return CGC_ERPC;
  }
  if (f->local_rc) {
    cgc__status_set(st,
                    f->local_rc == CGC_EPROTO ? GRPC_STATUS_INTERNAL
                                              : GRPC_STATUS_RESOURCE_EXHAUSTED,
                    "%s", a->perr);
    return f->local_rc;
  }
  if (f->io.code != GRPC_STATUS_OK) {
    cgc__status_from_grpc(st, f->io.code, f->io.details);
    return CGC_ERPC;
  }
  if (!a->have_header || !cgc__all_in(a)) {
    cgc__status_set(st, GRPC_STATUS_INTERNAL, "malformed response: %s",
                    a->have_header ? "the stream ended before all data"
                                   : "no ResultHeader");
    return CGC_EPROTO;
  }
  if (a->check_failed) {
    *st = a->check_st;
    return CGC_ERPC;
  }
  a->res.total_ms = cgc__now_ms() - f->t0;
  a->res.download_ms = f->t_all_in - a->t_header;
  cgc__status_ok(st);
  return 0;
}

static void cgc__attempt_begin(cgc__job *j);

/* Ends the call with rc (st filled). */
static void cgc__job_end(cgc__job *j, int rc) {
  /* Where the channel asks again itself; else the split counts. */
  if (j->check_failures && j->ch->verify_retries)
    cgc__verify_settled(j->ch->vf, rc);
  j->a.res.attempts = cgc__retry_attempts(&j->retry);
  j->rc = rc;
  j->ended = 1;
}

/* The region of the call's k-th input (k < 3) or output, NULL when it is
 * in none or in one an earlier k named. */
static const cgc_region *cgc__region_at(const cgc__attempt *a, int k) {
  const cgc_region *r = k < 3 ? a->in_reg[k] : a->out_reg[k - 3];
  for (int i = 0; r && i < k; i++)
    if ((i < 3 ? a->in_reg[i] : a->out_reg[i - 3]) == r)
      return NULL;
  return r;
}

/* A call's regions were unknown to the server (it restarted since they
 * were registered, or dropped them after --region-idle-timeout unused):
 * registers the next one from j->reg_next again, one RegisterRegion call
 * after another on the call's queue; once all are, the call starts again
 * with a fresh backoff. A failure ends the call with the attempt's code
 * and the registration's status. */
static void cgc__register_next(cgc__job *j) {
  while (j->reg_next < 3 + CG_GRAD_COUNT && !cgc__region_at(&j->a, j->reg_next))
    j->reg_next++;
  if (j->reg_next == 3 + CG_GRAD_COUNT) {
    cgc__retry_init(&j->retry, j->ch, j->retry.t.deadline,
                    cgc__retry_attempts(&j->retry));
    cgc__attempt_begin(j);
    return;
  }
  j->reg_try = (cgc__try){cgc__deadline(j->ch, 0), 0, -1};
  if (cgc__region_register_start(&j->reg, j->ch,
                                 cgc__region_at(&j->a, j->reg_next), j->cq,
                                 &j->reg_tag, &j->reg_try, &j->st) != 0)
    cgc__job_end(j, CGC_ERPC);
}

/* Notes which staged inputs the server named missing in md. */
static void cgc__find_missing(cgc__attempt *a, const grpc_metadata_array *md) {
  char hex[2 * CGC_STAGED_ID_BYTES + 1];
  for (size_t k = 0; k < md->count; k++) {
    if (grpc_slice_str_cmp(md->metadata[k].key, CGC__MISSING_STAGED_KEY))
      continue;
    const char *v = (const char *)GRPC_SLICE_START_PTR(md->metadata[k].value);
    size_t n = GRPC_SLICE_LENGTH(md->metadata[k].value);
    for (int i = 0; i < a->nin; i++) {
      if (!cgc__by_id(a, i))
        continue;
      for (size_t b = 0; b < CGC_STAGED_ID_BYTES; b++)
        snprintf(hex + 2 * b, 3, "%02x", a->req->inputs[i].staged[b]);
      for (size_t at = 0; at + sizeof hex - 1 <= n; at += sizeof hex)
        if (memcmp(v + at, hex, sizeof hex - 1) == 0)
          a->staged_missing |= 1u << i;
    }
  }
}

/* Tells the channel's stage watch (cgc__stage_seen) how the call's first
 * attempt that reached a server with staged ids fared. */
static void cgc__stage_note(cgc__job *j, int rc) {
  cgc__attempt *a = &j->a;
  if (rc == CGC_ERPC && j->st.code == GRPC_STATUS_UNAVAILABLE)
    cgc__stage_unavailable(j->ch);
  int miss = rc == CGC_ERPC && j->st.code == GRPC_STATUS_NOT_FOUND &&
             a->staged_missing;
  if (j->stage_noted || (rc && !miss))
    return;
  unsigned ids = 0;
  for (int i = 0; i < a->nin; i++)
    ids |= cgc__by_id(a, i) ? 1u << i : 0;
  if (!ids)
    return;
  j->stage_noted = 1;
  cgc__stage_seen(j->ch, a->req, ids, miss ? a->staged_missing : 0);
}

/* The call's attempt ended with rc (st filled): retries it after a wait,
 * or, for staged inputs the server lost, at once with their bytes, or
 * registers the call's regions anew and tries again, or ends the call
 * (j->ended). */
static void cgc__attempt_end(cgc__job *j, int rc) {
  cgc__attempt *a = &j->a;
  cgc__stage_note(j, rc);
  if (rc)
    cgc__drop_out(a, ~a->done);
  if (a->check_failed && cgc__verify_failure(rc, &j->st)) {
    /* The outputs that failed their check, asked for again at once (of
     * round_robin's next address, on a list target), and checked again. */
    j->check_failures++;
    if (!j->cancelled && j->check_retries > 0) {
      j->check_retries--;
      cgc__retry_init(&j->retry, j->ch, j->retry.t.deadline,
                      cgc__retry_attempts(&j->retry));
      cgc__attempt_begin(j);
      return;
    }
    cgc__job_end(j, rc);
    return;
  }
  if (!j->cancelled && cgc__retry_next(&j->retry, rc, &j->st)) {
    if (cgc__retry_watch(&j->retry, 1, 0, j->cq, &j->wait_tag))
      cgc__attempt_begin(j);
    return;
  }
  if (rc == CGC_ERPC && j->st.code == GRPC_STATUS_NOT_FOUND &&
      a->staged_missing) {
    /* Evicted, expired or lost in a restart: the bytes go with the call
     * (the caller still has them), so that a retry never waits on the
     * store again; those of every staged input, since the retry may reach
     * another server (round_robin over a list), which may lack the others
     * too. */
    for (int i = 0; i < a->nin; i++)
      a->staged_as_bytes |= cgc__by_id(a, i) ? 1u << i : 0;
    a->staged_missing = 0;
    cgc__retry_init(&j->retry, j->ch, j->retry.t.deadline,
                    cgc__retry_attempts(&j->retry));
    cgc__attempt_begin(j);
    return;
  }
  if (rc == CGC_ERPC && j->st.code == GRPC_STATUS_NOT_FOUND && a->in_regions &&
      !j->registered_again) {
    j->registered_again = 1;
    cgc__register_next(j);
    return;
  }
  cgc__job_end(j, rc);
}

/* Ends the attempt once no batch of it is pending. */
static void cgc__attempt_settle(cgc__job *j) {
  cgc__flight *f = &j->f;
  if (f->batch_failed) {
    /* Everything pending completes (as failed) after a cancel. */
    grpc_call_cancel(f->call, NULL);
    f->sending = 0;
  }
  if (f->send_busy || f->recv_busy || f->status_busy)
    return;
  int rc = cgc__outcome(&j->a, f, &j->st);
  j->retry.t.retry_after_ms = cgc__call_io_retry_after(&f->io);
  if (f->io.code == GRPC_STATUS_NOT_FOUND)
    cgc__find_missing(&j->a, &f->io.trailing_md);
  grpc_call_unref(f->call);
  f->call = NULL;
  j->a.call = NULL;
  cgc__call_io_free(&f->io);
  cgc__attempt_end(j, rc);
}

/* Starts an attempt of the call (j->retry.t numbers it); it may end at
 * once (j->ended). */
static void cgc__attempt_begin(cgc__job *j) {
  cgc__attempt *a = &j->a;
  cgc__flight *f = &j->f;
  if (j->cancelled) { /* in a retry's wait when it was cancelled */
    cgc__status_set(&j->st, GRPC_STATUS_CANCELLED, "cancelled");
    cgc__attempt_end(j, CGC_ERPC);
    return;
  }
  memset(f, 0, sizeof *f);
  f->t0 = cgc__now_ms();
  cgc__call_io_init(&f->io, j->ch, j->retry.t.retry);
  cgc__attempt_reset(a);
  f->io.send_bb = cgc__encode_header(a);
  int rc = 0;
  if (cgc__upload_left(a))
    rc = cgc__pin_inputs(a, &j->st);
  if (!rc) {
    f->call = grpc_channel_create_call(
        j->ch->chan, NULL, GRPC_PROPAGATE_DEFAULTS, j->cq,
        grpc_slice_from_static_string("/convgrad.v1.ConvGrad/Compute"), NULL,
        j->retry.t.deadline, NULL);
    if (!f->call) {
      cgc__status_set(&j->st, GRPC_STATUS_INTERNAL, "cannot create the call");
      rc = CGC_ERPC;
    }
    a->call = f->call;
  }
  if (rc) {
    cgc__call_io_free(&f->io);
    cgc__attempt_end(j, rc);
    return;
  }
  if (cgc__open(j) != 0)
    f->batch_failed = 1;
  cgc__attempt_settle(j);
}

/* Runs an event of j's with j->mu held; tells the listener once the call
 * ended, after the last use of j here (it may free j). */
static void cgc__job_event(cgc__job *j, void (*handle)(cgc__job *, int),
                           int success) {
  pthread_mutex_lock(&j->mu);
  handle(j, success);
  int ended = j->ended;
  cgc__end_fn on_end = j->on_end;
  void *arg = j->end_arg;
  pthread_mutex_unlock(&j->mu);
  if (ended)
    on_end(arg);
}

static void cgc__handle_sent(cgc__job *j, int success) {
  cgc__on_sent(j, success);
  cgc__attempt_settle(j);
}

static void cgc__handle_received(cgc__job *j, int success) {
  (void)success; /* a failed receive leaves recv_bb NULL: the stream ended */
  cgc__on_received(j);
  cgc__attempt_settle(j);
}

static void cgc__handle_status(cgc__job *j, int success) {
  (void)success; /* the status batch always completes with a status */
  j->f.status_busy = 0;
  cgc__attempt_settle(j);
}

static void cgc__handle_all(cgc__job *j, int success) {
  (void)success; /* as the receive's and the status's */
  j->f.status_busy = 0;
  cgc__on_received(j);
  cgc__attempt_settle(j);
}

static void cgc__handle_registered(cgc__job *j, int success) {
  (void)success; /* its one batch ends with a status */
  if (cgc__unary_end(&j->reg, &j->reg_try, NULL, NULL, &j->st) != 0) {
    cgc__job_end(j, CGC_ERPC);
    return;
  }
  j->reg_next++;
  cgc__register_next(j);
}

static void cgc__handle_wait(cgc__job *j, int success) {
  if (cgc__retry_watch(&j->retry, 0, success, j->cq, &j->wait_tag))
    cgc__attempt_begin(j);
}

static void cgc__on_send_tag(cgc__tag *tag, int success) {
  cgc__job_event(CGC__JOB_OF(tag, send_tag), cgc__handle_sent, success);
}

static void cgc__on_recv_tag(cgc__tag *tag, int success) {
  cgc__job_event(CGC__JOB_OF(tag, recv_tag), cgc__handle_received, success);
}

static void cgc__on_status_tag(cgc__tag *tag, int success) {
  cgc__job_event(CGC__JOB_OF(tag, status_tag), cgc__handle_status, success);
}

static void cgc__on_all_tag(cgc__tag *tag, int success) {
  cgc__job_event(CGC__JOB_OF(tag, all_tag), cgc__handle_all, success);
}

static void cgc__on_reg_tag(cgc__tag *tag, int success) {
  cgc__job_event(CGC__JOB_OF(tag, reg_tag), cgc__handle_registered, success);
}

static void cgc__on_wait_tag(cgc__tag *tag, int success) {
  cgc__job_event(CGC__JOB_OF(tag, wait_tag), cgc__handle_wait, success);
}

void cgc__job_cancel(cgc__job *j) {
  pthread_mutex_lock(&j->mu);
  j->cancelled = 1;
  if (j->f.call)
    grpc_call_cancel(j->f.call, NULL);
  pthread_mutex_unlock(&j->mu);
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

unsigned cgc__request_wants(const cgc_request *req, cgc_status *st) {
  if (req->op < CG_OP_CONV_BWD_DATA || req->op > CG_OP_DECONV_BWD) {
    cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT, "op: invalid (%d)",
                    (int)req->op);
    return 0;
  }
  if (!cg_op_is_layer(req->op)) {
    if (req->grads || req->weights_output_layout) {
      cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                      "%s: %s has one output; grads and "
                      "weights_output_layout are for the layer ops",
                      req->grads ? "grads" : "weights_output_layout",
                      cg_op_name(req->op));
      return 0;
    }
    return CG_GRAD_BIT(cg_op_outputs_weights(req->op) ? CG_GRAD_DIFF_WEIGHTS
                                                      : CG_GRAD_DIFF_SRC);
  }
  if (req->grads & ~CG_GRADS_ALL) {
    cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                    "grads: unknown output in mask 0x%x", req->grads);
    return 0;
  }
  if (req->has_shape_input) {
    cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                    "shape_input: %s takes src, diff_dst and weights only",
                    cg_op_name(req->op));
    return 0;
  }
  return req->grads ? req->grads : CG_GRADS_ALL;
}

/* Finds which of a's inputs and caller buffers lie in regions registered
 * on ch; returns 1 when any does. */
static int cgc__find_regions(cgc__attempt *a, cgc_channel *ch) {
  int any = 0;
  for (int i = 0; i < a->nin; i++) {
    const cgc_tensor_view *v = &a->req->inputs[i];
    a->in_reg[i] = v->nbytes
                       ? cgc__region_find(ch, v->data, v->nbytes, &a->in_off[i])
                       : NULL;
    any |= a->in_reg[i] != NULL;
  }
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    a->out_reg[g] =
        (a->wants_all & CG_GRAD_BIT(g)) && a->into[g]
            ? cgc__region_find(ch, a->into[g], a->into_cap[g], &a->out_off[g])
            : NULL;
    any |= a->out_reg[g] != NULL;
  }
  return any;
}

int cgc__job_new(cgc__job **out, cgc_channel *ch, const cgc_request *req,
                 void *const *into, const size_t *into_cap,
                 cgc__check_mode check, cgc_status *st) {
  int rc;
  *out = NULL;
  unsigned wants = cgc__request_wants(req, st);
  if (!wants)
    return CG_EINVAL;
  int nin = cg_op_is_layer(req->op) ? 3 : 2;
  for (int i = 0; i < nin; i++)
    if ((rc = cgc__check_view(&req->inputs[i], i, st)) != 0)
      return rc;
  if (req->has_shape_input &&
      (req->shape_input.len == 0 || req->shape_input.len > CG_MAX_RANK ||
       !req->shape_input.v)) {
    cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                    "shape_input: must have 1..%d values", CG_MAX_RANK);
    return CG_EINVAL;
  }
  cgc__job *j = calloc(1, sizeof *j);
  if (!j) {
    cgc__status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return CG_ENOMEM;
  }
  cgc__attempt *a = &j->a;
  j->ch = ch;
  pthread_mutex_init(&j->mu, NULL);
  j->send_tag.run = cgc__on_send_tag;
  j->recv_tag.run = cgc__on_recv_tag;
  j->status_tag.run = cgc__on_status_tag;
  j->all_tag.run = cgc__on_all_tag;
  j->wait_tag.run = cgc__on_wait_tag;
  j->reg_tag.run = cgc__on_reg_tag;
  a->wants_all = wants;
  a->nin = nin;
  a->req = req;
  a->opts = &ch->opts;
  for (int g = 0; into && g < CG_GRAD_COUNT; g++) {
    a->into[g] = into[g];
    a->into_cap[g] = into_cap[g];
  }
  a->in_regions = cgc__find_regions(a, ch);
  /* Staging is off on this channel: staged views go as bytes at once. */
  for (int i = 0; i < nin && cgc__stage_off(ch); i++)
    a->staged_as_bytes |= req->inputs[i].staged ? 1u << i : 0;
  a->vf = ch->vf;
  j->check_retries = ch->verify_retries;
  if (cgc__verify_pick(ch->vf, req, check, &a->check_seed)) {
    cg_problem p;
    char err[256];
    cgc__request_problem(req, &p);
    /* A request the kernels refuse is the server's to refuse. */
    a->checking = cg_layer_resolve(&p, &a->check_layer, err, sizeof err) == 0;
  }
  *out = j;
  return 0;
}

unsigned cgc__job_wants(const cgc__job *j) {
  return j->a.wants_all;
}

void cgc__job_start(cgc__job *j, grpc_completion_queue *cq,
                    gpr_timespec deadline, cgc__whole_fn on_whole,
                    cgc__end_fn on_end, void *arg) {
  pthread_mutex_lock(&j->mu);
  j->cq = cq;
  j->a.on_whole = on_whole;
  j->a.whole_arg = arg;
  j->on_end = on_end;
  j->end_arg = arg;
  cgc__retry_init(&j->retry, j->ch, deadline, 0);
  cgc__attempt_begin(j);
  int ended = j->ended;
  pthread_mutex_unlock(&j->mu);
  if (ended)
    on_end(arg);
}

int cgc__job_result(cgc__job *j, cgc_result *res, cgc_status *st) {
  if (res)
    *res = j->a.res;
  if (st)
    *st = j->st;
  return j->rc;
}

void cgc__job_take(cgc__job *j, cgc_tensor *out[CG_GRAD_COUNT]) {
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    out[g] = j->a.out[g];
    j->a.out[g] = NULL;
  }
}

void cgc__job_free(cgc__job *j) {
  if (!j)
    return;
  if (j->a.pin) {
    cgc__pin_release(j->a.pin);
    j->a.pin = NULL;
  }
  cgc__drop_out(&j->a, ~0u);
  pthread_mutex_destroy(&j->mu);
  free(j);
}

/* cgc__job_start's listener for a call this thread drives. */
static void cgc__set_ended(void *arg) {
  *(int *)arg = 1;
}

/* The call runs on this thread, on a completion queue of its own: handing
 * it to the engine's thread and back would cost two thread wake-ups per
 * call (tests/README.md, "Design figures"). */
int cgc__compute(cgc_channel *ch, const cgc_request *req, void *const *into,
                 const size_t *into_cap, cgc__check_mode check,
                 cgc_tensor *out[CG_GRAD_COUNT], cgc_result *res,
                 cgc_status *st) {
  cgc__job *j;
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    out[g] = NULL;
  int rc = cgc__job_new(&j, ch, req, into, into_cap, check, st);
  if (rc)
    return rc;
  grpc_completion_queue *cq = cgc__cq_take(ch);
  int ended = 0;
  cgc__job_start(j, cq, cgc__deadline(ch, req->deadline_ms), NULL,
                 cgc__set_ended, &ended);
  while (!ended) {
    /* The call's deadline bounds every batch; its waits end by then too. */
    grpc_event ev = grpc_completion_queue_next(
        cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    if (ev.type == GRPC_OP_COMPLETE)
      cgc__tag_run(ev);
  }
  cgc__cq_give(ch, cq);
  rc = cgc__job_result(j, res, st);
  if (!rc)
    cgc__job_take(j, out);
  cgc__job_free(j);
  return rc;
}
