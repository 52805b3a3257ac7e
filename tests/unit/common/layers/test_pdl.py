"""Programmatic dependent launch (common/layers/pdl.py): the flag's validation, and on a Hopper GPU a captured
chain of PDL kernels, each reading what the kernel just before it wrote, against the same chain
launched without PDL."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from common.layers import pdl  # noqa: E402


@pytest.fixture
def flag(monkeypatch):
    """Set PDSERVE_PDL for one test; the flag is read once per process, so the cache is cleared."""

    def set_flag(value: str | None) -> None:
        if value is None:
            monkeypatch.delenv("PDSERVE_PDL", raising=False)
        else:
            monkeypatch.setenv("PDSERVE_PDL", value)
        pdl._flag.cache_clear()

    yield set_flag
    pdl._flag.cache_clear()


def test_auto_by_default_off_where_unsupported(flag):
    flag(None)
    assert pdl.pdl_enabled(torch.device("cpu")) is False
    flag("auto")
    assert pdl.pdl_enabled(torch.device("cpu")) is False
    flag("0")
    assert pdl.pdl_enabled(torch.device("cpu")) is False


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_auto_follows_the_gpu(flag):
    flag(None)
    assert pdl.pdl_enabled(torch.device("cuda:0")) == (torch.cuda.get_device_capability()[0] >= 9)
    flag("0")
    assert pdl.pdl_enabled(torch.device("cuda:0")) is False


def test_bad_value_and_unsupported_device_are_named(flag):
    flag("yes")
    with pytest.raises(ValueError, match="PDSERVE_PDL must be one of"):
        pdl.pdl_enabled(torch.device("cpu"))
    flag("1")
    with pytest.raises(ValueError, match="compute capability 9.0"):
        pdl.pdl_enabled(torch.device("cpu"))


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def _chain(x, weights, caches, seq_lens, tables, slot, rope):
    """Three decode-like layers, each kernel launched as a one-row engine step launches it: add+RMSNorm,
    the merged q/k/v projection (streaming GEMV), q/k norm + rotary + KV store, one-launch attention over
    a long context (many splits, so the merge runs too), the output projection (skinny) feeding the next
    layer. The norm, the rope store and the attention let their successor launch before they wait."""
    from common.attention.triton_kernels.decode_attention import paged_decode_attention
    from common.layers.triton_gemv import gemv
    from common.layers.triton_ops import rmsnorm
    from common.layers.triton_qkv import qkv_rope_store
    from common.layers.triton_skinny import skinny_linear

    k_cache, v_cache = caches
    heads, kv_heads, dim = 16, 8, 128
    cos, sin, position, norm_weight, q_norm, k_norm = rope
    residual = x
    for wqkv, wo in weights:
        h, residual = rmsnorm(x, norm_weight, 1e-6, residual)
        qkv = gemv(h, wqkv)
        q = qkv_rope_store(
            qkv, position, cos, sin, q_norm, k_norm, 1e-6, heads, kv_heads, k_cache, v_cache, slot
        )
        o = paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, dim**-0.5, num_splits=32)
        x = skinny_linear(o.view(1, heads * dim), wo)
    return x


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="PDL needs compute capability 9.0 or newer")
def test_captured_pdl_chain_matches_the_chain_without_pdl(flag):
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(torch.bfloat16)

    hidden, context, block = 1024, 1000, 16
    weights = [
        (rand(2048 + 1024 + 1024, hidden, scale=0.03), rand(hidden, 2048, scale=0.02)) for _ in range(3)
    ]
    tables = torch.randperm(64, device="cuda", dtype=torch.int32)[: context // block + 1].view(1, -1)
    seq_lens = torch.tensor([context], device="cuda", dtype=torch.int32)
    pos = context - 1
    slot = (tables[0, pos // block] * block + pos % block).view(1).long()
    x = rand(1, hidden)
    angles = torch.arange(context + 1, device="cuda")[:, None] * torch.rand(64, device="cuda", generator=gen)
    rope = (
        angles.cos(),
        angles.sin(),
        torch.tensor([pos], device="cuda"),
        rand(hidden) + 1,
        rand(128) + 1,
        rand(128) + 1,
    )

    def caches():
        g = torch.Generator(device="cuda").manual_seed(1)
        return tuple(torch.randn(64, block, 8, 128, device="cuda", generator=g).bfloat16() for _ in range(2))

    flag("0")
    want = _chain(x, weights, caches(), seq_lens, tables, slot, rope)
    flag("1")
    kv = caches()
    _chain(x, weights, kv, seq_lens, tables, slot, rope)  # compile and size the counters outside capture
    graph = torch.cuda.CUDAGraph()
    kv = caches()
    with torch.cuda.graph(graph):
        got = _chain(x, weights, kv, seq_lens, tables, slot, rope)
    for _ in range(3):  # each replay rewrites the same slot with the same k/v: same answer each time
        got.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)
