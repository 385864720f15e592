"""kvvm: libkvvm from Python, with sequences as zero-copy PyTorch tensors or numpy arrays.

Pure Python over libkvvm's C ABI (ctypes): no compiled extension, so one package works
with any torch version, or with numpy alone. See docs/python.md.
"""
from . import _lib
from ._core import Context, Sequence, SeqInfo, Tier
from ._views import View
from ._errors import (Error, InvalidArgument, InvalidHandle, TooBig, NoSlot, OutOfMemory,
                      DataLost, DeviceLost, NoDevice, Busy, NotSupported, Stale, NotResident,
                      SpillDirError, AccessDenied, error_class, errno_name)
from ._log import set_log_level
from .cache import KVCache

__version__ = "0.3.0"
library_version = _lib.VERSION          # kvvm_version() of the loaded libkvvm
library_path = _lib.LIBRARY_PATH

F_AUTO_SWAP = _lib.F_AUTO_SWAP
F_SCRUB = _lib.F_SCRUB
F_SPILL_ALLOW_TMPFS = _lib.F_SPILL_ALLOW_TMPFS
F_SPILL_BUFFERED = _lib.F_SPILL_BUFFERED
F_CACHE_DEMOTE = _lib.F_CACHE_DEMOTE
F_POOL_VIEW = _lib.F_POOL_VIEW
SEQ_LIVE, SEQ_CACHED, SEQ_PINNED = _lib.SEQ_LIVE, _lib.SEQ_CACHED, _lib.SEQ_PINNED


def strerror(err):
    """kvvm_strerror: the library's text for an errno (sign ignored)."""
    return _lib.strerror(err)


__all__ = ["Context", "Sequence", "SeqInfo", "Tier", "View", "KVCache", "Error", "InvalidArgument",
           "InvalidHandle", "TooBig", "NoSlot", "OutOfMemory", "DataLost", "DeviceLost",
           "NoDevice", "Busy", "NotSupported", "Stale", "NotResident", "SpillDirError",
           "AccessDenied", "error_class", "errno_name",
           "set_log_level", "strerror", "F_AUTO_SWAP", "F_SCRUB", "F_SPILL_ALLOW_TMPFS",
           "F_SPILL_BUFFERED", "F_CACHE_DEMOTE", "F_POOL_VIEW", "SEQ_LIVE", "SEQ_CACHED", "SEQ_PINNED",
           "library_version", "library_path"]
