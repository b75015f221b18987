"""DeepSpeed's entry points that need no torch: ``add_config_arguments``, ``init_distributed`` and
``DeepSpeedConfig``, plus the configuration loading that ``initialize`` shares with them.

The configuration is the library's (``dst_engine_config_validate``): DeepSpeed's keys, checked strictly,
an unknown or mistyped key raising :class:`InvalidArgumentError` with its JSON path.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import os
from typing import Any, Dict, Optional, Tuple, Union

from . import _native
from ._errors import UnsupportedError

__all__ = ["add_config_arguments", "init_distributed", "DeepSpeedConfig", "load_config"]

ConfigArg = Union[str, os.PathLike, Dict[str, Any], None]
_UNSUPPORTED = int(_native.DST_ERR_UNSUPPORTED)


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds DeepSpeed's argparse group: ``--deepspeed`` (a flag for the script), ``--deepspeed_config``
    (path of the JSON configuration) and the deprecated ``--deepscale``/``--deepscale_config``."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="Enable DeepSpeed (helper flag for user code, no impact on the library)")
    group.add_argument("--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file.")
    group.add_argument("--deepscale", default=False, action="store_true",
                       help="Deprecated enable DeepSpeed (helper flag for user code, no impact on the library)")
    group.add_argument("--deepscale_config", default=None, type=str,
                       help="Deprecated DeepSpeed json configuration file.")
    return parser


_DIST_STATE = {"initialized": False}


def init_distributed(dist_backend: Optional[str] = None, auto_mpi_discovery: bool = True,
                     distributed_port: int = 29500, verbose: bool = True, timeout: Any = None,
                     init_method: Optional[str] = None, dist_init_required: Optional[bool] = None,
                     config: Any = None, rank: int = -1, world_size: int = -1) -> None:
    """DeepSpeed's process-group setup, for one process: it checks that the environment (``WORLD_SIZE``,
    ``RANK``) and the arguments describe a world of size 1 and records that it ran (calling it again is a
    no-op, as in DeepSpeed). A larger world raises :class:`UnsupportedError`: data parallelism across
    processes is not in this version of the engine."""
    env_world = os.environ.get("WORLD_SIZE")
    sizes = [("world_size", world_size)]
    if env_world is not None:
        try:
            sizes.append(("WORLD_SIZE", int(env_world)))
        except ValueError:
            raise ValueError(f"init_distributed: WORLD_SIZE={env_world!r} is not an integer") from None
    for name, value in sizes:
        if int(value) > 1:
            raise UnsupportedError(_UNSUPPORTED,
                                   f"init_distributed: {name}={value}; this version of the engine runs one "
                                   "process (world size 1)")
    env_rank = os.environ.get("RANK")
    for name, value in (("rank", rank), ("RANK", env_rank)):
        if value is not None and int(value) > 0:
            raise UnsupportedError(_UNSUPPORTED,
                                   f"init_distributed: {name}={value} in a world of size 1")
    _DIST_STATE["initialized"] = True


def is_initialized() -> bool:
    """Whether :func:`init_distributed` ran (``deepspeed.comm.is_initialized``)."""
    return _DIST_STATE["initialized"]


def load_config(args: Any = None, config: ConfigArg = None, config_params: ConfigArg = None
                ) -> Tuple[str, Dict[str, Any]]:
    """The configuration as DeepSpeed's ``initialize`` finds it: ``config`` (alias ``config_params``) as
    a dict, a path, JSON text or URL-safe base64 JSON, or else the path in ``args.deepspeed_config`` (or
    ``args.deepscale_config``); both given is an error. Returns (JSON text, parsed dict) after the
    library checked it (:class:`InvalidArgumentError` names the bad key's path)."""
    if config is not None and config_params is not None and config is not config_params:
        raise ValueError("initialize: give the configuration as config or config_params, not both")
    config = config if config is not None else config_params
    arg_path = None
    if args is not None:
        arg_path = getattr(args, "deepspeed_config", None) or getattr(args, "deepscale_config", None)
        if getattr(args, "deepspeed_config", None) and getattr(args, "deepscale_config", None):
            raise ValueError("initialize: args has both deepspeed_config and the deprecated deepscale_config")
    if arg_path is not None and config is not None:
        raise ValueError("initialize: the configuration is given twice, as args.deepspeed_config "
                         f"({arg_path!r}) and as config; give one (DeepSpeed asserts the same)")
    if config is None:
        config = arg_path
    if config is None:
        raise ValueError("initialize: no configuration; pass config= (a dict or a JSON path) or "
                         "--deepspeed_config (DeepSpeed requires one too)")
    text = _config_text(config)
    reason = _native.dst_engine_config_validate(text, 1, 4096)  # raises with the key's path
    del reason
    return text, json.loads(text)


def _config_text(config: Any) -> str:
    if isinstance(config, dict):
        try:
            return json.dumps(config)
        except (TypeError, ValueError) as e:
            raise TypeError(f"config: the dict is not JSON-serialisable ({e})") from None
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if os.path.isfile(path):
            with open(path, "r", encoding="utf-8") as f:
                return f.read()
        stripped = path.strip()
        if stripped.startswith("{"):
            return stripped
        try:
            decoded = base64.urlsafe_b64decode(stripped.encode("ascii")).decode("utf-8")
        except (binascii.Error, UnicodeError, ValueError):
            decoded = None
        if decoded is not None and decoded.lstrip().startswith("{"):
            return decoded
        raise FileNotFoundError(f"config: {path!r} is not a file, JSON text or base64-encoded JSON")
    raise TypeError(f"config must be a dict, a path or JSON text, got {type(config).__name__}")


def _int_or_none(d: Dict[str, Any], key: str) -> Optional[int]:
    v = d.get(key)
    return None if v is None else int(v)


def resolve_batch(cfg: Dict[str, Any], world_size: int = 1) -> Tuple[int, int, int]:
    """(train_batch_size, micro batch, gradient_accumulation_steps) resolved as DeepSpeed does (the
    library has already checked that they are consistent)."""
    tb = _int_or_none(cfg, "train_batch_size")
    mb = _int_or_none(cfg, "train_micro_batch_size_per_gpu")
    gas = _int_or_none(cfg, "gradient_accumulation_steps")
    w = int(world_size)
    if tb is not None and mb is not None and gas is None:
        gas = tb // mb // w
    elif tb is not None and gas is not None and mb is None:
        mb = tb // w // gas
    elif mb is not None and gas is not None and tb is None:
        tb = mb * gas * w
    elif tb is not None and mb is None and gas is None:
        gas, mb = 1, tb // w
    elif mb is not None and tb is None and gas is None:
        gas, tb = 1, mb * w
    if tb is None or mb is None or gas is None:
        raise ValueError("config: either train_batch_size or train_micro_batch_size_per_gpu needs to be provided")
    return tb, mb, gas


def _section_enabled(cfg: Dict[str, Any], *names: str) -> bool:
    for name in names:
        sec = cfg.get(name)
        if isinstance(sec, dict) and sec.get("enabled"):
            return True
    return False


class DeepSpeedConfig:
    """DeepSpeed's ``DeepSpeedConfig(config, mpu=None)``: the resolved values a model script reads
    (the BERT tutorial builds its layer configuration from them). ``config`` is a path, a dict or JSON
    text, checked by the library."""

    def __init__(self, config: ConfigArg, mpu: Any = None):
        if mpu is not None:
            raise UnsupportedError(_UNSUPPORTED,
                                   "DeepSpeedConfig: model parallelism (mpu) is not supported")
        self._text, self._param_dict = load_config(config=config)
        self.world_size = 1
        (self.train_batch_size, self.train_micro_batch_size_per_gpu,
         self.gradient_accumulation_steps) = resolve_batch(self._param_dict, self.world_size)
        self.fp16_enabled = _section_enabled(self._param_dict, "fp16")
        self.bf16_enabled = _section_enabled(self._param_dict, "bf16", "bfloat16")
        self.gradient_clipping = float(self._param_dict.get("gradient_clipping") or 0.0)
        self.steps_per_print = self._param_dict.get("steps_per_print")
        opt = self._param_dict.get("optimizer") or {}
        self.optimizer_name = str(opt.get("type")).lower() if opt.get("type") is not None else None
        self.optimizer_params = dict(opt.get("params") or {})
        sched = self._param_dict.get("scheduler") or {}
        self.scheduler_name = sched.get("type")
        self.scheduler_params = dict(sched.get("params") or {})

    @property
    def config(self) -> Dict[str, Any]:
        """The configuration as parsed (a copy)."""
        return json.loads(self._text)

    def __repr__(self) -> str:
        return (f"DeepSpeedConfig(train_batch_size={self.train_batch_size}, "
                f"train_micro_batch_size_per_gpu={self.train_micro_batch_size_per_gpu}, "
                f"gradient_accumulation_steps={self.gradient_accumulation_steps}, "
                f"fp16_enabled={self.fp16_enabled}, bf16_enabled={self.bf16_enabled})")
