#!/usr/bin/python3
"""test_server_warmup.py - --warmup FILE: while the workers build the
file's kernels the server listens but health says NOT_SERVING and no
readiness line is out; then health turns SERVING, the line comes, the log
counts what was warmed, and a call of a warmed shape is answered, its
first run not checked again: the warm-up's checked runs on random inputs
were its first runs (test_server_checks.c counts them). A bad file stops
the start with the file, the line number and the problem."""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

# Heavy enough that the workers take some hundreds of ms, so health is
# asked meanwhile.
HEAVY = """# a warm-up list: problems.txt lines, options after the descriptor
mb8ic64ih56oc64oh56kh3ph1n"res2a 3x3 64->64 56^2"
mb8ic64ih28oc64oh28kh1ph0 dtype=bf16 data_format=NCX
deconv: mb2ic8ih4oc4oh8kh4sh2ph1 op=ConvTransposeBackwardData
"""


def health(cli, target):
    r = subprocess.run([cli, "health", "--target", target, "--deadline",
                        "2000"], capture_output=True, text=True, timeout=30)
    return r.stdout.strip(), r.returncode


def wait_log(log, needle):
    """The server log's lines with needle, once there is one (5 s at most:
    a call's line is written when it ends, after its answer)."""
    for _ in range(50):
        log.seek(0)
        lines = [ln for ln in log.read().splitlines() if needle in ln]
        if lines:
            return lines
        time.sleep(0.1)
    return []


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--server", required=True)
    ap.add_argument("--cli", required=True)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cgs-warmup-")
    sock = os.path.join(tmp, "s.sock")
    target = "unix:" + sock
    warm = os.path.join(tmp, "warm.txt")
    with open(warm, "w") as f:
        f.write(HEAVY)
    log = open(os.path.join(tmp, "server.log"), "w+")
    # One first run checked: the warm-up's checked runs make it.
    proc = subprocess.Popen([args.server, "--listen", target, "--workers", "2",
                             "--warmup", warm, "--check-first-runs", "1",
                             "--check-rate", "0"], stdout=subprocess.PIPE,
                            stderr=log, text=True)
    try:
        seen = []
        for _ in range(600):  # bounded: 60 s at most
            if os.path.exists(sock):
                status, code = health(args.cli, target)
                seen.append((status, code))
                if status == "SERVING":
                    break
            time.sleep(0.01)
        assert seen and seen[-1] == ("SERVING", 0), seen
        assert ("NOT_SERVING", 1) in seen, ("never NOT_SERVING", seen)
        # Every answer before SERVING was NOT_SERVING, and the line is out
        # by the time health says SERVING (it is printed first).
        assert all(s == ("NOT_SERVING", 1) for s in seen[:-1]), seen
        line = proc.stdout.readline()
        assert "convgrad-server ready" in line, line
        log.seek(0)
        text = log.read()
        assert text.count("warmed up 3 layers") == 2, text
        assert "check failed" not in text, text
        r = subprocess.run([args.cli, "run", "--target", target, "--op",
                            "ConvTransposeBackwardData", "--problem",
                            "mb2ic8ih4oc4oh8kh4sh2ph1", "--check"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (r.stdout, r.stderr)
        # A caller's first run of a warmed shape: the warm-up checked it.
        r = subprocess.run([args.cli, "run", "--target", target, "--op",
                            "ConvolutionBackwardData", "--problem",
                            "mb8ic64ih56oc64oh56kh3ph1"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (r.stdout, r.stderr)
        first = [ln for ln in wait_log(log, "op=ConvolutionBackwardData ")]
        assert first and "check=" not in first[0], first
        print("health during warm-up: %d x NOT_SERVING, then SERVING"
              % (len(seen) - 1))
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        proc.stdout.close()

    bad = [("ic3oc8ih5kh3\nmb2ic8ih4oc8kh3 dtype=f64\n", ":2: dtype: invalid "
            "value \"f64\""),
           ("\n\nmb2oc8ih4kh3\n", ":3: descriptor: ic and oc are required"),
           ("deconv: ic3oc8ih5kh3 op=ConvolutionBackward\n",
            ":1: op: ConvolutionBackward does not belong to a deconvolution"),
           ("mb2ic8ih4oc8kh3 size=3\n", ":1: unknown option \"size\""),
           ("mb4096ic4096ih512oc4096kh3\n", ":1: "),
           ]
    for text, want in bad:
        with open(warm, "w") as f:
            f.write(text)
        r = subprocess.run([args.server, "--listen", target, "--warmup", warm],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, (text, r.returncode, r.stderr)
        assert "--warmup " + warm + want in r.stderr, (text, r.stderr)
        assert "ready" not in r.stdout, r.stdout
    r = subprocess.run([args.server, "--warmup", os.path.join(tmp, "none")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "cannot open" in r.stderr, r.stderr
    print("bad files refused with their line: %d cases" % (len(bad) + 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
