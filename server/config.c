/* config.c - owns the option table of convgrad-server and the parsing of
 * flags and CONVGRAD_* environment variables into a cgs_config. */
#include "cgs_config.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cg/text.h"
#include "cgs_listen.h"

typedef enum {
  OPT_STRING, /* char[] field */
  OPT_UINT,   /* unsigned field */
  OPT_SIZE,   /* uint64_t field, accepts K/M/G/T binary suffixes */
  OPT_COUNT,  /* uint64_t field, plain number */
  OPT_FLOPS,  /* uint64_t field, accepts K/M/G/T decimal suffixes */
  OPT_MS,     /* uint64_t field of milliseconds, given in seconds */
  OPT_CPUS,   /* cgs_cpu_list */
  OPT_LEVEL,  /* cgs_log_level */
  OPT_POLICY, /* cgs_threads_policy */
  OPT_MODE,   /* unsigned field, a file mode in octal */
  OPT_SHM,    /* cgs_shm_policy */
  OPT_RATE,   /* uint64_t field of millionths, given as a fraction 0..1 */
  OPT_FLAG    /* unsigned field, 0 or 1: a flag without a value; its
                 variable takes 1/0, true/false, yes/no */
} opt_type;

typedef struct opt_def {
  const char *name;
  opt_type type;
  size_t offset;
  const char *def;
  uint64_t min, max; /* inclusive; for OPT_MS in milliseconds */
  const char *help;
} opt_def;

/* A macro's value as a string literal: the limits' defaults come from
 * cg/limits.h. */
#define STR_(x) #x
#define STR(x) STR_(x)

#define KIB 1024ull
#define MIB (1024ull * KIB)
#define GIB (1024ull * MIB)
#define TIB (1024ull * GIB)

/* The one table of options. Defaults are strings run through the same
 * parser as user input, so they are checked against the same bounds. */
static const opt_def opt_table[] = {
    {"listen", OPT_STRING, offsetof(cgs_config, listen), "127.0.0.1:50051", 0,
     0,
     "addresses to listen on, a comma list of HOST:PORT (port 0 picks a "
     "free port) and unix:/PATH (a unix socket for trainers on this host)"},
    {"socket-mode", OPT_MODE, offsetof(cgs_config, socket_mode), "0660", 0,
     0777, "file mode of --listen's unix sockets, in octal"},
    {"tls-cert", OPT_STRING, offsetof(cgs_config, tls_cert), "", 0, 0,
     "PEM certificate chain: serve TLS on the TCP addresses (unix sockets "
     "stay plaintext, guarded by their file mode); needs --tls-key"},
    {"tls-key", OPT_STRING, offsetof(cgs_config, tls_key), "", 0, 0,
     "PEM private key of --tls-cert (not encrypted)"},
    {"tls-client-ca", OPT_STRING, offsetof(cgs_config, tls_client_ca), "", 0, 0,
     "PEM CA bundle: require and verify client certificates it signed "
     "(mutual TLS); needs --tls-cert"},
    {"auth-tokens", OPT_STRING, offsetof(cgs_config, auth_tokens), "", 0, 0,
     "file of bearer tokens (one a line, or sha256:HEX, each optionally "
     "followed by a label): Compute and GetServerInfo then need "
     "'authorization: Bearer TOKEN' metadata, else UNAUTHENTICATED; "
     "SIGHUP reloads it"},
    {"warmup", OPT_STRING, offsetof(cgs_config, warmup), "", 0, 0,
     "file of shapes to build kernels for before serving, one a line: a "
     "benchdnn descriptor, then optionally op=, dtype=, data_format=, "
     "weights_format= (default: the layer op, every output, f32); health "
     "says NOT_SERVING and the readiness line waits until every worker "
     "has run them"},
    {"auth-health", OPT_FLAG, offsetof(cgs_config, auth_health), "0", 0, 1,
     "with --auth-tokens, health checks need a token too (by default they "
     "stay open for probes)"},
    {"allow-insecure-auth", OPT_FLAG, offsetof(cgs_config, allow_insecure_auth),
     "0", 0, 1,
     "allow --auth-tokens on a TCP address other than loopback without TLS, "
     "where a token crosses the network in clear"},
    {"metrics-listen", OPT_STRING, offsetof(cgs_config, metrics_listen), "", 0,
     0,
     "HOST:PORT serving Prometheus metrics over HTTP at GET /metrics "
     "(port 0 picks a free port); empty = no metrics endpoint"},
    {"workers", OPT_UINT, offsetof(cgs_config, workers), "0", 0, 256,
     "compute worker threads; 0 = one per --cpus entry / threads-per-worker"},
    {"threads-per-worker", OPT_UINT, offsetof(cgs_config, threads_per_worker),
     "0", 0, 256,
     "cores (OpenMP threads) each worker owns; 0 = 1. Under the static "
     "policy every job runs with exactly these"},
    {"threads-policy", OPT_POLICY, offsetof(cgs_config, threads_policy), "", 0,
     0,
     "adaptive: a job also runs on the cores of workers idle when it "
     "starts (a lone call gets every core, under load each job keeps its "
     "own); static: every job runs with --threads-per-worker threads. "
     "Empty = adaptive unless --workers or --threads-per-worker is given"},
    {"cpus", OPT_CPUS, offsetof(cgs_config, cpus), "", 0, CGS_MAX_CPUS - 1,
     "cores to pin workers to, e.g. 0,1 or 0-3 (worker i takes the next "
     "threads-per-worker entries); empty = every core this process may use"},
    {"io-cpus", OPT_CPUS, offsetof(cgs_config, io_cpus), "", 0,
     CGS_MAX_CPUS - 1,
     "cores for the event loop and gRPC's threads; empty = not pinned. "
     "Sharing a core with a worker makes small calls faster (thread "
     "hand-offs stay on one core)"},
    {"queue-depth", OPT_UINT, offsetof(cgs_config, queue_depth), "256", 1,
     1000000,
     "requests admitted beyond the workers (uploading or "
     "waiting; the clients' waiting jobs take turns); more are refused "
     "with RESOURCE_EXHAUSTED and retry-after-ms at their header"},
    {"max-request-bytes", OPT_SIZE, offsetof(cgs_config, max_request_bytes),
     "3G", 1, 64 * TIB, "largest total of one request's tensor bytes"},
    {"shm", OPT_SHM, offsetof(cgs_config, shm), "local", 0, 0,
     "shared-memory regions (RegisterRegion): local = served to callers on "
     "a unix socket or loopback address, on = to every caller (clients in "
     "other containers sharing the IPC namespace), off = refused"},
    {"shm-prefix", OPT_STRING, offsetof(cgs_config, shm_prefix), "convgrad-", 0,
     0,
     "RegisterRegion opens only objects whose key starts with '/' and this "
     "(A-Z a-z 0-9 . _ -, at most 64), which keeps other programs' objects "
     "in /dev/shm out of callers' reach; the client library names its "
     "objects /convgrad-..., or after this variable when set; '' = any "
     "name"},
    {"max-regions", OPT_UINT, offsetof(cgs_config, max_regions), "64", 1, 4096,
     "shared-memory regions registered at once, all callers together"},
    {"max-region-bytes", OPT_SIZE, offsetof(cgs_config, max_region_bytes),
     "16G", 4 * KIB, 64 * TIB,
     "largest shared-memory region; the server maps it (address space, not "
     "memory: the pages are the client's)"},
    {"region-idle-timeout", OPT_MS,
     offsetof(cgs_config, region_idle_timeout_ms), "600", 0,
     7ull * 24 * 3600 * 1000,
     "seconds after which a region no call has used is unregistered (what "
     "a client that died left behind; the client library registers its "
     "regions again when a call finds them gone). 0 = never"},
    {"store-bytes", OPT_SIZE, offsetof(cgs_config, store_bytes), "1G", 0,
     64 * TIB,
     "byte budget of the store of staged tensors (Stage): what trainers "
     "upload during the forward pass for the backward's calls to name; "
     "the least recently used entries no call holds make room. 0 = no "
     "store (Stage is refused with FAILED_PRECONDITION)"},
    {"store-ttl", OPT_MS, offsetof(cgs_config, store_ttl_ms), "60", 1000,
     24ull * 3600 * 1000,
     "seconds a staged tensor lives after its last use (staged or named "
     "by a call)"},
    {"store-peer-share", OPT_UINT, offsetof(cgs_config, store_peer_pct), "50",
     1, 100,
     "percent of --store-bytes one client (a token's label, else an "
     "address) may hold; its own oldest idle entries make room first"},
    {"max-tensor-elements", OPT_COUNT,
     offsetof(cgs_config, max_tensor_elements), "1073741824", 1,
     UINT64_C(1) << 48, "largest element count of any input or output tensor"},
    {"max-request-flops", OPT_FLOPS, offsetof(cgs_config, max_request_flops),
     "100G", 0, UINT64_MAX,
     "most work one request may ask for, in flops (2 x multiply-adds of the "
     "direct convolution), checked before its tensors are uploaded; more is "
     "refused with RESOURCE_EXHAUSTED. 0 = no limit"},
    /* The service limits on spatial attributes (cg/limits.h, whose
     * limits.c says why each default is far above real networks and each
     * bound keeps oneDNN's kernels inside their arithmetic). */
    {"max-stride", OPT_COUNT, offsetof(cgs_config, max_stride),
     STR(CG_LIMIT_STRIDE_DEFAULT), 1, CG_LIMIT_STRIDE_MAX,
     "largest value of strides; larger is refused with INVALID_ARGUMENT"},
    {"max-dilation", OPT_COUNT, offsetof(cgs_config, max_dilation),
     STR(CG_LIMIT_DILATION_DEFAULT), 1, CG_LIMIT_DILATION_MAX,
     "largest value of dilations (1 = none)"},
    {"max-pad", OPT_COUNT, offsetof(cgs_config, max_pad),
     STR(CG_LIMIT_PAD_DEFAULT), 0, CG_LIMIT_PAD_MAX,
     "largest value of pads_begin and pads_end, given or from auto_pad"},
    {"max-output-padding", OPT_COUNT, offsetof(cgs_config, max_output_padding),
     STR(CG_LIMIT_OUTPUT_PADDING_DEFAULT), 0, CG_LIMIT_OUTPUT_PADDING_MAX,
     "largest value of output_padding (ConvTranspose ops)"},
    {"max-effective-extent", OPT_COUNT,
     offsetof(cgs_config, max_effective_extent),
     STR(CG_LIMIT_EFFECTIVE_EXTENT_DEFAULT), 1, CG_LIMIT_EFFECTIVE_EXTENT_MAX,
     "largest reach of a kernel along an axis, (K-1) x dilation + 1"},
    {"max-padded-extent", OPT_COUNT, offsetof(cgs_config, max_padded_extent),
     STR(CG_LIMIT_PADDED_EXTENT_DEFAULT), 1, CG_LIMIT_PADDED_EXTENT_MAX,
     "largest padded extent along an axis: the Convolution input or the "
     "ConvTranspose output plus pads_begin and pads_end"},
    {"max-inflight-bytes", OPT_SIZE, offsetof(cgs_config, max_inflight_bytes),
     "0", 0, 1024 * TIB,
     "input + output bytes all admitted requests may hold at once; "
     "0 = half of physical memory"},
    {"chunk-bytes", OPT_SIZE, offsetof(cgs_config, chunk_bytes), "1M", 1 * KIB,
     3 * MIB, "default size of response data chunks"},
    {"stream-window", OPT_SIZE, offsetof(cgs_config, stream_window_bytes), "4M",
     64 * KIB, 1 * GIB,
     "HTTP/2 receive window of each stream: how far a client may upload "
     "ahead of the server's reads (more: faster uploads, more buffered "
     "bytes per stream)"},
    {"grace", OPT_MS, offsetof(cgs_config, grace_ms), "30", 0, 3600ull * 1000,
     "seconds in-flight requests may take to finish after SIGTERM/SIGINT"},
    {"idle-timeout", OPT_MS, offsetof(cgs_config, idle_timeout_ms), "30", 0,
     3600ull * 1000,
     "seconds a call may go without progress while its request arrives or "
     "its result streams; then DEADLINE_EXCEEDED frees what it holds. "
     "0 = no limit"},
    {"keep-warm", OPT_MS, offsetof(cgs_config, keep_warm_ms), "30", 0,
     3600ull * 1000,
     "seconds an idle server (no Compute call live or ended) keeps the "
     "memory its calls used (tensor buffers, free heap) before handing it "
     "back to the system at the next 2 s tick (and a worker its engine's "
     "buffers as long after its last job, 1 s at least); a trainer back "
     "within this finds its pages mapped instead of faulting them in "
     "again. 0 = at the first quiet tick"},
    {"max-calls-per-peer", OPT_UINT, offsetof(cgs_config, max_calls_per_peer),
     "0", 0, 1000000,
     "Compute calls one client address may have still sending their "
     "request (from the stream's start to the last input byte; calls "
     "waiting for a worker or answered do not count); more are refused with "
     "RESOURCE_EXHAUSTED and retry-after-ms. 0 = half of --workers + "
     "--queue-depth, so stalled uploads cannot take every place"},
    {"min-upload-rate", OPT_SIZE, offsetof(cgs_config, min_upload_rate), "64K",
     0, 1 * TIB,
     "bytes per second a request's upload must average over each "
     "--idle-timeout window, else DEADLINE_EXCEEDED: a trickle is not "
     "progress. 0 = no minimum"},
    {"max-streams-per-connection", OPT_UINT,
     offsetof(cgs_config, max_streams_per_connection), "256", 1, 1000000,
     "concurrent HTTP/2 streams (calls) one connection may open"},
    {"peer-log-rate", OPT_UINT, offsetof(cgs_config, peer_log_rate), "10", 0,
     1000000,
     "log lines a second one client address's failed calls may write, in "
     "bursts of 4 seconds' worth; the rest are counted in one line per "
     "address every 2 s. 0 = no limit"},
    {"log-level", OPT_LEVEL, offsetof(cgs_config, log_level), "info", 0, 3,
     "error, warn, info or debug"},
    {"check-rate", OPT_RATE, offsetof(cgs_config, check_rate_ppm),
     CGS_CHECK_RATE_DEFAULT, 0, 1000000,
     "fraction of calls whose results are checked by the adjoint identity "
     "before they are answered (proto/SEMANTICS.md \"Result checks\"); a "
     "failed check is recomputed on another implementation, else "
     "DATA_LOSS. 0 = only the first runs below"},
    {"check-first-runs", OPT_UINT, offsetof(cgs_config, check_first_runs), "3",
     0, 1000000,
     "outputs whose primitives have run at most this many times on their "
     "worker (a shape, thread count or implementation new to it) are "
     "checked whatever --check-rate says"},
    {"check-quarantine", OPT_UINT, offsetof(cgs_config, check_quarantine), "3",
     0, 64,
     "failed result checks within --check-window after which the replica "
     "reports NOT_SERVING in the health service (and checks every call) "
     "until restarted. 0 = never"},
    {"check-window", OPT_MS, offsetof(cgs_config, check_window_ms), "600", 1,
     30ull * 86400 * 1000, "seconds of the --check-quarantine window"},
};
#define OPT_COUNT_ALL (sizeof opt_table / sizeof opt_table[0])

static const opt_def *opt_find(const char *name) {
  for (size_t i = 0; i < OPT_COUNT_ALL; i++)
    if (strcmp(opt_table[i].name, name) == 0)
      return &opt_table[i];
  return NULL;
}

/* "CONVGRAD_MAX_REQUEST_BYTES" for "max-request-bytes". */
static void env_name(const opt_def *o, char *buf, size_t len) {
  size_t n = (size_t)snprintf(buf, len, "CONVGRAD_");
  for (const char *p = o->name; *p && n + 1 < len; p++)
    buf[n++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
  buf[n] = '\0';
}

/* unit: 0 for a plain number, else the K multiplier (1024 or 1000). */
static int parse_u64(const char *s, uint64_t unit, uint64_t *out) {
  if (!isdigit((unsigned char)*s))
    return -1;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno)
    return -1;
  uint64_t mul = 1;
  if (unit && *end) {
    const char *p = strchr("KMGT", toupper((unsigned char)*end));
    if (!p || !*p)
      return -1;
    for (const char *q = "KMGT"; q <= p; q++)
      mul *= unit;
    end++;
    if (unit == KIB && (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0))
      end += strlen(end);
  }
  if (*end)
    return -1;
  if (__builtin_mul_overflow((uint64_t)v, mul, out))
    return -1;
  return 0;
}

/* Seconds with up to 3 decimals ("2.5") into milliseconds. A positive
 * value under half a millisecond is refused: rounded to 0 it would mean
 * "no limit" for some options. */
static int parse_ms(const char *s, uint64_t *out) {
  if (!isdigit((unsigned char)*s))
    return -1;
  errno = 0;
  char *end;
  double v = strtod(s, &end);
  if (errno || *end || v < 0 || v > 1e12)
    return -1;
  *out = (uint64_t)(v * 1000.0 + 0.5);
  return v > 0 && *out == 0 ? -1 : 0;
}

/* "0,2,4-7" into *l. */
static int parse_cpus(cgs_cpu_list *l, const char *s, const opt_def *o) {
  unsigned n = 0;
  const char *p = s;
  while (*p) {
    char *end;
    if (!isdigit((unsigned char)*p))
      return -1;
    unsigned long lo = strtoul(p, &end, 10), hi = lo;
    if (*end == '-') {
      if (!isdigit((unsigned char)end[1]))
        return -1;
      hi = strtoul(end + 1, &end, 10);
    }
    if (hi < lo || hi > o->max)
      return -1;
    for (unsigned long cpu = lo; cpu <= hi; cpu++) {
      if (n == CGS_MAX_CPUS)
        return -1;
      l->cpu[n++] = (int)cpu;
    }
    if (*end == ',' && end[1])
      end++;
    else if (*end)
      return -1;
    p = end;
  }
  l->n = n;
  return 0;
}

static int opt_apply(cgs_config *c, const opt_def *o, const char *value,
                     const char *origin, char *err, size_t errlen) {
  char *field = (char *)c + o->offset;
  uint64_t v = 0;
  int rc = 0;
  switch (o->type) {
  case OPT_STRING:
    if (strlen(value) >= CGS_CONFIG_STR) {
      snprintf(err, errlen, "%s: value too long", origin);
      return -1;
    }
    memcpy(field, value, strlen(value) + 1);
    return 0;
  case OPT_CPUS:
    if (parse_cpus((cgs_cpu_list *)(void *)field, value, o) != 0) {
      snprintf(err, errlen,
               "%s: expected a list like 0,1 or 0-3 of cores 0..%llu, got "
               "'%s'",
               origin, (unsigned long long)o->max, value);
      return -1;
    }
    return 0;
  case OPT_LEVEL: {
    cgs_log_level lv;
    if (cgs_log_level_parse(value, &lv) != 0) {
      snprintf(err, errlen, "%s: expected error, warn, info or debug, got '%s'",
               origin, value);
      return -1;
    }
    *(cgs_log_level *)(void *)field = lv;
    return 0;
  }
  case OPT_POLICY: {
    cgs_threads_policy tp = !*value                      ? CGS_THREADS_AUTO
                            : !strcmp(value, "adaptive") ? CGS_THREADS_ADAPTIVE
                            : !strcmp(value, "static")   ? CGS_THREADS_STATIC
                                                       : (cgs_threads_policy)-1;
    if (tp == (cgs_threads_policy)-1) {
      snprintf(err, errlen, "%s: expected adaptive or static, got '%s'", origin,
               value);
      return -1;
    }
    *(cgs_threads_policy *)(void *)field = tp;
    return 0;
  }
  case OPT_SHM:
    for (int sp = CGS_SHM_OFF; sp <= CGS_SHM_ON; sp++)
      if (strcmp(value, cgs_shm_policy_name((cgs_shm_policy)sp)) == 0) {
        *(cgs_shm_policy *)(void *)field = (cgs_shm_policy)sp;
        return 0;
      }
    snprintf(err, errlen, "%s: expected local, on or off, got '%s'", origin,
             value);
    return -1;
  case OPT_MS:
    rc = parse_ms(value, &v);
    break;
  case OPT_SIZE:
    rc = parse_u64(value, KIB, &v);
    break;
  case OPT_FLOPS:
    rc = parse_u64(value, 1000, &v);
    break;
  case OPT_UINT:
  case OPT_COUNT:
    rc = parse_u64(value, 0, &v);
    break;
  case OPT_RATE: {
    char *end;
    errno = 0;
    double f = strtod(value, &end);
    if (!isdigit((unsigned char)*value) || *end || errno || !(f >= 0) ||
        f > 1) {
      snprintf(err, errlen, "%s: expected a fraction in [0, 1], got '%s'",
               origin, value);
      return -1;
    }
    v = (uint64_t)(f * 1e6 + 0.5);
    break;
  }
  case OPT_MODE: {
    char *end;
    errno = 0;
    v = strtoull(value, &end, 8);
    rc = !*value || *end || errno ? -1 : 0;
    break;
  }
  case OPT_FLAG:
    if (strcmp(value, "1") == 0 || strcasecmp(value, "true") == 0 ||
        strcasecmp(value, "yes") == 0) {
      v = 1;
    } else if (!(strcmp(value, "0") == 0 || strcasecmp(value, "false") == 0 ||
                 strcasecmp(value, "no") == 0)) {
      snprintf(err, errlen, "%s: expected 1/0, true/false or yes/no, got '%s'",
               origin, value);
      return -1;
    }
    break;
  }
  if (rc != 0 || v < o->min || v > o->max) {
    if (o->type == OPT_MS)
      snprintf(err, errlen, "%s: expected %sseconds in [%g, %g], got '%s'",
               origin, o->min ? "" : "0 or ",
               o->min ? (double)o->min / 1000.0 : 0.001,
               (double)o->max / 1000.0, value);
    else if (o->type == OPT_MODE)
      snprintf(err, errlen,
               "%s: expected an octal file mode 0 .. 0%llo, got "
               "'%s'",
               origin, (unsigned long long)o->max, value);
    else
      snprintf(err, errlen, "%s: expected a number in [%llu, %llu]%s, got '%s'",
               origin, (unsigned long long)o->min, (unsigned long long)o->max,
               o->type == OPT_SIZE || o->type == OPT_FLOPS
                   ? " (K/M/G/T suffixes allowed)"
                   : "",
               value);
    return -1;
  }
  if (o->type == OPT_UINT || o->type == OPT_MODE || o->type == OPT_FLAG)
    *(unsigned *)(void *)field = (unsigned)v;
  else
    *(uint64_t *)(void *)field = v;
  return 0;
}

int cgs_config_set(cgs_config *c, const char *name, const char *value,
                   char *err, size_t errlen) {
  const opt_def *o = opt_find(name);
  if (!o) {
    snprintf(err, errlen, "unknown option '%s'", name);
    return -1;
  }
  char origin[64];
  snprintf(origin, sizeof origin, "--%s", name);
  return opt_apply(c, o, value, origin, err, errlen);
}

int cgs_config_defaults(cgs_config *c, char *err, size_t errlen) {
  memset(c, 0, sizeof *c);
  for (size_t i = 0; i < OPT_COUNT_ALL; i++)
    if (opt_apply(c, &opt_table[i], opt_table[i].def, opt_table[i].name, err,
                  errlen) != 0)
      return -1;
  return 0;
}

int cgs_config_load(cgs_config *c, int argc, char **argv, FILE *out, char *err,
                    size_t errlen) {
  /* Flags first, so that --help works and a flag overrides a variable
   * even when the variable would not parse. */
  const char *flag_value[OPT_COUNT_ALL] = {0};
  struct option longopts[OPT_COUNT_ALL + 3];
  for (size_t i = 0; i < OPT_COUNT_ALL; i++)
    longopts[i] = (struct option){
        opt_table[i].name,
        opt_table[i].type == OPT_FLAG ? no_argument : required_argument, NULL,
        (int)(256 + i)};
  longopts[OPT_COUNT_ALL] = (struct option){"help", no_argument, NULL, 'h'};
  longopts[OPT_COUNT_ALL + 1] =
      (struct option){"version", no_argument, NULL, 'V'};
  longopts[OPT_COUNT_ALL + 2] = (struct option){NULL, 0, NULL, 0};
  optind = 1;
  opterr = 0;
  int ch;
  while ((ch = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    if (ch == 'h') {
      cgs_config_usage(out, argv[0]);
      return 1;
    }
    if (ch == 'V')
      return CGS_CONFIG_VERSION;
    if (ch == '?' || ch == ':') {
      snprintf(err, errlen, "%s: '%s' (try --help)",
               ch == ':' ? "missing value for option" : "unknown option",
               argv[optind - 1]);
      return -1;
    }
    flag_value[ch - 256] = optarg ? optarg : "1";
  }
  if (optind < argc) {
    snprintf(err, errlen, "unexpected argument '%s' (try --help)",
             argv[optind]);
    return -1;
  }
  for (size_t i = 0; i < OPT_COUNT_ALL; i++) {
    char origin[64];
    const char *value = flag_value[i];
    if (value) {
      snprintf(origin, sizeof origin, "--%s", opt_table[i].name);
    } else {
      env_name(&opt_table[i], origin, sizeof origin);
      value = getenv(origin);
    }
    if (value && opt_apply(c, &opt_table[i], value, origin, err, errlen) != 0)
      return -1;
  }
  return 0;
}

/* The limit in the file dir/name, or UINT64_MAX when it says none. */
static uint64_t read_limit(const char *dir, const char *name) {
  char path[4200], buf[64];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "r");
  if (!f)
    return UINT64_MAX;
  uint64_t v = UINT64_MAX;
  if (fgets(buf, sizeof buf, f) && isdigit((unsigned char)buf[0])) {
    errno = 0;
    unsigned long long n = strtoull(buf, NULL, 10);
    /* cgroup v1 writes "no limit" as about 2^63. */
    if (errno == 0 && n < (1ull << 60))
      v = n;
  }
  fclose(f);
  return v;
}

/* The smallest limit of name in dir/path and every ancestor up to dir. */
static uint64_t limit_up_the_tree(const char *dir, const char *path,
                                  const char *name) {
  char p[4096];
  snprintf(p, sizeof p, "%s%s", dir, path);
  size_t root_len = strlen(dir);
  uint64_t best = UINT64_MAX;
  for (;;) {
    uint64_t v = read_limit(p, name);
    if (v < best)
      best = v;
    char *slash = strrchr(p, '/');
    if (!slash || (size_t)(slash - p) < root_len)
      break;
    *slash = '\0';
  }
  return best;
}

uint64_t cgs_config_cgroup_memory(const char *root, const char *self) {
  FILE *f = fopen(self, "r");
  if (!f)
    return 0;
  char line[4096];
  uint64_t best = UINT64_MAX;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    char *ctrl = strchr(line, ':');
    char *path = ctrl ? strchr(ctrl + 1, ':') : NULL;
    if (!path)
      continue;
    *path++ = '\0';
    *ctrl++ = '\0';
    char dir[4096];
    uint64_t v = UINT64_MAX;
    if (strcmp(line, "0") == 0 && *ctrl == '\0') {
      v = limit_up_the_tree(root, strcmp(path, "/") ? path : "", "memory.max");
    } else if (strstr(ctrl, "memory")) {
      snprintf(dir, sizeof dir, "%s/memory", root);
      v = limit_up_the_tree(dir, strcmp(path, "/") ? path : "",
                            "memory.limit_in_bytes");
    }
    if (v < best)
      best = v;
  }
  fclose(f);
  return best == UINT64_MAX ? 0 : best;
}

uint64_t cgs_config_store_peer_bytes(const cgs_config *c) {
  return c->store_bytes / 100 * c->store_peer_pct; /* at most 64 TiB */
}

int cgs_config_finish(cgs_config *c, char *err, size_t errlen) {
  cgs_listeners ls;
  if (cgs_listen_parse(c->listen, &ls, err, errlen) != 0)
    return -1;
  if (c->shm_prefix[0] && !cg_text_plain_name(c->shm_prefix, 64)) {
    snprintf(err, errlen,
             "--shm-prefix: expected '' or 1 to 64 of A-Z a-z 0-9 . _ - (not "
             "only dots), got '%s'",
             c->shm_prefix);
    return -1;
  }
  if (!c->tls_cert[0] != !c->tls_key[0]) {
    snprintf(err, errlen, "--tls-cert and --tls-key go together");
    return -1;
  }
  if (c->tls_client_ca[0] && !c->tls_cert[0]) {
    snprintf(err, errlen,
             "--tls-client-ca needs --tls-cert and --tls-key: client "
             "certificates are checked over TLS");
    return -1;
  }
  if (c->cpus.n == 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
      snprintf(err, errlen, "--cpus: cannot read this process's CPU set");
      return -1;
    }
    for (int cpu = 0; cpu < CPU_SETSIZE && c->cpus.n < CGS_MAX_CPUS; cpu++)
      if (CPU_ISSET(cpu, &set))
        c->cpus.cpu[c->cpus.n++] = cpu;
  }
  if (c->threads_policy == CGS_THREADS_AUTO)
    c->threads_policy = c->workers || c->threads_per_worker
                            ? CGS_THREADS_STATIC
                            : CGS_THREADS_ADAPTIVE;
  if (c->threads_per_worker == 0)
    c->threads_per_worker = 1;
  if (c->workers == 0) {
    c->workers = c->cpus.n / c->threads_per_worker;
    if (c->workers == 0)
      c->workers = 1;
  }
  if (c->max_calls_per_peer == 0) {
    c->max_calls_per_peer = (c->workers + c->queue_depth) / 2;
    if (c->max_calls_per_peer == 0)
      c->max_calls_per_peer = 1;
  }
  if (c->max_inflight_bytes == 0) {
    /* In a container the limit that matters is the cgroup's, not the
     * host's RAM. */
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t mem =
        pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 8 * GIB;
    uint64_t cg =
        cgs_config_cgroup_memory("/sys/fs/cgroup", "/proc/self/cgroup");
    if (cg && cg < mem)
      mem = cg;
    c->max_inflight_bytes = mem / 2 ? mem / 2 : 1;
  }
  /* A request larger than the whole in-flight budget could never be
   * admitted; cap it so small machines start with the defaults. */
  if (c->max_request_bytes > c->max_inflight_bytes) {
    cgs_warn("max-request-bytes %llu capped to max-inflight-bytes %llu",
             (unsigned long long)c->max_request_bytes,
             (unsigned long long)c->max_inflight_bytes);
    c->max_request_bytes = c->max_inflight_bytes;
  }
  return 0;
}

const char *cgs_threads_policy_name(cgs_threads_policy tp) {
  return tp == CGS_THREADS_ADAPTIVE ? "adaptive"
         : tp == CGS_THREADS_STATIC ? "static"
                                    : "auto";
}

const char *cgs_shm_policy_name(cgs_shm_policy sp) {
  return sp == CGS_SHM_LOCAL ? "local" : sp == CGS_SHM_ON ? "on" : "off";
}

void cgs_config_format_cpus(const cgs_cpu_list *l, char *buf, size_t len) {
  cg_text t;
  cg_text_init(&t, buf, len);
  if (!l->n)
    cg_text_append(&t, "any", 3);
  for (unsigned i = 0; i < l->n; i++)
    cg_text_appendf(&t, "%s%d", i ? "," : "", l->cpu[i]);
}

void cgs_config_usage(FILE *out, const char *argv0) {
  fprintf(out,
          "Usage: %s [options]\n"
          "convgrad-server: convolution gradients over gRPC "
          "(convgrad.v1.ConvGrad, grpc.health.v1.Health).\n"
          "Every option can also be set with the environment variable shown; "
          "flags win.\n\n",
          argv0);
  for (size_t i = 0; i < OPT_COUNT_ALL; i++) {
    const opt_def *o = &opt_table[i];
    char var[64];
    env_name(o, var, sizeof var);
    fprintf(out, "  --%s%s   (%s, default '%s')\n      %s\n", o->name,
            o->type == OPT_FLAG ? "" : " VALUE", var, o->def, o->help);
    if (o->type == OPT_UINT || o->type == OPT_COUNT || o->type == OPT_SIZE ||
        o->type == OPT_FLOPS)
      fprintf(out, "      bounds: %llu .. %llu%s\n", (unsigned long long)o->min,
              (unsigned long long)o->max,
              o->type == OPT_SIZE    ? " bytes (suffixes K, M, G, T = 2^10..)"
              : o->type == OPT_FLOPS ? " (suffixes K, M, G, T = 10^3..)"
                                     : "");
    else if (o->type == OPT_MS)
      fprintf(out, "      bounds: %g .. %g seconds\n", (double)o->min / 1000.0,
              (double)o->max / 1000.0);
    else if (o->type == OPT_RATE)
      fprintf(out, "      bounds: 0 .. 1\n");
  }
  fprintf(out, "  -h, --help\n      print this help and exit\n"
               "  --version\n      print the versions of the server, oneDNN "
               "(with the ISA it dispatches to here) and gRPC, and exit\n\n"
               "On start the server prints one line to stdout:\n"
               "  convgrad-server ready listen=HOST:PORT [unix=PATH...] "
               "workers=N threads_per_worker=T threads_policy=POLICY "
               "cpus=LIST io_cpus=LIST isa=ISA onednn=VERSION\n"
               "(listen= names the first TCP address, \"-\" when there is "
               "none; unix= each unix socket).\n");
}
