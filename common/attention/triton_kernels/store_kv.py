"""Scatter this step's keys and values into the paged KV cache in one launch (an fp8 cache: quantised,
each (token, KV head) vector with its own scale, common/attention/kv_fp8.py)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from common.attention import kv_fp8
from common.attention.triton_kernels.fp8 import scale_args, scale_of, to_fp8_range


@triton.jit
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    k_scale_ptr,
    v_scale_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_sb,
    stride_ss,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    FP8: tl.constexpr,  # an fp8 cache: quantise, and store each head's scale
):
    # One program per token: its [num_kv_heads, head_dim] rows of k and v.
    tok = tl.program_id(0)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    # A negative slot is padding: the mask turns both stores off (no branch, no host sync).
    mask = (heads < NUM_KV_HEADS) & (dims < HEAD_DIM) & (slot >= 0)
    cache_off = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs + heads * stride_ch + dims
    if FP8:
        head_ids = tl.arange(0, BLOCK_H)
        scale_off = (slot // BLOCK_SIZE) * stride_sb + (slot % BLOCK_SIZE) * stride_ss + head_ids
        scale_mask = (head_ids < NUM_KV_HEADS) & (slot >= 0)
        k = tl.load(k_ptr + tok * stride_kt + heads * stride_kh + dims, mask=mask, other=0.0)
        _store_fp8(k, k_cache_ptr + cache_off, k_scale_ptr + scale_off, mask, scale_mask)
        v = tl.load(v_ptr + tok * stride_vt + heads * stride_vh + dims, mask=mask, other=0.0)
        _store_fp8(v, v_cache_ptr + cache_off, v_scale_ptr + scale_off, mask, scale_mask)
    else:
        k = tl.load(k_ptr + tok * stride_kt + heads * stride_kh + dims, mask=mask)
        v = tl.load(v_ptr + tok * stride_vt + heads * stride_vh + dims, mask=mask)
        tl.store(k_cache_ptr + cache_off, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(v_cache_ptr + cache_off, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _store_fp8(x, cache_ptrs, scale_ptrs, mask, scale_mask):
    """Quantise x [BLOCK_H, BLOCK_D] (zeros where masked) row by row and store values and row scales."""
    xf = x.to(tl.float32)
    scale = scale_of(tl.max(tl.abs(xf), axis=1))
    tl.store(cache_ptrs, to_fp8_range(xf, scale[:, None]).to(cache_ptrs.dtype.element_ty), mask=mask)
    tl.store(scale_ptrs, scale, mask=scale_mask)


def store_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Write k, v [num_tokens, num_kv_heads, head_dim] to k_cache/v_cache at `slot_mapping` (skip slots < 0).

    The caches are [num_blocks, block_size, num_kv_heads, head_dim] with a unit-stride last dim (they may
    be views into the engine's 6-d cache tensor). k and v may be strided views of a fused qkv tensor.
    fp8 caches (kv_fp8.layer_views) are quantised, their scales written beside.
    """
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    k, v = _last_dim_contiguous(k), _last_dim_contiguous(v)
    if k_cache.stride(-1) != 1 or v_cache.stride() != k_cache.stride():
        raise ValueError("k_cache and v_cache must share strides and have a unit-stride head_dim")
    k_scales, v_scales, stride_sb, stride_ss = scale_args(k_cache, v_cache)
    _store_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k_scales,
        v_scales,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        stride_sb,
        stride_ss,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=k_cache.shape[1],
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
        FP8=kv_fp8.is_fp8(k_cache),
        num_warps=_store_num_warps(num_kv_heads * head_dim),
    )


def _store_num_warps(elements: int) -> int:
    # About 8 elements per thread keeps 16-byte vector accesses without idle lanes.
    return max(1, min(8, triton.next_power_of_2(elements) // 256))


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()
