/* test_proto_e2e.c - libcgclient against a server that breaks the wire
 * contract (tests/client/fake_server.py, Python grpcio): every malformed
 * response ends the call with CGC_EPROTO or CG_ELIMIT and a message, never
 * a crash, an over-read or an allocation sized by the server alone; a
 * correct answer split over two chunks is reassembled byte for byte. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cgc/client.h"
#include "harness.h"

static const char *fake_exe;

typedef struct expect_row {
  int rc;
  const char *needle;
} expect_row;

/* In fake_server.py's SCRIPT order. */
static const expect_row rows[] = {
    {CGC_EPROTO, "data chunk before the ResultHeader"},
    {CGC_EPROTO, "total_bytes disagrees"},
    {CGC_EPROTO, "more data than"},
    {CGC_EPROTO, "ended before all data"},
    {CGC_EPROTO, "shape overflows"},
    {CG_ELIMIT, "exceeds max_output_bytes"},
    {CGC_EPROTO, "truncated field tag"},
    {CGC_EPROTO, "unsupported wire type"},
    {CGC_EPROTO, "a ResultHeader before the last output was whole"},
    {CGC_EPROTO, "more outputs than were asked for"},
    {CGC_EPROTO, "dtype"},
    {CGC_EPROTO, "data is not the whole result"},
    {CGC_EPROTO, "more data than"},
    {0, NULL},
    {0, NULL},
};

/* The fake server lives in setup and teardown, so that a failing check
 * does not leave it running. */
static th_server srv;

static int start_fake(void **state) {
  (void)state;
  return th_server_start(&srv, fake_exe, 0, NULL) == 0 ? 0 : -1;
}

static int stop_fake(void **state) {
  (void)state;
  th_server_stop(&srv);
  return 0;
}

static void test_malformed_responses(void **state) {
  (void)state;
  char target[64], err[256];
  cgc_options o;
  cgc_channel *ch;
  snprintf(target, sizeof target, "127.0.0.1:%d", srv.port);
  cgc_options_init(&o);
  o.retries = 0; /* one call per scripted answer */
  assert_int_equal(cgc_channel_new(&ch, target, &o, err, sizeof err), 0);

  static float a[4], b[4];
  cgc_request req;
  cgc_request_init(&req);
  req.op = CG_OP_CONV_BWD_DATA;
  req.inputs[0] = (cgc_tensor_view){CG_DTYPE_F32,       4, {1, 1, 2, 2},
                                    CGC_LAYOUT_DEFAULT, a, sizeof a};
  req.inputs[1] = (cgc_tensor_view){CG_DTYPE_F32,       4, {1, 1, 2, 2},
                                    CGC_LAYOUT_DEFAULT, b, sizeof b};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    cgc_tensor *out = NULL;
    cgc_result res;
    cgc_status st;
    int rc = cgc_compute(ch, &req, &out, &res, &st);
    if (rc != rows[i].rc)
      fail_msg("answer %zu: rc %d (%s), expected %d", i, rc, st.message,
               rows[i].rc);
    if (rows[i].rc) {
      assert_null(out);
      assert_int_not_equal(st.code, GRPC_STATUS_OK);
      if (!strstr(st.message, rows[i].needle))
        fail_msg("answer %zu: message '%s' lacks '%s'", i, st.message,
                 rows[i].needle);
    } else {
      uint8_t want[16];
      for (int k = 0; k < 16; k++)
        want[k] = (uint8_t)k;
      assert_non_null(out);
      assert_int_equal(out->nbytes, 16);
      assert_int_equal(out->rank, 2);
      assert_memory_equal(out->data, want, 16);
      assert_string_equal(res.worker, "fake-0");
      cgc_tensor_free(out);
    }
  }
  cgc_channel_free(ch);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s fake_server.py\n", argv[0]);
    return 2;
  }
  fake_exe = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_malformed_responses, start_fake,
                                      stop_fake),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
