/* cgs_crash.h - the crash report (crash.c): when a fatal signal (SIGSEGV,
 * SIGBUS outside the shared-memory regions' guard, SIGILL, SIGFPE) hits
 * any thread, one log record says which signal, where, on which thread,
 * and what the worker that thread belongs to was computing; then the
 * process dies of that signal, so that a supervisor sees a crash (and a
 * core dump, where enabled) rather than an exit.
 *
 * The record is written with async-signal-safe calls only (clock_gettime,
 * prctl, write, sigaction, raise, and cg_text's formatting): each worker
 * notes which call and layer its job is when the job starts, and the
 * handler formats that only when it writes a record. A worker's
 * OpenMP threads carry its name, which is how the handler finds the job of
 * a fault inside a kernel. */
#ifndef CGS_CRASH_H
#define CGS_CRASH_H

#include <stddef.h>
#include <stdint.h>

#include "cg/layer.h"

/* Installs the handlers, once, before any thread exists: the regions'
 * SIGBUS guard, installed later, hands on the faults outside regions.
 * Returns 0 or -1 with a message. */
int cgs_crash_install(char *err, size_t errlen);

/* The slot of the completion-queue thread ("cg-cq"), which runs tiny jobs
 * itself; the workers' are 0 to --workers' bound, 255. */
#define CGS_CRASH_CQ 256u

/* Worker `worker` (or CGS_CRASH_CQ) starts computing layer for call `call_id`
 * of peer (a client-controlled string, escaped in the report): what the report
 * names if it crashes. peer and layer must stay as they are until
 * cgs_crash_job_end. Worker thread; no allocation, no formatting. */
void cgs_crash_job_start(unsigned worker, uint64_t call_id, const char *peer,
                         const cg_layer *layer);
/* The worker's job ended. */
void cgs_crash_job_end(unsigned worker);

/* The job's text of the report, into buf[cap]; async-signal-safe (the
 * handler's, and tests'). */
void cgs_crash_describe(char *buf, size_t cap, uint64_t call_id,
                        const char *peer, const cg_layer *layer);

#endif
