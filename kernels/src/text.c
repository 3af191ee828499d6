/* text.c - cg_text: appending to a fixed buffer without ever passing its
 * end, and marking where text was cut. */
#include "cg/text.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void cg_text_init(cg_text *t, char *buf, size_t cap) {
  t->buf = buf;
  t->cap = buf ? cap : 0;
  t->len = 0;
  t->cut = 0;
  if (t->cap)
    buf[0] = '\0';
}

/* Ends the text with the cut marker, as far as the buffer allows. */
static void mark_cut(cg_text *t) {
  t->cut = 1;
  if (!t->cap)
    return;
  size_t m = sizeof CG_TEXT_CUT - 1;
  if (m > t->cap - 1)
    m = t->cap - 1;
  t->len = t->cap - 1;
  memcpy(t->buf + t->len - m, CG_TEXT_CUT, m);
  t->buf[t->len] = '\0';
}

void cg_text_append(cg_text *t, const char *s, size_t n) {
  if (t->cut)
    return;
  if (!t->cap || n > t->cap - 1 - t->len) {
    if (t->cap)
      memcpy(t->buf + t->len, s, t->cap - 1 - t->len);
    mark_cut(t);
    return;
  }
  memcpy(t->buf + t->len, s, n);
  t->len += n;
  t->buf[t->len] = '\0';
}

void cg_text_appendf(cg_text *t, const char *fmt, ...) {
  if (t->cut)
    return;
  char tmp[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0)
    return;
  if ((size_t)n < sizeof tmp) {
    cg_text_append(t, tmp, (size_t)n);
    return;
  }
  /* Longer than the scratch: format in place, then mark the cut if the
   * buffer was too small too. */
  size_t room = t->cap ? t->cap - t->len : 0;
  if (room) {
    va_start(ap, fmt);
    vsnprintf(t->buf + t->len, room, fmt, ap);
    va_end(ap);
  }
  if ((size_t)n < room)
    t->len += (size_t)n;
  else
    mark_cut(t);
}

void cg_text_escaped(cg_text *t, const char *s, size_t n) {
  for (size_t i = 0; i < n && !t->cut; i++) {
    unsigned char ch = (unsigned char)s[i];
    char esc[5];
    if (ch == '\\' || ch == '"') {
      esc[0] = '\\';
      esc[1] = (char)ch;
      cg_text_append(t, esc, 2);
    } else if (ch < 0x20 || ch >= 0x7f) {
      esc[0] = '\\';
      esc[1] = 'x';
      esc[2] = "0123456789abcdef"[ch >> 4];
      esc[3] = "0123456789abcdef"[ch & 15];
      cg_text_append(t, esc, 4);
    } else {
      cg_text_append(t, (const char *)&s[i], 1);
    }
  }
}

void cg_text_int(cg_text *t, int64_t v) {
  char d[24]; /* a sign and 19 digits */
  size_t n = sizeof d;
  /* From the magnitude as unsigned: -INT64_MIN does not fit an int64_t. */
  uint64_t m = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
  do {
    d[--n] = (char)('0' + m % 10);
    m /= 10;
  } while (m);
  if (v < 0)
    d[--n] = '-';
  cg_text_append(t, d + n, sizeof d - n);
}

void cg_text_fixed3(cg_text *t, double v) {
  /* Thousandths as an integer, exact up to 2^53 of them; printf beyond
   * (and for NaN). */
  if (!(v > -9e12 && v < 9e12)) {
    cg_text_appendf(t, "%.3f", v);
    return;
  }
  if (signbit(v)) {
    cg_text_append(t, "-", 1);
    v = -v;
  }
  int64_t m = (int64_t)(v * 1000 + 0.5);
  char frac[4] = {(char)('0' + m / 100 % 10), (char)('0' + m / 10 % 10),
                  (char)('0' + m % 10), '.'};
  cg_text_int(t, m / 1000);
  cg_text_append(t, &frac[3], 1);
  cg_text_append(t, frac, 3);
}

void cg_text_str(cg_text *t, const char *s) {
  cg_text_append(t, s, strlen(s));
}

void cg_text_dims(cg_text *t, const int64_t *dims, size_t n) {
  for (size_t i = 0; i < n && !t->cut; i++) {
    if (i)
      cg_text_append(t, "x", 1);
    cg_text_int(t, dims[i]);
  }
}

int cg_text_plain_name(const char *s, size_t max) {
  size_t n = 0;
  int dots_only = 1;
  for (; s[n]; n++) {
    char c = s[n];
    if (n == max ||
        !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
      return 0;
    if (c != '.')
      dots_only = 0;
  }
  return n > 0 && !dots_only;
}
