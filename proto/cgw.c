/* cgw.c - owns the protobuf wire-format reader used on the bulk data
 * path, the zero-copy framing of chunks, and the byte-buffer packing of
 * the other messages, for both ends of a call. */
#include "cgw.h"

#include <stdio.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>

/* Protobuf wire types. */
enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

/* Field numbers: the kind oneof of ComputeRequest and ComputeResponse, and
 * the members of DataChunk. */
enum { F_HEADER = 1, F_CHUNK = 2, F_INPUT = 1, F_DATA = 2 };

/* Longest framing written in front of a chunk's data: three tags and three
 * varints. */
#define FRAME_MAX 32

/* A forward-only cursor over the slices of a byte buffer. */
typedef struct rd {
  grpc_byte_buffer_reader r;
  const uint8_t *p, *end; /* unread part of the current slice */
  size_t pos;             /* bytes consumed so far */
  size_t total;
  const char *why; /* what made the scan fail */
} rd;

static int rd_init(rd *r, grpc_byte_buffer *bb) {
  memset(r, 0, sizeof *r);
  if (!grpc_byte_buffer_reader_init(&r->r, bb))
    return -1; /* undecompressable */
  r->total = grpc_byte_buffer_length(r->r.buffer_out);
  return 0;
}

static void rd_destroy(rd *r) {
  grpc_byte_buffer_reader_destroy(&r->r);
}

static int rd_fail(rd *r, const char *why) {
  if (!r->why)
    r->why = why;
  return -1;
}

/* Makes the current slice non-empty; 0 at the end of the buffer. */
static int rd_fill(rd *r) {
  while (r->p == r->end) {
    grpc_slice *s;
    if (!grpc_byte_buffer_reader_peek(&r->r, &s))
      return 0;
    r->p = GRPC_SLICE_START_PTR(*s);
    r->end = r->p + GRPC_SLICE_LENGTH(*s);
  }
  return 1;
}

static int rd_varint(rd *r, uint64_t *out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (!rd_fill(r))
      return rd_fail(r, "truncated varint");
    uint8_t b = *r->p++;
    r->pos++;
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *out = v;
      return 0;
    }
  }
  return rd_fail(r, "varint longer than 10 bytes");
}

/* Skips n bytes, or copies them to dst when dst is not NULL. */
static int rd_take(rd *r, size_t n, uint8_t *dst) {
  while (n) {
    if (!rd_fill(r))
      return rd_fail(r, "truncated field");
    size_t k = (size_t)(r->end - r->p);
    if (k > n)
      k = n;
    if (dst) {
      memcpy(dst, r->p, k);
      dst += k;
    }
    r->p += k;
    r->pos += k;
    n -= k;
  }
  return 0;
}

/* Reads the key of the next field, which must start before limit. */
static int rd_key(rd *r, size_t limit, uint32_t *field, uint32_t *wt) {
  uint64_t key;
  if (rd_varint(r, &key) != 0) {
    r->why = "truncated field tag";
    return -1;
  }
  if (r->pos > limit)
    return rd_fail(r, "a field runs past the end of its message");
  *field = (uint32_t)(key >> 3);
  *wt = (uint32_t)(key & 7);
  if (*field == 0)
    return rd_fail(r, "field number 0");
  return 0;
}

/* Reads the length of a length-delimited value that must end by limit. */
static int rd_len(rd *r, size_t limit, size_t *len) {
  uint64_t v = 0;
  if (rd_varint(r, &v) != 0)
    return -1;
  if (r->pos > limit || v > limit - r->pos)
    return rd_fail(r, "a field runs past the end of its message");
  *len = (size_t)v;
  return 0;
}

/* Skips the value of a field of wire type wt that ends by limit. */
static int rd_skip_field(rd *r, uint32_t wt, size_t limit) {
  uint64_t v;
  size_t n;
  switch (wt) {
  case WT_VARINT:
    return rd_varint(r, &v);
  case WT_I64:
  case WT_I32:
    n = wt == WT_I64 ? 8 : 4;
    if (limit - r->pos < n)
      return rd_fail(r, "a field runs past the end of its message");
    return rd_take(r, n, NULL);
  case WT_LEN:
    return rd_len(r, limit, &n) != 0 ? -1 : rd_take(r, n, NULL);
  default:
    return rd_fail(r, "unsupported wire type"); /* groups are not proto3 */
  }
}

/* Skips a field the caller did not take: fields numbered up to known are
 * the caller's, so one of them here has the wrong wire type. */
static int rd_skip_other(rd *r, uint32_t field, uint32_t wt, uint32_t known,
                         size_t limit) {
  int valid_wt =
      wt == WT_VARINT || wt == WT_I64 || wt == WT_LEN || wt == WT_I32;
  if (field <= known && valid_wt)
    return rd_fail(r, "a known field has the wrong wire type");
  return rd_skip_field(r, wt, limit);
}

/* Parses a DataChunk occupying [r->pos, limit) into v, merging. */
static int scan_chunk(rd *r, size_t limit, cgw_view *v) {
  while (r->pos < limit) {
    uint32_t field, wt;
    uint64_t x;
    if (rd_key(r, limit, &field, &wt) != 0)
      return -1;
    if (field == F_INPUT && wt == WT_VARINT) {
      if (rd_varint(r, &x) != 0)
        return -1;
      v->input = (uint32_t)x; /* uint32 fields truncate, as protobuf does */
    } else if (field == F_DATA && wt == WT_LEN) {
      if (rd_len(r, limit, &v->len) != 0)
        return -1;
      v->off = r->pos;
      if (rd_take(r, v->len, NULL) != 0)
        return -1;
    } else if (rd_skip_other(r, field, wt, F_DATA, limit) != 0) {
      return -1;
    }
    if (r->pos > limit)
      return rd_fail(r, "a field runs past the end of its message");
  }
  return 0;
}

/* Scans the top level of a ComputeRequest (request = 1) or ComputeResponse
 * into v. */
static int scan(grpc_byte_buffer *bb, int request, cgw_view *v, char *err,
                size_t errlen) {
  rd r;
  memset(v, 0, sizeof *v);
  if (rd_init(&r, bb) != 0) {
    snprintf(err, errlen, "cannot decompress the message");
    return -1;
  }
  int rc = 0;
  while (r.pos < r.total) {
    uint32_t field, wt;
    size_t len;
    if ((rc = rd_key(&r, r.total, &field, &wt)) != 0)
      break;
    if ((field == F_HEADER || field == F_CHUNK) && wt == WT_LEN) {
      if ((rc = rd_len(&r, r.total, &len)) != 0)
        break;
      if (field == F_HEADER) {
        v->kind = CGW_HEADER;
        v->input = 0;
        v->off = r.pos;
        v->len = len;
        if (request) /* protobuf-c parses the whole thing */
          break;
        rc = rd_take(&r, len, NULL);
      } else if (request) {
        v->kind = CGW_CHUNK;
        rc = scan_chunk(&r, r.pos + len, v);
      } else {
        v->kind = CGW_CHUNK;
        v->off = r.pos;
        v->len = len;
        rc = rd_take(&r, len, NULL);
      }
    } else {
      rc = rd_skip_other(&r, field, wt, F_CHUNK, r.total);
    }
    if (rc != 0)
      break;
  }
  if (rc != 0)
    snprintf(err, errlen, "%s", r.why ? r.why : "malformed message");
  rd_destroy(&r);
  return rc;
}

int cgw_scan_request(grpc_byte_buffer *bb, cgw_view *v, char *err,
                     size_t errlen) {
  return scan(bb, 1, v, err, errlen);
}

int cgw_scan_response(grpc_byte_buffer *bb, cgw_view *v, char *err,
                      size_t errlen) {
  return scan(bb, 0, v, err, errlen);
}

int cgw_copy(grpc_byte_buffer *bb, size_t off, size_t len, void *dst) {
  rd r;
  if (rd_init(&r, bb) != 0)
    return -1;
  int rc = -1;
  if (off <= r.total && len <= r.total - off && rd_take(&r, off, NULL) == 0 &&
      rd_take(&r, len, dst) == 0)
    rc = 0;
  rd_destroy(&r);
  return rc;
}

ProtobufCMessage *cgw_unpack(const ProtobufCMessageDescriptor *desc,
                             grpc_byte_buffer *bb) {
  grpc_byte_buffer_reader r;
  if (!grpc_byte_buffer_reader_init(&r, bb))
    return NULL;
  grpc_slice s = grpc_byte_buffer_reader_readall(&r);
  grpc_byte_buffer_reader_destroy(&r);
  ProtobufCMessage *m = protobuf_c_message_unpack(
      desc, NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
  grpc_slice_unref(s);
  return m;
}

grpc_byte_buffer *cgw_pack(const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  grpc_slice s = grpc_slice_malloc(n);
  protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return bb;
}

static size_t varint_put(uint8_t *p, uint64_t v) {
  size_t n = 0;
  while (v >= 0x80) {
    p[n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  p[n++] = (uint8_t)v;
  return n;
}

static size_t varint_len(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

/* Writes a field's key and the varint after it: the value of a varint
 * field, the length of a length-delimited one. */
static size_t put_field(uint8_t *p, uint32_t field, uint32_t wt, uint64_t v) {
  p[0] = (uint8_t)(field << 3 | wt);
  return 1 + varint_put(p + 1, v);
}

/* A buffer of two slices: a copy of the framing, and data in place. */
static grpc_byte_buffer *framed(const uint8_t *frame, size_t n,
                                const void *data, size_t len,
                                void (*unref)(void *), void *user) {
  grpc_slice parts[2];
  parts[0] = grpc_slice_from_copied_buffer((const char *)frame, n);
  parts[1] = grpc_slice_new_with_user_data((void *)data, len, unref, user);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(parts, 2);
  grpc_slice_unref(parts[0]);
  grpc_slice_unref(parts[1]); /* bb holds its own refs */
  return bb;
}

grpc_byte_buffer *cgw_request_chunk(uint32_t input, const void *data,
                                    size_t len, void (*unref)(void *),
                                    void *user) {
  /* proto3 omits a zero input index. */
  uint64_t dc_len =
      (input ? 1 + varint_len(input) : 0) + 1 + varint_len(len) + len;
  uint8_t frame[FRAME_MAX];
  size_t n = put_field(frame, F_CHUNK, WT_LEN, dc_len);
  if (input)
    n += put_field(frame + n, F_INPUT, WT_VARINT, input);
  n += put_field(frame + n, F_DATA, WT_LEN, len);
  return framed(frame, n, data, len, unref, user);
}

grpc_byte_buffer *cgw_response_chunk(const void *data, size_t len,
                                     void (*unref)(void *), void *user) {
  uint8_t frame[FRAME_MAX];
  size_t n = put_field(frame, F_CHUNK, WT_LEN, len);
  return framed(frame, n, data, len, unref, user);
}

const char *cgw_status_name(grpc_status_code code) {
  static const char *const names[] = {"OK",
                                      "CANCELLED",
                                      "UNKNOWN",
                                      "INVALID_ARGUMENT",
                                      "DEADLINE_EXCEEDED",
                                      "NOT_FOUND",
                                      "ALREADY_EXISTS",
                                      "PERMISSION_DENIED",
                                      "RESOURCE_EXHAUSTED",
                                      "FAILED_PRECONDITION",
                                      "ABORTED",
                                      "OUT_OF_RANGE",
                                      "UNIMPLEMENTED",
                                      "INTERNAL",
                                      "UNAVAILABLE",
                                      "DATA_LOSS",
                                      "UNAUTHENTICATED"};
  return (unsigned)code < sizeof names / sizeof names[0] ? names[code] : "?";
}
