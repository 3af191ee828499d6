/* errors.c - libcgclient's version, its names for error codes, gRPC
 * status codes, layouts and health states, and the cgc_status writers. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <grpc/slice.h>

#include "cgw.h"
#include "internal.h"

const char *cgc_version(void) {
  return CGC_LIBRARY_VERSION;
}

const char *cgc_strerror(int err) {
  switch (err) {
#define CGC__ERR_STR(name, value, msg)                                         \
  case value:                                                                  \
    return msg;
    CGC_ERRNO_MAP(CGC__ERR_STR)
#undef CGC__ERR_STR
  default:
    return cg_strerror(err);
  }
}

const char *cgc_status_code_name(grpc_status_code code) {
  return cgw_status_name(code);
}

const char *cgc_layout_name(cgc_layout l) {
  static const char *const names[] = {"default", "NCX", "NXC", "OIX",
                                      "XIO",     "IOX", "XOI"};
  if ((int)l < 0 || (size_t)l >= sizeof names / sizeof names[0])
    return "?";
  return names[l];
}

const char *cgc_health_status_name(cgc_health_status s) {
  static const char *const names[] = {"UNKNOWN", "SERVING", "NOT_SERVING",
                                      "SERVICE_UNKNOWN"};
  if ((int)s < 0 || (size_t)s >= sizeof names / sizeof names[0])
    return "?";
  return names[s];
}

void cgc__status_set(cgc_status *st, grpc_status_code code, const char *fmt,
                     ...) {
  if (!st)
    return;
  st->code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(st->message, sizeof st->message, fmt, ap);
  va_end(ap);
}

void cgc__status_ok(cgc_status *st) {
  if (!st)
    return;
  st->code = GRPC_STATUS_OK;
  st->message[0] = '\0';
}

void cgc__status_from_grpc(cgc_status *st, grpc_status_code code,
                           grpc_slice details) {
  if (!st)
    return;
  size_t n = GRPC_SLICE_LENGTH(details);
  if (n >= sizeof st->message)
    n = sizeof st->message - 1;
  memcpy(st->message, GRPC_SLICE_START_PTR(details), n);
  st->message[n] = '\0';
  st->code = code;
}
