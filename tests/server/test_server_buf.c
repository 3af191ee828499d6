/* test_server_buf.c - the tensor buffer cache: buffers are 64-byte
 * aligned, small ones are never cached, a cached buffer handed out for a
 * smaller request keeps its real capacity when it comes back, and the
 * cache never holds more than its budget. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cgs_buf.h"

#define MIB ((size_t)1 << 20)
#define BUDGET (64 * MIB)

static int setup(void **state) {
  (void)state;
  cgs_buf_init(BUDGET);
  return 0;
}

static int drain(void **state) {
  (void)state;
  cgs_buf_drain();
  return 0;
}

static void *alloc_checked(size_t n) {
  void *p = cgs_buf_alloc(n);
  assert_non_null(p);
  assert_int_equal((uintptr_t)p % 64, 0);
  assert_true(cgs_buf_capacity(p) >= n);
  memset(p, 0x5a, n); /* the whole request is usable */
  return p;
}

static void test_small_buffers_are_not_cached(void **state) {
  (void)state;
  void *p = alloc_checked(1000);
  assert_int_equal(cgs_buf_capacity(p), 1000);
  cgs_buf_free(p);
  assert_int_equal(cgs_buf_cached_bytes(), 0);
  cgs_buf_free(NULL);
}

static void test_reuse_keeps_real_capacity(void **state) {
  (void)state;
  void *big = alloc_checked(60 * MIB);
  cgs_buf_free(big);
  assert_int_equal(cgs_buf_cached_bytes(), 60 * MIB);

  void *p = alloc_checked(50 * MIB); /* within a quarter: the same block */
  assert_ptr_equal(p, big);
  assert_int_equal(cgs_buf_capacity(p), 60 * MIB);
  assert_int_equal(cgs_buf_cached_bytes(), 0);
  cgs_buf_free(p);
  assert_int_equal(cgs_buf_cached_bytes(), 60 * MIB);

  /* Ever smaller requests: none is handed a block more than a quarter
   * larger than it asked for, however often the big one went round. */
  size_t n = 60 * MIB;
  for (int i = 0; i < 12; i++) {
    n = n * 81 / 100;
    p = alloc_checked(n);
    assert_true(cgs_buf_capacity(p) - n <= n / 4 + 64 * 1024);
    cgs_buf_free(p);
    assert_true(cgs_buf_cached_bytes() <= BUDGET);
  }
}

static void test_cache_stays_within_budget(void **state) {
  (void)state;
  void *b[12];
  b[0] = alloc_checked(50 * MIB);
  for (int i = 1; i < 12; i++)
    b[i] = alloc_checked(5 * MIB);
  size_t real = 0;
  for (int i = 0; i < 12; i++) {
    real += cgs_buf_capacity(b[i]);
    cgs_buf_free(b[i]);
    assert_true(cgs_buf_cached_bytes() <= BUDGET);
  }
  assert_true(real > BUDGET); /* so some had to go */
  /* Every cached buffer is handed out again for the same requests. */
  assert_true(cgs_buf_cached_bytes() > 0);
  for (int i = 0; i < 12; i++)
    b[i] = alloc_checked(i ? 5 * MIB : 50 * MIB);
  assert_int_equal(cgs_buf_cached_bytes(), 0);
  for (int i = 0; i < 12; i++)
    cgs_buf_free(b[i]);
}

static void test_disabled_cache_frees_at_once(void **state) {
  (void)state;
  cgs_buf_init(0);
  void *p = alloc_checked(2 * MIB);
  cgs_buf_free(p);
  assert_int_equal(cgs_buf_cached_bytes(), 0);
  cgs_buf_init(BUDGET);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_small_buffers_are_not_cached, drain),
      cmocka_unit_test_teardown(test_reuse_keeps_real_capacity, drain),
      cmocka_unit_test_teardown(test_cache_stays_within_budget, drain),
      cmocka_unit_test_teardown(test_disabled_cache_frees_at_once, drain),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
