/* test_server_ops.c - every op end to end through a real server, checked
 * against cg_reference_run: f32 and bf16, NCX and NXC, with groups, 1D to
 * 3D, several weights formats and chunkings; the log lines' phases; plus
 * GetServerInfo and the health service. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cg/limits.h"
#include "ts.h"

static ts_server srv;
static grpc_channel *ch;

static int setup(void **state) {
  (void)state;
  static const char *const args[] = {"--workers", "2", NULL};
  if (ts_fixture_start(&srv, &ch, args) != 0)
    return -1;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  return ts_fixture_stop(&srv, ch);
}

/* Runs desc in f32 and bf16, NCX and NXC, with small and tiny chunks. */
static void run_matrix(ts_desc d) {
  static const cg_dtype dts[] = {CG_DTYPE_F32, CG_DTYPE_BF16};
  static const cg_data_format fmts[] = {CG_DATA_NCX, CG_DATA_NXC};
  for (int i = 0; i < 2; i++) {
    for (int j = 0; j < 2; j++) {
      d.dtype = dts[i];
      d.dfmt = fmts[j];
      d.seed += 7;
      ts_problem tp;
      assert_int_equal(ts_problem_init(&tp, &d), 0);
      /* Alternate: everything inline, or small chunks both ways. */
      ts_opts o = {0};
      if ((i + j) % 2) {
        o.chunk_bytes = 1000;
        o.response_chunk_bytes = 1024;
      } else {
        o.inline_bytes = 1u << 20;
      }
      int rc = ts_problem_run(ch, &tp, &o);
      if (rc != 0)
        fprintf(stderr, "failed: %s %s %s groups %lld\n", cg_op_name(d.op),
                cg_dtype_name(d.dtype), cg_data_format_name(d.dfmt),
                (long long)d.groups);
      assert_int_equal(rc, 0);
      ts_problem_free(&tp);
    }
  }
}

static void run_op(cg_op op, cg_weights_format alt_wfmt) {
  /* 2D, groups, stride and padding */
  ts_desc d = {.op = op,
               .groups = 2,
               .mb = 2,
               .ic = 4,
               .oc = 6,
               .nsp = 2,
               .is = {7, 6},
               .ks = {3, 3},
               .stride = 2,
               .pad = 1,
               .dil = 1,
               .seed = 1};
  run_matrix(d);
  /* 1D with dilation, the other weights format */
  ts_desc d1 = {.op = op,
                .wfmt = alt_wfmt,
                .groups = 1,
                .mb = 1,
                .ic = 3,
                .oc = 5,
                .nsp = 1,
                .is = {11},
                .ks = {3},
                .stride = 1,
                .pad = 2,
                .dil = 2,
                .seed = 2};
  run_matrix(d1);
  /* 3D, depthwise */
  ts_desc d3 = {.op = op,
                .groups = 4,
                .mb = 1,
                .ic = 4,
                .oc = 4,
                .nsp = 3,
                .is = {4, 5, 3},
                .ks = {2, 3, 1},
                .stride = 1,
                .pad = 0,
                .dil = 1,
                .seed = 3};
  run_matrix(d3);
}

static void test_conv_bwd_data(void **state) {
  (void)state;
  run_op(CG_OP_CONV_BWD_DATA, CG_WEIGHTS_OIX);
}

static void test_conv_bwd_weights(void **state) {
  (void)state;
  run_op(CG_OP_CONV_BWD_WEIGHTS, CG_WEIGHTS_OIX);
}

static void test_deconv_bwd_data(void **state) {
  (void)state;
  run_op(CG_OP_DECONV_BWD_DATA, CG_WEIGHTS_IOX);
}

static void test_deconv_bwd_weights(void **state) {
  (void)state;
  run_op(CG_OP_DECONV_BWD_WEIGHTS, CG_WEIGHTS_IOX);
}

/* The optional shape tensor (s32), sent after the data, wins over the
 * attribute; the output layout can differ from the input's. */
static void test_shape_tensor_and_output_layout(void **state) {
  (void)state;
  ts_desc d = {.op = CG_OP_CONV_BWD_WEIGHTS,
               .dtype = CG_DTYPE_F32,
               .dfmt = CG_DATA_NCX,
               .groups = 1,
               .mb = 2,
               .ic = 3,
               .oc = 4,
               .nsp = 2,
               .is = {5, 5},
               .ks = {3, 3},
               .stride = 1,
               .pad = 1,
               .dil = 1,
               .seed = 9};
  ts_problem tp;
  assert_int_equal(ts_problem_init(&tp, &d), 0);
  /* Expected: OIX output. */
  tp.p.out_weights_format = CG_WEIGHTS_OIX;
  assert_int_equal(cg_problem_resolve(&tp.p, &tp.g, NULL, 0), 0);
  assert_int_equal(ts_problem_reference(&tp), 0);

  int32_t shape[CG_MAX_RANK];
  for (size_t i = 0; i < tp.p.attrs.weights_shape.len; i++)
    shape[i] = (int32_t)tp.p.attrs.weights_shape.v[i];
  int64_t shape_dims[1] = {(int64_t)tp.p.attrs.weights_shape.len};
  Convgrad__V1__Tensor st = CONVGRAD__V1__TENSOR__INIT;
  st.dtype = CONVGRAD__V1__DTYPE__S32;
  st.n_shape = 1;
  st.shape = shape_dims;
  Convgrad__V1__Tensor *tens[3] = {tp.tensor_ptrs[0], tp.tensor_ptrs[1], &st};
  Convgrad__V1__ComputeHeader h = tp.header;
  h.inputs = tens;
  h.n_inputs = 3;
  h.output_layout = CONVGRAD__V1__LAYOUT__OIX;
  /* A wrong attribute: the tensor must win. */
  int64_t wrong[4] = {1, 1, 1, 1};
  Convgrad__V1__Attributes a = tp.attrs;
  a.weights_shape = wrong;
  h.attrs = &a;

  const void *data[3] = {tp.in[0], tp.in[1], shape};
  size_t len[3] = {tp.g.in_bytes[0], tp.g.in_bytes[1],
                   sizeof(int32_t) * (size_t)shape_dims[0]};
  ts_opts o = {.chunk_bytes = 100};
  ts_result r;
  assert_int_equal(ts_compute(ch, &h, data, len, &o, &r), 0);
  assert_int_equal(r.code, GRPC_STATUS_OK);
  assert_non_null(r.hdr);
  assert_int_equal(r.hdr->layout, CONVGRAD__V1__LAYOUT__OIX);
  assert_int_equal(r.nbytes, tp.g.out_bytes);
  assert_int_equal(ts_problem_check(&tp, r.data), 0);
  ts_result_free(&r);
  ts_problem_free(&tp);
}

/* Chunks never exceed response_chunk_bytes; header fields are filled. */
static void test_chunking_and_header(void **state) {
  (void)state;
  ts_desc d = {.op = CG_OP_CONV_BWD_DATA,
               .dtype = CG_DTYPE_F32,
               .dfmt = CG_DATA_NXC,
               .groups = 1,
               .mb = 4,
               .ic = 16,
               .oc = 16,
               .nsp = 2,
               .is = {32, 32},
               .ks = {3, 3},
               .stride = 1,
               .pad = 1,
               .dil = 1,
               .seed = 5};
  ts_problem tp;
  assert_int_equal(ts_problem_init(&tp, &d), 0);
  assert_int_equal(ts_problem_reference(&tp), 0);
  const void *data[2] = {tp.in[0], tp.in[1]};
  size_t len[2] = {tp.g.in_bytes[0], tp.g.in_bytes[1]};
  ts_opts o = {.chunk_bytes = 7777, .response_chunk_bytes = 10000};
  ts_result r;
  assert_int_equal(ts_compute(ch, &tp.header, data, len, &o, &r), 0);
  assert_int_equal(r.code, GRPC_STATUS_OK);
  assert_int_equal(r.nbytes, tp.g.out_bytes);
  assert_true(r.max_chunk <= 10000);
  assert_int_equal(r.nchunks, (tp.g.out_bytes + 9999) / 10000);
  assert_int_equal(ts_problem_check(&tp, r.data), 0);
  assert_string_equal(r.hdr->compute_path,
                      r.hdr->compute_path[0] == 'n' ? "native" : "f32_convert");
  assert_int_equal(r.hdr->n_pads_begin, 2);
  assert_int_equal(r.hdr->pads_begin[0], 1);
  assert_true(strncmp(r.hdr->worker, "cg-worker-", 10) == 0);
  assert_true(r.hdr->compute_ms > 0);
  ts_result_free(&r);
  ts_problem_free(&tp);
}

/* Runs d (seeds from seed on) n times, each checked; *on_cq counts the
 * runs the completion-queue thread made, which must come after the
 * first, else the worker that ran each is named. */
static void run_tiny(ts_desc d, int n, int *on_cq) {
  *on_cq = 0;
  for (int i = 0; i < n; i++) {
    d.seed += 1; /* other data, the same primitives */
    ts_problem tp;
    assert_int_equal(ts_problem_init(&tp, &d), 0);
    assert_int_equal(ts_problem_reference(&tp), 0);
    const void *data[2] = {tp.in[0], tp.in[1]};
    size_t len[2] = {tp.g.in_bytes[0], tp.g.in_bytes[1]};
    ts_opts o = {0};
    ts_result r;
    assert_int_equal(ts_compute(ch, &tp.header, data, len, &o, &r), 0);
    assert_int_equal(r.code, GRPC_STATUS_OK);
    assert_int_equal(ts_problem_check(&tp, r.data), 0);
    if (strcmp(r.hdr->worker, "cg-cq") == 0) {
      assert_true(i > 0);
      ++*on_cq;
    } else {
      assert_true(strncmp(r.hdr->worker, "cg-worker-", 10) == 0);
    }
    ts_result_free(&r);
    ts_problem_free(&tp);
  }
}

/* A tiny job runs on the completion-queue thread once a worker has run
 * its layer (the cq thread never compiles a new shape on first sight),
 * with the same results; header and log name the thread that ran it. A
 * job of few FLOPs but over 256 KiB of tensors stays on the workers. */
static void test_tiny_job_on_cq_thread(void **state) {
  (void)state;
  ts_desc d = {.op = CG_OP_CONV_BWD_WEIGHTS, /* a shape no other test uses */
               .dtype = CG_DTYPE_F32,
               .dfmt = CG_DATA_NXC,
               .groups = 1,
               .mb = 2,
               .ic = 3,
               .oc = 5,
               .nsp = 2,
               .is = {9, 5},
               .ks = {3, 2},
               .stride = 1,
               .pad = 1,
               .dil = 1,
               .seed = 40};
  int before = ts_server_log_count(&srv, " worker=cg-cq ");
  int on_cq;
  /* All but the first may run on the cq thread (run_tiny asserts the first
   * does not), but only while a worker is idle: one that just answered, or
   * is giving its buffers back after a second idle, is not, so a call may
   * still go to a worker (a CI run under load saw 2 of 3). */
  run_tiny(d, 12, &on_cq);
  if (on_cq < 3)
    fail_msg("%d of 11 tiny jobs ran on the cq thread", on_cq);
  /* A call's line is written as it ends, which its client may see first. */
  assert_int_equal(
      ts_server_wait_log(&srv, " worker=cg-cq ", before + on_cq, 5000), 0);
  assert_int_equal(ts_server_log_count(&srv, " worker=cg-cq ") - before, on_cq);
  /* 160 FLOPs, a 1.3 MB diff_src (1024 x 320 f32) */
  ts_desc wide = {.op = CG_OP_CONV_BWD_DATA,
                  .dtype = CG_DTYPE_F32,
                  .dfmt = CG_DATA_NCX,
                  .groups = 1,
                  .mb = 1,
                  .ic = 1,
                  .oc = 1,
                  .nsp = 2,
                  .is = {1024, 320},
                  .ks = {1, 1},
                  .stride = 64,
                  .pad = 0,
                  .dil = 1,
                  .seed = 50};
  run_tiny(wide, 3, &on_cq);
  assert_int_equal(on_cq, 0);
}

/* The value of key (" compute_ms=") in a log line, or -1. */
static double log_ms(const char *line, const char *key) {
  const char *at = strstr(line, key);
  return at ? atof(at + strlen(key)) : -1.0;
}

/* Every answered call's log line so far: reply_ms (the status batch
 * handed to gRPC) comes after the request, the queue and the compute, and
 * before total_ms (the call's end). Each figure is rounded to 1 us. */
static void check_log_phases(void) {
  FILE *f = fopen(srv.log_path, "r");
  assert_non_null(f);
  char line[4096];
  int answered = 0;
  while (fgets(line, sizeof line, f)) {
    if (!strstr(line, " compute id=") || !strstr(line, " status=OK"))
      continue;
    double recv = log_ms(line, " recv_ms="), queue = log_ms(line, " queue_ms=");
    double compute = log_ms(line, " compute_ms=");
    double total = log_ms(line, " total_ms="),
           reply = log_ms(line, " reply_ms=");
    if (!(reply > 0 && reply >= recv + queue + compute - 0.003 &&
          reply <= total + 0.001))
      fail_msg("phases out of order: %s", line);
    answered++;
  }
  fclose(f);
  assert_true(answered >= 3);
}

/* A result of at most 64 KiB and at most the chunk size comes whole in
 * ResultHeader.data with no chunk after it; anything bigger is chunked. */
static void test_inline_result(void **state) {
  (void)state;
  static const struct {
    int64_t mb;              /* out = mb x 16 x 32 x 32 f32 = mb x 64 KiB */
    uint32_t response_chunk; /* 0 = the server's 1 MiB */
    size_t inline_len, nchunks;
  } cases[] = {
      {1, 0, 65536, 0}, /* exactly 64 KiB: inline */
      {1, 65535, 0, 2}, /* over the asked chunk size: chunked */
      {2, 0, 0, 1},     /* over 64 KiB: one 128 KiB chunk */
  };
  int logged = ts_server_log_count(&srv, " compute id=");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ts_desc d = {.op = CG_OP_CONV_BWD_DATA,
                 .dtype = CG_DTYPE_F32,
                 .dfmt = CG_DATA_NCX,
                 .groups = 1,
                 .mb = cases[i].mb,
                 .ic = 16,
                 .oc = 8,
                 .nsp = 2,
                 .is = {32, 32},
                 .ks = {3, 3},
                 .stride = 1,
                 .pad = 1,
                 .dil = 1,
                 .seed = 11 + (int)i};
    ts_problem tp;
    assert_int_equal(ts_problem_init(&tp, &d), 0);
    assert_int_equal(tp.g.out_bytes, (size_t)cases[i].mb * 65536);
    assert_int_equal(ts_problem_reference(&tp), 0);
    const void *data[2] = {tp.in[0], tp.in[1]};
    size_t len[2] = {tp.g.in_bytes[0], tp.g.in_bytes[1]};
    ts_opts o = {.response_chunk_bytes = cases[i].response_chunk};
    ts_result r;
    assert_int_equal(ts_compute(ch, &tp.header, data, len, &o, &r), 0);
    assert_int_equal(r.code, GRPC_STATUS_OK);
    assert_int_equal(r.hdr->data.len, cases[i].inline_len);
    assert_int_equal(r.nchunks, cases[i].nchunks);
    assert_int_equal(r.nbytes, tp.g.out_bytes);
    assert_int_equal(ts_problem_check(&tp, r.data), 0);
    ts_result_free(&r);
    ts_problem_free(&tp);
  }
  /* A call's line is written as it ends, which its client may see first. */
  assert_int_equal(ts_server_wait_log(&srv, " compute id=", logged + 3, 5000),
                   0);
  check_log_phases();
}

static void test_server_info(void **state) {
  (void)state;
  Convgrad__V1__ServerInfo *info = ts_server_info(ch);
  assert_non_null(info);
  assert_string_equal(info->version, CGS_TEST_VERSION);
  assert_int_equal(info->n_ops, 6);
  assert_string_equal(info->ops[0]->names[0], "ConvolutionBackwardData");
  assert_int_equal(info->ops[0]->n_outputs, 1);
  assert_string_equal(info->ops[0]->outputs[0], "diff_src");
  assert_string_equal(info->ops[4]->names[0], "ConvolutionBackward");
  assert_int_equal(info->ops[4]->n_inputs, 3);
  assert_string_equal(info->ops[4]->inputs[2], "weights");
  assert_int_equal(info->ops[4]->n_outputs, 3);
  assert_string_equal(info->ops[4]->outputs[2], "diff_bias");
  int found_alias = 0;
  for (size_t i = 0; i < info->ops[1]->n_names; i++)
    found_alias |=
        strcmp(info->ops[1]->names[i], "ConvolutionBackpropFilters") == 0;
  assert_true(found_alias);
  assert_int_equal(info->n_dtypes, 3);
  assert_int_equal(info->dtypes[0]->dtype, CONVGRAD__V1__DTYPE__F32);
  assert_true(info->dtypes[0]->native);
  assert_true(strlen(info->onednn_version) > 0);
  assert_true(strlen(info->cpu_isa) > 0);
  assert_int_equal(info->workers, 2);
  assert_non_null(info->limits);
  assert_int_equal(info->limits->queue_depth, 256);
  assert_int_equal(info->limits->default_chunk_bytes, 1u << 20);
  assert_int_equal(info->limits->idle_timeout_ms, 30000);
  assert_int_equal(info->limits->stream_window_bytes, 4u << 20);
  assert_true(info->limits->max_request_flops == UINT64_C(100000000000));
  assert_int_equal(info->limits->max_stride, CG_LIMIT_STRIDE_DEFAULT);
  assert_int_equal(info->limits->max_dilation, CG_LIMIT_DILATION_DEFAULT);
  assert_int_equal(info->limits->max_pad, CG_LIMIT_PAD_DEFAULT);
  assert_int_equal(info->limits->max_output_padding,
                   CG_LIMIT_OUTPUT_PADDING_DEFAULT);
  assert_int_equal(info->limits->max_effective_extent,
                   CG_LIMIT_EFFECTIVE_EXTENT_DEFAULT);
  assert_int_equal(info->limits->max_padded_extent,
                   CG_LIMIT_PADDED_EXTENT_DEFAULT);
  assert_int_equal(info->n_io_cpus, 0); /* not pinned by default */
  convgrad__v1__server_info__free_unpacked(info, NULL);
}

static void test_health(void **state) {
  (void)state;
  assert_int_equal(ts_health(ch, ""), 1 /* SERVING */);
  assert_int_equal(ts_health(ch, "convgrad.v1.ConvGrad"), 1);
  assert_int_equal(ts_health(ch, "no.such.Service"), -GRPC_STATUS_NOT_FOUND);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conv_bwd_data),
      cmocka_unit_test(test_conv_bwd_weights),
      cmocka_unit_test(test_deconv_bwd_data),
      cmocka_unit_test(test_deconv_bwd_weights),
      cmocka_unit_test(test_shape_tensor_and_output_layout),
      cmocka_unit_test(test_chunking_and_header),
      cmocka_unit_test(test_inline_result),
      cmocka_unit_test(test_tiny_job_on_cq_thread),
      cmocka_unit_test(test_server_info),
      cmocka_unit_test(test_health),
  };
  if (getenv("TS_FILTER")) /* run one test: TS_FILTER=test_name */
    cmocka_set_test_filter(getenv("TS_FILTER"));
  return cmocka_run_group_tests(tests, setup, teardown);
}
