/* engine_cache.h - the bounded LRU cache behind cg_engine (private).
 *
 * Maps a fixed-size key (every value that defines a problem's primitives)
 * to an entry the engine allocates. The cache owns the entries it holds:
 * it calls the destroy callback on eviction and in cg__cache_close(). Not
 * thread-safe; each engine owns one cache. */
#ifndef CG_ENGINE_CACHE_H
#define CG_ENGINE_CACHE_H

#include <stddef.h>
#include <stdint.h>

/* an avoided implementation (cg_engine_run_other), op, dtype, nsp, mb,
 * groups, ic, oc, threads, 4 formats and 8 spatial
 * triples (in, out, kernel, stride, dilation, pads begin/end,
 * output_padding). */
#define CG__KEY_LEN (13 + 8 * 3)

typedef struct cg__key {
  int64_t v[CG__KEY_LEN];
} cg__key;

/* Embedded as the first member of the engine's entry type. */
typedef struct cg__cache_entry {
  struct cg__cache_entry *lru_prev, *lru_next; /* most recent at head */
  struct cg__cache_entry *hash_next;
  uint64_t hash;
  cg__key key;
} cg__cache_entry;

typedef void (*cg__cache_destroy_fn)(cg__cache_entry *e);

typedef struct cg__cache {
  cg__cache_entry **buckets;
  size_t nbuckets; /* power of two */
  size_t count, capacity;
  cg__cache_entry *head, *tail;
  cg__cache_destroy_fn destroy;
} cg__cache;

/* capacity > 0. Returns 0 or CG_ENOMEM. */
int cg__cache_init(cg__cache *c, size_t capacity, cg__cache_destroy_fn destroy);
/* Destroys every entry and the table; c may be zeroed (never inited). */
void cg__cache_close(cg__cache *c);
/* The entry for key k (and marks it most recently used), or NULL. */
cg__cache_entry *cg__cache_get(cg__cache *c, const cg__key *k);
/* The entry for key k, or NULL; the recency order stays. */
const cg__cache_entry *cg__cache_find(const cg__cache *c, const cg__key *k);
/* A 64-bit hash of k that depends on every word. */
uint64_t cg__key_hash(const cg__key *k);
/* Inserts e (its key already set, not present in c), evicting the least
 * recently used entry when full. Takes ownership of e. */
void cg__cache_put(cg__cache *c, cg__cache_entry *e);

#endif
