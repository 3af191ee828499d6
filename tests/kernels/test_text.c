/* test_text.c - cg_text never writes past its buffer, for every buffer
 * size, marks where it cut, and escapes what could break a log line. */
#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cg/text.h"

#define GUARD 0x5a

/* Builds the shape list of the server's request log ("1x1x...,4x4") into
 * exactly cap bytes of a guarded buffer and checks the guard. */
static void dims_into(size_t cap, const int64_t *d, size_t n, char *expect) {
  unsigned char *mem = malloc(cap + 16);
  assert_non_null(mem);
  memset(mem, GUARD, cap + 16);
  cg_text t;
  cg_text_init(&t, cap ? (char *)mem : NULL, cap);
  cg_text_dims(&t, d, n);
  cg_text_appendf(&t, ",");
  cg_text_dims(&t, d, 2);
  for (size_t i = cap; i < cap + 16; i++)
    assert_int_equal(mem[i], GUARD);
  if (cap) {
    assert_int_equal(strlen((char *)mem), t.len);
    assert_true(t.len < cap);
    size_t full = strlen(expect);
    if (full < cap) {
      assert_false(t.cut);
      assert_string_equal((char *)mem, expect);
    } else {
      assert_true(t.cut);
      /* The kept part is the start of the text, then the marker. */
      size_t m = strlen(CG_TEXT_CUT) < cap - 1 ? strlen(CG_TEXT_CUT) : cap - 1;
      assert_memory_equal(mem, expect, t.len - m);
      assert_memory_equal(mem + t.len - m, CG_TEXT_CUT, m);
    }
  }
  free(mem);
}

/* The reported overflow: 80 dims of 1 print to 159 characters, so the
 * separator landed on the last byte of a 160-byte buffer. Every size
 * around it, and the tiny ones, must hold. */
static void dims_every_size(void **state) {
  (void)state;
  int64_t d[80];
  for (int i = 0; i < 80; i++)
    d[i] = 1;
  char expect[400];
  size_t k = 0;
  for (int i = 0; i < 80; i++)
    k += (size_t)snprintf(expect + k, sizeof expect - k, "%s1", i ? "x" : "");
  snprintf(expect + k, sizeof expect - k, ",1x1");
  for (size_t cap = 0; cap <= 200; cap++)
    dims_into(cap, d, 80, expect);
}

static void appendf_longer_than_scratch(void **state) {
  (void)state;
  char big[600], buf[512];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  cg_text t;
  cg_text_init(&t, buf, sizeof buf);
  cg_text_appendf(&t, "%s", big);
  assert_true(t.cut);
  assert_int_equal(strlen(buf), sizeof buf - 1);
  assert_string_equal(buf + sizeof buf - 1 - strlen(CG_TEXT_CUT), CG_TEXT_CUT);
  /* A 300-byte piece that fits is kept whole. */
  cg_text_init(&t, buf, sizeof buf);
  big[300] = '\0';
  cg_text_appendf(&t, "<%s>", big);
  assert_false(t.cut);
  assert_int_equal(t.len, 302);
  /* Nothing more goes in after a cut. */
  cg_text_init(&t, buf, 8);
  cg_text_appendf(&t, "0123456789");
  cg_text_appendf(&t, "x");
  assert_string_equal(buf, "0123...");
}

static void escapes_a_forged_line(void **state) {
  (void)state;
  const char path[] = "/x\n2026-11-24T00:00:00.000Z info  compute id=1 "
                      "status=OK \"q\" \\ \x1b[2J\xc3\xa9\x7f";
  char buf[256];
  cg_text t;
  cg_text_init(&t, buf, sizeof buf);
  cg_text_escaped(&t, path, sizeof path - 1);
  assert_false(t.cut);
  assert_null(strchr(buf, '\n'));
  assert_string_equal(buf, "/x\\x0a2026-11-24T00:00:00.000Z info  compute "
                           "id=1 status=OK \\\"q\\\" \\\\ "
                           "\\x1b[2J\\xc3\\xa9\\x7f");
  for (size_t i = 0; i < t.len; i++)
    assert_true(buf[i] >= 0x20 && buf[i] < 0x7f);
  /* Cut anywhere, the text stays inside the buffer and printable. */
  for (size_t cap = 0; cap < 24; cap++) {
    char small[24];
    cg_text_init(&t, cap ? small : NULL, cap);
    cg_text_escaped(&t, "\n\n\n\n\n\n", 6);
    if (cap) {
      assert_true(t.len < cap);
      assert_int_equal(strlen(small), t.len);
      for (size_t i = 0; i < t.len; i++)
        assert_true(small[i] >= 0x20 && small[i] < 0x7f);
    }
  }
}

/* Integers print as printf prints them, the extremes included, and cut
 * like any other text. */
static void ints_as_printf(void **state) {
  (void)state;
  const int64_t v[] = {
      0, 1, -1, 9, 10, -10, 1234567890123, INT64_MAX, INT64_MIN, INT64_MIN + 1};
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
    char buf[32], expect[32];
    snprintf(expect, sizeof expect, "%" PRId64, v[i]);
    cg_text t;
    cg_text_init(&t, buf, sizeof buf);
    cg_text_int(&t, v[i]);
    assert_false(t.cut);
    assert_string_equal(buf, expect);
  }
  char small[6];
  cg_text t;
  cg_text_init(&t, small, sizeof small);
  cg_text_int(&t, -1234567);
  assert_true(t.cut);
  assert_string_equal(small, "-1...");
}

/* Three decimals as printf prints them, for values that are not within a
 * rounding error of a half-thousandth: what the log's ms fields carry. */
static void fixed3_as_printf(void **state) {
  (void)state;
  const double v[] = {0,       -0.0,     0.0004, 0.0006,     0.010,
                      0.352,   12.3456,  1.9996, 999.9999,   123456.789,
                      -0.0004, -2.71828, 8e12,   1e13,       -1e15,
                      NAN,     INFINITY, 1e300,  0.00049999, 4503599.6274};
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
    char buf[400], expect[400];
    snprintf(expect, sizeof expect, "%.3f", v[i]);
    cg_text t;
    cg_text_init(&t, buf, sizeof buf);
    cg_text_fixed3(&t, v[i]);
    assert_string_equal(buf, expect);
  }
  /* Times in ns as the log takes them, every 37 ns up to 0.2 s, but
   * for those a rounding error from a half-microsecond. */
  for (uint64_t ns = 0; ns < 200000000; ns += 37 * 1000 + 37) {
    double ms = (double)ns / 1e6;
    if (ns % 1000 == 500)
      continue;
    char buf[64], expect[64];
    snprintf(expect, sizeof expect, "%.3f", ms);
    cg_text t;
    cg_text_init(&t, buf, sizeof buf);
    cg_text_fixed3(&t, ms);
    assert_string_equal(buf, expect);
  }
}

/* Names safe as one path component: what region names and keys allow. */
static void plain_names(void **state) {
  (void)state;
  assert_true(cg_text_plain_name("a", 4));
  assert_true(cg_text_plain_name("convgrad-1.x_2", 64));
  assert_true(cg_text_plain_name("..a", 4));
  assert_true(cg_text_plain_name("abcd", 4));
  assert_false(cg_text_plain_name("abcde", 4)); /* longer than max */
  assert_false(cg_text_plain_name("", 4));
  assert_false(cg_text_plain_name(".", 4));
  assert_false(cg_text_plain_name("..", 4));
  assert_false(cg_text_plain_name("a/b", 4));
  assert_false(cg_text_plain_name("a b", 4));
  assert_false(cg_text_plain_name("\xc3\xa9", 4));
  assert_false(cg_text_plain_name("a\n", 4));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(dims_every_size),
      cmocka_unit_test(appendf_longer_than_scratch),
      cmocka_unit_test(escapes_a_forged_line),
      cmocka_unit_test(ints_as_printf),
      cmocka_unit_test(fixed3_as_printf),
      cmocka_unit_test(plain_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
