"""Attention backend on the project's own Triton kernels (GPU; also runs under TRITON_INTERPRET=1).

Imported only when chosen (see `registry.py`), so machines without Triton never import it.

* store_kv: one launch scatters k and v into their slots.
* prefill: one Triton launch over all sequences' query tiles, reading the cached prefix and the new
  tokens through the block table. With `PDSERVE_VARLEN_PREFILL=1`, prompts with no cached prefix, in
  fp16/bf16, run on PyTorch's FlashAttention over the step's own packed k/v instead
  (`varlen_prefill.py`) where this PyTorch has `varlen_attn`. Off by default: on the H200 with
  torch 2.11 it runs at 49% of SDPA's rate against the Triton kernel's 60% (docs/benchmarks-log.md);
  it is there for PyTorch builds whose FlashAttention is faster than the Triton kernel.
* decode: split-K flash-decoding with GQA head packing. The split count is a function of host ints
  only (batch size, KV heads, `meta.max_seq_len`, SM count), and the kernels derive each split's
  range from the sequence's length on the device. For CUDA graphs the runner should fill
  `meta.max_seq_len` with a fixed bound at capture (e.g. max_model_len): the captured split count is
  then right for any context up to it, and correct (if less parallel) beyond it.
"""

from __future__ import annotations

import logging

import torch

from common.attention.base import AttentionBackend, AttentionMetadata, StepKV
from common.attention.triton_kernels.decode_attention import paged_decode_attention
from common.attention.triton_kernels.decode_plan import (
    choose_num_splits,
    longest_first,
    num_sms,
    skew_help,
    wants_order,
)
from common.attention.triton_kernels.prefill_attention import paged_prefill_attention
from common.attention.triton_kernels.store_kv import store_kv
from common.attention.varlen_prefill import (
    PrefillKernel,
    VarlenApi,
    find_varlen_api,
    route,
    varlen_prefill,
)
from common.env_flags import env_switch

log = logging.getLogger(__name__)


class TritonAttentionBackend(AttentionBackend):
    """Paged attention with Triton kernels; stateless, never synchronises with the host on decode."""

    name = "triton"

    def __init__(self, decode_num_splits: int | None = None, varlen_prefill: bool | None = None) -> None:
        # A fixed split count overrides the heuristic (tests, tuning).
        self.decode_num_splits = decode_num_splits
        if varlen_prefill is None:  # see the module docstring for why it is opt-in
            varlen_prefill = env_switch("PDSERVE_VARLEN_PREFILL", default=False)
        use_varlen = varlen_prefill
        self.varlen = find_varlen_api() if use_varlen else None
        # Large decode batches dispatch their longest rows first (decode_attention.py); =0 for A/B runs.
        # Measured (docs/benchmarks.md): 1.03x on the Qwen3-0.6B-shape offline workload; on the default
        # model (contexts 128-1,024) within noise, 64 rows at 1k context 1.469-1.472 vs 1.465-1.481 ms.
        self.longest_first = env_switch("PDSERVE_DECODE_LONGEST_FIRST", default=True)
        # The longest rows of such a batch split anyway, where 4x the median row (decode_plan.SkewHelp);
        # =0 for A/B runs. Measured on the H100 (docs/benchmarks.md, session 27): 8B shape 1.04-1.07x,
        # multiplexed ITL p99 0.76x; the real model and the 0.6B standard workload 0.998-0.999x (noise).
        self.help_long_rows = env_switch("PDSERVE_DECODE_SKEW_HELP", default=True)

    def store_kv(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        store_kv(k, v, k_cache, v_cache, slot_mapping)

    def prefill_reads_step_kv(
        self, meta: AttentionMetadata, dtype: torch.dtype, head_dim: int, scale: float
    ) -> bool:
        kernel = route(self.varlen, dtype, head_dim, scale, meta.query_start_loc_host, meta.seq_lens_host)
        return kernel is PrefillKernel.VARLEN

    def prefill(
        self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float, step_kv: StepKV | None = None
    ) -> torch.Tensor:
        api = self.varlen
        if (
            step_kv is not None
            and api is not None
            and self.prefill_reads_step_kv(meta, q.dtype, q.shape[-1], scale)
        ):
            out = self._varlen(api, q, step_kv, meta, scale)
            if out is not None:
                return out
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

    def _varlen(self, api: VarlenApi, q, step_kv: StepKV, meta: AttentionMetadata, scale: float):
        """FlashAttention on the step's k/v; None (and Triton from then on) if this PyTorch refuses the call:
        the KV is in the cache already, so the paged kernel gives the same answer."""
        try:
            return varlen_prefill(
                api, q, step_kv.k, step_kv.v, meta.query_start_loc, meta.max_query_len, scale
            )
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, ValueError, TypeError) as exc:
            log.warning(
                "varlen_attn failed (%s: %s); prefill falls back to the Triton kernel",
                type(exc).__name__,
                exc,
            )
            self.varlen = None
            return None

    def decode(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        batch, kv_heads, sms = q.shape[0], k_cache.shape[2], num_sms(q.device)
        splits = self.decode_num_splits or choose_num_splits(batch, kv_heads, meta.max_seq_len, sms)
        order = skew = None
        if self.longest_first and wants_order(batch, kv_heads, splits, sms):
            if meta.decode_order is None:
                meta.decode_order = longest_first(meta.seq_lens)
            order = meta.decode_order
            skew = skew_help(batch, kv_heads, splits, sms) if self.help_long_rows else None
        return paged_decode_attention(
            q, k_cache, v_cache, meta.block_tables, meta.seq_lens, scale, splits, order=order, skew=skew
        )
