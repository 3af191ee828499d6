#!/usr/bin/python3
"""make_corpus.py - writes the fuzzer's seed corpus (tests/fuzz/corpus):
well-formed Compute requests in fuzz_request.c's input format (each
message a little-endian u16 length and a serialized ComputeRequest), one
per kind of request the server takes, and a few that it must refuse.

Usage: /usr/bin/python3 tests/fuzz/make_corpus.py --package build/python --out tests/fuzz/corpus
(the Python package of a build, for its convgrad.v1 messages generated
from proto/; needs python3-protobuf). The files are committed; rerun this
after changing the schema and commit what changes."""
import argparse
import hashlib
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "server"))
from test_server_python import use_package_v1  # noqa: E402


def stubs(python_dir):
    use_package_v1(python_dir)
    from convgrad.v1 import convgrad_pb2
    return convgrad_pb2


# The bytes of the fuzzer's staged tensors (fuzz_request.c), and the
# first byte of their private ids' (by their STAGED_BYTES index).
STAGED_FILL = b"\x3c"
PRIVATE_ID = 0xa0
STAGED_BYTES = (128, 216)


def frame(msgs):
    out = b""
    for m in msgs:
        b = m.SerializeToString()
        assert len(b) < 65536
        out += struct.pack("<H", len(b)) + b
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--package", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    pb = stubs(args.package)
    size = {pb.F32: 4, pb.BF16: 2, pb.F16: 2, pb.S32: 4, pb.S64: 8}

    def count(shape):
        n = 1
        for d in shape:
            n *= d
        return n

    def request(op, attrs, tensors, chunk=64, inline=(), shared=None,
                staged=(), private=(), **header):
        """tensors: (dtype, shape[, bytes]); inline: indices whose bytes
        ride in the header; shared: index -> offset in the fuzzer's region
        "r" (no bytes sent); staged: indices named by the SHA-256 of
        STAGED_FILL bytes, which the fuzzer's store holds at its sizes
        (128 and 216 bytes); private: indices named by those entries'
        private ids. Data bytes are a simple ramp."""
        shared = shared or {}
        h = pb.ComputeHeader(op=op, attrs=pb.Attributes(**attrs), **header)
        datas = []
        for i, t in enumerate(tensors):
            dt, shape = t[0], t[1]
            data = t[2] if len(t) > 2 else bytes(
                (k * 7 + i) & 0x3f for k in range(count(shape) * size[dt]))
            if i in private:
                k = STAGED_BYTES.index(count(shape) * size[dt])
                h.inputs.add(dtype=dt, shape=shape, staged=pb.StagedRef(
                    sha256=bytes([PRIVATE_ID + k]) * 32, private_id=True))
                data = b""
            elif i in staged:
                h.inputs.add(dtype=dt, shape=shape, staged=pb.StagedRef(
                    sha256=hashlib.sha256(
                        STAGED_FILL * (count(shape) * size[dt])).digest()))
                data = b""
            elif i in shared:
                h.inputs.add(dtype=dt, shape=shape, region=pb.RegionRef(
                    name="r", offset=shared[i], byte_size=len(data)))
                data = b""
            else:
                h.inputs.add(dtype=dt, shape=shape,
                             data=data if i in inline else b"")
            datas.append(b"" if i in inline else data)
        msgs = [pb.ComputeRequest(header=h)]
        for i, d in enumerate(datas):
            for off in range(0, len(d), chunk):
                msgs.append(pb.ComputeRequest(
                    chunk=pb.DataChunk(input=i, data=d[off:off + chunk])))
        return msgs

    pad = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1])
    nchw = dict(pad, data_format=pb.NCX, weights_format=pb.OIX)
    seeds = {
        "conv_bwd_data_f32_nchw": request(
            pb.CONVOLUTION_BACKWARD_DATA, dict(nchw, dst_shape=[1, 2, 4, 4]),
            [(pb.F32, [1, 3, 4, 4]), (pb.F32, [3, 2, 3, 3])]),
        "conv_bwd_data_inline_nxc": request(
            pb.CONVOLUTION_BACKWARD_DATA, dict(pad, dst_shape=[1, 4, 4, 2]),
            [(pb.F32, [1, 4, 4, 3]), (pb.F32, [3, 3, 2, 3])], inline=(0, 1)),
        "conv_bwd_data_shape_s32": request(
            pb.CONVOLUTION_BACKWARD_DATA, nchw,
            [(pb.F32, [1, 3, 4, 4]), (pb.F32, [3, 2, 3, 3]),
             (pb.S32, [4], struct.pack("<4i", 1, 2, 4, 4))]),
        "conv_bwd_data_shape_s64_same_upper": request(
            pb.CONVOLUTION_BACKWARD_DATA,
            dict(strides=[2, 2], auto_pad=pb.SAME_UPPER, data_format=pb.NCX,
                 weights_format=pb.OIX),
            [(pb.F32, [1, 3, 3, 3]), (pb.F32, [3, 2, 3, 3]),
             (pb.S64, [4], struct.pack("<4q", 1, 2, 6, 6))]),
        "conv_bwd_weights_bf16_groups": request(
            pb.CONVOLUTION_BACKWARD_WEIGHTS,
            dict(nchw, groups=2, dilations=[2, 1],
                 weights_shape=[4, 1, 3, 3]),
            [(pb.BF16, [2, 2, 6, 5]), (pb.BF16, [2, 4, 4, 5])], chunk=40),
        "deconv_bwd_data_output_padding": request(
            pb.CONV_TRANSPOSE_BACKWARD_DATA,
            dict(strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 1],
                 output_padding=[1, 1], data_format=pb.NCX,
                 weights_format=pb.IOX),
            [(pb.F32, [1, 2, 6, 6]), (pb.F32, [3, 2, 3, 3])]),
        "deconv_bwd_weights_f16_3d": request(
            pb.CONV_TRANSPOSE_BACKWARD_WEIGHTS,
            dict(strides=[1, 1, 1], pads_begin=[0, 0, 0], pads_end=[0, 0, 0],
                 data_format=pb.NCX, weights_format=pb.IOX,
                 weights_shape=[2, 2, 2, 2, 2]),
            [(pb.F16, [1, 2, 2, 2, 2]), (pb.F16, [1, 2, 3, 3, 3])]),
        "conv_bwd_layer_bias_src": request(
            pb.CONVOLUTION_BACKWARD, nchw,
            [(pb.F32, [1, 2, 4, 4]), (pb.F32, [1, 3, 4, 4]),
             (pb.F32, [3, 2, 3, 3])],
            outputs=[pb.DIFF_BIAS, pb.DIFF_SRC],
            weights_output_layout=pb.XIO),
        "deconv_bwd_layer_all_1d": request(
            pb.CONV_TRANSPOSE_BACKWARD,
            dict(strides=[2], pads_begin=[0], pads_end=[0]),
            [(pb.BF16, [2, 5, 2]), (pb.BF16, [2, 11, 3]),
             (pb.BF16, [3, 3, 2])]),
        "conv_bwd_layer_regions": request(
            pb.CONVOLUTION_BACKWARD, nchw,
            [(pb.F32, [1, 2, 4, 4]), (pb.F32, [1, 3, 4, 4]),
             (pb.F32, [3, 2, 3, 3])], shared={0: 4, 1: 1024, 2: 2048},
            output_regions=[
                pb.OutputRegion(output=pb.DIFF_SRC,
                                region=pb.RegionRef(name="r", offset=4096)),
                pb.OutputRegion(output=pb.DIFF_BIAS,
                                region=pb.RegionRef(name="r", offset=8192,
                                                    byte_size=12))]),
        "deconv_bwd_weights_mixed_region_bf16": request(
            pb.CONV_TRANSPOSE_BACKWARD_WEIGHTS,
            dict(strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 1],
                 data_format=pb.NCX, weights_format=pb.IOX,
                 weights_shape=[2, 3, 3, 3]),
            [(pb.BF16, [1, 2, 3, 3]), (pb.BF16, [1, 3, 5, 5])],
            shared={1: 66},
            output_regions=[pb.OutputRegion(
                region=pb.RegionRef(name="r", offset=30002))]),
    }
    seeds["conv_bwd_layer_staged"] = request(
        pb.CONVOLUTION_BACKWARD, nchw,
        [(pb.F32, [1, 2, 4, 4]), (pb.F32, [1, 3, 4, 4]),
         (pb.F32, [3, 2, 3, 3])], staged=(0, 2))
    seeds["conv_bwd_layer_private"] = request(
        pb.CONVOLUTION_BACKWARD, nchw,
        [(pb.F32, [1, 2, 4, 4]), (pb.F32, [1, 3, 4, 4]),
         (pb.F32, [3, 2, 3, 3])], staged=(2,), private=(0,))
    seeds["refused_staged_missing"] = request(
        pb.CONVOLUTION_BACKWARD, nchw,
        [(pb.F32, [1, 2, 4, 4]), (pb.F32, [1, 3, 4, 4]),
         (pb.F32, [3, 2, 4, 4])], staged=(2,))
    ramp = bytes(k & 0xff for k in range(300))
    stage_msgs = [pb.StageRequest(header=pb.StageHeader(
        sha256=hashlib.sha256(ramp).digest(), byte_size=len(ramp),
        data=ramp[:100]))] + [
        pb.StageRequest(chunk=pb.DataChunk(data=ramp[o:o + 64]))
        for o in range(100, len(ramp), 64)]
    stages = {"stage_chunks": stage_msgs,
              "stage_private": [pb.StageRequest(header=pb.StageHeader(
                  sha256=bytes([PRIVATE_ID]) * 32, byte_size=len(ramp),
                  data=ramp[:100], private_id=True))] + stage_msgs[1:],
              "refused_stage_wrong_hash": [pb.StageRequest(
                  header=pb.StageHeader(sha256=bytes(32), byte_size=300,
                                        data=ramp))]}
    good = seeds["conv_bwd_data_f32_nchw"]
    seeds["refused_chunk_first"] = good[1:]
    seeds["refused_header_twice"] = [good[0], good[0]] + good[1:]
    seeds["refused_overrun"] = good[:1] + [pb.ComputeRequest(
        chunk=pb.DataChunk(input=0, data=bytes(4096)))]
    os.makedirs(args.out, exist_ok=True)
    for name, msgs in sorted(seeds.items()):
        with open(os.path.join(args.out, name), "wb") as f:
            f.write(frame(msgs))
    for name, msgs in sorted(stages.items()):
        with open(os.path.join(args.out, name), "wb") as f:
            f.write(b"\xff" + frame(msgs))
    print("wrote %d seeds to %s" % (len(seeds) + len(stages), args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
