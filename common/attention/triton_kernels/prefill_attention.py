"""Paged variable-length causal attention for prefill and chunked prefill, in one launch.

The grid is (query tiles of all sequences, query heads). Sequence i owns the tile ids
`[qsl[i] // BLOCK_M + i, qsl[i + 1] // BLOCK_M + i + 1)`, a range that always holds its
`cdiv(q_len_i, BLOCK_M)` tiles; a program finds its sequence by binary search over `query_start_loc`
and exits when its tile is past the sequence's queries. The grid size `num_tokens // BLOCK_M + num_seqs`
is known on the host without reading any device tensor.

Keys and values (the cached prefix and this step's tokens, already stored) are read through the block
table, one token-row gather per tile. Key tiles entirely below the tile's first query position need no
causal mask and run in a cheaper loop; only the tiles that cross the diagonal are masked. An fp8 cache
(cached prefix and new tokens alike) is read with its per-token scales (fp8.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from common.attention import kv_fp8
from common.attention.triton_kernels.fp8 import scale_args, token_scales

_LOG2E = 1.4426950408889634


@triton.jit
def _find_seq(query_start_loc_ptr, num_seqs, tile, BLOCK_M: tl.constexpr):
    """Largest i with query_start_loc[i] // BLOCK_M + i <= tile."""
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_M + mid
        if first_tile <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _attend_tiles(
    acc,
    m_i,
    l_i,
    q,
    k_base,
    v_base,
    table,
    pos,
    qk_scale,
    kv_lo,
    kv_hi,
    stride_cb,
    stride_cs,
    dims,
    dim_mask,
    k_scale_head_ptr,
    v_scale_head_ptr,
    stride_sb,
    stride_ss,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL_MASK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    FP8: tl.constexpr,
):
    """Online-softmax update of (acc, m_i, l_i) over keys [kv_lo, kv_hi); scores are in log2 units."""
    for start in range(kv_lo, kv_hi, BLOCK_N):
        toks = start + tl.arange(0, BLOCK_N)
        if CAUSAL_MASK:
            tok_mask = toks < kv_hi
            blocks = tl.load(table + toks // BLOCK_SIZE, mask=tok_mask, other=0).to(tl.int64)
            kv_mask = tok_mask[:, None] & dim_mask[None, :]
        else:
            # Tiles below the diagonal lie wholly inside the context: no per-token predicates.
            tok_mask = toks < kv_hi  # (read by the fp8 scale loads only; all true here)
            blocks = tl.load(table + toks // BLOCK_SIZE).to(tl.int64)
            kv_mask = dim_mask[None, :]
        kv_off = blocks[:, None] * stride_cb + (toks % BLOCK_SIZE)[:, None] * stride_cs + dims[None, :]
        k = tl.load(k_base + kv_off, mask=kv_mask, other=0.0).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if FP8:
            k_sc = token_scales(k_scale_head_ptr, blocks, toks, tok_mask, stride_sb, stride_ss, BLOCK_SIZE)
            s = s * k_sc[None, :]
        if CAUSAL_MASK:
            s = tl.where((toks[None, :] <= pos[:, None]) & tok_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + kv_off, mask=kv_mask, other=0.0).to(q.dtype)
        if FP8:
            v_sc = token_scales(v_scale_head_ptr, blocks, toks, tok_mask, stride_sb, stride_ss, BLOCK_SIZE)
            pv = (p * v_sc[None, :]).to(q.dtype)
        else:
            pv = p.to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(pv, v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


# The batch shape changes every step; specialising on it would recompile mid-run (seconds each).
@triton.jit(do_not_specialize=["num_seqs", "stride_bt"])
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    out_ptr,
    k_scale_ptr,
    v_scale_ptr,
    qk_scale,
    num_seqs,
    stride_qt,
    stride_qh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    stride_ot,
    stride_oh,
    stride_sb,
    stride_ss,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    FP8: tl.constexpr,  # an fp8 cache: per-token scales at k/v_scale_ptr (fp8.py)
):
    # Launch order runs the heaviest (last, longest-context) tiles of each sequence first: a shorter tail.
    tile = tl.num_programs(0) - 1 - tl.program_id(0)
    head = tl.program_id(1)
    seq = _find_seq(query_start_loc_ptr, num_seqs, tile, BLOCK_M)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    m0 = (tile - (q_start // BLOCK_M + seq)) * BLOCK_M
    if m0 >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx_before = seq_len - q_len

    rows = m0 + tl.arange(0, BLOCK_M)
    row_mask = rows < q_len
    dims = tl.arange(0, BLOCK_D)
    dim_mask = dims < HEAD_DIM
    io_mask = row_mask[:, None] & dim_mask[None, :]
    q_rows = (q_start + rows).to(tl.int64)
    q_ptrs = q_ptr + q_rows[:, None] * stride_qt + head * stride_qh + dims[None, :]
    q = tl.load(q_ptrs, mask=io_mask, other=0.0)
    pos = ctx_before + rows

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    k_base = k_cache_ptr + (head // GROUP) * stride_ch
    v_base = v_cache_ptr + (head // GROUP) * stride_ch
    k_scale_base = k_scale_ptr + head // GROUP
    v_scale_base = v_scale_ptr + head // GROUP
    # Keys before the tile's first query position are visible to every row of the tile.
    full_end = ((ctx_before + m0 + 1) // BLOCK_N) * BLOCK_N
    kv_end = tl.minimum(seq_len, ctx_before + m0 + BLOCK_M)
    acc, m_i, l_i = _attend_tiles(
        acc,
        m_i,
        l_i,
        q,
        k_base,
        v_base,
        table,
        pos,
        qk_scale,
        0,
        full_end,
        stride_cb,
        stride_cs,
        dims,
        dim_mask,
        k_scale_base,
        v_scale_base,
        stride_sb,
        stride_ss,
        BLOCK_SIZE,
        BLOCK_N,
        False,
        DOT_PRECISION,
        FP8,
    )
    acc, m_i, l_i = _attend_tiles(
        acc,
        m_i,
        l_i,
        q,
        k_base,
        v_base,
        table,
        pos,
        qk_scale,
        full_end,
        kv_end,
        stride_cb,
        stride_cs,
        dims,
        dim_mask,
        k_scale_base,
        v_scale_base,
        stride_sb,
        stride_ss,
        BLOCK_SIZE,
        BLOCK_N,
        True,
        DOT_PRECISION,
        FP8,
    )
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    o_ptrs = out_ptr + q_rows[:, None] * stride_ot + head * stride_oh + dims[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=io_mask)


def prefill_config(head_dim: int, element_size: int, max_query_len: int) -> dict:
    """Tile sizes and launch parameters; few distinct values so the kernel compiles a handful of times.

    64x64 tiles with 4 warps measured fastest on the H200 for 8 x 2048 bf16 tokens, head_dim 128 (ahead
    of 128-row tiles with 8 warps: benchmarks/engine/attention_kernels.py --tune); wider rows (fp32, head_dim
    256) take 32-key tiles to stay inside shared memory. `max_query_len` is kept for future tuning.
    """
    row_bytes = triton.next_power_of_2(head_dim) * element_size
    return {"BLOCK_M": 64, "BLOCK_N": 64 if row_bytes <= 256 else 32, "num_warps": 4, "num_stages": 2}


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_query_len: int,
    out: torch.Tensor | None = None,
    config: dict | None = None,
) -> torch.Tensor:
    """Causal attention of packed queries q [num_tokens, num_heads, head_dim] over each sequence's context.

    Sequence i's queries are rows `query_start_loc[i] : query_start_loc[i + 1]`, the last q_len_i
    positions of its `seq_lens[i]`-token context, whose KV must already be in the cache.
    """
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = seq_lens.shape[0]
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if num_tokens == 0 or num_seqs == 0:
        return out
    q = q if q.stride(-1) == 1 else q.contiguous()
    cfg = config or prefill_config(head_dim, q.element_size(), max_query_len)
    k_scales, v_scales, stride_sb, stride_ss = scale_args(k_cache, v_cache)
    grid = (num_tokens // cfg["BLOCK_M"] + num_seqs, num_heads)
    _prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        out,
        k_scales,
        v_scales,
        scale * _LOG2E,
        num_seqs,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        stride_sb,
        stride_ss,
        HEAD_DIM=head_dim,
        GROUP=num_heads // k_cache.shape[2],
        BLOCK_SIZE=k_cache.shape[1],
        BLOCK_D=triton.next_power_of_2(head_dim),
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        FP8=kv_fp8.is_fp8(k_cache),
        **cfg,
    )
    return out
