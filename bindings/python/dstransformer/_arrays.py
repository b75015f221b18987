"""How arrays cross into the library: NumPy arrays (host), ``__cuda_array_interface__`` and ``__dlpack__``
objects (device), raw integer addresses; and the two array types this package hands out."""

from __future__ import annotations

import ctypes
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from . import _native

__all__ = ["bf16_numpy_dtype", "numpy_dtype", "ArgInfo", "aligned_empty", "DeviceArray"]

try:  # optional: a real bfloat16 NumPy dtype
    import ml_dtypes as _ml_dtypes  # type: ignore

    _BF16 = np.dtype(_ml_dtypes.bfloat16)
except Exception:  # pragma: no cover - depends on the environment
    _ml_dtypes = None
    _BF16 = None

DT_FP32 = _native.DST_DTYPE_FP32
DT_FP16 = _native.DST_DTYPE_FP16
DT_BF16 = _native.DST_DTYPE_BF16
DT_FP64 = _native.DST_DTYPE_FP64
DT_INT32 = _native.DST_DTYPE_INT32
_DT_NAME = {DT_FP32: "fp32", DT_FP16: "fp16", DT_BF16: "bf16", DT_FP64: "fp64", DT_INT32: "int32"}
_ITEMSIZE = {DT_FP32: 4, DT_FP16: 2, DT_BF16: 2, DT_FP64: 8, DT_INT32: 4}


def bf16_numpy_dtype() -> np.dtype:
    """The NumPy dtype used for bf16 results: ``ml_dtypes.bfloat16`` when that package is installed,
    else ``uint16`` holding the raw bfloat16 bits (the upper half of the float32 pattern)."""
    return _BF16 if _BF16 is not None else np.dtype(np.uint16)


def numpy_dtype(code: int) -> np.dtype:
    """NumPy dtype of a ``dst_dtype``."""
    if code == DT_FP32:
        return np.dtype(np.float32)
    if code == DT_FP16:
        return np.dtype(np.float16)
    if code == DT_FP64:
        return np.dtype(np.float64)
    if code == DT_BF16:
        return bf16_numpy_dtype()
    if code == DT_INT32:
        return np.dtype(np.int32)
    raise ValueError(f"no NumPy dtype for dst_dtype {code}")


def dtype_of_numpy(dt: np.dtype) -> Optional[int]:
    """``dst_dtype`` of a NumPy dtype; uint16 and ml_dtypes' bfloat16 mean bf16; None when unsupported."""
    dt = np.dtype(dt)
    if dt == np.float32:
        return DT_FP32
    if dt == np.float16:
        return DT_FP16
    if dt == np.float64:
        return DT_FP64
    if dt == np.int32:
        return DT_INT32
    if dt == np.uint16 or dt.name == "bfloat16":
        return DT_BF16
    return None


def dtype_label(code: Optional[int]) -> str:
    return _DT_NAME.get(code, "unsupported") if code is not None else "unsupported"


# typestr (array interface) -> dst_dtype
_TYPESTR = {"<f4": DT_FP32, "<f2": DT_FP16, "<f8": DT_FP64, "<i4": DT_INT32, "<u2": DT_BF16,
            "=f4": DT_FP32, "=f2": DT_FP16, "=f8": DT_FP64, "=i4": DT_INT32, "=u2": DT_BF16,
            "|V2": DT_BF16}
_TYPESTR_OF = {DT_FP32: "<f4", DT_FP16: "<f2", DT_FP64: "<f8", DT_INT32: "<i4", DT_BF16: "<u2"}


class ArgInfo:
    """An array argument reduced to what the C API takes: address, dtype, shape, where it lives."""

    __slots__ = ("ptr", "dtype", "shape", "device", "keep", "array")

    def __init__(self, ptr: int, dtype: Optional[int], shape: Tuple[int, ...], device: str,
                 keep: Any = None, array: Any = None):
        self.ptr = int(ptr)
        self.dtype = dtype
        self.shape = tuple(int(s) for s in shape)
        self.device = device  # "cpu" or "cuda:<n>"
        self.keep = keep  # objects that must live until the call returns
        self.array = array  # the (possibly converted) host array


def _contiguous_strides(shape: Sequence[int], itemsize: int) -> Tuple[int, ...]:
    strides = []
    acc = itemsize
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))


def _is_c_contiguous(shape, strides, itemsize) -> bool:
    if strides is None:
        return True
    for s, st, want in zip(shape, strides, _contiguous_strides(shape, itemsize)):
        if s > 1 and st != want:
            return False
    return True


# ---- DLPack -------------------------------------------------------------------------------------
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_PyCapsule_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
_PyCapsule_GetPointer.restype = ctypes.c_void_p
_PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
# (code, bits) -> dst_dtype; DLPack codes: 0 int, 1 uint, 2 float, 4 bfloat
_DL_DTYPES = {(2, 32): DT_FP32, (2, 16): DT_FP16, (2, 64): DT_FP64, (0, 32): DT_INT32, (4, 16): DT_BF16}


def _from_dlpack(obj: Any, name: str, stream: Optional[int]) -> ArgInfo:
    # A stream is meaningful for device memory only; host producers (NumPy) refuse one.
    on_host = False
    if hasattr(obj, "__dlpack_device__"):
        on_host = obj.__dlpack_device__()[0] in (_DL_CPU, _DL_CUDA_HOST)
    try:
        capsule = obj.__dlpack__(stream=stream) if stream and not on_host else obj.__dlpack__()
    except (TypeError, ValueError, RuntimeError, BufferError):
        capsule = obj.__dlpack__()
    ptr = _PyCapsule_GetPointer(capsule, b"dltensor")
    if not ptr:
        raise TypeError(f"{name}: __dlpack__ did not return a 'dltensor' capsule")
    t = _DLTensor.from_address(ptr)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else None
    if t.dtype.lanes != 1:
        raise TypeError(f"{name}: vector dtypes (lanes={t.dtype.lanes}) are not supported")
    code = _DL_DTYPES.get((t.dtype.code, t.dtype.bits))
    itemsize = t.dtype.bits // 8
    if strides is not None and not _is_c_contiguous(shape, tuple(s * itemsize for s in strides), itemsize):
        raise ValueError(f"{name}: expected a C-contiguous array (strides {strides} for shape {shape})")
    dev_type = t.device.device_type
    if dev_type in (_DL_CUDA, _DL_CUDA_MANAGED):
        device = f"cuda:{t.device.device_id}"
    elif dev_type in (_DL_CPU, _DL_CUDA_HOST):
        device = "cpu"
    else:
        device = f"dlpack-device-{dev_type}"
    addr = (t.data or 0) + int(t.byte_offset)
    return ArgInfo(addr, code, shape, device, keep=(obj, capsule))


def _from_cai(obj: Any, name: str, iface: dict) -> ArgInfo:
    shape = tuple(int(s) for s in iface["shape"])
    typestr = iface["typestr"]
    code = _TYPESTR.get(typestr)
    itemsize = int(typestr[2:]) if typestr[2:].isdigit() else 0
    if not _is_c_contiguous(shape, iface.get("strides"), itemsize):
        raise ValueError(f"{name}: expected a C-contiguous device array (strides {iface.get('strides')})")
    addr = int(iface["data"][0] or 0)
    device = "cuda:?"
    dev = getattr(obj, "device", None)
    if dev is not None:
        idx = getattr(dev, "index", None)
        if idx is None:
            idx = getattr(dev, "id", None)
        if isinstance(idx, int):
            device = f"cuda:{idx}"
    return ArgInfo(addr, code, shape, device, keep=obj)


def describe(obj: Any, name: str, on_device: bool, stream: Optional[int] = None,
             writable: bool = False) -> ArgInfo:
    """Reduces an array argument to an :class:`ArgInfo`.

    Host contexts take NumPy arrays (or anything ``np.asarray`` accepts without a dtype change; a
    non-contiguous input is copied, an output must be C-contiguous and writable). Device contexts take
    ``__cuda_array_interface__`` or ``__dlpack__`` objects, which must be C-contiguous (no copy is made).
    """
    if on_device:
        iface = None
        if hasattr(obj, "__cuda_array_interface__"):
            try:
                iface = obj.__cuda_array_interface__
            except (TypeError, RuntimeError, AttributeError):
                iface = None  # e.g. torch bfloat16 or a tensor that requires grad: try DLPack
        # A typestr the interface cannot express exactly (torch gives bfloat16 as a 2-byte void, "<V2")
        # is read through DLPack, which names bfloat16.
        if iface is not None and (iface.get("typestr") in _TYPESTR or not hasattr(obj, "__dlpack__")):
            return _from_cai(obj, name, iface)
        if isinstance(obj, np.ndarray):
            raise TypeError(f"{name}: a NumPy (host) array was passed to a CUDA context; pass a device array "
                            "(torch/cupy, anything with __cuda_array_interface__ or __dlpack__)")
        if hasattr(obj, "__dlpack__"):
            info = _from_dlpack(obj, name, stream)
            if info.device == "cpu":
                raise TypeError(f"{name}: a host array was passed to a CUDA context; move it to the device")
            return info
        raise TypeError(f"{name}: expected a device array with __cuda_array_interface__ or __dlpack__, "
                        f"got {type(obj).__name__}")
    # host
    if hasattr(obj, "__cuda_array_interface__") and not isinstance(obj, np.ndarray):
        raise TypeError(f"{name}: a device array was passed to a CPU context; pass a NumPy array")
    if isinstance(obj, np.ndarray):
        arr = obj
    else:
        try:
            arr = np.asarray(obj)
        except Exception as e:  # noqa: BLE001
            raise TypeError(f"{name}: expected a NumPy array, got {type(obj).__name__}") from e
    code = dtype_of_numpy(arr.dtype)
    if not arr.flags.c_contiguous:
        if writable:
            raise ValueError(f"{name}: expected a C-contiguous array")
        arr = np.ascontiguousarray(arr)
    if writable and not arr.flags.writeable:
        raise ValueError(f"{name}: the array is read-only")
    ptr = arr.__array_interface__["data"][0] if arr.size else 0
    return ArgInfo(ptr, code, arr.shape, "cpu", keep=arr, array=arr)


def aligned_empty(nbytes: int, alignment: int = 256, dtype: Any = np.uint8) -> np.ndarray:
    """An uninitialised NumPy array of ``nbytes`` bytes (viewed as ``dtype``) whose data is aligned to
    ``alignment`` bytes, as :meth:`Layer.bind_param_arena` and ``Context.set_workspace`` require."""
    dtype = np.dtype(dtype)
    if nbytes % dtype.itemsize:
        raise ValueError(f"nbytes {nbytes} is not a multiple of the item size {dtype.itemsize}")
    raw = np.empty(int(nbytes) + alignment, dtype=np.uint8)
    start = (-raw.__array_interface__["data"][0]) % alignment
    return raw[start:start + int(nbytes)].view(dtype)


class _HostView:
    """Gives NumPy a non-owning view of library memory while keeping its owner alive."""

    def __init__(self, owner: Any, ptr: int, shape: Tuple[int, ...], typestr: str, readonly: bool = False):
        self._owner = owner
        self.__array_interface__ = {
            "shape": tuple(shape),
            "typestr": typestr,
            "data": (int(ptr), readonly),
            "strides": None,
            "version": 3,
        }


def host_view(owner: Any, ptr: int, shape: Tuple[int, ...], code: int) -> np.ndarray:
    """A NumPy array viewing ``ptr`` (host memory owned by ``owner``, which the array keeps alive)."""
    arr = np.asarray(_HostView(owner, ptr, shape, _TYPESTR_OF[code]))
    if code == DT_BF16 and _BF16 is not None:
        arr = arr.view(_BF16)
    return arr


class DeviceArray:
    """A C-contiguous array in a context's device memory, exposing ``__cuda_array_interface__``
    (so ``torch.as_tensor(a, device="cuda")`` and ``cupy.asarray(a)`` view it without a copy).

    Returned by :meth:`Layer.forward`/``backward`` on a CUDA context when the input is neither a torch
    nor a cupy array (``owner`` is None: the memory comes from ``dst_malloc`` and is freed with the
    object), and by ``Layer.param_view``/``grad_view`` on a CUDA context (``owner`` is the layer: the
    memory is the layer's arena, valid while the layer lives and keeps that arena).
    """

    def __init__(self, context: Any, shape: Sequence[int], dtype: int, ptr: Optional[int] = None,
                 owner: Any = None):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self._context = context
        self._owner = owner
        self._owned = ptr is None
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * _ITEMSIZE[dtype]
        self.ptr = 0
        if ptr is None:
            self.ptr = int(context._malloc(self.nbytes)) if self.nbytes else 0
        else:
            self.ptr = int(ptr)

    @property
    def dtype_name(self) -> str:
        return _DT_NAME[self.dtype]

    @property
    def __cuda_array_interface__(self) -> dict:
        return {
            "shape": self.shape,
            "typestr": _TYPESTR_OF[self.dtype],
            "data": (self.ptr, False),
            "strides": None,
            "version": 2,
        }

    def to_numpy(self) -> np.ndarray:
        """A host copy (bf16 as :func:`bf16_numpy_dtype`)."""
        out = np.empty(self.shape, dtype=numpy_dtype(self.dtype))
        if self.nbytes:
            self._context.memcpy(out.__array_interface__["data"][0], self.ptr, self.nbytes, "to_host")
        return out

    def copy_from_numpy(self, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr)
        if arr.nbytes != self.nbytes:
            raise ValueError(f"copy_from_numpy: {arr.nbytes} bytes given, the array holds {self.nbytes}")
        if self.nbytes:
            self._context.memcpy(self.ptr, arr.__array_interface__["data"][0], self.nbytes, "to_context")

    def free(self) -> None:
        if self._owned and self.ptr:
            ptr, self.ptr = self.ptr, 0
            self._context._free(ptr)

    def __del__(self):
        try:
            self.free()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype_name}, ptr=0x{self.ptr:x})"
