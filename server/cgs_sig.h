/* cgs_sig.h - the signal mask of the server's own threads (sig.c). */
#ifndef CGS_SIG_H
#define CGS_SIG_H

/* Blocks every asynchronous signal on the calling thread: SIGTERM, SIGINT
 * and SIGHUP belong to the loop thread. The synchronous ones (SIGBUS,
 * SIGSEGV, SIGFPE, SIGILL) stay open: the kernel kills a process that
 * faults with them blocked, and the shared-memory regions' SIGBUS guard
 * (cgs_region.h) must run on whichever thread touched a truncated region:
 * a worker, its OpenMP threads (which inherit the mask), the loop or the
 * completion-queue thread. */
void cgs_sig_block_async(void);

#endif
