#!/usr/bin/python3
"""test_server_python.py - a client generated from proto/ alone by a standard
toolchain (Python grpcio: the convgrad.v1 stubs the build made with protoc +
grpc_python_plugin for the Python package, the health stubs made here)
talks to a real convgrad-server: health Check and Watch,
GetServerInfo, ConvolutionBackwardData against a numpy reference with the
request and the response both chunked, ConvolutionBackward's several
outputs framed as the proto says, and error statuses. Exits 77 (ctest
skip) when no stub generator is installed."""
import argparse
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

import numpy as np


def generate_stubs(proto_dir, out_dir):
    """The health proto's stubs as top-level health_pb2*.py (a package
    named grpc would shadow grpcio). convgrad.v1's come with the built
    Python package (use_package_v1)."""
    os.makedirs(out_dir, exist_ok=True)
    include = os.path.join(proto_dir, "grpc/health/v1")
    try:
        from grpc_tools import protoc  # noqa: F401
        base = [sys.executable, "-m", "grpc_tools.protoc"]
        plugin = []
    except ImportError:
        plugin_path = shutil.which("grpc_python_plugin")
        if not shutil.which("protoc") or not plugin_path:
            return False
        base = ["protoc"]
        plugin = ["--plugin=protoc-gen-grpc=" + plugin_path]
    subprocess.run(base + plugin + ["-I" + include, "--python_out=" + out_dir,
                                    "--grpc_out=" + out_dir, "health.proto"],
                   check=True, cwd=include)
    return True


def use_package_v1(python_dir):
    """Makes `convgrad.v1` the one the build generated from proto/ into the
    Python package (python_dir/convgrad/v1, what the packages ship),
    without running the package's __init__: that loads libcgclient, which a
    server-only build lacks and the sanitizer builds instrument, and the
    ctypes client is not what these tests exercise. Registered in
    sys.modules, so an installed convgrad cannot shadow it either."""
    spec = importlib.util.spec_from_loader("convgrad", None, is_package=True)
    pkg = importlib.util.module_from_spec(spec)
    pkg.__path__ = [os.path.join(python_dir, "convgrad")]
    sys.modules["convgrad"] = pkg


def common_args(description):
    """The arguments both grpcio tests take: server binary, proto dir and
    where the stubs go."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--server", required=True)
    ap.add_argument("--proto", required=True)
    ap.add_argument("--workdir", default=None)
    return ap


def prepare_stubs(proto_dir, workdir, prefix):
    """Generates the health stubs (into workdir, or a new temporary
    directory) and puts them on sys.path, and takes convgrad.v1 from the
    built package in $CG_PYTHON_DIR (ctest sets it); returns the
    directory, or None when there is no stub generator."""
    out = workdir or tempfile.mkdtemp(prefix=prefix)
    if not generate_stubs(proto_dir, out):
        print("no grpc_tools and no protoc + grpc_python_plugin: skipped")
        return None
    sys.path.insert(0, out)
    use_package_v1(os.environ["CG_PYTHON_DIR"])
    return out


def start_server(path, log, extra=(), env=None, preexec_fn=None):
    """Starts the server on an ephemeral port (extra: more flags, later
    ones win; env: its environment, else ours; preexec_fn: run in the
    child before exec); returns the process, its readiness line kept as
    proc.ready_line, and the port."""
    proc = subprocess.Popen([path, "--listen", "127.0.0.1:0", "--workers", "2",
                             "--chunk-bytes", "4096"] + list(extra),
                            stdout=subprocess.PIPE, stderr=log, text=True,
                            env=env, preexec_fn=preexec_fn)
    line = proc.stdout.readline()
    m = re.search(r"listen=127\.0\.0\.1:(\d+)", line)
    if not m:
        proc.kill()
        raise SystemExit("server did not get ready: %r" % line)
    proc.ready_line = line
    return proc, int(m.group(1))


def serving(ch):
    """1 when the server behind ch answers health Check with SERVING."""
    import health_pb2
    import health_pb2_grpc
    status = health_pb2_grpc.HealthStub(ch).Check(
        health_pb2.HealthCheckRequest(service=""), timeout=10).status
    return status == health_pb2.HealthCheckResponse.SERVING


def stop_server(proc, log):
    """SIGTERM, then the exit status once the server is gone."""
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=60)
    log.close()
    return rc


def conv_bwd_data_ref(dy, w, groups, stride, pad, dil, in_hw):
    """diff_src of a 2D NCHW convolution with OIHW weights (O = OC,
    I = IC/groups): the adjoint of the forward convolution."""
    n, oc, oh, ow = dy.shape
    _, icg, kh, kw = w.shape
    ocg = oc // groups
    ih, iw = in_hw
    dx = np.zeros((n, icg * groups, ih + 2 * pad, iw + 2 * pad), np.float64)
    for g in range(groups):
        dyg = dy[:, g * ocg:(g + 1) * ocg].astype(np.float64)
        wg = w[g * ocg:(g + 1) * ocg].astype(np.float64)
        for y in range(kh):
            for x in range(kw):
                contrib = np.einsum("nohw,oi->nihw", dyg, wg[:, :, y, x])
                y0, x0 = y * dil, x * dil
                dx[:, g * icg:(g + 1) * icg,
                   y0:y0 + stride * (oh - 1) + 1:stride,
                   x0:x0 + stride * (ow - 1) + 1:stride] += contrib
    return dx[:, :, pad:pad + ih, pad:pad + iw]


def conv_bwd_weights_ref(x, dy, groups, stride, pad, dil, k):
    """diff_weights (OIHW) of the same convolution."""
    n, ic, ih, iw = x.shape
    _, oc, oh, ow = dy.shape
    icg, ocg = ic // groups, oc // groups
    xp = np.zeros((n, ic, ih + 2 * pad, iw + 2 * pad), np.float64)
    xp[:, :, pad:pad + ih, pad:pad + iw] = x
    dw = np.zeros((oc, icg, k, k), np.float64)
    for g in range(groups):
        dyg = dy[:, g * ocg:(g + 1) * ocg].astype(np.float64)
        for y in range(k):
            for xx in range(k):
                win = xp[:, g * icg:(g + 1) * icg,
                         y * dil:y * dil + stride * (oh - 1) + 1:stride,
                         xx * dil:xx * dil + stride * (ow - 1) + 1:stride]
                dw[g * ocg:(g + 1) * ocg, :, y, xx] = np.einsum(
                    "nohw,nihw->oi", dyg, win)
    return dw


def read_outputs(msgs):
    """Splits a Compute response into (header, bytes) per output: a header,
    then chunks until total_bytes, then the next header."""
    outs, i = [], 0
    while i < len(msgs):
        assert msgs[i].WhichOneof("kind") == "header", i
        head, data = msgs[i].header, msgs[i].header.data
        i += 1
        while len(data) < head.total_bytes:
            assert msgs[i].WhichOneof("kind") == "chunk", i
            data += msgs[i].chunk
            i += 1
        assert len(data) == head.total_bytes
        outs.append((head, data))
    return outs


def layer_backward(stub, pb, grpc):
    """ConvolutionBackward: every subset of outputs, listed in any order,
    comes back in the order DIFF_SRC, DIFF_WEIGHTS, DIFF_BIAS, each output
    checked against numpy; then refusals that name the field."""
    rng = np.random.default_rng(11)
    n, ic, oc, groups, ih, iw, k, s, p, d = 2, 4, 6, 2, 9, 8, 3, 2, 1, 1
    oh = (ih + 2 * p - ((k - 1) * d + 1)) // s + 1
    ow = (iw + 2 * p - ((k - 1) * d + 1)) // s + 1
    x = rng.uniform(-1, 1, (n, ic, ih, iw)).astype("<f4")
    dy = rng.uniform(-1, 1, (n, oc, oh, ow)).astype("<f4")
    w = rng.uniform(-1, 1, (oc, ic // groups, k, k)).astype("<f4")
    want = {pb.DIFF_SRC: conv_bwd_data_ref(dy, w, groups, s, p, d, (ih, iw)),
            pb.DIFF_WEIGHTS: conv_bwd_weights_ref(x, dy, groups, s, p, d, k),
            pb.DIFF_BIAS: dy.astype(np.float64).sum(axis=(0, 2, 3))}
    attrs = pb.Attributes(strides=[s, s], pads_begin=[p, p], pads_end=[p, p],
                          groups=groups, data_format=pb.NCX,
                          weights_format=pb.OIX)

    def call(outputs, chunk=1024):
        header = pb.ComputeHeader(
            op=pb.CONVOLUTION_BACKWARD, attrs=attrs, outputs=outputs,
            inputs=[pb.Tensor(dtype=pb.F32, shape=list(t.shape))
                    for t in (x, dy, w)],
            response_chunk_bytes=chunk)

        def requests():
            yield pb.ComputeRequest(header=header)
            for i, t in enumerate((x, dy, w)):
                b = t.tobytes()
                for off in range(0, len(b), 700):
                    yield pb.ComputeRequest(
                        chunk=pb.DataChunk(input=i, data=b[off:off + 700]))
        return list(stub.Compute(requests(), timeout=30))

    order = [pb.DIFF_SRC, pb.DIFF_WEIGHTS, pb.DIFF_BIAS]
    for asked in ([], [pb.DIFF_BIAS, pb.DIFF_SRC], [pb.DIFF_WEIGHTS],
                  [pb.DIFF_BIAS, pb.DIFF_WEIGHTS, pb.DIFF_SRC]):
        outs = read_outputs(call(asked))
        expect = [o for o in order if not asked or o in asked]
        assert [h.output for h, _ in outs] == expect, (asked, outs)
        for head, data in outs:
            ref = want[head.output]
            assert list(head.shape) == list(ref.shape), head
            assert head.layout == (pb.LAYOUT_UNSPECIFIED
                                   if head.output == pb.DIFF_BIAS else
                                   pb.OIX if head.output == pb.DIFF_WEIGHTS
                                   else pb.NCX), head
            got = np.frombuffer(data, "<f4").reshape(ref.shape)
            err = np.max(np.abs(got - ref))
            assert err < 1e-4, (head.output, err)
    for asked, field in (([pb.DIFF_SRC, pb.DIFF_SRC], "header.outputs[1]"),
                         ([7], "header.outputs[0]")):
        try:
            call(asked)
            raise AssertionError("accepted outputs %r" % asked)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
            assert field in e.details(), e.details()


def layer_cancels_free_places(args, out, pb, pbg, grpc):
    """Layer calls cancelled at their first message (diff_src streaming,
    the other outputs not yet sent) must give every place back: a server
    with 3 places (2 workers, queue 1) still answers a layer call after 8
    such cancels."""
    import time
    log = open(os.path.join(out, "server-places.log"), "w")
    proc, port = start_server(args.server, log, ["--queue-depth", "1",
                                                 "--max-calls-per-peer",
                                                 "64"])
    try:
        ch = grpc.insecure_channel("127.0.0.1:%d" % port)
        stub = pbg.ConvGradStub(ch)
        rng = np.random.default_rng(3)
        x = rng.uniform(-1, 1, (8, 32, 28, 28)).astype("<f4")
        dy = rng.uniform(-1, 1, (8, 32, 28, 28)).astype("<f4")
        w = rng.uniform(-1, 1, (32, 32, 3, 3)).astype("<f4")
        header = pb.ComputeHeader(
            op=pb.CONVOLUTION_BACKWARD,
            attrs=pb.Attributes(pads_begin=[1, 1], pads_end=[1, 1],
                                data_format=pb.NCX, weights_format=pb.OIX),
            inputs=[pb.Tensor(dtype=pb.F32, shape=list(t.shape),
                              data=t.tobytes()) for t in (x, dy, w)],
            response_chunk_bytes=1024)
        def busy(e):
            # The last cancels may not have reached the server yet.
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
            time.sleep(0.1)
        cancelled = 0
        for _ in range(100):
            call = stub.Compute(iter([pb.ComputeRequest(header=header)]),
                                timeout=30)
            try:
                assert next(call).WhichOneof("kind") == "header"
            except grpc.RpcError as e:
                busy(e)
                continue
            call.cancel()
            cancelled += 1
            if cancelled == 8:
                break
        assert cancelled == 8, cancelled
        for attempt in range(50):
            try:
                outs = read_outputs(list(stub.Compute(
                    iter([pb.ComputeRequest(header=header)]), timeout=30)))
                break
            except grpc.RpcError as e:
                busy(e)
        else:
            raise AssertionError("the server's places never came back")
        assert [h.output for h, _ in outs] == [pb.DIFF_SRC, pb.DIFF_WEIGHTS,
                                               pb.DIFF_BIAS]
        ch.close()
    finally:
        assert stop_server(proc, log) == 0


def main():
    args = common_args(__doc__).parse_args()
    out = prepare_stubs(args.proto, args.workdir, "cgs-py-")
    if not out:
        return 77
    import grpc
    from convgrad.v1 import convgrad_pb2 as pb
    from convgrad.v1 import convgrad_pb2_grpc as pbg
    import health_pb2
    import health_pb2_grpc

    log = open(os.path.join(out, "server.log"), "w")
    proc, port = start_server(args.server, log)
    try:
        ch = grpc.insecure_channel("127.0.0.1:%d" % port)
        health = health_pb2_grpc.HealthStub(ch)
        r = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert r.status == health_pb2.HealthCheckResponse.SERVING, r
        watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=10)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
        try:
            health.Check(health_pb2.HealthCheckRequest(service="nope"),
                         timeout=10)
            raise AssertionError("unknown service accepted")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.NOT_FOUND, e

        stub = pbg.ConvGradStub(ch)
        info = stub.GetServerInfo(pb.ServerInfoRequest(), timeout=10)
        names = {o.op: list(o.names) for o in info.ops}
        assert names[pb.CONVOLUTION_BACKWARD_DATA][0] == \
            "ConvolutionBackwardData", names
        assert "ConvolutionBackpropData" in names[pb.CONVOLUTION_BACKWARD_DATA]
        assert info.workers == 2 and info.limits.default_chunk_bytes == 4096
        assert info.limits.idle_timeout_ms == 30000 and not info.io_cpus
        assert info.onednn_version and info.cpu_isa

        # ConvolutionBackwardData, NCX / OIX, 2 groups, stride 2.
        rng = np.random.default_rng(7)
        n, ic, oc, groups, ih, iw, k, s, p, d = 2, 6, 4, 2, 11, 9, 3, 2, 1, 1
        oh = (ih + 2 * p - ((k - 1) * d + 1)) // s + 1
        ow = (iw + 2 * p - ((k - 1) * d + 1)) // s + 1
        dy = rng.uniform(-1, 1, (n, oc, oh, ow)).astype("<f4")
        w = rng.uniform(-1, 1, (oc, ic // groups, k, k)).astype("<f4")
        header = pb.ComputeHeader(
            op=pb.CONVOLUTION_BACKPROP_DATA,  # the older spec's name
            attrs=pb.Attributes(strides=[s, s], pads_begin=[p, p],
                                pads_end=[p, p], dilations=[d, d],
                                groups=groups, data_format=pb.NCX,
                                weights_format=pb.OIX,
                                dst_shape=[n, ic, ih, iw]),
            inputs=[pb.Tensor(dtype=pb.F32, shape=list(dy.shape),
                              data=dy.tobytes()[:100]),
                    pb.Tensor(dtype=pb.F32, shape=list(w.shape))],
            response_chunk_bytes=1024)

        def requests():
            yield pb.ComputeRequest(header=header)
            rest = dy.tobytes()[100:]
            for i in range(0, len(rest), 512):
                yield pb.ComputeRequest(
                    chunk=pb.DataChunk(input=0, data=rest[i:i + 512]))
            yield pb.ComputeRequest(chunk=pb.DataChunk(input=1,
                                                       data=w.tobytes()))

        # Chunked (1024-byte chunks), then whole in header.data: the
        # result is 4752 bytes, under both 64 KiB and 8192.
        want = conv_bwd_data_ref(dy, w, groups, s, p, d, (ih, iw))
        for chunk_bytes, nmsgs in ((1024, 6), (8192, 1)):
            header.response_chunk_bytes = chunk_bytes
            msgs = list(stub.Compute(requests(), timeout=30))
            assert len(msgs) == nmsgs, (chunk_bytes, len(msgs))
            head = msgs[0].header
            assert msgs[0].WhichOneof("kind") == "header"
            assert list(head.shape) == [n, ic, ih, iw], head
            assert head.layout == pb.NCX and head.dtype == pb.F32
            data = head.data + b"".join(m.chunk for m in msgs[1:])
            assert all(len(m.chunk) <= chunk_bytes for m in msgs[1:])
            assert len(data) == head.total_bytes == n * ic * ih * iw * 4
            got = np.frombuffer(data, "<f4").reshape(n, ic, ih, iw)
            err = np.max(np.abs(got - want))
            assert err < 1e-4, (chunk_bytes, err)

        layer_backward(stub, pb, grpc)
        layer_cancels_free_places(args, out, pb, pbg, grpc)

        # A truncated stream is INVALID_ARGUMENT, naming the input.
        def truncated():
            yield pb.ComputeRequest(header=header)
        try:
            list(stub.Compute(truncated(), timeout=30))
            raise AssertionError("truncated stream accepted")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
            assert "inputs[0]" in e.details(), e.details()
        ch.close()
    finally:
        rc = stop_server(proc, log)
    assert rc == 0, rc
    print("python grpcio client: health, info, compute (max error %.2g) ok"
          % err)
    return 0


if __name__ == "__main__":
    sys.exit(main())
