/* shm.h - a request staged in a shared-memory region (shm.c), for the
 * CLI's --shm and the benchmarks. */
#ifndef CGC_CLI_SHM_H
#define CGC_CLI_SHM_H

#include <stddef.h>

#include "cgc/client.h"

/* --shm: a request staged in a shared-memory region registered on ch, for
 * a server on this host. The region holds a copy of each input (req's
 * views are pointed at the copies) and room for each output in
 * out_bytes (0: not asked for), every piece 64-byte aligned; into[g] and
 * cap[g] are what cgc_compute_layer_into takes. */
typedef struct cgc_cli_shm {
  cgc_region *region;
  void *into[CG_GRAD_COUNT];
  size_t cap[CG_GRAD_COUNT];
} cgc_cli_shm;
/* Returns 0, or -1 with *rc and st filled (what cgc_cli_fail takes). */
int cgc_cli_shm_stage(cgc_cli_shm *m, cgc_channel *ch, cgc_request *req,
                      const size_t out_bytes[CG_GRAD_COUNT], int *rc,
                      cgc_status *st);
/* Unregisters and removes the region; m may be zeroed or staged. */
void cgc_cli_shm_close(cgc_cli_shm *m);

#endif
