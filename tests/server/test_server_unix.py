#!/usr/bin/python3
"""test_server_unix.py - the unix-socket listener: --listen with a TCP
address and a unix socket side by side; the socket file's mode (default
0660, --socket-mode) and owner-only access when asked; health, a single op
and a layer op over the socket with the convgrad CLI, checked against the
reference; a stale socket from a killed server replaced at start, a socket
a running server holds and a regular file both refused with a message; bad
--listen and --socket-mode values; the server's own socket removed at
exit."""
import argparse
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile


LOGS = []  # the servers' stderr files, shown when the test fails
PROCS = []  # the servers started, killed if the test fails with one running


def start(server, listen, extra=()):
    log = tempfile.NamedTemporaryFile("w+", prefix="cgs-unix-", suffix=".log")
    LOGS.append(log)
    proc = subprocess.Popen([server, "--listen", listen] + list(extra),
                            stdout=subprocess.PIPE, stderr=log, text=True)
    PROCS.append(proc)
    line = proc.stdout.readline()
    if "ready" not in line:
        proc.kill()
        raise AssertionError("not ready: %r" % line)
    return proc, line


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    proc.stdout.close()


def refused(server, args, want):
    """The server exits non-zero at start with want in its message."""
    r = subprocess.run([server] + args, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode in (1, 2), (args, r.returncode, r.stdout, r.stderr)
    assert want in r.stderr, (args, r.stderr)


def cli(tool, *args):
    r = subprocess.run([tool] + list(args), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--server", required=True)
    ap.add_argument("--cli", required=True)
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="cgs-unix-")
    sock = os.path.join(d, "convgrad.sock")
    target = "unix:" + sock

    proc, line = start(args.server, "127.0.0.1:0," + target)
    assert re.search(r"listen=127\.0\.0\.1:\d+ unix=%s " % re.escape(sock),
                     line), line
    st = os.stat(sock)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660, \
        oct(st.st_mode)
    assert cli(args.cli, "health", "--target", target).strip() == "SERVING"
    out = cli(args.cli, "run", "--target", target, "--op",
              "ConvolutionBackwardData", "--problem",
              "mb2ic8ih10oc16oh10kh3ph1", "--check")
    assert "check: max abs err" in out and "OK" in out, out
    out = cli(args.cli, "run", "--target", target, "--op",
              "ConvolutionBackward", "--problem", "mb2ic8ih10oc16oh10kh3ph1",
              "--check")
    assert out.count(": OK") == 3, out
    # A second server on the same socket: the first still holds it.
    refused(args.server, ["--listen", target], "in use by a running process")
    stop(proc)
    assert not os.path.exists(sock), "socket left behind at exit"

    # Killed: its socket stays, and the next server replaces it.
    proc, _ = start(args.server, target, ["--socket-mode", "0600"])
    proc.kill()
    proc.wait()
    proc.stdout.close()
    assert stat.S_ISSOCK(os.stat(sock).st_mode)
    proc, line = start(args.server, target, ["--socket-mode", "600"])
    assert "listen=- unix=%s " % sock in line, line
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    assert cli(args.cli, "health", "--target", target).strip() == "SERVING"
    stop(proc)

    regular = os.path.join(d, "file")
    open(regular, "w").close()
    refused(args.server, ["--listen", "unix:" + regular], "is not a socket")
    # After a TCP port is bound: a clean refusal, not grpc's abort.
    refused(args.server, ["--listen", "127.0.0.1:0,unix:" + regular],
            "is not a socket")
    assert os.path.isfile(regular), "a regular file was removed"
    refused(args.server, ["--listen", "unix:rel.sock"], "absolute path")
    refused(args.server, ["--listen", "unix:/" + "x" * 120], "absolute path")
    refused(args.server, ["--listen", "nowhere"], "neither HOST:PORT")
    refused(args.server, ["--listen", "127.0.0.1:0,"], "is empty")
    refused(args.server, ["--socket-mode", "0999"], "octal file mode")
    refused(args.server, ["--socket-mode", "01000"], "octal file mode")
    refused(args.server, ["--listen", "unix:%s/no/such/dir.sock" % d],
            "cannot bind")
    os.unlink(regular)
    os.rmdir(d)
    print("unix listener: mode, calls, stale socket, refusals, cleanup ok")
    return 0


if __name__ == "__main__":
    try:
        rc = main()
    except BaseException:
        for proc in PROCS:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in LOGS:
            log.seek(0)
            sys.stderr.write("--- server log %s:\n%s" % (log.name,
                                                          log.read()[-6000:]))
        raise
    sys.exit(rc)
