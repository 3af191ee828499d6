/* test_net_e2e.c - retries and balancing against real server processes:
 * a call (and `convgrad smoke --wait`) issued before the server exists
 * succeeds once it starts; a server that never starts gives UNAVAILABLE
 * within the deadline; a server slow to answer its handshake is still
 * reached; round_robin over two servers sends calls to both (counted in
 * each server's per-request log). */
#include <pthread.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "cgc/client.h"
#include "harness.h"
#include "spec.h"

static const char *server_exe, *cli_exe;

/* A tiny ConvolutionBackwardData request (data owned by the caller). */
typedef struct tiny {
  float dd[1 * 4 * 4 * 4], w[3 * 3 * 4 * 4];
  int64_t dst[4];
  cgc_request req;
} tiny;

static void tiny_init(tiny *t) {
  uint64_t seed = 3;
  cgc_request_init(&t->req);
  cgc_fill_random(CG_DTYPE_F32, t->dd, 64, &seed);
  cgc_fill_random(CG_DTYPE_F32, t->w, 144, &seed);
  t->req.op = CG_OP_CONV_BWD_DATA;
  t->req.inputs[0] = (cgc_tensor_view){CG_DTYPE_F32,       4,     {1, 4, 4, 4},
                                       CGC_LAYOUT_DEFAULT, t->dd, sizeof t->dd};
  t->req.inputs[1] = (cgc_tensor_view){CG_DTYPE_F32,       4,    {3, 3, 4, 4},
                                       CGC_LAYOUT_DEFAULT, t->w, sizeof t->w};
  static const int64_t pads[2] = {1, 1};
  t->req.attrs.pads_begin = (cg_ints){pads, 2};
  t->req.attrs.pads_end = (cg_ints){pads, 2};
}

typedef struct late_call {
  cgc_channel *ch;
  int rc, attempts;
  cgc_status st;
} late_call;

static void *late_thread(void *p) {
  late_call *c = p;
  tiny t;
  cgc_tensor *out = NULL;
  cgc_result res;
  tiny_init(&t);
  c->rc = cgc_compute(c->ch, &t.req, &out, &res, &c->st);
  c->attempts = res.attempts;
  cgc_tensor_free(out);
  return NULL;
}

static void test_retry_until_server_starts(void **state) {
  (void)state;
  int port = th_free_port();
  char target[64], err[256];
  cgc_options o;
  cgc_channel *ch;
  th_server srv;
  pthread_t th;
  assert_true(port > 0);
  snprintf(target, sizeof target, "127.0.0.1:%d", port);
  cgc_options_init(&o);
  o.retries = 100;
  o.backoff_initial_ms = 50;
  o.backoff_max_ms = 300;
  o.deadline_ms = 60000;
  assert_int_equal(cgc_channel_new(&ch, target, &o, err, sizeof err), 0);
  late_call c = {ch, -1, 0, {0, ""}};
  assert_int_equal(pthread_create(&th, NULL, late_thread, &c), 0);

  /* `convgrad smoke` waiting for the same server. */
  char portarg[80], so[128], se[128];
  snprintf(portarg, sizeof portarg, "--target=%s", target);
  const char *argv[] = {cli_exe, "smoke",   portarg, "--wait",
                        "60",    "--quiet", NULL};
  pid_t smoke = th_spawn(argv, so, se);
  assert_true(smoke > 0);

  sleep(2); /* both are retrying against a closed port now */
  assert_int_equal(th_server_start(&srv, server_exe, port, NULL), 0);
  pthread_join(th, NULL);
  th_run r;
  th_collect(smoke, 280, so, se, &r);
  th_server_stop(&srv);
  cgc_channel_free(ch);
  if (c.rc)
    fail_msg("late call failed: %s %s", cgc_status_code_name(c.st.code),
             c.st.message);
  assert_true(c.attempts > 1);
  if (r.code != 0)
    fail_msg("smoke exit %d: %s%s", r.code, r.out, r.err);
  assert_non_null(strstr(r.out, "passed"));
}

/* A server that answers its connection handshake late (stopped for
 * 600 ms while the CLI connects: the kernel accepts the TCP connection,
 * the HTTP/2 handshake waits) is still reached by the first attempt's
 * connection. With a 100 ms connect timeout it never was. */
static void test_slow_handshake_still_connects(void **state) {
  (void)state;
  th_server srv;
  assert_int_equal(th_server_start(&srv, server_exe, 0, NULL), 0);
  char target[64], so[128], se[128];
  snprintf(target, sizeof target, "--target=127.0.0.1:%d", srv.port);
  assert_int_equal(kill(srv.pid, SIGSTOP), 0);
  const char *argv[] = {cli_exe, "health", target, NULL};
  pid_t health = th_spawn(argv, so, se);
  assert_true(health > 0);
  usleep(600 * 1000);
  assert_int_equal(kill(srv.pid, SIGCONT), 0);
  th_run r;
  th_collect(health, 60, so, se, &r);
  th_server_stop(&srv);
  if (r.code != 0)
    fail_msg("health exit %d: %s%s", r.code, r.out, r.err);
  assert_non_null(strstr(r.out, "SERVING"));
}

static void test_unavailable_within_deadline(void **state) {
  (void)state;
  int port = th_free_port();
  char target[64], err[256];
  cgc_options o;
  cgc_channel *ch;
  snprintf(target, sizeof target, "127.0.0.1:%d", port);
  cgc_options_init(&o);
  o.deadline_ms = 1500;
  o.retries = 1000;
  assert_int_equal(cgc_channel_new(&ch, target, &o, err, sizeof err), 0);
  tiny t;
  cgc_tensor *out = NULL;
  cgc_result res;
  cgc_status st;
  tiny_init(&t);
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  assert_int_equal(cgc_compute(ch, &t.req, &out, &res, &st), CGC_ERPC);
  clock_gettime(CLOCK_MONOTONIC, &b);
  double s =
      (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
  assert_true(st.code == GRPC_STATUS_UNAVAILABLE ||
              st.code == GRPC_STATUS_DEADLINE_EXCEEDED);
  assert_true(res.attempts > 1);
  assert_true(s < 3.0); /* bounded by the 1.5 s deadline */
  cgc_channel_free(ch);
}

static void round_robin(const char *fmt) {
  th_server a, b;
  char target[128], err[256];
  cgc_channel *ch;
  assert_int_equal(th_server_start(&a, server_exe, 0, NULL), 0);
  assert_int_equal(th_server_start(&b, server_exe, 0, NULL), 0);
  snprintf(target, sizeof target, fmt, a.port, b.port);
  assert_int_equal(cgc_channel_new(&ch, target, NULL, err, sizeof err), 0);
  cgc_health_status hs;
  cgc_status st;
  /* round_robin connects to every address; give both a moment. */
  assert_int_equal(cgc_health(ch, "", 0, &hs, &st), 0);
  usleep(300 * 1000);
  tiny t;
  tiny_init(&t);
  for (int i = 0; i < 20; i++) {
    cgc_tensor *out = NULL;
    if (cgc_compute(ch, &t.req, &out, NULL, &st))
      fail_msg("call %d: %s", i, st.message);
    cgc_tensor_free(out);
  }
  cgc_channel_free(ch);
  th_server_stop(&a);
  th_server_stop(&b);
  int na = th_count_lines(a.log, "status=OK");
  int nb = th_count_lines(b.log, "status=OK");
  unlink(a.log);
  unlink(b.log);
  if (na < 3 || nb < 3 || na + nb != 20)
    fail_msg("%s: calls per server %d + %d, expected both well used", target,
             na, nb);
}

static void test_round_robin_host_list(void **state) {
  (void)state;
  round_robin("127.0.0.1:%d,localhost:%d");
}

static void test_round_robin_ipv4_scheme(void **state) {
  (void)state;
  round_robin("ipv4:127.0.0.1:%d,127.0.0.1:%d");
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s convgrad-server convgrad\n", argv[0]);
    return 2;
  }
  server_exe = argv[1];
  cli_exe = argv[2];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_retry_until_server_starts),
      cmocka_unit_test(test_unavailable_within_deadline),
      cmocka_unit_test(test_slow_handshake_still_connects),
      cmocka_unit_test(test_round_robin_host_list),
      cmocka_unit_test(test_round_robin_ipv4_scheme),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
