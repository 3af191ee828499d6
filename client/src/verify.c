/* verify.c - the client's own checks of the results it receives
 * (cgc_options.verify_rate; proto/SEMANTICS.md "Result checks"): which
 * calls are checked (a per-channel draw, and the first call of each shape
 * the channel sees), each output checked by the adjoint identity with the
 * server's own code (kernels/src/check.c, built into this library without
 * OpenMP: kernels/CMakeLists.txt), the counts, and the line a failure is
 * told in. What to do about a failure is the caller's: compute.c asks
 * again once, split.c asks another replica. Also what a request is to the
 * kernels (its problem, its shape key), which split.c shares. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg/check.h"
#include "internal.h"

/* Where a failed check's message starts: what tells it from the server's
 * own DATA_LOSS (cgc__verify_failure). */
#define CGC__CHECK_FAILED "client check failed: "

void cgc__request_problem(const cgc_request *req, cg_problem *p) {
  int nin = cg_op_is_layer(req->op) ? 3 : 2;
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

uint64_t cgc__shape_key(const cgc_request *r) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
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

void cgc__verifier_init(cgc__verifier *v, const cgc_options *o) {
  memset(v, 0, sizeof *v);
  v->rate = o->verify_rate;
  v->notify = o->verify_notify;
  v->notify_arg = o->verify_notify_arg;
  v->seed = cg_check_seed(v);
  pthread_mutex_init(&v->mu, NULL);
}

void cgc__verifier_destroy(cgc__verifier *v) {
  pthread_mutex_destroy(&v->mu);
}

/* 1 the first time v sees key (it remembers the last CGC__VERIFY_SHAPES
 * shapes, at worst forgetting one that hashes to the same slot). */
static int cgc__new_shape(cgc__verifier *v, uint64_t key) {
  int seen = 0;
  pthread_mutex_lock(&v->mu);
  uint64_t *slot = NULL;
  for (int i = 0; i < CGC__VERIFY_SHAPES && !seen; i++) {
    seen = v->shapes[i] == key;
    if (!v->shapes[i] && !slot)
      slot = &v->shapes[i];
  }
  if (!seen)
    *(slot ? slot : &v->shapes[key % CGC__VERIFY_SHAPES]) = key;
  pthread_mutex_unlock(&v->mu);
  return !seen;
}

int cgc__verify_pick(cgc__verifier *v, const cgc_request *req,
                     cgc__check_mode mode, uint64_t *seed) {
  if (mode == CGC__CHECK_NEVER || (mode == CGC__CHECK_DRAW && !(v->rate > 0)))
    return 0;
  uint64_t r =
      cg_check_mix64(v->seed ^ cg_check_mix64(atomic_fetch_add(&v->draws, 1)));
  *seed = cg_check_mix64(r);
  if (mode == CGC__CHECK_ALWAYS)
    return 1;
  /* The shape is looked up first, so that a sampled call marks it seen. */
  int pick = cgc__new_shape(v, cgc__shape_key(req));
  pick |= (double)(r >> 11) * 0x1p-53 < v->rate;
  if (pick)
    atomic_fetch_add(&v->calls, 1);
  return pick;
}

/* Fails output g of l with why, counted, told and in st. */
static int cgc__verify_fail(cgc__verifier *v, const cg_layer *l, cg_grad g,
                            const char *why, const char *peer,
                            const char *worker, cgc_status *st) {
  char geom[320], line[CGC_MESSAGE_MAX];
  cg_text t;
  cg_text_init(&t, geom, sizeof geom);
  cg_layer_text_geometry(&t, l);
  atomic_fetch_add(&v->failed, 1);
  snprintf(line, sizeof line,
           CGC__CHECK_FAILED "%s of %s from %s (worker %s): %s; %s",
           cg_grad_name(g), cg_op_name(l->op), peer ? peer : "?",
           worker && *worker ? worker : "?", why, geom);
  if (v->notify)
    v->notify(v->notify_arg, line);
  else
    fprintf(stderr, "convgrad: %s\n", line);
  cgc__status_set(st, GRPC_STATUS_DATA_LOSS, "%s", line);
  return CGC_ERPC;
}

int cgc__verify_output(cgc__verifier *v, const cg_layer *l, cg_grad g,
                       const cgc_request *req, const cgc_tensor *t,
                       uint64_t seed, const char *peer, const char *worker,
                       cgc_status *st) {
  char why[200];
  if (t->dtype != l->dtype || t->nbytes != l->out_bytes[g]) {
    snprintf(why, sizeof why,
             "answered %zu bytes of %s, the request implies %zu of %s",
             t->nbytes, cg_dtype_name(t->dtype), l->out_bytes[g],
             cg_dtype_name(l->dtype));
    atomic_fetch_add(&v->outputs, 1);
    return cgc__verify_fail(v, l, g, why, peer, worker, st);
  }
  const void *in[3] = {req->inputs[0].data, req->inputs[1].data,
                       req->inputs[2].data};
  cg_check_result r;
  if (cg_check_output(l, g, in, t->data, seed, 1, &r, why, sizeof why) != 0)
    return 0;
  atomic_fetch_add(&v->outputs, 1);
  if (r.failed == 0)
    return 0;
  snprintf(why, sizeof why,
           "%" PRId64 " of %" PRId64 " comparisons, worst |difference| %.3g > "
           "tolerance %.3g at %" PRId64 ",%" PRId64 ",%" PRId64
           ", probes' seed %" PRIu64,
           r.failed, r.compared, r.worst_diff, r.worst_tol, r.worst_at[0],
           r.worst_at[1], r.worst_at[2], seed);
  return cgc__verify_fail(v, l, g, why, peer, worker, st);
}

int cgc__verify_failure(int rc, const cgc_status *st) {
  return rc == CGC_ERPC && st->code == GRPC_STATUS_DATA_LOSS &&
         strncmp(st->message, CGC__CHECK_FAILED,
                 sizeof CGC__CHECK_FAILED - 1) == 0;
}

void cgc__verify_settled(cgc__verifier *v, int rc) {
  atomic_fetch_add(rc == 0 ? &v->recovered : &v->lost, 1);
}

void cgc_verify_stats_get(const cgc_channel *ch, cgc_verify_stats *out) {
  cgc__verifier *v = ch->vf;
  out->calls = atomic_load(&v->calls);
  out->outputs = atomic_load(&v->outputs);
  out->failed = atomic_load(&v->failed);
  out->recovered = atomic_load(&v->recovered);
  out->lost = atomic_load(&v->lost);
}
