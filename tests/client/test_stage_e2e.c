/* test_stage_e2e.c - staged tensors (cgc_stage, cgc_tensor_view.staged)
 * against a live convgrad-server on a loopback port: a layer's src and
 * weights staged, then its backward named by id with only diff_dst on the
 * wire, checked against the reference; content the store holds not sent
 * again; src under a private id (cgc_stage_private); the server restarted
 * between staging and the call (the library retries with the lost tensors'
 * bytes and the result is right); two servers behind one round_robin target
 * (staging goes off); a server without a store; the store's figures in
 * GetServerInfo. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cg/bdesc.h"
#include "cg/reference.h"
#include "cgc/client.h"
#include "harness.h"
#include "spec.h"

/* Small chunks, so that the tensors take the Stage path of a long upload
 * (header, the server's answer, then chunks). */
#define CHUNK_BYTES 1024

static const char *server_exe;
static th_server srv;
static const char *const server_args[] = {"--workers", "2", NULL};

static int group_setup(void **state) {
  (void)state;
  return th_server_start(&srv, server_exe, th_free_port(), server_args);
}

static int group_teardown(void **state) {
  (void)state;
  th_server_stop(&srv);
  return 0;
}

static cgc_channel *channel_to(const char *to) {
  cgc_channel *ch;
  char err[256];
  cgc_options o;
  cgc_options_init(&o);
  o.upload_chunk_bytes = CHUNK_BYTES;
  if (cgc_channel_new(&ch, to, &o, err, sizeof err))
    fail_msg("channel: %s", err);
  return ch;
}

static cgc_channel *channel(void) {
  return channel_to(srv.target);
}

/* A ConvolutionBackward layer (grouped, strided, padded) with its inputs
 * filled, its views in req and the reference's outputs. */
typedef struct layer_case {
  cg_bdesc_problem bp;
  cg_layer l;
  cgc_request req;
  void *in[3];
  void *ref[CG_GRAD_COUNT];
} layer_case;

static void case_init(layer_case *c, uint64_t seed) {
  cg_bdesc d;
  char err[512];
  if (cg_bdesc_parse("g2mb2ic8ih17oc16oh9kh3sh2ph1", 0, &d, err, sizeof err) ||
      cg_bdesc_problem_init(&c->bp, &d, CG_OP_CONV_BWD_WEIGHTS, CG_DTYPE_F32,
                            CG_DATA_NCX, CG_WEIGHTS_DEFAULT, err, sizeof err))
    fail_msg("problem: %s", err);
  cg_problem *p = &c->bp.problem;
  p->op = CG_OP_CONV_BWD;
  p->input_dims[2] = p->attrs.weights_shape;
  p->attrs.weights_shape = (cg_ints){NULL, 0};
  if (cg_layer_resolve(p, &c->l, err, sizeof err))
    fail_msg("resolve: %s", err);
  cgc_request_init(&c->req);
  c->req.op = CG_OP_CONV_BWD;
  c->req.attrs = p->attrs;
  for (int i = 0; i < 3; i++) {
    cgc_tensor_view *v = &c->req.inputs[i];
    c->in[i] = malloc(c->l.in_bytes[i]);
    assert_non_null(c->in[i]);
    cg_fill_uniform(CG_DTYPE_F32, c->in[i], c->l.in_bytes[i] / 4, &seed);
    *v = (cgc_tensor_view){.dtype = CG_DTYPE_F32,
                           .rank = (int)p->input_dims[i].len,
                           .data = c->in[i],
                           .nbytes = c->l.in_bytes[i]};
    memcpy(v->dims, p->input_dims[i].v, p->input_dims[i].len * sizeof(int64_t));
  }
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    c->ref[g] = malloc(c->l.out_bytes[g]);
    assert_non_null(c->ref[g]);
  }
  const void *in[3] = {c->in[0], c->in[1], c->in[2]};
  if (cg_reference_layer(&c->l, in, c->ref, err, sizeof err))
    fail_msg("reference: %s", err);
}

static void case_free(layer_case *c) {
  for (int i = 0; i < 3; i++)
    free(c->in[i]);
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    free(c->ref[g]);
}

/* Runs the layer on ch and checks every output against the reference;
 * returns the result's figures. */
static cgc_result run_checked(cgc_channel *ch, layer_case *c) {
  cgc_tensor *out[CG_GRAD_COUNT];
  cgc_result res;
  cgc_status st;
  if (cgc_compute_layer(ch, &c->req, out, &res, &st))
    fail_msg("compute: %s %s", cgc_status_code_name(st.code), st.message);
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    cgc_diff d;
    cgc_compare_output(&c->l, g, out[g]->data, c->ref[g], &d);
    if (!d.ok)
      fail_msg("%s: max abs err %g > tol %g", cg_grad_name((cg_grad)g),
               d.max_abs, d.tol);
    cgc_tensor_free(out[g]);
  }
  return res;
}

/* Stages input i of c, its id into id and the view naming it. */
static cgc_stage_result stage_input(cgc_channel *ch, layer_case *c, int i,
                                    unsigned char id[CGC_STAGED_ID_BYTES]) {
  cgc_stage_result r;
  cgc_status st;
  if (cgc_stage(ch, c->in[i], c->l.in_bytes[i], 0, id, &r, &st))
    fail_msg("stage inputs[%d]: %s %s", i, cgc_status_code_name(st.code),
             st.message);
  c->req.inputs[i].staged = id;
  return r;
}

/* src and weights staged: the call sends diff_dst alone and is right;
 * staging the weights again sends nothing. */
static void test_by_id(void **state) {
  (void)state;
  cgc_channel *ch = channel();
  layer_case c;
  case_init(&c, 11);
  unsigned char src_id[CGC_STAGED_ID_BYTES], w_id[CGC_STAGED_ID_BYTES];
  cgc_stage_result r = stage_input(ch, &c, 0, src_id);
  assert_false(r.present);
  assert_int_equal(r.bytes_sent, c.l.in_bytes[0]);
  assert_true(r.ttl_ms > 0);
  r = stage_input(ch, &c, 2, w_id);
  assert_false(r.present);
  cgc_result res = run_checked(ch, &c);
  assert_int_equal(res.bytes_sent, c.l.in_bytes[1]);
  /* A second rank's weights: the same content, present. */
  unsigned char again[CGC_STAGED_ID_BYTES];
  r = stage_input(ch, &c, 2, again);
  assert_true(r.present);
  assert_int_equal(r.bytes_sent, 0);
  assert_memory_equal(again, w_id, CGC_STAGED_ID_BYTES);
  res = run_checked(ch, &c);
  assert_int_equal(res.bytes_sent, c.l.in_bytes[1]);
  assert_int_equal(res.attempts, 1);
  case_free(&c);
  cgc_channel_free(ch);
}

/* src under a private id (no hash), the weights by content: the call
 * sends diff_dst alone and is right; a private id is random (tagged), so
 * the same bytes again are a new entry, uploaded. */
static void test_private_src(void **state) {
  (void)state;
  cgc_channel *ch = channel();
  layer_case c;
  case_init(&c, 12);
  unsigned char src_id[CGC_STAGED_ID_BYTES], w_id[CGC_STAGED_ID_BYTES];
  unsigned char again[CGC_STAGED_ID_BYTES];
  cgc_stage_result r;
  cgc_status st;
  for (int k = 0; k < 2; k++) {
    unsigned char *id = k ? again : src_id;
    if (cgc_stage_private(ch, c.in[0], c.l.in_bytes[0], 0, id, &r, &st))
      fail_msg("stage src: %s %s", cgc_status_code_name(st.code), st.message);
    assert_false(r.present);
    assert_int_equal(r.bytes_sent, c.l.in_bytes[0]);
    assert_memory_equal(id, CGC_PRIVATE_ID_TAG, CGC_PRIVATE_ID_TAG_BYTES);
  }
  assert_memory_not_equal(src_id, again, CGC_STAGED_ID_BYTES);
  c.req.inputs[0].staged = src_id;
  stage_input(ch, &c, 2, w_id);
  cgc_result res = run_checked(ch, &c);
  assert_int_equal(res.bytes_sent, c.l.in_bytes[1]);
  assert_int_equal(res.attempts, 1);
  case_free(&c);
  cgc_channel_free(ch);
}

/* The server restarts between staging and the backward: the call fails
 * NOT_FOUND naming both ids, the library retries it with their bytes, and
 * the gradients are right. */
static void test_restart_restages(void **state) {
  (void)state;
  cgc_channel *ch = channel();
  layer_case c;
  case_init(&c, 12);
  unsigned char src_id[CGC_STAGED_ID_BYTES], w_id[CGC_STAGED_ID_BYTES];
  stage_input(ch, &c, 0, src_id);
  stage_input(ch, &c, 2, w_id);
  int port = srv.port;
  th_server_stop(&srv);
  assert_int_equal(th_server_start(&srv, server_exe, port, server_args), 0);
  cgc_result res = run_checked(ch, &c);
  assert_true(res.attempts >= 2); /* a reconnect may add one */
  assert_int_equal(res.bytes_sent,
                   c.l.in_bytes[0] + c.l.in_bytes[1] + c.l.in_bytes[2]);
  assert_int_equal(th_count_lines(srv.log, "status=NOT_FOUND"), 1);
  assert_int_equal(th_count_lines(srv.log, "missing: "), 1);
  case_free(&c);
  cgc_channel_free(ch);
}

/* The server restarts in the middle of a forward pass, after a window's
 * worth of layers were staged, and the next layer's Stage is the first
 * call to meet it (so no Compute call sees UNAVAILABLE): the calls of the
 * layers staged before find their ids missing and are retried with the
 * bytes, the next layer's call finds its own, and staging stays on (the
 * restart lost them, not a target that spreads calls over servers). */
#define RESTART_CASES 9 /* a window (CGC__STAGE_WINDOW, 8) and one */
static void test_restart_keeps_staging(void **state) {
  (void)state;
  cgc_channel *ch = channel();
  static layer_case c[RESTART_CASES];
  static unsigned char ids[RESTART_CASES][2][CGC_STAGED_ID_BYTES];
  int port = srv.port;
  for (int k = 0; k < RESTART_CASES; k++) {
    if (k == RESTART_CASES - 1) {
      th_server_stop(&srv);
      assert_int_equal(th_server_start(&srv, server_exe, port, server_args), 0);
    }
    case_init(&c[k], 40 + (uint64_t)k);
    stage_input(ch, &c[k], 0, ids[k][0]);
    stage_input(ch, &c[k], 2, ids[k][1]);
  }
  for (int k = 0; k < RESTART_CASES; k++) {
    cgc_result res = run_checked(ch, &c[k]);
    if (k < RESTART_CASES - 1) {
      assert_int_equal(res.attempts, 2);
    } else {
      assert_int_equal(res.attempts, 1);
      assert_int_equal(res.bytes_sent, c[k].l.in_bytes[1]);
    }
    case_free(&c[k]);
  }
  assert_int_equal(th_count_lines(srv.log, "missing: "), RESTART_CASES - 1);
  unsigned char id[CGC_STAGED_ID_BYTES], data[64] = {1};
  cgc_status st;
  if (cgc_stage(ch, data, sizeof data, 0, id, NULL, &st))
    fail_msg("stage after the restart: %s %s", cgc_status_code_name(st.code),
             st.message);
  cgc_channel_free(ch);
}

/* Layers whose src and weights are staged on to (cases of seeds 20..),
 * then computed one by one on it: returns the retries (attempts past
 * each call's first), and the calls from the first one after staging
 * went off (cgc_stage refused) with their attempts into late_attempts. */
#define POOL_CASES 12
static int stage_then_compute(const char *to, int *off_at, int *late_attempts) {
  cgc_channel *ch = channel_to(to);
  /* Both servers of a list connected before anything is staged. */
  for (int k = 0; k < 4; k++) {
    cgc_server_info *info;
    cgc_status st;
    assert_int_equal(cgc_server_info_get(ch, 0, &info, &st), 0);
    cgc_server_info_free(info);
  }
  static layer_case c[POOL_CASES];
  static unsigned char ids[POOL_CASES][2][CGC_STAGED_ID_BYTES];
  for (int k = 0; k < POOL_CASES; k++) {
    case_init(&c[k], 20 + (uint64_t)k);
    stage_input(ch, &c[k], 0, ids[k][0]);
    stage_input(ch, &c[k], 2, ids[k][1]);
  }
  int retries = 0;
  *off_at = -1;
  *late_attempts = 0;
  for (int k = 0; k < POOL_CASES; k++) {
    cgc_result res = run_checked(ch, &c[k]);
    retries += res.attempts - 1;
    if (*off_at >= 0)
      *late_attempts += res.attempts;
    unsigned char id[CGC_STAGED_ID_BYTES];
    cgc_status st;
    if (*off_at < 0 &&
        cgc_stage(ch, c[k].in[1], c[k].l.in_bytes[1], 0, id, NULL, &st)) {
      assert_int_equal(st.code, GRPC_STATUS_FAILED_PRECONDITION);
      assert_non_null(strstr(st.message, "staging is off for it"));
      assert_non_null(strstr(st.message, "one server's address"));
      *off_at = k;
    }
    case_free(&c[k]);
  }
  cgc_channel_free(ch);
  return retries;
}

/* Two servers behind one round_robin target: a tensor is staged on one and
 * the call often goes to the other. The first calls find their ids
 * missing (each retried with the bytes), then staging goes off: cgc_stage
 * refuses with why, and staged views go as bytes at once, never retried.
 * One server: staging stays on, no call retried. */
static void test_round_robin_pool(void **state) {
  (void)state;
  th_server other;
  assert_int_equal(
      th_server_start(&other, server_exe, th_free_port(), server_args), 0);
  char pair[96];
  snprintf(pair, sizeof pair, "%s,%s", srv.target, other.target);
  int off_at, late;
  int retries = stage_then_compute(pair, &off_at, &late);
  th_server_stop(&other);
  printf("round_robin over 2 servers: %d retries in %d calls, staging off "
         "after call %d\n",
         retries, POOL_CASES, off_at + 1);
  assert_true(off_at >= 0 && off_at < 8);
  assert_true(retries <= 4);
  assert_int_equal(late, POOL_CASES - 1 - off_at);
  retries = stage_then_compute(srv.target, &off_at, &late);
  assert_int_equal(retries, 0);
  assert_int_equal(off_at, -1);
}

/* A server started with --store-bytes 0 refuses Stage. */
static void test_no_store(void **state) {
  (void)state;
  int port = srv.port;
  th_server_stop(&srv);
  const char *const none[] = {"--workers", "2", "--store-bytes", "0", NULL};
  assert_int_equal(th_server_start(&srv, server_exe, port, none), 0);
  cgc_channel *ch = channel();
  unsigned char id[CGC_STAGED_ID_BYTES], data[64] = {1};
  cgc_status st;
  assert_int_equal(cgc_stage(ch, data, sizeof data, 0, id, NULL, &st),
                   CGC_ERPC);
  assert_int_equal(st.code, GRPC_STATUS_FAILED_PRECONDITION);
  assert_non_null(strstr(st.message, "--store-bytes"));
  cgc_channel_free(ch);
  th_server_stop(&srv);
  assert_int_equal(th_server_start(&srv, server_exe, port, server_args), 0);
}

/* GetServerInfo shows the limits and what the store did. */
static void test_server_info(void **state) {
  (void)state;
  cgc_channel *ch = channel();
  layer_case c;
  case_init(&c, 14);
  unsigned char w_id[CGC_STAGED_ID_BYTES], again[CGC_STAGED_ID_BYTES];
  stage_input(ch, &c, 2, w_id);
  stage_input(ch, &c, 2, again);
  cgc_server_info *info;
  cgc_status st;
  assert_int_equal(cgc_server_info_get(ch, 0, &info, &st), 0);
  assert_int_equal(info->store_bytes, 1ull << 30);
  assert_int_equal(info->store_ttl_ms, 60000);
  assert_int_equal(info->store_peer_bytes, (1ull << 30) / 100 * 50);
  assert_true(info->store_entries >= 1);
  assert_true(info->store_held_bytes >= c.l.in_bytes[2]);
  assert_true(info->store_hits >= 1);
  assert_true(info->store_misses >= 1);
  cgc_server_info_free(info);
  case_free(&c);
  cgc_channel_free(ch);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SERVER_EXE\n", argv[0]);
    return 2;
  }
  server_exe = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_by_id),
      cmocka_unit_test(test_private_src),
      cmocka_unit_test(test_restart_restages),
      cmocka_unit_test(test_restart_keeps_staging),
      cmocka_unit_test(test_round_robin_pool),
      cmocka_unit_test(test_no_store),
      cmocka_unit_test(test_server_info),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
