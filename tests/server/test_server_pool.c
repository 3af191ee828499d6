/* test_server_pool.c - unit tests of the worker pool (server/pool.c): a
 * job submitted from a core wakes the idle worker pinned to that core; at
 * most workers + queue-depth places are held, and a finished job gives its
 * place back; a burst of jobs through a small queue all run correctly and
 * come back. */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cg/error.h"
#include "cgs_config.h"
#include "cgs_pool.h"
#include "ts.h"

#define NJOBS 8

typedef struct fixture {
  cgs_config cfg;
  uv_loop_t loop;
  cgs_pool *pool;
  ts_problem tp;
  cgs_job jobs[NJOBS];
  void *out[NJOBS];
  int done;
} fixture;

static void on_done(cgs_job *job, void *data) {
  fixture *f = data;
  (void)job;
  f->done++;
}

/* Runs the loop until n jobs in all have come back. */
static void wait_done(fixture *f, int n) {
  while (f->done < n)
    uv_run(&f->loop, UV_RUN_ONCE);
}

static void wait_idle(fixture *f) {
  for (int i = 0; i < 5000 && cgs_pool_idle(f->pool) < f->cfg.workers; i++)
    usleep(1000);
  assert_int_equal(cgs_pool_idle(f->pool), f->cfg.workers);
}

static void job_init(fixture *f, int i) {
  memset(&f->jobs[i], 0, sizeof f->jobs[i]);
  f->jobs[i].geom = &f->tp.g;
  f->jobs[i].in0 = f->tp.in[0];
  f->jobs[i].in1 = f->tp.in[1];
  f->jobs[i].out = f->out[i];
  atomic_init(&f->jobs[i].discard, 0);
}

static int setup(void **state) {
  static fixture f;
  memset(&f, 0, sizeof f);
  char err[256];
  if (cgs_config_defaults(&f.cfg, err, sizeof err) != 0 ||
      cgs_config_set(&f.cfg, "workers", "2", err, sizeof err) != 0 ||
      cgs_config_set(&f.cfg, "cpus", "0,1", err, sizeof err) != 0 ||
      cgs_config_set(&f.cfg, "queue-depth", "3", err, sizeof err) != 0 ||
      cgs_config_finish(&f.cfg, err, sizeof err) != 0)
    return -1;
  ts_desc d = {.op = CG_OP_CONV_BWD_DATA,
               .dtype = CG_DTYPE_F32,
               .dfmt = CG_DATA_NXC,
               .groups = 1,
               .mb = 2,
               .ic = 8,
               .oc = 8,
               .nsp = 2,
               .is = {10, 10},
               .ks = {3, 3},
               .stride = 1,
               .pad = 1,
               .dil = 1,
               .seed = 5};
  if (ts_problem_init(&f.tp, &d) != 0 || ts_problem_reference(&f.tp) != 0)
    return -1;
  for (int i = 0; i < NJOBS; i++)
    if (!(f.out[i] = calloc(1, f.tp.g.out_bytes)))
      return -1;
  uv_loop_init(&f.loop);
  if (cgs_pool_new(&f.pool, &f.loop, &f.cfg, on_done, &f, err, sizeof err))
    return -1;
  *state = &f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  cgs_pool_close(f->pool);
  uv_run(&f->loop, UV_RUN_DEFAULT);
  uv_loop_close(&f->loop);
  for (int i = 0; i < NJOBS; i++)
    free(f->out[i]);
  ts_problem_free(&f->tp);
  return 0;
}

static int pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void test_wakes_the_worker_on_this_core(void **state) {
  fixture *f = *state;
  cpu_set_t allowed;
  sched_getaffinity(0, sizeof allowed, &allowed);
  if (!CPU_ISSET(0, &allowed) || !CPU_ISSET(1, &allowed))
    skip(); /* needs cores 0 and 1 */
  for (int round = 0; round < 4; round++) {
    int cpu = round % 2;
    wait_idle(f);
    assert_int_equal(pin_to(cpu), 0);
    job_init(f, 0);
    int done = f->done;
    assert_int_equal(cgs_pool_reserve(f->pool), 0);
    cgs_pool_submit(f->pool, &f->jobs[0]);
    wait_done(f, done + 1);
    assert_int_equal(f->jobs[0].rc, 0);
    /* worker i is pinned to --cpus entry i */
    assert_int_equal(f->jobs[0].worker, (unsigned)cpu);
    assert_int_equal(ts_problem_check(&f->tp, f->out[0]), 0);
  }
  pthread_setaffinity_np(pthread_self(), sizeof allowed, &allowed);
}

static void test_burst_runs_every_job(void **state) {
  fixture *f = *state;
  wait_idle(f);
  int done = f->done;
  /* Two run at once and three may wait (--queue-depth 3): five places.
   * Hold them all, check that a sixth is refused, then submit as fast as
   * places come back, running the loop while none is free. */
  for (int i = 0; i < 5; i++)
    assert_int_equal(cgs_pool_reserve(f->pool), 0);
  assert_int_equal(cgs_pool_reserve(f->pool), CG_ELIMIT);
  cgs_pool_unreserve(f->pool); /* one given back unused */
  assert_int_equal(cgs_pool_reserve(f->pool), 0);
  for (int i = 0; i < NJOBS; i++) {
    job_init(f, i);
    if (i >= 5)
      while (cgs_pool_reserve(f->pool) == CG_ELIMIT)
        uv_run(&f->loop, UV_RUN_ONCE);
    cgs_pool_submit(f->pool, &f->jobs[i]);
  }
  wait_done(f, done + NJOBS);
  /* Every place has come back. */
  for (int i = 0; i < 5; i++)
    assert_int_equal(cgs_pool_reserve(f->pool), 0);
  assert_int_equal(cgs_pool_reserve(f->pool), CG_ELIMIT);
  for (int i = 0; i < 5; i++)
    cgs_pool_unreserve(f->pool);
  for (int i = 0; i < NJOBS; i++) {
    assert_int_equal(f->jobs[i].rc, 0);
    assert_int_equal(ts_problem_check(&f->tp, f->out[i]), 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wakes_the_worker_on_this_core),
      cmocka_unit_test(test_burst_runs_every_job),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
