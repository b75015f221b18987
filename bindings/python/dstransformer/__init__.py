"""Python binding of libdstransformer, a fused BERT-style Transformer layer for training.

Main classes: :class:`Context` (backend, device, RNG state, stream), :class:`LayerConfig` (DeepSpeed's
``DeepSpeedTransformerConfig`` fields), :class:`Layer` (forward/backward on NumPy arrays on the CPU
backend or on device arrays on CUDA), :class:`SavedActivations`, :class:`Mask`; checkpoints with
:func:`save_checkpoint`, :func:`load_checkpoint`, :func:`convert` and :func:`describe_checkpoint`. The PyTorch drop-in for DeepSpeed's
``DeepSpeedTransformerLayer`` is in :mod:`dstransformer.torch` (imported on demand; this package does not
need torch). DeepSpeed's training entry points are here too: :func:`initialize` (the library's engine for
torch models; imports torch), :func:`add_config_arguments`, :func:`init_distributed` and
:class:`DeepSpeedConfig`, so that ``import dstransformer as deepspeed`` serves a DeepSpeed script. The raw SWIG module, a complete wrapping of the C API, is :mod:`dstransformer._native`.

Every failed library call raises a :class:`DstError` subclass carrying the library's message.
"""

from . import _native
from ._errors import (
    ERROR_CLASSES as _ERROR_CLASSES,
    BackendError,
    CapacityError,
    DstError,
    DstIOError,
    FormatError,
    InternalError,
    InvalidArgumentError,
    OutOfMemoryError,
    StateError,
    UnsupportedError,
)

_native.dstpy_register_errors(dict(_ERROR_CLASSES), DstError)

from ._arrays import DeviceArray, aligned_empty, bf16_numpy_dtype  # noqa: E402
from ._config import LayerConfig, TransformerConfig  # noqa: E402
from ._core import (  # noqa: E402
    PARAM_NAMES,
    Context,
    Layer,
    Mask,
    ParamInfo,
    SavedActivations,
    convert,
    cuda_device_count,
    describe_checkpoint,
    load_checkpoint,
    save_checkpoint,
)

from ._deepspeed import DeepSpeedConfig, add_config_arguments, init_distributed  # noqa: E402

__version__ = _native.dst_version_string()


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, distributed_port=29500, mpu=None, dist_init_required=None, collate_fn=None,
               config=None, mesh_param=None, config_params=None):
    """DeepSpeed's ``deepspeed.initialize`` for torch models, on the library's training engine:
    returns ``(engine, optimizer, training_dataloader, lr_scheduler)``. ``import dstransformer as
    deepspeed`` is enough for a DeepSpeed training script; see docs/python.md ("Training: the engine")
    and :class:`dstransformer._engine.DeepSpeedEngine`. Imports torch."""
    from ._engine import initialize as _initialize

    return _initialize(args=args, model=model, optimizer=optimizer, model_parameters=model_parameters,
                       training_data=training_data, lr_scheduler=lr_scheduler,
                       distributed_port=distributed_port, mpu=mpu, dist_init_required=dist_init_required,
                       collate_fn=collate_fn, config=config, mesh_param=mesh_param, config_params=config_params)

#: Version of the C header the binding was generated from, as major·10000 + minor·100 + patch.
HEADER_VERSION = _native.DST_VERSION_NUMBER


def version() -> str:
    """Version of the loaded library, "major.minor.patch"."""
    return _native.dst_version_string()


def version_number() -> int:
    """Version of the loaded library as major·10000 + minor·100 + patch."""
    return int(_native.dst_version())


def last_error() -> str:
    """Message of the last failed library call on this thread ("" when none failed)."""
    return _native.dst_last_error()


def status_string(status: int) -> str:
    """Name of a status value, e.g. "DST_ERR_CAPACITY"."""
    return _native.dst_status_string(int(status))


def dtype_size(dtype) -> int:
    """Bytes per element of a dtype ("fp32", "fp16", "bf16", "fp64")."""
    from ._config import dtype_code

    return int(_native.dst_dtype_size(dtype_code(dtype)))


__all__ = [
    "DstError",
    "InvalidArgumentError",
    "UnsupportedError",
    "CapacityError",
    "OutOfMemoryError",
    "StateError",
    "BackendError",
    "DstIOError",
    "FormatError",
    "InternalError",
    "Context",
    "LayerConfig",
    "TransformerConfig",
    "Layer",
    "SavedActivations",
    "Mask",
    "ParamInfo",
    "PARAM_NAMES",
    "DeviceArray",
    "aligned_empty",
    "bf16_numpy_dtype",
    "save_checkpoint",
    "load_checkpoint",
    "convert",
    "describe_checkpoint",
    "cuda_device_count",
    "version",
    "version_number",
    "last_error",
    "status_string",
    "dtype_size",
    "HEADER_VERSION",
    "initialize",
    "add_config_arguments",
    "init_distributed",
    "DeepSpeedConfig",
]
