/* fuzz_request.c - libFuzzer target over a Compute request's path without
 * sockets: the messages a client streams are decoded (cgs_wire_scan_request,
 * the header's protobuf), checked (cgs_header_check through cgs_upload) and
 * assembled chunk by chunk into the input tensors, in the order and with
 * the limits call.c applies; a request that resolves is then computed by
 * the plain reference (cg_reference_layer) on its assembled tensors, so
 * that a geometry the checks let through is also walked.
 *
 * Input: messages, each a little-endian u16 length and that many bytes of
 * a serialized ComputeRequest. Each becomes a grpc_byte_buffer of two
 * slices, cut a third of the way in, as gRPC hands over messages that
 * straddle its reads.
 *
 * Requests may name a shared-memory region "r" of 64 KiB (registered at
 * start on an object of this process): tensors in it are read and outputs
 * written there, as the server does. They may name staged tensors: the
 * store holds STAGED_BYTES[k] bytes of STAGED_FILL for each k (ids their
 * SHA-256), staged at start, and the same bytes as private entries of
 * the requests' peer "" (ids: 32 bytes of PRIVATE_ID + k).
 *
 * An input whose first byte is 0xff is a Stage stream instead (the
 * messages follow it): the StageHeader checked, the chunks assembled and
 * hashed (unless its id is private), and the verified bytes put into a
 * store of their own.
 *
 * It aborts (a finding) when a path that must hold does not: a resolved
 * request whose inputs disagree with its geometry (INTERNAL), or the
 * reference failing on a resolved layer. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>
#include <openssl/evp.h>

#include "cg/reference.h"
#include "cgs_buf.h"
#include "cgs_config.h"
#include "cgs_upload.h"

/* The limits the request path reads. Small ones keep each run fast and
 * its memory low; the checks are the same whatever the numbers. */
static const cgs_config cfg = {
    .max_request_bytes = 1u << 20,
    .max_tensor_elements = 1u << 18,
    .max_request_flops = 2000000, /* the reference computes every request */
    .chunk_bytes = 1u << 20,
    .max_stride = CG_LIMIT_STRIDE_DEFAULT,
    .max_dilation = CG_LIMIT_DILATION_DEFAULT,
    .max_pad = CG_LIMIT_PAD_DEFAULT,
    .max_output_padding = CG_LIMIT_OUTPUT_PADDING_DEFAULT,
    .max_effective_extent = CG_LIMIT_EFFECTIVE_EXTENT_DEFAULT,
    .max_padded_extent = CG_LIMIT_PADDED_EXTENT_DEFAULT,
};

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void must(int ok, const char *what, const char *msg) {
  if (!ok) {
    fprintf(stderr, "fuzz_request: %s: %s\n", what, msg);
    abort();
  }
}

static cgs_regions *regions;
/* The store Compute requests name (fixed after start), and the one Stage
 * streams fill. */
static cgs_store *store, *stage_store;
#define STAGED_FILL 0x3c
static const size_t STAGED_BYTES[] = {128, 216};
#define PRIVATE_ID 0xa0

/* Region "r": an object made here and unlinked again once mapped. */
static void register_region(void) {
  char key[64], msg[256];
  grpc_status_code code;
  snprintf(key, sizeof key, "/convgrad-fuzz-%ld", (long)getpid());
  int fd = shm_open(key, O_RDWR | O_CREAT | O_EXCL, 0600);
  must(fd >= 0 && ftruncate(fd, 65536) == 0, "shm_open", key);
  must(cgs_regions_new(&regions, 4, 1u << 20, "convgrad-", msg, sizeof msg) ==
           0,
       "regions", msg);
  must(cgs_regions_register(regions, "", "r", key, 0, 65536, &code, msg,
                            sizeof msg) == 0,
       "register", msg);
  shm_unlink(key);
  close(fd);
}

/* The fixed entries of store. */
static void stage_fixed(void) {
  char msg[256];
  grpc_status_code code;
  must(cgs_store_new(&store, 1u << 20, UINT64_MAX / 2, 1u << 20, msg,
                     sizeof msg) == 0 &&
           cgs_store_new(&stage_store, 1u << 20, 1000, 1u << 19, msg,
                         sizeof msg) == 0,
       "store", msg);
  for (size_t i = 0; i < 2 * sizeof STAGED_BYTES / sizeof *STAGED_BYTES; i++) {
    size_t k = i / 2, len = STAGED_BYTES[k];
    int priv = i % 2;
    unsigned char *data = cgs_buf_alloc(len), id[32];
    unsigned n = 0;
    int retry;
    must(data != NULL, "cgs_buf_alloc", "staged");
    memset(data, STAGED_FILL, len);
    memset(id, PRIVATE_ID + (int)k, sizeof id);
    must(priv || EVP_Digest(data, len, id, &n, EVP_sha256(), NULL) == 1,
         "sha256", "staged");
    must(cgs_store_put(store, "", "", priv, id, data, len, 0, &retry, &code,
                       msg, sizeof msg) == 0,
         "stage", msg);
  }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  grpc_init();
  cgs_buf_init(0);
  register_region();
  stage_fixed();
  return 0;
}

static grpc_byte_buffer *message(const uint8_t *p, size_t n) {
  size_t cut = n / 3;
  grpc_slice s[2] = {
      grpc_slice_from_copied_buffer((const char *)p, cut),
      grpc_slice_from_copied_buffer((const char *)p + cut, n - cut)};
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(s, 2);
  grpc_slice_unref(s[0]);
  grpc_slice_unref(s[1]);
  return bb;
}

/* The request is whole: resolve if the shape tensor held it back, then
 * compute it with the reference. */
static void run(cgs_upload *u) {
  grpc_status_code code = GRPC_STATUS_OK;
  char msg[512] = "";
  if (!u->resolved &&
      cgs_upload_resolve(u, &cfg, &code, msg, sizeof msg) != 0) {
    must(code != GRPC_STATUS_INTERNAL, "resolve", msg);
    return;
  }
  void *out[CG_GRAD_COUNT] = {0}, *own[CG_GRAD_COUNT] = {0};
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    if (u->layer.grads & CG_GRAD_BIT(g)) {
      out[g] = u->out_at[g];
      if (!out[g])
        must((out[g] = own[g] = malloc(u->layer.out_bytes[g] + 1)) != NULL,
             "malloc", "outputs");
    }
  const void *in[3] = {u->in_buf[0], u->in_buf[1], u->in_buf[2]};
  int rc = cg_reference_layer(&u->layer, in, out, msg, sizeof msg);
  must(rc == 0, "cg_reference_layer", msg);
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    free(own[g]);
}

/* A Stage stream's upload is whole: its bytes, once they hash to its id,
 * go into stage_store. */
static void stage(cgs_upload *u) {
  grpc_status_code code = GRPC_STATUS_OK;
  char msg[512] = "";
  unsigned char *bytes;
  size_t len;
  int retry;
  if (cgs_upload_stage_take(u, &bytes, &len, &code, msg, sizeof msg) != 0 ||
      cgs_store_put(stage_store, "", "", u->stage_private, u->stage_id, bytes,
                    len, 0, &retry, &code, msg, sizeof msg) != 0)
    must(code != GRPC_STATUS_INTERNAL, "stage", msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  cgs_upload u;
  cgs_upload_init(&u);
  cgs_upload_use_regions(&u, regions, NULL, "");
  cgs_upload_use_store(&u, store, "");
  int staging = size && data[0] == 0xff;
  if (staging) {
    data++;
    size--;
  }
  int header_done = 0;
  while (size >= 2) {
    size_t n = (size_t)data[0] | (size_t)data[1] << 8;
    data += 2;
    size -= 2;
    if (n > size)
      n = size;
    grpc_byte_buffer *bb = message(data, n);
    data += n;
    size -= n;
    grpc_status_code code = GRPC_STATUS_OK;
    char msg[512] = "";
    cgs_msg_kind kind;
    cgs_chunk_view v;
    int stop = cgs_wire_scan_request(bb, &kind, &v, msg, sizeof msg) != 0;
    if (!stop && !header_done) {
      header_done = 1;
      stop =
          kind != CGS_MSG_HEADER ||
          (staging
               ? cgs_upload_stage_header(&u, bb, &cfg, &code, msg, sizeof msg)
               : cgs_upload_header(&u, bb, &cfg, &code, msg, sizeof msg)) !=
              0 ||
          cgs_upload_alloc(&u, &code, msg, sizeof msg) != 0 ||
          (!staging && !cgs_upload_needs_shape(&u) &&
           cgs_upload_resolve(&u, &cfg, &code, msg, sizeof msg) != 0);
      must(code != GRPC_STATUS_INTERNAL, "header", msg);
    } else if (!stop) {
      stop = kind != CGS_MSG_CHUNK ||
             cgs_upload_chunk(&u, &v, bb, &code, msg, sizeof msg) != 0;
    }
    grpc_byte_buffer_destroy(bb);
    if (stop)
      break;
    if (cgs_upload_complete(&u)) {
      (staging ? stage : run)(&u);
      break;
    }
  }
  cgs_upload_close(&u);
  return 0;
}
