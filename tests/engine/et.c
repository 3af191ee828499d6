/* et.c - the engine tests' shared helpers (et.h): random valid problems,
 * their cg_problem form for each op, tensors and comparisons. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cg/dtype.h"
#include "et.h"

uint64_t et_next(et_rng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

int64_t et_range(et_rng *r, int64_t lo, int64_t hi) {
  return lo + (int64_t)(et_next(r) % (uint64_t)(hi - lo + 1));
}

static int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

/* Pads as SEMANTICS.md "auto_pad" defines them for axis a; `in` is the
 * Convolution reference size (unused for ConvTranspose). */
static void auto_pads(et_case *c, int a, int64_t in) {
  int64_t ek = (c->k[a] - 1) * c->d[a] + 1, t;
  if (c->auto_pad == CG_AUTO_PAD_VALID) {
    c->pb[a] = c->pe[a] = 0;
    return;
  }
  if (c->deconv)
    t = ek - c->s[a] > 0 ? ek - c->s[a] : 0;
  else {
    t = (ceil_div(in, c->s[a]) - 1) * c->s[a] + ek - in;
    if (t < 0)
      t = 0;
  }
  c->pb[a] = c->auto_pad == CG_AUTO_PAD_SAME_UPPER ? t / 2 : ceil_div(t, 2);
  c->pe[a] = t - c->pb[a];
}

/* Draws one spatial axis; returns 0 when the draw gives no valid shape. */
static int draw_axis(et_rng *r, et_case *c, int a, int wide) {
  static const int64_t max_in[2][4] = {{0, 12, 8, 5}, {0, 10, 6, 4}};
  int64_t k = et_range(r, 1, c->nsp == 3 ? 2 : 3);
  int64_t s = et_range(r, 0, 2) ? 1 : et_range(r, 2, 3);
  int64_t d = et_range(r, 0, 2) ? 1 : et_range(r, 2, 3);
  int64_t ek = (k - 1) * d + 1;
  int64_t in = et_range(r, 1, max_in[wide][c->nsp]);
  c->k[a] = k;
  c->s[a] = s;
  c->d[a] = d;
  c->in_sp[a] = in;
  c->opad[a] = 0;
  if (c->auto_pad == CG_AUTO_PAD_NONE) {
    c->pb[a] = et_range(r, 0, 2);
    c->pe[a] = et_range(r, 0, 2);
  } else {
    auto_pads(c, a, in);
  }
  if (!c->deconv) {
    if (in + c->pb[a] + c->pe[a] < ek)
      return 0;
    c->out_sp[a] = (in + c->pb[a] + c->pe[a] - ek) / s + 1;
  } else {
    int64_t maxop = s > d ? s : d;
    if (et_range(r, 0, 1))
      c->opad[a] = et_range(r, 0, maxop - 1);
    c->out_sp[a] = s * (in - 1) + ek - c->pb[a] - c->pe[a] + c->opad[a];
    if (c->out_sp[a] < 1)
      return 0;
  }
  return 1;
}

static void case_random(et_rng *r, et_case *c, int deconv, cg_dtype dt,
                        int wide) {
  static const cg_auto_pad pads[] = {
      CG_AUTO_PAD_NONE,       CG_AUTO_PAD_NONE,       CG_AUTO_PAD_NONE,
      CG_AUTO_PAD_SAME_UPPER, CG_AUTO_PAD_SAME_LOWER, CG_AUTO_PAD_VALID};
  memset(c, 0, sizeof *c);
  c->deconv = deconv;
  c->dtype = dt;
  c->nsp = (int)et_range(r, 1, 3);
  c->mb = et_range(r, 1, 2);
  switch (et_range(r, 0, 3) + 4 * wide) {
  case 4: /* wide: several 16-channel blocks and a tail */
    c->groups = 1;
    c->ic = et_range(r, 9, 40);
    c->oc = et_range(r, 9, 40);
    break;
  case 5:
    c->groups = et_range(r, 2, 4);
    c->ic = c->groups * et_range(r, 5, 20);
    c->oc = c->groups * et_range(r, 5, 20);
    break;
  case 6:
    c->groups = c->ic = c->oc = et_range(r, 16, 48);
    break;
  case 7: /* wide on one side only */
    c->groups = 1;
    c->ic = et_range(r, 1, 4);
    c->oc = et_range(r, 17, 64);
    break;
  case 0: /* plain */
    c->groups = 1;
    c->ic = et_range(r, 1, 8);
    c->oc = et_range(r, 1, 8);
    break;
  case 1: /* grouped */
    c->groups = et_range(r, 2, 3);
    c->ic = c->groups * et_range(r, 1, 4);
    c->oc = c->groups * et_range(r, 1, 4);
    break;
  case 2: /* depthwise */
    c->groups = c->ic = c->oc = et_range(r, 2, 8);
    break;
  default: /* small plain */
    c->groups = 1;
    c->ic = et_range(r, 1, 3);
    c->oc = et_range(r, 1, 3);
    break;
  }
  c->auto_pad = pads[et_range(r, 0, 5)];
  for (int a = 0; a < c->nsp; a++)
    while (!draw_axis(r, c, a, wide))
      ;

  int need_opad = 0, exact = 1;
  for (int a = 0; a < c->nsp; a++) {
    int64_t ek = (c->k[a] - 1) * c->d[a] + 1;
    need_opad |= c->opad[a] >= c->s[a];
    exact &= (c->in_sp[a] + c->pb[a] + c->pe[a] - ek) % c->s[a] == 0;
  }
  c->give_opad = deconv && (need_opad || et_range(r, 0, 1));
  /* dst_shape can only be left out where inference recovers it. */
  c->give_dst_shape = !(exact && (c->auto_pad == CG_AUTO_PAD_NONE ||
                                  c->auto_pad == CG_AUTO_PAD_VALID)) ||
                      et_range(r, 0, 2) > 0;
  c->shape_as_input = (int)et_range(r, 0, 1);
  c->df = et_range(r, 0, 1) ? CG_DATA_NCX : CG_DATA_NXC;
  if (deconv) {
    static const cg_weights_format f[] = {CG_WEIGHTS_OIX, CG_WEIGHTS_XIO,
                                          CG_WEIGHTS_IOX, CG_WEIGHTS_XOI};
    c->wf = f[et_range(r, 0, 3)];
    c->owf = et_range(r, 0, 1) ? CG_WEIGHTS_DEFAULT : f[et_range(r, 0, 3)];
  } else {
    c->wf = et_range(r, 0, 1) ? CG_WEIGHTS_OIX : CG_WEIGHTS_XIO;
    c->owf = et_range(r, 0, 1)   ? CG_WEIGHTS_DEFAULT
             : et_range(r, 0, 1) ? CG_WEIGHTS_OIX
                                 : CG_WEIGHTS_XIO;
  }
  c->odf = (cg_data_format)et_range(r, 0, 2);
}

void et_case_random(et_rng *r, et_case *c, int deconv, cg_dtype dt) {
  case_random(r, c, deconv, dt, 0);
}

void et_case_random_wide(et_rng *r, et_case *c, int deconv, cg_dtype dt) {
  case_random(r, c, deconv, dt, 1);
}

void et_data_dims(int nsp, cg_data_format f, int64_t mb, int64_t ch,
                  const int64_t *sp, int64_t *dims) {
  dims[0] = mb;
  if (f == CG_DATA_NCX) {
    dims[1] = ch;
    for (int a = 0; a < nsp; a++)
      dims[2 + a] = sp[a];
  } else {
    for (int a = 0; a < nsp; a++)
      dims[1 + a] = sp[a];
    dims[1 + nsp] = ch;
  }
}

void et_weights_dims(const et_case *c, cg_weights_format f, int64_t *dims) {
  int64_t o, i;     /* the dims the format calls O and I */
  if (!c->deconv) { /* (OC, IC/g) */
    o = c->oc;
    i = c->ic / c->groups;
  } else { /* (OC/g, IC), in every ConvTranspose spelling */
    o = c->oc / c->groups;
    i = c->ic;
  }
  int n = c->nsp;
  switch (f) {
  case CG_WEIGHTS_OIX:
  case CG_WEIGHTS_IOX:
    dims[0] = f == CG_WEIGHTS_OIX ? o : i;
    dims[1] = f == CG_WEIGHTS_OIX ? i : o;
    for (int a = 0; a < n; a++)
      dims[2 + a] = c->k[a];
    break;
  default: /* XIO, XOI */
    for (int a = 0; a < n; a++)
      dims[a] = c->k[a];
    dims[n] = f == CG_WEIGHTS_XIO ? i : o;
    dims[n + 1] = f == CG_WEIGHTS_XIO ? o : i;
    break;
  }
}

static cg_ints ints(const int64_t *v, size_t n) {
  return (cg_ints){v, n};
}

static int all_eq(const int64_t *v, int n, int64_t x) {
  for (int a = 0; a < n; a++)
    if (v[a] != x)
      return 0;
  return 1;
}

void et_problem_build(et_problem *ep, const et_case *c, cg_op op) {
  cg_problem *p = &ep->p;
  int n = c->nsp, rank = 2 + n;
  memset(ep, 0, sizeof *ep);
  cg_problem_init(p);
  p->op = op;
  p->dtype = c->dtype;
  memcpy(ep->strides, c->s, sizeof ep->strides);
  memcpy(ep->dil, c->d, sizeof ep->dil);
  memcpy(ep->pb, c->pb, sizeof ep->pb);
  memcpy(ep->pe, c->pe, sizeof ep->pe);
  memcpy(ep->opad, c->opad, sizeof ep->opad);
  /* All-default lists go out empty half the time (spec: empty = default);
   * the choice is derived from the case so builds are repeatable. */
  int empty_defaults = (int)((c->mb + c->ic + c->k[0]) & 1);
  p->attrs.strides =
      ints(ep->strides, empty_defaults && all_eq(c->s, n, 1) ? 0 : (size_t)n);
  p->attrs.dilations =
      ints(ep->dil, empty_defaults && all_eq(c->d, n, 1) ? 0 : (size_t)n);
  if (c->auto_pad == CG_AUTO_PAD_NONE) {
    int zb = empty_defaults && all_eq(c->pb, n, 0);
    int ze = empty_defaults && all_eq(c->pe, n, 0);
    p->attrs.pads_begin = ints(ep->pb, zb ? 0 : (size_t)n);
    p->attrs.pads_end = ints(ep->pe, ze ? 0 : (size_t)n);
  }
  p->attrs.auto_pad = c->auto_pad;
  p->attrs.groups = c->groups;
  p->attrs.data_format = c->df;
  p->attrs.weights_format = c->wf;
  if (c->deconv && c->give_opad)
    p->attrs.output_padding = ints(ep->opad, (size_t)n);

  int64_t *shape = ep->shape;
  size_t shape_len = 0;
  switch (op) {
  case CG_OP_CONV_BWD_DATA:
  case CG_OP_DECONV_BWD_DATA:
    et_data_dims(n, c->df, c->mb, c->oc, c->out_sp, ep->dims[0]);
    et_weights_dims(c, c->wf, ep->dims[1]);
    p->out_data_format = c->odf;
    if (op == CG_OP_CONV_BWD_DATA && c->give_dst_shape) {
      et_data_dims(n, c->df, c->mb, c->ic, c->in_sp, shape);
      shape_len = (size_t)rank;
    }
    break;
  case CG_OP_CONV_BWD:
  case CG_OP_DECONV_BWD:
    et_data_dims(n, c->df, c->mb, c->ic, c->in_sp, ep->dims[0]);
    et_data_dims(n, c->df, c->mb, c->oc, c->out_sp, ep->dims[1]);
    et_weights_dims(c, c->wf, ep->dims[2]);
    p->input_dims[2] = ints(ep->dims[2], (size_t)rank);
    p->out_data_format = c->odf;
    p->out_weights_format = c->owf;
    break;
  default:
    et_data_dims(n, c->df, c->mb, c->ic, c->in_sp, ep->dims[0]);
    et_data_dims(n, c->df, c->mb, c->oc, c->out_sp, ep->dims[1]);
    p->out_weights_format = c->owf;
    et_weights_dims(c, c->wf, shape);
    shape_len = (size_t)rank;
    break;
  }
  p->input_dims[0] = ints(ep->dims[0], (size_t)rank);
  p->input_dims[1] = ints(ep->dims[1], (size_t)rank);
  if (shape_len && c->shape_as_input) {
    p->has_shape_input = 1;
    p->shape_input = ints(shape, shape_len);
  } else if (shape_len && op == CG_OP_CONV_BWD_DATA) {
    p->attrs.dst_shape = ints(shape, shape_len);
  } else if (shape_len) {
    p->attrs.weights_shape = ints(shape, shape_len);
  }
}

void et_case_str(const et_case *c, cg_op op, char *buf, size_t n) {
  int w =
      snprintf(buf, n, "%s %s mb%lld g%lld ic%lld oc%lld %s/%s->%s/%s ap=%s",
               cg_op_name(op), cg_dtype_name(c->dtype), (long long)c->mb,
               (long long)c->groups, (long long)c->ic, (long long)c->oc,
               cg_data_format_name(c->df), cg_weights_format_name(c->wf),
               cg_data_format_name(c->odf), cg_weights_format_name(c->owf),
               cg_auto_pad_name(c->auto_pad));
  for (int a = 0; a < c->nsp && w > 0 && (size_t)w < n; a++)
    w += snprintf(buf + w, n - (size_t)w,
                  " [i%lld o%lld k%lld s%lld d%lld p%lld,%lld op%lld]",
                  (long long)c->in_sp[a], (long long)c->out_sp[a],
                  (long long)c->k[a], (long long)c->s[a], (long long)c->d[a],
                  (long long)c->pb[a], (long long)c->pe[a],
                  (long long)c->opad[a]);
}

cg_geom et_resolve(const et_case *c, cg_op op) {
  et_problem ep;
  cg_geom g;
  char err[256], desc[512];
  et_problem_build(&ep, c, op);
  et_case_str(c, op, desc, sizeof desc);
  int rc = cg_problem_resolve(&ep.p, &g, err, sizeof err);
  if (rc)
    fail_msg("resolve rejected a valid case (%s: %s): %s", cg_err_name(rc), err,
             desc);
  int ok = g.mb == c->mb && g.groups == c->groups && g.ic == c->ic &&
           g.oc == c->oc && g.nsp == c->nsp;
  for (int a = 0; ok && a < c->nsp; a++)
    ok = g.in_sp[a] == c->in_sp[a] && g.out_sp[a] == c->out_sp[a] &&
         g.kernel[a] == c->k[a] && g.stride[a] == c->s[a] &&
         g.dilation[a] == c->d[a] && g.pad_begin[a] == c->pb[a] &&
         g.pad_end[a] == c->pe[a] &&
         (!c->deconv || g.output_padding[a] == c->opad[a]);
  if (!ok)
    fail_msg("resolved geometry differs from the case: %s", desc);
  return g;
}

void *et_alloc(size_t bytes) {
  void *p = calloc(bytes ? bytes : 1, 1);
  if (!p)
    fail_msg("out of memory (%zu bytes)", bytes);
  return p;
}

void *et_random_tensor(et_rng *r, cg_dtype dt, size_t n) {
  void *p = et_alloc(n * cg_dtype_size(dt));
  uint64_t state = et_next(r) | 1;
  cg_fill_uniform(dt, p, n, &state);
  return p;
}

et_diff et_compare(cg_dtype dt, const void *got, const void *want, size_t n) {
  et_diff d = {0, 0};
  for (size_t i = 0; i < n; i++) {
    double w = cg_load_f32(dt, want, i), g = cg_load_f32(dt, got, i);
    double e = fabs(g - w);
    if (!(e <= d.max_err)) /* also catches NaN */
      d.max_err = isnan(e) ? INFINITY : e;
    if (fabs(w) > d.scale)
      d.scale = fabs(w);
  }
  return d;
}

double et_max_abs(cg_dtype dt, const void *buf, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) {
    double v = fabs(cg_load_f32(dt, buf, i));
    if (v > m)
      m = v;
  }
  return m;
}

int64_t et_reduction_length(const cg_geom *g) {
  int64_t l = 1;
  int deconv =
      g->op == CG_OP_DECONV_BWD_DATA || g->op == CG_OP_DECONV_BWD_WEIGHTS;
  if (g->op == CG_OP_CONV_BWD_DATA || g->op == CG_OP_DECONV_BWD_DATA) {
    l = g->oc / g->groups;
    for (int a = 0; a < g->nsp; a++)
      l *= g->kernel[a];
  } else {
    /* Summed over the batch and the strided side's positions. */
    l = g->mb;
    for (int a = 0; a < g->nsp; a++)
      l *= deconv ? g->in_sp[a] : g->out_sp[a];
  }
  return l;
}

double et_tolerance(const cg_geom *g, double scale, double amax0,
                    double amax1) {
  if (g->dtype == CG_DTYPE_F32)
    return 1e-5 * scale;
  double l = (double)et_reduction_length(g);
  return 2.0 * cg_dtype_epsilon(g->dtype) * scale +
         l * cg_dtype_epsilon(CG_DTYPE_F32) * l * amax0 * amax1;
}

/* oneDNN 2.6's names of the ISAs DNNL_MAX_CPU_ISA takes, in order. */
static const char *const isa_order[] = {"sse41",
                                        "avx",
                                        "avx2",
                                        "avx2_vnni",
                                        "avx512_core",
                                        "avx512_core_vnni",
                                        "avx512_core_bf16",
                                        "avx512_core_amx"};
#define ISA_COUNT (int)(sizeof isa_order / sizeof isa_order[0])
/* The ones run below the host's (the vnni ISAs add int8 kernels only). */
static const char *const capped_isas[] = {"avx2", "avx512_core",
                                          "avx512_core_bf16"};

static int isa_rank(const char *isa) {
  for (int i = 0; i < ISA_COUNT; i++)
    if (strcmp(isa_order[i], isa) == 0)
      return i;
  return ISA_COUNT; /* newer than this list */
}

/* Runs this program again with want as its ISA ("" = the machine's) and
 * returns 1 if that run failed. The copy bounds libgomp's spinning as
 * convgrad-server does (GOMP_SPINCOUNT=10000, read when libgomp loads):
 * under ctest -j a spinning thread of an OpenMP team holds a core that
 * its descheduled partner needs, and the sweeps took 100 times longer. */
static int run_copy(char **argv, const char *name, const char *want) {
  pid_t pid = fork();
  if (pid == 0) {
    if (*want)
      setenv("DNNL_MAX_CPU_ISA", want, 1);
    setenv("CG_ET_ISA", *want ? want : cg_backend_isa(), 1);
    setenv("GOMP_SPINCOUNT", "10000", 0);
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    fprintf(stderr, "%s: the run on %s failed (status 0x%x)\n", name,
            *want ? want : "this machine's ISA", (unsigned)status);
    return 1;
  }
  return 0;
}

int et_main_per_isa(char **argv, const char *name, int (*run)(void)) {
  const char *want = getenv("CG_ET_ISA");
  if (want) { /* a copy started below */
    if (strcmp(cg_backend_isa(), want) != 0) {
      fprintf(stderr, "%s: DNNL_MAX_CPU_ISA=%s gave %s\n", name, want,
              cg_backend_isa());
      return 1;
    }
    return run();
  }
  char host[64], covered[256];
  snprintf(host, sizeof host, "%s", cg_backend_isa());
  snprintf(covered, sizeof covered, "%s", host);
  int failed = run_copy(argv, name, "");
  for (size_t i = 0; i < sizeof capped_isas / sizeof capped_isas[0]; i++) {
    if (isa_rank(capped_isas[i]) >= isa_rank(host) || getenv("CG_SANITIZED"))
      continue;
    printf("%s: again with DNNL_MAX_CPU_ISA=%s\n", name, capped_isas[i]);
    fflush(stdout);
    failed |= run_copy(argv, name, capped_isas[i]);
    size_t n = strlen(covered);
    snprintf(covered + n, sizeof covered - n, ", %s", capped_isas[i]);
  }
  printf("%s: ISAs covered: %s%s\n", name, covered,
         getenv("CG_SANITIZED") ? " (the ISAs below run in the release build)"
                                : "");
  return failed;
}
