"""``deepspeed.comm``: the torch.distributed calls that DeepSpeed's test harness (``unit/common.py``) makes
around each test: initialise a process group, barrier, gather a flag from every rank, destroy it. Nothing else of DeepSpeed's
communication layer is here."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Optional

import torch.distributed as _dist

__all__ = ["init_distributed", "is_initialized", "get_rank", "get_world_size", "barrier", "all_gather_into_tensor",
           "destroy_process_group"]


def init_distributed(dist_backend: Optional[str] = None, init_method: Optional[str] = None, rank: int = -1,
                     world_size: int = -1, timeout: Optional[timedelta] = None) -> None:
    """Initialises torch.distributed once, as ``deepspeed.init_distributed`` does for the arguments the
    tests pass. ``dist_backend`` defaults to the accelerator's (nccl on cuda, gloo on cpu); without
    ``rank``/``world_size`` they come from RANK/WORLD_SIZE (default 0 and 1) and ``init_method`` from the
    environment (MASTER_ADDR/MASTER_PORT)."""
    if _dist.is_initialized():
        return
    if dist_backend is None:
        from ..accelerator import get_accelerator

        dist_backend = get_accelerator().communication_backend_name()
    if rank < 0:
        rank = int(os.environ.get("RANK", "0"))
    if world_size < 0:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    kwargs = {} if timeout is None else {"timeout": timeout}
    _dist.init_process_group(backend=dist_backend, init_method=init_method or "env://", rank=rank,
                             world_size=world_size, **kwargs)


def is_initialized() -> bool:
    return _dist.is_initialized()


def get_rank() -> int:
    return _dist.get_rank()


def get_world_size() -> int:
    return _dist.get_world_size()


def barrier() -> None:
    _dist.barrier()


def destroy_process_group() -> None:
    _dist.destroy_process_group()


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op: bool = False):
    return _dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)
