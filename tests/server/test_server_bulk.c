/* test_server_bulk.c - the order of the completion-queue thread's bulk
 * work (cgs_bulk.h): flows take turns, one item each, whatever they have
 * queued; a flow's own items keep their order; a flow that had nothing
 * queued joins at the current turn, saving no turns up, and so does a
 * new one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "cgs_bulk.h"

/* An item with its flow's name and its number within that flow. */
typedef struct item {
  cgs_bulk_item it;
  char flow;
  int n;
} item;

static void no_run(cgs_bulk_item *it) {
  (void)it;
}

/* Pops every item and writes them as "A1 B1 A2 ..." into out. */
static void drain(cgs_bulk *q, char *out, size_t cap) {
  size_t len = 0;
  out[0] = '\0';
  cgs_bulk_item *it;
  while ((it = cgs_bulk_pop(q)) != NULL) {
    item *x = (item *)(void *)it;
    len += (size_t)snprintf(out + len, cap - len, "%s%c%d", len ? " " : "",
                            x->flow, x->n);
  }
  assert_int_equal(q->n, 0);
  assert_null(q->head);
  assert_null(q->tail);
}

static void push(cgs_bulk *q, item *x, char flow, int n, uint64_t *turn) {
  x->it.run = no_run;
  x->flow = flow;
  x->n = n;
  cgs_bulk_push(q, &x->it, turn);
}

/* A client with many chunks queued moves one per turn, as one with one. */
static void test_flows_take_turns(void **state) {
  (void)state;
  cgs_bulk q = {0};
  uint64_t a = 0, b = 0, c = 0;
  item x[8];
  char got[128];
  for (int i = 0; i < 4; i++)
    push(&q, &x[i], 'A', i + 1, &a);
  push(&q, &x[4], 'B', 1, &b);
  push(&q, &x[5], 'C', 1, &c);
  push(&q, &x[6], 'B', 2, &b);
  assert_int_equal(q.n, 7);
  drain(&q, got, sizeof got);
  assert_string_equal(got, "A1 B1 C1 A2 B2 A3 A4");
}

/* A flow that comes back after the others' items ran joins at the
 * current turn: its next item goes first, the ones after it alternate
 * with the busy flow's, as if it had never left; turns it missed are not
 * saved up to pass the busy flow several times in a row. */
static void test_idle_flow_saves_no_turns(void **state) {
  (void)state;
  cgs_bulk q = {0};
  uint64_t a = 0, b = 0;
  item x[9];
  char got[128];
  push(&q, &x[0], 'B', 1, &b);
  for (int i = 0; i < 5; i++)
    push(&q, &x[1 + i], 'A', i + 1, &a);
  for (int i = 0; i < 4; i++) /* B1, then A1-A3 run */
    assert_non_null(cgs_bulk_pop(&q));
  for (int i = 0; i < 3; i++)
    push(&q, &x[6 + i], 'B', i + 2, &b);
  drain(&q, got, sizeof got);
  assert_string_equal(got, "B2 A4 B3 A5 B4");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_flows_take_turns),
      cmocka_unit_test(test_idle_flow_saves_no_turns),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
