"""``LayerConfig``: DeepSpeed's ``DeepSpeedTransformerConfig`` fields plus the library's own."""

from __future__ import annotations

import copy
import json
from typing import Any, Dict, List, Optional

from . import _fields, _native

__all__ = ["LayerConfig", "TransformerConfig", "DTYPES", "BACKENDS", "dtype_code", "dtype_name", "backend_code"]

#: dtype names accepted everywhere, and their ``dst_dtype`` values.
DTYPES = {
    "fp32": _native.DST_DTYPE_FP32,
    "fp16": _native.DST_DTYPE_FP16,
    "bf16": _native.DST_DTYPE_BF16,
    "fp64": _native.DST_DTYPE_FP64,
}
_DTYPE_ALIASES = {
    "float32": "fp32", "float": "fp32", "f32": "fp32",
    "float16": "fp16", "half": "fp16", "f16": "fp16",
    "bfloat16": "bf16",
    "float64": "fp64", "double": "fp64", "f64": "fp64",
}
BACKENDS = {"auto": _native.DST_BACKEND_AUTO, "cpu": _native.DST_BACKEND_CPU, "cuda": _native.DST_BACKEND_CUDA}
_GELU = {"erf": _native.DST_GELU_ERF, "tanh": _native.DST_GELU_TANH}
_U64 = (1 << 64) - 1


def dtype_name(dtype: Any) -> str:
    """Normalises a dtype given as a name ("fp16", "float16", "bfloat16"...), a ``dst_dtype`` value,
    a NumPy dtype or a torch dtype to one of "fp32", "fp16", "bf16", "fp64"."""
    if isinstance(dtype, bool):
        raise TypeError(f"dtype must be a dtype name, got {dtype!r}")
    if isinstance(dtype, int):
        for k, v in DTYPES.items():
            if v == dtype:
                return k
        raise ValueError(f"dtype {dtype} is not a floating dst_dtype value")
    s = str(getattr(dtype, "name", dtype)).lower()
    if s.startswith("torch."):
        s = s[len("torch."):]
    s = _DTYPE_ALIASES.get(s, s)
    if s not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of 'fp32', 'fp16', 'bf16', 'fp64'")
    return s


def dtype_code(dtype: Any) -> int:
    return DTYPES[dtype_name(dtype)]


def backend_code(backend: Any) -> int:
    if isinstance(backend, int) and not isinstance(backend, bool):
        return backend
    b = str(backend).lower()
    if b not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of 'auto', 'cpu', 'cuda'")
    return BACKENDS[b]


def _c_defaults():
    c = _native.dst_layer_config()
    _native.dst_layer_config_default(c)
    return c


_D = _c_defaults()

# name -> default, in the order of LayerConfig's signature (DeepSpeed's constructor, then the library's
# additions); generated from the header with the signature below.
_FIELDS: Dict[str, Any] = {name: default for name, _c, _kind, default, _doc in _fields.LAYER_CONFIG_FIELDS}
_BOOL_FIELDS = {name for name, _c, kind, _d, _doc in _fields.LAYER_CONFIG_FIELDS if kind == "bool"}
# DeepSpeed attributes that are not constructor arguments; from_dict accepts them.
_EXTRA_DS_ATTRS = ("layer_id", "test_gemm", "is_grad_enabled")


class LayerConfig:
    """Configuration of a layer, mirroring DeepSpeed's ``DeepSpeedTransformerConfig``.

    Every DeepSpeed constructor argument is accepted (as a keyword) with the same meaning, plus
    ``max_seq_length`` (the largest S of a call) and the library's own fields (``dtype``,
    ``max_batch_tokens``, ``gelu``, ``causal``, ``allow_tf32``); the signature of the constructor lists
    them all with their defaults and meaning. Unlike DeepSpeed, the defaults are the library's
    (hidden_size 1024, heads 16, dropouts 0.1, ...), not −1; :class:`TransformerConfig` (also
    ``dstransformer.torch.DeepSpeedTransformerConfig``) has DeepSpeed's positional order and −1 defaults.

    The configuration is validated by the library (``dst_layer_config_validate``) when constructed, by
    :meth:`validate` and when a layer is created; an invalid value raises
    :class:`~dstransformer.InvalidArgumentError` with the library's message. Attributes may be changed
    after construction (DeepSpeed style); call :meth:`validate` to check them.
    """

    # BEGIN GENERATED LayerConfig.__init__ (bindings/gen_fields.py from dstransformer.h; do not edit)
    def __init__(self, *, batch_size: int = -1, hidden_size: int = 1024, intermediate_size: int = -1,
                 heads: int = 16, attn_dropout_ratio: float = 0.1, hidden_dropout_ratio: float = 0.1,
                 num_hidden_layers: int = 24, initializer_range: float = 0.02, layer_norm_eps: float = 1e-12,
                 local_rank: int = -1, seed: int = 42, fp16: bool = False, pre_layer_norm: bool = True,
                 normalize_invertible: bool = False, gelu_checkpoint: bool = False,
                 adjust_init_range: bool = True, attn_dropout_checkpoint: bool = False,
                 stochastic_mode: bool = False, return_tuple: bool = False, training: bool = True,
                 dtype: Optional[str] = None, max_batch_tokens: Optional[int] = None, max_seq_length: int = 512,
                 gelu: str = 'erf', causal: bool = False, allow_tf32: bool = False) -> None:
        """A configuration; every argument is a keyword (DeepSpeed's arguments and the library's
        own). The defaults are the library's; the configuration is validated at once.

        - batch_size: DeepSpeed's batch size; only sizes the default ``max_batch_tokens``. Default -1.
        - hidden_size: H, the model width. Default 1024.
        - intermediate_size: FFN width I; ≤ 0 means 4·H (DeepSpeed's convention). Default -1.
        - heads: Attention heads; must divide H. Default 16.
        - attn_dropout_ratio: Dropout on attention probabilities, in [0, 1). Default 0.1.
        - hidden_dropout_ratio: Dropout on both sub-layer outputs, in [0, 1). Default 0.1.
        - num_hidden_layers: Layers in the model (for the init rule). Default 24.
        - initializer_range: Std. deviation of weight init. Default 0.02.
        - layer_norm_eps: LayerNorm ε, added to the variance. Default 1e-12.
        - local_rank: The PyTorch drop-in's device: ≥ 0 runs on ``cuda:local_rank`` (an error when no CUDA
          device is usable); −1 on the current CUDA device, else on the CPU. Default -1.
        - seed: Seed of the initial weights (Philox key); −1 means 2**64 − 1, as in DeepSpeed. Default 42.
        - fp16: Store parameters and activations in fp16 (same as ``dtype="fp16"``). Default False.
        - pre_layer_norm: Pre-LN (true) or Post-LN (false). Default True.
        - normalize_invertible: LayerNorm backward from its output; drops LN inputs. Default False.
        - gelu_checkpoint: Keep only the pre-GELU value; recompute GELU. Default False.
        - adjust_init_range: Scale the output-projection init by 1/sqrt(2·layers). Default True.
        - attn_dropout_checkpoint: Accepted for DeepSpeed configs; has no effect: attention is fused and
          never keeps anything S×S (docs/memory.md). Default False.
        - stochastic_mode: Allow non-deterministic fast paths (CUDA: the attention backward adds its partial
          dQs in arrival order instead of a fixed order; results then differ in the last bits from run to
          run). Default False.
        - return_tuple: Forward returns ``(output,)`` instead of ``output``. Default False.
        - training: Initial mode: training (dropout, saved state) or inference. Default True.
        - dtype: Storage type: "fp32", "fp16", "bf16" or "fp64"; None: "fp16" when ``fp16``, else "fp32".
          Default None.
        - max_batch_tokens: Largest B·S of any call; None: ``batch_size · max_seq_length`` when
          ``batch_size`` > 0, else the library's default (8192, raised to ``max_seq_length`` if smaller).
          Default None.
        - max_seq_length: Largest S of any call. Default 512.
        - gelu: GELU form: "erf" (exact, Hugging Face BERT) or "tanh" (DeepSpeed's kernel). Default 'erf'.
        - causal: Causal attention (query i sees keys ≤ i). Default False.
        - allow_tf32: Let FP32 GEMMs use TF32 tensor cores (CUDA). Default False.
        """
        self._assign(locals(), validate=True)
    # END GENERATED LayerConfig.__init__

    def _assign(self, values: Dict[str, Any], validate: bool) -> None:
        """Sets every field from ``values`` (the constructor's locals), then validates."""
        for name in _FIELDS:
            setattr(self, name, copy.copy(values[name]))
        self.layer_id = None
        if validate:
            self.validate()

    @classmethod
    def _defaults(cls) -> Dict[str, Any]:
        return dict(_FIELDS)

    def _check_required(self) -> None:
        """Raises when a field has no usable value (nothing is required here; see TransformerConfig)."""

    # ---- DeepSpeed-compatible constructors ------------------------------------------------------
    @classmethod
    def from_dict(cls, json_object: Dict[str, Any]) -> "LayerConfig":
        """Builds a config from a dict. Like DeepSpeed, keys that are not constructor arguments are
        kept as attributes (and returned by :meth:`to_dict`); the result is validated."""
        config = cls.__new__(cls)
        config._assign(cls._defaults(), validate=False)
        for k, v in json_object.items():
            setattr(config, k, v)
        config._validate_when_complete()
        return config

    def _validate_when_complete(self) -> None:
        self.validate()

    @classmethod
    def from_json_file(cls, json_file: str) -> "LayerConfig":
        """Reads a JSON file (UTF-8, or UTF-16 with a byte-order mark as DeepSpeed writes them)."""
        with open(json_file, "rb") as f:
            raw = f.read()
        if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
            text = raw.decode("utf-16")
        else:
            text = raw.decode("utf-8-sig")
        return cls.from_dict(json.loads(text))

    def to_dict(self) -> Dict[str, Any]:
        """All fields (and any extra attribute set through :meth:`from_dict`) as a plain dict."""
        d = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        if d.get("layer_id") is None:
            d.pop("layer_id", None)
        return copy.deepcopy(d)

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items())
        return f"{type(self).__name__}({items})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LayerConfig) and self.to_dict() == other.to_dict()

    def copy(self) -> "LayerConfig":
        return copy.deepcopy(self)

    # ---- resolved values ----------------------------------------------------------------------
    @property
    def resolved_dtype(self) -> str:
        """The storage dtype the layer gets ("fp32", "fp16", "bf16" or "fp64")."""
        if self.dtype is None:
            return "fp16" if self.fp16 else "fp32"
        name = dtype_name(self.dtype)
        if self.fp16 and name != "fp16":
            raise ValueError(f"LayerConfig: fp16=True conflicts with dtype={self.dtype!r}")
        return name

    @property
    def resolved_max_batch_tokens(self) -> int:
        if self.max_batch_tokens is not None:
            return int(self.max_batch_tokens)
        if self.batch_size is not None and int(self.batch_size) > 0:
            return int(self.batch_size) * int(self.max_seq_length)
        return max(int(_D.max_batch_tokens), int(self.max_seq_length))

    def to_native(self, seed_offset: int = 0):
        """The configuration as a ``dst_layer_config`` struct of the raw module. ``seed_offset`` is added
        (mod 2**64) to the weight seed."""
        self._check_required()
        c = _native.dst_layer_config()
        _native.dst_layer_config_default(c)

        def integer(name: str) -> int:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int,)) and not hasattr(v, "__index__"):
                raise TypeError(f"{type(self).__name__}.{name} must be an int, got {v!r}")
            return int(v)

        def real(name: str) -> float:
            v = getattr(self, name)
            try:
                return float(v)
            except (TypeError, ValueError):
                raise TypeError(f"{type(self).__name__}.{name} must be a number, got {v!r}") from None

        def ranged(name: str, value: int, bits: int) -> int:
            if not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
                raise ValueError(f"{type(self).__name__}.{name} is {value}, out of the int{bits} range")
            return value

        for name, cname, kind, _default, _doc in _fields.LAYER_CONFIG_FIELDS:
            if not cname:
                continue  # Python-only (batch_size, local_rank, fp16, return_tuple)
            if name == "intermediate_size":
                value = integer(name)
                value = 0 if value <= 0 else ranged(name, value, 32)
            elif name == "seed":
                value = (integer(name) + int(seed_offset)) & _U64
            elif name == "max_batch_tokens":
                value = ranged(name, self.resolved_max_batch_tokens, 64)
            elif kind == "dtype":
                value = DTYPES[self.resolved_dtype]
            elif kind == "gelu":
                gelu = str(self.gelu).lower()
                if gelu not in _GELU:
                    raise ValueError(f"{type(self).__name__}.gelu is {self.gelu!r}, expected 'erf' or 'tanh'")
                value = _GELU[gelu]
            elif kind == "bool":
                value = int(bool(getattr(self, name)))
            elif kind == "float":
                value = real(name)
            elif kind == "int":
                value = ranged(name, integer(name), 32)
            else:  # i64, u64
                value = integer(name)
            setattr(c, cname, value)
        self._adjust_native(c)
        return c

    def _adjust_native(self, c) -> None:
        """A subclass's last word on the struct (TransformerConfig: an unused num_hidden_layers)."""

    def validate(self, backend: Any = "auto") -> "LayerConfig":
        """Checks the configuration with ``dst_layer_config_validate`` for a backend ("auto" checks the
        generic rules). Raises InvalidArgumentError / UnsupportedError with the library's message."""
        _native.dst_layer_config_validate(self.to_native(), backend_code(backend))
        return self

    def saved_bytes(self, batch: int, seq: int) -> int:
        """Bytes one training forward of B×S tokens keeps for backward (dst_layer_config_saved_bytes)."""
        return int(_native.dst_layer_config_saved_bytes(self.to_native(), int(batch), int(seq)))

    def workspace_bytes(self, batch: int, seq: int) -> int:
        """Workspace bytes a call of B×S tokens needs (dst_layer_config_workspace_bytes)."""
        return int(_native.dst_layer_config_workspace_bytes(self.to_native(), int(batch), int(seq)))

    @classmethod
    def from_native(cls, c, base: Optional["LayerConfig"] = None) -> "LayerConfig":
        """A LayerConfig from a ``dst_layer_config`` struct; Python-only fields (batch_size, local_rank,
        return_tuple, ...) are taken from ``base`` when given."""
        cfg = cls.__new__(cls)
        src = base.to_dict() if base is not None else dict(_FIELDS)
        for k, v in src.items():
            setattr(cfg, k, v)
        if not hasattr(cfg, "layer_id"):
            cfg.layer_id = None
        for name, cname, kind, _default, _doc in _fields.LAYER_CONFIG_FIELDS:
            if not cname:
                continue
            v = getattr(c, cname)
            if kind == "bool":
                v = bool(v)
            elif kind == "float":
                v = float(round(v, 7))
            elif kind == "dtype":
                v = dtype_name(int(v))
            elif kind == "gelu":
                v = "tanh" if int(v) == _native.DST_GELU_TANH else "erf"
            else:
                v = int(v)
            if base is not None and name in ("layer_norm_eps", "seed"):
                continue  # the Python value (exact ε, the seed before its per-layer offset) is kept
            setattr(cfg, name, v)
        if base is None:
            cfg.layer_norm_eps = float(c.layer_norm_eps)
        cfg.fp16 = cfg.dtype == "fp16"
        return cfg


class TransformerConfig(LayerConfig):
    """``DeepSpeedTransformerConfig``: DeepSpeed's arguments in its positional order, with its defaults.

    The sizes DeepSpeed leaves at −1 (``hidden_size``, ``heads``, ``attn_dropout_ratio``,
    ``hidden_dropout_ratio``, ``initializer_range`` and, when ``adjust_init_range`` is on,
    ``num_hidden_layers``) have no usable value: a configuration may be built without them and completed
    attribute by attribute (as DeepSpeed's own tests do), but making a layer, :meth:`validate` and the
    size queries raise a ``ValueError`` naming every field still unset. Once they are all set, the
    constructor validates like :class:`LayerConfig`'s. The library's own fields follow as keywords
    (``max_seq_length``, ``dtype``, ``max_batch_tokens``, ``gelu``, ``causal``, ``allow_tf32``).
    ``dstransformer.torch`` exports it under both names.
    """

    # BEGIN GENERATED TransformerConfig.__init__ (bindings/gen_fields.py from dstransformer.h; do not edit)
    def __init__(self, batch_size: int = -1, hidden_size: int = -1, intermediate_size: int = -1,
                 heads: int = -1, attn_dropout_ratio: float = -1, hidden_dropout_ratio: float = -1,
                 num_hidden_layers: int = -1, initializer_range: float = -1, layer_norm_eps: float = 1e-12,
                 local_rank: int = -1, seed: int = -1, fp16: bool = False, pre_layer_norm: bool = True,
                 normalize_invertible: bool = False, gelu_checkpoint: bool = False,
                 adjust_init_range: bool = True, attn_dropout_checkpoint: bool = False,
                 stochastic_mode: bool = False, return_tuple: bool = False, training: bool = True, *,
                 dtype: Optional[str] = None, max_batch_tokens: Optional[int] = None, max_seq_length: int = 512,
                 gelu: str = 'erf', causal: bool = False, allow_tf32: bool = False) -> None:
        """``DeepSpeedTransformerConfig``'s arguments, in its positional order and with its
        defaults, then the library's own (keywords). As in DeepSpeed, the sizes left at −1
        (hidden_size, heads, attn_dropout_ratio, hidden_dropout_ratio, initializer_range, num_hidden_layers)
        must be set before a layer is made: the layer raises otherwise.

        - batch_size: DeepSpeed's batch size; only sizes the default ``max_batch_tokens``. Default -1.
        - hidden_size: H, the model width. Default -1.
        - intermediate_size: FFN width I; ≤ 0 means 4·H (DeepSpeed's convention). Default -1.
        - heads: Attention heads; must divide H. Default -1.
        - attn_dropout_ratio: Dropout on attention probabilities, in [0, 1). Default -1.
        - hidden_dropout_ratio: Dropout on both sub-layer outputs, in [0, 1). Default -1.
        - num_hidden_layers: Layers in the model (for the init rule). Default -1.
        - initializer_range: Std. deviation of weight init. Default -1.
        - layer_norm_eps: LayerNorm ε, added to the variance. Default 1e-12.
        - local_rank: The PyTorch drop-in's device: ≥ 0 runs on ``cuda:local_rank`` (an error when no CUDA
          device is usable); −1 on the current CUDA device, else on the CPU. Default -1.
        - seed: Seed of the initial weights (Philox key); −1 means 2**64 − 1, as in DeepSpeed. Default -1.
        - fp16: Store parameters and activations in fp16 (same as ``dtype="fp16"``). Default False.
        - pre_layer_norm: Pre-LN (true) or Post-LN (false). Default True.
        - normalize_invertible: LayerNorm backward from its output; drops LN inputs. Default False.
        - gelu_checkpoint: Keep only the pre-GELU value; recompute GELU. Default False.
        - adjust_init_range: Scale the output-projection init by 1/sqrt(2·layers). Default True.
        - attn_dropout_checkpoint: Accepted for DeepSpeed configs; has no effect: attention is fused and
          never keeps anything S×S (docs/memory.md). Default False.
        - stochastic_mode: Allow non-deterministic fast paths (CUDA: the attention backward adds its partial
          dQs in arrival order instead of a fixed order; results then differ in the last bits from run to
          run). Default False.
        - return_tuple: Forward returns ``(output,)`` instead of ``output``. Default False.
        - training: Initial mode: training (dropout, saved state) or inference. Default True.
        - dtype: Storage type: "fp32", "fp16", "bf16" or "fp64"; None: "fp16" when ``fp16``, else "fp32".
          Default None.
        - max_batch_tokens: Largest B·S of any call; None: ``batch_size · max_seq_length`` when
          ``batch_size`` > 0, else the library's default (8192, raised to ``max_seq_length`` if smaller).
          Default None.
        - max_seq_length: Largest S of any call. Default 512.
        - gelu: GELU form: "erf" (exact, Hugging Face BERT) or "tanh" (DeepSpeed's kernel). Default 'erf'.
        - causal: Causal attention (query i sees keys ≤ i). Default False.
        - allow_tf32: Let FP32 GEMMs use TF32 tensor cores (CUDA). Default False.
        """
        self._assign(locals(), validate=False)
    # END GENERATED TransformerConfig.__init__

    def _assign(self, values: Dict[str, Any], validate: bool) -> None:
        super()._assign(values, validate=False)
        self._validate_when_complete()

    @classmethod
    def _defaults(cls) -> Dict[str, Any]:
        d = dict(_FIELDS)
        for name, value in zip(_fields.DEEPSPEED_ORDER, _DS_DEFAULTS):
            d[name] = value
        return d

    def missing_fields(self) -> List[str]:
        """The DeepSpeed sizes still unset (None or negative), in DeepSpeed's order."""
        out = []
        for name in _fields.DEEPSPEED_REQUIRED:
            if name == "num_hidden_layers" and not self.adjust_init_range:
                continue  # read only by the init rule that adjust_init_range turns on
            v = getattr(self, name, None)
            if v is None or (not isinstance(v, bool) and isinstance(v, (int, float)) and v < 0):
                out.append(name)
        return out

    def _validate_when_complete(self) -> None:
        if not self.missing_fields():
            self.validate()

    def _check_required(self) -> None:
        missing = self.missing_fields()
        if missing:
            raise ValueError(
                f"{type(self).__name__}: {', '.join(missing)} not set (DeepSpeed's default is -1, which its "
                "layer cannot use either); pass them to the constructor or set the attributes before making "
                "a layer")

    def _adjust_native(self, c) -> None:
        if int(self.num_hidden_layers) < 0 and not self.adjust_init_range:
            c.num_hidden_layers = 1  # unused without adjust_init_range; the library wants a positive count


def _ds_defaults() -> tuple:
    import inspect

    sig = inspect.signature(TransformerConfig.__init__)
    return tuple(sig.parameters[n].default for n in _fields.DEEPSPEED_ORDER)


_DS_DEFAULTS = _ds_defaults()
