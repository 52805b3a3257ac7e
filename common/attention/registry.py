"""Backend registry with lazy imports, so CPU-only machines never import Triton."""

from __future__ import annotations

import importlib
import importlib.util

from common.attention.base import AttentionBackend

_BACKENDS: dict[str, str] = {
    "torch": "common.attention.torch_backend:TorchAttentionBackend",
    "triton": "common.attention.triton_backend:TritonAttentionBackend",
}


def available_backends(device_type: str) -> list[str]:
    """Backends usable on `device_type`, best first."""
    if device_type != "cuda":
        return ["torch"]
    names = []
    if importlib.util.find_spec("triton") is not None:
        names.append("triton")
    names.append("torch")
    return names


def resolve_backend_name(requested: str, device_type: str) -> str:
    """Turn "auto" into a concrete backend; reject an explicit choice the device cannot run."""
    usable = available_backends(device_type)
    if requested == "auto":
        for name in usable:
            if name == "triton" and not _module_exists("common.attention.triton_backend"):
                continue
            return name
        return "torch"
    if requested not in _BACKENDS:
        raise ValueError(f"attention_backend must be one of {sorted(_BACKENDS)} or 'auto', got {requested!r}")
    if requested not in usable:
        raise ValueError(f"attention_backend {requested!r} is not usable on device {device_type!r}")
    return requested


def create_backend(name: str) -> AttentionBackend:
    module_name, _, class_name = _BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module_name), class_name)()


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False
