"""Block arithmetic shared by the engine, the workers and the router (torch-free)."""

from __future__ import annotations


def blocks_for(num_tokens: int, block_size: int) -> int:
    """KV blocks needed to hold `num_tokens` tokens: the one ceil-division of the project."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if num_tokens < 0:
        raise ValueError(f"num_tokens must not be negative, got {num_tokens}")
    return -(-num_tokens // block_size)
