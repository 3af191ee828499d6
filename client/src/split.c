/* split.c - one call over several replicas (cgc_options.replicas): each
 * replica has a channel of its own (made and freed with the channel, in
 * channel.c); a call large enough is cut along the minibatch into parts,
 * each sent as an asynchronous call of its own
 * (cgc_call_start) to the replica that should finish it first, and put
 * back together: diff_src concatenated, diff_weights and diff_bias summed
 * in part order. A part whose replica fails goes to another one; a part
 * slower than the 95th percentile of its shape gets a backup elsewhere,
 * within a budget, and the copy that loses is cancelled. Smaller calls go
 * whole to the least loaded replica.
 *
 * How the cut is decided (client/README.md, "Replicas"): the parts depend
 * on the request and the options only, never on timing, so the sums, and
 * the result, are the same bits from one run to the next. Timing decides
 * only which replica computes which part. Every attempt of a part writes
 * into buffers of its own, so that a backup and the attempt it races never
 * write into the same bytes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cg/dtype.h"
#include "cg/layer.h"
#include "internal.h"

/* Weight of a new measurement in a replica's moving averages. */
#define CGC__EWMA 0.25
/* Least work of a part unless the options say otherwise: 2 ms of one
 * core at 100 GFLOP/s, well above what a call costs besides its compute
 * on loopback (0.1-0.3 ms). */
#define CGC__MIN_PART_FLOPS 200e6
/* Speed and link assumed of a replica not measured yet. */
#define CGC__GUESS_MS_PER_GFLOP 10.0
#define CGC__GUESS_BYTES_PER_MS 1e6
/* The parts' tensors repeated in every part (the weights up, diff_weights
 * and diff_bias down) may add at most this share of the call's bytes. */
#define CGC__REPEAT_SHARE 0.25
/* A replica that failed a part is not picked for this long while another
 * is up: what gRPC's outlier detection does, which Debian's gRPC 1.51
 * has only for its xDS policies. */
#define CGC__DOWN_MS 1000.0
/* A replica's speed older than this is guessed again (cgc__estimate). */
#define CGC__STALE_MS 2000.0
/* How often the split looks at its parts while none has ended. */
#define CGC__POLL_MS 2
/* Attempts of one part: the first, failovers, one hedge. */
#define CGC__TRIES_MAX 4
/* Latencies a shape needs before its parts get backups. */
#define CGC__LAT_MIN 8
/* One attempt of a part. */
typedef struct cgc__part_try {
  cgc_call *call; /* NULL once finished */
  int replica;
  double t0;
  void *buf; /* every output of the part, one allocation, owned */
} cgc__ptry;

typedef struct cgc__part {
  int64_t row0, rows;
  cgc_request req; /* views into the caller's inputs */
  int64_t dst_shape[CG_MAX_RANK], shape_in[CG_MAX_RANK];
  double flops;
  size_t bytes; /* its tensors, in and out */
  uint64_t key; /* its shape, for the latency percentiles */
  cgc__ptry tries[CGC__TRIES_MAX];
  int ntries, live;
  int won; /* 1 + the try that completed, 0 while none has */
  int hedged;
  cgc_tensor out[CG_GRAD_COUNT];
  cgc_result res;
} cgc__part;

/* What a split call knows of its request. */
typedef struct cgc__plan {
  cg_layer layer;
  unsigned wants;
  int64_t mb;
  int data_in[3];            /* 1 for the inputs cut along the minibatch */
  size_t off[CG_GRAD_COUNT]; /* each output's place in a part's buffer */
  size_t part_out_bytes;     /* the largest part's buffer */
  int nparts;
} cgc__plan;

/* ---- replicas -------------------------------------------------------- */

/* Expected milliseconds of flops and bytes on replica r at now. A speed
 * and link measured more than CGC__STALE_MS ago count as the guesses
 * again, so that
 * a replica left out for being slow gets a part now and then and shows
 * whether it still is. split_mu held. */
static double cgc__estimate(const cgc__replica *r, double flops, size_t bytes,
                            double now) {
  int fresh = now - r->measured_ms < CGC__STALE_MS;
  double ms_gf =
      r->ms_per_gflop > 0 && fresh ? r->ms_per_gflop : CGC__GUESS_MS_PER_GFLOP;
  double link =
      r->bytes_per_ms > 0 && fresh ? r->bytes_per_ms : CGC__GUESS_BYTES_PER_MS;
  return flops / 1e9 * ms_gf + (double)bytes / link;
}

/* The replica to send work of flops and bytes to: the one that should
 * finish it first, among the replicas up, or among all when none is up;
 * never avoid unless it is the only one. finish[i] (may be NULL) is the
 * ms of work replica i has already (what a split call gave it, on top of
 * its backlog when the call began); without it each call in flight
 * counts as one more of this work. split_mu held. */
static int cgc__pick(cgc_channel *ch, double flops, size_t bytes,
                     const double *finish, int avoid, double now) {
  int best = -1;
  double best_t = 0;
  for (int pass = 0; pass < 2 && best < 0; pass++)
    for (int i = 0; i < ch->nreplicas; i++) {
      const cgc__replica *r = &ch->replicas[i];
      if ((pass == 0 && r->down_until_ms > now) ||
          (i == avoid && ch->nreplicas > 1))
        continue;
      double est = cgc__estimate(r, flops, bytes, now);
      double t = finish ? finish[i] + est : est * (1 + r->outstanding);
      if (best < 0 || t < best_t) {
        best = i;
        best_t = t;
      }
    }
  return best < 0 ? 0 : best;
}

/* Folds what a part's successful attempt measured into replica r;
 * split_mu held. */
static void cgc__measure(cgc__replica *r, const cgc_result *res, double flops) {
  if (flops > 0 && res->compute_ms > 0) {
    double v = res->compute_ms / (flops / 1e9);
    r->ms_per_gflop = r->ms_per_gflop > 0
                          ? r->ms_per_gflop + CGC__EWMA * (v - r->ms_per_gflop)
                          : v;
  }
  double wire = res->total_ms - res->queue_ms - res->compute_ms;
  uint64_t bytes = res->bytes_sent + res->bytes_received;
  if (bytes > 0 && wire > 0.01) {
    double v = (double)bytes / wire;
    r->bytes_per_ms = r->bytes_per_ms > 0
                          ? r->bytes_per_ms + CGC__EWMA * (v - r->bytes_per_ms)
                          : v;
  }
  r->measured_ms = cgc__now_ms();
}

/* ---- latencies and hedges ------------------------------------------- */

static cgc__lat *cgc__lat_of(struct cgc__split_stats *s, uint64_t key) {
  cgc__lat *free_slot = NULL;
  for (int i = 0; i < CGC__LAT_SHAPES; i++) {
    if (s->lat[i].key == key)
      return &s->lat[i];
    if (!s->lat[i].key && !free_slot)
      free_slot = &s->lat[i];
  }
  if (!free_slot) /* forget a shape: the one the key hashes to */
    free_slot = &s->lat[key % CGC__LAT_SHAPES];
  memset(free_slot, 0, sizeof *free_slot);
  free_slot->key = key;
  return free_slot;
}

static int cgc__cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The delay after which a part of key gets a backup: the 95th percentile
 * of its shape's latencies, and at least three times their median, so that a
 * pool without a straggler (a tight distribution) sends next to none, or
 * -1 while fewer than CGC__LAT_MIN are known. split_mu held. */
static double cgc__hedge_after(struct cgc__split_stats *s, uint64_t key) {
  cgc__lat *l = cgc__lat_of(s, key);
  if (l->n < CGC__LAT_MIN)
    return -1;
  double v[CGC__LAT_RING];
  memcpy(v, l->ms, sizeof(double) * (size_t)l->n);
  qsort(v, (size_t)l->n, sizeof v[0], cgc__cmp_double);
  double p95 = v[(int)ceil(0.95 * l->n) - 1], p50 = v[(l->n - 1) / 2];
  return p95 > 3 * p50 ? p95 : 3 * p50;
}

/* ---- the plan -------------------------------------------------------- */

/* The kernels' problem of req, with the formats its views name. */
static void cgc__problem(const cgc_request *req, int nin, cg_problem *p) {
  cg_problem_init(p);
  p->op = req->op;
  p->dtype = req->inputs[0].dtype;
  p->attrs = req->attrs;
  for (int i = 0; i < nin; i++) {
    int l = (int)req->inputs[i].layout;
    if (l == CGC_LAYOUT_NCX || l == CGC_LAYOUT_NXC) {
      if (!p->attrs.data_format)
        p->attrs.data_format = (cg_data_format)l;
    } else if (l >= CGC_LAYOUT_OIX && !p->attrs.weights_format) {
      p->attrs.weights_format = (cg_weights_format)(l - 2);
    }
    p->input_dims[i] =
        (cg_ints){req->inputs[i].dims, (size_t)req->inputs[i].rank};
  }
  p->has_shape_input = req->has_shape_input;
  p->shape_input = req->shape_input;
  int out = (int)req->output_layout, wout = (int)req->weights_output_layout;
  if (out == CGC_LAYOUT_NCX || out == CGC_LAYOUT_NXC)
    p->out_data_format = (cg_data_format)out;
  else if (out >= CGC_LAYOUT_OIX)
    p->out_weights_format = (cg_weights_format)(out - 2);
  if (wout >= CGC_LAYOUT_OIX)
    p->out_weights_format = (cg_weights_format)(wout - 2);
  p->grads = req->grads;
}

/* Parts of a call of work flops: at most max_parts and the minibatch,
 * each at least min_flops, and the tensors every part repeats (repeat
 * bytes) within CGC__REPEAT_SHARE of the data's (data bytes). */
static int cgc__nparts(int64_t mb, double flops, size_t data, size_t repeat,
                       int max_parts, double min_flops) {
  int64_t n = mb < max_parts ? mb : max_parts;
  double by_work = floor(flops / min_flops);
  if ((double)n > by_work)
    n = (int64_t)by_work;
  while (n >= 2 &&
         (double)(n - 1) * (double)repeat > CGC__REPEAT_SHARE * (double)data)
    n--;
  return n < 2 ? 1 : (int)n;
}

/* Fills plan for req; plan->nparts 1: the call goes whole. */
static void cgc__plan_of(const cgc_channel *ch, const cgc_request *req,
                         unsigned wants, cgc__plan *plan) {
  memset(plan, 0, sizeof *plan);
  plan->nparts = 1;
  plan->wants = wants;
  int layer = cg_op_is_layer(req->op);
  int nin = layer ? 3 : 2;
  cg_problem p;
  char err[256];
  cgc__problem(req, nin, &p);
  if (cg_layer_resolve(&p, &plan->layer, err, sizeof err) != 0)
    return; /* the server will say what is wrong */
  const cg_layer *l = &plan->layer;
  /* The inputs that hold the minibatch: data tensors, not weights. */
  int weights_op =
      req->op == CG_OP_CONV_BWD_WEIGHTS || req->op == CG_OP_DECONV_BWD_WEIGHTS;
  size_t data = 0, repeat = 0;
  for (int i = 0; i < nin; i++) {
    plan->data_in[i] = layer ? i < 2 : (weights_op || i == 0);
    *(plan->data_in[i] ? &data : &repeat) += l->in_bytes[i];
  }
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    if (wants & CG_GRAD_BIT(g))
      *(g == CG_GRAD_DIFF_SRC ? &data : &repeat) += l->out_bytes[g];
  plan->mb = req->inputs[0].dims[0];
  int max_parts =
      ch->opts.split_parts ? ch->opts.split_parts : 2 * ch->nreplicas;
  double min_flops = ch->opts.split_min_flops ? (double)ch->opts.split_min_flops
                                              : CGC__MIN_PART_FLOPS;
  plan->nparts = cgc__nparts(plan->mb, (double)cg_layer_flops(l), data, repeat,
                             max_parts, min_flops);
  /* A part's buffer: its diff_src rows (the first parts have the most)
   * and the whole of the other outputs, each 64-byte aligned. */
  int64_t most = (plan->mb + plan->nparts - 1) / plan->nparts;
  size_t off = 0;
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    if (wants & CG_GRAD_BIT(g)) {
      size_t n = l->out_bytes[g];
      if (g == CG_GRAD_DIFF_SRC)
        n = n / (size_t)plan->mb * (size_t)most;
      plan->off[g] = off;
      off += (n + 63) & ~(size_t)63;
    }
  plan->part_out_bytes = off;
}

/* A hash (FNV-1a, never 0) of what decides a request's latency on a
 * replica: op, outputs and the inputs' dtypes, layouts and dims. */
static uint64_t cgc__shape_key(const cgc_request *r) {
  uint64_t h = 1469598103934665603ull;
  int64_t v[3 + 3 * (2 + CG_MAX_RANK)];
  int n = 0;
  v[n++] = r->op;
  v[n++] = r->grads;
  v[n++] = r->output_layout;
  for (int i = 0; i < 3; i++) {
    v[n++] = (int64_t)r->inputs[i].dtype * 16 + r->inputs[i].layout;
    v[n++] = r->inputs[i].rank;
    for (int d = 0; d < CG_MAX_RANK; d++)
      v[n++] = d < r->inputs[i].rank ? r->inputs[i].dims[d] : 0;
  }
  const unsigned char *b = (const unsigned char *)v;
  for (size_t i = 0; i < (size_t)n * sizeof v[0]; i++)
    h = (h ^ b[i]) * 1099511628211ull;
  return h | 1;
}

/* Part k of plan: rows, request, flops and bytes. */
static void cgc__part_init(const cgc__plan *plan, const cgc_request *req, int k,
                           cgc__part *pt) {
  const cg_layer *l = &plan->layer;
  int64_t base = plan->mb / plan->nparts, extra = plan->mb % plan->nparts;
  pt->rows = base + (k < extra);
  pt->row0 = base * k + (k < extra ? k : extra);
  pt->req = *req;
  pt->req.deadline_ms = 0; /* set when sent */
  for (int i = 0; i < 3; i++) {
    cgc_tensor_view *v = &pt->req.inputs[i];
    if (!plan->data_in[i])
      continue;
    size_t row = v->nbytes / (size_t)plan->mb;
    v->staged = NULL; /* the id names the whole tensor: a part sends bytes */
    v->dims[0] = pt->rows;
    v->data = (const char *)v->data + row * (size_t)pt->row0;
    v->nbytes = row * (size_t)pt->rows;
  }
  /* ConvolutionBackwardData's dst_shape holds the minibatch too. */
  if (req->op == CG_OP_CONV_BWD_DATA && req->attrs.dst_shape.len) {
    memcpy(pt->dst_shape, req->attrs.dst_shape.v,
           req->attrs.dst_shape.len * sizeof(int64_t));
    pt->dst_shape[0] = pt->rows;
    pt->req.attrs.dst_shape.v = pt->dst_shape;
  }
  if (req->op == CG_OP_CONV_BWD_DATA && req->has_shape_input) {
    memcpy(pt->shape_in, req->shape_input.v,
           req->shape_input.len * sizeof(int64_t));
    pt->shape_in[0] = pt->rows;
    pt->req.shape_input.v = pt->shape_in;
  }
  double share = (double)pt->rows / (double)plan->mb;
  pt->flops = (double)cg_layer_flops(l) * share;
  pt->bytes = 0;
  for (int i = 0; i < l->ninputs && i < 3; i++)
    pt->bytes += plan->data_in[i] ? (size_t)((double)l->in_bytes[i] * share)
                                  : l->in_bytes[i];
  pt->bytes += plan->part_out_bytes;
  pt->key = cgc__shape_key(&pt->req);
}

/* ---- running the parts ---------------------------------------------- */

/* State of one split call while its parts run. */
typedef struct cgc__run {
  cgc_channel *ch;
  const cgc__plan *plan;
  cgc__part *parts;
  double deadline; /* cgc__now_ms() clock */
  int left;        /* parts without a winner */
  int rc;          /* the first permanent failure */
  cgc_status st;
  /* Told by the engine's thread of each attempt that ended. */
  pthread_mutex_t ev_mu;
  pthread_cond_t ev;
  unsigned ended;
} cgc__run;

/* cgc_call_start_notify's listener: wakes the split call. */
static void cgc__on_try_end(cgc_call *c, void *arg) {
  cgc__run *run = arg;
  (void)c;
  pthread_mutex_lock(&run->ev_mu);
  run->ended++;
  pthread_cond_signal(&run->ev);
  pthread_mutex_unlock(&run->ev_mu);
}

/* Starts an attempt of part pt on replica r, deadline_ms from now.
 * split_mu held. Returns 0 or the start's failure with st filled. */
static int cgc__try_start(cgc__run *run, cgc__part *pt, int r,
                          int64_t deadline_ms, cgc_status *st) {
  cgc_channel *ch = run->ch;
  const cgc__plan *plan = run->plan;
  cgc__ptry *t = &pt->tries[pt->ntries];
  void *data[CG_GRAD_COUNT] = {NULL};
  size_t cap[CG_GRAD_COUNT] = {0};
  if (posix_memalign(&t->buf, 64,
                     plan->part_out_bytes ? plan->part_out_bytes : 64) != 0) {
    t->buf = NULL;
    cgc__status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED,
                    "out of memory for a part's %zu-byte outputs",
                    plan->part_out_bytes);
    return CG_ENOMEM;
  }
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    if (plan->wants & CG_GRAD_BIT(g)) {
      data[g] = (char *)t->buf + plan->off[g];
      cap[g] = g == CG_GRAD_DIFF_SRC ? plan->layer.out_bytes[g] /
                                           (size_t)plan->mb * (size_t)pt->rows
                                     : plan->layer.out_bytes[g];
    }
  pt->req.deadline_ms = deadline_ms > 0 ? deadline_ms : 1;
  int rc = cgc_call_start_notify(ch->replicas[r].ch, &pt->req, data, cap,
                                 cgc__on_try_end, run, &t->call, st);
  if (rc) {
    free(t->buf);
    t->buf = NULL;
    return rc;
  }
  t->replica = r;
  t->t0 = cgc__now_ms();
  ch->replicas[r].outstanding++;
  ch->stats->parts += pt->ntries == 0;
  pt->ntries++;
  pt->live++;
  return 0;
}

/* Cancels the attempts of pt still running and finishes them, so that
 * none outlives the call (they borrow its request and the caller's
 * inputs). The server counts each as CANCELLED. split_mu held; released
 * while waiting. */
static void cgc__give_up(cgc_channel *ch, cgc__part *pt) {
  for (int i = 0; i < pt->ntries; i++) {
    cgc__ptry *t = &pt->tries[i];
    if (!t->call)
      continue;
    cgc_call *call = t->call;
    t->call = NULL;
    pt->live--;
    pthread_mutex_unlock(&ch->split_mu);
    cgc_tensor out[CG_GRAD_COUNT];
    cgc__call_cancel(call);
    cgc_call_finish(call, out, NULL, NULL);
    pthread_mutex_lock(&ch->split_mu);
    ch->replicas[t->replica].outstanding--;
    free(t->buf);
    t->buf = NULL;
  }
}

/* 1 for a failure another replica may not have: the replica's own
 * (down, restarted, busy, broken), never the request's. */
static int cgc__retryable(int rc, const cgc_status *st) {
  if (rc != CGC_ERPC)
    return 0;
  switch (st->code) {
  case GRPC_STATUS_UNAVAILABLE:
  case GRPC_STATUS_UNKNOWN:
  case GRPC_STATUS_ABORTED:
  case GRPC_STATUS_INTERNAL:
  case GRPC_STATUS_CANCELLED:
  case GRPC_STATUS_DATA_LOSS:
    return 1;
  default:
    return 0;
  }
}

/* Ends attempt i of part pt, which is done; split_mu held. */
static void cgc__try_end(cgc__run *run, cgc__part *pt, int i) {
  cgc_channel *ch = run->ch;
  cgc__ptry *t = &pt->tries[i];
  cgc_tensor out[CG_GRAD_COUNT];
  cgc_result res;
  cgc_status st;
  double now = cgc__now_ms();
  pthread_mutex_unlock(&ch->split_mu);
  int rc = cgc_call_finish(t->call, out, &res, &st);
  pthread_mutex_lock(&ch->split_mu);
  t->call = NULL;
  pt->live--;
  cgc__replica *r = &ch->replicas[t->replica];
  r->outstanding--;
  if (rc == 0) {
    cgc__measure(r, &res, pt->flops);
    cgc__lat *l = cgc__lat_of(ch->stats, pt->key);
    l->ms[l->next] = now - t->t0;
    l->next = (l->next + 1) % CGC__LAT_RING;
    l->n += l->n < CGC__LAT_RING;
    pt->won = i + 1;
    memcpy(pt->out, out, sizeof out);
    pt->res = res;
    run->left--;
    cgc__give_up(ch, pt); /* a hedge or the first, still running */
    return;
  }
  free(t->buf);
  t->buf = NULL;
  if (run->rc)
    return;
  if (cgc__retryable(rc, &st))
    r->down_until_ms = now + CGC__DOWN_MS;
  if (cgc__retryable(rc, &st) && pt->live == 0 && pt->ntries < CGC__TRIES_MAX &&
      now < run->deadline) {
    int to = cgc__pick(ch, pt->flops, pt->bytes, NULL, t->replica, now);
    if (cgc__try_start(run, pt, to, (int64_t)(run->deadline - now), &st) == 0)
      return;
  }
  if (pt->live == 0) { /* nothing left to wait for */
    run->rc = rc;
    run->st = st;
  }
}

/* Sends a backup of pt, which has run past its shape's 95th percentile,
 * to another replica, within the hedge budget; split_mu held. */
static void cgc__maybe_hedge(cgc__run *run, cgc__part *pt, double now) {
  cgc_channel *ch = run->ch;
  struct cgc__split_stats *s = ch->stats;
  if (pt->hedged || pt->won || pt->live != 1 || ch->nreplicas < 2 ||
      pt->ntries >= CGC__TRIES_MAX ||
      (double)(s->hedges + 1) > ch->opts.hedge_budget * (double)s->parts)
    return;
  const cgc__ptry *first = &pt->tries[pt->ntries - 1];
  double after = cgc__hedge_after(s, pt->key);
  if (after < 0 || now - first->t0 < after)
    return;
  int to = cgc__pick(ch, pt->flops, pt->bytes, NULL, first->replica, now);
  cgc_status st;
  if (to != first->replica &&
      cgc__try_start(run, pt, to, (int64_t)(run->deadline - now), &st) == 0) {
    pt->hedged = 1;
    s->hedges++;
  }
}

/* Runs every part to a winner or a permanent failure; split_mu held.
 * Sleeps until an attempt ends, or CGC__POLL_MS for the hedge delays. */
static void cgc__run_parts(cgc__run *run) {
  cgc_channel *ch = run->ch;
  while (run->left > 0 && !run->rc) {
    pthread_mutex_lock(&run->ev_mu);
    unsigned seen = run->ended;
    pthread_mutex_unlock(&run->ev_mu);
    int progressed = 0;
    double now = cgc__now_ms();
    for (int k = 0; k < run->plan->nparts && !run->rc; k++) {
      cgc__part *pt = &run->parts[k];
      for (int i = 0; i < pt->ntries; i++)
        if (pt->tries[i].call && cgc_call_done(pt->tries[i].call)) {
          cgc__try_end(run, pt, i);
          progressed = 1;
        }
      if (ch->opts.hedge_budget > 0)
        cgc__maybe_hedge(run, pt, now);
    }
    if (progressed)
      continue;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_nsec += CGC__POLL_MS * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_unlock(&ch->split_mu);
    pthread_mutex_lock(&run->ev_mu);
    if (run->ended == seen)
      pthread_cond_timedwait(&run->ev, &run->ev_mu, &until);
    pthread_mutex_unlock(&run->ev_mu);
    pthread_mutex_lock(&ch->split_mu);
  }
}

/* ---- putting the parts together ------------------------------------- */

/* diff_weights or diff_bias of every part, summed in part order into dst
 * (n elements of dt): f32 in f32, bf16 and f16 in f32 rounded once. */
static void cgc__sum(const cgc__run *run, int g, cg_dtype dt, size_t n,
                     void *dst) {
  const cgc__plan *plan = run->plan;
  if (dt == CG_DTYPE_F32) {
    float *d = dst;
    memcpy(d, run->parts[0].out[g].data, n * sizeof(float));
    for (int k = 1; k < plan->nparts; k++) {
      const float *s = run->parts[k].out[g].data;
      for (size_t i = 0; i < n; i++)
        d[i] += s[i];
    }
    return;
  }
  for (size_t i = 0; i < n; i++) {
    float acc = cg_load_f32(dt, run->parts[0].out[g].data, i);
    for (int k = 1; k < plan->nparts; k++)
      acc += cg_load_f32(dt, run->parts[k].out[g].data, i);
    cg_store_f32(dt, dst, i, acc);
  }
}

/* The outputs of the parts into out[g]: into[g] when given, else a new
 * allocation. Returns 0 or a CG_E* code with st filled. */
static int cgc__assemble(const cgc__run *run, void *const *into,
                         const size_t *into_cap, cgc_tensor *out[CG_GRAD_COUNT],
                         cgc_status *st) {
  const cgc__plan *plan = run->plan;
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    if (!(plan->wants & CG_GRAD_BIT(g)))
      continue;
    const cgc_tensor *first = &run->parts[0].out[g];
    size_t n = plan->layer.out_bytes[g];
    cgc_tensor *t = calloc(1, sizeof *t);
    void *data = into && into[g] ? into[g] : NULL;
    if (data && into_cap[g] < n) {
      free(t);
      cgc__status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED,
                      "%s: the result needs %zu bytes, the buffer holds %zu",
                      cg_grad_name((cg_grad)g), n, into_cap[g]);
      return CG_ELIMIT;
    }
    if (!t || (!data && posix_memalign(&data, 64, (n + 63) & ~(size_t)63))) {
      free(t);
      cgc__status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED,
                      "out of memory for a %zu-byte result", n);
      return CG_ENOMEM;
    }
    *t = *first;
    t->data = data;
    t->nbytes = n;
    out[g] = t;
    if (g == CG_GRAD_DIFF_SRC) {
      /* The minibatch is the outermost dim in NCX and NXC alike. */
      t->dims[0] = plan->mb;
      size_t row = n / (size_t)plan->mb;
      for (int k = 0; k < plan->nparts; k++)
        memcpy((char *)data + row * (size_t)run->parts[k].row0,
               run->parts[k].out[g].data, row * (size_t)run->parts[k].rows);
    } else {
      cgc__sum(run, g, first->dtype, plan->layer.out_elems[g], data);
    }
  }
  return 0;
}

/* The call's figures from its parts': server times summed, the wall
 * time, bytes and attempts of all. */
static void cgc__result(const cgc__run *run, double t0, cgc_result *res) {
  memset(res, 0, sizeof *res);
  *res = run->parts[0].res;
  res->compute_ms = res->queue_ms = 0;
  res->bytes_sent = res->bytes_received = 0;
  res->upload_ms = res->download_ms = 0;
  memset(res->output_compute_ms, 0, sizeof res->output_compute_ms);
  res->attempts = 1; /* and one more for each failover or hedge */
  for (int k = 0; k < run->plan->nparts; k++) {
    const cgc_result *p = &run->parts[k].res;
    res->compute_ms += p->compute_ms;
    res->queue_ms = p->queue_ms > res->queue_ms ? p->queue_ms : res->queue_ms;
    res->bytes_sent += p->bytes_sent;
    res->bytes_received += p->bytes_received;
    for (int g = 0; g < CG_GRAD_COUNT; g++)
      res->output_compute_ms[g] += p->output_compute_ms[g];
    res->attempts += run->parts[k].ntries - 1;
  }
  res->total_ms = cgc__now_ms() - t0;
  snprintf(res->worker, sizeof res->worker, "%d parts", run->plan->nparts);
}

/* A call that goes whole: to the replica that should finish it first, and
 * to another when that one fails it (the ops are pure). */
static int cgc__whole(cgc_channel *ch, const cgc_request *req,
                      void *const *into, const size_t *into_cap,
                      const cgc__plan *plan, cgc_tensor *out[CG_GRAD_COUNT],
                      cgc_result *res, cgc_status *st) {
  double flops = (double)cg_layer_flops(&plan->layer), t_end = 0;
  int rc = 0, avoid = -1;
  cgc_request whole = *req;
  for (int tries = 0; tries < ch->nreplicas; tries++) {
    double now = cgc__now_ms();
    if (tries == 0)
      t_end = now + (double)(req->deadline_ms ? req->deadline_ms
                                              : ch->opts.deadline_ms);
    else if (now >= t_end)
      break;
    whole.deadline_ms = (int64_t)(t_end - now) > 0 ? (int64_t)(t_end - now) : 1;
    pthread_mutex_lock(&ch->split_mu);
    int r = cgc__pick(ch, flops, 0, NULL, avoid, now);
    ch->replicas[r].outstanding++;
    pthread_mutex_unlock(&ch->split_mu);
    cgc_result local;
    rc = cgc__compute(ch->replicas[r].ch, &whole, into, into_cap, out, &local,
                      st);
    pthread_mutex_lock(&ch->split_mu);
    ch->replicas[r].outstanding--;
    if (rc == 0)
      cgc__measure(&ch->replicas[r], &local, flops);
    else if (cgc__retryable(rc, st))
      ch->replicas[r].down_until_ms = cgc__now_ms() + CGC__DOWN_MS;
    pthread_mutex_unlock(&ch->split_mu);
    if (res)
      *res = local;
    if (rc == 0 || !cgc__retryable(rc, st))
      break;
    avoid = r;
  }
  return rc;
}

int cgc__split_compute(cgc_channel *ch, const cgc_request *req,
                       void *const *into, const size_t *into_cap,
                       cgc_tensor *out[CG_GRAD_COUNT], cgc_result *res,
                       cgc_status *st) {
  cgc__plan plan;
  unsigned wants = req->grads ? req->grads : CG_GRADS_ALL;
  if (!cg_op_is_layer(req->op))
    wants = cg_op_outputs_weights(req->op) ? CG_GRAD_BIT(CG_GRAD_DIFF_WEIGHTS)
                                           : CG_GRAD_BIT(CG_GRAD_DIFF_SRC);
  double t0 = cgc__now_ms();
  cgc__plan_of(ch, req, wants, &plan);
  if (plan.nparts < 2)
    return cgc__whole(ch, req, into, into_cap, &plan, out, res, st);

  cgc__run run = {.ch = ch, .plan = &plan, .left = plan.nparts};
  run.parts = calloc((size_t)plan.nparts, sizeof *run.parts);
  if (!run.parts) {
    cgc__status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return CG_ENOMEM;
  }
  run.deadline =
      t0 + (double)(req->deadline_ms ? req->deadline_ms : ch->opts.deadline_ms);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&run.ev, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&run.ev_mu, NULL);
  double finish[CGC__REPLICAS_MAX];
  pthread_mutex_lock(&ch->split_mu);
  for (int k = 0; k < plan.nparts; k++)
    cgc__part_init(&plan, req, k, &run.parts[k]);
  /* The backlog of each replica: its calls in flight, each as a part. */
  for (int i = 0; i < ch->nreplicas; i++)
    finish[i] = ch->replicas[i].outstanding *
                cgc__estimate(&ch->replicas[i], run.parts[0].flops,
                              run.parts[0].bytes, t0);
  for (int k = 0; k < plan.nparts && !run.rc; k++) {
    cgc__part *pt = &run.parts[k];
    int r = cgc__pick(ch, pt->flops, pt->bytes, finish, -1, t0);
    finish[r] += cgc__estimate(&ch->replicas[r], pt->flops, pt->bytes, t0);
    run.rc = cgc__try_start(&run, pt, r, (int64_t)(run.deadline - t0), &run.st);
  }
  cgc__run_parts(&run);
  for (int k = 0; k < plan.nparts; k++)
    cgc__give_up(ch, &run.parts[k]);
  pthread_mutex_unlock(&ch->split_mu);

  int rc = run.rc;
  if (!rc)
    rc = cgc__assemble(&run, into, into_cap, out, &run.st);
  if (rc) {
    for (int g = 0; g < CG_GRAD_COUNT; g++) {
      if (out[g] && !(into && into[g]))
        free(out[g]->data);
      free(out[g]);
      out[g] = NULL;
    }
    if (st)
      *st = run.st;
  } else {
    if (res)
      cgc__result(&run, t0, res);
    cgc__status_ok(st);
  }
  for (int k = 0; k < plan.nparts; k++)
    for (int i = 0; i < run.parts[k].ntries; i++)
      free(run.parts[k].tries[i].buf);
  free(run.parts);
  pthread_cond_destroy(&run.ev);
  pthread_mutex_destroy(&run.ev_mu);
  return rc;
}
