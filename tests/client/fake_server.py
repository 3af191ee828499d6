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
                  permanent refusal.
Prints "fake-server ready listen=127.0.0.1:PORT" when serving.
Debian's python3-grpcio; no generated stubs needed.
"""
import sys
import threading
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


def header(shape=(2, 2), total=16, dtype=1, data=b"", worker=b"fake-0"):
    """ResultHeader: dtype (1), packed shape (2), total_bytes (4), worker (10),
    data (11) when given."""
    packed = b"".join(varint(d) for d in shape)
    return ld(1, varint(1 << 3) + varint(dtype) + ld(2, packed) +
              varint(4 << 3) + varint(total) + ld(10, worker) +
              (ld(11, data) if data else b""))


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


def scenario(name, attempt, context):
    """The answer of a retry scenario (see the module's comment)."""
    kind, _, ms = name.rpartition("-")
    if name == "limit":
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                      "request over a size limit (permanent)")
    if kind == "busy-once" and attempt is not None:
        return [header(data=bytes(range(16)),
                       worker=b"attempt=" + attempt.encode())]
    if kind in ("busy-once", "busy-always"):
        context.set_trailing_metadata((("retry-after-ms", ms),))
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                      "busy, attempt %s; retry later" % (attempt or "none"))
    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                  "fake server: unknown scenario " + name)


def compute(request_iterator, context):
    for _ in request_iterator:
        pass
    md = dict(context.invocation_metadata())
    token = md.get("authorization", "")
    if token.startswith("Bearer "):
        yield from scenario(token[7:], md.get("convgrad-retry-attempt"),
                            context)
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
