#!/usr/bin/python3
"""bench_pool.py - issue 36's figures: one call over a pool of replicas.

Replicas are convgrad-server processes on loopback, each with one worker
pinned to a core of its own (--cpus, static threads: parts compute alike
on both); the client is this process, through the Python package with
Client(replicas=N). The layer is ResNet-50's res2a (3x3 64->64, 56x56,
batch 8, f32, NCX/OIX). Rounds are interleaved and figures are medians.

  split_ratio                     the layer split over 2 replicas / on 1
  split_deterministic             3 split calls give the same bits (yes/no)
  straggler_p99_over_p50          replica 1 held to a 20% CPU quota
                                  (cgroup): p99 / p50 of the layer call,
                                  hedging on (default budget 5%)
  straggler_p99_over_p50_unhedged the same with hedge_budget=0
  hedges_straggler_pct            backups sent per 100 parts, straggler run
  quiet_p99_over_p50              p99 / p50 with no straggler: the noise
  hedges_quiet_pct                the same with no straggler (the budget
                                  counts the channel's life, the 10 calls
                                  before the measured ones included)
  kill_failed_steps               20 steps of ResNet-18 layer calls (its
                                  six 3x3 shapes at batch 8) over 2
                                  replicas, replica 1 killed with SIGKILL
                                  at step 10: steps that failed
  kill_gradients_equal            every step's gradients equal (bitwise)
                                  those of a run without the kill (yes/no)
  warm_first_over_repeat          first call of a shape a server warmed
                                  (--warmup) / the median of its repeats
                                  (the client connected first); median of
                                  3 fresh servers
  cold_first_over_repeat          the same without --warmup, for scale

    /usr/bin/python3 tests/bench/bench_pool.py --build build

Without root (no cgroup) the straggler figures are skipped with a line that
says so. Not the off-host rig of issue 38 (tests/net/rig.sh makes one
trainer and one server namespace): loopback, so the link is not measured
here. Figures, not a test: nothing is asserted."""
import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

import numpy as np  # noqa: E402

convgrad = None  # imported by main(), once CONVGRAD_LIBRARY is set

RES2A = (8, 64, 56, 64, 3)  # mb, ic, spatial, oc, kernel
# ResNet-18's 3x3 layers at 224x224, batch 8 (stride 1 rows).
RESNET18 = [(8, 64, 56, 64, 3), (8, 128, 28, 128, 3), (8, 256, 14, 256, 3),
            (8, 512, 7, 512, 3)]
CGROUP = "/sys/fs/cgroup/cpu"


class Server:
    """A convgrad-server with one worker on core cpu."""

    def __init__(self, build, cpu, extra=()):
        self.proc = subprocess.Popen(
            ["taskset", "-c", str(cpu),
             os.path.join(build, "server", "convgrad-server"), "--listen",
             "127.0.0.1:0", "--workers", "1", "--threads-policy", "static",
             "--cpus", str(cpu)] + list(extra),
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"listen=127\.0\.0\.1:(\d+)", line)
        if not m:
            self.proc.kill()
            raise SystemExit("server did not get ready: %r" % line)
        self.target = "127.0.0.1:%d" % int(m.group(1))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


class Quota:
    """A cgroup v1 cpu quota of pct percent of one core on pid (its
    threads), removed again by close()."""

    def __init__(self, pid, pct):
        self.path = os.path.join(CGROUP, "cgpool-%d" % os.getpid())
        os.mkdir(self.path)
        with open(os.path.join(self.path, "cpu.cfs_period_us"), "w") as f:
            f.write("100000")
        with open(os.path.join(self.path, "cpu.cfs_quota_us"), "w") as f:
            f.write(str(1000 * pct))
        self.tids = os.listdir("/proc/%d/task" % pid)
        for tid in self.tids:
            with open(os.path.join(self.path, "tasks"), "w") as f:
                f.write(tid)

    def close(self):
        for tid in self.tids:
            try:
                with open(os.path.join(CGROUP, "tasks"), "w") as f:
                    f.write(tid)
            except OSError:
                pass  # ended meanwhile
        os.rmdir(self.path)


def layer(shape, seed):
    mb, ic, sp, oc, k = shape
    rng = np.random.default_rng(seed)
    src = rng.standard_normal((mb, ic, sp, sp), dtype=np.float32)
    dd = rng.standard_normal((mb, oc, sp, sp), dtype=np.float32)
    w = rng.standard_normal((oc, ic, k, k), dtype=np.float32)
    return src, dd, w


def call(c, tensors):
    src, dd, w = tensors
    p = tensors[2].shape[2] // 2
    return c.conv_backward(src, dd, w, data_format="NCX",
                           weights_format="OIX", pads_begin=[p, p],
                           pads_end=[p, p], with_result=True)


def timed(c, tensors):
    t0 = time.perf_counter()
    out, res = call(c, tensors)
    return (time.perf_counter() - t0) * 1e3, out, res


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(q / 100.0 * (len(v) - 1))))]


def split_figures(build, rounds):
    a, b = Server(build, 0), Server(build, 1)
    try:
        one = convgrad.Client(a.target)
        two = convgrad.Client(a.target + "," + b.target, replicas=2)
        t = layer(RES2A, 1)
        for _ in range(3):  # kernels and speeds known on both
            call(one, t)
            call(two, t)
        ratios, outs = [], []
        for _ in range(rounds):
            m1, _, _ = timed(one, t)
            m2, out, res = timed(two, t)
            ratios.append(m2 / m1)
            if len(outs) < 3:
                outs.append(out)
        print("split_parts: %s" % res.worker)
        print("split_ratio: %.3f" % statistics.median(ratios))
        same = all(np.array_equal(outs[0][g], o[g]) for o in outs[1:]
                   for g in outs[0])
        print("split_deterministic: %s" % ("yes" if same else "no"))
        one.close()
        two.close()
    finally:
        a.stop()
        b.stop()


def straggler_run(build, calls, hedge_budget, quota):
    """p99/p50 and backups per 100 parts of calls layer calls over two
    replicas, replica 1 at quota percent (None: no quota)."""
    a, b = Server(build, 0), Server(build, 1)
    q = None
    try:
        c = convgrad.Client(a.target + "," + b.target, replicas=2,
                            hedge_budget=hedge_budget)
        t = layer(RES2A, 2)
        for _ in range(10):  # the shape's latencies, before the quota
            call(c, t)
        if quota:
            q = Quota(b.proc.pid, quota)
        ms, extra, parts = [], 0, 0
        for _ in range(calls):
            m, _, res = timed(c, t)
            ms.append(m)
            extra += res.attempts - 1
            parts += int(res.worker.split()[0]) if "parts" in res.worker else 1
        c.close()
        return pct(ms, 99) / pct(ms, 50), 100.0 * extra / parts
    finally:
        if q:
            q.close()
        a.stop()
        b.stop()


def kill_run(build, steps, kill_at):
    """Per-step gradients of steps x the ResNet-18 layers over 2 replicas,
    replica 1 killed with SIGKILL before step kill_at (None: never), and
    the steps that failed."""
    a, b = Server(build, 0), Server(build, 1)
    try:
        c = convgrad.Client(a.target + "," + b.target, replicas=2)
        layers = [layer(s, 10 + i) for i, s in enumerate(RESNET18)]
        grads, failed = [], 0
        for step in range(steps):
            if step == kill_at:
                b.proc.send_signal(signal.SIGKILL)
            try:
                grads.append([call(c, t)[0] for t in layers])
            except convgrad.Error:
                failed += 1
                grads.append(None)
        c.close()
        return grads, failed
    finally:
        a.stop()
        b.stop()


def warm_figure(build, warm, reps, starts=3):
    """First call of res2a on a fresh server / the median of its repeats,
    the median over starts fresh servers."""
    ratios = []
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write("mb8ic64ih56oc64oh56kh3ph1 data_format=NCX "
                "weights_format=OIX\n")
        f.flush()
        for _ in range(starts):
            s = Server(build, 0, ["--warmup", f.name] if warm else [])
            try:
                c = convgrad.Client(s.target)
                c.health()  # connected, as a trainer's client is by then
                t = layer(RES2A, 3)
                first, _, _ = timed(c, t)
                rest = [timed(c, t)[0] for _ in range(reps)]
                c.close()
                ratios.append(first / statistics.median(rest))
            finally:
                s.stop()
    return statistics.median(ratios)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=100)
    args = ap.parse_args()
    os.environ.setdefault("CONVGRAD_LIBRARY", os.path.join(
        args.build, "client", "libcgclient.so"))
    global convgrad
    import convgrad
    probe = Server(args.build, 0)
    info = convgrad.Client(probe.target).info()
    probe.stop()
    print("machine: %d cpus, isa %s, oneDNN %s; replicas on cores 0 and 1, "
          "one worker each" % (os.cpu_count(), info["cpu_isa"],
                               info["onednn_version"]))
    split_figures(args.build, args.rounds)
    if os.geteuid() == 0 and os.path.isdir(CGROUP):
        for budget, name in ((0.05, ""), (0.0, "_unhedged")):
            ratio, hedges = straggler_run(args.build, args.calls, budget, 20)
            print("straggler_p99_over_p50%s: %.3f" % (name, ratio))
            if budget:
                print("hedges_straggler_pct: %.2f" % hedges)
    else:
        print("straggler: skipped (needs root and cgroup v1's %s)" % CGROUP)
    ratio, quiet = straggler_run(args.build, args.calls, 0.05, None)
    print("quiet_p99_over_p50: %.3f" % ratio)
    print("hedges_quiet_pct: %.2f" % quiet)
    want, _ = kill_run(args.build, 20, None)
    got, failed = kill_run(args.build, 20, 10)
    equal = all(g is not None and all(
        np.array_equal(w[i][k], g[i][k]) for i in range(len(w))
        for k in w[i]) for w, g in zip(want, got))
    print("kill_failed_steps: %d" % failed)
    print("kill_gradients_equal: %s" % ("yes" if equal else "no"))
    print("warm_first_over_repeat: %.3f" % warm_figure(args.build, True, 9))
    print("cold_first_over_repeat: %.3f" % warm_figure(args.build, False, 9))


if __name__ == "__main__":
    main()
