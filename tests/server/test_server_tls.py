#!/usr/bin/python3
"""test_server_tls.py - TLS and mutual TLS with certificates made here by
Debian's openssl: a good handshake (health and a checked op through the
CLI), the server name override, a wrong CA, a wrong server name, a
plaintext client against a TLS server; under mTLS a client without a
certificate and one from another CA refused, the right one served and
named in the log; the unix socket beside TLS stays plaintext; and every
bad file refused at start, by the server and by the client, with the
option and the problem in the message (missing, key of another
certificate, expired, half a pair)."""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile

LOGS = []  # the servers' stderr files, shown when the test fails


def openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True,
                   capture_output=True)


def make_certs(d):
    """Two CAs; a server certificate for the name convgrad.test only; a
    client certificate from the first CA and one from the second; an
    expired server certificate; a key that belongs to none of them."""
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                ca + ".key", "-out", ca + ".pem", "-subj", "/CN=" + ca,
                "-days", "2", cwd=d)
    ext = os.path.join(d, "san.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=DNS:convgrad.test\n")
    for name, cn, ca, days in (("server", "convgrad.test", "ca", "2"),
                               ("expired", "convgrad.test", "ca", "-1"),
                               ("client", "trainer-1", "ca", "2"),
                               ("stranger", "stranger", "other-ca", "2")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout",
                name + ".key", "-out", name + ".csr", "-subj", "/CN=" + cn,
                cwd=d)
        openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem",
                "-CAkey", ca + ".key", "-CAcreateserial", "-out",
                name + ".pem", "-days", days, "-extfile", ext, cwd=d)
    openssl("genrsa", "-out", "lone.key", "2048", cwd=d)
    return lambda name: os.path.join(d, name)


def start(server, args):
    log = tempfile.NamedTemporaryFile("w+", prefix="cgs-tls-", suffix=".log")
    LOGS.append(log)
    proc = subprocess.Popen([server] + args, stdout=subprocess.PIPE,
                            stderr=log, text=True)
    line = proc.stdout.readline()
    m = re.search(r"listen=127\.0\.0\.1:(\d+)", line)
    if not m:
        proc.kill()
        raise AssertionError("not ready: %r" % line)
    return proc, "127.0.0.1:" + m.group(1), line, log


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    proc.stdout.close()


def cli(tool, *args):
    return subprocess.run([tool] + list(args), capture_output=True,
                          text=True, timeout=120)


def served(tool, target, *tls):
    r = cli(tool, "health", "--target", target, "--deadline", "5000", *tls)
    assert r.returncode == 0 and r.stdout.strip() == "SERVING", \
        (tls, r.returncode, r.stdout, r.stderr)
    r = cli(tool, "run", "--target", target, "--op",
            "ConvolutionBackwardData", "--problem",
            "mb2ic8ih10oc16oh10kh3ph1", "--check", *tls)
    assert r.returncode == 0 and ": OK" in r.stdout, (tls, r.stdout,
                                                       r.stderr)


def refused(tool, target, *tls):
    """A handshake that must fail: UNAVAILABLE, the CLI's exit status 3
    (no retries, a short deadline)."""
    r = cli(tool, "health", "--target", target, "--deadline", "3000",
            "--retries", "0", *tls)
    assert r.returncode != 0 and "SERVING" not in r.stdout, \
        (tls, r.returncode, r.stdout, r.stderr)
    assert "unavailable" in r.stderr or "deadline" in r.stderr, \
        (tls, r.stderr)


def refused_at_start(server, args, want):
    r = subprocess.run([server, "--listen", "127.0.0.1:0"] + args,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode in (1, 2), (args, r.returncode, r.stderr)
    assert want in r.stderr, (args, r.stderr)


def client_refuses(tool, target, args, want):
    r = cli(tool, "health", "--target", target, *args)
    assert r.returncode == 2, (args, r.returncode, r.stderr)
    assert want in r.stderr, (args, r.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--server", required=True)
    ap.add_argument("--cli", required=True)
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="cgs-tls-")
    f = make_certs(d)
    sock = os.path.join(d, "convgrad.sock")
    name = ["--tls-server-name", "convgrad.test"]

    # TLS: the server proves itself; unix socket beside it in plaintext.
    proc, target, line, _ = start(args.server, [
        "--listen", "127.0.0.1:0,unix:" + sock, "--tls-cert", f("server.pem"),
        "--tls-key", f("server.key")])
    try:
        assert " tls=on " in line, line
        served(args.cli, target, "--tls-ca", f("ca.pem"), *name)
        served(args.cli, "unix:" + sock)
        refused(args.cli, target)  # plaintext against TLS
        refused(args.cli, target, "--tls-ca", f("other-ca.pem"), *name)
        refused(args.cli, target, "--tls-ca", f("ca.pem"))  # 127.0.0.1
        refused(args.cli, target, "--tls-ca", f("ca.pem"),
                "--tls-server-name", "other.test")
    finally:
        stop(proc)

    # Mutual TLS: clients need a certificate from --tls-client-ca.
    proc, target, line, log = start(args.server, [
        "--listen", "127.0.0.1:0", "--tls-cert", f("server.pem"),
        "--tls-key", f("server.key"), "--tls-client-ca", f("ca.pem")])
    try:
        assert " tls=mutual " in line, line
        mine = ["--tls-ca", f("ca.pem")] + name
        served(args.cli, target, *mine, "--tls-cert", f("client.pem"),
               "--tls-key", f("client.key"))
        refused(args.cli, target, *mine)
        refused(args.cli, target, *mine, "--tls-cert", f("stranger.pem"),
                "--tls-key", f("stranger.key"))
    finally:
        stop(proc)
    log.seek(0)
    text = log.read()
    # gRPC's own lines (the failed handshakes) come in the server's format,
    # their message escaped.
    assert re.search(r"Z warn  grpc ssl_transport_security\.cc:\d+ msg=\"", text), \
        text[-2000:]
    assert not re.search(r"^E\d{4} ", text, re.M), text[-2000:]
    assert re.search(r'compute id=\d+ peer=\S+ client="CN=trainer-1" ', text), \
        text[-2000:]

    refused_at_start(args.server, ["--tls-cert", f("none.pem"), "--tls-key",
                                   f("server.key")],
                     "--tls-cert %s: No such file or directory"
                     % f("none.pem"))
    refused_at_start(args.server, ["--tls-cert", f("server.pem"),
                                   "--tls-key", f("lone.key")],
                     "the key does not match the certificate")
    refused_at_start(args.server, ["--tls-cert", f("expired.pem"),
                                   "--tls-key", f("expired.key")],
                     "the certificate expired")
    refused_at_start(args.server, ["--tls-cert", f("server.pem")],
                     "--tls-cert and --tls-key go together")
    refused_at_start(args.server, ["--tls-client-ca", f("ca.pem")],
                     "--tls-client-ca needs --tls-cert")
    refused_at_start(args.server, ["--tls-cert", f("server.key"),
                                   "--tls-key", f("server.key")],
                     "no PEM certificate")

    target = "127.0.0.1:1"  # never reached: refused before connecting
    client_refuses(args.cli, target, ["--tls-ca", f("none.pem")],
                   "tls_ca_file %s: No such file" % f("none.pem"))
    client_refuses(args.cli, target, ["--tls-ca", f("ca.pem"), "--tls-cert",
                                      f("client.pem"), "--tls-key",
                                      f("lone.key")],
                   "the key does not match")
    client_refuses(args.cli, target, ["--tls-ca", f("ca.pem"), "--tls-cert",
                                      f("expired.pem"), "--tls-key",
                                      f("expired.key")],
                   "the certificate expired")
    client_refuses(args.cli, target, ["--tls-server-name", "x"],
                   "tls_server_name: needs TLS")
    print("server_tls: every check passed")
    return 0


def run(main):
    """Exits with main's status; when it raises, every server log in LOGS
    is shown first."""
    try:
        rc = main()
    except Exception:
        for log in LOGS:
            log.seek(0)
            sys.stderr.write("--- server log %s:\n%s" % (log.name, log.read()))
        raise
    sys.exit(rc)


if __name__ == "__main__":
    run(main)
