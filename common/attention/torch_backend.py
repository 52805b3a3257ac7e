"""Reference attention backend in plain PyTorch: runs anywhere, including the CPU.

It gathers each sequence's paged context into a contiguous tensor and calls SDPA. It loops over
sequences on the host, so it is a correctness reference, not a fast path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from common.attention.base import AttentionBackend, AttentionMetadata
from common.blocks import blocks_for


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def store_kv(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        keep = slot_mapping >= 0
        slots = slot_mapping if bool(keep.all()) else slot_mapping[keep]
        if not bool(keep.all()):
            k, v = k[keep], v[keep]
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k.to(k_cache.dtype))
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v.to(v_cache.dtype))

    def prefill(
        self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float, step_kv=None
    ) -> torch.Tensor:
        return self._attend(q, k_cache, v_cache, meta, scale)

    def decode(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """All sequences in one SDPA call over their padded, gathered contexts."""
        tables = meta.block_tables.long()
        if meta.seq_lens_host:  # gather only the blocks some sequence uses (no device sync needed)
            tables = tables[:, : blocks_for(max(meta.seq_lens_host), k_cache.shape[1])]
        k = k_cache[tables].flatten(1, 2).transpose(1, 2)  # [B, Hkv, L, D]
        v = v_cache[tables].flatten(1, 2).transpose(1, 2)
        valid = torch.arange(k.shape[2], device=q.device).unsqueeze(0) < meta.seq_lens.unsqueeze(1)
        dtype = _compute_dtype(q)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2).to(dtype),  # [B, H, 1, D]
            k.to(dtype),
            v.to(dtype),
            attn_mask=valid[:, None, None, :],
            scale=scale,
            enable_gqa=k.shape[1] != q.shape[1],
        )
        return out.squeeze(2).to(q.dtype)

    def _attend(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        starts = meta.query_start_loc_host or meta.query_start_loc.tolist()
        seq_lens = meta.seq_lens_host or meta.seq_lens.tolist()
        block_size = k_cache.shape[1]
        out = torch.empty_like(q)
        for i, seq_len in enumerate(seq_lens):
            q_lo, q_hi = starts[i], starts[i + 1]
            if q_hi == q_lo:
                continue
            n_blocks = blocks_for(seq_len, block_size)
            blocks = meta.block_tables[i, :n_blocks].long()
            k = k_cache[blocks].flatten(0, 1)[:seq_len]
            v = v_cache[blocks].flatten(0, 1)[:seq_len]
            out[q_lo:q_hi] = _causal_attention(q[q_lo:q_hi], k, v, scale)
        return out


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [Lq, H, D] at the last Lq positions of k/v [Lk, Hkv, D] -> [Lq, H, D]."""
    q_len, num_heads, _ = q.shape
    k_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    q_pos = torch.arange(k_len - q_len, k_len, device=q.device).unsqueeze(1)
    mask = torch.arange(k_len, device=q.device).unsqueeze(0) <= q_pos
    dtype = _compute_dtype(q)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).to(dtype),
        k.transpose(0, 1).to(dtype),
        v.transpose(0, 1).to(dtype),
        attn_mask=mask,
        scale=scale,
    )
    return out.transpose(0, 1).to(q.dtype)


def _compute_dtype(q: torch.Tensor) -> torch.dtype:
    """Half-precision attention runs in float32 on the CPU: PyTorch's CPU SDPA kernels take 4x longer
    in bf16 than in fp32 for these shapes (the weights stay bf16, where halving the bytes pays)."""
    return torch.float32 if q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16) else q.dtype
