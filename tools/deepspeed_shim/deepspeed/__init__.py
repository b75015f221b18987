"""A stand-in ``deepspeed`` package that runs DeepSpeed's Transformer-kernel unit tests against libdstransformer.

It is NOT DeepSpeed: it holds only what ``tests/unit/ops/accelerators/test_accelerator_{forward,backward}.py``
and the helpers they import (``unit/common.py``, ``unit/modeling.py``, ``unit/modelingpreln.py``) use:

- ``deepspeed.DeepSpeedTransformerLayer`` / ``DeepSpeedTransformerConfig``: :mod:`dstransformer.torch`'s drop-in;
- ``deepspeed.accelerator.get_accelerator()``: the device the tests run on ("cuda", or "cpu" with
  ``DS_ACCELERATOR=cpu``), see :mod:`deepspeed.accelerator`;
- ``deepspeed.ops.op_builder.TransformerBuilder`` and ``deepspeed.ops.__compatible_ops__``: whether the
  library can run the layer on that device;
- ``deepspeed.init_distributed`` and ``deepspeed.comm``: the torch.distributed calls of the tests' process
  harness (``DistributedTest``).

Put its folder (``tools/deepspeed_shim``) first on PYTHONPATH, with ``dstransformer`` importable;
``tools/deepspeed-conformance.py`` does that. Anything else DeepSpeed offers is absent on purpose.
"""

from . import accelerator, comm, git_version_info, ops  # noqa: F401
from .accelerator import get_accelerator  # noqa: F401
from .comm import init_distributed  # noqa: F401
from .ops.transformer import DeepSpeedTransformerConfig, DeepSpeedTransformerLayer  # noqa: F401

#: Not a DeepSpeed version: the local part says which package answered.
__version__ = "0.0.0+dstransformer"

__all__ = ["DeepSpeedTransformerConfig", "DeepSpeedTransformerLayer", "get_accelerator", "init_distributed",
           "accelerator", "comm", "ops"]
