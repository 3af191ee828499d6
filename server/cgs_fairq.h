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
 * Cost: a push and a removal take O(log n) steps (expected) in the items
 * waiting, a pop O(1), whatever one flow has queued: the owner's lock is
 * held meanwhile, and a client with thousands of jobs queued must not
 * slow every other client's push.
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

/* A node of one of the queue's two search trees (treaps: a binary search
 * tree that is also a max-heap by prio, which keeps its expected depth
 * logarithmic). They find in O(log n) what a walk of the queue found in
 * O(n): where an item goes, and a flow's first deferrable item. */
typedef struct cgs_fairq_node cgs_fairq_node;
struct cgs_fairq_node {
  cgs_fairq_node *parent, *child[2]; /* child[0] goes before */
  uint32_t prio;
};

typedef struct cgs_fairq_item cgs_fairq_item;
struct cgs_fairq_item {
  /* Set by the owner, who embeds it, before cgs_fairq_push. */
  unsigned char urgent, deferrable;
  /* Queue-private. */
  unsigned char queued;
  unsigned passed;      /* times an urgent item went before it */
  uint64_t turn;        /* its place in the fair order */
  uint64_t arrival;     /* its place in its turn: its own arrival, or for
                           an urgent item that of the item it passed */
  unsigned slot;        /* among the items placed at one arrival: the
                           number of the pass for the urgent ones, and
                           CGS_FAIRQ_PASS_MAX, last, for the passed one */
  const uint64_t *flow; /* its flow's turn state: which flow it is */
  cgs_fairq_item *prev, *next;
  cgs_fairq_node by_order; /* in cgs_fairq.order: every item */
  cgs_fairq_node by_flow;  /* in cgs_fairq.deferrable: deferrable items */
};

typedef struct cgs_fairq {
  cgs_fairq_item *head, *tail; /* by turn, then arrival, then slot */
  uint64_t turn;               /* of the item taken last */
  size_t n;                    /* items waiting */
  uint64_t arrivals;           /* items ever pushed */
  cgs_fairq_node *order;       /* the items in the list's order */
  cgs_fairq_node *deferrable;  /* deferrable items by flow, then order */
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
