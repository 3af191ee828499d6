/* cgs_bulk.h - the completion-queue thread's bulk work: result chunks to
 * send and request chunks to copy, the events that move a call's tensor
 * bytes (tens of microseconds to milliseconds each). They wait in this
 * queue while other events are ready (cgs_cq_defer), so that a small
 * call's request, answer and end are not handled after another caller's
 * megabytes; and flows take turns, one item each, so a client with 64
 * calls in flight moves one chunk per turn as a client with one does
 * (start-time fair queueing, as the workers' queue in pool.c: a flow's
 * items go in order, a flow idle for a while joins at the current turn
 * and saves no turns up).
 *
 * Threads: the completion-queue thread only; no lock. */
#ifndef CGS_BULK_H
#define CGS_BULK_H

#include <stddef.h>
#include <stdint.h>

typedef struct cgs_bulk_item cgs_bulk_item;
struct cgs_bulk_item {
  void (*run)(cgs_bulk_item *it); /* set by the owner, who embeds it */
  /* Queue-private. */
  uint64_t turn;
  cgs_bulk_item *prev, *next;
};

typedef struct cgs_bulk {
  cgs_bulk_item *head, *tail; /* by turn, then arrival */
  uint64_t turn;              /* of the item run last */
  size_t n;                   /* items waiting */
} cgs_bulk;

/* Queues it (not queued) in its flow's next turn: *flow_turn is the
 * flow's state, 0 for a new one, kept by the caller and touched only
 * here. */
void cgs_bulk_push(cgs_bulk *q, cgs_bulk_item *it, uint64_t *flow_turn);
/* Takes the first item off the queue; NULL when it is empty. The caller
 * runs it. */
cgs_bulk_item *cgs_bulk_pop(cgs_bulk *q);

#endif
