"""Block arithmetic and the block-id rule shared by the engine, the workers, the KV transfer and the
router (torch-free)."""

from __future__ import annotations

import operator


def blocks_for(num_tokens: int, block_size: int) -> int:
    """KV blocks needed to hold `num_tokens` tokens: the one ceil-division of the project."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if num_tokens < 0:
        raise ValueError(f"num_tokens must not be negative, got {num_tokens}")
    return -(-num_tokens // block_size)


def check_block_ids(name: str, ids: object, num_blocks: int | None = None) -> list[int]:
    """`ids` as a list of distinct block ids in [0, num_blocks) (no upper bound when None); ValueError
    naming `name` otherwise. The one rule for block ids, wherever they come from."""
    if not isinstance(ids, (list, tuple)) or not ids:
        raise ValueError(f"{name} must be a non-empty list of ints")
    try:
        out = [operator.index(b) for b in ids if not isinstance(b, bool)]
    except TypeError:
        out = []
    if len(out) != len(ids):
        raise ValueError(f"{name} must contain only ints")
    if min(out) < 0 or (num_blocks is not None and max(out) >= num_blocks):
        raise ValueError(f"{name} must lie in [0, {num_blocks}), got min {min(out)} max {max(out)}")
    if len(set(out)) != len(out):
        raise ValueError(f"{name} must not repeat a block")
    return out
