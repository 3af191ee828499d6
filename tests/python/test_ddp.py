#!/usr/bin/python3
"""test_ddp.py - convgrad.torch.offload() under DistributedDataParallel
(gloo, 2 processes) against a real convgrad-server: each rank trains the
offloaded model (shared-memory regions, the server being on loopback;
overlap asked for, which offload must turn off under DDP) on its half of
every batch, with gradient accumulation over two micro-batches (the first
under no_sync), and the final weights must match one local process
training on the whole batches with plain autograd.

Usage: test_ddp.py --server PATH (with CONVGRAD_LIBRARY set)."""
import os
import sys
import tempfile

import cgtest

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

import convgrad.torch as ct

WORLD = 2
STEPS = 3
BATCH = 8  # per step, split into WORLD ranks x 2 micro-batches


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding="same"), nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2), nn.ReLU(),
        nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1),
        nn.Flatten(), nn.Linear(4 * 8 * 8, 10))


def data():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, 1, 8, 8, generator=g),
             torch.randint(0, 10, (BATCH,), generator=g))
            for _ in range(STEPS)]


def train(model, batches, micro):
    """SGD over batches; each batch's gradient is the mean over its rows,
    accumulated over micro-batches of equal size."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    lossf = nn.CrossEntropyLoss()
    for x, y in batches:
        opt.zero_grad()
        xs, ys = x.chunk(micro), y.chunk(micro)
        for i, (xm, ym) in enumerate(zip(xs, ys)):
            last = i == micro - 1
            if isinstance(model, DistributedDataParallel) and not last:
                with model.no_sync():
                    (lossf(model(xm), ym) / micro).backward()
            else:
                (lossf(model(xm), ym) / micro).backward()
        opt.step()


def worker(rank, target, init_file, out_dir):
    dist.init_process_group("gloo", init_method="file://" + init_file,
                            rank=rank, world_size=WORLD)
    # overlap asked for: offload turns it off under torch.distributed, or
    # the reducer would wait for gradients that never pass its hooks
    model = ct.offload(make_model(), target, overlap=True)
    ddp = DistributedDataParallel(model)
    shards = [(x.chunk(WORLD)[rank], y.chunk(WORLD)[rank])
              for x, y in data()]
    train(ddp, shards, micro=2)
    calls = model[0]._convgrad_client.stats()["calls"]
    torch.save({"state": model.state_dict(), "calls": calls},
               os.path.join(out_dir, "rank%d.pt" % rank))
    dist.destroy_process_group()


def main():
    args = cgtest.parse_args(__doc__)
    server = cgtest.Server(args.server)
    failed = False
    try:
        with tempfile.TemporaryDirectory(prefix="cgpy-ddp-") as d:
            cgtest.spawn(worker, (server.target, os.path.join(d, "init"), d),
                         WORLD)
            local = make_model()
            train(local, data(), micro=WORLD * 2)
            ref = local.state_dict()
            for rank in range(WORLD):
                r = torch.load(os.path.join(d, "rank%d.pt" % rank))
                # per step and micro-batch: one call per conv
                want = STEPS * 2 * 3
                if r["calls"] != want:
                    print("rank %d: %d calls, expected %d"
                          % (rank, r["calls"], want))
                    failed = True
                for k, v in ref.items():
                    err = cgtest.rel_err(r["state"][k], v)
                    print("rank %d %-10s rel_err %.2e" % (rank, k, err))
                    if err > 1e-5:
                        failed = True
    finally:
        server.stop()
    print("FAILED" if failed else "OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
