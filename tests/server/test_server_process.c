/* test_server_process.c - process-wide settings of convgrad-server: it
 * re-executes itself with GOMP_SPINCOUNT=10000 (same pid and name, so
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

/* Sets name to value, or unsets it when value is NULL. */
static void env_put(const char *name, const char *value) {
  if (value)
    setenv(name, value, 1);
  else
    unsetenv(name);
}

/* Starts a server with the wait-policy variables as given (NULL = unset)
 * and checks what its environment holds and that it computes correctly;
 * then puts the test's own environment back. */
static void check_policy(const char *policy, const char *spin,
                         const char *want_policy, const char *want_spin) {
  static const char *const names[2] = {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"};
  const char *want[2] = {policy, spin};
  char *saved[2];
  for (int i = 0; i < 2; i++) {
    saved[i] = getenv(names[i]) ? strdup(getenv(names[i])) : NULL;
    env_put(names[i], want[i]);
  }

  ts_server srv;
  grpc_channel *ch;
  static const char *const args[] = {"--workers", "1", "--threads-per-worker",
                                     "2", NULL};
  assert_int_equal(ts_fixture_start(&srv, &ch, args), 0);
  char got[64];
  server_env(&srv, "OMP_WAIT_POLICY", got, sizeof got);
  assert_string_equal(got, want_policy);
  server_env(&srv, "GOMP_SPINCOUNT", got, sizeof got);
  assert_string_equal(got, want_spin);
  server_comm(&srv, got, sizeof got);
  assert_string_equal(got, "convgrad-server"); /* a re-exec keeps it */

  /* A two-thread team computes the right answer under the policy. */
  ts_desc d = {.op = CG_OP_CONV_BWD_DATA,
               .dtype = CG_DTYPE_F32,
               .dfmt = CG_DATA_NXC,
               .groups = 1,
               .mb = 2,
               .ic = 16,
               .oc = 16,
               .nsp = 2,
               .is = {20, 20},
               .ks = {3, 3},
               .stride = 1,
               .pad = 1,
               .dil = 1};
  ts_problem tp;
  ts_opts o = {0};
  assert_int_equal(ts_problem_init(&tp, &d), 0);
  assert_int_equal(ts_problem_run(ch, &tp, &o), 0);
  ts_problem_free(&tp);
  assert_int_equal(ts_fixture_stop(&srv, ch), 0);

  for (int i = 0; i < 2; i++) {
    env_put(names[i], saved[i]);
    free(saved[i]);
  }
}

/* A bounded spin: see exec_with_bounded_spin in server/main.c. */
static void test_default_spin_is_bounded(void **state) {
  (void)state;
  check_policy(NULL, NULL, "", "10000");
}

static void test_explicit_policy_is_kept(void **state) {
  (void)state;
  check_policy("active", NULL, "active", "");
}

static void test_spin_count_is_left_alone(void **state) {
  (void)state;
  check_policy(NULL, "300", "", "300");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_default_spin_is_bounded),
      cmocka_unit_test(test_explicit_policy_is_kept),
      cmocka_unit_test(test_spin_count_is_left_alone),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
