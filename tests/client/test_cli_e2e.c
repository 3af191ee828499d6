/* test_cli_e2e.c - the convgrad CLI against a live server: each
 * subcommand and its --help, README's info example, .npy interop with
 * NumPy in f32/f16/bf16 (also through a pipe), the graph JSON path, and the
 * failure exit codes, each with exactly one line on stderr. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cJSON.h>
#include <cmocka.h>

#include "harness.h"
#include "npy.h"
#include "spec.h"

static const char *server_exe, *cli, *data_dir;
static th_server srv;
static char target[64], tflag[80], tmpdir[128];

static int group_setup(void **state) {
  (void)state;
  if (th_server_start(&srv, server_exe, 0, NULL))
    return -1;
  snprintf(target, sizeof target, "127.0.0.1:%d", srv.port);
  snprintf(tflag, sizeof tflag, "--target=%s", target);
  snprintf(tmpdir, sizeof tmpdir, "/tmp/cgc-cli-test-%d", (int)getpid());
  mkdir(tmpdir, 0755);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  char cmd[256];
  th_server_stop(&srv);
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

static int count_lines(const char *s) {
  int n = 0;
  for (; *s; s++)
    n += *s == '\n';
  return n;
}

/* Runs the CLI, checks the exit code, and for failures that stderr holds
 * exactly one line containing needle. */
static void expect(th_run *r, int code, const char *needle,
                   const char *const *argv) {
  th_run_cmd(r, argv);
  if (r->code != code)
    fail_msg("%s %s: exit %d, expected %d\nstdout: %s\nstderr: %s", argv[1],
             argv[2] ? argv[2] : "", r->code, code, r->out, r->err);
  if (code != 0) {
    if (count_lines(r->err) != 1)
      fail_msg("expected one line on stderr, got: %s", r->err);
    if (needle && !strstr(r->err, needle))
      fail_msg("stderr lacks '%s': %s", needle, r->err);
  } else if (needle && !strstr(r->out, needle)) {
    fail_msg("stdout lacks '%s': %s", needle, r->out);
  }
}

static void test_help_everywhere(void **state) {
  (void)state;
  static const char *const cmds[] = {"health", "info",  "run",
                                     "smoke",  "bench", "version"};
  th_run r;
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    const char *argv[] = {cli, cmds[i], "--help", NULL};
    expect(&r, 0, "Exit codes", argv);
    assert_non_null(strstr(r.out, "--target"));
  }
  const char *argv[] = {cli, "--help", NULL};
  expect(&r, 0, "Commands", argv);
}

static void test_health(void **state) {
  (void)state;
  th_run r;
  const char *ok[] = {cli, "health", tflag, NULL};
  expect(&r, 0, "SERVING", ok);
  /* CONVGRAD_TARGET is the default target. */
  setenv("CONVGRAD_TARGET", target, 1);
  const char *env[] = {cli, "health", NULL};
  expect(&r, 0, "SERVING", env);
  unsetenv("CONVGRAD_TARGET");
  char dead[80];
  snprintf(dead, sizeof dead, "--target=127.0.0.1:%d", th_free_port());
  const char *down[] = {cli, "health", dead, "--retries", "1", NULL};
  expect(&r, 4, "unavailable", down);
  const char *unknown[] = {cli, "health", tflag, "--service", "nope", NULL};
  expect(&r, 6, "NOT_FOUND", unknown);
}

static void test_info(void **state) {
  (void)state;
  th_run r;
  const char *text[] = {cli, "info", tflag, NULL};
  expect(&r, 0, "ConvTransposeBackwardWeights", text);
  assert_non_null(strstr(r.out, "onednn"));
  const char *json[] = {cli, "info", tflag, "--json", NULL};
  expect(&r, 0, NULL, json);
  cJSON *root = cJSON_Parse(r.out);
  assert_non_null(root);
  cJSON *ops = cJSON_GetObjectItem(root, "ops");
  assert_int_equal(cJSON_GetArraySize(ops), 6);
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(
                       cJSON_GetArrayItem(ops, 5), "outputs")),
                   3);
  assert_non_null(cJSON_GetObjectItem(root, "limits"));
  /* The harness's server is started with no --workers: adaptive. */
  assert_string_equal(
      cJSON_GetStringValue(cJSON_GetObjectItem(root, "threads_policy")),
      "adaptive");
  cJSON_Delete(root);
}

/* The text after "prefix" in out, up to the end of its line, into buf. */
static void line_after(const char *out, const char *prefix, char *buf,
                       size_t cap) {
  const char *p = strstr(out, prefix);
  if (!p)
    fail_msg("no '%s' in: %s", prefix, out);
  p += strlen(prefix);
  snprintf(buf, cap, "%.*s", (int)strcspn(p, "\n"), p);
}

/* --version of the CLI (with the server's) and of the server binary: the
 * release everywhere, and the live server reports the oneDNN and ISA its
 * binary's --version names on this machine. */
static void test_version(void **state) {
  (void)state;
  th_run r, s;
  char want[256], got[256], onednn[128], grpc_cli[64], grpc_server[64];
  const char *argv[] = {cli, "--version", tflag, NULL};
  expect(&r, 0,
         "convgrad " CG_TEST_VERSION "\nlibcgclient " CG_TEST_VERSION
         ", gRPC core ",
         argv);
  const char *server[] = {server_exe, "--version", NULL};
  th_run_cmd(&s, server);
  assert_int_equal(s.code, 0);
  assert_memory_equal(s.out, "convgrad-server " CG_TEST_VERSION "\n",
                      strlen("convgrad-server " CG_TEST_VERSION "\n"));
  line_after(s.out, "\noneDNN ", onednn, sizeof onednn);
  assert_non_null(strstr(onednn, ", ISA "));
  snprintf(want, sizeof want,
           "%s: convgrad-server " CG_TEST_VERSION ", oneDNN %s", target,
           onednn);
  line_after(r.out, "\nserver ", got, sizeof got);
  assert_string_equal(got, want);
  /* One build, one libgrpc. */
  line_after(r.out, "gRPC core ", grpc_cli, sizeof grpc_cli);
  line_after(s.out, "gRPC core ", grpc_server, sizeof grpc_server);
  assert_string_equal(grpc_cli, grpc_server);
  /* No server: the local lines and exit 0, the server line says why. */
  char dead[80];
  snprintf(dead, sizeof dead, "--target=127.0.0.1:%d", th_free_port());
  const char *down[] = {cli, "version", dead, NULL};
  expect(&r, 0, "convgrad " CG_TEST_VERSION "\n", down);
  assert_non_null(strstr(r.out, ": no answer (UNAVAILABLE: "));
}

/* What an info line shows on every machine: its label, or for the two
 * limits lines their items without their numbers. */
static void info_shape(char *line) {
  if (!strncmp(line, "limits", 6) || !strncmp(line, "attributes", 10)) {
    char *w = line;
    for (const char *r = line; *r; r++)
      if (*r < '0' || *r > '9')
        *w++ = *r;
    *w = '\0';
    return;
  }
  char *gap = strstr(line + strspn(line, " "), "  ");
  if (gap)
    *gap = '\0';
}

/* Copies the line at *p into buf and moves *p past it. */
static void next_line(const char **p, char *buf, size_t cap) {
  size_t n = strcspn(*p, "\n");
  snprintf(buf, cap, "%.*s", (int)n, *p);
  *p += n + ((*p)[n] == '\n');
}

/* client/README.md's `convgrad info` example had fallen behind the output (no
 * io cpus line, limits without idle timeout and stream window). */
static void test_readme_info_example(void **state) {
  (void)state;
  static char readme[1 << 16];
  char path[512], a[1024], b[1024];
  th_run r;
  snprintf(path, sizeof path, "%s/../../../client/README.md", data_dir);
  FILE *fp = fopen(path, "r");
  assert_non_null(fp);
  readme[fread(readme, 1, sizeof readme - 1, fp)] = '\0';
  fclose(fp);
  const char *ex = strstr(readme, "$ convgrad info\n");
  assert_non_null(ex);
  ex += strlen("$ convgrad info\n");
  const char *end = strstr(ex, "```");
  assert_non_null(end);
  const char *argv[] = {cli, "info", tflag, NULL};
  expect(&r, 0, "limits", argv);
  const char *out = r.out;
  while (ex < end || *out) {
    next_line(&ex, a, sizeof a);
    next_line(&out, b, sizeof b);
    info_shape(a);
    info_shape(b);
    assert_string_equal(a, b);
  }
}

static void test_run_flags_check_and_out(void **state) {
  (void)state;
  th_run r;
  char out[256];
  snprintf(out, sizeof out, "%s/flags_out.npy", tmpdir);
  const char *argv[] = {cli,
                        "run",
                        tflag,
                        "--op",
                        "ConvolutionBackpropData",
                        "--data-format",
                        "NCX",
                        "--weights-format",
                        "OIX",
                        "--in0-shape",
                        "2,6,4,4",
                        "--in1-shape",
                        "6,2,3,3",
                        "--groups",
                        "2",
                        "--strides",
                        "2,2",
                        "--pads-begin",
                        "1,1",
                        "--pads-end",
                        "1,1",
                        "--dst-shape",
                        "2,4,8,8",
                        "--shape-input",
                        "--seed",
                        "9",
                        "--out",
                        out,
                        "--check",
                        NULL};
  expect(&r, 0, "check: max abs err", argv);
  assert_non_null(strstr(r.out, ": OK"));
  assert_non_null(strstr(r.out, "diff_src [2, 4, 8, 8]"));
  cgc_npy n;
  char err[256];
  assert_int_equal(cgc_npy_read(out, &n, err, sizeof err), 0);
  assert_int_equal(n.rank, 4);
  assert_int_equal(n.dims[3], 8);
  assert_int_equal(n.dtype, CG_DTYPE_F32);
  cgc_npy_free(&n);
  /* Each op by name, with the reference check. */
  const char *bw[] = {cli,
                      "run",
                      tflag,
                      "--op",
                      "ConvTransposeBackwardWeights-1",
                      "--in0-shape",
                      "1,5,5,3",
                      "--in1-shape",
                      "1,11,11,4",
                      "--strides",
                      "2,2",
                      "--weights-shape",
                      "3,3,4,3",
                      "--check",
                      NULL};
  expect(&r, 0, ": OK", bw);
  /* A benchdnn descriptor instead of shapes. */
  const char *desc[] = {cli,
                        "run",
                        tflag,
                        "--op",
                        "ConvolutionBackwardWeights",
                        "--problem",
                        "g2mb2ic8ih10oc4oh5kh3sh2ph1",
                        "--dtype",
                        "bf16",
                        "--check",
                        NULL};
  expect(&r, 0, "ConvolutionBackwardWeights bf16: diff_weights", desc);
  assert_non_null(strstr(r.out, ": OK"));
}

/* --problem used to build the descriptor's shapes in the default NXC/XIO
 * layouts and only relabel them with --data-format/--weights-format, so a
 * transposed problem ran (or the server refused it). */
static void test_run_problem_in_given_formats(void **state) {
  (void)state;
  static const struct {
    const char *op, *problem, *weights_format, *want;
  } cases[] = {
      {"ConvolutionBackwardData", "mb2ic16ih16iw8oc16oh16ow8kh3kw3ph1pw1", NULL,
       "diff_src [2, 16, 16, 8] NCX"},
      {"ConvolutionBackwardData", "mb2ic16ih14oc32oh14kh3ph1", "OIX",
       "diff_src [2, 16, 14, 14] NCX"},
      {"ConvolutionBackwardWeights", "mb2ic16ih14oc32oh14kh3ph1", "OIX",
       "diff_weights [32, 16, 3, 3] OIX"},
  };
  th_run r;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *argv[] = {cli,
                          "run",
                          tflag,
                          "--op",
                          cases[i].op,
                          "--problem",
                          cases[i].problem,
                          "--data-format",
                          "NCX",
                          "--check",
                          cases[i].weights_format ? "--weights-format" : NULL,
                          cases[i].weights_format,
                          NULL};
    expect(&r, 0, cases[i].want, argv);
    assert_non_null(strstr(r.out, ": OK"));
  }
}

static void test_run_graph_json(void **state) {
  (void)state;
  th_run r;
  char f1[512], f2[512];
  snprintf(f1, sizeof f1, "%s/conv_bwd_d_2d.json", data_dir);
  snprintf(f2, sizeof f2, "%s/deconv_bwd_w_v06.json", data_dir);
  const char *a[] = {cli, "run", tflag, "--graph", f1, "--check", NULL};
  expect(&r, 0, "ConvolutionBackwardData f32: diff_src [1, 4, 8, 8] NCX", a);
  assert_non_null(strstr(r.out, ": OK"));
  const char *b[] = {cli, "run", tflag, "--graph", f2, "--check", NULL};
  expect(&r, 0, "ConvTransposeBackwardWeights bf16: diff_weights [3, 3, 4, 3]",
         b);
  assert_non_null(strstr(r.out, ": OK"));
  /* Flags override the file. */
  const char *c[] = {cli,       "run", tflag,     "--graph", f1,
                     "--dtype", "f16", "--check", NULL};
  expect(&r, 0, "ConvolutionBackwardData f16", c);
  const char *bad[] = {cli, "run", tflag, "--graph", "/nonexistent.json", NULL};
  expect(&r, 3, "/nonexistent.json", bad);
}

/* Writes json to tmpdir/name and expects `run --graph` on it to exit 3
 * with needle in its one line on stderr. */
static void expect_graph_refused(const char *name, const char *json,
                                 const char *needle) {
  th_run r;
  char f[256];
  snprintf(f, sizeof f, "%s/%s", tmpdir, name);
  assert_int_equal(th_write_file(f, json), 0);
  const char *argv[] = {cli, "run", tflag, "--graph", f, NULL};
  expect(&r, 3, needle, argv);
}

/* An "attrs" array made `run --graph` crash on its members' NULL names. */
static void test_run_graph_attrs_array(void **state) {
  (void)state;
  expect_graph_refused(
      "attrs_array.json",
      "{\"graph\": [{\"kind\": \"ConvolutionBackwardData\", "
      "\"attrs\": [{\"type\": \"s64[]\", \"value\": [1, 1]}], "
      "\"inputs\": [{\"dtype\": \"f32\", \"shape\": [1, 4, 4, 4]}, "
      "{\"dtype\": \"f32\", \"shape\": [3, 3, 4, 4]}]}]}",
      "attrs must be an object");
}

/* The graph reader's dense-stride check overflowed on huge dims. */
static void test_run_graph_stride_overflow(void **state) {
  (void)state;
  expect_graph_refused(
      "stride_overflow.json",
      "{\"graph\": [{\"kind\": \"ConvolutionBackwardData\", "
      "\"inputs\": [{\"dtype\": \"f32\", \"shape\": "
      "[4294967296, 4294967296], \"stride\": [4294967296, 1]}, "
      "{\"dtype\": \"f32\", \"shape\": [3, 3, 4, 4]}]}]}",
      "inputs[0]: the shape's element count overflows");
}

/* Shapes of hundreds of GB used to reach malloc before any check: a
 * 79-byte .npy declaring 400 GB, and random inputs from flags, a graph
 * file or a descriptor. */
static void test_huge_shapes_refused_before_allocating(void **state) {
  (void)state;
  th_run r;
  static const char hdr[] =
      "\x93NUMPY\x01\x00\x45\x00{'descr': '<f4', 'fortran_order': False, "
      "'shape': (100000000000,), }\n";
  char npy[256];
  snprintf(npy, sizeof npy, "%s/huge.npy", tmpdir);
  FILE *fp = fopen(npy, "wb");
  assert_non_null(fp);
  assert_int_equal(fwrite(hdr, 1, sizeof hdr - 1, fp), 79);
  assert_int_equal(fclose(fp), 0);
  const char *file[] = {
      cli,     "run", tflag,         "--op",    "ConvolutionBackwardData",
      "--in0", npy,   "--in1-shape", "3,3,4,4", NULL};
  expect(&r, 3, "file holds 0 bytes of data, its header declares 400000000000",
         file);
  const char *flags[] = {cli,
                         "run",
                         tflag,
                         "--op",
                         "ConvolutionBackwardData",
                         "--in0-shape",
                         "100000000000",
                         "--in1-shape",
                         "3,3,4,4",
                         NULL};
  expect(&r, 3,
         "input 0 (diff_dst): more than the limit of 1073741824 elements",
         flags);
  expect_graph_refused(
      "huge.json",
      "{\"graph\": [{\"kind\": \"ConvolutionBackwardData\", "
      "\"inputs\": [{\"dtype\": \"f32\", \"shape\": [1, 4, 4, 4]}, "
      "{\"dtype\": \"f32\", \"shape\": [3, 3, 4, 100000000000]}]}]}",
      "input 1 (weights): more than the limit of 1073741824");
  const char *desc = "mb100000ic16ih1000oc1000oh1000kh1";
  const char *run[] = {
      cli,         "run", tflag, "--op", "ConvolutionBackwardData",
      "--problem", desc,  NULL};
  expect(&r, 3, "input 0 (diff_dst): more than the limit", run);
  const char *bench[] = {
      cli, "bench", tflag, "--problem", desc, "--op", "ConvolutionBackwardData",
      NULL};
  expect(&r, 3,
         "mb100000ic16ih1000oc1000oh1000kh1: input 0 (diff_dst): more than "
         "the limit",
         bench);
}

static void test_npy_interop_numpy(void **state) {
  (void)state;
  th_run r;
  const char *py = "/usr/bin/python3";
  char tool[512];
  snprintf(tool, sizeof tool, "%s/../npy_tool.py", data_dir);
  const char *mk[] = {py, tool, "make", tmpdir, NULL};
  th_run_cmd(&r, mk);
  if (r.code != 0)
    fail_msg("npy_tool make: %s", r.err);
  static const char *const dts[] = {"f32", "f16", "bf16"};
  for (int i = 0; i < 3; i++) {
    char in0[256], in1[256], out[256];
    snprintf(in0, sizeof in0, "%s/dd_%s.npy", tmpdir, dts[i]);
    snprintf(in1, sizeof in1, "%s/w_%s.npy", tmpdir, dts[i]);
    snprintf(out, sizeof out, "%s/out_%s.npy", tmpdir, dts[i]);
    const char *run[] = {cli,
                         "run",
                         tflag,
                         "--op",
                         "ConvolutionBackwardData",
                         "--data-format",
                         "NCX",
                         "--weights-format",
                         "OIX",
                         "--pads-begin",
                         "1,1",
                         "--pads-end",
                         "1,1",
                         "--in0",
                         in0,
                         "--in1",
                         in1,
                         "--out",
                         out,
                         "--check",
                         NULL};
    expect(&r, 0, ": OK", run);
    const char *chk[] = {py, tool, "check", out, dts[i], "2,4,7,7", NULL};
    th_run_cmd(&r, chk);
    if (r.code != 0)
      fail_msg("numpy cannot read %s: %s", out, r.err);
  }
  char bad[256], in1[256];
  snprintf(in1, sizeof in1, "%s/w_f32.npy", tmpdir);
  snprintf(bad, sizeof bad, "%s/fortran.npy", tmpdir);
  const char *f[] = {cli,
                     "run",
                     tflag,
                     "--op",
                     "ConvolutionBackwardData",
                     "--data-format",
                     "NCX",
                     "--weights-format",
                     "OIX",
                     "--in0",
                     bad,
                     "--in1",
                     in1,
                     NULL};
  expect(&r, 3, "Fortran-order", f);
  snprintf(bad, sizeof bad, "%s/f64.npy", tmpdir);
  f[10] = bad;
  expect(&r, 3, "'<f8'", f);
}

/* Without --dtype, --in0 was read twice (a dtype probe, then the load),
 * so a pipe reached the load empty. */
static void test_run_in0_from_pipe(void **state) {
  (void)state;
  th_run r;
  uint16_t dd[2 * 6 * 7 * 7], w[6 * 4 * 3 * 3];
  uint64_t seed = 4;
  char in0[256], in1[256], err[256], sh[1024];
  cg_fill_uniform(CG_DTYPE_F16, dd, sizeof dd / 2, &seed);
  cg_fill_uniform(CG_DTYPE_F16, w, sizeof w / 2, &seed);
  snprintf(in0, sizeof in0, "%s/pipe_dd_f16.npy", tmpdir);
  snprintf(in1, sizeof in1, "%s/pipe_w_f16.npy", tmpdir);
  assert_int_equal(cgc_npy_write(in0, CG_DTYPE_F16, 4, (int64_t[]){2, 6, 7, 7},
                                 dd, sizeof dd, err, sizeof err),
                   0);
  assert_int_equal(cgc_npy_write(in1, CG_DTYPE_F16, 4, (int64_t[]){6, 4, 3, 3},
                                 w, sizeof w, err, sizeof err),
                   0);
  snprintf(sh, sizeof sh,
           "cat '%s' | '%s' run %s --op ConvolutionBackwardData "
           "--data-format NCX --weights-format OIX --pads-begin 1,1 "
           "--pads-end 1,1 --in0 /dev/stdin --in1 '%s' --check",
           in0, cli, tflag, in1);
  const char *argv[] = {"/bin/sh", "-c", sh, NULL};
  expect(&r, 0, "ConvolutionBackwardData f16: diff_src [2, 4, 7, 7]", argv);
  assert_non_null(strstr(r.out, ": OK"));
}

static void test_failure_exit_codes(void **state) {
  (void)state;
  th_run r;
  const char *flag[] = {cli, "run", tflag, "--frobnicate", NULL};
  expect(&r, 2, "unknown option '--frobnicate'", flag);
  const char *noval[] = {cli, "run", tflag, "--op", NULL};
  expect(&r, 2, "--op needs a value", noval);
  const char *badval[] = {cli, "health", tflag, "--retries", "many", NULL};
  expect(&r, 2, "bad value 'many' for --retries", badval);
  const char *cmd[] = {cli, "transmogrify", NULL};
  expect(&r, 2, "unknown command", cmd);
  /* Each subcommand's own option kinds (cli.h), one usage line each. */
  const char *bench_num[] = {cli, "bench", "--concurrency", "0", NULL};
  expect(&r, 2, "--concurrency must be 1..256", bench_num);
  /* A value too large has a message of its own, not "must be >= 1". */
  const char *bench_big[] = {cli, "bench", "--requests", "100000000", NULL};
  expect(&r, 2, "--requests: too large, at most 10000000", bench_big);
  const char *bench_small[] = {cli, "bench", "--requests", "0", NULL};
  expect(&r, 2, "--requests must be >= 1", bench_small);
  const char *bench_name[] = {cli, "bench", "--weights-format", "ABC", NULL};
  expect(&r, 2, "--weights-format must be OIX, XIO, IOX or XOI, got 'ABC'",
         bench_name);
  const char *run_name[] = {cli,       "run", "--op", "ConvolutionBackwardData",
                            "--dtype", "f64", NULL};
  expect(&r, 2, "--dtype must be f32, bf16 or f16, got 'f64'", run_name);
  const char *run_num[] = {cli, "run", "--seed", "-1", NULL};
  expect(&r, 2, "--seed: expected a non-negative integer", run_num);
  const char *smoke_num[] = {cli, "smoke", "--wait", "x", NULL};
  expect(&r, 2, "--wait: expected seconds", smoke_num);
  const char *flag_val[] = {cli, "info", "--json=1", NULL};
  expect(&r, 2, "unknown option '--json=1'", flag_val);
  const char *stray[] = {cli, "health", "extra", NULL};
  expect(&r, 2, "unexpected argument 'extra'", stray);
  const char *list[] = {
      cli,         "run", tflag, "--op", "ConvolutionBackwardData",
      "--strides", "2,x", NULL};
  expect(&r, 2, "--strides", list);
  const char *npy[] = {cli,
                       "run",
                       tflag,
                       "--op",
                       "ConvolutionBackwardData",
                       "--in0",
                       "/nonexistent/a.npy",
                       "--in1-shape",
                       "3,3,4,4",
                       NULL};
  expect(&r, 3, "/nonexistent/a.npy", npy);
  const char *inval[] = {cli,
                         "run",
                         tflag,
                         "--op",
                         "ConvolutionBackwardData",
                         "--in0-shape",
                         "1,8,8,4",
                         "--in1-shape",
                         "3,3,4,4",
                         "--dilations",
                         "1,0",
                         NULL};
  expect(&r, 5, "rejected the request: dilations[1]", inval);
  char dead[80];
  snprintf(dead, sizeof dead, "--target=127.0.0.1:%d", th_free_port());
  const char *down[] = {cli,
                        "run",
                        dead,
                        "--retries",
                        "1",
                        "--op",
                        "ConvolutionBackwardData",
                        "--in0-shape",
                        "1,8,8,4",
                        "--in1-shape",
                        "3,3,4,4",
                        NULL};
  expect(&r, 4, "unavailable", down);
  const char *badtarget[] = {cli, "health", "--target", "a:1,b", NULL};
  expect(&r, 2, "target", badtarget);
}

/* Malformed targets reached gRPC: 127.0.0.1:103999 was dialled as port
 * 38463, the others failed as "unavailable". They are usage errors. */
static void test_bad_target_is_usage_error(void **state) {
  (void)state;
  static const char *const bad[][2] = {
      {"127.0.0.1:103999", "port must be in 1..65535"},
      {"ipv4:garbage", "'garbage': expected HOST:PORT"},
      {"dns:///", "no server named after 'dns:'"},
      {"unix:", "no server named after 'unix:'"}};
  th_run r;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *argv[] = {cli, "health",     "--target", bad[i][0], "--retries",
                          "0", "--deadline", "1000",     NULL};
    expect(&r, 2, bad[i][1], argv);
  }
}

static void test_smoke(void **state) {
  (void)state;
  th_run r;
  const char *argv[] = {cli, "smoke", tflag, "--wait", "10", NULL};
  expect(&r, 0, "passed against", argv);
  assert_null(strstr(r.out, "FAIL"));
}

static void test_bench(void **state) {
  (void)state;
  th_run r;
  char list[256];
  snprintf(list, sizeof list, "%s/problems.txt", tmpdir);
  assert_int_equal(th_write_file(list, "# tiny problems\n"
                                       "mb1ic4ih8oc4oh8kh3ph1\n"
                                       "deconv: mb1ic4ih4oc4oh8kh2sh2\n"),
                   0);
  const char *table[] = {cli,  "bench",      tflag, "--problems",
                         list, "--requests", "20",  "--concurrency",
                         "4",  NULL};
  expect(&r, 0, "p50 ms", table);
  assert_non_null(strstr(r.out, "ConvTransposeBackwardWeights"));
  assert_int_equal(count_lines(r.out), 5); /* header + 2 x 2 ops */
  const char *json[] = {cli,
                        "bench",
                        tflag,
                        "--problem",
                        "mb1ic4ih8oc4oh8kh3ph1",
                        "--op",
                        "ConvolutionBackwardData",
                        "--requests",
                        "10",
                        "--json",
                        NULL};
  expect(&r, 0, NULL, json);
  cJSON *root = cJSON_Parse(r.out);
  assert_non_null(root);
  assert_int_equal(cJSON_GetArraySize(root), 1);
  cJSON *row = cJSON_GetArrayItem(root, 0);
  assert_true(cJSON_GetObjectItem(row, "p50_ms")->valuedouble > 0);
  assert_true(cJSON_GetObjectItem(row, "p99_ms")->valuedouble >=
              cJSON_GetObjectItem(row, "p50_ms")->valuedouble);
  assert_true(cJSON_GetObjectItem(row, "requests_per_s")->valuedouble > 0);
  cJSON_Delete(root);
  /* The layer ops time a layer's whole backward: one row per descriptor
   * of their family, three outputs' bytes each. */
  const char *layer[] = {cli,
                         "bench",
                         tflag,
                         "--problems",
                         list,
                         "--op",
                         "ConvolutionBackward",
                         "--requests",
                         "10",
                         "--concurrency",
                         "3",
                         "--json",
                         NULL};
  expect(&r, 0, NULL, layer);
  root = cJSON_Parse(r.out);
  assert_non_null(root);
  assert_int_equal(cJSON_GetArraySize(root), 1);
  row = cJSON_GetArrayItem(root, 0);
  assert_string_equal(cJSON_GetObjectItem(row, "op")->valuestring,
                      "ConvolutionBackward");
  assert_int_equal(cJSON_GetObjectItem(row, "requests")->valueint, 10);
  assert_int_equal(cJSON_GetObjectItem(row, "errors")->valueint, 0);
  assert_true(cJSON_GetObjectItem(row, "p50_ms")->valuedouble > 0);
  cJSON_Delete(root);
  const char *deconv_layer[] = {cli,
                                "bench",
                                tflag,
                                "--problems",
                                list,
                                "--op",
                                "ConvTransposeBackward",
                                "--requests",
                                "5",
                                NULL};
  expect(&r, 0, "ConvTransposeBackward ", deconv_layer);
  assert_int_equal(count_lines(r.out), 2); /* header + the deconv: row */
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s convgrad-server convgrad DATA_DIR\n", argv[0]);
    return 2;
  }
  server_exe = argv[1];
  cli = argv[2];
  data_dir = argv[3];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_help_everywhere),
      cmocka_unit_test(test_health),
      cmocka_unit_test(test_info),
      cmocka_unit_test(test_readme_info_example),
      cmocka_unit_test(test_version),
      cmocka_unit_test(test_run_flags_check_and_out),
      cmocka_unit_test(test_run_problem_in_given_formats),
      cmocka_unit_test(test_run_graph_json),
      cmocka_unit_test(test_run_graph_attrs_array),
      cmocka_unit_test(test_run_graph_stride_overflow),
      cmocka_unit_test(test_huge_shapes_refused_before_allocating),
      cmocka_unit_test(test_npy_interop_numpy),
      cmocka_unit_test(test_run_in0_from_pipe),
      cmocka_unit_test(test_failure_exit_codes),
      cmocka_unit_test(test_bad_target_is_usage_error),
      cmocka_unit_test(test_smoke),
      cmocka_unit_test(test_bench),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
