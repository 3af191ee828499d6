/* test_server_store.c - the store of staged tensors (server/store.c)
 * without gRPC: scopes, the byte budget and its least-recently-used
 * eviction, a client's share, the time to live, and entries that calls
 * hold outliving their eviction, expiry and the store itself. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cgs_buf.h"
#include "cgs_store.h"

#define KB 1024u

/* An id whose first byte is n (the store trusts its caller to have
 * verified ids; only their equality matters here). */
static void make_id(unsigned char id[CGS_STORE_ID_BYTES], int n) {
  memset(id, 0x5a, CGS_STORE_ID_BYTES);
  id[0] = (unsigned char)n;
  id[31] = (unsigned char)(n >> 8);
}

/* Stages len bytes of value as id n for charge by in scope, a private
 * entry of by when priv; returns cgs_store_put's result. */
static int put_as(cgs_store *st, const char *scope, const char *by, int priv,
                  int n, int value, size_t len, uint64_t now, int *retry) {
  unsigned char id[CGS_STORE_ID_BYTES];
  make_id(id, n);
  unsigned char *data = cgs_buf_alloc(len);
  assert_non_null(data);
  memset(data, value, len);
  grpc_status_code code = GRPC_STATUS_OK;
  char msg[256];
  int rc = cgs_store_put(st, scope, by, priv, id, data, len, now, retry, &code,
                         msg, sizeof msg);
  if (rc != 0)
    assert_int_equal(code, GRPC_STATUS_RESOURCE_EXHAUSTED);
  return rc;
}

/* A content entry of value n as id n. */
static int put(cgs_store *st, const char *scope, const char *by, int n,
               size_t len, uint64_t now, int *retry) {
  return put_as(st, scope, by, 0, n, n, len, now, retry);
}

static int has(cgs_store *st, const char *scope, int n, size_t len,
               uint64_t now) {
  unsigned char id[CGS_STORE_ID_BYTES];
  make_id(id, n);
  return cgs_store_touch(st, scope, NULL, id, len, now);
}

/* scope's content entry n (peer NULL), or peer's private one. */
static cgs_staged *get_of(cgs_store *st, const char *scope, const char *peer,
                          int n, uint64_t now) {
  unsigned char id[CGS_STORE_ID_BYTES];
  make_id(id, n);
  return cgs_store_get(st, scope, peer, id, now);
}

static cgs_staged *get(cgs_store *st, const char *scope, int n, uint64_t now) {
  return get_of(st, scope, NULL, n, now);
}

/* The first byte of scope's entry n (peer as get_of), or -1 when none. */
static int value_of(cgs_store *st, const char *scope, const char *peer, int n) {
  cgs_staged *e = get_of(st, scope, peer, n, 1);
  if (!e)
    return -1;
  int v = cgs_staged_data(e)[0];
  cgs_staged_release(e);
  return v;
}

static cgs_store *new_store(uint64_t budget, uint64_t ttl, uint64_t share) {
  cgs_store *st;
  char msg[128];
  assert_int_equal(cgs_store_new(&st, budget, ttl, share, msg, sizeof msg), 0);
  return st;
}

/* A scope sees only its own entries; an entry is its bytes. */
static void test_scopes(void **state) {
  (void)state;
  cgs_store *st = new_store(64 * KB, 1000, 64 * KB);
  int retry;
  assert_int_equal(put(st, "a", "a", 1, 4 * KB, 0, &retry), 0);
  assert_true(has(st, "a", 1, 4 * KB, 1));
  assert_false(has(st, "b", 1, 4 * KB, 1));
  assert_false(has(st, "a", 1, 8 * KB, 1)); /* another size: not it */
  cgs_staged *e = get(st, "a", 1, 2);
  assert_non_null(e);
  assert_int_equal(cgs_staged_len(e), 4 * KB);
  assert_int_equal(cgs_staged_data(e)[4 * KB - 1], 1);
  cgs_staged_release(e);
  assert_null(get(st, "", 1, 2));
  /* The same content again is one entry. */
  assert_int_equal(put(st, "a", "a", 1, 4 * KB, 3, &retry), 0);
  cgs_store_stats s;
  cgs_store_stats_get(st, &s);
  assert_int_equal(s.entries, 1);
  assert_int_equal(s.bytes, 4 * KB);
  assert_int_equal(s.hits, 2);
  assert_int_equal(s.misses, 3);
  cgs_store_free(st);
}

/* Past the budget the least recently used entry goes, not one used
 * since; too large an entry is refused for good. */
/* Private entries: only their charge finds them, never as content, and
 * content never as them; the same id is a separate entry of each charge
 * and of the content, and the first upload under a name stays. */
static void test_private(void **state) {
  (void)state;
  cgs_store *st = new_store(64 * KB, 1000, 64 * KB);
  unsigned char id[CGS_STORE_ID_BYTES];
  make_id(id, 1);
  int retry;
  assert_int_equal(put_as(st, "", "p1", 1, 1, 11, KB, 0, &retry), 0);
  assert_true(cgs_store_touch(st, "", "p1", id, KB, 1));
  assert_false(cgs_store_touch(st, "", "p2", id, KB, 1));
  assert_false(cgs_store_touch(st, "", NULL, id, KB, 1));
  assert_false(cgs_store_touch(st, "s", "p1", id, KB, 1));
  assert_int_equal(value_of(st, "", NULL, 1), -1);
  assert_int_equal(put_as(st, "", "p2", 0, 1, 22, KB, 0, &retry), 0);
  assert_int_equal(put_as(st, "", "p2", 1, 1, 33, KB, 0, &retry), 0);
  assert_int_equal(put_as(st, "", "p1", 1, 1, 44, KB, 0, &retry), 0);
  assert_int_equal(value_of(st, "", "p1", 1), 11);
  assert_int_equal(value_of(st, "", "p2", 1), 33);
  assert_int_equal(value_of(st, "", NULL, 1), 22);
  cgs_store_stats stats;
  cgs_store_stats_get(st, &stats);
  assert_int_equal(stats.entries, 3);
  cgs_store_free(st);
}

static void test_budget_lru(void **state) {
  (void)state;
  cgs_store *st = new_store(16 * KB, 1000, 16 * KB);
  int retry;
  for (int n = 1; n <= 4; n++)
    assert_int_equal(put(st, "", "p", n, 4 * KB, (uint64_t)n, &retry), 0);
  assert_true(has(st, "", 1, 4 * KB, 5)); /* 1 is the newest now */
  assert_int_equal(put(st, "", "p", 5, 4 * KB, 6, &retry), 0);
  assert_true(has(st, "", 1, 4 * KB, 7));
  assert_false(has(st, "", 2, 4 * KB, 7));
  assert_true(has(st, "", 5, 4 * KB, 7));
  cgs_store_stats s;
  cgs_store_stats_get(st, &s);
  assert_int_equal(s.evictions, 1);
  assert_int_equal(s.bytes, 16 * KB);
  assert_int_equal(put(st, "", "p", 6, 17 * KB, 8, &retry), -1);
  assert_int_equal(retry, 0);
  grpc_status_code code;
  char msg[256];
  assert_int_equal(cgs_store_admit(st, 17 * KB, &code, msg, sizeof msg), -1);
  assert_non_null(strstr(msg, "--store-bytes"));
  cgs_store_free(st);
}

/* One client cannot take more than its share: its own oldest entries
 * make room, and another's stay. */
static void test_peer_share(void **state) {
  (void)state;
  cgs_store *st = new_store(32 * KB, 1000, 12 * KB);
  int retry;
  assert_int_equal(put(st, "", "quiet", 1, 8 * KB, 1, &retry), 0);
  for (int n = 2; n <= 6; n++)
    assert_int_equal(put(st, "", "greedy", n, 4 * KB, (uint64_t)n, &retry), 0);
  assert_true(has(st, "", 1, 8 * KB, 10));
  assert_false(has(st, "", 2, 4 * KB, 10));
  assert_false(has(st, "", 3, 4 * KB, 10));
  for (int n = 4; n <= 6; n++)
    assert_true(has(st, "", n, 4 * KB, 10));
  grpc_status_code code;
  char msg[256];
  assert_int_equal(cgs_store_admit(st, 13 * KB, &code, msg, sizeof msg), -1);
  assert_non_null(strstr(msg, "--store-peer-share"));
  cgs_store_free(st);
}

/* An entry a call holds is not evicted for room; with nothing else to
 * drop, the upload is refused "retry later"; once released it goes. */
static void test_held_not_evicted(void **state) {
  (void)state;
  cgs_store *st = new_store(8 * KB, 1000, 8 * KB);
  int retry;
  assert_int_equal(put(st, "", "p", 1, 8 * KB, 1, &retry), 0);
  cgs_staged *e = get(st, "", 1, 2);
  assert_non_null(e);
  assert_int_equal(put(st, "", "p", 2, 4 * KB, 3, &retry), -1);
  assert_int_equal(retry, 1);
  assert_int_equal(cgs_staged_data(e)[0], 1);
  cgs_staged_release(e);
  assert_int_equal(put(st, "", "p", 2, 4 * KB, 4, &retry), 0);
  assert_false(has(st, "", 1, 8 * KB, 5));
  cgs_store_free(st);
}

/* The time to live counts from the last use; an expired entry a call
 * holds keeps its bytes (counted) until released. */
static void test_ttl(void **state) {
  (void)state;
  cgs_store *st = new_store(64 * KB, 100, 64 * KB);
  int retry;
  assert_int_equal(put(st, "", "p", 1, 4 * KB, 0, &retry), 0);
  assert_int_equal(put(st, "", "p", 2, 4 * KB, 0, &retry), 0);
  assert_true(has(st, "", 1, 4 * KB, 60)); /* used at 60: lives to 160 */
  cgs_staged *held = get(st, "", 2, 90);   /* used at 90: lives to 190 */
  assert_non_null(held);
  assert_int_equal(cgs_store_expire(st, 150), 0);
  assert_null(get(st, "", 1, 170)); /* expired, even before the sweep */
  assert_int_equal(cgs_store_expire(st, 200), 2);
  cgs_store_stats s;
  cgs_store_stats_get(st, &s);
  assert_int_equal(s.entries, 0);
  assert_int_equal(s.expired, 2);
  assert_int_equal(s.bytes, 4 * KB); /* the held entry's */
  assert_int_equal(cgs_staged_data(held)[4 * KB - 1], 2);
  cgs_staged_release(held);
  cgs_store_stats_get(st, &s);
  assert_int_equal(s.bytes, 0);
  cgs_store_free(st);
}

/* More entries than one sweep's batch frees. */
static void test_expire_many(void **state) {
  (void)state;
  cgs_store *st = new_store(1024 * KB, 10, 1024 * KB);
  int retry;
  for (int n = 0; n < 200; n++)
    assert_int_equal(put(st, "", "p", n, 64, 0, &retry), 0);
  assert_int_equal(cgs_store_expire(st, 10), 200);
  cgs_store_free(st);
}

/* A call's entry outlives the store (the server's end, under ASan). */
static void test_outlives_store(void **state) {
  (void)state;
  cgs_store *st = new_store(64 * KB, 1000, 64 * KB);
  int retry;
  assert_int_equal(put(st, "", "p", 7, 4 * KB, 0, &retry), 0);
  cgs_staged *e = get(st, "", 7, 1);
  cgs_store_free(st);
  assert_int_equal(cgs_staged_data(e)[100], 7);
  cgs_staged_release(e);
}

/* Calls releasing on other threads while uploads evict (under TSan). */
typedef struct racer {
  cgs_store *st;
  int base;
} racer;

static void *race(void *arg) {
  racer *r = arg;
  for (int i = 0; i < 2000; i++) {
    int retry;
    int n = r->base + i % 64;
    put(r->st, "", r->base ? "b" : "a", n, 1 * KB, (uint64_t)i, &retry);
    cgs_staged *e = get(r->st, "", n, (uint64_t)i);
    if (e) {
      assert_int_equal(cgs_staged_data(e)[0], (unsigned char)n);
      cgs_staged_release(e);
    }
  }
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  cgs_store *st = new_store(16 * KB, 1000, 16 * KB);
  racer a = {st, 0}, b = {st, 100};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, race, &a), 0);
  race(&b);
  pthread_join(t, NULL);
  cgs_store_stats s;
  cgs_store_stats_get(st, &s);
  assert_true(s.bytes <= 16 * KB);
  assert_true(s.evictions > 0);
  cgs_store_free(st);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_scopes),
      cmocka_unit_test(test_private),
      cmocka_unit_test(test_budget_lru),
      cmocka_unit_test(test_peer_share),
      cmocka_unit_test(test_held_not_evicted),
      cmocka_unit_test(test_ttl),
      cmocka_unit_test(test_expire_many),
      cmocka_unit_test(test_outlives_store),
      cmocka_unit_test(test_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
