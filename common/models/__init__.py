"""Model registry keyed by the `architectures` entry of a model's config.json (lazy imports)."""

from __future__ import annotations

import importlib

from torch import nn

from common.model_config import ModelConfig

_REGISTRY: dict[str, str] = {
    "LlamaForCausalLM": "common.models.families:LlamaForCausalLM",
    "Qwen2ForCausalLM": "common.models.families:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "common.models.families:Qwen3ForCausalLM",
}


def supported_architectures() -> list[str]:
    return sorted(_REGISTRY)


def model_class(architecture: str) -> type[nn.Module]:
    if architecture not in _REGISTRY:
        supported = ", ".join(supported_architectures())
        raise ValueError(f"architecture {architecture!r} is not supported; supported: {supported}")
    module, _, name = _REGISTRY[architecture].partition(":")
    return getattr(importlib.import_module(module), name)


def build_model(cfg: ModelConfig) -> nn.Module:
    return model_class(cfg.architecture)(cfg)
