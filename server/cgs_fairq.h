/* cgs_fairq.h - the fair queue under the workers' jobs (pool.c) and the
 * completion-queue thread's bulk work (cq.c): callers' flows take turns,
 * one item each (start-time fair queueing with one unit an item: round
 * robin between flows, first come first served within one); a flow idle
 * for a while joins at the current turn and saves no turns up. An urgent
 * item (a data-gradient job) goes before its own flow's first waiting
 * deferrable one (a weight-gradient job), in that item's turn, but a
 * deferrable item is passed CGS_FAIRQ_PASS_MAX times at most, so that a
 * steady stream of its flow's urgent items cannot hold it back for ever.
 *
 * Threads: none of its own; the owner serialises every call. */
#ifndef CGS_FAIRQ_H
#define CGS_FAIRQ_H

#include <stddef.h>
#include <stdint.h>

/* How often a deferrable item is passed at most: a trainer's backward
 * pass through ResNet-50's 53 convolutions asks for 52 data gradients
 * after the first weight gradient, which all go first. */
#define CGS_FAIRQ_PASS_MAX 64

/* The object that embeds member at ptr: an item's owner. */
#define cgs_container_of(ptr, type, member)                                    \
  ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

typedef struct cgs_fairq_item cgs_fairq_item;
struct cgs_fairq_item {
  /* Set by the owner, who embeds it, before cgs_fairq_push. */
  unsigned char urgent, deferrable;
  /* Queue-private. */
  unsigned char queued;
  unsigned passed;      /* times an urgent item went before it */
  uint64_t turn;        /* its place in the fair order */
  const uint64_t *flow; /* its flow's turn state: which flow it is */
  cgs_fairq_item *prev, *next;
};

typedef struct cgs_fairq {
  cgs_fairq_item *head, *tail; /* by turn, then arrival */
  uint64_t turn;               /* of the item taken last */
  size_t n;                    /* items waiting */
} cgs_fairq;

/* Queues it (not queued) in its flow's next turn: *flow_turn is the
 * flow's state, 0 for a new one, kept by the caller and touched only
 * here. */
void cgs_fairq_push(cgs_fairq *q, cgs_fairq_item *it, uint64_t *flow_turn);
/* Takes the first item off the queue; NULL when it is empty. */
cgs_fairq_item *cgs_fairq_pop(cgs_fairq *q);
/* Takes it, which is queued, off the queue (a cancelled job). */
void cgs_fairq_remove(cgs_fairq *q, cgs_fairq_item *it);
/* 1 when an item of the flow *flow_turn pushed now would go first, ahead
 * of every waiting one (ties go to the waiting ones). */
int cgs_fairq_would_lead(const cgs_fairq *q, const uint64_t *flow_turn);
/* The flow's turn for an item that runs at once instead of waiting (after
 * cgs_fairq_would_lead said 1), counted as if pushed and popped. */
void cgs_fairq_take_turn(cgs_fairq *q, uint64_t *flow_turn);

#endif
