/* buf.c - owns the cache of freed tensor buffers (see cgs_buf.h). */
#include "cgs_buf.h"

#include <pthread.h>
#include <stdlib.h>

/* Entries kept; a few shapes repeating is the case worth serving. */
#define SLOTS 16

typedef struct slot {
  void *p;
  size_t cap; /* bytes the buffer was allocated with */
} slot;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static slot cache[SLOTS];
static size_t cached_bytes, budget;

void cgs_buf_init(size_t cache_bytes) { budget = cache_bytes; }

/* Big buffers are allocated in 64 KiB steps so that sizes differing by a
 * little share buffers. */
static size_t capacity_of(size_t n) {
  if (n < CGS_BUF_CACHE_MIN)
    return n ? n : 1;
  size_t step = 64u << 10;
  return n + (step - n % step) % step;
}

void *cgs_buf_alloc(size_t n) {
  size_t cap = capacity_of(n);
  if (cap >= CGS_BUF_CACHE_MIN) {
    pthread_mutex_lock(&mu);
    /* A cached buffer that fits without wasting more than a quarter. */
    for (int i = 0; i < SLOTS; i++) {
      if (cache[i].p && cache[i].cap >= cap &&
          cache[i].cap - cap <= cap / 4) {
        void *p = cache[i].p;
        cached_bytes -= cache[i].cap;
        cache[i].p = NULL;
        pthread_mutex_unlock(&mu);
        return p;
      }
    }
    pthread_mutex_unlock(&mu);
  }
  void *p = NULL;
  /* The capacity travels with the pointer implicitly: callers free with
   * the same n, hence the same capacity. */
  if (posix_memalign(&p, 64, cap) != 0)
    return NULL;
  return p;
}

void cgs_buf_free(void *p, size_t n) {
  if (!p)
    return;
  size_t cap = capacity_of(n);
  if (cap >= CGS_BUF_CACHE_MIN && cap <= budget) {
    pthread_mutex_lock(&mu);
    /* Make room: drop the biggest entries first until it fits. */
    while (cached_bytes + cap > budget) {
      int big = -1;
      for (int i = 0; i < SLOTS; i++)
        if (cache[i].p && (big < 0 || cache[i].cap > cache[big].cap))
          big = i;
      if (big < 0)
        break;
      free(cache[big].p);
      cached_bytes -= cache[big].cap;
      cache[big].p = NULL;
    }
    for (int i = 0; i < SLOTS && p; i++) {
      if (!cache[i].p && cached_bytes + cap <= budget) {
        cache[i] = (slot){p, cap};
        cached_bytes += cap;
        p = NULL;
      }
    }
    pthread_mutex_unlock(&mu);
  }
  free(p); /* not cached: NULL when it was */
}

void cgs_buf_drain(void) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < SLOTS; i++) {
    free(cache[i].p);
    cache[i].p = NULL;
  }
  cached_bytes = 0;
  pthread_mutex_unlock(&mu);
}
