"""The per-step attention context that every attention layer reads.

The model runner sets it before a forward pass; layers never see sequences, only tensors. During
CUDA-graph capture it points at the graph's static buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.attention.base import AttentionBackend, AttentionMetadata


@dataclass
class ForwardContext:
    backend: AttentionBackend
    meta: AttentionMetadata


_context: ForwardContext | None = None


def set_forward_context(context: ForwardContext | None) -> None:
    global _context
    _context = context


def get_forward_context() -> ForwardContext:
    if _context is None:
        raise RuntimeError("attention called outside a model-runner step (no forward context set)")
    return _context
