"""Attention backends behind one interface; see `base.py` for the contract."""

from common.attention.base import AttentionBackend, AttentionMetadata
from common.attention.registry import available_backends, create_backend, resolve_backend_name

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "available_backends",
    "create_backend",
    "resolve_backend_name",
]
