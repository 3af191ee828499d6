"""PyTorch integration: convgrad.torch.offload(model, target) makes the
backward of every convolution of a model run on a convgrad server.

    model = convgrad.torch.offload(model, "localhost:50051")
    loss = model(x).sum(); loss.backward()   # conv gradients: on the server

The forward stays in torch. The backward of each layer is one call: the
layer op (ConvolutionBackward / ConvTransposeBackward) sends the input,
grad_output and the weight once and answers the gradients autograd asks
for (needs_input_grad) among grad_input, grad_weight and grad_bias; a layer
whose weight and bias are frozen asks ConvolutionBackwardData /
ConvTransposeBackwardData for grad_input alone, without uploading the
input. With the server on this host the tensors go through the client's
arena of shared-memory regions (convgrad.Client's shm=). The server sends
grad_input as soon as it is computed, before the weight's gradient, and
(overlap=, on by default where it is safe) grad_input goes on through
autograd while the weight and bias gradients are computed and sent,
settled at the end of the backward pass. With the server on cores of
this process, torch's idle threads are ended before each call
(backward_threads=), not spinning on the server's cores."""
import ctypes
import functools
import os
import re
import threading
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd import Variable
from torch.autograd.function import once_differentiable

from . import _quota
from .client import Client, Staged, _on_this_host
from .errors import Error

__all__ = ["offload", "restore"]


def _pads(m):
    """pads_begin and pads_end of module m as torch applies them: 'same'
    puts the odd unit at the end, like torch's own F.pad for it."""
    n = len(m.kernel_size)
    if m.padding == "valid":
        return [0] * n, [0] * n
    if m.padding == "same":
        total = [d * (k - 1) for d, k in zip(m.dilation, m.kernel_size)]
        begin = [t // 2 for t in total]
        return begin, [t - b for t, b in zip(total, begin)]
    return list(m.padding), list(m.padding)


def _local_dtype_ok(dtype, transposed):
    # CPU torch has no f16 convolution, and its bf16 conv_transpose (1.13)
    # rejects valid shapes.
    if dtype == torch.float16:
        return False
    return not (dtype == torch.bfloat16 and transposed)


class _ConvFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, m, output_padding):
        transposed = isinstance(m, _TRANSPOSED)
        n = len(m.kernel_size)
        begin, end = _pads(m)
        fn = _FORWARD[n][transposed]
        if transposed:
            def run(x, w, b):
                return fn(x, w, b, m.stride, m.padding, output_padding,
                          m.groups, m.dilation)
        else:
            def run(x, w, b):
                return fn(x, w, b, m.stride, m.padding, m.dilation, m.groups)
        if torch.is_autocast_cpu_enabled():
            # Whatever dtype autocast runs this op in is the one the server
            # computes the gradients in.
            y = run(x, weight, bias)
            dt = y.dtype
        else:
            dt = x.dtype
            if _local_dtype_ok(dt, transposed):
                y = run(x, weight, bias)
            else:
                y = run(x.float(), weight.float(),
                        None if bias is None else bias.float()).to(dt)
        # Saved as they are: the backward casts them to dt where they go
        # (the arena, or memory to upload from), in one pass.
        ctx.save_for_backward(x, weight)
        # The dtype of the backward's call: dt, or bf16 for f32 on a bf16
        # wire (offload's wire=).
        ctx.dt = dt = _wire_dtype(m, dt)
        ctx.m = m
        ctx.dtypes = (x.dtype, weight.dtype,
                      None if bias is None else bias.dtype)
        ctx.attrs = dict(strides=list(m.stride), pads_begin=begin,
                         pads_end=end, dilations=list(m.dilation),
                         groups=m.groups, data_format="NCX",
                         weights_format="IOX" if transposed else "OIX")
        if transposed:
            ctx.attrs["output_padding"] = list(output_padding)
        ctx.transposed = transposed
        ctx.staged = _stage_inputs(m, ctx.needs_input_grad, x, weight, dt)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        m, dt = ctx.m, ctx.dt
        need = ctx.needs_input_grad[:3]
        if not any(need):
            return None, None, None, None, None
        client = m._convgrad_client
        arena = client.arena()
        m._convgrad_threads.narrow(client)
        share = _share_of(ctx, x, w, need)
        xs, ws = x, w  # the trainer's share computes from these
        x, w = _staged_or(client, ctx.staged, x, w)
        ctx.staged = None
        gy, w = _place(arena, gy, dt), _place(arena, w, dt)
        out = {}
        if need[0]:
            out["diff_src"] = _empty(arena, xs.shape, dt)
        if need[1]:
            out["diff_weights"] = _empty(arena, w.shape, dt)
        if need[2]:
            out["diff_bias"] = _empty(arena, (
                w.shape[1] * m.groups if ctx.transposed else w.shape[0],), dt)
        # grad_input alone: the BackwardData op needs no input tensor.
        data_only = not (need[1] or need[2])
        if not data_only:
            x = _place(arena, x, dt)
        m._convgrad_threads.before_call(client)
        if data_only:
            _data_call(client, ctx, gy, w, xs.shape, out["diff_src"])
            return out["diff_src"].to(ctx.dtypes[0]), None, None, None, None
        measuring = None
        if share is not None and share.rows is None:
            # Not decided yet: the first call warms the server's kernels,
            # the second is the trainer's alone, timed, the third the
            # server's, measured (_Share).
            share.calls += 1
            if share.calls == 2:
                grads = share.time(ctx, xs, gy, ws, need)
                return tuple(None if g is None else g.to(t) for g, t in zip(
                    grads, ctx.dtypes)) + (None, None)
            measuring = share if share.calls == 3 else None
        if share is not None and share.rows:
            layer = _SharedLayer(ctx, share.rows, xs, x, gy, ws, w, out)
        else:
            layer = _Layer(ctx, x, gy, w, out, measuring)
        if need[0] and _may_defer(m):
            # grad_input goes on through autograd as soon as it is in (the
            # server sends it first, as soon as it is computed); the weight
            # and bias gradients are settled at the end of the backward
            # pass.
            gx = layer.output("diff_src")
            _defer(layer)
            return gx.to(ctx.dtypes[0]), None, None, None, None
        grads = layer.result()
        return tuple(None if g is None else g.to(t) for g, t in zip(
            (grads.get(k) for k in ("diff_src", "diff_weights", "diff_bias")),
            ctx.dtypes)) + (None, None)


def _stage_inputs(m, needs, x, w, dt):
    """At forward time, for a server off this host (no arena) with a
    store: starts uploading what the backward will need, the weights (for
    every gradient) and src (for the weight's and bias's), on the client's
    staging threads, so that the backward call sends diff_dst alone. src
    goes under a private id: no other caller has it, so a content hash
    (SHA-256 on both sides) would buy nothing. Returns the futures (None
    where nothing is staged), or None."""
    client = m._convgrad_client
    if not (m._convgrad_stage and m._convgrad_grad_on and any(needs[:3])) \
            or client._stage_off or client.arena() is not None:
        return None
    # The bytes the backward would send, cast and made contiguous now. A
    # client that pipelines a call's parts over its server sends each part
    # its share of src whatever is staged (a staged id names the whole
    # tensor): only the weights, which every part names, are staged then.
    share = m._convgrad_shares.get(_share_key(x, needs))
    own = share.rows if share is not None and share.rows else 0
    fx = _stage_src(client, x, own, dt) \
        if (needs[1] or needs[2]) and not client._pipelines else None
    fw = m.__dict__.pop("_convgrad_wfut", None)
    if fw is None or _wire_dtype(m, w.dtype) != dt:
        fw = client.stage_async(w.detach().to(dt).contiguous())
    return fx, fw


def _stage_src(client, x, own, dt):
    """The future of staging x's rows from own on, as dt, under a private
    id: started now, or the one this client started for the same tensor,
    unchanged since, in one of its last three layers' forwards (a ResNet
    block's first conv and its downsample take the same input: 11 MB of
    ResNet-18 224x8's step, which content ids staged once). The entries
    hold x, so that no other tensor can take its place."""
    key = (x, x._version, own, dt)
    for *had, f in client._src_stages:
        if had[0] is x and had[1:] == list(key[1:]):
            return f
    f = client.stage_async(x.detach()[own:].to(dt).contiguous(),
                           private=client._private_ids)
    client._src_stages = [key + (f,)] + client._src_stages[:2]
    return f


def _stage_weights(model, inputs):
    """A forward pre-hook of the model offload() changed: under grad mode,
    starts staging the weights that train of its offloaded layers at once,
    the last layer's first. The backward needs them in that order, and the
    last layers hold most of the weights (ResNet-18's layer4: 33 of 45 MB),
    which their own forward would start staging only as the backward
    begins. Not under autocast, whose forward casts them."""
    del inputs
    if not torch.is_grad_enabled() or torch.is_autocast_cpu_enabled():
        return
    for m in reversed(list(model.modules())):
        if type(m) not in _ORIGINAL or not m._convgrad_stage:
            continue
        client, w = m._convgrad_client, m.weight
        if not w.requires_grad or client._stage_off or \
                client.arena() is not None:
            continue
        m._convgrad_wfut = client.stage_async(
            w.detach().to(_wire_dtype(m, w.dtype)).contiguous())


def _stages(stage):
    """offload's stage=, checked: True or False."""
    if stage in (True, False):
        return stage
    raise ValueError("offload: stage=%r; accepted: True or False"
                     % (stage,))


def _wire_dtype(m, dt):
    """The dtype tensors of dt travel in to and from m's server: bf16 for
    f32 on a bf16 wire (offload's wire=), else dt."""
    if dt == torch.float32 and m._convgrad_wire == "bf16":
        return torch.bfloat16
    return dt


# How a server that predates private ids refuses a private Stage: it
# ignores the field, hashes the bytes and finds they do not hash to the
# random id (server/upload.c, proto/SEMANTICS.md "Private ids"). Only this
# refusal turns private ids off: another INVALID_ARGUMENT (a bad header)
# says nothing of the server, and src would go by content, a SHA-256 on
# both sides per step, for good.
_NO_PRIVATE_IDS = re.compile(r"header\.sha256: the \d+ bytes sent hash to ")


def _staged_or(client, staged, x, w):
    """x and w as their Staged where staging them worked, else as they
    are. A server that cannot stage (no store, over its limits) ends
    staging for this client, said once; one that refuses private ids
    (it predates them: _NO_PRIVATE_IDS) gets src by content from then
    on."""
    if staged is None:
        return x, w
    out = []
    for f, t in zip(staged, (x, w)):
        try:
            out.append(t if f is None else f.result())
        except Error as e:
            out.append(t)
            if e.code == 3 and t is x and _NO_PRIVATE_IDS.match(e.message):
                client._private_ids = False
            if e.code in (8, 9) and not client._stage_off:
                # RESOURCE_EXHAUSTED, FAILED_PRECONDITION
                client._stage_off = str(e)
                warnings.warn("convgrad: staging off for %s: %s"
                              % (client.target, e), stacklevel=3)
    return tuple(out)


def _in_arena(arena, t):
    return arena.holds(t.data_ptr(), t.numel() * t.element_size())


def _place(arena, t, dt):
    """t as dt, contiguous: t itself when it already lies in the arena (a
    resident weight, or a gradient another offloaded layer returned) or is
    staged (then it is dt already); else copied (and cast) into an arena
    slot, where the server reads it in place, when there is an arena with
    room; else t itself when it already is so (uploaded from its own
    memory)."""
    if isinstance(t, Staged):
        return t
    if (arena is not None and t.dtype == dt and t.is_contiguous() and
            _in_arena(arena, t)):
        return t
    r = arena.tensor(t.shape, dt) if arena is not None else None
    if r is None:
        return t.to(dt).contiguous()
    return r.copy_(t)


def _empty(arena, shape, dt):
    """A gradient buffer: an arena slot, which the server writes in place
    and autograd then owns (the slot is free again when the tensor goes),
    or torch memory."""
    r = arena.tensor(shape, dt) if arena is not None else None
    return torch.empty(shape, dtype=dt) if r is None else r


# A call over regions fails with these when the server cannot take them
# back (restarted without --shm, or in another IPC namespace).
_REGION_CODES = (5, 7, 9)  # NOT_FOUND, PERMISSION_DENIED, FAILED_PRECONDITION


def _data_call(client, ctx, gy, w, xshape, gx):
    if ctx.transposed:
        call = functools.partial(client.conv_transpose_backward_data, gy, w,
                                 out=gx, **ctx.attrs)
    else:
        call = functools.partial(client.conv_backward_data, gy, w, out=gx,
                                 dst_shape=list(xshape), **ctx.attrs)
    _with_fallback(client, call)


def _with_fallback(client, call):
    """call(), once more over bytes if it failed because the server no
    longer takes the client's regions."""
    try:
        return call()
    except Error as e:
        if e.code not in _REGION_CODES or client.arena() is None:
            raise
        client._drop_arena("a call over regions failed (%s)" % e)
        return call()


class _Layer:
    """One layer's backward in flight: one call, whose outputs can be
    taken one by one as the server sends them (grad_input first). With
    share (a _Share measuring the server), its CallResult goes there."""

    def __init__(self, ctx, x, gy, w, out, share=None):
        self.ctx, self.m = ctx, ctx.m
        self.client = ctx.m._convgrad_client
        self.args = (x, gy, w)
        self.out = out
        self.share = share
        self.given = set()  # outputs handed over already
        self.future = self._start(list(out))

    def _start(self, outputs):
        layer = (self.client.conv_transpose_backward_async
                 if self.ctx.transposed else self.client.conv_backward_async)
        return layer(*self.args, outputs=outputs,
                     out={g: self.out[g] for g in outputs},
                     with_result=self.share is not None, **self.ctx.attrs)

    def _again(self, e):
        """After a call over regions failed for good: the outputs not yet
        handed over, in one call by bytes."""
        if e.code not in _REGION_CODES or self.client.arena() is None:
            raise e
        self.client._drop_arena("a call over regions failed (%s)" % e)
        try:
            self.future.result()  # each call is collected once
        except Error:
            pass
        self.future = self._start([g for g in self.out
                                   if g not in self.given])

    def output(self, name):
        try:
            t = self.future.output(name)
        except Error as e:
            self._again(e)
            t = self.future.output(name)
        self.given.add(name)
        return t

    def done(self):
        return self.future.done()

    def result(self):
        try:
            got = self.future.result()
        except Error as e:
            self._again(e)
            got = self.future.result()
        if self.share is not None:
            self.share.measured(self, got[1])
            self.share = None
        self.args = None
        return self.out


# offload's local_share: "auto", or a fraction of each call's minibatch.
_AUTO = "auto"


def _share_key(x, needs):
    return tuple(x.shape), tuple(bool(n) for n in needs[:3])


def _share_of(ctx, x, w, need):
    """The _Share of this call's shape, made at its first call, or None
    where the trainer takes no share: local_share=0, a call for
    grad_input alone, a minibatch under 2, a dtype torch has no kernel
    for here or that the call changes (a bf16 wire, autocast), pads that
    differ at the two ends."""
    m = ctx.m
    if not m._convgrad_local or not (need[1] or need[2]) or x.shape[0] < 2:
        return None
    dt = ctx.dt
    if x.dtype != dt or w.dtype != dt or not _local_dtype_ok(
            dt, ctx.transposed) or torch.is_autocast_cpu_enabled() or \
            ctx.attrs["pads_begin"] != ctx.attrs["pads_end"]:
        return None
    key = _share_key(x, ctx.needs_input_grad)
    share = m._convgrad_shares.get(key)
    if share is None:
        share = m._convgrad_shares[key] = _Share(m._convgrad_local,
                                                 x.shape[0])
    return share


class _Share:
    """The rows of a layer's minibatch its trainer computes itself (the
    first ones), for one shape: local_share's fraction, or with "auto"
    libcgclient's cgc_local_rows from two measurements, the trainer's
    time for the call whole (torch, its second call) and the server's
    call whole (its third), decided once and kept, so that the cut, and
    so the gradients' bits, stay the same from step to step."""

    def __init__(self, want, mb):
        self.calls = 0
        self.local_ms = None
        if want == _AUTO:
            self.rows = None  # not decided yet
        else:
            self.rows = min(int(round(want * mb)), mb - 1)

    def time(self, ctx, x, gy, w, need):
        """The call whole in torch (its gradients are returned), timed:
        its wall time, or under a CPU quota what its CPU costs at the
        quota's rate if that is more (one call can fit in a quota
        period's budget, a step's calls do not: over the 10 Gbit/s rig
        with a trainer at 50 % of a core, the wall time alone gave the
        trainer 2-7 rows of ResNet-18's 8, and the step took 1.10x
        local against 0.91x without a share)."""
        t0, c0 = time.perf_counter(), time.process_time()
        grads = _local_grads(ctx, x, gy, w, need)
        self.local_ms = _quota.sustained_ms(
            (time.perf_counter() - t0) * 1e3,
            (time.process_time() - c0) * 1e3, _quota.cpu_quota()[0])
        return grads

    def measured(self, layer, result):
        """The server's whole call of this shape ended: the cut."""
        if self.rows is not None or self.local_ms is None:
            return
        x, gy, w = layer.args
        ctx = layer.ctx
        self.rows = layer.client.local_rows(
            x, gy, w, result, self.local_ms, transposed=ctx.transposed,
            outputs=list(layer.out), **ctx.attrs)


def _local_grads(ctx, x, gy, w, need):
    """grad_input, grad_weight and grad_bias (None where not needed) of
    rows x and gy, computed here by torch."""
    m = ctx.m
    bias = None
    if need[2]:
        bias = [w.shape[1] * m.groups if ctx.transposed else w.shape[0]]
    with torch.no_grad():
        return torch.ops.aten.convolution_backward(
            gy, x, w, bias, ctx.attrs["strides"], ctx.attrs["pads_begin"],
            ctx.attrs["dilations"], ctx.transposed,
            ctx.attrs.get("output_padding", [0] * len(m.kernel_size)),
            m.groups, [bool(n) for n in need])


class _SharedLayer:
    """A layer's backward shared with the trainer: the server computes
    the rows from own on (one call, a _Layer), torch the first own rows on
    this thread meanwhile. grad_input is the two's rows; grad_weight and
    grad_bias are the trainer's plus the server's, in that order, so that
    the bits do not depend on which ended first."""

    def __init__(self, ctx, own, xs, x, gy, ws, w, out):
        self.ctx, self.m, self.out = ctx, ctx.m, out
        client = ctx.m._convgrad_client
        arena = client.arena()
        theirs = {g: (t[own:] if g == "diff_src" else
                      _empty(arena, t.shape, t.dtype)) for g, t in out.items()}
        # src staged at forward time once the cut was known holds the
        # server's rows; else they go from the trainer's.
        if not isinstance(x, Staged):
            x = x[own:]
        elif x.shape[0] != xs.shape[0] - own:  # staged whole
            x = _place(arena, xs[own:], ctx.dt)
        self.remote = _Layer(ctx, x, gy[own:], w, theirs)
        need = ["diff_src" in out, "diff_weights" in out, "diff_bias" in out]
        gx, gw, gb = _local_grads(ctx, xs[:own], gy[:own], ws, need)
        if gx is not None:
            out["diff_src"][:own].copy_(gx)
        self.mine = {"diff_weights": gw, "diff_bias": gb}

    def output(self, name):
        self.remote.output(name)
        return self.out[name]

    def done(self):
        return self.remote.done()

    def result(self):
        theirs = self.remote.result()
        for g in ("diff_weights", "diff_bias"):
            if g in self.out:
                torch.add(self.mine[g], theirs[g], out=self.out[g])
        self.mine = None
        return self.out


# Deferred layers of the backward pass running on this thread, and the
# torch thread count its narrowing saved.
_local = threading.local()

# OpenMP's omp_set_num_threads, where ATen's OpenMP backend takes its
# thread count from (omp_get_max_threads of the calling thread).
# torch.set_num_threads sets it too, but also empties ideep's cache of
# forward convolutions (their primitives keep the thread count they were
# made with), so that every step that narrowed the backward pass's
# threads and widened them again made its forward's primitives anew:
# ResNet-18's 32x32 forward at batch 32 went from 26 to 47 ms on 2 cores.
# Narrowed without emptying it, a forward primitive the pass makes (a
# recomputation by activation checkpointing, of a shape not seen before)
# keeps one thread; one made before keeps its count, as oneDNN runs a
# primitive with the count it was made with.
_omp_set_num_threads = getattr(ctypes.CDLL(None), "omp_set_num_threads",
                               None)


def _set_threads(n):
    """torch's thread count n, without torch.set_num_threads where ATen's
    count follows OpenMP's."""
    if _omp_set_num_threads is not None:
        _omp_set_num_threads(n)
        if torch.get_num_threads() == n:
            return
    torch.set_num_threads(n)


# OpenMP 5's omp_pause_resource_all(omp_pause_soft): libgomp ends the
# calling thread's idle pool threads at once (they would spin for up to
# 300,000 rounds first); its next parallel region starts them anew.
_omp_pause_resource_all = getattr(ctypes.CDLL(None), "omp_pause_resource_all",
                                  None)
_OMP_PAUSE_SOFT = 1
_omp_is_torchs = None  # decided at first use: see _torch_runs_on_omp


def _torch_runs_on_omp():
    """Whether the OpenMP runtime found in the process is the one ATen's
    threads run on (a wheel may bundle another): setting its count moves
    torch's. Decided once."""
    global _omp_is_torchs
    if _omp_is_torchs is None:
        n = torch.get_num_threads()
        _omp_is_torchs = False
        if _omp_set_num_threads is not None:
            _omp_set_num_threads(n + 1)
            _omp_is_torchs = torch.get_num_threads() == n + 1
            _omp_set_num_threads(n)
    return _omp_is_torchs


class _Threads:
    """The torch threads of a backward pass whose convolutions run on a
    server sharing this process's cores (offload's backward_threads=).
    torch's idle OpenMP threads spin for up to 300,000 rounds after each
    parallel region, on the cores the server computes on. 'auto' ends
    them before each call, where OpenMP can (omp_pause_resource_all), and
    torch keeps its threads for the rest of the pass; else, and with a
    count, the pass runs on fewer threads from its first offloaded layer
    on, so that the pool's others sleep once their spin ends (ResNet-18
    32x32 batch 32 f32 on 2 cores: 1.69x local's step with 2 threads
    spinning, 1.27x with 1; tests/README.md)."""

    def __init__(self, want):
        if not (want in (None, "auto") or
                (isinstance(want, int) and want >= 1)):
            raise ValueError("backward_threads: %r; accepted: 'auto', None "
                             "or a count of at least 1" % (want,))
        self.want = want
        self.spare = {}  # client -> cores the server leaves us, or None

    def _spare(self, client):
        """Where the server shares this process's cores (it is on this
        host: a unix socket or loopback target, whether its tensors go
        through the arena or as bytes), the cores of this process it does
        not use, at least 1; else None. Resolved once per client."""
        if client not in self.spare:
            server = set()
            if _on_this_host(client.target):
                try:
                    server = set(client.info()["cpus"])
                except Error:
                    pass
            mine = os.sched_getaffinity(0)
            self.spare[client] = (max(1, len(mine - server))
                                  if mine & server else None)
        return self.spare[client]

    def _releases(self, client):
        return (self.want == "auto" and _omp_pause_resource_all is not None
                and self._spare(client) is not None and _torch_runs_on_omp())

    def narrow(self, client):
        """At a pass's offloaded layer, before its tensors are placed."""
        if self.want == "auto":
            n = None if self._releases(client) else self._spare(client)
        else:
            n = self.want
        if n is None or getattr(_local, "threads", None) is not None:
            return
        have = torch.get_num_threads()
        if n >= have:
            return
        _local.threads = have
        _set_threads(n)
        Variable._execution_engine.queue_callback(_restore_threads)

    def before_call(self, client):
        """Right before a layer's call: torch's idle threads end instead
        of spinning beside the server."""
        if self._releases(client):
            _omp_pause_resource_all(_OMP_PAUSE_SOFT)


def _restore_threads():
    """The end-of-backward callback of a narrowed pass, and the forward of
    an offloaded layer (a pass that failed ran no callback): torch's
    thread count back."""
    n = getattr(_local, "threads", None)
    if n is not None:
        _local.threads = None
        _set_threads(n)


class _Deferred(list):
    settled = False


# Any autograd node: _will_engine_execute_node raises outside a backward
# pass whatever the node, which is how a forward tells a pass that failed
# from the pass it runs in (activation checkpointing's recomputation).
_PROBE = torch.zeros(1, requires_grad=True).mul(1).grad_fn


def _in_backward():
    """Whether this thread runs a backward pass (asked only once a layer
    deferred, so this torch has the query: _may_defer)."""
    try:
        torch._C._will_engine_execute_node(_PROBE)
    except RuntimeError:
        return False
    return True


def _drop_failed_pass():
    """The forward of an offloaded layer outside a backward pass: the
    deferred layers of a pass that raised (its end-of-backward callback
    never ran) are waited for and their weight and bias gradients
    dropped, as a trainer zeroes the gradients after a failed pass, and
    before this forward. Left, the next pass would add to the stale list
    without a callback of its own: its last deferred gradients would
    never reach .grad."""
    d = getattr(_local, "deferred", None)
    if d is None or d.settled or _in_backward():
        return
    _local.deferred = None
    for layer in d:
        try:
            layer.result()  # each call is collected once
        except Exception:  # the failed pass's calls: nobody to tell
            pass


def _may_defer(m):
    """Whether m's weight and bias gradients may arrive after its backward
    returned, settled by the end-of-backward callback. Not under
    torch.distributed: DDP's reducer starts its bucket all-reduces from
    hooks on each parameter's gradient accumulator, which a deferred
    gradient never passes: it would not be all-reduced (python_ddp's
    ranks drift apart by 1e-2 without this rule). Not
    when a parameter is computed (not a leaf) or has hooks of its own, nor
    for torch.autograd.grad, which takes the gradients from what backward
    returns."""
    will_execute = getattr(torch._C, "_will_engine_execute_node", None)
    if not m._convgrad_overlap or will_execute is None:
        return False
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return False
    for p in (m.weight, m.bias):
        if p is None or not p.requires_grad:
            continue
        if not p.is_leaf or p._backward_hooks:
            return False
        with torch.enable_grad():
            acc = p.view_as(p).grad_fn.next_functions[0][0]
        try:
            # False: this pass does not accumulate into p.grad (backward
            # with inputs= that leave p out).
            if not will_execute(acc):
                return False
        except RuntimeError:
            return False  # torch.autograd.grad captures p's gradient
    return True


def _defer(layer):
    d = getattr(_local, "deferred", None)
    if d is None or d.settled:
        d = _local.deferred = _Deferred()
        Variable._execution_engine.queue_callback(
            functools.partial(_settle, d))
    # Layers whose calls have ended are settled now: their slots in the
    # arena (inputs held until the calls end) go back to it while the pass
    # goes on, instead of the whole pass's piling up.
    ended = [x for x in d if x.done()]
    for x in ended:
        d.remove(x)
        _accumulate(x)
    d.append(layer)


def _accumulate(layer):
    """Waits for layer's calls and adds its weight and bias gradients as
    AccumulateGrad would: the first becomes .grad, later ones are
    added."""
    grads = layer.result()
    ctx, m = layer.ctx, layer.m
    with torch.no_grad():
        for name, p, t in (("diff_weights", m.weight, ctx.dtypes[1]),
                           ("diff_bias", m.bias, ctx.dtypes[2])):
            g = grads.get(name)
            if g is None:
                continue
            g = g.to(t)
            if p.grad is None:
                p.grad = g
            else:
                p.grad += g


def _settle(deferred):
    """The end-of-backward callback: settles every layer still deferred,
    before backward() returns. The first failure is raised once all are
    settled."""
    deferred.settled = True
    error = None
    for layer in deferred:
        try:
            _accumulate(layer)
        except Exception as e:  # every call is collected before raising
            error = error or e
    deferred.clear()
    if error is not None:
        raise error


def _resident_weight(m, x):
    """Moves m's weight into its client's arena, once: the optimizer then
    updates it there in place, and each backward hands it to the server by
    reference instead of copying it into the arena (for ResNet-18, 45 MB a
    step: most of what a 32x32 step uploads). Only a weight a backward
    would upload as it is: a leaf that trains, contiguous, in the dtype of
    the forward's input (under autocast the forward casts it anew each
    time), and only while the arena has room."""
    w = m.weight
    if not (torch.is_grad_enabled() and w.requires_grad and w.is_leaf and
            w.dtype == _wire_dtype(m, x.dtype) and w.is_contiguous()) or \
            torch.is_autocast_cpu_enabled():
        return
    arena = m._convgrad_client.arena()
    if arena is None or _in_arena(arena, w):
        return
    r = arena.tensor(w.shape, w.dtype)
    if r is not None:
        w.data = r.copy_(w.detach())


class _Offloaded:
    """The forward of an offloaded convolution: torch's, through
    _ConvFunction so that the backward runs on the server."""

    def _offloaded_forward(self, input, output_padding):
        _restore_threads()
        _drop_failed_pass()
        n = len(self.kernel_size)
        unbatched = input.dim() == n + 1
        if unbatched:
            input = input.unsqueeze(0)
        _resident_weight(self, input)
        # Inside the Function's forward grad mode is off whatever it was.
        self._convgrad_grad_on = torch.is_grad_enabled()
        y = _ConvFunction.apply(input, self.weight, self.bias, self,
                                output_padding)
        return y.squeeze(0) if unbatched else y


class _OffloadedConv(_Offloaded):
    def forward(self, input):
        return self._offloaded_forward(input, None)


class _OffloadedConvTranspose(_Offloaded):
    def forward(self, input, output_size=None):
        n = len(self.kernel_size)
        output_padding = self._output_padding(
            input, output_size, self.stride, self.padding, self.kernel_size,
            n, self.dilation)
        return self._offloaded_forward(input, output_padding)


_FORWARD = {1: (F.conv1d, F.conv_transpose1d),
            2: (F.conv2d, F.conv_transpose2d),
            3: (F.conv3d, F.conv_transpose3d)}
_TRANSPOSED = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
_CLASSES = {}
for _base in (nn.Conv1d, nn.Conv2d, nn.Conv3d):
    _CLASSES[_base] = type("Offloaded" + _base.__name__,
                           (_OffloadedConv, _base), {})
for _base in _TRANSPOSED:
    _CLASSES[_base] = type("Offloaded" + _base.__name__,
                           (_OffloadedConvTranspose, _base), {})
_ORIGINAL = {v: k for k, v in _CLASSES.items()}


_WIRES = ("f32", "bf16")


def offload(model, target, overlap=True, backward_threads="auto",
            stage=True, wire="f32", local_share=0, **options):
    """Makes the backward of every nn.Conv1d/2d/3d and nn.ConvTranspose1d/
    2d/3d in model (model itself included) run on a convgrad server, and
    returns model.

    target: a "host:port" (or list, "dns:///name:port", ...) for a new
    convgrad.Client made with **options (deadline=, retries=, ...), or a
    Client to share. The modules are changed in place: they keep their
    parameters, so state_dict, optimizers and DDP wrappers stay valid, and
    every constructor argument (stride, padding including 'same' and
    'valid', dilation, groups, output_padding, bias). Only these exact
    classes are offloaded, not subclasses of them, whose forward may differ.
    A padding_mode other than 'zeros' stays local, with a warning.

    f32, bf16 and f16 tensors are accepted, and torch.autocast on the CPU:
    the server computes in the dtype the forward ran in and the gradients
    come back in the parameters' dtypes. f16 forwards (and bf16
    ConvTranspose ones) run in f32 and are rounded, as CPU torch has no
    such kernels. Double backward raises a RuntimeError.

    Same host: with the server on a unix socket or loopback address whose
    --shm policy allows this caller, a layer's tensors go through the
    client's arena of shared-memory regions (Client's shm= and shm_bytes=;
    shm=False sends bytes), and the weights that train move into it at
    their layer's first forward (the same Parameter objects with the same
    values, updated there by the optimizer; a view taken of a weight's
    .data before then keeps the old memory; restore() moves them back).
    overlap (default True): a layer's grad_input goes on through autograd
    as soon as the server sent it (before it computes the weight's
    gradient), over TCP as over the arena, while its weight and bias
    gradients arrive, settled before backward() returns. Where that is
    not safe the gradients come back from the layer's backward as with
    overlap=False: under torch.distributed (DDP all-reduces each gradient
    from its accumulator's hook, which a deferred one never passes), for
    torch.autograd.grad and backward(inputs=) without the weights, and
    for parameters with hooks or computed weights (see the README). A
    pass that raises leaves out the weight and bias gradients of the
    layers it deferred (dropped at the next offloaded forward).

    backward_threads: what torch's threads do while the server computes
    a layer. 'auto' (default): where the server is on this host (a unix
    socket or loopback target, the tensors in the arena or sent as bytes)
    and uses cores of this process, torch's idle OpenMP threads are ended
    right before each call (omp_pause_resource_all; torch's next parallel
    op starts them anew) so that they do not spin on the server's cores,
    and torch keeps its thread count; where OpenMP cannot, the pass runs
    from its first offloaded layer on the cores of this process the server
    does not use, at least 1; else nothing changes. None: nothing changes;
    a count: the pass runs on that many threads from its first offloaded
    layer (its count is torch's again when the pass ends, or at the next
    offloaded forward after a pass that failed).

    stage: for a server off this host (tensors as bytes, no arena), each
    layer's forward starts uploading its weights and src into the server's
    store of staged tensors (Client.stage_async), so that its backward call
    sends diff_dst alone and names them; a server that lost them (evicted,
    restarted) gets them again from libcgclient, a server without a store
    turns staging off with a warning. Content the server holds already (a
    data-parallel rank's identical weights) is not sent again. The
    weights cost a SHA-256 pass at forward time, src none (a private id),
    and their upload's work runs on this process's cores during the
    forward. True (default): staging, which pays even on a one-core
    trainer (client/python/README.md, "When offload pays"); False: the
    backward call sends every input. With replicas=1 (a Client whose large
    calls pipeline their parts over the server, each part sending its
    share of src: client/python/README.md, "Pipelining") only the weights
    are staged.

    wire: the dtype f32 layers' tensors travel in. "f32" (default): as
    they are, and the gradients are local's. "bf16" (opt-in, lossy): the
    backward's inputs (staged ones too) are rounded to bf16 (torch's
    .to(), round to nearest even), the server computes the layer in bf16
    (f32 accumulation) and answers bf16 gradients, widened to f32 on
    arrival: half the bytes each way, and gradients off by bf16's
    rounding (8 significant bits: ~0.3-0.7 % of each tensor's largest
    value on ResNet-18; client/python/README.md, "A bf16 wire"). Layers
    that already run in bf16 or f16 (autocast, a model in that dtype) are
    unchanged. A value other than these is a ValueError.

    local_share: the share of a layer's backward the trainer computes
    itself, on the thread running the backward pass (torch's kernels,
    its threads), while the server computes the rest of the minibatch:
    the first rows' grad_input here, the others' on the server, and
    grad_weight and grad_bias the trainer's plus the server's, in that
    order whichever ends first. 0 (default): none. A fraction in [0, 1):
    that share of each call's rows (rounded; at most all rows but one).
    "auto": for each layer's shape, its first three calls run on the
    server, here (timed) and on the server (measured), and from then on
    the trainer takes the rows libcgclient's cgc_local_rows says end the
    call soonest from those two times and the link's speed, or none (a
    fast server, a slow trainer, a tiny call); the cut is then kept. Only
    for layer calls that ask for the weight's or bias's gradient, in a
    dtype torch computes here (f32; bf16 convolutions), with pads equal
    at both ends, not under autocast or a bf16 wire. The gradients are
    within the summation tolerance of local's but not its bits
    (client/python/README.md, "A share for the trainer")."""
    if wire not in _WIRES:
        raise ValueError("offload: wire=%r; accepted: %s"
                         % (wire, ", ".join(map(repr, _WIRES))))
    if local_share != _AUTO and not (
            isinstance(local_share, (int, float)) and 0 <= local_share < 1):
        raise ValueError("offload: local_share=%r; accepted: 'auto', or a "
                         "fraction in [0, 1)" % (local_share,))
    threads = _Threads(backward_threads)
    stage = _stages(stage)
    client = target if isinstance(target, Client) else Client(target,
                                                              **options)
    for m in model.modules():
        cls = _CLASSES.get(type(m))
        if cls is None:
            continue
        if m.padding_mode != "zeros":
            warnings.warn("convgrad: %s has padding_mode=%r; its backward "
                          "stays local" % (type(m).__name__, m.padding_mode),
                          stacklevel=2)
            continue
        m.__class__ = cls
        m._convgrad_client = client
        m._convgrad_overlap = bool(overlap)
        m._convgrad_threads = threads
        m._convgrad_stage = stage
        m._convgrad_wire = wire
        m._convgrad_local = local_share
        m._convgrad_shares = {}
    if stage and not hasattr(model, "_convgrad_stage_hook"):
        model._convgrad_stage_hook = model.register_forward_pre_hook(
            _stage_weights)
    return model


def restore(model):
    """Undoes offload(): the convolutions of model compute their backward
    locally again, their weights back in torch's memory. Returns model."""
    for m in model.modules():
        base = _ORIGINAL.get(type(m))
        if base is not None:
            arena = m._convgrad_client._arena
            if arena is not None and _in_arena(arena, m.weight):
                m.weight.data = m.weight.detach().clone()
            m.__class__ = base
            del m._convgrad_client, m._convgrad_overlap, m._convgrad_threads
            del m._convgrad_stage, m._convgrad_wire
            del m._convgrad_local, m._convgrad_shares
            m.__dict__.pop("_convgrad_grad_on", None)
            m.__dict__.pop("_convgrad_wfut", None)
    hook = model.__dict__.pop("_convgrad_stage_hook", None)
    if hook is not None:
        hook.remove()
    return model
