/* cgs_info.h - convgrad.v1.ConvGrad/GetServerInfo: version, ops and their
 * accepted names, dtypes and whether they run natively, oneDNN version and
 * ISA, workers, cores and limits. Loop thread only. */
#ifndef CGS_INFO_H
#define CGS_INFO_H

#include <grpc/grpc.h>

#include "cgs_server.h"

/* /convgrad.v1.ConvGrad/GetServerInfo, unary: answered at once. */
extern const cgs_method_def cgs_info_method;

#endif
