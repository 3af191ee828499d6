/* fairq.c - owns the order of the fair queue (cgs_fairq.h). */
#include "cgs_fairq.h"

/* Its flow's next turn: a flow that waited for none of its turns joins at
 * the current one. */
static uint64_t next_turn(const cgs_fairq *q, const uint64_t *flow_turn) {
  return *flow_turn > q->turn ? *flow_turn : q->turn;
}

/* The first waiting item of its own flow that it, urgent, goes before; NULL
 * when there is none or that one was passed often enough. */
static cgs_fairq_item *item_to_pass(const cgs_fairq *q,
                                    const cgs_fairq_item *it) {
  if (!it->urgent)
    return NULL;
  for (cgs_fairq_item *w = q->head; w; w = w->next)
    if (w->flow == it->flow && w->deferrable)
      return w->passed < CGS_FAIRQ_PASS_MAX ? w : NULL;
  return NULL;
}

void cgs_fairq_push(cgs_fairq *q, cgs_fairq_item *it, uint64_t *flow_turn) {
  it->flow = flow_turn;
  it->turn = next_turn(q, flow_turn);
  *flow_turn = it->turn + 1;
  it->passed = 0;
  /* After every item of an earlier or the same turn: a busy flow's at the
   * tail, a flow with little queued a few places from the head; an urgent
   * item right before the deferrable one it passes, in its turn (the
   * flow's turns count one item more, as they would at the tail). */
  cgs_fairq_item *pass = item_to_pass(q, it);
  cgs_fairq_item *after = pass ? pass->prev : q->tail;
  if (pass) {
    it->turn = pass->turn;
    pass->passed++;
  }
  while (!pass && after && after->turn > it->turn)
    after = after->prev;
  it->prev = after;
  it->next = after ? after->next : q->head;
  if (it->next)
    it->next->prev = it;
  else
    q->tail = it;
  if (after)
    after->next = it;
  else
    q->head = it;
  it->queued = 1;
  q->n++;
}

void cgs_fairq_remove(cgs_fairq *q, cgs_fairq_item *it) {
  if (it->prev)
    it->prev->next = it->next;
  else
    q->head = it->next;
  if (it->next)
    it->next->prev = it->prev;
  else
    q->tail = it->prev;
  it->prev = it->next = NULL;
  it->queued = 0;
  q->n--;
}

cgs_fairq_item *cgs_fairq_pop(cgs_fairq *q) {
  cgs_fairq_item *it = q->head;
  if (!it)
    return NULL;
  cgs_fairq_remove(q, it);
  q->turn = it->turn;
  return it;
}

int cgs_fairq_would_lead(const cgs_fairq *q, const uint64_t *flow_turn) {
  return !q->head || q->head->turn > next_turn(q, flow_turn);
}

void cgs_fairq_take_turn(cgs_fairq *q, uint64_t *flow_turn) {
  q->turn = next_turn(q, flow_turn);
  *flow_turn = q->turn + 1;
}
