/* test_server_errors.c - bad requests get the right status with a message
 * naming the field, and the server keeps serving: garbage bytes, wrong
 * lengths, truncated and overlong streams, unknown enums, overflowing and
 * oversized shapes, limits, unknown methods. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ts.h"

static ts_server srv;
static grpc_channel *ch;
static ts_problem good; /* a valid small problem */

#define MIB (1024 * 1024)

static int setup(void **state) {
  (void)state;
  /* Small limits so that the limit paths are cheap to reach. */
  static const char *const args[] = {"--workers",
                                     "1",
                                     "--max-request-bytes",
                                     "4M",
                                     "--max-inflight-bytes",
                                     "8M",
                                     "--max-tensor-elements",
                                     "2000000",
                                     "--log-level",
                                     "debug",
                                     NULL};
  if (ts_fixture_start(&srv, &ch, args) != 0)
    return -1;
  ts_desc d = ts_tiny_desc(11);
  d.dfmt = CG_DATA_NCX;
  return ts_problem_init(&good, &d) == 0 ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  ts_problem_free(&good);
  return ts_fixture_stop(&srv, ch);
}

/* After every bad call: the server is healthy and computes correctly. */
static void assert_still_serving(void) {
  assert_int_equal(ts_health(ch, ""), 1);
  assert_int_equal(ts_problem_run(ch, &good, NULL), 0);
}

typedef struct raw {
  const void *bytes;
  size_t len;
} raw;

/* Sends messages as they are, half-closes when close_send, returns the
 * status and checks that msg contains want. */
static grpc_status_code send_raw(const raw *msgs, int n, int close_send,
                                 const char *want) {
  ts_call c;
  assert_int_equal(ts_call_open(&c, ch, "/convgrad.v1.ConvGrad/Compute", 10000),
                   0);
  for (int i = 0; i < n; i++)
    if (ts_call_send(&c, msgs[i].bytes, msgs[i].len) != 0)
      break;
  if (close_send)
    ts_call_close_send(&c);
  grpc_byte_buffer *bb = NULL;
  while (ts_call_recv(&c, &bb) == 0 && bb) {
    grpc_byte_buffer_destroy(bb);
    bb = NULL;
  }
  char msg[512];
  grpc_status_code code = ts_call_finish(&c, msg, sizeof msg);
  ts_call_free(&c);
  if (want && !strstr(msg, want)) {
    fprintf(stderr, "status %d message '%s' lacks '%s'\n", code, msg, want);
    fail();
  }
  return code;
}

/* Packs m into a malloc'd raw message. */
static raw pack(const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *b = malloc(n ? n : 1);
  protobuf_c_message_pack(m, b);
  return (raw){b, n};
}

static raw header_msg(const Convgrad__V1__ComputeHeader *h) {
  Convgrad__V1__ComputeRequest r = CONVGRAD__V1__COMPUTE_REQUEST__INIT;
  r.kind_case = CONVGRAD__V1__COMPUTE_REQUEST__KIND_HEADER;
  r.header = (Convgrad__V1__ComputeHeader *)h;
  return pack(&r.base);
}

static raw chunk_msg(uint32_t input, const void *data, size_t len) {
  Convgrad__V1__DataChunk dc = CONVGRAD__V1__DATA_CHUNK__INIT;
  dc.input = input;
  dc.data.data = (uint8_t *)data;
  dc.data.len = len;
  Convgrad__V1__ComputeRequest r = CONVGRAD__V1__COMPUTE_REQUEST__INIT;
  r.kind_case = CONVGRAD__V1__COMPUTE_REQUEST__KIND_CHUNK;
  r.chunk = &dc;
  return pack(&r.base);
}

static void free_raws(raw *m, int n) {
  for (int i = 0; i < n; i++)
    free((void *)m[i].bytes);
}

/* A header of the good problem with its attributes and tensors copied so
 * that a test can break one field. */
typedef struct hdr {
  Convgrad__V1__ComputeHeader h;
  Convgrad__V1__Attributes a;
  Convgrad__V1__Tensor t[2];
  Convgrad__V1__Tensor *tp[2];
} hdr;

static void hdr_init(hdr *x) {
  x->h = good.header;
  x->a = good.attrs;
  x->t[0] = good.tensors[0];
  x->t[1] = good.tensors[1];
  x->tp[0] = &x->t[0];
  x->tp[1] = &x->t[1];
  x->h.attrs = &x->a;
  x->h.inputs = x->tp;
}

static void test_garbage_bytes(void **state) {
  (void)state;
  static const char junk[] = "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"
                             "definitely not protobuf";
  raw m[1] = {{junk, sizeof junk}};
  assert_int_equal(send_raw(m, 1, 1, "malformed"),
                   GRPC_STATUS_INVALID_ARGUMENT);
  /* A truncated length-delimited field. */
  static const char trunc[] = {0x0a, 0x7f, 0x08, 0x01};
  raw m2[1] = {{trunc, sizeof trunc}};
  assert_int_equal(send_raw(m2, 1, 1, "malformed"),
                   GRPC_STATUS_INVALID_ARGUMENT);
  /* An empty message sets neither member of the oneof. */
  raw m3[1] = {{"", 0}};
  assert_int_equal(send_raw(m3, 1, 1, "neither header nor chunk"),
                   GRPC_STATUS_INVALID_ARGUMENT);
  /* Garbage after a valid header, in place of a chunk. */
  raw m4[2] = {header_msg(&good.header), {junk, sizeof junk}};
  assert_int_equal(send_raw(m4, 2, 1, "malformed"),
                   GRPC_STATUS_INVALID_ARGUMENT);
  free((void *)m4[0].bytes);
  assert_still_serving();
}

static void test_stream_order(void **state) {
  (void)state;
  /* No message at all. */
  assert_int_equal(send_raw(NULL, 0, 1, "ended before the header"),
                   GRPC_STATUS_INVALID_ARGUMENT);
  /* A chunk first. */
  raw m[1] = {chunk_msg(0, "abcd", 4)};
  assert_int_equal(send_raw(m, 1, 1, "first message must set header"),
                   GRPC_STATUS_INVALID_ARGUMENT);
  free_raws(m, 1);
  /* The header twice. */
  raw m2[2] = {header_msg(&good.header), header_msg(&good.header)};
  assert_int_equal(send_raw(m2, 2, 1, "header sent twice"),
                   GRPC_STATUS_INVALID_ARGUMENT);
  free_raws(m2, 2);
  /* Input 1 before input 0 is complete. */
  raw m3[2] = {header_msg(&good.header), chunk_msg(1, good.in[1], 16)};
  assert_int_equal(send_raw(m3, 2, 1, "chunk.input"),
                   GRPC_STATUS_INVALID_ARGUMENT);
  free_raws(m3, 2);
  /* An input index out of range. */
  raw m4[2] = {header_msg(&good.header), chunk_msg(7, good.in[0], 16)};
  assert_int_equal(send_raw(m4, 2, 1, "out of range"),
                   GRPC_STATUS_INVALID_ARGUMENT);
  free_raws(m4, 2);
  assert_still_serving();
}

static void test_wrong_lengths(void **state) {
  (void)state;
  size_t n0 = good.g.in_bytes[0];
  /* Truncated: half of input 0, then the client half-closes. */
  raw m[2] = {header_msg(&good.header), chunk_msg(0, good.in[0], n0 / 2)};
  assert_int_equal(send_raw(m, 2, 1, "stream ended after"),
                   GRPC_STATUS_INVALID_ARGUMENT);
  free_raws(m, 2);
  /* A chunk longer than what is left of the tensor. */
  unsigned char *big = calloc(1, n0 + 8);
  raw m2[2] = {header_msg(&good.header), chunk_msg(0, big, n0 + 4)};
  assert_int_equal(send_raw(m2, 2, 1, "overruns"),
                   GRPC_STATUS_INVALID_ARGUMENT);
  free_raws(m2, 2);
  /* Inline data longer than the tensor. */
  hdr x;
  hdr_init(&x);
  x.t[0].data.data = big;
  x.t[0].data.len = n0 + 8;
  raw m3[1] = {header_msg(&x.h)};
  assert_int_equal(send_raw(m3, 1, 1, "inputs[0].data"),
                   GRPC_STATUS_INVALID_ARGUMENT);
  free_raws(m3, 1);
  free(big);
  /* Extra bytes after every tensor is complete. The server answers as
   * soon as it can, so the extra chunk must come while it computes: 8
   * GFLOP (tens of ms) within this server's small limits give it that
   * time. */
  ts_desc sd = {.op = CG_OP_CONV_BWD_WEIGHTS,
                .dtype = CG_DTYPE_F32,
                .dfmt = CG_DATA_NXC,
                .groups = 1,
                .mb = 2,
                .ic = 128,
                .oc = 128,
                .nsp = 2,
                .is = {28, 28},
                .ks = {9, 9},
                .stride = 1,
                .pad = 4,
                .dil = 1,
                .seed = 12};
  ts_problem slow;
  assert_int_equal(ts_problem_init(&slow, &sd), 0);
  size_t s0 = slow.g.in_bytes[0], s1 = slow.g.in_bytes[1];
  static const char extra[4];
  raw m4[4] = {header_msg(&slow.header), chunk_msg(0, slow.in[0], s0),
               chunk_msg(1, slow.in[1], s1), chunk_msg(1, extra, 4)};
  assert_int_equal(send_raw(m4, 4, 1, "beyond the declared tensors"),
                   GRPC_STATUS_INVALID_ARGUMENT);
  free_raws(m4, 4);
  ts_problem_free(&slow);
  assert_still_serving();
  /* A job a worker runs goes on to its end, its result dropped, and the
   * call keeps its in-flight bytes until then (its line is written once
   * they are back); the tiny call above may have run on the
   * completion-queue thread meanwhile. The next tests need the budget
   * whole. */
  assert_int_equal(
      ts_server_wait_log(&srv, "bytes beyond the declared tensors", 1, 60000),
      0);
}

/* Sends x's header alone and expects code with want in the message. */
static void expect_header(const hdr *x, grpc_status_code code,
                          const char *want) {
  raw m[1] = {header_msg(&x->h)};
  assert_int_equal(send_raw(m, 1, 1, want), code);
  free_raws(m, 1);
}

static void test_unknown_enums(void **state) {
  (void)state;
  hdr x;
  hdr_init(&x);
  x.h.op = (Convgrad__V1__Op)9;
  expect_header(&x, GRPC_STATUS_INVALID_ARGUMENT, "header.op: unknown value 9");
  hdr_init(&x);
  x.h.op = CONVGRAD__V1__OP__OP_UNSPECIFIED;
  expect_header(&x, GRPC_STATUS_INVALID_ARGUMENT, "header.op: not set");
  hdr_init(&x);
  x.t[0].dtype = (Convgrad__V1__DType)42;
  expect_header(&x, GRPC_STATUS_INVALID_ARGUMENT, "inputs[0].dtype");
  hdr_init(&x);
  x.a.data_format = (Convgrad__V1__Layout)17;
  expect_header(&x, GRPC_STATUS_INVALID_ARGUMENT, "attrs.data_format");
  hdr_init(&x);
  x.a.auto_pad = (Convgrad__V1__AutoPad)5;
  expect_header(&x, GRPC_STATUS_INVALID_ARGUMENT, "attrs.auto_pad");
  hdr_init(&x);
  x.t[0].layout = (Convgrad__V1__Layout)8;
  expect_header(&x, GRPC_STATUS_INVALID_ARGUMENT,
                "inputs[0].layout: ? (8) is not a data layout");
  hdr_init(&x);
  x.t[1].dtype = CONVGRAD__V1__DTYPE__BF16;
  expect_header(&x, GRPC_STATUS_INVALID_ARGUMENT, "inputs[1].dtype");
  hdr_init(&x);
  x.h.output_layout = CONVGRAD__V1__LAYOUT__XIO;
  expect_header(&x, GRPC_STATUS_INVALID_ARGUMENT, "header.output_layout");
  assert_still_serving();
}

static void test_kernel_validation(void **state) {
  (void)state;
  hdr x;
  hdr_init(&x);
  int64_t strides[2] = {1, 0};
  x.a.strides = strides;
  /* The kernels' message names the field. */
  expect_header(&x, GRPC_STATUS_INVALID_ARGUMENT, "strides");
  hdr_init(&x);
  x.a.groups = 3; /* channels 4 are not divisible by 3 */
  expect_header(&x, GRPC_STATUS_INVALID_ARGUMENT, NULL);
  hdr_init(&x);
  x.h.n_inputs = 1;
  expect_header(&x, GRPC_STATUS_INVALID_ARGUMENT, "header.inputs");
  assert_still_serving();
}

static void test_overflowing_shapes(void **state) {
  (void)state;
  hdr x;
  hdr_init(&x);
  int64_t huge[4] = {INT64_C(1) << 40, INT64_C(1) << 40, INT64_C(1) << 40, 1};
  x.t[0].shape = huge;
  expect_header(&x, GRPC_STATUS_INVALID_ARGUMENT, "overflows");
  /* Representable but over --max-tensor-elements. */
  hdr_init(&x);
  int64_t big[4] = {1, 4, 1 << 15, 1 << 15};
  x.t[0].shape = big;
  expect_header(&x, GRPC_STATUS_RESOURCE_EXHAUSTED, "--max-tensor-elements");
  /* Negative and zero dims. */
  hdr_init(&x);
  int64_t neg[4] = {1, 4, -8, 8};
  x.t[0].shape = neg;
  expect_header(&x, GRPC_STATUS_INVALID_ARGUMENT, "inputs[0].shape[2]");
  /* Rank 7. */
  hdr_init(&x);
  int64_t r7[7] = {1, 1, 1, 1, 1, 1, 1};
  x.t[0].shape = r7;
  x.t[0].n_shape = 7;
  expect_header(&x, GRPC_STATUS_INVALID_ARGUMENT, "rank");
  assert_still_serving();
}

/* A request over --max-request-bytes, and in-flight reservations: while
 * one big request holds its reservation, the next one is refused, and
 * admitted again once the first is gone. */
static void test_limits(void **state) {
  (void)state;
  ts_desc d = {.op = CG_OP_CONV_BWD_DATA,
               .dtype = CG_DTYPE_F32,
               .dfmt = CG_DATA_NCX,
               .groups = 1,
               .mb = 1,
               .ic = 4,
               .oc = 4,
               .nsp = 2,
               .is = {600, 600},
               .ks = {1, 1},
               .stride = 1,
               .pad = 0,
               .dil = 1,
               .seed = 12};
  ts_problem big; /* 5.8 MB in: over 4M */
  assert_int_equal(ts_problem_init(&big, &d), 0);
  raw m[1] = {header_msg(&big.header)};
  assert_int_equal(send_raw(m, 1, 1, "--max-request-bytes"),
                   GRPC_STATUS_RESOURCE_EXHAUSTED);
  free_raws(m, 1);
  /* The log names what was refused. */
  assert_int_equal(ts_server_wait_log(&srv,
                                      "op=ConvolutionBackwardData dtype=f32 "
                                      "in=1x4x600x600,",
                                      1, 10000),
                   0);
  ts_problem_free(&big);

  /* 1.96 MB in, but 7.84 MB out: 9.8 MB could never fit the whole 8M
   * budget, which the message says instead of "retry later". */
  ts_desc wide = d;
  wide.is[0] = wide.is[1] = 700;
  wide.stride = 2;
  ts_problem never;
  assert_int_equal(ts_problem_init(&never, &wide), 0);
  raw n1[1] = {header_msg(&never.header)};
  assert_int_equal(send_raw(n1, 1, 1,
                            "more than the whole in-flight budget 8388608 "
                            "(--max-inflight-bytes); it cannot run on this "
                            "server"),
                   GRPC_STATUS_RESOURCE_EXHAUSTED);
  free_raws(n1, 1);
  ts_problem_free(&never);

  d.is[0] = d.is[1] = 400; /* 2.56 MB in + 2.56 MB out: 5.1 MB */
  ts_problem mid;
  assert_int_equal(ts_problem_init(&mid, &d), 0);
  ts_call hold;
  assert_int_equal(
      ts_call_open(&hold, ch, "/convgrad.v1.ConvGrad/Compute", 20000), 0);
  raw h = header_msg(&mid.header);
  assert_int_equal(ts_call_send(&hold, h.bytes, h.len), 0);
  /* The header is admitted asynchronously: retry until refused. */
  grpc_status_code code = GRPC_STATUS_OK;
  for (int i = 0; i < 50 && code != GRPC_STATUS_RESOURCE_EXHAUSTED; i++) {
    raw one[1] = {h};
    code = send_raw(one, 1, 1, NULL);
  }
  assert_int_equal(code, GRPC_STATUS_RESOURCE_EXHAUSTED);
  raw one[1] = {h};
  /* Transient: it names what other requests hold (the held call, and
   * refused attempts whose memory is not back yet) and says to retry. */
  send_raw(one, 1, 1, "but other requests hold ");
  send_raw(one, 1, 1, " of 8388608 (--max-inflight-bytes); retry later");
  /* Release the first reservation by cancelling; then it fits again. */
  ts_call_cancel(&hold);
  ts_call_free(&hold);
  free((void *)h.bytes);
  int ok = 0;
  for (int i = 0; i < 100 && !ok; i++) {
    ok = ts_problem_run(ch, &mid, NULL) == 0;
    if (!ok)
      usleep(20000);
  }
  assert_true(ok);
  ts_problem_free(&mid);
  assert_still_serving();
}

/* Issue 12's CPU hog: 1.77 MB of ConvolutionBackwardWeights that kept a
 * worker busy for 22 s (210.9 GFLOP of multiply-adds, and 21.2 M more for
 * its tensors and its padded input: cg_geom_work) is over the default
 * --max-request-flops 100G. It is refused on its header alone: the call
 * never half-closes nor uploads, so any other answer would wait for the
 * idle timeout or the call's deadline. */
static void test_flops_budget(void **state) {
  (void)state;
  hdr x;
  hdr_init(&x);
  static const int64_t data_shape[] = {1, 24, 24, 24, 16};
  static const int64_t wshape[] = {31, 31, 31, 16, 16};
  static const int64_t pads[] = {15, 15, 15};
  x.h.op = CONVGRAD__V1__OP__CONVOLUTION_BACKWARD_WEIGHTS;
  for (int i = 0; i < 2; i++) {
    x.t[i].shape = (int64_t *)data_shape;
    x.t[i].n_shape = 5;
    x.t[i].layout = CONVGRAD__V1__LAYOUT__NXC;
    x.t[i].data.data = NULL;
    x.t[i].data.len = 0;
  }
  x.a.data_format = CONVGRAD__V1__LAYOUT__NXC;
  x.a.weights_format = CONVGRAD__V1__LAYOUT__XIO;
  x.a.weights_shape = (int64_t *)wshape;
  x.a.n_weights_shape = 5;
  x.a.pads_begin = x.a.pads_end = (int64_t *)pads;
  x.a.n_pads_begin = x.a.n_pads_end = 3;
  x.a.n_strides = x.a.n_dilations = 0;
  x.a.n_dst_shape = x.a.n_output_padding = 0;
  raw m[1] = {header_msg(&x.h)};
  assert_int_equal(send_raw(m, 1, 0,
                            "request: needs 210878537984 flops, more than "
                            "--max-request-flops 100000000000; it cannot run "
                            "on this server"),
                   GRPC_STATUS_RESOURCE_EXHAUSTED);
  free_raws(m, 1);
  assert_still_serving();
}

static void test_unknown_method(void **state) {
  (void)state;
  ts_call c;
  assert_int_equal(ts_call_open(&c, ch, "/convgrad.v1.ConvGrad/Nope", 5000), 0);
  ts_call_send(&c, "", 0);
  ts_call_close_send(&c);
  char msg[256];
  assert_int_equal(ts_call_finish(&c, msg, sizeof msg),
                   GRPC_STATUS_UNIMPLEMENTED);
  ts_call_free(&c);
  assert_still_serving();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_garbage_bytes),
      cmocka_unit_test(test_stream_order),
      cmocka_unit_test(test_wrong_lengths),
      cmocka_unit_test(test_unknown_enums),
      cmocka_unit_test(test_kernel_validation),
      cmocka_unit_test(test_overflowing_shapes),
      cmocka_unit_test(test_limits),
      cmocka_unit_test(test_flops_budget),
      cmocka_unit_test(test_unknown_method),
  };
  if (getenv("TS_FILTER")) /* run one test: TS_FILTER=test_name */
    cmocka_set_test_filter(getenv("TS_FILTER"));
  return cmocka_run_group_tests(tests, setup, teardown);
}
