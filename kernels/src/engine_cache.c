/* engine_cache.c - the bounded LRU cache of cg_engine: a chained hash table
 * over fixed-size keys plus a recency list (engine_cache.h). */
#include <stdlib.h>
#include <string.h>

#include "cg/error.h"
#include "engine_cache.h"

/* FNV-1a over the key's 64-bit words (keys are zero-filled, so unused
 * words are defined), with a final avalanche so the low bits that pick
 * the bucket depend on every word. */
uint64_t cg__key_hash(const cg__key *k) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < CG__KEY_LEN; i++) {
    h ^= (uint64_t)k->v[i];
    h *= 1099511628211ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

int cg__cache_init(cg__cache *c, size_t capacity,
                   cg__cache_destroy_fn destroy) {
  memset(c, 0, sizeof *c);
  size_t n = 16;
  while (n < capacity * 2 && n < ((size_t)1 << 20))
    n *= 2;
  c->buckets = calloc(n, sizeof(cg__cache_entry *));
  if (!c->buckets)
    return CG_ENOMEM;
  c->nbuckets = n;
  c->capacity = capacity;
  c->destroy = destroy;
  return 0;
}

static void lru_unlink(cg__cache *c, cg__cache_entry *e) {
  if (e->lru_prev)
    e->lru_prev->lru_next = e->lru_next;
  else
    c->head = e->lru_next;
  if (e->lru_next)
    e->lru_next->lru_prev = e->lru_prev;
  else
    c->tail = e->lru_prev;
  e->lru_prev = e->lru_next = NULL;
}

static void lru_push_front(cg__cache *c, cg__cache_entry *e) {
  e->lru_prev = NULL;
  e->lru_next = c->head;
  if (c->head)
    c->head->lru_prev = e;
  c->head = e;
  if (!c->tail)
    c->tail = e;
}

static void hash_unlink(cg__cache *c, cg__cache_entry *e) {
  cg__cache_entry **pp = &c->buckets[e->hash & (c->nbuckets - 1)];
  while (*pp && *pp != e)
    pp = &(*pp)->hash_next;
  if (*pp)
    *pp = e->hash_next;
  e->hash_next = NULL;
}

void cg__cache_close(cg__cache *c) {
  cg__cache_entry *e = c->head;
  while (e) {
    cg__cache_entry *next = e->lru_next;
    c->destroy(e);
    e = next;
  }
  free(c->buckets);
  memset(c, 0, sizeof *c);
}

static cg__cache_entry *lookup(const cg__cache *c, const cg__key *k) {
  uint64_t h = cg__key_hash(k);
  cg__cache_entry *e = c->buckets[h & (c->nbuckets - 1)];
  while (e && !(e->hash == h && memcmp(&e->key, k, sizeof *k) == 0))
    e = e->hash_next;
  return e;
}

const cg__cache_entry *cg__cache_find(const cg__cache *c, const cg__key *k) {
  return lookup(c, k);
}

cg__cache_entry *cg__cache_get(cg__cache *c, const cg__key *k) {
  cg__cache_entry *e = lookup(c, k);
  if (e && e != c->head) {
    lru_unlink(c, e);
    lru_push_front(c, e);
  }
  return e;
}

void cg__cache_put(cg__cache *c, cg__cache_entry *e) {
  if (c->count >= c->capacity && c->tail) {
    cg__cache_entry *old = c->tail;
    lru_unlink(c, old);
    hash_unlink(c, old);
    c->count--;
    c->destroy(old);
  }
  e->hash = cg__key_hash(&e->key);
  size_t b = e->hash & (c->nbuckets - 1);
  e->hash_next = c->buckets[b];
  c->buckets[b] = e;
  lru_push_front(c, e);
  c->count++;
}
