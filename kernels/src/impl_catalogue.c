/* impl_catalogue.c - the oneDNN 2.6 implementations cg_engine avoids, and
 * on which problems (impl_catalogue.h): kernels that compute wrong results
 * or crash, that overflow their 32-bit offsets, or whose code or copies
 * grow with the tensors' extents. Each rule names the sweep case or
 * oneDNN source that found it. */
#include <string.h>

#include "impl_catalogue.h"

/* 1 when some position on the strided side of the forward relation (the
 * Convolution output, the ConvTranspose input) has no kernel tap inside
 * the other tensor on some axis. */
static int has_dead_positions(const cg_geom *g) {
  int ct = cg__op_is_deconv(g->op);
  for (int a = 0; a < g->nsp; a++) {
    int64_t lo = ct ? g->in_sp[a] : g->out_sp[a];
    int64_t hi = ct ? g->out_sp[a] : g->in_sp[a];
    for (int64_t p = 0; p < lo; p++) {
      int64_t first = p * g->stride[a] - g->pad_begin[a];
      int64_t k0 =
          first >= 0 ? 0 : (-first + g->dilation[a] - 1) / g->dilation[a];
      int64_t q = first + k0 * g->dilation[a];
      if (k0 >= g->kernel[a] || q >= hi)
        return 1;
    }
  }
  return 0;
}

/* 1 when the stride exceeds the effective kernel on some axis, so that
 * some positions of the dense side are never touched. */
static int has_gaps(const cg_geom *g) {
  for (int a = 0; a < g->nsp; a++)
    if (g->stride[a] > (g->kernel[a] - 1) * g->dilation[a] + 1)
      return 1;
  return 0;
}

static int is_dilated(const cg_geom *g) {
  for (int a = 0; a < g->nsp; a++)
    if (g->dilation[a] > 1)
      return 1;
  return 0;
}

/* ---- kernels kept inside their 32-bit arithmetic ---------------------- */

#define INT32_ROOM ((int64_t)1 << 31)

static int64_t mul_sat(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

static int64_t round_up(int64_t v, int64_t to) {
  return (v + to - 1) / to * to;
}

/* How far oneDNN 2.6's JIT kernels may step along spatial axis a, in
 * elements, from anywhere in either data tensor: both extents, the pads,
 * the kernel's effective extent and a stride; along the innermost axis,
 * which the kernels unroll, a stride per unrolled output column too (the
 * AVX512 kernels step the input by ur_w * stride_w, ur_w up to 32 and up
 * to the output's width). */
static int64_t axis_reach(const cg_geom *g, int a) {
  /* The strided side: the Convolution output, the ConvTranspose input. */
  int64_t small = cg__op_is_deconv(g->op) ? g->in_sp[a] : g->out_sp[a];
  int64_t r = g->in_sp[a] + g->out_sp[a] + g->pad_begin[a] + g->pad_end[a] +
              (g->kernel[a] - 1) * g->dilation[a] + 1;
  return r + mul_sat(g->stride[a], 1 + (a == g->nsp - 1 ? small : 0));
}

/* The larger extent of the two data tensors along axis a, padded: what a
 * row, plane or volume of the kernels' buffers holds. */
static int64_t axis_extent(const cg_geom *g, int a) {
  int64_t big = g->in_sp[a] > g->out_sp[a] ? g->in_sp[a] : g->out_sp[a];
  return big + g->pad_begin[a] + g->pad_end[a];
}

/* Bytes of one sample of the data tensors as the JIT kernels may address
 * it: an offset along an axis is the axis's reach times the padded
 * extents of the axes inside it times the channels of a position (every
 * channel of the larger side in 32-channel blocks, the largest block of
 * the f32 and bf16 kernels: AVX512 16, AMX bf16 16 x 2) times 4 bytes
 * (accumulators are f32); a pointer sums one such offset per axis. */
int64_t cg__sample_reach_bytes(const cg_geom *g) {
  int64_t c = g->ic > g->oc ? g->ic : g->oc, sum = 0;
  int64_t position = mul_sat(4, round_up(c, 32));
  for (int a = 0; a < g->nsp; a++) {
    int64_t v = mul_sat(position, axis_reach(g, a));
    for (int b = a + 1; b < g->nsp; b++)
      v = mul_sat(v, axis_extent(g, b));
    sum = v > INT64_MAX - sum ? INT64_MAX : sum + v;
  }
  return sum;
}

/* Elements of the AMX and AVX512-BF16 backward-weights kernels'
 * transposition buffers and weights reduction, which init_conf and
 * init_scratchpad count in int: nthr_mb * nb_ic * ngroups * tr_iw *
 * ic_block * ih * id * nb_ic_blocking for the source, with tr_iw =
 * rnd_up(div_up(iw, stride_w) + rnd_up(max(l_pad, r_pad + 1), 32), 32) *
 * stride_w (the AMX rounding; AVX512-BF16 rounds to 2), the same with
 * rnd_up(ow, 2) * oh * od for diff_dst, and groups * OCg * ICg * kernel
 * in 16-channel blocks for the weights. nthr_mb is at most the team's
 * threads and nb_ic_blocking 2. An 8 MB request (src 1x1x2048x2048x1
 * bf16) wrapped the source's count to a tiny scratchpad, and the kernel
 * wrote past it. Returns the largest of the three. */
static int64_t bwd_weights_buffers(const cg_geom *g, int threads) {
  int a = g->nsp - 1;
  /* The convolution's src and diff_dst: a ConvTranspose's are swapped. */
  const int64_t *src = cg__op_is_deconv(g->op) ? g->out_sp : g->in_sp;
  const int64_t *dst = cg__op_is_deconv(g->op) ? g->in_sp : g->out_sp;
  int64_t ic = cg__op_is_deconv(g->op) ? g->oc : g->ic;
  int64_t oc = cg__op_is_deconv(g->op) ? g->ic : g->oc;
  int64_t s = g->stride[a];
  int64_t big_pad =
      g->pad_begin[a] > g->pad_end[a] + 1 ? g->pad_begin[a] : g->pad_end[a] + 1;
  int64_t tr_iw =
      mul_sat(round_up((src[a] + s - 1) / s + round_up(big_pad, 32), 32), s);
  int64_t tr_src = mul_sat(mul_sat(2 * (int64_t)threads, tr_iw),
                           g->groups * round_up(ic / g->groups, 16));
  int64_t tr_dst = mul_sat(mul_sat(2 * (int64_t)threads, round_up(dst[a], 2)),
                           g->groups * round_up(oc / g->groups, 16));
  int64_t wei = mul_sat(g->groups, mul_sat(round_up(oc / g->groups, 16),
                                           round_up(ic / g->groups, 16)));
  for (int b = 0; b < a; b++) {
    tr_src = mul_sat(tr_src, src[b]);
    tr_dst = mul_sat(tr_dst, dst[b]);
  }
  for (int b = 0; b <= a; b++)
    wei = mul_sat(wei, g->kernel[b]);
  int64_t most = tr_src > tr_dst ? tr_src : tr_dst;
  return most > wei ? most : wei;
}

/* Bytes of one group's weights, channels padded to 32 (the kernels reach
 * a group through 64-bit memory-descriptor offsets). */
static int64_t group_weights_bytes(const cg_geom *g) {
  int64_t v = mul_sat(4, mul_sat(round_up(g->oc / g->groups, 32),
                                 round_up(g->ic / g->groups, 32)));
  for (int a = 0; a < g->nsp; a++)
    v = mul_sat(v, g->kernel[a]);
  return v;
}

/* oneDNN 2.6's JIT convolution kernels (names "jit..." and "brg...") keep
 * their configuration in int (jit_conv_conf_t) and form their offsets
 * within a sample and a group as int products of those fields with block
 * and unroll sizes: input shifts of typesize * ur_w * stride_w * channels,
 * row steps of (dilate_h + 1) * iw * ic_block * typesize, pad corrections
 * of l_pad * ic_block * typesize (jit_avx512_common_conv_kernel.cpp,
 * jit_avx512_core_bf16_conv_kernel.cpp, jit_avx2_conv_kernel_f32.cpp,
 * jit_avx512_core_amx_conv_kernel.cpp). A problem whose sample, at the
 * kernels' reach, and whose padded weights of a group fit in 2^31 bytes
 * keeps every such product in range, and so does one whose
 * backward-weights buffers fit in 2^31 elements. A larger Convolution
 * runs on oneDNN's gemm-based implementation (gemm_convolution_utils.cpp
 * keeps every size in dim_t); a ConvTranspose, whose oneDNN primitive
 * wraps the first convolution kernel that takes it, is refused as
 * unsupported. */
static int jit_usable(const char *impl, const cg_geom *g, int threads) {
  if (strncmp(impl, "jit", 3) != 0 && strncmp(impl, "brg", 3) != 0)
    return 1;
  if (cg__sample_reach_bytes(g) >= INT32_ROOM ||
      group_weights_bytes(g) >= INT32_ROOM)
    return 0;
  if (!cg__op_is_bwd_data(g->op) &&
      (strstr(impl, "amx") || strstr(impl, "bf16")) &&
      bwd_weights_buffers(g, threads) >= INT32_ROOM)
    return 0;
  return 1;
}

/* The AMX backward-data kernel (jit_avx512_core_amx_bwd_data_kernel_t)
 * works on a copy of diff_dst dilated by the strides: for every block of
 * up to 10 rows x 32 columns of diff_src, its copy kernel writes a window
 * of (10 + reach_h - 1) x (32 + reach_w - 1) positions of 32 channels
 * (64 bytes) for each block of 32 output channels and each kd, zeros
 * included, where reach = (K - 1) * D + 1; and the code of that copy
 * kernel holds one zeroing store per skipped stride phase, (stride_w - 1)
 * + (stride_h - 1) * (32 + reach_w - 1) of them, generated at primitive
 * creation. Neither grows with the tensors: a 1x1 diff_src with strides of
 * 2^20 took 0.26 s to create, a 2x2 kernel dilated by 4096 spent 3 s
 * copying a 1 GB window. The kernel runs where both stay within a small
 * multiple of the tensors; the next implementation takes the rest. */
static int amx_bwd_data_usable(const cg_geom *g) {
  int nsp = g->nsp;
  int64_t iw = g->in_sp[nsp - 1], ih = nsp > 1 ? g->in_sp[nsp - 2] : 1;
  int64_t id = nsp > 2 ? g->in_sp[0] : 1, kd = nsp > 2 ? g->kernel[0] : 1;
  int64_t reach_w = (g->kernel[nsp - 1] - 1) * g->dilation[nsp - 1] + 1;
  int64_t reach_h =
      nsp > 1 ? (g->kernel[nsp - 2] - 1) * g->dilation[nsp - 2] + 1 : 1;
  int64_t sw = g->stride[nsp - 1], sh = nsp > 1 ? g->stride[nsp - 2] : 1;
  /* Blocks of up to 10 rows and 2 tiles of up to 16 columns. */
  int64_t rows = ih < 10 ? ih : 10, cols = iw < 16 ? iw : 16;
  int64_t window = mul_sat((rows + reach_h - 1) * 64, 2 * cols + reach_w - 1);
  int64_t blocks = mul_sat(mul_sat(g->mb * id, (ih + rows - 1) / rows),
                           (iw + cols - 1) / cols);
  int64_t oc_blocks = g->groups * ((g->oc / g->groups + 31) / 32);
  int64_t copied = mul_sat(mul_sat(window, kd), mul_sat(blocks, oc_blocks));
  int64_t tensors = (int64_t)(g->in_bytes[0] + g->out_bytes);
  int64_t stores = (sw - 1) + mul_sat(sh - 1, 32 + reach_w - 1);
  return stores <= 65536 && copied <= mul_sat(64, tensors) + (16 << 20);
}

/* The AMX backward-weights kernel (jit_avx512_core_amx_bwd_weights_kernel_t,
 * compute_ic_loop) unrolls its code over every kernel column times every
 * block of ur_w output columns: kw * tr_ow / ur_w groups of tile loads and
 * products, where tr_ow is ow rounded up to even and ur_w is tr_ow when it
 * is at most 32, else its largest even divisor up to 32 (down to 2).
 * Both factors are tensor extents, so their product is not: a 1x4096
 * kernel over 4096 output columns (16 KB of bf16) took 2.5 s to generate.
 * The kernel runs where the code stays within 512 groups (a 1x4096
 * kernel over one column still took 60 ms). */
static int amx_bwd_weights_usable(const cg_geom *g) {
  int a = g->nsp - 1;
  /* The convolution's output: a ConvTranspose's input. */
  int64_t ow = cg__op_is_deconv(g->op) ? g->in_sp[a] : g->out_sp[a];
  int64_t tr_ow = round_up(ow, 2), ur_w = tr_ow;
  if (tr_ow > 32)
    for (ur_w = 32; tr_ow % ur_w != 0; ur_w -= 2)
      ;
  return mul_sat(g->kernel[a], tr_ow / ur_w) <= 512;
}

/* oneDNN 2.6 implementations that compute wrong results or crash on some
 * problems, found by the engine sweep; oneDNN then offers the next one.
 * - brgemm kernels crash where a position sees only padding (3D
 *   ConvTranspose bwd_data in bf16 with stride > kernel and end padding;
 *   sweep seed 6, case 2454), return garbage on 3D problems whose stride
 *   exceeds the kernel (sweep seed 9, case 982), and on any rank read
 *   past their input where a stride exceeds the kernel's reach: their
 *   output-row blocking steps the input by stride_w * channels per output
 *   point (LDA in jit_brgemm_conv_utils.cpp) whatever the input's width
 *   (a 2-D ConvTranspose bwd_data in bf16 with 26 channels and a
 *   stride_w of 1024 over a 1-wide axis crashed on AMX, and took 8 ms
 *   for 6 kflop at 64: engine_limits);
 * - the AMX backward-weights kernel returns garbage for dilated problems
 *   whose input channels exceed 32 with a tail (e.g. 33 or 40; wide sweep,
 *   case 87), for grouped, padded 3D problems with stride > kernel at
 *   some thread counts (sweep seed 23 case 1861 with 3 threads), and for
 *   3D problems strided in depth and padded at both ends of it at one
 *   thread (a ConvTranspose with input depth 2, kernel 2, stride 2, pads
 *   1 and 1 read uninitialised memory: engine_limits case 921). */
int cg__impl_usable(const char *impl, const cg_geom *g, int threads) {
  if (!jit_usable(impl, g, threads))
    return 0;
  if (strncmp(impl, "jit:", 4) == 0 && strstr(impl, "amx") &&
      (g->op == CG_OP_CONV_BWD_DATA ? !amx_bwd_data_usable(g)
       : !cg__op_is_bwd_data(g->op) ? !amx_bwd_weights_usable(g)
                                    : 0))
    return 0;
  if (strncmp(impl, "brg", 3) == 0 && (has_dead_positions(g) || has_gaps(g)))
    return 0;
  if (strstr(impl, "amx") && !cg__op_is_bwd_data(g->op) &&
      (is_dilated(g) || (g->nsp == 3 && (has_gaps(g) || g->stride[0] > 1))))
    return 0;
  return 1;
}
