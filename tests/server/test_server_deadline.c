/* test_server_deadline.c - backpressure, deadlines and cancellation with a
 * single worker: a request whose deadline passes while it waits in the
 * queue leaves it with DEADLINE_EXCEEDED; a full queue answers
 * RESOURCE_EXHAUSTED at once, and calls still uploading count; a client
 * cancelling mid-stream stops the stream and releases its memory; a client that
 * stalls its upload or stops reading its result is cut off after --idle-timeout
 * and its memory comes back; bytes sent past the tensors while the result
 * streams end the call with INVALID_ARGUMENT, logged as such; the server stays
 * healthy throughout. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ts.h"

static ts_server srv;
static grpc_channel *ch;
static ts_problem small; /* fast, checked */
/* 52 MB in + 52 MB out: fits once in the fixture's 160M, not twice. Made
 * once: its reference (the plain C loops, slow under a sanitizer) is
 * computed at its first check and kept. */
static ts_problem big;
/* Under a sanitizer big is streamed only where a test is about its
 * stream, not run again after each (see assert_big_fits). */
static int sanitized;
/* --idle-timeout in seconds: short, so that the stall tests end soon, but
 * longer under a sanitizer, where the instrumented client and server can
 * pause for seconds while the big problem's 52 MB stream (every
 * assert_big_fits) is read. */
static int idle_s;

static int setup(void **state) {
  (void)state;
  sanitized = getenv("CG_SANITIZED") != NULL;
  idle_s = sanitized ? 6 : 2;
  char idle[16];
  snprintf(idle, sizeof idle, "%d", idle_s);
  const char *const args[] = {"--workers",
                              "1",
                              "--queue-depth",
                              "2",
                              "--max-inflight-bytes",
                              "160M",
                              "--log-level",
                              "debug",
                              "--idle-timeout",
                              idle,
                              "--max-request-flops",
                              "0",
                              NULL};
  if (ts_fixture_start(&srv, &ch, args) != 0)
    return -1;
  ts_desc d = {.op = CG_OP_CONV_BWD_WEIGHTS,
               .dtype = CG_DTYPE_F32,
               .dfmt = CG_DATA_NXC,
               .groups = 1,
               .mb = 1,
               .ic = 4,
               .oc = 4,
               .nsp = 2,
               .is = {6, 6},
               .ks = {3, 3},
               .stride = 1,
               .pad = 1,
               .dil = 1,
               .seed = 31};
  if (ts_problem_init(&small, &d) != 0 || ts_problem_reference(&small) != 0)
    return -1;
  ts_desc b = {.op = CG_OP_CONV_BWD_DATA,
               .dtype = CG_DTYPE_F32,
               .dfmt = CG_DATA_NCX,
               .groups = 1,
               .mb = 1,
               .ic = 16,
               .oc = 16,
               .nsp = 2,
               .is = {900, 900},
               .ks = {1, 1},
               .stride = 1,
               .pad = 0,
               .dil = 1,
               .seed = 33};
  return ts_problem_init(&big, &b);
}

static int teardown(void **state) {
  (void)state;
  ts_problem_free(&small);
  ts_problem_free(&big);
  return ts_fixture_stop(&srv, ch);
}

static void assert_healthy(void) {
  assert_int_equal(ts_health(ch, ""), 1);
  assert_int_equal(ts_problem_run(ch, &small, NULL), 0);
}

/* Waits until the server log has count lines containing needle: 10 s
 * past an --idle-timeout, which some of the lines wait for (a stalled
 * download's clock starts only once the flow-control windows are full). */
static void wait_log(const char *needle, int count) {
  assert_int_equal(
      ts_server_wait_log(&srv, needle, count, 10000 + idle_s * 1000), 0);
}

static void test_deadline_while_queued_and_queue_full(void **state) {
  (void)state;
  ts_problem slow;
  double took;
  assert_int_equal(ts_problem_slow(ch, &slow, 1000, &took), 0);

  /* Everything below must happen while busy holds the only worker, so it
   * takes as little of busy's time as it can: an eighth of the calibrated
   * time for the expiry, then two admissions and one refusal. (Busy may
   * run faster than the calibration did when that shared the cores.) */
  int admitted = ts_server_log_count(&srv, "admitted");
  int runs = ts_server_log_count(&srv, "runs a job");
  int expired = ts_server_log_count(&srv, "status=DEADLINE_EXCEEDED");
  ts_bg busy, q1, q2, q3;
  assert_int_equal(ts_bg_start(&busy, ch, &slow, 60000), 0);
  wait_log("runs a job", runs + 1);

  /* q1 waits in the queue and its deadline passes there: the server
   * takes it off the queue. */
  assert_int_equal(ts_bg_start(&q1, ch, &small, (int64_t)(took / 8)), 0);
  ts_bg_join(&q1);
  assert_int_equal(q1.code, GRPC_STATUS_DEADLINE_EXCEEDED);
  wait_log("status=DEADLINE_EXCEEDED", expired + 1);
  assert_int_equal(ts_server_log_count(&srv, "deadline exceeded while queued"),
                   1);

  /* Two more fill the queue (depth 2)... */
  assert_int_equal(ts_bg_start(&q2, ch, &small, 60000), 0);
  assert_int_equal(ts_bg_start(&q3, ch, &small, 60000), 0);
  wait_log("admitted", admitted + 4);

  /* ...so the next is refused at once, before any upload. */
  const void *data[2] = {small.in[0], small.in[1]};
  size_t len[2] = {small.g.in_bytes[0], small.g.in_bytes[1]};
  ts_result r;
  double t0 = ts_now_ms();
  assert_int_equal(ts_compute(ch, &small.header, data, len, NULL, &r), 0);
  assert_int_equal(r.code, GRPC_STATUS_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(r.msg, "queue full"));
  assert_true(ts_now_ms() - t0 < took / 2);
  ts_result_free(&r);

  ts_bg_join(&busy);
  ts_bg_join(&q2);
  ts_bg_join(&q3);
  assert_int_equal(busy.code, GRPC_STATUS_OK);
  assert_int_equal(q2.code, GRPC_STATUS_OK);
  assert_int_equal(q3.code, GRPC_STATUS_OK);
  assert_true(q2.checked && q3.checked);
  ts_problem_free(&slow);
  assert_healthy();
}

/* Opens a Compute call for tp on channel on, asking for 64 KiB result
 * chunks, and sends the header and the first upto bytes of its inputs in
 * 1 MiB chunks. */
static void send_request(ts_call *c, grpc_channel *on, const ts_problem *tp,
                         size_t upto) {
  assert_int_equal(ts_call_open(c, on, "/convgrad.v1.ConvGrad/Compute", 60000),
                   0);
  Convgrad__V1__ComputeHeader h = tp->header;
  h.response_chunk_bytes = 64 * 1024;
  Convgrad__V1__ComputeRequest req = CONVGRAD__V1__COMPUTE_REQUEST__INIT;
  req.kind_case = CONVGRAD__V1__COMPUTE_REQUEST__KIND_HEADER;
  req.header = &h;
  assert_int_equal(ts_call_send_msg(c, &req.base), 0);
  for (int i = 0; i < 2; i++) {
    size_t sent = 0, n = tp->g.in_bytes[i];
    while (sent < n && upto) {
      size_t k = n - sent < (1u << 20) ? n - sent : (1u << 20);
      if (k > upto)
        k = upto;
      Convgrad__V1__DataChunk dc = CONVGRAD__V1__DATA_CHUNK__INIT;
      dc.input = (uint32_t)i;
      dc.data.data = (uint8_t *)tp->in[i] + sent;
      dc.data.len = k;
      Convgrad__V1__ComputeRequest m = CONVGRAD__V1__COMPUTE_REQUEST__INIT;
      m.kind_case = CONVGRAD__V1__COMPUTE_REQUEST__KIND_CHUNK;
      m.chunk = &dc;
      assert_int_equal(ts_call_send_msg(c, &m.base), 0);
      sent += k;
      upto -= k;
    }
  }
}

/* Reads the result header and n chunks. */
static void recv_some(ts_call *c, int n) {
  for (int i = 0; i <= n; i++) {
    grpc_byte_buffer *bb = NULL;
    assert_int_equal(ts_call_recv(c, &bb), 0);
    assert_non_null(bb);
    grpc_byte_buffer_destroy(bb);
  }
}

/* Reads messages until the stream ends; returns how many. gRPC hands a
 * client the status only after the messages already buffered for it. */
static size_t recv_rest(ts_call *c) {
  size_t n = 0;
  for (;;) {
    grpc_byte_buffer *bb = NULL;
    assert_int_equal(ts_call_recv(c, &bb), 0);
    if (!bb)
      return n;
    grpc_byte_buffer_destroy(bb);
    n++;
  }
}

/* Its memory is back, all of it: with nothing else running, the next
 * call is admitted with only its own bytes in flight; and big fits again
 * and is correct. Under a sanitizer the first is enough: the second
 * moves 104 MB through the instrumented client and server (8-15 s each
 * under TSan, and at load 8 a client that slow was cut off by
 * --idle-timeout while reading big's result) and runs no code that the
 * case's own stream of big and the other groups' calls do not, so what it
 * adds, a correct result after the others, is the release build's. */
static void assert_big_fits(void) {
  size_t own = small.g.in_bytes[0] + small.g.in_bytes[1];
  char alone[96];
  snprintf(alone, sizeof alone, "reserved %zu bytes, %zu in flight", own, own);
  int before = ts_server_log_count(&srv, alone);
  assert_healthy();
  assert_int_equal(ts_server_log_count(&srv, alone), before + 1);
  if (!sanitized) {
    assert_int_equal(ts_problem_run(ch, &big, NULL), 0);
    assert_healthy();
  }
}

/* A 52 MB output streamed in 64 KiB chunks; the client reads a few and
 * cancels. The call's 104 MB reservation must come back. */
static void test_cancel_while_streaming(void **state) {
  (void)state;
  int cancelled = ts_server_log_count(&srv, "status=CANCELLED");
  ts_call c;
  send_request(&c, ch, &big, SIZE_MAX);
  assert_int_equal(ts_call_close_send(&c), 0);
  recv_some(&c, 3);
  ts_call_cancel(&c);
  assert_int_equal(ts_call_finish(&c, NULL, 0), GRPC_STATUS_CANCELLED);
  ts_call_free(&c);
  wait_log("status=CANCELLED", cancelled + 1);
  assert_true(ts_server_log_count(&srv, "while sending") >= 1);
  assert_big_fits();
}

/* A client that sends the header and one chunk of 52 MB, then nothing:
 * after --idle-timeout the call ends and frees its reservation. */
static void test_idle_upload(void **state) {
  (void)state;
  ts_call c;
  double t0 = ts_now_ms();
  send_request(&c, ch, &big, 1u << 20);
  char msg[512];
  assert_int_equal(ts_call_finish(&c, msg, sizeof msg),
                   GRPC_STATUS_DEADLINE_EXCEEDED);
  double waited = ts_now_ms() - t0;
  ts_call_free(&c);
  char want[64];
  snprintf(want, sizeof want, "no request data for %d s", idle_s);
  assert_non_null(strstr(msg, want));
  assert_non_null(strstr(msg, "inputs[0] (1048576 of 51840000 bytes)"));
  assert_non_null(strstr(msg, "--idle-timeout"));
  assert_true(waited >= idle_s * 1000 - 100 && waited < idle_s * 1000 + 18000);
  assert_big_fits();
}

/* A client that reads two result chunks and then pauses: once the
 * flow-control windows are full, sends stop completing, and after
 * --idle-timeout the server cuts the stream off and frees its memory.
 * When the client reads on, the chunks already in its buffers end with
 * that status. (A growing window could swallow all 52 MB: the channel's
 * stays small.) */
static void test_idle_download(void **state) {
  (void)state;
  int stalled = ts_server_log_count(&srv, "took no result data");
  grpc_channel *narrow = ts_channel_small_window(&srv);
  ts_call c;
  send_request(&c, narrow, &big, SIZE_MAX);
  assert_int_equal(ts_call_close_send(&c), 0);
  recv_some(&c, 2);
  wait_log("took no result data", stalled + 1);
  size_t chunks = recv_rest(&c);
  char msg[512];
  assert_int_equal(ts_call_finish(&c, msg, sizeof msg),
                   GRPC_STATUS_DEADLINE_EXCEEDED);
  ts_call_free(&c);
  grpc_channel_destroy(narrow);
  assert_true(chunks < big.g.out_bytes / (64 * 1024) - 2); /* cut short */
  char want[64];
  snprintf(want, sizeof want, "took no result data for %d s", idle_s);
  assert_non_null(strstr(msg, want));
  assert_non_null(strstr(msg, "--idle-timeout"));
  assert_big_fits();
}

/* Bytes beyond the declared tensors while the result streams: the server
 * ends the call with INVALID_ARGUMENT by cancelling it (a send is in
 * flight), and its log keeps that status and the job's figures instead
 * of blaming the client for the cancel. */
static void test_extra_bytes_while_streaming(void **state) {
  (void)state;
  /* The worker's name: the job's figures are kept ("-" if not). */
  const char *logged = "worker=cg-worker-0 status=INVALID_ARGUMENT "
                       "msg=\"chunk.data: 10 bytes beyond the declared";
  int before = ts_server_log_count(&srv, logged);
  ts_call c;
  send_request(&c, ch, &big, SIZE_MAX);
  recv_some(&c, 3);
  static const uint8_t extra[10];
  Convgrad__V1__DataChunk dc = CONVGRAD__V1__DATA_CHUNK__INIT;
  dc.input = 1;
  dc.data.data = (uint8_t *)extra;
  dc.data.len = sizeof extra;
  Convgrad__V1__ComputeRequest m = CONVGRAD__V1__COMPUTE_REQUEST__INIT;
  m.kind_case = CONVGRAD__V1__COMPUTE_REQUEST__KIND_CHUNK;
  m.chunk = &dc;
  assert_int_equal(ts_call_send_msg(&c, &m.base), 0);
  wait_log(logged, before + 1);
  recv_rest(&c);
  char msg[512];
  assert_int_equal(ts_call_finish(&c, msg, sizeof msg),
                   GRPC_STATUS_INVALID_ARGUMENT);
  ts_call_free(&c);
  assert_non_null(strstr(msg, "10 bytes beyond the declared tensors"));
  assert_big_fits();
}

/* Calls still uploading hold their place in the queue: with one worker
 * and --queue-depth 2, three calls that sent only their header leave no
 * room, and a fourth is refused at its header, not after its upload. Once
 * they go, their places come back. */
static void test_uploads_hold_queue_places(void **state) {
  (void)state;
  int admitted = ts_server_log_count(&srv, "admitted");
  int cancelled = ts_server_log_count(&srv, "status=CANCELLED");
  ts_call up[3];
  for (int i = 0; i < 3; i++)
    send_request(&up[i], ch, &small, 0);
  wait_log("admitted", admitted + 3);
  const void *data[2] = {small.in[0], small.in[1]};
  size_t len[2] = {small.g.in_bytes[0], small.g.in_bytes[1]};
  ts_result r;
  assert_int_equal(ts_compute(ch, &small.header, data, len, NULL, &r), 0);
  assert_int_equal(r.code, GRPC_STATUS_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(r.msg, "queue full"));
  ts_result_free(&r);
  assert_int_equal(ts_server_log_count(&srv, "admitted"), admitted + 3);
  for (int i = 0; i < 3; i++) {
    ts_call_cancel(&up[i]);
    ts_call_free(&up[i]);
  }
  wait_log("status=CANCELLED", cancelled + 3);
  assert_healthy();
}

/* A running job cannot be interrupted, but a long backward-data job runs
 * in minibatch slices and stops at the next one once cancelled: the only
 * worker is free again long before the whole job would have ended. */
static void test_cancel_while_computing(void **state) {
  (void)state;
  ts_problem slow;
  double took;
  assert_int_equal(ts_problem_slow_bwd_data(ch, &slow, 2000, &took), 0);
  int runs = ts_server_log_count(&srv, "runs a job");
  int cancelled = ts_server_log_count(&srv, "status=CANCELLED");
  ts_call c;
  send_request(&c, ch, &slow, SIZE_MAX);
  assert_int_equal(ts_call_close_send(&c), 0);
  wait_log("runs a job", runs + 1);
  usleep(200 * 1000);
  double t0 = ts_now_ms();
  ts_call_cancel(&c);
  ts_call_free(&c);
  wait_log("status=CANCELLED", cancelled + 1);
  assert_int_equal(ts_problem_run(ch, &small, NULL), 0);
  double freed = ts_now_ms() - t0;
  fprintf(stderr, "  worker free %.0f ms after the cancel (whole job %.0f)\n",
          freed, took);
  assert_true(freed < took / 2);
  ts_problem_free(&slow);
  assert_healthy();
}

/* A client that goes away in the middle of its upload. */
static void test_cancel_while_uploading(void **state) {
  (void)state;
  int cancelled = ts_server_log_count(&srv, "status=CANCELLED");
  int admitted = ts_server_log_count(&srv, "admitted");
  ts_call c;
  assert_int_equal(ts_call_open(&c, ch, "/convgrad.v1.ConvGrad/Compute", 60000),
                   0);
  Convgrad__V1__ComputeRequest req = CONVGRAD__V1__COMPUTE_REQUEST__INIT;
  req.kind_case = CONVGRAD__V1__COMPUTE_REQUEST__KIND_HEADER;
  req.header = &small.header;
  assert_int_equal(ts_call_send_msg(&c, &req.base), 0);
  wait_log("admitted", admitted + 1);
  ts_call_cancel(&c);
  ts_call_free(&c);
  wait_log("status=CANCELLED", cancelled + 1);
  assert_true(ts_server_log_count(&srv, "cancelled by the client while "
                                        "receiving data") >= 1);
  assert_healthy();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_deadline_while_queued_and_queue_full),
      cmocka_unit_test(test_cancel_while_streaming),
      cmocka_unit_test(test_cancel_while_uploading),
      cmocka_unit_test(test_cancel_while_computing),
      cmocka_unit_test(test_extra_bytes_while_streaming),
      cmocka_unit_test(test_uploads_hold_queue_places),
      cmocka_unit_test(test_idle_upload),
      cmocka_unit_test(test_idle_download),
  };
  if (getenv("TS_FILTER"))
    cmocka_set_test_filter(getenv("TS_FILTER"));
  return cmocka_run_group_tests(tests, setup, teardown);
}
