/* cgs_upload.h - a Compute request's tensors as they arrive (upload.c):
 * the header message decoded and checked, the input buffers, the data
 * chunks assembled in order, the shape tensor read, and the layer resolved
 * from all of it against the limits.
 *
 * No gRPC call and no server state: the Compute call (call.c) adds the
 * in-flight reservation, the pool and the timers around it, and the fuzzer
 * (tests/fuzz) drives it alone. Every refusal is a gRPC status and a
 * message that names the field. Not thread-safe: one owner at a time (the
 * call's mutex orders the threads a call crosses). */
#ifndef CGS_UPLOAD_H
#define CGS_UPLOAD_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/byte_buffer.h>
#include <grpc/status.h>

#include "cg/layer.h"
#include "cgs_config.h"
#include "cgs_region.h"
#include "cgs_store.h"
#include "cgs_wire.h"
#include "convgrad/v1/convgrad.pb-c.h"

typedef struct cgs_upload {
  Convgrad__V1__ComputeRequest *req; /* the header message, owned until
                                        resolved (prob borrows its lists) */
  cg_problem prob;          /* op and dtype set even for a refused header, once
                               read (0 = not read) */
  int ninputs;              /* tensors the request carries */
  size_t in_len[3];         /* bytes of each */
  size_t in_fill[3];        /* bytes of each received so far */
  unsigned char *in_buf[3]; /* cgs_buf_alloc'd, owned */
  int cur;                  /* the input chunks go to; ninputs when complete */
  uint64_t bytes_in;        /* tensor bytes received, inline data included */
  size_t chunk_bytes;       /* response chunk size: asked for, or the default */
  int resolved;             /* layer is valid */
  cg_layer layer;
  int64_t shape_in[CG_MAX_RANK]; /* the shape tensor's values */
  char shapes[160];              /* the input shapes asked for, for the log */

  /* Shared-memory regions: the table references resolve in (NULL: they
   * are refused with shm_refused), and whose regions they name. */
  cgs_regions *regions;
  const char *shm_refused;
  char owner[160];
  size_t in_esize[3];
  const Convgrad__V1__RegionRef *out_ref[CG_GRAD_COUNT]; /* into req */
  /* The regions the request uses, one reference each until close (a
   * region named twice is held once). An input in a region has in_buf
   * pointing into it; an output in a region is written at out_at. */
  cgs_region *held[3 + CG_GRAD_COUNT];
  int nheld;
  cgs_region *in_region[3], *out_region[CG_GRAD_COUNT]; /* in held */
  unsigned char *out_at[CG_GRAD_COUNT];

  /* Staged tensors: the store inputs name entries of (NULL: refused),
   * in owner's scope, and peer's private ones. An input found there holds
   * a reference until close and has in_buf pointing at the entry's
   * bytes. */
  cgs_store *store;
  char peer[CGS_STORE_KEY_MAX];
  cgs_staged *in_staged[3];
  /* The hex ids of the staged inputs the store lacked, comma-separated,
   * for the trailing metadata of the NOT_FOUND (CGS_MISSING_STAGED_KEY). */
  char missing[3 * (2 * CGS_STORE_ID_BYTES + 1)];

  /* A Stage call's upload (cgs_upload_stage_header): one input, the
   * entry's bytes, hashed as they arrive unless the id is private. */
  Convgrad__V1__StageRequest *stage_req; /* the header message until alloc */
  unsigned char stage_id[CGS_STORE_ID_BYTES];
  int stage_private; /* StageHeader.private_id: nothing hashed */
  void *stage_sha;   /* EVP_MD_CTX, owned; NULL for a private id */
} cgs_upload;

/* The trailing metadata key of a Compute call's NOT_FOUND for staged
 * tensors: the missing ids in hex, comma-separated. */
#define CGS_MISSING_STAGED_KEY "convgrad-missing-staged"

/* Sets u empty. */
void cgs_upload_init(cgs_upload *u);
/* Lets u's request use owner's regions in rs (owner NULL: ""); rs NULL
 * refuses them with refused, a static text. Before cgs_upload_header. */
void cgs_upload_use_regions(cgs_upload *u, cgs_regions *rs, const char *refused,
                            const char *owner);
/* Lets u's request name staged tensors of st (NULL: refused) in the scope
 * of the owner given to cgs_upload_use_regions, and the private entries
 * of peer (the caller's charge in st; NULL: ""). Before
 * cgs_upload_header. */
void cgs_upload_use_store(cgs_upload *u, cgs_store *st, const char *peer);
/* Frees u's buffers and header message; u is empty again. */
void cgs_upload_close(cgs_upload *u);
/* Frees the input buffers alone (not those in regions), once no chunk
 * will be taken any more; what u says of the request stays. */
void cgs_upload_free_inputs(cgs_upload *u);

/* Decodes the first message, which must carry the header, and checks it
 * against cfg's limits. Returns 0, or -1 with *code and msg. */
int cgs_upload_header(cgs_upload *u, grpc_byte_buffer *bb,
                      const cgs_config *cfg, grpc_status_code *code, char *msg,
                      size_t msglen);
/* Bytes the server holds for the inputs: those neither in regions nor
 * staged. */
uint64_t cgs_upload_in_bytes(const cgs_upload *u);
/* Allocates every input and copies the header's inline data into it; an
 * input in a region or staged is found there, complete. Returns 0, or -1
 * with RESOURCE_EXHAUSTED, a region's refusal (NOT_FOUND,
 * INVALID_ARGUMENT, FAILED_PRECONDITION), or NOT_FOUND naming every staged
 * input the store lacks (their ids in missing), INVALID_ARGUMENT for an
 * entry of another size, FAILED_PRECONDITION without a store. A Stage
 * upload: its buffer, with the header's data. */
int cgs_upload_alloc(cgs_upload *u, grpc_status_code *code, char *msg,
                     size_t msglen);
/* 1 while resolving must wait for the bytes of a shape tensor. */
int cgs_upload_needs_shape(const cgs_upload *u);
/* The checks a resolved layer passes before it may run on this server:
 * the spatial limits, --max-request-flops and --max-tensor-elements of
 * each output. Returns 0, or -1 with code and msg (naming the flag). */
int cgs_upload_check_layer(const cg_layer *l, const cgs_config *cfg,
                           grpc_status_code *code, char *msg, size_t msglen);
/* Resolves the layer (with the shape tensor's values, if any), checks it
 * against --max-request-flops and --max-tensor-elements, finds the output
 * regions and frees the header message. Returns 0, or -1 with *code and
 * msg. */
int cgs_upload_resolve(cgs_upload *u, const cgs_config *cfg,
                       grpc_status_code *code, char *msg, size_t msglen);
/* Bytes of every output asked for that streams back (not written into
 * a region), once resolved. */
uint64_t cgs_upload_out_bytes(const cgs_upload *u);

/* Takes a data chunk of bb (v from cgs_wire_scan_request): it must go to
 * the current input and fit. Returns 0, or -1 with INVALID_ARGUMENT and
 * msg; u's counts are unchanged then. */
int cgs_upload_chunk(cgs_upload *u, const cgs_chunk_view *v,
                     grpc_byte_buffer *bb, grpc_status_code *code, char *msg,
                     size_t msglen);
/* Bytes the inputs still lack. */
size_t cgs_upload_missing(const cgs_upload *u);
/* 1 once every input is full. */
int cgs_upload_complete(const cgs_upload *u);
/* A Stage call's first message: decodes and checks the StageHeader
 * (sha256 of 32 bytes, 1 <= byte_size <= --max-request-bytes, data within
 * it) and makes u a one-input upload of byte_size bytes. Returns 0, or -1
 * with *code and msg naming the field. */
int cgs_upload_stage_header(cgs_upload *u, grpc_byte_buffer *bb,
                            const cgs_config *cfg, grpc_status_code *code,
                            char *msg, size_t msglen);
/* Once a Stage upload is complete: 0 when its bytes hash to the id (or
 * the id is private), with
 * *data the buffer (now the caller's, cgs_buf_alloc'd) and *len its size;
 * else -1 with INVALID_ARGUMENT and msg. */
int cgs_upload_stage_take(cgs_upload *u, unsigned char **data, size_t *len,
                          grpc_status_code *code, char *msg, size_t msglen);

/* After the computation: 0 while every region the request used is whole,
 * else -1 with FAILED_PRECONDITION and msg (cgs_region_check). */
int cgs_upload_regions_check(const cgs_upload *u, grpc_status_code *code,
                             char *msg, size_t msglen);

#endif
