/* cgs_metrics.h - the server's Prometheus metrics (metrics.c): counters
 * and histograms of ended Compute calls, gauges read when scraped, the
 * standard process_* family, and their text exposition format (0.0.4).
 * Served at --metrics-listen by cgs_httpd (server.c wires them).
 *
 * A Compute call counts once, when it ends (whatever its status), so the
 * counters move exactly with the calls clients saw end; bytes are tensor
 * bytes (request chunks received, result bytes sent), not wire framing.
 *
 * Threads: cgs_metrics_call_ended runs on any thread, rendering on
 * the endpoint's; a mutex, held only to copy the figures, orders them.
 * gauges_cb runs on the rendering thread and must be thread-safe. */
#ifndef CGS_METRICS_H
#define CGS_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "cgs_checks.h"
#include "cgs_peers.h"
#include "cgs_store.h"

typedef struct cgs_metrics cgs_metrics;

/* Why a call was refused "retry later" (with trailing metadata
 * retry-after-ms); CGS_REFUSED_NONE for every other end. */
typedef enum {
  CGS_REFUSED_NONE,
  CGS_REFUSED_QUEUE_FULL, /* --workers + --queue-depth places held */
  CGS_REFUSED_INFLIGHT,   /* --max-inflight-bytes held by other calls */
  CGS_REFUSED_PEER_CALLS, /* --max-calls-per-peer calls still receiving */
  CGS_REFUSED_DRAINING,   /* the server is shutting down */
  CGS_REFUSED_REASONS
} cgs_refusal;

/* What an ended Compute call adds. */
typedef struct cgs_metrics_call {
  int op;    /* cg_op; 0 when the header never arrived or did not parse */
  int dtype; /* cg_dtype; 0 likewise */
  int code;  /* grpc_status_code it ended with */
  double request_s; /* the stream's arrival to its end */
  int queued;       /* a worker picked the job up: queue_s is set */
  double queue_s;   /* submitted -> picked up */
  int computed;     /* the job ran to the end: compute_s is set */
  double compute_s; /* the job's run, every output */
  uint64_t bytes_in, bytes_out;
  unsigned cache_hits, cache_misses; /* primitive lookups of its runs */
  cgs_refusal refused;
  unsigned retry_attempt;    /* its convgrad-retry-attempt; 0: a first try */
  cgs_peer_class peer_class; /* of its queue wait */
} cgs_metrics_call;

/* Read at each scrape. */
typedef struct cgs_metrics_gauges {
  uint64_t inflight_bytes;  /* reserved by admitted calls */
  unsigned queued_requests; /* jobs waiting for a worker */
  unsigned busy_workers;    /* workers whose cores run a job */
  uint64_t inline_jobs;     /* jobs the completion-queue thread ran */
  uint64_t bulk_deferred;   /* its bulk work items (cgs_cq_defer) */
  unsigned workers;
  unsigned shm_regions;       /* shared-memory regions registered */
  cgs_store_stats store;      /* zero without a store */
  cgs_checks_counters checks; /* the result checks' counters */
} cgs_metrics_gauges;

typedef void (*cgs_metrics_gauges_cb)(void *data, cgs_metrics_gauges *out);

/* This process's resident memory in bytes, as /proc counts it; 0
 * without /proc. */
uint64_t cgs_metrics_rss_bytes(void);

/* Returns 0 or CG_ENOMEM. *out is owned by the caller, released with
 * cgs_metrics_free(). */
int cgs_metrics_new(cgs_metrics **out, cgs_metrics_gauges_cb gauges_cb,
                    void *data);
/* NULL is fine. Nothing may render m any more. */
void cgs_metrics_free(cgs_metrics *m);
/* Counts one ended call. An op or dtype out of range counts as unknown,
 * a code out of range as UNKNOWN. */
void cgs_metrics_call_ended(cgs_metrics *m, const cgs_metrics_call *c);
/* Counts one ended Stage call: its status, and the bytes it uploaded. */
void cgs_metrics_stage_ended(cgs_metrics *m, int code, uint64_t bytes_in);
/* The exposition text, from malloc (the caller frees it), with *len set;
 * NULL when out of memory. Matches cgs_httpd_render_cb. */
char *cgs_metrics_render(void *m, size_t *len);

/* Content-Type of the text. */
#define CGS_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

#endif
