#!/usr/bin/python3
"""bench_layer.py - what one call for a layer's backward buys.

  fused   issue 14 figure (c): on every ResNet row of problems.txt, f32
          NCX/OIX, ConvolutionBackward asking for diff_src and diff_weights
          against the two single calls (ConvolutionBackwardData, then
          ConvolutionBackwardWeights), end to end through the Python
          package with reused output buffers. Each rep times one fused call
          and one pair, in alternating order. Prints the medians, their
          ratio (target <= 0.85) and the bytes each side moves, up and down
          (target <= 0.78).
  torch   figure (d): the deconv row through the server over loopback,
          diff_src and diff_weights each by its single op (which uploads
          only what it needs) and both by ConvTransposeBackward, against
          PyTorch's
          torch.ops.aten.convolution_backward in f32 NCX on this machine
          (every core, mkldnn as PyTorch ships it). Prints the medians
          and how many times faster the server is (target >= 20).

    /usr/bin/python3 tests/bench/bench_layer.py --build build

Starts a default convgrad-server of --build (no flags but the address) on
an ephemeral port unless --target is given. Figures, not a test: nothing is
asserted."""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

from bench_python import parse_desc, resnet_rows  # noqa: E402

convgrad = None  # imported by main(), once CONVGRAD_LIBRARY is set


def start_server(path):
    """A default server (adaptive threads, every core) on an ephemeral
    port; returns the process and its target."""
    proc = subprocess.Popen([path, "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    m = re.search(r"listen=127\.0\.0\.1:(\d+)", proc.stdout.readline())
    if not m:
        proc.kill()
        raise SystemExit("server did not get ready")
    return proc, "127.0.0.1:%d" % int(m.group(1))


def tensors(f, rng, deconv=False):
    """src, diff_dst and weights of a descriptor in NCX / OIX (IOX for a
    ConvTranspose: (IC, OC/g, K))."""
    g = f["g"]
    src = rng.uniform(-1, 1, (f["mb"], f["ic"], f["ih"], f["iw"]))
    dd = rng.uniform(-1, 1, (f["mb"], f["oc"], f["oh"], f["ow"]))
    w = (f["ic"], f["oc"] // g) if deconv else (f["oc"], f["ic"] // g)
    w = rng.uniform(-1, 1, w + (f["kh"], f["kw"]))
    return [a.astype(np.float32) for a in (src, dd, w)]


def attrs_of(f, deconv=False):
    return dict(strides=[f["sh"], f["sw"]], pads_begin=[f["ph"], f["pw"]],
                pads_end=[f["ph"], f["pw"]], groups=f["g"],
                data_format="NCX",
                weights_format="IOX" if deconv else "OIX")


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def moved(c, fn):
    """Bytes up and down of the calls fn makes."""
    c.stats(reset=True)
    fn()
    s = c.stats()
    return s["bytes_sent"], s["bytes_received"]


def bench_fused(args, c):
    rng = np.random.default_rng(1)
    print("(c) fused ConvolutionBackward (diff_src + diff_weights) against "
          "the two single calls, f32 NCX/OIX, %d reps, medians" % args.reps)
    print("%-44s %9s %9s %6s %12s %12s %6s" % (
        "row", "two ms", "fused ms", "ratio", "two MB", "fused MB", "ratio"))
    for desc in resnet_rows(args.problems, args.rows):
        f = parse_desc(desc)
        src, dd, w = tensors(f, rng)
        a = attrs_of(f)
        dx, dw = np.empty_like(src), np.empty_like(w)

        def two():
            c.conv_backward_data(dd, w, out=dx, dst_shape=list(src.shape),
                                 **a)
            c.conv_backward_weights(src, dd, out=dw,
                                    weights_shape=list(w.shape), **a)

        def fused():
            c.conv_backward(src, dd, w, outputs=["diff_src", "diff_weights"],
                            out={"diff_src": dx, "diff_weights": dw}, **a)
        for _ in range(args.warmup):
            two()
            fused()
        t_two, t_fused = [], []
        for r in range(args.reps):
            order = (two, fused) if r % 2 == 0 else (fused, two)
            for fn in order:
                (t_two if fn is two else t_fused).append(timed(fn))
        b_two, b_fused = sum(moved(c, two)), sum(moved(c, fused))
        m2, mf = statistics.median(t_two), statistics.median(t_fused)
        print("%-44s %9.2f %9.2f %6.2f %12.2f %12.2f %6.2f" % (
            f["name"][:44], m2, mf, mf / m2, b_two / 1e6, b_fused / 1e6,
            b_fused / b_two))
        sys.stdout.flush()


def bench_torch(args, c):
    import torch
    # Every core, as the server has (Debian's torch may start with one).
    torch.set_num_threads(os.cpu_count())
    rows = resnet_rows(args.problems, r"^deconv:")
    rng = np.random.default_rng(2)
    print("(d) deconv row: server over loopback against "
          "torch.ops.aten.convolution_backward (torch %s, %d threads), f32 "
          "NCX, %d reps, medians" % (torch.__version__,
                                     torch.get_num_threads(), args.reps))
    for desc in rows:
        f = parse_desc(desc.split(":", 1)[1].strip())
        src, dd, w = tensors(f, rng, deconv=True)
        a = attrs_of(f, deconv=True)
        ts, tdd, tw = (torch.from_numpy(x) for x in (src, dd, w))
        out = {"diff_src": np.empty_like(src), "diff_weights": np.empty_like(w)}

        def torch_bwd(mask):
            torch.ops.aten.convolution_backward(
                tdd, ts, tw, None, [f["sh"], f["sw"]], [f["ph"], f["pw"]],
                [1, 1], True, [0, 0], f["g"], mask)

        def server(names):
            c.conv_transpose_backward(src, dd, w, outputs=names,
                                      out={n: out[n] for n in names}, **a)
        def data():
            c.conv_transpose_backward_data(dd, w, out=out["diff_src"], **a)

        def weights():
            c.conv_transpose_backward_weights(
                src, dd, out=out["diff_weights"], weights_shape=list(w.shape),
                **a)
        cases = [
            ("diff_src", lambda: torch_bwd([True, False, False]), data),
            ("diff_weights", lambda: torch_bwd([False, True, False]), weights),
            ("both", lambda: torch_bwd([True, True, False]),
             lambda: server(["diff_src", "diff_weights"])),
        ]
        for name, tfn, sfn in cases:
            for _ in range(args.warmup):
                tfn()
                sfn()
            tt, st = [], []
            for r in range(args.reps):
                for fn in ((tfn, sfn) if r % 2 == 0 else (sfn, tfn)):
                    (tt if fn is tfn else st).append(timed(fn))
            mt, ms = statistics.median(tt), statistics.median(st)
            print("%-30s %-12s torch %9.2f ms  server %8.2f ms  %6.1fx" % (
                f["name"][:30], name, mt, ms, mt / ms))
            sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--target", help="a running server (default: start one)")
    ap.add_argument("--problems", default=os.path.join(HERE, "problems.txt"))
    ap.add_argument("--rows", default="resnet50:")
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--only", choices=("fused", "torch"))
    args = ap.parse_args()
    os.environ.setdefault("CONVGRAD_LIBRARY", os.path.join(
        args.build, "client", "libcgclient.so"))
    global convgrad
    import convgrad
    proc, target = None, args.target
    if target is None:
        proc, target = start_server(os.path.join(args.build, "server",
                                                 "convgrad-server"))
    try:
        c = convgrad.Client(target)
        info = c.info()
        print("server %s: isa %s, %d workers x %d threads, %s threads" % (
            info["version"], info["cpu_isa"], info["workers"],
            info["threads_per_worker"], info["threads_policy"]))
        if args.only in (None, "fused"):
            bench_fused(args, c)
        if args.only in (None, "torch"):
            bench_torch(args, c)
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
