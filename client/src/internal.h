/* internal.h - what the libcgclient sources share: the channel struct, the
 * retry loop and the unary-call helper. Not installed. */
#ifndef CGC_INTERNAL_H
#define CGC_INTERNAL_H

#include <pthread.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/support/time.h>

#include "cgc/client.h"

struct cgc_channel {
  grpc_channel *chan;
  cgc_options opts; /* immutable after cgc_channel_new */
  char *target;
  /* The token's metadata, sent with every call; count 0 without one. */
  grpc_metadata auth_md;
  size_t auth_md_count;
  /* Regions registered through this channel (region.c). */
  pthread_mutex_t regions_mu;
  cgc_region *regions;
};

/* Writes code and a printf-style message into st (may be NULL). */
void cgc__status_set(cgc_status *st, grpc_status_code code, const char *fmt,
                     ...) __attribute__((format(printf, 3, 4)));
/* Copies a gRPC status (details slice) into st. */
void cgc__status_from_grpc(cgc_status *st, grpc_status_code code,
                           grpc_slice details);

/* Absolute monotonic deadline deadline_ms from now (0: channel default). */
gpr_timespec cgc__deadline(const cgc_channel *ch, int64_t deadline_ms);
/* Milliseconds since an arbitrary monotonic origin. */
double cgc__now_ms(void);

/* One attempt of a call: returns 0 or a negative code with st filled. */
typedef int (*cgc__attempt_fn)(cgc_channel *ch, void *ctx,
                               gpr_timespec deadline, cgc_status *st);
/* Runs attempt until it succeeds, fails with something other than
 * UNAVAILABLE, runs out of retries or the next backoff would pass the
 * deadline. *attempts (may be NULL) receives how many were made. */
int cgc__with_retry(cgc_channel *ch, gpr_timespec deadline,
                    cgc__attempt_fn attempt, void *ctx, int *attempts,
                    cgc_status *st);

/* What one call's batches read from and write into. The function that
 * runs the call owns it: cgc__call_io_init, then cgc__call_end, which
 * frees whatever it still holds. */
typedef struct cgc__call_io {
  grpc_byte_buffer *send_bb, *recv_bb;
  grpc_metadata_array initial_md, trailing_md;
  grpc_status_code code;
  grpc_slice details;
  const char *error_string;
} cgc__call_io;
void cgc__call_io_init(cgc__call_io *io);

/* The opening ops of a call whose request fits one message: send the
 * initial metadata (ch's token, if any), io->send_bb and the half-close,
 * receive the initial metadata and the first response message. Fills ops[0..4].
 */
void cgc__ops_one_message(grpc_op ops[5], cgc__call_io *io,
                          const cgc_channel *ch);
/* Fills *op as GRPC_OP_RECV_STATUS_ON_CLIENT into io. */
void cgc__op_recv_status(grpc_op *op, cgc__call_io *io);
/* One unary call of method with the serialized request req. On success
 * *resp holds the serialized response (caller frees). Returns 0, CGC_ERPC
 * or CG_ENOMEM. */
int cgc__unary(cgc_channel *ch, const char *method, const void *req,
               size_t reqlen, gpr_timespec deadline, void **resp,
               size_t *resplen, cgc_status *st);

/* Ends a call's life: unrefs call (may be NULL), shuts down, drains and
 * destroys its completion queue, then frees what io holds. */
void cgc__call_end(grpc_call *call, grpc_completion_queue *cq,
                   cgc__call_io *io);

/* The region registered on ch that holds the n bytes at p, or NULL;
 * *offset gets p's offset in it. */
const cgc_region *cgc__region_find(cgc_channel *ch, const void *p, size_t n,
                                   uint64_t *offset);
/* The name r is registered under. */
const char *cgc__region_name(const cgc_region *r);
/* RegisterRegion for r again (the server restarted); r stays in its
 * channel's list. Returns like cgc__unary. */
int cgc__region_send_register(cgc_channel *ch, const cgc_region *r,
                              cgc_status *st);
/* Unregisters every region still registered on ch (cgc_channel_free). */
void cgc__regions_close(cgc_channel *ch);

/* Copies every byte of bb into one malloc'ed buffer (small messages only).
 * Returns 0 or CG_ENOMEM. */
int cgc__byte_buffer_flatten(grpc_byte_buffer *bb, void **out, size_t *len);

#endif
