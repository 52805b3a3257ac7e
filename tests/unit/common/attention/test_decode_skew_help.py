"""The decode kernel's help for skewed batches (decode_plan.SkewHelp): in an unsplit launch the longest
rows split anyway, by helper programs after the rows' own, and every row's output stays the reference's.

Runs on a CUDA machine (marked `gpu`) and on the CPU under the Triton interpreter when
`PDSERVE_TRITON_INTERPRET=1`; anywhere else the module skips.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import triton_interpret
from tests.helpers.decode_kernel import DEVICE, DTYPE, HEAD_DIM, NUM_KV_HEADS, TOL
from tests.helpers.paged_kv import PagedContext, generator

triton_interpret.setup_or_skip()  # before the kernel modules are imported below
INTERPRET = triton_interpret.ENABLED

from common.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from common.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from common.attention.triton_kernels.decode_attention import (  # noqa: E402
    DECODE_COUNTERS,
    decode_tile_n,
    paged_decode_attention,
)
from common.attention.triton_kernels.decode_plan import SkewHelp, longest_first  # noqa: E402

pytestmark = [] if INTERPRET else [pytest.mark.gpu]

TILE_N = decode_tile_n(HEAD_DIM, DTYPE.itemsize)
REFERENCE = TorchAttentionBackend()
# Two long rows among short ones, a one-token row and an empty (padding) row.
SKEWED = [9 * TILE_N + 5, 17, 2 * TILE_N, 1, 5 * TILE_N + 3, 40, 0, TILE_N - 1]


def _case(seq_lens, group, key):
    gen = generator("skew-help", key, group)
    ctx = PagedContext([max(n, 1) for n in seq_lens], 16, NUM_KV_HEADS, HEAD_DIM, DTYPE, gen, DEVICE)
    q = torch.randn((len(seq_lens), group * NUM_KV_HEADS, HEAD_DIM), generator=gen).to(DEVICE, DTYPE)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    return ctx, q, lens


def _helped(ctx, q, lens, skew: SkewHelp) -> torch.Tensor:
    out = torch.full_like(q, float("nan"))
    args = (q, ctx.k_cache, ctx.v_cache, ctx.block_tables, lens, HEAD_DIM**-0.5, 1)
    return paged_decode_attention(*args, out=out, order=longest_first(lens), skew=skew)


def _reference(ctx, q, lens) -> torch.Tensor:
    meta = ctx.meta([1] * q.shape[0], is_decode=True, seq_lens=[max(int(n), 1) for n in lens.tolist()])
    meta.seq_lens = lens
    return REFERENCE.decode(q, *ctx.clean_caches(), meta, HEAD_DIM**-0.5)


def _assert_reference(out, ctx, q, lens) -> None:
    """Rows with context equal the reference's; the empty row is zeros. (SDPA's answer for a row whose
    mask is all False is not defined: on the GPU with GQA it gave a few small nonzero values.)"""
    assert not out.isnan().any(), "kernel left NaN (poisoned or unwritten) values in the output"
    full = lens > 0
    torch.testing.assert_close(out[full].float(), _reference(ctx, q, lens)[full].float(), **TOL)
    assert torch.equal(out[~full], torch.zeros_like(out[~full]))


def _counters_are_zero() -> bool:
    return bool((DECODE_COUNTERS.get(torch.device(DEVICE), 0) == 0).all())


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize(
    "skew",
    [SkewHelp(2, 4, TILE_N), SkewHelp(3, 8, 1), SkewHelp(20, 2, 3 * TILE_N), SkewHelp(4, 4, TILE_N, 3)],
)
def test_helped_rows_give_the_reference_output(group, skew):
    ctx, q, lens = _case(SKEWED, group, (skew.rows, skew.splits))
    _assert_reference(_helped(ctx, q, lens, skew), ctx, q, lens)
    assert _counters_are_zero()


def test_helpers_of_rows_shorter_than_a_piece_do_nothing():
    """Every row fits in `min_split_tokens`: no row splits; the unhelped launch's output, bit for bit."""
    ctx, q, lens = _case(SKEWED, 2, "short")
    plain = paged_decode_attention(
        q, ctx.k_cache, ctx.v_cache, ctx.block_tables, lens, HEAD_DIM**-0.5, 1, order=longest_first(lens)
    )
    assert torch.equal(_helped(ctx, q, lens, SkewHelp(4, 8, 64 * TILE_N)), plain)


def test_rows_long_only_in_tokens_not_against_the_median_do_not_split():
    """`min_ratio`: rows of 4-6 tiles, the longest under 3x the median, keep one program each; the
    unhelped launch's output, bit for bit."""
    lengths = [5 * TILE_N, 4 * TILE_N + 3, 5 * TILE_N - 1, 4 * TILE_N, 6 * TILE_N, 5 * TILE_N + 7]
    ctx, q, lens = _case(lengths, 2, "similar")
    plain = paged_decode_attention(
        q, ctx.k_cache, ctx.v_cache, ctx.block_tables, lens, HEAD_DIM**-0.5, 1, order=longest_first(lens)
    )
    assert torch.equal(_helped(ctx, q, lens, SkewHelp(4, 8, 1, 3)), plain)
    assert _counters_are_zero()


def test_back_to_back_helped_launches_reset_the_counters():
    ctx, q, lens = _case(SKEWED, 4, "repeat")
    gen = generator("skew-repeat")
    for _ in range(2 if INTERPRET else 20):
        new_q = torch.randn(q.shape, generator=gen).to(DEVICE, DTYPE)
        _assert_reference(_helped(ctx, new_q, lens, SkewHelp(2, 4, TILE_N)), ctx, new_q, lens)
        assert _counters_are_zero()


def test_help_needs_an_unsplit_ordered_launch():
    ctx, q, lens = _case(SKEWED, 1, "bad")
    args = (q, ctx.k_cache, ctx.v_cache, ctx.block_tables, lens, 1.0)
    with pytest.raises(ValueError, match="skew help needs num_splits 1"):
        paged_decode_attention(*args, 2, order=longest_first(lens), skew=SkewHelp(2, 4, 1))
    with pytest.raises(ValueError, match="longest-first order"):
        paged_decode_attention(*args, 1, skew=SkewHelp(2, 4, 1))


def test_the_backend_helps_a_large_unsplit_batch_by_default(monkeypatch):
    """By default (PDSERVE_DECODE_SKEW_HELP unset; =0 turns the help off) a batch past one program per
    SM (on the CPU the stand-in is 4 SMs) with a row longer than the default piece (1,024 tokens) gets
    the reference output."""
    monkeypatch.setenv("PDSERVE_DECODE_SKEW_HELP", "0")
    assert not TritonAttentionBackend().help_long_rows
    monkeypatch.delenv("PDSERVE_DECODE_SKEW_HELP")
    backend = TritonAttentionBackend()
    assert backend.help_long_rows
    lengths = [2_500 if INTERPRET else 6_000, 30, 200, 7, 64, 300]
    ctx, q, lens = _case(lengths, 2, "backend")
    meta = ctx.meta([1] * len(lengths), is_decode=True)
    out = backend.decode(q, ctx.k_cache, ctx.v_cache, meta, HEAD_DIM**-0.5)
    torch.testing.assert_close(out.float(), _reference(ctx, q, lens).float(), **TOL)


@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_the_helped_launch_is_graph_capturable_and_follows_new_lengths(monkeypatch):
    """Captured with every row short (no helper works), replayed with a long row among short ones (the
    helpers split it): the output follows, with no host sync in the capture."""
    monkeypatch.delenv("PDSERVE_DECODE_SKEW_HELP", raising=False)  # the default: on
    batch = 160  # 160 x 2 KV heads: past one program per SM, so the launch is unsplit and ordered
    ctx, q, lens = _case([3000] * batch, 4, "graph")
    meta = ctx.meta([1] * batch, is_decode=True)
    meta.max_seq_len = 4096  # the runner's fixed bound at capture
    meta.seq_lens.fill_(100)
    backend = TritonAttentionBackend()
    torch.cuda.set_sync_debug_mode("error")
    try:
        backend.decode(q, ctx.k_cache, ctx.v_cache, meta, HEAD_DIM**-0.5)  # compiles outside the capture
        meta.decode_order = None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = backend.decode(q, ctx.k_cache, ctx.v_cache, meta, HEAD_DIM**-0.5)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    new_lens = torch.full((batch,), 90, dtype=torch.int32, device=DEVICE)
    new_lens[[7, 100]] = torch.tensor([3000, 2100], dtype=torch.int32, device=DEVICE)
    meta.seq_lens.copy_(new_lens)
    out.fill_(float("nan"))
    graph.replay()
    torch.testing.assert_close(out.float(), _reference(ctx, q, new_lens).float(), **TOL)
    assert _counters_are_zero()
