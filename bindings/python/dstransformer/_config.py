"""``LayerConfig``: DeepSpeed's ``DeepSpeedTransformerConfig`` fields plus the library's own."""

from __future__ import annotations

import copy
import json
from typing import Any, Dict, Optional

from . import _native

__all__ = ["LayerConfig", "DTYPES", "BACKENDS", "dtype_code", "dtype_name", "backend_code"]

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

# name -> default. Order: DeepSpeed's constructor, then the library's additions.
_FIELDS: Dict[str, Any] = {
    "batch_size": -1,
    "max_seq_length": int(_D.max_seq_len),
    "hidden_size": int(_D.hidden_size),
    "intermediate_size": -1,
    "heads": int(_D.heads),
    "attn_dropout_ratio": float(round(_D.attn_dropout_ratio, 7)),
    "hidden_dropout_ratio": float(round(_D.hidden_dropout_ratio, 7)),
    "num_hidden_layers": int(_D.num_hidden_layers),
    "initializer_range": float(round(_D.initializer_range, 7)),
    "layer_norm_eps": 1e-12,
    "local_rank": -1,
    "seed": int(_D.seed),
    "fp16": False,
    "pre_layer_norm": bool(_D.pre_layer_norm),
    "normalize_invertible": bool(_D.normalize_invertible),
    "gelu_checkpoint": bool(_D.gelu_checkpoint),
    "adjust_init_range": bool(_D.adjust_init_range),
    "attn_dropout_checkpoint": bool(_D.attn_dropout_checkpoint),
    "stochastic_mode": bool(_D.stochastic_mode),
    "return_tuple": False,
    "training": bool(_D.training),
    # ours
    "dtype": None,
    "max_batch_tokens": None,
    "gelu": "erf",
    "causal": False,
    "allow_tf32": False,
}
_BOOL_FIELDS = {
    "fp16", "pre_layer_norm", "normalize_invertible", "gelu_checkpoint", "adjust_init_range",
    "attn_dropout_checkpoint", "stochastic_mode", "return_tuple", "training", "causal", "allow_tf32",
}
# DeepSpeed attributes that are not constructor arguments; from_dict accepts them.
_EXTRA_DS_ATTRS = ("layer_id", "test_gemm", "is_grad_enabled")


class LayerConfig:
    """Configuration of a layer, mirroring DeepSpeed's ``DeepSpeedTransformerConfig``.

    Every DeepSpeed constructor argument is accepted with the same meaning: ``batch_size``,
    ``hidden_size``, ``intermediate_size`` (≤ 0 means 4·hidden_size), ``heads``, ``attn_dropout_ratio``,
    ``hidden_dropout_ratio``, ``num_hidden_layers``, ``initializer_range``, ``layer_norm_eps``,
    ``local_rank``, ``seed`` (−1 means 2**64−1 as in DeepSpeed), ``fp16``, ``pre_layer_norm``,
    ``normalize_invertible``, ``gelu_checkpoint``, ``adjust_init_range``, ``attn_dropout_checkpoint``,
    ``stochastic_mode``, ``return_tuple``, ``training``; plus ``max_seq_length`` (the largest S of a call)
    and the library's own fields:

    - ``dtype``: "fp32", "fp16", "bf16" or "fp64"; default "fp16" when ``fp16`` is true, else "fp32".
    - ``max_batch_tokens``: the largest B·S of a call; default ``batch_size · max_seq_length`` when
      ``batch_size`` > 0, else the library's default (8192, raised to ``max_seq_length`` if smaller).
    - ``gelu``: "erf" (exact, Hugging Face BERT; default) or "tanh" (DeepSpeed's kernel).
    - ``causal``: causal attention. ``allow_tf32``: TF32 tensor cores for FP32 GEMMs (CUDA).

    Unlike DeepSpeed, defaults are the library's (hidden_size 1024, heads 16, dropouts 0.1, ...), not −1.
    The configuration is validated by the library (``dst_layer_config_validate``) when constructed,
    by :meth:`validate` and when a layer is created; an invalid value raises
    :class:`~dstransformer.InvalidArgumentError` with the library's message. Attributes may be changed
    after construction (DeepSpeed style); call :meth:`validate` to check them.
    """

    def __init__(self, **kwargs: Any):
        for name, default in _FIELDS.items():
            setattr(self, name, copy.copy(default))
        unknown = sorted(set(kwargs) - set(_FIELDS))
        if unknown:
            raise TypeError(f"LayerConfig got unexpected keyword argument(s): {', '.join(unknown)}")
        for name, value in kwargs.items():
            setattr(self, name, value)
        self.layer_id = None
        self.validate()

    # ---- DeepSpeed-compatible constructors ------------------------------------------------------
    @classmethod
    def from_dict(cls, json_object: Dict[str, Any]) -> "LayerConfig":
        """Builds a config from a dict. Like DeepSpeed, keys that are not constructor arguments are
        kept as attributes (and returned by :meth:`to_dict`); the result is validated."""
        known = {k: v for k, v in json_object.items() if k in _FIELDS}
        config = cls.__new__(cls)
        for name, default in _FIELDS.items():
            setattr(config, name, copy.copy(default))
        config.layer_id = None
        for k, v in known.items():
            setattr(config, k, v)
        for k, v in json_object.items():
            if k not in _FIELDS:
                setattr(config, k, v)
        config.validate()
        return config

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
        c = _native.dst_layer_config()
        _native.dst_layer_config_default(c)

        def integer(name: str) -> int:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int,)) and not hasattr(v, "__index__"):
                raise TypeError(f"LayerConfig.{name} must be an int, got {v!r}")
            return int(v)

        def real(name: str) -> float:
            v = getattr(self, name)
            try:
                return float(v)
            except (TypeError, ValueError):
                raise TypeError(f"LayerConfig.{name} must be a number, got {v!r}") from None

        def i32(name: str, value: int) -> int:
            if not -(1 << 31) <= value < (1 << 31):
                raise ValueError(f"LayerConfig.{name} is {value}, out of the int32 range")
            return value

        c.hidden_size = i32("hidden_size", integer("hidden_size"))
        c.heads = i32("heads", integer("heads"))
        inter = integer("intermediate_size")
        c.intermediate_size = 0 if inter <= 0 else i32("intermediate_size", inter)
        c.attn_dropout_ratio = real("attn_dropout_ratio")
        c.hidden_dropout_ratio = real("hidden_dropout_ratio")
        c.num_hidden_layers = i32("num_hidden_layers", integer("num_hidden_layers"))
        c.initializer_range = real("initializer_range")
        c.layer_norm_eps = real("layer_norm_eps")
        c.seed = (integer("seed") + int(seed_offset)) & _U64
        c.pre_layer_norm = int(bool(self.pre_layer_norm))
        c.normalize_invertible = int(bool(self.normalize_invertible))
        c.gelu_checkpoint = int(bool(self.gelu_checkpoint))
        c.attn_dropout_checkpoint = int(bool(self.attn_dropout_checkpoint))
        c.adjust_init_range = int(bool(self.adjust_init_range))
        c.stochastic_mode = int(bool(self.stochastic_mode))
        c.training = int(bool(self.training))
        c.dtype = DTYPES[self.resolved_dtype]
        mbt = self.resolved_max_batch_tokens
        if not -(1 << 63) <= mbt < (1 << 63):
            raise ValueError(f"LayerConfig.max_batch_tokens is {mbt}, out of the int64 range")
        c.max_batch_tokens = mbt
        c.max_seq_len = i32("max_seq_length", integer("max_seq_length"))
        gelu = str(self.gelu).lower()
        if gelu not in _GELU:
            raise ValueError(f"LayerConfig.gelu is {self.gelu!r}, expected 'erf' or 'tanh'")
        c.gelu = _GELU[gelu]
        c.causal = int(bool(self.causal))
        c.allow_tf32 = int(bool(self.allow_tf32))
        return c

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
        name = dtype_name(int(c.dtype))
        cfg.hidden_size = int(c.hidden_size)
        cfg.heads = int(c.heads)
        cfg.intermediate_size = int(c.intermediate_size)
        cfg.attn_dropout_ratio = float(round(c.attn_dropout_ratio, 7))
        cfg.hidden_dropout_ratio = float(round(c.hidden_dropout_ratio, 7))
        cfg.num_hidden_layers = int(c.num_hidden_layers)
        cfg.initializer_range = float(round(c.initializer_range, 7))
        cfg.layer_norm_eps = float(c.layer_norm_eps) if base is None else base.layer_norm_eps
        if base is None:
            cfg.seed = int(c.seed)
        cfg.pre_layer_norm = bool(c.pre_layer_norm)
        cfg.normalize_invertible = bool(c.normalize_invertible)
        cfg.gelu_checkpoint = bool(c.gelu_checkpoint)
        cfg.attn_dropout_checkpoint = bool(c.attn_dropout_checkpoint)
        cfg.adjust_init_range = bool(c.adjust_init_range)
        cfg.stochastic_mode = bool(c.stochastic_mode)
        cfg.training = bool(c.training)
        cfg.dtype = name
        cfg.fp16 = name == "fp16"
        cfg.max_batch_tokens = int(c.max_batch_tokens)
        cfg.max_seq_length = int(c.max_seq_len)
        cfg.gelu = "tanh" if int(c.gelu) == _native.DST_GELU_TANH else "erf"
        cfg.causal = bool(c.causal)
        cfg.allow_tf32 = bool(c.allow_tf32)
        return cfg
