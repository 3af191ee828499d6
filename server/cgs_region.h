/* cgs_region.h - shared-memory regions (region.c): the table of regions
 * callers registered, their mappings, and the guard that keeps a region
 * truncated under the server from crashing it.
 *
 * A region is a range of a POSIX shared-memory object a client created
 * on this host. The server opens it by key (never following a symlink),
 * checks its size with fstat, maps the range once read-write and hands
 * out pointers into the mapping; tensors are read from and results
 * written to it without copies. The table belongs to the server; a call
 * takes a reference on each region it uses (cgs_region_acquire), so an
 * unregistered region stays mapped until its last call ends.
 *
 * The client owns the object and may shrink it at any time; touching a
 * mapped page past the object's new end raises SIGBUS. Each use checks the
 * size first (fstat), and the guard covers the rest: a SIGBUS inside a
 * region's mapping replaces that mapping with anonymous zero pages (the
 * faulting access then completes), and marks the region broken; the call
 * using it fails with FAILED_PRECONDITION instead of the process dying.
 * SIGBUS anywhere else keeps its default action.
 *
 * Regions are per caller: entries are keyed by (owner, name), owner the
 * caller's token label ("" without --auth-tokens). No gRPC call here: the
 * RPCs are shm.c's. Thread-safe (one mutex). */
#ifndef CGS_REGION_H
#define CGS_REGION_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/status.h>

typedef struct cgs_regions cgs_regions;
typedef struct cgs_region cgs_region;

/* Room of a name's and a key's text, NUL included. */
#define CGS_REGION_NAME_MAX 65
#define CGS_REGION_KEY_MAX 202

/* What ListRegions tells of one region. */
typedef struct cgs_region_info {
  char owner[160]; /* the caller's token label, "" without tokens */
  char name[CGS_REGION_NAME_MAX];
  char key[CGS_REGION_KEY_MAX];
  uint64_t offset, byte_size;
  unsigned calls;   /* calls using it (each holds one reference) */
  uint64_t idle_ms; /* since its registration or a call's start or end */
} cgs_region_info;

/* A new, empty table for at most max_regions regions of at most max_bytes
 * each, whose keys must start with "/" and key_prefix ("" = any name), and
 * the SIGBUS guard installed (once per process). Returns 0, or -1 with
 * msg. */
int cgs_regions_new(cgs_regions **out, unsigned max_regions, uint64_t max_bytes,
                    const char *key_prefix, char *msg, size_t msglen);
/* Drops every registration; regions still used by calls are unmapped when
 * their last reference goes. NULL is accepted. */
void cgs_regions_free(cgs_regions *rs);

/* Opens key, checks [offset, offset + byte_size) against the object's
 * size and the limits, maps it and records it as owner's name. The same
 * registration again is 0 (a client retrying), and maps the object afresh
 * when the region was truncated since. Returns 0, or -1 with *code
 * (INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, ALREADY_EXISTS,
 * RESOURCE_EXHAUSTED) and msg naming the field. */
int cgs_regions_register(cgs_regions *rs, const char *owner, const char *name,
                         const char *key, uint64_t offset, uint64_t byte_size,
                         grpc_status_code *code, char *msg, size_t msglen);
/* Removes owner's name; calls using it keep it. 0, or -1 with NOT_FOUND. */
int cgs_regions_unregister(cgs_regions *rs, const char *owner, const char *name,
                           grpc_status_code *code, char *msg, size_t msglen);
/* Fills up to max entries with owner's regions, in registration order;
 * returns how many. */
size_t cgs_regions_list(cgs_regions *rs, const char *owner,
                        cgs_region_info *out, size_t max);
/* Registered regions, all owners. */
size_t cgs_regions_count(cgs_regions *rs);
/* Unregisters up to max (at most 64) regions, of any owner, that no call
 * uses and none has used for idle_ms, nor were registered again since:
 * what a client that died left behind. Fills out with them; returns how
 * many. */
size_t cgs_regions_expire(cgs_regions *rs, uint64_t idle_ms,
                          cgs_region_info *out, size_t max);

/* For the tensor or output field names (e.g. "inputs[1].region"): owner's
 * region name, checked with fstat, and [offset, offset + len) within it,
 * offset a multiple of align. On success *r holds a reference (release it
 * with cgs_region_release) and *ptr points at offset in the mapping.
 * Returns 0, or -1 with *code (NOT_FOUND for an unknown name,
 * INVALID_ARGUMENT out of bounds or misaligned, FAILED_PRECONDITION for a
 * region truncated since registration) and msg. */
int cgs_region_acquire(cgs_regions *rs, const char *owner, const char *field,
                       const char *name, uint64_t offset, uint64_t len,
                       size_t align, cgs_region **r, unsigned char **ptr,
                       grpc_status_code *code, char *msg, size_t msglen);
/* Drops a reference; the last one of an unregistered region unmaps it. */
void cgs_region_release(cgs_region *r);
/* After a call's work: 0 while r is whole, else -1 with
 * FAILED_PRECONDITION and msg (the object was truncated under the
 * mapping: what was read or written there is lost). */
int cgs_region_check(const cgs_region *r, grpc_status_code *code, char *msg,
                     size_t msglen);
/* 1 when alen bytes at pa in a and blen bytes at pb in b (pointers from
 * cgs_region_acquire) share a byte of one object, even through two
 * registrations of it. */
int cgs_region_overlap(const cgs_region *a, const unsigned char *pa,
                       uint64_t alen, const cgs_region *b,
                       const unsigned char *pb, uint64_t blen);
/* p's offset in r's registered range (p from cgs_region_acquire). */
uint64_t cgs_region_offset(const cgs_region *r, const unsigned char *p);
/* The name a call's log and messages use. */
const char *cgs_region_name(const cgs_region *r);

#endif
