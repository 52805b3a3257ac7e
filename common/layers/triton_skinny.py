"""Projections of a few rows (decode steps) as one Triton kernel each, with their neighbours fused in.

At batch 1-16 a decode step's projections read megabytes of weights for a handful of rows. cuBLAS
picks tiles made for large products there and reaches about a quarter of the H200's bandwidth (the
profile of a batch-1 Qwen3-0.6B step: 28 us of GEMMs per layer for 7.5 us of weights), and each
projection is surrounded by small kernels. Here each program owns `BN` output columns of every row:
it streams its slice of the weight once and keeps all rows' accumulators, so the weight is read once
per step at nearly full bandwidth, and the neighbours come along:

* the residual add and RMSNorm before a projection: each program reads the (few) input rows itself,
  sums `x + residual` (program 0 alone writes that sum out: it is the next residual), scales by the
  norm weight, and since the norm's 1/rms is one factor per row it multiplies the accumulator once at
  the end (`sum_k x_k w_k g_nk / rms == (sum_k x_k w_k g_nk) / rms`), so no second pass is needed;
* SiLU(gate) * up after the merged gate/up projection: each program computes its gate columns and the
  matching up columns and writes only the product.

This replaces per layer: two add+RMSNorm kernels, the SiLU*mul kernel and cuBLAS's split-K reduction.
Numerics: fp32 accumulation; the normed input is rounded to the activation dtype before the product
like the eager path's, but 1/rms is applied after it, so results agree with the eager layers within
the dtype's rounding, not bit for bit. Float32 dots are exact (`ieee`), never TF32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from common.layers.fused import SKINNY_MAX_ROWS  # tl.dot pads the rows to 16; past that cuBLAS tiles win


@dataclass(frozen=True)
class SkinnyLaunch:
    """Tile and launch shape: `block_n` output columns per program, `block_k` of the inner dimension
    per loop iteration."""

    block_n: int = 16
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 4


def launch_for(n: int, k: int) -> SkinnyLaunch:
    """The launch for an [n, k] weight. Narrow outputs (n <= 1024 gives 64 programs at 16 columns
    each) get longer loops per program; see benchmarks/skinny_gemm.py for the sweep behind this."""
    return SkinnyLaunch(block_n=16, block_k=256 if k <= 2048 else 512)


@triton.jit
def _skinny_kernel(
    x_ptr,
    res_ptr,
    res_out_ptr,
    nw_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    M,
    N,
    stride_x,
    stride_r,
    stride_ro,
    stride_w,
    stride_o,
    eps,
    K: tl.constexpr,  # per layer shape: a known trip count lets the loads be pipelined
    HAS_RES: tl.constexpr,
    HAS_NORM: tl.constexpr,
    SILU_MUL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = tl.arange(0, BM)
    row_ok = rows < M
    cols = pid * BN + tl.arange(0, BN)
    col_ok = cols < N
    dt = out_ptr.dtype.element_ty
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    acc_up = tl.zeros([BM, BN], dtype=tl.float32)
    sumsq = tl.zeros([BM], dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        k_ok = ks < K
        x_mask = row_ok[:, None] & k_ok[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_x + ks[None, :], mask=x_mask, other=0.0)
        if HAS_RES:
            r = tl.load(res_ptr + rows[:, None] * stride_r + ks[None, :], mask=x_mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(dt)
            if pid == 0:
                tl.store(res_out_ptr + rows[:, None] * stride_ro + ks[None, :], x, mask=x_mask)
        if HAS_NORM:
            xf = x.to(tl.float32)
            sumsq += tl.sum(xf * xf, axis=1)
            x = (xf * tl.load(nw_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)[None, :]).to(dt)
        w_mask = col_ok[:, None] & k_ok[None, :]
        w = tl.load(w_ptr + cols[:, None] * stride_w + ks[None, :], mask=w_mask, other=0.0)
        acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
        if SILU_MUL:
            wu = tl.load(w_ptr + (cols + N)[:, None] * stride_w + ks[None, :], mask=w_mask, other=0.0)
            acc_up = tl.dot(x, tl.trans(wu), acc_up, input_precision=PRECISION)
    if HAS_NORM:
        inv = tl.rsqrt(sumsq / K + eps)
        acc = acc * inv[:, None]
        acc_up = acc_up * inv[:, None]
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if SILU_MUL:
        gate = acc.to(dt).to(tl.float32)
        y = (gate / (1.0 + tl.exp(-gate))).to(dt) * acc_up.to(dt)
    else:
        y = acc.to(dt)
    tl.store(out_ptr + rows[:, None] * stride_o + cols[None, :], y, mask=row_ok[:, None] & col_ok[None, :])


def skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    residual: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    silu_mul: bool = False,
    launch: SkinnyLaunch | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`linear(x, weight, bias)` for x of at most SKINNY_MAX_ROWS rows, with optional fusions:

    * `norm_weight`: the input is `rmsnorm(x [+ residual]) * norm_weight` first; with `residual` the
      result is `(out, x + residual)`, the second being the next residual stream;
    * `silu_mul`: `weight` is a merged [gate; up] projection ([2n, k]) and the result is
      `silu(x @ gate.T) * (x @ up.T)`, [rows, n].
    """
    rows, k = x.shape
    if rows > SKINNY_MAX_ROWS:
        raise ValueError(f"skinny_linear takes at most {SKINNY_MAX_ROWS} rows, got {rows}")
    if residual is not None and norm_weight is None:
        raise ValueError("skinny_linear: residual is only fused together with norm_weight")
    if silu_mul and bias is not None:
        raise ValueError("skinny_linear: silu_mul takes no bias")
    n = weight.shape[0] // 2 if silu_mul else weight.shape[0]
    x = x.contiguous()
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(x) if residual is not None else x
    if residual is not None:
        residual = residual.contiguous()
    cfg = launch or launch_for(n, k)
    if rows:
        _skinny_kernel[(triton.cdiv(n, cfg.block_n),)](
            x,
            residual if residual is not None else x,
            res_out,
            norm_weight if norm_weight is not None else x,
            weight,
            bias if bias is not None else x,
            out,
            rows,
            n,
            x.stride(0),
            (residual if residual is not None else x).stride(0),
            res_out.stride(0),
            weight.stride(0),
            out.stride(0),
            eps,
            K=k,
            HAS_RES=residual is not None,
            HAS_NORM=norm_weight is not None,
            SILU_MUL=silu_mul,
            HAS_BIAS=bias is not None,
            BM=SKINNY_MAX_ROWS,
            BN=cfg.block_n,
            BK=cfg.block_k,
            PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
    return out if residual is None else (out, res_out)
