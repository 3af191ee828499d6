/* server.c - owns the grpc server's life cycle: start, the method table
 * and its call requests, drain, the grace period, housekeeping and
 * teardown. */
#include "cgs_server.h"

#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/compression.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>

#include "cg/error.h"
#include "cgs_buf.h"
#include "cgs_call.h"
#include "cgs_health.h"
#include "cgs_info.h"
#include "cgs_log.h"
#include "cgs_peers.h"
#include "cgs_shm.h"
#include "cgw_tls.h"

/* Period of the peer sweep and the heap trim. */
#define HOUSEKEEPING_MS 2000
/* Period at which the Compute calls' timeouts are looked at: they are
 * seconds long (--idle-timeout), and gRPC itself ends a call at its
 * deadline. */
#define CALLS_TICK_MS 100

/* Every method served; any other path is answered UNIMPLEMENTED. */
static const cgs_method_def *const method_table[] = {
    &cgs_call_method,         &cgs_info_method,
    &cgs_health_check_method, &cgs_health_watch_method,
    &cgs_shm_register_method, &cgs_shm_unregister_method,
    &cgs_shm_list_method,     &cgs_stage_method};
#define N_METHODS (sizeof method_table / sizeof method_table[0])
_Static_assert(N_METHODS <= CGS_METHODS_MAX, "CGS_METHODS_MAX too small");

/* Requests kept posted for unknown methods. */
#define UNKNOWN_SLOTS 2

/* ---- call requests --------------------------------------------------- */

typedef struct slot {
  cgs_tag tag;
  cgs_server *s;
  size_t m; /* index in method_table; N_METHODS: an unknown method */
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array md;
  grpc_byte_buffer *payload;
  grpc_call_details details; /* unknown methods only */
} slot;

static void on_slot(cgs_tag *t, int ok);

static int request_slot(cgs_server *s, size_t m) {
  slot *sl = calloc(1, sizeof *sl);
  if (!sl) {
    cgs_error("out of memory posting a call request");
    return CG_ENOMEM;
  }
  sl->tag.cb = on_slot;
  sl->tag.on_cq = m < N_METHODS && method_table[m]->on_cq;
  sl->s = s;
  sl->m = m;
  grpc_metadata_array_init(&sl->md);
  grpc_call_details_init(&sl->details);
  grpc_call_error e;
  cgs_cq_release(&sl->tag);
  if (m == N_METHODS)
    e = grpc_server_request_call(s->grpc, &sl->call, &sl->details, &sl->md,
                                 s->cq.q, s->cq.q, &sl->tag);
  else
    e = grpc_server_request_registered_call(
        s->grpc, s->methods[m], &sl->call, &sl->deadline, &sl->md,
        method_table[m]->reads_first ? &sl->payload : NULL, s->cq.q, s->cq.q,
        &sl->tag);
  if (e != GRPC_CALL_OK) {
    cgs_error("requesting a call: %s", grpc_call_error_to_string(e));
    grpc_metadata_array_destroy(&sl->md);
    grpc_call_details_destroy(&sl->details);
    free(sl);
    return CG_EINTERNAL;
  }
  return 0;
}

static void answer_unknown(cgs_server *s, slot *sl) {
  char msg[300];
  char *method = grpc_slice_to_c_string(sl->details.method);
  char *peer = grpc_call_get_peer(sl->call);
  snprintf(msg, sizeof msg, "unknown method %s", method);
  uint64_t now = uv_hrtime();
  if (cgs_peers_log_allowed_for(s->peers, peer, now, s->cfg->peer_log_rate)) {
    char logged[300], from[128];
    cgs_log_value(logged, sizeof logged, method);
    cgs_log_value(from, sizeof from, peer);
    cgs_info("unary method=%s peer=%s status=UNIMPLEMENTED", logged, from);
  }
  gpr_free(peer);
  gpr_free(method);
  cgs_cq_reply(&s->cq, sl->call, NULL, GRPC_STATUS_UNIMPLEMENTED, msg);
}

/* With --auth-tokens: 0 with the caller's label in client[cap] (else "")
 * when the call may go on, else -1 after answering it UNAUTHENTICATED
 * (logged, rate-limited by peer, and counted as a Compute call when it is
 * one). */
static int authenticate(cgs_server *s, slot *sl, char *client, size_t cap) {
  const cgs_method_def *d = method_table[sl->m];
  client[0] = '\0';
  if (!d->needs_token && !s->cfg->auth_health)
    return 0;
  const char *label = NULL;
  cgs_auth_result r = CGS_AUTH_OK;
  pthread_mutex_lock(&s->auth_mu);
  if (s->auth) {
    r = cgs_auth_check(s->auth, &sl->md, &label);
    if (r == CGS_AUTH_OK)
      snprintf(client, cap, "%s", label);
  }
  pthread_mutex_unlock(&s->auth_mu);
  if (r == CGS_AUTH_OK)
    return 0;
  const char *msg = r == CGS_AUTH_MISSING
                        ? "authorization: this server needs "
                          "'authorization: Bearer TOKEN' metadata"
                        : "authorization: unknown token";
  char *peer = grpc_call_get_peer(sl->call);
  uint64_t now = uv_hrtime();
  if (cgs_peers_log_allowed_for(s->peers, peer, now, s->cfg->peer_log_rate)) {
    char from[128];
    cgs_log_value(from, sizeof from, peer);
    cgs_info("call method=%s peer=%s status=UNAUTHENTICATED msg=\"%s\"",
             d->path, from, msg);
  }
  gpr_free(peer);
  if (d == &cgs_call_method) {
    cgs_metrics_call m = {.code = GRPC_STATUS_UNAUTHENTICATED};
    cgs_metrics_call_ended(s->metrics, &m);
  }
  if (sl->payload)
    grpc_byte_buffer_destroy(sl->payload);
  cgs_cq_reply(&s->cq, sl->call, NULL, GRPC_STATUS_UNAUTHENTICATED, msg);
  return -1;
}

static void on_slot(cgs_tag *t, int ok) {
  slot *sl = cgs_container_of(t, slot, tag);
  cgs_server *s = sl->s;
  char client[CGS_AUTH_LABEL_MAX];
  if (ok) {
    /* Draining keeps taking calls (to refuse them with UNAVAILABLE) until
     * the listener closes. */
    if (!atomic_load(&s->stopped_accepting))
      request_slot(s, sl->m);
    if (sl->m == N_METHODS)
      answer_unknown(s, sl);
    else if (authenticate(s, sl, client, sizeof client) == 0)
      method_table[sl->m]->start(s, sl->call, sl->deadline, sl->payload,
                                 client[0] ? client : NULL, &sl->md);
  }
  /* !ok: the server is shutting down and the request was withdrawn. */
  grpc_metadata_array_destroy(&sl->md);
  grpc_call_details_destroy(&sl->details);
  free(sl);
}

/* ---- shutdown -------------------------------------------------------- */

/* Closes the listener and asks grpc to report when every call is over.
 * Deferred while compute calls are in flight: until then the server
 * answers new calls UNAVAILABLE itself, whereas grpc ends a call that
 * arrives as it shuts down with CANCELLED, which a client cannot tell
 * from its own cancellation and does not retry. */
static void stop_accepting(cgs_server *s) {
  if (atomic_load(&s->stopped_accepting))
    return;
  atomic_store(&s->stopped_accepting, 1);
  cgs_cq_release(&s->shutdown_tag);
  grpc_server_shutdown_and_notify(s->grpc, s->cq.q, &s->shutdown_tag);
}

static void maybe_finish_drain(cgs_server *s) {
  /* Watch streams would hold the server open forever: end them once the
   * real work is done. */
  if (s->draining && cgs_calls_live(&s->calls) == 0 && !s->torn_down) {
    cgs_health_end_watches(s->health);
    stop_accepting(s);
  }
}

/* The last Compute call of a draining server is over. */
static void on_calls_idle(cgs_calls *cs) {
  maybe_finish_drain(cgs_container_of(cs, cgs_server, calls));
}

static void report_suppressed(const cgs_peer *e) {
  char addr[128];
  cgs_log_value(addr, sizeof addr, e->addr);
  cgs_warn("peer=%s: %" PRIu64 " failed calls not logged "
           "(--peer-log-rate)",
           addr, e->suppressed);
}

/* Every HOUSEKEEPING_MS: reports and forgets idle peers, unregisters
 * regions left idle (--region-idle-timeout), and once no Compute call has
 * been live or ended for --keep-warm, hands the tensor-buffer cache and
 * the heap's free memory back to the system (at each quiet tick from
 * then on, as the store's expiries free more). The allocator keeps up to
 * M_TRIM_THRESHOLD (main.c) otherwise, so a burst of calls (honest or
 * not) would leave the process at its peak; what it keeps meanwhile, the
 * limits admitted (--max-inflight-bytes). Every page handed back is
 * faulted in again by the next call that needs it, 10-60 us each on a
 * VM: a trim at each tick that fell between two of a trainer's calls cost
 * 2-5x the completion-queue thread's CPU per MiB received (bench_wire
 * --gap-ms 100), and one after a 6 s pause made a ResNet-18 step's
 * compute 1.6x (530-620 ms against 330-360 ms over regions, whose
 * kernels' buffers come from the heap). */
static void give_back_when_idle(cgs_server *s) {
  uint64_t now = uv_now(s->loop);
  uint64_t over = cgs_calls_ended(&s->calls);
  if (over != s->calls_ended_at_tick || cgs_calls_live(&s->calls) != 0) {
    s->calls_ended_at_tick = over;
    s->busy_at_ms = now;
    s->gave_back = 0;
    return;
  }
  /* A warmed server keeps what warm-up left (tensor buffers cached, the
   * heap's pages) until a job has run: the first call's. */
  if (s->warmup.n && cgs_pool_mean_run_ms(s->pool) == 0)
    return;
  if (now - s->busy_at_ms < s->cfg->keep_warm_ms)
    return;
  uint64_t rss = s->gave_back ? 0 : cgs_metrics_rss_bytes();
  cgs_buf_drain();
  malloc_trim(0);
  if (!s->gave_back)
    cgs_info("idle for %.0f s: memory handed back to the system, RSS %.0f "
             "-> %.0f MiB (--keep-warm)",
             (double)(now - s->busy_at_ms) / 1e3, (double)rss / 1048576.0,
             (double)cgs_metrics_rss_bytes() / 1048576.0);
  s->gave_back = 1;
}

static void on_housekeeping(uv_timer_t *h) {
  cgs_server *s = h->data;
  cgs_checks_counters cc;
  char why[512];
  cgs_checks_read(cgs_pool_checks(s->pool), &cc, why, sizeof why);
  cgs_health_set_quarantined(s->health, cc.quarantined, why);
  cgs_peers_sweep(s->peers, uv_hrtime(), report_suppressed);
  cgs_shm_sweep(s);
  if (s->store)
    cgs_store_expire(s->store, cgs_store_now_ms());
  give_back_when_idle(s);
}

static void on_calls_timer(uv_timer_t *h) {
  cgs_call_sweep(h->data);
}

static void on_grace_timer(uv_timer_t *h) {
  cgs_server *s = h->data;
  s->grace_expired = 1;
  cgs_warn("grace period over: cancelling %u in-flight calls",
           cgs_calls_live(&s->calls));
  stop_accepting(s); /* grpc cancels all calls only after a shutdown */
  /* Ours first, so that each call ends with our UNAVAILABLE and its
   * message rather than grpc's generic cancel. */
  cgs_call_cancel_all(s);
  grpc_server_cancel_all_calls(s->grpc);
  cgs_health_end_watches(s->health);
}

static void on_shutdown_notified(cgs_tag *t, int ok) {
  cgs_server *s = cgs_container_of(t, cgs_server, shutdown_tag);
  (void)ok;
  cgs_info("all calls finished; stopping");
  uv_timer_stop(&s->grace_timer);
  cgs_cq_shutdown(&s->cq);
}

void cgs_server_close(cgs_server *s) {
  cgs_regions_free(s->regions);
  s->regions = NULL;
  cgs_store_free(s->store);
  s->store = NULL;
  cgs_peers_free(s->peers);
  s->peers = NULL;
  cgs_metrics_free(s->metrics);
  s->metrics = NULL;
  cgs_auth_free(s->auth);
  s->auth = NULL;
  pthread_mutex_destroy(&s->auth_mu);
  cgs_listen_remove(&s->listeners);
  cgs_warmup_free(&s->warmup);
}

void cgs_server_drain(cgs_server *s) {
  if (s->draining) {
    /* A second signal: do not wait for the grace period. */
    if (!s->grace_expired && !s->torn_down)
      uv_timer_start(&s->grace_timer, on_grace_timer, 0, 0);
    return;
  }
  s->draining = 1;
  cgs_calls_drain(&s->calls);
  cgs_info("draining: %u compute calls and %u other calls in flight, grace "
           "%.1f s",
           cgs_calls_live(&s->calls),
           atomic_load(&s->cq.replies) + cgs_health_watchers(s->health),
           (double)s->cfg->grace_ms / 1000.0);
  cgs_health_set_serving(s->health, 0);
  uv_timer_start(&s->grace_timer, on_grace_timer, s->cfg->grace_ms, 0);
  maybe_finish_drain(s);
}

static void on_handle_closed(uv_handle_t *h) {
  (void)h;
}

static void on_last_closed(uv_handle_t *h) {
  cgs_server *s = cgs_container_of(h, cgs_server, cq.async);
  if (s->on_stopped)
    s->on_stopped(s);
}

/* After the cq thread saw GRPC_QUEUE_SHUTDOWN: no grpc event can arrive
 * any more. */
static void teardown(cgs_cq *cq) {
  cgs_server *s = cgs_container_of(cq, cgs_server, cq);
  s->torn_down = 1;
  /* Every grpc operation has completed: calls still around (a deadline
   * that fired as grpc finished them) can only end now. */
  cgs_call_cancel_all(s);
  grpc_server_destroy(s->grpc);
  s->grpc = NULL;
  /* The endpoint reads the pool's load. */
  cgs_httpd_stop(s->metrics_http);
  s->metrics_http = NULL;
  /* Workers finish what they run; their jobs' calls free themselves. */
  cgs_debug("waiting for the workers to finish their current jobs");
  cgs_pool_close(s->pool);
  cgs_debug("workers stopped");
  s->pool = NULL;
  cgs_health_free(s->health);
  s->health = NULL;
  uv_close((uv_handle_t *)&s->warm_async, on_handle_closed);
  uv_close((uv_handle_t *)&s->grace_timer, on_handle_closed);
  uv_close((uv_handle_t *)&s->housekeeping_timer, on_handle_closed);
  uv_close((uv_handle_t *)&s->calls_timer, on_handle_closed);
  cgs_calls_close(&s->calls, on_handle_closed);
  cgs_cq_close(&s->cq, on_last_closed);
}

/* ---- start ----------------------------------------------------------- */

/* The last worker to warm up; any thread. */
static void on_warm(void *data) {
  cgs_server *s = data;
  uv_async_send(&s->warm_async);
}

/* The loop, once the workers are warm. */
static void on_warm_async(uv_async_t *h) {
  cgs_server *s = h->data;
  if (s->ready || s->draining)
    return;
  s->ready = 1;
  cgs_health_set_serving(s->health, 1);
  if (s->on_ready)
    s->on_ready(s);
}

/* The cq thread, idle after a tiny job ran there (cgs_cq.h). */
static void on_cq_idle(void *pool) {
  cgs_pool_cq_idle(pool);
}

/* The metrics' thread: every figure here is safe to read from it while
 * the endpoint runs (it stops before the pool closes). */
static void read_gauges(void *data, cgs_metrics_gauges *g) {
  cgs_server *s = data;
  g->inflight_bytes = atomic_load(&s->inflight_bytes);
  cgs_pool_load(s->pool, &g->queued_requests, &g->busy_workers,
                &g->inline_jobs);
  g->bulk_deferred = atomic_load(&s->cq.deferred);
  g->workers = s->cfg->workers;
  g->shm_regions = s->regions ? (unsigned)cgs_regions_count(s->regions) : 0;
  if (s->store)
    cgs_store_stats_get(s->store, &g->store);
  cgs_checks_read(cgs_pool_checks(s->pool), &g->checks, NULL, 0);
}

/* The figures always, the endpoint with --metrics-listen. */
static int start_metrics(cgs_server *s, char *err, size_t errlen) {
  if (cgs_metrics_new(&s->metrics, read_gauges, s) != 0)
    return cg_errorf(err, errlen, CG_ENOMEM, "metrics: out of memory");
  if (!s->cfg->metrics_listen[0])
    return 0;
  cgs_httpd_config hc = {.listen = s->cfg->metrics_listen,
                         .path = "/metrics",
                         .content_type = CGS_METRICS_CONTENT_TYPE,
                         .render = cgs_metrics_render,
                         .data = s->metrics};
  int rc = cgs_httpd_start(&s->metrics_http, &hc, err, errlen);
  if (rc == 0)
    s->metrics_port = cgs_httpd_port(s->metrics_http);
  return rc;
}

/* With --tls-cert, *creds becomes TLS credentials (mutual with
 * --tls-client-ca) from files checked first; else it is left as it is. */
static int tls_credentials(const cgs_config *cfg,
                           grpc_server_credentials **creds, char *err,
                           size_t errlen) {
  if (!cfg->tls_cert[0])
    return 0;
  static const char *const names[3] = {"--tls-client-ca", "--tls-cert",
                                       "--tls-key"};
  cgw_tls_files files = {cfg->tls_client_ca, cfg->tls_cert, cfg->tls_key};
  cgw_tls_pem pem;
  int rc = cgw_tls_load(&files, names, &pem, err, errlen);
  if (rc != 0)
    return rc;
  grpc_ssl_pem_key_cert_pair pair = {pem.key, pem.cert};
  /* grpc keeps copies of the PEM strings. */
  *creds = grpc_ssl_server_credentials_create_ex(
      pem.ca, &pair, 1,
      pem.ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
             : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
      NULL);
  cgw_tls_free(&pem);
  if (!*creds)
    return cg_errorf(err, errlen, CG_EINTERNAL,
                     "--tls-cert: grpc would not create TLS credentials");
  cgs_info("TLS on the TCP addresses, certificate %s%s", cfg->tls_cert,
           cfg->tls_client_ca[0] ? ", client certificates required" : "");
  return 0;
}

/* 1 when a TCP listener's host is a loopback address. */
static int loopback(const char *target) {
  const char *colon = strrchr(target, ':');
  size_t n = colon ? (size_t)(colon - target) : strlen(target);
  return (n >= 4 && strncmp(target, "127.", 4) == 0) ||
         (n == 9 && strncmp(target, "localhost", 9) == 0) ||
         (n == 5 && strncmp(target, "[::1]", 5) == 0);
}

/* --auth-tokens: loads the table, refusing a plaintext TCP address off
 * loopback unless --allow-insecure-auth (a token sent in clear there can
 * be read and replayed). */
static int load_tokens(cgs_server *s, char *err, size_t errlen) {
  const cgs_config *cfg = s->cfg;
  if (!cfg->auth_tokens[0])
    return 0;
  for (int i = 0; i < s->listeners.n; i++) {
    const cgs_listener *l = &s->listeners.l[i];
    if (!l->path && !loopback(l->target) && !cfg->tls_cert[0] &&
        !cfg->allow_insecure_auth)
      return cg_errorf(err, errlen, CG_EINVAL,
                       "--auth-tokens: %s is not loopback and has no TLS: "
                       "tokens would cross the network in clear (add "
                       "--tls-cert and --tls-key, or --allow-insecure-auth)",
                       l->target);
  }
  int rc = cgs_auth_load(&s->auth, cfg->auth_tokens, err, errlen);
  if (rc == 0)
    cgs_info("--auth-tokens: %zu tokens; health %s", cgs_auth_count(s->auth),
             cfg->auth_health ? "needs a token too" : "stays open");
  return rc;
}

void cgs_server_reload(cgs_server *s) {
  if (!s->auth) {
    cgs_info("SIGHUP: no --auth-tokens to reload");
    return;
  }
  cgs_auth *fresh;
  char err[512];
  if (cgs_auth_load(&fresh, s->cfg->auth_tokens, err, sizeof err) != 0) {
    cgs_error("SIGHUP: %s; the %zu tokens loaded before stay", err,
              cgs_auth_count(s->auth));
    return;
  }
  pthread_mutex_lock(&s->auth_mu);
  cgs_auth *old = s->auth;
  s->auth = fresh;
  pthread_mutex_unlock(&s->auth_mu);
  cgs_auth_free(old);
  cgs_info("SIGHUP: reloaded %zu tokens", cgs_auth_count(fresh));
}

/* Creates s->grpc with the channel arguments below, registers the method
 * table and binds cfg->listen. On failure s->grpc may exist: the caller
 * destroys it. */
static int create_grpc_server(cgs_server *s, char *err, size_t errlen) {
  const cgs_config *cfg = s->cfg;
  grpc_arg args[] = {
      /* Refuse to share a port with another process. */
      {.type = GRPC_ARG_INTEGER,
       .key = GRPC_ARG_ALLOW_REUSEPORT,
       .value.integer = 0},
      /* The default 64 KiB initial window makes each upload's first
       * megabytes wait for window updates until the BDP estimate catches
       * up (tests/README.md, "Design figures"). */
      {.type = GRPC_ARG_INTEGER,
       .key = GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
       .value.integer = (int)cfg->stream_window_bytes},
      /* Streams one connection may hold; each costs grpc memory before
       * any of ours is spent. */
      {.type = GRPC_ARG_INTEGER,
       .key = GRPC_ARG_MAX_CONCURRENT_STREAMS,
       .value.integer = (int)cfg->max_streams_per_connection},
      /* Identity only: grpc inflates a compressed message whole before any
       * size limit of ours applies, so 1 MB of gzip became 1 GiB of heap.
       * Tensors hardly compress; a gzip request is refused UNIMPLEMENTED
       * at its headers. */
      {.type = GRPC_ARG_INTEGER,
       .key = GRPC_COMPRESSION_CHANNEL_ENABLED_ALGORITHMS_BITSET,
       .value.integer = 1 << GRPC_COMPRESS_NONE},
      /* A connection with no call for this long is closed (clients
       * reconnect transparently), so idle sockets cannot pile up. */
      {.type = GRPC_ARG_INTEGER,
       .key = GRPC_ARG_MAX_CONNECTION_IDLE_MS,
       .value.integer = 10 * 60 * 1000},
  };
  grpc_channel_args cargs = {.num_args = sizeof args / sizeof args[0],
                             .args = args};
  s->grpc = grpc_server_create(&cargs, NULL);
  grpc_server_register_completion_queue(s->grpc, s->cq.q, NULL);
  for (size_t m = 0; m < N_METHODS; m++) {
    const cgs_method_def *d = method_table[m];
    s->methods[m] = grpc_server_register_method(
        s->grpc, d->path, NULL,
        d->reads_first ? GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER
                       : GRPC_SRM_PAYLOAD_NONE,
        0);
    if (!s->methods[m]) {
      return cg_errorf(err, errlen, CG_EINTERNAL, "cannot register %s",
                       d->path);
    }
  }
  if (cgs_listen_parse(cfg->listen, &s->listeners, err, errlen) != 0)
    return CG_EINVAL;
  int rc = load_tokens(s, err, errlen);
  if (rc != 0)
    return rc;
  grpc_server_credentials *plain = grpc_insecure_server_credentials_create();
  grpc_server_credentials *tcp = plain;
  rc = tls_credentials(cfg, &tcp, err, errlen);
  if (rc == 0)
    rc = cgs_listen_bind(&s->listeners, s->grpc, tcp, plain, cfg->socket_mode,
                         err, errlen);
  if (tcp != plain)
    grpc_server_credentials_release(tcp);
  grpc_server_credentials_release(plain);
  s->port = cgs_listen_tcp_port(&s->listeners);
  return rc ? CG_EINVAL : 0;
}

/* Never started, so there is nothing to drain; but grpc aborts the process
 * when a server with bound ports is destroyed before its shutdown has
 * completed (a later --listen entry or --metrics-listen failed). */
static void destroy_unstarted(cgs_server *s) {
  grpc_server_shutdown_and_notify(s->grpc, s->cq.q, &s->shutdown_tag);
  grpc_event ev;
  do
    ev = grpc_completion_queue_next(s->cq.q,
                                    gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
  while (ev.type == GRPC_OP_COMPLETE && ev.tag != &s->shutdown_tag);
  grpc_server_destroy(s->grpc);
  s->grpc = NULL;
}

int cgs_server_start(cgs_server *s, uv_loop_t *loop, const cgs_config *cfg,
                     void (*on_ready)(cgs_server *s),
                     void (*on_stopped)(cgs_server *s), char *err,
                     size_t errlen) {
  int rc = 0;
  memset(s, 0, sizeof *s);
  s->cfg = cfg;
  s->loop = loop;
  s->on_ready = on_ready;
  s->on_stopped = on_stopped;
  s->shutdown_tag.cb = on_shutdown_notified;
  pthread_mutex_init(&s->auth_mu, NULL);
  if (cfg->warmup[0] &&
      (rc = cgs_warmup_load(&s->warmup, cfg->warmup, cfg, err, errlen)) != 0)
    return rc;
  if (cgs_cq_init(&s->cq) != 0)
    return cg_errorf(err, errlen, CG_EINTERNAL,
                     "cannot create the completion queue");
  if ((rc = create_grpc_server(s, err, errlen)) != 0)
    goto fail_grpc;
  if ((rc = cgs_peers_new(&s->peers)) != 0) {
    cg_errorf(err, errlen, rc, "peers: out of memory");
    goto fail_grpc;
  }
  if (cfg->shm != CGS_SHM_OFF &&
      cgs_regions_new(&s->regions, cfg->max_regions, cfg->max_region_bytes,
                      cfg->shm_prefix, err, errlen) != 0) {
    rc = CG_EINTERNAL;
    goto fail_grpc;
  }
  if (cfg->store_bytes &&
      cgs_store_new(&s->store, cfg->store_bytes, cfg->store_ttl_ms,
                    cgs_config_store_peer_bytes(cfg), err, errlen) != 0) {
    rc = CG_ENOMEM;
    goto fail_grpc;
  }
  if ((rc = cgs_health_new(&s->health, s)) != 0) {
    cg_errorf(err, errlen, rc, "health: out of memory");
    goto fail_grpc;
  }
  uv_async_init(loop, &s->warm_async, on_warm_async);
  s->warm_async.data = s;
  cgs_pool_warm warm = {
      .layers = s->warmup.layers, .n = s->warmup.n, .done = on_warm, .arg = s};
  if ((rc = cgs_pool_new(&s->pool, cfg, &warm, cgs_call_job_done, s, err,
                         errlen)) != 0)
    goto fail_health;
  if (cgs_calls_init(&s->calls, loop, on_calls_idle) != 0) {
    rc = cg_errorf(err, errlen, CG_EINTERNAL, "cannot start the calls' list");
    goto fail_calls;
  }
  uv_timer_init(loop, &s->grace_timer);
  s->grace_timer.data = s;
  uv_timer_init(loop, &s->housekeeping_timer);
  s->housekeeping_timer.data = s;
  uv_timer_init(loop, &s->calls_timer);
  s->calls_timer.data = s;
  if ((rc = start_metrics(s, err, errlen)) != 0)
    goto fail_pool;
  s->cq.on_idle = on_cq_idle;
  s->cq.idle_data = s->pool;
  if (cgs_cq_start(&s->cq, loop, teardown) != 0) {
    rc = cg_errorf(err, errlen, CG_EINTERNAL, "cannot start the cq thread");
    goto fail_pool;
  }
  s->busy_at_ms = uv_now(loop);
  uv_timer_start(&s->housekeeping_timer, on_housekeeping, HOUSEKEEPING_MS,
                 HOUSEKEEPING_MS);
  uv_timer_start(&s->calls_timer, on_calls_timer, CALLS_TICK_MS, CALLS_TICK_MS);
  grpc_server_start(s->grpc);
  for (size_t m = 0; m <= N_METHODS; m++) {
    int slots = m < N_METHODS ? method_table[m]->slots : UNKNOWN_SLOTS;
    for (int i = 0; i < slots; i++)
      request_slot(s, m);
  }
  return 0;

fail_pool:
  cgs_httpd_stop(s->metrics_http);
  s->metrics_http = NULL;
  uv_close((uv_handle_t *)&s->grace_timer, on_handle_closed);
  uv_close((uv_handle_t *)&s->housekeeping_timer, on_handle_closed);
  uv_close((uv_handle_t *)&s->calls_timer, on_handle_closed);
  cgs_calls_close(&s->calls, on_handle_closed);
fail_calls:
  cgs_pool_close(s->pool);
fail_health:
  uv_close((uv_handle_t *)&s->warm_async, on_handle_closed);
  cgs_health_free(s->health);
fail_grpc:
  cgs_regions_free(s->regions);
  s->regions = NULL;
  cgs_store_free(s->store);
  s->store = NULL;
  cgs_peers_free(s->peers);
  s->peers = NULL;
  destroy_unstarted(s);
  cgs_cq_destroy(&s->cq);
  return rc;
}
