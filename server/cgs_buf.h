/* cgs_buf.h - tensor buffers with a small cache of freed big buffers.
 *
 * A fresh multi-megabyte allocation is an mmap whose every page faults and
 * is zeroed on first touch, and its free is an munmap: for a training loop
 * that sends the same shapes again and again that costs more than the
 * copy into the buffer. Freed buffers of at least CGS_BUF_CACHE_MIN bytes
 * are kept (up to a byte budget) and handed out again for requests of a
 * similar size. Thread-safe: output buffers are released by grpc threads
 * when the last slice referencing them goes. */
#ifndef CGS_BUF_H
#define CGS_BUF_H

#include <stddef.h>

#define CGS_BUF_CACHE_MIN (1u << 20)

/* Sets the most bytes the cache may hold (0 disables it). Call once at
 * start-up, before any other function here. */
void cgs_buf_init(size_t cache_bytes);
/* 64-byte-aligned memory for at least n bytes (n may be 0); NULL when out
 * of memory. Release it with cgs_buf_free. */
void *cgs_buf_alloc(size_t n);
/* Bytes p really holds: n rounded up, or more for a cached buffer. */
size_t cgs_buf_capacity(const void *p);
/* Releases p (NULL is fine): into the cache or to the system. */
void cgs_buf_free(void *p);
/* Bytes the cache holds now. */
size_t cgs_buf_cached_bytes(void);
/* Frees every cached buffer (at exit, and when the server is idle). */
void cgs_buf_drain(void);

#endif
