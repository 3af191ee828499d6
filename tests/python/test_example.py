#!/usr/bin/python3
"""test_example.py - client/python/examples/train_digits.py --epochs 1
--compare with 2 gloo processes against a real convgrad-server: it must
exit 0 (loss curves within 1e-4, test accuracy above 90%), and print the
per-epoch line with calls and bytes and the comparison. Exits 77 (skipped)
without python3-sklearn.

Usage: test_example.py --server PATH (with CONVGRAD_LIBRARY set)."""
import os
import re
import subprocess
import sys

import cgtest

EXAMPLE = os.path.join(cgtest.HERE, "..", "..", "client", "python",
                       "examples", "train_digits.py")


def main():
    args = cgtest.parse_args(__doc__)
    try:
        import sklearn  # noqa: F401
    except ImportError:
        print("no python3-sklearn: skipped")
        return 77
    server = cgtest.Server(args.server)
    try:
        env = dict(os.environ, PYTHONPATH=os.path.join(cgtest.HERE, "..", "..",
                                                       "client", "python"))
        r = subprocess.run([sys.executable, EXAMPLE, "--target", server.target,
                            "--world-size", "2", "--epochs", "1", "--compare"],
                           env=env, capture_output=True, text=True,
                           timeout=240)
    finally:
        server.stop()
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    ok = r.returncode == 0
    if not re.search(r"offloaded epoch 1: loss [0-9.]+, test accuracy "
                     r"[0-9.]+%, [0-9.]+ ms/step, 4 calls/step", r.stdout):
        print("missing the offloaded epoch line")
        ok = False
    if "compare: loss curve max rel diff" not in r.stdout:
        print("missing the comparison")
        ok = False
    print("OK" if ok else "FAILED (exit %d)" % r.returncode)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
