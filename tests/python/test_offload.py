#!/usr/bin/python3
"""test_offload.py - convgrad.torch.offload() against local autograd, with
a real convgrad-server: a model mixing Conv1d ('same'), Conv3d ('valid',
strided, no bias), grouped and dilated Conv2d, a depthwise Conv2d and a
grouped ConvTranspose2d with output_padding, in f32, bf16 and f16 and
under CPU autocast; one layer-op call per layer, asking only for the
gradients autograd wants; gradient accumulation, retain_graph, double
backward, padding_mode, state_dict and optimizer, unbatched input,
output_size, restore().

The server sends grad_input first, as soon as it is computed (the
client has it whole while grad_weight is computed), and offload hands it
to autograd then by default, over bytes as over regions.

Same host: the tensors go through shared-memory regions (no byte on the
wire, regions registered once, not per call; the weights that train
resident in the arena, no slot taken for them per step), with the weight
gradients deferred to the end of the backward pass (overlap) or not, equal
either way, and torch.autograd.grad and backward(inputs=) still right; torch's
threads narrowed through the backward pass (backward_threads). Fallbacks
to bytes, each logged once: a server reached at a non-loopback address of
this host, one started with --shm off, one that cannot open the client's
objects (its own /dev/shm: NOT_FOUND), and a server restarted mid-training
(regions registered again; restarted with --shm off: bytes from then on).

Usage: test_offload.py --server PATH (with CONVGRAD_LIBRARY set)."""
import copy
import logging
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
import warnings
from unittest import mock

import cgtest

import torch
import torch.nn as nn

import convgrad
import convgrad.torch as ct

SERVER = None
ARGS = None


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(3, 6, 3, padding="same")
        self.c3 = nn.Conv3d(2, 4, (2, 3, 3), stride=(1, 2, 1),
                            padding="valid", bias=False)
        self.c2a = nn.Conv2d(4, 8, 3, padding=2, dilation=2, groups=2)
        self.c2b = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8,
                             bias=False)
        self.t2 = nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1,
                                     output_padding=1, groups=2)

    def forward(self, x1, x2, x3):
        a = self.c1(x1)
        b = self.t2(act(self.c2b(act(self.c2a(x2)))))
        c = self.c3(x3)
        return a, b, c


def act(t):
    # CPU torch has no f16 tanh.
    return torch.tanh(t.float()).to(t.dtype)


def inputs(dtype=torch.float32, requires_grad=True):
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(2, 3, 16, generator=g), torch.randn(2, 4, 10, 10,
                                                          generator=g),
          torch.randn(2, 2, 4, 9, 5, generator=g)]
    return [x.to(dtype).requires_grad_(requires_grad) for x in xs]


def loss_of(outs):
    g = torch.Generator().manual_seed(2)
    return sum((o.float() * torch.randn(o.shape, generator=g)).sum()
               for o in outs)


def models(dtype=torch.float32, target=None, **options):
    torch.manual_seed(0)
    local = Net().to(dtype)
    remote = ct.offload(copy.deepcopy(local), target or SERVER.target,
                        **options)
    return local, remote


def compare_grads(case, local, remote, xl, xr, tol):
    for (name, p), (_, q) in zip(local.named_parameters(),
                                 remote.named_parameters()):
        if p.grad is None:
            case.assertIsNone(q.grad, name)
            continue
        case.assertEqual(q.grad.dtype, p.dtype, name)
        case.assertLess(cgtest.rel_err(q.grad, p.grad), tol, name)
    for i, (a, b) in enumerate(zip(xl, xr)):
        if a.requires_grad:
            case.assertLess(cgtest.rel_err(b.grad, a.grad), tol,
                            "input %d" % i)


def expected_download(model, xs, own=0):
    """Bytes the offloaded backward of model(*xs) must receive: per layer,
    grad_input only when its input requires grad (less the first own rows,
    the trainer's share), grad_weight and grad_bias only when they require
    grad (f32)."""
    sizes = []

    def hook(m, inp, out):
        rows = inp[0].shape[0]
        sizes.append(inp[0].numel() // rows * (rows - own) *
                     inp[0].requires_grad +
                     m.weight.numel() * m.weight.requires_grad +
                     (m.bias.numel() * m.bias.requires_grad
                      if m.bias is not None else 0))
    handles = [m.register_forward_hook(hook) for m in model.modules()
               if type(m).__name__.startswith("Offloaded")]
    model(*[x.detach().requires_grad_(x.requires_grad) for x in xs])
    for h in handles:
        h.remove()
    return 4 * sum(sizes)


class Offload(unittest.TestCase):
    def compare(self, local, remote, xl, xr, tol):
        compare_grads(self, local, remote, xl, xr, tol)

    def test_f32_matches_local_autograd(self):
        local, remote = models(shm=False)
        self.assertEqual(type(remote.c2a).__name__, "OffloadedConv2d")
        self.assertIsInstance(remote.t2, nn.ConvTranspose2d)
        self.assertEqual(list(local.state_dict()), list(remote.state_dict()))
        xl, xr = inputs(), inputs()
        client = remote.c1._convgrad_client
        want = expected_download(remote, xr)
        client.stats(reset=True)
        loss_of(local(*xl)).backward()
        loss_of(remote(*xr)).backward()
        self.compare(local, remote, xl, xr, 1e-5)
        # 5 layers, one layer-op call each, every gradient from the server
        s = client.stats()
        self.assertEqual(s["calls"], 5)
        self.assertEqual(s["bytes_received"], want)

    def test_first_layer_skips_grad_input(self):
        local, remote = models(shm=False)
        xl, xr = inputs(requires_grad=False), inputs(requires_grad=False)
        client = remote.c1._convgrad_client
        want = expected_download(remote, xr)
        client.stats(reset=True)
        loss_of(local(*xl)).backward()
        loss_of(remote(*xr)).backward()
        self.compare(local, remote, xl, xr, 1e-5)
        # c1, c3, c2a see the inputs: no grad_input comes back for them
        s = client.stats()
        self.assertEqual(s["calls"], 5)
        self.assertEqual(s["bytes_received"], want)

    def test_frozen_weights_skip_grad_weight(self):
        local, remote = models(shm=False)
        for m in (local, remote):
            m.c2a.weight.requires_grad_(False)
            m.c2b.weight.requires_grad_(False)
        xl, xr = inputs(), inputs()
        client = remote.c1._convgrad_client
        want = expected_download(remote, xr)
        client.stats(reset=True)
        loss_of(local(*xl)).backward()
        loss_of(remote(*xr)).backward()
        self.assertIsNone(remote.c2a.weight.grad)
        self.compare(local, remote, xl, xr, 1e-5)
        # c2b (no bias, frozen weight) asks BackwardData: diff_dst and the
        # weight go up, not its input
        s = client.stats()
        self.assertEqual(s["calls"], 5)
        self.assertEqual(s["bytes_received"], want)

    def test_bf16_and_f16(self):
        # Reference: f64 autograd on the same rounded parameters and inputs.
        # The offloaded forward rounds every activation to the dtype, so
        # errors grow through the layers: bounds of a few roundings.
        for dt, tol in ((torch.bfloat16, 2e-2), (torch.float16, 3e-3)):
            with self.subTest(dtype=dt):
                local, remote = models(dt)
                local = local.double()
                xl = [x.detach().double().requires_grad_()
                      for x in inputs(dt)]
                xr = inputs(dt)
                loss_of(local(*xl)).backward()
                loss_of(remote(*xr)).backward()
                for (name, p), (_, q) in zip(local.named_parameters(),
                                             remote.named_parameters()):
                    self.assertEqual(q.grad.dtype, dt)
                    self.assertLess(cgtest.rel_err(q.grad, p.grad), tol, name)
                for a, b in zip(xl, xr):
                    self.assertEqual(b.grad.dtype, dt)
                    self.assertLess(cgtest.rel_err(b.grad, a.grad), tol)

    def test_autocast_bf16(self):
        local, remote = models()
        xl, xr = inputs(), inputs()
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            outs_l, outs_r = local(*xl), remote(*xr)
            self.assertEqual(outs_r[0].dtype, outs_l[0].dtype)
            self.assertEqual(outs_r[0].dtype, torch.bfloat16)
            loss_l, loss_r = loss_of(outs_l), loss_of(outs_r)
        self.assertEqual(loss_l.item(), loss_r.item())
        loss_l.backward()
        loss_r.backward()
        self.compare(local, remote, xl, xr, 1.5e-2)

    def test_accumulation_and_retain_graph(self):
        local, remote = models()
        xl, xr = inputs(), inputs()
        for m, x in ((local, xl), (remote, xr)):
            loss = loss_of(m(*x))
            loss.backward(retain_graph=True)
            loss.backward()
            loss_of(m(*x)).backward()
        self.compare(local, remote, xl, xr, 1e-5)

    def test_double_backward_raises(self):
        _, remote = models()
        xr = inputs()
        loss = loss_of(remote(*xr))
        g = torch.autograd.grad(loss, xr[1], create_graph=True)[0]
        with self.assertRaisesRegex(RuntimeError, "differentiate twice"):
            g.sum().backward()

    def test_optimizer_and_state_dict_survive(self):
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        ct.offload(model, SERVER.target)
        loss_of(model(*inputs())).backward()
        opt.step()
        for k, v in model.state_dict().items():
            self.assertFalse(torch.equal(v, before[k]), k)
        ct.restore(model)
        self.assertIs(type(model.c1), nn.Conv1d)
        self.assertFalse(hasattr(model.c1, "_convgrad_client"))

    def test_padding_mode_stays_local(self):
        m = nn.Sequential(nn.Conv2d(2, 2, 3, padding=1,
                                    padding_mode="reflect"),
                          nn.Conv2d(2, 2, 3))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            ct.offload(m, SERVER.target)
        self.assertIs(type(m[0]), nn.Conv2d)
        self.assertEqual(type(m[1]).__name__, "OffloadedConv2d")
        self.assertEqual(len(w), 1)
        self.assertIn("padding_mode='reflect'", str(w[0].message))

    def test_unbatched_and_output_size(self):
        torch.manual_seed(3)
        conv = nn.Conv2d(3, 4, 3)
        tconv = nn.ConvTranspose2d(4, 2, 3, stride=2)
        local = nn.ModuleList([conv, tconv])
        remote = ct.offload(copy.deepcopy(local), SERVER.target)
        x = torch.randn(3, 8, 8)
        for m in (local, remote):
            y = m[1](m[0](x.unsqueeze(0)), output_size=[14, 14])
            self.assertEqual(tuple(y.shape), (1, 2, 14, 14))
            (y * y).sum().backward()
            y = m[0](x)
            self.assertEqual(tuple(y.shape), (4, 6, 6))
            y.sum().backward()
        for p, q in zip(local.parameters(), remote.parameters()):
            self.assertLess(cgtest.rel_err(q.grad, p.grad), 1e-5)

    def test_shared_client(self):
        with convgrad.Client(SERVER.target) as c:
            m = ct.offload(nn.Conv2d(2, 3, 3), c)
            self.assertIs(m._convgrad_client, c)
            m(torch.randn(1, 2, 5, 5)).sum().backward()
            self.assertEqual(c.stats()["calls"], 1)


def train(case, local, remote, steps=2, tol=1e-5):
    """steps of SGD on both models from equal weights; their gradients
    and weights must stay equal."""
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
            for m in (local, remote)]
    for step in range(steps):
        xl, xr = inputs(), inputs()
        for m, x, opt in zip((local, remote), (xl, xr), opts):
            opt.zero_grad()
            loss_of(m(*x)).backward()
        compare_grads(case, local, remote, xl, xr, tol)
        for opt in opts:
            opt.step()


def diff_dst_bytes(model, xs):
    """Bytes of every offloaded layer's output (its diff_dst, f32)."""
    sizes = []
    handles = [m.register_forward_hook(
        lambda m, i, o: sizes.append(o.numel())) for m in model.modules()
        if type(m).__name__.startswith("Offloaded")]
    with torch.no_grad():
        model(*xs)
    for h in handles:
        h.remove()
    return 4 * sum(sizes)


def weight_bytes(model):
    return sum(4 * p.numel() for n, p in model.named_parameters()
               if n.endswith("weight"))


def step_stats(case, local, remote, xl, xr):
    """One backward of each, the gradients compared (f32), and the remote
    client's figures of it: one call per layer."""
    client = remote.c1._convgrad_client
    client.stats(reset=True)
    loss_of(local(*xl)).backward()
    loss_of(remote(*xr)).backward()
    compare_grads(case, local, remote, xl, xr, 1e-5)
    s = client.stats()
    case.assertEqual(s["calls"], 5)
    return s


class Staging(unittest.TestCase):
    """A server over TCP (no arena): each layer's forward stages its
    weights and src, and its backward sends diff_dst alone."""

    def test_backward_sends_diff_dst_only(self):
        local, remote = models(shm=False, stage=True)
        xl, xr = inputs(), inputs()
        client = remote.c1._convgrad_client
        want = diff_dst_bytes(remote, xr)
        for step in range(2):
            for m in (local, remote):
                m.zero_grad()
            s = step_stats(self, local, remote, xl, xr)
            self.assertEqual(s["bytes_sent"], want)
            weights = weight_bytes(remote)
            if step == 0:
                self.assertGreater(s["staged_bytes"], weights)
            else:  # the same weights: present, not sent again
                self.assertLess(s["staged_bytes"], s["bytes_sent"] * 4)
            self.assertEqual(s["retries"], 0)  # every staged id found
        self.assertFalse(client._stage_off)

    def test_stage_false_sends_everything(self):
        local, remote = models(shm=False, stage=False)
        xl, xr = inputs(), inputs()
        s = step_stats(self, local, remote, xl, xr)
        self.assertEqual(s["staged_bytes"], 0)
        self.assertGreater(s["bytes_sent"], diff_dst_bytes(remote, xr))

    def test_pipelined_stages_the_weights_only(self):
        """Client(replicas=1): a layer call's parts pipeline over the one
        server (conv_backward_async: 2 parts), and offload's forward
        stages only the weights, which every part names (each part sends
        its share of src); the gradients equal local's within f32's
        summation tolerance."""
        local, remote = models(shm=False, stage=True, replicas=1,
                               split_parts=2, split_min_flops=1)
        xl, xr = inputs(), inputs()
        client = remote.c1._convgrad_client
        x, dy = xr[1].detach(), torch.ones(2, 8, 10, 10)
        attrs = dict(pads_begin=[2, 2], pads_end=[2, 2], dilations=[2, 2],
                     groups=2, data_format="NCX", weights_format="OIX")
        got, res = client.conv_backward_async(
            x, dy, remote.c2a.weight.detach(), with_result=True,
            **attrs).result()
        self.assertEqual(res.worker, "2 parts")
        x.requires_grad_(True)
        ref = torch.nn.functional.conv2d(x, remote.c2a.weight.detach(),
                                         padding=2, dilation=2, groups=2)
        ref.backward(dy)
        self.assertLess((got["diff_src"] - x.grad).abs().max(), 1e-5)
        s = step_stats(self, local, remote, xl, xr)
        self.assertGreater(s["staged_bytes"], 0)
        self.assertLessEqual(s["staged_bytes"], weight_bytes(remote))

    def test_default_stages(self):
        """stage=True is the default, on one core as on many; anything
        but True or False is refused."""
        local, remote = models(shm=False)
        xl, xr = inputs(), inputs()
        s = step_stats(self, local, remote, xl, xr)
        self.assertGreater(s["staged_bytes"], 0)
        self.assertEqual(s["retries"], 0)
        with self.assertRaisesRegex(ValueError, "stage='auto'"):
            models(stage="auto")

    def refusing_private(self, message):
        """Two steps of a model whose client's private Stage calls fail
        INVALID_ARGUMENT with message, and no call fails; returns the
        client, the bytes the second step's calls sent beyond diff_dst
        and whether that step tried a private id."""
        local, remote = models(shm=False, stage=True)
        client = remote.c1._convgrad_client
        stage, kinds = client.stage, []

        def refusing(a, deadline=None, private=False):
            kinds.append(private)
            if private:
                raise convgrad.errors.InvalidArgument(message)
            return stage(a, deadline)
        xl, xr = inputs(), inputs()
        with mock.patch.object(client, "stage", refusing):
            step_stats(self, local, remote, xl, xr)
            self.assertIn(True, kinds)
            kinds.clear()
            for m in (local, remote):
                m.zero_grad()
            s = step_stats(self, local, remote, xl, xr)
        self.assertFalse(client._stage_off)
        return (client, s["bytes_sent"] - diff_dst_bytes(remote, xr),
                True in kinds)

    def test_src_by_private_id_until_refused(self):
        """src goes under a private id (no hash), the weights by content;
        a server that refuses private ids (it predates them: the bytes do
        not hash to the id, in server/upload.c's words) gets src by
        content from the next forward on: only diff_dst is sent."""
        client, extra, private = self.refusing_private(
            "header.sha256: the 384 bytes sent hash to 5e2f...c0; nothing "
            "was staged")
        self.assertFalse(client._private_ids)
        self.assertFalse(private)
        self.assertEqual(extra, 0)

    def test_other_refusal_keeps_private_ids(self):
        """A private Stage refused INVALID_ARGUMENT for another reason
        than its id (here a header's data longer than its byte_size) says
        nothing of the server: that src goes as bytes, and the next
        forward stages src under a private id again."""
        client, extra, private = self.refusing_private(
            "header.data: 400 bytes, more than byte_size 384")
        self.assertTrue(client._private_ids)
        self.assertTrue(private)
        self.assertGreater(extra, 0)

    def test_shared_input_staged_once(self):
        """Two convolutions of one input (a ResNet block's first conv and
        its downsample): its private stage is started once and both
        backward calls name it; another tensor of the same values is
        staged anew (the entries go by identity, never content)."""
        torch.manual_seed(0)
        local = nn.ModuleDict(dict(a=nn.Conv2d(4, 6, 3, padding=1),
                                   b=nn.Conv2d(4, 6, 1, bias=False)))
        remote = ct.offload(copy.deepcopy(local), SERVER.target, shm=False,
                            stage=True)
        client = remote.a._convgrad_client
        stage_async, privates = client.stage_async, []

        def record(t, private=False):
            privates.append(private)
            return stage_async(t, private=private)
        x = torch.randn(2, 4, 7, 7)
        for changed in (False, True):
            grads = []
            for m in (local, remote):
                m.zero_grad()
                xs = x.clone()
                with mock.patch.object(client, "stage_async", record):
                    ya = m.a(xs)
                    yb = m.b(xs.clone() if changed else xs)
                (ya.square().sum() + yb.sum()).backward()
                grads.append([p.grad for p in m.parameters()])
            for g, h in zip(*grads):
                self.assertLess((g - h).abs().max(), 1e-5)
            self.assertEqual(privates.count(True), 2 if changed else 1)
            privates.clear()
        client.close()

    def test_round_robin_pool_turns_staging_off(self):
        """Two servers behind one round_robin target (an address list):
        a layer's src and weights are staged on both (consecutive calls
        alternate), so its backward finds one missing and is retried with
        the bytes. After the first such calls libcgclient turns staging
        off for the channel: offload's staging says so once, with what to
        do, and stops; no call is retried after."""
        other = cgtest.Server(ARGS.server)
        client = convgrad.Client(SERVER.target + "," + other.target,
                                 shm=False)
        try:
            for _ in range(4):  # both servers connected
                client.info()
            g = torch.Generator().manual_seed(5)
            attrs = dict(pads_begin=[1, 1], pads_end=[1, 1],
                         data_format="NCX", weights_format="OIX")
            retries, off_at = [], None
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for k in range(12):
                    x = torch.randn(2, 4, 9, 9, generator=g)
                    w = torch.randn(6, 4, 3, 3, generator=g)
                    dy = torch.randn(2, 6, 9, 9, generator=g)
                    want = client.conv_backward(x, dy, w, **attrs)
                    staged = None
                    if not client._stage_off:
                        staged = (client.stage_async(x),
                                  client.stage_async(w))
                    sx, sw = ct._staged_or(client, staged, x, w)
                    if client._stage_off and off_at is None:
                        off_at = k
                    client.stats(reset=True)
                    got = client.conv_backward(sx, dy, sw, **attrs)
                    retries.append(client.stats()["retries"])
                    for n in want:
                        self.assertLess(cgtest.rel_err(got[n], want[n]),
                                        1e-5, n)
            print("retries per call:", retries, file=sys.stderr)
            said = [str(m.message) for m in caught
                    if "staging off" in str(m.message)]
            self.assertEqual(len(said), 1, said)
            self.assertIn("one server's address", said[0])
            self.assertIsNotNone(off_at)
            self.assertLessEqual(off_at, 8)
            self.assertEqual(sum(retries[off_at:]), 0, retries)
            self.assertLessEqual(sum(retries), 4, retries)
        finally:
            client.close()
            other.stop()

    def test_staged_array_in_a_call(self):
        client = convgrad.Client(SERVER.target, shm=False)
        g = torch.Generator().manual_seed(3)
        x = torch.randn(2, 4, 9, 9, generator=g)
        w = torch.randn(6, 4, 3, 3, generator=g)
        dy = torch.randn(2, 6, 9, 9, generator=g)
        attrs = dict(pads_begin=[1, 1], pads_end=[1, 1], data_format="NCX",
                     weights_format="OIX")
        ref = client.conv_backward(x, dy, w, **attrs)
        sx, sw = client.stage(x), client.stage_async(w).result()
        self.assertFalse(sx.present)
        self.assertTrue(client.stage(w).present)
        client.stats(reset=True)
        got = client.conv_backward(sx, dy, sw, **attrs)
        for k in ref:
            self.assertTrue(torch.equal(ref[k], got[k]), k)
        self.assertEqual(client.stats()["bytes_sent"], dy.numel() * 4)
        client.close()


class Wire(unittest.TestCase):
    """offload's wire=: f32 layers' tensors travel as bf16 with "bf16"
    (opt-in), as they are by default."""

    def step(self, wire, **options):
        """One step of local autograd and of an offloaded copy on a client
        of its own; returns (local, remote, inputs local, inputs remote,
        the client's stats)."""
        local, remote = models(wire=wire, **options)
        xl, xr = inputs(), inputs()
        client = remote.c1._convgrad_client
        client.stats(reset=True)
        loss_of(local(*xl)).backward()
        loss_of(remote(*xr)).backward()
        s = client.stats()
        client.close()
        return local, remote, xl, xr, s

    def grads(self, model, xs):
        return [(n, p.grad) for n, p in model.named_parameters()] + [
            ("input %d" % i, x.grad) for i, x in enumerate(xs)
            if x.requires_grad]

    def test_bf16_wire_rounds_and_halves_the_bytes(self):
        # Staging off: every input goes with the backward's call, so each
        # byte sent and received is one of a tensor's.
        local, f32, xl, xf, sf = self.step("f32", shm=False, stage=False)
        _, bf16, _, xb, sb = self.step("bf16", shm=False, stage=False)
        self.assertEqual(sb["calls"], sf["calls"])
        self.assertEqual(sb["bytes_sent"] * 2, sf["bytes_sent"])
        self.assertEqual(sb["bytes_received"] * 2, sf["bytes_received"])
        # The default is f32 on the wire: local's gradients.
        compare_grads(self, local, f32, xl, xf, 1e-6)
        # bf16: f32 gradients, within a few bf16 roundings (8 significant
        # bits, 2^-9 relative each) of local's but not equal to them.
        for (name, ref), (_, got) in zip(self.grads(local, xl),
                                         self.grads(bf16, xb)):
            self.assertEqual(got.dtype, torch.float32, name)
            self.assertLess(cgtest.rel_err(got, ref), 2e-2, name)
            self.assertFalse(torch.equal(got, ref), name)

    def test_bf16_wire_stages_bf16(self):
        # Staging (the default over TCP): the weights the forward stages and
        # the inputs are bf16, staged once each, and the backward sends
        # diff_dst alone, as bf16.
        local, remote = models(shm=False, stage=True, wire="bf16")
        client = remote.c1._convgrad_client
        staged = []
        stage_async = client.stage_async

        def record(t, private=False):
            staged.append((t.dtype, private))
            return stage_async(t, private=private)
        xl, xr = inputs(), inputs()
        want = diff_dst_bytes(remote, xr) // 2
        with mock.patch.object(client, "stage_async", record):
            client.stats(reset=True)
            loss_of(local(*xl)).backward()
            loss_of(remote(*xr)).backward()
        compare_grads(self, local, remote, xl, xr, 2e-2)
        self.assertEqual(client.stats()["bytes_sent"], want)
        self.assertFalse(client._stage_off)
        # 5 weights by content, and the inputs of the 5 layers by private
        # ids
        self.assertEqual(sorted(staged), [(torch.bfloat16, False)] * 5 +
                         [(torch.bfloat16, True)] * 5)
        client.close()

    def test_bf16_wire_over_regions(self):
        local, remote, xl, xr, s = self.step("bf16")
        self.assertGreater(s["arena_bytes"], 0)
        compare_grads(self, local, remote, xl, xr, 2e-2)
        self.assertFalse(torch.equal(remote.c2a.weight.grad,
                                     local.c2a.weight.grad))

    def test_unknown_wire(self):
        with self.assertRaisesRegex(ValueError, "wire='fp8'"):
            ct.offload(Net(), SERVER.target, wire="fp8")


class DataFirst(unittest.TestCase):
    """The server sends grad_input as soon as it is computed, and offload
    hands it to autograd then, over bytes as over regions."""

    def test_grad_input_whole_before_weight_gradient_computed(self):
        # 3x3 64->64 at 56x56, batch 16: diff_src and diff_weights cost
        # the same work. The outputs are slots of the arena, so that each
        # arrives as its header: the client has diff_src whole while
        # diff_weights is computed, and from then to the call's end takes
        # at least a quarter of the call's compute (about half; sent after
        # diff_weights' compute, as before, a header's time). The outputs
        # are torch's.
        g = torch.Generator().manual_seed(3)
        x, gy = (torch.randn(16, 64, 56, 56, generator=g) for _ in "ab")
        w = torch.randn(64, 64, 3, 3, generator=g) / 24
        want = torch.ops.aten.convolution_backward(
            gy, x, w, [0], [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
            [True, True, False])
        client = convgrad.Client(SERVER.target)
        arena = client.arena()
        self.assertIsNotNone(arena)
        gaps = []
        for _ in range(3):  # the first builds the primitives
            out = {"diff_src": arena.tensor(x.shape, torch.float32),
                   "diff_weights": arena.tensor(w.shape, torch.float32)}
            f = client.conv_backward_async(
                x, gy, w, outputs=list(out), out=out, with_result=True,
                strides=[1, 1], pads_begin=[1, 1], pads_end=[1, 1],
                dilations=[1, 1], groups=1, data_format="NCX",
                weights_format="OIX")
            f.output("diff_src")
            t = time.perf_counter()
            _, res = f.result()
            gaps.append((time.perf_counter() - t) * 1e3 / res.compute_ms)
            self.assertLess(cgtest.rel_err(out["diff_src"], want[0]), 2e-5)
            self.assertLess(cgtest.rel_err(out["diff_weights"], want[1]),
                            2e-5)
        del out
        client.close()
        self.assertGreater(max(gaps), 0.25, gaps)

    def test_over_bytes_grad_input_goes_on_before_weight_gradient(self):
        # Offload's default over TCP: t2's grad_input goes on through
        # autograd while its weight gradient is still on its way, in one
        # call per layer; the gradients are local's.
        local, remote = models(shm=False)
        client = remote.c1._convgrad_client
        client.stats(reset=True)
        xl, xr = inputs(), inputs()
        seen = []

        def watch(m, inp):
            inp[0].register_hook(lambda g: seen.append(m.weight.grad is None))
        remote.t2.register_forward_pre_hook(watch)
        loss_of(local(*xl)).backward()
        loss_of(remote(*xr)).backward()
        self.assertEqual(seen, [True])
        compare_grads(self, local, remote, xl, xr, 1e-5)
        s = client.stats()
        self.assertEqual((s["calls"], s["arena_bytes"]), (5, 0))
        self.assertGreater(s["bytes_received"], 0)


class Regions(unittest.TestCase):
    """Same host: shared memory, overlap, and the ways back to bytes."""

    def test_no_bytes_on_the_wire_and_nothing_registered_per_call(self):
        local, remote = models(overlap=False)
        client = remote.c1._convgrad_client
        registered = len(SERVER.log_lines("region op=register"))
        client.stats(reset=True)
        train(self, local, remote, steps=3)
        s = client.stats()
        self.assertEqual(s["calls"], 15)
        self.assertEqual((s["bytes_sent"], s["bytes_received"]), (0, 0))
        self.assertGreater(s["arena_bytes"], 0)
        # one region holds this model's tensors: registered on first use
        self.assertEqual(
            len(SERVER.log_lines("region op=register")) - registered, 1)
        client.close()
        self.assertFalse([n for n in os.listdir("/dev/shm")
                          if n.startswith("convgrad-%d-" % os.getpid())])

    def test_weights_live_in_the_arena(self):
        # The weights that train move into the arena at their layer's
        # first forward, where the optimizer updates them in place: a
        # step takes arena slots for each layer's input, grad_output and
        # gradients, none for its weight. restore() moves them back.
        local, remote = models()
        client = remote.c1._convgrad_client
        convs = [remote.c1, remote.c3, remote.c2a, remote.c2b, remote.t2]
        with torch.no_grad():
            remote(*inputs())
        self.assertIsNone(client._arena)  # an inference forward: left
        train(self, local, remote, steps=1)
        arena = client.arena()

        def resident(m):
            return arena.holds(m.weight.data_ptr(), 4 * m.weight.numel())
        self.assertTrue(all(resident(m) for m in convs))
        where = [m.weight.data_ptr() for m in convs]
        slots = []
        take = arena.array
        arena.array = lambda *a: slots.append(a) or take(*a)
        try:
            train(self, local, remote, steps=2)
        finally:
            del arena.array
        self.assertEqual([m.weight.data_ptr() for m in convs], where)
        outputs = sum(1 + (m.bias is not None) + 1 for m in convs)
        self.assertEqual(len(slots), 2 * (2 * len(convs) + outputs))
        ct.restore(remote)
        self.assertFalse(any(resident(m) for m in convs))
        train(self, local, remote, steps=1)

    def test_exit_after_a_failed_pass(self):
        # A pass that raises leaves tasks holding the arena's gradients in
        # the autograd engine's thread-local ready queue; they are freed
        # with the thread's thread-local storage, after the interpreter
        # finalized, where a tensor whose release takes the GIL (one made
        # by torch.from_numpy) hung the process.
        code = textwrap.dedent("""
            import sys
            import torch
            import torch.nn as nn
            import convgrad.torch as ct
            m = ct.offload(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(),
                                         nn.Conv2d(8, 8, 3)), sys.argv[1])
            m[2].weight.register_hook(lambda g: 1 / 0)
            x = torch.randn(2, 3, 16, 16, requires_grad=True)
            try:
                m(x).sum().backward()
            except ZeroDivisionError:
                pass
            assert m[0]._convgrad_client.arena() is not None
            """)
        env = dict(os.environ, PYTHONPATH=os.path.dirname(
            os.path.dirname(convgrad.__file__)))
        try:
            p = subprocess.run([sys.executable, "-c", code, SERVER.target],
                               env=env, capture_output=True, text=True,
                               timeout=60)
        except subprocess.TimeoutExpired:
            self.fail("the process did not exit in 60 s")
        self.assertEqual(p.returncode, 0, p.stderr)

    def test_overlap_defers_weight_gradients(self):
        # With overlap, t2's grad_input goes on through autograd while its
        # weight gradient is still on its way (settled when a later layer
        # defers, or at the end of the pass); without, t2's AccumulateGrad
        # ran before anything below t2. The gradients are the same.
        for overlap in (True, False):
            with self.subTest(overlap=overlap):
                local, remote = models(overlap=overlap)
                client = remote.c1._convgrad_client
                client.stats(reset=True)
                xl, xr = inputs(), inputs()
                seen = []

                def watch(m, inp):
                    inp[0].register_hook(
                        lambda g: seen.append(m.weight.grad is None))
                remote.t2.register_forward_pre_hook(watch)
                loss_of(local(*xl)).backward()
                loss_of(remote(*xr)).backward()
                self.assertEqual(seen, [overlap])
                self.compare(local, remote, xl, xr)
                # one call per layer either way: the server sends
                # grad_input first, the weight's gradients after it
                self.assertEqual(client.stats()["calls"], 5)

    def test_overlap_after_a_failed_pass(self):
        # A pass that raises after t2 and c2b deferred runs no
        # end-of-backward callback; the next pass, gradients zeroed before
        # its forward as a trainer does, must still settle all of its own
        # and none of the failed pass's.
        local, remote = models(overlap=True)
        xr = inputs()
        xr[1].register_hook(lambda g: 1 / 0)  # after t2's, c2b's, c2a's
        with self.assertRaises(ZeroDivisionError):
            loss_of(remote(*xr)).backward()
        remote.zero_grad(set_to_none=True)
        xl, xr = inputs(), inputs()
        loss_of(local(*xl)).backward()
        loss_of(remote(*xr)).backward()
        self.compare(local, remote, xl, xr)

    def compare(self, local, remote, xl, xr):
        compare_grads(self, local, remote, xl, xr, 1e-5)

    def test_backward_threads(self):
        # The server shares this process's cores (it runs on all of them).
        # By default torch's idle OpenMP threads are ended right before
        # each layer's call and torch keeps its thread count, whether the
        # tensors go through the arena or as bytes; where OpenMP cannot end
        # them, the pass runs on one thread from the first offloaded layer
        # on. None leaves the threads alone, a count narrows the pass; torch
        # has its own count again after the pass.
        releases = (ct._omp_pause_resource_all is not None and
                    ct._torch_runs_on_omp())
        real_pause = ct._omp_pause_resource_all
        pauses = []

        def pause(kind):
            pauses.append(kind)
            return real_pause(kind)
        before = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            for want, shm, during, ended in (
                    ("auto", "auto", 2 if releases else 1, releases),
                    ("auto", False, 2 if releases else 1, releases),
                    (None, "auto", 2, False), (1, "auto", 1, False)):
                with self.subTest(backward_threads=want, shm=shm):
                    local, remote = models(backward_threads=want, shm=shm)
                    xl, xr = inputs(), inputs()
                    seen = []
                    # c2a's input: its gradient comes after t2's, c2b's
                    # and c2a's backward
                    xr[1].register_hook(
                        lambda g: seen.append(torch.get_num_threads()))
                    loss_of(local(*xl)).backward()
                    client = remote.c1._convgrad_client
                    client.stats(reset=True)
                    del pauses[:]
                    # torch.set_num_threads empties ideep's cache of
                    # forward convolutions: the next forward would make
                    # them anew
                    with mock.patch.object(torch, "set_num_threads") as tset, \
                            mock.patch.object(ct, "_omp_pause_resource_all",
                                              pause if real_pause else None):
                        loss_of(remote(*xr)).backward()
                    if ct._omp_set_num_threads is not None:
                        tset.assert_not_called()
                    self.assertEqual(seen, [during])
                    calls = client.stats()["calls"]
                    self.assertEqual(pauses, [ct._OMP_PAUSE_SOFT] * calls
                                     if ended else [])
                    self.assertEqual(torch.get_num_threads(), 2)
                    self.compare(local, remote, xl, xr)
            with self.assertRaisesRegex(ValueError, "backward_threads"):
                models(backward_threads=0)
        finally:
            torch.set_num_threads(before)

    def test_idle_threads_end(self):
        # What backward_threads='auto' relies on: after a parallel op on 2
        # threads, the pool's other thread stays (spinning, then asleep)
        # until omp_pause_resource_all ends it; the next op starts it anew.
        if ct._omp_pause_resource_all is None or not ct._torch_runs_on_omp():
            self.skipTest("torch's OpenMP cannot end its idle threads")
        before = torch.get_num_threads()
        torch.set_num_threads(2)
        x = torch.randn(1 << 22)

        def tasks():
            return set(os.listdir("/proc/self/task"))

        def wait_for(cond, timeout=5.0):
            # a thread leaves /proc once it has exited
            until = time.monotonic() + timeout
            while not cond() and time.monotonic() < until:
                time.sleep(0.01)
            return cond()
        try:
            torch.relu(x)
            with_pool = tasks()
            self.assertEqual(ct._omp_pause_resource_all(ct._OMP_PAUSE_SOFT),
                             0)
            self.assertTrue(wait_for(lambda: with_pool - tasks()))
            torch.relu(x)
            self.assertTrue(tasks() - with_pool)
        finally:
            torch.set_num_threads(before)

    def test_autograd_grad_and_backward_inputs(self):
        # overlap asked for, and not used where the gradients must come
        # back from the layers' backward
        local, remote = models(overlap=True)
        xl, xr = inputs(), inputs()
        gl = torch.autograd.grad(loss_of(local(*xl)),
                                 [local.c2a.weight, xl[1]])
        gr = torch.autograd.grad(loss_of(remote(*xr)),
                                 [remote.c2a.weight, xr[1]])
        for a, b in zip(gl, gr):
            self.assertLess(cgtest.rel_err(b, a), 1e-5)
        self.assertIsNone(remote.c2a.weight.grad)
        # inputs= leaves the weights out: none may receive a gradient
        loss_of(remote(*xr)).backward(inputs=[xr[1]])
        self.assertIsNone(remote.c2a.weight.grad)
        self.assertLess(cgtest.rel_err(xr[1].grad, gl[1]), 1e-5)

    def fallback(self, target, why, **options):
        """Training over target goes by bytes, says why once (debug)."""
        local, remote = models(target=target, **options)
        client = remote.c1._convgrad_client
        with self.assertLogs("convgrad", logging.DEBUG) as logs:
            train(self, local, remote)
        self.assertEqual(len(logs.records), 1, logs.output)
        self.assertIn(why, logs.output[0])
        s = client.stats()
        self.assertIsNone(client.arena())
        self.assertGreater(s["bytes_sent"], 0)
        self.assertGreater(s["bytes_received"], 0)

    def test_fallback_remote_address(self):
        # The server on every address; the client at a non-loopback one.
        addr = subprocess.run(["hostname", "-I"], capture_output=True,
                              text=True).stdout.split()
        addr = [a for a in addr if ":" not in a]
        if not addr:
            self.skipTest("no non-loopback IPv4 address")
        srv = cgtest.Server(ARGS.server, listen="0.0.0.0:0")
        try:
            self.fallback("%s:%d" % (addr[0], srv.port), "not on this host")
        finally:
            srv.stop()

    def test_fallback_shm_off(self):
        srv = cgtest.Server(ARGS.server, extra=["--shm", "off"])
        try:
            self.fallback(srv.target, "serves no regions")
        finally:
            srv.stop()

    def test_fallback_not_found(self):
        # A server with a /dev/shm of its own, as in another container:
        # RegisterRegion answers NOT_FOUND for the client's objects.
        prefix = ["unshare", "-m", "sh", "-c",
                  "mount -t tmpfs tmpfs /dev/shm && exec \"$0\" \"$@\""]
        if subprocess.run(prefix[:-1] + ["true"],
                          capture_output=True).returncode != 0:
            self.skipTest("cannot unshare a mount namespace here")
        srv = cgtest.Server(ARGS.server, prefix=prefix)
        try:
            self.fallback(srv.target, "NOT_FOUND")
        finally:
            srv.stop()

    def test_server_restart_mid_training(self):
        d = tempfile.mkdtemp(prefix="cgpy-restart-")
        sock = os.path.join(d, "s.sock")
        srv = cgtest.Server(ARGS.server, listen="unix:" + sock)
        try:
            local, remote = models(target="unix:" + sock)
            client = remote.c1._convgrad_client
            train(self, local, remote, steps=1)
            # Killed and back: the library registers the regions again.
            srv.proc.kill()
            srv.proc.wait()
            srv = cgtest.Server(ARGS.server, listen="unix:" + sock)
            client.stats(reset=True)
            train(self, local, remote, steps=1)
            self.assertIsNotNone(client.arena())
            self.assertEqual(client.stats()["bytes_sent"], 0)
            # the arena's regions (calls that found them unknown at once
            # may each register them again)
            names = {re.search(r" name=(\S+)", line).group(1)
                     for line in srv.log_lines("region op=register")}
            self.assertEqual(names, {sp.region.key[1:]
                                     for sp in client.arena()._spaces})
            # Back without regions: bytes from then on, said once.
            srv.proc.kill()
            srv.proc.wait()
            srv = cgtest.Server(ARGS.server, listen="unix:" + sock,
                                extra=["--shm", "off"])
            with self.assertLogs("convgrad", logging.DEBUG) as logs:
                train(self, local, remote, steps=2)
            self.assertEqual(len(logs.records), 1, logs.output)
            self.assertIn("failed", logs.output[0])
            self.assertIsNone(client.arena())
            self.assertGreater(client.stats()["bytes_sent"], 0)
        finally:
            srv.stop()
            os.rmdir(d) if not os.listdir(d) else None


class LocalShare(unittest.TestCase):
    """offload(local_share=): the trainer computes the first rows of each
    layer call itself (torch) while the server computes the rest; the
    gradients are within f32's summation tolerance of local's, and the
    same bits from one pass to the next."""

    def grads(self, model, xs):
        model.zero_grad()
        xs = [x.detach().requires_grad_() for x in xs]
        loss_of(model(*xs)).backward()
        return [p.grad.clone() for p in model.parameters()] + [
            x.grad.clone() for x in xs]

    def step(self, local, remote):
        """One training step's backward of each on fresh inputs, the
        gradients compared (f32)."""
        xl, xr = inputs(), inputs()
        for m in (local, remote):
            m.zero_grad()
        loss_of(local(*xl)).backward()
        loss_of(remote(*xr)).backward()
        compare_grads(self, local, remote, xl, xr, 1e-5)

    def check_half(self, **options):
        local, remote = models(local_share=0.5, **options)
        xl, xr = inputs(), inputs()
        s = step_stats(self, local, remote, xl, xr)
        if options.get("shm") is not False:
            return remote, xr
        # The server computed and sent the second row of each grad_input.
        self.assertEqual(s["bytes_received"],
                         expected_download(remote, xr, own=1))
        return remote, xr

    def test_half_over_bytes_and_repeatable(self):
        remote, xs = self.check_half(shm=False, stage=True)
        first = self.grads(remote, xs)
        for _ in range(2):  # the next steps stage src's server rows only
            for a, b in zip(first, self.grads(remote, xs)):
                self.assertTrue(torch.equal(a, b))
        _, other = models(local_share=0.5, shm=False)  # another client
        for a, b in zip(first, self.grads(other, xs)):
            self.assertTrue(torch.equal(a, b))

    def test_half_over_regions(self):
        remote, xs = self.check_half()
        self.assertIsNotNone(remote.c1._convgrad_client.arena())
        first = self.grads(remote, xs)
        for a, b in zip(first, self.grads(remote, xs)):
            self.assertTrue(torch.equal(a, b))

    def test_auto_measures_then_keeps_a_cut(self):
        """The first call of each shape on the server, the second here
        (no call), the third on the server, measured; then a cut, kept."""
        local, remote = models(local_share="auto", shm=False)
        client = remote.c1._convgrad_client
        calls = []
        for step in range(4):
            client.stats(reset=True)
            self.step(local, remote)
            calls.append(client.stats()["calls"])
        self.assertEqual(calls[:3], [5, 0, 5])
        shares = [sh for m in remote.modules()
                  for sh in getattr(m, "_convgrad_shares", {}).values()]
        self.assertEqual(len(shares), 5)
        for sh in shares:
            self.assertIn(sh.rows, (0, 1))

    def test_auto_costs_the_trainer_at_its_cpu_quota(self):
        """Under a CPU quota the trainer's time for a call is what its
        CPU costs at the quota's rate: at a millionth of a core every
        shape's measured time is over a second, and the trainer takes no
        rows."""
        with mock.patch.object(convgrad._quota, "cpu_quota",
                               return_value=(1e-6, 0.0)):
            local, remote = models(local_share="auto", shm=False)
            for step in range(4):
                self.step(local, remote)
        shares = [sh for m in remote.modules()
                  for sh in getattr(m, "_convgrad_shares", {}).values()]
        self.assertEqual(len(shares), 5)
        for sh in shares:
            self.assertGreater(sh.local_ms, 1000.0)
            self.assertEqual(sh.rows, 0)

    def test_cpu_quota_of_cgroups(self):
        """The tightest quota of a process's cgroup and those above it,
        in cores, and its own cgroup's throttled ms, in cgroup v1 and v2;
        None where no cgroup has one."""
        def tree(root, files):
            for path, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(root, path)),
                            exist_ok=True)
                with open(os.path.join(root, path), "w") as f:
                    f.write(text)
        with tempfile.TemporaryDirectory() as d:
            tree(d, {
                "v1/proc_cgroup": "5:cpu,cpuacct:/a/b\n0::/\n",
                "v1/mounts": "cgroup %s/v1/cpu cgroup rw,cpu,cpuacct 0 0\n"
                             % d,
                "v1/cpu/a/b/cpu.cfs_quota_us": "50000\n",
                "v1/cpu/a/b/cpu.cfs_period_us": "100000\n",
                "v1/cpu/a/b/cpu.stat": "nr_throttled 3\n"
                                       "throttled_time 3000000\n",
                "v1/cpu/a/cpu.cfs_quota_us": "20000\n",
                "v1/cpu/a/cpu.cfs_period_us": "100000\n",
                "v1/cpu/cpu.cfs_quota_us": "-1\n",
                "v1/cpu/cpu.cfs_period_us": "100000\n",
                "v2/proc_cgroup": "0::/x/y\n",
                "v2/mounts": "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n",
                "v2/root/x/y/cpu.max": "max 100000\n",
                "v2/root/x/y/cpu.stat": "usage_usec 9\nthrottled_usec 2500\n",
                "v2/root/x/cpu.max": "150000 100000\n",
                "none/proc_cgroup": "0::/x\n",
                "none/mounts": "",
                "none/root/x/cpu.max": "max 100000\n"})

            def quota(kind):
                return convgrad._quota.cpu_quota(
                    os.path.join(d, kind, "proc_cgroup"),
                    os.path.join(d, kind, "mounts"),
                    os.path.join(d, kind, "root"))
            self.assertEqual(quota("v1"), (0.2, 3.0))
            self.assertEqual(quota("v2"), (1.5, 2.5))
            self.assertEqual(quota("none"), (None, 0.0))
        self.assertEqual(convgrad._quota.sustained_ms(40, 40, None), 40)
        self.assertEqual(convgrad._quota.sustained_ms(40, 40, 0.5), 80)
        self.assertEqual(convgrad._quota.sustained_ms(40, 10, 0.5), 40)

    def test_model_of_the_share(self):
        """cgc_local_rows: equal speeds over a fast link split the
        minibatch in two; a server 3x slower takes a quarter; a server
        10x faster than the trainer takes it all."""
        client = convgrad.Client(SERVER.target, split_min_flops=1)
        x, w = torch.randn(8, 16, 32, 32), torch.randn(16, 16, 3, 3)
        attrs = dict(pads_begin=[1, 1], pads_end=[1, 1], data_format="NCX",
                     weights_format="OIX")

        def rows(server_ms, local_ms):
            r = convgrad._lib.Result()
            r.compute_ms, r.total_ms = server_ms, server_ms + 1
            r.bytes_sent = 10 ** 9  # a link of a GB/ms: bytes cost nothing
            return client.local_rows(x, x, w, convgrad.CallResult(r),
                                     local_ms, **attrs)
        self.assertEqual(rows(100, 100), 4)
        self.assertEqual(rows(300, 100), 6)
        self.assertEqual(rows(10, 100), 0)
        with self.assertRaises(ValueError):
            models(local_share=1)
        client.close()


def main():
    global SERVER, ARGS
    ARGS = args = cgtest.parse_args(__doc__)
    SERVER = cgtest.Server(args.server)
    try:
        prog = unittest.main(argv=[sys.argv[0], "-v"], exit=False)
    finally:
        SERVER.stop()
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
