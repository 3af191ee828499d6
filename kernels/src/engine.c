/* engine.c - cg_engine: runs resolved problems on oneDNN 2.6's C API
 * (cg/engine.h).
 *
 * Owns, per engine: the oneDNN CPU engine and stream, a bounded LRU of
 * prepared problems (engine_cache.h) and the buffers every run borrows:
 * one per tensor in oneDNN's preferred layout plus one user-managed
 * scratchpad (bf16 kernels own theirs, see needs_private_scratch). A
 * prepared problem holds the gradient primitive, created on
 * format_tag_any so oneDNN picks its fast blocked layouts, and the reorders
 * between those layouts and the caller's, present only where the two
 * differ. Primitives use a user-managed scratchpad so that primitives that
 * oneDNN's own cache shares between engines can run on several threads at
 * once.
 *
 * Mapping onto oneDNN: oneDNN dilation is D-1. Both families use weights
 * (g, o, i, k...) with o/i the forward op's output/input channels per group,
 * which is exactly the order of cg_geom_weights_strides(). A ConvTranspose
 * output_padding lengthens the output at the end, so oneDNN's right padding
 * is PE - output_padding; oneDNN requires it to be > -S, and where it is not,
 * the unread tail of diff_dst is simply cut off (the user memory descriptor
 * keeps the full strides); where nothing is left, the gradient is zero.
 * A few oneDNN 2.6 kernels are skipped on problems they get wrong (see
 * impl_catalogue.h).
 *
 * The f32-convert path (a dtype without a native kernel) stages every
 * tensor as f32 in the caller's layout: the dtype conversion is a plain
 * parallel pass (cg_convert) and the reorders to and from oneDNN's blocked
 * layouts stay f32 to f32. oneDNN 2.6 reorders that convert and re-layout
 * at once fall to its generic kernel: bf16 NXC to blocked f32 took 185 ms
 * and blocked f32 to bf16 NXC 490 ms for 1.6M and 6.4M elements on AVX2,
 * against 11.5 ms for the whole f32 convolution. */
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include "cg/dtype.h"
#include "cg/engine.h"
#include "cg/limits.h"
#include "engine_cache.h"
#include "impl_catalogue.h"
#include "now.h"

#define CG__DEFAULT_CAPACITY 64
#define CG__ALIGN 64

/* Tensor slots in op input order: in0, in1, out. */
enum { SLOT_IN0 = 0, SLOT_IN1 = 1, SLOT_OUT = 2, NSLOTS = 3 };

typedef struct eng_buf {
  void *p;
  size_t size;
} eng_buf;

typedef struct eng_entry {
  cg__cache_entry base; /* first: the cache hands back this pointer */
  cg_compute_path path;
  const char *impl;
  int zero_output; /* no primitives: every product falls in padding */
  uint64_t runs;   /* runs so far */
  dnnl_primitive_t op;
  dnnl_primitive_t reorder[NSLOTS]; /* NULL: layouts already match */
  dnnl_memory_t user_mem[NSLOTS];
  dnnl_memory_t prim_mem[NSLOTS]; /* NULL where there is no reorder */
  /* Scratchpad memory of the op ([0]) and of reorder i ([1 + i]). */
  dnnl_memory_t scratch_mem[1 + NSLOTS];
  size_t prim_bytes[NSLOTS];
  size_t scratch_bytes; /* largest scratchpad of the op and the reorders */
  /* The op's own zero-initialised scratchpad, for bf16 kernels only (see
   * needs_private_scratch); NULL means the op uses the engine's. */
  eng_buf own_scratch;
  int arg[NSLOTS];
  /* Handles last set on the memories, so unchanged ones are not reset. */
  const void *user_ptr[NSLOTS];
  const void *prim_ptr[NSLOTS];
  const void *scratch_ptr[1 + NSLOTS];
} eng_entry;

struct cg_engine {
  dnnl_engine_t eng;
  dnnl_stream_t stream;
  dnnl_primitive_attr_t attr; /* user-managed scratchpad */
  int threads;
  cg__cache cache;
  eng_buf buf[NSLOTS];
  eng_buf stage[NSLOTS]; /* f32 copies of the tensors, f32-convert path */
  eng_buf scratch;
  /* During cg_engine_run_other: the implementation pick_impl skips. */
  const char *avoid;
};

/* ---- errors ----------------------------------------------------------- */

static int dnnl_err(char *err, size_t errlen, dnnl_status_t st,
                    const char *what) {
  int code = st == dnnl_unimplemented   ? CG_EUNSUPPORTED
             : st == dnnl_out_of_memory ? CG_ENOMEM
                                        : CG_EBACKEND;
  return cg_errorf(err, errlen, code, "oneDNN %s: %s", what,
                   dnnl_status2str(st));
}

/* A failure while oneDNN builds the primitives of a request's geometry,
 * which cg_problem_resolve and the service limits accepted: what the
 * backend cannot take is the geometry, not the server. unimplemented is
 * CG_EUNSUPPORTED and runtime_error CG_EINVAL, each naming the backend;
 * invalid_arguments stays CG_EBACKEND (a descriptor the engine should not
 * have built). */
static int make_err(char *err, size_t errlen, dnnl_status_t st,
                    const char *what) {
  if (st == dnnl_unimplemented || st == dnnl_runtime_error)
    return cg_errorf(err, errlen,
                     st == dnnl_unimplemented ? CG_EUNSUPPORTED : CG_EINVAL,
                     "attrs: oneDNN %s on %s %s this geometry (%s: %s)",
                     cg_backend_version(), cg_backend_isa(),
                     st == dnnl_unimplemented ? "has no kernel for"
                                              : "cannot build a kernel for",
                     what, dnnl_status2str(st));
  return dnnl_err(err, errlen, st, what);
}

/* Every dnnl_* call goes through this: on failure set rc and unwind. */
#define DNNL_TRY(call, what, label)                                            \
  do {                                                                         \
    dnnl_status_t st_ = (call);                                                \
    if (st_ != dnnl_success) {                                                 \
      rc = dnnl_err(err, errlen, st_, (what));                                 \
      goto label;                                                              \
    }                                                                          \
  } while (0)

/* The same for the calls that create primitive descriptors and
 * primitives. */
#define DNNL_MAKE(call, what, label)                                           \
  do {                                                                         \
    dnnl_status_t st_ = (call);                                                \
    if (st_ != dnnl_success) {                                                 \
      rc = make_err(err, errlen, st_, (what));                                 \
      goto label;                                                              \
    }                                                                          \
  } while (0)

/* ---- static backend facts --------------------------------------------- */

/* Implementation names are interned so cg_run_info.impl stays valid after
 * the entry that produced it is evicted. */
#define IMPL_SLOTS 64
static pthread_mutex_t impl_lock = PTHREAD_MUTEX_INITIALIZER;
static char impl_names[IMPL_SLOTS][64];
static int impl_count;

static const char *impl_intern(const char *s) {
  const char *r = "other";
  pthread_mutex_lock(&impl_lock);
  for (int i = 0; i < impl_count; i++)
    if (strcmp(impl_names[i], s) == 0) {
      r = impl_names[i];
      goto out;
    }
  if (impl_count < IMPL_SLOTS && strlen(s) < sizeof impl_names[0]) {
    memcpy(impl_names[impl_count], s, strlen(s) + 1);
    r = impl_names[impl_count++];
  }
out:
  pthread_mutex_unlock(&impl_lock);
  return r;
}

static int impl_is_reference(const char *impl) {
  return strncmp(impl, "ref", 3) == 0;
}

static dnnl_data_type_t dnnl_dt(cg_dtype dt) {
  switch (dt) {
  case CG_DTYPE_BF16:
    return dnnl_bf16;
  case CG_DTYPE_F16:
    return dnnl_f16;
  default:
    return dnnl_f32;
  }
}

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static int probe_native[4]; /* indexed by cg_dtype */
static char version_str[32];

/* A dtype is native when oneDNN has a non-reference convolution backward
 * data kernel for it; probed once on a small 3x3 layer. */
static int probe_dtype(dnnl_engine_t eng, dnnl_data_type_t dt) {
  dnnl_memory_desc_t s, w, d;
  dnnl_dims_t sd = {2, 16, 8, 8}, wd = {16, 16, 3, 3};
  dnnl_dims_t st = {1, 1}, dil = {0, 0}, pad = {1, 1};
  dnnl_convolution_desc_t fd, bd;
  dnnl_primitive_desc_t fpd = NULL, bpd = NULL;
  const char *impl = "ref";
  int native = 0;

  if (dnnl_memory_desc_init_by_tag(&s, 4, sd, dt, dnnl_format_tag_any) ||
      dnnl_memory_desc_init_by_tag(&w, 4, wd, dt, dnnl_format_tag_any) ||
      dnnl_memory_desc_init_by_tag(&d, 4, sd, dt, dnnl_format_tag_any))
    goto out;
  if (dnnl_dilated_convolution_forward_desc_init(
          &fd, dnnl_forward_training, dnnl_convolution_direct, &s, &w, NULL, &d,
          st, dil, pad, pad) ||
      dnnl_primitive_desc_create(&fpd, &fd, NULL, eng, NULL))
    goto out;
  if (dnnl_dilated_convolution_backward_data_desc_init(
          &bd, dnnl_convolution_direct, &s, &w, &d, st, dil, pad, pad) ||
      dnnl_primitive_desc_create(&bpd, &bd, NULL, eng, fpd))
    goto out;
  if (dnnl_primitive_desc_query(bpd, dnnl_query_impl_info_str, 0, &impl))
    goto out;
  native = !impl_is_reference(impl);
out:
  dnnl_primitive_desc_destroy(bpd);
  dnnl_primitive_desc_destroy(fpd);
  return native;
}

static void probe_backend(void) {
  const dnnl_version_t *v = dnnl_version();
  snprintf(version_str, sizeof version_str, "%d.%d.%d", v->major, v->minor,
           v->patch);
  dnnl_engine_t eng = NULL;
  probe_native[CG_DTYPE_F32] = 1;
  if (dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success)
    return;
  probe_native[CG_DTYPE_BF16] = probe_dtype(eng, dnnl_bf16);
  probe_native[CG_DTYPE_F16] = probe_dtype(eng, dnnl_f16);
  dnnl_engine_destroy(eng);
}

int cg_backend_dtype_native(cg_dtype dt) {
  pthread_once(&probe_once, probe_backend);
  return dt >= CG_DTYPE_F32 && dt <= CG_DTYPE_F16 ? probe_native[dt] : 0;
}

const char *cg_backend_version(void) {
  pthread_once(&probe_once, probe_backend);
  return version_str;
}

const char *cg_backend_isa(void) {
  const char *s = dnnl_cpu_isa2str(dnnl_get_effective_cpu_isa());
  if (strncmp(s, "cpu_isa_", 8) == 0)
    s += 8;
  return s;
}

/* ---- buffers ---------------------------------------------------------- */

/* Grows b to at least n bytes (64-byte aligned, contents not kept). */
static int buf_reserve(eng_buf *b, size_t n, char *err, size_t errlen) {
  int rc = 0;
  if (n <= b->size)
    goto out;
  if (n > SIZE_MAX - CG__ALIGN) {
    rc = cg_errorf(err, errlen, CG_ERANGE,
                   "engine: buffer of %zu bytes overflows", n);
    goto out;
  }
  size_t rounded = (n + CG__ALIGN - 1) / CG__ALIGN * CG__ALIGN;
  free(b->p);
  b->size = 0;
  b->p = aligned_alloc(CG__ALIGN, rounded);
  if (!b->p) {
    rc = cg_errorf(err, errlen, CG_ENOMEM, "engine: cannot allocate %zu bytes",
                   rounded);
    goto out;
  }
  b->size = rounded;
out:
  return rc;
}

/* ---- problem -> oneDNN descriptors ------------------------------------ */

/* Everything oneDNN needs to know about a problem's shapes. */
typedef struct eng_shape {
  int nd;  /* data ndims */
  int wnd; /* weights ndims (one more with groups) */
  dnnl_dims_t src, wei, dst;
  dnnl_dims_t strides, dilates, pad_l, pad_r;
} eng_shape;

/* Returns 1 when the problem has no product at all: a ConvTranspose whose
 * output lies entirely beyond every kernel tap on some axis. */
static int shape_init(eng_shape *s, const cg_geom *g) {
  int empty = 0;
  int grouped = g->groups > 1;
  memset(s, 0, sizeof *s);
  s->nd = 2 + g->nsp;
  s->wnd = s->nd + grouped;
  s->src[0] = s->dst[0] = g->mb;
  s->src[1] = g->ic;
  s->dst[1] = g->oc;
  if (grouped)
    s->wei[0] = g->groups;
  s->wei[grouped] = g->oc / g->groups;
  s->wei[grouped + 1] = g->ic / g->groups;
  for (int a = 0; a < g->nsp; a++) {
    s->src[2 + a] = g->in_sp[a];
    s->dst[2 + a] = g->out_sp[a];
    s->wei[grouped + 2 + a] = g->kernel[a];
    s->strides[a] = g->stride[a];
    s->dilates[a] = g->dilation[a] - 1;
    s->pad_l[a] = g->pad_begin[a];
    s->pad_r[a] = g->pad_end[a];
    if (cg__op_is_deconv(g->op)) {
      int64_t pr = g->pad_end[a] - g->output_padding[a];
      int64_t cut = pr < 1 - g->stride[a] ? (1 - g->stride[a]) - pr : 0;
      s->pad_r[a] = pr + cut;
      s->dst[2 + a] = g->out_sp[a] - cut;
      empty |= s->dst[2 + a] < 1;
    }
  }
  return empty;
}

/* The caller's memory descriptor for slot i (dims as oneDNN sees them,
 * strides from the caller's layout). */
static dnnl_status_t user_md(dnnl_memory_desc_t *md, const cg_geom *g,
                             const eng_shape *s, int slot,
                             dnnl_data_type_t dt) {
  int64_t st[CG_MAX_RANK + 1];
  dnnl_dims_t strides;
  const int64_t *dims;
  int nd;
  int weights = (slot == SLOT_IN1 && cg__op_is_bwd_data(g->op)) ||
                (slot == SLOT_OUT && !cg__op_is_bwd_data(g->op));

  if (weights) {
    cg_weights_format f =
        slot == SLOT_OUT ? g->out_weights_format : g->weights_format;
    cg_geom_weights_strides(g, f, st);
    nd = s->wnd;
    dims = s->wei;
    /* Without groups oneDNN's weights have no g axis: drop it. */
    for (int a = 0; a < nd; a++)
      strides[a] = st[a + (g->groups > 1 ? 0 : 1)];
  } else {
    /* Data slots: bwd_data in0 = diff_dst, out = diff_src; bwd_weights
     * in0 = src, in1 = diff_dst. */
    int is_src =
        slot == SLOT_OUT || (slot == SLOT_IN0 && !cg__op_is_bwd_data(g->op));
    cg_data_format f = slot == SLOT_OUT ? g->out_data_format : g->data_format;
    cg_geom_data_strides(g, f, is_src ? g->ic : g->oc,
                         is_src ? g->in_sp : g->out_sp, st);
    nd = s->nd;
    dims = is_src ? s->src : s->dst;
    for (int a = 0; a < nd; a++)
      strides[a] = st[a];
  }
  return dnnl_memory_desc_init_by_strides(md, nd, dims, dt, strides);
}

/* Creates the primitive descriptor of op_desc: the first implementation
 * oneDNN offers that cg__impl_usable accepts. */
static int pick_impl(cg_engine *e, const cg_geom *g, const void *op_desc,
                     const_dnnl_primitive_desc_t hint,
                     dnnl_primitive_desc_t *pd_out, char *err, size_t errlen) {
  int rc = 0;
  dnnl_primitive_desc_iterator_t it = NULL;
  dnnl_primitive_desc_t pd = NULL;
  const char *impl;

  DNNL_MAKE(
      dnnl_primitive_desc_iterator_create(&it, op_desc, e->attr, e->eng, hint),
      "backward primitive descriptor", out);
  for (;;) {
    pd = dnnl_primitive_desc_iterator_fetch(it);
    if (!pd) {
      rc = cg_errorf(err, errlen, CG_EBACKEND,
                     "oneDNN: cannot fetch a primitive descriptor");
      goto out;
    }
    DNNL_TRY(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl),
             "implementation query", out);
    if (cg__impl_usable(impl, g, e->threads) &&
        !(e->avoid && strcmp(impl, e->avoid) == 0))
      break;
    dnnl_primitive_desc_destroy(pd);
    pd = NULL;
    dnnl_status_t st = dnnl_primitive_desc_iterator_next(it);
    if (st == dnnl_iterator_ends) {
      rc = cg_errorf(err, errlen, CG_EUNSUPPORTED,
                     "attrs: oneDNN %s on %s has no kernel that takes this "
                     "geometry within its 32-bit offsets (one sample spans "
                     "%lld bytes at the kernels' reach)",
                     cg_backend_version(), cg_backend_isa(),
                     (long long)cg__sample_reach_bytes(g));
      goto out;
    }
    DNNL_MAKE(st, "implementation iterator", out);
  }
  *pd_out = pd;
  pd = NULL;
out:
  dnnl_primitive_desc_destroy(pd);
  dnnl_primitive_desc_iterator_destroy(it);
  return rc;
}

/* Creates the gradient op's primitive descriptor in compute type cdt on
 * format_tag_any, with the forward hint oneDNN requires. */
static int op_pd_create(cg_engine *e, const cg_geom *g, const eng_shape *s,
                        dnnl_data_type_t cdt, dnnl_primitive_desc_t *pd_out,
                        char *err, size_t errlen) {
  int rc = 0;
  dnnl_memory_desc_t src, wei, dst;
  dnnl_primitive_desc_t hint = NULL;
  *pd_out = NULL;

  DNNL_TRY(dnnl_memory_desc_init_by_tag(&src, s->nd, s->src, cdt,
                                        dnnl_format_tag_any),
           "src memory descriptor", out);
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&wei, s->wnd, s->wei, cdt,
                                        dnnl_format_tag_any),
           "weights memory descriptor", out);
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&dst, s->nd, s->dst, cdt,
                                        dnnl_format_tag_any),
           "dst memory descriptor", out);

  if (!cg__op_is_deconv(g->op)) {
    dnnl_convolution_desc_t fd, bd;
    DNNL_TRY(dnnl_dilated_convolution_forward_desc_init(
                 &fd, dnnl_forward_training, dnnl_convolution_direct, &src,
                 &wei, NULL, &dst, s->strides, s->dilates, s->pad_l, s->pad_r),
             "convolution forward descriptor", out);
    DNNL_MAKE(dnnl_primitive_desc_create(&hint, &fd, NULL, e->eng, NULL),
              "convolution forward hint", out);
    if (cg__op_is_bwd_data(g->op))
      DNNL_TRY(dnnl_dilated_convolution_backward_data_desc_init(
                   &bd, dnnl_convolution_direct, &src, &wei, &dst, s->strides,
                   s->dilates, s->pad_l, s->pad_r),
               "convolution backward data descriptor", out);
    else
      DNNL_TRY(dnnl_dilated_convolution_backward_weights_desc_init(
                   &bd, dnnl_convolution_direct, &src, &wei, NULL, &dst,
                   s->strides, s->dilates, s->pad_l, s->pad_r),
               "convolution backward weights descriptor", out);
    rc = pick_impl(e, g, &bd, hint, pd_out, err, errlen);
  } else {
    dnnl_deconvolution_desc_t fd, bd;
    DNNL_TRY(dnnl_dilated_deconvolution_forward_desc_init(
                 &fd, dnnl_forward_training, dnnl_deconvolution_direct, &src,
                 &wei, NULL, &dst, s->strides, s->dilates, s->pad_l, s->pad_r),
             "deconvolution forward descriptor", out);
    DNNL_MAKE(dnnl_primitive_desc_create(&hint, &fd, NULL, e->eng, NULL),
              "deconvolution forward hint", out);
    if (cg__op_is_bwd_data(g->op))
      DNNL_TRY(dnnl_dilated_deconvolution_backward_data_desc_init(
                   &bd, dnnl_deconvolution_direct, &src, &wei, &dst, s->strides,
                   s->dilates, s->pad_l, s->pad_r),
               "deconvolution backward data descriptor", out);
    else
      DNNL_TRY(dnnl_dilated_deconvolution_backward_weights_desc_init(
                   &bd, dnnl_deconvolution_direct, &src, &wei, NULL, &dst,
                   s->strides, s->dilates, s->pad_l, s->pad_r),
               "deconvolution backward weights descriptor", out);
    rc = pick_impl(e, g, &bd, hint, pd_out, err, errlen);
  }
out:
  dnnl_primitive_desc_destroy(hint);
  return rc;
}

/* ---- cache entries ---------------------------------------------------- */

static void entry_destroy(cg__cache_entry *ce) {
  eng_entry *en = (eng_entry *)ce;
  if (!en)
    return;
  dnnl_primitive_destroy(en->op);
  for (int i = 0; i < NSLOTS; i++) {
    dnnl_primitive_destroy(en->reorder[i]);
    dnnl_memory_destroy(en->user_mem[i]);
    dnnl_memory_destroy(en->prim_mem[i]);
  }
  for (int i = 0; i < 1 + NSLOTS; i++)
    dnnl_memory_destroy(en->scratch_mem[i]);
  free(en->own_scratch.p);
  free(en);
}

/* Creates a scratchpad memory for pd when it needs one and returns its
 * size in *bytes (0: none). */
static int scratch_create(cg_engine *e, eng_entry *en,
                          const_dnnl_primitive_desc_t pd, int idx,
                          size_t *bytes, char *err, size_t errlen) {
  int rc = 0;
  const dnnl_memory_desc_t *md =
      dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  *bytes = md ? dnnl_memory_desc_get_size(md) : 0;
  if (*bytes == 0)
    goto out;
  DNNL_TRY(
      dnnl_memory_create(&en->scratch_mem[idx], md, e->eng, DNNL_MEMORY_NONE),
      "scratchpad memory", out);
out:
  return rc;
}

/* oneDNN 2.6's bf16 convolution kernels (AMX and AVX512-BF16) read
 * scratchpad bytes that they never write and expect them to be zero: with
 * a scratchpad shared with other primitives, backward weights in bf16
 * returned garbage (engine sweep seed 2 case 965, wide sweep seed 22 case
 * 69 with one thread). Each such primitive gets a scratchpad of its own,
 * zeroed once, as oneDNN's library-managed mode would give it. */
static int needs_private_scratch(const char *impl) {
  return strstr(impl, "amx") != NULL || strstr(impl, "bf16") != NULL;
}

static dnnl_query_t slot_query(cg_op op, int slot) {
  if (cg__op_is_bwd_data(op))
    return slot == SLOT_IN0   ? dnnl_query_diff_dst_md
           : slot == SLOT_IN1 ? dnnl_query_weights_md
                              : dnnl_query_diff_src_md;
  return slot == SLOT_IN0   ? dnnl_query_src_md
         : slot == SLOT_IN1 ? dnnl_query_diff_dst_md
                            : dnnl_query_diff_weights_md;
}

static int slot_arg(cg_op op, int slot) {
  if (cg__op_is_bwd_data(op))
    return slot == SLOT_IN0   ? DNNL_ARG_DIFF_DST
           : slot == SLOT_IN1 ? DNNL_ARG_WEIGHTS
                              : DNNL_ARG_DIFF_SRC;
  return slot == SLOT_IN0   ? DNNL_ARG_SRC
         : slot == SLOT_IN1 ? DNNL_ARG_DIFF_DST
                            : DNNL_ARG_DIFF_WEIGHTS;
}

/* Builds every primitive and memory object of geom. Tries the request's
 * dtype first; falls back to f32 compute (the reorders convert) when
 * oneDNN has no kernel for it or only a reference one. */
static int entry_create(cg_engine *e, const cg_geom *g, eng_entry **out,
                        char *err, size_t errlen) {
  int rc = 0;
  eng_shape s;
  dnnl_primitive_desc_t pd = NULL, rpd = NULL;
  dnnl_data_type_t udt = dnnl_dt(g->dtype), cdt = udt;
  const char *impl = NULL;
  size_t bytes;
  eng_entry *en = calloc(1, sizeof *en);

  *out = NULL;
  if (!en) {
    rc = cg_errorf(err, errlen, CG_ENOMEM, "engine: out of memory");
    goto fail;
  }
  en->path = CG_PATH_NATIVE;
  if (shape_init(&s, g)) {
    /* Nothing to compute: the gradient is all zeros. */
    en->zero_output = 1;
    en->impl = "none:zero";
    if (!cg_backend_dtype_native(g->dtype))
      en->path = CG_PATH_F32_CONVERT;
    *out = en;
    en = NULL;
    goto fail;
  }
  if (g->dtype != CG_DTYPE_F32 && cg_backend_dtype_native(g->dtype)) {
    rc = op_pd_create(e, g, &s, udt, &pd, err, errlen);
    if (rc == 0) {
      DNNL_TRY(
          dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl),
          "implementation query", fail);
      if (impl_is_reference(impl)) {
        dnnl_primitive_desc_destroy(pd);
        pd = NULL;
      }
    } else if (rc != CG_EUNSUPPORTED && rc != CG_EINVAL) {
      goto fail; /* out of memory, or the engine's own error */
    }
  }
  if (!pd) {
    if (g->dtype != CG_DTYPE_F32) {
      cdt = dnnl_f32;
      en->path = CG_PATH_F32_CONVERT;
    }
    rc = op_pd_create(e, g, &s, cdt, &pd, err, errlen);
    if (rc)
      goto fail;
  }
  DNNL_TRY(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl),
           "implementation query", fail);
  en->impl = impl_intern(impl);
  DNNL_MAKE(dnnl_primitive_create(&en->op, pd), "primitive creation", fail);
  rc = scratch_create(e, en, pd, 0, &bytes, err, errlen);
  if (rc)
    goto fail;
  if (bytes && needs_private_scratch(impl)) {
    rc = buf_reserve(&en->own_scratch, bytes, err, errlen);
    if (rc)
      goto fail;
    memset(en->own_scratch.p, 0, en->own_scratch.size);
  } else if (bytes > en->scratch_bytes) {
    en->scratch_bytes = bytes;
  }

  for (int i = 0; i < NSLOTS; i++) {
    dnnl_memory_desc_t umd;
    const dnnl_memory_desc_t *pmd =
        dnnl_primitive_desc_query_md(pd, slot_query(g->op, i), 0);
    en->arg[i] = slot_arg(g->op, i);
    if (!pmd) {
      rc = cg_errorf(err, errlen, CG_EBACKEND,
                     "oneDNN: primitive has no memory descriptor for "
                     "tensor %d",
                     i);
      goto fail;
    }
    /* The f32-convert path's user memories are its f32 staging buffers. */
    DNNL_TRY(user_md(&umd, g, &s, i,
                     en->path == CG_PATH_F32_CONVERT ? dnnl_f32 : udt),
             "user memory descriptor", fail);
    DNNL_TRY(
        dnnl_memory_create(&en->user_mem[i], &umd, e->eng, DNNL_MEMORY_NONE),
        "user memory", fail);
    if (dnnl_memory_desc_equal(&umd, pmd))
      continue;
    if (i == SLOT_OUT)
      DNNL_TRY(dnnl_reorder_primitive_desc_create(&rpd, pmd, e->eng, &umd,
                                                  e->eng, e->attr),
               "output reorder descriptor", fail);
    else
      DNNL_TRY(dnnl_reorder_primitive_desc_create(&rpd, &umd, e->eng, pmd,
                                                  e->eng, e->attr),
               "input reorder descriptor", fail);
    DNNL_MAKE(dnnl_primitive_create(&en->reorder[i], rpd), "reorder creation",
              fail);
    rc = scratch_create(e, en, rpd, 1 + i, &bytes, err, errlen);
    if (rc)
      goto fail;
    if (bytes > en->scratch_bytes)
      en->scratch_bytes = bytes;
    dnnl_primitive_desc_destroy(rpd);
    rpd = NULL;
    DNNL_TRY(
        dnnl_memory_create(&en->prim_mem[i], pmd, e->eng, DNNL_MEMORY_NONE),
        "primitive-layout memory", fail);
    en->prim_bytes[i] = dnnl_memory_desc_get_size(pmd);
  }
  *out = en;
  en = NULL;
fail:
  dnnl_primitive_desc_destroy(rpd);
  dnnl_primitive_desc_destroy(pd);
  entry_destroy((cg__cache_entry *)en);
  return rc;
}

/* FNV-1a of s: an avoided implementation's part of a key. */
static int64_t name_hash(const char *s) {
  uint64_t h = 14695981039346656037ull;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return (int64_t)(h | 1);
}

/* avoid: the implementation cg_engine_run_other skips, or NULL. */
static void key_build(cg__key *k, const cg_geom *g, int threads,
                      const char *avoid) {
  int i = 0;
  memset(k, 0, sizeof *k);
  k->v[i++] = avoid ? name_hash(avoid) : 0;
  k->v[i++] = g->op;
  k->v[i++] = g->dtype;
  k->v[i++] = g->nsp;
  k->v[i++] = g->mb;
  k->v[i++] = g->groups;
  k->v[i++] = g->ic;
  k->v[i++] = g->oc;
  k->v[i++] = threads;
  k->v[i++] = g->data_format;
  k->v[i++] = g->weights_format;
  k->v[i++] = g->out_data_format;
  k->v[i++] = g->out_weights_format;
  for (int a = 0; a < g->nsp; a++) {
    int64_t *t = &k->v[i + 8 * a];
    t[0] = g->in_sp[a];
    t[1] = g->out_sp[a];
    t[2] = g->kernel[a];
    t[3] = g->stride[a];
    t[4] = g->dilation[a];
    t[5] = g->pad_begin[a];
    t[6] = g->pad_end[a];
    t[7] = g->output_padding[a];
  }
}

/* Cheap sanity checks so a hand-built geom cannot divide by zero or index
 * out of the arrays; the full validation is cg_problem_resolve's job. */
static int geom_check(const cg_geom *g, char *err, size_t errlen) {
  if (!g || g->op < CG_OP_CONV_BWD_DATA || g->op > CG_OP_DECONV_BWD_WEIGHTS)
    return cg_errorf(err, errlen, CG_EINVAL, "engine: invalid op");
  if (g->dtype < CG_DTYPE_F32 || g->dtype > CG_DTYPE_F16)
    return cg_errorf(err, errlen, CG_EINVAL, "engine: invalid dtype");
  if (g->nsp < 1 || g->nsp > CG_MAX_SPATIAL)
    return cg_errorf(err, errlen, CG_EINVAL, "engine: invalid spatial rank %d",
                     g->nsp);
  if (g->groups < 1 || g->ic % g->groups || g->oc % g->groups)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "engine: channels not divisible by groups");
  /* Past the maxima the reasoning of limits.c no longer holds. */
  cg_limits most;
  cg_limits_max(&most);
  return cg_geom_check_limits(g, &most, NULL, err, errlen);
}

/* ---- public API ------------------------------------------------------- */

/* oneDNN generates its gemm kernels once per process, on the first gemm
 * (30-80 ms here, and the gemm-based convolutions are where the engine
 * sends what the JIT convolutions cannot take): done when the first engine
 * is made, so that no request pays it. */
static pthread_once_t gemm_once = PTHREAD_ONCE_INIT;

static void warm_gemm(void) {
  /* 16 x 16: a vector (m or n of 1) takes the gemv path, which makes no
   * kernels. */
  enum { N = 16 };
  static float a[N * N], b[N * N], c[N * N];
  dnnl_sgemm('N', 'N', N, N, N, 1.0f, a, N, b, N, 0.0f, c, N);
}

int cg_engine_new(cg_engine **out, const cg_engine_config *cfg, char *err,
                  size_t errlen) {
  int rc = 0;
  pthread_once(&gemm_once, warm_gemm);
  cg_engine *e = NULL;
  size_t cap =
      cfg && cfg->cache_capacity ? cfg->cache_capacity : CG__DEFAULT_CAPACITY;

  *out = NULL;
  if (cfg && cfg->threads < 0) {
    rc = cg_errorf(err, errlen, CG_EINVAL, "threads: must be >= 0, got %d",
                   cfg->threads);
    goto fail;
  }
  e = calloc(1, sizeof *e);
  if (!e) {
    rc = cg_errorf(err, errlen, CG_ENOMEM, "engine: out of memory");
    goto fail;
  }
  e->threads = cfg && cfg->threads ? cfg->threads : omp_get_max_threads();
  if (cg__cache_init(&e->cache, cap, entry_destroy)) {
    rc = cg_errorf(err, errlen, CG_ENOMEM, "engine: cannot allocate cache");
    goto fail;
  }
  DNNL_TRY(dnnl_engine_create(&e->eng, dnnl_cpu, 0), "engine creation", fail);
  DNNL_TRY(dnnl_stream_create(&e->stream, e->eng, dnnl_stream_default_flags),
           "stream creation", fail);
  DNNL_TRY(dnnl_primitive_attr_create(&e->attr), "attribute creation", fail);
  DNNL_TRY(dnnl_primitive_attr_set_scratchpad_mode(e->attr,
                                                   dnnl_scratchpad_mode_user),
           "scratchpad mode", fail);
  *out = e;
  e = NULL;
fail:
  cg_engine_free(e);
  return rc;
}

int cg_engine_set_threads(cg_engine *e, int threads, const int *cpus, char *err,
                          size_t errlen) {
  if (threads < 1)
    return cg_errorf(err, errlen, CG_EINVAL, "threads: must be >= 1, got %d",
                     threads);
  e->threads = threads;
  if (!cpus)
    return 0;
  /* libgomp hands team slot i to the same pool thread in every region of
   * this calling thread, so pinning each slot once holds for the regions
   * oneDNN opens with this count or fewer. */
  int failed = -1;
#pragma omp parallel num_threads(threads)
  {
    int t = omp_get_thread_num();
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpus[t], &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
#pragma omp atomic write
      failed = cpus[t];
    }
  }
  if (failed >= 0)
    return cg_errorf(err, errlen, CG_EBACKEND,
                     "threads: cannot pin a thread to core %d", failed);
  return 0;
}

size_t cg_engine_release(cg_engine *e) {
  size_t n = e->scratch.size;
  free(e->scratch.p);
  e->scratch = (eng_buf){0};
  for (int i = 0; i < NSLOTS; i++) {
    n += e->buf[i].size + e->stage[i].size;
    free(e->buf[i].p);
    free(e->stage[i].p);
    e->buf[i] = e->stage[i] = (eng_buf){0};
  }
  return n;
}

void cg_engine_free(cg_engine *e) {
  if (!e)
    return;
  if (e->cache.buckets)
    cg__cache_close(&e->cache);
  dnnl_primitive_attr_destroy(e->attr);
  dnnl_stream_destroy(e->stream);
  dnnl_engine_destroy(e->eng);
  for (int i = 0; i < NSLOTS; i++) {
    free(e->buf[i].p);
    free(e->stage[i].p);
  }
  free(e->scratch.p);
  free(e);
}

int cg_engine_threads(const cg_engine *e) {
  return e->threads;
}

size_t cg_engine_cache_size(const cg_engine *e) {
  return e ? e->cache.count : 0;
}

void cg_engine_forget_runs(cg_engine *e) {
  for (cg__cache_entry *c = e ? e->cache.head : NULL; c; c = c->lru_next)
    ((eng_entry *)c)->runs = 0;
}

/* A geom's spatial rank is checked before key_build reads its arrays. */
static int rank_usable(const cg_geom *g) {
  return g && g->nsp >= 1 && g->nsp <= CG_MAX_SPATIAL;
}

int cg_engine_cached(const cg_engine *e, const cg_geom *geom) {
  if (!e || !rank_usable(geom))
    return 0;
  cg__key key;
  key_build(&key, geom, e->threads, NULL);
  return cg__cache_find(&e->cache, &key) != NULL;
}

int cg_engine_layer_cached(const cg_engine *e, const cg_layer *l) {
  if ((l->grads & CG_GRAD_BIT(CG_GRAD_DIFF_SRC)) &&
      !cg_engine_cached(e, &l->data))
    return 0;
  return !(l->grads & CG_GRAD_BIT(CG_GRAD_DIFF_WEIGHTS)) ||
         cg_engine_cached(e, &l->weights);
}

uint64_t cg_layer_primitives_hash(const cg_layer *l) {
  uint64_t h = (uint64_t)l->grads;
  const cg_geom *parts[2] = {
      (l->grads & CG_GRAD_BIT(CG_GRAD_DIFF_SRC)) ? &l->data : NULL,
      (l->grads & CG_GRAD_BIT(CG_GRAD_DIFF_WEIGHTS)) ? &l->weights : NULL};
  for (int i = 0; i < 2; i++) {
    cg__key key;
    h *= 1099511628211ull; /* FNV's prime: the parts' order counts */
    if (!rank_usable(parts[i]))
      continue;
    key_build(&key, parts[i], 0, NULL);
    h ^= cg__key_hash(&key);
  }
  return h;
}

/* Points m at p unless it already is. */
static int mem_bind(dnnl_memory_t m, const void **last, const void *p,
                    char *err, size_t errlen) {
  int rc = 0;
  if (*last == p)
    return 0;
  DNNL_TRY(dnnl_memory_set_data_handle(m, (void *)p), "set data handle", out);
  *last = p;
out:
  return rc;
}

static int execute(cg_engine *e, eng_entry *en, dnnl_primitive_t prim,
                   int scratch_idx, int nargs, dnnl_exec_arg_t *args, char *err,
                   size_t errlen) {
  int rc = 0;
  dnnl_memory_t sm = en->scratch_mem[scratch_idx];
  if (sm) {
    void *p = scratch_idx == 0 && en->own_scratch.p ? en->own_scratch.p
                                                    : e->scratch.p;
    rc = mem_bind(sm, &en->scratch_ptr[scratch_idx], p, err, errlen);
    if (rc)
      goto out;
    args[nargs].arg = DNNL_ARG_SCRATCHPAD;
    args[nargs].memory = sm;
    nargs++;
  }
  DNNL_TRY(dnnl_primitive_execute(prim, e->stream, nargs, args),
           "primitive execution", out);
out:
  return rc;
}

/* n elements from src (dtype from) into dst (dtype to), split over the
 * engine's threads. */
static void convert_parallel(const cg_engine *e, cg_dtype to, void *dst,
                             cg_dtype from, const void *src, size_t n) {
  size_t tsz = cg_dtype_size(to), fsz = cg_dtype_size(from);
#pragma omp parallel num_threads(e->threads)
  {
    size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
    size_t lo = n * t / nt, hi = n * (t + 1) / nt;
    cg_convert(to, (char *)dst + lo * tsz, from, (const char *)src + lo * fsz,
               hi - lo);
  }
}

/* The f32-convert path: the caller's inputs as f32 in the staging buffers,
 * which user[] then points to (the output's too, converted back after the
 * run). */
static int stage_inputs(cg_engine *e, const cg_geom *g, const void *user[],
                        char *err, size_t errlen) {
  size_t elems[NSLOTS] = {g->in_elems[0], g->in_elems[1], g->out_elems};
  for (int i = 0; i < NSLOTS; i++) {
    int rc = buf_reserve(&e->stage[i], elems[i] * sizeof(float), err, errlen);
    if (rc)
      return rc;
    if (i != SLOT_OUT)
      convert_parallel(e, CG_DTYPE_F32, e->stage[i].p, g->dtype, user[i],
                       elems[i]);
    user[i] = e->stage[i].p;
  }
  return 0;
}

#ifdef CG_FAULT_INJECT
/* The fault-injection build's broken implementation (tests only):
 * CONVGRAD_FAULT_BROKEN=OP:ELEMS makes every run of op OP (its name) with
 * an output of ELEMS elements on its first implementation return each
 * element plus 1, as a kernel that returns garbage for one geometry
 * would; cg_engine_run_other computes it right. */
static pthread_once_t broken_once = PTHREAD_ONCE_INIT;
static cg_op broken_op;
static size_t broken_elems;

static void broken_load(void) {
  const char *v = getenv("CONVGRAD_FAULT_BROKEN");
  const char *colon = v ? strchr(v, ':') : NULL;
  char name[64];
  if (!colon || (size_t)(colon - v) >= sizeof name)
    return;
  memcpy(name, v, (size_t)(colon - v));
  name[colon - v] = '\0';
  if (cg_op_parse(name, &broken_op) != 0)
    return;
  broken_elems = (size_t)strtoull(colon + 1, NULL, 10);
}

static void broken_apply(const cg_geom *g, void *out) {
  pthread_once(&broken_once, broken_load);
  if (g->op != broken_op || g->out_elems != broken_elems)
    return;
  for (size_t i = 0; i < g->out_elems; i++)
    cg_store_f32(g->dtype, out, i, cg_load_f32(g->dtype, out, i) + 1.0f);
}
#endif

/* cg_engine_run, skipping the implementation avoid (NULL: none). */
static int run(cg_engine *e, const cg_geom *geom, const char *avoid,
               const void *in0, const void *in1, void *out, cg_run_info *info,
               char *err, size_t errlen) {
  int rc = 0;
  double t0 = cg__now_ms();
  cg__key key;
  eng_entry *en;
  int hit;
  const void *user[NSLOTS] = {in0, in1, out};
  dnnl_exec_arg_t args[NSLOTS + 1];

  int prev_threads = 0; /* 0: thread count not changed */

  if (!e || !in0 || !in1 || !out) {
    rc = cg_errorf(err, errlen, CG_EINVAL, "engine: NULL argument");
    goto out;
  }
  rc = geom_check(geom, err, errlen);
  if (rc)
    goto out;

  /* oneDNN sizes its parallel work from the calling thread's OpenMP
   * thread count, at creation and at execution alike. */
  if (omp_get_max_threads() != e->threads) {
    prev_threads = omp_get_max_threads();
    omp_set_num_threads(e->threads);
  }

  key_build(&key, geom, e->threads, avoid);
  en = (eng_entry *)cg__cache_get(&e->cache, &key);
  hit = en != NULL;
  if (!en) {
    e->avoid = avoid;
    rc = entry_create(e, geom, &en, err, errlen);
    e->avoid = NULL;
    if (rc)
      goto out;
    /* entry_create sets en whenever it returns 0; the analyzer takes
     * cg_errorf (another unit) for one that may return 0. */
    // NOLINTNEXTLINE(clang-analyzer-core.NullDereference)
    en->base.key = key;
    cg__cache_put(&e->cache, &en->base);
  }

  if (en->zero_output) {
    memset(out, 0, geom->out_bytes);
    goto done;
  }
  rc = buf_reserve(&e->scratch, en->scratch_bytes, err, errlen);
  if (!rc && en->path == CG_PATH_F32_CONVERT)
    rc = stage_inputs(e, geom, user, err, errlen);
  for (int i = 0; i < NSLOTS && !rc; i++) {
    rc = mem_bind(en->user_mem[i], &en->user_ptr[i], user[i], err, errlen);
    if (!rc && en->reorder[i]) {
      rc = buf_reserve(&e->buf[i], en->prim_bytes[i], err, errlen);
      if (!rc)
        rc = mem_bind(en->prim_mem[i], &en->prim_ptr[i], e->buf[i].p, err,
                      errlen);
    }
  }
  if (rc)
    goto out;

  for (int i = 0; i < SLOT_OUT; i++) {
    if (!en->reorder[i])
      continue;
    args[0] = (dnnl_exec_arg_t){DNNL_ARG_FROM, en->user_mem[i]};
    args[1] = (dnnl_exec_arg_t){DNNL_ARG_TO, en->prim_mem[i]};
    rc = execute(e, en, en->reorder[i], 1 + i, 2, args, err, errlen);
    if (rc)
      goto out;
  }
  for (int i = 0; i < NSLOTS; i++) {
    args[i].arg = en->arg[i];
    args[i].memory = en->reorder[i] ? en->prim_mem[i] : en->user_mem[i];
  }
  rc = execute(e, en, en->op, 0, NSLOTS, args, err, errlen);
  if (rc)
    goto out;
  if (en->reorder[SLOT_OUT]) {
    args[0] = (dnnl_exec_arg_t){DNNL_ARG_FROM, en->prim_mem[SLOT_OUT]};
    args[1] = (dnnl_exec_arg_t){DNNL_ARG_TO, en->user_mem[SLOT_OUT]};
    rc = execute(e, en, en->reorder[SLOT_OUT], 1 + SLOT_OUT, 2, args, err,
                 errlen);
    if (rc)
      goto out;
  }
  DNNL_TRY(dnnl_stream_wait(e->stream), "stream wait", out);
  if (en->path == CG_PATH_F32_CONVERT)
    convert_parallel(e, geom->dtype, out, CG_DTYPE_F32, e->stage[SLOT_OUT].p,
                     geom->out_elems);
#ifdef CG_FAULT_INJECT
  if (!avoid)
    broken_apply(geom, out);
#endif

done:
  en->runs++;
  if (info) {
    info->path = en->path;
    info->cache_hit = hit;
    info->runs = en->runs;
    info->impl = en->impl;
    info->compute_ms = cg__now_ms() - t0;
    info->threads = e->threads;
  }
out:
  if (prev_threads)
    omp_set_num_threads(prev_threads);
  return rc;
}

int cg_engine_run(cg_engine *e, const cg_geom *geom, const void *in0,
                  const void *in1, void *out, cg_run_info *info, char *err,
                  size_t errlen) {
  return run(e, geom, NULL, in0, in1, out, info, err, errlen);
}

int cg_engine_run_other(cg_engine *e, const cg_geom *geom, const char *avoid,
                        const void *in0, const void *in1, void *out,
                        cg_run_info *info, char *err, size_t errlen) {
  if (!avoid)
    return cg_errorf(err, errlen, CG_EINVAL, "engine: NULL implementation");
  return run(e, geom, avoid, in0, in1, out, info, err, errlen);
}
