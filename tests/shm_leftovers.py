#!/usr/bin/python3
"""shm_leftovers.py - no test leaves a shared-memory object in /dev/shm.

The ctest fixture "shm" runs this twice around every test that makes
regions: --mark STAMP before the first (writes the time), --check STAMP
after the last. The check lists the objects named the way convgrad and
its tests name them (PREFIX-[WORD-...]PID[-...], PREFIX convgrad, cgs or
cgtest) that appeared since the mark and whose process is gone: a test
that failed without its cleanup, or a library that forgot an unlink. It
removes them, so that a failed run leaves nothing either, and fails.
Objects of processes still running (another test run on this machine)
are theirs to remove."""
import argparse
import os
import re
import sys
import time

SHM = "/dev/shm"
NAME = re.compile(r"^(?:convgrad|cgs|cgtest)-(?:[a-z]+-)*(\d+)(?:-|$)")


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def leftovers(since):
    found = []
    for name in sorted(os.listdir(SHM)):
        m = NAME.match(name)
        if not m:
            continue
        path = os.path.join(SHM, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if st.st_ctime >= since and not alive(int(m.group(1))):
            found.append((path, st.st_size))
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--mark", metavar="STAMP")
    group.add_argument("--check", metavar="STAMP")
    args = ap.parse_args()
    if args.mark:
        with open(args.mark, "w") as f:
            f.write("%.6f\n" % time.time())
        return 0
    try:
        with open(args.check) as f:
            since = float(f.read())
    except FileNotFoundError:
        since = 0.0  # no mark: every leftover counts
    found = leftovers(since)
    for path, size in found:
        print("left in /dev/shm by a process that is gone: %s (%d bytes)"
              % (path, size))
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
            else:
                os.unlink(path)
        except OSError as e:
            print("  cannot remove it: %s" % e)
    print("%d objects left in %s" % (len(found), SHM))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
