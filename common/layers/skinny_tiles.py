"""Tile helpers of the skinny projection kernel (common/layers/triton_skinny.py): loading a slice of
the (normalised) input rows and of the weight, and the per-tile product."""

from __future__ import annotations

import triton
import triton.language as tl

# Rows handled with multiply-adds instead of tensor-core tiles (which pad to 16 rows).
FMA_MAX_ROWS: tl.constexpr = tl.constexpr(4)


@triton.jit
def load_input(
    x_ptr,
    res_ptr,
    nw_ptr,
    rows,
    ks,
    row_ok,
    k_ok,
    inv,
    stride_x,
    stride_r,
    dt,
    HAS_RES: tl.constexpr,
    HAS_NORM: tl.constexpr,
):
    """Rows of the projection's input over columns `ks`: (x [+ residual]) [normed, scaled]."""
    mask = row_ok[:, None] & k_ok[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + ks[None, :], mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + rows[:, None] * stride_r + ks[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(dt)
    if HAS_NORM:
        w = tl.load(nw_ptr + ks, mask=k_ok, other=0.0)
        x = (x.to(tl.float32) * inv[:, None]).to(dt) * w[None, :]
    return x


@triton.jit
def _product(x, w, acc, BM: tl.constexpr, PRECISION: tl.constexpr):
    """acc + x @ w.T for x [BM, BK], w [BN, BK]. Up to 4 rows as fp32 multiply-adds straight from the
    loaded registers (a streaming read, like a GEMV); more rows on the tensor cores (16-row tiles)."""
    if BM <= FMA_MAX_ROWS:
        return acc + tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    return tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)


@triton.jit
def weights(w_ptr, cols, col_ok, ks, k_ok, N, stride_w, SILU_MUL: tl.constexpr, STREAM: tl.constexpr = False):
    """Weight tile [BN, BK] of columns `cols` over `ks`, and with SILU_MUL the matching up tile.
    STREAM: each tile is read once (a GEMV), so it leaves L2 first and the cache keeps what is reused."""
    mask = col_ok[:, None] & k_ok[None, :]
    offs = cols[:, None] * stride_w + ks[None, :]
    w = _load(w_ptr + offs, mask, STREAM)
    wu = w
    if SILU_MUL:
        wu = _load(w_ptr + N * stride_w + offs, mask, STREAM)
    return w, wu


@triton.jit
def _load(ptrs, mask, STREAM: tl.constexpr):
    if STREAM:
        tile = tl.load(ptrs, mask=mask, other=0.0, eviction_policy="evict_first")
    else:
        tile = tl.load(ptrs, mask=mask, other=0.0)
    return tile


@triton.jit
def accumulate(x, w, wu, acc, acc_up, BM: tl.constexpr, PRECISION: tl.constexpr, SILU_MUL: tl.constexpr):
    """One inner-dimension tile into the accumulators: gate (or plain) columns, and up with SILU_MUL."""
    acc = _product(x, w, acc, BM, PRECISION)
    if SILU_MUL:
        acc_up = _product(x, wu, acc_up, BM, PRECISION)
    return acc, acc_up
