/* test_proto_e2e.c - libcgclient against a scripted server
 * (tests/client/fake_server.py, Python grpcio).
 * - A server that breaks the wire contract: every malformed response ends
 *   the call with CGC_EPROTO or CG_ELIMIT and a message, never a crash, an
 *   over-read or an allocation sized by the server alone; a correct answer
 *   split over two chunks is reassembled byte for byte.
 * - "Retry later" refusals (RESOURCE_EXHAUSTED with retry-after-ms): the
 *   call is retried after the hint, the retried attempt says so in its
 *   metadata, a refusal without the hint is not retried, and neither the
 *   channel's retries nor the call's deadline are exceeded; a retry that
 *   the deadline overtakes ends the call with the refusal; a retry of a
 *   layer op asks only for the outputs not yet whole, which stay as they
 *   came (synchronous and asynchronous calls); the channel's engine retries
 *   asynchronous calls and ends them at their deadline; `convgrad bench` counts
 *   the retries and the calls that failed, and goes on. A timed-out wait
 *   for an asynchronous call leaves it going. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "cgc/client.h"
#include "harness.h"

static const char *fake_exe, *cli_exe;

typedef struct expect_row {
  int messages; /* in the answer */
  int rc;
  const char *needle;
} expect_row;

/* In fake_server.py's SCRIPT order. */
static const expect_row rows[] = {
    {1, CGC_EPROTO, "data chunk before the ResultHeader"},
    {1, CGC_EPROTO, "total_bytes disagrees"},
    {2, CGC_EPROTO, "more data than"},
    {2, CGC_EPROTO, "ended before all data"},
    {1, CGC_EPROTO, "shape overflows"},
    {1, CG_ELIMIT, "exceeds max_output_bytes"},
    {1, CGC_EPROTO, "truncated field tag"},
    {1, CGC_EPROTO, "unsupported wire type"},
    {2, CGC_EPROTO, "a ResultHeader before the last output was whole"},
    {2, CGC_EPROTO, "more outputs than were asked for"},
    {1, CGC_EPROTO, "dtype"},
    {1, CGC_EPROTO, "data is not the whole result"},
    {2, CGC_EPROTO, "more data than"},
    {3, 0, NULL},
    {1, 0, NULL},
};
#define NROWS (sizeof rows / sizeof rows[0])

/* The fake server lives in the group's setup and teardown, so that a
 * failing check does not leave it running. */
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

/* A channel to the fake server; token names a retry scenario (NULL: the
 * malformed-response script). */
static cgc_channel *fake_channel(const char *token, int retries,
                                 int64_t deadline_ms) {
  char target[64], err[256];
  cgc_options o;
  cgc_channel *ch = NULL;
  snprintf(target, sizeof target, "127.0.0.1:%d", srv.port);
  cgc_options_init(&o);
  o.retries = retries;
  o.token = token ? token : "";
  o.deadline_ms = deadline_ms;
  o.backoff_initial_ms = 20;
  if (cgc_channel_new(&ch, target, &o, err, sizeof err) != 0)
    fail_msg("channel: %s", err);
  return ch;
}

static float tiny_a[4], tiny_b[4];

/* A 2x2 ConvolutionBackwardData request; the fake answers any. */
static void tiny_request(cgc_request *req) {
  cgc_request_init(req);
  req->op = CG_OP_CONV_BWD_DATA;
  req->inputs[0] = (cgc_tensor_view){.dtype = CG_DTYPE_F32,
                                     .rank = 4,
                                     .dims = {1, 1, 2, 2},
                                     .data = tiny_a,
                                     .nbytes = sizeof tiny_a};
  req->inputs[1] = (cgc_tensor_view){.dtype = CG_DTYPE_F32,
                                     .rank = 4,
                                     .dims = {1, 1, 2, 2},
                                     .data = tiny_b,
                                     .nbytes = sizeof tiny_b};
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* One call of scenario token on a fresh channel: rc, *res, *st and the
 * call's wall time in *ms. */
static int scenario_call(const char *token, int retries, int64_t deadline_ms,
                         cgc_result *res, cgc_status *st, double *ms) {
  cgc_channel *ch = fake_channel(token, retries, deadline_ms);
  cgc_request req;
  cgc_tensor *out = NULL;
  tiny_request(&req);
  /* Connect first: the wall time is the call's, not the handshake's. */
  cgc_health_status hs;
  cgc_health(ch, NULL, 0, &hs, NULL);
  double t0 = now_ms();
  int rc = cgc_compute(ch, &req, &out, res, st);
  *ms = now_ms() - t0;
  if (rc == 0) {
    assert_int_equal(out->nbytes, 16);
    assert_int_equal(((const uint8_t *)out->data)[15], 15);
  }
  cgc_tensor_free(out);
  cgc_channel_free(ch);
  return rc;
}

/* Refused once with retry-after-ms 150: retried once, not before the
 * hint, the retry carrying convgrad-retry-attempt: 1 (the fake names it
 * in the worker field of its answer). */
static void test_retry_after_hint(void **state) {
  (void)state;
  cgc_result res;
  cgc_status st;
  double ms;
  int rc = scenario_call("busy-once-150", 5, 10000, &res, &st, &ms);
  if (rc)
    fail_msg("rc %d: %s %s", rc, cgc_status_code_name(st.code), st.message);
  assert_int_equal(res.attempts, 2);
  assert_string_equal(res.worker, "attempt=1");
  if (ms < 150)
    fail_msg("retried after %.1f ms, before the 150 ms hint", ms);
}

/* RESOURCE_EXHAUSTED without the trailer is a limit: one attempt. */
static void test_refusal_without_hint_not_retried(void **state) {
  (void)state;
  cgc_result res;
  cgc_status st;
  double ms;
  assert_int_equal(scenario_call("limit", 5, 10000, &res, &st, &ms), CGC_ERPC);
  assert_int_equal(st.code, GRPC_STATUS_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(st.message, "size limit"));
  assert_int_equal(res.attempts, 1);
}

/* Always refused: the channel's 3 retries, numbered 1..3, then the
 * server's refusal. */
static void test_retries_bounded_and_numbered(void **state) {
  (void)state;
  cgc_result res;
  cgc_status st;
  double ms;
  assert_int_equal(scenario_call("busy-always-10", 3, 10000, &res, &st, &ms),
                   CGC_ERPC);
  assert_int_equal(st.code, GRPC_STATUS_RESOURCE_EXHAUSTED);
  assert_int_equal(res.attempts, 4);
  if (!strstr(st.message, "attempt 3;"))
    fail_msg("last attempt's refusal: '%s'", st.message);
}

/* The status a busy-always or busy-then-slow call ends with after
 * `attempts` attempts: the fake's refusal of the last attempt it refused,
 * which is the one before the last when the deadline cut the last (cut). */
static void expect_refusal(const cgc_status *st, int attempts, int cut) {
  char want[CGC_MESSAGE_MAX], refused[16] = "none";
  int n = attempts - 1 - cut; /* the refused attempt's retry number */
  if (n > 0)
    snprintf(refused, sizeof refused, "%d", n);
  int len =
      snprintf(want, sizeof want, "busy, attempt %s; retry later", refused);
  if (cut)
    snprintf(want + len, sizeof want - (size_t)len,
             " (retry %d was cut short by the call's deadline)", attempts - 1);
  assert_int_equal(st->code, GRPC_STATUS_RESOURCE_EXHAUSTED);
  assert_string_equal(st->message, want);
}

/* Refused every 100 ms of hint under a 400 ms deadline and many retries:
 * it waits at least one hint, makes at most one attempt per hint, and
 * ends with the server's last refusal, whether the next wait would have
 * passed the deadline or the deadline overtook a retry (which one is down
 * to timing; the message says which, and the check takes either). It
 * ends within one hint of its deadline, the least one more wait would
 * add: slack for a loaded machine under a sanitizer (401.2 ms seen). A
 * hint longer than the whole deadline is not waited for at all. */
static void test_retry_within_deadline(void **state) {
  (void)state;
  cgc_result res;
  cgc_status st;
  double ms;
  assert_int_equal(scenario_call("busy-always-100", 100, 400, &res, &st, &ms),
                   CGC_ERPC);
  if (res.attempts < 2 || res.attempts > 4 || ms < 100 || ms > 500)
    fail_msg("%d attempts in %.1f ms under a 400 ms deadline", res.attempts,
             ms);
  expect_refusal(&st, res.attempts, strstr(st.message, "cut short") != NULL);
  assert_int_equal(scenario_call("busy-always-5000", 100, 1000, &res, &st, &ms),
                   CGC_ERPC);
  expect_refusal(&st, res.attempts, 0);
  assert_int_equal(res.attempts, 1);
  if (ms > 900)
    fail_msg("a 5 s hint under a 1 s deadline waited %.1f ms", ms);
}

/* A retry that the server holds past the call's deadline (refused once
 * with a 5 ms hint, then answered after 5 s): the call ends at its 1 s
 * deadline with the refusal the retry was for, saying the deadline cut
 * it, and counts both attempts. Nothing here depends on timing but that
 * the first refusal comes back within the second the deadline leaves. */
static void test_retry_cut_by_deadline(void **state) {
  (void)state;
  cgc_result res;
  cgc_status st;
  double ms;
  assert_int_equal(
      scenario_call("busy-then-slow-5000", 5, 1000, &res, &st, &ms), CGC_ERPC);
  assert_int_equal(res.attempts, 2);
  expect_refusal(&st, res.attempts, 1);
  if (ms < 999 || ms > 4900)
    fail_msg("the retry was cut after %.1f ms, under a 1 s deadline", ms);
}

/* Checks how the call of req on ch answered with rows[i] ended. */
static void call_row(cgc_channel *ch, const cgc_request *req, size_t i) {
  cgc_tensor *out = NULL;
  cgc_result res;
  cgc_status st;
  int rc = cgc_compute(ch, req, &out, &res, &st);
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

/* tiny_request with the output's shape given (dst_shape 1x1x2x2, 16
 * bytes): its answer is one message by contract, so the call is one
 * batch. */
static int64_t tiny_dst_shape[4] = {1, 1, 2, 2};
static void tiny_request_one_batch(cgc_request *req) {
  tiny_request(req);
  req->attrs.dst_shape = (cg_ints){tiny_dst_shape, 4};
}

/* Every scripted answer, on the path of a request whose answer size the
 * server decides (one batch per message), in script order. */
static void test_malformed_responses(void **state) {
  (void)state;
  cgc_channel *ch = fake_channel(NULL, 0, 60000);
  cgc_request req;
  tiny_request(&req);
  for (size_t i = 0; i < NROWS; i++)
    call_row(ch, &req, i);
  cgc_channel_free(ch);
}

/* The scripted answers of one message each, to a request that runs as one
 * batch: the same ends. An answer of two messages breaks the contract
 * this batch relies on and holds the call until its deadline (the status
 * cannot arrive while a message is unread): DEADLINE_EXCEEDED, never a
 * crash or a result. */
static void test_malformed_responses_one_batch(void **state) {
  (void)state;
  cgc_request req;
  tiny_request_one_batch(&req);
  for (size_t i = 0; i < NROWS; i++) {
    char token[16];
    snprintf(token, sizeof token, "row-%zu", i);
    if (rows[i].messages != 1)
      continue;
    cgc_channel *ch = fake_channel(token, 0, 60000);
    call_row(ch, &req, i);
    cgc_channel_free(ch);
  }
  cgc_channel *ch = fake_channel("row-9", 0, 300);
  cgc_tensor *out = NULL;
  cgc_result res;
  cgc_status st;
  double t0 = now_ms();
  assert_int_equal(cgc_compute(ch, &req, &out, &res, &st), CGC_ERPC);
  double ms = now_ms() - t0;
  assert_null(out);
  assert_int_equal(st.code, GRPC_STATUS_DEADLINE_EXCEEDED);
  if (ms < 299)
    fail_msg("two messages ended a one-batch call after %.1f ms", ms);
  cgc_channel_free(ch);
}

/* Output g as the "partial" scenario sends it: bytes 0..15 for the first
 * attempt's diff_src, 16(g+1).. for the retry's. */
static void check_partial_output(int g, const void *data, size_t nbytes) {
  uint8_t want[16];
  assert_int_equal(nbytes, 16);
  for (int k = 0; k < 16; k++)
    want[k] = (uint8_t)(g == CG_GRAD_DIFF_SRC ? k : 16 * (g + 1) + k);
  assert_memory_equal(data, want, 16);
}

/* A layer op whose diff_src came whole before "retry later": the retry
 * asks for diff_weights and diff_bias only (the fake lists them in its
 * worker field), diff_src stays as the first attempt delivered it; an
 * asynchronous call's wait for diff_src returns with it. */
static void test_retry_asks_only_missing_outputs(void **state) {
  (void)state;
  cgc_channel *ch = fake_channel("partial", 3, 10000);
  cgc_request req;
  tiny_request(&req);
  req.op = CG_OP_CONV_BWD;
  req.inputs[2] = req.inputs[1];
  cgc_tensor *out[CG_GRAD_COUNT];
  cgc_result res;
  cgc_status st;
  int rc = cgc_compute_layer(ch, &req, out, &res, &st);
  if (rc)
    fail_msg("rc %d: %s", rc, st.message);
  assert_int_equal(res.attempts, 2);
  assert_string_equal(res.worker, "outputs=2,3");
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    check_partial_output(g, out[g]->data, out[g]->nbytes);
    cgc_tensor_free(out[g]);
  }
  uint8_t bufs[CG_GRAD_COUNT][16];
  void *data[CG_GRAD_COUNT] = {bufs[0], bufs[1], bufs[2]};
  size_t cap[CG_GRAD_COUNT] = {16, 16, 16};
  cgc_call *call;
  cgc_tensor into[CG_GRAD_COUNT];
  assert_int_equal(cgc_call_start(ch, &req, data, cap, &call, &st), 0);
  assert_int_equal(cgc_call_wait(call, CG_GRAD_BIT(CG_GRAD_DIFF_SRC), -1, &st),
                   0);
  check_partial_output(CG_GRAD_DIFF_SRC, bufs[0], 16);
  assert_int_equal(cgc_call_finish(call, into, &res, &st), 0);
  assert_int_equal(res.attempts, 2);
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    check_partial_output(g, into[g].data, into[g].nbytes);
  cgc_channel_free(ch);
}

/* A wait that times out leaves the call going (the fake answers after
 * 400 ms); done says so; a wait with the longest timeout there is waits
 * for the output; finish then collects the answer. */
static void test_async_wait_timeout(void **state) {
  (void)state;
  cgc_channel *ch = fake_channel("slow-400", 0, 10000);
  cgc_request req;
  tiny_request(&req);
  uint8_t buf[16];
  void *data[CG_GRAD_COUNT] = {buf, NULL, NULL};
  size_t cap[CG_GRAD_COUNT] = {16, 0, 0};
  cgc_call *call;
  cgc_status st;
  cgc_tensor out[CG_GRAD_COUNT];
  cgc_result res;
  assert_int_equal(cgc_call_start(ch, &req, data, cap, &call, &st), 0);
  assert_int_equal(cgc_call_wait(call, 0, 20, &st), CGC_ETIMEDOUT);
  assert_int_equal(st.code, GRPC_STATUS_DEADLINE_EXCEEDED);
  assert_false(cgc_call_done(call));
  assert_int_equal(cgc_call_wait(call, 0, INT64_MAX, &st), 0);
  assert_int_equal(cgc_call_finish(call, out, &res, &st), 0);
  assert_ptr_equal(out[CG_GRAD_DIFF_SRC].data, buf);
  assert_int_equal(buf[15], 15);
  cgc_channel_free(ch);
}

/* One asynchronous call of scenario token (deadline_ms: the request's):
 * rc, *res, *st and its wall time in *ms. */
static int scenario_async(const char *token, int retries, int64_t deadline_ms,
                          cgc_result *res, cgc_status *st, double *ms) {
  cgc_channel *ch = fake_channel(token, retries, 10000);
  cgc_request req;
  tiny_request(&req);
  req.deadline_ms = deadline_ms;
  uint8_t buf[16] = {0};
  void *data[CG_GRAD_COUNT] = {buf, NULL, NULL};
  size_t cap[CG_GRAD_COUNT] = {16, 0, 0};
  cgc_call *call;
  cgc_tensor out[CG_GRAD_COUNT];
  cgc_health_status hs;
  cgc_health(ch, NULL, 0, &hs, NULL);
  double t0 = now_ms();
  assert_int_equal(cgc_call_start(ch, &req, data, cap, &call, st), 0);
  int rc = cgc_call_finish(call, out, res, st);
  *ms = now_ms() - t0;
  if (rc == 0)
    assert_int_equal(buf[15], 15);
  cgc_channel_free(ch);
  return rc;
}

/* The engine runs an asynchronous call's retries and deadline as the
 * calling thread runs a synchronous one's: a "retry later" refusal is
 * retried after its hint, a deadline ends a slow answer on time, and a
 * retry the deadline overtakes ends with the refusal it retried. */
static void test_async_retry_and_deadline(void **state) {
  (void)state;
  cgc_result res;
  cgc_status st;
  double ms;
  int rc = scenario_async("busy-once-50", 3, 0, &res, &st, &ms);
  if (rc)
    fail_msg("rc %d: %s", rc, st.message);
  assert_int_equal(res.attempts, 2);
  assert_string_equal(res.worker, "attempt=1");
  if (ms < 50)
    fail_msg("retried after %.1f ms, before the 50 ms hint", ms);
  assert_int_equal(scenario_async("slow-2000", 0, 200, &res, &st, &ms),
                   CGC_ERPC);
  assert_int_equal(st.code, GRPC_STATUS_DEADLINE_EXCEEDED);
  if (ms < 199 || ms > 1900)
    fail_msg("a 200 ms deadline ended the call after %.1f ms", ms);
  assert_int_equal(
      scenario_async("busy-then-slow-5000", 5, 1000, &res, &st, &ms), CGC_ERPC);
  assert_int_equal(res.attempts, 2);
  expect_refusal(&st, res.attempts, 1);
}

/* The value of column col (0-based, blank-separated) of the first line
 * of text that starts with prefix, -1 if none. */
static long column(const char *text, const char *prefix, int col) {
  const char *line = strstr(text, prefix);
  long v = -1;
  char word[64];
  for (int i = 0; line && i <= col; i++) {
    int used = 0;
    if (sscanf(line, "%63s%n", word, &used) != 1)
      return -1;
    line += used;
    if (i == col)
      v = strtol(word, NULL, 10);
  }
  return v;
}

/* The bench table's columns: problem op type conc n p50 p90 p99 req/s MB/s
 * compute retries errors. */
enum { COL_N = 4, COL_RETRIES = 11, COL_ERRORS = 12 };

/* `convgrad bench` against refusals: a "retry later" refusal of every
 * first attempt is retried and counted, the calls succeed; permanent
 * refusals are counted as errors without stopping the run, which exits
 * with the failure's code after printing the row. */
static void test_bench_counts_retries(void **state) {
  (void)state;
  char target[64];
  snprintf(target, sizeof target, "--target=127.0.0.1:%d", srv.port);
  const char *busy[] = {cli_exe,
                        "bench",
                        target,
                        "--token=busy-once-5",
                        "--problem",
                        "mb1ic1ih2oc1oh2kh1",
                        "--op",
                        "ConvolutionBackwardData",
                        "--requests",
                        "12",
                        "--warmup",
                        "0",
                        "--concurrency",
                        "3",
                        NULL};
  th_run r;
  th_run_cmd(&r, busy);
  if (r.code != 0)
    fail_msg("exit %d: %s%s", r.code, r.out, r.err);
  assert_int_equal(column(r.out, "mb1ic1", COL_N), 12);
  assert_int_equal(column(r.out, "mb1ic1", COL_RETRIES), 12);
  assert_int_equal(column(r.out, "mb1ic1", COL_ERRORS), 0);
  const char *limit[] = {cli_exe,      "bench",
                         target,       "--token=limit",
                         "--problem",  "mb1ic1ih2oc1oh2kh1",
                         "--op",       "ConvolutionBackwardData",
                         "--requests", "5",
                         "--warmup",   "0",
                         NULL};
  th_run_cmd(&r, limit);
  assert_int_equal(r.code, 6);
  assert_non_null(strstr(r.err, "size limit"));
  assert_int_equal(column(r.out, "mb1ic1", COL_N), 0);
  assert_int_equal(column(r.out, "mb1ic1", COL_RETRIES), 0);
  assert_int_equal(column(r.out, "mb1ic1", COL_ERRORS), 5);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s fake_server.py convgrad\n", argv[0]);
    return 2;
  }
  fake_exe = argv[1];
  cli_exe = argv[2];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_malformed_responses),
      cmocka_unit_test(test_malformed_responses_one_batch),
      cmocka_unit_test(test_retry_after_hint),
      cmocka_unit_test(test_refusal_without_hint_not_retried),
      cmocka_unit_test(test_retries_bounded_and_numbered),
      cmocka_unit_test(test_retry_within_deadline),
      cmocka_unit_test(test_retry_cut_by_deadline),
      cmocka_unit_test(test_retry_asks_only_missing_outputs),
      cmocka_unit_test(test_async_wait_timeout),
      cmocka_unit_test(test_async_retry_and_deadline),
      cmocka_unit_test(test_bench_counts_retries),
  };
  return cmocka_run_group_tests(tests, start_fake, stop_fake);
}
