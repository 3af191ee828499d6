/* cgs_wire.h - the server's names for the shared wire codec (proto/cgw.h),
 * in the shapes the call code reads: a request's kind, and where a
 * DataChunk's bytes sit. Everything here is thread-safe (no shared
 * state). */
#ifndef CGS_WIRE_H
#define CGS_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/byte_buffer.h>
#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>

#include "cgw.h"

typedef enum {
  CGS_MSG_HEADER = CGW_HEADER, /* ComputeRequest.header is set */
  CGS_MSG_CHUNK = CGW_CHUNK    /* ComputeRequest.chunk is set */
} cgs_msg_kind;

/* Where a DataChunk's bytes sit inside the message. */
typedef struct cgs_chunk_view {
  uint32_t input;  /* DataChunk.input */
  size_t data_off; /* offset of DataChunk.data in the message */
  size_t data_len; /* its length; 0 when absent */
} cgs_chunk_view;

/* Classifies a ComputeRequest without copying its payload. For a chunk,
 * fills *chunk (protobuf merge semantics: the last value of a field wins).
 * Returns 0, or -1 with a message when the bytes are not a well-formed
 * ComputeRequest or set neither member of the oneof. */
int cgs_wire_scan_request(grpc_byte_buffer *bb, cgs_msg_kind *kind,
                          cgs_chunk_view *chunk, char *err, size_t errlen);

/* The status a CG_E* code answers with: INVALID_ARGUMENT for bad input,
 * RESOURCE_EXHAUSTED for limits and memory, UNIMPLEMENTED for what oneDNN
 * lacks, INTERNAL otherwise. */
grpc_status_code cgs_wire_status(int cg_rc);

/* The rest of the codec (copy, pack, unpack, response chunks) is called by
 * its own names, from cgw.h. */

#endif
