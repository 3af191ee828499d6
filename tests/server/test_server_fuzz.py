#!/usr/bin/python3
"""test_server_fuzz.py - seeded random Compute requests, most of them broken,
against a real convgrad-server: header fields set to out-of-range, huge or
negative values, wrong tensor counts, shapes and layouts, streams with
missing, extra, reordered, truncated or bit-flipped messages, and plain
garbage, from several threads at once, a quarter of the calls cut short
by a deadline of milliseconds or a client cancel. Every call must end with
OK, INVALID_ARGUMENT (with a message), RESOURCE_EXHAUSTED or UNIMPLEMENTED
(or DEADLINE_EXCEEDED / CANCELLED when cut short); the server must stay
SERVING and exit 0 on SIGTERM (under ASan/UBSan any report aborts it).
Exits 77 (ctest skip) when no stub generator is installed."""
import os
import random
import sys
import threading

from test_server_python import (common_args, prepare_stubs, serving,
                                start_server, stop_server)

EXPECTED = ("OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "UNIMPLEMENTED")
CUT_SHORT = EXPECTED + ("DEADLINE_EXCEEDED", "CANCELLED")


class Fuzzer:
    def __init__(self, pb, seed):
        self.pb = pb
        self.seed = seed
        self.rnd = random.Random(seed)

    def value(self):
        """An int64 that is often at an edge."""
        return self.rnd.choice([0, 1, 2, 3, -1, -5, 7, 64, 1 << 31, 1 << 62,
                                -(1 << 63), (1 << 63) - 1,
                                self.rnd.randint(-10, 100)])

    def values(self, most=5):
        return [self.value() for _ in range(self.rnd.randint(0, most))]

    def problem(self):
        """A small valid request: its header and its inputs' bytes."""
        pb, rnd = self.pb, self.rnd
        nsp = rnd.choice([1, 2, 3])
        mb, ic, oc = rnd.choice([1, 2]), rnd.choice([2, 4]), rnd.choice([2, 4])
        groups = rnd.choice([1, 2])
        op = rnd.choice([pb.CONVOLUTION_BACKWARD_DATA,
                         pb.CONVOLUTION_BACKWARD_WEIGHTS,
                         pb.CONV_TRANSPOSE_BACKWARD_DATA,
                         pb.CONV_TRANSPOSE_BACKWARD_WEIGHTS])
        conv = op in (pb.CONVOLUTION_BACKWARD_DATA,
                      pb.CONVOLUTION_BACKWARD_WEIGHTS)
        dtype = rnd.choice([pb.F32, pb.BF16, pb.F16])
        esize = 4 if dtype == pb.F32 else 2
        # Stride 1, no padding: the forward op maps src (ic channels) to
        # dst (oc channels), shrinking by k - 1 (convolution) or growing
        # by k - 1 (transposed convolution).
        src_sp = [rnd.choice([3, 4, 5]) for _ in range(nsp)]
        ks = [rnd.choice([1, 2, 3]) for _ in range(nsp)]
        dst_sp = [s - k + 1 if conv else s + k - 1
                  for s, k in zip(src_sp, ks)]
        src, dst = [mb, ic] + src_sp, [mb, oc] + dst_sp
        # OIX (O = oc, I = ic per group) for convolution; IOX (I = ic,
        # O = oc per group) for transposed convolution.
        weights = ([oc, ic // groups] if conv else [ic, oc // groups]) + ks
        attrs = pb.Attributes(strides=[1] * nsp, pads_begin=[0] * nsp,
                              pads_end=[0] * nsp, dilations=[1] * nsp,
                              groups=groups, data_format=pb.NCX,
                              weights_format=pb.OIX if conv else pb.IOX)
        if op == pb.CONVOLUTION_BACKWARD_DATA:
            attrs.dst_shape.extend(src)
        if op in (pb.CONVOLUTION_BACKWARD_WEIGHTS,
                  pb.CONV_TRANSPOSE_BACKWARD_WEIGHTS):
            attrs.weights_shape.extend(weights)
        shapes = (dst, weights) if op in (pb.CONVOLUTION_BACKWARD_DATA,
                                          pb.CONV_TRANSPOSE_BACKWARD_DATA) \
            else (src, dst)
        header = pb.ComputeHeader(op=op, attrs=attrs)
        data = []
        for shape in shapes:
            header.inputs.add(dtype=dtype, shape=shape)
            count = 1
            for d in shape:
                count *= d
            data.append(rnd.randbytes(count * esize))
        return header, data

    def break_header(self, h):
        """One field of h set to something out of range."""
        pb, rnd, a = self.pb, self.rnd, h.attrs
        field = rnd.randrange(15)
        if field == 0:
            h.op = rnd.choice([0, 5, 99, (1 << 31) - 1])
        elif field == 1:
            a.ClearField("strides")
            a.strides.extend(self.values())
        elif field == 2:
            a.ClearField("pads_begin")
            a.pads_begin.extend(self.values())
        elif field == 3:
            a.ClearField("dilations")
            a.dilations.extend(self.values())
        elif field == 4:
            a.groups = self.value()
        elif field == 5:
            a.auto_pad = rnd.choice([0, 1, 2, 3, 4, 77])
        elif field == 6:
            a.data_format = rnd.choice(range(10))
        elif field == 7:
            a.weights_format = rnd.choice(range(10))
        elif field == 8:
            t = rnd.choice(h.inputs)
            t.ClearField("shape")
            t.shape.extend(self.values(7))
        elif field == 9:
            rnd.choice(h.inputs).dtype = rnd.choice([0, 4, 5, 6, 42])
        elif field == 10:
            # A shape tensor of any type and length.
            h.inputs.add(dtype=rnd.choice([pb.S32, pb.S64, pb.F32]),
                         shape=[rnd.randint(-2, 6)],
                         data=rnd.randbytes(rnd.choice([0, 8, 12, 16, 40])))
        elif field == 11:
            a.ClearField("output_padding")
            a.output_padding.extend(self.values())
        elif field == 12:
            a.ClearField("dst_shape")
            a.dst_shape.extend(self.values(6))
        elif field == 13:
            a.ClearField("weights_shape")
            a.weights_shape.extend(self.values(6))
        else:
            h.response_chunk_bytes = rnd.choice([1, 7, 1024, (1 << 32) - 1])
        if rnd.random() < 0.2:
            rnd.choice(h.inputs).layout = rnd.choice(range(9))
        if rnd.random() < 0.2:
            h.output_layout = rnd.choice(range(9))

    def messages(self):
        """The serialized request stream of one call."""
        pb, rnd = self.pb, self.rnd
        header, data = self.problem()
        if rnd.random() < 0.5:
            for _ in range(rnd.choice([1, 1, 2])):
                self.break_header(header)
        inline = rnd.random() < 0.4
        if inline:
            for t, d in zip(header.inputs, data):
                t.data = d
        msgs = [pb.ComputeRequest(header=header).SerializeToString()]
        if not inline:
            for i, d in enumerate(data):
                size = rnd.choice([1, 7, 100, 1000, 5000])
                for off in range(0, len(d), size):
                    chunk = pb.DataChunk(input=i, data=d[off:off + size])
                    msgs.append(pb.ComputeRequest(chunk=chunk)
                                .SerializeToString())
        r = rnd.random()
        if r < 0.1 and len(msgs) > 1:
            msgs.pop(rnd.randrange(1, len(msgs)))
        elif r < 0.2:
            stray = pb.DataChunk(input=rnd.randint(0, 5),
                                 data=b"x" * rnd.randint(0, 50))
            msgs.insert(rnd.randrange(1, len(msgs) + 1),
                        pb.ComputeRequest(chunk=stray).SerializeToString())
        elif r < 0.3:
            msgs.append(msgs[0])  # the header again
        elif r < 0.45:
            i = rnd.randrange(len(msgs))
            b = bytearray(msgs[i])
            for _ in range(rnd.randint(1, 4)):
                if b:
                    b[rnd.randrange(len(b))] = rnd.getrandbits(8)
            msgs[i] = bytes(b)
        elif r < 0.55:
            i = rnd.randrange(len(msgs))
            msgs[i] = msgs[i][:rnd.randint(0, len(msgs[i]))]
        elif r < 0.6:
            msgs = [rnd.randbytes(rnd.randint(0, 64))]
        elif r < 0.65:
            msgs = msgs[:1]
        return msgs


def main():
    ap = common_args(__doc__)
    ap.add_argument("--calls", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=4)
    args = ap.parse_args()

    out = prepare_stubs(args.proto, args.workdir, "cgs-fuzz-")
    if not out:
        return 77
    import grpc
    from convgrad.v1 import convgrad_pb2 as pb

    log = open(os.path.join(out, "fuzz-server.log"), "w")
    proc, port = start_server(args.server, log)
    seen = {}
    unexpected = []
    lock = threading.Lock()

    def run(compute, fuzzer, calls):
        for call in range(calls):
            msgs = fuzzer.messages()
            cut = fuzzer.rnd.random()
            try:
                replies = compute(iter(msgs),
                                  timeout=0.002 + cut / 10 if cut < 0.15
                                  else 30)
                if 0.15 <= cut < 0.25:
                    replies.cancel()
                for _ in replies:
                    pass
                code, details = grpc.StatusCode.OK, ""
            except grpc.RpcError as e:
                code, details = e.code(), e.details()
            allowed = CUT_SHORT if cut < 0.25 else EXPECTED
            with lock:
                seen[code.name] = seen.get(code.name, 0) + 1
                if code.name not in allowed or \
                        (code != grpc.StatusCode.OK and not details):
                    unexpected.append((fuzzer.seed, call, code.name, details))

    try:
        ch = grpc.insecure_channel("127.0.0.1:%d" % port)
        # Raw bytes both ways: the fuzzer sends what no stub would.
        compute = ch.stream_stream("/convgrad.v1.ConvGrad/Compute",
                                   request_serializer=lambda b: b,
                                   response_deserializer=lambda b: b)
        threads = [threading.Thread(target=run,
                                    args=(compute,
                                          Fuzzer(pb, args.seed * 1000 + t),
                                          args.calls // args.threads))
                   for t in range(args.threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        status = serving(ch)
        ch.close()
    finally:
        rc = stop_server(proc, log)
    print("%d calls (seed %d, %d threads): %s" % (args.calls, args.seed,
                                                  args.threads,
                                      ", ".join("%s %d" % kv
                                                for kv in sorted(seen.items()))))
    for seed, call, code, details in unexpected[:10]:
        print("seed %d call %d: %s %r" % (seed, call, code, details))
    assert not unexpected, "%d calls ended unexpectedly" % len(unexpected)
    # The mix must reach both the kernels and the validation.
    assert seen.get("OK", 0) > args.calls // 20, seen
    assert seen.get("INVALID_ARGUMENT", 0) > args.calls // 3, seen
    assert status, "not SERVING after the calls"
    assert rc == 0, rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
