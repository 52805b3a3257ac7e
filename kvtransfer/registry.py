"""Transport registry: name -> (module, sender class, receiver class), imported only when asked for, so
importing `kvtransfer` never touches CUDA, NCCL or torch.distributed."""

from __future__ import annotations

import importlib

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


def create_sender(transport: str, kv_cache: torch.Tensor, config: KVTransferConfig | None = None) -> KVSender:
    """A not-yet-started sender of `transport` ('tcp' | 'ipc' | 'nccl'; resolve 'auto' first with
    `resolve_transport`) serving blocks of `kv_cache`."""
    return _load(transport, 0)(kv_cache, _config_for(transport, config))


def create_receiver(
    transport: str, kv_cache: torch.Tensor, config: KVTransferConfig | None = None
) -> KVReceiver:
    """A not-yet-started receiver of `transport` writing into blocks of `kv_cache`."""
    return _load(transport, 1)(kv_cache, _config_for(transport, config))


def _load(transport: str, which: int) -> type:
    if transport not in _REGISTRY:
        hint = " (resolve it first with resolve_transport)" if transport == "auto" else ""
        raise ValueError(f"transport must be one of {TRANSPORTS}{hint}, got {transport!r}")
    module, name = _REGISTRY[transport][which].split(":")
    return getattr(importlib.import_module(module), name)


def _config_for(transport: str, config: KVTransferConfig | None) -> KVTransferConfig:
    if config is None:
        return KVTransferConfig(transport=transport)
    if config.transport not in (transport, "auto"):
        raise ValueError(f"transport {transport!r} does not match config.transport {config.transport!r}")
    return config
