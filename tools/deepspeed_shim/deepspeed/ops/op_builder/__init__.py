"""``deepspeed.ops.op_builder``: the two Transformer-kernel builders, answering for libdstransformer.

Nothing is built: ``is_compatible()`` says whether the library can run the layer on the accelerator's device
(any device for "cpu"; for "cuda", a library built with CUDA that sees a GPU), and ``load()`` returns the
module that provides the layer, :mod:`dstransformer.torch`.
"""

from __future__ import annotations

from types import ModuleType
from typing import Optional

__all__ = ["TransformerBuilder", "StochasticTransformerBuilder"]


def _incompatibility() -> Optional[str]:
    import dstransformer
    from ...accelerator import get_accelerator

    device = get_accelerator().device_name()
    if device == "cuda" and dstransformer.cuda_device_count() == 0:
        return ("libdstransformer sees no CUDA device (built without CUDA, or no usable GPU); "
                "DS_ACCELERATOR=cpu runs the tests on its CPU backend")
    return None


class TransformerBuilder:
    """DeepSpeed's builder of the Transformer kernel, by name and answers only."""

    NAME = "transformer"

    def __init__(self, name: Optional[str] = None):
        self.name = self.NAME if name is None else name

    def absolute_name(self) -> str:
        return "dstransformer.torch"

    def is_compatible(self, verbose: bool = False) -> bool:
        reason = _incompatibility()
        if reason is not None and verbose:
            print(f"{self.name}: {reason}")
        return reason is None

    def load(self, verbose: bool = False) -> ModuleType:
        reason = _incompatibility()
        if reason is not None:
            raise RuntimeError(f"{self.name}: {reason}")
        import dstransformer.torch

        return dstransformer.torch


class StochasticTransformerBuilder(TransformerBuilder):
    """The same layer: ``stochastic_mode`` is a configuration flag of libdstransformer."""

    NAME = "stochastic_transformer"
