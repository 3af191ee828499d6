/* fairq.c - owns the order of the fair queue (cgs_fairq.h). */
#include "cgs_fairq.h"

/* Its flow's next turn: a flow that waited for none of its turns joins at
 * the current one. */
static uint64_t next_turn(const cgs_fairq *q, const uint64_t *flow_turn) {
  return *flow_turn > q->turn ? *flow_turn : q->turn;
}

/* ---- treaps ----------------------------------------------------------- */

/* 1 when a goes before b in the tree (their items are in it). */
typedef int (*node_before)(const cgs_fairq_node *a, const cgs_fairq_node *b);

/* The pointer that points at n: its parent's link, or the root. */
static cgs_fairq_node **link_to(cgs_fairq_node **root, cgs_fairq_node *n) {
  cgs_fairq_node *p = n->parent;
  return p ? &p->child[p->child[1] == n] : root;
}

/* Puts n in its parent's place, which becomes n's child; the order the
 * tree holds stays the same. */
static void rotate_up(cgs_fairq_node **root, cgs_fairq_node *n) {
  cgs_fairq_node *p = n->parent;
  int side = p->child[1] == n;
  *link_to(root, p) = n;
  n->parent = p->parent;
  p->child[side] = n->child[!side];
  if (p->child[side])
    p->child[side]->parent = p;
  n->child[!side] = p;
  p->parent = n;
}

/* Inserts n (prio set) and returns the node just before it, or NULL. */
static cgs_fairq_node *tree_insert(cgs_fairq_node **root, cgs_fairq_node *n,
                                   node_before before) {
  cgs_fairq_node *parent = NULL, *prev = NULL, **link = root;
  while (*link) {
    parent = *link;
    int after = before(parent, n);
    if (after)
      prev = parent;
    link = &parent->child[after];
  }
  n->parent = parent;
  n->child[0] = n->child[1] = NULL;
  *link = n;
  while (n->parent && n->prio > n->parent->prio)
    rotate_up(root, n);
  return prev;
}

/* Takes n out: it sinks until it has one child at most, which takes its
 * place. The first node has no child before it and goes at once. */
static void tree_remove(cgs_fairq_node **root, cgs_fairq_node *n) {
  while (n->child[0] && n->child[1])
    rotate_up(root, n->child[n->child[1]->prio > n->child[0]->prio]);
  cgs_fairq_node *child = n->child[n->child[0] == NULL];
  if (child)
    child->parent = n->parent;
  *link_to(root, n) = child;
}

/* A treap's depth stays logarithmic when the priorities are random; these
 * are a hash of the item's arrival number (splitmix64's finaliser), on
 * which no client has a say. */
static uint32_t prio_of(uint64_t arrival) {
  uint64_t z = arrival + 0x9e3779b97f4a7c15u;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return (uint32_t)((z ^ (z >> 31)) >> 32);
}

/* ---- the queue's order ------------------------------------------------ */

static int item_before(const cgs_fairq_item *a, const cgs_fairq_item *b) {
  if (a->turn != b->turn)
    return a->turn < b->turn;
  if (a->arrival != b->arrival)
    return a->arrival < b->arrival;
  return a->slot < b->slot;
}

static int order_before(const cgs_fairq_node *a, const cgs_fairq_node *b) {
  return item_before(cgs_container_of(a, cgs_fairq_item, by_order),
                     cgs_container_of(b, cgs_fairq_item, by_order));
}

static uintptr_t flow_key(const cgs_fairq_item *it) {
  return (uintptr_t)it->flow;
}

static int flow_before(const cgs_fairq_node *a, const cgs_fairq_node *b) {
  const cgs_fairq_item *x = cgs_container_of(a, cgs_fairq_item, by_flow);
  const cgs_fairq_item *y = cgs_container_of(b, cgs_fairq_item, by_flow);
  if (x->flow != y->flow)
    return flow_key(x) < flow_key(y);
  return item_before(x, y);
}

/* The first waiting item of its own flow that it, urgent, goes before; NULL
 * when there is none or that one was passed often enough. */
static cgs_fairq_item *item_to_pass(const cgs_fairq *q,
                                    const cgs_fairq_item *it) {
  if (!it->urgent)
    return NULL;
  cgs_fairq_item *first = NULL;
  for (cgs_fairq_node *n = q->deferrable; n;) {
    cgs_fairq_item *w = cgs_container_of(n, cgs_fairq_item, by_flow);
    int flow_after = flow_key(w) < flow_key(it);
    if (w->flow == it->flow)
      first = w;
    n = n->child[flow_after];
  }
  return first && first->passed < CGS_FAIRQ_PASS_MAX ? first : NULL;
}

void cgs_fairq_push(cgs_fairq *q, cgs_fairq_item *it, uint64_t *flow_turn) {
  it->flow = flow_turn;
  it->turn = next_turn(q, flow_turn);
  *flow_turn = it->turn + 1;
  it->passed = 0;
  it->arrival = q->arrivals++;
  it->slot = CGS_FAIRQ_PASS_MAX;
  it->by_order.prio = it->by_flow.prio = prio_of(it->arrival);
  /* After every item of an earlier or the same turn: a busy flow's at the
   * tail, a flow with little queued a few places from the head; an urgent
   * item right before the deferrable one it passes, in its turn (the
   * flow's turns count one item more, as they would at the tail), after
   * the urgent ones that passed it earlier. */
  cgs_fairq_item *pass = item_to_pass(q, it);
  if (pass) {
    it->turn = pass->turn;
    it->arrival = pass->arrival;
    it->slot = pass->passed++;
  }
  cgs_fairq_node *prev = tree_insert(&q->order, &it->by_order, order_before);
  cgs_fairq_item *after =
      prev ? cgs_container_of(prev, cgs_fairq_item, by_order) : NULL;
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
  if (it->deferrable)
    tree_insert(&q->deferrable, &it->by_flow, flow_before);
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
  tree_remove(&q->order, &it->by_order);
  if (it->deferrable)
    tree_remove(&q->deferrable, &it->by_flow);
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
