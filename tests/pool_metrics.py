#!/usr/bin/env python3
"""kvvmd --metrics (issue 37) against Prometheus's own tools.

usage: pool_metrics.py KVVMD promtool|prometheus

Both start a real kvvmd (emulated device, a socket in a temporary directory, --metrics
127.0.0.1:0) and two pool clients speaking the protocol over its socket (pool/protocol.h:
HELLO, then one LEASE of 4 frames for the first): "prom-a" and 'prom"b\\c' (a name the
exposition must escape).
promtool: `promtool check metrics` passes on the daemon's text (the format's grammar and
  its naming lint), which carries both clients' series with their labels escaped.
prometheus: a real Prometheus server, started by this test on 127.0.0.1 with its own
  temporary directory and a 1 s scrape interval, scrapes the daemon; the test asks its HTTP
  API until up == 1 for the job and kvvm_pool_client_held_bytes of each client (the escaped
  name found by its real value) is there.
Skipped (77, with the reason) without promtool/prometheus.

Nothing is timed: each condition is waited for, under one overall hang guard (HANG_S), and
every process started here is stopped and the temporary directory removed on every exit
path (the children also die with this process: PR_SET_PDEATHSIG).
"""
import array
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import urllib.request

from procguard import (die_with_parent, guard, left, procs, query,
                       start_prometheus, stop, wait_for)

HANG_S = 100
PAGE = 64 * 1024
MAGIC = 0x4b56504c                    # POOL_MAGIC
HELLO, WELCOME, LEASE, FRAMES = 1, 2, 4, 5
ROLE_CLIENT = 1


def proto_version():
    """POOL_PROTO_VERSION, read from pool/protocol.h: this raw client says the version the
    daemon was built with (it said 1 when the sharing messages made it 2, and was refused)."""
    h = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pool", "protocol.h")
    with open(h) as f:
        for line in f:
            if line.startswith("#define POOL_PROTO_VERSION"):
                return int(line.split()[2].rstrip("uU"))
    raise SystemExit("FAIL: no POOL_PROTO_VERSION in " + h)


VERSION = proto_version()
MSG_MAX = 4096                        # above POOL_MSG_MAX
NAMES = ("prom-a", 'prom"b\\c')

guard(HANG_S)


class Daemon:
    """kvvmd with --metrics 127.0.0.1:0: its metrics port, read from its stderr."""

    def __init__(self, exe, tmp):
        self.path = os.path.join(tmp, "sock")
        self.p = subprocess.Popen(
            [exe, "--socket", self.path, "--backend", "emulated", "--emu-device-bytes", "64M",
             "--emu-granule", "64K", "--budget", "4M", "--metrics", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=die_with_parent)
        procs.append(self.p)
        self.err, self.port = [], None
        got = threading.Event()

        def read_err():
            for line in self.p.stderr:
                self.err.append(line)
                key = "kvvmd: metrics at http://127.0.0.1:"
                if line.startswith(key):
                    self.port = int(line[len(key):].split("/")[0])
                    got.set()
            got.set()
        threading.Thread(target=read_err, daemon=True).start()
        ready = self.p.stdout.readline()
        if ready.strip() != "kvvmd: ready " + self.path:
            self.p.wait(timeout=max(left(), 1))
            raise SystemExit("FAIL: kvvmd did not start (stdout %r):\n%s" % (
                ready, "".join(self.err)))
        got.wait(timeout=max(left(), 1))
        if self.port is None:
            raise SystemExit("FAIL: kvvmd said no metrics address:\n" + "".join(self.err))

    def finish(self):
        self.p.send_signal(signal.SIGTERM)
        rc = self.p.wait(timeout=max(left(), 1))
        if rc != 0:
            raise SystemExit("FAIL: kvvmd exited %d:\n%s" % (rc, "".join(self.err)))


def client(path, name, lease):
    """A pool client: HELLO, then LEASE `lease` frames (their descriptors closed)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    hello = struct.pack("=IHHIIQQQ64s", MAGIC, HELLO, 104, VERSION, ROLE_CLIENT, 0, 0, 0,
                        name.encode())
    s.send(hello)
    hdr = struct.unpack_from("=IHH", s.recv(MSG_MAX))
    assert hdr[0] == MAGIC and hdr[1] == WELCOME, "HELLO (version %d) answered %r" % (VERSION, hdr)
    if lease:
        s.send(struct.pack("=IHHIIII", MAGIC, LEASE, 24, lease, 0, 0, 0))  # n, wait, need, pad
        msg, anc, _, _ = s.recvmsg(MSG_MAX, socket.CMSG_LEN(64 * 4))
        typ, n = struct.unpack_from("=IHHI", msg)[1], struct.unpack_from("=I", msg, 8)[0]
        assert typ == FRAMES and n == lease, (typ, n)
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
                for fd in fds:
                    os.close(fd)
    return s


def escaped(name):
    return name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def scrape(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port,
                                timeout=max(left(), 1)) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return r.read().decode()


def test_promtool(exe, tmp):
    d = Daemon(exe, tmp)
    clients = [client(d.path, NAMES[0], 4), client(d.path, NAMES[1], 0)]
    pid = os.getpid()

    def text():
        t = scrape(d.port)
        return t if "kvvm_pool_held_bytes %d\n" % (4 * PAGE) in t else None
    t = wait_for("the lease in the daemon's figures", text)
    for conn, name, held in zip((1, 2), NAMES, (4 * PAGE, 0)):
        series = 'kvvm_pool_client_held_bytes{client="%s",pid="%d",conn="%d"} %d\n' % (
            escaped(name), pid, conn, held)
        assert series in t, "%r not in:\n%s" % (series, t)
    r = subprocess.run(["promtool", "check", "metrics"], input=t, capture_output=True,
                       text=True, timeout=max(left(), 1))
    if r.returncode != 0 or r.stdout.strip() or r.stderr.strip():
        raise SystemExit("FAIL: promtool check metrics (exit %d):\n%s%s" % (
            r.returncode, r.stdout, r.stderr))
    for c in clients:
        c.close()
    d.finish()
    print("ok: promtool check metrics passes on kvvmd's text (%d families, %d lines)" % (
        t.count("# TYPE "), t.count("\n")))


def test_prometheus(exe, tmp):
    d = Daemon(exe, tmp)
    clients = [client(d.path, NAMES[0], 4), client(d.path, NAMES[1], 2)]
    prom, pport = start_prometheus(tmp, d.port, "kvvmd")

    def up():
        r = query(pport, 'up{job="kvvmd"}')
        return r if r and r[0]["value"][1] == "1" else None

    def held(name, want):
        q = 'kvvm_pool_client_held_bytes{job="kvvmd",client="%s"}' % escaped(name)
        r = query(pport, q)
        return r if r and int(r[0]["value"][1]) == want else None

    wait_for("up == 1 for job kvvmd", up, every=0.5)
    a = wait_for("prom-a's held bytes in Prometheus", lambda: held(NAMES[0], 4 * PAGE), 0.5)
    b = wait_for("the escaped name's series in Prometheus", lambda: held(NAMES[1], 2 * PAGE),
                 0.5)
    assert b[0]["metric"]["client"] == NAMES[1], b
    stop(prom)
    for c in clients:
        c.close()
    d.finish()
    print("ok: Prometheus scraped kvvmd: up == 1, kvvm_pool_client_held_bytes{client=%r} = "
          "%s, {client=%r} = %s" % (NAMES[0], a[0]["value"][1], NAMES[1], b[0]["value"][1]))


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in ("promtool", "prometheus"):
        sys.exit("usage: pool_metrics.py KVVMD promtool|prometheus")
    for tool in ("promtool",) + (("prometheus",) if sys.argv[2] == "prometheus" else ()):
        if not shutil.which(tool):
            print("skipped: %s not found (Debian: apt-get install prometheus)" % tool)
            sys.exit(77)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("FAIL: terminated"))
    tmp = tempfile.mkdtemp(prefix="kvvm-poolmetrics-")
    try:
        (test_promtool if sys.argv[2] == "promtool" else test_prometheus)(sys.argv[1], tmp)
    except AssertionError as e:
        print("FAIL: %s" % e)
        sys.exit(1)
    finally:
        for p in procs:
            stop(p, signal.SIGKILL if p.poll() is None else signal.SIGTERM)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
