"""The attention layer the models use: delegates to whichever backend the engine chose."""

from __future__ import annotations

import torch
from torch import nn

from common.attention.context import get_forward_context


class Attention(nn.Module):
    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.num_kv_heads = num_heads, head_dim, num_kv_heads
        self.scale = scale
        # Views into the engine's KV cache tensor, bound by the model runner after allocation.
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = get_forward_context()
        return ctx.backend.forward(q, k, v, self.k_cache, self.v_cache, ctx.meta, self.scale)
