/* sig.c - owns the signal mask of the server's threads (see cgs_sig.h). */
#include "cgs_sig.h"

#include <pthread.h>
#include <signal.h>

void cgs_sig_block_async(void) {
  sigset_t set;
  sigfillset(&set);
  sigdelset(&set, SIGBUS);
  sigdelset(&set, SIGSEGV);
  sigdelset(&set, SIGFPE);
  sigdelset(&set, SIGILL);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
}
