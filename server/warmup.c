/* warmup.c - owns the layers of the --warmup file. */
#include "cgs_warmup.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg/bdesc.h"
#include "cgs_upload.h"

/* Resolves one run line's problem into l and checks it as a request's
 * would be; 0 or CG_EINVAL with err. */
static int warmup_layer(const cg_bdesc_run *r, const cgs_config *cfg,
                        cg_layer *l, char *err, size_t errlen) {
  cg_bdesc_problem bp;
  grpc_status_code code;
  int rc = cg_bdesc_problem_init(&bp, &r->desc, r->op, r->dtype, r->data_format,
                                 r->weights_format, err, errlen);
  if (rc == 0)
    rc = cg_layer_resolve(&bp.problem, l, err, errlen);
  if (rc != 0)
    return CG_EINVAL;
  if (cgs_upload_check_layer(l, cfg, &code, err, errlen) != 0)
    return CG_EINVAL;
  uint64_t total = 0;
  for (int i = 0; i < l->ninputs && i < 3; i++) {
    size_t elems = l->in_bytes[i] / cg_dtype_size(l->dtype);
    if (elems > cfg->max_tensor_elements)
      return cg_errorf(err, errlen, CG_EINVAL,
                       "%s: %zu elements exceed the limit %" PRIu64
                       " (--max-tensor-elements)",
                       cg_op_input_name(l->op, i), elems,
                       cfg->max_tensor_elements);
    total += l->in_bytes[i];
  }
  if (total > cfg->max_request_bytes)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "inputs: %" PRIu64 " bytes exceed the limit %" PRIu64
                     " (--max-request-bytes)",
                     total, cfg->max_request_bytes);
  return 0;
}

int cgs_warmup_load(cgs_warmup *w, const char *path, const cgs_config *cfg,
                    char *err, size_t errlen) {
  char line[1024], why[512];
  int lineno = 0, rc = 0;
  memset(w, 0, sizeof *w);
  FILE *fp = fopen(path, "r");
  if (!fp)
    return cg_errorf(err, errlen, CG_EINVAL, "--warmup %s: cannot open", path);
  w->layers = calloc(CGS_WARMUP_MAX, sizeof *w->layers);
  if (!w->layers) {
    fclose(fp);
    return cg_errorf(err, errlen, CG_ENOMEM, "--warmup: out of memory");
  }
  while (!rc && fgets(line, sizeof line, fp)) {
    cg_bdesc_run r;
    int is_problem;
    lineno++;
    size_t len = strcspn(line, "\r\n");
    if (line[len] == '\0' && !feof(fp))
      rc = cg_errorf(why, sizeof why, CG_EINVAL, "longer than %zu characters",
                     sizeof line - 2);
    line[len] = '\0';
    if (!rc)
      rc = cg_bdesc_parse_run(line, &r, &is_problem, why, sizeof why);
    if (!rc && is_problem && w->n == CGS_WARMUP_MAX)
      rc = cg_errorf(why, sizeof why, CG_EINVAL, "more than %d problems",
                     CGS_WARMUP_MAX);
    if (!rc && is_problem)
      rc = warmup_layer(&r, cfg, &w->layers[w->n++], why, sizeof why);
    if (rc)
      cg_errorf(err, errlen, rc, "--warmup %s:%d: %s", path, lineno, why);
  }
  fclose(fp);
  if (rc)
    cgs_warmup_free(w);
  return rc;
}

void cgs_warmup_free(cgs_warmup *w) {
  free(w->layers);
  w->layers = NULL;
  w->n = 0;
}
