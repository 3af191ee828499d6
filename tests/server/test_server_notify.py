#!/usr/bin/python3
"""test_server_notify.py - the server under systemd's notification protocol
(sd_notify), as the unit convgrad-server.service runs it (Type=notify,
WatchdogSec=): the test plays systemd with a datagram socket named by
$NOTIFY_SOCKET. READY=1 comes with the readiness line as STATUS= once the
server listens; WATCHDOG=1 comes from the event loop at half of
$WATCHDOG_USEC; SIGTERM sends STOPPING=1 before the drain and the server
exits 0. Without $WATCHDOG_USEC, or with $WATCHDOG_PID naming another
process, no WATCHDOG=1 is sent; without $NOTIFY_SOCKET the server serves
as ever."""
import argparse
import os
import signal
import socket
import subprocess
import tempfile
import time


def messages(sock, seconds):
    """Every datagram received within seconds, decoded."""
    out = []
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return out
        sock.settimeout(left)
        try:
            out.append(sock.recv(4096).decode())
        except socket.timeout:
            return out


def run(server, env, log):
    """Starts the server with env added; returns the process and its
    readiness line."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
    proc = subprocess.Popen([server, "--listen", "127.0.0.1:0"],
                            env=dict(base, **env),
                            stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    if "convgrad-server ready" not in line:
        proc.kill()
        raise AssertionError("not ready: %r" % line)
    return proc, line.rstrip("\n")


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, proc.returncode
    proc.stdout.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--server", required=True)
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="cgs-notify-")
    path = os.path.join(d, "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    log = open(os.path.join(d, "server.log"), "w+")
    try:
        # A 400 ms watchdog: WATCHDOG=1 every 200 ms.
        proc, line = run(args.server, {"NOTIFY_SOCKET": path,
                                       "WATCHDOG_USEC": "400000"}, log)
        first = messages(sock, 2.0)
        assert first and first[0] == "READY=1\nSTATUS=" + line, first
        ticks = sum(m == "WATCHDOG=1" for m in first[1:])
        # 10 in 2 s; a loaded machine may delay some, none may be missing
        # for long.
        assert ticks >= 5, first
        stop(proc)
        rest = messages(sock, 0.5)
        assert "STOPPING=1\nSTATUS=draining" in rest, rest
        print("notify: READY=1 with the readiness line, %d WATCHDOG=1 in "
              "2 s, STOPPING=1 on SIGTERM" % ticks)

        # No watchdog asked for, or one asked of another process.
        for extra in ({}, {"WATCHDOG_USEC": "400000",
                           "WATCHDOG_PID": str(os.getpid())}):
            proc, line = run(args.server, dict(NOTIFY_SOCKET=path, **extra),
                             log)
            got = messages(sock, 1.0)
            assert got == ["READY=1\nSTATUS=" + line], (extra, got)
            stop(proc)
            messages(sock, 0.2)
        print("notify: no WATCHDOG=1 without WATCHDOG_USEC or for another "
              "WATCHDOG_PID")

        # Outside systemd: nothing to notify, the server serves.
        proc, _ = run(args.server, {}, log)
        assert messages(sock, 0.5) == []
        stop(proc)
    except BaseException:
        log.seek(0)
        print("server log:\n" + log.read())
        raise
    finally:
        log.close()
        sock.close()
        for f in os.listdir(d):
            os.unlink(os.path.join(d, f))
        os.rmdir(d)
    print("server_notify: OK")


if __name__ == "__main__":
    main()
