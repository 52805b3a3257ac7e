"""Projections of a few rows (decode steps) as one Triton kernel each, with their neighbours fused in.

At one row a decode step's projections read megabytes of weights for one input row. cuBLAS picks
tiles made for large products there (the profile of a batch-1 Qwen3-0.6B step: 28 us of GEMMs per
layer for 31.5 MB of weights, with a split-K reduction kernel), and each projection is surrounded by
small kernels. Here each program owns `BN` output columns and one part of the inner dimension: it
streams its slice of the weight once (up to 4 rows as fp32 multiply-adds straight from the loaded
registers, 5-16 rows on 16-row tensor-core tiles), the last program to arrive at a column block adds
the parts, and the neighbours come along:

* the residual add and RMSNorm before a projection: each program first sums the squares of the few
  input rows (`x + residual`) itself, then normalises and scales each loaded slice exactly as the
  eager layer rounds it; program (0, 0) alone writes `x + residual` out (the next residual stream);
* SiLU(gate) * up after the merged gate/up projection: each program computes its gate columns and the
  matching up columns and writes only the product.

Per layer this replaces two add+RMSNorm kernels, the SiLU*mul kernel and cuBLAS's split-K reduction.
The engine sends it 1-row steps only (`SKINNY_MAX_ROWS`, where it was measured to win; see
docs/benchmarks-log.md). Numerics: fp32 accumulation in another order than cuBLAS, so results agree with
the eager layers within the dtype's rounding, not bit for bit. Float32 dots are exact (`ieee`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from common.layers.pdl import pdl_enabled, pdl_wait
from common.layers.skinny_tiles import FMA_MAX_ROWS, accumulate, load_input, weights
from common.layers.split_arrival import ArrivalCounters, arrive, depart, split_to_fill

# The kernel takes up to 16 rows (tl.dot pads to 16); the engine sends it SKINNY_MAX_ROWS (fused.py).
_MAX_ROWS = 16


@dataclass(frozen=True)
class SkinnyLaunch:
    """Tile and launch shape: `block_n` output columns per program, `block_k` of the inner dimension
    per loop iteration, the inner dimension cut into `split_k` parts (0: chosen from the shape)."""

    block_n: int = 32
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 0


# Programs to aim for: about four per SM of an H200 keeps enough weight loads in flight.
_TARGET_PROGRAMS = 528


def launch_for(n: int, k: int, rows: int) -> SkinnyLaunch:
    """The launch for an [n, k] weight and `rows` input rows (benchmarks/engine/skinny_gemm.py sweeps them):
    the multiply-add path keeps about 8k products per iteration in registers."""
    if rows == 1:  # the H200 sweep's best for all four Qwen3-0.6B projections
        return SkinnyLaunch(block_n=8, block_k=1024)
    if rows <= FMA_MAX_ROWS.value:
        return SkinnyLaunch(block_n=16, block_k=512 // triton.next_power_of_2(rows))
    return SkinnyLaunch(block_n=32, block_k=256)


def split_for(n: int, k: int, launch: SkinnyLaunch) -> int:
    """Inner-dimension parts: enough programs to fill the GPU (split_arrival.split_to_fill)."""
    return split_to_fill(n, k, launch, _TARGET_PROGRAMS)


# Arrival counters of the split programs, one per column block (common/layers/split_arrival.py).
_COUNTERS = ArrivalCounters("skinny_linear", 1 << 16)


@triton.jit
def _skinny_kernel(
    x_ptr,
    res_ptr,
    res_out_ptr,
    nw_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    part_ptr,
    ticket_ptr,
    M,
    N,
    stride_x,
    stride_r,
    stride_ro,
    stride_w,
    stride_o,
    eps,
    K: tl.constexpr,  # per layer shape: a known trip count lets the loads be pipelined
    SPLIT_K: tl.constexpr,
    K_PER_SPLIT: tl.constexpr,
    HAS_RES: tl.constexpr,
    HAS_NORM: tl.constexpr,
    SILU_MUL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,  # launched as a programmatic dependent (common/layers/pdl.py)
):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    rows = tl.arange(0, BM)
    row_ok = rows < M
    cols = pid * BN + tl.arange(0, BN)
    col_ok = cols < N
    dt = out_ptr.dtype.element_ty
    first = split * K_PER_SPLIT + tl.arange(0, BK)
    if PDL:  # weights are no kernel's output: fetch the first tile while the previous kernel ends
        w_first, wu_first = weights(w_ptr, cols, col_ok, first, first < K, N, stride_w, SILU_MUL)
    pdl_wait(PDL)
    inv = tl.zeros([BM], dtype=tl.float32)
    if HAS_NORM:  # each program sums the few input rows itself (from L2): no kernel before this one
        for k0 in range(0, K, BK):
            ks = k0 + tl.arange(0, BK)
            x = load_input(
                x_ptr, res_ptr, nw_ptr, rows, ks, row_ok, ks < K, inv, stride_x, stride_r, dt, HAS_RES, False
            ).to(tl.float32)
            inv += tl.sum(x * x, axis=1)
        inv = tl.rsqrt(inv / K + eps)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    acc_up = tl.zeros([BM, BN], dtype=tl.float32)
    if PDL:
        x = load_input(
            x_ptr,
            res_ptr,
            nw_ptr,
            rows,
            first,
            row_ok,
            first < K,
            inv,
            stride_x,
            stride_r,
            dt,
            HAS_RES,
            HAS_NORM,
        )
        acc, acc_up = accumulate(x, w_first, wu_first, acc, acc_up, BM, PRECISION, SILU_MUL)
    for kk in range(BK if PDL else 0, K_PER_SPLIT, BK):
        ks = split * K_PER_SPLIT + kk + tl.arange(0, BK)
        k_ok = ks < K
        x = load_input(
            x_ptr, res_ptr, nw_ptr, rows, ks, row_ok, k_ok, inv, stride_x, stride_r, dt, HAS_RES, HAS_NORM
        )
        w, wu = weights(w_ptr, cols, col_ok, ks, k_ok, N, stride_w, SILU_MUL)
        acc, acc_up = accumulate(x, w, wu, acc, acc_up, BM, PRECISION, SILU_MUL)
    tile = rows[:, None] * BN + tl.arange(0, BN)[None, :]
    last = True
    if SPLIT_K > 1:  # partials to scratch; the last program to arrive at this column block adds them
        part = part_ptr + (pid * SPLIT_K + split) * (2 * BM * BN)
        tl.store(part + tile, acc)
        tl.store(part + BM * BN + tile, acc_up)
        last = arrive(ticket_ptr + pid, SPLIT_K)
        if last:
            acc = tl.zeros([BM, BN], dtype=tl.float32)
            acc_up = tl.zeros([BM, BN], dtype=tl.float32)
            for s in range(0, SPLIT_K):
                other = part_ptr + (pid * SPLIT_K + s) * (2 * BM * BN)
                acc += tl.load(other + tile, cache_modifier=".cg")
                acc_up += tl.load(other + BM * BN + tile, cache_modifier=".cg")
            depart(ticket_ptr + pid)
    if last:
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if SILU_MUL:
            gate = acc.to(dt).to(tl.float32)
            y = (gate / (1.0 + tl.exp(-gate))).to(dt) * acc_up.to(dt)
        else:
            y = acc.to(dt)
        tl.store(
            out_ptr + rows[:, None] * stride_o + cols[None, :], y, mask=row_ok[:, None] & col_ok[None, :]
        )
    if HAS_RES:  # noqa: SIM102 (a compile-time branch around a run-time one)
        if (pid == 0) & (split == 0):  # the next residual stream, written once
            for k0 in range(0, K, BK):
                ks = k0 + tl.arange(0, BK)
                x = load_input(
                    x_ptr, res_ptr, nw_ptr, rows, ks, row_ok, ks < K, inv, stride_x, stride_r, dt, True, False
                )
                mask = row_ok[:, None] & (ks < K)[None, :]
                tl.store(res_out_ptr + rows[:, None] * stride_ro + ks[None, :], x, mask=mask)


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
    """`linear(x, weight, bias)` for x of at most _MAX_ROWS rows, with optional fusions:

    * `norm_weight`: the input is `rmsnorm(x [+ residual]) * norm_weight` first; with `residual` the
      result is `(out, x + residual)`, the second being the next residual stream;
    * `silu_mul`: `weight` is a merged [gate; up] projection ([2n, k]) and the result is
      `silu(x @ gate.T) * (x @ up.T)`, [rows, n].
    """
    rows, k = x.shape
    if rows > _MAX_ROWS:
        raise ValueError(f"skinny_linear takes at most {_MAX_ROWS} rows, got {rows}")
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
    cfg = launch or launch_for(n, k, rows)
    split = split_for(n, k, cfg)
    tile_rows = triton.next_power_of_2(rows) if rows <= FMA_MAX_ROWS.value else _MAX_ROWS
    blocks = triton.cdiv(n, cfg.block_n)
    per_split = triton.cdiv(triton.cdiv(k, split), cfg.block_k) * cfg.block_k
    # Scratch for the split programs' partial sums; one part needs none (the kernel never reads it).
    part_size = blocks * split * 2 * tile_rows * cfg.block_n
    part = torch.empty(part_size, dtype=torch.float32, device=x.device) if split > 1 else out
    pdl = pdl_enabled(x.device)
    if rows:
        _skinny_kernel[(blocks, split)](
            x,
            residual if residual is not None else x,
            res_out,
            norm_weight if norm_weight is not None else x,
            weight,
            bias if bias is not None else x,
            out,
            part,
            _COUNTERS.get(x.device, blocks),
            rows,
            n,
            x.stride(0),
            (residual if residual is not None else x).stride(0),
            res_out.stride(0),
            weight.stride(0),
            out.stride(0),
            eps,
            K=k,
            SPLIT_K=split,
            K_PER_SPLIT=per_split,
            HAS_RES=residual is not None,
            HAS_NORM=norm_weight is not None,
            SILU_MUL=silu_mul,
            HAS_BIAS=bias is not None,
            BM=tile_rows,
            BN=cfg.block_n,
            BK=cfg.block_k,
            PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
            PDL=pdl,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
            launch_pdl=pdl,
        )
    return out if residual is None else (out, res_out)
