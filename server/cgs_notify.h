/* cgs_notify.h - systemd's service notifications (sd_notify(3)), so that
 * the unit can be Type=notify with a watchdog: READY=1 once every address
 * listens, STOPPING=1 when a drain starts, and WATCHDOG=1 from a timer on
 * the event loop at half the unit's WatchdogSec, so that systemd restarts
 * a server whose loop has wedged (the loop is what admits calls, hands
 * jobs to workers and streams results). Outside systemd ($NOTIFY_SOCKET
 * unset) nothing is sent and no timer runs. Loop thread only. */
#ifndef CGS_NOTIFY_H
#define CGS_NOTIFY_H

#include <uv.h>

typedef struct cgs_notify {
  uv_timer_t watchdog;
  int watchdog_open;
} cgs_notify;

/* Starts the watchdog timer on loop when systemd asked for one
 * ($WATCHDOG_USEC, for this process), then sends READY=1 with status (the
 * readiness line) as STATUS=. */
void cgs_notify_ready(cgs_notify *n, uv_loop_t *loop, const char *status);
/* STOPPING=1: the server drains; systemd's stop timeout runs. */
void cgs_notify_stopping(void);
/* Closes the timer, so that the loop can end. Safe when none was started. */
void cgs_notify_close(cgs_notify *n);

#endif
