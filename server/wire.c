/* wire.c - owns the protobuf wire-format reader used on the bulk data
 * path and the zero-copy encoding of response chunks. */
#include "cgs_wire.h"

#include <stdio.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>

/* Protobuf wire types. */
enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

/* A forward-only cursor over the slices of a byte buffer. */
typedef struct rd {
  grpc_byte_buffer_reader r;
  const uint8_t *p, *end; /* unread part of the current slice */
  size_t pos;             /* bytes consumed so far */
  size_t total;
} rd;

static int rd_init(rd *r, grpc_byte_buffer *bb) {
  memset(r, 0, sizeof *r);
  if (!grpc_byte_buffer_reader_init(&r->r, bb))
    return -1; /* undecompressable */
  r->total = grpc_byte_buffer_length(r->r.buffer_out);
  return 0;
}

static void rd_destroy(rd *r) { grpc_byte_buffer_reader_destroy(&r->r); }

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
      return -1;
    uint8_t b = *r->p++;
    r->pos++;
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *out = v;
      return 0;
    }
  }
  return -1; /* more than 10 bytes */
}

/* Skips n bytes, or copies them to dst when dst is not NULL. */
static int rd_take(rd *r, size_t n, uint8_t *dst) {
  while (n) {
    if (!rd_fill(r))
      return -1;
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

/* Skips the value of a field of wire type wt that ends by limit. */
static int rd_skip_field(rd *r, uint32_t wt, size_t limit) {
  uint64_t v;
  switch (wt) {
  case WT_VARINT:
    return rd_varint(r, &v);
  case WT_I64:
    return limit - r->pos < 8 ? -1 : rd_take(r, 8, NULL);
  case WT_I32:
    return limit - r->pos < 4 ? -1 : rd_take(r, 4, NULL);
  case WT_LEN:
    if (rd_varint(r, &v) != 0 || v > limit - r->pos)
      return -1;
    return rd_take(r, (size_t)v, NULL);
  default:
    return -1; /* groups are not proto3 */
  }
}

/* Parses a DataChunk occupying [r->pos, limit) into c, merging. */
static int scan_chunk(rd *r, size_t limit, cgs_chunk_view *c) {
  while (r->pos < limit) {
    uint64_t key, v;
    if (rd_varint(r, &key) != 0 || r->pos > limit)
      return -1;
    uint32_t field = (uint32_t)(key >> 3), wt = (uint32_t)(key & 7);
    if (field == 1 && wt == WT_VARINT) {
      if (rd_varint(r, &v) != 0)
        return -1;
      c->input = (uint32_t)v; /* uint32 fields truncate, as protobuf does */
    } else if (field == 2 && wt == WT_LEN) {
      if (rd_varint(r, &v) != 0 || v > limit - r->pos)
        return -1;
      c->data_off = r->pos;
      c->data_len = (size_t)v;
      if (rd_take(r, (size_t)v, NULL) != 0)
        return -1;
    } else if (field == 0 || field == 1 || field == 2 ||
               rd_skip_field(r, wt, limit) != 0) {
      /* field 0 is invalid; known fields with the wrong wire type too */
      return -1;
    }
    if (r->pos > limit)
      return -1;
  }
  return 0;
}

int cgs_wire_scan_request(grpc_byte_buffer *bb, cgs_msg_kind *kind,
                          cgs_chunk_view *chunk, char *err, size_t errlen) {
  rd r;
  int rc = -1, seen_chunk = 0;
  memset(chunk, 0, sizeof *chunk);
  if (rd_init(&r, bb) != 0) {
    snprintf(err, errlen, "request: cannot decompress message");
    return -1;
  }
  while (r.pos < r.total) {
    uint64_t key, len;
    if (rd_varint(&r, &key) != 0)
      goto malformed;
    uint32_t field = (uint32_t)(key >> 3), wt = (uint32_t)(key & 7);
    if (field == 1 && wt == WT_LEN) {
      *kind = CGS_MSG_HEADER; /* protobuf-c parses the whole thing */
      rc = 0;
      goto out;
    }
    if (field == 2 && wt == WT_LEN) {
      if (rd_varint(&r, &len) != 0 || len > r.total - r.pos)
        goto malformed;
      if (scan_chunk(&r, r.pos + (size_t)len, chunk) != 0)
        goto malformed;
      seen_chunk = 1;
    } else if (field == 0 || field == 1 || field == 2 ||
               rd_skip_field(&r, wt, r.total) != 0) {
      goto malformed;
    }
  }
  if (!seen_chunk) {
    snprintf(err, errlen, "request: message sets neither header nor chunk");
    goto out;
  }
  *kind = CGS_MSG_CHUNK;
  rc = 0;
  goto out;
malformed:
  snprintf(err, errlen, "request: malformed ComputeRequest message");
out:
  rd_destroy(&r);
  return rc;
}

int cgs_wire_copy(grpc_byte_buffer *bb, size_t off, size_t len, void *dst) {
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

ProtobufCMessage *cgs_wire_unpack(const ProtobufCMessageDescriptor *desc,
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

grpc_byte_buffer *cgs_wire_pack(const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  grpc_slice s = grpc_slice_malloc(n);
  protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return bb;
}

grpc_byte_buffer *cgs_wire_chunk_zero_copy(void *data, size_t len,
                                           void (*unref)(void *), void *user) {
  /* ComputeResponse field 2 (bytes): tag 0x12, then the varint length. */
  uint8_t frame[11];
  size_t n = 0;
  frame[n++] = (2 << 3) | WT_LEN;
  uint64_t v = len;
  do {
    frame[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
  grpc_slice parts[2];
  parts[0] = grpc_slice_from_copied_buffer((const char *)frame, n);
  parts[1] = grpc_slice_new_with_user_data(data, len, unref, user);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(parts, 2);
  grpc_slice_unref(parts[0]);
  grpc_slice_unref(parts[1]); /* bb holds its own refs */
  return bb;
}
