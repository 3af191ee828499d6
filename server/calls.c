/* calls.c - owns the list of live Compute calls and the drain's wake-up. */
#include "cgs_calls.h"

#include <string.h>

static void on_idle_async(uv_async_t *h) {
  cgs_calls *cs = h->data;
  cs->on_idle(cs);
}

int cgs_calls_init(cgs_calls *cs, uv_loop_t *loop,
                   void (*on_idle)(cgs_calls *cs)) {
  memset(cs, 0, sizeof *cs);
  cs->on_idle = on_idle;
  if (uv_async_init(loop, &cs->idle_async, on_idle_async) != 0)
    return -1;
  cs->idle_async.data = cs;
  pthread_mutex_init(&cs->mu, NULL);
  return 0;
}

void cgs_calls_close(cgs_calls *cs, uv_close_cb close_cb) {
  pthread_mutex_destroy(&cs->mu);
  uv_close((uv_handle_t *)&cs->idle_async, close_cb);
}

uint64_t cgs_calls_add(cgs_calls *cs, cgs_calls_link *l) {
  pthread_mutex_lock(&cs->mu);
  l->prev = NULL;
  l->next = cs->head;
  if (cs->head)
    cs->head->prev = l;
  cs->head = l;
  cs->live++;
  uint64_t id = ++cs->ids;
  pthread_mutex_unlock(&cs->mu);
  return id;
}

void cgs_calls_remove(cgs_calls *cs, cgs_calls_link *l) {
  pthread_mutex_lock(&cs->mu);
  if (l->prev)
    l->prev->next = l->next;
  else
    cs->head = l->next;
  if (l->next)
    l->next->prev = l->prev;
  int idle = --cs->live == 0;
  cs->ended++;
  pthread_mutex_unlock(&cs->mu);
  if (idle && atomic_load(&cs->draining))
    uv_async_send(&cs->idle_async);
}

unsigned cgs_calls_live(cgs_calls *cs) {
  pthread_mutex_lock(&cs->mu);
  unsigned n = cs->live;
  pthread_mutex_unlock(&cs->mu);
  return n;
}

uint64_t cgs_calls_ended(cgs_calls *cs) {
  pthread_mutex_lock(&cs->mu);
  uint64_t n = cs->ended;
  pthread_mutex_unlock(&cs->mu);
  return n;
}

int cgs_calls_drain(cgs_calls *cs) {
  atomic_store(&cs->draining, 1);
  return cgs_calls_live(cs) == 0;
}

int cgs_calls_draining(cgs_calls *cs) {
  return atomic_load(&cs->draining);
}

void cgs_calls_each(cgs_calls *cs, void (*fn)(cgs_calls_link *l, void *arg),
                    void *arg) {
  pthread_mutex_lock(&cs->mu);
  for (cgs_calls_link *l = cs->head; l; l = l->next)
    fn(l, arg);
  pthread_mutex_unlock(&cs->mu);
}
