/* info.c - owns the GetServerInfo answer: what this server computes, on
 * what, and within which limits. */
#include "cgs_info.h"

#include <string.h>

#include "cg/engine.h"
#include "cg/problem.h"
#include "cgs_wire.h"
#include "convgrad/v1/convgrad.pb-c.h"

#ifndef CGS_VERSION
#define CGS_VERSION "0.0.0"
#endif

static void start(cgs_server *s, grpc_call *call, gpr_timespec deadline,
                  grpc_byte_buffer *payload, const char *client,
                  const grpc_metadata_array *md) {
  (void)deadline; /* answered at once */
  (void)client;
  (void)md;
  const cgs_config *cfg = s->cfg;
  if (!payload) {
    cgs_cq_reply(&s->cq, call, NULL, GRPC_STATUS_INVALID_ARGUMENT,
                 "request: missing ServerInfoRequest");
    return;
  }
  ProtobufCMessage *req =
      cgw_unpack(&convgrad__v1__server_info_request__descriptor, payload);
  grpc_byte_buffer_destroy(payload);
  if (!req) {
    cgs_cq_reply(&s->cq, call, NULL, GRPC_STATUS_INVALID_ARGUMENT,
                 "request: malformed ServerInfoRequest");
    return;
  }
  protobuf_c_message_free_unpacked(req, NULL);

  /* Everything below lives on the stack until packed. */
  Convgrad__V1__OpInfo ops[CG_OP_ALL_COUNT];
  Convgrad__V1__OpInfo *op_ptrs[CG_OP_ALL_COUNT];
  char *names[CG_OP_ALL_COUNT][16];
  char *inputs[CG_OP_ALL_COUNT][3];
  char *outputs[CG_OP_ALL_COUNT][CG_GRAD_COUNT];
  for (int i = 0; i < CG_OP_ALL_COUNT; i++) {
    cg_op op = (cg_op)(i + 1);
    Convgrad__V1__OpInfo init = CONVGRAD__V1__OP_INFO__INIT;
    ops[i] = init;
    ops[i].op = (Convgrad__V1__Op)op;
    const char *const *aliases = cg_op_aliases(op);
    size_t n = 0;
    while (aliases[n] && n < 16) {
      names[i][n] = (char *)aliases[n];
      n++;
    }
    ops[i].n_names = n;
    ops[i].names = names[i];
    n = 0;
    while (n < 3 && cg_op_input_name(op, (int)n)) {
      inputs[i][n] = (char *)cg_op_input_name(op, (int)n);
      n++;
    }
    ops[i].n_inputs = n;
    ops[i].inputs = inputs[i];
    ops[i].output = (char *)(cg_op_is_layer(op) ? "" : cg_op_output_name(op));
    n = 0;
    for (int g = 0; g < CG_GRAD_COUNT; g++)
      if (cg_op_is_layer(op) ||
          g == (cg_op_outputs_weights(op) ? CG_GRAD_DIFF_WEIGHTS
                                          : CG_GRAD_DIFF_SRC))
        outputs[i][n++] = (char *)cg_grad_name((cg_grad)g);
    ops[i].n_outputs = n;
    ops[i].outputs = outputs[i];
    op_ptrs[i] = &ops[i];
  }

  static const cg_dtype dts[] = {CG_DTYPE_F32, CG_DTYPE_BF16, CG_DTYPE_F16};
  Convgrad__V1__DTypeInfo dt[3];
  Convgrad__V1__DTypeInfo *dt_ptrs[3];
  for (int i = 0; i < 3; i++) {
    Convgrad__V1__DTypeInfo init = CONVGRAD__V1__DTYPE_INFO__INIT;
    dt[i] = init;
    dt[i].dtype = (Convgrad__V1__DType)dts[i];
    dt[i].native = cg_backend_dtype_native(dts[i]) ? 1 : 0;
    dt_ptrs[i] = &dt[i];
  }

  int32_t cpus[CGS_MAX_CPUS], io_cpus[CGS_MAX_CPUS];
  for (unsigned i = 0; i < cfg->cpus.n; i++)
    cpus[i] = cfg->cpus.cpu[i];
  for (unsigned i = 0; i < cfg->io_cpus.n; i++)
    io_cpus[i] = cfg->io_cpus.cpu[i];

  Convgrad__V1__Limits limits = CONVGRAD__V1__LIMITS__INIT;
  limits.max_request_bytes = cfg->max_request_bytes;
  limits.max_tensor_elements = cfg->max_tensor_elements;
  limits.max_inflight_bytes = cfg->max_inflight_bytes;
  limits.queue_depth = cfg->queue_depth;
  limits.default_chunk_bytes = (uint32_t)cfg->chunk_bytes;
  limits.idle_timeout_ms = cfg->idle_timeout_ms;
  limits.stream_window_bytes = cfg->stream_window_bytes;
  limits.max_request_flops = cfg->max_request_flops;
  limits.max_regions = cfg->max_regions;
  limits.max_region_bytes = cfg->max_region_bytes;
  limits.max_calls_per_peer = cfg->max_calls_per_peer;
  limits.max_stride = cfg->max_stride;
  limits.max_dilation = cfg->max_dilation;
  limits.max_pad = cfg->max_pad;
  limits.max_output_padding = cfg->max_output_padding;
  limits.max_effective_extent = cfg->max_effective_extent;
  limits.max_padded_extent = cfg->max_padded_extent;
  Convgrad__V1__StoreStats store = CONVGRAD__V1__STORE_STATS__INIT;
  if (s->store) {
    cgs_store_stats st;
    cgs_store_stats_get(s->store, &st);
    limits.store_bytes = cfg->store_bytes;
    limits.store_ttl_ms = cfg->store_ttl_ms;
    limits.store_peer_bytes = cgs_config_store_peer_bytes(cfg);
    store.bytes = st.bytes;
    store.entries = st.entries;
    store.hits = st.hits;
    store.misses = st.misses;
    store.evictions = st.evictions;
    store.expired = st.expired;
  }

  Convgrad__V1__ServerInfo info = CONVGRAD__V1__SERVER_INFO__INIT;
  info.version = (char *)CGS_VERSION;
  info.n_ops = CG_OP_ALL_COUNT;
  info.ops = op_ptrs;
  info.n_dtypes = 3;
  info.dtypes = dt_ptrs;
  info.onednn_version = (char *)cg_backend_version();
  info.cpu_isa = (char *)cg_backend_isa();
  info.workers = cfg->workers;
  info.threads_per_worker = cfg->threads_per_worker;
  info.threads_policy = (char *)cgs_threads_policy_name(cfg->threads_policy);
  info.n_cpus = cfg->cpus.n;
  info.cpus = cpus;
  info.n_io_cpus = cfg->io_cpus.n;
  info.io_cpus = io_cpus;
  info.limits = &limits;
  info.shm = (char *)cgs_shm_policy_name(cfg->shm);
  info.store = s->store ? &store : NULL;
  Convgrad__V1__ResultChecks checks = CONVGRAD__V1__RESULT_CHECKS__INIT;
  cgs_checks_counters cc;
  char why[512];
  cgs_checks_read(cgs_pool_checks(s->pool), &cc, why, sizeof why);
  checks.rate = cgs_checks_rate(cgs_pool_checks(s->pool));
  checks.first_runs = cfg->check_first_runs;
  checks.quarantine = cfg->check_quarantine;
  checks.window_ms = cfg->check_window_ms;
  checks.checked = cc.checked;
  checks.failed = cc.failed;
  checks.recomputed = cc.recomputed;
  checks.data_loss = cc.lost;
  checks.quarantined = cc.quarantined;
  checks.quarantine_reason = why;
  checks.warmup_checked = cc.warmup_checked;
  checks.warmup_failed = cc.warmup_failed;
  info.result_checks = &checks;
  cgs_cq_reply(&s->cq, call, cgw_pack(&info.base), GRPC_STATUS_OK, NULL);
}

const cgs_method_def cgs_info_method = {
    .path = "/convgrad.v1.ConvGrad/GetServerInfo",
    .reads_first = 1,
    .slots = 2,
    .needs_token = 1,
    .start = start,
};
