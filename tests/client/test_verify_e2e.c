/* test_verify_e2e.c - the client's own checks of what it receives
 * (cgc_options.verify_rate; client/README.md "Result checks"):
 * - every build: with verify_rate 1 every op in f32, bf16 and f16, called
 *   blocking, asynchronously and split over replicas, comes back right
 *   with no failed check (no false alarm), each output counted; a shape's
 *   first call is checked whatever the rate; a rate outside [0, 1] is
 *   refused;
 * - CG_FAULT_INJECT builds (the sanitizer build of tests/run-all.sh):
 *   against a server that corrupts every result it computes
 *   (CONVGRAD_FAULT_INJECT=1) and checks none itself (--check-rate 0
 *   --check-first-runs 0), verify_rate 0 lets wrong results through (so
 *   the checks below can fail), verify_rate 1 turns them into DATA_LOSS
 *   naming the output, op and replica; with a clean replica beside it
 *   the caller gets right results from the clean one, through the split's
 *   failover and through round_robin's next address. A few-ulp flip of a
 *   low bf16/f16 mantissa bit can hide in a check's rounding allowance
 *   (proto/SEMANTICS.md "Result checks"): at most 1 in 20 answers may be
 *   wrong, as in server_checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cg/reference.h"
#include "cgc/client.h"
#include "harness.h"
#include "spec.h"

static const char *server_exe;
/* The servers of the test running, stopped by its teardown even when an
 * assertion ended it. */
static th_server srv[2];

static void clear_servers(void) {
  for (int i = 0; i < 2; i++)
    srv[i] = (th_server){.pid = 0, .out_fd = -1};
}

static int stop_servers(void **state) {
  (void)state;
  for (int i = 0; i < 2; i++)
    th_server_stop(&srv[i]);
  clear_servers();
  return 0;
}

static const cg_op ops[] = {CG_OP_CONV_BWD,        CG_OP_DECONV_BWD,
                            CG_OP_CONV_BWD_DATA,   CG_OP_CONV_BWD_WEIGHTS,
                            CG_OP_DECONV_BWD_DATA, CG_OP_DECONV_BWD_WEIGHTS};
#define NOPS (sizeof ops / sizeof ops[0])
static const cg_dtype dtypes[] = {CG_DTYPE_F32, CG_DTYPE_BF16, CG_DTYPE_F16};

/* Call k of a test's sequence: every op and dtype in turn, both data
 * layouts, 2D problems with groups, strides and pads. */
static void problem_k(th_problem *p, int k) {
  cg_op op = ops[k % NOPS];
  int deconv = op == CG_OP_DECONV_BWD || op == CG_OP_DECONV_BWD_DATA ||
               op == CG_OP_DECONV_BWD_WEIGHTS;
  const char *desc =
      deconv ? "mb4g2ic8ih5oc4oh10kh4sh2ph1" : "mb4g2ic8ih9oc12oh5kh3sh2ph1";
  assert_int_equal(th_problem_init(p, desc, op, dtypes[(k / NOPS) % 3],
                                   k % 2 ? CG_DATA_NXC : CG_DATA_NCX,
                                   (uint64_t)k + 11),
                   0);
}

/* verify_notify: counts the lines, each naming the failed output. */
static void count_line(void *arg, const char *line) {
  if (!strstr(line, "client check failed: "))
    fail_msg("not a check's line: %s", line);
  (*(int *)arg)++;
}

static int lines; /* told by the channels below */

static cgc_channel *channel(const char *target, double rate, int replicas) {
  cgc_options o;
  cgc_channel *ch;
  char err[256];
  cgc_options_init(&o);
  o.verify_rate = rate;
  o.verify_notify = count_line;
  o.verify_notify_arg = &lines;
  o.replicas = replicas;
  o.split_min_flops = 1000; /* the small problems split too */
  if (cgc_channel_new(&ch, target, &o, err, sizeof err) != 0)
    fail_msg("channel to %s: %s", target, err);
  return ch;
}

static const char *target_of(const th_server *s, char *buf, size_t cap) {
  snprintf(buf, cap, "127.0.0.1:%d", s->port);
  return buf;
}

typedef struct tally {
  int right, wrong, lost;
} tally;

/* 1 when every output of p in out[] is within the reference's tolerance. */
static int all_right(const th_problem *p, cgc_tensor out[CG_GRAD_COUNT]) {
  void *ref[CG_GRAD_COUNT] = {NULL};
  const void *in[3] = {p->in[0], p->in[1], p->in[2]};
  char err[256];
  int ok = 1;
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    if (p->layer.grads & CG_GRAD_BIT(g))
      assert_non_null(ref[g] = malloc(p->layer.out_bytes[g]));
  assert_int_equal(cg_reference_layer(&p->layer, in, ref, err, sizeof err), 0);
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    if (!(p->layer.grads & CG_GRAD_BIT(g)))
      continue;
    cgc_diff d;
    assert_int_equal(out[g].nbytes, p->layer.out_bytes[g]);
    cgc_compare_output(&p->layer, g, out[g].data, ref[g], &d);
    ok &= d.ok;
    free(ref[g]);
  }
  return ok;
}

/* Calls p on ch, blocking or asynchronously, and counts how it came
 * back. */
static void call(cgc_channel *ch, const th_problem *p, int async, tally *t) {
  cgc_tensor out[CG_GRAD_COUNT];
  cgc_status st;
  int rc;
  memset(out, 0, sizeof out);
  if (async) {
    void *data[CG_GRAD_COUNT] = {NULL};
    size_t cap[CG_GRAD_COUNT] = {0};
    cgc_call *c;
    for (int g = 0; g < CG_GRAD_COUNT; g++)
      if (p->layer.grads & CG_GRAD_BIT(g)) {
        cap[g] = p->layer.out_bytes[g];
        assert_non_null(data[g] = malloc(cap[g]));
      }
    rc = cgc_call_start(ch, &p->req, data, cap, &c, &st);
    if (rc == 0)
      rc = cgc_call_finish(c, out, NULL, &st);
    if (rc == 0 && !all_right(p, out))
      t->wrong++;
    else if (rc == 0)
      t->right++;
    for (int g = 0; g < CG_GRAD_COUNT; g++)
      free(data[g]);
  } else {
    cgc_tensor *o[CG_GRAD_COUNT];
    rc = cgc_compute_layer(ch, &p->req, o, NULL, &st);
    for (int g = 0; rc == 0 && g < CG_GRAD_COUNT; g++)
      if (o[g]) {
        out[g] = *o[g];
        free(o[g]);
      }
    if (rc == 0)
      *(all_right(p, out) ? &t->right : &t->wrong) += 1;
    for (int g = 0; rc == 0 && g < CG_GRAD_COUNT; g++)
      free(out[g].data);
  }
  if (rc == CGC_ERPC && st.code == GRPC_STATUS_DATA_LOSS) {
    /* The client's, naming what failed and where. */
    if (!strstr(st.message, "client check failed: ") ||
        !strstr(st.message, cg_op_name(p->req.op)) ||
        !strstr(st.message, "127.0.0.1:") || !strstr(st.message, "in="))
      fail_msg("DATA_LOSS without the check's details: %s", st.message);
    t->lost++;
  } else if (rc != 0) {
    fail_msg("%s %s: %s: %s", cg_op_name(p->req.op),
             cg_dtype_name(p->req.inputs[0].dtype), cgc_strerror(rc),
             st.message);
  }
}

/* n calls of the sequence on ch, blocking or asynchronously. */
static tally calls(cgc_channel *ch, int n, int async) {
  tally t = {0, 0, 0};
  for (int k = 0; k < n; k++) {
    th_problem p;
    problem_k(&p, k);
    call(ch, &p, async, &t);
    th_problem_free(&p);
  }
  return t;
}

static void test_clean_results_pass(void **state) {
  (void)state;
  th_server *s = &srv[0];
  char target[64];
  const char *extra[] = {"--workers", "1", NULL};
  assert_int_equal(th_server_start(s, server_exe, 0, extra), 0);
  target_of(s, target, sizeof target);
  int n = 3 * (int)NOPS;
  struct {
    int replicas, async;
  } ways[] = {{0, 0}, {0, 1}, {2, 0}, {2, 1}};
  for (size_t w = 0; w < sizeof ways / sizeof ways[0]; w++) {
    cgc_channel *ch = channel(target, 1, ways[w].replicas);
    tally t = calls(ch, n, ways[w].async);
    cgc_verify_stats v;
    cgc_verify_stats_get(ch, &v);
    print_message("replicas %d async %d: %d right, %llu calls and %llu "
                  "outputs checked\n",
                  ways[w].replicas, ways[w].async, t.right,
                  (unsigned long long)v.calls, (unsigned long long)v.outputs);
    assert_int_equal(t.right, n);
    assert_int_equal(v.calls, n);
    /* Each dtype: two layer ops of 3 outputs, four single ops. */
    assert_true(v.outputs >= 3 * (2 * 3 + 4));
    assert_int_equal(v.failed, 0);
    assert_int_equal(v.recovered + v.lost, 0);
    cgc_channel_free(ch);
  }

  /* Whatever the rate, a shape's first call is checked, and only it. */
  cgc_channel *ch = channel(target, 1e-12, 0);
  tally t = calls(ch, 1, 0);
  t = calls(ch, 1, 0);
  assert_int_equal(t.right, 1);
  cgc_verify_stats v;
  cgc_verify_stats_get(ch, &v);
  assert_int_equal(v.calls, 1);
  assert_int_equal(v.outputs, 3);
  cgc_channel_free(ch);

  cgc_options o;
  char err[256];
  cgc_options_init(&o);
  o.verify_rate = 1.5;
  assert_int_equal(cgc_channel_new(&ch, target, &o, err, sizeof err),
                   CG_EINVAL);
  assert_non_null(strstr(err, "verify_rate"));
}

#ifdef CG_FAULT_INJECT
/* A server that corrupts every result and checks none. */
static void start_faulty(th_server *s) {
  const char *extra[] = {"--workers",
                         "1",
                         "--check-rate",
                         "0",
                         "--check-first-runs",
                         "0",
                         "--check-quarantine",
                         "0",
                         NULL};
  setenv("CONVGRAD_FAULT_INJECT", "1", 1);
  setenv("CONVGRAD_FAULT_SEED", "37", 1);
  int rc = th_server_start(s, server_exe, 0, extra);
  unsetenv("CONVGRAD_FAULT_SEED");
  unsetenv("CONVGRAD_FAULT_INJECT");
  assert_int_equal(rc, 0);
}

static void test_faults_caught(void **state) {
  (void)state;
  th_server *bad = &srv[0], *good = &srv[1];
  char target[64], list[128];
  const char *extra[] = {"--workers", "1", NULL};
  int n = 3 * (int)NOPS;
  start_faulty(bad);
  assert_int_equal(th_server_start(good, server_exe, 0, extra), 0);
  target_of(bad, target, sizeof target);
  snprintf(list, sizeof list, "127.0.0.1:%d,127.0.0.1:%d", bad->port,
           good->port);

  /* Unchecked, the corrupted results reach the caller. */
  cgc_channel *ch = channel(target, 0, 0);
  tally t = calls(ch, n, 0);
  print_message("unchecked: %d right, %d wrong\n", t.right, t.wrong);
  assert_true(t.wrong > n / 2);
  cgc_channel_free(ch);

  /* Checked against the faulty server alone: the retry is corrupted
   * too, and the caller gets DATA_LOSS instead of a wrong answer. */
  for (int async = 0; async < 2; async++) {
    lines = 0;
    ch = channel(target, 1, 0);
    t = calls(ch, n, async);
    cgc_verify_stats v;
    cgc_verify_stats_get(ch, &v);
    print_message("checked%s, one faulty server: %d right, %d DATA_LOSS, "
                  "%d wrong; %llu outputs checked, %llu failed, %llu lost\n",
                  async ? " (async)" : "", t.right, t.lost, t.wrong,
                  (unsigned long long)v.outputs, (unsigned long long)v.failed,
                  (unsigned long long)v.lost);
    assert_true(t.wrong * 20 <= n);
    assert_true(t.lost > n / 2);
    assert_int_equal(v.lost, t.lost);
    assert_true(v.failed >= 2 * (uint64_t)t.lost);
    assert_int_equal(lines, v.failed);
    cgc_channel_free(ch);
  }

  /* With a clean replica beside it, a failed output is asked of the
   * clean one: over the split's replicas, and round_robin's next
   * address. */
  /* Split (blocking and asynchronous: offload's calls) and round_robin. */
  static const struct {
    int replicas, async;
  } ways[] = {{2, 0}, {2, 1}, {0, 0}};
  for (size_t w = 0; w < sizeof ways / sizeof ways[0]; w++) {
    ch = channel(list, 1, ways[w].replicas);
    t = calls(ch, n, ways[w].async);
    cgc_verify_stats v;
    cgc_verify_stats_get(ch, &v);
    print_message("checked, replicas %d%s over a faulty and a clean server: "
                  "%d right, %d DATA_LOSS, %d wrong; %llu failed, %llu "
                  "recovered, %llu lost\n",
                  ways[w].replicas, ways[w].async ? " (async)" : "", t.right,
                  t.lost, t.wrong, (unsigned long long)v.failed,
                  (unsigned long long)v.recovered, (unsigned long long)v.lost);
    assert_true(t.wrong * 20 <= n);
    assert_true(v.recovered > 0);
    assert_int_equal(v.lost, t.lost);
    if (ways[w].replicas)
      assert_int_equal(t.lost, 0);
    cgc_channel_free(ch);
  }
}
#endif

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SERVER_EXE\n", argv[0]);
    return 2;
  }
  server_exe = argv[1];
  clear_servers();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_clean_results_pass, stop_servers),
#ifdef CG_FAULT_INJECT
      cmocka_unit_test_teardown(test_faults_caught, stop_servers),
#endif
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
