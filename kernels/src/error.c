/* error.c - the convgrad error table and message formatting. */
#include <stdarg.h>
#include <stdio.h>

#include "cg/error.h"

const char *cg_strerror(int err) {
  switch (err) {
#define CG__ERR_MSG(name, value, msg)                                          \
  case CG_E##name:                                                             \
    return msg;
    CG_ERRNO_MAP(CG__ERR_MSG)
#undef CG__ERR_MSG
  case 0:
    return "success";
  default:
    return "unknown error";
  }
}

const char *cg_err_name(int err) {
  switch (err) {
#define CG__ERR_NAME(name, value, msg)                                         \
  case CG_E##name:                                                             \
    return "CG_E" #name;
    CG_ERRNO_MAP(CG__ERR_NAME)
#undef CG__ERR_NAME
  case 0:
    return "CG_OK";
  default:
    return "CG_EUNKNOWN";
  }
}

int cg_errorf(char *err, size_t errlen, int code, const char *fmt, ...) {
  if (err != NULL && errlen > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return code;
}
