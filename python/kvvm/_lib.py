"""Loading libkvvm and declaring its C ABI (include/kvvm.h) with ctypes.

Nothing here is compiled: the structs mirror the header's, and every struct passed to the
library carries its size in its first field, so an older or newer libkvvm with fields added
at the end still works (the library copies min(its size, ours)).

Where the library is looked for, first match wins:
  1. the file named by the KVVM_LIBRARY environment variable;
  2. libkvvm.so / libkvvm.so.0 next to this package (a copy placed there);
  3. the dynamic loader's path (LD_LIBRARY_PATH, ldconfig: e.g. after `cmake --install`);
  4. build/libkvvm.so of the source tree this package sits in (python/kvvm -> ../../build).
"""
import ctypes
import ctypes.util
import errno as _errno
import os

c_size_t = ctypes.c_size_t
c_u32 = ctypes.c_uint32
c_u64 = ctypes.c_uint64
c_int = ctypes.c_int
c_double = ctypes.c_double
c_void_p = ctypes.c_void_p
c_char_p = ctypes.c_char_p
P = ctypes.POINTER

BACKEND_AUTO, BACKEND_CUDA, BACKEND_EMULATED = 0, 1, 2
BACKENDS = {"auto": BACKEND_AUTO, "cuda": BACKEND_CUDA, "emulated": BACKEND_EMULATED}

F_AUTO_SWAP = 1 << 0
F_SCRUB = 1 << 1
F_SPILL_ALLOW_TMPFS = 1 << 2
F_SPILL_BUFFERED = 1 << 3
F_CACHE_DEMOTE = 1 << 4
F_POOL_VIEW = 1 << 5

SEQ_LIVE, SEQ_CACHED, SEQ_PINNED = 0, 1, 2
SEQ_CLASSES = {"live": SEQ_LIVE, "cached": SEQ_CACHED, "pinned": SEQ_PINNED}
ALL_REGIONS = 0xFFFFFFFF

LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_OFF = 0, 1, 2, 3, 4

KEY_BYTES = 32                   # sizeof(kvvm_key)
TIER_DEVICE, TIER_HOST, TIER_DISK, TIER_STORE, TIER_POOL = 1, 2, 3, 4, 5


class Config(ctypes.Structure):
    """struct kvvm_config."""
    _fields_ = [
        ("size", c_size_t),
        ("backend", c_int),
        ("device", c_int),
        ("n_regions", c_u32),
        ("bytes_per_token", c_u64),
        ("max_seqs", c_u32),
        ("max_tokens", c_u64),
        ("page_size", c_size_t),
        ("device_budget", c_size_t),
        ("host_budget", c_size_t),
        ("spill_dir", c_char_p),
        ("spill_budget", c_size_t),
        ("device_min", c_double), ("device_low", c_double), ("device_high", c_double),
        ("host_min", c_double), ("host_low", c_double), ("host_high", c_double),
        ("flags", ctypes.c_uint),
        ("emu_device_bytes", c_size_t),
        ("emu_granule", c_size_t),
        ("map_ahead", c_u32),
        ("emu_opaque", c_int),
        ("pool_thread", c_int),
        ("pool_low", c_u32),
        ("pool_high", c_u32),
        ("pool_decay_ms", c_u32),
        ("create_at_open", c_int),
        ("store_url", c_char_p),
        ("store_timeout_ms", c_u32),
        ("pool_socket", c_char_p),
        ("client_name", c_char_p),
        ("pool_reserve", c_size_t),
        ("pool_timeout_ms", c_u32),
        ("store_queue_bytes", c_size_t),
    ]


# The library accepts a config of up to 4096 bytes; kvvm_config_init writes its own sizeof,
# which may exceed ours when the library is newer: it always gets a buffer this large.
CONFIG_BUF_BYTES = 4096


class SeqInfo(ctypes.Structure):
    """struct kvvm_seq_info."""
    _fields_ = [
        ("size", c_size_t),
        ("length", c_u64),
        ("slot", c_u32),
        ("pages_device", c_u32), ("pages_host", c_u32), ("pages_disk", c_u32),
        ("pages_shared", c_u32),
        ("resident", c_int),
        ("dropped", c_int),
        ("cls", c_u32),
        ("first_kept", c_u64),
    ]


STATS_FIELDS = (
    "page_size", "pages_device_total", "pages_device_free", "pages_host_total",
    "pages_host_free", "pages_disk_total", "pages_disk_free", "pages_inflight", "maps",
    "unmaps", "cow_copies", "swap_outs", "swap_ins", "spills", "unspills", "bytes_to_host",
    "bytes_to_device", "bytes_to_disk", "bytes_from_disk", "checksum_failures", "io_errors",
    "reclaim_runs", "reclaim_swap_outs", "direct_reclaims", "direct_swap_outs",
    "direct_reclaim_ns", "pages_orphan", "seqs_nonresident", "pages_damaged",
    "frames_created_sync", "frames_released", "device_bytes_held", "cache_drops",
    "cache_demotes", "pages_discarded", "device_mem_free", "device_mem_total", "device_budget",
    "create_oom", "prefix_entries", "prefix_lookups", "prefix_hit_blocks", "prefix_evictions",
    "store_puts", "store_gets", "store_hits", "store_errors", "store_bytes_out", "store_bytes_in",
    "prefix_spills", "store_unused", "pool_leases", "pool_returns", "pool_waits",
    "pool_wait_ns", "pool_hit_blocks", "exports", "imports", "store_dropped",
    "store_queue_bytes", "store_staging_bytes",
)


class Stats(ctypes.Structure):
    """struct kvvm_stats."""
    _fields_ = [("size", c_size_t)] + [(n, c_u64) for n in STATS_FIELDS]


class PoolInfo(ctypes.Structure):
    """struct kvvm_pool_info."""
    _fields_ = [("size", c_size_t), ("pool_bytes", c_u64), ("free_bytes", c_u64),
                ("held_bytes", c_u64), ("reserve_bytes", c_u64), ("limit_bytes", c_u64),
                ("n_clients", c_u32), ("connected", c_int), ("shared_entries", c_u64),
                ("shared_bytes", c_u64)]


LOG_FN = ctypes.CFUNCTYPE(None, c_int, c_char_p, c_void_p)

# name: (restype, argtypes). Every int-returning call returns 0 or a negative errno.
_PROTOS = {
    "kvvm_config_init": (None, [c_void_p]),
    "kvvm_open": (c_int, [c_void_p, P(c_void_p)]),
    "kvvm_close": (None, [c_void_p]),
    "kvvm_seq_create": (c_int, [c_void_p, P(c_u64)]),
    "kvvm_seq_free": (c_int, [c_void_p, c_u64]),
    "kvvm_seq_grow": (c_int, [c_void_p, c_u64, c_u64]),
    "kvvm_seq_grow_batch": (c_int, [c_void_p, P(c_u64), P(c_u64), c_size_t]),
    "kvvm_seq_truncate": (c_int, [c_void_p, c_u64, c_u64]),
    "kvvm_seq_fork": (c_int, [c_void_p, c_u64, P(c_u64)]),
    "kvvm_seq_share": (c_int, [c_void_p, c_u64, c_u64, c_u64]),
    "kvvm_seq_prepare_write": (c_int, [c_void_p, c_u64, c_u64, c_u64]),
    "kvvm_seq_write": (c_int, [c_void_p, c_u64, c_u32, c_u64, c_void_p, c_size_t]),
    "kvvm_seq_read": (c_int, [c_void_p, c_u64, c_u32, c_u64, c_void_p, c_size_t]),
    "kvvm_seq_swap_out": (c_int, [c_void_p, c_u64]),
    "kvvm_seq_swap_in": (c_int, [c_void_p, c_u64]),
    "kvvm_step": (c_int, [c_void_p]),
    "kvvm_set_stream": (c_int, [c_void_p, c_void_p]),
    "kvvm_stream_create": (c_int, [c_void_p, P(c_void_p)]),
    "kvvm_stream_destroy": (c_int, [c_void_p, c_void_p]),
    "kvvm_sync": (c_int, [c_void_p]),
    "kvvm_seq_need": (c_int, [c_void_p, c_u64, c_u64, P(c_u64), P(c_int)]),
    "kvvm_seq_prefetch": (c_int, [c_void_p, c_u64]),
    "kvvm_seq_ready": (c_int, [c_void_p, c_u64]),
    "kvvm_seq_view_state": (c_int, [c_void_p, c_u64, P(c_u64), P(c_u64)]),
    "kvvm_seq_wait_stream": (c_int, [c_void_p, c_u64, c_void_p]),
    "kvvm_region_base": (c_int, [c_void_p, c_u32, P(c_u64)]),
    "kvvm_slot_bytes": (c_int, [c_void_p, P(c_u64)]),
    "kvvm_seq_slot": (c_int, [c_void_p, c_u64, P(c_u32)]),
    "kvvm_seq_addr": (c_int, [c_void_p, c_u64, c_u32, P(c_u64)]),
    "kvvm_seq_info": (c_int, [c_void_p, c_u64, P(SeqInfo)]),
    "kvvm_stats": (c_int, [c_void_p, P(Stats)]),
    "kvvm_pool_info": (c_int, [c_void_p, P(PoolInfo)]),
    "kvvm_seq_export": (c_int, [c_void_p, c_u64, c_void_p]),
    "kvvm_seq_import": (c_int, [c_void_p, c_void_p, P(c_u64)]),
    "kvvm_handoff_drop": (c_int, [c_void_p, c_void_p]),
    "kvvm_stats_json": (c_int, [c_void_p, ctypes.c_char_p, c_size_t]),
    "kvvm_metrics": (c_int, [c_void_p, ctypes.c_char_p, c_size_t]),
    "kvvm_set_budget": (c_int, [c_void_p, c_size_t]),
    "kvvm_trim": (c_int, [c_void_p, c_size_t]),
    "kvvm_seq_discard": (c_int, [c_void_p, c_u64, c_u32, c_u64]),
    "kvvm_seq_set_class": (c_int, [c_void_p, c_u64, c_int]),
    "kvvm_pool_base": (c_int, [c_void_p, c_u32, P(c_u64)]),
    "kvvm_pool_blocks": (c_int, [c_void_p, P(c_u32)]),
    "kvvm_seq_block_table": (c_int, [c_void_p, c_u64, c_u32, c_u32, P(ctypes.c_int32)]),
    "kvvm_batch_block_table": (c_int, [c_void_p, P(c_u64), c_size_t, P(ctypes.c_int32),
                                       P(ctypes.c_int32), c_size_t, P(ctypes.c_int32)]),
    "kvvm_set_log": (None, [LOG_FN, c_void_p, c_int]),
    "kvvm_block_tokens": (c_int, [c_void_p, P(c_u32)]),
    "kvvm_prefix_keys": (c_size_t, [c_void_p, c_size_t, c_u32, c_void_p, c_size_t, c_void_p,
                                    c_size_t]),
    "kvvm_prefix_publish": (c_int, [c_void_p, c_u64, c_u64, c_void_p, c_size_t]),
    "kvvm_prefix_lookup": (c_int, [c_void_p, c_u64, c_void_p, c_size_t, c_void_p]),
    "kvvm_prefix_attach": (c_int, [c_void_p, c_u64, c_u64, c_void_p, c_size_t]),
    "kvvm_prefix_drop": (c_int, [c_void_p, c_u64, c_void_p, c_size_t]),
    "kvvm_strerror": (c_char_p, [c_int]),
    "kvvm_last_error": (c_char_p, []),
    "kvvm_backend_name": (c_char_p, [c_void_p]),
    "kvvm_version": (c_char_p, []),
}


def _candidates():
    env = os.environ.get("KVVM_LIBRARY")
    if env:
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    c = [os.path.join(here, n) for n in ("libkvvm.so", "libkvvm.so.0")]
    found = ctypes.util.find_library("kvvm")
    c += ["libkvvm.so.0", "libkvvm.so"] + ([found] if found else [])
    c.append(os.path.join(os.path.dirname(os.path.dirname(here)), "build", "libkvvm.so"))
    return c, False


def load():
    """Returns the loaded libkvvm (ctypes.CDLL) with its prototypes set."""
    names, explicit = _candidates()
    errors = []
    for name in names:
        if os.sep in name and not os.path.exists(name) and not explicit:
            continue
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError as e:
            errors.append("%s: %s" % (name, e))
            if explicit:
                break
    else:
        lib = None
    if lib is None:
        raise ImportError(
            "kvvm: libkvvm.so not found (%s). Build it (cmake --build build) and set "
            "KVVM_LIBRARY=/path/to/libkvvm.so, install it (cmake --install build), or put "
            "it next to the kvvm package." % ("; ".join(errors) or ", ".join(names)))
    for fn, (res, args) in _PROTOS.items():
        f = getattr(lib, fn)
        f.restype = res
        f.argtypes = args
    return lib


lib = load()
VERSION = lib.kvvm_version().decode()
LIBRARY_PATH = getattr(lib, "_name", "")


def last_error():
    """kvvm_last_error(): the calling thread's reason for its last failed call ("" none)."""
    s = lib.kvvm_last_error()
    return s.decode("utf-8", "replace") if s else ""


def strerror(err):
    s = lib.kvvm_strerror(-abs(err))
    return s.decode() if s else os.strerror(abs(err))


ESTALE = getattr(_errno, "ESTALE", 116)
