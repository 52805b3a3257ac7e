"""The float32 contexts the torch backend keeps across bf16 decode steps on the CPU give exactly the
attention of a fresh gather at every step, and are rebuilt when the batch or the cache changes."""

from __future__ import annotations

import torch

from common.attention.base import AttentionMetadata
from common.attention.torch_backend import TorchAttentionBackend

BLOCK, KV_HEADS, HEADS, DIM, BLOCKS = 4, 2, 6, 16, 16
SCALE = DIM**-0.5


def _meta(tables: list[list[int]], lens: list[int], ids: list[int] | None) -> AttentionMetadata:
    slots = [t[(n - 1) // BLOCK] * BLOCK + (n - 1) % BLOCK for t, n in zip(tables, lens, strict=True)]
    rows = len(lens)
    return AttentionMetadata(
        is_decode=True,
        slot_mapping=torch.tensor(slots),
        query_start_loc=torch.arange(rows + 1, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        block_tables=torch.tensor(tables, dtype=torch.int32),
        max_query_len=1,
        max_seq_len=max(lens),
        query_start_loc_host=list(range(rows + 1)),
        seq_lens_host=lens,
        seq_ids_host=ids,
    )


def _step(backend, caches, tables, lens, ids, g):
    """Store one new token per sequence, then decode; also decode with a backend that gathers afresh."""
    k_cache, v_cache = caches
    meta = _meta(tables, lens, ids)
    new = [torch.randn(len(lens), KV_HEADS, DIM, generator=g).bfloat16() for _ in range(2)]
    backend.store_kv(*new, k_cache, v_cache, meta.slot_mapping)
    q = torch.randn(len(lens), HEADS, DIM, generator=g).bfloat16()
    fresh = TorchAttentionBackend().decode(q, k_cache, v_cache, _meta(tables, lens, None), SCALE)
    return backend.decode(q, k_cache, v_cache, meta, SCALE), fresh


def test_kept_contexts_match_a_fresh_gather_step_after_step():
    g = torch.Generator().manual_seed(0)
    caches = [torch.randn(BLOCKS, BLOCK, KV_HEADS, DIM, generator=g).bfloat16() for _ in range(2)]
    backend = TorchAttentionBackend()
    tables, lens, ids = [[3, 5, 7, 9, 11, 13], [2, 4, 6, 8, 10, 12]], [2, 9], [10, 11]
    for _ in range(12):  # crosses block boundaries, appending one token per step
        kept, fresh = _step(backend, caches, tables, lens, ids, g)
        assert torch.equal(kept, fresh) and backend._contexts._layers
        lens = [n + 1 for n in lens]
    # Another sequence in row 1 (same blocks, one token longer): rebuilt, not appended.
    kept, fresh = _step(backend, caches, tables, lens, [10, 12], g)
    assert torch.equal(kept, fresh)


def test_a_prefill_step_invalidates_the_kept_contexts():
    g = torch.Generator().manual_seed(1)
    caches = [torch.randn(BLOCKS, BLOCK, KV_HEADS, DIM, generator=g).bfloat16() for _ in range(2)]
    backend = TorchAttentionBackend()
    tables, ids = [[1, 2, 3]], [7]
    _step(backend, caches, tables, [5], ids, g)
    caches[0][1, 0] = 4.0  # a prefill step rewrites an already-cached slot (e.g. a rejected draft)
    q = torch.randn(1, HEADS, DIM, generator=g).bfloat16()
    backend.prefill(q, *caches, _meta(tables, [5], ids), SCALE)
    kept, fresh = _step(backend, caches, tables, [6], ids, g)  # would otherwise continue (5 -> 6)
    assert torch.equal(kept, fresh)


def test_over_budget_falls_back_to_gathering(monkeypatch):
    monkeypatch.setenv("PDSERVE_CPU_CONTEXT_MB", "0")
    g = torch.Generator().manual_seed(2)
    caches = [torch.randn(BLOCKS, BLOCK, KV_HEADS, DIM, generator=g).bfloat16() for _ in range(2)]
    backend = TorchAttentionBackend()
    kept, fresh = _step(backend, caches, [[1, 2]], [6], [3], g)
    assert torch.equal(kept, fresh) and not backend._contexts._layers
