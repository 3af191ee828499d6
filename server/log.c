/* log.c - owns the server's log level and the formatting of log lines:
 * one record per line, whatever a client sends. */
#include "cgs_log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <grpc/support/log.h>

#include "cg/text.h"

/* gRPC lines a second; a flood of failed handshakes writes one each. */
#define GRPC_LINES_PER_S 20

static cgs_log_level log_level = CGS_LOG_INFO;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void cgs_log_set_level(cgs_log_level level) {
  log_level = level;
}

int cgs_log_enabled(cgs_log_level level) {
  return level <= log_level;
}

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

/* 1 when s can stand as a log value without quotes: printable ASCII that
 * cannot be read as a separator, a quote or a second key=value. */
static int bare(const char *s) {
  if (!*s)
    return 0;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    if (*p <= 0x20 || *p >= 0x7f || *p == '"' || *p == '\\' || *p == '=')
      return 0;
  return 1;
}

void cgs_log_value(char *dst, size_t cap, const char *s) {
  cg_text t;
  if (bare(s)) {
    cg_text_init(&t, dst, cap);
    cg_text_str(&t, s);
    return;
  }
  if (cap < 3) {
    cg_text_init(&t, dst, cap);
    return;
  }
  /* The closing quote has its byte kept back, so a cut keeps it. */
  dst[0] = '"';
  cg_text_init(&t, dst + 1, cap - 2);
  cg_text_escaped(&t, s, strlen(s));
  dst[1 + t.len] = '"';
  dst[2 + t.len] = '\0';
}

/* The timestamp's "2026-11-21T21:40:00" of this thread's last line:
 * formatted once a second, not at every line (a call writes one). */
static _Thread_local struct {
  time_t sec;
  char text[64]; /* room for any int the format could get */
} stamp = {.sec = -1};

/* Writes "2026-11-21T21:40:00.123Z " to line, which has room; returns its
 * length. */
static size_t put_stamp(char *line) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (ts.tv_sec != stamp.sec) {
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    snprintf(stamp.text, sizeof stamp.text, "%04d-%02d-%02dT%02d:%02d:%02d",
             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
             tm.tm_min, tm.tm_sec);
    stamp.sec = ts.tv_sec;
  }
  size_t n = strlen(stamp.text);
  long ms = ts.tv_nsec / 1000000L;
  memcpy(line, stamp.text, n);
  line[n++] = '.';
  line[n++] = (char)('0' + ms / 100);
  line[n++] = (char)('0' + ms / 10 % 10);
  line[n++] = (char)('0' + ms % 10);
  line[n++] = 'Z';
  line[n++] = ' ';
  return n;
}

void cgs_log_str(cgs_log_level level, const char *msg) {
  if (!cgs_log_enabled(level))
    return;
  /* Format into one buffer so the line goes out in a single write. */
  char line[2048];
  size_t n = put_stamp(line);
  /* The level, padded to 5 characters, and a space. */
  size_t k = strlen(level_names[level]);
  memcpy(line + n, level_names[level], k);
  memset(line + n + k, ' ', 6 - k);
  n += 6;
  /* Values from clients are quoted by the callers (cgs_log_value); this
   * is the backstop that keeps every record on one line whatever reached
   * the message. */
  cg_text t;
  cg_text_init(&t, line + n, sizeof line - n - 1);
  for (const char *p = msg; *p;) {
    size_t run = 0;
    while (p[run] && (unsigned char)p[run] >= 0x20 && p[run] != 0x7f)
      run++;
    cg_text_append(&t, p, run);
    p += run;
    if (*p)
      cg_text_escaped(&t, p++, 1);
  }
  size_t len = n + t.len;
  line[len++] = '\n';
  fwrite(line, 1, len, stderr);
}

void cgs_log(cgs_log_level level, const char *fmt, ...) {
  if (!cgs_log_enabled(level))
    return;
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  cgs_log_str(level, msg);
}

/* The per-second budget of gRPC's lines; gpr_log runs on any thread. */
static pthread_mutex_t grpc_mu = PTHREAD_MUTEX_INITIALIZER;
static time_t grpc_second;
static unsigned grpc_lines;
static uint64_t grpc_dropped;

static void on_grpc_log(gpr_log_func_args *a) {
  time_t now = time(NULL);
  uint64_t dropped = 0;
  pthread_mutex_lock(&grpc_mu);
  if (now != grpc_second) {
    grpc_second = now;
    grpc_lines = 0;
  }
  int allowed = grpc_lines < GRPC_LINES_PER_S;
  if (allowed) {
    grpc_lines++;
    dropped = grpc_dropped;
    grpc_dropped = 0;
  } else {
    grpc_dropped++;
  }
  pthread_mutex_unlock(&grpc_mu);
  if (!allowed)
    return;
  const char *file = strrchr(a->file, '/');
  char msg[600], note[80] = "";
  cgs_log_value(msg, sizeof msg, a->message);
  if (dropped)
    snprintf(note, sizeof note, " (%llu grpc lines before not logged)",
             (unsigned long long)dropped);
  cgs_log(a->severity == GPR_LOG_SEVERITY_ERROR  ? CGS_LOG_WARN
          : a->severity == GPR_LOG_SEVERITY_INFO ? CGS_LOG_INFO
                                                 : CGS_LOG_DEBUG,
          "grpc %s:%d msg=%s%s", file ? file + 1 : a->file, a->line, msg, note);
}

void cgs_log_capture_grpc(void) {
  gpr_set_log_function(on_grpc_log);
}
