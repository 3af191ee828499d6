/* test_shape_cases.c - every backward-op case of oneDNN's own shape tests
 * (tests/data/onednn-shape-cases.json) through cg_problem_resolve.
 *
 * Where oneDNN's expectation agrees with SEMANTICS.md the output shape and
 * pads must match. Where SEMANTICS.md is stricter (every request must
 * satisfy the forward shape relation; weights_shape is required and must
 * agree with the data) the case must be rejected with the message listed
 * below. Where it is more lenient (shape tensors, lower/upper-case
 * auto_pad) the case must be accepted. A count per category is printed. */
#include "case_json.h"

typedef enum {
  V_MATCH = 0, /* accepted, same output shape and pads as oneDNN */
  V_STRICTER,  /* oneDNN accepts, SEMANTICS rejects */
  V_LENIENT,   /* oneDNN rejects, SEMANTICS accepts */
  V_BOTH_REJECT
} verdict;

static const char *const verdict_names[] = {
    "match", "stricter (rejected)", "lenient (accepted)", "rejected by both"};

/* Every case that is not V_MATCH, with the reason from the case's note. */
static const struct {
  int index;
  verdict v;
  const char *msg; /* substring of our error for rejections */
} table[] = {
    /* 0-11: dst_shape 452 with VALID, stride 2, kernel 3 gives a forward
     * output of 225, not the 224 of diff_dst (oneDNN's test only looks at
     * shape inference; its primitive would reject it). */
    {0, V_STRICTER, "diff_dst[2]: must be 225"},
    {1, V_STRICTER, "diff_dst[1]: must be 225"},
    {2, V_STRICTER, "diff_dst[1]: must be 225"},
    {3, V_STRICTER, "diff_dst[2]: must be 225"},
    {4, V_STRICTER, "diff_dst[2]: must be 225"},
    {5, V_STRICTER, "diff_dst[1]: must be 225"},
    {6, V_STRICTER, "diff_dst[1]: must be 225"},
    {7, V_STRICTER, "diff_dst[2]: must be 225"},
    {8, V_STRICTER, "diff_dst[2]: must be 225"},
    {9, V_STRICTER, "diff_dst[1]: must be 225"},
    {10, V_STRICTER, "diff_dst[1]: must be 225"},
    {11, V_STRICTER, "diff_dst[2]: must be 225"},
    /* Wrong-length lists and an unknown format: rejected by both. */
    {17, V_BOTH_REJECT, "strides: expected 2 values for 2 spatial dims, got 5"},
    {18, V_BOTH_REJECT, "data_format: unknown value \"XXXXX\""},
    /* A dst_shape / weights_shape tensor input: oneDNN's backend forms no
     * partition for a third input; SEMANTICS accepts it (input wins). */
    {20, V_LENIENT, NULL},
    {35, V_LENIENT, NULL},
    {76, V_LENIENT, NULL},
    /* weights_shape [4,4,1,1] read as OIX is a 1x1 kernel with 4 input
     * channels; src has 1. oneDNN echoes it without checking; SEMANTICS
     * requires it to agree with src, diff_dst and groups. */
    {25, V_STRICTER,
     "weights_shape: expected 1 input channels per group (IC=1, groups=1), "
     "got 4"},
    {27, V_STRICTER, "weights_shape: expected 1 input channels per group"},
    {28, V_STRICTER, "weights_shape: expected 1 input channels per group"},
    {29, V_STRICTER, "weights_shape: expected 1 input channels per group"},
    {30, V_STRICTER, "weights_shape: expected 1 input channels per group"},
    {64, V_STRICTER, "weights_shape: expected 1 input channels (IC of src)"},
    {65, V_STRICTER, "weights_shape: expected 1 input channels (IC of src)"},
    {66, V_STRICTER, "weights_shape: expected 1 input channels (IC of src)"},
    {67, V_STRICTER, "weights_shape: expected 1 input channels (IC of src)"},
    {68, V_STRICTER, "weights_shape: expected 1 input channels (IC of src)"},
    /* No weights_shape at all: oneDNN falls back to the output logical
     * tensor's known shape, which a convgrad request cannot carry. */
    {34, V_STRICTER, "weights_shape: required for ConvolutionBackwardWeights"},
    {75, V_STRICTER,
     "weights_shape: required for ConvTransposeBackwardWeights"},
    /* Channels not divisible by groups; wrong-length lists. */
    {46, V_BOTH_REJECT,
     "groups: diff_dst channels (OC=3) are not divisible by groups=2"},
    {47, V_BOTH_REJECT, "dilations: expected 2 values for 2 spatial dims"},
    {48, V_BOTH_REJECT,
     "groups: diff_dst channels (OC=1) are not divisible by groups=2"},
    {49, V_BOTH_REJECT, "strides: expected 2 values for 2 spatial dims, got 5"},
};

static int find_verdict(int index, const char **msg) {
  for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
    if (table[i].index == index) {
      *msg = table[i].msg;
      return table[i].v;
    }
  *msg = NULL;
  return V_MATCH;
}

static int is_backward(const char *op) {
  cg_op o;
  return op != NULL && cg_op_parse(op, &o) == 0;
}

static void format_dims(char *buf, size_t n, const int64_t *d, int rank) {
  size_t off = 0;
  off += (size_t)snprintf(buf + off, n - off, "[");
  for (int i = 0; i < rank && off < n; i++)
    off += (size_t)snprintf(buf + off, n - off, "%s%lld", i ? "," : "",
                            (long long)d[i]);
  if (off < n)
    snprintf(buf + off, n - off, "]");
}

static void onednn_shape_cases(void **state) {
  (void)state;
  cJSON *root = kt_load_json("onednn-shape-cases.json");
  int counts[4] = {0}, total = 0, index = -1, failures = 0;
  const cJSON *j;
  cJSON_ArrayForEach(j, root) {
    index++;
    const char *opname =
        cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "op"));
    if (!is_backward(opname))
      continue; /* forward reference ops: checked by the engine tests */
    total++;
    const cJSON *exp = cJSON_GetObjectItemCaseSensitive(j, "expected");
    const char *status =
        cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(exp, "status"));
    int onednn_ok = status != NULL && (strcmp(status, "success") == 0 ||
                                       strcmp(status, "compile_success") == 0);
    const char *want_msg;
    int v = find_verdict(index, &want_msg);
    kt_case c;
    cg_geom g;
    char err[256] = "";
    int rc = kt_case_build(j, &c, err, sizeof(err));
    if (rc == 0)
      rc = cg_problem_resolve(&c.p, &g, err, sizeof(err));
    char shape[96] = "";
    if (rc == 0)
      format_dims(shape, sizeof(shape), g.out_dims, g.in_rank);
    printf("case %3d %-28s oneDNN %-15s ours %s %s\n", index, opname,
           status ? status : "?", rc == 0 ? "accepted" : cg_err_name(rc),
           rc == 0 ? shape : err);

    const char *problem = NULL;
    if ((v == V_MATCH || v == V_STRICTER) && !onednn_ok)
      problem = "table says oneDNN accepts this case";
    else if ((v == V_LENIENT || v == V_BOTH_REJECT) && onednn_ok)
      problem = "table says oneDNN rejects this case";
    else if ((v == V_MATCH || v == V_LENIENT) && rc != 0)
      problem = "expected acceptance";
    else if ((v == V_STRICTER || v == V_BOTH_REJECT) &&
             (rc != CG_EINVAL || strstr(err, want_msg) == NULL))
      problem = "expected CG_EINVAL with the listed message";
    else if (v == V_MATCH) {
      const cJSON *os = cJSON_GetObjectItemCaseSensitive(exp, "output_shape");
      const cJSON *pb = cJSON_GetObjectItemCaseSensitive(exp, "pads_begin");
      const cJSON *pe = cJSON_GetObjectItemCaseSensitive(exp, "pads_end");
      if (os != NULL && !kt_json_list_equal(os, g.out_dims, g.in_rank))
        problem = "output shape differs from oneDNN's";
      else if (pb != NULL && !kt_json_list_equal(pb, g.pad_begin, g.nsp))
        problem = "pads_begin differ from oneDNN's";
      else if (pe != NULL && !kt_json_list_equal(pe, g.pad_end, g.nsp))
        problem = "pads_end differ from oneDNN's";
    }
    if (problem != NULL) {
      printf("  FAIL case %d: %s (want %s%s%s)\n", index, problem,
             verdict_names[v], want_msg ? ": " : "", want_msg ? want_msg : "");
      failures++;
      continue;
    }
    counts[v]++;
  }
  cJSON_Delete(root);
  printf("%d backward-op cases:", total);
  for (int v = 0; v < 4; v++)
    printf(" %s %d%s", verdict_names[v], counts[v], v < 3 ? "," : "\n");
  assert_int_equal(failures, 0);
  assert_int_equal(total, 78);
  assert_int_equal(counts[0] + counts[1] + counts[2] + counts[3], 78);
}

/* Rewrites forward case j as gradient op `op`: the forward output becomes
 * diff_dst, the forward input src / dst_shape, the weights weights /
 * weights_shape. Returns a new tree (caller frees). */
static cJSON *as_gradient(const cJSON *j, cg_op op) {
  cJSON *c = cJSON_Duplicate(j, 1);
  cJSON *attrs = cJSON_GetObjectItemCaseSensitive(c, "attrs");
  cJSON *exp = cJSON_GetObjectItemCaseSensitive(c, "expected");
  cJSON *out =
      cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(exp, "output_shape"), 1);
  cJSON_ReplaceItemInObjectCaseSensitive(c, "op",
                                         cJSON_CreateString(cg_op_name(op)));
  cJSON_AddItemToObject(c, "diff_dst_shape", out);
  if (op == CG_OP_CONV_BWD_DATA)
    cJSON_AddItemToObject(
        attrs, "dst_shape",
        cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(c, "src_shape"), 1));
  if (cg_op_outputs_weights(op))
    cJSON_AddItemToObject(
        attrs, "weights_shape",
        cJSON_Duplicate(
            cJSON_GetObjectItemCaseSensitive(c, "weights_input_shape"), 1));
  return c;
}

/* The forward Convolution / ConvTranspose cases pin the forward shape
 * relation and the pads: each one, restated as its two gradient ops, must
 * be accepted with oneDNN's forward pads and give back the forward input
 * (data ops) or the weights shape (weights ops). */
static void onednn_forward_cases(void **state) {
  (void)state;
  cJSON *root = kt_load_json("onednn-shape-cases.json");
  int checked = 0, forward = 0, index = -1;
  const cJSON *j;
  cJSON_ArrayForEach(j, root) {
    index++;
    const char *opname =
        cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "op"));
    int conv = strcmp(opname, "Convolution") == 0;
    if (!conv && strcmp(opname, "ConvTranspose") != 0)
      continue;
    forward++;
    const cJSON *exp = cJSON_GetObjectItemCaseSensitive(j, "expected");
    for (int k = 0; k < 2; k++) {
      cg_op op = conv ? (k ? CG_OP_CONV_BWD_WEIGHTS : CG_OP_CONV_BWD_DATA)
                      : (k ? CG_OP_DECONV_BWD_WEIGHTS : CG_OP_DECONV_BWD_DATA);
      cJSON *c = as_gradient(j, op);
      kt_case kc;
      cg_geom g;
      char err[256] = "";
      int rc = kt_case_build(c, &kc, err, sizeof(err));
      if (rc == 0)
        rc = cg_problem_resolve(&kc.p, &g, err, sizeof(err));
      const cJSON *want = cJSON_GetObjectItemCaseSensitive(
          c, k ? "weights_input_shape" : "src_shape");
      const char *problem = NULL;
      if (rc != 0)
        problem = err;
      else if (!kt_json_list_equal(want, g.out_dims, g.in_rank))
        problem = "output shape differs from the forward input";
      else if (!kt_json_list_equal(
                   cJSON_GetObjectItemCaseSensitive(exp, "pads_begin"),
                   g.pad_begin, g.nsp) ||
               !kt_json_list_equal(
                   cJSON_GetObjectItemCaseSensitive(exp, "pads_end"), g.pad_end,
                   g.nsp))
        problem = "pads differ from the forward op's";
      cJSON_Delete(c);
      if (problem != NULL) {
        char msg[512]; /* opname lives in root */
        snprintf(msg, sizeof(msg), "case %d (%s) restated as %s: %s", index,
                 opname, cg_op_name(op), problem);
        cJSON_Delete(root);
        fail_msg("%s", msg);
      }
      checked++;
    }
  }
  cJSON_Delete(root);
  printf("%d forward cases restated as %d gradient problems, all accepted "
         "with the forward pads\n",
         forward, checked);
  assert_int_equal(forward, 33);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(onednn_shape_cases),
      cmocka_unit_test(onednn_forward_cases),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
