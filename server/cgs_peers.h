/* cgs_peers.h - what the server knows about each peer: its Compute calls
 * still receiving their request (for --max-calls-per-peer), its place in
 * the workers' fair queue, and how many of its failed calls may still be
 * logged.
 *
 * A peer is a client's IP address without the port, so that every
 * connection of one host counts together. Behind NAT or a proxy, every
 * client behind it is one peer; in compose, each container is its own
 * (see README, "Limits"). An IPv6 address is one peer whatever its
 * prefix.
 *
 * With --auth-tokens, the fair queue takes turns between token labels
 * instead: their entries share the table, under keys cgs_peers_get_key
 * names (CGS_PEER_LABEL_PREFIX and the label), which no address matches.
 *
 * Entries live from a peer's first call until it has had no call and no
 * log line for CGS_PEER_IDLE_NS; cgs_peers_sweep frees them. The table
 * holds at most CGS_PEERS_MAX entries; past that, new peers share one
 * overflow entry, which only makes their limits stricter.
 *
 * Threads: any; one mutex guards the table and every entry's fields but
 * turn, which only cgs_pool_submit touches, under the pool's lock, and
 * bulk_turn, which only the completion-queue thread touches. */
#ifndef CGS_PEERS_H
#define CGS_PEERS_H

#include <stddef.h>
#include <stdint.h>

#define CGS_PEERS_MAX 65536
#define CGS_PEER_IDLE_NS (60ull * 1000000000u)

#define CGS_PEER_LABEL_PREFIX "label:"

typedef struct cgs_peer {
  char addr[80];      /* "127.0.0.1", "::1", "unix", "unknown", or
                         CGS_PEER_LABEL_PREFIX and a token's label */
  unsigned live;      /* Compute calls that point at the entry: it stays */
  unsigned receiving; /* of those, the ones still receiving their request
                         (--max-calls-per-peer) */
  uint64_t turn; /* its flow's state in the workers' queue (cgs_pool_submit) */
  uint64_t bulk_turn;  /* its flow's state in the completion-queue thread's
                          bulk work (cgs_cq_defer) */
  double log_tokens;   /* failure lines it may still write now */
  uint64_t suppressed; /* failure lines not written since the last sweep */
  uint64_t t_seen;     /* uv_hrtime of the last use */
  uint64_t t_refill;   /* when log_tokens was last topped up */
  struct cgs_peer *next;
} cgs_peer;

typedef struct cgs_peers cgs_peers;

/* Returns 0 or CG_ENOMEM. */
int cgs_peers_new(cgs_peers **out);
/* Frees every entry; every entry must have been released. */
void cgs_peers_free(cgs_peers *p);
/* The entry of the peer behind grpc_peer ("ipv4:10.0.0.1:5555",
 * "ipv6:[::1]:5555", as grpc_call_get_peer gives it), created if new, held
 * (never NULL, never freed) until cgs_peers_release. */
cgs_peer *cgs_peers_hold(cgs_peers *p, const char *grpc_peer, uint64_t now);
/* The same for the entry of a token's label (CGS_PEER_LABEL_PREFIX and
 * label), which takes turns in the workers' queue for its calls. */
cgs_peer *cgs_peers_hold_label(cgs_peers *p, const char *label, uint64_t now);
void cgs_peers_release(cgs_peers *p, cgs_peer *e);
/* Counts one more call of e receiving its request unless max are:
 * returns 0, or -1 with *receiving set to the count that refused it. */
int cgs_peers_start_receiving(cgs_peers *p, cgs_peer *e, unsigned max,
                              unsigned *receiving);
void cgs_peers_stop_receiving(cgs_peers *p, cgs_peer *e);
/* 1 when a failure line of e (held) may be written now, given per_sec
 * lines a second in bursts of CGS_PEER_LOG_BURST_SECS seconds' worth (0 =
 * no limit); 0 when it is suppressed and counted instead. */
#define CGS_PEER_LOG_BURST_SECS 4
int cgs_peers_log_allowed(cgs_peers *p, cgs_peer *e, uint64_t now,
                          unsigned per_sec);
/* The same for the peer behind grpc_peer, held or not. */
int cgs_peers_log_allowed_for(cgs_peers *p, const char *grpc_peer, uint64_t now,
                              unsigned per_sec);
/* Reports, through report (may be NULL; it runs under the table's lock),
 * every entry that suppressed lines since the last sweep, then frees
 * entries no call holds that have been idle since now - CGS_PEER_IDLE_NS.
 * Run it every few seconds. */
void cgs_peers_sweep(cgs_peers *p, uint64_t now,
                     void (*report)(const cgs_peer *e));
/* Number of entries (tests, GetServerInfo). */
size_t cgs_peers_count(cgs_peers *p);

/* Writes the address part of a grpc peer string into out[cap]. */
void cgs_peer_address(const char *grpc_peer, char *out, size_t cap);

/* How a peer reaches the server, for the metrics' queue waits (a label
 * of three values, never one per address). */
typedef enum {
  CGS_PEER_REMOTE,
  CGS_PEER_LOOPBACK,
  CGS_PEER_UNIX,
  CGS_PEER_CLASSES
} cgs_peer_class;
/* The class of a grpc peer string; NULL or unparsable is remote. */
cgs_peer_class cgs_peer_classify(const char *grpc_peer);
/* "remote", "loopback", "unix". */
const char *cgs_peer_class_name(cgs_peer_class c);

#endif
