/* dtype.c - f32 <-> bf16 / f16 scalar conversions (round to nearest even,
 * NaN stays NaN, f16 subnormals exact) and the typed load/store/convert
 * helpers the reference implementation and the engine use. Bit-level code
 * so results do not depend on the compiler's _Float16 support. */
#include <string.h>

#include "cg/dtype.h"

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

uint16_t cg_f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  /* A NaN must not round into Inf: keep the top payload bits and set the
   * quiet bit so the result is a NaN even when those bits are 0. */
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((u >> 16) | 0x0040u);
  /* Round to nearest even on the 16 dropped bits; a carry into the
   * exponent is the correct result (up to Inf). */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float cg_bf16_to_f32(uint16_t h) {
  return bits_f32((uint32_t)h << 16);
}

uint16_t cg_f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) /* NaN: quiet, top payload bits kept */
    return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  /* 65520 is halfway between 65504 (max f16) and 65536; the tie goes to
   * the even neighbour, which is Inf. */
  if (a >= 0x477ff000u)
    return (uint16_t)(sign | 0x7c00u);
  if (a >= 0x38800000u) { /* normal f16: rebias the exponent by 127-15 */
    uint32_t r = a - (112u << 23);
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
  }
  /* Subnormal f16 (or zero): the result is round(|f| * 2^24). With the
   * implicit bit, |f| * 2^24 = mant * 2^(e - 126); below 2^-25 it rounds
   * to zero. */
  uint32_t e = a >> 23;
  if (e < 102)
    return sign;
  uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  uint32_t shift = 126 - e; /* 14..24 */
  uint32_t q = mant >> shift;
  uint32_t rem = mant & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u)))
    q++; /* may carry into the smallest normal, which is the right code */
  return (uint16_t)(sign | q);
}

float cg_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f)
    return bits_f32(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact in f32 */
    float v = (float)mant * 0x1p-24f;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

float cg_load_f32(cg_dtype dt, const void *buf, size_t i) {
  switch (dt) {
  case CG_DTYPE_BF16:
    return cg_bf16_to_f32(((const uint16_t *)buf)[i]);
  case CG_DTYPE_F16:
    return cg_f16_to_f32(((const uint16_t *)buf)[i]);
  default:
    return ((const float *)buf)[i];
  }
}

void cg_store_f32(cg_dtype dt, void *buf, size_t i, float v) {
  switch (dt) {
  case CG_DTYPE_BF16:
    ((uint16_t *)buf)[i] = cg_f32_to_bf16(v);
    break;
  case CG_DTYPE_F16:
    ((uint16_t *)buf)[i] = cg_f32_to_f16(v);
    break;
  default:
    ((float *)buf)[i] = v;
    break;
  }
}

void cg_convert(cg_dtype to, void *dst, cg_dtype from, const void *src,
                size_t n) {
  if (to == from) {
    memmove(dst, src, n * cg_dtype_size(to));
    return;
  }
  /* The engine's f32-convert path moves whole tensors through here: one
   * loop per pair, without a dtype switch per element, so the compiler
   * inlines and vectorises the scalar conversions. */
  if (from == CG_DTYPE_BF16 && to == CG_DTYPE_F32) {
    const uint16_t *s = src;
    float *d = dst;
    for (size_t i = 0; i < n; i++)
      d[i] = cg_bf16_to_f32(s[i]);
  } else if (from == CG_DTYPE_F32 && to == CG_DTYPE_BF16) {
    const float *s = src;
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++)
      d[i] = cg_f32_to_bf16(s[i]);
  } else if (from == CG_DTYPE_F16 && to == CG_DTYPE_F32) {
    const uint16_t *s = src;
    float *d = dst;
    for (size_t i = 0; i < n; i++)
      d[i] = cg_f16_to_f32(s[i]);
  } else if (from == CG_DTYPE_F32 && to == CG_DTYPE_F16) {
    const float *s = src;
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++)
      d[i] = cg_f32_to_f16(s[i]);
  } else {
    /* Every 16-bit value is exact in f32: through f32 rounds once. */
    for (size_t i = 0; i < n; i++)
      cg_store_f32(to, dst, i, cg_load_f32(from, src, i));
  }
}

double cg_dtype_epsilon(cg_dtype dt) {
  switch (dt) {
  case CG_DTYPE_BF16:
    return 0x1p-8;
  case CG_DTYPE_F16:
    return 0x1p-11;
  default:
    return 0x1p-24;
  }
}

void cg_fill_uniform(cg_dtype dt, void *buf, size_t n, uint64_t *state) {
  uint64_t x = *state ? *state : 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    float v = (float)(x >> 40) / 8388608.0f - 1.0f;
    cg_store_f32(dt, buf, i, v);
  }
  *state = x;
}
