/* cgs_config.h - convgrad-server configuration: one declarative table of
 * options (name, type, default, bounds, help), each settable as a
 * command-line flag (--name) or a CONVGRAD_NAME environment variable.
 * Precedence: default < environment < flag. Not thread-safe; the config
 * is filled once in main() and read-only afterwards. */
#ifndef CGS_CONFIG_H
#define CGS_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cg/limits.h"
#include "cgs_log.h"

#define CGS_MAX_CPUS 256

typedef struct cgs_cpu_list {
  int cpu[CGS_MAX_CPUS];
  unsigned n;
} cgs_cpu_list;

/* How many OpenMP threads a job runs with. */
typedef enum {
  CGS_THREADS_AUTO = 0, /* until cgs_config_finish: adaptive unless
                           --workers or --threads-per-worker is given */
  CGS_THREADS_ADAPTIVE, /* a job also takes the cores of idle workers */
  CGS_THREADS_STATIC    /* threads_per_worker, always */
} cgs_threads_policy;

/* Who may use shared-memory regions. */
typedef enum {
  CGS_SHM_OFF = 0,
  CGS_SHM_LOCAL, /* callers on a unix socket or a loopback address */
  CGS_SHM_ON     /* every caller (another container sharing IPC) */
} cgs_shm_policy;

/* --check-rate's default, a fraction: what costs at most 2% of compute
 * time on the ResNet-50 rows of tests/bench/problems.txt
 * (tests/server/bench_check.c; server/README.md has the figures). */
#define CGS_CHECK_RATE_DEFAULT "0.002"

/* Room of every string option, its NUL included. */
#define CGS_CONFIG_STR 256

typedef struct cgs_config {
  char listen[CGS_CONFIG_STR]; /* HOST:PORT and unix:PATH, comma-separated
                                  (listen.c) */
  unsigned socket_mode;        /* of the unix sockets */
  /* TLS on the TCP addresses: PEM files, "" = none (plaintext); with
   * tls_client_ca, clients must present a certificate it signed. */
  char tls_cert[CGS_CONFIG_STR], tls_key[CGS_CONFIG_STR];
  char tls_client_ca[CGS_CONFIG_STR];
  char auth_tokens[CGS_CONFIG_STR];    /* token file; "" = no authentication */
  char warmup[CGS_CONFIG_STR];         /* shapes to warm; "" = none */
  unsigned auth_health;                /* health needs a token too */
  unsigned allow_insecure_auth;        /* tokens on non-loopback plaintext */
  char metrics_listen[CGS_CONFIG_STR]; /* HOST:PORT of GET /metrics; "" =
                                          off */
  unsigned workers;                    /* 0 until cgs_config_finish: auto */
  unsigned threads_per_worker;         /* cores each worker owns; 0 until
                                          cgs_config_finish: auto (1) */
  cgs_threads_policy threads_policy;
  cgs_cpu_list cpus;            /* cores workers are pinned to, in order; empty
                                   until cgs_config_finish: all allowed */
  cgs_cpu_list io_cpus;         /* cores of the loop and gRPC threads; empty =
                                  not pinned */
  unsigned queue_depth;         /* requests admitted beyond the workers */
  uint64_t max_request_bytes;   /* sum of one request's tensor bytes */
  uint64_t max_tensor_elements; /* elements of any one tensor */
  uint64_t max_request_flops;   /* work of one request; 0 = no limit */
  /* The service limits on spatial attributes (cg/limits.h). */
  uint64_t max_stride, max_dilation, max_pad, max_output_padding;
  uint64_t max_effective_extent, max_padded_extent;
  uint64_t max_inflight_bytes;  /* reserved by admitted requests; 0 = auto */
  uint64_t chunk_bytes;         /* default response chunk size */
  uint64_t stream_window_bytes; /* HTTP/2 per-stream receive window */
  uint64_t grace_ms;            /* drain time after SIGTERM/SIGINT */
  uint64_t idle_timeout_ms;     /* a call without progress ends; 0 = never */
  uint64_t keep_warm_ms;        /* an idle server keeps its memory this long */
  unsigned max_calls_per_peer;  /* 0 until cgs_config_finish: auto */
  uint64_t min_upload_rate;     /* bytes/s per --idle-timeout window; 0 = off */
  unsigned max_streams_per_connection; /* HTTP/2 concurrent streams */
  cgs_shm_policy shm;              /* who may register shared-memory regions */
  char shm_prefix[CGS_CONFIG_STR]; /* region keys are "/" + this + ...; ""
                                      = any name */
  unsigned max_regions;            /* registered at once */
  uint64_t max_region_bytes;       /* byte_size of one region */
  uint64_t region_idle_timeout_ms; /* unused regions are dropped; 0 = never */
  uint64_t store_bytes;            /* budget of staged tensors; 0 = no store */
  uint64_t store_ttl_ms;           /* an unused staged tensor is dropped */
  unsigned store_peer_pct; /* percent of store_bytes one client may hold */
  unsigned peer_log_rate;  /* failure lines/s per client address; 0 = all */
  /* Result checks (cgs_checks.h): calls sampled, in millionths; outputs
   * checked on their primitives' first runs; failures within
   * check_window_ms that quarantine the replica (0 = never). */
  uint64_t check_rate_ppm;
  unsigned check_first_runs;
  unsigned check_quarantine;
  uint64_t check_window_ms;
  cgs_log_level log_level;
} cgs_config;

/* The bytes of the store one client may hold: --store-peer-share percent
 * of --store-bytes. */
uint64_t cgs_config_store_peer_bytes(const cgs_config *c);
/* Fills c with the table's defaults. Returns 0 (defaults always parse). */
int cgs_config_defaults(cgs_config *c, char *err, size_t errlen);
/* Applies argv (getopt_long) and, for each option no flag sets, its
 * CONVGRAD_* variable if set. Returns 0, 1 when --help was given (usage
 * already printed to out; nothing else is checked), CGS_CONFIG_VERSION
 * when --version was (for the caller to print; nothing else is checked),
 * or -1 with a message naming the flag or variable. */
#define CGS_CONFIG_VERSION 2
int cgs_config_load(cgs_config *c, int argc, char **argv, FILE *out, char *err,
                    size_t errlen);
/* Sets one option by its long name ("max-request-bytes"). Returns 0 or -1
 * with a message naming the option and its bounds. */
int cgs_config_set(cgs_config *c, const char *name, const char *value,
                   char *err, size_t errlen);
/* Resolves automatic values (cpus = all this process may use, workers =
 * cpus / threads_per_worker, max_inflight_bytes = half of physical memory
 * or of the cgroup's memory limit if lower, max_calls_per_peer = half of
 * workers + queue_depth) and cross-checks options. Returns 0 or -1 with a
 * message. */
int cgs_config_finish(cgs_config *c, char *err, size_t errlen);
/* The memory limit of this process's cgroup (the smallest of its own and
 * its ancestors', cgroup v2 memory.max or v1 memory.limit_in_bytes), or 0
 * when there is none. root is normally /sys/fs/cgroup and self
 * /proc/self/cgroup. */
uint64_t cgs_config_cgroup_memory(const char *root, const char *self);
/* Prints --help: every option, its variable, default and bounds. */
void cgs_config_usage(FILE *out, const char *argv0);
/* The service limits of c as the kernels library takes them. Inline, as
 * the request path (upload.c) is also built without this module (the
 * fuzzer). */
static inline void cgs_config_limits(const cgs_config *c, cg_limits *out) {
  out->max[CG_LIMIT_STRIDE] = (int64_t)c->max_stride;
  out->max[CG_LIMIT_DILATION] = (int64_t)c->max_dilation;
  out->max[CG_LIMIT_PAD] = (int64_t)c->max_pad;
  out->max[CG_LIMIT_OUTPUT_PADDING] = (int64_t)c->max_output_padding;
  out->max[CG_LIMIT_EFFECTIVE_EXTENT] = (int64_t)c->max_effective_extent;
  out->max[CG_LIMIT_PADDED_EXTENT] = (int64_t)c->max_padded_extent;
}
/* The flag that sets limit which ("--max-stride"); static string. */
static inline const char *cgs_config_limit_flag(cg_limit which) {
  static const char *const flags[CG_LIMIT_COUNT] = {
      "--max-stride",         "--max-dilation",         "--max-pad",
      "--max-output-padding", "--max-effective-extent", "--max-padded-extent"};
  return (int)which >= 0 && which < CG_LIMIT_COUNT ? flags[which] : "?";
}
/* "adaptive", "static" or "auto"; static string. */
const char *cgs_threads_policy_name(cgs_threads_policy tp);
/* "off", "local" or "on"; static string. */
const char *cgs_shm_policy_name(cgs_shm_policy sp);
/* Writes the cpu list as "0,1,2" into buf ("any" when empty). */
void cgs_config_format_cpus(const cgs_cpu_list *l, char *buf, size_t len);

#endif
