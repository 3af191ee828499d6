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

    def close(self):
        self.ch.close()

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
        legit.close()
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


# ---- denial of service (item 5) -----------------------------------------

# --keep-warm 0: memory goes back at the first quiet tick, so that what
# an attack left is measured in seconds (the default keeps it 30 s).
DOS_ARGS = ["--workers", "2", "--queue-depth", "8", "--max-inflight-bytes",
            "256M", "--idle-timeout", "2", "--keep-warm", "0"]
BUDGET_MIB = 256


class Watch:
    """Samples a server's RSS while an attack runs."""

    def __init__(self, srv):
        self.srv, self.peak, self.stop = srv, 0.0, False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop:
            try:
                self.peak = max(self.peak, self.srv.rss_mib())
            except OSError:
                return
            time.sleep(0.02)

    def done(self):
        self.stop = True
        self.thread.join()
        return self.peak


def compute_header_message(pb, declared_mib=1):
    """A valid ComputeRequest header whose inputs (declared_mib MiB of
    diff_dst, then weights) are still to come."""
    c = 16
    hw = int((declared_mib * MiB / 4 / c) ** 0.5)
    attrs = pb.Attributes(strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1],
                          dilations=[1, 1], groups=1, data_format=pb.NCX,
                          weights_format=pb.OIX, dst_shape=[1, c, hw, hw])
    h = pb.ComputeHeader(op=pb.CONVOLUTION_BACKWARD_DATA, attrs=attrs)
    h.inputs.add(dtype=pb.F32, shape=[1, c, hw, hw])
    h.inputs.add(dtype=pb.F32, shape=[c, c, 3, 3])
    return pb.ComputeRequest(header=h).SerializeToString()


def one_byte_chunk(pb):
    return pb.ComputeRequest(
        chunk=pb.DataChunk(input=0, data=b"\0")).SerializeToString()


def dos_run(ctx, name, attack, seconds, extra=(), bound_peak=True,
            check=None):
    """Starts a server, warms it with legitimate calls, runs attack(srv)
    in a thread for about seconds while the legitimate client calls, then
    lets it settle. Returns the figures; asserts the service and memory
    bounds of issue 12 (memory only without sanitizers: ASan's shadow
    memory and quarantine would be most of what is measured). check, if
    given, runs last with the server and the attack's result dict."""
    srv = ctx.server(name, DOS_ARGS + list(extra))
    legit = Legit(ctx.grpc, ctx.pb, srv.port)
    try:
        for _ in range(20):
            assert legit.call(), legit.failures
        before = srv.rss_mib()
        watch = Watch(srv)
        stop = threading.Event()
        result = {}
        t = threading.Thread(target=lambda: result.update(
            attack(srv, stop) or {}), daemon=True)
        t.start()
        time.sleep(min(1.0, seconds / 4))  # let the attack take hold
        ok, failed = legit.during(seconds)
        stop.set()
        t.join(timeout=60)
        peak = watch.done()
        settled = before
        # Up to 5 s for memory to come back; once under sanitizers, where
        # it is reported, not bounded (ASan's quarantine holds it anyway).
        # There the next call may wait behind what the flood left queued
        # (rapid_reset's reset streams, which a sanitized server on a
        # loaded machine took over 10 s to drain): it must be served, in
        # up to 30 s.
        sanitized = bool(os.environ.get("CG_SANITIZED"))
        for _ in range(1 if sanitized else 50):
            settled = srv.rss_mib()
            if settled <= 2 * before:
                break
            time.sleep(0.1)
        assert legit.call(timeout=30 if sanitized else 10), legit.failures
        lines = len(srv.log_lines())
        if check:
            check(srv, result)
    finally:
        legit.close()
        rc = srv.stop()
    fig = ("legit %d ok / %d failed; RSS %.0f -> peak %.0f -> settled %.0f "
           "MiB; %d log lines%s" % (ok, failed, before, peak, settled, lines,
                                    "".join("; %s %s" % kv
                                            for kv in result.items())))
    assert rc == 0, rc
    assert failed == 0 and ok > 0, fig + " " + repr(legit.failures[-3:])
    # Failed calls of one peer are logged at --peer-log-rate (10 a second
    # in bursts of 40), plus a count every 2 s.
    assert lines < 200 + 20 * seconds, fig
    if not sanitized:
        assert not bound_peak or peak < BUDGET_MIB + 256, fig
        assert settled <= 2 * before, fig
    return fig


def open_calls(port, count, first_messages, per_conn=90):
    """count Compute streams from the attacker, per_conn on each
    connection, each sent first_messages (serialized requests) and left
    open. Returns the connections."""
    conns, opened = [], 0
    while opened < count:
        try:
            c = H2(port)
        except OSError:
            break
        conns.append(c)
        for _ in range(min(per_conn, count - opened)):
            try:
                sid = c.open("/convgrad.v1.ConvGrad/Compute")
                for m in first_messages:
                    c.conn.send_data(sid, grpc_frame(m))
                c.flush()
            except Exception:  # refused streams, a closed connection
                break
            opened += 1
        c.pump()
    return conns


def attack_slowloris(ctx):
    """500 Compute calls that send a header and stall held every queue
    place: each legitimate call was refused for the idle timeout."""
    hdr = compute_header_message(ctx.pb)

    def attack(srv, stop):
        conns = open_calls(srv.port, 500, [hdr])
        while not stop.is_set():
            for c in conns:
                c.pump()
            # Stalled calls end at the idle timeout: the attacker opens
            # them again, as fast as the server ends them.
            for c in conns[:]:
                if c.closed:
                    conns.remove(c)
            fresh = open_calls(srv.port, 90, [hdr]) if len(conns) < 6 else []
            conns += fresh
            time.sleep(0.05)
        for c in conns:
            c.close()
        return {}

    return dos_run(ctx, "slowloris", attack, 6)


def attack_trickle(ctx):
    """66 calls each sending a 1-byte chunk every second (faster than the
    idle timeout): every byte was progress, so they held their places
    for ever."""
    hdr, byte = compute_header_message(ctx.pb), one_byte_chunk(ctx.pb)

    def attack(srv, stop):
        conns = []
        streams = []
        for _ in range(66):
            c = H2(srv.port)
            sid = c.open("/convgrad.v1.ConvGrad/Compute")
            c.conn.send_data(sid, grpc_frame(hdr))
            c.flush()
            conns.append(c)
            streams.append((c, sid))
        ended = 0
        while not stop.is_set():
            for c, sid in streams:
                if sid in c.ended or sid in c.reset or c.closed:
                    continue
                try:
                    c.conn.send_data(sid, grpc_frame(byte))
                    c.flush()
                except Exception:
                    pass
                c.pump()
            stop.wait(1.0)
        ended = sum(1 for c, sid in streams if sid in c.ended)
        for c in conns:
            c.close()
        return {"trickling calls ended by the server": ended}

    def check(srv, result):
        # The ones admitted within --max-calls-per-peer were ended by the
        # rate, not left to trickle.
        slow = [ln for ln in srv.log_lines() if "--min-upload-rate" in ln]
        assert slow, "no call ended for its upload rate"
        result["ended for their rate"] = len(slow)

    return dos_run(ctx, "trickle", attack, 6, check=check)


def attack_header_only(ctx):
    """Streams that never send a gRPC message: 100,000 raised RSS from
    17 MB to 1.2 GB, and it stayed there."""

    def attack(srv, stop):
        sent = refused = 0
        conns = []
        while not stop.is_set() and sent < 20000:
            try:
                c = H2(srv.port)
            except OSError:
                refused += 1
                time.sleep(0.01)
                continue
            conns.append(c)
            for _ in range(1000):
                try:
                    c.open("/convgrad.v1.ConvGrad/Compute")
                except Exception:
                    break
                sent += 1
            try:
                c.flush()
            except OSError:
                pass
            c.pump()
        for c in conns:
            c.pump()
        time.sleep(1.0)
        for c in conns:
            c.close()
        return {"streams": sent}

    return dos_run(ctx, "header_only", attack, 5)


def attack_rapid_reset(ctx):
    """HEADERS + RST_STREAM floods: RSS grew round after round and was
    not returned; 554,000 log lines. The flood here is paced at a rate the
    server absorbs (5,000 pairs a second; 500 under sanitizers): gRPC
    1.51 (Debian 12) queues every reset stream's call until the server
    has taken it (CVE-2023-44487, fixed in gRPC 1.57), so a faster flood
    grows memory with its rate and length, and delays other calls, which
    no code in the process can prevent (README, "Hostile clients"). What
    is asserted at this rate: the service, the log volume, the peak, and
    that the memory comes back. Under sanitizers the queue of reset calls
    once held a legitimate call's last batch past the fixture's 2 s
    --idle-timeout (a DEADLINE_EXCEEDED after all its bytes were sent), so
    there the window is 6 s: what is asserted is that it is served. At
    2,000 pairs a second an ASan server on a machine loaded by other work
    fell behind (peak 778 MiB, a legitimate call past its 10 s
    deadline), and at 1,000 too at load 6-8 (2 of 6 runs failed so; the
    others served the legitimate client 1-6 calls in the window, against
    33-76 at 500)."""
    import h2.errors
    sanitized = bool(os.environ.get("CG_SANITIZED"))
    rate = 500 if sanitized else 5000

    def attack(srv, stop):
        pairs, t0 = 0, time.monotonic()
        c = H2(srv.port)
        while not stop.is_set() and not c.closed:
            try:
                for _ in range(100):
                    sid = c.open("/convgrad.v1.ConvGrad/Compute")
                    c.conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
                    pairs += 1
                c.flush()
            except Exception:
                break
            c.pump()
            ahead = pairs / rate - (time.monotonic() - t0)
            if ahead > 0:
                stop.wait(ahead)
        c.close()
        return {"pairs": pairs}

    return dos_run(ctx, "rapid_reset", attack, ctx.args.seconds or 5,
                   extra=("--idle-timeout", "6") if sanitized else ())


def gzip_bomb(inflated):
    import zlib
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    zero = bytes(MiB)
    parts = [z.compress(zero) for _ in range(inflated // MiB)]
    parts.append(z.flush())
    return b"".join(parts)


def attack_gzip_bomb(ctx):
    """A ~1 MB gzip message that inflates to 1 GiB was inflated whole
    before any limit applied."""
    bomb = gzip_bomb(1 << 30)

    def attack(srv, stop):
        codes = []
        for _ in range(2):
            c = H2(srv.port)
            sid = c.open("/convgrad.v1.ConvGrad/Compute",
                         [("grpc-encoding", "gzip"),
                          ("grpc-accept-encoding", "identity,gzip")])
            data = grpc_frame(bomb, compressed=True)
            off = 0
            while off < len(data) and not c.closed and sid not in c.ended:
                window = c.conn.local_flow_control_window(sid)
                n = min(window, 16384, len(data) - off)
                if n <= 0:
                    c.pump(0.1)
                    continue
                try:
                    c.conn.send_data(sid, data[off:off + n],
                                     end_stream=off + n == len(data))
                except Exception:  # the server ended the stream
                    break
                off += n
                c.flush()
                c.pump()
            t = c.wait_end(sid, 20)
            codes.append(t.get("grpc-status") if t else "reset")
            c.close()
        stop.wait()
        return {"bomb bytes": len(bomb), "statuses": "/".join(codes)}

    def check(srv, result):
        # Refused at its headers: grpc never inflates it.
        assert result["statuses"] == "12/12", result

    return dos_run(ctx, "gzip_bomb", attack, 4, check=check)


def attack_idle_memory(ctx):
    """Item 6: with --max-inflight-bytes 300M, f16 calls left the server at
    its peak when idle: the workers' engine buffers (f16 runs through f32
    copies) were never freed. Idle, the server must give back what the
    calls took."""
    srv = ctx.server("idle_memory", ["--max-inflight-bytes", "300M",
                                     "--keep-warm", "0"])
    pb = ctx.pb
    import numpy as np
    try:
        ch = ctx.grpc.insecure_channel("127.0.0.1:%d" % srv.port)
        compute = ch.stream_stream(
            "/convgrad.v1.ConvGrad/Compute",
            request_serializer=pb.ComputeRequest.SerializeToString,
            response_deserializer=pb.ComputeResponse.FromString)
        n, c, hw = 16, 128, 56
        dy = np.ones((n, c, hw, hw), np.float16).tobytes()

        def call(weights):
            a = pb.Attributes(strides=[1, 1], pads_begin=[1, 1],
                              pads_end=[1, 1], dilations=[1, 1], groups=1,
                              data_format=pb.NCX, weights_format=pb.OIX)
            if weights:
                a.weights_shape.extend([c, c, 3, 3])
                h = pb.ComputeHeader(op=pb.CONVOLUTION_BACKWARD_WEIGHTS,
                                     attrs=a)
                shapes, data = [[n, c, hw, hw]] * 2, [dy, dy]
            else:
                a.dst_shape.extend([n, c, hw, hw])
                h = pb.ComputeHeader(op=pb.CONVOLUTION_BACKWARD_DATA, attrs=a)
                shapes = [[n, c, hw, hw], [c, c, 3, 3]]
                data = [dy, bytes(c * c * 9 * 2)]
            for s in shapes:
                h.inputs.add(dtype=pb.F16, shape=s)
            msgs = [pb.ComputeRequest(header=h)] + [
                pb.ComputeRequest(chunk=pb.DataChunk(
                    input=i, data=d[o:o + MiB]))
                for i, d in enumerate(data) for o in range(0, len(d), MiB)]
            for _ in compute(iter(msgs), timeout=120):
                pass

        before = srv.rss_mib()
        watch = Watch(srv)
        threads = [threading.Thread(target=lambda k=k: [
            call(k % 2) for _ in range(3)]) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        peak = watch.done()
        ch.close()
        idle = peak
        # Up to 12 s: workers release after 1 s idle. Under sanitizers the
        # idle RSS is reported, not bounded: read for 1.2 s, past that second.
        sanitized = bool(os.environ.get("CG_SANITIZED"))
        for _ in range(12 if sanitized else 120):
            time.sleep(0.1)
            idle = srv.rss_mib()
            if idle < before + 64:
                break
    finally:
        assert srv.stop() == 0
    fig = "RSS %.0f -> peak %.0f -> idle %.0f MiB" % (before, peak, idle)
    if not sanitized:
        assert peak < 300 + 256, fig
        assert idle < before + 96, fig
    return fig


# ---- the store of staged tensors (issue 38) -----------------------------

TOKENS = {"tenant-a": "tok-a-0123456789abcdef", "tenant-b": "tok-b-0123456789abcdef"}


class Stager:
    """A Stage and Compute client over grpcio with a token (or none)."""

    def __init__(self, ctx, port, label=None):
        self.ctx, self.pb = ctx, ctx.pb
        self.ch = ctx.grpc.insecure_channel("127.0.0.1:%d" % port)
        self.md = (("authorization", "Bearer " + TOKENS[label]),) \
            if label else ()
        self.stage_rpc = self.ch.stream_unary(
            "/convgrad.v1.ConvGrad/Stage",
            request_serializer=self.pb.StageRequest.SerializeToString,
            response_deserializer=self.pb.StageResponse.FromString)
        self.compute = self.ch.stream_stream(
            "/convgrad.v1.ConvGrad/Compute",
            request_serializer=self.pb.ComputeRequest.SerializeToString,
            response_deserializer=self.pb.ComputeResponse.FromString)

    def stage(self, data, sha=None, chunk=65536, private=False):
        """Header and every chunk at once (a client that does not wait for
        the server's answer to its header). Returns the StageResponse."""
        import hashlib
        pb = self.pb
        sha = sha or hashlib.sha256(data).digest()
        msgs = [pb.StageRequest(header=pb.StageHeader(
            sha256=sha, byte_size=len(data), private_id=private))]
        msgs += [pb.StageRequest(chunk=pb.DataChunk(data=data[i:i + chunk]))
                 for i in range(0, len(data), chunk)]
        return self.stage_rpc(iter(msgs), metadata=self.md, timeout=10)

    def code_of(self, fn, *args):
        try:
            fn(*args)
        except self.ctx.grpc.RpcError as e:
            return e.code(), e.details(), dict(e.trailing_metadata() or ())
        return self.ctx.grpc.StatusCode.OK, "", {}

    def layer(self, src, dy, w, staged=(), slow_s=0.0, private=None):
        """ConvolutionBackward (3x3, pad 1) of src, dy, w; the inputs whose
        index is in staged go by their SHA-256, those in private (index:
        id) by a private id, the others as bytes (dy after slow_s
        seconds). Returns the outputs by name."""
        private = private or {}
        staged = tuple(staged) + tuple(private)
        import hashlib
        pb, np = self.pb, __import__("numpy")
        h = pb.ComputeHeader(op=pb.CONVOLUTION_BACKWARD, attrs=pb.Attributes(
            pads_begin=[1, 1], pads_end=[1, 1], data_format=pb.NCX,
            weights_format=pb.OIX))
        for i, t in enumerate((src, dy, w)):
            if i in private:
                h.inputs.add(dtype=pb.F32, shape=t.shape, staged=pb.StagedRef(
                    sha256=private[i], private_id=True))
            elif i in staged:
                h.inputs.add(dtype=pb.F32, shape=t.shape, staged=pb.StagedRef(
                    sha256=hashlib.sha256(t.tobytes()).digest()))
            else:
                h.inputs.add(dtype=pb.F32, shape=t.shape)

        def messages():
            yield pb.ComputeRequest(header=h)
            time.sleep(slow_s)
            for i, t in enumerate((src, dy, w)):
                if i not in staged:
                    yield pb.ComputeRequest(chunk=pb.DataChunk(
                        input=i, data=t.tobytes()))
        out, cur = {}, None
        for r in self.compute(messages(), metadata=self.md, timeout=30):
            if r.HasField("header"):
                cur = pb.Output.Name(r.header.output)
                out[cur] = bytearray(r.header.data)
            else:
                out[cur] += r.chunk
        return {k: np.frombuffer(bytes(v), np.float32) for k, v in out.items()}

    def close(self):
        self.ch.close()


def layer_tensors(seed):
    import numpy as np
    rng = np.random.default_rng(seed)
    src = rng.standard_normal((2, 8, 12, 12)).astype(np.float32)
    dy = rng.standard_normal((2, 16, 12, 12)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    return src, dy, w


def attack_store_scopes(ctx):
    """Ids of other tenants: tenant b names tenant a's staged weights by
    their hash and gets NOT_FOUND (no existence leak: its own Stage of the
    same content is an upload, not 'present'); a Stage whose bytes do not
    hash to its id stores nothing; a tenant filling the store stays within
    its share and evicts only its own entries."""
    import hashlib
    tokens = os.path.join(ctx.workdir, "store-tokens")
    with open(tokens, "w") as f:
        for label, tok in TOKENS.items():
            f.write("%s %s\n" % (tok, label))
    srv = ctx.server("store_scopes", [
        "--auth-tokens", tokens, "--store-bytes", "1M",
        "--store-peer-share", "50"])
    a = Stager(ctx, srv.port, "tenant-a")
    b = Stager(ctx, srv.port, "tenant-b")
    grpc = ctx.grpc
    try:
        src, dy, w = layer_tensors(5)
        assert not a.stage(w.tobytes()).present
        assert a.stage(w.tobytes()).present
        ref = a.layer(src, dy, w)
        got = a.layer(src, dy, w, staged=(2,))
        for k in ref:
            assert (ref[k] == got[k]).all(), k
        code, msg, trailers = b.code_of(b.layer, src, dy, w, (2,))
        assert code == grpc.StatusCode.NOT_FOUND, (code, msg)
        assert trailers.get("convgrad-missing-staged") == \
            hashlib.sha256(w.tobytes()).hexdigest(), trailers
        assert not b.stage(w.tobytes()).present
        # A forged id: nothing is listed under it.
        forged = hashlib.sha256(b"other bytes").digest()
        code, msg, _ = b.code_of(b.stage, dy.tobytes(), forged)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "hash to" in msg, \
            (code, msg)
        assert not b.stage(b"other bytes").present
        # Filling: b stages 2 MiB in 64 KiB entries against a 512 KiB share.
        blobs = [os.urandom(65536) for _ in range(32)]
        for blob in blobs:
            b.stage(blob)
        assert a.stage(w.tobytes()).present, "a's entry was evicted"
        # Its share (1 MiB / 100 * 50 bytes) holds 7 of them: the newest.
        present = [b.stage(blob).present for blob in reversed(blobs[-8:])]
        assert present == [True] * 7 + [False], present
        code, msg, _ = b.code_of(b.stage, os.urandom(600 * 1024))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and \
            "--store-peer-share" in msg, (code, msg)
        info = [ln for ln in srv.log_lines() if "stage id=" in ln]
        assert info, "no stage log lines"
    finally:
        a.close()
        b.close()
        assert srv.stop() == 0
    return "other tenant NOT_FOUND, forged id refused, filler kept to its share"


def attack_store_private(ctx):
    """Private ids (StageHeader.private_id), which the server takes
    without hashing the bytes: another tenant naming a's private id gets
    NOT_FOUND, as a private or a content id, and its own private upload
    under that id is its own entry (a's calls still compute with a's
    bytes); a private upload under a content id (the SHA-256 of a's
    weights) is no content entry: a content Stage of the weights uploads
    them, and a call naming the content id computes with them."""
    import hashlib
    tokens = os.path.join(ctx.workdir, "private-tokens")
    with open(tokens, "w") as f:
        for label, tok in TOKENS.items():
            f.write("%s %s\n" % (tok, label))
    srv = ctx.server("store_private", ["--auth-tokens", tokens])
    a = Stager(ctx, srv.port, "tenant-a")
    b = Stager(ctx, srv.port, "tenant-b")
    grpc = ctx.grpc
    try:
        src, dy, w = layer_tensors(7)
        pid = os.urandom(32)
        assert not a.stage(src.tobytes(), pid, private=True).present
        ref = a.layer(src, dy, w)

        def a_same(**kw):
            got = a.layer(src, dy, w, **kw)
            for k in ref:
                assert (ref[k] == got[k]).all(), (k, kw)
        a_same(private={0: pid})
        for kw in (dict(private={0: pid}), dict(staged=(0,))):
            code, msg, trailers = b.code_of(
                lambda: b.layer(src, dy, w, **kw))
            assert code == grpc.StatusCode.NOT_FOUND, (code, msg, kw)
        code, msg, _ = a.code_of(lambda: a.layer(src, dy, w, staged=(0,)))
        assert code == grpc.StatusCode.NOT_FOUND, (code, msg)
        garbage = os.urandom(src.nbytes)
        assert not b.stage(garbage, pid, private=True).present
        a_same(private={0: pid})
        # Within a's own scope: bytes under the id of its weights' content.
        wid = hashlib.sha256(w.tobytes()).digest()
        assert not a.stage(os.urandom(w.nbytes), wid, private=True).present
        assert not a.stage(w.tobytes()).present, "private entry answered"
        a_same(staged=(2,))
        a_same(private={0: pid}, staged=(2,))
    finally:
        a.close()
        b.close()
        assert srv.stop() == 0
    return "private ids: other tenant NOT_FOUND, no poisoning either way"


def attack_store_expiry(ctx):
    """Expiry in the middle of a call: a call holding a staged tensor while
    its diff_dst trickles in past --store-ttl and a sweep computes with the
    right bytes; the next call naming it gets NOT_FOUND with its id."""
    import hashlib
    srv = ctx.server("store_expiry", ["--store-ttl", "1"])
    st = Stager(ctx, srv.port)
    try:
        src, dy, w = layer_tensors(6)
        ref = st.layer(src, dy, w)
        st.stage(w.tobytes())
        st.stage(src.tobytes())
        got = st.layer(src, dy, w, staged=(0, 2), slow_s=3.5)
        for k in ref:
            assert (ref[k] == got[k]).all(), k
        code, msg, trailers = st.code_of(st.layer, src, dy, w, (0, 2))
        assert code == ctx.grpc.StatusCode.NOT_FOUND, (code, msg)
        want = {hashlib.sha256(t.tobytes()).hexdigest() for t in (src, w)}
        assert set(trailers["convgrad-missing-staged"].split(",")) == want, \
            trailers
    finally:
        st.close()
        assert srv.stop() == 0
    return "held entry outlived its expiry; the next call NOT_FOUND with ids"


ATTACKS = {
    "shapes": attack_shapes,
    "log_injection": attack_log_injection,
    "slowloris": attack_slowloris,
    "trickle": attack_trickle,
    "header_only": attack_header_only,
    "rapid_reset": attack_rapid_reset,
    "gzip_bomb": attack_gzip_bomb,
    "idle_memory": attack_idle_memory,
    "store_scopes": attack_store_scopes,
    "store_private": attack_store_private,
    "store_expiry": attack_store_expiry,
}


class Context:
    def __init__(self, args, grpc, pb, workdir):
        self.args, self.grpc, self.pb, self.workdir = args, grpc, pb, workdir

    def server(self, name, extra):
        return Server(self.args.server, self.workdir, name, extra)


def main():
    ap = common_args(__doc__)
    ap.add_argument("--only", default="")
    ap.add_argument("--seconds", type=float, default=0,
                    help="run the floods this long (default: briefly)")
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
