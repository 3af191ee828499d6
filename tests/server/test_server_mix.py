#!/usr/bin/python3
"""test_server_mix.py - honest load is served, not refused (issue 29): a
server with its default limits and three `convgrad bench` processes on this
host, one peer, with 64, 16 and 1 calls in flight (a small
ConvolutionBackwardData f32, a ConvolutionBackwardWeights bf16 and the tiny
row) for --seconds (30 in the release build, 5 under sanitizers). Every
call must succeed (the client library retries "retry later" refusals); the
retries the clients needed, and the refusals and retries the server saw
(its /metrics), are printed.

Usage: test_server_mix.py --server BIN --cli BIN [--seconds S]"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

CLIENTS = (  # concurrency, problem, op, dtype
    (64, "mb2ic16ih16oc16oh16kh3ph1", "ConvolutionBackwardData", "f32"),
    (16, "mb2ic16ih16oc16oh16kh3ph1", "ConvolutionBackwardWeights", "bf16"),
    (1, "mb1ic4ih8oc4oh8kh3ph1", "ConvolutionBackwardData", "f32"),
)


def metrics(url):
    """{sample line's name and labels: value} of the server's /metrics."""
    out = {}
    with urllib.request.urlopen(url, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("convgrad_") and " " in line:
                key, val = line.rsplit(" ", 1)
                out[key] = float(val)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--server", required=True)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--seconds", type=int,
                    default=5 if os.environ.get("CG_SANITIZED") else 30)
    args = ap.parse_args()

    log = open("server-mix.log", "w")
    server = subprocess.Popen([args.server, "--listen", "127.0.0.1:0",
                               "--metrics-listen", "127.0.0.1:0"],
                              stdout=subprocess.PIPE, stderr=log, text=True)
    ready = server.stdout.readline()
    m = re.search(r"listen=127\.0\.0\.1:(\d+) metrics=127\.0\.0\.1:(\d+)",
                  ready)
    if not m:
        server.kill()
        raise SystemExit("server did not get ready: %r" % ready)
    target = "127.0.0.1:" + m.group(1)
    url = "http://127.0.0.1:%s/metrics" % m.group(2)
    try:
        clients = []
        for conc, problem, op, dtype in CLIENTS:
            clients.append(subprocess.Popen(
                [args.cli, "bench", "--target", target, "--problem", problem,
                 "--op", op, "--dtype", dtype, "--concurrency", str(conc),
                 "--requests", "10000000", "--warmup", "0", "--duration",
                 str(args.seconds), "--deadline", "60000", "--json"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        failed = []
        for (conc, problem, op, dtype), c in zip(CLIENTS, clients):
            out, err = c.communicate(timeout=args.seconds + 300)
            row = json.loads(out)[0] if out.strip() else {}
            print("%2d in flight  %-26s %-5s  %7d calls  p50 %7.3f ms  "
                  "retries %d  errors %d  exit %d" % (
                      conc, op, dtype, row.get("requests", 0),
                      row.get("p50_ms", 0), row.get("retries", 0),
                      row.get("errors", -1), c.returncode))
            if c.returncode != 0 or row.get("errors") != 0 or \
                    not row.get("requests"):
                failed.append("%d in flight: exit %d, %s" % (
                    conc, c.returncode, err.strip()[-500:]))
        seen = metrics(url)
        refusals = {k: v for k, v in seen.items()
                    if k.startswith("convgrad_refusals_total")}
        print("server: refusals %s; retried calls %d" % (
            ", ".join("%s %d" % (re.sub(r'.*reason="(\w+)".*', r"\1", k), v)
                      for k, v in sorted(refusals.items())),
            seen.get("convgrad_retried_requests_total", 0)))
        sys.stdout.flush()
        assert not failed, failed
    finally:
        server.terminate()
        rc = server.wait(timeout=60)
        log.close()
    assert rc == 0, rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
