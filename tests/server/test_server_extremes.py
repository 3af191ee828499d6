#!/usr/bin/python3
"""test_server_extremes.py - extreme integers in every integer field of every
op, against a real convgrad-server over the wire, on every CPU ISA this
machine can run.

Three sweeps:
- one field at a time: each value of VALUES (2^k-1, 2^k, 2^k+1 for k in
  POWERS, from 20 to 63, negatives and 0) put into one integer of a small
  valid request
  (strides, pads, dilations, output_padding, groups, each dim of each input,
  each dst_shape / weights_shape value, each value of the shape input);
- families of requests of all six ops, the layer ops included, whose shapes
  stay consistent while strides, pads, dilations (also with auto_pad),
  groups or one spatial dim grow, at those values and around each service
  limit (the server's Limits), so that the values get past the shape
  relations and reach oneDNN;
- the crashers of issue 25 as named cases, each with the answer it must
  get.

No call may end with anything but OK, INVALID_ARGUMENT, RESOURCE_EXHAUSTED or
UNIMPLEMENTED (never INTERNAL, UNKNOWN or a dead server); a refusal's
message names a
field, the swept one when no request could hold its value (past oneDNN's
int or past a service limit, which the message also names); a family
member within the service limits must be computed (or refused as more
work than --max-request-flops allows: the padded extents count), and one
past them refused.

oneDNN picks a different JIT kernel on every instruction set. The server
runs once as it is (all three sweeps) and once more with DNNL_MAX_CPU_ISA
set to each of avx2, avx512_core and avx512_core_bf16 below the host's
ISA (the crashers, and the families at the values that reach oneDNN:
those around the limits and 2^20; only in the release build: oneDNN's
JIT kernels, the one thing that changes with the ISA, are not
instrumented, so neither ASan/UBSan nor TSan sees into them, and the
engine's tests skip the lower ISAs under sanitizers too), and the test
prints the ISAs it
covered and, for each, the longest compute time of a request whose
tensors total at most 64 KiB (from the server's log; printed, not
asserted). Each server must stay SERVING and exit 0 on SIGTERM (under
ASan/UBSan any report aborts it).

Last, a server whose JIT kernels cannot be built (Memory-Deny-Write-
Execute) shows that oneDNN's runtime_error at primitive creation comes
back as INVALID_ARGUMENT naming the backend (runtime_error_refused). Exits 77 (ctest skip) when no stub
generator is installed."""
import concurrent.futures
import ctypes
import os
import re
import struct
import sys
import time

from test_server_python import (common_args, prepare_stubs, serving,
                                start_server, stop_server)

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
INT_LIMIT = (1 << 31) - 1  # oneDNN 2.6 checks its descriptors in int
# The powers where something changes (oneDNN's int at 2^31, a dim's
# element count or bytes at 2^32, int64 at 2^63, the crashers' 2^23 and
# 2^24) and a few between: a value past every limit is refused the same
# way whatever its size, so the other powers only repeated these checks
# (44 powers took 16 s of the sweep, these 11 take 4).
POWERS = (20, 23, 24, 25, 30, 31, 32, 33, 47, 62, 63)
VALUES = sorted({v for k in POWERS for v in ((1 << k) - 1, 1 << k,
                                             (1 << k) + 1)
                 if v <= I64_MAX} | {0, -1, -2, -(1 << 31), I64_MIN})
# Values past every service limit stop at validation, before oneDNN, so
# the runs under other ISAs sweep only these beside the limits' edges.
KERNEL_VALUES = [(1 << 20) - 1, 1 << 20, (1 << 20) + 1]
REFUSED = ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "UNIMPLEMENTED")
# What a refusal's message starts with: a field, an element of one, or two
# fields blamed together ("pads_begin[0], pads_end[0]: ...").
FIELD = r"[a-z_]+(\[\d+\])?(\.[a-z_]+(\[\d+\])?)*"
NAMES_FIELD = re.compile(r"^(shape input|%s(, %s)*):" % (FIELD, FIELD))
# oneDNN's names of the ISAs DNNL_MAX_CPU_ISA takes, in order, and the ones
# this test runs below the host's (vnni variants add int8 kernels only).
ISA_ORDER = ["sse41", "avx", "avx2", "avx2_vnni", "avx512_core",
             "avx512_core_vnni", "avx512_core_bf16", "avx512_core_amx"]
CAPPED_ISAS = ["avx2", "avx512_core", "avx512_core_bf16"]
SMALL_REQUEST = 64 * 1024  # bytes: the bound for a cheap request
COMPUTED = re.compile(r"compute id=\d+ .* op=(\S+) dtype=(\S+) in=(\S+) .*"
                      r"bytes_in=(\d+) bytes_out=(\d+) .*compute_ms=([\d.]+)"
                      r" .*status=OK")


class Limits:
    """The service limits a server reports (GetServerInfo)."""

    def __init__(self, info):
        lim = info.limits
        self.stride, self.dilation = lim.max_stride, lim.max_dilation
        self.pad, self.opad = lim.max_pad, lim.max_output_padding
        self.reach, self.padded = (lim.max_effective_extent,
                                   lim.max_padded_extent)
        assert min(self.stride, self.dilation, self.pad, self.reach,
                   self.padded) > 0, lim

    def edges(self):
        """Values around each limit: the last one held and the first one
        past it."""
        return sorted({x + d for x in (self.stride, self.dilation, self.pad,
                                       self.opad + 1, self.reach)
                       for d in (-1, 0, 1)})

    def never_valid(self, name, value):
        """True when the limits refuse value in field name whatever the
        rest of the request."""
        return (name in ("strides",) and value > self.stride or
                name == "dilations" and value > self.dilation or
                name in ("pads_begin", "pads_end") and value > self.pad or
                name == "output_padding" and value > self.opad)


class Builder:
    """Small f32/bf16 requests of any spatial rank, NCX data, OIX
    (Convolution) or IOX (ConvTranspose) weights, in their wire form."""

    def __init__(self, pb):
        self.pb = pb
        self.data_ops = (pb.CONVOLUTION_BACKWARD_DATA,
                         pb.CONV_TRANSPOSE_BACKWARD_DATA)
        self.conv_ops = (pb.CONVOLUTION_BACKWARD_DATA,
                         pb.CONVOLUTION_BACKWARD_WEIGHTS,
                         pb.CONVOLUTION_BACKWARD)
        self.layer_ops = (pb.CONVOLUTION_BACKWARD, pb.CONV_TRANSPOSE_BACKWARD)

    def geometry(self, op, small, ks, s, d, pb_, pe, opad):
        """The forward op's output sizes, or None when there are none."""
        out = []
        for x, k, st, dl, b, e, o in zip(small, ks, s, d, pb_, pe, opad):
            ek = (k - 1) * dl + 1
            if op in self.conv_ops:
                if x + b + e < ek:
                    return None
                out.append((x + b + e - ek) // st + 1)
            else:
                out.append(st * (x - 1) + ek - b - e + o)
        return out if all(v > 0 for v in out) else None

    def request(self, op, dtype=None, mb=1, ic=2, oc=2, groups=1, src=(4, 4),
                ks=(3, 3), strides=(1, 1), dil=(1, 1), pads_begin=(0, 0),
                pads_end=(0, 0), opad=(0, 0), auto_pad=0, shape_input=False):
        """A header (a ComputeHeader message) with its inputs' bytes inline,
        and the geometry (pads, forward output sizes); src is the forward
        op's input size. auto_pad may be 0 or SAME_UPPER, whose pads stay
        out of the request."""
        pb = self.pb
        dtype = dtype or pb.F32
        esize = 4 if dtype == pb.F32 else 2
        if auto_pad == pb.SAME_UPPER:
            pads_begin, pads_end = [], []
            for x, k, st, dl in zip(src, ks, strides, dil):
                ek = (k - 1) * dl + 1
                t = max(0, ((x + st - 1) // st - 1) * st + ek - x
                        if op in self.conv_ops else ek - st)
                pads_begin.append(t // 2)
                pads_end.append(t - t // 2)
        dst = self.geometry(op, src, ks, strides, dil, pads_begin, pads_end,
                            opad)
        assert dst is not None, (op, src, ks, strides, dil)
        conv = op in self.conv_ops
        src_shape, dst_shape = [mb, ic] + list(src), [mb, oc] + list(dst)
        weights = ([oc, ic // groups] if conv else [ic, oc // groups]) + \
            list(ks)
        attrs = pb.Attributes(strides=strides, dilations=dil, groups=groups,
                              data_format=pb.NCX, auto_pad=auto_pad,
                              weights_format=pb.OIX if conv else pb.IOX)
        if auto_pad == 0:
            attrs.pads_begin.extend(pads_begin)
            attrs.pads_end.extend(pads_end)
        if any(opad) and op != pb.CONV_TRANSPOSE_BACKWARD:
            attrs.output_padding.extend(opad)
        shape = None
        if op == pb.CONVOLUTION_BACKWARD_DATA:
            shape, name = src_shape, "dst_shape"
        elif op not in self.data_ops + self.layer_ops:
            shape, name = weights, "weights_shape"
        if shape is not None and not shape_input:
            getattr(attrs, name).extend(shape)
        shapes = ((dst_shape, weights) if op in self.data_ops
                  else (src_shape, dst_shape, weights)
                  if op in self.layer_ops else (src_shape, dst_shape))
        header = pb.ComputeHeader(op=op, attrs=attrs)
        for dims in shapes:
            count = 1
            for x in dims:
                count *= x
            # Small integers: exact in every dtype, so no NaN or Inf.
            header.inputs.add(dtype=dtype, shape=dims,
                              data=bytes([0, 0x3f]) * (count * esize // 2))
        if shape is not None and shape_input:
            header.inputs.add(dtype=pb.S64, shape=[len(shape)],
                              data=struct.pack("<%dq" % len(shape), *shape))
        return header, dict(pads=(list(pads_begin), list(pads_end)), dst=dst,
                            src=list(src), ks=list(ks), s=list(strides),
                            d=list(dil), opad=list(opad), conv=conv)


def within(lim, geo):
    """Whether the limits take the geometry request() returned: every
    value, effective extent and padded extent."""
    pads_begin, pads_end = geo["pads"]
    big = geo["src"] if geo["conv"] else geo["dst"]
    for i, (k, s, d, b, e) in enumerate(zip(geo["ks"], geo["s"], geo["d"],
                                            pads_begin, pads_end)):
        # A ConvTranspose's output_padding is what its shapes imply.
        o = 0 if geo["conv"] else geo["opad"][i]
        if (s > lim.stride or d > lim.dilation or max(b, e) > lim.pad or
                o > lim.opad or (k - 1) * d + 1 > lim.reach or
                big[i] + b + e > lim.padded):
            return False
    return True


def int_fields(pb, op, header):
    """(name, setter) for every integer of header: name is what a refusal
    must mention when no request can hold the value."""
    a = header.attrs
    fields = []
    lists = ["strides", "pads_begin", "pads_end", "dilations",
             "output_padding", "dst_shape", "weights_shape"]
    for name in lists:
        # An empty list stands for the default; sweep a full one.
        n = max(len(getattr(a, name)), 2 if name in lists[:5] else 0)
        for i in range(n):
            def set_list(h, v, name=name, i=i):
                lst = getattr(h.attrs, name)
                if len(lst) == 0:
                    lst.extend([1 if name in ("strides", "dilations")
                                else 0] * 2)
                lst[i] = v
            fields.append((name, set_list))
    fields.append(("groups", lambda h, v: setattr(h.attrs, "groups", v)))
    for t, tensor in enumerate(header.inputs):
        if tensor.dtype == pb.S64:
            shape_name = "dst_shape" if op == pb.CONVOLUTION_BACKWARD_DATA \
                else "weights_shape"
            for i in range(tensor.shape[0]):
                def set_value(h, v, t=t, i=i):
                    vals = list(struct.unpack("<%dq" % h.inputs[t].shape[0],
                                              h.inputs[t].data))
                    vals[i] = v
                    h.inputs[t].data = struct.pack("<%dq" % len(vals), *vals)
                fields.append((shape_name, set_value))
            continue
        for i in range(len(tensor.shape)):
            def set_dim(h, v, t=t, i=i):
                h.inputs[t].shape[i] = v
            fields.append(("inputs[%d]" % t, set_dim))
    return fields


def never_valid(lim, name, value):
    """True when no request can hold value in field name: the refusal must
    then blame name itself."""
    if value > INT_LIMIT or value < 0 or lim.never_valid(name, value):
        return True
    return value == 0 and (name.startswith("inputs") or name in (
        "strides", "dilations", "dst_shape", "weights_shape"))


ALL_OPS = "CONVOLUTION_BACKWARD_DATA CONVOLUTION_BACKWARD_WEIGHTS " \
    "CONV_TRANSPOSE_BACKWARD_DATA CONV_TRANSPOSE_BACKWARD_WEIGHTS " \
    "CONVOLUTION_BACKWARD CONV_TRANSPOSE_BACKWARD"


def families(pb, b, lim, v):
    """(label, header, should compute) for the consistent requests around
    v: they should compute when the limits and oneDNN's int hold every
    value and sum. Requests whose tensors could not be built are left
    out."""
    out = []
    for op in [getattr(pb, n) for n in ALL_OPS.split()]:
        conv = op in b.conv_ops
        for dtype in (pb.F32, pb.BF16):
            cases = []
            if 0 < v <= INT_LIMIT:
                # The case: stride and pads of v, 1x1 kernel.
                small = 1 if conv else 3
                cases.append(("stride+pads", dict(
                    src=(small, small), ks=(1, 1), strides=(v, v),
                    pads_begin=(v, v), pads_end=(v, v))))
                # A stride alone, and with pads_end 1.
                cases.append(("stride", dict(src=(1, 1), ks=(1, 1),
                                             strides=(v, v))))
                if v > 1:
                    cases.append(("stride+pads_end", dict(
                        src=(1, 1), ks=(1, 1), strides=(v, v),
                        pads_end=(1, 1), opad=(0, 0) if conv else (1, 1))))
                # A dilation of v on a 2x2 kernel, padded to fit.
                h, e = v // 2, v - v // 2
                cases.append(("dilation", dict(
                    src=(1, 1), ks=(2, 2), dil=(v, v), pads_begin=(h, h),
                    pads_end=(e, e))))
                if op not in b.layer_ops:
                    cases.append(("dilation+same_upper", dict(
                        src=(1, 1), ks=(2, 2), dil=(v, v),
                        auto_pad=pb.SAME_UPPER,
                        shape_input=op != pb.CONV_TRANSPOSE_BACKWARD_DATA)))
                # Pads of v at the largest stride, which keeps the
                # Convolution's output small.
                if conv and v <= 4 * lim.pad:
                    cases.append(("pads", dict(
                        src=(1, 1), ks=(1, 1), strides=(lim.stride,) * 2,
                        pads_begin=(v, v), pads_end=(v, v))))
                # A kernel of v taps, its reach, over one output column.
                if v <= 2 * lim.reach:
                    cases.append(("kernel", dict(src=(1, v if conv else 1),
                                                 ks=(1, v))))
            if v in ((1 << 20) - 1, 1 << 20, (1 << 20) + 1) and \
                    dtype == pb.F32:
                # Depthwise with v groups, and one spatial dim of v.
                cases.append(("groups", dict(ic=v, oc=v, groups=v,
                                             src=(1, 1), ks=(1, 1))))
                cases.append(("spatial", dict(src=(v, 1), ks=(1, 1))))
            for label, kw in cases:
                header, geo = b.request(op, dtype=dtype, **kw)
                fits = max([v for v in header.attrs.strides] +
                           [v for v in header.attrs.dilations]) <= INT_LIMIT
                out.append(("%s %s %s v=%d" % (pb.Op.Name(op),
                                               pb.DType.Name(dtype), label, v),
                            header, fits and within(lim, geo)))
    return out


def crashers(pb, b, lim):
    """Issue 25's requests, named, with what each must get: "OK", or the
    field an INVALID_ARGUMENT must name."""
    bf = pb.BF16
    cbw, ctbw = (pb.CONVOLUTION_BACKWARD_WEIGHTS,
                 pb.CONV_TRANSPOSE_BACKWARD_WEIGHTS)
    cbd, ctbd = (pb.CONVOLUTION_BACKWARD_DATA,
                 pb.CONV_TRANSPOSE_BACKWARD_DATA)
    tiny = dict(dtype=bf, src=(1, 1), ks=(1, 1))
    s23 = (1 << 23) - 1
    cases = [
        # One call killed the server on AMX: a heap overflow in the
        # backward-weights kernel's transposition buffer.
        ("AMX crash: ConvolutionBackwardWeights bf16 strides [1, 2^23-1]",
         b.request(cbw, strides=(1, s23), **tiny), "strides[1]"),
        ("AMX crash at the limit: strides [1, max-stride]",
         b.request(cbw, strides=(1, lim.stride), **tiny), "OK"),
        ("AMX crash: ConvTransposeBackwardWeights bf16 strides [1, 2^23-1]",
         b.request(ctbw, strides=(1, s23), **tiny), "strides[1]"),
        ("AMX crash: stride+pads_end [1, 2^23-1]",
         b.request(cbw, strides=(1, s23), pads_end=(0, 1), **tiny),
         "strides[1]"),
        ("AMX crash: strides [2^23, 1]",
         b.request(cbw, strides=(1 << 23, 1), **tiny), "strides[0]"),
        # The same buffer overflowed int for an 8 MB request at stride 1.
        ("AMX transposition: ConvolutionBackwardWeights bf16 3-D src "
         "1x1x2048x2048x1", b.request(cbw, dtype=bf, ic=1, oc=1,
                                      src=(2048, 2048, 1), ks=(1, 1, 1),
                                      strides=(1, 1, 1), dil=(1, 1, 1),
                                      pads_begin=(0, 0, 0),
                                      pads_end=(0, 0, 0), opad=(0, 0, 0)),
         "OK"),
        ("AMX transposition: 2-D src 1x1x524288x1",
         b.request(cbw, dtype=bf, ic=1, oc=1, src=(524288, 1), ks=(1, 1)),
         "OK"),
        # INTERNAL "primitive creation: runtime_error".
        ("INTERNAL: ConvolutionBackwardData bf16 2x2 kernel dilations 2^23",
         b.request(cbd, dtype=bf, src=(1, 1), ks=(2, 2),
                   dil=(1 << 23, 1 << 23), pads_begin=(1 << 22, 1 << 22),
                   pads_end=(1 << 22, 1 << 22)), "dilations[0]"),
        ("INTERNAL: same with same_upper and a shape tensor",
         b.request(cbd, dtype=bf, src=(1, 1), ks=(2, 2),
                   dil=(1 << 23, 1 << 23), auto_pad=pb.SAME_UPPER,
                   shape_input=True), "dilations[0]"),
        # Seconds to minutes of compute for 1x1 tensors.
        ("CPU: ConvolutionBackwardData bf16 1x1 strides 2^20",
         b.request(cbd, strides=(1 << 20, 1 << 20), **tiny), "strides[0]"),
        ("CPU: ConvolutionBackwardData bf16 1x1 strides 2^24",
         b.request(cbd, strides=(1 << 24, 1 << 24), **tiny), "strides[0]"),
        ("CPU: ConvolutionBackwardData bf16 strides 2^25 with pads",
         b.request(cbd, strides=(1 << 25, 1 << 25), pads_begin=(1, 1),
                   pads_end=(1, 1), **tiny), "strides[0]"),
        ("CPU: ConvTransposeBackwardWeights bf16 strides 2^25-1",
         b.request(ctbw, strides=((1 << 25) - 1,) * 2, **tiny), "strides[0]"),
        ("CPU at the limit: ConvolutionBackwardData bf16 strides max-stride",
         b.request(cbd, strides=(lim.stride,) * 2, **tiny), "OK"),
        ("CPU at the limit: ConvTransposeBackwardData bf16 strides "
         "max-stride", b.request(ctbd, strides=(lim.stride,) * 2, **tiny),
         "OK"),
        # The AMX backward-data kernel's dilated window.
        ("AMX window: ConvolutionBackwardData bf16 2x2 kernel dilations "
         "max-dilation", b.request(cbd, dtype=bf, src=(1, 1), ks=(2, 2),
                                   dil=(lim.dilation,) * 2,
                                   pads_begin=(lim.dilation // 2,) * 2,
                                   pads_end=(lim.dilation // 2,) * 2),
         "OK"),
    ]
    return [(label, h, want) for label, (h, _), want in cases]


def wire(pb, h):
    """The request stream of h: large tensors move to DataChunks."""
    chunks = []
    for i, t in enumerate(h.inputs):
        if len(t.data) > 65536:
            for off in range(0, len(t.data), 1 << 20):
                chunks.append(pb.ComputeRequest(chunk=pb.DataChunk(
                    input=i, data=t.data[off:off + (1 << 20)])))
            t.data = b""
    return [m.SerializeToString()
            for m in [pb.ComputeRequest(header=h)] + chunks]


def field_calls(pb, b, lim):
    """One integer field at a time: (label, field, value, None, messages)."""
    calls = []
    for op in (pb.CONVOLUTION_BACKWARD_DATA, pb.CONVOLUTION_BACKWARD_WEIGHTS,
               pb.CONV_TRANSPOSE_BACKWARD_DATA,
               pb.CONV_TRANSPOSE_BACKWARD_WEIGHTS):
        for shape_input in (False, True):
            if shape_input and op == pb.CONV_TRANSPOSE_BACKWARD_DATA:
                continue
            base, _ = b.request(op, shape_input=shape_input)
            for n, (name, setter) in enumerate(int_fields(pb, op, base)):
                if shape_input and name not in ("dst_shape",
                                                "weights_shape"):
                    continue
                for v in VALUES + lim.edges():
                    h = pb.ComputeHeader()
                    h.CopyFrom(base)
                    setter(h, v)
                    calls.append(("%s field %d (%s) = %d" % (
                        pb.Op.Name(op), n, name, v), name, v, None,
                        wire(pb, h)))
    return calls


def run_calls(grpc, ch, lim, calls, threads):
    """Makes every call; returns the codes seen and the calls that ended
    wrongly. A call is (label, swept field or None, value, expectation,
    messages), the expectation None (field sweep), True / False (a family
    member that should compute / be refused) or a crasher's answer."""
    compute = ch.stream_stream("/convgrad.v1.ConvGrad/Compute",
                               request_serializer=lambda m: m,
                               response_deserializer=lambda m: m)

    def run(call):
        label, name, value, want, msgs = call
        try:
            for _ in compute(iter(msgs), timeout=60):
                pass
            code, details = "OK", ""
        except grpc.RpcError as e:
            code, details = e.code().name, e.details() or ""
        why = None
        if code != "OK" and code not in REFUSED:
            why = "not a client error"
        elif code != "OK" and not NAMES_FIELD.match(details):
            why = "names no field"
        elif isinstance(want, str):
            if want == "OK" and code != "OK":
                why = "should compute"
            elif want != "OK" and (code != "INVALID_ARGUMENT" or
                                   not details.startswith(want)):
                why = "should be INVALID_ARGUMENT naming %s" % want
        elif code != "OK" and name is not None and \
                never_valid(lim, name, value) and name not in details:
            why = "does not name %s" % name
        elif code == "OK" and name is not None and \
                never_valid(lim, name, value):
            why = "accepted"
        elif want is True and code != "OK" and not (
                code == "RESOURCE_EXHAUSTED" and
                "--max-request-flops" in details):
            why = "within the limits, refused"
        elif want is False and code == "OK":
            why = "past the limits, accepted"
        return code, why and "%s: %s %r (%s)" % (label, code, details, why)

    seen, bad = {}, []
    with concurrent.futures.ThreadPoolExecutor(threads) as ex:
        for code, problem in ex.map(run, calls):
            seen[code] = seen.get(code, 0) + 1
            if problem:
                bad.append(problem)
    return seen, bad


def worst_small(log_path):
    """The longest compute_ms of a computed request whose tensors total at
    most SMALL_REQUEST bytes, from a server log, with what it was."""
    worst = (0.0, "none")
    with open(log_path) as f:
        for line in f:
            m = COMPUTED.search(line)
            if m and int(m.group(4)) + int(m.group(5)) <= SMALL_REQUEST:
                ms = float(m.group(6))
                if ms > worst[0]:
                    worst = (ms, "%s %s in=%s" % m.group(1, 2, 3))
    return worst


def serve_and_check(args, grpc, pb, isa, out, make_calls):
    """Runs a server (capped at isa unless None), makes the calls
    make_calls(limits) gives, and checks it stays SERVING and exits 0.
    Returns (reported ISA, codes seen, calls that ended wrongly, worst
    small compute, number of calls)."""
    t0 = time.time()
    env = dict(os.environ)
    env.pop("DNNL_MAX_CPU_ISA", None)
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    if isa:
        env["DNNL_MAX_CPU_ISA"] = isa
    log_path = os.path.join(out, "extremes-server-%s.log" % (isa or "host"))
    log = open(log_path, "w")
    # Sizes the sweep makes legal stay small: larger ones would only be
    # slow, and the size limits are tested elsewhere.
    proc, port = start_server(args.server, log,
                              ["--max-tensor-elements", str(1 << 22)], env)
    try:
        ch = grpc.insecure_channel("127.0.0.1:%d" % port)
        stub_info = ch.unary_unary(
            "/convgrad.v1.ConvGrad/GetServerInfo",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.ServerInfo.FromString)
        info = stub_info(pb.ServerInfoRequest(), timeout=10)
        calls = make_calls(Limits(info))
        seen, bad = run_calls(grpc, ch, Limits(info), calls, args.threads)
        if not serving(ch):
            bad.append("%s: not SERVING after the calls" % info.cpu_isa)
        ch.close()
    finally:
        rc = stop_server(proc, log)
    if rc != 0:
        bad.append("%s: the server exited with %d" % (isa or "host", rc))
    return (info.cpu_isa, seen, bad, worst_small(log_path), len(calls),
            time.time() - t0)


# prctl(2): Memory-Deny-Write-Execute, Linux 6.3 and later.
PR_SET_MDWE, PR_GET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 66, 1
KERNEL_REFUSED = re.compile(
    r"attrs: oneDNN \S+ on \S+ cannot build a kernel for this geometry "
    r"\(primitive creation: runtime_error\)$")


def deny_write_execute():
    """In the server's child before exec: no mapping of it may become
    executable after it was writable, which every JIT kernel needs."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_MDWE)")


def runtime_error_refused(args, grpc, pb, b, out):
    """oneDNN's runtime_error at primitive creation is INVALID_ARGUMENT
    naming the backend (engine.c, make_err), not INTERNAL. No request
    reaches it through the kernels that the engine's catalogue lets run
    (the issue 25 requests that did are refused by the limits now), so the
    server runs under Memory-Deny-Write-Execute: oneDNN's JIT code cannot
    be made executable, Xbyak fails, and dnnl_primitive_create returns
    runtime_error. The call is made twice (a failure is not cached), and
    the server must stay SERVING and exit 0. Returns the problems found,
    or None where the kernel has no MDWE."""
    if ctypes.CDLL(None).prctl(PR_GET_MDWE, 0, 0, 0, 0) < 0:
        print("runtime_error: skipped, this kernel has no PR_SET_MDWE")
        return None
    log = open(os.path.join(out, "extremes-server-mdwe.log"), "w")
    proc, port = start_server(args.server, log, preexec_fn=deny_write_execute)
    bad = []
    try:
        ch = grpc.insecure_channel("127.0.0.1:%d" % port)
        compute = ch.stream_stream("/convgrad.v1.ConvGrad/Compute",
                                   request_serializer=lambda m: m,
                                   response_deserializer=lambda m: m)
        h, _ = b.request(pb.CONVOLUTION_BACKWARD_DATA)
        for attempt in (1, 2):
            try:
                list(compute(iter(wire(pb, h)), timeout=60))
                code, details = "OK", ""
            except grpc.RpcError as e:
                code, details = e.code().name, e.details() or ""
            print("runtime_error, call %d: %s %r" % (attempt, code, details))
            if code != "INVALID_ARGUMENT" or not KERNEL_REFUSED.match(details):
                bad.append("runtime_error call %d: %s %r" % (attempt, code,
                                                             details))
        if not serving(ch):
            bad.append("runtime_error: not SERVING after the calls")
        ch.close()
    finally:
        rc = stop_server(proc, log)
    if rc != 0:
        bad.append("runtime_error: the server exited with %d" % rc)
    return bad


def main():
    ap = common_args(__doc__)
    ap.add_argument("--threads", type=int, default=4)
    args = ap.parse_args()

    out = prepare_stubs(args.proto, args.workdir, "cgs-extremes-")
    if not out:
        return 77
    import grpc
    from convgrad.v1 import convgrad_pb2 as pb

    b = Builder(pb)

    def attacks(lim, values):
        calls = []
        for v in values + lim.edges():
            for label, h, fits in families(pb, b, lim, v):
                calls.append((label, None, v, fits, wire(pb, h)))
        for label, h, want in crashers(pb, b, lim):
            calls.append((label, None, 0, want, wire(pb, h)))
        return calls

    runs = [serve_and_check(
        args, grpc, pb, None, out,
        lambda lim: field_calls(pb, b, lim) + attacks(lim, VALUES))]
    host = runs[0][0]
    # The sanitizers cannot see into oneDNN's JIT kernels, which are all
    # that the ISA changes: the ISAs below run in the release build.
    for isa in [] if os.environ.get("CG_SANITIZED") else CAPPED_ISAS:
        if host in ISA_ORDER and ISA_ORDER.index(isa) < ISA_ORDER.index(host):
            runs.append(serve_and_check(args, grpc, pb, isa, out,
                                        lambda lim: attacks(lim,
                                                            KERNEL_VALUES)))
            assert runs[-1][0] == isa, (isa, runs[-1][0])

    bad = runtime_error_refused(args, grpc, pb, b, out) or []
    for isa, seen, problems, worst, ncalls, secs in runs:
        print("%s: %d calls in %.1f s: %s" % (isa, ncalls, secs, ", ".join(
            "%s %d" % kv for kv in sorted(seen.items()))))
        print("%s: longest compute of a request of at most %d bytes: "
              "%.1f ms (%s)" % (isa, SMALL_REQUEST, worst[0], worst[1]))
        assert seen.get("OK", 0) > 100, seen
        bad += problems
    print("ISAs covered: %s" % ", ".join(r[0] for r in runs))
    for problem in bad[:60]:
        print(problem)
    assert not bad, "%d calls ended wrongly" % len(bad)
    return 0


if __name__ == "__main__":
    sys.exit(main())
