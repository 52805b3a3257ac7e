"""Transport registry: name -> (module, sender class, receiver class), imported only when asked for, so
importing `kvtransfer` never touches CUDA, NCCL or torch.distributed.

Wrappers are registered here too, by name: each wraps every sender or receiver created while its
environment variable is set (the variable's value configures it), and its module is imported only
then, so a production worker never loads test machinery such as the fault injector (`faults.py`)."""

from __future__ import annotations

import importlib
import os
from typing import Any, TypeVar

import torch

from common.wire.handoff import TRANSPORTS

from .base import KVReceiver, KVSender
from .config import KVTransferConfig

# name -> ("module:SenderClass", "module:ReceiverClass")
_REGISTRY: dict[str, tuple[str, str]] = {
    "tcp": ("kvtransfer.tcp:TcpSender", "kvtransfer.tcp:TcpReceiver"),
    "ipc": ("kvtransfer.ipc_sender:IpcSender", "kvtransfer.ipc:IpcReceiver"),
    "nccl": ("kvtransfer.nccl:NcclSender", "kvtransfer.nccl:NcclReceiver"),
}
assert set(_REGISTRY) == set(TRANSPORTS)

KV_FAULTS_ENV = "PDSERVE_KV_FAULTS"  # e.g. "drop=0.05,delay=0.1,delay_s=3,seed=7" (faults.py)

# name -> (side it wraps: "sender" | "receiver", switching variable, "module:callable(endpoint, value)")
_WRAPPERS: dict[str, tuple[str, str, str]] = {
    "faults": ("receiver", KV_FAULTS_ENV, "kvtransfer.faults:wrap_receiver"),
}
_Endpoint = TypeVar("_Endpoint", KVSender, KVReceiver)


def create_sender(transport: str, kv_cache: torch.Tensor, config: KVTransferConfig | None = None) -> KVSender:
    """A not-yet-started sender of `transport` ('tcp' | 'ipc' | 'nccl'; resolve 'auto' first with
    `resolve_transport`) serving blocks of `kv_cache`."""
    return _wrapped("sender", _load(transport, 0)(kv_cache, _config_for(transport, config)))


def create_receiver(
    transport: str, kv_cache: torch.Tensor, config: KVTransferConfig | None = None
) -> KVReceiver:
    """A not-yet-started receiver of `transport` writing into blocks of `kv_cache`."""
    return _wrapped("receiver", _load(transport, 1)(kv_cache, _config_for(transport, config)))


def _wrapped(side: str, endpoint: _Endpoint) -> _Endpoint:
    """`endpoint` inside every wrapper of `side` whose variable is set (non-blank), in registry order."""
    for wrapper_side, variable, target in _WRAPPERS.values():
        setting = os.environ.get(variable, "").strip()
        if wrapper_side == side and setting:
            endpoint = _resolve(target)(endpoint, setting)
    return endpoint


def _load(transport: str, which: int) -> type:
    if transport not in _REGISTRY:
        hint = " (resolve it first with resolve_transport)" if transport == "auto" else ""
        raise ValueError(f"transport must be one of {TRANSPORTS}{hint}, got {transport!r}")
    return _resolve(_REGISTRY[transport][which])


def _resolve(target: str) -> Any:
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def _config_for(transport: str, config: KVTransferConfig | None) -> KVTransferConfig:
    if config is None:
        return KVTransferConfig(transport=transport)
    if config.transport not in (transport, "auto"):
        raise ValueError(f"transport {transport!r} does not match config.transport {config.transport!r}")
    return config
