/* cgs_call.h - the Compute call: one bidirectional stream from header to
 * status, driven by completion-queue tags, the worker's result and the
 * loop's sweep of timeouts.
 *
 * States: RECV_HEADER -> RECV_DATA -> QUEUED (waiting for a worker or
 * running) -> SENDING -> DONE. Any state may end early with an error status
 * (sent once) or because the client cancelled / the deadline passed; the
 * call is over once grpc has no operation pending and the worker has
 * returned the job, and freed when the last reference to it goes (a sweep
 * may hold one a moment longer). Its in-flight bytes are reserved from the
 * header on and released when it is freed.
 *
 * Threads: a call crosses as few as it can. The completion-queue thread
 * runs the method's start (admission) and every tag: the header, the data
 * chunks, the result's later batches, the end. The worker that ran the job
 * runs cgs_call_job_done and starts the answer itself. The loop runs
 * cgs_call_sweep (timeouts) and cgs_call_cancel_all. Each takes the call's
 * mutex; server state they share is thread-safe (cgs_server.h). The result
 * buffer's last reference may drop on a grpc thread, when grpc frees the
 * last slice sent from it (an atomic count). */
#ifndef CGS_CALL_H
#define CGS_CALL_H

#include <grpc/grpc.h>

#include "cgs_server.h"

/* /convgrad.v1.ConvGrad/Compute, a bidirectional stream. The call is
 * handed over at its HTTP/2 headers, before any message, so that the
 * per-peer limit and the idle timeout cover streams that never send one. */
extern const cgs_method_def cgs_call_method;
/* /convgrad.v1.ConvGrad/Stage, a client stream: a Compute call's upload
 * whose one input, once verified against its SHA-256, goes into the
 * store of staged tensors instead of a job (proto/SEMANTICS.md, "Staged
 * tensors"); same admission, limits and timeouts. */
extern const cgs_method_def cgs_stage_method;
/* Pool completion callback (data = the cgs_server), on the worker. */
void cgs_call_job_done(cgs_job *job, void *data);
/* Loop thread, every few tens of milliseconds: ends the calls whose
 * deadline passed, that made no progress for --idle-timeout or upload
 * below --min-upload-rate. */
void cgs_call_sweep(cgs_server *s);
/* Ends every live Compute call with UNAVAILABLE (grace period over, or
 * teardown). Callers then cancel every grpc call, or expect no more grpc
 * events: on_close will not blame the client for those cancels. */
void cgs_call_cancel_all(cgs_server *s);

#endif
