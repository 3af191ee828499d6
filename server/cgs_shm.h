/* cgs_shm.h - the shared-memory RPCs (shm.c): RegisterRegion,
 * UnregisterRegion and ListRegions on the server's region table, and who
 * may use regions under --shm. The RPCs and the sweep run on the loop
 * thread, cgs_shm_for_peer on any. */
#ifndef CGS_SHM_H
#define CGS_SHM_H

#include "cgs_region.h"
#include "cgs_server.h"

/* /convgrad.v1.ConvGrad/RegisterRegion, UnregisterRegion, ListRegions:
 * unary, answered at once, logged. */
extern const cgs_method_def cgs_shm_register_method;
extern const cgs_method_def cgs_shm_unregister_method;
extern const cgs_method_def cgs_shm_list_method;

/* Unregisters the regions unused for --region-idle-timeout, and logs
 * each (housekeeping). */
void cgs_shm_sweep(cgs_server *s);

/* The region table a caller at peer (grpc's peer string) may use, or NULL
 * with *why, a static text saying why not (--shm off, or --shm local and
 * a caller off this host). Any thread (the table is thread-safe). */
cgs_regions *cgs_shm_for_peer(const cgs_server *s, const char *peer,
                              const char **why);

#endif
