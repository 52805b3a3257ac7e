"""Fused Triton elementwise kernels against the eager layers they replace.

Runs on a CUDA machine (marked `gpu`, bf16) and on the CPU under the Triton interpreter when
`PDSERVE_TRITON_INTERPRET=1` (fp32). Anywhere else the module skips.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.helpers import triton_interpret

triton_interpret.setup_or_skip()
INTERPRET = triton_interpret.ENABLED
if INTERPRET:
    os.environ["PDSERVE_DISABLE_FUSED"] = "1"  # the eager reference must stay eager

from common.layers import triton_ops  # noqa: E402
from common.layers.activation import SiluAndMul  # noqa: E402
from common.layers.norm import RMSNorm  # noqa: E402
from common.layers.rotary import RotaryEmbedding  # noqa: E402

pytestmark = [] if INTERPRET else [pytest.mark.gpu]
DEVICE = "cpu" if INTERPRET else "cuda"
DTYPE = torch.float32 if INTERPRET else torch.bfloat16
TOL = dict(atol=1e-5, rtol=1e-5) if INTERPRET else dict(atol=2e-2, rtol=2e-2)


def _eager(fn):
    """Run a layer with fused kernels off (on CUDA the layers would dispatch to them)."""
    from common.layers import fused

    fused._triton_usable.cache_clear()
    old = os.environ.get("PDSERVE_DISABLE_FUSED")
    os.environ["PDSERVE_DISABLE_FUSED"] = "1"
    try:
        return fn()
    finally:
        if old is None:
            del os.environ["PDSERVE_DISABLE_FUSED"]
        else:
            os.environ["PDSERVE_DISABLE_FUSED"] = old
        fused._triton_usable.cache_clear()


@pytest.mark.parametrize("rows,hidden", [(1, 64), (7, 1024), (33, 576)])
def test_rmsnorm_with_and_without_residual(rows, hidden):
    torch.manual_seed(rows)
    norm = RMSNorm(hidden, 1e-6).to(DEVICE, DTYPE)
    norm.weight.data.normal_(1.0, 0.1)
    x = torch.randn(rows, hidden, device=DEVICE, dtype=DTYPE)
    res = torch.randn(rows, hidden, device=DEVICE, dtype=DTYPE)
    torch.testing.assert_close(triton_ops.rmsnorm(x, norm.weight, norm.eps), _eager(lambda: norm(x)), **TOL)
    out, new_res = triton_ops.rmsnorm(x, norm.weight, norm.eps, res)
    ref_out, ref_res = _eager(lambda: norm(x, res))
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(new_res, ref_res, **TOL)


@pytest.mark.parametrize("rows,inter", [(1, 128), (5, 3072), (9, 1536)])
def test_silu_and_mul(rows, inter):
    x = torch.randn(rows, 2 * inter, device=DEVICE, dtype=DTYPE)
    torch.testing.assert_close(triton_ops.silu_and_mul(x), _eager(lambda: SiluAndMul()(x)), **TOL)


@pytest.mark.parametrize("with_norm", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_norm_rope_on_strided_views(with_norm, head_dim):
    torch.manual_seed(head_dim)
    tokens, heads, kv_heads = 11, 4, 2
    rope = RotaryEmbedding(head_dim, 512, 10000.0).to(DEVICE)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device=DEVICE, dtype=DTYPE)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    positions = torch.randint(0, 512, (tokens,), device=DEVICE)
    qn = kn = None
    if with_norm:
        qn, kn = RMSNorm(head_dim).to(DEVICE, DTYPE), RMSNorm(head_dim).to(DEVICE, DTYPE)
        qn.weight.data.normal_(1.0, 0.1)
        kn.weight.data.normal_(1.0, 0.1)
    ref_q, ref_k = _eager(lambda: rope.forward_with_norm(positions, q, k, qn, kn))
    got_q = triton_ops.norm_rope(q, positions, rope.cos, rope.sin, qn.weight if qn else None, 1e-6)
    got_k = triton_ops.norm_rope(k, positions, rope.cos, rope.sin, kn.weight if kn else None, 1e-6)
    torch.testing.assert_close(got_q, ref_q, **TOL)
    torch.testing.assert_close(got_k, ref_k, **TOL)


@pytest.mark.parametrize("with_k_out", [False, True])
@pytest.mark.parametrize("with_norm", [False, True])
@pytest.mark.parametrize("block_size", [16, 64])
def test_qkv_rope_store_matches_separate_steps(with_norm, block_size, with_k_out):
    from common.attention.torch_backend import TorchAttentionBackend

    torch.manual_seed(block_size)
    tokens, heads, kv_heads, head_dim, blocks = 9, 4, 2, 64, 6
    rope = RotaryEmbedding(head_dim, 512, 10000.0).to(DEVICE)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device=DEVICE, dtype=DTYPE)
    positions = torch.randint(0, 512, (tokens,), device=DEVICE)
    slots = torch.randperm(blocks * block_size, device=DEVICE)[:tokens]
    slots[3] = -1  # padding row: must not be written
    qn = kn = None
    if with_norm:
        qn, kn = RMSNorm(head_dim).to(DEVICE, DTYPE), RMSNorm(head_dim).to(DEVICE, DTYPE)
        qn.weight.data.normal_(1.0, 0.1)
        kn.weight.data.normal_(1.0, 0.1)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k, v = (t.reshape(tokens, -1, head_dim) for t in (q, k, v))
    ref_q, ref_k = _eager(lambda: rope.forward_with_norm(positions, q, k, qn, kn))
    shape = (2, blocks, block_size, kv_heads, head_dim)
    ref_cache = torch.full(shape, float("nan"), device=DEVICE, dtype=DTYPE)
    TorchAttentionBackend().store_kv(ref_k, v, ref_cache[0], ref_cache[1], slots)
    cache = torch.full(shape, float("nan"), device=DEVICE, dtype=DTYPE)
    k_out = torch.full((tokens, kv_heads, head_dim), float("nan"), device=DEVICE, dtype=DTYPE)
    got_q = triton_ops.qkv_rope_store(
        qkv,
        positions,
        rope.cos,
        rope.sin,
        qn.weight if qn else None,
        kn.weight if kn else None,
        1e-6,
        heads,
        kv_heads,
        cache[0],
        cache[1],
        slots,
        k_out if with_k_out else None,
    )
    torch.testing.assert_close(got_q, ref_q, **TOL)
    torch.testing.assert_close(cache, ref_cache, equal_nan=True, **TOL)
    if with_k_out:  # every row, the padding one too, holds exactly the k that went to the cache
        torch.testing.assert_close(k_out, ref_k, **TOL)
        stored = cache[0].flatten(0, 1)[slots[slots >= 0]]
        assert torch.equal(k_out[slots >= 0], stored)


def test_qkv_rope_store_rejects_a_misshapen_k_out():
    tokens, heads, kv_heads, head_dim = 3, 4, 2, 64
    rope = RotaryEmbedding(head_dim, 64, 10000.0).to(DEVICE)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device=DEVICE, dtype=DTYPE)
    cache = torch.zeros((2, 2, 16, kv_heads, head_dim), device=DEVICE, dtype=DTYPE)
    wrong = torch.empty((tokens, heads, head_dim), device=DEVICE, dtype=DTYPE)
    positions = torch.arange(tokens, device=DEVICE)
    slots = torch.arange(tokens, device=DEVICE)
    with pytest.raises(ValueError, match="k_out"):
        triton_ops.qkv_rope_store(
            qkv, positions, rope.cos, rope.sin, None, None, 0.0, heads, kv_heads, *cache, slots, wrong
        )
