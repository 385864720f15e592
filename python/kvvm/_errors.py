"""kvvm.Error and its subclasses: one per negative errno the library returns.

The message carries the library's reason: what libkvvm logged on the calling thread during
the failed call (e.g. "kvvm_open: n_regions must be >= 1"), else kvvm_strerror's text.
"""
import errno as _errno

from . import _lib, _log

# The C library's spelling of a code where Python's errno.errorcode gives another name for
# the same number (Linux: EOPNOTSUPP == ENOTSUP, EAGAIN == EWOULDBLOCK): the messages say
# what libkvvm's kvvm_last_error() and docs/api.md say.
_C_NAMES = {_errno.EOPNOTSUPP: "EOPNOTSUPP", _errno.EAGAIN: "EAGAIN"}


def errno_name(err):
    """The code's name as libkvvm spells it ("EOPNOTSUPP"), without the sign."""
    err = abs(int(err))
    return _C_NAMES.get(err) or _errno.errorcode.get(err, str(err))


class Error(Exception):
    """A libkvvm call failed. `errno` is the positive errno, `message` the reason,
    `function` the C function that returned it (None for checks made in Python)."""

    def __init__(self, err, message=None, function=None):
        self.errno = abs(int(err))
        self.function = function
        self.message = message or _lib.strerror(self.errno)
        name = errno_name(self.errno)
        where = "%s: " % function if function else ""
        super().__init__("%s-%s: %s" % (where, name, self.message))


class InvalidArgument(Error, ValueError):
    """-EINVAL: a bad argument or config field."""


class InvalidHandle(Error):
    """-ENOENT: an unknown or freed sequence (or a closed context)."""


class TooBig(Error, ValueError):
    """-E2BIG: a length past max_tokens."""


class NoSlot(Error):
    """-ENOSPC: no free sequence slot."""


class OutOfMemory(Error):
    """-ENOMEM: no device page can be had, or no room in the tiers below."""


class DataLost(Error):
    """-EBADMSG: the sequence's data was lost (checksum mismatch or failed disk read)."""


class DeviceLost(Error):
    """-EIO: the context is dead; every call fails from now on."""


class NoDevice(Error):
    """-ENODEV: no usable CUDA device."""


class Busy(Error):
    """-EBUSY: the engine stream captures a CUDA graph, or a transfer has not completed."""


class NotSupported(Error):
    """-EOPNOTSUPP: not possible here (e.g. a CPU view in opaque mode)."""


class SpillDirError(Error, OSError):
    """kvvm_open: spill_dir cannot be used (missing, not a directory, no permission,
    immutable, read-only: -ENOENT, -ENOTDIR, -EACCES, -EPERM, -EROFS) or its file system
    cannot hold spill_budget (-ENOSPC, -EDQUOT, -EFBIG). Also an OSError."""

    def __init__(self, err, message=None, function=None):
        Error.__init__(self, err, message, function)
        self.errno = abs(int(err))          # (OSError.__init__ reset them)
        self.strerror = self.message

    def __str__(self):
        return BaseException.__str__(self)


class AccessDenied(Error):
    """-EACCES: the store of store_url refused its credentials (a wrong password or user).
    (At Context() with spill_dir, a spill_dir refusing the spill file is SpillDirError.)"""


class Stale(Error):
    """-ESTALE: a dropped cached sequence."""


class NotResident(Error):
    """-EAGAIN: a view of a sequence that is not on the device (swapped out)."""


_BY_ERRNO = {
    _errno.EINVAL: InvalidArgument, _errno.ENOENT: InvalidHandle, _errno.E2BIG: TooBig,
    _errno.ENOSPC: NoSlot, _errno.ENOMEM: OutOfMemory, _errno.EBADMSG: DataLost,
    _errno.EIO: DeviceLost, _errno.ENODEV: NoDevice, _errno.EBUSY: Busy,
    _errno.EOPNOTSUPP: NotSupported, _lib.ESTALE: Stale, _errno.EAGAIN: NotResident,
    _errno.EACCES: AccessDenied,
}


def error_class(err):
    return _BY_ERRNO.get(abs(int(err)), Error)


def make(err, function=None, message=None, since=None, cls=None):
    """The exception for a negative errno; `since` = _log.mark() before the call. The
    reason is the library's kvvm_last_error() (the call's name and errno, which the
    exception adds itself, taken off), else what it logged, else kvvm_strerror's text."""
    reason = _lib.last_error() if since is not None else ""
    if not reason and since is not None:
        reason = _log.reason_since(since) or ""
    if function and reason.startswith(function + ": "):
        reason = reason[len(function) + 2:]
    name = "-%s: " % errno_name(err)
    if reason.startswith(name):
        reason = reason[len(name):]
    return (cls or error_class(err))(err, message or reason or _lib.strerror(err), function)


def check(rc, function, since=None):
    if rc < 0:
        raise make(rc, function, since=since)
    return rc
