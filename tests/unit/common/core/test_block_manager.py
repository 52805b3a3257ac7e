"""BlockManager: reference counts, prefix hits, LRU eviction order and cache events."""

from __future__ import annotations

import pytest

from common.core.block_manager import BlockManager
from common.core.sequence import Sequence
from common.wire.hashing import block_hashes, salt_root
from common.wire.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from common.wire.sampling_params import SamplingParams

BS = 4


def _seq(tokens: list[int], salt: str | None = None) -> Sequence:
    return Sequence(tokens, SamplingParams(cache_salt=salt), BS)


def _run_prompt(bm: BlockManager, seq: Sequence) -> None:
    """Admit, 'compute' the whole prompt and register its full blocks."""
    match = bm.match_prefix(seq)
    assert bm.can_admit(seq, match, len(seq))
    bm.admit(seq, match, len(seq))
    seq.schedule(seq.num_uncomputed_tokens)
    seq.commit_scheduled()
    bm.commit(seq)


def test_allocation_refcounts_and_free():
    bm = BlockManager(8, BS)
    a = _seq(list(range(10)))  # 3 blocks, last partial
    _run_prompt(bm, a)
    assert len(a.block_table) == 3 and bm.num_free_blocks == 5
    assert all(bm.blocks[b].ref_count == 1 for b in a.block_table)
    bm.free(a)
    assert bm.num_free_blocks == 8
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_prefix_hit_shares_blocks_and_counts():
    bm = BlockManager(16, BS)
    a = _seq(list(range(12)))
    _run_prompt(bm, a)
    b = _seq(list(range(8)) + [100, 101, 102])
    match = bm.match_prefix(b)
    assert match.num_tokens == 8 and match.block_ids == tuple(a.block_table[:2])
    bm.admit(b, match, len(b))
    assert b.num_cached_tokens == 8
    assert [bm.blocks[i].ref_count for i in a.block_table[:2]] == [2, 2]
    assert bm.stats.hit_tokens == 8 and bm.stats.queried_tokens == 12 + 11


def test_a_cache_salt_shares_blocks_only_with_its_own_salt():
    bm = BlockManager(32, BS)
    _run_prompt(bm, _seq(list(range(12)), salt="a"))
    assert bm.match_prefix(_seq(list(range(12)), salt="b")).num_tokens == 0
    assert bm.match_prefix(_seq(list(range(12)))).num_tokens == 0  # unsalted: another chain too
    assert bm.match_prefix(_seq(list(range(12)), salt="a")).num_tokens == 8  # its last block recomputed
    salted = block_hashes(list(range(12)), BS, salt_root("a"))
    assert [h for e in bm.drain_events() for h in e.hashes] == salted  # what the router's index learns


def test_full_prompt_hit_leaves_one_token_to_compute():
    bm = BlockManager(8, BS)
    a = _seq(list(range(8)))
    _run_prompt(bm, a)
    bm.free(a)
    again = bm.match_prefix(_seq(list(range(8))))
    assert again.num_tokens == 4  # the last block is recomputed so a token remains to sample from


def test_freed_cached_blocks_revive_and_lru_eviction_order():
    bm = BlockManager(4, BS)
    a = _seq(list(range(8)))  # blocks: a0 a1
    b = _seq(list(range(50, 58)))  # blocks: b0 b1
    _run_prompt(bm, a)
    _run_prompt(bm, b)
    bm.drain_events()
    bm.free(a)  # a's tail block is queued before its head
    bm.free(b)
    assert bm.num_free_blocks == 4 and len(bm.hash_to_block) == 4
    c = _seq(list(range(100, 105)))  # needs 2 fresh blocks: evicts a1 then a0
    _run_prompt(bm, c)
    ha = block_hashes(list(range(8)), BS)
    events = bm.drain_events()
    assert [e.hashes for e in events if isinstance(e, BlockRemoved)] == [(ha[1], ha[0])]  # one event
    assert bm.stats.evictions == 2
    # b's blocks survived and are revived for a repeat of b.
    repeat = _seq(list(range(50, 58)) + [1])
    assert bm.match_prefix(repeat).num_tokens == 8


def test_evictions_coalesce_in_order_with_stores():
    """Evictions between two other events travel as one BlockRemoved, and events keep their order: a
    hash evicted and then stored again within one drain ends up stored when the events are replayed
    (what a router's index does)."""
    bm = BlockManager(2, BS)
    a, b = list(range(BS)), list(range(50, 50 + 2 * BS))
    first = _seq(a)
    _run_prompt(bm, first)  # stores a0
    bm.free(first)
    second = _seq(b)
    _run_prompt(bm, second)  # evicts a0, stores b0 b1
    bm.free(second)
    again = _seq(a)
    _run_prompt(bm, again)  # evicts b1 (the tail, freed first), stores a0 again
    ha, hb = block_hashes(a, BS), block_hashes(b, BS)
    events = bm.drain_events()
    assert events == [
        BlockStored((ha[0],), None),
        BlockRemoved((ha[0],)),
        BlockStored((hb[0], hb[1]), None),
        BlockRemoved((hb[1],)),
        BlockStored((ha[0],), None),
    ]
    index: set[int] = set()
    for event in events:
        index = index - set(event.hashes) if isinstance(event, BlockRemoved) else index | set(event.hashes)
    assert index == set(bm.cached_hashes()) == {ha[0], hb[0]}


def test_stored_events_carry_parent_and_cleared():
    bm = BlockManager(8, BS)
    seq = _seq(list(range(6)))
    match = bm.match_prefix(seq)
    bm.admit(seq, match, 6)
    seq.schedule(6)
    seq.commit_scheduled()
    bm.commit(seq)
    for t in (6, 7, 8):  # decode two tokens: block 1 becomes full after 8 tokens
        seq.append_token(t)
    assert bm.grow(seq, 9)
    seq.schedule(2)
    seq.commit_scheduled()  # 8 tokens cached, the 9th not yet
    bm.commit(seq)
    hashes = block_hashes(list(range(9)), BS)
    assert bm.drain_events() == [BlockStored((hashes[0],), None), BlockStored((hashes[1],), hashes[0])]
    bm.free(seq)
    bm.reset_prefix_cache()
    assert bm.drain_events() == [AllBlocksCleared()]
    assert bm.cached_hashes() == []


def test_out_of_blocks_is_reported_not_partial():
    bm = BlockManager(2, BS)
    seq = _seq(list(range(12)))
    assert not bm.can_admit(seq, bm.match_prefix(seq), 12)
    small = _seq(list(range(4)))
    bm.admit(small, bm.match_prefix(small), 4)
    assert not bm.grow(small, 12)
    assert len(small.block_table) == 1 and bm.num_free_blocks == 1


def test_prefix_caching_disabled_never_hits():
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    a = _seq(list(range(9)))
    _run_prompt(bm, a)
    assert bm.match_prefix(_seq(list(range(9)))).num_tokens == 0
    assert bm.drain_events() == []


def test_invalid_size():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(0, BS)
