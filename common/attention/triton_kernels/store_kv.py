"""Scatter this step's keys and values into the paged KV cache in one launch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_cs,
    stride_ch,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # One program per token: its [num_kv_heads, head_dim] rows of k and v.
    tok = tl.program_id(0)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    # A negative slot is padding: the mask turns both stores off (no branch, no host sync).
    mask = (heads < NUM_KV_HEADS) & (dims < HEAD_DIM) & (slot >= 0)
    cache_off = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs + heads * stride_ch + dims
    k = tl.load(k_ptr + tok * stride_kt + heads * stride_kh + dims, mask=mask)
    v = tl.load(v_ptr + tok * stride_vt + heads * stride_vh + dims, mask=mask)
    tl.store(k_cache_ptr + cache_off, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + cache_off, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Write k, v [num_tokens, num_kv_heads, head_dim] to k_cache/v_cache at `slot_mapping` (skip slots < 0).

    The caches are [num_blocks, block_size, num_kv_heads, head_dim] with a unit-stride last dim (they may
    be views into the engine's 6-d cache tensor). k and v may be strided views of a fused qkv tensor.
    """
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    k, v = _last_dim_contiguous(k), _last_dim_contiguous(v)
    if k_cache.stride(-1) != 1 or v_cache.stride() != k_cache.stride():
        raise ValueError("k_cache and v_cache must share strides and have a unit-stride head_dim")
    _store_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=k_cache.shape[1],
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
        num_warps=_store_num_warps(num_kv_heads * head_dim),
    )


def _store_num_warps(elements: int) -> int:
    # About 8 elements per thread keeps 16-byte vector accesses without idle lanes.
    return max(1, min(8, triton.next_power_of_2(elements) // 256))


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()
