/* cg/error.h - the one error table shared by every convgrad library.
 *
 * Functions return 0 on success or a negative CG_E* code. Where a caller
 * passes an error buffer (char *err, size_t errlen) the function writes a
 * human-readable message naming the field and the problem, e.g.
 * "strides[1]: must be > 0, got 0". The buffer may be NULL. */
#ifndef CG_ERROR_H
#define CG_ERROR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CG_EXPORT __attribute__((visibility("default")))

/* X(name, value, message). Values are stable: they are logged and mapped
 * to gRPC status codes by the server. */
#define CG_ERRNO_MAP(X)                                                        \
  X(INVAL, -1, "invalid argument")                                             \
  X(RANGE, -2, "size out of range or overflows")                               \
  X(NOMEM, -3, "out of memory")                                                \
  X(UNSUPPORTED, -4, "unsupported by the compute backend")                     \
  X(BACKEND, -5, "compute backend failure")                                    \
  X(LIMIT, -6, "exceeds a configured limit")                                   \
  X(INTERNAL, -7, "internal error")                                            \
  X(DATALOSS, -8, "a result failed its check")

typedef enum {
#define CG__ERR_ENUM(name, value, msg) CG_E##name = (value),
  CG_ERRNO_MAP(CG__ERR_ENUM)
#undef CG__ERR_ENUM
} cg_errno;

/* Static string for an error code ("invalid argument"); never NULL. */
CG_EXPORT const char *cg_strerror(int err);
/* Static string with the symbolic name ("CG_EINVAL"); never NULL. */
CG_EXPORT const char *cg_err_name(int err);

/* printf-style write of an error message into err (may be NULL); returns
 * code unchanged so callers can write `return cg_errorf(...)`. */
CG_EXPORT int cg_errorf(char *err, size_t errlen, int code, const char *fmt,
                        ...) __attribute__((format(printf, 4, 5)));

#ifdef __cplusplus
}
#endif
#endif
