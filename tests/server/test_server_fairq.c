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

/* Urgent items that pass the same deferrable one keep their arrival
 * order before it; ties of a turn between other items go by arrival. */
static void test_urgent_items_keep_their_order(void **state) {
  (void)state;
  cgs_fairq q = {0};
  uint64_t a = 0, b = 0;
  item x[6];
  char got[64];
  push_as(&q, &x[0], 'A', 1, &a, 'd');
  push_as(&q, &x[1], 'B', 1, &b, 0);
  push_as(&q, &x[2], 'A', 2, &a, 'u');
  push_as(&q, &x[3], 'A', 3, &a, 'd');
  push_as(&q, &x[4], 'A', 4, &a, 'u');
  push_as(&q, &x[5], 'B', 2, &b, 'u');
  drain(&q, got, sizeof got);
  assert_string_equal(got, "A2 A4 A1 B1 B2 A3");
}

/* Once its flow's first deferrable item has been passed
 * CGS_FAIRQ_PASS_MAX times, an urgent item passes none, not the next
 * deferrable one either; a cancelled deferrable item is passed no more,
 * the next one is. */
static void test_urgent_passes_only_the_first_deferrable(void **state) {
  (void)state;
  cgs_fairq q = {0};
  uint64_t a = 0;
  item w1, w2, d[CGS_FAIRQ_PASS_MAX], u1, u2;
  char got[64];
  push_as(&q, &w1, 'W', 1, &a, 'd');
  push_as(&q, &w2, 'W', 2, &a, 'd');
  for (int i = 0; i < CGS_FAIRQ_PASS_MAX; i++) {
    push_as(&q, &d[i], 'D', i + 1, &a, 'u');
    assert_ptr_equal(cgs_fairq_pop(&q), &d[i].it);
  }
  push_as(&q, &u1, 'U', 1, &a, 'u');
  assert_ptr_equal(q.tail, &u1.it);
  assert_int_equal(w2.it.passed, 0);
  cgs_fairq_remove(&q, &w1.it);
  push_as(&q, &u2, 'U', 2, &a, 'u');
  drain(&q, got, sizeof got);
  assert_string_equal(got, "U2 W2 U1");
}

/* ---- the queue against the walk it used to do ------------------------ */

enum { MODEL_ITEMS = 512, MODEL_FLOWS = 6 };

/* The queue's promised order kept the slow way: items in queue order in
 * an array, each push placed by a walk over it, as cgs_fairq_push did
 * before it had search trees. */
typedef struct model {
  item *at[MODEL_ITEMS];
  uint64_t turn[MODEL_ITEMS];
  unsigned passed[MODEL_ITEMS];
  size_t n;
  uint64_t q_turn;
  uint64_t flow_turn[MODEL_FLOWS];
  unsigned saturated; /* urgent pushes that found the pass used up */
} model;

static void model_insert(model *m, size_t i, item *x, uint64_t turn) {
  memmove(&m->at[i + 1], &m->at[i], (m->n - i) * sizeof m->at[0]);
  memmove(&m->turn[i + 1], &m->turn[i], (m->n - i) * sizeof m->turn[0]);
  memmove(&m->passed[i + 1], &m->passed[i], (m->n - i) * sizeof m->passed[0]);
  m->at[i] = x;
  m->turn[i] = turn;
  m->passed[i] = 0;
  m->n++;
}

static void model_delete(model *m, size_t i) {
  m->n--;
  memmove(&m->at[i], &m->at[i + 1], (m->n - i) * sizeof m->at[0]);
  memmove(&m->turn[i], &m->turn[i + 1], (m->n - i) * sizeof m->turn[0]);
  memmove(&m->passed[i], &m->passed[i + 1], (m->n - i) * sizeof m->passed[0]);
}

static uint64_t model_next_turn(const model *m, int f) {
  return m->flow_turn[f] > m->q_turn ? m->flow_turn[f] : m->q_turn;
}

static void model_push(model *m, item *x, int f) {
  uint64_t turn = model_next_turn(m, f);
  m->flow_turn[f] = turn + 1;
  for (size_t i = 0; x->it.urgent && i < m->n; i++) {
    if (m->at[i]->flow != x->flow || !m->at[i]->it.deferrable)
      continue;
    if (m->passed[i] == CGS_FAIRQ_PASS_MAX) {
      m->saturated++;
      break;
    }
    m->passed[i]++;
    model_insert(m, i, x, m->turn[i]);
    return;
  }
  size_t i = m->n;
  while (i > 0 && m->turn[i - 1] > turn)
    i--;
  model_insert(m, i, x, turn);
}

/* The queue holds what the model does, in its order, with its turns. */
static void assert_same(const cgs_fairq *q, const model *m,
                        const uint64_t *flow_turn) {
  assert_int_equal(q->n, m->n);
  assert_int_equal(q->turn, m->q_turn);
  for (int f = 0; f < MODEL_FLOWS; f++)
    assert_int_equal(flow_turn[f], m->flow_turn[f]);
  const cgs_fairq_item *prev = NULL, *it = q->head;
  for (size_t i = 0; i < m->n; i++, prev = it, it = it->next) {
    assert_ptr_equal(it, &m->at[i]->it);
    assert_ptr_equal(it->prev, prev);
    assert_int_equal(it->turn, m->turn[i]);
    assert_int_equal(it->passed, m->passed[i]);
    assert_int_equal(it->queued, 1);
  }
  assert_null(it);
  assert_ptr_equal(q->tail, prev);
}

/* Seeded random pushes (every kind, a busy flow and quiet ones), pops,
 * cancellations and inline turns, in phases that fill the queue to a few
 * hundred items, drain it, and pass deferrable items until they may be
 * passed no more: the queue keeps the model's order after every step. */
static void test_order_matches_the_walk(void **state) {
  (void)state;
  static item x[MODEL_ITEMS];
  static model m;
  memset(&m, 0, sizeof m);
  cgs_fairq q = {0};
  uint64_t flow_turn[MODEL_FLOWS] = {0};
  item *idle[MODEL_ITEMS];
  size_t nidle = MODEL_ITEMS;
  for (size_t i = 0; i < MODEL_ITEMS; i++)
    idle[i] = &x[i];
  uint64_t rng = 42;
  unsigned pops = 0, removals = 0, inline_turns = 0;
  for (int step = 0; step < 40000; step++) {
    rng = rng * 6364136223846793005u + 1442695040888963407u;
    unsigned r = (unsigned)(rng >> 33);
    /* Phases: filling, draining, a stream of urgent items. */
    int phase = (step / 2000) % 3;
    unsigned op = r % 100;
    int f = (r >> 8) % 3 == 0 ? (int)((r >> 10) % MODEL_FLOWS) : 0;
    unsigned kind = (r >> 16) % 8;
    char as = kind < 2 ? 'u' : kind < 4 ? 'd' : 0;
    if (phase == 2)
      as = kind < 7 ? 'u' : 'd';
    if (nidle > 0 && (op < (phase == 1 ? 30u : 60u) || m.n == 0)) {
      item *it = idle[--nidle];
      push_as(&q, it, (char)('A' + f), step, &flow_turn[f], as);
      model_push(&m, it, f);
    } else if (op < 85) {
      cgs_fairq_item *it = cgs_fairq_pop(&q);
      assert_ptr_equal(it, &m.at[0]->it);
      m.q_turn = m.turn[0];
      model_delete(&m, 0);
      idle[nidle++] = cgs_container_of(it, item, it);
      pops++;
    } else if (op < 95) {
      size_t i = (r >> 12) % m.n;
      item *it = m.at[i];
      cgs_fairq_remove(&q, &it->it);
      assert_int_equal(it->it.queued, 0);
      model_delete(&m, i);
      idle[nidle++] = it;
      removals++;
    } else {
      int lead = m.n == 0 || m.turn[0] > model_next_turn(&m, f);
      assert_int_equal(cgs_fairq_would_lead(&q, &flow_turn[f]), lead);
      if (lead) {
        cgs_fairq_take_turn(&q, &flow_turn[f]);
        m.q_turn = model_next_turn(&m, f);
        m.flow_turn[f] = m.q_turn + 1;
        inline_turns++;
      }
    }
    assert_same(&q, &m, flow_turn);
  }
  /* Every path ran, the used-up pass too. */
  assert_true(pops > 1000 && removals > 1000 && inline_turns > 10);
  assert_true(m.saturated > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_flows_take_turns),
      cmocka_unit_test(test_idle_flow_saves_no_turns),
      cmocka_unit_test(test_remove_keeps_the_order),
      cmocka_unit_test(test_urgent_passes_its_own_flow),
      cmocka_unit_test(test_deferrable_is_passed_a_bounded_number_of_times),
      cmocka_unit_test(test_urgent_items_keep_their_order),
      cmocka_unit_test(test_urgent_passes_only_the_first_deferrable),
      cmocka_unit_test(test_order_matches_the_walk),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
