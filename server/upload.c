/* upload.c - owns a Compute request's assembly: header decoding and
 * checks (through header.c), input buffers, chunk order and bounds, the
 * shape tensor and the resolved layer with its limits. */
#include "cgs_upload.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "cg/text.h"
#include "cgs_buf.h"
#include "cgs_header.h"
#include "cgw.h"

void cgs_upload_init(cgs_upload *u) {
  memset(u, 0, sizeof *u);
}

void cgs_upload_use_regions(cgs_upload *u, cgs_regions *rs, const char *refused,
                            const char *owner) {
  u->regions = rs;
  u->shm_refused = refused;
  snprintf(u->owner, sizeof u->owner, "%s", owner ? owner : "");
}

void cgs_upload_use_store(cgs_upload *u, cgs_store *st, const char *peer) {
  u->store = st;
  snprintf(u->peer, sizeof u->peer, "%s", peer ? peer : "");
}

void cgs_upload_free_inputs(cgs_upload *u) {
  for (int i = 0; i < 3; i++)
    if (!u->in_region[i] && !u->in_staged[i]) {
      cgs_buf_free(u->in_buf[i]);
      u->in_buf[i] = NULL;
    }
}

void cgs_upload_close(cgs_upload *u) {
  cgs_upload_free_inputs(u);
  for (int k = 0; k < u->nheld; k++)
    cgs_region_release(u->held[k]);
  for (int i = 0; i < 3; i++)
    if (u->in_staged[i])
      cgs_staged_release(u->in_staged[i]);
  if (u->req)
    protobuf_c_message_free_unpacked(&u->req->base, NULL);
  if (u->stage_req)
    protobuf_c_message_free_unpacked(&u->stage_req->base, NULL);
  EVP_MD_CTX_free(u->stage_sha);
  cgs_upload_init(u);
}

int cgs_upload_header(cgs_upload *u, grpc_byte_buffer *bb,
                      const cgs_config *cfg, grpc_status_code *code, char *msg,
                      size_t msglen) {
  u->req = (Convgrad__V1__ComputeRequest *)cgw_unpack(
      &convgrad__v1__compute_request__descriptor, bb);
  if (!u->req ||
      u->req->kind_case != CONVGRAD__V1__COMPUTE_REQUEST__KIND_HEADER) {
    *code = GRPC_STATUS_INVALID_ARGUMENT;
    snprintf(msg, msglen, "request: malformed ComputeRequest header message");
    return -1;
  }
  const Convgrad__V1__ComputeHeader *h = u->req->header;
  /* The log names what was asked for, refused or not: the shapes are
   * not checked yet and may be of any length. */
  cg_text shapes;
  cg_text_init(&shapes, u->shapes, sizeof u->shapes);
  size_t data_inputs = cg_op_is_layer((cg_op)h->op) ? 3 : 2;
  for (size_t i = 0; i < data_inputs && i < h->n_inputs; i++) {
    if (i)
      cg_text_append(&shapes, ",", 1);
    cg_text_dims(&shapes, h->inputs[i]->shape, h->inputs[i]->n_shape);
  }
  cgs_header_info info;
  if (cgs_header_check(h, cfg, &info, code, msg, msglen) != 0) {
    u->prob.op = info.prob.op;
    u->prob.dtype = info.prob.dtype;
    return -1;
  }
  /* A value past a service limit is refused as such, before any other
   * check on the shapes and before the upload. */
  cg_limits lim;
  cg_limit which;
  char err[256];
  cgs_config_limits(cfg, &lim);
  if (cg_problem_check_limits(&info.prob, &lim, &which, err, sizeof err)) {
    u->prob.op = info.prob.op;
    u->prob.dtype = info.prob.dtype;
    *code = GRPC_STATUS_INVALID_ARGUMENT;
    snprintf(msg, msglen, "%s (%s)", err, cgs_config_limit_flag(which));
    return -1;
  }
  u->prob = info.prob;
  u->ninputs = info.ninputs;
  memcpy(u->in_len, info.in_len, sizeof u->in_len);
  memcpy(u->in_esize, info.in_esize, sizeof u->in_esize);
  memcpy(u->out_ref, info.out_region, sizeof u->out_ref);
  u->chunk_bytes = info.chunk_bytes;
  return 0;
}

static const Convgrad__V1__RegionRef *input_ref(const cgs_upload *u, int i) {
  return u->req ? u->req->header->inputs[i]->region : NULL;
}

static const Convgrad__V1__StagedRef *input_staged(const cgs_upload *u, int i) {
  return u->req ? u->req->header->inputs[i]->staged : NULL;
}

uint64_t cgs_upload_in_bytes(const cgs_upload *u) {
  uint64_t n = 0;
  for (int i = 0; i < u->ninputs; i++)
    if (!input_ref(u, i) && !input_staged(u, i))
      n += u->in_len[i];
  return n;
}

/* Finds ref's bytes (len of them, aligned to align) in a region; the
 * reference goes to *r. */
static int acquire(cgs_upload *u, const char *field,
                   const Convgrad__V1__RegionRef *ref, uint64_t len,
                   size_t align, cgs_region **r, unsigned char **at,
                   grpc_status_code *code, char *msg, size_t msglen) {
  if (!u->regions) {
    *code = GRPC_STATUS_FAILED_PRECONDITION;
    snprintf(msg, msglen, "%s: %s", field,
             u->shm_refused ? u->shm_refused
                            : "shared-memory regions are not served here");
    return -1;
  }
  if (cgs_region_acquire(u->regions, u->owner, field, ref->name, ref->offset,
                         len, align, r, at, code, msg, msglen) != 0)
    return -1;
  for (int k = 0; k < u->nheld; k++)
    if (u->held[k] == *r) {
      cgs_region_release(*r); /* one reference per call */
      return 0;
    }
  u->held[u->nheld++] = *r;
  return 0;
}

/* Moves cur past every input that is full. */
static void skip_full(cgs_upload *u) {
  while (u->cur < u->ninputs && u->in_fill[u->cur] == u->in_len[u->cur])
    u->cur++;
}

/* Maps the pages of [p, p + n) in one call before bytes are copied
 * there (a chunk, or a Stage header's data) when they are fresh from the
 * system (a Stage entry while the store fills up, a size the buffer cache
 * lacked): the copy would otherwise fault once per 4 KiB page (3.5-6.5 ms
 * of CPU per MiB of Stage on a VM here; 0.67-0.77x of it so). A buffer is
 * fresh or reused as a whole, so its first page in the range tells
 * (mincore): mapping pages already there still walks their page tables,
 * which cost 1.3x the CPU per MiB of an upload into a reused buffer. A
 * kernel before 5.14 refuses MADV_POPULATE_WRITE, and the copy faults the
 * pages as before. */
static void populate(unsigned char *p, size_t n) {
#ifdef MADV_POPULATE_WRITE
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t from = ((uintptr_t)p + page - 1) & ~(page - 1);
  uintptr_t to = ((uintptr_t)p + n) & ~(page - 1);
  unsigned char in_core = 1;
  if (to > from && mincore((void *)from, page, &in_core) == 0 && !(in_core & 1))
    (void)madvise((void *)from, to - from, MADV_POPULATE_WRITE);
#else
  (void)p;
  (void)n;
#endif
}

/* The staged inputs: each found in the store, or named in u->missing.
 * Returns 0, or -1 with *code and msg. */
static int find_staged(cgs_upload *u, grpc_status_code *code, char *msg,
                       size_t msglen) {
  cg_text missing;
  cg_text_init(&missing, u->missing, sizeof u->missing);
  int first = -1;
  uint64_t now_ms = cgs_store_now_ms();
  for (int i = 0; i < u->ninputs; i++) {
    const Convgrad__V1__StagedRef *ref = input_staged(u, i);
    if (!ref)
      continue;
    if (!u->store) {
      *code = GRPC_STATUS_FAILED_PRECONDITION;
      snprintf(msg, msglen,
               "inputs[%d].staged: this server keeps no staged tensors "
               "(--store-bytes 0); send the bytes",
               i);
      return -1;
    }
    cgs_staged *e =
        cgs_store_get(u->store, u->owner, ref->private_id ? u->peer : NULL,
                      ref->sha256.data, now_ms);
    if (!e) {
      char hex[2 * CGS_STORE_ID_BYTES + 1];
      cgs_store_id_hex(ref->sha256.data, hex);
      if (first >= 0)
        cg_text_append(&missing, ",", 1);
      cg_text_str(&missing, hex);
      if (first < 0)
        first = i;
      continue;
    }
    u->in_staged[i] = e;
    u->in_buf[i] = cgs_staged_data(e);
    u->in_fill[i] = u->in_len[i];
    if (cgs_staged_len(e) != u->in_len[i]) {
      *code = GRPC_STATUS_INVALID_ARGUMENT;
      snprintf(msg, msglen,
               "inputs[%d].staged: the entry holds %zu bytes, but shape and "
               "dtype make %zu",
               i, cgs_staged_len(e), u->in_len[i]);
      return -1;
    }
  }
  if (first < 0)
    return 0;
  *code = GRPC_STATUS_NOT_FOUND;
  snprintf(msg, msglen,
           "inputs[%d].staged: not in the store (never staged, evicted, "
           "expired or lost in a restart): stage it again; missing: %s",
           first, u->missing);
  return -1;
}

/* A Stage upload's buffer, with the header's data, hashed unless its id
 * is private. */
static int alloc_stage(cgs_upload *u, grpc_status_code *code, char *msg,
                       size_t msglen) {
  const ProtobufCBinaryData *d = &u->stage_req->header->data;
  int hashed = !u->stage_private;
  u->stage_sha = hashed ? EVP_MD_CTX_new() : NULL;
  u->in_buf[0] = cgs_buf_alloc(u->in_len[0]);
  if ((hashed && !u->stage_sha) || !u->in_buf[0] ||
      (hashed && (!EVP_DigestInit_ex(u->stage_sha, EVP_sha256(), NULL) ||
                  !EVP_DigestUpdate(u->stage_sha, d->data, d->len)))) {
    *code = GRPC_STATUS_RESOURCE_EXHAUSTED;
    snprintf(msg, msglen, "header: cannot allocate %zu bytes", u->in_len[0]);
    return -1;
  }
  if (d->len) {
    populate(u->in_buf[0], d->len);
    memcpy(u->in_buf[0], d->data, d->len);
  }
  u->in_fill[0] = d->len;
  u->bytes_in = d->len;
  protobuf_c_message_free_unpacked(&u->stage_req->base, NULL);
  u->stage_req = NULL;
  skip_full(u);
  return 0;
}

int cgs_upload_alloc(cgs_upload *u, grpc_status_code *code, char *msg,
                     size_t msglen) {
  if (u->stage_req)
    return alloc_stage(u, code, msg, msglen);
  const Convgrad__V1__ComputeHeader *h = u->req->header;
  if (find_staged(u, code, msg, msglen) != 0)
    return -1;
  for (int i = 0; i < u->ninputs; i++) {
    if (u->in_staged[i])
      continue;
    if (input_ref(u, i)) {
      char field[32];
      snprintf(field, sizeof field, "inputs[%d].region", i);
      if (acquire(u, field, input_ref(u, i), u->in_len[i], u->in_esize[i],
                  &u->in_region[i], &u->in_buf[i], code, msg, msglen) != 0)
        return -1;
      u->in_fill[i] = u->in_len[i];
      continue;
    }
    u->in_buf[i] = cgs_buf_alloc(u->in_len[i]);
    if (!u->in_buf[i]) {
      *code = GRPC_STATUS_RESOURCE_EXHAUSTED;
      snprintf(msg, msglen, "inputs[%d]: cannot allocate %zu bytes", i,
               u->in_len[i]);
      return -1;
    }
    /* The header check bounds the inline data by the tensor's size. */
    const ProtobufCBinaryData *d = &h->inputs[i]->data;
    if (d->len)
      memcpy(u->in_buf[i], d->data, d->len);
    u->in_fill[i] = d->len;
    u->bytes_in += d->len;
  }
  u->cur = 0;
  skip_full(u);
  return 0;
}

/* The third tensor of a single op is its shape tensor (a layer op's is
 * its weights). */
static int has_shape_tensor(const cgs_upload *u) {
  return u->ninputs == 3 && !cg_op_is_layer(u->prob.op);
}

int cgs_upload_needs_shape(const cgs_upload *u) {
  return has_shape_tensor(u) && u->in_fill[2] < u->in_len[2];
}

/* The output regions of the resolved layer: each output's bytes found,
 * fitting the room asked for and overlapping nothing else of the call. */
static int acquire_outputs(cgs_upload *u, grpc_status_code *code, char *msg,
                           size_t msglen) {
  const cg_layer *l = &u->layer;
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    const Convgrad__V1__RegionRef *ref = u->out_ref[g];
    if (!ref)
      continue;
    char field[64];
    snprintf(field, sizeof field, "header.output_regions[%s].region",
             cg_grad_name((cg_grad)g));
    size_t len = l->out_bytes[g];
    if (ref->byte_size && ref->byte_size < len) {
      *code = GRPC_STATUS_INVALID_ARGUMENT;
      snprintf(msg, msglen,
               "%s.byte_size: %" PRIu64 " bytes cannot hold %s's %zu", field,
               ref->byte_size, cg_grad_name((cg_grad)g), len);
      return -1;
    }
    if (acquire(u, field, ref, len, cg_dtype_size(u->prob.dtype),
                &u->out_region[g], &u->out_at[g], code, msg, msglen) != 0)
      return -1;
    for (int i = 0; i < u->ninputs; i++)
      if (u->in_region[i] &&
          cgs_region_overlap(u->out_region[g], u->out_at[g], len,
                             u->in_region[i], u->in_buf[i], u->in_len[i])) {
        *code = GRPC_STATUS_INVALID_ARGUMENT;
        snprintf(msg, msglen, "%s: %s's bytes overlap inputs[%d]'s", field,
                 cg_grad_name((cg_grad)g), i);
        return -1;
      }
    for (int o = 0; o < g; o++)
      if (u->out_at[o] &&
          cgs_region_overlap(u->out_region[g], u->out_at[g], len,
                             u->out_region[o], u->out_at[o], l->out_bytes[o])) {
        *code = GRPC_STATUS_INVALID_ARGUMENT;
        snprintf(msg, msglen, "%s: %s's bytes overlap %s's", field,
                 cg_grad_name((cg_grad)g), cg_grad_name((cg_grad)o));
        return -1;
      }
  }
  return 0;
}

int cgs_upload_check_layer(const cg_layer *l, const cgs_config *cfg,
                           grpc_status_code *code, char *msg, size_t msglen) {
  /* What the shapes make of the attributes: computed pads, effective and
   * padded extents. */
  char err[512];
  cg_limits lim;
  cg_limit which;
  cgs_config_limits(cfg, &lim);
  if (cg_layer_check_limits(l, &lim, &which, err, sizeof err) != 0) {
    *code = GRPC_STATUS_INVALID_ARGUMENT;
    snprintf(msg, msglen, "%s (%s)", err, cgs_config_limit_flag(which));
    return -1;
  }
  /* A running oneDNN primitive cannot be interrupted: this bounds how
   * long one request can hold a worker, stride and pad sweeps included. */
  uint64_t flops = cg_layer_work(l);
  if (cfg->max_request_flops && flops > cfg->max_request_flops) {
    *code = GRPC_STATUS_RESOURCE_EXHAUSTED;
    snprintf(msg, msglen,
             "request: needs %" PRIu64 " flops, more than --max-request-flops "
             "%" PRIu64 "; it cannot run on this server",
             flops, cfg->max_request_flops);
    return -1;
  }
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    if ((l->grads & CG_GRAD_BIT(g)) &&
        l->out_elems[g] > cfg->max_tensor_elements) {
      *code = GRPC_STATUS_RESOURCE_EXHAUSTED;
      snprintf(msg, msglen,
               "%s: %zu elements exceed the limit %" PRIu64
               " (--max-tensor-elements); it cannot run on this server",
               cg_grad_name((cg_grad)g), l->out_elems[g],
               cfg->max_tensor_elements);
      return -1;
    }
  return 0;
}

int cgs_upload_resolve(cgs_upload *u, const cgs_config *cfg,
                       grpc_status_code *code, char *msg, size_t msglen) {
  if (has_shape_tensor(u)) {
    /* Little-endian s32 or s64 values; the header check bounds their
     * count by CG_MAX_RANK. */
    const Convgrad__V1__Tensor *t = u->req->header->inputs[2];
    size_t k = (size_t)t->shape[0],
           w = t->dtype == CONVGRAD__V1__DTYPE__S32 ? 4 : 8;
    for (size_t i = 0; i < k; i++) {
      const unsigned char *p = u->in_buf[2] + i * w;
      uint64_t v = 0;
      for (size_t b = 0; b < w; b++)
        v |= (uint64_t)p[b] << (8 * b);
      u->shape_in[i] = w == 4 ? (int64_t)(int32_t)(uint32_t)v : (int64_t)v;
    }
    u->prob.has_shape_input = 1;
    u->prob.shape_input = (cg_ints){u->shape_in, k};
  }
  cg_layer *l = &u->layer;
  char err[512];
  int rc = cg_layer_resolve(&u->prob, l, err, sizeof err);
  if (rc != 0) {
    *code = cgs_wire_status(rc);
    snprintf(msg, msglen, "%s", err);
    return -1;
  }
  if (cgs_upload_check_layer(l, cfg, code, msg, msglen) != 0)
    return -1;
  if (acquire_outputs(u, code, msg, msglen) != 0)
    return -1;
  protobuf_c_message_free_unpacked(&u->req->base, NULL);
  u->req = NULL;
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    u->out_ref[g] = NULL; /* pointed into req */
  for (int i = 0; i < l->ninputs; i++)
    if (l->in_bytes[i] != u->in_len[i]) {
      *code = GRPC_STATUS_INTERNAL;
      snprintf(msg, msglen, "input sizes disagree with the geometry");
      return -1;
    }
  u->resolved = 1;
  return 0;
}

uint64_t cgs_upload_out_bytes(const cgs_upload *u) {
  uint64_t n = 0;
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    if ((u->layer.grads & CG_GRAD_BIT(g)) && !u->out_at[g])
      n += u->layer.out_bytes[g]; /* each below 2^48 * 8 */
  return n;
}

int cgs_upload_chunk(cgs_upload *u, const cgs_chunk_view *v,
                     grpc_byte_buffer *bb, grpc_status_code *code, char *msg,
                     size_t msglen) {
  int i = u->cur;
  *code = GRPC_STATUS_INVALID_ARGUMENT;
  if (v->input != (uint32_t)i) {
    if (v->input >= (uint32_t)u->ninputs)
      snprintf(msg, msglen, "chunk.input: %u is out of range (%d inputs)",
               v->input, u->ninputs);
    else
      snprintf(msg, msglen,
               "chunk.input: got %u, expected %d (inputs are sent in order "
               "and inputs[%d] still lacks %zu bytes)",
               v->input, i, i, u->in_len[i] - u->in_fill[i]);
    return -1;
  }
  size_t left = u->in_len[i] - u->in_fill[i];
  if (v->data_len > left) {
    snprintf(msg, msglen,
             "inputs[%d].data: chunk of %zu bytes overruns the tensor (%zu "
             "of %zu bytes left)",
             i, v->data_len, left, u->in_len[i]);
    return -1;
  }
  unsigned char *at = u->in_buf[i] + u->in_fill[i];
  populate(at, v->data_len);
  if (cgw_copy(bb, v->data_off, v->data_len, at) != 0) {
    snprintf(msg, msglen, "request: malformed ComputeRequest message");
    return -1;
  }
  if (u->stage_sha && !EVP_DigestUpdate(u->stage_sha, at, v->data_len)) {
    *code = GRPC_STATUS_INTERNAL;
    snprintf(msg, msglen, "chunk.data: SHA-256 failed");
    return -1;
  }
  u->in_fill[i] += v->data_len;
  u->bytes_in += v->data_len;
  skip_full(u);
  return 0;
}

size_t cgs_upload_missing(const cgs_upload *u) {
  size_t n = 0;
  for (int i = 0; i < u->ninputs; i++)
    n += u->in_len[i] - u->in_fill[i];
  return n;
}

int cgs_upload_complete(const cgs_upload *u) {
  return u->cur == u->ninputs;
}

int cgs_upload_regions_check(const cgs_upload *u, grpc_status_code *code,
                             char *msg, size_t msglen) {
  for (int k = 0; k < u->nheld; k++)
    if (cgs_region_check(u->held[k], code, msg, msglen) != 0)
      return -1;
  return 0;
}

int cgs_upload_stage_header(cgs_upload *u, grpc_byte_buffer *bb,
                            const cgs_config *cfg, grpc_status_code *code,
                            char *msg, size_t msglen) {
  u->stage_req = (Convgrad__V1__StageRequest *)cgw_unpack(
      &convgrad__v1__stage_request__descriptor, bb);
  *code = GRPC_STATUS_INVALID_ARGUMENT;
  if (!u->stage_req ||
      u->stage_req->kind_case != CONVGRAD__V1__STAGE_REQUEST__KIND_HEADER) {
    snprintf(msg, msglen, "request: malformed StageRequest header message");
    return -1;
  }
  const Convgrad__V1__StageHeader *h = u->stage_req->header;
  if (h->sha256.len != CGS_STORE_ID_BYTES) {
    snprintf(msg, msglen, "header.sha256: %zu bytes, expected %d",
             h->sha256.len, CGS_STORE_ID_BYTES);
    return -1;
  }
  memcpy(u->stage_id, h->sha256.data, CGS_STORE_ID_BYTES);
  u->stage_private = h->private_id != 0;
  snprintf(u->shapes, sizeof u->shapes,
           "%s:", u->stage_private ? "private" : "sha256");
  cgs_store_id_hex(u->stage_id, u->shapes + strlen(u->shapes));
  if (h->byte_size == 0) {
    snprintf(msg, msglen, "header.byte_size: must be > 0");
    return -1;
  }
  if (h->byte_size > cfg->max_request_bytes) {
    *code = GRPC_STATUS_RESOURCE_EXHAUSTED;
    snprintf(msg, msglen,
             "header.byte_size: %" PRIu64 " bytes exceed the limit %" PRIu64
             " (--max-request-bytes); it cannot be staged on this server",
             h->byte_size, cfg->max_request_bytes);
    return -1;
  }
  if (h->data.len > h->byte_size) {
    snprintf(msg, msglen,
             "header.data: %zu bytes, more than byte_size %" PRIu64,
             h->data.len, h->byte_size);
    return -1;
  }
  u->ninputs = 1;
  u->in_len[0] = (size_t)h->byte_size; /* <= --max-request-bytes, 64 TiB */
  u->in_esize[0] = 1;
  return 0;
}

int cgs_upload_stage_take(cgs_upload *u, unsigned char **data, size_t *len,
                          grpc_status_code *code, char *msg, size_t msglen) {
  unsigned char got[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  if (!u->stage_private &&
      (!EVP_DigestFinal_ex(u->stage_sha, got, &n) || n != CGS_STORE_ID_BYTES ||
       memcmp(got, u->stage_id, CGS_STORE_ID_BYTES) != 0)) {
    char hex[2 * CGS_STORE_ID_BYTES + 1];
    cgs_store_id_hex(got, hex);
    *code = GRPC_STATUS_INVALID_ARGUMENT;
    snprintf(msg, msglen,
             "header.sha256: the %zu bytes sent hash to %s; nothing was "
             "staged",
             u->in_len[0], n == CGS_STORE_ID_BYTES ? hex : "?");
    return -1;
  }
  *data = u->in_buf[0];
  *len = u->in_len[0];
  u->in_buf[0] = NULL;
  return 0;
}
