/* call.c - the unary gRPC call used by Health/Check and GetServerInfo:
 * one batch of six ops on a completion queue owned by the call, so a
 * shared channel needs no locking. */
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/support/alloc.h>

#include "internal.h"

int cgc__byte_buffer_flatten(grpc_byte_buffer *bb, void **out, size_t *len) {
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

void cgc__call_end(grpc_call *call, grpc_completion_queue *cq) {
  if (call)
    grpc_call_unref(call);
  grpc_completion_queue_shutdown(cq);
  while (
      grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL)
          .type != GRPC_QUEUE_SHUTDOWN)
    ;
  grpc_completion_queue_destroy(cq);
}

void cgc__ops_one_message(grpc_op ops[5], grpc_byte_buffer *send_bb,
                          grpc_metadata_array *initial_md,
                          grpc_byte_buffer **recv_bb) {
  memset(ops, 0, 5 * sizeof *ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = send_bb;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = initial_md;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = recv_bb;
}

void cgc__op_recv_status(grpc_op *op, grpc_metadata_array *trailing_md,
                         grpc_status_code *code, grpc_slice *details,
                         const char **error_string) {
  memset(op, 0, sizeof *op);
  op->op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  op->data.recv_status_on_client.trailing_metadata = trailing_md;
  op->data.recv_status_on_client.status = code;
  op->data.recv_status_on_client.status_details = details;
  op->data.recv_status_on_client.error_string = error_string;
}

int cgc__unary(cgc_channel *ch, const char *method, const void *req,
               size_t reqlen, gpr_timespec deadline, void **resp,
               size_t *resplen, cgc_status *st) {
  int rc = 0;
  grpc_completion_queue *cq = NULL;
  grpc_call *call = NULL;
  grpc_byte_buffer *send_bb = NULL, *recv_bb = NULL;
  grpc_metadata_array initial_md, trailing_md;
  grpc_status_code code = GRPC_STATUS_UNKNOWN;
  grpc_slice details = grpc_empty_slice();
  const char *error_string = NULL;
  grpc_op ops[6];
  grpc_event ev;

  *resp = NULL;
  *resplen = 0;
  grpc_metadata_array_init(&initial_md);
  grpc_metadata_array_init(&trailing_md);

  grpc_slice payload = grpc_slice_from_copied_buffer(req, reqlen);
  send_bb = grpc_raw_byte_buffer_create(&payload, 1);
  grpc_slice_unref(payload);

  cq = grpc_completion_queue_create_for_next(NULL);
  call = grpc_channel_create_call(ch->chan, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                  grpc_slice_from_static_string(method), NULL,
                                  deadline, NULL);
  if (!call) {
    cgc__status_set(st, GRPC_STATUS_INTERNAL, "cannot create a call to %s",
                    method);
    rc = CGC_ERPC;
    goto out;
  }
  cgc__ops_one_message(ops, send_bb, &initial_md, &recv_bb);
  cgc__op_recv_status(&ops[5], &trailing_md, &code, &details, &error_string);
  if (grpc_call_start_batch(call, ops, 6, (void *)1, NULL) != GRPC_CALL_OK) {
    cgc__status_set(st, GRPC_STATUS_INTERNAL, "cannot start a call to %s",
                    method);
    rc = CGC_ERPC;
    goto out;
  }
  /* The call's deadline bounds this wait. */
  ev =
      grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
  if (ev.type != GRPC_OP_COMPLETE || code != GRPC_STATUS_OK) {
    if (ev.type != GRPC_OP_COMPLETE)
      cgc__status_set(st, GRPC_STATUS_INTERNAL, "completion queue failed");
    else
      cgc__status_from_grpc(st, code, details);
    rc = CGC_ERPC;
    goto out;
  }
  if (!recv_bb) {
    cgc__status_set(st, GRPC_STATUS_INTERNAL, "%s: empty response", method);
    rc = CGC_EPROTO;
    goto out;
  }
  rc = cgc__byte_buffer_flatten(recv_bb, resp, resplen);
  if (rc)
    cgc__status_set(st, GRPC_STATUS_INTERNAL, "%s: cannot read the response",
                    method);
out:
  cgc__call_end(call, cq);
  grpc_byte_buffer_destroy(send_bb);
  if (recv_bb)
    grpc_byte_buffer_destroy(recv_bb);
  grpc_slice_unref(details);
  gpr_free((void *)error_string);
  grpc_metadata_array_destroy(&initial_md);
  grpc_metadata_array_destroy(&trailing_md);
  return rc;
}
