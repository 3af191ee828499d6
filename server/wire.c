/* wire.c - the server's side of the shared wire codec (proto/cgw.c):
 * requests that set neither member are an error here, and errors name the
 * request. */
#include "cgs_wire.h"

#include <stdio.h>
#include <string.h>

#include "cg/error.h"

grpc_status_code cgs_wire_status(int cg_rc) {
  switch (cg_rc) {
  case CG_EINVAL:
  case CG_ERANGE:
    return GRPC_STATUS_INVALID_ARGUMENT;
  case CG_ENOMEM:
  case CG_ELIMIT:
    return GRPC_STATUS_RESOURCE_EXHAUSTED;
  case CG_EUNSUPPORTED:
    return GRPC_STATUS_UNIMPLEMENTED;
  case CG_EDATALOSS:
    return GRPC_STATUS_DATA_LOSS;
  default:
    return GRPC_STATUS_INTERNAL;
  }
}

int cgs_wire_scan_request(grpc_byte_buffer *bb, cgs_msg_kind *kind,
                          cgs_chunk_view *chunk, char *err, size_t errlen) {
  cgw_view v;
  char why[128];
  memset(chunk, 0, sizeof *chunk);
  if (cgw_scan_request(bb, &v, why, sizeof why) != 0) {
    snprintf(err, errlen, "request: malformed ComputeRequest message: %s", why);
    return -1;
  }
  if (v.kind == CGW_NONE) {
    snprintf(err, errlen, "request: message sets neither header nor chunk");
    return -1;
  }
  *kind = (cgs_msg_kind)v.kind;
  if (v.kind == CGW_CHUNK) {
    chunk->input = v.input;
    chunk->data_off = v.off;
    chunk->data_len = v.len;
  }
  return 0;
}
