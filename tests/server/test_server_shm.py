#!/usr/bin/python3
"""test_server_shm.py - shared-memory regions end to end, with objects made
under /dev/shm by this process (named after its pid, always unlinked) and a
grpcio client generated from proto/:

* every op (the four single ops and both layer ops with all three outputs)
  in F32 and BF16, NCX data with OIX / IOX weights, a plain, a strided,
  padded and grouped, and a dilated problem, inputs and outputs in regions
  at element-aligned offsets that are not 64-byte aligned, in one region or
  in two regions of two objects registered at offsets into them: every
  result against torch, the ResultHeader's region, no chunk, and the bytes
  around each output untouched;
* mixed requests: inline data, chunks and region inputs in one call, and a
  layer call with one output in a region and the others streamed;
* every refusal, with its exact status and a message naming the field
  (RegisterRegion's name, key, range and limits, UnregisterRegion,
  Compute's region references and output_regions), each followed by a
  valid call; --max-regions and --max-region-bytes on a second server;
  --shm off; --shm local and on for a caller on a non-loopback address and
  on a unix socket;
* an object truncated before a call (FAILED_PRECONDITION) and while a slow
  call (calibrated from the server's compute_ms) uses it: the call fails
  FAILED_PRECONDITION, the server lives on, the region stays broken until
  registered again, then works;
* a region unregistered while a slow call uses it: the call completes with
  the right result, later calls get NOT_FOUND;
* two clients on two channels, each with its own region, calling at once;
* a restarted server forgets its registrations;
* keys outside --shm-prefix (PERMISSION_DENIED), and --shm-prefix '';
* --region-idle-timeout: a region in use stays, an idle one is
  unregistered and logged, then NOT_FOUND, then registered again;
* GetServerInfo's shm and region limits.
Every server must exit 0 on SIGTERM (under ASan/UBSan/TSan any report
makes it fail). Exits 77 (ctest skip) when no stub generator is
installed."""
import math
import mmap
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from test_server_python import (common_args, prepare_stubs, serving,
                                start_server, stop_server)

PID = os.getpid()
LIVE = set()  # paths of the shm objects made, unlinked whatever happens
LOGS = []     # server logs, shown when the test fails
DEFERRED = []  # failures that do not stop the test, asserted at its end
F32_TOL, BF16_TOL = 1e-5, 2e-2  # of the reference's largest magnitude
SENTINEL = 0xA5

pb = pbg = grpc = torch = F = None  # imported once the stubs exist


# ---- shared-memory objects and regions ---------------------------------

class ShmObject:
    """A POSIX shm object (a file under /dev/shm), mapped here. Bytes go
    in and out by copies (no exported buffers), so the mapping can be
    dropped before the object is truncated under it."""

    def __init__(self, tag, size, prefix="convgrad-"):
        self.key = "/%stest-shm-%d-%s" % (prefix, PID, tag)
        self.path = "/dev/shm" + self.key
        LIVE.add(self.path)
        if os.path.lexists(self.path):
            os.unlink(self.path)
        self.fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR,
                          0o600)
        self.mm = None
        self.resize(size)

    def resize(self, size):
        """Truncates or grows the object and maps it again (not at 0)."""
        self.unmap()
        os.ftruncate(self.fd, size)
        self.size = size
        if size:
            self.mm = mmap.mmap(self.fd, size)

    def unmap(self):
        if self.mm is not None:
            self.mm.close()
            self.mm = None

    def fill(self, byte=SENTINEL):
        """The first MiB (where the small problems go) set to byte."""
        n = min(self.size, 1 << 20)
        self.mm[:n] = bytes([byte]) * n

    def write(self, off, data):
        data = memoryview(data).cast("B")
        self.mm[off:off + len(data)] = data

    def read(self, off, n):
        return self.mm[off:off + n]

    def close(self):
        if self.fd is None:
            return
        self.unmap()
        os.close(self.fd)
        self.fd = None
        os.unlink(self.path)
        LIVE.discard(self.path)


class Region:
    """[offset, offset + size) of obj, registered as name."""

    def __init__(self, obj, name, offset=0, size=None):
        self.obj, self.name, self.offset = obj, name, offset
        self.size = obj.size - offset if size is None else size

    def request(self):
        return pb.RegisterRegionRequest(name=self.name, key=self.obj.key,
                                        offset=self.offset,
                                        byte_size=self.size)

    def register(self, stub):
        stub.RegisterRegion(self.request(), timeout=10)
        return self

    def unregister(self, stub):
        stub.UnregisterRegion(pb.UnregisterRegionRequest(name=self.name),
                              timeout=10)

    def put(self, off, data):
        self.obj.write(self.offset + off, data)

    def get(self, off, n):
        return self.obj.read(self.offset + off, n)

    def ref(self, off, n):
        return pb.RegionRef(name=self.name, offset=off, byte_size=n)


def listed(stub):
    """ListRegions as {name: RegionInfo}."""
    return {r.name: r for r in
            stub.ListRegions(pb.ListRegionsRequest(), timeout=10).regions}


# ---- dtypes, problems and references ------------------------------------

def esize(dtype):
    return 4 if dtype == pb.F32 else 2


def encode(a, dtype):
    """a rounded to dtype (by truncation for bf16): its exact values as
    float64, and its wire bytes."""
    f = np.ascontiguousarray(a, dtype="<f4")
    if dtype == pb.F32:
        return f.astype(np.float64), f.tobytes()
    bits = (f.view("<u4") >> 16).astype("<u2")
    return decode(bits.tobytes(), dtype, f.shape), bits.tobytes()


def decode(b, dtype, shape):
    if dtype == pb.F32:
        a = np.frombuffer(b, "<f4")
    else:
        a = (np.frombuffer(b, "<u2").astype("<u4") << 16).view("<f4")
    return a.astype(np.float64).reshape(shape)


def check_close(got, want, dtype, what):
    scale = max(1.0, float(np.max(np.abs(want))))
    tol = (F32_TOL if dtype == pb.F32 else BF16_TOL) * scale
    err = float(np.max(np.abs(got - want)))
    assert err <= tol, "%s: max error %.3g > %.3g" % (what, err, tol)
    return err / scale


class Problem:
    """A 2-D convolution (transposed: ConvTranspose) in the forward
    direction, src (N, IC, H, W) to dst (N, OC, Ho, Wo); weights OIX
    (OC, IC/g, k, k) or IOX (IC, OC/g, k, k), PyTorch's layouts."""

    def __init__(self, transposed, n, ic, oc, g, hw, k, s=1, p=0, d=1,
                 opad=0):
        self.transposed, self.g, self.k = transposed, g, k
        self.s, self.p, self.d, self.opad = s, p, d, opad
        ek = (k - 1) * d + 1
        if transposed:
            out = [s * (x - 1) + ek - 2 * p + opad for x in hw]
            self.wei = [ic, oc // g, k, k]
        else:
            out = [(x + 2 * p - ek) // s + 1 for x in hw]
            self.wei = [oc, ic // g, k, k]
        self.src, self.dst = [n, ic] + list(hw), [n, oc] + out
        self.oc = oc
        self.ops = ((pb.CONV_TRANSPOSE_BACKWARD_DATA,
                     pb.CONV_TRANSPOSE_BACKWARD_WEIGHTS,
                     pb.CONV_TRANSPOSE_BACKWARD) if transposed else
                    (pb.CONVOLUTION_BACKWARD_DATA,
                     pb.CONVOLUTION_BACKWARD_WEIGHTS,
                     pb.CONVOLUTION_BACKWARD))
        self.wfmt = pb.IOX if transposed else pb.OIX

    def __str__(self):
        return "%s src %s dst %s weights %s s%d p%d d%d g%d" % (
            "convT" if self.transposed else "conv", self.src, self.dst,
            self.wei, self.s, self.p, self.d, self.g)

    def attrs(self, op):
        a = pb.Attributes(strides=[self.s] * 2, pads_begin=[self.p] * 2,
                          pads_end=[self.p] * 2, dilations=[self.d] * 2,
                          groups=self.g, data_format=pb.NCX,
                          weights_format=self.wfmt)
        if op == pb.CONVOLUTION_BACKWARD_DATA:
            a.dst_shape.extend(self.src)
        if op in (pb.CONVOLUTION_BACKWARD_WEIGHTS,
                  pb.CONV_TRANSPOSE_BACKWARD_WEIGHTS):
            a.weights_shape.extend(self.wei)
        if self.transposed and self.opad:
            a.output_padding.extend([self.opad] * 2)
        return a

    def tensors(self, dtype, seed):
        """{"x", "dy", "w"}: (float64 values, wire bytes, shape)."""
        rng = np.random.default_rng(seed)
        out = {}
        for name, shape in (("x", self.src), ("dy", self.dst),
                            ("w", self.wei)):
            vals, raw = encode(rng.uniform(-1, 1, shape), dtype)
            out[name] = (vals, raw, shape)
        return out

    def reference(self, t):
        """{Output: float64 array}, by autograd through torch's forward
        op."""
        x = torch.tensor(t["x"][0], requires_grad=True)
        w = torch.tensor(t["w"][0], requires_grad=True)
        if self.transposed:
            y = F.conv_transpose2d(x, w, None, self.s, self.p, self.opad,
                                   self.g, self.d)
        else:
            y = F.conv2d(x, w, None, self.s, self.p, self.d, self.g)
        assert list(y.shape) == self.dst, (str(self), list(y.shape))
        y.backward(torch.tensor(t["dy"][0]))
        return {pb.DIFF_SRC: x.grad.numpy(), pb.DIFF_WEIGHTS: w.grad.numpy(),
                pb.DIFF_BIAS: t["dy"][0].sum(axis=(0, 2, 3))}

    def layout(self, output):
        return {pb.DIFF_SRC: pb.NCX, pb.DIFF_WEIGHTS: self.wfmt,
                pb.DIFF_BIAS: pb.LAYOUT_UNSPECIFIED}[output]


def is_layer(op):
    return op in (pb.CONVOLUTION_BACKWARD, pb.CONV_TRANSPOSE_BACKWARD)


def op_inputs(op):
    if is_layer(op):
        return ("x", "dy", "w")
    if op in (pb.CONVOLUTION_BACKWARD_DATA, pb.CONV_TRANSPOSE_BACKWARD_DATA):
        return ("dy", "w")
    return ("x", "dy")


def op_outputs(op):
    if is_layer(op):
        return [pb.DIFF_SRC, pb.DIFF_WEIGHTS, pb.DIFF_BIAS]
    if op in (pb.CONVOLUTION_BACKWARD_DATA, pb.CONV_TRANSPOSE_BACKWARD_DATA):
        return [pb.DIFF_SRC]
    return [pb.DIFF_WEIGHTS]


def compute(stub, header, chunks=(), timeout=30):
    """One Compute call: the header, then (input, bytes) chunks."""
    msgs = [pb.ComputeRequest(header=header)]
    msgs += [pb.ComputeRequest(chunk=pb.DataChunk(input=i, data=b))
             for i, b in chunks]
    return list(stub.Compute(iter(msgs), timeout=timeout))


def split_outputs(msgs):
    """[(header, bytes or None)]: an output in a region is its header alone
    (no data, no chunk); the others are a header, then chunks until
    total_bytes."""
    outs, i = [], 0
    while i < len(msgs):
        assert msgs[i].WhichOneof("kind") == "header", (i, msgs[i])
        head = msgs[i].header
        i += 1
        if head.HasField("region"):
            assert not head.data, head
            outs.append((head, None))
            continue
        data = head.data
        while len(data) < head.total_bytes:
            assert msgs[i].WhichOneof("kind") == "chunk", i
            data += msgs[i].chunk
            i += 1
        assert len(data) == head.total_bytes, head
        outs.append((head, data))
    return outs


def deferred(ok, msg):
    """A failure that leaves the server usable: reported now, failing the
    test at its end, so that the checks after it still run."""
    if not ok:
        DEFERRED.append(msg)
        print("FAILED (reported at the end): " + msg)


def expect(what, fn, code, *fragments):
    """fn() must fail with code, its message holding every fragment."""
    try:
        fn()
    except grpc.RpcError as e:
        assert e.code() == code, "%s: got %s %r, expected %s" % (
            what, e.code().name, e.details(), code.name)
        for f in fragments:
            assert f in (e.details() or ""), "%s: %r lacks %r" % (
                what, e.details(), f)
        return e.details()
    raise AssertionError("%s: accepted, expected %s" % (what, code.name))


# ---- one call with its inputs and outputs in regions -------------------

def region_call(stub, prob, op, dtype, base, rin, rout, seed, room_exact=True,
                reverse=False):
    """prob's op with every input in rin and every output in rout (rout may
    be rin), placed from base on with base bytes between them; checks the
    headers, the results against torch and the sentinel bytes around each
    output, and that the inputs' bytes are left as they were. Returns the
    largest relative error."""
    t = prob.tensors(dtype, seed)
    want = prob.reference(t)
    rin.obj.fill()
    rout.obj.fill()
    pos, inputs, sent = base, [], []
    for name in op_inputs(op):
        _, raw, shape = t[name]
        rin.put(pos, raw)
        inputs.append(pb.Tensor(dtype=dtype, shape=shape,
                                region=rin.ref(pos, len(raw))))
        sent.append((pos, raw))
        pos += len(raw) + base
    if rout is not rin:
        pos = base
    places, wanted = {}, []
    for k, out in enumerate(op_outputs(op)):
        n = want[out].size * esize(dtype)
        room = n if room_exact or k % 2 else 0
        wanted.append(pb.OutputRegion(
            output=out if is_layer(op) else pb.OUTPUT_UNSPECIFIED,
            region=rout.ref(pos, room)))
        places[out] = (pos, n)
        pos += n + base
    assert pos <= rout.size, ("region too small", pos, rout.size)
    header = pb.ComputeHeader(op=op, attrs=prob.attrs(op), inputs=inputs,
                              output_regions=wanted[::-1] if reverse
                              else wanted)
    what = "%s %s %s base %d" % (pb.Op.Name(op), pb.DType.Name(dtype),
                                 prob, base)
    msgs = compute(stub, header)
    assert len(msgs) == len(places), (what, msgs)
    worst = 0.0
    for m, out in zip(msgs, op_outputs(op)):
        assert m.WhichOneof("kind") == "header", (what, m)
        h = m.header
        pos, n = places[out]
        assert h.output == out, (what, h)
        assert h.dtype == dtype and list(h.shape) == list(want[out].shape), \
            (what, h)
        assert h.layout == prob.layout(out), (what, h)
        assert h.total_bytes == n and not h.data, (what, h)
        assert h.HasField("region") and h.region.name == rout.name and \
            h.region.offset == pos and h.region.byte_size == n, (what, h)
        got = decode(rout.get(pos, n), dtype, want[out].shape)
        worst = max(worst, check_close(got, want[out], dtype,
                                       "%s %s" % (what,
                                                  pb.Output.Name(out))))
        assert rout.get(pos - base, base) == bytes([SENTINEL]) * base, \
            (what, "bytes before the output changed")
        assert rout.get(pos + n, base) == bytes([SENTINEL]) * base, \
            (what, "bytes after the output changed")
    for i, (pos, raw) in enumerate(sent):
        assert rin.get(pos, len(raw)) == raw, (what, "inputs[%d] changed" % i)
    return worst


class Alive:
    """A tiny ConvolutionBackwardData with its inputs and output in a
    region of its own: the check that the server still answers."""

    def __init__(self, stub, tag):
        self.stub = stub
        self.obj = ShmObject("alive-" + tag, 16384)
        self.region = Region(self.obj, "alive").register(stub)
        self.prob = Problem(False, 1, 2, 3, 1, (5, 4), 2)

    def __call__(self, after=""):
        op = pb.CONVOLUTION_BACKWARD_DATA
        try:
            region_call(self.stub, self.prob, op, pb.F32, 8, self.region,
                        self.region, seed=5)
        except grpc.RpcError as e:
            raise AssertionError("no valid answer after %s: %s %r" % (
                after, e.code().name, e.details()))


# ---- the tests -----------------------------------------------------------

def test_info(stub, shm, max_regions, max_region_bytes):
    info = stub.GetServerInfo(pb.ServerInfoRequest(), timeout=10)
    assert info.shm == shm, (info.shm, shm)
    assert info.limits.max_regions == max_regions, info.limits
    assert info.limits.max_region_bytes == max_region_bytes, info.limits


def test_register(stub, alive):
    """RegisterRegion, ListRegions and UnregisterRegion, good and bad."""
    obj = ShmObject("reg", 8192)
    try:
        IA, NF, AE, RE = (grpc.StatusCode.INVALID_ARGUMENT,
                          grpc.StatusCode.NOT_FOUND,
                          grpc.StatusCode.ALREADY_EXISTS,
                          grpc.StatusCode.RESOURCE_EXHAUSTED)

        def reg(name, key=obj.key, offset=0, size=4096):
            return lambda: stub.RegisterRegion(pb.RegisterRegionRequest(
                name=name, key=key, offset=offset, byte_size=size),
                timeout=10)

        for bad in ("", "a" * 65, "a/b", "a b", "x\n", ".", "..", "é"):
            expect("name %r" % bad, reg(bad), IA, "name:")
            alive("name %r" % bad)
        for bad in ("", obj.key[1:], "/", "//x", "/..", "/.", "/a/b",
                    obj.key + "/x", "/" + "a" * 201, "/a b", "/a\\b"):
            expect("key %r" % bad, reg("k", key=bad), IA, "key:")
            alive("key %r" % bad)
        expect("absent key", reg("k", key=obj.key + "-absent"), NF, "key:",
               obj.key + "-absent")
        expect("absent 200-char key",
               reg("k", key="/convgrad-" + "b" * 191), NF, "key:")
        expect("range past the end", reg("k", offset=4097), IA,
               "byte_size:", "8192")
        expect("offset past the end", reg("k", offset=9000, size=1), IA,
               "byte_size:")
        expect("byte_size 0", reg("k", size=0), IA, "byte_size:")
        expect("offset overflow", reg("k", offset=(1 << 64) - 1), IA,
               "offset:")
        expect("over --max-region-bytes", reg("k", size=1 << 40), RE,
               "byte_size:", "--max-region-bytes")
        alive("bad ranges")

        # A symlink and a directory under /dev/shm are not objects.
        link = "/dev/shm/convgrad-test-shm-%d-link" % PID
        folder = "/dev/shm/convgrad-test-shm-%d-dir" % PID
        LIVE.update((link, folder))
        os.symlink(obj.path, link)
        os.mkdir(folder)
        expect("symlink key", reg("k", key=link[8:]), IA, "key:")
        expect("directory key", reg("k", key=folder[8:]), IA, "key:")
        os.unlink(link)
        os.rmdir(folder)
        LIVE.difference_update((link, folder))
        alive("symlink and directory keys")

        # An object outside --shm-prefix (default convgrad-), though it
        # exists and the server could open it.
        foreign = ShmObject("foreign", 8192, prefix="cgs-")
        try:
            expect("key outside --shm-prefix", reg("k", key=foreign.key),
                   grpc.StatusCode.PERMISSION_DENIED, "key:", foreign.key,
                   "--shm-prefix")
            expect("key with the prefix only later",
                   reg("k", key="/x-convgrad-y"),
                   grpc.StatusCode.PERMISSION_DENIED, "key:", "--shm-prefix")
            alive("keys outside --shm-prefix")
        finally:
            foreign.close()

        # The longest name, the same registration again, other ranges.
        long_name = "N" * 64
        reg(long_name)()
        reg(long_name)()  # the same again: a retry
        reg("r.1_-", offset=100, size=8000)()
        got = listed(stub)
        assert got[long_name].key == obj.key and \
            got[long_name].offset == 0 and \
            got[long_name].byte_size == 4096 and \
            got[long_name].calls == 0, got[long_name]
        assert got["r.1_-"].offset == 100 and \
            got["r.1_-"].byte_size == 8000, got["r.1_-"]
        names = [r.name for r in stub.ListRegions(pb.ListRegionsRequest(),
                                                  timeout=10).regions]
        assert names.index(long_name) < names.index("r.1_-"), names
        other = ShmObject("reg2", 8192)
        try:
            for what, fn in (("other key", reg(long_name, key=other.key)),
                             ("other offset", reg(long_name, offset=4)),
                             ("other size", reg(long_name, size=4092))):
                expect(what, fn, AE, "name:", long_name)
                alive(what)
        finally:
            other.close()
        for name in (long_name, "r.1_-"):
            stub.UnregisterRegion(pb.UnregisterRegionRequest(name=name),
                                  timeout=10)
        got = listed(stub)
        assert long_name not in got and "r.1_-" not in got, got
        for name in (long_name, "never-registered"):
            expect("unregister %s" % name,
                   lambda: stub.UnregisterRegion(
                       pb.UnregisterRegionRequest(name=name), timeout=10),
                   NF, "name:", name)
        alive("unregister of unknown names")
    finally:
        obj.close()


def test_ops(stub):
    """Every op, F32 and BF16, inputs and outputs in regions."""
    problems = [Problem(False, 2, 4, 6, 1, (7, 6), 3),
                Problem(False, 2, 6, 4, 2, (11, 9), 3, s=2, p=1),
                Problem(False, 1, 3, 2, 1, (10, 9), 3, p=2, d=2),
                Problem(True, 2, 4, 6, 1, (5, 4), 3),
                Problem(True, 2, 6, 4, 2, (5, 6), 3, s=2, p=1, opad=1)]
    a = ShmObject("ops-a", 65536)
    b = ShmObject("ops-b", 65536 + 8192)
    try:
        one = Region(a, "ops-one").register(stub)
        # Two regions of two objects, both at offsets into them.
        rin = Region(a, "ops-in", offset=12, size=32768).register(stub)
        rout = Region(b, "ops-out", offset=4096 + 20).register(stub)
        calls, worst = 0, {pb.F32: 0.0, pb.BF16: 0.0}
        for dtype, bases in ((pb.F32, (4, 36)), (pb.BF16, (2, 66))):
            for pi, prob in enumerate(problems):
                for op in prob.ops:
                    for bi, base in enumerate(bases):
                        ins, outs = (one, one) if bi == 0 else (rin, rout)
                        err = region_call(stub, prob, op, dtype, base, ins,
                                          outs, seed=100 * pi + op,
                                          room_exact=bi == 0,
                                          reverse=pi % 2 == 1)
                        worst[dtype] = max(worst[dtype], err)
                        calls += 1
        for r in (one, rin, rout):
            r.unregister(stub)
        return calls, worst
    finally:
        a.close()
        b.close()


def test_mixed(stub):
    """Inline data, chunks and region inputs in one call; a layer op with
    one output in a region and the others streamed."""
    obj = ShmObject("mixed", 65536)
    try:
        reg = Region(obj, "mixed").register(stub)
        prob = Problem(False, 2, 6, 4, 2, (11, 9), 3, s=2, p=1)
        t = prob.tensors(pb.F32, 7)
        want = prob.reference(t)

        def tensor(name, **kw):
            return pb.Tensor(dtype=pb.F32, shape=t[name][2], **kw)

        def chunks(i, raw, size=700):
            return [(i, raw[o:o + size]) for o in range(0, len(raw), size)]

        # ConvolutionBackwardWeights: src inline, diff_dst in the region,
        # diff_weights in the region.
        obj.fill()
        dy = t["dy"][1]
        reg.put(40, dy)
        out_at, n = 40 + len(dy) + 4, want[pb.DIFF_WEIGHTS].size * 4
        op = pb.CONVOLUTION_BACKWARD_WEIGHTS
        msgs = compute(stub, pb.ComputeHeader(
            op=op, attrs=prob.attrs(op),
            inputs=[tensor("x", data=t["x"][1]),
                    tensor("dy", region=reg.ref(40, len(dy)))],
            output_regions=[pb.OutputRegion(region=reg.ref(out_at, n))]))
        (h, data), = split_outputs(msgs)
        assert data is None and h.region.offset == out_at, h
        check_close(decode(reg.get(out_at, n), pb.F32, prob.wei),
                    want[pb.DIFF_WEIGHTS], pb.F32, "mixed CBW")

        # ConvolutionBackwardData: diff_dst in the region, weights in
        # chunks, diff_src streamed back in 1 KiB chunks.
        op = pb.CONVOLUTION_BACKWARD_DATA
        msgs = compute(stub, pb.ComputeHeader(
            op=op, attrs=prob.attrs(op), response_chunk_bytes=1024,
            inputs=[tensor("dy", region=reg.ref(40, len(dy))), tensor("w")]),
            chunks(1, t["w"][1], 100))
        (h, data), = split_outputs(msgs)
        assert not h.HasField("region") and len(msgs) > 2, (h, len(msgs))
        check_close(decode(data, pb.F32, prob.src), want[pb.DIFF_SRC],
                    pb.F32, "mixed CBD")

        # ConvolutionBackward: diff_dst (the middle input) in the region,
        # src in chunks, weights inline; diff_weights into the region,
        # diff_src in chunks, diff_bias inline in its header.
        op = pb.CONVOLUTION_BACKWARD
        n = want[pb.DIFF_WEIGHTS].size * 4
        obj.fill()
        reg.put(40, dy)
        out_at = 40 + len(dy) + 36
        msgs = compute(stub, pb.ComputeHeader(
            op=op, attrs=prob.attrs(op), response_chunk_bytes=1024,
            inputs=[tensor("x"), tensor("dy", region=reg.ref(40, len(dy))),
                    tensor("w", data=t["w"][1])],
            output_regions=[pb.OutputRegion(output=pb.DIFF_WEIGHTS,
                                            region=reg.ref(out_at, 0))]),
            chunks(0, t["x"][1]))
        outs = split_outputs(msgs)
        assert [h.output for h, _ in outs] == op_outputs(op), outs
        (hs, ds), (hw, dw), (hb, db) = outs
        assert ds is not None and len(hs.data) == 0 and \
            not hs.HasField("region"), hs
        assert dw is None and hw.region.name == "mixed" and \
            hw.region.offset == out_at and hw.region.byte_size == n and \
            hw.total_bytes == n, hw
        assert len(hb.data) == prob.oc * 4 and not hb.HasField("region"), hb
        check_close(decode(ds, pb.F32, prob.src), want[pb.DIFF_SRC], pb.F32,
                    "mixed CB diff_src")
        check_close(decode(reg.get(out_at, n), pb.F32, prob.wei),
                    want[pb.DIFF_WEIGHTS], pb.F32, "mixed CB diff_weights")
        check_close(decode(db, pb.F32, [prob.oc]), want[pb.DIFF_BIAS],
                    pb.F32, "mixed CB diff_bias")
        assert reg.get(out_at + n, 64) == bytes([SENTINEL]) * 64
        reg.unregister(stub)
    finally:
        obj.close()


def test_compute_refusals(stub, alive):
    """Compute's region references and output_regions, each refused with
    its status and field, each followed by a valid call."""
    IA, NF = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
    obj = ShmObject("bad", 32768)
    try:
        reg = Region(obj, "bad").register(stub)
        prob = Problem(False, 2, 4, 6, 1, (7, 6), 3)
        for dtype in (pb.F32, pb.BF16):
            es = esize(dtype)
            t = prob.tensors(dtype, 3)
            lx, ldy, lw = (len(t[k][1]) for k in ("x", "dy", "w"))
            ox, ody, ow = 64, 64 + lx + 64, 64 + lx + 64 + ldy + 64
            free = ow + lw + 64  # outputs may go from here on
            for k, off in (("x", ox), ("dy", ody), ("w", ow)):
                reg.put(off, t[k][1])
            cbw, cb = pb.CONVOLUTION_BACKWARD_WEIGHTS, pb.CONVOLUTION_BACKWARD
            dname = pb.DType.Name(dtype)

            def header(op=cbw, refs=None, outs=(), **kw):
                refs = refs or {}
                names = op_inputs(op)
                place = {"x": (ox, lx), "dy": (ody, ldy), "w": (ow, lw)}
                inputs = []
                for i, name in enumerate(names):
                    ref = refs.get(i, reg.ref(*place[name]))
                    tensor = pb.Tensor(dtype=dtype, shape=t[name][2])
                    if ref is not None:
                        tensor.region.CopyFrom(ref)
                    inputs.append(tensor)
                return pb.ComputeHeader(op=op, attrs=prob.attrs(op),
                                        inputs=inputs, output_regions=outs,
                                        **kw)

            def call(h, chunks=()):
                return lambda: compute(stub, h, chunks)

            def case(what, h, code, *frags, chunks=()):
                expect("%s %s" % (dname, what), call(h, chunks), code, *frags)
                alive("%s %s" % (dname, what))

            nw = int(np.prod(prob.wei)) * es
            ns = int(np.prod(prob.src)) * es
            case("misaligned input",
                 header(refs={1: reg.ref(ody + es // 2, ldy)}),
                 IA, "inputs[1].region.offset")
            case("input out of bounds",
                 header(refs={1: reg.ref(reg.size - ldy + es, ldy)}),
                 IA, "inputs[1].region", "do not fit")
            case("input offset past the end",
                 header(refs={0: reg.ref(1 << 62, lx)}),
                 IA, "inputs[0].region", "do not fit")
            case("input offset near 2^64",
                 header(refs={0: reg.ref((1 << 64) - es, lx)}),
                 IA, "inputs[0].region")
            case("input byte_size short",
                 header(refs={1: reg.ref(ody, ldy - es)}),
                 IA, "inputs[1].region.byte_size")
            case("input byte_size long",
                 header(refs={0: reg.ref(ox, lx + es)}),
                 IA, "inputs[0].region.byte_size")
            case("input byte_size 0",
                 header(refs={0: reg.ref(ox, 0)}),
                 IA, "inputs[0].region.byte_size")
            h = header()
            h.inputs[0].data = t["x"][1]
            case("data and region", h, IA, "inputs[0]", "exclusive")
            h = header()
            h.inputs[1].data = t["dy"][1][:es]
            case("some data and region", h, IA, "inputs[1]", "exclusive")
            case("unknown region",
                 header(refs={1: pb.RegionRef(name="nope", offset=ody,
                                              byte_size=ldy)}),
                 NF, "inputs[1].region.name", "nope")
            case("empty region name",
                 header(refs={0: pb.RegionRef(offset=ox, byte_size=lx)}),
                 IA, "inputs[0].region.name")
            case("65-char region name",
                 header(refs={0: pb.RegionRef(name="a" * 65, offset=ox,
                                              byte_size=lx)}),
                 IA, "inputs[0].region.name")
            # A chunk for an input that lies in a region.
            case("chunk for a region input", header(refs={1: None}),
                 IA, "chunk.input", chunks=[(0, t["x"][1][:64]),
                                            (1, t["dy"][1])])

            def outr(off, room, output=pb.OUTPUT_UNSPECIFIED, name="bad"):
                return pb.OutputRegion(output=output, region=pb.RegionRef(
                    name=name, offset=off, byte_size=room))

            case("output room too small",
                 header(outs=[outr(free, nw - es)]),
                 IA, "output_regions", "byte_size", "cannot hold")
            case("output past the region's end",
                 header(outs=[outr(reg.size - nw + es, 0)]),
                 IA, "output_regions", "do not fit")
            case("output room past the region's end",
                 header(outs=[outr(reg.size - nw + es, nw)]),
                 IA, "output_regions", "do not fit")
            case("output misaligned",
                 header(outs=[outr(free + 1, nw)]),
                 IA, "output_regions", "offset")
            case("output overlapping inputs[1]",
                 header(outs=[outr(ody + ldy - es, nw)]),
                 IA, "output_regions", "overlap inputs[1]")
            case("output overlapping inputs[0]",
                 header(outs=[outr(ox + es, 0)]),
                 IA, "output_regions", "overlap inputs[0]")
            case("output in an unknown region",
                 header(outs=[outr(0, 0, name="nope")]),
                 NF, "output_regions", "nope")
            case("output region without a name",
                 header(outs=[outr(free, nw, name="")]),
                 IA, "header.output_regions[0].region.name")
            case("single op's other output",
                 header(outs=[outr(free, 0, output=pb.DIFF_SRC)]),
                 IA, "header.output_regions[0].output")
            case("single op and diff_bias",
                 header(outs=[outr(free, 0, output=pb.DIFF_BIAS)]),
                 IA, "header.output_regions[0].output")
            case("unknown output",
                 header(outs=[outr(free, 0, output=9)]),
                 IA, "header.output_regions[0].output")
            case("layer op, output unspecified",
                 header(op=cb, outs=[outr(free, 0)]),
                 IA, "header.output_regions[0].output")
            case("layer op, output listed twice",
                 header(op=cb, outs=[outr(free, nw, pb.DIFF_WEIGHTS),
                                     outr(free + 2 * nw, 0,
                                          pb.DIFF_WEIGHTS)]),
                 IA, "header.output_regions[1].output")
            case("layer op, output not asked for",
                 header(op=cb, outputs=[pb.DIFF_SRC],
                        outs=[outr(free, 0, pb.DIFF_WEIGHTS)]),
                 IA, "header.output_regions[0].output")
            h = header(op=cb)
            h.output_regions.add(output=pb.DIFF_SRC)
            case("output region missing", h, IA,
                 "header.output_regions[0].region")
            case("layer outputs overlapping",
                 header(op=cb, outs=[outr(free, 0, pb.DIFF_SRC),
                                     outr(free + ns - es, 0,
                                          pb.DIFF_WEIGHTS)]),
                 IA, "output_regions", "overlap")
            case("layer output overlapping weights",
                 header(op=cb, outs=[outr(free, 0, pb.DIFF_SRC),
                                     outr(ow + es, 0, pb.DIFF_BIAS)]),
                 IA, "output_regions", "overlap inputs[2]")
        reg.unregister(stub)

        # The same bytes under two names: an output in one may not overlap
        # an input in the other ("An output's bytes may not overlap an
        # input's").
        twin = Region(obj, "bad-twin").register(stub)
        reg.register(stub)
        prob = Problem(False, 1, 2, 3, 1, (5, 4), 2)
        op = pb.CONVOLUTION_BACKWARD_DATA
        t = prob.tensors(pb.F32, 4)
        ldy, lw = len(t["dy"][1]), len(t["w"][1])
        reg.put(64, t["dy"][1])
        reg.put(64 + ldy, t["w"][1])
        h = pb.ComputeHeader(op=op, attrs=prob.attrs(op), inputs=[
            pb.Tensor(dtype=pb.F32, shape=prob.dst, region=reg.ref(64, ldy)),
            pb.Tensor(dtype=pb.F32, shape=prob.wei,
                      region=reg.ref(64 + ldy, lw))],
            output_regions=[pb.OutputRegion(region=twin.ref(64, 0))])
        try:
            compute(stub, h)
            got = "OK"
        except grpc.RpcError as e:
            got = "%s %s" % (e.code().name, e.details())
        deferred(got.startswith("INVALID_ARGUMENT") and "overlap" in got,
                 "an output in region bad-twin over the bytes of inputs[0] "
                 "in region bad (one object, two registrations): got %s, "
                 "expected INVALID_ARGUMENT (overlap)" % got)
        alive("an output over an input through another region")
        for r in (reg, twin):
            r.unregister(stub)
    finally:
        obj.close()


def test_truncated_before(stub, alive):
    """An object shrunk after registration: the next call using it is
    FAILED_PRECONDITION, for an input and for an output; the same
    registration again is refused while the object is short, and maps it
    afresh once it has grown back."""
    FP = grpc.StatusCode.FAILED_PRECONDITION
    obj = ShmObject("trunc", 32768)
    try:
        reg = Region(obj, "trunc").register(stub)
        prob = Problem(False, 1, 2, 3, 1, (5, 4), 2)
        op = pb.CONVOLUTION_BACKWARD_DATA
        region_call(stub, prob, op, pb.F32, 4, reg, reg, seed=1)
        t = prob.tensors(pb.F32, 2)
        ldy = len(t["dy"][1])
        h = pb.ComputeHeader(op=op, attrs=prob.attrs(op), inputs=[
            pb.Tensor(dtype=pb.F32, shape=prob.dst, region=reg.ref(0, ldy)),
            pb.Tensor(dtype=pb.F32, shape=prob.wei, data=t["w"][1])])
        obj.resize(16384)
        expect("input in a truncated object", lambda: compute(stub, h), FP,
               "inputs[0].region.name", "truncated")
        alive("an input in a truncated object")
        h = pb.ComputeHeader(op=op, attrs=prob.attrs(op), inputs=[
            pb.Tensor(dtype=pb.F32, shape=prob.dst, data=t["dy"][1]),
            pb.Tensor(dtype=pb.F32, shape=prob.wei, data=t["w"][1])],
            output_regions=[pb.OutputRegion(region=reg.ref(64, 0))])
        expect("output in a truncated object", lambda: compute(stub, h), FP,
               "output_regions", "truncated")
        alive("an output in a truncated object")
        assert listed(stub)["trunc"].calls == 0
        # Registered again as it was: still too small, refused; grown
        # back, mapped afresh and served.
        expect("the same registration of a shrunk object",
               lambda: reg.register(stub), grpc.StatusCode.INVALID_ARGUMENT,
               "byte_size", "ends past")
        obj.resize(32768)
        reg.register(stub)
        region_call(stub, prob, op, pb.F32, 4, reg, reg, seed=2)
        reg.unregister(stub)
    finally:
        obj.close()


def test_two_clients(target):
    """Two channels, each with its own region, 20 layer calls each at
    once; every result checked."""
    prob = Problem(False, 2, 4, 6, 2, (9, 8), 3, s=2, p=1)
    errors, counts = [], [0, 0]

    def client(k):
        ch = grpc.insecure_channel(target)
        stub = pbg.ConvGradStub(ch)
        obj = ShmObject("client%d" % k, 65536)
        try:
            reg = Region(obj, "client-%d" % k).register(stub)
            for i in range(20):
                dtype = pb.F32 if i % 2 == 0 else pb.BF16
                op = prob.ops[i % 3]
                region_call(stub, prob, op, dtype, 4 + 32 * k, reg, reg,
                            seed=1000 * k + i, room_exact=i % 4 < 2)
                counts[k] += 1
            reg.unregister(stub)
        except Exception as e:  # reported by the main thread
            errors.append("client %d: %r" % (k, e))
        finally:
            obj.close()
            ch.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert counts == [20, 20], counts


def test_limits(args, out):
    """--max-regions 2 --max-region-bytes 64K, and --shm-prefix '' (any
    name: the big object is outside the default prefix)."""
    proc, log, port = serve(args, out, "limits", [
        "--max-regions", "2", "--max-region-bytes", "64K", "--shm-prefix", ""])
    objs = []
    try:
        ch = grpc.insecure_channel("127.0.0.1:%d" % port)
        stub = pbg.ConvGradStub(ch)
        test_info(stub, "local", 2, 65536)
        alive = Alive(stub, "limits")  # the first of the two
        objs.append(alive.obj)
        obj = ShmObject("limits", 65537 + 8, prefix="cgs-")
        objs.append(obj)
        RE = grpc.StatusCode.RESOURCE_EXHAUSTED
        expect("64K + 1", lambda: Region(obj, "big", 0, 65537).register(stub),
               RE, "byte_size:", "--max-region-bytes 65536")
        alive("a region over --max-region-bytes")
        full = Region(obj, "full", 8, 65536).register(stub)
        expect("a third region",
               lambda: Region(obj, "third", 0, 4096).register(stub), RE,
               "name:", "--max-regions")
        alive("a third region")
        full.register(stub)  # the same registration again: no new region
        # The largest region works.
        prob = Problem(False, 1, 2, 3, 1, (5, 4), 2)
        region_call(stub, prob, pb.CONVOLUTION_BACKWARD_WEIGHTS, pb.F32,
                    16184, full, full, seed=9)
        full.unregister(stub)
        Region(obj, "third", 0, 4096).register(stub)
        assert sorted(listed(stub)) == ["alive", "third"], listed(stub)
        alive("the third region")
        assert serving(ch)
        ch.close()
    finally:
        rc = stop_server(proc, log)
        for o in objs:
            o.close()
    assert rc == 0, ("limits server exit", rc)


def test_shm_off(args, out):
    """--shm off: the region RPCs and region references are refused, a
    plain call works."""
    proc, log, port = serve(args, out, "off", ["--shm", "off"])
    obj = ShmObject("off", 8192)
    try:
        ch = grpc.insecure_channel("127.0.0.1:%d" % port)
        stub = pbg.ConvGradStub(ch)
        test_info(stub, "off", 64, 16 << 30)
        FP = grpc.StatusCode.FAILED_PRECONDITION
        reg = Region(obj, "off")
        expect("RegisterRegion", lambda: reg.register(stub), FP, "--shm off")
        expect("ListRegions", lambda: listed(stub), FP, "--shm off")
        expect("UnregisterRegion", lambda: reg.unregister(stub), FP,
               "--shm off")
        prob = Problem(False, 1, 2, 3, 1, (5, 4), 2)
        t = prob.tensors(pb.F32, 4)
        op = pb.CONVOLUTION_BACKWARD_DATA

        def header(dy, outs=()):
            return pb.ComputeHeader(op=op, attrs=prob.attrs(op), inputs=[
                dy, pb.Tensor(dtype=pb.F32, shape=prob.wei,
                              data=t["w"][1])], output_regions=outs)
        inline = pb.Tensor(dtype=pb.F32, shape=prob.dst, data=t["dy"][1])
        in_reg = pb.Tensor(dtype=pb.F32, shape=prob.dst,
                           region=reg.ref(0, len(t["dy"][1])))
        expect("input in a region", lambda: compute(stub, header(in_reg)),
               FP, "inputs[0].region", "--shm off")
        expect("output in a region", lambda: compute(
            stub, header(inline, [pb.OutputRegion(region=reg.ref(0, 0))])),
            FP, "output_regions", "--shm off")
        (h, data), = split_outputs(compute(stub, header(inline)))
        check_close(decode(data, pb.F32, prob.src),
                    prob.reference(t)[pb.DIFF_SRC], pb.F32, "--shm off")
        assert serving(ch)
        ch.close()
    finally:
        rc = stop_server(proc, log)
        obj.close()
    assert rc == 0, ("--shm off server exit", rc)


def new_log(out, tag):
    """The log file of server tag, shown if the test fails."""
    log = open(os.path.join(out, "server-%s.log" % tag), "w")
    LOGS.append(log.name)
    return log


def serve(args, out, tag, extra=()):
    """start_server with its log kept; returns (proc, log, port)."""
    log = new_log(out, tag)
    proc, port = start_server(args.server, log, extra)
    return proc, log, port


def start_at(server, out, tag, listen, extra=()):
    """A server on listen; returns (proc, log, its first TCP target)."""
    log = new_log(out, tag)
    proc = subprocess.Popen([server, "--listen", listen, "--workers", "1"] +
                            list(extra), stdout=subprocess.PIPE, stderr=log,
                            text=True)
    line = proc.stdout.readline()
    m = re.search(r"listen=(\S+)", line)
    if not m:
        proc.kill()
        raise AssertionError("server %s did not get ready: %r" % (tag, line))
    return proc, log, m.group(1)


def own_address():
    """This host's address toward the network (not loopback), or None."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.200", 9))
        ip = s.getsockname()[0]
    except OSError:
        return None
    finally:
        s.close()
    return None if ip.startswith("127.") else ip


def test_policy(args, out):
    """--shm local: a caller on a unix socket may use regions, one on a
    non-loopback address may not; --shm on: it may. Returns what ran."""
    ip = own_address()
    if not ip:
        return "skipped (no non-loopback address)"
    sockdir = tempfile.mkdtemp(prefix="cgs-shm-")
    sock = os.path.join(sockdir, "s.sock")
    obj = ShmObject("policy", 8192)
    FP = grpc.StatusCode.FAILED_PRECONDITION
    try:
        proc, log, target = start_at(args.server, out, "local",
                                     "%s:0,unix:%s" % (ip, sock))
        try:
            assert target.startswith(ip + ":"), target
            ch = grpc.insecure_channel(target)
            stub = pbg.ConvGradStub(ch)
            test_info(stub, "local", 64, 16 << 30)
            reg = Region(obj, "policy")
            expect("remote RegisterRegion", lambda: reg.register(stub), FP,
                   "--shm local")
            expect("remote ListRegions", lambda: listed(stub), FP,
                   "--shm local")
            prob = Problem(False, 1, 2, 3, 1, (5, 4), 2)
            op = pb.CONVOLUTION_BACKWARD_DATA
            t = prob.tensors(pb.F32, 4)
            h = pb.ComputeHeader(op=op, attrs=prob.attrs(op), inputs=[
                pb.Tensor(dtype=pb.F32, shape=prob.dst,
                          region=reg.ref(0, len(t["dy"][1]))),
                pb.Tensor(dtype=pb.F32, shape=prob.wei, data=t["w"][1])])
            expect("remote Compute with a region",
                   lambda: compute(stub, h), FP, "inputs[0].region",
                   "--shm local")
            uch = grpc.insecure_channel("unix:" + sock)
            ustub = pbg.ConvGradStub(uch)
            reg.register(ustub)
            region_call(ustub, prob, op, pb.F32, 4, reg, reg, seed=8)
            reg.unregister(ustub)
            uch.close()
            assert serving(ch)
            ch.close()
        finally:
            rc = stop_server(proc, log)
        assert rc == 0, ("--shm local server exit", rc)
        proc, log, target = start_at(args.server, out, "on", "%s:0" % ip,
                                     ["--shm", "on"])
        try:
            ch = grpc.insecure_channel(target)
            stub = pbg.ConvGradStub(ch)
            test_info(stub, "on", 64, 16 << 30)
            reg = Region(obj, "policy").register(stub)
            region_call(stub, prob, op, pb.F32, 4, reg, reg, seed=8)
            reg.unregister(stub)
            ch.close()
        finally:
            rc = stop_server(proc, log)
        assert rc == 0, ("--shm on server exit", rc)
    finally:
        obj.close()
        shutil.rmtree(sockdir, ignore_errors=True)
    return "on %s and a unix socket" % ip


def test_restart(args, out):
    """A registration does not survive the server: after a restart the
    name is NOT_FOUND, and registering again works."""
    obj = ShmObject("restart", 16384)
    try:
        proc, log, port = serve(args, out, "restart1")
        ch = grpc.insecure_channel("127.0.0.1:%d" % port)
        stub = pbg.ConvGradStub(ch)
        reg = Region(obj, "stale").register(stub)
        prob = Problem(False, 1, 2, 3, 1, (5, 4), 2)
        op = pb.CONVOLUTION_BACKWARD_WEIGHTS
        region_call(stub, prob, op, pb.F32, 4, reg, reg, seed=6)
        ch.close()
        rc = stop_server(proc, log)
        assert rc == 0, ("first server exit", rc)

        proc, log, port2 = serve(args, out, "restart2")
        try:
            ch = grpc.insecure_channel("127.0.0.1:%d" % port2)
            stub = pbg.ConvGradStub(ch)
            assert listed(stub) == {}, listed(stub)
            NF = grpc.StatusCode.NOT_FOUND
            expect("stale region", lambda: region_call(
                stub, prob, op, pb.F32, 4, reg, reg, seed=6), NF,
                "inputs[0].region.name", "stale")
            expect("unregister stale", lambda: reg.unregister(stub), NF,
                   "stale")
            reg.register(stub)
            region_call(stub, prob, op, pb.F32, 4, reg, reg, seed=6)
            reg.unregister(stub)
            ch.close()
        finally:
            rc = stop_server(proc, log)
        assert rc == 0, ("restarted server exit", rc)
    finally:
        obj.close()


# ---- the slow problem: truncation and unregistration during a call --------

class Slow:
    """A ConvolutionBackwardWeights (256 channels, 28x28, 5x5 kernel)
    whose batch grows until the server's compute_ms of a repeated call
    reaches 800 ms, its src and diff_dst (at most 600 MB) in a region and
    diff_weights after them. The first call of a batch size is not timed:
    it pays for the primitive's creation and the mapping's page faults."""
    C, HW, K = 256, 28, 5

    def __init__(self, stub, obj):
        self.stub, self.obj = stub, obj
        self.prob = None
        self.region = None

    def setup(self, n, seed):
        c, hw = self.C, self.HW
        self.prob = Problem(False, n, c, c, 1, (hw, hw), self.K,
                            p=self.K // 2)
        rng = np.random.default_rng(seed)
        self.x = (rng.random(self.prob.src, dtype=np.float32) - 0.5)
        self.dy = (rng.random(self.prob.dst, dtype=np.float32) - 0.5)
        self.lx = self.x.nbytes
        self.nw = int(np.prod(self.prob.wei)) * 4
        self.out_at = 2 * self.lx + 64
        self.size = self.out_at + self.nw + 64
        self.fill()

    def fill(self):
        """(Re)sizes the object, writes the inputs and registers the
        region."""
        if self.obj.size != self.size:
            self.obj.resize(self.size)
        self.obj.write(0, self.x)
        self.obj.write(self.lx, self.dy)
        self.region = Region(self.obj, "slow").register(self.stub)

    def header(self):
        op = pb.CONVOLUTION_BACKWARD_WEIGHTS
        return pb.ComputeHeader(
            op=op, attrs=self.prob.attrs(op),
            inputs=[pb.Tensor(dtype=pb.F32, shape=self.prob.src,
                              region=self.region.ref(0, self.lx)),
                    pb.Tensor(dtype=pb.F32, shape=self.prob.dst,
                              region=self.region.ref(self.lx, self.lx))],
            output_regions=[pb.OutputRegion(
                region=self.region.ref(self.out_at, self.nw))])

    def run(self):
        (h, data), = split_outputs(compute(self.stub, self.header(),
                                           timeout=120))
        assert data is None and h.region.offset == self.out_at, h
        return h.compute_ms

    def calibrate(self):
        per = 2 * self.C * self.HW * self.HW * 4  # one sample of src + dy
        cap = (600 << 20) // per
        n, steps = 2, []
        while True:
            self.setup(n, seed=n)
            self.run()
            ms = self.run()
            steps.append((n, round(ms)))
            if ms >= 800 or n >= cap:
                break
            self.region.unregister(self.stub)
            n = min(cap, max(n + 1, math.ceil(n * min(16.0,
                                                      1100.0 / max(ms, 1)))))
        self.ms = ms
        return steps

    def check(self, what, channels=6):
        """diff_weights of a few output channels against torch."""
        got = decode(self.region.get(self.out_at, self.nw), pb.F32,
                     self.prob.wei)
        sel = np.random.default_rng(1).choice(self.C, channels,
                                              replace=False)
        want = torch.nn.grad.conv2d_weight(
            torch.from_numpy(self.x), [channels] + self.prob.wei[1:],
            torch.from_numpy(np.ascontiguousarray(self.dy[:, sel])),
            padding=self.K // 2).numpy().astype(np.float64)
        scale = float(np.max(np.abs(want)))
        err = float(np.max(np.abs(got[sel] - want)))
        assert err <= 1e-4 * scale, "%s: max error %.3g of %.3g" % (
            what, err, scale)

    def start(self):
        """Runs the call in a thread; returns (thread, result dict)."""
        res = {}

        def run():
            try:
                res["ms"] = self.run()
            except grpc.RpcError as e:
                res["error"] = e
            except Exception as e:  # reported by the caller
                res["other"] = e
            res["end"] = time.monotonic()
        th = threading.Thread(target=run)
        th.start()
        return th, res

    def wait_used(self, th):
        """Polls ListRegions until the call holds the region; returns the
        seconds that took and the calls ListRegions counted then."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60:
            r = listed(self.stub).get("slow")
            if r is not None and r.calls:
                return time.monotonic() - t0, r.calls
            assert th.is_alive(), "the slow call ended before it was seen"
            time.sleep(0.005)
        raise AssertionError("the slow call never held its region")


def test_expiry(args, out):
    """--region-idle-timeout 1: a region in use stays registered, one left
    idle is unregistered at the next sweep (every 2 s) and logged, a call
    naming it then gets NOT_FOUND, and registering it again works."""
    obj = ShmObject("expiry", 16384)
    proc, log, port = serve(args, out, "expiry",
                            ["--region-idle-timeout", "1"])
    try:
        ch = grpc.insecure_channel("127.0.0.1:%d" % port)
        stub = pbg.ConvGradStub(ch)
        reg = Region(obj, "left").register(stub)
        prob = Problem(False, 1, 2, 3, 1, (5, 4), 2)
        op = pb.CONVOLUTION_BACKWARD_WEIGHTS
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3.5:  # past a sweep, in use
            region_call(stub, prob, op, pb.F32, 4, reg, reg, seed=7)
            time.sleep(0.3)
        assert "left" in listed(stub), "expired while in use"
        idle_from = time.monotonic()
        while "left" in listed(stub) and time.monotonic() - idle_from < 10:
            time.sleep(0.1)
        idle = time.monotonic() - idle_from
        assert "left" not in listed(stub), "still registered after 10 s idle"
        assert idle >= 0.9, "expired after %.2f s idle" % idle
        log.flush()
        with open(log.name) as f:
            lines = [ln for ln in f if "region op=expire" in ln]
        assert len(lines) == 1 and "name=left" in lines[0] and \
            obj.key in lines[0], lines
        expect("expired region", lambda: region_call(
            stub, prob, op, pb.F32, 4, reg, reg, seed=7),
            grpc.StatusCode.NOT_FOUND, "inputs[0].region.name", "left")
        reg.register(stub)
        region_call(stub, prob, op, pb.F32, 4, reg, reg, seed=7)
        reg.unregister(stub)
        assert serving(ch)
        ch.close()
    finally:
        rc = stop_server(proc, log)
        obj.close()
    assert rc == 0, ("expiry server exit", rc)
    return round(idle, 1)


def test_slow(args, out):
    """Unregistration while a call uses a region, then truncation while a
    call uses it, on a server with one worker and no work limit."""
    proc, log, port = serve(args, out, "slow", [
        "--workers", "1", "--max-request-flops", "0"])
    obj = ShmObject("slow", 4096)
    report = {"calls_seen": []}
    small = Problem(False, 1, 2, 3, 1, (5, 4), 2)
    op = pb.CONVOLUTION_BACKWARD_DATA
    try:
        ch = grpc.insecure_channel("127.0.0.1:%d" % port)
        stub = pbg.ConvGradStub(ch)
        alive = Alive(stub, "slow")
        try:
            slow = Slow(stub, obj)
            report["calibration"] = slow.calibrate()
            slow.check("calibration run")

            # Unregistered while the call runs: it completes, right.
            th, res = slow.start()  # (its time calibrates the truncation)
            seen, calls = slow.wait_used(th)
            report["seen_after_s"] = round(seen, 3)
            report["calls_seen"].append(calls)
            slow.region.unregister(stub)
            assert "slow" not in listed(stub), listed(stub)
            th.join(120)
            assert not th.is_alive() and "other" not in res, res
            assert "error" not in res, (res["error"].code(),
                                        res["error"].details())
            slow.check("call unregistered under")
            report["ms"] = round(res["ms"])
            expect("the unregistered region", lambda: slow.run(),
                   grpc.StatusCode.NOT_FOUND, "inputs[0].region.name",
                   "slow")
            alive("the unregistered region")
            deferred(calls == 1,
                     "ListRegions.calls was %d while one call used the "
                     "region (its two inputs and its output), expected 1"
                     % calls)

            # Truncated to 0 while the call runs: FAILED_PRECONDITION. A
            # call answered before the truncation (a machine faster than
            # calibrated) is tried again, sooner.
            delay = min(slow.ms, res["ms"]) / 4000.0
            for attempt in range(4):
                slow.fill()
                th, res = slow.start()
                slow.wait_used(th)
                time.sleep(delay)
                obj.resize(0)  # our mapping goes first: no SIGBUS here
                cut = time.monotonic()
                th.join(120)
                assert not th.is_alive() and "other" not in res, res
                if "ms" not in res or res["end"] > cut + 0.05:
                    break
                delay /= 3
            report["truncated_after_s"] = round(delay, 3)
            time.sleep(0.2)
            assert proc.poll() is None, (
                "the server died (exit status %d) when a region's object was "
                "truncated during a call; the call got %s" % (
                    proc.returncode, res.get("error") and
                    (res["error"].code().name, res["error"].details())))
            assert "error" in res, (
                "a call whose region was truncated under it succeeded "
                "(%s ms)" % res.get("ms"))
            e = res["error"]
            assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and \
                "was truncated while the server used it" in e.details() \
                and "slow" in e.details(), (e.code(), e.details())
            assert serving(ch), "not SERVING after the truncation"
            alive("a region truncated during a call")
            assert listed(stub)["slow"].calls == 0, listed(stub)

            # Grown back, the region stays broken until registered again.
            obj.resize(slow.size)
            expect("the broken region, grown back", lambda: region_call(
                stub, small, op, pb.F32, 4, slow.region, slow.region, seed=2),
                grpc.StatusCode.FAILED_PRECONDITION, "slow", "truncated")
            alive("a call on the broken region")
            slow.region.unregister(stub)
            obj.close()
            obj = ShmObject("slow", slow.size)  # the same key, made anew
            slow.obj = obj
            slow.fill()
            region_call(stub, small, op, pb.F32, 4, slow.region, slow.region,
                        seed=2)
            slow.region.unregister(stub)
        finally:
            alive.obj.close()
        ch.close()
    finally:
        rc = stop_server(proc, log)
        obj.close()
    assert rc == 0, ("slow server exit", rc)
    return report


def show_logs():
    for path in LOGS:
        try:
            with open(path) as f:
                lines = f.readlines()
        except OSError:
            continue
        lines = [l for l in lines if "region op=list" not in l]
        print("---- %s (last 25 lines but ListRegions')" % path)
        sys.stdout.writelines(lines[-25:])


def main():
    global pb, pbg, grpc, torch, F
    args = common_args(__doc__).parse_args()
    out = prepare_stubs(args.proto, args.workdir, "cgs-shm-")
    if not out:
        return 77
    import grpc as grpc_mod
    import torch as torch_mod
    import torch.nn.functional as functional
    from convgrad.v1 import convgrad_pb2
    from convgrad.v1 import convgrad_pb2_grpc
    grpc, torch, F = grpc_mod, torch_mod, functional
    pb, pbg = convgrad_pb2, convgrad_pb2_grpc
    torch.set_num_threads(2)

    t0 = time.monotonic()
    times = []

    def lap(what):
        times.append("%s %.1fs" % (what, time.monotonic() - t0))

    proc, log, port = serve(args, out, "shm")
    ok = False
    try:
        ch = grpc.insecure_channel("127.0.0.1:%d" % port)
        stub = pbg.ConvGradStub(ch)
        test_info(stub, "local", 64, 16 << 30)
        assert listed(stub) == {}
        alive = Alive(stub, "main")
        try:
            test_register(stub, alive)
            lap("register")
            calls, worst = test_ops(stub)
            lap("ops")
            test_mixed(stub)
            alive("the mixed calls")
            lap("mixed")
            test_compute_refusals(stub, alive)
            lap("refusals")
            test_truncated_before(stub, alive)
            lap("truncated")
            test_two_clients("127.0.0.1:%d" % port)
            alive("two clients")
            lap("two clients")
            assert sorted(listed(stub)) == ["alive"], listed(stub)
        finally:
            alive.obj.close()
        test_limits(args, out)
        lap("limits")
        test_shm_off(args, out)
        lap("off")
        policy = test_policy(args, out)
        lap("policy")
        test_restart(args, out)
        lap("restart")
        idle = test_expiry(args, out)
        lap("expiry after %.1f s idle" % idle)
        slow = test_slow(args, out)
        lap("slow")
        assert proc.poll() is None and serving(ch)
        ch.close()
        ok = True
    finally:
        rc = stop_server(proc, log)
        for path in list(LIVE):
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    os.rmdir(path)
                else:
                    os.unlink(path)
            except OSError:
                pass
        if not ok:
            show_logs()
            for msg in DEFERRED:
                print("FAILED earlier: " + msg)
    assert rc == 0, ("server exit", rc)
    print("%d region calls over every op, max relative error f32 %.2g, "
          "bf16 %.2g" % (calls, worst[pb.F32], worst[pb.BF16]))
    print("policy: %s" % policy)
    print("slow problem: %s" % slow)
    print("; ".join(times))
    assert not DEFERRED, DEFERRED
    return 0


if __name__ == "__main__":
    sys.exit(main())
