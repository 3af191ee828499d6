/* test_split_e2e.c - one call over two replicas (cgc_options.replicas):
 * against two real servers on loopback (static policy, one worker each,
 * so that both compute a part alike), every op, dtype and data layout
 * split along the minibatch gives what the unsplit call gives, within the
 * dtype's tolerance of summing the parts, and the same bits run after
 * run, blocking or asynchronous (cgc_call_start); one replica pipelines a
 * call's parts over one server; a tiny call goes whole; the
 * options are checked; a stopped replica's parts get backups on the other; and
 * a replica killed with SIGKILL in the middle of split calls costs nothing:
 * every call succeeds with the bits of the calls before the kill. */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cg/bdesc.h"
#include "cg/dtype.h"
#include "cg/layer.h"
#include "cgc/client.h"
#include "harness.h"
#include "spec.h"

static const char *server_exe;

typedef struct fixture {
  th_server srv[2];
  char list[128];     /* "127.0.0.1:A,127.0.0.1:B" */
  cgc_channel *one;   /* replica 0 alone: the unsplit calls */
  cgc_channel *split; /* both, splitting */
} fixture;

static int start_servers(fixture *f) {
  static const char *const cpu[2] = {"0", "1"};
  for (int i = 0; i < 2; i++) {
    const char *extra[] = {
        "--workers", "1", "--threads-policy", "static", "--cpus", cpu[i], NULL};
    if (th_server_start(&f->srv[i], server_exe, 0, extra) != 0)
      return -1;
  }
  snprintf(f->list, sizeof f->list, "127.0.0.1:%d,127.0.0.1:%d", f->srv[0].port,
           f->srv[1].port);
  return 0;
}

static int setup(void **state) {
  static fixture f;
  char err[256], one[64];
  memset(&f, 0, sizeof f);
  if (start_servers(&f) != 0)
    return -1;
  cgc_options o;
  cgc_options_init(&o);
  snprintf(one, sizeof one, "127.0.0.1:%d", f.srv[0].port);
  if (cgc_channel_new(&f.one, one, &o, err, sizeof err) != 0)
    return -1;
  o.replicas = 2;
  o.split_parts = 4;
  o.split_min_flops = 1000; /* the test's small problems split too */
  if (cgc_channel_new(&f.split, f.list, &o, err, sizeof err) != 0) {
    fprintf(stderr, "split channel: %s\n", err);
    return -1;
  }
  *state = &f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  cgc_channel_free(f->split);
  cgc_channel_free(f->one);
  th_server_stop(&f->srv[0]);
  th_server_stop(&f->srv[1]);
  return 0;
}

/* Calls p on ch; out[g] owned by the caller. */
static void call(cgc_channel *ch, const th_problem *p,
                 cgc_tensor *out[CG_GRAD_COUNT], cgc_result *res) {
  cgc_status st;
  int rc = cgc_compute_layer(ch, &p->req, out, res, &st);
  if (rc != 0)
    fail_msg("%s: %s", cgc_strerror(rc), st.message);
}

static void free_outs(cgc_tensor *out[CG_GRAD_COUNT]) {
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    cgc_tensor_free(out[g]);
}

/* Calls p on ch as cgc_call_start does, into buffers the size of like's
 * outputs; out[g] owned by the caller. diff_src, when asked, is waited
 * for alone first, and must be like's already (within tol_times its
 * tolerance) while the rest of the call may go on. */
static void call_async(cgc_channel *ch, const th_problem *p,
                       cgc_tensor *const like[CG_GRAD_COUNT], double tol_times,
                       cgc_tensor *out[CG_GRAD_COUNT], cgc_result *res) {
  void *data[CG_GRAD_COUNT] = {NULL};
  size_t cap[CG_GRAD_COUNT] = {0};
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    if (like[g]) {
      cap[g] = like[g]->nbytes;
      data[g] = malloc(cap[g]);
      assert_non_null(data[g]);
    }
  cgc_call *c;
  cgc_status st;
  int rc = cgc_call_start(ch, &p->req, data, cap, &c, &st);
  if (rc != 0)
    fail_msg("start: %s: %s", cgc_strerror(rc), st.message);
  const int src = CG_GRAD_DIFF_SRC;
  if (like[src]) {
    assert_int_equal(cgc_call_wait(c, CG_GRAD_BIT(src), -1, &st), 0);
    cgc_diff d;
    cgc_compare_output(&p->layer, src, data[src], like[src]->data, &d);
    if (d.max_abs > tol_times * d.tol)
      fail_msg("diff_src as soon as whole: differs by %g", d.max_abs);
  }
  cgc_tensor t[CG_GRAD_COUNT];
  rc = cgc_call_finish(c, t, res, &st);
  if (rc != 0)
    fail_msg("finish: %s: %s", cgc_strerror(rc), st.message);
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    out[g] = NULL;
    if (!like[g])
      continue;
    assert_ptr_equal(t[g].data, data[g]);
    out[g] = malloc(sizeof *out[g]);
    assert_non_null(out[g]);
    *out[g] = t[g];
  }
}

/* Split against unsplit, and split against split again, blocking and
 * asynchronous (cgc_call_start). */
static void check_split(fixture *f, const char *desc, cg_op op, cg_dtype dt,
                        cg_data_format df) {
  th_problem p;
  cgc_tensor *whole[CG_GRAD_COUNT], *a[CG_GRAD_COUNT], *b[CG_GRAD_COUNT];
  cgc_result res;
  assert_int_equal(th_problem_init(&p, desc, op, dt, df, 7), 0);
  call(f->one, &p, whole, &res);
  call(f->split, &p, a, &res);
  if (!strstr(res.worker, " parts") || res.worker[0] < '2')
    fail_msg("%s %s: not split (%s)", desc, cg_op_name(op), res.worker);
  call_async(f->split, &p, whole, 4, b, &res);
  if (!strstr(res.worker, " parts") || res.worker[0] < '2')
    fail_msg("%s %s: async not split (%s)", desc, cg_op_name(op), res.worker);
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    if (!whole[g]) {
      assert_null(a[g]);
      continue;
    }
    assert_non_null(a[g]);
    assert_int_equal(a[g]->nbytes, whole[g]->nbytes);
    assert_int_equal(a[g]->rank, whole[g]->rank);
    assert_memory_equal(a[g]->dims, whole[g]->dims,
                        sizeof(int64_t) * (size_t)whole[g]->rank);
    /* Every part's sum is rounded to the dtype once more than the
     * unsplit call's: the tolerance grows with the parts. */
    cgc_diff d;
    cgc_compare_output(&p.layer, g, a[g]->data, whole[g]->data, &d);
    if (d.max_abs > 4 * d.tol)
      fail_msg("%s %s %s %s: %s differs by %g (tolerance %g)", desc,
               cg_op_name(op), cg_dtype_name(dt), cg_data_format_name(df),
               cg_grad_name((cg_grad)g), d.max_abs, 4 * d.tol);
    if (memcmp(a[g]->data, b[g]->data, a[g]->nbytes) != 0)
      fail_msg("%s %s %s: %s not the same bits twice", desc, cg_op_name(op),
               cg_dtype_name(dt), cg_grad_name((cg_grad)g));
  }
  free_outs(whole);
  free_outs(a);
  free_outs(b);
  th_problem_free(&p);
}

static void test_every_op_and_dtype(void **state) {
  fixture *f = *state;
  static const cg_op ops[] = {CG_OP_CONV_BWD,        CG_OP_DECONV_BWD,
                              CG_OP_CONV_BWD_DATA,   CG_OP_CONV_BWD_WEIGHTS,
                              CG_OP_DECONV_BWD_DATA, CG_OP_DECONV_BWD_WEIGHTS};
  static const cg_dtype dts[] = {CG_DTYPE_F32, CG_DTYPE_BF16, CG_DTYPE_F16};
  for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
    for (size_t t = 0; t < 3; t++)
      for (int df = CG_DATA_NCX; df <= CG_DATA_NXC; df++) {
        int deconv = ops[o] == CG_OP_DECONV_BWD ||
                     ops[o] == CG_OP_DECONV_BWD_DATA ||
                     ops[o] == CG_OP_DECONV_BWD_WEIGHTS;
        /* mb 6 in 4 parts: 2, 2, 1, 1 rows. */
        check_split(f,
                    deconv ? "mb6g2ic8ih5oc4oh10kh4sh2ph1"
                           : "mb6g2ic8ih9oc12oh5kh3sh2ph1",
                    ops[o], dts[t], (cg_data_format)df);
      }
}

static void test_tiny_call_goes_whole(void **state) {
  fixture *f = *state;
  cgc_channel *ch;
  cgc_options o;
  char err[256];
  cgc_options_init(&o);
  o.replicas = 2; /* the default least work of a part: 200 MFLOP */
  assert_int_equal(cgc_channel_new(&ch, f->list, &o, err, sizeof err), 0);
  th_problem p;
  cgc_tensor *out[CG_GRAD_COUNT];
  cgc_result res;
  assert_int_equal(th_problem_init(&p, "mb6ic8ih9oc12oh9kh3ph1", CG_OP_CONV_BWD,
                                   CG_DTYPE_F32, CG_DATA_NXC, 3),
                   0);
  call(ch, &p, out, &res);
  assert_non_null(strstr(res.worker, "cg-worker"));
  cgc_tensor *again[CG_GRAD_COUNT];
  call_async(ch, &p, out, 0, again, &res); /* whole: the same bits */
  assert_non_null(strstr(res.worker, "cg-worker"));
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    assert_memory_equal(again[g]->data, out[g]->data, out[g]->nbytes);
  free_outs(again);
  free_outs(out);
  th_problem_free(&p);
  cgc_channel_free(ch);
  o.replicas = 3; /* two addresses */
  assert_int_equal(cgc_channel_new(&ch, f->list, &o, err, sizeof err),
                   CG_EINVAL);
  assert_non_null(strstr(err, "replicas: 3, but the target lists 2"));
  o.replicas = -1;
  assert_int_equal(cgc_channel_new(&ch, f->list, &o, err, sizeof err),
                   CG_EINVAL);
  o.replicas = 2;
  o.hedge_budget = 2;
  assert_int_equal(cgc_channel_new(&ch, f->list, &o, err, sizeof err),
                   CG_EINVAL);
}

/* One replica: a call's parts pipeline over one server, each part's
 * upload after the one before (chunks of 4 KiB make every part's upload
 * long enough to wait for), blocking and asynchronous alike: equal to
 * the unsplit call, and the same bits every time. With the parts left to
 * the channel (split_parts 0), the cut it chose for a shape is kept. */
static void test_one_server_pipeline(void **state) {
  fixture *f = *state;
  char one[64], err[256];
  cgc_options o;
  cgc_options_init(&o);
  o.replicas = 1;
  o.split_parts = 3;
  o.split_min_flops = 1000;
  o.upload_chunk_bytes = 4096;
  snprintf(one, sizeof one, "127.0.0.1:%d", f->srv[0].port);
  cgc_channel *ch;
  assert_int_equal(cgc_channel_new(&ch, one, &o, err, sizeof err), 0);
  th_problem p;
  cgc_tensor *whole[CG_GRAD_COUNT], *a[CG_GRAD_COUNT], *b[CG_GRAD_COUNT];
  cgc_result res;
  assert_int_equal(th_problem_init(&p, "mb6ic8ih12oc8oh12kh3ph1",
                                   CG_OP_CONV_BWD, CG_DTYPE_F32, CG_DATA_NXC,
                                   13),
                   0);
  call(f->one, &p, whole, &res);
  call(ch, &p, a, &res);
  assert_string_equal(res.worker, "3 parts");
  call_async(ch, &p, whole, 4, b, &res);
  assert_string_equal(res.worker, "3 parts");
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    cgc_diff d;
    cgc_compare_output(&p.layer, g, a[g]->data, whole[g]->data, &d);
    if (d.max_abs > 4 * d.tol)
      fail_msg("%s differs by %g (tolerance %g)", cg_grad_name((cg_grad)g),
               d.max_abs, 4 * d.tol);
    assert_memory_equal(a[g]->data, b[g]->data, a[g]->nbytes);
  }
  free_outs(a);
  free_outs(b);
  cgc_channel_free(ch);
  o.split_parts = 0;
  assert_int_equal(cgc_channel_new(&ch, one, &o, err, sizeof err), 0);
  char first[sizeof res.worker];
  call(ch, &p, a, &res);
  memcpy(first, res.worker, sizeof first);
  for (int i = 0; i < 3; i++) {
    call_async(ch, &p, whole, 4, b, &res);
    assert_string_equal(res.worker, first);
    for (int g = 0; g < CG_GRAD_COUNT; g++)
      assert_memory_equal(a[g]->data, b[g]->data, a[g]->nbytes);
    free_outs(b);
  }
  free_outs(a);
  free_outs(whole);
  th_problem_free(&p);
  cgc_channel_free(ch);
}

/* Replica 1 stopped (SIGSTOP) under a call: its parts get backups on
 * replica 0 once they run past the latencies seen so far, or, left out
 * for being slower, it gets a copy of a part (a probe: both speeds are
 * over 2 s old); the call ends with the same bits, and the stuck copies
 * are cancelled. Known slow from then on, replica 1 gets no part of the
 * next calls (no backup needed); once its speed is 2 s old again a call
 * sends it a probe and still ends on replica 0 alone.
 *
 * What makes it so whatever the machine's load: a replica is known slow
 * once two of its last three figures say so, one per part it lost to a
 * backup, so the call that meets the stop must give it two parts. With
 * 8 parts of 13 ms of compute each (a stall of a loaded machine does not
 * make either replica look 3 times slower, which would leave replica 1
 * one part or none) it gets three or four. And no backup goes to a
 * replica that lost a part and has answered nothing since (cgc__give_up),
 * however slow replica 0's parts get under load. */
static void test_straggler_gets_backups(void **state) {
  fixture *f = *state;
  cgc_channel *ch;
  cgc_options o;
  char err[256];
  cgc_options_init(&o);
  o.replicas = 2;
  o.split_parts = 8;
  o.split_min_flops = 1000;
  o.hedge_budget = 0.5;  /* the default 5% allows none in so few parts */
  o.deadline_ms = 20000; /* without backups, the call fails by then */
  assert_int_equal(cgc_channel_new(&ch, f->list, &o, err, sizeof err), 0);
  th_problem p;
  cgc_tensor *want[CG_GRAD_COUNT], *got[CG_GRAD_COUNT];
  cgc_result res;
  assert_int_equal(th_problem_init(&p, "mb8ic64ih32oc64oh32kh3ph1",
                                   CG_OP_CONV_BWD, CG_DTYPE_F32, CG_DATA_NXC,
                                   5),
                   0);
  call(ch, &p, want, &res);
  for (int i = 0; i < 4; i++) { /* 32 latencies of the part's shape */
    call(ch, &p, got, &res);
    free_outs(got);
  }
  int attempts[4], differ = 0;
  assert_int_equal(kill(f->srv[1].pid, SIGSTOP), 0);
  for (int i = 0; i < 4; i++) {
    if (i == 0 || i == 3)
      usleep(2100 * 1000); /* the speeds measured are over 2 s old */
    call(ch, &p, got, &res);
    attempts[i] = res.attempts;
    for (int g = 0; g < CG_GRAD_COUNT; g++)
      differ += memcmp(got[g]->data, want[g]->data, want[g]->nbytes) != 0;
    free_outs(got);
  }
  assert_int_equal(kill(f->srv[1].pid, SIGCONT), 0);
  assert_int_equal(differ, 0);
  assert_true(attempts[0] > 1);     /* backups of replica 1's parts, or a
                                       probe of it */
  assert_int_equal(attempts[1], 1); /* replica 1 got no part */
  assert_int_equal(attempts[2], 1);
  assert_int_equal(attempts[3], 2); /* the probe */
  free_outs(want);
  th_problem_free(&p);
  cgc_channel_free(ch);
}

typedef struct caller {
  cgc_channel *ch;
  const th_problem *p;
  const cgc_tensor *const *want;
  int calls, failed, differ;
  atomic_int done; /* calls ended */
} caller;

static void *caller_main(void *arg) {
  caller *c = arg;
  for (int i = 0; i < c->calls; i++) {
    cgc_tensor *out[CG_GRAD_COUNT];
    cgc_result res;
    cgc_status st;
    if (cgc_compute_layer(c->ch, &c->p->req, out, &res, &st) != 0) {
      fprintf(stderr, "call %d: %s\n", i, st.message);
      c->failed++;
      continue;
    }
    for (int g = 0; g < CG_GRAD_COUNT; g++)
      if (out[g] && memcmp(out[g]->data, c->want[g]->data, out[g]->nbytes))
        c->differ++;
    free_outs(out);
    atomic_fetch_add(&c->done, 1);
  }
  return NULL;
}

/* Runs last: replica 1 dies under split calls. */
static void test_replica_killed_mid_call(void **state) {
  fixture *f = *state;
  th_problem p;
  cgc_tensor *want[CG_GRAD_COUNT];
  cgc_result res;
  /* Some tens of ms a part, so that the kill lands in calls. */
  assert_int_equal(th_problem_init(&p, "mb8ic32ih40oc32oh40kh3ph1",
                                   CG_OP_CONV_BWD, CG_DTYPE_F32, CG_DATA_NCX,
                                   11),
                   0);
  call(f->split, &p, want, &res);
  assert_string_equal(res.worker, "4 parts");
  caller c = {f->split, &p, (const cgc_tensor *const *)want, 12, 0, 0, 0};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, caller_main, &c), 0);
  /* Two calls through, then the kill, in the third (bounded: 30 s). */
  for (int i = 0; i < 30000 && atomic_load(&c.done) < 2; i++)
    usleep(1000);
  assert_int_equal(kill(f->srv[1].pid, SIGKILL), 0);
  int at_kill = atomic_load(&c.done);
  pthread_join(th, NULL);
  assert_true(at_kill < c.calls); /* the kill landed among the calls */
  th_server_stop(&f->srv[1]);
  assert_int_equal(c.failed, 0);
  assert_int_equal(c.differ, 0);
  free_outs(want);
  th_problem_free(&p);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SERVER\n", argv[0]);
    return 2;
  }
  server_exe = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_op_and_dtype),
      cmocka_unit_test(test_tiny_call_goes_whole),
      cmocka_unit_test(test_one_server_pipeline),
      cmocka_unit_test(test_straggler_gets_backups),
      cmocka_unit_test(test_replica_killed_mid_call),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
