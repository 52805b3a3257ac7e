"""Projections of a few rows over large weights (8B-class decode at batch 1 to MAX_ROWS) as one
streaming Triton kernel.

At one row a projection is a matrix-vector product, and at a few rows still a read of the weight:
its time is the weight's bytes over the rate at which the kernel keeps HBM busy. cuBLAS's GEMVs
read the Qwen3-8B shape's weights (34-201 MB) at 2.7-3.8 TB/s on the H200 against a 4.16 TB/s copy
(docs/benchmarks.md), and its kernels cannot start their reads before the kernel ahead of them ends.
Here each program owns `block_n` output columns and one part of the inner dimension, issues its
first weight tile's loads before it waits for the previous kernel (programmatic dependent launch,
common/layers/pdl.py; weights are no kernel's output), and streams the weight once with an
evict-first hint so it does not push the activations out of L2. Split parts merge in the same
launch (the last to arrive adds them in split order: deterministic, common/layers/split_arrival.py).
With `silu_mul` the weight is a merged [gate; up] projection and each program writes SiLU(gate) * up
for its columns. Each weight tile, once in registers, is multiplied with every row of the step, so
a step of several rows reads the weight once.

The skinny kernels (triton_skinny.py) stay the path for small weights, where fusing the norms pays
more than the read rate; which weights take this kernel is `use_gemv` (fused.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from common.env_flags import env_int
from common.layers.fused import GEMV_ROWS_LIMIT
from common.layers.pdl import pdl_enabled, pdl_wait
from common.layers.skinny_tiles import weights
from common.layers.split_arrival import ArrivalCounters, arrive, depart, split_to_fill


@dataclass(frozen=True)
class GemvLaunch:
    """`block_n` output columns per program, `block_k` of the inner dimension per load, the inner
    dimension cut into `split_k` parts (0: chosen from the shape), warps and pipeline stages."""

    block_n: int = 4
    block_k: int = 2048
    split_k: int = 0
    num_warps: int = 8
    num_stages: int = 2

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"GemvLaunch.{name} must be a power of two, got {value}")
        if self.split_k < 0:
            raise ValueError(f"GemvLaunch.split_k must be >= 0, got {self.split_k}")


# Most rows one launch takes (the rows of a step multiply each weight tile in turn).
MAX_ROWS = GEMV_ROWS_LIMIT


@functools.cache
def launch_for(silu_mul: bool) -> GemvLaunch:
    """The sweep's best (`benchmarks/engine/gemv_sweep.py --sweep`, Qwen3-8B shape, H100): 8 warps,
    8,192 weight elements per load and no split where the column blocks alone fill the device; the
    merged gate/up tile loads two rows of each half over 4,096 columns. `PDSERVE_GEMV_STAGES=N` (2 to
    4, default 2) sets the pipeline stages, for A/B runs on a card the sweep has not chosen for (a
    faster memory may want more bytes in flight per program)."""
    stages = env_int("PDSERVE_GEMV_STAGES", 2, 2, 4)
    return (
        GemvLaunch(block_n=2, block_k=4096, num_stages=stages) if silu_mul else GemvLaunch(num_stages=stages)
    )


# Programs to aim for when the split is chosen from the shape: several per SM of an H100/H200.
_TARGET_PROGRAMS = 1024


def split_for(n: int, k: int, launch: GemvLaunch) -> int:
    """Inner-dimension parts: enough programs to fill the GPU (split_arrival.split_to_fill)."""
    return split_to_fill(n, k, launch, _TARGET_PROGRAMS)


_COUNTERS = ArrivalCounters("gemv", 1 << 16)


@triton.jit
def _accumulate(acc, w, x_ptr, stride_x, M, ks, k_ok, BM: tl.constexpr):
    """acc[r, :] += w @ x[r, ks] for each row r < M: the tile is read from HBM once for all rows."""
    wf = w.to(tl.float32)
    rows = tl.arange(0, BM)
    for r in tl.static_range(BM):
        xr = tl.load(x_ptr + r * stride_x + ks, mask=k_ok & (r < M), other=0.0).to(tl.float32)
        part = tl.sum(wf * xr[None, :], axis=1)
        acc += tl.where(rows[:, None] == r, part[None, :], 0.0)
    return acc


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    part_ptr,
    ticket_ptr,
    M,
    N,
    stride_x,
    stride_w,
    stride_o,
    K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    K_PER_SPLIT: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SILU_MUL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    cols = pid * BN + tl.arange(0, BN)
    col_ok = cols < N
    ks = split * K_PER_SPLIT + tl.arange(0, BK)
    w, wu = weights(w_ptr, cols, col_ok, ks, ks < K, N, stride_w, SILU_MUL, True)
    pdl_wait(PDL)  # the input rows are the previous kernel's output
    acc = _accumulate(tl.zeros([BM, BN], dtype=tl.float32), w, x_ptr, stride_x, M, ks, ks < K, BM)
    acc_up = acc
    if SILU_MUL:
        acc_up = _accumulate(tl.zeros([BM, BN], dtype=tl.float32), wu, x_ptr, stride_x, M, ks, ks < K, BM)
    for kk in range(BK, K_PER_SPLIT, BK):
        ks = split * K_PER_SPLIT + kk + tl.arange(0, BK)
        w, wu = weights(w_ptr, cols, col_ok, ks, ks < K, N, stride_w, SILU_MUL, True)
        acc = _accumulate(acc, w, x_ptr, stride_x, M, ks, ks < K, BM)
        if SILU_MUL:
            acc_up = _accumulate(acc_up, wu, x_ptr, stride_x, M, ks, ks < K, BM)
    rows = tl.arange(0, BM)
    last = True
    if SPLIT_K > 1:  # partials to scratch; the last program to arrive at this column block adds them
        tile = rows[:, None] * BN + tl.arange(0, BN)[None, :]
        mine = part_ptr + (pid * SPLIT_K + split) * 2 * BM * BN + tile
        tl.store(mine, acc)
        if SILU_MUL:
            tl.store(mine + BM * BN, acc_up)
        last = arrive(ticket_ptr + pid, SPLIT_K)
        if last:
            acc = tl.zeros([BM, BN], dtype=tl.float32)
            acc_up = tl.zeros([BM, BN], dtype=tl.float32)
            for s in range(0, SPLIT_K):
                theirs = part_ptr + (pid * SPLIT_K + s) * 2 * BM * BN + tile
                acc += tl.load(theirs, cache_modifier=".cg")
                if SILU_MUL:
                    acc_up += tl.load(theirs + BM * BN, cache_modifier=".cg")
            depart(ticket_ptr + pid)
    if last:
        dt = out_ptr.dtype.element_ty
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if SILU_MUL:
            gate = acc.to(dt).to(tl.float32)
            y = (gate / (1.0 + tl.exp(-gate))).to(dt) * acc_up.to(dt)
        else:
            y = acc.to(dt)
        mask = (rows < M)[:, None] & col_ok[None, :]
        tl.store(out_ptr + rows[:, None] * stride_o + cols[None, :], y, mask=mask)


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    silu_mul: bool = False,
    launch: GemvLaunch | None = None,
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for x [m, k] of 1 to MAX_ROWS rows, or with `silu_mul` (weight a
    merged [gate; up], [2n, k]; no bias) `silu(x @ gate.T) * (x @ up.T)`, [m, n]. fp32 accumulation,
    rounded like the eager path."""
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"gemv takes 1 to {MAX_ROWS} rows [m, k], got x of shape {tuple(x.shape)}")
    m, k = x.shape
    if weight.dim() != 2 or weight.shape[1] != k or weight.stride(1) != 1:
        raise ValueError(f"gemv: weight must be a row-major [n, {k}] matrix, got {tuple(weight.shape)}")
    if silu_mul and weight.shape[0] % 2:
        raise ValueError(f"gemv: silu_mul needs an even number of weight rows, got {weight.shape[0]}")
    if silu_mul and bias is not None:
        raise ValueError("gemv: silu_mul takes no bias")
    n = weight.shape[0] // 2 if silu_mul else weight.shape[0]
    cfg = launch or launch_for(silu_mul)
    split = split_for(n, k, cfg)
    block_k = min(cfg.block_k, triton.next_power_of_2(k))
    per_split = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
    blocks = triton.cdiv(n, cfg.block_n)
    block_m = triton.next_power_of_2(m)
    x = x.contiguous()
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    parts = blocks * split * 2 * block_m * cfg.block_n
    part = torch.empty(parts, dtype=torch.float32, device=x.device) if split > 1 else out
    pdl = pdl_enabled(x.device)
    _gemv_kernel[(blocks, split)](
        x,
        weight,
        bias if bias is not None else x,
        out,
        part,
        _COUNTERS.get(x.device, blocks),
        m,
        n,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        K=k,
        SPLIT_K=split,
        K_PER_SPLIT=per_split,
        BM=block_m,
        BN=cfg.block_n,
        BK=block_k,
        SILU_MUL=silu_mul,
        HAS_BIAS=bias is not None,
        PDL=pdl,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        launch_pdl=pdl,
    )
    return out
