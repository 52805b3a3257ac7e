"""Fused elementwise kernels for the GPU decode path (imported only on CUDA, never on the CPU).

Each replaces several eager PyTorch kernels with one launch, which is what decides decode speed
when every launch costs microseconds: add+RMSNorm (1 instead of ~8), SiLU*mul (1 instead of 3),
per-head q/k RMSNorm + rotary embedding for q and k together (1 instead of ~20; with the KV store,
`qkv_rope_store`, in triton_qkv.py and re-exported here). Numerics follow the eager layers: fp32
math, results rounded to the activation dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from common.layers.fused import gemv_max_rows
from common.layers.pdl import pdl_enabled, pdl_launch_next_then_wait
from common.layers.triton_qkv import qkv_rope_store  # noqa: F401  (re-exported: ops().qkv_rope_store)


@triton.jit
def _rmsnorm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    stride_x,
    stride_r,
    stride_o,
    n,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)  # a weight: no kernel writes it
    # The rest are activations: wait for them, and let the projection after this kernel launch first,
    # so its weight reads start during this kernel's wait and run.
    pdl_launch_next_then_wait(PDL)
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_o + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, axis=0) / n + eps)
    y = (xf * inv).to(x_ptr.dtype.element_ty) * w
    tl.store(out_ptr + row * stride_o + cols, y, mask=mask)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """norm(x) or, with `residual`, (norm(x + residual), x + residual) for 2-d x."""
    rows, n = x.shape
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(out) if residual is not None else out
    # One row: the projection after it may be the streaming GEMV (triton_gemv.py), whose weight reads
    # then start while this kernel runs. Larger steps keep plain launches (PDL cost ~1.5% at 64
    # rows, common/layers/pdl.py; steps of 2-4 rows, which the GEMV may take too, keep them so that a
    # model whose weights never take it runs those steps exactly as before).
    pdl = rows == 1 and gemv_max_rows() > 0 and pdl_enabled(x.device)
    if rows:
        _rmsnorm_kernel[(rows,)](
            x,
            residual if residual is not None else x,
            weight,
            out,
            res_out,
            x.stride(0),
            (residual if residual is not None else x).stride(0),
            out.stride(0),
            n,
            eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK=triton.next_power_of_2(n),
            PDL=pdl,
            num_warps=4,
            launch_pdl=pdl,
        )
    return out if residual is None else (out, res_out)


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, stride_x, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + n + cols, mask=mask, other=0.0)
    y = (gate / (1.0 + tl.exp(-gate))).to(x_ptr.dtype.element_ty) * up
    tl.store(out_ptr + row * n + cols, y, mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    rows, width = x.shape
    n = width // 2
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows:
        block = 1024
        _silu_mul_kernel[(rows, triton.cdiv(n, block))](x, out, x.stride(0), n, BLOCK=block, num_warps=4)
    return out


@triton.jit
def _norm_rope_kernel(
    src_ptr,
    dst_ptr,
    w_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    stride_t,
    stride_h,
    num_heads,
    eps,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    HAS_NORM: tl.constexpr,
):
    tok = tl.program_id(0)
    head = tl.program_id(1)
    half = HALF
    d = tl.arange(0, HALF)
    base = src_ptr + tok * stride_t + head * stride_h
    x1 = tl.load(base + d).to(tl.float32)
    x2 = tl.load(base + half + d).to(tl.float32)
    if HAS_NORM:
        inv = tl.rsqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / HEAD_DIM + eps)
        dt = src_ptr.dtype.element_ty
        x1 = ((x1 * inv).to(dt) * tl.load(w_ptr + d)).to(tl.float32)
        x2 = ((x2 * inv).to(dt) * tl.load(w_ptr + half + d)).to(tl.float32)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    c = tl.load(cos_ptr + pos * half + d)
    s = tl.load(sin_ptr + pos * half + d)
    out = dst_ptr + (tok * num_heads + head) * HEAD_DIM
    tl.store(out + d, (x1 * c - x2 * s).to(dst_ptr.dtype.element_ty))
    tl.store(out + half + d, (x2 * c + x1 * s).to(dst_ptr.dtype.element_ty))


def norm_rope(
    x: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    """Optional per-head RMSNorm, then rotary embedding, of x [T, H, D] (a strided view is fine)."""
    tokens, heads, head_dim = x.shape
    out = torch.empty((tokens, heads, head_dim), dtype=x.dtype, device=x.device)
    if tokens:
        _norm_rope_kernel[(tokens, heads)](
            x,
            out,
            weight if weight is not None else x,
            cos,
            sin,
            positions,
            x.stride(0),
            x.stride(1),
            heads,
            eps,
            HEAD_DIM=head_dim,
            HALF=head_dim // 2,
            HAS_NORM=weight is not None,
            num_warps=1,
        )
    return out
