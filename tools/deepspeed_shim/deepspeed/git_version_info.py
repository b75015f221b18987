"""``deepspeed.git_version_info``: the build facts DeepSpeed's test helpers (``unit/util.py``) read, answered
from torch and the library (this shim has no git build of its own)."""

from __future__ import annotations

import torch

import dstransformer

version = "0.0.0+dstransformer"
git_hash = None
git_branch = None
installed_ops = {"transformer": True, "stochastic_transformer": True}
compatible_ops = dict(installed_ops)


def _nccl_version() -> str:
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # torch built without NCCL, or no CUDA
        return "0.0"
    if isinstance(v, tuple):
        return ".".join(str(x) for x in v[:2])
    return f"{v // 1000}.{(v % 1000) // 100}"  # older torch: one integer, major*1000 + minor*100 + patch


torch_info = {
    "version": ".".join(torch.__version__.split("+")[0].split(".")[:2]),
    "bf16_support": True,
    "cuda_version": torch.version.cuda or "0.0",
    "nccl_version": _nccl_version(),
    "hip_version": "0.0",
    "library": getattr(dstransformer, "__version__", "unknown"),
}
