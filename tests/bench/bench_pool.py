#!/usr/bin/python3
"""bench_pool.py - issue 36's figures: one call over a pool of replicas.

Replicas are convgrad-server processes, each with one worker pinned to a
core of its own (--cpus, static threads: parts compute alike on both):
replica 0 on core 0, replica 1 on core 1. On the rig (tests/net/rig.sh
--replicas 2, as root, the default where one can be built; --rig asks for
it, --loopback not) each replica is in a network namespace and cgroup of
its own behind a switch, the trainer (this process, the client) in its
own, every link at --rate; the client runs on both cores (a machine of 2
cores has none left for it). Elsewhere: loopback. The client is the
Python package with Client(replicas=N). The layer is ResNet-50's res2a
(3x3 64->64, 56x56, batch 8, f32, NCX/OIX). Rounds are interleaved and
figures are medians; each figure's line is followed by the load average
when it was taken.

  split_ratio                     the layer split over 2 replicas / on 1
  split_deterministic             3 split calls give the same bits (yes/no)
  straggler_p99_over_p50          replica 1 held to a 20% CPU quota
                                  (cgroup): p99 / p50 of the layer call,
                                  hedging on (default budget 5%)
  straggler_p99_over_p50_unhedged the same with hedge_budget=0 (a client
                                  of its own, its calls interleaved)
  hedges_straggler_pct            backups sent per 100 parts, straggler run
  quiet_p99_over_p50              p99 / p50 with no straggler: the noise
  hedges_quiet_pct                the same with no straggler (the budget
                                  counts the channel's life, the 10 calls
                                  before the measured ones included)
  kill_failed_steps               20 steps of ResNet-18 layer calls (its
                                  six 3x3 shapes at batch 8) over 2
                                  replicas, replica 1 killed with SIGKILL
                                  at step 10: steps that failed (the cut
                                  fixed at 4 parts, split_parts=4: left
                                  to the channel, each run's first
                                  measurements choose it)
  kill_gradients_equal            every step's gradients equal (bitwise)
                                  those of a run without the kill (yes/no)
  warm_first_over_repeat          first call of a shape a server warmed
                                  (--warmup) / the median of its repeats,
                                  on a connection that has carried 3 calls
                                  of another shape (a 1x1 layer of the same
                                  tensors), as a trainer's has by then;
                                  median of 3 fresh servers
  warm_first_fresh_over_repeat    the same on a connection that carried
                                  only a health check: a connection's
                                  first large transfers are slow (TCP and
                                  HTTP/2 windows growing), whatever the
                                  shape
  cold_first_over_repeat          the same without --warmup (connection
                                  used), for scale

    /usr/bin/python3 tests/bench/bench_pool.py --build build
    /usr/bin/python3 tests/bench/bench_pool.py --build build \
        --figures straggler,quiet      # the straggler's and the noise's only

Without root (no cgroup) the straggler figures are skipped with a line that
says so. Figures, not a test: nothing is asserted."""
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
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

import numpy as np  # noqa: E402

import cgtest  # noqa: E402

convgrad = None  # imported by main(), once CONVGRAD_LIBRARY is set

RES2A = (8, 64, 56, 64, 3)  # mb, ic, spatial, oc, kernel
# ResNet-18's 3x3 layers at 224x224, batch 8 (stride 1 rows).
RESNET18 = [(8, 64, 56, 64, 3), (8, 128, 28, 128, 3), (8, 256, 14, 256, 3),
            (8, 512, 7, 512, 3)]
CGROUP = "/sys/fs/cgroup/cpu"
# The groups of figures, in the order they are taken (--figures).
GROUPS = ("split", "straggler", "quiet", "kill", "warm")


def rig_side(replica):
    return "srv" if replica == 0 else "srv%d" % replica


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def figure(name, fmt, value):
    print(("%s: " + fmt) % (name, value))
    print("  load: %s" % load(), flush=True)


class Server:
    """A convgrad-server with one worker on core replica: on the rig in
    that replica's namespace, cgroup and core, else on loopback."""

    def __init__(self, build, replica, extra=()):
        if os.environ.get("CG_RIG"):
            prefix = cgtest.rig_server_prefix(rig_side(replica))
            host = os.environ["CG_RIG_SERVERS"].split(",")[replica]
        else:
            prefix, host = ["taskset", "-c", str(replica)], "127.0.0.1"
        self.proc = subprocess.Popen(
            prefix + [os.path.join(build, "server", "convgrad-server"),
                      "--listen", host + ":0", "--workers", "1",
                      "--threads-policy", "static", "--cpus", str(replica)] +
            list(extra), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"listen=%s:(\d+)" % re.escape(host), line)
        if not m:
            self.proc.kill()
            raise SystemExit("server did not get ready: %r" % line)
        self.target = "%s:%d" % (host, int(m.group(1)))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


class RigQuota:
    """The CPU quota of a rig's replica at pct percent of one core, set
    back to none by close()."""

    def __init__(self, replica, pct):
        self.side = rig_side(replica)
        self.set(str(pct))

    def set(self, pct):
        subprocess.run([cgtest.RIG, "quota", os.environ["CG_RIG"], self.side,
                        pct], check=True, stdout=subprocess.DEVNULL)

    def close(self):
        self.set("max")


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
        figure("split_ratio", "%.3f", statistics.median(ratios))
        same = all(np.array_equal(outs[0][g], o[g]) for o in outs[1:]
                   for g in outs[0])
        print("split_deterministic: %s" % ("yes" if same else "no"))
        one.close()
        two.close()
    finally:
        a.stop()
        b.stop()


def straggler_run(build, calls, budgets, quota):
    """p99/p50 and backups per 100 parts of calls layer calls over two
    replicas, replica 1 at quota percent (None: no quota), for each hedge
    budget of budgets: a client each, their calls interleaved."""
    a, b = Server(build, 0), Server(build, 1)
    q = None
    try:
        cs = [convgrad.Client(a.target + "," + b.target, replicas=2,
                              hedge_budget=budget) for budget in budgets]
        t = layer(RES2A, 2)
        for _ in range(10):  # the shape's latencies, before the quota
            for c in cs:
                call(c, t)
        if quota:
            q = RigQuota(1, quota) if os.environ.get("CG_RIG") else Quota(
                b.proc.pid, quota)
        ms = [[] for _ in cs]
        extra, parts = [0] * len(cs), [0] * len(cs)
        for _ in range(calls):
            for i, c in enumerate(cs):
                m, _, res = timed(c, t)
                ms[i].append(m)
                extra[i] += res.attempts - 1
                parts[i] += (int(res.worker.split()[0])
                             if "parts" in res.worker else 1)
        for c in cs:
            c.close()
        return [(pct(m, 99) / pct(m, 50), 100.0 * e / n)
                for m, e, n in zip(ms, extra, parts)]
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
        c = convgrad.Client(a.target + "," + b.target, replicas=2,
                            split_parts=4)
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


def warm_figure(build, warm, reps, used, starts=3):
    """First call of res2a on a fresh server / the median of its repeats,
    the median over starts fresh servers; used: the connection has
    carried a call of another shape first."""
    ratios = []
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write("mb8ic64ih56oc64oh56kh3ph1 data_format=NCX "
                "weights_format=OIX\n")
        f.flush()
        for _ in range(starts):
            s = Server(build, 0, ["--warmup", f.name] if warm else [])
            try:
                c = convgrad.Client(s.target)
                c.health()
                t = layer(RES2A, 3)
                one = list(t)
                one[2] = np.ascontiguousarray(t[2][:, :, :1, :1])
                for _ in range(3 if used else 0):
                    call(c, one)
                first, _, _ = timed(c, t)
                rest = [timed(c, t)[0] for _ in range(reps)]
                c.close()
                ratios.append(first / statistics.median(rest))
            finally:
                s.stop()
    return statistics.median(ratios)


def straggler_figures(build, calls):
    if os.geteuid() != 0 or not os.path.isdir(CGROUP):
        print("straggler: skipped (needs root and cgroup v1's %s)" % CGROUP)
        return
    (ratio, hedges), (unhedged, _) = straggler_run(build, calls, (0.05, 0.0),
                                                   20)
    figure("straggler_p99_over_p50", "%.3f", ratio)
    figure("straggler_p99_over_p50_unhedged", "%.3f", unhedged)
    figure("hedges_straggler_pct", "%.2f", hedges)


def quiet_figures(build, calls):
    [(ratio, quiet)] = straggler_run(build, calls, (0.05,), None)
    figure("quiet_p99_over_p50", "%.3f", ratio)
    figure("hedges_quiet_pct", "%.2f", quiet)


def kill_figures(build):
    want, _ = kill_run(build, 20, None)
    got, failed = kill_run(build, 20, 10)
    equal = all(g is not None and all(
        np.array_equal(w[i][k], g[i][k]) for i in range(len(w))
        for k in w[i]) for w, g in zip(want, got))
    print("kill_failed_steps: %d" % failed)
    print("kill_gradients_equal: %s" % ("yes" if equal else "no"))


def warm_figures(build):
    figure("warm_first_over_repeat", "%.3f",
           warm_figure(build, True, 9, True))
    figure("warm_first_fresh_over_repeat", "%.3f",
           warm_figure(build, True, 9, False))
    figure("cold_first_over_repeat", "%.3f",
           warm_figure(build, False, 9, True))


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=100)
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--rig", action="store_true",
                       help="on the rig, or fail (default: the rig where "
                       "one can be built, else loopback)")
    where.add_argument("--loopback", action="store_true")
    ap.add_argument("--rate", default="10gbit",
                    help="the rig's links (tc units; default 10gbit)")
    ap.add_argument("--figures", default=",".join(GROUPS),
                    help="the groups of figures to take, comma-separated "
                    "(default: all of %s)" % ",".join(GROUPS))
    args = ap.parse_args()
    groups = args.figures.split(",")
    if not groups or not set(groups) <= set(GROUPS):
        ap.error("--figures: groups of %s" % ",".join(GROUPS))
    if not args.loopback and not os.environ.get("CG_RIG"):
        rc = cgtest.rig_enter("bp", [
            "--replicas", "2", "--rate", args.rate, "--srv-cpus", "0",
            "--srv1-cpus", "1", "--srv-quota", "max", "--srv1-quota", "max"])
        if rc is not None and (rc != 77 or args.rig):
            sys.exit(rc)
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
    if os.environ.get("CG_RIG"):
        show = subprocess.run([cgtest.RIG, "show", os.environ["CG_RIG"]],
                              check=True, stdout=subprocess.PIPE, text=True)
        cfg = dict(line.split("=", 1) for line in show.stdout.split())
        print("ran on: rig %s: replicas %s behind a switch, links %s, "
              "replica cores %s and %s, trainer (client) cores %s, cgroup %s"
              % (os.environ["CG_RIG"], cfg["servers"], cfg["rate"],
                 cfg["srv_cpus"], cfg["srv1_cpus"], cfg["trn_cpus"],
                 cfg["cgroup"]))
    else:
        print("ran on: loopback, replicas on cores 0 and 1, the client on "
              "both")
    print("load: %s" % load())
    take = {"split": lambda: split_figures(args.build, args.rounds),
            "straggler": lambda: straggler_figures(args.build, args.calls),
            "quiet": lambda: quiet_figures(args.build, args.calls),
            "kill": lambda: kill_figures(args.build),
            "warm": lambda: warm_figures(args.build)}
    for group in GROUPS:
        if group in groups:
            take[group]()


if __name__ == "__main__":
    main()
