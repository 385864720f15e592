"""The library's log, routed to Python's logging (logger "kvvm").

kvvm_set_log is process-wide: this module installs one callback at import and keeps the
ctypes callback object alive for the life of the process (atexit puts stderr back, so no
message arrives in a finalizing interpreter). The callback may run on library threads
(reclaim, spill); ctypes takes the GIL for it.

The threshold handed to the library (it does not format messages below it): KVVM_LOG when
set, else the effective level of the "kvvm" logger, re-read at every Context(); or what
kvvm.set_log_level() last set.

Each thread's last warning or error is kept so that kvvm.Error can carry the reason the
library logged during a failed call.

Errors raised as exceptions are not logged too: the library logs a refused argument at
error level (its log is a C program's channel for the reason), and Python's logging prints
ERROR records to stderr when nothing is configured, so every -EINVAL a caller caught also
appeared on stderr. While the binding makes a call (call_begin .. call_end) the error-level
messages of that call on that thread are held: when the call fails they travel in the
exception (kvvm_last_error) and reach the "kvvm" logger at DEBUG only; when it succeeds
they are logged at their level. Warnings, and everything from the library's own threads,
are logged at once.
"""
import atexit
import logging
import os
import threading

from . import _lib

logger = logging.getLogger("kvvm")

_TO_PY = {_lib.LOG_DEBUG: logging.DEBUG, _lib.LOG_INFO: logging.INFO,
          _lib.LOG_WARN: logging.WARNING, _lib.LOG_ERROR: logging.ERROR}
_NAMES = {"debug": _lib.LOG_DEBUG, "info": _lib.LOG_INFO, "warn": _lib.LOG_WARN,
          "warning": _lib.LOG_WARN, "error": _lib.LOG_ERROR, "off": _lib.LOG_OFF}

_serial = 0                 # bumped for every warning/error delivered
_last = {}                  # thread id -> (serial, message) of its last warning/error
_explicit = None            # level given to set_log_level(), if any
_level = None               # level the library has now
_in_callback = threading.local()
_calls = threading.local()  # .depth: binding calls in progress; .held: their error messages


def _callback(level, msg, arg):
    global _serial
    _in_callback.active = True
    try:
        text = msg.decode("utf-8", "replace") if msg else ""
        if level >= _lib.LOG_WARN:
            _serial += 1
            _last[threading.get_ident()] = (_serial, text)
        if level >= _lib.LOG_ERROR and getattr(_calls, "depth", 0):
            _calls.held.append((level, text))       # call_end decides
        else:
            logger.log(_TO_PY.get(level, logging.ERROR), "%s", text)
    except BaseException:           # never let an exception unwind into C
        pass
    finally:
        _in_callback.active = False


def call_begin():
    """Before a C call the binding makes: holds the call's error-level messages. Returns
    mark() for the exception's reason."""
    if not getattr(_calls, "depth", 0):
        _calls.depth = 0
        _calls.held = []
    _calls.depth += 1
    return _serial


def call_end(failed):
    """After it: a failure's messages go to the exception (and the logger at DEBUG), a
    success's to the logger at their level."""
    _calls.depth -= 1
    if _calls.depth:
        return
    held, _calls.held = _calls.held, []
    for level, text in held:
        if failed:
            logger.debug("%s (raised as kvvm.Error)", text)
        else:
            logger.log(_TO_PY.get(level, logging.ERROR), "%s", text)


_CB = _lib.LOG_FN(_callback)


def in_callback():
    return getattr(_in_callback, "active", False)


def mark():
    return _serial


def reason_since(since):
    got = _last.get(threading.get_ident())
    if got and got[0] > since:
        return got[1]
    return None


def _from_python_level(lvl):
    if lvl <= logging.DEBUG:
        return _lib.LOG_DEBUG
    if lvl <= logging.INFO:
        return _lib.LOG_INFO
    if lvl <= logging.WARNING:
        return _lib.LOG_WARN
    if lvl <= logging.ERROR:
        return _lib.LOG_ERROR
    return _lib.LOG_OFF


def _wanted():
    if _explicit is not None:
        return _explicit
    env = os.environ.get("KVVM_LOG", "").strip().lower()
    if env in _NAMES:
        return _NAMES[env]
    return _from_python_level(logger.getEffectiveLevel())


def sync_level():
    """Hands the library the threshold; called at import and at every Context()."""
    global _level
    want = _wanted()
    if want != _level:
        _lib.lib.kvvm_set_log(_CB, None, want)
        _level = want


def set_log_level(level):
    """Sets the library's threshold: a logging level (logging.DEBUG ...), one of 'debug',
    'info', 'warn', 'error', 'off', or None to follow KVVM_LOG / the "kvvm" logger again.
    The "kvvm" logger's own level also applies to what reaches handlers."""
    global _explicit
    if level is None:
        _explicit = None
    elif isinstance(level, str):
        if level.lower() not in _NAMES:
            raise ValueError("log level %r is not one of %s" % (level, sorted(_NAMES)))
        _explicit = _NAMES[level.lower()]
    else:
        _explicit = _from_python_level(int(level))
    sync_level()


def _restore_stderr():
    _lib.lib.kvvm_set_log(ctypes_null_fn(), None, _level if _level is not None else 2)


def ctypes_null_fn():
    return _lib.LOG_FN()


sync_level()
atexit.register(_restore_stderr)
