"""The one-launch decode attention's in-kernel merge of its splits (last-arrival,
common/layers/split_arrival.py).

Each case is checked against the torch reference backend and against the two-kernel path's math
(per-split normalised partials and log2-sum-exps, merged by weights 2^(lse - max)), written out in
plain torch below. Runs on a CUDA machine (marked `gpu`, where the splits really race) and on the CPU
under the Triton interpreter when `PDSERVE_TRITON_INTERPRET=1`. Anywhere else the module skips.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers import triton_interpret
from tests.helpers.decode_kernel import DEVICE, DTYPE, HEAD_DIM, NUM_KV_HEADS, TOL
from tests.helpers.paged_kv import PagedContext, generator

triton_interpret.setup_or_skip()  # before the kernel modules are imported below
INTERPRET = triton_interpret.ENABLED

from common.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from common.attention.triton_kernels.decode_attention import (  # noqa: E402
    DECODE_COUNTERS,
    decode_tile_n,
    paged_decode_attention,
)
from common.layers.split_arrival import ArrivalCounters  # noqa: E402

pytestmark = [] if INTERPRET else [pytest.mark.gpu]

REFERENCE = TorchAttentionBackend()
# A sequence with more tokens than `splits` tiles fills every split; shorter ones leave some empty,
# and one that fits in a single tile takes the direct path (no merge) inside a merging launch.
TILE_N = decode_tile_n(HEAD_DIM, DTYPE.itemsize)


def two_stage_reference(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits) -> torch.Tensor:
    """The removed two-kernel path in plain torch (fp32): split ranges as the kernel cuts them, each
    split's normalised output and log2-sum-exp (-inf when empty), then the weighted merge."""
    out = torch.zeros(q.shape, dtype=torch.float32)
    group = q.shape[1] // k_cache.shape[2]
    block = k_cache.shape[1]
    for b, seq_len in enumerate(seq_lens.tolist()):
        pos = torch.arange(seq_len)
        blocks = block_tables[b].cpu()[pos // block]
        k = k_cache.cpu()[blocks, pos % block].float().repeat_interleave(group, dim=1)
        v = v_cache.cpu()[blocks, pos % block].float().repeat_interleave(group, dim=1)
        split_len = max(math.ceil(math.ceil(seq_len / num_splits) / TILE_N), 1) * TILE_N
        parts, lses = [], []
        for s in range(num_splits):
            lo, hi = s * split_len, min((s + 1) * split_len, seq_len)
            if lo >= hi:
                parts.append(torch.zeros(q.shape[1:]))
                lses.append(torch.full((q.shape[1],), float("-inf")))
                continue
            scores = torch.einsum("hd,nhd->hn", q[b].cpu().float(), k[lo:hi]) * scale * math.log2(math.e)
            m = scores.amax(-1, keepdim=True)
            p = torch.exp2(scores - m)
            parts.append(torch.einsum("hn,nhd->hd", p, v[lo:hi]) / p.sum(-1, keepdim=True))
            lses.append(m.squeeze(-1) + torch.log2(p.sum(-1)))
        lse = torch.stack(lses, -1)  # [heads, splits]
        top = lse.amax(-1, keepdim=True)
        w = torch.exp2(lse - torch.where(top == float("-inf"), 0.0, top))
        denom = w.sum(-1, keepdim=True)
        out[b] = torch.einsum("hs,shd->hd", w, torch.stack(parts)) / torch.where(denom > 0, denom, 1.0)
    return out


def _case(seq_lens, group, block_size, key):
    gen = generator("split-merge", key, group, block_size)
    ctx = PagedContext(seq_lens, block_size, NUM_KV_HEADS, HEAD_DIM, DTYPE, gen, DEVICE)
    q = torch.randn((len(seq_lens), group * NUM_KV_HEADS, HEAD_DIM), generator=gen).to(DEVICE, DTYPE)
    return ctx, q


def _check(ctx: PagedContext, q, num_splits, seq_lens=None) -> torch.Tensor:
    """Run the kernel into a NaN-poisoned output; compare with both references."""
    meta = ctx.meta([1] * q.shape[0], is_decode=True, seq_lens=seq_lens)
    scale = HEAD_DIM**-0.5
    out = torch.full_like(q, float("nan"))
    paged_decode_attention(
        q, ctx.k_cache, ctx.v_cache, meta.block_tables, meta.seq_lens, scale, num_splits, out
    )
    assert not out.isnan().any(), "kernel left NaN (poisoned or unwritten) values in the output"
    ref = REFERENCE.decode(q, *ctx.clean_caches(), meta, scale)
    torch.testing.assert_close(out.float(), ref.float(), **TOL)
    old = two_stage_reference(q, *ctx.clean_caches(), meta.block_tables, meta.seq_lens, scale, num_splits)
    torch.testing.assert_close(out.float().cpu(), old, **TOL)
    return out


def _counters_are_zero() -> bool:
    return bool((DECODE_COUNTERS.get(torch.device(DEVICE), 0) == 0).all())


@pytest.mark.parametrize("num_splits", [5, 16, 64])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_very_different_lengths_in_one_launch(num_splits, group):
    # From a single token (direct write) through a few used splits to every split used.
    lengths = [1, TILE_N - 3, TILE_N + 1, 3 * TILE_N + 7, num_splits * TILE_N + 5]
    ctx, q = _case(lengths, group, 16, ("lengths", num_splits))
    _check(ctx, q, num_splits)
    assert _counters_are_zero()


@pytest.mark.parametrize("block_size", [16, 256])
def test_long_context_many_splits(block_size):
    lengths = [64 * TILE_N + 11, 9 * TILE_N, 2]
    ctx, q = _case(lengths, 4, block_size, "long")
    _check(ctx, q, 64)


def test_graph_padding_rows():
    # CUDA-graph steps pad with rows of context length 1 (slot -1: nothing stored) whose block-table
    # rows are stale; real rows around them still merge many splits.
    real = [5 * TILE_N + 3, 17, 2 * TILE_N]
    ctx, q = _case(real + [1] * 5, 2, 16, "padding")
    ctx.block_tables[len(real) :] = ctx.block_tables[0]  # a stale table: valid blocks, not the row's own
    out = _check(ctx, q, 16)
    assert torch.isfinite(out).all()


def test_back_to_back_launches_reset_the_counters():
    """Each launch must leave every counter at zero, or the next one's last arrival is misjudged."""
    lengths = [7 * TILE_N + 1, 3 * TILE_N, 1, 12 * TILE_N + 9]
    ctx, q = _case(lengths, 4, 32, "repeat")
    gen = generator("repeat-lengths")
    for _ in range(2 if INTERPRET else 50):
        new_q = torch.randn(q.shape, generator=gen).to(DEVICE, DTYPE)
        shorter = [max(1, n - int(torch.randint(0, n, (1,), generator=gen))) for n in lengths]
        _check(ctx, new_q, 16, seq_lens=shorter)
        assert _counters_are_zero()


def test_counters_grow_with_the_batch_and_keep_old_buffers():
    counters = ArrivalCounters("test", 4)
    device = torch.device(DEVICE)
    small = counters.get(device, 3)
    assert small.numel() == 4 and counters.get(device, 4) is small
    big = counters.get(device, 9)
    assert big.numel() >= 9 and (big == 0).all() and big.dtype == torch.int32
    assert counters._retired == [small]  # a graph captured with `small` still replays into it
    with pytest.raises(ValueError, match="min_size"):
        ArrivalCounters("bad", 0)


def test_bad_split_count_is_named():
    ctx, q = _case([5], 1, 16, "bad")
    with pytest.raises(ValueError, match="num_splits"):
        paged_decode_attention(q, ctx.k_cache, ctx.v_cache, ctx.block_tables, torch.tensor([5]), 1.0, 0)


@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_counters_are_never_allocated_during_capture():
    counters = ArrivalCounters("capture", 4)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="before capturing"), torch.cuda.graph(graph):
        counters.get(torch.device("cuda"), 8)
