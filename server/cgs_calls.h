/* cgs_calls.h - the live Compute calls (calls.c): their list, count and
 * ids, and the loop's wake-up when the last one of a draining server
 * ends. The server owns one; the Compute handler (call.c) links each call
 * in at its start and out once it is over, so neither calls the other.
 *
 * Threads: cgs_calls_init, cgs_calls_drain and cgs_calls_close on the
 * loop thread, the rest on any (one mutex); on_idle runs on the loop. */
#ifndef CGS_CALLS_H
#define CGS_CALLS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <uv.h>

/* Embedded in each call. */
typedef struct cgs_calls_link {
  struct cgs_calls_link *prev, *next;
} cgs_calls_link;

typedef struct cgs_calls cgs_calls;
struct cgs_calls {
  pthread_mutex_t mu;
  cgs_calls_link *head; /* under mu */
  unsigned live;        /* under mu */
  uint64_t ids;         /* under mu: the last id handed out */
  uint64_t ended;       /* under mu: calls linked out so far */
  atomic_int draining;
  uv_async_t idle_async;
  void (*on_idle)(cgs_calls *cs);
};

/* Returns 0, or -1 when libuv would not make the async handle. */
int cgs_calls_init(cgs_calls *cs, uv_loop_t *loop,
                   void (*on_idle)(cgs_calls *cs));
/* Closes the async handle (close_cb gets it) and the mutex; no call may be
 * live. */
void cgs_calls_close(cgs_calls *cs, uv_close_cb close_cb);
/* Links l in; returns the call's id (1, 2, ...). */
uint64_t cgs_calls_add(cgs_calls *cs, cgs_calls_link *l);
/* Links l out; the last call out of a draining server wakes on_idle. */
void cgs_calls_remove(cgs_calls *cs, cgs_calls_link *l);
/* Calls linked in now, and linked out so far. */
unsigned cgs_calls_live(cgs_calls *cs);
uint64_t cgs_calls_ended(cgs_calls *cs);
/* From now on new calls are refused; returns 1 when none is live. */
int cgs_calls_drain(cgs_calls *cs);
int cgs_calls_draining(cgs_calls *cs);
/* Runs fn(l, arg) for every live call, under the lock: fn must not take a
 * call's own lock (it takes a reference, and the lock after this returns). */
void cgs_calls_each(cgs_calls *cs, void (*fn)(cgs_calls_link *l, void *arg),
                    void *arg);

#endif
