/* test_cache.c - the engine's problem cache (hits, LRU eviction at
 * capacity, identical results from cached primitives) and engines running
 * concurrently on several threads. */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cg/dtype.h"
#include "cg/engine.h"
#include "cg/layer.h"
#include "cg/reference.h"
#include "et.h"

/* A problem with inputs and its reference result. */
typedef struct fixture {
  et_case c;
  cg_op op;
  cg_geom g;
  void *in0, *in1, *ref;
  double tol;
} fixture;

static void fixture_init(fixture *f, et_rng *r, cg_op op, cg_dtype dt) {
  char err[256];
  memset(f, 0, sizeof *f);
  f->op = op;
  et_case_random(r, &f->c, op >= CG_OP_DECONV_BWD_DATA, dt);
  f->g = et_resolve(&f->c, op);
  f->in0 = et_random_tensor(r, dt, f->g.in_elems[0]);
  f->in1 = et_random_tensor(r, dt, f->g.in_elems[1]);
  f->ref = et_alloc(f->g.out_bytes);
  assert_int_equal(
      cg_reference_run(&f->g, f->in0, f->in1, f->ref, err, sizeof err), 0);
  f->tol = et_tolerance(&f->g, et_max_abs(dt, f->ref, f->g.out_elems),
                        et_max_abs(dt, f->in0, f->g.in_elems[0]),
                        et_max_abs(dt, f->in1, f->g.in_elems[1]));
}

static void fixture_free(fixture *f) {
  free(f->in0);
  free(f->in1);
  free(f->ref);
}

/* Runs f on e into out; returns the run's cache_hit flag. */
static int run(cg_engine *e, const fixture *f, void *out) {
  char err[256];
  cg_run_info info;
  if (cg_engine_run(e, &f->g, f->in0, f->in1, out, &info, err, sizeof err))
    fail_msg("engine failed: %s", err);
  return info.cache_hit;
}

static int correct(const fixture *f, const void *out) {
  et_diff d = et_compare(f->g.dtype, out, f->ref, f->g.out_elems);
  return d.max_err <= f->tol;
}

static void test_hits_and_lru_eviction(void **state) {
  (void)state;
  static const cg_op ops[4] = {CG_OP_CONV_BWD_DATA, CG_OP_CONV_BWD_WEIGHTS,
                               CG_OP_DECONV_BWD_DATA, CG_OP_DECONV_BWD_WEIGHTS};
  et_rng r = {42};
  fixture f[4];
  cg_engine *e;
  cg_engine_config cfg = {1, 3};
  char err[256];
  void *out[4], *again;

  for (int i = 0; i < 4; i++) {
    fixture_init(&f[i], &r, ops[i], CG_DTYPE_F32);
    out[i] = et_alloc(f[i].g.out_bytes);
  }
  assert_int_equal(cg_engine_new(&e, &cfg, err, sizeof err), 0);
  assert_int_equal(cg_engine_cache_size(e), 0);

  /* A (miss), A (hit, same bits), B, C: full at 3. */
  assert_false(run(e, &f[0], out[0]));
  assert_true(correct(&f[0], out[0]));
  again = et_alloc(f[0].g.out_bytes);
  assert_true(run(e, &f[0], again));
  assert_memory_equal(again, out[0], f[0].g.out_bytes);
  free(again);
  assert_false(run(e, &f[1], out[1]));
  assert_false(run(e, &f[2], out[2]));
  assert_int_equal(cg_engine_cache_size(e), 3);

  /* Touch A so B is now least recently used; D evicts B, not A. */
  assert_true(run(e, &f[0], out[0]));
  assert_false(run(e, &f[3], out[3]));
  assert_int_equal(cg_engine_cache_size(e), 3);
  assert_true(run(e, &f[0], out[0]));
  assert_true(run(e, &f[2], out[2]));
  assert_true(run(e, &f[3], out[3]));
  assert_false(run(e, &f[1], out[1])); /* B was evicted: rebuilt */
  assert_int_equal(cg_engine_cache_size(e), 3);
  for (int i = 0; i < 4; i++)
    assert_true(correct(&f[i], out[i]));

  /* Same problem in another dtype or layout is a different entry. */
  fixture g;
  et_rng r2 = {42};
  fixture_init(&g, &r2, ops[0], CG_DTYPE_BF16);
  void *o = et_alloc(g.g.out_bytes);
  assert_false(run(e, &g, o));
  assert_true(correct(&g, o));
  free(o);
  fixture_free(&g);

  cg_engine_free(e);
  for (int i = 0; i < 4; i++) {
    fixture_free(&f[i]);
    free(out[i]);
  }
}

#define NFIX 8
#define ROUNDS 4

typedef struct worker {
  pthread_t tid;
  const fixture *fix;
  int threads;
  void *out[NFIX];
  int failures, ok;
  char err[256];
} worker;

/* Each worker owns its engine and runs every fixture ROUNDS times,
 * keeping the last result of each. */
static void *worker_main(void *arg) {
  worker *w = arg;
  cg_engine *e;
  cg_engine_config cfg = {w->threads, 4}; /* < NFIX: evicts as it goes */
  if (cg_engine_new(&e, &cfg, w->err, sizeof w->err)) {
    w->failures++;
    return NULL;
  }
  for (int r = 0; r < ROUNDS; r++)
    for (int i = 0; i < NFIX; i++) {
      const fixture *f = &w->fix[i];
      if (cg_engine_run(e, &f->g, f->in0, f->in1, w->out[i], NULL, w->err,
                        sizeof w->err))
        w->failures++;
      else
        w->ok += correct(f, w->out[i]);
    }
  cg_engine_free(e);
  return NULL;
}

static void run_workers(const fixture *fix, worker *w, int n,
                        const int *threads) {
  for (int k = 0; k < n; k++) {
    memset(&w[k], 0, sizeof w[k]);
    w[k].fix = fix;
    w[k].threads = threads[k];
    for (int i = 0; i < NFIX; i++)
      w[k].out[i] = et_alloc(fix[i].g.out_bytes);
  }
  for (int k = 0; k < n; k++)
    assert_int_equal(pthread_create(&w[k].tid, NULL, worker_main, &w[k]), 0);
  for (int k = 0; k < n; k++)
    assert_int_equal(pthread_join(w[k].tid, NULL), 0);
  for (int k = 0; k < n; k++) {
    if (w[k].failures)
      fail_msg("worker %d: %d failed runs, last: %s", k, w[k].failures,
               w[k].err);
    assert_int_equal(w[k].ok, NFIX * ROUNDS);
  }
}

static void free_workers(worker *w, int n) {
  for (int k = 0; k < n; k++)
    for (int i = 0; i < NFIX; i++)
      free(w[k].out[i]);
}

static void test_concurrent_engines(void **state) {
  (void)state;
  static const cg_dtype dts[2] = {CG_DTYPE_F32, CG_DTYPE_BF16};
  et_rng r = {7};
  fixture fix[NFIX];
  worker w[3];

  for (int i = 0; i < NFIX; i++)
    fixture_init(&fix[i], &r, (cg_op)(1 + i % 4), dts[(i / 4) % 2]);

  /* Two engines with the same thread count: bit-identical results. */
  static const int same[2] = {1, 1};
  run_workers(fix, w, 2, same);
  for (int i = 0; i < NFIX; i++)
    assert_memory_equal(w[0].out[i], w[1].out[i], fix[i].g.out_bytes);
  free_workers(w, 2);

  /* Different OpenMP thread counts at once: each correct. */
  static const int mixed[3] = {1, 2, 1};
  run_workers(fix, w, 3, mixed);
  free_workers(w, 3);

  for (int i = 0; i < NFIX; i++)
    fixture_free(&fix[i]);
}

/* The engine runs with its own OpenMP thread count and gives the calling
 * thread its own back. */
static void test_thread_count_restored(void **state) {
  (void)state;
  et_rng r = {5};
  fixture f;
  cg_engine *e;
  cg_engine_config cfg = {1, 0};
  char err[256];
  fixture_init(&f, &r, CG_OP_CONV_BWD_WEIGHTS, CG_DTYPE_F32);
  void *out = et_alloc(f.g.out_bytes);
  assert_int_equal(cg_engine_new(&e, &cfg, err, sizeof err), 0);
  omp_set_num_threads(3);
  run(e, &f, out);
  assert_int_equal(omp_get_max_threads(), 3);
  assert_true(correct(&f, out));
  cg_engine_free(e);
  free(out);
  fixture_free(&f);
}

/* Primitives oneDNN made for one thread count are never run with
 * another: a new count is a new cache entry, an old one a hit, and every
 * run reports the threads it had and computes the right result. */
static void test_keyed_on_thread_count(void **state) {
  (void)state;
  et_rng r = {9};
  fixture f;
  cg_engine *e;
  cg_engine_config cfg = {1, 0};
  cg_run_info info;
  char err[256];
  fixture_init(&f, &r, CG_OP_CONV_BWD_DATA, CG_DTYPE_F32);
  void *out = et_alloc(f.g.out_bytes);
  assert_int_equal(cg_engine_new(&e, &cfg, err, sizeof err), 0);
  static const struct {
    int threads, hit;
    size_t cached;
  } steps[] = {{1, 0, 1}, {1, 1, 1}, {2, 0, 2},
               {2, 1, 2}, {1, 1, 2}, {3, 0, 3}};
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    assert_int_equal(
        cg_engine_set_threads(e, steps[i].threads, NULL, err, sizeof err), 0);
    memset(out, 0, f.g.out_bytes);
    assert_int_equal(
        cg_engine_run(e, &f.g, f.in0, f.in1, out, &info, err, sizeof err), 0);
    assert_int_equal(info.threads, steps[i].threads);
    assert_int_equal(info.cache_hit, steps[i].hit);
    assert_int_equal(cg_engine_cache_size(e), steps[i].cached);
    assert_true(correct(&f, out));
  }
  assert_int_equal(cg_engine_set_threads(e, 0, NULL, err, sizeof err),
                   CG_EINVAL);
  assert_non_null(strstr(err, "threads"));
  cg_engine_free(e);
  free(out);
  fixture_free(&f);
}

/* Released buffers come back on the next run, with the same result and
 * the problem still cached. f16 in NCX needs reorders, so there are
 * buffers to free. */
static void test_release_buffers(void **state) {
  (void)state;
  et_rng r = {77};
  char err[256];
  cg_engine *e;
  assert_int_equal(cg_engine_new(&e, NULL, err, sizeof err), 0);
  size_t freed_any = 0;
  for (int i = 0; i < 8; i++) {
    fixture f;
    fixture_init(&f, &r, (cg_op)(CG_OP_CONV_BWD_DATA + i % 4),
                 i % 2 ? CG_DTYPE_F16 : CG_DTYPE_BF16);
    void *out = et_alloc(f.g.out_bytes);
    run(e, &f, out);
    freed_any += cg_engine_release(e);
    assert_int_equal(cg_engine_release(e), 0); /* nothing left to free */
    memset(out, 0, f.g.out_bytes);
    assert_int_equal(run(e, &f, out), 1); /* still cached */
    assert_true(correct(&f, out));
    free(out);
    fixture_free(&f);
  }
  assert_true(freed_any > 0);
  cg_engine_free(e);
}

/* The cache query: true exactly when a run would be a hit (per thread
 * count), without touching the recency order: the entry a query found is
 * still the one evicted next. */
static void test_cached_query(void **state) {
  (void)state;
  et_rng r = {5};
  fixture f[3];
  cg_engine *e;
  cg_engine_config cfg = {1, 2};
  char err[256];
  for (int i = 0; i < 3; i++)
    fixture_init(&f[i], &r, (cg_op)(CG_OP_CONV_BWD_DATA + i), CG_DTYPE_F32);
  assert_int_equal(cg_engine_new(&e, &cfg, err, sizeof err), 0);
  void *out = et_alloc(f[0].g.out_bytes + f[1].g.out_bytes + f[2].g.out_bytes);
  assert_false(cg_engine_cached(e, &f[0].g));
  assert_false(run(e, &f[0], out));
  assert_true(cg_engine_cached(e, &f[0].g));
  assert_false(cg_engine_cached(e, &f[1].g));
  assert_false(run(e, &f[1], out));
  /* f[0] is least recently used; the query must leave it so. */
  assert_true(cg_engine_cached(e, &f[0].g));
  assert_false(run(e, &f[2], out));
  assert_false(cg_engine_cached(e, &f[0].g));
  assert_true(cg_engine_cached(e, &f[1].g));
  assert_true(cg_engine_cached(e, &f[2].g));
  assert_int_equal(cg_engine_cache_size(e), 2);
  /* Keyed on the thread count, as runs are. */
  assert_int_equal(cg_engine_set_threads(e, 2, NULL, err, sizeof err), 0);
  assert_false(cg_engine_cached(e, &f[2].g));
  assert_int_equal(cg_engine_set_threads(e, 1, NULL, err, sizeof err), 0);
  assert_true(cg_engine_cached(e, &f[2].g));
  /* A geometry the engine refuses is never cached. */
  cg_geom bad = f[2].g;
  bad.nsp = CG_MAX_SPATIAL + 1;
  assert_false(cg_engine_cached(e, &bad));
  assert_true(run(e, &f[2], out));
  assert_true(correct(&f[2], out));
  cg_engine_free(e);
  free(out);
  for (int i = 0; i < 3; i++)
    fixture_free(&f[i]);
}

static cg_layer layer_of(const et_case *c, unsigned grads) {
  char err[256];
  et_problem ep;
  cg_layer l;
  et_problem_build(&ep, c, CG_OP_CONV_BWD);
  ep.p.grads = grads;
  if (cg_layer_resolve(&ep.p, &l, err, sizeof err))
    fail_msg("layer rejected: %s", err);
  return l;
}

/* A layer is cached when each of its primitives is; its hash is the same
 * for layers that make the same primitives and differs with the outputs
 * asked for or the dtype. */
static void test_layer_cached_and_hash(void **state) {
  (void)state;
  et_rng r = {6};
  et_case c, c16;
  char err[256];
  et_case_random(&r, &c, 0, CG_DTYPE_F32);
  c16 = c;
  c16.dtype = CG_DTYPE_BF16;
  cg_layer l = layer_of(&c, 0), same = layer_of(&c, 0);
  cg_layer data_only = layer_of(&c, CG_GRAD_BIT(CG_GRAD_DIFF_SRC));
  cg_layer bf16 = layer_of(&c16, 0);
  assert_true(cg_layer_primitives_hash(&l) == cg_layer_primitives_hash(&same));
  assert_true(cg_layer_primitives_hash(&l) !=
              cg_layer_primitives_hash(&data_only));
  assert_true(cg_layer_primitives_hash(&l) != cg_layer_primitives_hash(&bf16));

  cg_engine *e;
  cg_engine_config cfg = {1, 0};
  assert_int_equal(cg_engine_new(&e, &cfg, err, sizeof err), 0);
  const void *in[3];
  void *out[CG_GRAD_COUNT];
  cg_run_info info[CG_GRAD_COUNT];
  for (int t = 0; t < 3; t++)
    in[t] = et_random_tensor(&r, c.dtype, l.in_bytes[t] / sizeof(float));
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    out[g] = et_alloc(l.out_bytes[g]);
  assert_false(cg_engine_layer_cached(e, &data_only));
  assert_int_equal(
      cg_engine_run_layer(e, &data_only, in, out, info, err, sizeof err), 0);
  assert_true(cg_engine_layer_cached(e, &data_only));
  assert_false(cg_engine_layer_cached(e, &l)); /* diff_weights is not */
  assert_int_equal(cg_engine_run_layer(e, &l, in, out, info, err, sizeof err),
                   0);
  assert_true(cg_engine_layer_cached(e, &l));
  assert_false(cg_engine_layer_cached(e, &bf16));
  cg_engine_free(e);
  for (int t = 0; t < 3; t++)
    free((void *)in[t]);
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    free(out[g]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cached_query),
      cmocka_unit_test(test_layer_cached_and_hash),
      cmocka_unit_test(test_hits_and_lru_eviction),
      cmocka_unit_test(test_concurrent_engines),
      cmocka_unit_test(test_thread_count_restored),
      cmocka_unit_test(test_keyed_on_thread_count),
      cmocka_unit_test(test_release_buffers),
  };
  return cmocka_run_group_tests_name("engine_cache", tests, NULL, NULL);
}
