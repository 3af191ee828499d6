/* test_server_load.c - big tensors and many clients: an input above 64 MiB
 * and an output above 64 MiB (streamed in chunks, checked against the
 * reference), and 16 concurrent clients using libcgclient, each checking
 * every result. Under ThreadSanitizer the big tensors are a sixteenth of
 * that (4-5 MB, still in several chunks): every byte through
 * the instrumented server and client costs there (MemoryAccessRange on
 * each copy), the threads meet in the chunked streaming whatever its
 * length, and the release and ASan+UBSan builds run the sizes above
 * 64 MiB. */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cgc/client.h"
#include "ts.h"

static ts_server srv;
static grpc_channel *ch;

#define MIB (1024.0 * 1024.0)

/* Past 64 MiB, or past 4 MiB under ThreadSanitizer (see the top). */
static int tsan;
static double big_bytes;
static int64_t big_side(int64_t side) {
  return tsan ? side / 4 : side;
}

static int setup(void **state) {
  (void)state;
  static const char *const args[] = {"--workers", "2", NULL};
  const char *sanitized = getenv("CG_SANITIZED");
  tsan = sanitized && strcmp(sanitized, "thread") == 0;
  big_bytes = (tsan ? 4 : 64) * MIB;
  if (ts_fixture_start(&srv, &ch, args) != 0)
    return -1;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  return ts_fixture_stop(&srv, ch);
}

/* The server writes a call's log line as the call is freed, which can be
 * just after the client saw its status: wait for it, so that the next
 * test's log counts start from a settled log. */
static void run_logged(ts_problem *tp, const ts_opts *o) {
  int ok = ts_server_log_count(&srv, "status=OK");
  assert_int_equal(ts_problem_run(ch, tp, o), 0);
  assert_int_equal(ts_server_wait_log(&srv, "status=OK", ok + 1, 10000), 0);
}

/* diff_dst 1x16x1100x1100 f32 (77 MB) in, 77 MB diff_src out (under
 * TSan 1x16x275x275, 4.8 MB). */
static void test_big_input_and_output(void **state) {
  (void)state;
  ts_desc d = {.op = CG_OP_CONV_BWD_DATA,
               .dtype = CG_DTYPE_F32,
               .dfmt = CG_DATA_NCX,
               .groups = 1,
               .mb = 1,
               .ic = 16,
               .oc = 16,
               .nsp = 2,
               .is = {big_side(1100), big_side(1100)},
               .ks = {1, 1},
               .stride = 1,
               .pad = 0,
               .dil = 1,
               .seed = 21};
  ts_problem tp;
  assert_int_equal(ts_problem_init(&tp, &d), 0);
  assert_true(tp.g.in_bytes[0] > big_bytes);
  assert_true(tp.g.out_bytes > big_bytes);
  double t0 = ts_now_ms();
  ts_opts o = {.chunk_bytes = 1 << 20};
  run_logged(&tp, &o);
  fprintf(stderr, "  %.0f MiB in, %.0f MiB out, reference included: %.0f ms\n",
          tp.g.in_bytes[0] / MIB, tp.g.out_bytes / MIB, ts_now_ms() - t0);
  ts_problem_free(&tp);
}

/* src and diff_dst 72 MB each in, a tiny diff_weights out (under TSan
 * 4.5 MB each). */
static void test_big_inputs_small_output(void **state) {
  (void)state;
  ts_desc d = {.op = CG_OP_CONV_BWD_WEIGHTS,
               .dtype = CG_DTYPE_BF16,
               .dfmt = CG_DATA_NXC,
               .groups = 2,
               .mb = 1,
               .ic = 16,
               .oc = 16,
               .nsp = 2,
               .is = {big_side(1500), big_side(1500)},
               .ks = {1, 1},
               .stride = 1,
               .pad = 0,
               .dil = 1,
               .seed = 22};
  ts_problem tp;
  assert_int_equal(ts_problem_init(&tp, &d), 0);
  assert_true(tp.g.in_bytes[0] > big_bytes);
  ts_opts o = {.chunk_bytes = 3 << 20};
  run_logged(&tp, &o);
  ts_problem_free(&tp);
}

/* ---- 16 concurrent clients through libcgclient ---- */

#define CLIENTS 16
#define CALLS_PER_CLIENT 6

typedef struct client_arg {
  int id;
  int failures;
} client_arg;

static void view_of(cgc_tensor_view *v, const ts_problem *tp, int i) {
  memset(v, 0, sizeof *v);
  v->dtype = tp->g.dtype;
  v->rank = (int)tp->p.input_dims[i].len;
  memcpy(v->dims, tp->p.input_dims[i].v, sizeof(int64_t) * (size_t)v->rank);
  v->layout = CGC_LAYOUT_DEFAULT;
  v->data = tp->in[i];
  v->nbytes = tp->g.in_bytes[i];
}

static void *client_main(void *p) {
  client_arg *a = p;
  cgc_channel *cc = NULL;
  char err[256];
  if (cgc_channel_new(&cc, srv.target, NULL, err, sizeof err) != 0) {
    fprintf(stderr, "client %d: %s\n", a->id, err);
    a->failures = CALLS_PER_CLIENT;
    return NULL;
  }
  for (int k = 0; k < CALLS_PER_CLIENT; k++) {
    int n = a->id * CALLS_PER_CLIENT + k;
    ts_desc d = {.op = (cg_op)(1 + n % 4),
                 .dtype = n % 3 ? CG_DTYPE_F32 : CG_DTYPE_BF16,
                 .dfmt = n % 2 ? CG_DATA_NCX : CG_DATA_NXC,
                 .groups = 1 + n % 2,
                 .mb = 1 + n % 3,
                 .ic = 4,
                 .oc = 8,
                 .nsp = 2,
                 .is = {9 + n % 5, 7},
                 .ks = {3, 3},
                 .stride = 1 + n % 2,
                 .pad = 1,
                 .dil = 1,
                 .seed = 1000 + (uint64_t)n};
    ts_problem tp;
    if (ts_problem_init(&tp, &d) != 0 || ts_problem_reference(&tp) != 0) {
      a->failures++;
      ts_problem_free(&tp);
      continue;
    }
    cgc_request req;
    cgc_request_init(&req);
    req.op = d.op;
    req.attrs = tp.p.attrs;
    view_of(&req.inputs[0], &tp, 0);
    view_of(&req.inputs[1], &tp, 1);
    cgc_tensor *out = NULL;
    cgc_result res;
    cgc_status st;
    int rc = cgc_compute(cc, &req, &out, &res, &st);
    if (rc != 0) {
      fprintf(stderr, "client %d call %d: %s: %s\n", a->id, k, cgc_strerror(rc),
              st.message);
      a->failures++;
    } else if (out->nbytes != tp.g.out_bytes ||
               ts_problem_check(&tp, out->data) != 0) {
      fprintf(stderr, "client %d call %d: wrong result\n", a->id, k);
      a->failures++;
    }
    cgc_tensor_free(out);
    ts_problem_free(&tp);
  }
  cgc_channel_free(cc);
  return NULL;
}

static void test_concurrent_clients(void **state) {
  (void)state;
  pthread_t th[CLIENTS];
  client_arg args[CLIENTS];
  int ok_before = ts_server_log_count(&srv, "status=OK");
  for (int i = 0; i < CLIENTS; i++) {
    args[i] = (client_arg){.id = i};
    assert_int_equal(pthread_create(&th[i], NULL, client_main, &args[i]), 0);
  }
  int failures = 0;
  for (int i = 0; i < CLIENTS; i++) {
    pthread_join(th[i], NULL);
    failures += args[i].failures;
  }
  assert_int_equal(failures, 0);
  /* One request log line per call, each OK (nothing needed a retry). */
  assert_int_equal(ts_server_wait_log(&srv, "status=OK",
                                      ok_before + CLIENTS * CALLS_PER_CLIENT,
                                      10000),
                   0);
  assert_int_equal(ts_server_log_count(&srv, "status=OK") - ok_before,
                   CLIENTS * CALLS_PER_CLIENT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_big_input_and_output),
      cmocka_unit_test(test_big_inputs_small_output),
      cmocka_unit_test(test_concurrent_clients),
  };
  if (getenv("TS_FILTER"))
    cmocka_set_test_filter(getenv("TS_FILTER"));
  return cmocka_run_group_tests(tests, setup, teardown);
}
