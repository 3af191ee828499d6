#!/usr/bin/python3
"""test_server_extremes.py - extreme integers in every integer field of every
op, against a real convgrad-server over the wire.

Two sweeps:
- one field at a time: each value of VALUES (2^k-1, 2^k, 2^k+1 for k in
  20..63, negatives and 0) put into one integer of a small valid request
  (strides, pads, dilations, output_padding, groups, each dim of each input,
  each dst_shape / weights_shape value, each value of the shape input);
- families of requests whose shapes stay consistent while strides, pads,
  dilations (also with auto_pad), groups or one spatial dim grow, so that
  the extreme values get past the shape relations and reach oneDNN.

No call may end with anything but OK, INVALID_ARGUMENT or RESOURCE_EXHAUSTED
(never INTERNAL or UNKNOWN); a refusal's message names a field, the swept
one when no request could hold its value; a family member that oneDNN can
represent (every value, effective kernel, pads_end + stride and padded size
within 2^31-1) must be computed. The server must stay SERVING and exit 0 on
SIGTERM (under ASan/UBSan any report aborts it). Exits 77 (ctest skip) when
no stub generator is installed."""
import concurrent.futures
import os
import re
import struct
import sys

from test_server_python import (common_args, prepare_stubs, serving,
                                start_server, stop_server)

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
LIMIT = (1 << 31) - 1  # oneDNN 2.6 checks its descriptors in int
VALUES = sorted({v for k in range(20, 64) for v in ((1 << k) - 1, 1 << k,
                                                    (1 << k) + 1)
                 if v <= I64_MAX} | {0, -1, -2, -(1 << 31), I64_MIN})
REFUSED = ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED")
# What a refusal's message starts with: a field, an element of one, or two
# fields blamed together ("pads_begin[0], pads_end[0]: ...").
FIELD = r"[a-z_]+(\[\d+\])?(\.[a-z_]+(\[\d+\])?)*"
NAMES_FIELD = re.compile(r"^(shape input|%s(, %s)*):" % (FIELD, FIELD))


class Builder:
    """Small 2D f32/bf16 requests, NCX data, OIX (Convolution) or IOX
    (ConvTranspose) weights, in their wire form."""

    def __init__(self, pb):
        self.pb = pb
        self.data_ops = (pb.CONVOLUTION_BACKWARD_DATA,
                         pb.CONV_TRANSPOSE_BACKWARD_DATA)
        self.conv_ops = (pb.CONVOLUTION_BACKWARD_DATA,
                         pb.CONVOLUTION_BACKWARD_WEIGHTS)

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
        """A header (a ComputeHeader message) with its inputs' bytes inline;
        src is the forward op's input size. auto_pad may be 0 or
        SAME_UPPER, whose pads stay out of the request."""
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
        if any(opad):
            attrs.output_padding.extend(opad)
        shape = None
        if op == pb.CONVOLUTION_BACKWARD_DATA:
            shape, name = src_shape, "dst_shape"
        elif op not in self.data_ops:
            shape, name = weights, "weights_shape"
        if shape is not None and not shape_input:
            getattr(attrs, name).extend(shape)
        shapes = (dst_shape, weights) if op in self.data_ops \
            else (src_shape, dst_shape)
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
        return header


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


def never_valid(name, value):
    """True when no request can hold value in field name: the refusal must
    then blame name itself."""
    if value > LIMIT or value < 0:
        return True
    return value == 0 and (name.startswith("inputs") or name in (
        "strides", "dilations", "dst_shape", "weights_shape"))


def families(pb, b, v):
    """(label, header, representable) for the consistent requests around v:
    representable when oneDNN can hold every value and sum."""
    out = []
    for op in (pb.CONVOLUTION_BACKWARD_DATA, pb.CONVOLUTION_BACKWARD_WEIGHTS,
               pb.CONV_TRANSPOSE_BACKWARD_DATA,
               pb.CONV_TRANSPOSE_BACKWARD_WEIGHTS):
        conv = op in b.conv_ops
        for dtype in (pb.F32, pb.BF16):
            cases = []
            if v > 0:
                # The case: stride and pads of v, 1x1 kernel.
                small = 1 if conv else 3
                cases.append(("stride+pads", dict(
                    src=(small, small), ks=(1, 1), strides=(v, v),
                    pads_begin=(v, v), pads_end=(v, v)),
                    1 + 2 * v <= LIMIT))
                # A stride alone, and with pads_end 1.
                cases.append(("stride", dict(src=(1, 1), ks=(1, 1),
                                             strides=(v, v)), v <= LIMIT))
                if v > 1:
                    cases.append(("stride+pads_end", dict(
                        src=(1, 1), ks=(1, 1), strides=(v, v),
                        pads_end=(1, 1), opad=(0, 0) if conv else (1, 1)),
                        v + 1 <= LIMIT))
                # A dilation of v on a 2x2 kernel, padded to fit.
                h, e = v // 2, v - v // 2
                cases.append(("dilation", dict(
                    src=(1, 1), ks=(2, 2), dil=(v, v), pads_begin=(h, h),
                    pads_end=(e, e)), v + 1 <= LIMIT))
                cases.append(("dilation+same_upper", dict(
                    src=(1, 1), ks=(2, 2), dil=(v, v),
                    auto_pad=pb.SAME_UPPER,
                    shape_input=op != pb.CONV_TRANSPOSE_BACKWARD_DATA),
                    v + 1 <= LIMIT))
            if v in ((1 << 20) - 1, 1 << 20, (1 << 20) + 1) and \
                    dtype == pb.F32:
                # Depthwise with v groups, and one spatial dim of v.
                cases.append(("groups", dict(ic=v, oc=v, groups=v,
                                             src=(1, 1), ks=(1, 1)), True))
                cases.append(("spatial", dict(src=(v, 1), ks=(1, 1)), True))
            for label, kw, representable in cases:
                out.append(("%s %s %s v=%d" % (pb.Op.Name(op),
                                               pb.DType.Name(dtype), label, v),
                            b.request(op, dtype=dtype, **kw), representable))
    return out


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
    # (label, swept field or None, value, representable, messages)
    calls = []
    for op in (pb.CONVOLUTION_BACKWARD_DATA, pb.CONVOLUTION_BACKWARD_WEIGHTS,
               pb.CONV_TRANSPOSE_BACKWARD_DATA,
               pb.CONV_TRANSPOSE_BACKWARD_WEIGHTS):
        for shape_input in (False, True):
            if shape_input and op == pb.CONV_TRANSPOSE_BACKWARD_DATA:
                continue
            base = b.request(op, shape_input=shape_input)
            for n, (name, setter) in enumerate(int_fields(pb, op, base)):
                if shape_input and name not in ("dst_shape",
                                                "weights_shape"):
                    continue
                for v in VALUES:
                    h = pb.ComputeHeader()
                    h.CopyFrom(base)
                    setter(h, v)
                    calls.append(("%s field %d (%s) = %d" % (
                        pb.Op.Name(op), n, name, v), name, v, None,
                        wire(pb, h)))
    for v in VALUES:
        for label, h, representable in families(pb, b, v):
            calls.append((label, None, v, representable, wire(pb, h)))

    log = open(os.path.join(out, "extremes-server.log"), "w")
    # Sizes the sweep makes legal stay small: larger ones would only be
    # slow, and the limits are tested elsewhere.
    proc, port = start_server(args.server, log,
                              ["--max-tensor-elements", str(1 << 22)])
    seen = {}
    bad = []
    try:
        ch = grpc.insecure_channel("127.0.0.1:%d" % port)
        compute = ch.stream_stream("/convgrad.v1.ConvGrad/Compute",
                                   request_serializer=lambda m: m,
                                   response_deserializer=lambda m: m)

        def run(call):
            label, name, value, representable, msgs = call
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
            elif code != "OK" and name is not None and \
                    never_valid(name, value) and name not in details:
                why = "does not name %s" % name
            elif code == "OK" and name is not None and \
                    never_valid(name, value):
                why = "accepted"
            elif representable and code != "OK":
                why = "representable, refused"
            elif representable is False and code == "OK":
                why = "beyond oneDNN's int, accepted"
            return code, why and "%s: %s %r (%s)" % (label, code, details,
                                                     why)

        with concurrent.futures.ThreadPoolExecutor(args.threads) as ex:
            for code, problem in ex.map(run, calls):
                seen[code] = seen.get(code, 0) + 1
                if problem:
                    bad.append(problem)
        status = serving(ch)
        ch.close()
    finally:
        rc = stop_server(proc, log)
    print("%d calls: %s" % (len(calls), ", ".join(
        "%s %d" % kv for kv in sorted(seen.items()))))
    for problem in bad[:60]:
        print(problem)
    assert not bad, "%d calls ended wrongly" % len(bad)
    assert seen.get("OK", 0) > 100, seen
    assert status, "not SERVING after the calls"
    assert rc == 0, rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
