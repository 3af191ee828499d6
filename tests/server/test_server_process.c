/* test_server_process.c - process-wide settings of convgrad-server: it
 * re-executes itself with OMP_WAIT_POLICY=passive (same pid and name, so
 * scripts that signal it are unaffected) unless the environment already chose a
 * wait policy or spin count, and serves correct results either way. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ts.h"

static int setup(void **state) {
  (void)state;
  grpc_init();
  return 0;
}

static int teardown(void **state) {
  (void)state;
  grpc_shutdown();
  return 0;
}

/* The value of name in the running server's environment, "" if unset. */
static void server_env(const ts_server *s, const char *name, char *out,
                       size_t len) {
  char path[64], buf[65536];
  snprintf(path, sizeof path, "/proc/%d/environ", (int)s->pid);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  out[0] = '\0';
  size_t nl = strlen(name);
  for (size_t i = 0; i < n; i += strlen(buf + i) + 1) {
    if (strncmp(buf + i, name, nl) == 0 && buf[i + nl] == '=') {
      snprintf(out, len, "%s", buf + i + nl + 1);
      return;
    }
  }
}

/* The running server's process name, as ps and pkill see it. */
static void server_comm(const ts_server *s, char *out, size_t len) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/comm", (int)s->pid);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  assert_non_null(fgets(out, (int)len, f));
  fclose(f);
  out[strcspn(out, "\n")] = '\0';
}

/* Starts a server with the wait-policy variables as given (NULL = unset)
 * and checks what its environment holds and that it computes correctly. */
static void check_policy(const char *policy, const char *spin,
                         const char *want_policy) {
  char saved_policy[64] = "", saved_spin[64] = "";
  const char *p = getenv("OMP_WAIT_POLICY"), *sp = getenv("GOMP_SPINCOUNT");
  int had_policy = p != NULL, had_spin = sp != NULL;
  if (p)
    snprintf(saved_policy, sizeof saved_policy, "%s", p);
  if (sp)
    snprintf(saved_spin, sizeof saved_spin, "%s", sp);
  if (policy)
    setenv("OMP_WAIT_POLICY", policy, 1);
  else
    unsetenv("OMP_WAIT_POLICY");
  if (spin)
    setenv("GOMP_SPINCOUNT", spin, 1);
  else
    unsetenv("GOMP_SPINCOUNT");

  ts_server srv;
  grpc_channel *ch;
  static const char *const args[] = {"--workers", "1", "--threads-per-worker",
                                     "2", NULL};
  assert_int_equal(ts_fixture_start(&srv, &ch, args), 0);
  char got[64];
  server_env(&srv, "OMP_WAIT_POLICY", got, sizeof got);
  assert_string_equal(got, want_policy);
  server_comm(&srv, got, sizeof got);
  assert_string_equal(got, "convgrad-server"); /* a re-exec keeps it */

  /* A two-thread team computes the right answer under the policy. */
  ts_desc d = {.op = CG_OP_CONV_BWD_DATA, .dtype = CG_DTYPE_F32,
               .dfmt = CG_DATA_NXC, .groups = 1, .mb = 2, .ic = 16, .oc = 16,
               .nsp = 2, .is = {20, 20}, .ks = {3, 3}, .stride = 1,
               .pad = 1, .dil = 1};
  ts_problem tp;
  ts_opts o = {0};
  assert_int_equal(ts_problem_init(&tp, &d), 0);
  assert_int_equal(ts_problem_run(ch, &tp, &o), 0);
  ts_problem_free(&tp);
  assert_int_equal(ts_fixture_stop(&srv, ch), 0);

  if (had_policy)
    setenv("OMP_WAIT_POLICY", saved_policy, 1);
  else
    unsetenv("OMP_WAIT_POLICY");
  if (had_spin)
    setenv("GOMP_SPINCOUNT", saved_spin, 1);
  else
    unsetenv("GOMP_SPINCOUNT");
}

static void test_default_policy_is_passive(void **state) {
  (void)state;
  check_policy(NULL, NULL, "passive");
}

static void test_explicit_policy_is_kept(void **state) {
  (void)state;
  check_policy("active", NULL, "active");
}

static void test_spin_count_is_left_alone(void **state) {
  (void)state;
  check_policy(NULL, "10000", "");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_default_policy_is_passive),
      cmocka_unit_test(test_explicit_policy_is_kept),
      cmocka_unit_test(test_spin_count_is_left_alone),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
