/* cgs_warmup.h - the --warmup file: the shapes whose kernels the workers
 * build before the server reports SERVING. One problem per line, a
 * benchdnn descriptor and how to run it (cg/bdesc.h, cg_bdesc_parse_run:
 * "mb8ic64ih56oc64oh56kh3ph1 dtype=bf16 data_format=NCX"; by default
 * the layer op of every output, f32), so tests/bench/problems.txt is one.
 * Each line is resolved and checked against this server's limits as a
 * request would be. Not thread-safe; loaded once at start. */
#ifndef CGS_WARMUP_H
#define CGS_WARMUP_H

#include <stddef.h>

#include "cg/layer.h"
#include "cgs_config.h"

/* Lines a file may hold problems on: a warm-up, not a workload. */
#define CGS_WARMUP_MAX 1024

typedef struct cgs_warmup {
  cg_layer *layers; /* owned */
  size_t n;
} cgs_warmup;

/* Reads path into w (zeroed first). Returns 0, or CG_EINVAL / CG_ENOMEM
 * with err naming the file, the line number and the problem ("w.txt:3:
 * descriptor: ic and oc are required"); nothing is held then. */
int cgs_warmup_load(cgs_warmup *w, const char *path, const cgs_config *cfg,
                    char *err, size_t errlen);
/* Frees what w holds; a zeroed w is fine. */
void cgs_warmup_free(cgs_warmup *w);

#endif
