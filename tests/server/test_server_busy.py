#!/usr/bin/python3
"""test_server_busy.py - a busy server makes callers wait and refuses only
what it has no room for, saying when to come back (issue 29), through
grpcio against a real convgrad-server:

- --max-calls-per-peer counts a client's calls still sending their request,
  exactly: calls waiting for the worker do not count (one client gets 5 in
  flight under a limit of 2), two stalled uploads do, and a third call is
  then refused;
- "retry later" refusals (that limit, a full queue, a draining server) carry
  the trailing metadata retry-after-ms, a positive decimal; permanent
  refusals (over a size limit, an invalid request) never do;
- convgrad_refusals_total counts each refusal under its reason.

Exits 77 (ctest skip) without a stub generator."""
import os
import re
import signal
import sys
import threading
import time
import urllib.request

import numpy as np

from test_server_python import (common_args, prepare_stubs, start_server,
                                stop_server)


def retry_after(err):
    """The retry-after-ms trailing metadata of a failed call, or None."""
    for key, val in err.trailing_metadata() or ():
        if key == "retry-after-ms":
            return val
    return None


def metric(url, name, **labels):
    """One sample of the server's /metrics (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(url, timeout=10) as r:
        body = r.read().decode()
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return 0.0


class Client:
    """grpcio calls of ConvolutionBackwardData f32, NCX/OIX."""

    def __init__(self, grpc, pb, pbg, port):
        self.grpc, self.pb = grpc, pb
        self.ch = grpc.insecure_channel("127.0.0.1:%d" % port)
        self.stub = pbg.ConvGradStub(self.ch)

    def header(self, n, c, hw, data=None):
        """A header of n x c x hw x hw diff_dst and c x c x 3 x 3 weights;
        data: both tensors' bytes inline, else they come in chunks."""
        pb = self.pb
        h = pb.ComputeHeader(
            op=pb.CONVOLUTION_BACKWARD_DATA,
            attrs=pb.Attributes(strides=[1, 1], pads_begin=[1, 1],
                                pads_end=[1, 1], data_format=pb.NCX,
                                weights_format=pb.OIX,
                                dst_shape=[n, c, hw, hw]))
        for i, shape in enumerate(([n, c, hw, hw], [c, c, 3, 3])):
            t = h.inputs.add(dtype=pb.F32, shape=shape)
            if data:
                t.data = data[i]
        return h

    def tensors(self, n, c, hw, seed=1):
        rng = np.random.default_rng(seed)
        return (rng.uniform(-1, 1, (n, c, hw, hw)).astype("<f4").tobytes(),
                rng.uniform(-1, 1, (c, c, 3, 3)).astype("<f4").tobytes())

    def call(self, n, c, hw, gate=None):
        """One call, its tensors in chunks; with gate, the first chunk goes
        and the rest waits for it. Returns the result bytes or the error."""
        pb = self.pb
        data = self.tensors(n, c, hw)

        def requests():
            yield pb.ComputeRequest(header=self.header(n, c, hw))
            first = True
            for i, b in enumerate(data):
                for off in range(0, len(b), 65536):
                    yield pb.ComputeRequest(chunk=pb.DataChunk(
                        input=i, data=b[off:off + 65536]))
                    if first and gate:
                        gate.wait(60)
                    first = False
        try:
            got = 0
            for r in self.stub.Compute(requests(), timeout=60):
                got += len(r.header.data) if r.HasField("header") else \
                    len(r.chunk)
            return got
        except self.grpc.RpcError as e:
            return e

    def header_only(self, h):
        """A call that sends header h and half-closes; None or the error."""
        try:
            list(self.stub.Compute(iter([self.pb.ComputeRequest(header=h)]),
                                   timeout=30))
            return None
        except self.grpc.RpcError as e:
            return e

    def tiny(self):
        """A whole small call in its header."""
        return self.header_only(self.header(1, 4, 8, self.tensors(1, 4, 8)))

    def close(self):
        self.ch.close()


def background(fn, *args):
    out = []
    t = threading.Thread(target=lambda: out.append(fn(*args)))
    t.start()
    return t, out


def wait_for(what, cond, timeout=30):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out waiting for " + what
        time.sleep(0.02)


def metrics_url(proc):
    m = re.search(r" metrics=127\.0\.0\.1:(\d+) ", proc.ready_line)
    assert m, proc.ready_line
    return "http://127.0.0.1:%s/metrics" % m.group(1)


# Holding the one worker: about a second of work, in 40 MB.
LONG = (16, 512, 28)
# Held uploads: 1 MB declared.
HELD = (1, 16, 128)


def hold_two(cl, url):
    """Two calls whose uploads stop after their first chunk, once the
    server has admitted both; returns their gate and threads."""
    n, c, hw = HELD
    reserved = 4 * (2 * n * c * hw * hw + c * c * 9)  # dy, w and dx
    gate = threading.Event()
    held = [background(cl.call, n, c, hw, gate) for _ in range(2)]
    wait_for("two held uploads", lambda: metric(
        url, "convgrad_inflight_bytes") == 2 * reserved)
    return gate, held


def release(gate, held):
    """Lets the held uploads go on; they must end well."""
    gate.set()
    for t, out in held:
        t.join(60)
        assert isinstance(out[0], int) and out[0] > 0, out


def peer_limit_counts_uploads(ctx):
    log = open(os.path.join(ctx.out, "server-busy-peer.log"), "w")
    proc, port = start_server(ctx.args.server, log, [
        "--workers", "1", "--queue-depth", "8", "--max-calls-per-peer", "2",
        "--max-request-bytes", "64M", "--metrics-listen", "127.0.0.1:0"])
    url = metrics_url(proc)
    cl = Client(ctx.grpc, ctx.pb, ctx.pbg, port)
    try:
        # A long job runs, and four small calls queue behind it, each
        # started once the one before waits: only calls still sending
        # count, so none is refused.
        long = background(cl.call, *LONG)
        wait_for("the long job", lambda: metric(
            url, "convgrad_busy_workers") == 1)
        calls = []
        for k in range(1, 5):
            calls.append(background(cl.tiny))
            out = calls[-1][1]
            wait_for("%d jobs queued" % k, lambda: out or metric(
                url, "convgrad_queued_requests") == k)
            assert not out, out  # waiting, not refused
        long[0].join(60)
        assert isinstance(long[1][0], int) and long[1][0] > 0, long[1]
        for t, out in calls:
            t.join(60)
            assert out == [None], out
        # Two uploads held after their first chunk do count.
        gate, held = hold_two(cl, url)
        e = cl.tiny()
        assert e and e.code() == ctx.grpc.StatusCode.RESOURCE_EXHAUSTED, e
        assert "--max-calls-per-peer" in e.details(), e.details()
        assert "2 calls still sending" in e.details(), e.details()
        assert retry_after(e) == "100", e.trailing_metadata()
        release(gate, held)
        assert cl.tiny() is None
        # Permanent refusals carry no hint.
        big = cl.header_only(cl.header(1, 64, 1024))  # over the limit
        assert big.code() == ctx.grpc.StatusCode.RESOURCE_EXHAUSTED, big
        assert "cannot run on this server" in big.details(), big.details()
        assert retry_after(big) is None, big.trailing_metadata()
        h = cl.header(1, 4, 8, cl.tensors(1, 4, 8))
        h.attrs.groups = 3
        e = cl.header_only(h)
        assert e.code() == ctx.grpc.StatusCode.INVALID_ARGUMENT, e
        assert retry_after(e) is None, e.trailing_metadata()
        # A call counts once freed, just after its client saw the end.
        wait_for("1 refusal for peer_calls", lambda: metric(
            url, "convgrad_refusals_total", reason="peer_calls") == 1)
        assert metric(url, "convgrad_refusals_total",
                      reason="queue_full") == 0
    finally:
        cl.close()
        assert stop_server(proc, log) == 0
    return "5 calls in flight under a limit of 2; a 3rd upload refused"


def queue_full_and_drain(ctx):
    log = open(os.path.join(ctx.out, "server-busy-queue.log"), "w")
    proc, port = start_server(ctx.args.server, log, [
        "--workers", "1", "--queue-depth", "1", "--max-calls-per-peer", "10",
        "--metrics-listen", "127.0.0.1:0"])
    url = metrics_url(proc)
    cl = Client(ctx.grpc, ctx.pb, ctx.pbg, port)
    try:
        gate, held = hold_two(cl, url)
        e = cl.tiny()
        assert e and e.code() == ctx.grpc.StatusCode.RESOURCE_EXHAUSTED, e
        assert "queue full" in e.details(), e.details()
        hint = retry_after(e)
        assert hint and hint.isdigit() and 5 <= int(hint) <= 2000, hint
        proc.send_signal(signal.SIGTERM)  # drains: the held calls go on
        for _ in range(100):
            e = cl.tiny()
            if e and e.code() == ctx.grpc.StatusCode.UNAVAILABLE:
                break
            time.sleep(0.05)
        assert e and e.code() == ctx.grpc.StatusCode.UNAVAILABLE, e
        assert retry_after(e) == "1000", e.trailing_metadata()
        # A call sent as the signal arrives may still find the queue full.
        wait_for("refusals for queue_full and draining", lambda: metric(
            url, "convgrad_refusals_total", reason="queue_full") >= 1 and
            metric(url, "convgrad_refusals_total", reason="draining") >= 1)
        release(gate, held)
    finally:
        cl.close()
        rc = proc.wait(timeout=60)
        log.close()
    assert rc == 0, rc
    return "queue full and draining refused with retry-after-ms"


class Context:
    pass


def main():
    args = common_args(__doc__).parse_args()
    out = prepare_stubs(args.proto, args.workdir, "cgs-busy-")
    if not out:
        return 77
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        print("no python3-prometheus-client: skipped")
        return 77
    import grpc
    from convgrad.v1 import convgrad_pb2 as pb
    from convgrad.v1 import convgrad_pb2_grpc as pbg
    ctx = Context()
    ctx.args, ctx.out, ctx.grpc, ctx.pb, ctx.pbg = args, out, grpc, pb, pbg
    for check in (peer_limit_counts_uploads, queue_full_and_drain):
        t0 = time.monotonic()
        figures = check(ctx)
        print("%-28s %5.1f s  %s" % (check.__name__, time.monotonic() - t0,
                                     figures))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
