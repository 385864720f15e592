"""kvvm.Context and kvvm.Sequence: thin wrappers over the C calls of include/kvvm.h.

Every C call that fails raises kvvm.Error (a subclass per errno, see _errors.py); a failed
call changes nothing (the library's rule). ctypes releases the GIL for every call, so other
Python threads run while libkvvm works; the library's own lock serialises calls on one
context.

Views (Sequence.tensor/array/view, Context.region_tensor/region_array) alias device memory.
They are valid only while the sequence is resident and its tokens [0, length) mapped:
between a call that protects it (grow, grow_batch, prepare_write, swap_in, write, read) and
the moment it may move (an explicit swap_out, or reclaim after the next step() with
KVVM_F_AUTO_SWAP), and never past a truncate, discard, free or close. Creating a view checks
that the sequence is resident now. Every call through this package that moves a sequence
makes its views stale (Sequence._stale): tensors it handed out are emptied in place
(Tensor.set_(), so a kernel given one sees no bytes instead of faulting), and View objects
raise when a consumer asks for them. What the package cannot reach — numpy arrays, tensors
derived from a view (slices, reshapes), raw addresses — stays a dangling alias: touching it
is undefined (the emulated device raises SIGSEGV; a GPU makes an illegal-address error that
kills the whole CUDA context). docs/python.md says so.
"""
import ctypes
import enum
import errno as _errno
import json
import os
import threading
import weakref
from collections import namedtuple

from . import _errors, _lib, _log, _views
from ._errors import Error, InvalidArgument, InvalidHandle, NotResident, NotSupported, Busy

L = _lib.lib
c_u64 = ctypes.c_uint64
c_u32 = ctypes.c_uint32

SeqInfo = namedtuple("SeqInfo", "length slot pages_device pages_host pages_disk "
                     "pages_shared resident dropped cls first_kept")

_CONFIG_FIELDS = {name for name, _ in _lib.Config._fields_} - {"size"}
_SIZE_FIELDS = {"page_size", "device_budget", "host_budget", "spill_budget",
                "emu_device_bytes", "emu_granule"}
_live = weakref.WeakSet()           # open contexts, closed at exit
_pending_close = []                 # contexts collected inside a log callback
_pending_lock = threading.Lock()


def _call(fn, *args):
    """Calls a C function returning 0 / -errno; raises kvvm.Error on failure (its reason
    is not logged too: _log.call_begin)."""
    since = _log.call_begin()
    rc = -1
    try:
        rc = fn(*args)
        if rc < 0:
            raise _errors.make(rc, fn.__name__, since=since)
    finally:
        _log.call_end(rc < 0)
    return rc


def _parse_size(v):
    """Sizes: ints, or strings with K/M/G/T suffixes like the KVVM_* variables."""
    if isinstance(v, str):
        s = v.strip().upper().rstrip("B").rstrip("I")
        mult = 1
        for i, suf in enumerate("KMGT"):
            if s.endswith(suf):
                mult, s = 1024 ** (i + 1), s[:-1]
                break
        return int(float(s) * mult)
    return int(v)


def _set_field(cfg, k, v):
    """cfg.k = v, a size parsed (_parse_size); a value that is no number names the field."""
    what = ("a size: an int, or a string such as '64M', '2G', '512K'" if k in _SIZE_FIELDS
            else "a number")
    try:
        x = _parse_size(v) if k in _SIZE_FIELDS else v
        if isinstance(x, int) and x < 0:
            raise ValueError(x)
        setattr(cfg, k, x)
    except (TypeError, ValueError, OverflowError):
        raise InvalidArgument(22, "Context: %s=%r is not %s" % (k, v, what)) from None


# kvvm_open's errors about spill_dir and spill_budget (docs/api.md): SpillDirError, not the
# class the errno has for the sequence calls (-ENOENT is InvalidHandle, -ENOSPC NoSlot)
_SPILL_DIR_ERRNOS = {_errno.ENOENT, _errno.ENOTDIR, _errno.EACCES, _errno.EPERM,
                     _errno.EROFS, _errno.ENAMETOOLONG, _errno.ELOOP, _errno.ENOSPC,
                     _errno.EDQUOT, _errno.EFBIG}


def _flags_value(v):
    if isinstance(v, str):
        names = {"auto_swap": _lib.F_AUTO_SWAP, "scrub": _lib.F_SCRUB,
                 "spill_allow_tmpfs": _lib.F_SPILL_ALLOW_TMPFS,
                 "spill_buffered": _lib.F_SPILL_BUFFERED, "cache_demote": _lib.F_CACHE_DEMOTE,
                 "pool_view": _lib.F_POOL_VIEW}
        f = 0
        for t in v.replace("|", ",").replace("+", ",").split(","):
            t = t.strip().lower()
            if not t:
                continue
            if t not in names:
                raise InvalidArgument(22, "unknown flag %r (known: %s)" % (t, sorted(names)))
            f |= names[t]
        return f
    return int(v)


CU_STREAM_LEGACY = 0x1                # cuda.h: the legacy default stream as a handle


def _stream_handle(stream):
    """A CUstream as an int: None -> 0 (no stream), an int, or an object with .cuda_stream
    (torch) or .ptr (cupy). Handle 0 from a stream object or as an int is the legacy default
    stream (PyTorch's default stream, the runtime's stream 0): it becomes CU_STREAM_LEGACY,
    as torch.utils.dlpack does, since a NULL stream means synchronous mode to libkvvm."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream or CU_STREAM_LEGACY
    for attr in ("cuda_stream", "ptr", "handle"):
        h = getattr(stream, attr, None)
        if isinstance(h, int):
            return h or CU_STREAM_LEGACY
    raise TypeError("kvvm: %r is not a stream (an int CUstream, a torch.cuda.Stream or an "
                    "object with .cuda_stream)" % (stream,))


class Tier(enum.IntEnum):
    """Where a prefix-cache entry is (kvvm_prefix_lookup's `where`)."""
    DEVICE = _lib.TIER_DEVICE
    HOST = _lib.TIER_HOST
    DISK = _lib.TIER_DISK
    STORE = _lib.TIER_STORE
    POOL = _lib.TIER_POOL           # the pool daemon's shared prefix index (0.4)


def _keys_buffer(keys):
    """keys (bytes-like, at most 32 bytes each, zero-padded) as one kvvm_key array."""
    keys = list(keys)
    buf = (ctypes.c_uint8 * (max(len(keys), 1) * _lib.KEY_BYTES))()
    for i, k in enumerate(keys):
        k = bytes(k)
        if len(k) > _lib.KEY_BYTES:
            raise InvalidArgument(22, "key %d has %d bytes, more than %d" % (
                i, len(k), _lib.KEY_BYTES))
        ctypes.memmove(ctypes.addressof(buf) + i * _lib.KEY_BYTES, k, len(k))
    return buf, len(keys)


def _host_buffer(data, writable):
    """(address, nbytes, keepalive) of a host buffer: bytes-like, numpy array, CPU tensor."""
    if _views.is_torch_dtype(getattr(data, "dtype", None)) and hasattr(data, "data_ptr"):
        if data.device.type != "cpu":
            raise InvalidArgument(22, "a %s tensor is not host memory: read/write move bytes "
                                  "between the host and a sequence" % data.device.type)
        if not data.is_contiguous():
            raise InvalidArgument(22, "the tensor is not contiguous")
        return data.data_ptr(), data.numel() * data.element_size(), data
    import numpy as np
    if isinstance(data, np.ndarray):
        arr = data
    else:
        try:
            arr = np.frombuffer(data, dtype=np.uint8)
        except (TypeError, ValueError) as e:
            raise TypeError("kvvm: %r is not a contiguous buffer, numpy array or CPU "
                            "tensor" % type(data).__name__) from e
    if not arr.flags.c_contiguous:
        raise InvalidArgument(22, "the array is not C-contiguous")
    if writable and not arr.flags.writeable:
        raise InvalidArgument(22, "the output buffer is read-only")
    return arr.ctypes.data, arr.nbytes, arr


def _token(token):
    """A hand-off token (32 bytes) as a C buffer."""
    b = bytes(token)
    if len(b) != 32:
        raise InvalidArgument(22, "a hand-off token is 32 bytes, not %d" % len(b))
    return ctypes.create_string_buffer(b, 32)


class Context:
    """One libkvvm context (kvvm_open). Keywords are struct kvvm_config fields; the others
    keep kvvm_config_init's defaults, so KVVM_* environment variables apply to them.

    backend: "auto" | "cuda" | "emulated"; sizes as ints or "64M"-style strings; flags as an
    int (kvvm.F_*) or "auto_swap,scrub"; spill_dir as a str or path-like; store_url as a
    str ("file:///dir", "redis://[[user]:password@]host[:port][/db]", port 6379 by
    default, or "redis-cluster://[[user]:password@]host:port[,host:port...]")."""

    def __init__(self, **config):
        _log.sync_level()
        _drain_pending()
        unknown = set(config) - _CONFIG_FIELDS
        if unknown:
            raise TypeError("kvvm.Context: unknown config field(s) %s (known: %s)"
                            % (", ".join(sorted(unknown)), ", ".join(sorted(_CONFIG_FIELDS))))
        self._kv = None
        buf = ctypes.create_string_buffer(_lib.CONFIG_BUF_BYTES)
        L.kvvm_config_init(buf)
        cfg = _lib.Config.from_buffer(buf)
        self._spill_dir = None
        self._store_url = None
        self._strs = {}
        for k, v in config.items():
            if k == "backend":
                if isinstance(v, str):
                    if v not in _lib.BACKENDS:
                        raise InvalidArgument(22, "backend %r is not auto, cuda or emulated"
                                              % v)
                    v = _lib.BACKENDS[v]
                cfg.backend = int(v)
            elif k == "spill_dir":
                self._spill_dir = None if v is None else os.fsencode(v)
                cfg.spill_dir = self._spill_dir
            elif k == "store_url":
                self._store_url = None if v is None else str(v).encode()
                cfg.store_url = self._store_url
            elif k in ("pool_socket", "client_name"):
                b = None if v is None else os.fsencode(v)
                self._strs[k] = b           # the library copies it at open; kept till then
                setattr(cfg, k, b)
            elif k == "flags":
                cfg.flags = _flags_value(v)
            elif k in ("emu_opaque",):
                cfg.emu_opaque = 1 if v else 0
            else:
                _set_field(cfg, k, v)
        kv = ctypes.c_void_p()
        try:
            _call(L.kvvm_open, buf, ctypes.byref(kv))
        except Error as e:
            # -EACCES is the store's refusal when the library's reason says so (the store
            # opens first: AccessDenied), else the spill_dir's
            store = self._store_url is not None and "kvvm store" in e.message
            if self._spill_dir is not None and e.errno in _SPILL_DIR_ERRNOS and not store:
                raise _errors.SpillDirError(e.errno, e.message, e.function) from None
            raise
        self._kv = kv.value
        self._kvc = ctypes.c_void_p(self._kv)   # as a ctypes argument (Sequence._view_state)
        self._lock = threading.Lock()
        self._seqs = {}                 # handle -> Sequence (live ones)
        self._stream = None             # keeps the engine stream object alive
        self._stream_handle = 0
        self._region_views = {}
        eff = self.stats_json()
        self.config = eff["config"]     # the effective configuration (JSON names)
        self.backend = L.kvvm_backend_name(self._kv).decode()
        self.n_regions = int(self.config["n_regions"])
        self.bytes_per_token = int(self.config["bytes_per_token"])
        self.max_seqs = int(self.config["max_seqs"])
        self.max_tokens = int(self.config["max_tokens"])
        self.page_size = int(self.config["page_size"])
        self.device = int(self.config["device"])
        self.opaque = self.backend == "emulated" and bool(self.config.get("emu_opaque", 0))
        self._cuda = self.backend == "cuda"
        sb = c_u64()
        _call(L.kvvm_slot_bytes, self._kv, ctypes.byref(sb))
        self.slot_bytes = sb.value
        self._bases = []
        for r in range(self.n_regions):
            a = c_u64()
            _call(L.kvvm_region_base, self._kv, r, ctypes.byref(a))
            self._bases.append(a.value)
        _live.add(self)

    # ---- life -------------------------------------------------------------------------
    def _h(self):
        kv = self._kv
        if kv is None:
            raise InvalidHandle(2, "the context is closed")
        return kv

    @property
    def closed(self):
        return self._kv is None

    def close(self):
        """Frees everything (kvvm_close); every Sequence and view of it is dead after.
        Closing twice is a no-op."""
        kv, self._kv = self._kv, None
        if kv is None:
            return
        for s in list(self._seqs.values()):
            s._dead = True
            s._stale()
        self._seqs.clear()
        for v in self._region_views.values():
            _neuter(v)
        self._region_views.clear()
        L.kvvm_close(kv)
        _live.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_kv", None) is None:
            return
        if _log.in_callback():          # kvvm_close may join the thread logging now
            with _pending_lock:
                _pending_close.append(self._kv)
            self._kv = None
            return
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        if self._kv is None:
            return "<kvvm.Context closed>"
        return "<kvvm.Context %s regions=%d bpt=%d max_seqs=%d max_tokens=%d page=%d>" % (
            self.backend, self.n_regions, self.bytes_per_token, self.max_seqs,
            self.max_tokens, self.page_size)

    # ---- sequences ----------------------------------------------------------------------
    def create(self):
        """A new empty sequence (kvvm_seq_create); NoSlot when max_seqs are live."""
        h = c_u64()
        _call(L.kvvm_seq_create, self._h(), ctypes.byref(h))
        return Sequence._new(self, h.value)

    @property
    def sequences(self):
        """The live sequences made through this object."""
        return list(self._seqs.values())

    def grow_batch(self, seqs, lengths):
        """Grows every sequence to its length in one call (a decode step): all or nothing."""
        seqs = list(seqs)
        lengths = list(lengths)
        if len(seqs) != len(lengths):
            raise InvalidArgument(22, "grow_batch: %d sequences but %d lengths"
                                  % (len(seqs), len(lengths)))
        n = len(seqs)
        hs = (c_u64 * max(n, 1))(*[s._handle() for s in seqs])
        ls = (c_u64 * max(n, 1))(*[int(x) for x in lengths])
        _call(L.kvvm_seq_grow_batch, self._h(), hs, ls, n)

    def step(self):
        """Engine iteration boundary (kvvm_step): once per decode step. With auto_swap,
        reclaim may move any sequence but a pinned one from now on: their views go stale."""
        _call(L.kvvm_step, self._h())
        if int(self.config.get("flags", 0)) & _lib.F_AUTO_SWAP:
            for s in list(self._seqs.values()):
                if s._handed or s._views:
                    if s._query().cls != _lib.SEQ_PINNED:
                        s._stale()

    def sync(self):
        """Waits for all copies, disk I/O and background reclaim started before it."""
        _call(L.kvvm_sync, self._h())

    def set_stream(self, stream):
        """The engine stream: a torch.cuda.Stream, an int CUstream, or None (synchronous).
        torch's default stream (handle 0) and the int 0 are the legacy default stream
        (CU_STREAM_LEGACY), not synchronous mode."""
        h = _stream_handle(stream)
        _call(L.kvvm_set_stream, self._h(), ctypes.c_void_p(h or None))
        self._stream, self._stream_handle = stream, h

    @property
    def stream(self):
        """The engine stream handle (int), 0 when synchronous."""
        return self._stream_handle

    def stream_create(self):
        """A stream of this context's device (kvvm_stream_create), as an int handle; the
        context destroys it at close, or stream_destroy() earlier."""
        s = ctypes.c_void_p()
        _call(L.kvvm_stream_create, self._h(), ctypes.byref(s))
        return s.value

    def stream_destroy(self, stream):
        _call(L.kvvm_stream_destroy, self._h(), ctypes.c_void_p(_stream_handle(stream) or None))

    # ---- elastic device memory ----------------------------------------------------------
    def set_budget(self, device_budget):
        """kvvm_set_budget: the device budget at run time (bytes or "8G"; a multiple of
        page_size). Shrinking drops cached sequences, swaps out unprotected live ones and
        gives the frames back to the driver, all or nothing (OutOfMemory: nothing moved)."""
        _call(L.kvvm_set_budget, self._h(), _parse_size(device_budget))
        self._stale_moved()

    def _stale_moved(self):
        """After a call that may have reclaimed: the views of what it swapped out or
        dropped are stale."""
        for s in list(self._seqs.values()):
            if (s._handed or s._views) and not s._query().resident:
                s._stale()

    def trim(self, keep=0):
        """kvvm_trim: gives the device frames that hold no page back to the driver, keeping
        at most `keep` bytes of them. Moves no data."""
        _call(L.kvvm_trim, self._h(), _parse_size(keep))

    # ---- prefix cache keyed by content (docs/api.md "Prefix cache keyed by content") ------
    @property
    def block_tokens(self):
        """Tokens per block (kvvm_block_tokens): page_size // bytes_per_token."""
        t = c_u32()
        _call(L.kvvm_block_tokens, self._h(), ctypes.byref(t))
        return t.value

    def prefix_keys(self, tokens, salt=b""):
        """kvvm_prefix_keys: the chained XXH3-128 keys (32 bytes each) of the full blocks of
        `tokens` (token ids: a list, numpy array or tensor), salted (bytes or str)."""
        ids = [int(x) for x in (tokens.tolist() if hasattr(tokens, "tolist") else tokens)]
        if isinstance(salt, str):
            salt = salt.encode()
        salt = bytes(salt)
        t = self.block_tokens
        n = len(ids) // t
        arr = (ctypes.c_int32 * max(len(ids), 1))(*ids)
        out = (ctypes.c_uint8 * (max(n, 1) * _lib.KEY_BYTES))()
        got = L.kvvm_prefix_keys(arr, len(ids), t, salt or None, len(salt), out, n)
        raw = bytes(out)
        return [raw[i * _lib.KEY_BYTES:(i + 1) * _lib.KEY_BYTES] for i in range(got)]

    def publish(self, seq, keys, ns=0):
        """kvvm_prefix_publish: enters seq's first len(keys) blocks under keys (bytes of at
        most 32, zero-padded) in namespace ns; returns the number of new entries."""
        buf, n = _keys_buffer(keys)
        return _call(L.kvvm_prefix_publish, self._h(), seq._handle(), int(ns), buf, n)

    def lookup(self, keys, ns=0):
        """kvvm_prefix_lookup: the tier (kvvm.Tier) of each leading key present in ns; its
        length is the number found. Moves nothing."""
        buf, n = _keys_buffer(keys)
        where = (ctypes.c_uint8 * max(n, 1))()
        k = _call(L.kvvm_prefix_lookup, self._h(), int(ns), buf, n, where)
        return [Tier(where[i]) for i in range(k)]

    def attach(self, seq, keys, ns=0):
        """kvvm_prefix_attach: maps the longest present prefix of keys into the empty seq
        (shared, no copy; host/disk entries brought up), all or nothing; returns the blocks
        attached (0: a miss). seq's length is then that many blocks * block_tokens."""
        buf, n = _keys_buffer(keys)
        h = seq._handle()
        seq._stale()
        try:
            return _call(L.kvvm_prefix_attach, self._h(), h, int(ns), buf, n)
        finally:
            self._stale_moved()

    def drop(self, keys=None, ns=0):
        """kvvm_prefix_drop: removes those entries (None: every entry of ns); sequences
        sharing their pages keep them. Returns the number removed."""
        if keys is None:
            return _call(L.kvvm_prefix_drop, self._h(), int(ns), None, 0)
        buf, n = _keys_buffer(keys)
        return _call(L.kvvm_prefix_drop, self._h(), int(ns), buf, n)

    # ---- addresses and stats ------------------------------------------------------------
    def region_base(self, region):
        """Device address of slot 0, token 0 of `region`."""
        a = c_u64()
        _call(L.kvvm_region_base, self._h(), int(region), ctypes.byref(a))
        return a.value

    def stats(self):
        """struct kvvm_stats as a dict."""
        st = _lib.Stats()
        st.size = ctypes.sizeof(st)
        _call(L.kvvm_stats, self._h(), ctypes.byref(st))
        return {n: getattr(st, n) for n in _lib.STATS_FIELDS}

    def pool_info(self):
        """struct kvvm_pool_info as a dict: the kvvmd pool this context leases from
        (kvvm.Error with errno EOPNOTSUPP for a context opened without pool_socket)."""
        pi = _lib.PoolInfo()
        pi.size = ctypes.sizeof(pi)
        _call(L.kvvm_pool_info, self._h(), ctypes.byref(pi))
        return {n: getattr(pi, n) for n, _ in _lib.PoolInfo._fields_ if n != "size"}

    def import_seq(self, token):
        """kvvm_seq_import: a new Sequence sharing the pages of the export `token` (the 32
        bytes Sequence.export returned, in this or another process of the same kvvmd), no
        copy, copy on write. Once: the token is spent then (kvvm.Error ENOENT after)."""
        t = _token(token)
        h = c_u64()
        _call(L.kvvm_seq_import, self._h(), t, ctypes.byref(h))
        return Sequence._new(self, h.value)

    def handoff_drop(self, token):
        """kvvm_handoff_drop: gives up an unimported export."""
        _call(L.kvvm_handoff_drop, self._h(), _token(token))

    def stats_json(self):
        """kvvm_stats_json parsed: stats, layout, effective config, backend, version."""
        n = 8192
        while True:
            buf = ctypes.create_string_buffer(n)
            since = _log.call_begin()
            rc = -1
            try:
                rc = L.kvvm_stats_json(self._h(), buf, n)
                if rc < 0 and not (rc == -28 and n < (1 << 24)):
                    raise _errors.make(rc, "kvvm_stats_json", since=since)
            finally:
                _log.call_end(rc < 0)
            if rc == -28:                        # -ENOSPC: a bigger buffer
                n *= 4
                continue
            return json.loads(buf.value.decode())

    def metrics(self):
        """kvvm_metrics: the Prometheus text exposition (format 0.0.4) of the context's
        figures, as a str (serve it as text/plain; version=0.0.4 on /metrics)."""
        n = _call(L.kvvm_metrics, self._h(), None, 0)
        while True:
            n += 4096                            # room for figures that grow meanwhile
            buf = ctypes.create_string_buffer(n)
            need = _call(L.kvvm_metrics, self._h(), buf, n)
            if need < n:                         # it fit: written whole
                return buf.value.decode()
            n = need                             # grew past the room: again, larger

    # ---- views --------------------------------------------------------------------------
    def _check_viewable(self):
        self._h()
        if self.opaque:
            raise NotSupported(95, "the emulated device runs in opaque mode (emu_opaque=1 or "
                               "KVVM_EMU_OPAQUE=1): device windows are not CPU-readable, so "
                               "no array/tensor view can be made; use Sequence.read/write, "
                               "or open the context with emu_opaque=0")

    def _region_view(self, region, dtype, shape, kind):
        region = int(region)
        if not 0 <= region < self.n_regions:
            raise InvalidArgument(22, "region %d is outside [0, %d)" % (region, self.n_regions))
        shape = tuple(int(x) for x in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        key = (region, dtype, shape, kind)
        v = self._region_views.get(key)
        if v is not None:
            return v
        self._check_viewable()
        _, npd, tdt, inner = _element_strides(dtype, shape, self.bytes_per_token,
                                              "the context has bytes_per_token %d per token")
        full_shape = (self.max_seqs, self.max_tokens) + shape
        strides = (self.slot_bytes, self.bytes_per_token) + inner
        view = self._producer(self, self._bases[region], full_shape, strides, npd, tdt,
                              self._h_check)
        v = _views.numpy_view(view) if kind == "numpy" else self._consume(view, tdt)
        self._region_views[key] = v
        return v

    def _h_check(self):
        if self._kv is None:
            raise InvalidHandle(2, "the view's context is closed: the view is stale")

    def _producer(self, owner, addr, shape, strides, npd, tdt, check, on_consume=None):
        """The View of [addr, ...) for this context's backend."""
        cuda = self.backend == "cuda"
        return _views.View(owner, addr, shape, strides, npd, tdt, cuda=cuda,
                           device=self.device, stream=(self._stream_handle or None),
                           check=check, on_consume=on_consume if cuda else None)

    def _consume(self, view, tdt):
        if self.backend == "cuda" and tdt is None:
            raise TypeError("kvvm: on the CUDA backend views are torch tensors: pass a "
                            "torch dtype")
        return _views.torch_view(view)

    def region_tensor(self, region, dtype, shape):
        """A (max_seqs, max_tokens, *shape) torch tensor over the whole region (slot s at
        [s]), for batched kernels indexed by Sequence.slot. Only tokens [0, length) of
        resident sequences may be touched."""
        return self._region_view(region, dtype, shape, "torch")

    # ---- the pool view (KVVM_F_POOL_VIEW) -----------------------------------------------------
    @property
    def pool_blocks(self):
        """kvvm_pool_blocks: every block id is below it (fixed at open)."""
        n = ctypes.c_uint32()
        _call(L.kvvm_pool_blocks, self._h(), ctypes.byref(n))
        return n.value

    @property
    def tokens_per_block(self):
        """T = page_size // bytes_per_token: block b holds tokens [b*T, (b+1)*T)."""
        return self.page_size // self.bytes_per_token

    def _pool_view(self, region, dtype, block_shape, kind):
        region = int(region)
        if not 0 <= region < self.n_regions:
            raise InvalidArgument(22, "region %d is outside [0, %d)" % (region, self.n_regions))
        shape = tuple(int(x) for x in (block_shape if isinstance(block_shape, (tuple, list))
                                       else (block_shape,)))
        key = ("pool", region, dtype, shape, kind)
        v = self._region_views.get(key)
        if v is not None:
            return v
        base = c_u64()
        _call(L.kvvm_pool_base, self._h(), region, ctypes.byref(base))
        self._check_viewable()
        _, npd, tdt, inner = _element_strides(dtype, shape, self.page_size,
                                              "a block is page_size %d bytes")
        view = self._producer(self, base.value, (self.pool_blocks,) + shape,
                              (self.page_size,) + inner, npd, tdt, self._h_check)
        v = _views.numpy_view(view) if kind == "numpy" else self._consume(view, tdt)
        self._region_views[key] = v
        return v

    def pool_tensor(self, region, dtype, block_shape):
        """A zero-copy torch tensor [pool_blocks, *block_shape] over region's pool view
        (KVVM_F_POOL_VIEW): block id i is [i], the same page as the window of the sequence
        whose block table names i. prod(block_shape) * itemsize must be page_size, e.g.
        (tokens_per_block, heads, head_dim). Only ids in a resident sequence's current
        block table may be touched."""
        return self._pool_view(region, dtype, block_shape, "torch")

    def pool_array(self, region, dtype, block_shape):
        """pool_tensor as a numpy array (CPU-readable backends only)."""
        if self.backend == "cuda":
            raise NotSupported(95, "CUDA device memory cannot be a numpy array; use "
                               "pool_tensor")
        return self._pool_view(region, dtype, block_shape, "numpy")

    def batch_block_table(self, seqs):
        """kvvm_batch_block_table: FlashInfer's CSR form of the batch's block tables,
        (indptr [n + 1], indices [indptr[n]], last_len [n]) as int32 tensors (numpy arrays
        without torch). Raises NotResident for a swapped-out sequence."""
        import numpy as np
        hs = [s._handle() for s in seqs]
        n = len(hs)
        harr = (c_u64 * max(n, 1))(*hs)
        indptr = np.zeros(n + 1, np.int32)
        last = np.zeros(max(n, 1), np.int32)
        cap = sum((s.length * self.bytes_per_token + self.page_size - 1) // self.page_size
                  for s in seqs)
        while True:
            indices = np.zeros(max(cap, 1), np.int32)
            p32 = ctypes.POINTER(ctypes.c_int32)
            try:
                _call(L.kvvm_batch_block_table, self._h(), harr, n,
                      indptr.ctypes.data_as(p32), indices.ctypes.data_as(p32), cap,
                      last.ctypes.data_as(p32))
                break
            except Error as e:                  # -ENOSPC: indptr[n] says how many
                if e.errno != _errno.ENOSPC or int(indptr[n]) <= cap:
                    raise
                cap = int(indptr[n])
        return (_int32_out(indptr), _int32_out(indices[:int(indptr[n])].copy()),
                _int32_out(last[:n].copy()))

    def region_array(self, region, dtype, shape):
        """region_tensor as a numpy array (CPU-readable backends only)."""
        if self.backend == "cuda":
            raise NotSupported(95, "CUDA device memory cannot be a numpy array; use "
                               "region_tensor")
        return self._region_view(region, dtype, shape, "numpy")


def _element_strides(dtype, shape, nbytes, what):
    """(itemsize, numpy dtype, torch dtype, strides of shape's C order) for elements of
    dtype filling nbytes; InvalidArgument when prod(shape) * itemsize is not nbytes (what
    names the unit, e.g. "bytes_per_token %d")."""
    itemsize, npd, tdt, _ = _views.element_info(dtype)
    n = 1
    for x in shape:
        n *= x
    if n * itemsize != nbytes:
        raise InvalidArgument(22, "shape %s of %s is %d bytes, but %s" % (
            shape, dtype, n * itemsize, what % nbytes))
    inner = []
    acc = itemsize
    for x in reversed(shape):
        inner.insert(0, acc)
        acc *= x
    return itemsize, npd, tdt, tuple(inner)


def _int32_out(a):
    """An int32 numpy array as torch tensor when torch is there (block tables)."""
    try:
        import torch
    except ImportError:
        return a
    return torch.from_numpy(a)


def _neuter(t):
    """Empties a handed-out torch tensor in place (it then holds no bytes: a kernel given it
    touches nothing). numpy arrays cannot be emptied: they are left as they are."""
    if hasattr(t, "set_") and hasattr(t, "data_ptr"):
        try:
            t.set_()
        except Exception:               # e.g. an inference-mode tensor outside the mode
            pass


class _Handed:
    """The torch tensors handed out since a sequence last moved, held weakly: a list of
    weak references without callbacks (cheaper than a WeakSet, which hashes every tensor
    through torch's Python-level __hash__ and runs a Python callback when each one dies),
    the dead ones pruned when the list doubles."""
    __slots__ = ("refs", "limit")

    def __init__(self):
        self.refs = []
        self.limit = 64

    def add(self, t):
        refs = self.refs
        refs.append(weakref.ref(t))
        if len(refs) >= self.limit:
            self.prune()

    def prune(self):
        """Drops the dead references (KVCache.update appends to refs itself, then calls
        this when len(refs) reaches limit)."""
        refs = self.refs
        refs[:] = [r for r in refs if r() is not None]
        self.limit = max(64, 2 * len(refs))

    def __len__(self):
        return len(self.refs)

    def take(self):
        """The live tensors, the registry then empty."""
        refs, self.refs = self.refs, []
        self.limit = 64
        return [t for t in (r() for r in refs) if t is not None]


_tls = threading.local()    # .state: this thread's outputs of the fast path's C call
# kvvm_seq_view_state without argtypes, called with ctypes objects made once (the context's
# c_void_p, the sequence's c_uint64, this thread's byrefs): no argument conversion per call
_view_state_raw = L._FuncPtr(("kvvm_seq_view_state", L))
_view_state_raw.restype = ctypes.c_int
_seq_info_raw = L._FuncPtr(("kvvm_seq_info", L))
_seq_info_raw.restype = ctypes.c_int


def _state_buffer():
    try:
        return _tls.state
    except AttributeError:
        n, f, i = c_u64(), c_u64(), _lib.SeqInfo()
        i.size = ctypes.sizeof(i)
        _tls.state = (n, f, ctypes.byref(n), ctypes.byref(f), i, ctypes.byref(i))
        return _tls.state


def _drain_pending():
    with _pending_lock:
        todo = _pending_close[:]
        del _pending_close[:]
    for kv in todo:
        L.kvvm_close(kv)


def _close_all():
    for c in list(_live):
        try:
            c.close()
        except Exception:
            pass
    _drain_pending()


import atexit as _atexit  # noqa: E402
_atexit.register(_close_all)


class Sequence:
    """One sequence of a Context. Handles are not freed by garbage collection: call free()
    (or use `with ctx.create() as s:`); Context.close() frees all."""

    __slots__ = ("ctx", "handle", "slot", "_dead", "_views", "_epoch", "_handed", "_hc",
                 "__weakref__")

    @classmethod
    def _new(cls, ctx, handle):
        s = cls.__new__(cls)
        s.ctx = ctx
        s.handle = handle
        s._hc = c_u64(handle)           # the handle as a ctypes argument (_view_state)
        s._dead = False
        s._views = {}                   # (region, dtype, shape, kind) -> row over max_tokens
        s._epoch = 0                    # bumped when the sequence moves (_stale)
        s._handed = _Handed()           # torch tensors handed out since the last move
        slot = ctypes.c_uint32()
        _call(L.kvvm_seq_slot, ctx._h(), handle, ctypes.byref(slot))
        s.slot = slot.value
        ctx._seqs[handle] = s
        return s

    def __init__(self):
        raise TypeError("kvvm.Sequence: use Context.create(), Sequence.fork()")

    def _handle(self):
        if self._dead or self.ctx._kv is None:
            raise InvalidHandle(2, "the sequence was freed" if self._dead
                                else "the context is closed")
        return self.handle

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self._dead and self.ctx._kv is not None:
            self.free()

    def __repr__(self):
        if self._dead or self.ctx._kv is None:
            return "<kvvm.Sequence %#x freed>" % self.handle
        i = self.info
        return "<kvvm.Sequence %#x slot=%d length=%d%s>" % (
            self.handle, i.slot, i.length, "" if i.resident else " swapped-out")

    @property
    def freed(self):
        return self._dead

    def free(self):
        """Frees the sequence; freeing twice raises InvalidHandle."""
        h = self._handle()
        _call(L.kvvm_seq_free, self.ctx._kv, h)
        self._dead = True
        self._stale()
        self.ctx._seqs.pop(h, None)

    def _stale(self):
        """The sequence moved (or may have): every view made before is stale. Tensors handed
        out are emptied in place, the View objects made before refuse (epoch check), cached
        rows are dropped."""
        self._epoch += 1
        self._views.clear()
        for t in self._handed.take():
            _neuter(t)

    # ---- length ---------------------------------------------------------------------------
    def grow(self, length):
        """length >= current: makes it resident, tokens [old, length) writable."""
        _call(L.kvvm_seq_grow, self.ctx._kv, self._handle(), int(length))

    def truncate(self, length):
        """Shortens to `length`; the views made before are stale."""
        _call(L.kvvm_seq_truncate, self.ctx._kv, self._handle(), int(length))
        self._stale()

    def fork(self):
        """A child sharing every page (copy on write)."""
        c = c_u64()
        _call(L.kvvm_seq_fork, self.ctx._kv, self._handle(), ctypes.byref(c))
        return Sequence._new(self.ctx, c.value)

    def export(self):
        """kvvm_seq_export: hands this sequence's pages to one import (Context.import_seq,
        in any process of the same kvvmd) and returns the token, 32 bytes. The sequence
        stays usable; it copies on write from now on."""
        t = ctypes.create_string_buffer(32)
        _call(L.kvvm_seq_export, self.ctx._kv, self._handle(), t)
        return t.raw

    def share(self, src, n_tokens):
        """This (empty) sequence's first n_tokens become src's."""
        _call(L.kvvm_seq_share, self.ctx._kv, self._handle(), src._handle(), int(n_tokens))

    def prepare_write(self, first, end):
        """Before rewriting tokens [first, end) < length through a view: copy-on-write."""
        _call(L.kvvm_seq_prepare_write, self.ctx._kv, self._handle(), int(first), int(end))

    # ---- bytes ------------------------------------------------------------------------------
    def write(self, region, offset, data):
        """Host bytes -> region bytes [offset, offset + len(data)) (bytes-like, numpy array
        or contiguous CPU tensor)."""
        addr, n, keep = _host_buffer(data, writable=False)
        _call(L.kvvm_seq_write, self.ctx._kv, self._handle(), int(region), int(offset),
              ctypes.c_void_p(addr), n)
        del keep

    def read(self, region, offset, nbytes, out=None):
        """Region bytes [offset, offset + nbytes) -> a new bytes object, or into `out` (a
        writable buffer, numpy array or CPU tensor of at least nbytes), returned."""
        nbytes = int(nbytes)
        if out is None:
            buf = ctypes.create_string_buffer(max(nbytes, 1))
            _call(L.kvvm_seq_read, self.ctx._kv, self._handle(), int(region), int(offset),
                  buf, nbytes)
            return buf.raw[:nbytes]
        addr, n, keep = _host_buffer(out, writable=True)
        if n < nbytes:
            raise InvalidArgument(22, "out holds %d bytes, %d asked" % (n, nbytes))
        _call(L.kvvm_seq_read, self.ctx._kv, self._handle(), int(region), int(offset),
              ctypes.c_void_p(addr), nbytes)
        del keep
        return out

    def discard(self, first_kept, region=None):
        """kvvm_seq_discard: sliding-window attention. Releases the pages lying wholly before
        token `first_kept` in `region` (None = every region); addresses and length stay, the
        tokens before first_kept are gone (read/write there: InvalidArgument)."""
        r = _lib.ALL_REGIONS if region is None else int(region)
        _call(L.kvvm_seq_discard, self.ctx._kv, self._handle(), r, int(first_kept))
        self._stale()

    def set_class(self, cls):
        """kvvm_seq_set_class: "live" (default), "cached" (a prefix-cache entry: dropped
        before any live sequence is swapped) or "pinned" (never moved by policy); or
        kvvm.SEQ_*. A dropped cached sequence raises Stale until set_class again."""
        if isinstance(cls, str):
            if cls not in _lib.SEQ_CLASSES:
                raise InvalidArgument(22, "class %r is not live, cached or pinned" % cls)
            cls = _lib.SEQ_CLASSES[cls]
        _call(L.kvvm_seq_set_class, self.ctx._kv, self._handle(), int(cls))
        if int(cls) == _lib.SEQ_CACHED:         # may be dropped by any later call
            self._stale()

    # ---- tiers ------------------------------------------------------------------------------
    def swap_out(self):
        """Moves the pages down a tier; the views made before are stale."""
        _call(L.kvvm_seq_swap_out, self.ctx._kv, self._handle())
        self._stale()

    def swap_in(self):
        _call(L.kvvm_seq_swap_in, self.ctx._kv, self._handle())

    def prefetch(self):
        """Starts a swap-in without waiting (see `ready`)."""
        _call(L.kvvm_seq_prefetch, self.ctx._kv, self._handle())

    @property
    def ready(self):
        """True when resident with no swap-in copy in flight."""
        return _call(L.kvvm_seq_ready, self.ctx._kv, self._handle()) == 1

    def need(self, length):
        """(device pages that making it resident and growing it to `length` takes, whether
        that many are free now)."""
        p, f = c_u64(), ctypes.c_int()
        _call(L.kvvm_seq_need, self.ctx._kv, self._handle(), int(length), ctypes.byref(p),
              ctypes.byref(f))
        return p.value, bool(f.value)

    def wait_stream(self, stream):
        """Makes `stream` wait on the device for every swap copy enqueued so far."""
        _call(L.kvvm_seq_wait_stream, self.ctx._kv, self._handle(),
              ctypes.c_void_p(_stream_handle(stream) or None))

    # ---- state ------------------------------------------------------------------------------
    def _query(self):
        """kvvm_seq_info into a fresh struct (several threads may ask at once)."""
        i = _lib.SeqInfo()
        i.size = ctypes.sizeof(i)
        _call(L.kvvm_seq_info, self.ctx._kv, self._handle(), ctypes.byref(i))
        return i

    @property
    def info(self):
        i = self._query()
        return SeqInfo(i.length, i.slot, i.pages_device, i.pages_host, i.pages_disk,
                       i.pages_shared, bool(i.resident), bool(i.dropped), i.cls,
                       i.first_kept)

    @property
    def length(self):
        return self._query().length

    def addr(self, region):
        """Device address of token 0 in `region` (fixed for the sequence's life)."""
        a = c_u64()
        _call(L.kvvm_seq_addr, self.ctx._kv, self._handle(), int(region), ctypes.byref(a))
        return a.value

    # ---- views ------------------------------------------------------------------------------
    def _viewable_length(self):
        """The length, after checking the window may be read now; raises otherwise."""
        return self._viewable().length

    def _viewable(self):
        """kvvm_seq_info, after checking the window may be read now; raises otherwise."""
        kv, h = self.ctx._kv, self._handle()
        self.ctx._check_viewable()
        i = self._query()
        if not i.resident:
            raise NotResident(11, "sequence %#x is swapped out (pages on host %d, disk %d): "
                              "swap_in() or grow() it before making a view"
                              % (h, i.pages_host, i.pages_disk))
        if self.ctx.backend != "cuda" and L.kvvm_seq_ready(kv, h) != 1:
            raise Busy(16, "a swap-in copy of sequence %#x is still in flight; wait for "
                       "`ready` or ctx.sync() before reading it on the CPU" % h)
        return i

    def _view_state(self):
        """(length, first_kept) after checking that the window may be read now, as
        _viewable() does, with one bare C call (no _call bookkeeping; arguments made once)
        into this thread's buffers: on the emulated device kvvm_seq_view_state (resident
        and no swap-in copy in flight: the CPU reads the window), on a GPU kvvm_seq_info
        (resident; kernels on the engine stream are ordered after the copies, and
        kvvm_seq_view_state would reap finished jobs, querying their events, at every call).
        Anything else (a failed call, which logs nothing, swapped out, a copy in flight)
        takes _viewable(), which raises the same errors or, when the state changed in
        between, answers."""
        ctx = self.ctx
        kv = ctx._kv
        if not (self._dead or kv is None or ctx.opaque):
            n, f, nref, fref, info, iref = _state_buffer()
            if ctx._cuda:
                if _seq_info_raw(ctx._kvc, self._hc, iref) == 0 and info.resident:
                    return info.length, info.first_kept
            elif _view_state_raw(ctx._kvc, self._hc, nref, fref) == 1:
                return n.value, f.value
        i = self._viewable()
        return i.length, i.first_kept

    def _check_fresh(self, epoch):
        """Raises unless the sequence is alive, unmoved since `epoch` and viewable now."""
        if self._dead or self.ctx._kv is None or self._epoch != epoch:
            raise InvalidHandle(2, "stale view of sequence %#x: it was %s since the view was "
                                "made; make a new view" % (
                                    self.handle, "closed with its context"
                                    if self.ctx._kv is None else "freed" if self._dead
                                    else "moved (swap_out, truncate, discard, a step under "
                                    "auto_swap, ...)"))
        self._viewable_length()

    def _producer(self, region, dtype, shape):
        """(View over tokens [0, max_tokens) of `region` at the sequence's own address,
        its torch dtype)."""
        region = int(region)
        if not 0 <= region < self.ctx.n_regions:
            raise InvalidArgument(22, "region %d is outside [0, %d)"
                                  % (region, self.ctx.n_regions))
        shape = tuple(int(x) for x in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        _, npd, tdt, inner = _element_strides(dtype, shape, self.ctx.bytes_per_token,
                                              "the context has bytes_per_token %d per token")
        epoch = self._epoch
        view = self.ctx._producer(self, self.addr(region), (self.ctx.max_tokens,) + shape,
                                  (self.ctx.bytes_per_token,) + inner, npd, tdt,
                                  lambda: self._check_fresh(epoch), self.wait_stream)
        return view, tdt

    def _view(self, region, dtype, shape, kind):
        return self._rows((region,), dtype, shape, kind, self._viewable().length)[0]

    def _row(self, region, dtype, shape, kind):
        """The cached view of tokens [0, max_tokens) of `region` (not handed out: callers
        slice it); dropped when the sequence moves (_stale)."""
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        key = (region, dtype, shape, kind)
        row = self._views.get(key)
        if row is None:
            view, tdt = self._producer(region, dtype, shape)
            row = (_views.numpy_view(view) if kind == "numpy"
                   else self.ctx._consume(view, tdt))
            self._views[key] = row
        return row

    def _rows(self, regions, dtype, shape, kind, n):
        """Views of tokens [0, n) of each of `regions` (n from a _viewable() just made)."""
        out = []
        for region in regions:
            v = self._row(region, dtype, shape, kind)[:n]
            if kind == "torch":
                self._handed.add(v)
            out.append(v)
        return out

    def block_table(self, first=0, n=None):
        """kvvm_seq_block_table: the ids of blocks [first, first + n) (n None: to the last
        block) as an int32 tensor (numpy array without torch); -1 for a block discarded
        in every region. Index Context.pool_tensor with them. Raises NotResident when the
        sequence is swapped out, NotSupported without KVVM_F_POOL_VIEW."""
        import numpy as np
        ps, bpt = self.ctx.page_size, self.ctx.bytes_per_token
        if n is None:
            n = max((self.length * bpt + ps - 1) // ps - int(first), 0)
        ids = np.zeros(max(int(n), 1), np.int32)
        _call(L.kvvm_seq_block_table, self.ctx._h(), self._handle(), int(first), int(n),
              ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)))
        return _int32_out(ids[:int(n)].copy())

    def view(self, region, dtype, shape):
        """The producer of a (length, *shape) view of `region`'s tokens [0, length), for any
        consumer: torch.from_dlpack(v), numpy.from_dlpack(v) or numpy.asarray(v) (emulated
        device), cupy.from_dlpack(v) or cupy.asarray(v) (CUDA). It speaks DLPack
        (__dlpack__, __dlpack_device__: kDLCUDA on a GPU, kDLCPU on the emulated device) and
        the (CUDA) array interface; each of them raises InvalidHandle once the sequence has
        moved since (see the module doc), NotResident when it is swapped out."""
        n = self._viewable_length()
        self.ctx._check_viewable()
        view, tdt = self._producer(region, dtype, shape)
        view.shape = (n,) + view.shape[1:]
        return view

    def tensor(self, region, dtype, shape):
        """A zero-copy torch tensor of shape (length, *shape) over tokens [0, length) of
        `region` (CUDA tensor on a GPU, CPU tensor on the emulated device). prod(shape) *
        itemsize must equal bytes_per_token. Valid while the sequence stays resident and
        no shorter than now (see the module doc)."""
        return self._view(region, dtype, shape, "torch")

    def array(self, region, dtype, shape):
        """tensor() as a numpy array, without torch (CPU-readable backends only)."""
        if self.ctx.backend == "cuda":
            raise NotSupported(95, "CUDA device memory cannot be a numpy array; use tensor()")
        return self._view(region, dtype, shape, "numpy")
