#!/usr/bin/python3
"""train_digits.py - a small CNN on scikit-learn's handwritten digits (1,797
8x8 images), trained with torch.distributed (gloo) by --world-size
processes, every one offloading its convolution backward to a convgrad
server (--target: host:port, a host:port list or dns:///name:port, balanced
by the client's round_robin).

The model has three Conv2d (one grouped and strided), a ConvTranspose2d
with output_padding in a small reconstruction head, and a linear
classifier; the loss is cross-entropy plus 0.1 x the reconstruction's mean
squared error. SGD with momentum and SiLU keep training smooth: with ReLU
and larger steps, a one-ulp difference of summation order flips an
activation now and then, and the two runs drift apart.
Each epoch prints the mean loss, the test accuracy, seconds per step, and
the server calls and bytes per step of one process (and its calls that
needed more than one attempt: a replica that failed or went away, or one
that lacked a staged input): one call per
convolution (the layer op), and no bytes at all when the server is on this
host (a unix socket or loopback target whose server serves shared-memory
regions: the tensors go through the client's arena).

--compare trains again with the same seeds and local autograd and prints
the largest relative difference of the per-step loss curve and of the final
weights. It exits 1 unless the loss curves agree within --tolerance
(default 1e-4 in f32, where 3 epochs agree to about 4e-6; 0.15 in bf16,
where the server, rounding once after f32 accumulation, and torch's bf16
kernels give gradients that differ by a bf16 rounding, and the runs then
drift apart like two close seeds: about 5e-2 over 3 epochs; the same
0.15 with --wire bf16, offload's opt-in bf16 wire) and the final test
accuracy is above 90%.

    train_digits.py --target localhost:50051 --world-size 2 --compare

Runs under torchrun too (it then takes RANK and WORLD_SIZE from it).
Needs python3-torch and python3-sklearn."""
import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import convgrad.torch as ct


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 16, 3, padding="same")
        self.c2 = nn.Conv2d(16, 32, 3, stride=2, padding=1, groups=4)
        self.c3 = nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.up = nn.ConvTranspose2d(32, 1, 3, stride=2, padding=1,
                                     output_padding=1)
        self.fc = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x):
        h = F.silu(self.c3(F.silu(self.c2(F.silu(self.c1(x))))))
        return self.fc(h.flatten(1)), self.up(h)


def load_data():
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1)
    x = (x - x.mean()) / x.std()
    y = torch.tensor(d.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    n_test = len(y) // 5
    test, train = perm[:n_test], perm[n_test:]
    return (x[train], y[train]), (x[test], y[test])


def train(args, rank, world, offload):
    """One full run; returns the per-step loss curve (mean over ranks), the
    final weights, the test accuracy and per-step figures."""
    (xtr, ytr), (xte, yte) = load_data()
    torch.manual_seed(args.seed)
    model = Net()
    client = None
    if offload:
        ct.offload(model, args.target, wire=args.wire)
        client = model.c1._convgrad_client
        client.stats(reset=True)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    per_rank = args.batch // world
    steps = len(ytr) // (per_rank * world)
    curve = []
    label = "offloaded" if offload else "local"
    autocast = torch.autocast(device_type="cpu", dtype=torch.bfloat16,
                              enabled=args.dtype == "bf16")
    for epoch in range(args.epochs):
        order = torch.randperm(len(ytr), generator=torch.Generator()
                               .manual_seed(args.seed * 1000 + epoch))
        t0 = time.perf_counter()
        epoch_loss = 0.0
        for step in range(steps):
            idx = order[(step * world + rank) * per_rank:
                        (step * world + rank + 1) * per_rank]
            x, y = xtr[idx], ytr[idx]
            opt.zero_grad()
            with autocast:
                logits, recon = ddp(x)
                loss = (F.cross_entropy(logits.float(), y) +
                        0.1 * F.mse_loss(recon.float(), x))
            loss.backward()
            opt.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            curve.append(mean.item() / world)
            epoch_loss += curve[-1]
            if rank == 0 and args.progress and len(curve) % args.progress == 0:
                print("%s step %d/%d: loss %.4f" % (
                    label, len(curve), steps * args.epochs, curve[-1]),
                    flush=True)
        dt = (time.perf_counter() - t0) / steps
        acc = accuracy(model, xte, yte, autocast)
        if rank == 0:
            line = ("%s epoch %d: loss %.4f, test accuracy %.2f%%, "
                    "%.1f ms/step" % (label, epoch + 1, epoch_loss / steps,
                                      100 * acc, 1000 * dt))
            if client:
                s = client.stats(reset=True)
                line += (", %.0f calls/step, %.1f kB sent + %.1f kB "
                         "received/step (%s), server compute %.1f ms/step, "
                         "%d calls retried" % (
                             s["calls"] / steps, s["bytes_sent"] / steps / 1e3,
                             s["bytes_received"] / steps / 1e3,
                             "shared memory, %d MiB" % (s["arena_bytes"] >> 20)
                             if s["arena_bytes"] else "bytes",
                             s["compute_ms"] / steps, s["retries"]))
            print(line, flush=True)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return curve, weights, acc


def accuracy(model, x, y, autocast):
    with torch.no_grad(), autocast:
        logits, _ = model(x)
    return (logits.argmax(1) == y).float().mean().item()


def rel_diff(a, b):
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def run(rank, world, args):
    """Everything one process does; returns its exit code."""
    curve, weights, acc = train(args, rank, world, offload=True)
    if not args.compare:
        return 0
    lcurve, lweights, lacc = train(args, rank, world, offload=False)
    if rank != 0:
        return 0
    dcurve = rel_diff(curve, lcurve)
    dweights = max(rel_diff(weights[k], lweights[k]) for k in weights)
    print("compare: loss curve max rel diff %.2e (tolerance %.0e), final "
          "weights max rel diff %.2e, test accuracy %.2f%% (local %.2f%%)"
          % (dcurve, args.tolerance, dweights, 100 * acc, 100 * lacc))
    ok = True
    if not dcurve <= args.tolerance:  # NaN fails too
        print("FAIL: the loss curves differ by more than %.0e"
              % args.tolerance)
        ok = False
    if not acc > 0.9:
        print("FAIL: test accuracy %.2f%% is not above 90%%" % (100 * acc))
        ok = False
    return 0 if ok else 1


def spawned(rank, world, args, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    rc = run(rank, world, args)
    dist.destroy_process_group()
    if rc:
        sys.exit(rc)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=24,
                    help="global batch, split over the processes")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    ap.add_argument("--wire", choices=("f32", "bf16"), default="f32",
                    help="offload's wire=: bf16 sends the f32 tensors as "
                    "bf16 (lossy, opt-in)")
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--progress", type=int, default=0, metavar="N",
                    help="print the step and its loss every N steps")
    ap.add_argument("--tolerance", type=float, default=None)
    args = ap.parse_args()
    if args.tolerance is None:
        args.tolerance = 1e-4 if (args.dtype, args.wire) == (
            "f32", "f32") else 0.15
    torch.set_num_threads(1)
    if "RANK" in os.environ:  # torchrun
        dist.init_process_group("gloo")
        rc = run(dist.get_rank(), dist.get_world_size(), args)
        dist.destroy_process_group()
        return rc
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.spawn(spawned, args=(args.world_size, args, port),
                 nprocs=args.world_size, join=True)
    except mp.ProcessExitedException as e:
        return e.exit_code or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
