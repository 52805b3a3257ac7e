"""The chained block hash against its written definition."""

from __future__ import annotations

import struct

import pytest
import xxhash

from common.wire.hashing import (
    PROBE_TOKEN_IDS,
    block_hashes,
    extend_block_hashes,
    hash_block,
    probe_hash,
    salt_root,
)


def _by_definition(tokens: list[int], block_size: int) -> list[int]:
    out, parent = [], b""
    for start in range(0, len(tokens) - block_size + 1, block_size):
        data = parent + b"".join(struct.pack("<q", t) for t in tokens[start : start + block_size])
        h = xxhash.xxh64(data).intdigest()
        out.append(h)
        parent = struct.pack("<Q", h)
    return out


@pytest.mark.parametrize("block_size", [1, 4, 16, 64])
def test_chain_matches_definition(block_size):
    tokens = [(i * 31 + 7) % 50000 for i in range(150)]
    assert block_hashes(tokens, block_size) == _by_definition(tokens, block_size)


def test_only_full_blocks_and_prefix_property():
    a = block_hashes(list(range(40)), 16)
    assert len(a) == 2  # the 8-token tail is not hashed
    b = block_hashes(list(range(32)) + [999] * 8, 16)
    assert a == b  # equal prefixes give equal hashes
    c = block_hashes([1] + list(range(1, 40)), 16)
    assert c[0] != a[0] and c[1] != a[1]  # a change in block 0 changes every later hash


def test_extend_is_incremental():
    tokens = list(range(100))
    hashes: list[int] = []
    extend_block_hashes(hashes, tokens[:40], 16)
    extend_block_hashes(hashes, tokens, 16)
    assert hashes == block_hashes(tokens, 16)
    assert hash_block(hashes[0], tokens[16:32]) == hashes[1]


def test_extend_stops_at_num_tokens():
    tokens = list(range(100))
    hashes: list[int] = []
    extend_block_hashes(hashes, tokens, 16, num_tokens=47)  # two full blocks among the first 47
    assert hashes == block_hashes(tokens[:47], 16) and len(hashes) == 2
    extend_block_hashes(hashes, tokens, 16, num_tokens=500)  # past the end: all of them
    assert hashes == block_hashes(tokens, 16)


def test_probe_and_bad_block_size():
    assert probe_hash(16) == block_hashes(PROBE_TOKEN_IDS, 16)[-1]
    assert probe_hash(16) != probe_hash(32)
    with pytest.raises(ValueError, match="block_size"):
        block_hashes([1, 2], 0)


def test_a_cache_salt_roots_a_chain_no_other_salt_shares():
    tokens = list(range(64))
    plain = block_hashes(tokens, 16)
    a, b = (block_hashes(tokens, 16, salt_root(salt)) for salt in ("tenant-a", "tenant-b"))
    assert salt_root(None) is None and salt_root("tenant-a") == salt_root("tenant-a")
    assert not set(a) & set(plain) and not set(a) & set(b)  # no block of one chain matches another
    assert a[0] == hash_block(salt_root("tenant-a"), tokens[:16])  # the root is block 0's parent
    hashes: list[int] = []
    extend_block_hashes(hashes, tokens[:40], 16, root=salt_root("tenant-a"))
    extend_block_hashes(hashes, tokens, 16, root=salt_root("tenant-a"))
    assert hashes == a  # extending a chain continues from its last block, the root only starts it
