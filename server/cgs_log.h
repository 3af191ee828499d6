/* cgs_log.h - leveled, printf-checked logging for convgrad-server.
 *
 * One line per call of cgs_log(), written with a single stdio call so that
 * lines from different threads never interleave. Format:
 *   2026-11-21T21:40:00.123Z info  <message>
 * Thread-safe. The level is set once at start-up, before threads exist. */
#ifndef CGS_LOG_H
#define CGS_LOG_H

#include <stddef.h>

typedef enum {
  CGS_LOG_ERROR = 0,
  CGS_LOG_WARN = 1,
  CGS_LOG_INFO = 2,
  CGS_LOG_DEBUG = 3
} cgs_log_level;

/* Lines above level are dropped. Not thread-safe: call before threads. */
void cgs_log_set_level(cgs_log_level level);
/* 1 when a line at level would be written (skip expensive formatting). */
int cgs_log_enabled(cgs_log_level level);
/* Parses "error", "warn", "info", "debug"; returns 0 or -1. */
int cgs_log_level_parse(const char *name, cgs_log_level *out);
const char *cgs_log_level_name(cgs_log_level level);

/* Writes s into dst[cap] as a log value: as it is when that is safe, else
 * between double quotes with quotes, backslashes and non-printable bytes
 * escaped (cut with "..." to fit). Every client-controlled string (paths,
 * peers, names, messages) goes through here before reaching a log line,
 * so a client can neither end a record nor forge a key=value in it.
 * Async-signal-safe: the crash report escapes its peer with it. */
void cgs_log_value(char *dst, size_t cap, const char *s);

/* Control bytes that still reach a line are written as \xNN. */
void cgs_log(cgs_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The same with a message already built (cg_text, without printf: the
 * line of every call). */
void cgs_log_str(cgs_log_level level, const char *msg);

/* Sends gRPC's own log lines (gpr_log, e.g. a failed TLS handshake) here
 * instead of raw to stderr: as `grpc FILE:LINE msg=...`, the message
 * escaped like any client value (it may quote what a client sent, such as
 * a TLS server name), at most GRPC_LINES_PER_S a second, with the count
 * of those left out on the next line. Call once, before grpc_init. */
void cgs_log_capture_grpc(void);

#define cgs_error(...) cgs_log(CGS_LOG_ERROR, __VA_ARGS__)
#define cgs_warn(...) cgs_log(CGS_LOG_WARN, __VA_ARGS__)
#define cgs_info(...) cgs_log(CGS_LOG_INFO, __VA_ARGS__)
#define cgs_debug(...) cgs_log(CGS_LOG_DEBUG, __VA_ARGS__)

#endif
