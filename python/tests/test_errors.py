"""Every negative errno becomes kvvm.Error with the right subclass and the library's
reason; the library's log goes to the "kvvm" logger."""
import errno
import logging
import os
import subprocess
import sys
import textwrap

import pytest

import kvvm
from conftest import GRANULE, redis_server, small_config

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_PARENT = os.path.dirname(os.path.dirname(kvvm.__file__))


@pytest.mark.parametrize("code,cls", [
    (errno.EINVAL, kvvm.InvalidArgument), (errno.ENOENT, kvvm.InvalidHandle),
    (errno.E2BIG, kvvm.TooBig), (errno.ENOSPC, kvvm.NoSlot),
    (errno.ENOMEM, kvvm.OutOfMemory), (errno.EBADMSG, kvvm.DataLost),
    (errno.EIO, kvvm.DeviceLost), (errno.ENODEV, kvvm.NoDevice), (errno.EBUSY, kvvm.Busy),
    (errno.EOPNOTSUPP, kvvm.NotSupported), (errno.ESTALE, kvvm.Stale),
    (errno.EAGAIN, kvvm.NotResident), (errno.EACCES, kvvm.AccessDenied),
    (errno.EPERM, kvvm.Error)])
def test_errno_classes(code, cls):
    assert kvvm.error_class(-code) is cls and kvvm.error_class(code) is cls
    e = cls(code)
    assert isinstance(e, kvvm.Error) and e.errno == code
    assert e.message == kvvm.strerror(code)
    assert issubclass(kvvm.InvalidArgument, ValueError) and issubclass(kvvm.TooBig, ValueError)


def test_regress_eopnotsupp_spelt_as_in_c():
    """Bug (issue 32): Python's messages said -ENOTSUP (errno.errorcode's name for 95), C's
    kvvm_last_error() and docs/api.md -EOPNOTSUPP; the library's reason then kept its own
    "-EOPNOTSUPP: " prefix beside the exception's."""
    assert kvvm.errno_name(-errno.EOPNOTSUPP) == "EOPNOTSUPP"
    assert kvvm.errno_name(errno.EAGAIN) == "EAGAIN"
    assert str(kvvm.NotSupported(errno.EOPNOTSUPP)).startswith("-EOPNOTSUPP: ")
    with kvvm.Context(**small_config()) as c:       # no pool view
        with pytest.raises(kvvm.NotSupported) as e:
            c.pool_blocks
    text = str(e.value)
    assert text.startswith("kvvm_pool_blocks: -EOPNOTSUPP: "), text
    assert "ENOTSUP:" not in text and text.count("EOPNOTSUPP") == 1, text
    assert "KVVM_F_POOL_VIEW" in e.value.message


def test_regress_store_refusing_credentials_is_access_denied(tmp_path):
    """Bug (issue 32): a Redis refusing the password raised a plain kvvm.Error; with a
    spill_dir it would have been called a spill_dir error."""
    with redis_server(tmp_path, "right") as port:
        url = "redis://:wrong@127.0.0.1:%d" % port
        for extra in ({}, {"spill_dir": str(tmp_path), "host_budget": 4 * GRANULE,
                           "flags": "spill_allow_tmpfs"}):
            with pytest.raises(kvvm.AccessDenied) as e:
                kvvm.Context(store_url=url, **small_config(**extra))
            assert e.value.errno == errno.EACCES and e.value.function == "kvvm_open"
            assert "refused" in e.value.message and "wrong" not in str(e.value)
            assert not isinstance(e.value, kvvm.SpillDirError)


def test_message_carries_the_library_reason(caplog):
    with caplog.at_level(logging.DEBUG, logger="kvvm"):
        with pytest.raises(kvvm.InvalidArgument) as e:
            kvvm.Context(**small_config(device_min=0.5, device_low=0.1))
    assert e.value.function == "kvvm_open"
    assert "watermarks must satisfy" in e.value.message
    assert "kvvm_open: -EINVAL: device watermarks" in str(e.value)
    rec = [r for r in caplog.records if r.name == "kvvm" and "watermarks" in r.getMessage()]
    assert rec and all(r.levelno == logging.DEBUG for r in rec), rec


def test_regress_caught_einval_was_printed_to_stderr():
    """Bug: every -EINVAL was also printed to stderr by the "kvvm" logger (an ERROR record
    and no handler configured: logging's last resort) even when the caller caught it."""
    r = _run("""
        import kvvm
        try:
            kvvm.Context(backend="emulated", emu_granule=4096, device_budget="256K",
                         device_min=0.5, device_low=0.1)
        except kvvm.InvalidArgument as e:
            print("caught:", e.message)
        c = kvvm.Context(backend="emulated", emu_granule=4096, device_budget="256K",
                         bytes_per_token=64, max_tokens=256, max_seqs=4)
        s = c.create()
        try:
            s.write(0, 0, b"")
        except kvvm.InvalidArgument as e:
            print("caught:", e.message)
        c.close()
        """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("caught:") == 2 and "watermarks" in r.stdout, r.stdout
    assert r.stderr == "", r.stderr


def test_error_message_names_the_numbers(ctx):
    s = ctx.create()
    with pytest.raises(kvvm.TooBig) as e:
        s.grow(ctx.max_tokens + 1)
    assert e.value.message == "length %d is past max_tokens %d" % (ctx.max_tokens + 1,
                                                                  ctx.max_tokens)
    assert str(e.value).startswith("kvvm_seq_grow: -E2BIG: length")
    s.free()
    with pytest.raises(kvvm.InvalidHandle) as e:    # (a freed Sequence refuses in Python)
        kvvm._core._call(kvvm._core.L.kvvm_seq_grow, ctx._kv, 12345, 1)
    assert "0x3039" in e.value.message and "spill_dir" not in e.value.message


def test_regress_bad_size_did_not_name_the_field():
    """Bug: Context(device_budget="banana") raised "could not convert string to float:
    'BANANA'", naming neither the field nor what a size looks like."""
    with pytest.raises(kvvm.InvalidArgument) as e:
        kvvm.Context(**small_config(device_budget="banana"))
    assert "device_budget='banana'" in str(e.value) and "64M" in str(e.value)
    assert isinstance(e.value, ValueError)
    with pytest.raises(kvvm.InvalidArgument, match="max_seqs='x' is not a number"):
        kvvm.Context(**small_config(max_seqs="x"))
    with pytest.raises(kvvm.InvalidArgument, match="host_budget=-1"):
        kvvm.Context(**small_config(host_budget=-1))


def test_regress_missing_spill_dir_was_invalid_handle():
    """Bug: a missing spill_dir raised InvalidHandle (-ENOENT's class for sequences)."""
    with pytest.raises(kvvm.SpillDirError) as e:
        kvvm.Context(**small_config(host_budget=4 * GRANULE, spill_dir="/nonexistent-kvvm/x",
                                    spill_budget=1 << 20))
    assert not isinstance(e.value, kvvm.InvalidHandle)
    assert isinstance(e.value, OSError) and isinstance(e.value, kvvm.Error)
    assert e.value.errno == errno.ENOENT and e.value.function == "kvvm_open"
    assert "spill directory /nonexistent-kvvm/x" in str(e.value)
    assert "No such file or directory" in str(e.value)
    with pytest.raises(kvvm.SpillDirError) as e:
        kvvm.Context(**small_config(host_budget=4 * GRANULE, spill_dir="/var/tmp",
                                    spill_budget=1 << 50))
    assert e.value.errno == errno.ENOSPC and "bytes free" in e.value.message


def test_no_device():
    if os.environ.get("KVVMTEST_PY_BACKEND") == "cuda":
        pytest.skip("a CUDA device is expected here")
    with pytest.raises(kvvm.NoDevice) as e:
        kvvm.Context(**small_config(backend="cuda"))
    assert e.value.errno == errno.ENODEV


def test_log_levels_reach_python_logging(caplog):
    kvvm.set_log_level("info")
    try:
        with caplog.at_level(logging.DEBUG, logger="kvvm"):
            # more sequences than the device holds at length 1: an info line from kvvm_open
            with kvvm.Context(**small_config(max_seqs=64, device_budget=8 * GRANULE)):
                pass
        infos = [r for r in caplog.records if r.name == "kvvm" and r.levelno == logging.INFO]
        assert any("fit in device_budget" in r.getMessage() for r in infos), caplog.records
    finally:
        kvvm.set_log_level(None)
    with pytest.raises(ValueError):
        kvvm.set_log_level("loud")


def _run(code, env=None):
    e = dict(os.environ)
    e.update(env or {})
    e["PYTHONPATH"] = PKG_PARENT + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e,
                          capture_output=True, text=True, timeout=120)


def test_device_lost_is_sticky():
    # an illegal-address error on the first host-to-device copy kills the context (-EIO)
    r = _run("""
        import kvvm
        c = kvvm.Context(backend="emulated", emu_granule=4096, device_budget="64K",
                         bytes_per_token=64, max_tokens=256, max_seqs=4, emu_opaque=1)
        s = c.create(); s.grow(4)
        try:
            s.write(0, 0, b"x" * 64)
        except kvvm.DeviceLost as e:
            print("write", e.errno)
        try:
            c.create()
        except kvvm.DeviceLost as e:
            print("create", e.errno)
        c.close()
        """, {"KVVM_EMU_FAIL": "cuMemcpyHtoDAsync:1:700,cuMemcpyHtoD:1:700", "KVVM_LOG": "off"})
    assert r.returncode == 0, r.stderr
    assert "write 5" in r.stdout and "create 5" in r.stdout, r.stdout + r.stderr


def test_data_lost_after_disk_corruption(spill_dir):
    """A sequence spilled to disk whose file bytes are damaged comes back as DataLost."""
    cfg = small_config(host_budget=4 * GRANULE, spill_dir=spill_dir, spill_budget=1 << 20)
    with kvvm.Context(**cfg) as c:
        s = c.create()
        s.grow(256)                               # 4 pages per region: more than the host tier
        s.write(0, 0, b"\x42" * (256 * 64))
        c.step()
        s.swap_out()
        c.sync()
        assert s.info.pages_disk > 0
        fds = []
        for f in os.listdir("/proc/self/fd"):
            try:
                if os.readlink("/proc/self/fd/" + f).startswith(spill_dir):
                    fds.append(f)
            except OSError:                       # the descriptor listdir itself used
                pass
        assert fds, "no spill file descriptor found under %s" % spill_dir
        for f in fds:
            with open("/proc/self/fd/" + f, "r+b", buffering=0) as fh:
                size = os.fstat(fh.fileno()).st_size
                for off in range(0, size, GRANULE):
                    fh.seek(off + 100)
                    fh.write(b"\xff" * 8)
                os.fsync(fh.fileno())
        with pytest.raises(kvvm.DataLost) as e:
            s.swap_in()
        assert e.value.errno == errno.EBADMSG
        with pytest.raises(kvvm.DataLost):
            s.read(0, 0, 64)
        assert c.stats()["checksum_failures"] >= 1
        s.truncate(0)                             # below the damage: usable again
        s.grow(1)


def test_own_variables_are_not_reported_as_unknown(monkeypatch, caplog):
    monkeypatch.setenv("KVVM_LIBRARY", kvvm.library_path)
    monkeypatch.setenv("KVVM_NOT_A_SETTING", "1")
    with caplog.at_level(logging.WARNING, logger="kvvm"):
        with kvvm.Context(**small_config()):
            pass
    msgs = [r.getMessage() for r in caplog.records if r.name == "kvvm"]
    assert any("KVVM_NOT_A_SETTING" in m for m in msgs), msgs
    assert not any("KVVM_LIBRARY" in m for m in msgs), msgs
