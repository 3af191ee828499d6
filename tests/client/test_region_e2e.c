/* test_region_e2e.c - libcgclient's shared-memory regions against a live
 * convgrad-server on a loopback port: every op, single and layer, in f32
 * and bf16 with its inputs and outputs in a registered region at aligned
 * and unaligned (element-aligned) offsets, checked against the reference
 * with no tensor byte on the wire; requests mixing inline and region
 * tensors; an unregistered region's bytes sent inline again; two threads
 * on two channels with regions of their own; a server restarted under a
 * registered region (the library registers it again); the library's own
 * checks of keys, views and registration states. */
#include <grp.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cg/bdesc.h"
#include "cg/reference.h"
#include "cgc/client.h"
#include "harness.h"
#include "spec.h"

#define REGION_BYTES (4u << 20)

static const char *server_exe;
static th_server srv;

static int group_setup(void **state) {
  (void)state;
  const char *extra[] = {"--workers", "2", NULL};
  return th_server_start(&srv, server_exe, th_free_port(), extra);
}

static int group_teardown(void **state) {
  (void)state;
  th_server_stop(&srv);
  return 0;
}

static cgc_channel *channel(void) {
  cgc_channel *ch;
  char err[256];
  if (cgc_channel_new(&ch, srv.target, NULL, err, sizeof err))
    fail_msg("channel: %s", err);
  return ch;
}

static cgc_region *region_on(cgc_channel *ch) {
  cgc_region *r;
  char err[256];
  cgc_status st;
  if (cgc_region_create(&r, NULL, REGION_BYTES, err, sizeof err))
    fail_msg("create: %s", err);
  if (cgc_region_register(ch, r, &st))
    fail_msg("register: %s", st.message);
  return r;
}

/* A grouped, strided, padded 2-D problem of op: the single ops from a
 * descriptor, the layer ops from their family's weights problem with the
 * weights as a third input. p points into *bp. Returns 0, or -1 with err. */
static int make_problem(cg_bdesc_problem *bp, cg_op op, cg_dtype dt, char *err,
                        size_t errlen) {
  int deconv = op == CG_OP_DECONV_BWD_DATA || op == CG_OP_DECONV_BWD_WEIGHTS ||
               op == CG_OP_DECONV_BWD;
  cg_bdesc d;
  int layer = cg_op_is_layer(op);
  cg_op base = !layer   ? op
               : deconv ? CG_OP_DECONV_BWD_WEIGHTS
                        : CG_OP_CONV_BWD_WEIGHTS;
  if (cg_bdesc_parse(deconv ? "g2mb2ic6ih5oc8oh9kh3sh2ph1"
                            : "g2mb2ic8ih9oc6oh5kh3sh2ph1",
                     deconv, &d, err, errlen) ||
      cg_bdesc_problem_init(bp, &d, base, dt, CG_DATA_NCX, CG_WEIGHTS_DEFAULT,
                            err, errlen))
    return -1;
  cg_problem *p = &bp->problem;
  if (layer) {
    p->op = op;
    p->input_dims[2] = p->attrs.weights_shape;
    p->attrs.weights_shape = (cg_ints){NULL, 0};
  }
  return 0;
}

/* Where a run's tensors go: each input and output in the region unless
 * its bit in inline_in / inline_out says the caller's own memory. */
typedef struct placement {
  size_t offset; /* of the first tensor in the region; then 64-aligned */
  unsigned inline_in, inline_out;
} placement;

/* Where run_placed stops: the message, and out to free what it holds. */
#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      snprintf(why, whylen, __VA_ARGS__);                                      \
      goto out;                                                                \
    }                                                                          \
  } while (0)

/* Runs op in dt on ch with tensors placed as pl says in r, compares every
 * output with the reference, and checks what crossed the wire. Returns 0,
 * or -1 with why: no cmocka call, so that threads may run it. */
/* run_placed's calls go through cgc_call_start (the channel's engine)
 * instead of cgc_compute_layer_into. */
static int run_async;

static int run_placed(cgc_channel *ch, cgc_region *r, cg_op op, cg_dtype dt,
                      const placement *pl, char *why, size_t whylen) {
  cg_bdesc_problem bp;
  cg_layer l;
  char err[512];
  int rc = -1;
  void *own[3 + CG_GRAD_COUNT] = {NULL};
  void *into[CG_GRAD_COUNT] = {NULL}, *ref[CG_GRAD_COUNT] = {NULL};
  CHECK(make_problem(&bp, op, dt, err, sizeof err) == 0 &&
            cg_layer_resolve(&bp.problem, &l, err, sizeof err) == 0,
        "problem: %s", err);
  cgc_request req;
  cgc_request_init(&req);
  req.op = op;
  req.attrs = bp.problem.attrs;
  size_t at = pl->offset;
  uint64_t seed = (uint64_t)op * 31 + dt, inline_bytes = 0;
  const void *in[3];
  cgc_status st;
  for (int i = 0; i < l.ninputs; i++) {
    const cg_ints *dims = &bp.problem.input_dims[i];
    cgc_tensor_view *v = &req.inputs[i];
    if (pl->inline_in & (1u << i)) {
      size_t n = l.in_bytes[i];
      CHECK((own[i] = malloc(n)) != NULL, "out of memory");
      *v = (cgc_tensor_view){
          .dtype = dt, .rank = (int)dims->len, .data = own[i], .nbytes = n};
      memcpy(v->dims, dims->v, dims->len * sizeof *dims->v);
      inline_bytes += n;
    } else {
      CHECK(cgc_region_view(r, at, dt, (int)dims->len, dims->v,
                            CGC_LAYOUT_DEFAULT, v, &st) == 0,
            "view: %s", st.message);
      at = (at + v->nbytes + 63) & ~(size_t)63;
    }
    cg_fill_uniform(dt, (void *)v->data, v->nbytes / cg_dtype_size(dt), &seed);
    in[i] = v->data;
  }
  size_t cap[CG_GRAD_COUNT] = {0};
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    if (!(l.grads & CG_GRAD_BIT(g)))
      continue;
    cap[g] = l.out_bytes[g];
    if (pl->inline_out & (1u << g)) {
      into[g] = own[3 + g] = malloc(cap[g]);
    } else {
      into[g] = (char *)cgc_region_data(r) + at;
      at = (at + cap[g] + 63) & ~(size_t)63;
    }
    ref[g] = malloc(cap[g]);
    CHECK(into[g] && ref[g], "out of memory");
  }
  CHECK(at <= REGION_BYTES, "the tensors overrun the region");
  cgc_tensor out[CG_GRAD_COUNT];
  cgc_result res;
  cgc_call *call;
  CHECK(run_async
            ? cgc_call_start(ch, &req, into, cap, &call, &st) == 0 &&
                  cgc_call_finish(call, out, &res, &st) == 0
            : cgc_compute_layer_into(ch, &req, into, cap, out, &res, &st) == 0,
        "%s %s offset %zu: %s %s", cg_op_name(op), cg_dtype_name(dt),
        pl->offset, cgc_status_code_name(st.code), st.message);
  CHECK(cg_reference_layer(&l, in, ref, err, sizeof err) == 0, "reference: %s",
        err);
  uint64_t streamed = 0;
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    if (!(l.grads & CG_GRAD_BIT(g)))
      continue;
    CHECK(out[g].data == into[g] && out[g].nbytes == l.out_bytes[g],
          "%s: not described in the caller's buffer", cg_grad_name((cg_grad)g));
    cgc_diff d;
    cgc_compare_output(&l, g, into[g], ref[g], &d);
    CHECK(d.ok, "%s %s offset %zu %s: max abs err %g > tol %g", cg_op_name(op),
          cg_dtype_name(dt), pl->offset, cg_grad_name((cg_grad)g), d.max_abs,
          d.tol);
    if (pl->inline_out & (1u << g))
      streamed += l.out_bytes[g];
  }
  /* Region tensors never cross the wire. */
  CHECK(res.bytes_sent == inline_bytes && res.bytes_received == streamed,
        "%s: %llu bytes sent and %llu received, expected %llu and %llu",
        cg_op_name(op), (unsigned long long)res.bytes_sent,
        (unsigned long long)res.bytes_received,
        (unsigned long long)inline_bytes, (unsigned long long)streamed);
  rc = 0;
out:
  for (int k = 0; k < 3 + CG_GRAD_COUNT; k++)
    free(own[k]);
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    free(ref[g]);
  return rc;
}

/* run_placed in a cmocka test (the main thread). */
static void run_ok(cgc_channel *ch, cgc_region *r, cg_op op, cg_dtype dt,
                   const placement *pl) {
  char why[768];
  if (run_placed(ch, r, op, dt, pl, why, sizeof why) != 0)
    fail_msg("%s", why);
}

static const cg_op all_ops[] = {CG_OP_CONV_BWD_DATA,   CG_OP_CONV_BWD_WEIGHTS,
                                CG_OP_DECONV_BWD_DATA, CG_OP_DECONV_BWD_WEIGHTS,
                                CG_OP_CONV_BWD,        CG_OP_DECONV_BWD};

static void test_every_op_in_regions(void **state) {
  (void)state;
  cgc_channel *ch = channel();
  cgc_region *r = region_on(ch);
  static const cg_dtype dts[] = {CG_DTYPE_F32, CG_DTYPE_BF16};
  for (size_t o = 0; o < sizeof all_ops / sizeof *all_ops; o++)
    for (int t = 0; t < 2; t++) {
      size_t es = cg_dtype_size(dts[t]);
      /* Page-aligned, one element in, and element-aligned but not
       * 8-byte aligned. */
      const size_t offsets[] = {0, es, 64 + 3 * es};
      for (int k = 0; k < 3; k++) {
        placement pl = {offsets[k], 0, 0};
        run_ok(ch, r, all_ops[o], dts[t], &pl);
      }
    }
  cgc_region_free(r);
  cgc_channel_free(ch);
}

/* Some tensors inline, some in the region, in both directions. */
static void test_mixed_requests(void **state) {
  (void)state;
  cgc_channel *ch = channel();
  cgc_region *r = region_on(ch);
  placement weights_inline = {0, 1u << 1, 0};
  run_ok(ch, r, CG_OP_CONV_BWD_DATA, CG_DTYPE_F32, &weights_inline);
  placement src_and_diff_src_inline = {128, 1u << 0,
                                       CG_GRAD_BIT(CG_GRAD_DIFF_SRC)};
  run_ok(ch, r, CG_OP_CONV_BWD, CG_DTYPE_BF16, &src_and_diff_src_inline);
  placement output_inline = {0, 0, CG_GRAD_BIT(CG_GRAD_DIFF_WEIGHTS)};
  run_ok(ch, r, CG_OP_DECONV_BWD_WEIGHTS, CG_DTYPE_F32, &output_inline);
  cgc_region_free(r);
  cgc_channel_free(ch);
}

/* After cgc_region_unregister the same memory travels inline again. */
static void test_unregistered_bytes_travel(void **state) {
  (void)state;
  cgc_channel *ch = channel();
  cgc_region *r = region_on(ch);
  cgc_status st;
  assert_int_equal(cgc_region_unregister(r, &st), 0);
  cg_bdesc_problem bp;
  cg_layer l;
  char err[256];
  assert_int_equal(
      make_problem(&bp, CG_OP_CONV_BWD_WEIGHTS, CG_DTYPE_F32, err, sizeof err),
      0);
  assert_int_equal(cg_layer_resolve(&bp.problem, &l, err, sizeof err), 0);
  cgc_request req;
  cgc_request_init(&req);
  req.op = CG_OP_CONV_BWD_WEIGHTS;
  req.attrs = bp.problem.attrs;
  size_t at = 0;
  for (int i = 0; i < 2; i++) {
    const cg_ints *d = &bp.problem.input_dims[i];
    assert_int_equal(cgc_region_view(r, at, CG_DTYPE_F32, (int)d->len, d->v,
                                     CGC_LAYOUT_DEFAULT, &req.inputs[i], &st),
                     0);
    at += (req.inputs[i].nbytes + 63) & ~(size_t)63;
  }
  cgc_tensor *out;
  cgc_result res;
  assert_int_equal(cgc_compute(ch, &req, &out, &res, &st), 0);
  assert_int_equal(res.bytes_sent, l.in_bytes[0] + l.in_bytes[1]);
  assert_int_equal(res.bytes_received, l.out_bytes[CG_GRAD_DIFF_WEIGHTS]);
  cgc_tensor_free(out);
  /* Registered again, nothing travels. */
  assert_int_equal(cgc_region_register(ch, r, &st), 0);
  placement pl = {0, 0, 0};
  run_ok(ch, r, CG_OP_CONV_BWD_WEIGHTS, CG_DTYPE_F32, &pl);
  cgc_region_free(r);
  cgc_channel_free(ch);
}

/* One caller of test_two_callers: its own channel and region. */
typedef struct caller {
  cgc_channel *ch;
  cgc_region *r;
  int id;
  char why[768]; /* the first failure; "" when every call passed */
} caller;

static void *region_worker(void *arg) {
  caller *c = arg;
  for (int i = 0; i < 12 && !c->why[0]; i++) {
    placement pl = {(size_t)(i % 3) * 4 * (size_t)(c->id + 1), 0, 0};
    run_placed(c->ch, c->r, all_ops[(i + c->id) % 6], CG_DTYPE_F32, &pl, c->why,
               sizeof c->why);
  }
  return NULL;
}

/* Two callers, each with a channel and a region of its own, at once. */
static void test_two_callers(void **state) {
  (void)state;
  pthread_t th[2];
  caller c[2];
  for (int i = 0; i < 2; i++) {
    c[i] = (caller){.ch = channel(), .id = i};
    c[i].r = region_on(c[i].ch);
    assert_int_equal(pthread_create(&th[i], NULL, region_worker, &c[i]), 0);
  }
  for (int i = 0; i < 2; i++) {
    pthread_join(th[i], NULL);
    cgc_region_free(c[i].r);
    cgc_channel_free(c[i].ch);
  }
  for (int i = 0; i < 2; i++)
    if (c[i].why[0])
      fail_msg("caller %d: %s", i, c[i].why);
}

/* The server restarts on its port while a region is registered: the next
 * call finds it unknown, and the library registers it again and retries;
 * an asynchronous call does so on the channel's engine (state 1). */
static void test_server_restart(void **state) {
  run_async = *state != NULL;
  cgc_channel *ch = channel();
  cgc_region *r = region_on(ch);
  placement pl = {0, 0, 0};
  run_ok(ch, r, CG_OP_DECONV_BWD_DATA, CG_DTYPE_F32, &pl);
  int port = srv.port;
  th_server_stop(&srv);
  const char *extra[] = {"--workers", "2", NULL};
  assert_int_equal(th_server_start(&srv, server_exe, port, extra), 0);
  run_ok(ch, r, CG_OP_DECONV_BWD_DATA, CG_DTYPE_F32, &pl);
  assert_int_equal(th_count_lines(srv.log, "region op=register"), 1);
  assert_int_equal(th_count_lines(srv.log, "status=NOT_FOUND"), 1);
  cgc_region_free(r);
  cgc_channel_free(ch);
  assert_int_equal(th_count_lines(srv.log, "region op=unregister"), 1);
  run_async = 0;
}

/* A server with --shm-prefix cgtest-: the library's default names are
 * refused PERMISSION_DENIED before anything is opened, and with
 * CONVGRAD_SHM_PREFIX=cgtest- (the variable the server's flag reads) they
 * match and the call runs in the region. The server is left as it was. */
static void test_prefix_from_environment(void **state) {
  (void)state;
  int port = srv.port;
  th_server_stop(&srv);
  const char *prefixed[] = {"--workers", "2", "--shm-prefix", "cgtest-", NULL};
  assert_int_equal(th_server_start(&srv, server_exe, port, prefixed), 0);
  cgc_channel *ch = channel();
  cgc_region *r;
  char err[256];
  cgc_status st;
  assert_int_equal(cgc_region_create(&r, NULL, REGION_BYTES, err, sizeof err),
                   0);
  assert_int_not_equal(cgc_region_register(ch, r, &st), 0);
  assert_int_equal(st.code, GRPC_STATUS_PERMISSION_DENIED);
  assert_non_null(strstr(st.message, "--shm-prefix"));
  cgc_region_free(r);

  setenv("CONVGRAD_SHM_PREFIX", "a/b", 1);
  assert_int_equal(cgc_region_create(&r, NULL, REGION_BYTES, err, sizeof err),
                   CG_EINVAL);
  assert_non_null(strstr(err, "CONVGRAD_SHM_PREFIX"));
  setenv("CONVGRAD_SHM_PREFIX", "cgtest-", 1);
  r = region_on(ch);
  unsetenv("CONVGRAD_SHM_PREFIX");
  assert_true(strncmp(cgc_region_key(r), "/cgtest-", 8) == 0);
  placement pl = {0, 0, 0};
  run_ok(ch, r, CG_OP_CONV_BWD_WEIGHTS, CG_DTYPE_F32, &pl);
  cgc_region_free(r);
  cgc_channel_free(ch);

  th_server_stop(&srv);
  const char *plain[] = {"--workers", "2", NULL};
  assert_int_equal(th_server_start(&srv, server_exe, port, plain), 0);
}

/* The mode and group of r's object in /dev/shm. */
static void object_mode(const cgc_region *r, mode_t *mode, gid_t *gid) {
  char path[300];
  struct stat sb;
  snprintf(path, sizeof path, "/dev/shm%s", cgc_region_key(r));
  assert_int_equal(stat(path, &sb), 0);
  *mode = sb.st_mode & 0777;
  *gid = sb.st_gid;
}

/* CONVGRAD_SHM_GROUP, by name or number: the object is the group's, mode
 * 0660 (a server running as a user in that group opens it), and serves
 * calls as before; an unknown group is refused before anything is made. */
static void test_group_from_environment(void **state) {
  (void)state;
  /* root may give an object to any group: one it is not in by default */
  struct group *other = geteuid() == 0 ? getgrnam("nogroup") : NULL;
  gid_t want = other ? other->gr_gid : getegid();
  struct group *g = getgrgid(want);
  assert_non_null(g);
  char name[256], number[32];
  snprintf(name, sizeof name, "%s", g->gr_name);
  snprintf(number, sizeof number, "%ld", (long)want);
  cgc_channel *ch = channel();
  const char *groups[] = {name, number};
  mode_t mode;
  gid_t gid;
  for (int i = 0; i < 2; i++) {
    setenv("CONVGRAD_SHM_GROUP", groups[i], 1);
    cgc_region *r = region_on(ch);
    object_mode(r, &mode, &gid);
    assert_int_equal(mode, 0660);
    assert_int_equal(gid, want);
    placement pl = {0, 0, 0};
    run_ok(ch, r, CG_OP_CONV_BWD_DATA, CG_DTYPE_F32, &pl);
    cgc_region_free(r);
  }
  cgc_region *r;
  char err[256];
  setenv("CONVGRAD_SHM_GROUP", "no-such-group-cgtest", 1);
  assert_int_equal(cgc_region_create(&r, NULL, REGION_BYTES, err, sizeof err),
                   CG_EINVAL);
  assert_non_null(strstr(err, "CONVGRAD_SHM_GROUP: no group"));
  unsetenv("CONVGRAD_SHM_GROUP");
  r = region_on(ch);
  object_mode(r, &mode, &gid);
  assert_int_equal(mode & 0077, 0);
  cgc_region_free(r);
  cgc_channel_free(ch);
}

/* What the library refuses before any call. */
static void test_local_checks(void **state) {
  (void)state;
  cgc_region *r, *twin;
  char err[256];
  cgc_status st;
  assert_int_equal(cgc_region_create(&r, "no-slash", 4096, err, sizeof err),
                   CG_EINVAL);
  assert_non_null(strstr(err, "key"));
  assert_int_equal(cgc_region_create(&r, "/a/b", 4096, err, sizeof err),
                   CG_EINVAL);
  assert_int_equal(cgc_region_create(&r, "/..", 4096, err, sizeof err),
                   CG_EINVAL);
  assert_int_equal(cgc_region_create(&r, NULL, 0, err, sizeof err), CG_EINVAL);
  char key[64];
  snprintf(key, sizeof key, "/convgrad-test-%ld", (long)getpid());
  assert_int_equal(cgc_region_create(&r, key, 4096, err, sizeof err), 0);
  assert_string_equal(cgc_region_key(r), key);
  assert_int_equal(cgc_region_size(r), 4096);
  /* The same key twice: the first owner keeps it. */
  assert_int_equal(cgc_region_create(&twin, key, 4096, err, sizeof err),
                   CG_EINVAL);
  assert_non_null(strstr(err, "exists"));
  cgc_tensor_view v;
  int64_t dims[1] = {8};
  assert_int_equal(
      cgc_region_view(r, 2, CG_DTYPE_F32, 1, dims, CGC_LAYOUT_DEFAULT, &v, &st),
      CG_ERANGE);
  assert_int_equal(cgc_region_view(r, 4096 - 16, CG_DTYPE_F32, 1, dims,
                                   CGC_LAYOUT_DEFAULT, &v, &st),
                   CG_ERANGE);
  assert_int_equal(cgc_region_view(r, 4096 - 32, CG_DTYPE_F32, 1, dims,
                                   CGC_LAYOUT_DEFAULT, &v, &st),
                   0);
  assert_int_equal(v.nbytes, 32);
  assert_int_equal(cgc_region_unregister(r, &st), CG_EINVAL);
  cgc_channel *ch = channel();
  assert_int_equal(cgc_region_register(ch, r, &st), 0);
  assert_int_equal(cgc_region_register(ch, r, &st), CG_EINVAL);
  cgc_region_free(r); /* unregisters, unmaps, unlinks */
  assert_int_equal(cgc_region_create(&r, key, 4096, err, sizeof err), 0);
  /* Unlinked: unregistered, the name gone (another object may take it),
   * the memory still ours; it cannot be registered again. */
  assert_int_equal(cgc_region_register(ch, r, &st), 0);
  assert_int_equal(cgc_region_unlink(r, &st), 0);
  assert_int_equal(cgc_region_unregister(r, &st), CG_EINVAL);
  assert_int_equal(cgc_region_create(&twin, key, 4096, err, sizeof err), 0);
  cgc_region_free(twin);
  memset(cgc_region_data(r), 7, 4096);
  assert_int_equal(cgc_region_register(ch, r, &st), CG_EINVAL);
  assert_non_null(strstr(st.message, "unlinked"));
  cgc_region_free(r);
  cgc_channel_free(ch);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s CONVGRAD_SERVER\n", argv[0]);
    return 2;
  }
  server_exe = argv[1];
  th_shm_unlink_at_exit();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_op_in_regions),
      cmocka_unit_test(test_mixed_requests),
      cmocka_unit_test(test_unregistered_bytes_travel),
      cmocka_unit_test(test_two_callers),
      cmocka_unit_test(test_local_checks),
      cmocka_unit_test(test_server_restart),
      cmocka_unit_test_prestate(test_server_restart, (void *)1),
      cmocka_unit_test(test_prefix_from_environment),
      cmocka_unit_test(test_group_from_environment),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
