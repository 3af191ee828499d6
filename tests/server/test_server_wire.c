/* test_server_wire.c - unit tests of the shared wire codec (proto/cgw.c)
 * and the server's side of it (server/wire.c): the bulk-path protobuf
 * reader, on byte buffers split into slices at every possible place, and
 * the zero-copy chunk encoders. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>

#include "cgs_wire.h"
#include "convgrad/v1/convgrad.pb-c.h"

/* bytes split into slices of at most step bytes */
static grpc_byte_buffer *split_bb(const uint8_t *b, size_t n, size_t step) {
  grpc_slice s[4096];
  size_t k = 0;
  for (size_t off = 0; off < n || k == 0; off += step) {
    size_t len = n - off < step ? n - off : step;
    s[k++] = grpc_slice_from_copied_buffer((const char *)b + off, len);
    if (off + len >= n)
      break;
  }
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(s, k);
  for (size_t i = 0; i < k; i++)
    grpc_slice_unref(s[i]);
  return bb;
}

static size_t pack_chunk(uint8_t *out, uint32_t input, const uint8_t *data,
                         size_t len) {
  Convgrad__V1__DataChunk dc = CONVGRAD__V1__DATA_CHUNK__INIT;
  dc.input = input;
  dc.data.data = (uint8_t *)data;
  dc.data.len = len;
  Convgrad__V1__ComputeRequest r = CONVGRAD__V1__COMPUTE_REQUEST__INIT;
  r.kind_case = CONVGRAD__V1__COMPUTE_REQUEST__KIND_CHUNK;
  r.chunk = &dc;
  return protobuf_c_message_pack(&r.base, out);
}

static void test_chunk_any_split(void **state) {
  (void)state;
  uint8_t data[300], msg[400], got[300];
  for (int i = 0; i < 300; i++)
    data[i] = (uint8_t)(i * 7 + 1);
  size_t n = pack_chunk(msg, 3, data, sizeof data);
  for (size_t step = 1; step <= n; step++) {
    grpc_byte_buffer *bb = split_bb(msg, n, step);
    cgs_msg_kind kind = 0;
    cgs_chunk_view v;
    char err[128];
    assert_int_equal(cgs_wire_scan_request(bb, &kind, &v, err, sizeof err), 0);
    assert_int_equal(kind, CGS_MSG_CHUNK);
    assert_int_equal(v.input, 3);
    assert_int_equal(v.data_len, sizeof data);
    memset(got, 0, sizeof got);
    assert_int_equal(cgw_copy(bb, v.data_off, v.data_len, got), 0);
    assert_memory_equal(got, data, sizeof data);
    assert_int_equal(cgw_copy(bb, v.data_off, n, got), -1);
    grpc_byte_buffer_destroy(bb);
  }
}

static void test_header_detected(void **state) {
  (void)state;
  Convgrad__V1__ComputeHeader h = CONVGRAD__V1__COMPUTE_HEADER__INIT;
  h.op = CONVGRAD__V1__OP__CONVOLUTION_BACKWARD_WEIGHTS;
  Convgrad__V1__ComputeRequest r = CONVGRAD__V1__COMPUTE_REQUEST__INIT;
  r.kind_case = CONVGRAD__V1__COMPUTE_REQUEST__KIND_HEADER;
  r.header = &h;
  uint8_t msg[64];
  size_t n = protobuf_c_message_pack(&r.base, msg);
  grpc_byte_buffer *bb = split_bb(msg, n, 1);
  cgs_msg_kind kind = 0;
  cgs_chunk_view v;
  assert_int_equal(cgs_wire_scan_request(bb, &kind, &v, NULL, 0), 0);
  assert_int_equal(kind, CGS_MSG_HEADER);
  Convgrad__V1__ComputeRequest *u = (Convgrad__V1__ComputeRequest *)cgw_unpack(
      &convgrad__v1__compute_request__descriptor, bb);
  assert_non_null(u);
  assert_int_equal(u->header->op,
                   CONVGRAD__V1__OP__CONVOLUTION_BACKWARD_WEIGHTS);
  protobuf_c_message_free_unpacked(&u->base, NULL);
  grpc_byte_buffer_destroy(bb);
}

/* Unknown fields are skipped; a repeated chunk field merges, the last
 * value of each member winning, as protobuf parsers do. */
static void test_unknown_fields_and_merge(void **state) {
  (void)state;
  uint8_t msg[128];
  size_t n = 0;
  /* field 9 varint 300, field 10 fixed64, field 11 bytes "xy" */
  static const uint8_t unknown[] = {0x48, 0xac, 0x02, 0x51, 1,    2, 3,   4,
                                    5,    6,    7,    8,    0x5a, 2, 'x', 'y'};
  memcpy(msg, unknown, sizeof unknown);
  n += sizeof unknown;
  n += pack_chunk(msg + n, 1, (const uint8_t *)"first", 5);
  n += pack_chunk(msg + n, 0, (const uint8_t *)"second!", 7);
  grpc_byte_buffer *bb = split_bb(msg, n, 3);
  cgs_msg_kind kind;
  cgs_chunk_view v;
  assert_int_equal(cgs_wire_scan_request(bb, &kind, &v, NULL, 0), 0);
  assert_int_equal(kind, CGS_MSG_CHUNK);
  /* input 0 is not written (default), so input 1 from the first stays */
  assert_int_equal(v.input, 1);
  assert_int_equal(v.data_len, 7);
  char got[8] = {0};
  assert_int_equal(cgw_copy(bb, v.data_off, v.data_len, got), 0);
  assert_string_equal(got, "second!");
  grpc_byte_buffer_destroy(bb);
}

static void expect_malformed(const uint8_t *b, size_t n, const char *want) {
  grpc_byte_buffer *bb = split_bb(b, n, 2);
  cgs_msg_kind kind;
  cgs_chunk_view v;
  char err[128] = "";
  assert_int_equal(cgs_wire_scan_request(bb, &kind, &v, err, sizeof err), -1);
  assert_non_null(strstr(err, want));
  grpc_byte_buffer_destroy(bb);
}

static void test_malformed(void **state) {
  (void)state;
  static const uint8_t trunc_varint[] = {0x12, 0x80};
  expect_malformed(trunc_varint, sizeof trunc_varint, "malformed");
  static const uint8_t too_long[] = {0x12, 0x10, 0x08, 0x01};
  expect_malformed(too_long, sizeof too_long, "malformed");
  static const uint8_t inner_too_long[] = {0x12, 0x03, 0x12, 0x05, 'a'};
  expect_malformed(inner_too_long, sizeof inner_too_long, "malformed");
  static const uint8_t wrong_type[] = {0x10, 0x01}; /* field 2 as varint */
  expect_malformed(wrong_type, sizeof wrong_type, "malformed");
  static const uint8_t group[] = {0x1b, 0x1c}; /* field 3 start group */
  expect_malformed(group, sizeof group, "malformed");
  static const uint8_t field0[] = {0x02, 0x00};
  expect_malformed(field0, sizeof field0, "malformed");
  static const uint8_t ten_bytes[] = {0x48, 0xff, 0xff, 0xff, 0xff, 0xff,
                                      0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
  expect_malformed(ten_bytes, sizeof ten_bytes, "malformed");
  static const uint8_t only_unknown[] = {0x48, 0x01};
  expect_malformed(only_unknown, sizeof only_unknown, "neither");
  expect_malformed((const uint8_t *)"", 0, "neither");
}

static int unrefs;
static void count_unref(void *p) {
  (void)p;
  unrefs++;
}

static void test_zero_copy_chunk(void **state) {
  (void)state;
  static const size_t sizes[] = {0, 1, 127, 128, 16383, 16384, 1 << 20};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    size_t len = sizes[k];
    uint8_t *data = malloc(len ? len : 1);
    for (size_t i = 0; i < len; i++)
      data[i] = (uint8_t)(i * 31);
    unrefs = 0;
    grpc_byte_buffer *bb = cgw_response_chunk(data, len, count_unref, data);
    assert_int_equal(grpc_byte_buffer_length(bb), len + 1 +
                                                      (len < 128     ? 1
                                                       : len < 16384 ? 2
                                                                     : 3));
    Convgrad__V1__ComputeResponse *m =
        (Convgrad__V1__ComputeResponse *)cgw_unpack(
            &convgrad__v1__compute_response__descriptor, bb);
    assert_non_null(m);
    assert_int_equal(m->kind_case, CONVGRAD__V1__COMPUTE_RESPONSE__KIND_CHUNK);
    assert_int_equal(m->chunk.len, len);
    if (len)
      assert_memory_equal(m->chunk.data, data, len);
    protobuf_c_message_free_unpacked(&m->base, NULL);
    assert_int_equal(unrefs, 0); /* the buffer still references data */
    grpc_byte_buffer_destroy(bb);
    assert_int_equal(unrefs, 1);
    free(data);
  }
}

static void test_request_chunk_round_trip(void **state) {
  (void)state;
  static const uint32_t inputs[] = {0, 1, 300};
  static const size_t sizes[] = {0, 1, 127, 128, 16384};
  uint8_t data[16384], got[16384];
  for (size_t i = 0; i < sizeof data; i++)
    data[i] = (uint8_t)(i * 7 + 1);
  for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++)
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
      size_t len = sizes[k];
      unrefs = 0;
      grpc_byte_buffer *bb =
          cgw_request_chunk(inputs[i], data, len, count_unref, NULL);
      Convgrad__V1__ComputeRequest *m =
          (Convgrad__V1__ComputeRequest *)cgw_unpack(
              &convgrad__v1__compute_request__descriptor, bb);
      assert_non_null(m);
      assert_int_equal(m->kind_case, CONVGRAD__V1__COMPUTE_REQUEST__KIND_CHUNK);
      assert_int_equal(m->chunk->input, inputs[i]);
      assert_int_equal(m->chunk->data.len, len);
      protobuf_c_message_free_unpacked(&m->base, NULL);
      cgw_view v;
      assert_int_equal(cgw_scan_request(bb, &v, NULL, 0), 0);
      assert_int_equal(v.kind, CGW_CHUNK);
      assert_int_equal(v.input, inputs[i]);
      assert_int_equal(v.len, len);
      assert_int_equal(cgw_copy(bb, v.off, v.len, got), 0);
      assert_memory_equal(got, data, len);
      grpc_byte_buffer_destroy(bb);
      assert_int_equal(unrefs, 1);
    }
}

static size_t pack_response(uint8_t *out, uint64_t total, const char *chunk) {
  Convgrad__V1__ResultHeader h = CONVGRAD__V1__RESULT_HEADER__INIT;
  Convgrad__V1__ComputeResponse r = CONVGRAD__V1__COMPUTE_RESPONSE__INIT;
  h.total_bytes = total;
  h.worker = "w-1";
  if (chunk) {
    r.kind_case = CONVGRAD__V1__COMPUTE_RESPONSE__KIND_CHUNK;
    r.chunk.data = (uint8_t *)chunk;
    r.chunk.len = strlen(chunk);
  } else {
    r.kind_case = CONVGRAD__V1__COMPUTE_RESPONSE__KIND_HEADER;
    r.header = &h;
  }
  return protobuf_c_message_pack(&r.base, out);
}

static void expect_response(const uint8_t *b, size_t n, size_t step,
                            cgw_kind kind, const char *data) {
  grpc_byte_buffer *bb = split_bb(b, n, step);
  cgw_view v;
  char got[64] = "";
  assert_int_equal(cgw_scan_response(bb, &v, NULL, 0), 0);
  assert_int_equal(v.kind, kind);
  assert_int_equal(v.input, 0);
  assert_in_range(v.len, 0, sizeof got - 1);
  assert_int_equal(cgw_copy(bb, v.off, v.len, got), 0);
  if (kind == CGW_HEADER) {
    Convgrad__V1__ResultHeader *h =
        convgrad__v1__result_header__unpack(NULL, v.len, (uint8_t *)got);
    assert_non_null(h);
    assert_int_equal(h->total_bytes, 4096);
    assert_string_equal(h->worker, "w-1");
    convgrad__v1__result_header__free_unpacked(h, NULL);
  } else {
    assert_string_equal(got, data);
  }
  grpc_byte_buffer_destroy(bb);
}

static void test_response_scan(void **state) {
  (void)state;
  uint8_t hdr[64], chunk[64], both[128];
  size_t nh = pack_response(hdr, 4096, NULL);
  size_t nc = pack_response(chunk, 0, "the data");
  memcpy(both, hdr, nh);
  memcpy(both + nh, chunk, nc);
  for (size_t step = 1; step <= nh + nc; step++) {
    expect_response(hdr, nh, step, CGW_HEADER, NULL);
    expect_response(chunk, nc, step, CGW_CHUNK, "the data");
    /* Members of a oneof: the last one set wins. */
    expect_response(both, nh + nc, step, CGW_CHUNK, "the data");
  }
  grpc_byte_buffer *bb = split_bb((const uint8_t *)"", 0, 1);
  cgw_view v;
  assert_int_equal(cgw_scan_response(bb, &v, NULL, 0), 0);
  assert_int_equal(v.kind, CGW_NONE);
  grpc_byte_buffer_destroy(bb);
}

static void expect_bad_response(const uint8_t *b, size_t n, const char *want) {
  grpc_byte_buffer *bb = split_bb(b, n, 1);
  cgw_view v;
  char err[128] = "";
  assert_int_equal(cgw_scan_response(bb, &v, err, sizeof err), -1);
  assert_non_null(strstr(err, want));
  grpc_byte_buffer_destroy(bb);
}

static void test_response_malformed(void **state) {
  (void)state;
  static const uint8_t trunc_tag[] = {0xff, 0xff, 0xff};
  expect_bad_response(trunc_tag, sizeof trunc_tag, "truncated field tag");
  static const uint8_t wt7[] = {0x1f};
  expect_bad_response(wt7, sizeof wt7, "unsupported wire type");
  static const uint8_t chunk_varint[] = {0x10, 0x01};
  expect_bad_response(chunk_varint, sizeof chunk_varint, "wrong wire type");
  static const uint8_t past_end[] = {0x12, 0x05, 'a'};
  expect_bad_response(past_end, sizeof past_end, "past the end");
}

static void test_status_names(void **state) {
  (void)state;
  assert_string_equal(cgw_status_name(GRPC_STATUS_OK), "OK");
  assert_string_equal(cgw_status_name(GRPC_STATUS_RESOURCE_EXHAUSTED),
                      "RESOURCE_EXHAUSTED");
  assert_string_equal(cgw_status_name(GRPC_STATUS_UNAUTHENTICATED),
                      "UNAUTHENTICATED");
  assert_string_equal(cgw_status_name((grpc_status_code)17), "?");
  assert_string_equal(cgw_status_name((grpc_status_code)-1), "?");
}

int main(void) {
  grpc_init();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chunk_any_split),
      cmocka_unit_test(test_header_detected),
      cmocka_unit_test(test_unknown_fields_and_merge),
      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_zero_copy_chunk),
      cmocka_unit_test(test_request_chunk_round_trip),
      cmocka_unit_test(test_response_scan),
      cmocka_unit_test(test_response_malformed),
      cmocka_unit_test(test_status_names),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  grpc_shutdown();
  return rc;
}
