"""Fresh-prompt prefill on PyTorch's own FlashAttention (`torch.nn.attention.varlen.varlen_attn`).

When no sequence of a prefill step has a cached prefix, every sequence's keys are exactly this step's
new tokens, so attention can run on the step's packed q/k/v as they come out of the projection, with
`query_start_loc` as the cumulative lengths of both queries and keys: no block-table gather, and
PyTorch's FlashAttention kernel instead of ours. Chunked prefill and prefix-cache hits still need the
paged cache (FlashAttention's paged mode wants pages of 256 tokens; ours are 16 by default), so they
stay on the Triton kernel, as does float32 (FlashAttention is fp16/bf16 only).

`varlen_attn`'s signature has changed across PyTorch releases (causality as `is_causal` or as
`window_size=(-1, 0)`; `scale` and `enable_gqa` added later), so the backend reads it once when it is
built (`find_varlen_api`) and adapts its call (`VarlenApi.kwargs`). This module imports nothing from
CUDA and touches no GPU at import, so CPU-only code can import it.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

import torch

log = logging.getLogger(__name__)

FLASH_DTYPES = (torch.float16, torch.bfloat16)
FLASH_MAX_HEAD_DIM = 256


@dataclass(frozen=True)
class VarlenApi:
    """How this PyTorch's `varlen_attn` is called."""

    fn: Callable[..., torch.Tensor]
    causal_by_window: bool  # causal as window_size=(-1, 0) (newer) rather than is_causal=True
    takes_scale: bool
    takes_enable_gqa: bool  # newer releases refuse fewer KV heads unless told

    def kwargs(self, scale: float, gqa: bool) -> dict:
        """Keyword arguments for a causal call (scale only where the API takes one; see `route`)."""
        out: dict = {"window_size": (-1, 0)} if self.causal_by_window else {"is_causal": True}
        if self.takes_scale:
            out["scale"] = scale
        if self.takes_enable_gqa and gqa:
            out["enable_gqa"] = True
        return out


def read_varlen_api(fn: Callable | None) -> VarlenApi | None:
    """The calling convention of a `varlen_attn` function, or None when it has no causal mode we know."""
    if fn is None:
        return None
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    if "window_size" in params:
        by_window = True
    elif "is_causal" in params:
        by_window = False
    else:
        return None
    return VarlenApi(fn, by_window, "scale" in params, "enable_gqa" in params)


def find_varlen_api() -> VarlenApi | None:
    """This process's usable `varlen_attn`: present in torch, FlashAttention built in, an sm80+ GPU.

    Call at backend construction (it queries the current CUDA device), never at import.
    """
    if not torch.cuda.is_available():
        return None
    flash_built = getattr(torch.backends.cuda, "is_flash_attention_available", None)
    if flash_built is not None and not flash_built():
        return None
    if torch.cuda.get_device_capability() < (8, 0):
        return None
    try:
        from torch.nn.attention import varlen
    except ImportError:
        return None
    api = read_varlen_api(getattr(varlen, "varlen_attn", None))
    log.info("prefill attention: %s", "FlashAttention varlen for fresh prompts" if api else "Triton only")
    return api


class PrefillKernel(Enum):
    VARLEN = "varlen"  # FlashAttention over the step's own packed k/v
    PAGED = "paged"  # the Triton kernel over the paged cache


def has_cached_prefix(query_start_loc: Sequence[int], seq_lens: Sequence[int]) -> bool:
    """Whether any sequence's context holds tokens before this step's (q_len_i <= seq_len_i for every i,
    so the totals are equal exactly when every sequence's context is its new tokens)."""
    return query_start_loc[-1] - query_start_loc[0] != sum(seq_lens)


def route(
    api: VarlenApi | None,
    dtype: torch.dtype,
    head_dim: int,
    scale: float,
    query_start_loc: Sequence[int] | None,
    seq_lens: Sequence[int] | None,
) -> PrefillKernel:
    """Which kernel a prefill step takes. VARLEN needs: the API, a FlashAttention dtype and head size,
    a scale the API can express, and host copies of the step's lengths showing no cached prefix."""
    if api is None or dtype not in FLASH_DTYPES:
        return PrefillKernel.PAGED
    if head_dim % 8 or head_dim > FLASH_MAX_HEAD_DIM:
        return PrefillKernel.PAGED
    if not api.takes_scale and scale != head_dim**-0.5:  # the kernel's default scale
        return PrefillKernel.PAGED
    if query_start_loc is None or seq_lens is None or has_cached_prefix(query_start_loc, seq_lens):
        return PrefillKernel.PAGED
    return PrefillKernel.VARLEN


def varlen_prefill(
    api: VarlenApi,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    scale: float,
) -> torch.Tensor:
    """Causal attention of packed q [T, H, D] over packed k, v [T, Hkv, D] of the same sequences.

    k and v may be row-strided views (of the fused qkv projection, say): FlashAttention takes any row
    stride as long as the last dimension is contiguous.
    """
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    kwargs = api.kwargs(scale, gqa=k.shape[1] != q.shape[1])
    return api.fn(q, k, v, query_start_loc, query_start_loc, max_query_len, max_query_len, **kwargs)
