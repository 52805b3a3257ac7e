"""One Triton pass over the logits that picks each row's token: greedy argmax or an exact draw.

Imported only on CUDA (or under the Triton interpreter), never on a plain CPU run.

A sampling row takes argmax(logits / T - log E) with E ~ Exp(1) drawn per (row, column): the
exponential race of the torch path in log space (the Gumbel-max trick), an exact draw from
softmax(logits / T) that needs neither the softmax nor a second pass. A greedy row (T = 0) takes the
argmax of the logits themselves, first index on ties as torch.argmax. The logits are read once in
their own dtype (bf16 from the model) and widened to fp32 in registers; the grammar mask, when
given, is read in the same pass.

Randomness: Philox (`tl.randint4x`) keyed by a per-row 64-bit seed that the caller draws on the
device each step (no host sync), with the column's position as the counter. The random number a
column gets depends only on (seed, column), never on the batch size or on how the row is split
across programs, so a seeded row repeats its tokens exactly.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

# Columns per Philox call group: each of the 4 outputs of one Philox call feeds one of 4 sub-blocks
# of LANES columns. Fixed (not tuned per shape) because it defines which random number each column
# gets: changing it changes the draws a given seed produces.
LANES = 1024
CHUNK = 4 * LANES
_MIN_TEMPERATURE = 1e-5  # as the torch path's clamp


@triton.jit
def _exp1(r):
    """Exp(1) from 32 random bits, strictly positive and finite. -log(u) loses all precision as u -> 1
    (where the small, decisive E live), so that end uses the series of -log(1 - w) on w = 1 - u,
    which is exact in fp32 here."""
    k = (r >> 9).to(tl.float32)  # 23 bits: k + 0.5 is exact in fp32
    u = (k + 0.5) * 1.1920928955078125e-07
    w = (8388607.5 - k) * 1.1920928955078125e-07
    series = w * (1.0 + w * (0.5 + w * (0.3333333333 + w * 0.25)))
    return tl.where(w < 0.0078125, series, -tl.log2(u) * 0.6931471805599453)


@triton.jit
def _scan_block(
    row_ptr, allowed_row, cols, n_cols, best, best_col, r, scale, HAS_ALLOWED: tl.constexpr, SAMPLE: tl.constexpr
):
    mask = cols < n_cols
    x = tl.load(row_ptr + cols, mask=mask, other=float("-inf")).to(tl.float32)
    if HAS_ALLOWED:
        ok = tl.load(allowed_row + cols, mask=mask, other=0)
        x = tl.where(ok != 0, x, float("-inf"))
    if SAMPLE:
        key = x * scale - tl.log2(_exp1(r))  # log2 units: same ranking as x / T - ln E
    else:
        key = tl.where(x != x, float("inf"), x)  # NaN ranks first, as in torch.argmax
    # Each lane sees its columns in increasing order, so a strict > keeps the first of equal keys.
    better = key > best
    return tl.where(better, key, best), tl.where(better, cols, best_col)


@triton.jit
def _scan(
    row_ptr,
    allowed_row,
    seed,
    scale,
    n_cols,
    first,
    last,
    LANES: tl.constexpr,
    HAS_ALLOWED: tl.constexpr,
    SAMPLE: tl.constexpr,
):
    lanes = tl.arange(0, LANES)
    best = tl.full([LANES], float("-inf"), tl.float32)
    best_col = first * 4 * LANES + lanes  # each lane's first column: the answer for an all -inf row
    for i in range(0, last - first):
        c = first + i
        base = c * 4 * LANES + lanes
        if SAMPLE:
            r0, r1, r2, r3 = tl.randint4x(seed, c * LANES + lanes)
        else:
            r0 = lanes
            r1 = lanes
            r2 = lanes
            r3 = lanes
        best, best_col = _scan_block(row_ptr, allowed_row, base, n_cols, best, best_col, r0, scale, HAS_ALLOWED, SAMPLE)
        best, best_col = _scan_block(
            row_ptr, allowed_row, base + LANES, n_cols, best, best_col, r1, scale, HAS_ALLOWED, SAMPLE
        )
        best, best_col = _scan_block(
            row_ptr, allowed_row, base + 2 * LANES, n_cols, best, best_col, r2, scale, HAS_ALLOWED, SAMPLE
        )
        best, best_col = _scan_block(
            row_ptr, allowed_row, base + 3 * LANES, n_cols, best, best_col, r3, scale, HAS_ALLOWED, SAMPLE
        )
    top = tl.max(best, axis=0)
    return top, tl.min(tl.where(best == top, best_col, 2147483647), axis=0)


@triton.jit
def _pick_kernel(
    logits_ptr,
    stride,
    temp_ptr,
    seed_ptr,
    allowed_ptr,
    allowed_stride,
    part_key_ptr,
    part_col_ptr,
    out_ptr,
    n_cols,
    chunks_per_split,
    n_chunks,
    min_temp,
    HAS_ALLOWED: tl.constexpr,
    SPLIT: tl.constexpr,
    LANES: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    first = split * chunks_per_split
    last = first + chunks_per_split
    if last > n_chunks:
        last = n_chunks
    row_ptr = logits_ptr + row.to(tl.int64) * stride
    allowed_row = allowed_ptr + row.to(tl.int64) * allowed_stride
    temp = tl.load(temp_ptr + row)
    if temp == 0.0:
        top, col = _scan(row_ptr, allowed_row, 0, 1.0, n_cols, first, last, LANES, HAS_ALLOWED, False)
    else:
        seed = tl.load(seed_ptr + row)
        scale = 1.4426950408889634 / tl.maximum(temp, min_temp)
        top, col = _scan(row_ptr, allowed_row, seed, scale, n_cols, first, last, LANES, HAS_ALLOWED, True)
    if SPLIT:
        n_splits = tl.num_programs(1)
        tl.store(part_key_ptr + row * n_splits + split, top)
        tl.store(part_col_ptr + row * n_splits + split, col)
    else:
        tl.store(out_ptr + row, col.to(tl.int64))


@triton.jit
def _merge_kernel(part_key_ptr, part_col_ptr, out_ptr, n_splits, BLOCK: tl.constexpr):
    """Per row, the best of its splits' winners; splits cover increasing columns, so the smallest
    column among equal keys is the first one, as in the single-program scan."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_splits
    keys = tl.load(part_key_ptr + row * n_splits + offs, mask=mask, other=float("-inf"))
    cols = tl.load(part_col_ptr + row * n_splits + offs, mask=mask, other=2147483647)
    top = tl.max(keys, axis=0)
    col = tl.min(tl.where(mask & (keys == top), cols, 2147483647), axis=0)
    tl.store(out_ptr + row, col.to(tl.int64))


@functools.cache
def _programs_wanted(device: torch.device) -> int:
    """Enough programs to keep every SM busy: at batch 1 a single program would read the 300 KB
    row (and run its Philox rounds) on one SM alone."""
    if device.type != "cuda":
        return 1
    return 2 * torch.cuda.get_device_properties(device).multi_processor_count


def num_splits(rows: int, n_cols: int, device: torch.device) -> int:
    """How many programs share one row (each a contiguous run of whole chunks)."""
    n_chunks = triton.cdiv(n_cols, CHUNK)
    wanted = min(n_chunks, max(1, triton.cdiv(_programs_wanted(device), rows)))
    per_split = triton.cdiv(n_chunks, wanted)
    return triton.cdiv(n_chunks, per_split)


def pick_tokens(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    seeds: torch.Tensor | None,
    allowed: torch.Tensor | None = None,
    splits: int | None = None,
) -> torch.Tensor:
    """[B] int64 tokens: argmax for rows with temperature 0, an exact draw from softmax(logits / T)
    otherwise. `seeds`: [B] int64 Philox keys (None only when every row is greedy); `allowed`:
    optional [B, V] bool mask (False = never picked); `splits`: programs per row (default: enough
    to fill the GPU)."""
    rows, n_cols = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    n_chunks = triton.cdiv(n_cols, CHUNK)
    splits = splits or num_splits(rows, n_cols, logits.device)
    per_split = triton.cdiv(n_chunks, splits)
    splits = triton.cdiv(n_chunks, per_split)  # no empty split
    if allowed is not None:
        allowed = allowed.contiguous().view(torch.uint8)
    part_key = torch.empty(rows * splits, dtype=torch.float32, device=logits.device) if splits > 1 else out
    part_col = torch.empty(rows * splits, dtype=torch.int32, device=logits.device) if splits > 1 else out
    _pick_kernel[(rows, splits)](
        logits,
        logits.stride(0),
        temperatures,
        seeds if seeds is not None else out,
        allowed if allowed is not None else out,
        allowed.stride(0) if allowed is not None else 0,
        part_key,
        part_col,
        out,
        n_cols,
        per_split,
        n_chunks,
        _MIN_TEMPERATURE,
        HAS_ALLOWED=allowed is not None,
        SPLIT=splits > 1,
        LANES=LANES,
        num_warps=4,
    )
    if splits > 1:
        _merge_kernel[(rows,)](part_key, part_col, out, splits, BLOCK=triton.next_power_of_2(splits))
    return out
