"""Split-K flash-decoding over a paged KV cache, with GQA head packing.

Stage 1 runs one program per (sequence, KV head, split). It loads the query rows of every query head
that shares the KV head (the group, padded to at least 16 rows so `tl.dot` can use tensor cores) and
streams its slice of the context once, so each KV byte is read once per step, not once per query head.
Each split writes a normalised partial output and its log-sum-exp; stage 2 merges the splits.

The split length is computed on the device from each sequence's own length, so `num_splits` is only a
parallelism knob: any value gives the same answer for any context length. That is what makes the path
safe to capture in a CUDA graph with a split count chosen from host-known sizes at capture time.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634
# Stage-1 launch tunables (benchmarks/attention_kernels.py --tune sweeps them). tile_bytes: bytes of K
# (and again of V) one loop iteration reads per program; 16 KB is 64 tokens of a 128-wide bf16 head.
DECODE_LAUNCH = {"tile_bytes": 16384, "num_warps": 4, "num_stages": 3}
# A split should cover at least this many tokens (two 64-token tiles): below that the merge and the
# per-program setup cost more than the extra parallelism gains (H200: batch 1, 1k-4k context).
_MIN_SPLIT_TOKENS = 128
_MAX_SPLITS = 64
# Split only while there are fewer than this many (sequence, KV head) programs per SM: on the H200,
# batch 64 x 8 KV heads (3.9 per SM) already reads at full bandwidth with one split, and extra
# splits there cost 5-20% (merge traffic, shorter loops).
_PROGRAMS_PER_SM = 4


# Split count and table width vary between eager steps; don't recompile for each combination.
@triton.jit(do_not_specialize=["num_splits", "stride_bt"])
def _decode_stage1_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    out_ptr,
    lse_ptr,
    qk_scale,
    num_splits,
    stride_qb,
    stride_qh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_P: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    TILE_N: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    # Split length from this sequence's own length, rounded to whole tiles.
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), TILE_N) * TILE_N
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    rows = tl.arange(0, GROUP_P)
    dims = tl.arange(0, BLOCK_D)
    heads = kvh * GROUP + rows
    row_mask = rows < GROUP
    dim_mask = dims < HEAD_DIM
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + dims[None, :],
        mask=row_mask[:, None] & dim_mask[None, :],
        other=0.0,
    )
    m_i = tl.full([GROUP_P], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_P], tl.float32)
    acc = tl.zeros([GROUP_P, BLOCK_D], tl.float32)
    table = block_tables_ptr + b.to(tl.int64) * stride_bt
    head_off = kvh * stride_ch + dims[None, :]
    for tile in range(start, end, TILE_N):
        toks = tile + tl.arange(0, TILE_N)
        tok_mask = toks < end
        # Per-token block lookup: works for every block size; L1 absorbs the repeats within a block.
        blocks = tl.load(table + toks // BLOCK_SIZE, mask=tok_mask, other=0).to(tl.int64)
        kv_off = blocks[:, None] * stride_cb + (toks % BLOCK_SIZE)[:, None] * stride_cs + head_off
        kv_mask = tok_mask[:, None] & dim_mask[None, :]
        k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        s = tl.where(tok_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    # An empty split (start >= end) leaves l_i == 0: it writes zeros and a -inf log-sum-exp.
    has_any = l_i > 0.0
    out = tl.where(has_any[:, None], acc / tl.where(has_any, l_i, 1.0)[:, None], 0.0)
    out_off = b * stride_ob + heads[:, None] * stride_oh + split * stride_os + dims[None, :]
    tl.store(out_ptr + out_off, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & dim_mask[None, :])
    if WRITE_LSE:
        lse = tl.where(has_any, m_i + tl.log2(tl.where(has_any, l_i, 1.0)), float("-inf"))
        tl.store(lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=row_mask)


@triton.jit
def _decode_stage2_kernel(
    part_ptr,
    lse_ptr,
    out_ptr,
    num_splits,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    stride_ob,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    split_mask = splits < num_splits
    lse = tl.load(lse_ptr + b * stride_lb + h * stride_lh + splits, mask=split_mask, other=float("-inf"))
    m = tl.max(lse, 0)
    # All splits empty only for a zero-length (padding) sequence: keep its output finite (zeros).
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m)
    denom = tl.sum(w, 0)
    part = tl.load(
        part_ptr + b * stride_pb + h * stride_ph + splits[:, None] * stride_ps + dims[None, :],
        mask=split_mask[:, None] & (dims < HEAD_DIM)[None, :],
        other=0.0,
    )
    out = tl.sum(part * w[:, None], 0) / tl.where(denom > 0.0, denom, 1.0)
    o_ptrs = out_ptr + b * stride_ob + h * stride_oh + dims
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)


def choose_num_splits(batch: int, num_kv_heads: int, max_seq_len: int, num_sms: int) -> int:
    """Splits per sequence so stage 1 fills the GPU: a power of two (few variants), from host ints only."""
    base_programs = max(1, batch * num_kv_heads)
    wanted = (num_sms * _PROGRAMS_PER_SM) // base_programs
    by_length = max(1, max_seq_len // _MIN_SPLIT_TOKENS)
    splits = max(1, min(wanted, by_length, _MAX_SPLITS))
    return 1 << (splits.bit_length() - 1)


@functools.lru_cache(maxsize=8)
def num_sms(device: torch.device) -> int:
    """Multiprocessor count of a CUDA device (cached; no sync); a small stand-in elsewhere."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per sequence: q [batch, num_heads, head_dim] -> [batch, num_heads, head_dim].

    Never synchronises with the host; scratch is allocated from host-known shapes only, so the call can
    be captured in a CUDA graph (the capture's memory pool then owns the scratch).
    """
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    q = q if q.stride(-1) == 1 else q.contiguous()
    common = _stage1_constants(q, k_cache, group, head_dim)
    if num_splits == 1:
        # One split: stage 1 writes the final, normalised output directly and stage 2 is skipped.
        _launch_stage1(q, k_cache, v_cache, block_tables, seq_lens, scale, 1, out.unsqueeze(2), None, common)
        return out
    partial = torch.empty((batch, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
    lse = torch.empty((batch, num_heads, num_splits), dtype=torch.float32, device=q.device)
    _launch_stage1(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits, partial, lse, common)
    _decode_stage2_kernel[(batch, num_heads)](
        partial,
        lse,
        out,
        num_splits,
        *partial.stride()[:3],
        *lse.stride()[:2],
        *out.stride()[:2],
        HEAD_DIM=head_dim,
        BLOCK_S=triton.next_power_of_2(num_splits),
        BLOCK_D=common["BLOCK_D"],
        num_warps=4,
    )
    return out


def decode_tile_n(head_dim: int, element_size: int) -> int:
    """Context tokens per stage-1 iteration: 64 for head_dim 128 in 16-bit, fewer for wider rows."""
    rows = DECODE_LAUNCH["tile_bytes"] // (triton.next_power_of_2(head_dim) * element_size)
    return max(16, min(128, rows))


def _stage1_constants(q: torch.Tensor, k_cache: torch.Tensor, group: int, head_dim: int) -> dict:
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


def _launch_stage1(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits, out, lse, common) -> None:
    batch, _, head_dim = q.shape
    lse_strides = lse.stride()[:2] if lse is not None else (0, 0)
    _decode_stage1_kernel[(batch, k_cache.shape[2], num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        lse if lse is not None else out,
        scale * _LOG2E,
        num_splits,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        *out.stride()[:3],
        *lse_strides,
        WRITE_LSE=lse is not None,
        **common,
    )
