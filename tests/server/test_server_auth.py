#!/usr/bin/python3
"""test_server_auth.py - bearer tokens (--auth-tokens) through the CLI: a
plain token and a sha256: entry each served, with their labels in the log
and never the tokens; no token and an unknown token refused
UNAUTHENTICATED for Compute and GetServerInfo and counted in the metrics;
health open to probes, closed with --auth-health; SIGHUP swapping the file
while a slow call runs (the call finishes, the old token is refused, the
new one served) and keeping the old table when the new file is broken; a
plaintext address off loopback refused at start unless
--allow-insecure-auth; bad token files refused at start naming the line."""
import argparse
import hashlib
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request

from test_server_tls import run, start as tls_start, stop

TOKEN_A = "alpha-0123456789abcdef"
TOKEN_B = "bravo-0123456789abcdef"
TOKEN_C = "charlie-0123456789abcdef"
PROBLEM = ["--op", "ConvolutionBackwardData", "--problem",
           "mb2ic8ih10oc16oh10kh3ph1", "--check"]


def start(server, args):
    """test_server_tls's start on 127.0.0.1:0 (a later --listen wins)."""
    return tls_start(server, ["--listen", "127.0.0.1:0"] + args)


def cli(tool, target, *args, token=None):
    env = dict(os.environ)
    env.pop("CONVGRAD_TOKEN", None)
    if token is not None:
        env["CONVGRAD_TOKEN"] = token
    return subprocess.run([tool, args[0], "--target", target] + list(args[1:]),
                          capture_output=True, text=True, timeout=120,
                          env=env)


def ok(tool, target, token):
    r = cli(tool, target, "run", *PROBLEM, token=token)
    assert r.returncode == 0 and ": OK" in r.stdout, (r.stdout, r.stderr)
    r = cli(tool, target, "info", token=token)
    assert r.returncode == 0, r.stderr


def unauthenticated(tool, target, token, want):
    for cmd in (["run"] + PROBLEM, ["info"]):
        r = cli(tool, target, *cmd, token=token)
        assert r.returncode != 0, (cmd, r.stdout)
        assert "UNAUTHENTICATED" in r.stderr and want in r.stderr, \
            (cmd, r.stderr)


def scrape(port):
    with urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port,
                                timeout=10) as resp:
        return resp.read().decode()


def wait_for(log, text, timeout=10):
    until = time.time() + timeout
    while time.time() < until:
        log.seek(0)
        if text in log.read():
            return
        time.sleep(0.05)
    raise AssertionError("no %r in the log" % text)


def refused_at_start(server, args, want):
    r = subprocess.run([server] + args, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1, (args, r.returncode, r.stderr)
    assert want in r.stderr, (args, r.stderr)
    for t in (TOKEN_A, TOKEN_B, TOKEN_C):
        assert t not in r.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--server", required=True)
    ap.add_argument("--cli", required=True)
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="cgs-auth-")
    tokens = os.path.join(d, "tokens")
    digest = hashlib.sha256(TOKEN_B.encode()).hexdigest()
    with open(tokens, "w") as f:
        f.write("# trainers\n%s trainer-a\n\nsha256:%s\n" % (TOKEN_A, digest))

    proc, target, ready, log = start(args.server, [
        "--auth-tokens", tokens, "--metrics-listen", "127.0.0.1:0",
        "--max-request-flops", "0"])
    try:
        ok(args.cli, target, TOKEN_A)
        ok(args.cli, target, TOKEN_B)
        unauthenticated(args.cli, target, "", "needs 'authorization: Bearer")
        unauthenticated(args.cli, target, TOKEN_C, "unknown token")
        r = cli(args.cli, target, "health", token="")
        assert r.stdout.strip() == "SERVING", (r.stdout, r.stderr)
        log.seek(0)
        text = log.read()
        assert re.search(r"compute id=\d+ peer=\S+ client=trainer-a ", text)
        assert re.search(r"compute id=\d+ peer=\S+ client=token-%s " %
                         digest[:8], text), text[-3000:]
        assert text.count("status=UNAUTHENTICATED") == 4, text[-3000:]
        for t in (TOKEN_A, TOKEN_B, TOKEN_C):
            assert t not in text
        # The metrics count the refused Compute calls under their code.
        port = re.search(r" metrics=127\.0\.0\.1:(\d+)", ready).group(1)
        body = scrape(port)
        assert 'convgrad_requests_total{op="unknown",dtype="unknown",' \
            'code="UNAUTHENTICATED"} 2\n' in body, body[:2000]

        # SIGHUP while a slow call runs: it finishes under the old table.
        slow = []
        t = threading.Thread(target=lambda: slow.append(cli(
            args.cli, target, "run", "--op", "ConvolutionBackwardWeights",
            "--problem", "mb64ic256ih28oc256oh28kh3ph1", token=TOKEN_A)))
        t.start()
        # Reload once it holds its reservation: its token was checked.
        until = time.time() + 60
        while not re.search(r"^convgrad_inflight_bytes [1-9]", scrape(port),
                            re.M):
            assert time.time() < until, "the slow call never started"
            time.sleep(0.02)
        with open(tokens + ".new", "w") as f:
            f.write("%s trainer-c\n" % TOKEN_C)
        os.replace(tokens + ".new", tokens)
        proc.send_signal(signal.SIGHUP)
        wait_for(log, "SIGHUP: reloaded 1 tokens")
        t.join(120)
        assert slow and slow[0].returncode == 0, slow and slow[0].stderr
        ok(args.cli, target, TOKEN_C)
        unauthenticated(args.cli, target, TOKEN_A, "unknown token")
        # A broken file: the table loaded before stays.
        with open(tokens, "w") as f:
            f.write("short\n")
        proc.send_signal(signal.SIGHUP)
        wait_for(log, "line 1: a token needs at least 16 characters")
        ok(args.cli, target, TOKEN_C)
    finally:
        stop(proc)

    with open(tokens, "w") as f:
        f.write("%s\n" % TOKEN_A)
    proc, target, _, _ = start(args.server, ["--auth-tokens", tokens,
                                             "--auth-health"])
    try:
        r = cli(args.cli, target, "health", token="")
        assert r.returncode != 0 and "UNAUTHENTICATED" in r.stderr, r.stderr
        r = cli(args.cli, target, "health", token=TOKEN_A)
        assert r.stdout.strip() == "SERVING", r.stderr
    finally:
        stop(proc)
    # A unix socket and a non-loopback address with the override start.
    proc, _, _, _ = start(args.server, [
        "--listen", "127.0.0.1:0,0.0.0.0:0,unix:" + os.path.join(d, "s.sock"),
        "--auth-tokens", tokens, "--allow-insecure-auth"])
    stop(proc)

    refused_at_start(args.server, ["--listen", "0.0.0.0:0", "--auth-tokens",
                                   tokens],
                     "0.0.0.0:0 is not loopback and has no TLS")
    for text, want in (("short\n", "line 1: a token needs at least 16"),
                       ("# none\n\n", "no token in the file"),
                       ("%s a b\n" % TOKEN_A, "line 1: expected a token"),
                       ("sha256:abc\n", "line 1: sha256: needs 64 hex"),
                       ("%s bad/label\n" % TOKEN_A, "line 1: a label is")):
        with open(tokens, "w") as f:
            f.write(text)
        refused_at_start(args.server, ["--listen", "127.0.0.1:0",
                                       "--auth-tokens", tokens], want)
    refused_at_start(args.server, ["--listen", "127.0.0.1:0", "--auth-tokens",
                                   os.path.join(d, "none")],
                     "No such file or directory")
    print("server_auth: every check passed")
    return 0


if __name__ == "__main__":
    run(main)
