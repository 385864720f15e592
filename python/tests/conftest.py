"""Shared fixtures. The tests import the installed kvvm when there is one (the fresh-venv
check), else the package of this source tree; libkvvm.so comes from KVVM_LIBRARY, else the
package's own search (docs/python.md)."""
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

try:
    import kvvm  # noqa: F401
except ModuleNotFoundError as e:
    if e.name != "kvvm":
        raise
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import kvvm  # noqa: F401

try:                    # tiny tensors: one thread avoids oversubscribing a shared machine
    import torch
    torch.set_num_threads(1)
except ImportError:
    pass

# The library's own tests run with KVVM_EMU_OPAQUE=1; tests here say what they need per
# context (emu_opaque=...), so nothing from the environment decides it.
GRANULE = 4096


def pytest_report_header(config):
    return "kvvm %s from %s; libkvvm %s from %s" % (
        kvvm.__version__, os.path.dirname(kvvm.__file__), kvvm.library_version,
        kvvm.library_path)


def small_config(**over):
    cfg = dict(backend="emulated", n_regions=2, bytes_per_token=64, max_seqs=8,
               max_tokens=1024, emu_granule=GRANULE, device_budget=64 * GRANULE,
               emu_opaque=1)
    cfg.update(over)
    return cfg


@pytest.fixture
def ctx():
    """An opaque-mode context: the binding must never need to read device memory."""
    with kvvm.Context(**small_config()) as c:
        yield c


@pytest.fixture
def vctx():
    """A context whose windows are CPU-readable (views)."""
    with kvvm.Context(**small_config(emu_opaque=0)) as c:
        yield c


@pytest.fixture
def spill_dir():
    d = tempfile.mkdtemp(prefix="kvvm-pytest-", dir="/var/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def redis_server(directory, password):
    """A redis-server of the tests' own on 127.0.0.1 at a free port, with a password and no
    persistence; yields its port once it answers (skips without redis-server, fails if it
    exits first); killed at the end."""
    exe = shutil.which("redis-server")
    if not exe:
        pytest.skip("redis-server is not installed (scripts/install-deps.sh installs it)")
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    srv = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                            "--appendonly", "no", "--requirepass", password, "--dir",
                            str(directory)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        while True:                     # until it answers, or has exited
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if srv.poll() is not None:
                    pytest.fail("redis-server exited (%s) before listening on port %d"
                                % (srv.returncode, port))
                time.sleep(0.01)
        yield port
    finally:
        srv.kill()
        srv.wait()


def kvvmd_binary():
    """The kvvmd to start: $KVVM_KVVMD, else tools/kvvmd beside the libkvvm.so in use (a
    build tree), else kvvmd on PATH; None when there is none."""
    env = os.environ.get("KVVM_KVVMD")
    if env:
        return env
    near = os.path.join(os.path.dirname(kvvm.library_path), "tools", "kvvmd")
    if os.access(near, os.X_OK):
        return near
    return shutil.which("kvvmd")


@pytest.fixture
def kvvmd():
    """A real kvvmd (emulated device of GRANULE pages, 1 MiB) on a socket in a temporary
    directory, started by the test and waited for by its ready line; yields the socket's
    path, stops it (SIGTERM, exit 0) after. Skipped, saying why, without a kvvmd."""
    exe = kvvmd_binary()
    if not exe:
        pytest.skip("no kvvmd binary (set KVVM_KVVMD, or build the tools)")
    d = tempfile.mkdtemp(prefix="kvvmpy.")
    path = os.path.join(d, "sock")
    p = subprocess.Popen([exe, "--socket", path, "--backend", "emulated",
                          "--emu-device-bytes", "64M", "--emu-granule", "4K",
                          "--budget", "1M"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = p.stdout.readline().decode().strip()
    if line != "kvvmd: ready " + path:
        p.kill()
        raise AssertionError("kvvmd did not start: %r %s" % (line, p.stderr.read().decode()))
    try:
        yield path
    finally:
        p.terminate()
        assert p.wait(timeout=60) == 0
        p.stdout.close()
        p.stderr.close()
        shutil.rmtree(d, ignore_errors=True)


def _free_cluster_port():
    """A free port whose cluster bus port (+10000) is free too."""
    while True:
        with socket.socket() as so:
            so.bind(("127.0.0.1", 0))
            p = so.getsockname()[1]
        if p + 10000 < 65536:
            with socket.socket() as bus:
                try:
                    bus.bind(("127.0.0.1", p + 10000))
                    return p
                except OSError:
                    pass


@contextlib.contextmanager
def redis_cluster(directory, password, masters=3):
    """A Redis Cluster of the tests' own: `masters` redis-server --cluster-enabled nodes on
    127.0.0.1 at free ports (a password, no persistence), joined by redis-cli --cluster
    create; yields the "host:port" seeds once every node says cluster_state:ok (skips
    without redis-server or redis-cli, fails if a node exits first); killed at the end."""
    exe, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if not exe or not cli:
        pytest.skip("redis-server or redis-cli is not installed (scripts/install-deps.sh "
                    "installs them)")
    ports = [_free_cluster_port() for _ in range(masters)]
    procs = []
    auth = ["-a", password, "--no-auth-warning"]
    try:
        for p in ports:
            procs.append(subprocess.Popen(
                [exe, "--port", str(p), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                 "--cluster-config-file", os.path.join(str(directory), "nodes-%d.conf" % p),
                 "--dir", str(directory), "--save", "", "--appendonly", "no",
                 "--requirepass", password, "--masterauth", password],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for p, srv in zip(ports, procs):
            while subprocess.run([cli, "-p", str(p)] + auth + ["ping"], capture_output=True,
                                 text=True).stdout.strip() != "PONG":
                if srv.poll() is not None:
                    pytest.fail("a cluster node exited (%s) before answering on port %d"
                                % (srv.returncode, p))
                time.sleep(0.05)
        seeds = ["127.0.0.1:%d" % p for p in ports]
        r = subprocess.run([cli] + auth + ["--cluster", "create"] + seeds + ["--cluster-yes"],
                           capture_output=True, text=True)
        assert r.returncode == 0, "redis-cli --cluster create failed:\n" + r.stdout + r.stderr
        for p in ports:
            while "cluster_state:ok" not in subprocess.run(
                    [cli, "-p", str(p)] + auth + ["cluster", "info"], capture_output=True,
                    text=True).stdout:
                time.sleep(0.05)
        yield seeds
    finally:
        for srv in procs:
            srv.kill()
            srv.wait()
