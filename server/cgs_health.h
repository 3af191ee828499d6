/* cgs_health.h - grpc.health.v1.Health: Check and Watch for "" (the whole
 * server) and "convgrad.v1.ConvGrad". NOT_SERVING until the workers
 * have warmed up (cgs_server's ready), SERVING until the server drains
 * or is quarantined by failed result checks (cgs_checks.h),
 * NOT_SERVING afterwards; Watch streams every change. Loop thread only. */
#ifndef CGS_HEALTH_H
#define CGS_HEALTH_H

#include <grpc/grpc.h>

#include "cgs_server.h"

/* NOT_SERVING until cgs_health_set_serving. Returns 0 or CG_ENOMEM. */
int cgs_health_new(cgs_health **out, cgs_server *s);
/* Frees h; every watcher must have ended. NULL is fine. */
void cgs_health_free(cgs_health *h);
/* Sets the status of every service and pushes it to watchers. */
void cgs_health_set_serving(cgs_health *h, int serving);
/* Sets whether failed result checks quarantine the replica (why: the
 * reason, logged); quarantined reports NOT_SERVING whatever
 * cgs_health_set_serving says, and pushes it to watchers. */
void cgs_health_set_quarantined(cgs_health *h, int quarantined,
                                const char *why);
/* Ends every Watch stream (status UNAVAILABLE): the server is going. */
void cgs_health_end_watches(cgs_health *h);
/* Open Watch streams. */
unsigned cgs_health_watchers(const cgs_health *h);

/* /grpc.health.v1.Health/Check, unary, and /grpc.health.v1.Health/Watch,
 * a server stream (its one request is received by health.c). Both answer
 * for s->health. */
extern const cgs_method_def cgs_health_check_method;
extern const cgs_method_def cgs_health_watch_method;

#endif
