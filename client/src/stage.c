/* stage.c - owns cgc_stage: a tensor's bytes hashed, offered to the
 * server's store by id, and uploaded only when it lacks them (the Stage
 * stream; proto/SEMANTICS.md, "Staged tensors"). */
#include <string.h>
#include <sys/random.h>

#include <openssl/evp.h>

#include "cgw.h"
#include "convgrad/v1/convgrad.pb-c.h"
#include "internal.h"

/* The initial metadata the server answers a Stage header with. */
#define CGC__STAGE_KEY "convgrad-stage"
#define CGC__STAGE_UPLOAD "upload"

typedef struct cgc__stage_ctx {
  const unsigned char *data;
  size_t nbytes;
  const unsigned char *id;
  int priv;              /* id is private (cgc_stage_private) */
  cgc_stage_result *res; /* never NULL */
} cgc__stage_ctx;

/* Starts ops as one batch and waits for it (the call's deadline bounds
 * the wait); returns 1 when it succeeded, 0 when it failed, -1 when it
 * could not start or the queue gave no event (the batch may be pending). */
static int cgc__batch(grpc_call *call, grpc_completion_queue *cq,
                      const grpc_op *ops, size_t n) {
  if (grpc_call_start_batch(call, ops, n, (void *)1, NULL) != GRPC_CALL_OK)
    return -1;
  grpc_event ev =
      grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
  return ev.type != GRPC_OP_COMPLETE ? -1 : ev.success != 0;
}

/* 1 when the initial metadata asks for the bytes. */
static int cgc__wants_upload(const grpc_metadata_array *md) {
  for (size_t i = 0; i < md->count; i++)
    if (!grpc_slice_str_cmp(md->metadata[i].key, CGC__STAGE_KEY))
      return !grpc_slice_str_cmp(md->metadata[i].value, CGC__STAGE_UPLOAD);
  return 0;
}

/* Sends the bytes after the header, chunk by chunk, the last with the
 * half-close, each chunk's data a slice over the caller's bytes that pin
 * counts; returns 0, or -1 when a batch could not start. A refused chunk
 * ends the upload: the status says why. */
static int cgc__stage_upload(grpc_call *call, grpc_completion_queue *cq,
                             const cgc__stage_ctx *x, size_t chunk,
                             cgc__pin *pin) {
  for (size_t off = 0; off < x->nbytes;) {
    size_t n = x->nbytes - off < chunk ? x->nbytes - off : chunk;
    /* StageRequest{chunk = DataChunk{data}} is ComputeRequest's chunk
     * byte for byte (the kind oneof's member 2, input 0). */
    cgc__pin_ref(pin);
    grpc_byte_buffer *bb =
        cgw_request_chunk(0, x->data + off, n, cgc__pin_unref, pin);
    off += n;
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_MESSAGE;
    ops[0].data.send_message.send_message = bb;
    ops[1].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    int ok = cgc__batch(call, cq, ops, off == x->nbytes ? 2 : 1);
    grpc_byte_buffer_destroy(bb);
    if (ok < 0)
      return -1;
    x->res->bytes_sent += n;
    if (!ok)
      break;
  }
  return 0;
}

/* The StageResponse in io->recv_bb, for the id sent. */
static int cgc__stage_answer(const cgc__stage_ctx *x, cgc__call_io *io,
                             cgc_status *st) {
  Convgrad__V1__StageResponse *r =
      io->recv_bb ? (Convgrad__V1__StageResponse *)cgw_unpack(
                        &convgrad__v1__stage_response__descriptor, io->recv_bb)
                  : NULL;
  int ok = r && r->sha256.len == CGC_STAGED_ID_BYTES &&
           memcmp(r->sha256.data, x->id, CGC_STAGED_ID_BYTES) == 0 &&
           r->byte_size == x->nbytes;
  if (ok) {
    x->res->present = r->present;
    x->res->ttl_ms = r->ttl_ms;
  }
  if (r)
    protobuf_c_message_free_unpacked(&r->base, NULL);
  if (ok)
    return 0;
  cgc__status_set(st, GRPC_STATUS_INTERNAL,
                  "malformed response: no StageResponse for the id sent");
  return CGC_EPROTO;
}

static int cgc__stage_attempt(cgc_channel *ch, void *vctx, cgc__try *t,
                              cgc_status *st) {
  const cgc__stage_ctx *x = vctx;
  cgc__call_io io;
  cgc__call_io_init(&io, ch, t->retry);
  x->res->attempts++;
  x->res->bytes_sent = 0;
  size_t chunk = ch->opts.upload_chunk_bytes;
  int whole = x->nbytes <= chunk; /* one message, sent at once */
  Convgrad__V1__StageHeader h = CONVGRAD__V1__STAGE_HEADER__INIT;
  h.sha256.data = (uint8_t *)x->id;
  h.sha256.len = CGC_STAGED_ID_BYTES;
  h.byte_size = x->nbytes;
  h.private_id = x->priv;
  if (whole) {
    h.data.data = (uint8_t *)x->data;
    h.data.len = x->nbytes;
  }
  Convgrad__V1__StageRequest req = CONVGRAD__V1__STAGE_REQUEST__INIT;
  req.kind_case = CONVGRAD__V1__STAGE_REQUEST__KIND_HEADER;
  req.header = &h;
  /* Chunks are slices over the caller's bytes: they stay in place. */
  cgc__pin *pin = whole ? NULL : cgc__pin_new();
  if (!whole && !pin) {
    cgc__call_io_free(&io);
    cgc__status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return CG_ENOMEM;
  }
  io.send_bb = cgw_pack(&req.base);

  int rc = 0;
  grpc_completion_queue *cq = cgc__cq_take(ch);
  grpc_call *call = grpc_channel_create_call(
      ch->chan, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
      grpc_slice_from_static_string("/convgrad.v1.ConvGrad/Stage"), NULL,
      t->deadline, NULL);
  grpc_op ops[5];
  cgc__ops_one_message(ops, &io); /* send md, header, close; recv md */
  if (!whole)                     /* no half-close yet */
    ops[2] = ops[3];
  /* Waiting for the server's metadata before any data is what keeps
   * content it holds from being sent again. */
  int ok = call ? cgc__batch(call, cq, ops, whole ? 4 : 3) : -1;
  if (ok >= 0 && !whole && ok && cgc__wants_upload(&io.initial_md)) {
    ok = cgc__stage_upload(call, cq, x, chunk, pin) == 0;
    if (!ok)
      ok = -1;
  } else if (ok >= 0 && whole) {
    x->res->bytes_sent = x->nbytes;
  }
  if (ok >= 0) {
    cgc__op_recv_status(&ops[0], &io);
    ops[1] = ops[4]; /* recv message */
    ok = cgc__batch(call, cq, ops, 2);
  }
  if (ok < 0) { /* a batch could not start: none is pending */
    if (call)
      grpc_call_cancel(call, NULL);
    cgc__status_set(st, GRPC_STATUS_INTERNAL, "cannot run the Stage call");
    rc = CGC_ERPC;
  } else if (io.code != GRPC_STATUS_OK) {
    cgc__status_from_grpc(st, io.code, io.details);
    t->retry_after_ms = cgc__call_io_retry_after(&io);
    rc = CGC_ERPC;
  } else {
    rc = cgc__stage_answer(x, &io, st);
  }
  if (call)
    grpc_call_unref(call);
  if (pin)
    cgc__pin_release(pin);
  cgc__cq_give(ch, cq);
  cgc__call_io_free(&io);
  return rc;
}

/* The window's verdict, said by cgc_stage once staging is off. */
#define CGC__STAGE_OFF_WHY                                                     \
  "%d of the first %d calls naming tensors this channel had just staged "      \
  "found the server without them, so staging is off for it: its target "       \
  "spreads calls over servers that share no store (round_robin over an "       \
  "address list, a headless Service), so a tensor is staged on one and its "   \
  "call goes to another (or the store drops entries at once). Staged views "   \
  "go as bytes from now on. To keep staging, give each client one server's "   \
  "address (e.g. one replica per trainer rank)"

int cgc__stage_off(const cgc_channel *ch) {
  return atomic_load(&ch->sw->off);
}

void cgc__stage_unavailable(cgc_channel *ch) {
  cgc__stage_watch *w = ch->sw;
  pthread_mutex_lock(&w->mu);
  w->lost++;
  pthread_mutex_unlock(&w->mu);
}

/* Arms the connectivity watch with the channel's state now. */
static void cgc__conn_arm(cgc__stage_watch *w) {
  w->conn_state = grpc_channel_check_connectivity_state(w->chan, 0);
  grpc_channel_watch_connectivity_state(w->chan, w->conn_state,
                                        gpr_inf_future(GPR_CLOCK_MONOTONIC),
                                        w->conn_cq, NULL);
}

void cgc__stage_watch_start(cgc_channel *ch) {
  cgc__stage_watch *w = &ch->stage_watch;
  w->chan = ch->chan;
  w->conn_cq = grpc_completion_queue_create_for_next(NULL);
  cgc__conn_arm(w);
}

void cgc__stage_watch_close(cgc_channel *ch) {
  if (ch->stage_watch.conn_cq)
    cgc__cq_destroy(ch->stage_watch.conn_cq);
}

/* Counts the connections w's channel dropped since the last look (w->mu
 * held), without waiting: the watch fired while armed with READY. A
 * restarted server's drop is on the queue before the channel can pick a
 * new connection, so before a call or a Stage reaches the new server. */
static void cgc__stage_conn_poll(cgc__stage_watch *w) {
  while (grpc_completion_queue_next(w->conn_cq,
                                    gpr_inf_past(GPR_CLOCK_MONOTONIC), NULL)
             .type == GRPC_OP_COMPLETE) {
    if (w->conn_state == GRPC_CHANNEL_READY)
      w->lost++;
    cgc__conn_arm(w);
  }
}

/* Remembers an id ch staged just now, while the window is open. */
static void cgc__stage_remember(cgc_channel *ch, const unsigned char *id,
                                uint64_t ttl_ms) {
  cgc__stage_watch *w = ch->sw;
  pthread_mutex_lock(&w->mu);
  if (w->calls < CGC__STAGE_WINDOW && !atomic_load(&w->off)) {
    cgc__stage_conn_poll(w);
    memcpy(w->ring[w->next].id, id, CGC_STAGED_ID_BYTES);
    w->ring[w->next].at_ms = cgc__now_ms();
    w->ring[w->next].ttl_ms = ttl_ms ? (double)ttl_ms : 60000.0;
    w->ring[w->next].lost = w->lost;
    w->next = (w->next + 1) % CGC__STAGE_RING;
  }
  pthread_mutex_unlock(&w->mu);
}

/* 1 when w remembers id as staged lately: well within the store's time
 * to live, and since the last drop or UNAVAILABLE (no restart lost it). */
static int cgc__stage_recent(const cgc__stage_watch *w, const unsigned char *id,
                             double now) {
  for (int k = 0; k < CGC__STAGE_RING; k++) {
    if (w->ring[k].at_ms > 0 && w->ring[k].lost == w->lost &&
        now - w->ring[k].at_ms < w->ring[k].ttl_ms / 4 &&
        memcmp(w->ring[k].id, id, CGC_STAGED_ID_BYTES) == 0)
      return 1;
  }
  return 0;
}

void cgc__stage_seen(cgc_channel *ch, const cgc_request *req, unsigned ids,
                     unsigned missing) {
  cgc__stage_watch *w = ch->sw;
  double now = cgc__now_ms();
  pthread_mutex_lock(&w->mu);
  if (w->calls >= CGC__STAGE_WINDOW || atomic_load(&w->off)) {
    pthread_mutex_unlock(&w->mu);
    return;
  }
  cgc__stage_conn_poll(w);
  int ours = 0, miss = 0;
  for (int i = 0; i < 3; i++) {
    if (!(ids & (1u << i)) || !cgc__stage_recent(w, req->inputs[i].staged, now))
      continue;
    ours = 1;
    miss |= (missing & (1u << i)) != 0;
  }
  w->calls += ours;
  w->misses += miss;
  if (w->misses * 2 >= CGC__STAGE_WINDOW)
    atomic_store(&w->off, 1);
  pthread_mutex_unlock(&w->mu);
}

/* The tag a private id begins with, without its NUL. */
static const unsigned char cgc__private_tag[CGC_PRIVATE_ID_TAG_BYTES] =
    CGC_PRIVATE_ID_TAG;

int cgc__stage_id_private(const unsigned char *id) {
  return memcmp(id, cgc__private_tag, CGC_PRIVATE_ID_TAG_BYTES) == 0;
}

/* id for the nbytes at data: their SHA-256, or a private id drawn at
 * random. */
static int cgc__stage_id(const void *data, size_t nbytes, int priv,
                         unsigned char id[CGC_STAGED_ID_BYTES],
                         cgc_status *st) {
  if (priv) {
    memcpy(id, cgc__private_tag, sizeof cgc__private_tag);
    size_t n = CGC_STAGED_ID_BYTES - CGC_PRIVATE_ID_TAG_BYTES;
    if (getrandom(id + CGC_PRIVATE_ID_TAG_BYTES, n, 0) == (ssize_t)n)
      return 0;
    cgc__status_set(st, GRPC_STATUS_INTERNAL,
                    "cgc_stage_private: no random bytes for the id");
    return CG_ENOMEM;
  }
  unsigned len = 0;
  if (EVP_Digest(data, nbytes, id, &len, EVP_sha256(), NULL) &&
      len == CGC_STAGED_ID_BYTES)
    return 0;
  cgc__status_set(st, GRPC_STATUS_INTERNAL, "cgc_stage: SHA-256 failed");
  return CG_ENOMEM;
}

static int cgc__stage(cgc_channel *ch, const void *data, size_t nbytes,
                      int64_t deadline_ms, int priv,
                      unsigned char id[CGC_STAGED_ID_BYTES],
                      cgc_stage_result *res, cgc_status *st) {
  if (!ch || !id || !nbytes || !data) {
    cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                    "cgc_stage: needs a channel, an id and nbytes > 0 at data");
    return CG_EINVAL;
  }
  if (cgc__stage_off(ch)) {
    pthread_mutex_lock(&ch->sw->mu);
    int misses = ch->sw->misses, calls = ch->sw->calls;
    pthread_mutex_unlock(&ch->sw->mu);
    cgc__status_set(st, GRPC_STATUS_FAILED_PRECONDITION, CGC__STAGE_OFF_WHY,
                    misses, calls);
    return CGC_ERPC;
  }
  double t0 = cgc__now_ms();
  int rc = cgc__stage_id(data, nbytes, priv, id, st);
  if (rc)
    return rc;
  cgc_stage_result local;
  cgc__stage_ctx x = {data, nbytes, id, priv, res ? res : &local};
  memset(x.res, 0, sizeof *x.res);
  rc = cgc__with_retry(ch, cgc__deadline(ch, deadline_ms), cgc__stage_attempt,
                       &x, st);
  x.res->total_ms = cgc__now_ms() - t0;
  if (!rc) {
    cgc__stage_remember(ch, id, x.res->ttl_ms);
    cgc__status_ok(st);
  }
  return rc;
}

int cgc_stage(cgc_channel *ch, const void *data, size_t nbytes,
              int64_t deadline_ms, unsigned char id[CGC_STAGED_ID_BYTES],
              cgc_stage_result *res, cgc_status *st) {
  return cgc__stage(ch, data, nbytes, deadline_ms, 0, id, res, st);
}

int cgc_stage_private(cgc_channel *ch, const void *data, size_t nbytes,
                      int64_t deadline_ms,
                      unsigned char id[CGC_STAGED_ID_BYTES],
                      cgc_stage_result *res, cgc_status *st) {
  return cgc__stage(ch, data, nbytes, deadline_ms, 1, id, res, st);
}
