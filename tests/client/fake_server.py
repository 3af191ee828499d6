#!/usr/bin/python3
"""fake_server.py - a convgrad.v1.ConvGrad/Compute server that breaks the
wire contract on purpose, for the client's malformed-response test.

Call number i (counted from 0) is answered with the responses of SCRIPT[i]
as raw bytes, then status OK, so the client's own parser meets: a chunk
before the header, a header whose total disagrees with its shape, more or
fewer bytes than announced, a shape that overflows, a result above the
client's size cap, an undecodable message, two headers (the second before
the first output is whole, or an output not asked for), inline data
(ResultHeader.data) that is not the whole result or is followed by a
chunk, and two correct answers (chunked and inline).

A call whose token ("authorization: Bearer SCENARIO") names a scenario is
answered by it instead, for the client's retry tests:
  busy-once-MS    refused RESOURCE_EXHAUSTED with trailing metadata
                  retry-after-ms: MS, unless the request carries
                  convgrad-retry-attempt; then answered (the inline result)
                  with worker "attempt=N", N the header's value;
  busy-always-MS  always refused so, the message naming the attempt
                  ("attempt N", "attempt none" for the first);
  limit           refused RESOURCE_EXHAUSTED without the trailer, a
                  permanent refusal;
  slow-MS         answered (the inline result) after MS milliseconds;
  busy-then-slow-MS  the first attempt refused as busy-always-5 is, a
                  retry answered as slow-MS is (a retry the client's
                  deadline overtakes while the server holds it);
  row-I           answered with SCRIPT[I], whatever the call count;
  partial         a layer op's first attempt gets its first output
                  (bytes 0..15) and then "retry later"; a retry gets each
                  output its header names (output g: bytes 16g..16g+15) and
                  the worker "outputs=LIST", the outputs it asked for.
Prints "fake-server ready listen=127.0.0.1:PORT" when serving.
Debian's python3-grpcio; no generated stubs needed.
"""
import sys
import threading
import time
from concurrent import futures

import grpc


def varint(n):
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def ld(num, payload):
    """A length-delimited field."""
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def header(shape=(2, 2), total=16, dtype=1, data=b"", worker=b"fake-0",
           output=0):
    """ResultHeader: dtype (1), packed shape (2), total_bytes (4), worker (10),
    data (11) and output (12) when given."""
    packed = b"".join(varint(d) for d in shape)
    return ld(1, varint(1 << 3) + varint(dtype) + ld(2, packed) +
              varint(4 << 3) + varint(total) + ld(10, worker) +
              (ld(11, data) if data else b"") +
              (varint(12 << 3) + varint(output) if output else b""))


def read_varint(buf, i):
    """The varint at buf[i:] and the index past it."""
    v, shift = 0, 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return v, i


def fields(buf):
    """(number, value) of each field of a message: an int for varints,
    bytes for length-delimited fields."""
    i = 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        if key & 7 == 0:
            v, i = read_varint(buf, i)
        elif key & 7 == 2:
            n, i = read_varint(buf, i)
            v, i = buf[i:i + n], i + n
        else:
            raise ValueError("fake server: wire type %d" % (key & 7))
        yield key >> 3, v


def asked_outputs(first_message):
    """ComputeRequest.header (1) -> ComputeHeader.outputs (6), packed or
    not."""
    out = []
    for num, hdr in fields(first_message):
        for f, v in fields(hdr) if num == 1 else ():
            if f == 6 and isinstance(v, int):
                out.append(v)
            elif f == 6:
                i = 0
                while i < len(v):
                    g, i = read_varint(v, i)
                    out.append(g)
    return out


def chunk(data):
    return ld(2, data)


SCRIPT = [
    [chunk(bytes(16))],                                  # chunk first
    [header(total=12)],                                  # total != shape
    [header(), chunk(bytes(20))],                        # too much data
    [header(), chunk(bytes(8))],                         # too little data
    [header(shape=(1 << 40, 1 << 40), total=0)],         # shape overflows
    [header(shape=(1 << 20, 1 << 20), total=4 << 40)],   # 4 TiB: over cap
    [b"\xff\xff\xff"],                                   # truncated tag
    [b"\x1f"],                                           # wire type 7
    [header(), header()],                                # two headers
    [header(data=bytes(16)), header(data=bytes(16))],    # an extra output
    [header(dtype=4)],                                   # s32 result
    [header(data=bytes(8))],                             # inline, short
    [header(data=bytes(16)), chunk(bytes(4))],           # inline + chunk
    [header(), chunk(bytes(range(8))), chunk(bytes(range(8, 16)))],  # ok
    [header(data=bytes(range(16)))],                     # ok, inline
]

lock = threading.Lock()
calls = [0]


def scenario(name, attempt, first, context):
    """The answer of a retry scenario (see the module's comment); first is
    the request's first message."""
    kind, _, ms = name.rpartition("-")
    if kind == "busy-then-slow":
        kind, ms = ("busy-always", "5") if attempt is None else ("slow", ms)
    if kind == "row":
        return SCRIPT[int(ms)], None
    if kind == "slow":
        # In steps, so that a call the client gave up frees the thread.
        end = time.monotonic() + int(ms) / 1000
        while time.monotonic() < end and context.is_active():
            time.sleep(0.005)
        return [header(data=bytes(range(16)))], None
    if name == "partial" and attempt is None:
        context.set_trailing_metadata((("retry-after-ms", "5"),))
        return [header(data=bytes(range(16)), output=1)], "retry later"
    if name == "partial":
        outs = asked_outputs(first)
        listed = ",".join(str(g) for g in outs).encode()
        return [header(data=bytes(range(16 * g, 16 * g + 16)), output=g,
                       worker=b"outputs=" + listed) for g in outs], None
    if name == "limit":
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                      "request over a size limit (permanent)")
    if kind == "busy-once" and attempt is not None:
        return [header(data=bytes(range(16)),
                       worker=b"attempt=" + attempt.encode())], None
    if kind in ("busy-once", "busy-always"):
        context.set_trailing_metadata((("retry-after-ms", ms),))
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                      "busy, attempt %s; retry later" % (attempt or "none"))
    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                  "fake server: unknown scenario " + name)


def compute(request_iterator, context):
    first = None
    for msg in request_iterator:
        first = msg if first is None else first
    md = dict(context.invocation_metadata())
    token = md.get("authorization", "")
    if token.startswith("Bearer "):
        msgs, refusal = scenario(token[7:], md.get("convgrad-retry-attempt"),
                                 first, context)
        yield from msgs
        if refusal:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
        return
    with lock:
        i = calls[0]
        calls[0] += 1
    for msg in SCRIPT[i % len(SCRIPT)]:
        yield msg


def main():
    listen = "127.0.0.1:0"
    if len(sys.argv) > 2 and sys.argv[1] == "--listen":
        listen = sys.argv[2]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.stream_stream_rpc_method_handler(compute)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "convgrad.v1.ConvGrad", {"Compute": handler}),))
    port = server.add_insecure_port(listen)
    server.start()
    print(f"fake-server ready listen=127.0.0.1:{port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
