/* buf.c - owns the cache of freed tensor buffers (see cgs_buf.h). */
#include "cgs_buf.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

/* Entries kept; a few shapes repeating is the case worth serving. */
#define SLOTS 16

typedef struct slot {
  void *p;
  size_t cap; /* bytes the buffer was allocated with (its header's) */
} slot;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static slot cache[SLOTS];
static size_t cached_bytes, budget;

void cgs_buf_init(size_t cache_bytes) {
  budget = cache_bytes;
}

/* Big buffers are allocated in 64 KiB steps so that sizes differing by a
 * little share buffers. */
static size_t capacity_of(size_t n) {
  if (n < CGS_BUF_CACHE_MIN)
    return n ? n : 1;
  size_t step = 64u << 10;
  return n + (step - n % step) % step;
}

/* Each block starts with its capacity, padded to keep the caller's memory
 * 64-byte aligned: a cached buffer handed out for a smaller request keeps
 * its real size when it comes back. */
#define HEADER 64

static size_t *header_of(void *p) {
  return (size_t *)((char *)p - HEADER);
}

void *cgs_buf_alloc(size_t n) {
  size_t cap = capacity_of(n);
  if (cap >= CGS_BUF_CACHE_MIN) {
    pthread_mutex_lock(&mu);
    /* A cached buffer that fits without wasting more than a quarter. */
    for (int i = 0; i < SLOTS; i++) {
      if (cache[i].p && cache[i].cap >= cap && cache[i].cap - cap <= cap / 4) {
        void *p = cache[i].p;
        cached_bytes -= cache[i].cap;
        cache[i].p = NULL;
        pthread_mutex_unlock(&mu);
        return p;
      }
    }
    pthread_mutex_unlock(&mu);
  }
  void *block = NULL;
  if (cap > SIZE_MAX - HEADER || posix_memalign(&block, 64, HEADER + cap) != 0)
    return NULL;
  void *p = (char *)block + HEADER;
  *header_of(p) = cap;
  return p;
}

size_t cgs_buf_capacity(const void *p) {
  return *header_of((void *)p);
}

void cgs_buf_free(void *p) {
  if (!p)
    return;
  size_t cap = *header_of(p);
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
      free(header_of(cache[big].p));
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
  if (p) /* not cached */
    free(header_of(p));
}

size_t cgs_buf_cached_bytes(void) {
  pthread_mutex_lock(&mu);
  size_t n = cached_bytes;
  pthread_mutex_unlock(&mu);
  return n;
}

void cgs_buf_drain(void) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < SLOTS; i++) {
    if (cache[i].p)
      free(header_of(cache[i].p));
    cache[i].p = NULL;
  }
  cached_bytes = 0;
  pthread_mutex_unlock(&mu);
}
