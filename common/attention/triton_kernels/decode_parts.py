"""The decode kernel's two device-side parts (decode_attention.py): one program's online softmax over a
span of one KV head's context, and the merge of a row's split partials by their log-sum-exps."""

from __future__ import annotations

import triton
import triton.language as tl

from common.attention.triton_kernels.fp8 import token_scales


@triton.jit
def attend_span(
    q,
    k_head_ptr,
    v_head_ptr,
    table,
    start,
    end,
    qk_scale,
    stride_cb,
    stride_cs,
    dim_mask,
    k_scale_head_ptr,
    v_scale_head_ptr,
    stride_sb,
    stride_ss,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    GROUP_P: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    FP8: tl.constexpr,
):
    """Online softmax of q's rows over context tokens [start, end) of one KV head: the normalised
    output [GROUP_P, BLOCK_D] (fp32) and its log2-sum-exp [GROUP_P]; zeros and -inf when empty.
    FP8: each token's key scale multiplies its scores and its value scale its softmax weights."""
    m_i = tl.full([GROUP_P], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_P], tl.float32)
    acc = tl.zeros([GROUP_P, BLOCK_D], tl.float32)
    dims = tl.arange(0, BLOCK_D)
    for tile in range(start, end, TILE_N):
        toks = tile + tl.arange(0, TILE_N)
        tok_mask = toks < end
        # Per-token block lookup: works for every block size; L1 absorbs the repeats within a block.
        blocks = tl.load(table + toks // BLOCK_SIZE, mask=tok_mask, other=0).to(tl.int64)
        kv_off = blocks[:, None] * stride_cb + (toks % BLOCK_SIZE)[:, None] * stride_cs + dims[None, :]
        kv_mask = tok_mask[:, None] & dim_mask[None, :]
        k = tl.load(k_head_ptr + kv_off, mask=kv_mask, other=0.0).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if FP8:
            k_sc = token_scales(k_scale_head_ptr, blocks, toks, tok_mask, stride_sb, stride_ss, BLOCK_SIZE)
            s = s * k_sc[None, :]
        s = tl.where(tok_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_head_ptr + kv_off, mask=kv_mask, other=0.0).to(q.dtype)
        if FP8:
            v_sc = token_scales(v_scale_head_ptr, blocks, toks, tok_mask, stride_sb, stride_ss, BLOCK_SIZE)
            pv = (p * v_sc[None, :]).to(q.dtype)
        else:
            pv = p.to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(pv, v, input_precision=DOT_PRECISION)
        m_i = m_new
    has_any = l_i > 0.0
    out = tl.where(has_any[:, None], acc / tl.where(has_any, l_i, 1.0)[:, None], 0.0)
    lse = tl.where(has_any, m_i + tl.log2(tl.where(has_any, l_i, 1.0)), float("-inf"))
    return out, lse


@triton.jit
def merge_splits(
    part_ptr, lse_ptr, used, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr
):
    """One query head's output from its first `used` split partials. Every used split holds at least
    one token, so the largest log-sum-exp is finite. Reads with ".cg": other SMs wrote the partials."""
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    live = splits < used
    lse = tl.load(lse_ptr + splits, mask=live, other=float("-inf"), cache_modifier=".cg")
    w = tl.exp2(lse - tl.max(lse, 0))
    part = tl.load(
        part_ptr + splits[:, None] * HEAD_DIM + dims[None, :],
        mask=live[:, None] & (dims < HEAD_DIM)[None, :],
        other=0.0,
        cache_modifier=".cg",
    )
    return tl.sum(part * w[:, None], 0) / tl.sum(w, 0)
