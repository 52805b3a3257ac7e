"""The attention layer the models use: delegates to whichever backend the engine chose."""

from __future__ import annotations

import torch
from torch import nn

from common.attention.context import get_forward_context
from common.layers.fused import ops


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

    def forward_qkv_fused(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        rotary,
        q_norm: nn.Module | None,
        k_norm: nn.Module | None,
    ) -> torch.Tensor:
        """CUDA path: one kernel applies q/k norm + rotary and stores k, v in the cache; then attend.

        Saves two launches per layer (separate q and k rotary kernels and the KV store), which is
        what bounds small-batch decode inside a CUDA graph.
        """
        ctx = get_forward_context()
        q = ops().qkv_rope_store(
            qkv,
            positions,
            rotary.cos,
            rotary.sin,
            q_norm.weight if q_norm is not None else None,
            k_norm.weight if k_norm is not None else None,
            q_norm.eps if q_norm is not None else 0.0,
            self.num_heads,
            self.num_kv_heads,
            self.k_cache,
            self.v_cache,
            ctx.meta.slot_mapping,
        )
        attend = ctx.backend.decode if ctx.meta.is_decode else ctx.backend.prefill
        return attend(q, self.k_cache, self.v_cache, ctx.meta, self.scale)
