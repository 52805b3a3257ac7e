"""Transport registry: name -> (module, sender class, receiver class), imported only when asked for, so
importing `kvtransfer` never touches CUDA, NCCL or torch.distributed."""

from __future__ import annotations

import importlib

import torch

from .base import KVReceiver, KVSender
from .config import TRANSPORTS, KVTransferConfig

_REGISTRY: dict[str, tuple[str, str, str]] = {
    "tcp": ("kvtransfer.tcp", "TcpSender", "TcpReceiver"),
    "ipc": ("kvtransfer.ipc", "IpcSender", "IpcReceiver"),
    "nccl": ("kvtransfer.nccl", "NcclSender", "NcclReceiver"),
}
assert set(_REGISTRY) == set(TRANSPORTS)


def create_sender(transport: str, kv_cache: torch.Tensor, config: KVTransferConfig | None = None) -> KVSender:
    """A not-yet-started sender of `transport` ('tcp' | 'ipc' | 'nccl'; resolve 'auto' first with
    `resolve_transport`) serving blocks of `kv_cache`."""
    return _load(transport, 1)(kv_cache, _config_for(transport, config))


def create_receiver(
    transport: str, kv_cache: torch.Tensor, config: KVTransferConfig | None = None
) -> KVReceiver:
    """A not-yet-started receiver of `transport` writing into blocks of `kv_cache`."""
    return _load(transport, 2)(kv_cache, _config_for(transport, config))


def _load(transport: str, which: int) -> type:
    if transport not in _REGISTRY:
        hint = " (resolve it first with resolve_transport)" if transport == "auto" else ""
        raise ValueError(f"transport must be one of {TRANSPORTS}{hint}, got {transport!r}")
    entry = _REGISTRY[transport]
    return getattr(importlib.import_module(entry[0]), entry[which])


def _config_for(transport: str, config: KVTransferConfig | None) -> KVTransferConfig:
    if config is None:
        return KVTransferConfig(transport=transport)
    if config.transport not in (transport, "auto"):
        raise ValueError(f"transport {transport!r} does not match config.transport {config.transport!r}")
    return config
