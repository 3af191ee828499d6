#!/usr/bin/python3
"""test_server_crash.py - the crash report (server/crash.c): a fatal signal
in any thread of a real convgrad-server writes one log record and kills the
process with that signal.

Each case starts a server, sends one signal to one of its threads with
tgkill (what a kernel fault would raise there) and checks:
- the process ended by that very signal (what a supervisor sees);
- stderr holds exactly one `error crash` record naming the signal, how it
  was sent, the thread, and, for a worker busy with a call, that call's id,
  peer, op, dtype, shapes and attributes; for any other thread `job=none`.
Cases: SIGSEGV to a worker while it computes a ConvolutionBackwardWeights;
SIGILL to an idle worker; SIGFPE to the completion-queue thread; SIGBUS to
the loop thread after a region's registration has installed the
shared-memory SIGBUS guard, which must hand on a fault outside its regions
(test_server_shm checks what the guard does inside them). Exits 77 (ctest
skip) when no stub generator is installed."""
import ctypes
import os
import re
import signal
import struct
import sys
import threading
import time

from test_server_python import common_args, prepare_stubs, start_server

SYS_TGKILL = 234  # x86_64


def thread_named(pid, name):
    """The id of the process's oldest thread called name (a thread names
    itself once running: wait up to 10 s)."""
    deadline = time.time() + 10
    while time.time() < deadline:
        for tid in sorted(int(t) for t in os.listdir("/proc/%d/task" % pid)):
            try:
                with open("/proc/%d/task/%d/comm" % (pid, tid)) as f:
                    if f.read().strip() == name:
                        return tid
            except FileNotFoundError:
                pass
        time.sleep(0.01)
    raise AssertionError("no thread %s in %d" % (name, pid))


def tgkill(pid, tid, sig):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_TGKILL, pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")


def wait_for(path, pattern, seconds):
    """The first line of file path that matches pattern, within seconds."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        with open(path) as f:
            for line in f:
                if re.search(pattern, line):
                    return line
        time.sleep(0.01)
    raise AssertionError("no line matching %r in %s" % (pattern, path))


def expect_crash(proc, log_path, sig, thread, want):
    """proc must die of sig, leaving one crash record on thread that
    matches every pattern of want."""
    try:
        rc = proc.wait(timeout=30)
    except Exception:
        proc.kill()
        raise
    assert rc == -sig, "exit %r, expected death by %s" % (
        rc, signal.Signals(sig).name)
    with open(log_path) as f:
        records = [line for line in f if " error crash " in line]
    assert len(records) == 1, records
    rec = records[0]
    for pattern in [r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z error crash "
                    r"signal=%s code=SI_TKILL sender_pid=%d " % (
                        signal.Signals(sig).name, os.getpid()),
                    r" thread=%s tid=\d+ " % re.escape(thread)] + want:
        assert re.search(pattern, rec), (pattern, rec)
    return rec


def main():
    args = common_args(__doc__).parse_args()
    out = prepare_stubs(args.proto, args.workdir, "cgs-crash-")
    if not out:
        return 77
    import grpc
    from convgrad.v1 import convgrad_pb2 as pb

    started = []

    def server(case, extra=()):
        path = os.path.join(out, "crash-%s.log" % case)
        log = open(path, "w")
        proc, port = start_server(args.server, log,
                                  ["--workers", "1", "--log-level", "debug",
                                   "--max-request-flops", "0"] + list(extra))
        log.close()
        started.append(proc)
        return proc, port, path

    try:
        return cases(grpc, pb, server)
    finally:
        # A case that failed before its signal leaves its server up.
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def cases(grpc, pb, server):
    """The four cases; server(case) starts a server for one."""

    # A worker computing: a ConvolutionBackwardWeights of several GFLOP.
    proc, port, path = server("worker")
    ch = grpc.insecure_channel("127.0.0.1:%d" % port)
    compute = ch.stream_stream("/convgrad.v1.ConvGrad/Compute",
                               request_serializer=lambda m: m,
                               response_deserializer=lambda m: m)
    src = [8, 64, 96, 96]
    attrs = pb.Attributes(data_format=pb.NCX, weights_format=pb.OIX,
                          weights_shape=[64, 64, 7, 7], pads_begin=[3, 3],
                          pads_end=[3, 3], strides=[1, 1], dilations=[1, 1])
    header = pb.ComputeHeader(op=pb.CONVOLUTION_BACKWARD_WEIGHTS, attrs=attrs)
    nbytes = 4 * src[0] * src[1] * src[2] * src[3]
    for _ in range(2):
        header.inputs.add(dtype=pb.F32, shape=src)
    msgs = [pb.ComputeRequest(header=header).SerializeToString()]
    for i in range(2):
        for off in range(0, nbytes, 1 << 20):
            msgs.append(pb.ComputeRequest(chunk=pb.DataChunk(
                input=i, data=struct.pack("<f", 0.5) * ((1 << 20) // 4)))
                .SerializeToString())
    ended = []

    def call():
        try:
            for _ in compute(iter(msgs), timeout=60):
                pass
            ended.append("OK")
        except grpc.RpcError as e:
            ended.append(e.code().name)

    t = threading.Thread(target=call)
    t.start()
    wait_for(path, r"cg-worker-0 runs a job", 60)
    tgkill(proc.pid, thread_named(proc.pid, "cg-worker-0"),
           signal.SIGSEGV)
    rec = expect_crash(proc, path, signal.SIGSEGV, "cg-worker-0", [
        r" job: compute id=1 peer=ipv4:127\.0\.0\.1:\d+ "
        r"op=ConvolutionBackwardWeights dtype=f32 "
        r"in=8x64x96x96,8x64x96x96 out=64x64x7x7 groups=1 strides=1,1 "
        r"dilations=1,1 pads_begin=3,3 pads_end=3,3 output_padding=0,0 "
        r"data_format=NCX weights_format=OIX\n$"])
    t.join(60)
    ch.close()
    assert ended and ended[0] != "OK", ended
    print("SIGSEGV in a busy worker: %s" % rec.strip())

    # An idle worker.
    proc, port, path = server("idle")
    tgkill(proc.pid, thread_named(proc.pid, "cg-worker-0"),
           signal.SIGILL)
    rec = expect_crash(proc, path, signal.SIGILL, "cg-worker-0",
                       [r" job=none\n$"])
    print("SIGILL in an idle worker: %s" % rec.strip())

    # The completion-queue thread.
    proc, port, path = server("cq")
    tgkill(proc.pid, thread_named(proc.pid, "cg-cq"), signal.SIGFPE)
    rec = expect_crash(proc, path, signal.SIGFPE, "cg-cq", [r" job=none\n$"])
    print("SIGFPE in the completion-queue thread: %s" % rec.strip())

    # The loop thread, with the regions' SIGBUS guard installed.
    key = "/convgrad-test-crash-%d" % os.getpid()
    fd = os.open("/dev/shm" + key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 4096)
        proc, port, path = server("bus")
        ch = grpc.insecure_channel("127.0.0.1:%d" % port)
        register = ch.unary_unary(
            "/convgrad.v1.ConvGrad/RegisterRegion",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.RegisterRegionResponse.FromString)
        register(pb.RegisterRegionRequest(name="r", key=key, offset=0,
                                          byte_size=4096), timeout=10)
        ch.close()
        tgkill(proc.pid, proc.pid, signal.SIGBUS)
        rec = expect_crash(proc, path, signal.SIGBUS, "convgrad-server",
                           [r" job=none\n$"])
    finally:
        os.close(fd)
        os.unlink("/dev/shm" + key)
    print("SIGBUS in the loop thread past the region guard: %s" %
          rec.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
