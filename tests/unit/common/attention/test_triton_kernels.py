"""Triton attention kernels against the torch reference backend.

Runs on a CUDA machine (marked `gpu`; fp16/bf16, large batches) and, on the CPU, under the Triton
interpreter when `PDSERVE_TRITON_INTERPRET=1` (fp32, small shapes). Anywhere else the module skips.

Every case uses shuffled block tables, context lengths that are not multiples of the block size, and
poison: unused cache slots, the blocks that padding entries of the block table point at, and the
output buffers are NaN, so a kernel that reads or leaves anything it should not shows up as NaN.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import triton_interpret
from tests.helpers.paged_kv import PagedContext, generator

triton_interpret.setup_or_skip()  # before the kernel modules are imported below
INTERPRET = triton_interpret.ENABLED
triton = pytest.importorskip("triton")

from common.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from common.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from common.attention.triton_kernels.decode_attention import paged_decode_attention  # noqa: E402
from common.attention.triton_kernels.decode_plan import (  # noqa: E402
    choose_num_splits,
    longest_first,
    wants_order,
)
from common.attention.triton_kernels.prefill_attention import paged_prefill_attention  # noqa: E402
from common.attention.triton_kernels.store_kv import store_kv  # noqa: E402

pytestmark = [] if INTERPRET else [pytest.mark.gpu]

DEVICE = "cpu" if INTERPRET else "cuda"
DTYPES = [torch.float32] if INTERPRET else [torch.bfloat16, torch.float16]
HEAD_DIM = 32 if INTERPRET else 128
NUM_KV_HEADS = 2
BLOCK_SIZES = [16, 32, 64, 128, 256]
GROUPS = [1, 2, 4, 8]
DECODE_BATCHES = [1, 3, 17] if INTERPRET else [1, 3, 17, 64, 256, 512]
MAX_CONTEXT = 300 if INTERPRET else 2000
TOLERANCE = {torch.float32: (2e-5, 1e-5), torch.float16: (5e-3, 5e-3), torch.bfloat16: (2e-2, 2e-2)}
REFERENCE = TorchAttentionBackend()


# ----------------------------------------------------------------------------------------- helpers


def _random(shape, dtype, gen) -> torch.Tensor:
    return torch.randn(shape, generator=gen).to(DEVICE, dtype)


def _nan_like(x: torch.Tensor) -> torch.Tensor:
    return torch.full_like(x, float("nan"))


def _assert_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    atol, rtol = TOLERANCE[out.dtype]
    assert not out.isnan().any(), "kernel left NaN (poisoned or unwritten) values in the output"
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


def _random_lengths(n: int, high: int, gen: torch.Generator) -> list[int]:
    return torch.randint(1, high + 1, (n,), generator=gen).tolist()


# ------------------------------------------------------------------------------------------ store


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("num_kv_heads", [1, 2, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_store_kv_matches_reference(block_size, num_kv_heads, dtype):
    gen = generator("store", block_size, num_kv_heads)
    num_blocks, num_tokens, head_dim = 6, 37, HEAD_DIM
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = _random(shape, dtype, gen), _random(shape, dtype, gen)
    # k and v as strided views of one fused projection, as the model produces them.
    fused = _random((num_tokens, 3 * num_kv_heads, head_dim), dtype, gen)
    k, v = fused[:, num_kv_heads : 2 * num_kv_heads], fused[:, 2 * num_kv_heads :]
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::5] = -1  # padding tokens: never written
    slots = slots.to(DEVICE)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    REFERENCE.store_kv(k, v, expected_k, expected_v, slots)
    store_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, expected_k)
    assert torch.equal(v_cache, expected_v)


def test_store_kv_into_view_of_engine_cache():
    gen = generator("store-view")
    kv = _random((2, 3, 4, 16, NUM_KV_HEADS, HEAD_DIM), DTYPES[0], gen)  # [2, layers, blocks, bs, h, d]
    k = _random((5, NUM_KV_HEADS, HEAD_DIM), DTYPES[0], gen)
    v = _random((5, NUM_KV_HEADS, HEAD_DIM), DTYPES[0], gen)
    slots = torch.tensor([0, 17, 63, -1, 40], device=DEVICE)
    expected = kv.clone()
    REFERENCE.store_kv(k, v, expected[0, 1], expected[1, 1], slots)
    store_kv(k, v, kv[0, 1], kv[1, 1], slots)
    assert torch.equal(kv, expected)


# ---------------------------------------------------------------------------------------- prefill

# (q_len, context length) per sequence: fresh prompts, chunks over a cached prefix, one-token chunks,
# lengths on and off block boundaries, and prompts longer than one 128-row query tile.
PREFILL_CASES = {
    "fresh": [(1, 1), (7, 7), (33, 33), (150, 150)],
    "chunked": [(5, 40), (64, 200), (1, 77), (130, 259)],
    "mixed": [(3, 3), (1, 300), (17, 17), (40, 120), (129, 129), (2, 16)],
}


def _run_prefill(case, block_size, group, dtype, head_dim=HEAD_DIM):
    gen = generator("prefill", case, block_size, group, head_dim)
    q_lens = [q for q, _ in PREFILL_CASES[case]]
    ctx = PagedContext(
        [c for _, c in PREFILL_CASES[case]], block_size, NUM_KV_HEADS, head_dim, dtype, gen, DEVICE
    )
    meta = ctx.meta(q_lens, is_decode=False)
    q = _random((sum(q_lens), group * NUM_KV_HEADS, head_dim), dtype, gen)
    scale = head_dim**-0.5
    out = paged_prefill_attention(
        q,
        ctx.k_cache,
        ctx.v_cache,
        meta.block_tables,
        meta.query_start_loc,
        meta.seq_lens,
        scale,
        meta.max_query_len,
        out=_nan_like(q),
    )
    _assert_close(out, REFERENCE.prefill(q, *ctx.clean_caches(), meta, scale))


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("case", list(PREFILL_CASES))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_prefill_block_sizes(block_size, case, dtype):
    _run_prefill(case, block_size, group=2, dtype=dtype)


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_prefill_gqa(group, dtype):
    _run_prefill("mixed", block_size=16, group=group, dtype=dtype)


@pytest.mark.parametrize("head_dim", [48, 64] if INTERPRET else [64, 96])
def test_prefill_head_dims(head_dim):
    _run_prefill("chunked", block_size=32, group=4, dtype=DTYPES[0], head_dim=head_dim)


def test_prefill_many_sequences():
    gen = generator("prefill-many")
    n = 40 if INTERPRET else 300
    q_lens = _random_lengths(n, 20, gen)
    ctx_lens = [q + extra for q, extra in zip(q_lens, _random_lengths(n, 60, gen), strict=True)]
    ctx = PagedContext(ctx_lens, 16, NUM_KV_HEADS, HEAD_DIM, DTYPES[0], gen, DEVICE)
    meta = ctx.meta(q_lens, is_decode=False)
    q = _random((sum(q_lens), 4 * NUM_KV_HEADS, HEAD_DIM), DTYPES[0], gen)
    out = TritonAttentionBackend().prefill(q, ctx.k_cache, ctx.v_cache, meta, 0.1)
    _assert_close(out, REFERENCE.prefill(q, *ctx.clean_caches(), meta, 0.1))


# ----------------------------------------------------------------------------------------- decode


def _run_decode(batch, block_size, group, dtype, num_splits, max_context=MAX_CONTEXT, head_dim=HEAD_DIM):
    gen = generator("decode", batch, block_size, group, num_splits, head_dim)
    seq_lens = _random_lengths(batch, max_context, gen)
    seq_lens[0] = 1  # a single-token context
    if batch > 2:
        seq_lens[1], seq_lens[2] = block_size, block_size + 1  # exactly on, and just past, a boundary
    ctx = PagedContext(seq_lens, block_size, NUM_KV_HEADS, head_dim, dtype, gen, DEVICE)
    meta = ctx.meta([1] * batch, is_decode=True)
    q = _random((batch, group * NUM_KV_HEADS, head_dim), dtype, gen)
    scale = head_dim**-0.5
    splits = num_splits or choose_num_splits(batch, NUM_KV_HEADS, meta.max_seq_len, 132)
    out = paged_decode_attention(
        q, ctx.k_cache, ctx.v_cache, meta.block_tables, meta.seq_lens, scale, splits, out=_nan_like(q)
    )
    _assert_close(out, REFERENCE.decode(q, *ctx.clean_caches(), meta, scale))


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("num_splits", [1, 3, 16])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_decode_block_sizes_and_splits(block_size, num_splits, dtype):
    _run_decode(batch=17, block_size=block_size, group=2, dtype=dtype, num_splits=num_splits)


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_decode_gqa(group, num_splits, dtype):
    _run_decode(batch=3, block_size=32, group=group, dtype=dtype, num_splits=num_splits)


@pytest.mark.parametrize("batch", DECODE_BATCHES)
def test_decode_batch_sizes_with_heuristic_splits(batch):
    _run_decode(batch=batch, block_size=16, group=2, dtype=DTYPES[0], num_splits=None)


@pytest.mark.parametrize("head_dim", [48, 64] if INTERPRET else [64, 96])
def test_decode_head_dims(head_dim):
    _run_decode(batch=5, block_size=64, group=4, dtype=DTYPES[0], num_splits=2, head_dim=head_dim)


def test_decode_many_splits_long_context():
    _run_decode(batch=2, block_size=16, group=4, dtype=DTYPES[0], num_splits=64, max_context=4 * MAX_CONTEXT)


def test_decode_zero_length_padding_sequence_is_finite():
    # CUDA-graph batches are padded with empty sequences; their rows must not turn into NaN.
    gen = generator("decode-pad")
    ctx = PagedContext([20, 1], 16, NUM_KV_HEADS, HEAD_DIM, DTYPES[0], gen, DEVICE)
    seq_lens = torch.tensor([20, 0], dtype=torch.int32, device=DEVICE)
    q = _random((2, 2 * NUM_KV_HEADS, HEAD_DIM), DTYPES[0], gen)
    ref = REFERENCE.decode(q, *ctx.clean_caches(), ctx.meta([1, 1], is_decode=True), 0.2)
    for splits in (1, 4):
        out = paged_decode_attention(q, ctx.k_cache, ctx.v_cache, ctx.block_tables, seq_lens, 0.2, splits)
        assert torch.equal(out[1], torch.zeros_like(out[1]))
        _assert_close(out[:1], ref[:1])


@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_longest_first_changes_nothing_but_the_dispatch_order(num_splits):
    """Rows dispatched longest first (a zero-length padding row among them) give bit for bit the row
    order's output: each program computes the same thing whenever it runs."""
    gen = generator("decode-order", num_splits)
    batch = 17 if INTERPRET else 300
    seq_lens = _random_lengths(batch, MAX_CONTEXT, gen)
    ctx = PagedContext(seq_lens, 16, NUM_KV_HEADS, HEAD_DIM, DTYPES[0], gen, DEVICE)
    lens = ctx.meta([1] * batch, is_decode=True).seq_lens.clone()
    lens[batch // 2] = 0
    order = longest_first(lens)
    assert lens[order].tolist() == sorted(lens.tolist(), reverse=True)
    q = _random((batch, 2 * NUM_KV_HEADS, HEAD_DIM), DTYPES[0], gen)
    args = (q, ctx.k_cache, ctx.v_cache, ctx.block_tables, lens, HEAD_DIM**-0.5, num_splits)
    plain = paged_decode_attention(*args, out=_nan_like(q))
    ordered = paged_decode_attention(*args, out=_nan_like(q), order=order)
    assert torch.equal(ordered, plain)
    assert torch.equal(ordered[batch // 2], torch.zeros_like(ordered[0]))


def test_longest_first_only_for_unsplit_batches_over_one_program_per_sm():
    assert wants_order(256, 8, 1, 132)
    assert not wants_order(256, 8, 2, 132)  # split launches are many short programs already
    assert not wants_order(16, 8, 1, 132)  # 128 programs: one wave, nothing to reorder
    assert not wants_order(1, 8, 1, 132)  # the latency-bound batch-1 step skips the sort


def test_choose_num_splits_fills_the_gpu_with_powers_of_two():
    assert choose_num_splits(256, 8, 4096, 132) == 1  # 2048 programs already fill 132 SMs
    assert choose_num_splits(1, 8, 4096, 132) == 32  # capped by the 128-token minimum per split
    assert choose_num_splits(64, 8, 1024, 132) == 1  # 512 programs: measured fastest unsplit
    assert choose_num_splits(16, 8, 4096, 132) == 4
    assert choose_num_splits(1, 8, 10, 132) == 1
    for batch in (1, 3, 17, 64, 256, 512):
        for max_len in (1, 100, 1000, 40000):
            splits = choose_num_splits(batch, 8, max_len, 132)
            assert splits >= 1 and splits & (splits - 1) == 0 and splits <= 64


# --------------------------------------------------------------------------------- whole backend


@pytest.mark.parametrize("block_size", [16, 256])
def test_backend_forward_chunked_prefill_then_decode(block_size):
    """store_kv + prefill in two chunks, then decode steps, against the reference doing the same."""
    gen = generator("forward", block_size)
    dtype, num_heads = DTYPES[0], 4 * NUM_KV_HEADS
    prompts = [70, 5, 260]
    ctx = PagedContext([n + 3 for n in prompts], block_size, NUM_KV_HEADS, HEAD_DIM, dtype, gen, DEVICE)
    caches = {"ref": ctx.clean_caches(), "triton": (ctx.k_cache, ctx.v_cache)}
    backends = {"ref": REFERENCE, "triton": TritonAttentionBackend()}
    first = [n // 2 for n in prompts]
    steps = [(first, first, False), ([n - f for n, f in zip(prompts, first, strict=True)], prompts, False)]
    steps += [([1] * len(prompts), [n + i for n in prompts], True) for i in range(1, 4)]
    for q_lens, seq_lens, is_decode in steps:
        meta = ctx.meta(q_lens, is_decode, seq_lens)
        num_tokens = sum(q_lens)
        q = _random((num_tokens, num_heads, HEAD_DIM), dtype, gen)
        k = _random((num_tokens, NUM_KV_HEADS, HEAD_DIM), dtype, gen)
        v = _random((num_tokens, NUM_KV_HEADS, HEAD_DIM), dtype, gen)
        outs = {name: be.forward(q, k, v, *caches[name], meta, 0.125) for name, be in backends.items()}
        _assert_close(outs["triton"], outs["ref"])


# ------------------------------------------------------------------------------------- GPU-only


@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("batch", [64, 160])  # 160 x 2 KV heads > 132 SMs: the longest-first sort is captured
def test_decode_is_graph_capturable_and_sync_free(batch):
    """Capture decode once, then replay with longer contexts and new queries: the result must follow."""
    gen = generator("graph", batch)
    block_size, dtype = 16, torch.bfloat16
    ctx = PagedContext([1500] * batch, block_size, NUM_KV_HEADS, HEAD_DIM, dtype, gen, DEVICE)
    meta = ctx.meta([1] * batch, is_decode=True)
    meta.max_seq_len = 2048  # the runner's fixed bound at capture
    backend = TritonAttentionBackend()
    q = _random((batch, 2 * NUM_KV_HEADS, HEAD_DIM), dtype, gen)
    meta.seq_lens.copy_(torch.tensor(_random_lengths(batch, 200, gen), device=DEVICE))
    torch.cuda.set_sync_debug_mode("error")
    try:
        backend.decode(q, ctx.k_cache, ctx.v_cache, meta, 0.1)  # warm-up compiles outside the capture
        assert (meta.decode_order is not None) == (batch == 160)
        meta.decode_order = None  # a new step's metadata: the capture records its own sort
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = backend.decode(q, ctx.k_cache, ctx.v_cache, meta, 0.1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    new_lens = _random_lengths(batch, 1500, gen)
    meta.seq_lens.copy_(torch.tensor(new_lens, device=DEVICE))
    q.copy_(_random(q.shape, dtype, gen))
    out.fill_(float("nan"))
    graph.replay()
    ref = REFERENCE.decode(q, *ctx.clean_caches(), ctx.meta([1] * batch, True, new_lens), 0.1)
    _assert_close(out, ref)
