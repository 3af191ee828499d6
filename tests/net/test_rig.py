#!/usr/bin/python3
"""test_rig.py - one offloaded training step across a link between two
network namespaces (tests/net/rig.sh: 1 Gbit/s tbf, a core each where
the machine has two): a trainer in one, its convgrad-server in the other,
every tensor crossing the veth as bytes. The gradients of a small
two-convolution net (and of its input) must equal local autograd's
within 1e-6 of each tensor's largest value, the client's bytes must have
crossed the link (the trainer's veth counters grew by at least what the
client counted), and both ends must be shaped (tbf).

Run as root: the script builds a rig of its own, runs itself again on
the trainer's side, and tears the rig down. Skipped (exit 77, with the
reason) where no rig can be built: not root, no CAP_NET_ADMIN, no ip/tc.

Usage: test_rig.py --server PATH (with CONVGRAD_LIBRARY set)."""
import copy
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "python"))
import cgtest  # noqa: E402

TOLERANCE = 1e-6


def rig_args():
    cores = sorted(os.sched_getaffinity(0))
    args = ["--rate", "1gbit"]
    if len(cores) >= 2:
        args += ["--trn-cpus", str(cores[0]), "--srv-cpus", str(cores[1])]
    return args


def net():
    import torch.nn as nn
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(8, 4, 3, stride=2, bias=False))


def step(model, x):
    x = x.clone().requires_grad_()
    model.zero_grad()
    (model(x) ** 2).mean().backward()
    grads = {k: p.grad for k, p in model.named_parameters()}
    grads["input"] = x.grad
    return grads


def main():
    args = cgtest.parse_args(__doc__)
    rc = cgtest.rig_enter("ct", rig_args())
    if rc is not None:
        return rc
    import torch
    import convgrad
    import convgrad.torch as ct

    kinds = [q["kind"] for q in json.loads(subprocess.run(
        ["tc", "-j", "qdisc", "show", "dev", "cgv0"], check=True,
        stdout=subprocess.PIPE, text=True).stdout)]
    if "tbf" not in kinds:
        print("FAIL: the trainer's end of the link is not shaped: %s" % kinds)
        return 1
    server = cgtest.Server(args.server, listen=os.environ["CG_RIG_SERVER"] +
                           ":0", prefix=cgtest.rig_server_prefix(),
                           workers=None)
    failures = []
    try:
        torch.manual_seed(0)
        model = net()
        x = torch.randn(2, 3, 16, 16)
        want = step(model, x)
        client = convgrad.Client(server.target)
        offloaded = ct.offload(copy.deepcopy(model), client)
        tx0, rx0 = cgtest.rig_link_bytes()
        got = step(offloaded, x)
        tx1, rx1 = cgtest.rig_link_bytes()
        s = client.stats()
        client.close()
        print("across the rig (%s): %d calls, %d bytes up, %d down, %d "
              "staged; link tx %d rx %d" % (
                  server.target, s["calls"], s["bytes_sent"],
                  s["bytes_received"], s["staged_bytes"], tx1 - tx0,
                  rx1 - rx0))
        if s["calls"] != 2 or s["bytes_sent"] == 0:
            failures.append("expected 2 calls sending bytes, got %s" % s)
        if not s["staged_bytes"]:
            failures.append("offload's default (stage=True) staged nothing "
                            "across the rig")
        if tx1 - tx0 < s["bytes_sent"] or rx1 - rx0 < s["bytes_received"]:
            failures.append("the client's bytes did not cross the link")
        for k, ref in want.items():
            err = cgtest.rel_err(got[k], ref)
            print("  %-10s relative error %.1e" % (k, err))
            if not err <= TOLERANCE:
                failures.append("%s: %.1e > %.0e" % (k, err, TOLERANCE))
    finally:
        server.stop()
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
