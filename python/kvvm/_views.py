"""Zero-copy views of device windows: DLPack producers, numpy arrays and torch tensors.

A view is built over an address range with explicit strides, never a copy. Its producer is a
`View`, which speaks every protocol a consumer may ask for:
  - DLPack (`__dlpack__`, `__dlpack_device__`): a "dltensor" capsule made with ctypes, device
    kDLCUDA on the CUDA backend, kDLCPU on the emulated device (whose addresses are host
    pointers of this process). torch tensors are made this way (torch.utils.dlpack), so torch
    takes the device from the capsule and never asks the driver about the address (torch's
    `__cuda_array_interface__` import calls cudaPointerGetAttributes, which fails on an
    address with nothing mapped);
  - the numpy array interface (emulated device) or the CUDA array interface version 3 (CUDA,
    with the engine stream), for numpy, CuPy, Numba.
Each protocol call first runs the View's `check` (raises when the sequence moved since the
View was made), so a stale View is refused instead of handed to a consumer. Every View holds
its owner (a Sequence or Context), and a capsule holds its View until the consumer's deleter
runs, so the context is not closed by garbage collection while a view lives (an explicit
close() still unmaps everything).

torch is imported lazily: numpy views need only numpy.
"""
import ctypes

import numpy as np

_TORCH_RAW = None       # torch dtype -> numpy dtype of the same itemsize (for bfloat16 etc.)

# ---- DLPack (dlpack.h, ABI of version 0.x: DLManagedTensor, capsule name "dltensor") --------
KDL_CPU, KDL_CUDA = 1, 2
_KDL_INT, _KDL_UINT, _KDL_FLOAT, _KDL_BFLOAT, _KDL_COMPLEX = 0, 1, 2, 4, 5


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


_DL_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)      # void (*)(DLManagedTensor *)
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", _DL_DELETER)]

# Capsules handed out and not yet deleted: DLManagedTensor address -> (the struct, its shape
# and strides arrays, the View). The consumer's deleter (or the capsule's destructor when no
# one consumed it) drops the entry, and with it the View and the context it holds.
_LIVE = {}


def _dl_delete(addr):
    _LIVE.pop(addr, None)


_dl_deleter = _DL_DELETER(_dl_delete)

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_capsule_ptr = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_ptr.restype = ctypes.c_void_p
_capsule_ptr.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_CAPSULE_DTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)    # the capsule as a bare pointer:
                                                           # it is being deallocated


def _capsule_destroy(cap):
    # A consumer renames the capsule "used_dltensor" and owns the tensor from then on; a
    # capsule still named "dltensor" was never consumed, so its tensor is ours to delete.
    if _capsule_valid(cap, b"dltensor"):
        _dl_delete(_capsule_ptr(cap, b"dltensor"))


_capsule_dtor = _CAPSULE_DTOR(_capsule_destroy)


def _dl_dtype(npdtype, tdtype):
    if tdtype is not None and str(tdtype) == "torch.bfloat16":
        return _KDL_BFLOAT, 16
    code = {"f": _KDL_FLOAT, "i": _KDL_INT, "u": _KDL_UINT, "c": _KDL_COMPLEX,
            "b": _KDL_UINT}.get(npdtype.kind)
    if code is None:
        raise TypeError("kvvm: dtype %s has no DLPack equivalent" % npdtype)
    return code, npdtype.itemsize * 8


def dlpack_capsule(view):
    """A "dltensor" capsule over view's range (the capsule keeps `view` alive)."""
    item = view.npdtype.itemsize
    if any(s % item for s in view.strides):
        raise ValueError("kvvm: strides %s are not multiples of the item size %d"
                         % (view.strides, item))
    nd = len(view.shape)
    shape = (ctypes.c_int64 * max(nd, 1))(*view.shape)
    strides = (ctypes.c_int64 * max(nd, 1))(*[s // item for s in view.strides])
    m = DLManagedTensor()
    t = m.dl_tensor
    t.data = view.addr
    t.device = DLDevice(KDL_CUDA if view.cuda else KDL_CPU, view.device if view.cuda else 0)
    t.ndim = nd
    code, bits = _dl_dtype(view.npdtype, view.tdtype)
    t.dtype = DLDataType(code, bits, 1)
    t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = 0
    m.deleter = _dl_deleter
    addr = ctypes.addressof(m)
    _LIVE[addr] = (m, shape, strides, view)
    return _capsule_new(addr, b"dltensor", ctypes.cast(_capsule_dtor, ctypes.c_void_p))


def capsule_tensor(cap):
    """The DLManagedTensor inside a capsule not yet consumed (for tests and checks)."""
    return DLManagedTensor.from_address(_capsule_ptr(ctypes.c_void_p(id(cap)), b"dltensor"))


class View:
    """The producer of one zero-copy view (see the module doc). Made by Sequence.view() and
    the tensor/array calls; consumers take it with torch.from_dlpack, numpy.from_dlpack,
    numpy.asarray (emulated device), cupy.asarray / cupy.from_dlpack (CUDA)."""
    __slots__ = ("owner", "addr", "shape", "strides", "npdtype", "tdtype", "cuda", "device",
                 "stream", "check", "on_consume", "__weakref__")

    def __init__(self, owner, addr, shape, strides, npdtype, tdtype=None, cuda=False,
                 device=0, stream=None, check=None, on_consume=None):
        self.owner = owner
        self.addr = int(addr)
        self.shape = tuple(int(s) for s in shape)
        self.strides = tuple(int(s) for s in strides)      # bytes
        self.npdtype = np.dtype(npdtype)
        self.tdtype = tdtype
        self.cuda = bool(cuda)
        self.device = int(device)
        self.stream = stream
        self.check = check              # raises when the view went stale
        self.on_consume = on_consume    # (consumer stream) -> orders it after our copies

    def _fresh(self):
        if self.check is not None:
            self.check()

    def _interface(self):
        self._fresh()
        d = {"shape": self.shape, "typestr": self.npdtype.str, "data": (self.addr, False),
             "strides": self.strides, "version": 3}
        if self.cuda:
            d["stream"] = self.stream
        return d

    @property
    def __array_interface__(self):
        if self.cuda:
            raise AttributeError("CUDA device memory has no __array_interface__")
        return self._interface()

    @property
    def __cuda_array_interface__(self):
        if not self.cuda:
            raise AttributeError("the emulated device's memory has no "
                                 "__cuda_array_interface__")
        return self._interface()

    def __dlpack_device__(self):
        return (KDL_CUDA, self.device) if self.cuda else (KDL_CPU, 0)

    def __dlpack__(self, stream=None):
        """A DLPack capsule. `stream` (CUDA): the consumer's stream, 1 = the legacy default
        stream, -1 = no ordering wanted; when it is not the engine stream it is made to wait
        for libkvvm's swap copies (Sequence.wait_stream)."""
        self._fresh()
        if (self.cuda and self.on_consume is not None and stream is not None and stream != -1
                and stream != self.stream):
            self.on_consume(stream)
        return dlpack_capsule(self)

    def __repr__(self):
        return "<kvvm.View %s %s at %#x on %s>" % (
            self.tdtype or self.npdtype, self.shape, self.addr,
            "cuda:%d" % self.device if self.cuda else "cpu")


def torch_module():
    try:
        import torch
    except ImportError as e:            # pragma: no cover - depends on the environment
        raise ImportError("kvvm: tensor views need PyTorch (python3-torch); numpy views "
                          "(Sequence.array, Context.region_array) work without it") from e
    return torch


def is_torch_dtype(dtype):
    t = type(dtype)
    return t.__module__ == "torch" and t.__name__ == "dtype"


def _torch_raw(torch, dtype):
    """(numpy dtype with the same bytes, needs a .view(dtype) afterwards)."""
    global _TORCH_RAW
    if _TORCH_RAW is None:
        m = {}
        for name, npd in (("float16", np.float16), ("float32", np.float32),
                          ("float64", np.float64), ("int8", np.int8), ("uint8", np.uint8),
                          ("int16", np.int16), ("int32", np.int32), ("int64", np.int64),
                          ("bool", np.bool_), ("complex64", np.complex64),
                          ("complex128", np.complex128)):
            if hasattr(torch, name):
                m[getattr(torch, name)] = (np.dtype(npd), False)
        _TORCH_RAW = m
    if dtype in _TORCH_RAW:
        return _TORCH_RAW[dtype]
    size = torch.empty((), dtype=dtype).element_size()
    raw = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}.get(size)
    if raw is None:
        raise TypeError("kvvm: dtype %s (%d bytes) has no raw equivalent" % (dtype, size))
    return np.dtype(raw), True


def element_info(dtype):
    """(itemsize, numpy dtype for the raw view, torch dtype or None, needs_view)."""
    if is_torch_dtype(dtype):
        torch = torch_module()
        raw, needs_view = _torch_raw(torch, dtype)
        return raw.itemsize, raw, dtype, needs_view
    d = np.dtype(dtype)
    return d.itemsize, d, None, False


def numpy_view(view):
    return np.asarray(view)


def torch_view(view):
    """A torch tensor over the View, through DLPack (CPU on the emulated device, CUDA on a
    GPU). A dtype DLPack (or this torch) lacks is imported as its raw integer type and
    reinterpreted with Tensor.view."""
    torch = torch_module()
    t = torch.utils.dlpack.from_dlpack(view)
    want = view.tdtype
    if want is None and view.npdtype.kind == "b":
        want = torch.bool                   # exported as kDLUInt 8 (DLPack < 0.8 has no bool)
    if want is not None and t.dtype != want:
        t = t.view(want)
    return t
