/* cgs_store.h - the store of staged tensors (store.c): bytes that
 * clients uploaded ahead of the Compute calls that name them (Stage),
 * keyed by the SHA-256 of their content within a scope.
 *
 * A scope is who may name an entry: the caller's token label with
 * --auth-tokens, else "" (every caller of an open server). Within it an
 * entry is shared: naming it needs the hash of its content, which only a
 * caller holding that content has. The scope keeps one token's callers
 * from learning whether another's hold some content (proto/SEMANTICS.md,
 * "Staged tensors").
 *
 * A private entry (StageHeader.private_id) is named by an id its client
 * drew, not by a hash of its bytes, and only its charge's callers find
 * it (peer below: the charge's text; NULL names content entries). The
 * two kinds never match each other: no private upload can stand behind a
 * content id, whatever id it claims.
 *
 * Bounds: a byte budget, a time to live after the last use, and each
 * client's share (its charge: the token label, else its address), which
 * its own entries' bytes may not pass. Room is made by dropping the least
 * recently used entries that no call holds.
 *
 * Lifetimes: an entry is referenced by the table while listed and by each
 * call using it (cgs_store_get). Dropping it (eviction, expiry, the
 * store's end) only removes the table's reference; its bytes go with the
 * last reference, and count in the store's bytes until then. The store
 * itself lives until cgs_store_free and its last entry's release.
 *
 * Threads: any; one mutex guards the table, the counts and every entry's
 * reference count. */
#ifndef CGS_STORE_H
#define CGS_STORE_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/status.h>

/* Bytes of an entry's id, a SHA-256. */
#define CGS_STORE_ID_BYTES 32
/* Entries listed at once, all scopes together: past it, the least
 * recently used idle entry makes room. */
#define CGS_STORE_MAX_ENTRIES 16384
/* Room of a scope's and a charge's text, NUL included (longer ones are
 * cut: a token label is at most CGS_AUTH_LABEL_MAX). */
#define CGS_STORE_KEY_MAX 160

typedef struct cgs_store cgs_store;
typedef struct cgs_staged cgs_staged;

typedef struct cgs_store_stats {
  uint64_t bytes;     /* held by entries, those only calls still use too */
  uint64_t entries;   /* listed */
  uint64_t hits;      /* names found (cgs_store_get, cgs_store_touch) */
  uint64_t misses;    /* names not found */
  uint64_t evictions; /* entries dropped for room */
  uint64_t expired;   /* entries dropped after the time to live unused */
} cgs_store_stats;

/* A store of at most budget bytes (> 0) whose entries live ttl_ms (> 0)
 * after their last use, and of which one charge may hold at most
 * peer_bytes (> 0). Returns 0, or -1 with msg (out of memory). */
int cgs_store_new(cgs_store **out, uint64_t budget, uint64_t ttl_ms,
                  uint64_t peer_bytes, char *msg, size_t msglen);
/* Drops every entry; entries calls still hold go with their release.
 * NULL is accepted. */
void cgs_store_free(cgs_store *st);

/* Checks before an upload that an entry of len bytes could be taken from
 * charge at all: 0, or -1 with RESOURCE_EXHAUSTED and msg naming the
 * limit (len over the budget or a charge's share: permanent). */
int cgs_store_admit(const cgs_store *st, uint64_t len, grpc_status_code *code,
                    char *msg, size_t msglen);
/* 1 when scope's entry id of len bytes is listed (its use refreshed,
 * counted as a hit), else 0 (a miss): its content entry with peer NULL,
 * else peer's private one. */
int cgs_store_touch(cgs_store *st, const char *scope, const char *peer,
                    const unsigned char id[CGS_STORE_ID_BYTES], uint64_t len,
                    uint64_t now_ms);
/* Lists data (len bytes, cgs_buf_alloc'd; the store owns it from here
 * whatever the outcome) as scope's entry id, charged to charge, making
 * room first. The id must be data's SHA-256 (the caller verified it),
 * unless priv: then the entry is charge's private one. An entry already
 * listed under that name stays, and data goes. Returns 0,
 * or -1 with RESOURCE_EXHAUSTED and msg: len over the budget or the
 * share (permanent, as cgs_store_admit), or no room because calls hold
 * the entries that would make it (*retry set: try again later). */
int cgs_store_put(cgs_store *st, const char *scope, const char *charge,
                  int priv, const unsigned char id[CGS_STORE_ID_BYTES],
                  unsigned char *data, size_t len, uint64_t now_ms, int *retry,
                  grpc_status_code *code, char *msg, size_t msglen);
/* scope's entry id (peer as cgs_store_touch) with a reference for the
 * caller (its use refreshed, a hit), or NULL (a miss). */
cgs_staged *cgs_store_get(cgs_store *st, const char *scope, const char *peer,
                          const unsigned char id[CGS_STORE_ID_BYTES],
                          uint64_t now_ms);
/* Drops a reference from cgs_store_get; the last one frees the bytes. */
void cgs_staged_release(cgs_staged *e);
/* The entry's bytes (64-byte aligned) and their count. */
unsigned char *cgs_staged_data(const cgs_staged *e);
size_t cgs_staged_len(const cgs_staged *e);

/* Drops the entries unused for the time to live; returns how many. */
size_t cgs_store_expire(cgs_store *st, uint64_t now_ms);
/* The counts now. */
void cgs_store_stats_get(cgs_store *st, cgs_store_stats *out);

/* The clock of now_ms above: monotonic milliseconds. */
uint64_t cgs_store_now_ms(void);
/* The lowercase hex of an id into out (2 * CGS_STORE_ID_BYTES + 1). */
void cgs_store_id_hex(const unsigned char id[CGS_STORE_ID_BYTES], char *out);

#endif
