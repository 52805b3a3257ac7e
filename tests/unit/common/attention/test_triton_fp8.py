"""Triton kernels on an fp8 KV cache against the torch reference over the same (dequantised) cache.

GPU only (marked `gpu`): Triton's fp8 conversions need sm89+ hardware. Run with
`python -m pytest -q -m gpu tests/unit/common/attention/test_triton_fp8.py`. Poison as in
test_triton_kernels.py: unused slots of the fp8 caches hold NaN values and NaN scales, so a kernel that
reads past a context shows NaN.
"""

from __future__ import annotations

import pytest
import torch

from common.attention import kv_fp8
from tests.helpers.paged_kv import PagedContext, generator

pytestmark = pytest.mark.gpu
triton = pytest.importorskip("triton")

from common.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from common.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from common.attention.triton_kernels.decode_attention import paged_decode_attention  # noqa: E402
from common.attention.triton_kernels.prefill_attention import paged_prefill_attention  # noqa: E402
from common.attention.triton_kernels.store_kv import store_kv  # noqa: E402

DEVICE = "cuda"
KV_HEADS, HEAD_DIM = 2, 128
REFERENCE = TorchAttentionBackend()
TOL = {torch.bfloat16: dict(atol=2e-2, rtol=2e-2), torch.float16: dict(atol=5e-3, rtol=5e-3)}
NAN_BYTE = 0x7F  # e4m3fn NaN


def _fp8_views(num_blocks: int, block_size: int, num_kv_heads: int = KV_HEADS, head_dim: int = HEAD_DIM):
    shape = kv_fp8.cache_shape(1, num_blocks, block_size, num_kv_heads, head_dim, kv_fp8.FP8_DTYPE)
    cache = torch.zeros(shape, dtype=kv_fp8.FP8_DTYPE, device=DEVICE)
    return kv_fp8.layer_views(cache, block_size)[0]


def _fp8_context(ctx: PagedContext, poison: bool = True):
    """fp8 caches holding ctx's values (stored by the torch reference; poisoned unless told), and the
    float32 caches they dequantise to (clean: poison zeroed) for the reference."""
    num_blocks, block_size = ctx.k_cache.shape[:2]
    slots = torch.arange(num_blocks * block_size, device=DEVICE)
    k8, v8 = _fp8_views(num_blocks, block_size)
    clean_k, clean_v = ctx.clean_caches()
    REFERENCE.store_kv(clean_k.flatten(0, 1), clean_v.flatten(0, 1), k8, v8, slots)
    all_blocks = torch.arange(num_blocks, device=DEVICE)
    deq = (kv_fp8.gather(k8, all_blocks, torch.float32), kv_fp8.gather(v8, all_blocks, torch.float32))
    for cache, source in ((k8, ctx.k_cache), (v8, ctx.v_cache)) if poison else ():
        unused = source.isnan()
        cache.view(torch.uint8)[unused] = NAN_BYTE
        kv_fp8.scales_of(cache)[unused.any(-1)] = float("nan")
    return (k8, v8), deq


def _assert_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert not out.isnan().any(), "kernel read poisoned (unused) slots or left outputs unwritten"
    torch.testing.assert_close(out.float(), ref.float(), **TOL[out.dtype])


@pytest.mark.parametrize("block_size", [16, 32, 256])
@pytest.mark.parametrize("num_kv_heads", [1, 2, 8])
def test_store_kv_quantises_like_the_reference(block_size, num_kv_heads):
    gen = generator("fp8-store", block_size, num_kv_heads)
    num_blocks, tokens = 6, 37
    fused = (torch.randn(tokens, 3 * num_kv_heads, HEAD_DIM, generator=gen) * 5).to(DEVICE, torch.bfloat16)
    k, v = fused[:, num_kv_heads : 2 * num_kv_heads], fused[:, 2 * num_kv_heads :]
    k[0, 0] = 0.0  # an all-zero head: scale epsilon, zeros stored
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens].to(DEVICE)
    slots[::5] = -1
    got, want = (
        _fp8_views(num_blocks, block_size, num_kv_heads),
        _fp8_views(num_blocks, block_size, num_kv_heads),
    )
    store_kv(k, v, *got, slots)
    REFERENCE.store_kv(k, v, *want, slots)
    blocks = torch.arange(num_blocks, device=DEVICE)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(kv_fp8.scales_of(g), kv_fp8.scales_of(w), atol=0, rtol=1e-6)
        # Division rounding may put an element one e4m3 step (2^-3 relative) from the reference's.
        torch.testing.assert_close(
            kv_fp8.gather(g, blocks, torch.float32),
            kv_fp8.gather(w, blocks, torch.float32),
            atol=1e-6,
            rtol=2**-3,
        )
    written = torch.zeros(num_blocks * block_size, dtype=torch.bool, device=DEVICE)
    written[slots[slots >= 0]] = True
    assert not got[0].flatten(0, 1)[~written].view(torch.uint8).any()  # padding and other slots untouched


@pytest.mark.parametrize("case", [[(7, 7), (33, 33), (150, 150)], [(5, 40), (64, 200), (1, 77), (130, 259)]])
@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_prefill_reads_fp8(case, block_size, dtype):
    """Fresh prompts, and chunks over a cached (fp8, prefix-cached) context."""
    gen = generator("fp8-prefill", str(case), block_size, str(dtype))
    q_lens = [q for q, _ in case]
    ctx = PagedContext([c for _, c in case], block_size, KV_HEADS, HEAD_DIM, torch.float32, gen, DEVICE)
    (k8, v8), (k_deq, v_deq) = _fp8_context(ctx)
    meta = ctx.meta(q_lens, is_decode=False)
    q = torch.randn(sum(q_lens), 4 * KV_HEADS, HEAD_DIM, generator=gen).to(DEVICE, dtype)
    scale = HEAD_DIM**-0.5
    out = paged_prefill_attention(
        q,
        k8,
        v8,
        meta.block_tables,
        meta.query_start_loc,
        meta.seq_lens,
        scale,
        meta.max_query_len,
        out=torch.full_like(q, float("nan")),
    )
    _assert_close(out, REFERENCE.prefill(q.float(), k_deq, v_deq, meta, scale))


@pytest.mark.parametrize("num_splits", [1, 4, 16])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("block_size", [16, 128])
def test_decode_reads_fp8(num_splits, group, block_size):
    gen = generator("fp8-decode", num_splits, group, block_size)
    seq_lens = torch.randint(1, 2000, (17,), generator=gen).tolist()
    seq_lens[:3] = [1, block_size, block_size + 1]
    ctx = PagedContext(seq_lens, block_size, KV_HEADS, HEAD_DIM, torch.float32, gen, DEVICE)
    (k8, v8), (k_deq, v_deq) = _fp8_context(ctx)
    meta = ctx.meta([1] * len(seq_lens), is_decode=True)
    q = torch.randn(len(seq_lens), group * KV_HEADS, HEAD_DIM, generator=gen).to(DEVICE, torch.bfloat16)
    scale = HEAD_DIM**-0.5
    out = paged_decode_attention(
        q, k8, v8, meta.block_tables, meta.seq_lens, scale, num_splits, out=torch.full_like(q, float("nan"))
    )
    _assert_close(out, REFERENCE.decode(q.float(), k_deq, v_deq, meta, scale))


def test_backend_forward_stores_then_attends_in_fp8():
    """The Triton backend's store + decode on an fp8 cache equals the torch backend's on another."""
    gen = generator("fp8-forward")
    seq_lens = [5, 40, 300]
    ctx = PagedContext(seq_lens, 16, KV_HEADS, HEAD_DIM, torch.float32, gen, DEVICE)
    (k8, v8), _ = _fp8_context(ctx)
    (rk8, rv8), _ = _fp8_context(ctx, poison=False)  # the reference masks after reading: no NaN
    meta = ctx.meta([1] * 3, is_decode=True)
    q, k, v = (
        torch.randn(3, n * KV_HEADS, HEAD_DIM, generator=gen).to(DEVICE, torch.bfloat16) for n in (4, 1, 1)
    )
    out = TritonAttentionBackend().forward(q, k, v, k8, v8, meta, HEAD_DIM**-0.5)
    ref = REFERENCE.forward(q, k, v, rk8, rv8, meta, HEAD_DIM**-0.5)
    _assert_close(out, ref)
