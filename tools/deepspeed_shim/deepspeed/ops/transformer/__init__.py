"""``deepspeed.ops.transformer``: libdstransformer's drop-in layer under DeepSpeed's names."""

try:
    from dstransformer.torch import DeepSpeedTransformerConfig, DeepSpeedTransformerLayer
except ImportError as e:  # the shim is useless without the library: say what is missing
    raise ImportError(f"the deepspeed shim needs dstransformer.torch (libdstransformer's Python package and "
                      f"torch) importable: {e}") from e

__all__ = ["DeepSpeedTransformerConfig", "DeepSpeedTransformerLayer"]
