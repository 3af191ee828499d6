/* peers.c - owns the peer table: a chained hash of peer addresses with
 * their live-call counts and log-line budgets. */
#include "cgs_peers.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg/error.h"
#include "cg/text.h"

#define NBUCKETS 4096

struct cgs_peers {
  pthread_mutex_t mu; /* the table and every entry */
  cgs_peer *bucket[NBUCKETS];
  cgs_peer overflow; /* shared by new peers once the table is full */
  size_t n;
};

int cgs_peers_new(cgs_peers **out) {
  cgs_peers *p = calloc(1, sizeof *p);
  if (!p)
    return CG_ENOMEM;
  strcpy(p->overflow.addr, "overflow");
  pthread_mutex_init(&p->mu, NULL);
  *out = p;
  return 0;
}

void cgs_peers_free(cgs_peers *p) {
  if (!p)
    return;
  for (size_t b = 0; b < NBUCKETS; b++)
    for (cgs_peer *e = p->bucket[b], *next; e; e = next) {
      next = e->next;
      free(e);
    }
  pthread_mutex_destroy(&p->mu);
  free(p);
}

void cgs_peer_address(const char *grpc_peer, char *out, size_t cap) {
  cg_text t;
  cg_text_init(&t, out, cap);
  if (!grpc_peer) {
    cg_text_appendf(&t, "unknown");
    return;
  }
  const char *a = grpc_peer, *end;
  if (strncmp(a, "ipv4:", 5) == 0 || strncmp(a, "ipv6:", 5) == 0)
    a += 5;
  if (*a == '[') { /* [v6]:port */
    a++;
    end = strchr(a, ']');
  } else {
    end = strrchr(a, ':');
  }
  cg_text_append(&t, a, end ? (size_t)(end - a) : strlen(a));
}

/* FNV-1a */
static size_t hash(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return (size_t)(h % NBUCKETS);
}

/* With p->mu held: the entry of key, created if new. */
static cgs_peer *get_key(cgs_peers *p, const char *key, uint64_t now) {
  size_t b = hash(key);
  cgs_peer *e = p->bucket[b];
  while (e && strcmp(e->addr, key) != 0)
    e = e->next;
  if (!e && p->n < CGS_PEERS_MAX && (e = calloc(1, sizeof *e))) {
    snprintf(e->addr, sizeof e->addr, "%s", key);
    e->next = p->bucket[b];
    p->bucket[b] = e;
    p->n++;
  }
  if (!e)
    e = &p->overflow;
  e->t_seen = now;
  return e;
}

static cgs_peer *get(cgs_peers *p, const char *grpc_peer, uint64_t now) {
  char addr[sizeof p->overflow.addr];
  cgs_peer_address(grpc_peer, addr, sizeof addr);
  return get_key(p, addr, now);
}

cgs_peer *cgs_peers_hold(cgs_peers *p, const char *grpc_peer, uint64_t now) {
  pthread_mutex_lock(&p->mu);
  cgs_peer *e = get(p, grpc_peer, now);
  e->live++;
  pthread_mutex_unlock(&p->mu);
  return e;
}

cgs_peer *cgs_peers_hold_label(cgs_peers *p, const char *label, uint64_t now) {
  char key[sizeof p->overflow.addr];
  snprintf(key, sizeof key, "%s%s", CGS_PEER_LABEL_PREFIX, label);
  pthread_mutex_lock(&p->mu);
  cgs_peer *e = get_key(p, key, now);
  e->live++;
  pthread_mutex_unlock(&p->mu);
  return e;
}

void cgs_peers_release(cgs_peers *p, cgs_peer *e) {
  pthread_mutex_lock(&p->mu);
  e->live--;
  pthread_mutex_unlock(&p->mu);
}

int cgs_peers_start_receiving(cgs_peers *p, cgs_peer *e, unsigned max,
                              unsigned *receiving) {
  int rc = 0;
  pthread_mutex_lock(&p->mu);
  if (e->receiving >= max) {
    *receiving = e->receiving;
    rc = -1;
  } else {
    e->receiving++;
  }
  pthread_mutex_unlock(&p->mu);
  return rc;
}

void cgs_peers_stop_receiving(cgs_peers *p, cgs_peer *e) {
  pthread_mutex_lock(&p->mu);
  e->receiving--;
  pthread_mutex_unlock(&p->mu);
}

/* With p->mu held. */
static int log_allowed(cgs_peer *e, uint64_t now, unsigned per_sec) {
  if (!per_sec)
    return 1;
  double burst = (double)per_sec * CGS_PEER_LOG_BURST_SECS;
  if (!e->t_refill)
    e->log_tokens = burst; /* a new peer starts with a full budget */
  e->log_tokens += (double)(now - e->t_refill) / 1e9 * per_sec;
  if (e->log_tokens > burst)
    e->log_tokens = burst;
  e->t_refill = now;
  if (e->log_tokens < 1) {
    e->suppressed++;
    return 0;
  }
  e->log_tokens -= 1;
  return 1;
}

int cgs_peers_log_allowed(cgs_peers *p, cgs_peer *e, uint64_t now,
                          unsigned per_sec) {
  pthread_mutex_lock(&p->mu);
  int ok = log_allowed(e, now, per_sec);
  pthread_mutex_unlock(&p->mu);
  return ok;
}

int cgs_peers_log_allowed_for(cgs_peers *p, const char *grpc_peer, uint64_t now,
                              unsigned per_sec) {
  pthread_mutex_lock(&p->mu);
  int ok = log_allowed(get(p, grpc_peer, now), now, per_sec);
  pthread_mutex_unlock(&p->mu);
  return ok;
}

/* Reports what e suppressed since the last sweep. */
static void flush_suppressed(cgs_peer *e, void (*report)(const cgs_peer *e)) {
  if (e->suppressed && report)
    report(e);
  e->suppressed = 0;
}

void cgs_peers_sweep(cgs_peers *p, uint64_t now,
                     void (*report)(const cgs_peer *e)) {
  pthread_mutex_lock(&p->mu);
  for (size_t b = 0; b < NBUCKETS; b++) {
    cgs_peer **link = &p->bucket[b];
    while (*link) {
      cgs_peer *e = *link;
      flush_suppressed(e, report);
      if (e->live || now - e->t_seen < CGS_PEER_IDLE_NS) {
        link = &e->next;
        continue;
      }
      *link = e->next;
      free(e);
      p->n--;
    }
  }
  flush_suppressed(&p->overflow, report);
  pthread_mutex_unlock(&p->mu);
}

size_t cgs_peers_count(cgs_peers *p) {
  pthread_mutex_lock(&p->mu);
  size_t n = p->n;
  pthread_mutex_unlock(&p->mu);
  return n;
}

cgs_peer_class cgs_peer_classify(const char *grpc_peer) {
  if (!grpc_peer)
    return CGS_PEER_REMOTE;
  if (strncmp(grpc_peer, "unix", 4) == 0)
    return CGS_PEER_UNIX; /* unix: and unix-abstract: */
  if (strncmp(grpc_peer, "ipv4:127.", 9) == 0 ||
      strncmp(grpc_peer, "ipv6:[::1]:", 11) == 0 ||
      strncmp(grpc_peer, "ipv6:[::ffff:127.", 17) == 0)
    return CGS_PEER_LOOPBACK;
  return CGS_PEER_REMOTE;
}

const char *cgs_peer_class_name(cgs_peer_class c) {
  static const char *const names[CGS_PEER_CLASSES] = {"remote", "loopback",
                                                      "unix"};
  return c < CGS_PEER_CLASSES ? names[c] : "remote";
}
