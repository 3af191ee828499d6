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
 * How the cut is decided (client/README.md, "Replicas"): the number of
 * parts of a shape is chosen from the replicas' measured speeds and link
 * the first time the channel sees it, and kept (split_parts fixes it), so
 * the sums, and the result, are the same bits from call to call. Timing
 * decides which replica computes which part. Every attempt of a part
 * writes into buffers of its own, so that a backup and the attempt it
 * races never write into the same bytes. */
#include <math.h>
#include <signal.h>
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
/* Speed and link assumed of a replica not measured yet (or not lately). */
#define CGC__GUESS_MS_PER_GFLOP 10.0
#define CGC__GUESS_BYTES_PER_MS 1e6
/* The parts' tensors repeated in every part (the weights up, diff_weights
 * and diff_bias down) may add at most this share of the call's bytes. */
#define CGC__REPEAT_SHARE 0.25
/* A replica that failed a part is not picked for this long while another
 * is up: what gRPC's outlier detection does, which Debian's gRPC 1.51
 * has only for its xDS policies. */
#define CGC__DOWN_MS 1000.0
/* A replica a split call leaves out, its speed measured over this long
 * ago, gets a copy of one of the call's parts (a probe, paid from the
 * hedge budget): whether it is still slow, without a caller waiting on
 * it. */
#define CGC__STALE_MS 2000.0
/* Parts of a call at most, when split_parts does not say. */
#define CGC__AUTO_PARTS 8
/* Backups in hand at most: hedge_budget's share of this many parts. */
#define CGC__HEDGE_WINDOW 40.0
/* A part gets no backup on a replica known this many times slower, until
 * it has run this many times that replica's estimate. */
#define CGC__HEDGE_SLOWER 2.0
/* What a part costs beside its bytes and flops, in ms: a call's header
 * and status each way, the server's queue hop. */
#define CGC__PART_MS 1.0
/* One part more is taken only when it should end the call this share
 * sooner than the best cut with fewer. */
#define CGC__PIPE_GAIN 0.05
/* Attempts of one part: the first, failovers, one hedge. */
#define CGC__TRIES_MAX 4
/* Latencies a shape needs before its parts get backups. */
#define CGC__LAT_MIN 8
typedef struct cgc__part cgc__part;

/* One attempt of a part. */
typedef struct cgc__part_try {
  cgc_call *call; /* NULL once finished */
  cgc__split *split;
  cgc__part *part;
  int replica;
  double t0;
  void *buf; /* every output of the part, one allocation, owned */
  int probe; /* a copy sent to a replica given no part (cgc__probe) */
  /* Told by the replica's engine thread, under the stats' ev_mu. */
  unsigned whole;
  int ended;
} cgc__ptry;

struct cgc__part {
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
  double hedge_not_before; /* a backup refused for now: due again then */
  int src_placed;          /* its diff_src rows are in the call's diff_src */
  /* The replica picked for it, and the part before it there, whose
   * upload it waits for (-1: none, it starts with the call). */
  int replica, after;
  int sent; /* its request is all sent (an attempt's, or it ended) */
  cgc_tensor out[CG_GRAD_COUNT];
  cgc_result res;
};

/* The bytes a call moves, whole or in k parts: what a whole call sends
 * (its inputs not staged), the data inputs every part sends a share of
 * (a part sends a staged one's bytes: its id names the whole tensor), the
 * inputs each part repeats (the weights, unless staged), diff_src and the
 * outputs every part repeats (diff_weights, diff_bias). */
typedef struct cgc__bytes {
  size_t up_whole, up_data, up_repeat, down_data, down_repeat;
  size_t up_whole_data; /* what of up_whole is data inputs */
} cgc__bytes;

/* What a split call knows of its request. */
typedef struct cgc__plan {
  cg_layer layer;
  unsigned wants;
  int64_t mb;
  int data_in[3];            /* 1 for the inputs cut along the minibatch */
  size_t off[CG_GRAD_COUNT]; /* each output's place in a part's buffer */
  size_t part_out_bytes;     /* the largest part's buffer */
  cgc__bytes bytes;          /* what the call moves, whole or in parts */
  int nparts;
} cgc__plan;

/* ---- replicas -------------------------------------------------------- */

/* Replica r's measured speed (ms per GFLOP) and link (bytes per ms), or
 * the guesses while unmeasured. A replica measured slow stays so until it
 * measures otherwise: a probe (CGC__STALE_MS) or a call it is given when
 * the others are busier. split_mu held. */
static void cgc__speeds(const cgc__replica *r, double *ms_gf, double *link) {
  *ms_gf = r->ms_per_gflop > 0 ? r->ms_per_gflop : CGC__GUESS_MS_PER_GFLOP;
  *link = r->bytes_per_ms > 0 ? r->bytes_per_ms : CGC__GUESS_BYTES_PER_MS;
}

static double cgc__estimate(const cgc__replica *r, double flops, size_t bytes) {
  double ms_gf, link;
  cgc__speeds(r, &ms_gf, &link);
  return flops / 1e9 * ms_gf + (double)bytes / link;
}

/* The replica to send work of flops and bytes to: the one that should
 * finish it first, each call in flight counting as one more of this work,
 * among the replicas up, or among all when none is up; never avoid unless
 * it is the only one. split_mu held. */
static int cgc__pick(cgc_channel *ch, double flops, size_t bytes, int avoid,
                     double now) {
  int best = -1;
  double best_t = 0;
  for (int pass = 0; pass < 2 && best < 0; pass++)
    for (int i = 0; i < ch->nreplicas; i++) {
      const cgc__replica *r = &ch->replicas[i];
      if ((pass == 0 && r->down_until_ms > now) ||
          (i == avoid && ch->nreplicas > 1))
        continue;
      double t = cgc__estimate(r, flops, bytes) * (1 + r->outstanding);
      if (best < 0 || t < best_t) {
        best = i;
        best_t = t;
      }
    }
  return best < 0 ? 0 : best;
}

/* The server's speed (ms per GFLOP) and the link's (bytes per ms) one
 * successful call of work flops measured; 0 where it tells nothing: the
 * server's compute over the flops, the bytes over the rest of the call's
 * time that was not the server's. */
static void cgc__speeds_of(const cgc_result *res, double flops, double *ms_gf,
                           double *link) {
  *ms_gf =
      flops > 0 && res->compute_ms > 0 ? res->compute_ms / (flops / 1e9) : 0;
  double wire = res->total_ms - res->queue_ms - res->compute_ms;
  uint64_t bytes = res->bytes_sent + res->bytes_received;
  *link = bytes > 0 && wire > 0.01 ? (double)bytes / wire : 0;
}

static int cgc__cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Takes fig (ms per GFLOP) as replica r's latest compute figure: its
 * speed is the median of its last three (the lower of two), so that one
 * figure alone neither leaves it out (a stall of the machine) nor brings
 * it back (a replica under a CPU quota computes at full speed in bursts:
 * a probe wins one, and it is throttled under the next parts it gets).
 * split_mu held. */
static void cgc__figure(cgc__replica *r, double fig) {
  r->figs[r->next_fig] = fig;
  r->next_fig = (r->next_fig + 1) % 3;
  r->nfigs += r->nfigs < 3;
  double v[3];
  memcpy(v, r->figs, sizeof(double) * (size_t)r->nfigs);
  qsort(v, (size_t)r->nfigs, sizeof v[0], cgc__cmp_double);
  r->ms_per_gflop = v[(r->nfigs - 1) / 2];
}

/* Folds what a successful attempt of shape key measured into replica r
 * (cgc__figure); split_mu held. The first answer of a shape the replica has not
 * answered lately counts nothing: it built the shape's kernels inside it (a
 * part of res2a: 133 ms, then 31 at load 9), and a replica left out for that
 * figure would be measured again only by a probe. */
static void cgc__measure(cgc__replica *r, const cgc_result *res, double flops,
                         uint64_t key) {
  int seen = 0;
  r->stuck = 0;
  for (int i = 0; i < CGC__REPLICA_SHAPES && !seen; i++)
    seen = r->shapes[i] == key;
  if (!seen) {
    r->shapes[r->shapes_next] = key;
    r->shapes_next = (r->shapes_next + 1) % CGC__REPLICA_SHAPES;
    return;
  }
  double ms_gf, link;
  cgc__speeds_of(res, flops, &ms_gf, &link);
  if (ms_gf > 0)
    cgc__figure(r, ms_gf);
  if (link > 0)
    r->bytes_per_ms =
        r->bytes_per_ms > 0
            ? r->bytes_per_ms + CGC__EWMA * (link - r->bytes_per_ms)
            : link;
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

/* What the cut model knows of a replica: its compute ms per GFLOP, its
 * link's bytes per ms, and the parts (or calls) it has in flight, ahead
 * of a new one in its pipeline. */
typedef struct cgc__speed {
  double ms_gf, link;
  int busy;
} cgc__speed;

/* The milliseconds a call of work flops and bytes b should take in k
 * equal parts over n replicas of speeds sp: the parts go one by one to the
 * replica that should finish them first, as cgc__split_begin sends them, and
 * the parts of one replica are a pipeline of three stages (a part's upload, its
 * compute, its download), which takes the sum of one part's stages and, for
 * each part after the first, its slowest, plus CGC__PART_MS a part. The
 * trainer's link is one, whatever the replicas: every part's upload passes it,
 * and every download, at the fastest link. With one replica (n = 1, the
 * caller's share) this is that server's pipeline. to (may be NULL) gets the
 * replica of each part. */
static double cgc__cut_ms(const cgc__speed *sp, int n, double flops,
                          const cgc__bytes *b, int k, int *to) {
  double up = k == 1 ? (double)b->up_whole
                     : (double)b->up_data / k + (double)b->up_repeat;
  double down = (double)b->down_data / k + (double)b->down_repeat;
  double one[CGC__REPLICAS_MAX], stage[CGC__REPLICAS_MAX], link_max = 0;
  int parts[CGC__REPLICAS_MAX];
  for (int i = 0; i < n; i++)
    link_max = sp[i].link > link_max ? sp[i].link : link_max;
  double u = up / link_max, d = down / link_max;
  for (int i = 0; i < n; i++) {
    parts[i] = sp[i].busy;
    double c = flops / 1e9 * sp[i].ms_gf / k;
    one[i] = u + c + d + CGC__PART_MS;
    stage[i] = u > c ? (u > d ? u : d) : (c > d ? c : d);
  }
  double makespan = 0;
  for (int part = 0; part < k; part++) {
    int best = 0;
    double best_t = 0;
    for (int i = 0; i < n; i++) {
      double t = one[i] + parts[i] * (stage[i] + CGC__PART_MS);
      if (i == 0 || t < best_t) {
        best = i;
        best_t = t;
      }
    }
    parts[best]++;
    makespan = best_t > makespan ? best_t : makespan;
    if (to)
      to[part] = best;
  }
  double uploads = (k * up + down) / link_max;
  double downloads = (up + k * down) / link_max;
  double shared = uploads > downloads ? uploads : downloads;
  return makespan > shared ? makespan : shared;
}

/* The ms of the best cut over sp (cgc__cut_ms) of at most kmax parts,
 * its parts into *parts: one part more only for a gain of
 * CGC__PIPE_GAIN. */
static double cgc__cut_best(const cgc__speed *sp, int n, double flops,
                            const cgc__bytes *b, int kmax, int *parts) {
  double best_t = 0;
  *parts = 1;
  for (int k = 1; k <= kmax; k++) {
    double t = cgc__cut_ms(sp, n, flops, b, k, NULL);
    if (k == 1 || t < (1 - CGC__PIPE_GAIN) * best_t) {
      *parts = k;
      best_t = t;
    }
  }
  return best_t;
}

/* The speeds of ch's replicas up, or of all when none is, into sp (with
 * their calls in flight when busy, else none), and which replica each
 * is into idx (may be NULL); returns how many. split_mu held. */
static int cgc__speeds_up(const cgc_channel *ch, double now, int busy,
                          cgc__speed *sp, int *idx) {
  int any_up = 0, n = 0;
  for (int i = 0; i < ch->nreplicas; i++)
    any_up |= ch->replicas[i].down_until_ms <= now;
  for (int i = 0; i < ch->nreplicas; i++)
    if (!any_up || ch->replicas[i].down_until_ms <= now) {
      cgc__speeds(&ch->replicas[i], &sp[n].ms_gf, &sp[n].link);
      sp[n].busy = busy ? ch->replicas[i].outstanding : 0;
      if (idx)
        idx[n] = i;
      n++;
    }
  return n;
}

/* The parts of req on ch, at most kmax: the k that should end the call
 * soonest (cgc__cut_ms; one part more only for a gain of CGC__PIPE_GAIN),
 * chosen the first time the channel sees req's shape (and which of its
 * inputs are staged) and kept for it, so that the cut, and so the
 * result's bits, stay the same from call to call while the measured
 * speeds and links move. */
static int cgc__auto_cut(cgc_channel *ch, const cgc_request *req, double flops,
                         const cgc__bytes *b, int kmax) {
  uint64_t key = cgc__shape_key(req);
  for (int i = 0; i < 3; i++)
    if (req->inputs[i].staged)
      key ^= (uint64_t)(i + 1) << 40;
  key |= 1;
  cgc__cut *cuts = ch->stats->cuts, *c = NULL, *free_slot = NULL;
  pthread_mutex_lock(&ch->split_mu);
  for (int i = 0; i < CGC__CUTS && !c; i++) {
    if (cuts[i].key == key)
      c = &cuts[i];
    else if (!cuts[i].key && !free_slot)
      free_slot = &cuts[i];
  }
  if (!c) { /* a new shape, or one forgotten: the one the key hashes to */
    c = free_slot ? free_slot : &cuts[key % CGC__CUTS];
    c->key = key;
    cgc__speed sp[CGC__REPLICAS_MAX];
    int n = cgc__speeds_up(ch, cgc__now_ms(), 0, sp, NULL);
    cgc__cut_best(sp, n, flops, b, kmax, &c->nparts);
  }
  int n = c->nparts < kmax ? c->nparts : kmax;
  pthread_mutex_unlock(&ch->split_mu);
  return n;
}

/* The bytes of req (plan's layer, wants and data_in filled) in b. */
static void cgc__bytes_of(const cgc_request *req, const cgc__plan *plan,
                          cgc__bytes *b) {
  const cg_layer *l = &plan->layer;
  int nin = cg_op_is_layer(req->op) ? 3 : 2;
  memset(b, 0, sizeof *b);
  for (int i = 0; i < nin; i++) {
    int staged = req->inputs[i].staged != NULL;
    b->up_whole += staged ? 0 : l->in_bytes[i];
    b->up_whole_data += staged || !plan->data_in[i] ? 0 : l->in_bytes[i];
    *(plan->data_in[i] ? &b->up_data : &b->up_repeat) +=
        staged && !plan->data_in[i] ? 0 : l->in_bytes[i];
  }
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    if (plan->wants & CG_GRAD_BIT(g))
      *(g == CG_GRAD_DIFF_SRC ? &b->down_data : &b->down_repeat) +=
          l->out_bytes[g];
}

static double cgc__min_part_flops(const cgc_channel *ch) {
  return ch->opts.split_min_flops ? (double)ch->opts.split_min_flops
                                  : CGC__MIN_PART_FLOPS;
}

/* Fills plan's layer, wants, data_in and mb for req, as one part.
 * Returns 0, or -1 for a request that does not resolve (the server will
 * say what is wrong). */
static int cgc__plan_layer(const cgc_request *req, unsigned wants,
                           cgc__plan *plan) {
  memset(plan, 0, sizeof *plan);
  plan->nparts = 1;
  plan->wants = wants;
  int layer = cg_op_is_layer(req->op);
  int nin = layer ? 3 : 2;
  cg_problem p;
  char err[256];
  cgc__request_problem(req, &p);
  if (cg_layer_resolve(&p, &plan->layer, err, sizeof err) != 0)
    return -1;
  /* The inputs that hold the minibatch: data tensors, not weights. */
  int weights_op =
      req->op == CG_OP_CONV_BWD_WEIGHTS || req->op == CG_OP_DECONV_BWD_WEIGHTS;
  for (int i = 0; i < nin; i++)
    plan->data_in[i] = layer ? i < 2 : (weights_op || i == 0);
  plan->mb = req->inputs[0].dims[0];
  return 0;
}

/* Fills plan for req; plan->nparts 1: the call goes whole. */
static void cgc__plan_of(cgc_channel *ch, const cgc_request *req,
                         unsigned wants, cgc__plan *plan) {
  if (cgc__plan_layer(req, wants, plan) != 0)
    return;
  const cg_layer *l = &plan->layer;
  cgc__bytes *b = &plan->bytes;
  cgc__bytes_of(req, plan, b);
  /* As many parts as the model says (unless split_parts fixes the cut):
   * over one replica they pipeline, over several they also share. */
  int automatic = !ch->opts.split_parts;
  int max_parts = automatic ? CGC__AUTO_PARTS : ch->opts.split_parts;
  if (automatic && max_parts < 2 * ch->nreplicas)
    max_parts =
        2 * ch->nreplicas < CGC__PARTS_MAX ? 2 * ch->nreplicas : CGC__PARTS_MAX;
  double min_flops = cgc__min_part_flops(ch);
  double flops = (double)cg_layer_flops(l);
  plan->nparts =
      cgc__nparts(plan->mb, flops, b->up_data + b->down_data,
                  b->up_repeat + b->down_repeat, max_parts, min_flops);
  if (automatic && plan->nparts > 1)
    plan->nparts = cgc__auto_cut(ch, req, flops, b, plan->nparts);
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

/* Part k of plan: rows, request, flops and bytes. */
static void cgc__part_init(const cgc__plan *plan, const cgc_request *req, int k,
                           cgc__part *pt) {
  const cg_layer *l = &plan->layer;
  pt->req = *req;
  pt->req.deadline_ms = 0; /* set when sent */
  pt->key = cgc__shape_key(&pt->req);
  pt->rows = plan->mb;
  pt->flops = (double)cg_layer_flops(l);
  pt->bytes = plan->part_out_bytes;
  for (int i = 0; i < l->ninputs && i < 3; i++)
    pt->bytes += l->in_bytes[i];
  if (plan->nparts == 1) /* the call whole, staged inputs and all */
    return;
  int64_t base = plan->mb / plan->nparts, extra = plan->mb % plan->nparts;
  pt->rows = base + (k < extra);
  pt->row0 = base * k + (k < extra ? k : extra);
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
  pt->flops *= share;
  pt->bytes = 0;
  for (int i = 0; i < l->ninputs && i < 3; i++)
    pt->bytes += plan->data_in[i] ? (size_t)((double)l->in_bytes[i] * share)
                                  : l->in_bytes[i];
  pt->bytes += plan->part_out_bytes;
  pt->key = cgc__shape_key(&pt->req);
}

/* ---- running the parts ---------------------------------------------- */

/* A split call: its plan, its parts, and the caller's buffers its
 * outputs go to. Owned by its cgc_call (cgc__split_ops); once started it
 * is driven by the channel's split thread, under split_mu. */
struct cgc__split {
  cgc_channel *ch;
  cgc__plan plan;
  cgc__part *parts;
  void *dst[CG_GRAD_COUNT]; /* the caller's buffers */
  size_t cap[CG_GRAD_COUNT];
  double t0, deadline; /* cgc__now_ms() clock */
  int left;            /* parts without a winner */
  int src_left;        /* parts whose diff_src rows are not in dst */
  unsigned whole;      /* outputs whole in dst */
  int over;            /* every part won, or the call failed */
  int rc;              /* the first permanent failure */
  cgc_status st;
  cgc_result res;
  cgc_tensor *out[CG_GRAD_COUNT]; /* made at the end, for cgc_call_finish */
  cgc_call *call;
  cgc__split *next; /* in the channel's active list */
  /* Whether the parts' outputs are checked (the call was drawn: every
   * attempt then is), and the attempts whose check failed. */
  cgc__check_mode check;
  int check_failures;
};

/* What a part's call tells, on its replica's engine thread. */
static void cgc__tell(cgc__ptry *t, unsigned whole, int ended) {
  struct cgc__split_stats *s = t->split->ch->stats;
  pthread_mutex_lock(&s->ev_mu);
  t->whole |= whole;
  t->ended |= ended;
  s->events++;
  pthread_cond_signal(&s->ev);
  pthread_mutex_unlock(&s->ev_mu);
}

static void cgc__on_try_whole(cgc_call *c, void *arg, unsigned whole) {
  (void)c;
  cgc__tell(arg, whole, 0);
}

static void cgc__on_try_end(cgc_call *c, void *arg) {
  (void)c;
  cgc__tell(arg, 0, 1);
}

/* Where output g of attempt t of pt lands: the caller's buffer for the
 * first attempt of a call that goes whole (no other attempt runs beside
 * it until it is given up), else the attempt's own buffer. */
static void *cgc__try_out(const cgc__split *s, const cgc__ptry *t, int g) {
  return t->buf ? (char *)t->buf + s->plan.off[g] : s->dst[g];
}

/* Starts an attempt of part pt on replica r, deadline_ms from now.
 * split_mu held. Returns 0 or the start's failure with st filled. */
static int cgc__try_start(cgc__split *s, cgc__part *pt, int r,
                          int64_t deadline_ms, cgc_status *st) {
  cgc_channel *ch = s->ch;
  const cgc__plan *plan = &s->plan;
  cgc__ptry *t = &pt->tries[pt->ntries];
  void *data[CG_GRAD_COUNT] = {NULL};
  size_t cap[CG_GRAD_COUNT] = {0};
  memset(t, 0, sizeof *t);
  t->split = s;
  t->part = pt;
  if ((plan->nparts > 1 || pt->ntries > 0) &&
      posix_memalign(&t->buf, 64,
                     plan->part_out_bytes ? plan->part_out_bytes : 64) != 0) {
    t->buf = NULL;
    cgc__status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED,
                    "out of memory for a part's %zu-byte outputs",
                    plan->part_out_bytes);
    return CG_ENOMEM;
  }
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    if (plan->wants & CG_GRAD_BIT(g)) {
      data[g] = cgc__try_out(s, t, g);
      if (!t->buf)
        cap[g] = s->cap[g];
      else if (g == CG_GRAD_DIFF_SRC && plan->nparts > 1)
        cap[g] = plan->layer.out_bytes[g] / (size_t)plan->mb * (size_t)pt->rows;
      else
        cap[g] = plan->layer.out_bytes[g];
    }
  pt->req.deadline_ms = deadline_ms > 0 ? deadline_ms : 1;
  int rc = cgc__call_start(ch->replicas[r].ch, &pt->req, data, cap, s->check,
                           cgc__on_try_whole, cgc__on_try_end, t, &t->call, st);
  if (rc) {
    free(t->buf);
    t->buf = NULL;
    return rc;
  }
  t->replica = r;
  t->t0 = cgc__now_ms();
  ch->replicas[r].outstanding++;
  if (pt->ntries == 0) { /* a part first sent earns hedge_budget */
    double most = fmax(ch->opts.hedge_budget * CGC__HEDGE_WINDOW, 1);
    double *tokens = &ch->stats->hedge_tokens;
    *tokens = fmin(*tokens + ch->opts.hedge_budget, most);
  }
  pt->ntries++;
  pt->live++;
  pt->hedge_not_before = 0; /* the new attempt's own */
  return 0;
}

/* Cancels the attempts of pt still running and finishes them, so that
 * none outlives the call (they borrow its request, the caller's inputs
 * and maybe its buffers). The server counts each as CANCELLED. An attempt
 * overtaken by a copy started after it (a part that lost to its backup)
 * had not done this part, and the others it had in flight, in more time
 * than the copy took: its replica gets a figure of at least twice that (a
 * straggler's expected remaining time is at least what it has used), and
 * with another such figure, or a slow compute, it is left out while the
 * others are faster (cgc__figure). A copy that lost to one
 * started before it (a backup sent late, a probe) had less time than the
 * winner took, which tells nothing of its replica; nor does a part that
 * lost to a probe (the last part of the call, queued behind the others
 * on its replica, against a copy on an idle one). A replica overtaken so
 * gets no backup until it answers again (stuck): its figure is only a
 * lower bound, which a replica slowed down by its machine's load can
 * approach, and a backup there would race a copy that answers with one
 * that may never; a probe finds out whether it still is. split_mu held;
 * released while waiting. */
static void cgc__give_up(cgc_channel *ch, cgc__part *pt) {
  for (int i = 0; i < pt->ntries; i++) {
    cgc__ptry *t = &pt->tries[i];
    if (!t->call)
      continue;
    cgc__replica *r = &ch->replicas[t->replica];
    const cgc__ptry *w = pt->won ? &pt->tries[pt->won - 1] : NULL;
    if (w && !w->probe && t->t0 <= w->t0 && pt->flops > 0) {
      double now = cgc__now_ms();
      double gflops =
          pt->flops / 1e9 * (r->outstanding > 1 ? r->outstanding : 1);
      cgc__figure(r, fmax(r->ms_per_gflop, 2 * (now - t->t0) / gflops));
      r->measured_ms = now;
      r->stuck = 1;
    }
    cgc_call *call = t->call;
    t->call = NULL;
    pt->live--;
    pthread_mutex_unlock(&ch->split_mu);
    cgc_tensor out[CG_GRAD_COUNT];
    cgc__call_cancel(call);
    cgc_call_finish(call, out, NULL, NULL);
    pthread_mutex_lock(&ch->split_mu);
    r->outstanding--;
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

/* Part pt's diff_src rows, whole in attempt t, into the caller's
 * diff_src (once: they are final from then on); the call's diff_src is
 * whole once every part's is. split_mu held. */
static void cgc__place_src(cgc__split *s, cgc__part *pt, const cgc__ptry *t) {
  const int g = CG_GRAD_DIFF_SRC;
  size_t row = s->plan.mb ? s->plan.layer.out_bytes[g] / (size_t)s->plan.mb : 0;
  void *to = (char *)s->dst[g] + row * (size_t)pt->row0;
  const void *from = cgc__try_out(s, t, g);
  if (from != to)
    memcpy(to, from, row * (size_t)pt->rows);
  pt->src_placed = 1;
  if (--s->src_left == 0) {
    s->whole |= CG_GRAD_BIT(g);
    cgc__call_whole(s->call, s->whole);
  }
}

/* Ends attempt i of part pt, which is done; split_mu held, released
 * while it is finished. */
static void cgc__try_end(cgc__split *s, cgc__part *pt, int i) {
  cgc_channel *ch = s->ch;
  cgc__ptry *t = &pt->tries[i];
  cgc_tensor out[CG_GRAD_COUNT];
  cgc_result res;
  cgc_status st;
  double now = cgc__now_ms();
  cgc_call *call = t->call;
  t->call = NULL;
  pt->live--;
  pthread_mutex_unlock(&ch->split_mu);
  int rc = cgc_call_finish(call, out, &res, &st);
  pthread_mutex_lock(&ch->split_mu);
  cgc__replica *r = &ch->replicas[t->replica];
  r->outstanding--;
  if (rc == 0) {
    cgc__measure(r, &res, pt->flops, pt->key);
    cgc__lat *l = cgc__lat_of(ch->stats, pt->key);
    l->ms[l->next] = now - t->t0;
    l->next = (l->next + 1) % CGC__LAT_RING;
    l->n += l->n < CGC__LAT_RING;
    pt->won = i + 1;
    memcpy(pt->out, out, sizeof out);
    pt->res = res;
    s->left--;
    cgc__give_up(ch, pt); /* a hedge or the first, still running */
    if ((s->plan.wants & CG_GRAD_BIT(CG_GRAD_DIFF_SRC)) && !pt->src_placed)
      cgc__place_src(s, pt, t);
    return;
  }
  s->check_failures += cgc__verify_failure(rc, &st);
  if (s->rc)
    return;
  if (cgc__retryable(rc, &st))
    r->down_until_ms = now + CGC__DOWN_MS;
  if (cgc__retryable(rc, &st) && pt->live == 0 && pt->ntries < CGC__TRIES_MAX &&
      now < s->deadline) {
    int to = cgc__pick(ch, pt->flops, pt->bytes, t->replica, now);
    if (cgc__try_start(s, pt, to, (int64_t)(s->deadline - now), &st) == 0)
      return;
  }
  if (pt->live == 0) { /* nothing left to wait for */
    s->rc = rc;
    s->st = st;
  }
}

/* 1 when part pt may get a backup: one attempt running, none won, the
 * budget not spent. split_mu held. */
static int cgc__may_hedge(const cgc__split *s, const cgc__part *pt) {
  const cgc_channel *ch = s->ch;
  const struct cgc__split_stats *ss = ch->stats;
  return ch->opts.hedge_budget > 0 && !pt->hedged && !pt->won &&
         pt->live == 1 && ch->nreplicas > 1 && pt->ntries < CGC__TRIES_MAX &&
         ss->hedge_tokens >= 1;
}

/* When pt should get a backup (cgc__now_ms() clock), or INFINITY. */
static double cgc__hedge_at(cgc__split *s, const cgc__part *pt) {
  if (!cgc__may_hedge(s, pt))
    return INFINITY;
  double after = cgc__hedge_after(s->ch->stats, pt->key);
  return after < 0
             ? INFINITY
             : fmax(pt->tries[pt->ntries - 1].t0 + after, pt->hedge_not_before);
}

/* Sends a backup of pt, which has run past its shape's 95th percentile,
 * to another replica, within the hedge budget. None goes to a stuck
 * replica (cgc__give_up). None goes yet to one known CGC__HEDGE_SLOWER
 * times slower than pt's, which would not answer sooner, until pt has
 * run CGC__HEDGE_SLOWER times that one's estimate: a replica whose
 * figures looked fast can stall (a stopped process), and its part must
 * not wait for the call's deadline. split_mu held. */
static void cgc__maybe_hedge(cgc__split *s, cgc__part *pt, double now) {
  if (now < cgc__hedge_at(s, pt))
    return;
  cgc_channel *ch = s->ch;
  const cgc__ptry *first = &pt->tries[pt->ntries - 1];
  int to = cgc__pick(ch, pt->flops, pt->bytes, first->replica, now);
  if (ch->replicas[to].stuck) { /* until it answers: another delay */
    pt->hedge_not_before = now + cgc__hedge_after(ch->stats, pt->key);
    return;
  }
  double other = cgc__estimate(&ch->replicas[to], pt->flops, pt->bytes);
  if (other > CGC__HEDGE_SLOWER * cgc__estimate(&ch->replicas[first->replica],
                                                pt->flops, pt->bytes) &&
      now - first->t0 < CGC__HEDGE_SLOWER * other) {
    pt->hedge_not_before = first->t0 + CGC__HEDGE_SLOWER * other;
    return;
  }
  cgc_status st;
  if (to != first->replica &&
      cgc__try_start(s, pt, to, (int64_t)(s->deadline - now), &st) == 0) {
    pt->hedged = 1;
    ch->stats->hedge_tokens -= 1;
  }
}

/* Takes in what the parts' calls told since the last step: diff_src rows
 * placed, ended attempts finished (failovers started), backups sent.
 * Returns 1 once every part has won or the call failed. split_mu held,
 * released while attempts are finished. */
static int cgc__step(cgc__split *s, double now) {
  struct cgc__split_stats *ss = s->ch->stats;
  int src = (s->plan.wants & CG_GRAD_BIT(CG_GRAD_DIFF_SRC)) != 0;
  for (int k = 0; k < s->plan.nparts && !s->rc; k++) {
    cgc__part *pt = &s->parts[k];
    for (int i = 0; i < pt->ntries && !s->rc; i++) {
      cgc__ptry *t = &pt->tries[i];
      if (!t->call)
        continue;
      pthread_mutex_lock(&ss->ev_mu);
      unsigned whole = t->whole;
      int ended = t->ended;
      pthread_mutex_unlock(&ss->ev_mu);
      pt->sent |= ended || whole != 0;
      if (src && !pt->src_placed && (whole & CG_GRAD_BIT(CG_GRAD_DIFF_SRC)))
        cgc__place_src(s, pt, t);
      if (ended)
        cgc__try_end(s, pt, i);
    }
    if (!s->rc && pt->ntries == 0 && pt->after >= 0 &&
        s->parts[pt->after].sent) {
      cgc_status st;
      int rc =
          cgc__try_start(s, pt, pt->replica, (int64_t)(s->deadline - now), &st);
      if (rc) {
        s->rc = rc;
        s->st = st;
      }
    }
    if (!s->rc)
      cgc__maybe_hedge(s, pt, now);
  }
  return s->rc || s->left == 0;
}

/* The earliest backup any part of s is due, or INFINITY. */
static double cgc__next_hedge(cgc__split *s) {
  double at = INFINITY;
  for (int k = 0; k < s->plan.nparts; k++) {
    double h = cgc__hedge_at(s, &s->parts[k]);
    at = h < at ? h : at;
  }
  return at;
}

/* ---- putting the parts together ------------------------------------- */

/* diff_weights or diff_bias of every part, summed in part order into dst
 * (n elements of dt): f32 in f32, bf16 and f16 in f32 rounded once. */
static void cgc__sum(const cgc__split *s, int g, cg_dtype dt, size_t n,
                     void *dst) {
  const cgc__plan *plan = &s->plan;
  if (dt == CG_DTYPE_F32) {
    float *d = dst;
    memcpy(d, s->parts[0].out[g].data, n * sizeof(float));
    for (int k = 1; k < plan->nparts; k++) {
      const float *src = s->parts[k].out[g].data;
      for (size_t i = 0; i < n; i++)
        d[i] += src[i];
    }
    return;
  }
  for (size_t i = 0; i < n; i++) {
    float acc = cg_load_f32(dt, s->parts[0].out[g].data, i);
    for (int k = 1; k < plan->nparts; k++)
      acc += cg_load_f32(dt, s->parts[k].out[g].data, i);
    cg_store_f32(dt, dst, i, acc);
  }
}

/* The outputs of the parts into the caller's buffers and s->out (diff_src
 * is there already). Returns 0 or CG_ENOMEM with st filled. */
static int cgc__assemble(cgc__split *s, cgc_status *st) {
  const cgc__plan *plan = &s->plan;
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    if (!(plan->wants & CG_GRAD_BIT(g)))
      continue;
    const cgc_tensor *first = &s->parts[0].out[g];
    size_t n = plan->nparts > 1 ? plan->layer.out_bytes[g] : first->nbytes;
    cgc_tensor *t = calloc(1, sizeof *t);
    if (!t) {
      cgc__status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      return CG_ENOMEM;
    }
    *t = *first;
    t->data = s->dst[g];
    t->nbytes = n;
    s->out[g] = t;
    if (g == CG_GRAD_DIFF_SRC) {
      if (plan->nparts > 1) /* the outermost dim in NCX and NXC alike */
        t->dims[0] = plan->mb;
    } else if (plan->nparts > 1)
      cgc__sum(s, g, first->dtype, plan->layer.out_elems[g], s->dst[g]);
    else if (first->data != s->dst[g])
      memcpy(s->dst[g], first->data, n);
  }
  return 0;
}

/* The call's figures from its parts': server times summed, the wall
 * time, bytes and attempts of all. */
static void cgc__result(cgc__split *s) {
  cgc_result *res = &s->res;
  *res = s->parts[0].res;
  res->compute_ms = res->queue_ms = 0;
  res->bytes_sent = res->bytes_received = 0;
  res->upload_ms = res->download_ms = 0;
  memset(res->output_compute_ms, 0, sizeof res->output_compute_ms);
  res->attempts = 1; /* and one more for each failover or hedge */
  for (int k = 0; k < s->plan.nparts; k++) {
    const cgc_result *p = &s->parts[k].res;
    res->compute_ms += p->compute_ms;
    res->queue_ms = p->queue_ms > res->queue_ms ? p->queue_ms : res->queue_ms;
    res->bytes_sent += p->bytes_sent;
    res->bytes_received += p->bytes_received;
    for (int g = 0; g < CG_GRAD_COUNT; g++)
      res->output_compute_ms[g] += p->output_compute_ms[g];
    res->attempts += s->parts[k].ntries - 1;
  }
  res->total_ms = cgc__now_ms() - s->t0;
  if (s->plan.nparts > 1)
    snprintf(res->worker, sizeof res->worker, "%d parts", s->plan.nparts);
}

/* Ends s, over: the attempts still running given up, and on success the
 * outputs put together. split_mu held, released while waiting. */
static void cgc__finish(cgc__split *s) {
  for (int k = 0; k < s->plan.nparts; k++)
    cgc__give_up(s->ch, &s->parts[k]);
  if (!s->rc)
    s->rc = cgc__assemble(s, &s->st);
  if (!s->rc) {
    cgc__result(s);
    cgc__status_ok(&s->st);
    s->whole = s->plan.wants;
  }
  for (int k = 0; k < s->plan.nparts; k++)
    for (int i = 0; i < s->parts[k].ntries; i++) {
      free(s->parts[k].tries[i].buf);
      s->parts[k].tries[i].buf = NULL;
    }
}

/* ---- the split thread ----------------------------------------------- */

/* Drives every split call of ch: takes in what their parts' calls tell,
 * sleeping until one tells more or a backup is due, and ends each call
 * (outside split_mu: its listener may start another) once it is over. */
static void *cgc__driver_main(void *arg) {
  cgc_channel *ch = arg;
  struct cgc__split_stats *ss = ch->stats;
  pthread_mutex_lock(&ch->split_mu);
  while (!ss->stop) {
    pthread_mutex_lock(&ss->ev_mu);
    unsigned seen = ss->events;
    pthread_mutex_unlock(&ss->ev_mu);
    double now = cgc__now_ms(), wake = INFINITY;
    /* Calls started while split_mu is released for a finish join the
     * head of the list: the rest of it stays as it was. */
    for (cgc__split *s = ss->active; s; s = s->next) {
      if (cgc__step(s, now)) {
        cgc__finish(s);
        if (s->check_failures)
          cgc__verify_settled(ch->vf, s->rc);
        s->over = 1;
      } else {
        double h = cgc__next_hedge(s);
        wake = h < wake ? h : wake;
      }
    }
    cgc__split *over = NULL;
    for (cgc__split **pp = &ss->active; *pp;) {
      cgc__split *s = *pp;
      if (!s->over) {
        pp = &s->next;
        continue;
      }
      *pp = s->next;
      s->next = over;
      over = s;
    }
    if (over) {
      pthread_mutex_unlock(&ch->split_mu);
      while (over) {
        cgc__split *s = over;
        over = s->next; /* s is the caller's once told */
        if (!s->rc)
          cgc__call_whole(s->call, s->whole);
        cgc__call_ended(s->call);
      }
      pthread_mutex_lock(&ch->split_mu);
      continue;
    }
    pthread_mutex_unlock(&ch->split_mu);
    pthread_mutex_lock(&ss->ev_mu);
    if (ss->events == seen && !ss->stop) {
      if (isinf(wake)) {
        pthread_cond_wait(&ss->ev, &ss->ev_mu);
      } else {
        struct timespec until;
        cgc__clock_after_ms(CLOCK_MONOTONIC, wake - cgc__now_ms(), &until);
        pthread_cond_timedwait(&ss->ev, &ss->ev_mu, &until);
      }
    }
    pthread_mutex_unlock(&ss->ev_mu);
    pthread_mutex_lock(&ch->split_mu);
  }
  pthread_mutex_unlock(&ch->split_mu);
  return NULL;
}

/* Starts ch's split thread unless it runs; split_mu held. Signals stay
 * with the caller's threads, as with the engine's. */
static int cgc__driver_start(cgc_channel *ch, cgc_status *st) {
  struct cgc__split_stats *ss = ch->stats;
  if (ss->driver_on)
    return 0;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&ss->ev, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&ss->ev_mu, NULL);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&ss->driver, NULL, cgc__driver_main, ch);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    pthread_cond_destroy(&ss->ev);
    pthread_mutex_destroy(&ss->ev_mu);
    cgc__status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED,
                    "cannot start the channel's split thread");
    return CG_ENOMEM;
  }
  pthread_setname_np(ss->driver, "cgc-split");
  ss->driver_on = 1;
  return 0;
}

void cgc__split_close(cgc_channel *ch) {
  struct cgc__split_stats *ss = ch->stats;
  if (!ss || !ss->driver_on)
    return;
  pthread_mutex_lock(&ch->split_mu);
  pthread_mutex_lock(&ss->ev_mu);
  ss->stop = 1;
  pthread_cond_signal(&ss->ev);
  pthread_mutex_unlock(&ss->ev_mu);
  pthread_mutex_unlock(&ch->split_mu);
  pthread_join(ss->driver, NULL);
  pthread_cond_destroy(&ss->ev);
  pthread_mutex_destroy(&ss->ev_mu);
  ss->driver_on = 0;
}

/* ---- starting a split call ------------------------------------------ */

static unsigned cgc__split_wants(const void *obj) {
  return ((const cgc__split *)obj)->plan.wants;
}

static int cgc__split_result(void *obj, cgc_result *res, cgc_status *st) {
  cgc__split *s = obj;
  if (res)
    *res = s->res;
  if (st)
    *st = s->st;
  return s->rc;
}

static void cgc__split_take(void *obj, cgc_tensor *out[CG_GRAD_COUNT]) {
  cgc__split *s = obj;
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    out[g] = s->out[g];
    s->out[g] = NULL;
  }
}

/* Frees s, ended (cgc__finish freed the parts' buffers), or never
 * started. */
static void cgc__split_free(void *obj) {
  cgc__split *s = obj;
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    free(s->out[g]);
  for (int k = 0; k < s->plan.nparts; k++)
    for (int i = 0; i < s->parts[k].ntries; i++)
      free(s->parts[k].tries[i].buf);
  free(s->parts);
  free(s);
}

static const cgc__call_ops cgc__split_ops = {cgc__split_wants,
                                             cgc__split_result, cgc__split_take,
                                             cgc__split_free, NULL};

/* Sends a copy of s's last part (the one its replica should finish last)
 * to each replica s gave no part, that is idle and up, and whose speed
 * was measured over CGC__STALE_MS ago: a replica left out for being slow
 * shows whether it still is without a caller waiting on it (it wins the
 * part if it is fast again; else cgc__give_up bounds its speed). Each
 * probe takes a backup from the hedge budget. split_mu held. */
static void cgc__probe(cgc__split *s, const int *given) {
  cgc_channel *ch = s->ch;
  cgc__part *pt = &s->parts[s->plan.nparts - 1];
  double now = cgc__now_ms();
  for (int i = 0; i < ch->nreplicas; i++) {
    cgc__replica *r = &ch->replicas[i];
    cgc_status st;
    if (given[i] || r->outstanding || r->down_until_ms > now ||
        now - r->measured_ms < CGC__STALE_MS || !cgc__may_hedge(s, pt) ||
        cgc__try_start(s, pt, i, (int64_t)(s->deadline - now), &st) != 0)
      continue;
    pt->tries[pt->ntries - 1].probe = 1;
    pt->hedged = 1;
    ch->stats->hedge_tokens -= 1;
    r->measured_ms = now;
  }
}

/* The bytes a request's inputs send (those not staged). */
static size_t cgc__sent_bytes(const cgc_request *req) {
  size_t n = 0;
  for (int i = 0; i < 3; i++)
    n += req->inputs[i].staged ? 0 : req->inputs[i].nbytes;
  return n;
}

/* Starts the call req of plan, its outputs into dst (cap: the buffers'
 * sizes, NULL when checked to hold them), on ch's split thread: every
 * part sent to the replica that should finish it first. Returns 0 with
 * *out, or a negative code with st filled and nothing running. */
static int cgc__split_begin(cgc_channel *ch, const cgc_request *req,
                            const cgc__plan *plan, cgc__check_mode check,
                            void *const dst[CG_GRAD_COUNT], const size_t *cap,
                            cgc_call_end_fn notify, void *arg, cgc_call **out,
                            cgc_status *st) {
  *out = NULL;
  cgc__split *s = calloc(1, sizeof *s);
  if (s)
    s->parts = calloc((size_t)plan->nparts, sizeof *s->parts);
  if (!s || !s->parts) {
    free(s);
    cgc__status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return CG_ENOMEM;
  }
  s->ch = ch;
  s->plan = *plan;
  s->check = check;
  for (int g = 0; g < CG_GRAD_COUNT; g++) {
    s->dst[g] = dst[g];
    s->cap[g] = cap ? cap[g] : plan->layer.out_bytes[g];
  }
  s->left = s->src_left = plan->nparts;
  s->t0 = cgc__now_ms();
  s->deadline = s->t0 + (double)(req->deadline_ms ? req->deadline_ms
                                                  : ch->opts.deadline_ms);
  pthread_mutex_lock(&ch->split_mu);
  int rc = cgc__driver_start(ch, st);
  for (int k = 0; k < plan->nparts; k++)
    cgc__part_init(plan, req, k, &s->parts[k]);
  /* Each part to the replica that should finish it first, as the cut's
   * model has them (its calls in flight ahead of them): a replica's parts
   * pipeline, one's upload beside another's compute. */
  cgc__speed sp[CGC__REPLICAS_MAX];
  int idx[CGC__REPLICAS_MAX], to[CGC__PARTS_MAX];
  int nsp = cgc__speeds_up(ch, s->t0, 1, sp, idx);
  cgc__cut_ms(sp, nsp, (double)cg_layer_flops(&plan->layer), &plan->bytes,
              plan->nparts, to);
  /* Pipelining over one replica, its parts' uploads go one after the
   * other: sent side by side they would share the link, and the first
   * could start computing only once all were in. A part that fits one
   * message goes at once, and so do the parts of a call over several
   * replicas, as before the wait (with it, bench_pool's split_ratio on
   * loopback measured worse; client/README.md, "Replicas"). */
  size_t one_message =
      ch->opts.upload_chunk_bytes ? ch->opts.upload_chunk_bytes : 1 << 20;
  int last[CGC__REPLICAS_MAX], given[CGC__REPLICAS_MAX] = {0};
  for (int i = 0; i < ch->nreplicas; i++)
    last[i] = -1;
  for (int k = 0; k < plan->nparts && !rc; k++) {
    cgc__part *pt = &s->parts[k];
    int r = idx[to[k]];
    given[r] = 1;
    pt->replica = r;
    pt->after = last[r];
    if (ch->nreplicas == 1 && cgc__sent_bytes(&pt->req) > one_message)
      last[r] = k;
    if (pt->after < 0)
      rc = cgc__try_start(s, pt, r, (int64_t)(s->deadline - s->t0), st);
  }
  if (!rc)
    cgc__probe(s, given);
  if (!rc) {
    s->call = cgc__call_new(&cgc__split_ops, s, NULL, notify, arg);
    if (!s->call) {
      cgc__status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      rc = CG_ENOMEM;
    }
  }
  if (rc) { /* nothing runs on: the parts started are given up */
    for (int k = 0; k < plan->nparts; k++)
      cgc__give_up(ch, &s->parts[k]);
    pthread_mutex_unlock(&ch->split_mu);
    cgc__split_free(s);
    return rc;
  }
  s->next = ch->stats->active;
  ch->stats->active = s;
  pthread_mutex_unlock(&ch->split_mu);
  *out = s->call;
  return 0;
}

/* Whether a call of req on ch is checked (cgc_options.verify_rate): the
 * parent channel draws for the call, and every attempt of its parts
 * (failovers, backups) is then checked on the replicas' channels. */
static cgc__check_mode cgc__check_of(cgc_channel *ch, const cgc_request *req) {
  uint64_t seed; /* the parts' jobs draw their own probes */
  return cgc__verify_pick(ch->vf, req, CGC__CHECK_DRAW, &seed)
             ? CGC__CHECK_ALWAYS
             : CGC__CHECK_NEVER;
}

/* The outputs req asks for. */
static unsigned cgc__wants(const cgc_request *req) {
  if (!cg_op_is_layer(req->op))
    return cg_op_outputs_weights(req->op) ? CG_GRAD_BIT(CG_GRAD_DIFF_WEIGHTS)
                                          : CG_GRAD_BIT(CG_GRAD_DIFF_SRC);
  return req->grads ? req->grads : CG_GRADS_ALL;
}

/* The plan of req on ch: the outputs it asks for, its parts. */
static void cgc__plan_req(cgc_channel *ch, const cgc_request *req,
                          cgc__plan *plan) {
  cgc__plan_of(ch, req, cgc__wants(req), plan);
}

/* 0 when every buffer holds its output, else CG_ELIMIT with st filled. */
static int cgc__check_caps(const cgc__plan *plan, void *const *into,
                           const size_t *cap, cgc_status *st) {
  for (int g = 0; g < CG_GRAD_COUNT; g++)
    if ((plan->wants & CG_GRAD_BIT(g)) && into && into[g] &&
        cap[g] < plan->layer.out_bytes[g]) {
      cgc__status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED,
                      "%s: the result needs %zu bytes, the buffer holds %zu",
                      cg_grad_name((cg_grad)g), plan->layer.out_bytes[g],
                      cap[g]);
      return CG_ELIMIT;
    }
  return 0;
}

int cgc__split_start(cgc_channel *ch, const cgc_request *req,
                     void *const data[CG_GRAD_COUNT],
                     const size_t cap[CG_GRAD_COUNT], cgc_call_end_fn notify,
                     void *arg, cgc_call **out, cgc_status *st) {
  cgc__plan plan;
  cgc__plan_req(ch, req, &plan);
  int rc = cgc__check_caps(&plan, data, cap, st);
  if (!rc)
    rc = cgc__split_begin(ch, req, &plan, cgc__check_of(ch, req), data, cap,
                          notify, arg, out, st);
  return rc;
}

/* A call that goes whole: to the replica that should finish it first, and
 * to another when that one fails it (the ops are pure); with one replica,
 * once more to it after a failed check. On this thread: the hop to the
 * split thread and back would cost it two wake-ups. */
static int cgc__whole(cgc_channel *ch, const cgc_request *req,
                      void *const *into, const size_t *into_cap,
                      const cgc__plan *plan, cgc__check_mode check,
                      cgc_tensor *out[CG_GRAD_COUNT], cgc_result *res,
                      cgc_status *st) {
  double flops = (double)cg_layer_flops(&plan->layer), t_end = 0;
  int rc = 0, avoid = -1, tries_max = ch->nreplicas, check_failures = 0;
  cgc_request whole = *req;
  for (int tries = 0; tries < tries_max; tries++) {
    double now = cgc__now_ms();
    if (tries == 0)
      t_end = now + (double)(req->deadline_ms ? req->deadline_ms
                                              : ch->opts.deadline_ms);
    else if (now >= t_end)
      break;
    whole.deadline_ms = (int64_t)(t_end - now) > 0 ? (int64_t)(t_end - now) : 1;
    pthread_mutex_lock(&ch->split_mu);
    int r = cgc__pick(ch, flops, 0, avoid, now);
    ch->replicas[r].outstanding++;
    pthread_mutex_unlock(&ch->split_mu);
    cgc_result local;
    rc = cgc__compute(ch->replicas[r].ch, &whole, into, into_cap, check, out,
                      &local, st);
    pthread_mutex_lock(&ch->split_mu);
    ch->replicas[r].outstanding--;
    if (rc == 0)
      cgc__measure(&ch->replicas[r], &local, flops, cgc__shape_key(req));
    else if (cgc__retryable(rc, st))
      ch->replicas[r].down_until_ms = cgc__now_ms() + CGC__DOWN_MS;
    pthread_mutex_unlock(&ch->split_mu);
    if (res)
      *res = local;
    if (cgc__verify_failure(rc, st) && check_failures++ == 0 && tries_max < 2)
      tries_max = 2;
    if (rc == 0 || !cgc__retryable(rc, st))
      break;
    avoid = r;
  }
  if (check_failures)
    cgc__verify_settled(ch->vf, rc);
  return rc;
}

int cgc__split_compute(cgc_channel *ch, const cgc_request *req,
                       void *const *into, const size_t *into_cap,
                       cgc_tensor *out[CG_GRAD_COUNT], cgc_result *res,
                       cgc_status *st) {
  cgc__plan plan;
  cgc__plan_req(ch, req, &plan);
  cgc__check_mode check = cgc__check_of(ch, req);
  if (plan.nparts < 2)
    return cgc__whole(ch, req, into, into_cap, &plan, check, out, res, st);
  int rc = cgc__check_caps(&plan, into, into_cap, st);
  if (rc)
    return rc;
  /* Outputs without a caller's buffer get one of their own, handed over
   * with the result. */
  void *dst[CG_GRAD_COUNT] = {NULL};
  unsigned own = 0;
  for (int g = 0; g < CG_GRAD_COUNT && !rc; g++) {
    if (!(plan.wants & CG_GRAD_BIT(g)))
      continue;
    dst[g] = into && into[g] ? into[g] : NULL;
    if (dst[g])
      continue;
    size_t n = plan.layer.out_bytes[g];
    if (posix_memalign(&dst[g], 64, (n + 63) & ~(size_t)63) != 0) {
      dst[g] = NULL;
      cgc__status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED,
                      "out of memory for a %zu-byte result", n);
      rc = CG_ENOMEM;
    }
    own |= CG_GRAD_BIT(g);
  }
  cgc_call *c = NULL;
  cgc_tensor got[CG_GRAD_COUNT];
  if (!rc)
    rc = cgc__split_begin(ch, req, &plan, check, dst, NULL, NULL, NULL, &c, st);
  if (!rc)
    rc = cgc_call_finish(c, got, res, st);
  for (int g = 0; g < CG_GRAD_COUNT && !rc; g++) {
    if (!(plan.wants & CG_GRAD_BIT(g)))
      continue;
    out[g] = malloc(sizeof *out[g]);
    if (out[g]) {
      *out[g] = got[g];
    } else {
      cgc__status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      rc = CG_ENOMEM;
    }
  }
  if (rc)
    for (int g = 0; g < CG_GRAD_COUNT; g++) {
      if (own & CG_GRAD_BIT(g))
        free(dst[g]);
      free(out[g]);
      out[g] = NULL;
    }
  return rc;
}

/* ---- a share for the caller ----------------------------------------- */

/* The first rows of a split like cgc__part_init's, with the caller as
 * part 0: the rows it takes, the server the rest, costed as ch would run
 * them (pipelined over a channel of one replica, else whole). The rows
 * balance the caller's time against the server's, but are taken only
 * when that ends the call CGC__PIPE_GAIN sooner than the server alone,
 * and each side's work is a part's least (split_min_flops). */
int cgc_local_rows(cgc_channel *ch, const cgc_request *req,
                   const cgc_result *measured, double local_ms, int64_t *rows,
                   cgc_status *st) {
  *rows = 0;
  cgc__status_ok(st);
  cgc__plan plan;
  if (!cg_op_is_layer(req->op) ||
      cgc__plan_layer(req, cgc__wants(req), &plan) != 0 || plan.mb < 2) {
    cgc__status_set(st, GRPC_STATUS_INVALID_ARGUMENT,
                    "a share for the caller needs a layer op whose request "
                    "resolves, with a minibatch of at least 2");
    return CG_EINVAL;
  }
  double flops = (double)cg_layer_flops(&plan.layer);
  cgc__speed server = {0}; /* the server of the rows sent, as the cut's */
  cgc__speeds_of(measured, flops, &server.ms_gf, &server.link);
  if (server.ms_gf <= 0 || local_ms <= 0)
    return 0;           /* nothing measured: no share */
  if (server.link <= 0) /* no byte moved (regions), or too few to time */
    server.link = INFINITY;
  cgc__bytes whole;
  cgc__bytes_of(req, &plan, &whole);
  int kmax = ch->nreplicas && !ch->opts.split_parts ? CGC__AUTO_PARTS : 1, k;
  double min_flops = cgc__min_part_flops(ch);
  double alone = cgc__cut_best(&server, 1, flops, &whole, kmax, &k);
  double best_t = alone;
  for (int64_t own = 1; own < plan.mb; own++) {
    double share = (double)(plan.mb - own) / (double)plan.mb;
    double mine = flops * (1 - share), theirs = flops * share;
    if (mine < min_flops || theirs < min_flops)
      continue;
    cgc__bytes b = whole;
    b.up_whole = whole.up_whole - whole.up_whole_data +
                 (size_t)((double)whole.up_whole_data * share);
    b.up_data = (size_t)((double)whole.up_data * share);
    b.down_data = (size_t)((double)whole.down_data * share);
    double remote = cgc__cut_best(&server, 1, theirs, &b, kmax, &k);
    double local = local_ms * (1 - share);
    double t = remote > local ? remote : local;
    if (t < best_t) {
      best_t = t;
      *rows = own;
    }
  }
  if (best_t > (1 - CGC__PIPE_GAIN) * alone)
    *rows = 0;
  return 0;
}
