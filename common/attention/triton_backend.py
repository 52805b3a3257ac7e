"""Attention backend on the project's own Triton kernels (GPU; also runs under TRITON_INTERPRET=1).

Imported only when chosen (see `registry.py`), so machines without Triton never import it.

* store_kv: one launch scatters k and v into their slots.
* prefill: one launch over all sequences' query tiles; reads the cached prefix and the new tokens
  through the block table (chunked prefill works unchanged).
* decode: split-K flash-decoding with GQA head packing. The split count is a function of host ints
  only (batch size, KV heads, `meta.max_seq_len`, SM count), and the kernels derive each split's
  range from the sequence's length on the device. For CUDA graphs the runner should fill
  `meta.max_seq_len` with a fixed bound at capture (e.g. max_model_len): the captured split count is
  then right for any context up to it, and correct (if less parallel) beyond it.
"""

from __future__ import annotations

import torch

from common.attention.base import AttentionBackend, AttentionMetadata
from common.attention.triton_kernels.decode_attention import (
    choose_num_splits,
    num_sms,
    paged_decode_attention,
)
from common.attention.triton_kernels.prefill_attention import paged_prefill_attention
from common.attention.triton_kernels.store_kv import store_kv


class TritonAttentionBackend(AttentionBackend):
    """Paged attention with Triton kernels; stateless, never synchronises with the host on decode."""

    name = "triton"

    def __init__(self, decode_num_splits: int | None = None) -> None:
        # A fixed split count overrides the heuristic (tests, tuning).
        self.decode_num_splits = decode_num_splits

    def store_kv(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        store_kv(k, v, k_cache, v_cache, slot_mapping)

    def prefill(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        return paged_prefill_attention(
            q,
            k_cache,
            v_cache,
            meta.block_tables,
            meta.query_start_loc,
            meta.seq_lens,
            scale,
            meta.max_query_len,
        )

    def decode(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        splits = self.decode_num_splits or choose_num_splits(
            q.shape[0], k_cache.shape[2], meta.max_seq_len, num_sms(q.device)
        )
        return paged_decode_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens, scale, splits)
