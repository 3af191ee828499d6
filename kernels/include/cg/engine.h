/* cg/engine.h - runs resolved problems on oneDNN.
 *
 * An engine owns a oneDNN CPU engine and stream, a bounded LRU cache of
 * primitives and reorders keyed by everything that defines them, and a
 * user-managed scratchpad. One engine is used by one thread at a time
 * (each server worker owns one); different engines may run concurrently
 * from different threads. */
#ifndef CG_ENGINE_H
#define CG_ENGINE_H

#include <stddef.h>

#include "cg/layer.h"
#include "cg/problem.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cg_engine cg_engine;

typedef struct cg_engine_config {
  int threads;           /* OpenMP threads per run; 0 = omp_get_max_threads() */
  size_t cache_capacity; /* distinct problems kept; 0 = default (64) */
} cg_engine_config;

/* How a run was computed. */
typedef enum {
  CG_PATH_NATIVE = 0,     /* oneDNN kernel in the request's dtype */
  CG_PATH_F32_CONVERT = 1 /* converted to f32, computed, rounded back */
} cg_compute_path;

typedef struct cg_run_info {
  cg_compute_path path;
  int cache_hit; /* 1 when the primitives came from the cache */
  /* oneDNN implementation name, "none:zero" when every product falls in
   * padding, "other" past 64 distinct names; static string. */
  const char *impl;
  double compute_ms; /* wall time of the run, reorders included */
  int threads;       /* OpenMP threads it ran with */
  /* Runs of these primitives on this engine, this one included: 1 for a
   * problem new to it (a new shape, thread count or implementation), and
   * for one evicted from its cache and made again. */
  uint64_t runs;
} cg_run_info;

/* Creates an engine. Returns 0, CG_ENOMEM or CG_EBACKEND. *out is owned
 * by the caller and released with cg_engine_free(). */
CG_EXPORT int cg_engine_new(cg_engine **out, const cg_engine_config *cfg,
                            char *err, size_t errlen);
/* Frees e and everything it cached; NULL is fine. */
CG_EXPORT void cg_engine_free(cg_engine *e);

/* Computes geom on oneDNN. in0/in1 hold geom->in_bytes[0/1] bytes in the
 * caller's layouts, out receives geom->out_bytes. info may be NULL.
 * Only kernels whose 32-bit arithmetic and work hold for geom run it
 * (impl_catalogue.c); the others leave it to the next implementation.
 * Returns 0, CG_EINVAL (NULL buffer, a geometry cg_problem_resolve would
 * not produce or one past cg_limits_max, or one oneDNN cannot build a
 * kernel for: runtime_error), CG_ERANGE (a buffer size overflows),
 * CG_ENOMEM, CG_EUNSUPPORTED (no implementation takes geom) or
 * CG_EBACKEND (message carries oneDNN's status). Not thread-safe for
 * one e. */
CG_EXPORT int cg_engine_run(cg_engine *e, const cg_geom *geom, const void *in0,
                            const void *in1, void *out, cg_run_info *info,
                            char *err, size_t errlen);

/* cg_engine_run on another implementation than avoid (a cg_run_info.impl
 * of geom's run): oneDNN's next one that the engine's rules allow, e.g.
 * the gemm-based convolution for a JIT kernel, or the f32-convert path's
 * kernel. For recomputing a result that failed its check (cg/check.h).
 * Returns as cg_engine_run; CG_EUNSUPPORTED when no other implementation
 * takes geom. Its primitives are cached apart from cg_engine_run's. */
CG_EXPORT int cg_engine_run_other(cg_engine *e, const cg_geom *geom,
                                  const char *avoid, const void *in0,
                                  const void *in1, void *out, cg_run_info *info,
                                  char *err, size_t errlen);

/* diff_bias of geom's layer (see cg_reference_bias) with the engine's
 * threads, in one pass over diff_dst summed in f32 blocks into doubles and
 * rounded once to geom->dtype. oneDNN has no fit for it here: its 2.6
 * reduction has no f16 and the fused bias of a backward-weights primitive
 * misses the diff_dst tail the engine cuts off for a ConvTranspose
 * output_padding (see shape_init), and would make a request for diff_bias
 * alone pay for diff_weights. info->impl is "bias". Returns 0, CG_EINVAL
 * or CG_ENOMEM. Not thread-safe for one e. */
CG_EXPORT int cg_engine_bias(cg_engine *e, const cg_geom *geom,
                             const void *diff_dst, void *diff_bias,
                             cg_run_info *info, char *err, size_t errlen);

/* Computes output g of l: in[] are the request's data inputs in order,
 * out receives l->out_bytes[g]. Returns as cg_engine_run. */
CG_EXPORT int cg_engine_run_output(cg_engine *e, const cg_layer *l, cg_grad g,
                                   const void *const in[3], void *out,
                                   cg_run_info *info, char *err, size_t errlen);

/* Every output of l into out[g] (unused where l does not answer g), with
 * info[g] filled for each. Stops at the first failure. */
CG_EXPORT int cg_engine_run_layer(cg_engine *e, const cg_layer *l,
                                  const void *const in[3],
                                  void *const out[CG_GRAD_COUNT],
                                  cg_run_info info[CG_GRAD_COUNT], char *err,
                                  size_t errlen);

/* The OpenMP threads runs use (see cg_engine_set_threads). */
CG_EXPORT int cg_engine_threads(const cg_engine *e);

/* Sets the OpenMP threads of the runs that follow (>= 1) and, when cpus
 * is not NULL, pins thread i of their team to core cpus[i] (thread 0 is
 * the calling thread): team threads are created once per calling thread
 * and keep the affinity they were created with, so a thread pinned to one
 * core would otherwise get a team crowded onto that core. Primitives are
 * cached per thread count, as oneDNN sizes them for it. Returns 0,
 * CG_EINVAL (threads < 1) or CG_EBACKEND (a core cannot be used). Not
 * thread-safe for one e. */
CG_EXPORT int cg_engine_set_threads(cg_engine *e, int threads, const int *cpus,
                                    char *err, size_t errlen);

/* Frees the buffers runs share (tensors in oneDNN's layouts, the
 * scratchpad), which otherwise stay at the largest size any run needed;
 * the next run allocates what it needs again. Returns the bytes freed.
 * Cached problems stay. Not thread-safe for one e. */
CG_EXPORT size_t cg_engine_release(cg_engine *e);

/* Number of problems cached in e. */
CG_EXPORT size_t cg_engine_cache_size(const cg_engine *e);

/* Counts the runs of every problem cached in e from zero again, so that
 * runs made for the engine's own sake (a server's warm-up, on zeroed
 * inputs) do not use up a caller's first runs (cg_run_info.runs), which
 * the result checks always verify. Not thread-safe for one e. */
CG_EXPORT void cg_engine_forget_runs(cg_engine *e);

/* 1 when a run of geom on e, with its current thread count, takes its
 * primitives from e's cache and creates none (a new problem's primitive
 * creation, oneDNN's JIT compile, cost 0.2-0.8 ms for a tiny one here,
 * a hundred times its run); else 0, also for a geom e would refuse.
 * Leaves the recency order as it is. Not thread-safe for one e. */
CG_EXPORT int cg_engine_cached(const cg_engine *e, const cg_geom *geom);
/* 1 when every output of l is cached on e (cg_engine_cached; diff_bias
 * needs no primitive). Not thread-safe for one e. */
CG_EXPORT int cg_engine_layer_cached(const cg_engine *e, const cg_layer *l);
/* A 64-bit hash of what defines l's primitives, the thread count aside:
 * layers that make the same primitives hash equal. Thread-safe. */
CG_EXPORT uint64_t cg_layer_primitives_hash(const cg_layer *l);

/* 1 when dt runs natively on this CPU in oneDNN, 0 when it goes through
 * f32. Thread-safe. */
CG_EXPORT int cg_backend_dtype_native(cg_dtype dt);
/* oneDNN version ("2.6.3") and the CPU ISA oneDNN dispatches to
 * ("avx512_core_amx"); static strings, thread-safe. */
CG_EXPORT const char *cg_backend_version(void);
CG_EXPORT const char *cg_backend_isa(void);

#ifdef __cplusplus
}
#endif
#endif
