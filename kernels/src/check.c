/* check.c - result checks by the adjoint identity (cg/check.h).
 *
 * In plan.h's terms every op is a derivative of the triple sum
 *   T(lo, hi, W) = sum over n, g, cl, ch, p, k of
 *                  lo[n,g,cl,p] * hi[n,g,ch,q(p,k)] * W[g,cl,ch,k],
 * q(p,k) = p*S - PB + k*D inside hi: Convolution backward-data is dT/dhi
 * (lo = diff_dst), ConvTranspose backward-data dT/dlo (hi = diff_dst),
 * both backward-weights dT/dW. So for a gradient R of X and any probe P
 * shaped like X, <P, R> = T with X replaced by P.
 *
 * Probes. Data outputs: P = u[g,c] at the position (n, g, x) and 0
 * elsewhere, u[g,c] a random sign times a magnitude in [1, 2) drawn from
 * the seed (draw_probes), for every (n, g, x) at
 * once: the left side is z(n,g,x) = sum_c u[g,c] R[n,g,c,x], one pass over
 * R; the right side y(n,g,x) is the op itself on weights contracted by u,
 * Wu[g,c',k] = sum_c u[g,c] W[g,c',c,k] (or over the other index for
 * ConvTranspose): one output channel per group, 1/C of the op's work.
 * diff_weights: P = v[g,c] at (g, f, k) for every (g, f, k), contracting
 * the data tensor t whose channels per group are more (c runs over them,
 * f over the other's): z(g,k,f) = sum_c v[g,c] R[..c..f..k], and
 * y(g,k,f) = sum over n, p of tv[n,g,pos_t] * other[n,g,f,pos_f] with
 * tv = sum_c v[g,c] t[n,g,c,.], 1/C of the op.
 *
 * Tolerance of one comparison, with C the output channels summed (per
 * group), R_c their values, A_c = sum of |terms| of each and A = sum_c
 * |u_c| A_c (what the same loops give with |inputs| and |W| contracted by
 * |u|), and L the reduction length of one output element:
 * z - y = sum_c u_c e_c exactly but for the checker's own double rounding,
 * e_c the error of R_c. e_c is the rounding of the result to its dtype,
 * |r_c| <= u_out |R_c| (u_out = 2^-24, 2^-8, 2^-11), plus the f32
 * accumulation error a_c (oneDNN accumulates every dtype in f32, as does
 * the f32-convert path). Rounding to the dtype moves R_c by at most h_c,
 * half a unit in the last place of R_c (half_ulp). Under the
 * probabilistic model of Higham and Mary (SIAM J. Sci. Comput. 41(5),
 * 2019: rounding errors mean-independent and bounded), |a_c| <= lambda
 * sqrt(L) 2^-24 A_c for any summation order whose longest chain is at most
 * L, with probability at least 1 - 2L exp(-lambda^2/2) for each c. The
 * probes' signs are drawn after R is computed and independently of it, so
 * by Hoeffding's inequality |sum_c u_c r_c| <= lambda sqrt(sum_c u_c^2
 * h_c^2) with probability at least 1 - 2 exp(-lambda^2/2); and always
 * <= sum_c |u_c| h_c, the smaller where C is small. Hence
 *   tol = min(sum |u_c| h_c, lambda sqrt(sum u_c^2 h_c^2))
 *         + lambda sqrt(L) 2^-24 A + L 2^-24 (2 sum |u_c| h_c / u_out)
 *         + min(A, 2C (tiny + L 2^-126))
 *         + 2^-40 (A + sum |u_c| h_c / u_out),
 * where the third term covers what the model does not: terms of one sign
 * (constant inputs: a 1x65536 kernel over ones was off by 11 times the
 * model's bound, within the worst case L 2^-24 A), whose errors add up
 * to about L 2^-24 times the sum, bounded by |R_c| <= 2 h_c / u_out;
 * tiny is the absolute rounding of a subnormal result (f16 2^-25,
 * else 2^-126, which also covers a flush to zero), L 2^-126 per element
 * the products a kernel may flush to zero (neither exceeds the terms, A),
 * and the last term the checker's own double sums (an error of at most
 * about 2^-50 of the abs-sums, with margin). lambda = 8: exp(-32) = 1.3e-14, so
 * a correct result fails one comparison with probability below 2.6e-14 (L + 1),
 * about 1e-8 for L = 4608 and 10^5 comparisons a call, under that model. A
 * comparison whose sums are not finite, or whose abs-sum reaches the dtype's
 * largest value (a result may then overflow legitimately), is skipped and
 * counted.
 *
 * Detection: a wrong element R_c + d changes z by u_c d, |u_c| >= 1, caught
 * when that exceeds its position's tolerance: about the sum of the
 * channels' half-ulps (at most 8 sqrt(C) of them) for bf16 and f16, and
 * the accumulation term for f32 (measured in tests/engine/test_check.c and
 * tests/server/bench_faults.c). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cg/check.h"
#include "cg/dtype.h"
#include "plan.h"

/* libcgkernels builds this file with OpenMP; libcgclient, whose callers
 * must not get an OpenMP runtime, with -fopenmp-simd only
 * (client/CMakeLists.txt): the simd loops stay vectorized and every other
 * loop runs on the calling thread. */
#ifdef _OPENMP
#include <omp.h>
#define thread_num() omp_get_thread_num()
#else
#define thread_num() 0
#endif

#define LAMBDA 8.0
#define U_ACC 0x1p-24    /* f32 accumulation */
#define FLUSH 0x1p-126   /* the smallest normal f32 */
#define U_CHECK 0x1p-40  /* the checker's own double rounding, with margin */
#define F16_TINY 0x1p-25 /* half the spacing of f16 subnormals */

typedef struct ck_ctx {
  cg__plan pl;
  cg_dtype dt;
  int threads;
  double u_out, acc, tiny, overflow; /* see the derivation above */
  int64_t lo_pos, hi_pos, kpos;      /* positions of a sample and kernel taps */
  /* Per kernel tap k (row-major): its index on each padded axis, then its
   * offset in the weights: ktab[4k .. 4k+3]. The loops look taps up
   * rather than divide. */
  int64_t *ktab;
} ck_ctx;

/* ---- small helpers ---------------------------------------------------- */

uint64_t cg_check_mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t cg_check_seed(const void *salt) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return cg_check_mix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^
                        (uint64_t)getpid() ^ (uint64_t)(uintptr_t)salt);
}

/* n probe weights from seed: a random sign times a magnitude uniform in
 * [1, 2). Magnitudes that differ keep an error common to a position's
 * channels (an offset, a broadcast gone wrong) from cancelling, as it
 * would whenever +-1 signs sum to zero. */
static void draw_probes(double *u, int64_t n, uint64_t seed) {
  for (int64_t i = 0; i < n; i++) {
    uint64_t r = cg_check_mix64(seed ^ cg_check_mix64((uint64_t)i));
    double m = 1.0 + (double)(r >> 11) * 0x1p-53;
    u[i] = (r & 1) ? m : -m;
  }
}

static int64_t prod3(const int64_t v[3]) {
  return v[0] * v[1] * v[2];
}

/* calloc of n * a * b elements of size bytes; NULL when that overflows
 * or memory runs out. */
static void *alloc3(size_t n, size_t a, size_t b, size_t size) {
  size_t m;
  if (__builtin_mul_overflow(n, a, &m) || __builtin_mul_overflow(m, b, &m) ||
      __builtin_mul_overflow(m, size, &m))
    return NULL;
  return calloc(m ? m : 1, 1);
}

static int no_memory(char *err, size_t errlen) {
  return cg_errorf(err, errlen, CG_ENOMEM, "check: out of memory");
}

/* Sample n of a data tensor of c->dt with element strides st (C channels,
 * P positions) as f32 [P][C] in out; tmp holds C * P floats. Returns out,
 * or the tensor itself where it is already that (f32 NXC). NCX is
 * transposed in tiles, so that both sides stay in cache. */
static const float *stage_sample(const ck_ctx *c, const void *base,
                                 const int64_t st[5], int64_t C, int64_t P,
                                 int64_t n, float *tmp, float *out) {
  enum { TILE = 32 };
  size_t esz = cg_dtype_size(c->dt);
  const char *s = (const char *)base + (size_t)(n * st[0]) * esz;
  int nxc = st[1] == 1 || C == 1;
  if (c->dt == CG_DTYPE_F32 && nxc)
    return (const float *)s;
  const float *src = (const float *)s;
  if (c->dt != CG_DTYPE_F32 || nxc) {
    cg_convert(CG_DTYPE_F32, nxc ? out : tmp, c->dt, s, (size_t)(C * P));
    if (nxc)
      return out;
    src = tmp;
  }
  for (int64_t c0 = 0; c0 < C; c0 += TILE)
    for (int64_t x0 = 0; x0 < P; x0 += TILE) {
      int64_t c1 = c0 + TILE < C ? c0 + TILE : C;
      int64_t x1 = x0 + TILE < P ? x0 + TILE : P;
      for (int64_t x = x0; x < x1; x++)
        for (int64_t ch = c0; ch < c1; ch++)
          out[x * C + ch] = src[ch * P + x];
    }
  return out;
}

static void result_init(cg_check_result *r) {
  memset(r, 0, sizeof *r);
}

static void result_merge(cg_check_result *to, const cg_check_result *from) {
  to->compared += from->compared;
  to->skipped += from->skipped;
  to->failed += from->failed;
  if (from->worst > to->worst || (isnan(from->worst) && !isnan(to->worst))) {
    to->worst = from->worst;
    to->worst_diff = from->worst_diff;
    to->worst_tol = from->worst_tol;
    memcpy(to->worst_at, from->worst_at, sizeof to->worst_at);
  }
}

/* Half a unit in the last place of x in the output dtype (unit roundoff
 * u_out): u_out times the power of two at or below |x|, which bounds the
 * rounding of any value that rounded to x (subnormals aside: c->tiny). */
static inline double half_ulp(float x, double u_out) {
  uint32_t b;
  float p;
  memcpy(&b, &x, sizeof b);
  b &= 0x7f800000u;
  memcpy(&p, &b, sizeof p);
  return (double)p * u_out;
}

/* One comparison: z = sum_c u_c R_c, y the right side, a its abs-sum,
 * h and hsq the sum and the sum of squares of the R_c's half-ulps times
 * |u_c|, over C channels of reduction length L. */
static void compare(const ck_ctx *c, double z, double y, double a, double h,
                    double hsq, int64_t C, double L, int64_t i0, int64_t i1,
                    int64_t i2, cg_check_result *r) {
  if (!isfinite(y) || !isfinite(a) || a >= c->overflow) {
    r->skipped++;
    return;
  }
  double round = fmin(h, LAMBDA * sqrt(hsq));
  /* Subnormal rounding and flushed products never exceed the terms. */
  double tiny = fmin(a, 2.0 * (double)C * (c->tiny + L * FLUSH));
  /* Terms of one sign (constant data, say) break the model's
   * independence: their rounding errors add up to about L 2^-24 times the
   * sum itself, which |R_c| <= 2 h_c / u_out bounds. */
  double same_sign = L * U_ACC * 2.0 * h / c->u_out;
  double tol = round + c->acc * sqrt(L) * a + same_sign + tiny +
               U_CHECK * (a + h / c->u_out);
  double diff = fabs(z - y);
  double ratio = diff <= tol ? (tol > 0 ? diff / tol : 0) : diff / tol;
  r->compared++;
  if (!(diff <= tol)) {
    r->failed++;
    if (isnan(ratio))
      ratio = INFINITY;
  }
  if (ratio > r->worst) {
    r->worst = ratio;
    r->worst_diff = diff;
    r->worst_tol = tol;
    r->worst_at[0] = i0;
    r->worst_at[1] = i1;
    r->worst_at[2] = i2;
  }
}

/* q of p and k on every axis; -1 when it falls in the padding. Linear
 * indices in row-major order of the padded axes. */
static int64_t tap(const cg__plan *pl, const int64_t p[3], const int64_t k[3]) {
  int64_t q = 0;
  for (int a = 0; a < 3; a++) {
    int64_t v = p[a] * pl->s[a] - pl->pb[a] + k[a] * pl->d[a];
    if (v < 0 || v >= pl->hi_sp[a])
      return -1;
    q = q * pl->hi_sp[a] + v;
  }
  return q;
}

static void unravel(int64_t i, const int64_t sp[3], int64_t out[3]) {
  out[2] = i % sp[2];
  i /= sp[2];
  out[1] = i % sp[1];
  out[0] = i / sp[1];
}

static int64_t w_offset(const ck_ctx *c, int64_t g, int64_t cl, int64_t ch,
                        int64_t k) {
  const cg__plan *pl = &c->pl;
  return g * pl->w_st[0] + cl * pl->w_st[1] + ch * pl->w_st[2] +
         c->ktab[4 * k + 3];
}

/* ---- data outputs ----------------------------------------------------- */

/* Calls fn(arg, g, cl, ch, k, offset) for every element of the weights,
 * in the order of their memory: the loops nest by decreasing stride (a
 * tap's by its innermost axis'), so that any layout is read in one
 * sweep rather than a cache miss an element. */
typedef void (*weights_fn)(void *arg, int64_t g, int64_t cl, int64_t ch,
                           int64_t k, int64_t off);

static void weights_walk(const ck_ctx *c, weights_fn fn, void *arg) {
  const cg__plan *pl = &c->pl;
  int64_t n[4] = {pl->groups, pl->lo_cg, pl->hi_cg, c->kpos};
  int64_t st[4] = {pl->w_st[0], pl->w_st[1], pl->w_st[2], pl->w_st[5]};
  int order[4] = {0, 1, 2, 3};
  for (int a = 1; a < 4; a++) /* insertion sort, outermost first */
    for (int b = a; b > 0 && st[order[b]] > st[order[b - 1]]; b--) {
      int t = order[b];
      order[b] = order[b - 1];
      order[b - 1] = t;
    }
  int64_t ix[4];
  for (ix[order[0]] = 0; ix[order[0]] < n[order[0]]; ix[order[0]]++)
    for (ix[order[1]] = 0; ix[order[1]] < n[order[1]]; ix[order[1]]++)
      for (ix[order[2]] = 0; ix[order[2]] < n[order[2]]; ix[order[2]]++)
        for (ix[order[3]] = 0; ix[order[3]] < n[order[3]]; ix[order[3]]++)
          fn(arg, ix[0], ix[1], ix[2], ix[3],
             w_offset(c, ix[0], ix[1], ix[2], ix[3]));
}

typedef struct contract_arg {
  const ck_ctx *c;
  int out_is_hi;
  const float *w;
  const double *u;
  double *wu, *wa;
} contract_arg;

static void contract_one(void *arg, int64_t g, int64_t cl, int64_t ch,
                         int64_t k, int64_t off) {
  const contract_arg *a = arg;
  const cg__plan *pl = &a->c->pl;
  int64_t cin = a->out_is_hi ? pl->lo_cg : pl->hi_cg;
  int64_t cout = a->out_is_hi ? pl->hi_cg : pl->lo_cg;
  int64_t keep = a->out_is_hi ? cl : ch, sum = a->out_is_hi ? ch : cl;
  size_t i = (size_t)(((g * a->c->kpos) + k) * cin + keep);
  double v = a->w[off], u = a->u[g * cout + sum];
  a->wu[i] += u * v;
  a->wa[i] += fabs(u) * fabs(v);
}

/* The weights contracted by u over the output's channels (hi for
 * out_is_hi, else lo), as [g][k][c] over the other side's channels c:
 * wu with the probes, wa with |u| |W|. */
static void contract_weights(const ck_ctx *c, int out_is_hi, const float *w,
                             const double *u, double *wu, double *wa) {
  contract_arg a = {c, out_is_hi, w, u, wu, wa};
  weights_walk(c, contract_one, &a);
}

typedef struct data_bufs {
  float *tmp, *in, *out; /* staging of one sample */
  double *y, *ya;        /* [g][out positions] */
  cg_check_result res;
} data_bufs;

/* Thread t's part of the buffers fb (3 x stage floats a thread) and db
 * (2 x ysize doubles a thread). */
static data_bufs data_bufs_of(float *fb, double *db, int64_t t, int64_t stage,
                              int64_t ysize) {
  data_bufs b;
  b.tmp = fb + 3 * t * stage;
  b.in = b.tmp + stage;
  b.out = b.in + stage;
  b.y = db + 2 * t * ysize;
  b.ya = b.y + ysize;
  result_init(&b.res);
  return b;
}

/* Sample n of a data output. */
static void data_sample(const ck_ctx *c, int out_is_hi, const void *in_data,
                        const void *out, const double *u, const double *wu,
                        const double *wa, int64_t n, data_bufs *b) {
  const cg__plan *pl = &c->pl;
  int64_t G = pl->groups;
  int64_t cin = out_is_hi ? pl->lo_cg : pl->hi_cg;
  int64_t cout = out_is_hi ? pl->hi_cg : pl->lo_cg;
  int64_t p_in = out_is_hi ? c->lo_pos : c->hi_pos;
  int64_t p_out = out_is_hi ? c->hi_pos : c->lo_pos;
  const int64_t *in_st = out_is_hi ? pl->lo_st : pl->hi_st;
  const int64_t *out_st = out_is_hi ? pl->hi_st : pl->lo_st;
  double L = (double)(cin * c->kpos);
  const float *s =
      stage_sample(c, in_data, in_st, G * cin, p_in, n, b->tmp, b->in);

  memset(b->y, 0, (size_t)(G * p_out) * sizeof *b->y);
  memset(b->ya, 0, (size_t)(G * p_out) * sizeof *b->ya);
  for (int64_t p = 0; p < c->lo_pos; p++) {
    int64_t pp[3];
    unravel(p, pl->lo_sp, pp);
    for (int64_t k = 0; k < c->kpos; k++) {
      int64_t q = tap(pl, pp, &c->ktab[4 * k]);
      if (q < 0)
        continue;
      int64_t from = out_is_hi ? p : q, to = out_is_hi ? q : p;
      for (int64_t g = 0; g < G; g++) {
        const float *row = s + from * G * cin + g * cin;
        const double *a = wu + (g * c->kpos + k) * cin;
        const double *aa = wa + (g * c->kpos + k) * cin;
        double sum = 0, abs_sum = 0;
#pragma omp simd reduction(+ : sum, abs_sum)
        for (int64_t i = 0; i < cin; i++) {
          sum += (double)row[i] * a[i];
          abs_sum += fabs((double)row[i]) * aa[i];
        }
        b->y[g * p_out + to] += sum;
        b->ya[g * p_out + to] += abs_sum;
      }
    }
  }
  const float *r =
      stage_sample(c, out, out_st, G * cout, p_out, n, b->tmp, b->out);
  for (int64_t x = 0; x < p_out; x++)
    for (int64_t g = 0; g < G; g++) {
      const float *row = r + x * G * cout + g * cout;
      const double *ug = u + g * cout;
      double z = 0, h = 0, hsq = 0;
#pragma omp simd reduction(+ : z, h, hsq)
      for (int64_t i = 0; i < cout; i++) {
        double e = fabs(ug[i]) * half_ulp(row[i], c->u_out);
        z += ug[i] * (double)row[i];
        h += e;
        hsq += e * e;
      }
      compare(c, z, b->y[g * p_out + x], b->ya[g * p_out + x], h, hsq, cout, L,
              n, g, x, &b->res);
    }
}

static int check_data(const ck_ctx *c, int out_is_hi, const void *in_data,
                      const void *w_in, const void *out, uint64_t seed,
                      cg_check_result *res, char *err, size_t errlen) {
  const cg__plan *pl = &c->pl;
  int rc = 0;
  int64_t G = pl->groups, T = c->threads;
  int64_t cin = out_is_hi ? pl->lo_cg : pl->hi_cg;
  int64_t cout = out_is_hi ? pl->hi_cg : pl->lo_cg;
  int64_t p_in = out_is_hi ? c->lo_pos : c->hi_pos;
  int64_t p_out = out_is_hi ? c->hi_pos : c->lo_pos;
  int64_t stage = (p_in * cin > p_out * cout ? p_in * cin : p_out * cout) * G;
  size_t welems = (size_t)(G * pl->lo_cg * pl->hi_cg * c->kpos);
  double *u = alloc3(1, (size_t)G, (size_t)cout, sizeof *u);
  float *w = alloc3(1, 1, welems, sizeof *w);
  double *wu = alloc3(2, (size_t)(G * c->kpos), (size_t)cin, sizeof *wu);
  float *fb = alloc3((size_t)T, 3, (size_t)stage, sizeof *fb);
  double *db = alloc3((size_t)T, 2, (size_t)(G * p_out), sizeof *db);
  cg_check_result *part = alloc3(1, 1, (size_t)T, sizeof *part);
  if (!u || !w || !wu || !fb || !db || !part) {
    rc = no_memory(err, errlen);
    goto out;
  }
  double *wa = wu + G * c->kpos * cin;
  draw_probes(u, G * cout, seed);
  cg_convert(CG_DTYPE_F32, w, c->dt, w_in, welems);
  contract_weights(c, out_is_hi, w, u, wu, wa);
#pragma omp parallel num_threads(c->threads)
  {
    int t = thread_num();
    data_bufs b = data_bufs_of(fb, db, t, stage, G * p_out);
#pragma omp for schedule(dynamic, 1)
    for (int64_t n = 0; n < pl->mb; n++)
      data_sample(c, out_is_hi, in_data, out, u, wu, wa, n, &b);
    part[t] = b.res;
  }
  for (int64_t t = 0; t < T; t++)
    result_merge(res, &part[t]);
out:
  free(part);
  free(db);
  free(fb);
  free(wu);
  free(w);
  free(u);
  return rc;
}

/* ---- diff_weights ----------------------------------------------------- */

typedef struct weights_bufs {
  float *tmp, *t, *f; /* staging of one sample of each data tensor */
  double *tv, *tva;   /* [g][t positions], contracted by v and by |v| */
  double *y, *ya;     /* [g][k][f], this thread's sums */
} weights_bufs;

/* Thread t's part of fb (3 x stage floats a thread) and db (2 x (tsize +
 * ysize) doubles a thread). */
static weights_bufs weights_bufs_of(float *fb, double *db, int64_t t,
                                    int64_t stage, int64_t tsize,
                                    int64_t ysize) {
  weights_bufs b;
  b.tmp = fb + 3 * t * stage;
  b.t = b.tmp + stage;
  b.f = b.t + stage;
  b.tv = db + 2 * t * (tsize + ysize);
  b.tva = b.tv + tsize;
  b.y = b.tva + tsize;
  b.ya = b.y + ysize;
  return b;
}

/* Adds sample n's products into b->y, b->ya. contract_lo: t = lo. */
static void weights_sample(const ck_ctx *c, int contract_lo, const void *lo,
                           const void *hi, const double *v, int64_t n,
                           weights_bufs *b) {
  const cg__plan *pl = &c->pl;
  int64_t G = pl->groups;
  int64_t tc = contract_lo ? pl->lo_cg : pl->hi_cg;
  int64_t fc = contract_lo ? pl->hi_cg : pl->lo_cg;
  int64_t pt = contract_lo ? c->lo_pos : c->hi_pos;
  int64_t pf = contract_lo ? c->hi_pos : c->lo_pos;
  const float *ts = stage_sample(c, contract_lo ? lo : hi,
                                 contract_lo ? pl->lo_st : pl->hi_st, G * tc,
                                 pt, n, b->tmp, b->t);
  for (int64_t x = 0; x < pt; x++)
    for (int64_t g = 0; g < G; g++) {
      const float *row = ts + x * G * tc + g * tc;
      const double *vg = v + g * tc;
      double s = 0, sa = 0;
#pragma omp simd reduction(+ : s, sa)
      for (int64_t i = 0; i < tc; i++) {
        s += vg[i] * (double)row[i];
        sa += fabs(vg[i] * (double)row[i]);
      }
      b->tv[g * pt + x] = s;
      b->tva[g * pt + x] = sa;
    }
  const float *fs = stage_sample(c, contract_lo ? hi : lo,
                                 contract_lo ? pl->hi_st : pl->lo_st, G * fc,
                                 pf, n, b->tmp, b->f);
  for (int64_t p = 0; p < c->lo_pos; p++) {
    int64_t pp[3];
    unravel(p, pl->lo_sp, pp);
    for (int64_t k = 0; k < c->kpos; k++) {
      int64_t q = tap(pl, pp, &c->ktab[4 * k]);
      if (q < 0)
        continue;
      int64_t xt = contract_lo ? p : q, xf = contract_lo ? q : p;
      for (int64_t g = 0; g < G; g++) {
        double a = b->tv[g * pt + xt], aa = b->tva[g * pt + xt];
        const float *row = fs + xf * G * fc + g * fc;
        double *y = b->y + (g * c->kpos + k) * fc;
        double *ya = b->ya + (g * c->kpos + k) * fc;
#pragma omp simd
        for (int64_t i = 0; i < fc; i++) {
          y[i] += a * (double)row[i];
          ya[i] += aa * fabs((double)row[i]);
        }
      }
    }
  }
}

/* The left sides of diff_weights' comparisons: z, h and hsq per (g, k,
 * f), summed over the contracted channels as the weights are walked. */
typedef struct left_arg {
  const ck_ctx *c;
  int contract_lo;
  const float *w;
  const double *v;
  double *z, *h, *hsq; /* [g][k][f] */
} left_arg;

static void left_one(void *arg, int64_t g, int64_t cl, int64_t ch, int64_t k,
                     int64_t off) {
  const left_arg *a = arg;
  const cg__plan *pl = &a->c->pl;
  int64_t tc = a->contract_lo ? pl->lo_cg : pl->hi_cg;
  int64_t fc = a->contract_lo ? pl->hi_cg : pl->lo_cg;
  int64_t i = a->contract_lo ? cl : ch, f = a->contract_lo ? ch : cl;
  int64_t at = (g * a->c->kpos + k) * fc + f;
  float r = a->w[off];
  double v = a->v[g * tc + i], e = fabs(v) * half_ulp(r, a->c->u_out);
  a->z[at] += v * (double)r;
  a->h[at] += e;
  a->hsq[at] += e * e;
}

static int check_weights(const ck_ctx *c, const void *lo, const void *hi,
                         const void *out, uint64_t seed, cg_check_result *res,
                         char *err, size_t errlen) {
  const cg__plan *pl = &c->pl;
  int rc = 0;
  int64_t G = pl->groups, T = c->threads;
  /* Contract the side with more channels: the cheaper check. */
  int contract_lo = pl->lo_cg >= pl->hi_cg;
  int64_t tc = contract_lo ? pl->lo_cg : pl->hi_cg;
  int64_t fc = contract_lo ? pl->hi_cg : pl->lo_cg;
  int64_t pt = contract_lo ? c->lo_pos : c->hi_pos;
  int64_t pf = contract_lo ? c->hi_pos : c->lo_pos;
  int64_t stage = (pt * tc > pf * fc ? pt * tc : pf * fc) * G;
  int64_t ysize = G * c->kpos * fc;
  size_t welems = (size_t)(G * pl->lo_cg * pl->hi_cg * c->kpos);
  double *v = alloc3(1, (size_t)G, (size_t)tc, sizeof *v);
  float *w = alloc3(1, 1, welems, sizeof *w);
  float *fb = alloc3((size_t)T, 3, (size_t)stage, sizeof *fb);
  double *db = alloc3((size_t)T, 2, (size_t)(G * pt + ysize), sizeof *db);
  double *zs = alloc3(3, 1, (size_t)ysize, sizeof *zs);
  if (!v || !w || !fb || !db || !zs) {
    rc = no_memory(err, errlen);
    goto out;
  }
  draw_probes(v, G * tc, seed);
#pragma omp parallel num_threads(c->threads)
  {
    weights_bufs b =
        weights_bufs_of(fb, db, thread_num(), stage, G * pt, ysize);
#pragma omp for schedule(dynamic, 1)
    for (int64_t n = 0; n < pl->mb; n++)
      weights_sample(c, contract_lo, lo, hi, v, n, &b);
  }
  weights_bufs sum = weights_bufs_of(fb, db, 0, stage, G * pt, ysize);
  for (int64_t t = 1; t < T; t++) {
    weights_bufs b = weights_bufs_of(fb, db, t, stage, G * pt, ysize);
    for (int64_t i = 0; i < ysize; i++) {
      sum.y[i] += b.y[i];
      sum.ya[i] += b.ya[i];
    }
  }
  cg_convert(CG_DTYPE_F32, w, c->dt, out, welems);
  left_arg la = {c, contract_lo, w, v, zs, zs + ysize, zs + 2 * ysize};
  weights_walk(c, left_one, &la);
  double L = (double)(pl->mb * c->lo_pos);
  for (int64_t g = 0; g < G; g++)
    for (int64_t k = 0; k < c->kpos; k++)
      for (int64_t f = 0; f < fc; f++) {
        int64_t at = (g * c->kpos + k) * fc + f;
        compare(c, la.z[at], sum.y[at], sum.ya[at], la.h[at], la.hsq[at], tc, L,
                g, k, f, res);
      }
out:
  free(zs);
  free(db);
  free(fb);
  free(w);
  free(v);
  return rc;
}

/* ---- entry points ----------------------------------------------------- */

static int ctx_init(ck_ctx *c, const cg_geom *g, int threads, char *err,
                    size_t errlen) {
  if (!g || g->nsp < 1 || g->nsp > CG_MAX_SPATIAL || g->groups < 1 ||
      g->mb < 1 || g->ic % g->groups || g->oc % g->groups ||
      cg_dtype_size(g->dtype) == 0)
    return cg_errorf(err, errlen, CG_EINVAL, "check: invalid geometry");
  c->dt = g->dtype;
#if defined(CG_CHECK_ONE_THREAD) || !defined(_OPENMP)
  /* A ThreadSanitizer build (kernels/CMakeLists.txt), or libcgclient's. */
  (void)threads;
  c->threads = 1;
#else
  c->threads = threads < 1 ? 1 : threads;
#endif
  c->ktab = NULL;
  c->u_out = cg_dtype_epsilon(g->dtype);
  c->acc = LAMBDA * U_ACC;
  c->tiny = g->dtype == CG_DTYPE_F16 ? F16_TINY : FLUSH;
  c->overflow = g->dtype == CG_DTYPE_F16 ? 65504.0 : 0x1.fffffep127;
  return 0;
}

int cg_check_run(const cg_geom *geom, const void *in0, const void *in1,
                 const void *out, uint64_t seed, int threads,
                 cg_check_result *res, char *err, size_t errlen) {
  ck_ctx c;
  int rc = ctx_init(&c, geom, threads, err, errlen);
  result_init(res);
  if (rc)
    return rc;
  if (!in0 || !in1 || !out)
    return cg_errorf(err, errlen, CG_EINVAL, "check: NULL buffer");
  cg_data_format df = geom->data_format, odf = geom->out_data_format;
  cg_weights_format wf = geom->weights_format, owf = geom->out_weights_format;
  switch (geom->op) {
  case CG_OP_CONV_BWD_DATA: /* lo = diff_dst, out = hi */
    cg__plan_init(&c.pl, geom, df, odf, wf);
    break;
  case CG_OP_DECONV_BWD_DATA: /* hi = diff_dst, out = lo */
    cg__plan_init(&c.pl, geom, odf, df, wf);
    break;
  case CG_OP_CONV_BWD_WEIGHTS:
  case CG_OP_DECONV_BWD_WEIGHTS:
    cg__plan_init(&c.pl, geom, df, df, owf);
    break;
  default:
    return cg_errorf(err, errlen, CG_EINVAL, "check: invalid op %d",
                     (int)geom->op);
  }
  c.lo_pos = prod3(c.pl.lo_sp);
  c.hi_pos = prod3(c.pl.hi_sp);
  c.kpos = prod3(c.pl.k);
  c.ktab = alloc3(4, 1, (size_t)c.kpos, sizeof *c.ktab);
  if (!c.ktab)
    return no_memory(err, errlen);
  for (int64_t k = 0; k < c.kpos; k++) {
    int64_t *t = &c.ktab[4 * k];
    unravel(k, c.pl.k, t);
    t[3] = t[0] * c.pl.w_st[3] + t[1] * c.pl.w_st[4] + t[2] * c.pl.w_st[5];
  }
  switch (geom->op) {
  case CG_OP_CONV_BWD_DATA:
    rc = check_data(&c, 1, in0, in1, out, seed, res, err, errlen);
    break;
  case CG_OP_DECONV_BWD_DATA:
    rc = check_data(&c, 0, in0, in1, out, seed, res, err, errlen);
    break;
  case CG_OP_CONV_BWD_WEIGHTS: /* in0 = src = hi, in1 = diff_dst = lo */
    rc = check_weights(&c, in1, in0, out, seed, res, err, errlen);
    break;
  default: /* in0 = src = lo, in1 = diff_dst = hi */
    rc = check_weights(&c, in0, in1, out, seed, res, err, errlen);
    break;
  }
  free(c.ktab);
  return rc;
}

int cg_check_bias(const cg_geom *geom, const void *diff_dst,
                  const void *diff_bias, cg_check_result *res, char *err,
                  size_t errlen) {
  ck_ctx c;
  int rc = ctx_init(&c, geom, 1, err, errlen);
  result_init(res);
  if (rc)
    return rc;
  if (!diff_dst || !diff_bias)
    return cg_errorf(err, errlen, CG_EINVAL, "check: NULL buffer");
  int64_t st[CG_MAX_RANK], P = 1, C = geom->oc;
  cg_geom_data_strides(geom, geom->data_format, C, geom->out_sp, st);
  for (int a = 0; a < geom->nsp; a++)
    P *= geom->out_sp[a];
  int64_t st5[5] = {st[0], st[1], 0, 0, 0};
  float *fb = alloc3(2, (size_t)C, (size_t)P, sizeof *fb);
  double *sum = alloc3(2, 1, (size_t)C, sizeof *sum);
  if (!fb || !sum) {
    rc = no_memory(err, errlen);
    goto out;
  }
  double *abs_sum = sum + C;
  for (int64_t n = 0; n < geom->mb; n++) {
    const float *s = stage_sample(&c, diff_dst, st5, C, P, n, fb, fb + C * P);
    for (int64_t x = 0; x < P; x++)
      for (int64_t ch = 0; ch < C; ch++) {
        sum[ch] += s[x * C + ch];
        abs_sum[ch] += fabs((double)s[x * C + ch]);
      }
  }
  for (int64_t ch = 0; ch < C; ch++) {
    float b = cg_load_f32(c.dt, diff_bias, (size_t)ch);
    double h = half_ulp(b, c.u_out);
    compare(&c, b, sum[ch], abs_sum[ch], h, h * h, 1, (double)(geom->mb * P),
            ch, 0, 0, res);
  }
out:
  free(sum);
  free(fb);
  return rc;
}

int cg_check_output(const cg_layer *l, cg_grad g, const void *const in[3],
                    const void *out, uint64_t seed, int threads,
                    cg_check_result *res, char *err, size_t errlen) {
  if (g == CG_GRAD_DIFF_SRC)
    return cg_check_run(&l->data, in[l->data_in[0]], in[l->data_in[1]], out,
                        seed, threads, res, err, errlen);
  if (g == CG_GRAD_DIFF_WEIGHTS)
    return cg_check_run(&l->weights, in[l->weights_in[0]], in[l->weights_in[1]],
                        out, seed, threads, res, err, errlen);
  return cg_check_bias(&l->weights, in[l->weights_in[1]], out, res, err,
                       errlen);
}
