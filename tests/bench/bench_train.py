#!/usr/bin/python3
"""bench_train.py - what an offloaded training step costs against local
torch, and one layer against torch.distributed.rpc (issue 27).

  train  torchvision's resnet18(num_classes=10), SGD with momentum, in the
         settings of --settings (224x8: 224x224 images at batch 8; 32x32:
         32x32 at batch 32), f32 and bf16 under torch.autocast. Modes,
         each in a process of its own (Mode: sharing one, they changed
         each other's steps) with glibc's malloc at fixed thresholds
         (--trainer-malloc, STEADY_MALLOC), in rounds that rotate their
         order: local autograd; offload over TCP
         loopback (bytes on the wire: shm=False); offload over the unix
         socket with shared-memory regions; each with offload's defaults
         (overlap: grad_input on through autograd as soon as the server
         sent it) or +serial (overlap=False), and with torch's idle
         threads left spinning beside each call
         (+keep: backward_threads=None) or the backward pass narrowed
         to one thread (+narrow: backward_threads=1) instead of ended
         before each call (offload's default); +bf16: the opt-in bf16
         wire (wire="bf16": f32 layers' tensors travel as bf16); +share:
         the trainer computes a share of each call's minibatch itself
         (local_share="auto"; +shareN: N %), its rows per conv printed.
         Prints per mode the median over rounds of ms/step and of its
         ratio to local's in the same round, and per step the calls,
         bytes up and down, staged at forward time, and those the
         backward waits for (up and down but, with overlap, the weights'
         gradients), the server's compute, the arena's size, the CPU ms
         per MB moved (up, down and staged) of the trainer (trn/MB: its
         process's CPU beyond local's less local's convolutions'
         backward) and of the server (srv/MB: its process's CPU beyond
         its workers'), and the step the model of client/python/README.md
         ("When offload pays") predicts from them ("model ms", model_ms)
         with the median of its ratios to the measured step in the same
         round ("model/"), and under each offload mode its backward, the
         server's CPU in it and the step that CPU alone allows (the
         server-bound floor, print_server_floor); then local's
         convolutions' backward per step (the part an offloaded step
         replaces: each conv's
         aten::convolution_backward on tensors of its shapes, timed
         in a process beside local's right after local's step each
         round), forward and optimizer step, and
         each round's wall ms per CPU ms of the trainer's and the
         server's core. Each offload mode has a server of its own.
         Before timing, one
         step from equal weights in every mode: each parameter gradient
         against local's, relative to its largest value (f32 must be
         within 1e-5, a bf16 wire's within 5e-2).
  wire   the bf16 wire's error against f32, in the settings of
         --settings: per convolution of one step, its weight gradient
         offloaded with wire="bf16" (over TCP) against local's, and, on
         the local step's own tensors, one call's diff_weights and
         diff_src in bf16 and the diff_weights an f32 answer to bf16
         inputs would give (torch in f32 on the rounded inputs); then the
         loss over --wire-steps steps of SGD from equal weights, local
         against offloaded with each wire.
  share  a call shared with the trainer (offload's local_share) against
         the exact gradients (torch in f64 on the same inputs), per
         convolution of one local step, beside local's and the server's
         whole call's errors.
  layer  one 3x3 64->64 conv on 56x56 at batch 8, forward and backward
         (input and weight gradients), three ways interleaved: local
         torch, convgrad offload (unix socket and regions), and a
         torch.distributed.rpc RemoteModule (forward and backward in a
         second process over TensorPipe, the weight kept there, distributed
         autograd). Prints each way's median ms/step and the ratios.

    CONVGRAD_LIBRARY=build/client/libcgclient.so \\
      flock /work/coord/bench.lock /usr/bin/python3 tests/bench/bench_train.py

Starts convgrad-servers of --build (TCP on 127.0.0.1 and a unix socket;
--server-args adds flags): one per offload mode of the train part, so
that no mode finds what another staged (the store dedupes content ids
across peers: two staging modes of equal weights would share their
staged weights), each started the same way, and one for the other
parts. Across a shaped link instead: --rate (and
--trn-cpus, --trn-quota, --srv-cpus, --srv-quota) builds a rig of two
network namespaces (tests/net/rig.sh; run as root), runs this script
again on its trainer's side (local and every offload mode on the
trainer's cores and quota) with the servers on the other side (TCP at
10.231.0.2 across the veth, the unix sockets and regions beside it), and
tears the rig down; it prints the rig, the rate a plain socket gets
through it, the machine's load and the ISA. torch runs --threads threads (default: every
core this process may use, as the server's workers do). Prefix
GOMP_SPINCOUNT=10000 to measure a trainer whose idle OpenMP threads stop
spinning soon (client/python/README.md, "When offload pays": local
steps of small ops get slower). Figures,
not a test: nothing is asserted but the gradients."""
import argparse
import copy
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

SETTINGS = {"224x8": (224, 8), "32x32": (32, 32)}


def resnet18():
    import torchvision
    return torchvision.models.resnet18(num_classes=10)


class Trainer:
    """One way of training, in its mode's process (mode_main): its model
    (the same initial one in every mode), its optimizer, the torch threads
    it runs with and, offloaded, its client and its server's pid."""

    def __init__(self, model, threads, client=None, server_pid=None):
        import torch
        self.model, self.client, self.server_pid = model, client, server_pid
        self.threads = threads
        self.opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(self, x, y, autocast):
        import torch
        import torch.nn.functional as F
        # Only when it differs: torch.set_num_threads empties ideep's
        # cache of forward convolutions even to the same count, and the
        # forward would make its primitives anew (ResNet-18 32x32 batch 32
        # forward 26 -> 47 ms), a cost no trainer pays each step.
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        self.opt.zero_grad()
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = F.cross_entropy(self.model(x), y)
        # Only the server process's total, inside the timed step: not
        # server_cpu_ms's walk of its threads.
        stat = None if self.server_pid is None else \
            "/proc/%d/stat" % self.server_pid
        t1 = time.perf_counter()
        s1 = stat_cpu_ms(stat) if stat else 0.0
        loss.backward()
        t2 = time.perf_counter()
        s2 = stat_cpu_ms(stat) if stat else 0.0
        self.opt.step()
        self.last_parts = ((t1 - t0) * 1e3, (time.perf_counter() - t2) * 1e3,
                           (t2 - t1) * 1e3, s2 - s1)
        return loss.item()


class Mode:
    """One way of training as the run sees it: a process of its own
    (mode_main, started from spec, a dict of make_trainer's), its name, its
    server (None: local) and each round's figures (time_steps). A process
    each because modes sharing one trainer process change each other's
    steps: over the 10 Gbit/s rig (ResNet-18 224x8 f32, trainer core 0,
    server core 1) local's step took 1369-1418 ms in a process of its own
    and 1013-1227 ms when each followed an offloaded step in one process,
    an offloaded step 1116-1209 ms alone and 1443-1632 ms after a local
    one: the page faults of one mode's step moved with the other's (local
    22.5k a step alone, 18.9-19.2k interleaved; offloaded 10.1-10.8k
    alone, 18.0-23.2k interleaved), through the allocator state they
    share. A trainer runs one of them."""

    def __init__(self, ctx, spec, server=None):
        self.name, self.server = spec["name"], server
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=mode_main, args=(child, spec),
                                name="bench-train-" + spec["name"],
                                daemon=True)
        self.proc.start()
        child.close()
        self.rounds = []
        self.timer = None  # local's: the process timing its convolutions

    def call(self, *request):
        """Runs request (mode_main's commands) in the mode's process and
        returns its answer; raises RuntimeError with its traceback if it
        failed there."""
        self.conn.send(request)
        ok, answer = self.conn.recv()
        if not ok:
            raise RuntimeError("mode %s: %s" % (self.name, answer))
        return answer

    def close(self):
        if self.timer is not None:
            self.timer.close()
        if self.proc.is_alive():
            try:
                self.call("close")
            except (EOFError, OSError):
                pass
        self.proc.join(timeout=60)
        if self.proc.is_alive():
            self.proc.kill()
        self.conn.close()


def make_modes(args, setting, dtype, servers):
    """local, then each of args.modes, each a Mode (a process of its own)
    training resnet18 in setting (SETTINGS) and dtype, each offload mode
    with a server of its own (servers.start(): the store dedupes content
    ids across peers, so two staging modes of equal weights sharing one
    would find each other's staged weights present): tcp (bytes) or
    unix+shm (regions), either as alt:tcp or alt:unix+shm on a server of
    --alt-server-args, each optionally followed by
    +serial (overlap=False), +keep (backward_threads=None), +narrow
    (backward_threads=1), +nostage (stage=False: tcp's backward sends
    src and weights too) or +stage (stage=True, offload's default: the
    same as no flag, for runs that name it),
    +content (src staged by its SHA-256 instead of a private id, as
    before private ids), +bf16 (wire="bf16"), +pipe (Client(replicas=1):
    a large call's parts pipelined over the server, as many as the
    client's model of the link says) or +pipeN (N parts: split_parts=N)
    and +whole (replicas=0: no pipelining whatever offload's default),
    +share (local_share="auto": the trainer computes the share of each
    call libcgclient's model gives it) or +shareN (local_share=N/100)."""
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    common = dict(setting=setting, autocast=dtype == "bf16",
                  steps=args.steps)
    specs = [dict(common, name="local", threads=args.threads)]
    for name in args.modes:
        parts = name.split("+")
        n = 2 if parts[1:2] == ["shm"] else 1
        base, flags = "+".join(parts[:n]), parts[n:]
        pipe = [f for f in flags if f.startswith("pipe")]
        share = [f for f in flags if f.startswith("share")]
        known = {"serial", "keep", "narrow", "nostage", "stage", "content",
                 "bf16", "whole"}
        if base not in ("tcp", "unix+shm", "alt:tcp", "alt:unix+shm") or \
                set(flags) - known - set(pipe) - set(share) or \
                any(f != "pipe" and not f[4:].isdigit() for f in pipe) or \
                any(f != "share" and not f[5:].isdigit() for f in share) or \
                (base.startswith("alt:") and args.alt_server_args is None):
            sys.exit("bench_train: mode %r: no such mode or no server for it "
                     "(alt: modes need --alt-server-args)" % name)
        split = {}
        if pipe:
            split = dict(replicas=1, split_parts=int(pipe[0][4:] or 0))
        elif "whole" in flags:
            split = dict(replicas=0)
        specs.append(dict(
            common, name=name, threads=args.offload_threads,
            tcp=base.endswith("tcp"), alt=base.startswith("alt:"),
            split=split, private_ids="content" not in flags,
            offload=dict(overlap="serial" not in flags,
                         backward_threads=None if "keep" in flags else
                         1 if "narrow" in flags else "auto",
                         stage="nostage" not in flags,
                         wire="bf16" if "bf16" in flags else "f32",
                         local_share=("auto" if share[0] == "share" else
                                      int(share[0][5:]) / 100)
                         if share else 0)))
    modes = []
    try:
        for spec in specs:
            server = None
            if spec["name"] != "local":
                server = servers.start(alt=spec["alt"])
                spec.update(target=server.target if spec["tcp"]
                            else server.unix, server_pid=server.proc.pid)
            modes.append(Mode(ctx, spec, server))
        # Local's convolutions' backward is timed in a process beside
        # local's: in local's own, the step after the timing took up to
        # 1.6x the others (the timing's tensors take the heap local's
        # step had used).
        modes[0].timer = Mode(ctx, specs[0])
    except BaseException:
        close_modes(modes, servers)
        raise
    return modes


def close_modes(modes, servers):
    """Ends each mode's process, then stops its server."""
    for m in modes:
        m.close()
        if m.server is not None:
            servers.stop(m.server)


def make_trainer(spec):
    """The Trainer of a mode's spec (make_modes), and its batches."""
    import convgrad
    import convgrad.torch as ct
    model0, batches = problem(*SETTINGS[spec["setting"]])
    if spec["name"] == "local":
        return Trainer(model0, spec["threads"]), batches
    client = convgrad.Client(spec["target"],
                             shm=False if spec["tcp"] else "auto",
                             **spec["split"])
    client._private_ids = spec["private_ids"]
    model = ct.offload(model0, client, **spec["offload"])
    return Trainer(model, spec["threads"], client,
                   spec["server_pid"]), batches


def mode_main(conn, spec):
    """A mode's process: makes its Trainer, then answers the run's
    requests (Mode.call) until "close": ("grads", i) one step on batch i
    and its parameters' gradients; ("warmup", n) n untimed steps;
    ("state",) and ("load", state) its model's weights; ("round",) one
    round's figures (time_steps); ("reset",) zeroes the client's
    counters; ("conv",) local's convolutions' backward (conv_backward_ms,
    wall and CPU ms); ("shares",) trainer_shares. Each answer is (True,
    value) or (False, the traceback)."""
    import traceback
    import torch
    torch.set_num_threads(spec["threads"])
    trainer, batches = make_trainer(spec)
    autocast = spec["autocast"]
    convs = []

    def grads(i):
        trainer.step(*batches[i], autocast)
        return {k: p.grad.clone()
                for k, p in trainer.model.named_parameters()}

    def warmup(n):
        for i in range(n):
            trainer.step(*batches[i % 4], autocast)

    def load(state):
        trainer.model.load_state_dict(state)

    def reset():
        if trainer.client is not None:
            trainer.client.stats(reset=True)

    def conv():
        if not convs:
            convs.extend(conv_backward_calls(trainer.model, batches[0][0],
                                             autocast))
        return conv_backward_ms(convs)
    handlers = {
        "grads": grads, "warmup": warmup,
        "state": lambda: trainer.model.state_dict(),
        "load": load, "reset": reset, "conv": conv,
        "round": lambda: time_steps(spec["steps"], trainer, batches,
                                    autocast),
        "shares": lambda: trainer_shares(trainer.model)}
    while True:
        request = conn.recv()
        try:
            conn.send((True, handlers[request[0]](*request[1:])
                       if request[0] != "close" else None))
        except Exception:
            conn.send((False, traceback.format_exc()))
        if request[0] == "close":
            break
    if trainer.client is not None:
        trainer.client.close()
    conn.close()


def trainer_shares(model):
    """The rows of each offloaded conv's calls its trainer computes
    (offload's local_share), "-" where not decided, in model order."""
    rows = [str(share.rows if share.rows is not None else "-")
            for m in model.modules()
            for share in getattr(m, "_convgrad_shares", {}).values()]
    return " ".join(rows)


def conv_backward_calls(model, x, autocast):
    """The local convolutions' backward of one step, as one
    torch.ops.aten.convolution_backward argument list per conv on
    tensors of its shapes (in bf16 under autocast)."""
    import torch
    import torch.nn as nn
    dt = torch.bfloat16 if autocast else torch.float32
    convs = []

    def hook(m, inp, out):
        convs.append((m, inp[0].shape, out.shape, inp[0].requires_grad))
    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, nn.Conv2d)]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        model(x)
    for h in handles:
        h.remove()
    return [(torch.randn(ys).to(dt), torch.randn(xs).to(dt),
             m.weight.detach().to(dt), [0], m.stride, m.padding,
             m.dilation, False, [0] * len(m.stride), m.groups,
             [need_x, True, m.bias is not None])
            for m, xs, ys, need_x in convs]


def conv_backward_ms(calls, reps=2):
    """The local convolutions' backward of one step (the part an
    offloaded step replaces): the wall and CPU ms of each of calls
    (conv_backward_calls) on its own, the median of reps runs after one
    untimed, summed. (The autograd profiler slows these ops down several
    times.)"""
    import torch
    wall = cpu = 0.0
    for args in calls:
        t = []
        for _ in range(reps + 1):
            c0, t0 = time.process_time(), time.perf_counter()
            torch.ops.aten.convolution_backward(*args)
            t.append((time.perf_counter() - t0, time.process_time() - c0))
        wall += statistics.median(x[0] for x in t[1:])
        cpu += statistics.median(x[1] for x in t[1:])
    return wall * 1e3, cpu * 1e3


def stat_cpu_ms(path):
    """The CPU (user and system) a /proc stat file counts, in ms."""
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1e3 / os.sysconf(
        "SC_CLK_TCK")


def server_cpu_ms(pid):
    """The CPU server process pid has used so far, in ms, as /proc counts
    it (user and system): every thread's, and its workers' (the threads
    that run the kernels; the others move the bytes); (0, 0) for None."""
    if pid is None:
        return 0.0, 0.0
    proc = "/proc/%d" % pid
    workers = 0.0
    for tid in os.listdir(proc + "/task"):
        try:
            with open("%s/task/%s/comm" % (proc, tid)) as f:
                if f.read().startswith("cg-worker"):
                    workers += stat_cpu_ms("%s/task/%s/stat" % (proc, tid))
        except FileNotFoundError:  # a thread that ended
            pass
    return stat_cpu_ms(proc + "/stat"), workers


def bf16_wire(mode):
    return "bf16" in mode.name.split("+")


def check_gradients(modes, batch, tol, when=""):
    """One step's gradients of every mode on its batch number batch
    against local's: within tol (None: not checked), or a bf16 wire's
    within BF16_WIRE_TOL."""
    grads = [m.call("grads", batch) for m in modes]
    worst = []
    for m, g in zip(modes[1:], grads[1:]):
        err, where = 0.0, ""
        for k, ref in grads[0].items():
            scale = max(ref.abs().max().item(), 1e-30)
            e = (g[k].double() - ref.double()).abs().max().item() / scale
            if e > err:
                err, where = e, k
        worst.append((m.name, err, where))
    line = ", ".join("%s %.1e (%s)" % w for w in worst)
    bad = tol is not None and any(
        e > (BF16_WIRE_TOL if bf16_wire(m) else tol)
        for m, (_, e, _) in zip(modes[1:], worst))
    print("  gradients of one step%s against local, max relative to each "
          "tensor's largest: %s%s" % (when, line, "  FAIL" if bad else ""))
    return not bad


class Servers:
    """The run's convgrad-servers, each of --build with --server-args
    (--alt-server-args instead for alt: modes), listening on TCP and on a
    unix socket of its own in one temporary directory, each started the
    same way: on the rig's server side (namespace, cores and quota) in a
    rig, on 127.0.0.1 off one. A server's unix target is server.unix."""

    def __init__(self, args, in_rig):
        self.args, self.in_rig = args, in_rig
        self.dir = tempfile.mkdtemp(prefix="cg-bench-train-")
        self.running = []
        self.made = 0

    def start(self, alt=False):
        import cgtest
        sock = os.path.join(self.dir, "server%d.sock" % self.made)
        self.made += 1
        args = self.args
        server = cgtest.Server(
            os.path.join(args.build, "server", "convgrad-server"),
            listen="%s:0,unix:%s" % (
                os.environ["CG_RIG_SERVER"] if self.in_rig else "127.0.0.1",
                sock), workers=None,
            extra=(args.alt_server_args if alt else args.server_args).split(),
            prefix=cgtest.rig_server_prefix() if self.in_rig else ())
        server.unix = "unix:" + sock
        self.running.append(server)
        return server

    def stop(self, server):
        self.running.remove(server)
        server.stop()

    def close(self):
        """Stops every server still running, then removes the directory
        (the servers remove their sockets)."""
        while self.running:
            self.stop(self.running[-1])
        if not os.listdir(self.dir):
            os.rmdir(self.dir)


def rig_args(args):
    """rig.sh's options for this run, or None to run on this host."""
    given = [(f, getattr(args, f.replace("-", "_"))) for f in (
        "rate", "trn-cpus", "trn-quota", "srv-cpus", "srv-quota")]
    if all(v is None for _, v in given):
        return None
    if args.rate is None:
        sys.exit("bench_train: --trn-*/--srv-* need --rate (a rig)")
    return [x for f, v in given if v is not None for x in ("--" + f, v)]


def link_gbits(rate):
    """What a plain TCP socket gets through the rig's link, one way, in
    Gbit/s (about a second's worth at rate, at most 300 MB)."""
    import subprocess
    import cgtest
    probe = os.path.join(ROOT, "tests", "net", "probe.py")
    mb = 0
    for unit, bits in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if rate.lower().endswith(unit):
            mb = int(float(rate[:-len(unit)]) * bits / 8e6)
    mb = max(1, min(mb or 100, 300))
    addr = os.environ["CG_RIG_SERVER"]
    sink = subprocess.Popen(cgtest.rig_server_prefix() + [
        sys.executable, probe, "sink", addr, "5201"])
    try:
        out = subprocess.run([sys.executable, probe, "send", addr, "5201",
                              str(mb)], stdout=subprocess.PIPE, text=True,
                             timeout=60)
    finally:
        sink.wait(timeout=60)
    return out.stdout.strip() or "?"


# A bf16 wire's gradients of one ResNet-18 step against local f32's,
# relative to each tensor's largest value: measured 0.3-1.5 % (the
# "wire" part), a few bf16 roundings (2^-9 each) of the layers above.
BF16_WIRE_TOL = 5e-2


# What a call costs beyond its bytes and compute where no bytes cross a
# wire (regions), in ms; over a wire the per-MB figures hold it.
CALL_MS = 1.0


def model_ms(f, overlap):
    """The offloaded step the model of client/python/README.md ("When
    offload pays") predicts, in ms, from the figures f of one round (ms,
    MB, per step): local's step (local), its convolutions' backward
    (conv), forward and optimizer step (forward, optimizer) and the wall
    ms its core gave a CPU ms (trn_stretch: local's wall over its CPU);
    the mode's server compute (its workers' CPU ms, workers_cpu), bytes
    up, down, staged and the weights' gradients among those down
    (weights_down), its calls, the CPU ms its trainer and its server
    spend per MB moved (trn_mb, srv_mb), the wall ms the server's core
    gave a CPU ms (srv_stretch) and the link's Gbit/s (gbits, None: no
    wire). Each side has one core that
    moves its bytes besides its own work (a rig's --trn-cpus and
    --srv-cpus; off a rig, with both on the same cores, it does not
    hold): a transfer on the critical
    path takes both sides' per-MB time or the wire's, whichever is more.
    Staged bytes cost the trainer its CPU during the forward, and their
    wire time only what the trainer's own work does not cover. With
    overlap the server sends diff_src first: after a layer's data half
    (compute/2) the server's core does the weights' half and all its
    byte work while the trainer takes diff_src, runs its own backward
    (and receives the weights' gradients) and sends the next layer's
    inputs, whose server side shares the server's core with the
    weights' half; the next layer starts when both are done. Under a
    CPU quota (quota: the share of a core; local and trn_stretch
    without local's throttled time) the step is at least the trainer's
    work over that share."""
    wire = 8 / f["gbits"] if f["gbits"] else 0.0  # ms per MB
    trn = f["trn_mb"] * f["trn_stretch"]
    srv = f["srv_mb"] * f["srv_stretch"]
    per_mb = max(wire, trn + srv)
    compute = f["workers_cpu"] * f["srv_stretch"]
    moved = f["up"] + f["down"]
    own = f["local"] - f["conv"]
    step = (own + (0 if moved else f["calls"] * CALL_MS) +
            f["staged"] * trn + max(0.0, f["staged"] * wire - own))
    bound = (own + (moved + f["staged"]) * trn) / (f["quota"] or 1.0)
    if not overlap:
        return max(bound, step + compute + moved * per_mb)
    own_backward = own - f["forward"] - f["optimizer"]
    chain = moved - f["weights_down"]
    # The server's core shares its time between the worker (the weights'
    # half) and the threads that move the chain's bytes: those go at half
    # speed while both run. The trainer's core receives the weights'
    # gradients beside its own backward.
    return max(bound, step - own_backward + compute / 2 +
               max(compute / 2 + moved * srv,
                   own_backward + f["weights_down"] * trn +
                   max(chain * wire, chain * (trn + srv) +
                       min(chain * srv, compute / 2))))


def describe_host(args, info):
    """What this run ran on: the CPU and oneDNN's ISA, the rig (rate,
    cores, quotas) and the machine's load. Sets args.link_gbits: what a
    plain socket got through the rig's link (None off a rig); and
    args.server_cores, the cores the server's workers run on."""
    import subprocess
    import torch
    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    args.server_cores = max(1, len(info["cpus"]))
    print("host: %s, %d cores, load %s; server isa %s (oneDNN), %d workers "
          "x %d threads (%s), cpus %s; trainer cpus %s, torch %s, %d "
          "threads" % (
              model, os.cpu_count(), " ".join(
                  "%.2f" % x for x in os.getloadavg()),
              info["cpu_isa"], info["workers"], info["threads_per_worker"],
              info["threads_policy"], info["cpus"],
              sorted(os.sched_getaffinity(0)), torch.__version__,
              torch.get_num_threads()), flush=True)
    if os.environ.get("CG_RIG"):
        import cgtest
        conf = dict(line.split("=", 1) for line in subprocess.run(
            [cgtest.RIG, "show", os.environ["CG_RIG"]], check=True,
            stdout=subprocess.PIPE, text=True).stdout.split())
        gbits = link_gbits(conf["rate"])
        args.link_gbits = float(gbits) if gbits != "?" else None
        print("rig: rate %s (a plain socket: %s Gbit/s), burst %s, mtu %s; "
              "trainer cpus %s quota %s; server cpus %s quota %s "
              "(cgroup %s)" % (
                  conf["rate"], gbits, conf["burst"],
                  conf["mtu"], conf["trn_cpus"], conf.get("trn_quota") or
                  "none", conf["srv_cpus"], conf.get("srv_quota") or "none",
                  conf["cgroup"]), flush=True)


def problem(hw, batch):
    """The initial model and the 4 batches every part trains on, the
    same in every run."""
    import torch
    torch.manual_seed(0)
    model0 = resnet18()
    g = torch.Generator().manual_seed(1)
    return model0, [(torch.randn(batch, 3, hw, hw, generator=g),
                     torch.randint(0, 10, (batch,), generator=g))
                    for _ in range(4)]


# glibc's malloc with fixed thresholds (those convgrad-server sets itself,
# server/main.c), for every mode's process under --trainer-malloc steady.
# With glibc's adaptive ones a trainer's large tensors are mapped and
# unmapped again step after step, and page faults cost 20-60 us on a
# guest like this one's: over the 10 Gbit/s rig (ResNet-18 224x8 f32,
# trainer core 0, server core 1, 8 steps a run, two runs) local's step
# took 1295-1359 ms with 21-34k faults a step against 618-628 ms and
# none with these, an offloaded step 1200-1387 ms (13k faults) against
# 837-924 (none). On a host whose faults cost a microsecond both are
# near the fixed figures.
STEADY_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20),
                 "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


def bench_train(args, servers):
    ok = True
    if args.trainer_malloc == "steady":
        os.environ.update(STEADY_MALLOC)  # the mode processes inherit it
    print("trainer's malloc: %s" % (
        "glibc's defaults" if args.trainer_malloc == "glibc" else
        " ".join("%s=%s" % kv for kv in STEADY_MALLOC.items())))
    for setting in args.settings:
        hw, batch = SETTINGS[setting]
        for dtype in args.dtypes:
            print("resnet18 %dx%d batch %d %s%s, torch %d threads (%d "
                  "offloaded), each mode in a process of its own"
                  % (hw, hw, batch, dtype,
                     " (autocast)" if dtype == "bf16" else "",
                     args.threads, args.offload_threads))
            modes = make_modes(args, setting, dtype, servers)
            try:
                ok &= train_modes(args, modes, dtype)
            finally:
                close_modes(modes, servers)
    return ok


def train_modes(args, modes, dtype):
    """Times modes (local first) in interleaved rounds and prints their
    figures; False if a mode's gradients were not local's."""
    tol = 1e-5 if dtype == "f32" else None
    ok = check_gradients(modes, 0, tol)
    for m in modes:
        m.call("warmup", args.warmup)
    if any(m.call("shares") for m in modes):
        # local_share="auto" picks its cuts at a shape's third call,
        # after the check above: one more step from local's
        # weights, with the cuts, within the same tolerance.
        state = modes[0].call("state")
        for m in modes[1:]:
            m.call("load", state)
        ok &= check_gradients(modes, 1, tol, " with the trainer's cuts")
    for m in modes:
        m.call("reset")
    for r in range(args.rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for m in order:
            m.rounds.append(m.call("round"))
            if m is modes[0]:
                m.rounds[-1]["conv"], m.rounds[-1]["conv_cpu"] = \
                    m.timer.call("conv")
    print_modes(args, modes, dtype == "bf16")
    return ok


def time_steps(steps, trainer, batches, autocast):
    """One round of a trainer (in its mode's process): steps steps, the
    median of their wall ms, forward and optimizer ms, the process's CPU
    ms and the server's (every thread's, and its workers'); per step the
    client's calls, bytes (MB) and server compute, and its arena's
    MiB."""
    from convgrad import _quota
    client, pid = trainer.client, trainer.server_pid
    figures = []
    before = client.stats() if client else None
    for i in range(steps):
        c0, s0 = time.process_time(), server_cpu_ms(pid)
        q0 = _quota.cpu_quota()[1]
        t0 = time.perf_counter()
        trainer.step(*batches[i % 4], autocast)
        wall = (time.perf_counter() - t0) * 1e3
        s1 = server_cpu_ms(pid)
        figures.append((wall,) + trainer.last_parts + (
            (time.process_time() - c0) * 1e3, s1[0] - s0[0], s1[1] - s0[1],
            _quota.cpu_quota()[1] - q0))
    f = dict(zip(("ms", "forward", "optimizer", "backward",
                  "server_backward", "cpu", "server_cpu", "workers_cpu",
                  "throttled"),
                 (statistics.median(x) for x in zip(*figures))))
    if client:
        after = client.stats()
        for k, key, unit in (("calls", "calls", 1),
                             ("up", "bytes_sent", 1e6),
                             ("down", "bytes_received", 1e6),
                             ("staged", "staged_bytes", 1e6),
                             ("compute", "compute_ms", 1)):
            f[k] = (after[key] - before[key]) / unit / steps
        f["arena"] = after["arena_bytes"] / 2**20
    return f


def print_modes(args, modes, autocast):
    """Per mode the medians over rounds: ms/step, its ratio to local's in
    the same round, calls, bytes, the server's compute, the arena, the
    CPU per MB moved of the trainer (beyond local's less local's
    convolutions' backward) and of the server (beyond its workers'), and
    the model's step (model_ms, each round's figures) with its ratio to
    the measured one in the same round."""
    import torch
    from convgrad import _quota
    quota = _quota.cpu_quota()[0]
    local = modes[0].rounds
    # Local's step without the time its quota stopped it: the model
    # charges the quota against each mode's own CPU (model_ms's bound).
    unthrottled = [l["ms"] - l["throttled"] for l in local]
    params = sum(p.numel() for mod in resnet18().modules()
                 if isinstance(mod, torch.nn.Conv2d)
                 for p in mod.parameters())
    med = statistics.median
    # The wall ms a CPU ms took on the server's core, from other
    # processes: its compute's wall over its workers' CPU in the round's
    # least disturbed mode (overlapped calls' bytes also arrive while
    # its workers compute, which the model counts as bytes).
    srv_stretch = [min([x["compute"] / x["workers_cpu"]
                        for x in xs[1:] if x["workers_cpu"] > 0] or [1.0])
                   for xs in zip(*(m.rounds for m in modes))]
    print("  %-18s %9s %6s %6s %7s %7s %7s %8s %9s %6s %7s %7s %8s %6s" % (
        "mode", "ms/step", "ratio", "calls", "MB up", "MB down",
        "staged", "MB waits", "compute", "arena", "trn/MB", "srv/MB",
        "model ms", "model/"))
    for m in modes:
        line = "  %-18s %9.1f %5.2fx" % (
            m.name, med(x["ms"] for x in m.rounds),
            med(x["ms"] / l["ms"] for x, l in zip(m.rounds, local)))
        if m.server is not None:
            overlap = "serial" not in m.name.split("+")
            d_w = params * (2 if autocast or bf16_wire(m) else 4) / 1e6
            moved = [x["up"] + x["down"] + x["staged"] for x in m.rounds]
            trn_mb = med((x["cpu"] - l["cpu"] + l["conv_cpu"]) / b
                         for x, l, b in zip(m.rounds, local, moved)) \
                if moved[0] else 0.0
            srv_mb = med((x["server_cpu"] - x["workers_cpu"]) / b
                         for x, b in zip(m.rounds, moved)) \
                if moved[0] else 0.0
            predicted = []
            for x, l, k, lw in zip(m.rounds, local, srv_stretch,
                                   unthrottled):
                # Local's convolutions' backward as their share of local's
                # CPU in the round (their own run, timed right after
                # local's step, meets another moment's load).
                conv = lw * l["conv_cpu"] / l["cpu"]
                f = dict(x, local=lw, conv=conv, quota=quota,
                         forward=l["forward"] * lw / l["ms"],
                         optimizer=l["optimizer"] * lw / l["ms"],
                         trn_stretch=lw / l["cpu"], trn_mb=trn_mb,
                         srv_mb=srv_mb, srv_stretch=k,
                         weights_down=d_w if x["down"] else 0.0,
                         gbits=args.link_gbits if x["down"] else None)
                predicted.append(model_ms(f, overlap))
            x = {k: med(r[k] for r in m.rounds) for k in m.rounds[0]}
            # The bytes the backward waits for: all but the weights'
            # gradients, which overlap sends off its critical path.
            waits = x["up"] + x["down"] - (d_w if x["down"] and overlap
                                           else 0)
            line += (" %6.0f %7.1f %7.1f %7.1f %8.1f %9.1f %6.0f %7.2f "
                     "%7.2f %8.0f %5.2fx" % (
                         x["calls"], x["up"], x["down"], x["staged"], waits,
                         x["compute"], x["arena"], trn_mb, srv_mb,
                         med(predicted),
                         med(p / r["ms"] for p, r in zip(predicted,
                                                         m.rounds))))
        print(line + "   (rounds: %s)" % " ".join(
            "%.0f" % x["ms"] for x in m.rounds), flush=True)
        shares = m.call("shares")
        if shares:
            print("    trainer's rows of each call: %s" % shares)
        if m.server is not None:
            print_server_floor(args, m, local)
    print("  local: convolutions' backward %.1f ms/step (the part an "
          "offloaded step replaces; aten::convolution_backward of each "
          "conv's shapes; %.0f %% of local's CPU), forward %.1f, optimizer "
          "%.1f; wall ms per CPU ms (rounds): trainer %s (less its "
          "quota's throttled time), server %s; load %s" % (
              med(l["conv"] for l in local),
              100 * med(l["conv_cpu"] / l["cpu"] for l in local),
              med(l["forward"] for l in local),
              med(l["optimizer"] for l in local),
              " ".join("%.2f" % (lw / l["cpu"])
                       for lw, l in zip(unthrottled, local)),
              " ".join("%.2f" % k for k in srv_stretch),
              " ".join("%.2f" % x for x in os.getloadavg())), flush=True)
    # The trainer keeps the rest of its step, and the next forward waits
    # for every gradient: no offload beats 1 - that share.
    print("  bound: offloaded / local >= %.2fx (1 - the convolutions' "
          "backward share of local's CPU: every byte and wait free)"
          % (1 - med(l["conv_cpu"] / l["cpu"] for l in local)), flush=True)


def print_server_floor(args, mode, local):
    """How much of an offload mode's backward its server was busy, and
    the step that business alone allows: the server gets a step's work
    only once the backward starts, and the backward ends only once it
    has computed (and moved) every gradient, so with the trainer's own
    forward and optimizer step before and after it no step is shorter
    than forward + optimizer + the server's CPU in the backward over its
    cores, whatever the link (the trainer's share, local_share, takes
    work off the server and lowers it)."""
    med = statistics.median
    cores = args.server_cores
    busy = med(x["server_backward"] / (x["backward"] * cores)
               for x in mode.rounds)
    floor = med((x["forward"] + x["optimizer"] +
                 x["server_backward"] / cores) / l["ms"]
                for x, l in zip(mode.rounds, local))
    print("    backward %.0f ms (forward %.0f, optimizer %.0f); the server's "
          "CPU in it %.0f ms, %.0f %% of its %d core%s; the server-bound "
          "floor, (forward + optimizer + that CPU / cores) / local: %.2fx"
          % (med(x["backward"] for x in mode.rounds),
             med(x["forward"] for x in mode.rounds),
             med(x["optimizer"] for x in mode.rounds),
             med(x["server_backward"] for x in mode.rounds), 100 * busy,
             cores, "" if cores == 1 else "s", floor), flush=True)


def rel_err(got, ref):
    ref = ref.double()
    return ((got.double() - ref).abs().max() /
            max(ref.abs().max().item(), 1e-30)).item()


def layer_tensors(local, batch):
    """One step of local on batch: its convs, and each conv's module,
    input, grad_output and whether the input wants a gradient, in the
    order the backward met them."""
    import torch.nn as nn
    import torch.nn.functional as F
    seen = []

    def keep(m, inp, out):
        out.register_hook(lambda gy: seen.append(
            (m, inp[0].detach(), gy.detach(), inp[0].requires_grad)))
    convs = [m for m in local.modules() if isinstance(m, nn.Conv2d)]
    handles = [m.register_forward_hook(keep) for m in convs]
    F.cross_entropy(local(batch[0]), batch[1]).backward()
    for h in handles:
        h.remove()
    return convs, seen


def conv_attrs(m):
    """The call attributes of nn.Conv2d m (int padding)."""
    return dict(strides=list(m.stride), pads_begin=list(m.padding),
                pads_end=list(m.padding), dilations=list(m.dilation),
                groups=m.groups, data_format="NCX", weights_format="OIX")


def bench_share(args, tcp):
    """The error of a call shared with the trainer (offload's
    local_share) against the exact gradients, beside local's and the
    server's whole call's (the "share" part)."""
    import torch
    import convgrad
    import convgrad.torch as ct
    for setting in args.settings:
        hw, batch = SETTINGS[setting]
        model0, batches = problem(hw, batch)
        local = copy.deepcopy(model0)
        _, seen = layer_tensors(local, batches[0])
        client = convgrad.Client(tcp, shm=False)
        print("a share for the trainer: resnet18 %dx%d batch %d f32, each "
              "conv's tensors of local's step; max |g - exact| / max "
              "|exact| per tensor, exact: torch in f64 on the same inputs; "
              "whole: the server's call; share N: offload(local_share=N)"
              % (hw, hw, batch))
        print("  %-24s %-16s %-4s %9s %9s %9s %9s" % (
            "layer", "input", "grad", "local", "whole", "share .5",
            "share .25"))
        for m, x, gy, need_x in reversed(seen):  # forward order
            w = m.weight.detach()
            attrs = conv_attrs(m)

            def torch_grads(dt):
                return torch.ops.aten.convolution_backward(
                    gy.to(dt), x.to(dt), w.to(dt), [0], m.stride, m.padding,
                    m.dilation, False, [0, 0], m.groups,
                    [need_x, True, False])[:2]
            exact = torch_grads(torch.float64)
            rows = {"local": torch_grads(torch.float32)}
            whole = client.conv_backward(
                x, gy, w, outputs=(["diff_src"] if need_x else []) +
                ["diff_weights"], **attrs)
            rows["whole"] = (whole.get("diff_src"), whole["diff_weights"])
            for share in (0.5, 0.25):
                mm = ct.offload(copy.deepcopy(m), client, local_share=share)
                xr = x.clone().requires_grad_(need_x)
                mm(xr).backward(gy)
                rows[share] = (xr.grad, mm.weight.grad)
            name = next(n for n, c in local.named_modules() if c is m)
            for i, grad in enumerate(("dX", "dW")):
                if exact[i] is None:
                    continue
                print("  %-24s %-16s %-4s %s" % (
                    name, "x".join(map(str, x.shape)), grad, " ".join(
                        "%9.1e" % rel_err(rows[k][i], exact[i])
                        for k in ("local", "whole", 0.5, 0.25))), flush=True)
        client.close()


def bench_wire(args, tcp):
    """The bf16 wire's error against f32 (the "wire" part, above)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import convgrad
    import convgrad.torch as ct
    for setting in args.settings:
        hw, batch = SETTINGS[setting]
        model0, batches = problem(hw, batch)
        print("bf16 wire against f32: resnet18 %dx%d batch %d"
              % (hw, hw, batch), flush=True)
        local = copy.deepcopy(model0)
        convs, seen = layer_tensors(local, batches[0])
        client = convgrad.Client(tcp, shm=False)
        remote = ct.offload(copy.deepcopy(model0), client, wire="bf16")
        F.cross_entropy(remote(batches[0][0]), batches[0][1]).backward()
        through = {id(m): rel_err(r.weight.grad, m.weight.grad)
                   for m, r in zip(convs, (m for m in remote.modules()
                                           if isinstance(m, nn.Conv2d)))}
        print("  error: max |bf16 wire - f32| / max |f32| per tensor; "
              "'one call': on local's tensors of the layer, 'step': the "
              "offloaded step's weight gradient")
        print("  %-24s %-18s %10s %10s %12s %10s" % (
            "layer", "input", "dW (call)", "dX (call)", "dW f32 out",
            "dW (step)"))
        bf = torch.bfloat16
        for m, x, gy, need_x in reversed(seen):  # forward order
            w = m.weight.detach()
            attrs = conv_attrs(m)
            outputs = (["diff_src"] if need_x else []) + ["diff_weights"]
            ref = torch.ops.aten.convolution_backward(
                gy, x, w, [0], m.stride, m.padding, m.dilation, False,
                [0, 0], m.groups, [need_x, True, False])
            got = client.conv_backward(x.to(bf), gy.to(bf), w.to(bf),
                                       outputs=outputs, **attrs)
            # What diff_weights in f32 would be: bf16 products are exact
            # in f32, so torch's f32 kernel on the rounded inputs is an
            # f32-accumulated bf16 call's answer before its last rounding.
            f32_out = torch.ops.aten.convolution_backward(
                gy.to(bf).float(), x.to(bf).float(), w.to(bf).float(), [0],
                m.stride, m.padding, m.dilation, False, [0, 0], m.groups,
                [False, True, False])[1]
            name = next(n for n, c in local.named_modules() if c is m)
            print("  %-24s %-18s %10.1e %10s %12.1e %10.1e" % (
                name, "x".join(map(str, x.shape)),
                rel_err(got["diff_weights"], ref[1]),
                "%.1e" % rel_err(got["diff_src"], ref[0]) if need_x
                else "-", rel_err(f32_out, ref[1]), through[id(m)]))
        client.close()
        curves = {}
        for wire in ("local", "f32", "bf16"):
            model = copy.deepcopy(model0)
            c = None
            if wire != "local":
                c = convgrad.Client(tcp, shm=False)
                ct.offload(model, c, wire=wire)
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            curves[wire] = []
            for i in range(args.wire_steps):
                x, y = batches[i % 4]
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                curves[wire].append(loss.item())
            if c is not None:
                c.close()
        print("  loss over %d steps of SGD (lr 0.01, momentum 0.9, 4 "
              "batches in turn) from equal weights:" % args.wire_steps)
        for wire in ("local", "f32", "bf16"):
            print("  %-6s %s" % (wire, " ".join(
                "%.4f" % v for v in curves[wire])))
        for wire in ("f32", "bf16"):
            d = [abs(a - b) for a, b in zip(curves[wire], curves["local"])]
            i = d.index(max(d))
            print("  %s wire - local: max |difference| %.1e (step %d, "
                  "local's loss %.4f), last step %.1e" % (
                      wire, d[i], i + 1, curves["local"][i], d[-1]),
                  flush=True)


def ps_main(rank, port, threads):
    """The RemoteModule's process: serves RPCs until the trainer is done."""
    import torch
    import torch.distributed.rpc as rpc
    torch.set_num_threads(threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    rpc.init_rpc("ps", rank=rank, world_size=2)
    rpc.shutdown()


def bench_layer(args, unix):
    import socket
    import torch
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc
    import torch.multiprocessing as mp
    import torch.nn as nn
    from torch.distributed.nn import RemoteModule
    import convgrad.torch as ct

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    ps = ctx.Process(target=ps_main, args=(1, port, torch.get_num_threads()))
    ps.start()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    rpc.init_rpc("trainer", rank=0, world_size=2)
    try:
        torch.manual_seed(0)
        conv = nn.Conv2d(64, 64, 3, padding=1)
        x = torch.randn(8, 64, 56, 56)
        gy = torch.randn(8, 64, 56, 56)
        local = copy.deepcopy(conv)
        offloaded = ct.offload(copy.deepcopy(conv), unix, overlap=False)
        remote = RemoteModule("ps/cpu", nn.Conv2d, args=(64, 64, 3),
                              kwargs={"padding": 1})

        def run_local(m):
            xi = x.clone().requires_grad_()
            m.zero_grad()
            m(xi).backward(gy)

        def run_remote():
            xi = x.clone().requires_grad_()
            with dist_autograd.context() as cid:
                y = remote(xi)
                dist_autograd.backward(cid, [(y * gy).sum()])
        ways = [("local", lambda: run_local(local)),
                ("convgrad offload", lambda: run_local(offloaded)),
                ("RemoteModule", run_remote)]
        times = {name: [] for name, _ in ways}
        for _, fn in ways:
            for _ in range(args.warmup):
                fn()
        for r in range(args.rounds):
            for name, fn in ways[r % 3:] + ways[:r % 3]:
                t = []
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    fn()
                    t.append(time.perf_counter() - t0)
                times[name].append(statistics.median(t) * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        print("one layer: 3x3 64->64 56x56 batch 8 f32, forward + backward, "
              "torch %d threads" % torch.get_num_threads())
        for name, _ in ways:
            print("  %-18s %8.1f ms/step  %5.2fx local  %5.2fx RemoteModule"
                  "   (rounds: %s)" % (
                      name, med[name], med[name] / med["local"],
                      med[name] / med["RemoteModule"],
                      " ".join("%.1f" % t for t in times[name])))
        offloaded._convgrad_client.close()
    finally:
        rpc.shutdown()
        ps.join()


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS),
                    choices=list(SETTINGS))
    ap.add_argument("--dtypes", nargs="+", default=["f32", "bf16"],
                    choices=["f32", "bf16"])
    ap.add_argument("--modes", nargs="+",
                    default=["tcp", "unix+shm", "unix+shm+keep",
                             "unix+shm+serial"],
                    help="offload modes beside local: tcp or unix+shm, "
                    "either as alt:tcp or alt:unix+shm (a server started "
                    "with --alt-server-args), each optionally with +serial "
                    "(overlap=False), +keep (torch's threads kept through "
                    "the backward pass), +narrow (backward_threads=1), "
                    "+nostage (the backward sends src and weights instead "
                    "of naming them staged), +stage (staged: the default), "
                    "+content (src staged by content, not a private "
                    "id), +bf16, +pipe[N], +whole and "
                    "+share[N] (the trainer computes a share of each call: "
                    "local_share='auto', or N%%)")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--steps", type=int, default=1,
                    help="timed steps per mode and round")
    # A fresh server's store takes its first staged tensors in fresh
    # memory until it holds its peer share (512 MiB by default: 5 steps
    # of ResNet-18 224x8's 103 MB), and every buffer of those steps'
    # backward faults in too (6984 faults a step against 3-313 after,
    # about 95 ms of a 10 Gbit/s step on this guest): the timed rounds
    # start after that.
    ap.add_argument("--warmup", type=int, default=6,
                    help="untimed steps per mode before the rounds")
    ap.add_argument("--threads", type=int,
                    default=len(os.sched_getaffinity(0)),
                    help="torch threads (default: the cores this process "
                    "may use)")
    ap.add_argument("--offload-threads", type=int,
                    help="torch threads of the offloaded modes (default: "
                    "--threads)")
    ap.add_argument("--server-args", default="",
                    help="extra convgrad-server flags, space-separated")
    ap.add_argument("--alt-server-args",
                    help="flags of the alt: modes' servers instead of "
                    "--server-args "
                    "(e.g. '--workers 1 --threads-per-worker 2')")
    ap.add_argument("--trainer-malloc", choices=("steady", "glibc"),
                    default="steady",
                    help="the mode processes' malloc: steady (fixed "
                    "thresholds, STEADY_MALLOC: the default) or glibc "
                    "(its adaptive defaults, whose page faults dominate a "
                    "step on a guest where faults are dear)")
    ap.add_argument("--only", choices=("train", "layer", "wire", "share"),
                    help="one part (default: train and layer)")
    ap.add_argument("--wire-steps", type=int, default=20,
                    help="steps of the wire part's loss curves")
    rig = ap.add_argument_group(
        "a shaped link (tests/net/rig.sh, as root)")
    rig.add_argument("--rate", help="the link's rate, tc's units (10gbit, "
                     "1gbit): run across a rig")
    rig.add_argument("--trn-cpus", help="the trainer's cores (taskset list)")
    rig.add_argument("--trn-quota", help="the trainer's CPU quota, percent "
                     "of one core (50: half speed)")
    rig.add_argument("--srv-cpus", help="the server's cores")
    rig.add_argument("--srv-quota", help="the server's CPU quota, percent")
    args = ap.parse_args()
    import cgtest
    rig = rig_args(args)
    if rig is not None:
        rc = cgtest.rig_enter("bt", rig)
        if rc is not None:
            return rc
    if args.offload_threads is None:
        args.offload_threads = args.threads
    os.environ.setdefault("CONVGRAD_LIBRARY", os.path.join(
        args.build, "client", "libcgclient.so"))
    import torch
    import convgrad
    torch.set_num_threads(args.threads)
    servers = Servers(args, rig is not None)
    ok = True
    try:
        server = servers.start()
        args.link_gbits = None
        describe_host(args, convgrad.Client(server.target).info())
        if args.alt_server_args is not None:
            print("alt server: %s" % args.alt_server_args)
        if args.only in (None, "train"):
            ok = bench_train(args, servers)
        if args.only in (None, "layer"):
            bench_layer(args, server.unix)
        if args.only == "wire":
            bench_wire(args, server.target)
        if args.only == "share":
            bench_share(args, server.target)
    finally:
        servers.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
