#!/usr/bin/python3
"""test_server_metrics.py - the Prometheus endpoint (--metrics-listen),
read with Debian's python3-prometheus-client parser: every family the
server promises, with its type; counters that move exactly with the calls
made through grpcio (OK, INVALID_ARGUMENT, RESOURCE_EXHAUSTED, and a call
whose op never arrived), bytes, primitive lookups, retried calls and queue
waits by peer class included (the "retry later" refusals are
test_server_busy.py's); histograms
whose buckets add up; the in-flight gauge while an upload waits; the
process_* family; the shared-memory regions gauge; 404 and 405 for other paths and methods; and a bad or
busy --metrics-listen refused at start with a message."""
import os
import re
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import numpy as np

from test_server_python import (common_args, prepare_stubs, start_server,
                                stop_server)

FAMILIES = {
    "convgrad_requests": "counter",
    "convgrad_request_seconds": "histogram",
    "convgrad_queue_seconds": "histogram",
    "convgrad_compute_seconds": "histogram",
    "convgrad_received_bytes": "counter",
    "convgrad_sent_bytes": "counter",
    "convgrad_inflight_bytes": "gauge",
    "convgrad_queued_requests": "gauge",
    "convgrad_busy_workers": "gauge",
    "convgrad_inline_jobs": "counter",
    "convgrad_bulk_deferred": "counter",
    "convgrad_workers": "gauge",
    "convgrad_shm_regions": "gauge",
    "convgrad_primitive_cache_hits": "counter",
    "convgrad_primitive_cache_misses": "counter",
    "convgrad_refusals": "counter",
    "convgrad_retried_requests": "counter",
    "convgrad_queue_wait_seconds": "histogram",
    "convgrad_warmup_result_checks": "counter",
    "convgrad_warmup_result_check_failures": "counter",
    "process_cpu_seconds": "counter",
    "process_resident_memory_bytes": "gauge",
    "process_virtual_memory_bytes": "gauge",
    "process_start_time_seconds": "gauge",
    "process_open_fds": "gauge",
    "process_max_fds": "gauge",
}


def family_name(name):
    """The parser drops a counter's _total from its family name in newer
    versions of prometheus_client, and keeps it in older ones."""
    return name[:-len("_total")] if name.endswith("_total") else name


def scrape(url):
    """Parses GET url into {(sample name, labels): value} and
    {family: type}, checking the Content-Type on the way."""
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        ctype = r.headers["Content-Type"]
        assert ctype.startswith("text/plain; version=0.0.4"), ctype
        body = r.read().decode()
    samples, types = {}, {}
    for fam in text_string_to_metric_families(body):
        types[family_name(fam.name)] = fam.type
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in samples, key
            samples[key] = s.value
    return samples, types


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(before, after, name, **labels):
    return value(after, name, **labels) - value(before, name, **labels)


def check_histograms(samples, types):
    """Cumulative buckets never decrease and +Inf equals _count."""
    for fam, kind in types.items():
        if kind != "histogram":
            continue
        series = {}
        for (name, labels), v in samples.items():
            if name == fam + "_bucket":
                d = dict(labels)
                le = float(d.pop("le"))
                series.setdefault(tuple(sorted(d.items())), []).append((le, v))
        assert series, fam
        for labels, buckets in series.items():
            buckets.sort()
            counts = [v for _, v in buckets]
            assert counts == sorted(counts), (fam, labels, buckets)
            assert buckets[-1][0] == float("inf")
            assert counts[-1] == samples[(fam + "_count", labels)], fam


def http_status(url, method="GET"):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method),
                                    timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def refused_at_start(server, flag, want):
    r = subprocess.run([server, "--listen", "127.0.0.1:0",
                        "--metrics-listen", flag],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode in (1, 2), (flag, r.returncode, r.stderr)
    assert "--metrics-listen" in r.stderr and want in r.stderr, \
        (flag, r.stderr)


def main():
    args = common_args(__doc__).parse_args()
    out = prepare_stubs(args.proto, args.workdir, "cgs-metrics-")
    if not out:
        return 77
    import grpc
    from convgrad.v1 import convgrad_pb2 as pb
    from convgrad.v1 import convgrad_pb2_grpc as pbg

    log = open(os.path.join(out, "server-metrics.log"), "w")
    proc, port = start_server(args.server, log, [
        "--metrics-listen", "127.0.0.1:0", "--max-request-bytes", "1M",
        "--chunk-bytes", "1M"])
    try:
        m = re.search(r" metrics=127\.0\.0\.1:(\d+) ", proc.ready_line)
        assert m, proc.ready_line
        url = "http://127.0.0.1:%s/metrics" % m.group(1)
        before, types = scrape(url)
        for fam, kind in FAMILIES.items():
            assert types.get(fam) == kind, (fam, types.get(fam))
        assert value(before, "convgrad_workers") == 2
        start = value(before, "process_start_time_seconds")
        assert time.time() - 600 < start <= time.time(), start
        assert value(before, "process_resident_memory_bytes") > 1e6
        assert value(before, "process_open_fds") > 3
        assert http_status(url.replace("/metrics", "/other")) == 404
        assert http_status(url, "POST") == 405
        assert http_status(url, "HEAD") == 200

        stub = pbg.ConvGradStub(grpc.insecure_channel("127.0.0.1:%d" % port))
        # The regions gauge follows RegisterRegion and UnregisterRegion.
        assert value(before, "convgrad_shm_regions") == 0
        key = "convgrad-test-metrics-%d" % os.getpid()
        with open("/dev/shm/" + key, "wb") as f:
            f.truncate(4096)
        try:
            stub.RegisterRegion(pb.RegisterRegionRequest(
                name="m", key="/" + key, byte_size=4096))
            assert value(scrape(url)[0], "convgrad_shm_regions") == 1
            stub.UnregisterRegion(pb.UnregisterRegionRequest(name="m"))
            assert value(scrape(url)[0], "convgrad_shm_regions") == 0
        finally:
            os.unlink("/dev/shm/" + key)
        rng = np.random.default_rng(5)
        n, ic, oc, hw = 2, 3, 4, 8
        attrs = dict(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1],
                     data_format=pb.NCX, weights_format=pb.OIX)
        x = rng.uniform(-1, 1, (n, ic, hw, hw)).astype("<f4")
        dy = rng.uniform(-1, 1, (n, oc, hw, hw)).astype("<f4")
        w = rng.uniform(-1, 1, (oc, ic, 3, 3)).astype("<f4")

        def bf16(a):
            return (a.view("<u4") >> 16).astype("<u2")

        def messages(header, tensors, gate=None):
            yield pb.ComputeRequest(header=header)
            for i, t in enumerate(tensors):
                b = t.tobytes()
                for off in range(0, len(b), 1000):
                    yield pb.ComputeRequest(
                        chunk=pb.DataChunk(input=i, data=b[off:off + 1000]))
                    if gate:
                        gate.wait(30)

        def bwd_data_header(**extra):
            a = dict(attrs, dst_shape=[n, ic, hw, hw])
            a.update(extra)
            return pb.ComputeHeader(
                op=pb.CONVOLUTION_BACKWARD_DATA, attrs=pb.Attributes(**a),
                inputs=[pb.Tensor(dtype=pb.F32, shape=list(dy.shape)),
                        pb.Tensor(dtype=pb.F32, shape=list(w.shape))])

        def result_bytes(msgs):
            return sum(len(r.header.data) if r.WhichOneof("kind") == "header"
                       else len(r.chunk) for r in msgs)

        def refused(requests, code):
            try:
                list(stub.Compute(requests, timeout=30))
                raise AssertionError("accepted")
            except grpc.RpcError as e:
                assert e.code() == code, e

        sent = received = 0
        for k in range(3):
            # The second and third come as a client's retries.
            retry = (("convgrad-retry-attempt", str(k)),) if k else None
            msgs = list(stub.Compute(messages(bwd_data_header(), (dy, w)),
                                     timeout=30, metadata=retry))
            received += dy.nbytes + w.nbytes
            sent += result_bytes(msgs)
        assert sent == 3 * x.nbytes, sent
        layer = pb.ComputeHeader(
            op=pb.CONVOLUTION_BACKWARD, attrs=pb.Attributes(**attrs),
            inputs=[pb.Tensor(dtype=pb.BF16, shape=list(t.shape))
                    for t in (x, dy, w)])
        for _ in range(2):
            msgs = list(stub.Compute(
                messages(layer, [bf16(t) for t in (x, dy, w)]), timeout=30))
            received += (x.nbytes + dy.nbytes + w.nbytes) // 2
            sent += result_bytes(msgs)
        # Refused at the header: nothing after it is read.
        for _ in range(2):
            refused(iter([pb.ComputeRequest(header=bwd_data_header(
                groups=3))]), grpc.StatusCode.INVALID_ARGUMENT)
        big = pb.ComputeHeader(
            op=pb.CONVOLUTION_BACKWARD_DATA,
            attrs=pb.Attributes(**dict(attrs, dst_shape=[n, ic, 256, 256])),
            inputs=[pb.Tensor(dtype=pb.F32, shape=[n, oc, 256, 256]),
                    pb.Tensor(dtype=pb.F32, shape=list(w.shape))])
        refused(iter([pb.ComputeRequest(header=big)]),
                grpc.StatusCode.RESOURCE_EXHAUSTED)
        refused(iter([pb.ComputeRequest(chunk=pb.DataChunk(input=0))]),
                grpc.StatusCode.INVALID_ARGUMENT)

        # A call counts when the server frees it, just after its client
        # got the status: wait for the last one.
        req = "convgrad_requests_total"
        for _ in range(200):
            after, types = scrape(url)
            total = sum(v for (name, _), v in after.items() if name == req)
            if total >= 9:
                break
            time.sleep(0.05)
        check_histograms(after, types)
        data, lay = "ConvolutionBackwardData", "ConvolutionBackward"
        for labels, want in (
                (dict(op=data, dtype="f32", code="OK"), 3),
                (dict(op=lay, dtype="bf16", code="OK"), 2),
                (dict(op=data, dtype="f32", code="INVALID_ARGUMENT"), 2),
                (dict(op=data, dtype="f32", code="RESOURCE_EXHAUSTED"), 1),
                (dict(op="unknown", dtype="unknown",
                      code="INVALID_ARGUMENT"), 1)):
            got = delta(before, after, req, **labels)
            assert got == want, (labels, got, want)
        assert total == 9, total
        for op, calls, computed in ((data, 6, 3), (lay, 2, 2),
                                    ("unknown", 1, 0)):
            got = delta(before, after, "convgrad_request_seconds_count", op=op)
            assert got == calls, (op, got)
            for fam in ("queue", "compute"):
                got = delta(before, after, "convgrad_%s_seconds_count" % fam,
                            op=op)
                assert got == computed, (op, fam, got)
        assert value(after, "convgrad_compute_seconds_sum", op=data) > 0
        # Every job came from loopback; no refusal was "retry later".
        for peer, want in (("loopback", 5), ("unix", 0), ("remote", 0)):
            got = delta(before, after, "convgrad_queue_wait_seconds_count",
                        peer=peer)
            assert got == want, (peer, got)
        got = delta(before, after, "convgrad_retried_requests_total")
        assert got == 2, got
        for reason in ("queue_full", "inflight_bytes", "peer_calls",
                       "draining"):
            got = delta(before, after, "convgrad_refusals_total",
                        reason=reason)
            assert got == 0, (reason, got)
        got = delta(before, after, "convgrad_received_bytes_total")
        assert got == received, (got, received)
        got = delta(before, after, "convgrad_sent_bytes_total")
        assert got == sent, (got, sent)
        # One lookup per single call; the layer calls' diff_src and
        # diff_weights (diff_bias has no primitive).
        hits = delta(before, after, "convgrad_primitive_cache_hits_total")
        misses = delta(before, after, "convgrad_primitive_cache_misses_total")
        assert hits + misses == 3 + 2 * 2 and misses >= 2, (hits, misses)
        assert value(after, "convgrad_inflight_bytes") == 0
        assert value(after, "convgrad_queued_requests") == 0
        # No message of these calls moved over 64 KiB: none waited as bulk.
        assert delta(before, after, "convgrad_bulk_deferred_total") == 0
        assert value(after, "process_cpu_seconds_total") > 0

        # An upload held after its first chunk: its reservation shows.
        gate, results = threading.Event(), []
        t = threading.Thread(target=lambda: results.append(list(
            stub.Compute(messages(bwd_data_header(), (dy, w), gate),
                         timeout=60))))
        t.start()
        reserved = dy.nbytes + w.nbytes + x.nbytes
        for _ in range(100):
            now, _ = scrape(url)
            if value(now, "convgrad_inflight_bytes"):
                break
            time.sleep(0.05)
        assert value(now, "convgrad_inflight_bytes") == reserved, \
            value(now, "convgrad_inflight_bytes")
        gate.set()
        t.join(60)
        assert results and result_bytes(results[0]) == x.nbytes
        for _ in range(200):
            now, _ = scrape(url)
            if delta(after, now, req, op=data, dtype="f32", code="OK"):
                break
            time.sleep(0.05)
        assert delta(after, now, req, op=data, dtype="f32", code="OK") == 1
        assert value(now, "convgrad_inflight_bytes") == 0

        # Bulk work (cgs_cq_defer, cgs_fairq.h): a 128 KiB request chunk and a 96 KiB
        # result chunk each wait for the ready events, and are counted.
        dy2 = rng.uniform(-1, 1, (n, oc, 64, 64)).astype("<f4")
        head = bwd_data_header(dst_shape=[n, ic, 64, 64])
        head.inputs[0].shape[:] = list(dy2.shape)
        msgs = list(stub.Compute(iter([
            pb.ComputeRequest(header=head),
            pb.ComputeRequest(chunk=pb.DataChunk(input=0, data=dy2.tobytes())),
            pb.ComputeRequest(chunk=pb.DataChunk(input=1, data=w.tobytes()))]),
            timeout=30))
        assert [r.WhichOneof("kind") for r in msgs] == ["header", "chunk"]
        assert result_bytes(msgs) == n * ic * 64 * 64 * 4
        got = delta(now, scrape(url)[0], "convgrad_bulk_deferred_total")
        assert got == 2, got
    finally:
        rc = stop_server(proc, log)
    assert rc == 0, rc

    refused_at_start(args.server, "nonsense", "expected HOST:PORT")
    refused_at_start(args.server, "127.0.0.1:99999", "port")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    refused_at_start(args.server, "127.0.0.1:%d" % busy.getsockname()[1],
                     "Address already in use")
    busy.close()
    print("server_metrics: every check passed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
