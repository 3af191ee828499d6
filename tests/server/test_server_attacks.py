#!/usr/bin/python3
"""test_server_attacks.py - the attacks of issue 12, each run briefly
against a real convgrad-server, as a hostile client would: over grpcio and
over raw HTTP/2 (python3-h2), from 127.0.0.2 so that the legitimate client
on 127.0.0.1 is another peer. During each attack a legitimate client must
keep getting correct answers; the server's RSS must stay bounded and come
back afterwards; the server must exit 0 on SIGTERM (under ASan/UBSan any
report aborts it). Exits 77 (ctest skip) without a stub generator or h2.

Usage: test_server_attacks.py --server BIN --proto DIR [--only NAME,...]
"""
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

from test_server_python import common_args, prepare_stubs, start_server

ATTACKER = "127.0.0.2"
MiB = 1 << 20


class Server:
    """A convgrad-server on an ephemeral port, its log in a file."""

    def __init__(self, path, workdir, name, args):
        self.log_path = os.path.join(workdir, "attack-%s.log" % name)
        self.log = open(self.log_path, "w")
        self.proc, self.port = start_server(path, self.log, args)

    def rss_mib(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
        return 0.0

    def log_lines(self):
        self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read().splitlines()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=60)
        self.log.close()
        return rc


class Legit:
    """The legitimate client: a small ConvolutionBackwardData over grpcio,
    whose answer is checked against numpy."""

    def __init__(self, grpc, pb, port):
        import numpy as np
        from test_server_python import conv_bwd_data_ref
        self.grpc, self.pb = grpc, pb
        self.ch = grpc.insecure_channel("127.0.0.1:%d" % port)
        self.compute = self.ch.stream_stream(
            "/convgrad.v1.ConvGrad/Compute",
            request_serializer=pb.ComputeRequest.SerializeToString,
            response_deserializer=pb.ComputeResponse.FromString)
        rng = np.random.default_rng(7)
        self.dy = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
        self.w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
        self.ref = conv_bwd_data_ref(self.dy, self.w, 1, 1, 1, 1, (5, 5))
        self.np = np
        self.ok = self.failed = 0
        self.failures = []

    def request(self):
        pb = self.pb
        attrs = pb.Attributes(strides=[1, 1], pads_begin=[1, 1],
                              pads_end=[1, 1], dilations=[1, 1], groups=1,
                              data_format=pb.NCX, weights_format=pb.OIX,
                              dst_shape=[1, 3, 5, 5])
        h = pb.ComputeHeader(op=pb.CONVOLUTION_BACKWARD_DATA, attrs=attrs)
        h.inputs.add(dtype=pb.F32, shape=self.dy.shape,
                     data=self.dy.tobytes())
        h.inputs.add(dtype=pb.F32, shape=self.w.shape, data=self.w.tobytes())
        return pb.ComputeRequest(header=h)

    def call(self, timeout=10):
        """One call; True when it came back OK and right."""
        try:
            data = b""
            for r in self.compute(iter([self.request()]), timeout=timeout):
                data += r.header.data if r.HasField("header") else \
                    r.chunk.data
            got = self.np.frombuffer(data, self.np.float32).reshape(
                self.ref.shape)
            if self.np.allclose(got, self.ref, rtol=1e-4, atol=1e-4):
                self.ok += 1
                return True
            self.failures.append("wrong result")
        except self.grpc.RpcError as e:
            self.failures.append("%s: %s" % (e.code().name, e.details()))
        self.failed += 1
        return False

    def during(self, seconds, pause=0.05):
        """Calls for seconds; returns (ok, failed) of this stretch."""
        ok0, failed0 = self.ok, self.failed
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.call()
            time.sleep(pause)
        return self.ok - ok0, self.failed - failed0


class H2:
    """A raw HTTP/2 connection from the attacker's address, with no gRPC
    library between the test and the wire."""

    def __init__(self, port, source=ATTACKER):
        import h2.config
        import h2.connection
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10,
                                             source_address=(source, 0))
        cfg = h2.config.H2Configuration(client_side=True,
                                        validate_outbound_headers=False,
                                        normalize_outbound_headers=False,
                                        validate_inbound_headers=False)
        self.conn = h2.connection.H2Connection(config=cfg)
        self.conn.initiate_connection()
        self.flush()
        self.ended = {}  # stream id -> trailers (dict) once the stream ends
        self.reset = set()
        self.closed = False

    def flush(self):
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    @staticmethod
    def headers(path, extra=()):
        return [(":method", "POST"), (":scheme", "http"), (":path", path),
                (":authority", "127.0.0.1"),
                ("content-type", "application/grpc"),
                ("te", "trailers")] + list(extra)

    def open(self, path, extra=(), end=False):
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, self.headers(path, extra), end_stream=end)
        return sid

    def pump(self, timeout=0.0):
        """Reads what the server sent within timeout; False once closed."""
        import h2.events
        self.sock.settimeout(timeout if timeout > 0 else 0.001)
        try:
            data = self.sock.recv(1 << 20)
        except (socket.timeout, BlockingIOError):
            return True
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return False
        for ev in self.conn.receive_data(data):
            # A trailers-only answer is one HEADERS frame that ends the
            # stream: its headers carry grpc-status.
            if isinstance(ev, (h2.events.TrailersReceived,
                               h2.events.ResponseReceived)):
                hdrs = {k.decode() if isinstance(k, bytes) else k:
                        v.decode() if isinstance(v, bytes) else v
                        for k, v in ev.headers}
                if "grpc-status" in hdrs:
                    self.ended[ev.stream_id] = hdrs
            elif isinstance(ev, h2.events.StreamReset):
                self.reset.add(ev.stream_id)
            elif isinstance(ev, h2.events.DataReceived):
                self.conn.acknowledge_received_data(
                    ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.ConnectionTerminated):
                self.closed = True
        try:
            self.flush()
        except OSError:
            self.closed = True
        return not self.closed

    def wait_end(self, sid, timeout=10):
        end = time.monotonic() + timeout
        while sid not in self.ended and sid not in self.reset and \
                time.monotonic() < end and self.pump(0.1):
            pass
        return self.ended.get(sid)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def grpc_frame(payload, compressed=False):
    return struct.pack(">BI", 1 if compressed else 0, len(payload)) + payload


# ---- the attacks --------------------------------------------------------
# Each takes the context and returns a line of figures; a failed check
# raises AssertionError.


def attack_shapes(ctx):
    """Item 1: a header whose first shape prints to 159 characters (80 dims
    of 1) overran the log's shape buffer by one byte. The call must be
    refused, and the log line cut with a marker."""
    srv = ctx.server("shapes", [])
    try:
        pb = ctx.pb
        h = pb.ComputeHeader(op=pb.CONVOLUTION_BACKWARD_DATA)
        h.inputs.add(dtype=pb.F32, shape=[1] * 80)
        h.inputs.add(dtype=pb.F32, shape=[1] * 80)
        legit = Legit(ctx.grpc, pb, srv.port)
        try:
            list(legit.compute(iter([pb.ComputeRequest(header=h)]),
                               timeout=10))
            raise AssertionError("an 80-dim shape was accepted")
        except ctx.grpc.RpcError as e:
            assert e.code() == ctx.grpc.StatusCode.INVALID_ARGUMENT, e
        assert legit.call(), legit.failures
        line = [ln for ln in srv.log_lines() if "INVALID_ARGUMENT" in ln]
        assert line and " in=1x1x1x" in line[-1] and "... out=" in line[-1], \
            line
    finally:
        assert srv.stop() == 0
    return "refused with INVALID_ARGUMENT, log line cut with '...'"


FORGED = ("2026-11-24T00:00:00.000Z info  compute id=424242 peer=ipv4:1.2.3.4"
          ":1 op=ConvolutionBackwardData status=OK")


def attack_log_injection(ctx):
    """Item 3: an unknown method's :path was logged verbatim, so a newline
    in it wrote a forged record. Every record must stay one line."""
    srv = ctx.server("logs", [])
    try:
        h2c = H2(srv.port)
        sid = h2c.open("/convgrad.v1.ConvGrad/Nope\n" + FORGED + " \"x\"=y",
                       end=True)
        h2c.flush()
        trailers = h2c.wait_end(sid)
        h2c.close()
        assert trailers and trailers.get("grpc-status") == "12", trailers
        lines = srv.log_lines()
        forged = [ln for ln in lines if ln.startswith(FORGED[:24])]
        assert not forged, forged
        logged = [ln for ln in lines if "method=" in ln]
        assert logged and '\\x0a2026-11-24T00:00:00.000Z' in logged[-1] and \
            '\\"x\\"=y"' in logged[-1], logged
    finally:
        assert srv.stop() == 0
    return "forged record stayed inside one escaped, quoted value"


ATTACKS = {
    "shapes": attack_shapes,
    "log_injection": attack_log_injection,
}


class Context:
    def __init__(self, args, grpc, pb, workdir):
        self.args, self.grpc, self.pb, self.workdir = args, grpc, pb, workdir

    def server(self, name, extra):
        return Server(self.args.server, self.workdir, name, extra)


def main():
    ap = common_args(__doc__)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    try:
        import h2  # noqa: F401
    except ImportError:
        print("no python3-h2: skipped")
        return 77
    out = prepare_stubs(args.proto, args.workdir, "cgs-attacks-")
    if not out:
        return 77
    import grpc
    from convgrad.v1 import convgrad_pb2 as pb
    ctx = Context(args, grpc, pb, out)
    names = args.only.split(",") if args.only else list(ATTACKS)
    for name in names:
        t0 = time.monotonic()
        figures = ATTACKS[name](ctx)
        print("%-16s %5.1f s  %s" % (name, time.monotonic() - t0, figures))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
