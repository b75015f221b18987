"""``get_accelerator()``: the device DeepSpeed's tests run on, answered for libdstransformer.

As in DeepSpeed, ``DS_ACCELERATOR`` picks it ("cuda" or "cpu"); without it, "cuda" when torch sees a GPU,
else "cpu". Only the queries the Transformer-kernel tests and their process harness make are offered.
Data types are those of the library, which runs fp32, fp16 and bf16 layers on both devices (DeepSpeed's
own CPU accelerator reports no fp16, which skips those tests there).
"""

from __future__ import annotations

import os

import torch

__all__ = ["get_accelerator", "is_current_accelerator_supported", "DstAccelerator"]

_NAMES = ("cuda", "cpu")


class DstAccelerator:
    """The subset of DeepSpeed's accelerator interface that the Transformer-kernel tests use."""

    def __init__(self, name: str):
        if name not in _NAMES:
            raise ValueError(f"DS_ACCELERATOR must be one of {', '.join(_NAMES)} for this shim, got {name!r}")
        self._name = name

    def __repr__(self) -> str:
        return f"DstAccelerator({self._name!r})"

    # ---- devices ------------------------------------------------------------------------------------
    def device_name(self, device_index=None) -> str:
        if device_index is None or self._name == "cpu":
            return self._name
        return f"{self._name}:{device_index}"

    def current_device_name(self) -> str:
        return f"cuda:{torch.cuda.current_device()}" if self._name == "cuda" else "cpu"

    def current_device(self) -> int:
        return torch.cuda.current_device() if self._name == "cuda" else 0

    def is_available(self) -> bool:
        return torch.cuda.is_available() if self._name == "cuda" else True

    def device_count(self) -> int:
        if self._name == "cuda":
            return torch.cuda.device_count()
        return int(os.environ.get("LOCAL_SIZE", "0")) or 1  # DeepSpeed's CPU accelerator reads LOCAL_SIZE too

    def set_device(self, device_index: int) -> None:
        if self._name == "cuda":
            torch.cuda.set_device(device_index)

    def synchronize(self, device_index=None) -> None:
        if self._name == "cuda":
            torch.cuda.synchronize(device_index)

    def manual_seed(self, seed: int) -> None:
        if self._name == "cuda":
            torch.cuda.manual_seed(seed)
        else:
            torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        if self._name == "cuda":
            torch.cuda.manual_seed_all(seed)
        else:
            torch.manual_seed(seed)

    def get_rng_state(self, device_index=None):
        if self._name == "cuda":
            return torch.cuda.get_rng_state() if device_index is None else torch.cuda.get_rng_state(device_index)
        return torch.get_rng_state()

    def set_rng_state(self, new_state, device_index=None) -> None:
        if self._name == "cuda":
            if device_index is None:
                torch.cuda.set_rng_state(new_state)
            else:
                torch.cuda.set_rng_state(new_state, device_index)
        else:
            torch.set_rng_state(new_state)

    @property
    def Event(self):  # noqa: N802 - DeepSpeed's name (a timing event class)
        if self._name != "cuda":
            raise NotImplementedError("the cpu accelerator of this shim has no Event")
        return torch.cuda.Event

    def communication_backend_name(self) -> str:
        return "nccl" if self._name == "cuda" else "gloo"

    # ---- data types ---------------------------------------------------------------------------------
    def is_fp16_supported(self) -> bool:
        return True

    def is_bf16_supported(self) -> bool:
        return True

    def supported_dtypes(self) -> list:
        return [torch.float, torch.half, torch.bfloat16]


_ACCELERATOR = None


def get_accelerator() -> DstAccelerator:
    """The process's accelerator, chosen once (DS_ACCELERATOR, else cuda when available, else cpu)."""
    global _ACCELERATOR
    if _ACCELERATOR is None:
        name = os.environ.get("DS_ACCELERATOR") or ("cuda" if torch.cuda.is_available() else "cpu")
        _ACCELERATOR = DstAccelerator(name)
    return _ACCELERATOR


def is_current_accelerator_supported() -> bool:
    """True: both devices this shim names are ones the library runs on."""
    return get_accelerator()._name in _NAMES
