#!/usr/bin/python3
"""bench_fair.py - the fairness figure (issues 29 and 35): how much slower
a light client gets while heavy ones load the same server. The light
client has 1 call in flight over the unix socket (a peer of its own); the
heavy clients, by default issue 35's real work, 64 f32 backward-data calls
and 16 bf16 backward-weights calls of mb2ic32ih28oc32oh28kh3ph1 in flight
from two processes over TCP loopback. Each round measures the light
client's p50 alone on the idle server, then again while the heavy ones
run; the figure is the median over rounds of busy p50 / idle p50. Prints
figures, asserts nothing. Run it under flock /work/coord/bench.lock on a
shared machine.

Configurations, every one in each round (interleaved), each with a server
of its own:
  --server [NAME=]BIN  repeatable: builds to compare (before / after)
  --sessions LIST   shared: the server and every client in this script's
                    session, so the kernel shares the CPU between all
                    their threads one by one; own: each in a session of
                    its own, as a service and separately launched trainers
                    are (autogroups; cgroups do the same for units and
                    containers). Default shared,own.
  --cores LIST      shared: every process on every core; separate: the
                    server on the first core, the clients on the others
                    (a pool server's host). Default shared.

From the server's log (one line per call), for the light calls of each
window: where they spent their time (recv, queue, compute, send, total
ms), and the heavy calls' median compute_ms, whence the bound a
non-preemptive fair queue can keep: busy p50 <= idle p50 + 2 x the heavy
job's median compute (the job already running when the light one comes,
and one more).

Usage: bench_fair.py --server [NAME=]BIN [--server ...] --cli BIN [--rounds N]
           [--seconds S] [--light DESC] [--heavy CONC:DESC[:OP[:DTYPE]] ...]
           [--sessions shared,own] [--cores shared,separate]
           [--server-arg ARG ...]"""
import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HEAVY = ("64:mb2ic32ih28oc32oh28kh3ph1:ConvolutionBackwardData:f32",
         "16:mb2ic32ih28oc32oh28kh3ph1:ConvolutionBackwardWeights:bf16")
PHASES = ("recv_ms", "queue_ms", "compute_ms", "send_ms", "total_ms")
LINE = re.compile(r"^(\S+) info  compute id=\d+ peer=(\S+) .*? recv_ms=(\S+) "
                  r"queue_ms=(\S+) compute_ms=(\S+) send_ms=(\S+) "
                  r"total_ms=(\S+) .*status=OK")


def parse_heavy(spec):
    """CONC:DESC[:OP[:DTYPE]], or a bare DESC (64 in flight)."""
    parts = spec.split(":")
    if len(parts) == 1:
        parts = ["64"] + parts
    conc, desc = int(parts[0]), parts[1]
    op = parts[2] if len(parts) > 2 else "ConvolutionBackwardData"
    dtype = parts[3] if len(parts) > 3 else "f32"
    return conc, desc, op, dtype


def pinned(cpus, own_session):
    """Popen keywords: a session of its own or not, and a CPU mask."""
    kw = {"start_new_session": own_session}
    if cpus:
        kw["preexec_fn"] = lambda: os.sched_setaffinity(0, cpus)
    return kw


def bench(cli, target, load, seconds, place, warmup):
    """Starts `convgrad bench` with load (conc, desc, op, dtype) for
    seconds; returns the process."""
    conc, desc, op, dtype = load
    return subprocess.Popen(
        [cli, "bench", "--target", target, "--problem", desc, "--op", op,
         "--dtype", dtype, "--concurrency", str(conc), "--requests",
         "10000000", "--warmup", str(warmup), "--duration", str(seconds),
         "--deadline", "60000", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **place)


def result(proc):
    out, err = proc.communicate(timeout=600)
    if proc.returncode != 0 or not out.strip():
        raise SystemExit("convgrad bench failed (%d): %s" % (proc.returncode,
                                                             err.strip()))
    return json.loads(out)[0]


class Server:
    """One server of one configuration, its log in a file."""

    def __init__(self, binary, sessions, cores, extra, tmp, index):
        name, _, path = binary.rpartition("=")
        self.label = "%s sessions=%s cores=%s" % (name or "s%d" % index,
                                                  sessions, cores)
        self.own = sessions == "own"
        allcpu = sorted(os.sched_getaffinity(0))
        if cores == "separate" and len(allcpu) < 2:
            raise SystemExit("--cores separate needs two cores")
        self.server_cpus = allcpu[:1] if cores == "separate" else None
        self.client_cpus = allcpu[1:] if cores == "separate" else None
        sock = os.path.join(tmp, "s%d.sock" % index)
        self.log_path = os.path.join(tmp, "s%d.log" % index)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [path, "--listen", "127.0.0.1:0,unix:" + sock] + extra,
            stdout=subprocess.PIPE, stderr=self.log, text=True,
            **pinned(self.server_cpus, self.own))
        ready = self.proc.stdout.readline()
        m = re.search(r"listen=127\.0\.0\.1:(\d+)", ready)
        if not m:
            self.stop()
            raise SystemExit("server did not get ready: %r" % ready)
        self.ready = ready.strip()
        self.tcp, self.unix = "127.0.0.1:" + m.group(1), "unix:" + sock
        self.place = pinned(self.client_cpus, self.own)
        self.offset = 0  # of the log, read so far
        self.rows = []

    def calls(self):
        """The OK calls logged since the last read: (end time, light,
        {phase: ms})."""
        with open(self.log_path) as f:
            f.seek(self.offset)
            text = f.read()
        cut = text.rfind("\n") + 1
        self.offset += len(text[:cut].encode())
        out = []
        for line in text[:cut].splitlines():
            m = LINE.match(line)
            if m:
                t = datetime.datetime.fromisoformat(
                    m.group(1).replace("Z", "+00:00")).timestamp()
                out.append((t, m.group(2).startswith("unix"),
                            dict(zip(PHASES, map(float, m.groups()[2:])))))
        return out

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.log.close()


def in_window(calls, light, t0, t1):
    return [p for t, lt, p in calls if lt == light and t0 <= t <= t1]


def med(rows, key):
    vals = [r[key] for r in rows]
    return statistics.median(vals) if vals else float("nan")


def round_of(srv, args, heavy):
    """One idle and one busy window; returns the round's figures."""
    t0 = time.time()
    idle = result(bench(args.cli, srv.unix, (1, args.light,
                                             "ConvolutionBackwardData", "f32"),
                        args.seconds, srv.place, 20))
    t1 = time.time()
    hv = [bench(args.cli, srv.tcp, h, args.seconds + 2, srv.place, h[0])
          for h in heavy]
    time.sleep(1.0)  # their warm-up and first second
    t2 = time.time()
    busy = result(bench(args.cli, srv.unix, (1, args.light,
                                             "ConvolutionBackwardData", "f32"),
                        args.seconds, srv.place, 20))
    t3 = time.time()
    hres = [result(p) for p in hv]
    time.sleep(0.2)  # the log's last lines
    calls = srv.calls()
    li, lb = in_window(calls, True, t0, t1), in_window(calls, True, t2, t3)
    hb = in_window(calls, False, t2, t3)
    heavy_compute = med(hb, "compute_ms")
    return {
        "idle": idle["p50_ms"], "busy": busy["p50_ms"],
        "ratio": busy["p50_ms"] / idle["p50_ms"],
        "bound": idle["p50_ms"] + 2 * heavy_compute,
        "heavy_compute": heavy_compute,
        "heavy_rps": [h["requests_per_s"] for h in hres],
        "heavy_p50": [h["p50_ms"] for h in hres],
        "light_idle": {k: med(li, k) for k in PHASES},
        "light_busy": {k: med(lb, k) for k in PHASES},
        "load": os.getloadavg()[0],
    }


def phases(d):
    return " ".join("%s %.3f" % (k[:-3], d[k]) for k in PHASES)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--server", action="append", required=True)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--light", default="mb1ic4ih8oc4oh8kh3ph1")
    ap.add_argument("--heavy", action="append")
    ap.add_argument("--sessions", default="shared,own")
    ap.add_argument("--cores", default="shared")
    ap.add_argument("--server-arg", action="append", default=[])
    args = ap.parse_args()
    heavy = [parse_heavy(h) for h in (args.heavy or HEAVY)]
    sessions = args.sessions.split(",")
    cores = args.cores.split(",")
    for v, ok in ((sessions, ("shared", "own")),
                  (cores, ("shared", "separate"))):
        if not v or any(x not in ok for x in v):
            ap.error("expected a comma list of %s" % "|".join(ok))

    tmp = tempfile.mkdtemp(prefix="cg-fair-")
    servers = []
    try:
        for b in args.server:
            for s in sessions:
                for c in cores:
                    servers.append(Server(b, s, c, args.server_arg, tmp,
                                          len(servers)))
        print("light: %s, 1 in flight over the unix socket; heavy: %s over "
              "TCP loopback; %d rounds of %d s" % (
                  args.light, ", ".join("%d x %s %s %s" % h for h in heavy),
                  args.rounds, args.seconds))
        for srv in servers:
            print("%s: %s" % (srv.label, srv.ready))
        print("%5s %-34s %9s %9s %7s %9s %9s %5s  %s" % (
            "round", "configuration", "idle p50", "busy p50", "ratio",
            "bound", "hv cmp", "load", "heavy calls/s"))
        for r in range(args.rounds):
            for srv in servers:
                f = round_of(srv, args, heavy)
                srv.rows.append(f)
                print("%5d %-34s %9.3f %9.3f %7.2f %9.3f %9.3f %5.1f  %s" % (
                    r + 1, srv.label, f["idle"], f["busy"], f["ratio"],
                    f["bound"], f["heavy_compute"], f["load"],
                    " ".join("%.0f" % x for x in f["heavy_rps"])))
                sys.stdout.flush()
    finally:
        for srv in servers:
            srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print("\nmedians over rounds (ms; the light call's server-side phases "
          "from the log):")
    for srv in servers:
        rows = srv.rows
        if not rows:
            continue
        m = {k: statistics.median(x[k] for x in rows)
             for k in ("idle", "busy", "ratio", "bound", "heavy_compute",
                       "load")}
        print("%s: idle p50 %.3f, busy p50 %.3f, busy/idle %.2f; bound "
              "%.3f (heavy compute %.3f): %s; load %.1f" % (
                  srv.label, m["idle"], m["busy"], m["ratio"], m["bound"],
                  m["heavy_compute"],
                  "holds" if m["busy"] <= m["bound"] else "exceeded",
                  m["load"]))
        for w in ("light_idle", "light_busy"):
            print("  %s: %s" % (w, phases({
                k: statistics.median(x[w][k] for x in rows)
                for k in PHASES})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
