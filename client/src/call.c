/* call.c - what every call of the library shares (its batch buffers, the
 * opening and status ops, the completion queues of blocking calls), and
 * the unary call used by Health/Check, GetServerInfo and the region calls:
 * one batch of six ops. A blocking call has a completion queue of its own
 * while it runs, so that calls sharing a channel wait for nothing but their
 * own events; ended calls leave theirs, empty, to the next ones. (The
 * asynchronous calls share the engine's, async.c.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/support/alloc.h>

#include "internal.h"

struct cgc__pin {
  atomic_long refs; /* 1 for the call + 1 per live slice */
};

/* How long cgc__pin_release waits for gRPC to drop the slices. */
#define CGC__PIN_WAIT_MS 30000

cgc__pin *cgc__pin_new(void) {
  cgc__pin *pin = calloc(1, sizeof *pin);
  if (pin)
    atomic_init(&pin->refs, 1);
  return pin;
}

void cgc__pin_ref(cgc__pin *pin) {
  atomic_fetch_add(&pin->refs, 1);
  cgw_tsan_release(pin); /* the pin as made, for the slice's free */
}

void cgc__pin_unref(void *p) {
  cgc__pin *pin = p;
  cgw_tsan_acquire(pin);
  if (atomic_fetch_sub(&pin->refs, 1) == 1)
    free(pin);
}

void cgc__pin_release(cgc__pin *pin) {
  gpr_timespec until =
      gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                   gpr_time_from_millis(CGC__PIN_WAIT_MS, GPR_TIMESPAN));
  while (atomic_load(&pin->refs) > 1 &&
         gpr_time_cmp(gpr_now(GPR_CLOCK_MONOTONIC), until) < 0) {
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
  }
  cgc__pin_unref(pin);
}

/* Copies every byte of bb into one malloc'ed buffer (small messages only).
 * Returns 0, CGC_EPROTO or CG_ENOMEM. */
static int cgc__byte_buffer_flatten(grpc_byte_buffer *bb, void **out,
                                    size_t *len) {
  grpc_byte_buffer_reader reader;
  grpc_slice s;
  size_t n = grpc_byte_buffer_length(bb), off = 0;
  char *buf;
  *out = NULL;
  *len = 0;
  buf = malloc(n ? n : 1);
  if (!buf)
    return CG_ENOMEM;
  if (!grpc_byte_buffer_reader_init(&reader, bb)) {
    free(buf);
    return CGC_EPROTO;
  }
  while (grpc_byte_buffer_reader_next(&reader, &s)) {
    size_t sl = GRPC_SLICE_LENGTH(s);
    /* A decompressed buffer may be longer than its compressed length. */
    if (off + sl > n) {
      char *bigger = realloc(buf, off + sl);
      if (!bigger) {
        grpc_slice_unref(s);
        grpc_byte_buffer_reader_destroy(&reader);
        free(buf);
        return CG_ENOMEM;
      }
      buf = bigger;
      n = off + sl;
    }
    memcpy(buf + off, GRPC_SLICE_START_PTR(s), sl);
    off += sl;
    grpc_slice_unref(s);
  }
  grpc_byte_buffer_reader_destroy(&reader);
  *out = buf;
  *len = off;
  return 0;
}

void cgc__call_io_init(cgc__call_io *io, const cgc_channel *ch, int retry) {
  memset(io, 0, sizeof *io);
  if (ch->auth_md_count)
    io->md[io->md_count++] = ch->auth_md;
  if (retry > 0) {
    int n = snprintf(io->retry_value, sizeof io->retry_value, "%d", retry);
    io->md[io->md_count].key =
        grpc_slice_from_static_string(CGC__RETRY_ATTEMPT_KEY);
    io->md[io->md_count].value =
        grpc_slice_from_static_buffer(io->retry_value, (size_t)n);
    io->md_count++;
  }
  grpc_metadata_array_init(&io->initial_md);
  grpc_metadata_array_init(&io->trailing_md);
  io->code = GRPC_STATUS_UNKNOWN;
  io->details = grpc_empty_slice();
}

/* The value of key in md as a count of milliseconds, -1 when absent or
 * not plain decimal digits (at most 9: a wait past 11 days is no hint). */
static int64_t cgc__md_millis(const grpc_metadata_array *md, const char *key) {
  for (size_t i = 0; i < md->count; i++) {
    if (grpc_slice_str_cmp(md->metadata[i].key, key) != 0)
      continue;
    const grpc_slice v = md->metadata[i].value;
    size_t n = GRPC_SLICE_LENGTH(v);
    const uint8_t *p = GRPC_SLICE_START_PTR(v);
    int64_t ms = 0;
    if (n == 0 || n > 9)
      return -1;
    for (size_t k = 0; k < n; k++) {
      if (p[k] < '0' || p[k] > '9')
        return -1;
      ms = ms * 10 + (p[k] - '0');
    }
    return ms;
  }
  return -1;
}

int64_t cgc__call_io_retry_after(const cgc__call_io *io) {
  /* A refusal without a response is "Trailers-Only" on the wire; look in
   * both arrays whichever way gRPC surfaces it. */
  int64_t ms = cgc__md_millis(&io->trailing_md, CGC__RETRY_AFTER_KEY);
  return ms >= 0 ? ms : cgc__md_millis(&io->initial_md, CGC__RETRY_AFTER_KEY);
}

grpc_completion_queue *cgc__cq_take(cgc_channel *ch) {
  grpc_completion_queue *cq = NULL;
  pthread_mutex_lock(&ch->cqs_mu);
  if (ch->ncqs)
    cq = ch->cqs[--ch->ncqs];
  pthread_mutex_unlock(&ch->cqs_mu);
  return cq ? cq : grpc_completion_queue_create_for_next(NULL);
}

void cgc__cq_destroy(grpc_completion_queue *cq) {
  grpc_completion_queue_shutdown(cq);
  while (
      grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL)
          .type != GRPC_QUEUE_SHUTDOWN)
    ;
  grpc_completion_queue_destroy(cq);
}

void cgc__cqs_close(cgc_channel *ch) {
  while (ch->ncqs)
    cgc__cq_destroy(ch->cqs[--ch->ncqs]);
}

void cgc__cq_give(cgc_channel *ch, grpc_completion_queue *cq) {
  pthread_mutex_lock(&ch->cqs_mu);
  if (ch->ncqs < CGC__CQ_CACHE) {
    ch->cqs[ch->ncqs++] = cq;
    cq = NULL;
  }
  pthread_mutex_unlock(&ch->cqs_mu);
  if (cq)
    cgc__cq_destroy(cq);
}

void cgc__call_io_free(cgc__call_io *io) {
  if (io->send_bb)
    grpc_byte_buffer_destroy(io->send_bb);
  if (io->recv_bb)
    grpc_byte_buffer_destroy(io->recv_bb);
  io->send_bb = io->recv_bb = NULL;
  grpc_slice_unref(io->details);
  io->details = grpc_empty_slice();
  gpr_free((void *)io->error_string);
  io->error_string = NULL;
  grpc_metadata_array_destroy(&io->initial_md);
  grpc_metadata_array_destroy(&io->trailing_md);
}

void cgc__ops_one_message(grpc_op ops[5], cgc__call_io *io) {
  memset(ops, 0, 5 * sizeof *ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[0].data.send_initial_metadata.count = io->md_count;
  ops[0].data.send_initial_metadata.metadata = io->md;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = io->send_bb;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &io->initial_md;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &io->recv_bb;
}

void cgc__op_recv_status(grpc_op *op, cgc__call_io *io) {
  memset(op, 0, sizeof *op);
  op->op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  op->data.recv_status_on_client.trailing_metadata = &io->trailing_md;
  op->data.recv_status_on_client.status = &io->code;
  op->data.recv_status_on_client.status_details = &io->details;
  op->data.recv_status_on_client.error_string = &io->error_string;
}

int cgc__unary_start(cgc__unary_call *u, cgc_channel *ch,
                     grpc_completion_queue *cq, cgc__tag *tag,
                     const char *method, const void *req, size_t reqlen,
                     const cgc__try *t, cgc_status *st) {
  grpc_op ops[6];
  u->method = method;
  cgc__call_io_init(&u->io, ch, t->retry);
  grpc_slice payload = grpc_slice_from_copied_buffer(req, reqlen);
  u->io.send_bb = grpc_raw_byte_buffer_create(&payload, 1);
  grpc_slice_unref(payload);
  u->call = grpc_channel_create_call(ch->chan, NULL, GRPC_PROPAGATE_DEFAULTS,
                                     cq, grpc_slice_from_static_string(method),
                                     NULL, t->deadline, NULL);
  cgc__ops_one_message(ops, &u->io);
  cgc__op_recv_status(&ops[5], &u->io);
  if (u->call &&
      grpc_call_start_batch(u->call, ops, 6, tag ? cgc__tag_give(tag) : NULL,
                            NULL) == GRPC_CALL_OK)
    return 0;
  cgc__status_set(st, GRPC_STATUS_INTERNAL, "cannot start a call to %s",
                  method);
  if (u->call)
    grpc_call_unref(u->call);
  cgc__call_io_free(&u->io);
  return CGC_ERPC;
}

int cgc__unary_end(cgc__unary_call *u, cgc__try *t, void **resp,
                   size_t *resplen, cgc_status *st) {
  int rc = 0;
  if (resp) {
    *resp = NULL;
    *resplen = 0;
  }
  if (u->io.code != GRPC_STATUS_OK) {
    cgc__status_from_grpc(st, u->io.code, u->io.details);
    t->retry_after_ms = cgc__call_io_retry_after(&u->io);
    rc = CGC_ERPC;
  } else if (!u->io.recv_bb) {
    cgc__status_set(st, GRPC_STATUS_INTERNAL, "%s: empty response", u->method);
    rc = CGC_EPROTO;
  } else if (resp && (rc = cgc__byte_buffer_flatten(u->io.recv_bb, resp,
                                                    resplen)) != 0) {
    cgc__status_set(st, GRPC_STATUS_INTERNAL, "%s: cannot read the response",
                    u->method);
  }
  grpc_call_unref(u->call);
  cgc__call_io_free(&u->io);
  return rc;
}

int cgc__unary(cgc_channel *ch, const char *method, const void *req,
               size_t reqlen, cgc__try *t, void **resp, size_t *resplen,
               cgc_status *st) {
  cgc__unary_call u;
  *resp = NULL;
  *resplen = 0;
  grpc_completion_queue *cq = cgc__cq_take(ch);
  int rc = cgc__unary_start(&u, ch, cq, NULL, method, req, reqlen, t, st);
  if (rc == 0) {
    /* The call's deadline bounds this wait; its one batch always
     * completes, with a status. */
    grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    rc = cgc__unary_end(&u, t, resp, resplen, st);
  }
  cgc__cq_give(ch, cq);
  return rc;
}
