/* test_server_header.c - cgs_header_check without a server: a valid header
 * becomes the problem and input sizes it describes, defaults and adopted
 * layouts included; each kind of bad header is refused with its status
 * and a message naming the field. Then cgs_upload, the request's assembly
 * from those headers: inline data, chunks in order, refusals that leave
 * the counts as they were, and the shape tensor holding resolution back
 * until its bytes arrive. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cgs_buf.h"
#include "cgs_config.h"
#include "cgs_header.h"
#include "cgs_upload.h"
#include "cgw.h"

/* ConvolutionBackwardData, NCX/OIX: diff_dst 2x8x5x5 and weights 8x4x3x3,
 * f32, every tensor layout left unspecified. */
typedef struct hdr {
  Convgrad__V1__ComputeHeader h;
  Convgrad__V1__Attributes a;
  Convgrad__V1__Tensor t[3];
  Convgrad__V1__Tensor *tp[3];
  int64_t dst_dims[4], w_dims[4], shape_dims[1];
  int64_t strides[2], pads[2], dil[2], dst_shape[4];
  int32_t shape_values[4];
} hdr;

static void hdr_init(hdr *x) {
  static const int64_t dst[4] = {2, 8, 5, 5}, w[4] = {8, 4, 3, 3},
                       src[4] = {2, 4, 7, 7};
  memset(x, 0, sizeof *x);
  convgrad__v1__compute_header__init(&x->h);
  convgrad__v1__attributes__init(&x->a);
  memcpy(x->dst_dims, dst, sizeof dst);
  memcpy(x->w_dims, w, sizeof w);
  memcpy(x->dst_shape, src, sizeof src);
  for (int i = 0; i < 2; i++) {
    x->strides[i] = 1;
    x->pads[i] = 0;
    x->dil[i] = 1;
  }
  x->a.n_strides = x->a.n_pads_begin = x->a.n_pads_end = x->a.n_dilations = 2;
  x->a.strides = x->strides;
  x->a.pads_begin = x->a.pads_end = x->pads;
  x->a.dilations = x->dil;
  x->a.data_format = CONVGRAD__V1__LAYOUT__NCX;
  x->a.weights_format = CONVGRAD__V1__LAYOUT__OIX;
  x->a.n_dst_shape = 4;
  x->a.dst_shape = x->dst_shape;
  for (int i = 0; i < 3; i++) {
    convgrad__v1__tensor__init(&x->t[i]);
    x->tp[i] = &x->t[i];
  }
  x->t[0].dtype = x->t[1].dtype = CONVGRAD__V1__DTYPE__F32;
  x->t[0].n_shape = x->t[1].n_shape = 4;
  x->t[0].shape = x->dst_dims;
  x->t[1].shape = x->w_dims;
  x->h.op = CONVGRAD__V1__OP__CONVOLUTION_BACKWARD_DATA;
  x->h.attrs = &x->a;
  x->h.n_inputs = 2;
  x->h.inputs = x->tp;
}

/* Adds the optional shape tensor: S32, 4 values (no data needed here). */
static void add_shape_tensor(hdr *x) {
  x->shape_dims[0] = 4;
  x->t[2].dtype = CONVGRAD__V1__DTYPE__S32;
  x->t[2].n_shape = 1;
  x->t[2].shape = x->shape_dims;
  x->h.n_inputs = 3;
}

static cgs_config cfg;

static int setup(void **state) {
  (void)state;
  char err[256];
  cgs_buf_init(0);
  return cgs_config_defaults(&cfg, err, sizeof err);
}

/* Checks x against limits c: 0 when accepted, else -1 with *code and msg. */
static int check(const hdr *x, const cgs_config *c, cgs_header_info *info,
                 grpc_status_code *code, char *msg, size_t msglen) {
  *code = GRPC_STATUS_OK;
  msg[0] = '\0';
  return cgs_header_check(&x->h, c, info, code, msg, msglen);
}

/* Expects x to pass cfg's checks, filling *info. */
static void expect_accepted(const hdr *x, cgs_header_info *info) {
  grpc_status_code code;
  char msg[512];
  if (check(x, &cfg, info, &code, msg, sizeof msg) != 0)
    fail_msg("refused (%d): %s", code, msg);
}

/* Expects x to be refused under limits c with code and a message
 * containing want. */
static void expect_refused_by(const hdr *x, const cgs_config *c,
                              grpc_status_code code, const char *want) {
  cgs_header_info info;
  grpc_status_code got;
  char msg[512];
  assert_int_equal(check(x, c, &info, &got, msg, sizeof msg), -1);
  assert_int_equal(got, code);
  if (!strstr(msg, want))
    fail_msg("message '%s' lacks '%s'", msg, want);
}

static void expect_refused(const hdr *x, grpc_status_code code,
                           const char *want) {
  expect_refused_by(x, &cfg, code, want);
}

static void test_valid_header(void **state) {
  (void)state;
  hdr x;
  hdr_init(&x);
  cgs_header_info info;
  expect_accepted(&x, &info);
  assert_int_equal(info.prob.op, CG_OP_CONV_BWD_DATA);
  assert_int_equal(info.prob.dtype, CG_DTYPE_F32);
  assert_int_equal(info.prob.attrs.groups, 1); /* 0 on the wire */
  assert_int_equal(info.prob.attrs.data_format, CG_DATA_NCX);
  assert_int_equal(info.prob.attrs.weights_format, CG_WEIGHTS_OIX);
  assert_int_equal(info.prob.attrs.dst_shape.len, 4);
  assert_int_equal(info.prob.input_dims[1].len, 4);
  assert_int_equal(info.prob.input_dims[1].v[0], 8);
  assert_int_equal(info.ninputs, 2);
  assert_int_equal(info.in_len[0], 2 * 8 * 5 * 5 * 4);
  assert_int_equal(info.in_len[1], 8 * 4 * 3 * 3 * 4);
  assert_int_equal(info.chunk_bytes, cfg.chunk_bytes);

  /* bf16 halves the sizes; a shape tensor of 4 S32 values is 16 bytes. */
  x.t[0].dtype = x.t[1].dtype = CONVGRAD__V1__DTYPE__BF16;
  add_shape_tensor(&x);
  expect_accepted(&x, &info);
  assert_int_equal(info.ninputs, 3);
  assert_int_equal(info.in_len[0], 2 * 8 * 5 * 5 * 2);
  assert_int_equal(info.in_len[2], 16);
}

static void test_layouts_adopted_and_checked(void **state) {
  (void)state;
  hdr x;
  cgs_header_info info;
  /* Unspecified attributes take the tensors' layouts. */
  hdr_init(&x);
  x.a.data_format = x.a.weights_format = 0;
  x.t[0].layout = CONVGRAD__V1__LAYOUT__NXC;
  x.t[1].layout = CONVGRAD__V1__LAYOUT__XIO;
  expect_accepted(&x, &info);
  assert_int_equal(info.prob.attrs.data_format, CG_DATA_NXC);
  assert_int_equal(info.prob.attrs.weights_format, CG_WEIGHTS_XIO);
  /* Set on both sides, they must agree. */
  hdr_init(&x);
  x.t[0].layout = CONVGRAD__V1__LAYOUT__NXC;
  expect_refused(&x, GRPC_STATUS_INVALID_ARGUMENT,
                 "inputs[0].layout: NXC disagrees with attrs.data_format NCX");
  hdr_init(&x);
  x.t[1].layout = CONVGRAD__V1__LAYOUT__NCX;
  expect_refused(&x, GRPC_STATUS_INVALID_ARGUMENT,
                 "inputs[1].layout: NCX (1) is not a weights layout");
  hdr_init(&x);
  x.t[0].layout = (Convgrad__V1__Layout)8;
  expect_refused(&x, GRPC_STATUS_INVALID_ARGUMENT,
                 "inputs[0].layout: ? (8) is not a data layout");
  hdr_init(&x);
  x.a.data_format = CONVGRAD__V1__LAYOUT__OIX;
  expect_refused(&x, GRPC_STATUS_INVALID_ARGUMENT,
                 "attrs.data_format: OIX (3) is not NCX or NXC");
  hdr_init(&x);
  x.a.weights_format = CONVGRAD__V1__LAYOUT__NXC;
  expect_refused(&x, GRPC_STATUS_INVALID_ARGUMENT, "attrs.weights_format");
  hdr_init(&x);
  x.h.output_layout = CONVGRAD__V1__LAYOUT__XIO; /* diff_src is data */
  expect_refused(&x, GRPC_STATUS_INVALID_ARGUMENT,
                 "header.output_layout: XIO (4) is not a data layout");
  hdr_init(&x);
  x.h.output_layout = CONVGRAD__V1__LAYOUT__NXC;
  expect_accepted(&x, &info);
  assert_int_equal(info.prob.out_data_format, CG_DATA_NXC);
}

static void test_bad_enums_and_counts(void **state) {
  (void)state;
  hdr x;
  hdr_init(&x);
  x.h.op = CONVGRAD__V1__OP__OP_UNSPECIFIED;
  expect_refused(&x, GRPC_STATUS_INVALID_ARGUMENT, "header.op: not set");
  hdr_init(&x);
  x.h.op = (Convgrad__V1__Op)9;
  expect_refused(&x, GRPC_STATUS_INVALID_ARGUMENT,
                 "header.op: unknown value 9");
  hdr_init(&x);
  x.h.n_inputs = 1;
  expect_refused(&x, GRPC_STATUS_INVALID_ARGUMENT,
                 "header.inputs: ConvolutionBackwardData takes diff_dst and "
                 "weights, optionally then dst_shape, got 1 tensors");
  hdr_init(&x);
  x.h.op = CONVGRAD__V1__OP__CONV_TRANSPOSE_BACKWARD_DATA; /* no shape input */
  add_shape_tensor(&x);
  expect_refused(&x, GRPC_STATUS_INVALID_ARGUMENT,
                 "ConvTransposeBackwardData takes diff_dst and weights, got 3 "
                 "tensors");
  hdr_init(&x);
  x.a.auto_pad = (Convgrad__V1__AutoPad)7;
  expect_refused(&x, GRPC_STATUS_INVALID_ARGUMENT,
                 "attrs.auto_pad: unknown value 7");
  hdr_init(&x);
  x.a.groups = -2;
  expect_refused(&x, GRPC_STATUS_INVALID_ARGUMENT,
                 "attrs.groups: must be > 0, got -2");
  hdr_init(&x);
  x.t[0].dtype = CONVGRAD__V1__DTYPE__S32;
  expect_refused(&x, GRPC_STATUS_INVALID_ARGUMENT,
                 "inputs[0].dtype: 4 is not F32, BF16 or F16");
  hdr_init(&x);
  x.t[1].dtype = CONVGRAD__V1__DTYPE__BF16;
  expect_refused(&x, GRPC_STATUS_INVALID_ARGUMENT,
                 "inputs[1].dtype: bf16 differs from inputs[0].dtype f32");
}

static void test_shape_tensor(void **state) {
  (void)state;
  hdr x;
  hdr_init(&x);
  add_shape_tensor(&x);
  x.t[2].dtype = CONVGRAD__V1__DTYPE__F32;
  expect_refused(&x, GRPC_STATUS_INVALID_ARGUMENT,
                 "inputs[2].dtype: a dst_shape tensor must be S32 or S64");
  hdr_init(&x);
  add_shape_tensor(&x);
  x.shape_dims[0] = 6;
  expect_refused(&x, GRPC_STATUS_INVALID_ARGUMENT,
                 "inputs[2].shape: a dst_shape tensor is 1-D with 1 to 5");
  hdr_init(&x);
  add_shape_tensor(&x);
  x.t[2].layout = CONVGRAD__V1__LAYOUT__NCX;
  expect_refused(&x, GRPC_STATUS_INVALID_ARGUMENT,
                 "inputs[2].layout: a shape tensor has no layout");
}

static void test_sizes_and_limits(void **state) {
  (void)state;
  hdr x;
  hdr_init(&x);
  x.dst_dims[2] = 0;
  expect_refused(&x, GRPC_STATUS_INVALID_ARGUMENT,
                 "inputs[0].shape[2]: must be > 0, got 0");
  hdr_init(&x);
  x.t[1].n_shape = 6;
  expect_refused(&x, GRPC_STATUS_INVALID_ARGUMENT,
                 "inputs[1].shape: rank 6, expected 3 to 5");
  hdr_init(&x);
  for (int i = 0; i < 4; i++)
    x.dst_dims[i] = INT64_C(1) << 20; /* 2^80 elements */
  expect_refused(&x, GRPC_STATUS_INVALID_ARGUMENT,
                 "inputs[0].shape: element count overflows");
  hdr_init(&x);
  x.dst_dims[0] = (int64_t)cfg.max_tensor_elements; /* times 8x5x5 */
  expect_refused(&x, GRPC_STATUS_RESOURCE_EXHAUSTED,
                 "elements exceed the limit");
  /* Under the element limit, over the request-size limit. */
  hdr_init(&x);
  cgs_config small = cfg;
  small.max_request_bytes = 2 * 8 * 5 * 5 * 4; /* diff_dst alone */
  expect_refused_by(&x, &small, GRPC_STATUS_RESOURCE_EXHAUSTED,
                    "--max-request-bytes");
  /* Inline data longer than the tensor. */
  hdr_init(&x);
  static uint8_t bytes[8 * 4 * 3 * 3 * 4 + 1];
  x.t[1].data.data = bytes;
  x.t[1].data.len = sizeof bytes;
  expect_refused(&x, GRPC_STATUS_INVALID_ARGUMENT,
                 "inputs[1].data: 1153 bytes, but shape and dtype make 1152");
}

static void test_response_chunk_bytes(void **state) {
  (void)state;
  hdr x;
  hdr_init(&x);
  cgs_header_info info;
  x.h.response_chunk_bytes = 4096;
  expect_accepted(&x, &info);
  assert_int_equal(info.chunk_bytes, 4096);
  x.h.response_chunk_bytes = UINT32_MAX; /* clamped under gRPC's 4 MiB */
  expect_accepted(&x, &info);
  assert_int_equal(info.chunk_bytes, CGS_MAX_CHUNK_BYTES);
  x.h.response_chunk_bytes = 1024;
  expect_accepted(&x, &info);
  assert_int_equal(info.chunk_bytes, 1024);
  x.h.response_chunk_bytes = 1023;
  expect_refused(&x, GRPC_STATUS_INVALID_ARGUMENT,
                 "header.response_chunk_bytes: must be 0 (the server's "
                 "default) or at least 1024, got 1023");
}

/* ---- cgs_upload ------------------------------------------------------- */

/* x as the first message of a stream. */
static grpc_byte_buffer *header_message(hdr *x) {
  Convgrad__V1__ComputeRequest r = CONVGRAD__V1__COMPUTE_REQUEST__INIT;
  r.kind_case = CONVGRAD__V1__COMPUTE_REQUEST__KIND_HEADER;
  r.header = &x->h;
  return cgw_pack(&r.base);
}

/* Passes a chunk of the n bytes at data for input to u; returns what
 * cgs_upload_chunk returns, with msg. */
static int chunk_of(cgs_upload *u, uint32_t input, const void *data, size_t n,
                    char *msg, size_t msglen) {
  Convgrad__V1__DataChunk d = CONVGRAD__V1__DATA_CHUNK__INIT;
  d.input = input;
  d.data.data = (uint8_t *)data;
  d.data.len = n;
  Convgrad__V1__ComputeRequest r = CONVGRAD__V1__COMPUTE_REQUEST__INIT;
  r.kind_case = CONVGRAD__V1__COMPUTE_REQUEST__KIND_CHUNK;
  r.chunk = &d;
  grpc_byte_buffer *bb = cgw_pack(&r.base);
  cgs_msg_kind kind;
  cgs_chunk_view v;
  assert_int_equal(cgs_wire_scan_request(bb, &kind, &v, msg, msglen), 0);
  assert_int_equal(kind, CGS_MSG_CHUNK);
  grpc_status_code code = GRPC_STATUS_OK;
  int rc = cgs_upload_chunk(u, &v, bb, &code, msg, msglen);
  grpc_byte_buffer_destroy(bb);
  if (rc != 0)
    assert_int_equal(code, GRPC_STATUS_INVALID_ARGUMENT);
  return rc;
}

/* A chunk of n bytes of value b. */
static int chunk(cgs_upload *u, uint32_t input, size_t n, unsigned char b,
                 char *msg, size_t msglen) {
  static unsigned char data[4096];
  memset(data, b, n);
  return chunk_of(u, input, data, n, msg, msglen);
}

/* Opens u with x's header and allocates its inputs. */
static void upload_open(cgs_upload *u, hdr *x) {
  grpc_status_code code;
  char msg[512];
  grpc_byte_buffer *bb = header_message(x);
  cgs_upload_init(u);
  if (cgs_upload_header(u, bb, &cfg, &code, msg, sizeof msg) != 0 ||
      cgs_upload_alloc(u, &code, msg, sizeof msg) != 0)
    fail_msg("refused (%d): %s", code, msg);
  grpc_byte_buffer_destroy(bb);
}

static void test_upload_chunks_in_order(void **state) {
  (void)state;
  hdr x;
  hdr_init(&x);
  cgs_upload u;
  upload_open(&u, &x);
  char msg[512];
  size_t dy = 2 * 8 * 5 * 5 * 4, w = 8 * 4 * 3 * 3 * 4;
  assert_int_equal(cgs_upload_missing(&u), dy + w);
  assert_int_equal(chunk(&u, 1, 16, 1, msg, sizeof msg), -1);
  assert_non_null(strstr(msg, "chunk.input: got 1, expected 0"));
  assert_int_equal(chunk(&u, 7, 16, 1, msg, sizeof msg), -1);
  assert_non_null(strstr(msg, "chunk.input: 7 is out of range (2 inputs)"));
  assert_int_equal(chunk(&u, 0, dy - 8, 1, msg, sizeof msg), 0);
  assert_int_equal(chunk(&u, 0, 16, 1, msg, sizeof msg), -1);
  assert_non_null(strstr(msg, "inputs[0].data: chunk of 16 bytes overruns"));
  /* Refusals changed nothing. */
  assert_int_equal(u.in_fill[0], dy - 8);
  assert_int_equal(u.bytes_in, dy - 8);
  assert_int_equal(chunk(&u, 0, 8, 2, msg, sizeof msg), 0);
  assert_int_equal(u.cur, 1);
  assert_int_equal(u.in_buf[0][dy - 9], 1);
  assert_int_equal(u.in_buf[0][dy - 8], 2);
  assert_int_equal(chunk(&u, 1, w, 3, msg, sizeof msg), 0);
  assert_true(cgs_upload_complete(&u));
  assert_int_equal(cgs_upload_missing(&u), 0);
  grpc_status_code code;
  if (cgs_upload_resolve(&u, &cfg, &code, msg, sizeof msg) != 0)
    fail_msg("not resolved: %s", msg);
  assert_null(u.req);
  assert_int_equal(cgs_upload_out_bytes(&u), 2 * 4 * 7 * 7 * 4);
  cgs_upload_close(&u);
}

static void test_upload_inline_data(void **state) {
  (void)state;
  static unsigned char w[8 * 4 * 3 * 3 * 4];
  hdr x;
  hdr_init(&x);
  x.t[1].data.data = w;
  x.t[1].data.len = sizeof w;
  cgs_upload u;
  upload_open(&u, &x);
  assert_int_equal(u.bytes_in, sizeof w);
  assert_int_equal(u.cur, 0);
  char msg[512];
  /* The last bytes complete the request. */
  size_t dy = 2 * 8 * 5 * 5 * 4;
  assert_int_equal(chunk(&u, 0, dy / 2, 0, msg, sizeof msg), 0);
  assert_false(cgs_upload_complete(&u));
  assert_int_equal(chunk(&u, 0, dy / 2, 0, msg, sizeof msg), 0);
  assert_true(cgs_upload_complete(&u));
  cgs_upload_close(&u);
}

static void test_upload_waits_for_shape_tensor(void **state) {
  (void)state;
  hdr x;
  hdr_init(&x);
  add_shape_tensor(&x);
  x.a.n_dst_shape = 0;
  cgs_upload u;
  upload_open(&u, &x);
  assert_int_equal(u.ninputs, 3);
  assert_true(cgs_upload_needs_shape(&u));
  char msg[512];
  size_t dy = 2 * 8 * 5 * 5 * 4, w = 8 * 4 * 3 * 3 * 4;
  assert_int_equal(chunk(&u, 0, dy, 0, msg, sizeof msg), 0);
  assert_int_equal(chunk(&u, 1, w, 0, msg, sizeof msg), 0);
  /* dst_shape 2x4x7x7 as four little-endian s32 values. */
  static const int32_t shape[4] = {2, 4, 7, 7};
  assert_int_equal(chunk_of(&u, 2, shape, sizeof shape, msg, sizeof msg), 0);
  assert_false(cgs_upload_needs_shape(&u));
  assert_true(cgs_upload_complete(&u));
  grpc_status_code code;
  if (cgs_upload_resolve(&u, &cfg, &code, msg, sizeof msg) != 0)
    fail_msg("not resolved: %s", msg);
  assert_int_equal(u.layer.out_dims[CG_GRAD_DIFF_SRC][2], 7);
  cgs_upload_close(&u);
}

static void test_upload_refused_header_keeps_op(void **state) {
  (void)state;
  hdr x;
  hdr_init(&x);
  x.t[0].dtype = CONVGRAD__V1__DTYPE__BF16;
  cgs_upload u;
  cgs_upload_init(&u);
  grpc_byte_buffer *bb = header_message(&x);
  grpc_status_code code;
  char msg[512];
  assert_int_equal(cgs_upload_header(&u, bb, &cfg, &code, msg, sizeof msg), -1);
  grpc_byte_buffer_destroy(bb);
  assert_int_equal(code, GRPC_STATUS_INVALID_ARGUMENT);
  assert_int_equal(u.prob.op, CG_OP_CONV_BWD_DATA);
  assert_string_equal(u.shapes, "2x8x5x5,8x4x3x3");
  cgs_upload_close(&u);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_upload_chunks_in_order),
      cmocka_unit_test(test_upload_inline_data),
      cmocka_unit_test(test_upload_waits_for_shape_tensor),
      cmocka_unit_test(test_upload_refused_header_keeps_op),
      cmocka_unit_test(test_valid_header),
      cmocka_unit_test(test_layouts_adopted_and_checked),
      cmocka_unit_test(test_bad_enums_and_counts),
      cmocka_unit_test(test_shape_tensor),
      cmocka_unit_test(test_sizes_and_limits),
      cmocka_unit_test(test_response_chunk_bytes),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
