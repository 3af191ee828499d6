#!/usr/bin/python3
"""bench_verify.py - what the client's own result checks cost
(cgc_options.verify_rate, `convgrad bench --verify-rate`): the layer call
(ConvolutionBackward, its three outputs) of the ResNet-50 rows of
tests/bench/problems.txt, timed by `convgrad bench --json` with
--verify-rate 1 and 0 in interleaved rounds; per row and dtype it prints
the median p50 of each and the median of the rounds' ratios, and the
client's CPU time per call (the CLI process's user + system time over its
calls, warm-up included) with and without: their difference is what the
check costs, a figure that waiting on a loaded machine does not inflate.

The server runs on this host (--workers 1, its own checks off: --check-rate
0 --check-first-runs 0), so the figures are loopback calls whose client
check runs while the server idles (a blocking trainer's case: the check
adds to the call). The check is kernels/src/check.c's plain C loops on one
thread (libcgclient has no OpenMP).

    /usr/bin/python3 tests/bench/bench_verify.py --build build [--rounds 3]

Figures, not a test: nothing is asserted."""
import argparse
import json
import os
import re
import resource
import signal
import statistics
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))


def resnet_rows():
    """The ResNet-50 descriptors of problems.txt with their names."""
    rows = []
    with open(os.path.join(HERE, "problems.txt")) as f:
        for line in f:
            m = re.match(r'(mb\S+?)n"resnet50:([^"]+)"', line.strip())
            if m:
                rows.append((m.group(1), m.group(2)))
    return rows


class Server:
    def __init__(self, build):
        self.proc = subprocess.Popen(
            [os.path.join(build, "server", "convgrad-server"), "--listen",
             "127.0.0.1:0", "--workers", "1", "--check-rate", "0",
             "--check-first-runs", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        m = re.search(r"listen=127\.0\.0\.1:(\d+)", self.proc.stdout.readline())
        if not m:
            self.proc.kill()
            raise SystemExit("the server did not get ready")
        self.target = "127.0.0.1:%d" % int(m.group(1))

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        self.proc.stdout.close()


def children_cpu_ms():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (r.ru_utime + r.ru_stime) * 1e3


def p50(build, target, desc, dtype, rate, requests):
    """The p50 of the call, and the client's CPU ms per call."""
    cpu0 = children_cpu_ms()
    out = subprocess.run(
        [os.path.join(build, "client", "convgrad"), "bench", "--target",
         target, "--problem", desc, "--op", "ConvolutionBackward", "--dtype",
         dtype, "--data-format", "NCX", "--weights-format", "OIX",
         "--requests", str(requests), "--warmup", "1", "--json",
         "--verify-rate", str(rate)],
        check=True, capture_output=True, text=True)
    cpu = (children_cpu_ms() - cpu0) / (requests + 1)
    row = json.loads(out.stdout)[0]
    if row["errors"]:
        raise SystemExit("%s %s: %d errors" % (desc, dtype, row["errors"]))
    return row["p50_ms"], cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--dtypes", default="f32,bf16")
    args = ap.parse_args()
    server = Server(args.build)
    try:
        print("| row | dtype | call ms | checked ms | ratio | client CPU ms "
              "| checked | check ms |")
        print("|---|---|---|---|---|---|---|---|")
        for desc, name in resnet_rows():
            for dt in args.dtypes.split(","):
                plain, checked = [], []
                for _ in range(args.rounds):
                    plain.append(p50(args.build, server.target, desc, dt, 0,
                                     args.requests))
                    checked.append(p50(args.build, server.target, desc, dt, 1,
                                       args.requests))
                ratio = statistics.median(
                    c[0] / p[0] for p, c in zip(plain, checked))
                cpu_p = statistics.median(p[1] for p in plain)
                cpu_c = statistics.median(c[1] for c in checked)
                print("| %s | %s | %.1f | %.1f | %.2fx | %.1f | %.1f | %.1f |"
                      % (name, dt, statistics.median(p[0] for p in plain),
                         statistics.median(c[0] for c in checked), ratio,
                         cpu_p, cpu_c, cpu_c - cpu_p), flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
