"""Rotary position embedding (rotate-half layout, as HF Llama/Qwen), with Llama-3 frequency scaling."""

from __future__ import annotations

import math

import torch
from torch import nn

from common.layers.fused import ops, use_fused


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, base: float, scaling: dict | None = None) -> None:
        super().__init__()
        self.head_dim = head_dim
        # Computed in fp32 exactly as HF does, so fp32 runs match transformers bit for bit.
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        inv_freq = _scale_inv_freq(inv_freq, scaling)
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, H, D], k [T, Hkv, D] rotated at `positions` [T]."""
        return self.forward_with_norm(positions, q, k, None, None)

    def forward_with_norm(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        q_norm: nn.Module | None,
        k_norm: nn.Module | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Optional per-head RMSNorm of q and k (Qwen3), then rotation; one kernel each on CUDA."""
        if use_fused(q) and self.head_dim & (self.head_dim - 1) == 0:
            fused = ops()
            qw, kw = (q_norm.weight, k_norm.weight) if q_norm is not None else (None, None)
            eps = q_norm.eps if q_norm is not None else 0.0
            return (
                fused.norm_rope(q, positions, self.cos, self.sin, qw, eps),
                fused.norm_rope(k, positions, self.cos, self.sin, kw, eps),
            )
        if q_norm is not None:
            q, k = q_norm(q), k_norm(k)
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)


def _scale_inv_freq(inv_freq: torch.Tensor, scaling: dict | None) -> torch.Tensor:
    if not scaling:
        return inv_freq
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    raise ValueError(f"rope_scaling type {kind!r} is not supported (supported: default, linear, llama3)")


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by `factor`, blend smoothly in between."""
    factor = scaling["factor"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, scaled)
