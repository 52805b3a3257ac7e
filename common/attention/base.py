"""The attention-backend contract.

Layout invariants every backend relies on:

* The KV cache of one layer is two tensors `k_cache`, `v_cache` of shape
  `[num_blocks, block_size, num_kv_heads, head_dim]` (views into the engine's
  `[2, num_layers, num_blocks, block_size, num_kv_heads, head_dim]` tensor).
* Token t of a step is written to flat slot `slot_mapping[t]` = block_id * block_size + offset;
  a negative slot means "padding, do not write".
* A step's queries are packed: sequence i owns query rows
  `query_start_loc[i] : query_start_loc[i + 1]` of `q` ([num_tokens, num_heads, head_dim]).
  Its context has `seq_lens[i]` tokens (cached prefix + this step's tokens), laid out in blocks
  `block_tables[i, : ceil(seq_lens[i] / block_size)]`. Query row j of sequence i sits at absolute
  position `seq_lens[i] - q_len_i + j` and attends causally to keys 0..that position.
* `is_decode` means every sequence has exactly one query token (the CUDA-graph path).
* GQA: query head h reads KV head h // (num_heads // num_kv_heads).
* `prefill` may also be handed this step's keys/values as tensors (`StepKV`, the same values it stores
  in the cache): a backend that can attend over them directly, when no sequence has a cached prefix,
  says so through `prefill_reads_step_kv`, so that fused callers only build them when they are read.

Backends are stateless apart from scratch buffers and never synchronise with the host on the decode
path, so decode steps can be captured in CUDA graphs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """Per-step inputs shared by every attention layer."""

    is_decode: bool
    slot_mapping: torch.Tensor  # [num_tokens] int64
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32
    max_query_len: int
    max_seq_len: int
    # Host copies for backends that loop over sequences on the host (the torch reference backend).
    query_start_loc_host: list[int] | None = None
    seq_lens_host: list[int] | None = None
    # Each row's sequence id: lets the torch backend keep per-sequence state across decode steps.
    seq_ids_host: list[int] | None = None
    # Decode rows longest first, made by the step's first attention layer that wants it and reused by
    # the rest (the Triton backend's dispatch order; inside a CUDA graph the sort is captured once).
    decode_order: torch.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]


@dataclass
class StepKV:
    """This step's new keys and values, [num_tokens, num_kv_heads, head_dim] each (row-strided views do)."""

    k: torch.Tensor
    v: torch.Tensor


class AttentionBackend(ABC):
    """Computes paged attention for one layer; chosen once per engine."""

    name: str = "base"

    @abstractmethod
    def store_kv(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Write this step's keys/values ([num_tokens, num_kv_heads, head_dim]) into their slots."""

    @abstractmethod
    def prefill(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        step_kv: StepKV | None = None,
    ) -> torch.Tensor:
        """Variable-length causal attention over each sequence's cached prefix plus new tokens.

        `step_kv` (already stored in the cache too) may be read instead of the cache where
        `prefill_reads_step_kv` says so; every other backend ignores it."""

    def prefill_reads_step_kv(
        self, meta: AttentionMetadata, dtype: torch.dtype, head_dim: int, scale: float
    ) -> bool:
        """Whether `prefill` of this step would read `step_kv` (so a fused caller should produce it)."""
        return False

    @abstractmethod
    def decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """One query token per sequence against its whole paged context."""

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """Store the new KV, then attend. Returns [num_tokens, num_heads, head_dim]."""
        self.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        if meta.is_decode:
            return self.decode(q, k_cache, v_cache, meta, scale)
        return self.prefill(q, k_cache, v_cache, meta, scale, StepKV(k, v))
