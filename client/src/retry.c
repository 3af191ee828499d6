/* retry.c - the deadline helpers and the retry-with-backoff loop every
 * call of the library goes through (cgc__with_retry), with the wait for a
 * lost channel to come back between attempts. */
#include <stdint.h>
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

/* Waits until wake for the channel to come back: returns early once it
 * turns READY after being anything else. Sleeping instead would leave the
 * channel's reconnect attempts unpolled (gRPC drives their I/O only from
 * threads polling a completion queue, else from its 5 s backup poller), so
 * a restarted server was reached only after the retries ran out. A channel
 * that was READY throughout (the server itself said UNAVAILABLE) waits the
 * whole backoff. The completion queue is this wait's own: threads sharing
 * the channel need no lock. */
static void cgc__wait_for_channel(cgc_channel *ch, gpr_timespec wake) {
  grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
  grpc_connectivity_state s =
      grpc_channel_check_connectivity_state(ch->chan, 1);
  int was_down = s != GRPC_CHANNEL_READY;
  while (s != GRPC_CHANNEL_SHUTDOWN) {
    grpc_channel_watch_connectivity_state(ch->chan, s, wake, cq, NULL);
    /* One event per watch: a change (success) or wake passing. */
    grpc_event ev = grpc_completion_queue_next(
        cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    if (!ev.success)
      break;
    /* try_to_connect: an IDLE channel (its connection lost) reconnects. */
    s = grpc_channel_check_connectivity_state(ch->chan, 1);
    if (s == GRPC_CHANNEL_READY && was_down)
      break;
    was_down |= s != GRPC_CHANNEL_READY;
  }
  grpc_completion_queue_shutdown(cq);
  while (
      grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL)
          .type != GRPC_QUEUE_SHUTDOWN)
    ;
  grpc_completion_queue_destroy(cq);
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
   * again (cgc__wait_for_channel), so it keeps the whole step, +-20%. */
  double wait = backoff * (0.8 + 0.4 * unit);
  return wait < left_ms ? (int64_t)wait : -1;
}

int cgc__with_retry(cgc_channel *ch, gpr_timespec deadline,
                    cgc__attempt_fn attempt, void *ctx, int *attempts,
                    cgc_status *st) {
  const cgc_options *o = &ch->opts;
  double backoff = (double)o->backoff_initial_ms;
  uint64_t seed = (uint64_t)(cgc__now_ms() * 1e6) ^ (uint64_t)(uintptr_t)&seed;
  int rc;
  cgc__try t = {deadline, attempts ? *attempts : 0, -1};
  /* The decision needs the status even when the caller did not ask. */
  cgc_status local;
  if (!st)
    st = &local;
  /* The "retry later" refusal the attempt now running retries, if any. */
  cgc_status refusal;
  int retrying_refusal = 0;
  for (;;) {
    t.retry_after_ms = -1;
    rc = attempt(ch, ctx, &t, st);
    if (rc == CGC_ERPC && retrying_refusal &&
        st->code == GRPC_STATUS_DEADLINE_EXCEEDED) {
      /* The server's refusal is why the call did not finish in time: a
       * bare DEADLINE_EXCEEDED would hide that it is busy, and whether
       * the retry was overtaken in flight or in the server's queue is
       * down to timing. */
      cgc__status_set(st, refusal.code,
                      "%s (retry %d was cut short by the call's deadline)",
                      refusal.message, t.retry);
      break;
    }
    if (rc != CGC_ERPC || t.retry >= o->retries)
      break;
    int64_t wait_ms = cgc__retry_wait(&t, st->code, backoff, &seed);
    if (wait_ms < 0)
      break;
    retrying_refusal = t.retry_after_ms >= 0;
    if (retrying_refusal)
      refusal = *st;
    cgc__wait_for_channel(
        ch, gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                         gpr_time_from_millis(wait_ms, GPR_TIMESPAN)));
    t.retry++;
    backoff *= o->backoff_multiplier;
    if (backoff > (double)o->backoff_max_ms)
      backoff = (double)o->backoff_max_ms;
  }
  if (attempts)
    *attempts = t.retry + 1;
  return rc;
}
