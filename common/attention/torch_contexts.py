"""float32 copies of the decode batch's contexts, for half-precision decode on the CPU.

The torch backend attends in float32 on the CPU (PyTorch's CPU SDPA is several times slower in bf16).
Gathering every sequence's paged context and widening it to float32 again at every layer of every
decode step cost a fifth of a bf16 decode step. Instead each layer keeps its batch's keys and values
widened, as [B, Hkv, capacity, D]: a decode step that continues the layer's previous one (the same
sequences in the same rows, each exactly one token longer, and no prefill step in between) widens and
appends only its new tokens; any other step rebuilds the copies from the paged cache. The copies are
keyed by sequence id, so a new sequence never reads another's context, and every prefill step
(which may rewrite cached slots, e.g. a speculative verification) invalidates all of them.

They cost memory: 2 x B x Hkv x capacity x D x 4 bytes per layer. Past `PDSERVE_CPU_CONTEXT_MB`
(default 1024) in total, layers fall back to gathering into scratch buffers at every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from common.attention.base import AttentionMetadata
from common.env_flags import env_float

# Room left for appends when a copy is (re)built, so a growing batch rebuilds once per this many tokens.
_SLACK_TOKENS = 256


def budget_bytes() -> int:
    return int(env_float("PDSERVE_CPU_CONTEXT_MB", 1024.0, allow_zero=True) * (1 << 20))


@dataclass
class _LayerContext:
    k: torch.Tensor  # [B, Hkv, capacity, D] float32
    v: torch.Tensor
    seq_ids: list[int]
    seq_lens: list[int]
    epoch: int

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


class WideContexts:
    """Per-layer float32 contexts of the current decode batch (one instance per backend)."""

    def __init__(self, budget: int) -> None:
        self._budget = budget
        self._layers: dict[int, _LayerContext] = {}
        self._epoch = 0
        self._bytes = 0

    def invalidate(self) -> None:
        """The paged cache may have changed under the copies (a prefill step): rebuild them all."""
        self._epoch += 1

    def get(
        self, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """This layer's [B, Hkv, L, D] float32 keys and values, L = tables' width in tokens (positions
        past a sequence's length hold finite stale values: mask them). None: over budget or no ids."""
        ids, lens = meta.seq_ids_host, meta.seq_lens_host
        if not ids or not lens:
            return None
        length = tables.shape[1] * k_cache.shape[1]
        ctx = self._layers.get(k_cache.data_ptr())
        if ctx is not None and self._continues(ctx, ids, lens, length):
            _append(ctx, k_cache, v_cache, meta.slot_mapping, lens)
        else:
            ctx = self._rebuild(ctx, k_cache, v_cache, tables, ids, length)
            if ctx is None:
                return None
        ctx.seq_lens = list(lens)
        return ctx.k[:, :, :length], ctx.v[:, :, :length]

    def _continues(self, ctx: _LayerContext, ids: list[int], lens: list[int], length: int) -> bool:
        return (
            ctx.epoch == self._epoch
            and ctx.seq_ids == ids
            and ctx.k.shape[2] >= length
            and all(n == m + 1 for n, m in zip(lens, ctx.seq_lens, strict=True))
        )

    def _rebuild(self, ctx, k_cache, v_cache, tables, ids: list[int], length: int) -> _LayerContext | None:
        rows, num_kv_heads, head_dim = len(ids), k_cache.shape[2], k_cache.shape[3]
        if ctx is None or ctx.k.shape[0] != rows or ctx.k.shape[2] < length:
            if ctx is not None:
                self._bytes -= ctx.nbytes
                del self._layers[k_cache.data_ptr()]
            shape = (rows, num_kv_heads, length + _SLACK_TOKENS, head_dim)
            if self._bytes + 2 * 4 * rows * num_kv_heads * shape[2] * head_dim > self._budget:
                return None
            # Zeros, not empty: masked positions must hold finite values (0 x NaN would leak into SDPA).
            k = torch.zeros(shape, dtype=torch.float32, device=k_cache.device)
            ctx = _LayerContext(k, torch.zeros_like(k), [], [], self._epoch)
            self._layers[k_cache.data_ptr()] = ctx
            self._bytes += ctx.nbytes
        flat = tables.flatten()
        for cache, wide in ((k_cache, ctx.k), (v_cache, ctx.v)):
            gathered = cache.index_select(0, flat).view(rows, length, num_kv_heads, head_dim)
            wide[:, :, :length].copy_(gathered.transpose(1, 2))
        ctx.seq_ids, ctx.epoch = list(ids), self._epoch
        return ctx


def _append(ctx: _LayerContext, k_cache, v_cache, slots: torch.Tensor, lens: list[int]) -> None:
    """Widen this step's tokens (already stored in the paged cache at `slots`) into their positions."""
    rows = torch.arange(len(lens), device=slots.device)
    pos = torch.tensor(lens, device=slots.device) - 1
    for cache, wide in ((k_cache, ctx.k), (v_cache, ctx.v)):
        wide[rows, :, pos] = cache.view(-1, *cache.shape[2:]).index_select(0, slots).float()
