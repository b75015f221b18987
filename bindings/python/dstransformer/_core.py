"""Context, Layer, SavedActivations, Mask and the checkpoint functions."""

from __future__ import annotations

import os
from collections import namedtuple
from typing import Any, Dict, Iterable, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native
from ._arrays import (
    DT_FP32,
    DT_INT32,
    ArgInfo,
    DeviceArray,
    describe,
    dtype_label,
    host_view,
    numpy_dtype,
)
from ._config import BACKENDS, LayerConfig, backend_code, dtype_code, dtype_name

__all__ = [
    "Context",
    "Layer",
    "SavedActivations",
    "Mask",
    "ParamInfo",
    "PARAM_NAMES",
    "save_checkpoint",
    "load_checkpoint",
    "convert",
    "cuda_device_count",
]

#: The 12 parameters in DeepSpeed's order (the arena order).
PARAM_NAMES = (
    "attn_qkvw", "attn_qkvb", "attn_ow", "attn_ob", "attn_nw", "attn_nb",
    "inter_w", "inter_b", "output_w", "output_b", "norm_w", "norm_b",
)

#: Shape and arena position of one parameter (its gradient uses the same layout).
ParamInfo = namedtuple("ParamInfo", ["name", "index", "shape", "numel", "offset_bytes", "size_bytes"])

_BACKEND_NAMES = {v: k for k, v in BACKENDS.items()}
_COPY_KINDS = {
    "to_context": _native.DST_COPY_HOST_TO_CONTEXT,
    "to_host": _native.DST_COPY_CONTEXT_TO_HOST,
    "within": _native.DST_COPY_CONTEXT_TO_CONTEXT,
}
_LAYOUTS = {
    "deepspeed": _native.DST_LAYOUT_DEEPSPEED,
    "hf_bert": _native.DST_LAYOUT_HF_BERT,
    "hf": _native.DST_LAYOUT_HF_BERT,
    "huggingface": _native.DST_LAYOUT_HF_BERT,
}


def cuda_device_count() -> int:
    """Number of CUDA devices this build of the library can use (0 without CUDA support or GPU)."""
    return int(_native.dst_cuda_device_count())


def _stream_int(stream: Any) -> int:
    if stream is None:
        return 0
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    for attr in ("cuda_stream", "ptr", "handle"):  # torch.cuda.Stream, cupy Stream, others
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    raise TypeError(f"stream must be an int (cudaStream_t address), None or a stream object, got "
                    f"{type(stream).__name__}")


def _ptr_or_array(mem: Any, name: str, on_device: bool) -> Tuple[int, Optional[int]]:
    """(address, nbytes or None) of an int address or an array object."""
    if isinstance(mem, int) and not isinstance(mem, bool):
        return mem, None
    info = describe(mem, name, on_device=on_device, writable=True)
    itemsize = info.array.itemsize if info.array is not None else _itemsize_of(info)
    n = int(np.prod(info.shape, dtype=np.int64)) * itemsize
    return info.ptr, n


def _itemsize_of(info: ArgInfo) -> int:
    if info.dtype is None:
        raise TypeError("unsupported device array dtype for a raw memory argument")
    return int(_native.dst_dtype_size(info.dtype))


class _Owned:
    """Context-manager protocol and GC safety net of the classes that own a native handle: ``with``
    and the garbage collector both end in :meth:`close` (which must be idempotent)."""

    def close(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


def _alloc_like(context: "Context", like: Any, shape: Sequence[int], code: int) -> Any:
    """An uninitialised output of dtype ``code`` where ``like`` lives: NumPy on a CPU context; on a CUDA
    context a torch tensor or CuPy array when ``like`` is one (same device), else a DeviceArray."""
    if not context.is_cuda:
        return np.empty(tuple(shape), dtype=numpy_dtype(code))
    mod = type(like).__module__.split(".")[0]
    if mod == "torch":
        import torch  # already imported by the caller

        tdt = {_native.DST_DTYPE_FP32: torch.float32, _native.DST_DTYPE_FP64: torch.float64,
               _native.DST_DTYPE_FP16: torch.float16, _native.DST_DTYPE_BF16: torch.bfloat16}[code]
        return torch.empty(tuple(shape), dtype=tdt, device=like.device)
    if mod == "cupy":
        import cupy  # type: ignore

        return cupy.empty(tuple(shape), dtype=numpy_dtype(code))
    return DeviceArray(context, shape, code)


def _native_tensor(info: ArgInfo, name: str):
    """The dst_tensor view of an array argument (1 to 4 dimensions)."""
    if info.dtype is None:
        raise TypeError(f"{name}: unsupported dtype")
    if not 1 <= len(info.shape) <= _native.DST_MAX_DIMS:
        raise ValueError(f"{name}: shape is {info.shape}, expected 1 to {_native.DST_MAX_DIMS} dimensions")
    return _native.dst_tensor(info.ptr or None, info.dtype, len(info.shape), *info.shape)


class Context(_Owned):
    """A compute context: a backend and device, its random-number state, thread count and stream.

    ``Context(backend="auto"|"cpu"|"cuda", device=0)``. Use it as a context manager or call
    :meth:`close`; the garbage collector also frees it. Layers keep the underlying C context alive, so a
    context may be closed while its layers are still used.
    """

    #: ``cudaStreamLegacy``: the handle of the legacy default stream (torch's default stream). Passing
    #: None or 0 to :meth:`set_stream` selects the context's own stream instead, which is non-blocking.
    LEGACY_DEFAULT_STREAM = 1

    def __init__(self, backend: Union[str, int] = "auto", device: int = 0):
        self._handle = None
        self._workspace = None
        self._live_allocs = 0
        self._close_pending = False
        self._handle = _native.dst_context_create(backend_code(backend), int(device))
        self._device = int(device)
        self._backend = _BACKEND_NAMES[int(_native.dst_context_get_backend(self._handle))]

    # ---- lifetime ---------------------------------------------------------------------------------
    @property
    def handle(self):
        """The raw ``dst_context *`` (for :mod:`dstransformer._native`)."""
        if self._handle is None:
            raise ValueError("Context is closed")
        return self._handle

    @property
    def closed(self) -> bool:
        return self._handle is None or self._close_pending

    def close(self) -> None:
        """Releases the context (idempotent). Memory from :class:`DeviceArray` results keeps the C
        context until it is freed."""
        if self._handle is None:
            return
        if self._live_allocs > 0:
            self._close_pending = True
            return
        h, self._handle = self._handle, None
        self._workspace = None
        _native.dst_context_destroy(h)

    def __del__(self):
        try:
            if self._handle is not None:
                self._live_allocs = 0
                self.close()
        except Exception:  # noqa: BLE001
            pass

    def __repr__(self) -> str:
        state = "closed" if self._handle is None else f"{self._backend}:{self._device}"
        return f"Context({state})"

    # ---- properties -----------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        """"cpu" or "cuda" ("auto" resolved)."""
        return self._backend

    @property
    def device(self) -> int:
        return self._device

    @property
    def is_cuda(self) -> bool:
        return self._backend == "cuda"

    @property
    def rng_state(self) -> Tuple[int, int]:
        """The dropout RNG state (seed, offset); assign a (seed, offset) pair to set it."""
        seed, offset = _native.dst_context_get_rng_state(self.handle)
        return int(seed), int(offset)

    @rng_state.setter
    def rng_state(self, value: Tuple[int, int]) -> None:
        seed, offset = value
        self.set_rng_state(seed, offset)

    def set_rng_state(self, seed: int, offset: int = 0) -> None:
        _native.dst_context_set_rng_state(self.handle, int(seed) & ((1 << 64) - 1), int(offset))

    @property
    def rng_graph_counter(self) -> int:
        """The graph dropout counter: the word the next training forward run from a CUDA graph takes
        (docs/rng.md); reading it waits for the context's stream. Assign an int in 0 ... 2**32 - 1 to set it."""
        return int(_native.dst_context_get_rng_graph_counter(self.handle))

    @rng_graph_counter.setter
    def rng_graph_counter(self, value: int) -> None:
        _native.dst_context_set_rng_graph_counter(self.handle, int(value))

    @property
    def num_threads(self) -> int:
        """Host threads of the CPU backend; assign 0 for the default (all cores)."""
        return int(_native.dst_context_get_num_threads(self.handle))

    @num_threads.setter
    def num_threads(self, n: int) -> None:
        _native.dst_context_set_num_threads(self.handle, int(n))

    _INDEX_CHECKS = {"eager": _native.DST_INDEX_CHECKS_EAGER, "deferred": _native.DST_INDEX_CHECKS_DEFERRED}

    @property
    def index_checks(self) -> str:
        """When the model ops check their index values: "eager" (before the call returns; the
        default) or "deferred" (on the device without waiting; a later call reports a failure).
        See ``dst_context_set_index_checks``."""
        mode = int(_native.dst_context_get_index_checks(self.handle))
        return next(k for k, v in self._INDEX_CHECKS.items() if v == mode)

    @index_checks.setter
    def index_checks(self, mode: str) -> None:
        if mode not in self._INDEX_CHECKS:
            raise ValueError(f"index_checks is {mode!r}, expected 'eager' or 'deferred'")
        _native.dst_context_set_index_checks(self.handle, self._INDEX_CHECKS[mode])

    def set_stream(self, stream: Any) -> None:
        """Runs the context's work on a CUDA stream: an int ``cudaStream_t`` address (e.g.
        ``torch.cuda.current_stream().cuda_stream``), a stream object with ``cuda_stream``/``ptr``, or
        None/0 for the context's own (non-blocking) stream. The legacy default stream, whose handle is 0
        in torch and cupy, is :attr:`LEGACY_DEFAULT_STREAM`. The caller keeps the stream alive."""
        _native.dst_context_set_stream(self.handle, _stream_int(stream) or None)

    @property
    def stream(self) -> int:
        """The current ``cudaStream_t`` as an int (0 on a CPU context)."""
        return int(_native.dst_context_get_stream(self.handle) or 0)

    def synchronize(self) -> None:
        _native.dst_context_synchronize(self.handle)

    @property
    def workspace_bytes(self) -> int:
        return int(_native.dst_context_workspace_bytes(self.handle))

    def set_workspace(self, memory: Any, nbytes: Optional[int] = None) -> None:
        """Gives the context caller memory for its activation workspace (256-byte aligned): an array
        (kept alive by the context; see :func:`aligned_empty`) or an int address with ``nbytes``.
        None returns to an owned workspace."""
        if memory is None:
            _native.dst_context_set_workspace(self.handle, None, 0)
            self._workspace = None
            return
        ptr, n = _ptr_or_array(memory, "memory", self.is_cuda)
        if nbytes is None:
            if n is None:
                raise TypeError("set_workspace: nbytes is required with an integer address")
            nbytes = n
        _native.dst_context_set_workspace(self.handle, ptr, int(nbytes))
        self._workspace = memory

    # ---- raw memory -----------------------------------------------------------------------------
    def _malloc(self, nbytes: int) -> int:
        ptr = int(_native.dst_malloc(self.handle, int(nbytes)) or 0)
        if ptr:
            self._live_allocs += 1
        return ptr

    def _free(self, ptr: int) -> None:
        if not ptr:
            return
        if self._handle is not None:
            _native.dst_free(self._handle, ptr)
            self._live_allocs -= 1
            if self._close_pending and self._live_allocs == 0:
                self._close_pending = False
                self.close()

    def empty(self, shape: Sequence[int], dtype: Any = "fp32") -> Any:
        """An uninitialised array in the context's memory space: a NumPy array on a CPU context, a
        :class:`DeviceArray` (freed with the object) on a CUDA context."""
        code = DT_INT32 if str(dtype) == "int32" else dtype_code(dtype)
        if not self.is_cuda:
            return np.empty(tuple(shape), dtype=numpy_dtype(code))
        return DeviceArray(self, shape, code)

    def to_context(self, arr: np.ndarray, dtype: Any = None) -> Any:
        """Copies a host array into the context's memory space (identity on a CPU context)."""
        arr = np.ascontiguousarray(arr)
        if not self.is_cuda:
            return arr
        from ._arrays import dtype_of_numpy

        code = dtype_of_numpy(arr.dtype) if dtype is None else dtype_code(dtype)
        if code is None:
            raise TypeError(f"to_context: unsupported dtype {arr.dtype}")
        out = DeviceArray(self, arr.shape, code)
        out.copy_from_numpy(arr)
        return out

    def memcpy(self, dst: int, src: int, nbytes: int, kind: str = "within") -> None:
        """``dst_memcpy`` with integer addresses; kind is "to_context", "to_host" or "within"."""
        if kind not in _COPY_KINDS:
            raise ValueError(f"memcpy: kind must be one of {sorted(_COPY_KINDS)}, got {kind!r}")
        _native.dst_memcpy(self.handle, int(dst) or None, int(src) or None, int(nbytes), _COPY_KINDS[kind])

    # ---- the standalone LayerNorm (the final LN of a Pre-LN stack) -------------------------------
    def _arg(self, obj: Any, name: str, keep: list, writable: bool = False):
        info = describe(obj, name, self.is_cuda, self.stream if self.is_cuda else None, writable=writable)
        keep.append(info.keep)
        return info, _native_tensor(info, name)

    def layernorm_forward(self, x: Any, gamma: Any, beta: Any, eps: float = 1e-12, out: Any = None,
                          stats: Any = None, training: bool = True):
        """``y = gamma * (x - mean) / sqrt(var + eps) + beta`` over the last dimension of ``x`` (1 to 4
        dimensions; fp32, fp16, bf16 or fp64; gamma and beta [H] in its dtype), ``dst_layernorm_forward``.

        Returns ``(y, stats)``: ``stats`` [2, N] (N = the number of rows; fp32, fp64 for fp64 data) holds
        the row means and inverse deviations that :meth:`layernorm_backward` needs; it is None when
        ``training`` is False. ``out`` and ``stats`` may be given, preallocated; outputs are allocated
        where ``x`` lives (NumPy, torch, CuPy or :class:`DeviceArray`)."""
        keep: list = []
        xi, tx = self._arg(x, "x", keep)
        _, tg = self._arg(gamma, "gamma", keep)
        _, tb = self._arg(beta, "beta", keep)
        if out is None:
            out = _alloc_like(self, x, xi.shape, xi.dtype)
        _, ty = self._arg(out, "out", keep, writable=True)
        ts = None
        if training:
            if stats is None:
                rows = int(np.prod(xi.shape[:-1], dtype=np.int64))
                sdt = _native.DST_DTYPE_FP64 if xi.dtype == _native.DST_DTYPE_FP64 else _native.DST_DTYPE_FP32
                stats = _alloc_like(self, x, (2, rows), sdt)
            _, ts = self._arg(stats, "stats", keep, writable=True)
        _native.dst_layernorm_forward(self.handle, tx, tg, tb, float(eps), ty, ts)
        return out, (stats if training else None)

    def layernorm_backward(self, dy: Any, x: Any, gamma: Any, beta: Any, stats: Any, dx: Any = None,
                           dgamma: Any = None, dbeta: Any = None, accumulate: bool = False):
        """Gradients of :meth:`layernorm_forward` from its ``stats`` (``dst_layernorm_backward``): returns
        ``(dx, dgamma, dbeta)``. ``dx`` is written; ``dgamma``/``dbeta`` are overwritten, or added to
        with ``accumulate=True`` (then they must be given)."""
        if accumulate and (dgamma is None or dbeta is None):
            raise ValueError("layernorm_backward: accumulate=True adds to dgamma and dbeta, so pass both")
        keep: list = []
        dyi, tdy = self._arg(dy, "dy", keep)
        _, tx = self._arg(x, "x", keep)
        gi, tg = self._arg(gamma, "gamma", keep)
        _, tb = self._arg(beta, "beta", keep)
        _, ts = self._arg(stats, "stats", keep)
        if dx is None:
            dx = _alloc_like(self, dy, dyi.shape, dyi.dtype)
        if dgamma is None:
            dgamma = _alloc_like(self, gamma, gi.shape, gi.dtype)
        if dbeta is None:
            dbeta = _alloc_like(self, gamma, gi.shape, gi.dtype)
        _, tdx = self._arg(dx, "dx", keep, writable=True)
        _, tdg = self._arg(dgamma, "dgamma", keep, writable=True)
        _, tdb = self._arg(dbeta, "dbeta", keep, writable=True)
        mode = _native.DST_GRAD_ACCUMULATE if accumulate else _native.DST_GRAD_WRITE
        _native.dst_layernorm_backward(self.handle, tdy, tx, tg, tb, ts, tdx, tdg, tdb, mode)
        return dx, dgamma, dbeta


class Mask:
    """An attention mask: ``Mask.additive(arr)`` ([B, S] or [B, 1, 1, S], fp32 or the layer dtype,
    added to the scores), ``Mask.lengths(arr)`` (int32 [B]: keys j ≥ len[b] are masked), ``Mask.none()``."""

    __slots__ = ("kind", "array")

    NONE = "none"
    ADDITIVE = "additive"
    LENGTHS = "lengths"

    def __init__(self, kind: str, array: Any = None):
        if kind not in (self.NONE, self.ADDITIVE, self.LENGTHS):
            raise ValueError(f"Mask kind must be 'none', 'additive' or 'lengths', got {kind!r}")
        self.kind = kind
        self.array = array

    @classmethod
    def none(cls) -> "Mask":
        return cls(cls.NONE)

    @classmethod
    def additive(cls, array: Any) -> "Mask":
        return cls(cls.ADDITIVE, array)

    @classmethod
    def lengths(cls, array: Any) -> "Mask":
        if isinstance(array, (list, tuple)):
            array = np.asarray(array, dtype=np.int32)
        return cls(cls.LENGTHS, array)

    def __repr__(self) -> str:
        return f"Mask.{self.kind}({'' if self.array is None else type(self.array).__name__})"


def native_mask(kind: int, ptr: int, dtype: int, shape: Sequence[int]):
    """A raw ``dst_mask`` of a kind (DST_MASK_*) over memory at ``ptr``."""
    m = _native.dst_mask()
    m.kind = kind
    if kind != _native.DST_MASK_NONE:
        dims = [int(s) for s in shape] + [1] * (4 - len(shape))
        m.tensor = _native.dst_tensor(int(ptr), int(dtype), len(shape), *dims)
    return m


class SavedActivations(_Owned):
    """Holds what one training forward keeps for its backward (``dst_saved``); keep one per micro-batch
    to have several forwards in flight. Freed by :meth:`close`, a ``with`` block, the garbage
    collector, or when its layer is closed."""

    def __init__(self, layer: "Layer"):
        self._layer = layer
        self._cell = [None]
        self._cell[0] = _native.dst_saved_create(layer.handle)
        layer._saved_cells.append(self._cell)

    @property
    def handle(self):
        h = self._cell[0]
        if h is None:
            raise ValueError("SavedActivations is closed (or its layer was closed)")
        return h

    @property
    def layer(self) -> "Layer":
        return self._layer

    @property
    def nbytes(self) -> int:
        """Bytes of activations currently held (0 when empty)."""
        return int(_native.dst_saved_bytes(self.handle))

    def release(self) -> None:
        """Frees the held memory; a new training forward must fill it before a backward."""
        _native.dst_saved_release(self.handle)

    def close(self) -> None:
        h, self._cell[0] = self._cell[0], None
        if h is not None:
            _native.dst_saved_destroy(h)
            try:
                self._layer._saved_cells.remove(self._cell)
            except ValueError:
                pass



class Layer(_Owned):
    """One fused Transformer layer (``dst_layer``) in a :class:`Context`.

    ``Layer(context, config)`` where ``config`` is a :class:`LayerConfig` (or a dict of its fields).
    Arrays: on a CPU context, NumPy arrays (fp16 as ``float16``; bf16 as ``uint16`` raw bits or
    ``ml_dtypes.bfloat16``); on a CUDA context, objects with ``__cuda_array_interface__`` or
    ``__dlpack__`` (torch, cupy), used in place. Copies vs views: ``param``/``grad``/``params``/``grads``
    return host copies (any context); ``param_view``/``grad_view`` return views of the arenas (NumPy on a
    CPU context, :class:`DeviceArray` on CUDA) that are valid while the layer lives and keeps that arena
    (binding another arena or closing the layer invalidates them).
    """

    def __init__(self, context: Context, config: Union[LayerConfig, Dict[str, Any], None] = None,
                 seed_offset: int = 0, **kwargs: Any):
        self._handle = None
        self._saved_cells = []
        self._param_mem = None
        self._grad_mem = None
        if not isinstance(context, Context):
            raise TypeError(f"context must be a dstransformer.Context, got {type(context).__name__}")
        if config is None:
            config = LayerConfig(**kwargs)
        elif isinstance(config, dict):
            config = LayerConfig.from_dict({**config, **kwargs})
        elif kwargs:
            raise TypeError("pass either a LayerConfig or keyword arguments, not both")
        if not isinstance(config, LayerConfig):
            raise TypeError(f"config must be a LayerConfig or a dict, got {type(config).__name__}")
        self._context = context
        native_cfg = config.to_native(seed_offset=seed_offset)
        self._handle = _native.dst_layer_create(context.handle, native_cfg)
        got = _native.dst_layer_config()
        _native.dst_layer_config_default(got)
        _native.dst_layer_get_config(self._handle, got)
        self._native_config = got
        self._config = LayerConfig.from_native(got, base=config)
        self._dtype = int(got.dtype)
        self._H = int(got.hidden_size)
        self._on_device = context.is_cuda
        self._infos = {}
        for i, name in enumerate(PARAM_NAMES):
            info = _native.dst_param_info()
            _native.dst_layer_param_info(self._handle, i, info)
            shape = tuple(int(info.getDim(d)) for d in range(int(info.ndim)))
            self._infos[name] = ParamInfo(str(info.name), i, shape, int(info.numel), int(info.offset_bytes),
                                          int(info.size_bytes))

    # ---- lifetime ---------------------------------------------------------------------------------
    @property
    def handle(self):
        """The raw ``dst_layer *``."""
        if self._handle is None:
            raise ValueError("Layer is closed")
        return self._handle

    @property
    def closed(self) -> bool:
        return self._handle is None

    def close(self) -> None:
        """Destroys the layer (idempotent) and every SavedActivations still open for it. Views returned
        by param_view/grad_view become invalid."""
        if self._handle is None:
            return
        for cell in self._saved_cells:
            h, cell[0] = cell[0], None
            if h is not None:
                _native.dst_saved_destroy(h)
        self._saved_cells = []
        h, self._handle = self._handle, None
        _native.dst_layer_destroy(h)
        self._param_mem = None
        self._grad_mem = None


    def __deepcopy__(self, memo):
        raise TypeError("a dstransformer.Layer owns a native handle and cannot be copied; create another "
                        "Layer and copy the parameters (params()/load_params())")

    __copy__ = __deepcopy__

    def __reduce__(self):
        raise TypeError("a dstransformer.Layer cannot be pickled; save it with Layer.save()")

    def __repr__(self) -> str:
        if self._handle is None:
            return "Layer(closed)"
        c = self._config
        return (f"Layer(id={self.layer_id}, H={c.hidden_size}, heads={c.heads}, I={c.intermediate_size}, "
                f"dtype={c.dtype}, {'pre' if c.pre_layer_norm else 'post'}-LN, {self._context.backend})")

    # ---- description ----------------------------------------------------------------------------
    @property
    def context(self) -> Context:
        return self._context

    @property
    def config(self) -> LayerConfig:
        """A copy of the layer's configuration (intermediate_size resolved)."""
        return self._config.copy()

    @property
    def dtype(self) -> str:
        return dtype_name(self._dtype)

    @property
    def numpy_dtype(self) -> np.dtype:
        return numpy_dtype(self._dtype)

    @property
    def hidden_size(self) -> int:
        return self._H

    @property
    def layer_id(self) -> int:
        """The id within the context (0, 1, 2, … in creation order), DeepSpeed's ``layer_id``."""
        return int(_native.dst_layer_get_id(self.handle))

    @property
    def training(self) -> bool:
        c = _native.dst_layer_config()
        _native.dst_layer_config_default(c)
        _native.dst_layer_get_config(self.handle, c)
        return bool(c.training)

    def train(self, mode: bool = True) -> "Layer":
        """Training mode (dropout on, activations saved); ``train(False)`` is :meth:`eval`."""
        _native.dst_layer_set_training(self.handle, int(bool(mode)))
        self._config.training = bool(mode)
        return self

    def eval(self) -> "Layer":
        return self.train(False)

    def saved_bytes(self, batch: int, seq: int) -> int:
        """Bytes a training forward of B×S tokens keeps (a configuration query; nothing is run)."""
        return int(_native.dst_layer_config_saved_bytes(self._native_config, int(batch), int(seq)))

    def workspace_bytes(self, batch: int, seq: int) -> int:
        return int(_native.dst_layer_config_workspace_bytes(self._native_config, int(batch), int(seq)))

    # ---- parameters -----------------------------------------------------------------------------
    @property
    def param_names(self) -> Tuple[str, ...]:
        return PARAM_NAMES

    def param_info(self, name: Union[str, int]) -> ParamInfo:
        """Shape and arena position of a parameter; ``name`` is a DeepSpeed name (optionally after a
        prefix ending in '.') or an index 0..11."""
        if isinstance(name, int) and not isinstance(name, bool):
            if not 0 <= name < len(PARAM_NAMES):
                raise IndexError(f"param index {name} out of range 0..11")
            return self._infos[PARAM_NAMES[name]]
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        idx = int(_native.dst_param_lookup(name))
        return self._infos[PARAM_NAMES[idx]]

    @property
    def arena_bytes(self) -> int:
        """Size of the parameter arena (and of the gradient arena) in bytes."""
        return int(_native.dst_layer_arena_bytes(self.handle))

    @property
    def param_arena_ptr(self) -> int:
        return int(_native.dst_layer_param_arena(self.handle) or 0)

    @property
    def grad_arena_ptr(self) -> int:
        return int(_native.dst_layer_grad_arena(self.handle) or 0)

    def _host_dtype(self, dtype: Any) -> Tuple[int, np.dtype]:
        code = self._dtype if dtype is None else dtype_code(dtype)
        return code, numpy_dtype(code)

    def param(self, name: Union[str, int], dtype: Any = None) -> np.ndarray:
        """A host copy of one parameter, converted to ``dtype`` (default: the layer dtype)."""
        info = self.param_info(name)
        code, npdt = self._host_dtype(dtype)
        out = np.empty(info.shape, dtype=npdt)
        _native.dst_layer_get_param(self.handle, info.name, out.__array_interface__["data"][0], code, info.numel)
        return out

    def grad(self, name: Union[str, int], dtype: Any = None) -> np.ndarray:
        """A host copy of one parameter's gradient, converted to ``dtype`` (default: the layer dtype)."""
        info = self.param_info(name)
        code, npdt = self._host_dtype(dtype)
        out = np.empty(info.shape, dtype=npdt)
        _native.dst_layer_get_grad(self.handle, info.name, out.__array_interface__["data"][0], code, info.numel)
        return out

    def params(self, dtype: Any = None) -> Dict[str, np.ndarray]:
        return {n: self.param(n, dtype) for n in PARAM_NAMES}

    def grads(self, dtype: Any = None) -> Dict[str, np.ndarray]:
        return {n: self.grad(n, dtype) for n in PARAM_NAMES}

    def set_param(self, name: Union[str, int], value: Any) -> None:
        """Copies a host array (float32/float16/float64, bf16 as uint16 bits or ml_dtypes.bfloat16) into
        one parameter, converting to the layer dtype. The shape must be the parameter's."""
        info = self.param_info(name)
        arr = value if isinstance(value, np.ndarray) else np.asarray(value)
        if arr.dtype.kind in "iub" and arr.dtype != np.uint16:
            arr = arr.astype(np.float64)
        from ._arrays import dtype_of_numpy

        code = dtype_of_numpy(arr.dtype)
        if code is None or code == DT_INT32:
            raise TypeError(f"set_param({info.name!r}): value has dtype {arr.dtype}, expected float32, float16, "
                            "float64 or bf16 (uint16 bits / ml_dtypes.bfloat16)")
        if tuple(arr.shape) != info.shape:
            raise ValueError(f"set_param({info.name!r}): value has shape {tuple(arr.shape)}, expected {info.shape}")
        arr = np.ascontiguousarray(arr)
        _native.dst_layer_set_param(self.handle, info.name, arr.__array_interface__["data"][0], code, info.numel)

    def load_params(self, params: Dict[str, Any]) -> None:
        """set_param for every entry of a dict (DeepSpeed names)."""
        for k, v in params.items():
            self.set_param(k, v)

    def _view(self, base: int, name: Union[str, int]):
        info = self.param_info(name)
        ptr = base + info.offset_bytes
        if self._on_device:
            return DeviceArray(self._context, info.shape, self._dtype, ptr=ptr, owner=self)
        return host_view(self, ptr, info.shape, self._dtype)

    def param_view(self, name: Union[str, int]):
        """A view (no copy) of one parameter in the arena: a writable NumPy array on a CPU context, a
        :class:`DeviceArray` on CUDA. Valid while the layer lives and keeps this arena."""
        return self._view(self.param_arena_ptr, name)

    def grad_view(self, name: Union[str, int]):
        """A view (no copy) of one gradient in the gradient arena; see :meth:`param_view`."""
        return self._view(self.grad_arena_ptr, name)

    def bind_param_arena(self, memory: Any, nbytes: Optional[int] = None, copy_current: bool = True) -> None:
        """Makes the layer use caller memory for its parameters: an array (kept alive by the layer; NumPy
        on CPU, a device array on CUDA) or an int address with ``nbytes``. It must be 256-byte aligned and
        hold :attr:`arena_bytes` (:func:`aligned_empty` helps). ``copy_current`` copies the current values
        in first; otherwise the memory must already hold valid parameters."""
        ptr, n = _ptr_or_array(memory, "memory", self._on_device)
        if nbytes is None:
            if n is None:
                raise TypeError("bind_param_arena: nbytes is required with an integer address")
            nbytes = n
        _native.dst_layer_bind_param_arena(self.handle, ptr, int(nbytes), int(bool(copy_current)))
        self._param_mem = memory

    def bind_grad_arena(self, memory: Any, nbytes: Optional[int] = None) -> None:
        """Makes the layer use caller memory for its gradients (as :meth:`bind_param_arena`; the contents
        are taken as they are)."""
        ptr, n = _ptr_or_array(memory, "memory", self._on_device)
        if nbytes is None:
            if n is None:
                raise TypeError("bind_grad_arena: nbytes is required with an integer address")
            nbytes = n
        _native.dst_layer_bind_grad_arena(self.handle, ptr, int(nbytes))
        self._grad_mem = memory

    def zero_grads(self) -> None:
        _native.dst_layer_zero_grads(self.handle)

    def saved_activations(self) -> SavedActivations:
        """A new :class:`SavedActivations` for this layer."""
        return SavedActivations(self)

    # ---- running --------------------------------------------------------------------------------
    def _check_activation(self, info: ArgInfo, name: str, expect: Optional[Tuple[int, int]] = None) -> None:
        if info.dtype != self._dtype:
            raise TypeError(f"{name}: dtype is {dtype_label(info.dtype)}, expected {self.dtype} (the layer dtype)")
        if len(info.shape) != 3:
            raise ValueError(f"{name}: shape is {info.shape}, expected [B, S, H] with H = {self._H}")
        B, S, H = info.shape
        if H != self._H:
            raise ValueError(f"{name}: shape is {info.shape}, expected the last dimension to be hidden_size {self._H}")
        if B < 1 or S < 1:
            raise ValueError(f"{name}: shape is {info.shape}, expected B >= 1 and S >= 1")
        if expect is not None and (B, S) != expect:
            raise ValueError(f"{name}: shape is {info.shape}, expected {(expect[0], expect[1], self._H)}")
        if self._on_device and info.device not in (f"cuda:{self._context.device}", "cuda:?"):
            raise ValueError(f"{name}: array is on {info.device}, the context is on cuda:{self._context.device}")

    def _native_mask(self, mask: Any, B: int, S: int, keep: list):
        if mask is None:
            return None
        if not isinstance(mask, Mask):
            mask = self._guess_mask(mask)
        if mask.kind == Mask.NONE:
            return native_mask(_native.DST_MASK_NONE, 0, DT_FP32, ())
        stream = self._context.stream if self._on_device else None
        arr = mask.array
        if mask.kind == Mask.LENGTHS and not self._on_device:
            arr = np.asarray(arr)
            if arr.dtype.kind in "iu" and arr.dtype != np.int32:
                arr = arr.astype(np.int32)
        info = describe(arr, "mask", self._on_device, stream)
        keep.append(info.keep)
        if mask.kind == Mask.LENGTHS:
            if info.dtype != DT_INT32:
                raise TypeError(f"mask: key lengths must be int32, got {dtype_label(info.dtype)}")
            if info.shape != (B,):
                raise ValueError(f"mask: key lengths have shape {info.shape}, expected ({B},)")
            a = info.array
            if a is not None and a.size and (a.min() < 1 or a.max() > S):
                raise ValueError(f"mask: key lengths must lie in 1..{S} (S), got {a.min()}..{a.max()}")
            kind = _native.DST_MASK_KEY_LENGTHS
        else:
            if info.dtype not in (DT_FP32, self._dtype):
                raise TypeError(f"mask: additive mask dtype is {dtype_label(info.dtype)}, expected fp32 or "
                                f"{self.dtype} (the layer dtype)")
            if info.shape not in ((B, S), (B, 1, 1, S)):
                raise ValueError(f"mask: additive mask shape is {info.shape}, expected {(B, S)} or {(B, 1, 1, S)}")
            kind = _native.DST_MASK_ADDITIVE
        return native_mask(kind, info.ptr, info.dtype, info.shape)

    def _guess_mask(self, arr: Any) -> Mask:
        dt = getattr(arr, "dtype", None)
        if dt is None:
            arr = np.asarray(arr)
            dt = arr.dtype
        kind = getattr(dt, "kind", None)
        name = str(dt)
        if kind in ("i", "u") or "int" in name:
            return Mask.lengths(arr)
        if kind == "b" or "bool" in name:
            raise TypeError("mask: boolean masks are ambiguous; pass Mask.additive(float array) "
                            "(0 keep, -10000 drop) or Mask.lengths(int32 key lengths)")
        return Mask.additive(arr)

    def _alloc_like(self, x: Any, info: ArgInfo):
        return _alloc_like(self._context, x, info.shape, self._dtype)

    def _saved_handle(self, saved: Optional[SavedActivations]):
        if saved is None:
            return None
        if not isinstance(saved, SavedActivations):
            raise TypeError(f"saved must be a SavedActivations or None, got {type(saved).__name__}")
        if saved.layer is not self:
            raise ValueError("saved: this SavedActivations was created for another layer")
        return saved.handle

    def forward(self, x: Any, mask: Any = None, saved: Optional[SavedActivations] = None, out: Any = None):
        """Runs the layer on ``x`` [B, S, H] (layer dtype) and returns the output [B, S, H].

        ``mask``: None; a float array [B, S] or [B, 1, 1, S] (additive: 0 keep, large negative drop), an
        integer array [B] (key lengths in 1..S), or a :class:`Mask`. ``saved``: where a training forward
        keeps its activations (default: the layer's own object). ``out``: an optional output array.
        In training mode dropout is applied and the context's RNG advances.
        """
        stream = self._context.stream if self._on_device else None
        xi = describe(x, "x", self._on_device, stream)
        self._check_activation(xi, "x")
        B, S, _ = xi.shape
        keep = [xi.keep]
        saved_h = self._saved_handle(saved)
        m = self._native_mask(mask, B, S, keep)
        if out is None:
            out = self._alloc_like(x, xi)
        oi = describe(out, "out", self._on_device, stream, writable=True)
        self._check_activation(oi, "out", (B, S))
        self._run_forward(saved_h, xi.ptr, B, S, m, oi.ptr)
        return out

    __call__ = forward

    def backward(self, dy: Any, saved: Optional[SavedActivations] = None, accumulate: bool = False,
                 out: Any = None):
        """Backward of the training forward recorded in ``saved`` (default: the layer's own object):
        takes dL/dY [B, S, H] and returns dL/dX; the 12 parameter gradients go to the gradient arena,
        overwritten or, with ``accumulate=True``, added."""
        stream = self._context.stream if self._on_device else None
        gi = describe(dy, "dy", self._on_device, stream)
        self._check_activation(gi, "dy")
        B, S, _ = gi.shape
        saved_h = self._saved_handle(saved)
        if out is None:
            out = self._alloc_like(dy, gi)
        oi = describe(out, "out", self._on_device, stream, writable=True)
        self._check_activation(oi, "out", (B, S))
        self._run_backward(saved_h, gi.ptr, B, S, oi.ptr, accumulate)
        return out

    def _check_packed(self, info, name: str, expect_n: Optional[int] = None) -> None:
        if info.dtype != self._dtype:
            raise TypeError(f"{name}: dtype is {dtype_label(info.dtype)}, expected {self.dtype} (the layer dtype)")
        if len(info.shape) != 2 or info.shape[1] != self._H or info.shape[0] < 1:
            raise ValueError(f"{name}: shape is {info.shape}, expected [N, {self._H}] (packed tokens, N >= 1)")
        if expect_n is not None and info.shape[0] != expect_n:
            raise ValueError(f"{name}: shape is {info.shape}, expected {(expect_n, self._H)}")
        if self._on_device and info.device not in (f"cuda:{self._context.device}", "cuda:?"):
            raise ValueError(f"{name}: array is on {info.device}, the context is on cuda:{self._context.device}")

    def forward_packed(self, x: Any, cu_seqlens: Any, max_seqlen: Optional[int] = None,
                       saved: Optional[SavedActivations] = None, out: Any = None):
        """Runs the layer on packed sequences: ``x`` [N, H] holds B sequences end to end, sequence b in
        rows ``cu_seqlens[b]`` .. ``cu_seqlens[b+1] - 1`` (int32 [B + 1], from 0 to N). Returns [N, H]:
        each row gets what :meth:`forward` gives it in a padded batch with key lengths. ``max_seqlen``
        (at least every length) is computed from ``cu_seqlens`` when it is a host array; give it for
        device arrays (reading them would wait for the device). A later backward is
        :meth:`backward_packed`."""
        stream = self._context.stream if self._on_device else None
        xi = describe(x, "x", self._on_device, stream)
        self._check_packed(xi, "x")
        N = xi.shape[0]
        cu = cu_seqlens
        if not self._on_device:
            cu = np.asarray(cu)
            if cu.dtype.kind in "iu" and cu.dtype != np.int32:
                cu = cu.astype(np.int32)
        ci = describe(cu, "cu_seqlens", self._on_device, stream)
        if ci.dtype != DT_INT32 or len(ci.shape) != 1 or ci.shape[0] < 2:
            raise TypeError(f"cu_seqlens: expected int32 [B + 1] with B >= 1, got {dtype_label(ci.dtype)} {ci.shape}")
        if max_seqlen is None:
            if ci.array is None:
                raise ValueError("max_seqlen: give it for device offsets (reading cu_seqlens would wait for the device)")
            lengths = np.diff(ci.array.astype(np.int64))
            max_seqlen = int(lengths.max()) if lengths.size else 0
        saved_h = self._saved_handle(saved)
        if out is None:
            out = self._alloc_like(x, xi)
        oi = describe(out, "out", self._on_device, stream, writable=True)
        self._check_packed(oi, "out", N)
        keep = (xi.keep, ci.keep)  # noqa: F841  (alive until the call returns)
        self._run_forward_packed(saved_h, xi.ptr, N, ci.ptr, ci.shape[0] - 1, int(max_seqlen), oi.ptr)
        return out

    def backward_packed(self, dy: Any, saved: Optional[SavedActivations] = None, accumulate: bool = False,
                        out: Any = None):
        """Backward of the packed training forward recorded in ``saved``: takes dL/dY [N, H], returns dL/dX
        [N, H]; the parameter gradients as in :meth:`backward`."""
        stream = self._context.stream if self._on_device else None
        gi = describe(dy, "dy", self._on_device, stream)
        self._check_packed(gi, "dy")
        N = gi.shape[0]
        saved_h = self._saved_handle(saved)
        if out is None:
            out = self._alloc_like(dy, gi)
        oi = describe(out, "out", self._on_device, stream, writable=True)
        self._check_packed(oi, "out", N)
        self._run_backward_packed(saved_h, gi.ptr, N, oi.ptr, accumulate)
        return out

    # raw entry points (addresses already checked); used by the torch adapter
    def _run_forward(self, saved_h, x_ptr: int, B: int, S: int, native_mask, out_ptr: int) -> None:
        t_in = _native.dst_tensor(x_ptr, self._dtype, 3, B, S, self._H)
        t_out = _native.dst_tensor(out_ptr, self._dtype, 3, B, S, self._H)
        _native.dst_layer_forward(self.handle, saved_h, t_in, native_mask, t_out)

    def _run_forward_packed(self, saved_h, x_ptr: int, N: int, cu_ptr: int, B: int, max_seqlen: int,
                            out_ptr: int) -> None:
        t_in = _native.dst_tensor(x_ptr, self._dtype, 2, N, self._H)
        t_cu = _native.dst_tensor(cu_ptr, DT_INT32, 1, B + 1)
        t_out = _native.dst_tensor(out_ptr, self._dtype, 2, N, self._H)
        _native.dst_layer_forward_packed(self.handle, saved_h, t_in, t_cu, int(max_seqlen), t_out)

    def _run_backward_packed(self, saved_h, dy_ptr: int, N: int, dx_ptr: int, accumulate: bool) -> None:
        t_dy = _native.dst_tensor(dy_ptr, self._dtype, 2, N, self._H)
        t_dx = _native.dst_tensor(dx_ptr, self._dtype, 2, N, self._H)
        mode = _native.DST_GRAD_ACCUMULATE if accumulate else _native.DST_GRAD_WRITE
        _native.dst_layer_backward_packed(self.handle, saved_h, t_dy, t_dx, mode)

    def _run_backward(self, saved_h, dy_ptr: int, B: int, S: int, dx_ptr: int, accumulate: bool) -> None:
        t_dy = _native.dst_tensor(dy_ptr, self._dtype, 3, B, S, self._H)
        t_dx = _native.dst_tensor(dx_ptr, self._dtype, 3, B, S, self._H)
        mode = _native.DST_GRAD_ACCUMULATE if accumulate else _native.DST_GRAD_WRITE
        _native.dst_layer_backward(self.handle, saved_h, t_dy, t_dx, mode)

    # ---- checkpoints ----------------------------------------------------------------------------
    def save(self, path: Union[str, os.PathLike], **options: Any) -> None:
        """Writes this layer as ``layer.0`` of a safetensors file; options as :func:`save_checkpoint`."""
        save_checkpoint([self], path, **options)

    def load(self, path: Union[str, os.PathLike], **options: Any) -> Optional[str]:
        """Reads ``layer.0`` of a safetensors file into this layer; options as :func:`load_checkpoint`."""
        return load_checkpoint([self], path, **options)


# ---- checkpoints ------------------------------------------------------------------------------------
def _layout(value: Union[str, int]) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    key = str(value).lower()
    if key not in _LAYOUTS:
        raise ValueError(f"layout must be 'deepspeed' or 'hf_bert', got {value!r}")
    return _LAYOUTS[key]


def _as_layer(obj: Any) -> Optional[Layer]:
    """A :class:`Layer`, or the native layer of an object that runs on one (``dstransformer.torch``'s
    TransformerLayer, through its ``native`` property); None for anything else."""
    if isinstance(obj, Layer):
        return obj
    if isinstance(getattr(type(obj), "native", None), property):
        native = obj.native
        if isinstance(native, Layer):
            return native
    return None


def _handles(layers: Any) -> list:
    single = _as_layer(layers)
    items = [single] if single is not None else layers
    out = []
    for i, l in enumerate(items):
        native = _as_layer(l)
        if native is None:
            raise TypeError(f"layers[{i}] is a {type(l).__name__}, expected a dstransformer.Layer or a "
                            "dstransformer.torch.TransformerLayer")
        out.append(native.handle)
    if not out:
        raise ValueError("layers: at least one layer is required")
    return out


def save_checkpoint(layers: Union[Layer, Iterable[Layer]], path: Union[str, os.PathLike], *,
                    layout: str = "deepspeed", prefix: Optional[str] = None, include_grads: bool = False,
                    save_dtype: Any = None, client_state: Union[str, bytes, None] = None) -> None:
    """Writes the parameters (and with ``include_grads`` the gradients) of a stack of layers to a
    safetensors file, atomically (``dst_checkpoint_save``). ``layers`` is one layer or a sequence of them:
    :class:`Layer` objects or ``dstransformer.torch.TransformerLayer`` modules (a ``ModuleList`` too). Layer i is stored as ``<prefix>layer.<i>.``;
    ``layout`` is "deepspeed" (attn_qkvw …) or "hf_bert" (Post-LN only); ``save_dtype`` converts
    (default: each layer's dtype); ``client_state`` (str, stored as UTF-8, or any bytes) is kept with the
    weights exactly."""
    handles = _handles(layers)
    opts = _native.dst_checkpoint_options()
    opts.layout = _layout(layout)
    opts.prefix = prefix
    opts.include_grads = int(bool(include_grads))
    opts.save_dtype = -1 if save_dtype is None else dtype_code(save_dtype)
    if client_state is not None:
        if isinstance(client_state, str):
            client_state = client_state.encode("utf-8")
        if not isinstance(client_state, (bytes, bytearray, memoryview)):
            raise TypeError(f"client_state is a {type(client_state).__name__}, expected str or bytes")
        opts.set_client_state(bytes(client_state))
    _native.dst_checkpoint_save(handles, os.fspath(path), opts)


def load_checkpoint(layers: Union[Layer, Iterable[Layer]], path: Union[str, os.PathLike], *,
                    layout: str = "deepspeed", prefix: Optional[str] = None, include_grads: bool = False,
                    restore_rng: bool = True) -> Union[str, bytes, None]:
    """Reads parameters (and with ``include_grads`` gradients) into a stack of layers
    (``dst_checkpoint_load``), given as for :func:`save_checkpoint` (a torch layer's ``flat_params`` is
    written in place); every tensor is checked before any layer changes. With ``restore_rng`` the
    first layer's context gets the stored RNG state. Returns the stored client state (a str when it is
    UTF-8 text, else its bytes), or None."""
    handles = _handles(layers)
    opts = _native.dst_checkpoint_options()
    opts.layout = _layout(layout)
    opts.prefix = prefix
    opts.include_grads = int(bool(include_grads))
    opts.restore_rng = int(bool(restore_rng))
    cap = 1 << 16
    while True:
        data, full_len = _native.dst_checkpoint_load(handles, os.fspath(path), opts, cap)
        if int(full_len) < cap:
            break
        cap = int(full_len) + 1  # truncated: read again with room for all of it
    if int(full_len) == 0:
        return None
    data = bytes(data[:int(full_len)])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data


def convert(in_path: Union[str, os.PathLike], out_path: Union[str, os.PathLike], *,
            in_layout: str = "hf_bert", out_layout: str = "deepspeed", in_prefix: Optional[str] = None,
            out_prefix: Optional[str] = None) -> str:
    """Converts a checkpoint file between the Hugging Face BERT and DeepSpeed layouts without creating
    layers (``dst_checkpoint_convert``). Returns the library's summary of what was read and written."""
    return _native.dst_checkpoint_convert(os.fspath(in_path), _layout(in_layout), in_prefix,
                                          os.fspath(out_path), _layout(out_layout), out_prefix, 1 << 16)


def describe_checkpoint(path: Union[str, os.PathLike]) -> str:
    """The library's description of a checkpoint file (``dst_checkpoint_describe``): sizes, tensor count
    and dtypes, the layers found under each layout and prefix, and the metadata. Reads only the header,
    which it validates; raises :class:`FormatError` or :class:`DstIOError` like :func:`load_checkpoint`."""
    cap = 1 << 14
    while True:
        text, full_len = _native.dst_checkpoint_describe(os.fspath(path), cap)
        if int(full_len) < cap:
            return text
        cap = int(full_len) + 1  # truncated: ask again with room for all of it
