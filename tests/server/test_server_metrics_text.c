/* test_server_metrics_text.c - the metrics' exposition text without a
 * server: a call counts under its op, dtype and code; labels out of range
 * count as unknown / UNKNOWN; a duration equal to a bucket's bound falls
 * in that bucket (Prometheus's le is "less or equal"); queue and compute
 * observe only when set; the gauges come from the callback at each
 * render. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cg/problem.h"
#include "cgs_metrics.h"

static void fake_gauges(void *data, cgs_metrics_gauges *out) {
  const cgs_metrics_gauges *g = data;
  *out = *g;
}

static cgs_metrics_gauges gauges;

static int setup(void **state) {
  cgs_metrics *m;
  memset(&gauges, 0, sizeof gauges);
  assert_int_equal(cgs_metrics_new(&m, fake_gauges, &gauges), 0);
  *state = m;
  return 0;
}

static int teardown(void **state) {
  cgs_metrics_free(*state);
  return 0;
}

/* The value of the sample whose line starts with `series ` in the text,
 * or -1 when there is none. */
static double sample(cgs_metrics *m, const char *series) {
  size_t len = 0;
  char *text = cgs_metrics_render(m, &len);
  assert_non_null(text);
  assert_int_equal(strlen(text), len);
  double v = -1;
  size_t n = strlen(series);
  for (char *line = text; line && *line;) {
    char *next = strchr(line, '\n');
    if (strncmp(line, series, n) == 0 && line[n] == ' ') {
      v = strtod(line + n + 1, NULL);
      break;
    }
    line = next ? next + 1 : NULL;
  }
  free(text);
  return v;
}

static void test_call_counts_under_its_labels(void **state) {
  cgs_metrics *m = *state;
  cgs_metrics_call c = {.op = CG_OP_CONV_BWD_DATA,
                        .dtype = CG_DTYPE_BF16,
                        .code = 8,
                        .request_s = 0.002,
                        .bytes_in = 100,
                        .bytes_out = 7};
  assert_true(sample(m, "convgrad_requests_total{op=\"ConvolutionBackwardData"
                        "\",dtype=\"bf16\",code=\"RESOURCE_EXHAUSTED\"}") < 0);
  cgs_metrics_call_ended(m, &c);
  cgs_metrics_call_ended(m, &c);
  assert_true(sample(m, "convgrad_requests_total{op=\"ConvolutionBackwardData"
                        "\",dtype=\"bf16\",code=\"RESOURCE_EXHAUSTED\"}") == 2);
  assert_true(sample(m, "convgrad_received_bytes_total") == 200);
  assert_true(sample(m, "convgrad_sent_bytes_total") == 14);
  /* Never queued nor computed. */
  assert_true(sample(m, "convgrad_queue_seconds_count{op=\""
                        "ConvolutionBackwardData\"}") == 0);
  assert_true(sample(m, "convgrad_compute_seconds_count{op=\""
                        "ConvolutionBackwardData\"}") == 0);
}

static void test_out_of_range_labels_are_unknown(void **state) {
  cgs_metrics *m = *state;
  cgs_metrics_call c = {.op = 99, .dtype = -1, .code = 1000};
  assert_true(sample(m, "convgrad_request_seconds_count{op=\"unknown\"}") < 0);
  cgs_metrics_call_ended(m, &c);
  assert_true(sample(m, "convgrad_requests_total{op=\"unknown\",dtype=\""
                        "unknown\",code=\"UNKNOWN\"}") == 1);
  assert_true(sample(m, "convgrad_request_seconds_count{op=\"unknown\"}") == 1);
}

static void test_bound_falls_in_its_bucket(void **state) {
  cgs_metrics *m = *state;
  cgs_metrics_call c = {.op = CG_OP_CONV_BWD_WEIGHTS,
                        .queued = 1,
                        .queue_s = 0.001,
                        .computed = 1,
                        .compute_s = 0.0011,
                        .cache_hits = 1,
                        .cache_misses = 2};
  cgs_metrics_call_ended(m, &c);
  const char *q = "convgrad_queue_seconds_bucket{op=\""
                  "ConvolutionBackwardWeights\",le=\"%s\"}";
  const char *k = "convgrad_compute_seconds_bucket{op=\""
                  "ConvolutionBackwardWeights\",le=\"%s\"}";
  char series[160];
  snprintf(series, sizeof series, q, "0.0005");
  assert_true(sample(m, series) == 0);
  snprintf(series, sizeof series, q, "0.001");
  assert_true(sample(m, series) == 1);
  snprintf(series, sizeof series, k, "0.001");
  assert_true(sample(m, series) == 0);
  snprintf(series, sizeof series, k, "0.0025");
  assert_true(sample(m, series) == 1);
  snprintf(series, sizeof series, k, "+Inf");
  assert_true(sample(m, series) == 1);
  assert_true(sample(m, "convgrad_primitive_cache_hits_total") == 1);
  assert_true(sample(m, "convgrad_primitive_cache_misses_total") == 2);
}

static void test_gauges_are_read_at_render(void **state) {
  cgs_metrics *m = *state;
  assert_true(sample(m, "convgrad_inflight_bytes") == 0);
  gauges = (cgs_metrics_gauges){.inflight_bytes = 4096,
                                .queued_requests = 3,
                                .busy_workers = 2,
                                .inline_jobs = 7,
                                .bulk_deferred = 9,
                                .workers = 4,
                                .shm_regions = 3};
  assert_true(sample(m, "convgrad_inflight_bytes") == 4096);
  assert_true(sample(m, "convgrad_queued_requests") == 3);
  assert_true(sample(m, "convgrad_busy_workers") == 2);
  assert_true(sample(m, "convgrad_inline_jobs_total") == 7);
  assert_true(sample(m, "convgrad_bulk_deferred_total") == 9);
  assert_true(sample(m, "convgrad_workers") == 4);
  assert_true(sample(m, "convgrad_shm_regions") == 3);
  assert_true(sample(m, "process_open_fds") > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_call_counts_under_its_labels, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_out_of_range_labels_are_unknown,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_bound_falls_in_its_bucket, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_gauges_are_read_at_render, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
