#!/usr/bin/python3
"""probe.py - what a plain TCP socket gets through a rig's link
(tests/net/rig.sh), one way, so that a benchmark can print the rate it
really ran at beside the rate it asked tc for.

  probe.py sink ADDR PORT     one connection: reads to its end, then
                              answers the byte count (exits after it,
                              or after 30 s without one)
  probe.py send ADDR PORT MB  sends MB megabytes, prints Gbit/s

Bounded: one connection, at most 1000 MB, 30 s of socket timeout."""
import socket
import sys
import time

TIMEOUT = 30
CHUNK = 1 << 20


def sink(addr, port):
    with socket.create_server((addr, port)) as srv:
        srv.settimeout(TIMEOUT)
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(TIMEOUT)
            n = 0
            while True:
                b = conn.recv(CHUNK)
                if not b:
                    break
                n += len(b)
            conn.sendall(b"%d\n" % n)


def send(addr, port, mb):
    if not 0 < mb <= 1000:
        sys.exit("probe: MB must be in 1..1000")
    buf = bytes(CHUNK)
    deadline = time.monotonic() + TIMEOUT
    while True:  # the sink may not listen yet
        try:
            s = socket.create_connection((addr, port), timeout=TIMEOUT)
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with s:
        t0 = time.perf_counter()
        for _ in range(mb):
            s.sendall(buf)
        s.shutdown(socket.SHUT_WR)
        got = int(s.makefile().readline())
        dt = time.perf_counter() - t0
    if got != mb * CHUNK:
        sys.exit("probe: the sink got %d of %d bytes" % (got, mb * CHUNK))
    print("%.2f" % (got * 8 / dt / 1e9))


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "sink":
        sink(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) == 5 and sys.argv[1] == "send":
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
