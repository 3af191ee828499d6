/* bulk.c - owns the order of the completion-queue thread's bulk work:
 * flows take turns, one item each. */
#include "cgs_bulk.h"

void cgs_bulk_push(cgs_bulk *q, cgs_bulk_item *it, uint64_t *flow_turn) {
  it->turn = *flow_turn > q->turn ? *flow_turn : q->turn;
  *flow_turn = it->turn + 1;
  /* After every item of an earlier or the same turn: a busy flow's at the
   * tail, a flow with little queued a few places from the head. */
  cgs_bulk_item *after = q->tail;
  while (after && after->turn > it->turn)
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
  q->n++;
}

cgs_bulk_item *cgs_bulk_pop(cgs_bulk *q) {
  cgs_bulk_item *it = q->head;
  if (!it)
    return NULL;
  q->head = it->next;
  if (q->head)
    q->head->prev = NULL;
  else
    q->tail = NULL;
  it->prev = it->next = NULL;
  q->turn = it->turn;
  q->n--;
  return it;
}
