/* info.c - grpc.health.v1.Health/Check and convgrad.v1.ConvGrad/
 * GetServerInfo, with the ServerInfo message turned into cgc_server_info. */
#include <stdlib.h>
#include <string.h>

#include "convgrad/v1/convgrad.pb-c.h"
#include "grpc/health/v1/health.pb-c.h"
#include "internal.h"

typedef struct cgc__health_ctx {
  const char *service;
  cgc_health_status status;
} cgc__health_ctx;

static int cgc__health_attempt(cgc_channel *ch, void *vctx, cgc__try *t,
                               cgc_status *st) {
  cgc__health_ctx *ctx = vctx;
  Grpc__Health__V1__HealthCheckRequest req =
      GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  uint8_t buf[512];
  void *resp = NULL;
  size_t resplen = 0;
  req.service = (char *)ctx->service;
  if (grpc__health__v1__health_check_request__get_packed_size(&req) >
      sizeof buf) {
    cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT, "service: name too long");
    return CG_EINVAL;
  }
  size_t len = grpc__health__v1__health_check_request__pack(&req, buf);
  int rc = cgc__unary(ch, "/grpc.health.v1.Health/Check", buf, len, t, &resp,
                      &resplen, st);
  if (rc)
    return rc;
  Grpc__Health__V1__HealthCheckResponse *r =
      grpc__health__v1__health_check_response__unpack(NULL, resplen, resp);
  free(resp);
  if (!r) {
    cgc__status_set(st, GRPC_STATUS_INTERNAL,
                    "Health/Check: malformed response");
    return CGC_EPROTO;
  }
  ctx->status = (cgc_health_status)r->status;
  grpc__health__v1__health_check_response__free_unpacked(r, NULL);
  return 0;
}

int cgc_health(cgc_channel *ch, const char *service, int64_t deadline_ms,
               cgc_health_status *out, cgc_status *st) {
  cgc__health_ctx ctx = {service ? service : "", CGC_HEALTH_UNKNOWN};
  int rc = cgc__with_retry(ch, cgc__deadline(ch, deadline_ms),
                           cgc__health_attempt, &ctx, st);
  *out = rc ? CGC_HEALTH_UNKNOWN : ctx.status;
  if (!rc && st)
    cgc__status_ok(st);
  return rc;
}

/* Storage behind cgc_server_info's pointers. */
typedef struct cgc__info_priv {
  Convgrad__V1__ServerInfo *msg;
  cgc_op_info *ops;
  cgc_dtype_info *dtypes;
} cgc__info_priv;

typedef struct cgc__info_ctx {
  cgc_server_info *info;
} cgc__info_ctx;

static int cgc__info_attempt(cgc_channel *ch, void *vctx, cgc__try *t,
                             cgc_status *st) {
  cgc__info_ctx *ctx = vctx;
  void *resp = NULL;
  size_t resplen = 0;
  int rc = cgc__unary(ch, "/convgrad.v1.ConvGrad/GetServerInfo", "", 0, t,
                      &resp, &resplen, st);
  if (rc)
    return rc;
  Convgrad__V1__ServerInfo *m =
      convgrad__v1__server_info__unpack(NULL, resplen, resp);
  free(resp);
  if (!m) {
    cgc__status_set(st, GRPC_STATUS_INTERNAL,
                    "GetServerInfo: malformed response");
    return CGC_EPROTO;
  }
  cgc_server_info *info = calloc(1, sizeof *info);
  cgc__info_priv *priv = calloc(1, sizeof *priv);
  cgc_op_info *ops = calloc(m->n_ops ? m->n_ops : 1, sizeof *ops);
  cgc_dtype_info *dts = calloc(m->n_dtypes ? m->n_dtypes : 1, sizeof *dts);
  if (!info || !priv || !ops || !dts) {
    free(info);
    free(priv);
    free(ops);
    free(dts);
    convgrad__v1__server_info__free_unpacked(m, NULL);
    cgc__status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return CG_ENOMEM;
  }
  for (size_t i = 0; i < m->n_ops; i++) {
    ops[i].op = (cg_op)m->ops[i]->op;
    ops[i].names = (const char *const *)m->ops[i]->names;
    ops[i].n_names = m->ops[i]->n_names;
    ops[i].inputs = (const char *const *)m->ops[i]->inputs;
    ops[i].n_inputs = m->ops[i]->n_inputs;
    ops[i].output = m->ops[i]->output;
    ops[i].outputs = (const char *const *)m->ops[i]->outputs;
    ops[i].n_outputs = m->ops[i]->n_outputs;
  }
  for (size_t i = 0; i < m->n_dtypes; i++) {
    dts[i].dtype = (int)m->dtypes[i]->dtype;
    dts[i].native = m->dtypes[i]->native ? 1 : 0;
  }
  info->version = m->version;
  info->ops = ops;
  info->n_ops = m->n_ops;
  info->dtypes = dts;
  info->n_dtypes = m->n_dtypes;
  info->onednn_version = m->onednn_version;
  info->cpu_isa = m->cpu_isa;
  info->workers = m->workers;
  info->threads_per_worker = m->threads_per_worker;
  info->threads_policy = m->threads_policy;
  info->shm = m->shm;
  info->cpus = m->cpus;
  info->n_cpus = m->n_cpus;
  info->io_cpus = m->io_cpus;
  info->n_io_cpus = m->n_io_cpus;
  if (m->limits) {
    info->max_request_bytes = m->limits->max_request_bytes;
    info->max_tensor_elements = m->limits->max_tensor_elements;
    info->max_inflight_bytes = m->limits->max_inflight_bytes;
    info->queue_depth = m->limits->queue_depth;
    info->default_chunk_bytes = m->limits->default_chunk_bytes;
    info->idle_timeout_ms = m->limits->idle_timeout_ms;
    info->stream_window_bytes = m->limits->stream_window_bytes;
    info->max_request_flops = m->limits->max_request_flops;
    info->max_regions = m->limits->max_regions;
    info->max_region_bytes = m->limits->max_region_bytes;
    info->max_stride = m->limits->max_stride;
    info->max_dilation = m->limits->max_dilation;
    info->max_pad = m->limits->max_pad;
    info->max_output_padding = m->limits->max_output_padding;
    info->max_effective_extent = m->limits->max_effective_extent;
    info->max_padded_extent = m->limits->max_padded_extent;
    info->store_bytes = m->limits->store_bytes;
    info->store_ttl_ms = m->limits->store_ttl_ms;
    info->store_peer_bytes = m->limits->store_peer_bytes;
  }
  if (m->store) {
    info->store_held_bytes = m->store->bytes;
    info->store_entries = m->store->entries;
    info->store_hits = m->store->hits;
    info->store_misses = m->store->misses;
    info->store_evictions = m->store->evictions;
    info->store_expired = m->store->expired;
  }
  priv->msg = m;
  priv->ops = ops;
  priv->dtypes = dts;
  info->priv_ = priv;
  ctx->info = info;
  return 0;
}

int cgc_server_info_get(cgc_channel *ch, int64_t deadline_ms,
                        cgc_server_info **out, cgc_status *st) {
  cgc__info_ctx ctx = {NULL};
  int rc = cgc__with_retry(ch, cgc__deadline(ch, deadline_ms),
                           cgc__info_attempt, &ctx, st);
  *out = ctx.info;
  if (!rc && st)
    cgc__status_ok(st);
  return rc;
}

void cgc_server_info_free(cgc_server_info *info) {
  if (!info)
    return;
  cgc__info_priv *priv = info->priv_;
  if (priv) {
    convgrad__v1__server_info__free_unpacked(priv->msg, NULL);
    free(priv->ops);
    free(priv->dtypes);
    free(priv);
  }
  free(info);
}
