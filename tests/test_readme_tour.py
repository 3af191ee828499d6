#!/usr/bin/python3
"""test_readme_tour.py - the front page's five-minute tour stays true: every
`$ convgrad ...` line of README.md's "Five-minute tour" runs against a real
server (its --target added) and exits 0; a line followed by expected output
in the README must print it.

Usage: test_readme_tour.py --server BIN --cli BIN --readme README.md"""
import argparse
import re
import shlex
import signal
import subprocess
import sys


def tour_commands(readme):
    """(argv after `convgrad`, expected first output line or None)."""
    text = open(readme).read()
    tour = text.split("## Five-minute tour", 1)[1].split("\n## ", 1)[0]
    lines = tour.splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.startswith("$ convgrad "):
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            expect = None if nxt.startswith(("$", "```")) or not nxt else nxt
            out.append((shlex.split(line[len("$ convgrad "):]), expect))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--server", required=True)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--readme", required=True)
    args = ap.parse_args()
    commands = tour_commands(args.readme)
    assert len(commands) >= 4, commands
    proc = subprocess.Popen([args.server, "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    m = re.search(r"listen=127\.0\.0\.1:(\d+)", proc.stdout.readline())
    assert m, "server did not get ready"
    target = "127.0.0.1:" + m.group(1)
    failed = []
    try:
        for argv, expect in commands:
            r = subprocess.run([args.cli] + argv + ["--target", target],
                               capture_output=True, text=True, timeout=120)
            shown = "convgrad " + " ".join(argv)
            if r.returncode != 0:
                failed.append("%s: exit %d: %s" % (shown, r.returncode,
                                                   r.stderr.strip()[-300:]))
            elif expect and expect not in r.stdout:
                failed.append("%s: printed %r, README shows %r" %
                              (shown, r.stdout[:200], expect))
            else:
                print("ok  " + shown)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    for f in failed:
        print("FAIL " + f)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
