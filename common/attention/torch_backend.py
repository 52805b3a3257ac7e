"""Reference attention backend in plain PyTorch: runs anywhere, including the CPU.

It gathers each sequence's paged context into a contiguous tensor and calls SDPA. It loops over
sequences on the host for prefill, so it is a correctness reference, not a fast path on a GPU; on the
CPU it is the engine's backend, and its bf16 decode keeps float32 contexts across steps
(`torch_contexts.py`). An fp8 cache (`kv_fp8.py`) is quantised on store and dequantised as it is
gathered, into the compute dtype; its decode does not keep widened contexts (fp8 is a GPU memory
saving; on the CPU it is a correctness reference).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from common.attention import kv_fp8
from common.attention.base import AttentionBackend, AttentionMetadata
from common.attention.torch_contexts import WideContexts, budget_bytes
from common.wire.blocks import blocks_for


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def __init__(self) -> None:
        # Reused across layers and steps by the half-precision CPU decode path (fresh multi-MB
        # tensors every layer cost page faults that took longer than the copies themselves).
        self._scratch: dict[str, torch.Tensor] = {}
        self._contexts = WideContexts(budget_bytes())

    def store_kv(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        keep = slot_mapping >= 0
        slots = slot_mapping.long()  # packed steps carry int32 slots
        if not bool(keep.all()):  # padding rows (slot -1) write nothing
            slots, k, v = slots[keep], k[keep], v[keep]
        if kv_fp8.is_fp8(k_cache):
            kv_fp8.store(k, v, k_cache, v_cache, slots)
            return
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k.to(k_cache.dtype))
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v.to(v_cache.dtype))

    def prefill(
        self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float, step_kv=None
    ) -> torch.Tensor:
        self._contexts.invalidate()
        return self._attend(q, k_cache, v_cache, meta, scale)

    def decode(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """All sequences in one SDPA call over their padded, gathered contexts."""
        tables = meta.block_tables.long()
        if meta.seq_lens_host:  # gather only the blocks some sequence uses (no device sync needed)
            tables = tables[:, : blocks_for(max(meta.seq_lens_host), k_cache.shape[1])]
        if kv_fp8.is_fp8(k_cache):
            return self._decode_fp8(q, k_cache, v_cache, tables, meta, scale)
        if _compute_dtype(q) != q.dtype:
            return self._decode_upcast(q, k_cache, v_cache, tables, meta, scale)
        k = _gather(k_cache, tables).transpose(1, 2)  # [B, Hkv, L, D]
        v = _gather(v_cache, tables).transpose(1, 2)
        valid = torch.arange(k.shape[2], device=q.device).unsqueeze(0) < meta.seq_lens.unsqueeze(1)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2),  # [B, H, 1, D]
            k,
            v,
            attn_mask=valid[:, None, None, :],
            scale=scale,
            enable_gqa=k.shape[1] != q.shape[1],
        )
        return out.squeeze(2)

    def _decode_fp8(self, q, k_cache, v_cache, tables, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """Decode over an fp8 cache: the contexts are dequantised into the compute dtype as gathered."""
        dtype = _compute_dtype(q)
        k = _gather_fp8(k_cache, tables, dtype).transpose(1, 2)  # [B, Hkv, L, D]
        v = _gather_fp8(v_cache, tables, dtype).transpose(1, 2)
        valid = torch.arange(k.shape[2], device=q.device).unsqueeze(0) < meta.seq_lens.unsqueeze(1)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2).to(dtype),  # [B, H, 1, D]
            k,
            v,
            attn_mask=valid[:, None, None, :],
            scale=scale,
            enable_gqa=k.shape[1] != q.shape[1],
        )
        return out.squeeze(2).to(q.dtype)

    def _decode_upcast(
        self, q, k_cache, v_cache, tables, meta: AttentionMetadata, scale: float
    ) -> torch.Tensor:
        """Half-precision decode on the CPU, attended in float32 over the layer's widened contexts
        (torch_contexts.py; without them, gathered into scratch and widened in one copy each). The
        query heads that share a KV head are stacked as the rows of one query ([B, Hkv, group, D]),
        so SDPA never repeats K/V for GQA."""
        num_seqs, num_heads, head_dim = q.shape
        num_kv_heads = k_cache.shape[2]
        widened = self._contexts.get(k_cache, v_cache, tables, meta)
        if widened is None:
            widened = (self._widen("k", k_cache, tables), self._widen("v", v_cache, tables))
        length = widened[0].shape[2]
        valid = torch.arange(length, device=q.device).unsqueeze(0) < meta.seq_lens.unsqueeze(1)
        out = F.scaled_dot_product_attention(
            q.reshape(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim).float(),
            widened[0],
            widened[1],
            attn_mask=valid[:, None, None, :],
            scale=scale,
        )
        return out.view(num_seqs, num_heads, head_dim).to(q.dtype)

    def _widen(self, name: str, cache: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
        """The contexts of `tables` as [B, Hkv, L, D] float32, through two scratch buffers."""
        num_seqs, block_size, num_kv_heads, head_dim = tables.shape[0], *cache.shape[1:]
        length = tables.shape[1] * block_size
        flat = tables.flatten()
        gathered = self._buffer("gather", (flat.shape[0], *cache.shape[1:]), cache.dtype, cache.device)
        torch.index_select(cache, 0, flat, out=gathered)
        wide = self._buffer(name, (num_seqs, num_kv_heads, length, head_dim), torch.float32, cache.device)
        return wide.copy_(gathered.view(num_seqs, length, num_kv_heads, head_dim).transpose(1, 2))

    def _buffer(
        self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """A scratch tensor of `shape`, grown (never shrunk) as contexts get longer."""
        numel = math.prod(shape)
        buf = self._scratch.get(name)
        if buf is None or buf.numel() < numel or buf.dtype != dtype:
            buf = torch.empty(numel, dtype=dtype, device=device)
            self._scratch[name] = buf
        return buf[:numel].view(shape)

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
            k = _context(k_cache, blocks, _compute_dtype(q))[:seq_len]
            v = _context(v_cache, blocks, _compute_dtype(q))[:seq_len]
            out[q_lo:q_hi] = _causal_attention(q[q_lo:q_hi], k, v, scale)
        return out


def _gather(cache: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """The blocks of `tables` [B, N] as one [B, N * block_size, Hkv, D] context per sequence
    (`index_select` on the flat table copies the same values as `cache[tables]`, in less time)."""
    return cache.index_select(0, tables.flatten()).view(tables.shape[0], -1, *cache.shape[2:])


def _gather_fp8(cache: torch.Tensor, tables: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`_gather` of an fp8 cache, dequantised to `dtype`: [B, N * block_size, Hkv, D]."""
    return kv_fp8.gather(cache, tables.flatten(), dtype).view(tables.shape[0], -1, *cache.shape[2:])


def _context(cache: torch.Tensor, blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One sequence's blocks as [n * block_size, Hkv, D] (an fp8 cache dequantised to `dtype`)."""
    if kv_fp8.is_fp8(cache):
        return kv_fp8.gather(cache, blocks, dtype).flatten(0, 1)
    return cache[blocks].flatten(0, 1)


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
