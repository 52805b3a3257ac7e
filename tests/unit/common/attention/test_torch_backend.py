"""The torch reference backend with bf16 tensors on the CPU: attention is computed in float32 there
(PyTorch's CPU SDPA is several times slower in bf16), and the result equals attention on the same
bf16 inputs computed in float32 (rounded to bf16 once, at the end)."""

from __future__ import annotations

import torch

from common.attention.base import AttentionMetadata
from common.attention.torch_backend import TorchAttentionBackend

BLOCK, KV_HEADS, HEADS, DIM = 4, 2, 4, 16


def _case(dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    k_cache = torch.randn(8, BLOCK, KV_HEADS, DIM, generator=g).to(dtype)
    v_cache = torch.randn(8, BLOCK, KV_HEADS, DIM, generator=g).to(dtype)
    q = torch.randn(2, HEADS, DIM, generator=g).to(dtype)
    seq_lens = [7, 12]
    meta = AttentionMetadata(
        is_decode=True,
        slot_mapping=torch.tensor([6, 31]),
        query_start_loc=torch.tensor([0, 1, 2], dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.tensor([[0, 1, 0], [4, 5, 7]], dtype=torch.int32),
        max_query_len=1,
        max_seq_len=12,
        query_start_loc_host=[0, 1, 2],
        seq_lens_host=seq_lens,
    )
    return q, k_cache, v_cache, meta


def test_bf16_decode_and_prefill_attend_in_float32_on_the_cpu():
    backend = TorchAttentionBackend()
    q, k, v, meta = _case(torch.bfloat16)
    decode = backend.decode(q, k, v, meta, scale=DIM**-0.5)
    prefill = backend.prefill(q, k, v, meta, scale=DIM**-0.5)  # one query row per sequence: the same
    assert decode.dtype == torch.bfloat16 and prefill.dtype == torch.bfloat16
    reference = backend.decode(q.float(), k.float(), v.float(), meta, scale=DIM**-0.5)
    assert torch.equal(decode, reference.to(torch.bfloat16))
    torch.testing.assert_close(prefill.float(), reference, atol=1e-2, rtol=1e-2)


def test_bf16_decode_reuses_scratch_across_lengths_and_matches_a_fresh_backend():
    """Scratch buffers grow and are reused by later, shorter steps: results never depend on what an
    earlier step left in them."""
    backend = TorchAttentionBackend()
    q, k, v, meta = _case(torch.bfloat16)
    long_out = backend.decode(q, k, v, meta, scale=DIM**-0.5)
    short = AttentionMetadata(
        is_decode=True,
        slot_mapping=torch.tensor([1]),
        query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
        seq_lens=torch.tensor([3], dtype=torch.int32),
        block_tables=torch.tensor([[6, 0, 0]], dtype=torch.int32),
        max_query_len=1,
        max_seq_len=3,
        query_start_loc_host=[0, 1],
        seq_lens_host=[3],
    )
    reused = backend.decode(q[:1], k, v, short, scale=DIM**-0.5)
    assert torch.equal(reused, TorchAttentionBackend().decode(q[:1], k, v, short, scale=DIM**-0.5))
    assert torch.equal(backend.decode(q, k, v, meta, scale=DIM**-0.5), long_out)
