/* test_lib_e2e.c - libcgclient against a live convgrad-server on an
 * ephemeral port: every op checked against the reference with tiny upload
 * and download chunks (many messages each way), a multi-MiB tensor with
 * the defaults, results received into caller memory, eight threads sharing
 * one channel, asynchronous calls from one thread (many in flight on the
 * channel's engine, with a bounded thread count), server statuses and
 * messages, local argument checks, target rewriting, health and info. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "cg/limits.h"
#include "cg/reference.h"
#include "cgc/client.h"
#include "harness.h"
#include "spec.h"

static const char *server_exe;
static th_server srv;
static char target[64];

static int group_setup(void **state) {
  (void)state;
  const char *extra[] = {"--workers",      "2",  "--io-cpus", "0",
                         "--idle-timeout", "45", NULL};
  if (th_server_start(&srv, server_exe, 0, extra))
    return -1;
  snprintf(target, sizeof target, "127.0.0.1:%d", srv.port);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  th_server_stop(&srv);
  return 0;
}

/* A small valid problem of op in f32, NCX with default weights layout. */
static void make_spec(cgc_spec *s, cg_op op, int64_t scale) {
  int deconv = op == CG_OP_DECONV_BWD_DATA || op == CG_OP_DECONV_BWD_WEIGHTS;
  int64_t n = 2, ic = 4 * scale, oc = 6, h = 9, k = 3;
  /* stride 2, pad 1: conv 9 -> 5; deconv 9 -> 2*8+3-2 = 17 */
  int64_t ho = deconv ? 17 : 5;
  cgc_spec_init(s);
  s->op = op;
  s->data_format = CG_DATA_NCX;
  s->groups = 2;
  s->strides.len = s->pads_begin.len = s->pads_end.len = 2;
  for (int i = 0; i < 2; i++) {
    s->strides.v[i] = 2;
    s->pads_begin.v[i] = s->pads_end.v[i] = 1;
  }
  int64_t src[4] = {n, ic, h, h}, dst[4] = {n, oc, ho, ho};
  /* Default weights: XIO (conv: K,K,ICg,OC) / XOI (deconv: K,K,OCg,IC). */
  int64_t w[4] = {k, k, deconv ? oc / 2 : ic / 2, deconv ? ic : oc};
  s->rank[0] = s->rank[1] = 4;
  if (op == CG_OP_CONV_BWD_DATA || op == CG_OP_DECONV_BWD_DATA) {
    memcpy(s->dims[0], dst, sizeof dst);
    memcpy(s->dims[1], w, sizeof w);
    if (op == CG_OP_CONV_BWD_DATA) {
      s->dst_shape.len = 4;
      memcpy(s->dst_shape.v, src, sizeof src);
    }
  } else {
    memcpy(s->dims[0], src, sizeof src);
    memcpy(s->dims[1], dst, sizeof dst);
    s->weights_shape.len = 4;
    memcpy(s->weights_shape.v, w, sizeof w);
  }
}

/* Runs spec s on ch and compares with the reference; returns max rel err
 * or fails the test. */
static void run_and_check(cgc_channel *ch, const cgc_spec *s, uint64_t seed) {
  cg_problem p;
  cg_geom g;
  char err[512];
  cgc_spec_problem(s, &p);
  if (cg_problem_resolve(&p, &g, err, sizeof err))
    fail_msg("resolve: %s", err);
  void *in0 = malloc(g.in_bytes[0]), *in1 = malloc(g.in_bytes[1]);
  void *ref = malloc(g.out_bytes);
  assert_true(in0 && in1 && ref);
  cg_fill_uniform(s->dtype, in0, g.in_elems[0], &seed);
  cg_fill_uniform(s->dtype, in1, g.in_elems[1], &seed);
  cgc_request req;
  cgc_tensor *out = NULL;
  cgc_result res;
  cgc_status st;
  cgc_spec_request(s, in0, g.in_bytes[0], in1, g.in_bytes[1], &req);
  int rc = cgc_compute(ch, &req, &out, &res, &st);
  if (rc)
    fail_msg("%s: %s %s", cg_op_name(s->op), cgc_status_code_name(st.code),
             st.message);
  assert_int_equal(st.code, GRPC_STATUS_OK);
  assert_int_equal(out->nbytes, g.out_bytes);
  assert_int_equal(res.bytes_received, g.out_bytes);
  assert_int_equal(res.bytes_sent, g.in_bytes[0] + g.in_bytes[1]);
  assert_int_equal(res.attempts, 1);
  assert_true(res.worker[0] != '\0');
  if (!(res.download_ms >= 0 && res.download_ms <= res.total_ms))
    fail_msg("%s: download_ms %.3f outside the call's %.3f ms",
             cg_op_name(s->op), res.download_ms, res.total_ms);
  assert_memory_equal(out->dims, g.out_dims, (size_t)out->rank * 8);
  assert_int_equal(cg_reference_run(&g, in0, in1, ref, err, sizeof err), 0);
  cgc_diff d;
  cgc_compare(&g, out->data, ref, &d);
  if (!d.ok)
    fail_msg("%s: max abs err %g > tol %g", cg_op_name(s->op), d.max_abs,
             d.tol);
  cgc_tensor_free(out);
  free(in0);
  free(in1);
  free(ref);
}

static void test_all_ops_tiny_chunks(void **state) {
  (void)state;
  cgc_options o;
  cgc_channel *ch;
  char err[256];
  cgc_options_init(&o);
  /* Many small messages each way: exercises the framing and reassembly. */
  o.upload_chunk_bytes = 1000;
  o.download_chunk_bytes = 1024;
  assert_int_equal(cgc_channel_new(&ch, target, &o, err, sizeof err), 0);
  for (int op = CG_OP_CONV_BWD_DATA; op <= CG_OP_DECONV_BWD_WEIGHTS; op++) {
    cgc_spec s;
    make_spec(&s, (cg_op)op, 2);
    run_and_check(ch, &s, (uint64_t)op);
  }
  cgc_channel_free(ch);
}

/* A layer-op problem of make_spec's shape with random inputs, and the
 * reference outputs it asks for (grads). */
typedef struct layer_case {
  cgc_spec s;
  cg_problem p;
  cg_layer l;
  void *in[3];
  cgc_tensor_view v[3];
  void *ref[CG_GRAD_COUNT];
} layer_case;

static void layer_case_make(layer_case *c, int deconv, unsigned grads,
                            int64_t scale, uint64_t seed) {
  char err[256];
  memset(c, 0, sizeof *c);
  make_spec(&c->s, deconv ? CG_OP_DECONV_BWD_WEIGHTS : CG_OP_CONV_BWD_WEIGHTS,
            scale);
  cgc_spec_problem(&c->s, &c->p);
  c->p.op = deconv ? CG_OP_DECONV_BWD : CG_OP_CONV_BWD;
  c->p.input_dims[2] = c->p.attrs.weights_shape;
  c->p.attrs.weights_shape = (cg_ints){NULL, 0};
  c->p.grads = grads;
  if (cg_layer_resolve(&c->p, &c->l, err, sizeof err))
    fail_msg("resolve: %s", err);
  for (int i = 0; i < 3; i++) {
    c->in[i] = malloc(c->l.in_bytes[i]);
    assert_non_null(c->in[i]);
    cg_fill_uniform(CG_DTYPE_F32, c->in[i], c->l.in_bytes[i] / 4, &seed);
    c->v[i].dtype = CG_DTYPE_F32;
    c->v[i].rank = (int)c->p.input_dims[i].len;
    memcpy(c->v[i].dims, c->p.input_dims[i].v, sizeof(int64_t) * 4);
    c->v[i].data = c->in[i];
    c->v[i].nbytes = c->l.in_bytes[i];
  }
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    if (grads & CG_GRAD_BIT(g))
      c->ref[g] = malloc(c->l.out_bytes[g]);
  assert_int_equal(cg_reference_layer(&c->l, (const void *const *)c->in, c->ref,
                                      err, sizeof err),
                   0);
}

/* Output g of c as received (data, elements) against the reference. */
static void layer_case_check(const layer_case *c, int g, const float *got) {
  const float *want = c->ref[g];
  for (size_t i = 0; i < c->l.out_elems[g]; i++)
    if (fabsf(got[i] - want[i]) > 1e-4f * (1 + fabsf(want[i])))
      fail_msg("%s %s[%zu]: %g, want %g", cg_op_name(c->p.op),
               cg_grad_name((cg_grad)g), i, got[i], want[i]);
}

static void layer_case_free(layer_case *c) {
  for (int i = 0; i < 3; i++)
    free(c->in[i]);
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    free(c->ref[g]);
}

/* cgc_conv_bwd / cgc_deconv_bwd: every subset of outputs, many small
 * messages each way, each output against the reference. */
static void test_layer_ops(void **state) {
  (void)state;
  cgc_options o;
  cgc_channel *ch;
  char err[256];
  cgc_options_init(&o);
  o.upload_chunk_bytes = 1000;
  o.download_chunk_bytes = 1024;
  assert_int_equal(cgc_channel_new(&ch, target, &o, err, sizeof err), 0);
  for (int deconv = 0; deconv < 2; deconv++)
    for (unsigned grads = 1; grads <= CG_GRADS_ALL; grads++) {
      layer_case c;
      layer_case_make(&c, deconv, grads, 2, grads);
      cgc_tensor *out[CG_GRAD_COUNT];
      cgc_result res;
      cgc_status st;
      int rc = (deconv ? cgc_deconv_bwd : cgc_conv_bwd)(
          ch, &c.p.attrs, &c.v[0], &c.v[1], &c.v[2], grads, out, &res, &st);
      if (rc)
        fail_msg("%s grads %u: %s", cg_op_name(c.p.op), grads, st.message);
      uint64_t want_bytes = 0;
      for (int g = 0; g < CG_GRAD_COUNT; g++) {
        if (!(grads & CG_GRAD_BIT(g))) {
          assert_null(out[g]);
          assert_true(res.output_compute_ms[g] == 0);
          continue;
        }
        assert_non_null(out[g]);
        assert_int_equal(out[g]->nbytes, c.l.out_bytes[g]);
        assert_int_equal(out[g]->rank, c.l.out_rank[g]);
        want_bytes += c.l.out_bytes[g];
        layer_case_check(&c, g, out[g]->data);
        cgc_tensor_free(out[g]);
      }
      assert_int_equal(res.bytes_received, want_bytes);
      assert_int_equal(res.bytes_sent,
                       c.l.in_bytes[0] + c.l.in_bytes[1] + c.l.in_bytes[2]);
      layer_case_free(&c);
    }
  cgc_channel_free(ch);
}

/* Asynchronous calls: six layer calls in flight from this thread, each
 * one's diff_src checked as soon as cgc_call_wait says it is whole (before
 * the call ends), then every output once it is finished; a call the
 * server refuses reports it to wait and finish; a missing output buffer is
 * refused before anything starts. (Timed-out waits: client_proto_e2e.) */
static void test_async_calls(void **state) {
  (void)state;
  enum { N = 6 };
  cgc_channel *ch;
  char err[256];
  assert_int_equal(cgc_channel_new(&ch, target, NULL, err, sizeof err), 0);
  layer_case c[N];
  cgc_request req[N];
  cgc_call *call[N];
  void *data[N][CG_GRAD_COUNT];
  size_t cap[N][CG_GRAD_COUNT];
  cgc_status st;
  for (int k = 0; k < N; k++) {
    layer_case_make(&c[k], k % 2, CG_GRADS_ALL, 1 + k, 100 + (uint64_t)k);
    cgc_request_init(&req[k]);
    req[k].op = c[k].p.op;
    req[k].attrs = c[k].p.attrs;
    memcpy(req[k].inputs, c[k].v, sizeof c[k].v);
    for (int g = 0; g < CG_GRAD_COUNT; g++) {
      cap[k][g] = c[k].l.out_bytes[g];
      data[k][g] = malloc(cap[k][g]);
      assert_non_null(data[k][g]);
    }
    if (cgc_call_start(ch, &req[k], data[k], cap[k], &call[k], &st) != 0)
      fail_msg("start %d: %s", k, st.message);
  }
  for (int k = 0; k < N; k++) {
    if (cgc_call_wait(call[k], CG_GRAD_BIT(CG_GRAD_DIFF_SRC), -1, &st) != 0)
      fail_msg("wait %d: %s", k, st.message);
    layer_case_check(&c[k], CG_GRAD_DIFF_SRC, data[k][CG_GRAD_DIFF_SRC]);
  }
  for (int k = 0; k < N; k++) {
    cgc_tensor out[CG_GRAD_COUNT];
    cgc_result res;
    assert_int_equal(cgc_call_wait(call[k], 0, -1, &st), 0);
    if (cgc_call_finish(call[k], out, &res, &st) != 0)
      fail_msg("finish %d: %s", k, st.message);
    assert_int_equal(res.attempts, 1);
    for (int g = 0; g < CG_GRAD_COUNT; g++) {
      assert_ptr_equal(out[g].data, data[k][g]);
      assert_int_equal(out[g].nbytes, c[k].l.out_bytes[g]);
      layer_case_check(&c[k], g, data[k][g]);
      free(data[k][g]);
    }
  }
  /* The server refuses a bad attribute: wait and finish both say so. */
  int64_t zero[2] = {0, 1};
  req[0].attrs.strides = (cg_ints){zero, 2};
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    data[0][g] = malloc(cap[0][g]);
  assert_int_equal(cgc_call_start(ch, &req[0], data[0], cap[0], &call[0], &st),
                   0);
  assert_int_equal(cgc_call_wait(call[0], 0, -1, &st), CGC_ERPC);
  assert_int_equal(st.code, GRPC_STATUS_INVALID_ARGUMENT);
  cgc_tensor out[CG_GRAD_COUNT];
  assert_int_equal(cgc_call_finish(call[0], out, NULL, &st), CGC_ERPC);
  assert_non_null(strstr(st.message, "strides"));
  assert_null(out[CG_GRAD_DIFF_SRC].data);
  void *missing[CG_GRAD_COUNT] = {data[0][0], NULL, data[0][2]};
  assert_int_equal(cgc_call_start(ch, &req[1], missing, cap[1], &call[1], &st),
                   CG_EINVAL);
  assert_null(call[1]);
  assert_non_null(strstr(st.message, "diff_weights"));
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    free(data[0][g]);
  for (int k = 0; k < N; k++)
    layer_case_free(&c[k]);
  cgc_channel_free(ch);
}

/* Threads of this process now. */
static int count_threads(void) {
  int n = 0;
  char line[256];
  FILE *f = fopen("/proc/self/status", "r");
  assert_non_null(f);
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "Threads: %d", &n) == 1)
      break;
  fclose(f);
  return n;
}

typedef struct ended_count {
  pthread_mutex_t mu;
  int n;
} ended_count;

static void count_ended(cgc_call *c, void *arg) {
  ended_count *e = arg;
  (void)c;
  pthread_mutex_lock(&e->mu);
  e->n++;
  pthread_mutex_unlock(&e->mu);
}

/* Many calls in flight from one thread run on the channel's engine: the
 * process gains a thread or so (gRPC's own may grow a little under load),
 * not one per call; every call answers its own problem right, and each is
 * told of its end once. */
static void test_many_calls_few_threads(void **state) {
  (void)state;
  enum { CASES = 8, N = 160 };
  cgc_channel *ch;
  char err[256];
  assert_int_equal(cgc_channel_new(&ch, target, NULL, err, sizeof err), 0);
  cgc_health_status hs;
  cgc_status st;
  /* gRPC starts its threads with the first call. */
  assert_int_equal(cgc_health(ch, NULL, 0, &hs, &st), 0);
  int base = count_threads();
  layer_case c[CASES];
  cgc_request req[CASES];
  for (int k = 0; k < CASES; k++) {
    layer_case_make(&c[k], k % 2, CG_GRADS_ALL, 1 + k % 3, 300 + (uint64_t)k);
    cgc_request_init(&req[k]);
    req[k].op = c[k].p.op;
    req[k].attrs = c[k].p.attrs;
    memcpy(req[k].inputs, c[k].v, sizeof c[k].v);
  }
  static void *data[N][CG_GRAD_COUNT];
  static size_t cap[N][CG_GRAD_COUNT];
  cgc_call *call[N];
  ended_count ended = {PTHREAD_MUTEX_INITIALIZER, 0};
  for (int i = 0; i < N; i++) {
    for (int g = 0; g < CG_GRAD_COUNT; g++) {
      cap[i][g] = c[i % CASES].l.out_bytes[g];
      data[i][g] = malloc(cap[i][g]);
      assert_non_null(data[i][g]);
    }
    if (cgc_call_start_notify(ch, &req[i % CASES], data[i], cap[i], count_ended,
                              &ended, &call[i], &st) != 0)
      fail_msg("start %d: %s", i, st.message);
  }
  int busy = count_threads();
  if (busy > base + 8)
    fail_msg("%d threads with %d calls in flight, %d before", busy, N, base);
  for (int i = 0; i < N; i++) {
    cgc_tensor out[CG_GRAD_COUNT];
    cgc_result res;
    if (cgc_call_finish(call[i], out, &res, &st) != 0)
      fail_msg("finish %d: %s %s", i, cgc_status_code_name(st.code),
               st.message);
    for (int g = 0; g < CG_GRAD_COUNT; g++) {
      assert_ptr_equal(out[g].data, data[i][g]);
      layer_case_check(&c[i % CASES], g, data[i][g]);
      free(data[i][g]);
    }
  }
  pthread_mutex_lock(&ended.mu);
  assert_int_equal(ended.n, N);
  pthread_mutex_unlock(&ended.mu);
  for (int k = 0; k < CASES; k++)
    layer_case_free(&c[k]);
  cgc_channel_free(ch);
  pthread_mutex_destroy(&ended.mu);
}

static void test_large_tensor_default_chunks(void **state) {
  (void)state;
  cgc_channel *ch;
  char err[256];
  assert_int_equal(cgc_channel_new(&ch, target, NULL, err, sizeof err), 0);
  /* 1x1 conv, 2 x 16 x 256 x 256 f32 = 8 MiB per data tensor: above
   * gRPC's 4 MiB message cap in both directions, yet cheap for the
   * reference (also under the sanitizers). */
  cgc_spec s;
  cgc_spec_init(&s);
  s.op = CG_OP_CONV_BWD_DATA;
  s.data_format = CG_DATA_NCX;
  s.weights_format = CG_WEIGHTS_OIX;
  s.rank[0] = s.rank[1] = 4;
  int64_t dd[4] = {2, 16, 256, 256}, w[4] = {16, 16, 1, 1};
  memcpy(s.dims[0], dd, sizeof dd);
  memcpy(s.dims[1], w, sizeof w);
  run_and_check(ch, &s, 11);
  cgc_channel_free(ch);
}

/* cgc_compute_into: the result lands in the caller's buffer, inline or
 * chunked, not a byte past it; a buffer one byte short is refused. */
static void test_compute_into(void **state) {
  (void)state;
  cgc_options o;
  cgc_options_init(&o);
  o.download_chunk_bytes = 1024; /* the second pass: many chunks */
  for (int pass = 0; pass < 2; pass++) {
    cgc_channel *ch;
    char err[256];
    assert_int_equal(
        cgc_channel_new(&ch, target, pass ? &o : NULL, err, sizeof err), 0);
    cgc_spec s;
    make_spec(&s, CG_OP_DECONV_BWD_DATA, 2);
    cg_problem p;
    cg_geom g;
    cgc_spec_problem(&s, &p);
    assert_int_equal(cg_problem_resolve(&p, &g, err, sizeof err), 0);
    uint64_t seed = 5;
    void *in0 = malloc(g.in_bytes[0]), *in1 = malloc(g.in_bytes[1]);
    void *ref = malloc(g.out_bytes);
    unsigned char *buf = malloc(g.out_bytes + 16);
    assert_true(in0 && in1 && ref && buf);
    cg_fill_uniform(s.dtype, in0, g.in_elems[0], &seed);
    cg_fill_uniform(s.dtype, in1, g.in_elems[1], &seed);
    assert_int_equal(cg_reference_run(&g, in0, in1, ref, err, sizeof err), 0);
    memset(buf, 0xA5, g.out_bytes + 16);
    cgc_request req;
    cgc_tensor out;
    cgc_status st;
    cgc_spec_request(&s, in0, g.in_bytes[0], in1, g.in_bytes[1], &req);
    int rc = cgc_compute_into(ch, &req, buf, g.out_bytes, &out, NULL, &st);
    if (rc)
      fail_msg("compute_into: %s", st.message);
    assert_ptr_equal(out.data, buf);
    assert_int_equal(out.nbytes, g.out_bytes);
    assert_memory_equal(out.dims, g.out_dims, (size_t)out.rank * 8);
    for (size_t i = g.out_bytes; i < g.out_bytes + 16; i++)
      assert_int_equal(buf[i], 0xA5);
    cgc_diff d;
    cgc_compare(&g, buf, ref, &d);
    assert_true(d.ok);
    assert_int_equal(
        cgc_compute_into(ch, &req, buf, g.out_bytes - 1, &out, NULL, &st),
        CG_ELIMIT);
    assert_int_equal(st.code, GRPC_STATUS_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(st.message, "does not fit"));
    free(in0);
    free(in1);
    free(ref);
    free(buf);
    cgc_channel_free(ch);
  }
}

typedef struct {
  cgc_channel *ch;
  int index, failures;
} worker_arg;

static void *worker(void *p) {
  worker_arg *a = p;
  for (int i = 0; i < 6; i++) {
    cgc_spec s;
    cg_problem pr;
    cg_geom g;
    cg_op op = (cg_op)(1 + (a->index + i) % 4);
    make_spec(&s, op, 1);
    cgc_spec_problem(&s, &pr);
    if (cg_problem_resolve(&pr, &g, NULL, 0)) {
      a->failures++;
      continue;
    }
    uint64_t seed = (uint64_t)(a->index * 100 + i);
    void *in0 = malloc(g.in_bytes[0]), *in1 = malloc(g.in_bytes[1]);
    void *ref = malloc(g.out_bytes);
    cg_fill_uniform(s.dtype, in0, g.in_elems[0], &seed);
    cg_fill_uniform(s.dtype, in1, g.in_elems[1], &seed);
    cgc_request req;
    cgc_tensor *out = NULL;
    cgc_status st;
    cgc_spec_request(&s, in0, g.in_bytes[0], in1, g.in_bytes[1], &req);
    cgc_diff d = {0};
    if (cgc_compute(a->ch, &req, &out, NULL, &st) == 0 &&
        cg_reference_run(&g, in0, in1, ref, NULL, 0) == 0)
      cgc_compare(&g, out->data, ref, &d);
    a->failures += !d.ok;
    cgc_tensor_free(out);
    free(in0);
    free(in1);
    free(ref);
  }
  return NULL;
}

static void test_shared_channel_threads(void **state) {
  (void)state;
  cgc_channel *ch;
  char err[256];
  pthread_t th[8];
  worker_arg args[8];
  assert_int_equal(cgc_channel_new(&ch, target, NULL, err, sizeof err), 0);
  for (int i = 0; i < 8; i++) {
    args[i] = (worker_arg){ch, i, 0};
    assert_int_equal(pthread_create(&th[i], NULL, worker, &args[i]), 0);
  }
  int failures = 0;
  for (int i = 0; i < 8; i++) {
    pthread_join(th[i], NULL);
    failures += args[i].failures;
  }
  assert_int_equal(failures, 0);
  cgc_channel_free(ch);
}

static void test_server_statuses(void **state) {
  (void)state;
  cgc_channel *ch;
  char err[256];
  assert_int_equal(cgc_channel_new(&ch, target, NULL, err, sizeof err), 0);
  cgc_spec s;
  make_spec(&s, CG_OP_CONV_BWD_DATA, 1);
  s.strides.v[1] = 0;
  size_t n0, n1;
  assert_int_equal(cgc_spec_input_bytes(&s, 0, &n0, err, sizeof err), 0);
  assert_int_equal(cgc_spec_input_bytes(&s, 1, &n1, err, sizeof err), 0);
  void *a = calloc(1, n0), *b = calloc(1, n1);
  cgc_request req;
  cgc_tensor *out = (cgc_tensor *)&req; /* must be reset to NULL */
  cgc_result res;
  cgc_status st;
  cgc_spec_request(&s, a, n0, b, n1, &req);
  assert_int_equal(cgc_compute(ch, &req, &out, &res, &st), CGC_ERPC);
  assert_null(out);
  assert_int_equal(st.code, GRPC_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(st.message, "strides[1]"));
  assert_int_equal(res.attempts, 1); /* not retried */

  /* Checked locally, before any network traffic. */
  s.strides.v[1] = 2;
  cgc_spec_request(&s, a, n0 - 4, b, n1, &req);
  assert_int_equal(cgc_compute(ch, &req, &out, NULL, &st), CG_EINVAL);
  assert_non_null(strstr(st.message, "inputs[0].nbytes"));
  req.inputs[0].nbytes = n0;
  req.op = (cg_op)9;
  assert_int_equal(cgc_compute(ch, &req, &out, NULL, &st), CG_EINVAL);
  assert_non_null(strstr(st.message, "op"));
  free(a);
  free(b);
  cgc_channel_free(ch);
}

static void test_health_and_info(void **state) {
  (void)state;
  cgc_channel *ch;
  char err[256];
  assert_int_equal(cgc_channel_new(&ch, target, NULL, err, sizeof err), 0);
  cgc_health_status hs;
  cgc_status st;
  assert_int_equal(cgc_health(ch, NULL, 0, &hs, &st), 0);
  assert_int_equal(hs, CGC_HEALTH_SERVING);
  assert_int_equal(cgc_health(ch, "no.such.Service", 0, &hs, &st), CGC_ERPC);
  assert_int_equal(st.code, GRPC_STATUS_NOT_FOUND);
  cgc_server_info *in = NULL;
  assert_int_equal(cgc_server_info_get(ch, 0, &in, &st), 0);
  assert_int_equal(in->n_ops, 6);
  assert_string_equal(in->ops[0].names[0], "ConvolutionBackwardData");
  assert_int_equal(in->workers, 2);
  assert_true(in->n_dtypes >= 3);
  assert_true(strlen(in->onednn_version) > 0);
  assert_int_equal(in->n_io_cpus, 1);
  assert_int_equal(in->io_cpus[0], 0);
  assert_int_equal(in->idle_timeout_ms, 45000);
  assert_int_equal(in->stream_window_bytes, 4u << 20);
  assert_true(in->max_request_flops == UINT64_C(100000000000));
  assert_int_equal(in->max_stride, CG_LIMIT_STRIDE_DEFAULT);
  assert_int_equal(in->max_padded_extent, CG_LIMIT_PADDED_EXTENT_DEFAULT);
  cgc_server_info_free(in);
  cgc_channel_free(ch);
}

static void test_targets_and_options(void **state) {
  (void)state;
  cgc_channel *ch;
  cgc_options o;
  char err[256], want[128];
  snprintf(target, sizeof target, "127.0.0.1:%d", srv.port);
  char list[128];
  snprintf(list, sizeof list, "localhost:%d,127.0.0.1:%d", srv.port, srv.port);
  assert_int_equal(cgc_channel_new(&ch, list, NULL, err, sizeof err), 0);
  snprintf(want, sizeof want, "ipv4:127.0.0.1:%d,127.0.0.1:%d", srv.port,
           srv.port);
  assert_string_equal(cgc_channel_target(ch), want);
  cgc_health_status hs;
  cgc_status st;
  assert_int_equal(cgc_health(ch, "", 0, &hs, &st), 0);
  cgc_channel_free(ch);

  /* dns:/// goes to gRPC's resolver as is; round_robin uses whichever of
   * localhost's addresses answers. */
  snprintf(list, sizeof list, "dns:///localhost:%d", srv.port);
  assert_int_equal(cgc_channel_new(&ch, list, NULL, err, sizeof err), 0);
  assert_string_equal(cgc_channel_target(ch), list);
  assert_int_equal(cgc_health(ch, "", 0, &hs, &st), 0);
  assert_int_equal(hs, CGC_HEALTH_SERVING);
  cgc_channel_free(ch);

  assert_int_equal(
      cgc_channel_new(&ch, "[::1]:5,[::1]:6", NULL, err, sizeof err), 0);
  assert_string_equal(cgc_channel_target(ch), "ipv6:[::1]:5,[::1]:6");
  cgc_channel_free(ch);
  assert_int_equal(
      cgc_channel_new(&ch, "127.0.0.1:5,[::1]:6", NULL, err, sizeof err),
      CG_EINVAL);
  assert_non_null(strstr(err, "mixes IPv4-only and IPv6-only"));
  assert_int_equal(
      cgc_channel_new(&ch, "127.0.0.1:x,127.0.0.1:6", NULL, err, sizeof err),
      CG_EINVAL);
  assert_non_null(strstr(err, "numeric port"));
  cgc_options_init(&o);
  o.tls_server_name = "convgrad.example";
  assert_int_equal(cgc_channel_new(&ch, target, &o, err, sizeof err),
                   CG_EINVAL);
  assert_non_null(strstr(err, "tls_server_name: needs TLS"));
  cgc_options_init(&o);
  o.tls_ca_file = "/nonexistent/ca.pem";
  assert_int_equal(cgc_channel_new(&ch, target, &o, err, sizeof err),
                   CG_EINVAL);
  assert_string_equal(err, "tls_ca_file /nonexistent/ca.pem: No such file or "
                           "directory");
  cgc_options_init(&o);
  o.tls_cert_file = "/nonexistent/cert.pem";
  assert_int_equal(cgc_channel_new(&ch, target, &o, err, sizeof err),
                   CG_EINVAL);
  assert_non_null(strstr(err, "tls_cert_file and tls_key_file go together"));
  cgc_options_init(&o);
  o.upload_chunk_bytes = (size_t)o.max_message_bytes;
  assert_int_equal(cgc_channel_new(&ch, target, &o, err, sizeof err),
                   CG_EINVAL);
  cgc_options_init(&o);
  o.download_chunk_bytes = 1023;
  assert_int_equal(cgc_channel_new(&ch, target, &o, err, sizeof err),
                   CG_EINVAL);
  assert_string_equal(err, "download_chunk_bytes: must be 0 (the server's "
                           "default) or at least 1024, got 1023");
}

/* These were passed to gRPC, which accepted them and failed every call
 * or, for a port above 65535, talked to the port modulo 65536. */
static void test_bad_targets_refused_up_front(void **state) {
  (void)state;
  static const struct {
    const char *target, *why;
  } bad[] = {
      {"ipv4:garbage", "'garbage': expected HOST:PORT"},
      {"ipv4:1.2.3:80", "'1.2.3' is not an IPv4 address"},
      {"ipv4:", "no server named after 'ipv4:'"},
      {"ipv6:127.0.0.1:80", "'127.0.0.1' is not an IPv6 address"},
      {"ipv6:[::1]:70000", "port must be in 1..65535"},
      {"dns:///", "no server named after 'dns:'"},
      {"dns://8.8.8.8/", "no server named after 'dns:'"},
      {"unix:", "no server named after 'unix:'"},
      {"127.0.0.1:103999", "'127.0.0.1:103999': port must be in 1..65535"},
      {"localhost:0", "port must be in 1..65535"},
      {"localhost", "expected HOST:PORT"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cgc_channel *ch = (cgc_channel *)&ch;
    char err[256] = "";
    assert_int_equal(cgc_channel_new(&ch, bad[i].target, NULL, err, sizeof err),
                     CG_EINVAL);
    assert_null(ch);
    if (!strstr(err, bad[i].why))
      fail_msg("%s: message '%s' lacks '%s'", bad[i].target, err, bad[i].why);
  }
  /* Their well-formed counterparts are taken as they are, unresolved. */
  static const char *const good[] = {"ipv4:127.0.0.1:1,127.0.0.2:2",
                                     "ipv4:///127.0.0.1:1",
                                     "ipv6:[::1]:1",
                                     "dns:///no-such-host.invalid:1",
                                     "dns:no-such-host.invalid:1",
                                     "unix:/tmp/no-such-socket",
                                     "no-such-host.invalid:65535"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    cgc_channel *ch;
    char err[256] = "";
    if (cgc_channel_new(&ch, good[i], NULL, err, sizeof err))
      fail_msg("%s: %s", good[i], err);
    assert_string_equal(cgc_channel_target(ch), good[i]);
    cgc_channel_free(ch);
  }
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH/convgrad-server\n", argv[0]);
    return 2;
  }
  server_exe = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_all_ops_tiny_chunks),
      cmocka_unit_test(test_layer_ops),
      cmocka_unit_test(test_async_calls),
      cmocka_unit_test(test_many_calls_few_threads),
      cmocka_unit_test(test_large_tensor_default_chunks),
      cmocka_unit_test(test_compute_into),
      cmocka_unit_test(test_shared_channel_threads),
      cmocka_unit_test(test_server_statuses),
      cmocka_unit_test(test_health_and_info),
      cmocka_unit_test(test_targets_and_options),
      cmocka_unit_test(test_bad_targets_refused_up_front),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
