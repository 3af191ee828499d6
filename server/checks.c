/* checks.c - owns the server's result checks: the sampling, the recovery
 * of a failed output, the failure log records, the counters and the
 * quarantine (cgs_checks.h). */
#include "cgs_checks.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cg/check.h"
#include "cg/dtype.h"
#include "cg/reference.h"
#include "cgs_crash.h"
#include "cgs_log.h"
#include "cgs_pool.h"

/* Problems the plain reference recomputes when oneDNN has no other
 * implementation: its loops run at about 1 GFLOP/s. */
#define REFERENCE_MAX_FLOPS 2e8
#define QUARANTINE_MAX 64 /* bound of --check-quarantine */
#define REASON_LEN 512

struct cgs_checks {
  uint64_t rate_ppm; /* calls sampled, in millionths */
  unsigned first_runs, quarantine_after;
  uint64_t window_ns;
  uint64_t seed; /* of the sampling and the probes, per process */
  atomic_uint_fast64_t checked, failed, recomputed, lost, injected;
  atomic_uint_fast64_t warmup_checked, warmup_failed;
  atomic_int quarantined;
  double fault_rate; /* CG_FAULT_INJECT builds: CONVGRAD_FAULT_INJECT */
  atomic_uint_fast64_t fault_draws;
  pthread_mutex_t mu;               /* the fields below */
  uint64_t fail_ns[QUARANTINE_MAX]; /* the last failures' times, a ring */
  unsigned fail_n, fail_next;
  char reason[REASON_LEN];
};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int cgs_checks_new(cgs_checks **out, const cgs_config *cfg) {
  cgs_checks *c = calloc(1, sizeof *c);
  *out = c;
  if (!c)
    return CG_ENOMEM;
  c->rate_ppm = cfg->check_rate_ppm;
  c->first_runs = cfg->check_first_runs;
  c->quarantine_after = cfg->check_quarantine < QUARANTINE_MAX
                            ? cfg->check_quarantine
                            : QUARANTINE_MAX;
  c->window_ns = cfg->check_window_ms * 1000000ull;
  c->seed = cg_check_seed(c);
  pthread_mutex_init(&c->mu, NULL);
#ifdef CG_FAULT_INJECT
  /* Tests fix the seed, so that what is injected where repeats. */
  const char *fs = getenv("CONVGRAD_FAULT_SEED");
  if (fs)
    c->seed = cg_check_mix64(strtoull(fs, NULL, 10));
  const char *f = getenv("CONVGRAD_FAULT_INJECT");
  c->fault_rate = f ? strtod(f, NULL) : 0;
  if (c->fault_rate > 0)
    cgs_warn("checks: fault injection on: a bit flipped in %g of the "
             "computed outputs (CONVGRAD_FAULT_INJECT)",
             c->fault_rate);
#endif
  return 0;
}

void cgs_checks_free(cgs_checks *c) {
  if (!c)
    return;
  pthread_mutex_destroy(&c->mu);
  free(c);
}

double cgs_checks_rate(const cgs_checks *c) {
  return (double)c->rate_ppm / 1e6;
}

void cgs_checks_read(cgs_checks *c, cgs_checks_counters *out, char *why,
                     size_t whylen) {
  out->checked = atomic_load(&c->checked);
  out->failed = atomic_load(&c->failed);
  out->recomputed = atomic_load(&c->recomputed);
  out->lost = atomic_load(&c->lost);
  out->injected = atomic_load(&c->injected);
  out->warmup_checked = atomic_load(&c->warmup_checked);
  out->warmup_failed = atomic_load(&c->warmup_failed);
  out->quarantined = atomic_load(&c->quarantined);
  if (!why)
    return;
  pthread_mutex_lock(&c->mu);
  snprintf(why, whylen, "%s", out->quarantined ? c->reason : "");
  pthread_mutex_unlock(&c->mu);
}

/* The inputs of output g's part of l. */
static void part_inputs(const cgs_job *job, cg_grad g, const void **in0,
                        const void **in1) {
  const cg_layer *l = job->layer;
  const int *idx = g == CG_GRAD_DIFF_SRC ? l->data_in : l->weights_in;
  *in0 = job->in[idx[0]];
  *in1 = job->in[idx[1]];
}

static int wanted(cgs_checks *c, const cgs_job *job, cg_grad g) {
  uint64_t runs = job->info[g].runs;
  if (runs >= 1 && runs <= c->first_runs)
    return 1;
  if (atomic_load(&c->quarantined))
    return 1;
  return cg_check_mix64(c->seed ^ job->call_id) % 1000000u < c->rate_ppm;
}

#ifdef CG_FAULT_INJECT
/* Flips one bit among the top 16 of one element of out, in fault_rate of
 * the outputs. */
static void inject(cgs_checks *c, const cg_geom *geom, void *out,
                   size_t elems) {
  uint64_t r = cg_check_mix64(c->seed ^ 0xfa017ull ^
                              atomic_fetch_add(&c->fault_draws, 1) * 0x9e37ull);
  if ((double)(r >> 11) * 0x1p-53 >= c->fault_rate || elems == 0)
    return;
  r = cg_check_mix64(r);
  size_t at = (size_t)(r % elems);
  int bit = (int)((r >> 40) % 16);
  if (geom->dtype == CG_DTYPE_F32)
    ((uint32_t *)out)[at] ^= 1u << (16 + bit);
  else
    ((uint16_t *)out)[at] ^= (uint16_t)(1u << bit);
  atomic_fetch_add(&c->injected, 1);
}
#endif

/* Recomputes output g elsewhere than impl: another oneDNN implementation,
 * the reference for a small problem when there is none; diff_bias with
 * the reference. *how names what did it. */
static int recompute(cg_engine *engine, cgs_job *job, cg_grad g,
                     const char *impl, const char **how, char *err,
                     size_t errlen) {
  const cg_geom *geom = cg_layer_geom(job->layer, g);
  const void *in0, *in1;
  void *out = job->out[g];
  part_inputs(job, g, &in0, &in1);
  if (g == CG_GRAD_DIFF_BIAS) {
    *how = "reference";
    return cg_reference_bias(geom, in1, out, err, errlen);
  }
  cg_run_info info = {0};
  int rc = cg_engine_run_other(engine, geom, impl, in0, in1, out, &info, err,
                               errlen);
  *how = rc == 0 ? info.impl : "none";
  if (rc == CG_EUNSUPPORTED && geom->flops <= REFERENCE_MAX_FLOPS) {
    *how = "reference";
    rc = cg_reference_run(geom, in0, in1, out, err, errlen);
  }
  return rc;
}

/* Counts a failure at now; quarantines the replica when it is the
 * quarantine_after-th within the window. */
static void note_failure(cgs_checks *c, const char *what) {
  if (c->quarantine_after == 0)
    return;
  uint64_t now = now_ns();
  pthread_mutex_lock(&c->mu);
  c->fail_ns[c->fail_next] = now;
  c->fail_next = (c->fail_next + 1) % c->quarantine_after;
  if (c->fail_n < c->quarantine_after)
    c->fail_n++;
  /* The oldest of the last quarantine_after failures is next in line. */
  uint64_t oldest =
      c->fail_ns[c->fail_n < c->quarantine_after ? 0 : c->fail_next];
  if (c->fail_n == c->quarantine_after && now - oldest <= c->window_ns &&
      !atomic_load(&c->quarantined)) {
    snprintf(c->reason, sizeof c->reason,
             "%u failed result checks within %.0f s (the last: %s)",
             c->quarantine_after, (double)(now - oldest) / 1e9, what);
    atomic_store(&c->quarantined, 1);
    cgs_error("checks: quarantined, reporting NOT_SERVING: %s", c->reason);
  }
  pthread_mutex_unlock(&c->mu);
}

/* One record of output g's failed check r: what failed where, then
 * outcome and the job, as the crash report describes a call's (client
 * values escaped there); counted towards the quarantine. */
static void record_failure(cgs_checks *c, const cgs_job *job, cg_grad g,
                           int threads, uint64_t seed, const cg_check_result *r,
                           const char *outcome) {
  const cg_geom *geom = cg_layer_geom(job->layer, g);
  const char *impl = job->info[g].impl ? job->info[g].impl : "?";
  char job_text[1024], what[160];
  if (job->warmup) {
    cg_text t;
    cg_text_init(&t, job_text, sizeof job_text);
    cg_text_str(&t, "job: warm-up ");
    cg_layer_text_geometry(&t, job->layer);
  } else {
    cgs_crash_describe(job_text, sizeof job_text, job->call_id, job->peer,
                       job->layer);
  }
  snprintf(what, sizeof what, "%s of %s on %s", cg_grad_name(g),
           cg_op_name(geom->op), impl);
  cgs_error("check failed output=%s impl=%s isa=%s onednn=%s threads=%d "
            "dtype=%s seed=%" PRIu64 " failed=%" PRId64 "/%" PRId64
            " worst_diff=%.6g tolerance=%.6g at=%" PRId64 ",%" PRId64
            ",%" PRId64 " %s %s",
            cg_grad_name(g), impl, cg_backend_isa(), cg_backend_version(),
            threads, cg_dtype_name(geom->dtype), seed, r->failed, r->compared,
            r->worst_diff, r->worst_tol, r->worst_at[0], r->worst_at[1],
            r->worst_at[2], outcome, job_text);
  note_failure(c, what);
}

/* Output g of a warm-up run (job->warmup), on random inputs: always
 * checked, never recomputed (nobody waits for it); a failure is recorded
 * and counts towards the quarantine as a call's does. */
static int check_warmup(cgs_checks *c, cgs_job *job, cg_grad g, int threads) {
  uint64_t seed = cg_check_mix64(c->seed ^ 0x7761726d7570ull ^
                                 ((uint64_t)g << 56) ^ job->info[g].runs);
  cg_check_result r;
  char msg[256];
  if (cg_check_output(job->layer, g, job->in, job->out[g], seed, threads, &r,
                      msg, sizeof msg) != 0)
    return cg_errorf(job->err, sizeof job->err, CG_ENOMEM, "%s not checked: %s",
                     cg_grad_name(g), msg);
  atomic_fetch_add(&c->warmup_checked, 1);
  if (r.failed == 0)
    return 0;
  atomic_fetch_add(&c->warmup_failed, 1);
  record_failure(c, job, g, threads, seed, &r, "outcome=warmup");
  return cg_errorf(job->err, sizeof job->err, CG_EDATALOSS,
                   "%s failed its result check on %s", cg_grad_name(g),
                   job->info[g].impl ? job->info[g].impl : "?");
}

int cgs_checks_output(cgs_checks *c, cg_engine *engine, cgs_job *job, cg_grad g,
                      int threads) {
  void *out = job->out[g];
  if (job->warmup)
    return check_warmup(c, job, g, threads);
#ifdef CG_FAULT_INJECT
  if (c->fault_rate > 0)
    inject(c, cg_layer_geom(job->layer, g), out, job->layer->out_elems[g]);
#endif
  if (!wanted(c, job, g))
    return 0;
  uint64_t seed = cg_check_mix64(c->seed ^ job->call_id ^ ((uint64_t)g << 56));
  cg_check_result r;
  char msg[256];
  if (cg_check_output(job->layer, g, job->in, out, seed, threads, &r, msg,
                      sizeof msg) != 0) {
    /* The check itself could not run (memory): the output stands. */
    cgs_warn("checks: compute id=%" PRIu64 " %s not checked: %s", job->call_id,
             cg_grad_name(g), msg);
    return 0;
  }
  atomic_fetch_add(&c->checked, 1);
  job->checked |= CG_GRAD_BIT(g);
  if (r.failed == 0)
    return 0;

  atomic_fetch_add(&c->failed, 1);
  const char *impl = job->info[g].impl ? job->info[g].impl : "?";
  const char *how = "none";
  char rerr[256] = "";
  cg_check_result r2 = {0};
  int rc = recompute(engine, job, g, impl, &how, rerr, sizeof rerr);
  if (rc == 0)
    rc = cg_check_output(job->layer, g, job->in, out, cg_check_mix64(seed),
                         threads, &r2, rerr, sizeof rerr);
  int ok = rc == 0 && r2.failed == 0;
  if (ok) {
    atomic_fetch_add(&c->recomputed, 1);
    job->recomputed |= CG_GRAD_BIT(g);
  } else {
    atomic_fetch_add(&c->lost, 1);
  }

  char outcome[128];
  snprintf(outcome, sizeof outcome, "recomputed_on=%s outcome=%s", how,
           ok ? "recomputed" : "data_loss");
  record_failure(c, job, g, threads, seed, &r, outcome);
  if (ok)
    return 0;
  if (rc != 0 && rc != CG_EUNSUPPORTED)
    return cg_errorf(job->err, sizeof job->err, rc,
                     "%s failed its result check on %s and recomputing it "
                     "failed: %s",
                     cg_grad_name(g), impl, rerr);
  return cg_errorf(job->err, sizeof job->err, CG_EDATALOSS,
                   "%s failed its result check on %s (%" PRId64 " of %" PRId64
                   " comparisons, worst |difference| %.3g > tolerance %.3g)%s%s"
                   "; the server answers no unverified result",
                   cg_grad_name(g), impl, r.failed, r.compared, r.worst_diff,
                   r.worst_tol,
                   rc == 0 ? " and again on "
                           : ", and no other implementation "
                             "took it",
                   rc == 0 ? how : "");
}
