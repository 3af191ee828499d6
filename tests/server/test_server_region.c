/* test_server_region.c - the region table (server/region.c) without gRPC:
 * the --shm-prefix check, and which regions cgs_regions_expire takes
 * (idle ones that no call holds) and which it leaves. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "cgs_region.h"

#define OBJECT_BYTES 8192

typedef struct fixture {
  char key[64];
  cgs_regions *rs;
} fixture;

static int setup(void **state) {
  static fixture f;
  char msg[256];
  snprintf(f.key, sizeof f.key, "/convgrad-test-region-%ld", (long)getpid());
  int fd = shm_open(f.key, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0 || ftruncate(fd, OBJECT_BYTES) != 0)
    return -1;
  close(fd);
  if (cgs_regions_new(&f.rs, 8, 1 << 20, "convgrad-", msg, sizeof msg) != 0)
    return -1;
  *state = &f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  cgs_regions_free(f->rs);
  shm_unlink(f->key);
  return 0;
}

static int reg(fixture *f, const char *owner, const char *name, const char *key,
               grpc_status_code *code, char *msg, size_t msglen) {
  return cgs_regions_register(f->rs, owner, name, key, 0, 4096, code, msg,
                              msglen);
}

/* A key outside the prefix is refused before the server opens anything,
 * even for an object that exists; one inside it is mapped. */
static void test_prefix(void **state) {
  fixture *f = *state;
  grpc_status_code code;
  char msg[512], other[64];
  snprintf(other, sizeof other, "/cgs-test-region-%ld", (long)getpid());
  int fd = shm_open(other, O_RDWR | O_CREAT | O_EXCL, 0600);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, OBJECT_BYTES), 0);
  close(fd);
  assert_int_equal(reg(f, "", "a", other, &code, msg, sizeof msg), -1);
  shm_unlink(other);
  assert_int_equal(code, GRPC_STATUS_PERMISSION_DENIED);
  assert_non_null(strstr(msg, "key:"));
  assert_non_null(strstr(msg, "--shm-prefix"));
  assert_int_equal(reg(f, "", "a", "/x-convgrad-y", &code, msg, sizeof msg),
                   -1);
  assert_int_equal(code, GRPC_STATUS_PERMISSION_DENIED);
  assert_int_equal(reg(f, "", "a", f->key, &code, msg, sizeof msg), 0);
  assert_int_equal(cgs_regions_count(f->rs), 1);
  assert_int_equal(
      cgs_regions_unregister(f->rs, "", "a", &code, msg, sizeof msg), 0);
}

/* Expiry takes idle regions of every owner, never one a call holds, and
 * the call's mapping outlives the entry until it lets go. */
static void test_expire(void **state) {
  fixture *f = *state;
  grpc_status_code code;
  char msg[512];
  cgs_region_info gone[4];
  assert_int_equal(reg(f, "", "idle", f->key, &code, msg, sizeof msg), 0);
  assert_int_equal(reg(f, "team", "busy", f->key, &code, msg, sizeof msg), 0);
  /* Nothing has been idle for an hour. */
  assert_int_equal(cgs_regions_expire(f->rs, 3600 * 1000, gone, 4), 0);
  assert_int_equal(cgs_regions_count(f->rs), 2);

  cgs_region *held;
  unsigned char *p;
  assert_int_equal(cgs_region_acquire(f->rs, "team", "inputs[0].region", "busy",
                                      0, 16, 4, &held, &p, &code, msg,
                                      sizeof msg),
                   0);
  /* With no idle time required, only the region no call holds goes. */
  assert_int_equal(cgs_regions_expire(f->rs, 0, gone, 4), 1);
  assert_string_equal(gone[0].name, "idle");
  assert_string_equal(gone[0].owner, "");
  assert_string_equal(gone[0].key, f->key);
  assert_int_equal(gone[0].calls, 0);
  assert_int_equal(cgs_regions_count(f->rs), 1);
  cgs_region_info listed[4];
  assert_int_equal(cgs_regions_list(f->rs, "team", listed, 4), 1);
  assert_int_equal(listed[0].calls, 1);

  /* The call ends: the region is idle from then on, and goes. */
  p[0] = 7; /* the mapping is still there */
  cgs_region_release(held);
  assert_int_equal(cgs_regions_expire(f->rs, 3600 * 1000, gone, 4), 0);
  assert_int_equal(cgs_regions_expire(f->rs, 0, gone, 4), 1);
  assert_string_equal(gone[0].name, "busy");
  assert_string_equal(gone[0].owner, "team");
  assert_int_equal(cgs_regions_count(f->rs), 0);

  /* A call on an expired name is told to register it again. */
  assert_int_equal(cgs_region_acquire(f->rs, "team", "inputs[0].region", "busy",
                                      0, 16, 4, &held, &p, &code, msg,
                                      sizeof msg),
                   -1);
  assert_int_equal(code, GRPC_STATUS_NOT_FOUND);
  assert_int_equal(reg(f, "team", "busy", f->key, &code, msg, sizeof msg), 0);
  assert_int_equal(
      cgs_regions_unregister(f->rs, "team", "busy", &code, msg, sizeof msg), 0);
}

/* More idle regions than the caller's room: the rest wait for the next
 * sweep. */
static void test_expire_in_batches(void **state) {
  fixture *f = *state;
  grpc_status_code code;
  char msg[512], name[16];
  cgs_region_info gone[2];
  for (int i = 0; i < 5; i++) {
    snprintf(name, sizeof name, "r%d", i);
    assert_int_equal(reg(f, "", name, f->key, &code, msg, sizeof msg), 0);
  }
  assert_int_equal(cgs_regions_expire(f->rs, 0, gone, 2), 2);
  assert_string_equal(gone[0].name, "r0");
  assert_string_equal(gone[1].name, "r1");
  assert_int_equal(cgs_regions_expire(f->rs, 0, gone, 2), 2);
  assert_int_equal(cgs_regions_expire(f->rs, 0, gone, 2), 1);
  assert_string_equal(gone[0].name, "r4");
  assert_int_equal(cgs_regions_count(f->rs), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_prefix),
      cmocka_unit_test(test_expire),
      cmocka_unit_test(test_expire_in_batches),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
