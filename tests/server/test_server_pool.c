/* test_server_pool.c - unit tests of the worker pool (server/pool.c): a
 * job submitted from a core wakes the idle worker pinned to that core; at
 * most workers + queue-depth places are held, and a finished job gives its
 * place back; a burst of jobs through a small queue all run correctly and
 * come back; a caller's job passes another's waiting line, and a
 * caller's data-gradient job its own waiting weight-gradient job. Under the
 * adaptive policy a lone job runs on every core, one
 * team thread on each; two jobs at once get a core each; a job never
 * starts on a core lent to another. The layers given to warm up are in
 * every worker's cache before its first job, at the thread counts a job
 * gets, and the pool says once when all are warm. */
#include <dirent.h>
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
  cgs_pool *pool;
  ts_problem tp;
  ts_problem big;         /* some milliseconds of work */
  ts_problem slow;        /* tens of milliseconds (no reference: its result is
                             not checked) */
  ts_problem big_weights; /* big's shape, ConvolutionBackwardWeights */
  cg_layer tp_layer, big_layer, slow_layer, big_weights_layer;
  cg_layer warm_layers[2]; /* tp's and big's, warmed up at the start */
  int warmed;              /* under mu: the pool's warm-up done calls */
  cgs_job jobs[NJOBS];
  void *out[NJOBS];
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;                              /* under mu: jobs handed back */
  uint64_t flow, other_flow, third_flow; /* the fair queue's state of three
                                            callers */
} fixture;

/* On the worker that ran job. */
static void on_done(cgs_job *job, void *data) {
  fixture *f = data;
  (void)job;
  pthread_mutex_lock(&f->mu);
  f->done++;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
}

/* On the last worker to warm up. */
static void on_warm(void *data) {
  fixture *f = data;
  pthread_mutex_lock(&f->mu);
  f->warmed++;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
}

static int done_count(fixture *f) {
  pthread_mutex_lock(&f->mu);
  int n = f->done;
  pthread_mutex_unlock(&f->mu);
  return n;
}

/* Waits until n jobs in all have come back. */
static void wait_done(fixture *f, int n) {
  pthread_mutex_lock(&f->mu);
  while (f->done < n)
    pthread_cond_wait(&f->cv, &f->mu);
  pthread_mutex_unlock(&f->mu);
}

static void wait_idle(fixture *f) {
  for (int i = 0; i < 5000 && cgs_pool_idle(f->pool) < f->cfg.workers; i++)
    usleep(1000);
  assert_int_equal(cgs_pool_idle(f->pool), f->cfg.workers);
}

/* Job i computes the one output of l from p's inputs into f->out[i]. */
static void job_set(fixture *f, int i, const cg_layer *l, const ts_problem *p) {
  memset(&f->jobs[i], 0, sizeof f->jobs[i]);
  f->jobs[i].layer = l;
  f->jobs[i].in[0] = p->in[0];
  f->jobs[i].in[1] = p->in[1];
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    if (l->grads & CG_GRAD_BIT(g))
      f->jobs[i].out[g] = f->out[i];
  atomic_init(&f->jobs[i].discard, 0);
}

static void job_init(fixture *f, int i) {
  job_set(f, i, &f->tp_layer, &f->tp);
}

/* The run figures of a job's one output. */
static const cg_run_info *info_of(const cgs_job *job) {
  int g = __builtin_ctz(job->layer->grads);
  return &job->info[g];
}

static int setup(void **state) {
  static fixture f;
  memset(&f, 0, sizeof f);
  char err[256];
  if (cgs_config_defaults(&f.cfg, err, sizeof err) != 0 ||
      cgs_config_set(&f.cfg, "workers", "2", err, sizeof err) != 0 ||
      cgs_config_set(&f.cfg, "cpus", "0,1", err, sizeof err) != 0 ||
      cgs_config_set(&f.cfg, "queue-depth", "3", err, sizeof err) != 0 ||
      cgs_config_set(&f.cfg, "threads-policy", "adaptive", err, sizeof err) !=
          0 ||
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
  d.mb = 8, d.ic = d.oc = 64, d.is[0] = d.is[1] = 28;
  if (ts_problem_init(&f.big, &d) != 0 || ts_problem_reference(&f.big) != 0)
    return -1;
  d.op = CG_OP_CONV_BWD_WEIGHTS;
  if (ts_problem_init(&f.big_weights, &d) != 0 ||
      ts_problem_reference(&f.big_weights) != 0)
    return -1;
  d.op = CG_OP_CONV_BWD_DATA;
  d.mb = 64;
  if (ts_problem_init(&f.slow, &d) != 0)
    return -1;
  cg_layer_of_geom(&f.tp.g, &f.tp_layer);
  cg_layer_of_geom(&f.big.g, &f.big_layer);
  cg_layer_of_geom(&f.slow.g, &f.slow_layer);
  cg_layer_of_geom(&f.big_weights.g, &f.big_weights_layer);
  size_t most = f.slow.g.out_bytes; /* the largest output */
  for (int i = 0; i < NJOBS; i++)
    if (!(f.out[i] = calloc(1, most)))
      return -1;
  pthread_mutex_init(&f.mu, NULL);
  pthread_cond_init(&f.cv, NULL);
  f.warm_layers[0] = f.tp_layer;
  f.warm_layers[1] = f.big_layer;
  cgs_pool_warm warm = {f.warm_layers, 2, on_warm, &f};
  if (cgs_pool_new(&f.pool, &f.cfg, &warm, on_done, &f, err, sizeof err))
    return -1;
  pthread_mutex_lock(&f.mu);
  while (!f.warmed)
    pthread_cond_wait(&f.cv, &f.mu);
  pthread_mutex_unlock(&f.mu);
  *state = &f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  cgs_pool_close(f->pool);
  pthread_mutex_destroy(&f->mu);
  pthread_cond_destroy(&f->cv);
  for (int i = 0; i < NJOBS; i++)
    free(f->out[i]);
  ts_problem_free(&f->tp);
  ts_problem_free(&f->big);
  ts_problem_free(&f->slow);
  ts_problem_free(&f->big_weights);
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
    int done = done_count(f);
    assert_int_equal(cgs_pool_reserve(f->pool), 0);
    cgs_pool_submit(f->pool, &f->jobs[0], &f->flow);
    wait_done(f, done + 1);
    assert_int_equal(f->jobs[0].rc, 0);
    /* worker i is pinned to --cpus entry i */
    assert_int_equal(f->jobs[0].worker, (unsigned)cpu);
    assert_int_equal(ts_problem_check(&f->tp, f->out[0]), 0);
  }
  pthread_setaffinity_np(pthread_self(), sizeof allowed, &allowed);
}

/* Runs job 0 of layer l on p alone on an idle pool and returns whether
 * its primitives came from the cache. */
static int first_run_cached(fixture *f, const cg_layer *l, ts_problem *p) {
  wait_idle(f);
  job_set(f, 0, l, p);
  int done = done_count(f);
  assert_int_equal(cgs_pool_reserve(f->pool), 0);
  cgs_pool_submit(f->pool, &f->jobs[0], &f->flow);
  wait_done(f, done + 1);
  assert_int_equal(f->jobs[0].rc, 0);
  return info_of(&f->jobs[0])->cache_hit;
}

/* Runs first: the warmed layers hit on their first job, on each worker
 * and at the borrowed team's thread count (big), and a layer not warmed
 * misses. */
static void test_warmed_layers_are_cached(void **state) {
  fixture *f = *state;
  assert_int_equal(f->warmed, 1);
  assert_int_equal(first_run_cached(f, &f->big_layer, &f->big), 1);
  assert_int_equal(info_of(&f->jobs[0])->threads, 2); /* it borrowed */
  assert_int_equal(ts_problem_check(&f->big, f->out[0]), 0);
  assert_int_equal(first_run_cached(f, &f->tp_layer, &f->tp), 1);
  assert_int_equal(ts_problem_check(&f->tp, f->out[0]), 0);
  assert_int_equal(first_run_cached(f, &f->slow_layer, &f->slow), 0);
}

static void test_burst_runs_every_job(void **state) {
  fixture *f = *state;
  wait_idle(f);
  int done = done_count(f);
  /* Two run at once and three may wait (--queue-depth 3): five places.
   * Hold them all, check that a sixth is refused, then submit as fast as
   * places come back, polling while none is free. */
  for (int i = 0; i < 5; i++)
    assert_int_equal(cgs_pool_reserve(f->pool), 0);
  assert_int_equal(cgs_pool_reserve(f->pool), CG_ELIMIT);
  cgs_pool_unreserve(f->pool); /* one given back unused */
  assert_int_equal(cgs_pool_reserve(f->pool), 0);
  for (int i = 0; i < NJOBS; i++) {
    job_init(f, i);
    if (i >= 5)
      while (cgs_pool_reserve(f->pool) == CG_ELIMIT)
        usleep(100);
    cgs_pool_submit(f->pool, &f->jobs[i], &f->flow);
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

static int have_two_cores(void) {
  cpu_set_t allowed;
  sched_getaffinity(0, sizeof allowed, &allowed);
  return CPU_ISSET(0, &allowed) && CPU_ISSET(1, &allowed);
}

static void big_job(fixture *f, int i) {
  job_set(f, i, &f->big_layer, &f->big);
}

/* When job ran, in ms of uv_hrtime. */
static double started(const cgs_job *job) {
  return (double)job->t_submit / 1e6 + job->queue_ms;
}
static double ended(const cgs_job *job) {
  return started(job) + info_of(job)->compute_ms;
}

/* The core the only thread named name, pinned to a single core, is pinned
 * to, other than not_cpu; -1 when there is none. Team threads take the
 * name of the worker that started them. */
static int team_core(const char *name, int not_cpu) {
  DIR *d = opendir("/proc/self/task");
  struct dirent *de;
  int found = -1;
  while (d && (de = readdir(d))) {
    char path[300], comm[32] = "";
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", de->d_name);
    FILE *fp = fopen(path, "r");
    if (!fp)
      continue;
    if (!fgets(comm, sizeof comm, fp))
      comm[0] = '\0';
    fclose(fp);
    comm[strcspn(comm, "\n")] = '\0';
    cpu_set_t set;
    if (strcmp(comm, name) != 0 ||
        sched_getaffinity(atoi(de->d_name), sizeof set, &set) != 0 ||
        CPU_COUNT(&set) != 1)
      continue;
    for (int c = 0; c < CPU_SETSIZE; c++)
      if (CPU_ISSET(c, &set) && c != not_cpu)
        found = c;
  }
  if (d)
    closedir(d);
  return found;
}

/* An idle pool gives a lone job every core, and its second OpenMP thread
 * really runs on the other core, not beside the first. */
static void test_lone_job_takes_every_core(void **state) {
  fixture *f = *state;
  if (!have_two_cores())
    skip();
  for (int round = 0; round < 2; round++) {
    wait_idle(f);
    big_job(f, 0);
    int done = done_count(f);
    assert_int_equal(cgs_pool_reserve(f->pool), 0);
    cgs_pool_submit(f->pool, &f->jobs[0], &f->flow);
    wait_done(f, done + 1);
    assert_int_equal(f->jobs[0].rc, 0);
    assert_int_equal(info_of(&f->jobs[0])->threads, 2);
    unsigned w = f->jobs[0].worker;
    int other = f->cfg.cpus.cpu[1 - w];
    assert_int_equal(
        team_core(cgs_pool_worker_name(f->pool, w), f->cfg.cpus.cpu[w]), other);
    assert_int_equal(ts_problem_check(&f->big, f->out[0]), 0);
  }
}

/* Jobs that find the other worker busy run side by side, a core each:
 * whenever two jobs overlap, each has one thread. A burst of four makes
 * that happen whatever the first does (on a wake-up that preempts this
 * thread it takes both cores before the others arrive, then they queue).
 * The jobs are the slow ones, tens of milliseconds each: with jobs of a
 * few, a machine loaded by other work woke the second worker only after
 * the first had run them all. Their results are the other tests' to
 * check. */
static void test_jobs_at_once_get_a_core_each(void **state) {
  fixture *f = *state;
  if (!have_two_cores())
    skip();
  wait_idle(f);
  int done = done_count(f), overlaps = 0;
  for (int i = 0; i < 4; i++) {
    job_set(f, i, &f->slow_layer, &f->slow);
    assert_int_equal(cgs_pool_reserve(f->pool), 0);
  }
  for (int i = 0; i < 4; i++)
    cgs_pool_submit(f->pool, &f->jobs[i], &f->flow);
  wait_done(f, done + 4);
  for (int i = 0; i < 4; i++) {
    const cgs_job *a = &f->jobs[i];
    assert_int_equal(a->rc, 0);
    assert_true(info_of(a)->threads >= 1 && info_of(a)->threads <= 2);
    for (int k = i + 1; k < 4; k++) {
      const cgs_job *b = &f->jobs[k];
      if (started(b) < ended(a) && started(a) < ended(b)) {
        overlaps++;
        assert_int_equal(info_of(a)->threads, 1);
        assert_int_equal(info_of(b)->threads, 1);
        assert_int_not_equal(a->worker, b->worker);
      }
    }
  }
  assert_true(overlaps >= 1);
}

/* A job arriving while a lone job has borrowed every core waits for them
 * rather than start on a lent one, and then gets them all. */
static void test_no_job_starts_on_a_lent_core(void **state) {
  fixture *f = *state;
  if (!have_two_cores())
    skip();
  wait_idle(f);
  /* Running, with the other worker lent: no worker is idle. On a loaded
   * machine this thread may not look before the job is over: then the
   * job runs again. */
  int done = done_count(f), lent = 0;
  for (int attempt = 0; attempt < 5 && !lent; attempt++) {
    done = done_count(f);
    big_job(f, 0);
    assert_int_equal(cgs_pool_reserve(f->pool), 0);
    cgs_pool_submit(f->pool, &f->jobs[0], &f->flow);
    for (int i = 0; i < 100000 && cgs_pool_idle(f->pool) != 0; i++)
      usleep(20);
    lent = cgs_pool_idle(f->pool) == 0;
    if (!lent)
      wait_done(f, done + 1);
  }
  assert_true(lent);
  big_job(f, 1);
  assert_int_equal(cgs_pool_reserve(f->pool), 0);
  cgs_pool_submit(f->pool, &f->jobs[1], &f->flow);
  wait_done(f, done + 2);
  const cgs_job *a = &f->jobs[0], *b = &f->jobs[1];
  assert_int_equal(a->rc, 0);
  assert_int_equal(b->rc, 0);
  assert_int_equal(info_of(a)->threads, 2);
  assert_int_equal(info_of(b)->threads, 2);
  assert_true(started(b) >= ended(a) - 0.05);
  assert_int_equal(ts_problem_check(&f->big, f->out[1]), 0);
}

/* On an idle pool, takes every place and has jobs[0..1], a third
 * caller's, hold the cores for tens of milliseconds; returns the count of
 * jobs done before them. */
static int hold_cores(fixture *f) {
  wait_idle(f);
  int done = done_count(f);
  for (int i = 0; i < 5; i++) /* every place */
    assert_int_equal(cgs_pool_reserve(f->pool), 0);
  for (int i = 0; i < 2; i++) {
    job_set(f, i, &f->slow_layer, &f->slow);
    cgs_pool_submit(f->pool, &f->jobs[i], &f->third_flow);
  }
  return done;
}

/* Flows take turns: while two jobs of a third caller hold the cores for
 * tens of milliseconds, one caller queues two jobs, then another caller
 * one, which runs before the first caller's second job rather than after
 * it. */
static void test_flows_take_turns(void **state) {
  fixture *f = *state;
  int done = hold_cores(f);
  for (int i = 2; i < 5; i++) {
    big_job(f, i);
    cgs_pool_submit(f->pool, &f->jobs[i], i < 4 ? &f->flow : &f->other_flow);
  }
  wait_done(f, done + 5);
  for (int i = 0; i < 5; i++)
    assert_int_equal(f->jobs[i].rc, 0);
  for (int i = 2; i < 5; i++)
    assert_int_equal(ts_problem_check(&f->big, f->out[i]), 0);
  /* First come, first served would start it after jobs[3]. */
  assert_true(started(&f->jobs[4]) <= started(&f->jobs[3]));
}

/* While two jobs of another caller hold the cores, a caller queues two
 * weight-gradient jobs and then a data-gradient job: the last runs
 * first (its backward pass waits for it), and all are right. First come,
 * first served would start it once one of the others had ended. */
static void test_data_gradients_pass_weight_gradients(void **state) {
  fixture *f = *state;
  int done = hold_cores(f);
  for (int i = 2; i < 4; i++) {
    job_set(f, i, &f->big_weights_layer, &f->big_weights);
    cgs_pool_submit(f->pool, &f->jobs[i], &f->flow);
  }
  big_job(f, 4);
  cgs_pool_submit(f->pool, &f->jobs[4], &f->flow);
  wait_done(f, done + 5);
  for (int i = 0; i < 5; i++)
    assert_int_equal(f->jobs[i].rc, 0);
  for (int i = 2; i < 4; i++) {
    assert_int_equal(ts_problem_check(&f->big_weights, f->out[i]), 0);
    assert_true(started(&f->jobs[4]) <= started(&f->jobs[i]));
  }
  assert_int_equal(ts_problem_check(&f->big, f->out[4]), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_warmed_layers_are_cached),
      cmocka_unit_test(test_wakes_the_worker_on_this_core),
      cmocka_unit_test(test_burst_runs_every_job),
      cmocka_unit_test(test_lone_job_takes_every_core),
      cmocka_unit_test(test_jobs_at_once_get_a_core_each),
      cmocka_unit_test(test_no_job_starts_on_a_lent_core),
      cmocka_unit_test(test_flows_take_turns),
      cmocka_unit_test(test_data_gradients_pass_weight_gradients),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
