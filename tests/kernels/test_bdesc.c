/* test_bdesc.c - benchdnn descriptors: every descriptor of oneDNN's conv
 * and deconv problem lists (tests/data/benchdnn-problems.json, parsed
 * independently) must parse to the same fields, and the problems built
 * from it must resolve to the listed gradient-op shapes. */
#include "case_json.h"

#include "cg/bdesc.h"
#include "cg/layer.h"

static int64_t jint(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!cJSON_IsNumber(v))
    fail_msg("test data: missing number \"%s\"", key);
  return (int64_t)v->valuedouble;
}

/* Resolves op for descriptor d in NCX + OIX/IOX and compares the output
 * and input shapes with the listed ones. */
static void check_op(const cJSON *e, const cg_bdesc *d, cg_op op,
                     const char *out_key, const char *in0_key,
                     const char *in1_key) {
  const cJSON *lst = cJSON_GetObjectItemCaseSensitive(e, cg_op_name(op));
  cg_bdesc_problem bp;
  cg_geom g;
  char err[256];
  cg_weights_format wf = d->deconv ? CG_WEIGHTS_IOX : CG_WEIGHTS_OIX;
  int rc = cg_bdesc_problem_init(&bp, d, op, CG_DTYPE_F32, CG_DATA_NCX, wf, err,
                                 sizeof(err));
  if (rc == 0)
    rc = cg_problem_resolve(&bp.problem, &g, err, sizeof(err));
  if (rc != 0)
    fail_msg("%s as %s: %s", d->name, cg_op_name(op), err);
  if (!kt_json_list_equal(cJSON_GetObjectItemCaseSensitive(lst, out_key),
                          g.out_dims, g.in_rank) ||
      !kt_json_list_equal(cJSON_GetObjectItemCaseSensitive(lst, in0_key),
                          g.in_dims[0], g.in_rank) ||
      !kt_json_list_equal(cJSON_GetObjectItemCaseSensitive(lst, in1_key),
                          g.in_dims[1], g.in_rank))
    fail_msg("%s as %s: shapes differ from the list", d->name, cg_op_name(op));
  /* The default layouts (NXC, XIO/XOI) and bf16 resolve as well. */
  rc = cg_bdesc_problem_init(&bp, d, op, CG_DTYPE_BF16, CG_DATA_DEFAULT,
                             CG_WEIGHTS_DEFAULT, err, sizeof(err));
  if (rc == 0)
    rc = cg_problem_resolve(&bp.problem, &g, err, sizeof(err));
  if (rc != 0)
    fail_msg("%s as %s (NXC): %s", d->name, cg_op_name(op), err);
}

static void every_listed_descriptor(void **state) {
  (void)state;
  cJSON *root = kt_load_json("benchdnn-problems.json");
  int n = 0, nconv = 0, ndeconv = 0, clamped = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, root) {
    const char *desc =
        cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "desc"));
    const char *list =
        cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "list"));
    int deconv = strncmp(list, "deconv:", 7) == 0;
    cg_bdesc d;
    char err[256];
    if (cg_bdesc_parse(desc, deconv, &d, err, sizeof(err)) != 0)
      fail_msg("%s: %s", desc, err);
    const char *name =
        cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "name"));
    if (strcmp(d.name, name) != 0)
      fail_msg("%s: name \"%s\", want \"%s\"", desc, d.name, name);
    if (d.deconv != deconv || d.nsp != jint(e, "ndims") - 2 ||
        d.g != jint(e, "g") || d.mb != jint(e, "mb") || d.ic != jint(e, "ic") ||
        d.oc != jint(e, "oc"))
      fail_msg("%s: rank, g, mb, ic or oc differ", desc);
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(e, "spatial");
    static const char *const axes[3] = {"d", "h", "w"};
    for (int i = 0; i < d.nsp; i++) {
      const cJSON *a =
          cJSON_GetObjectItemCaseSensitive(sp, axes[3 - d.nsp + i]);
      int64_t pr = jint(a, "pr");
      if (d.in_sp[i] != jint(a, "i") || d.out_sp[i] != jint(a, "o") ||
          d.kernel[i] != jint(a, "k") || d.stride[i] != jint(a, "s") ||
          d.pad_begin[i] != jint(a, "pl") ||
          d.pad_end[i] != (pr > 0 ? pr : 0) || d.dilation[i] != jint(a, "dil"))
        fail_msg("%s: axis %s differs", desc, axes[3 - d.nsp + i]);
      clamped += pr < 0;
    }
    const cJSON *ga = cJSON_GetObjectItemCaseSensitive(e, "graph_attrs");
    assert_true(kt_json_list_equal(
        cJSON_GetObjectItemCaseSensitive(ga, "pads_end"), d.pad_end, d.nsp));
    if (deconv) {
      check_op(e, &d, CG_OP_DECONV_BWD_DATA, "diff_src(inferred)", "diff_dst",
               "weights_IOX");
      check_op(e, &d, CG_OP_DECONV_BWD_WEIGHTS, "weights_shape_IOX", "src",
               "diff_dst");
      ndeconv++;
    } else {
      check_op(e, &d, CG_OP_CONV_BWD_DATA, "dst_shape(diff_src)", "diff_dst",
               "weights_OIX");
      check_op(e, &d, CG_OP_CONV_BWD_WEIGHTS, "weights_shape_OIX", "src",
               "diff_dst");
      nconv++;
    }
    n++;
  }
  cJSON_Delete(root);
  printf("%d descriptors (%d conv, %d deconv, %d clamped end pads) parsed "
         "and resolved as %d gradient problems\n",
         n, nconv, ndeconv, clamped, 4 * n);
  assert_int_equal(n, 402);
}

static void parse_rules(void **state) {
  (void)state;
  cg_bdesc d;
  char err[256];
  /* Defaults: mb2 g1 s1 d0 p0; 2D with only h given copies h to w. */
  assert_int_equal(cg_bdesc_parse("ic16oc32ih14kh3", 0, &d, err, sizeof(err)),
                   0);
  assert_int_equal(d.nsp, 2);
  assert_int_equal(d.mb, 2);
  assert_int_equal(d.g, 1);
  assert_int_equal(d.in_sp[1], 14);
  assert_int_equal(d.out_sp[0], 12);
  assert_int_equal(d.out_sp[1], 12);
  assert_int_equal(d.dilation[0], 1);
  assert_string_equal(d.name, "");
  /* 3D with only d given copies d to h and w. */
  assert_int_equal(
      cg_bdesc_parse("mb1ic2oc2id8kd3pd1sd2n\"x3\"\n", 0, &d, err, sizeof(err)),
      0);
  assert_int_equal(d.nsp, 3);
  assert_int_equal(d.out_sp[2], 4);  /* (8 - 3 + 2) / 2 + 1 */
  assert_int_equal(d.pad_end[1], 0); /* (4-1)*2 - 8 + 3 - 1 = 0 */
  assert_string_equal(d.name, "x3");
  /* Output given, begin padding derived; negative end padding clamped. */
  assert_int_equal(
      cg_bdesc_parse("ic8oc8iw56ow28kw1sw2", 0, &d, err, sizeof(err)), 0);
  assert_int_equal(d.pad_begin[0], 0);
  assert_int_equal(d.pad_end[0], 0);
  /* Deconvolution sizes: o = (i-1)s + EK - 2p. */
  assert_int_equal(
      cg_bdesc_parse("g2ic64oc32ih28oh56kh4sh2ph1", 1, &d, err, sizeof(err)),
      0);
  assert_int_equal(d.deconv, 1);
  assert_int_equal(d.out_sp[0], 56);
  assert_int_equal(d.pad_end[1], 1);
  /* Dilation in oneDNN convention becomes graph convention (d + 1). */
  assert_int_equal(cg_bdesc_parse("ic4oc4iw10kw3dw1", 0, &d, err, sizeof(err)),
                   0);
  assert_int_equal(d.dilation[0], 2);
  assert_int_equal(d.out_sp[0], 6);

  static const struct {
    const char *text, *msg;
  } bad[] = {
      {"mb8oc64ih56kh3", "ic and oc are required"},
      {"ic3oc8ih5", "ih and kh are required"},
      {"ic3oc8kh3", "ih and kh are required"},
      {"ic3oc8ih5kh3xq4", "unknown key \"xq\""},
      {"ic3oc8ih5kh3ihx", "unknown key \"ihx\""},
      {"ic3oc8ih5kh3z2", "unknown key \"z\""},
      {"ic3oc8ih5kh3ph", "key \"ph\" needs a non-negative integer"},
      {"ic3oc8ih5kh3ph-1", "key \"ph\" needs a non-negative integer"},
      {"ic3oc8ih5ih6kh3", "key \"ih\" given twice"},
      {"ic0oc8ih5kh3", "must be > 0"},
      {"g3ic4oc6ih5kh3", "must be divisible by g 3"},
      {"ic3oc8", "no spatial sizes"},
      {"ic3oc8id4ih4kd2kh2", "3D needs both or neither of h and w"},
      {"ic3oc8ih5kh3sh0", "must be > 0"},
      {"ic3oc8ih2kh5", "oh = -2 is out of range"},
      {"ic3oc8ih99999999999kh3", "value exceeds 2147483647"},
      {"ic3oc8ih5oh1kh3", "derived ph = -1 is negative"},
      {"ic3oc8?ih5kh3", "unexpected '?'"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    int rc = cg_bdesc_parse(bad[i].text, 0, &d, err, sizeof(err));
    if (rc != CG_EINVAL || strstr(err, bad[i].msg) == NULL)
      fail_msg("\"%s\": got %s \"%s\", want \"%s\"", bad[i].text,
               cg_err_name(rc), err, bad[i].msg);
  }
}

static void problem_list_lines(void **state) {
  (void)state;
  cg_bdesc d;
  char err[256];
  int is = -1;
  assert_int_equal(cg_bdesc_parse_line("", &d, &is, err, sizeof(err)), 0);
  assert_int_equal(is, 0);
  assert_int_equal(
      cg_bdesc_parse_line("  # comment\n", &d, &is, err, sizeof(err)), 0);
  assert_int_equal(is, 0);
  assert_int_equal(cg_bdesc_parse_line("mb8ic64ih56oc64oh56kh3ph1\n", &d, &is,
                                       err, sizeof(err)),
                   0);
  assert_int_equal(is, 1);
  assert_int_equal(d.deconv, 0);
  assert_int_equal(d.mb, 8);
  assert_int_equal(
      cg_bdesc_parse_line("deconv:mb8ic64ih28oc32oh56kh4sh2ph1 n\"up\"", &d,
                          &is, err, sizeof(err)),
      0);
  assert_int_equal(is, 1);
  assert_int_equal(d.deconv, 1);
  assert_string_equal(d.name, "up");
  assert_int_equal(cg_bdesc_parse_line("conv:g32mb8ic32ih112oc32oh112kh3ph1",
                                       &d, &is, err, sizeof(err)),
                   0);
  assert_int_equal(d.g, 32);
  assert_int_equal(cg_bdesc_parse_line("deconv:mb8", &d, &is, err, sizeof(err)),
                   CG_EINVAL);
  assert_int_equal(is, 0);
  assert_non_null(strstr(err, "ic and oc are required"));

  /* A descriptor builds only its own family's ops. */
  cg_bdesc_problem bp;
  assert_int_equal(cg_bdesc_problem_init(&bp, &d, CG_OP_DECONV_BWD_DATA,
                                         CG_DTYPE_F32, CG_DATA_DEFAULT,
                                         CG_WEIGHTS_DEFAULT, err, sizeof(err)),
                   CG_EINVAL);
  assert_non_null(strstr(err, "does not belong to a convolution descriptor"));
  assert_int_equal(cg_bdesc_problem_init(&bp, &d, (cg_op)0, CG_DTYPE_F32,
                                         CG_DATA_DEFAULT, CG_WEIGHTS_DEFAULT,
                                         err, sizeof(err)),
                   CG_EINVAL);
  /* The depthwise layer in NXC/XIO: weights (K, ICg=1, OC). */
  assert_int_equal(cg_bdesc_problem_init(&bp, &d, CG_OP_CONV_BWD_WEIGHTS,
                                         CG_DTYPE_F32, CG_DATA_DEFAULT,
                                         CG_WEIGHTS_DEFAULT, err, sizeof(err)),
                   0);
  cg_geom g = kt_resolve_ok(&bp.problem);
  kt_dims_eq(g.out_dims, L(3, 3, 1, 32));
  kt_dims_eq(g.in_dims[0], L(8, 112, 112, 32));
  assert_true(g.flops == 2.0 * 8 * 32 * 112 * 112 * 1 * 9);
}

/* Run lines: the descriptor, then how to run it; the defaults make a
 * problem list's line a layer call. */
static void run_lines(void **state) {
  (void)state;
  cg_bdesc_run r;
  cg_bdesc_problem bp;
  cg_layer l;
  char err[256];
  int is = -1;
  assert_int_equal(cg_bdesc_parse_run("mb8ic64ih56oc64oh56kh3ph1n\"res2a 3x3\"",
                                      &r, &is, err, sizeof(err)),
                   0);
  assert_int_equal(is, 1);
  assert_int_equal(r.op, CG_OP_CONV_BWD);
  assert_int_equal(r.dtype, CG_DTYPE_F32);
  assert_string_equal(r.desc.name, "res2a 3x3");
  assert_int_equal(cg_bdesc_problem_init(&bp, &r.desc, r.op, r.dtype,
                                         r.data_format, r.weights_format, err,
                                         sizeof(err)),
                   0);
  assert_int_equal(cg_layer_resolve(&bp.problem, &l, err, sizeof(err)), 0);
  assert_int_equal(l.ninputs, 3);
  assert_int_equal(cg_layer_noutputs(&l), 3);
  kt_dims_eq(l.out_dims[CG_GRAD_DIFF_WEIGHTS], L(3, 3, 64, 64));

  assert_int_equal(
      cg_bdesc_parse_run("deconv: mb2ic8ih4oc4oh8kh4sh2ph1 n\"up x=1\" "
                         "dtype=bf16 op=ConvTransposeBackwardData "
                         "data_format=NCX weights_format=IOX # warm",
                         &r, &is, err, sizeof(err)),
      0);
  assert_int_equal(r.desc.deconv, 1);
  assert_string_equal(r.desc.name, "up x=1");
  assert_int_equal(r.op, CG_OP_DECONV_BWD_DATA);
  assert_int_equal(r.dtype, CG_DTYPE_BF16);
  assert_int_equal(r.data_format, CG_DATA_NCX);
  assert_int_equal(r.weights_format, CG_WEIGHTS_IOX);
  assert_int_equal(cg_bdesc_problem_init(&bp, &r.desc, r.op, r.dtype,
                                         r.data_format, r.weights_format, err,
                                         sizeof(err)),
                   0);
  cg_geom g = kt_resolve_ok(&bp.problem);
  kt_dims_eq(g.out_dims, L(2, 8, 4, 4));

  assert_int_equal(
      cg_bdesc_parse_run("  # only a comment", &r, &is, err, sizeof(err)), 0);
  assert_int_equal(is, 0);
  static const struct {
    const char *text, *msg;
  } bad[] = {
      {"ic3oc8ih5kh3 dtype=f64", "dtype: invalid value \"f64\""},
      {"ic3oc8ih5kh3 op=Conv", "op: invalid value \"Conv\""},
      {"ic3oc8ih5kh3 layout=NCX", "unknown option \"layout\""},
      {"dtype=f32", "options without a descriptor"},
      {"ic3oc8ih5kh3 data_format=NCX extra",
       "\"extra\": expected OPTION=VALUE"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    int rc = cg_bdesc_parse_run(bad[i].text, &r, &is, err, sizeof(err));
    if (rc != CG_EINVAL || is != 0 || strstr(err, bad[i].msg) == NULL)
      fail_msg("\"%s\": got %s \"%s\", want \"%s\"", bad[i].text,
               cg_err_name(rc), err, bad[i].msg);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(run_lines),
      cmocka_unit_test(every_listed_descriptor),
      cmocka_unit_test(parse_rules),
      cmocka_unit_test(problem_list_lines),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
