/* test_server_config.c - unit tests of the option table (server/config.c):
 * defaults, CONVGRAD_* variables, flags winning over them, bounds and
 * suffixes, cpu lists, --help and automatic values. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cgs_config.h"

static void test_defaults(void **state) {
  (void)state;
  cgs_config c;
  char err[256];
  assert_int_equal(cgs_config_defaults(&c, err, sizeof err), 0);
  assert_string_equal(c.listen, "127.0.0.1:50051");
  assert_int_equal(c.threads_per_worker, 0); /* auto */
  assert_int_equal(c.threads_policy, CGS_THREADS_AUTO);
  assert_int_equal(c.queue_depth, 256);
  assert_int_equal(c.chunk_bytes, 1 << 20);
  assert_int_equal(c.stream_window_bytes, 4 << 20);
  assert_int_equal(c.grace_ms, 30000);
  assert_int_equal(c.idle_timeout_ms, 30000);
  assert_int_equal(c.max_request_bytes, 3ull << 30);
  assert_true(c.max_request_flops == 100000000000ull);
  assert_int_equal(c.log_level, CGS_LOG_INFO);
  assert_int_equal(c.io_cpus.n, 0); /* not pinned */
  /* automatic values */
  c.max_inflight_bytes = 0;
  assert_int_equal(cgs_config_finish(&c, err, sizeof err), 0);
  assert_true(c.cpus.n >= 1);
  assert_true(c.workers >= 1);
  /* No static flag: one worker a core, a job takes the idle ones' too. */
  assert_int_equal(c.threads_policy, CGS_THREADS_ADAPTIVE);
  assert_int_equal(c.threads_per_worker, 1);
  assert_int_equal(c.workers, c.cpus.n);
  assert_true(c.max_inflight_bytes > 0);
  assert_true(c.max_request_bytes <= c.max_inflight_bytes);
  /* One client address gets half of the places at most. */
  assert_int_equal(c.max_calls_per_peer, (c.workers + c.queue_depth) / 2);
  assert_int_equal(c.min_upload_rate, 64 * 1024);
}

/* Writes text to dir/name, making dir (and its parents) first. */
static void put(const char *dir, const char *name, const char *text) {
  char cmd[600], path[600];
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
  assert_int_equal(system(cmd), 0);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* The budget's default follows the container's memory limit: the smallest
 * of the cgroup's own and its ancestors', in cgroup v2 and v1 layouts, and
 * none when every level says unlimited. */
static void test_cgroup_memory_limit(void **state) {
  (void)state;
  char root[] = "/tmp/cgs-cgroup-XXXXXX", d[300], self[300];
  assert_non_null(mkdtemp(root));
  snprintf(self, sizeof self, "%s/self", root);
  /* v2: 2 GiB on the parent, max on the leaf. */
  snprintf(d, sizeof d, "%s/kubepods/pod1", root);
  put(d, "memory.max", "max\n");
  snprintf(d, sizeof d, "%s/kubepods", root);
  put(d, "memory.max", "2147483648\n");
  put(root, "self", "0::/kubepods/pod1\n");
  assert_int_equal(cgs_config_cgroup_memory(root, self), 2147483648ull);
  /* v1, as docker writes "no limit" (about 2^63) at the root. */
  snprintf(d, sizeof d, "%s/memory/docker/abc", root);
  put(d, "memory.limit_in_bytes", "536870912\n");
  snprintf(d, sizeof d, "%s/memory", root);
  put(d, "memory.limit_in_bytes", "9223372036854771712\n");
  put(root, "self", "4:memory:/docker/abc\n1:cpu:/\n");
  assert_int_equal(cgs_config_cgroup_memory(root, self), 536870912ull);
  /* Unlimited everywhere, and no cgroup file at all. */
  put(root, "self", "4:memory:/\n");
  assert_int_equal(cgs_config_cgroup_memory(root, self), 0);
  snprintf(self, sizeof self, "%s/missing", root);
  assert_int_equal(cgs_config_cgroup_memory(root, self), 0);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  assert_int_equal(system(cmd), 0);
}

static void test_env_then_flags(void **state) {
  (void)state;
  cgs_config c;
  char err[256];
  assert_int_equal(cgs_config_defaults(&c, err, sizeof err), 0);
  setenv("CONVGRAD_QUEUE_DEPTH", "7", 1);
  setenv("CONVGRAD_MAX_REQUEST_BYTES", "2MiB", 1);
  setenv("CONVGRAD_LOG_LEVEL", "debug", 1);
  char *argv[] = {"convgrad-server",
                  "--queue-depth",
                  "9",
                  "--cpus",
                  "0,2-3",
                  "--grace=1.5",
                  "--listen",
                  "0.0.0.0:0",
                  "--io-cpus",
                  "1",
                  NULL};
  assert_int_equal(cgs_config_load(&c, 10, argv, stdout, err, sizeof err), 0);
  unsetenv("CONVGRAD_QUEUE_DEPTH");
  unsetenv("CONVGRAD_MAX_REQUEST_BYTES");
  unsetenv("CONVGRAD_LOG_LEVEL");
  assert_int_equal(c.max_request_bytes, 2 << 20); /* variables */
  assert_int_equal(c.log_level, CGS_LOG_DEBUG);
  assert_int_equal(c.grace_ms, 1500); /* flags */
  assert_int_equal(c.io_cpus.n, 1);
  assert_int_equal(c.io_cpus.cpu[0], 1);
  assert_int_equal(c.queue_depth, 9);
  assert_int_equal(c.cpus.n, 3);
  assert_int_equal(c.cpus.cpu[0], 0);
  assert_int_equal(c.cpus.cpu[2], 3);
  assert_int_equal(c.grace_ms, 1500);
  assert_string_equal(c.listen, "0.0.0.0:0");
  c.threads_per_worker = 2;
  assert_int_equal(cgs_config_finish(&c, err, sizeof err), 0);
  assert_int_equal(c.workers, 1); /* 3 cpus / 2 threads */
}

/* --workers or --threads-per-worker ask for the static policy unless
 * --threads-policy says otherwise. */
static void test_threads_policy(void **state) {
  (void)state;
  static const struct {
    const char *name, *value, *policy;
    cgs_threads_policy want;
  } cases[] = {
      {"workers", "1", NULL, CGS_THREADS_STATIC},
      {"threads-per-worker", "2", NULL, CGS_THREADS_STATIC},
      {"workers", "2", "adaptive", CGS_THREADS_ADAPTIVE},
      {"listen", "127.0.0.1:0", "static", CGS_THREADS_STATIC},
      {"listen", "127.0.0.1:0", NULL, CGS_THREADS_ADAPTIVE},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    cgs_config c;
    char err[256];
    assert_int_equal(cgs_config_defaults(&c, err, sizeof err), 0);
    assert_int_equal(cgs_config_set(&c, "cpus", "0", err, sizeof err), 0);
    assert_int_equal(
        cgs_config_set(&c, cases[i].name, cases[i].value, err, sizeof err), 0);
    if (cases[i].policy)
      assert_int_equal(cgs_config_set(&c, "threads-policy", cases[i].policy,
                                      err, sizeof err),
                       0);
    assert_int_equal(cgs_config_finish(&c, err, sizeof err), 0);
    assert_int_equal(c.threads_policy, cases[i].want);
    assert_true(c.threads_per_worker >= 1);
  }
}

static void expect_bad(const char *name, const char *value, const char *want) {
  cgs_config c;
  char err[256] = "";
  assert_int_equal(cgs_config_defaults(&c, err, sizeof err), 0);
  assert_int_equal(cgs_config_set(&c, name, value, err, sizeof err), -1);
  if (!strstr(err, want)) {
    fprintf(stderr, "'%s' lacks '%s'\n", err, want);
    fail();
  }
}

/* --check-rate is a fraction 0..1, kept in millionths; its variable
 * works as every option's. */
static void test_check_rate(void **state) {
  (void)state;
  cgs_config c;
  char err[256];
  assert_int_equal(cgs_config_defaults(&c, err, sizeof err), 0);
  assert_int_equal(c.check_rate_ppm, 2000); /* 0.002 */
  assert_int_equal(c.check_first_runs, 3);
  assert_int_equal(c.check_quarantine, 3);
  assert_int_equal(c.check_window_ms, 600000);
  assert_int_equal(cgs_config_set(&c, "check-rate", "0.25", err, sizeof err),
                   0);
  assert_int_equal(c.check_rate_ppm, 250000);
  assert_int_equal(cgs_config_set(&c, "check-rate", "1", err, sizeof err), 0);
  assert_int_equal(c.check_rate_ppm, 1000000);
  setenv("CONVGRAD_CHECK_RATE", "0", 1);
  char *argv[] = {"convgrad-server", NULL};
  assert_int_equal(cgs_config_load(&c, 1, argv, stdout, err, sizeof err), 0);
  unsetenv("CONVGRAD_CHECK_RATE");
  assert_int_equal(c.check_rate_ppm, 0);
  expect_bad("check-rate", "1.5",
             "--check-rate: expected a fraction in [0, 1]");
  expect_bad("check-rate", "-0.1", "expected a fraction");
  expect_bad("check-rate", "nan", "expected a fraction");
  expect_bad("check-rate", "0.5x", "expected a fraction");
  expect_bad("check-quarantine", "65", "[0, 64]");
}

static void test_bounds(void **state) {
  (void)state;
  expect_bad("workers", "257", "--workers: expected a number in [0, 256]");
  expect_bad("threads-per-worker", "257", "--threads-per-worker");
  expect_bad("threads-policy", "dynamic",
             "--threads-policy: expected adaptive or static, got 'dynamic'");
  expect_bad("queue-depth", "-1", "--queue-depth");
  expect_bad("queue-depth", "12abc", "got '12abc'");
  expect_bad("chunk-bytes", "8M", "--chunk-bytes");
  expect_bad("chunk-bytes", "1", "--chunk-bytes");
  expect_bad("stream-window", "2G", "--stream-window");
  expect_bad("max-request-bytes", "99999999999999999999999", "--max-request");
  expect_bad("max-request-bytes", "1X", "suffixes");
  expect_bad("grace", "-3", "--grace: expected 0 or seconds in [0.001, 3600]");
  expect_bad("cpus", "3-1", "--cpus");
  expect_bad("cpus", "0,,1", "--cpus");
  expect_bad("cpus", "999", "--cpus");
  expect_bad("io-cpus", "0-x", "--io-cpus");
  expect_bad("log-level", "loud", "--log-level");
  expect_bad("nonsense", "1", "unknown option");
  cgs_config c;
  char err[256];
  assert_int_equal(cgs_config_defaults(&c, err, sizeof err), 0);
  assert_int_equal(cgs_config_set(&c, "chunk-bytes", "64K", err, sizeof err),
                   0);
  assert_int_equal(c.chunk_bytes, 65536);
  assert_int_equal(
      cgs_config_set(&c, "max-inflight-bytes", "1GB", err, sizeof err), 0);
  assert_int_equal(c.max_inflight_bytes, 1ull << 30);
  /* flops take decimal suffixes, and no byte unit */
  assert_int_equal(
      cgs_config_set(&c, "max-request-flops", "2T", err, sizeof err), 0);
  assert_true(c.max_request_flops == 2000000000000ull);
  assert_int_equal(
      cgs_config_set(&c, "max-request-flops", "0", err, sizeof err), 0);
  assert_true(c.max_request_flops == 0);
  expect_bad("max-request-flops", "1GB", "--max-request-flops");
  expect_bad("max-request-flops", "20000000T", "suffixes");
}

/* The service limits: cg/limits.h's defaults, settable down to what the
 * attribute allows and up to the engine's maxima, and handed to the
 * kernels library with the flag that names each. */
static void test_service_limits(void **state) {
  (void)state;
  cgs_config c;
  char err[256];
  cg_limits l, def;
  assert_int_equal(cgs_config_defaults(&c, err, sizeof err), 0);
  cgs_config_limits(&c, &l);
  cg_limits_default(&def);
  assert_memory_equal(&l, &def, sizeof l);
  assert_int_equal(cgs_config_set(&c, "max-stride", "65536", err, sizeof err),
                   0);
  assert_int_equal(cgs_config_set(&c, "max-pad", "0", err, sizeof err), 0);
  cgs_config_limits(&c, &l);
  assert_int_equal(l.max[CG_LIMIT_STRIDE], 65536);
  assert_int_equal(l.max[CG_LIMIT_PAD], 0);
  expect_bad("max-stride", "65537",
             "--max-stride: expected a number in [1, "
             "65536]");
  expect_bad("max-stride", "0", "--max-stride");
  expect_bad("max-dilation", "65537", "--max-dilation");
  expect_bad("max-pad", "1048577", "--max-pad");
  expect_bad("max-output-padding", "65536", "--max-output-padding");
  expect_bad("max-effective-extent", "1048577", "--max-effective-extent");
  expect_bad("max-padded-extent", "1073741825", "--max-padded-extent");
  assert_string_equal(cgs_config_limit_flag(CG_LIMIT_PADDED_EXTENT),
                      "--max-padded-extent");
  assert_string_equal(cgs_config_limit_flag(CG_LIMIT_COUNT), "?");
}

/* --shm-prefix: the default is the client library's, '' means any name,
 * and a prefix that no key could carry is refused at start. */
static void test_shm_prefix(void **state) {
  (void)state;
  cgs_config c;
  char err[256];
  assert_int_equal(cgs_config_defaults(&c, err, sizeof err), 0);
  assert_string_equal(c.shm_prefix, "convgrad-");
  const char *good[] = {"", "trainer.a_1-", "x"};
  for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
    assert_int_equal(cgs_config_set(&c, "shm-prefix", good[i], err, sizeof err),
                     0);
    assert_int_equal(cgs_config_finish(&c, err, sizeof err), 0);
  }
  char long_prefix[66];
  memset(long_prefix, 'p', 65);
  long_prefix[65] = '\0';
  const char *bad[] = {"a/b", "..", "a b", long_prefix};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    assert_int_equal(cgs_config_set(&c, "shm-prefix", bad[i], err, sizeof err),
                     0);
    assert_int_equal(cgs_config_finish(&c, err, sizeof err), -1);
    assert_non_null(strstr(err, "--shm-prefix"));
  }
}

static void test_bad_env_and_args(void **state) {
  (void)state;
  cgs_config c;
  char err[256];
  assert_int_equal(cgs_config_defaults(&c, err, sizeof err), 0);
  char *none[] = {"convgrad-server", NULL};
  setenv("CONVGRAD_WORKERS", "many", 1);
  assert_int_equal(cgs_config_load(&c, 1, none, stdout, err, sizeof err), -1);
  assert_string_equal(err, "CONVGRAD_WORKERS: expected a number in [0, 256], "
                           "got 'many'");
  /* A flag overrides a variable that would not parse. */
  char *a0[] = {"convgrad-server", "--workers", "2", NULL};
  assert_int_equal(cgs_config_load(&c, 3, a0, stdout, err, sizeof err), 0);
  assert_int_equal(c.workers, 2);
  unsetenv("CONVGRAD_WORKERS");
  char *a1[] = {"convgrad-server", "--bogus", NULL};
  assert_int_equal(cgs_config_load(&c, 2, a1, stdout, err, sizeof err), -1);
  assert_non_null(strstr(err, "unknown option"));
  char *a2[] = {"convgrad-server", "--workers", NULL};
  assert_int_equal(cgs_config_load(&c, 2, a2, stdout, err, sizeof err), -1);
  assert_non_null(strstr(err, "missing value"));
  char *a3[] = {"convgrad-server", "extra", NULL};
  assert_int_equal(cgs_config_load(&c, 2, a3, stdout, err, sizeof err), -1);
  assert_non_null(strstr(err, "unexpected argument"));
  /* Under half a millisecond would round to 0, "no limit". */
  char *a4[] = {"convgrad-server", "--idle-timeout", "0.0004", NULL};
  assert_int_equal(cgs_config_load(&c, 3, a4, stdout, err, sizeof err), -1);
  assert_string_equal(err, "--idle-timeout: expected 0 or seconds in [0.001, "
                           "3600], got '0.0004'");
  char *a5[] = {"convgrad-server", "--idle-timeout", "0.0006", NULL};
  assert_int_equal(cgs_config_load(&c, 3, a5, stdout, err, sizeof err), 0);
  assert_int_equal(c.idle_timeout_ms, 1);
}

static void test_help_documents_every_option(void **state) {
  (void)state;
  cgs_config c;
  char err[256];
  assert_int_equal(cgs_config_defaults(&c, err, sizeof err), 0);
  char buf[16384] = "";
  FILE *f = fmemopen(buf, sizeof buf - 1, "w");
  /* Help is printed whatever the environment holds. */
  setenv("CONVGRAD_WORKERS", "many", 1);
  char *argv[] = {"convgrad-server", "--help", NULL};
  assert_int_equal(cgs_config_load(&c, 2, argv, f, err, sizeof err), 1);
  unsetenv("CONVGRAD_WORKERS");
  fclose(f);
  static const char *const opts[] = {"--listen",
                                     "CONVGRAD_LISTEN",
                                     "--workers",
                                     "--threads-per-worker",
                                     "--cpus",
                                     "--queue-depth",
                                     "--max-request-bytes",
                                     "--max-tensor-elements",
                                     "--max-inflight-bytes",
                                     "--chunk-bytes",
                                     "--stream-window",
                                     "--grace",
                                     "--idle-timeout",
                                     "--max-calls-per-peer",
                                     "--min-upload-rate",
                                     "--max-streams-per-connection",
                                     "--peer-log-rate",
                                     "--threads-policy",
                                     "threads_policy=",
                                     "--log-level",
                                     "CONVGRAD_LOG_LEVEL",
                                     "ready listen="};
  for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
    assert_non_null(strstr(buf, opts[i]));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_cgroup_memory_limit),
      cmocka_unit_test(test_env_then_flags),
      cmocka_unit_test(test_check_rate),
      cmocka_unit_test(test_bounds),
      cmocka_unit_test(test_service_limits),
      cmocka_unit_test(test_threads_policy),
      cmocka_unit_test(test_shm_prefix),
      cmocka_unit_test(test_bad_env_and_args),
      cmocka_unit_test(test_help_documents_every_option),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
