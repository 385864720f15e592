"""tests/procguard.py: what the tests' Python scripts that start real processes share
(stress_metrics.py, pool_metrics.py): one hang guard for the whole script, children that die
with it, waiting for conditions (never for a time), stopping a child, and a Prometheus server
of the test's own on 127.0.0.1 (never a system service).

guard(seconds) starts the hang guard; left() is what remains of it; every child a script
starts goes into procs (the script kills what is left at its end)."""
import ctypes
import json
import os
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request

_deadline = [time.monotonic() + 100.0]
_hang_s = [100]
procs = []


def guard(seconds):
    _hang_s[0] = seconds
    _deadline[0] = time.monotonic() + seconds


def left():
    return _deadline[0] - time.monotonic()


def die_with_parent():
    """preexec_fn: the child gets SIGKILL when this process dies (even by SIGKILL)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG


def wait_for(what, cond, every=0.2):
    """Calls cond() until it returns something true; fails the test past the hang guard."""
    while True:
        v = cond()
        if v:
            return v
        if left() <= 0:
            raise SystemExit("FAIL: hang guard (%d s): still waiting for %s" % (_hang_s[0], what))
        time.sleep(every)


def stop(p, sig=signal.SIGTERM):
    if p.poll() is None:
        p.send_signal(sig)
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(port, q):
    """A Prometheus instant query's result list; None while the server does not answer."""
    url = "http://127.0.0.1:%d/api/v1/query?query=%s" % (port, urllib.parse.quote(q))
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.load(r)["data"]["result"]
    except (OSError, ValueError, KeyError):
        return None


def start_prometheus(tmp, target, job):
    """A prometheus on 127.0.0.1 scraping 127.0.0.1:target every second as job; (process,
    port) once it answers a query."""
    cfg = os.path.join(tmp, "prom.yml")
    with open(cfg, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                "scrape_configs:\n  - job_name: %s\n    static_configs:\n"
                "      - targets: ['127.0.0.1:%d']\n" % (job, target))
    for _ in range(3):                 # a free port may be taken before it binds it
        port = free_port()
        log = open(os.path.join(tmp, "prometheus.log"), "w")
        p = subprocess.Popen(["prometheus", "--config.file=" + cfg,
                              "--storage.tsdb.path=" + os.path.join(tmp, "data"),
                              "--web.listen-address=127.0.0.1:%d" % port,
                              "--log.level=warn"],
                             stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        procs.append(p)
        ready = wait_for("prometheus to answer or exit",
                         lambda: "exited" if p.poll() is not None else
                         ("up" if query(port, "vector(1)") is not None else None))
        if ready == "up":
            return p, port
    raise SystemExit("FAIL: prometheus did not start:\n" +
                     open(os.path.join(tmp, "prometheus.log")).read())
