"""``dstransformer.initialize``: DeepSpeed's training engine for torch models, on the library's engine.

The library's engine (``dst_engine_*``, docs/engine.md) does the work: its fused optimizer updates the
torch parameters in place through their data pointers (fp32 masters and moments for fp16/bf16), with
dynamic loss scaling, global-norm clipping, gradient accumulation, schedules and per-group
hyperparameters. This module registers the model's parameters and gradients with it and gives it
DeepSpeed's Python API. Imported by :func:`dstransformer.initialize` (it imports torch).
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch
from torch import nn

from . import _native
from ._deepspeed import DeepSpeedConfig, init_distributed, is_initialized, load_config, resolve_batch
from ._errors import UnsupportedError
from .torch import _DST_OF_TORCH, TransformerLayer, _aligned_empty, _context_for, _cuda_usable, _set_stream

__all__ = ["DeepSpeedEngine", "FusedOptimizer", "EngineLRScheduler", "initialize"]

_UNSUPPORTED = int(_native.DST_ERR_UNSUPPORTED)
_MODEL_FILE = "mp_rank_00_model_states.safetensors"
_GROUP_KEYS = ("lr", "betas", "eps", "weight_decay")


def _tensor_view(t: torch.Tensor, name: str):
    """The dst_tensor view of a contiguous torch tensor (more than 4 dimensions are flattened)."""
    if t.dtype not in _DST_OF_TORCH:
        raise TypeError(f"{name}: dtype {t.dtype} is not supported by the library's optimizer "
                        "(float32, float16, bfloat16)")
    if not t.is_contiguous():
        raise ValueError(f"{name}: the tensor is not contiguous; the optimizer updates it through its data "
                         "pointer")
    shape = tuple(t.shape) if 1 <= t.dim() <= _native.DST_MAX_DIMS else (t.numel(),)
    return _native.dst_tensor(t.data_ptr(), _DST_OF_TORCH[t.dtype], len(shape), *shape)


class FusedOptimizer:
    """The library's fused optimizer of an engine (``engine.optimizer``).

    ``param_groups`` lists each group as a dict (``params``, ``lr``, ``betas``, ``eps``,
    ``weight_decay``), as torch optimizers do: values changed there (the BERT script writes ``lr`` before
    every step) reach the library at the next ``engine.step()``; a ``scheduler`` of the configuration sets
    the lr of every group itself. The engine steps the optimizer: :meth:`step` raises."""

    def __init__(self, engine: "DeepSpeedEngine", handle, groups: List[Dict[str, Any]]):
        self._engine = engine
        self._handle = handle
        self.param_groups = groups
        self._pushed = [self._values(g) for g in groups]

    @staticmethod
    def _values(group: Dict[str, Any]) -> Tuple:
        return tuple(tuple(group[k]) if k == "betas" else float(group[k]) for k in _GROUP_KEYS)

    def _push_groups(self) -> None:
        for i, g in enumerate(self.param_groups):
            values = self._values(g)
            if values != self._pushed[i]:
                pg = _native.dst_param_group()
                pg.lr, (pg.beta1, pg.beta2), pg.eps, pg.weight_decay = (
                    float(g["lr"]), (float(g["betas"][0]), float(g["betas"][1])), float(g["eps"]),
                    float(g["weight_decay"]))
                _native.dst_optimizer_set_group(self._handle, i, pg)
                self._pushed[i] = values

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zeroes the gradients of the registered parameters (they stay the engine's buffers)."""
        del set_to_none
        self._engine.zero_grad()

    def step(self, closure=None):
        raise RuntimeError("the library's optimizer is stepped by the engine: call engine.step() after every "
                           "micro-batch, as with DeepSpeed")

    @property
    def cur_scale(self) -> float:
        """The current loss scale (1 without fp16), as DeepSpeed's fp16 optimizers name it."""
        return self._engine.loss_scale

    @property
    def loss_scale(self) -> float:
        return self._engine.loss_scale

    def get_lr(self) -> List[float]:
        return self._engine.get_lr()

    def state_dict(self):
        raise RuntimeError("the optimizer's state is saved by engine.save_checkpoint(), with the model")

    def __repr__(self) -> str:
        return f"FusedOptimizer({self._engine.optimizer_name()}, {len(self.param_groups)} group(s))"


class EngineLRScheduler:
    """The configuration's ``scheduler``, run by the library (``engine.lr_scheduler``). The engine
    advances it after every applied optimizer step (not after a skipped one), as DeepSpeed does, so
    :meth:`step` is not called by the training script."""

    def __init__(self, engine: "DeepSpeedEngine", name: str, params: Dict[str, Any]):
        self._engine = engine
        self.name = name
        self.params = dict(params)

    def get_lr(self) -> List[float]:
        """The lr the next step of each group uses."""
        return self._engine.get_lr()

    get_last_lr = get_lr

    def step(self, *args, **kwargs) -> None:
        """Nothing to do: the library's engine steps the schedule."""

    def __repr__(self) -> str:
        return f"EngineLRScheduler({self.name})"


class DeepSpeedEngine(nn.Module):
    """DeepSpeed's engine around a torch model (made by :func:`dstransformer.initialize`).

    ``engine(*inputs, **kw)`` is ``module(*inputs, **kw)``; ``engine.backward(loss)`` scales the loss
    (1/gradient_accumulation_steps, and the loss scale under fp16) and back-propagates;
    ``engine.step()`` is called after every micro-batch and steps the library's optimizer at the
    accumulation boundary. The parameters' ``.grad`` are buffers registered with the library (for a
    :class:`dstransformer.torch.TransformerLayer`, views into one gradient arena per layer); the engine
    zeroes them at each boundary (see :attr:`zero_grads_on_step`). If other code replaces them
    (``zero_grad(set_to_none=True)``, ``p.grad = t``), they are copied back into the registered buffers
    before the next step.
    """

    def __init__(self, args: Any, model: nn.Module, model_parameters: Any, config_text: str,
                 config: Dict[str, Any]):
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.module = model
        self._config = config
        self._config_text = config_text
        self._ds_config = DeepSpeedConfig(config)
        self.local_rank = self._local_rank(args)
        self.device = self._choose_device(model)
        self._precision = torch.float16 if self._ds_config.fp16_enabled else (
            torch.bfloat16 if self._ds_config.bf16_enabled else None)
        model.to(self.device)
        if self._precision is not None:
            model.to(self._precision)
        self._ctx = _context_for(self.device)
        self._handle = _native.dst_engine_create(self._ctx.handle, config_text, 1)
        self._opt_handle = _native.dst_engine_get_optimizer(self._handle)
        self._entries: List[Tuple[torch.Tensor, torch.Tensor]] = []  # (param, its registered grad)
        self._model_tensors: List[torch.Tensor] = []
        groups = self._register(model, model_parameters)
        self.optimizer = FusedOptimizer(self, self._opt_handle, groups)
        self.basic_optimizer = self.optimizer
        sched = config.get("scheduler")
        self.lr_scheduler = (EngineLRScheduler(self, sched.get("type"), sched.get("params") or {})
                             if isinstance(sched, dict) and sched.get("type") else None)
        self.zero_grad()

    # ---- construction ---------------------------------------------------------------------------
    @staticmethod
    def _local_rank(args: Any) -> int:
        env = os.environ.get("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK"))
        rank = int(env) if env is not None else 0
        arg = getattr(args, "local_rank", None) if args is not None else None
        if arg is not None and int(arg) >= 0 and env is not None and int(arg) != rank:
            raise ValueError(f"initialize: args.local_rank={arg} but LOCAL_RANK={env} (DeepSpeed asserts "
                             "they agree)")
        if args is not None and hasattr(args, "local_rank"):
            args.local_rank = rank  # DeepSpeed overwrites it with the environment's
        return rank

    def _choose_device(self, model: nn.Module) -> torch.device:
        """DeepSpeed's ``cuda:LOCAL_RANK`` when torch and the library can both use CUDA; else the CPU
        (the library's CPU backend). As in DeepSpeed, ``DS_ACCELERATOR=cpu`` keeps a CPU model on the
        CPU on a machine with a GPU."""
        first = next(iter(model.parameters()), None)
        if first is not None and first.device.type == "cuda":
            return first.device if first.device.index is not None else torch.device("cuda", 0)
        if os.environ.get("DS_ACCELERATOR", "").lower() == "cpu":
            return torch.device("cpu")
        if _cuda_usable() is None:
            torch.cuda.set_device(self.local_rank)
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def _groups_from(self, model: nn.Module, model_parameters: Any) -> List[Dict[str, Any]]:
        if model_parameters is None:
            model_parameters = [p for p in model.parameters() if p.requires_grad]
        items = list(model_parameters)
        if not items:
            raise ValueError("model_parameters: no parameters to optimise")
        if all(isinstance(x, dict) for x in items):
            raw = [dict(g) for g in items]
        elif any(isinstance(x, dict) for x in items):
            raise TypeError("model_parameters: give either tensors or parameter-group dicts, not a mix")
        else:
            raw = [{"params": items}]
        groups = []
        seen = {}
        for gi, g in enumerate(raw):
            if "params" not in g:
                raise ValueError(f"model_parameters[{gi}]: a parameter group needs a 'params' entry")
            params = g["params"]
            params = [params] if isinstance(params, torch.Tensor) else list(params)
            for p in params:
                if not isinstance(p, torch.Tensor):
                    raise TypeError(f"model_parameters[{gi}]: expected tensors, got {type(p).__name__}")
                if id(p) in seen:
                    raise ValueError(f"model_parameters: a parameter is in groups {seen[id(p)]} and {gi} "
                                     "(DeepSpeed asserts each is in one group)")
                seen[id(p)] = gi
            unknown = set(g) - {"params", *(_GROUP_KEYS), "name", "bias_correction"}
            if unknown:
                raise ValueError(f"model_parameters[{gi}]: unsupported parameter-group keys {sorted(unknown)} "
                                 f"(supported: params, {', '.join(_GROUP_KEYS)})")
            if "bias_correction" in g:
                raise ValueError(f"model_parameters[{gi}]: bias_correction is per optimizer here; set "
                                 "optimizer.params.bias_correction in the configuration")
            g["params"] = params
            if params:  # DeepSpeed drops empty groups
                groups.append(g)
        return groups

    def _register(self, model: nn.Module, model_parameters: Any) -> List[Dict[str, Any]]:
        names = {}
        for n, p in model.named_parameters():
            names.setdefault(id(p), n)
        raw_groups = self._groups_from(model, model_parameters)
        g0 = _native.dst_param_group()
        _native.dst_optimizer_get_group(self._opt_handle, 0, g0)
        defaults = {"lr": g0.lr, "betas": (g0.beta1, g0.beta2), "eps": g0.eps, "weight_decay": g0.weight_decay}
        grad_bufs = self._grad_buffers(model)
        groups = []
        registered = set()
        for gi, raw in enumerate(raw_groups):
            group = dict(defaults)
            group.update({k: raw[k] for k in _GROUP_KEYS if k in raw})
            group["betas"] = tuple(float(b) for b in group["betas"])
            pg = _native.dst_param_group()
            pg.lr, pg.beta1, pg.beta2 = float(group["lr"]), group["betas"][0], group["betas"][1]
            pg.eps, pg.weight_decay = float(group["eps"]), float(group["weight_decay"])
            if gi == 0:
                _native.dst_optimizer_set_group(self._opt_handle, 0, pg)
            else:
                _native.dst_optimizer_add_group(self._opt_handle, pg)
            for p in raw["params"]:
                name = names.get(id(p), f"param.{len(self._entries)}")
                if self._precision is not None and p.is_floating_point() and p.dtype != self._precision:
                    raise TypeError(f"{name}: {p.dtype}, but the configuration enables "
                                    f"{'fp16' if self._precision == torch.float16 else 'bf16'}; the engine "
                                    "casts the model it is given, so this tensor is not part of it")
                grad = grad_bufs.get(id(p))
                if grad is None:
                    grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
                _native.dst_optimizer_add_tensor(self._opt_handle, gi, name, _tensor_view(p, name),
                                                 _tensor_view(grad, name + ".grad"))
                self._entries.append((p, grad))
                registered.add(id(p))
            group["params"] = list(raw["params"])
            groups.append(group)
        # Parameters outside every group (the BERT script leaves out the pooler) and floating-point
        # buffers are saved and loaded with the model, but not trained.
        for n, p in model.named_parameters():
            if id(p) not in registered:
                self._add_model_tensor(n, p)
                registered.add(id(p))
        for n, b in model.named_buffers():
            if b.is_floating_point() and id(b) not in registered and b.numel() > 0:
                self._add_model_tensor(n, b)
                registered.add(id(b))
        return groups

    def _add_model_tensor(self, name: str, t: torch.Tensor) -> None:
        if t.dtype not in _DST_OF_TORCH or not t.is_contiguous():
            return
        _native.dst_engine_add_model_tensor(self._handle, name, _tensor_view(t.detach(), name))
        self._model_tensors.append(t)

    @staticmethod
    def _grad_buffers(model: nn.Module) -> Dict[int, torch.Tensor]:
        """For every TransformerLayer: one aligned gradient arena whose views are the twelve gradients."""
        out = {}
        for m in model.modules():
            if isinstance(m, TransformerLayer):
                arena = m.flat_params
                garena = _aligned_empty(arena.numel(), arena.dtype, arena.device, zero=True)
                for name, p in zip(m._layout.entries, m._params()):
                    out[id(p)] = m._layout.view(garena, name)
        return out

    # ---- the registered gradients -----------------------------------------------------------------
    def _stream(self) -> None:
        _set_stream(self._ctx, self.device)

    def _attach_grads(self) -> None:
        """Makes every parameter's .grad its registered buffer again (copying a replaced gradient into
        it; a None gradient is zero)."""
        for p, buf in self._entries:
            g = p.grad
            if g is buf:
                continue
            with torch.no_grad():
                if g is None:
                    buf.zero_()
                else:
                    buf.copy_(g)
            p.grad = buf

    def _check_params(self) -> None:
        for (p, _), ptr in zip(self._entries, self._param_ptrs):
            if p.data_ptr() != ptr:
                raise RuntimeError("a parameter moved after dstransformer.initialize (its memory is registered "
                                   "with the library's optimizer): move or cast the model before initialize")

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zeroes the registered gradients (they stay the parameters' .grad)."""
        del set_to_none
        if not hasattr(self, "_param_ptrs"):
            self._param_ptrs = [p.data_ptr() for p, _ in self._entries]
        for p, buf in self._entries:
            p.grad = buf
        self._stream()
        _native.dst_engine_zero_grads(self._handle)

    # ---- the training step ------------------------------------------------------------------------
    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def _scale_tensor(self) -> torch.Tensor:
        """A zero-copy view of the engine's current loss scale (a float in the context's memory)."""
        if getattr(self, "_scale_view", None) is None:
            ptr = int(_native.dst_engine_loss_scale_pointer(self._handle))
            if self.device.type == "cuda":
                holder = type("_ScaleMemory", (), {"__cuda_array_interface__": {
                    "shape": (1,), "typestr": "<f4", "data": (ptr, False), "version": 2}})()
                self._scale_view = torch.as_tensor(holder, device=self.device)
            else:
                import ctypes

                import numpy as np

                buf = (ctypes.c_float * 1).from_address(ptr)
                self._scale_view = torch.from_numpy(np.ctypeslib.as_array(buf))
        return self._scale_view

    def backward(self, loss: torch.Tensor, release_loss: bool = False, retain_graph: bool = False,
                 scale_wrt_gas: bool = True) -> torch.Tensor:
        """DeepSpeed's ``engine.backward(loss)``: loss / gradient_accumulation_steps (with
        ``scale_wrt_gas``), times the current loss scale under fp16, back-propagated into the registered
        gradients. Returns the scaled loss."""
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"loss must be a torch.Tensor, got {type(loss).__name__}")
        self._attach_grads()
        scaled = loss.float()
        gas = self.gradient_accumulation_steps()
        if scale_wrt_gas and gas > 1:
            scaled = scaled / gas
        if self.fp16_enabled():
            scaled = scaled * self._scale_tensor().to(scaled.device)[0]
        scaled.backward(retain_graph=retain_graph)
        return scaled

    def is_gradient_accumulation_boundary(self) -> bool:
        return bool(_native.dst_engine_is_boundary(self._handle))

    @property
    def zero_grads_on_step(self) -> bool:
        """Whether :meth:`step` zeroes the registered gradients at each accumulation boundary: True
        (the default, as DeepSpeed) or False, which leaves them for the next step's first backward to
        overwrite, as torch's ``zero_grad(set_to_none=True)`` does; that saves a write of every gradient
        per step and the first micro-batch's reads of the zeros. Turn it off only if the first backward
        of every step writes every registered gradient (e.g. a backward that writes the buffers with
        ``DST_GRAD_WRITE``): torch's autograd adds into ``.grad``, so after a boundary with False a plain
        ``engine.backward(loss)`` would add to the values left there (today the last step's gradients).
        :meth:`zero_grad` still zeroes on request; the setting is not saved in checkpoints. See
        ``dst_engine_set_zero_grads_on_step``."""
        return bool(_native.dst_engine_get_zero_grads_on_step(self._handle))

    @zero_grads_on_step.setter
    def zero_grads_on_step(self, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"zero_grads_on_step must be a bool, got {enabled!r}")
        _native.dst_engine_set_zero_grads_on_step(self._handle, int(enabled))

    def step(self, lr_kwargs: Optional[Dict[str, Any]] = None) -> None:
        """DeepSpeed's ``engine.step()``, after every micro-batch: at the accumulation boundary the
        overflow check, unscaling, clipping, the optimizer update with the scheduled lr, zeroed
        gradients (unless :attr:`zero_grads_on_step` is False); elsewhere only the micro-step count
        advances."""
        del lr_kwargs
        self._check_params()
        self._attach_grads()
        if self.is_gradient_accumulation_boundary():
            self.optimizer._push_groups()
        self._stream()
        _native.dst_engine_step(self._handle)

    # ---- accessors ---------------------------------------------------------------------------------
    def _state(self):
        st = _native.dst_engine_state()
        _native.dst_engine_get_state(self._handle, st)
        return st

    def train_batch_size(self) -> int:
        return self._ds_config.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self._ds_config.train_micro_batch_size_per_gpu

    def gradient_accumulation_steps(self) -> int:
        return self._ds_config.gradient_accumulation_steps

    def fp16_enabled(self) -> bool:
        return self._ds_config.fp16_enabled

    def bf16_enabled(self) -> bool:
        return self._ds_config.bf16_enabled

    def optimizer_name(self) -> str:
        return self._ds_config.optimizer_name

    def gradient_clipping(self) -> float:
        return self._ds_config.gradient_clipping

    def get_lr(self) -> List[float]:
        n = int(_native.dst_optimizer_num_groups(self._opt_handle))
        return [float(_native.dst_engine_get_lr(self._handle, i)) for i in range(n)]

    def get_mom(self) -> List[Tuple[float, float]]:
        return [tuple(g["betas"]) for g in self.optimizer.param_groups]

    def get_global_grad_norm(self) -> float:
        return float(self._state().grad_norm)

    def was_step_applied(self) -> bool:
        return bool(self._state().last_step_applied)

    @property
    def loss_scale(self) -> float:
        return float(self._state().loss_scale)

    @property
    def global_steps(self) -> int:
        return int(self._state().global_steps)

    @property
    def global_samples(self) -> int:
        return int(self._state().global_samples)

    @property
    def skipped_steps(self) -> int:
        return int(self._state().skipped_steps)

    @property
    def micro_steps(self) -> int:
        return int(self._state().micro_steps)

    @contextlib.contextmanager
    def no_sync(self):
        """No gradient all-reduce inside the block; with one process there is none anyway."""
        yield

    # ---- checkpoints -------------------------------------------------------------------------------
    def save_checkpoint(self, save_dir: Any, tag: Optional[str] = None, client_state: Any = None,
                        save_latest: bool = True, exclude_frozen_parameters: bool = False) -> bool:
        """Writes ``save_dir/<tag>/`` (model tensors, optimizer state, loss scaler, schedule, counters,
        RNG) and ``save_dir/latest``; ``client_state`` is any JSON-serialisable value, returned by
        :meth:`load_checkpoint`. Tag default ``global_step<N>``. Call it at an accumulation boundary."""
        del exclude_frozen_parameters
        if client_state is None:
            client_state = {}
        try:
            text = json.dumps(client_state)
        except (TypeError, ValueError) as e:
            raise TypeError(f"client_state must be JSON-serialisable (dicts, lists, str, numbers, bools, "
                            f"None): {e}") from None
        self._check_params()
        self._stream()
        _native.dst_engine_save_checkpoint(self._handle, os.fspath(save_dir), tag, text, int(bool(save_latest)))
        return True

    def load_checkpoint(self, load_dir: Any, tag: Optional[str] = None, load_module_strict: bool = True,
                        load_optimizer_states: bool = True, load_lr_scheduler_states: bool = True,
                        load_module_only: bool = False, custom_load_fn: Any = None
                        ) -> Tuple[Optional[str], Any]:
        """Loads a checkpoint written by :meth:`save_checkpoint`; returns (path of its model file, the
        client state). ``tag=None`` reads ``load_dir/latest``; without one it warns and returns
        (None, None), as DeepSpeed does."""
        if custom_load_fn is not None:
            raise UnsupportedError(_UNSUPPORTED, "load_checkpoint: custom_load_fn is not supported")
        load_dir = os.fspath(load_dir)
        if tag is None:
            if not os.path.isfile(os.path.join(load_dir, "latest")):
                warnings.warn(f"Unable to find latest file at {os.path.join(load_dir, 'latest')}, if trying to "
                              "load latest checkpoint please ensure this file exists or pass an explicit "
                              "checkpoint tag when loading a checkpoint.")
                return None, None
            tag, _ = _native.dst_checkpoint_latest_tag(load_dir, 4096)
        opts = _native.dst_engine_load_options()
        opts.load_optimizer_states = int(bool(load_optimizer_states))
        opts.load_lr_scheduler_states = int(bool(load_lr_scheduler_states))
        opts.load_module_only = int(bool(load_module_only))
        opts.strict = int(bool(load_module_strict))
        self._check_params()
        self._stream()
        cap = 1 << 16
        while True:
            data, full_len = _native.dst_engine_load_checkpoint(self._handle, load_dir, tag, opts, cap)
            if int(full_len) < cap:
                break
            # The state was loaded; the client state did not fit: read it again with room for all of it
            # (loading twice gives the same result).
            cap = int(full_len) + 1
        text = bytes(data[:int(full_len)]).decode("utf-8")
        client_state = json.loads(text) if text else None
        self.zero_grad()
        return os.path.join(load_dir, tag, _MODEL_FILE), client_state

    def __del__(self):
        h = getattr(self, "_handle", None)
        if h is not None:
            self._handle = None
            try:
                _native.dst_engine_destroy(h)
            except Exception:  # noqa: BLE001
                pass


def initialize(args: Any = None, model: Optional[nn.Module] = None, optimizer: Any = None,
               model_parameters: Any = None, training_data: Any = None, lr_scheduler: Any = None,
               distributed_port: int = 29500, mpu: Any = None, dist_init_required: Optional[bool] = None,
               collate_fn: Any = None, config: Any = None, mesh_param: Any = None, config_params: Any = None
               ) -> Tuple[DeepSpeedEngine, FusedOptimizer, Any, Optional[EngineLRScheduler]]:
    """DeepSpeed's ``deepspeed.initialize``: returns ``(engine, optimizer, training_dataloader,
    lr_scheduler)``. See :class:`DeepSpeedEngine`; the configuration is DeepSpeed's JSON (``config`` as a
    dict or path, or ``args.deepspeed_config``), checked strictly by the library."""
    if model is None:
        raise ValueError("initialize: model is required")
    if optimizer is not None:
        raise UnsupportedError(_UNSUPPORTED, "initialize: a client optimizer is not supported; the library's "
                               "fused optimizer is configured by the configuration's optimizer section")
    if lr_scheduler is not None:
        raise UnsupportedError(_UNSUPPORTED, "initialize: a client lr_scheduler is not supported; use the "
                               "configuration's scheduler section")
    if mpu is not None or mesh_param is not None:
        raise UnsupportedError(_UNSUPPORTED, "initialize: model parallelism (mpu, mesh_param) is not supported")
    if not is_initialized():
        init_distributed(distributed_port=distributed_port, dist_init_required=dist_init_required)
    text, cfg = load_config(args, config, config_params)
    if not isinstance(cfg.get("optimizer"), dict):
        raise ValueError("initialize: the configuration has no optimizer section (a client optimizer is not "
                         "supported)")
    engine = DeepSpeedEngine(args, model, model_parameters, text, cfg)
    loader = None
    if training_data is not None:
        _, mb, _ = resolve_batch(cfg)
        sampler = torch.utils.data.distributed.DistributedSampler(training_data, num_replicas=1, rank=0)
        loader = torch.utils.data.DataLoader(training_data, batch_size=mb, sampler=sampler, collate_fn=collate_fn)
    return engine, engine.optimizer, loader, engine.lr_scheduler
