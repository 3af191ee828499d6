/* test_npy.c - unit tests of the CLI's .npy reader/writer: round trips of
 * f32/f16/bf16 at several ranks, the exact header NumPy expects, and each
 * rejection (Fortran order, big-endian, unknown type, truncation, bad
 * magic, a header declaring more data than the file holds) with a message
 * naming the reason, and reading through a pipe. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cg/dtype.h"
#include "npy.h"

static char tmp_path[128];

static int setup(void **state) {
  (void)state;
  snprintf(tmp_path, sizeof tmp_path, "/tmp/cgc-npy-test-%d.npy",
           (int)getpid());
  return 0;
}

static int teardown(void **state) {
  (void)state;
  unlink(tmp_path);
  return 0;
}

static void round_trip(cg_dtype dt, int rank, const int64_t *dims) {
  size_t n = 1;
  for (int i = 0; i < rank; i++)
    n *= (size_t)dims[i];
  size_t bytes = n * cg_dtype_size(dt);
  unsigned char *data = malloc(bytes + 1);
  assert_non_null(data);
  for (size_t i = 0; i < n; i++)
    cg_store_f32(dt, data, i, (float)i * 0.25f - 3.0f);
  char err[256];
  assert_int_equal(
      cgc_npy_write(tmp_path, dt, rank, dims, data, bytes, err, sizeof err), 0);
  /* NumPy aligns the data start to 64 bytes. */
  FILE *fp = fopen(tmp_path, "rb");
  assert_non_null(fp);
  fseek(fp, 0, SEEK_END);
  long size = ftell(fp);
  fclose(fp);
  assert_int_equal((size_t)size % 64, bytes % 64);
  cgc_npy got;
  assert_int_equal(cgc_npy_read(tmp_path, &got, err, sizeof err), 0);
  assert_int_equal(got.dtype, dt);
  assert_int_equal(got.rank, rank);
  for (int i = 0; i < rank; i++)
    assert_int_equal(got.dims[i], dims[i]);
  assert_int_equal(got.nbytes, bytes);
  assert_memory_equal(got.data, data, bytes);
  cgc_npy_free(&got);
  free(data);
}

static void test_round_trip_f32(void **state) {
  (void)state;
  int64_t d1[] = {7}, d4[] = {2, 3, 4, 5}, d5[] = {1, 2, 3, 2, 2};
  round_trip(CG_DTYPE_F32, 1, d1);
  round_trip(CG_DTYPE_F32, 4, d4);
  round_trip(CG_DTYPE_F32, 5, d5);
}

static void test_round_trip_f16(void **state) {
  (void)state;
  int64_t d3[] = {2, 3, 9}, d4[] = {3, 3, 4, 8};
  round_trip(CG_DTYPE_F16, 3, d3);
  round_trip(CG_DTYPE_F16, 4, d4);
}

static void test_round_trip_bf16(void **state) {
  (void)state;
  int64_t d4[] = {1, 16, 5, 5}, d0[] = {0};
  round_trip(CG_DTYPE_BF16, 4, d4);
  round_trip(CG_DTYPE_BF16, 1, d0);
}

static void test_header_text(void **state) {
  (void)state;
  int64_t dims[] = {2, 3};
  float v[6] = {0};
  char err[256], buf[128];
  assert_int_equal(cgc_npy_write(tmp_path, CG_DTYPE_F32, 2, dims, v, sizeof v,
                                 err, sizeof err),
                   0);
  FILE *fp = fopen(tmp_path, "rb");
  assert_non_null(fp);
  assert_int_equal(fread(buf, 1, sizeof buf, fp), sizeof buf);
  fclose(fp);
  assert_memory_equal(buf, "\x93NUMPY\x01\x00", 8);
  size_t hlen = (size_t)(unsigned char)buf[8] | (size_t)buf[9] << 8;
  assert_int_equal((10 + hlen) % 64, 0);
  assert_non_null(strstr(buf + 10, "'descr': '<f4'"));
  assert_non_null(strstr(buf + 10, "'shape': (2, 3)"));
  assert_int_equal(buf[10 + hlen - 1], '\n');
}

/* Writes a v1 file with the given header dict and payload length. */
static void write_raw(const char *dict, size_t payload) {
  char hdr[256];
  size_t dl = strlen(dict), total = 10 + dl + 1;
  size_t pad = (64 - total % 64) % 64, hlen = dl + pad + 1;
  memcpy(hdr, "\x93NUMPY\x01\x00", 8);
  hdr[8] = (char)(hlen & 0xff);
  hdr[9] = (char)(hlen >> 8);
  FILE *fp = fopen(tmp_path, "wb");
  assert_non_null(fp);
  fwrite(hdr, 1, 10, fp);
  fwrite(dict, 1, dl, fp);
  for (size_t i = 0; i < pad; i++)
    fputc(' ', fp);
  fputc('\n', fp);
  for (size_t i = 0; i < payload; i++)
    fputc(0, fp);
  fclose(fp);
}

static void expect_reject(const char *needle) {
  cgc_npy got;
  char err[256] = "";
  assert_int_not_equal(cgc_npy_read(tmp_path, &got, err, sizeof err), 0);
  if (!strstr(err, needle))
    fail_msg("message '%s' lacks '%s'", err, needle);
  assert_null(got.data);
}

static void test_rejects(void **state) {
  (void)state;
  write_raw("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24);
  expect_reject("Fortran");
  write_raw("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", 24);
  expect_reject("'>f4'");
  write_raw("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", 16);
  expect_reject("not supported");
  write_raw("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 20);
  expect_reject("file holds 20 bytes of data, its header declares 24");
  write_raw("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 28);
  expect_reject("file holds 28 bytes of data, its header declares 24");
  write_raw("{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 3), }", 0);
  expect_reject("bad shape");
}

/* A header declaring 400 GB once made the reader allocate them before
 * finding the file empty. */
static void test_huge_header_refused_before_allocating(void **state) {
  (void)state;
  write_raw("{'descr': '<f4', 'fortran_order': False, "
            "'shape': (100000000000,), }",
            0);
  expect_reject("file holds 0 bytes of data, its header declares "
                "400000000000");
}

/* Reads tmp_path through a pipe, as from `--in0 /dev/stdin`. */
static int read_piped(cgc_npy *got, char *err, size_t errlen) {
  int fds[2];
  char path[32];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    char buf[4096];
    size_t n;
    FILE *fp = fopen(tmp_path, "rb");
    close(fds[0]);
    while (fp && (n = fread(buf, 1, sizeof buf, fp)) > 0)
      if (write(fds[1], buf, n) != (ssize_t)n)
        break;
    _exit(0);
  }
  close(fds[1]);
  snprintf(path, sizeof path, "/dev/fd/%d", fds[0]);
  int rc = cgc_npy_read(path, got, err, errlen);
  close(fds[0]);
  waitpid(pid, NULL, 0);
  return rc;
}

/* A pipe has no size to check first: its buffer grows with the data. */
static void test_pipe(void **state) {
  (void)state;
  cgc_npy got;
  char err[256] = "";
  int64_t dims[] = {3, 1 << 18}; /* 3 MiB: several growth steps */
  size_t bytes = (size_t)3 << 20;
  unsigned char *data = malloc(bytes);
  assert_non_null(data);
  for (size_t i = 0; i < bytes; i++)
    data[i] = (unsigned char)(i * 7);
  assert_int_equal(cgc_npy_write(tmp_path, CG_DTYPE_F32, 2, dims, data, bytes,
                                 err, sizeof err),
                   0);
  assert_int_equal(read_piped(&got, err, sizeof err), 0);
  assert_int_equal(got.nbytes, bytes);
  assert_memory_equal(got.data, data, bytes);
  cgc_npy_free(&got);
  free(data);
  write_raw("{'descr': '<f4', 'fortran_order': False, "
            "'shape': (100000000000,), }",
            16);
  assert_int_equal(read_piped(&got, err, sizeof err), CG_EINVAL);
  assert_non_null(strstr(err, "holds 16 bytes of data, its header declares "
                              "400000000000"));
  write_raw("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 28);
  assert_int_equal(read_piped(&got, err, sizeof err), CG_EINVAL);
  assert_non_null(strstr(err, "extra bytes after the 24 bytes of data"));
}

static void test_bad_magic_and_missing(void **state) {
  (void)state;
  FILE *fp = fopen(tmp_path, "wb");
  assert_non_null(fp);
  fputs("PK\x03\x04 definitely not numpy", fp);
  fclose(fp);
  expect_reject("not a .npy file");
  unlink(tmp_path);
  expect_reject("No such file");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip_f32),
      cmocka_unit_test(test_round_trip_f16),
      cmocka_unit_test(test_round_trip_bf16),
      cmocka_unit_test(test_header_text),
      cmocka_unit_test(test_rejects),
      cmocka_unit_test(test_huge_header_refused_before_allocating),
      cmocka_unit_test(test_pipe),
      cmocka_unit_test(test_bad_magic_and_missing),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
