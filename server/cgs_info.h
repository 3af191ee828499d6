/* cgs_info.h - convgrad.v1.ConvGrad/GetServerInfo: version, ops and their
 * accepted names, dtypes and whether they run natively, oneDNN version and
 * ISA, workers, cores and limits. Loop thread only. */
#ifndef CGS_INFO_H
#define CGS_INFO_H

#include <grpc/grpc.h>

#include "cgs_server.h"

/* Answers the call; takes ownership of call's reference and of payload. */
void cgs_info_handle(cgs_server *s, grpc_call *call, grpc_byte_buffer *payload);

#endif
