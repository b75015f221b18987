"""``deepspeed.ops``: the Transformer layer, its builders, and ``__compatible_ops__`` (which of them the
library can run here, computed at import as DeepSpeed does)."""

from . import op_builder, transformer
from .op_builder import StochasticTransformerBuilder, TransformerBuilder
from .transformer import DeepSpeedTransformerConfig, DeepSpeedTransformerLayer

__compatible_ops__ = {b.NAME: b().is_compatible() for b in (TransformerBuilder, StochasticTransformerBuilder)}

__all__ = ["DeepSpeedTransformerConfig", "DeepSpeedTransformerLayer", "TransformerBuilder",
           "StochasticTransformerBuilder", "op_builder", "transformer", "__compatible_ops__"]
