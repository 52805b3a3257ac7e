"""The fp8 KV cache's quantisation, its in-block scale layout, and the torch backend reading it (CPU)."""

from __future__ import annotations

import pytest
import torch

from common.attention import kv_fp8
from common.attention.torch_backend import TorchAttentionBackend
from tests.helpers.paged_kv import PagedContext, generator

BLOCK, KV_HEADS, DIM = 16, 2, 32


def test_round_trip_error_is_within_half_an_fp8_step():
    """e4m3 keeps 3 mantissa bits: rounding costs at most 2^-4 of |x| (normals) or half the smallest
    subnormal step, 2^-10 of the scale, whatever the vector's magnitude."""
    gen = generator("round-trip")
    x = torch.randn(500, KV_HEADS, DIM, generator=gen) * torch.logspace(-6, 4, 500)[:, None, None]
    values, scales = kv_fp8.quantize(x)
    assert values.dtype == torch.float8_e4m3fn and scales.shape == (500, KV_HEADS)
    err = (kv_fp8.dequantize(values, scales, torch.float32) - x).abs()
    bound = x.abs() * 2**-4 + scales.unsqueeze(-1) * 2**-10
    assert (err <= bound * (1 + 1e-6)).all()
    # The largest element of every vector maps to e4m3's largest value: no clipping, full range used.
    assert torch.equal(values.float().abs().amax(-1), torch.full((500, KV_HEADS), kv_fp8.FP8_MAX))


def test_zero_and_bf16_vectors_quantise_without_nan():
    values, scales = kv_fp8.quantize(torch.zeros(3, 2, DIM, dtype=torch.bfloat16))
    assert torch.equal(
        kv_fp8.dequantize(values, scales, torch.bfloat16), torch.zeros(3, 2, DIM, dtype=torch.bfloat16)
    )
    assert (scales == kv_fp8.SCALE_EPS).all()


def test_the_flag_maps_to_one_torch_dtype():
    assert kv_fp8.kv_cache_torch_dtype("auto", torch.bfloat16) is torch.bfloat16
    assert kv_fp8.kv_cache_torch_dtype("fp8", torch.bfloat16) is torch.float8_e4m3fn
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        kv_fp8.kv_cache_torch_dtype("int8", torch.bfloat16)


@pytest.mark.parametrize(
    "block_size, head_dim, rows", [(16, 32, 2), (16, 64, 1), (16, 128, 1), (256, 64, 16)]
)
def test_scale_rows_hold_one_float32_per_token_and_head(block_size, head_dim, rows):
    assert kv_fp8.scale_rows(block_size, head_dim) == rows
    shape = kv_fp8.cache_shape(3, 5, block_size, 4, head_dim, kv_fp8.FP8_DTYPE)
    assert shape == (2, 3, 5, block_size + rows, 4, head_dim)
    assert rows * 4 * head_dim >= block_size * 4 * 4  # room for block_size x 4 heads x 4 bytes
    assert kv_fp8.cache_shape(3, 5, block_size, 4, head_dim, torch.bfloat16) == (
        2,
        3,
        5,
        block_size,
        4,
        head_dim,
    )
    with pytest.raises(ValueError, match="head_dim"):
        kv_fp8.scale_rows(16, 30)


def _fp8_cache(num_blocks: int = 6) -> torch.Tensor:
    shape = kv_fp8.cache_shape(2, num_blocks, BLOCK, KV_HEADS, DIM, kv_fp8.FP8_DTYPE)
    return torch.zeros(shape, dtype=kv_fp8.FP8_DTYPE)


def test_a_block_carries_its_scales():
    """Storing through one layer's view writes only that layer's blocks, and copying the raw bytes of one
    block (what every KV transport does) moves its values and scales: it dequantises the same elsewhere."""
    gen = generator("block-bytes")
    src, dst = _fp8_cache(), _fp8_cache()
    k_view, v_view = kv_fp8.layer_views(src, BLOCK)[1]
    k, v = torch.randn(5, KV_HEADS, DIM, generator=gen) * 30, torch.randn(5, KV_HEADS, DIM, generator=gen)
    slots = torch.tensor([2 * BLOCK, 2 * BLOCK + 3, 2 * BLOCK + 15, 4 * BLOCK + 1, 4 * BLOCK + 7])
    kv_fp8.store(k, v, k_view, v_view, slots)
    assert not src[:, 0].view(torch.uint8).any()  # layer 0 untouched
    assert not src[:, :, [0, 1, 3, 5]].view(torch.uint8).any()  # only blocks 2 and 4 written
    dst[:, :, 0] = src[:, :, 4]  # block 4 -> block 0, bytes only
    dst_k, dst_v = kv_fp8.layer_views(dst, BLOCK)[1]
    blocks = torch.tensor([0])
    assert torch.equal(
        kv_fp8.gather(dst_k, blocks, torch.float32), kv_fp8.gather(k_view, torch.tensor([4]), torch.float32)
    )
    got = kv_fp8.gather(dst_k, blocks, torch.float32)[0, [1, 7]]
    torch.testing.assert_close(got, k[3:], atol=0, rtol=2**-4)
    torch.testing.assert_close(
        kv_fp8.gather(dst_v, blocks, torch.float32)[0, [1, 7]], v[3:], atol=0, rtol=2**-4
    )


def _fp8_context(seq_lens, gen) -> tuple[PagedContext, torch.Tensor, torch.Tensor]:
    """A paged context whose fp8 caches were filled by the backend's own store, with an fp32 twin that
    holds the exact values the fp8 cache dequantises to."""
    ctx = PagedContext(seq_lens, BLOCK, KV_HEADS, DIM, torch.float32, gen, "cpu", spare_blocks=1)
    k32, v32 = ctx.clean_caches()
    num_blocks = k32.shape[0]
    fp8 = torch.zeros(
        kv_fp8.cache_shape(1, num_blocks, BLOCK, KV_HEADS, DIM, kv_fp8.FP8_DTYPE), dtype=kv_fp8.FP8_DTYPE
    )
    k8, v8 = kv_fp8.layer_views(fp8, BLOCK)[0]
    slots = torch.arange(num_blocks * BLOCK)
    TorchAttentionBackend().store_kv(k32.flatten(0, 1), v32.flatten(0, 1), k8, v8, slots)
    all_blocks = torch.arange(num_blocks)
    return (
        ctx,
        (k8, v8),
        (kv_fp8.gather(k8, all_blocks, torch.float32), kv_fp8.gather(v8, all_blocks, torch.float32)),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_torch_backend_reads_fp8_as_its_dequantised_values(dtype):
    """Decode and prefill over an fp8 cache equal attention over the dequantised cache (exactly what the
    fp8 cache holds), and stay near attention over the unquantised values."""
    gen = generator("backend", str(dtype))
    seq_lens = [1, 16, 17, 40]
    ctx, (k8, v8), (k_deq, v_deq) = _fp8_context(seq_lens, gen)
    backend, scale = TorchAttentionBackend(), DIM**-0.5
    q = torch.randn(len(seq_lens), 2 * KV_HEADS, DIM, generator=gen).to(dtype)
    meta = ctx.meta([1] * len(seq_lens), is_decode=True)
    decode = backend.decode(q, k8, v8, meta, scale)
    reference = TorchAttentionBackend().decode(q.float(), k_deq, v_deq, meta, scale)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(decode.float(), reference, atol=tol, rtol=tol)
    q_lens = [1, 5, 17, 12]  # chunks over a cached prefix (prefix-cached blocks read as fp8)
    q_pre = torch.randn(sum(q_lens), 2 * KV_HEADS, DIM, generator=gen).to(dtype)
    pre_meta = ctx.meta(q_lens, is_decode=False)
    prefill = backend.prefill(q_pre, k8, v8, pre_meta, scale)
    torch.testing.assert_close(
        prefill.float(), backend.prefill(q_pre.float(), k_deq, v_deq, pre_meta, scale), atol=tol, rtol=tol
    )
    unquantised = backend.prefill(q_pre.float(), *ctx.clean_caches(), pre_meta, scale)
    # N(0, 1) keys and values: each stored element is off by up to 2^-4 of itself (about 2.5% on average),
    # so outputs (weighted means of the values, weights from perturbed scores) move by about as much.
    err = (prefill.float() - unquantised).abs()
    assert err.mean() < 0.02 and err.max() < 0.25, (err.mean(), err.max())
