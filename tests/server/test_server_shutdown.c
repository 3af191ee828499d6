/* test_server_shutdown.c - SIGTERM under load: in-flight requests finish
 * with correct results, health watchers see NOT_SERVING, new calls are
 * refused with UNAVAILABLE, the server exits 0; and when the grace period
 * runs out, what is left is cut off and the server still exits 0. Each
 * test starts its own server. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ts.h"

#define INFLIGHT 8

static void test_sigterm_during_load(void **state) {
  (void)state;
  ts_server srv;
  /* ts_problem_slow grows past any fixed compute budget on a fast core. */
  static const char *const args[] = {
      "--workers",           "1", "--grace", "60", "--log-level", "debug",
      "--max-request-flops", "0", NULL};
  assert_int_equal(ts_server_start(&srv, args), 0);
  grpc_channel *ch = ts_channel(&srv);

  ts_watch watch;
  assert_int_equal(ts_watch_start(&watch, ch), 0);
  assert_int_equal(ts_server_wait_log(&srv, "health watch", 1, 10000), 0);

  /* One slow job keeps the worker busy; INFLIGHT checked ones queue up
   * behind it. */
  ts_problem slow;
  double took;
  assert_int_equal(ts_problem_slow(ch, &slow, 500, &took), 0);
  /* The server logs a call, and stops counting it as in flight, as it
   * frees it, which can be just after the client saw its status: wait for
   * the line of every calibration call (each was admitted once), so that
   * the draining line below counts only the calls started here. */
  int calibration = ts_server_log_count(&srv, "admitted");
  assert_int_equal(ts_server_wait_log(&srv, "status=OK", calibration, 10000),
                   0);
  ts_problem tp[INFLIGHT];
  for (int i = 0; i < INFLIGHT; i++) {
    ts_desc d = {.op = (cg_op)(1 + i % 4),
                 .dtype = CG_DTYPE_F32,
                 .dfmt = CG_DATA_NXC,
                 .groups = 2,
                 .mb = 2,
                 .ic = 8,
                 .oc = 8,
                 .nsp = 2,
                 .is = {12, 12},
                 .ks = {3, 3},
                 .stride = 1,
                 .pad = 1,
                 .dil = 1,
                 .seed = 40 + (uint64_t)i};
    assert_int_equal(ts_problem_init(&tp[i], &d), 0);
    assert_int_equal(ts_problem_reference(&tp[i]), 0);
  }
  int runs = ts_server_log_count(&srv, "runs a job");
  ts_bg busy, bg[INFLIGHT];
  assert_int_equal(ts_bg_start(&busy, ch, &slow, 60000), 0);
  assert_int_equal(ts_server_wait_log(&srv, "runs a job", runs + 1, 10000), 0);
  int admitted = ts_server_log_count(&srv, "admitted");
  for (int i = 0; i < INFLIGHT; i++)
    assert_int_equal(ts_bg_start(&bg[i], ch, &tp[i], 60000), 0);
  assert_int_equal(
      ts_server_wait_log(&srv, "admitted", admitted + INFLIGHT, 10000), 0);

  assert_int_equal(kill(srv.pid, SIGTERM), 0);
  assert_int_equal(ts_server_wait_log(&srv, "draining", 1, 10000), 0);
  /* New work is refused with UNAVAILABLE by the server itself: the
   * listener stays open until the in-flight calls are done. */
  grpc_channel *late = ts_channel(&srv);
  ts_result r;
  const void *data[2] = {tp[0].in[0], tp[0].in[1]};
  size_t len[2] = {tp[0].g.in_bytes[0], tp[0].g.in_bytes[1]};
  assert_int_equal(ts_compute(late, &tp[0].header, data, len, NULL, &r), 0);
  assert_int_equal(r.code, GRPC_STATUS_UNAVAILABLE);
  assert_non_null(strstr(r.msg, "shutting down"));
  ts_result_free(&r);
  assert_int_equal(ts_health(late, ""), 2 /* NOT_SERVING */);
  grpc_channel_destroy(late);

  ts_bg_join(&busy);
  assert_int_equal(busy.code, GRPC_STATUS_OK);
  for (int i = 0; i < INFLIGHT; i++) {
    ts_bg_join(&bg[i]);
    if (bg[i].code != GRPC_STATUS_OK)
      fprintf(stderr, "in-flight %d: %d %s\n", i, bg[i].code, bg[i].msg);
    assert_int_equal(bg[i].code, GRPC_STATUS_OK);
    assert_true(bg[i].checked);
    ts_problem_free(&tp[i]);
  }
  ts_problem_free(&slow);

  ts_watch_join(&watch);
  assert_true(watch.nseen >= 2);
  assert_int_equal(watch.seen[0], 1 /* SERVING */);
  assert_int_equal(watch.seen[watch.nseen - 1], 2 /* NOT_SERVING */);
  assert_int_equal(watch.code, GRPC_STATUS_UNAVAILABLE);

  grpc_channel_destroy(ch);
  assert_int_equal(ts_server_stop(&srv, 0, 30000), 0);
  char needle[64];
  snprintf(needle, sizeof needle, "draining: %d compute calls", INFLIGHT + 1);
  assert_int_equal(ts_server_log_count(&srv, needle), 1);
  assert_int_equal(ts_server_log_count(&srv, "info  stopped"), 1);
}

/* One worker, --grace 0.2. The slow problems grow past any fixed compute
 * budget on a fast core: no --max-request-flops. */
static void start_short_grace(ts_server *srv) {
  static const char *const args[] = {
      "--workers",           "1", "--grace", "0.2", "--log-level", "debug",
      "--max-request-flops", "0", NULL};
  assert_int_equal(ts_server_start(srv, args), 0);
}

static void test_grace_period_runs_out(void **state) {
  (void)state;
  ts_server srv;
  start_short_grace(&srv);
  grpc_channel *ch = ts_channel(&srv);
  ts_problem slow;
  double took;
  assert_int_equal(ts_problem_slow(ch, &slow, 1000, &took), 0);
  int runs = ts_server_log_count(&srv, "runs a job");
  int admitted = ts_server_log_count(&srv, "admitted");
  ts_bg a, b;
  assert_int_equal(ts_bg_start(&a, ch, &slow, 60000), 0);
  assert_int_equal(ts_server_wait_log(&srv, "runs a job", runs + 1, 10000), 0);
  assert_int_equal(ts_bg_start(&b, ch, &slow, 60000), 0); /* queued */
  assert_int_equal(ts_server_wait_log(&srv, "admitted", admitted + 2, 10000),
                   0);
  double t0 = ts_now_ms();
  assert_int_equal(kill(srv.pid, SIGTERM), 0);
  ts_bg_join(&a);
  ts_bg_join(&b);
  /* Cut off: the running one is discarded, the queued one never runs;
   * both are told to retry elsewhere, and the log does not blame their
   * clients for the server's cancel. */
  assert_int_equal(a.code, GRPC_STATUS_UNAVAILABLE);
  assert_int_equal(b.code, GRPC_STATUS_UNAVAILABLE);
  assert_true(ts_now_ms() - t0 < took);
  grpc_channel_destroy(ch);
  assert_int_equal(ts_server_stop(&srv, 0, 30000), 0);
  assert_int_equal(ts_server_log_count(&srv, "grace period over"), 1);
  assert_int_equal(ts_server_log_count(&srv, "status=UNAVAILABLE msg=\"server "
                                             "shut down before the request"),
                   2);
  assert_int_equal(ts_server_log_count(&srv, "cancelled by the client"), 0);
  ts_problem_free(&slow);
}

/* --grace bounds the exit even while a long job runs: a backward-data job
 * stops at its next minibatch slice once the grace period cancels it.
 * (A job that is not sliced runs to its end; --max-request-flops bounds
 * how long that is.) */
static void test_grace_stops_a_running_job(void **state) {
  (void)state;
  ts_server srv;
  start_short_grace(&srv);
  grpc_channel *ch = ts_channel(&srv);
  ts_problem slow;
  double took;
  assert_int_equal(ts_problem_slow_bwd_data(ch, &slow, 2000, &took), 0);
  int runs = ts_server_log_count(&srv, "runs a job");
  ts_bg a;
  assert_int_equal(ts_bg_start(&a, ch, &slow, 60000), 0);
  assert_int_equal(ts_server_wait_log(&srv, "runs a job", runs + 1, 10000), 0);
  double t0 = ts_now_ms();
  assert_int_equal(kill(srv.pid, SIGTERM), 0);
  ts_bg_join(&a);
  assert_int_equal(a.code, GRPC_STATUS_UNAVAILABLE);
  grpc_channel_destroy(ch);
  assert_int_equal(ts_server_stop(&srv, 0, 30000), 0);
  double exited = ts_now_ms() - t0;
  fprintf(stderr, "  exit %.0f ms after SIGTERM (--grace 0.2, job %.0f ms)\n",
          exited, took);
  /* Under sanitizers the exit itself (the leak check) takes seconds. */
  assert_true(exited < 200 + took / 2 + (getenv("CG_SANITIZED") ? 3000 : 0));
  ts_problem_free(&slow);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sigterm_during_load),
      cmocka_unit_test(test_grace_period_runs_out),
      cmocka_unit_test(test_grace_stops_a_running_job),
  };
  if (getenv("TS_FILTER"))
    cmocka_set_test_filter(getenv("TS_FILTER"));
  return cmocka_run_group_tests(tests, ts_group_grpc_init,
                                ts_group_grpc_shutdown);
}
