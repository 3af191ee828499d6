/* test_server_checks.c - the server's result checks through the wire
 * (server/cgs_checks.h):
 * - every build: with --check-rate 1, random problems of all four ops,
 *   dtypes, ranks and layouts come back right and are logged
 *   check=passed; GetServerInfo reports the rate and the counts;
 * - CG_FAULT_INJECT builds (the sanitizer build of tests/run-all.sh):
 *   with CONVGRAD_FAULT_INJECT=1 every computed output has one of its top
 *   16 bits flipped before the check: nearly every answer is the
 *   reference's or DATA_LOSS (a few-ulp bf16/f16 flip can hide in a
 *   check's rounding allowance: proto/SEMANTICS.md "Result checks"); and with
 * CONVGRAD_FAULT_BROKEN naming one geometry, its first call is caught,
 * recomputed on another implementation and answered right, and after
 * --check-quarantine failures health reports NOT_SERVING; warmed up
 * (--warmup), its warm-up check fails and its first call is checked all
 * the same;
 * - every build: the warm-up's checked runs on random inputs are a warmed
 *   layer's first runs: its first calls are not checked again, a new
 *   shape's are. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ts.h"

#define ST_SERVING 1
#define ST_NOT_SERVING 2

static Convgrad__V1__ResultChecks *checks_of(grpc_channel *ch,
                                             Convgrad__V1__ServerInfo **info) {
  *info = ts_server_info(ch);
  assert_non_null(*info);
  assert_non_null((*info)->result_checks);
  return (*info)->result_checks;
}

static void test_correct_results_pass(void **state) {
  (void)state;
  ts_server s;
  grpc_channel *ch;
  const char *args[] = {"--check-rate", "1", NULL};
  assert_int_equal(ts_fixture_start(&s, &ch, args), 0);
  uint64_t rng = 37;
  int n = 24;
  for (int i = 0; i < n; i++) {
    ts_problem tp;
    assert_int_equal(ts_random_problem(&tp, &rng), 0);
    if (ts_problem_run(ch, &tp, NULL) != 0)
      fail_msg("call %d (%s %s) failed", i, cg_op_name(tp.g.op),
               cg_dtype_name(tp.g.dtype));
    ts_problem_free(&tp);
  }
  assert_int_equal(ts_server_wait_log(&s, "check=passed", n, 10000), 0);
  Convgrad__V1__ServerInfo *info;
  Convgrad__V1__ResultChecks *rc = checks_of(ch, &info);
  assert_true(rc->rate == 1.0);
  assert_int_equal(rc->first_runs, 3);
  assert_true(rc->checked >= (uint64_t)n);
  assert_int_equal(rc->failed, 0);
  assert_false(rc->quarantined);
  convgrad__v1__server_info__free_unpacked(info, NULL);
  assert_int_equal(ts_health(ch, ""), ST_SERVING);
  assert_int_equal(ts_fixture_stop(&s, ch), 0);
}

/* A problem over the tiny jobs' bound (1 MFLOP), so that a worker runs
 * it, and the --warmup line of it. */
static const char warm_line[] =
    "mb2ic32ih14oc32oh14kh3ph1 op=ConvolutionBackwardData data_format=NXC "
    "weights_format=XIO\n";

static ts_desc warm_desc(uint64_t seed) {
  ts_desc d = ts_tiny_desc(seed);
  d.mb = 2;
  d.ic = d.oc = 32;
  d.is[0] = d.is[1] = 14;
  return d;
}

/* A --warmup file holding warm_line, its path in path (a directory made
 * for it; remove both with unlink_warmup). */
static void write_warmup(char *path, size_t cap) {
  char dir[] = "/tmp/cgs-checks-XXXXXX";
  assert_non_null(mkdtemp(dir));
  snprintf(path, cap, "%s/warm.txt", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  assert_int_equal(fputs(warm_line, f) >= 0, 1);
  assert_int_equal(fclose(f), 0);
}

static void unlink_warmup(char *path) {
  unlink(path);
  *strrchr(path, '/') = '\0';
  rmdir(path);
}

/* The warm-up makes a warmed layer's first runs, checked on random inputs:
 * the callers' first calls of it are not checked again, a new shape's
 * are; past the 8 runs the warm-up makes, the callers' are. */
/* Runs d's problem n times on ch, each result checked against the
 * reference. */
static void run_problem(grpc_channel *ch, const ts_desc *d, int n) {
  ts_problem tp;
  assert_int_equal(ts_problem_init(&tp, d), 0);
  assert_int_equal(ts_problem_reference(&tp), 0);
  for (int i = 0; i < n; i++)
    assert_int_equal(ts_problem_run(ch, &tp, NULL), 0);
  ts_problem_free(&tp);
}

static void test_warmup_makes_first_runs(void **state) {
  (void)state;
  ts_server s;
  grpc_channel *ch;
  char warm[128];
  write_warmup(warm, sizeof warm);
  const char *args[] = {
      "--workers", "1",        "--check-rate", "0", "--check-first-runs",
      "2",         "--warmup", warm,           NULL};
  assert_int_equal(ts_fixture_start(&s, &ch, args), 0);
  Convgrad__V1__ServerInfo *info;
  Convgrad__V1__ResultChecks *rc = checks_of(ch, &info);
  /* One output, one thread count, two runs. */
  assert_int_equal(rc->warmup_checked, 2);
  assert_int_equal(rc->warmup_failed, 0);
  assert_int_equal(rc->checked, 0);
  convgrad__v1__server_info__free_unpacked(info, NULL);
  ts_desc d = warm_desc(5);
  run_problem(ch, &d, 2);
  assert_int_equal(
      ts_server_wait_log(&s, "op=ConvolutionBackwardData", 2, 10000), 0);
  assert_int_equal(ts_server_log_count(&s, "check="), 0);
  /* A shape the warm-up did not run: checked on its first run. */
  d.is[0] = d.is[1] = 12;
  run_problem(ch, &d, 1);
  assert_int_equal(ts_server_wait_log(&s, "check=passed", 1, 10000), 0);
  rc = checks_of(ch, &info);
  assert_int_equal(rc->checked, 1);
  assert_int_equal(rc->warmup_checked, 2);
  convgrad__v1__server_info__free_unpacked(info, NULL);
  assert_int_equal(ts_fixture_stop(&s, ch), 0);

  /* More first runs than the warm-up makes (8): the callers' next ones
   * are checked up to the count. */
  args[5] = "9";
  assert_int_equal(ts_fixture_start(&s, &ch, args), 0);
  d = warm_desc(7);
  run_problem(ch, &d, 2);
  assert_int_equal(
      ts_server_wait_log(&s, "op=ConvolutionBackwardData", 2, 10000), 0);
  assert_int_equal(ts_server_log_count(&s, "check=passed"), 1);
  rc = checks_of(ch, &info);
  assert_int_equal(rc->warmup_checked, 8);
  assert_int_equal(rc->checked, 1);
  convgrad__v1__server_info__free_unpacked(info, NULL);
  assert_int_equal(ts_fixture_stop(&s, ch), 0);
  unlink_warmup(warm);
}

#ifdef CG_FAULT_INJECT
/* Every output corrupted: answers are right (recomputed) or DATA_LOSS. */
static void test_injected_faults_caught(void **state) {
  (void)state;
  ts_server s;
  grpc_channel *ch;
  /* No quarantine: every call is injected. */
  const char *args[] = {"--check-rate", "1", "--check-quarantine", "0", NULL};
  setenv("CONVGRAD_FAULT_INJECT", "1", 1);
  setenv("CONVGRAD_FAULT_SEED", "37", 1);
  int started = ts_fixture_start(&s, &ch, args);
  unsetenv("CONVGRAD_FAULT_SEED");
  unsetenv("CONVGRAD_FAULT_INJECT");
  assert_int_equal(started, 0);
  uint64_t rng = 3737;
  int n = 60, right = 0, lost = 0, wrong = 0;
  for (int i = 0; i < n; i++) {
    ts_problem tp;
    assert_int_equal(ts_random_problem(&tp, &rng), 0);
    assert_int_equal(ts_problem_reference(&tp), 0);
    const void *data[2] = {tp.in[0], tp.in[1]};
    size_t len[2] = {tp.g.in_bytes[0], tp.g.in_bytes[1]};
    ts_result r;
    assert_int_equal(ts_compute(ch, &tp.header, data, len, NULL, &r), 0);
    if (r.code == GRPC_STATUS_OK) {
      if (r.nbytes == tp.g.out_bytes && ts_problem_check(&tp, r.data) == 0)
        right++;
      else
        wrong++;
    } else if (r.code == GRPC_STATUS_DATA_LOSS) {
      lost++;
    } else {
      fail_msg("call %d: status %d: %s", i, (int)r.code, r.msg);
    }
    ts_result_free(&r);
    ts_problem_free(&tp);
  }
  print_message("%d calls, every output corrupted: %d answered right, %d "
                "DATA_LOSS, %d wrong\n",
                n, right, lost, wrong);
  assert_true(wrong * 20 <= n);
  Convgrad__V1__ServerInfo *info;
  Convgrad__V1__ResultChecks *rc = checks_of(ch, &info);
  /* Some flips stay within the rounding a check allows (and the
   * reference's tolerance); most do not. */
  assert_true(rc->failed > (uint64_t)n / 2);
  assert_int_equal(rc->failed, rc->recomputed + rc->data_loss);
  assert_true(right > n / 2);
  convgrad__v1__server_info__free_unpacked(info, NULL);
  assert_int_equal(ts_fixture_stop(&s, ch), 0);
}

/* One broken geometry: caught on its first call, the caller gets the
 * right result, the replica is quarantined after --check-quarantine. */
static void test_broken_geometry_quarantined(void **state) {
  (void)state;
  ts_server s;
  grpc_channel *ch;
  ts_problem tp;
  ts_desc d = ts_tiny_desc(7);
  assert_int_equal(ts_problem_init(&tp, &d), 0);
  char broken[96];
  snprintf(broken, sizeof broken, "%s:%zu", cg_op_name(tp.g.op),
           tp.g.out_elems);
  /* Unchecked, the broken result goes out: the hook is live. */
  const char *off[] = {"--check-rate", "0", "--check-first-runs", "0", NULL};
  setenv("CONVGRAD_FAULT_BROKEN", broken, 1);
  int started = ts_fixture_start(&s, &ch, off);
  assert_int_equal(started, 0);
  ts_result r;
  const void *data[2] = {tp.in[0], tp.in[1]};
  size_t len[2] = {tp.g.in_bytes[0], tp.g.in_bytes[1]};
  assert_int_equal(ts_problem_reference(&tp), 0);
  assert_int_equal(ts_compute(ch, &tp.header, data, len, NULL, &r), 0);
  assert_int_equal(r.code, GRPC_STATUS_OK);
  assert_true(ts_problem_check(&tp, r.data) > 0);
  ts_result_free(&r);
  assert_int_equal(ts_fixture_stop(&s, ch), 0);

  /* Checked as new on its first call: caught, recomputed, right. */
  const char *first[] = {"--check-rate",
                         "0",
                         "--check-first-runs",
                         "1",
                         "--check-quarantine",
                         "3",
                         NULL};
  started = ts_fixture_start(&s, &ch, first);
  assert_int_equal(started, 0);
  assert_int_equal(ts_problem_run(ch, &tp, NULL), 0);
  assert_int_equal(ts_server_wait_log(&s, "check=recomputed", 1, 10000), 0);
  assert_int_equal(ts_server_log_count(&s, "check failed output=diff_src"), 1);
  assert_int_equal(ts_health(ch, ""), ST_SERVING);
  assert_int_equal(ts_fixture_stop(&s, ch), 0);

  /* Every call checked: the third failure quarantines the replica. */
  const char *all[] = {"--check-rate", "1", "--check-quarantine", "3", NULL};
  started = ts_fixture_start(&s, &ch, all);
  unsetenv("CONVGRAD_FAULT_BROKEN");
  assert_int_equal(started, 0);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(ts_problem_run(ch, &tp, NULL), 0);
    if (i < 2)
      assert_int_equal(ts_health(ch, ""), ST_SERVING);
  }
  assert_int_equal(ts_server_wait_log(&s, "checks: quarantined", 1, 5000), 0);
  /* Health follows at the next housekeeping tick (2 s). */
  int st = 0;
  for (int i = 0; i < 50 && st != ST_NOT_SERVING; i++) {
    st = ts_health(ch, "");
    if (st != ST_NOT_SERVING)
      usleep(100 * 1000);
  }
  assert_int_equal(st, ST_NOT_SERVING);
  Convgrad__V1__ServerInfo *info;
  Convgrad__V1__ResultChecks *rc = checks_of(ch, &info);
  assert_true(rc->quarantined);
  assert_non_null(strstr(rc->quarantine_reason, "3 failed result checks"));
  assert_int_equal(rc->recomputed, 3);
  convgrad__v1__server_info__free_unpacked(info, NULL);
  /* Still answering right. */
  assert_int_equal(ts_problem_run(ch, &tp, NULL), 0);
  ts_problem_free(&tp);
  assert_int_equal(ts_fixture_stop(&s, ch), 0);
}

/* A broken geometry in the warm-up list: its warm-up check fails, and the
 * callers' first calls are checked as without warm-up: caught,
 * recomputed, right. */
static void test_broken_geometry_warmed(void **state) {
  (void)state;
  ts_server s;
  grpc_channel *ch;
  char warm[128], broken[96];
  write_warmup(warm, sizeof warm);
  ts_problem tp;
  ts_desc d = warm_desc(6);
  assert_int_equal(ts_problem_init(&tp, &d), 0);
  assert_int_equal(ts_problem_reference(&tp), 0);
  snprintf(broken, sizeof broken, "%s:%zu", cg_op_name(tp.g.op),
           tp.g.out_elems);
  setenv("CONVGRAD_FAULT_BROKEN", broken, 1);
  const char *args[] = {"--workers",
                        "1",
                        "--check-rate",
                        "0",
                        "--check-first-runs",
                        "1",
                        "--check-quarantine",
                        "0",
                        "--warmup",
                        warm,
                        NULL};
  int started = ts_fixture_start(&s, &ch, args);
  unsetenv("CONVGRAD_FAULT_BROKEN");
  assert_int_equal(started, 0);
  assert_int_equal(ts_server_log_count(&s, "outcome=warmup"), 1);
  Convgrad__V1__ServerInfo *info;
  Convgrad__V1__ResultChecks *rc = checks_of(ch, &info);
  assert_int_equal(rc->warmup_checked, 1);
  assert_int_equal(rc->warmup_failed, 1);
  convgrad__v1__server_info__free_unpacked(info, NULL);
  assert_int_equal(ts_problem_run(ch, &tp, NULL), 0);
  ts_problem_free(&tp);
  assert_int_equal(ts_server_wait_log(&s, "check=recomputed", 1, 10000), 0);
  assert_int_equal(ts_fixture_stop(&s, ch), 0);
  unlink_warmup(warm);
}
#endif

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_correct_results_pass),
      cmocka_unit_test(test_warmup_makes_first_runs),
#ifdef CG_FAULT_INJECT
      cmocka_unit_test(test_injected_faults_caught),
      cmocka_unit_test(test_broken_geometry_quarantined),
      cmocka_unit_test(test_broken_geometry_warmed),
#endif
  };
  return cmocka_run_group_tests_name("server_checks", tests, NULL, NULL);
}
