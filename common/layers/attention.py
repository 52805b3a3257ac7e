"""The attention layer the models use: delegates to whichever backend the engine chose."""

from __future__ import annotations

import torch
from torch import nn

from common.attention.base import StepKV
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
        what bounds small-batch decode inside a CUDA graph. On prefill steps whose backend attends over
        the step's own keys (fresh prompts, see `varlen_prefill.py`) the kernel also writes the rotated
        k to a packed tensor; v is read in place from qkv.
        """
        ctx = get_forward_context()
        meta = ctx.meta
        k_out = None
        if not meta.is_decode and ctx.backend.prefill_reads_step_kv(
            meta, qkv.dtype, self.head_dim, self.scale
        ):
            k_out = torch.empty(
                (qkv.shape[0], self.num_kv_heads, self.head_dim), dtype=qkv.dtype, device=qkv.device
            )
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
            meta.slot_mapping,
            k_out,
        )
        if meta.is_decode:
            return ctx.backend.decode(q, self.k_cache, self.v_cache, meta, self.scale)
        step_kv = StepKV(k_out, self._v_view(qkv)) if k_out is not None else None
        return ctx.backend.prefill(q, self.k_cache, self.v_cache, meta, self.scale, step_kv)

    def _v_view(self, qkv: torch.Tensor) -> torch.Tensor:
        """The step's values as a row-strided [T, Hkv, D] view of qkv (they need no rotation)."""
        v_start = (self.num_heads + self.num_kv_heads) * self.head_dim
        return qkv[:, v_start:].view(qkv.shape[0], self.num_kv_heads, self.head_dim)
