/* bench_util.h - what the kernels' benchmarks (bench_kernels.c,
 * bench_check.c) share: a monotonic clock, medians and the --dtypes list. */
#ifndef CG_BENCH_UTIL_H
#define CG_BENCH_UTIL_H

/* Milliseconds on CLOCK_MONOTONIC. */
double bench_now_ms(void);

/* The median of v[0..n-1], n >= 1; sorts v in place, so v[0] is the
 * minimum afterwards. */
double bench_median(double *v, int n);

/* A comma-separated list of dtype names (f32,bf16,f16) into dtypes[],
 * indexed by cg_dtype (4 entries): 1 for the listed ones, 0 for the rest.
 * Returns 0, or -1 on a name cg_dtype_parse does not know. */
int bench_parse_dtypes(const char *list, int dtypes[4]);

#endif
