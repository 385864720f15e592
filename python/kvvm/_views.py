"""Zero-copy views of device windows as numpy arrays and torch tensors.

A view is built over an address range with explicit strides, never a copy:
  - emulated device: the window is host memory of this process, so the view is a CPU array
    made from an object exposing __array_interface__ (numpy), and torch.from_numpy of it;
  - CUDA: an object exposing __cuda_array_interface__ (version 3, with the engine stream),
    consumed by torch.as_tensor(..., device="cuda:N").
Every view object holds a reference to its Context, so the context is not closed by
garbage collection while a view lives (an explicit close() still unmaps everything).

torch is imported lazily: numpy views need only numpy.
"""
import numpy as np

_TORCH_RAW = None       # torch dtype -> numpy dtype of the same itemsize (for bfloat16 etc.)


class _Window:
    """Holds the address range; numpy/torch read the interface dict from it."""
    __slots__ = ("__array_interface__", "__cuda_array_interface__", "owner")

    def __init__(self, owner, addr, shape, strides, typestr, cuda=False, stream=None):
        self.owner = owner
        d = {"shape": tuple(int(s) for s in shape), "typestr": typestr,
             "data": (int(addr), False), "strides": tuple(int(s) for s in strides),
             "version": 3}
        if cuda:
            d["stream"] = stream
            self.__cuda_array_interface__ = d
        else:
            self.__array_interface__ = d


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


def numpy_view(owner, addr, shape, strides, npdtype):
    return np.asarray(_Window(owner, addr, shape, strides, npdtype.str))


def torch_cpu_view(owner, addr, shape, strides, npdtype, tdtype, needs_view):
    torch = torch_module()
    t = torch.from_numpy(numpy_view(owner, addr, shape, strides, npdtype))
    return t.view(tdtype) if needs_view else t


def torch_cuda_view(owner, addr, shape, strides, npdtype, tdtype, needs_view, device, stream):
    """A CUDA tensor over device memory (not runnable without a GPU: see docs/python.md)."""
    torch = torch_module()
    w = _Window(owner, addr, shape, strides, npdtype.str, cuda=True, stream=stream)
    t = torch.as_tensor(w, device=torch.device("cuda", device))
    return t.view(tdtype) if needs_view else t
