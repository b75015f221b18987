"""PyTorch drop-in for DeepSpeed's ``DeepSpeedTransformerConfig`` / ``DeepSpeedTransformerLayer``.

Importing this module imports torch; ``import dstransformer`` alone does not.

    from dstransformer.torch import TransformerConfig, TransformerLayer
    cfg = TransformerConfig(batch_size=8, hidden_size=1024, intermediate_size=4096, heads=16,
                            attn_dropout_ratio=0.1, hidden_dropout_ratio=0.1, num_hidden_layers=24,
                            initializer_range=0.02, local_rank=0, seed=1234, fp16=True,
                            pre_layer_norm=True)
    layer = TransformerLayer(cfg)            # on cuda:local_rank (an error when no GPU is usable)
    y = layer(x, attention_mask)             # x [B, S, H]; mask [B, 1, 1, S] or [B, S] additive

As in DeepSpeed, the sizes left at -1 must be set (making a layer raises otherwise) and ``local_rank >= 0``
needs a usable CUDA device. Differences from DeepSpeed, all deliberate: ``local_rank=-1`` (or
``device="cpu"``) without a GPU runs on the library's CPU backend; any sequence length (no padding to a
multiple of 16); the mask may be omitted, and Hugging Face's integer [B, S] mask (1 attend, 0 padding) or
integer key lengths [B] are accepted as masks; the checkpoint functions of :mod:`dstransformer`
(``save_checkpoint``, ``load_checkpoint``) take these layers (or a ``ModuleList`` of them); each layer is self-contained
(no global registry; ``copy.deepcopy`` gives an independent layer); the weights of layer ``layer_id`` are
drawn from the library's Philox stream with seed ``config.seed + layer_id`` (DeepSpeed draws from torch's
RNG; call :meth:`TransformerLayer.init_transformer_weights` for that); ``adjust_init_range`` applies on
every rank; ``forward(..., grads=list)`` appends each call's gradients once, in a fixed order, when its
backward runs (DeepSpeed leaves hooks registered on the parameters, see :data:`GRAD_HOOK_NAMES`).
"""

from __future__ import annotations

import copy
import math
from typing import Any, Dict, Optional

import torch
from torch import nn

from . import _native
from ._config import LayerConfig, TransformerConfig, dtype_code
from ._core import PARAM_NAMES, Context, Layer, SavedActivations, cuda_device_count, native_mask

__all__ = ["TransformerConfig", "TransformerLayer", "DeepSpeedTransformerConfig", "DeepSpeedTransformerLayer",
           "GRAD_HOOK_NAMES"]

_TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64}
_DST_OF_TORCH = {
    torch.float32: _native.DST_DTYPE_FP32,
    torch.float16: _native.DST_DTYPE_FP16,
    torch.bfloat16: _native.DST_DTYPE_BF16,
    torch.float64: _native.DST_DTYPE_FP64,
    torch.int32: _native.DST_DTYPE_INT32,
}
_NAME_OF_TORCH = {v: k for k, v in _TORCH_DTYPES.items()}
_ALIGN = 256
_MASKED = -10000.0  # what a masked key gets in the additive mask made from a Hugging Face integer mask

# ---- shared contexts: one per device, so that the layers of a model share one dropout RNG stream ----
_CONTEXTS: Dict[tuple, Context] = {}


def _context_for(device: torch.device) -> Context:
    key = (device.type, device.index or 0)
    ctx = _CONTEXTS.get(key)
    if ctx is None or ctx.closed:
        ctx = Context("cuda" if device.type == "cuda" else "cpu", key[1])
        _CONTEXTS[key] = ctx
    return ctx


def _choose_device(config: LayerConfig, device: Any) -> torch.device:
    """``device=`` when given; else DeepSpeed's rule: ``local_rank ≥ 0`` asks for ``cuda:local_rank``, which
    must be usable (DeepSpeed's layer is CUDA-only, so it fails there too); ``local_rank = -1`` takes the
    current CUDA device, or the CPU backend when no CUDA device is usable."""
    if device is not None:
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        return dev
    rank = int(config.local_rank) if config.local_rank is not None else -1
    usable = _cuda_usable()
    if rank >= 0:
        if usable is not None:
            raise RuntimeError(
                f"TransformerLayer: local_rank={rank} asks for cuda:{rank}, but {usable}. DeepSpeed's layer needs "
                "CUDA as well; for the library's CPU backend pass local_rank=-1 (DeepSpeed's default) or "
                "device='cpu'")
        if rank >= torch.cuda.device_count():
            raise RuntimeError(f"TransformerLayer: local_rank={rank}, but torch sees "
                               f"{torch.cuda.device_count()} CUDA device(s)")
        torch.cuda.set_device(rank)  # as DeepSpeed does
        return torch.device("cuda", rank)
    if usable is None:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _cuda_usable() -> Optional[str]:
    """None when torch and the library can both run on a CUDA device, else the reason they cannot."""
    if not torch.cuda.is_available():
        return "torch sees no CUDA device (torch.cuda.is_available() is False)"
    if cuda_device_count() == 0:
        return "libdstransformer sees no CUDA device (a build without the CUDA backend, or no usable GPU)"
    return None


def _aligned_empty(numel: int, dtype: torch.dtype, device: torch.device, zero: bool = True) -> torch.Tensor:
    """A 1-D tensor of ``numel`` elements whose data is 256-byte aligned (a view into a slightly larger
    allocation when the allocator does not already align)."""
    esize = torch.empty((), dtype=dtype).element_size()
    make = torch.zeros if zero else torch.empty
    t = make(numel, dtype=dtype, device=device)
    if t.data_ptr() % _ALIGN == 0:
        return t
    raw = make(numel + _ALIGN // esize, dtype=dtype, device=device)
    off = ((-raw.data_ptr()) % _ALIGN) // esize
    return raw.narrow(0, off, numel)


def _set_stream(ctx: Context, device: torch.device) -> None:
    """Points the context at torch's current stream. Torch's default stream is the legacy default stream,
    whose handle is 0; to the C API 0 (NULL) means the context's own non-blocking stream, which would not
    be ordered with torch's work, so the legacy stream's explicit handle (cudaStreamLegacy) is passed.
    The library synchronises the old stream whenever the stream is set (unless either stream captures a
    CUDA graph), so it is set only on a change: setting it on every call made each forward and backward
    wait for the GPU."""
    if device.type == "cuda":
        handle = torch.cuda.current_stream(device).cuda_stream or Context.LEGACY_DEFAULT_STREAM
        if ctx.stream != handle:
            ctx.set_stream(handle)


class _Layout:
    """Element offsets of the 12 parameters in the flat arena of one dtype."""

    def __init__(self, layer: Layer):
        esize = int(_native.dst_dtype_size(layer._dtype))
        self.arena_bytes = layer.arena_bytes
        self.numel = self.arena_bytes // esize
        self.entries = {}
        for name in PARAM_NAMES:
            info = layer.param_info(name)
            self.entries[name] = (info.offset_bytes // esize, info.numel, info.shape)

    @classmethod
    def planned(cls, config: LayerConfig, dtype_name: str) -> "_Layout":
        """The layout a native layer of ``config`` is expected to have (the 12 parameters in order, each
        256-byte aligned), for a module that gets its weights from the caller and so creates its native
        layer only when first run. It is a plan, not a promise: :meth:`TransformerLayer._sync_native`
        compares it with the native layer's own layout and moves the values if they differ."""
        plan = cls.__new__(cls)
        esize = int(_native.dst_dtype_size(dtype_code(dtype_name)))
        H = int(config.hidden_size)
        inter = int(config.intermediate_size)
        I = inter if inter > 0 else 4 * H
        shapes = {"attn_qkvw": (3 * H, H), "attn_qkvb": (3 * H,), "attn_ow": (H, H), "attn_ob": (H,),
                  "attn_nw": (H,), "attn_nb": (H,), "inter_w": (I, H), "inter_b": (I,), "output_w": (H, I),
                  "output_b": (H,), "norm_w": (H,), "norm_b": (H,)}
        plan.entries = {}
        off = 0
        for name in PARAM_NAMES:
            shape = shapes[name]
            n = math.prod(shape)
            plan.entries[name] = (off // esize, n, shape)
            off += (n * esize + _ALIGN - 1) // _ALIGN * _ALIGN
        plan.arena_bytes = off
        plan.numel = off // esize
        return plan

    def view(self, flat: torch.Tensor, name: str) -> torch.Tensor:
        off, n, shape = self.entries[name]
        return flat.narrow(0, off, n).view(shape)

    def padding_ranges(self):
        spans = sorted((off, off + n) for off, n, _ in self.entries.values())
        pos = 0
        for a, b in spans:
            if a > pos:
                yield pos, a
            pos = max(pos, b)
        if pos < self.numel:
            yield pos, self.numel


#: What ``forward(..., grads=list)`` appends, in this order, when the call's backward runs: DeepSpeed's
#: name for the gradient of each parameter (its test-only hooks use these names). Of ``attn_qkvw`` and
#: ``attn_qkvb`` only the V rows are reported, as DeepSpeed does.
GRAD_HOOK_NAMES = (
    ("attn_qkvw", "V_W"), ("attn_qkvb", "V_B"), ("attn_ow", "O_W"), ("attn_ob", "O_B"),
    ("attn_nw", "N2_W"), ("attn_nb", "N2_B"), ("inter_w", "int_W"), ("inter_b", "int_B"),
    ("output_w", "out_W"), ("output_b", "out_B"), ("norm_w", "norm_W"), ("norm_b", "norm_B"),
)


def _append_grads(grads, layout: "_Layout", grad_flat: torch.Tensor) -> None:
    """Appends ``[gradient, name]`` for each entry of :data:`GRAD_HOOK_NAMES`; the tensors are copies,
    so that later accumulation into the parameters' ``.grad`` does not change them."""
    for param, name in GRAD_HOOK_NAMES:
        g = layout.view(grad_flat, param)
        if param in ("attn_qkvw", "attn_qkvb"):
            H = g.shape[0] // 3
            g = g[2 * H:3 * H]
        grads.append([g.clone(), name])


class _Packed:
    """Packed sequences of one call: int32 offsets [B + 1] on the layer's device and the longest length."""

    __slots__ = ("cu", "max_seqlen")

    def __init__(self, cu: torch.Tensor, max_seqlen: int):
        self.cu, self.max_seqlen = cu, int(max_seqlen)


def _capturing(x: torch.Tensor) -> bool:
    """Whether work on ``x``'s device is being captured into a CUDA graph (torch's current stream)."""
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


class _TransformerFunction(torch.autograd.Function):
    """One forward/backward of the native layer. Each forward owns one SavedActivations, so several
    forwards may be in flight; backward hands it back to the module (_keep_saved), so that the next forward
    reuses it and its device memory (a free would make the device wait: cudaFree synchronises). Backward writes the twelve gradients into one fresh aligned tensor, bound
    as the layer's gradient arena, and returns twelve views of it: autograd stores them as the
    parameters' ``.grad`` without a copy (or adds them in place into the ``.grad`` already there)."""

    @staticmethod
    def forward(ctx, x, mask, module, native, training, grads, *params):  # noqa: D401
        # A forward captured into a CUDA graph takes an object for the graph alone (_take_saved): the
        # graph's replays write and read its memory, so no later forward may reuse it.
        graph = bool(training and _capturing(x))
        saved = module._take_saved(native, graph) if training else None
        out = torch.empty_like(x)
        try:
            module._run_forward(native, saved, x, mask, out)
        except BaseException:
            if graph:
                module._graph_saved.remove(saved)
                module._keep_saved(native, saved)
            raise
        ctx.native = native
        ctx.saved_obj = saved
        ctx.graph = graph
        ctx.module = module
        ctx.packed = isinstance(mask, _Packed)
        ctx.grads = grads
        ctx.layout = module._layout
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        saved = ctx.saved_obj
        if saved is None:
            raise RuntimeError(
                "TransformerLayer: backward needs a training-mode forward (call .train(); DeepSpeed's layer "
                "has the same requirement), or this forward was already back-propagated (retain_graph / a "
                "second backward is not supported: the saved activations are freed by the first backward)")
        module, native = ctx.module, ctx.native
        dy = dy.contiguous()
        dx = torch.empty_like(dy)
        grad_flat = module._backward_into(native, saved, dy, dx, ctx.packed)
        if not ctx.graph:  # a graph's object stays the graph's (module._graph_saved)
            module._keep_saved(native, saved)
        ctx.saved_obj = None
        if ctx.grads is not None:
            _append_grads(ctx.grads, ctx.layout, grad_flat)
            ctx.grads = None
        param_grads = tuple(ctx.layout.view(grad_flat, n) if need else None
                            for n, need in zip(PARAM_NAMES, ctx.needs_input_grad[6:]))
        return (dx, None, None, None, None, None) + param_grads


class TransformerLayer(nn.Module):
    """Drop-in for ``DeepSpeedTransformerLayer(config, initial_weights=None, initial_biases=None)``.

    The 12 parameters are separate ``nn.Parameter``s under DeepSpeed's names (``attn_qkvw``, ``attn_qkvb``,
    ``attn_ow``, ``attn_ob``, ``attn_nw``, ``attn_nb``, ``inter_w``, ``inter_b``, ``output_w``, ``output_b``,
    ``norm_w``, ``norm_b``), so ``named_parameters()`` and name-based parameter groups work. Each is a view
    into ONE aligned arena (:attr:`flat_params`, a plain tensor in the layer dtype) that the native layer
    binds, and after a backward each ``.grad`` is a view into one gradient arena: nothing is copied.
    Assigning a tensor to ``layer.attn_qkvw`` copies its values in; ``state_dict()`` uses these names and
    ``load_state_dict`` accepts them (or a ``flat_params`` entry of older checkpoints).
    ``train()``/``eval()`` switch dropout; as in DeepSpeed, dropout is also off under ``torch.no_grad()``.
    ``forward(hidden_states, attention_mask=None, ...)`` returns a tensor, or a 1-tuple with
    ``config.return_tuple``. CUDA tensors run on ``torch.cuda.current_stream()``; CPU tensors use the
    CPU backend. ``.to()``, ``.cuda()``, ``.half()``, ``.to(torch.bfloat16)`` and ``copy.deepcopy`` work:
    the arena moves as one tensor, the parameters stay views into it and the native layer follows it. A
    parameter whose ``.data`` is replaced by other code is copied back into the arena at the next call.
    """

    layer_id = 0  # class-level counter, as DeepSpeedTransformerLayer.layer_id
    _POOLS = ("_saved_pool", "_graph_saved")  # per-instance lists of SavedActivations, not copied

    def __init__(self, config: LayerConfig, initial_weights: Optional[list] = None,
                 initial_biases: Optional[list] = None, *, device: Any = None):
        super().__init__()
        if isinstance(config, dict):
            config = TransformerConfig.from_dict(config)
        if not isinstance(config, LayerConfig):
            raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
        self.config = config
        self.config.layer_id = TransformerLayer.layer_id
        TransformerLayer.layer_id += 1
        self._my_layer_id = self.config.layer_id
        self._native = None
        # SavedActivations of finished backwards, for the next forwards (_take_saved), and of forwards
        # captured into CUDA graphs (never reused): _POOLS, empty in every copy.
        self._saved_pool, self._graph_saved = [], []
        self._bound_ptr = None
        self._last_grad_buf = None
        self._native_training = None
        dev = _choose_device(config, device)
        name = config.resolved_dtype
        dtype = _TORCH_DTYPES[name]
        capacity = (config.resolved_max_batch_tokens, int(config.max_seq_length))
        if initial_weights is None and initial_biases is None:
            # The library draws the initial weights: create the native layer now and take them from it.
            native = self._make_native(dev, name, *capacity)
            layout = _Layout(native)
            flat = _aligned_empty(layout.numel, dtype, dev, zero=True)
            _set_stream(native.context, dev)
            native.bind_param_arena(flat.data_ptr(), layout.arena_bytes, copy_current=True)
            for a, b in layout.padding_ranges():  # whatever the copy put between parameters
                flat[a:b].zero_()
            self._attach(native, layout, flat.data_ptr())
            self._make_params(flat)
        else:
            # The caller gives the weights, so the library's initial ones (drawn on the host when a native
            # layer is created, which takes seconds for large layers) would be thrown away: the native
            # layer is created when the module first runs. The configuration is checked now.
            self._native_config(name, *capacity).validate(dev.type)
            layout = _Layout.planned(config, name)
            self._layout, self._device, self._dtype_name, self._capacity = layout, dev, name, capacity
            self._make_params(_aligned_empty(layout.numel, dtype, dev, zero=True))
            self._load_initial(initial_weights, initial_biases)

    # ---- the twelve parameters: views into one arena ---------------------------------------------------
    def _make_params(self, flat: torch.Tensor) -> None:
        object.__setattr__(self, "_arena", flat)
        for n in PARAM_NAMES:
            self.register_parameter(n, nn.Parameter(self._layout.view(flat, n)))

    def _params(self):
        out = []
        for n in PARAM_NAMES:
            p = self._parameters.get(n)
            if p is None:
                raise RuntimeError(f"TransformerLayer: parameter {n!r} was removed or set to None; the layer "
                                   "needs all twelve")
            out.append(p)
        return out

    def _set_arena(self, flat: torch.Tensor) -> None:
        """Makes ``flat`` the arena and every parameter a view into it (same Parameter objects, so
        optimizers built over them keep working)."""
        object.__setattr__(self, "_arena", flat)
        for n, p in zip(PARAM_NAMES, self._params()):
            p.data = self._layout.view(flat, n)

    def _repack(self) -> None:
        """Checks that the twelve parameters are still views into the arena; a parameter whose ``.data``
        was replaced (``p.data = ...``) is copied back into a new arena of its dtype and device."""
        arena = self._arena
        params = self._params()
        base, esize = arena.data_ptr(), arena.element_size()
        intact = True
        for n, p in zip(PARAM_NAMES, params):
            off, _, shape = self._layout.entries[n]
            if (p.dtype != arena.dtype or p.device != arena.device or p.data_ptr() != base + off * esize
                    or tuple(p.shape) != tuple(shape) or not p.is_contiguous()):
                intact = False
                break
        if intact:
            return
        dtype, dev = params[0].dtype, params[0].device
        for n, p in zip(PARAM_NAMES, params):
            shape = self._layout.entries[n][2]
            if p.dtype != dtype or p.device != dev:
                raise TypeError(f"TransformerLayer: parameter {n} is {p.dtype} on {p.device}, attn_qkvw "
                                f"{dtype} on {dev}; the twelve parameters share one arena (use the module's "
                                ".to()/.half(), which moves them together)")
            if tuple(p.shape) != tuple(shape):
                raise ValueError(f"TransformerLayer: parameter {n} has shape {tuple(p.shape)}, expected "
                                 f"{tuple(shape)}")
        new = _aligned_empty(self._layout.numel, dtype, dev, zero=True)
        with torch.no_grad():
            for n, p in zip(PARAM_NAMES, params):
                self._layout.view(new, n).copy_(p.detach())
        self._set_arena(new)

    def _apply(self, fn, recurse=True):
        """``.to()``, ``.cuda()``, ``.half()`` … (everything ``nn.Module._apply`` serves): the arena is
        converted as one tensor and the parameters (and gradients) become views into the result."""
        self._repack()
        params = self._params()
        grads = [p.grad for p in params]
        new = fn(self._arena)
        if new.data_ptr() % _ALIGN or not new.is_contiguous():
            aligned = _aligned_empty(self._layout.numel, new.dtype, new.device, zero=False)
            aligned.copy_(new)
            new = aligned
        for p in params:
            p.grad = None
        self._set_arena(new)
        if any(g is not None for g in grads):
            gflat = _aligned_empty(self._layout.numel, new.dtype, new.device, zero=True)
            with torch.no_grad():
                for n, p, g in zip(PARAM_NAMES, params, grads):
                    if g is not None:
                        view = self._layout.view(gflat, n)
                        view.copy_(fn(g))
                        p.grad = view
        return self

    @property
    def flat_params(self) -> torch.Tensor:
        """The parameter arena: one aligned 1-D tensor (layer dtype) that the twelve parameters view.

        A plain tensor, no longer an ``nn.Parameter``: optimise the twelve parameters
        (``layer.parameters()``); in-place edits of this tensor change them. Kept for code that reads or
        writes all weights at once; deprecated as a parameter since v0.1 (before, it was the module's
        only ``nn.Parameter``)."""
        self._repack()
        return self._arena

    # ---- the native layer ---------------------------------------------------------------------------
    def _native_config(self, dtype_name: str, max_tokens: int, max_seq: int) -> LayerConfig:
        cfg = self.config.copy()
        cfg.dtype = dtype_name
        cfg.fp16 = dtype_name == "fp16"
        cfg.max_batch_tokens = int(max_tokens)
        cfg.max_seq_length = int(max_seq)
        return cfg

    def _make_native(self, dev: torch.device, dtype_name: str, max_tokens: int, max_seq: int) -> Layer:
        cfg = self._native_config(dtype_name, max_tokens, max_seq)
        ctx = _context_for(dev)
        seed = int(cfg.seed) & ((1 << 64) - 1)
        cur_seed, cur_off = ctx.rng_state
        if cur_seed != seed:  # DeepSpeed seeds its dropout RNG from the config; keep the offset moving on
            ctx.set_rng_state(seed, cur_off)
        return Layer(ctx, cfg, seed_offset=self._my_layer_id)

    def _attach(self, native: Layer, layout: _Layout, ptr: int) -> None:
        self._native = native
        self._layout = layout
        self._device = torch.device(native.context.backend, native.context.device) \
            if native.context.backend == "cuda" else torch.device("cpu")
        self._dtype_name = native.dtype
        self._bound_ptr = ptr
        self._capacity = (int(native.config.max_batch_tokens), int(native.config.max_seq_length))
        self._native_training = None

    def _sync_native(self, B: int = 1, S: int = 1) -> Layer:
        """Makes the native layer match the arena (device, dtype, address) and the call's size."""
        self._repack()
        p = self._arena
        dev = p.device
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        if p.dtype not in _NAME_OF_TORCH:
            raise TypeError(f"TransformerLayer: parameters are {p.dtype}; supported: float32, float16, bfloat16, "
                            "float64")
        name = _NAME_OF_TORCH[p.dtype]
        need_tokens, need_seq = max(self._capacity[0], B * S), max(self._capacity[1], S)
        rebuild = (self._native is None or dev != self._device or name != self._dtype_name
                   or (need_tokens, need_seq) != self._capacity)
        if rebuild:
            old_layout = self._layout
            native = self._make_native(dev, name, need_tokens, need_seq)
            layout = _Layout(native)
            data = p.detach()
            if layout.entries != old_layout.entries or layout.numel != data.numel() or data.data_ptr() % _ALIGN:
                new = _aligned_empty(layout.numel, p.dtype, dev, zero=True)
                with torch.no_grad():
                    for n in PARAM_NAMES:
                        layout.view(new, n).copy_(old_layout.view(data, n))
                self._layout = layout
                self._set_arena(new)
                p = new
            self.free_saved_memory()  # the old layer's kept objects (forwards in flight hold their own)
            self._native = None
            _set_stream(native.context, dev)
            native.bind_param_arena(p.data_ptr(), layout.arena_bytes, copy_current=False)
            self._attach(native, layout, p.data_ptr())
        elif p.data_ptr() != self._bound_ptr:
            if p.data_ptr() % _ALIGN or not p.is_contiguous():
                new = _aligned_empty(self._layout.numel, p.dtype, dev, zero=False)
                with torch.no_grad():
                    new.copy_(p)
                self._set_arena(new)
                p = new
            _set_stream(self._native.context, dev)
            self._native.bind_param_arena(p.data_ptr(), self._layout.arena_bytes, copy_current=False)
            self._bound_ptr = p.data_ptr()
        return self._native

    @property
    def native(self) -> Layer:
        """The :class:`dstransformer.Layer` that runs this module (bound to the parameter arena,
        :attr:`flat_params`)."""
        return self._sync_native()

    # ---- running ------------------------------------------------------------------------------------
    def _prepare_mask(self, mask: Optional[torch.Tensor], B: int, S: int, dev: torch.device,
                      dtype: torch.dtype) -> Optional[torch.Tensor]:
        """The mask as the library takes it: additive float ``[B, 1, 1, S]``/``[B, S]`` (fp32 or the layer
        dtype), or int32 key lengths ``[B]``. A Hugging Face integer ``[B, S]`` mask (1 attend, 0 padding)
        becomes the additive mask DeepSpeed's users build from it: 0 where it is non-zero, -10000 where 0."""
        if mask is None:
            return None
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"attention_mask must be a torch.Tensor or None, got {type(mask).__name__}")
        if mask.device != dev:
            raise ValueError(f"attention_mask is on {mask.device}, hidden_states on {dev}")
        shape = tuple(mask.shape)
        if mask.dtype == torch.bool:
            raise TypeError(
                "attention_mask: boolean masks are ambiguous (True means 'attend' to some APIs, 'masked' to "
                "others); pass Hugging Face's integer mask (1 attend, 0 padding, [B, S]: mask.long()), an "
                "additive float mask (0 attend, -10000 masked; [B, 1, 1, S] or [B, S]: "
                "(1.0 - mask.float()) * -10000.0), or int32 key lengths [B] (mask.sum(-1).int())")
        if not mask.is_floating_point():
            if shape == (B, S):  # Hugging Face's attention_mask
                additive = torch.zeros(shape, dtype=torch.float32, device=dev)
                return additive.masked_fill_(mask.detach() == 0, _MASKED)
            if shape != (B,):
                raise ValueError(
                    f"attention_mask: an integer mask is Hugging Face's [B, S] = {(B, S)} (1 attend, 0 padding) "
                    f"or key lengths [B] = ({B},), got {shape}; for DeepSpeed's extended [B, 1, 1, S] form "
                    "pass it as an additive float mask")
            return mask.detach().to(torch.int32).contiguous()
        if shape not in ((B, 1, 1, S), (B, S)):
            raise ValueError(f"attention_mask: shape {shape}, expected [B, 1, 1, S] = {(B, 1, 1, S)} "
                             f"or [B, S] = {(B, S)} (an additive key mask)")
        mask = mask.detach()
        if mask.dtype not in (torch.float32, dtype):
            mask = mask.to(torch.float32)
        return mask.contiguous()

    def _native_mask(self, mask: Optional[torch.Tensor]):
        if mask is None:
            return None
        if mask.dtype == torch.int32:
            return native_mask(_native.DST_MASK_KEY_LENGTHS, mask.data_ptr(), _native.DST_DTYPE_INT32, mask.shape)
        return native_mask(_native.DST_MASK_ADDITIVE, mask.data_ptr(), _DST_OF_TORCH[mask.dtype], mask.shape)

    def _run_forward(self, native: Layer, saved: Optional[SavedActivations], x: torch.Tensor,
                     mask, out: torch.Tensor) -> None:
        _set_stream(native.context, x.device)
        saved_h = None if saved is None else saved.handle
        if isinstance(mask, _Packed):
            native._run_forward_packed(saved_h, x.data_ptr(), x.shape[0], mask.cu.data_ptr(), mask.cu.numel() - 1,
                                       mask.max_seqlen, out.data_ptr())
            return
        B, S, _ = x.shape
        native._run_forward(saved_h, x.data_ptr(), B, S, self._native_mask(mask), out.data_ptr())

    def _backward_into(self, native: Layer, saved: SavedActivations, dy: torch.Tensor,
                       dx: torch.Tensor, packed: bool = False) -> torch.Tensor:
        p = self._arena
        if p.dtype != dy.dtype:
            raise RuntimeError(f"TransformerLayer: parameters changed dtype ({p.dtype}) between forward and "
                               f"backward ({dy.dtype})")
        grad = _aligned_empty(p.numel(), p.dtype, dy.device, zero=True)
        _set_stream(native.context, dy.device)
        native.bind_grad_arena(grad.data_ptr(), grad.numel() * grad.element_size())
        if packed:
            native._run_backward_packed(saved.handle, dy.data_ptr(), dy.shape[0], dx.data_ptr(), False)
        else:
            B, S, _ = dy.shape
            native._run_backward(saved.handle, dy.data_ptr(), B, S, dx.data_ptr(), False)
        self._last_grad_buf = grad  # keeps the memory the native layer points at alive
        return grad

    def forward(self, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                head_mask=None, layer_head_mask=None, encoder_hidden_states=None,
                encoder_attention_mask=None, past_key_value=None, output_attentions=False, grads=None,
                cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None):
        """``hidden_states`` [B, S, H] in the layer dtype; ``attention_mask`` None, additive [B, 1, 1, S]
        or [B, S] (fp32 or the layer dtype; other float dtypes are converted), Hugging Face's integer
        [B, S] mask (1 attend, 0 padding; converted to the additive form), or integer key lengths [B].
        The Hugging Face extras are accepted and ignored, as in DeepSpeed.

        ``grads``: DeepSpeed's test hook. A list (anything with ``append``): when this call's backward
        runs, ``[gradient, name]`` is appended for each parameter, in the order of
        :data:`GRAD_HOOK_NAMES` ("V_W", "V_B", "O_W", "O_B", "N2_W", "N2_B", "int_W", "int_B", "out_W",
        "out_B", "norm_W", "norm_B"; V_W/V_B are the V rows of ``attn_qkvw``/``attn_qkvb``). The tensors
        are copies of this call's gradients. Nothing is appended for a call that has no backward.

        Packed sequences: with ``cu_seqlens`` (integer [B + 1], on the layer's device), ``hidden_states`` is
        [N, H] holding B sequences end to end, sequence b in rows ``cu_seqlens[b]`` .. ``cu_seqlens[b+1] - 1``,
        and the output is [N, H]: each row as the padded layer with key lengths gives it (the library's
        dst_layer_forward_packed). ``attention_mask`` must then be None. ``max_seqlen`` (at least every
        length) is read from the offsets when omitted, which waits for the device on CUDA."""
        if grads is not None:
            if not callable(getattr(grads, "append", None)):
                raise TypeError(f"grads must be a list (or have an append method), got {type(grads).__name__}")
            if not any(q.requires_grad for q in self._params()):
                raise RuntimeError("grads= collects the parameters' gradients, but none of the layer's parameters "
                                   "requires grad (DeepSpeed's hooks fail in the same case)")
        x = hidden_states
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"hidden_states must be a torch.Tensor, got {type(x).__name__}")
        if cu_seqlens is not None:
            return self._forward_packed(x, cu_seqlens, max_seqlen, attention_mask, grads)
        if x.dim() != 3:
            raise ValueError(f"hidden_states: shape {tuple(x.shape)}, expected [B, S, H]")
        B, S, H = x.shape
        if H != int(self.config.hidden_size):
            raise ValueError(f"hidden_states: last dimension is {H}, expected hidden_size {self.config.hidden_size}")
        self._check_input_place(x)
        native = self._sync_native(B, S)
        x = x.contiguous()
        mask = self._prepare_mask(attention_mask, B, S, x.device, x.dtype)
        return self._apply_layer(native, x, mask, grads)

    def _forward_packed(self, x: torch.Tensor, cu_seqlens, max_seqlen, attention_mask, grads):
        if attention_mask is not None:
            raise ValueError("attention_mask must be None with cu_seqlens (the offsets define the sequences)")
        if x.dim() != 2 or x.shape[1] != int(self.config.hidden_size) or x.shape[0] < 1:
            raise ValueError(f"hidden_states: shape {tuple(x.shape)}, expected [N, {self.config.hidden_size}] "
                             "(packed tokens) with cu_seqlens")
        self._check_input_place(x)
        cu = torch.as_tensor(cu_seqlens)
        if cu.dim() != 1 or cu.numel() < 2 or cu.dtype.is_floating_point or cu.dtype == torch.bool:
            raise ValueError(f"cu_seqlens: expected integer offsets [B + 1] with B >= 1, got {cu.dtype} "
                             f"{tuple(cu.shape)}")
        cu = cu.to(device=x.device, dtype=torch.int32).contiguous()
        if max_seqlen is None:
            if _capturing(x):
                raise RuntimeError("TransformerLayer: pass max_seqlen with cu_seqlens while capturing a CUDA graph "
                                   "(reading it from the offsets waits for the device, which ends the capture)")
            max_seqlen = int((cu[1:] - cu[:-1]).max())
        B, S = cu.numel() - 1, int(max_seqlen)
        native = self._sync_native(B, max(S, 1))
        x = x.contiguous()
        packed = _Packed(cu, S)
        return self._apply_layer(native, x, packed, grads)

    def _check_input_place(self, x: torch.Tensor) -> None:
        self._repack()
        p = self._arena
        if x.device != p.device:
            raise ValueError(f"hidden_states is on {x.device}, the layer's parameters on {p.device}")
        if x.dtype != p.dtype:
            raise TypeError(f"hidden_states: dtype {x.dtype}, expected {p.dtype} (the layer dtype)")

    def _apply_layer(self, native: Layer, x: torch.Tensor, mask, grads):
        """Runs the native layer on a checked, contiguous input: through autograd when a gradient is wanted,
        directly otherwise; dropout on only in training mode with gradients enabled, as in DeepSpeed.
        ``mask`` is a mask tensor, None, or the offsets of a packed call."""
        training = bool(self.training and torch.is_grad_enabled())
        if self._native_training != training:
            native.train(training)
            self._native_training = training
        params = self._params()
        if torch.is_grad_enabled() and (x.requires_grad or any(q.requires_grad for q in params)):
            out = _TransformerFunction.apply(x, mask, self, native, training, grads, *params)
        else:
            out = torch.empty_like(x)
            self._run_forward(native, None, x, mask, out)
        return (out,) if self.config.return_tuple else out

    # ---- parameters under DeepSpeed's names ---------------------------------------------------------------
    def param_view(self, name: str) -> torch.Tensor:
        """A detached view of one parameter inside the arena (in-place edits reach the layer)."""
        if name not in self._layout.entries:
            raise KeyError(f"unknown parameter {name!r}; expected one of {', '.join(PARAM_NAMES)}")
        return self._layout.view(self.flat_params.detach(), name)

    def param_grad(self, name: str) -> Optional[torch.Tensor]:
        """The gradient of one parameter, ``getattr(layer, name).grad`` (None before a backward)."""
        if name not in self._layout.entries:
            raise KeyError(f"unknown parameter {name!r}; expected one of {', '.join(PARAM_NAMES)}")
        return self._params()[PARAM_NAMES.index(name)].grad

    def named_views(self) -> Dict[str, torch.Tensor]:
        return {n: self.param_view(n) for n in PARAM_NAMES}

    def __setattr__(self, name: str, value: Any) -> None:
        if name in PARAM_NAMES and "_layout" in self.__dict__:
            with torch.no_grad():
                self.param_view(name).copy_(value.detach() if isinstance(value, torch.Tensor) else torch.as_tensor(value))
            return
        super().__setattr__(name, value)

    def _load_initial(self, weights: Optional[list], biases: Optional[list]) -> None:
        if weights is None or biases is None or len(weights) != 8 or len(biases) != 8:
            raise ValueError("initial_weights and initial_biases must both be lists of 8 tensors "
                             "(q, k, v, attn_ow, attn_nw, inter_w, output_w, norm_w and the matching biases)")
        w = [t.detach() for t in weights]
        b = [t.detach() for t in biases]
        with torch.no_grad():
            self.param_view("attn_qkvw").copy_(torch.cat((w[0], w[1], w[2]), 0))
            self.param_view("attn_qkvb").zero_()  # DeepSpeed ignores biases[0..2] and zeroes the QKV bias
            pairs = (("attn_ow", w[3]), ("attn_ob", b[3]), ("attn_nw", w[4]), ("attn_nb", b[4]),
                     ("inter_w", w[5]), ("inter_b", b[5]), ("output_w", w[6]), ("output_b", b[6]),
                     ("norm_w", w[7]), ("norm_b", b[7]))
            for name, t in pairs:
                self.param_view(name).copy_(t)

    def init_transformer_weights(self, adjust_init_range: bool = False) -> None:
        """Re-draws the weights from torch's RNG as DeepSpeed does: N(0, initializer_range), the two output
        projections with initializer_range / sqrt(2·num_hidden_layers) when ``adjust_init_range``; biases
        0, LayerNorm γ 1, β 0."""
        std = float(self.config.initializer_range)
        out_std = std / math.sqrt(2.0 * int(self.config.num_hidden_layers)) if adjust_init_range else std
        with torch.no_grad():
            v = self.named_views()
            v["attn_qkvw"].normal_(0.0, std)
            v["inter_w"].normal_(0.0, std)
            v["attn_ow"].normal_(0.0, out_std)
            v["output_w"].normal_(0.0, out_std)
            for n in ("attn_qkvb", "attn_ob", "attn_nb", "inter_b", "output_b", "norm_b"):
                v[n].zero_()
            v["attn_nw"].fill_(1.0)
            v["norm_w"].fill_(1.0)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        self._repack()
        for n, p in zip(PARAM_NAMES, self._params()):
            destination[prefix + n] = p if keep_vars else p.detach()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        flat_key = prefix + "flat_params"
        if flat_key in state_dict and not any(prefix + n in state_dict for n in PARAM_NAMES):
            src = state_dict[flat_key]
            arena = self.flat_params
            if src.numel() != arena.numel():
                error_msgs.append(f"size mismatch for {flat_key}: {src.numel()} elements in the checkpoint, "
                                  f"{arena.numel()} in the layer")
            else:
                with torch.no_grad():
                    arena.copy_(src.reshape(-1))
        else:
            for n in PARAM_NAMES:
                key = prefix + n
                if key not in state_dict:
                    missing_keys.append(key)
                    continue
                src = state_dict[key]
                dst = self.param_view(n)
                if tuple(src.shape) != tuple(dst.shape):
                    error_msgs.append(f"size mismatch for {key}: copying a param with shape {tuple(src.shape)} "
                                      f"from checkpoint, the shape in current model is {tuple(dst.shape)}.")
                    continue
                with torch.no_grad():
                    dst.copy_(src)
        if strict:
            allowed = set(PARAM_NAMES) | {"flat_params"}
            for key in state_dict:
                if key.startswith(prefix):
                    rest = key[len(prefix):].split(".", 1)[0]
                    if rest not in allowed and rest not in self._modules:
                        unexpected_keys.append(key)

    def _take_saved(self, native: Layer, graph: bool = False) -> SavedActivations:
        """A SavedActivations for one training forward of `native`: one a backward kept (the forward
        reuses its memory when large enough instead of allocating), else a new one. With `graph` (the
        forward is being captured into a CUDA graph, where nothing can be allocated) it must be a kept
        one, and it becomes the graph's: listed in ``_graph_saved``, never handed to another forward."""
        while self._saved_pool:
            saved = self._saved_pool.pop()
            if saved.layer is native and not native.closed:
                if graph:
                    self._graph_saved.append(saved)
                return saved
            saved.close()
        if graph:
            raise RuntimeError(
                "TransformerLayer: a training forward captured into a CUDA graph needs saved-activation memory "
                "that an earlier eager backward of this layer kept (nothing can be allocated while capturing): "
                "run a training step of the same shape (forward and backward) before capturing, as "
                "torch.cuda.make_graphed_callables' warm-up does, once per graph that captures this layer")
        return SavedActivations(native)

    #: False: every backward destroys its forward's object (what 0.1.0 did before keeping them; the
    #: benchmark bench/torch_module.py times both).
    _keep_saved_objects = True

    def _keep_saved(self, native: Layer, saved: SavedActivations) -> None:
        """Keeps the object of a finished backward, memory and all, for the next training forward."""
        if native is self._native and self._keep_saved_objects:
            self._saved_pool.append(saved)
        else:  # the native layer was rebuilt since that forward
            saved.close()

    def free_saved_memory(self, graphs: bool = False) -> None:
        """Frees the memory of the saved activations that finished backwards kept for the next training
        forward. Each backward keeps its forward's saved-activations object, memory included, because
        freeing device memory makes the device wait (cudaFree synchronises): after training, this gives
        that memory back. With ``graphs=True`` it also frees the objects of forwards captured into CUDA
        graphs, which their replays use: call it so only once those graphs are no longer replayed."""
        pool, self._saved_pool = self._saved_pool, []
        if graphs:
            pool, self._graph_saved = pool + self._graph_saved, []
        for saved in pool:
            saved.close()

    # ---- modes, copies, pickling ----------------------------------------------------------------------
    def train(self, mode: bool = True) -> "TransformerLayer":
        """Switches dropout on (``train()``) or off (``eval()``), calling ``dst_layer_set_training``."""
        super().train(mode)
        if self._native is not None:
            self._native.train(bool(mode))
            self._native_training = bool(mode)
        self.config.training = bool(mode)
        return self

    def __deepcopy__(self, memo):
        self._repack()
        cls = type(self)
        new = cls.__new__(cls)
        memo[id(self)] = new
        skip = {"_native", "_last_grad_buf", "_bound_ptr", "_parameters", "_arena", *self._POOLS}
        for k, v in self.__dict__.items():
            if k in skip:
                continue
            object.__setattr__(new, k, copy.deepcopy(v, memo))
        # The copy gets its own arena, and parameters that view it (deep-copying each Parameter would
        # give twelve unrelated tensors). Gradients are not copied, as torch does not copy them.
        arena = self._arena.detach().clone()
        if arena.data_ptr() % _ALIGN:
            aligned = _aligned_empty(arena.numel(), arena.dtype, arena.device, zero=False)
            aligned.copy_(arena)
            arena = aligned
        object.__setattr__(new, "_arena", arena)
        params = type(self._parameters)()
        for n, p in self._parameters.items():
            q = nn.Parameter(new._layout.view(arena, n), requires_grad=p.requires_grad)
            memo[id(p)] = q
            params[n] = q
        object.__setattr__(new, "_parameters", params)
        object.__setattr__(new, "_native", None)
        for k in self._POOLS:
            object.__setattr__(new, k, [])
        object.__setattr__(new, "_last_grad_buf", None)
        object.__setattr__(new, "_bound_ptr", None)
        object.__setattr__(new, "_native_training", None)
        return new

    def __getstate__(self):
        state = dict(self.__dict__)
        for k in ("_native", "_last_grad_buf", "_bound_ptr", "_native_training"):
            state[k] = None
        state.update({k: [] for k in self._POOLS})
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        for k in self._POOLS:  # a module pickled before the pools existed
            self.__dict__.setdefault(k, [])

    def extra_repr(self) -> str:
        c = self.config
        return (f"layer_id={self._my_layer_id}, hidden_size={c.hidden_size}, heads={c.heads}, "
                f"intermediate_size={self._layout.entries['inter_b'][1]}, dtype={self._dtype_name}, "
                f"{'pre' if c.pre_layer_norm else 'post'}_layer_norm, device={self._device}")


#: DeepSpeed's names, for code that does ``from dstransformer.torch import DeepSpeedTransformerLayer``.
DeepSpeedTransformerConfig = TransformerConfig
DeepSpeedTransformerLayer = TransformerLayer
