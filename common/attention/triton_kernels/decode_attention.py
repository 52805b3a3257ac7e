"""Split-K flash-decoding over a paged KV cache, with GQA head packing, in one launch.

One program per (sequence, KV head, split). It loads the query rows of every query head that shares
the KV head (the group, padded to at least 16 rows so `tl.dot` can use tensor cores) and streams its
slice of the context once, so each KV byte is read once per step, not once per query head. A sequence
that fits in one split has its output written directly. Otherwise each split writes a normalised
partial output and its log-sum-exp, and the last split to arrive at the (sequence, KV head) merges
them (common/layers/split_arrival.py: per-(sequence, KV head) arrival counters, zero between launches).
The merge used to be a second kernel; in a batch-1 CUDA-graph step that launch cost 28 x 2.6 us.

The split length is computed on the device from each sequence's own length, so `num_splits` is only a
parallelism knob: any value gives the same answer for any context length. That is what makes the path
safe to capture in a CUDA graph with a split count chosen from host-known sizes at capture time.

Longest first: programs are numbered (rank, KV head) with the KV head fastest, and with an `order`
(the rows sorted by descending length, `decode_plan.longest_first`) rank r works on row order[r].
The GPU hands out programs roughly in that order, so a large batch of mixed lengths starts its
longest programs first and the short ones fill the last wave; in row order a long sequence's heads
could start last and run on alone while the other SMs idle. The order changes only when each
program runs, never what it computes. How many splits a launch uses is planned in decode_plan.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from common.attention import kv_fp8
from common.attention.triton_kernels.decode_parts import attend_span, merge_splits
from common.attention.triton_kernels.decode_plan import SkewHelp
from common.attention.triton_kernels.fp8 import scale_args
from common.layers.pdl import pdl_enabled, pdl_launch_next_then_wait
from common.layers.split_arrival import ArrivalCounters, arrive, depart

_LOG2E = 1.4426950408889634
# Launch tunables (benchmarks/engine/attention_kernels.py --tune sweeps them). tile_bytes: bytes of K
# (and again of V) one loop iteration reads per program; 16 KB is 64 tokens of a 128-wide bf16 head.
DECODE_LAUNCH = {"tile_bytes": 16384, "num_warps": 4, "num_stages": 3}
# One arrival counter per (sequence, KV head) of a split launch; grows with batch x KV heads.
DECODE_COUNTERS = ArrivalCounters("paged_decode_attention", 4096)


# Split count, table width and the batch vary between eager steps; don't recompile for each combination.
@triton.jit(
    do_not_specialize=["num_splits", "num_rows", "num_helped", "min_split_len", "help_ratio", "stride_bt"]
)
def _decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    out_ptr,
    part_ptr,
    lse_ptr,
    counter_ptr,
    order_ptr,
    k_scale_ptr,
    v_scale_ptr,
    qk_scale,
    num_splits,
    num_rows,
    num_helped,
    min_split_len,
    help_ratio,
    stride_qb,
    stride_qh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    stride_ob,
    stride_oh,
    stride_sb,
    stride_ss,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_P: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    TILE_N: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    ORDERED: tl.constexpr,  # order_ptr holds the rows longest first (see the module docstring)
    MERGE: tl.constexpr,  # num_splits > 1: compiled with the partial stores and the merge
    BLOCK_S: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,  # launched as a programmatic dependent (common/layers/pdl.py)
    FP8: tl.constexpr,  # an fp8 cache: per-token scales at k/v_scale_ptr (fp8.py)
    HELPERS: tl.constexpr,  # an unsplit launch whose longest `num_helped` rows split anyway (SkewHelp)
):
    # Everything this kernel reads (q, the KV cache just stored, lengths) may come from the previous
    # kernels, and the counters are shared: nothing before the wait. The output projection after it
    # launches first, so a one-row step's weight reads start during this kernel.
    pdl_launch_next_then_wait(PDL)
    pid = tl.program_id(0)
    kvh = pid % NUM_KV_HEADS
    rank = pid // NUM_KV_HEADS
    split = tl.program_id(1)
    if HELPERS:
        # Programs past the rows' own (one per row and KV head) are the helpers: splits 1.. of the
        # `num_helped` longest rows, KV head fastest. Other rows take one split.
        helper = tl.maximum(pid - num_rows * NUM_KV_HEADS, 0)
        is_helper = pid >= num_rows * NUM_KV_HEADS
        rank = tl.where(is_helper, helper // (NUM_KV_HEADS * (num_splits - 1)), rank)
        split = tl.where(is_helper, 1 + (helper // NUM_KV_HEADS) % (num_splits - 1), 0)
    b = rank
    if ORDERED:
        b = tl.load(order_ptr + rank).to(tl.int32)
    seq_len = tl.load(seq_lens_ptr + b)
    # Split length from this sequence's own length, rounded to whole tiles (one tile at least, so a
    # zero-length padding row has one split, which writes zeros); a helped row's, `min_split_len` at
    # least (helpers off, this compiles to the plain rule). A helped row ranks among the `num_helped`
    # longest and is `help_ratio` times the median row at least (every program of a row reads the same).
    if HELPERS:
        median_len = tl.load(seq_lens_ptr + tl.load(order_ptr + num_rows // 2))
        helped = (rank < num_helped) & (seq_len >= help_ratio * median_len)
        parts = tl.where(helped, num_splits, 1)
        split_tiles = tl.maximum(tl.cdiv(tl.cdiv(seq_len, parts), TILE_N), tl.cdiv(min_split_len, TILE_N))
    else:
        split_tiles = tl.cdiv(tl.cdiv(seq_len, num_splits), TILE_N)
    split_len = tl.maximum(split_tiles, 1) * TILE_N
    start = split * split_len
    rows = tl.arange(0, GROUP_P)
    dims = tl.arange(0, BLOCK_D)
    heads = kvh * GROUP + rows
    row_mask = rows < GROUP
    dim_mask = dims < HEAD_DIM
    o_mask = row_mask[:, None] & dim_mask[None, :]
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + dims[None, :], mask=o_mask, other=0.0)
    out, lse = attend_span(
        q,
        k_cache_ptr + kvh * stride_ch,
        v_cache_ptr + kvh * stride_ch,
        block_tables_ptr + b.to(tl.int64) * stride_bt,
        start,
        tl.minimum(start + split_len, seq_len),
        qk_scale,
        stride_cb,
        stride_cs,
        dim_mask,
        k_scale_ptr + kvh,
        v_scale_ptr + kvh,
        stride_sb,
        stride_ss,
        BLOCK_SIZE,
        TILE_N,
        GROUP_P,
        BLOCK_D,
        DOT_PRECISION,
        FP8,
    )
    # Splits that start past the end hold nothing: they neither write nor arrive. A sequence that
    # fits in one split skips the merge: its split writes the output directly.
    used = tl.maximum(tl.cdiv(seq_len, split_len), 1) if MERGE else 1
    out_row = out_ptr + b * stride_ob
    if split < used:
        if used == 1:
            o_ptrs = out_row + heads[:, None] * stride_oh + dims[None, :]
            tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=o_mask)
        else:
            # Scratch rows: partial [batch, num_heads, num_splits, HEAD_DIM], lse [batch, num_heads,
            # num_splits] (with helpers [num_helped, ...]), both contiguous; `first` is this program's
            # first head's split 0.
            # With helpers only the helped ranks merge: their scratch and counters are indexed by rank.
            slot = rank if HELPERS else b
            first = (slot.to(tl.int64) * NUM_KV_HEADS * GROUP + kvh * GROUP) * num_splits
            at = first + rows * num_splits + split
            tl.store(part_ptr + at[:, None] * HEAD_DIM + dims[None, :], out, mask=o_mask)
            tl.store(lse_ptr + at, lse, mask=row_mask)
            counter = counter_ptr + slot * NUM_KV_HEADS + kvh
            if arrive(counter, used):  # the last split of this (sequence, KV head) merges them all
                for g in tl.static_range(GROUP):
                    head_at = first + g * num_splits
                    merged = merge_splits(
                        part_ptr + head_at * HEAD_DIM, lse_ptr + head_at, used, HEAD_DIM, BLOCK_S, BLOCK_D
                    )
                    o_ptrs = out_row + (kvh * GROUP + g) * stride_oh + dims
                    tl.store(o_ptrs, merged.to(out_ptr.dtype.element_ty), mask=dim_mask)
                depart(counter)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int,
    out: torch.Tensor | None = None,
    order: torch.Tensor | None = None,
    skew: SkewHelp | None = None,
) -> torch.Tensor:
    """One query token per sequence: q [batch, num_heads, head_dim] -> [batch, num_heads, head_dim].

    `order` ([batch] integers, a permutation of the rows, e.g. `longest_first(seq_lens)`) only sets
    which rows' programs start first; the result is the same with or without it.

    `skew` (with `num_splits` 1 and a longest-first `order`): the `skew.rows` longest rows split anyway,
    into up to `skew.splits` pieces of at least `skew.min_split_tokens`, by helper programs launched
    after the rows' own (with `skew.min_ratio`, only rows that long against the median row); every
    other row stays one program. The result is the same as without it.

    One launch. Never synchronises with the host; scratch is allocated from host-known shapes only,
    so the call can be captured in a CUDA graph (the capture's memory pool then owns the scratch).
    The arrival counters are allocated outside capture only: make the same call once before capturing.
    An fp8 cache (kv_fp8.layer_views) is read with its scales, which live in the cache's own blocks, so a
    captured graph reads them at fixed addresses like the values.
    """
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    if num_splits < 1:
        raise ValueError(f"paged_decode_attention: num_splits must be >= 1, got {num_splits}")
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    q = q if q.stride(-1) == 1 else q.contiguous()
    pdl = pdl_enabled(q.device)
    k_scales, v_scales, stride_sb, stride_ss = scale_args(k_cache, v_cache)
    helped, min_split_len, ratio, grid = 0, 0, 0, (batch * num_kv_heads, num_splits)
    if skew is not None:
        if num_splits != 1 or order is None:
            raise ValueError("paged_decode_attention: skew help needs num_splits 1 and a longest-first order")
        helped, num_splits, min_split_len = min(skew.rows, batch), skew.splits, skew.min_split_tokens
        ratio = skew.min_ratio
        grid = (batch * num_kv_heads + helped * num_kv_heads * (num_splits - 1), 1)
    if num_splits == 1:  # the one split writes the output itself: no scratch, no counters
        part = lse = counters = out
    else:
        slots = helped or batch  # with helpers only the helped rows merge (scratch indexed by rank)
        part = torch.empty((slots, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
        lse = torch.empty((slots, num_heads, num_splits), dtype=torch.float32, device=q.device)
        counters = DECODE_COUNTERS.get(q.device, slots * num_kv_heads)
    _decode_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        part,
        lse,
        counters,
        order if order is not None else seq_lens,
        k_scales,
        v_scales,
        scale * _LOG2E,
        num_splits,
        batch,
        helped,
        min_split_len,
        ratio,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        *out.stride()[:2],
        stride_sb,
        stride_ss,
        NUM_KV_HEADS=num_kv_heads,
        ORDERED=order is not None,
        MERGE=num_splits > 1,
        PDL=pdl,
        FP8=kv_fp8.is_fp8(k_cache),
        HELPERS=helped > 0,
        launch_pdl=pdl,
        BLOCK_S=triton.next_power_of_2(num_splits),
        **_constants(q, k_cache, num_heads // num_kv_heads, head_dim),
    )
    return out


def decode_tile_n(head_dim: int, element_size: int) -> int:
    """Context tokens per kernel loop iteration: 64 for head_dim 128 in 16-bit, fewer for wider rows."""
    rows = DECODE_LAUNCH["tile_bytes"] // (triton.next_power_of_2(head_dim) * element_size)
    return max(16, min(128, rows))


def _constants(q: torch.Tensor, k_cache: torch.Tensor, group: int, head_dim: int) -> dict:
    return {
        "HEAD_DIM": head_dim,
        "GROUP": group,
        # tl.dot needs at least 16 rows; the padding rows cost no memory traffic.
        "GROUP_P": max(16, triton.next_power_of_2(group)),
        "BLOCK_SIZE": k_cache.shape[1],
        "BLOCK_D": triton.next_power_of_2(head_dim),
        "TILE_N": decode_tile_n(head_dim, q.element_size()),
        # fp32 caches get exact fp32 products; tf32 would cost about 1e-3 relative error.
        "DOT_PRECISION": "ieee" if q.dtype == torch.float32 else "tf32",
        "num_warps": DECODE_LAUNCH["num_warps"],
        "num_stages": DECODE_LAUNCH["num_stages"],
    }
