/* cgs_call.h - the Compute call: one bidirectional stream from header to
 * status, driven by completion-queue tags, worker results and a deadline
 * timer.
 *
 * States: RECV_HEADER -> RECV_DATA -> QUEUED (waiting for a worker or
 * running) -> SENDING -> DONE. Any state may end early with an error status
 * (sent once) or because the client cancelled / the deadline passed; the
 * object is freed in one place once grpc has no operation pending, the
 * worker has returned the job and the timer handle is closed. Its in-flight
 * bytes are reserved from the header on and released when it is freed.
 *
 * Threads: the method's start, cgs_call_job_done and cgs_call_cancel_all
 * run on the loop thread, as do the deadline timer and every tag callback
 * but two: the data chunks in the middle of an upload or of a result are
 * moved on the completion-queue thread (on_recv_fast, on_send_fast in
 * call.c), so the loop is not woken once per chunk. Those touch only the
 * call and the server's cq, and take the call's mutex, which every handler
 * on the loop holds too. The result buffer's last reference may drop on a
 * grpc thread, when grpc frees the last slice sent from it (an atomic
 * count). */
#ifndef CGS_CALL_H
#define CGS_CALL_H

#include <grpc/grpc.h>

#include "cgs_server.h"

/* /convgrad.v1.ConvGrad/Compute, a bidirectional stream. The call is
 * handed over at its HTTP/2 headers, before any message, so that the
 * per-peer limit and the idle timeout cover streams that never send one. */
extern const cgs_method_def cgs_call_method;
/* Pool completion callback (data = the cgs_server). */
void cgs_call_job_done(cgs_job *job, void *data);
/* Ends every live Compute call with UNAVAILABLE (grace period over, or
 * teardown). Callers then cancel every grpc call, or expect no more grpc
 * events: on_close will not blame the client for those cancels. */
void cgs_call_cancel_all(cgs_server *s);

#endif
