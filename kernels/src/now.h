/* now.h - internal: the one clock the engine times its runs with
 * (cg_run_info.compute_ms). */
#ifndef CG_SRC_NOW_H
#define CG_SRC_NOW_H

#include <time.h>

/* Milliseconds since an arbitrary monotonic origin. */
static inline double cg__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

#endif
