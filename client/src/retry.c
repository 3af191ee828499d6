/* retry.c - the deadline helpers and the retry-with-backoff loop every
 * call of the library goes through (cgc__with_retry), with the wait for a
 * lost channel to come back between attempts. */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "internal.h"

gpr_timespec cgc__deadline(const cgc_channel *ch, int64_t deadline_ms) {
  if (deadline_ms <= 0)
    deadline_ms = ch->opts.deadline_ms;
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                      gpr_time_from_millis(deadline_ms, GPR_TIMESPAN));
}

double cgc__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The longest wait a deadline stands for, about 31 years: any longer one
 * (cgc_call_wait takes up to INT64_MAX ms) means the same, and its
 * nanoseconds would not fit an int64_t. */
#define CGC__WAIT_MAX_MS 1e12

void cgc__clock_after_ms(clockid_t clock, double ms, struct timespec *until) {
  clock_gettime(clock, until);
  if (ms > CGC__WAIT_MAX_MS)
    ms = CGC__WAIT_MAX_MS;
  int64_t ns = ms > 0 ? (int64_t)(ms * 1e6) : 0;
  until->tv_sec += (time_t)(ns / 1000000000);
  until->tv_nsec += (long)(ns % 1000000000);
  if (until->tv_nsec >= 1000000000L) {
    until->tv_sec++;
    until->tv_nsec -= 1000000000L;
  }
}

/* Next value of a per-call xorshift generator: jitter spreads the retries
 * of many clients, and a state per call keeps this thread-safe without a
 * shared generator. */
static uint64_t cgc__xorshift(uint64_t *seed) {
  *seed ^= *seed << 13;
  *seed ^= *seed >> 7;
  *seed ^= *seed << 17;
  return *seed;
}

/* How long to wait before retry number t->retry + 1 of a call that
 * failed with code, in ms, or -1 when it must not be retried (a permanent
 * failure, or a wait that would pass the deadline). backoff is this
 * retry's exponential step. */
static int64_t cgc__retry_wait(const cgc__try *t, grpc_status_code code,
                               double backoff, uint64_t *seed) {
  double left_ms = gpr_timespec_to_micros(gpr_time_sub(
                       t->deadline, gpr_now(GPR_CLOCK_MONOTONIC))) /
                   1e3;
  double unit = (double)(cgc__xorshift(seed) % 1000000) / 1e6; /* [0, 1) */
  if (t->retry_after_ms >= 0 && (code == GRPC_STATUS_RESOURCE_EXHAUSTED ||
                                 code == GRPC_STATUS_UNAVAILABLE)) {
    /* "Retry later": never before the server's hint, then full jitter
     * over the exponential step, so that the callers one refusal burst
     * turned away come back spread out rather than together. */
    double hint = (double)t->retry_after_ms;
    if (hint >= left_ms)
      return -1;
    double spread = backoff < left_ms - hint ? backoff : left_ms - hint;
    return (int64_t)(hint + unit * spread);
  }
  if (code != GRPC_STATUS_UNAVAILABLE)
    return -1; /* RESOURCE_EXHAUSTED without a hint is a limit: permanent */
  /* A lost connection: the wait ends as soon as the channel is READY
   * again (cgc__retry_watch), so it keeps the whole step, +-20%. */
  double wait = backoff * (0.8 + 0.4 * unit);
  return wait < left_ms ? (int64_t)wait : -1;
}

void cgc__retry_init(cgc__retrier *r, cgc_channel *ch, gpr_timespec deadline,
                     int attempts) {
  memset(r, 0, sizeof *r);
  r->ch = ch;
  r->t.deadline = deadline;
  r->t.retry = attempts;
  r->t.retry_after_ms = -1;
  r->backoff = (double)ch->opts.backoff_initial_ms;
  r->seed = (uint64_t)(cgc__now_ms() * 1e6) ^ (uint64_t)(uintptr_t)r;
}

int cgc__retry_next(cgc__retrier *r, int rc, cgc_status *st) {
  const cgc_options *o = &r->ch->opts;
  if (rc == CGC_ERPC && r->retrying_refusal &&
      st->code == GRPC_STATUS_DEADLINE_EXCEEDED) {
    /* The server's refusal is why the call did not finish in time: a bare
     * DEADLINE_EXCEEDED would hide that it is busy, and whether the retry
     * was overtaken in flight or in the server's queue is down to
     * timing. */
    cgc__status_set(st, r->refusal.code,
                    "%s (retry %d was cut short by the call's deadline)",
                    r->refusal.message, r->t.retry);
    return 0;
  }
  if (rc != CGC_ERPC || r->t.retry >= o->retries)
    return 0;
  int64_t wait_ms = cgc__retry_wait(&r->t, st->code, r->backoff, &r->seed);
  if (wait_ms < 0)
    return 0;
  r->retrying_refusal = r->t.retry_after_ms >= 0;
  if (r->retrying_refusal)
    r->refusal = *st;
  r->wake = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                         gpr_time_from_millis(wait_ms, GPR_TIMESPAN));
  r->t.retry++;
  r->t.retry_after_ms = -1;
  r->backoff *= o->backoff_multiplier;
  if (r->backoff > (double)o->backoff_max_ms)
    r->backoff = (double)o->backoff_max_ms;
  return 1;
}

/* The wait watches the channel instead of sleeping: a sleep would leave its
 * reconnect attempts unpolled (gRPC drives their I/O only from threads
 * polling a completion queue, else from its 5 s backup poller), so a
 * restarted server was reached only after the retries ran out. A channel
 * that was READY throughout (the server itself said UNAVAILABLE) waits the
 * whole backoff; the watch's deadline is the wait's timer. */
int cgc__retry_watch(cgc__retrier *r, int first, int success,
                     grpc_completion_queue *cq, cgc__tag *tag) {
  grpc_channel *chan = r->ch->chan;
  if (!first && !success)
    return 1; /* wake passed */
  /* try_to_connect: an IDLE channel (its connection lost) reconnects. */
  grpc_connectivity_state s = grpc_channel_check_connectivity_state(chan, 1);
  if (first)
    r->was_down = s != GRPC_CHANNEL_READY;
  else if (s == GRPC_CHANNEL_READY && r->was_down)
    return 1;
  r->was_down |= s != GRPC_CHANNEL_READY;
  if (s == GRPC_CHANNEL_SHUTDOWN)
    return 1;
  grpc_channel_watch_connectivity_state(chan, s, r->wake, cq,
                                        tag ? cgc__tag_give(tag) : NULL);
  return 0;
}

int cgc__retry_attempts(const cgc__retrier *r) {
  return r->t.retry + 1;
}

int cgc__with_retry(cgc_channel *ch, gpr_timespec deadline,
                    cgc__attempt_fn attempt, void *ctx, cgc_status *st) {
  cgc__retrier r;
  cgc_status local;
  /* The decision needs the status even when the caller did not ask. */
  if (!st)
    st = &local;
  cgc__retry_init(&r, ch, deadline, 0);
  for (;;) {
    int rc = attempt(ch, ctx, &r.t, st);
    if (!cgc__retry_next(&r, rc, st))
      return rc;
    grpc_completion_queue *cq = cgc__cq_take(ch);
    int over = cgc__retry_watch(&r, 1, 0, cq, NULL);
    while (!over)
      over = cgc__retry_watch(&r, 0,
                              grpc_completion_queue_next(
                                  cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL)
                                  .success,
                              cq, NULL);
    cgc__cq_give(ch, cq);
  }
}
