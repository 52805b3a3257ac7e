"""Streams safetensors checkpoints into a model through each parameter's `weight_loader`."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


def load_weights(model: nn.Module, model_dir: str | Path) -> None:
    """Load every `*.safetensors` file of `model_dir`, one tensor at a time (no full-state copy).

    Checkpoint names are mapped through `model.packed_modules_mapping` (q/k/v -> qkv_proj,
    gate/up -> gate_up_proj). With tied embeddings a checkpoint `lm_head.weight` is ignored.
    Raises ValueError on an unknown tensor, a shape mismatch or a parameter left unloaded.
    """
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"model: no *.safetensors files in {model_dir}")
    params = dict(model.named_parameters())
    mapping: dict = getattr(model, "packed_modules_mapping", {})
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    loaded: dict[str, int] = {}
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                if name.endswith(_IGNORED_SUFFIXES) or (tied and name == "lm_head.weight"):
                    continue
                target, shard = _map_name(name, mapping)
                param = params.get(target)
                if param is None:
                    raise ValueError(f"checkpoint tensor {name!r} has no matching parameter ({target!r})")
                loader = getattr(param, "weight_loader", default_weight_loader)
                try:
                    loader(param, f.get_tensor(name), shard)
                except ValueError as exc:
                    raise ValueError(f"checkpoint tensor {name!r}: {exc}") from exc
                loaded[target] = loaded.get(target, 0) + 1
    _check_complete(params, loaded)


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
    """For parameters every rank holds whole (norms): a shape-checked copy."""
    if param.data.shape != loaded.shape:
        raise ValueError(f"shape {tuple(loaded.shape)} does not fit {tuple(param.data.shape)}")
    param.data.copy_(loaded)


def _map_name(name: str, mapping: dict) -> tuple[str, object]:
    for ckpt_part, (our_part, shard) in mapping.items():
        if f".{ckpt_part}." in name:
            return name.replace(f".{ckpt_part}.", f".{our_part}."), shard
    return name, None


def _expected_shards(name: str) -> int:
    if ".qkv_proj." in name:
        return 3
    if ".gate_up_proj." in name:
        return 2
    return 1


def _check_complete(params: dict[str, nn.Parameter], loaded: dict[str, int]) -> None:
    missing = [n for n in params if loaded.get(n, 0) < _expected_shards(n)]
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ValueError(f"checkpoint is missing {len(missing)} tensors: {shown}")
