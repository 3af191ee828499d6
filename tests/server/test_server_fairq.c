/* test_server_fairq.c - the fair queue under the workers' jobs and the
 * completion-queue thread's bulk work (cgs_fairq.h): flows take turns,
 * one item each, whatever they have queued; a flow's own items keep their
 * order; a flow that had nothing queued joins at the current turn, saving
 * no turns up, and so does a new one. A flow's urgent item passes its
 * waiting deferrable ones, and a deferrable item is passed
 * CGS_FAIRQ_PASS_MAX times at most. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cgs_fairq.h"

/* An item with its flow's name and its number within that flow. */
typedef struct item {
  cgs_fairq_item it;
  char flow;
  int n;
} item;

/* Pops every item and writes them as "A1 B1 A2 ..." into out. */
static void drain(cgs_fairq *q, char *out, size_t cap) {
  size_t len = 0;
  out[0] = '\0';
  cgs_fairq_item *it;
  while ((it = cgs_fairq_pop(q)) != NULL) {
    item *x = cgs_container_of(it, item, it);
    assert_int_equal(it->queued, 0);
    len += (size_t)snprintf(out + len, cap - len, "%s%c%d", len ? " " : "",
                            x->flow, x->n);
  }
  assert_int_equal(q->n, 0);
  assert_null(q->head);
  assert_null(q->tail);
}

/* Pushes x, urgent ('u'), deferrable ('d') or neither (0). */
static void push_as(cgs_fairq *q, item *x, char flow, int n, uint64_t *turn,
                    char kind) {
  memset(&x->it, 0, sizeof x->it);
  x->it.urgent = kind == 'u';
  x->it.deferrable = kind == 'd';
  x->flow = flow;
  x->n = n;
  cgs_fairq_push(q, &x->it, turn);
}

static void push(cgs_fairq *q, item *x, char flow, int n, uint64_t *turn) {
  push_as(q, x, flow, n, turn, 0);
}

/* A client with many chunks queued moves one per turn, as one with one. */
static void test_flows_take_turns(void **state) {
  (void)state;
  cgs_fairq q = {0};
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
  cgs_fairq q = {0};
  uint64_t a = 0, b = 0;
  item x[9];
  char got[128];
  push(&q, &x[0], 'B', 1, &b);
  for (int i = 0; i < 5; i++)
    push(&q, &x[1 + i], 'A', i + 1, &a);
  for (int i = 0; i < 4; i++) /* B1, then A1-A3 run */
    assert_non_null(cgs_fairq_pop(&q));
  assert_int_equal(cgs_fairq_would_lead(&q, &b), 1);
  for (int i = 0; i < 3; i++)
    push(&q, &x[6 + i], 'B', i + 2, &b);
  assert_int_equal(cgs_fairq_would_lead(&q, &a), 0);
  drain(&q, got, sizeof got);
  assert_string_equal(got, "B2 A4 B3 A5 B4");
}

/* A cancelled item leaves its place; the others keep their order. */
static void test_remove_keeps_the_order(void **state) {
  (void)state;
  cgs_fairq q = {0};
  uint64_t a = 0, b = 0;
  item x[4];
  char got[64];
  push(&q, &x[0], 'A', 1, &a);
  push(&q, &x[1], 'A', 2, &a);
  push(&q, &x[2], 'B', 1, &b);
  push(&q, &x[3], 'B', 2, &b);
  cgs_fairq_remove(&q, &x[2].it);
  assert_int_equal(x[2].it.queued, 0);
  cgs_fairq_remove(&q, &x[0].it);
  drain(&q, got, sizeof got);
  assert_string_equal(got, "A2 B2");
}

/* A flow's urgent item (a data gradient) goes before its own waiting
 * deferrable ones (weight gradients) in the first one's turn, and so
 * before the other flow's later turns too; it passes no other flow's. */
static void test_urgent_passes_its_own_flow(void **state) {
  (void)state;
  cgs_fairq q = {0};
  uint64_t a = 0, b = 0;
  item x[6];
  char got[64];
  push_as(&q, &x[0], 'B', 1, &b, 'd');
  push_as(&q, &x[1], 'A', 1, &a, 'd');
  push_as(&q, &x[2], 'A', 2, &a, 'd');
  push_as(&q, &x[3], 'B', 2, &b, 0);
  push_as(&q, &x[4], 'A', 3, &a, 'u');
  push_as(&q, &x[5], 'B', 3, &b, 'u');
  drain(&q, got, sizeof got);
  assert_string_equal(got, "B3 B1 A3 A1 A2 B2");
}

/* A steady stream of a flow's urgent items passes its deferrable one
 * CGS_FAIRQ_PASS_MAX times, then queues behind it: the weight gradient
 * runs after that many data gradients, not after the stream ends. */
static void test_deferrable_is_passed_a_bounded_number_of_times(void **state) {
  (void)state;
  cgs_fairq q = {0};
  uint64_t a = 0;
  item w, d[CGS_FAIRQ_PASS_MAX + 2];
  push_as(&q, &w, 'W', 1, &a, 'd');
  int popped_before_w = 0, w_out = 0;
  for (int i = 0; i < CGS_FAIRQ_PASS_MAX + 2; i++) {
    /* One urgent item arrives, one item leaves: always one waiting. */
    push_as(&q, &d[i], 'D', i + 1, &a, 'u');
    cgs_fairq_item *it = cgs_fairq_pop(&q);
    if (it == &w.it) {
      w_out = 1;
      break;
    }
    popped_before_w++;
  }
  assert_true(w_out);
  assert_int_equal(popped_before_w, CGS_FAIRQ_PASS_MAX);
  assert_int_equal(w.it.passed, CGS_FAIRQ_PASS_MAX);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_flows_take_turns),
      cmocka_unit_test(test_idle_flow_saves_no_turns),
      cmocka_unit_test(test_remove_keeps_the_order),
      cmocka_unit_test(test_urgent_passes_its_own_flow),
      cmocka_unit_test(test_deferrable_is_passed_a_bounded_number_of_times),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
