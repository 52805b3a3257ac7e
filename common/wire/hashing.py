"""The one definition of a KV block's identity.

hash(block i) = xxh64 over (hash of block i-1 as 8 little-endian bytes, if i > 0) followed by the
block's token ids as little-endian int64 bytes. Only full blocks are hashed. A request with a
`cache_salt` chains its block 0 from the salt's root instead (`salt_root`, as if it were block -1), so
its chain shares no hash with another salt's or an unsalted one's. Because each hash
covers its parent, equal hashes at position i imply equal token prefixes 0..i (up to collisions),
which is what lets the router count a worker's leading cached blocks from a single lookup chain.

The router and every worker call these functions; nothing else may hash blocks.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import xxhash

# A fixed token sequence that workers hash at registration; the router compares the result with its
# own so that a block-size or hash-definition mismatch is an error rather than a silent 0% hit rate.
PROBE_TOKEN_IDS: tuple[int, ...] = tuple((i * 7919 + 13) % 32000 for i in range(512))


_PARENT = struct.Struct("<Q")


def hash_block(parent: int | None, token_ids: Sequence[int]) -> int:
    """Hash one full block given its parent's hash (None for the first block)."""
    return _chain(parent, struct.pack(f"<{len(token_ids)}q", *token_ids))


def salt_root(salt: str | None) -> int | None:
    """The parent of block 0 for requests with this cache salt (None: no salt, no parent)."""
    if salt is None:
        return None
    return xxhash.xxh64_intdigest(b"pdserve-cache-salt\0" + salt.encode("utf-8"))


def block_hashes(token_ids: Sequence[int], block_size: int, parent: int | None = None) -> list[int]:
    """Chained hashes of every full block of `token_ids` (a trailing partial block is ignored)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    return _hash_blocks(token_ids, 0, len(token_ids) // block_size, block_size, parent)


def extend_block_hashes(
    hashes: list[int],
    token_ids: Sequence[int],
    block_size: int,
    num_tokens: int | None = None,
    root: int | None = None,
) -> list[int]:
    """Append hashes for full blocks of the first `num_tokens` (default: all) of `token_ids` not yet
    covered by `hashes` (in place); `root`: the parent of block 0 (`salt_root`)."""
    limit = len(token_ids) if num_tokens is None else min(num_tokens, len(token_ids))
    parent = hashes[-1] if hashes else root
    hashes += _hash_blocks(token_ids, len(hashes), limit // block_size, block_size, parent)
    return hashes


def _hash_blocks(
    token_ids: Sequence[int], first: int, end: int, block_size: int, parent: int | None
) -> list[int]:
    """Hashes of blocks first..end-1, chained from `parent`. The tokens are packed in one call and each
    block hashed in one call: the router hashes every prompt, a worker every prompt it caches."""
    if end <= first:
        return []
    data = struct.pack(f"<{(end - first) * block_size}q", *token_ids[first * block_size : end * block_size])
    width = block_size * 8
    out: list[int] = []
    for offset in range(0, len(data), width):
        parent = _chain(parent, data[offset : offset + width])
        out.append(parent)
    return out


def _chain(parent: int | None, block: bytes) -> int:
    return xxhash.xxh64_intdigest(block if parent is None else _PARENT.pack(parent) + block)


def probe_hash(block_size: int) -> int:
    """Hash of the last full block of PROBE_TOKEN_IDS at `block_size` (registration parity check)."""
    hashes = block_hashes(PROBE_TOKEN_IDS, block_size)
    if not hashes:
        raise ValueError(f"block_size {block_size} exceeds the probe length {len(PROBE_TOKEN_IDS)}")
    return hashes[-1]
