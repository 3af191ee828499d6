/* cgw.h - the wire codec that the server and libcgclient share.
 *
 * Headers and small messages go through protobuf-c. The bulk path does
 * not: a received ComputeRequest or ComputeResponse is scanned in place by
 * a small reader of the protobuf wire format, which tells where its data
 * sits, so that the caller copies those bytes once, straight from the
 * received slices into their destination; a chunk to send wraps the
 * caller's memory in a grpc slice behind a few bytes of framing. Everything
 * here is thread-safe (no shared state). */
#ifndef CGW_H
#define CGW_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/byte_buffer.h>
#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>

/* Declare to ThreadSanitizer an ordering that gRPC makes with its own
 * locks, which it cannot see in the uninstrumented library: what a thread
 * did before cgw_tsan_release(p) happens before what another does after
 * cgw_tsan_acquire(p) (a zero-copy slice's free on a gRPC thread after
 * the code that handed it over, say). No-ops without ThreadSanitizer. */
#if defined(__SANITIZE_THREAD__)
#define CGW_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CGW_TSAN 1
#endif
#endif
#ifdef CGW_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
static inline void cgw_tsan_release(void *p) {
  __tsan_release(p);
}
static inline void cgw_tsan_acquire(void *p) {
  __tsan_acquire(p);
}
#else
static inline void cgw_tsan_release(void *p) {
  (void)p;
}
static inline void cgw_tsan_acquire(void *p) {
  (void)p;
}
#endif

/* Which member of the kind oneof a message sets: field 1 or field 2 of
 * both ComputeRequest and ComputeResponse. */
typedef enum {
  CGW_NONE = 0,   /* neither */
  CGW_HEADER = 1, /* ComputeRequest.header or ComputeResponse.header */
  CGW_CHUNK = 2   /* ComputeRequest.chunk or ComputeResponse.chunk */
} cgw_kind;

/* What a scan found: the kind, and where the bytes that matter sit in the
 * (decompressed) message: the header's encoding, or the chunk's data. */
typedef struct cgw_view {
  cgw_kind kind;
  uint32_t input; /* DataChunk.input; 0 for a response */
  size_t off;     /* offset of the bytes in the message */
  size_t len;     /* their length */
} cgw_view;

/* Scans a ComputeRequest without copying its payload. A header ends the
 * scan (protobuf-c parses it whole); DataChunk fields merge as protobuf
 * merges them (the last value of a field wins). Returns 0 (kind NONE when
 * the message sets neither member), or -1 with what is wrong in err when
 * the bytes are not well-formed protobuf. */
int cgw_scan_request(grpc_byte_buffer *bb, cgw_view *v, char *err,
                     size_t errlen);

/* Scans a ComputeResponse the same way; the last member set wins. */
int cgw_scan_response(grpc_byte_buffer *bb, cgw_view *v, char *err,
                      size_t errlen);

/* Copies len bytes at offset off of bb's (decompressed) contents to dst.
 * Returns 0, or -1 when bb is shorter than off + len. */
int cgw_copy(grpc_byte_buffer *bb, size_t off, size_t len, void *dst);

/* Unpacks bb as a message of desc with protobuf-c. Returns the message
 * (free it with protobuf_c_message_free_unpacked(m, NULL)) or NULL when the
 * bytes are malformed or memory ran out. */
ProtobufCMessage *cgw_unpack(const ProtobufCMessageDescriptor *desc,
                             grpc_byte_buffer *bb);

/* Packs m into a new byte buffer owned by the caller, or NULL when memory
 * ran out. */
grpc_byte_buffer *cgw_pack(const ProtobufCMessage *m);

/* ComputeRequest{chunk = DataChunk{input, data = data[0..len)}} (with
 * input 0 also a StageRequest's chunk, byte for byte) and
 * ComputeResponse{chunk = data[0..len)} that reference data instead of
 * copying it: the buffer holds a slice over data whose release calls
 * unref(user) once grpc is done with it (on any thread). The caller must
 * take the reference unref will drop before calling. Return the buffer,
 * owned by the caller. (grpc's allocator does not return on failure.) */
grpc_byte_buffer *cgw_request_chunk(uint32_t input, const void *data,
                                    size_t len, void (*unref)(void *),
                                    void *user);
grpc_byte_buffer *cgw_response_chunk(const void *data, size_t len,
                                     void (*unref)(void *), void *user);

/* "OK", "CANCELLED", ... as grpc spells the codes; "?" for others. */
const char *cgw_status_name(grpc_status_code code);

#endif
