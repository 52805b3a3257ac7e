"""Triton pieces of the fp8 KV cache (layout and reasons: common/attention/kv_fp8.py).

Kernels that write the cache quantise each (token, KV head) vector with its own scale; kernels that read
it load the scales of a tile's tokens next to the values and apply them to the scores (keys) and to the
softmax weights (values), so the fp8 values go into the dot products unscaled (e4m3 values are exact in
bf16 and fp16). Every kernel takes the fp8 path behind an `FP8: tl.constexpr` switch: a bf16 or fp32
cache compiles the kernel exactly as before, with dummy scale arguments it never reads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from common.attention import kv_fp8

FP8_MAX = tl.constexpr(kv_fp8.FP8_MAX)
SCALE_EPS = tl.constexpr(kv_fp8.SCALE_EPS)


@triton.jit
def scale_of(amax):
    """The scale of a vector whose largest magnitude is `amax` (fp32), as kv_fp8.quantize."""
    return tl.maximum(amax / FP8_MAX, SCALE_EPS)


@triton.jit
def to_fp8_range(x, scale):
    """x / scale clamped to e4m3's finite range (fp32; the caller converts to the cache's fp8 type)."""
    y = x / scale
    return tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX)


@triton.jit
def token_scales(scale_head_ptr, blocks, toks, tok_mask, stride_sb, stride_ss, BLOCK_SIZE: tl.constexpr):
    """Scales of context tokens `toks` (in blocks `blocks`) of one KV head; 0 where masked."""
    return tl.load(
        scale_head_ptr + blocks * stride_sb + (toks % BLOCK_SIZE) * stride_ss, mask=tok_mask, other=0.0
    )


def scale_args(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple:
    """(k_scales, v_scales, block stride, token stride) for a kernel launch: the caches' scale views when
    they are fp8 (head stride 1), else the caches themselves and zeros (never read: FP8 is False)."""
    if not kv_fp8.is_fp8(k_cache):
        return k_cache, v_cache, 0, 0
    k_scales, v_scales = kv_fp8.scales_of(k_cache), kv_fp8.scales_of(v_cache)
    if k_scales.stride() != v_scales.stride() or k_scales.stride(2) != 1:
        raise ValueError("k and v fp8 caches must share one layout (kv_fp8.layer_views)")
    return k_scales, v_scales, k_scales.stride(0), k_scales.stride(1)
