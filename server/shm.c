/* shm.c - owns the shared-memory RPCs: RegisterRegion, UnregisterRegion
 * and ListRegions, each answered at once from the region table (region.c)
 * and logged, and the --shm policy on who may use regions. */
#include "cgs_shm.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/support/alloc.h>

#include "cgs_log.h"
#include "cgs_wire.h"
#include "cgw.h"
#include "convgrad/v1/convgrad.pb-c.h"

/* 1 for a unix socket or a loopback address (gRPC's peer strings). */
static int peer_is_local(const char *peer) {
  return !strncmp(peer, "unix:", 5) || !strncmp(peer, "ipv4:127.", 9) ||
         !strncmp(peer, "ipv6:[::1]:", 11) ||
         !strncmp(peer, "ipv6:%5B::1%5D:", 15);
}

cgs_regions *cgs_shm_for_peer(const cgs_server *s, const char *peer,
                              const char **why) {
  if (!s->regions) {
    *why = "this server does not serve shared-memory regions (--shm off)";
    return NULL;
  }
  if (s->cfg->shm == CGS_SHM_LOCAL && !peer_is_local(peer)) {
    *why = "shared-memory regions are served only to callers on a unix "
           "socket or a loopback address (--shm local)";
    return NULL;
  }
  return s->regions;
}

/* Unpacks payload (consumed) as desc; NULL after answering the call. */
static ProtobufCMessage *take_request(cgs_server *s, grpc_call *call,
                                      grpc_byte_buffer *payload,
                                      const ProtobufCMessageDescriptor *desc) {
  ProtobufCMessage *req = payload ? cgw_unpack(desc, payload) : NULL;
  if (payload)
    grpc_byte_buffer_destroy(payload);
  if (!req) {
    char msg[128];
    snprintf(msg, sizeof msg, "request: malformed or missing %s", desc->name);
    cgs_cq_reply(&s->cq, call, NULL, GRPC_STATUS_INVALID_ARGUMENT, msg);
  }
  return req;
}

/* Answers call with code (msg when not OK) and logs the line, within the
 * caller's address's log budget (--peer-log-rate) like failed calls. */
static void answer(cgs_server *s, grpc_call *call, const char *what,
                   const char *client, const char *name,
                   grpc_byte_buffer *reply, grpc_status_code code,
                   const char *msg) {
  char *peer = grpc_call_get_peer(call);
  uint64_t now = uv_hrtime();
  if (cgs_peers_log_allowed_for(s->peers, peer, now, s->cfg->peer_log_rate)) {
    char from[128], who[320], region[2 * CGS_REGION_NAME_MAX], text[1024];
    cgs_log_value(from, sizeof from, peer);
    cgs_log_value(who, sizeof who, client ? client : "-");
    cgs_log_value(region, sizeof region, name && *name ? name : "-");
    int failed = code != GRPC_STATUS_OK;
    cgs_log_value(text, sizeof text, failed ? msg : "");
    cgs_info("region op=%s peer=%s client=%s name=%s status=%s%s%s", what, from,
             who, region, cgw_status_name(code), failed ? " msg=" : "",
             failed ? text : "");
  }
  gpr_free(peer);
  cgs_cq_reply(&s->cq, call, code == GRPC_STATUS_OK ? reply : NULL, code,
               code == GRPC_STATUS_OK ? NULL : msg);
  if (code != GRPC_STATUS_OK && reply)
    grpc_byte_buffer_destroy(reply);
}

void cgs_shm_sweep(cgs_server *s) {
  uint64_t idle_ms = s->cfg->region_idle_timeout_ms;
  if (!s->regions || !idle_ms)
    return;
  cgs_region_info gone[16];
  size_t n;
  do {
    n = cgs_regions_expire(s->regions, idle_ms, gone, 16);
    for (size_t i = 0; i < n; i++) {
      char who[320], name[2 * CGS_REGION_NAME_MAX], key[2 * CGS_REGION_KEY_MAX];
      cgs_log_value(who, sizeof who, gone[i].owner[0] ? gone[i].owner : "-");
      cgs_log_value(name, sizeof name, gone[i].name);
      cgs_log_value(key, sizeof key, gone[i].key);
      cgs_info("region op=expire client=%s name=%s key=%s idle_s=%.1f "
               "(--region-idle-timeout)",
               who, name, key, (double)gone[i].idle_ms / 1000.0);
    }
  } while (n == 16);
}

/* The table for this call, or NULL after answering it. */
static cgs_regions *regions_for(cgs_server *s, grpc_call *call,
                                const char *what, const char *client,
                                const char *name) {
  char *peer = grpc_call_get_peer(call);
  const char *why = NULL;
  cgs_regions *rs = cgs_shm_for_peer(s, peer, &why);
  gpr_free(peer);
  if (!rs)
    answer(s, call, what, client, name, NULL, GRPC_STATUS_FAILED_PRECONDITION,
           why);
  return rs;
}

static void start_register(cgs_server *s, grpc_call *call,
                           gpr_timespec deadline, grpc_byte_buffer *payload,
                           const char *client, const grpc_metadata_array *md) {
  (void)deadline;
  (void)md;
  Convgrad__V1__RegisterRegionRequest *req =
      (Convgrad__V1__RegisterRegionRequest *)take_request(
          s, call, payload, &convgrad__v1__register_region_request__descriptor);
  if (!req)
    return;
  cgs_regions *rs = regions_for(s, call, "register", client, req->name);
  if (rs) {
    grpc_status_code code = GRPC_STATUS_OK;
    char msg[512] = "";
    if (cgs_regions_register(rs, client, req->name, req->key, req->offset,
                             req->byte_size, &code, msg, sizeof msg) == 0)
      code = GRPC_STATUS_OK;
    Convgrad__V1__RegisterRegionResponse resp =
        CONVGRAD__V1__REGISTER_REGION_RESPONSE__INIT;
    answer(s, call, "register", client, req->name, cgw_pack(&resp.base), code,
           msg);
  }
  protobuf_c_message_free_unpacked(&req->base, NULL);
}

static void start_unregister(cgs_server *s, grpc_call *call,
                             gpr_timespec deadline, grpc_byte_buffer *payload,
                             const char *client,
                             const grpc_metadata_array *md) {
  (void)deadline;
  (void)md;
  Convgrad__V1__UnregisterRegionRequest *req =
      (Convgrad__V1__UnregisterRegionRequest *)take_request(
          s, call, payload,
          &convgrad__v1__unregister_region_request__descriptor);
  if (!req)
    return;
  cgs_regions *rs = regions_for(s, call, "unregister", client, req->name);
  if (rs) {
    grpc_status_code code = GRPC_STATUS_OK;
    char msg[512] = "";
    if (cgs_regions_unregister(rs, client, req->name, &code, msg, sizeof msg) ==
        0)
      code = GRPC_STATUS_OK;
    Convgrad__V1__UnregisterRegionResponse resp =
        CONVGRAD__V1__UNREGISTER_REGION_RESPONSE__INIT;
    answer(s, call, "unregister", client, req->name, cgw_pack(&resp.base), code,
           msg);
  }
  protobuf_c_message_free_unpacked(&req->base, NULL);
}

static void start_list(cgs_server *s, grpc_call *call, gpr_timespec deadline,
                       grpc_byte_buffer *payload, const char *client,
                       const grpc_metadata_array *md) {
  (void)deadline;
  (void)md;
  ProtobufCMessage *req = take_request(
      s, call, payload, &convgrad__v1__list_regions_request__descriptor);
  if (!req)
    return;
  protobuf_c_message_free_unpacked(req, NULL);
  cgs_regions *rs = regions_for(s, call, "list", client, NULL);
  if (!rs)
    return;
  size_t max = s->cfg->max_regions;
  cgs_region_info *info = calloc(max, sizeof *info);
  Convgrad__V1__RegionInfo *items = calloc(max, sizeof *items);
  Convgrad__V1__RegionInfo **ptrs =
      calloc(max, sizeof(Convgrad__V1__RegionInfo *));
  if (!info || !items || !ptrs) {
    answer(s, call, "list", client, NULL, NULL, GRPC_STATUS_RESOURCE_EXHAUSTED,
           "server out of memory");
  } else {
    size_t n = cgs_regions_list(rs, client, info, max);
    for (size_t i = 0; i < n; i++) {
      Convgrad__V1__RegionInfo init = CONVGRAD__V1__REGION_INFO__INIT;
      items[i] = init;
      items[i].name = info[i].name;
      items[i].key = info[i].key;
      items[i].offset = info[i].offset;
      items[i].byte_size = info[i].byte_size;
      items[i].calls = info[i].calls;
      ptrs[i] = &items[i];
    }
    Convgrad__V1__ListRegionsResponse resp =
        CONVGRAD__V1__LIST_REGIONS_RESPONSE__INIT;
    resp.n_regions = n;
    resp.regions = ptrs;
    answer(s, call, "list", client, NULL, cgw_pack(&resp.base), GRPC_STATUS_OK,
           NULL);
  }
  free(info);
  free(items);
  free(ptrs);
}

const cgs_method_def cgs_shm_register_method = {
    .path = "/convgrad.v1.ConvGrad/RegisterRegion",
    .reads_first = 1,
    .slots = 2,
    .needs_token = 1,
    .start = start_register,
};
const cgs_method_def cgs_shm_unregister_method = {
    .path = "/convgrad.v1.ConvGrad/UnregisterRegion",
    .reads_first = 1,
    .slots = 2,
    .needs_token = 1,
    .start = start_unregister,
};
const cgs_method_def cgs_shm_list_method = {
    .path = "/convgrad.v1.ConvGrad/ListRegions",
    .reads_first = 1,
    .slots = 2,
    .needs_token = 1,
    .start = start_list,
};
