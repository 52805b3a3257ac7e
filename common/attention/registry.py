"""Backend registry with lazy imports, so CPU-only machines never import Triton or flash-attn."""

from __future__ import annotations

import importlib
import importlib.util

from common.attention.base import AttentionBackend

_BACKENDS: dict[str, str] = {
    "torch": "common.attention.torch_backend:TorchAttentionBackend",
    "triton": "common.attention.triton_backend:TritonAttentionBackend",
    "flash_attn": "common.attention.flash_attn_backend:FlashAttnBackend",
}


def available_backends(device_type: str) -> list[str]:
    """Backends usable on `device_type`, best first."""
    if device_type != "cuda":
        return ["torch"]
    names = []
    if importlib.util.find_spec("flash_attn") is not None:
        names.append("flash_attn")
    if importlib.util.find_spec("triton") is not None:
        names.append("triton")
    names.append("torch")
    return names


def resolve_backend_name(requested: str, device_type: str, block_size: int) -> str:
    """Turn "auto" into a concrete backend; reject an explicit choice the device cannot run."""
    usable = available_backends(device_type)
    if requested == "auto":
        for name in usable:
            if name == "flash_attn" and block_size % 256:
                continue
            if name == "triton" and not _module_exists("common.attention.triton_backend"):
                continue
            return name
        return "torch"
    if requested not in _BACKENDS:
        raise ValueError(f"attention_backend must be one of {sorted(_BACKENDS)} or 'auto', got {requested!r}")
    if requested not in usable:
        raise ValueError(f"attention_backend {requested!r} is not usable on device {device_type!r}")
    if requested == "flash_attn" and block_size % 256:
        raise ValueError(
            f"attention_backend 'flash_attn' needs kvcache_block_size % 256 == 0, got {block_size}"
        )
    return requested


def create_backend(name: str) -> AttentionBackend:
    module_name, _, class_name = _BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module_name), class_name)()


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False
