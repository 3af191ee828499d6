#!/usr/bin/python3
"""bench_python.py - what the Python package costs over the C client:
the package's call time against `convgrad bench` (libcgclient driven from
C) on the ResNet rows of problems.txt: for each row and op, rounds that
alternate which of the two runs first, each round --requests timed calls
after --warmup untimed ones, one result buffer reused (out=, as `convgrad
bench` does). Prints the median over rounds of each side's p50 and their
ratio. (An offloaded training step: bench_train.py.)

    CONVGRAD_LIBRARY=build/client/libcgclient.so \\
      /usr/bin/python3 tests/bench/bench_python.py --build build

Starts a convgrad-server of --build on an ephemeral port (2 workers) unless
--target is given. Figures, not a test: nothing is asserted."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

import numpy as np  # noqa: E402

convgrad = None  # imported by main(), once CONVGRAD_LIBRARY is set

OPS = {"ConvolutionBackwardData": "conv_backward_data",
       "ConvolutionBackwardWeights": "conv_backward_weights"}


def parse_desc(d):
    """The 2D convolution fields of a benchdnn descriptor (cg/bdesc.h):
    mb g ic ih iw oc oh ow kh kw sh sw ph pw, and the name n"..."."""
    name = re.search(r'n"([^"]*)"', d)
    body = d[:name.start()] if name else d
    f = {k: int(v) for k, v in re.findall(r"([a-z]+)(\d+)", body)}
    if "id" in f or "dh" in f or "dw" in f:
        raise SystemExit("%s: only 2D, undilated rows are supported" % d)
    for k, v in (("mb", 2), ("g", 1), ("sh", 1), ("ph", 0)):
        f.setdefault(k, v)
    for a, b in (("iw", "ih"), ("ow", "oh"), ("kw", "kh"), ("sw", "sh"),
                 ("pw", "ph")):
        f.setdefault(a, f[b])
    f["name"] = name.group(1) if name else d
    return f


def resnet_rows(path, pattern):
    rows = []
    for line in open(path):
        line = line.strip()
        if line and not line.startswith("#") and re.search(pattern, line):
            rows.append(line)
    return rows


def c_bench(cli, target, desc, op, n, warmup):
    out = subprocess.run(
        [cli, "bench", "--target", target, "--problem", desc, "--op", op,
         "--requests", str(n), "--warmup", str(warmup), "--json",
         "--data-format", "NCX", "--weights-format", "OIX"],
        check=True, capture_output=True, text=True).stdout
    r = json.loads(out)[0]
    return r["p50_ms"], r["server_compute_ms"]


class PyBench:
    """One problem and op through convgrad.Client, inputs and out= made
    once, like `convgrad bench`."""

    def __init__(self, client, f, op):
        self.client = client
        rng = np.random.default_rng(0)
        x = (f["mb"], f["ic"], f["ih"], f["iw"])
        y = (f["mb"], f["oc"], f["oh"], f["ow"])
        w = (f["oc"], f["ic"] // f["g"], f["kh"], f["kw"])
        def rand(s):
            return rng.standard_normal(s, dtype=np.float32)
        self.attrs = dict(strides=[f["sh"], f["sw"]],
                          pads_begin=[f["ph"], f["pw"]],
                          pads_end=[f["ph"], f["pw"]], groups=f["g"],
                          data_format="NCX", weights_format="OIX")
        if op == "ConvolutionBackwardData":
            self.args = (rand(y), rand(w))
            self.out = np.empty(x, np.float32)
            self.attrs["dst_shape"] = list(x)
        else:
            self.args = (rand(x), rand(y))
            self.out = np.empty(w, np.float32)
            self.attrs["weights_shape"] = list(w)
        self.fn = getattr(client, OPS[op])

    def run(self, n, warmup):
        for _ in range(warmup):
            self.fn(*self.args, out=self.out, **self.attrs)
        self.client.stats(reset=True)
        lat = []
        for _ in range(n):
            t0 = time.perf_counter()
            self.fn(*self.args, out=self.out, **self.attrs)
            lat.append((time.perf_counter() - t0) * 1e3)
        s = self.client.stats(reset=True)
        # total_ms is libcgclient's own time of the call: the rest is the
        # package's.
        return (statistics.median(lat), s["compute_ms"] / n,
                statistics.fmean(lat) - s["total_ms"] / n)


def bench_calls(args, target):
    client = convgrad.Client(target)
    print("calls: f32, NCX/OIX, %d rounds x %d requests (+%d warmup), "
          "p50 ms; median over rounds; compute: the server's; Python us: "
          "the package's time around libcgclient's" % (args.rounds, args.requests,
                                          args.warmup))
    print("%-44s %-27s %9s %9s %7s %9s %10s" % (
        "problem", "op", "C", "Python", "ratio", "compute", "Python us"))
    ratios = []
    for desc in resnet_rows(args.problems, args.rows):
        f = parse_desc(desc)
        for op in OPS:
            py = PyBench(client, f, op)
            cs, ps, comp, over = [], [], [], []
            for r in range(args.rounds):
                order = (0, 1) if r % 2 == 0 else (1, 0)
                for side in order:
                    if side == 0:
                        p50, c = c_bench(args.cli, target, desc, op,
                                         args.requests, args.warmup)
                        cs.append(p50)
                    else:
                        p50, c, o = py.run(args.requests, args.warmup)
                        ps.append(p50)
                        over.append(o)
                    comp.append(c)
            c50, p50 = statistics.median(cs), statistics.median(ps)
            ratios.append(p50 / c50)
            print("%-44s %-27s %9.2f %9.2f %7.3f %9.2f %10.0f" % (
                f["name"][:44], op, c50, p50, p50 / c50,
                statistics.median(comp), 1e3 * statistics.median(over)),
                flush=True)
    print("calls: geometric mean of the ratios %.3f" %
          statistics.geometric_mean(ratios))
    client.close()


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"),
                    help="build tree: its convgrad CLI and server")
    ap.add_argument("--target", help="a running server (default: start one)")
    ap.add_argument("--problems", default=os.path.join(HERE, "problems.txt"))
    ap.add_argument("--rows", default="resnet50:",
                    help="regex selecting problems.txt rows")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    args.cli = os.path.join(args.build, "client", "convgrad")
    os.environ.setdefault("CONVGRAD_LIBRARY", os.path.join(
        args.build, "client", "libcgclient.so"))
    global convgrad
    import convgrad
    server = None
    target = args.target
    if target is None:
        import cgtest
        server = cgtest.Server(os.path.join(args.build, "server",
                                            "convgrad-server"))
        target = server.target
    try:
        info = convgrad.Client(target).info()
        print("server %s: isa %s, %d workers x %d threads, cpus %s" % (
            target, info["cpu_isa"], info.get("workers", 0),
            info.get("threads_per_worker", 0), info["cpus"]))
        bench_calls(args, target)
    finally:
        if server:
            server.stop()


if __name__ == "__main__":
    main()
