/* shm.c - owns --shm's staging: a region holding a request's inputs and
 * room for its outputs, registered on the channel (see shm.h). */
#include "shm.h"

#include <stdio.h>
#include <string.h>

/* Bytes rounded up to the next 64. */
static size_t cgc__cli_align(size_t n) {
  return (n + 63) & ~(size_t)63;
}

int cgc_cli_shm_stage(cgc_cli_shm *m, cgc_channel *ch, cgc_request *req,
                      const size_t out_bytes[CG_GRAD_COUNT], int *rc,
                      cgc_status *st) {
  char err[256];
  size_t total = 0;
  int nin = cg_op_is_layer(req->op) ? 3 : 2;
  memset(m, 0, sizeof *m);
  for (int i = 0; i < nin; i++)
    total += cgc__cli_align(req->inputs[i].nbytes);
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    total += cgc__cli_align(out_bytes[g]);
  if ((*rc = cgc_region_create(&m->region, NULL, total ? total : 64, err,
                               sizeof err)) != 0) {
    snprintf(st->message, sizeof st->message, "--shm: %s", err);
    st->code = GRPC_STATUS_INTERNAL;
    return -1;
  }
  char *at = cgc_region_data(m->region);
  for (int i = 0; i < nin; i++) {
    if (req->inputs[i].nbytes)
      memcpy(at, req->inputs[i].data, req->inputs[i].nbytes);
    req->inputs[i].data = at;
    at += cgc__cli_align(req->inputs[i].nbytes);
  }
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    if (out_bytes[g]) {
      m->into[g] = at;
      m->cap[g] = out_bytes[g];
      at += cgc__cli_align(out_bytes[g]);
    }
  if ((*rc = cgc_region_register(ch, m->region, st)) != 0)
    return -1;
  return 0;
}

void cgc_cli_shm_close(cgc_cli_shm *m) {
  cgc_region_free(m->region);
  memset(m, 0, sizeof *m);
}
