/* log.c - owns the server's log level and the formatting of log lines. */
#include "cgs_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static cgs_log_level log_level = CGS_LOG_INFO;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void cgs_log_set_level(cgs_log_level level) { log_level = level; }

int cgs_log_enabled(cgs_log_level level) { return level <= log_level; }

int cgs_log_level_parse(const char *name, cgs_log_level *out) {
  for (int i = 0; i < 4; i++) {
    if (strcmp(name, level_names[i]) == 0) {
      *out = (cgs_log_level)i;
      return 0;
    }
  }
  return -1;
}

const char *cgs_log_level_name(cgs_log_level level) {
  if ((int)level < 0 || level > CGS_LOG_DEBUG)
    return "?";
  return level_names[level];
}

void cgs_log(cgs_log_level level, const char *fmt, ...) {
  if (!cgs_log_enabled(level))
    return;
  /* Format into one buffer so the line goes out in a single write. */
  char line[2048];
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  int n = snprintf(line, sizeof line,
                   "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s ",
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                   tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000L,
                   level_names[level]);
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = (size_t)n;
  if (m > 0)
    len += (size_t)m < sizeof line - (size_t)n - 1
               ? (size_t)m
               : sizeof line - (size_t)n - 2; /* truncated */
  line[len++] = '\n';
  fwrite(line, 1, len, stderr);
}
