/* notify.c - sd_notify READY/STOPPING/WATCHDOG for a Type=notify unit
 * (cgs_notify.h). libsystemd is on every Debian system (apt needs it), and
 * its sd_notify and sd_watchdog_enabled carry the protocol's details:
 * $NOTIFY_SOCKET in the abstract namespace, $WATCHDOG_PID checks, the
 * sender's credentials. */
#include "cgs_notify.h"

#include <stdint.h>
#include <stdio.h>

#include <systemd/sd-daemon.h>

#include "cgs_log.h"

static void on_watchdog(uv_timer_t *t) {
  (void)t;
  sd_notify(0, "WATCHDOG=1");
}

void cgs_notify_ready(cgs_notify *n, uv_loop_t *loop, const char *status) {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) > 0 && usec >= 2000) {
    uv_timer_init(loop, &n->watchdog);
    n->watchdog_open = 1;
    /* Half the timeout, as sd_watchdog_enabled(3) advises: one late tick
     * of a busy loop is not a restart. */
    uv_timer_start(&n->watchdog, on_watchdog, 0, usec / 2000);
    cgs_info("systemd watchdog: WATCHDOG=1 every %llu ms",
             (unsigned long long)(usec / 2000));
  }
  int rc = sd_notifyf(0, "READY=1\nSTATUS=%s", status);
  if (rc < 0)
    cgs_warn("sd_notify READY=1 failed: error %d", -rc);
}

void cgs_notify_stopping(void) {
  sd_notify(0, "STOPPING=1\nSTATUS=draining");
}

static void on_closed(uv_handle_t *h) {
  (void)h;
}

void cgs_notify_close(cgs_notify *n) {
  if (!n->watchdog_open)
    return;
  n->watchdog_open = 0;
  uv_close((uv_handle_t *)&n->watchdog, on_closed);
}
