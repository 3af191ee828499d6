"""Shared by the convgrad package tests: a real convgrad-server on an
ephemeral port, and the package made importable from the source tree.

Each test script takes --server PATH (convgrad-server) and expects
CONVGRAD_LIBRARY (libcgclient.so of the build) in the environment; ctest
sets both (tests/python/CMakeLists.txt)."""
import argparse
import atexit
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))


def unlink_shm_of(pid, why):
    """Removes the /dev/shm objects the client library named for process
    pid (convgrad-PID-...), saying why on stderr. Names only: mappings
    stay valid."""
    own = "convgrad-%d-" % pid
    for name in os.listdir("/dev/shm"):
        if name.startswith(own):
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except FileNotFoundError:
                continue
            print("cgtest: removed /dev/shm/%s %s" % (name, why),
                  file=sys.stderr)


@atexit.register
def _unlink_own_shm():
    """Runs after convgrad's own exit handler (registered later, run
    earlier), which closes the clients' arenas: what is left of this
    process in /dev/shm is a Region a failed test never freed (its
    traceback holds it)."""
    unlink_shm_of(os.getpid(), "at exit (no test freed it)")


def spawn(fn, args, nprocs):
    """torch.multiprocessing.spawn(fn, args, nprocs) joined, then what its
    workers left in /dev/shm removed. When one worker fails, spawn ends
    the others with SIGTERM, which skips their exit handlers: the regions
    of their clients' arenas would stay (a sibling's failure left one
    convgrad-PID-1-... object of the terminated rank here). A worker that
    exited by itself has already removed its own."""
    import torch.multiprocessing as mp
    ctx = mp.spawn(fn, args=args, nprocs=nprocs, join=False)
    try:
        while not ctx.join():
            pass
    finally:
        for pid in ctx.pids():
            unlink_shm_of(pid, "of worker %d (ended before its exit "
                          "handlers ran)" % pid)


def parse_args(description):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--server", required=True)
    return ap.parse_args()


class Server:
    """A convgrad-server process listening on listen (default 127.0.0.1
    with an ephemeral port; a comma list may add unix:PATH), with --workers
    workers (None: the server's default), its command line after prefix
    (e.g. unshare); stop() checks that it exits 0 on
    SIGTERM. target is the TCP address it got (None without one)."""

    def __init__(self, path, extra=(), listen="127.0.0.1:0", prefix=(),
                 workers=2):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="cgpy-server-",
                                               suffix=".log")
        flags = ["--workers", str(workers)] if workers else []
        self.proc = subprocess.Popen(
            list(prefix) + [path, "--listen", listen] + flags + list(extra),
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"listen=(-|([^ ]+):(\d+))", line)
        if not m:
            self.proc.kill()
            self.log.seek(0)
            raise SystemExit("server did not get ready: %r %s"
                             % (line, self.log.read()[-2000:]))
        # "-": unix sockets only
        self.port = int(m.group(3)) if m.group(3) else None
        self.target = "%s:%d" % (m.group(2), self.port) if self.port else None

    def log_lines(self, needle):
        """The lines of the server's log so far that contain needle."""
        self.log.flush()
        with open(self.log.name) as f:
            return [line for line in f if needle in line]

    def stop(self):
        self.proc.terminate()
        rc = self.proc.wait(timeout=30)
        self.proc.stdout.close()
        if rc != 0:
            self.log.seek(0)
            sys.stderr.write(self.log.read()[-4000:])
            raise SystemExit("server exited with %d" % rc)
        self.log.close()


RIG = os.path.join(HERE, "..", "net", "rig.sh")


def rig_enter(prefix, rig_args):
    """Outside a rig (tests/net/rig.sh): builds one named prefix and this
    process's pid, runs this script again with the same arguments on its
    trainer's side (rig.sh run ... rig_args), tears it down and returns
    the exit status (77, skipped, where no rig can be built). Inside one
    (CG_RIG set): None."""
    if os.environ.get("CG_RIG"):
        return None
    why = subprocess.run([RIG, "check"], stdout=subprocess.PIPE, text=True)
    if why.returncode != 0:
        print(why.stdout.strip(), flush=True)
        return why.returncode
    name = "%s%d" % (prefix, os.getpid() % 10 ** (8 - len(prefix)))
    return subprocess.call([RIG, "run", name] + list(rig_args) +
                           ["--", sys.executable] + sys.argv)


def rig_server_prefix(side="srv"):
    """Inside a rig: the command prefix that runs a program on a server's
    side (its namespace, cgroup and cores): srv, or srvI for replica I."""
    return [RIG, "exec", os.environ["CG_RIG"], side, "--"]


def rig_link_bytes():
    """Inside a rig, on the trainer's side: (tx, rx) bytes of its end of
    the link so far."""
    import json
    out = subprocess.run(["ip", "-j", "-s", "link", "show", "dev", "cgv0"],
                         check=True, stdout=subprocess.PIPE, text=True)
    stats = json.loads(out.stdout)[0]["stats64"]
    return stats["tx"]["bytes"], stats["rx"]["bytes"]


def rel_err(got, ref):
    """Largest absolute difference relative to the largest reference
    magnitude, in float64."""
    import torch
    got = got.double() if isinstance(got, torch.Tensor) else torch.from_numpy(
        got).double()
    ref = ref.double()
    scale = max(ref.abs().max().item(), 1e-30)
    return (got - ref).abs().max().item() / scale


# Type-fit bounds of rel_err: the server accumulates in f32 and rounds the
# result once, so bf16 (8-bit mantissa) and f16 (11-bit) results differ
# from an f64 reference by about one rounding of the largest values.
TOLERANCE = {"f32": 2e-5, "bf16": 1e-2, "f16": 2e-3}
