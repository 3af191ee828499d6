/* cg/text.h - bounded text building for log lines and messages.
 *
 * A cg_text writes into a caller's fixed buffer and never past it, whatever
 * the input, including a buffer of size 0. Text that does not fit is cut
 * and ends with CG_TEXT_CUT, so a reader sees that it was cut; later
 * appends are dropped. Client-controlled strings go through
 * cg_text_escaped, which keeps a log line one line and its quoting intact.
 * No allocation; thread-safe (a cg_text belongs to its caller). Every
 * function but cg_text_appendf (and cg_text_fixed3 beyond 9e12) is
 * async-signal-safe (no stdio, no locks):
 * the server's crash handler formats its report with them. */
#ifndef CG_TEXT_H
#define CG_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "cg/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CG_TEXT_CUT "..."

typedef struct {
  char *buf;
  size_t cap; /* bytes at buf, the terminating NUL included */
  size_t len; /* bytes written, without the NUL */
  int cut;    /* 1 once something did not fit */
} cg_text;

/* Starts an empty text in buf[cap] (buf may be NULL when cap is 0). */
CG_EXPORT void cg_text_init(cg_text *t, char *buf, size_t cap);
/* Appends n bytes of s as they are. */
CG_EXPORT void cg_text_append(cg_text *t, const char *s, size_t n);
/* Appends the string s as it is. */
CG_EXPORT void cg_text_str(cg_text *t, const char *s);
CG_EXPORT void cg_text_appendf(cg_text *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Appends n bytes of s with '\\' and '"' backslash-escaped and every byte
 * outside printable ASCII (controls, DEL, and 0x80 up, so no terminal
 * sequence either) as \xNN: the result can sit between double quotes in a
 * one-line log record. */
CG_EXPORT void cg_text_escaped(cg_text *t, const char *s, size_t n);
/* Appends v in decimal, as printf's PRId64 does. */
CG_EXPORT void cg_text_int(cg_text *t, int64_t v);
/* Appends v with three decimals, as printf's %.3f does, without its cost
 * (the server's log line has five): to the nearest thousandth, halves away
 * from zero, so a value within a rounding error of a half-thousandth may
 * end one thousandth away from printf's. */
CG_EXPORT void cg_text_fixed3(cg_text *t, double v);
/* Appends dims as "2x3x4" ("" for n = 0). */
CG_EXPORT void cg_text_dims(cg_text *t, const int64_t *dims, size_t n);

/* 1 when s is 1 to max characters of A-Z a-z 0-9 . _ - and not only dots:
 * a name that is safe as one path component (shared-memory region names
 * and keys). */
CG_EXPORT int cg_text_plain_name(const char *s, size_t max);

#ifdef __cplusplus
}
#endif
#endif
