#!/usr/bin/env python3
"""kvvm-stress --metrics-port (issue 37), against real clients.

usage: stress_metrics.py KVVM_STRESS http|prometheus

http: the server under hostile clients while a run goes on: 3 x TOOL_HTTPD_MAX_CONNS idle
  connections that send half a request (slowloris) do not keep GET /metrics from being
  answered, a header past the request bound gets 431, garbage 400, another path 404,
  another method 405, a client that never reads its answer holds nothing; the run then
  ends (SIGTERM) with its summary and exit 0, having answered the scrapes.
prometheus: a real Prometheus server (Debian's prometheus package), started by this test on
  127.0.0.1 with its own temporary directory and a 1 s scrape interval, scrapes the run;
  the test asks its HTTP API until up == 1 for the job and a kvvm_ series is there.
  Skipped (77, with the reason) without promtool/prometheus.

Nothing is timed: each condition is waited for, under one overall hang guard (HANG_S), and
every process started here is stopped and the temporary directory removed on every exit
path (the children also die with this process: PR_SET_PDEATHSIG).
"""
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback

from procguard import (die_with_parent, guard, left, procs, query,
                       start_prometheus, stop, wait_for)

HANG_S = 100          # the whole test's hang guard (CTest's TIMEOUT is above it)
MAX_CONNS = 16        # tools/common/httpd.h TOOL_HTTPD_MAX_CONNS
MAX_REQUEST = 8192    # TOOL_HTTPD_MAX_REQUEST

guard(HANG_S)


class Stress:
    """kvvm-stress with --metrics-port 0: its stdout lines in a queue (and kept)."""

    def __init__(self, exe):
        self.p = subprocess.Popen(
            [exe, "--preset", "tiny", "--device-budget", "16M", "--no-disk",
             "--duration", "300", "--quiet", "--metrics-port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=die_with_parent)
        procs.append(self.p)
        self.lines, self.q = [], queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        m = wait_for("kvvm-stress's metrics address", self._address)
        self.port = int(m.group(1))

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line)
            self.q.put(line)

    def _address(self):
        if self.p.poll() is not None and self.q.empty():
            raise SystemExit("FAIL: kvvm-stress exited %s:\n%s" % (self.p.returncode,
                                                                   "".join(self.lines)))
        try:
            return re.search(r"metrics at http://127\.0\.0\.1:(\d+)/metrics",
                             self.q.get(timeout=0.2))
        except queue.Empty:
            return None

    def finish(self):
        """SIGTERM ends the run at a step boundary: summary, exit 0 (all verified)."""
        self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(timeout=max(left(), 1))
        except subprocess.TimeoutExpired:
            raise SystemExit("FAIL: kvvm-stress did not end after SIGTERM")
        self.reader.join(timeout=max(left(), 1))   # the rest of its output
        out = "".join(self.lines)
        if rc != 0 or "result: PASS" not in out:
            raise SystemExit("FAIL: kvvm-stress exited %d:\n%s" % (rc, out))
        return out


def http(port, raw, read=True):
    """Sends raw bytes to the server; returns the whole answer (it closes after one)."""
    with socket.create_connection(("127.0.0.1", port), timeout=max(left(), 1)) as s:
        s.sendall(raw)
        if not read:
            return b""
        data = b""
        while True:
            b = s.recv(65536)
            if not b:
                return data
            data += b


def status(answer):
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None


def test_http(exe):
    st = Stress(exe)
    port = st.port
    ok = http(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status(ok) == 200, ok[:200]
    head, body = ok.split(b"\r\n\r\n", 1)
    assert b"Content-Type: text/plain; version=0.0.4" in head, head
    assert int(re.search(rb"Content-Length: (\d+)", head).group(1)) == len(body)
    assert body.startswith(b"# HELP kvvm_") and body.endswith(b"\n")
    # slowloris: three times the connection bound, each half a request, held open
    idle = []
    for _ in range(3 * MAX_CONNS):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
        idle.append(s)
    got = http(port, b"GET /metrics HTTP/1.1\r\n\r\n")
    assert status(got) == 200, "GET /metrics beside %d idle connections: %r" % (
        len(idle), got[:200])
    mute = socket.create_connection(("127.0.0.1", port), timeout=10)
    mute.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")      # never reads its answer
    big = http(port, b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * (2 * MAX_REQUEST))
    assert status(big) == 431, big[:200]
    assert status(http(port, b"\x00\x01garbage\r\n\r\n")) == 400
    assert status(http(port, b"GET /other HTTP/1.1\r\n\r\n")) == 404
    assert status(http(port, b"POST /metrics HTTP/1.1\r\n\r\n")) == 405
    assert status(http(port, b"HEAD /metrics HTTP/1.1\r\n\r\n")) == 200
    assert status(http(port, b"GET /metrics?x=1 HTTP/1.0\r\n\r\n")) == 200
    for s in idle:
        s.close()
    out = st.finish()
    mute.close()
    m = re.search(r"metrics: (\d+) scrapes answered", out)
    assert m and int(m.group(1)) >= 5, out
    print("ok: /metrics answered beside %d slowloris connections; 431, 400, 404, 405 as "
          "expected; the run ended PASS (%s scrapes answered)" % (len(idle), m.group(1)))


def test_prometheus(exe):
    for tool in ("promtool", "prometheus"):
        if not shutil.which(tool):
            print("skipped: %s not found (Debian: apt-get install prometheus)" % tool)
            sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="kvvm-prom-")
    try:
        st = Stress(exe)
        prom, pport = start_prometheus(tmp, st.port, "kvvm-stress")

        def up():
            r = query(pport, 'up{job="kvvm-stress"}')
            return r if r and r[0]["value"][1] == "1" else None

        def series():
            r = query(pport, 'kvvm_pages{job="kvvm-stress",tier="device",state="total"}')
            return r if r and int(r[0]["value"][1]) > 0 else None

        wait_for("up == 1 for job kvvm-stress", up, every=0.5)
        s = wait_for("a kvvm_ series in Prometheus", series, every=0.5)
        h = wait_for("a kvvm_ histogram series", lambda: query(
            pport, 'kvvm_direct_reclaim_duration_seconds_count{job="kvvm-stress"}'), 0.5)
        stop(prom)
        st.finish()
        print("ok: Prometheus scraped kvvm-stress: up == 1, %s = %s, %d histogram series" % (
            s[0]["metric"]["__name__"], s[0]["value"][1], len(h)))
    finally:
        for p in procs:
            stop(p, signal.SIGKILL if p.poll() is None else signal.SIGTERM)
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in ("http", "prometheus"):
        sys.exit("usage: stress_metrics.py KVVM_STRESS http|prometheus")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("FAIL: terminated"))
    try:
        (test_http if sys.argv[2] == "http" else test_prometheus)(sys.argv[1])
    except AssertionError:
        traceback.print_exc()
        print("FAIL")
        sys.exit(1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


if __name__ == "__main__":
    main()
