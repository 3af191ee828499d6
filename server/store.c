/* store.c - owns the store of staged tensors: the table of entries by
 * (scope, SHA-256), their bytes and references, the least-recently-used
 * order, the byte budget, the charges' shares and the time to live. */
#include "cgs_store.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "cgs_buf.h"

/* Hash buckets (a power of two). */
#define BUCKETS 4096

/* The bytes one client (a token label or an address) holds listed. */
typedef struct charge {
  char key[CGS_STORE_KEY_MAX];
  uint64_t bytes;
  unsigned entries;
  struct charge *next;
} charge;

struct cgs_staged {
  cgs_store *st;
  unsigned refs; /* the table's while listed, one per call (st->mu) */
  unsigned char id[CGS_STORE_ID_BYTES];
  char scope[CGS_STORE_KEY_MAX];
  int priv;   /* a private entry: named only by its charge's callers */
  charge *by; /* while listed */
  unsigned char *data;
  size_t len;
  uint64_t used_ms;
  cgs_staged *chain;         /* the bucket's next */
  cgs_staged *newer, *older; /* the LRU list */
};

struct cgs_store {
  pthread_mutex_t mu;
  unsigned refs; /* the owner's until cgs_store_free, one per entry alive */
  uint64_t budget, ttl_ms, peer_bytes;
  uint64_t salt; /* keeps a client from choosing colliding buckets */
  cgs_staged *bucket[BUCKETS];
  cgs_staged *newest, *oldest;
  charge *charges;
  cgs_store_stats stats; /* bytes counts every entry alive */
};

static size_t bucket_of(const cgs_store *st,
                        const unsigned char id[CGS_STORE_ID_BYTES]) {
  uint64_t v;
  memcpy(&v, id, sizeof v);
  return (size_t)(((v ^ st->salt) * 0x9E3779B97F4A7C15ull) >> 52) &
         (BUCKETS - 1);
}

int cgs_store_new(cgs_store **out, uint64_t budget, uint64_t ttl_ms,
                  uint64_t peer_bytes, char *msg, size_t msglen) {
  cgs_store *st = calloc(1, sizeof *st);
  if (!st) {
    snprintf(msg, msglen, "store: out of memory");
    return -1;
  }
  if (getrandom(&st->salt, sizeof st->salt, 0) != (ssize_t)sizeof st->salt)
    st->salt = (uint64_t)(uintptr_t)st; /* still unknown to clients */
  pthread_mutex_init(&st->mu, NULL);
  st->refs = 1;
  st->budget = budget;
  st->ttl_ms = ttl_ms;
  st->peer_bytes = peer_bytes < budget ? peer_bytes : budget;
  *out = st;
  return 0;
}

/* Drops a reference to st (st->mu not held). */
static void store_unref(cgs_store *st) {
  pthread_mutex_lock(&st->mu);
  unsigned left = --st->refs;
  pthread_mutex_unlock(&st->mu);
  if (left)
    return;
  pthread_mutex_destroy(&st->mu);
  free(st);
}

static charge *find_charge(cgs_store *st, const char *key) {
  for (charge *c = st->charges; c; c = c->next)
    if (!strcmp(c->key, key))
      return c;
  return NULL;
}

/* Drops one reference of e (st->mu held); returns 1 when that was the
 * last: the caller frees e's bytes and e, and unrefs the store, unlocked. */
static int entry_unref(cgs_staged *e) {
  if (--e->refs)
    return 0;
  e->st->stats.bytes -= e->len;
  return 1;
}

static void entry_free(cgs_staged *e) {
  cgs_store *st = e->st;
  cgs_buf_free(e->data);
  free(e);
  store_unref(st);
}

/* Takes e out of the table, its charge and the LRU list (st->mu held);
 * returns 1 when its last reference went with it (see entry_unref). A
 * charge left empty stays until prune_charges, as callers may hold it. */
static int unlist(cgs_store *st, cgs_staged *e) {
  cgs_staged **p = &st->bucket[bucket_of(st, e->id)];
  while (*p != e)
    p = &(*p)->chain;
  *p = e->chain;
  if (e->newer)
    e->newer->older = e->older;
  else
    st->newest = e->older;
  if (e->older)
    e->older->newer = e->newer;
  else
    st->oldest = e->newer;
  e->by->bytes -= e->len;
  e->by->entries--;
  e->by = NULL;
  st->stats.entries--;
  return entry_unref(e);
}

/* Frees the charges without entries (st->mu held). */
static void prune_charges(cgs_store *st) {
  charge **cp = &st->charges;
  while (*cp) {
    charge *c = *cp;
    if (c->entries) {
      cp = &c->next;
      continue;
    }
    *cp = c->next;
    free(c);
  }
}

/* Entries whose last reference went, to free once st->mu is released. */
typedef struct doomed {
  cgs_staged *v[64];
  size_t n;
} doomed;

static void doomed_free(doomed *d) {
  for (size_t i = 0; i < d->n; i++)
    entry_free(d->v[i]);
  d->n = 0;
}

/* Unlists e, keeping it in d when it is to be freed; 0, or -1 when d is
 * full (nothing done). */
static int drop(cgs_store *st, cgs_staged *e, doomed *d) {
  if (d->n == sizeof d->v / sizeof d->v[0])
    return -1;
  if (unlist(st, e))
    d->v[d->n++] = e;
  return 0;
}

void cgs_store_free(cgs_store *st) {
  if (!st)
    return;
  doomed d = {.n = 0};
  pthread_mutex_lock(&st->mu);
  while (st->oldest) {
    if (drop(st, st->oldest, &d) != 0) {
      pthread_mutex_unlock(&st->mu);
      doomed_free(&d);
      pthread_mutex_lock(&st->mu);
    }
  }
  prune_charges(st);
  pthread_mutex_unlock(&st->mu);
  doomed_free(&d);
  store_unref(st);
}

/* scope's content entry id (peer NULL), or peer's private one. */
static cgs_staged *find(cgs_store *st, const char *scope, const char *peer,
                        const unsigned char id[CGS_STORE_ID_BYTES]) {
  for (cgs_staged *e = st->bucket[bucket_of(st, id)]; e; e = e->chain)
    if (memcmp(e->id, id, CGS_STORE_ID_BYTES) == 0 &&
        !strcmp(e->scope, scope) && e->priv == (peer != NULL) &&
        (!peer || !strcmp(e->by->key, peer)))
      return e;
  return NULL;
}

/* Marks e used now: newest in the LRU order (st->mu held). */
static void touch(cgs_store *st, cgs_staged *e, uint64_t now_ms) {
  e->used_ms = now_ms;
  if (st->newest == e)
    return;
  e->newer->older = e->older; /* e is not the newest: newer is set */
  if (e->older)
    e->older->newer = e->newer;
  else
    st->oldest = e->newer;
  e->newer = NULL;
  e->older = st->newest;
  st->newest->newer = e;
  st->newest = e;
}

/* 1 when e has gone unused for the time to live. */
static int expired(const cgs_store *st, const cgs_staged *e, uint64_t now_ms) {
  return now_ms >= e->used_ms && now_ms - e->used_ms >= st->ttl_ms;
}

/* Any size, for lookup. */
#define ANY_LEN UINT64_MAX

/* A found entry (st->mu held) counts as a hit, else a miss; an expired
 * one, or one of another size than len (unless ANY_LEN), is not found. */
static cgs_staged *lookup(cgs_store *st, const char *scope, const char *peer,
                          const unsigned char id[CGS_STORE_ID_BYTES],
                          uint64_t len, uint64_t now_ms) {
  cgs_staged *e = find(st, scope, peer, id);
  if (e && (expired(st, e, now_ms) || (len != ANY_LEN && e->len != len)))
    e = NULL; /* an expired one: the next sweep drops it */
  if (e) {
    st->stats.hits++;
    touch(st, e, now_ms);
  } else {
    st->stats.misses++;
  }
  return e;
}

int cgs_store_touch(cgs_store *st, const char *scope, const char *peer,
                    const unsigned char id[CGS_STORE_ID_BYTES], uint64_t len,
                    uint64_t now_ms) {
  pthread_mutex_lock(&st->mu);
  int present = lookup(st, scope, peer, id, len, now_ms) != NULL;
  pthread_mutex_unlock(&st->mu);
  return present;
}

cgs_staged *cgs_store_get(cgs_store *st, const char *scope, const char *peer,
                          const unsigned char id[CGS_STORE_ID_BYTES],
                          uint64_t now_ms) {
  pthread_mutex_lock(&st->mu);
  cgs_staged *e = lookup(st, scope, peer, id, ANY_LEN, now_ms);
  if (e)
    e->refs++;
  pthread_mutex_unlock(&st->mu);
  return e;
}

void cgs_staged_release(cgs_staged *e) {
  cgs_store *st = e->st;
  pthread_mutex_lock(&st->mu);
  int last = entry_unref(e);
  pthread_mutex_unlock(&st->mu);
  if (last)
    entry_free(e);
}

unsigned char *cgs_staged_data(const cgs_staged *e) {
  return e->data;
}

size_t cgs_staged_len(const cgs_staged *e) {
  return e->len;
}

int cgs_store_admit(const cgs_store *st, uint64_t len, grpc_status_code *code,
                    char *msg, size_t msglen) {
  *code = GRPC_STATUS_RESOURCE_EXHAUSTED;
  if (len > st->budget) {
    snprintf(msg, msglen,
             "header.byte_size: %" PRIu64 " bytes exceed the store's budget "
             "%" PRIu64 " (--store-bytes); send them with the call",
             len, st->budget);
    return -1;
  }
  if (len > st->peer_bytes) {
    snprintf(msg, msglen,
             "header.byte_size: %" PRIu64 " bytes exceed a client's share "
             "of the store, %" PRIu64 " (--store-peer-share); send them with "
             "the call",
             len, st->peer_bytes);
    return -1;
  }
  return 0;
}

/* 1 while room for len more bytes is missing (c: the uploader's
 * charge, NULL before its first entry). */
typedef int (*need_fn)(const cgs_store *st, const charge *c, uint64_t len);

static int over_budget(const cgs_store *st, const charge *c, uint64_t len) {
  (void)c;
  return st->stats.bytes + len > st->budget ||
         st->stats.entries >= CGS_STORE_MAX_ENTRIES;
}

static int over_share(const cgs_store *st, const charge *c, uint64_t len) {
  return c && c->bytes + len > st->peer_bytes;
}

/* Drops the oldest listed entries no call holds, only charge c's when
 * mine is set, while need(); 0 once it is false, else -1 (st->mu held;
 * entries to free go to d, which may fill: then -1 too, and the caller
 * goes on after freeing them). */
static int make_room(cgs_store *st, const charge *c, int mine, uint64_t len,
                     need_fn need, doomed *d) {
  cgs_staged *e = st->oldest;
  while (need(st, c, len)) {
    while (e && (e->refs > 1 || (mine && e->by != c)))
      e = e->newer;
    if (!e)
      return -1;
    cgs_staged *next = e->newer;
    if (drop(st, e, d) != 0)
      return -1;
    st->stats.evictions++;
    e = next;
  }
  return 0;
}

/* Lists a new entry (st->mu held); -1 when out of memory. */
static int list(cgs_store *st, const char *scope, const char *by, int priv,
                const unsigned char id[CGS_STORE_ID_BYTES], unsigned char *data,
                size_t len, uint64_t now_ms) {
  cgs_staged *e = calloc(1, sizeof *e);
  if (!e)
    return -1;
  charge *c = find_charge(st, by);
  if (!c) {
    c = calloc(1, sizeof *c);
    if (!c) {
      free(e);
      return -1;
    }
    snprintf(c->key, sizeof c->key, "%s", by);
    c->next = st->charges;
    st->charges = c;
  }
  e->st = st;
  e->refs = 1;
  memcpy(e->id, id, CGS_STORE_ID_BYTES);
  snprintf(e->scope, sizeof e->scope, "%s", scope);
  e->priv = priv;
  e->data = data;
  e->len = len;
  e->used_ms = now_ms;
  e->by = c;
  c->bytes += len;
  c->entries++;
  size_t b = bucket_of(st, id);
  e->chain = st->bucket[b];
  st->bucket[b] = e;
  e->older = st->newest;
  if (st->newest)
    st->newest->newer = e;
  else
    st->oldest = e;
  st->newest = e;
  st->refs++;
  st->stats.entries++;
  st->stats.bytes += len;
  return 0;
}

int cgs_store_put(cgs_store *st, const char *scope, const char *by, int priv,
                  const unsigned char id[CGS_STORE_ID_BYTES],
                  unsigned char *data, size_t len, uint64_t now_ms, int *retry,
                  grpc_status_code *code, char *msg, size_t msglen) {
  *retry = 0;
  if (cgs_store_admit(st, len, code, msg, msglen) != 0) {
    cgs_buf_free(data);
    return -1;
  }
  doomed d = {.n = 0};
  int rc, room;
  pthread_mutex_lock(&st->mu);
  for (;;) {
    cgs_staged *had = find(st, scope, priv ? by : NULL, id);
    if (had) {
      /* Staged meanwhile by another call: one copy is enough. */
      touch(st, had, now_ms);
      prune_charges(st);
      pthread_mutex_unlock(&st->mu);
      doomed_free(&d);
      cgs_buf_free(data);
      return 0;
    }
    const charge *mine = find_charge(st, by);
    room = make_room(st, mine, 1, len, over_share, &d) == 0 &&
           make_room(st, mine, 0, len, over_budget, &d) == 0;
    if (room || d.n < sizeof d.v / sizeof d.v[0])
      break;
    pthread_mutex_unlock(&st->mu); /* d filled up: free, then go on */
    doomed_free(&d);
    pthread_mutex_lock(&st->mu);
  }
  rc = room ? list(st, scope, by, priv, id, data, len, now_ms) : -1;
  const charge *c = find_charge(st, by);
  uint64_t mine = c ? c->bytes : 0, held = st->stats.bytes;
  int share = over_share(st, c, len);
  prune_charges(st);
  pthread_mutex_unlock(&st->mu);
  doomed_free(&d);
  if (rc == 0)
    return 0;
  cgs_buf_free(data);
  *code = GRPC_STATUS_RESOURCE_EXHAUSTED;
  if (room)
    snprintf(msg, msglen, "store: out of memory");
  else if (share)
    snprintf(msg, msglen,
             "store: this client's entries in use by calls hold %" PRIu64
             " of its %" PRIu64 " bytes (--store-peer-share); retry later",
             mine, st->peer_bytes);
  else
    snprintf(msg, msglen,
             "store: entries in use by calls hold %" PRIu64 " of %" PRIu64
             " bytes (--store-bytes); retry later",
             held, st->budget);
  *retry = room ? 0 : 1;
  return -1;
}

size_t cgs_store_expire(cgs_store *st, uint64_t now_ms) {
  doomed d = {.n = 0};
  size_t n = 0;
  int more = 1;
  while (more) {
    pthread_mutex_lock(&st->mu);
    cgs_staged *e = st->oldest;
    /* The LRU order is the order of last use: the expired ones are the
     * oldest. */
    while (e && expired(st, e, now_ms)) {
      cgs_staged *next = e->newer;
      if (drop(st, e, &d) != 0)
        break;
      st->stats.expired++;
      n++;
      e = next;
    }
    more = e && expired(st, e, now_ms);
    prune_charges(st);
    pthread_mutex_unlock(&st->mu);
    doomed_free(&d);
  }
  return n;
}

void cgs_store_stats_get(cgs_store *st, cgs_store_stats *out) {
  pthread_mutex_lock(&st->mu);
  *out = st->stats;
  pthread_mutex_unlock(&st->mu);
}

uint64_t cgs_store_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void cgs_store_id_hex(const unsigned char id[CGS_STORE_ID_BYTES], char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < CGS_STORE_ID_BYTES; i++) {
    out[2 * i] = digits[id[i] >> 4];
    out[2 * i + 1] = digits[id[i] & 15];
  }
  out[(size_t)2 * CGS_STORE_ID_BYTES] = '\0';
}
