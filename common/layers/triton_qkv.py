"""The fused q/k norm + rotary + KV store kernel of the GPU path (one launch instead of ~20; imported
only on CUDA). Numerics follow the eager layers: fp32 math, results rounded to the activation dtype; an
fp8 cache gets k and v quantised with one scale per (token, KV head) (common/attention/kv_fp8.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from common.attention import kv_fp8
from common.attention.triton_kernels.fp8 import scale_args, scale_of, to_fp8_range
from common.layers.pdl import pdl_enabled, pdl_launch_next_then_wait


@triton.jit
def _qkv_kernel(
    qkv_ptr,
    q_out_ptr,
    k_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    qw_ptr,
    kw_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    k_scale_ptr,
    v_scale_ptr,
    stride_t,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_sb,
    stride_ss,
    num_heads,
    num_kv_heads,
    eps,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    HAS_NORM: tl.constexpr,
    CACHE_BLOCK: tl.constexpr,
    K_OUT: tl.constexpr,
    FP8: tl.constexpr,  # an fp8 cache (common/attention/kv_fp8.py): quantise k and v, store their scales
    PDL: tl.constexpr,  # launched as a programmatic dependent (common/layers/pdl.py)
):
    # One program per (token, head) over q heads, then k heads, then v heads. Everything this kernel
    # reads but the norm weights and the rotary tables is written by a kernel, so with PDL it waits
    # first (and lets the attention after it launch meanwhile).
    pdl_launch_next_then_wait(PDL)
    tok = tl.program_id(0)
    head = tl.program_id(1)
    d = tl.arange(0, HALF)
    src = qkv_ptr + tok * stride_t + head * HEAD_DIM
    x1 = tl.load(src + d)
    x2 = tl.load(src + HALF + d)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    cache_off = (slot // CACHE_BLOCK) * stride_cb + (slot % CACHE_BLOCK) * stride_cs
    scale_off = (slot // CACHE_BLOCK) * stride_sb + (slot % CACHE_BLOCK) * stride_ss
    if head >= num_heads + num_kv_heads:  # v: straight into the cache
        kvh = head - num_heads - num_kv_heads
        dst = v_cache_ptr + cache_off + kvh * stride_ch
        _store_head(dst, v_scale_ptr + scale_off + kvh, x1, x2, slot >= 0, HALF, FP8)
    else:
        is_q = head < num_heads
        f1 = x1.to(tl.float32)
        f2 = x2.to(tl.float32)
        if HAS_NORM:
            w_ptr = qw_ptr if is_q else kw_ptr
            inv = tl.rsqrt((tl.sum(f1 * f1, axis=0) + tl.sum(f2 * f2, axis=0)) / HEAD_DIM + eps)
            dt = qkv_ptr.dtype.element_ty
            f1 = ((f1 * inv).to(dt) * tl.load(w_ptr + d)).to(tl.float32)
            f2 = ((f2 * inv).to(dt) * tl.load(w_ptr + HALF + d)).to(tl.float32)
        pos = tl.load(pos_ptr + tok).to(tl.int64)
        c = tl.load(cos_ptr + pos * HALF + d)
        s = tl.load(sin_ptr + pos * HALF + d)
        r1 = (f1 * c - f2 * s).to(qkv_ptr.dtype.element_ty)
        r2 = (f2 * c + f1 * s).to(qkv_ptr.dtype.element_ty)
        # The two branches name their destinations apart: Triton types a name across the branches of a
        # runtime `if`, and an fp8 cache row is not a bf16 pointer.
        if is_q:
            q_dst = q_out_ptr + (tok * num_heads + head) * HEAD_DIM
            tl.store(q_dst + d, r1)
            tl.store(q_dst + HALF + d, r2)
        else:
            kvh = head - num_heads
            cache_dst = k_cache_ptr + cache_off + kvh * stride_ch
            _store_head(cache_dst, k_scale_ptr + scale_off + kvh, r1, r2, slot >= 0, HALF, FP8)
            if K_OUT:  # the same rotated k, packed, for attention over the step's own keys
                k_dst = k_out_ptr + (tok * num_kv_heads + kvh) * HEAD_DIM
                tl.store(k_dst + d, r1)
                tl.store(k_dst + HALF + d, r2)


@triton.jit
def _store_head(dst, scale_dst, x1, x2, keep, HALF: tl.constexpr, FP8: tl.constexpr):
    """One head's halves x1, x2 into its cache row at `dst` (nothing when not `keep`, a padding slot);
    an fp8 cache gets them quantised by the head's own scale, which goes to `scale_dst`."""
    d = tl.arange(0, HALF)
    row_keep = (d < HALF) & keep
    if FP8:
        f1 = x1.to(tl.float32)
        f2 = x2.to(tl.float32)
        scale = scale_of(tl.maximum(tl.max(tl.abs(f1), axis=0), tl.max(tl.abs(f2), axis=0)))
        tl.store(dst + d, to_fp8_range(f1, scale).to(dst.dtype.element_ty), mask=row_keep)
        tl.store(dst + HALF + d, to_fp8_range(f2, scale).to(dst.dtype.element_ty), mask=row_keep)
        tl.store(scale_dst, scale, mask=keep)
    else:
        tl.store(dst + d, x1.to(dst.dtype.element_ty), mask=row_keep)
        tl.store(dst + HALF + d, x2.to(dst.dtype.element_ty), mask=row_keep)


def qkv_rope_store(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    num_heads: int,
    num_kv_heads: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """From the fused qkv projection [T, (H + 2 Hkv) * D]: q normed+rotated into a new [T, H, D]
    tensor; k normed+rotated and v written straight into their cache slots (slot < 0: skipped).
    One launch replaces q-rope, k-rope and the KV store (an fp8 cache: quantised, see
    common/attention/kv_fp8.py). With `k_out` ([T, Hkv, D], contiguous, qkv's dtype) the rotated k is
    also written there, every row, for prefill attention over the step's keys."""
    tokens = qkv.shape[0]
    head_dim = k_cache.shape[-1]
    q = torch.empty((tokens, num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    if k_out is not None and (
        k_out.shape != (tokens, num_kv_heads, head_dim)
        or k_out.dtype != qkv.dtype
        or not k_out.is_contiguous()
    ):
        raise ValueError(
            f"k_out must be a contiguous {qkv.dtype} [{tokens}, {num_kv_heads}, {head_dim}] tensor"
        )
    if tokens:
        # One token (a batch-1 decode step): the projection before this kernel and the attention after
        # it launch with PDL, so this one does too, and the two launch gaps around it overlap the
        # neighbours' tails. Larger steps keep plain launches, as the norm kernel does (triton_ops.py).
        pdl = tokens == 1 and pdl_enabled(qkv.device)
        has_norm = q_weight is not None
        k_scales, v_scales, stride_sb, stride_ss = scale_args(k_cache, v_cache)
        _qkv_kernel[(tokens, num_heads + 2 * num_kv_heads)](
            qkv,
            q,
            k_out if k_out is not None else q,
            k_cache,
            v_cache,
            slot_mapping,
            q_weight if has_norm else qkv,
            k_weight if has_norm else qkv,
            cos,
            sin,
            positions,
            k_scales,
            v_scales,
            qkv.stride(0),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            stride_sb,
            stride_ss,
            num_heads,
            num_kv_heads,
            eps,
            HEAD_DIM=head_dim,
            HALF=head_dim // 2,
            HAS_NORM=has_norm,
            CACHE_BLOCK=k_cache.shape[1],
            K_OUT=k_out is not None,
            FP8=kv_fp8.is_fp8(k_cache),
            PDL=pdl,
            num_warps=1,
            launch_pdl=pdl,
        )
    return q
