#!/usr/bin/python3
"""bench_fair.py - issue 29's fairness figure: how much slower a light client
gets when another hammers the same server. Two peers on one host: the heavy
one with 64 calls in flight over TCP loopback, the light one with 1 over
the unix socket (a peer of its own). Each round measures the light client's
p50 alone on the idle server, then again while the heavy one runs; the
figure is the median over rounds of busy p50 / idle p50 (target: at most
2). Prints figures, asserts nothing. Run it under flock
/work/coord/bench.lock on a shared machine.

By default the server and both clients run in this script's session, so
the kernel shares the CPU between their threads, the heavy client's 64
among them; --sessions own starts each in a session of its own, as a
service and separately launched trainers are, and the kernel then shares
it between the three first (autogroups; cgroups do the same for systemd
units and containers).

Usage: bench_fair.py --server BIN --cli BIN [--rounds N] [--seconds S]
           [--light DESC] [--heavy DESC] [--sessions shared|own]
           [--server-arg ARG ...]"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def bench(cli, target, problem, conc, seconds, own_session, warmup=20):
    """Starts `convgrad bench` for seconds; returns the process."""
    return subprocess.Popen(
        [cli, "bench", "--target", target, "--problem", problem, "--op",
         "ConvolutionBackwardData", "--concurrency", str(conc), "--requests",
         "10000000", "--warmup", str(warmup), "--duration", str(seconds),
         "--deadline", "60000", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=own_session)


def result(proc):
    out, err = proc.communicate(timeout=600)
    if proc.returncode != 0 or not out.strip():
        raise SystemExit("convgrad bench failed (%d): %s" % (proc.returncode,
                                                             err.strip()))
    return json.loads(out)[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--server", required=True)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=4)
    ap.add_argument("--light", default="mb1ic4ih8oc4oh8kh3ph1")
    ap.add_argument("--heavy", default="mb1ic4ih8oc4oh8kh3ph1")
    ap.add_argument("--sessions", choices=("shared", "own"), default="shared")
    ap.add_argument("--server-arg", action="append", default=[])
    args = ap.parse_args()
    own = args.sessions == "own"

    sockdir = tempfile.mkdtemp(prefix="cg-fair-")
    sock = os.path.join(sockdir, "s.sock")
    server = subprocess.Popen(
        [args.server, "--listen", "127.0.0.1:0,unix:" + sock] +
        args.server_arg, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True, start_new_session=own)
    ready = server.stdout.readline()
    m = re.search(r"listen=127\.0\.0\.1:(\d+)", ready)
    if not m:
        server.kill()
        raise SystemExit("server did not get ready: %r" % ready)
    tcp, unix = "127.0.0.1:" + m.group(1), "unix:" + sock
    print("server: %s" % ready.strip())
    print("light: %s, 1 in flight over %s; heavy: %s, 64 in flight over "
          "TCP loopback; %d rounds of %d s; sessions: %s" % (
              args.light, unix, args.heavy, args.rounds, args.seconds,
              args.sessions))
    print("%5s %12s %12s %8s %14s %12s" % ("round", "idle p50 ms",
                                           "busy p50 ms", "ratio",
                                           "heavy p50 ms", "heavy req/s"))
    ratios, idle_all, busy_all = [], [], []
    try:
        for r in range(args.rounds):
            idle = result(bench(args.cli, unix, args.light, 1, args.seconds,
                                own))
            heavy = bench(args.cli, tcp, args.heavy, 64, args.seconds + 2, own,
                          warmup=64)
            time.sleep(1.0)  # its warm-up and first second
            busy = result(bench(args.cli, unix, args.light, 1, args.seconds,
                                own))
            h = result(heavy)
            ratio = busy["p50_ms"] / idle["p50_ms"]
            ratios.append(ratio)
            idle_all.append(idle["p50_ms"])
            busy_all.append(busy["p50_ms"])
            print("%5d %12.3f %12.3f %8.2f %14.3f %12.0f" % (
                r + 1, idle["p50_ms"], busy["p50_ms"], ratio, h["p50_ms"],
                h["requests_per_s"]))
            sys.stdout.flush()
    finally:
        server.terminate()
        server.wait(timeout=60)
        shutil.rmtree(sockdir, ignore_errors=True)
    print("median: idle p50 %.3f ms, busy p50 %.3f ms, busy/idle %.2f "
          "(target <= 2)" % (statistics.median(idle_all),
                             statistics.median(busy_all),
                             statistics.median(ratios)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
