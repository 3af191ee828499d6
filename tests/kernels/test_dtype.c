/* test_dtype.c - bf16/f16 conversions: every 16-bit pattern, rounding
 * ties, NaN/Inf/subnormals, checked against independent oracles (double
 * arithmetic for bf16, the compiler's _Float16 for f16). */
#include <math.h>

#include "cg/dtype.h"
#include "kt.h"

static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

/* xorshift64*: deterministic, seeded. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd32(void) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}

static int is_bf16_nan(uint16_t h) {
  return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0;
}

static int is_f16_nan(uint16_t h) {
  return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
}

static void bf16_all_patterns(void **state) {
  (void)state;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = cg_bf16_to_f32((uint16_t)h);
    assert_int_equal(bits(f), h << 16);
    uint16_t back = cg_f32_to_bf16(f);
    if (is_bf16_nan((uint16_t)h)) {
      assert_true(is_bf16_nan(back));
      assert_int_equal(back & 0x8000u, h & 0x8000u);
    } else {
      assert_int_equal(back, h);
    }
  }
}

/* Value of a bf16 magnitude code for distance comparisons; the code after
 * the largest finite one stands for 2^128, where rounding to Inf starts. */
static double bf16_mag(uint32_t code) {
  if (code >= 0x7f80u)
    return ldexp(1.0, 128);
  return (double)from_bits(code << 16);
}

/* Nearest bf16 by explicit distance, ties to even. */
static uint16_t bf16_oracle(float f) {
  uint32_t u = bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  uint32_t lo = a >> 16, hi = lo + 1;
  double x = fabs((double)f);
  double dlo = x - bf16_mag(lo), dhi = bf16_mag(hi) - x;
  uint32_t r = dlo < dhi ? lo : dhi < dlo ? hi : (lo & 1u) ? hi : lo;
  return (uint16_t)(sign | r);
}

static void bf16_rounding(void **state) {
  (void)state;
  /* Ties between 1 and 1 + 2^-7 go to the even code. */
  assert_int_equal(cg_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  assert_int_equal(cg_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  assert_int_equal(cg_f32_to_bf16(-(1.0f + 3 * 0x1p-8f)), 0xbf82);
  assert_int_equal(cg_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  /* Overflow to Inf and Inf itself; the largest finite stays. */
  assert_int_equal(cg_f32_to_bf16(from_bits(0x7f7fffffu)), 0x7f80);
  assert_int_equal(cg_f32_to_bf16(from_bits(0x7f7f7fffu)), 0x7f7f);
  assert_int_equal(cg_f32_to_bf16(INFINITY), 0x7f80);
  assert_int_equal(cg_f32_to_bf16(-INFINITY), 0xff80);
  /* A NaN whose payload sits only in the dropped bits stays a NaN. */
  assert_true(is_bf16_nan(cg_f32_to_bf16(from_bits(0x7f800001u))));
  assert_true(is_bf16_nan(cg_f32_to_bf16(from_bits(0xff800100u))));
  /* f32 subnormals round like everything else. */
  assert_int_equal(cg_f32_to_bf16(from_bits(0x00008000u)), 0x0000);
  assert_int_equal(cg_f32_to_bf16(from_bits(0x00018000u)), 0x0002);

  for (int i = 0; i < (1 << 22); i++) {
    uint32_t u = rnd32();
    float f = from_bits(u);
    if (isnan(f))
      continue;
    uint16_t got = cg_f32_to_bf16(f), want = bf16_oracle(f);
    if (got != want)
      fail_msg("bf16(0x%08x): got 0x%04x, want 0x%04x", u, got, want);
  }
}

static uint16_t f16_oracle_bits(float f) {
  _Float16 h = (_Float16)f;
  uint16_t b;
  memcpy(&b, &h, sizeof(b));
  return b;
}

static void f16_all_patterns(void **state) {
  (void)state;
  for (uint32_t h = 0; h < 65536; h++) {
    _Float16 hf;
    uint16_t hb = (uint16_t)h;
    memcpy(&hf, &hb, sizeof(hf));
    float want = (float)hf, got = cg_f16_to_f32(hb);
    uint16_t back = cg_f32_to_f16(got);
    if (is_f16_nan(hb)) {
      assert_true(isnan(got));
      assert_true(is_f16_nan(back));
      assert_int_equal(back & 0x8000u, h & 0x8000u);
      continue;
    }
    if (bits(got) != bits(want))
      fail_msg("f16 0x%04x: got %a, want %a", h, (double)got, (double)want);
    assert_int_equal(back, h);
  }
}

static void f16_rounding(void **state) {
  (void)state;
  assert_int_equal(cg_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
  assert_int_equal(cg_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
  assert_int_equal(cg_f32_to_f16(65504.0f), 0x7bff);
  assert_int_equal(cg_f32_to_f16(65519.0f), 0x7bff);
  assert_int_equal(cg_f32_to_f16(65520.0f), 0x7c00); /* tie -> even = Inf */
  assert_int_equal(cg_f32_to_f16(-1e9f), 0xfc00);
  assert_int_equal(cg_f32_to_f16(INFINITY), 0x7c00);
  /* Subnormals: 2^-24 is the smallest; 2^-25 ties to 0, 3*2^-25 to 2. */
  assert_int_equal(cg_f32_to_f16(0x1p-24f), 0x0001);
  assert_int_equal(cg_f32_to_f16(0x1p-25f), 0x0000);
  assert_int_equal(cg_f32_to_f16(0x1p-25f + 0x1p-40f), 0x0001);
  assert_int_equal(cg_f32_to_f16(3 * 0x1p-25f), 0x0002);
  assert_int_equal(cg_f32_to_f16(-5 * 0x1p-25f), 0x8002);
  /* Halfway between the largest subnormal and the smallest normal. */
  assert_int_equal(cg_f32_to_f16(0x1p-14f - 0x1p-25f), 0x0400);
  assert_int_equal(cg_f32_to_f16(1e-30f), 0x0000);
  assert_int_equal(cg_f32_to_f16(-0.0f), 0x8000);
  assert_true(is_f16_nan(cg_f32_to_f16(from_bits(0x7f800001u))));

  /* A strided sweep over all f32 patterns plus random ones, against the
   * compiler's conversion. */
  for (uint64_t u = 0; u <= 0xffffffffull; u += 251) {
    float f = from_bits((uint32_t)u);
    if (isnan(f))
      continue;
    uint16_t got = cg_f32_to_f16(f), want = f16_oracle_bits(f);
    if (got != want)
      fail_msg("f16(0x%08x): got 0x%04x, want 0x%04x", (unsigned)u, got, want);
  }
  for (int i = 0; i < (1 << 20); i++) {
    /* Concentrate on the f16 range (2^-31 .. 2^17), where the rounding
     * is exercised. */
    uint32_t r = rnd32();
    uint32_t u = (r & 0x807fffffu) | ((96u + (rnd32() % 48u)) << 23);
    float f = from_bits(u);
    uint16_t got = cg_f32_to_f16(f), want = f16_oracle_bits(f);
    if (got != want)
      fail_msg("f16(0x%08x): got 0x%04x, want 0x%04x", u, got, want);
  }
}

static void load_store_convert(void **state) {
  (void)state;
  const float src[5] = {1.0f, -2.5f, 1.0f + 0x1p-8f, 65520.0f, 0x1p-24f};
  uint16_t b[5], h[5];
  float back[5];
  cg_convert(CG_DTYPE_BF16, b, CG_DTYPE_F32, src, 5);
  cg_convert(CG_DTYPE_F16, h, CG_DTYPE_F32, src, 5);
  for (int i = 0; i < 5; i++) {
    assert_int_equal(b[i], cg_f32_to_bf16(src[i]));
    assert_int_equal(h[i], cg_f32_to_f16(src[i]));
    assert_true(cg_load_f32(CG_DTYPE_BF16, b, (size_t)i) ==
                cg_bf16_to_f32(b[i]));
    assert_true(cg_load_f32(CG_DTYPE_F32, src, (size_t)i) == src[i]);
  }
  assert_true(cg_load_f32(CG_DTYPE_F16, h, 1) == -2.5f);
  assert_true(isinf(cg_load_f32(CG_DTYPE_F16, h, 3)));
  /* f16 -> bf16 goes through f32 and rounds once. */
  uint16_t hb[5];
  cg_convert(CG_DTYPE_BF16, hb, CG_DTYPE_F16, h, 5);
  for (int i = 0; i < 5; i++)
    assert_int_equal(hb[i], cg_f32_to_bf16(cg_f16_to_f32(h[i])));
  cg_convert(CG_DTYPE_F32, back, CG_DTYPE_F32, src, 5);
  assert_memory_equal(back, src, sizeof(src));
  cg_store_f32(CG_DTYPE_F16, h, 0, 3.0f);
  assert_int_equal(h[0], 0x4200);
  cg_store_f32(CG_DTYPE_BF16, b, 4, -1.0f);
  assert_int_equal(b[4], 0xbf80);
  cg_store_f32(CG_DTYPE_F32, back, 2, 7.5f);
  assert_true(back[2] == 7.5f);

  assert_true(cg_dtype_epsilon(CG_DTYPE_F32) == 0x1p-24);
  assert_true(cg_dtype_epsilon(CG_DTYPE_BF16) == 0x1p-8);
  assert_true(cg_dtype_epsilon(CG_DTYPE_F16) == 0x1p-11);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(bf16_all_patterns),  cmocka_unit_test(bf16_rounding),
      cmocka_unit_test(f16_all_patterns),   cmocka_unit_test(f16_rounding),
      cmocka_unit_test(load_store_convert),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
