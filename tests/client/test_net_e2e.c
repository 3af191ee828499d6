/* test_net_e2e.c - retries and balancing against real server processes:
 * a call (and `convgrad smoke --wait`) issued before the server exists
 * succeeds once it starts; a server that never starts gives UNAVAILABLE
 * within the deadline; a server slow to answer its handshake is still
 * reached; round_robin over two servers sends calls to both (counted in
 * each server's per-request log); calls in flight or retrying while the
 * server is killed and restarted on its port all succeed; a server with
 * one worker and one queue place refuses most of eight concurrent callers
 * "retry later", and `convgrad bench` gets every call through by
 * retrying. */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>
#include <cmocka.h>

#include "cg/reference.h"
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
  cg_fill_uniform(CG_DTYPE_F32, t->dd, 64, &seed);
  cg_fill_uniform(CG_DTYPE_F32, t->w, 144, &seed);
  t->req.op = CG_OP_CONV_BWD_DATA;
  t->req.inputs[0] = (cgc_tensor_view){.dtype = CG_DTYPE_F32,
                                       .rank = 4,
                                       .dims = {1, 4, 4, 4},
                                       .data = t->dd,
                                       .nbytes = sizeof t->dd};
  t->req.inputs[1] = (cgc_tensor_view){.dtype = CG_DTYPE_F32,
                                       .rank = 4,
                                       .dims = {3, 3, 4, 4},
                                       .data = t->w,
                                       .nbytes = sizeof t->w};
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

/* One library call on a channel shared with other threads, checked
 * against the reference; the outcome is left for the main thread (cmocka
 * asserts only there). */
typedef struct restart_call {
  cgc_channel *ch;
  int rc, attempts, ok;
  cgc_status st;
} restart_call;

static void *restart_thread(void *p) {
  restart_call *c = p;
  cgc_spec s;
  cg_problem prob;
  cg_geom g;
  cgc_request req;
  cgc_tensor *out = NULL;
  cgc_result res;
  char err[256];
  uint64_t seed = 5;
  cgc_spec_init(&s);
  s.op = CG_OP_CONV_BWD_DATA;
  s.rank[0] = s.rank[1] = 4;
  memcpy(s.dims[0], (int64_t[4]){2, 8, 8, 8}, 4 * sizeof(int64_t));
  memcpy(s.dims[1], (int64_t[4]){3, 3, 8, 8}, 4 * sizeof(int64_t));
  s.pads_begin.len = s.pads_end.len = 2;
  s.pads_begin.v[0] = s.pads_begin.v[1] = s.pads_end.v[0] = s.pads_end.v[1] = 1;
  cgc_spec_problem(&s, &prob);
  c->rc = cg_problem_resolve(&prob, &g, err, sizeof err);
  if (c->rc) {
    snprintf(c->st.message, sizeof c->st.message, "%s", err);
    return NULL;
  }
  float *in0 = malloc(g.in_bytes[0]), *in1 = malloc(g.in_bytes[1]);
  float *ref = malloc(g.out_bytes);
  if (!in0 || !in1 || !ref) {
    snprintf(c->st.message, sizeof c->st.message, "out of memory");
    goto done;
  }
  cg_fill_uniform(CG_DTYPE_F32, in0, g.in_elems[0], &seed);
  cg_fill_uniform(CG_DTYPE_F32, in1, g.in_elems[1], &seed);
  cgc_spec_request(&s, in0, g.in_bytes[0], in1, g.in_bytes[1], &req);
  c->rc = cgc_compute(c->ch, &req, &out, &res, &c->st);
  c->attempts = res.attempts;
  if (c->rc == 0 && out->nbytes == g.out_bytes &&
      cg_reference_run(&g, in0, in1, ref, err, sizeof err) == 0) {
    cgc_diff d;
    cgc_compare(&g, out->data, ref, &d);
    c->ok = d.ok;
  }
  cgc_tensor_free(out);
done:
  free(in0);
  free(in1);
  free(ref);
  return NULL;
}

/* Issue 12 item 6: the server is SIGKILLed under CLI calls and library
 * calls (on one shared channel) and restarted on its port 0.5 s later.
 * Every call must get through (the CLI's with the default 5 retries; the
 * library's, started at once after the kill, with 10: under ASan the
 * server took longer to come back than 5 retries' 1.5 s): the retries
 * used to sleep without polling the channel, so its reconnects ran only
 * every few seconds and every call failed about 1 s after the server was
 * back. */
static void test_calls_survive_server_restart(void **state) {
  (void)state;
  enum { NCLI = 8, NLIB = 4 };
  th_server srv;
  assert_int_equal(th_server_start(&srv, server_exe, 0, NULL), 0);
  int port = srv.port;
  char target[64], tflag[80], err[256], outs[NCLI][128], errs[NCLI][128];
  snprintf(target, sizeof target, "127.0.0.1:%d", port);
  snprintf(tflag, sizeof tflag, "--target=%s", target);
  const char *argv[] = {cli_exe, "run", tflag, "--op",
                        "ConvolutionBackwardData", "--problem",
                        "mb2ic16ih14oc32oh14kh3ph1", "--check",
                        /* The default 5 retries wait about 1.5 s in all,
                         * and the server comes back 0.5 s after the kill
                         * plus its start, which under ASan on a loaded
                         * machine took longer: 10 wait about 11 s, as
                         * the library calls below get. */
                        "--retries", "10", NULL};
  pid_t cli[NCLI];
  cgc_options o;
  cgc_options_init(&o);
  o.retries = 10;
  cgc_channel *ch;
  assert_int_equal(cgc_channel_new(&ch, target, &o, err, sizeof err), 0);
  restart_call calls[NLIB];
  pthread_t th[NLIB];

  /* Half the CLI calls start before the kill (connecting or in flight
   * when it lands), the rest and the library calls right after it. */
  for (int i = 0; i < NCLI / 2; i++)
    assert_true((cli[i] = th_spawn(argv, outs[i], errs[i])) > 0);
  assert_int_equal(kill(srv.pid, SIGKILL), 0);
  th_server_stop(&srv);
  unlink(srv.log);
  for (int i = NCLI / 2; i < NCLI; i++)
    assert_true((cli[i] = th_spawn(argv, outs[i], errs[i])) > 0);
  for (int i = 0; i < NLIB; i++) {
    calls[i] = (restart_call){ch, -1, 0, 0, {0, ""}};
    assert_int_equal(pthread_create(&th[i], NULL, restart_thread, &calls[i]),
                     0);
  }
  usleep(500 * 1000);
  assert_int_equal(th_server_start(&srv, server_exe, port, NULL), 0);

  th_run r;
  int failed = 0;
  for (int i = 0; i < NCLI; i++) {
    th_collect(cli[i], 60, outs[i], errs[i], &r);
    if (r.code != 0 || !strstr(r.out, "check: max abs err") ||
        !strstr(r.out, ": OK")) {
      fprintf(stderr, "CLI call %d: exit %d: %s%s", i, r.code, r.out, r.err);
      failed++;
    }
  }
  for (int i = 0; i < NLIB; i++) {
    pthread_join(th[i], NULL);
    /* Started after the kill, each must have retried. */
    if (calls[i].rc || !calls[i].ok || calls[i].attempts < 2) {
      fprintf(stderr,
              "library call %d: rc %d, %s %s, reference %s, %d attempts\n", i,
              calls[i].rc, cgc_status_code_name(calls[i].st.code),
              calls[i].st.message, calls[i].ok ? "ok" : "not met",
              calls[i].attempts);
      failed++;
    }
  }
  cgc_channel_free(ch);
  th_server_stop(&srv);
  unlink(srv.log);
  if (failed)
    fail_msg("%d of %d calls failed across the restart", failed, NCLI + NLIB);
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

/* Issue 29 against the real server: its queue-full refusals carry
 * retry-after-ms, so the library retries them; no call fails. */
static void test_retry_later_from_a_full_queue(void **state) {
  (void)state;
  th_server srv;
  const char *extra[] = {"--workers", "1", "--queue-depth", "1", NULL};
  assert_int_equal(th_server_start(&srv, server_exe, 0, extra), 0);
  char tflag[80];
  snprintf(tflag, sizeof tflag, "--target=127.0.0.1:%d", srv.port);
  const char *argv[] = {cli_exe,
                        "bench",
                        tflag,
                        "--problem",
                        "mb2ic16ih14oc32oh14kh3ph1",
                        "--op",
                        "ConvolutionBackwardData",
                        "--concurrency",
                        "8",
                        "--requests",
                        "40",
                        "--warmup",
                        "0",
                        "--retries",
                        "1000",
                        "--json",
                        NULL};
  th_run r;
  th_run_cmd(&r, argv);
  th_server_stop(&srv);
  unlink(srv.log);
  if (r.code != 0)
    fail_msg("bench exit %d: %s%s", r.code, r.out, r.err);
  cJSON *root = cJSON_Parse(r.out);
  assert_non_null(root);
  cJSON *row = cJSON_GetArrayItem(root, 0);
  double n = cJSON_GetObjectItem(row, "requests")->valuedouble,
         retries = cJSON_GetObjectItem(row, "retries")->valuedouble,
         errors = cJSON_GetObjectItem(row, "errors")->valuedouble;
  cJSON_Delete(root);
  if (n != 40 || errors != 0 || retries < 1)
    fail_msg("%g calls, %g retries, %g errors", n, retries, errors);
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
      cmocka_unit_test(test_calls_survive_server_restart),
      cmocka_unit_test(test_round_robin_host_list),
      cmocka_unit_test(test_round_robin_ipv4_scheme),
      cmocka_unit_test(test_retry_later_from_a_full_queue),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
