/* cg/dtype.h - scalar conversions between f32 and the 16-bit types.
 * Round to nearest even; NaN stays NaN. Thread-safe, no allocation. */
#ifndef CG_DTYPE_H
#define CG_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "cg/error.h"
#include "cg/problem.h"

#ifdef __cplusplus
extern "C" {
#endif

CG_EXPORT uint16_t cg_f32_to_bf16(float f);
CG_EXPORT float cg_bf16_to_f32(uint16_t h);
CG_EXPORT uint16_t cg_f32_to_f16(float f);
CG_EXPORT float cg_f16_to_f32(uint16_t h);

/* Element i of buf (of type dt) as f32, and the store that rounds to dt. */
CG_EXPORT float cg_load_f32(cg_dtype dt, const void *buf, size_t i);
CG_EXPORT void cg_store_f32(cg_dtype dt, void *buf, size_t i, float v);
/* Fills n elements of buf with seeded pseudo-random values, uniform in
 * [-1, 1) on a grid of 2^-23 (exact in f32), from the xorshift64 state
 * *state (0 = a fixed default), which it advances: the same state gives
 * the same data on every machine. For tests, benchmarks and the CLI. */
CG_EXPORT void cg_fill_uniform(cg_dtype dt, void *buf, size_t n,
                               uint64_t *state);

/* Converts n elements between dtypes (either may be f32). */
CG_EXPORT void cg_convert(cg_dtype to, void *dst, cg_dtype from,
                          const void *src, size_t n);

/* Unit roundoff of dt: 2^-24 (f32), 2^-8 (bf16), 2^-11 (f16). */
CG_EXPORT double cg_dtype_epsilon(cg_dtype dt);

#ifdef __cplusplus
}
#endif
#endif
