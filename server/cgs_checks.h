/* cgs_checks.h - the server's result checks (checks.c; issue 37): which
 * computed outputs a worker checks by the adjoint identity (cg/check.h),
 * what happens when one fails (recomputed on another implementation and
 * answered if that one verifies, DATA_LOSS otherwise, one log record
 * each), and the replica's quarantine: after --check-quarantine failures
 * within --check-window it reports NOT_SERVING (health.c, through the
 * housekeeping tick) and checks every call.
 *
 * Checked: every output of a call the sampling picks (--check-rate, a
 * hash of the call id and a per-process seed, so that no shared random
 * state is touched), every output whose primitives have run at most
 * --check-first-runs times on the engine that computed it (a shape,
 * thread count or implementation new to the process), and every output
 * once quarantined. The warm-up (--warmup, pool.c) makes those first runs
 * itself, on random inputs, each checked (cgs_job.warmup): they count as
 * the engine's first runs, so a warmed shape's first calls are not checked
 * again, unless a warm-up check failed or could not run (the pool then
 * counts the runs from zero again).
 *
 * In a CG_FAULT_INJECT build (tests only), CONVGRAD_FAULT_INJECT=RATE
 * flips one random bit among the top 16 of one random element of that
 * fraction of computed outputs before they are checked.
 *
 * Threads: cgs_checks_output runs on the worker (or completion-queue
 * thread) computing the job; the readers on any thread. Counters are
 * atomic; the failure window has a mutex. */
#ifndef CGS_CHECKS_H
#define CGS_CHECKS_H

#include <stddef.h>
#include <stdint.h>

#include "cg/engine.h"
#include "cgs_config.h"

typedef struct cgs_checks cgs_checks;
struct cgs_job;

typedef struct cgs_checks_counters {
  uint64_t checked;    /* outputs checked */
  uint64_t failed;     /* checks that failed */
  uint64_t recomputed; /* failed outputs recomputed, verified and answered */
  uint64_t lost;       /* failed outputs answered DATA_LOSS */
  uint64_t injected;   /* faults injected (CG_FAULT_INJECT builds) */
  /* Outputs of the warm-up's runs on random inputs checked, and failed:
   * apart from the calls' counts above. */
  uint64_t warmup_checked, warmup_failed;
  int quarantined; /* the replica reports NOT_SERVING */
} cgs_checks_counters;

/* Returns 0 or CG_ENOMEM. *out is owned by the caller. */
int cgs_checks_new(cgs_checks **out, const cgs_config *cfg);
/* NULL is fine. */
void cgs_checks_free(cgs_checks *c);

/* Output g of job, just computed on engine with threads OpenMP threads:
 * checks it if it is picked, and when the check fails recomputes it.
 * Returns 0 (the output, possibly recomputed, is good or was not
 * checked), CG_EDATALOSS when no recomputation verifies, or what a
 * recomputation returned; job->err says why. Sets CG_GRAD_BIT(g) in
 * job->checked and, for an output answered recomputed, in
 * job->recomputed. A warm-up run's output (job->warmup) is always
 * checked and never recomputed: 0, CG_EDATALOSS when it fails (recorded
 * and counted towards the quarantine) or CG_ENOMEM when the check could
 * not run, with job->err filled. */
int cgs_checks_output(cgs_checks *c, cg_engine *engine, struct cgs_job *job,
                      cg_grad g, int threads);

/* The counters, and whether the replica is quarantined; why (may be NULL)
 * receives the reason, "" when it is not. */
void cgs_checks_read(cgs_checks *c, cgs_checks_counters *out, char *why,
                     size_t whylen);

/* Fraction of calls sampled (--check-rate). */
double cgs_checks_rate(const cgs_checks *c);

#endif
