/* health.c - owns the serving status and the open Watch streams of the
 * standard grpc.health.v1.Health service. */
#include "cgs_health.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg/error.h"
#include "cgs_log.h"
#include "cgs_wire.h"
#include "grpc/health/v1/health.pb-c.h"

#define ST_SERVING                                                             \
  GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
#define ST_NOT_SERVING                                                         \
  GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
#define ST_UNKNOWN_SERVICE                                                     \
  GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN

typedef struct watcher {
  cgs_tag tag_send, tag_close, tag_recv;
  cgs_health *h;
  grpc_call *call;
  int started;        /* the request arrived and parsed */
  int known;          /* the service name is one of ours */
  int sent;           /* last status sent; -1 before the first */
  int md_sent;        /* initial metadata went out */
  int send_pending;   /* a send batch is in flight */
  int end_wanted;     /* finish the stream after the latest status */
  int ended;          /* the final status batch was started */
  int close_received; /* RECV_CLOSE_ON_SERVER completed */
  int recv_pending;   /* the request is being received */
  int cancelled;
  grpc_byte_buffer *msg, *recv_bb;
  grpc_slice details;
  grpc_status_code final_code; /* how the stream ends */
  const char *final_msg;       /* static string */
  struct watcher *prev, *next;
} watcher;

struct cgs_health {
  cgs_server *s;
  int serving;
  int quarantined; /* failed result checks (cgs_checks.h) */
  watcher *watchers;
  unsigned nwatchers;
};

int cgs_health_new(cgs_health **out, cgs_server *s) {
  cgs_health *h = calloc(1, sizeof *h);
  *out = h;
  if (!h)
    return CG_ENOMEM;
  h->s = s;
  return 0;
}

void cgs_health_free(cgs_health *h) {
  free(h);
}

unsigned cgs_health_watchers(const cgs_health *h) {
  return h->nwatchers;
}

static int known_service(const char *name) {
  return name[0] == '\0' || strcmp(name, "convgrad.v1.ConvGrad") == 0;
}

static int status_of(const cgs_health *h, int known) {
  if (!known)
    return ST_UNKNOWN_SERVICE;
  return h->serving && !h->quarantined ? ST_SERVING : ST_NOT_SERVING;
}

static grpc_byte_buffer *pack_status(int status) {
  Grpc__Health__V1__HealthCheckResponse r =
      GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  r.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)status;
  return cgw_pack(&r.base);
}

/* Returns the requested service name (malloc'd) or NULL when the request
 * is missing or does not parse. Takes ownership of payload. */
static char *parse_service(grpc_byte_buffer *payload) {
  if (!payload)
    return NULL;
  Grpc__Health__V1__HealthCheckRequest *req =
      (Grpc__Health__V1__HealthCheckRequest *)cgw_unpack(
          &grpc__health__v1__health_check_request__descriptor, payload);
  grpc_byte_buffer_destroy(payload);
  if (!req)
    return NULL;
  char *name = strdup(req->service);
  protobuf_c_message_free_unpacked(&req->base, NULL);
  return name;
}

static void check(cgs_server *s, grpc_call *call, gpr_timespec deadline,
                  grpc_byte_buffer *payload, const char *client,
                  const grpc_metadata_array *md) {
  (void)md;
  cgs_health *h = s->health;
  (void)deadline; /* answered at once */
  (void)client;
  char *service = parse_service(payload);
  if (!service) {
    cgs_cq_reply(&h->s->cq, call, NULL, GRPC_STATUS_INVALID_ARGUMENT,
                 "request: malformed HealthCheckRequest");
    return;
  }
  if (!known_service(service)) {
    char msg[300];
    snprintf(msg, sizeof msg, "service: unknown service '%.200s'", service);
    cgs_cq_reply(&h->s->cq, call, NULL, GRPC_STATUS_NOT_FOUND, msg);
  } else {
    cgs_cq_reply(&h->s->cq, call, pack_status(status_of(h, 1)), GRPC_STATUS_OK,
                 NULL);
  }
  free(service);
}

/* ---- Watch ----------------------------------------------------------- */

static void watcher_maybe_free(watcher *w) {
  if (!w->close_received || w->send_pending || w->recv_pending)
    return;
  cgs_health *h = w->h;
  if (w->prev)
    w->prev->next = w->next;
  else
    h->watchers = w->next;
  if (w->next)
    w->next->prev = w->prev;
  grpc_call_unref(w->call);
  if (w->ended)
    grpc_slice_unref(w->details);
  h->nwatchers--;
  free(w);
}

static void on_watch_send(cgs_tag *t, int ok);

/* Sends the current status once the request is known and whenever it
 * changes, else the final status when the stream should end. One send
 * batch at a time. */
static void watcher_step(watcher *w) {
  if (w->send_pending || w->ended || w->close_received)
    return;
  if (!w->started && !w->end_wanted)
    return; /* the request has not arrived */
  grpc_op ops[2];
  size_t n = 0;
  memset(ops, 0, sizeof ops);
  if (!w->md_sent) {
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    w->md_sent = 1;
  }
  int st = status_of(w->h, w->known);
  if (w->started && st != w->sent) {
    w->msg = pack_status(st);
    w->sent = st;
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = w->msg;
  } else if (w->end_wanted) {
    w->ended = 1;
    w->details = grpc_slice_from_static_string(w->final_msg);
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = w->final_code;
    ops[n++].data.send_status_from_server.status_details = &w->details;
  } else {
    return;
  }
  w->send_pending = 1;
  if (cgs_cq_batch(&w->h->s->cq, w->call, ops, n, &w->tag_send) !=
      GRPC_CALL_OK) {
    grpc_call_cancel(w->call, NULL);
    on_watch_send(&w->tag_send, 0);
  }
}

static void on_watch_send(cgs_tag *t, int ok) {
  watcher *w = cgs_container_of(t, watcher, tag_send);
  w->send_pending = 0;
  if (w->msg) {
    grpc_byte_buffer_destroy(w->msg);
    w->msg = NULL;
  }
  if (ok)
    watcher_step(w);
  watcher_maybe_free(w);
}

static void on_watch_close(cgs_tag *t, int ok) {
  watcher *w = cgs_container_of(t, watcher, tag_close);
  (void)ok;
  w->close_received = 1;
  watcher_maybe_free(w);
}

/* The one request message of the stream. */
static void on_watch_recv(cgs_tag *t, int ok) {
  watcher *w = cgs_container_of(t, watcher, tag_recv);
  w->recv_pending = 0;
  (void)ok; /* a failed receive leaves recv_bb NULL */
  char *service = parse_service(w->recv_bb);
  w->recv_bb = NULL; /* parse_service took it */
  if (service) {
    w->known = known_service(service);
    w->started = 1;
    char logged[128];
    cgs_log_value(logged, sizeof logged, service);
    cgs_debug("health watch started (service %s)", logged);
    free(service);
  } else if (!w->end_wanted) {
    w->end_wanted = 1;
    w->final_code = GRPC_STATUS_INVALID_ARGUMENT;
    w->final_msg = "request: missing or malformed HealthCheckRequest";
  }
  watcher_step(w);
  watcher_maybe_free(w);
}

/* Registered without the first message: it is received here. */
static void watch(cgs_server *s, grpc_call *call, gpr_timespec deadline,
                  grpc_byte_buffer *payload, const char *client,
                  const grpc_metadata_array *md) {
  (void)md;
  cgs_health *h = s->health;
  (void)deadline; /* a Watch lasts until the client or the server ends it */
  (void)payload;
  (void)client;
  watcher *w = calloc(1, sizeof *w);
  if (!w) {
    cgs_cq_reply(&h->s->cq, call, NULL, GRPC_STATUS_RESOURCE_EXHAUSTED,
                 "server out of memory");
    return;
  }
  w->tag_send.cb = on_watch_send;
  w->tag_close.cb = on_watch_close;
  w->tag_recv.cb = on_watch_recv;
  w->h = h;
  w->call = call;
  w->sent = -1;
  w->final_code = GRPC_STATUS_UNAVAILABLE;
  w->final_msg = "server shutting down";
  w->next = h->watchers;
  if (h->watchers)
    h->watchers->prev = w;
  h->watchers = w;
  h->nwatchers++;
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  op.data.recv_close_on_server.cancelled = &w->cancelled;
  if (cgs_cq_batch(&h->s->cq, call, &op, 1, &w->tag_close) != GRPC_CALL_OK) {
    /* Without a close notification the watcher could never be freed. */
    w->close_received = 1;
    grpc_call_cancel(call, NULL);
    watcher_maybe_free(w);
    return;
  }
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &w->recv_bb;
  w->recv_pending = 1;
  if (cgs_cq_batch(&h->s->cq, call, &op, 1, &w->tag_recv) != GRPC_CALL_OK) {
    w->recv_pending = 0;
    grpc_call_cancel(call, NULL);
  }
  if (h->s->draining)
    w->end_wanted = 1;
}

void cgs_health_set_serving(cgs_health *h, int serving) {
  if (h->serving == serving)
    return;
  h->serving = serving;
  cgs_info("health: %s", serving ? "SERVING" : "NOT_SERVING");
  for (watcher *w = h->watchers; w; w = w->next)
    watcher_step(w);
}

void cgs_health_set_quarantined(cgs_health *h, int quarantined,
                                const char *why) {
  if (h->quarantined == quarantined)
    return;
  h->quarantined = quarantined;
  if (quarantined)
    cgs_error("health: NOT_SERVING: quarantined: %s", why);
  for (watcher *w = h->watchers; w; w = w->next)
    watcher_step(w);
}

void cgs_health_end_watches(cgs_health *h) {
  for (watcher *w = h->watchers, *next; w; w = next) {
    next = w->next;
    w->end_wanted = 1;
    watcher_step(w);
  }
}

const cgs_method_def cgs_health_check_method = {
    .path = "/grpc.health.v1.Health/Check",
    .reads_first = 1,
    .slots = 4,
    .start = check,
};

const cgs_method_def cgs_health_watch_method = {
    .path = "/grpc.health.v1.Health/Watch",
    .reads_first = 0,
    .slots = 4,
    .start = watch,
};
