/* cgs_header.h - the ComputeHeader a call opens with, checked and turned
 * into a cg_problem and the byte sizes of its inputs.
 *
 * Everything the header alone can tell is checked here: the op and enum
 * values, the tensor count, dtypes, layouts against the format attributes,
 * shapes, and the element and request-size limits. The geometry (whether
 * the shapes and attributes make a convolution) is the kernels' job
 * (cg_problem_resolve). No call state, no gRPC: a refusal is a status code
 * and a message that names the field. Called on the completion-queue
 * thread; no shared state, so any thread could. */
#ifndef CGS_HEADER_H
#define CGS_HEADER_H

#include <stddef.h>

#include <grpc/status.h>

#include "cg/problem.h"
#include "cgs_config.h"
#include "convgrad/v1/convgrad.pb-c.h"

/* Largest response chunk we send, whatever the client asks for: stays
 * under gRPC's default 4 MiB receive limit with room for framing. */
#define CGS_MAX_CHUNK_BYTES (4u * 1024 * 1024 - 1024)
/* Smallest a client may ask for: the floor of --chunk-bytes too. */
#define CGS_MIN_CHUNK_BYTES 1024u

typedef struct cgs_header_info {
  cg_problem prob;    /* its lists point into the header: keep it alive */
  int ninputs;        /* 2, 3 with a shape tensor, 3 for the layer ops */
  size_t in_len[3];   /* bytes of each input */
  size_t in_esize[3]; /* bytes of one of its elements */
  /* header.output_regions by cg_grad (NULL: streamed back); they point
   * into the header */
  const Convgrad__V1__RegionRef *out_region[CG_GRAD_COUNT];
  size_t chunk_bytes; /* response chunk size: asked for, or cfg's default */
} cgs_header_info;

/* Checks h against cfg's limits and fills *info. Returns 0, or -1 with
 * *code (INVALID_ARGUMENT or RESOURCE_EXHAUSTED) and msg filled; then
 * info->prob.op and .dtype are still set (0 = not read) when the refusal
 * came after they were checked. */
int cgs_header_check(const Convgrad__V1__ComputeHeader *h,
                     const cgs_config *cfg, cgs_header_info *info,
                     grpc_status_code *code, char *msg, size_t msglen);

#endif
